//! Test support for the balancer, and the benchmarks, simulator and demo built on it.
//!
//! - For the integration tests in `tests/`: `netns` (namespaces), `rack` (the core every
//!   rack is built on: processes, logs, pins, the bridge, one poll helper), `topology` (the
//!   single-balancer rack) and `fleet` (balancers behind a BGP router, with etcd), `configs`
//!   (test configurations from typed config values), `traffic` (client traffic), `packet`
//!   (the `BPF_PROG_TEST_RUN` harness and expected frames), `openai` (a streaming
//!   OpenAI-compatible client), `vllm` (real vLLM servers in the rack).
//! - Apart from the tests: `bench` (every `cargo xtask bench`), `load` (the load generator),
//!   `sim` (the simulated GPU server); the binaries in `src/bin/` (the demo, the bench
//!   driver, `sim-llm`, `test-backend`).

pub mod bench;
pub mod configs;
pub mod fleet;
pub mod load;
pub mod netns;
pub mod openai;
pub mod packet;
pub mod pages;
pub mod pki;
pub mod rack;
pub mod sim;
pub mod topology;
pub mod traffic;
pub mod vllm;
