//! What a cluster deleted with `reclaimPolicy: Retain` leaves beside its volumes (decision 30).
//!
//! The data on retained volumes depends on credentials the operator generated: the servers'
//! replicated tables live in Keeper nodes whose ACL names the cluster's Keeper identity, kept in
//! `<cluster>-operator`. Garbage collection would delete that Secret with the cluster, and a
//! cluster created again with the same name (a GitOps tool, `kubectl delete -f` then
//! `apply -f`) would get a new identity and find every replicated table closed to it.
//!
//! So at deletion the Secret is handed from the cluster to the retained PVCs: they become its
//! owners, and garbage collection deletes it once the last of them is gone, so it lives exactly
//! as long as the data that needs it. A cluster created again with the name finds it and takes
//! it over ([`crate::plan::step::Step::AdoptOperatorSecret`]). With `reclaimPolicy: Delete`
//! the Secret goes with the cluster, as its volumes do.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::info;

use super::{Error, api};
use crate::api::ClickHouseCluster;
use crate::controller::Context;
use crate::controller::kube::ignore_not_found;
use crate::model::{labels, names};

/// Owner references to `pvcs` (those not being deleted).
pub fn owners(pvcs: &[PersistentVolumeClaim]) -> Vec<OwnerReference> {
    pvcs.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            Some(OwnerReference {
                api_version: "v1".into(),
                kind: "PersistentVolumeClaim".into(),
                name: p.metadata.name.clone()?,
                uid: p.metadata.uid.clone()?,
                ..OwnerReference::default()
            })
        })
        .collect()
}

/// Makes the cluster's PVCs the owners of `<cluster>-operator` instead of the cluster. Without
/// a PVC (nothing retained) the Secret stays the cluster's and goes with it.
pub async fn hand_credentials_to_volumes(
    cluster: &ClickHouseCluster,
    ctx: &Context,
) -> Result<(), Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let lp = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
    let pvcs = api::<PersistentVolumeClaim>(ctx, &ns)
        .list(&lp)
        .await?
        .items;
    let owners = owners(&pvcs);
    if owners.is_empty() {
        return Ok(());
    }
    let secret = names::operator_secret(&name);
    ignore_not_found(
        api::<Secret>(ctx, &ns)
            .patch(
                &secret,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"ownerReferences": owners}})),
            )
            .await,
    )?;
    info!(cluster = %name, secret = %secret, volumes = owners.len(), "the credentials Secret stays with the retained volumes");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A PVC being deleted is no owner: the Secret must not outlive the data through it, nor
    /// die with it while other volumes remain.
    #[test]
    fn the_volumes_not_being_deleted_own_the_credentials() {
        let pvc = |name: &str, deleting: bool| -> PersistentVolumeClaim {
            let mut v = json!({"metadata": {"name": name, "uid": format!("uid-{name}")}});
            if deleting {
                v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(v).unwrap()
        };
        let o = owners(&[pvc("data-c1-0-0-0", false), pvc("data-c1-0-1-0", true)]);
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].kind, "PersistentVolumeClaim");
        assert_eq!(o[0].name, "data-c1-0-0-0");
        assert_eq!(o[0].uid, "uid-data-c1-0-0-0");
        assert_eq!(
            o[0].controller, None,
            "no controller: nothing reconciles a Secret for them"
        );
    }
}
