//! A small etcd v3 client over etcd's JSON gateway (HTTP/1.0 `POST /v3/...`, base64 keys and
//! values, 64-bit integers as strings), enough for leader election by lease and fenced writes.
//! Every call goes to the endpoint that answered last, then the others in turn; each has a
//! timeout, so a lost etcd is an error for the caller, never a hang.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use super::base64;

/// Largest answer read (a range over the fleet's keys is a few KiB).
const MAX_ANSWER: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no etcd endpoint answered: {0}")]
    Unreachable(String),
    #[error("etcd refused {call}: {message}")]
    Refused { call: String, message: String },
    #[error("unexpected answer to {call}: {message}")]
    Malformed { call: String, message: String },
}

/// One key's value and revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub lease: i64,
}

pub struct Etcd {
    endpoints: Vec<SocketAddr>,
    timeout: Duration,
    preferred: std::sync::atomic::AtomicUsize,
}

/// A guard on a txn: the key's value and lease must be these.
pub struct Held<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub lease: i64,
}

impl Etcd {
    pub fn new(endpoints: Vec<SocketAddr>, timeout: Duration) -> Etcd {
        Etcd {
            endpoints,
            timeout,
            preferred: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The value of `key`, if it exists.
    pub async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let answer = self
            .call("/v3/kv/range", json!({ "key": base64::encode(key) }))
            .await?;
        let kvs = parse_kvs("range", &answer)?;
        Ok(kvs.into_iter().next())
    }

    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), EtcdError> {
        self.call(
            "/v3/kv/put",
            json!({ "key": base64::encode(key), "value": base64::encode(value) }),
        )
        .await
        .map(|_| ())
    }

    /// A lease of `ttl` seconds; its id.
    pub async fn grant(&self, ttl: u64) -> Result<i64, EtcdError> {
        let answer = self
            .call("/v3/lease/grant", json!({ "TTL": ttl.to_string() }))
            .await?;
        int(&answer["ID"]).ok_or_else(|| malformed("lease grant", &answer))
    }

    /// Renews a lease; its remaining TTL (0 when it has expired or is unknown).
    pub async fn keep_alive(&self, lease: i64) -> Result<i64, EtcdError> {
        let answer = self
            .call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))
            .await?;
        let result = answer.get("result").unwrap_or(&answer);
        Ok(int(&result["TTL"]).unwrap_or(0))
    }

    pub async fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
            .await
            .map(|_| ())
    }

    /// Creates `key` = `value` under `lease` if the key does not exist. Whether it did.
    pub async fn create(&self, key: &[u8], value: &[u8], lease: i64) -> Result<bool, EtcdError> {
        let k = base64::encode(key);
        let answer = self
            .call(
                "/v3/kv/txn",
                json!({
                    "compare": [{ "key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0" }],
                    "success": [{ "request_put": { "key": k, "value": base64::encode(value), "lease": lease.to_string() } }],
                }),
            )
            .await?;
        Ok(answer["succeeded"].as_bool().unwrap_or(false))
    }

    /// Puts `key` = `value` only while `held` holds (a fenced write: a deposed leader's writes
    /// fail). Whether it was written.
    pub async fn put_if(
        &self,
        held: &Held<'_>,
        key: &[u8],
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        let h = base64::encode(held.key);
        let answer = self
            .call(
                "/v3/kv/txn",
                json!({
                    "compare": [
                        { "key": h, "result": "EQUAL", "target": "VALUE", "value": base64::encode(held.value) },
                        { "key": h, "result": "EQUAL", "target": "LEASE", "lease": held.lease.to_string() },
                    ],
                    "success": [{ "request_put": { "key": base64::encode(key), "value": base64::encode(value) } }],
                }),
            )
            .await?;
        Ok(answer["succeeded"].as_bool().unwrap_or(false))
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        use std::sync::atomic::Ordering;
        let body = body.to_string();
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..n {
            let which = (first + i) % n;
            let addr = self.endpoints[which];
            match tokio::time::timeout(self.timeout, post(addr, path, &body)).await {
                Ok(Ok((status, answer))) => {
                    self.preferred.store(which, Ordering::Relaxed);
                    let value: Value =
                        serde_json::from_slice(&answer).map_err(|e| EtcdError::Malformed {
                            call: path.to_string(),
                            message: format!(
                                "not JSON ({e}): {}",
                                String::from_utf8_lossy(&answer[..answer.len().min(200)])
                            ),
                        })?;
                    if status != 200 {
                        let message = value["error"]
                            .as_str()
                            .or(value["message"].as_str())
                            .unwrap_or("no message")
                            .to_string();
                        return Err(EtcdError::Refused {
                            call: path.to_string(),
                            message: format!("status {status}: {message}"),
                        });
                    }
                    return Ok(value);
                }
                Ok(Err(e)) => failures.push(format!("{addr}: {e}")),
                Err(_) => failures.push(format!("{addr}: no answer within {:?}", self.timeout)),
            }
        }
        Err(EtcdError::Unreachable(failures.join("; ")))
    }
}

/// One HTTP/1.0 POST (the server closes the connection after the answer): (status, body).
async fn post(addr: SocketAddr, path: &str, body: &str) -> Result<(u16, Vec<u8>), String> {
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    crate::http::exchange(addr, &request, MAX_ANSWER).await
}

/// A 64-bit integer the gateway sent as a string (or a number); absent fields are zero values.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn malformed(call: &str, answer: &Value) -> EtcdError {
    EtcdError::Malformed {
        call: call.to_string(),
        message: answer.to_string().chars().take(200).collect(),
    }
}

fn parse_kvs(call: &str, answer: &Value) -> Result<Vec<KeyValue>, EtcdError> {
    let Some(kvs) = answer.get("kvs") else {
        return Ok(Vec::new());
    };
    let kvs = kvs.as_array().ok_or_else(|| malformed(call, answer))?;
    kvs.iter()
        .map(|kv| {
            let bytes = |field: &str| {
                kv[field]
                    .as_str()
                    .map_or(Ok(Vec::new()), base64::decode)
                    .map_err(|e| EtcdError::Malformed {
                        call: call.to_string(),
                        message: format!("{field}: {e}"),
                    })
            };
            Ok(KeyValue {
                key: bytes("key")?,
                value: bytes("value")?,
                create_revision: int(&kv["create_revision"]).unwrap_or(0),
                mod_revision: int(&kv["mod_revision"]).unwrap_or(0),
                lease: int(&kv["lease"]).unwrap_or(0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_answers_decode_with_zero_values_omitted() {
        let answer: Value = serde_json::from_str(
            r#"{"header":{"revision":"9"},"kvs":[{"key":"L2ZsZWV0L2xlYWRlcg==","create_revision":"7","mod_revision":"7","version":"1","value":"bGIx","lease":"7587873437362321156"}],"count":"1"}"#,
        )
        .unwrap();
        let kvs = parse_kvs("range", &answer).unwrap();
        assert_eq!(kvs.len(), 1);
        assert_eq!(kvs[0].key, b"/fleet/leader");
        assert_eq!(kvs[0].value, b"lb1");
        assert_eq!(kvs[0].lease, 7587873437362321156);
        assert_eq!(kvs[0].create_revision, 7);
        // No kvs at all: the key does not exist.
        let empty: Value = serde_json::from_str(r#"{"header":{"revision":"9"}}"#).unwrap();
        assert!(parse_kvs("range", &empty).unwrap().is_empty());
        let bad: Value = serde_json::from_str(r#"{"kvs":[{"key":"***"}]}"#).unwrap();
        assert!(parse_kvs("range", &bad).is_err());
    }

    #[tokio::test]
    async fn an_unreachable_cluster_is_an_error_naming_each_endpoint() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let etcd = Etcd::new(
            vec![SocketAddr::from(([127, 0, 0, 1], port))],
            Duration::from_millis(500),
        );
        let err = etcd.get(b"/k").await.unwrap_err().to_string();
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    }
}
