//! Idle health checks at a glance (decision 60).
//!
//! A `ready` cluster nothing changes is checked again every few seconds (decision 41): its
//! servers may go read-only or lose their configuration without any Kubernetes event. A full
//! pass for that decodes the cluster's cached objects, builds every desired object and compares
//! them, which is most of an idle operator's CPU. Yet when the caches showed the cluster nothing
//! new since its last full pass, and its servers say at a glance what they said then, that pass
//! would plan nothing and report the same status.
//!
//! So an idle pass that found nothing to do leaves a [`Mark`]: the caches' stamps of what it
//! read, and each Ready server with what it said ([`crate::clickhouse::replica::Glance`]: the
//! hosts of `remote_servers` it loaded, its version, no read-only table). The next idle check
//! of that cluster compares the stamps and asks the servers the same one statement; only when
//! something differs (or [`FULL_RECHECK`] passed, for what only time changes) does it run a
//! full pass. A pass a change triggers is a full pass whatever the mark says (its stamps differ).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use super::{Context, observe};
use crate::api::{ClickHouseCluster, ClusterState};
use crate::clickhouse::{self, ClientConfig, replica::Glance, sql::ClusterName};
use crate::plan::World;

/// The longest an idle cluster goes between full passes: what only time changes (a wait that
/// ran out, a schedule) is seen within this.
pub const FULL_RECHECK: Duration = Duration::from_secs(300);

/// A Ready server an idle pass asked: how to reach it, and what it said.
pub type Server = (ClientConfig, Glance);

/// What an idle pass that found nothing to do read (see the module's documentation).
#[derive(Clone)]
pub struct Mark {
    /// The caches' stamps ([`crate::controller::cache::Caches::stamps`]) and the
    /// resourceVersions of the namespace's clusters, taken before the pass read them.
    stamps: Stamps,
    /// Each Ready server the pass asked, how to reach it and what it said.
    servers: Vec<Server>,
    /// When the pass ran.
    at: Instant,
}

/// What a pass reads of the caches, as stamps (see [`stamps`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamps {
    caches: Vec<Option<u64>>,
    /// Each cluster of the namespace (this one included) by name, with its resourceVersion.
    clusters: BTreeMap<String, Option<String>>,
}

/// The stamps of what a pass of `cluster` reads, taken before it reads it; `None` when a pass
/// of it reads more than the caches (a Keeper owned in another namespace) or the caches are
/// not what it plans from now.
pub fn stamps(cluster: &ClickHouseCluster, ctx: &Context) -> Option<Stamps> {
    let ns = cluster.namespace().unwrap_or_default();
    let elsewhere = cluster
        .spec
        .keeper
        .external
        .as_ref()
        .and_then(|e| e.cluster_ref.as_ref())
        .is_some_and(|r| r.namespace.as_deref().is_some_and(|n| n != ns));
    if elsewhere {
        return None;
    }
    let caches = ctx.caches.stamps(&ns, &cluster.name_any())?;
    let clusters = ctx
        .clusters_in(&ns)
        .iter()
        .map(|c| (c.name_any(), c.resource_version()))
        .collect();
    Some(Stamps { caches, clusters })
}

/// The servers an idle pass glanced at, with what they said, when every Ready server answered
/// and none has a read-only table (else the next check is a full pass).
pub fn servers(cluster: &ClickHouseCluster, world: &World) -> Option<Vec<Server>> {
    let o = &world.observed;
    if !o.distributed.is_empty() || !o.stalled_tables.is_empty() {
        return None;
    }
    o.cluster_hosts
        .iter()
        .map(|(replica, hosts)| {
            let glance = Glance {
                hosts: (*hosts)?,
                version: o.server_versions.get(replica)?.clone(),
                read_only: 0,
            };
            let config = observe::ch_config(cluster, world, replica).ok()?;
            Some((config, glance))
        })
        .collect()
}

/// The marks of idle clusters, by `namespace/name`.
#[derive(Default)]
pub struct Marks {
    marks: Mutex<HashMap<String, Mark>>,
}

impl Marks {
    /// Keeps what the idle pass of `key` read (`stamps`, `servers`), or forgets the cluster's
    /// mark when either is missing.
    pub fn set(&self, key: &str, stamps: Option<Stamps>, servers: Option<Vec<Server>>) {
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        match (stamps, servers) {
            (Some(stamps), Some(servers)) => {
                marks.insert(
                    key.to_string(),
                    Mark {
                        stamps,
                        servers,
                        at: Instant::now(),
                    },
                );
            }
            _ => {
                marks.remove(key);
            }
        }
    }

    /// Forgets the mark of `key` (a pass that was not idle, a deleted cluster).
    pub fn forget(&self, key: &str) {
        self.marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    fn get(&self, key: &str) -> Option<Mark> {
        self.marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }
}

/// Whether the idle check of `cluster` ends at a glance: it has a mark younger than
/// [`FULL_RECHECK`], the caches show nothing new since, and each of its servers says what it
/// said then. Otherwise the mark is forgotten and a full pass follows.
pub async fn unchanged(cluster: &ClickHouseCluster, ctx: &Context, key: &str) -> bool {
    let Some(mark) = ctx.idle.get(key) else {
        return false;
    };
    let same = still(&mark, cluster, ctx) && {
        let name = ClusterName(cluster.name_any());
        let connections = clickhouse::Connections::default();
        let asks = mark.servers.iter().map(|(config, seen)| {
            let client = connections.client(config.clone());
            let name = &name;
            async move {
                match client {
                    Ok(c) => clickhouse::replica::glance(&c, name)
                        .await
                        .is_ok_and(|g| g == *seen),
                    Err(_) => false,
                }
            }
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .all(|same| same)
    };
    if !same {
        ctx.idle.forget(key);
    }
    same
}

/// Whether `mark` still stands for `cluster` as the caches show it now, before asking its
/// servers.
fn still(mark: &Mark, cluster: &ClickHouseCluster, ctx: &Context) -> bool {
    mark.at.elapsed() < FULL_RECHECK
        && cluster
            .status
            .as_ref()
            .is_some_and(|s| s.state == ClusterState::Ready)
        && stamps(cluster, ctx).as_ref() == Some(&mark.stamps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::facts::Observed;
    use k8s_openapi::api::core::v1::{Pod, PodStatus};

    fn world(ready: &[(&str, &str)]) -> World {
        let mut o = Observed::default();
        for (replica, ip) in ready {
            let pod = Pod {
                status: Some(PodStatus {
                    pod_ip: Some((*ip).into()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            o.pods
                .insert(crate::model::names::replica_pod(replica), pod);
            o.cluster_hosts.insert((*replica).into(), Some(4));
            o.server_versions
                .insert((*replica).into(), "24.8.4.13".into());
        }
        o.inputs.operator_password = crate::model::Password("op-pw".into());
        World {
            clusters_in_namespace: Vec::new(),
            observed: o,
            limits: Default::default(),
        }
    }

    /// Decision 60: an idle pass leaves the servers to glance at only when every Ready server
    /// answered and none has a read-only table (those are checked in full on every pass).
    #[test]
    fn an_idle_mark_holds_every_ready_server_and_only_healthy_ones() {
        let cluster = crate::testing::cluster(serde_json::json!({"shards": 1, "replicas": 2}));
        let w = world(&[("c1-0-0", "10.0.0.1"), ("c1-0-1", "10.0.0.2")]);
        let found = servers(&cluster, &w).expect("two healthy servers");
        assert_eq!(found.len(), 2);
        let (config, glance) = &found[1];
        assert_eq!(config.endpoint.host, "10.0.0.2");
        assert_eq!(config.credentials.password, "op-pw");
        assert_eq!(
            *glance,
            Glance {
                hosts: 4,
                version: "24.8.4.13".into(),
                read_only: 0
            }
        );
        // a server that did not answer
        let mut silent = world(&[("c1-0-0", "10.0.0.1"), ("c1-0-1", "10.0.0.2")]);
        silent.observed.cluster_hosts.insert("c1-0-1".into(), None);
        assert!(servers(&cluster, &silent).is_none());
        // a server with a read-only table (checked in full)
        let mut read_only = world(&[("c1-0-0", "10.0.0.1")]);
        read_only.observed.distributed.insert(
            "c1-0-0".into(),
            Some("replicated table default.t is read-only".into()),
        );
        assert!(servers(&cluster, &read_only).is_none());
        // a server without an address
        let mut gone = world(&[("c1-0-0", "10.0.0.1")]);
        gone.observed.pods.clear();
        assert!(servers(&cluster, &gone).is_none());
        // no Ready server (Keeper only): nothing to ask
        assert_eq!(servers(&cluster, &world(&[])).map(|s| s.len()), Some(0));
    }
}
