//! Services: each ClusterIP is an address of the bridge, each ClusterIP:port (TCP) a listener of
//! the agent that forwards connections to a ready endpoint read from the EndpointSlices (as
//! kube-proxy does). `default/kubernetes` (and 198.18.0.1:443) forward to the API server.
//!
//! NetworkPolicies: the proxy sees the real client (the accepted peer) and the backend it
//! picks, so it asks the policy decision for both ends, as a CNI decides after kube-proxy's
//! DNAT: the client pod's egress to the backend and the backend pod's ingress from the client.
//! The API server counts as the machine's gateway address on port 443 (what pods reach it at).
//! A refused connection is reset once accepted (a CNI drops the SYN, the client waits for its
//! timeout instead): the difference a user-space proxy cannot avoid.

use crate::SharedCtx;
use k8s_openapi::api::core::v1::Service;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

type Listeners = HashMap<(String, u16), JoinHandle<()>>;
static LISTENERS: Mutex<Option<Listeners>> = Mutex::new(None);
static RR: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key {
    ns: String,
    name: String,
    port_name: String,
    port: u16,
}

fn backends(ctx: &SharedCtx, key: &Key) -> Vec<String> {
    if key.ns == "default" && key.name == "kubernetes" {
        return vec![ctx.api_upstream.clone()];
    }
    let port_name = key.port_name.clone();
    let mut out = Vec::new();
    for sl in ctx.slices.state() {
        let owner = sl
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"));
        if sl.metadata.namespace.as_deref() != Some(&key.ns)
            || owner != Some(&key.name)
            || sl.address_type != "IPv4"
        {
            continue;
        }
        let Some(port) = sl
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.clone().unwrap_or_default() == port_name)
            .and_then(|p| p.port)
        else {
            continue;
        };
        for ep in sl.endpoints.iter().flatten() {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if ready {
                for a in &ep.addresses {
                    out.push(format!("{a}:{port}"));
                }
            }
        }
    }
    out.sort();
    out
}

async fn serve(ctx: SharedCtx, l: TcpListener, key: Key) {
    loop {
        let Ok((mut inbound, peer)) = l.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let ctx = ctx.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let b = backends(&ctx, &key);
            if b.is_empty() {
                return; // no ready endpoint: the connection is closed (refused)
            }
            let start = RR.fetch_add(1, Ordering::Relaxed);
            // one backend, as kube-proxy picks one: when policies refuse this client there,
            // the connection fails (another backend is tried only when this one cannot be
            // reached at all)
            if !policy_allows(&ctx, &key, peer, &b[start % b.len()]) {
                tracing::debug!(
                    "service {}/{}: {peer} -> {} refused by network policy",
                    key.ns,
                    key.name,
                    b[start % b.len()]
                );
                let _ = inbound.set_zero_linger();
                return;
            }
            for i in 0..b.len() {
                let target = &b[(start + i) % b.len()];
                if i > 0 && !policy_allows(&ctx, &key, peer, target) {
                    continue;
                }
                if let Ok(Ok(mut out)) =
                    tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(target)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    return;
                }
            }
        });
    }
}

/// Whether policies let `peer` reach the backend `target` (`ip:port`; the API server as the
/// gateway's port 443).
fn policy_allows(ctx: &SharedCtx, key: &Key, peer: std::net::SocketAddr, target: &str) -> bool {
    let std::net::SocketAddr::V4(peer) = peer else {
        return true;
    };
    let (ip, port) = if key.ns == "default" && key.name == "kubernetes" {
        (crate::net::gateway().parse().ok(), Some(443))
    } else {
        match target.rsplit_once(':') {
            Some((ip, port)) => (ip.parse().ok(), port.parse().ok()),
            None => (None, None),
        }
    };
    let (Some(ip), Some(port)) = (ip, port) else {
        return true;
    };
    if !ctx.enforce_policies || ctx.policies.state().is_empty() {
        return true;
    }
    let world = crate::policy::World::new(
        &ctx.pods.state(),
        &ctx.namespaces.state(),
        &ctx.policies.state(),
    );
    crate::policy::connection_allowed(&world, &ctx.fabric, *peer.ip(), ip, "TCP", port)
}

fn desired(ctx: &SharedCtx) -> HashMap<(String, u16), Key> {
    let mut m = HashMap::new();
    for s in ctx.services.state() {
        let svc: &Service = &s;
        let Some(spec) = &svc.spec else { continue };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        if ip.is_empty() || ip == "None" || ip.contains(':') {
            continue;
        }
        for p in spec.ports.iter().flatten() {
            if p.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                continue;
            }
            m.insert(
                (ip.clone(), p.port as u16),
                Key {
                    ns: svc.metadata.namespace.clone().unwrap_or_default(),
                    name: svc.metadata.name.clone().unwrap_or_default(),
                    port_name: p.name.clone().unwrap_or_default(),
                    port: p.port as u16,
                },
            );
        }
    }
    // the API server on the bridge address, for pods
    m.insert(
        (crate::net::gateway().to_string(), 443),
        Key {
            ns: "default".into(),
            name: "kubernetes".into(),
            port_name: "https".into(),
            port: 443,
        },
    );
    m
}

/// Runs the proxy on threads of its own: the API server is reached through it by every pod
/// (the operator's requests and its leader Lease among them), and on the agent's runtime its
/// connections waited behind the work of a thousand pods (a Lease not renewed within its 10 s
/// deadline stops the operator, as it should when the API server is out of reach).
pub fn start(ctx: SharedCtx) {
    let spawned = std::thread::Builder::new()
        .name("service-proxy".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("service-proxy")
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(run(ctx)),
                Err(e) => tracing::error!("service proxy runtime: {e}"),
            }
        });
    if let Err(e) = spawned {
        tracing::error!("service proxy thread: {e}");
    }
}

async fn run(ctx: SharedCtx) {
    let mut keys: HashMap<(String, u16), Key> = HashMap::new();
    loop {
        let want = desired(&ctx);
        // remove listeners no longer wanted (or whose service changed)
        let gone: Vec<(String, u16)> = keys
            .iter()
            .filter(|(k, v)| want.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            keys.remove(&k);
            if let Some(h) = LISTENERS
                .lock()
                .unwrap()
                .get_or_insert_with(HashMap::new)
                .remove(&k)
            {
                h.abort();
            }
            if !want.keys().any(|w| w.0 == k.0) && k.0 != crate::net::gateway() {
                crate::net::del_cluster_ip(&k.0).await;
            }
        }
        for (k, v) in &want {
            if keys.contains_key(k) {
                continue;
            }
            if k.0 != crate::net::gateway()
                && let Err(e) = crate::net::add_cluster_ip(&k.0).await
            {
                tracing::warn!("ClusterIP {}: {e}", k.0);
                continue;
            }
            match TcpListener::bind((k.0.as_str(), k.1)).await {
                Ok(l) => {
                    tracing::info!("service {}/{} on {}:{}", v.ns, v.name, k.0, k.1);
                    let h = tokio::spawn(serve(ctx.clone(), l, v.clone()));
                    LISTENERS
                        .lock()
                        .unwrap()
                        .get_or_insert_with(HashMap::new)
                        .insert(k.clone(), h);
                    keys.insert(k.clone(), v.clone());
                }
                Err(e) => tracing::warn!("listen {}:{}: {e}", k.0, k.1),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn shutdown() {
    let hs: Vec<JoinHandle<()>> = LISTENERS
        .lock()
        .unwrap()
        .take()
        .map(|m| m.into_values().collect())
        .unwrap_or_default();
    for h in hs {
        h.abort();
    }
}
