//! The generated Secrets: `<cluster>-users` (the users file, hashes only) and
//! `<cluster>-operator` (the operator's own password, the one place a plain password is kept).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rand::Rng;
use rand::distr::Alphanumeric;

use super::config::users::users_file;
use super::labels::{self, Component};
use super::{BuildError, Cluster, Password, names};

/// Length of a generated operator password.
pub const PASSWORD_LEN: usize = 32;

/// A new random password for the operator's user (alphanumeric, [`PASSWORD_LEN`] characters).
/// The controller calls it once, when `<cluster>-operator` does not exist yet.
pub fn new_password(rng: &mut impl Rng) -> Password {
    Password(
        rng.sample_iter(Alphanumeric)
            .take(PASSWORD_LEN)
            .map(char::from)
            .collect(),
    )
}

/// `<cluster>-users`, projected into the servers' `users.d/`.
pub fn users_secret(
    c: &Cluster<'_>,
    users: &BTreeMap<String, Password>,
    operator_password: &Password,
) -> Result<Secret, BuildError> {
    let file = users_file(c, users, operator_password)?;
    Ok(Secret {
        metadata: c.meta(
            names::users_secret(c.name),
            labels::common(c.name, Component::Server),
        ),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            names::USERS_FILE.to_string(),
            ByteString(file.into_bytes()),
        )])),
        ..Secret::default()
    })
}

/// `<cluster>-operator` with the operator's password under [`names::OPERATOR_PASSWORD_KEY`].
pub fn operator_secret(c: &Cluster<'_>, password: &Password) -> Secret {
    Secret {
        metadata: c.meta(
            names::operator_secret(c.name),
            labels::common(c.name, Component::Server),
        ),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            names::OPERATOR_PASSWORD_KEY.to_string(),
            ByteString(password.0.clone().into_bytes()),
        )])),
        ..Secret::default()
    }
}
