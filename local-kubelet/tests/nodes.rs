//! Tests of a local cluster of three nodes (`LOCAL_CLUSTER_NODES=3`): nodes and zones, volumes
//! that keep their pods on their node, drain under a PodDisruptionBudget, a node agent stopped
//! and started again, and NetworkPolicies enforced on real connections, pod to pod and through
//! ClusterIPs. One cluster for all scenarios, `down` at the end, then the clean-machine check.
//!
//! Needs root. Run: `cargo test -p local-kubelet --test nodes` (an argument filters scenarios).

mod common;

use anyhow::{Context, Result, bail};
use common::{Cluster, Scenario, wait};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A light server pod (the agent's hollow ClickHouse: `GET /ping` on 8123 answers `Ok.`),
/// pinned to `node` when given.
fn server_pod(name: &str, labels: &str, node: Option<&str>) -> String {
    let node = node
        .map(|n| format!("  nodeName: {n}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{{labels}}}
  annotations:
    local-kubelet.clickhouse.com/hollow: "true"
spec:
{node}  terminationGracePeriodSeconds: 1
  containers:
  - name: server
    image: clickhouse/clickhouse-server:24.8
    ports:
    - {{name: http, containerPort: 8123}}
"#
    )
}

fn netns_of(ip: &str) -> Result<String> {
    let o: Vec<&str> = ip.split('.').collect();
    if o.len() != 4 {
        bail!("not an address: {ip:?}");
    }
    Ok(format!("lk-{}-{}", o[2], o[3]))
}

/// `GET /ping` from inside the pod with address `from` (its network namespace, so its
/// NetworkPolicy rules apply) to `to`:`port`; true when the server answered `Ok.`.
fn ping_from(from: &str, to: &str, port: u16) -> bool {
    let Ok(ns) = netns_of(from) else { return false };
    let script = format!(
        "exec 3<>/dev/tcp/{to}/{port} && printf 'GET /ping HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
    );
    Command::new("timeout")
        .args(["2", "ip", "netns", "exec", &ns, "bash", "-c", &script])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("Ok."))
        .unwrap_or(false)
}

/// Waits (up to 5 s) until a ping from `from` to `to`:`port` gives `want`; an error naming
/// `what` otherwise.
fn expect(from: &str, to: &str, port: u16, want: bool, what: &str) -> Result<()> {
    if wait(Duration::from_secs(5), || ping_from(from, to, port) == want) {
        Ok(())
    } else {
        bail!(
            "{what}: {from} -> {to}:{port} should be {}",
            if want { "allowed" } else { "refused" }
        )
    }
}

fn ready_status(c: &Cluster, what: &str) -> String {
    c.get(
        "",
        what,
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    )
}

fn nodes_ready_with_zones_and_a_pod_on_each(c: &Cluster) -> Result<()> {
    let nodes = c.kubectl(
        &[
            "get", "nodes", "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.topology\\.kubernetes\\.io/zone} {.spec.podCIDR} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ],
        None,
    )?;
    let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
    let want = [
        ("node-1", "zone-a"),
        ("node-2", "zone-b"),
        ("node-3", "zone-c"),
    ];
    if lines.len() != 3 {
        bail!("want 3 nodes: {nodes}");
    }
    for (l, (name, zone)) in lines.iter().zip(want) {
        if l.len() != 4 || l[0] != name || l[1] != zone || l[3] != "True" {
            bail!("want {name} in {zone} and Ready: {l:?}");
        }
    }
    let ns = "n-spread";
    c.namespace(ns)?;
    let mut ips = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let pod = format!("p{}", i + 1);
        c.apply(ns, &server_pod(&pod, "app: spread", Some(l[0])))?;
        let ip = c.wait_ready(ns, &pod, Duration::from_secs(60))?;
        // the pod's address is from its node's own range
        let cidr = policy_cidr(l[2])?;
        if !cidr.0.contains(&ip_u32(&ip)?) {
            bail!("{pod} on {} has {ip}, outside {}", l[0], l[2]);
        }
        ips.push(ip);
    }
    // each node's kubelet API answers at its own address (`kubectl logs` goes through it)
    for i in 1..=3 {
        c.kubectl(&["-n", ns, "logs", &format!("p{i}")], None)
            .with_context(|| format!("kubectl logs of the pod on node-{i}"))?;
    }
    // pods of different nodes reach each other
    expect(&ips[0], &ips[2], 8123, true, "node-1 to node-3")?;
    expect(&ips[2], &ips[1], 8123, true, "node-3 to node-2")?;
    c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    Ok(())
}

/// (address range, prefix) of `a.b.c.d/len`
fn policy_cidr(s: &str) -> Result<(std::ops::RangeInclusive<u32>, u8)> {
    let (ip, len) = s.split_once('/').context("a CIDR")?;
    let len: u8 = len.parse()?;
    let base = ip_u32(ip)?;
    let size = 1u32 << (32 - len);
    Ok((base..=base + size - 1, len))
}

fn ip_u32(ip: &str) -> Result<u32> {
    Ok(u32::from(ip.parse::<std::net::Ipv4Addr>()?))
}

fn a_volume_keeps_its_pod_on_its_node(c: &Cluster) -> Result<()> {
    let ns = "n-volume";
    c.namespace(ns)?;
    c.apply(
        ns,
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: data
spec:
  serviceName: data
  replicas: 1
  selector: {matchLabels: {app: data}}
  template:
    metadata:
      labels: {app: data}
      annotations: {local-kubelet.clickhouse.com/hollow: "true"}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: server
        image: clickhouse/clickhouse-server:24.8
        volumeMounts: [{name: data, mountPath: /var/lib/clickhouse}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
"#,
    )?;
    c.wait_ready(ns, "data-0", Duration::from_secs(90))?;
    let node = c.get(ns, "pod/data-0", "{.spec.nodeName}");
    let pv = c.get(ns, "pvc/data-data-0", "{.spec.volumeName}");
    let affinity = c.get(
        "",
        &format!("pv/{pv}"),
        "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}",
    );
    if node.is_empty() || affinity != node {
        bail!("volume {pv} should be bound to node {node:?}, has affinity {affinity:?}");
    }
    // with its node cordoned the recreated pod has nowhere to go: the volume holds it
    c.kubectl(&["cordon", &node], None)?;
    let uid = c.get(ns, "pod/data-0", "{.metadata.uid}");
    c.kubectl(&["-n", ns, "delete", "pod", "data-0", "--wait=true"], None)?;
    let pending = wait(Duration::from_secs(30), || {
        let u = c.get(ns, "pod/data-0", "{.metadata.uid}");
        !u.is_empty()
            && u != uid
            && c.get(
                ns,
                "pod/data-0",
                "{.status.conditions[?(@.type==\"PodScheduled\")].reason}",
            ) == "Unschedulable"
    });
    let message = c.get(
        ns,
        "pod/data-0",
        "{.status.conditions[?(@.type==\"PodScheduled\")].message}",
    );
    c.kubectl(&["uncordon", &node], None)?;
    if !pending || !message.contains("didn't match PersistentVolume's node affinity") {
        bail!("the recreated pod should wait for its volume's node: {message:?}");
    }
    c.wait_ready(ns, "data-0", Duration::from_secs(60))?;
    let again = c.get(ns, "pod/data-0", "{.spec.nodeName}");
    if again != node {
        bail!("recreated on {again}, its volume is on {node}");
    }
    c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    Ok(())
}

/// The eviction API, as `kubectl drain` calls it: (HTTP status, message).
fn evict(c: &Cluster, ns: &str, pod: &str) -> Result<(u16, String)> {
    let body = format!(
        r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{pod}","namespace":"{ns}"}}}}"#
    );
    match c.kubectl(
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{ns}/pods/{pod}/eviction"),
            "-f",
            "-",
        ],
        Some(&body),
    ) {
        Ok(_) => Ok((201, String::new())),
        Err(e) => {
            let m = format!("{e:#}");
            if m.contains("429") || m.contains("TooManyRequests") || m.contains("disruption budget")
            {
                Ok((429, m))
            } else {
                Err(e)
            }
        }
    }
}

fn deployment_pods(c: &Cluster, ns: &str) -> Vec<(String, String, bool)> {
    c.get(
        ns,
        "pods",
        "{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    )
    .lines()
    .map(|l| l.split(' ').collect::<Vec<_>>())
    .filter(|l| l.len() >= 3 && l.get(3).is_none_or(|d| d.is_empty()))
    .map(|l| (l[0].to_string(), l[1].to_string(), l[2] == "True"))
    .collect()
}

fn drain_evicts_respecting_a_pod_disruption_budget(c: &Cluster) -> Result<()> {
    let ns = "n-drain";
    c.namespace(ns)?;
    c.apply(
        ns,
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {local-kubelet.clickhouse.com/hollow: "true"}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers:
      - name: server
        image: clickhouse/clickhouse-server:24.8
        readinessProbe: {httpGet: {path: /ping, port: 8123}, periodSeconds: 1}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: web}}
"#,
    )?;
    let all_ready = |n: usize| {
        wait(Duration::from_secs(90), || {
            let p = deployment_pods(c, ns);
            p.len() == n && p.iter().all(|(_, _, r)| *r)
        }) && wait(Duration::from_secs(30), || {
            c.get(ns, "pdb/web", "{.status.disruptionsAllowed}") == "1"
        })
    };
    if !all_ready(3) {
        bail!(
            "3 ready pods and a budget of 1: {:?}",
            deployment_pods(c, ns)
        );
    }
    let pods = deployment_pods(c, ns);
    let zones: std::collections::BTreeSet<&str> = pods.iter().map(|p| p.1.as_str()).collect();
    if zones.len() != 3 {
        bail!("one pod per zone (node): {pods:?}");
    }
    // the budget allows one disruption: the first eviction goes, the second is refused
    let (first, _) = evict(c, ns, &pods[0].0)?;
    let (second, message) = evict(c, ns, &pods[1].0)?;
    if first != 201 || second != 429 {
        bail!("evictions: first {first}, second {second} ({message})");
    }
    if !message.contains("disruption budget") {
        bail!("the refusal should name the budget: {message}");
    }
    if !all_ready(3) {
        bail!(
            "the evicted pod's replacement: {:?}",
            deployment_pods(c, ns)
        );
    }
    // drain: node-2 cordoned, its pod evicted through the budget and recreated elsewhere
    // (the spread allows a skew of 1 between the two zones left)
    let out = c.kubectl(
        &[
            "drain",
            "node-2",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
            "--pod-selector=app=web",
        ],
        None,
    );
    let unschedulable = c.get("", "node/node-2", "{.spec.unschedulable}");
    let after = deployment_pods(c, ns);
    c.kubectl(&["uncordon", "node-2"], None)?;
    out?;
    if unschedulable != "true" {
        bail!("node-2 should be cordoned by the drain");
    }
    if after.iter().any(|p| p.1 == "node-2") {
        bail!("a pod is left on the drained node: {after:?}");
    }
    if !all_ready(3) {
        bail!("after the drain: {:?}", deployment_pods(c, ns));
    }
    c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    Ok(())
}

fn node_script(c: &Cluster, cmd: &str, node: &str) -> Result<()> {
    let st = Command::new("bash")
        .arg(common::script())
        .args([cmd, &c.dir.to_string_lossy(), node])
        .stdin(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("local-cluster.sh {cmd} {node} failed");
    }
    Ok(())
}

fn a_stopped_node_goes_not_ready_and_comes_back(c: &Cluster) -> Result<()> {
    let ns = "n-stop";
    c.namespace(ns)?;
    c.apply(ns, &server_pod("on3", "app: on3", Some("node-3")))?;
    c.apply(ns, &server_pod("on1", "app: on1", Some("node-1")))?;
    let ip3 = c.wait_ready(ns, "on3", Duration::from_secs(60))?;
    let ip1 = c.wait_ready(ns, "on1", Duration::from_secs(60))?;
    expect(&ip1, &ip3, 8123, true, "before the stop")?;
    let t0 = std::time::Instant::now();
    node_script(c, "node-stop", "node-3")?;
    // the pod's processes went with the agent
    expect(&ip1, &ip3, 8123, false, "node-3 stopped")?;
    // the node controller: Ready Unknown after its grace period, the unreachable taint, the
    // node's pods not ready
    let not_ready = wait(Duration::from_secs(60), || {
        ready_status(c, "node/node-3") == "Unknown"
    });
    let noticed = t0.elapsed();
    if !not_ready {
        bail!(
            "node-3 should go NotReady: {}",
            c.get("", "node/node-3", "{.status.conditions}")
        );
    }
    let tainted = wait(Duration::from_secs(30), || {
        c.get("", "node/node-3", "{.spec.taints[*].key}")
            .contains("node.kubernetes.io/unreachable")
    });
    let pod_not_ready = wait(Duration::from_secs(30), || {
        c.get(
            ns,
            "pod/on3",
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        ) == "False"
    });
    eprintln!(
        "node-3 NotReady {:.1} s after its agent stopped",
        noticed.as_secs_f64()
    );
    if !tainted || !pod_not_ready {
        bail!(
            "taints {:?}, pod ready {:?}",
            c.get("", "node/node-3", "{.spec.taints}"),
            c.get(ns, "pod/on3", "{.status.conditions}")
        );
    }
    // the other nodes are untouched
    if ready_status(c, "node/node-1") != "True" {
        bail!("node-1 should stay Ready");
    }
    node_script(c, "node-start", "node-3")?;
    let back = wait(Duration::from_secs(60), || {
        ready_status(c, "node/node-3") == "True"
            && !c
                .get("", "node/node-3", "{.spec.taints[*].key}")
                .contains("node.kubernetes.io/unreachable")
    });
    if !back {
        bail!(
            "node-3 should be Ready again: {}",
            c.get("", "node/node-3", "{.spec.taints}")
        );
    }
    let ip3b = c.wait_ready(ns, "on3", Duration::from_secs(60))?;
    expect(&ip1, &ip3b, 8123, true, "node-3 back")?;
    c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    Ok(())
}

fn network_policies_ingress_egress_and_cluster_ips(c: &Cluster) -> Result<()> {
    let (a, b) = ("n-pol-a", "n-pol-b");
    c.namespace(a)?;
    c.namespace(b)?;
    c.kubectl(&["label", "namespace", a, "team=a"], None)?;
    c.kubectl(&["label", "namespace", b, "team=b"], None)?;
    c.apply(a, &server_pod("server", "app: server", Some("node-1")))?;
    c.apply(a, &server_pod("client", "role: client", Some("node-2")))?;
    c.apply(a, &server_pod("other", "role: other", Some("node-1")))?;
    c.apply(b, &server_pod("client", "role: client", Some("node-3")))?;
    c.apply(
        a,
        r#"apiVersion: v1
kind: Service
metadata: {name: server}
spec:
  selector: {app: server}
  ports: [{name: http, port: 80, targetPort: http}]
"#,
    )?;
    let server = c.wait_ready(a, "server", Duration::from_secs(60))?;
    let client = c.wait_ready(a, "client", Duration::from_secs(60))?;
    let other = c.wait_ready(a, "other", Duration::from_secs(60))?;
    let foreign = c.wait_ready(b, "client", Duration::from_secs(60))?;
    let svc = c.get(a, "svc/server", "{.spec.clusterIP}");
    if svc.is_empty() {
        bail!("no ClusterIP");
    }
    let gateway = c.get("", "node/node-1", "{.status.addresses[0].address}");
    // no policy: everything goes
    expect(&client, &server, 8123, true, "no policy")?;
    expect(&client, &svc, 80, true, "no policy, ClusterIP")?;
    expect(&other, &server, 8123, true, "no policy, same node")?;

    // default deny ingress in a: pod to pod and through the ClusterIP refused; the node's probes
    // (from the machine) go on, so the server stays Ready
    c.apply(
        a,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n",
    )?;
    expect(&client, &server, 8123, false, "default deny")?;
    expect(&client, &svc, 80, false, "default deny, ClusterIP")?;
    expect(
        &foreign,
        &server,
        8123,
        false,
        "default deny, other namespace",
    )?;
    std::thread::sleep(Duration::from_secs(3));
    if c.get(
        a,
        "pod/server",
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    ) != "True"
    {
        bail!("probes from the node should pass the policy");
    }
    // the machine (the node) reaches the pod directly and through the ClusterIP
    if !ping_from_machine(&server, 8123) || !ping_from_machine(&svc, 80) {
        bail!("the node's own connections should pass the policy");
    }

    // allow role=client of the same namespace on the named port: exactly that one
    c.apply(
        a,
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: http}]
"#,
    )?;
    expect(&client, &server, 8123, true, "allowed client")?;
    expect(&client, &svc, 80, true, "allowed client, ClusterIP")?;
    expect(&other, &server, 8123, false, "another label")?;
    expect(&other, &svc, 80, false, "another label, ClusterIP")?;
    expect(
        &foreign,
        &server,
        8123,
        false,
        "same label, other namespace",
    )?;

    // a port the server does not serve on: nothing of the client's gets through
    c.apply(
        a,
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: 9000}]
"#,
    )?;
    expect(
        &client,
        &server,
        8123,
        false,
        "allowed on another port only",
    )?;

    // namespaceSelector and podSelector together: role=client of team=b only
    c.apply(
        a,
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {role: client}}}]
    ports: [{port: 8123, protocol: TCP}]
"#,
    )?;
    expect(&foreign, &server, 8123, true, "team b client")?;
    expect(&foreign, &svc, 80, true, "team b client, ClusterIP")?;
    expect(&client, &server, 8123, false, "team a client")?;

    // ipBlock with except: the node network but the other pod
    c.apply(
        a,
        &format!(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: allow-clients}}
spec:
  podSelector: {{matchLabels: {{app: server}}}}
  ingress:
  - from: [{{ipBlock: {{cidr: 198.18.0.0/16, except: [{other}/32]}}}}]
"#
        ),
    )?;
    expect(&client, &server, 8123, true, "in the block")?;
    expect(&other, &server, 8123, false, "excepted from the block")?;

    // a connection opened while allowed, then refused by an egress deny: the request sent on
    // it afterwards gets no answer (a change applies to open connections, as a partition)
    if !OpenConnection::open(&client, &server, 8123)?.ping()? {
        bail!("a request on a connection opened earlier should be answered while allowed");
    }
    let open = OpenConnection::open(&client, &server, 8123)?;
    // egress deny for the client: to the allowed server, through the ClusterIP, to the machine
    c.apply(
        a,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: client-egress}\nspec:\n  podSelector: {matchLabels: {role: client}}\n  policyTypes: [Egress]\n",
    )?;
    expect(&client, &server, 8123, false, "egress deny")?;
    expect(&client, &svc, 80, false, "egress deny, ClusterIP")?;
    expect(
        &client,
        &foreign,
        8123,
        false,
        "egress deny, other namespace",
    )?;
    if tcp_from(&client, &gateway, 443) {
        bail!("egress deny should cover the API server on the machine");
    }
    if open.ping()? {
        bail!("a connection opened before the egress deny should be cut by it");
    }
    // egress allowed to the server's named port: the server again, nothing else
    c.apply(
        a,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: client-egress}\nspec:\n  podSelector: {matchLabels: {role: client}}\n  policyTypes: [Egress]\n  egress:\n  - to: [{podSelector: {matchLabels: {app: server}}}]\n    ports: [{port: http}]\n",
    )?;
    expect(&client, &server, 8123, true, "egress to the server")?;
    expect(&client, &svc, 80, true, "egress to the server, ClusterIP")?;
    expect(&client, &foreign, 8123, false, "egress elsewhere")?;
    // all policies gone: everything goes again
    c.kubectl(&["-n", a, "delete", "networkpolicy", "--all"], None)?;
    expect(&other, &server, 8123, true, "policies deleted")?;
    expect(&client, &foreign, 8123, true, "policies deleted, egress")?;
    for ns in [a, b] {
        c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    }
    Ok(())
}

/// A TCP connection opened from inside a pod's network namespace, kept open until [`ping`]
/// sends `GET /ping` on it.
///
/// [`ping`]: OpenConnection::ping
struct OpenConnection {
    child: std::process::Child,
    go: std::path::PathBuf,
}

impl OpenConnection {
    fn open(from: &str, to: &str, port: u16) -> Result<OpenConnection> {
        let ns = netns_of(from)?;
        let go = std::env::temp_dir().join(format!("lk-open-{}-{to}-{port}", std::process::id()));
        let _ = std::fs::remove_file(&go);
        let script = format!(
            "exec 3<>/dev/tcp/{to}/{port} || exit 1; echo open; \
             while [ ! -e {go} ]; do sleep 0.1; done; \
             printf 'GET /ping HTTP/1.0\\r\\n\\r\\n' >&3; timeout 3 cat <&3",
            go = go.display()
        );
        let mut child = Command::new("timeout")
            .args(["60", "ip", "netns", "exec", &ns, "bash", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut line = String::new();
        let out = child.stdout.as_mut().context("stdout")?;
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)?;
        if line.trim() != "open" {
            let _ = child.kill();
            bail!("{from} -> {to}:{port} did not open");
        }
        Ok(OpenConnection { child, go })
    }

    /// Sends the request on the open connection: true when the server answered `Ok.`.
    fn ping(self) -> Result<bool> {
        std::fs::write(&self.go, "")?;
        let out = self.child.wait_with_output()?;
        let _ = std::fs::remove_file(&self.go);
        Ok(String::from_utf8_lossy(&out.stdout).contains("Ok."))
    }
}

/// `GET /ping` from the machine (the tests' own process): true when the server answered `Ok.`.
fn ping_from_machine(to: &str, port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(addr) = format!("{to}:{port}").parse() else {
        return false;
    };
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /ping HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    // the answer, however the server ends it (it may keep the connection open)
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&out).contains("Ok.") {
            return true;
        }
    }
    false
}

/// Whether a TCP connection from the pod with address `from` to `to`:`port` opens.
fn tcp_from(from: &str, to: &str, port: u16) -> bool {
    let Ok(ns) = netns_of(from) else { return false };
    Command::new("timeout")
        .args([
            "3",
            "ip",
            "netns",
            "exec",
            &ns,
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{to}/{port}"),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn main() {
    let scenarios: Vec<Scenario> = vec![
        (
            "nodes_ready_with_zones_and_a_pod_on_each",
            nodes_ready_with_zones_and_a_pod_on_each,
        ),
        (
            "network_policies_ingress_egress_and_cluster_ips",
            network_policies_ingress_egress_and_cluster_ips,
        ),
        (
            "a_volume_keeps_its_pod_on_its_node",
            a_volume_keeps_its_pod_on_its_node,
        ),
        (
            "drain_evicts_respecting_a_pod_disruption_budget",
            drain_evicts_respecting_a_pod_disruption_budget,
        ),
        (
            "a_stopped_node_goes_not_ready_and_comes_back",
            a_stopped_node_goes_not_ready_and_comes_back,
        ),
    ];
    common::run(scenarios, 3);
}
