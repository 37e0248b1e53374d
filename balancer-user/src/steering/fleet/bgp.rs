//! VIP announcement over BGP through BIRD (2.x). The daemon does not speak BGP: it writes the
//! VIPs it can serve as static routes into two include files (one per address family) that
//! the operator's `bird.conf` includes in `protocol static` blocks exported to the routers,
//! and asks BIRD to re-read its config (`birdc -s SOCKET configure`). A VIP is announced while
//! it has a backend in its table and is not drained (`balancer vip drain`); on shutdown every
//! route is withdrawn. BIRD reads the files again whenever it starts, so a restarted BIRD
//! announces the current set; a failed `configure` (BIRD down) is retried every few seconds.
//! When this host dies, the routers' BGP hold timer withdraws its routes.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::base::config::BgpConfig;
use crate::base::files::write_atomically;

/// How often a failed reconfiguration is retried.
const RETRY: Duration = Duration::from_secs(2);
/// Longest `birdc configure` may take.
const BIRDC_TIMEOUT: Duration = Duration::from_secs(2);

/// The include file's text for these addresses (all of one family).
pub fn routes_file(addresses: &BTreeSet<IpAddr>) -> String {
    let mut text =
        String::from("# Written by the balancer daemon: the VIPs it announces. Do not edit.\n");
    for a in addresses {
        let len = if a.is_ipv4() { 32 } else { 128 };
        text.push_str(&format!("route {a}/{len} blackhole;\n"));
    }
    text
}

/// Where the announced routes go: the host's routing daemon, or a recording in tests.
pub trait Routes: Send {
    /// Makes the routing daemon announce exactly `addresses`; an error says what failed.
    fn install(&mut self, config: &BgpConfig, addresses: &BTreeSet<IpAddr>) -> Result<(), String>;
}

/// BIRD on this host: the include files, then `birdc configure`.
pub struct Bird;

impl Routes for Bird {
    fn install(&mut self, config: &BgpConfig, addresses: &BTreeSet<IpAddr>) -> Result<(), String> {
        apply(config, addresses)
    }
}

/// Routes kept in memory, for tests: every set it was asked to install, shared with its
/// clones.
#[derive(Clone, Default)]
pub struct RecordedRoutes(Arc<Mutex<Vec<BTreeSet<IpAddr>>>>);

impl RecordedRoutes {
    /// The sets installed so far, oldest first.
    pub fn installed(&self) -> Vec<BTreeSet<IpAddr>> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Routes for RecordedRoutes {
    fn install(&mut self, _: &BgpConfig, addresses: &BTreeSet<IpAddr>) -> Result<(), String> {
        self.0
            .lock()
            .map_err(|_| "recorded routes poisoned".to_string())?
            .push(addresses.clone());
        Ok(())
    }
}

/// The announcer: what the routes were last set to, and retries of a failed installation.
pub struct Announcer {
    routes: Box<dyn Routes>,
    announced: Option<BTreeSet<IpAddr>>,
    last_attempt: Option<Instant>,
    pub last_error: Option<String>,
    /// VIPs not announced for lying outside `bgp.prefixes`.
    withheld: BTreeSet<IpAddr>,
}

impl Announcer {
    /// An announcer that installs its routes through `routes`.
    pub fn new(routes: Box<dyn Routes>) -> Announcer {
        Announcer {
            routes,
            announced: None,
            last_attempt: None,
            last_error: None,
            withheld: BTreeSet::new(),
        }
    }

    /// Makes BIRD announce exactly `addresses` inside `bgp.prefixes` (rewriting the files and
    /// reconfiguring when they changed, or retrying a failed reconfiguration); those outside
    /// are withheld, and logged when that set changes.
    pub fn announce(&mut self, config: &BgpConfig, addresses: &BTreeSet<IpAddr>) {
        let (allowed, withheld): (BTreeSet<IpAddr>, BTreeSet<IpAddr>) =
            addresses.iter().partition(|a| config.may_announce(**a));
        if withheld != self.withheld {
            if !withheld.is_empty() {
                tracing::warn!("bgp: not announcing {withheld:?}: outside bgp.prefixes");
            }
            self.withheld = withheld;
        }
        let addresses = &allowed;
        let settled = self.announced.as_ref() == Some(addresses) && self.last_error.is_none();
        let retry_due = self.last_attempt.is_none_or(|t| t.elapsed() >= RETRY);
        if settled || (self.announced.as_ref() == Some(addresses) && !retry_due) {
            return;
        }
        self.last_attempt = Some(Instant::now());
        match self.routes.install(config, addresses) {
            Ok(()) => {
                if self.last_error.take().is_some() || self.announced.as_ref() != Some(addresses) {
                    tracing::info!(
                        routes = addresses.len(),
                        "bgp: BIRD announces {addresses:?}"
                    );
                }
                self.announced = Some(addresses.clone());
            }
            Err(e) => {
                if self.last_error.as_deref() != Some(&e) {
                    tracing::error!("bgp: {e}; retrying every {RETRY:?}");
                }
                self.last_error = Some(e);
                self.announced = Some(addresses.clone());
            }
        }
    }

    /// What BIRD was told last.
    pub fn announced(&self) -> BTreeSet<IpAddr> {
        self.announced.clone().unwrap_or_default()
    }
}

fn apply(config: &BgpConfig, addresses: &BTreeSet<IpAddr>) -> Result<(), String> {
    let (v4, v6): (BTreeSet<IpAddr>, BTreeSet<IpAddr>) =
        addresses.iter().partition(|a| a.is_ipv4());
    write(&config.routes_v4, &routes_file(&v4))?;
    write(&config.routes_v6, &routes_file(&v6))?;
    let out = birdc_configure(config)?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // birdc exits 0 even when BIRD rejects the config; its reply says so.
    if !out.status.success() || !text.contains("Reconfigur") {
        return Err(format!(
            "BIRD did not take the routes ({} configure: {})",
            config.birdc,
            text.trim().lines().last().unwrap_or("no answer")
        ));
    }
    Ok(())
}

/// Runs `birdc -s SOCKET configure`, killed after [`BIRDC_TIMEOUT`] (the daemon's state is
/// locked meanwhile: a hung BIRD must not hang the daemon).
fn birdc_configure(config: &BgpConfig) -> Result<std::process::Output, String> {
    use std::process::{Command, Stdio};
    let what = || format!("{} -s {} configure", config.birdc, config.socket.display());
    let mut child = Command::new(&config.birdc)
        .arg("-s")
        .arg(&config.socket)
        .arg("configure")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {}: {e}", what()))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < BIRDC_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer within {BIRDC_TIMEOUT:?}",
                    what()
                ));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", what())),
        }
    }
    child
        .wait_with_output()
        .map_err(|e| format!("reading {}: {e}", what()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    write_atomically(path, text.as_bytes()).map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_files_list_host_routes() {
        let set: BTreeSet<IpAddr> =
            ["10.1.1.1".parse().unwrap(), "10.1.1.2".parse().unwrap()].into();
        let text = routes_file(&set);
        assert!(
            text.contains("route 10.1.1.1/32 blackhole;\nroute 10.1.1.2/32 blackhole;\n"),
            "{text}"
        );
        let v6: BTreeSet<IpAddr> = ["fd00::1".parse().unwrap()].into();
        assert!(routes_file(&v6).contains("route fd00::1/128 blackhole;"));
        assert_eq!(routes_file(&BTreeSet::new()).lines().count(), 1);
    }

    #[test]
    fn a_hung_birdc_is_killed_and_reported() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("bgp-hung-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let birdc = dir.join("birdc");
        std::fs::write(&birdc, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&birdc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = BgpConfig {
            routes_v4: dir.join("v4.conf"),
            routes_v6: dir.join("v6.conf"),
            birdc: birdc.display().to_string(),
            socket: dir.join("bird.ctl"),
            prefixes: vec!["10.0.0.0/8".parse().unwrap()],
        };
        let started = Instant::now();
        let err = apply(&config, &BTreeSet::new()).unwrap_err();
        assert!(err.contains("did not answer"), "{err}");
        assert!(started.elapsed() < BIRDC_TIMEOUT + Duration::from_secs(1));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_missing_birdc_is_an_error_that_is_retried() {
        let dir = std::env::temp_dir().join(format!("bgp-test-{}", std::process::id()));
        let config = BgpConfig {
            routes_v4: dir.join("v4.conf"),
            routes_v6: dir.join("v6.conf"),
            birdc: "/nonexistent/birdc".into(),
            socket: dir.join("bird.ctl"),
            prefixes: vec!["10.1.0.0/16".parse().unwrap()],
        };
        let mut a = Announcer::new(Box::new(Bird));
        // 10.2.2.2 lies outside bgp.prefixes: never announced.
        let set: BTreeSet<IpAddr> =
            ["10.1.1.1".parse().unwrap(), "10.2.2.2".parse().unwrap()].into();
        a.announce(&config, &set);
        assert!(
            a.last_error
                .as_deref()
                .unwrap_or("")
                .contains("/nonexistent/birdc")
        );
        // The files were written even though BIRD could not be told.
        let routes = std::fs::read_to_string(&config.routes_v4).unwrap();
        assert!(routes.contains("10.1.1.1/32"), "{routes}");
        assert!(!routes.contains("10.2.2.2"), "{routes}");
        assert_eq!(a.announced(), ["10.1.1.1".parse().unwrap()].into());
        let _ = std::fs::remove_dir_all(dir);
    }
}
