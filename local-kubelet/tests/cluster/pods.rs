//! What a kubelet does for any pod: crash loops and unknown images reported, volumes,
//! environment, probes and API access, volume expansion and reclaim, the operator's image.

use super::*;

pub(super) fn crash_loop_and_unknown_image(c: &Cluster) -> Result<()> {
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
    // as a kubelet: the failed pull (ErrImagePull, with the Events a kubelet records), then its
    // back-off (ImagePullBackOff, naming the image and the pull's error)
    let why = wait(Duration::from_secs(30), || {
        c.get(
            ns,
            "pod/unknown",
            "{.status.containerStatuses[0].state.waiting.reason}",
        ) == "ImagePullBackOff"
    });
    assert!(why, "unknown: {}", c.get(ns, "pod/unknown", "{.status}"));
    let msg = c.get(
        ns,
        "pod/unknown",
        "{.status.containerStatuses[0].state.waiting.message}",
    );
    assert!(
        msg.starts_with("Back-off pulling image \"nginx:1.27\": ErrImagePull: ")
            && msg.contains("cannot run"),
        "{msg}"
    );
    let events = c.kubectl(
        &[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=unknown",
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ],
        None,
    )?;
    for said in [
        "Pulling: Pulling image \"nginx:1.27\"",
        "Failed: Failed to pull image \"nginx:1.27\": ",
        "Failed: Error: ErrImagePull",
        "BackOff: Back-off pulling image \"nginx:1.27\"",
        "Failed: Error: ImagePullBackOff",
    ] {
        assert!(events.contains(said), "no {said:?} in the Events: {events}");
    }
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

pub(super) fn volumes_env_probes_and_api_access(c: &Cluster) -> Result<()> {
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

pub(super) fn volume_expansion_and_reclaim(c: &Cluster) -> Result<()> {
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

pub(super) fn operator_image_in_cluster(c: &Cluster) -> Result<()> {
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

/// A container on the machine's programs, as a user, writes its termination message into a
/// `/dev` of its own: the machine's devices are not there, the runtime's are, and the message
/// file is never a path of the machine's `/dev` (where another node agent of the same machine
/// could remove it under the running container).
pub(super) fn termination_message_in_a_dev_of_its_own(c: &Cluster) -> Result<()> {
    let ns = "t-devs";
    c.namespace(ns)?;
    c.apply(
        ns,
        r#"
apiVersion: v1
kind: Pod
metadata: {name: report}
spec:
  restartPolicy: Never
  securityContext: {runAsUser: 1000, runAsGroup: 1000}
  containers:
  - name: c
    image: busybox
    command:
    - sh
    - -c
    - |
      for d in null zero full random urandom tty fd stdout shm; do [ -e /dev/$d ] || echo "no /dev/$d"; done
      [ -e /dev/kmsg ] && echo "the machine's /dev"
      echo end > /dev/null
      echo reported > /dev/termination-log && echo written
"#,
    )?;
    let ended = wait(Duration::from_secs(60), || {
        !c.get(
            ns,
            "pod/report",
            "{.status.containerStatuses[0].state.terminated.reason}",
        )
        .is_empty()
    });
    assert!(ended, "report: {}", c.get(ns, "pod/report", "{.status}"));
    let logs = c.kubectl(&["-n", ns, "logs", "report"], None)?;
    assert_eq!(logs.trim(), "written", "{logs}");
    assert_eq!(
        c.get(
            ns,
            "pod/report",
            "{.status.containerStatuses[0].state.terminated.message}"
        ),
        "reported\n"
    );
    assert!(
        !std::path::Path::new("/dev/termination-log").exists(),
        "a mount point was made in the machine's /dev"
    );
    c.kubectl(&["-n", ns, "delete", "pod", "report", "--wait=true"], None)?;
    Ok(())
}
