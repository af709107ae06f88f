//! Five-field cron expressions (minute hour day-of-month month day-of-week), as used by
//! backup schedules.

use chrono::{DateTime, Datelike, Timelike, Utc};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    minutes: Vec<bool>,
    hours: Vec<bool>,
    days: Vec<bool>,
    months: Vec<bool>,
    weekdays: Vec<bool>,
    days_restricted: bool,
    weekdays_restricted: bool,
}

fn parse_field(field: &str, min: u32, max: u32, name: &str) -> Result<(Vec<bool>, bool), String> {
    let mut set = vec![false; (max + 1) as usize];
    let restricted = field != "*";
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("{name}: bad step in {part:?}"))?,
            ),
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (num(a, name)?, num(b, name)?)
        } else {
            let v = num(range, name)?;
            (v, if part.contains('/') { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("{name}: {part:?} is outside {min}-{max}"));
        }
        let mut v = lo;
        while v <= hi {
            set[v as usize] = true;
            v += step;
        }
    }
    Ok((set, restricted))
}

fn num(s: &str, name: &str) -> Result<u32, String> {
    s.parse()
        .map_err(|_| format!("{name}: {s:?} is not a number"))
}

impl Cron {
    pub fn parse(expr: &str) -> Result<Cron, String> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "{expr:?} must have five fields (minute hour day-of-month month day-of-week)"
            ));
        }
        let (minutes, _) = parse_field(fields[0], 0, 59, "minute")?;
        let (hours, _) = parse_field(fields[1], 0, 23, "hour")?;
        let (days, days_restricted) = parse_field(fields[2], 1, 31, "day-of-month")?;
        let (months, _) = parse_field(fields[3], 1, 12, "month")?;
        let (mut weekdays, weekdays_restricted) = parse_field(fields[4], 0, 7, "day-of-week")?;
        if weekdays[7] {
            weekdays[0] = true;
        }
        Ok(Cron {
            minutes,
            hours,
            days,
            months,
            weekdays,
            days_restricted,
            weekdays_restricted,
        })
    }

    pub fn matches(&self, t: DateTime<Utc>) -> bool {
        let day_ok = self.days[t.day() as usize];
        let wd_ok = self.weekdays[t.weekday().num_days_from_sunday() as usize];
        // As in cron: when both day fields are restricted, either may match.
        let day_match = match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => day_ok || wd_ok,
            _ => day_ok && wd_ok,
        };
        self.minutes[t.minute() as usize]
            && self.hours[t.hour() as usize]
            && self.months[t.month() as usize]
            && day_match
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn parses_and_matches_times() {
        let daily = Cron::parse("0 4 * * *").unwrap();
        let t = Utc.with_ymd_and_hms(2026, 11, 30, 4, 0, 0).unwrap();
        assert!(daily.matches(t));
        assert!(!daily.matches(Utc.with_ymd_and_hms(2026, 11, 30, 4, 1, 0).unwrap()));
        let every5 = Cron::parse("*/5 * * * *").unwrap();
        assert!(every5.matches(Utc.with_ymd_and_hms(2026, 1, 1, 0, 5, 0).unwrap()));
        assert!(!every5.matches(Utc.with_ymd_and_hms(2026, 1, 1, 0, 3, 0).unwrap()));
        let sundays = Cron::parse("30 2 * * 7").unwrap();
        // 2026-11-29 is a Sunday.
        assert!(sundays.matches(Utc.with_ymd_and_hms(2026, 11, 29, 2, 30, 0).unwrap()));
        assert!(!sundays.matches(Utc.with_ymd_and_hms(2026, 11, 30, 2, 30, 0).unwrap()));
    }

    #[test]
    fn rejects_malformed_expressions() {
        for bad in [
            "",
            "* * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "*/0 * * * *",
            "a * * * *",
            "5-1 * * * *",
        ] {
            assert!(Cron::parse(bad).is_err(), "{bad:?}");
        }
    }
}
