//! The shipped Prometheus rules (`packaging/prometheus/`): valid for Debian's promtool, and
//! each alert firing on the synthetic series that should raise it and quiet on the others
//! (`balancer.rules.test.yml`). That every metric they read is one the daemon exposes is
//! checked without promtool, in the daemon's own unit tests.

use std::path::PathBuf;
use std::process::Command;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/prometheus")
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir())
        .output()
        .expect("promtool (Debian's prometheus package; cargo xtask setup installs it)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
#[ignore = "needs promtool; run by cargo xtask test"]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    let (ok, out) = promtool(&["check", "rules", "balancer.rules.yml"]);
    assert!(ok, "promtool check rules:\n{out}");
    assert!(out.contains("SUCCESS: 12 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "balancer.rules.test.yml"]);
    assert!(ok, "promtool test rules:\n{out}");
}
