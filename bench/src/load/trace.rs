//! Request traces an operator may replay, in the published formats, read into one form:
//!
//! | format | how it is recognised | arrival | sizes | more |
//! | --- | --- | --- | --- | --- |
//! | Azure LLM inference trace (CSV) | header `TIMESTAMP,ContextTokens,GeneratedTokens` | `YYYY-MM-DD HH:MM:SS.fffffff` | context, generated tokens | |
//! | BurstGPT (CSV) | a header naming `Timestamp`, `Request tokens` and `Response tokens` (any order, other columns ignored) | seconds | request, response tokens | `Session ID` / `SessionID` where the release has it |
//! | Mooncake (JSON lines) | a first line starting with `{` | `timestamp`, ms | `input_length`, `output_length` | `hash_ids`: the prompt's blocks, shared between requests that share a prefix |
//!
//! Every row is checked at the boundary: a bad one is an error naming the file, the line and the
//! field; a trace is bounded in length and in blocks per request. Times are seconds after the
//! trace's first request, in arrival order.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// One request of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    /// Seconds after the first request.
    pub at: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// The session (conversation) the request belongs to, where the trace says.
    pub session: Option<u64>,
    /// The prompt's blocks, where the trace says (Mooncake's `hash_ids`): requests whose
    /// prompts share a prefix share its first blocks.
    pub blocks: Vec<u64>,
}

/// A trace's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Azure,
    BurstGpt,
    Mooncake,
}

impl Format {
    pub const fn name(self) -> &'static str {
        match self {
            Format::Azure => "Azure LLM inference trace",
            Format::BurstGpt => "BurstGPT",
            Format::Mooncake => "Mooncake",
        }
    }
}

/// Most requests a trace may hold (a day of a busy fleet's Azure trace is under 100,000).
pub const MAX_REQUESTS: usize = 5_000_000;
/// Most tokens a request's prompt or output may claim.
pub const MAX_TOKENS: u32 = 10_000_000;
/// Most blocks a Mooncake request may list.
pub const MAX_BLOCKS: usize = 100_000;

/// The trace excerpt that ships with the project (bench/data; licence and attribution there).
pub fn shipped_trace() -> Result<Vec<TraceRequest>> {
    read_trace(&Path::new(env!("CARGO_MANIFEST_DIR")).join("data/azure-llm-conv-excerpt.csv"))
}

/// Reads a trace in any of the [`Format`]s, recognised from its first line.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (requests, _) = parse(&text).with_context(|| format!("trace {}", path.display()))?;
    Ok(requests)
}

/// Parses a trace's text: its requests in arrival order, and its format. Errors name the line
/// (1-based) and the field.
pub fn parse(text: &str) -> Result<(Vec<TraceRequest>, Format)> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((first_no, first)) = lines.next() else {
        bail!("the trace is empty");
    };
    let mut reader = Reader::of(first).with_context(|| format!("line {}", first_no + 1))?;
    // Mooncake has no header: its first line is a request.
    let first_row = matches!(reader, Reader::Mooncake).then_some((first_no, first));
    let mut out = Vec::new();
    for (n, line) in first_row.into_iter().chain(lines) {
        if out.len() == MAX_REQUESTS {
            bail!("more than {MAX_REQUESTS} requests: replay a stretch of the trace");
        }
        out.push(
            reader
                .row(line)
                .with_context(|| format!("line {}", n + 1))?,
        );
    }
    if out.is_empty() {
        bail!("the trace has a header and no requests");
    }
    // Stable: requests at the same time keep the file's order.
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    let t0 = out[0].at;
    for r in &mut out {
        r.at -= t0;
    }
    Ok((out, reader.format()))
}

/// How a trace's lines read, by format.
enum Reader {
    /// `first_day`: the first row's day, so times stay small and precise.
    Azure {
        first_day: Option<i64>,
    },
    BurstGpt(BurstColumns),
    Mooncake,
}

impl Reader {
    /// The reader of a trace whose first line is `first`: JSON lines, or a CSV header.
    fn of(first: &str) -> Result<Reader> {
        if first.trim_start().starts_with('{') {
            return Ok(Reader::Mooncake);
        }
        let names: Vec<&str> = first.split(',').map(str::trim).collect();
        if names == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"] {
            return Ok(Reader::Azure { first_day: None });
        }
        if let Some(columns) = BurstColumns::of(&names) {
            return Ok(Reader::BurstGpt(columns));
        }
        bail!(
            "not a trace header: expected TIMESTAMP,ContextTokens,GeneratedTokens (Azure), a header \
             with Timestamp, Request tokens and Response tokens (BurstGPT), or JSON lines (Mooncake)"
        )
    }

    fn format(&self) -> Format {
        match self {
            Reader::Azure { .. } => Format::Azure,
            Reader::BurstGpt(_) => Format::BurstGpt,
            Reader::Mooncake => Format::Mooncake,
        }
    }

    fn row(&mut self, line: &str) -> Result<TraceRequest> {
        match self {
            Reader::Azure { first_day } => azure_row(line, first_day),
            Reader::BurstGpt(columns) => columns.row(line),
            Reader::Mooncake => mooncake_row(line),
        }
    }
}

/// A token count: a whole number up to [`MAX_TOKENS`].
fn tokens(field: &str, value: &str) -> Result<u32> {
    let v: u64 = value
        .trim()
        .parse()
        .with_context(|| format!("{field} {value:?} is not a whole number of tokens"))?;
    if v > u64::from(MAX_TOKENS) {
        bail!("{field} {v} is over {MAX_TOKENS} tokens");
    }
    Ok(v as u32)
}

/// Seconds (or milliseconds scaled by `unit`): finite and not negative.
fn seconds(field: &str, value: &str, unit: f64) -> Result<f64> {
    let v: f64 = value
        .trim()
        .parse()
        .with_context(|| format!("{field} {value:?} is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        bail!("{field} {v} is not a time (finite, not negative)");
    }
    Ok(v * unit)
}

/// An Azure row; its time in seconds from the start of `first_day` (the first row's day).
fn azure_row(line: &str, first_day: &mut Option<i64>) -> Result<TraceRequest> {
    let fields: Vec<&str> = line.split(',').collect();
    let [ts, ctx, generated] = fields[..] else {
        bail!(
            "{} fields, expected 3: TIMESTAMP,ContextTokens,GeneratedTokens",
            fields.len()
        );
    };
    let (day, secs) = parse_timestamp(ts).with_context(|| format!("TIMESTAMP {ts:?}"))?;
    let first = *first_day.get_or_insert(day);
    Ok(TraceRequest {
        at: (day - first) as f64 * 86_400.0 + secs,
        prompt_tokens: tokens("ContextTokens", ctx)?,
        output_tokens: tokens("GeneratedTokens", generated)?,
        session: None,
        blocks: Vec::new(),
    })
}

/// Where BurstGPT's columns are in this file.
struct BurstColumns {
    width: usize,
    timestamp: usize,
    request: usize,
    response: usize,
    session: Option<usize>,
}

impl BurstColumns {
    /// The columns of a header that names BurstGPT's three (any order, others ignored).
    fn of(names: &[&str]) -> Option<BurstColumns> {
        let at = |name: &str| names.iter().position(|n| *n == name);
        Some(BurstColumns {
            width: names.len(),
            timestamp: at("Timestamp")?,
            request: at("Request tokens")?,
            response: at("Response tokens")?,
            session: at("Session ID").or_else(|| at("SessionID")),
        })
    }

    fn row(&self, line: &str) -> Result<TraceRequest> {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != self.width {
            bail!("{} fields, the header names {}", fields.len(), self.width);
        }
        let session = match self.session {
            Some(i) => Some(session_id(fields[i]).context("Session ID")?),
            None => None,
        };
        Ok(TraceRequest {
            at: seconds("Timestamp", fields[self.timestamp], 1.0)?,
            prompt_tokens: tokens("Request tokens", fields[self.request])?,
            output_tokens: tokens("Response tokens", fields[self.response])?,
            session,
            blocks: Vec::new(),
        })
    }
}

/// A session ID as a number: the number itself, or a hash of any other text (FNV-1a).
fn session_id(value: &str) -> Result<u64> {
    let v = value.trim().trim_matches('"');
    if v.is_empty() {
        bail!("empty");
    }
    Ok(v.parse::<u64>().unwrap_or_else(|_| {
        v.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    }))
}

fn mooncake_row(line: &str) -> Result<TraceRequest> {
    let v: serde_json::Value =
        serde_json::from_str(line).context("not a JSON object (Mooncake's format)")?;
    let field = |name: &str| v.get(name).with_context(|| format!("no {name} field"));
    let number = |name: &str| -> Result<String> {
        let f = field(name)?;
        if !f.is_number() {
            bail!("{name} {f} is not a number");
        }
        Ok(f.to_string())
    };
    let blocks = match v.get("hash_ids") {
        None => Vec::new(),
        Some(serde_json::Value::Array(ids)) => {
            if ids.len() > MAX_BLOCKS {
                bail!("hash_ids lists {} blocks, over {MAX_BLOCKS}", ids.len());
            }
            ids.iter()
                .map(|id| {
                    id.as_u64().with_context(|| {
                        format!("hash_ids: {id} is not a block id (a whole number)")
                    })
                })
                .collect::<Result<_>>()?
        }
        Some(other) => bail!("hash_ids {other} is not a list"),
    };
    Ok(TraceRequest {
        at: seconds("timestamp", &number("timestamp")?, 0.001)?,
        prompt_tokens: tokens("input_length", &number("input_length")?)?,
        output_tokens: tokens("output_length", &number("output_length")?)?,
        session: None,
        blocks,
    })
}

/// A `YYYY-MM-DD HH:MM:SS.fffffff` timestamp as (days since an arbitrary epoch, seconds of the
/// day): only differences matter, kept apart for precision.
fn parse_timestamp(ts: &str) -> Result<(i64, f64)> {
    let (date, time) = ts
        .trim()
        .split_once(' ')
        .context("no space between date and time")?;
    let d: Vec<u32> = date.split('-').map(str::parse).collect::<Result<_, _>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<u32> = hms.split(':').map(str::parse).collect::<Result<_, _>>()?;
    if d.len() != 3 || t.len() != 3 {
        bail!("not YYYY-MM-DD HH:MM:SS");
    }
    if !(1..=12).contains(&d[1]) || !(1..=31).contains(&d[2]) || t[0] > 23 || t[1] > 59 || t[2] > 60
    {
        bail!("month, day, hour, minute or second out of range");
    }
    if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
        bail!("the fraction of a second is not digits");
    }
    // Days from a civil date (proleptic Gregorian), enough for differences within a trace.
    let (y, m) = if d[1] <= 2 {
        (d[0] as i64 - 1, d[1] + 9)
    } else {
        (d[0] as i64, d[1] - 3)
    };
    let days = 365 * y + y / 4 - y / 100 + y / 400 + (153 * m as i64 + 2) / 5 + d[2] as i64;
    let frac: f64 = format!("0.{frac}").parse()?;
    Ok((days, f64::from(t[0] * 3600 + t[1] * 60 + t[2]) + frac))
}

#[cfg(test)]
mod tests;
