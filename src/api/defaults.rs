//! PURE: operator-level defaults for every cluster (decision 52): a part of a
//! `ClickHouseCluster` spec that the operator's installation gives (the chart's
//! `clusterDefaults`, a file the operator reads at start, `CLUSTER_DEFAULTS_FILE`), merged under
//! each cluster's own spec before a pass plans it. A cluster's own fields win; the cluster
//! object itself is never written with them.
//!
//! Only fields that a cluster leaves absent when unset can take a default (the merge sees the
//! spec as the API server holds it, where unset fields are absent): the server and Keeper pod
//! settings (`pod`, `keeper.pod`: pull secrets through `template`, tolerations, node selectors,
//! affinity, resources, labels, annotations, …) and `configuration.settings`, `profiles` and
//! `quotas`. Objects merge key by key (a setting the cluster sets wins over the default's);
//! any other value (a list of tolerations, a resource quantity) is the cluster's if it has one.
//! A storage class is not among them: it cannot change once a cluster's volumes exist, so a
//! default that changed would be refused for every running cluster.

use serde_json::Value;

use super::ClickHouseClusterSpec;

/// The spec paths a default may set (each with everything below it).
pub const ALLOWED: &[&str] = &[
    "pod",
    "keeper.pod",
    "configuration.settings",
    "configuration.profiles",
    "configuration.quotas",
];

/// Validated defaults: a partial spec with only [`ALLOWED`] paths.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterDefaults(Value);

impl ClusterDefaults {
    /// Parses the YAML (or JSON) of the defaults file; empty means none. Refuses a path outside
    /// [`ALLOWED`], naming it, and defaults that do not make a valid spec.
    pub fn parse(text: &str) -> Result<ClusterDefaults, String> {
        if text.trim().is_empty() {
            return Ok(ClusterDefaults(Value::Object(Default::default())));
        }
        let v: Value =
            serde_yaml::from_str(text).map_err(|e| format!("cluster defaults: not YAML ({e})"))?;
        let v = match v {
            Value::Null => Value::Object(Default::default()),
            Value::Object(_) => v,
            _ => return Err("cluster defaults: not a map of spec fields".into()),
        };
        check(&v, "")?;
        let mut v = v;
        // settings are strings in a spec; a chart's values give numbers and booleans as such
        if let Some(c) = v.get_mut("configuration") {
            stringify(c);
        }
        // the defaults alone must make a spec
        serde_json::from_value::<ClickHouseClusterSpec>(v.clone())
            .map_err(|e| format!("cluster defaults: not a ClickHouseCluster spec ({e})"))?;
        Ok(ClusterDefaults(v))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.as_object().is_none_or(|o| o.is_empty())
    }

    /// `spec` with the defaults under it: what the cluster sets wins.
    pub fn apply(&self, spec: &ClickHouseClusterSpec) -> Result<ClickHouseClusterSpec, String> {
        if self.is_empty() {
            return Ok(spec.clone());
        }
        let mut merged = self.0.clone();
        let own = serde_json::to_value(spec).map_err(|e| e.to_string())?;
        over(&mut merged, own);
        serde_json::from_value(merged)
            .map_err(|e| format!("the spec with the cluster defaults under it: {e}"))
    }
}

/// Refuses a key of `v` (at `at`) outside [`ALLOWED`].
fn check(v: &Value, at: &str) -> Result<(), String> {
    if ALLOWED.contains(&at) {
        return Ok(());
    }
    let Some(map) = v.as_object() else {
        return Err(format!(
            "cluster defaults: {at} cannot take a default (allowed: {})",
            ALLOWED.join(", ")
        ));
    };
    for (k, child) in map {
        let path = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        if !ALLOWED
            .iter()
            .any(|a| *a == path || a.starts_with(&format!("{path}.")))
        {
            return Err(format!(
                "cluster defaults: {path} cannot take a default (allowed: {})",
                ALLOWED.join(", ")
            ));
        }
        check(child, &path)?;
    }
    Ok(())
}

/// Numbers and booleans below `v` as strings.
fn stringify(v: &mut Value) {
    match v {
        Value::Object(m) => m.values_mut().for_each(stringify),
        Value::Array(a) => a.iter_mut().for_each(stringify),
        Value::Number(n) => *v = Value::String(n.to_string()),
        Value::Bool(b) => *v = Value::String(if *b { "1" } else { "0" }.into()),
        _ => {}
    }
}

/// Puts `own` over `base`: objects key by key, anything else replaced.
fn over(base: &mut Value, own: Value) {
    match (base, own) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => over(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, own) => *slot = own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::spec;

    /// Decision 52: pull secrets, tolerations, node selectors and settings of the defaults
    /// reach a cluster that sets none; what a cluster sets wins, setting by setting.
    #[test]
    fn defaults_go_under_the_clusters_own_fields() {
        let d = ClusterDefaults::parse(
            "pod:\n  template: {spec: {imagePullSecrets: [{name: registry}]}}\n  \
             tolerations: [{key: dedicated, value: clickhouse, effect: NoSchedule}]\n  \
             nodeSelector: {pool: db}\nkeeper:\n  pod: {nodeSelector: {pool: keeper}}\n\
             configuration:\n  settings: {max_concurrent_queries: 200, mark_cache_size: '1'}\n",
        )
        .unwrap();
        let plain = d.apply(&spec(serde_json::json!({}))).unwrap();
        assert_eq!(plain.pod.node_selector["pool"], "db");
        assert_eq!(plain.pod.tolerations[0].key.as_deref(), Some("dedicated"));
        assert_eq!(
            plain.pod.template.as_ref().unwrap()["spec"]["imagePullSecrets"][0]["name"],
            "registry"
        );
        assert_eq!(plain.keeper.pod.node_selector["pool"], "keeper");
        assert_eq!(
            plain.configuration.settings["max_concurrent_queries"],
            "200"
        );
        let own = d
            .apply(&spec(serde_json::json!({
                "pod": {"nodeSelector": {"pool": "fast"}, "tolerations": []},
                "configuration": {"settings": {"max_concurrent_queries": "50"}}})))
            .unwrap();
        assert_eq!(own.pod.node_selector["pool"], "fast");
        // an empty list is no list: the default's tolerations stay
        assert_eq!(own.pod.tolerations.len(), 1);
        assert_eq!(own.configuration.settings["max_concurrent_queries"], "50");
        assert_eq!(own.configuration.settings["mark_cache_size"], "1");
        // nothing else of the spec changes
        assert_eq!(own.shards, 1);
        assert!(ClusterDefaults::parse("").unwrap().is_empty());
    }

    /// Decision 52: a default outside the allowed paths, or one that is no spec, stops the
    /// operator at start with the path named.
    #[test]
    fn defaults_outside_the_allowed_fields_are_refused() {
        for (text, words) in [
            ("shards: 3", "shards cannot take a default"),
            (
                "storage: {storageClassName: fast}",
                "storage cannot take a default",
            ),
            (
                "configuration: {files: {a.xml: x}}",
                "configuration.files cannot",
            ),
            ("pod: {nodeSelector: 3}", "not a ClickHouseCluster spec"),
            ("- a", "not a map"),
        ] {
            let e = ClusterDefaults::parse(text).unwrap_err();
            assert!(e.contains(words), "{text}: {e}");
        }
    }
}
