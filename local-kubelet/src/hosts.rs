//! The per-pod hosts file: the pod's own names, pods with hostname+subdomain, Services.

use crate::SharedCtx;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

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
    // other pods with hostname + subdomain
    let mut lines: BTreeMap<String, String> = BTreeMap::new();
    for p in ctx.pods.state() {
        if p.metadata.uid == pod.metadata.uid {
            continue;
        }
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
        let names = names_for(&h, &sub, &ns, ns == my_ns);
        lines.insert(names[0].clone(), format!("{pip}\t{}\n", names.join(" ")));
    }
    // services: ClusterIP, or the ready endpoints of a headless service
    for svc in ctx.services.state() {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let mut names = vec![
            format!("{name}.{ns}.{DOMAIN}"),
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}"),
        ];
        if ns == my_ns {
            names.push(name.clone());
        }
        let cip = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone())
            .unwrap_or_default();
        let mut ips = Vec::new();
        if cip == "None" {
            for sl in ctx.slices.state() {
                let owner = sl
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"));
                if sl.metadata.namespace.as_deref() != Some(ns.as_str())
                    || owner != Some(&name)
                    || sl.address_type != "IPv4"
                {
                    continue;
                }
                for ep in sl.endpoints.iter().flatten() {
                    let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                    if ready {
                        ips.extend(ep.addresses.iter().cloned());
                    }
                }
            }
            ips.sort();
            ips.dedup();
        } else if !cip.is_empty() {
            ips.push(cip);
        }
        for (i, a) in ips.iter().enumerate() {
            lines.insert(
                format!("~svc {} {i}", names[0]),
                format!("{a}\t{}\n", names.join(" ")),
            );
        }
    }
    for l in lines.values() {
        out.push_str(l);
    }
    out
}

/// Rewrites the file in place (same inode: it is bind-mounted into the pod) when it changed.
pub fn write_in_place(path: &std::path::Path, content: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(content) {
        return Ok(false);
    }
    std::fs::write(path, content)?;
    Ok(true)
}
