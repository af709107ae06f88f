//! The CustomResourceDefinitions, with the rules the API server itself enforces (CEL,
//! `x-kubernetes-validations`). `clickhouse-operator crd` prints them; `deploy/crds.yaml` is their
//! committed copy, and a test fails when it drifts.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::{ClickHouseBackup, ClickHouseCluster, ClickHouseRestore};

/// A CEL rule at a place in the schema. The path names properties from the root of the
/// resource; `[]` steps into the items of an array.
pub struct Rule {
    pub path: &'static [&'static str],
    pub rule: &'static str,
    pub message: &'static str,
}

/// Every CEL rule of the ClickHouseCluster CRD.
pub const CLUSTER_RULES: &[Rule] = &[
    Rule {
        path: &[],
        rule: "self.metadata.name.size() <= 40 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        message: "metadata.name must be a DNS label (lower-case letters, digits and '-', starting with a letter) of at most 40 characters",
    },
    Rule {
        path: &["spec", "shards"],
        rule: "self >= 0",
        message: "spec.shards must be at least 0",
    },
    Rule {
        path: &["spec", "shards"],
        rule: "self <= 1024",
        message: "spec.shards must be at most 1024",
    },
    Rule {
        path: &["spec"],
        rule: "!has(self.shards) || self.shards >= 1 || !has(self.keeper) || ((!has(self.keeper.replicas) || self.keeper.replicas >= 1) && !has(self.keeper.external))",
        message: "spec.shards is 0 (a Keeper-only cluster): spec.keeper.replicas must be at least 1, without spec.keeper.external",
    },
    Rule {
        path: &["spec", "replicas"],
        rule: "self >= 1",
        message: "spec.replicas must be at least 1",
    },
    Rule {
        path: &["spec", "replicas"],
        rule: "self <= 32",
        message: "spec.replicas must be at most 32",
    },
    Rule {
        path: &["spec", "keeper", "replicas"],
        rule: "self == 0 || (self % 2 == 1 && self <= 7)",
        message: "spec.keeper.replicas must be 0 or an odd number up to 7",
    },
    Rule {
        path: &["spec", "storage", "size"],
        rule: "isQuantity(self)",
        message: "spec.storage.size must be a quantity such as 10Gi",
    },
    Rule {
        path: &["spec", "storage", "size"],
        rule: "!isQuantity(self) || !isQuantity(oldSelf) || quantity(self).compareTo(quantity(oldSelf)) >= 0",
        message: "spec.storage.size cannot shrink",
    },
    Rule {
        path: &["spec", "storage"],
        rule: "!has(oldSelf.disks) || oldSelf.disks.all(d, has(self.disks) && self.disks.exists(e, e.name == d.name))",
        message: "spec.storage.disks: a disk cannot be removed (the parts on it would be lost)",
    },
    Rule {
        path: &["spec", "storage"],
        rule: "!has(oldSelf.logs) || has(self.logs)",
        message: "spec.storage.logs cannot be removed once set",
    },
    Rule {
        path: &["spec", "storage", "disks", "[]", "size"],
        rule: "isQuantity(self)",
        message: "spec.storage.disks[].size must be a quantity such as 100Gi",
    },
    Rule {
        path: &["spec", "keeper", "storage", "size"],
        rule: "isQuantity(self)",
        message: "spec.keeper.storage.size must be a quantity such as 1Gi",
    },
    Rule {
        path: &["spec", "keeper", "storage", "size"],
        rule: "!isQuantity(self) || !isQuantity(oldSelf) || quantity(self).compareTo(quantity(oldSelf)) >= 0",
        message: "spec.keeper.storage.size cannot shrink",
    },
    Rule {
        path: &["spec", "podDisruptionBudget", "maxUnavailable"],
        rule: "self >= 1",
        message: "spec.podDisruptionBudget.maxUnavailable must be at least 1",
    },
    Rule {
        path: &["spec", "tls"],
        rule: "!has(self.enabled) || !self.enabled || has(self.serverCertSecret)",
        message: "spec.tls.serverCertSecret is required when spec.tls.enabled is true",
    },
    Rule {
        path: &["spec", "users", "secretName"],
        rule: "self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",
        message: "spec.users.secretName must be a valid Secret name",
    },
    Rule {
        path: &["spec", "backup", "schedules"],
        rule: "self.all(s, self.exists_one(t, t.name == s.name))",
        message: "spec.backup.schedules names must be unique",
    },
    Rule {
        path: &["spec", "keeper"],
        rule: "(has(self.tls) && self.tls) == (has(oldSelf.tls) && oldSelf.tls)",
        message: "spec.keeper.tls cannot change once the cluster exists",
    },
    Rule {
        path: &["spec", "clusterDomain"],
        rule: "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",
        message: "spec.clusterDomain must be a DNS name such as cluster.local",
    },
    Rule {
        path: &["spec"],
        rule: "has(self.clusterDomain) == has(oldSelf.clusterDomain) && (!has(self.clusterDomain) || self.clusterDomain == oldSelf.clusterDomain)",
        message: "spec.clusterDomain cannot change once the cluster exists",
    },
    Rule {
        path: &["spec", "backup", "schedules", "[]", "name"],
        rule: "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        message: "a backup schedule name must be a DNS label",
    },
    Rule {
        path: &["spec", "backup", "schedules", "[]", "keep"],
        rule: "self >= 1",
        message: "a backup schedule must keep at least 1 backup",
    },
];

/// Size limits that keep the CEL cost of the rules above bounded.
const CLUSTER_LIMITS: &[(&[&str], &str, u64)] = &[
    (&["spec", "backup", "schedules"], "maxItems", 32),
    (
        &["spec", "backup", "schedules", "[]", "name"],
        "maxLength",
        63,
    ),
    (&["spec", "users", "secretName"], "maxLength", 253),
    (&["spec", "clusterDomain"], "maxLength", 253),
    (&["spec", "storage", "size"], "maxLength", 32),
    (&["spec", "storage", "disks"], "maxItems", 8),
    (&["spec", "storage", "disks", "[]", "name"], "maxLength", 20),
    (&["spec", "storage", "disks", "[]", "size"], "maxLength", 32),
    (&["spec", "keeper", "storage", "size"], "maxLength", 32),
    (
        &["spec", "keeper", "external", "nodes"],
        "maxItems",
        super::validate::EXTERNAL_KEEPER_NODES_CEILING,
    ),
];

fn schema_at<'a>(root: &'a mut Value, path: &[&str]) -> &'a mut Value {
    let mut node = root;
    for step in path {
        node = if *step == "[]" {
            node.get_mut("items")
        } else {
            node.get_mut("properties").and_then(|p| p.get_mut(*step))
        }
        .unwrap_or_else(|| panic!("the CRD schema has no {path:?}"));
    }
    node
}

fn patch(
    crd: CustomResourceDefinition,
    rules: &[Rule],
    limits: &[(&[&str], &str, u64)],
) -> CustomResourceDefinition {
    let mut v = serde_json::to_value(crd).expect("a CRD serialises");
    {
        let root = &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        for r in rules {
            let node = schema_at(root, r.path);
            let list = node
                .as_object_mut()
                .expect("schema node is an object")
                .entry("x-kubernetes-validations")
                .or_insert_with(|| json!([]));
            list.as_array_mut()
                .expect("x-kubernetes-validations is a list")
                .push(json!({"rule": r.rule, "message": r.message}));
        }
        for (path, key, value) in limits {
            schema_at(root, path)[*key] = json!(value);
        }
        strip_unknown_formats(root);
    }
    serde_json::from_value(v).expect("a patched CRD deserialises")
}

/// The `format` values the API server knows, by the schema's `type`: the integer and number
/// formats of OpenAPI and the string formats of the apiextensions validation (compared without
/// `-`, as the API server does). Any other format makes it warn `unrecognized format` when the
/// CRD is applied, and validates nothing.
pub const KNOWN_FORMATS: &[(&str, &[&str])] = &[
    ("integer", &["int32", "int64"]),
    ("number", &["float", "double"]),
    (
        "string",
        &[
            "bsonobjectid",
            "uri",
            "email",
            "hostname",
            "ipv4",
            "ipv6",
            "cidr",
            "mac",
            "uuid",
            "uuid3",
            "uuid4",
            "uuid5",
            "isbn",
            "isbn10",
            "isbn13",
            "creditcard",
            "ssn",
            "hexcolor",
            "rgbcolor",
            "byte",
            "password",
            "date",
            "duration",
            "datetime",
        ],
    ),
];

/// Whether the API server knows `format` for a schema of type `ty`.
pub fn known_format(ty: Option<&str>, format: &str) -> bool {
    let normalised = format.replace('-', "");
    KNOWN_FORMATS
        .iter()
        .any(|(t, formats)| ty == Some(*t) && formats.contains(&normalised.as_str()))
}

/// Visits every schema node under `node` (itself first), with its path (`.`-joined property
/// names, `[]` for array items, `{}` for map values).
fn walk_schema(node: &mut Value, path: &str, visit: &mut dyn FnMut(&str, &mut Value)) {
    visit(path, node);
    let Some(obj) = node.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for (name, child) in props.iter_mut() {
            let sub = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            walk_schema(child, &sub, visit);
        }
    }
    if let Some(items) = obj.get_mut("items") {
        walk_schema(items, &format!("{path}[]"), visit);
    }
    if let Some(extra @ Value::Object(_)) = obj.get_mut("additionalProperties") {
        walk_schema(extra, &format!("{path}{{}}"), visit);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            for child in list {
                walk_schema(child, path, visit);
            }
        }
    }
}

/// Drops every `format` the API server does not know (schemars gives `uint64`, `uint32`, … for
/// unsigned integers).
fn strip_unknown_formats(root: &mut Value) {
    walk_schema(root, "", &mut |_, node| {
        let Some(obj) = node.as_object_mut() else {
            return;
        };
        let known = match obj.get("format").and_then(Value::as_str) {
            None => return,
            Some(f) => known_format(obj.get("type").and_then(Value::as_str), f),
        };
        if !known {
            obj.remove("format");
        }
    });
}

pub fn cluster_crd() -> CustomResourceDefinition {
    patch(ClickHouseCluster::crd(), CLUSTER_RULES, CLUSTER_LIMITS)
}

pub fn backup_crd() -> CustomResourceDefinition {
    patch(
        ClickHouseBackup::crd(),
        &[
            Rule {
                path: &["spec", "clusterName"],
                rule: "self.size() > 0",
                message: "spec.clusterName must name a ClickHouseCluster",
            },
            Rule {
                path: &["spec"],
                rule: "self.clusterName == oldSelf.clusterName && has(self.destination) == has(oldSelf.destination) && (!has(self.destination) || self.destination == oldSelf.destination) && has(self.tables) == has(oldSelf.tables) && (!has(self.tables) || self.tables == oldSelf.tables) && has(self.incremental) == has(oldSelf.incremental) && (!has(self.incremental) || self.incremental == oldSelf.incremental)",
                message: "a ClickHouseBackup's spec cannot change, but for its deletionPolicy; create a new one",
            },
        ],
        &[(&["spec", "clusterName"], "maxLength", 253)],
    )
}

pub fn all() -> Vec<CustomResourceDefinition> {
    vec![cluster_crd(), backup_crd(), restore_crd()]
}

/// The ClickHouseRestore CRD: a cluster and a backup named, the spec fixed once created.
pub fn restore_crd() -> CustomResourceDefinition {
    patch(
        ClickHouseRestore::crd(),
        &[
            Rule {
                path: &["spec", "clusterName"],
                rule: "self.size() > 0",
                message: "spec.clusterName must name a ClickHouseCluster",
            },
            Rule {
                path: &["spec", "backupName"],
                rule: "self.size() > 0",
                message: "spec.backupName must name a backup",
            },
            Rule {
                path: &["spec"],
                rule: "self == oldSelf",
                message: "a ClickHouseRestore's spec cannot change; create a new one",
            },
        ],
        &[
            (&["spec", "clusterName"], "maxLength", 253),
            (&["spec", "backupName"], "maxLength", 253),
        ],
    )
}

/// `charts/onprem-clickhouse-cluster/values.schema.json`: the chart's own values, and `spec` as
/// the ClickHouseCluster CRD has it with unknown fields refused (`additionalProperties: false`
/// on every object of fixed fields), so that a misspelled or mistyped value fails `helm
/// install` and `helm template` instead of being dropped by the API server.
pub fn cluster_chart_values_schema() -> Value {
    fn strict(node: &mut Value) {
        let Some(obj) = node.as_object_mut() else {
            return;
        };
        obj.retain(|k, _| !k.starts_with("x-kubernetes-validations") && k != "nullable");
        let open = obj.contains_key("x-kubernetes-preserve-unknown-fields")
            || obj.contains_key("additionalProperties");
        if obj.contains_key("properties") && !open {
            obj.insert("additionalProperties".into(), json!(false));
        }
        for key in ["properties"] {
            if let Some(Value::Object(props)) = obj.get_mut(key) {
                props.values_mut().for_each(strict);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(child) = obj.get_mut(key) {
                strict(child);
            }
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(list)) = obj.get_mut(key) {
                list.iter_mut().for_each(strict);
            }
        }
    }
    let crd = serde_json::to_value(cluster_crd()).expect("a CRD serialises");
    let mut spec =
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone();
    strict(&mut spec);
    let strings = |description: &str| {
        json!({"type": "object", "description": description,
               "additionalProperties": {"type": "string"}})
    };
    json!({
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "Values of the onprem-clickhouse-cluster chart (generated by `cargo test --lib values_schema` with CHOP_WRITE_VALUES_SCHEMA=1; spec is the ClickHouseCluster CRD's)",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "nameOverride": {"type": "string", "description": "Name of the ClickHouseCluster (default: the release name)."},
            "resourceQuota": {
                "type": "object",
                "description": "The ResourceQuota that keeps the cluster the only one of its namespace.",
                "additionalProperties": false,
                "properties": {"enabled": {"type": "boolean", "description": "Must stay on."}}
            },
            "labels": strings("Labels of the ClickHouseCluster."),
            "annotations": strings("Annotations of the ClickHouseCluster."),
            "spec": spec,
            "usersSecret": {
                "type": "object",
                "description": "A Secret of ClickHouse users made by the chart.",
                "additionalProperties": false,
                "properties": {
                    "create": {"type": "boolean", "description": "Create it (spec.users.secretName then points at it unless spec.users is set)."},
                    "name": {"type": "string", "description": "Its name (default <cluster name>-user-passwords)."},
                    "users": strings("User name: password.")
                }
            }
        }
    })
}

/// All CRDs as one multi-document YAML, exactly as committed in `deploy/crds.yaml`.
pub fn yaml() -> String {
    let mut out = String::from("# Generated by `clickhouse-operator crd`. Do not edit.\n");
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd).expect("a CRD serialises to YAML"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(crd: &CustomResourceDefinition) -> Value {
        serde_json::to_value(crd).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            .clone()
    }

    /// Every schema node of the three CRDs: (CRD kind, path, node).
    fn every_node(mut visit: impl FnMut(&str, &str, &Value)) {
        for crd in all() {
            let mut s = schema(&crd);
            walk_schema(&mut s, "", &mut |path, node| {
                visit(&crd.spec.names.kind, path, node)
            });
        }
    }

    /// `kubectl explain` shows a description for every field of every CRD.
    #[test]
    fn every_property_has_a_description() {
        let mut missing = Vec::new();
        every_node(|kind, path, node| {
            let Some(props) = node.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (name, child) in props {
                let described = child
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.trim().is_empty());
                if !described {
                    let sub = if path.is_empty() {
                        name.clone()
                    } else {
                        format!("{path}.{name}")
                    };
                    missing.push(format!("{kind} {sub}"));
                }
            }
        });
        assert!(
            missing.is_empty(),
            "{} properties without a description:\n{}",
            missing.len(),
            missing.join("\n")
        );
    }

    /// The API server warns `unrecognized format` on any other format when the CRDs are applied.
    #[test]
    fn every_format_is_one_the_api_server_knows() {
        let mut unknown = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        every_node(|kind, path, node| {
            if let Some(f) = node.get("format").and_then(Value::as_str) {
                let ty = node.get("type").and_then(Value::as_str);
                seen.insert(f.to_string());
                if !known_format(ty, f) {
                    unknown.push(format!("{kind} {path}: {ty:?} {f:?}"));
                }
            }
        });
        assert!(unknown.is_empty(), "{}", unknown.join("\n"));
        // the formats that carry meaning stay
        assert!(seen.contains("int32") && seen.contains("int64"), "{seen:?}");
        assert!(!known_format(Some("integer"), "uint64"));
        assert!(!known_format(Some("integer"), "uint32"));
        assert!(known_format(Some("string"), "date-time"));
        assert!(!known_format(Some("string"), "int32"));
    }

    /// The cluster chart's values schema is the committed one; `CHOP_WRITE_VALUES_SCHEMA=1`
    /// writes it.
    #[test]
    fn committed_values_schema_matches_the_crd() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/onprem-clickhouse-cluster/values.schema.json"
        );
        let want = format!(
            "{}\n",
            serde_json::to_string_pretty(&cluster_chart_values_schema()).unwrap()
        );
        if std::env::var_os("CHOP_WRITE_VALUES_SCHEMA").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == want,
            "{path} drifted from the CRD: run `CHOP_WRITE_VALUES_SCHEMA=1 cargo test --lib values_schema`"
        );
        // unknown fields of spec are refused, free-form ones stay free
        let v = cluster_chart_values_schema();
        let spec = &v["properties"]["spec"];
        assert_eq!(spec["additionalProperties"], false);
        assert_eq!(spec["properties"]["keeper"]["additionalProperties"], false);
        let template = &spec["properties"]["pod"]["properties"]["template"];
        assert!(template.get("additionalProperties").is_none(), "{template}");
        let settings = &spec["properties"]["configuration"]["properties"]["settings"];
        assert_eq!(settings["additionalProperties"]["type"], "string");
    }

    #[test]
    fn committed_crds_match_the_code() {
        let committed =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crds.yaml"))
                .expect("deploy/crds.yaml exists");
        assert!(
            committed == yaml(),
            "deploy/crds.yaml drifted from the code: run `cargo run -- crd > deploy/crds.yaml`"
        );
    }

    /// Review M-2: the CRD bounds `spec.shards` and `spec.replicas` from above, at the ceilings
    /// `MAX_SHARDS` and `MAX_REPLICAS` cannot raise, and `keeper.external.nodes` in number.
    #[test]
    fn the_crd_bounds_shards_replicas_and_external_keeper_members() {
        use crate::api::validate::{
            EXTERNAL_KEEPER_NODES_CEILING, REPLICAS_CEILING, SHARDS_CEILING,
        };
        let mut s = schema(&cluster_crd());
        let rules = |node: &Value| -> Vec<String> {
            node["x-kubernetes-validations"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r["rule"].as_str().unwrap_or_default().to_string())
                .collect()
        };
        assert!(
            rules(schema_at(&mut s, &["spec", "shards"]))
                .contains(&format!("self <= {SHARDS_CEILING}"))
        );
        assert!(
            rules(schema_at(&mut s, &["spec", "replicas"]))
                .contains(&format!("self <= {REPLICAS_CEILING}"))
        );
        assert_eq!(
            schema_at(&mut s, &["spec", "keeper", "external", "nodes"])["maxItems"],
            json!(EXTERNAL_KEEPER_NODES_CEILING)
        );
    }

    #[test]
    fn every_rule_lands_where_it_was_meant() {
        let mut s = schema(&cluster_crd());
        for r in CLUSTER_RULES {
            let node = schema_at(&mut s, r.path);
            let rules = node["x-kubernetes-validations"].as_array().unwrap();
            assert!(rules.iter().any(|x| x["rule"] == r.rule), "{:?}", r.path);
        }
        // schemaPolicy must stay free-form (S1-26): no enum restricts it.
        let sp = schema_at(&mut s, &["spec", "schemaPolicy"]).to_string();
        assert!(!sp.contains("\"enum\""), "{sp}");
    }

    #[test]
    fn crds_have_names_short_names_status_and_columns() {
        let c = cluster_crd();
        assert_eq!(
            c.metadata.name.as_deref(),
            Some("clickhouseclusters.clickhouse.com")
        );
        assert_eq!(c.spec.names.short_names, Some(vec!["chc".to_string()]));
        let v = &c.spec.versions[0];
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let cols: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            cols,
            [
                ("State", ".status.state"),
                ("Shards", ".spec.shards"),
                ("Replicas", ".spec.replicas"),
                ("Ready", ".status.clickhouse.readyText"),
                ("Version", ".status.version"),
                ("Endpoint", ".status.host"),
                ("Age", ".metadata.creationTimestamp"),
            ]
        );
        let b = backup_crd();
        assert_eq!(b.spec.names.short_names, Some(vec!["chb".to_string()]));
        // States are enumerated (S0-06, S2-35).
        let st = schema(&c)["properties"]["status"]["properties"].clone();
        assert_eq!(
            st["state"]["enum"],
            json!([
                "initializing",
                "ready",
                "paused",
                "stopping",
                "error",
                "suspended"
            ])
        );
        let rs =
            st["replicaStateMap"]["additionalProperties"]["properties"]["state"]["enum"].clone();
        assert_eq!(rs, json!(["Pending", "Ready", "Stopped", "Condemned"]));
        assert!(
            st["replicaStateMap"]["description"]
                .as_str()
                .unwrap()
                .contains("nternal")
        );
    }
}
