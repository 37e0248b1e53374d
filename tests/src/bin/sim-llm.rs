//! `sim-llm`: a simulated LLM inference server (OpenAI-compatible, vLLM metrics) whose GPU is
//! the explicit model of `balancer_tests::sim::engine`.

use std::net::SocketAddr;

use balancer_tests::sim::{engine::Profile, server};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Simulated LLM inference server: OpenAI-compatible /v1/completions and /v1/chat/completions \
             (streamed or not), /v1/models, /health, and vLLM's /metrics, over a modelled GPU",
    after_help = "Profiles:\n  large  80 GB-class GPU: 65,536 KV tokens, prefill 8k tok/s, decode step 30 ms + 0.2 ms/seq, batch 64\n  \
                  small  24 GB-class GPU: 16,384 KV tokens, prefill 2k tok/s, decode step 60 ms + 1 ms/seq, batch 16\n\n\
                  Example:\n  sim-llm --listen 0.0.0.0:8000 --name gpu1 --profile large --model llama-3-8b"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8000")]
    listen: SocketAddr,
    /// Name reported in the `x-served-by` header.
    #[arg(long)]
    name: String,
    /// GPU profile: large or small.
    #[arg(long, default_value = "large", value_parser = ["large", "small"])]
    profile: String,
    /// The model served (its `model_name` label and `/v1/models` entry).
    #[arg(long, default_value = "llama-3-8b")]
    model: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let profile = Profile::by_name(&args.profile).expect("clap checked the name");
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
