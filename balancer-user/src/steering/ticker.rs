//! The daemon's once-a-second work, on a thread of its own: retired backends expire, the
//! traffic counters are read for their rates (every second while a view of the rates was
//! asked for in the last 30 s, else every 10 s), BGP hears of changes, expired source-NAT
//! flows are swept (while NAT is in use), and the health-check, telemetry and discovery loops
//! follow the config when it changed (API changes may have added or removed checked or
//! scraped backends, or pools; a reload asks at once).
//!
//! Why a thread that sleeps between seconds rather than a timer on the runtime: a tokio timer
//! wakes a runtime worker to fire it, which wakes the thread that waits for it, and the work
//! blocks (the daemon's lock, the data plane's syscalls) so it cannot run on a worker; one
//! wake-up a second instead of two or three was a good part of an idle daemon's CPU.
//!
//! (The connection table's flow counts are not taken here: status, stats, weights and metrics
//! count when asked, and the connection-aware policies read the data plane's own counters.)

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};

use crate::steering::discovery::{DiscoveryLoops, DiscoveryPort};
use crate::steering::health::{HealthChecks, HealthPort};
use crate::steering::telemetry::loops::{TelemetryLoops, TelemetryPort};

/// The daemon as the thread reaches it: the work of a second, and the ports of the loops it
/// keeps. (Implemented by the daemon; the thread knows nothing else of it.)
pub trait TickerPort: HealthPort + TelemetryPort + DiscoveryPort {
    /// The once-a-second work; blocking.
    fn every_second(&self);
    /// A number that moves whenever the config the loops follow may have changed.
    fn config_generation(&self) -> u64;
}

/// How often the work runs.
const PERIOD: Duration = Duration::from_secs(1);

/// The loops the thread keeps in line with the config.
pub struct Loops {
    health: HealthChecks,
    telemetry: TelemetryLoops,
    discovery: DiscoveryLoops,
}

impl Loops {
    /// Starts the loops the daemon's config asks for (on the runtime of the caller's context).
    pub fn start<P: TickerPort>(daemon: &Arc<P>) -> Loops {
        let mut loops = Loops {
            health: HealthChecks::default(),
            telemetry: TelemetryLoops::default(),
            discovery: DiscoveryLoops::default(),
        };
        loops.reconcile(daemon);
        loops
    }

    fn reconcile<P: TickerPort>(&mut self, daemon: &Arc<P>) {
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
    pub fn start<P: TickerPort>(
        daemon: Arc<P>,
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

fn run<P: TickerPort>(daemon: &Arc<P>, mut loops: Loops, requests: &mpsc::Receiver<Request>) {
    let mut due = Instant::now();
    // The config generation the loops were last brought in line with (read before, so a
    // change during a reconcile is looked at again); none yet: the first second looks.
    let mut seen = None;
    let reconcile = |loops: &mut Loops, seen: &mut Option<u64>| {
        let generation = daemon.config_generation();
        loops.reconcile(daemon);
        *seen = Some(generation);
    };
    loop {
        match requests.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(Request::Reconcile) => reconcile(&mut loops, &mut seen),
            Err(RecvTimeoutError::Timeout) => {
                daemon.every_second();
                if seen != Some(daemon.config_generation()) {
                    reconcile(&mut loops, &mut seen);
                }
                due = crate::steering::tasks::next_due(due, PERIOD);
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    loops.stop();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::base::config::HealthConfig;
    use crate::steering::discovery::PoolDiscovery;
    use crate::steering::telemetry::loops::ScrapeTarget;
    use crate::steering::telemetry::signals::Valid;
    use crate::vips::Endpoint;

    /// Counts seconds and reconciles (each asks for the health targets), in order; panics in
    /// the second numbered `panic_at`; its config's generation is `generation`.
    #[derive(Default)]
    struct Counting {
        seconds: AtomicUsize,
        events: std::sync::Mutex<Vec<&'static str>>,
        panic_at: usize,
        generation: std::sync::atomic::AtomicU64,
    }

    impl TickerPort for Counting {
        fn every_second(&self) {
            let n = self.seconds.fetch_add(1, Ordering::SeqCst) + 1;
            self.events.lock().unwrap().push("second");
            assert_ne!(n, self.panic_at, "second {n} fails");
        }

        fn config_generation(&self) -> u64 {
            self.generation.load(Ordering::SeqCst)
        }
    }

    impl HealthPort for Counting {
        fn health_targets(&self) -> Vec<(Endpoint, String, IpAddr, HealthConfig)> {
            self.events.lock().unwrap().push("reconcile");
            Vec::new()
        }
        fn believed_healthy(&self, _: &str, _: IpAddr) -> Option<bool> {
            None
        }
        fn count_probe(&self, _: &str, _: IpAddr, _: &str) {}
        fn set_health(&self, _: &Endpoint, _: &str, _: IpAddr, _: bool) {}
    }

    impl TelemetryPort for Counting {
        fn scrape_targets(&self) -> Vec<ScrapeTarget> {
            Vec::new()
        }
        fn new_flows(&self, _: &str) -> Option<u64> {
            None
        }
        fn record_round(
            &self,
            _: &Endpoint,
            _: &str,
            _: Vec<(IpAddr, Result<Valid, String>)>,
            _: Option<Duration>,
        ) {
        }
    }

    impl DiscoveryPort for Counting {
        fn discovery_targets(&self) -> Vec<(String, PoolDiscovery)> {
            Vec::new()
        }
        fn record_models(&self, _: &str, _: Vec<(IpAddr, Result<Vec<String>, String>)>) {}
    }

    fn start(port: &Arc<Counting>) -> Ticker {
        let loops = Loops::start(port);
        Ticker::start(port.clone(), loops, tokio::runtime::Handle::current()).unwrap()
    }

    /// Waits (up to 5 s) until `done` holds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within 5 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_work_runs_at_once_then_every_second_and_the_loops_follow_the_config() {
        let port = Arc::new(Counting::default());
        let started = Instant::now();
        let ticker = start(&port);
        let seconds = || port.seconds.load(Ordering::SeqCst);
        let events = || port.events.lock().unwrap().clone();
        until("the first second", || events().len() == 3).await;
        // A reload's request, sent long before the next second is due.
        ticker.reconcile();
        until("the next second", || seconds() == 2).await;
        assert!(
            Instant::now() >= started + Duration::from_millis(900),
            "the next second came early"
        );
        // The config changes (as by the API), after the second's own look: the next second
        // looks.
        tokio::time::sleep(Duration::from_millis(300)).await;
        port.generation.fetch_add(1, Ordering::SeqCst);
        until("the third second", || events().len() == 7).await;
        assert_eq!(
            events(),
            [
                "reconcile", // Loops::start
                "second",
                "reconcile", // the first second looks
                "reconcile", // the request, at once
                "second",    // the config unchanged: no look
                "second",
                "reconcile", // it changed
            ]
        );
        ticker.stop().unwrap();
        let after = seconds();
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        assert_eq!(seconds(), after, "a second after stop");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_panic_of_the_thread_is_seen_and_is_the_stop_s_error() {
        let port = Arc::new(Counting {
            panic_at: 2,
            ..Counting::default()
        });
        let mut ticker = start(&port);
        tokio::time::timeout(Duration::from_secs(5), ticker.ended())
            .await
            .expect("the main loop hears of the thread's end");
        let error = ticker.stop().unwrap_err().to_string();
        assert!(error.contains("panicked"), "{error}");
    }
}
