//! Test support for the balancer: network namespaces, the test rack (client, balancer and
//! backends on one bridge), client traffic, and packet builders for `BPF_PROG_TEST_RUN`
//! fixtures. The integration tests in `tests/` and the demo binary use it.

pub mod bench;
pub mod fleet;
pub mod load;
pub mod netns;
pub mod openai;
pub mod packet;
pub mod sim;
pub mod topology;
pub mod traffic;
pub mod vllm;
