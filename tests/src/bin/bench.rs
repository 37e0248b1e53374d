//! `balancer-bench`: the benchmarks behind `cargo xtask bench`.

use anyhow::Result;
use balancer_tests::bench::{self, control, dataplane};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "balancer benchmarks; each prints a table and writes target/bench/<name>.json")]
struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// ns/packet of the XDP program per path (BPF_PROG_TEST_RUN), vs a bare XDP_PASS.
    Dataplane {
        /// Interleaved rounds (the median is reported).
        #[arg(long, default_value_t = 9)]
        rounds: usize,
        /// Runs per syscall for the paths timed with the kernel's repeat.
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        /// Single-run syscalls per round for the encapsulating paths.
        #[arg(long, default_value_t = 20_000)]
        singles: u32,
    },
    /// Maglev build time, slots moved, balance, publish latency, daemon memory.
    Control,
}

fn main() -> Result<()> {
    match Args::parse().bench {
        Bench::Dataplane {
            rounds,
            repeat,
            singles,
        } => {
            let figures = dataplane::run(rounds, repeat, singles)?;
            let path = bench::write_json("dataplane", &figures)?;
            println!("wrote {}", path.display());
        }
        Bench::Control => {
            let figures = control::run()?;
            let path = bench::write_json("control", &figures)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
