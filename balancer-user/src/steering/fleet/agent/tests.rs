//! The agent against the in-memory store: elections, publication on a local change, epochs
//! from the watch (none missed across a broken watch), hand-over when the leader leaves, and
//! fencing of a deposed leader. The tick is 10 s (except where a watch must be reopened), so
//! everything seen within a second came from a watch or a local change, not from polling.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;
use crate::steering::fleet::memory_store::MemoryStore;
use crate::steering::fleet::store::{Read, Watch};

struct FakeDaemon {
    config: FleetConfig,
    weight: Mutex<u32>,
    adopted: Mutex<Vec<u64>>,
    status: Mutex<FleetStatus>,
    changes: watch::Sender<u64>,
}

impl FakeDaemon {
    fn new(instance: &str) -> Arc<FakeDaemon> {
        FakeDaemon::with_tick(instance, Duration::from_secs(10))
    }

    fn with_tick(instance: &str, poll: Duration) -> Arc<FakeDaemon> {
        Arc::new(FakeDaemon {
            config: FleetConfig {
                etcd: Vec::new(),
                prefix: "/balancer/t".into(),
                instance: instance.into(),
                lease: Duration::from_secs(3),
                poll,
                tls: None,
                auth: None,
            },
            weight: Mutex::new(100),
            adopted: Mutex::new(Vec::new()),
            status: Mutex::new(FleetStatus::default()),
            changes: watch::Sender::new(0),
        })
    }

    fn set_weight(&self, w: u32) {
        *self.weight.lock().unwrap() = w;
        self.changes.send_modify(|n| *n += 1);
    }

    fn adopted(&self) -> Vec<u64> {
        self.adopted.lock().unwrap().clone()
    }

    fn status(&self) -> FleetStatus {
        self.status.lock().unwrap().clone()
    }
}

impl FleetPort for FakeDaemon {
    fn fleet_config(&self) -> Option<FleetConfig> {
        Some(self.config.clone())
    }

    fn use_local_weights(&self) -> bool {
        true
    }

    fn adopt(&self, state: &FleetState) -> Option<Option<Instant>> {
        self.adopted.lock().unwrap().push(state.epoch);
        Some(Some(Instant::now()))
    }

    fn local_view(&self) -> Option<(FleetWeights, Vec<RawVip>)> {
        let w = *self.weight.lock().unwrap();
        let weights = BTreeMap::from([(
            "web".to_string(),
            BTreeMap::from([("10.0.0.1".parse().unwrap(), w)]),
        )]);
        Some((weights, Vec::new()))
    }

    fn local_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn set_status(&self, status: FleetStatus) {
        *self.status.lock().unwrap() = status;
    }
}

/// A store whose watches can be held back (as while etcd is unreachable for one follower).
struct Gated {
    inner: Arc<MemoryStore>,
    open: watch::Receiver<bool>,
}

impl FleetStore for Gated {
    async fn get(&self, key: &[u8]) -> Result<Read, StoreError> {
        self.inner.get(key).await
    }
    async fn grant(&self, ttl_secs: u64) -> Result<i64, StoreError> {
        self.inner.grant(ttl_secs).await
    }
    async fn keep_alive(&self, lease: i64) -> Result<i64, StoreError> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        self.inner.revoke(lease).await
    }
    async fn create(&self, key: &[u8], value: &[u8], lease: i64) -> Result<bool, StoreError> {
        self.inner.create(key, value, lease).await
    }
    async fn put_if(&self, held: &Held<'_>, key: &[u8], value: &[u8]) -> Result<bool, StoreError> {
        self.inner.put_if(held, key, value).await
    }
    async fn watch(&self, prefix: &[u8], from_revision: i64) -> Result<Watch, StoreError> {
        if !*self.open.borrow() {
            return Err(StoreError::Unreachable("gated".into()));
        }
        self.inner.watch(prefix, from_revision).await
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !f() {
        assert!(Instant::now() < deadline, "not within 2 s: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn published_epoch(store: &MemoryStore) -> u64 {
    let read = store.get(b"/balancer/t/state").await.unwrap();
    read.kv
        .map(|kv| {
            serde_json::from_slice::<FleetState>(&kv.value)
                .unwrap()
                .epoch
        })
        .unwrap_or(0)
}

async fn leader_lease(store: &MemoryStore) -> i64 {
    store
        .get(b"/balancer/t/leader")
        .await
        .unwrap()
        .kv
        .unwrap()
        .lease
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_reach_the_follower_by_watch_and_none_is_missed_across_a_broken_watch() {
    let store = Arc::new(MemoryStore::new());
    // lb2 retries a watch it could not open at its next tick, 100 ms later; while it has
    // one, it reads nothing by polling.
    let (a, b) = (
        FakeDaemon::new("lb1"),
        FakeDaemon::with_tick("lb2", Duration::from_millis(100)),
    );
    let agent_a = FleetAgent::start(&a, |_| store.clone()).unwrap();
    until("lb1 leads", || a.status().role == FleetRole::Leader).await;
    assert_eq!(published_epoch(&store).await, 1);
    let (gate, open) = watch::channel(true);
    let gated = Gated {
        inner: store.clone(),
        open,
    };
    let agent_b = FleetAgent::start(&b, |_| gated).unwrap();
    until("lb2 took epoch 1", || b.adopted() == [1]).await;
    until("lb2 watches", || store.watches() == 1).await;

    // A change on the leader is published at once and applied from the watch.
    let started = Instant::now();
    a.set_weight(300);
    until("lb2 took epoch 2", || b.adopted() == [1, 2]).await;
    assert!(started.elapsed() < Duration::from_secs(1));

    // The follower's watch breaks and cannot be opened again for a while; three epochs are
    // published meanwhile.
    gate.send_replace(false);
    store.break_watches();
    for (i, w) in [(3, 310), (4, 320), (5, 330)] {
        a.set_weight(w);
        let deadline = Instant::now() + Duration::from_secs(2);
        while published_epoch(&store).await != i {
            assert!(Instant::now() < deadline, "epoch {i} not published");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(b.adopted(), [1, 2], "applied without a watch?");
    assert!(
        matches!(&b.status().etcd, EtcdHealth::Failing(e) if e.contains("watch")),
        "{:?}",
        b.status()
    );
    // Reopened from the revision after the last one seen: every epoch, in order.
    gate.send_replace(true);
    until("lb2 took epochs 3-5", || b.adopted() == [1, 2, 3, 4, 5]).await;
    until("lb2 reports ok", || b.status().etcd.is_ok()).await;

    // The leader leaves: it gives its lease back, the follower sees the key go and takes
    // over, continuing the epochs.
    agent_a.stop().await;
    until("lb2 leads", || b.status().role == FleetRole::Leader).await;
    assert_eq!(published_epoch(&store).await, 6);
    agent_b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_publish_and_steps_down() {
    let store = Arc::new(MemoryStore::new());
    let (a, b) = (FakeDaemon::new("lb1"), FakeDaemon::new("lb2"));
    let agent_a = FleetAgent::start(&a, |_| store.clone()).unwrap();
    until("lb1 leads", || a.status().role == FleetRole::Leader).await;
    let agent_b = FleetAgent::start(&b, |_| store.clone()).unwrap();
    until("lb2 follows", || b.status().role == FleetRole::Follower).await;
    until("lb2 watches", || store.watches() == 1).await;
    // lb1's lease ends (as when it was cut off longer than the lease): lb2 is elected from
    // its watch and publishes epoch 2.
    store.expire(leader_lease(&store).await);
    until("lb2 leads", || b.status().role == FleetRole::Leader).await;
    assert_eq!(published_epoch(&store).await, 2);
    // lb1 still believes it leads until its next write, which the fence refuses.
    a.set_weight(7);
    until("lb1 stepped down", || {
        a.status().role == FleetRole::Follower
    })
    .await;
    assert_eq!(
        published_epoch(&store).await,
        2,
        "a deposed leader published"
    );
    // And it now follows lb2's epochs.
    b.set_weight(50);
    until("lb1 took epoch 3", || a.adopted().ends_with(&[3])).await;
    agent_a.stop().await;
    agent_b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_store_the_status_names_it_and_nothing_is_applied() {
    let store = Arc::new(MemoryStore::new());
    store.set_down(true);
    let a = FakeDaemon::new("lb1");
    let agent = FleetAgent::start(&a, |_| store.clone()).unwrap();
    until(
        "an error in status",
        || matches!(&a.status().etcd, EtcdHealth::Failing(e) if e.contains("unreachable")),
    )
    .await;
    assert_ne!(a.status().role, FleetRole::Leader);
    assert!(a.adopted().is_empty());
    agent.stop().await;
}

/// What a writer of the store who is not the leader could write: a state.
async fn write_state(store: &MemoryStore, state: &FleetState) {
    let lease = store.grant(30).await.unwrap();
    let key = b"/balancer/t/rogue";
    assert!(store.create(key, b"x", lease).await.unwrap());
    let held = Held {
        key,
        value: b"x",
        lease,
    };
    let value = serde_json::to_vec(state).unwrap();
    assert!(
        store
            .put_if(&held, b"/balancer/t/state", &value)
            .await
            .unwrap()
    );
    store.revoke(lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_take_only_later_epochs_from_the_leader() {
    let store = Arc::new(MemoryStore::new());
    let (a, b) = (FakeDaemon::new("lb1"), FakeDaemon::new("lb2"));
    let agent_a = FleetAgent::start(&a, |_| store.clone()).unwrap();
    until("lb1 leads", || a.status().role == FleetRole::Leader).await;
    let agent_b = FleetAgent::start(&b, |_| store.clone()).unwrap();
    until("lb2 took epoch 1", || b.adopted() == [1]).await;
    until("lb2 watches", || store.watches() == 1).await;
    a.set_weight(200);
    until("lb2 took epoch 2", || b.adopted() == [1, 2]).await;
    let state = |epoch: u64, leader: &str| FleetState {
        epoch,
        leader: leader.into(),
        vips: BTreeMap::new(),
        vip_config: Vec::new(),
    };
    // A replay of an earlier epoch, then a later one in another instance's name.
    write_state(&store, &state(1, "lb1")).await;
    write_state(&store, &state(1000, "mallory")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        b.adopted(),
        [1, 2],
        "a state not from the leader was applied"
    );
    // The leader's next epoch still is.
    a.set_weight(300);
    until("lb2 took epoch 3", || b.adopted() == [1, 2, 3]).await;
    agent_b.stop().await;
    agent_a.stop().await;
}
