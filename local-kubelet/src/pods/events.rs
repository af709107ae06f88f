//! The Events the kubelet records about a pod.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::PodEnv;
use crate::util;

/// What a kubelet records when it has a container's image: the programs of this machine are
/// always "present", so `Pulled` names the image and the pod's pull secrets it would have used;
/// a pull secret that does not exist gets the kubelet's own warning
/// (`FailedToRetrieveImagePullSecret`) and, as there, the container still starts.
pub(super) fn pulled(env: &PodEnv, pod: &Pod, c: &Container) {
    let names: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .map(|r| r.name.clone())
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| {
            env.ctx
                .secrets
                .get(&ObjectRef::<k8s_openapi::api::core::v1::Secret>::new(n).within(&env.ns))
                .is_none()
        })
        .collect();
    if !missing.is_empty() {
        let list: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        event(
            env,
            "Warning",
            "FailedToRetrieveImagePullSecret",
            Some(&c.name),
            format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                list.join(", ")
            ),
        );
    }
    let with = if names.is_empty() {
        String::new()
    } else {
        format!(" (image pull secrets: {})", names.join(", "))
    };
    event(
        env,
        "Normal",
        "Pulled",
        Some(&c.name),
        format!(
            "Container image {:?} already present on machine{with}",
            c.image.clone().unwrap_or_default()
        ),
    );
}

/// A core/v1 Event about the pod, as the kubelet records them (fire and forget).
pub(super) fn event(
    env: &PodEnv,
    kind: &str,
    reason: &str,
    container: Option<&str>,
    message: String,
) {
    let ctx = env.ctx.clone();
    let ns = env.ns.clone();
    let now = chrono::Utc::now();
    let t = util::now();
    let micro = now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let mut involved = json!({"apiVersion": "v1", "kind": "Pod", "namespace": ns,
        "name": env.name, "uid": env.uid});
    if let Some(c) = container {
        involved["fieldPath"] = json!(format!("spec.containers{{{c}}}"));
    }
    let ev = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{}.{:x}", env.name, now.timestamp_nanos_opt().unwrap_or_default()), "namespace": ns},
        "involvedObject": involved, "reason": reason, "message": message, "type": kind,
        "source": {"component": "kubelet", "host": ctx.node},
        "reportingComponent": "kubelet", "reportingInstance": ctx.node,
        "firstTimestamp": t, "lastTimestamp": t, "eventTime": micro, "count": 1,
        "action": reason
    });
    tokio::spawn(async move {
        let Ok(ev) = serde_json::from_value::<k8s_openapi::api::core::v1::Event>(ev) else {
            return;
        };
        let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(ctx.client.clone(), &ns);
        let _ = api.create(&kube::api::PostParams::default(), &ev).await;
    });
}
