//! Observe: everything a pass of one cluster reads, from the API server (through list calls
//! filtered by the cluster's label) and from its ClickHouse servers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tracing::debug;

use super::Error;
use crate::api::{
    ClickHouseBackup, ClickHouseCluster, ClusterState, ReplicaName, ReplicaState, ShardIndex,
};
use crate::clickhouse::{
    self, keeper as keeper_client, replica as chreplica,
    sql::{ClusterName, ReplicaMacro},
};
use crate::controller::cache::{self, Caches};
use crate::controller::kinds::cluster_kinds;
use crate::controller::kube::namespaced;
use crate::controller::{Context, api};
use crate::model::labels::Component;
use crate::model::{self, Password, labels, names};
use crate::plan::facts::{KeeperRole, Kind, MemberView, Observed, pod_ready};
use crate::plan::{FailureReason, Sibling, World};

fn by_name<K: Resource>(items: Vec<K>) -> BTreeMap<String, K> {
    items
        .into_iter()
        .map(|o| (o.meta().name.clone().unwrap_or_default(), o))
        .collect()
}

fn as_json<K: Resource + Serialize>(
    kind: Kind,
    items: Vec<K>,
) -> Vec<((Kind, String), serde_json::Value)> {
    items
        .into_iter()
        .map(|o| {
            let name = o.meta().name.clone().unwrap_or_default();
            ((kind, name), serde_json::to_value(&o).unwrap_or_default())
        })
        .collect()
}

/// How long a pass waits for the caches to show the writes of the passes before it; the watch
/// streams bring them within milliseconds unless a watch is broken.
const WRITES_SHOWN_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads the world of one pass: from the watch-fed caches once they show the writes of the
/// passes before (decision 41), or from the API server while the caches are not yet filled or
/// did not show those writes in time.
///
/// Also says whether the caches hold what this pass saw: true when it read them, and after a
/// read of the API server only when every object the caches hold of the cluster has the
/// resourceVersion the API server gave (so that the next pass, planning from the caches, sees
/// no older state than this one: a pod this operator deleted is not seen Ready again).
pub async fn observe(
    cluster: &ClickHouseCluster,
    ctx: &Context,
    connections: &clickhouse::Connections,
) -> Result<(World, bool), Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let siblings = siblings(cluster, &ctx.clusters_in(&ns));
    let caches = &ctx.caches;
    let (lists, caught_up) = if caches.synced()
        && !caches.dirty(&ns, &cluster.name_any())
        && caches
            .await_writes(&ns, &cluster.name_any(), WRITES_SHOWN_WITHIN)
            .await
    {
        ctx.metrics.observed("cache");
        (from_caches(cluster, caches, &ctx.client).await?, true)
    } else {
        ctx.metrics.observed("api");
        let lists = from_api(cluster, &ctx.client).await?;
        let caught_up = caches.synced() && caches_hold(cluster, caches, &lists);
        (lists, caught_up)
    };
    let operator = OperatorInputs {
        networks: ctx.operator_networks.clone(),
        pods: ctx.operator_pods.clone(),
    };
    let mut world = build(cluster, siblings, lists, operator, connections).await?;
    read_crash_logs(&ctx.client, &ns, &mut world.observed).await;
    read_client_routes(cluster, &ctx.client, &ns, &mut world.observed).await;
    world.observed.keeper_owner = keeper_owner(cluster, ctx).await;
    if world.observed.keeper_owner.is_none()
        && let Some((owner_ns, owner)) = keeper_nodes_of(cluster, ctx).await?
    {
        world.observed.keeper_owner = Some(if owner.spec.keeper.allowed_namespaces.contains(&ns) {
            crate::plan::facts::KeeperOwner::Allows
        } else {
            crate::plan::facts::KeeperOwner::Refuses
        });
        world.observed.keeper_nodes_of = Some((owner_ns, owner.name_any()));
    }
    world.observed.exporter_credentials_published = ctx.exporter_credentials.as_ref().map(|p| {
        let (password, ca) = exporter_credentials(cluster, &world);
        password.is_some_and(|password| {
            p.current(
                &cluster.namespace().unwrap_or_default(),
                &cluster.name_any(),
                password,
                ca,
            )
        })
    });
    Ok((world, caught_up))
}

/// What the cluster whose Keeper `cluster` references in another namespace says to it: from
/// the cache when the operator watches that namespace, else read once.
async fn keeper_owner(
    cluster: &ClickHouseCluster,
    ctx: &Context,
) -> Option<crate::plan::facts::KeeperOwner> {
    use crate::plan::facts::KeeperOwner;
    let ns = cluster.namespace().unwrap_or_default();
    let r = cluster
        .spec
        .keeper
        .external
        .as_ref()?
        .cluster_ref
        .as_ref()?;
    let owner_ns = r.namespace.clone().unwrap_or_else(|| ns.clone());
    if owner_ns == ns {
        return None;
    }
    let owner = match ctx.cluster(&owner_ns, &r.name) {
        Some(c) => Some((*c).clone()),
        None => api::<ClickHouseCluster>(ctx, &owner_ns)
            .get_opt(&r.name)
            .await
            .ok()
            .flatten(),
    };
    Some(match owner {
        None => KeeperOwner::Missing,
        Some(o) if o.spec.keeper.allowed_namespaces.contains(&ns) => KeeperOwner::Allows,
        Some(_) => KeeperOwner::Refuses,
    })
}

/// The ClickHouseCluster of another namespace whose Keeper `spec.keeper.external.nodes` names
/// (decision 71, review M-4): a member whose host is that cluster's Keeper Service or one of its
/// pods by DNS name (`<service>.<namespace>.svc…`, `<pod>.<headless>.<namespace>.svc…`), or
/// whose address (the host itself, or what it resolves to) is that Service's or one of its
/// Keeper pods' address. Only the clusters the operator watches count: those are the ones
/// whose Keeper NetworkPolicies let the operator in. Read from the caches, or from the API
/// server while they fill after a start.
async fn keeper_nodes_of(
    cluster: &ClickHouseCluster,
    ctx: &Context,
) -> Result<Option<(String, Arc<ClickHouseCluster>)>, Error> {
    let Some(x) = cluster.spec.keeper.external.as_ref() else {
        return Ok(None);
    };
    if x.cluster_ref.is_some() || x.nodes.is_empty() {
        return Ok(None);
    }
    let ns = cluster.namespace().unwrap_or_default();
    let mut addresses = std::collections::BTreeSet::new();
    let mut services = std::collections::BTreeSet::new();
    for n in &x.nodes {
        let host = n.host.trim().trim_end_matches('.').to_ascii_lowercase();
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
            addresses.insert(ip);
            continue;
        }
        // <service>.<namespace>.svc[.<domain>] or <pod>.<service>.<namespace>.svc[.<domain>]
        let labels: Vec<&str> = host.split('.').collect();
        if let Some(i) = labels.iter().position(|l| *l == "svc")
            && i >= 2
        {
            services.insert((labels[i - 1].to_string(), labels[i - 2].to_string()));
        }
        let lookup = tokio::net::lookup_host((host.as_str(), n.port as u16));
        if let Ok(Ok(found)) = tokio::time::timeout(Duration::from_secs(2), lookup).await {
            addresses.extend(found.map(|a| a.ip()));
        }
    }
    for other in ctx.all_clusters() {
        let other_ns = other.namespace().unwrap_or_default();
        let name = other.name_any();
        if other_ns == ns || other.spec.keeper.replicas == 0 {
            continue;
        }
        let own_services = [names::keeper(&name), names::keeper_headless_service(&name)];
        if own_services
            .iter()
            .any(|s| services.contains(&(other_ns.clone(), s.clone())))
        {
            return Ok(Some((other_ns, other)));
        }
        if addresses.is_empty() {
            continue;
        }
        let (svcs, pods) = if ctx.caches.synced() {
            (
                cache::group(&ctx.caches.objects.services, &other_ns, &name),
                cache::group(&ctx.caches.objects.pods, &other_ns, &name),
            )
        } else {
            let by_label = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
            (
                api::<Service>(ctx, &other_ns).list(&by_label).await?.items,
                api::<Pod>(ctx, &other_ns).list(&by_label).await?.items,
            )
        };
        let keeper_component = |m: &kube::api::ObjectMeta| {
            m.labels.as_ref().and_then(|l| l.get(labels::COMPONENT))
                == Some(&Component::Keeper.as_str().to_string())
        };
        let service_ips = svcs
            .iter()
            .filter(|s| own_services.contains(&s.name_any()))
            .filter_map(|s| s.spec.as_ref())
            .flat_map(|s| {
                s.cluster_ips
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .chain(s.cluster_ip.clone())
            });
        let pod_ips = pods
            .iter()
            .filter(|p| keeper_component(&p.metadata))
            .filter_map(|p| p.status.as_ref())
            .flat_map(|s| {
                s.pod_ips
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|i| i.ip)
                    .chain(s.pod_ip.clone())
            });
        if service_ips
            .chain(pod_ips)
            .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
            .any(|ip| addresses.contains(&ip))
        {
            return Ok(Some((other_ns, other)));
        }
    }
    Ok(None)
}

/// Names and resourceVersions of a list of objects.
fn versions<K: Resource>(objects: &[K]) -> std::collections::BTreeSet<(String, String)> {
    objects
        .iter()
        .map(|o| {
            (
                o.meta().name.clone().unwrap_or_default(),
                o.meta().resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Whether the caches hold exactly the objects of `lists` (read from the API server), each at
/// the same resourceVersion.
fn caches_hold(cluster: &ClickHouseCluster, caches: &Caches, lists: &Lists) -> bool {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    lists.objects.held_by(caches, &ns, &name)
        && running_backup(&name, &cache::group(&caches.backups, &ns, &name))
            == lists.backup_in_flight
        && lists.referenced.iter().all(|(_, secret, found)| {
            caches.secret_version(&ns, secret)
                == found
                    .as_ref()
                    .map(|s| s.resource_version().unwrap_or_default())
        })
}

/// The clusters of `cluster`'s namespace that count for decision 18.
pub fn siblings(
    cluster: &ClickHouseCluster,
    in_namespace: &[Arc<ClickHouseCluster>],
) -> Vec<Sibling> {
    let name = cluster.name_any();
    in_namespace
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() || c.name_any() == name)
        .map(|c| Sibling {
            name: c.name_any(),
            created: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
        })
        .collect()
}

/// [`observe`] with the namespace's clusters given, from the API server: reads only, also what
/// `plan` uses.
///
/// The operator's networks are those the running operator wrote into the users Secret
/// ([`labels::OPERATOR_NETWORKS`]), or `default_networks` where it has none.
pub async fn observe_with(
    cluster: &ClickHouseCluster,
    client: &Client,
    siblings: Vec<Sibling>,
    default_networks: &[String],
    connections: &clickhouse::Connections,
) -> Result<World, Error> {
    let lists = from_api(cluster, client).await?;
    let users = lists
        .objects
        .owned_secrets
        .iter()
        .find(|s| s.name_any() == names::users_secret(&cluster.name_any()));
    let written = |key: &str| users.and_then(|s| s.annotations().get(key).cloned());
    let operator = OperatorInputs {
        networks: written(labels::OPERATOR_NETWORKS)
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_else(|| default_networks.to_vec()),
        pods: written(labels::OPERATOR_PODS).and_then(|v| {
            let (namespace, selector) = v.split_once('/')?;
            Some(model::network_policy::OperatorPods {
                namespace: namespace.to_string(),
                labels: crate::runtime::settings::parse_labels(selector, "").ok()?,
            })
        }),
    };
    let mut world = build(cluster, siblings, lists, operator, connections).await?;
    let ns = cluster.namespace().unwrap_or_default();
    read_crash_logs(client, &ns, &mut world.observed).await;
    read_client_routes(cluster, client, &ns, &mut world.observed).await;
    Ok(world)
}

/// How long a pass waits for the client Service's EndpointSlices.
const ROUTES_WITHIN: Duration = Duration::from_secs(5);

/// While a condemned replica is still to be synced and emptied, and the client Service exists:
/// the server pods the Service's EndpointSlices list (`Observed::client_routes`), by the pod
/// each endpoint names or by its address. Every slice labelled with the Service's name counts,
/// the EndpointSlice controller's and any other (a mesh's, a hand-made one): kube-proxy routes
/// through all of them.
async fn read_client_routes(
    cluster: &ClickHouseCluster,
    client: &Client,
    ns: &str,
    o: &mut Observed,
) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let service = names::client_service(&cluster.name_any());
    let leaving = cluster
        .status
        .iter()
        .flat_map(|s| s.replica_state_map.values())
        .any(|r| {
            r.state == ReplicaState::Condemned
                && !r.released
                && r.scale_in_step
                    .is_none_or(|s| s < crate::api::ScaleInStep::Synced)
        });
    if !leaving || !o.objects.contains_key(&(Kind::Service, service.clone())) {
        return;
    }
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let slices = tokio::time::timeout(
        ROUTES_WITHIN,
        namespaced::<EndpointSlice>(client, ns).list(&lp),
    )
    .await;
    o.client_routes = Some(match slices {
        Ok(Ok(list)) => {
            let by_address: BTreeMap<&str, &str> = o
                .pods
                .iter()
                .filter_map(|(name, p)| {
                    Some((p.status.as_ref()?.pod_ip.as_deref()?, name.as_str()))
                })
                .collect();
            let mut pods = std::collections::BTreeSet::new();
            for endpoint in list.items.iter().flat_map(|s| s.endpoints.iter().flatten()) {
                if let Some(r) = &endpoint.target_ref
                    && r.kind.as_deref() == Some("Pod")
                    && let Some(name) = &r.name
                {
                    pods.insert(name.clone());
                }
                for a in &endpoint.addresses {
                    if let Some(name) = by_address.get(a.as_str()) {
                        pods.insert(name.to_string());
                    }
                }
            }
            Ok(pods)
        }
        Ok(Err(e)) => Err(format!("listing them failed: {e}")),
        Err(_) => Err(format!("listing them took more than {ROUTES_WITHIN:?}")),
    });
}

/// How many crash-looping pods a pass reads the log of.
const CRASH_LOGS_PER_PASS: usize = 4;

/// For each pod whose container keeps crashing (`CrashLoopBackOff`): the last error line of
/// its previous run's log (`Observed::crash_logs`), from its last 64 KiB, within 3 s; a log
/// that cannot be read leaves the termination message to tell. ClickHouse logs dozens of
/// shutdown lines after the error that stops it, so the termination message (2 KiB of the
/// log's tail) seldom holds it.
async fn read_crash_logs(client: &Client, ns: &str, o: &mut Observed) {
    let crashing: Vec<(String, String)> = o
        .pods
        .iter()
        .filter_map(|(name, p)| {
            let cs = p
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|cs| {
                    cs.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        == Some("CrashLoopBackOff")
                })?;
            Some((name.clone(), cs.name.clone()))
        })
        .take(CRASH_LOGS_PER_PASS)
        .collect();
    if crashing.is_empty() {
        return;
    }
    let pods: Api<Pod> = namespaced(client, ns);
    let reads = crashing.into_iter().map(|(pod, container)| {
        let pods = pods.clone();
        async move {
            let params = kube::api::LogParams {
                container: Some(container),
                previous: true,
                tail_lines: Some(400),
                limit_bytes: Some(64 * 1024),
                ..kube::api::LogParams::default()
            };
            let log = tokio::time::timeout(Duration::from_secs(3), pods.logs(&pod, &params)).await;
            match log {
                Ok(Ok(text)) => (pod, crate::plan::facts::last_error(&text)),
                Ok(Err(e)) => {
                    debug!(%pod, error = %e, "cannot read the log of a crashing container");
                    (pod, None)
                }
                Err(_) => (pod, None),
            }
        }
    });
    for (pod, line) in futures::future::join_all(reads).await {
        if let Some(line) = line {
            o.crash_logs.insert(pod, line);
        }
    }
}

/// What the builders need of the operator itself.
struct OperatorInputs {
    networks: Vec<String>,
    pods: Option<model::network_policy::OperatorPods>,
}

/// Declares [`Objects`] from the table of kinds.
macro_rules! objects {
    ($($kind:ident($ty:ty) $field:ident $trigger:ident;)*) => {
        /// A cluster's objects of each kind of the table ([`cluster_kinds!`]).
        struct Objects {
            $($field: Vec<$ty>,)*
        }

        impl Objects {
            /// From the API server, the objects `lp` selects in `ns`: the lists at once, so
            /// that a pass that reads the API server waits for one round trip, not one per kind.
            async fn list(client: &Client, ns: &str, lp: &ListParams) -> Result<Objects, kube::Error> {
                let ($($field,)*) = tokio::try_join!($(list::<$ty>(client, ns, lp),)*)?;
                Ok(Objects { $($field,)* })
            }

            /// From the caches, the objects of cluster `name` in `ns`.
            fn cached(caches: &Caches, ns: &str, name: &str) -> Objects {
                Objects {
                    $($field: cache::group(&caches.objects.$field, ns, name),)*
                }
            }

            /// Whether the caches hold exactly these objects of cluster `name` in `ns`, each at
            /// the same resourceVersion.
            fn held_by(&self, caches: &Caches, ns: &str, name: &str) -> bool {
                true $(&& versions(&cache::group(&caches.objects.$field, ns, name))
                    == versions(&self.$field))*
            }
        }
    };
}
cluster_kinds!(objects);

/// The Kubernetes objects a pass reads.
struct Lists {
    objects: Objects,
    /// (field, Secret name, the Secret if it exists) of every Secret the spec references.
    referenced: Vec<(&'static str, String, Option<Secret>)>,
    /// The Secrets of the cluster's backup destinations that exist (their keys become named
    /// collections of the servers where the Secret opts in).
    backup_secrets: Vec<Secret>,
    /// The backups of the cluster that are running.
    backup_in_flight: InFlight,
}

/// The backups of the cluster `name` that are Starting or Running.
#[derive(Clone, Debug, Default, PartialEq)]
struct InFlight {
    /// One of them.
    name: Option<String>,
    /// The replicas they read from (each shard recorded), with `backup <name>`.
    reads: BTreeMap<String, String>,
}

fn running_backup<'a>(
    name: &str,
    backups: impl IntoIterator<Item = &'a ClickHouseBackup>,
) -> InFlight {
    let mut out = InFlight::default();
    for b in backups {
        let Some(status) = b.status.as_ref() else {
            continue;
        };
        if b.spec.cluster_name != name || !status.state.in_flight() {
            continue;
        }
        out.name.get_or_insert_with(|| b.name_any());
        for shard in &status.shards {
            if !shard.replica.is_empty() {
                out.reads
                    .entry(shard.replica.clone())
                    .or_insert_with(|| format!("backup {}", b.name_any()));
            }
        }
    }
    out
}

async fn from_api(cluster: &ClickHouseCluster, client: &Client) -> Result<Lists, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let lp = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
    let secrets: Api<Secret> = namespaced(client, &ns);
    let mut referenced = Vec::new();
    for (field, secret) in cluster.spec.referenced_secrets() {
        let found = secrets.get_opt(&secret).await?;
        referenced.push((field, secret, found));
    }
    let mut backup_secrets = Vec::new();
    for secret in cluster.spec.backup_secrets() {
        backup_secrets.extend(secrets.get_opt(&secret).await?);
    }
    // the backups with the cluster's objects, at once
    let all = ListParams::default();
    let (backups, objects) = tokio::try_join!(
        list::<ClickHouseBackup>(client, &ns, &all),
        Objects::list(client, &ns, &lp),
    )?;
    Ok(Lists {
        objects,
        referenced,
        backup_secrets,
        backup_in_flight: running_backup(&name, &backups),
    })
}

/// The objects of one kind in `ns` that `lp` selects.
async fn list<K>(client: &Client, ns: &str, lp: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Ok(namespaced::<K>(client, ns).list(lp).await?.items)
}

/// Secret `name` of `ns`, read from the API server only when it changed since it was last read
/// (the cache watches every Secret's metadata, and keeps the data of those read).
async fn cached_secret(
    caches: &Caches,
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<Secret>, Error> {
    Ok(match caches.secret_version(ns, name) {
        None => None,
        Some(version) => match caches.secret_at(ns, name, &version) {
            Some(s) => Some((*s).clone()),
            None => {
                let s = namespaced::<Secret>(client, ns).get_opt(name).await?;
                if let Some(s) = &s {
                    caches.remember_secret(s);
                }
                s
            }
        },
    })
}

async fn from_caches(
    cluster: &ClickHouseCluster,
    caches: &Caches,
    client: &Client,
) -> Result<Lists, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let mut referenced = Vec::new();
    for (field, secret) in cluster.spec.referenced_secrets() {
        let found = cached_secret(caches, client, &ns, &secret).await?;
        referenced.push((field, secret, found));
    }
    let mut backup_secrets = Vec::new();
    for secret in cluster.spec.backup_secrets() {
        backup_secrets.extend(cached_secret(caches, client, &ns, &secret).await?);
    }
    let backups = cache::group(&caches.backups, &ns, &name);
    Ok(Lists {
        objects: Objects::cached(caches, &ns, &name),
        referenced,
        backup_secrets,
        backup_in_flight: running_backup(&name, &backups),
    })
}

/// The world of one pass, from the objects read and what the servers and Keeper say.
async fn build(
    cluster: &ClickHouseCluster,
    siblings: Vec<Sibling>,
    lists: Lists,
    operator: OperatorInputs,
    connections: &clickhouse::Connections,
) -> Result<World, Error> {
    let name = cluster.name_any();
    let objects = lists.objects;
    // the server and Keeper workloads typed, the other objects as JSON
    let mut o = Observed {
        statefulsets: by_name(objects.statefulsets),
        pods: by_name(objects.pods),
        pvcs: by_name(objects.pvcs),
        ..Observed::default()
    };
    o.objects
        .extend(as_json(Kind::ConfigMap, objects.configmaps));
    o.objects.extend(as_json(Kind::Service, objects.services));
    o.objects
        .extend(as_json(Kind::PodDisruptionBudget, objects.pdbs));
    o.objects
        .extend(as_json(Kind::NetworkPolicy, objects.network_policies));
    let owned_secrets = objects.owned_secrets;
    let found = owned_secrets
        .iter()
        .find(|s| s.name_any() == names::operator_secret(&name));
    o.operator_secret_orphaned = found.is_some_and(|s| {
        !s.owner_references()
            .iter()
            .any(|r| Some(&r.uid) == cluster.metadata.uid.as_ref())
    });
    let operator_secret = found.and_then(|s| s.data.as_ref());
    if let Some(pw) = operator_secret.and_then(|d| d.get(names::OPERATOR_PASSWORD_KEY)) {
        o.operator_secret_present = true;
        o.inputs.operator_password = Password(String::from_utf8_lossy(&pw.0).into_owned());
    }
    let generated = |key: &str| {
        operator_secret
            .and_then(|d| d.get(key))
            .filter(|pw| !pw.0.is_empty())
            .map(|pw| Password(String::from_utf8_lossy(&pw.0).into_owned()))
    };
    o.inputs.interserver_password = generated(names::INTERSERVER_PASSWORD_KEY);
    o.inputs.keeper_password = generated(names::KEEPER_PASSWORD_KEY);
    o.inputs.cluster_password = generated(names::CLUSTER_PASSWORD_KEY);
    o.inputs.cluster_secret = generated(names::CLUSTER_SECRET_KEY);
    o.inputs.exporter_password = generated(names::EXPORTER_PASSWORD_KEY);
    o.inputs.backup_collections = crate::plan::backup::destination::collections(cluster, |n| {
        lists.backup_secrets.iter().find(|s| s.name_any() == n)
    });
    o.inputs.operator_networks = operator.networks;
    o.inputs.operator_pods = operator.pods;
    o.keeper_identity_in_use = owned_secrets
        .iter()
        .find(|s| s.name_any() == names::users_secret(&name))
        .and_then(|s| s.data.as_ref()?.get(names::KEEPER_IDENTITY_FILE))
        .and_then(|f| {
            model::config::server::keeper_identity_of(&String::from_utf8_lossy(&f.0))
                .map(str::to_string)
        });
    o.objects.extend(as_json(Kind::Secret, owned_secrets));
    for (field, secret, found) in lists.referenced {
        match found {
            None => o.missing_secrets.push((field.to_string(), secret)),
            Some(s) => {
                let data: model::SecretData = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                if field == "spec.users.secretName" {
                    o.inputs.user_passwords = data
                        .iter()
                        .map(|(k, v)| {
                            (k.clone(), Password(String::from_utf8_lossy(v).into_owned()))
                        })
                        .collect();
                }
                // (also the users Secret: secretSettings or secretFiles may name its keys)
                o.inputs.secrets.insert(secret, data);
            }
        }
    }
    o.backup_in_flight = lists.backup_in_flight.name;
    o.backup_reads = lists.backup_in_flight.reads;
    let mut world = World {
        clusters_in_namespace: siblings,
        observed: o,
        limits: Default::default(),
    };
    read_keeper_views(cluster, &mut world.observed).await;
    if world.observed.operator_secret_present {
        read_cluster_hosts(cluster, &mut world, connections).await;
        read_pending_fetches(cluster, &mut world, connections).await;
    }
    Ok(world)
}

/// What each Ready server has loaded of `remote_servers` (see `Observed::cluster_hosts`) and,
/// while the cluster is not `ready` or the server has read-only replicated tables, whether it
/// serves: a query through it reaches every shard, Keeper answers it, none of its replicated
/// tables is read-only (see `Observed::distributed`). A `ready` cluster is glanced at only:
/// a server cut off from Keeper shows as read-only tables once its session expires, and the
/// full check follows on that pass.
async fn read_cluster_hosts(
    cluster: &ClickHouseCluster,
    world: &mut World,
    connections: &clickhouse::Connections,
) {
    let probe = cluster
        .status
        .as_ref()
        .is_none_or(|s| s.state != ClusterState::Ready);
    let ready: Vec<String> = cluster
        .status
        .iter()
        .flat_map(|s| s.replica_state_map.keys())
        .filter(|r| {
            world
                .observed
                .pods
                .get(&names::replica_pod(r))
                .is_some_and(pod_ready)
        })
        .map(|r| r.to_string())
        .collect();
    let name = ClusterName(cluster.name_any());
    let has_keeper = cluster.spec.keeper.replicas > 0 || cluster.spec.keeper.external.is_some();
    let ddl_path = has_keeper.then_some(model::config::server::DDL_PATH);
    // every server at once: a pass waits for the slowest server, not for their sum
    let asks = ready.into_iter().map(|r| {
        let client = ch_client(cluster, world, &r, connections);
        let name = &name;
        async move {
            let Ok(c) = client else {
                return (r, None, None);
            };
            let seen = chreplica::glance(&c, name)
                .await
                .inspect_err(|e| debug!(replica = %r, error = %e, "cannot read system.clusters"))
                .ok();
            let read_only = seen.as_ref().is_some_and(|g| g.read_only > 0);
            let reached = if probe || read_only {
                Some(chreplica::serving(&c, name, ddl_path).await)
            } else {
                None
            };
            (r, Some(seen), reached)
        }
    });
    for (r, seen, reached) in futures::future::join_all(asks).await {
        let Some(seen) = seen else {
            world.observed.cluster_hosts.insert(r, None);
            continue;
        };
        if let Some(g) = &seen {
            world
                .observed
                .server_versions
                .insert(r.clone(), g.version.clone());
        }
        world
            .observed
            .cluster_hosts
            .insert(r.clone(), seen.map(|g| g.hosts));
        if let Some(reached) = reached {
            let (why, stalled) = match reached {
                Ok(()) => (None, Vec::new()),
                Err(u) => (Some(u.why), u.stalled),
            };
            if !stalled.is_empty() {
                let tables = stalled
                    .into_iter()
                    .map(|t| (t.database.0, t.name))
                    .collect();
                world.observed.stalled_tables.insert(r.clone(), tables);
            }
            world.observed.distributed.insert(r, why);
        }
    }
}

/// Asks every running Keeper member which members its committed configuration lists (see
/// `Observed::keeper_views`) and its part in the ensemble (`mntr`, see
/// `Observed::keeper_roles`), all at once, each within [`KEEPER_CALL_TIMEOUT`]. Only while
/// something may be changing: the ensemble's size differs from the spec, a member is not
/// Ready or not on its StatefulSet's update revision, or the cluster is not `ready`; a settled
/// cluster sends nothing.
async fn read_keeper_views(cluster: &ClickHouseCluster, o: &mut Observed) {
    let keeper = names::keeper(&cluster.name_any());
    let want = cluster.spec.keeper.replicas;
    let pods: Vec<(&String, &Pod)> = o
        .pods
        .iter()
        .filter(|(n, _)| {
            n.strip_prefix(&keeper)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|ord| ord.parse::<u32>().is_ok())
        })
        .collect();
    let sts = o.statefulsets.get(&keeper);
    let size = sts.and_then(|s| s.spec.replicas);
    // a member on an older revision is rolled by the operator (its role is needed)
    let revision = sts
        .and_then(|s| s.status.as_ref())
        .filter(|st| st.observed_generation == sts.and_then(|s| s.metadata.generation))
        .and_then(|st| st.update_revision.as_ref());
    let on_revision = |p: &Pod| {
        revision.is_some()
            && p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("controller-revision-hash"))
                == revision
    };
    let settled = size == Some(want)
        && pods.len() == want as usize
        && pods.iter().all(|(_, p)| pod_ready(p) && on_revision(p))
        && cluster
            .status
            .as_ref()
            .is_some_and(|s| s.state == ClusterState::Ready);
    if settled || cluster.spec.pause {
        return;
    }
    let asks = pods.into_iter().filter_map(|(name, p)| {
        let ip: std::net::IpAddr = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
        let addr = std::net::SocketAddr::new(ip, names::KEEPER_CLIENT_PORT as u16);
        Some(async move {
            let view = async {
                let mut s = keeper_client::Session::connect(addr, KEEPER_CALL_TIMEOUT).await?;
                let m = s.members().await;
                s.close().await;
                m
            }
            .await;
            let view = match view {
                Ok(Some(m)) => MemberView::Voters(m.voters()),
                Ok(None) => MemberView::Unpublished,
                Err(e) => {
                    debug!(pod = %name, error = %e, "cannot read the Keeper membership");
                    MemberView::Unknown
                }
            };
            let role =
                match keeper_client::four_letter_word(addr, "mntr", KEEPER_CALL_TIMEOUT).await {
                    Ok(text) => KeeperRole::from_mntr(&text),
                    Err(e) => {
                        debug!(pod = %name, error = %e, "cannot read the Keeper member's role");
                        KeeperRole::Unknown
                    }
                };
            (name.clone(), view, role)
        })
    });
    for (name, view, role) in futures::future::join_all(asks).await {
        o.keeper_views.insert(name.clone(), view);
        o.keeper_roles.insert(name, role);
    }
}

/// For each replica whose pod was taken out of traffic for a restart: how many parts the other
/// Ready replicas of its shard still have to fetch from it (see `Observed::pending_fetches`).
async fn read_pending_fetches(
    cluster: &ClickHouseCluster,
    world: &mut World,
    connections: &clickhouse::Connections,
) {
    let Some(status) = cluster.status.as_ref() else {
        return;
    };
    let map = &status.replica_state_map;
    let pods = &world.observed.pods;
    let serving = |r: &str| {
        pods.get(&names::replica_pod(r))
            .and_then(|p| p.metadata.labels.as_ref())
            .is_some_and(|l| l.contains_key(labels::SERVING))
    };
    let excluded: Vec<(ReplicaName, ShardIndex)> = map
        .iter()
        .filter(|(n, r)| {
            r.state != ReplicaState::Condemned
                && pods.get(&names::replica_pod(n)).is_some_and(pod_ready)
                && !serving(n)
        })
        .map(|(n, r)| (n.clone(), r.shard))
        .collect();
    // every (excluded replica, Ready peer) pair at once
    let mut asks = Vec::new();
    for (replica, shard) in &excluded {
        for (peer, _) in map.iter().filter(|(n, r)| {
            r.shard == *shard && *n != replica && r.state != ReplicaState::Condemned
        }) {
            if !pods.get(&names::replica_pod(peer)).is_some_and(pod_ready) {
                continue;
            }
            let client = ch_client(cluster, world, peer, connections);
            asks.push(async move {
                let n = match client {
                    Ok(c) => chreplica::fetches_from(&c, &ReplicaMacro(replica.to_string()))
                        .await
                        .ok(),
                    Err(_) => None,
                };
                (replica.to_string(), n)
            });
        }
    }
    let answers = futures::future::join_all(asks).await;
    for (replica, _) in excluded {
        let pending = answers
            .iter()
            .filter(|(r, _)| replica == *r)
            .try_fold(0, |sum, (_, n)| n.map(|n| sum + n));
        world
            .observed
            .pending_fetches
            .insert(replica.into(), pending);
    }
}

/// Reads the replication lag of `replicas` into the world (the rollout's catch-up check).
pub async fn read_lag(
    cluster: &ClickHouseCluster,
    world: &mut World,
    replicas: &[ReplicaName],
    connections: &clickhouse::Connections,
) {
    let asks = replicas.iter().map(|r| {
        let client = ch_client(cluster, world, r, connections);
        async move {
            let caught_up = match client {
                Ok(c) => match chreplica::replication_lag(&c).await {
                    Ok(lag) => lag.is_synced(),
                    Err(e) => {
                        debug!(replica = %r, error = %e, "cannot read replication lag");
                        false
                    }
                },
                Err(_) => false,
            };
            (r.clone(), caught_up)
        }
    });
    for (r, caught_up) in futures::future::join_all(asks).await {
        world.observed.caught_up.insert(r.into(), caught_up);
    }
}

/// What the exporter needs of a cluster: its account's password and, with TLS, the CA.
pub fn exporter_credentials<'a>(
    cluster: &ClickHouseCluster,
    world: &'a World,
) -> (Option<&'a [u8]>, Option<&'a [u8]>) {
    let password = world.observed.inputs.exporter_password.as_ref();
    (password.map(|p| p.0.as_bytes()), cluster_ca(cluster, world))
}

/// The CA the servers' certificates are verified with (`ca.crt` of `spec.tls.caSecret`, read
/// while TLS is on).
fn cluster_ca<'a>(cluster: &ClickHouseCluster, world: &'a World) -> Option<&'a [u8]> {
    let ca = cluster
        .spec
        .tls
        .ca_secret
        .as_ref()
        .filter(|_| cluster.spec.tls.enabled)?;
    world
        .observed
        .inputs
        .secrets
        .get(ca)?
        .get("ca.crt")
        .map(Vec::as_slice)
}

/// How long a pass waits for one Keeper member's answer.
const KEEPER_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one call of a pass to a ClickHouse server may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(8);

/// A ClickHouse client for a replica's pod, as the operator's own user, on the HTTP clients of
/// the pass (`connections`).
pub fn ch_client(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
    connections: &clickhouse::Connections,
) -> Result<clickhouse::Client, Error> {
    connections
        .client(ch_config(cluster, world, replica)?)
        .map_err(|e| Error::failed(FailureReason::ClickHouse, e.to_string()))
}

/// How a pass reaches a replica's server (see [`ch_client`]).
pub fn ch_config(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
) -> Result<clickhouse::ClientConfig, Error> {
    let pod = names::replica_pod(replica);
    let ip = world
        .observed
        .pods
        .get(&pod)
        .and_then(|p| p.status.as_ref()?.pod_ip.clone())
        .ok_or_else(|| {
            Error::failed(
                FailureReason::ReplicaUnreachable,
                format!("pod {pod} has no address"),
            )
        })?;
    let ca = cluster_ca(cluster, world).map(<[u8]>::to_vec);
    let credentials = clickhouse::Credentials {
        user: names::OPERATOR_USER.to_string(),
        password: world.observed.inputs.operator_password.0.clone(),
    };
    let mut config = clickhouse::ClientConfig::for_replica(cluster, replica, ip, credentials, ca);
    // A pass never waits long on one server (invariant 11).
    config.timeout = CALL_TIMEOUT;
    config.retry = clickhouse::RetryPolicy {
        attempts: 3,
        first_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(1),
    };
    Ok(config)
}
