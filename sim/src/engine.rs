//! The simulated GPU: an explicit, small model of how vLLM's V1 engine spends its time, so that
//! routing policies can be compared on something that behaves like one (what it leaves out, and
//! why that does not bias a comparison of routers: docs/results/llm/calibration.md).
//!
//! - **Paged KV cache**: `kv_blocks` blocks of `block_tokens` tokens (16, as vLLM on GPUs). A
//!   request holds the blocks its tokens so far need, allocated as it grows (not reserved for
//!   its whole output). KV use is the share of blocks held by requests.
//! - **Automatic prefix caching**: every full block is named by a hash chained over the block
//!   before it and its token ids; a block a request let go stays cached until its space is
//!   needed (least recently freed first). A new request starts with the leading blocks of its
//!   prompt that are cached (at least its last token is computed) and skips their prefill.
//! - **Scheduling per step** (continuous batching with chunked prefill): a token budget of
//!   `max_batched_tokens` per step; running requests first, in admission order (a decode takes 1
//!   token, a prefill the rest of its prompt up to the budget), then waiting ones, first come
//!   first served, while the batch has room (`max_num_seqs`) and their prompt's first chunk
//!   fits in free blocks.
//! - **Preemption**: a running request that needs a block when none is free makes the latest
//!   admitted request give all of its blocks back and wait at the head of the queue; it is
//!   recomputed (its prompt and what it generated so far) when it gets back in, helped by the
//!   blocks of its own that are still cached.
//! - **Step time**: `step_base + step_per_seq x requests in the step + prefill tokens /
//!   prefill_tokens_per_s`. A request whose last prompt chunk (or a decode) was computed in a
//!   step gets a token at its end.
//!
//! Time to first token is then queueing (waiting for a seat and blocks) + its prefill (shared
//! with the other requests of those steps); a server whose KV cache is full preempts and queues.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// A GPU's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub name: String,
    /// What it stands for.
    pub stands_for: String,
    pub kv_blocks: u64,
    pub block_tokens: u64,
    /// Requests in the running batch at most (vLLM's `--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Tokens computed per step at most (vLLM's `--max-num-batched-tokens`).
    pub max_batched_tokens: u64,
    pub prefill_tokens_per_s: f64,
    pub step_base: Duration,
    pub step_per_seq: Duration,
}

impl Profile {
    /// An 80 GB-class GPU (H100-like): a large KV cache, faster prefill and decode (about 33
    /// tokens/s per stream at small batches, as a large model gives).
    pub fn large() -> Profile {
        Profile {
            name: "large".into(),
            stands_for: "80 GB-class GPU (H100-like)".into(),
            kv_blocks: 4096,
            block_tokens: 16,
            max_num_seqs: 64,
            max_batched_tokens: 8192,
            prefill_tokens_per_s: 8_000.0,
            step_base: Duration::from_millis(30),
            step_per_seq: Duration::from_micros(200),
        }
    }

    /// A 24 GB-class GPU (L4-like): a quarter of the KV cache, a quarter of the prefill speed,
    /// half the decode speed, and smaller batches.
    pub fn small() -> Profile {
        Profile {
            name: "small".into(),
            stands_for: "24 GB-class GPU (L4-like)".into(),
            kv_blocks: 1024,
            block_tokens: 16,
            max_num_seqs: 16,
            max_batched_tokens: 2048,
            prefill_tokens_per_s: 2_000.0,
            step_base: Duration::from_millis(60),
            step_per_seq: Duration::from_millis(1),
        }
    }

    pub fn by_name(name: &str) -> Option<Profile> {
        match name {
            "large" => Some(Profile::large()),
            "small" => Some(Profile::small()),
            _ => None,
        }
    }

    /// A built-in profile's name, or a GPU written as numbers:
    /// `NAME:kv=TOKENS:prefill=TOKENS_PER_S:decode=TOKENS_PER_S:batch=N`, where `kv` is the KV
    /// cache's capacity in tokens, `prefill` the prefill speed, `decode` one stream's tokens per
    /// second when it is alone in the batch, `batch` the most requests in a batch (vLLM's
    /// `--max-num-seqs`). Optional: `per_seq_ms` (what each request in a step adds to its
    /// time; default 1/151 of a lone stream's step, as the large profile) and `step_tokens`
    /// (tokens computed per step at most; default 128 a request of the batch, as both
    /// built-in profiles). Blocks of 16 tokens. A clear error names the field that is wrong.
    pub fn parse(spec: &str) -> Result<Profile, String> {
        if let Some(p) = Profile::by_name(spec) {
            return Ok(p);
        }
        let mut parts = spec.split(':');
        let name = parts.next().unwrap_or_default();
        if !spec.contains(':')
            || name.is_empty()
            || name.len() > 32
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(format!(
                "GPU profile {spec:?}: expected large, small or NAME:kv=..:prefill=..:decode=..:batch=.. (NAME of 1-32 of a-z, 0-9, _)"
            ));
        }
        let mut fields: BTreeMap<&str, f64> = BTreeMap::new();
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("GPU profile {name}: {part:?} is not KEY=VALUE"))?;
            let Some(range) = PROFILE_FIELDS.iter().find(|f| f.0 == k).map(|f| &f.1) else {
                return Err(format!(
                    "GPU profile {name}: unknown field {k:?} (kv, prefill, decode, batch, per_seq_ms, step_tokens)"
                ));
            };
            let v: f64 = v
                .parse()
                .ok()
                .filter(|v: &f64| range.contains(v))
                .ok_or_else(|| {
                    format!(
                        "GPU profile {name}: {k}={v:?} must be a number in [{}, {}]",
                        range.start(),
                        range.end()
                    )
                })?;
            if fields.insert(k, v).is_some() {
                return Err(format!("GPU profile {name}: {k} given twice"));
            }
        }
        let need = |k: &str| {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| format!("GPU profile {name}: {k}= is missing"))
        };
        let (kv, prefill, decode, batch) = (
            need("kv")?,
            need("prefill")?,
            need("decode")?,
            need("batch")?,
        );
        let block_tokens = 16;
        let max_num_seqs = batch.round() as usize;
        let step = 1.0 / decode;
        let per_seq = fields.get("per_seq_ms").map_or(step / 151.0, |ms| ms / 1e3);
        if per_seq >= step {
            return Err(format!(
                "GPU profile {name}: per_seq_ms must be below a lone stream's step ({:.3} ms at decode={decode})",
                step * 1e3
            ));
        }
        Ok(Profile {
            name: name.to_string(),
            stands_for: format!(
                "{} KV tokens, prefill {prefill} tokens/s, decode {decode} tokens/s alone, batch {max_num_seqs}",
                kv as u64
            ),
            kv_blocks: (kv as u64).div_ceil(block_tokens),
            block_tokens,
            max_num_seqs,
            max_batched_tokens: fields
                .get("step_tokens")
                .map_or(128 * max_num_seqs as u64, |t| *t as u64),
            prefill_tokens_per_s: prefill,
            step_base: Duration::from_secs_f64(step - per_seq),
            step_per_seq: Duration::from_secs_f64(per_seq),
        })
    }

    /// The profile as `parse` reads it.
    pub fn spec(&self) -> String {
        let step = self.step_base + self.step_per_seq;
        format!(
            "{}:kv={}:prefill={}:decode={:.4}:batch={}:per_seq_ms={:.4}:step_tokens={}",
            self.name,
            self.kv_tokens(),
            self.prefill_tokens_per_s.round(),
            1.0 / step.as_secs_f64(),
            self.max_num_seqs,
            self.step_per_seq.as_secs_f64() * 1e3,
            self.max_batched_tokens
        )
    }

    /// KV-cache capacity in tokens.
    pub fn kv_tokens(&self) -> u64 {
        self.kv_blocks * self.block_tokens
    }

    /// Longest prompt + output accepted (a request must fit the whole cache).
    pub fn max_model_len(&self) -> u64 {
        self.kv_tokens()
    }
}

/// The fields of a profile written as numbers, and the range each must be in.
const PROFILE_FIELDS: &[(&str, std::ops::RangeInclusive<f64>)] = &[
    ("kv", 256.0..=100_000_000.0),
    ("prefill", 1.0..=10_000_000.0),
    ("decode", 0.1..=100_000.0),
    ("batch", 1.0..=4096.0),
    ("per_seq_ms", 0.0..=10_000.0),
    ("step_tokens", 16.0..=1_000_000.0),
];

/// A request's handle in the engine.
pub type RequestId = u64;
/// A token id.
pub type Token = u32;

type BlockId = u32;
type BlockHash = u64;

/// One KV block.
#[derive(Clone, Debug, Default)]
struct Block {
    /// Requests holding it.
    refs: u32,
    /// Its name in the prefix cache, once full and registered.
    hash: Option<BlockHash>,
    /// Its place in the free queue while nobody holds it.
    free_at: Option<u64>,
}

/// The block pool: free blocks in the order they were let go (evicted from the front), and the
/// prefix cache's index of full blocks by hash.
#[derive(Debug)]
struct Pool {
    blocks: Vec<Block>,
    free: BTreeMap<u64, BlockId>,
    next_free_seq: u64,
    cached: HashMap<BlockHash, BlockId>,
}

impl Pool {
    fn new(n: u64) -> Pool {
        let mut pool = Pool {
            blocks: vec![Block::default(); n as usize],
            free: BTreeMap::new(),
            next_free_seq: 0,
            cached: HashMap::new(),
        };
        for id in 0..n as BlockId {
            pool.release(id);
        }
        pool
    }

    fn free_count(&self) -> u64 {
        self.free.len() as u64
    }

    /// A free block for new tokens: the least recently freed, evicted from the cache.
    fn allocate(&mut self) -> Option<BlockId> {
        let (_, id) = self.free.pop_first()?;
        let b = &mut self.blocks[id as usize];
        b.free_at = None;
        b.refs = 1;
        if let Some(h) = b.hash.take()
            && self.cached.get(&h) == Some(&id)
        {
            self.cached.remove(&h);
        }
        Some(id)
    }

    /// Takes a cached block for a request (a prefix hit).
    fn take(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if let Some(seq) = b.free_at.take() {
            self.free.remove(&seq);
        }
        b.refs += 1;
    }

    /// A request lets go of a block; nobody holding it, it joins the free queue (still cached).
    fn release(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.refs = b.refs.saturating_sub(1);
        if b.refs == 0 {
            b.free_at = Some(self.next_free_seq);
            self.free.insert(self.next_free_seq, id);
            self.next_free_seq += 1;
        }
    }

    /// Names a full block in the cache (a block whose content is already cached stays
    /// anonymous).
    fn register(&mut self, id: BlockId, hash: BlockHash) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(id);
            self.blocks[id as usize].hash = Some(hash);
        }
    }
}

/// The hash of a full block, chained over the block before it.
fn block_hash(previous: BlockHash, tokens: &[Token]) -> BlockHash {
    // FNV-1a: deterministic, fast, and collisions are harmless here.
    let mut h = previous ^ 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[derive(Debug)]
struct Request {
    id: RequestId,
    /// Prompt and generated tokens so far.
    tokens: Vec<Token>,
    prompt_len: usize,
    max_tokens: u64,
    generated: u64,
    /// Tokens whose KV is computed.
    computed: usize,
    blocks: Vec<BlockId>,
    /// Hashes of its full blocks so far (chained).
    hashes: Vec<BlockHash>,
    /// Admitted once already (prompt and prefix counters count first admissions only).
    admitted_before: bool,
}

impl Request {
    /// Hashes of every full block of its tokens (extending the ones known).
    fn extend_hashes(&mut self, block_tokens: usize) {
        while (self.hashes.len() + 1) * block_tokens <= self.tokens.len() {
            let i = self.hashes.len();
            let previous = if i == 0 { 0 } else { self.hashes[i - 1] };
            let chunk = &self.tokens[i * block_tokens..(i + 1) * block_tokens];
            self.hashes.push(block_hash(previous, chunk));
        }
    }
}

/// What a step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// How long the step takes.
    pub duration: Duration,
    /// Requests admitted at this step (not counting re-admissions after a preemption), with
    /// the prompt tokens found in the prefix cache (not computed).
    pub admitted: Vec<(RequestId, usize)>,
    /// Requests that got a token at this step: (request, tokens generated so far).
    pub tokens: Vec<(RequestId, u64)>,
    /// Requests that finished at this step.
    pub finished: Vec<RequestId>,
    /// Requests preempted at this step.
    pub preempted: Vec<RequestId>,
}

/// Totals for the metrics page, as vLLM counts them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Prompt tokens looked up in the prefix cache, and found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
    pub finished: u64,
}

/// The engine's state.
#[derive(Debug)]
pub struct Engine {
    pub profile: Profile,
    pool: Pool,
    waiting: VecDeque<Request>,
    running: Vec<Request>,
    pub counters: Counters,
}

impl Engine {
    pub fn new(profile: Profile) -> Engine {
        Engine {
            pool: Pool::new(profile.kv_blocks),
            profile,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Counters::default(),
        }
    }

    /// Queues a request; refused if it could never fit in the KV cache.
    pub fn submit(
        &mut self,
        id: RequestId,
        prompt: Vec<Token>,
        max_tokens: u64,
    ) -> Result<(), String> {
        let need = prompt.len() as u64 + max_tokens;
        if prompt.is_empty() || max_tokens == 0 || need > self.profile.max_model_len() {
            return Err(format!(
                "prompt ({}) + max_tokens ({max_tokens}) must be between 2 and the model's length ({} tokens), with at least one of each",
                prompt.len(),
                self.profile.max_model_len()
            ));
        }
        self.waiting.push_back(Request {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            max_tokens,
            generated: 0,
            computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            admitted_before: false,
        });
        Ok(())
    }

    /// Forgets a request (its client left).
    pub fn cancel(&mut self, id: RequestId) {
        self.waiting.retain(|w| w.id != id);
        if let Some(at) = self.running.iter().position(|r| r.id == id) {
            let r = self.running.remove(at);
            self.free(r);
        }
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// KV-cache use, 0..1: the share of blocks requests hold (cached free blocks are free).
    pub fn kv_usage(&self) -> f64 {
        1.0 - self.pool.free_count() as f64 / self.profile.kv_blocks as f64
    }

    /// Tokens of the requests in flight (running and waiting).
    pub fn tokens_in_flight(&self) -> u64 {
        self.running
            .iter()
            .chain(&self.waiting)
            .map(|r| r.tokens.len() as u64)
            .sum()
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    fn free(&mut self, mut r: Request) -> Request {
        // The tail first, so that a prefix outlives its continuation in the cache.
        for id in r.blocks.drain(..).rev() {
            self.pool.release(id);
        }
        r
    }

    /// Blocks needed to hold `tokens` tokens.
    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.profile.block_tokens as usize)
    }

    /// Gives request `i` of the running batch the blocks it needs for `tokens` tokens.
    fn grow(&mut self, i: usize, tokens: usize) -> bool {
        let need = self
            .blocks_for(tokens)
            .saturating_sub(self.running[i].blocks.len());
        if self.pool.free_count() < need as u64 {
            return false;
        }
        for _ in 0..need {
            let id = self.pool.allocate().expect("counted free");
            self.running[i].blocks.push(id);
        }
        true
    }

    /// Registers a request's newly full blocks in the prefix cache.
    fn register_full_blocks(&mut self, i: usize) {
        let bt = self.profile.block_tokens as usize;
        let r = &mut self.running[i];
        r.extend_hashes(bt);
        let full = (r.computed / bt).min(r.hashes.len()).min(r.blocks.len());
        let pairs: Vec<(BlockId, BlockHash)> =
            (0..full).map(|k| (r.blocks[k], r.hashes[k])).collect();
        for (id, h) in pairs {
            self.pool.register(id, h);
        }
    }

    /// Runs one step; the caller waits `duration` before delivering the step's tokens.
    pub fn step(&mut self) -> Step {
        let mut step = Step::default();
        let mut budget = self.profile.max_batched_tokens as usize;
        // (request, tokens computed this step, whether that is a decode: the one token of a
        // request whose other tokens are all computed)
        let mut scheduled: Vec<(RequestId, usize, bool)> = Vec::new();
        let preempted_now = self.schedule_running(&mut budget, &mut step, &mut scheduled);
        if !preempted_now {
            self.admit_waiting(&mut budget, &mut step, &mut scheduled);
        }
        if scheduled.is_empty() {
            return step;
        }
        self.compute(scheduled, &mut step);
        step
    }

    /// The running batch, in admission order, within the step's token budget: each request's
    /// next tokens, the latest admitted giving its blocks back (preempted) where the cache is
    /// full. Whether one was preempted.
    fn schedule_running(
        &mut self,
        budget: &mut usize,
        step: &mut Step,
        scheduled: &mut Vec<(RequestId, usize, bool)>,
    ) -> bool {
        let mut preempted_now = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let r = &self.running[i];
            let new = (r.tokens.len() - r.computed).min(*budget);
            let target = r.computed + new;
            // Make room: the latest admitted request gives its blocks back.
            let mut fits = self.grow(i, target);
            while !fits {
                let last = self.running.len() - 1;
                let victim = self.running.remove(last);
                let mut victim = self.free(victim);
                victim.computed = 0;
                step.preempted.push(victim.id);
                self.counters.preemptions += 1;
                preempted_now = true;
                self.waiting.push_front(victim);
                if last == i {
                    break;
                }
                fits = self.grow(i, target);
            }
            if !fits {
                break;
            }
            *budget -= new;
            let r = &self.running[i];
            scheduled.push((r.id, new, r.computed + 1 == r.tokens.len()));
            i += 1;
        }
        preempted_now
    }

    /// Waiting requests, first come first served, while the batch, the budget and the free
    /// blocks allow: each takes its cached leading blocks and new ones for the rest.
    fn admit_waiting(
        &mut self,
        budget: &mut usize,
        step: &mut Step,
        scheduled: &mut Vec<(RequestId, usize, bool)>,
    ) {
        while *budget > 0
            && self.running.len() < self.profile.max_num_seqs
            && let Some(w) = self.waiting.front_mut()
        {
            let bt = self.profile.block_tokens as usize;
            w.extend_hashes(bt);
            // Leading cached blocks, leaving at least the last token to compute.
            let max_hit = (w.tokens.len() - 1) / bt;
            let hits: Vec<BlockId> = w
                .hashes
                .iter()
                .take(max_hit)
                .map_while(|h| self.pool.cached.get(h).copied())
                .collect();
            let cached = hits.len() * bt;
            let new = (w.tokens.len() - cached).min(*budget);
            let need = (cached + new).div_ceil(bt) - hits.len();
            // Free blocks, not counting cached free ones this request will take.
            let hits_free = hits
                .iter()
                .filter(|id| self.pool.blocks[**id as usize].refs == 0)
                .count();
            if self.pool.free_count() < (need + hits_free) as u64 {
                break;
            }
            let mut r = self.waiting.pop_front().expect("front exists");
            for id in &hits {
                self.pool.take(*id);
            }
            r.blocks = hits;
            for _ in 0..need {
                let id = self.pool.allocate().expect("counted free");
                r.blocks.push(id);
            }
            r.computed = cached;
            if !r.admitted_before {
                r.admitted_before = true;
                self.counters.prompt_tokens += r.prompt_len as u64;
                self.counters.prefix_queries += r.prompt_len as u64;
                self.counters.prefix_hits += cached.min(r.prompt_len) as u64;
                step.admitted.push((r.id, cached.min(r.prompt_len)));
            }
            *budget -= new;
            scheduled.push((r.id, new, false));
            self.running.push(r);
        }
    }

    /// The step's cost, then its tokens: each scheduled request's tokens computed, a token
    /// sampled for those whose tokens are all computed, finished requests freed.
    fn compute(&mut self, scheduled: Vec<(RequestId, usize, bool)>, step: &mut Step) {
        let prefill: usize = scheduled
            .iter()
            .filter(|(_, _, decode)| !decode)
            .map(|(_, new, _)| new)
            .sum();
        step.duration = self.profile.step_base
            + self.profile.step_per_seq * scheduled.len() as u32
            + Duration::from_secs_f64(prefill as f64 / self.profile.prefill_tokens_per_s);
        for (id, new, _) in scheduled {
            let i = self
                .running
                .iter()
                .position(|r| r.id == id)
                .expect("scheduled is running");
            self.running[i].computed += new;
            if self.running[i].computed == self.running[i].tokens.len() {
                // All its tokens computed: it samples the next one.
                let r = &mut self.running[i];
                r.generated += 1;
                r.tokens.push(output_token(r.generated));
                self.counters.generation_tokens += 1;
                step.tokens.push((r.id, r.generated));
            }
            self.register_full_blocks(i);
            if self.running[i].generated >= self.running[i].max_tokens {
                let r = self.running.remove(i);
                let r = self.free(r);
                self.counters.finished += 1;
                step.finished.push(r.id);
            }
        }
    }
}

/// The id of the `n`-th generated token (1-based): the word `tok<n>`, as the server writes it,
/// so that a client sending an answer back in its next prompt hits the blocks it left.
pub fn output_token(n: u64) -> Token {
    word_token(&format!("tok{n}"))
}

/// A word's token id (the simulator's tokenizer: one token per whitespace-separated word).
pub fn word_token(word: &str) -> Token {
    let mut h: u32 = 0x811c_9dc5;
    for b in word.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The token ids of a text.
pub fn tokenize(text: &str) -> Vec<Token> {
    text.split_whitespace().map(word_token).collect()
}

#[cfg(test)]
mod tests;
