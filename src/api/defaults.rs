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
//! Storage classes (`storage.storageClassName`, `keeper.storage.storageClassName`) are
//! defaults of their own kind: a class cannot change once a cluster's volumes exist, so they
//! are not merged here but pinned to each cluster when its first volumes are made
//! (`crate::plan::storage_classes`, decision 59).

use serde_json::Value;

use super::{ClickHouseClusterSpec, StorageClasses};

/// The spec paths a default may set (each with everything below it).
pub const ALLOWED: &[&str] = &[
    "pod",
    "keeper.pod",
    "configuration.settings",
    "configuration.profiles",
    "configuration.quotas",
    STORAGE_CLASS,
    KEEPER_STORAGE_CLASS,
];

/// The default storage class of the servers' volumes.
const STORAGE_CLASS: &str = "storage.storageClassName";
/// The default storage class of the Keeper members' volumes.
const KEEPER_STORAGE_CLASS: &str = "keeper.storage.storageClassName";

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

    /// `spec` with the defaults under it: what the cluster sets wins. The storage classes are
    /// left out: see [`ClusterDefaults::storage_classes`].
    pub fn apply(&self, spec: &ClickHouseClusterSpec) -> Result<ClickHouseClusterSpec, String> {
        let mut merged = self.0.clone();
        for path in [STORAGE_CLASS, KEEPER_STORAGE_CLASS] {
            remove(&mut merged, path);
        }
        if merged.as_object().is_none_or(|o| o.is_empty()) {
            return Ok(spec.clone());
        }
        let own = serde_json::to_value(spec).map_err(|e| e.to_string())?;
        over(&mut merged, own);
        serde_json::from_value(merged)
            .map_err(|e| format!("the spec with the cluster defaults under it: {e}"))
    }
}

impl ClusterDefaults {
    /// The default storage classes, for the clusters whose volumes do not exist yet.
    pub fn storage_classes(&self) -> StorageClasses {
        let at = |path: &str| {
            path.split('.')
                .try_fold(&self.0, |v, k| v.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        StorageClasses {
            server: at(STORAGE_CLASS),
            keeper: at(KEEPER_STORAGE_CLASS),
        }
    }
}

/// Removes the key at the dotted `path` of `v`, and the maps it leaves empty.
fn remove(v: &mut Value, path: &str) {
    let Some((head, rest)) = path.split_once('.') else {
        if let Some(o) = v.as_object_mut() {
            o.remove(path);
        }
        return;
    };
    let Some(o) = v.as_object_mut() else {
        return;
    };
    if let Some(child) = o.get_mut(head) {
        remove(child, rest);
        if child.as_object().is_some_and(|c| c.is_empty()) {
            o.remove(head);
        }
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

    /// Decision 59: the default storage classes are read apart and never merged into a spec
    /// (a running cluster's volumes keep theirs); defaults of nothing but classes change no
    /// spec.
    #[test]
    fn default_storage_classes_are_read_apart_from_the_spec() {
        let d = ClusterDefaults::parse(
            "storage: {storageClassName: fast}
keeper: {storage: {storageClassName: ssd}}
",
        )
        .unwrap();
        assert_eq!(
            d.storage_classes(),
            StorageClasses {
                server: Some("fast".into()),
                keeper: Some("ssd".into())
            }
        );
        let s = spec(serde_json::json!({"storage": {"size": "1Gi"}}));
        assert_eq!(d.apply(&s).unwrap(), s);
        let with_pod = ClusterDefaults::parse(
            "storage: {storageClassName: fast}
pod: {nodeSelector: {a: b}}",
        )
        .unwrap();
        let merged = with_pod.apply(&s).unwrap();
        assert_eq!(merged.storage.data.storage_class_name, None);
        assert_eq!(merged.pod.node_selector["a"], "b");
        assert_eq!(
            ClusterDefaults::parse("pod: {}").unwrap().storage_classes(),
            StorageClasses::default()
        );
    }

    /// Decision 52: a default outside the allowed paths, or one that is no spec, stops the
    /// operator at start with the path named.
    #[test]
    fn defaults_outside_the_allowed_fields_are_refused() {
        for (text, words) in [
            ("shards: 3", "shards cannot take a default"),
            ("storage: {size: 1Ti}", "storage.size cannot take a default"),
            (
                "storage: {storageClassName: 3}",
                "not a ClickHouseCluster spec",
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
