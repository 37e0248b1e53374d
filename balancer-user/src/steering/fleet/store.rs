//! The fleet's shared store as the agent reaches it: keys with revisions, leases, fenced
//! writes and a watch that can resume from a revision. [`super::etcd::EtcdStore`] is etcd
//! (gRPC); [`super::memory_store::MemoryStore`] keeps the same rules in memory, so the agent's
//! elections, fencing and watch recovery are tested in a plain `cargo test`.

use std::future::Future;

use tokio::sync::mpsc;

/// Why a store call failed. The message names what failed (an endpoint, a file, the CA, the
/// user), since an operator reads it in `status`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No endpoint answered in time (down, partitioned, refused).
    #[error("etcd unreachable: {0}")]
    Unreachable(String),
    /// The TLS handshake failed: a certificate etcd or this balancer presented was refused.
    #[error("TLS with etcd failed: {0}")]
    Tls(String),
    /// etcd refused the user, the password or the permission.
    #[error("etcd authentication failed: {0}")]
    Auth(String),
    /// A file of the `[fleet]` TLS or auth settings could not be read or used.
    #[error("etcd client settings: {0}")]
    Settings(String),
    /// The watch's start revision was compacted away: read the state afresh.
    #[error("the watch's revision was compacted (oldest kept: {0})")]
    Compacted(i64),
    /// Any other refusal.
    #[error("etcd refused {call}: {message}")]
    Refused { call: String, message: String },
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

/// A read: the key (if it exists) and the store's revision when it was read (a watch from
/// `revision + 1` misses nothing after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub kv: Option<KeyValue>,
    pub revision: i64,
}

/// A guard on a transaction: the key's value and lease must be these.
pub struct Held<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub lease: i64,
}

/// One change a watch saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: Vec<u8>,
    /// None: the key was deleted (or its lease ended).
    pub value: Option<Vec<u8>>,
    pub mod_revision: i64,
}

/// What a watch delivers at once: changes in revision order, and the store's revision then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchBatch {
    pub changes: Vec<Change>,
    pub revision: i64,
}

/// A live watch on a key prefix. It ends (`None`) or yields an error when the stream broke;
/// the caller opens a new one from the revision after the last it saw.
pub struct Watch {
    batches: mpsc::UnboundedReceiver<Result<WatchBatch, StoreError>>,
}

impl Watch {
    pub fn new(batches: mpsc::UnboundedReceiver<Result<WatchBatch, StoreError>>) -> Watch {
        Watch { batches }
    }

    pub async fn next(&mut self) -> Option<Result<WatchBatch, StoreError>> {
        self.batches.recv().await
    }
}

/// The operations a fleet needs of its store.
pub trait FleetStore: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Read, StoreError>> + Send;

    /// A lease of `ttl_secs` seconds; its id.
    fn grant(&self, ttl_secs: u64) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Renews a lease; its remaining TTL (0 when it has expired or is unknown).
    fn keep_alive(&self, lease: i64) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Ends a lease at once (its keys go with it).
    fn revoke(&self, lease: i64) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Creates `key` = `value` under `lease` if the key does not exist. Whether it did.
    fn create(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Puts `key` = `value` only while `held` holds (a fenced write: a deposed leader's
    /// writes fail). Whether it was written.
    fn put_if(
        &self,
        held: &Held<'_>,
        key: &[u8],
        value: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Watches every key under `prefix` from `from_revision` on (inclusive): changes made
    /// since then are delivered first, in order.
    fn watch(
        &self,
        prefix: &[u8],
        from_revision: i64,
    ) -> impl Future<Output = Result<Watch, StoreError>> + Send;
}

/// One store shared by several agents (tests run a fleet on one memory store).
impl<S: FleetStore> FleetStore for std::sync::Arc<S> {
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Read, StoreError>> + Send {
        (**self).get(key)
    }

    fn grant(&self, ttl_secs: u64) -> impl Future<Output = Result<i64, StoreError>> + Send {
        (**self).grant(ttl_secs)
    }

    fn keep_alive(&self, lease: i64) -> impl Future<Output = Result<i64, StoreError>> + Send {
        (**self).keep_alive(lease)
    }

    fn revoke(&self, lease: i64) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).revoke(lease)
    }

    fn create(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).create(key, value, lease)
    }

    fn put_if(
        &self,
        held: &Held<'_>,
        key: &[u8],
        value: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).put_if(held, key, value)
    }

    fn watch(
        &self,
        prefix: &[u8],
        from_revision: i64,
    ) -> impl Future<Output = Result<Watch, StoreError>> + Send {
        (**self).watch(prefix, from_revision)
    }
}
