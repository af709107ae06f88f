//! A pod's status as the kubelet reports it: its containers' statuses, its phase and its
//! conditions.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

use super::{Containers, Runner, waiting};
use crate::util;

/// The status of `cur` at `ip`, started at `start_time`, with `containers` so far;
/// `volume_error`, when not empty, is why its containers are not created yet.
pub(super) fn pod_status(
    cur: &Pod,
    ip: &str,
    start_time: &str,
    containers: &Containers,
    volume_error: &str,
) -> Value {
    let init_statuses = container_statuses(
        &containers.init_specs,
        &containers.init_runners,
        true,
        volume_error,
    );
    let main_statuses = container_statuses(
        &containers.main_specs,
        &containers.main_runners,
        false,
        volume_error,
    );
    let (main_specs, main_runners) = (&containers.main_specs, &containers.main_runners);
    let init_done = containers.init_done();
    let all_ready = !main_runners.is_empty()
        && main_runners.len() == main_specs.len()
        && main_runners.iter().all(|r| r.shared.lock().unwrap().ready);
    let not_ready: Vec<String> = main_specs
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            main_runners
                .get(*i)
                .map(|r| !r.shared.lock().unwrap().ready)
                .unwrap_or(true)
        })
        .map(|(_, c)| c.name.clone())
        .collect();
    let phase = phase(containers);
    let conditions = conditions(cur, init_done, all_ready, &not_ready);
    let mut st = json!({
        "observedGeneration": cur.metadata.generation,
        "phase": phase,
        "conditions": conditions,
        "hostIP": crate::net::node_ip(), "hostIPs": [{"ip": crate::net::node_ip()}],
        "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": start_time,
        "containerStatuses": main_statuses,
    });
    if !containers.init_specs.is_empty() {
        st["initContainerStatuses"] = json!(init_statuses);
    }
    st
}

/// The statuses of the containers `specs` (init containers when `init`), of those started from
/// their runners.
fn container_statuses(
    specs: &[Container],
    runners: &[Runner],
    init: bool,
    volume_error: &str,
) -> Vec<Value> {
    specs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if let Some(r) = runners.get(i) {
                let s = r.shared.lock().unwrap();
                let mut v = json!({
                    "name": r.name, "image": r.image,
                    "imageID": format!("local-kubelet://{}", s.program),
                    "ready": s.ready, "started": s.started,
                    "restartCount": s.restart_count,
                    "state": s.state, "lastState": s.last_state,
                });
                if !s.container_id.is_empty() {
                    v["containerID"] = json!(s.container_id);
                }
                v
            } else {
                let reason = if init || !volume_error.is_empty() {
                    if init {
                        "PodInitializing"
                    } else {
                        "ContainerCreating"
                    }
                } else {
                    "PodInitializing"
                };
                json!({"name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                    "ready": false, "started": false, "restartCount": 0,
                    "state": waiting(reason, volume_error), "lastState": {}})
            }
        })
        .collect()
}

/// `Failed` once an init container failed; `Succeeded` or `Failed` once every container
/// finished for good; `Pending` while one never started; else `Running`.
fn phase(containers: &Containers) -> &'static str {
    let (main_specs, main_runners) = (&containers.main_specs, &containers.main_runners);
    let init_failed = containers.init_runners.iter().any(|r| {
        let f = r.shared.lock().unwrap().finished;
        f.is_some() && f != Some(0)
    });
    let finished: Vec<Option<i32>> = main_runners
        .iter()
        .map(|r| r.shared.lock().unwrap().finished)
        .collect();
    let never_started = main_runners.len() < main_specs.len()
        || main_runners.iter().any(|r| {
            let s = r.shared.lock().unwrap();
            s.container_id.is_empty()
        });
    if init_failed {
        "Failed"
    } else if !finished.is_empty()
        && finished.len() == main_specs.len()
        && finished.iter().all(|f| f.is_some())
    {
        if finished.iter().all(|f| *f == Some(0)) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if never_started {
        "Pending"
    } else {
        "Running"
    }
}

/// The pod's conditions: the kubelet's four (`Ready` also waiting for the readiness gates), each
/// keeping its transition time while its status is unchanged, and those owned by others as
/// they are.
fn conditions(cur: &Pod, init_done: bool, all_ready: bool, not_ready: &[String]) -> Vec<Value> {
    // conditions keep their transition time while their status is unchanged
    let old: Vec<Value> = cur
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| serde_json::to_value(c).unwrap_or_default())
        .collect();
    let now = util::now();
    let cond = |ty: &str, ok: bool, reason: &str, msg: &str| -> Value {
        let st = if ok { "True" } else { "False" };
        let t = old
            .iter()
            .find(|c| c["type"] == ty && c["status"] == st)
            .and_then(|c| c["lastTransitionTime"].as_str().map(String::from))
            .unwrap_or_else(|| now.clone());
        let mut v =
            json!({"type": ty, "status": st, "lastProbeTime": null, "lastTransitionTime": t});
        if !ok && !reason.is_empty() {
            v["reason"] = json!(reason);
            v["message"] = json!(msg);
        }
        v
    };
    let nr_msg = format!("containers with unready status: [{}]", not_ready.join(" "));
    let mut conditions = vec![
        cond("PodReadyToStartContainers", true, "", ""),
        cond(
            "Initialized",
            init_done,
            "ContainersNotInitialized",
            "containers with incomplete status: init containers",
        ),
        cond("ContainersReady", all_ready, "ContainersNotReady", &nr_msg),
    ];
    // readiness gates: conditions set by others must be True too
    let gates: Vec<String> = cur
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.condition_type)
        .collect();
    let open_gates: Vec<&String> = gates
        .iter()
        .filter(|g| {
            !old.iter()
                .any(|c| c["type"] == g.as_str() && c["status"] == "True")
        })
        .collect();
    if all_ready && !open_gates.is_empty() {
        let msg = format!(
            "corresponding condition of pod readiness gate {:?} does not exist or is not True",
            open_gates
        );
        conditions.push(cond("Ready", false, "ReadinessGatesNotReady", &msg));
    } else {
        conditions.push(cond("Ready", all_ready, "ContainersNotReady", &nr_msg));
    }
    // conditions owned by others (PodScheduled, DisruptionTarget, readiness gates, …) stay
    const OURS: [&str; 4] = [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
    ];
    for c in &old {
        if !OURS.iter().any(|o| c["type"] == *o) {
            conditions.push(c.clone());
        }
    }
    conditions
}
