//! Behaviour of the builders: what objects a spec gives, what changes a pod template and what
//! does not, and that no plain password leaks.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::json;

use super::config::server::{REPLICA_FILE, RUNTIME_FILE, SERVER_FILE, SETTINGS_FILE};
use super::*;
use crate::api::{ClickHouseCluster, ShardIndex};
use crate::testing::{cluster, inputs, replicas, uid};

mod backup;
mod configuration;
mod credentials;
mod keeper;
mod network;
mod objects;
mod pods;
mod real_images;
mod restarts;
mod storage;
mod tls;
mod users;

fn build(c: &ClickHouseCluster, i: &Inputs) -> Desired {
    desired(&Cluster::new(c).unwrap(), i).unwrap()
}

fn templates(d: &Desired) -> Vec<PodTemplateSpec> {
    d.server_statefulsets
        .iter()
        .map(|s| s.spec.template.clone())
        .collect()
}

fn annotation<'a>(t: &'a PodTemplateSpec, key: &str) -> Option<&'a str> {
    t.metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn common_file<'a>(d: &'a Desired, name: &str) -> &'a str {
    d.common_config.data.as_ref().unwrap()[name].as_str()
}

/// The `remote_servers` file, kept in the users Secret (it carries a password).
fn remote_file(d: &Desired) -> String {
    let data = d.users_secret.data.as_ref().unwrap();
    String::from_utf8(data[names::REMOTE_SERVERS_FILE].0.clone()).unwrap()
}

fn users_file(d: &Desired) -> String {
    let data = d.users_secret.data.as_ref().unwrap();
    String::from_utf8(data[names::USERS_FILE].0.clone()).unwrap()
}

fn parse(xml: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("{e}:\n{xml}"))
}

/// A StatefulSet written as `older` still rolls for a change of the cluster's own (a new image
/// over `desired`), and the changed one does not roll again for itself.
fn assert_a_real_change_rolls(older: &serde_json::Value, desired: &serde_json::Value) {
    use crate::model::changes::pod_template_changed;
    let mut other = desired.clone();
    other["spec"]["template"]["spec"]["containers"][0]["image"] = json!("clickhouse:99");
    other["metadata"]["annotations"][labels::TEMPLATE_HASH] =
        serde_json::Value::String(template_hash(&other["spec"]["template"]));
    assert!(pod_template_changed(older, &other));
    assert!(!pod_template_changed(&other, &other));
}
