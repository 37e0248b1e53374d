//! Network namespaces for tests: created with `ip netns`, removed on drop (also when a test
//! panics), leftovers of killed runs swept by name prefix, and code run inside one on a
//! dedicated thread.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, Result, bail};

/// Every namespace this crate creates starts with this prefix, so leftovers can be swept.
pub const PREFIX: &str = "blt";

/// Runs a command, failing with its output when it exits non-zero.
pub fn run(program: &str, args: &[&str]) -> Result<Output> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(out)
}

/// A network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace (an existing one of the same name is replaced) with `lo` up.
    pub fn create(name: &str) -> Result<Netns> {
        if !name.starts_with(PREFIX) {
            bail!("test namespaces must start with {PREFIX:?}: {name:?}");
        }
        let _ = Command::new("ip")
            .args(["netns", "del", name])
            .stderr(Stdio::null())
            .status();
        run("ip", &["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, argv: &[&str]) -> Result<Output> {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(argv);
        run("ip", &args)
    }

    /// Runs a shell snippet inside the namespace.
    pub fn sh(&self, script: &str) -> Result<Output> {
        self.exec(&["sh", "-ec", script])
    }

    /// A command that will run inside the namespace (for long-running processes).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `f` on a new thread that has entered the namespace, and returns its result.
    pub fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let path = format!("/var/run/netns/{}", self.name);
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        std::thread::spawn(move || -> Result<T> {
            enter(&file)?;
            Ok(f())
        })
        .join()
        .map_err(|panic| {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow::anyhow!("thread in namespace panicked: {msg}")
        })?
    }

    /// Spawns `f` on a thread inside the namespace without waiting for it.
    pub fn spawn_in<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<Result<T>>> {
        let path = format!("/var/run/netns/{}", self.name);
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        Ok(std::thread::spawn(move || -> Result<T> {
            enter(&file)?;
            Ok(f())
        }))
    }
}

/// Moves the calling thread into the namespace `file` refers to.
fn enter(file: &File) -> Result<()> {
    // SAFETY: setns on a namespace file descriptor; affects only this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes still running inside keep the namespace alive; kill them first.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill(2) on a pid reported by `ip netns pids`.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes namespaces left behind by earlier runs whose names start with `prefix`.
pub fn sweep(prefix: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(prefix) {
            drop(Netns {
                name: name.to_string(),
            });
        }
    }
}

/// Whether this process may create namespaces and load BPF programs.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
