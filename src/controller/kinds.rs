//! The kinds of a cluster's objects as the controller handles them, in one table
//! ([`cluster_kinds!`]): the caches ([`super::cache::Caches`]), the lists a pass reads, the
//! watches that keep the caches and trigger the passes, and the API of each [`Kind`] all follow
//! it. A new kind is a variant of [`Kind`] and a row here, plus what is its own (what a pass
//! makes of it in [`crate::plan::facts::Observed`]).

use kube::api::ApiResource;

use crate::plan::facts::Kind;

/// The table: calls macro `$then` with one row per kind of a cluster's objects, each as
///
/// `Kind(Type) field trigger;`
///
/// - the [`Kind`] and its Kubernetes type;
/// - the field that holds objects of it, in the caches and in the lists a pass reads;
/// - how a change of one triggers the pass of its cluster: `owned`, through its owner reference
///   (the cluster); `labelled`, through its cluster label (pods and PVCs are owned by their
///   StatefulSets).
///
/// Every object of these kinds carries its cluster's label, by which the caches group them and
/// a pass lists them. The cluster's backups and every Secret's metadata are watched beside
/// them.
macro_rules! cluster_kinds {
    ($then:ident) => {
        $then! {
            StatefulSet(k8s_openapi::api::apps::v1::StatefulSet) statefulsets owned;
            Pod(k8s_openapi::api::core::v1::Pod) pods labelled;
            PersistentVolumeClaim(k8s_openapi::api::core::v1::PersistentVolumeClaim) pvcs labelled;
            ConfigMap(k8s_openapi::api::core::v1::ConfigMap) configmaps owned;
            Service(k8s_openapi::api::core::v1::Service) services owned;
            PodDisruptionBudget(k8s_openapi::api::policy::v1::PodDisruptionBudget) pdbs owned;
            NetworkPolicy(k8s_openapi::api::networking::v1::NetworkPolicy) network_policies owned;
            Secret(k8s_openapi::api::core::v1::Secret) owned_secrets owned;
        }
    };
}
pub(crate) use cluster_kinds;

macro_rules! resource {
    ($($kind:ident($ty:ty) $field:ident $trigger:ident;)*) => {
        /// The API resource of a kind, for the calls the plan's steps make on any of them.
        pub fn resource(kind: Kind) -> ApiResource {
            match kind {
                $(Kind::$kind => ApiResource::erase::<$ty>(&()),)*
            }
        }
    };
}
cluster_kinds!(resource);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind has its row, under its own Kubernetes kind.
    #[test]
    fn every_kind_has_its_api_resource() {
        for kind in Kind::ALL {
            assert_eq!(resource(*kind).kind, kind.as_str());
        }
    }
}
