//! CPU time of a group of processes, counted by the kernel in nanoseconds.
//!
//! A benchmark moves the processes it measures into a cgroup of its own and reads the
//! group's usage: every thread counts, also those that started or ended between two readings
//! (a tokio blocking-pool thread lives 10 s), and nothing is rounded to clock ticks. Without
//! a writable cgroup hierarchy (a container that mounts it read-only) it falls back to the
//! processes' own utime + stime from `/proc/<pid>/stat`, in clock ticks (10 ms), which is
//! coarse against the tens of milliseconds a short run of the balancer's daemon uses.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

/// How the CPU time is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// cgroup v2: `cpu.stat`'s `usage_usec`.
    CgroupV2,
    /// cgroup v1's cpuacct controller: `cpuacct.usage` (ns).
    CgroupV1,
    /// `/proc/<pid>/stat` of each process, in clock ticks.
    ProcTicks,
}

impl Source {
    pub fn describe(self) -> &'static str {
        match self {
            Source::CgroupV2 => "a cgroup's cpu.stat usage_usec (cgroup v2), every thread counted",
            Source::CgroupV1 => "a cgroup's cpuacct.usage (cgroup v1), every thread counted",
            Source::ProcTicks => {
                "utime + stime in /proc/<pid>/stat (no writable cgroup: 10 ms clock ticks, live processes only)"
            }
        }
    }
}

/// The CPU time of the processes added to it.
pub struct CpuAccount {
    cgroup: Option<Cgroup>,
    /// The processes added (their own time when there is no cgroup).
    pids: Vec<u32>,
}

struct Cgroup {
    dir: PathBuf,
    version: Source,
}

/// Where cgroups with CPU accounting are made: the v1 cpuacct hierarchy when mounted, else
/// the v2 hierarchy.
fn hierarchy() -> Option<(PathBuf, Source)> {
    let v1 = Path::new("/sys/fs/cgroup/cpuacct");
    if v1.join("cpuacct.usage").exists() {
        return Some((v1.to_path_buf(), Source::CgroupV1));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    if v2.join("cgroup.controllers").exists() {
        return Some((v2.to_path_buf(), Source::CgroupV2));
    }
    None
}

impl CpuAccount {
    /// A new, empty account named `name` (unique per process: the pid is added).
    pub fn new(name: &str) -> CpuAccount {
        let cgroup = hierarchy().and_then(|(root, version)| {
            let dir = root.join(format!("{name}-{}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => Some(Cgroup { dir, version }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    Some(Cgroup { dir, version })
                }
                Err(_) => None,
            }
        });
        CpuAccount {
            cgroup,
            pids: Vec::new(),
        }
    }

    pub fn source(&self) -> Source {
        self.cgroup
            .as_ref()
            .map_or(Source::ProcTicks, |c| c.version)
    }

    /// Moves `pid` and its descendants into the account; the children they start later
    /// join it by themselves (with a cgroup).
    pub fn add_tree(&mut self, pid: u32) {
        for p in tree(pid) {
            if let Some(c) = &self.cgroup
                && let Err(e) = std::fs::write(c.dir.join("cgroup.procs"), p.to_string())
            {
                // The process may have ended since it was listed; any other failure drops
                // to counting the processes' own time, for every process alike.
                if Path::new(&format!("/proc/{p}")).exists() {
                    eprintln!(
                        "warning: moving {p} into {}: {e}; reading CPU from /proc instead",
                        c.dir.display()
                    );
                    self.release();
                }
            }
            if !self.pids.contains(&p) {
                self.pids.push(p);
            }
        }
    }

    /// CPU time used so far by the processes in the account, ns.
    pub fn used_ns(&self) -> Result<u64> {
        match &self.cgroup {
            Some(c) => c.used_ns(),
            None => {
                let mut total = 0;
                for &p in &self.pids {
                    // A process that ended took its time with it.
                    if let Ok(t) = super::process_cpu_ns(p) {
                        total += t;
                    }
                }
                Ok(total)
            }
        }
    }

    /// Moves every process out (to the hierarchy's root) and empties the account.
    pub fn clear(&mut self) {
        if let Some(c) = &self.cgroup {
            c.empty();
        }
        self.pids.clear();
    }

    /// Gives the cgroup up: its processes go back to the root, the directory is removed.
    fn release(&mut self) {
        if let Some(c) = self.cgroup.take() {
            c.empty();
            let _ = std::fs::remove_dir(&c.dir);
        }
    }
}

impl Drop for CpuAccount {
    fn drop(&mut self) {
        self.release();
    }
}

impl Cgroup {
    fn used_ns(&self) -> Result<u64> {
        match self.version {
            Source::CgroupV1 => {
                let path = self.dir.join("cpuacct.usage");
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                text.trim()
                    .parse()
                    .with_context(|| format!("{}: not a number: {text:?}", path.display()))
            }
            Source::CgroupV2 => {
                let path = self.dir.join("cpu.stat");
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                usage_usec(&text)
                    .map(|us| us * 1000)
                    .with_context(|| format!("{}: no usage_usec in {text:?}", path.display()))
            }
            Source::ProcTicks => bail!("not a cgroup"),
        }
    }

    /// Moves its processes to the root of the hierarchy.
    fn empty(&self) {
        let root = self.dir.parent().unwrap_or(Path::new("/sys/fs/cgroup"));
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for p in procs.split_whitespace() {
            let _ = std::fs::write(root.join("cgroup.procs"), p);
        }
    }
}

/// `usage_usec` of a cgroup v2 `cpu.stat`.
fn usage_usec(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// `pid` and its descendants now running.
fn tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten();
        for t in tasks {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_usec() {
        let stat = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
        assert_eq!(usage_usec(stat), Some(123_456));
        assert_eq!(usage_usec("user_usec 5\n"), None);
    }

    /// A busy child process started inside the account counts, to the nanosecond, with a
    /// cgroup; and with the /proc fallback while it runs.
    #[test]
    fn counts_a_busy_child() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "sleep 0.2; i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5",
            ])
            .spawn()
            .expect("starting sh");
        let mut account = CpuAccount::new("balancer-test-cpu-account");
        account.add_tree(child.id());
        let before = account.used_ns().expect("reading");
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let after = account.used_ns().expect("reading");
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            after > before,
            "{:?}: {before} -> {after} ns while the child counted",
            account.source()
        );
    }
}
