//! A simulated GPU inference server for tests, benchmarks and the demo ([`engine`]: the GPU
//! model; [`server`]: its OpenAI-compatible HTTP side with vLLM's metrics).

pub mod engine;
pub mod server;
