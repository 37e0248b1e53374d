//! Streamed OpenAI-compatible completions as the wire carries them: an HTTP/1.1 response (chunked,
//! sized or closed-delimited) whose body is a server-sent-event stream of JSON chunks ending in
//! `data: [DONE]`. [`ResponseDecoder`] takes the bytes as they arrive and yields events, checking
//! every framing rule on the way, so a test can tell an intact stream from a cut or corrupted one;
//! [`stream_completion`] sends one request and reads its stream to the end.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// One server-sent event's `data` (lines joined by `\n`).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A JSON chunk.
    Chunk(serde_json::Value),
    /// `data: [DONE]`.
    Done,
}

#[derive(Debug)]
enum Body {
    /// Reading the status line and headers.
    Head,
    /// `Transfer-Encoding: chunked`: bytes left in the current chunk (None: at a size line).
    Chunked(Option<usize>),
    /// `Content-Length`: bytes left.
    Sized(usize),
    /// Neither: the body ends when the connection closes.
    UntilClose,
    /// The body ended (the last chunk, or all of its length).
    Ended,
}

/// Decodes one HTTP/1.1 response carrying an SSE stream, incrementally.
#[derive(Debug)]
pub struct ResponseDecoder {
    body: Body,
    raw: Vec<u8>,
    /// Decoded body bytes not yet split into events.
    text: Vec<u8>,
    pub status: u16,
    /// Header names in lower case, with their values.
    pub headers: Vec<(String, String)>,
}

impl Default for ResponseDecoder {
    fn default() -> Self {
        ResponseDecoder {
            body: Body::Head,
            raw: Vec::new(),
            text: Vec::new(),
            status: 0,
            headers: Vec::new(),
        }
    }
}

impl ResponseDecoder {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the body is complete (for a body delimited by the close, see [`Self::close`]).
    pub fn ended(&self) -> bool {
        matches!(self.body, Body::Ended)
    }

    /// Takes the bytes that arrived; returns the events they completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        self.raw.extend_from_slice(bytes);
        loop {
            match self.body {
                Body::Head => {
                    let Some(end) = find(&self.raw, b"\r\n\r\n") else {
                        if self.raw.len() > 64 * 1024 {
                            return Err("response head larger than 64 KiB".into());
                        }
                        break;
                    };
                    let head = String::from_utf8_lossy(&self.raw[..end]).to_string();
                    self.raw.drain(..end + 4);
                    self.parse_head(&head)?;
                }
                Body::Chunked(None) => {
                    let Some(end) = find(&self.raw, b"\r\n") else {
                        break;
                    };
                    let line = String::from_utf8_lossy(&self.raw[..end]).to_string();
                    let size = line.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(size, 16)
                        .map_err(|_| format!("bad chunk size line {line:?}"))?;
                    if size == 0 {
                        // The last chunk; trailers (none expected) end with an empty line.
                        let Some(trailer_end) = find(&self.raw[end..], b"\r\n\r\n") else {
                            break;
                        };
                        self.raw.drain(..end + trailer_end + 4);
                        self.body = Body::Ended;
                    } else {
                        self.raw.drain(..end + 2);
                        self.body = Body::Chunked(Some(size));
                    }
                }
                Body::Chunked(Some(left)) => {
                    // The chunk's data and its closing CRLF.
                    if self.raw.len() < left + 2 {
                        break;
                    }
                    if &self.raw[left..left + 2] != b"\r\n" {
                        return Err("a chunk does not end with CRLF".into());
                    }
                    self.text.extend(self.raw.drain(..left));
                    self.raw.drain(..2);
                    self.body = Body::Chunked(None);
                }
                Body::Sized(left) => {
                    let n = left.min(self.raw.len());
                    self.text.extend(self.raw.drain(..n));
                    self.body = if n == left {
                        Body::Ended
                    } else {
                        Body::Sized(left - n)
                    };
                    break;
                }
                Body::UntilClose => {
                    self.text.append(&mut self.raw);
                    break;
                }
                Body::Ended => {
                    if !self.raw.is_empty() {
                        return Err(format!(
                            "{} bytes after the end of the response",
                            self.raw.len()
                        ));
                    }
                    break;
                }
            }
        }
        self.events()
    }

    /// The connection closed: what a close-delimited body completed, or an error if the
    /// response was cut short.
    pub fn close(&mut self) -> Result<Vec<Event>, String> {
        match self.body {
            Body::UntilClose => {
                self.body = Body::Ended;
                let mut events = self.events()?;
                if !self.text.is_empty() {
                    // A last event without its blank line.
                    self.text.extend_from_slice(b"\n\n");
                    events.extend(self.events()?);
                }
                Ok(events)
            }
            Body::Ended => Ok(Vec::new()),
            Body::Head => Err("closed before the response head".into()),
            _ => Err("closed in the middle of the body".into()),
        }
    }

    fn parse_head(&mut self, head: &str) -> Result<(), String> {
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.split_whitespace();
        if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
            return Err(format!("not an HTTP/1 status line: {status_line:?}"));
        }
        self.status = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status code in {status_line:?}"))?;
        for line in lines {
            let (k, v) = line
                .split_once(':')
                .ok_or_else(|| format!("bad header line {line:?}"))?;
            self.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        self.body = if self
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            Body::Chunked(None)
        } else if let Some(len) = self.header("content-length") {
            let len: usize = len
                .parse()
                .map_err(|_| format!("bad content-length {len:?}"))?;
            if len == 0 {
                Body::Ended
            } else {
                Body::Sized(len)
            }
        } else {
            Body::UntilClose
        };
        Ok(())
    }

    /// Splits complete events (ended by a blank line) off the decoded body. A body that is not
    /// an event stream (an error page) yields nothing; its text stays in [`Self::body_text`].
    fn events(&mut self) -> Result<Vec<Event>, String> {
        if self.status != 200 {
            return Ok(Vec::new());
        }
        // Lines may end in CRLF: make them LF (a CR at the very end stays: it may be half of
        // one).
        if find(&self.text, b"\r\n").is_some() {
            let mut normal = Vec::with_capacity(self.text.len());
            let mut i = 0;
            while i < self.text.len() {
                if self.text[i..].starts_with(b"\r\n") {
                    i += 1;
                    continue;
                }
                normal.push(self.text[i]);
                i += 1;
            }
            self.text = normal;
        }
        let mut events = Vec::new();
        while let Some(end) = find(&self.text, b"\n\n") {
            let block: Vec<u8> = self.text.drain(..end + 2).collect();
            let block = String::from_utf8(block).map_err(|_| "an event is not UTF-8")?;
            let mut data = Vec::new();
            for line in block.lines() {
                let line = line.strip_suffix('\r').unwrap_or(line);
                if line.is_empty() || line.starts_with(':') {
                    continue;
                }
                match line.split_once(':') {
                    Some(("data", v)) => data.push(v.strip_prefix(' ').unwrap_or(v)),
                    Some(("event" | "id" | "retry", _)) => {}
                    _ => return Err(format!("not an event-stream line: {line:?}")),
                }
            }
            if data.is_empty() {
                continue;
            }
            let data = data.join("\n");
            if data == "[DONE]" {
                events.push(Event::Done);
            } else {
                let chunk = serde_json::from_str(&data)
                    .map_err(|e| format!("an event is not JSON ({e}): {data:?}"))?;
                events.push(Event::Chunk(chunk));
            }
        }
        Ok(events)
    }

    /// The decoded body bytes not split into events (the whole body of a non-200 answer).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.text).to_string()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A streamed completion, read to its end.
#[derive(Clone, Debug, Default)]
pub struct Completion {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The JSON chunks, in order.
    pub chunks: Vec<serde_json::Value>,
    /// Whether `data: [DONE]` ended the stream.
    pub done: bool,
    /// The generated text, joined from the chunks.
    pub text: String,
    /// Chunks that carried text.
    pub text_chunks: usize,
    /// The last `finish_reason` seen.
    pub finish_reason: Option<String>,
    /// `usage.completion_tokens` and `usage.prompt_tokens` of the usage chunk, if one came.
    pub completion_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
    /// Seconds from sending to the first text chunk, and to the end.
    pub ttft: Option<f64>,
    pub e2e: f64,
    /// The local address of the connection (the port tells which backend took it).
    pub local: Option<SocketAddr>,
    /// The body of a non-200 answer.
    pub error_body: String,
}

impl Completion {
    /// Everything an intact stream of `max_tokens` forced tokens has: status 200, an event
    /// stream, chunks of one completion id, text, `finish_reason` "length", usage equal to
    /// `max_tokens`, and `[DONE]` last. The error says what is wrong.
    pub fn check_intact(&self, max_tokens: u64) -> Result<(), String> {
        if self.status != 200 {
            return Err(format!("HTTP {}: {}", self.status, self.error_body));
        }
        let ct = self
            .headers
            .iter()
            .find(|(k, _)| k == "content-type")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        if !ct.starts_with("text/event-stream") {
            return Err(format!("content-type {ct:?}, not an event stream"));
        }
        if !self.done {
            return Err(format!(
                "the stream ended without [DONE] after {} chunks",
                self.chunks.len()
            ));
        }
        let ids: std::collections::BTreeSet<&str> = self
            .chunks
            .iter()
            .filter_map(|c| c.get("id")?.as_str())
            .collect();
        if ids.len() != 1 {
            return Err(format!("chunks of {} completion ids: {ids:?}", ids.len()));
        }
        if self.text_chunks == 0 {
            return Err("no chunk carried text".into());
        }
        if self.finish_reason.as_deref() != Some("length") {
            return Err(format!(
                "finish_reason {:?}, expected \"length\"",
                self.finish_reason
            ));
        }
        if self.completion_tokens != Some(max_tokens) {
            return Err(format!(
                "usage says {:?} completion tokens, expected {max_tokens}",
                self.completion_tokens
            ));
        }
        Ok(())
    }
}

/// POSTs `body` (a completions request with `"stream": true`) to `path` at `addr` on a new
/// connection (`Connection: close`) and reads the answer to its end. `on_connected` runs once
/// the connection is up (before the request), with its local address.
pub fn stream_completion(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
    on_connected: impl FnOnce(SocketAddr),
) -> Result<Completion> {
    let started = Instant::now();
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connecting {addr}"))?;
    stream.set_nodelay(true)?;
    let local = stream.local_addr()?;
    on_connected(local);
    let body = serde_json::to_vec(body)?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(&body)?;
    let mut decoder = ResponseDecoder::default();
    let mut out = Completion {
        local: Some(local),
        ..Completion::default()
    };
    let mut buf = vec![0u8; 16 * 1024];
    let take = |events: Vec<Event>, out: &mut Completion| -> Result<()> {
        for e in events {
            if out.done {
                bail!("an event after [DONE]: {e:?}");
            }
            match e {
                Event::Done => out.done = true,
                Event::Chunk(c) => {
                    if let Some(choice) = c.get("choices").and_then(|v| v.get(0)) {
                        let text = choice
                            .get("text")
                            .or_else(|| choice.get("delta").and_then(|d| d.get("content")))
                            .and_then(|t| t.as_str())
                            .unwrap_or_default();
                        if !text.is_empty() {
                            out.ttft.get_or_insert(started.elapsed().as_secs_f64());
                            out.text.push_str(text);
                            out.text_chunks += 1;
                        }
                        if let Some(reason) = choice.get("finish_reason").and_then(|r| r.as_str()) {
                            out.finish_reason = Some(reason.to_string());
                        }
                    }
                    if let Some(usage) = c.get("usage").filter(|u| !u.is_null()) {
                        out.completion_tokens =
                            usage.get("completion_tokens").and_then(|v| v.as_u64());
                        out.prompt_tokens = usage.get("prompt_tokens").and_then(|v| v.as_u64());
                    }
                    out.chunks.push(c);
                }
            }
        }
        Ok(())
    };
    loop {
        let left = timeout
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero())
            .with_context(|| format!("no complete answer from {addr} within {timeout:?}"))?;
        stream.set_read_timeout(Some(left))?;
        let n = stream
            .read(&mut buf)
            .with_context(|| format!("reading from {addr}"))?;
        let events = if n == 0 {
            decoder.close().map_err(anyhow::Error::msg)?
        } else {
            decoder.feed(&buf[..n]).map_err(anyhow::Error::msg)?
        };
        take(events, &mut out)?;
        if n == 0 || decoder.ended() {
            break;
        }
    }
    out.status = decoder.status;
    out.headers = decoder.headers.clone();
    out.error_body = if out.status == 200 {
        String::new()
    } else {
        decoder.body_text()
    };
    out.e2e = started.elapsed().as_secs_f64();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(
        wire: &[u8],
        piece: usize,
    ) -> Result<(ResponseDecoder, Vec<Event>), String> {
        let mut d = ResponseDecoder::default();
        let mut events = Vec::new();
        for part in wire.chunks(piece) {
            events.extend(d.feed(part)?);
        }
        if !d.ended() {
            events.extend(d.close()?);
        }
        Ok((d, events))
    }

    /// A chunked response whose chunks split events anywhere, with CRLF and LF line ends.
    fn chunked() -> Vec<u8> {
        let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for part in [
            "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r",
            "\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DO",
            "NE]\n",
            "\n",
        ] {
            wire.extend(format!("{:x};ext=1\r\n{part}\r\n", part.len()).bytes());
        }
        wire.extend(b"0\r\n\r\n");
        wire
    }

    #[test]
    fn a_chunked_event_stream_decodes_at_any_split() {
        let wire = chunked();
        for piece in [1, 2, 3, 7, 64, 4096] {
            let (d, events) = decode_in_pieces(&wire, piece).unwrap();
            assert_eq!(d.status, 200);
            assert!(d.ended());
            assert_eq!(events.len(), 3, "piece {piece}: {events:?}");
            assert_eq!(
                events[1],
                Event::Chunk(serde_json::json!({"choices":[{"text":"b"}]}))
            );
            assert_eq!(events[2], Event::Done);
        }
    }

    #[test]
    fn sized_and_close_delimited_bodies() {
        let sized = b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\ndata: [DONE]\n\n";
        let (_, events) = decode_in_pieces(sized, 5).unwrap();
        assert_eq!(events, vec![Event::Done]);
        let closed = b"HTTP/1.1 200 OK\r\n\r\ndata: {\"x\":1}\n\ndata: [DONE]";
        let (_, events) = decode_in_pieces(closed, 5).unwrap();
        assert_eq!(events.len(), 2, "{events:?}");
    }

    #[test]
    fn broken_streams_are_errors() {
        // Cut in the middle of a chunk.
        let wire = chunked();
        let cut = &wire[..wire.len() - 20];
        assert!(
            decode_in_pieces(cut, 9)
                .unwrap_err()
                .contains("middle of the body")
        );
        // A chunk whose size lies.
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n";
        assert!(decode_in_pieces(bad, 100).unwrap_err().contains("CRLF"));
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(
            decode_in_pieces(bad, 100)
                .unwrap_err()
                .contains("chunk size")
        );
        // Not JSON, not an event stream.
        let bad = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\ndata: {x}\n\n";
        assert!(decode_in_pieces(bad, 100).unwrap_err().contains("not JSON"));
        let bad = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nhello\n\n\n";
        assert!(
            decode_in_pieces(bad, 100)
                .unwrap_err()
                .contains("event-stream")
        );
        assert!(
            decode_in_pieces(b"SSH-2.0\r\n\r\n", 100)
                .unwrap_err()
                .contains("status line")
        );
    }

    #[test]
    fn an_error_answer_keeps_its_body() {
        let wire =
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 22\r\n\r\n{\"error\":\"no model x\"}";
        let (d, events) = decode_in_pieces(wire, 4).unwrap();
        assert_eq!(d.status, 404);
        assert!(events.is_empty());
        assert_eq!(d.body_text(), "{\"error\":\"no model x\"}");
    }
}
