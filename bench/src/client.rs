//! `cargo xtask bench client`: a maintained LLM load generator from PyPI, `inference-perf`
//! (Kubernetes SIG Serving's benchmark tool), run from the client namespace against the VIP of
//! the simulated GPU rack, to show that the stack speaks what the ecosystem's tools expect:
//! OpenAI completions, streamed, through the XDP balancer to vLLM-compatible servers.
//!
//! It installs `inference-perf` into a Python 3.12 virtual environment under `target/`
//! (network access to PyPI needed once), writes its config, runs it, and prints its summary
//! beside the balancer's view of where the requests went.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::llm::{LLM_PORT, MODEL, composite_rack};
use balancer_tests::topology::VIP4;

/// The version installed.
pub const INFERENCE_PERF: &str = "inference-perf==0.7.0";

/// The virtual environment, created (and `inference-perf` installed) unless present.
pub fn venv(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/pyenv-inference-perf");
    let bin = dir.join("bin/inference-perf");
    if bin.exists() {
        return Ok(bin);
    }
    // $PYTHON, else the usual names, else a pyenv-installed 3.12+.
    let mut candidates: Vec<PathBuf> = std::env::var_os("PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(["python3.12", "python3.13", "python3.14", "python3"].map(PathBuf::from));
    if let Some(home) = std::env::var_os("HOME")
        && let Ok(dirs) = std::fs::read_dir(Path::new(&home).join(".pyenv/versions"))
    {
        let mut found: Vec<PathBuf> = dirs
            .flatten()
            .map(|d| d.path().join("bin/python3"))
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev());
    }
    let python = candidates
        .into_iter()
        .find(|p| {
            Command::new(p)
                .args(["-c", "import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)"])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .context("inference-perf needs Python 3.12 or newer: none found (set PYTHON=/path/to/python3.12)")?;
    let python = python.display().to_string();
    println!(
        "creating {} with {python} and installing {INFERENCE_PERF} from PyPI",
        dir.display()
    );
    let ok = Command::new(python)
        .args(["-m", "venv"])
        .arg(&dir)
        .status()?
        .success()
        && Command::new(dir.join("bin/pip"))
            .args(["install", "--quiet", INFERENCE_PERF])
            .status()?
            .success();
    if !ok || !bin.exists() {
        bail!("installing {INFERENCE_PERF} failed (is PyPI reachable?)");
    }
    Ok(bin)
}

/// A local word-level tokenizer for `inference-perf` (it counts tokens with a Hugging Face
/// tokenizer, which it would otherwise download): words, as the simulated servers count them.
pub fn tokenizer(venv_bin: &Path) -> Result<PathBuf> {
    let env = venv_bin
        .parent()
        .and_then(Path::parent)
        .context("venv layout")?;
    let dir = env.join("word-tokenizer");
    if dir.join("tokenizer.json").exists() {
        return Ok(dir);
    }
    let script = format!(
        "from tokenizers import Tokenizer, models, pre_tokenizers\n\
         from transformers import PreTrainedTokenizerFast\n\
         t = Tokenizer(models.WordLevel(vocab={{'[UNK]': 0, 'w': 1}}, unk_token='[UNK]'))\n\
         t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()\n\
         PreTrainedTokenizerFast(tokenizer_object=t, unk_token='[UNK]').save_pretrained({:?})\n",
        dir.display().to_string()
    );
    let ok = Command::new(env.join("bin/python"))
        .args(["-c", &script])
        .env("HF_HUB_OFFLINE", "1")
        .status()?
        .success();
    if !ok {
        bail!("creating the word tokenizer in {} failed", dir.display());
    }
    Ok(dir)
}

/// The `inference-perf` config: streamed completions at `rate` for `seconds` from its mock
/// data generator, against the VIP, counting tokens with `tokenizer`.
pub fn inference_perf_config(rate: f64, seconds: u32, out: &Path, tokenizer: &Path) -> String {
    format!(
        "load:\n  type: poisson\n  stages:\n  - rate: {rate}\n    duration: {seconds}\n  num_workers: 2\n\
         api:\n  type: completion\n  streaming: true\n\
         data:\n  type: mock\n\
         server:\n  type: vllm\n  model_name: {MODEL}\n  base_url: http://{VIP4}:{LLM_PORT}\n  ignore_eos: true\n\
         report:\n  request_lifecycle:\n    summary: true\n    per_stage: false\n    per_request: false\n\
         storage:\n  local_storage:\n    path: {}\n\
         tokenizer:\n  pretrained_model_name_or_path: {}\n",
        out.display(),
        tokenizer.display()
    )
}

/// Runs `inference-perf` through the balancer (composite policy) and prints what it and the
/// balancer saw.
pub fn run(root: &Path, rate: f64, seconds: u32) -> Result<()> {
    let bin = venv(root)?;
    let words = tokenizer(&bin)?;
    let topo = composite_rack("ipf")?;
    std::thread::sleep(Duration::from_millis(500));
    let out = topo.rack.log_dir.join("inference-perf");
    std::fs::create_dir_all(&out)?;
    let config_path = topo.rack.log_dir.join("inference-perf.yaml");
    std::fs::write(
        &config_path,
        inference_perf_config(rate, seconds, &out, &words),
    )?;
    println!(
        "running (in the client namespace): {} --config_file {}\nwith:\n{}",
        bin.display(),
        config_path.display(),
        std::fs::read_to_string(&config_path)?
    );
    let mut cmd = topo.client.command(bin.to_str().unwrap_or_default());
    cmd.arg("--config_file")
        .arg(&config_path)
        .current_dir(&out)
        .env("HF_HUB_OFFLINE", "1");
    let status = cmd.status().context("running inference-perf")?;
    let (_, status_text, _) = topo.cli(&["status"])?;
    println!("\n`balancer status` after the run:\n{status_text}");
    let mut summaries: Vec<PathBuf> = std::fs::read_dir(&out)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("summary"))
        .collect();
    summaries.sort();
    for s in &summaries {
        println!(
            "{}:\n{}",
            s.display(),
            std::fs::read_to_string(s).unwrap_or_default()
        );
    }
    if !status.success() {
        bail!("inference-perf failed ({status}); its output is above");
    }
    if summaries.is_empty() {
        bail!(
            "inference-perf wrote no summary report in {}",
            out.display()
        );
    }
    Ok(())
}
