//! The controllers' few ways of calling the API server: the API of a kind in a namespace (or in
//! every watched one), and the answers that mean a call already did what it was for (the
//! object is gone).

use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::{Client, Resource};

/// The API of a namespaced kind in namespace `ns`.
pub fn namespaced<K>(client: &Client, ns: &str) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(client.clone(), ns)
}

/// The API of a namespaced kind in namespace `ns`, or in every namespace (`None`): what a
/// watch of the operator's watched namespaces reads.
pub fn namespaced_or_all<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Whether the API server answered that the object does not exist (404).
pub fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(e) if e.code == 404)
}

/// Whether a deletion with a uid precondition found the object gone (404) or another object
/// under its name (409): either way the object meant is no more.
pub fn gone_or_replaced(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(e) if e.code == 404 || e.code == 409)
}

/// A call on an object that turned out not to exist, as a success: a deletion or a patch of
/// something already gone did what it was for.
pub fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// [`ignore_not_found`] for a deletion with a uid precondition ([`gone_or_replaced`]).
pub fn ignore_gone<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if gone_or_replaced(&e) => Ok(()),
        Err(e) => Err(e),
    }
}
