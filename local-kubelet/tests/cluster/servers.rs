//! ClickHouse and Keeper as StatefulSets: two replicas that replicate, a deleted pod that keeps
//! its data and its address, a SIGKILLed server restarted, a Keeper quorum.

use super::*;

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

pub(super) fn statefulset_two_clickhouse_replicas(c: &Cluster) -> Result<()> {
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

pub(super) fn pod_deleted_keeps_data_and_sigkill_restarts(c: &Cluster) -> Result<()> {
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

pub(super) fn keeper_quorum_and_replication(c: &Cluster) -> Result<()> {
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
