//! Tests of the local cluster against the real control plane: `hack/local-cluster.sh up` into a
//! temporary folder once, every scenario in its own namespace, `down` at the end (also when a
//! scenario fails or panics), then a check that nothing of the cluster is left on the machine.
//!
//! Needs root (network namespaces). Run: `cargo test -p local-kubelet --test cluster`
//! (an argument filters scenarios by name).

mod common;

use anyhow::{Context, Result, bail};
use common::{Cluster, Scenario, wait};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A query over ClickHouse's HTTP interface (HTTP/1.0, so the body is not chunked).
fn query(host: &str, sql: &str) -> Result<String> {
    let mut s =
        TcpStream::connect_timeout(&format!("{host}:8123").parse()?, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let req = format!(
        "POST / HTTP/1.0\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n{sql}",
        sql.len()
    );
    s.write_all(req.as_bytes())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("{sql}: {}", body.trim());
    }
    Ok(body.to_string())
}

fn query_retry(host: &str, sql: &str, timeout: Duration) -> Result<String> {
    let t0 = Instant::now();
    loop {
        match query(host, sql) {
            Ok(r) => return Ok(r),
            Err(e) if t0.elapsed() > timeout => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

fn four_letter(ip: &str, cmd: &str) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(
        &format!("{ip}:9181").parse().unwrap(),
        Duration::from_secs(2),
    ) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(cmd.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

const CH_STS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: ch}
spec:
  clusterIP: None
  selector: {app: ch}
  ports: [{name: http, port: 8123}]
---
apiVersion: v1
kind: Service
metadata: {name: ch-svc}
spec:
  selector: {app: ch}
  ports: [{name: http, port: 8123, targetPort: http}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ch}
spec:
  serviceName: ch
  replicas: 2
  selector: {matchLabels: {app: ch}}
  template:
    metadata: {labels: {app: ch}}
    spec:
      containers:
      - name: clickhouse
        image: clickhouse/clickhouse-server:24.8
        ports: [{name: http, containerPort: 8123}]
        readinessProbe:
          httpGet: {path: /ping, port: 8123}
          periodSeconds: 2
        volumeMounts: [{name: data, mountPath: /var/lib/clickhouse}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
"#;

fn statefulset_two_clickhouse_replicas(c: &Cluster) -> Result<()> {
    let ns = "t-sts";
    c.namespace(ns)?;
    c.apply(ns, CH_STS)?;
    let a = c.wait_ready(ns, "ch-0", Duration::from_secs(120))?;
    let b = c.wait_ready(ns, "ch-1", Duration::from_secs(120))?;
    assert_eq!(c.get(ns, "pod/ch-0", "{.status.phase}"), "Running");
    for ip in [&a, &b] {
        assert!(ip.starts_with("198.18."), "pod IP {ip}");
        assert_eq!(query(ip, "SELECT 1")?.trim(), "1");
    }
    assert_ne!(a, b);
    // both pod IPs in the Service's EndpointSlice
    for svc in ["ch", "ch-svc"] {
        let ok = wait(Duration::from_secs(30), || {
            let eps = c.get(
                ns,
                "endpointslices",
                &format!("{{.items[?(@.metadata.labels.kubernetes\\.io/service-name==\"{svc}\")].endpoints[*].addresses[*]}}"),
            );
            eps.split_whitespace().any(|x| x == a) && eps.split_whitespace().any(|x| x == b)
        });
        assert!(ok, "pod IPs {a} {b} not in the EndpointSlice of {svc}");
    }
    let cip = c.get(ns, "service/ch-svc", "{.spec.clusterIP}");
    assert!(cip.starts_with("198.19."), "ClusterIP {cip}");
    let host = query_retry(&cip, "SELECT hostName()", Duration::from_secs(20))?;
    assert!(host.trim() == "ch-0" || host.trim() == "ch-1", "{host}");
    Ok(())
}

fn pod_deleted_keeps_data_and_sigkill_restarts(c: &Cluster) -> Result<()> {
    let ns = "t-sts";
    let a = c.wait_ready(ns, "ch-0", Duration::from_secs(120))?;
    query(
        &a,
        "CREATE TABLE keep (x UInt32) ENGINE = MergeTree ORDER BY x",
    )?;
    query(&a, "INSERT INTO keep VALUES (1), (2), (3)")?;
    let uid = c.get(ns, "pod/ch-0", "{.metadata.uid}");
    // ch-1 holds an entry for ch-0's MAC address, as after talking to it
    let b = c.wait_ready(ns, "ch-1", Duration::from_secs(60))?;
    let old_mac = pod_mac(&a);
    let peer = netns_of(&b);
    let status = Command::new("ip")
        .args(["-n", &peer, "neigh", "replace", &a, "lladdr", &old_mac])
        .args(["dev", "eth0", "nud", "stale"])
        .status()?;
    assert!(status.success(), "ip neigh replace in {peer}");
    c.kubectl(&["-n", ns, "delete", "pod", "ch-0", "--wait=true"], None)?;
    let recreated = wait(Duration::from_secs(60), || {
        let u = c.get(ns, "pod/ch-0", "{.metadata.uid}");
        !u.is_empty() && u != uid
    });
    assert!(recreated, "ch-0 was not recreated");
    let a2 = c.wait_ready(ns, "ch-0", Duration::from_secs(120))?;
    // same address: ch-1's entry for it still names the right MAC address, no probing needed
    assert_eq!(
        a2, a,
        "a recreated pod gets its previous address while free"
    );
    let new_mac = pod_mac(&a2);
    let neigh = Command::new("ip")
        .args(["-n", &peer, "neigh", "show", &a, "dev", "eth0"])
        .output()?;
    let neigh = String::from_utf8_lossy(&neigh.stdout).to_string();
    assert!(
        neigh.contains(&new_mac),
        "ch-1's entry for {a} is not the recreated pod's MAC {new_mac}: {neigh}"
    );
    let rows = query_retry(&a2, "SELECT sum(x) FROM keep", Duration::from_secs(20))?;
    assert_eq!(rows.trim(), "6", "rows after re-creation");

    // The gateway's MAC address does not follow the bridge's ports: a port with a MAC lower
    // than any other joins and leaves (as a pod's veth does), and the bridge keeps its address,
    // so the pods' entries for their gateway stay right (a bridge left to the kernel takes its
    // lowest port's MAC, and its pods lost their traffic to the machine for 20-45 s)
    let bridge = network_value(&c.dir, "BRIDGE");
    let before = link_mac(&bridge);
    let low = "lkt-lowmac";
    let _ = Command::new("ip").args(["link", "del", low]).status();
    let st = Command::new("ip")
        .args([
            "link",
            "add",
            low,
            "address",
            "00:00:5e:00:53:01",
            "type",
            "veth",
        ])
        .args(["peer", "name", "lkt-lowpeer"])
        .status()?;
    assert!(st.success(), "ip link add {low}");
    let st = Command::new("ip")
        .args(["link", "set", low, "master", &bridge, "up"])
        .status()?;
    let joined = link_mac(&bridge);
    let _ = Command::new("ip").args(["link", "del", low]).status();
    assert!(st.success(), "{low} joins {bridge}");
    let left = link_mac(&bridge);
    assert_eq!(
        (joined.as_str(), left.as_str()),
        (before.as_str(), before.as_str()),
        "{bridge}'s MAC address changed with its ports"
    );
    let neigh = Command::new("ip")
        .args(["-n", &peer, "neigh", "show", "dev", "eth0"])
        .output()?;
    let neigh = String::from_utf8_lossy(&neigh.stdout).to_string();
    let gateway = network_value(&c.dir, "GATEWAY");
    assert!(
        neigh
            .lines()
            .filter(|l| l.starts_with(&format!("{gateway} ")))
            .all(|l| l.contains(&before)),
        "ch-1's entry for its gateway {gateway} is not the bridge's MAC {before}: {neigh}"
    );

    // SIGKILL of the server process of ch-1: same pod object, restartCount grows
    let uid1 = c.get(ns, "pod/ch-1", "{.metadata.uid}");
    let netns = netns_of(&b);
    let pids = Command::new("ip")
        .args(["netns", "pids", &netns])
        .output()?;
    let pids = String::from_utf8_lossy(&pids.stdout).to_string();
    assert!(!pids.trim().is_empty(), "no process in {netns}");
    for p in pids.split_whitespace() {
        let _ = Command::new("kill").args(["-9", p]).status();
    }
    let restarted = wait(Duration::from_secs(60), || {
        c.get(
            ns,
            "pod/ch-1",
            "{.status.containerStatuses[0].restartCount}",
        )
        .parse::<i32>()
        .unwrap_or(0)
            >= 1
    });
    assert!(restarted, "restartCount did not grow");
    assert_eq!(
        c.get(ns, "pod/ch-1", "{.metadata.uid}"),
        uid1,
        "pod object replaced"
    );
    let b2 = c.wait_ready(ns, "ch-1", Duration::from_secs(60))?;
    assert_eq!(
        query_retry(&b2, "SELECT 1", Duration::from_secs(20))?.trim(),
        "1"
    );
    let last = c.get(
        ns,
        "pod/ch-1",
        "{.status.containerStatuses[0].lastState.terminated.exitCode}",
    );
    assert_eq!(last, "137", "lastState.terminated.exitCode");
    Ok(())
}

/// The network namespace of the pod at `ip`.
fn netns_of(ip: &str) -> String {
    let o: Vec<&str> = ip.split('.').collect();
    format!("lk-{}-{}", o[2], o[3])
}

/// A value of the cluster's `network` file (`BRIDGE`, `GATEWAY`, …).
fn network_value(dir: &Path, key: &str) -> String {
    let net = std::fs::read_to_string(dir.join("network")).unwrap_or_default();
    let v = net
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .to_string();
    assert!(
        !v.is_empty(),
        "no {key} in {}/network: {net}",
        dir.display()
    );
    v
}

/// The MAC address of a link of the machine.
fn link_mac(name: &str) -> String {
    mac_of_link(&["-o", "link", "show", name])
}

/// The MAC address of the eth0 of the pod at `ip`.
fn pod_mac(ip: &str) -> String {
    mac_of_link(&["-n", &netns_of(ip), "-o", "link", "show", "eth0"])
}

/// The `link/ether` address that `ip <args>` prints.
fn mac_of_link(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("ip link show");
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC address in {out}"))
        .to_string()
}

fn keeper_yaml(ns: &str) -> String {
    let servers: String = (0..3)
        .map(|i| {
            format!(
                "<server><id>{}</id><hostname>keeper-{i}.keeper.{ns}.svc.cluster.local</hostname><port>9234</port></server>",
                i + 1
            )
        })
        .collect();
    format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: keeper-config}}
data:
  keeper_config.xml: |
    <clickhouse><keeper_server><tcp_port>9181</tcp_port><server_id from_env="KEEPER_ID"/>
    <raft_configuration>{servers}</raft_configuration></keeper_server></clickhouse>
---
apiVersion: v1
kind: Service
metadata: {{name: keeper}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: keeper}}
  ports: [{{name: client, port: 9181}}, {{name: raft, port: 9234}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: keeper}}
spec:
  serviceName: keeper
  replicas: 3
  podManagementPolicy: Parallel
  selector: {{matchLabels: {{app: keeper}}}}
  template:
    metadata: {{labels: {{app: keeper}}}}
    spec:
      securityContext: {{runAsUser: 101, runAsGroup: 101, runAsNonRoot: true, fsGroup: 101}}
      containers:
      - name: keeper
        image: clickhouse/clickhouse-keeper:24.8
        command: [bash, -c, 'export KEEPER_ID=$(( ${{HOSTNAME##*-}} + 1 )); exec /entrypoint.sh']
        securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false}}
        readinessProbe:
          tcpSocket: {{port: 9181}}
          periodSeconds: 2
        volumeMounts:
        - {{name: config, mountPath: /etc/clickhouse-keeper}}
        - {{name: data, mountPath: /var/lib/clickhouse-keeper}}
        - {{name: logs, mountPath: /var/log/clickhouse-keeper}}
        - {{name: tmp, mountPath: /tmp}}
      volumes:
      - name: config
        configMap: {{name: keeper-config}}
      - {{name: logs, emptyDir: {{}}}}
      - {{name: tmp, emptyDir: {{}}}}
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 1Gi}}}}
"#
    )
}

fn replicas_yaml(ns: &str) -> String {
    let keepers: String = (0..3)
        .map(|i| format!("<node><host>keeper-{i}.keeper.{ns}.svc.cluster.local</host><port>9181</port></node>"))
        .collect();
    let replicas: String = (0..2)
        .map(|i| format!("<replica><host>chr-{i}.chr.{ns}.svc.cluster.local</host><port>9000</port></replica>"))
        .collect();
    format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: ch-config}}
data:
  cluster.xml: |
    <yandex>
      <listen_host>0.0.0.0</listen_host>
      <zookeeper>{keepers}</zookeeper>
      <remote_servers><c><shard><internal_replication>true</internal_replication>{replicas}</shard></c></remote_servers>
      <macros><replica from_env="POD_NAME"/><shard>1</shard></macros>
    </yandex>
---
apiVersion: v1
kind: Service
metadata: {{name: chr}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: chr}}
  ports: [{{name: http, port: 8123}}, {{name: native, port: 9000}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: chr}}
spec:
  serviceName: chr
  replicas: 2
  podManagementPolicy: Parallel
  selector: {{matchLabels: {{app: chr}}}}
  template:
    metadata: {{labels: {{app: chr}}}}
    spec:
      securityContext: {{fsGroup: 101}}
      containers:
      - name: clickhouse
        image: clickhouse/clickhouse-server:24.8
        env:
        - name: POD_NAME
          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
        readinessProbe:
          httpGet: {{path: /ping, port: 8123}}
          periodSeconds: 2
        volumeMounts:
        - {{name: config, mountPath: /etc/clickhouse-server/config.d}}
        - {{name: data, mountPath: /var/lib/clickhouse}}
      volumes:
      - name: config
        configMap: {{name: ch-config}}
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 1Gi}}}}
"#
    )
}

fn keeper_quorum_and_replication(c: &Cluster) -> Result<()> {
    let ns = "t-repl";
    c.namespace(ns)?;
    c.apply(ns, &keeper_yaml(ns))?;
    let mut ips = Vec::new();
    for i in 0..3 {
        ips.push(c.wait_ready(ns, &format!("keeper-{i}"), Duration::from_secs(120))?);
    }
    let formed = wait(Duration::from_secs(60), || {
        let modes: Vec<String> = ips
            .iter()
            .map(|ip| {
                four_letter(ip, "srvr")
                    .lines()
                    .find(|l| l.starts_with("Mode:"))
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        modes.iter().filter(|m| m.contains("leader")).count() == 1
            && modes.iter().filter(|m| m.contains("follower")).count() == 2
    });
    assert!(
        formed,
        "no quorum: {:?}",
        ips.iter()
            .map(|ip| four_letter(ip, "srvr"))
            .collect::<Vec<_>>()
    );
    let mntr = ips
        .iter()
        .map(|ip| four_letter(ip, "mntr"))
        .collect::<String>();
    assert!(mntr.contains("zk_synced_followers\t2"), "mntr: {mntr}");
    // the members log through one SLF4J binding: each one's log tells its part in the election
    // (with the whole of /usr/share/java on the classpath the no-op binding won: no log at all)
    for i in 0..3 {
        let log = c.kubectl(&["-n", ns, "logs", &format!("keeper-{i}")], None)?;
        assert!(
            log.contains(" - LEADING") || log.contains(" - FOLLOWING"),
            "keeper-{i} logged no election: {}",
            &log[..log.len().min(2000)]
        );
        assert!(!log.contains("NOPLoggerFactory"), "keeper-{i}: {log}");
        // the client port opened with the quorum, long before the startup timeout
        assert!(log.contains("RAFT initialised after"), "keeper-{i}: {log}");
    }

    c.apply(ns, &replicas_yaml(ns))?;
    let a = c.wait_ready(ns, "chr-0", Duration::from_secs(120))?;
    let b = c.wait_ready(ns, "chr-1", Duration::from_secs(120))?;
    let ddl = query_retry(
        &a,
        "CREATE TABLE r ON CLUSTER c (x UInt32) ENGINE = ReplicatedMergeTree('/clickhouse/tables/r', '{replica}') ORDER BY x",
        Duration::from_secs(60),
    )?;
    let hosts: Vec<&str> = ddl.lines().filter(|l| l.contains("chr-")).collect();
    assert_eq!(hosts.len(), 2, "ON CLUSTER answered by {ddl}");
    assert!(
        hosts.iter().all(|l| l.split('\t').nth(2) == Some("0")),
        "{ddl}"
    );
    for ip in [&a, &b] {
        assert_eq!(
            query(ip, "SELECT count() FROM system.tables WHERE name = 'r'")?.trim(),
            "1"
        );
    }
    query(&a, "INSERT INTO r VALUES (7), (8)")?;
    let replicated = wait(Duration::from_secs(30), || {
        query(&b, "SELECT sum(x) FROM r")
            .map(|r| r.trim() == "15")
            .unwrap_or(false)
    });
    assert!(replicated, "row inserted on chr-0 not read on chr-1");
    Ok(())
}

fn crash_loop_and_unknown_image(c: &Cluster) -> Result<()> {
    let ns = "t-crash";
    c.namespace(ns)?;
    c.apply(
        ns,
        r#"
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  containers:
  - {name: c, image: busybox:1.36, command: [sh, -c, 'echo bye; exit 3']}
---
apiVersion: v1
kind: Pod
metadata: {name: unknown}
spec:
  containers:
  - {name: web, image: nginx:1.27}
---
apiVersion: v1
kind: Pod
metadata: {name: init}
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - {name: prepare, image: busybox, command: [sh, -c, 'echo from-init > /w/x'], volumeMounts: [{name: w, mountPath: /w}]}
  - {name: sidecar, image: busybox, restartPolicy: Always, command: [sleep, "3600"]}
  containers:
  - {name: main, image: busybox, command: [sh, -c, 'cat /w/x; exec sleep 3600'], volumeMounts: [{name: w, mountPath: /w}]}
  volumes:
  - {name: w, emptyDir: {}}
"#,
    )?;
    let looping = wait(Duration::from_secs(60), || {
        c.get(
            ns,
            "pod/crash",
            "{.status.containerStatuses[0].state.waiting.reason}",
        ) == "CrashLoopBackOff"
    });
    assert!(looping, "crash: {}", c.get(ns, "pod/crash", "{.status}"));
    assert_eq!(
        c.get(
            ns,
            "pod/crash",
            "{.status.containerStatuses[0].lastState.terminated.exitCode}"
        ),
        "3"
    );
    let why = wait(Duration::from_secs(30), || {
        c.get(
            ns,
            "pod/unknown",
            "{.status.containerStatuses[0].state.waiting.reason}",
        ) == "ErrImagePull"
    });
    assert!(why, "unknown: {}", c.get(ns, "pod/unknown", "{.status}"));
    let msg = c.get(
        ns,
        "pod/unknown",
        "{.status.containerStatuses[0].state.waiting.message}",
    );
    assert!(msg.contains("cannot run"), "{msg}");
    assert_eq!(c.get(ns, "pod/unknown", "{.status.phase}"), "Pending");
    // kubectl logs goes through the API server to the agent
    let logs = c.kubectl(&["-n", ns, "logs", "crash"], None)?;
    assert!(logs.contains("bye"), "logs: {logs}");
    // init containers run first, to completion
    c.wait_ready(ns, "init", Duration::from_secs(30))?;
    assert_eq!(
        c.get(
            ns,
            "pod/init",
            "{.status.initContainerStatuses[0].state.terminated.exitCode}"
        ),
        "0"
    );
    let logs = c.kubectl(&["-n", ns, "logs", "init", "-c", "main"], None)?;
    assert_eq!(logs.trim(), "from-init");
    c.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "pod",
            "crash",
            "unknown",
            "init",
            "--wait=true",
        ],
        None,
    )?;
    Ok(())
}

/// PIDs of the processes in a pod's network namespace (derived from its IP).
fn pod_pids(ip: &str) -> Vec<i32> {
    let o: Vec<&str> = ip.split('.').collect();
    let netns = format!("lk-{}-{}", o[2], o[3]);
    Command::new("ip")
        .args(["netns", "pids", &netns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs a command inside a pod's container namespaces (mount, net, uts).
fn in_pod(ip: &str, cmd: &[&str]) -> Result<String> {
    let pid = *pod_pids(ip).first().context("no process in the pod")?;
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "-n", "-u", "--"])
        .args(cmd)
        .output()?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn volumes_env_probes_and_api_access(c: &Cluster) -> Result<()> {
    let ns = "t-pod";
    c.namespace(ns)?;
    let hostdir = c.dir.join("prestop-check");
    std::fs::create_dir_all(&hostdir)?;
    c.apply(
        ns,
        &format!(
            r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: cm}}
data: {{greeting: hello, extra: x}}
---
apiVersion: v1
kind: Secret
metadata: {{name: sec}}
stringData: {{password: s3cret}}
---
apiVersion: v1
kind: Pod
metadata: {{name: box}}
spec:
  hostname: box
  subdomain: boxes
  terminationGracePeriodSeconds: 5
  containers:
  - name: c
    image: debian:12
    command: [sh, -c, 'env > /out/env; echo kept > /etc/demo/nested/mark; exec sleep 3600']
    env:
    - {{name: GREETING, valueFrom: {{configMapKeyRef: {{name: cm, key: greeting}}}}}}
    - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: sec, key: password}}}}}}
    - {{name: MY_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
    - {{name: COMBINED, value: "$(GREETING)-world"}}
    envFrom: [{{prefix: CM_, configMapRef: {{name: cm}}}}]
    readinessProbe:
      exec: {{command: [test, -f, /out/env]}}
      periodSeconds: 1
    volumeMounts:
    - {{name: out, mountPath: /out}}
    - {{name: cfg, mountPath: /etc/demo}}
    - {{name: nested, mountPath: /etc/demo/nested}}
    - {{name: sec, mountPath: /etc/demo-secret}}
    - {{name: info, mountPath: /etc/podinfo}}
    - {{name: host, mountPath: /mnt/host}}
    - {{name: tmp, mountPath: /tmp}}
    lifecycle: {{preStop: {{exec: {{command: [sh, -c, 'echo bye > /mnt/host/prestop']}}}}}}
  volumes:
  - {{name: out, emptyDir: {{}}}}
  - {{name: nested, emptyDir: {{}}}}
  - {{name: cfg, configMap: {{name: cm, items: [{{key: greeting, path: sub/greeting.txt, mode: 0600}}]}}}}
  - {{name: sec, secret: {{secretName: sec, defaultMode: 0400}}}}
  - {{name: info, downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}}}
  - {{name: host, hostPath: {{path: {}}}}}
  - {{name: tmp, emptyDir: {{}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: live}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: busybox
    command: [sleep, "3600"]
    livenessProbe:
      exec: {{command: ["false"]}}
      periodSeconds: 1
      failureThreshold: 2
"#,
            hostdir.display()
        ),
    )?;
    let ip = c.wait_ready(ns, "box", Duration::from_secs(60))?;
    let env = in_pod(&ip, &["cat", "/out/env"])?;
    for want in [
        "GREETING=hello".to_string(),
        "PASSWORD=s3cret".into(),
        format!("MY_IP={ip}"),
        "COMBINED=hello-world".into(),
        "CM_extra=x".into(),
        "KUBERNETES_SERVICE_PORT=443".into(),
    ] {
        assert!(env.lines().any(|l| l == want), "{want} not in env:\n{env}");
    }
    assert_eq!(
        in_pod(&ip, &["cat", "/etc/demo/sub/greeting.txt"])?,
        "hello"
    );
    assert_eq!(
        in_pod(&ip, &["stat", "-c", "%a", "/etc/demo/sub/greeting.txt"])?.trim(),
        "600"
    );
    assert_eq!(
        in_pod(&ip, &["cat", "/etc/demo-secret/password"])?,
        "s3cret"
    );
    assert_eq!(
        in_pod(&ip, &["stat", "-Lc", "%a", "/etc/demo-secret/password"])?.trim(),
        "400"
    );
    assert_eq!(in_pod(&ip, &["cat", "/etc/podinfo/name"])?, "box");
    assert_eq!(in_pod(&ip, &["hostname"])?.trim(), "box");
    assert_eq!(
        in_pod(
            &ip,
            &["getent", "hosts", "box.boxes.t-pod.svc.cluster.local"]
        )?
        .split_whitespace()
        .next(),
        Some(ip.as_str())
    );
    // a ConfigMap change reaches the mounted file
    c.kubectl(
        &[
            "-n",
            ns,
            "patch",
            "configmap",
            "cm",
            "-p",
            r#"{"data":{"greeting":"bonjour"}}"#,
        ],
        None,
    )?;
    let updated = wait(Duration::from_secs(20), || {
        in_pod(&ip, &["cat", "/etc/demo/sub/greeting.txt"])
            .ok()
            .as_deref()
            == Some("bonjour")
    });
    assert!(updated, "configmap update not visible in the pod");
    // a volume mounted inside the ConfigMap's mount keeps its mount point through the syncs
    // of the ConfigMap (a real kubelet keeps it too)
    assert_eq!(
        in_pod(&ip, &["cat", "/etc/demo/nested/mark"])?.trim(),
        "kept",
        "the nested mount point was lost"
    );
    // the API server through the kubernetes Service, with the pod's own token
    let api = in_pod(
        &ip,
        &[
            "sh",
            "-c",
            "curl -sS --cacert /var/run/secrets/kubernetes.io/serviceaccount/ca.crt \
             -H \"Authorization: Bearer $(cat /var/run/secrets/kubernetes.io/serviceaccount/token)\" \
             https://kubernetes.default.svc/api",
        ],
    )?;
    assert!(api.contains("\"versions\""), "API answer: {api}");
    // a failing liveness probe restarts the container
    let restarted = wait(Duration::from_secs(60), || {
        c.get(
            ns,
            "pod/live",
            "{.status.containerStatuses[0].restartCount}",
        )
        .parse::<i32>()
        .unwrap_or(0)
            >= 1
    });
    assert!(
        restarted,
        "liveness: {}",
        c.get(ns, "pod/live", "{.status}")
    );
    // deletion runs preStop before stopping the process
    c.kubectl(
        &["-n", ns, "delete", "pod", "box", "live", "--wait=true"],
        None,
    )?;
    assert_eq!(
        std::fs::read_to_string(hostdir.join("prestop"))?.trim(),
        "bye"
    );
    Ok(())
}

fn volume_expansion_and_reclaim(c: &Cluster) -> Result<()> {
    let ns = "t-pv";
    c.namespace(ns)?;
    c.apply(
        ns,
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scratch}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox
    command: [sh, -c, 'echo data > /data/file; exec sleep 3600']
    volumeMounts: [{name: d, mountPath: /data}]
  volumes:
  - {name: d, persistentVolumeClaim: {claimName: scratch}}
"#,
    )?;
    c.wait_ready(ns, "writer", Duration::from_secs(60))?;
    let pv = c.get(ns, "pvc/scratch", "{.spec.volumeName}");
    let path = PathBuf::from(c.get(ns, &format!("pv/{pv}"), "{.spec.hostPath.path}"));
    assert!(
        wait(Duration::from_secs(10), || path.join("file").exists()),
        "no file in {path:?}"
    );
    c.kubectl(
        &[
            "-n",
            ns,
            "patch",
            "pvc",
            "scratch",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
        ],
        None,
    )?;
    let expanded = wait(Duration::from_secs(30), || {
        c.get(ns, &format!("pv/{pv}"), "{.spec.capacity.storage}") == "2Gi"
            && c.get(ns, "pvc/scratch", "{.status.capacity.storage}") == "2Gi"
    });
    assert!(
        expanded,
        "expansion: {}",
        c.get(ns, "pvc/scratch", "{.status}")
    );
    c.kubectl(&["-n", ns, "delete", "pod", "writer", "--wait=true"], None)?;
    c.kubectl(&["-n", ns, "delete", "pvc", "scratch", "--wait=true"], None)?;
    let reclaimed = wait(Duration::from_secs(60), || {
        c.kubectl(&["get", "pv", &pv], None).is_err() && !path.exists()
    });
    assert!(reclaimed, "PV {pv} or its folder {path:?} not deleted");
    Ok(())
}

fn operator_image_in_cluster(c: &Cluster) -> Result<()> {
    let ns = "t-op";
    c.namespace(ns)?;
    c.apply(
        ns,
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: operator}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pods-reader}
rules:
- {apiGroups: [""], resources: [pods], verbs: [list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pods-reader}
subjects:
- {kind: ServiceAccount, name: operator}
---
apiVersion: v1
kind: Pod
metadata: {name: operator}
spec:
  serviceAccountName: operator
  terminationGracePeriodSeconds: 1
  securityContext: {runAsNonRoot: true}
  containers:
  - name: operator
    image: ghcr.io/example/clickhouse-operator:dev
    args: [run, --flag]
---
apiVersion: v1
kind: Pod
metadata: {name: rootbox}
spec:
  securityContext: {runAsNonRoot: true}
  containers:
  - {name: c, image: busybox, command: [sleep, "3600"]}
"#,
    )?;
    c.wait_ready(ns, "operator", Duration::from_secs(60))?;
    let ok = wait(Duration::from_secs(20), || {
        c.kubectl(&["-n", ns, "logs", "operator"], None)
            .map(|l| l.contains("\"kind\": \"PodList\"") || l.contains("\"kind\":\"PodList\""))
            .unwrap_or(false)
    });
    let logs = c.kubectl(&["-n", ns, "logs", "operator"], None)?;
    assert!(ok, "the operator pod did not reach the API server: {logs}");
    assert!(logs.contains("args: run --flag"), "{logs}");
    assert!(logs.contains("uid: 65532"), "{logs}");
    let refused = wait(Duration::from_secs(20), || {
        c.get(
            ns,
            "pod/rootbox",
            "{.status.containerStatuses[0].state.waiting.reason}",
        ) == "CreateContainerConfigError"
    });
    assert!(
        refused,
        "runAsNonRoot: {}",
        c.get(ns, "pod/rootbox", "{.status}")
    );
    c.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "pod",
            "operator",
            "rootbox",
            "--wait=true",
        ],
        None,
    )?;
    Ok(())
}

/// The container state's waiting reason and the log of a pod's first container.
fn waiting_reason(c: &Cluster, ns: &str, pod: &str) -> String {
    c.get(
        ns,
        &format!("pod/{pod}"),
        "{.status.containerStatuses[0].state.waiting.reason}",
    )
}

fn logs_contain(c: &Cluster, ns: &str, pod: &str, text: &str, timeout: Duration) -> bool {
    wait(timeout, || {
        c.kubectl(&["-n", ns, "logs", pod], None)
            .map(|l| l.contains(text))
            .unwrap_or(false)
    })
}

/// readOnlyRootFilesystem, the images' VOLUMEs, and a volume inside a read-only volume.
fn read_only_root_and_image_volumes(c: &Cluster) -> Result<()> {
    let ns = "t-ro";
    c.namespace(ns)?;
    let server = |name: &str, annotations: &str| {
        format!(
            r#"
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, annotations: {{{annotations}}}}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsUser: 101, runAsGroup: 101, runAsNonRoot: true, fsGroup: 101}}
  containers:
  - name: clickhouse
    image: clickhouse/clickhouse-server:24.8
    env: [{{name: CLICKHOUSE_SKIP_USER_SETUP, value: "1"}}]
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false}}
    readinessProbe:
      httpGet: {{path: /ping, port: 8123}}
      periodSeconds: 1
    volumeMounts:
    - {{name: logs, mountPath: /var/log/clickhouse-server}}
    - {{name: tmp, mountPath: /tmp}}
  volumes:
  - {{name: logs, emptyDir: {{}}}}
  - {{name: tmp, emptyDir: {{}}}}
"#
        )
    };
    let mut yaml = String::from(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
data: {a.txt: a}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm2}
data: {b.txt: b}
---
apiVersion: v1
kind: Pod
metadata: {name: box}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: debian:12
    command: [sh, -c, 'touch /lk-ro-probe 2> /out/root; echo n > /etc/cfg/nested/f; exec sleep 3600']
    securityContext: {readOnlyRootFilesystem: true}
    readinessProbe:
      exec: {command: [test, -f, /etc/cfg/nested/f]}
      periodSeconds: 1
    volumeMounts:
    - {name: out, mountPath: /out}
    - {name: cfg, mountPath: /etc/cfg}
    - {name: nested, mountPath: /etc/cfg/nested}
    - {name: cfg2, mountPath: /etc/cfg/more}
  volumes:
  - {name: out, emptyDir: {}}
  - {name: nested, emptyDir: {}}
  - {name: cfg, configMap: {name: cm}}
  - {name: cfg2, configMap: {name: cm2}}
"#,
    );
    yaml.push_str(&server("srv", ""));
    yaml.push_str(&server(
        "srv-crio",
        "local-kubelet.clickhouse.com/image-volumes: crio",
    ));
    c.apply(ns, &yaml)?;
    // a plain container: writes outside its volumes fail, a volume inside a ConfigMap's
    // mount gets its mount point, and the ConfigMap's own files stay
    let ip = c.wait_ready(ns, "box", Duration::from_secs(60))?;
    let root = in_pod(&ip, &["cat", "/out/root"])?;
    assert!(root.contains("Read-only file system"), "touch /: {root}");
    assert_eq!(in_pod(&ip, &["cat", "/etc/cfg/more/b.txt"])?, "b");
    assert_eq!(in_pod(&ip, &["cat", "/etc/cfg/a.txt"])?, "a");
    // every filesystem of the machine is read-only inside, the agent's files are not
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    for mp in mounts.lines().filter_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 3 && f[3].split(',').any(|o| o == "rw") && f[0].starts_with('/'))
            .then(|| f[1].to_string())
    }) {
        if mp.starts_with("/dev") || mp.starts_with("/proc") || mp.starts_with("/sys") {
            continue;
        }
        let probe = format!(
            "{}/.lk-ro-probe-{}",
            mp.trim_end_matches('/'),
            std::process::id()
        );
        let r = in_pod(&ip, &["touch", &probe]);
        let _ = std::fs::remove_file(&probe);
        assert!(r.is_err(), "{probe} was writable in a read-only root");
    }
    in_pod(
        &ip,
        &[
            "touch",
            "/out/x",
            "/etc/cfg/nested/g",
            "/dev/termination-log",
        ],
    )?;
    let e = in_pod(&ip, &["touch", "/etc/cfg/x"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("Read-only file system"), "{e}");
    // server, containerd: /var/lib/clickhouse (VOLUME) writable, the rest of the image not
    let ip = c.wait_ready(ns, "srv", Duration::from_secs(120))?;
    assert_eq!(query(&ip, "SELECT 1")?.trim(), "1");
    in_pod(&ip, &["touch", "/var/lib/clickhouse/x"])?;
    let e = in_pod(&ip, &["touch", "/etc/clickhouse-server/x"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("Read-only file system"), "{e}");
    // server, CRI-O: the VOLUME is a folder of the read-only root; the entrypoint stops
    assert!(
        logs_contain(
            c,
            ns,
            "srv-crio",
            "Couldn't create necessary directory: /var/lib/clickhouse/",
            Duration::from_secs(60)
        ),
        "srv-crio: {}",
        c.get(ns, "pod/srv-crio", "{.status}")
    );
    c.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "pod",
            "box",
            "srv",
            "srv-crio",
            "--wait=true",
        ],
        None,
    )?;
    Ok(())
}

/// A Keeper pod of one member (raft on the loopback address) named `<name>-0`.
fn keeper_pod(name: &str, image: &str, command: bool, env: &str, annotations: &str) -> String {
    let command = if command {
        r#"command: [/bin/bash, -c, 'export KEEPER_SERVER_ID=$(( ${HOSTNAME##*-} + 1 )); exec /entrypoint.sh']"#
    } else {
        ""
    };
    format!(
        r#"
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}-0, annotations: {{{annotations}}}}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsUser: 101, runAsGroup: 101, runAsNonRoot: true, fsGroup: 101}}
  containers:
  - name: keeper
    image: {image}
    {command}
    env: [{env}]
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false}}
    readinessProbe:
      tcpSocket: {{port: 9181}}
      periodSeconds: 1
    volumeMounts:
    - {{name: config, mountPath: /etc/clickhouse-keeper}}
    - {{name: data, mountPath: /var/lib/clickhouse-keeper}}
    - {{name: logs, mountPath: /var/log/clickhouse-keeper}}
    - {{name: tmp, mountPath: /tmp}}
  volumes:
  - {{name: config, configMap: {{name: keeper-one}}}}
  - {{name: data, emptyDir: {{}}}}
  - {{name: logs, emptyDir: {{}}}}
  - {{name: tmp, emptyDir: {{}}}}
"#
    )
}

/// The Keeper image's entrypoint: its folders under CRI-O's image volumes, the id taken at
/// start, the distroless variant.
fn keeper_entrypoint_and_variants(c: &Cluster) -> Result<()> {
    let ns = "t-kep";
    c.namespace(ns)?;
    let mut yaml = String::from(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: keeper-one}
data:
  keeper_config.xml: |
    <clickhouse><path>/var/lib/clickhouse-keeper</path><keeper_server><tcp_port>9181</tcp_port>
    <server_id from_env="KEEPER_SERVER_ID"/>
    <log_storage_path>/var/lib/clickhouse-keeper/coordination/log</log_storage_path>
    <raft_configuration><server><id>1</id><hostname>127.0.0.1</hostname><port>9234</port></server></raft_configuration>
    </keeper_server></clickhouse>
"#,
    );
    let data_dir = "{name: CLICKHOUSE_DATA_DIR, value: /var/lib/clickhouse-keeper}";
    let crio = "local-kubelet.clickhouse.com/image-volumes: crio";
    yaml.push_str(&keeper_pod(
        "crio",
        "clickhouse/clickhouse-keeper:25.3",
        true,
        "",
        crio,
    ));
    yaml.push_str(&keeper_pod(
        "crioenv",
        "clickhouse/clickhouse-keeper:25.3",
        true,
        data_dir,
        crio,
    ));
    yaml.push_str(&keeper_pod(
        "noid",
        "clickhouse/clickhouse-keeper:25.3",
        false,
        "",
        "",
    ));
    yaml.push_str(&keeper_pod(
        "dl",
        "clickhouse/clickhouse-keeper:26.1-distroless",
        true,
        "",
        "",
    ));
    yaml.push_str(&keeper_pod(
        "dlok",
        "clickhouse/clickhouse-keeper:26.1-distroless",
        false,
        "{name: KEEPER_SERVER_ID, value: \"1\"}",
        "",
    ));
    c.apply(ns, &yaml)?;
    // the image's /var/lib/clickhouse is a folder of the read-only root: the entrypoint finds
    // it not writable (or cannot create coordination/ in it)
    assert!(
        wait(Duration::from_secs(60), || {
            let log = c
                .kubectl(&["-n", ns, "logs", "crio-0"], None)
                .unwrap_or_default();
            log.contains(
                "Necessary directory '/var/lib/clickhouse' isn't accessible by user with id '101'",
            ) || log
                .contains("Couldn't create necessary directory: /var/lib/clickhouse/coordination")
        }),
        "crio-0: {}",
        c.get(ns, "pod/crio-0", "{.status}")
    );
    assert!(
        logs_contain(
            c,
            ns,
            "noid-0",
            "KEEPER_SERVER_ID (from_env) is not set",
            Duration::from_secs(60)
        ),
        "noid-0: {}",
        c.get(ns, "pod/noid-0", "{.status}")
    );
    let refused = wait(Duration::from_secs(30), || {
        waiting_reason(c, ns, "dl-0") == "RunContainerError"
    });
    let msg = c.get(
        ns,
        "pod/dl-0",
        "{.status.containerStatuses[0].state.waiting.message}",
    );
    assert!(refused, "dl-0: {}", c.get(ns, "pod/dl-0", "{.status}"));
    assert!(
        msg.contains(r#"exec: "/bin/bash": stat /bin/bash: no such file or directory"#),
        "{msg}"
    );
    // the entrypoint made Keeper's folders under CLICKHOUSE_DATA_DIR (the data volume), or
    // under /var/lib/clickhouse, an image VOLUME of its own with containerd
    for (pod, data_dir) in [
        ("crioenv-0", "/var/lib/clickhouse-keeper"),
        ("dlok-0", "/var/lib/clickhouse"),
    ] {
        let ip = c.wait_ready(ns, pod, Duration::from_secs(120))?;
        let srvr = four_letter(&ip, "srvr");
        assert!(srvr.contains("Mode: leader"), "{pod}: {srvr}");
        in_pod(
            &ip,
            &["test", "-d", &format!("{data_dir}/coordination/snapshots")],
        )
        .with_context(|| pod.to_string())?;
        let var_lib = in_pod(&ip, &["touch", "/var/lib/clickhouse/x"]);
        assert_eq!(var_lib.is_ok(), pod == "dlok-0", "{pod}: {var_lib:?}");
    }
    for pod in ["crio-0", "noid-0"] {
        assert_eq!(
            c.get(
                ns,
                &format!("pod/{pod}"),
                "{.status.containerStatuses[0].lastState.terminated.exitCode}"
            ),
            "1",
            "{pod}"
        );
    }
    c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    Ok(())
}

/// Keeper opens its client port once it has a quorum, or after its startup timeout.
fn keeper_client_port_waits_for_quorum(c: &Cluster) -> Result<()> {
    let ns = "t-kq";
    c.namespace(ns)?;
    let servers: String = (0..3)
        .map(|i| {
            format!(
                "<server><id>{}</id><hostname>kq-{i}.kq.{ns}.svc.cluster.local</hostname><port>9234</port></server>",
                i + 1
            )
        })
        .collect();
    let yaml = format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: kq}}
data:
  keeper_config.xml: |
    <clickhouse><keeper_server><tcp_port>9181</tcp_port><server_id from_env="KEEPER_SERVER_ID"/>
    <coordination_settings><startup_timeout>15000</startup_timeout></coordination_settings>
    <raft_configuration>{servers}</raft_configuration></keeper_server></clickhouse>
---
apiVersion: v1
kind: Service
metadata: {{name: kq}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: kq}}
  ports: [{{name: client, port: 9181}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: kq}}
spec:
  serviceName: kq
  replicas: 1
  podManagementPolicy: Parallel
  selector: {{matchLabels: {{app: kq}}}}
  template:
    metadata: {{labels: {{app: kq}}}}
    spec:
      terminationGracePeriodSeconds: 1
      securityContext: {{runAsUser: 101, runAsGroup: 101, runAsNonRoot: true, fsGroup: 101}}
      containers:
      - name: keeper
        image: clickhouse/clickhouse-keeper:25.3
        command: [/bin/bash, -c, 'export KEEPER_SERVER_ID=$(( ${{HOSTNAME##*-}} + 1 )); exec /entrypoint.sh']
        env: [{{name: CLICKHOUSE_DATA_DIR, value: /var/lib/clickhouse-keeper}}]
        securityContext: {{readOnlyRootFilesystem: true}}
        volumeMounts:
        - {{name: config, mountPath: /etc/clickhouse-keeper}}
        - {{name: data, mountPath: /var/lib/clickhouse-keeper}}
        - {{name: logs, mountPath: /var/log/clickhouse-keeper}}
      volumes:
      - {{name: config, configMap: {{name: kq}}}}
      - {{name: data, emptyDir: {{}}}}
      - {{name: logs, emptyDir: {{}}}}
"#
    );
    c.apply(ns, &yaml)?;
    let running = wait(Duration::from_secs(60), || {
        !c.get(
            ns,
            "pod/kq-0",
            "{.status.containerStatuses[0].state.running.startedAt}",
        )
        .is_empty()
    });
    assert!(running, "kq-0: {}", c.get(ns, "pod/kq-0", "{.status}"));
    let t0 = Instant::now();
    let ip = c.get(ns, "pod/kq-0", "{.status.podIP}");
    let addr: std::net::SocketAddr = format!("{ip}:9181").parse()?;
    // closed while alone, well before the startup timeout (15 s from the start)
    while t0.elapsed() < Duration::from_secs(8) {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            r => bail!(
                "kq-0's client port answered {:.1} s after its start without a quorum: {r:?}",
                t0.elapsed().as_secs_f64()
            ),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // open after the timeout, not serving
    let open = wait(Duration::from_secs(40), || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
    });
    assert!(
        open,
        "kq-0's client port not open after its startup timeout"
    );
    let srvr = four_letter(&ip, "srvr");
    assert!(srvr.contains("not currently serving"), "{srvr}");
    // with its peers, the ensemble elects and serves
    c.kubectl(
        &["-n", ns, "scale", "statefulset", "kq", "--replicas=3"],
        None,
    )?;
    let formed = wait(Duration::from_secs(150), || {
        (0..3).all(|i| {
            let ip = c.get(ns, &format!("pod/kq-{i}"), "{.status.podIP}");
            !ip.is_empty()
                && four_letter(&ip, "srvr")
                    .lines()
                    .any(|l| l == "Mode: leader" || l == "Mode: follower")
        })
    });
    assert!(formed, "the three members did not elect");
    c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    Ok(())
}

/// The server image's entrypoint: CLICKHOUSE_SKIP_USER_SETUP by image version, users.d.
fn server_entrypoint_user_setup(c: &Cluster) -> Result<()> {
    let ns = "t-sep";
    c.namespace(ns)?;
    let pod = |name: &str, image: &str| {
        format!(
            r#"
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: clickhouse
    image: {image}
    env:
    - {{name: CLICKHOUSE_SKIP_USER_SETUP, value: "1"}}
    - {{name: CLICKHOUSE_PASSWORD, value: secret}}
    readinessProbe:
      httpGet: {{path: /ping, port: 8123}}
      periodSeconds: 1
    volumeMounts:
    - {{name: users, mountPath: /etc/clickhouse-server/users.d}}
  volumes:
  - {{name: users, configMap: {{name: users}}}}
"#
        )
    };
    let mut yaml = String::from(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: users}
data: {README: "users.d of the test"}
"#,
    );
    yaml.push_str(&pod("old", "clickhouse/clickhouse-server:24.8"));
    yaml.push_str(&pod("new", "clickhouse/clickhouse-server:25.3"));
    c.apply(ns, &yaml)?;
    let ip = c.wait_ready(ns, "new", Duration::from_secs(120))?;
    assert_eq!(query(&ip, "SELECT 1")?.trim(), "1");
    let log = c.kubectl(&["-n", ns, "logs", "new"], None)?;
    assert!(
        log.contains("explicitly skip changing user 'default'"),
        "{log}"
    );
    assert!(
        logs_contain(
            c,
            ns,
            "old",
            "users.d/default-user.xml: Read-only file system",
            Duration::from_secs(60)
        ),
        "old: {}",
        c.get(ns, "pod/old", "{.status}")
    );
    c.kubectl(&["delete", "namespace", ns, "--wait=false"], None)?;
    Ok(())
}

fn main() {
    let scenarios: Vec<Scenario> = vec![
        (
            "statefulset_two_clickhouse_replicas",
            statefulset_two_clickhouse_replicas,
        ),
        (
            "pod_deleted_keeps_data_and_sigkill_restarts",
            pod_deleted_keeps_data_and_sigkill_restarts,
        ),
        (
            "keeper_quorum_and_replication",
            keeper_quorum_and_replication,
        ),
        ("crash_loop_and_unknown_image", crash_loop_and_unknown_image),
        (
            "volumes_env_probes_and_api_access",
            volumes_env_probes_and_api_access,
        ),
        ("volume_expansion_and_reclaim", volume_expansion_and_reclaim),
        ("operator_image_in_cluster", operator_image_in_cluster),
        (
            "read_only_root_and_image_volumes",
            read_only_root_and_image_volumes,
        ),
        (
            "keeper_entrypoint_and_variants",
            keeper_entrypoint_and_variants,
        ),
        (
            "keeper_client_port_waits_for_quorum",
            keeper_client_port_waits_for_quorum,
        ),
        ("server_entrypoint_user_setup", server_entrypoint_user_setup),
    ];
    common::run(scenarios, 1);
}
