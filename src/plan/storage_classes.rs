//! PURE: the operator-level default storage classes (decision 59), pinned to a cluster for its
//! life.
//!
//! A storage class cannot change once a volume exists, so a default that changed under running
//! clusters would be refused by every one of them. The classes a cluster takes are therefore
//! settled once: a cluster whose volumes do not exist yet takes the defaults of the moment and
//! the status keeps them (`status.defaultStorageClasses`); a cluster that has volumes and no
//! record (made before the defaults named a class, or its status lost) keeps the classes its
//! volumes have. The spec each pass plans with then names, where the cluster's own spec names
//! none, the pinned class: for the server's data volume, its disks and its log volume, and for
//! Keeper's volume.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::facts::{Observed, claims};
use crate::api::{ClickHouseCluster, StorageClasses};
use crate::model::names;
use crate::model::statefulset::DATA_VOLUME;

/// Where the pinned classes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    /// The status's record.
    Recorded(StorageClasses),
    /// The cluster's volumes exist and there is no record: the classes its volumes have, where
    /// the spec names none.
    Volumes(StorageClasses),
    /// No volume yet: the operator's defaults now.
    Defaults(StorageClasses),
}

impl Pin {
    pub fn classes(&self) -> &StorageClasses {
        match self {
            Pin::Recorded(c) | Pin::Volumes(c) | Pin::Defaults(c) => c,
        }
    }

    /// What the status records: the defaults a new cluster took, when they named a class (a
    /// cluster that took none needs no record; one whose volumes exist has them to say it).
    pub fn record(&self) -> Option<StorageClasses> {
        match self {
            Pin::Recorded(c) => Some(c.clone()),
            Pin::Defaults(c) if c.server.is_some() || c.keeper.is_some() => Some(c.clone()),
            _ => None,
        }
    }
}

/// The classes this cluster's volumes take where its spec names none.
pub fn pinned(cluster: &ClickHouseCluster, observed: &Observed) -> Pin {
    if let Some(p) = cluster
        .status
        .as_ref()
        .and_then(|s| s.default_storage_classes.clone())
    {
        return Pin::Recorded(p);
    }
    if observed.statefulsets.is_empty() && observed.pvcs.is_empty() {
        return Pin::Defaults(observed.default_storage_classes.clone());
    }
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let keeper_sts = names::keeper(name);
    let keeper_claims = format!("{DATA_VOLUME}-{keeper_sts}-");
    let class_of_template = |keeper: bool| {
        observed
            .statefulsets
            .iter()
            .filter(|(n, _)| (**n == keeper_sts) == keeper)
            .find_map(|(_, s)| {
                let json = serde_json::to_value(s).ok()?;
                Some(claims(&json).get(DATA_VOLUME)?.class.clone())
            })
    };
    let class_of_claim = |keeper: bool| {
        observed
            .pvcs
            .iter()
            .filter(|(n, _)| n.starts_with(&format!("{DATA_VOLUME}-")))
            .find(|(n, _)| n.starts_with(&keeper_claims) == keeper)
            .map(|(_, p)| claim_class(p))
    };
    let made = |keeper: bool| {
        class_of_template(keeper)
            .or_else(|| class_of_claim(keeper))
            .flatten()
    };
    let spec = &cluster.spec;
    Pin::Volumes(StorageClasses {
        server: made(false).filter(|_| spec.storage.data.storage_class_name.is_none()),
        keeper: made(true).filter(|_| spec.keeper.storage.storage_class_name.is_none()),
    })
}

fn claim_class(p: &PersistentVolumeClaim) -> Option<String> {
    p.spec.as_ref()?.storage_class_name.clone()
}

/// `cluster` with `classes` named where its spec names no class (borrowed as it is when there
/// is nothing to name).
pub fn with_classes<'a>(
    cluster: &'a ClickHouseCluster,
    classes: &StorageClasses,
) -> Cow<'a, ClickHouseCluster> {
    if classes.server.is_none() && classes.keeper.is_none() {
        return Cow::Borrowed(cluster);
    }
    let mut c = cluster.clone();
    let spec = &mut c.spec;
    if let Some(class) = &classes.server {
        let storage = &mut spec.storage;
        storage
            .data
            .storage_class_name
            .get_or_insert_with(|| class.clone());
        for d in &mut storage.disks {
            d.storage_class_name.get_or_insert_with(|| class.clone());
        }
        if let Some(l) = &mut storage.logs {
            l.storage_class_name.get_or_insert_with(|| class.clone());
        }
    }
    if let Some(class) = &classes.keeper {
        spec.keeper
            .storage
            .storage_class_name
            .get_or_insert_with(|| class.clone());
    }
    Cow::Owned(c)
}
