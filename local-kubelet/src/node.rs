//! The Node object, its status and its Lease in kube-node-lease.

use crate::SharedCtx;
use crate::util::now;
use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

fn status(ctx: &SharedCtx) -> serde_json::Value {
    let t = now();
    let cond = |ty: &str, st: &str, reason: &str, msg: &str| {
        json!({"type": ty, "status": st, "reason": reason, "message": msg,
               "lastHeartbeatTime": t, "lastTransitionTime": t})
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .trim()
        .to_string();
    let machine_id = std::fs::read_to_string("/etc/machine-id")
        .unwrap_or_else(|_| "local".into())
        .trim()
        .to_string();
    // a kubelet's default pod capacity, unless LOCAL_KUBELET_MAX_PODS says otherwise (the
    // scale benchmark runs a thousand pods)
    let pods = std::env::var("LOCAL_KUBELET_MAX_PODS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(110)
        .to_string();
    let cap = json!({"cpu": "2", "memory": "24Gi", "pods": pods, "ephemeral-storage": "100Gi"});
    json!({"status": {
        "capacity": cap, "allocatable": cap,
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "local-kubelet is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": crate::net::node_ip()}, {"type": "Hostname", "address": ctx.node}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": crate::kubelet_api::PORT}},
        "nodeInfo": {
            "machineID": machine_id, "systemUUID": machine_id, "bootID": boot_id,
            "kernelVersion": kernel, "osImage": "Debian GNU/Linux (local-kubelet)",
            "containerRuntimeVersion": "local-kubelet://0.1.0", "kubeletVersion": "v1.37.2",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"
        }
    }})
}

pub async fn register(ctx: &SharedCtx) -> Result<()> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    if api.get_opt(&ctx.node).await?.is_none() {
        let mut labels = json!({
            "kubernetes.io/hostname": ctx.node, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64"});
        if let Some(zone) = &ctx.zone {
            // as a cloud's node controller labels nodes; the region is this machine
            labels["topology.kubernetes.io/zone"] = json!(zone);
            labels["topology.kubernetes.io/region"] = json!("local");
        }
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": ctx.node, "labels": labels},
            "spec": {"podCIDR": ctx.pod_cidr, "podCIDRs": [ctx.pod_cidr]}
        }))?;
        api.create(&PostParams::default(), &node).await?;
    }
    api.patch_status(
        &ctx.node,
        &PatchParams::default(),
        &Patch::Merge(status(ctx)),
    )
    .await?;
    renew_lease(ctx).await?;
    Ok(())
}

async fn renew_lease(ctx: &SharedCtx) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-node-lease");
    let renew = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    if api.get_opt(&ctx.node).await?.is_none() {
        let node = Api::<Node>::all(ctx.client.clone()).get(&ctx.node).await?;
        let lease: Lease = serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": ctx.node, "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": ctx.node,
                    "uid": node.metadata.uid}]},
            "spec": {"holderIdentity": ctx.node, "leaseDurationSeconds": 40, "renewTime": renew}
        }))?;
        api.create(&PostParams::default(), &lease).await?;
    } else {
        api.patch(
            &ctx.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": ctx.node, "renewTime": renew}})),
        )
        .await?;
    }
    Ok(())
}

/// Renews the Lease every `lease_renew` (10 s as a kubelet's by default; clusters of several
/// nodes renew faster, so that a stopped node is noticed within seconds) and posts the status
/// about every 30 s.
pub async fn heartbeat(ctx: SharedCtx) {
    let mut since_status = Duration::ZERO;
    loop {
        tokio::time::sleep(ctx.lease_renew).await;
        if let Err(e) = renew_lease(&ctx).await {
            tracing::warn!("lease renewal: {e}");
        }
        since_status += ctx.lease_renew;
        if since_status >= Duration::from_secs(30) {
            since_status = Duration::ZERO;
            // Ready condition heartbeat; re-create the Node if somebody deleted it
            if let Err(e) = register(&ctx).await {
                tracing::warn!("node status: {e}");
            }
        }
    }
}
