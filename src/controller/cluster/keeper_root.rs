//! The cluster's root path in an external Keeper (`spec.keeper.external`, decision 28): created,
//! every missing level of it, before the servers start (ClickHouse refuses a root that does not
//! exist), and removed with everything under it when the cluster is deleted with
//! `reclaimPolicy: Delete`, once its servers are gone (with `Retain` it stays with the volumes). The operator speaks to the ensemble itself ([`crate::clickhouse::keeper`]), as the
//! servers' Keeper identity, so it may remove what they created.
//!
//! ACLs (decision 38): the root belongs to the cluster's digest identity alone; the levels
//! above it, which several clusters' roots may share, let everyone read them and create and
//! delete (empty) children, and nobody write them or change their ACL. A node an older operator
//! created open to everyone gets these ACLs at the next pass that ensures the root.
//!
//! Ownership: the root's data names the cluster it was made for ([`marker`], its UID). A root
//! inside another cluster's root, or one that exists with content and was not made for this
//! cluster, is refused before anything is created; one made for another UID whose ACL is this
//! cluster's identity alone is the root of a deleted cluster whose credentials this one took over
//! with its retained volumes (decision 30), and is taken over; removal leaves alone a root that
//! names another cluster and every root of another cluster found under it, so deleting one cluster
//! never takes another's replication metadata with it.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use super::{Error, api};
use crate::api::ClickHouseCluster;
use crate::clickhouse::keeper::{
    self as keeper_client, AclEntry, NO_AUTH, NO_NODE, NODE_EXISTS, Session, perms,
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

/// The data of a root made for the cluster with UID `uid`.
pub fn marker(uid: &str) -> Vec<u8> {
    format!("{MARKER_PREFIX}{uid}").into_bytes()
}

const MARKER_PREFIX: &str = "clickhouse-operator root of cluster ";

/// Whose root a node is, by its data (`None`: nobody's).
pub fn owner_of(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()?.strip_prefix(MARKER_PREFIX)
}

/// Who a node at `path` belongs to, as far as this session may tell.
enum Node {
    Absent,
    /// Readable: its data.
    Present(Vec<u8>),
    /// Its ACL refuses this session: another identity's (a root is readable by its own only).
    Closed,
}

impl Node {
    /// The root of a cluster other than the one with UID `uid` (a closed node is: a root is
    /// readable by its own identity only, the levels above by everyone).
    fn is_others_root(&self, uid: &str) -> bool {
        match self {
            Node::Closed => true,
            Node::Present(data) => owner_of(data).is_some_and(|o| o != uid),
            Node::Absent => false,
        }
    }
}

async fn node(s: &mut Session, path: &str) -> Result<Node, Error> {
    match s.get(path).await {
        Ok(None) => Ok(Node::Absent),
        Ok(Some(data)) => Ok(Node::Present(data)),
        Err(e) if e.code() == Some(NO_AUTH) => Ok(Node::Closed),
        Err(e) => Err(keeper_error(e)),
    }
}

/// Creates `root` and every missing level above it, with [`acls`], the root marked as the
/// cluster's ([`marker`]); tightens the ACL of those an older operator left open. Refuses a
/// root inside another cluster's root, one that is another cluster's, and one that exists
/// with content without being this cluster's (an empty unmarked one, such as an older operator
/// made, is taken over).
pub async fn ensure(
    cluster: &ClickHouseCluster,
    ctx: &Context,
    password: Option<&Password>,
    root: &str,
) -> Result<(), Error> {
    let mut s = session(cluster, ctx, password).await?;
    let result = ensure_in(&mut s, cluster, password, root).await;
    s.close().await;
    result
}

async fn ensure_in(
    s: &mut Session,
    cluster: &ClickHouseCluster,
    password: Option<&Password>,
    root: &str,
) -> Result<(), Error> {
    let uid = cluster.uid().unwrap_or_default();
    let identity = password.map(|p| format!("{}:{}", names::KEEPER_USER, p.0));
    let (own, shared) = acls(identity.as_deref());
    let open = vec![AclEntry::world(perms::ALL)];
    let mut at = String::new();
    let parts: Vec<&str> = root.split('/').filter(|p| !p.is_empty()).collect();
    let refuse = |why: String| {
        failed(format!(
            "spec.keeper.external.root {root}: {why}; choose another root"
        ))
    };
    for (i, part) in parts.iter().enumerate() {
        at.push('/');
        at.push_str(part);
        let last = i + 1 == parts.len();
        let acl = if last { &own } else { &shared };
        let mut found = node(s, &at).await?;
        if last
            && let (Node::Present(data), Some(_)) = (&found, &identity)
            && owner_of(data).is_some_and(|o| o != uid)
            && s.acl(&at).await.map_err(keeper_error)? == own
        {
            // the root of a deleted cluster of this name whose volumes and credentials were
            // retained: only the same identity reads a root (its ACL is that identity's
            // alone), and only its cluster's credentials hold it; taken over as it is
            s.set(&at, &marker(&uid)).await.map_err(keeper_error)?;
            found = Node::Present(marker(&uid));
        }
        if found.is_others_root(&uid) {
            return Err(refuse(if last {
                "it is another cluster's root".into()
            } else {
                format!("it lies inside another cluster's root ({at})")
            }));
        }
        match found {
            Node::Absent => {
                let data = if last { marker(&uid) } else { Vec::new() };
                match s.create(&at, &data, acl).await {
                    Ok(_) => {}
                    Err(e) if e.code() == Some(NODE_EXISTS) => {}
                    Err(e) => return Err(keeper_error(e)),
                }
            }
            Node::Present(data) if last && owner_of(&data).is_none() => {
                // made before roots were marked, or by someone else: taken over only empty
                let children = s.children(&at).await.map_err(keeper_error)?;
                if !children.is_empty() {
                    return Err(refuse(
                        "it exists in the Keeper with content and was not made for this cluster"
                            .into(),
                    ));
                }
                s.set(&at, &marker(&uid)).await.map_err(keeper_error)?;
                if identity.is_some() && s.acl(&at).await.map_err(keeper_error)? == open {
                    s.set_acl(&at, acl).await.map_err(keeper_error)?;
                }
            }
            Node::Present(_) => {
                if identity.is_some() && s.acl(&at).await.map_err(keeper_error)? == open {
                    s.set_acl(&at, acl).await.map_err(keeper_error)?;
                }
            }
            Node::Closed => unreachable!("refused above"),
        }
    }
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

/// Removes `root` and everything under it (children first); a node already gone is fine. A
/// root that names another cluster is left as it is, and so is every other cluster's root
/// found under it (with the levels above it). Returns the roots of other clusters left.
pub async fn remove(
    cluster: &ClickHouseCluster,
    ctx: &Context,
    password: Option<&Password>,
    root: &str,
) -> Result<Vec<String>, Error> {
    let mut s = session(cluster, ctx, password).await?;
    let uid = cluster.uid().unwrap_or_default();
    let mut kept: Vec<String> = Vec::new();
    if node(&mut s, root).await?.is_others_root(&uid) {
        s.close().await;
        return Ok(vec![root.to_string()]);
    }
    // depth first, without recursion: (path, children listed)
    let mut stack: Vec<(String, bool)> = vec![(root.to_string(), false)];
    while let Some((path, listed)) = stack.pop() {
        if listed {
            let prefix = format!("{path}/");
            if kept.iter().any(|k| k.starts_with(&prefix)) {
                continue;
            }
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
            let child = format!("{path}/{c}");
            if node(&mut s, &child).await?.is_others_root(&uid) {
                kept.push(child);
            } else {
                stack.push((child, false));
            }
        }
    }
    s.close().await;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root names the cluster it was made for; data of any other shape names nobody.
    #[test]
    fn a_root_names_its_cluster_and_nothing_else_does() {
        assert_eq!(owner_of(&marker("uid-1")), Some("uid-1"));
        assert_eq!(owner_of(b""), None);
        assert_eq!(owner_of(b"format version: 4\n"), None);
        assert_eq!(owner_of(&[0xff, 0xfe]), None);
    }
}
