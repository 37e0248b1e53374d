//! The fleet agent: one task per daemon with a `[fleet]`. It campaigns for leadership with an
//! etcd lease; the leader publishes its weights whenever they change (fenced on its lease), and
//! every other instance applies each new epoch it reads. A leader that cannot renew its lease
//! in time steps down before etcd expires it, and a leader whose fenced write fails knows it
//! was replaced: at no time do two instances publish.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::etcd::{Etcd, EtcdError, Held};
use super::{FleetState, FleetStatus, FleetWeights, same_vips};
use crate::config::{FleetConfig, RawVip};

/// Longest an etcd call may take.
const CALL_TIMEOUT: Duration = Duration::from_millis(1000);

enum Role {
    Follower,
    Leader {
        lease: i64,
        /// Last successful renewal.
        renewed: Instant,
        /// What was published last (None: nothing yet in this term).
        published: Option<(FleetWeights, Vec<crate::config::RawVip>)>,
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
    /// Applies a state the leader published; whether it was applied.
    fn adopt(&self, state: &FleetState) -> bool;
    /// What this balancer would publish as the leader: its weights and VIP config.
    fn local_view(&self) -> Option<(FleetWeights, Vec<RawVip>)>;
    /// The agent's view, for status and metrics.
    fn set_status(&self, status: FleetStatus);
}

pub struct FleetAgent {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl FleetAgent {
    /// Starts the agent when the daemon's config has a `[fleet]`.
    pub fn start<P: FleetPort>(daemon: &Arc<P>) -> Option<FleetAgent> {
        let config = daemon.fleet_config()?;
        let (stop, stop_rx) = watch::channel(false);
        let daemon = daemon.clone();
        let task = tokio::spawn(run(daemon, config, stop_rx));
        Some(FleetAgent { task, stop })
    }

    /// Stops campaigning; a leader gives its lease back so that another takes over at once.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(3), self.task).await;
    }
}

async fn run<P: FleetPort>(daemon: Arc<P>, config: FleetConfig, mut stop: watch::Receiver<bool>) {
    let etcd = Etcd::new(config.etcd.clone(), CALL_TIMEOUT);
    let leader_key = config.leader_key();
    let state_key = config.state_key();
    let me = config.instance.clone();
    let mut role = Role::Follower;
    let mut applied_epoch: Option<u64> = None;
    let mut applied_at: Option<Instant> = None;
    let mut status = FleetStatus {
        instance: me.clone(),
        role: "starting".into(),
        ..FleetStatus::default()
    };
    let mut ticker = tokio::time::interval(config.poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => break,
        }
        let outcome: Result<(), EtcdError> = async {
            match &mut role {
                Role::Follower => {
                    let leader = etcd.get(leader_key.as_bytes()).await?;
                    status.leader = leader.as_ref().map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
                    if leader.is_none() {
                        // Nobody leads: campaign.
                        let lease = etcd.grant(config.lease.as_secs()).await?;
                        if etcd.create(leader_key.as_bytes(), me.as_bytes(), lease).await? {
                            tracing::info!(instance = %me, lease, "fleet: elected leader");
                            // Our own view rules now; it is published below.
                            blocking(&daemon, |d| d.use_local_weights()).await;
                            role = Role::Leader { lease, renewed: Instant::now(), published: None, epoch: 0 };
                            status.leader = Some(me.clone());
                            status.role = "leader".into();
                        } else {
                            let _ = etcd.revoke(lease).await;
                        }
                    }
                    if matches!(role, Role::Follower) {
                        status.role = "follower".into();
                        if let Some(kv) = etcd.get(state_key.as_bytes()).await? {
                            match serde_json::from_slice::<FleetState>(&kv.value) {
                                Ok(state) if Some(state.epoch) != applied_epoch => {
                                    let epoch = state.epoch;
                                    let applied = blocking(&daemon, move |d| d.adopt(&state)).await.unwrap_or(false);
                                    if applied {
                                        tracing::info!(epoch, "fleet: applied the published state");
                                        applied_epoch = Some(epoch);
                                        applied_at = Some(Instant::now());
                                    }
                                }
                                Ok(_) => {}
                                Err(e) => tracing::error!("fleet: the published state is not valid ({e}); keeping the last one"),
                            }
                        }
                    }
                }
                Role::Leader { lease, renewed, published, epoch } => {
                    // Renew a third of the way into the lease; step down before etcd would
                    // expire it if renewals fail.
                    if renewed.elapsed() >= config.lease / 3 {
                        match etcd.keep_alive(*lease).await {
                            Ok(ttl) if ttl > 0 => *renewed = Instant::now(),
                            Ok(_) => {
                                tracing::warn!("fleet: the leader lease expired; stepping down");
                                role = Role::Follower;
                                status.role = "follower".into();
                                return Ok(());
                            }
                            Err(e) => {
                                if renewed.elapsed() >= config.lease * 2 / 3 {
                                    tracing::warn!("fleet: cannot renew the leader lease ({e}); stepping down");
                                    role = Role::Follower;
                                    status.role = "follower".into();
                                }
                                return Err(e);
                            }
                        }
                    }
                    let view = blocking(&daemon, |d| d.local_view()).await.flatten();
                    let Some((weights, vips)) = view else { return Ok(()) };
                    let unchanged = published
                        .as_ref()
                        .is_some_and(|(w, v)| *w == weights && same_vips(v, &vips));
                    if !unchanged {
                        if published.is_none() {
                            // A new term continues the epochs of the last one.
                            let last = etcd.get(state_key.as_bytes()).await?;
                            *epoch = last
                                .and_then(|kv| serde_json::from_slice::<FleetState>(&kv.value).ok())
                                .map_or(0, |s| s.epoch);
                        }
                        let next = FleetState {
                            epoch: *epoch + 1,
                            leader: me.clone(),
                            vips: weights.clone(),
                            vip_config: vips.clone(),
                        };
                        let text = serde_json::to_vec(&next).expect("a fleet state serializes");
                        let held = Held { key: leader_key.as_bytes(), value: me.as_bytes(), lease: *lease };
                        if etcd.put_if(&held, state_key.as_bytes(), &text).await? {
                            tracing::info!(epoch = next.epoch, "fleet: published the state");
                            *epoch = next.epoch;
                            *published = Some((weights, vips));
                            applied_epoch = Some(next.epoch);
                            applied_at = Some(Instant::now());
                        } else {
                            tracing::warn!("fleet: no longer the leader (fenced write refused); stepping down");
                            role = Role::Follower;
                            status.role = "follower".into();
                        }
                    }
                }
            }
            Ok(())
        }
        .await;
        status.etcd = match outcome {
            Ok(()) => "ok".into(),
            Err(e) => {
                tracing::debug!("fleet: {e}");
                e.to_string()
            }
        };
        status.epoch = applied_epoch.unwrap_or(0);
        status.applied_secs_ago = applied_at.map(|t| t.elapsed().as_secs_f64());
        let s = status.clone();
        blocking(&daemon, move |d| d.set_status(s)).await;
    }
    if let Role::Leader { lease, .. } = role {
        match etcd.revoke(lease).await {
            Ok(()) => tracing::info!("fleet: leadership given back"),
            Err(e) => {
                tracing::warn!("fleet: could not give the lease back ({e}); it expires by itself")
            }
        }
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
