//! A [`FleetStore`] in memory with etcd's rules: one revision counter over every write,
//! leases whose keys go with them, compare-and-put transactions and watches that replay
//! history from a revision. Leases do not expire by time; [`MemoryStore::expire`] ends one
//! as etcd would. [`MemoryStore::break_watches`] cuts every live watch, as a lost etcd
//! connection does. For tests and single-host trials.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::store::{Change, FleetStore, Held, KeyValue, Read, StoreError, Watch, WatchBatch};

type BatchSender = mpsc::UnboundedSender<Result<WatchBatch, StoreError>>;

#[derive(Default)]
struct Inner {
    revision: i64,
    keys: BTreeMap<Vec<u8>, KeyValue>,
    leases: HashMap<i64, u64>,
    next_lease: i64,
    /// Every change ever made, in order (never compacted).
    history: Vec<Change>,
    /// Live watches: (key prefix, where their batches go).
    watchers: Vec<(Vec<u8>, BatchSender)>,
    /// While set, every call fails as if etcd were gone.
    down: bool,
}

#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Ends every live watch (their streams close), as a broken connection does.
    pub fn break_watches(&self) {
        self.lock().watchers.clear();
    }

    /// Makes every call fail (`true`) or answer again (`false`).
    pub fn set_down(&self, down: bool) {
        let mut inner = self.lock();
        inner.down = down;
        if down {
            inner.watchers.clear();
        }
    }

    /// Ends a lease as its TTL running out would: its keys are deleted.
    pub fn expire(&self, lease: i64) {
        let mut inner = self.lock();
        end_lease(&mut inner, lease);
    }

    /// The number of live watches.
    pub fn watches(&self) -> usize {
        let mut inner = self.lock();
        inner.watchers.retain(|(_, tx)| !tx.is_closed());
        inner.watchers.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn up(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        let inner = self.lock();
        if inner.down {
            return Err(StoreError::Unreachable("memory store: down".into()));
        }
        Ok(inner)
    }
}

fn record(inner: &mut Inner, change: Change) {
    inner.history.push(change.clone());
    let revision = inner.revision;
    inner.watchers.retain(|(prefix, tx)| {
        if !change.key.starts_with(prefix) {
            return !tx.is_closed();
        }
        tx.send(Ok(WatchBatch {
            changes: vec![change.clone()],
            revision,
        }))
        .is_ok()
    });
}

fn write(inner: &mut Inner, key: &[u8], value: &[u8], lease: i64) {
    inner.revision += 1;
    let revision = inner.revision;
    let create_revision = inner
        .keys
        .get(key)
        .map_or(revision, |kv| kv.create_revision);
    inner.keys.insert(
        key.to_vec(),
        KeyValue {
            key: key.to_vec(),
            value: value.to_vec(),
            create_revision,
            mod_revision: revision,
            lease,
        },
    );
    record(
        inner,
        Change {
            key: key.to_vec(),
            value: Some(value.to_vec()),
            mod_revision: revision,
        },
    );
}

fn end_lease(inner: &mut Inner, lease: i64) {
    inner.leases.remove(&lease);
    let gone: Vec<Vec<u8>> = (inner.keys.values())
        .filter(|kv| kv.lease == lease)
        .map(|kv| kv.key.clone())
        .collect();
    for key in gone {
        inner.keys.remove(&key);
        inner.revision += 1;
        let mod_revision = inner.revision;
        record(
            inner,
            Change {
                key,
                value: None,
                mod_revision,
            },
        );
    }
}

impl FleetStore for MemoryStore {
    async fn get(&self, key: &[u8]) -> Result<Read, StoreError> {
        let inner = self.up()?;
        Ok(Read {
            kv: inner.keys.get(key).cloned(),
            revision: inner.revision,
        })
    }

    async fn grant(&self, ttl_secs: u64) -> Result<i64, StoreError> {
        let mut inner = self.up()?;
        inner.next_lease += 1;
        let id = inner.next_lease;
        inner.leases.insert(id, ttl_secs);
        Ok(id)
    }

    async fn keep_alive(&self, lease: i64) -> Result<i64, StoreError> {
        let inner = self.up()?;
        Ok(inner.leases.get(&lease).map_or(0, |ttl| *ttl as i64))
    }

    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        let mut inner = self.up()?;
        end_lease(&mut inner, lease);
        Ok(())
    }

    async fn create(&self, key: &[u8], value: &[u8], lease: i64) -> Result<bool, StoreError> {
        let mut inner = self.up()?;
        if inner.keys.contains_key(key) {
            return Ok(false);
        }
        if lease != 0 && !inner.leases.contains_key(&lease) {
            return Err(StoreError::Refused {
                call: "txn".into(),
                message: "requested lease not found".into(),
            });
        }
        write(&mut inner, key, value, lease);
        Ok(true)
    }

    async fn put_if(&self, held: &Held<'_>, key: &[u8], value: &[u8]) -> Result<bool, StoreError> {
        let mut inner = self.up()?;
        let holds = inner
            .keys
            .get(held.key)
            .is_some_and(|kv| kv.value == held.value && kv.lease == held.lease);
        if holds {
            write(&mut inner, key, value, 0);
        }
        Ok(holds)
    }

    async fn watch(&self, prefix: &[u8], from_revision: i64) -> Result<Watch, StoreError> {
        let mut inner = self.up()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let revision = inner.revision;
        let past: Vec<Change> = (inner.history.iter())
            .filter(|c| c.mod_revision >= from_revision && c.key.starts_with(prefix))
            .cloned()
            .collect();
        if !past.is_empty() {
            let _ = tx.send(Ok(WatchBatch {
                changes: past,
                revision,
            }));
        }
        inner.watchers.push((prefix.to_vec(), tx));
        Ok(Watch::new(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn leases_fence_writes_and_watches_replay_from_a_revision() {
        let store = MemoryStore::new();
        let lease = store.grant(3).await.unwrap();
        assert!(store.create(b"/f/leader", b"lb1", lease).await.unwrap());
        assert!(!store.create(b"/f/leader", b"lb2", lease).await.unwrap());
        let held = Held {
            key: b"/f/leader",
            value: b"lb1",
            lease,
        };
        assert!(store.put_if(&held, b"/f/state", b"1").await.unwrap());
        let read = store.get(b"/f/state").await.unwrap();
        assert_eq!(read.kv.as_ref().unwrap().value, b"1");
        // A watch from the state's revision sees that put, then later ones.
        let mut watch = store
            .watch(b"/f/", read.kv.unwrap().mod_revision)
            .await
            .unwrap();
        assert!(store.put_if(&held, b"/f/state", b"2").await.unwrap());
        store.revoke(lease).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            for c in watch.next().await.unwrap().unwrap().changes {
                seen.push((c.key, c.value));
            }
        }
        assert_eq!(
            seen,
            vec![
                (b"/f/state".to_vec(), Some(b"1".to_vec())),
                (b"/f/state".to_vec(), Some(b"2".to_vec())),
                (b"/f/leader".to_vec(), None),
            ]
        );
        // The lease is gone: its holder's fenced writes fail.
        assert!(!store.put_if(&held, b"/f/state", b"3").await.unwrap());
        assert_eq!(store.keep_alive(lease).await.unwrap(), 0);
        store.break_watches();
        assert!(watch.next().await.is_none());
        store.set_down(true);
        assert!(matches!(
            store.get(b"/f/state").await,
            Err(StoreError::Unreachable(_))
        ));
    }
}
