//! `cargo xtask test`: the suites, each stage timed and the times printed at the end (also
//! when a stage fails).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::{build, cargo, cargo_with_env, is_root, real_servers, root, setup};

/// What `cargo xtask test` runs.
pub struct Suite<'a> {
    /// Only tests whose name contains this (no fuzzing then).
    pub filter: Option<&'a str>,
    pub unit_only: bool,
    /// Seconds each fuzz target runs (0: none).
    pub fuzz_secs: u32,
}

/// The fuzz targets, each run for `--fuzz-secs`.
const FUZZ_TARGETS: [&str; 4] = ["config", "metrics", "api_json", "packets"];

/// The Debian package's test: it installs the package the suite builds (release profile).
const PACKAGE_TEST: &str = "the_debian_package_installs_checks_and_purges_cleanly";

/// Stages run so far: name, time, whether it passed.
#[derive(Default)]
struct Stages(Vec<(String, Duration, bool)>);

impl Stages {
    fn run<T>(&mut self, name: &str, stage: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let result = stage();
        self.0
            .push((name.to_string(), started.elapsed(), result.is_ok()));
        result
    }

    fn print(&self) {
        let total: Duration = self.0.iter().map(|(_, t, _)| *t).sum();
        println!("\nxtask: time per stage");
        for (name, time, ok) in &self.0 {
            let mark = if *ok { "" } else { "  FAILED" };
            println!("  {:<28} {:>7}{mark}", name, minutes(*time));
        }
        println!("  {:<28} {:>7}", "total", minutes(total));
    }
}

/// `m:ss`.
fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

/// Setup, unit tests, then (as root) the package and the root-only tests, then fuzzing.
pub fn test(suite: &Suite) -> Result<()> {
    let mut stages = Stages::default();
    let result = run_test(suite, &mut stages);
    stages.print();
    result
}

fn run_test(suite: &Suite, stages: &mut Stages) -> Result<()> {
    stages.run("setup", || setup::run(setup::RealServers::Required))?;
    // The package's release build and the fuzz targets' build start now and run beside
    // everything that follows, at the lowest CPU priority: they take what the debug build, the
    // tests and their servers leave of the CPU, and the tests keep it when they need it. Each
    // builds in a target directory of its own, so none waits for another's lock. Should a
    // stage fail, dropping them stops them.
    let root_stages = !suite.unit_only && is_root();
    let with_package = root_stages && suite.filter.is_none_or(|f| PACKAGE_TEST.contains(f));
    let fuzzing = root_stages && suite.filter.is_none() && suite.fuzz_secs > 0;
    let package = with_package.then(Background::package).transpose()?;
    let fuzz_build = fuzzing.then(Background::fuzz_build).transpose()?;
    stages.run("build (debug)", || build(false))?;
    stages.run("unit tests", || unit_tests(suite.filter))?;
    if suite.unit_only {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "the packet and network-namespace tests need root (BPF, namespaces): run as root, or pass --unit-only (or --fast)"
        );
    }
    let built = stages.run("root tests' build", || {
        cargo(&[
            "test",
            "-p",
            "balancer-tests",
            "-p",
            "balancer-bench",
            "--no-run",
        ])
    });
    // The quick LLM benchmark runs beside the other root tests: it spends its three minutes
    // waiting on its simulated servers' clocks (22 s of CPU over 192 s here), and asserts that
    // every contender served every request, not how fast.
    let llm_bench = built.is_ok().then(|| Background::llm_bench(suite.filter));
    let root = built.and_then(|()| stages.run("root tests", || root_tests(suite.filter)));
    // Wait for the background jobs whatever the tests did, so none outlives the suite.
    let bench =
        llm_bench.map(|b| b.and_then(|b| stages.run("LLM benchmark (beside)", || b.wait_test())));
    let deb = package.map(|p| stages.run("package (release, beside)", || p.wait_deb()));
    let fuzz_built = fuzz_build.map(|b| stages.run("fuzz build (beside)", || b.wait()));
    root?;
    bench.transpose()?;
    if let Some(deb) = deb {
        let deb = deb?;
        stages.run("package test", || package_test(&deb))?;
    }
    if let Some(built) = fuzz_built {
        built?;
        stages.run("fuzzing", || run_fuzz_targets(suite.fuzz_secs))?;
    }
    Ok(())
}

/// A build running beside the tests, its output in a log file.
struct Background {
    what: &'static str,
    child: std::process::Child,
    log: PathBuf,
    /// Where the built package goes (the package build only).
    deb_dir: Option<PathBuf>,
}

impl Background {
    fn spawn(what: &'static str, mut cmd: Command, deb_dir: Option<PathBuf>) -> Result<Background> {
        let logs = root().join("target/xtask-logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let log = logs.join(format!("{}.log", what.replace(' ', "-")));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        println!("xtask: {what} beside the tests (log: {})", log.display());
        let child = cmd
            .stdout(file.try_clone()?)
            .stderr(file)
            .current_dir(root())
            .spawn()
            .with_context(|| format!("starting the {what}"))?;
        Ok(Background {
            what,
            child,
            log,
            deb_dir,
        })
    }

    /// `nice -n 19 <program>`: the lowest CPU priority.
    fn niced(program: &str) -> Command {
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "19", program]);
        cmd
    }

    /// The Debian package (cargo-deb, release profile) into `target/package`, built in the
    /// cached [`package_target_dir`].
    fn package() -> Result<Background> {
        let out = root().join("target/package/debian");
        let _ = std::fs::remove_dir_all(&out);
        let mut cmd = Background::niced(env!("CARGO"));
        cmd.args(["deb", "-p", "balancer-user", "--locked", "-o"])
            .arg(&out)
            .env("CARGO_TARGET_DIR", package_target_dir()?);
        Background::spawn("package build", cmd, Some(out))
    }

    /// Every fuzz target (cargo-fuzz, nightly), in the cached fuzz target directory.
    fn fuzz_build() -> Result<Background> {
        let mut cmd = Background::niced("cargo");
        cmd.arg(format!("+{}", setup::ebpf_toolchain()))
            .args(["fuzz", "build", "--fuzz-dir", "fuzz", "--target-dir"])
            .arg(fuzz_target_dir()?);
        Background::spawn("fuzz build", cmd, None)
    }

    /// balancer-bench's root-only test (the quick LLM benchmark), at normal priority.
    fn llm_bench(filter: Option<&str>) -> Result<Background> {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["test", "-p", "balancer-bench", "--", "--ignored"]);
        cmd.args(filter);
        cmd.envs(real_servers_env());
        Background::spawn("LLM benchmark", cmd, None)
    }

    /// Waits for the job to end: its exit status and its log.
    fn finish(&mut self) -> Result<(std::process::ExitStatus, String)> {
        let status = self
            .child
            .wait()
            .with_context(|| format!("waiting for the {}", self.what))?;
        Ok((
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        ))
    }

    /// Waits for a test run, then prints its output whole (also when it failed).
    fn wait_test(mut self) -> Result<()> {
        let (status, text) = self.finish()?;
        println!(
            "xtask: the {}'s output ({}):\n{text}",
            self.what,
            self.log.display()
        );
        if !status.success() {
            bail!("the {} failed ({status})", self.what);
        }
        Ok(())
    }

    /// Waits for a build; when it failed, the end of its log in the error.
    fn wait(mut self) -> Result<()> {
        let (status, text) = self.finish()?;
        if !status.success() {
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "the {} failed ({status}); the end of {}:\n{}",
                self.what,
                self.log.display(),
                tail.join("\n")
            );
        }
        Ok(())
    }
}

impl Drop for Background {
    /// Stops a job nobody waited for (a stage before it failed), so none outlives the suite.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Background {
    /// Waits for the package build; the path of its `.deb`.
    fn wait_deb(self) -> Result<PathBuf> {
        let out = self.deb_dir.clone().context("not a package build")?;
        self.wait()?;
        crate::the_deb_in(&out)
    }
}

/// The edit-compile loop: no setup, no root, the workspace's unit and doc tests only.
pub fn fast() -> Result<()> {
    let mut stages = Stages::default();
    let result = (|| {
        stages.run("toolchain check", setup::check_toolchain)?;
        stages.run("unit tests", || unit_tests(None))
    })();
    stages.print();
    result
}

fn unit_tests(filter: Option<&str>) -> Result<()> {
    let mut args = vec!["test", "--workspace"];
    if let Some(f) = filter {
        args.extend(["--", f]);
    }
    cargo(&args)
}

/// The root-only tests of `tests/` (`#[ignore]`d, so that a plain `cargo test` passes without
/// privileges): packets, namespaces, fleet, real vLLM. The package test runs apart, once its
/// build is done; the quick benchmark beside them.
fn root_tests(filter: Option<&str>) -> Result<()> {
    let mut args = vec![
        "test",
        "-p",
        "balancer-tests",
        "--",
        "--ignored",
        "--test-threads=2",
        "--skip",
        PACKAGE_TEST,
    ];
    if let Some(f) = filter {
        args.push(f);
    }
    let env = real_servers_env();
    let env: Vec<(&str, &std::path::Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    cargo_with_env(&args, &env)
}

/// Where the tests find the real servers' and the routers' environments.
fn real_servers_env() -> [(&'static str, PathBuf); 2] {
    let cache = real_servers::cache_dir();
    [
        ("BALANCER_VLLM_ENV", cache.join("vllm")),
        ("BALANCER_ROUTERS_ENV", cache.join("routers")),
    ]
}

/// The Debian package's test on the package the suite built.
fn package_test(deb: &std::path::Path) -> Result<()> {
    cargo_with_env(
        &[
            "test",
            "-p",
            "balancer-tests",
            "--test",
            "package",
            "--",
            "--ignored",
            "--exact",
            PACKAGE_TEST,
        ],
        &[("BALANCER_DEB", deb)],
    )
}

/// The reliability suite alone: its tests, the restart test, the million-frame sweep, fuzzing.
pub fn reliability(fuzz_secs: u32) -> Result<()> {
    let mut stages = Stages::default();
    let result = (|| {
        stages.run("setup", || setup::run(setup::RealServers::Optional))?;
        stages.run("build (debug)", || build(false))?;
        if !is_root() {
            bail!("the reliability suite needs root (BPF, namespaces)");
        }
        stages.run("reliability tests", || {
            cargo(&[
                "test",
                "-p",
                "balancer-tests",
                "--test",
                "rack_reliability",
                "--test",
                "prog_sweep",
                "--",
                "--ignored",
                "--test-threads=1",
            ])?;
            cargo(&[
                "test",
                "-p",
                "balancer-tests",
                "--test",
                "rack_control",
                "--",
                "--ignored",
                "restarts_lose_nothing",
            ])
        })?;
        fuzz(fuzz_secs, &mut stages)
    })();
    stages.print();
    result
}

/// Where the fuzz targets build: `<cache>/fuzz-target-<stamp>`, one directory per fuzz
/// lockfile and toolchain, kept across clones, so that a fresh clone on this machine builds
/// only the workspace's own crates again (the dependencies under sanitizers took 9.5 of a fresh
/// suite's 31 minutes). Directories of other stamps are removed.
fn fuzz_target_dir() -> Result<PathBuf> {
    let cache = real_servers::cache_dir();
    let stamp = real_servers::stamp_of(
        &[root().join("fuzz/Cargo.lock")],
        setup::ebpf_toolchain().as_bytes(),
    )?;
    let dir = cache.join(format!("fuzz-target-{stamp}"));
    real_servers::remove_stale(&cache, "fuzz-target", &dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Where the package's release build runs: `<cache>/package-target-<stamp>`, one directory per
/// `Cargo.lock` and host compiler, kept across clones like [`fuzz_target_dir`], so that a fresh
/// clone builds only the workspace's own crates in release. Directories of other stamps are
/// removed.
fn package_target_dir() -> Result<PathBuf> {
    let cache = real_servers::cache_dir();
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    let stamp = real_servers::stamp_of(&[root().join("Cargo.lock")], &rustc.stdout)?;
    let dir = cache.join(format!("package-target-{stamp}"));
    real_servers::remove_stale(&cache, "package-target", &dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Builds every fuzz target, then runs each for `secs` seconds (cargo-fuzz, nightly); a crash
/// fails the run.
fn fuzz(secs: u32, stages: &mut Stages) -> Result<()> {
    if secs == 0 {
        return Ok(());
    }
    stages.run("fuzz targets (build)", || {
        let status = cargo_fuzz(&["build", "--fuzz-dir", "fuzz", "--target-dir", &fuzz_dir()?])?;
        if !status.success() {
            bail!("building the fuzz targets failed ({status})");
        }
        Ok(())
    })?;
    stages.run("fuzzing", || run_fuzz_targets(secs))
}

fn fuzz_dir() -> Result<String> {
    Ok(fuzz_target_dir()?.to_string_lossy().to_string())
}

/// `cargo +<nightly> fuzz <args>` in the workspace root.
fn cargo_fuzz(args: &[&str]) -> Result<std::process::ExitStatus> {
    let toolchain = format!("+{}", setup::ebpf_toolchain());
    println!("xtask: cargo {toolchain} fuzz {}", args.join(" "));
    Command::new("cargo")
        .arg(&toolchain)
        .arg("fuzz")
        .args(args)
        .current_dir(root())
        .status()
        .context("running cargo fuzz")
}

/// Runs each built fuzz target for `secs` seconds.
fn run_fuzz_targets(secs: u32) -> Result<()> {
    let target_dir = fuzz_dir()?;
    let max_time = format!("-max_total_time={secs}");
    for target in FUZZ_TARGETS {
        println!("xtask: fuzzing {target} for {secs} s");
        let status = cargo_fuzz(&[
            "run",
            "--fuzz-dir",
            "fuzz",
            "--target-dir",
            &target_dir,
            target,
            "--",
            &max_time,
            "-max_len=4096",
        ])?;
        if !status.success() {
            bail!(
                "fuzz target {target} failed ({status}): a crash whose input is under fuzz/artifacts/{target}"
            );
        }
    }
    Ok(())
}
