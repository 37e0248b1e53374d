//! Support for the integration tests in `tests/`, also used by the benchmarks (`bench/`):
//! `netns` (namespaces), `rack` (the core every rack is built on: processes, logs, pins, the
//! bridge, one poll helper), `topology` (the single-balancer rack) and `fleet` (balancers
//! behind a BGP router, with etcd), `configs` (test configurations from typed config values),
//! `traffic` (client traffic) and `generators` (trafgen and wrk), `packet` (the
//! `BPF_PROG_TEST_RUN` harness and expected frames), `openai` (a streaming OpenAI-compatible
//! client), `vllm` (real vLLM servers in the rack), `pki` (test certificates), `pages`
//! (metrics pages), `rng` (a deterministic random generator). The binary `test-backend` is
//! the rack's backend server.
//!
//! The tests are named by harness: `prog_*` run the XDP program through `BPF_PROG_TEST_RUN`,
//! `rack_*` run the daemon in network namespaces; the others need no root.

pub mod configs;
pub mod fleet;
pub mod generators;
pub mod netns;
pub mod openai;
pub mod packet;
pub mod pages;
pub mod pki;
pub mod rack;
pub mod rng;
pub mod topology;
pub mod traffic;
pub mod vllm;
