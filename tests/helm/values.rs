//! The charts' values: `helm lint` with default and custom values, values that cannot work,
//! the values schemas, and the operator chart's README naming every value.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_yaml::Value;

use crate::support::{cluster_chart, helm_cmd, helm_or_skip, lint, operator_chart};

/// S0-08, S0-09 and the operator chart: `helm lint --strict` passes with default and non-default
/// values.
#[test]
fn helm_lint_passes_with_default_and_custom_values() {
    let helm = helm_or_skip!();
    lint(helm, &operator_chart(), &[]);
    lint(
        helm,
        &operator_chart(),
        &[
            "watchNamespace=team-a\\,team-b",
            "image.repository=registry.example/clickhouse-operator",
            "image.tag=1.2.3",
            "maxConcurrentReconciles=4",
            "log.format=text",
            "log.level=debug",
            "replicaCount=3",
            "metrics.serviceMonitor.enabled=true",
            "pvcCleaner.enabled=false",
        ],
    );
    lint(helm, &cluster_chart(), &[]);
    lint(
        helm,
        &cluster_chart(),
        &[
            "resourceQuota.enabled=false",
            "spec.shards=2",
            "usersSecret.create=true",
            "usersSecret.users.analyst=secret",
        ],
    );
}

/// Values that cannot work are refused by `helm template` with a message naming them: a
/// ServiceMonitor without the metrics Service, a users Secret named like one the operator owns.
#[test]
fn charts_refuse_values_that_cannot_work() {
    let helm = helm_or_skip!();
    let refused = |chart: PathBuf, sets: &[&str], message: &str| {
        let mut c = helm_cmd(helm);
        c.arg("template").arg("r").arg(&chart);
        for s in crate::support::with_required(&chart, sets) {
            c.arg("--set").arg(s);
        }
        let out = c.output().expect("helm template");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{sets:?}: {stderr}"
        );
    };
    refused(
        operator_chart(),
        &[
            "metrics.service.enabled=false",
            "metrics.serviceMonitor.enabled=true",
        ],
        "metrics.serviceMonitor.enabled needs metrics.service.enabled",
    );
    for name in ["r-users", "r-operator"] {
        refused(
            cluster_chart(),
            &[
                "usersSecret.create=true",
                &format!("usersSecret.name={name}"),
            ],
            "is a Secret the operator owns",
        );
    }
}

/// Both charts carry a `values.schema.json`: a misspelled key or a value of the wrong type fails
/// `helm template` (and so `helm install`) naming it, while correct values pass. The cluster
/// chart's `spec` is checked against the CRD's schema, its free-form maps and pod templates
/// stay free.
#[test]
fn values_schemas_refuse_misspelled_keys_and_wrong_types() {
    let helm = helm_or_skip!();
    let render = |chart: &Path, sets: &[&str]| {
        let mut c = helm_cmd(helm);
        c.arg("template").arg("r").arg(chart);
        for s in crate::support::with_required(chart, sets) {
            c.arg("--set").arg(s);
        }
        let out = c.output().expect("helm template");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (chart, sets, says) in [
        (
            operator_chart(),
            &["replicaCont=3"][..],
            "'replicaCont' not allowed",
        ),
        (
            operator_chart(),
            &["image.tagg=1.2.3"][..],
            "'tagg' not allowed",
        ),
        (operator_chart(), &["replicaCount=two"][..], "/replicaCount"),
        (operator_chart(), &["log.format=xml"][..], "/log/format"),
        (
            operator_chart(),
            &["exporter.enabled=yes"][..],
            "/exporter/enabled",
        ),
        (
            cluster_chart(),
            &["spec.replcas=2"][..],
            "'replcas' not allowed",
        ),
        (
            cluster_chart(),
            &["spec.keeper.replcas=1"][..],
            "'replcas' not allowed",
        ),
        (cluster_chart(), &["spec.shards=two"][..], "/spec/shards"),
        (
            cluster_chart(),
            &["spec.updateStrategy=Fast"][..],
            "/spec/updateStrategy",
        ),
        (
            cluster_chart(),
            &["resourceQuota.enable=false"][..],
            "'enable' not allowed",
        ),
        (
            cluster_chart(),
            &["usersSecret.users.analyst.password=x"][..],
            "/usersSecret/users/analyst",
        ),
    ] {
        let (ok, stderr) = render(&chart, sets);
        assert!(
            !ok && stderr.contains(says),
            "{sets:?} passed or said: {stderr}"
        );
    }
    for (chart, sets) in [
        (operator_chart(), &[][..]),
        (
            operator_chart(),
            &[
                "replicaCount=3",
                "image.tag=1.2.3",
                "log.format=text",
                "exporter.enabled=true",
                "exporter.tokenSecret.name=exporter-token",
                "operatorNetworks={10.0.0.0/8}",
                "podLabels.team=db",
            ][..],
        ),
        (cluster_chart(), &[][..]),
        (
            cluster_chart(),
            &[
                "spec.replicas=3",
                "spec.keeper.replicas=1",
                "spec.updateStrategy=RollingUpdate",
                "spec.clientService.annotations.team=analytics",
                "spec.configuration.settings.logger/level=debug",
                "spec.pod.template.spec.priorityClassName=high",
                "usersSecret.create=true",
                "usersSecret.users.analyst=pw",
            ][..],
        ),
    ] {
        let (ok, stderr) = render(&chart, sets);
        assert!(ok, "{sets:?}: {stderr}");
    }
}

/// Every value of the operator chart's `values.yaml` is in the chart README's table (itself, or
/// a value it belongs to, such as `resources` for `resources.requests.cpu`), and the table names
/// no value that does not exist: a value added, renamed or removed without the README fails.
/// In the table, `` `a.b`, `.c` `` stands for `a.b` and `a.c`.
#[test]
fn the_operator_charts_readme_names_every_value_and_no_other() {
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(operator_chart().join("values.yaml")).unwrap(),
    )
    .unwrap();
    fn leaves(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Mapping(m) if !m.is_empty() => {
                for (k, v) in m {
                    let k = k.as_str().unwrap();
                    let p = if path.is_empty() {
                        k.to_string()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, &p, out);
                }
            }
            _ => out.push(path.to_string()),
        }
    }
    let mut all = Vec::new();
    leaves(&values, "", &mut all);
    let readme = std::fs::read_to_string(operator_chart().join("README.md")).unwrap();
    let mut named = BTreeSet::new();
    for row in readme.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split(" | ").next().unwrap().trim_start_matches("| ");
        let mut parent = String::new();
        for token in first.split('`').skip(1).step_by(2) {
            let full = match token.strip_prefix('.') {
                Some(rest) => format!("{parent}.{rest}"),
                None => token.to_string(),
            };
            parent = full
                .rsplit_once('.')
                .map_or(String::new(), |(p, _)| p.to_string());
            named.insert(full);
        }
    }
    let covered = |leaf: &str| {
        let mut p = leaf.to_string();
        loop {
            if named.contains(&p) {
                return true;
            }
            match p.rsplit_once('.') {
                Some((up, _)) => p = up.to_string(),
                None => return false,
            }
        }
    };
    let missing: Vec<&String> = all.iter().filter(|l| !covered(l)).collect();
    assert!(
        missing.is_empty(),
        "values not in charts/clickhouse-operator/README.md: {missing:?}"
    );
    let unknown: Vec<&String> = named
        .iter()
        .filter(|n| {
            !all.iter()
                .any(|l| l == *n || l.starts_with(&format!("{n}.")))
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "the README names values that do not exist: {unknown:?}"
    );
}
