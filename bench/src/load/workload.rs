//! Workload shapes for the routing benchmark, as conversations of one or more turns, each with
//! its client address and its own prompt text (so prompts differ per request and per
//! conversation, and repeat exactly where a conversation repeats its context).
//!
//! | shape | arrivals | prompt | output |
//! | --- | --- | --- | --- |
//! | `conversation` (decode-heavy) | the Azure conversation trace excerpt (or `--trace`), time-compressed to the rate or as recorded | the trace's context tokens | the trace's generated tokens |
//! | `prefill-heavy` | Poisson | log-normal, median 1,800 tokens (mean about 2,100), 200-8,000 | log-normal, median 20 (mean about 24), 4-128 |
//! | `mixed` | bursty: 3x the rate for a quarter of the time, a third of it otherwise (mean: the rate) | half decode-heavy (the trace's sizes), half prefill-heavy | as its half |
//! | `multi-turn` | conversations Poisson; a turn sent a think time (exponential, mean 2 s) after the answer to the one before | turn n: the whole conversation so far (its earlier messages and answers) + a new message (log-normal, median 120) | log-normal, median 150, 16-500 |
//!
//! `multi-turn-nat` is `multi-turn` with every conversation behind one of 4 addresses (a NAT),
//! instead of one address each.
//!
//! `noisy-tenant` is 4 tenants (a /28 of addresses each, as `tenants`) sending one-turn chat
//! requests (prompt log-normal median 400 words, output median 150 tokens) Poisson at a quarter
//! of the rate each; the fair-share runs add the fourth tenant's excess, 4x its share in the
//! middle third of the run (`noisy_excess`).
//!
//! `tenants` is `multi-turn` where each conversation belongs to one of 8 tenants (popularity
//! Zipf, s = 1): its first message starts with the tenant's system prompt (log-normal, median
//! 1,000 tokens, 300-3,000; the same for all of the tenant's conversations), and it comes from
//! one of the tenant's 16 addresses, a /28 of the client's subnet (10.111.0.112/28,
//! .128/28, ...): clients of one tenant share a network and a prompt prefix. Their prompts
//! (about 10,000 tokens in all) fit in every server's prefix cache. `tenants-many` has 32
//! tenants of 4 addresses (a /30 each) and system prompts of median 2,000 tokens (600-6,000):
//! about 70,000 tokens, more than one large server's KV cache (65,536) holds.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Result, bail};
pub use balancer_tests::rng::Rng;

pub use super::trace::{TraceRequest, read_trace, shipped_trace};

/// One turn: the new message, and how many tokens to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// Words of the new message (one token each for the simulator; a real tokenizer makes a
    /// few of each).
    pub message: String,
    pub output_tokens: u32,
    /// Seconds after the previous turn's answer (0 for the first).
    pub think: f64,
}

/// A conversation: when it starts, from where, and its turns.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    pub id: usize,
    /// Seconds after the workload's start.
    pub start: f64,
    pub source: IpAddr,
    pub turns: Vec<Turn>,
}

/// A named workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Conversation,
    PrefillHeavy,
    Mixed,
    MultiTurn,
    MultiTurnNat,
    Tenants,
    TenantsMany,
    NoisyTenant,
}

impl Shape {
    pub const ALL: [Shape; 8] = [
        Shape::Conversation,
        Shape::PrefillHeavy,
        Shape::Mixed,
        Shape::MultiTurn,
        Shape::MultiTurnNat,
        Shape::Tenants,
        Shape::TenantsMany,
        Shape::NoisyTenant,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Shape::Conversation => "conversation",
            Shape::PrefillHeavy => "prefill-heavy",
            Shape::Mixed => "mixed",
            Shape::MultiTurn => "multi-turn",
            Shape::MultiTurnNat => "multi-turn-nat",
            Shape::Tenants => "tenants",
            Shape::TenantsMany => "tenants-many",
            Shape::NoisyTenant => "noisy-tenant",
        }
    }

    pub fn parse(s: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|w| w.name() == s)
    }

    /// Whether its turns depend on earlier answers (closed loop per conversation).
    pub const fn multi_turn(self) -> bool {
        matches!(
            self,
            Shape::MultiTurn | Shape::MultiTurnNat | Shape::Tenants | Shape::TenantsMany
        )
    }

    /// How its tenants are laid out, for the tenant shapes.
    pub const fn tenants(self) -> Option<TenantLayout> {
        match self {
            Shape::Tenants => Some(TenantLayout {
                tenants: 8,
                prefix_v4: 28,
                prompt_median: 1000.0,
            }),
            Shape::TenantsMany => Some(TenantLayout {
                tenants: 32,
                prefix_v4: 30,
                prompt_median: 2000.0,
            }),
            _ => None,
        }
    }
}

/// The tenants of a tenant shape: each a network of the client's addresses (a prefix of
/// `prefix_v4` bits, from 10.111.0.112 on) with its own system prompt (log-normal around
/// `prompt_median` tokens, 0.3x-3x of it), chosen by popularity (Zipf, s = 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantLayout {
    pub tenants: usize,
    pub prefix_v4: u8,
    pub prompt_median: f64,
}

impl TenantLayout {
    /// Addresses of each tenant.
    pub const fn addresses(&self) -> usize {
        1 << (32 - self.prefix_v4)
    }

    /// A tenant drawn by popularity.
    fn draw(&self, rng: &mut Rng) -> usize {
        let total: f64 = (1..=self.tenants).map(|t| 1.0 / t as f64).sum();
        let mut u = rng.unit() * total;
        for t in 0..self.tenants {
            u -= 1.0 / (t + 1) as f64;
            if u <= 0.0 {
                return t;
            }
        }
        self.tenants - 1
    }
}

/// `n` words of text, different for every seed (a vocabulary of 50,000 words).
pub fn words(n: usize, rng: &mut Rng) -> String {
    let mut s = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push('w');
        s.push_str(&(rng.next_u64() % 50_000).to_string());
    }
    s
}

/// The client addresses conversations come from: `count` addresses of the client's subnet
/// (10.111.0.100 and up; the rack gives them to the client's interface).
pub fn client_addresses(count: usize) -> Vec<IpAddr> {
    (0..count.clamp(1, 150))
        .map(|i| IpAddr::V4(Ipv4Addr::new(10, 111, 0, 100 + i as u8)))
        .collect()
}

/// The benchmark's premium clients: 10.111.0.96/27 holds 28 of the first 100 client addresses
/// (10.111.0.100-127); conversation `i` comes from address `i mod 100`, so 28-36% of a run's
/// conversations, by its length (a tier for admission control).
pub const PREMIUM_PREFIX: &str = "10.111.0.96/27";

/// Whether `source` is one of the premium clients ([`PREMIUM_PREFIX`]).
pub fn is_premium(source: IpAddr) -> bool {
    matches!(source, IpAddr::V4(a) if a.octets()[..3] == [10, 111, 0] && (96..128).contains(&a.octets()[3]))
}

/// How many addresses a shape's conversations come from.
pub fn addresses_of(shape: Shape) -> usize {
    match shape {
        Shape::MultiTurnNat => 4,
        Shape::Tenants | Shape::TenantsMany | Shape::NoisyTenant => 150,
        _ => 100,
    }
}

/// The tenants' first address, an index of [`client_addresses`] (10.111.0.112: a /28 boundary,
/// with 128 addresses after it).
const FIRST_TENANT_ADDRESS: usize = 12;

/// How to make a workload.
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    pub shape: Shape,
    /// Requests (turns, for multi-turn shapes).
    pub requests: usize,
    /// Offered load, requests per second.
    pub rate: f64,
    /// Varies arrivals, sizes and texts; for the trace, the offset into it.
    pub seed: u64,
    /// Which client address each of the trace's requests comes from (the conversation shape).
    pub trace_clients: TraceClients,
    /// How the trace's arrival times map to the run's (the conversation shape).
    pub trace_time: TraceTime,
    /// Seconds of arrivals of a trace replayed as recorded (`requests` and `rate` do not
    /// apply to it: the trace says how many come when).
    pub seconds: f64,
}

/// How a trace's arrival times map to a run's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum TraceTime {
    /// Scaled so that the stretch's mean rate is the run's: the gaps keep their proportions,
    /// and each load of the sweep plays the trace faster or slower.
    #[default]
    Rate,
    /// At the recorded times, divided by `speed`: the trace's own rate and bursts (the sweep
    /// has one load, the trace's).
    Recorded { speed: f64 },
}

impl TraceTime {
    /// Speeds `recorded:X` accepts.
    pub const SPEEDS: std::ops::RangeInclusive<f64> = 0.01..=1000.0;

    /// `rate`, `recorded` or `recorded:X` (X times as fast as recorded, 0.01 to 1000).
    pub fn parse(s: &str) -> Result<TraceTime> {
        Ok(match s {
            "rate" => TraceTime::Rate,
            "recorded" => TraceTime::Recorded { speed: 1.0 },
            _ => match s.strip_prefix("recorded:").map(str::parse::<f64>) {
                Some(Ok(speed)) if Self::SPEEDS.contains(&speed) => TraceTime::Recorded { speed },
                _ => bail!(
                    "{s:?}: expected rate, recorded or recorded:X (X times as fast, 0.01 to 1000)"
                ),
            },
        })
    }

    /// In words, for a report.
    pub fn describe(self) -> String {
        match self {
            TraceTime::Rate => "compressed to each load's rate".into(),
            TraceTime::Recorded { speed: 1.0 } => "as recorded".into(),
            TraceTime::Recorded { speed } => format!("as recorded, {speed}x as fast"),
        }
    }

    /// The trace's mean rate as this replays it, requests per second (None: set by the run).
    pub fn rate_of(self, trace: &[TraceRequest]) -> Option<f64> {
        let TraceTime::Recorded { speed } = self else {
            return None;
        };
        let span = span(trace);
        (span > 0.0).then(|| (trace.len() - 1) as f64 / span * speed)
    }

    /// An error when the trace is too short to play `seconds` of arrivals as recorded.
    pub fn check_span(self, trace: &[TraceRequest], seconds: f64) -> Result<()> {
        let TraceTime::Recorded { speed } = self else {
            return Ok(());
        };
        let span = span(trace);
        if span / speed < seconds {
            bail!(
                "the trace spans {span:.1} s, {:.1} s at speed {speed}: shorter than the {seconds} s of arrivals asked (--duration)",
                span / speed
            );
        }
        Ok(())
    }
}

/// How a trace's requests map to client addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TraceClients {
    /// Request i from address i mod 100.
    #[default]
    PerRequest,
    /// One address per session (BurstGPT's Session ID; a request without one: per request).
    PerSession,
    /// One address per prompt prefix: the request's first block (Mooncake's first hash id;
    /// a request without blocks: per request).
    PerPrefix,
    /// Every request from one of N addresses, in turn (clients behind a NAT or a gateway).
    Behind(usize),
}

impl TraceClients {
    /// `per-request`, `per-session`, `per-prefix` or `behind:N` (N in 1..=100).
    pub fn parse(s: &str) -> Result<TraceClients> {
        Ok(match s {
            "per-request" => TraceClients::PerRequest,
            "per-session" => TraceClients::PerSession,
            "per-prefix" => TraceClients::PerPrefix,
            _ => match s.strip_prefix("behind:").map(str::parse::<usize>) {
                Some(Ok(n)) if (1..=100).contains(&n) => TraceClients::Behind(n),
                _ => bail!(
                    "{s:?}: expected per-request, per-session, per-prefix or behind:N (N in 1..=100)"
                ),
            },
        })
    }

    /// What `parse` reads.
    pub fn spec(self) -> String {
        match self {
            TraceClients::PerRequest => "per-request".into(),
            TraceClients::PerSession => "per-session".into(),
            TraceClients::PerPrefix => "per-prefix".into(),
            TraceClients::Behind(n) => format!("behind:{n}"),
        }
    }

    /// The address of request `i` of the stretch replayed.
    fn source(self, i: usize, r: &TraceRequest, addresses: &[IpAddr]) -> IpAddr {
        let by_key = |key: u64| {
            // Spread keys over the addresses (a multiplicative hash: ids are often sequential).
            addresses[(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % addresses.len()]
        };
        match (self, r.session, r.blocks.first()) {
            (TraceClients::PerSession, Some(session), _) => by_key(session),
            (TraceClients::PerPrefix, _, Some(&block)) => by_key(block),
            (TraceClients::Behind(n), ..) => addresses[i % n.min(addresses.len())],
            _ => addresses[i % addresses.len()],
        }
    }
}

/// Tokens of a prompt block of a trace that lists blocks (Mooncake's block size).
pub const BLOCK_TOKENS: u32 = 512;

/// A prompt of `tokens` words made of the trace's `blocks` (none: fresh words, as every
/// generated prompt): each block's words depend only on its id, so requests that share a prefix of blocks share that prefix of text (and the
/// servers' prefix caches see the trace's sharing). Blocks past the prompt's length are left
/// out, the last one cut to fit; tokens past the blocks are fresh words.
pub fn prompt_of_blocks(blocks: &[u64], tokens: u32, rng: &mut Rng) -> String {
    let mut parts = Vec::new();
    let mut left = tokens.max(1);
    for b in blocks {
        if left == 0 {
            break;
        }
        let n = left.min(BLOCK_TOKENS);
        let mut block_rng = Rng::new(b.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xb10c);
        parts.push(words(n as usize, &mut block_rng));
        left -= n;
    }
    if left > 0 {
        parts.push(words(left as usize, rng));
    }
    parts.join(" ")
}

/// Mean turns of a multi-turn conversation.
pub const MEAN_TURNS: f64 = 4.0;
/// Mean think time between turns, seconds.
pub const MEAN_THINK: f64 = 2.0;

/// Builds the workload.
pub fn build(o: &WorkloadOptions, trace: &[TraceRequest]) -> Result<Vec<Conversation>> {
    if o.requests == 0 || o.rate.is_nan() || o.rate <= 0.0 {
        bail!("a workload needs requests and a positive rate");
    }
    let addresses = client_addresses(addresses_of(o.shape));
    let mut rng = Rng::new(o.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5eed);
    Ok(match o.shape {
        Shape::Conversation => conversation(o, trace, &addresses, &mut rng)?,
        Shape::PrefillHeavy => prefill_heavy(o, &addresses, &mut rng),
        Shape::Mixed => mixed(o, trace, &addresses, &mut rng),
        Shape::MultiTurn | Shape::MultiTurnNat | Shape::Tenants | Shape::TenantsMany => {
            multi_turn(o, &addresses, &mut rng)
        }
        Shape::NoisyTenant => fair_tenants(o, &addresses, &mut rng),
    })
}

/// Tenants of the `noisy-tenant` shape: each a /28 of the client's addresses from
/// 10.111.0.112 (as the `tenants` shape's), at the same rate.
pub const NOISY_TENANTS: usize = 4;
/// The tenant that asks for more in the noisy period.
pub const NOISY: usize = NOISY_TENANTS - 1;
/// How many times its share it asks for then.
pub const NOISY_EXCESS: f64 = 4.0;

/// Which tenant of the `noisy-tenant` shape `source` belongs to.
pub fn noisy_tenant_of(source: IpAddr) -> Option<usize> {
    let IpAddr::V4(a) = source else {
        return None;
    };
    let [10, 111, 0, last] = a.octets() else {
        return None;
    };
    // Client address i is 10.111.0.(100 + i); the tenants start at FIRST_TENANT_ADDRESS.
    let t = usize::from(last).checked_sub(100 + FIRST_TENANT_ADDRESS)? / 16;
    (t < NOISY_TENANTS).then_some(t)
}

/// The `noisy-tenant` shape's tenant prefixes, as `[[tier]]` prefixes (10.111.0.112/28, ...).
pub fn noisy_tenant_prefixes() -> Vec<String> {
    (0..NOISY_TENANTS)
        .map(|t| format!("10.111.0.{}/28", 100 + FIRST_TENANT_ADDRESS + 16 * t))
        .collect()
}

/// A one-turn chat request of the `noisy-tenant` shape from tenant `tenant`, at `start`.
fn tenant_request(
    id: usize,
    tenant: usize,
    start: f64,
    addresses: &[IpAddr],
    rng: &mut Rng,
) -> Conversation {
    let i = FIRST_TENANT_ADDRESS + 16 * tenant + (rng.next_u64() % 16) as usize;
    Conversation {
        id,
        start,
        source: addresses[i],
        turns: vec![Turn {
            message: words(rng.size(400.0, 0.6, 50, 4000) as usize, rng),
            output_tokens: rng.size(150.0, 0.5, 16, 500),
            think: 0.0,
        }],
    }
}

/// The `noisy-tenant` shape as the knee and the fair-share runs see it without the excess:
/// [`NOISY_TENANTS`] tenants, each Poisson at a quarter of the rate, one-turn chat requests
/// (prompt log-normal median 400 words, output median 150 tokens).
fn fair_tenants(o: &WorkloadOptions, addresses: &[IpAddr], rng: &mut Rng) -> Vec<Conversation> {
    let mut at = 0.0;
    (0..o.requests)
        .map(|i| {
            at += rng.exponential(1.0 / o.rate);
            let tenant = (rng.next_u64() % NOISY_TENANTS as u64) as usize;
            tenant_request(i, tenant, at, addresses, rng)
        })
        .collect()
}

/// The noisy tenant's excess over `calm` (a `noisy-tenant` workload at `rate`): during the
/// middle third of its arrivals, [`NOISY`] asks for [`NOISY_EXCESS`] times its share, these
/// requests on top of its own. Ids follow `calm`'s; the same seed gives the same excess.
pub fn noisy_excess(
    calm: &[Conversation],
    rate: f64,
    seed: u64,
) -> (Vec<Conversation>, (f64, f64)) {
    let addresses = client_addresses(addresses_of(Shape::NoisyTenant));
    let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x0015e);
    let end = calm.last().map_or(0.0, |c| c.start);
    let period = (end / 3.0, 2.0 * end / 3.0);
    let excess_rate = (NOISY_EXCESS - 1.0) * rate / NOISY_TENANTS as f64;
    let mut at = period.0;
    let mut out = Vec::new();
    loop {
        at += rng.exponential(1.0 / excess_rate);
        if at > period.1 {
            break;
        }
        out.push(tenant_request(
            calm.len() + out.len(),
            NOISY,
            at,
            &addresses,
            &mut rng,
        ));
    }
    (out, period)
}

/// A one-turn conversation: request `id`, from its client address.
fn single(
    addresses: &[IpAddr],
    id: usize,
    start: f64,
    prompt: u32,
    output: u32,
    rng: &mut Rng,
) -> Conversation {
    Conversation {
        id,
        start,
        source: addresses[id % addresses.len()],
        turns: vec![Turn {
            message: words(prompt.max(1) as usize, rng),
            output_tokens: output.max(1),
            think: 0.0,
        }],
    }
}

/// The trace's requests (a stretch chosen by the seed), their arrivals compressed to the rate
/// or as recorded.
fn conversation(
    o: &WorkloadOptions,
    trace: &[TraceRequest],
    addresses: &[IpAddr],
    rng: &mut Rng,
) -> Result<Vec<Conversation>> {
    let (slice, scale) = match o.trace_time {
        TraceTime::Rate => {
            let slice = trace_slice(trace, o.requests, o.seed)?;
            // n arrivals over the stretch's span make n - 1 gaps.
            let span = (slice[slice.len() - 1].at - slice[0].at).max(1e-9);
            (slice, ((slice.len() - 1).max(1) as f64 / span) / o.rate)
        }
        TraceTime::Recorded { speed } => {
            o.trace_time.check_span(trace, o.seconds)?;
            (
                recorded_slice(trace, o.seconds * speed, o.seed)?,
                1.0 / speed,
            )
        }
    };
    let t0 = slice[0].at;
    Ok(slice
        .iter()
        .enumerate()
        .map(|(i, r)| Conversation {
            id: i,
            start: (r.at - t0) * scale,
            source: o.trace_clients.source(i, r, addresses),
            turns: vec![Turn {
                message: prompt_of_blocks(&r.blocks, r.prompt_tokens, rng),
                output_tokens: r.output_tokens.max(1),
                think: 0.0,
            }],
        })
        .collect())
}

/// Long prompts, few output tokens, Poisson arrivals.
fn prefill_heavy(o: &WorkloadOptions, addresses: &[IpAddr], rng: &mut Rng) -> Vec<Conversation> {
    let mut at = 0.0;
    (0..o.requests)
        .map(|i| {
            at += rng.exponential(1.0 / o.rate);
            let prompt = rng.size(1800.0, 0.55, 200, 8000);
            let output = rng.size(20.0, 0.5, 4, 128);
            single(addresses, i, at, prompt, output, rng)
        })
        .collect()
}

/// Bursts at 3x the rate a quarter of the time, calm at a third of it otherwise; half the
/// requests sized as the trace's, half prefill-heavy.
fn mixed(
    o: &WorkloadOptions,
    trace: &[TraceRequest],
    addresses: &[IpAddr],
    rng: &mut Rng,
) -> Vec<Conversation> {
    let mut at = 0.0;
    let mut burst = false;
    let mut phase_end = rng.exponential(3.0);
    (0..o.requests)
        .map(|i| {
            loop {
                let rate = if burst { 3.0 * o.rate } else { o.rate / 3.0 };
                let next = at + rng.exponential(1.0 / rate);
                if next <= phase_end {
                    at = next;
                    break;
                }
                at = phase_end;
                burst = !burst;
                phase_end = at + rng.exponential(if burst { 3.0 } else { 9.0 });
            }
            let (prompt, output) = if rng.unit() < 0.5 {
                let r = &trace[(rng.next_u64() % trace.len() as u64) as usize];
                (r.prompt_tokens, r.output_tokens)
            } else {
                (
                    rng.size(1800.0, 0.55, 200, 8000),
                    rng.size(20.0, 0.5, 4, 128),
                )
            };
            single(addresses, i, at, prompt, output, rng)
        })
        .collect()
}

/// Multi-turn conversations (each turn's prompt the conversation so far, its answer sent back
/// in the next), from their own addresses, behind a NAT, or from tenants that share a system
/// prompt.
fn multi_turn(o: &WorkloadOptions, addresses: &[IpAddr], rng: &mut Rng) -> Vec<Conversation> {
    // Each tenant's system prompt (the tenants shape only; from a generator of its own,
    // so the other shapes' workloads stay as they were).
    let mut prompts = Rng::new(o.seed ^ 0x7e4a_4755);
    let layout = o.shape.tenants();
    let system: Vec<String> = match layout {
        Some(l) => (0..l.tenants)
            .map(|_| {
                let m = l.prompt_median;
                let n = prompts.size(m, 0.5, (0.3 * m) as u32, (3.0 * m) as u32);
                words(n as usize, &mut prompts)
            })
            .collect(),
        None => Vec::new(),
    };
    // Conversations arrive so that their turns offer `rate` requests per second.
    let conversation_rate = o.rate / MEAN_TURNS;
    let mut at = 0.0;
    let mut out = Vec::new();
    let mut left = o.requests;
    while left > 0 {
        at += rng.exponential(1.0 / conversation_rate);
        // 1 + geometric: mean MEAN_TURNS.
        let mut turns = 1;
        while rng.unit() > 1.0 / MEAN_TURNS && turns < 12 {
            turns += 1;
        }
        let turns = turns.min(left);
        left -= turns;
        let id = out.len();
        let (source, prefix) = match layout {
            Some(l) => {
                let t = l.draw(rng);
                let i = FIRST_TENANT_ADDRESS
                    + t * l.addresses()
                    + (rng.next_u64() % l.addresses() as u64) as usize;
                (addresses[i], Some(&system[t]))
            }
            None => (addresses[id % addresses.len()], None),
        };
        out.push(Conversation {
            id,
            start: at,
            source,
            turns: (0..turns)
                .map(|t| Turn {
                    message: {
                        let n = rng.size(120.0, 0.6, 10, 1000) as usize;
                        let text = words(n, rng);
                        match prefix {
                            Some(system) if t == 0 => format!("{system} {text}"),
                            _ => text,
                        }
                    },
                    output_tokens: rng.size(150.0, 0.5, 16, 500),
                    think: if t == 0 {
                        0.0
                    } else {
                        rng.exponential(MEAN_THINK)
                    },
                })
                .collect(),
        });
    }
    out
}

/// `n` consecutive requests of the trace from an offset chosen by `seed` (repetitions replay
/// different stretches).
fn trace_slice(trace: &[TraceRequest], n: usize, seed: u64) -> Result<&[TraceRequest]> {
    if trace.len() < n {
        bail!(
            "the trace has {} requests, fewer than the {n} asked for",
            trace.len()
        );
    }
    let offsets = trace.len() - n + 1;
    let offset = ((seed as usize).wrapping_mul(n)) % offsets;
    Ok(&trace[offset..offset + n])
}

/// Seconds from a trace's first request to its last (0 for an empty trace).
fn span(trace: &[TraceRequest]) -> f64 {
    match (trace.first(), trace.last()) {
        (Some(a), Some(b)) => b.at - a.at,
        _ => 0.0,
    }
}

/// The requests of `span` seconds of the trace, from an offset chosen by `seed`.
fn recorded_slice(trace: &[TraceRequest], span: f64, seed: u64) -> Result<&[TraceRequest]> {
    let end = trace.last().map_or(0.0, |r| r.at);
    // Starts that leave `span` seconds of the trace after them.
    let starts = trace.partition_point(|r| r.at + span <= end);
    if starts == 0 {
        bail!("the trace is shorter than the {span:.1} s of it asked for");
    }
    let first = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 17) as usize % starts;
    let t0 = trace[first].at;
    let last = first + trace[first..].partition_point(|r| r.at < t0 + span);
    Ok(&trace[first..last])
}

/// Requests of a workload.
pub fn request_count(w: &[Conversation]) -> usize {
    w.iter().map(|c| c.turns.len()).sum()
}

#[cfg(test)]
mod tests;
