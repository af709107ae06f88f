//! The OLM bundle (`deploy/olm/`, docs/olm.md): generated from the operator chart as
//! `helm template` renders it with its defaults and from the CRDs `clickhouse-operator crd`
//! prints, committed, and checked three ways:
//!
//! - drift: the committed files are exactly what the chart and the CRDs give today
//!   (`bash hack/olm-bundle.sh` writes them again);
//! - the bundle format, as operator-sdk's `bundle validate` and OLM's bundle loader check it,
//!   written as checks here: the directory layout and `metadata/annotations.yaml`, the
//!   ClusterServiceVersion's required fields, its install strategy against the chart's
//!   Deployments and RBAC, its owned CRDs against `deploy/crds.yaml`, and the kinds a bundle
//!   may carry;
//! - operator-framework's own validation library (`github.com/operator-framework/api`, what
//!   `operator-sdk bundle validate` runs on a bundle's content), built from the Go module proxy
//!   by `hack/olm-validate.sh`. The bundle *image* checks of operator-sdk (operator-registry's
//!   annotations and layout rules) are not a Go module the proxy here serves; they are the
//!   format checks above.
//!
//! What the bundle leaves out of the chart, and why (docs/olm.md): the ServiceAccounts (OLM
//! creates those the CSV names), the PVC-deletion key Secret (a key committed in a bundle
//! would be the same, public, for every install: the bundle's pods read an optional Secret the
//! installer creates), and the operator pods' NetworkPolicies (not a kind OLM releases before
//! 2024 install from a bundle).

use serde_yaml::{Mapping, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGE: &str = "clickhouse-operator";
const CHANNEL: &str = "alpha";
const RELEASE: &str = "clickhouse-operator";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn bundle_dir() -> PathBuf {
    std::env::var_os("CHOP_OLM_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("deploy/olm"))
}

fn skipped(why: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{why}: in CI nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
}

/// The path a cached tool's script prints on its last line.
fn tool(script: &str) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(repo().join("hack").join(script))
        .output()
        .map_err(|e| format!("{script}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{script} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let path = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    );
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{script} printed no binary"))
    }
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn helm_template(chart: &str, sets: &[String]) -> Vec<Value> {
    let helm = tool("helm.sh").expect("helm (hack/helm.sh)");
    let home = repo().join("target/helm-home");
    let mut c = Command::new(helm);
    c.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .args(["template", RELEASE])
        .arg(repo().join("charts").join(chart))
        .args(["--namespace", "clickhouse-operator"]);
    for s in sets {
        c.arg("--set").arg(s);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "helm template {chart}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    docs(&String::from_utf8_lossy(&out.stdout))
}

/// The chart as the bundle is made from: its defaults, the image repository of
/// CHOP_IMAGE_REPOSITORY when set (a bundle for one's own registry), and a placeholder for its
/// required `operatorNetworks`, which the bundle leaves out (the installer's, in config.env).
fn chart_docs() -> Vec<Value> {
    let mut sets: Vec<String> = std::env::var("CHOP_IMAGE_REPOSITORY")
        .ok()
        .filter(|r| !r.is_empty())
        .map(|r| vec![format!("image.repository={r}")])
        .unwrap_or_default();
    sets.push("operatorNetworks={192.0.2.0/24}".into());
    helm_template("clickhouse-operator", &sets)
}

fn crd_docs() -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    docs(&String::from_utf8_lossy(&out.stdout))
}

fn get<'a>(v: &'a Value, path: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    path.split('.').fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => v.get(i).unwrap_or(&NULL),
        Err(_) => v.get(k).unwrap_or(&NULL),
    })
}

fn text(v: &Value, path: &str) -> String {
    get(v, path).as_str().unwrap_or_default().to_string()
}

fn kind(v: &Value) -> String {
    text(v, "kind")
}

fn name(v: &Value) -> String {
    text(v, "metadata.name")
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    let mut m = Mapping::new();
    for (k, v) in pairs {
        m.insert(Value::from(k), v);
    }
    Value::Mapping(m)
}

fn s(x: &str) -> Value {
    Value::from(x)
}

/// Labels without Helm's own (OLM manages the bundle's objects).
fn clean_labels(labels: &Value) -> Value {
    let mut m = labels.as_mapping().cloned().unwrap_or_default();
    m.remove("helm.sh/chart");
    m.remove("app.kubernetes.io/managed-by");
    Value::Mapping(m)
}

/// An object of the chart for the bundle's manifests: no namespace (OLM installs it in the
/// operator's), no Helm labels.
fn clean(obj: &Value) -> Value {
    let mut o = obj.clone();
    let meta = o.get_mut("metadata").unwrap().as_mapping_mut().unwrap();
    meta.remove("namespace");
    if let Some(l) = meta.get("labels").cloned() {
        meta.insert(s("labels"), clean_labels(&l));
    }
    o
}

/// A Deployment's spec for the CSV: WATCH_NAMESPACE from the OperatorGroup's target
/// namespaces (empty for AllNamespaces, the chart's default), and the PVC-deletion key Secret
/// optional (the bundle ships none).
fn csv_deployment_spec(dep: &Value) -> Value {
    let mut spec = dep["spec"].clone();
    let pod = spec
        .get_mut("template")
        .and_then(|t| t.get_mut("spec"))
        .unwrap();
    for c in pod
        .get_mut("containers")
        .and_then(Value::as_sequence_mut)
        .unwrap()
    {
        let Some(env) = c.get_mut("env").and_then(Value::as_sequence_mut) else {
            continue;
        };
        // the installer's pod network, set in the Subscription's config.env (decision 71): the
        // operator does not start without it
        env.retain(|e| text(e, "name") != "OPERATOR_NETWORKS");
        for e in env.iter_mut() {
            match text(e, "name").as_str() {
                "WATCH_NAMESPACE" => {
                    *e = map(vec![
                        ("name", s("WATCH_NAMESPACE")),
                        (
                            "valueFrom",
                            map(vec![(
                                "fieldRef",
                                map(vec![(
                                    "fieldPath",
                                    s("metadata.annotations['olm.targetNamespaces']"),
                                )]),
                            )]),
                        ),
                    ])
                }
                "PVC_DELETE_KEY" => {
                    let r = e
                        .get_mut("valueFrom")
                        .and_then(|v| v.get_mut("secretKeyRef"))
                        .and_then(Value::as_mapping_mut)
                        .unwrap();
                    r.insert(s("optional"), Value::from(true));
                }
                _ => {}
            }
        }
    }
    spec
}

fn operator_image(chart: &[Value]) -> String {
    let dep = chart
        .iter()
        .find(|d| kind(d) == "Deployment" && name(d) == RELEASE)
        .unwrap();
    text(dep, "spec.template.spec.containers.0.image")
}

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// `kubeVersion: ">=1.30.0-0"` of Chart.yaml as OLM's minKubeVersion (`1.30.0`).
fn min_kube_version() -> String {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("charts/clickhouse-operator/Chart.yaml")).unwrap(),
    )
    .unwrap();
    let k = text(&chart, "kubeVersion");
    k.trim_start_matches(">=")
        .split('-')
        .next()
        .unwrap()
        .to_string()
}

const DESCRIPTION: &str = "\
A Kubernetes operator for ClickHouse: ClickHouse server replicas in shards, a ClickHouse Keeper \
ensemble, safe scale-out and scale-in, rollouts without taking a shard down, backups and \
restores to S3-compatible storage.

This bundle installs what the operator's Helm chart installs with its defaults, for all \
namespaces: the operator (2 replicas, leader election), the PVC cleaner as its own Deployment \
with its own service account, their cluster roles, the metrics Service, the \
PodDisruptionBudget and the roles that add the three kinds to the built-in view, edit and \
admin roles.

Before installing, create the Secret `clickhouse-operator-pvc-delete-key` (key `key`, at \
least 16 random characters) in the operator's namespace: the operator signs the volumes it \
hands to the PVC cleaner with it. Without it, no PVC is ever deleted (volumes of removed \
replicas stay). Set `OPERATOR_NETWORKS` (the whole network pods get their addresses from) in \
the Subscription's `config.env`: the operator does not start without it, nor on an address \
outside it. The bundle's rights are cluster-wide, without pods' logs and ServiceAccount tokens \
(backups with webIdentity need a Role of their own). The chart's NetworkPolicies for the \
operator's pods are not part of the bundle. See docs/olm.md.";

/// The bundle's files, relative to its folder, with their contents.
fn render() -> BTreeMap<String, String> {
    let chart = chart_docs();
    let crds = crd_docs();
    let mut files = BTreeMap::new();
    let header = "# Generated by hack/olm-bundle.sh from charts/clickhouse-operator (helm template, \
                  its defaults) and `clickhouse-operator crd`; do not edit.\n";
    let yaml = |v: &Value| format!("{header}{}", serde_yaml::to_string(v).unwrap());

    let by_kind = |k: &str| -> Vec<&Value> { chart.iter().filter(|d| kind(d) == k).collect() };
    let role_rules = |k: &str, n: &str| -> Value {
        chart
            .iter()
            .find(|d| kind(d) == k && name(d) == n)
            .map(|r| r["rules"].clone())
            .unwrap_or_else(|| panic!("{k} {n} is rendered"))
    };
    let permissions = |binding: &str, role: &str| -> Vec<Value> {
        by_kind(binding)
            .iter()
            .map(|b| {
                let subjects = b["subjects"].as_sequence().unwrap();
                assert_eq!(subjects.len(), 1, "{binding} {}: one subject", name(b));
                assert_eq!(text(&subjects[0], "kind"), "ServiceAccount");
                map(vec![
                    ("serviceAccountName", s(&text(&subjects[0], "name"))),
                    ("rules", role_rules(role, &text(b, "roleRef.name"))),
                ])
            })
            .collect()
    };
    let bound: BTreeSet<(String, String)> = by_kind("ClusterRoleBinding")
        .iter()
        .map(|b| ("ClusterRole".to_string(), text(b, "roleRef.name")))
        .chain(
            by_kind("RoleBinding")
                .iter()
                .map(|b| ("Role".to_string(), text(b, "roleRef.name"))),
        )
        .collect();

    let mut extra: Vec<Value> = Vec::new();
    for d in &chart {
        let k = kind(d);
        match k.as_str() {
            "Deployment" | "ClusterRoleBinding" | "RoleBinding" => {}
            "ClusterRole" | "Role" if bound.contains(&(k.clone(), name(d))) => {}
            // OLM creates the ServiceAccounts the CSV names
            "ServiceAccount" => {}
            // a key committed in the bundle would be every install's: the installer makes it
            "Secret" if name(d).ends_with("-pvc-delete-key") => {}
            // not a kind OLM installs from a bundle before 2024
            "NetworkPolicy" => {}
            "ClusterRole" | "Service" | "PodDisruptionBudget" => extra.push(clean(d)),
            other => panic!(
                "the chart renders a {other} ({}): decide whether the OLM bundle carries it",
                name(d)
            ),
        }
    }

    let owned: Vec<Value> = crds
        .iter()
        .map(|c| {
            let storage = get(c, "spec.versions")
                .as_sequence()
                .unwrap()
                .iter()
                .find(|v| v["storage"].as_bool() == Some(true))
                .unwrap();
            let kind_name = text(c, "spec.names.kind");
            map(vec![
                ("name", s(&name(c))),
                ("version", s(&text(storage, "name"))),
                ("kind", s(&kind_name)),
                ("displayName", s(&kind_name)),
                (
                    "description",
                    s(text(storage, "schema.openAPIV3Schema.description")
                        .lines()
                        .next()
                        .unwrap_or(&kind_name)),
                ),
            ])
        })
        .collect();
    let example: Vec<serde_json::Value> = helm_template("onprem-clickhouse-cluster", &[])
        .into_iter()
        .filter(|d| kind(d) == "ClickHouseCluster")
        .map(|d| {
            let mut j: serde_json::Value = serde_json::to_value(&d).unwrap();
            j["metadata"] = serde_json::json!({"name": "example"});
            j
        })
        .collect();
    assert_eq!(example.len(), 1, "the cluster chart renders one cluster");

    let image = operator_image(&chart);
    let deployments: Vec<Value> = by_kind("Deployment")
        .iter()
        .map(|d| {
            map(vec![
                ("name", s(&name(d))),
                ("label", clean_labels(get(d, "metadata.labels"))),
                ("spec", csv_deployment_spec(d)),
            ])
        })
        .collect();
    let install_modes: Vec<Value> = [
        ("OwnNamespace", false),
        ("SingleNamespace", false),
        ("MultiNamespace", false),
        ("AllNamespaces", true),
    ]
    .into_iter()
    .map(|(t, ok)| map(vec![("type", s(t)), ("supported", Value::from(ok))]))
    .collect();
    let chart_yaml: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("charts/clickhouse-operator/Chart.yaml")).unwrap(),
    )
    .unwrap();
    let csv = map(vec![
        ("apiVersion", s("operators.coreos.com/v1alpha1")),
        ("kind", s("ClusterServiceVersion")),
        (
            "metadata",
            map(vec![
                ("name", s(&format!("{PACKAGE}.v{}", version()))),
                (
                    "annotations",
                    map(vec![
                        (
                            "alm-examples",
                            s(&serde_json::to_string_pretty(&example).unwrap()),
                        ),
                        ("capabilities", s("Basic Install")),
                        ("categories", s("Database")),
                        ("containerImage", s(&image)),
                        ("description", s(&text(&chart_yaml, "description"))),
                        (
                            "operatorframework.io/suggested-namespace",
                            s("clickhouse-operator"),
                        ),
                    ]),
                ),
            ]),
        ),
        (
            "spec",
            map(vec![
                ("displayName", s("ClickHouse Operator")),
                ("description", s(DESCRIPTION)),
                ("version", s(version())),
                ("minKubeVersion", s(&min_kube_version())),
                ("maturity", s(CHANNEL)),
                ("provider", map(vec![("name", s("clickhouse-operator"))])),
                ("keywords", chart_yaml["keywords"].clone()),
                ("installModes", Value::Sequence(install_modes)),
                (
                    "install",
                    map(vec![
                        ("strategy", s("deployment")),
                        (
                            "spec",
                            map(vec![
                                ("deployments", Value::Sequence(deployments)),
                                (
                                    "clusterPermissions",
                                    Value::Sequence(permissions(
                                        "ClusterRoleBinding",
                                        "ClusterRole",
                                    )),
                                ),
                                (
                                    "permissions",
                                    Value::Sequence(permissions("RoleBinding", "Role")),
                                ),
                            ]),
                        ),
                    ]),
                ),
                (
                    "customresourcedefinitions",
                    map(vec![("owned", Value::Sequence(owned))]),
                ),
                (
                    "relatedImages",
                    Value::Sequence(vec![map(vec![
                        ("name", s("clickhouse-operator")),
                        ("image", s(&image)),
                    ])]),
                ),
            ]),
        ),
    ]);
    files.insert(
        format!("manifests/{PACKAGE}.clusterserviceversion.yaml"),
        yaml(&csv),
    );
    for c in &crds {
        let file = format!(
            "manifests/{}_{}.yaml",
            text(c, "spec.group"),
            text(c, "spec.names.plural")
        );
        files.insert(file, yaml(c));
    }
    for o in &extra {
        let api = text(o, "apiVersion");
        let file = format!(
            "manifests/{}_{}_{}.yaml",
            name(o),
            api.replace('/', "_"),
            kind(o).to_lowercase()
        );
        assert!(
            files.insert(file.clone(), yaml(o)).is_none(),
            "{file} twice"
        );
    }
    let annotations = annotations();
    let mut ann = Mapping::new();
    for (k, v) in &annotations {
        ann.insert(s(k), s(v));
    }
    files.insert(
        "metadata/annotations.yaml".into(),
        yaml(&map(vec![("annotations", Value::Mapping(ann))])),
    );
    let mut dockerfile = String::from(
        "# Generated by hack/olm-bundle.sh; do not edit. Builds the bundle image:\n\
         #   podman build -f deploy/olm/bundle.Dockerfile -t <registry>/clickhouse-operator-bundle:<version> deploy/olm\n\
         FROM scratch\n",
    );
    for (k, v) in &annotations {
        dockerfile.push_str(&format!("LABEL {k}={v}\n"));
    }
    dockerfile.push_str("COPY manifests /manifests/\nCOPY metadata /metadata/\n");
    files.insert("bundle.Dockerfile".into(), dockerfile);
    files
}

fn annotations() -> Vec<(String, String)> {
    [
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1",
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/",
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/",
        ),
        ("operators.operatorframework.io.bundle.package.v1", PACKAGE),
        ("operators.operatorframework.io.bundle.channels.v1", CHANNEL),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            CHANNEL,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Every file under the bundle folder, relative to it.
fn committed() -> BTreeMap<String, String> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().to_string();
                out.insert(rel, std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&bundle_dir(), &bundle_dir(), &mut out);
    out
}

/// docs/olm.md: the committed bundle is what the operator chart (its defaults) and the CRDs
/// give today; a change of the chart's Deployments, RBAC, Service or PDB, or of the CRDs,
/// without `bash hack/olm-bundle.sh` fails here. `CHOP_WRITE_OLM_BUNDLE=1` writes it.
#[test]
fn the_committed_olm_bundle_is_what_the_chart_and_the_crds_render() {
    if tool("helm.sh").is_err() {
        return skipped("helm cannot be built here");
    }
    let want = render();
    if std::env::var("CHOP_WRITE_OLM_BUNDLE").is_ok_and(|v| v == "1") {
        let dir = bundle_dir();
        // only what the bundle is made of (CHOP_OLM_OUT may name a folder holding more)
        let _ = std::fs::remove_dir_all(dir.join("manifests"));
        let _ = std::fs::remove_dir_all(dir.join("metadata"));
        let _ = std::fs::remove_file(dir.join("bundle.Dockerfile"));
        for (rel, content) in &want {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        eprintln!("wrote {} files into {}", want.len(), dir.display());
        return;
    }
    let have = committed();
    let names = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        names(&have),
        names(&want),
        "the bundle's files: run `bash hack/olm-bundle.sh`"
    );
    for (rel, content) in &want {
        assert!(
            &have[rel] == content,
            "deploy/olm/{rel} differs from what the chart and the CRDs render: run `bash hack/olm-bundle.sh`"
        );
    }
}

fn load(rel: &str) -> Value {
    let text = std::fs::read_to_string(bundle_dir().join(rel)).unwrap();
    let d = docs(&text);
    assert_eq!(
        d.len(),
        1,
        "{rel}: one object per file (OLM reads the first)"
    );
    d.into_iter().next().unwrap()
}

fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The kinds OLM installs from a bundle's manifests folder (operator-registry's supported
/// objects of `registry+v1`, OLM 0.16 and later), besides the CSV and CRDs.
const SUPPORTED_KINDS: [&str; 17] = [
    "ClusterServiceVersion",
    "CustomResourceDefinition",
    "Secret",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "ServiceAccount",
    "Service",
    "Role",
    "RoleBinding",
    "PrometheusRule",
    "ServiceMonitor",
    "PodDisruptionBudget",
    "PriorityClass",
    "VerticalPodAutoscaler",
    "ConsoleYAMLSample",
    "ConsoleQuickStart",
];

/// docs/olm.md: the bundle follows the `registry+v1` format, with operator-sdk's `bundle
/// validate` rules written as checks: `manifests/` and `metadata/` as annotations.yaml's
/// `operators.operatorframework.io.bundle.*` keys name them (and bundle.Dockerfile's labels
/// repeat them), one object per file and only supported kinds, one CSV named
/// `<package>.v<semver>` with `spec.version` the crate's version, a `minKubeVersion`, the
/// four install modes, a `deployment` install strategy whose Deployments are the chart's and
/// whose clusterPermissions and permissions are the rules of the chart's ClusterRoles and
/// Roles bound to each ServiceAccount, every owned CRD (name, served storage version, kind)
/// in the bundle and in deploy/crds.yaml, and alm-examples of owned kinds.
#[test]
fn the_olm_bundle_follows_the_bundle_format_and_matches_the_chart() {
    if tool("helm.sh").is_err() {
        return skipped("helm cannot be built here");
    }
    let dir = bundle_dir();
    // layout and annotations
    let ann = load("metadata/annotations.yaml");
    let ann = ann["annotations"].as_mapping().unwrap();
    let a = |k: &str| {
        ann.get(format!("operators.operatorframework.io.bundle.{k}"))
            .and_then(Value::as_str)
            .unwrap_or_else(|| {
                panic!("annotations.yaml: operators.operatorframework.io.bundle.{k}")
            })
            .to_string()
    };
    assert_eq!(a("mediatype.v1"), "registry+v1");
    let manifests_dir = a("manifests.v1");
    let metadata_dir = a("metadata.v1");
    assert!(dir.join(&manifests_dir).is_dir(), "{manifests_dir} exists");
    assert!(dir.join(&metadata_dir).is_dir(), "{metadata_dir} exists");
    let meta_files: Vec<String> = std::fs::read_dir(dir.join(&metadata_dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(meta_files, ["annotations.yaml"]);
    let channels: Vec<String> = a("channels.v1").split(',').map(String::from).collect();
    assert!(channels.iter().all(|c| !c.trim().is_empty()));
    assert!(channels.contains(&a("channel.default.v1")));
    for (k, v) in ann {
        assert!(
            k.as_str()
                .unwrap()
                .starts_with("operators.operatorframework.io.bundle."),
            "{k:?}"
        );
        let dockerfile = std::fs::read_to_string(dir.join("bundle.Dockerfile")).unwrap();
        assert!(
            dockerfile.contains(&format!(
                "LABEL {}={}\n",
                k.as_str().unwrap(),
                v.as_str().unwrap()
            )),
            "bundle.Dockerfile labels {k:?}"
        );
        assert!(dockerfile.contains(&format!(
            "COPY {} /manifests/",
            manifests_dir.trim_end_matches('/')
        )));
    }
    let mut objects = Vec::new();
    for e in std::fs::read_dir(dir.join(&manifests_dir)).unwrap() {
        let e = e.unwrap();
        let file = e.file_name().to_string_lossy().to_string();
        assert!(e.path().is_file(), "{file}: no folder in manifests/");
        assert!(!file.starts_with('.'), "{file}: no hidden file");
        let o = load(&format!("{manifests_dir}{file}"));
        assert!(
            SUPPORTED_KINDS.contains(&kind(&o).as_str()),
            "{file}: kind {} is not installed from a bundle",
            kind(&o)
        );
        assert!(
            get(&o, "metadata.namespace").is_null(),
            "{file}: no namespace"
        );
        objects.push(o);
    }
    let csvs: Vec<&Value> = objects
        .iter()
        .filter(|o| kind(o) == "ClusterServiceVersion")
        .collect();
    assert_eq!(csvs.len(), 1, "one CSV");
    let csv = csvs[0];
    assert_eq!(text(csv, "apiVersion"), "operators.coreos.com/v1alpha1");
    let v = text(csv, "spec.version");
    assert!(is_semver(&v), "spec.version {v:?}");
    assert_eq!(v, version());
    assert_eq!(name(csv), format!("{}.v{v}", a("package.v1")));
    for f in ["spec.displayName", "spec.description", "spec.provider.name"] {
        assert!(!text(csv, f).is_empty(), "{f}");
    }
    let mkv = text(csv, "spec.minKubeVersion");
    assert!(is_semver(&mkv), "minKubeVersion {mkv:?}");
    assert_eq!(mkv, min_kube_version(), "Chart.yaml's kubeVersion");
    let modes: BTreeMap<String, bool> = get(csv, "spec.installModes")
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| (text(m, "type"), m["supported"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        modes.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "AllNamespaces",
            "MultiNamespace",
            "OwnNamespace",
            "SingleNamespace"
        ]
    );
    assert!(
        modes["AllNamespaces"],
        "the chart's default: all namespaces"
    );
    assert_eq!(text(csv, "spec.install.strategy"), "deployment");

    // the install strategy against the chart as it renders now
    let chart = chart_docs();
    let deployments = get(csv, "spec.install.spec.deployments")
        .as_sequence()
        .unwrap();
    let chart_deps: Vec<&Value> = chart.iter().filter(|d| kind(d) == "Deployment").collect();
    assert_eq!(
        deployments
            .iter()
            .map(|d| text(d, "name"))
            .collect::<BTreeSet<_>>(),
        chart_deps.iter().map(|d| name(d)).collect::<BTreeSet<_>>(),
        "the chart's Deployments"
    );
    let mut service_accounts = BTreeSet::new();
    for d in deployments {
        let c = chart_deps
            .iter()
            .find(|c| name(c) == text(d, "name"))
            .unwrap();
        // equal but for the three documented changes of the environment
        let strip_env = |spec: &Value| -> Value {
            let mut spec = spec.clone();
            for ct in spec["template"]["spec"]["containers"]
                .as_sequence_mut()
                .unwrap()
            {
                if let Some(env) = ct.get_mut("env").and_then(Value::as_sequence_mut) {
                    env.retain(|e| {
                        !["WATCH_NAMESPACE", "PVC_DELETE_KEY", "OPERATOR_NETWORKS"]
                            .contains(&text(e, "name").as_str())
                    });
                }
            }
            spec
        };
        assert_eq!(
            strip_env(&d["spec"]),
            strip_env(&c["spec"]),
            "{}: the chart's spec",
            name(c)
        );
        for ct in get(d, "spec.template.spec.containers")
            .as_sequence()
            .unwrap()
        {
            for e in ct["env"].as_sequence().into_iter().flatten() {
                match text(e, "name").as_str() {
                    "WATCH_NAMESPACE" => assert_eq!(
                        text(e, "valueFrom.fieldRef.fieldPath"),
                        "metadata.annotations['olm.targetNamespaces']"
                    ),
                    "PVC_DELETE_KEY" => {
                        assert_eq!(
                            get(e, "valueFrom.secretKeyRef.optional").as_bool(),
                            Some(true)
                        )
                    }
                    _ => {}
                }
            }
        }
        service_accounts.insert(text(d, "spec.template.spec.serviceAccountName"));
    }
    let rules_of = |binding: &str, role: &str| -> BTreeMap<String, Value> {
        chart
            .iter()
            .filter(|b| kind(b) == binding)
            .map(|b| {
                let r = chart
                    .iter()
                    .find(|r| kind(r) == role && name(r) == text(b, "roleRef.name"))
                    .unwrap();
                (text(b, "subjects.0.name"), r["rules"].clone())
            })
            .collect()
    };
    let csv_rules = |f: &str| -> BTreeMap<String, Value> {
        get(csv, &format!("spec.install.spec.{f}"))
            .as_sequence()
            .unwrap()
            .iter()
            .map(|p| (text(p, "serviceAccountName"), p["rules"].clone()))
            .collect()
    };
    assert_eq!(
        csv_rules("clusterPermissions"),
        rules_of("ClusterRoleBinding", "ClusterRole"),
        "clusterPermissions: the chart's ClusterRoles per ServiceAccount"
    );
    assert_eq!(
        csv_rules("permissions"),
        rules_of("RoleBinding", "Role"),
        "permissions: the chart's Roles per ServiceAccount"
    );
    for sa in &service_accounts {
        assert!(
            csv_rules("clusterPermissions").contains_key(sa),
            "{sa}: the ServiceAccount of a Deployment has its rights"
        );
    }

    // owned CRDs: in the bundle and deploy/crds.yaml, by name, served storage version, kind
    let deploy = docs(&std::fs::read_to_string(repo().join("deploy/crds.yaml")).unwrap());
    let crd_key = |c: &Value| -> (String, String, String) {
        let storage = get(c, "spec.versions")
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["storage"].as_bool() == Some(true) && v["served"].as_bool() == Some(true))
            .unwrap();
        (name(c), text(storage, "name"), text(c, "spec.names.kind"))
    };
    let in_bundle: BTreeSet<_> = objects
        .iter()
        .filter(|o| kind(o) == "CustomResourceDefinition")
        .map(|c| {
            assert_eq!(text(c, "apiVersion"), "apiextensions.k8s.io/v1");
            crd_key(c)
        })
        .collect();
    let owned: BTreeSet<_> = get(csv, "spec.customresourcedefinitions.owned")
        .as_sequence()
        .unwrap()
        .iter()
        .map(|o| {
            assert!(!text(o, "displayName").is_empty());
            (text(o, "name"), text(o, "version"), text(o, "kind"))
        })
        .collect();
    assert_eq!(owned, in_bundle, "owned CRDs are the bundle's CRDs");
    assert_eq!(
        owned,
        deploy.iter().map(crd_key).collect::<BTreeSet<_>>(),
        "owned CRDs are deploy/crds.yaml's"
    );
    let examples: serde_json::Value =
        serde_json::from_str(&text(csv, "metadata.annotations.alm-examples")).unwrap();
    for e in examples.as_array().unwrap() {
        let k = e["kind"].as_str().unwrap();
        assert!(owned.iter().any(|o| o.2 == k), "alm-examples: {k} is owned");
    }
    let image = text(csv, "metadata.annotations.containerImage");
    assert_eq!(image, operator_image(&chart));
    assert!(
        get(csv, "spec.relatedImages")
            .as_sequence()
            .unwrap()
            .iter()
            .any(|r| text(r, "image") == image)
    );
}

/// docs/olm.md: operator-framework's validation library (the checks `operator-sdk bundle
/// validate` runs on a bundle's objects: CSV, CRDs, owned APIs, PDBs, roles) finds no error in
/// the bundle. Built by `hack/olm-validate.sh` from the Go module proxy and cached.
#[test]
fn the_olm_bundle_passes_operator_frameworks_validation() {
    let validator = match tool("olm-validate.sh") {
        Ok(v) => v,
        Err(why) => return skipped(&format!("the OLM validator cannot be built here: {why}")),
    };
    let out = Command::new(&validator).arg(bundle_dir()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(": 0 errors"),
        "olm-validate {}:\n{stdout}{}",
        bundle_dir().display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
}
