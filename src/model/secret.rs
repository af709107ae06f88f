//! The generated Secrets: `<cluster>-users` (the users file, hashes only) and
//! `<cluster>-operator` (the operator's own password, the one place a plain password is kept).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use super::config::users::users_file;
use super::labels::{self, Component};
use super::{BuildError, Cluster, Password, names};

/// `<cluster>-users`: the users file, projected into the servers' `users.d/`, and the
/// `remote_servers` file (with the password servers use between them) and, when the cluster has
/// a replication password, the `interserver_http_credentials` file, and with a Keeper password
/// the Keeper identity file, projected into `config.d/` ([`config_files`]). `listed` are the
/// replicas `remote_servers` names.
pub fn users_secret(
    c: &Cluster<'_>,
    inputs: &crate::model::Inputs,
    listed: &[crate::model::ReplicaSpec],
) -> Result<Secret, BuildError> {
    let file = users_file(c, inputs)?;
    let remote = crate::model::config::server::remote_servers_file(
        c,
        listed,
        remote_account(inputs),
        cluster_secret(inputs),
        crate::model::config::server::backup_collections(inputs),
    )?;
    let mut data = BTreeMap::from([
        (names::USERS_FILE.to_string(), ByteString(file.into_bytes())),
        (
            names::REMOTE_SERVERS_FILE.to_string(),
            ByteString(remote.into_bytes()),
        ),
    ]);
    for (file, content) in c.spec.configuration.users_d_files() {
        data.insert(
            names::users_d_key(file),
            ByteString(content.clone().into_bytes()),
        );
    }
    if let Some(p) = &inputs.interserver_password {
        data.insert(
            names::INTERSERVER_FILE.to_string(),
            ByteString(crate::model::config::server::interserver_file(p).into_bytes()),
        );
    }
    if let Some(p) = &inputs.keeper_password {
        data.insert(
            names::KEEPER_IDENTITY_FILE.to_string(),
            ByteString(crate::model::config::server::keeper_identity_file(c, p).into_bytes()),
        );
    }
    let mut metadata = c.meta(
        names::users_secret(c.name),
        labels::common(c.name, Component::Server),
    );
    let annotations = metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(
        labels::OPERATOR_NETWORKS.into(),
        inputs.operator_networks.join(","),
    );
    if let Some(op) = &inputs.operator_pods {
        let selector: Vec<String> = op.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        annotations.insert(
            labels::OPERATOR_PODS.into(),
            format!("{}/{}", op.namespace, selector.join(",")),
        );
    }
    Ok(Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    })
}

/// The account the servers reach each other with (Distributed queries, `ON CLUSTER`): the
/// cluster's own account [`names::CLUSTER_USER`] where the cluster has its password, else (a
/// cluster created before it existed) the operator's.
pub fn remote_account(inputs: &crate::model::Inputs) -> (&'static str, &Password) {
    match &inputs.cluster_password {
        Some(p) => (names::CLUSTER_USER, p),
        None => (names::OPERATOR_USER, &inputs.operator_password),
    }
}

/// The cluster's `<secret>` where it is written: the cluster has one and every server runs a
/// version that has it (18.16 refuses the element and with it the whole `remote_servers`).
pub fn cluster_secret(inputs: &crate::model::Inputs) -> Option<&Password> {
    inputs.cluster_secret.as_ref().filter(|_| {
        inputs
            .server_version
            .is_some_and(|v| v.supports(crate::version::Capability::ClusterSecret))
    })
}

/// The files of `<cluster>-users` besides `remote_servers` that the server pods project into
/// `config.d/`: those the cluster's passwords in `inputs` make.
pub fn config_files(inputs: &crate::model::Inputs) -> Vec<&'static str> {
    let mut files = Vec::new();
    if inputs.interserver_password.is_some() {
        files.push(names::INTERSERVER_FILE);
    }
    if inputs.keeper_password.is_some() {
        files.push(names::KEEPER_IDENTITY_FILE);
    }
    files
}

/// The passwords the operator generates for a new cluster, kept in `<cluster>-operator`.
pub struct Generated {
    /// The operator's own ClickHouse password.
    pub operator: Password,
    /// The replication password (`interserver_http_credentials`).
    pub interserver: Password,
    /// ClickHouse's Keeper identity.
    pub keeper: Password,
    /// The account the servers reach each other with.
    pub cluster: Password,
    /// The cluster's `<secret>` in `remote_servers`.
    pub cluster_secret: Password,
    /// The metrics exporter's read-only account.
    pub exporter: Password,
}

/// `<cluster>-operator` with the operator's password under [`names::OPERATOR_PASSWORD_KEY`],
/// the replication password under [`names::INTERSERVER_PASSWORD_KEY`] and the Keeper identity's
/// under [`names::KEEPER_PASSWORD_KEY`].
pub fn operator_secret(c: &Cluster<'_>, passwords: &Generated) -> Secret {
    Secret {
        metadata: c.meta(
            names::operator_secret(c.name),
            labels::common(c.name, Component::Server),
        ),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (
                names::OPERATOR_PASSWORD_KEY.to_string(),
                ByteString(passwords.operator.0.clone().into_bytes()),
            ),
            (
                names::INTERSERVER_PASSWORD_KEY.to_string(),
                ByteString(passwords.interserver.0.clone().into_bytes()),
            ),
            (
                names::KEEPER_PASSWORD_KEY.to_string(),
                ByteString(passwords.keeper.0.clone().into_bytes()),
            ),
            (
                names::CLUSTER_PASSWORD_KEY.to_string(),
                ByteString(passwords.cluster.0.clone().into_bytes()),
            ),
            (
                names::CLUSTER_SECRET_KEY.to_string(),
                ByteString(passwords.cluster_secret.0.clone().into_bytes()),
            ),
            (
                names::EXPORTER_PASSWORD_KEY.to_string(),
                ByteString(passwords.exporter.0.clone().into_bytes()),
            ),
        ])),
        ..Secret::default()
    }
}

/// The merge patch that sets one cluster's entry in the Secret the exporter's credentials are
/// published in (`EXPORTER_CREDENTIALS_SECRET`, decision 36): the password of its account and
/// the CA of its servers, `None`: removes it.
pub fn exporter_credentials_patch(
    namespace: &str,
    cluster: &str,
    credentials: Option<(&[u8], Option<&[u8]>)>,
) -> Value {
    let key = |what| names::exporter_credential_key(namespace, cluster, what);
    // `ByteString` serializes as base64, as `data` wants it
    let b64 = |v: &[u8]| json!(k8s_openapi::ByteString(v.to_vec()));
    let (password, ca) = match credentials {
        Some((p, ca)) => (b64(p), ca.map(b64).unwrap_or(Value::Null)),
        None => (Value::Null, Value::Null),
    };
    json!({"data": {
        key(names::EXPORTER_CREDENTIAL_PASSWORD): password,
        key(names::EXPORTER_CREDENTIAL_CA): ca,
    }})
}

/// The exporter's side: one cluster's credentials out of the data of the Secret they are
/// published in.
pub fn read_exporter_credentials(
    data: &std::collections::BTreeMap<String, k8s_openapi::ByteString>,
    namespace: &str,
    cluster: &str,
) -> (Option<String>, Option<Vec<u8>>) {
    let get = |what| data.get(&names::exporter_credential_key(namespace, cluster, what));
    (
        get(names::EXPORTER_CREDENTIAL_PASSWORD)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned()),
        get(names::EXPORTER_CREDENTIAL_CA).map(|b| b.0.clone()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decision 36: a cluster's entry is its own two keys, set or removed by a merge patch
    /// that touches no other cluster's; the exporter reads back what was published.
    #[test]
    fn each_cluster_has_its_own_keys_and_reads_back_what_was_published() {
        let set = exporter_credentials_patch("t1", "c1", Some((b"pw", Some(b"-----BEGIN"))));
        let data = set["data"].as_object().unwrap();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            ["t1_c1_ca.crt", "t1_c1_password"]
        );
        let no_ca = exporter_credentials_patch("t1", "c1", Some((b"pw", None)));
        assert_eq!(
            no_ca["data"]["t1_c1_ca.crt"],
            Value::Null,
            "a CA no longer used goes"
        );
        let gone = exporter_credentials_patch("t1", "c1", None);
        assert!(
            gone["data"]
                .as_object()
                .unwrap()
                .values()
                .all(Value::is_null)
        );
        // as the API server stores it
        let stored: std::collections::BTreeMap<String, k8s_openapi::ByteString> =
            serde_json::from_value(set["data"].clone()).unwrap();
        assert_eq!(
            read_exporter_credentials(&stored, "t1", "c1"),
            (Some("pw".to_string()), Some(b"-----BEGIN".to_vec()))
        );
        assert_eq!(read_exporter_credentials(&stored, "t1", "c2"), (None, None));
        assert_eq!(
            read_exporter_credentials(&stored, "t1-c1", "x"),
            (None, None)
        );
    }
}
