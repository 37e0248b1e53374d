//! The fleet agent: one task per daemon with a `[fleet]`. It campaigns for leadership with a
//! lease on the store; the leader publishes its weights as soon as they change (fenced on its
//! lease), and every other instance applies each new epoch as its watch delivers it. A broken
//! watch is opened again from the revision after the last one it delivered, so no epoch
//! published meanwhile is missed. A leader that cannot renew its lease in time steps down
//! before the store expires it, and a leader whose fenced write fails knows it was replaced:
//! at no time do two instances publish.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::store::{FleetStore, Held, StoreError, Watch, WatchBatch};
use super::{EtcdHealth, FleetRole, FleetState, FleetStatus, FleetWeights, same_vips};
use crate::base::config::{FleetConfig, RawVip};

/// Longest a store call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(1000);

enum Role {
    Follower,
    Leader {
        lease: i64,
        /// Last successful renewal.
        renewed: Instant,
        /// What was published last (None: nothing yet in this term).
        published: Option<(FleetWeights, Vec<RawVip>)>,
        epoch: u64,
    },
}

/// The daemon as the fleet agent reaches it. (Implemented by the daemon; the agent knows
/// nothing else of it.) The changes are blocking: they rebuild tables.
pub trait FleetPort: Send + Sync + 'static {
    /// The `[fleet]` of the config in force.
    fn fleet_config(&self) -> Option<FleetConfig>;
    /// Back to this balancer's own weights (it became the leader); whether anything changed.
    fn use_local_weights(&self) -> bool;
    /// Applies a state the leader published: None when it failed, else when its first
    /// changed table went live (None: no table changed).
    fn adopt(&self, state: &FleetState) -> Option<Option<Instant>>;
    /// What this balancer would publish as the leader: its weights and VIP config.
    fn local_view(&self) -> Option<(FleetWeights, Vec<RawVip>)>;
    /// Changes whenever this balancer's own view may have changed (a leader publishes then).
    fn local_changes(&self) -> watch::Receiver<u64>;
    /// The agent's view, for status and metrics.
    fn set_status(&self, status: FleetStatus);
}

pub struct FleetAgent {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl FleetAgent {
    /// Starts the agent on `store` when the daemon's config has a `[fleet]`.
    pub fn start<P: FleetPort, S: FleetStore>(
        daemon: &Arc<P>,
        store: impl FnOnce(&FleetConfig) -> S,
    ) -> Option<FleetAgent> {
        let config = daemon.fleet_config()?;
        let (stop, stop_rx) = watch::channel(false);
        let agent = Agent::new(daemon.clone(), store(&config), config);
        let task = tokio::spawn(agent.run(stop_rx));
        Some(FleetAgent { task, stop })
    }

    /// Stops campaigning; a leader gives its lease back so that another takes over at once.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(3), self.task).await;
    }
}

struct Agent<P, S> {
    daemon: Arc<P>,
    store: S,
    config: FleetConfig,
    me: String,
    leader_key: String,
    state_key: String,
    role: Role,
    /// The follower's watch on the fleet's keys, and the revision it resumes from (0: read
    /// the state afresh first).
    watch: Option<Watch>,
    next_revision: i64,
    applied_epoch: Option<u64>,
    applied_at: Option<Instant>,
    status: FleetStatus,
}

impl<P: FleetPort, S: FleetStore> Agent<P, S> {
    fn new(daemon: Arc<P>, store: S, config: FleetConfig) -> Agent<P, S> {
        let me = config.instance.clone();
        Agent {
            daemon,
            store,
            leader_key: config.leader_key(),
            state_key: config.state_key(),
            status: FleetStatus {
                instance: me.clone(),
                role: FleetRole::Starting,
                ..FleetStatus::default()
            },
            me,
            config,
            role: Role::Follower,
            watch: None,
            next_revision: 0,
            applied_epoch: None,
            applied_at: None,
        }
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut local = self.daemon.local_changes();
        let mut ticker = tokio::time::interval(self.config.poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let leading = matches!(self.role, Role::Leader { .. });
            let outcome = tokio::select! {
                _ = stop.changed() => break,
                _ = ticker.tick() => self.step().await,
                batch = next_batch(&mut self.watch) => self.on_watch(batch).await,
                changed = local.changed(), if leading => {
                    if changed.is_err() {
                        // The daemon is going away.
                        break;
                    }
                    local.borrow_and_update();
                    self.publish().await
                }
            };
            self.status.etcd = match outcome {
                Ok(()) => EtcdHealth::Ok,
                Err(e) => {
                    tracing::debug!("fleet: {e}");
                    EtcdHealth::Failing(e.to_string())
                }
            };
            self.status.epoch = self.applied_epoch.unwrap_or(0);
            self.status.applied_secs_ago = self.applied_at.map(|t| t.elapsed().as_secs_f64());
            let s = self.status.clone();
            blocking(&self.daemon, move |d| d.set_status(s)).await;
        }
        if let Role::Leader { lease, .. } = self.role {
            match self.store.revoke(lease).await {
                Ok(()) => tracing::info!("fleet: leadership given back"),
                Err(e) => {
                    tracing::warn!(
                        "fleet: could not give the lease back ({e}); it expires by itself"
                    )
                }
            }
        }
    }

    /// The periodic work: a follower checks the leader (campaigning when there is none) and
    /// keeps its watch open; a leader renews its lease and publishes what changed.
    async fn step(&mut self) -> Result<(), StoreError> {
        match self.role {
            Role::Follower => {
                let leader = self.store.get(self.leader_key.as_bytes()).await?.kv;
                self.status.leader =
                    (leader.as_ref()).map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
                if leader.is_none() {
                    self.campaign().await?;
                }
                if matches!(self.role, Role::Follower) {
                    self.status.role = FleetRole::Follower;
                    self.follow().await?;
                }
                Ok(())
            }
            Role::Leader { .. } => {
                self.renew().await?;
                match self.role {
                    Role::Leader { .. } => self.publish().await,
                    Role::Follower => self.follow().await,
                }
            }
        }
    }

    async fn campaign(&mut self) -> Result<(), StoreError> {
        let lease = self.store.grant(self.config.lease.as_secs()).await?;
        if self
            .store
            .create(self.leader_key.as_bytes(), self.me.as_bytes(), lease)
            .await?
        {
            tracing::info!(instance = %self.me, lease, "fleet: elected leader");
            // Our own view rules now; it is published at once.
            blocking(&self.daemon, |d| d.use_local_weights()).await;
            self.role = Role::Leader {
                lease,
                renewed: Instant::now(),
                published: None,
                epoch: 0,
            };
            self.watch = None;
            self.next_revision = 0;
            self.status.leader = Some(self.me.clone());
            self.status.role = FleetRole::Leader;
            self.publish().await
        } else {
            let _ = self.store.revoke(lease).await;
            Ok(())
        }
    }

    /// A follower without a live watch reads the state (when it has no revision to resume
    /// from) and opens one.
    async fn follow(&mut self) -> Result<(), StoreError> {
        if self.watch.is_some() {
            return Ok(());
        }
        if self.next_revision == 0 {
            let read = self.store.get(self.state_key.as_bytes()).await?;
            if let Some(kv) = read.kv {
                self.apply(&kv.value).await;
            }
            self.next_revision = read.revision + 1;
        }
        let prefix = format!("{}/", self.config.prefix);
        self.watch = Some(
            self.store
                .watch(prefix.as_bytes(), self.next_revision)
                .await?,
        );
        Ok(())
    }

    async fn on_watch(
        &mut self,
        batch: Option<Result<WatchBatch, StoreError>>,
    ) -> Result<(), StoreError> {
        let batch = match batch {
            Some(Ok(batch)) => batch,
            Some(Err(StoreError::Compacted(oldest))) => {
                tracing::warn!(
                    oldest,
                    "fleet: the watch fell behind compaction; reading the state afresh"
                );
                self.watch = None;
                self.next_revision = 0;
                return self.follow().await;
            }
            broken => {
                self.watch = None;
                let e = match broken {
                    Some(Err(e)) => e,
                    _ => StoreError::Unreachable("the watch stream closed".into()),
                };
                tracing::warn!(
                    resume = self.next_revision,
                    "fleet: watch broken ({e}); opening it again"
                );
                // At once when etcd is there; otherwise the error shows until the next tick.
                return self.follow().await.map_err(|_| e);
            }
        };
        let mut leader_gone = false;
        for change in &batch.changes {
            self.next_revision = self.next_revision.max(change.mod_revision + 1);
            if change.key == self.state_key.as_bytes() {
                if let Some(value) = &change.value {
                    self.apply(value).await;
                }
            } else if change.key == self.leader_key.as_bytes() {
                match &change.value {
                    Some(leader) => {
                        self.status.leader = Some(String::from_utf8_lossy(leader).into_owned())
                    }
                    None => leader_gone = true,
                }
            }
        }
        self.next_revision = self.next_revision.max(batch.revision + 1);
        if leader_gone && matches!(self.role, Role::Follower) {
            // The leader gave its lease back or lost it: campaign now, not at the next tick.
            self.status.leader = None;
            return self.campaign().await;
        }
        Ok(())
    }

    /// Whether `instance` holds the leader key, as the store says when the leader known here
    /// is another (a hand-over this instance has not seen yet).
    async fn is_leader(&mut self, instance: &str) -> bool {
        if self.status.leader.as_deref() == Some(instance) {
            return true;
        }
        if let Ok(read) = self.store.get(self.leader_key.as_bytes()).await {
            self.status.leader = read
                .kv
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        }
        self.status.leader.as_deref() == Some(instance)
    }

    /// Applies a published state of a later epoch than the last applied, from the current
    /// leader; one from another instance, or of an earlier epoch (a replay, a writer of the
    /// store that is not the leader), is refused and logged.
    async fn apply(&mut self, value: &[u8]) {
        match serde_json::from_slice::<FleetState>(value) {
            Ok(state) if self.applied_epoch.is_some_and(|a| state.epoch <= a) => {
                if self.applied_epoch != Some(state.epoch) {
                    tracing::error!(
                        epoch = state.epoch,
                        applied = self.applied_epoch,
                        "fleet: refused a published state of an earlier epoch than the one applied"
                    );
                }
            }
            Ok(state) if !self.is_leader(&state.leader).await => {
                tracing::error!(
                    epoch = state.epoch,
                    from = state.leader,
                    leader = self.status.leader,
                    "fleet: refused a published state from an instance that is not the leader"
                );
            }
            Ok(state) => {
                let epoch = state.epoch;
                let received = Instant::now();
                let applied = blocking(&self.daemon, move |d| d.adopt(&state))
                    .await
                    .flatten();
                if let Some(live) = applied {
                    let ms = |t: Instant| t.saturating_duration_since(received).as_secs_f64() * 1e3;
                    // Tables go live during the apply; the rest of it is the kernel's wait for
                    // readers of the old ones and this balancer's bookkeeping.
                    tracing::info!(
                        epoch,
                        tables_live_ms = live.map(ms).unwrap_or(0.0),
                        applied_ms = ms(Instant::now()),
                        "fleet: applied the published state"
                    );
                    self.applied_epoch = Some(epoch);
                    self.applied_at = Some(Instant::now());
                }
            }
            Err(e) => {
                tracing::error!(
                    "fleet: the published state is not valid ({e}); keeping the last one"
                )
            }
        }
    }

    /// Renews the leader's lease a third of the way into it; steps down before the store
    /// would expire it if renewals fail.
    async fn renew(&mut self) -> Result<(), StoreError> {
        let Role::Leader { lease, renewed, .. } = &mut self.role else {
            return Ok(());
        };
        if renewed.elapsed() < self.config.lease / 3 {
            return Ok(());
        }
        match self.store.keep_alive(*lease).await {
            Ok(ttl) if ttl > 0 => {
                *renewed = Instant::now();
                Ok(())
            }
            Ok(_) => {
                tracing::warn!("fleet: the leader lease expired; stepping down");
                self.step_down();
                Ok(())
            }
            Err(e) => {
                if renewed.elapsed() >= self.config.lease * 2 / 3 {
                    tracing::warn!("fleet: cannot renew the leader lease ({e}); stepping down");
                    self.step_down();
                }
                Err(e)
            }
        }
    }

    fn step_down(&mut self) {
        self.role = Role::Follower;
        self.status.role = FleetRole::Follower;
    }

    /// The leader publishes its view when it differs from what it published last.
    async fn publish(&mut self) -> Result<(), StoreError> {
        if !matches!(self.role, Role::Leader { .. }) {
            return Ok(());
        }
        let view = blocking(&self.daemon, |d| d.local_view()).await.flatten();
        let Some((weights, vips)) = view else {
            return Ok(());
        };
        let Role::Leader {
            lease,
            published,
            epoch,
            ..
        } = &mut self.role
        else {
            return Ok(());
        };
        let unchanged =
            (published.as_ref()).is_some_and(|(w, v)| *w == weights && same_vips(v, &vips));
        if unchanged {
            return Ok(());
        }
        if published.is_none() {
            // A new term continues the epochs of the last one.
            let last = self.store.get(self.state_key.as_bytes()).await?.kv;
            *epoch = last
                .and_then(|kv| serde_json::from_slice::<FleetState>(&kv.value).ok())
                .map_or(0, |s| s.epoch);
        }
        let next = FleetState {
            epoch: *epoch + 1,
            leader: self.me.clone(),
            vips: weights.clone(),
            vip_config: vips.clone(),
        };
        let text = serde_json::to_vec(&next).expect("a fleet state serializes");
        let held = Held {
            key: self.leader_key.as_bytes(),
            value: self.me.as_bytes(),
            lease: *lease,
        };
        if self
            .store
            .put_if(&held, self.state_key.as_bytes(), &text)
            .await?
        {
            tracing::info!(epoch = next.epoch, "fleet: published the state");
            *epoch = next.epoch;
            *published = Some((weights, vips));
            self.applied_epoch = Some(next.epoch);
            self.applied_at = Some(Instant::now());
        } else {
            tracing::warn!("fleet: no longer the leader (fenced write refused); stepping down");
            self.step_down();
            return self.follow().await;
        }
        Ok(())
    }
}

/// The next batch of a watch; never, without one.
async fn next_batch(watch: &mut Option<Watch>) -> Option<Result<WatchBatch, StoreError>> {
    match watch {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// Runs `f` on the daemon on a blocking thread (`None`: the thread failed).
async fn blocking<P: FleetPort, T: Send + 'static>(
    daemon: &Arc<P>,
    f: impl FnOnce(&P) -> T + Send + 'static,
) -> Option<T> {
    let d = daemon.clone();
    tokio::task::spawn_blocking(move || f(&d)).await.ok()
}

#[cfg(test)]
mod tests;
