//! The PVC cleaner (S0-29): deletes PVCs labelled `clickhouse.com/delete-pvc` once no pod
//! uses them. It never touches an unlabelled PVC, never one a pod still mounts, and never one
//! that does not carry this operator's cluster labels (`app.kubernetes.io/managed-by:
//! clickhouse-operator` and `clickhouse.com/cluster`): the delete label alone, which anyone who
//! may label a PVC can set, does not make it delete someone else's volume. It reads no
//! ClickHouseCluster, so it runs as its own component (`clickhouse-operator pvc-cleaner`).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use super::cluster::DELETE_PVC_LABEL;
use crate::model::labels;
use crate::runtime::settings::WatchNamespaces;

/// How often the cleaner looks.
pub const PERIOD: Duration = Duration::from_secs(10);

/// PURE: the labelled PVCs that no pod mounts.
pub fn deletable<'a>(
    pvcs: &'a [PersistentVolumeClaim],
    pods: &[Pod],
) -> Vec<&'a PersistentVolumeClaim> {
    let in_use: BTreeSet<(String, String)> = pods
        .iter()
        .flat_map(|p| {
            let ns = p.namespace().unwrap_or_default();
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(move |c| (ns.clone(), c.claim_name.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    pvcs.iter()
        .filter(|p| {
            let l = p.labels();
            l.get(DELETE_PVC_LABEL).is_some_and(|v| v == "true")
                && l.get(labels::MANAGED_BY)
                    .is_some_and(|v| v == labels::MANAGED_BY_VALUE)
                && l.get(labels::CLUSTER).is_some_and(|v| !v.is_empty())
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !in_use.contains(&(p.namespace().unwrap_or_default(), p.name_any())))
        .collect()
}

/// One sweep over `namespace` (or all namespaces). Returns the PVCs deleted.
pub async fn sweep(client: &Client, namespace: Option<&str>) -> Result<Vec<String>, kube::Error> {
    let (pvcs, pods): (Api<PersistentVolumeClaim>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let labelled = pvcs
        .list(&ListParams::default().labels(&format!(
            "{DELETE_PVC_LABEL}=true,{}={},{}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE,
            labels::CLUSTER
        )))
        .await?
        .items;
    if labelled.is_empty() {
        return Ok(Vec::new());
    }
    let pods = pods.list(&ListParams::default()).await?.items;
    let mut deleted = Vec::new();
    for pvc in deletable(&labelled, &pods) {
        let ns = pvc.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        match api.delete(&pvc.name_any(), &DeleteParams::default()).await {
            Ok(_) => {
                info!(namespace = %ns, pvc = %pvc.name_any(), "deleted a PVC labelled {DELETE_PVC_LABEL}");
                deleted.push(format!("{ns}/{}", pvc.name_any()));
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// Sweeps every `PERIOD` until the process ends.
pub async fn run(client: Client, namespaces: WatchNamespaces) {
    loop {
        let targets: Vec<Option<String>> = match &namespaces {
            WatchNamespaces::All => vec![None],
            WatchNamespaces::Only(list) => list.iter().cloned().map(Some).collect(),
        };
        for ns in targets {
            if let Err(e) = sweep(&client, ns.as_deref()).await {
                warn!(error = %e, namespace = ?ns, "PVC cleaner sweep failed");
            }
        }
        tokio::time::sleep(PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodSpec, Volume};
    use std::collections::BTreeMap;

    fn pvc(name: &str, labelled: bool) -> PersistentVolumeClaim {
        let mut p = PersistentVolumeClaim::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("t1".into());
        if labelled {
            p.metadata.labels = Some(BTreeMap::from([
                (DELETE_PVC_LABEL.to_string(), "true".to_string()),
                (
                    labels::MANAGED_BY.to_string(),
                    labels::MANAGED_BY_VALUE.to_string(),
                ),
                (labels::CLUSTER.to_string(), "c1".to_string()),
            ]));
        }
        p
    }

    fn pod_using(claim: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("t1".into());
        p.spec = Some(PodSpec {
            volumes: Some(vec![Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    /// S0-29: only labelled PVCs that no pod mounts are deleted.
    #[test]
    fn only_labelled_unused_pvcs_are_deleted() {
        let pvcs = vec![pvc("a", true), pvc("b", true), pvc("c", false)];
        let pods = vec![pod_using("b"), pod_using("c")];
        let names: Vec<String> = deletable(&pvcs, &pods)
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, ["a"]);
    }

    /// Issue 15 (confused deputy): a PVC that carries the delete label but not this operator's
    /// cluster labels is never deleted.
    #[test]
    fn a_delete_label_alone_does_not_make_a_pvc_deletable() {
        let mut foreign = pvc("someone-elses", false);
        foreign.metadata.labels = Some(BTreeMap::from([(
            DELETE_PVC_LABEL.to_string(),
            "true".to_string(),
        )]));
        let mut other_manager = pvc("other-manager", true);
        other_manager
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(labels::MANAGED_BY.into(), "helm".into());
        let pvcs = vec![foreign, other_manager, pvc("ours", true)];
        let names: Vec<String> = deletable(&pvcs, &[]).iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["ours"]);
    }
}
