//! The charts on the real local Kubernetes, with the operator running in the cluster under the
//! chart's RBAC, and the audit log as the judge of least privilege.

#[path = "in_cluster/install.rs"]
mod install;
#[path = "in_cluster/lifecycle.rs"]
mod lifecycle;
