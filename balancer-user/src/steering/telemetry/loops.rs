//! The daemon's telemetry loops: one task per VIP that scrapes its backends concurrently (when
//! it scrapes) at the pace its requests set ([`super::pace`]), records the reports, and runs a
//! weight round right after, so a report reaches the table within one policy round. Pushed
//! reports' rounds run every interval.
//!
//! The loops run on a single-threaded runtime of their own, on one thread, which also runs the
//! rounds after the scrapes (they block: the daemon's lock, a table rebuild): a scrape's timer,
//! its requests, their connections' tasks and the round then wake one thread, where the
//! daemon's multi-threaded runtime passed them between its workers and its blocking pool — in a
//! VM a wake-up costs tens of microseconds, more than the work of a scrape of a small page.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::due::{DueWatch, relay};
use super::pace::{COUNT_CHECK, ScrapePace};
use super::scrape::{VllmPages, scrape};
use super::signals::Valid;
use crate::base::config::{TelemetryConfig, TelemetrySource};
use crate::base::http_client::{AccessNames, HttpClient};
use crate::base::net::Endpoint;
use crate::dataplane::ScrapeDue;

/// One VIP whose backends report.
#[derive(Clone, Debug, PartialEq)]
pub struct ScrapeTarget {
    pub vip: Endpoint,
    pub name: String,
    /// The VIP's id in the data plane (None until it has one).
    pub vip_id: Option<u32>,
    pub backends: Vec<IpAddr>,
    pub telemetry: TelemetryConfig,
}

/// The daemon as the telemetry loops reach it. (Implemented by the daemon; the loops know
/// nothing else of it.)
pub trait TelemetryPort: Send + Sync + 'static {
    /// The VIPs whose backends report.
    fn scrape_targets(&self) -> Vec<ScrapeTarget>;
    /// The VIP's new flows counted by the data plane so far (None where they cannot be read),
    /// for the pace of its scrapes.
    fn new_flows(&self, name: &str) -> Option<u64>;
    /// Records one round's results (an empty list for pushed reports) and runs the VIP's weight round; blocking. `next_scrape`: after a scrape, the
    /// wait from its start to the next (the fixed interval, or the pace the VIP's requests
    /// set); None for other rounds.
    fn record_round(
        &self,
        vip: &Endpoint,
        name: &str,
        results: Vec<(IpAddr, Result<Valid, String>)>,
        next_scrape: Option<Duration>,
    );
    /// The data plane's counts of new flows left before the paced VIPs' scrapes and its ring
    /// buffer of those that reached it, handed over once (None afterwards, or where the data
    /// plane has none).
    fn take_scrape_due(&self) -> Option<ScrapeDue> {
        None
    }
}

/// The running loops, by VIP name, and the thread they run on (started with the first loop).
#[derive(Default)]
pub struct TelemetryLoops {
    tasks: crate::steering::tasks::Tasks<String, ScrapeTarget>,
    thread: Option<LoopThread>,
    /// Where the loops run: the thread's runtime (or, had it failed to start, the caller's).
    runtime: Option<tokio::runtime::Handle>,
    /// Where the paced VIPs' loops hear that a scrape is due, when the data plane tells.
    due: Option<Arc<DueWatch>>,
}

impl TelemetryLoops {
    /// Brings the loops in line with the daemon's config.
    pub fn reconcile<P: TelemetryPort>(&mut self, daemon: &Arc<P>) {
        let targets: HashMap<String, ScrapeTarget> = daemon
            .scrape_targets()
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        if targets.is_empty() && self.runtime.is_none() {
            return;
        }
        let runtime = match &self.runtime {
            Some(r) => r.clone(),
            None => {
                let runtime = match LoopThread::start() {
                    Ok(t) => self.thread.insert(t).runtime.clone(),
                    Err(e) => {
                        // Not expected (a thread or an epoll instance refused): the caller's
                        // runtime runs the loops instead, and no thread is asked for again.
                        tracing::error!("telemetry: {e}; the loops run on the daemon's runtime");
                        tokio::runtime::Handle::current()
                    }
                };
                if let Some(ScrapeDue { mut counts, events }) = daemon.take_scrape_due() {
                    let watch = DueWatch::new(move |vip_id, flows| {
                        counts.set(vip_id, flows).map_err(|e| e.to_string())
                    });
                    runtime.spawn(relay(events, watch.clone()));
                    self.due = Some(watch);
                }
                self.runtime.insert(runtime).clone()
            }
        };
        let due = self.due.clone();
        self.tasks.reconcile(targets, |_, target| {
            runtime.spawn(run(daemon.clone(), target.clone(), due.clone()))
        });
    }

    /// Stops the loops and their thread.
    pub fn stop(&mut self) {
        self.tasks.stop();
        self.runtime = None;
        // Its relay stopped with the thread: loops started later read the counters themselves.
        self.due = None;
        if let Some(thread) = self.thread.take() {
            thread.stop();
        }
    }
}

/// A thread running a single-threaded runtime until told to stop.
struct LoopThread {
    runtime: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl LoopThread {
    fn start() -> Result<LoopThread, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("building the loops' runtime: {e}"))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("telemetry".into())
            .spawn(move || {
                // Runs the spawned loops until told to stop (or the sender is gone); dropping
                // the runtime then drops the loops left.
                let _ = runtime.block_on(stopped);
            })
            .map_err(|e| format!("starting the loops' thread: {e}"))?;
        Ok(LoopThread {
            runtime: handle,
            stop,
            thread,
        })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// One VIP's loop. `due`: where the data plane tells that a paced VIP's new flows reached a
/// scrape's (None: the loop reads the VIP's counter every [`COUNT_CHECK`] of a long wait).
async fn run<P: TelemetryPort>(daemon: Arc<P>, target: ScrapeTarget, due: Option<Arc<DueWatch>>) {
    let ScrapeTarget {
        vip,
        name,
        vip_id,
        backends,
        telemetry: cfg,
    } = target;
    let pace = ScrapePace::new(&cfg);
    let paced = pace.varies() && matches!(cfg.source, TelemetrySource::Scrape(_));
    let mut pacing = paced.then(|| Pacing::new(pace, due.as_ref().zip(vip_id)));
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One pooled client for this VIP's pages (its scheme, CA, certificate and token); a
    // setting that cannot be used fails every scrape with its reason, which status shows.
    let client = HttpClient::with_access(&cfg.access, &AccessNames::TELEMETRY);
    if let Err(e) = &client {
        tracing::error!(vip = %name, "telemetry: {e}");
    }
    let vllm = Arc::new(VllmPages::default());
    loop {
        match &mut pacing {
            Some(p) => {
                p.until_due(|| daemon.new_flows(&name), backends.len(), cfg.interval)
                    .await
            }
            None => {
                tick.tick().await;
            }
        }
        let started = Instant::now();
        let results = match &cfg.source {
            TelemetrySource::Scrape(pages) => {
                scrape_all(&backends, pages, &cfg, &client, &vllm).await
            }
            _ => Vec::new(),
        };
        let next_scrape = match &mut pacing {
            Some(p) => Some(p.scraped(started, daemon.new_flows(&name), &results, backends.len())),
            None if matches!(cfg.source, TelemetrySource::Scrape(_)) => Some(cfg.interval),
            None => None,
        };
        // Blocking, here: on the loops' own thread this only delays the other VIPs' scrapes
        // by a round's few milliseconds, and a hop to a blocking pool and back cost two
        // more wake-ups a round.
        daemon.record_round(&vip, &name, results, next_scrape);
    }
}

/// Scrapes every backend's pages at once.
async fn scrape_all(
    backends: &[IpAddr],
    pages: &[(u16, String)],
    cfg: &TelemetryConfig,
    client: &Result<HttpClient, String>,
    vllm: &Arc<VllmPages>,
) -> Vec<(IpAddr, Result<Valid, String>)> {
    let mut set = JoinSet::new();
    for backend in backends {
        let (backend, pages, timeout, max_body) =
            (*backend, pages.to_vec(), cfg.timeout, cfg.max_body);
        let client = client.clone();
        let vllm = vllm.clone();
        set.spawn(async move {
            let result = match &client {
                Ok(c) => scrape(c, backend, &pages, &vllm, timeout, max_body).await,
                Err(e) => Err(e.clone()),
            };
            (backend, result)
        });
    }
    let mut results = Vec::new();
    while let Some(done) = set.join_next().await {
        if let Ok(result) = done {
            results.push(result);
        }
    }
    results
}

/// A paced VIP's clock: its next scrape comes after the wait its last interval's requests
/// set, or at once when its new flows reach a scrape's first (a burst).
struct Pacing {
    pace: ScrapePace,
    /// The data plane's word that the flows a scrape is for came: heard once the count is set
    /// after a scrape (`counting`).
    told: Option<(Arc<DueWatch>, u32, mpsc::Receiver<()>)>,
    counting: bool,
    last_scrape: Instant,
    wait: Duration,
}

impl Pacing {
    fn new(pace: ScrapePace, due: Option<(&Arc<DueWatch>, u32)>) -> Pacing {
        Pacing {
            pace,
            told: due.map(|(watch, id)| (watch.clone(), id, watch.listen(id))),
            counting: false,
            last_scrape: Instant::now(),
            wait: Duration::ZERO,
        }
    }

    /// Waits until the next scrape is due: the first at once, then each after the wait its
    /// last interval's requests set (from the start of the scrape before, as a tick would) —
    /// or, when the VIP's new flows reach a scrape's requests first, at once (though not
    /// sooner than the fastest scrapes follow each other): as the data plane tells, else as
    /// read (`new_flows`) every COUNT_CHECK of a longer wait.
    async fn until_due(
        &mut self,
        new_flows: impl Fn() -> Option<u64>,
        backends: usize,
        interval: Duration,
    ) {
        let due_at = self.last_scrape + self.wait;
        match self.told.as_mut().filter(|_| self.counting) {
            Some((_, _, heard)) => {
                let word = tokio::select! {
                    _ = tokio::time::sleep_until(due_at.into()) => None,
                    word = heard.recv() => Some(word),
                };
                if let Some(word) = word {
                    if word.is_none() {
                        // Another loop took this VIP's events (not expected while this one
                        // runs): read the counter from here on.
                        self.told = None;
                    }
                    tokio::time::sleep_until((self.last_scrape + interval).into()).await;
                }
            }
            None => loop {
                let left = due_at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(left.min(COUNT_CHECK)).await;
                if left > COUNT_CHECK && self.pace.due_by_flows(new_flows(), backends) {
                    break;
                }
            },
        }
    }

    /// After the scrape that started at `started`: the wait until the next.
    fn scraped(
        &mut self,
        started: Instant,
        new_flows: Option<u64>,
        results: &[(IpAddr, Result<Valid, String>)],
        backends: usize,
    ) -> Duration {
        let requests = self.pace.requests_since(new_flows, results);
        self.wait = self
            .pace
            .next_wait(requests, started - self.last_scrape, backends);
        self.last_scrape = started;
        // The next scrape's flows counted from the reading just taken: a word left from the
        // count before is stale.
        if let Some((watch, id, heard)) = self.told.as_mut() {
            while heard.try_recv().is_ok() {}
            self.counting = watch.expect(*id, self.pace.flows_per_scrape(backends));
        }
        self.wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::base::net::Protocol;

    /// One target; records the thread each round runs on.
    struct OnThread {
        target: ScrapeTarget,
        threads: std::sync::Mutex<Vec<Option<String>>>,
    }

    impl TelemetryPort for OnThread {
        fn scrape_targets(&self) -> Vec<ScrapeTarget> {
            vec![self.target.clone()]
        }
        fn new_flows(&self, _name: &str) -> Option<u64> {
            None
        }
        fn record_round(
            &self,
            _vip: &Endpoint,
            _name: &str,
            _results: Vec<(IpAddr, Result<Valid, String>)>,
            _next_scrape: Option<Duration>,
        ) {
            let name = std::thread::current().name().map(str::to_string);
            self.threads.lock().unwrap().push(name);
        }
    }

    /// VIP "v" scraping one backend that never answers (each scrape ends by its `timeout`
    /// with an error) every `interval` at the fastest and `max_interval` at the slowest, paced
    /// by `requests_per_scrape`; and the backend's listener, to keep open while the loop
    /// runs.
    fn silent_target(
        interval: Duration,
        max_interval: Duration,
        requests_per_scrape: u32,
        timeout: Duration,
    ) -> (ScrapeTarget, std::net::TcpListener) {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = silent.local_addr().unwrap();
        let target = ScrapeTarget {
            vip: ("10.0.0.1".parse().unwrap(), 80, Protocol::Tcp),
            name: "v".into(),
            vip_id: Some(1),
            backends: vec![address.ip()],
            telemetry: TelemetryConfig {
                source: TelemetrySource::Scrape(vec![(address.port(), "/metrics".into())]),
                interval,
                max_interval,
                requests_per_scrape,
                timeout,
                max_body: 1 << 16,
                derived_half_life: Duration::from_millis(200),
                access: Default::default(),
            },
        };
        (target, silent)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_loops_run_on_their_own_thread_until_stopped() {
        let (target, _silent) = silent_target(
            Duration::from_millis(100),
            Duration::from_secs(4),
            8,
            Duration::from_millis(20),
        );
        let port = Arc::new(OnThread {
            target,
            threads: Default::default(),
        });
        let mut loops = TelemetryLoops::default();
        loops.reconcile(&port);
        loops.reconcile(&port); // the same target: the same loop, no second thread
        tokio::time::sleep(Duration::from_millis(450)).await;
        let rounds = port.threads.lock().unwrap().clone();
        assert!(rounds.len() >= 3, "{} rounds in 450 ms", rounds.len());
        assert!(
            rounds.iter().all(|t| t.as_deref() == Some("telemetry")),
            "rounds ran on {rounds:?}"
        );
        // Stopping joins the thread: no round after it.
        loops.stop();
        let stopped = port.threads.lock().unwrap().len();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(port.threads.lock().unwrap().len(), stopped);
    }

    /// A VIP whose data plane counts `step` new flows between two readings; keeps the wait
    /// to the next scrape its last round was given.
    struct Flows {
        step: u64,
        counted: std::sync::atomic::AtomicU64,
        /// Readings of the counter.
        reads: AtomicUsize,
        rounds: AtomicUsize,
        next_scrape: std::sync::Mutex<Option<Duration>>,
    }

    impl TelemetryPort for Flows {
        fn scrape_targets(&self) -> Vec<ScrapeTarget> {
            Vec::new()
        }
        fn new_flows(&self, _name: &str) -> Option<u64> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Some(self.counted.fetch_add(self.step, Ordering::SeqCst) + self.step)
        }
        fn record_round(
            &self,
            _vip: &Endpoint,
            _name: &str,
            _results: Vec<(IpAddr, Result<Valid, String>)>,
            next_scrape: Option<Duration>,
        ) {
            self.rounds.fetch_add(1, Ordering::SeqCst);
            *self.next_scrape.lock().unwrap() = next_scrape;
        }
    }

    /// A loop over one backend that never answers (each scrape ends by its 5 ms timeout),
    /// scraping every 20 ms at the fastest and `slowest` at the slowest, its VIP's data plane
    /// counting `step` new flows a reading: the loop's task, the stand-in daemon, and the
    /// backend's listener (to keep open while the loop runs).
    fn paced_loop(
        step: u64,
        slowest: Duration,
        requests_per_scrape: u32,
    ) -> (
        tokio::task::JoinHandle<()>,
        Arc<Flows>,
        std::net::TcpListener,
    ) {
        paced_loop_told(step, slowest, requests_per_scrape, None)
    }

    /// [`paced_loop`], told by `due` when its VIP's (id 1) scrape is due.
    fn paced_loop_told(
        step: u64,
        slowest: Duration,
        requests_per_scrape: u32,
        due: Option<Arc<DueWatch>>,
    ) -> (
        tokio::task::JoinHandle<()>,
        Arc<Flows>,
        std::net::TcpListener,
    ) {
        let (target, silent) = silent_target(
            Duration::from_millis(20),
            slowest,
            requests_per_scrape,
            Duration::from_millis(5),
        );
        let port = Arc::new(Flows {
            step,
            counted: Default::default(),
            reads: Default::default(),
            rounds: Default::default(),
            next_scrape: Default::default(),
        });
        (tokio::spawn(run(port.clone(), target, due)), port, silent)
    }

    /// The scrape rounds a loop runs in 500 ms over a VIP whose data plane counts `step` new
    /// flows a round, scraping every 20 ms at the fastest and 200 ms at the slowest, and the
    /// wait to the next scrape the last round was given.
    async fn rounds_in_half_a_second(
        step: u64,
        requests_per_scrape: u32,
    ) -> (usize, Option<Duration>) {
        let (task, port, _silent) =
            paced_loop(step, Duration::from_millis(200), requests_per_scrape);
        tokio::time::sleep(Duration::from_millis(500)).await;
        task.abort();
        let _ = task.await;
        let next = *port.next_scrape.lock().unwrap();
        (port.rounds.load(Ordering::SeqCst), next)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scrapes_follow_the_vips_requests_between_the_two_intervals() {
        // No new flows: after the first two (the second sets where counting starts), one
        // every 200 ms — at 0, 20, 220 and 420 ms.
        // Each round is told the wait to the next scrape (what the daemon shows as the VIP's
        // scrape interval).
        let (idle, next) = rounds_in_half_a_second(0, 8).await;
        assert!((3..=5).contains(&idle), "{idle} rounds of an idle VIP");
        assert_eq!(next, Some(Duration::from_millis(200)));
        // A thousand new flows a round: every 20 ms.
        let (busy, next) = rounds_in_half_a_second(1000, 8).await;
        assert!(busy >= 12, "{busy} rounds of a busy VIP");
        assert_eq!(next, Some(Duration::from_millis(20)));
        // requests_per_scrape = 0: every interval however idle.
        let (fixed, next) = rounds_in_half_a_second(0, 0).await;
        assert!(fixed >= 12, "{fixed} rounds at a fixed interval");
        assert_eq!(next, Some(Duration::from_millis(20)));
    }

    /// Idle (no new flow), scraping every 2 s at the slowest, the loop reading its VIP's
    /// counter itself (no `due`, or one that cannot set a count): then a burst of 50 new flows
    /// (over 8 per backend) is counted within COUNT_CHECK and scraped at once.
    async fn a_burst_is_read_within_a_count_check(due: Option<Arc<DueWatch>>) {
        let (task, port, _silent) = paced_loop_told(0, Duration::from_secs(2), 8, due);
        // The first two rounds (at 0 and 20 ms), then a 2 s wait.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(port.rounds.load(Ordering::SeqCst), 2);
        port.counted.fetch_add(50, Ordering::SeqCst);
        tokio::time::sleep(COUNT_CHECK + Duration::from_millis(200)).await;
        let rounds = port.rounds.load(Ordering::SeqCst);
        task.abort();
        let _ = task.await;
        // The burst's scrape (and, paced by the burst's rate, one more 80 ms later).
        assert!(
            (3..=4).contains(&rounds),
            "{rounds} rounds: the burst's scrape did not come within {COUNT_CHECK:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_new_flows_cuts_a_slow_wait_short() {
        a_burst_is_read_within_a_count_check(None).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_data_plane_tells_when_a_burst_makes_a_scrape_due() {
        // As above, but the data plane counts the flows down and tells: the loop sets the
        // count after each scrape, reads no counter while it waits, and scrapes at once when
        // told.
        let counts: Arc<std::sync::Mutex<Vec<(u32, u64)>>> = Default::default();
        let set = counts.clone();
        let watch = DueWatch::new(move |id, flows| {
            set.lock().unwrap().push((id, flows));
            Ok(())
        });
        let (task, port, _silent) =
            paced_loop_told(0, Duration::from_secs(2), 8, Some(watch.clone()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(port.rounds.load(Ordering::SeqCst), 2);
        // Set after each scrape: 8 flows per backend, one backend, VIP id 1.
        assert_eq!(*counts.lock().unwrap(), [(1, 8), (1, 8)]);
        // One reading per scrape (for the pace), none while waiting.
        let reads = port.reads.load(Ordering::SeqCst);
        tokio::time::sleep(COUNT_CHECK + Duration::from_millis(100)).await;
        assert_eq!(
            port.reads.load(Ordering::SeqCst),
            reads,
            "a counter read while told"
        );
        assert_eq!(port.rounds.load(Ordering::SeqCst), 2);
        watch.due(1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let rounds = port.rounds.load(Ordering::SeqCst);
        task.abort();
        let _ = task.await;
        assert_eq!(rounds, 3, "the burst's scrape did not come within 100 ms");
        assert_eq!(counts.lock().unwrap().len(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_count_that_cannot_be_set_leaves_the_loop_reading_the_counter() {
        let watch = DueWatch::new(|_, _| Err("the map is gone".into()));
        a_burst_is_read_within_a_count_check(Some(watch)).await;
    }
}
