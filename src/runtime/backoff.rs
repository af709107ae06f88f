//! When the next pass of an object runs (S2-05): about 5 s after a successful pass; after a
//! failed one, an exponential backoff from a few milliseconds, doubling with each consecutive
//! failure up to about 16 minutes, reset only by a success (or by restarting the operator:
//! the failure counts live in memory only).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Re-check interval after a successful pass.
pub const RECHECK: Duration = Duration::from_secs(5);
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
