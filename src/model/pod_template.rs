//! PURE: the user's pod template (`spec.pod.template`, `spec.keeper.pod.template`; decision 28)
//! merged over the pod template the operator generates, so that any pod field Kubernetes has
//! (image pull secrets, a ServiceAccount, a priority class, init containers, extra volumes and
//! mounts, security contexts, probes, lifecycle hooks, host aliases, a runtime class, …) can be
//! set without a field of its own.
//!
//! The merge: objects merge key by key; lists of objects with a `name` (containers, init
//! containers, volumes, environment variables, image pull secrets, …) merge item by item by
//! name, new names appended; volume mounts merge by `mountPath`; other lists of objects
//! (tolerations, host aliases, …) are appended to; a scalar or a list of scalars replaces.
//! Probes and lifecycle hooks replace the generated ones whole (a probe has one handler).
//!
//! What the operator owns is refused with its path: the main container's image, command,
//! arguments and ports, the environment variables, volumes and mount paths it generates, the
//! labels and annotations it sets, and the pod's restart policy, host name, subdomain and node
//! name. The merged template must be a valid pod template.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{Map, Value};

use super::BuildError;

/// Fields of the main container that only the operator sets.
const OWNED_MAIN_FIELDS: &[(&str, &str)] = &[
    ("image", "set by the image field of the spec"),
    ("command", "the operator starts the main container"),
    ("args", "the operator starts the main container"),
    (
        "ports",
        "the Services, probes and NetworkPolicies use the operator's ports",
    ),
];

/// Pod fields that only the operator (or the StatefulSet) sets.
const OWNED_POD_FIELDS: &[(&str, &str)] = &[
    ("restartPolicy", "a StatefulSet's pods always restart"),
    ("hostname", "the StatefulSet names its pods"),
    (
        "subdomain",
        "the pods are named under the cluster's headless Service",
    ),
    (
        "nodeName",
        "the scheduler places the pods (use nodeSelector or affinity)",
    ),
];

/// Merge keys whose value replaces the generated one whole.
const REPLACED: &[&str] = &[
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
];

/// `template` (the user's, at `field`) merged over `generated`, whose main container is named
/// `main`.
pub fn merge(
    generated: PodTemplateSpec,
    template: &Value,
    field: &str,
    main: &str,
) -> Result<PodTemplateSpec, BuildError> {
    let err = |path: String, detail: &str| BuildError::PodTemplate {
        field: path,
        detail: detail.to_string(),
    };
    let user = template
        .as_object()
        .ok_or_else(|| err(field.to_string(), "must be an object (a pod template)"))?;
    let mut base = serde_json::to_value(&generated).expect("Kubernetes objects serialise");
    for (k, v) in user {
        match k.as_str() {
            "metadata" => check_metadata(&base["metadata"], v, &format!("{field}.metadata"))?,
            "spec" => check_spec(&base["spec"], v, &format!("{field}.spec"), main)?,
            other => {
                return Err(err(
                    format!("{field}.{other}"),
                    "is not a field of a pod template (metadata, spec)",
                ));
            }
        }
    }
    merge_value(&mut base, template, "");
    serde_json::from_value(base).map_err(|e| {
        err(
            field.to_string(),
            &format!("is not a valid pod template: {e}"),
        )
    })
}

fn check_metadata(generated: &Value, user: &Value, at: &str) -> Result<(), BuildError> {
    let user = object(user, at)?;
    for (k, v) in user {
        match k.as_str() {
            "labels" | "annotations" => {
                for key in object(v, &format!("{at}.{k}"))?.keys() {
                    if generated[k.as_str()].get(key).is_some() {
                        return Err(BuildError::PodTemplate {
                            field: format!("{at}.{k}.{key}"),
                            detail: "is set by the operator".into(),
                        });
                    }
                }
            }
            other => {
                return Err(BuildError::PodTemplate {
                    field: format!("{at}.{other}"),
                    detail: "is set by the StatefulSet (only labels and annotations may be given)"
                        .into(),
                });
            }
        }
    }
    Ok(())
}

fn check_spec(generated: &Value, user: &Value, at: &str, main: &str) -> Result<(), BuildError> {
    let user = object(user, at)?;
    for (k, why) in OWNED_POD_FIELDS {
        if user.contains_key(*k) {
            return Err(BuildError::PodTemplate {
                field: format!("{at}.{k}"),
                detail: format!("is not for the template: {why}"),
            });
        }
    }
    let generated_names = |list: &str| -> Vec<String> {
        generated[list]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    for list in [
        "containers",
        "initContainers",
        "volumes",
        "imagePullSecrets",
    ] {
        if let Some(items) = user.get(list) {
            let items = items.as_array().ok_or_else(|| BuildError::PodTemplate {
                field: format!("{at}.{list}"),
                detail: "must be a list".into(),
            })?;
            for (i, item) in items.iter().enumerate() {
                let name = item["name"]
                    .as_str()
                    .ok_or_else(|| BuildError::PodTemplate {
                        field: format!("{at}.{list}[{i}].name"),
                        detail: "is required".into(),
                    })?;
                let place = format!("{at}.{list}[{name}]");
                if list == "volumes" && generated_names("volumes").iter().any(|n| n == name) {
                    return Err(BuildError::PodTemplate {
                        field: place,
                        detail: "is a volume the operator generates".into(),
                    });
                }
                if list == "initContainers"
                    && generated_names("containers").iter().any(|n| n == name)
                {
                    return Err(BuildError::PodTemplate {
                        field: place,
                        detail: "is the name of a container".into(),
                    });
                }
                if list == "containers" && name == main {
                    let ours = generated["containers"]
                        .as_array()
                        .and_then(|a| a.iter().find(|c| c["name"] == main))
                        .cloned()
                        .unwrap_or_default();
                    check_main(&ours, item, &place, generated)?;
                }
            }
        }
    }
    Ok(())
}

/// The main container: what the operator owns in it is refused.
fn check_main(ours: &Value, user: &Value, at: &str, pod: &Value) -> Result<(), BuildError> {
    let user = object(user, at)?;
    for (k, why) in OWNED_MAIN_FIELDS {
        if user.contains_key(*k) {
            return Err(BuildError::PodTemplate {
                field: format!("{at}.{k}"),
                detail: format!("is owned by the operator: {why}"),
            });
        }
    }
    if let Some(env) = user.get("env").and_then(Value::as_array) {
        for e in env {
            let name = e["name"].as_str().unwrap_or_default();
            let generated = ours["env"]
                .as_array()
                .is_some_and(|a| a.iter().any(|g| g["name"] == name));
            if generated {
                return Err(BuildError::PodTemplate {
                    field: format!("{at}.env[{name}]"),
                    detail: "is set by the operator (or by the pod's env field)".into(),
                });
            }
        }
    }
    if let Some(mounts) = user.get("volumeMounts").and_then(Value::as_array) {
        let generated_volumes: Vec<&str> = pod["volumes"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v["name"].as_str()).collect())
            .unwrap_or_default();
        for m in mounts {
            let path = m["mountPath"].as_str().unwrap_or_default();
            let name = m["name"].as_str().unwrap_or_default();
            let owned_path = ours["volumeMounts"]
                .as_array()
                .is_some_and(|a| a.iter().any(|g| g["mountPath"] == path));
            if owned_path {
                return Err(BuildError::PodTemplate {
                    field: format!("{at}.volumeMounts[{path}]"),
                    detail: "is a mount path the operator generates".into(),
                });
            }
            if generated_volumes.contains(&name) {
                return Err(BuildError::PodTemplate {
                    field: format!("{at}.volumeMounts[{path}].name"),
                    detail: format!("{name:?} is a volume the operator generates"),
                });
            }
        }
    }
    Ok(())
}

fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, BuildError> {
    v.as_object().ok_or_else(|| BuildError::PodTemplate {
        field: at.to_string(),
        detail: "must be an object".into(),
    })
}

/// `overlay` merged into `base` (see the module documentation); `key` is the key `base` is
/// under.
fn merge_value(base: &mut Value, overlay: &Value, key: &str) {
    if REPLACED.contains(&key) {
        *base = overlay.clone();
        return;
    }
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) if !existing.is_null() => merge_value(existing, v, k),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        // an empty list adds nothing (and does not remove what the operator generated)
        (Value::Array(_), Value::Array(o)) if o.is_empty() => {}
        (Value::Array(b), Value::Array(o)) if o.iter().all(Value::is_object) => {
            let by = if key == "volumeMounts" {
                Some("mountPath")
            } else if o
                .iter()
                .all(|i| i.get("name").is_some_and(Value::is_string))
            {
                Some("name")
            } else {
                None
            };
            for item in o {
                let existing = by.and_then(|k| b.iter_mut().find(|x| x[k] == item[k]));
                match existing {
                    Some(x) => merge_value(x, item, ""),
                    None => b.push(item.clone()),
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, Volume, VolumeMount};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn generated() -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("clickhouse.com/cluster".to_string(), "c".to_string())].into()),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "clickhouse".into(),
                    image: Some("clickhouse/clickhouse-server:18.16".into()),
                    env: Some(vec![EnvVar {
                        name: "CLICKHOUSE_SKIP_USER_SETUP".into(),
                        value: Some("1".into()),
                        ..EnvVar::default()
                    }]),
                    volume_mounts: Some(vec![VolumeMount {
                        name: "data".into(),
                        mount_path: "/var/lib/clickhouse".into(),
                        ..VolumeMount::default()
                    }]),
                    ..Container::default()
                }],
                volumes: Some(vec![Volume {
                    name: "logs".into(),
                    ..Volume::default()
                }]),
                automount_service_account_token: Some(false),
                ..PodSpec::default()
            }),
        }
    }

    fn merged(t: Value) -> Result<Value, BuildError> {
        merge(generated(), &t, "spec.pod.template", "clickhouse")
            .map(|p| serde_json::to_value(p).unwrap())
    }

    fn refused(t: Value) -> String {
        match merged(t) {
            Err(BuildError::PodTemplate { field, .. }) => field,
            other => panic!("not refused: {other:?}"),
        }
    }

    /// Decision 28: pod fields without a field of their own reach the pod template; lists merge
    /// by name and are appended to; the main container keeps what the operator generated.
    #[test]
    fn the_users_pod_template_is_merged_over_the_generated_one() {
        let p = merged(json!({
            "metadata": {"labels": {"team": "db"}, "annotations": {"a": "1"}},
            "spec": {
                "imagePullSecrets": [{"name": "registry"}],
                "serviceAccountName": "ch",
                "priorityClassName": "high",
                "terminationGracePeriodSeconds": 300,
                "runtimeClassName": "fast",
                "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["s3.local"]}],
                "initContainers": [{"name": "init", "image": "busybox", "command": ["true"]}],
                "volumes": [{"name": "extra", "emptyDir": {}}],
                "containers": [
                    {"name": "clickhouse",
                     "env": [{"name": "TZ", "value": "UTC"}],
                     "volumeMounts": [{"name": "extra", "mountPath": "/extra"}],
                     "readinessProbe": {"exec": {"command": ["true"]}},
                     "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}},
                    {"name": "side", "image": "s",
                     "volumeMounts": [{"name": "extra", "mountPath": "/extra"}]}
                ]
            }
        }))
        .unwrap();
        assert_eq!(p["metadata"]["labels"]["team"], "db");
        assert_eq!(p["metadata"]["labels"]["clickhouse.com/cluster"], "c");
        assert_eq!(p["metadata"]["annotations"]["a"], "1");
        let s = &p["spec"];
        assert_eq!(s["imagePullSecrets"][0]["name"], "registry");
        assert_eq!(s["serviceAccountName"], "ch");
        assert_eq!(s["priorityClassName"], "high");
        assert_eq!(s["terminationGracePeriodSeconds"], 300);
        assert_eq!(s["runtimeClassName"], "fast");
        assert_eq!(s["hostAliases"][0]["ip"], "10.0.0.1");
        assert_eq!(s["initContainers"][0]["name"], "init");
        assert_eq!(s["automountServiceAccountToken"], false);
        let volumes: Vec<&str> = s["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(volumes, ["logs", "extra"]);
        let main = &s["containers"][0];
        assert_eq!(main["name"], "clickhouse");
        assert_eq!(main["image"], "clickhouse/clickhouse-server:18.16");
        let env: Vec<&str> = main["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(env, ["CLICKHOUSE_SKIP_USER_SETUP", "TZ"]);
        let mounts: Vec<&str> = main["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["mountPath"].as_str().unwrap())
            .collect();
        assert_eq!(mounts, ["/var/lib/clickhouse", "/extra"]);
        assert_eq!(
            main["readinessProbe"],
            json!({"exec": {"command": ["true"]}})
        );
        assert_eq!(main["lifecycle"]["preStop"]["exec"]["command"][0], "sleep");
        assert_eq!(s["containers"][1]["name"], "side");
        assert_eq!(s["containers"][1]["volumeMounts"][0]["name"], "extra");
    }

    /// Decision 28: what the operator owns is refused with its path.
    #[test]
    fn protected_fields_of_the_pod_template_are_refused_with_their_path() {
        let at = "spec.pod.template";
        for (t, field) in [
            (
                json!({"spec": {"containers": [{"name": "clickhouse", "image": "x"}]}}),
                format!("{at}.spec.containers[clickhouse].image"),
            ),
            (
                json!({"spec": {"containers": [{"name": "clickhouse", "command": ["sh"]}]}}),
                format!("{at}.spec.containers[clickhouse].command"),
            ),
            (
                json!({"spec": {"containers": [{"name": "clickhouse", "ports": []}]}}),
                format!("{at}.spec.containers[clickhouse].ports"),
            ),
            (
                json!({"spec": {"containers": [{"name": "clickhouse",
                    "env": [{"name": "CLICKHOUSE_SKIP_USER_SETUP", "value": "0"}]}]}}),
                format!("{at}.spec.containers[clickhouse].env[CLICKHOUSE_SKIP_USER_SETUP]"),
            ),
            (
                json!({"spec": {"containers": [{"name": "clickhouse",
                    "volumeMounts": [{"name": "x", "mountPath": "/var/lib/clickhouse"}]}]}}),
                format!("{at}.spec.containers[clickhouse].volumeMounts[/var/lib/clickhouse]"),
            ),
            (
                json!({"spec": {"containers": [{"name": "clickhouse",
                    "volumeMounts": [{"name": "logs", "mountPath": "/elsewhere"}]}]}}),
                format!("{at}.spec.containers[clickhouse].volumeMounts[/elsewhere].name"),
            ),
            (
                json!({"spec": {"volumes": [{"name": "logs", "emptyDir": {}}]}}),
                format!("{at}.spec.volumes[logs]"),
            ),
            (
                json!({"spec": {"initContainers": [{"name": "clickhouse", "image": "x"}]}}),
                format!("{at}.spec.initContainers[clickhouse]"),
            ),
            (
                json!({"spec": {"containers": [{"image": "x"}]}}),
                format!("{at}.spec.containers[0].name"),
            ),
            (
                json!({"spec": {"restartPolicy": "Never"}}),
                format!("{at}.spec.restartPolicy"),
            ),
            (
                json!({"spec": {"nodeName": "n1"}}),
                format!("{at}.spec.nodeName"),
            ),
            (
                json!({"spec": {"hostname": "h"}}),
                format!("{at}.spec.hostname"),
            ),
            (
                json!({"metadata": {"labels": {"clickhouse.com/cluster": "other"}}}),
                format!("{at}.metadata.labels.clickhouse.com/cluster"),
            ),
            (
                json!({"metadata": {"name": "x"}}),
                format!("{at}.metadata.name"),
            ),
            (json!({"kind": "Pod"}), format!("{at}.kind")),
            (json!([1]), at.to_string()),
        ] {
            assert_eq!(refused(t.clone()), field, "{t}");
        }
    }

    /// A template that is not a pod template is refused, not half applied.
    #[test]
    fn a_template_of_the_wrong_shape_is_refused() {
        assert_eq!(
            refused(json!({"spec": {"terminationGracePeriodSeconds": "long"}})),
            "spec.pod.template"
        );
        assert_eq!(
            refused(json!({"spec": {"containers": {"name": "x"}}})),
            "spec.pod.template.spec.containers"
        );
    }

    /// An empty template changes nothing (a cluster that sets none keeps its pods).
    #[test]
    fn an_empty_template_changes_nothing() {
        assert_eq!(
            merged(json!({})).unwrap(),
            serde_json::to_value(generated()).unwrap()
        );
        assert_eq!(
            merged(json!({"spec": {}, "metadata": {}})).unwrap(),
            serde_json::to_value(generated()).unwrap()
        );
    }
}
