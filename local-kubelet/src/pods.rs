//! Pods bound to this node: a worker per pod (network namespace, volumes, hosts file, status),
//! a runner per container (process, probes, restarts with the kubelet's back-off).

use crate::SharedCtx;
use crate::hosts;
use crate::images::{self, Kind};
use crate::keeper;
use crate::net;
use crate::oci;
use crate::probes;
use crate::util::{self, shell_quote};
use crate::volumes::{VolKind, VolumeState};
use anyhow::Result;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Ctl {
    Run,
    /// graceful stop, then the Pod object is deleted (grace 0)
    Delete,
    /// stop (agent shutdown, or the Pod object is already gone)
    Stop,
}

struct Worker {
    tx: watch::Sender<Ctl>,
    handle: tokio::task::JoinHandle<()>,
}

pub async fn manager(ctx: SharedCtx) {
    let mut workers: HashMap<String, Worker> = HashMap::new();
    let mut done: HashSet<String> = HashSet::new();
    loop {
        if ctx.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
            for w in workers.values() {
                let _ = w.tx.send(Ctl::Stop);
            }
            for (_, w) in workers.drain() {
                let _ = w.handle.await;
            }
            return;
        }
        let mut mine: HashMap<String, Arc<Pod>> = HashMap::new();
        for p in ctx.pods.state() {
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(ctx.node.as_str()) {
                mine.insert(p.metadata.uid.clone().unwrap_or_default(), p);
            }
        }
        for (uid, p) in &mine {
            if done.contains(uid) {
                continue;
            }
            let terminal = matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded") | Some("Failed")
            );
            if !workers.contains_key(uid) {
                if terminal && p.metadata.deletion_timestamp.is_none() {
                    continue; // finished earlier (before an agent restart)
                }
                let (tx, rx) = watch::channel(Ctl::Run);
                let handle = tokio::spawn(pod_worker(ctx.clone(), p.clone(), rx));
                workers.insert(uid.clone(), Worker { tx, handle });
            }
            if p.metadata.deletion_timestamp.is_some()
                && let Some(w) = workers.get(uid)
                && *w.tx.borrow() == Ctl::Run
            {
                let _ = w.tx.send(Ctl::Delete);
            }
        }
        for (uid, w) in &workers {
            if !mine.contains_key(uid) && *w.tx.borrow() == Ctl::Run {
                let _ = w.tx.send(Ctl::Stop);
            }
        }
        let finished: Vec<String> = workers
            .iter()
            .filter(|(_, w)| w.handle.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for uid in finished {
            workers.remove(&uid);
            done.insert(uid);
        }
        done.retain(|u| mine.contains_key(u));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What the containers of a pod share.
struct PodEnv {
    ctx: SharedCtx,
    ns: String,
    name: String,
    uid: String,
    ip: Ipv4Addr,
    netns: String,
    dir: PathBuf,
    hostname: String,
    initial: Arc<Pod>,
    volumes: Mutex<HashMap<String, crate::volumes::Vol>>,
}

impl PodEnv {
    fn pod(&self) -> Arc<Pod> {
        self.ctx
            .pods
            .get(&ObjectRef::<Pod>::new(&self.name).within(&self.ns))
            .filter(|p| p.metadata.uid.as_deref() == Some(self.uid.as_str()))
            .unwrap_or_else(|| self.initial.clone())
    }
    fn grace(&self) -> Duration {
        let p = self.pod();
        let g = p
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30)
            .max(0) as u64;
        Duration::from_secs(g)
    }
}

#[derive(Default)]
struct CState {
    state: Value,
    last_state: Value,
    restart_count: i32,
    ready: bool,
    started: bool,
    pid: Option<i32>,
    env: Vec<(String, String)>,
    container_id: String,
    program: String,
    /// finished for good (restart policy says no more restarts)
    finished: Option<i32>,
}

struct Runner {
    name: String,
    image: String,
    shared: Arc<Mutex<CState>>,
    stop: watch::Sender<Option<Duration>>,
    handle: tokio::task::JoinHandle<()>,
}

fn waiting(reason: &str, message: &str) -> Value {
    if message.is_empty() {
        json!({"waiting": {"reason": reason}})
    } else {
        json!({"waiting": {"reason": reason, "message": message}})
    }
}

async fn pod_worker(ctx: SharedCtx, pod: Arc<Pod>, mut rx: watch::Receiver<Ctl>) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let dir = ctx
        .data_dir
        .join("pods")
        .join(format!("{ns}_{name}_{}", &uid[..uid.len().min(8)]));
    tracing::info!("pod {ns}/{name}: starting");
    let ip = loop {
        if let Some(ip) = ctx
            .ipam
            .lock()
            .unwrap()
            .allocate_for(&format!("{ns}/{name}"))
        {
            break ip;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut netns = String::new();
    let mut last_err = String::new();
    // sandbox
    while *rx.borrow() == Ctl::Run {
        let r: Result<String> = async {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(
                dir.join("resolv.conf"),
                "# local-kubelet: no DNS server, names come from /etc/hosts\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
            )?;
            net::setup_pod(ip).await
        }
        .await;
        match r {
            Ok(n) => {
                // the pod's NetworkPolicy rules are in place before any of its containers runs
                crate::policy::register(&ctx, &uid, &ns, &name, &n).await;
                netns = n;
                break;
            }
            Err(e) => {
                let m = format!("failed to create pod sandbox: {e}");
                if m != last_err {
                    tracing::warn!("pod {ns}/{name}: {m}");
                    last_err = m;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
    let env = Arc::new(PodEnv {
        ctx: ctx.clone(),
        ns: ns.clone(),
        name: name.clone(),
        uid: uid.clone(),
        ip,
        netns,
        dir: dir.clone(),
        hostname: hosts::pod_hostname(&pod),
        initial: pod.clone(),
        volumes: Mutex::new(HashMap::new()),
    });
    let start_time = util::now();
    let mut vols = VolumeState::default();
    let mut volumes_ready = false;
    let mut volume_error = String::new();
    let spec = pod.spec.clone().unwrap_or_default();
    let restart_policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let init_specs: Vec<Container> = spec.init_containers.clone().unwrap_or_default();
    let main_specs: Vec<Container> = spec.containers.clone();
    let mut init_runners: Vec<Runner> = Vec::new();
    let mut main_runners: Vec<Runner> = Vec::new();
    let mut last_status = Value::Null;
    let hosts_path = dir.join("hosts");
    let mut hosts_written: Option<((u64, u64), Instant)> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(1000));
    let mut ctl = *rx.borrow();
    while ctl == Ctl::Run {
        tokio::select! {
            _ = tick.tick() => {}
            r = rx.changed() => { if r.is_err() { ctl = Ctl::Stop; break; } }
        }
        ctl = *rx.borrow();
        if ctl != Ctl::Run {
            break;
        }
        let cur = env.pod();
        // a hollow server resolves no name: its hosts file is written once; the others' are
        // rendered again when what they are made of changed (and at least once a minute,
        // should the file have been changed behind the agent's back)
        if !crate::hollow::is_hollow(&cur) || !hosts_path.exists() {
            let ip = ip.to_string();
            let print = (
                hosts::world_fingerprint(&ctx),
                hosts::own_fingerprint(&cur, &ip),
            );
            if hosts_written
                .is_none_or(|(p, at)| p != print || at.elapsed() >= Duration::from_secs(60))
                && hosts::write_in_place(&hosts_path, &hosts::render(&ctx, &cur, &ip)).is_ok()
            {
                hosts_written = Some((print, Instant::now()));
            }
        }
        match vols.sync(&ctx, &cur, &dir).await {
            Ok(()) => {
                volumes_ready = true;
                volume_error.clear();
                *env.volumes.lock().unwrap() = vols.vols.clone();
            }
            Err(e) => {
                let m = format!("{e:#}");
                if m != volume_error {
                    tracing::warn!("pod {ns}/{name}: volumes: {m}");
                    volume_error = m;
                }
            }
        }
        if volumes_ready {
            // init containers one after the other, then the containers
            let init_done = init_runners.len() == init_specs.len()
                && init_runners
                    .iter()
                    .zip(&init_specs)
                    .all(|(r, c)| init_complete(r, c));
            if init_runners.len() < init_specs.len() {
                let n = init_runners.len();
                let prev_ok = n == 0 || init_complete(&init_runners[n - 1], &init_specs[n - 1]);
                if prev_ok {
                    let c = init_specs[init_runners.len()].clone();
                    let policy = if c.restart_policy.as_deref() == Some("Always") {
                        "Always" // a sidecar: keeps running beside the containers
                    } else if restart_policy == "Never" {
                        "Never"
                    } else {
                        "OnFailure"
                    };
                    init_runners.push(spawn_runner(env.clone(), c, policy.to_string()));
                }
            } else if init_done && main_runners.is_empty() {
                for c in &main_specs {
                    main_runners.push(spawn_runner(env.clone(), c.clone(), restart_policy.clone()));
                }
            }
        }
        let status = pod_status(
            &cur,
            &ip.to_string(),
            &start_time,
            &init_specs,
            &main_specs,
            &init_runners,
            &main_runners,
            if volumes_ready { "" } else { &volume_error },
        );
        if status != last_status {
            let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
            match api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
            {
                Ok(_) => last_status = status,
                Err(e) => tracing::debug!("pod {ns}/{name}: status: {e}"),
            }
        }
    }
    // stop
    let mut grace = env.grace();
    if ctl == Ctl::Stop && ctx.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        grace = grace.min(Duration::from_secs(10));
    }
    tracing::info!(
        "pod {ns}/{name}: stopping (grace {}s, {:?})",
        grace.as_secs(),
        ctl
    );
    for r in main_runners.iter().chain(init_runners.iter()) {
        let _ = r.stop.send(Some(grace));
    }
    for r in main_runners.into_iter().chain(init_runners) {
        let _ = tokio::time::timeout(grace + Duration::from_secs(15), r.handle).await;
    }
    crate::policy::unregister(&ctx, &uid);
    net::teardown_pod(ip).await;
    ctx.ipam.lock().unwrap().release(ip);
    let _ = std::fs::remove_dir_all(&dir);
    if ctl == Ctl::Delete {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => tracing::info!("pod {ns}/{name}: deleted"),
            Err(e) => tracing::warn!("pod {ns}/{name}: delete: {e}"),
        }
    } else {
        tracing::info!("pod {ns}/{name}: stopped");
    }
}

/// An init container is done when it exited 0; a sidecar (restartPolicy Always) once started.
fn init_complete(r: &Runner, c: &Container) -> bool {
    let s = r.shared.lock().unwrap();
    s.finished == Some(0)
        || (c.restart_policy.as_deref() == Some("Always") && s.started && s.pid.is_some())
}

#[allow(clippy::too_many_arguments)]
fn pod_status(
    cur: &Pod,
    ip: &str,
    start_time: &str,
    init_specs: &[Container],
    main_specs: &[Container],
    init_runners: &[Runner],
    main_runners: &[Runner],
    volume_error: &str,
) -> Value {
    let cs_json = |specs: &[Container], runners: &[Runner], init: bool| -> Vec<Value> {
        specs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if let Some(r) = runners.get(i) {
                    let s = r.shared.lock().unwrap();
                    let mut v = json!({
                        "name": r.name, "image": r.image,
                        "imageID": format!("local-kubelet://{}", s.program),
                        "ready": s.ready, "started": s.started,
                        "restartCount": s.restart_count,
                        "state": s.state, "lastState": s.last_state,
                    });
                    if !s.container_id.is_empty() {
                        v["containerID"] = json!(s.container_id);
                    }
                    v
                } else {
                    let reason = if init || !volume_error.is_empty() {
                        if init { "PodInitializing" } else { "ContainerCreating" }
                    } else {
                        "PodInitializing"
                    };
                    json!({"name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                        "ready": false, "started": false, "restartCount": 0,
                        "state": waiting(reason, volume_error), "lastState": {}})
                }
            })
            .collect()
    };
    let init_statuses = cs_json(init_specs, init_runners, true);
    let main_statuses = cs_json(main_specs, main_runners, false);
    let init_done = init_runners.len() == init_specs.len()
        && init_runners
            .iter()
            .zip(init_specs)
            .all(|(r, c)| init_complete(r, c));
    let init_failed = init_runners.iter().any(|r| {
        let f = r.shared.lock().unwrap().finished;
        f.is_some() && f != Some(0)
    });
    let all_ready = !main_runners.is_empty()
        && main_runners.len() == main_specs.len()
        && main_runners.iter().all(|r| r.shared.lock().unwrap().ready);
    let not_ready: Vec<String> = main_specs
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            main_runners
                .get(*i)
                .map(|r| !r.shared.lock().unwrap().ready)
                .unwrap_or(true)
        })
        .map(|(_, c)| c.name.clone())
        .collect();
    let finished: Vec<Option<i32>> = main_runners
        .iter()
        .map(|r| r.shared.lock().unwrap().finished)
        .collect();
    let never_started = main_runners.len() < main_specs.len()
        || main_runners.iter().any(|r| {
            let s = r.shared.lock().unwrap();
            s.container_id.is_empty()
        });
    let phase = if init_failed {
        "Failed"
    } else if !finished.is_empty()
        && finished.len() == main_specs.len()
        && finished.iter().all(|f| f.is_some())
    {
        if finished.iter().all(|f| *f == Some(0)) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if never_started {
        "Pending"
    } else {
        "Running"
    };
    // conditions keep their transition time while their status is unchanged
    let old: Vec<Value> = cur
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| serde_json::to_value(c).unwrap_or_default())
        .collect();
    let now = util::now();
    let cond = |ty: &str, ok: bool, reason: &str, msg: &str| -> Value {
        let st = if ok { "True" } else { "False" };
        let t = old
            .iter()
            .find(|c| c["type"] == ty && c["status"] == st)
            .and_then(|c| c["lastTransitionTime"].as_str().map(String::from))
            .unwrap_or_else(|| now.clone());
        let mut v =
            json!({"type": ty, "status": st, "lastProbeTime": null, "lastTransitionTime": t});
        if !ok && !reason.is_empty() {
            v["reason"] = json!(reason);
            v["message"] = json!(msg);
        }
        v
    };
    let nr_msg = format!("containers with unready status: [{}]", not_ready.join(" "));
    let mut conditions = vec![
        cond("PodReadyToStartContainers", true, "", ""),
        cond(
            "Initialized",
            init_done,
            "ContainersNotInitialized",
            "containers with incomplete status: init containers",
        ),
        cond("ContainersReady", all_ready, "ContainersNotReady", &nr_msg),
    ];
    // readiness gates: conditions set by others must be True too
    let gates: Vec<String> = cur
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.condition_type)
        .collect();
    let open_gates: Vec<&String> = gates
        .iter()
        .filter(|g| {
            !old.iter()
                .any(|c| c["type"] == g.as_str() && c["status"] == "True")
        })
        .collect();
    if all_ready && !open_gates.is_empty() {
        let msg = format!(
            "corresponding condition of pod readiness gate {:?} does not exist or is not True",
            open_gates
        );
        conditions.push(cond("Ready", false, "ReadinessGatesNotReady", &msg));
    } else {
        conditions.push(cond("Ready", all_ready, "ContainersNotReady", &nr_msg));
    }
    // conditions owned by others (PodScheduled, DisruptionTarget, readiness gates, …) stay
    const OURS: [&str; 4] = [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
    ];
    for c in &old {
        if !OURS.iter().any(|o| c["type"] == *o) {
            conditions.push(c.clone());
        }
    }
    let mut st = json!({
        "observedGeneration": cur.metadata.generation,
        "phase": phase,
        "conditions": conditions,
        "hostIP": crate::net::node_ip(), "hostIPs": [{"ip": crate::net::node_ip()}],
        "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": start_time,
        "containerStatuses": main_statuses,
    });
    if !init_specs.is_empty() {
        st["initContainerStatuses"] = json!(init_statuses);
    }
    st
}

fn spawn_runner(env: Arc<PodEnv>, c: Container, policy: String) -> Runner {
    let shared = Arc::new(Mutex::new(CState {
        state: waiting("ContainerCreating", ""),
        last_state: json!({}),
        ..Default::default()
    }));
    let (tx, rx) = watch::channel(None);
    let name = c.name.clone();
    let image = c.image.clone().unwrap_or_default();
    let handle = tokio::spawn(run_container(env, c, policy, shared.clone(), rx));
    Runner {
        name,
        image,
        shared,
        stop: tx,
        handle,
    }
}

enum PrepErr {
    Image(String),
    Config(String),
    /// the runtime cannot start the command (e.g. no shell in a distroless image)
    Start(String),
}

struct Launch {
    script: PathBuf,
    env: Vec<(String, String)>,
    program: String,
    /// A Keeper member: its runtime membership changes ([`keeper::follow_membership`]).
    membership: Option<keeper::MembershipWatch>,
}

/// ZooKeeper's classpath: Debian's `zookeeper.jar` (its manifest lists its dependencies), one
/// SLF4J binding (log4j 1.2, configured by the member's `log4j.properties`) and the
/// configuration folder. Not `/usr/share/java/*`: that holds six SLF4J bindings, of which the
/// no-op one won, and the members logged nothing.
const ZOOKEEPER_CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar:/etc/zookeeper/conf";

/// Makes every mount of the container's namespace read-only but those in `$lk_keep` and the
/// kernel's own (proc, sys, dev, cgroup, …); run as root before the program starts.
const READ_ONLY_ROOT: &str = r#"mapfile -t lk_mounts < /proc/self/mountinfo
for lk_l in "${lk_mounts[@]}"; do
  read -r -a lk_f <<< "$lk_l"
  lk_mp=$(printf '%b' "${lk_f[4]}")
  lk_fs=${lk_l#* - }; lk_fs=${lk_fs%% *}
  case "$lk_fs" in proc|sysfs|devtmpfs|devpts|mqueue|cgroup|cgroup2|nsfs|debugfs|tracefs|securityfs|pstore|bpf|fusectl|configfs|hugetlbfs|autofs|binfmt_misc|efivarfs|rpc_pipefs) continue ;; esac
  case "$lk_mp" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) continue ;; esac
  case "$lk_keep" in *$'\n'"$lk_mp"$'\n'*) continue ;; esac
  case ",${lk_f[5]}," in *,ro,*) continue ;; esac
  mount -o remount,bind,ro "$lk_mp" 2>/dev/null || :
done
unset lk_l lk_f lk_mp lk_fs lk_keep lk_mounts
"#;

const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

async fn run_container(
    env: Arc<PodEnv>,
    c: Container,
    policy: String,
    shared: Arc<Mutex<CState>>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let ctx = env.ctx.clone();
    // container logs outlive the pod (for post-mortems): <log dir>/<ns>_<pod>_<uid8>/<container>.log
    let log_dir = ctx.log_dir.join(env.dir.file_name().unwrap_or_default());
    let _ = std::fs::create_dir_all(&log_dir);
    let log_path = log_dir.join(format!("{}.log", c.name));
    let mut backoff = Duration::ZERO;
    let mut starts = 0;
    let id = format!("{}/{}/{}", env.ns, env.name, c.name);
    let mut last_event = String::new();
    loop {
        if stop.borrow().is_some() {
            break;
        }
        let pod = env.pod();
        let launch = match prepare(&env, &pod, &c).await {
            Ok(l) => l,
            Err(PrepErr::Image(m)) => {
                if last_event != m {
                    event(
                        &env,
                        "Warning",
                        "Failed",
                        Some(&c.name),
                        format!(
                            "Failed to pull image {:?}: {m}",
                            c.image.clone().unwrap_or_default()
                        ),
                    );
                    last_event = m.clone();
                }
                shared.lock().unwrap().state = waiting("ErrImagePull", &m);
                wait_stop(&mut stop, Duration::from_secs(10)).await;
                continue;
            }
            Err(PrepErr::Config(m)) => {
                if last_event != m {
                    event(
                        &env,
                        "Warning",
                        "Failed",
                        Some(&c.name),
                        format!("Error: {m}"),
                    );
                    last_event = m.clone();
                }
                shared.lock().unwrap().state = waiting("CreateContainerConfigError", &m);
                wait_stop(&mut stop, Duration::from_secs(2)).await;
                continue;
            }
            Err(PrepErr::Start(m)) => {
                // as containerd reports a command the image cannot run
                let m = format!(
                    "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: {m}: unknown"
                );
                if last_event != m {
                    event(
                        &env,
                        "Warning",
                        "Failed",
                        Some(&c.name),
                        format!("Error: {m}"),
                    );
                    last_event = m.clone();
                }
                shared.lock().unwrap().state = waiting("RunContainerError", &m);
                wait_stop(&mut stop, Duration::from_secs(10)).await;
                continue;
            }
        };
        if starts == 0 {
            pulled(&env, &pod, &c);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path);
        let (out, err) = match log.and_then(|f| Ok((f.try_clone()?, f))) {
            Ok((a, b)) => (std::process::Stdio::from(a), std::process::Stdio::from(b)),
            Err(_) => (std::process::Stdio::null(), std::process::Stdio::null()),
        };
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &env.netns, "unshare", "--mount", "--uts"])
            .args(["--propagation", "private", "--", "/bin/bash"])
            .arg(&launch.script)
            .env_clear()
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        if starts > 0 {
            shared.lock().unwrap().restart_count += 1;
        }
        starts += 1;
        let started_at = util::now();
        let t0 = Instant::now();
        let mut child = match cmd.spawn() {
            Ok(ch) => ch,
            Err(e) => {
                shared.lock().unwrap().state = waiting("RunContainerError", &e.to_string());
                wait_stop(&mut stop, Duration::from_secs(5)).await;
                continue;
            }
        };
        let pid = child.id().unwrap_or(0) as i32;
        let container_id = format!("local://{}-{}", env.uid, pid);
        tracing::info!("container {id}: started {} (pid {pid})", launch.program);
        last_event.clear();
        event(
            &env,
            "Normal",
            "Started",
            Some(&c.name),
            format!("Started container {}", c.name),
        );
        {
            let mut s = shared.lock().unwrap();
            s.state = json!({"running": {"startedAt": started_at}});
            s.pid = Some(pid);
            s.ready = false;
            s.started = c.startup_probe.is_none();
            s.env = launch.env.clone();
            s.container_id = container_id.clone();
            s.program = launch.program.clone();
        }
        let (kill_tx, mut kill_rx) = mpsc::channel::<String>(1);
        let probe_task = tokio::spawn(probe_loop(
            env.clone(),
            c.clone(),
            shared.clone(),
            pid,
            launch.env.clone(),
            kill_tx,
        ));
        let membership_task = launch
            .membership
            .clone()
            .map(|w| tokio::spawn(keeper::follow_membership(w)));
        let mut stopping = false;
        let mut killed_reason: Option<String> = None;
        let status = tokio::select! {
            s = child.wait() => s.ok(),
            g = async { stop.wait_for(|s| s.is_some()).await.ok().and_then(|r| *r) } => {
                stopping = true;
                let grace = g.unwrap_or(Duration::from_secs(30));
                event(&env, "Normal", "Killing", Some(&c.name), format!("Stopping container {}", c.name));
                probe_task.abort();
                terminate(&env, &c, pid, grace, &mut child, &launch.env, true).await
            }
            Some(why) = kill_rx.recv() => {
                tracing::info!("container {id}: {why}; restarting");
                event(&env, "Warning", "Unhealthy", Some(&c.name), why.clone());
                event(&env, "Normal", "Killing", Some(&c.name), format!("Container {} failed its probe, will be restarted", c.name));
                killed_reason = Some(why);
                probe_task.abort();
                let grace = env.grace();
                terminate(&env, &c, pid, grace, &mut child, &launch.env, true).await
            }
        };
        probe_task.abort();
        if let Some(t) = membership_task {
            t.abort();
        }
        let code = status
            .map(|s| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9)))
            .unwrap_or(137);
        let ran = t0.elapsed();
        let message = termination_message(
            &env.dir.join("containers").join(&c.name),
            &c,
            code,
            &log_path,
        );
        let mut term = json!({"terminated": {
            "exitCode": code,
            "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": started_at, "finishedAt": util::now(),
            "containerID": container_id,
        }});
        if let Some(m) = message {
            term["terminated"]["message"] = json!(m);
        }
        tracing::info!(
            "container {id}: exited with {code} after {}s",
            ran.as_secs()
        );
        // what is left of the process group goes too
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        {
            let mut s = shared.lock().unwrap();
            s.pid = None;
            s.ready = false;
            s.started = false;
        }
        if stopping {
            shared.lock().unwrap().state = term;
            break;
        }
        let restart = match policy.as_str() {
            "Always" => true,
            "OnFailure" => code != 0 || killed_reason.is_some(),
            _ => false,
        };
        if !restart {
            {
                let mut s = shared.lock().unwrap();
                s.state = term;
                s.finished = Some(code);
            }
            // stays terminated until the pod goes
            let _ = stop.wait_for(|s| s.is_some()).await;
            break;
        }
        if ran >= Duration::from_secs(600) {
            backoff = Duration::ZERO;
        }
        {
            let mut s = shared.lock().unwrap();
            s.last_state = term;
        }
        if !backoff.is_zero() {
            event(
                &env,
                "Warning",
                "BackOff",
                Some(&c.name),
                format!(
                    "Back-off restarting failed container {} in pod {}_{}({})",
                    c.name, env.name, env.ns, env.uid
                ),
            );
            shared.lock().unwrap().state = waiting(
                "CrashLoopBackOff",
                &format!(
                    "back-off {}s restarting failed container={} pod={}_{}({})",
                    backoff.as_secs(),
                    c.name,
                    env.name,
                    env.ns,
                    env.uid
                ),
            );
            wait_stop(&mut stop, backoff).await;
        }
        backoff = if backoff.is_zero() {
            BACKOFF_START
        } else {
            (backoff * 2).min(BACKOFF_MAX)
        };
    }
    let _ = ctx;
}

/// What the container wrote to its termination message file (at most 4096 bytes), or with
/// `FallbackToLogsOnError` and a failure, the end of its log (at most 80 lines, 2048 bytes), as
/// the kubelet reports them.
fn termination_message(cdir: &Path, c: &Container, code: i32, log: &Path) -> Option<String> {
    let written = std::fs::read(cdir.join("termination-log")).unwrap_or_default();
    if !written.is_empty() {
        let end = written.len().min(4096);
        return Some(String::from_utf8_lossy(&written[..end]).into_owned());
    }
    if code == 0 || c.termination_message_policy.as_deref() != Some("FallbackToLogsOnError") {
        return None;
    }
    let text = std::fs::read(log).unwrap_or_default();
    let tail = &text[text.len().saturating_sub(2048)..];
    let tail = String::from_utf8_lossy(tail);
    let lines: Vec<&str> = tail.lines().collect();
    let from = lines.len().saturating_sub(80);
    Some(lines[from..].join("\n")).filter(|m| !m.is_empty())
}

/// A core/v1 Event about the pod, as the kubelet records them (fire and forget).
/// What a kubelet records when it has a container's image: the programs of this machine are
/// always "present", so `Pulled` names the image and the pod's pull secrets it would have used;
/// a pull secret that does not exist gets the kubelet's own warning
/// (`FailedToRetrieveImagePullSecret`) and, as there, the container still starts.
fn pulled(env: &PodEnv, pod: &Pod, c: &Container) {
    let names: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .map(|r| r.name.clone())
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| {
            env.ctx
                .secrets
                .get(&ObjectRef::<k8s_openapi::api::core::v1::Secret>::new(n).within(&env.ns))
                .is_none()
        })
        .collect();
    if !missing.is_empty() {
        let list: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        event(
            env,
            "Warning",
            "FailedToRetrieveImagePullSecret",
            Some(&c.name),
            format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                list.join(", ")
            ),
        );
    }
    let with = if names.is_empty() {
        String::new()
    } else {
        format!(" (image pull secrets: {})", names.join(", "))
    };
    event(
        env,
        "Normal",
        "Pulled",
        Some(&c.name),
        format!(
            "Container image {:?} already present on machine{with}",
            c.image.clone().unwrap_or_default()
        ),
    );
}

fn event(env: &PodEnv, kind: &str, reason: &str, container: Option<&str>, message: String) {
    let ctx = env.ctx.clone();
    let ns = env.ns.clone();
    let now = chrono::Utc::now();
    let t = util::now();
    let micro = now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let mut involved = json!({"apiVersion": "v1", "kind": "Pod", "namespace": ns,
        "name": env.name, "uid": env.uid});
    if let Some(c) = container {
        involved["fieldPath"] = json!(format!("spec.containers{{{c}}}"));
    }
    let ev = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{}.{:x}", env.name, now.timestamp_nanos_opt().unwrap_or_default()), "namespace": ns},
        "involvedObject": involved, "reason": reason, "message": message, "type": kind,
        "source": {"component": "kubelet", "host": ctx.node},
        "reportingComponent": "kubelet", "reportingInstance": ctx.node,
        "firstTimestamp": t, "lastTimestamp": t, "eventTime": micro, "count": 1,
        "action": reason
    });
    tokio::spawn(async move {
        let Ok(ev) = serde_json::from_value::<k8s_openapi::api::core::v1::Event>(ev) else {
            return;
        };
        let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(ctx.client.clone(), &ns);
        let _ = api.create(&kube::api::PostParams::default(), &ev).await;
    });
}

async fn wait_stop(stop: &mut watch::Receiver<Option<Duration>>, d: Duration) {
    let _ = tokio::time::timeout(d, stop.wait_for(|s| s.is_some())).await;
}

/// preStop (exec), SIGTERM to the process group, SIGKILL after the grace period.
async fn terminate(
    env: &PodEnv,
    c: &Container,
    pid: i32,
    grace: Duration,
    child: &mut tokio::process::Child,
    cenv: &[(String, String)],
    pre_stop: bool,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + grace;
    if pre_stop
        && let Some(cmd) = c
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|h| h.exec.as_ref())
            .and_then(|e| e.command.clone())
    {
        tracing::info!("container {}/{}: preStop", env.name, c.name);
        let _ = tokio::time::timeout(grace, probes::exec_in(pid, &cmd, cenv)).await;
    }
    unsafe {
        libc::kill(-pid, libc::SIGTERM);
        libc::kill(pid, libc::SIGTERM);
    }
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
            child.wait().await.ok()
        }
    }
}

async fn probe_loop(
    env: Arc<PodEnv>,
    c: Container,
    shared: Arc<Mutex<CState>>,
    pid: i32,
    cenv: Vec<(String, String)>,
    kill: mpsc::Sender<String>,
) {
    let ip = env.ip.to_string();
    let t0 = Instant::now();
    let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(0) as u64);
    // startup
    if let Some(p) = &c.startup_probe {
        tokio::time::sleep(secs(p.initial_delay_seconds, 0)).await;
        let mut fails = 0;
        loop {
            match probes::run(p, &c, &ip, pid, &cenv).await {
                Ok(()) => break,
                Err(e) => {
                    fails += 1;
                    if fails >= p.failure_threshold.unwrap_or(3) {
                        let _ = kill.send(format!("Startup probe failed: {e}")).await;
                        return;
                    }
                }
            }
            tokio::time::sleep(secs(p.period_seconds, 10)).await;
        }
    }
    shared.lock().unwrap().started = true;
    let readiness = c.readiness_probe.clone();
    let liveness = c.liveness_probe.clone();
    if readiness.is_none() {
        shared.lock().unwrap().ready = true;
    }
    let r = {
        let (c, ip, cenv, shared) = (c.clone(), ip.clone(), cenv.clone(), shared.clone());
        async move {
            let Some(p) = readiness else { return };
            let delay = secs(p.initial_delay_seconds, 0).saturating_sub(t0.elapsed());
            tokio::time::sleep(delay).await;
            let (mut ok, mut bad) = (0, 0);
            loop {
                match probes::run(&p, &c, &ip, pid, &cenv).await {
                    Ok(()) => {
                        ok += 1;
                        bad = 0;
                        if ok >= p.success_threshold.unwrap_or(1) {
                            shared.lock().unwrap().ready = true;
                        }
                    }
                    Err(_) => {
                        bad += 1;
                        ok = 0;
                        if bad >= p.failure_threshold.unwrap_or(3) {
                            shared.lock().unwrap().ready = false;
                        }
                    }
                }
                // probe faster until first ready, like the kubelet's first probes right away
                let period = secs(p.period_seconds, 10);
                let ready = shared.lock().unwrap().ready;
                tokio::time::sleep(if ready {
                    period
                } else {
                    period.min(Duration::from_secs(1))
                })
                .await;
            }
        }
    };
    let l = async move {
        let Some(p) = liveness else { return };
        let delay = secs(p.initial_delay_seconds, 0).saturating_sub(t0.elapsed());
        tokio::time::sleep(delay).await;
        let mut bad = 0;
        loop {
            match probes::run(&p, &c, &ip, pid, &cenv).await {
                Ok(()) => bad = 0,
                Err(e) => {
                    bad += 1;
                    if bad >= p.failure_threshold.unwrap_or(3) {
                        let _ = kill.send(format!("Liveness probe failed: {e}")).await;
                        return;
                    }
                }
            }
            tokio::time::sleep(secs(p.period_seconds, 10)).await;
        }
    };
    tokio::join!(r, l);
}

fn run_as(pod: &Pod, c: &Container, default_user: &str) -> (u32, u32, String) {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = c.security_context.as_ref();
    let uid = csc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    let gid = csc
        .and_then(|s| s.run_as_group)
        .or_else(|| psc.and_then(|s| s.run_as_group));
    let (u, g, home) = match uid {
        Some(u) => match util::user_by_uid(u as u32) {
            Some((_, g, h)) => (u as u32, g, h),
            None => (u as u32, u as u32, "/".into()),
        },
        None => util::lookup_user(default_user).unwrap_or((0, 0, "/root".into())),
    };
    (u, gid.map(|g| g as u32).unwrap_or(g), home)
}

fn container_env(
    env: &PodEnv,
    pod: &Pod,
    c: &Container,
) -> std::result::Result<Vec<(String, String)>, String> {
    let ctx = &env.ctx;
    let ns = &env.ns;
    let kip = ctx
        .services
        .get(&ObjectRef::<Service>::new("kubernetes").within("default"))
        .and_then(|s| s.spec.as_ref().and_then(|s| s.cluster_ip.clone()))
        .unwrap_or_else(|| "198.19.0.1".into());
    let mut out: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOSTNAME".into(), env.hostname.clone()),
        ("KUBERNETES_SERVICE_HOST".into(), kip.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), "443".into()),
        ("KUBERNETES_PORT".into(), format!("tcp://{kip}:443")),
        ("KUBERNETES_PORT_443_TCP".into(), format!("tcp://{kip}:443")),
        ("KUBERNETES_PORT_443_TCP_PROTO".into(), "tcp".into()),
        ("KUBERNETES_PORT_443_TCP_PORT".into(), "443".into()),
        ("KUBERNETES_PORT_443_TCP_ADDR".into(), kip),
    ];
    let cm = |name: &str| {
        ctx.configmaps
            .get(&ObjectRef::<ConfigMap>::new(name).within(ns))
    };
    let secret = |name: &str| ctx.secrets.get(&ObjectRef::<Secret>::new(name).within(ns));
    for ef in c.env_from.iter().flatten() {
        let prefix = ef.prefix.clone().unwrap_or_default();
        if let Some(r) = &ef.config_map_ref {
            match cm(&r.name) {
                Some(m) => {
                    for (k, v) in m.data.iter().flatten() {
                        out.push((format!("{prefix}{k}"), v.clone()));
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => return Err(format!("configmap \"{}\" not found", r.name)),
            }
        }
        if let Some(r) = &ef.secret_ref {
            match secret(&r.name) {
                Some(s) => {
                    for (k, v) in s.data.iter().flatten() {
                        out.push((
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        ));
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => return Err(format!("secret \"{}\" not found", r.name)),
            }
        }
    }
    let mut pod_with_ip = pod.clone();
    pod_with_ip
        .status
        .get_or_insert_with(Default::default)
        .pod_ip = Some(env.ip.to_string());
    for e in c.env.iter().flatten() {
        let v = if let Some(v) = &e.value {
            util::expand(v, &out)
        } else if let Some(vf) = &e.value_from {
            if let Some(f) = &vf.field_ref {
                crate::volumes::field_value(&pod_with_ip, &f.field_path)
                    .map_err(|e| e.to_string())?
            } else if let Some(r) = &vf.config_map_key_ref {
                match cm(&r.name).and_then(|m| m.data.as_ref().and_then(|d| d.get(&r.key).cloned()))
                {
                    Some(v) => v,
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(format!(
                            "couldn't find key {} in ConfigMap {ns}/{}",
                            r.key, r.name
                        ));
                    }
                }
            } else if let Some(r) = &vf.secret_key_ref {
                match secret(&r.name).and_then(|s| {
                    s.data
                        .as_ref()
                        .and_then(|d| d.get(&r.key))
                        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                }) {
                    Some(v) => v,
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(format!(
                            "couldn't find key {} in Secret {ns}/{}",
                            r.key, r.name
                        ));
                    }
                }
            } else if let Some(r) = &vf.resource_field_ref {
                c.resources
                    .as_ref()
                    .and_then(|res| {
                        let (k, n) = r.resource.split_once('.')?;
                        if k == "limits" {
                            res.limits.as_ref()
                        } else {
                            res.requests.as_ref()
                        }
                        .and_then(|m| m.get(n))
                        .map(|q| q.0.clone())
                    })
                    .unwrap_or_else(|| "0".into())
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        out.push((e.name.clone(), v));
    }
    Ok(out)
}

struct Mount {
    src: PathBuf,
    target: String,
    ro: bool,
    /// stays writable under `readOnlyRootFilesystem` (a volume, an image VOLUME given its own
    /// folder, the agent's own files); the rest is the image's root filesystem
    keep: bool,
}

/// Where a path of the container is on the machine, through the deepest mount that holds it.
fn host_path(mounts: &[&Mount], p: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .filter(|m| m.target == p || p.starts_with(&format!("{}/", m.target)))
        .max_by_key(|m| m.target.len())
        .map(|m| {
            let rel = p[m.target.len()..].trim_start_matches('/');
            if rel.is_empty() {
                m.src.clone()
            } else {
                m.src.join(rel)
            }
        })
        .or_else(|| Some(PathBuf::from(p)))
}

async fn prepare(env: &PodEnv, pod: &Pod, c: &Container) -> std::result::Result<Launch, PrepErr> {
    let ctx = &env.ctx;
    let image = c.image.clone().unwrap_or_default();
    // an image of the store runs from its own root filesystem (oci.rs); others are programs
    // of this machine (images.rs)
    let stored = match ctx.image_store.as_deref() {
        Some(store) => oci::find(store, &image)
            .map_err(PrepErr::Image)?
            .map(|img| oci::unpack(&img, &ctx.data_dir).map(|rootfs| (img, rootfs)))
            .transpose()
            .map_err(PrepErr::Image)?,
        None => None,
    };
    let kind = if stored.is_some() {
        Kind::Unknown
    } else {
        images::kind(&image)
    };
    if kind == Kind::Unknown && stored.is_none() {
        return Err(PrepErr::Image(format!(
            "image {image:?} cannot run on node {}: local-kubelet runs clickhouse-server, \
             clickhouse-keeper, clickhouse-operator and busybox/debian/ubuntu/alpine/bash images \
             as programs of this machine, and no other image",
            ctx.node
        )));
    }
    let mut cenv = container_env(env, pod, c).map_err(PrepErr::Config)?;
    let default_user = match kind {
        Kind::ClickHouseServer => "clickhouse",
        Kind::Keeper => "zookeeper",
        _ => "root",
    };
    let (mut uid, mut gid, mut home) = run_as(pod, c, default_user);
    if let Some((img, rootfs)) = &stored {
        // the image's Env under the kubelet's variables and the pod's (the image's PATH over
        // the default one), its User unless the pod sets one
        for (i, kv) in img.config.env.iter().enumerate() {
            cenv.insert(1 + i, kv.clone());
        }
        let (iu, ig, ih) = oci::user(rootfs, &img.config.user).map_err(PrepErr::Config)?;
        let sc =
            |f: fn(&k8s_openapi::api::core::v1::SecurityContext) -> Option<i64>,
             p: fn(&k8s_openapi::api::core::v1::PodSecurityContext) -> Option<i64>| {
                c.security_context.as_ref().and_then(f).or_else(|| {
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.security_context.as_ref())
                        .and_then(p)
                })
            };
        if sc(|s| s.run_as_user, |s| s.run_as_user).is_none() {
            (uid, home) = (iu, ih);
            gid = sc(|s| s.run_as_group, |s| s.run_as_group).map_or(ig, |g| g as u32);
        }
    }
    let psc0 = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let non_root = c
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc0.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    let explicit_user = c
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| psc0.and_then(|s| s.run_as_user))
        .is_some();
    if non_root && uid == 0 {
        if kind == Kind::Operator && !explicit_user && stored.is_none() {
            // the operator's image runs as the distroless `nonroot` user
            (uid, gid, home) = (65532, 65532, "/".to_string());
        } else {
            return Err(PrepErr::Config(format!(
                "container has runAsNonRoot and image will run as root (pod: \"{}_{}({})\", container: {})",
                env.name, env.ns, env.uid, c.name
            )));
        }
    }
    if !cenv.iter().any(|(k, _)| k == "HOME") {
        cenv.push(("HOME".into(), home));
    }
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let fs_group = psc.and_then(|s| s.fs_group).map(|g| g as u32);
    let mut groups: Vec<u32> = fs_group.into_iter().collect();
    groups.extend(
        psc.and_then(|s| s.supplemental_groups.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|g| g as u32),
    );
    let cdir = env.dir.join("containers").join(&c.name);
    let _ = std::fs::create_dir_all(&cdir);
    let vols = env.volumes.lock().unwrap().clone();
    // volume mounts
    let mut mounts: Vec<Mount> = Vec::new();
    for vm in c.volume_mounts.iter().flatten() {
        let Some(v) = vols.get(&vm.name) else {
            return Err(PrepErr::Config(format!("volume {} is not ready", vm.name)));
        };
        let mut src = v.path.clone();
        if let Some(sp) = vm.sub_path.clone().filter(|s| !s.is_empty()) {
            let sp = util::expand(&sp, &cenv);
            src = src.join(sp.trim_start_matches('/'));
            if !src.exists() && v.kind != VolKind::Generated {
                let _ = std::fs::create_dir_all(&src);
            }
        }
        if matches!(v.kind, VolKind::EmptyDir | VolKind::Persistent) {
            // as a real fsGroup (or the image's entrypoint) would
            let want_gid = fs_group.unwrap_or(gid);
            let owner = std::fs::metadata(&src).map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.uid(), m.gid())
            });
            if let Ok((ou, og)) = owner
                && (ou != uid || og != want_gid)
            {
                util::chown_recursive(&src, Some(uid), Some(want_gid));
            }
        }
        // configMap, secret, projected and downwardAPI volumes are always read-only
        let ro = vm.read_only.unwrap_or(false) || v.kind == VolKind::Generated;
        mounts.push(Mount {
            src,
            target: vm.mount_path.trim_end_matches('/').to_string(),
            ro,
            keep: true,
        });
    }
    let mounted = |p: &str| mounts.iter().any(|m| m.target == p);
    // a path inside a volume's mount (or the mount itself)
    let covered = |p: &str| {
        mounts.iter().any(|m| {
            m.target == p || p.starts_with(&format!("{}/", m.target)) || m.target.is_empty()
        })
    };
    let ro_root = c
        .security_context
        .as_ref()
        .and_then(|s| s.read_only_root_filesystem)
        .unwrap_or(false);
    let node_mode = std::env::var(images::IMAGE_VOLUMES_ENV).ok();
    let image_volumes = images::ImageVolumes::of(
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(images::IMAGE_VOLUMES_ANNOTATION))
            .map(String::as_str),
        node_mode.as_deref(),
    )
    .map_err(PrepErr::Config)?;
    let distroless = images::is_distroless(&image);
    let mut private: Vec<Mount> = Vec::new();
    // a folder of the image's root filesystem (read-only with readOnlyRootFilesystem), or
    // with `keep` an image VOLUME of its own
    let private_dir = |target: &str, src: PathBuf, keep: bool, private: &mut Vec<Mount>| {
        let _ = std::fs::create_dir_all(&src);
        util::chown_recursive(&src, Some(uid), Some(gid));
        private.push(Mount {
            src,
            target: target.to_string(),
            ro: false,
            keep,
        });
    };
    // The image's declared VOLUMEs that no pod volume covers: with containerd a writable
    // folder of their own; with CRI-O (`mkdir`) or `ignore` the image's folder, part of its
    // root filesystem.
    for (i, v) in images::declared_volumes(kind).iter().enumerate() {
        if covered(v) {
            continue;
        }
        let keep = image_volumes == images::ImageVolumes::Containerd;
        private_dir(
            v,
            cdir.join(format!("image-volume-{i}")),
            keep,
            &mut private,
        );
    }
    // the image's own /tmp (a container's /tmp is never the machine's)
    if matches!(kind, Kind::ClickHouseServer | Kind::Keeper) && !covered("/tmp") {
        let t = cdir.join("tmp");
        private_dir("/tmp", t.clone(), false, &mut private);
        let _ = std::fs::set_permissions(&t, std::os::unix::fs::PermissionsExt::from_mode(0o1777));
    }
    // the termination message: a fresh file per start, read when the container ends
    let termination = cdir.join("termination-log");
    let _ = std::fs::write(&termination, "");
    util::chown(&termination, Some(uid), Some(gid));
    private.push(Mount {
        src: termination,
        target: c
            .termination_message_path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/dev/termination-log".into()),
        ro: false,
        keep: true,
    });
    let argv: Vec<String>;
    let program: String;
    let mut membership = None;
    let expand_all = |v: &Option<Vec<String>>| -> Vec<String> {
        v.iter().flatten().map(|s| util::expand(s, &cenv)).collect()
    };
    let mut root: Option<PathBuf> = None;
    let mut working_dir = c.working_dir.clone();
    match kind {
        _ if stored.is_some() => {
            let (img, rootfs) = stored.as_ref().expect("checked");
            argv = oci::argv(&img.config, &expand_all(&c.command), &expand_all(&c.args));
            program = format!("{}@{}", images::repository_name(&image), img.digest);
            root = Some(oci::container_root(rootfs, &cdir).map_err(PrepErr::Image)?);
            if working_dir.as_deref().is_none_or(str::is_empty)
                && !img.config.working_dir.is_empty()
            {
                working_dir = Some(img.config.working_dir.clone());
            }
        }
        Kind::ClickHouseServer => {
            if !mounted("/etc/clickhouse-server") {
                let etc = cdir.join("etc-clickhouse-server");
                if !etc.exists() {
                    let _ = util::copy_tree(Path::new("/etc/clickhouse-server"), &etc);
                    let _ = std::fs::create_dir_all(etc.join("config.d"));
                    let _ = std::fs::create_dir_all(etc.join("users.d"));
                    // what the official image adds to config.d
                    let _ = std::fs::write(
                        etc.join("config.d/docker_related_config.xml"),
                        "<clickhouse>\n  <listen_host>::</listen_host>\n  <listen_host>0.0.0.0</listen_host>\n  <listen_try>1</listen_try>\n</clickhouse>\n",
                    );
                }
                private_dir("/etc/clickhouse-server", etc, false, &mut private);
            }
            if !covered("/var/log/clickhouse-server") {
                private_dir(
                    "/var/log/clickhouse-server",
                    cdir.join("log"),
                    false,
                    &mut private,
                );
            }
            if let Some(cmd) = c.command.as_ref().and_then(|v| v.first()) {
                images::runnable(&image, cmd).map_err(PrepErr::Start)?;
            }
            if crate::hollow::is_hollow(pod) {
                let me = std::env::current_exe()
                    .map_err(|e| PrepErr::Config(format!("the agent's own binary: {e}")))?;
                argv = vec![
                    me.display().to_string(),
                    "hollow-server".into(),
                    "--version".into(),
                    crate::hollow::version_of_tag(&image),
                    "--config-dir".into(),
                    "/etc/clickhouse-server/config.d".into(),
                ];
                program = "hollow-server".into();
            } else {
                // the image's entrypoint, with the folders of the configuration as it is now
                let all_now: Vec<&Mount> = private.iter().chain(mounts.iter()).collect();
                let host = |p: &str| host_path(&all_now, p);
                let mut files = Vec::new();
                if let Some(f) = host("/etc/clickhouse-server/config.xml") {
                    files.push(std::fs::read_to_string(f).unwrap_or_default());
                }
                if let Some(d) = host("/etc/clickhouse-server/config.d") {
                    let mut names: Vec<PathBuf> = std::fs::read_dir(&d)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| {
                            p.extension().is_some_and(|x| x == "xml")
                                && !p
                                    .file_name()
                                    .unwrap_or_default()
                                    .to_string_lossy()
                                    .starts_with('.')
                        })
                        .collect();
                    names.sort();
                    for n in names {
                        files.push(std::fs::read_to_string(n).unwrap_or_default());
                    }
                }
                let dirs = crate::entrypoint::server_dirs(&files);
                // CLICKHOUSE_SKIP_USER_SETUP: images of 25.1 and newer
                let skip = images::version(&image).is_none_or(|v| v >= (25, 1));
                let ep = cdir.join("entrypoint.sh");
                std::fs::write(
                    &ep,
                    crate::entrypoint::server_entrypoint(&dirs, skip, distroless),
                )
                .map_err(|e| PrepErr::Config(format!("writing {}: {e}", ep.display())))?;
                let _ = std::fs::set_permissions(
                    &ep,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                );
                private.push(Mount {
                    src: ep,
                    target: "/entrypoint.sh".into(),
                    ro: true,
                    keep: false,
                });
                argv = vec!["/entrypoint.sh".into()];
                program = "clickhouse-server".into();
            }
        }
        Kind::Keeper => {
            // merge the Keeper XML files the pod mounts under /etc/clickhouse-keeper
            let roots: Vec<PathBuf> = mounts
                .iter()
                .filter(|m| {
                    m.target == "/etc/clickhouse-keeper"
                        || m.target.starts_with("/etc/clickhouse-keeper/")
                })
                .map(|m| m.src.clone())
                .collect();
            let kc = keeper::configured(&roots)
                .map_err(|e| PrepErr::Config(format!("keeper config {e:#}")))?;
            membership = Some(keeper::MembershipWatch {
                roots,
                addr: std::net::SocketAddr::from((env.ip, kc.tcp_port.unwrap_or(9181))),
            });
            if !covered("/var/log/clickhouse-keeper") {
                private_dir(
                    "/var/log/clickhouse-keeper",
                    cdir.join("log"),
                    false,
                    &mut private,
                );
            }
            let state = keeper::state_dir(&kc);
            let cfg =
                keeper::zoo_cfg(&kc, &state).map_err(|e| PrepErr::Config(format!("{e:#}")))?;
            // the files of the emulated Keeper program: part of the image, read-only
            let conf = cdir.join("zookeeper-conf");
            let _ = std::fs::remove_dir_all(&conf);
            let _ = std::fs::create_dir_all(&conf);
            let _ = std::fs::write(conf.join("zoo.cfg"), cfg);
            let _ = std::fs::write(
                conf.join("log4j.properties"),
                "log4j.rootLogger=INFO, CONSOLE\nlog4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
                 log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
                 log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} [myid:%X{myid}] - %-5p [%t:%C{1}@%L] - %m%n\n",
            );
            // The JDK's own security file caches failed name lookups for 10 s: a member that
            // looked a peer up before the peer's pod had an address could not reach it for 10 s
            // more, and sat out the election. Keeper resolves again at each connection attempt.
            let _ = std::fs::write(
                conf.join("dns.security"),
                "networkaddress.cache.ttl=1\nnetworkaddress.cache.negative.ttl=0\n",
            );
            let super_digest = format!(
                "-Dzookeeper.DigestAuthenticationProvider.superDigest={}",
                keeper::SUPER_DIGEST
            );
            let log_dir = format!("-Dzookeeper.log.dir={state}");
            // Keeper's election: a member that finds no leader retries within its election
            // timeout (1–2 s). ZooKeeper's own doubles its wait up to a minute, so a member
            // that started before its peers could sit out most of a minute; bounded here to
            // Keeper's timing. The JVM flags keep the start cheap on a small machine (one GC
            // thread, the quick compiler only), as Keeper's native start is, and write nothing
            // outside Keeper's folders (no /tmp/hsperfdata_*).
            let java: Vec<String> = [
                "/usr/bin/java",
                "-Xmx512m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData",
                "-Dzookeeper.fastleader.maxNotificationInterval=2000",
                "-Dzookeeper.cnxTimeout=2000",
                super_digest.as_str(),
                log_dir.as_str(),
                "-Dzookeeper.root.logger=INFO,CONSOLE",
                "-Djava.security.properties=/etc/zookeeper/conf/dns.security",
                "-cp",
                ZOOKEEPER_CLASSPATH,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let prog = conf.join("clickhouse-keeper");
            let _ = std::fs::write(&prog, crate::entrypoint::keeper_program(&kc, &java));
            let ep = conf.join("entrypoint.sh");
            let _ = std::fs::write(&ep, crate::entrypoint::keeper_entrypoint(distroless));
            for f in [&prog, &ep] {
                let _ = std::fs::set_permissions(
                    f,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                );
            }
            // the mount point of the agent's binary (for the gate)
            let _ = std::fs::write(conf.join("local-kubelet"), "");
            util::chown_recursive(&conf, Some(uid), Some(gid));
            private.push(Mount {
                src: conf,
                target: crate::entrypoint::ZK_CONF.into(),
                ro: false,
                keep: false,
            });
            let me = std::env::current_exe()
                .map_err(|e| PrepErr::Config(format!("the agent's own binary: {e}")))?;
            private.push(Mount {
                src: me,
                target: crate::entrypoint::AGENT_IN_CONTAINER.into(),
                ro: true,
                keep: false,
            });
            if !distroless {
                private.push(Mount {
                    src: ep.clone(),
                    target: "/entrypoint.sh".into(),
                    ro: true,
                    keep: false,
                });
            }
            // the container's command and args as given; none: the image's ENTRYPOINT
            let mut a = expand_all(&c.command);
            if a.is_empty() {
                a.push(if distroless {
                    crate::entrypoint::ZK_CONF.to_string() + "/entrypoint.sh"
                } else {
                    "/entrypoint.sh".into()
                });
            } else {
                images::runnable(&image, &a[0]).map_err(PrepErr::Start)?;
            }
            a.extend(expand_all(&c.args));
            argv = a;
            program = "zookeeper-3.8".into();
        }
        Kind::Operator => {
            let bin = ctx.operator_bin.clone();
            if !bin.exists() {
                return Err(PrepErr::Image(format!(
                    "image {image:?}: the operator binary {} is not built",
                    bin.display()
                )));
            }
            let mut a = vec![bin.to_string_lossy().to_string()];
            let cmd = expand_all(&c.command);
            a.extend(cmd.into_iter().skip(1));
            a.extend(expand_all(&c.args));
            argv = a;
            program = "clickhouse-operator".into();
        }
        Kind::Shell => {
            let mut a = expand_all(&c.command);
            a.extend(expand_all(&c.args));
            if a.is_empty() {
                a.push("sh".into());
            }
            argv = a;
            program = "host-programs".into();
        }
        Kind::Unknown => unreachable!(),
    }
    // mount order: parents first; a volume at the same path wins over a private folder
    let mut all: Vec<Mount> = private;
    all.extend(mounts);
    all.sort_by(|a, b| {
        a.target
            .matches('/')
            .count()
            .cmp(&b.target.matches('/').count())
            .then(a.target.cmp(&b.target))
    });
    // Every source is opened first and bound through /proc/self/fd/N, so that a volume mounted
    // over a parent of the agent's folders (e.g. an emptyDir on /tmp) cannot hide the others.
    let mut script = String::from("set -e\n");
    script.push_str(&format!("hostname {}\n", shell_quote(&env.hostname)));
    let hosts = env.dir.join("hosts");
    let resolv = env.dir.join("resolv.conf");
    let mut binds: Vec<(PathBuf, String, bool)> = vec![
        (hosts, "/etc/hosts".into(), false),
        (resolv, "/etc/resolv.conf".into(), false),
    ];
    binds.extend(all.iter().map(|m| (m.src.clone(), m.target.clone(), m.ro)));
    for (i, (src, _, _)) in binds.iter().enumerate() {
        script.push_str(&format!(
            "exec {}<{}\n",
            10 + i,
            shell_quote(&src.to_string_lossy())
        ));
    }
    // a container of a stored image: its own root filesystem (a bind of itself, so that it can
    // be made read-only), with /proc, /sys and a /dev of its own, as a runtime gives it
    let at = |t: &str| match &root {
        Some(r) => format!("{}{t}", r.display()),
        None => t.to_string(),
    };
    if let Some(r) = &root {
        let r = shell_quote(&r.to_string_lossy());
        script.push_str(&format!(
            "mount --bind {r} {r}\nmkdir -p {r}/proc {r}/sys {r}/dev\n\
             mount -t proc proc {r}/proc\n\
             mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {r}/sys\n\
             mount -t tmpfs -o nosuid,mode=755 tmpfs {r}/dev\n\
             for d in null zero full random urandom tty; do : > {r}/dev/$d; \
             mount --bind /dev/$d {r}/dev/$d; done\n\
             mkdir -p {r}/dev/shm\nmount -t tmpfs -o nosuid,nodev,mode=1777 shm {r}/dev/shm\n"
        ));
    }
    for (i, (src, target, ro)) in binds.iter().enumerate() {
        let is_dir = src.is_dir();
        if i >= 2 || root.is_some() {
            // a mount point below another mount is created inside it: in the source folder
            // when that mount is read-only (a configMap, secret, projected volume), as a
            // kubelet and runtime make it, else in the namespace; others on the machine's
            // filesystem, recorded for cleanup
            let parent = all
                .iter()
                .filter(|m| m.target != *target && target.starts_with(&format!("{}/", m.target)))
                .max_by_key(|m| m.target.len());
            match parent {
                None if root.is_none() => {
                    let _ = util::ensure_mount_point(&ctx.data_dir, Path::new(target), !is_dir);
                }
                None => {}
                Some(p) if p.ro && p.src.is_dir() => {
                    let rel = target[p.target.len()..].trim_start_matches('/');
                    let at = p.src.join(rel);
                    if !at.exists() {
                        if is_dir {
                            let _ = std::fs::create_dir_all(&at);
                        } else if let Some(d) = at.parent() {
                            let _ = std::fs::create_dir_all(d);
                            let _ = std::fs::write(&at, b"");
                        }
                    }
                }
                Some(_) => {}
            }
            let t = shell_quote(&at(target));
            if all.iter().any(|m| {
                m.ro && m.target != *target && target.starts_with(&format!("{}/", m.target))
            }) {
                // created above in the read-only source
            } else if is_dir {
                script.push_str(&format!("mkdir -p {t}\n"));
            } else {
                script.push_str(&format!(
                    "mkdir -p \"$(dirname {t})\"; [ -e {t} ] || : > {t}\n"
                ));
            }
        }
        let t = shell_quote(&at(target));
        script.push_str(&format!(
            "mount --no-canonicalize --bind /proc/self/fd/{} {t}\n",
            10 + i
        ));
        if *ro {
            script.push_str(&format!("mount -o remount,bind,ro {t}\n"));
        }
    }
    for i in 0..binds.len() {
        script.push_str(&format!("exec {}<&-\n", 10 + i));
    }
    if let Some(r) = &root {
        if ro_root {
            script.push_str(&format!(
                "mount -o remount,bind,ro {}\n",
                shell_quote(&r.to_string_lossy())
            ));
        }
    } else if ro_root {
        // readOnlyRootFilesystem: every other mount of the namespace becomes read-only (the
        // root, the machine's other filesystems, the image's folders), except the volumes, the
        // image VOLUMEs of their own, the agent's files and /dev, /proc, /sys
        let mut keep = String::from("\n/etc/hosts\n/etc/resolv.conf\n");
        for m in all.iter().filter(|m| m.keep) {
            keep.push_str(&m.target);
            keep.push('\n');
        }
        script.push_str(&format!("lk_keep={}\n", shell_quote(&keep)));
        script.push_str(READ_ONLY_ROOT);
    }
    let quoted: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
    if let Some(r) = &root {
        let mut g = groups.clone();
        if !g.is_empty() {
            g.insert(0, gid);
            g.dedup();
        }
        let g: Vec<String> = g.iter().map(|x| x.to_string()).collect();
        script.push_str(&format!(
            "exec {} chroot-exec --root {} --wd {} --uid {uid} --gid {gid} --groups {} -- {}\n",
            shell_quote(&ctx.self_exe.to_string_lossy()),
            shell_quote(&r.to_string_lossy()),
            shell_quote(
                working_dir
                    .as_deref()
                    .filter(|w| !w.is_empty())
                    .unwrap_or("/")
            ),
            shell_quote(&g.join(",")),
            quoted.join(" ")
        ));
    } else if let Some(wd) = &working_dir {
        script.push_str(&format!("cd {} 2>/dev/null || cd /\n", shell_quote(wd)));
    } else {
        script.push_str("cd / \n");
    }
    if root.is_some() {
        // exec'd above
    } else if uid == 0 {
        script.push_str(&format!("exec {}\n", quoted.join(" ")));
    } else {
        let groups_arg = if !groups.is_empty() {
            let mut g = groups.clone();
            g.insert(0, gid);
            g.dedup();
            format!(
                "--groups={}",
                g.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )
        } else if util::user_by_uid(uid).is_some() {
            "--init-groups".into()
        } else {
            "--clear-groups".into()
        };
        script.push_str(&format!(
            "exec setpriv --reuid={uid} --regid={gid} {groups_arg} -- {}\n",
            quoted.join(" ")
        ));
    }
    let script_path = cdir.join("run.sh");
    std::fs::write(&script_path, script)
        .map_err(|e| PrepErr::Config(format!("writing {}: {e}", script_path.display())))?;
    Ok(Launch {
        script: script_path,
        env: cenv,
        program,
        membership,
    })
}
