//! Events, aggregated the way Kubernetes' own recorder (client-go's `events` broadcaster)
//! aggregates them: one recorder for the whole operator remembers what it published, and an
//! Event that happens again (same object, type, reason, action and note) within
//! [`SERIES_ENDS_AFTER`] of its last occurrence is counted in the Event's `series` instead of
//! being written again. The second occurrence marks the Event as a series (`series.count` 2);
//! later ones are counted in memory and written at most every [`SERIES_REFRESH`], and once more
//! when the series ends (no occurrence for [`SERIES_ENDS_AFTER`]), with its final count.
//!
//! What to send for an occurrence is decided by the pure [`occur`] and [`ended`]; the
//! [`Recorder`] only holds the series and sends what they say.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use serde_json::json;
use tracing::warn;

use super::kube::{ignore_not_found, namespaced};
use crate::plan::{EventType, PlannedEvent};

/// A series ends once its Event did not happen again for this long (client-go's
/// `finishTime`); the next occurrence is a new Event.
pub const SERIES_ENDS_AFTER: SignedDuration = SignedDuration::from_mins(6);
/// A series that goes on is written at most this often (client-go's `refreshTime`).
pub const SERIES_REFRESH: SignedDuration = SignedDuration::from_mins(30);
/// An Event's note is cut to this many characters (the API's limit is 1 kB).
pub const NOTE_LIMIT: usize = 1000;

/// What makes two occurrences the same Event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The object the Event is about: its uid where it has one, else kind, namespace and name.
    pub regarding: String,
    pub warning: bool,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// One Event published and what happened to it since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    /// The Event object's name and namespace.
    pub name: String,
    pub namespace: String,
    /// How many times it happened, and how many the API server was last told.
    pub count: i32,
    pub written: i32,
    /// When it last happened, and when it was last written.
    pub last: Timestamp,
    pub written_at: Timestamp,
}

/// What an occurrence needs written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// A new Event.
    Create,
    /// The Event's series, with this count.
    Count(i32),
    /// Nothing: the occurrence is counted until the series is written next.
    Nothing,
}

/// PURE: an occurrence at `now` of an Event whose series is `series` (`None`: never published,
/// or its last write failed). Counts it in the series and says what to write.
pub fn occur(series: Option<&mut Series>, now: Timestamp) -> Write {
    let Some(s) = series.filter(|s| now.duration_since(s.last) < SERIES_ENDS_AFTER) else {
        return Write::Create;
    };
    s.count += 1;
    s.last = now;
    if s.written == 1 || now.duration_since(s.written_at) >= SERIES_REFRESH {
        Write::Count(s.count)
    } else {
        Write::Nothing
    }
}

/// PURE: whether the series has ended at `now`, and the final count still to be written, if any.
pub fn ended(series: &Series, now: Timestamp) -> Option<Option<i32>> {
    (now.duration_since(series.last) >= SERIES_ENDS_AFTER)
        .then(|| (series.count > series.written).then_some(series.count))
}

/// PURE: the Events of one pass, those of the same type, reason and action merged into one
/// whose note lists theirs in order (each once), so that a pass that creates ten objects
/// publishes one `Created` Event naming them, not ten. A note that would exceed [`NOTE_LIMIT`]
/// ends with how many more there were.
pub fn merge(events: &[PlannedEvent]) -> Vec<PlannedEvent> {
    let mut groups: Vec<(PlannedEvent, Vec<&str>)> = Vec::new();
    for e in events {
        let same = |g: &&mut (PlannedEvent, Vec<&str>)| {
            g.0.kind == e.kind && g.0.reason == e.reason && g.0.action == e.action
        };
        match groups.iter_mut().find(same) {
            Some((_, notes)) => {
                if !notes.contains(&e.message.as_str()) {
                    notes.push(&e.message);
                }
            }
            None => groups.push((e.clone(), vec![&e.message])),
        }
    }
    groups
        .into_iter()
        .map(|(mut e, notes)| {
            e.message = join_within(&notes, NOTE_LIMIT);
            e
        })
        .collect()
}

/// `notes` joined with "; ", within `limit` characters: the notes that fit, then "; and N more".
fn join_within(notes: &[&str], limit: usize) -> String {
    let mut out = String::new();
    for (i, n) in notes.iter().enumerate() {
        let sep = if out.is_empty() { "" } else { "; " };
        let rest = notes.len() - i - 1;
        let tail = if rest > 0 {
            format!("; and {rest} more").chars().count()
        } else {
            0
        };
        if out.chars().count() + sep.len() + n.chars().count() + tail > limit {
            if out.is_empty() {
                // a single note too long on its own: cut
                return n.chars().take(limit).collect();
            }
            out.push_str(&format!("; and {} more", notes.len() - i));
            return out;
        }
        out.push_str(sep);
        out.push_str(n);
    }
    out
}

/// The operator's one recorder of Events (see the module's documentation).
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    series: Mutex<HashMap<Key, Series>>,
}

fn regarding_key(o: &ObjectReference) -> String {
    match &o.uid {
        Some(uid) => uid.clone(),
        None => format!(
            "{}/{}/{}",
            o.kind.as_deref().unwrap_or_default(),
            o.namespace.as_deref().unwrap_or_default(),
            o.name.as_deref().unwrap_or_default()
        ),
    }
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            series: Mutex::default(),
        }
    }

    /// Publishes `event` about the object `regarding` (its note cut to [`NOTE_LIMIT`]), or counts
    /// it in its series. A write that fails is logged and never fails the pass.
    pub async fn publish(&self, regarding: &ObjectReference, event: &PlannedEvent) {
        let note: String = event.message.chars().take(NOTE_LIMIT).collect();
        let key = Key {
            regarding: regarding_key(regarding),
            warning: event.kind == EventType::Warning,
            reason: event.reason.to_string(),
            action: event.action.to_string(),
            note,
        };
        let now = Timestamp::now();
        let (send, name) = {
            let mut all = self.series.lock().expect("never poisoned");
            let send = occur(all.get_mut(&key), now);
            (send, all.get(&key).map(|s| s.name.clone()))
        };
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        match send {
            Write::Nothing => {}
            Write::Create => {
                let name = format!(
                    "{}.{:x}",
                    regarding
                        .name
                        .as_deref()
                        .unwrap_or(&self.reporter.controller),
                    now.as_nanosecond()
                );
                match self.create(regarding, &key, &name, &namespace, now).await {
                    Ok(()) => {
                        let s = Series {
                            name,
                            namespace,
                            count: 1,
                            written: 1,
                            last: now,
                            written_at: now,
                        };
                        self.series.lock().expect("never poisoned").insert(key, s);
                    }
                    Err(e) => {
                        // tried again as a new Event at the next occurrence
                        self.series.lock().expect("never poisoned").remove(&key);
                        warn!(error = %e, reason = event.reason, "cannot publish event");
                    }
                }
            }
            Write::Count(count) => {
                let name = name.expect("a series that counts has an Event");
                match self.count(&name, &namespace, count, now).await {
                    Ok(()) => self.written(&key, count, now),
                    Err(e) => warn!(error = %e, reason = event.reason, "cannot count event"),
                }
            }
        }
    }

    /// Writes the final count of the series that ended and forgets them; the operator calls it
    /// every minute ([`Recorder::run`]).
    pub async fn end_series(&self) {
        let now = Timestamp::now();
        let done: Vec<(Key, Series, Option<i32>)> = {
            let mut all = self.series.lock().expect("never poisoned");
            let ended: Vec<(Key, Series, Option<i32>)> = all
                .iter()
                .filter_map(|(k, s)| ended(s, now).map(|last| (k.clone(), s.clone(), last)))
                .collect();
            for (k, _, _) in &ended {
                all.remove(k);
            }
            ended
        };
        for (key, s, last) in done {
            if let Some(count) = last
                && let Err(e) = self.count(&s.name, &s.namespace, count, s.last).await
            {
                warn!(error = %e, reason = key.reason, "cannot write the final count of an event");
            }
        }
    }

    /// Ends the series that ended, every minute, until the operator stops.
    pub async fn run(&self) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
        loop {
            tick.tick().await;
            self.end_series().await;
        }
    }

    fn written(&self, key: &Key, count: i32, now: Timestamp) {
        if let Some(s) = self.series.lock().expect("never poisoned").get_mut(key) {
            s.written = s.written.max(count);
            s.written_at = now;
        }
    }

    async fn create(
        &self,
        regarding: &ObjectReference,
        key: &Key,
        name: &str,
        namespace: &str,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let event = Event {
            action: Some(key.action.clone()),
            reason: Some(key.reason.clone()),
            note: Some(key.note.clone()),
            type_: Some(if key.warning { "Warning" } else { "Normal" }.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            ..Event::default()
        };
        namespaced::<Event>(&self.client, namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
    }

    /// Writes the series of Event `name`; an Event gone meanwhile (Events live an hour) is not
    /// written again.
    async fn count(
        &self,
        name: &str,
        namespace: &str,
        count: i32,
        last: Timestamp,
    ) -> Result<(), kube::Error> {
        let series = EventSeries {
            count,
            last_observed_time: MicroTime(last),
        };
        ignore_not_found(
            namespaced::<Event>(&self.client, namespace)
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "series": series })),
                )
                .await,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn event(reason: &'static str, message: &str) -> PlannedEvent {
        PlannedEvent {
            kind: EventType::Normal,
            reason,
            action: "Apply",
            message: message.into(),
        }
    }

    /// Simulates the recorder's bookkeeping for occurrences at the given seconds: what each
    /// occurrence sends.
    fn sends(times: &[i64]) -> Vec<Write> {
        let mut series: Option<Series> = None;
        times
            .iter()
            .map(|t| {
                let now = at(*t);
                let send = occur(series.as_mut(), now);
                match send {
                    Write::Create => {
                        series = Some(Series {
                            name: "e".into(),
                            namespace: "ns".into(),
                            count: 1,
                            written: 1,
                            last: now,
                            written_at: now,
                        })
                    }
                    Write::Count(c) => {
                        let s = series.as_mut().unwrap();
                        s.written = c;
                        s.written_at = now;
                    }
                    Write::Nothing => {}
                }
                send
            })
            .collect()
    }

    #[test]
    fn a_repeated_event_is_created_once_marked_a_series_once_and_then_only_counted() {
        assert_eq!(
            sends(&[0, 10, 20, 30, 40]),
            [
                Write::Create,
                Write::Count(2),
                Write::Nothing,
                Write::Nothing,
                Write::Nothing
            ]
        );
    }

    #[test]
    fn an_event_that_did_not_happen_for_six_minutes_is_a_new_event() {
        assert_eq!(
            sends(&[0, 10, 10 + 6 * 60]),
            [Write::Create, Write::Count(2), Write::Create]
        );
    }

    #[test]
    fn a_series_that_goes_on_is_written_again_every_thirty_minutes() {
        // an occurrence every 5 minutes: the series never ends
        let times: Vec<i64> = (0..9).map(|i| i * 300).collect();
        let s = sends(&times);
        assert_eq!(s[0], Write::Create);
        assert_eq!(s[1], Write::Count(2));
        // written at 300 s; the next write is due at 300 + 1800 = 2100 s, the 8th occurrence
        assert!(s[2..7].iter().all(|x| *x == Write::Nothing), "{s:?}");
        assert_eq!(s[7], Write::Count(8));
        assert_eq!(s[8], Write::Nothing);
    }

    #[test]
    fn an_ended_series_writes_its_final_count_only_when_some_occurrence_was_not_written() {
        let mut s = Series {
            name: "e".into(),
            namespace: "ns".into(),
            count: 5,
            written: 2,
            last: at(0),
            written_at: at(0),
        };
        assert_eq!(ended(&s, at(60)), None, "still going");
        assert_eq!(ended(&s, at(6 * 60)), Some(Some(5)));
        s.written = 5;
        assert_eq!(ended(&s, at(6 * 60)), Some(None));
    }

    #[test]
    fn a_pass_publishes_one_event_per_type_reason_and_action_naming_each_object_once() {
        let merged = merge(&[
            event("Created", "created ConfigMap c1-common"),
            event("Applied", "applied StatefulSet c1-keeper"),
            event("Created", "created Secret c1-users"),
            event("Created", "created ConfigMap c1-common"),
            PlannedEvent {
                kind: EventType::Warning,
                ..event("Created", "created Service c1")
            },
        ]);
        let shown: Vec<(EventType, &str, &str)> = merged
            .iter()
            .map(|e| (e.kind, e.reason, e.message.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                (
                    EventType::Normal,
                    "Created",
                    "created ConfigMap c1-common; created Secret c1-users"
                ),
                (
                    EventType::Normal,
                    "Applied",
                    "applied StatefulSet c1-keeper"
                ),
                (EventType::Warning, "Created", "created Service c1"),
            ]
        );
    }

    #[test]
    fn a_merged_note_beyond_the_limit_ends_with_how_many_more_there_were() {
        let notes: Vec<String> = (0..100)
            .map(|i| format!("created ConfigMap c1-{i:03}"))
            .collect();
        let events: Vec<PlannedEvent> = notes.iter().map(|n| event("Created", n)).collect();
        let merged = merge(&events);
        assert_eq!(merged.len(), 1);
        let note = &merged[0].message;
        assert!(note.chars().count() <= NOTE_LIMIT, "{}", note.len());
        let shown = note.matches("created ConfigMap").count();
        assert!(shown > 10 && shown < 100, "{note}");
        assert!(
            note.ends_with(&format!("; and {} more", 100 - shown)),
            "{note}"
        );
        // one note too long on its own is cut
        let long = "x".repeat(3000);
        assert_eq!(
            merge(&[event("Created", &long)])[0].message.len(),
            NOTE_LIMIT
        );
    }
}
