//! The Helm charts (`charts/clickhouse-operator`, `charts/onprem-clickhouse-cluster`).
//!
//! - `helm lint` and `helm template` of both charts with default and non-default values.
//! - The chart's CRDs are exactly `deploy/crds.yaml`.
//! - Both charts' `values.schema.json` refuse misspelled keys and wrong types.
//! - On the real local Kubernetes (`hack/local-cluster.sh`): the operator installed by its chart
//!   runs IN the cluster (the node agent maps the `clickhouse-operator` image to the locally built
//!   binary, with the pod's ServiceAccount token), under the chart's RBAC only; the cluster of
//!   `onprem-clickhouse-cluster` becomes ready, a second one is refused by the quota and, with the
//!   quota off, by the operator; scale out, scale in, roll, pause, leader failover and delete; and
//!   the API server's audit log shows that no request of the operator was denied and which RBAC
//!   rules were never used.
//!
//! helm is built by `hack/helm.sh` (cached; `hack/setup.sh` builds it). If it cannot be built,
//! every test here says so and passes without checking anything.
//! `CHOP_KUBECONFIG=<dir>/kubeconfig` uses an already running local cluster (its audit log is
//! `<dir>/audit.log`); otherwise the cluster test starts its own and stops it at exit.
//!
//! Where things are: `helm/support.rs` has what the tests share (helm and what it renders, the
//! local cluster, the audit log); the tests are in `helm/`, by topic: `operator_chart.rs` (its
//! CRDs, Deployment, RBAC and values as rendered), `access.rs` (RBAC rules, built-in roles,
//! NetworkPolicies), `values.rs` (lint, refused values, the values schemas, the README's table), `renders.rs`
//! (what is given rather than looked up: the operator's networks, the PVC key under GitOps, where
//! pods' logs and ServiceAccount tokens are granted, the install notes),
//! `cluster_chart.rs` (the one-cluster quota), `monitoring.rs` (the exporter, alerts, dashboards,
//! promtool, runbooks), `metric_names.rs` (the naming options and what the dashboards and alerts
//! read), and `in_cluster/` on the real local Kubernetes (`lifecycle.rs`: the whole story and the
//! audit log; `install.rs`: the CRD upgrade and the README's "Install with Helm" block).

#[path = "helm/support.rs"]
mod support;

#[path = "helm/access.rs"]
mod access;
#[path = "helm/cluster_chart.rs"]
mod cluster_chart;
#[path = "helm/metric_names.rs"]
mod metric_names;
#[path = "helm/monitoring.rs"]
mod monitoring;
#[path = "helm/openshift.rs"]
mod openshift;
#[path = "helm/operator_chart.rs"]
mod operator_chart;
#[path = "helm/renders.rs"]
mod renders;
#[path = "helm/values.rs"]
mod values;

#[path = "helm/in_cluster.rs"]
mod in_cluster;
