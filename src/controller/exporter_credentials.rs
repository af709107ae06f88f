//! The exporter's credentials, published in one Secret of the operator's namespace
//! (`EXPORTER_CREDENTIALS_SECRET`, decision 36): for each cluster, the password of its
//! read-only account `clickhouse_exporter` and the CA its servers' certificates are verified
//! with, under [`crate::model::names::exporter_credential_key`] (the entries:
//! [`crate::model::secret::exporter_credentials_patch`]). The exporter may then read that one Secret
//! (RBAC `resourceNames`) and no other: not `<cluster>-operator`, which also holds the
//! operator's own password, nor any tenant's Secret.
//!
//! The chart creates the Secret; the operator only patches its keys (a merge patch per
//! cluster, so clusters passed in parallel never overwrite each other) and removes a deleted
//! cluster's. What it published is remembered in this process, so a pass costs no read; after
//! a restart every cluster is published once more.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::kube::{ignore_not_found, namespaced};
use crate::model::secret::exporter_credentials_patch;

/// Where the credentials go, and what this process last put there for each cluster.
pub struct Publisher {
    namespace: String,
    name: String,
    published: Mutex<HashMap<(String, String), [u8; 32]>>,
}

/// What one cluster's entry holds.
fn digest(password: &[u8], ca: Option<&[u8]>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((password.len() as u64).to_be_bytes());
    h.update(password);
    if let Some(ca) = ca {
        h.update(ca);
    }
    h.finalize().into()
}

impl Publisher {
    pub fn new(namespace: String, name: String) -> Publisher {
        Publisher {
            namespace,
            name,
            published: Mutex::default(),
        }
    }

    /// `namespace/name` of the Secret.
    pub fn secret(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether this process published exactly these credentials for the cluster.
    pub fn current(
        &self,
        namespace: &str,
        cluster: &str,
        password: &[u8],
        ca: Option<&[u8]>,
    ) -> bool {
        self.published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), cluster.to_string()))
            == Some(&digest(password, ca))
    }

    /// Writes the cluster's entry.
    pub async fn publish(
        &self,
        client: &kube::Client,
        namespace: &str,
        cluster: &str,
        password: &[u8],
        ca: Option<&[u8]>,
    ) -> Result<(), kube::Error> {
        self.patch(
            client,
            exporter_credentials_patch(namespace, cluster, Some((password, ca))),
        )
        .await?;
        self.published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                (namespace.to_string(), cluster.to_string()),
                digest(password, ca),
            );
        Ok(())
    }

    /// Removes the cluster's entry (a deleted cluster's).
    pub async fn withdraw(
        &self,
        client: &kube::Client,
        namespace: &str,
        cluster: &str,
    ) -> Result<(), kube::Error> {
        self.published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(namespace.to_string(), cluster.to_string()));
        ignore_not_found(
            self.patch(client, exporter_credentials_patch(namespace, cluster, None))
                .await,
        )
    }

    async fn patch(&self, client: &kube::Client, patch: Value) -> Result<(), kube::Error> {
        namespaced::<Secret>(client, &self.namespace)
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only what was published is current: another password or CA is published again.
    #[test]
    fn a_changed_password_or_ca_is_not_current() {
        let p = Publisher::new("ops".into(), "creds".into());
        p.published
            .lock()
            .unwrap()
            .insert(("t1".into(), "c1".into()), digest(b"pw", None));
        assert!(p.current("t1", "c1", b"pw", None));
        assert!(!p.current("t1", "c1", b"pw2", None));
        assert!(!p.current("t1", "c1", b"pw", Some(b"ca")));
        assert!(!p.current("t1", "c2", b"pw", None));
    }
}
