//! Random runs: the world changes between passes, the operator dies between steps, and the
//! invariants hold after every pass.

use super::*;

#[derive(Clone, Debug)]
enum Event {
    /// A pass that dies after this many steps (the status not written); `usize::MAX`: a whole pass.
    Pass(usize),
    AgentEnds(i32, bool),
    AgentStuck(i32),
    ServerChanges(i32),
    ReplicaLeaves(i32),
    PodGone(i32),
    PodBack(i32),
    Bucket(bool),
    Minutes(i64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => prop_oneof![Just(usize::MAX), 0..3usize].prop_map(Event::Pass),
        2 => (0..2i32, any::<bool>()).prop_map(|(s, ok)| Event::AgentEnds(s, ok)),
        1 => (0..2i32).prop_map(Event::AgentStuck),
        1 => (0..2i32).prop_map(Event::ServerChanges),
        1 => (0..2i32).prop_map(Event::ReplicaLeaves),
        1 => (0..2i32).prop_map(Event::PodGone),
        1 => (0..2i32).prop_map(Event::PodBack),
        1 => any::<bool>().prop_map(Event::Bucket),
        1 => (0..15i64).prop_map(Event::Minutes),
    ]
}

impl Sim {
    fn apply(&mut self, e: &Event) {
        match e {
            Event::Pass(_) => {}
            Event::AgentEnds(s, ok) => {
                if self.jobs.get(s) == Some(&SimJob::Running) {
                    self.jobs.insert(
                        *s,
                        if *ok {
                            SimJob::Succeeded
                        } else {
                            SimJob::Failed
                        },
                    );
                }
            }
            Event::AgentStuck(s) => {
                if self.jobs.get(s) == Some(&SimJob::Running) {
                    self.jobs.insert(*s, SimJob::Stuck);
                }
            }
            Event::ServerChanges(s) => {
                if self.jobs.contains_key(s) && !self.recorded_done.contains(s) {
                    self.server_changed.insert(*s);
                }
            }
            Event::ReplicaLeaves(s) => self.condemn(&backup_replica(*s)),
            Event::PodGone(s) => {
                self.pod_gone.insert(backup_replica(*s));
                self.ready.remove(&backup_replica(*s));
                if self.jobs.contains_key(s) && !self.recorded_done.contains(s) {
                    self.server_changed.insert(*s);
                }
            }
            Event::PodBack(s) => {
                self.pod_gone.remove(&backup_replica(*s));
                self.ready.insert(backup_replica(*s));
            }
            Event::Bucket(up) => self.bucket_up = *up,
            Event::Minutes(m) => self.tick(m * 60),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever happens, in whatever order, with the operator dying between any two steps:
    /// never a second agent for a shard, never an agent off the recorded backup replica or
    /// beside a pod that is gone, Succeeded only with every shard's agent done on an unchanged
    /// server and the manifest written, Failed always with a reason and no manifest, and an
    /// ended backup never changes again. Once nothing fails any more, it ends.
    #[test]
    fn backups_keep_their_invariants_through_any_run(events in proptest::collection::vec(event(), 1..40)) {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        let mut ended: Option<ClickHouseBackupStatus> = None;
        for e in &events {
            sim.apply(e);
            let Event::Pass(limit) = e else { continue };
            sim.backup_pass(&mut b, *limit);
            let s = b.status.clone().unwrap_or_default();
            sim.recorded_done = s.shards.iter().filter(|sh| sh.done).map(|sh| sh.shard).collect();
            if let Some(done) = &ended {
                prop_assert_eq!(&s, done, "an ended backup never changes");
            }
            prop_assert!(sim.created.values().all(|n| *n <= 1), "{:?}", sim.created);
            match s.state {
                BackupState::Succeeded => {
                    prop_assert!(sim.manifest_written);
                    prop_assert!(SHARDS.iter().all(|sh| sim.jobs.get(sh) == Some(&SimJob::Succeeded)));
                    prop_assert!(sim.server_changed.is_empty());
                    prop_assert!(s.shards.iter().all(|sh| sh.done));
                    ended = Some(s);
                }
                BackupState::Failed => {
                    prop_assert!(s.reason.is_some() && s.message.is_some());
                    prop_assert!(s.manifest.is_none());
                    ended = Some(s);
                }
                _ => prop_assert!(s.reason.is_none()),
            }
        }
        // the world settles: every pod back, the bucket up, agents end well
        sim.bucket_up = true;
        for shard in SHARDS {
            sim.pod_gone.remove(&backup_replica(shard));
            sim.ready.insert(backup_replica(shard));
        }
        for _ in 0..6 {
            // a replica that left is never the backup replica again here: the wait ends
            sim.tick(WAIT_FOR_REPLICAS.as_secs() as i64 + 1);
            sim.backup_pass(&mut b, usize::MAX);
            for j in sim.jobs.values_mut() {
                if *j == SimJob::Running {
                    *j = SimJob::Succeeded;
                }
            }
        }
        let s = b.status.clone().unwrap();
        prop_assert!(matches!(s.state, BackupState::Succeeded | BackupState::Failed), "{:?}", s);
    }
}
