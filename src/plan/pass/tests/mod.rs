//! A pass against a simulated API server: applied objects are stored, StatefulSets get a
//! revision per template and one Ready pod, deleted pods come back on the current revision.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::{Phase, json_of};
use crate::api::{ClickHouseCluster, ClusterState, ReplicaName, ReplicaState, ReplicaStatus};
use crate::model;
use crate::plan::facts::{Kind, Observed, serves_tls};
use crate::plan::report::report;
use crate::plan::scale_in::ScaleInAction;
use crate::plan::step::{Outcome, Step};
use crate::plan::{Plan, World, decide};
use crate::testing::{self, now};
use k8s_openapi::api::apps::v1::StatefulSetStatus;
use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

mod credentials;
mod external_keeper;
mod keeper;
mod lifecycle;
mod recovery;
mod rollout;
mod servers;
mod storage;

struct Sim {
    cluster: ClickHouseCluster,
    obs: Observed,
    log: Vec<String>,
    /// Pods that do not come back ready (a broken replica).
    broken: BTreeSet<String>,
    /// Pods of a template with this image cannot pull it (ErrImagePull).
    bad_image: Option<String>,
    /// The Keeper ensemble's committed voting members (raft ids), as every Ready member
    /// reports it: its leader follows the applied member list one change at a time.
    ensemble: Vec<u32>,
    /// The leader applies no membership change (a member list not yet loaded).
    ensemble_frozen: bool,
    /// The version every Ready server reports (`SELECT version()`); `None`: none answers it.
    server_version: Option<String>,
    /// The Keeper pod that leads: it keeps leading while Ready; when it is not, the Ready
    /// member of the highest ordinal is elected. Every change is logged.
    keeper_leader: Option<String>,
}

fn revision(template: &Value) -> String {
    let mut h = DefaultHasher::new();
    template.to_string().hash(&mut h);
    format!("r{:x}", h.finish())
}

/// The StatefulSets a plan applies, in order.
fn statefulsets_applied(p: &Plan) -> Vec<&String> {
    p.steps
        .iter()
        .filter_map(|a| match a {
            Step::Apply {
                kind: Kind::StatefulSet,
                name,
                ..
            } => Some(name),
            _ => None,
        })
        .collect()
}

fn err_image_pull() -> Vec<k8s_openapi::api::core::v1::ContainerStatus> {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus};
    vec![ContainerStatus {
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ErrImagePull".into()),
                message: Some("no such image".into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]
}

impl Sim {
    fn new(spec: serde_json::Value) -> Sim {
        let mut cluster = testing::cluster(spec);
        cluster.metadata.creation_timestamp = Some(Time(now()));
        let mut obs = Observed {
            operator_secret_present: true,
            ..Observed::default()
        };
        obs.inputs.operator_password = model::Password("pw".into());
        obs.inputs.exporter_password = Some(model::Password("exporter-pw".into()));
        Sim {
            cluster,
            obs,
            log: Vec::new(),
            broken: BTreeSet::new(),
            bad_image: None,
            ensemble: Vec::new(),
            ensemble_frozen: false,
            server_version: None,
            keeper_leader: None,
        }
    }

    /// How many members the applied Keeper ConfigMap lists.
    fn keeper_listed(&self) -> Option<u32> {
        let cm = self
            .obs
            .objects
            .get(&(Kind::ConfigMap, "c1-keeper".into()))?;
        let file = cm["data"][model::names::KEEPER_CONFIG_FILE].as_str()?;
        Some(file.matches("<server>").count() as u32)
    }

    /// Keeper's leader: a first start commits the whole list; later, one member added (once
    /// its pod runs) or removed per pass.
    fn keeper_leader(&mut self) {
        let mut ready: Vec<(i32, String)> = self
            .obs
            .pods
            .iter()
            .filter(|(_, p)| crate::plan::facts::pod_ready(p))
            .filter_map(|(n, _)| Some((n.strip_prefix("c1-keeper-")?.parse().ok()?, n.clone())))
            .collect();
        ready.sort();
        let ready: Vec<String> = ready.into_iter().map(|(_, n)| n).collect();
        if self
            .keeper_leader
            .as_ref()
            .is_none_or(|l| !ready.contains(l))
        {
            let elected = ready.last().cloned();
            if elected.is_some() {
                self.log.push(format!("keeper leader {elected:?}"));
            }
            self.keeper_leader = elected;
        }
        let Some(n) = self.keeper_listed() else {
            return;
        };
        let want: Vec<u32> = (1..=n).collect();
        let running = |sim: &Sim, id: u32| {
            sim.obs
                .pods
                .get(&format!("c1-keeper-{}", id - 1))
                .is_some_and(crate::plan::facts::pod_ready)
        };
        if self.ensemble.is_empty() {
            self.ensemble = want;
        } else if !self.ensemble_frozen {
            if let Some(id) = want.iter().find(|id| !self.ensemble.contains(id)) {
                if running(self, *id) {
                    self.ensemble.push(*id);
                    self.ensemble.sort();
                }
            } else if let Some(i) = self.ensemble.iter().position(|id| !want.contains(id)) {
                self.ensemble.remove(i);
            }
        }
    }

    fn plan(&self) -> Plan {
        let world = World {
            limits: Default::default(),
            clusters_in_namespace: Vec::new(),
            observed: {
                // The other replicas have nothing to fetch from a pod out of traffic.
                let mut obs = self.obs.clone();
                for (pod, p) in &self.obs.pods {
                    let serving = p
                        .metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(model::labels::SERVING));
                    if !serving && !pod.contains("keeper") {
                        obs.pending_fetches
                            .insert(pod.strip_suffix("-0").unwrap_or(pod).to_string(), Some(0));
                    }
                    if let Some(v) = &self.server_version
                        && !pod.contains("keeper")
                        && crate::plan::facts::pod_ready(p)
                    {
                        obs.server_versions
                            .insert(pod.strip_suffix("-0").unwrap_or(pod).to_string(), v.clone());
                    }
                    if pod.contains("keeper") && crate::plan::facts::pod_ready(p) {
                        obs.keeper_views.insert(
                            pod.clone(),
                            crate::plan::facts::MemberView::Voters(self.ensemble.clone()),
                        );
                        use crate::plan::facts::KeeperRole;
                        let others = self
                            .obs
                            .pods
                            .iter()
                            .filter(|(o, p)| {
                                o.contains("keeper")
                                    && *o != pod
                                    && crate::plan::facts::pod_ready(p)
                            })
                            .count() as u32;
                        let role = if self.keeper_leader.as_ref() == Some(pod) {
                            KeeperRole::Leader {
                                synced_followers: others,
                            }
                        } else {
                            KeeperRole::Follower
                        };
                        obs.keeper_roles.insert(pod.clone(), role);
                    }
                }
                obs
            },
        };
        decide(&self.cluster, &world, now())
    }

    fn make_pod(&mut self, sts: &str) {
        let s = &self.obs.statefulsets[sts];
        let rev = s.status.as_ref().unwrap().update_revision.clone().unwrap();
        let name = format!("{sts}-0");
        let bad = self.pulls_bad_image(sts);
        let ready = !self.broken.contains(&name) && !bad;
        // The pod carries its template's labels (in traffic) and its revision.
        let mut labels: BTreeMap<String, String> = s
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert("controller-revision-hash".to_string(), rev);
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            status: Some(PodStatus {
                pod_ip: Some("198.18.1.1".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    // Ready for a minute already (past the DNS settling time of a new pod).
                    last_transition_time: Some(Time(
                        now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
                    )),
                    ..Default::default()
                }]),
                container_statuses: bad.then(err_image_pull),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.obs.pods.insert(name, pod);
    }

    fn pulls_bad_image(&self, sts: &str) -> bool {
        let image = json_of(&self.obs.statefulsets[sts].spec)["template"]["spec"]["containers"][0]
            ["image"]
            .as_str()
            .map(str::to_string);
        self.bad_image.is_some() && image == self.bad_image
    }

    /// The StatefulSet controller: pods for StatefulSets that have none; none for those at 0.
    /// Then Keeper's leader.
    fn settle(&mut self) {
        self.settle_pods();
        self.keeper_leader();
    }

    fn settle_pods(&mut self) {
        let names: Vec<String> = self.obs.statefulsets.keys().cloned().collect();
        for n in names {
            let replicas = self.obs.statefulsets[&n].spec.replicas.unwrap_or(1);
            let keeper = n.ends_with("-keeper");
            // The native RollingUpdate replaces one pod of an old revision at a time, highest
            // ordinal first, and only while every pod is Ready (it never replaces a broken one).
            let sts = &self.obs.statefulsets[&n];
            let native = sts
                .spec
                .update_strategy
                .as_ref()
                .and_then(|u| u.type_.as_deref())
                == Some("RollingUpdate");
            let rev = sts.status.as_ref().and_then(|s| s.update_revision.clone());
            let all_ready = (0..replicas).all(|i| {
                self.obs
                    .pods
                    .get(&format!("{n}-{i}"))
                    .is_some_and(crate::plan::facts::pod_ready)
            });
            let oldest = (0..replicas).rev().map(|i| format!("{n}-{i}")).find(|pod| {
                self.obs.pods.get(pod).is_some_and(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("controller-revision-hash"))
                        != rev.as_ref()
                })
            });
            if native
                && all_ready
                && let Some(pod) = oldest
            {
                self.log.push(format!("controller replaces pod {pod}"));
                self.obs.pods.remove(&pod);
            }
            for i in 0..replicas {
                let pod = format!("{n}-{i}");
                if !self.obs.pods.contains_key(&pod) {
                    if keeper {
                        let rev = self.obs.statefulsets[&n]
                            .status
                            .as_ref()
                            .unwrap()
                            .update_revision
                            .clone()
                            .unwrap();
                        let mut p = Pod::default();
                        p.metadata.name = Some(pod.clone());
                        // a member runs its template's containers
                        p.spec = self.obs.statefulsets[&n].spec.template.spec.clone();
                        p.metadata.labels = Some(BTreeMap::from([(
                            "controller-revision-hash".to_string(),
                            rev,
                        )]));
                        let bad = self.pulls_bad_image(&n);
                        let ready = !bad && !self.broken.contains(&pod);
                        p.status = Some(PodStatus {
                            conditions: Some(vec![PodCondition {
                                type_: "Ready".into(),
                                status: if ready { "True" } else { "False" }.into(),
                                // the simulation's clock stands: Ready for a minute already
                                last_transition_time: Some(Time(
                                    now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
                                )),
                                ..Default::default()
                            }]),
                            container_statuses: bad.then(err_image_pull),
                            ..Default::default()
                        });
                        self.obs.pods.insert(pod, p);
                    } else {
                        self.make_pod(&n);
                    }
                }
            }
            let prefix = format!("{n}-");
            self.obs.pods.retain(|p, _| {
                p.strip_prefix(&prefix)
                    .and_then(|o| o.parse::<i32>().ok())
                    .is_none_or(|o| o < replicas)
            });
        }
    }

    /// Runs one plan as the executor would, against the simulation.
    fn act(&mut self, plan: &Plan) {
        for a in &plan.steps {
            self.log.push(a.describe());
            match a {
                Step::Apply {
                    kind: Kind::StatefulSet,
                    name,
                    object,
                    ..
                } => {
                    let mut sts: StatefulSet = serde_json::from_value(object.clone()).unwrap();
                    let generation = self
                        .obs
                        .statefulsets
                        .get(name)
                        .and_then(|s| s.metadata.generation)
                        .unwrap_or(0)
                        + 1;
                    sts.metadata.generation = Some(generation);
                    // the StatefulSet controller creates the missing PVCs of its pods
                    for t in sts.spec.volume_claim_templates.iter().flatten() {
                        for i in 0..sts.spec.replicas.unwrap_or(1) {
                            let pvc = format!("{}-{name}-{i}", t.metadata.name.clone().unwrap());
                            self.obs.pvcs.entry(pvc.clone()).or_insert_with(|| {
                                let mut p = PersistentVolumeClaim {
                                    metadata: t.metadata.clone(),
                                    spec: t.spec.clone(),
                                    ..Default::default()
                                };
                                p.metadata.name = Some(pvc);
                                p
                            });
                        }
                    }
                    sts.status = Some(StatefulSetStatus {
                        observed_generation: Some(generation),
                        update_revision: Some(revision(&object["spec"]["template"])),
                        ..Default::default()
                    });
                    self.obs.statefulsets.insert(name.clone(), sts);
                }
                Step::Apply {
                    kind, name, object, ..
                } => {
                    self.obs
                        .objects
                        .insert((*kind, name.clone()), object.clone());
                }
                Step::SetServing { pod, serving, .. } => {
                    if let Some(l) = self
                        .obs
                        .pods
                        .get_mut(pod)
                        .and_then(|p| p.metadata.labels.as_mut())
                    {
                        if *serving {
                            l.insert(model::labels::SERVING.into(), "true".into());
                        } else {
                            l.remove(model::labels::SERVING);
                        }
                    }
                }
                Step::RestartPod { pod, .. } => {
                    self.obs.pods.remove(pod);
                    if self.keeper_leader.as_ref() == Some(pod) {
                        self.keeper_leader = None;
                    }
                }
                Step::MigrateSchema { .. }
                | Step::DropDnsCache { .. }
                | Step::EnsureKeeperRoot { .. } => {}
                Step::ScaleIn(s) => {
                    if let ScaleInAction::DeleteStatefulSet { replica } = s {
                        self.obs.statefulsets.remove(replica.as_str());
                        self.obs.pods.remove(&format!("{replica}-0"));
                    }
                }
                Step::OrphanStatefulSet { name } => {
                    self.obs.statefulsets.remove(name);
                }
                Step::LabelPvc {
                    name,
                    labels,
                    annotations,
                } => {
                    let m = &mut self.obs.pvcs.get_mut(name).unwrap().metadata;
                    m.labels.get_or_insert_default().extend(labels.clone());
                    m.annotations
                        .get_or_insert_default()
                        .extend(annotations.clone());
                }
                Step::ResizePvc { name, size } => {
                    let pvc = self.obs.pvcs.get_mut(name).unwrap();
                    pvc.spec
                        .as_mut()
                        .unwrap()
                        .resources
                        .as_mut()
                        .unwrap()
                        .requests = Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(size.clone()),
                    )]));
                }
                Step::Delete {
                    kind: Kind::StatefulSet,
                    name,
                } => {
                    self.obs.statefulsets.remove(name);
                }
                Step::Delete { kind, name } => {
                    self.obs.objects.remove(&(*kind, name.clone()));
                }
                Step::AddExporterPassword => {
                    self.obs.inputs.exporter_password = Some(model::Password("added".into()));
                }
                Step::AdoptOperatorSecret => {
                    self.obs.operator_secret_orphaned = false;
                }
                Step::PublishExporterCredentials => {
                    self.obs.exporter_credentials_published = Some(true);
                }
                other => panic!("unexpected action {other:?}"),
            }
        }
        let outcome = Outcome {
            done: (0..plan.steps.len()).collect(),
            ..Outcome::default()
        };
        let (status, _) = report(plan, &outcome, self.cluster.metadata.generation, now());
        // every status the operator would write keeps the replica state machine (S0-06)
        let old = self
            .cluster
            .status
            .as_ref()
            .map(|s| s.replica_state_map.clone())
            .unwrap_or_default();
        if let Some(why) =
            crate::plan::replicas::map_change_refused(&old, &status.replica_state_map)
        {
            panic!("{why}: {old:?} → {:?}", status.replica_state_map);
        }
        self.cluster.status = Some(status);
        self.settle();
    }

    /// A plan, with the replication lag it asks for read as caught up (as the controller
    /// reads it and decides again).
    fn plan_caught_up(&mut self) -> Plan {
        let p = self.plan();
        if p.lag_checks.is_empty() {
            return p;
        }
        for r in &p.lag_checks {
            self.obs.caught_up.insert(r.to_string(), true);
        }
        self.plan()
    }

    /// Passes until nothing is left to do (or `max` passes). Returns the number of passes.
    fn converge(&mut self, max: usize) -> usize {
        for i in 0..max {
            let p = self.plan_caught_up();
            if p.steps.is_empty() && !p.again {
                self.cluster.status = Some(p.status);
                return i;
            }
            self.act(&p);
            self.obs.caught_up.clear();
        }
        panic!(
            "no convergence in {max} passes: {:?} {:?}",
            self.log.iter().rev().take(10).collect::<Vec<_>>(),
            self.cluster.status.as_ref().and_then(|s| s.message.clone())
        );
    }

    fn state(&self) -> ClusterState {
        self.cluster.status.as_ref().unwrap().state
    }

    /// The status message, empty when there is none.
    fn message(&self) -> String {
        let status = self.cluster.status.as_ref().unwrap();
        status.message.clone().unwrap_or_default()
    }

    fn map(&self) -> &BTreeMap<ReplicaName, ReplicaStatus> {
        &self.cluster.status.as_ref().unwrap().replica_state_map
    }
}

/// The pods of the servers, as (name, uid-less revision label) pairs, to count restarts.
fn server_restarts(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| l.starts_with("restart pod c1-") && !l.contains("keeper"))
        .collect()
}

/// A file of the applied users Secret `c1-users`.
fn users_secret_file(sim: &Sim, key: &str) -> String {
    let object = sim
        .obs
        .objects
        .get(&(Kind::Secret, "c1-users".into()))
        .expect("the users Secret is applied");
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(object.clone()).unwrap();
    String::from_utf8(secret.data.unwrap()[key].0.clone()).unwrap()
}
