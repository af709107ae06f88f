//! The default StorageClass `local` and its provisioner: one folder per claim under
//! `<data dir>/pv/`, a PersistentVolume bound to the claim by `claimRef`, the folder deleted when
//! a Released volume has reclaim policy Delete, expansion by updating the capacity. As an
//! external provisioner does, it also serves the claims of any other StorageClass that names
//! it (`provisioner: local-kubelet.local/hostpath`), their volumes of that class.

use crate::{PROVISIONER, STORAGE_CLASS, SharedCtx};
use anyhow::Result;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// A claim annotated `local-kubelet.clickhouse.com/expansion: offline` is expanded as by a
/// driver without online expansion: the capacity of the volume grows at once, the file system
/// only when the volume is next mounted, with `FileSystemResizePending` meanwhile (a real
/// cluster has this per driver, that is per StorageClass; here per claim).
pub const EXPANSION_ANNOTATION: &str = "local-kubelet.clickhouse.com/expansion";

fn offline(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPANSION_ANNOTATION))
        .is_some_and(|v| v == "offline")
}

fn fs_resize_pending(pvc: &PersistentVolumeClaim) -> bool {
    pvc.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "FileSystemResizePending" && c.status == "True")
}

/// At a pod's mount of `pvc`: the file system of a volume whose resize waits for a mount grows
/// now, as a kubelet's NodeExpandVolume does, and the claim reports its new capacity.
pub async fn expand_at_mount(ctx: &SharedCtx, pvc: &PersistentVolumeClaim) {
    if !fs_resize_pending(pvc) {
        return;
    }
    let Some(request) = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .map(|q| q.0.clone())
    else {
        return;
    };
    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"storage": request},
                "allocatedResources": {"storage": request}, "conditions": null}})),
        )
        .await
    {
        Ok(_) => tracing::info!("{ns}/{name}: file system grown to {request} at mount"),
        Err(e) => tracing::warn!("{ns}/{name}: finishing the file system resize: {e}"),
    }
}

async fn ensure_class(ctx: &SharedCtx) -> Result<()> {
    let api: Api<StorageClass> = Api::all(ctx.client.clone());
    if api.get_opt(STORAGE_CLASS).await?.is_none() {
        let sc: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": true
        }))?;
        api.create(&PostParams::default(), &sc).await?;
        tracing::info!("created StorageClass {STORAGE_CLASS}");
    }
    Ok(())
}

pub fn pv_root(ctx: &SharedCtx) -> PathBuf {
    ctx.data_dir.join("pv")
}

fn quantity_bytes(q: &str) -> Option<u128> {
    let q = q.trim();
    let idx = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suf) = q.split_at(idx);
    let n: f64 = num.parse().ok()?;
    let m: f64 = match suf {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    Some((n * m) as u128)
}

/// One round of the provisioner over the watch-fed caches of claims and volumes (listing both
/// from the API server every second was, at a thousand claims, a large part of the machine's
/// load). `created` holds the volumes this agent created that the cache may not show yet.
async fn sync_once(ctx: &SharedCtx, created: &mut HashSet<String>) -> Result<()> {
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let claims = ctx.pvcs.state();
    let volumes: HashMap<String, Arc<PersistentVolume>> = ctx
        .pvs
        .state()
        .into_iter()
        .map(|v| (v.metadata.name.clone().unwrap_or_default(), v))
        .collect();
    created.retain(|n| !volumes.contains_key(n));
    // whether each class of the claims names this provisioner (asked once a round, for the
    // classes other than `local`, which only tests create)
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let mut ours: HashMap<String, bool> = HashMap::from([(STORAGE_CLASS.to_string(), true)]);
    for pvc in &claims {
        let Some(spec) = &pvc.spec else { continue };
        let Some(class) = spec.storage_class_name.as_deref() else {
            continue;
        };
        if !ours.contains_key(class) {
            let named = classes
                .get_opt(class)
                .await?
                .is_some_and(|c| c.provisioner == PROVISIONER);
            ours.insert(class.to_string(), named);
        }
        if !ours[class] {
            continue;
        }
        let request = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "1Gi".into());
        let bound_to = spec.volume_name.clone().filter(|v| !v.is_empty());
        if bound_to.is_none() {
            provision(ctx, &pvs, pvc, &request, &volumes, created).await?;
        }
        if let Some(pv_name) = &bound_to
            && let Some(pv) = volumes.get(pv_name)
            && is_ours(pv)
            && on_this_node(ctx, pv)
        {
            expand(ctx, &pvs, pvc, pv, &request).await?;
        }
    }
    reclaim(ctx, &pvs, &volumes).await;
    Ok(())
}

/// A volume of `request` for the unbound claim `pvc` when the scheduler selected this node for
/// it (and no such volume exists or was just created): a folder of this node, bound to the claim.
async fn provision(
    ctx: &SharedCtx,
    pvs: &Api<PersistentVolume>,
    pvc: &PersistentVolumeClaim,
    request: &str,
    volumes: &HashMap<String, Arc<PersistentVolume>>,
    created: &mut HashSet<String>,
) -> Result<()> {
    let Some(spec) = &pvc.spec else {
        return Ok(());
    };
    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let selected = pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SELECTED_NODE))
        .cloned();
    if pvc.metadata.deletion_timestamp.is_some() || selected.as_deref() != Some(ctx.node.as_str()) {
        return Ok(());
    }
    let pv_name = format!("pvc-{uid}");
    if volumes.contains_key(&pv_name) || created.contains(&pv_name) {
        return Ok(());
    }
    let dir = pv_root(ctx).join(&pv_name);
    std::fs::create_dir_all(&dir)?;
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name,
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
        "spec": {
            "capacity": {"storage": request},
            "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": spec.storage_class_name.as_deref().unwrap_or(STORAGE_CLASS),
            "volumeMode": "Filesystem",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": ns, "name": name, "uid": uid,
                "resourceVersion": pvc.metadata.resource_version},
            "hostPath": {"path": dir.to_string_lossy(), "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [ctx.node]}]}]}}
        }
    }))?;
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => {
            tracing::info!("provisioned {pv_name} for {ns}/{name} ({request})");
            created.insert(pv_name);
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            created.insert(pv_name);
        }
        Err(e) => tracing::warn!("creating {pv_name}: {e}"),
    }
    Ok(())
}

/// Expansion of this node's volume `pv`, bound to `pvc`, to the claim's `request`: the volume's
/// capacity, then the claim's, at once or (a claim that asks for offline expansion) as a driver
/// without online expansion does, when the volume is next mounted.
async fn expand(
    ctx: &SharedCtx,
    pvs: &Api<PersistentVolume>,
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    request: &str,
) -> Result<()> {
    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let cap = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let status_cap = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let want = quantity_bytes(request).unwrap_or(0);
    if want > quantity_bytes(&cap).unwrap_or(0) {
        pvs.patch(
            &pv_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacity": {"storage": request}}})),
        )
        .await?;
        tracing::info!("expanded {pv_name} to {request}");
    }
    if want > quantity_bytes(&status_cap).unwrap_or(0)
        && pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        && offline(pvc)
    {
        // as a driver without online expansion: the file system grows when the
        // volume is next mounted (`expand_at_mount`)
        if !fs_resize_pending(pvc) {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "allocatedResources": {"storage": request},
                    "conditions": [{"type": "FileSystemResizePending", "status": "True",
                        "lastTransitionTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
                        "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node."}]}})),
            )
            .await?;
            tracing::info!("{ns}/{name}: file system resize pending until the next mount");
        }
    } else if want > quantity_bytes(&status_cap).unwrap_or(0)
        && pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
    {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"storage": request},
                "allocatedResources": {"storage": request}, "conditions": null}})),
        )
        .await?;
    }
    Ok(())
}

/// This node's released volumes with reclaim policy Delete go, with their folders.
async fn reclaim(
    ctx: &SharedCtx,
    pvs: &Api<PersistentVolume>,
    volumes: &HashMap<String, Arc<PersistentVolume>>,
) {
    for pv in volumes.values() {
        if !is_ours(pv) || !on_this_node(ctx, pv) {
            continue;
        }
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
        if phase == Some("Released") && policy == Some("Delete") {
            let name = pv.metadata.name.clone().unwrap_or_default();
            if let Some(path) = pv
                .spec
                .as_ref()
                .and_then(|s| s.host_path.as_ref())
                .map(|h| PathBuf::from(&h.path))
                && path.starts_with(pv_root(ctx))
            {
                let _ = std::fs::remove_dir_all(&path);
            }
            match pvs.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!("deleted released {name} and its folder"),
                // already gone; the cache has not seen it yet
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => tracing::warn!("deleting {name}: {e}"),
            }
        }
    }
}

/// Whether the volume's folder is this node's: with several nodes, each agent expands and
/// reclaims only its own volumes (another node's folder is not on its disk).
fn on_this_node(ctx: &SharedCtx, pv: &PersistentVolume) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.host_path.as_ref())
        .is_some_and(|h| std::path::Path::new(&h.path).starts_with(pv_root(ctx)))
}

fn is_ours(pv: &PersistentVolume) -> bool {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
        .map(|p| p == PROVISIONER)
        .unwrap_or(false)
}

pub async fn run(ctx: SharedCtx) {
    let mut n = 0u64;
    let mut created = HashSet::new();
    loop {
        if n.is_multiple_of(30)
            && let Err(e) = ensure_class(&ctx).await
        {
            tracing::warn!("storage class: {e}");
        }
        if let Err(e) = sync_once(&ctx, &mut created).await {
            tracing::warn!("provisioner: {e}");
        }
        n += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quantities() {
        assert_eq!(super::quantity_bytes("1Gi"), Some(1 << 30));
        assert_eq!(super::quantity_bytes("500M"), Some(500_000_000));
    }
}
