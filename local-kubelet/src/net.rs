//! Node networking: a bridge (`chbr0`, 198.18.0.1/19 by default), one network namespace per pod
//! with a veth pair, pod addresses from the pod CIDR's second /24 upwards, ClusterIPs on the bridge.
//! No forwarding, no NAT: pods reach each other across the bridge and the machine at 198.18.0.1.
//!
//! The nodes of one cluster share its bridge and pod CIDR: each node hands out addresses from a
//! sub-range of its own (`--node-cidr`, the Node's `spec.podCIDR`) and has an address of its own
//! on the bridge (`--node-ip`, its InternalIP, in the CIDR's first /24). One process owns the
//! bridge and the ClusterIPs: the agent itself with one node, a `local-kubelet network` process
//! with several (the agents then only join the bridge and remove their own pods' links).

use crate::util::{run, run_quiet};
use anyhow::{Context, Result, bail};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::OnceLock;

/// The node network: bridge name and pod CIDR (the gateway, on the bridge, is its first address).
/// Default `chbr0` with 198.18.0.0/19; further clusters on the same machine use other bridges and
/// other /19s of 198.18.0.0/16 (see hack/local-cluster.sh), so their names never collide.
#[derive(Debug, Clone)]
pub struct NetCfg {
    pub bridge: String,
    pub network: u32,
    pub prefix: u8,
    pub gateway: String,
    /// this node's pod addresses: network and prefix (the whole pod CIDR by default)
    pub node_network: u32,
    pub node_prefix: u8,
    /// this node's address (InternalIP, kubelet API): the gateway by default
    pub node_ip: String,
    /// whether this process creates and removes the bridge
    pub own_bridge: bool,
}

/// What [`configure`] takes.
pub struct Options {
    pub bridge: String,
    pub pod_cidr: String,
    pub node_cidr: Option<String>,
    pub node_ip: Option<String>,
    pub own_bridge: bool,
}

fn parse_cidr(cidr: &str, what: &str) -> Result<(u32, u8)> {
    let (ip, len) = cidr
        .split_once('/')
        .with_context(|| format!("{what} must be a.b.c.d/len"))?;
    let ip: Ipv4Addr = ip.parse().with_context(|| format!("{what}: address"))?;
    let prefix: u8 = len.parse().with_context(|| format!("{what}: prefix"))?;
    if !(8..=24).contains(&prefix) {
        bail!("{what} prefix must be between 8 and 24");
    }
    Ok((u32::from(ip) & (u32::MAX << (32 - prefix)), prefix))
}

static CFG: OnceLock<NetCfg> = OnceLock::new();

pub fn configure(o: &Options) -> Result<()> {
    let (network, prefix) = parse_cidr(&o.pod_cidr, "pod CIDR")?;
    if o.bridge.len() > 15 {
        bail!("bridge name too long");
    }
    let (node_network, node_prefix) = match &o.node_cidr {
        Some(c) => parse_cidr(c, "node CIDR")?,
        None => (network, prefix),
    };
    if node_prefix < prefix || node_network & (u32::MAX << (32 - prefix)) != network {
        bail!(
            "node CIDR {:?} is not inside the pod CIDR {}",
            o.node_cidr,
            o.pod_cidr
        );
    }
    let gateway = Ipv4Addr::from(network + 1).to_string();
    let node_ip = match &o.node_ip {
        Some(ip) => {
            let a: Ipv4Addr = ip.parse().context("node IP")?;
            if u32::from(a) & (u32::MAX << 8) != network {
                bail!("node IP {ip} must be in the pod CIDR's first /24");
            }
            ip.clone()
        }
        None => gateway.clone(),
    };
    let cfg = NetCfg {
        bridge: o.bridge.clone(),
        network,
        prefix,
        gateway,
        node_network,
        node_prefix,
        node_ip,
        own_bridge: o.own_bridge,
    };
    let _ = CFG.set(cfg);
    Ok(())
}

fn cfg() -> &'static NetCfg {
    CFG.get_or_init(|| NetCfg {
        bridge: "chbr0".into(),
        network: u32::from_be_bytes([198, 18, 0, 0]),
        prefix: 19,
        gateway: "198.18.0.1".into(),
        node_network: u32::from_be_bytes([198, 18, 0, 0]),
        node_prefix: 19,
        node_ip: "198.18.0.1".into(),
        own_bridge: true,
    })
}

pub fn network() -> u32 {
    cfg().network
}

pub fn prefix() -> u8 {
    cfg().prefix
}

/// The node's own address: its InternalIP, where its kubelet API listens.
pub fn node_ip() -> &'static str {
    &cfg().node_ip
}

pub fn owns_bridge() -> bool {
    cfg().own_bridge
}

pub fn bridge() -> &'static str {
    &cfg().bridge
}

/// The bridge address: pods' default gateway, the Node's InternalIP.
pub fn gateway() -> &'static str {
    &cfg().gateway
}

fn node_broadcast() -> u32 {
    let c = cfg();
    c.node_network | (u32::MAX >> c.node_prefix)
}

/// Whether a pod address (and so its netns/veth names) belongs to this node.
fn ours(third: u8, fourth: u8) -> bool {
    let a = u32::from_be_bytes([198, 18, third, fourth]);
    let c = cfg();
    a > c.node_network && a < node_broadcast() && a >= first_pod_address()
}

/// The node's first pod address: its range's, but never in the pod CIDR's first /24 (the
/// gateway and the nodes' addresses).
fn first_pod_address() -> u32 {
    let c = cfg();
    c.node_network.max(c.network + 256)
}

pub const NETNS_PREFIX: &str = "lk-";
pub const VETH_PREFIX: &str = "lkv";

/// Pod address allocator: from the pod CIDR's second /24 (198.18.1.1 by default) to its last
/// address but one, handing out the next free address after the last one given, so a freed
/// address is reused only after the range wrapped. A pod recreated under the same name gets its
/// previous address back while that is free ([`Ipam::allocate_for`]): ClickHouse 18.16 keeps the
/// address it resolved for a peer in its replication fetches even after `SYSTEM DROP DNS CACHE`
/// (a newer server resolves again by itself), which no operator can repair.
#[derive(Default)]
pub struct Ipam {
    used: BTreeSet<u32>,
    last: u32,
    by_name: std::collections::BTreeMap<String, u32>,
}

impl Ipam {
    /// An address for the pod `key` (namespace/name): its previous one when free.
    pub fn allocate_for(&mut self, key: &str) -> Option<Ipv4Addr> {
        if let Some(&previous) = self.by_name.get(key)
            && !self.used.contains(&previous)
        {
            self.used.insert(previous);
            return Some(Ipv4Addr::from(previous));
        }
        let ip = self.allocate()?;
        self.by_name.insert(key.to_string(), u32::from(ip));
        Some(ip)
    }

    /// Remembers `ip` as the previous address of the pod `key`, if it is one of this node's.
    pub fn remember(&mut self, key: &str, ip: Ipv4Addr) {
        let ip = u32::from(ip);
        if (first_pod_address()..node_broadcast()).contains(&ip) {
            self.by_name.insert(key.to_string(), ip);
        }
    }

    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        let first = first_pod_address();
        let last = node_broadcast() - 1;
        let mut c = if self.last < first || self.last > last {
            first
        } else {
            self.last + 1
        };
        for _ in 0..=(last - first) {
            if c > last {
                c = first;
            }
            let o = c.to_be_bytes();
            if o[3] != 0 && o[3] != 255 && !self.used.contains(&c) {
                self.used.insert(c);
                self.last = c;
                return Some(Ipv4Addr::from(c));
            }
            c += 1;
        }
        None
    }
    pub fn release(&mut self, ip: Ipv4Addr) {
        self.used.remove(&u32::from(ip));
    }
}

/// netns and host-side veth names derived from the pod address (unique while it is allocated)
pub fn names(ip: Ipv4Addr) -> (String, String) {
    let o = ip.octets();
    (
        format!("{NETNS_PREFIX}{}-{}", o[2], o[3]),
        format!("{VETH_PREFIX}{}-{}", o[2], o[3]),
    )
}

/// The MAC address of a pod's eth0: locally administered, unicast, the pod's IPv4 address in its
/// last four bytes.
pub fn mac_of(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("02:42:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

fn netns_dir_mounted() -> bool {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/run/netns"))
}

/// `ip netns add` mounts /run/netns onto itself the first time; remember (machine-wide, for
/// whichever agent stops last) that one of us caused it.
const NETNS_MARKER: &str = "/run/local-kubelet.netns-dir-created";

pub fn note_netns_dir() {
    if !netns_dir_mounted() {
        let _ = std::fs::write(NETNS_MARKER, b"");
    }
}

/// An agent of a cluster of several nodes: waits (up to 30 s) for the bridge of the network
/// process, then puts its own address on it.
pub async fn join_bridge() -> Result<()> {
    let br = bridge();
    let mut waited = 0;
    while !run_quiet("ip", &["link", "show", br]).await {
        if waited >= 300 {
            bail!("bridge {br} does not exist: start `local-kubelet network` first");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        waited += 1;
    }
    if node_ip() != gateway() {
        let addr = format!("{}/32", node_ip());
        let addrs = run("ip", &["-4", "-o", "addr", "show", "dev", br]).await?;
        if !addrs.contains(&format!(" {addr} ")) {
            run("ip", &["addr", "add", &addr, "dev", br]).await?;
        }
    }
    Ok(())
}

/// The network process's stop: the bridge goes (with its addresses).
pub async fn remove_bridge() {
    if run_quiet("ip", &["link", "show", bridge()]).await {
        run_quiet("ip", &["link", "del", bridge()]).await;
    }
}

pub async fn setup_bridge() -> Result<()> {
    let br = bridge();
    if !run_quiet("ip", &["link", "show", br]).await {
        run("ip", &["link", "add", br, "type", "bridge"]).await?;
    }
    let addr = format!("{}/{}", gateway(), cfg().prefix);
    let addrs = run("ip", &["-4", "-o", "addr", "show", "dev", br]).await?;
    if !addrs.contains(&addr) {
        run("ip", &["addr", "add", &addr, "dev", br]).await?;
    }
    // The bridge's MAC address is set, not left to the kernel: a bridge without one takes the
    // lowest MAC of its ports and changes it when that port leaves or a lower one joins. Every
    // pod then held a wrong entry for its gateway and lost its traffic to the machine (the API
    // server, ClusterIPs, probe answers) until the entry went stale and was probed again, 20 to
    // 45 s: after a cluster's pods were deleted, the operator's pod could not renew its Lease.
    let gw: Ipv4Addr = gateway().parse().context("gateway address")?;
    run("ip", &["link", "set", br, "address", &mac_of(gw)]).await?;
    run("ip", &["link", "set", br, "up"]).await?;
    raise_neighbour_limits();
    Ok(())
}

/// The neighbour (ARP) table's limits, as nodes of large clusters raise them: the table is one
/// for the whole machine, every network namespace's entries count against it, and each pod
/// here adds several (the pod's entry on the machine for probes and proxying, the machine's in
/// the pod, the pod's in the operator's pod). At the default hard limit of 1024 entries a few
/// hundred pods fill it: the kernel logs "neighbor table overflow", new connections to pods
/// fail at random, probes time out and passes wait for servers that are up. Only raised, never
/// lowered.
fn raise_neighbour_limits() {
    for (name, want) in [
        ("gc_thresh1", 16384u64),
        ("gc_thresh2", 32768),
        ("gc_thresh3", 65536),
    ] {
        let path = format!("/proc/sys/net/ipv4/neigh/default/{name}");
        let now: u64 = std::fs::read_to_string(&path)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if now < want
            && let Err(e) = std::fs::write(&path, want.to_string())
        {
            tracing::warn!("{path}: {e} (a few hundred pods may overflow the neighbour table)");
        }
    }
}

pub async fn setup_pod(ip: Ipv4Addr) -> Result<String> {
    let (ns, veth) = names(ip);
    // a leftover of the same name (earlier crash) goes first
    teardown_pod(ip).await;
    run("ip", &["netns", "add", &ns]).await?;
    // eth0's MAC address follows from the pod's address (as Docker does): a recreated pod usually
    // gets its previous address, and the host and the other pods keep using the entry they hold
    // for it; with a new MAC address they would send to the old one until their entry went stale
    // and was probed again (about 8 s of lost packets on the first connection).
    let mac = mac_of(ip);
    run(
        "ip",
        &[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "address", &mac, "netns",
            &ns,
        ],
    )
    .await?;
    run("ip", &["link", "set", &veth, "master", bridge(), "up"]).await?;
    let addr = format!("{ip}/{}", cfg().prefix);
    run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"]).await?;
    run("ip", &["-n", &ns, "link", "set", "eth0", "up"]).await?;
    run("ip", &["-n", &ns, "link", "set", "lo", "up"]).await?;
    run(
        "ip",
        &["-n", &ns, "route", "add", "default", "via", gateway()],
    )
    .await?;
    Ok(ns)
}

/// Kills what still runs in the pod's network namespace, removes it and the veth.
pub async fn teardown_pod(ip: Ipv4Addr) {
    let (ns, veth) = names(ip);
    kill_netns_processes(&ns).await;
    run_quiet("ip", &["link", "del", &veth]).await;
    run_quiet("ip", &["netns", "del", &ns]).await;
}

pub async fn kill_netns_processes(ns: &str) {
    for _ in 0..50 {
        let pids = run("ip", &["netns", "pids", ns]).await.unwrap_or_default();
        let pids: Vec<i32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for p in pids {
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

pub async fn add_cluster_ip(ip: &str) -> Result<()> {
    let addrs = run("ip", &["-4", "-o", "addr", "show", "dev", bridge()]).await?;
    if !addrs.contains(&format!(" {ip}/32")) {
        run("ip", &["addr", "add", &format!("{ip}/32"), "dev", bridge()]).await?;
    }
    Ok(())
}

pub async fn del_cluster_ip(ip: &str) {
    run_quiet("ip", &["addr", "del", &format!("{ip}/32"), "dev", bridge()]).await;
}

/// `lk-<c>-<d>` / `lkv<c>-<d>` → (c, d)
fn octets(name: &str, prefix: &str) -> Option<(u8, u8)> {
    let (c, d) = name.strip_prefix(prefix)?.split_once('-')?;
    Some((c.parse().ok()?, d.parse().ok()?))
}

/// Removes everything an agent creates: processes in pod namespaces, namespaces, veths (of this
/// node's addresses), the bridge with its ClusterIPs (when this process owns it; else the node's
/// own address on it), the mount points it created on the machine, pod folders. Persistent
/// volume folders stay.
pub async fn cleanup_leftovers(data_dir: &Path) {
    let list = run("ip", &["netns", "list"]).await.unwrap_or_default();
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if octets(name, NETNS_PREFIX).is_some_and(|(c, d)| ours(c, d)) {
            kill_netns_processes(name).await;
            run_quiet("ip", &["netns", "del", name]).await;
        }
    }
    let links = run("ip", &["-o", "link", "show"]).await.unwrap_or_default();
    for line in links.lines() {
        if let Some(name) = line.split(':').nth(1) {
            let name = name.trim().split('@').next().unwrap_or_default();
            if octets(name, VETH_PREFIX).is_some_and(|(c, d)| ours(c, d)) {
                run_quiet("ip", &["link", "del", name]).await;
            }
        }
    }
    if owns_bridge() {
        remove_bridge().await;
    } else if node_ip() != gateway() {
        run_quiet(
            "ip",
            &["addr", "del", &format!("{}/32", node_ip()), "dev", bridge()],
        )
        .await;
    }
    // mount points created on the machine's filesystem, deepest first, only when still empty
    let rec = data_dir.join("created-paths");
    if let Ok(s) = std::fs::read_to_string(&rec) {
        let mut paths: Vec<&str> = s.lines().filter(|l| !l.is_empty()).collect();
        paths.sort();
        paths.dedup();
        paths.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
        for p in paths {
            let p = Path::new(p);
            match std::fs::symlink_metadata(p) {
                Ok(md) if md.is_dir() => {
                    let _ = std::fs::remove_dir(p);
                }
                Ok(md) if md.is_file() && md.len() == 0 => {
                    let _ = std::fs::remove_file(p);
                }
                _ => {}
            }
        }
        let _ = std::fs::remove_file(&rec);
    }
    let _ = std::fs::remove_dir_all(data_dir.join("pods"));
    let marker = Path::new(NETNS_MARKER);
    if marker.exists() {
        let empty = std::fs::read_dir("/run/netns")
            .map(|mut d| d.next().is_none())
            .unwrap_or(true);
        if empty {
            if netns_dir_mounted() {
                run_quiet("umount", &["/run/netns"]).await;
            }
            let _ = std::fs::remove_dir("/run/netns");
            let _ = std::fs::remove_file(marker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn ipam_reuses_after_wrap() {
        let mut m = Ipam::default();
        let a = m.allocate().unwrap();
        assert_eq!(a, Ipv4Addr::new(198, 18, 1, 1));
        let b = m.allocate().unwrap();
        assert_eq!(b, Ipv4Addr::new(198, 18, 1, 2));
        m.release(a);
        assert_eq!(m.allocate().unwrap(), Ipv4Addr::new(198, 18, 1, 3));
        assert_eq!(names(b).0, "lk-1-2");
    }

    #[test]
    fn a_pods_mac_address_follows_from_its_address() {
        assert_eq!(mac_of(Ipv4Addr::new(198, 18, 1, 2)), "02:42:c6:12:01:02");
        assert_ne!(
            mac_of(Ipv4Addr::new(198, 18, 1, 2)),
            mac_of(Ipv4Addr::new(198, 18, 2, 1))
        );
    }

    #[test]
    fn a_recreated_pod_gets_its_previous_address_while_free() {
        let mut m = Ipam::default();
        let a = m.allocate_for("ns/p").unwrap();
        let b = m.allocate_for("ns/q").unwrap();
        m.release(a);
        assert_eq!(m.allocate_for("ns/p"), Some(a));
        // Taken by someone else meanwhile: a new one.
        m.release(a);
        let c = m.allocate().unwrap();
        m.release(c);
        assert_ne!(m.allocate_for("ns/q"), Some(b), "b is still in use");
    }
}
