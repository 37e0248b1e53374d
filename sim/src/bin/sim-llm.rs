//! `sim-llm`: a simulated LLM inference server (OpenAI-compatible, vLLM metrics) whose GPU is
//! the explicit model of `balancer_sim::engine`.

use std::net::SocketAddr;

use balancer_sim::{engine::Profile, server};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Simulated LLM inference server: OpenAI-compatible /v1/completions and /v1/chat/completions \
             (streamed or not), /v1/models, /health, and vLLM's /metrics, over a modelled GPU",
    after_help = "Profiles (blocks of 16 tokens, prefix caching on):\n  \
                  large  80 GB-class GPU: 4,096 blocks (65,536 KV tokens), prefill 8k tok/s, step 30 ms + 0.2 ms/seq, 64 seqs, 8,192 tokens/step\n  \
                  small  24 GB-class GPU: 1,024 blocks (16,384 KV tokens), prefill 2k tok/s, step 60 ms + 1 ms/seq, 16 seqs, 2,048 tokens/step\n  \
                  NAME:kv=..:prefill=..:decode=..:batch=..  KV capacity in tokens, prefill tokens/s, one stream's decode\n    \
                  tokens/s alone in the batch, the most requests in a batch; optional :per_seq_ms=.. (default 1/151 of a\n    \
                  lone stream's step) and :step_tokens=.. (default 128 per request of the batch), as balancer-bench\n    \
                  calibrate writes them\n\n\
                  Example:\n  sim-llm --listen 0.0.0.0:8000 --name gpu1 --profile large --model llama-3-8b"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8000")]
    listen: SocketAddr,
    /// Name reported in the `x-served-by` header.
    #[arg(long)]
    name: String,
    /// GPU profile: large, small, or one written as numbers,
    /// NAME:kv=TOKENS:prefill=TOKENS_PER_S:decode=TOKENS_PER_S:batch=N (see below).
    #[arg(long, default_value = "large", value_parser = parse_profile)]
    profile: Profile,
    /// The model served (its `model_name` label and `/v1/models` entry).
    #[arg(long, default_value = "llama-3-8b")]
    model: String,
    /// KV-cache blocks (instead of the profile's).
    #[arg(long)]
    kv_blocks: Option<u64>,
    /// Tokens per KV block.
    #[arg(long)]
    block_tokens: Option<u64>,
    /// Requests in the running batch at most.
    #[arg(long)]
    max_num_seqs: Option<usize>,
    /// Tokens computed per step at most.
    #[arg(long)]
    max_batched_tokens: Option<u64>,
    /// Prefill speed, tokens per second.
    #[arg(long)]
    prefill_tps: Option<f64>,
    /// Fixed time of a step, ms.
    #[arg(long)]
    step_base_ms: Option<f64>,
    /// Time a step spends per request in it, ms.
    #[arg(long)]
    step_per_seq_ms: Option<f64>,
}

fn parse_profile(spec: &str) -> Result<Profile, String> {
    Profile::parse(spec)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut profile = args.profile;
    let ms = |v: f64| std::time::Duration::from_secs_f64(v / 1e3);
    if args.kv_blocks == Some(0)
        || args.block_tokens == Some(0)
        || args.max_num_seqs == Some(0)
        || args.max_batched_tokens == Some(0)
        || [args.prefill_tps, args.step_base_ms, args.step_per_seq_ms]
            .iter()
            .flatten()
            .any(|v| !(*v > 0.0 && v.is_finite()))
    {
        anyhow::bail!("profile overrides must be positive");
    }
    profile.kv_blocks = args.kv_blocks.unwrap_or(profile.kv_blocks);
    profile.block_tokens = args.block_tokens.unwrap_or(profile.block_tokens);
    profile.max_num_seqs = args.max_num_seqs.unwrap_or(profile.max_num_seqs);
    profile.max_batched_tokens = args
        .max_batched_tokens
        .unwrap_or(profile.max_batched_tokens);
    profile.prefill_tokens_per_s = args.prefill_tps.unwrap_or(profile.prefill_tokens_per_s);
    profile.step_base = args.step_base_ms.map_or(profile.step_base, ms);
    profile.step_per_seq = args.step_per_seq_ms.map_or(profile.step_per_seq, ms);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!(
        "sim-llm {} ({}) listening on {}",
        args.name, profile.stands_for, args.listen
    );
    runtime.block_on(server::serve(args.listen, args.name, args.model, profile))?;
    Ok(())
}
