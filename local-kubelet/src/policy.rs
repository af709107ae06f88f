//! NetworkPolicies (networking.k8s.io/v1) for the pods of this node.
//!
//! The decision is pure ([`rules`], [`Rules::allows`], [`connection_allowed`]): which peer may
//! reach which pod on which port, from the pods, namespaces and policies as the API server has
//! them. It is written twice from the same rules: as an nftables table in each pod's network
//! namespace ([`render`], applied by [`run`]), and by the ClusterIP proxy (services.rs), which
//! sees the real client and backend of every proxied connection and asks [`connection_allowed`]
//! for both ends, as a CNI does after kube-proxy's DNAT.
//!
//! Choices where Kubernetes leaves them to the network plugin, as most CNIs make them:
//! - traffic from the node to its pods is always allowed (the API spec: "or if the traffic
//!   source is the pod's local node"); here every node of a cluster is this machine, so the
//!   addresses of the node network's first /24 (gateway and Node InternalIPs) always reach
//!   every pod: probes, the proxy's connections (checked by the proxy itself) and whatever runs
//!   on the machine (the tests, an operator run outside the cluster);
//! - `ipBlock` applies to every address, pod addresses included;
//! - a named port resolves against the pod's own container ports (ingress) or the destination
//!   pod's (egress); it never matches an address that is not a known pod;
//! - only policy-covered traffic is filtered: answers of allowed connections pass (conntrack),
//!   loopback inside the pod always passes, and so does a pod's traffic to a ClusterIP (the
//!   proxy decides for the real backend);
//! - a policy change applies to connections already open, not only to new ones: every packet
//!   a connection's opener sends is checked against the rules of the moment (only answers pass
//!   on conntrack), so a connection the rules stop allowing stalls, as a network partition
//!   does. Kubernetes leaves this to the plugin; OVN applies its ACL changes to open
//!   connections in the same way, other plugins let them run on. Connections through a
//!   ClusterIP are decided by the proxy when they open and run on.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

pub type Labels = BTreeMap<String, String>;

/// An IPv4 network `addr/len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: u32,
    pub len: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (ip, len) = match s.split_once('/') {
            Some((ip, len)) => (ip, len.parse().ok()?),
            None => (s, 32),
        };
        let ip: Ipv4Addr = ip.parse().ok()?;
        if len > 32 {
            return None;
        }
        Some(Cidr {
            addr: u32::from(ip) & mask(len),
            len,
        })
    }
    pub fn host(ip: Ipv4Addr) -> Cidr {
        Cidr {
            addr: u32::from(ip),
            len: 32,
        }
    }
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.len) == self.addr
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.addr), self.len)
    }
}

/// Who is allowed: anybody, or a network minus exceptions (a pod is its /32).
#[derive(Clone, Debug, PartialEq)]
pub enum Peer {
    Any,
    Net { net: Cidr, except: Vec<Cidr> },
}

impl Peer {
    fn matches(&self, ip: Ipv4Addr) -> bool {
        match self {
            Peer::Any => true,
            Peer::Net { net, except } => net.contains(ip) && !except.iter().any(|e| e.contains(ip)),
        }
    }
}

/// A protocol and an inclusive port range.
#[derive(Clone, Debug, PartialEq)]
pub struct PortRange {
    pub proto: String,
    pub from: u16,
    pub to: u16,
}

/// One allowing rule: any of `peers`, on any of `ports` (`None`: every port and protocol).
#[derive(Clone, Debug, PartialEq)]
pub struct Allow {
    pub peers: Vec<Peer>,
    pub ports: Option<Vec<PortRange>>,
}

/// What a pod accepts (or may send) in one direction.
#[derive(Clone, Debug, PartialEq)]
pub enum Rules {
    /// no policy of this direction selects the pod: everything
    Open,
    /// isolated: only what one of these allows
    Only(Vec<Allow>),
}

impl Rules {
    /// Whether traffic with the peer `ip` on `proto`/`port` is allowed.
    pub fn allows(&self, ip: Ipv4Addr, proto: &str, port: u16) -> bool {
        match self {
            Rules::Open => true,
            Rules::Only(allows) => allows.iter().any(|a| {
                a.peers.iter().any(|p| p.matches(ip))
                    && a.ports.as_ref().is_none_or(|ps| {
                        ps.iter()
                            .any(|r| r.proto == proto && r.from <= port && port <= r.to)
                    })
            }),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

/// A pod as policies see it.
#[derive(Clone, Debug, Default)]
pub struct PodView {
    pub ns: String,
    pub name: String,
    pub labels: Labels,
    pub ip: Option<Ipv4Addr>,
    /// named container ports: (name, port, protocol)
    pub ports: Vec<(String, u16, String)>,
}

impl PodView {
    pub fn of(p: &Pod) -> PodView {
        let terminal = matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        let ip = if terminal {
            None
        } else {
            p.status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok())
        };
        let mut ports = Vec::new();
        for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
            for cp in c.ports.iter().flatten() {
                if let (Some(n), Ok(port)) = (&cp.name, u16::try_from(cp.container_port)) {
                    let proto = cp.protocol.clone().unwrap_or_else(|| "TCP".into());
                    ports.push((n.clone(), port, proto));
                }
            }
        }
        PodView {
            ns: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            ip,
            ports,
        }
    }
}

/// Everything a decision depends on.
#[derive(Clone, Debug, Default)]
pub struct World {
    pub pods: Vec<PodView>,
    pub namespaces: HashMap<String, Labels>,
    pub policies: Vec<NetworkPolicy>,
}

impl World {
    pub fn new(
        pods: &[std::sync::Arc<Pod>],
        nss: &[std::sync::Arc<Namespace>],
        pols: &[std::sync::Arc<NetworkPolicy>],
    ) -> World {
        World {
            pods: pods.iter().map(|p| PodView::of(p)).collect(),
            namespaces: nss
                .iter()
                .map(|n| {
                    (
                        n.metadata.name.clone().unwrap_or_default(),
                        n.metadata.labels.clone().unwrap_or_default(),
                    )
                })
                .collect(),
            policies: pols.iter().map(|p| (**p).clone()).collect(),
        }
    }

    pub fn pod_by_ip(&self, ip: Ipv4Addr) -> Option<&PodView> {
        self.pods.iter().find(|p| p.ip == Some(ip))
    }
}

/// Whether `sel` selects `labels` (matchLabels and matchExpressions; an empty selector selects
/// everything). An unknown operator selects nothing.
pub fn selects(sel: &LabelSelector, labels: &Labels) -> bool {
    if let Some(ml) = &sel.match_labels
        && ml.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    })
}

/// The policy's types, defaulted as the API server does: Ingress always, Egress when it has
/// egress rules.
fn types(p: &NetworkPolicy) -> Vec<Direction> {
    let Some(spec) = &p.spec else { return vec![] };
    match &spec.policy_types {
        Some(t) if !t.is_empty() => t
            .iter()
            .filter_map(|t| match t.as_str() {
                "Ingress" => Some(Direction::Ingress),
                "Egress" => Some(Direction::Egress),
                _ => None,
            })
            .collect(),
        _ => {
            let mut v = vec![Direction::Ingress];
            if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
                v.push(Direction::Egress);
            }
            v
        }
    }
}

/// The pods a peer's selectors name (podSelector / namespaceSelector; `None` for an ipBlock).
fn peer_pods<'w>(
    world: &'w World,
    policy_ns: &str,
    peer: &NetworkPolicyPeer,
) -> Option<Vec<&'w PodView>> {
    if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
        return None;
    }
    let ns_ok = |ns: &str| match &peer.namespace_selector {
        None => ns == policy_ns,
        Some(sel) => world
            .namespaces
            .get(ns)
            .is_some_and(|labels| selects(sel, labels)),
    };
    Some(
        world
            .pods
            .iter()
            .filter(|p| p.ip.is_some() && ns_ok(&p.ns))
            .filter(|p| {
                peer.pod_selector
                    .as_ref()
                    .is_none_or(|sel| selects(sel, &p.labels))
            })
            .collect(),
    )
}

fn ip_block(peer: &NetworkPolicyPeer) -> Option<Peer> {
    let b = peer.ip_block.as_ref()?;
    // an IPv6 block (or an invalid one) matches no IPv4 address
    let net = Cidr::parse(&b.cidr).filter(|_| !b.cidr.contains(':'))?;
    let except = b
        .except
        .iter()
        .flatten()
        .filter(|e| !e.contains(':'))
        .filter_map(|e| Cidr::parse(e))
        .collect();
    Some(Peer::Net { net, except })
}

/// A policy port against the pod whose ports name it: the ranges it stands for (a named port
/// the pod does not have stands for none).
fn resolve_port(p: &NetworkPolicyPort, pod: Option<&PodView>) -> Vec<PortRange> {
    let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
    match &p.port {
        None => vec![PortRange {
            proto,
            from: 1,
            to: 65535,
        }],
        Some(IntOrString::Int(n)) => {
            let Ok(from) = u16::try_from(*n) else {
                return vec![];
            };
            let to = p
                .end_port
                .and_then(|e| u16::try_from(e).ok())
                .filter(|e| *e >= from)
                .unwrap_or(from);
            vec![PortRange { proto, from, to }]
        }
        Some(IntOrString::String(name)) => pod
            .into_iter()
            .flat_map(|pod| pod.ports.iter())
            .filter(|(n, _, pr)| n == name && *pr == proto)
            .map(|(_, port, _)| PortRange {
                proto: proto.clone(),
                from: *port,
                to: *port,
            })
            .collect(),
    }
}

fn is_named(p: &NetworkPolicyPort) -> bool {
    matches!(p.port, Some(IntOrString::String(_)))
}

/// A rule's peers and ports.
type RulePair = (
    Option<Vec<NetworkPolicyPeer>>,
    Option<Vec<NetworkPolicyPort>>,
);

/// What `pod` accepts (ingress) or may send (egress), from every policy of its namespace that
/// selects it for that direction.
pub fn rules(world: &World, pod: &PodView, dir: Direction) -> Rules {
    let selecting: Vec<&NetworkPolicy> = world
        .policies
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(pod.ns.as_str()))
        .filter(|p| {
            p.spec.as_ref().is_some_and(|s| {
                s.pod_selector
                    .as_ref()
                    .is_none_or(|sel| selects(sel, &pod.labels))
            })
        })
        .filter(|p| types(p).contains(&dir))
        .collect();
    if selecting.is_empty() {
        return Rules::Open;
    }
    let mut out = Vec::new();
    for pol in selecting {
        let spec = pol.spec.as_ref().expect("filtered above");
        let pol_ns = pol.metadata.namespace.clone().unwrap_or_default();
        // (peers, ports) of each rule of this direction
        let rule_list: Vec<RulePair> = match dir {
            Direction::Ingress => spec
                .ingress
                .iter()
                .flatten()
                .map(|r| (r.from.clone(), r.ports.clone()))
                .collect(),
            Direction::Egress => spec
                .egress
                .iter()
                .flatten()
                .map(|r| (r.to.clone(), r.ports.clone()))
                .collect(),
        };
        for (peers, ports) in rule_list {
            let ports = ports.filter(|p| !p.is_empty());
            // peers: every address, or the named blocks and pods
            let mut nets: Vec<Peer> = Vec::new();
            let mut pods: Vec<&PodView> = Vec::new();
            match peers.filter(|p| !p.is_empty()) {
                None => nets.push(Peer::Any),
                Some(peers) => {
                    for peer in &peers {
                        if let Some(b) = ip_block(peer) {
                            nets.push(b);
                        } else if let Some(ps) = peer_pods(world, &pol_ns, peer) {
                            pods.extend(ps);
                        }
                    }
                }
            }
            let as_peer = |p: &PodView| Peer::Net {
                net: Cidr::host(p.ip.expect("pods with an address only")),
                except: vec![],
            };
            let Some(ports) = ports else {
                let mut peers = nets;
                peers.extend(pods.iter().map(|p| as_peer(p)));
                out.push(Allow { peers, ports: None });
                continue;
            };
            match dir {
                Direction::Ingress => {
                    // named ports are this pod's own
                    let ranges: Vec<PortRange> = ports
                        .iter()
                        .flat_map(|p| resolve_port(p, Some(pod)))
                        .collect();
                    let mut peers = nets;
                    peers.extend(pods.iter().map(|p| as_peer(p)));
                    out.push(Allow {
                        peers,
                        ports: Some(ranges),
                    });
                }
                Direction::Egress => {
                    // numbered ports for every peer; named ones per destination pod
                    let numbered: Vec<PortRange> = ports
                        .iter()
                        .filter(|p| !is_named(p))
                        .flat_map(|p| resolve_port(p, None))
                        .collect();
                    let mut peers = nets.clone();
                    peers.extend(pods.iter().map(|p| as_peer(p)));
                    if !numbered.is_empty() {
                        out.push(Allow {
                            peers,
                            ports: Some(numbered),
                        });
                    }
                    let named: Vec<&NetworkPolicyPort> =
                        ports.iter().filter(|p| is_named(p)).collect();
                    if named.is_empty() {
                        continue;
                    }
                    // destination pods: those the selectors name, and known pods inside a block
                    let mut dests: Vec<&PodView> = pods.clone();
                    for p in &world.pods {
                        if let Some(ip) = p.ip
                            && nets.iter().any(|n| n.matches(ip))
                            && !dests.iter().any(|d| d.ip == p.ip)
                        {
                            dests.push(p);
                        }
                    }
                    for d in dests {
                        let ranges: Vec<PortRange> = named
                            .iter()
                            .flat_map(|p| resolve_port(p, Some(d)))
                            .collect();
                        if !ranges.is_empty() {
                            out.push(Allow {
                                peers: vec![as_peer(d)],
                                ports: Some(ranges),
                            });
                        }
                    }
                }
            }
        }
    }
    Rules::Only(out)
}

/// The node network's addresses that are the machine (gateway, Node InternalIPs) and the
/// ClusterIP range: what the rules never filter (see the module's notes).
#[derive(Clone, Copy, Debug)]
pub struct Fabric {
    pub host: Cidr,
    pub services: Cidr,
}

impl Fabric {
    /// Whether `ip` is the machine itself: the node addresses, and the ClusterIPs and loopback
    /// (the source of the machine's own connections to a ClusterIP is that ClusterIP).
    pub fn is_node(&self, ip: Ipv4Addr) -> bool {
        self.host.contains(ip) || self.services.contains(ip) || ip.is_loopback()
    }
}

/// Whether a TCP/UDP connection from `src` to `dst`:`port` may be made, as the pods' rules say:
/// the source pod's egress (when the source is a pod) and the destination pod's ingress (when
/// the destination is a pod and the source is not the node).
pub fn connection_allowed(
    world: &World,
    fabric: &Fabric,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: &str,
    port: u16,
) -> bool {
    if fabric.is_node(src) {
        return true;
    }
    if let Some(sp) = world.pod_by_ip(src)
        && !rules(world, sp, Direction::Egress).allows(dst, proto, port)
    {
        return false;
    }
    match world.pod_by_ip(dst) {
        Some(dp) => rules(world, dp, Direction::Ingress).allows(src, proto, port),
        None => true,
    }
}

pub const TABLE: &str = "lk-policy";

fn render_chain(out: &mut String, dir: Direction, allows: &[Allow], fabric: &Fabric) {
    let (name, hook, iface, addr) = match dir {
        Direction::Ingress => ("ingress", "input", "iif", "saddr"),
        Direction::Egress => ("egress", "output", "oif", "daddr"),
    };
    out.push_str(&format!(
        "  chain {name} {{\n    type filter hook {hook} priority 0; policy drop;\n    {iface} \"lo\" accept\n    ct state related accept\n    ct direction reply accept\n"
    ));
    match dir {
        Direction::Ingress => out.push_str(&format!("    ip saddr {} accept\n", fabric.host)),
        Direction::Egress => out.push_str(&format!("    ip daddr {} accept\n", fabric.services)),
    }
    for a in allows {
        for peer in &a.peers {
            let mut m = String::new();
            if let Peer::Net { net, except } = peer {
                m.push_str(&format!("ip {addr} {net} "));
                if !except.is_empty() {
                    let list: Vec<String> = except.iter().map(|e| e.to_string()).collect();
                    m.push_str(&format!("ip {addr} != {{ {} }} ", list.join(", ")));
                }
            }
            match &a.ports {
                None => out.push_str(&format!("    {m}accept\n")),
                Some(ranges) => {
                    let mut by_proto: BTreeMap<String, Vec<String>> = BTreeMap::new();
                    for r in ranges {
                        let p = r.proto.to_ascii_lowercase();
                        if !matches!(p.as_str(), "tcp" | "udp" | "sctp") {
                            continue;
                        }
                        let v = if r.from == r.to {
                            r.from.to_string()
                        } else {
                            format!("{}-{}", r.from, r.to)
                        };
                        by_proto.entry(p).or_default().push(v);
                    }
                    for (p, list) in by_proto {
                        out.push_str(&format!(
                            "    {m}{p} dport {{ {} }} accept\n",
                            list.join(", ")
                        ));
                    }
                }
            }
        }
    }
    out.push_str("  }\n");
}

/// The nftables script that makes the pod's network namespace hold exactly these rules (one
/// table, replaced atomically); without isolation in either direction, it removes the table.
pub fn render(ingress: &Rules, egress: &Rules, fabric: &Fabric) -> String {
    let mut s = format!("table inet {TABLE}\ndelete table inet {TABLE}\n");
    if *ingress == Rules::Open && *egress == Rules::Open {
        return s;
    }
    s.push_str(&format!("table inet {TABLE} {{\n"));
    if let Rules::Only(a) = ingress {
        render_chain(&mut s, Direction::Ingress, a, fabric);
    }
    if let Rules::Only(a) = egress {
        render_chain(&mut s, Direction::Egress, a, fabric);
    }
    s.push_str("}\n");
    s
}

/// A pod of this node whose network namespace holds its rules.
pub struct PodNet {
    pub ns: String,
    pub name: String,
    pub netns: String,
    /// the script last applied (`None`: not yet)
    pub applied: Option<String>,
    /// the last failure, logged once
    pub error: Option<String>,
}

/// Keeps every local pod's table in step with the pods, namespaces and policies (watched):
/// within about a quarter of a second of a change.
pub async fn run(ctx: crate::SharedCtx) {
    loop {
        sync(&ctx).await;
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

async fn sync(ctx: &crate::SharedCtx) {
    let pods: Vec<(String, String, String, String)> = ctx
        .policy_pods
        .lock()
        .unwrap()
        .iter()
        .map(|(uid, p)| (uid.clone(), p.ns.clone(), p.name.clone(), p.netns.clone()))
        .collect();
    if pods.is_empty() {
        return;
    }
    let world = World::new(
        &ctx.pods.state(),
        &ctx.namespaces.state(),
        &ctx.policies.state(),
    );
    for (uid, ns, name, netns) in pods {
        let me = world
            .pods
            .iter()
            .find(|p| p.ns == ns && p.name == name)
            .cloned()
            .unwrap_or_else(|| PodView {
                ns: ns.clone(),
                name: name.clone(),
                ..PodView::default()
            });
        let ingress = rules(&world, &me, Direction::Ingress);
        let egress = rules(&world, &me, Direction::Egress);
        let script = render(&ingress, &egress, &ctx.fabric);
        let applied = ctx
            .policy_pods
            .lock()
            .unwrap()
            .get(&uid)
            .map(|p| p.applied.clone());
        let fresh_and_open =
            applied == Some(None) && ingress == Rules::Open && egress == Rules::Open;
        if applied
            .as_ref()
            .is_some_and(|a| a.as_deref() == Some(script.as_str()))
        {
            continue;
        }
        // a new network namespace has no table: nothing to run for a pod no policy selects
        let result = if fresh_and_open {
            Ok(())
        } else {
            apply(&netns, &script).await
        };
        let mut pods = ctx.policy_pods.lock().unwrap();
        let Some(p) = pods.get_mut(&uid) else {
            continue;
        };
        match result {
            Ok(()) => {
                p.applied = Some(script);
                p.error = None;
            }
            Err(e) => {
                let m = format!("{e:#}");
                if p.error.as_deref() != Some(m.as_str()) {
                    tracing::warn!("pod {ns}/{name}: network policy: {m}");
                    p.error = Some(m);
                }
            }
        }
    }
}

async fn apply(netns: &str, script: &str) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        anyhow::bail!(
            "nft in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Registers a pod's network namespace and waits (up to 5 s) until its rules are in place, so
/// that no container starts before its pod is isolated.
pub async fn register(ctx: &crate::SharedCtx, uid: &str, ns: &str, name: &str, netns: &str) {
    if !ctx.enforce_policies {
        return;
    }
    ctx.policy_pods.lock().unwrap().insert(
        uid.to_string(),
        PodNet {
            ns: ns.to_string(),
            name: name.to_string(),
            netns: netns.to_string(),
            applied: None,
            error: None,
        },
    );
    for _ in 0..50 {
        let done = ctx
            .policy_pods
            .lock()
            .unwrap()
            .get(uid)
            .is_none_or(|p| p.applied.is_some());
        if done {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tracing::warn!("pod {ns}/{name}: network policy not applied within 5 s");
}

pub fn unregister(ctx: &crate::SharedCtx, uid: &str) {
    ctx.policy_pods.lock().unwrap().remove(uid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(
        ns: &str,
        name: &str,
        ip: &str,
        labels: &[(&str, &str)],
        ports: &[(&str, u16)],
    ) -> PodView {
        PodView {
            ns: ns.into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ip: Some(ip.parse().unwrap()),
            ports: ports
                .iter()
                .map(|(n, p)| (n.to_string(), *p, "TCP".to_string()))
                .collect(),
        }
    }

    fn policy(ns: &str, spec: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": ns}, "spec": spec}))
            .unwrap()
    }

    fn world(policies: Vec<NetworkPolicy>) -> World {
        let mut namespaces = HashMap::new();
        namespaces.insert(
            "a".to_string(),
            Labels::from([("team".to_string(), "x".to_string())]),
        );
        namespaces.insert(
            "b".to_string(),
            Labels::from([("team".to_string(), "y".to_string())]),
        );
        World {
            pods: vec![
                pod(
                    "a",
                    "server",
                    "198.18.1.1",
                    &[("app", "server")],
                    &[("http", 8123)],
                ),
                pod("a", "client", "198.18.1.2", &[("app", "client")], &[]),
                pod("a", "other", "198.18.1.3", &[("app", "other")], &[]),
                pod(
                    "b",
                    "client",
                    "198.18.4.1",
                    &[("app", "client")],
                    &[("http", 9000)],
                ),
            ],
            namespaces,
            policies,
        }
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    const FABRIC: Fabric = Fabric {
        host: Cidr {
            addr: 0xc612_0000,
            len: 24,
        },
        services: Cidr {
            addr: 0xc613_0000,
            len: 19,
        },
    };

    #[test]
    fn an_unselected_pod_allows_everything_and_a_selected_one_only_what_a_rule_allows() {
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"]}),
        )]);
        let server = &w.pods[0];
        let client = &w.pods[1];
        assert_eq!(rules(&w, client, Direction::Ingress), Rules::Open);
        assert_eq!(rules(&w, server, Direction::Egress), Rules::Open);
        assert_eq!(rules(&w, server, Direction::Ingress), Rules::Only(vec![]));
        assert!(!connection_allowed(
            &w,
            &FABRIC,
            ip("198.18.1.2"),
            ip("198.18.1.1"),
            "TCP",
            8123
        ));
        // the node (probes, the machine, its connections to ClusterIPs) is always allowed
        for node in ["198.19.0.7", "127.0.0.1", "198.18.0.3"] {
            assert!(connection_allowed(
                &w,
                &FABRIC,
                ip(node),
                ip("198.18.1.1"),
                "TCP",
                8123
            ));
        }
        assert!(connection_allowed(
            &w,
            &FABRIC,
            ip("198.18.0.1"),
            ip("198.18.1.1"),
            "TCP",
            8123
        ));
        assert!(connection_allowed(
            &w,
            &FABRIC,
            ip("198.18.1.1"),
            ip("198.18.1.2"),
            "TCP",
            1
        ));
    }

    #[test]
    fn a_pod_selector_allows_pods_of_the_policys_namespace_only_on_the_named_port() {
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {"matchLabels": {"app": "server"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                "ports": [{"port": "http"}]}]}),
        )]);
        let allowed = |src: &str, port| {
            connection_allowed(&w, &FABRIC, ip(src), ip("198.18.1.1"), "TCP", port)
        };
        assert!(allowed("198.18.1.2", 8123));
        assert!(!allowed("198.18.1.2", 9000), "another port");
        assert!(!allowed("198.18.1.3", 8123), "another pod");
        assert!(
            !allowed("198.18.4.1", 8123),
            "a client of another namespace"
        );
        assert!(
            !connection_allowed(&w, &FABRIC, ip("198.18.1.2"), ip("198.18.1.1"), "UDP", 8123),
            "another protocol"
        );
    }

    #[test]
    fn a_namespace_selector_with_a_pod_selector_needs_both() {
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}},
                                          "podSelector": {"matchExpressions": [
                                              {"key": "app", "operator": "In", "values": ["client"]}]}}]}]}),
        )]);
        assert!(connection_allowed(
            &w,
            &FABRIC,
            ip("198.18.4.1"),
            ip("198.18.1.1"),
            "TCP",
            1
        ));
        assert!(!connection_allowed(
            &w,
            &FABRIC,
            ip("198.18.1.2"),
            ip("198.18.1.1"),
            "TCP",
            1
        ));
        // a namespace selector alone: every pod there
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}]}]}),
        )]);
        assert!(connection_allowed(
            &w,
            &FABRIC,
            ip("198.18.1.3"),
            ip("198.18.1.1"),
            "TCP",
            1
        ));
        assert!(!connection_allowed(
            &w,
            &FABRIC,
            ip("198.18.4.1"),
            ip("198.18.1.1"),
            "TCP",
            1
        ));
    }

    #[test]
    fn an_ip_block_allows_its_addresses_but_not_its_exceptions() {
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {"matchLabels": {"app": "server"}},
                   "ingress": [{"from": [{"ipBlock": {"cidr": "198.18.0.0/16", "except": ["198.18.1.2/32"]}}],
                                "ports": [{"port": 9000, "endPort": 9010}]}]}),
        )]);
        let to_server = |src: &str, port| {
            connection_allowed(&w, &FABRIC, ip(src), ip("198.18.1.1"), "TCP", port)
        };
        assert!(to_server("198.18.1.3", 9005));
        assert!(!to_server("198.18.1.3", 9011));
        assert!(!to_server("198.18.1.2", 9005), "excepted");
    }

    #[test]
    fn egress_deny_blocks_every_destination_but_what_is_allowed_named_ports_of_the_destination() {
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}),
        )]);
        let from_client = |dst: &str, port| {
            connection_allowed(&w, &FABRIC, ip("198.18.1.2"), ip(dst), "TCP", port)
        };
        assert!(
            from_client("198.18.1.1", 8123),
            "http of the server is 8123"
        );
        assert!(from_client("198.18.4.1", 9000), "http of b/client is 9000");
        assert!(!from_client("198.18.1.1", 9000));
        assert!(
            !from_client("198.18.0.1", 443),
            "the machine is an address like any other"
        );
        assert_eq!(rules(&w, &w.pods[0], Direction::Egress), Rules::Open);
    }

    #[test]
    fn policy_types_default_to_ingress_plus_egress_when_there_are_egress_rules() {
        let p = policy("a", json!({"podSelector": {}, "egress": [{}]}));
        assert_eq!(types(&p), vec![Direction::Ingress, Direction::Egress]);
        let p = policy("a", json!({"podSelector": {}}));
        assert_eq!(types(&p), vec![Direction::Ingress]);
        // an empty rule allows everything; an empty list nothing
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {}, "ingress": [{}]}),
        )]);
        assert!(rules(&w, &w.pods[0], Direction::Ingress).allows(ip("1.2.3.4"), "UDP", 53));
    }

    #[test]
    fn policies_of_other_namespaces_do_not_select() {
        let w = world(vec![policy("b", json!({"podSelector": {}}))]);
        assert_eq!(rules(&w, &w.pods[0], Direction::Ingress), Rules::Open);
        assert_eq!(
            rules(&w, &w.pods[3], Direction::Ingress),
            Rules::Only(vec![])
        );
    }

    #[test]
    fn selectors_follow_the_label_selector_operators() {
        let l = Labels::from([("a".to_string(), "1".to_string())]);
        let sel = |v: serde_json::Value| serde_json::from_value::<LabelSelector>(v).unwrap();
        assert!(selects(&sel(json!({})), &l));
        assert!(selects(
            &sel(json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]})),
            &l
        ));
        assert!(!selects(
            &sel(json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]})),
            &l
        ));
        assert!(selects(
            &sel(json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]})),
            &l
        ));
        assert!(!selects(
            &sel(json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]})),
            &l
        ));
    }

    #[test]
    fn the_nftables_table_holds_the_rules_checks_open_connections_and_vanishes_without_isolation() {
        let w = world(vec![policy(
            "a",
            json!({"podSelector": {"matchLabels": {"app": "server"}},
                   "ingress": [{"from": [{"ipBlock": {"cidr": "198.18.0.0/16", "except": ["198.18.1.2/32"]}},
                                         {"podSelector": {"matchLabels": {"app": "client"}}}],
                                "ports": [{"port": "http"}, {"port": 9000, "endPort": 9010, "protocol": "UDP"}]}]}),
        )]);
        let s = render(
            &rules(&w, &w.pods[0], Direction::Ingress),
            &rules(&w, &w.pods[0], Direction::Egress),
            &FABRIC,
        );
        assert!(s.contains("hook input priority 0; policy drop;"), "{s}");
        assert!(!s.contains("chain egress"), "{s}");
        // only answers pass on conntrack: an open connection's own packets meet the rules again
        assert!(s.contains("ct direction reply accept"), "{s}");
        assert!(!s.contains("established"), "{s}");
        assert!(s.contains("ip saddr 198.18.0.0/24 accept"), "{s}");
        assert!(
            s.contains(
                "ip saddr 198.18.0.0/16 ip saddr != { 198.18.1.2/32 } tcp dport { 8123 } accept"
            ),
            "{s}"
        );
        assert!(s.contains("ip saddr 198.18.0.0/16 ip saddr != { 198.18.1.2/32 } udp dport { 9000-9010 } accept"), "{s}");
        assert!(
            s.contains("ip saddr 198.18.1.2/32 tcp dport { 8123 } accept"),
            "{s}"
        );
        let open = render(&Rules::Open, &Rules::Open, &FABRIC);
        assert_eq!(open, "table inet lk-policy\ndelete table inet lk-policy\n");
    }
}
