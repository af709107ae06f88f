//! The real images' behaviour: a read-only root and image volumes, Keeper's entrypoint and its
//! variants, its client port waiting for a quorum, the server entrypoint's user setup.

use super::*;

/// readOnlyRootFilesystem, the images' VOLUMEs, and a volume inside a read-only volume.
pub(super) fn read_only_root_and_image_volumes(c: &Cluster) -> Result<()> {
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
pub(super) fn keeper_entrypoint_and_variants(c: &Cluster) -> Result<()> {
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
pub(super) fn keeper_client_port_waits_for_quorum(c: &Cluster) -> Result<()> {
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
pub(super) fn server_entrypoint_user_setup(c: &Cluster) -> Result<()> {
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
