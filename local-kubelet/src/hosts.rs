//! The per-pod hosts file: the pod's own names, pods with hostname+subdomain, Services.

use crate::SharedCtx;
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const DOMAIN: &str = "svc.cluster.local";

pub fn pod_hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let h = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    h.chars().take(63).collect()
}

/// The pod's fully qualified name (first name on its own line, so `hostname -f` gives it).
pub fn pod_fqdn(pod: &Pod) -> String {
    let h = pod_hostname(pod);
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    match pod
        .spec
        .as_ref()
        .and_then(|s| s.subdomain.clone())
        .filter(|s| !s.is_empty())
    {
        Some(sd) => format!("{h}.{sd}.{ns}.{DOMAIN}"),
        None => h,
    }
}

fn names_for(host: &str, sub: &str, ns: &str, same_ns: bool) -> Vec<String> {
    let mut v = vec![
        format!("{host}.{sub}.{ns}.{DOMAIN}"),
        format!("{host}.{sub}.{ns}.svc"),
        format!("{host}.{sub}.{ns}"),
    ];
    if same_ns {
        v.push(format!("{host}.{sub}"));
    }
    v
}

/// One name's line of the hosts files: the address, the names every pod gets, the short name
/// the pods of the same namespace get too, and the pod it belongs to (left out of its own file).
struct Line {
    ip: String,
    names: String,
    short: String,
    uid: Option<String>,
}

/// The lines of every pod with hostname + subdomain and every Service, by namespace and name,
/// with each namespace's part already written as the pods of other namespaces see it. Built
/// once for what [`world_fingerprint`] saw, shared by every pod's file (building it per pod
/// was the agent's main load at a thousand clusters).
struct Table {
    print: u64,
    by_ns: BTreeMap<String, (BTreeMap<String, Line>, String)>,
}

fn build_table(ctx: &SharedCtx, print: u64) -> Table {
    let mut by_ns: BTreeMap<String, BTreeMap<String, Line>> = BTreeMap::new();
    // pods with hostname + subdomain
    for p in ctx.pods.state() {
        let Some(spec) = &p.spec else { continue };
        let Some(sub) = spec.subdomain.clone().filter(|s| !s.is_empty()) else {
            continue;
        };
        let Some(pip) = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|s| !s.is_empty())
        else {
            continue;
        };
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let h = pod_hostname(&p);
        let names = names_for(&h, &sub, &ns, false);
        by_ns.entry(ns).or_default().insert(
            names[0].clone(),
            Line {
                ip: pip,
                names: names.join(" "),
                short: format!("{h}.{sub}"),
                uid: p.metadata.uid.clone(),
            },
        );
    }
    // the ready addresses of each headless service, from one walk over the EndpointSlices (a
    // walk per service made a render quadratic)
    let mut ready: HashMap<(String, String), Vec<String>> = HashMap::new();
    for sl in ctx.slices.state() {
        let Some(owner) = sl
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
        else {
            continue;
        };
        if sl.address_type != "IPv4" {
            continue;
        }
        let ips = ready
            .entry((
                sl.metadata.namespace.clone().unwrap_or_default(),
                owner.clone(),
            ))
            .or_default();
        for ep in sl.endpoints.iter().flatten() {
            if ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
                ips.extend(ep.addresses.iter().cloned());
            }
        }
    }
    // services: ClusterIP, or the ready endpoints of a headless service
    for svc in ctx.services.state() {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let names = [
            format!("{name}.{ns}.{DOMAIN}"),
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}"),
        ];
        let cip = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone())
            .unwrap_or_default();
        let mut ips = Vec::new();
        if cip == "None" {
            if let Some(a) = ready.remove(&(ns.clone(), name.clone())) {
                ips = a;
            }
            ips.sort();
            ips.dedup();
        } else if !cip.is_empty() {
            ips.push(cip);
        }
        let lines = by_ns.entry(ns.clone()).or_default();
        for (i, a) in ips.into_iter().enumerate() {
            lines.insert(
                format!("~svc {} {i}", names[0]),
                Line {
                    ip: a,
                    names: names.join(" "),
                    short: name.clone(),
                    uid: None,
                },
            );
        }
    }
    let by_ns = by_ns
        .into_iter()
        .map(|(ns, lines)| {
            let mut text = String::new();
            for l in lines.values() {
                text.push_str(&format!("{}\t{}\n", l.ip, l.names));
            }
            (ns, (lines, text))
        })
        .collect();
    Table { print, by_ns }
}

/// The table for what the stores hold now (built again only when that changed).
fn table(ctx: &SharedCtx) -> std::sync::Arc<Table> {
    static TABLE: Mutex<Option<std::sync::Arc<Table>>> = Mutex::new(None);
    let print = world_fingerprint(ctx);
    let mut t = TABLE.lock().unwrap();
    match &*t {
        Some(table) if table.print == print => table.clone(),
        _ => {
            let table = std::sync::Arc::new(build_table(ctx, print));
            *t = Some(table.clone());
            table
        }
    }
}

pub fn render(ctx: &SharedCtx, pod: &Pod, ip: &str) -> String {
    let my_ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut out = String::from(
        "# Kubernetes-managed hosts file (local-kubelet).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    let me = pod_hostname(pod);
    let fqdn = pod_fqdn(pod);
    if fqdn != me {
        let sub = pod
            .spec
            .as_ref()
            .and_then(|s| s.subdomain.clone())
            .unwrap_or_default();
        let mut names = names_for(&me, &sub, &my_ns, true);
        names.push(me.clone());
        out.push_str(&format!("{ip}\t{}\n", names.join(" ")));
    } else {
        out.push_str(&format!("{ip}\t{me}\n"));
    }
    for ha in pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.clone())
        .unwrap_or_default()
    {
        let names = ha.hostnames.unwrap_or_default();
        if !names.is_empty() {
            out.push_str(&format!("{}\t{}\n", ha.ip, names.join(" ")));
        }
    }
    let table = table(ctx);
    out.reserve(table.by_ns.values().map(|(_, t)| t.len()).sum());
    for (ns, (lines, text)) in &table.by_ns {
        if *ns != my_ns {
            out.push_str(text);
            continue;
        }
        // the pod's own namespace: short names too, and not the pod itself
        for l in lines.values() {
            if l.uid.is_some() && l.uid == pod.metadata.uid {
                continue;
            }
            out.push_str(&format!("{}\t{} {}\n", l.ip, l.names, l.short));
        }
    }
    out
}

/// A fingerprint of everything the hosts files are made of (pods with a subdomain and their
/// addresses, Services and their addresses, EndpointSlices), at most half a second old: a pod's
/// file is rendered again only when it or this changed (rendering and comparing every pod's
/// file each second, with every Service of a thousand clusters in it, was the agent's main
/// load).
pub fn world_fingerprint(ctx: &SharedCtx) -> u64 {
    static LAST: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap();
    if let Some((at, f)) = *last
        && at.elapsed() < Duration::from_millis(500)
    {
        return f;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in ctx.pods.state() {
        let sub = p.spec.as_ref().and_then(|s| s.subdomain.as_deref());
        if sub.is_none_or(str::is_empty) {
            continue;
        }
        (
            &p.metadata.uid,
            &p.metadata.namespace,
            sub,
            p.spec.as_ref().and_then(|s| s.hostname.as_deref()),
            p.metadata.name.as_deref(),
            p.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        )
            .hash(&mut h);
    }
    for svc in ctx.services.state() {
        (
            &svc.metadata.namespace,
            &svc.metadata.name,
            svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
        )
            .hash(&mut h);
    }
    for sl in ctx.slices.state() {
        (
            &sl.metadata.namespace,
            &sl.metadata.name,
            &sl.metadata.resource_version,
        )
            .hash(&mut h);
    }
    let f = h.finish();
    *last = Some((Instant::now(), f));
    f
}

/// A fingerprint of what a pod's own lines depend on (its names, address and host aliases).
pub fn own_fingerprint(pod: &Pod, ip: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let spec = pod.spec.as_ref();
    (
        &pod.metadata.uid,
        &pod.metadata.namespace,
        &pod.metadata.name,
        spec.and_then(|s| s.hostname.as_deref()),
        spec.and_then(|s| s.subdomain.as_deref()),
        ip,
    )
        .hash(&mut h);
    for ha in spec
        .and_then(|s| s.host_aliases.as_ref())
        .into_iter()
        .flatten()
    {
        (&ha.ip, &ha.hostnames).hash(&mut h);
    }
    h.finish()
}

/// Rewrites the file in place (same inode: it is bind-mounted into the pod) when it changed.
pub fn write_in_place(path: &std::path::Path, content: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(content) {
        return Ok(false);
    }
    // Overwritten from the start and cut to length afterwards, never truncated first: a
    // container reads this file while it is rewritten, and an empty file made a name lookup
    // fail now and then. Keeper (the stand-in's ZooKeeper) keeps the address it got at start,
    // so one failed lookup of its own name left a member leading and failing over and over.
    use std::io::{Seek, Write};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    f.seek(std::io::SeekFrom::Start(0))?;
    f.write_all(content.as_bytes())?;
    f.set_len(content.len() as u64)?;
    Ok(true)
}
