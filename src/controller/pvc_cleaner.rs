//! The PVC cleaner (S0-29): deletes PVCs labelled `clickhouse.com/delete-pvc` once no pod
//! uses them. It never touches an unlabelled PVC, never one a pod still mounts, and never one
//! without a valid proof: the annotation `clickhouse.com/delete-pvc-proof`, an HMAC-SHA256 of
//! the PVC's namespace, name and uid under the key only the operator and the cleaner hold
//! (`PVC_DELETE_KEY`, decision 39). Labels are set by anyone who may patch a PVC; the proof
//! only by the operator, when a scale-in or a cluster's `reclaimPolicy: Delete` hands a PVC
//! over. It reads no ClickHouseCluster, so it runs as its own component
//! (`clickhouse-operator pvc-cleaner`).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use super::kube::{gone_or_replaced, namespaced, namespaced_or_all};
use crate::model::labels;
use crate::model::labels::DELETE_PVC as DELETE_PVC_LABEL;
use crate::runtime::settings::{PvcDeleteKey, WatchNamespaces};

/// The annotation that proves the operator handed a PVC to the cleaner.
pub const PROOF_ANNOTATION: &str = "clickhouse.com/delete-pvc-proof";

/// PURE: the proof for the PVC `namespace/name` with `uid`: HMAC-SHA256 under `key`, in hex.
pub fn proof(key: &PvcDeleteKey, namespace: &str, name: &str, uid: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&key.key)
        .expect("HMAC takes a key of any length");
    mac.update(format!("{namespace}/{name}/{uid}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// PURE: whether `pvc` carries a valid proof under `key` (compared in constant time).
pub fn proven(key: &PvcDeleteKey, pvc: &PersistentVolumeClaim) -> bool {
    use hmac::{Hmac, Mac};
    let Some(given) = pvc.annotations().get(PROOF_ANNOTATION) else {
        return false;
    };
    let Ok(given) = hex::decode(given) else {
        return false;
    };
    let (ns, name) = (pvc.namespace().unwrap_or_default(), pvc.name_any());
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&key.key)
        .expect("HMAC takes a key of any length");
    mac.update(format!("{ns}/{name}/{uid}").as_bytes());
    !uid.is_empty() && mac.verify_slice(&given).is_ok()
}

/// How often the cleaner looks.
pub const PERIOD: Duration = Duration::from_secs(10);

/// PURE: the labelled PVCs with a valid proof that no pod mounts.
pub fn deletable<'a>(
    key: &PvcDeleteKey,
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
        .filter(|p| proven(key, p))
        .filter(|p| !in_use.contains(&(p.namespace().unwrap_or_default(), p.name_any())))
        .collect()
}

/// One sweep over `namespace` (or all namespaces), given its `labelled` PVCs as the watch has
/// them: lists the pods, deletes each deletable PVC only if it is still the one seen (its uid
/// as a precondition). Returns the PVCs deleted.
pub async fn sweep(
    client: &Client,
    key: &PvcDeleteKey,
    namespace: Option<&str>,
    labelled: &[PersistentVolumeClaim],
) -> Result<Vec<String>, kube::Error> {
    if labelled.is_empty() {
        return Ok(Vec::new());
    }
    let pods: Api<Pod> = namespaced_or_all(client, namespace);
    let pods = pods.list(&ListParams::default()).await?.items;
    let mut deleted = Vec::new();
    for p in labelled.iter().filter(|p| !proven(key, p)) {
        warn!(namespace = ?p.namespace(), pvc = %p.name_any(), "labelled {DELETE_PVC_LABEL} without a valid proof: kept");
    }
    for pvc in deletable(key, labelled, &pods) {
        let ns = pvc.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = namespaced(client, &ns);
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: pvc.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pvc.name_any(), &dp).await {
            Ok(_) => {
                info!(namespace = %ns, pvc = %pvc.name_any(), "deleted a PVC labelled {DELETE_PVC_LABEL}");
                deleted.push(format!("{ns}/{}", pvc.name_any()));
            }
            // gone, or another PVC under its name
            Err(e) if gone_or_replaced(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// Sweeps each watched namespace (or all) whenever a PVC labelled for deletion appears or
/// changes, and every `PERIOD` while one is left (its pod may have gone meanwhile), until the
/// process ends. With no such PVC it sends no request but its watch.
pub async fn run(client: Client, namespaces: WatchNamespaces, key: PvcDeleteKey) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let targets: Vec<Option<String>> = match &namespaces {
        WatchNamespaces::All => vec![None],
        WatchNamespaces::Only(list) => list.iter().cloned().map(Some).collect(),
    };
    let selector = format!(
        "{DELETE_PVC_LABEL}=true,{}={},{}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::CLUSTER
    );
    let watches = targets.iter().map(|ns| {
        let api: Api<PersistentVolumeClaim> = namespaced_or_all(&client, ns.as_deref());
        let (store, writer) = kube::runtime::reflector::store();
        let events = watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .reflect(writer)
            .applied_objects()
            .map(|_| ())
            .boxed();
        (store, events)
    });
    let (stores, streams): (Vec<_>, Vec<_>) = watches.unzip();
    let mut events = futures::stream::select_all(streams);
    loop {
        // a labelled PVC appeared or changed, or the period passed
        let _ = tokio::time::timeout(PERIOD, events.next()).await;
        for (ns, store) in targets.iter().zip(&stores) {
            let labelled: Vec<PersistentVolumeClaim> =
                store.state().iter().map(|p| (**p).clone()).collect();
            if labelled.is_empty() {
                continue;
            }
            if let Err(e) = sweep(&client, &key, ns.as_deref(), &labelled).await {
                warn!(error = %e, namespace = ?ns, "PVC cleaner sweep failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodSpec, Volume};
    use std::collections::BTreeMap;

    fn key() -> PvcDeleteKey {
        PvcDeleteKey::from_value(Some("a key of sixteen or more")).unwrap()
    }

    /// A PVC, labelled and signed by the operator when `labelled`.
    fn pvc(name: &str, labelled: bool) -> PersistentVolumeClaim {
        let mut p = PersistentVolumeClaim::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("t1".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        if labelled {
            p.metadata.annotations = Some(BTreeMap::from([(
                PROOF_ANNOTATION.to_string(),
                proof(&key(), "t1", name, &format!("uid-{name}")),
            )]));
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
        let names: Vec<String> = deletable(&key(), &pvcs, &pods)
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, ["a"]);
    }

    /// Decision 39 (confused deputy): a PVC that carries the delete label but not this operator's
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
        let names: Vec<String> = deletable(&key(), &pvcs, &[])
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, ["ours"]);
    }

    /// Decision 39: every label the operator sets can be set by whoever may patch a PVC;
    /// the proof cannot. A foreign PVC with all the labels, one with a proof copied from another
    /// PVC, one with a proof under another key, or one recreated under the same name (another
    /// uid) is kept.
    #[test]
    fn labels_without_the_operators_proof_delete_nothing() {
        let mut forged = pvc("app-data", true);
        forged.metadata.annotations = None;
        let mut copied = pvc("app-data-2", true);
        copied.metadata.annotations = pvc("ours", true).metadata.annotations;
        let mut other_key = pvc("app-data-3", true);
        other_key.metadata.annotations = Some(BTreeMap::from([(
            PROOF_ANNOTATION.to_string(),
            proof(
                &PvcDeleteKey::from_value(Some("another key, long enough")).unwrap(),
                "t1",
                "app-data-3",
                "uid-app-data-3",
            ),
        )]));
        let mut recreated = pvc("data-c1-0-1-0", true);
        recreated.metadata.uid = Some("a-new-uid".into());
        let mut junk = pvc("app-data-4", true);
        junk.metadata.annotations = Some(BTreeMap::from([(
            PROOF_ANNOTATION.to_string(),
            "not hex".to_string(),
        )]));
        let pvcs = vec![
            forged,
            copied,
            other_key,
            recreated,
            junk,
            pvc("data-c1-0-2-0", true),
        ];
        let names: Vec<String> = deletable(&key(), &pvcs, &[])
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, ["data-c1-0-2-0"]);
        assert!(PvcDeleteKey::from_value(Some("short")).is_err());
        let made_up = PvcDeleteKey::from_value(None).unwrap();
        assert!(!made_up.shared && made_up.key.len() == 32);
        assert!(
            !format!("{made_up:?}").contains(&format!("{:?}", made_up.key)),
            "never printed"
        );
    }
}
