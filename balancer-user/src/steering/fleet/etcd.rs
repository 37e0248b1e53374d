//! The fleet's store on etcd, through the maintained `etcd-client` crate (gRPC over HTTP/2,
//! TLS by rustls): reads, leases, fenced transactions and watches. One client per daemon,
//! made at the first call and kept (its channel reconnects by itself); with a user, made
//! again when the user was refused, so that a fixed password file is picked up. Every call
//! has a time limit, so a lost etcd is an error for the caller, never a hang. Errors are
//! classified (unreachable, TLS, authentication, settings) and name the setting to look at.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::{Mutex, mpsc};

use super::store::{Change, FleetStore, Held, KeyValue, Read, StoreError, Watch, WatchBatch};
use crate::base::config::FleetConfig;
use crate::base::error_text::{error_chain, with_sources};

pub struct EtcdStore {
    config: FleetConfig,
    timeout: Duration,
    client: Mutex<Option<Client>>,
}

impl EtcdStore {
    /// A store on the cluster of `config`; nothing is dialled before the first call.
    pub fn new(config: &FleetConfig, timeout: Duration) -> EtcdStore {
        EtcdStore {
            config: config.clone(),
            timeout,
            client: Mutex::new(None),
        }
    }

    fn endpoints(&self) -> Vec<String> {
        let scheme = if self.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        (self.config.etcd.iter())
            .map(|a| format!("{scheme}://{a}"))
            .collect()
    }

    fn options(&self) -> Result<ConnectOptions, StoreError> {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path).map_err(|e| {
                StoreError::Settings(format!("reading {what} {}: {e}", path.display()))
            })
        };
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            // HTTP/2 pings: a watch on a connection that went silent (a partition) breaks
            // within two seconds instead of waiting for TCP.
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
            .with_keep_alive_while_idle(true)
            .with_auto_token_refresh(true);
        if let Some(tls) = &self.config.tls {
            let ca = read(&tls.ca, "fleet.ca")?;
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
            if let Some((cert, key)) = &tls.identity {
                let cert = read(cert, "fleet.cert")?;
                let key = read(key, "fleet.key")?;
                t = t.identity(Identity::from_pem(cert, key));
            }
            if let Some(name) = &tls.server_name {
                t = t.domain_name(name.clone());
            }
            options = options.with_tls(t);
        }
        if let Some(auth) = &self.config.auth {
            let password = crate::base::files::read_secret(&auth.password_file)
                .map_err(|e| {
                    StoreError::Settings(format!(
                        "reading fleet.password_file {}: {e}",
                        auth.password_file.display()
                    ))
                })?
                .trim_end_matches(['\r', '\n'])
                .to_string();
            options = options.with_user(auth.username.clone(), password);
        }
        Ok(options)
    }

    /// The client, connected (and authenticated) at the first call.
    async fn client(&self) -> Result<Client, StoreError> {
        let mut cached = self.client.lock().await;
        if let Some(c) = cached.as_ref() {
            return Ok(c.clone());
        }
        let options = self.options()?;
        let connect = Client::connect(self.endpoints(), Some(options));
        let client = tokio::time::timeout(self.timeout, connect)
            .await
            .map_err(|_| self.no_answer("connect"))?
            .map_err(|e| self.classify("connect", &e))?;
        *cached = Some(client.clone());
        Ok(client)
    }

    /// Runs one call with the time limit; a refused user drops the client, so that the next
    /// call authenticates afresh.
    async fn call<T, F>(&self, name: &str, f: impl FnOnce(Client) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let client = self.client().await?;
        let result = match tokio::time::timeout(self.timeout, f(client)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.classify(name, &e)),
            Err(_) => Err(self.no_answer(name)),
        };
        if matches!(result, Err(StoreError::Auth(_))) {
            *self.client.lock().await = None;
        }
        result
    }

    fn no_answer(&self, call: &str) -> StoreError {
        StoreError::Unreachable(format!(
            "{call}: no answer from {} within {} ms",
            self.endpoints().join(", "),
            self.timeout.as_millis()
        ))
    }

    /// Sorts an error into what an operator has to fix, naming the setting.
    fn classify(&self, call: &str, e: &etcd_client::Error) -> StoreError {
        let text = describe(e);
        let lower = text.to_ascii_lowercase();
        let endpoints = self.endpoints().join(", ");
        let tls = self.config.tls.as_ref();
        if lower.contains("invalid peer certificate")
            || lower.contains("unknownissuer")
            || lower.contains("certificate verify failed")
            || lower.contains("notvalidforname")
        {
            let ca = tls.map_or("(none)".into(), |t| t.ca.display().to_string());
            return StoreError::Tls(format!(
                "{call} to {endpoints}: etcd's certificate is not trusted with fleet.ca {ca} \
                 (or does not name the endpoint; see fleet.server_name): {text}"
            ));
        }
        if lower.contains("certificaterequired")
            || lower.contains("certificate required")
            || lower.contains("bad certificate")
            || lower.contains("badcertificate")
            || lower.contains("unknown ca")
            || lower.contains("unknownca")
            || lower.contains("handshakefailure")
            || lower.contains("tls handshake eof")
        {
            let has_cert = tls.is_some_and(|t| t.identity.is_some());
            let hint = if has_cert {
                "etcd refused this balancer's certificate (fleet.cert / fleet.key): is it signed by the CA etcd trusts (--trusted-ca-file)?"
            } else {
                "etcd wants a client certificate (--client-cert-auth): set fleet.cert and fleet.key"
            };
            return StoreError::Tls(format!("{call} to {endpoints}: {hint}: {text}"));
        }
        if lower.contains("authentication failed")
            || lower.contains("invalid auth token")
            || lower.contains("permission denied")
            || lower.contains("user name is empty")
            || lower.contains("unauthenticated")
        {
            let user = self
                .config
                .auth
                .as_ref()
                .map_or("(none: fleet.username not set)".into(), |a| {
                    format!("{:?} (fleet.username, fleet.password_file)", a.username)
                });
            return StoreError::Auth(format!("{call} as user {user}: {text}"));
        }
        if let etcd_client::Error::GRpcStatus(status) = e
            && !matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
            )
        {
            return StoreError::Refused {
                call: call.to_string(),
                message: text,
            };
        }
        StoreError::Unreachable(format!("{call} to {endpoints}: {text}"))
    }
}

/// An error with its sources (the useful part of a TLS failure is often the innermost).
fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => with_sources(
            format!("{:?}: {}", s.code(), s.message()),
            std::error::Error::source(s),
        ),
        etcd_client::Error::TransportError(t) => error_chain(t),
        other => other.to_string(),
    }
}

fn key_value(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    }
}

impl FleetStore for EtcdStore {
    async fn get(&self, key: &[u8]) -> Result<Read, StoreError> {
        let key = key.to_vec();
        let answer = self
            .call("range", |mut c| async move {
                c.get(key, None::<GetOptions>).await
            })
            .await?;
        Ok(Read {
            kv: answer.kvs().first().map(key_value),
            revision: answer.header().map_or(0, |h| h.revision()),
        })
    }

    async fn grant(&self, ttl_secs: u64) -> Result<i64, StoreError> {
        let answer = self
            .call("lease grant", |mut c| async move {
                c.lease_grant(ttl_secs as i64, None).await
            })
            .await?;
        Ok(answer.id())
    }

    async fn keep_alive(&self, lease: i64) -> Result<i64, StoreError> {
        self.call("lease keep-alive", |mut c| async move {
            let (mut keeper, mut answers) = c.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            Ok(answers.message().await?.map_or(0, |a| a.ttl()))
        })
        .await
    }

    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        self.call("lease revoke", |mut c| async move {
            c.lease_revoke(lease).await
        })
        .await
        .map(|_| ())
    }

    async fn create(&self, key: &[u8], value: &[u8], lease: i64) -> Result<bool, StoreError> {
        let (key, value) = (key.to_vec(), value.to_vec());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        self.call("txn", |mut c| async move { c.txn(txn).await })
            .await
            .map(|a| a.succeeded())
    }

    async fn put_if(&self, held: &Held<'_>, key: &[u8], value: &[u8]) -> Result<bool, StoreError> {
        let txn = Txn::new()
            .when([
                Compare::value(held.key.to_vec(), CompareOp::Equal, held.value.to_vec()),
                Compare::lease(held.key.to_vec(), CompareOp::Equal, held.lease),
            ])
            .and_then([TxnOp::put(key.to_vec(), value.to_vec(), None)]);
        self.call("txn", |mut c| async move { c.txn(txn).await })
            .await
            .map(|a| a.succeeded())
    }

    async fn watch(&self, prefix: &[u8], from_revision: i64) -> Result<Watch, StoreError> {
        let prefix = prefix.to_vec();
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from_revision)
            .with_progress_notify();
        let mut stream = self
            .call("watch", |mut c| async move {
                c.watch(prefix, Some(options)).await
            })
            .await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let endpoints = self.endpoints().join(", ");
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    m = stream.message() => m,
                    // The agent dropped its end: stop (dropping the stream cancels the watch).
                    _ = tx.closed() => return,
                };
                let batch = match message {
                    Ok(Some(answer)) if answer.compact_revision() > 0 => {
                        Err(StoreError::Compacted(answer.compact_revision()))
                    }
                    Ok(Some(answer)) if answer.canceled() => Err(StoreError::Refused {
                        call: "watch".into(),
                        message: format!("watch canceled: {}", answer.cancel_reason()),
                    }),
                    Ok(Some(answer)) => Ok(WatchBatch {
                        changes: (answer.events().iter())
                            .filter_map(|event| {
                                let kv = event.kv()?;
                                Some(Change {
                                    key: kv.key().to_vec(),
                                    value: (event.event_type() == EventType::Put)
                                        .then(|| kv.value().to_vec()),
                                    mod_revision: kv.mod_revision(),
                                })
                            })
                            .collect(),
                        revision: answer.header().map_or(0, |h| h.revision()),
                    }),
                    Ok(None) => Err(StoreError::Unreachable(format!(
                        "watch on {endpoints}: the stream ended"
                    ))),
                    Err(e) => Err(StoreError::Unreachable(format!(
                        "watch on {endpoints}: {}",
                        describe(&e)
                    ))),
                };
                let last = batch.is_err();
                if tx.send(batch).is_err() || last {
                    return;
                }
            }
        });
        Ok(Watch::new(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn config(port: u16) -> FleetConfig {
        FleetConfig {
            etcd: vec![SocketAddr::from(([127, 0, 0, 1], port))],
            prefix: "/balancer".into(),
            instance: "lb1".into(),
            lease: Duration::from_secs(3),
            poll: Duration::from_millis(200),
            tls: None,
            auth: None,
        }
    }

    #[tokio::test]
    async fn an_unreachable_cluster_is_an_error_naming_each_endpoint() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let etcd = EtcdStore::new(&config(port), Duration::from_millis(500));
        let err = etcd.get(b"/k").await.unwrap_err();
        assert!(matches!(err, StoreError::Unreachable(_)), "{err}");
        assert!(
            err.to_string().contains(&format!("127.0.0.1:{port}")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn unreadable_tls_files_are_named() {
        let mut c = config(2379);
        c.tls = Some(crate::base::config::EtcdTls {
            ca: "/nonexistent/ca.pem".into(),
            identity: None,
            server_name: None,
        });
        let err = EtcdStore::new(&c, Duration::from_millis(500))
            .get(b"/k")
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Settings(_)), "{err}");
        assert!(
            err.to_string().contains("fleet.ca /nonexistent/ca.pem"),
            "{err}"
        );
    }
}
