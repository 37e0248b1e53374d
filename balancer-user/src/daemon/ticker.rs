//! The daemon's once-a-second work, on a thread of its own: retired backends expire, traffic
//! rates move, BGP hears of changes, expired source-NAT flows are swept (while NAT is in use),
//! and the health-check, telemetry and discovery loops follow the config (API changes may have
//! added or removed checked or scraped backends, or pools).
//!
//! Why a thread that sleeps between seconds rather than a timer on the runtime: a tokio timer
//! wakes a runtime worker to fire it, which wakes the thread that waits for it, and the work
//! blocks (the daemon's lock, the data plane's syscalls) so it cannot run on a worker; one
//! wake-up a second instead of two or three was a good part of an idle daemon's CPU.
//!
//! (The connection table's flow counts are not taken here: status, stats, weights and metrics
//! count when asked, and the connection-aware policies read the data plane's own counters.)

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};

use super::state::Daemon;
use crate::discovery::DiscoveryLoops;
use crate::health::HealthChecks;
use crate::telemetry::loops::TelemetryLoops;

/// How often the work runs.
const PERIOD: Duration = Duration::from_secs(1);

/// The loops the thread keeps in line with the config.
pub struct Loops {
    pub health: HealthChecks,
    pub telemetry: TelemetryLoops,
    pub discovery: DiscoveryLoops,
}

impl Loops {
    /// Starts the loops the daemon's config asks for (on the runtime of the caller's context).
    pub fn start(daemon: &Arc<Mutex<Daemon>>) -> Loops {
        let mut loops = Loops {
            health: HealthChecks::default(),
            telemetry: TelemetryLoops::default(),
            discovery: DiscoveryLoops::default(),
        };
        loops.reconcile(daemon);
        loops
    }

    fn reconcile(&mut self, daemon: &Arc<Mutex<Daemon>>) {
        self.health.reconcile(daemon);
        self.telemetry.reconcile(daemon);
        self.discovery.reconcile(daemon);
    }

    fn stop(&mut self) {
        self.health.stop();
        self.telemetry.stop();
        self.discovery.stop();
    }
}

/// A request to the thread.
enum Request {
    /// Bring the loops in line with the config now (after a reload).
    Reconcile,
}

/// The running thread; [`Ticker::stop`] ends it and the loops.
pub struct Ticker {
    requests: mpsc::Sender<Request>,
    thread: JoinHandle<()>,
    /// Closed when the thread ends, also by a panic: the main loop stops the daemon then.
    ended: tokio::sync::watch::Receiver<()>,
}

impl Ticker {
    /// Starts the thread, which runs the work at once and then every second, and owns `loops`
    /// (their tasks run on `runtime`).
    pub fn start(
        daemon: Arc<Mutex<Daemon>>,
        loops: Loops,
        runtime: tokio::runtime::Handle,
    ) -> Result<Ticker> {
        let (requests, received) = mpsc::channel();
        let (ended_tx, ended) = tokio::sync::watch::channel(());
        let thread = std::thread::Builder::new()
            .name("every-second".into())
            .spawn(move || {
                // Dropped when the thread ends, however it ends.
                let _ended = ended_tx;
                let _runtime = runtime.enter();
                run(&daemon, loops, &received);
            })
            .context("starting the daemon's once-a-second thread")?;
        Ok(Ticker {
            requests,
            thread,
            ended,
        })
    }

    /// Asks the thread to bring the loops in line with the config now.
    pub fn reconcile(&self) {
        let _ = self.requests.send(Request::Reconcile);
    }

    /// Completes when the thread has ended before [`Ticker::stop`] (it panicked).
    pub async fn ended(&mut self) {
        // No value is ever sent: this returns once the sender is dropped.
        while self.ended.changed().await.is_ok() {}
    }

    /// Ends the thread (after the work in progress, if any) and the loops it owns.
    pub fn stop(self) -> Result<()> {
        drop(self.requests);
        self.thread
            .join()
            .map_err(|_| anyhow!("the daemon's once-a-second thread panicked"))
    }
}

fn run(daemon: &Arc<Mutex<Daemon>>, mut loops: Loops, requests: &mpsc::Receiver<Request>) {
    let mut due = Instant::now();
    loop {
        match requests.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(Request::Reconcile) => loops.reconcile(daemon),
            Err(RecvTimeoutError::Timeout) => {
                if let Ok(mut d) = daemon.lock() {
                    d.tick();
                    d.sample();
                    d.announce();
                }
                Daemon::sweep_nat(daemon);
                loops.reconcile(daemon);
                // A second that overran delays the next, as a missed tick does.
                due += PERIOD;
                let now = Instant::now();
                if due < now {
                    due = now + PERIOD;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    loops.stop();
}
