//! PURE: does an object on the server already hold what we would write? The API server adds
//! defaults and status, so "equal" is too strict: the observed object *covers* the desired one
//! when every field we set has the same value there. A pass writes only objects that are not
//! covered, so a pass in which nothing changed sends no write, and a hand edit of a field we
//! own is noticed and reverted.

use serde_json::Value;

/// Does `observed` hold every field of `desired` with the same value?
pub fn covers(observed: &Value, desired: &Value) -> bool {
    match (observed, desired) {
        (_, Value::Null) => true,
        (Value::Object(o), Value::Object(d)) => d.iter().all(|(k, dv)| match o.get(k) {
            Some(ov) => covers(ov, dv),
            None => is_empty(dv),
        }),
        (Value::Null, d) => is_empty(d),
        (Value::Array(o), Value::Array(d)) => {
            o.len() == d.len() && o.iter().zip(d).all(|(ov, dv)| covers(ov, dv))
        }
        (o, d) => o == d || same_number(o, d),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty),
        Value::Array(a) => a.is_empty(),
        Value::Bool(b) => !b,
        _ => false,
    }
}

fn same_number(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => false,
    }
}

/// Does the observed object cover the desired one, looking only at what an apply writes:
/// labels, annotations and owner references, and everything outside `metadata` and `status`?
pub fn object_covered(observed: &Value, desired: &Value) -> bool {
    let Some(d) = desired.as_object() else {
        return false;
    };
    d.iter().all(|(k, dv)| match k.as_str() {
        "status" | "apiVersion" | "kind" => true,
        "metadata" => ["labels", "annotations", "ownerReferences"]
            .iter()
            .all(|f| covers(&observed["metadata"][*f], &dv[*f])),
        _ => covers(&observed[k], dv),
    })
}

/// The operator's field manager: what it writes to the objects it owns is recorded under this
/// name, and every other name's fields there are someone else's edits ([`foreign_fields`]).
pub const FIELD_MANAGER: &str = "clickhouse-operator";

/// One step of a path into an object: a field, or an element of a list.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Field(String),
    Index(usize),
}

/// A field or list element of an observed object that another field manager set and the
/// desired object does not have: a hand edit (`kubectl edit`, `patch`, `apply`) that a
/// server-side apply leaves in place, because it only removes what its own manager set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    /// Where it is in the observed object.
    pub path: Vec<Step>,
    /// For a list element: the fields that identify it (its key), to be tested before it is
    /// removed, so that a list that changed meanwhile loses nothing else.
    pub key: Option<Value>,
}

impl Foreign {
    /// The path as a JSON pointer (RFC 6901).
    pub fn pointer(&self) -> String {
        self.path
            .iter()
            .map(|s| match s {
                Step::Field(f) => format!("/{}", f.replace('~', "~0").replace('/', "~1")),
                Step::Index(i) => format!("/{i}"),
            })
            .collect()
    }
}

/// Is an entry of `metadata.managedFields` another writer's than `ours`, on the object itself
/// (not its `status` or `scale` subresource, which Kubernetes' controllers write)?
pub fn is_foreign_entry(entry: &Value, ours: &str) -> bool {
    entry["manager"].as_str() != Some(ours) && on_the_object(entry)
}

/// Is an entry of `metadata.managedFields` about the object itself (not a subresource), in the
/// one format read here?
fn on_the_object(entry: &Value) -> bool {
    entry["subresource"].as_str().unwrap_or("").is_empty()
        && entry["fieldsType"].as_str().unwrap_or("FieldsV1") == "FieldsV1"
}

/// Is an entry of `metadata.managedFields` one whose fields the operator removes when
/// `desired` does not have them: another writer's ([`is_foreign_entry`]), or the operator's own
/// `Update` entry, which holds what the object was created with (a create is no apply, so
/// leaving a field out of a later apply does not remove it: a probe the spec no longer wants
/// would stay for ever; decision 57).
pub fn is_removable_entry(entry: &Value, ours: &str) -> bool {
    is_foreign_entry(entry, ours)
        || (entry["manager"].as_str() == Some(ours)
            && entry["operation"].as_str() == Some("Update")
            && on_the_object(entry))
}

/// What other field managers set in `observed` (by its `metadata.managedFields`) outside its
/// metadata and status that `desired` does not have: a hand edit for a pass to repair (see
/// [`fields_to_remove`] for what an apply removes), deepest and last elements first (the
/// order they can be removed in). A field they set to another value than `desired`'s is not
/// listed: [`covers`] sees it, and the operator's apply takes it back. Labels and annotations
/// on the object itself are left to others (tools add their own); those of a pod template are
/// not.
pub fn foreign_fields(observed: &Value, desired: &Value, ours: &str) -> Vec<Foreign> {
    fields_of(observed, desired, |e| is_foreign_entry(e, ours))
}

/// What an apply removes first: [`foreign_fields`], and what the object was created with that
/// `desired` does not have ([`is_removable_entry`], decision 57). Only when an apply is due for
/// another reason: the creation entry also holds what the API server defaulted, which it
/// defaults again, so it is no reason to write by itself.
pub fn fields_to_remove(observed: &Value, desired: &Value, ours: &str) -> Vec<Foreign> {
    fields_of(observed, desired, |e| is_removable_entry(e, ours))
}

/// [`fields_to_remove`] without the fields that hold the value the API server gives them when
/// a write leaves them out ([`is_api_default`]): removing one changes nothing but the object's
/// managed fields, and would cost a write before the first apply of every object the operator
/// created (each StatefulSet's first template change in a roll: decision 57).
pub fn fields_to_remove_but_defaults(
    observed: &Value,
    desired: &Value,
    ours: &str,
) -> Vec<Foreign> {
    let mut fields = fields_to_remove(observed, desired, ours);
    fields.retain(|f| !is_api_default(observed, f));
    fields
}

/// The values the API server fills in when a write leaves a field out, for the fields of the
/// objects the operator writes (`SetDefaults_PodSpec`, `_Container`, `_Probe`,
/// `_StatefulSetSpec`, `_ServiceSpec`, …), by path (`*` a list element). A field missing here
/// is only removed and defaulted again: one write more, nothing lost.
const API_DEFAULTS: &[(&str, &str)] = &[
    ("spec/revisionHistoryLimit", "10"),
    ("spec/podManagementPolicy", r#""OrderedReady""#),
    (
        "spec/persistentVolumeClaimRetentionPolicy",
        r#"{"whenDeleted": "Retain", "whenScaled": "Retain"}"#,
    ),
    (
        "spec/volumeClaimTemplates/*/spec/volumeMode",
        r#""Filesystem""#,
    ),
    ("spec/template/spec/restartPolicy", r#""Always""#),
    ("spec/template/spec/dnsPolicy", r#""ClusterFirst""#),
    ("spec/template/spec/schedulerName", r#""default-scheduler""#),
    ("spec/template/spec/terminationGracePeriodSeconds", "30"),
    ("spec/template/spec/securityContext", "{}"),
    ("spec/template/spec/volumes/*/configMap/defaultMode", "420"),
    ("spec/template/spec/volumes/*/secret/defaultMode", "420"),
    ("spec/template/spec/volumes/*/projected/defaultMode", "420"),
    (
        "spec/template/spec/volumes/*/projected/sources/*/serviceAccountToken/expirationSeconds",
        "3600",
    ),
    ("spec/sessionAffinity", r#""None""#),
    ("spec/internalTrafficPolicy", r#""Cluster""#),
    ("spec/ipFamilyPolicy", r#""SingleStack""#),
    ("spec/ports/*/protocol", r#""TCP""#),
];

/// The defaults of every container of a pod template (`containers`, `initContainers`), by
/// path below the container.
const CONTAINER_DEFAULTS: &[(&str, &str)] = &[
    ("terminationMessagePath", r#""/dev/termination-log""#),
    ("terminationMessagePolicy", r#""File""#),
    ("resources", "{}"),
    ("ports/*/protocol", r#""TCP""#),
    ("env/*/valueFrom/fieldRef/apiVersion", r#""v1""#),
    ("livenessProbe/successThreshold", "1"),
    ("livenessProbe/timeoutSeconds", "1"),
    ("livenessProbe/periodSeconds", "10"),
    ("livenessProbe/failureThreshold", "3"),
    ("readinessProbe/successThreshold", "1"),
    ("readinessProbe/timeoutSeconds", "1"),
    ("readinessProbe/periodSeconds", "10"),
    ("readinessProbe/failureThreshold", "3"),
    ("startupProbe/successThreshold", "1"),
    ("startupProbe/timeoutSeconds", "1"),
    ("startupProbe/periodSeconds", "10"),
    ("startupProbe/failureThreshold", "3"),
];

/// Does field `f` of `observed` hold what the API server would give it if it were removed
/// ([`API_DEFAULTS`], [`CONTAINER_DEFAULTS`], and a container's `imagePullPolicy`: `Always`
/// for an image without a tag or tagged `latest`, else `IfNotPresent`)? A list element (a
/// field with a key) never is.
pub fn is_api_default(observed: &Value, f: &Foreign) -> bool {
    if f.key.is_some() {
        return false;
    }
    let pointer = f.pointer();
    let Some(value) = observed.pointer(&pointer) else {
        return false;
    };
    let pattern: Vec<String> = f
        .path
        .iter()
        .map(|s| match s {
            Step::Field(name) => name.clone(),
            Step::Index(_) => "*".into(),
        })
        .collect();
    let pattern = pattern.join("/");
    let default = |text: &str| serde_json::from_str::<Value>(text).ok().as_ref() == Some(value);
    if let Some((_, d)) = API_DEFAULTS.iter().find(|(p, _)| *p == pattern) {
        return default(d);
    }
    for list in [
        "spec/template/spec/containers/*/",
        "spec/template/spec/initContainers/*/",
    ] {
        let Some(rest) = pattern.strip_prefix(list) else {
            continue;
        };
        if rest == "imagePullPolicy" {
            // the container's own image decides
            let container = &pointer[..pointer.len() - "/imagePullPolicy".len()];
            let image = observed
                .pointer(&format!("{container}/image"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let name = image.rsplit('/').next().unwrap_or_default();
            let latest =
                !image.contains('@') && name.split_once(':').is_none_or(|(_, tag)| tag == "latest");
            let wanted = if latest { "Always" } else { "IfNotPresent" };
            return value.as_str() == Some(wanted);
        }
        return CONTAINER_DEFAULTS
            .iter()
            .find(|(p, _)| *p == rest)
            .is_some_and(|(_, d)| default(d));
    }
    false
}

fn fields_of(observed: &Value, desired: &Value, entries: impl Fn(&Value) -> bool) -> Vec<Foreign> {
    let mut out = Vec::new();
    for entry in observed["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| entries(e))
    {
        let Some(fields) = entry["fieldsV1"].as_object() else {
            continue;
        };
        for (k, child) in fields {
            let Some(name) = k.strip_prefix("f:") else {
                continue;
            };
            if name == "metadata" || name == "status" || name == "apiVersion" || name == "kind" {
                continue;
            }
            walk(
                child,
                &observed[name],
                desired.get(name),
                vec![Step::Field(name.to_string())],
                None,
                &mut out,
            );
        }
    }
    out.sort_by(|a, b| b.path.cmp(&a.path));
    out.dedup_by(|a, b| a.path == b.path);
    // a removed element takes what is under it along (deepest first: drop those whose
    // ancestor is listed too)
    let listed: Vec<Vec<Step>> = out.iter().map(|f| f.path.clone()).collect();
    out.retain(|f| {
        !listed
            .iter()
            .any(|p| p.len() < f.path.len() && f.path.starts_with(p))
    });
    out
}

/// Does a fieldsV1 node own the value at its path itself (a leaf, or a node marked `.`), not
/// only fields under it?
fn owns_itself(node: &Value) -> bool {
    node.as_object()
        .is_none_or(|o| o.is_empty() || o.contains_key("."))
}

fn walk(
    node: &Value,
    observed: &Value,
    desired: Option<&Value>,
    path: Vec<Step>,
    key: Option<Value>,
    out: &mut Vec<Foreign>,
) {
    if observed.is_null() {
        return; // no longer there
    }
    let Some(desired) = desired.filter(|d| !d.is_null()) else {
        if owns_itself(node) {
            out.push(Foreign { path, key });
            return;
        }
        // only fields under it are the other manager's: those go, the rest stays
        descend(node, observed, None, &path, out);
        return;
    };
    descend(node, observed, Some(desired), &path, out);
}

fn descend(
    node: &Value,
    observed: &Value,
    desired: Option<&Value>,
    path: &[Step],
    out: &mut Vec<Foreign>,
) {
    let Some(children) = node.as_object() else {
        return;
    };
    for (k, child) in children {
        let at = |s: Step| {
            let mut p = path.to_vec();
            p.push(s);
            p
        };
        if let Some(name) = k.strip_prefix("f:") {
            walk(
                child,
                &observed[name],
                desired.and_then(|d| d.get(name)),
                at(Step::Field(name.to_string())),
                None,
                out,
            );
        } else if let Some(json) = k.strip_prefix("k:") {
            let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(json) else {
                continue;
            };
            let matches = |item: &&Value| fields.iter().all(|(f, v)| item.get(f) == Some(v));
            let Some(list) = observed.as_array() else {
                continue;
            };
            let Some(i) = list.iter().position(|item| matches(&item)) else {
                continue;
            };
            let wanted = desired
                .and_then(Value::as_array)
                .and_then(|d| d.iter().find(matches));
            walk(
                child,
                &list[i],
                wanted,
                at(Step::Index(i)),
                Some(Value::Object(fields.clone())),
                out,
            );
        } else if let Some(json) = k.strip_prefix("v:") {
            let Ok(value) = serde_json::from_str::<Value>(json) else {
                continue;
            };
            let Some(i) = observed
                .as_array()
                .and_then(|l| l.iter().position(|v| *v == value))
            else {
                continue;
            };
            let wanted = desired
                .and_then(Value::as_array)
                .is_some_and(|d| d.contains(&value));
            if !wanted {
                out.push(Foreign {
                    path: at(Step::Index(i)),
                    key: Some(value),
                });
            }
        }
        // "i:<n>" (atomic lists) and ".": the list or node as a whole, handled by its parent
    }
}

/// The JSON patch that removes `foreign` from an object whose managed fields are `managed`:
/// each element tested against its key first, then removed; and the other managers' entries
/// without what they set outside metadata, so that a field the API server fills in again
/// with its default is not seen as theirs at the next pass.
pub fn removal_patch(foreign: &[Foreign], managed: &Value, ours: &str) -> Value {
    let mut ops = Vec::new();
    for f in foreign {
        let at = f.pointer();
        if let Some(key) = &f.key {
            match key {
                Value::Object(fields) => {
                    for (k, v) in fields {
                        ops.push(serde_json::json!({"op": "test", "path": format!("{at}/{k}"), "value": v}));
                    }
                }
                v => ops.push(serde_json::json!({"op": "test", "path": at, "value": v})),
            }
        }
        ops.push(serde_json::json!({"op": "remove", "path": at}));
    }
    let entries: Vec<Value> = managed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            if !is_removable_entry(e, ours) {
                return Some(e.clone());
            }
            let metadata = e["fieldsV1"].get("f:metadata")?.clone();
            let mut kept = e.clone();
            kept["fieldsV1"] = serde_json::json!({"f:metadata": metadata});
            Some(kept)
        })
        .collect();
    ops.push(
        serde_json::json!({"op": "replace", "path": "/metadata/managedFields", "value": entries}),
    );
    Value::Array(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_do_not_count_as_differences() {
        let desired = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let observed = json!({"spec": {"replicas": 1, "revisionHistoryLimit": 10,
            "template": {"spec": {"dnsPolicy": "ClusterFirst", "containers": [{"name": "c", "image": "i", "imagePullPolicy": "IfNotPresent"}]}}},
            "status": {"replicas": 1}});
        assert!(object_covered(&observed, &desired));
    }

    #[test]
    fn changed_or_missing_fields_are_differences() {
        let desired = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "new"}]}}}});
        let observed = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "old"}]}}}});
        assert!(!object_covered(&observed, &desired));
        // An extra element (a sidecar added) or a removed one is a difference.
        let two = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "new"}, {"name": "s"}]}}}});
        assert!(!object_covered(&two, &desired));
        assert!(!object_covered(&json!({}), &json!({"data": {"a": "1"}})));
        assert!(!object_covered(
            &json!({"metadata": {"labels": {"a": "1"}}}),
            &json!({"metadata": {"labels": {"a": "2"}}})
        ));
    }

    #[test]
    fn empty_desired_values_match_absent_ones() {
        assert!(object_covered(
            &json!({"spec": {}}),
            &json!({"spec": {"tolerations": [], "nodeSelector": {}, "hostNetwork": false}})
        ));
        assert!(covers(&json!(1), &json!(1.0)));
        // Metadata other than labels, annotations and owners is the server's.
        assert!(object_covered(
            &json!({"metadata": {"resourceVersion": "9", "labels": {"a": "1", "b": "2"}}}),
            &json!({"metadata": {"name": "x", "labels": {"a": "1"}}})
        ));
    }

    fn edited(fields: Value) -> Value {
        json!([
            {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:replicas": {}}}},
            {"manager": "kubectl-edit", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": fields},
        ])
    }

    fn statefulset(env: Value, annotations: Value, image: &str, managed: Value) -> Value {
        json!({"metadata": {"name": "c1-0-0", "managedFields": managed},
               "spec": {"replicas": 1, "template": {
                   "metadata": {"annotations": annotations},
                   "spec": {"containers": [{"name": "clickhouse", "image": image, "env": env}]}}}})
    }

    /// Decision 30: what a hand edit added to a list or a map the operator writes is found
    /// by its writer's managed fields, with the key of a list element, deepest and last first;
    /// what the operator and Kubernetes' controllers wrote is not.
    #[test]
    fn fields_another_writer_added_are_found_by_their_managed_fields() {
        let desired = statefulset(
            json!([{"name": "A", "value": "1"}]),
            json!({"ours": "1"}),
            "i",
            json!(null),
        );
        let fields = json!({
            "f:metadata": {"f:annotations": {"f:tool": {}}},
            "f:spec": {"f:template": {
                "f:metadata": {"f:annotations": {"f:by-hand": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"clickhouse\"}": {
                    "f:env": {
                        "k:{\"name\":\"FOO\"}": {".": {}, "f:name": {}, "f:value": {}},
                        "k:{\"name\":\"BAR\"}": {".": {}, "f:name": {}, "f:value": {}}
                    }}}}}}
        });
        let observed = statefulset(
            json!([{"name": "FOO", "value": "x"}, {"name": "A", "value": "1"}, {"name": "BAR", "value": "y"}]),
            json!({"ours": "1", "by-hand": "2"}),
            "i",
            edited(fields),
        );
        let found = foreign_fields(&observed, &desired, FIELD_MANAGER);
        let pointers: Vec<String> = found.iter().map(Foreign::pointer).collect();
        assert_eq!(
            pointers,
            [
                "/spec/template/spec/containers/0/env/2",
                "/spec/template/spec/containers/0/env/0",
                "/spec/template/metadata/annotations/by-hand",
            ],
            "the object's own annotations are others' to add"
        );
        assert_eq!(found[0].key, Some(json!({"name": "BAR"})));
        // the env list differs in length: covers already says so; the annotation it does not
        assert!(!object_covered(&observed, &desired));
        let only_annotation = statefulset(
            json!([{"name": "A", "value": "1"}]),
            json!({"ours": "1", "by-hand": "2"}),
            "i",
            edited(
                json!({"f:spec": {"f:template": {"f:metadata": {"f:annotations": {"f:by-hand": {}}}}}}),
            ),
        );
        assert!(object_covered(&only_annotation, &desired));
        assert_eq!(
            foreign_fields(&only_annotation, &desired, FIELD_MANAGER).len(),
            1
        );

        let patch = removal_patch(
            &found,
            &observed["metadata"]["managedFields"],
            FIELD_MANAGER,
        );
        let ops = patch.as_array().unwrap();
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/spec/template/spec/containers/0/env/2/name", "value": "BAR"})
        );
        assert_eq!(
            ops[1],
            json!({"op": "remove", "path": "/spec/template/spec/containers/0/env/2"})
        );
        let managed = &ops.last().unwrap()["value"];
        assert_eq!(managed.as_array().unwrap().len(), 3);
        assert_eq!(
            managed[2]["fieldsV1"],
            json!({"f:metadata": {"f:annotations": {"f:tool": {}}}}),
            "the other writer keeps only what it set in the object's metadata"
        );
    }

    /// A field the object was created with (the operator's own `Update` entry) that the spec
    /// no longer asks for is removed before an apply, and the entry goes; it is no hand edit
    /// (no reason to apply by itself), and what the operator's applies own is never listed
    /// (decision 57).
    #[test]
    fn fields_the_object_was_created_with_and_no_longer_wanted_are_found() {
        let probe = |p: Option<Value>| {
            let mut c = json!({"name": "clickhouse", "image": "i"});
            if let Some(p) = p {
                c["startupProbe"] = p;
            }
            json!({"metadata": {"name": "c1-0-0"},
                   "spec": {"template": {"spec": {"containers": [c]}}}})
        };
        let created = json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
            "k:{\"name\":\"clickhouse\"}": {".": {}, "f:name": {}, "f:image": {},
                "f:startupProbe": {".": {}, "f:httpGet": {"f:path": {}}}}}}}}});
        let mut observed = probe(Some(json!({"httpGet": {"path": "/ping"}})));
        observed["metadata"]["managedFields"] = json!([
            {"manager": FIELD_MANAGER, "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": created},
            {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                 "k:{\"name\":\"clickhouse\"}": {".": {}, "f:name": {}, "f:image": {}}}}}}}},
        ]);
        let found = fields_to_remove(&observed, &probe(None), FIELD_MANAGER);
        let pointers: Vec<String> = found.iter().map(Foreign::pointer).collect();
        assert_eq!(pointers, ["/spec/template/spec/containers/0/startupProbe"]);
        // no hand edit: no reason to write by itself
        assert!(foreign_fields(&observed, &probe(None), FIELD_MANAGER).is_empty());
        // still wanted: nothing
        let wanted = probe(Some(json!({"httpGet": {"path": "/ping"}})));
        assert!(fields_to_remove(&observed, &wanted, FIELD_MANAGER).is_empty());
        let patch = removal_patch(
            &found,
            &observed["metadata"]["managedFields"],
            FIELD_MANAGER,
        );
        let managed = &patch.as_array().unwrap().last().unwrap()["value"];
        // the creation entry goes (it set nothing in the object's metadata), the apply's stays
        assert_eq!(managed.as_array().unwrap().len(), 1, "{managed}");
        assert_eq!(managed[0]["operation"], "Apply");
        assert!(!is_removable_entry(&managed[0], FIELD_MANAGER));
    }

    /// What the API server defaulted when the operator created a StatefulSet (held by the
    /// create's entry, as every StatefulSet's first apply in a roll found it) is not removed
    /// before the apply: removing it would change only the managed fields, one write for
    /// nothing. The same fields at other values are removed, and a field the spec no longer
    /// asks for still is (decision 57).
    #[test]
    fn what_the_api_server_defaulted_at_creation_is_no_field_to_remove() {
        let observed_with = |restart: &str, pull: &str, period: i64, image: &str| {
            let mut o = json!({"metadata": {"name": "c1-0-0"}, "spec": {
                "revisionHistoryLimit": 10, "podManagementPolicy": "OrderedReady",
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                "template": {"spec": {"restartPolicy": restart, "dnsPolicy": "ClusterFirst",
                    "schedulerName": "default-scheduler",
                    "containers": [{"name": "clickhouse", "image": image,
                        "imagePullPolicy": pull, "resources": {},
                        "terminationMessagePath": "/dev/termination-log",
                        "readinessProbe": {"httpGet": {"path": "/ping"}, "successThreshold": 1,
                            "periodSeconds": period}}]}}}});
            o["metadata"]["managedFields"] = json!([
                {"manager": FIELD_MANAGER, "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:revisionHistoryLimit": {}, "f:podManagementPolicy": {},
                    "f:persistentVolumeClaimRetentionPolicy": {".": {}, "f:whenDeleted": {}, "f:whenScaled": {}},
                    "f:template": {"f:spec": {"f:restartPolicy": {}, "f:dnsPolicy": {},
                        "f:schedulerName": {}, "f:containers": {
                        "k:{\"name\":\"clickhouse\"}": {".": {}, "f:name": {}, "f:image": {},
                            "f:imagePullPolicy": {}, "f:resources": {}, "f:terminationMessagePath": {},
                            "f:readinessProbe": {".": {}, "f:httpGet": {"f:path": {}},
                                "f:successThreshold": {}, "f:periodSeconds": {}}}}}}}}},
            ]);
            o
        };
        let desired = json!({"metadata": {"name": "c1-0-0"}, "spec": {"template": {"spec": {
            "containers": [{"name": "clickhouse", "image": "clickhouse/clickhouse-server:24.8",
                "readinessProbe": {"httpGet": {"path": "/ping"}}}]}}}});
        let pointers = |o: &Value| -> Vec<String> {
            fields_to_remove_but_defaults(o, &desired, FIELD_MANAGER)
                .iter()
                .map(Foreign::pointer)
                .collect()
        };
        let defaulted = observed_with(
            "Always",
            "IfNotPresent",
            10,
            "clickhouse/clickhouse-server:24.8",
        );
        assert_eq!(
            fields_to_remove(&defaulted, &desired, FIELD_MANAGER).len(),
            11
        );
        assert!(
            pointers(&defaulted).is_empty(),
            "{:?}",
            pointers(&defaulted)
        );
        // `latest` (or no tag) is pulled always by default
        let latest = observed_with("Always", "Always", 10, "clickhouse/clickhouse-server");
        assert!(pointers(&latest).is_empty(), "{:?}", pointers(&latest));
        let set = observed_with("Never", "Always", 5, "registry:5000/clickhouse-server:24.8");
        let mut got = pointers(&set);
        got.sort();
        assert_eq!(
            got,
            [
                "/spec/template/spec/containers/0/imagePullPolicy",
                "/spec/template/spec/containers/0/readinessProbe/periodSeconds",
                "/spec/template/spec/restartPolicy",
            ]
        );
    }

    /// A field another writer changed to another value is the apply's to take back (covers
    /// sees it), and one it set to the operator's own value is no drift at all; its status and
    /// scale subresources are Kubernetes' own.
    #[test]
    fn changed_values_and_subresources_are_not_removed() {
        let desired = statefulset(
            json!([{"name": "A", "value": "1"}]),
            json!({}),
            "i",
            json!(null),
        );
        let image = json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
            "k:{\"name\":\"clickhouse\"}": {"f:image": {}}}}}}});
        let changed = statefulset(
            json!([{"name": "A", "value": "1"}]),
            json!({}),
            "other",
            edited(image.clone()),
        );
        assert!(foreign_fields(&changed, &desired, FIELD_MANAGER).is_empty());
        assert!(!object_covered(&changed, &desired));
        let same = statefulset(
            json!([{"name": "A", "value": "1"}]),
            json!({}),
            "i",
            edited(image),
        );
        assert!(foreign_fields(&same, &desired, FIELD_MANAGER).is_empty());
        let scaled = statefulset(
            json!([{"name": "A", "value": "1"}]),
            json!({}),
            "i",
            json!([{"manager": "kubectl", "subresource": "scale", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:minReadySeconds": {}}}}]),
        );
        assert!(foreign_fields(&scaled, &desired, FIELD_MANAGER).is_empty());
    }

    /// Two writers, one adding a list element and another a field inside it: the element goes,
    /// and with it the field, in one removal.
    #[test]
    fn what_lies_inside_a_removed_element_is_not_removed_again() {
        let desired = statefulset(
            json!([{"name": "A", "value": "1"}]),
            json!({}),
            "i",
            json!(null),
        );
        let element = json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
            "k:{\"name\":\"clickhouse\"}": {"f:env": {
                "k:{\"name\":\"FOO\"}": {".": {}, "f:name": {}}}}}}}}});
        let inside = json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
            "k:{\"name\":\"clickhouse\"}": {"f:env": {
                "k:{\"name\":\"FOO\"}": {"f:value": {}}}}}}}}});
        let mut managed = edited(element);
        managed.as_array_mut().unwrap().push(json!(
            {"manager": "kubectl-patch", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": inside}));
        let observed = statefulset(
            json!([{"name": "A", "value": "1"}, {"name": "FOO", "value": "x"}]),
            json!({}),
            "i",
            managed,
        );
        let found: Vec<String> = foreign_fields(&observed, &desired, FIELD_MANAGER)
            .iter()
            .map(Foreign::pointer)
            .collect();
        assert_eq!(found, ["/spec/template/spec/containers/0/env/1"]);
    }
}
