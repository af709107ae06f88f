//! The generated Secrets: `<cluster>-users` (the users file, hashes only) and
//! `<cluster>-operator` (the operator's own password, the one place a plain password is kept).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use super::config::users::users_file;
use super::labels::{self, Component};
use super::{BuildError, Cluster, Password, names};

/// `<cluster>-users`: the users file, projected into the servers' `users.d/`, and the
/// `remote_servers` file (with the password servers use between them) and, when the cluster has
/// a replication password, the `interserver_http_credentials` file, projected into `config.d/`.
/// `listed` are the replicas `remote_servers` names.
pub fn users_secret(
    c: &Cluster<'_>,
    users: &BTreeMap<String, Password>,
    operator_password: &Password,
    interserver_password: Option<&Password>,
    listed: &[crate::model::ReplicaSpec],
) -> Result<Secret, BuildError> {
    let file = users_file(c, users, operator_password)?;
    let remote = crate::model::config::server::remote_servers_file(c, listed, operator_password)?;
    let mut data = BTreeMap::from([
        (names::USERS_FILE.to_string(), ByteString(file.into_bytes())),
        (
            names::REMOTE_SERVERS_FILE.to_string(),
            ByteString(remote.into_bytes()),
        ),
    ]);
    if let Some(p) = interserver_password {
        data.insert(
            names::INTERSERVER_FILE.to_string(),
            ByteString(crate::model::config::server::interserver_file(p).into_bytes()),
        );
    }
    Ok(Secret {
        metadata: c.meta(
            names::users_secret(c.name),
            labels::common(c.name, Component::Server),
        ),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    })
}

/// `<cluster>-operator` with the operator's password under [`names::OPERATOR_PASSWORD_KEY`] and
/// the replication password under [`names::INTERSERVER_PASSWORD_KEY`].
pub fn operator_secret(c: &Cluster<'_>, password: &Password, interserver: &Password) -> Secret {
    Secret {
        metadata: c.meta(
            names::operator_secret(c.name),
            labels::common(c.name, Component::Server),
        ),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (
                names::OPERATOR_PASSWORD_KEY.to_string(),
                ByteString(password.0.clone().into_bytes()),
            ),
            (
                names::INTERSERVER_PASSWORD_KEY.to_string(),
                ByteString(interserver.0.clone().into_bytes()),
            ),
        ])),
        ..Secret::default()
    }
}
