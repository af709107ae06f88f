//! Hash annotations of the pod templates: the only way a configuration or Secret change
//! reaches a pod template, so exactly those changes roll pods out (S2-16).
//!
//! Scheme: SHA-256, hex. `clickhouse.com/config-hash` covers the files read at startup
//! ([`Effect::Restart`]); each referenced Secret has its own annotation over its data
//! (`clickhouse.com/{tls,ca,env}-secret-hash`), keyed by role rather than by Secret name so the
//! key is always a valid annotation name. Inputs are length-prefixed so that no two different
//! inputs hash alike by concatenation.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::config::keeper::keeper_restart_part;
use super::config::server::{ConfigFile, Effect};
use super::{Cluster, SecretData, labels};
use crate::api::{ClickHouseClusterSpec, PodSettings};

/// The hash annotations of one component's pod template.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodHashes(BTreeMap<&'static str, String>);

impl PodHashes {
    /// Annotation key → hash.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    /// Adds (or replaces) one hash.
    pub fn insert(&mut self, key: &'static str, hash: String) {
        self.0.insert(key, hash);
    }

    /// The hash under an annotation key, if the template has it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

fn feed(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

pub use crate::util::json_hash;

/// Sets the [`labels::OBJECT_HASH`] annotation of an object (as JSON) to the hash of the rest of
/// it. An object whose pod template has a hash of its own ([`labels::TEMPLATE_HASH`]: a
/// StatefulSet) is hashed without its template and that hash: its object hash covers the other
/// fields only, so that writing them with the template left as it is (as the API server filled
/// it in) keeps the hash the operator wrote, and a StatefulSet whose other fields are as wanted
/// is not written again for its template's defaults.
pub fn restamp(object: &mut serde_json::Value) {
    if let Some(map) = object["metadata"]["annotations"].as_object_mut() {
        map.remove(labels::OBJECT_HASH);
    }
    let h = json_hash(&without_template(object));
    object["metadata"]["annotations"][labels::OBJECT_HASH] = serde_json::Value::String(h);
}

/// What [`restamp`] hashes: the object, without its pod template and the template's hash when
/// it has one.
fn without_template(object: &serde_json::Value) -> std::borrow::Cow<'_, serde_json::Value> {
    if object["metadata"]["annotations"]
        .get(labels::TEMPLATE_HASH)
        .is_none()
    {
        return std::borrow::Cow::Borrowed(object);
    }
    let mut rest = object.clone();
    if let Some(a) = rest["metadata"]["annotations"].as_object_mut() {
        a.remove(labels::TEMPLATE_HASH);
    }
    if let Some(spec) = rest["spec"].as_object_mut() {
        spec.remove("template");
    }
    std::borrow::Cow::Owned(rest)
}

/// Hash of a Secret's data; `None` (not found) hashes differently from every data.
pub fn secret_hash(data: Option<&SecretData>) -> String {
    let mut h = Sha256::new();
    match data {
        None => h.update(b"absent"),
        Some(d) => {
            h.update(b"present");
            for (k, v) in d {
                feed(&mut h, k.as_bytes());
                feed(&mut h, v);
            }
        }
    }
    hex::encode(h.finalize())
}

/// Hash of the restart-relevant files (name and content) among `files`.
pub fn config_hash(files: &[ConfigFile]) -> String {
    let mut h = Sha256::new();
    for f in files.iter().filter(|f| f.effect == Effect::Restart) {
        feed(&mut h, f.name.as_bytes());
        feed(&mut h, f.content.as_bytes());
    }
    hex::encode(h.finalize())
}

fn env_secret(
    pod: &PodSettings,
    secrets: &BTreeMap<String, SecretData>,
    out: &mut BTreeMap<&'static str, String>,
) {
    if let Some(name) = &pod.env_secret {
        out.insert(labels::ENV_SECRET_HASH, secret_hash(secrets.get(name)));
    }
}

/// Hashes of the server pod template: the common restart-relevant config, and the TLS, CA and
/// environment Secrets the pods use (S2-16: a renewed certificate rolls the servers, proven end
/// to end by `tests/e2e/strategies.rs`
/// `a_rotated_server_certificate_rolls_the_servers_one_at_a_time_and_is_served`).
pub fn server_hashes(
    spec: &ClickHouseClusterSpec,
    common_files: &[ConfigFile],
    secrets: &BTreeMap<String, SecretData>,
) -> PodHashes {
    let mut out = BTreeMap::from([(labels::CONFIG_HASH, config_hash(common_files))]);
    if spec.tls.enabled {
        if let Some(name) = &spec.tls.server_cert_secret {
            out.insert(labels::TLS_SECRET_HASH, secret_hash(secrets.get(name)));
        }
        if let Some(name) = &spec.tls.ca_secret {
            out.insert(labels::CA_SECRET_HASH, secret_hash(secrets.get(name)));
        }
    }
    env_secret(&spec.pod, secrets, &mut out);
    if let Some(h) = secret_config_hash(spec, secrets) {
        out.insert(labels::SECRET_CONFIG_HASH, h);
    }
    if let Some(h) = super::config::system_logs::spec_hash(spec) {
        out.insert(labels::SYSTEM_LOGS_HASH, h);
    }
    PodHashes(out)
}

/// Hash of what `secretSettings` and the `config.d` files of `secretFiles` give the servers at
/// startup: each path or file, its Secret key and the key's value (`None` without any). The
/// `users.d` files are left out: the servers reload them.
fn secret_config_hash(
    spec: &ClickHouseClusterSpec,
    secrets: &BTreeMap<String, SecretData>,
) -> Option<String> {
    let c = &spec.configuration;
    let startup: Vec<(&String, &crate::api::SecretKeyRef)> = c
        .secret_settings
        .iter()
        .chain(c.secret_config_d_files())
        .collect();
    if startup.is_empty() {
        return None;
    }
    let mut h = Sha256::new();
    for (what, key) in startup {
        feed(&mut h, what.as_bytes());
        feed(&mut h, key.name.as_bytes());
        feed(&mut h, key.key.as_bytes());
        match secrets.get(&key.name).and_then(|d| d.get(&key.key)) {
            Some(v) => feed(&mut h, v),
            None => h.update(b"absent"),
        }
    }
    Some(hex::encode(h.finalize()))
}

/// Hashes of the Keeper pod template: its startup config (not the member list) and its
/// environment Secret.
pub fn keeper_hashes(c: &Cluster<'_>, secrets: &BTreeMap<String, SecretData>) -> PodHashes {
    let mut h = Sha256::new();
    feed(&mut h, keeper_restart_part(c).as_bytes());
    let mut out = BTreeMap::from([(labels::CONFIG_HASH, hex::encode(h.finalize()))]);
    if c.spec.keeper.tls {
        // the certificate is read at startup: a new one restarts the members one at a time
        for (label, secret) in [
            (labels::TLS_SECRET_HASH, &c.spec.tls.server_cert_secret),
            (labels::CA_SECRET_HASH, &c.spec.tls.ca_secret),
        ] {
            if let Some(name) = secret {
                out.insert(label, secret_hash(secrets.get(name)));
            }
        }
    }
    env_secret(&c.spec.keeper.pod, secrets, &mut out);
    PodHashes(out)
}

#[cfg(test)]
mod restamp_tests {
    use super::*;
    use serde_json::json;

    fn hash_of(mut object: serde_json::Value) -> String {
        restamp(&mut object);
        object["metadata"]["annotations"][labels::OBJECT_HASH]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A StatefulSet's object hash covers its fields but the pod template, which has a hash of
    /// its own: the same StatefulSet with its template as the API server filled it in (or with
    /// another template) hashes alike; any other field changes it.
    #[test]
    fn a_statefulsets_object_hash_leaves_out_its_pod_template() {
        let sts = |template: serde_json::Value, template_hash: &str, replicas: i64| {
            json!({"kind": "StatefulSet", "metadata": {"name": "c1-0-0",
                "annotations": {labels::TEMPLATE_HASH: template_hash}},
                "spec": {"replicas": replicas, "template": template}})
        };
        let written = json!({"spec": {"containers": [{"name": "clickhouse", "image": "i"}]}});
        let defaulted = json!({"spec": {"containers": [{"name": "clickhouse", "image": "i",
            "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"}],
            "dnsPolicy": "ClusterFirst", "restartPolicy": "Always"}});
        let h = hash_of(sts(written.clone(), "t1", 1));
        assert_eq!(h, hash_of(sts(defaulted, "t1", 1)));
        assert_eq!(h, hash_of(sts(written.clone(), "t2", 1)));
        assert_ne!(h, hash_of(sts(written, "t1", 0)));
        // an object without a template hash is hashed whole
        let cm = |data: &str| json!({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": data}});
        assert_ne!(hash_of(cm("1")), hash_of(cm("2")));
    }
}
