//! The simulated GPU: an explicit, small model of how an LLM inference server spends its time,
//! so that routing policies can be compared on something that behaves like one.
//!
//! - **KV cache**: a capacity in tokens. A request is admitted when its prompt plus its
//!   `max_tokens` fit in what is free (space is reserved for the whole generation, as a server
//!   without preemption must); otherwise it waits, first come first served.
//! - **Continuous batching**: requests join and leave the running batch between steps, up to
//!   `max_batch` at once.
//! - **Prefill**: a step that admits requests first processes their prompts at
//!   `prefill_tokens_per_s`; the whole batch waits for it (no chunked prefill).
//! - **Decode**: each step gives every running request one token and lasts `step_base +
//!   step_per_seq x batch size`: bigger batches are more efficient per token but slower per
//!   step.
//!
//! Time to first token is then queueing (waiting for KV space) + the prefill of the step that
//! admits the request + that step's decode; a server whose KV cache is full builds a queue.

use std::collections::VecDeque;
use std::time::Duration;

/// A GPU's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    /// What it stands for.
    pub stands_for: &'static str,
    pub kv_tokens: u64,
    pub prefill_tokens_per_s: f64,
    pub step_base: Duration,
    pub step_per_seq: Duration,
    pub max_batch: usize,
}

impl Profile {
    /// An 80 GB-class GPU (H100-like): a large KV cache, faster prefill and decode (about 33
    /// tokens/s per stream at small batches, as a large model gives).
    pub fn large() -> Profile {
        Profile {
            name: "large",
            stands_for: "80 GB-class GPU (H100-like)",
            kv_tokens: 65_536,
            prefill_tokens_per_s: 8_000.0,
            step_base: Duration::from_millis(30),
            step_per_seq: Duration::from_micros(200),
            max_batch: 64,
        }
    }

    /// A 24 GB-class GPU (L4-like): a quarter of the KV cache, a quarter of the prefill speed,
    /// half the decode speed, and smaller batches.
    pub fn small() -> Profile {
        Profile {
            name: "small",
            stands_for: "24 GB-class GPU (L4-like)",
            kv_tokens: 16_384,
            prefill_tokens_per_s: 2_000.0,
            step_base: Duration::from_millis(60),
            step_per_seq: Duration::from_millis(1),
            max_batch: 16,
        }
    }

    pub fn by_name(name: &str) -> Option<Profile> {
        match name {
            "large" => Some(Profile::large()),
            "small" => Some(Profile::small()),
            _ => None,
        }
    }
}

/// A request's handle in the engine.
pub type RequestId = u64;

#[derive(Clone, Debug)]
struct Waiting {
    id: RequestId,
    prompt: u64,
    max_tokens: u64,
}

#[derive(Clone, Debug)]
struct Running {
    id: RequestId,
    prompt: u64,
    max_tokens: u64,
    generated: u64,
}

/// What a step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// How long the step takes (prefill of the admitted requests + one decode).
    pub duration: Duration,
    /// Requests admitted at this step (their first token comes at its end).
    pub admitted: Vec<RequestId>,
    /// Every running request gets a token: (request, tokens generated so far).
    pub tokens: Vec<(RequestId, u64)>,
    /// Requests that finished at this step.
    pub finished: Vec<RequestId>,
}

/// The engine's state.
#[derive(Debug)]
pub struct Engine {
    pub profile: Profile,
    waiting: VecDeque<Waiting>,
    running: Vec<Running>,
    kv_used: u64,
    /// Totals for the metrics page.
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub finished_total: u64,
}

impl Engine {
    pub fn new(profile: Profile) -> Engine {
        Engine {
            profile,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv_used: 0,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            finished_total: 0,
        }
    }

    /// Queues a request; refused if it could never fit in the KV cache.
    pub fn submit(&mut self, id: RequestId, prompt: u64, max_tokens: u64) -> Result<(), String> {
        let need = prompt + max_tokens;
        if need > self.profile.kv_tokens || max_tokens == 0 {
            return Err(format!(
                "prompt ({prompt}) + max_tokens ({max_tokens}) must be between 1 and the KV cache ({} tokens)",
                self.profile.kv_tokens
            ));
        }
        self.waiting.push_back(Waiting {
            id,
            prompt,
            max_tokens,
        });
        Ok(())
    }

    /// Forgets a request (its client left).
    pub fn cancel(&mut self, id: RequestId) {
        self.waiting.retain(|w| w.id != id);
        if let Some(at) = self.running.iter().position(|r| r.id == id) {
            let r = self.running.swap_remove(at);
            self.kv_used -= r.prompt + r.max_tokens;
        }
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// KV-cache use, 0..1.
    pub fn kv_usage(&self) -> f64 {
        self.kv_used as f64 / self.profile.kv_tokens as f64
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Runs one step: admits what fits, then decodes one token for every running request.
    /// The caller waits `duration` before delivering the step's tokens.
    pub fn step(&mut self) -> Step {
        let mut step = Step::default();
        let mut prefill = 0u64;
        while let Some(w) = self.waiting.front() {
            let need = w.prompt + w.max_tokens;
            if self.running.len() >= self.profile.max_batch
                || self.kv_used + need > self.profile.kv_tokens
            {
                break;
            }
            let w = self.waiting.pop_front().expect("front exists");
            self.kv_used += need;
            prefill += w.prompt;
            self.prompt_tokens_total += w.prompt;
            step.admitted.push(w.id);
            self.running.push(Running {
                id: w.id,
                prompt: w.prompt,
                max_tokens: w.max_tokens,
                generated: 0,
            });
        }
        if self.running.is_empty() {
            return step;
        }
        step.duration = Duration::from_secs_f64(prefill as f64 / self.profile.prefill_tokens_per_s)
            + self.profile.step_base
            + self.profile.step_per_seq * self.running.len() as u32;
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            r.generated += 1;
            self.generation_tokens_total += 1;
            step.tokens.push((r.id, r.generated));
            if r.generated >= r.max_tokens {
                let r = self.running.swap_remove(i);
                self.kv_used -= r.prompt + r.max_tokens;
                self.finished_total += 1;
                step.finished.push(r.id);
            } else {
                i += 1;
            }
        }
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_request_gets_prefill_then_one_token_per_step() {
        let mut e = Engine::new(Profile::large());
        e.submit(1, 4000, 3).unwrap();
        let s = e.step();
        assert_eq!(s.admitted, vec![1]);
        // 4000 / 8000 tok/s = 500 ms of prefill + 30 ms + 0.2 ms.
        assert_eq!(s.duration, Duration::from_micros(530_200));
        assert_eq!(s.tokens, vec![(1, 1)]);
        assert_eq!(e.step().duration, Duration::from_micros(30_200));
        let last = e.step();
        assert_eq!(last.finished, vec![1]);
        assert!(e.is_idle());
        assert_eq!(e.kv_usage(), 0.0);
        assert_eq!(
            (e.prompt_tokens_total, e.generation_tokens_total),
            (4000, 3)
        );
    }

    #[test]
    fn a_full_kv_cache_queues_requests_in_order() {
        let mut e = Engine::new(Profile::small());
        // Each needs 6,000 of 16,384 tokens: two fit.
        for id in 1..=4 {
            e.submit(id, 5000, 1000).unwrap();
        }
        let s = e.step();
        assert_eq!(s.admitted, vec![1, 2]);
        assert_eq!((e.running(), e.waiting()), (2, 2));
        assert!((e.kv_usage() - 12_000.0 / 16_384.0).abs() < 1e-9);
        // Batch steps slow down with size.
        assert!(e.step().duration > Profile::small().step_base);
        for _ in 0..998 {
            assert!(e.step().admitted.is_empty());
        }
        // Both finish; the next two get in.
        assert_eq!(e.step().admitted, vec![3, 4]);
        assert!(e.submit(9, 16_000, 1000).is_err(), "larger than the cache");
    }

    #[test]
    fn the_batch_is_capped() {
        let mut e = Engine::new(Profile::small());
        for id in 0..40 {
            e.submit(id, 10, 10).unwrap();
        }
        e.step();
        assert_eq!(e.running(), Profile::small().max_batch);
    }
}
