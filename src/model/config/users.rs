//! The server's `users.d/` file: profiles, quotas, the users of `spec.users` and the operator's
//! own user. Passwords appear only as `password_sha256_hex`. ClickHouse reloads this file at
//! runtime, so no pod template depends on it.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::xml::{Element, ROOT};
use crate::model::{BuildError, Cluster, Password, names};

/// Profile and quota given to users that name none.
pub const DEFAULT_PROFILE: &str = "default";
/// The image's own user, without a password.
pub const DEFAULT_USER: &str = "default";
/// Quota given to every generated user.
pub const DEFAULT_QUOTA: &str = "default";

/// SHA-256 of a password, hex-encoded, as `password_sha256_hex` wants it.
pub fn sha256_hex(password: &Password) -> String {
    hex::encode(Sha256::digest(password.0.as_bytes()))
}

fn user(
    name: &str,
    field: &str,
    password: &Password,
    profile: &str,
) -> Result<Element, BuildError> {
    // `replace` drops whatever the image defines for the same user (e.g. a plain `password` of
    // `default`), which ClickHouse would refuse next to `password_sha256_hex`.
    Ok(Element::checked(name, field)?
        .attr("replace", "replace")
        .child(Element::leaf("password_sha256_hex", sha256_hex(password)))
        .child(Element::new("networks").child(Element::leaf("ip", "::/0")))
        .child(Element::leaf("profile", profile))
        .child(Element::leaf("quota", DEFAULT_QUOTA)))
}

/// Networks of the image's passwordless `default` user, unless the users Secret defines
/// `default`: the pod itself and the cluster's own server pods, recognised by the reverse DNS
/// name Kubernetes gives the pods of a headless Service. Distributed queries between replicas
/// (which connect as `default`) keep working; nobody else reaches a passwordless user.
pub fn default_user_networks(cluster: &str, namespace: &str) -> Element {
    let host = format!(
        "^{}-[0-9]+-[0-9]+-0\\.{}\\.{}\\.svc\\.cluster\\.local$",
        cluster,
        names::headless_service(cluster),
        namespace
    );
    Element::new("networks")
        .attr("replace", "replace")
        .child(Element::leaf("ip", "::1"))
        .child(Element::leaf("ip", "127.0.0.1"))
        .child(Element::leaf("host_regexp", host))
}

/// The users file. `users` are the entries of the Secret `spec.users.secretName`; they get the
/// profile `spec.users.profile` (default `default`).
pub fn users_file(
    c: &Cluster<'_>,
    users: &BTreeMap<String, Password>,
    operator_password: &Password,
) -> Result<String, BuildError> {
    let configuration = &c.spec.configuration;
    let profile = c.spec.users.as_ref().and_then(|u| u.profile.as_deref());
    let mut profiles = Element::new("profiles");
    for (name, settings) in &configuration.profiles {
        profiles = profiles.child(
            Element::checked(name, "spec.configuration.profiles")?.children(Element::from_paths(
                settings.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                &format!("spec.configuration.profiles.{name}"),
            )?),
        );
    }
    let mut quotas = Element::new("quotas");
    for (name, settings) in &configuration.quotas {
        quotas = quotas.child(Element::checked(name, "spec.configuration.quotas")?.child(
            Element::new("interval").children(Element::from_paths(
                settings.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                &format!("spec.configuration.quotas.{name}"),
            )?),
        ));
    }
    let profile = profile.unwrap_or(DEFAULT_PROFILE);
    Element::checked(profile, "spec.users.profile")?;
    let mut list = Element::new("users").child(user(
        names::OPERATOR_USER,
        "operator user",
        operator_password,
        DEFAULT_PROFILE,
    )?);
    for (name, password) in users {
        if name == names::OPERATOR_USER {
            // The operator's user is the operator's: a same-named entry cannot replace it.
            continue;
        }
        list = list.child(user(
            name,
            "spec.users.secretName (a key)",
            password,
            profile,
        )?);
    }
    if !users.contains_key(DEFAULT_USER) {
        list = list
            .child(Element::new(DEFAULT_USER).child(default_user_networks(c.name, c.namespace)));
    }
    Ok(Element::new(ROOT)
        .child(profiles)
        .child(quotas)
        .child(list)
        .to_document())
}
