//! When the next pass of an object runs (S2-05): about 5 s after a successful pass; after a
//! failed one, an exponential backoff from a few milliseconds, doubling with each consecutive
//! failure up to about 16 minutes, reset only by a success (or by restarting the operator:
//! the failure counts live in memory only).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Re-check interval after a successful pass.
pub const RECHECK: Duration = Duration::from_secs(5);

/// How soon a cluster is passed again while it waits for its servers to get somewhere no
/// Kubernetes event announces (see [`crate::plan::Plan::recheck_soon`]).
pub const SERVER_RECHECK: Duration = Duration::from_secs(1);
/// Delay after the first failure.
pub const FIRST_RETRY: Duration = Duration::from_millis(5);
/// Upper bound of the backoff.
pub const MAX_RETRY: Duration = Duration::from_secs(1000);

/// Delay before the retry that follows `consecutive_failures` failures in a row (1 = first).
pub fn retry_delay(consecutive_failures: u32) -> Duration {
    let n = consecutive_failures.max(1) - 1;
    if n >= 32 {
        return MAX_RETRY;
    }
    FIRST_RETRY
        .checked_mul(1u32 << n)
        .map_or(MAX_RETRY, |d| d.min(MAX_RETRY))
}

/// Consecutive failures per object.
#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn failed(&self, key: &str) -> Duration {
        let mut m = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        retry_delay(*n)
    }

    /// Records a success of `key`: the next failure starts from the first delay again.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S2-05: 5 ms, 10 ms, 20 ms … doubling, capped at 1000 s.
    #[test]
    fn backoff_doubles_from_milliseconds_and_is_capped() {
        let delays: Vec<u128> = (1..=8).map(|n| retry_delay(n).as_millis()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640]);
        // 5 ms * 2^17 = 655 s, 2^18 would be 1310 s: capped.
        assert_eq!(retry_delay(18), Duration::from_millis(655_360));
        assert_eq!(retry_delay(19), MAX_RETRY);
        assert_eq!(retry_delay(40), MAX_RETRY);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY);
        for n in 1..60 {
            assert!(retry_delay(n + 1) >= retry_delay(n));
        }
    }

    /// A cluster waiting for its servers is checked again in 1 s, ten passes in a row at most,
    /// then every 5 s; a pass that does not wait starts the count again.
    #[test]
    fn a_wait_for_the_servers_is_checked_soon_ten_times_then_at_the_recheck() {
        let p = Pacer::default();
        let got: Vec<Duration> = (0..12).map(|_| p.recheck("t/c", true)).collect();
        assert!(got[..10].iter().all(|d| *d == SERVER_RECHECK), "{got:?}");
        assert_eq!(got[10..], [RECHECK, RECHECK]);
        assert_eq!(p.recheck("t/other", true), SERVER_RECHECK);
        assert_eq!(p.recheck("t/c", false), RECHECK);
        assert_eq!(p.recheck("t/c", true), SERVER_RECHECK);
        // a deleted cluster is forgotten: a new one of the name starts afresh
        for _ in 0..12 {
            p.recheck("t/d", true);
        }
        p.forget("t/d");
        assert_eq!(p.recheck("t/d", true), SERVER_RECHECK);
    }

    /// S2-05: only a success resets the sequence, and only for that object.
    #[test]
    fn success_resets_only_its_own_object() {
        let b = Backoff::default();
        assert_eq!(b.failed("t1/c1"), Duration::from_millis(5));
        assert_eq!(b.failed("t1/c1"), Duration::from_millis(10));
        assert_eq!(b.failed("t2/c1"), Duration::from_millis(5));
        assert_eq!(b.failed("t1/c1"), Duration::from_millis(20));
        b.succeeded("t1/c1");
        assert_eq!(b.failures("t1/c1"), 0);
        assert_eq!(b.failed("t1/c1"), Duration::from_millis(5));
        assert_eq!(b.failed("t2/c1"), Duration::from_millis(10));
    }
}

/// The longest an idle `ready` cluster waits for its next health check, however many clusters
/// share the operator.
pub const MAX_IDLE_RECHECK: Duration = Duration::from_secs(60);

/// How many idle health checks the operator makes in a second, at most, whatever the number of
/// clusters (decision 60): at about a millisecond of CPU each, their idle cost stays under
/// 3 CPU seconds a minute. With up to 200 clusters each is still checked every 5 s; at 1000,
/// every 25 s (a pod's change reaches the status at once all the same: its event starts a pass).
pub const MAX_IDLE_CHECKS_PER_SECOND: f64 = 40.0;

/// How long an idle `ready` cluster waits for its next health check (decision 41): [`RECHECK`],
/// or longer when `clusters` idle checks of `mean_pass` each would otherwise take more than
/// half of the time of the `concurrency` pass slots (about half: the spread below), so that a
/// new or changed cluster always finds a slot (with one slot, 5 s re-checks of 20 ms passes fill
/// it at 250 clusters and new clusters wait behind them), or the checks would be more than
/// [`MAX_IDLE_CHECKS_PER_SECOND`]; at most [`MAX_IDLE_RECHECK`]. Spread by `spread` (0..1, from
/// the cluster's name) over ±10 % so that clusters created together do not check together for
/// good.
pub fn idle_recheck(
    clusters: usize,
    mean_pass: Duration,
    concurrency: u16,
    spread: f64,
) -> Duration {
    let busy = mean_pass.as_secs_f64() * clusters as f64 * 2.0 / f64::from(concurrency.max(1));
    let rate = clusters as f64 / MAX_IDLE_CHECKS_PER_SECOND;
    let base = busy
        .max(rate)
        .max(RECHECK.as_secs_f64())
        .min(MAX_IDLE_RECHECK.as_secs_f64());
    Duration::from_secs_f64(base * (0.9 + 0.2 * spread.clamp(0.0, 1.0)))
}

/// The mean duration of idle passes (an exponentially weighted mean) and the number of
/// clusters, read at most once a second, for [`idle_recheck`].
#[derive(Default)]
pub struct Pacer {
    state: Mutex<PacerState>,
    /// When each idle cluster's next health check is due, as its last pass asked.
    due: Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// How many passes in a row of each cluster asked to be checked again soon.
    soon: Mutex<std::collections::HashMap<String, u32>>,
}

/// How many passes in a row a cluster is checked again in [`SERVER_RECHECK`] before it falls
/// back to [`RECHECK`]: a server reloads its configuration within a few seconds, and one that
/// never does (a file it refuses) is not asked every second for good.
pub const SOON_RECHECKS: u32 = 10;

/// How close to its due time a pass counts as the idle health check it was scheduled as
/// (kube-runtime does not say why a pass runs: a change triggers it earlier than due).
pub const DUE_SLACK: Duration = Duration::from_millis(250);

/// Whether a pass starting at `now` is the idle health check due at `due` (and not one a
/// change triggered before then).
pub fn is_idle_check(due: Option<std::time::Instant>, now: std::time::Instant) -> bool {
    due.is_some_and(|d| now + DUE_SLACK >= d)
}

/// How many idle health checks may hold or wait for a pass slot at once: half the slots (at
/// least one), so that a pass a change triggers never queues behind more than that many of
/// them (decision 41: at 1000 clusters the checks queued ahead of a pod's change delayed the
/// status by over a second).
pub fn idle_slots(concurrency: u16) -> usize {
    usize::from(concurrency.max(2) / 2)
}

#[derive(Default)]
struct PacerState {
    mean_secs: f64,
    clusters: usize,
    counted: Option<std::time::Instant>,
}

impl Pacer {
    /// Forgets a deleted cluster.
    pub fn forget(&self, key: &str) {
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.soon
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// When a pass of `key` that is not idle should be followed by the next: in
    /// [`SERVER_RECHECK`] while it waits for its servers (`soon`), for at most
    /// [`SOON_RECHECKS`] passes in a row, else in [`RECHECK`].
    pub fn recheck(&self, key: &str, soon: bool) -> Duration {
        let mut m = self.soon.lock().unwrap_or_else(|e| e.into_inner());
        if !soon {
            m.remove(key);
            return RECHECK;
        }
        let n = m.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        if *n <= SOON_RECHECKS {
            SERVER_RECHECK
        } else {
            RECHECK
        }
    }

    /// Records an idle pass that took `took` and returns when the cluster should be checked
    /// next; `count` says how many clusters there are (called at most once a second).
    pub fn idle_pass(
        &self,
        took: Duration,
        concurrency: u16,
        spread: f64,
        count: impl FnOnce() -> usize,
    ) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let t = took.as_secs_f64();
        s.mean_secs = if s.mean_secs == 0.0 {
            t
        } else {
            0.95 * s.mean_secs + 0.05 * t
        };
        if s.counted
            .is_none_or(|c| c.elapsed() >= Duration::from_secs(1))
        {
            s.clusters = count();
            s.counted = Some(std::time::Instant::now());
        }
        idle_recheck(
            s.clusters,
            Duration::from_secs_f64(s.mean_secs),
            concurrency,
            spread,
        )
    }

    /// Records that `key`'s next pass is its idle health check, due in `after`.
    pub fn schedule(&self, key: &str, after: Duration) {
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), std::time::Instant::now() + after);
    }

    /// Whether the pass of `key` starting now is its idle health check; forgets the schedule
    /// either way (a pass that is not idle schedules nothing).
    pub fn take_idle(&self, key: &str) -> bool {
        let due = self
            .due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        is_idle_check(due, std::time::Instant::now())
    }
}

/// A number in 0..1 from `key`, the same for the same key.
pub fn spread_of(key: &str) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % 1000) as f64 / 1000.0
}

#[cfg(test)]
mod pacing_tests {
    use super::*;

    /// Decision 41: few clusters are checked every 5 s; beyond what half the pass slots can
    /// check every 5 s, the period grows so that they use at most half; never beyond a minute.
    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) < Duration::from_millis(1)
    }

    #[test]
    fn idle_rechecks_leave_half_the_pass_slots_free() {
        let pass = Duration::from_millis(20);
        let mid = 0.5;
        assert!(close(idle_recheck(1, pass, 1, mid), RECHECK));
        assert!(close(idle_recheck(100, pass, 1, mid), RECHECK));
        // 1000 clusters × 20 ms × 2 on one slot: 40 s; on 16 slots 25 s, the most checks a
        // second (decision 60)
        assert!(close(
            idle_recheck(1000, pass, 1, mid),
            Duration::from_secs(40)
        ));
        assert!(close(
            idle_recheck(1000, pass, 16, mid),
            Duration::from_secs(25)
        ));
        // short checks: 200 clusters are checked every 5 s, 1000 every 25 s, 3000 every minute
        let glance = Duration::from_millis(1);
        assert!(close(idle_recheck(200, glance, 4, mid), RECHECK));
        assert!(close(
            idle_recheck(1000, glance, 4, mid),
            Duration::from_secs(25)
        ));
        assert!(close(idle_recheck(3000, glance, 4, mid), MAX_IDLE_RECHECK));
        for n in [1, 10, 100, 200, 500, 1000, 2000, 5000] {
            let period = idle_recheck(n, glance, 4, mid).as_secs_f64();
            assert!(
                n as f64 / period <= MAX_IDLE_CHECKS_PER_SECOND + 1e-9 || period >= 60.0,
                "{n} clusters: a check every {period} s"
            );
        }
        assert!(close(idle_recheck(100_000, pass, 1, mid), MAX_IDLE_RECHECK));
        // the checks take at most half of the slots' time
        for (n, c) in [(250, 1), (1000, 1), (1000, 4), (5000, 16)] {
            let period = idle_recheck(n, pass, c, mid).as_secs_f64();
            let load = n as f64 * pass.as_secs_f64() / period / f64::from(c);
            assert!(load <= 0.5 + 1e-9, "{n} clusters on {c} slots: {load}");
        }
        // spread over ±10 %
        assert!(close(
            idle_recheck(1, pass, 1, 0.0),
            Duration::from_millis(4500)
        ));
        assert!(close(
            idle_recheck(1, pass, 1, 1.0),
            Duration::from_millis(5500)
        ));
        let a = spread_of("ns/a");
        assert_eq!(a, spread_of("ns/a"));
        assert!((0.0..1.0).contains(&a));
    }

    /// Decision 41: a pass that starts when its cluster's idle check is due counts as that check
    /// (and waits for an idle slot); one that starts earlier was triggered by a change, as is
    /// any pass of a cluster with nothing scheduled; the schedule is used once. Idle checks
    /// get half the slots, at least one.
    #[test]
    fn passes_a_change_triggers_are_told_from_idle_checks() {
        let now = std::time::Instant::now();
        assert!(!is_idle_check(None, now));
        assert!(is_idle_check(Some(now), now));
        assert!(is_idle_check(Some(now + DUE_SLACK / 2), now));
        assert!(!is_idle_check(Some(now + Duration::from_secs(3)), now));
        let p = Pacer::default();
        assert!(!p.take_idle("ns/a"), "nothing scheduled");
        p.schedule("ns/a", Duration::ZERO);
        p.schedule("ns/b", Duration::from_secs(30));
        assert!(p.take_idle("ns/a"));
        assert!(!p.take_idle("ns/a"), "a schedule is used once");
        assert!(
            !p.take_idle("ns/b"),
            "before its time: a change triggered it"
        );
        assert!(!p.take_idle("ns/b"));
        assert_eq!(
            [1, 2, 3, 4, 16].map(idle_slots),
            [1, 1, 1, 2, 8],
            "half the slots, at least one"
        );
    }

    #[test]
    fn the_pacer_follows_the_mean_idle_pass() {
        let p = Pacer::default();
        let d = p.idle_pass(Duration::from_millis(20), 1, 0.5, || 1000);
        assert!(close(d, Duration::from_secs(40)));
        // the count is read at most once a second
        let d = p.idle_pass(Duration::from_millis(20), 1, 0.5, || unreachable!());
        assert!(close(d, Duration::from_secs(40)));
    }
}
