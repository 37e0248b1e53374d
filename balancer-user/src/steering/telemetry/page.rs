//! A parser for the Prometheus text exposition format (version 0.0.4), as inference servers
//! serve it: `# HELP` / `# TYPE` comments, names with colons (`vllm:num_requests_running`),
//! label values with escapes (`\\`, `\"`, `\n`), values `NaN`, `+Inf`, `-Inf`, optional
//! timestamps, histograms as `_bucket`/`_sum`/`_count` samples.
//!
//! Why not a crate: the maintained one (`prometheus-parse` 0.2) matches names with `\w+`,
//! which rejects every `vllm:` and `sglang:` metric, and cuts label sets at the first `}`.
//!
//! Pages come from the network, so the parser is strict and bounded: a malformed line is an
//! error naming its line number, and pages over [`MAX_SAMPLES`] samples are refused.
//!
//! Samples borrow their names and label values from the page (a label value is copied only
//! when it has escapes): a scrape parses thousands of samples per second, and owned strings
//! made allocation the largest part of a scraping daemon's CPU.

use std::borrow::Cow;
use std::fmt;

/// Most samples accepted from one page.
pub const MAX_SAMPLES: usize = 100_000;
/// Longest line accepted.
pub const MAX_LINE: usize = 64 * 1024;
/// Most labels accepted on one sample.
pub const MAX_LABELS: usize = 64;

/// One sample line, borrowing from its page.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Labels<'a>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

impl Sample<'_> {
    /// The value of a label.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_ref())
    }
}

/// Why a page could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "metrics page line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for ParseError {}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Parses a Prometheus float: Go's spellings of infinities and NaN too.
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Parses a whole page.
pub fn parse(page: &str) -> Result<Vec<Sample<'_>>, ParseError> {
    let mut samples = Vec::new();
    for (i, line) in page.lines().enumerate() {
        let err = |reason: String| ParseError {
            line: i + 1,
            reason,
        };
        if line.len() > MAX_LINE {
            return Err(err(format!("line longer than {MAX_LINE} bytes")));
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if samples.len() == MAX_SAMPLES {
            return Err(err(format!("more than {MAX_SAMPLES} samples")));
        }
        samples.push(parse_sample(line).map_err(err)?);
    }
    Ok(samples)
}

fn parse_sample(line: &str) -> Result<Sample<'_>, String> {
    let mut chars = line.char_indices().peekable();
    let name_end = match chars.next() {
        Some((_, c)) if is_name_start(c) => {
            let mut end = line.len();
            for (i, c) in chars.by_ref() {
                if !is_name_char(c) {
                    end = i;
                    break;
                }
            }
            end
        }
        _ => {
            return Err(format!(
                "{:?} does not start with a metric name",
                truncate(line)
            ));
        }
    };
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remaining) = parse_labels(after)?;
        labels = parsed;
        rest = remaining;
    }
    let mut fields = rest.split_whitespace();
    let value_text = fields
        .next()
        .ok_or_else(|| format!("{name} has no value"))?;
    let value =
        parse_value(value_text).ok_or_else(|| format!("{name}: {value_text:?} is not a number"))?;
    let timestamp_ms = match fields.next() {
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| format!("{name}: timestamp {t:?} is not an integer"))?,
        ),
        None => None,
    };
    if let Some(extra) = fields.next() {
        return Err(format!("{name}: unexpected {extra:?} after the timestamp"));
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// A sample's labels, in page order: names and values as the page has them (a value with
/// escapes unescaped).
pub type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

/// Parses `name="value",...}` (after the `{`); returns the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Result<(Labels<'_>, &str), String> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((labels, rest));
        }
        let name_len = s
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
            .map(|(i, _)| i)
            .unwrap_or(s.len());
        if name_len == 0 {
            return Err(format!("bad label name at {:?}", truncate(s)));
        }
        let label = &s[..name_len];
        s = s[name_len..].trim_start();
        s = s
            .strip_prefix('=')
            .ok_or_else(|| format!("label {label} has no '='"))?
            .trim_start();
        s = s
            .strip_prefix('"')
            .ok_or_else(|| format!("label {label}'s value is not quoted"))?;
        let (value, end) = label_value(s).map_err(|why| format!("label {label}'s value {why}"))?;
        if labels.len() == MAX_LABELS {
            return Err(format!("more than {MAX_LABELS} labels"));
        }
        labels.push((label, value));
        s = s[end + 1..].trim_start();
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return Err(format!(
                "expected ',' or '}}' after a label, found {:?}",
                truncate(s)
            ));
        }
    }
}

/// A quoted label value (after its opening `"`): the value, borrowed unless it has escapes,
/// and the index of its closing `"`.
fn label_value(s: &str) -> Result<(Cow<'_, str>, usize), &'static str> {
    let bytes = s.as_bytes();
    // The common case: no escape before the closing quote.
    match bytes.iter().position(|b| *b == b'"' || *b == b'\\') {
        None => return Err("is not closed"),
        Some(end) if bytes[end] == b'"' => return Ok((Cow::Borrowed(&s[..end]), end)),
        Some(_) => {}
    }
    let mut value = String::new();
    let mut chars = s.char_indices();
    loop {
        match chars.next() {
            None => return Err("is not closed"),
            Some((i, '"')) => return Ok((Cow::Owned(value), i)),
            Some((_, '\\')) => match chars.next() {
                Some((_, '\\')) => value.push('\\'),
                Some((_, '"')) => value.push('"'),
                Some((_, 'n')) => value.push('\n'),
                Some((_, c)) => {
                    value.push('\\');
                    value.push(c);
                }
                None => return Err("ends in an escape"),
            },
            Some((_, c)) => value.push(c),
        }
    }
}

fn truncate(s: &str) -> &str {
    let end = s.char_indices().nth(40).map(|(i, _)| i).unwrap_or(s.len());
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_format_in_full() {
        let page = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B"} 2
# TYPE http_requests_total counter
http_requests_total{method="post",code="200"} 1027 1395066363000
escaped{path="C:\\dir\\file",quote="say \"hi\"",nl="a\nb",weird="}{,="} 1
no_labels 3.5e-3
empty_labels{} -2
nan_value NaN
inf_value +Inf
neg_inf -Inf
# TYPE rpc_duration_seconds histogram
rpc_duration_seconds_bucket{le="0.05"} 24054
rpc_duration_seconds_bucket{le="+Inf"} 144320
rpc_duration_seconds_sum 53423
rpc_duration_seconds_count 144320
trailing_comma{a="1",} 7
"#;
        let s = parse(page).unwrap();
        assert_eq!(s.len(), 14);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].label("engine"), Some("0"));
        assert_eq!(s[0].label("model_name"), Some("meta-llama/Llama-3.1-8B"));
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[2].timestamp_ms, Some(1_395_066_363_000));
        assert_eq!(s[3].label("path"), Some("C:\\dir\\file"));
        assert_eq!(s[3].label("quote"), Some("say \"hi\""));
        assert_eq!(s[3].label("nl"), Some("a\nb"));
        assert_eq!(s[3].label("weird"), Some("}{,="));
        assert_eq!(s[4].value, 3.5e-3);
        assert!(s[5].labels.is_empty());
        assert!(s[6].value.is_nan());
        assert_eq!(s[7].value, f64::INFINITY);
        assert_eq!(s[8].value, f64::NEG_INFINITY);
        assert_eq!(s[10].label("le"), Some("+Inf"));
        assert_eq!(s[13].label("a"), Some("1"));
    }

    #[test]
    fn names_and_plain_label_values_borrow_from_the_page() {
        let page = "m{a=\"plain\",b=\"with \\\"quotes\\\"\"} 1\n";
        let s = parse(page).unwrap();
        let within = |x: &str| page.as_bytes().as_ptr_range().contains(&x.as_ptr());
        assert!(within(s[0].name));
        assert!(matches!(&s[0].labels[0].1, Cow::Borrowed(v) if within(v) && *v == "plain"));
        assert!(matches!(&s[0].labels[1].1, Cow::Owned(v) if v == "with \"quotes\""));
    }

    #[test]
    fn malformed_lines_are_errors_with_their_line_number() {
        for (page, line, want) in [
            ("ok 1\n9bad 1", 2, "does not start with a metric name"),
            ("m{a=\"1\" 2", 1, "expected ','"),
            ("m{a=1} 2", 1, "not quoted"),
            ("m{a=\"1} 2", 1, "not closed"),
            ("m 1.2.3", 1, "is not a number"),
            ("m", 1, "has no value"),
            ("m 1 notatime", 1, "timestamp"),
            ("m 1 2 3", 1, "unexpected"),
            ("m{=\"x\"} 1", 1, "bad label name"),
        ] {
            let e = parse(page).unwrap_err();
            assert_eq!(e.line, line, "{page:?}");
            assert!(e.reason.contains(want), "{page:?}: {e}");
        }
    }

    #[test]
    fn pages_are_bounded() {
        let page = "m 1\n".repeat(MAX_SAMPLES + 1);
        assert!(parse(&page).unwrap_err().reason.contains("more than"));
        let long = format!("m{{a=\"{}\"}} 1", "x".repeat(MAX_LINE));
        assert!(parse(&long).unwrap_err().reason.contains("longer than"));
        let labels: Vec<String> = (0..=MAX_LABELS).map(|i| format!("l{i}=\"v\"")).collect();
        let wide = format!("m{{{}}} 1", labels.join(","));
        assert_eq!(
            parse(&wide).unwrap_err().reason,
            format!("more than {MAX_LABELS} labels")
        );
    }
}
