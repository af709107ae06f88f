//! The operator chart under OpenShift's default security context constraint, `restricted-v2`,
//! written as a check over the pods the chart renders (the admission itself runs in OpenShift's
//! API server, which does not run here). A namespace gets a uid range and a supplemental-group
//! range (`openshift.io/sa.scc.uid-range`, `openshift.io/sa.scc.supplemental-groups`); the
//! constraint then, per pod:
//!
//! - `runAsUser` (`MustRunAsRange`): a uid the pod or a container sets must be in the range;
//!   left unset, the admission assigns the range's first uid;
//! - `runAsGroup`: the constraint has no strategy for it; the check is stricter and refuses a
//!   fixed gid outside the range (OpenShift runs the process with group 0 and the fsGroup);
//! - `fsGroup` (`MustRunAs`): in the supplemental-group range, assigned when unset;
//! - `supplementalGroups`: `RunAsAny` in `restricted-v2`; the check is stricter (in range);
//! - no privileged container, `allowPrivilegeEscalation: false`, capabilities: `ALL` dropped,
//!   nothing added but `NET_BIND_SERVICE`;
//! - seccomp `RuntimeDefault` (the only profile allowed);
//! - no host network, PID, IPC or ports, and only the volume types `configMap`, `csi`,
//!   `downwardAPI`, `emptyDir`, `ephemeral`, `persistentVolumeClaim`, `projected`, `secret`;
//! - `runAsNonRoot` is allowed (the assigned uid is not 0).
//!
//! After the admission the process runs as the assigned uid. On a cluster without such an
//! admission the same pods leave the uid to the image: its `User` is numeric and not root
//! (`tests/image.rs`, `the_chart_leaves_the_uid_to_the_image_whose_user_is_numeric_and_not_root`),
//! which a kubelet enforcing `runAsNonRoot` accepts.

use serde_yaml::Value;

use crate::support::{helm_or_skip, operator_chart, s, template, text};

/// The uid and supplemental-group range OpenShift gives a namespace (`<first>/<size>`).
const RANGE: (i64, i64) = (1_000_680_000, 10_000);

fn in_range(v: i64) -> bool {
    v >= RANGE.0 && v < RANGE.0 + RANGE.1
}

const VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

fn int(v: &Value, path: &str) -> Option<i64> {
    s(v, path).and_then(Value::as_i64)
}

/// The pod templates of every workload rendered, with where they come from.
fn pod_specs(docs: &[Value]) -> Vec<(String, &Value)> {
    docs.iter()
        .filter_map(|d| {
            let kind = text(d, "kind");
            let spec = match kind.as_str() {
                "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
                    s(d, "spec.template.spec")
                }
                "CronJob" => s(d, "spec.jobTemplate.spec.template.spec"),
                "Pod" => s(d, "spec"),
                _ => None,
            }?;
            Some((format!("{kind} {}", text(d, "metadata.name")), spec))
        })
        .collect()
}

/// What `restricted-v2` refuses in one pod spec, as its admission would say it; empty when the
/// pod is admitted.
fn restricted_v2_refusals(pod: &Value) -> Vec<String> {
    let mut why = Vec::new();
    let psc = s(pod, "securityContext");
    let pint = |f: &str| psc.and_then(|p| int(p, f));
    if let Some(u) = pint("runAsUser").filter(|u| !in_range(*u)) {
        why.push(format!(
            "pod runAsUser {u}: must be in the ranges: [{}, {}]",
            RANGE.0,
            RANGE.0 + RANGE.1 - 1
        ));
    }
    if let Some(g) = pint("runAsGroup").filter(|g| !in_range(*g)) {
        why.push(format!("pod runAsGroup {g}: not in the namespace's range"));
    }
    if let Some(g) = pint("fsGroup").filter(|g| !in_range(*g)) {
        why.push(format!("pod fsGroup {g}: not an allowed group"));
    }
    for g in psc
        .and_then(|p| s(p, "supplementalGroups"))
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .filter(|g| !in_range(*g))
    {
        why.push(format!(
            "pod supplementalGroups {g}: not in the namespace's range"
        ));
    }
    if psc.and_then(|p| s(p, "seLinuxOptions")).is_some() {
        why.push("pod seLinuxOptions: fixed (MustRunAs the namespace's MCS)".into());
    }
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if text(pod, host) == "true" {
            why.push(format!("{host}: not allowed"));
        }
    }
    for v in s(pod, "volumes")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let types: Vec<String> = v
            .as_mapping()
            .into_iter()
            .flatten()
            .filter_map(|(k, _)| k.as_str())
            .filter(|k| *k != "name")
            .map(String::from)
            .collect();
        for t in types.iter().filter(|t| !VOLUMES.contains(&t.as_str())) {
            why.push(format!(
                "volume {}: {t} volumes are not allowed",
                text(v, "name")
            ));
        }
    }
    let pod_seccomp = psc.map(|p| text(p, "seccompProfile.type"));
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|f| s(pod, f).and_then(Value::as_sequence).into_iter().flatten());
    for c in containers {
        let name = text(c, "name");
        let sc = s(c, "securityContext");
        let cint = |f: &str| sc.and_then(|p| int(p, f));
        if let Some(u) = cint("runAsUser").filter(|u| !in_range(*u)) {
            why.push(format!(
                "container {name} runAsUser {u}: must be in the ranges: [{}, {}]",
                RANGE.0,
                RANGE.0 + RANGE.1 - 1
            ));
        }
        if let Some(g) = cint("runAsGroup").filter(|g| !in_range(*g)) {
            why.push(format!(
                "container {name} runAsGroup {g}: not in the namespace's range"
            ));
        }
        if sc.and_then(|p| s(p, "seLinuxOptions")).is_some() {
            why.push(format!("container {name} seLinuxOptions: fixed"));
        }
        if sc.map(|p| text(p, "privileged")).as_deref() == Some("true") {
            why.push(format!(
                "container {name}: privileged containers are not allowed"
            ));
        }
        if sc.map(|p| text(p, "allowPrivilegeEscalation")).as_deref() != Some("false") {
            why.push(format!(
                "container {name}: allowPrivilegeEscalation must be false"
            ));
        }
        let caps = |f: &str| -> Vec<String> {
            sc.and_then(|p| s(p, &format!("capabilities.{f}")))
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        };
        if !caps("drop").iter().any(|c| c == "ALL") {
            why.push(format!("container {name}: capabilities must drop ALL"));
        }
        for add in caps("add").iter().filter(|c| *c != "NET_BIND_SERVICE") {
            why.push(format!(
                "container {name}: capability {add} may not be added"
            ));
        }
        let seccomp = sc
            .map(|p| text(p, "seccompProfile.type"))
            .filter(|t| !t.is_empty())
            .or_else(|| pod_seccomp.clone().filter(|t| !t.is_empty()));
        if seccomp.as_deref() != Some("RuntimeDefault") {
            why.push(format!(
                "container {name}: seccomp profile {seccomp:?}, must be RuntimeDefault"
            ));
        }
        for p in s(c, "ports")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            if int(p, "hostPort").is_some_and(|h| h != 0) {
                why.push(format!("container {name}: host ports are not allowed"));
            }
        }
    }
    why
}

/// The uid a container runs as after the admission: its own or the pod's `runAsUser`, else the
/// range's first uid, which the admission assigns.
fn admitted_uid(pod: &Value, c: &Value) -> i64 {
    int(c, "securityContext.runAsUser")
        .or_else(|| int(pod, "securityContext.runAsUser"))
        .unwrap_or(RANGE.0)
}

/// Every pod the chart can render: the defaults (operator, PVC cleaner) and the exporter and
/// the operator-level defaults' volume on.
fn rendered() -> Option<Vec<Value>> {
    let helm = match crate::support::helm() {
        Ok(h) => h,
        Err(_) => return None,
    };
    let mut all = template(helm, &operator_chart(), "ops", &[], false);
    all.extend(template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "exporter.enabled=true",
            "clusterDefaults.pod.tolerations[0].key=dedicated",
            "watchNamespace=tenant-a",
        ],
        false,
    ));
    Some(all)
}

/// docs/running-on-real-clusters.md, "The operator chart on OpenShift": the chart installs on
/// OpenShift unchanged. Every pod it renders (operator, PVC cleaner, exporter) passes
/// `restricted-v2`'s rules for a namespace with an arbitrary uid range: no fixed uid or gid,
/// all capabilities dropped, `RuntimeDefault` seccomp, no privilege escalation, allowed volume
/// types only; and after the admission assigns a uid, each container runs as that uid, which
/// satisfies its `runAsNonRoot`.
#[test]
fn every_pod_of_the_operator_chart_is_admitted_by_openshift_restricted_v2() {
    let _ = helm_or_skip!();
    let docs = rendered().unwrap();
    let pods = pod_specs(&docs);
    let names: Vec<&str> = pods.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "Deployment rel-clickhouse-operator",
        "Deployment rel-clickhouse-operator-pvc-cleaner",
        "Deployment rel-clickhouse-operator-exporter",
    ] {
        assert!(names.contains(&want), "{want} is rendered: {names:?}");
    }
    let refused: Vec<String> = pods
        .iter()
        .flat_map(|(n, p)| {
            restricted_v2_refusals(p)
                .into_iter()
                .map(move |w| format!("{n}: {w}"))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "restricted-v2 refuses the chart's pods:\n{}",
        refused.join("\n")
    );
    for (n, p) in &pods {
        for c in s(p, "containers").and_then(Value::as_sequence).unwrap() {
            let non_root = text(c, "securityContext.runAsNonRoot") == "true"
                || text(p, "securityContext.runAsNonRoot") == "true";
            assert!(non_root, "{n}: runAsNonRoot is set");
            assert_ne!(admitted_uid(p, c), 0, "{n}: runs as the assigned uid");
        }
    }
}

/// The check refuses what `restricted-v2` refuses: a uid fixed outside the range (the chart's
/// earlier 65532), a fixed gid, a capability kept, no seccomp profile, a hostPath volume. A
/// uid inside the range passes.
#[test]
fn the_restricted_v2_check_refuses_fixed_ids_outside_the_range_and_privileges() {
    let pod = |y: &str| -> Value { serde_yaml::from_str(y).unwrap() };
    let good = "securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}\n\
                containers:\n- name: c\n  securityContext: {allowPrivilegeEscalation: false, \
                capabilities: {drop: [ALL]}}\n";
    assert_eq!(restricted_v2_refusals(&pod(good)), Vec::<String>::new());
    let in_range_uid = good.replace(
        "runAsNonRoot: true",
        "runAsNonRoot: true, runAsUser: 1000680005",
    );
    assert_eq!(
        restricted_v2_refusals(&pod(&in_range_uid)),
        Vec::<String>::new()
    );
    for (bad, says) in [
        (
            good.replace("runAsNonRoot: true", "runAsUser: 65532, runAsGroup: 65532"),
            "pod runAsUser 65532: must be in the ranges",
        ),
        (
            good.replace("runAsNonRoot: true", "runAsGroup: 65532"),
            "pod runAsGroup 65532",
        ),
        (
            good.replace("runAsNonRoot: true", "fsGroup: 101"),
            "pod fsGroup 101",
        ),
        (
            good.replace("drop: [ALL]", "drop: [NET_RAW]"),
            "capabilities must drop ALL",
        ),
        (
            good.replace("drop: [ALL]", "drop: [ALL], add: [IPC_LOCK]"),
            "capability IPC_LOCK may not be added",
        ),
        (
            good.replace(", seccompProfile: {type: RuntimeDefault}", ""),
            "must be RuntimeDefault",
        ),
        (
            good.replace("allowPrivilegeEscalation: false", "privileged: true"),
            "privileged containers are not allowed",
        ),
        (
            format!("{good}volumes:\n- name: h\n  hostPath: {{path: /}}\n"),
            "hostPath volumes are not allowed",
        ),
        (format!("{good}hostNetwork: true\n"), "hostNetwork"),
    ] {
        let why = restricted_v2_refusals(&pod(&bad));
        assert!(
            why.iter().any(|w| w.contains(says)),
            "{bad}\nrefused with {why:?}, want {says:?}"
        );
    }
}
