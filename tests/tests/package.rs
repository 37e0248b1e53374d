//! The Debian package as an operator meets it: `dpkg -i` on this machine, the installed unit
//! verified by `systemd-analyze`, the installed example config accepted by `balancer
//! check-config`, the service neither enabled nor started, then `dpkg -P` and nothing of it
//! left behind. The package is the one `cargo xtask test` builds (`BALANCER_DEB`).

use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGE: &str = "balancer";

/// What the package must install.
const INSTALLED: &[&str] = &[
    "/usr/bin/balancer",
    "/etc/balancer/balancer.toml",
    "/usr/share/doc/balancer/examples/balancer.toml",
    "/usr/share/doc/balancer/README.md",
    "/usr/share/doc/balancer/docs/operating.md",
    "/usr/lib/tmpfiles.d/balancer.conf",
    "/usr/share/balancer/prometheus/balancer.rules.yml",
    "/usr/share/balancer/grafana/balancer-dashboard.json",
];

fn run(program: &str, args: &[&str]) -> (bool, String) {
    match Command::new(program).args(args).output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, format!("{program}: {e}")),
    }
}

/// The installed unit file (Debian's systemd puts packaged units under /usr/lib or /lib).
fn unit_path() -> Option<PathBuf> {
    [
        "/usr/lib/systemd/system/balancer.service",
        "/lib/systemd/system/balancer.service",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// Whether dpkg knows the package in any state but "not installed" (installed, half
/// installed, or only its conffiles left).
fn known_to_dpkg() -> bool {
    let (found, status) = run("dpkg-query", &["-W", "-f=${db:Status-Abbrev}", PACKAGE]);
    found && !status.starts_with("un")
}

/// Purges the package when the test ends, also when it fails.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["-P", PACKAGE]).output();
    }
}

#[test]
#[ignore = "needs root; installs and purges a package; run by cargo xtask test"]
fn the_debian_package_installs_checks_and_purges_cleanly() {
    let deb = PathBuf::from(
        std::env::var_os("BALANCER_DEB")
            .expect("BALANCER_DEB: the .deb to test (cargo xtask test builds it)"),
    );
    assert!(deb.exists(), "{} does not exist", deb.display());
    assert!(
        !known_to_dpkg(),
        "a {PACKAGE} package is already installed here; this test installs and purges its own"
    );
    for path in INSTALLED {
        assert!(
            !Path::new(path).exists(),
            "{path} exists before the install; this test would remove it"
        );
    }
    let _purge = Purge;

    let (ok, out) = run("dpkg", &["-i", &deb.display().to_string()]);
    assert!(ok, "dpkg -i {}:\n{out}", deb.display());
    for path in INSTALLED {
        assert!(
            Path::new(path).exists(),
            "the package did not install {path}"
        );
    }
    let (_, conffiles) = run("dpkg-query", &["-W", "-f=${Conffiles}", PACKAGE]);
    assert!(
        conffiles.contains("/etc/balancer/balancer.toml"),
        "the example config is not a conffile: {conffiles:?}"
    );
    let unit = unit_path().expect("the package installs balancer.service");
    let (ok, out) = run("systemd-analyze", &["verify", &unit.display().to_string()]);
    assert!(ok, "systemd-analyze verify {}:\n{out}", unit.display());
    let (ok, out) = run(
        "/usr/bin/balancer",
        &["check-config", "/etc/balancer/balancer.toml"],
    );
    assert!(ok, "balancer check-config of the installed example:\n{out}");
    let (ok, out) = run("/usr/bin/balancer", &["--version"]);
    assert!(ok && out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    // Installed, not enabled and not started: the operator edits the config first.
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants/balancer.service");
    assert!(!wants.exists(), "the install enabled the service");
    let (running, _) = run("pgrep", &["-x", "balancer"]);
    assert!(!running, "the install started a balancer");

    let (ok, out) = run("dpkg", &["-P", PACKAGE]);
    assert!(ok, "dpkg -P {PACKAGE}:\n{out}");
    assert!(
        !known_to_dpkg(),
        "dpkg still knows {PACKAGE} after the purge"
    );
    for path in INSTALLED.iter().copied().chain([
        "/etc/balancer",
        "/usr/share/doc/balancer",
        "/usr/share/balancer",
        "/lib/systemd/system/balancer.service",
        "/usr/lib/systemd/system/balancer.service",
    ]) {
        assert!(!Path::new(path).exists(), "{path} is left after the purge");
    }
}
