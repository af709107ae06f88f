//! `clickhouse-operator plan -f cluster.yaml` against the cluster that runs (docs/operations.md,
//! "The commands"): what applying the file would do, decided by the operator's own code and never
//! acted on. It reads the live resource, its objects, its pods and its servers exactly as a pass
//! observes them (only reads: no write of any kind), puts the file's spec in place of the live one,
//! and shows the change classification (`model::changes`), the first pass's steps (`plan::decide`),
//! the whole restart order (`plan::rollout::waves`, the rollout's own decision function run pass
//! after pass), the replicas a scale-in condemns, and what is refused.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use super::Error;
use super::observe::{observe_with, read_lag, siblings};
use crate::api::{ClickHouseCluster, ReplicaState};
use crate::controller::kube::namespaced;
use crate::model::changes::{Need, classify};
use crate::model::names;
use crate::plan::facts::Kind;
use crate::plan::step::Step;
use crate::plan::{FailureReason, Plan, World, decide, rollout};

/// What applying a file would do.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    pub namespace: String,
    pub cluster: String,
    /// The resource exists (else: what creating it would do).
    pub live: bool,
    /// The live state and generation.
    pub state: Option<String>,
    /// Per component, each changed field and what it needs.
    pub changes: Vec<String>,
    /// Server pods restarted, wave by wave (a wave restarts together).
    pub restarts: Vec<Vec<String>>,
    /// Replicas removed by a scale-in.
    pub condemned: Vec<String>,
    /// What the operator refuses to do, with the reason.
    pub refused: Vec<String>,
    /// What the first pass would do.
    pub first_pass: Vec<String>,
    /// The objects the first pass writes, each changed field with its old and new value.
    pub objects: Vec<String>,
    /// What the first pass would wait for.
    pub waiting: Option<String>,
    /// 0 nothing to do, 2 changes, 1 refused or invalid.
    pub exit_code: i32,
}

fn need(n: Need) -> &'static str {
    match n {
        Need::ObjectUpdate => "objects updated, no restart",
        Need::Scale => "replicas added or removed, no restart",
        Need::ConfigReload => "reloaded by the servers, no restart",
        Need::PvcResize => "volumes grown in place, no restart",
        Need::RollingRestart => "rolling restart",
        Need::StopAll => "every pod stopped, data kept",
        Need::StartAll => "every pod started again",
        Need::FullStopStart => "full stop and start",
        Need::Refused => "refused",
    }
}

/// A step that changes something in Kubernetes or in the servers' data (the DNS cache drop of
/// a fresh pod changes nothing).
fn changes_something(a: &Step) -> bool {
    !matches!(a, Step::DropDnsCache { .. })
}

/// The fields of `desired` whose value `observed` does not have, as `path: old → new` (the
/// object hashes the operator stamps are left out: they follow from the rest). A Secret's
/// `data` and `stringData` are named, never shown (review L-7): `path: changed (Secret data
/// not shown)`.
pub fn changed_fields(observed: &Value, desired: &Value) -> Vec<String> {
    fn short(v: &Value) -> String {
        let s = match v {
            Value::Null => "(none)".to_string(),
            other => other.to_string(),
        };
        if s.chars().count() > 80 {
            format!("{}…", s.chars().take(80).collect::<String>())
        } else {
            s
        }
    }
    fn walk(path: &str, o: &Value, d: &Value, out: &mut Vec<String>) {
        match (o, d) {
            (Value::Object(om), Value::Object(dm)) => {
                for (k, dv) in dm {
                    if k.contains("hash") || (path.is_empty() && k == "status") {
                        continue;
                    }
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&p, om.get(k).unwrap_or(&Value::Null), dv, out);
                }
            }
            (Value::Array(oa), Value::Array(da)) if oa.len() == da.len() => {
                for (i, (ov, dv)) in oa.iter().zip(da).enumerate() {
                    walk(&format!("{path}[{i}]"), ov, dv, out);
                }
            }
            (Value::String(os), Value::String(ds))
                if os != ds && (os.contains('\n') || ds.contains('\n')) =>
            {
                // a file: its first line that differs, so that the change shows
                let (ol, dl): (Vec<&str>, Vec<&str>) = (os.lines().collect(), ds.lines().collect());
                let n = ol.iter().zip(&dl).take_while(|(a, b)| a == b).count();
                let line = |l: &[&str]| {
                    l.get(n)
                        .map_or(Value::Null, |s| Value::String(s.trim().to_string()))
                };
                out.push(format!(
                    "{path} line {}: {} → {}",
                    n + 1,
                    short(&line(&ol)),
                    short(&line(&dl))
                ));
            }
            (o, d) if o != d => out.push(format!("{path}: {} → {}", short(o), short(d))),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let mut d = desired.clone();
    if let Some(m) = d.get_mut("metadata").and_then(Value::as_object_mut) {
        m.retain(|k, _| matches!(k.as_str(), "labels" | "annotations"));
    }
    let secret = desired.get("kind").and_then(Value::as_str) == Some("Secret")
        || observed.get("kind").and_then(Value::as_str) == Some("Secret");
    if secret && let Some(m) = d.as_object_mut() {
        for field in ["data", "stringData"] {
            let Some(Value::Object(dm)) = m.remove(field) else {
                continue;
            };
            let om = observed.get(field).and_then(Value::as_object);
            for (k, v) in dm {
                if om.and_then(|o| o.get(&k)) != Some(&v) {
                    out.push(format!("{field}.{k}: changed (Secret data not shown)"));
                }
            }
        }
    }
    walk("", observed, &d, &mut out);
    out
}

/// Decides what applying `file` would do to the cluster of its name, reading through `client`,
/// with the operator-level `defaults` merged under both the running and the file's spec as the
/// operator merges them (decision 52).
pub async fn preview(
    client: &Client,
    file: &ClickHouseCluster,
    defaults: &crate::api::defaults::ClusterDefaults,
) -> Result<Preview, Error> {
    let mut file = file.clone();
    file.spec = defaults
        .apply(&file.spec)
        .map_err(|e| Error::failed(FailureReason::InvalidSpec, e))?;
    let file = &file;
    let ns = file
        .namespace()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let name = file.name_any();
    let api: Api<ClickHouseCluster> = namespaced(client, &ns);
    let mut live = api.get_opt(&name).await?;
    if let Some(l) = live.as_mut() {
        l.spec = defaults
            .apply(&l.spec)
            .map_err(|e| Error::failed(FailureReason::InvalidSpec, e))?;
    }
    let mut out = Preview {
        namespace: ns.clone(),
        cluster: name.clone(),
        live: live.is_some(),
        ..Preview::default()
    };
    let proposed = match &live {
        Some(l) => {
            let mut p = l.clone();
            p.spec = file.spec.clone();
            let annotations = p.metadata.annotations.get_or_insert_with(Default::default);
            for (k, v) in file.annotations() {
                annotations.insert(k.clone(), v.clone());
            }
            if l.spec != file.spec {
                p.metadata.generation = Some(l.metadata.generation.unwrap_or(0) + 1);
            }
            let s = l.status.clone().unwrap_or_default();
            out.state = Some(format!(
                "{}, generation {}",
                s.state,
                l.metadata.generation.unwrap_or(0)
            ));
            let changes = classify(&l.spec, &file.spec);
            for (component, c) in [("servers", &changes.server), ("keeper", &changes.keeper)] {
                for r in c.reasons() {
                    out.changes
                        .push(format!("{component}: {} → {}", r.field, need(r.need)));
                    if r.need == Need::Refused {
                        out.refused.push(format!("{component}: {}", r.field));
                    }
                }
            }
            p
        }
        None => {
            let mut p = file.clone();
            p.metadata.namespace = Some(ns.clone());
            p.metadata
                .uid
                .get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
            p.metadata.generation.get_or_insert(1);
            out.changes.push("the cluster is created".into());
            p
        }
    };
    let clusters: Vec<std::sync::Arc<ClickHouseCluster>> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(std::sync::Arc::new)
        .collect();
    let connections = crate::clickhouse::Connections::default();
    let mut world = observe_with(
        &proposed,
        client,
        siblings(&proposed, &clusters),
        &crate::runtime::settings::operator_networks_from_env(),
        &connections,
    )
    .await?;
    world.observed.default_storage_classes = defaults.storage_classes();
    world.limits =
        crate::api::validate::Limits::from_lookup(|k| std::env::var(k).ok()).unwrap_or_default();
    let mut plan = decide(&proposed, &world, Timestamp::now());
    if !plan.lag_checks.is_empty() {
        read_lag(&proposed, &mut world, &plan.lag_checks, &connections).await;
        plan = decide(&proposed, &world, Timestamp::now());
    }
    fill(&mut out, &plan, &world, &proposed, live.as_ref());
    Ok(out)
}

/// The rest of a preview, from the first pass's plan over `world`: what is refused or waited
/// for, the first pass's steps and changed fields, the restart order, the replicas condemned
/// and the exit code.
fn fill(
    out: &mut Preview,
    plan: &Plan,
    world: &World,
    proposed: &ClickHouseCluster,
    live: Option<&ClickHouseCluster>,
) {
    if let Some(f) = &plan.failure {
        match f.reason {
            FailureReason::InvalidSpec
            | FailureReason::MissingSecret
            | FailureReason::ShardRemovalRefused
            | FailureReason::StorageChangeRefused
            | FailureReason::NamespaceConflict
            | FailureReason::NameConflict => {
                if !out.refused.iter().any(|r| f.message.contains(r.as_str())) {
                    out.refused.push(f.message.clone());
                }
            }
            _ => out.waiting = Some(f.message.clone()),
        }
    }
    out.first_pass = plan
        .steps
        .iter()
        .filter(|a| changes_something(a))
        .map(Step::describe)
        .collect();
    for a in &plan.steps {
        if let Step::Apply {
            kind,
            name,
            object,
            create,
        } = a
        {
            let title = format!("{} {name}", kind.as_str());
            if *create {
                out.objects.push(format!("{title}: created"));
                continue;
            }
            let observed = if *kind == Kind::StatefulSet {
                world
                    .observed
                    .statefulsets
                    .get(name)
                    .and_then(|s| serde_json::to_value(s).ok())
            } else {
                world.observed.objects.get(&(*kind, name.clone())).cloned()
            };
            let fields = changed_fields(&observed.unwrap_or(Value::Null), object);
            for f in fields.iter().take(20) {
                out.objects.push(format!("{title}: {f}"));
            }
            if fields.len() > 20 {
                out.objects
                    .push(format!("{title}: … and {} more fields", fields.len() - 20));
            }
        }
    }
    if out.waiting.is_none() {
        out.waiting = plan.status.message.clone();
    }
    out.restarts = rollout::waves(
        &plan.members,
        proposed.spec.update_strategy,
        proposed.spec.pod_disruption_budget.max_unavailable,
    )
    .into_iter()
    .map(|w| w.iter().map(|r| names::replica_pod(r)).collect())
    .collect();
    let was_condemned = |r: &str| {
        live.and_then(|l| l.status.as_ref())
            .and_then(|s| s.replica_state_map.get(r))
            .is_some_and(|e| e.state == ReplicaState::Condemned)
    };
    out.condemned = plan
        .status
        .replica_state_map
        .iter()
        .filter(|(n, e)| e.state == ReplicaState::Condemned && !was_condemned(n))
        .map(|(n, _)| n.to_string())
        .collect();
    out.exit_code = if !out.refused.is_empty() {
        1
    } else if out.changes.is_empty()
        && out.first_pass.is_empty()
        && out.restarts.is_empty()
        && out.condemned.is_empty()
    {
        0
    } else {
        2
    };
}

/// What applying `file` to an empty namespace would do, without any cluster to read (`plan
/// --offline`): the first pass of a new cluster, in the namespace of the file (default
/// `default`), with the same fields and exit code as [`preview`].
pub fn offline(file: &ClickHouseCluster) -> Preview {
    let mut proposed = file.clone();
    // Not read from an API server: give it what the server would.
    let meta = &mut proposed.metadata;
    let ns = meta
        .namespace
        .get_or_insert_with(|| "default".into())
        .clone();
    meta.uid
        .get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
    meta.generation.get_or_insert(1);
    let mut out = Preview {
        namespace: ns,
        cluster: file.name_any(),
        live: false,
        changes: vec!["the cluster is created".into()],
        ..Preview::default()
    };
    let plan = super::offline_plan(&proposed);
    fill(&mut out, &plan, &World::default(), &proposed, None);
    out
}

/// Every object the operator would create for `file` as a new cluster (`render`): the
/// ConfigMaps with the configuration files the servers and Keeper read, the users Secret with
/// its files as `stringData` (password hashes of placeholders: the real passwords are generated
/// at creation), the StatefulSets, Services, PodDisruptionBudgets and NetworkPolicies, each as
/// a pass builds it. Offline: the replicas are named as a new cluster's are, no server version
/// is known yet (what depends on one is left out, as on a first pass), Secrets the spec names
/// are not read. The operator's own credentials Secret is not shown.
pub fn render(file: &ClickHouseCluster) -> Result<Vec<serde_json::Value>, String> {
    use crate::model::{self, Inputs, Password, ReplicaSpec};
    let mut c = file.clone();
    c.metadata.namespace.get_or_insert_with(|| "default".into());
    c.metadata
        .uid
        .get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
    c.metadata.generation.get_or_insert(1);
    let limits =
        crate::api::validate::Limits::from_lookup(|k| std::env::var(k).ok()).unwrap_or_default();
    let (errors, _) = crate::api::validate::validate_with(&c.name_any(), &c.spec, &limits);
    if !errors.is_empty() {
        let said: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(said.join("; "));
    }
    // the replicas a new cluster's first pass records, named by the planner itself
    let topology = crate::plan::replicas::Topology {
        cluster: &c.name_any(),
        shards: c.spec.shards,
        replicas: c.spec.replicas,
        paused: false,
        allow_shard_removal: false,
        replace: &[],
        held: &crate::plan::replicas::NOTHING_HELD,
    };
    let first =
        crate::plan::replicas::plan_map(&topology, &Default::default(), 0, |_| Default::default());
    let mut replicas: Vec<ReplicaSpec> = first
        .map
        .values()
        .map(|r| ReplicaSpec::new(topology.cluster, r.shard, r.index))
        .collect();
    replicas.sort_by_key(|r| r.index);
    let placeholder = || Some(Password("generated-at-creation".into()));
    let inputs = Inputs {
        replicas,
        operator_password: Password("generated-at-creation".into()),
        interserver_password: placeholder(),
        keeper_password: placeholder(),
        cluster_password: placeholder(),
        cluster_secret: placeholder(),
        exporter_password: placeholder(),
        ..Inputs::default()
    };
    let cluster = model::Cluster::new(&c).map_err(|e| e.to_string())?;
    let d = model::desired(&cluster, &inputs).map_err(|e| e.to_string())?;
    let mut out: Vec<serde_json::Value> = Vec::new();
    out.push(manifest(&d.common_config));
    out.extend(d.replica_configs.iter().map(manifest));
    let mut users = manifest(&d.users_secret);
    if let Some(m) = users.as_object_mut() {
        m.remove("data");
    }
    users["stringData"] = d
        .users_secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned().into()))
        .collect::<serde_json::Map<String, serde_json::Value>>()
        .into();
    out.push(users);
    if let Some(k) = &d.keeper {
        out.push(manifest(&k.config));
        out.push(manifest(&k.headless_service));
        out.push(manifest(&k.client_service));
        out.push(manifest(&k.pdb));
        out.push(manifest(&k.statefulset));
    }
    out.push(manifest(&d.headless_service));
    out.extend(d.client_service.iter().map(manifest));
    out.extend(d.replica_services.iter().map(manifest));
    out.extend(d.shard_pdbs.iter().map(manifest));
    out.extend(d.network_policies.iter().map(manifest));
    out.extend(d.server_statefulsets.iter().map(manifest));
    Ok(out)
}

/// A Kubernetes object as JSON with its `apiVersion` and `kind`, as `kubectl apply` takes it.
fn manifest<K: k8s_openapi::Resource + serde::Serialize>(object: &K) -> serde_json::Value {
    let mut v = crate::plan::pass::json_of(object);
    v["apiVersion"] = K::API_VERSION.into();
    v["kind"] = K::KIND.into();
    v
}

impl Preview {
    /// For people.
    pub fn human(&self) -> String {
        let mut s = format!("ClickHouseCluster {}/{}", self.namespace, self.cluster);
        match &self.state {
            Some(st) => s.push_str(&format!(" (running: {st})\n")),
            None => s.push_str(" (does not exist yet)\n"),
        }
        let list = |s: &mut String, title: &str, items: &[String]| {
            if !items.is_empty() {
                s.push_str(&format!("{title}:\n"));
                for i in items {
                    s.push_str(&format!("  - {i}\n"));
                }
            }
        };
        list(&mut s, "Refused", &self.refused);
        list(&mut s, "Changes", &self.changes);
        if !self.restarts.is_empty() {
            s.push_str("Server pods restarted, in this order (a line restarts together):\n");
            for (i, w) in self.restarts.iter().enumerate() {
                s.push_str(&format!("  {}. {}\n", i + 1, w.join(", ")));
            }
        }
        if !self.condemned.is_empty() {
            s.push_str(&format!(
                "Replicas removed (their parts synced to the shard's other replicas first, then \
                 dropped with their Keeper metadata): {}\n",
                self.condemned.join(", ")
            ));
        }
        list(&mut s, "First pass", &self.first_pass);
        list(
            &mut s,
            "Changed fields of the objects the first pass writes",
            &self.objects,
        );
        if let Some(w) = &self.waiting {
            s.push_str(&format!("Waiting: {w}\n"));
        }
        s.push_str(match self.exit_code {
            0 => "Nothing to do.\n",
            1 => "Refused: nothing would be applied of what is refused.\n",
            _ => "Changes would be applied.\n",
        });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// docs/operations.md, "The commands": `plan` shows what changes in an object, field by field,
    /// without the stamped hashes and without the fields the API server adds.
    #[test]
    fn changed_fields_name_each_path_with_its_old_and_new_value() {
        let observed = json!({
            "metadata": {"name": "c1-0-0", "uid": "u", "annotations": {"clickhouse.com/object-hash": "a"}},
            "spec": {"template": {"spec": {"containers": [{"name": "clickhouse", "image": "ch:24.8",
                                                          "env": [{"name": "A", "value": "1"}]}]}},
                     "replicas": 1},
            "status": {"replicas": 1}
        });
        let desired = json!({
            "metadata": {"name": "c1-0-0", "annotations": {"clickhouse.com/object-hash": "b"}},
            "spec": {"template": {"spec": {"containers": [{"name": "clickhouse", "image": "ch:25.3",
                                                          "env": [{"name": "A", "value": "1"}]}]}},
                     "replicas": 1, "minReadySeconds": 5}
        });
        assert_eq!(
            changed_fields(&observed, &desired),
            vec![
                "spec.minReadySeconds: (none) → 5".to_string(),
                "spec.template.spec.containers[0].image: \"ch:24.8\" → \"ch:25.3\"".to_string(),
            ]
        );
        assert!(changed_fields(&observed, &observed).is_empty());
        // a file: the first line that differs
        let file = |words: &str| json!({"data": {"keeper.xml": format!("<?xml version=\"1.0\"?>\n<clickhouse>\n    <keeper_server>{words}</keeper_server>\n</clickhouse>\n")}});
        assert_eq!(
            changed_fields(&file(""), &file("<x>1</x>")),
            [
                "data.keeper.xml line 3: \"<keeper_server></keeper_server>\" → \"<keeper_server><x>1</x></keeper_server>\""
            ]
        );
        let longer = json!({"data": {"f": "a\nb\nc"}});
        assert_eq!(
            changed_fields(&json!({"data": {"f": "a\nb"}}), &longer),
            ["data.f line 3: (none) → \"c\""]
        );
    }

    /// Review L-7: `plan` names the keys of a Secret's data that change and never shows their
    /// values, old or new (base64 or plain), whole or in part.
    #[test]
    fn changed_fields_hide_the_data_of_secrets() {
        let secret = |pw: &str, extra: bool| {
            let mut s = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "c1-users", "labels": {"a": "b"}},
                "data": {"users.xml": format!("PHVzZXJzPjxwYXNzd29yZD57cHd9{pw}"), "same": "eA=="},
                "stringData": {"operator": pw}});
            if extra {
                s["data"]["new"] = json!("bmV3LXNlY3JldA==");
            }
            s
        };
        let fields = changed_fields(
            &secret("b2xkLXNlY3JldA", false),
            &secret("bmV3LXNlY3JldA", true),
        );
        assert_eq!(
            fields,
            [
                "data.new: changed (Secret data not shown)",
                "data.users.xml: changed (Secret data not shown)",
                "stringData.operator: changed (Secret data not shown)",
            ]
        );
        for f in &fields {
            assert!(!f.contains("LXNlY3JldA") && !f.contains("PHVz"), "{f}");
        }
        assert!(changed_fields(&secret("x", false), &secret("x", false)).is_empty());
    }
}
