//! Scheduled backups (S2-40), decided from plain data: when the next backup of a schedule is
//! due, what it is called, and which backups its retention removes.

use chrono::{DateTime, Duration, DurationRound, Utc};

use crate::util::cron::Cron;

/// Label of a scheduled backup: the schedule's name.
pub const SCHEDULE_LABEL: &str = "clickhouse.com/schedule";
/// Annotation of a scheduled backup: the minute it was due (RFC 3339).
pub const DUE_ANNOTATION: &str = "clickhouse.com/scheduled-for";

/// How far back a missed slot is still taken (the operator was down, say).
pub const CATCH_UP: Duration = Duration::hours(24);

/// The newest minute at or before `now` that the schedule matches and that is after `last`
/// (the slot of the newest backup of the schedule). Without a `last`, only a slot of the last
/// two minutes counts: a new schedule does not back-fill.
pub fn due(cron: &Cron, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let now = now.duration_trunc(Duration::minutes(1)).ok()?;
    let floor = match last {
        Some(l) => l.max(now - CATCH_UP),
        None => now - Duration::minutes(2),
    };
    let mut t = now;
    while t > floor {
        if cron.matches(t) {
            return Some(t);
        }
        t -= Duration::minutes(1);
    }
    None
}

/// The name of the backup of `schedule` due at `slot`: the same slot always gives the same
/// name, so a retried pass never creates it twice.
pub fn backup_name(cluster: &str, schedule: &str, slot: DateTime<Utc>) -> String {
    format!("{cluster}-{schedule}-{}", slot.format("%Y%m%d%H%M"))
}

/// A backup of the schedule as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub name: String,
    pub slot: DateTime<Utc>,
    pub succeeded: bool,
    pub finished: bool,
}

/// What retention removes: all but the newest `keep` successful backups, and finished failed
/// ones older than the oldest successful backup kept. Backups still running are never removed.
pub fn expired(backups: &[Kept], keep: usize) -> Vec<String> {
    let mut ok: Vec<&Kept> = backups.iter().filter(|b| b.succeeded).collect();
    ok.sort_by_key(|b| std::cmp::Reverse(b.slot));
    let kept: Vec<&Kept> = ok.iter().take(keep).copied().collect();
    let oldest_kept = kept.last().map(|b| b.slot);
    let mut out: Vec<String> = ok.iter().skip(keep).map(|b| b.name.clone()).collect();
    out.extend(
        backups
            .iter()
            .filter(|b| b.finished && !b.succeeded)
            .filter(|b| oldest_kept.is_some_and(|o| b.slot < o))
            .map(|b| b.name.clone()),
    );
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, h, m, 0).unwrap()
    }

    /// A schedule is due at its slot once, not again for the same slot; a slot missed while the
    /// operator was down is taken late (within a day); a new schedule does not back-fill.
    #[test]
    fn a_slot_is_due_once_and_missed_slots_are_caught_up() {
        let hourly = Cron::parse("0 * * * *").unwrap();
        let now = at(10, 0) + Duration::seconds(20);
        assert_eq!(due(&hourly, Some(at(9, 0)), now), Some(at(10, 0)));
        assert_eq!(due(&hourly, Some(at(10, 0)), now), None, "taken already");
        assert_eq!(
            due(&hourly, Some(at(7, 0)), at(9, 40)),
            Some(at(9, 0)),
            "the newest missed slot, once"
        );
        assert_eq!(due(&hourly, None, at(9, 40)), None, "no back-fill");
        assert_eq!(due(&hourly, None, at(10, 1)), Some(at(10, 0)));
        let every = Cron::parse("*/1 * * * *").unwrap();
        assert_eq!(due(&every, Some(at(10, 0)), at(10, 0)), None);
        assert_eq!(due(&every, Some(at(10, 0)), at(10, 1)), Some(at(10, 1)));
    }

    /// Retention keeps the newest `keep` successful backups; failed ones go once a newer
    /// success is kept; running ones stay.
    #[test]
    fn retention_keeps_the_newest_successes_and_never_a_running_backup() {
        let b = |name: &str, m: u32, succeeded: bool, finished: bool| Kept {
            name: name.into(),
            slot: at(10, m),
            succeeded,
            finished,
        };
        let all = vec![
            b("a", 1, true, true),
            b("b", 2, false, true),
            b("c", 3, true, true),
            b("d", 4, true, true),
            b("e", 5, false, false),
        ];
        assert_eq!(expired(&all, 2), ["a", "b"]);
        assert_eq!(expired(&all, 5), Vec::<String>::new());
        assert_eq!(
            backup_name("c1", "nightly", at(3, 7)),
            "c1-nightly-202612010307"
        );
    }
}
