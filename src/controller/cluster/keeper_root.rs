//! The cluster's root path in an external Keeper (`spec.keeper.external`, issue 17): created,
//! every missing level of it, before the servers start (ClickHouse refuses a root that does not
//! exist), and removed with everything under it when the cluster is deleted, once its servers
//! are gone. The operator speaks to the ensemble itself ([`crate::clickhouse::keeper`]), as the
//! servers' Keeper identity, so it may remove what they created.
//!
//! ACLs (issue 32, S-5): the root belongs to the cluster's digest identity alone; the levels
//! above it, which several clusters' roots may share, let everyone read them and create and
//! delete (empty) children, and nobody write them or change their ACL. A node an older operator
//! created open to everyone gets these ACLs at the next pass that ensures the root.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use super::{Error, api};
use crate::api::ClickHouseCluster;
use crate::clickhouse::keeper::{
    self as keeper_client, AclEntry, NO_NODE, NODE_EXISTS, Session, perms,
};
use crate::controller::Context;
use crate::model::{Password, names};
use crate::plan::FailureReason;

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn failed(message: String) -> Error {
    Error::failed(FailureReason::Keeper, message)
}

/// One message for a Keeper that cannot be used, whatever the cause (a name that does not
/// resolve, a port that refuses, one that does not answer, a member that is not Keeper): the
/// operator's connections must not tell a cluster's editor what listens where on its network.
fn unreachable_keeper() -> Error {
    failed(
        "no member of the external Keeper answered as Keeper (spec.keeper.external): check its hosts, ports and network"
            .into(),
    )
}

/// Where the operator reaches the external ensemble: the listed members (resolved here), or the
/// address of the referenced cluster's Keeper client Service.
async fn addresses(cluster: &ClickHouseCluster, ctx: &Context) -> Result<Vec<SocketAddr>, Error> {
    let Some(x) = &cluster.spec.keeper.external else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    if let Some(r) = &x.cluster_ref {
        let ns = r
            .namespace
            .clone()
            .unwrap_or_else(|| cluster.namespace().unwrap_or_default());
        let name = names::keeper(&r.name);
        let svc = api::<Service>(ctx, &ns)
            .get_opt(&name)
            .await?
            .ok_or_else(|| {
                failed(format!(
                    "spec.keeper.external.clusterRef: the Keeper Service {ns}/{name} does not exist (is ClickHouseCluster {ns}/{} there, with Keeper?)",
                    r.name
                ))
            })?;
        let ip = svc
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| failed(format!("the Keeper Service {ns}/{name} has no address")))?;
        out.push(SocketAddr::new(ip, names::KEEPER_CLIENT_PORT as u16));
    }
    for n in &x.nodes {
        if let Ok(found) = tokio::net::lookup_host((n.host.as_str(), n.port as u16)).await {
            out.extend(found);
        }
    }
    if out.is_empty() {
        return Err(unreachable_keeper());
    }
    Ok(out)
}

/// A session with the first member that answers, authenticated as the servers' identity.
async fn session(
    cluster: &ClickHouseCluster,
    ctx: &Context,
    password: Option<&Password>,
) -> Result<Session, Error> {
    for addr in addresses(cluster, ctx).await? {
        match Session::connect(addr, CALL_TIMEOUT).await {
            Ok(mut s) => {
                if let Some(p) = password {
                    let identity = format!("{}:{}", names::KEEPER_USER, p.0);
                    s.add_digest_auth(&identity).await.map_err(keeper_error)?;
                }
                return Ok(s);
            }
            Err(e) => {
                tracing::debug!(%addr, error = %e, "an external Keeper member does not answer")
            }
        }
    }
    Err(unreachable_keeper())
}

fn keeper_error(e: keeper_client::Error) -> Error {
    failed(e.to_string())
}

/// The ACLs of `root` and of the levels above it, for identity `identity` (none: a cluster
/// from before Keeper identities, whose nodes stay open as its servers' are).
pub fn acls(identity: Option<&str>) -> (Vec<AclEntry>, Vec<AclEntry>) {
    match identity {
        Some(id) => (
            vec![AclEntry::digest(id, perms::ALL)],
            vec![AclEntry::world(perms::READ | perms::CREATE | perms::DELETE)],
        ),
        None => (
            vec![AclEntry::world(perms::ALL)],
            vec![AclEntry::world(perms::ALL)],
        ),
    }
}

/// Creates `root` and every missing level above it, with [`acls`]; tightens the ACL of those
/// an older operator left open.
pub async fn ensure(
    cluster: &ClickHouseCluster,
    ctx: &Context,
    password: Option<&Password>,
    root: &str,
) -> Result<(), Error> {
    let mut s = session(cluster, ctx, password).await?;
    let identity = password.map(|p| format!("{}:{}", names::KEEPER_USER, p.0));
    let (own, shared) = acls(identity.as_deref());
    let open = vec![AclEntry::world(perms::ALL)];
    let mut at = String::new();
    let parts: Vec<&str> = root.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        at.push('/');
        at.push_str(part);
        let acl = if i + 1 == parts.len() { &own } else { &shared };
        if s.get(&at).await.map_err(keeper_error)?.is_none() {
            match s.create(&at, b"", acl).await {
                Ok(_) => {}
                Err(e) if e.code() == Some(NODE_EXISTS) => {}
                Err(e) => return Err(keeper_error(e)),
            }
        } else if identity.is_some() && s.acl(&at).await.map_err(keeper_error)? == open {
            s.set_acl(&at, acl).await.map_err(keeper_error)?;
        }
    }
    s.close().await;
    Ok(())
}

/// Deletes the cluster's server StatefulSets (their PVCs stay, for the reclaim policy) and says
/// whether their pods are gone.
pub async fn servers_stopped(cluster: &ClickHouseCluster, ctx: &Context) -> Result<bool, Error> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, ListParams};
    let ns = cluster.namespace().unwrap_or_default();
    let selector = format!(
        "{}={},{}={}",
        crate::model::labels::CLUSTER,
        cluster.name_any(),
        crate::model::labels::COMPONENT,
        crate::model::labels::Component::Server.as_str()
    );
    let lp = ListParams::default().labels(&selector);
    let sets = api::<StatefulSet>(ctx, &ns).list(&lp).await?;
    for s in sets
        .items
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
    {
        super::ignore_not_found(
            api::<StatefulSet>(ctx, &ns)
                .delete(&s.name_any(), &DeleteParams::default())
                .await,
        )?;
    }
    Ok(api::<Pod>(ctx, &ns).list(&lp).await?.items.is_empty())
}

/// Removes `root` and everything under it (children first); a node already gone is fine.
pub async fn remove(
    cluster: &ClickHouseCluster,
    ctx: &Context,
    password: Option<&Password>,
    root: &str,
) -> Result<(), Error> {
    let mut s = session(cluster, ctx, password).await?;
    // depth first, without recursion: (path, children listed)
    let mut stack: Vec<(String, bool)> = vec![(root.to_string(), false)];
    while let Some((path, listed)) = stack.pop() {
        if listed {
            match s.delete(&path).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(NO_NODE) => {}
                Err(e) => return Err(keeper_error(e)),
            }
            continue;
        }
        let children = match s.children(&path).await {
            Ok(c) => c,
            Err(e) if e.code() == Some(NO_NODE) => continue,
            Err(e) => return Err(keeper_error(e)),
        };
        stack.push((path.clone(), true));
        for c in children {
            stack.push((format!("{path}/{c}"), false));
        }
    }
    s.close().await;
    Ok(())
}
