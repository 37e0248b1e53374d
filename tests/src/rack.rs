//! The core every test rack is built on: its namespaces (one "rack" namespace holding the
//! bridge `br0`, one namespace per host plugged into it), the processes it runs (logged to
//! files, killed on drop), XDP pass programs on bridge ports, pinned BPF state, and one poll
//! helper. The single-balancer rack ([`crate::topology`]) and the fleet ([`crate::fleet`])
//! are two layouts on this core.
//!
//! Drop order: processes first, then the pass programs and the rack's pinned state, then the
//! namespaces.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::base::config::AttachMode;
use balancer::dataplane::ebpf::xdp_mode;

use crate::netns::{Netns, PREFIX, run, sweep};

/// A rack: its tag (in every namespace, pin and log name), log directory, processes, pass
/// programs and bridge namespace.
pub struct Rack {
    pub tag: String,
    pub log_dir: PathBuf,
    /// Processes first: they must die before their namespaces go.
    pub processes: Vec<Process>,
    /// XDP pass-through programs on bridge ports (kept loaded while the rack lives).
    pass_programs: Vec<aya::Ebpf>,
    /// The namespace holding the bridge `br0`.
    pub bridge: Netns,
}

impl Rack {
    /// Sweeps what an earlier run of this tag left (namespaces, pins), creates the bridge
    /// namespace and a fresh log directory, and mounts the tests' bpffs.
    pub fn new(tag: &str) -> Result<Rack> {
        sweep(&format!("{PREFIX}-{tag}-"));
        mount_pin_root()?;
        remove_pins(tag);
        let log_dir = std::env::temp_dir().join(format!("{PREFIX}-{tag}-logs"));
        let _ = fs::remove_dir_all(&log_dir);
        fs::create_dir_all(&log_dir)?;
        let bridge = Netns::create(&format!("{PREFIX}-{tag}-rack"))?;
        bridge.sh("ip link add br0 type bridge && ip link set br0 up; \
             sysctl -qw net.bridge.bridge-nf-call-iptables=0 2>/dev/null || true; \
             sysctl -qw net.bridge.bridge-nf-call-ip6tables=0 2>/dev/null || true")?;
        Ok(Rack {
            tag: tag.to_string(),
            log_dir,
            processes: Vec::new(),
            pass_programs: Vec::new(),
            bridge,
        })
    }

    /// A host namespace of this rack (`<prefix>-<tag>-<role>`), not plugged in yet.
    pub fn host(&self, role: &str) -> Result<Netns> {
        Netns::create(&format!("{PREFIX}-{}-{role}", self.tag))
    }

    /// Plugs `host` into the bridge: `port` on the bridge, `eth0` in `host` with `addresses`.
    pub fn plug(&self, port: &str, host: &Netns, addresses: &[String]) -> Result<()> {
        plug(&self.bridge, "br0", port, host, "eth0", addresses)
    }

    /// Adds a second bridge `br1` to the rack namespace: another link (see
    /// [`Rack::plug_second`]).
    pub fn add_second_bridge(&self) -> Result<()> {
        self.bridge
            .sh("ip link add br1 type bridge && ip link set br1 up")?;
        Ok(())
    }

    /// Plugs `host` into the second bridge: `port` on it, `host_if` in `host` with `addresses`.
    pub fn plug_second(
        &self,
        port: &str,
        host: &Netns,
        host_if: &str,
        addresses: &[String],
    ) -> Result<()> {
        plug(&self.bridge, "br1", port, host, host_if, addresses)
    }

    /// Attaches the XDP pass program to bridge port `port` (see [`attach_pass`]).
    pub fn attach_pass(&mut self, port: &str, mode: AttachMode) -> Result<()> {
        let object = attach_pass(&self.bridge, port, mode)?;
        self.pass_programs.push(object);
        Ok(())
    }

    /// Where a balancer of this rack pins its program and maps: on the tests' own bpffs
    /// (bpffs is not per network namespace, and `ip netns exec` hides /sys/fs/bpf).
    /// `name` tells balancers of one rack apart (None: the rack's only or first one).
    pub fn pin_dir(&self, name: Option<&str>) -> PathBuf {
        match name {
            Some(n) => pin_root().join(format!("{PREFIX}-{}-{n}", self.tag)),
            None => pin_root().join(format!("{PREFIX}-{}", self.tag)),
        }
    }

    /// Starts `argv` in `ns` as the process `name` (replacing one of that name), logged to
    /// `<log_dir>/<name>.log`.
    pub fn spawn(&mut self, ns: &Netns, name: &str, argv: &[&str]) -> Result<&mut Process> {
        let p = Process::spawn(ns, name, argv, &self.log_dir)?;
        Ok(self.add(p))
    }

    /// Adds a started process (replacing one of the same name).
    fn add(&mut self, p: Process) -> &mut Process {
        self.processes.retain(|x| x.name != p.name);
        self.processes.push(p);
        self.processes.last_mut().expect("just pushed")
    }

    /// Writes `config` to `<log_dir>/<file>` and starts `balancer run` on it in `ns` as the
    /// process `name`; waits until it is ready.
    pub fn start_balancer(
        &mut self,
        ns: &Netns,
        name: &str,
        file: &str,
        config: &str,
    ) -> Result<()> {
        let path = self.log_dir.join(file);
        fs::write(&path, config)?;
        self.processes.retain(|x| x.name != name);
        let p = start_daemon(ns, name, &path, &self.log_dir)?;
        self.add(p);
        Ok(())
    }

    /// The running process called `name`.
    pub fn process(&mut self, name: &str) -> Option<&mut Process> {
        self.processes.iter_mut().find(|p| p.name == name)
    }

    /// Kills a process by name (SIGKILL) and forgets it.
    pub fn kill(&mut self, name: &str) -> Result<()> {
        let p = self
            .process(name)
            .with_context(|| format!("no process {name}"))?;
        p.signal_and_wait(libc::SIGKILL, Duration::from_secs(5))?;
        self.processes.retain(|p| p.name != name);
        Ok(())
    }

    /// The processes' logs (the last 60 lines of each, test servers left out), for failure
    /// messages.
    pub fn logs(&self) -> String {
        self.processes
            .iter()
            .filter(|p| !p.name.starts_with("server-"))
            .map(|p| {
                let text = p.log_text();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(60)..];
                format!("--- {} ---\n{}", p.name, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until `done` holds; the time it took, or an error naming `what` with the logs.
    pub fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        mut done: impl FnMut() -> bool,
    ) -> Result<Duration> {
        match poll(timeout, || done().then_some(())) {
            Some(((), took)) => Ok(took),
            None => bail!("not {what} within {timeout:?}\n{}", self.logs()),
        }
    }
}

impl Drop for Rack {
    fn drop(&mut self) {
        // Processes, then programs and pinned state; the namespaces go with their fields.
        self.processes.clear();
        self.pass_programs.clear();
        remove_pins(&self.tag);
    }
}

/// Removes the pin directories of rack `tag` (`<prefix>-<tag>` and `<prefix>-<tag>-*`).
fn remove_pins(tag: &str) {
    let own = format!("{PREFIX}-{tag}");
    let Ok(entries) = fs::read_dir(pin_root()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == own || name.starts_with(&format!("{own}-")) {
            let _ = balancer::dataplane::pinning::Pins::new(entry.path()).remove();
        }
    }
}

/// Calls `check` every 20 ms until it gives a value, for at most `timeout`; the value and the
/// time it took.
pub fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return Some((value, started.elapsed()));
        }
        if started.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The BPF filesystem the tests pin on.
pub fn pin_root() -> PathBuf {
    PathBuf::from("/run/blt-bpf")
}

/// Mounts the tests' BPF filesystem at [`pin_root`] unless it is there (once: two tests of
/// one binary starting together must not stack two mounts, the second hiding the first's pins).
pub fn mount_pin_root() -> Result<()> {
    static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let root = pin_root();
    fs::create_dir_all(&root)?;
    if !balancer::dataplane::pinning::is_bpffs(&root)? {
        run(
            "mount",
            &["-t", "bpf", "bpf", root.to_str().unwrap_or_default()],
        )?;
    }
    Ok(())
}

/// Where the workspace's binaries are (next to this test's own binaries).
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("BALANCER_BIN_DIR") {
        return dir.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    // Integration tests live in target/<profile>/deps; binaries in target/<profile>.
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Starts, in `ns`, a backend's `balancer report --serve [::]:SERVE_PORT --no-gpu
/// --passive-latency eth0 --latency-port LATENCY_PORT` (its own interface's requests to the
/// server's port timed), and waits until it serves.
pub fn spawn_passive_reporter(
    ns: &Netns,
    name: &str,
    serve_port: u16,
    latency_port: u16,
    log_dir: &Path,
) -> Result<Process> {
    let bin = binary("balancer")?.to_string_lossy().to_string();
    let (serve, port) = (format!("[::]:{serve_port}"), latency_port.to_string());
    let argv = [
        bin.as_str(),
        "report",
        "--serve",
        &serve,
        "--no-gpu",
        "--passive-latency",
        "eth0",
        "--latency-port",
        &port,
    ];
    let mut p = Process::spawn(ns, name, &argv, log_dir)?;
    p.wait_for_log("serving GPU figures", Duration::from_secs(10))?;
    Ok(p)
}

/// The path of a workspace binary, with a hint if it was not built.
pub fn binary(name: &str) -> Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.exists() {
        bail!(
            "{} not found: build the workspace binaries first (cargo build --bins, or cargo xtask test)",
            path.display()
        );
    }
    Ok(path)
}

/// A background process, killed on drop, whose stderr goes to a log file.
pub struct Process {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `argv` in `ns` with stdout and stderr logged to `log_dir/<name>.log`.
    pub fn spawn(ns: &Netns, name: &str, argv: &[&str], log_dir: &Path) -> Result<Process> {
        let log = log_dir.join(format!("{name}.log"));
        let file = fs::File::create(&log)?;
        let mut cmd = ns.command(argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {}", argv.join(" ")))?;
        Ok(Process {
            name: name.to_string(),
            child,
            log,
        })
    }

    /// Waits until the log contains `needle`; fails if the process exits or `timeout` passes.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            if self.log_text().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before {needle:?}:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            if started.elapsed() > timeout {
                bail!(
                    "{} did not log {needle:?} within {timeout:?}:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal; returns the exit status if it exits within `timeout`.
    pub fn signal_and_wait(
        &mut self,
        signal: i32,
        timeout: Duration,
    ) -> Result<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if started.elapsed() > timeout {
                bail!(
                    "{} did not exit within {timeout:?} after signal {signal}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the process to exit by itself; its exit status, or an error after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if started.elapsed() > timeout {
                bail!("{} still running after {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.is_running() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let started = Instant::now();
            while self.is_running() && started.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `balancer run --config <config>` in `ns` as the process `name`; waits until it is
/// ready.
pub fn start_daemon(ns: &Netns, name: &str, config: &Path, log_dir: &Path) -> Result<Process> {
    let bin = binary("balancer")?;
    let argv = [
        bin.to_str().unwrap_or_default(),
        "run",
        "--config",
        config.to_str().unwrap_or_default(),
    ];
    let mut p = Process::spawn(ns, name, &argv, log_dir)?;
    p.wait_for_log("balancer ready", Duration::from_secs(30))?;
    Ok(p)
}

/// A veth pair from `from` (its end named `port`) to `to` (its end named `to_if`), both down.
pub fn veth(from: &Netns, port: &str, to: &Netns, to_if: &str) -> Result<()> {
    let args = [
        "-n",
        from.name(),
        "link",
        "add",
        port,
        "type",
        "veth",
        "peer",
        "name",
        to_if,
        "netns",
        to.name(),
    ];
    run("ip", &args)?;
    Ok(())
}

/// Connects `host` to the bridge `bridge` of `rack` by a veth pair: `port` on the bridge,
/// `host_if` in `host` with `addresses` (CIDR), up.
pub fn plug(
    rack: &Netns,
    bridge: &str,
    port: &str,
    host: &Netns,
    host_if: &str,
    addresses: &[String],
) -> Result<()> {
    veth(rack, port, host, host_if)?;
    let r = rack.name();
    run(
        "ip",
        &["-n", r, "link", "set", port, "master", bridge, "up"],
    )?;
    let mut script = format!(
        "sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.{host_if}.accept_dad=0 2>/dev/null || true"
    );
    for a in addresses {
        let nodad = if a.contains(':') { " nodad" } else { "" };
        script.push_str(&format!("; ip addr add {a} dev {host_if}{nodad}"));
    }
    script.push_str(&format!("; ip link set {host_if} up"));
    host.sh(&script)?;
    Ok(())
}

/// Attaches the XDP pass-through program to `port` in `rack` (in native mode a veth only
/// receives `XDP_TX` frames when its peer has an XDP program); the object must stay loaded.
pub fn attach_pass(rack: &Netns, port: &str, mode: AttachMode) -> Result<aya::Ebpf> {
    let port = port.to_string();
    rack.run_in(move || -> Result<aya::Ebpf> {
        let mut object = balancer::dataplane::ebpf::load_decap()?;
        balancer::dataplane::ebpf::program(&mut object, balancer::dataplane::ebpf::PASS_PROGRAM)?
            .attach(&port, xdp_mode(mode))
            .with_context(|| format!("attaching the pass program to {port}"))?;
        Ok(object)
    })?
}
