//! Pods on this machine: their uids and restarts, addresses, volumes' folders, processes and
//! container logs.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kube::Client;
use kube::api::Api;

use super::{kubeconfig, wait_for};

/// Where the local kubelet keeps container logs: `<dir>/<ns>_<pod>_<uid8>/<container>.log`,
/// kept after the pod is gone.
pub fn pod_log_dir() -> PathBuf {
    kubeconfig().with_file_name("logs").join("pods")
}

/// (uid, restartCount) of the pods of `ns` that match the label `selector` ("" for all), by
/// pod name: equal before and after means no pod restarted.
pub async fn pod_ids(
    client: &Client,
    ns: &str,
    selector: &str,
) -> std::collections::BTreeMap<String, (String, i32)> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect()
}

/// The folder of claim `pvc` on this machine .
pub async fn volume_path(client: &Client, ns: &str, pvc: &str) -> PathBuf {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get(pvc)
        .await
        .unwrap();
    let pv = claim.spec.unwrap().volume_name.unwrap();
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv)
        .await
        .unwrap();
    PathBuf::from(pv.spec.unwrap().host_path.unwrap().path)
}

/// The pid of the process of a pod's container whose command line holds `program` (the node
/// agent runs containers as processes of this machine, with the pod's name as `HOSTNAME`), and,
/// when `ip` is given, whose network namespace holds that address (a pod of the same name in
/// another namespace is another process).
pub fn pid_of(program: &str, pod: &str, ip: Option<&str>) -> i32 {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(program) {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if !environ
            .split(|b| *b == 0)
            .any(|v| v == format!("HOSTNAME={pod}").as_bytes())
        {
            continue;
        }
        let Some(ip) = ip else { return pid };
        let addrs = Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-n",
                "ip",
                "-o",
                "-4",
                "addr",
                "show",
            ])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&addrs.stdout).contains(&format!("inet {ip}/")) {
            return pid;
        }
    }
    panic!("no {program} process of pod {pod}");
}

/// The address of pod `pod`, once it has one.
pub async fn pod_ip(client: &Client, ns: &str, pod: &str) -> String {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        Duration::from_secs(120),
        &format!("an address for {pod}"),
        || {
            let pods = pods.clone();
            async move { pods.get(pod).await.ok()?.status?.pod_ip }
        },
    )
    .await
}
