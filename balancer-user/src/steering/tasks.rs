//! A set of background tasks kept in line with a set of targets (health checks per backend,
//! scrape loops per VIP, discovery loops per pool): a task per target, restarted when its
//! target changes, stopped when it goes.

use std::collections::HashMap;
use std::hash::Hash;

use tokio::task::JoinHandle;

/// When a periodic thread's next run is due after the run due at `due`: a period later, or,
/// when that has passed already (the run overran), a period from now — an overrun delays the
/// next run, as a missed tick of a `Delay` interval does.
pub fn next_due(due: std::time::Instant, period: std::time::Duration) -> std::time::Instant {
    let next = due + period;
    let now = std::time::Instant::now();
    if next <= now { now + period } else { next }
}

pub struct Tasks<K, T> {
    running: HashMap<K, (T, JoinHandle<()>)>,
}

impl<K, T> Default for Tasks<K, T> {
    fn default() -> Self {
        Tasks {
            running: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash, T: PartialEq> Tasks<K, T> {
    /// Stops the tasks whose target is gone or changed, and starts one with `start` for each
    /// target without a task.
    pub fn reconcile(
        &mut self,
        targets: HashMap<K, T>,
        mut start: impl FnMut(&K, &T) -> JoinHandle<()>,
    ) {
        self.running.retain(|key, (target, task)| {
            let keep = targets.get(key) == Some(target);
            if !keep {
                task.abort();
            }
            keep
        });
        for (key, target) in targets {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.running.entry(key) {
                let task = start(slot.key(), &target);
                slot.insert((target, task));
            }
        }
    }

    pub fn stop(&mut self) {
        for (_, (_, task)) in self.running.drain() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_run_is_due_a_period_later_or_a_period_after_an_overrun() {
        let second = Duration::from_secs(1);
        let now = Instant::now();
        assert_eq!(next_due(now, second), now + second);
        // The run due 5 s ago overran: the next one is a period from now, not at once.
        let late = next_due(now - 5 * second, second);
        assert!(late >= now + second, "{:?} after now", late - now);
    }

    #[tokio::test]
    async fn tasks_follow_their_targets() {
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks: Tasks<&str, u32> = Tasks::default();
        let run = |targets: &[(&'static str, u32)], tasks: &mut Tasks<&str, u32>| {
            let s = started.clone();
            tasks.reconcile(targets.iter().copied().collect(), move |_, _| {
                s.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(std::future::pending())
            });
        };
        run(&[("a", 1), ("b", 1)], &mut tasks);
        run(&[("a", 1), ("b", 2)], &mut tasks); // b changed: restarted
        run(&[("a", 1)], &mut tasks); // b gone
        assert_eq!(started.load(std::sync::atomic::Ordering::Relaxed), 3);
        assert_eq!(tasks.running.len(), 1);
        tasks.stop();
        assert!(tasks.running.is_empty());
    }
}
