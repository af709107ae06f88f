//! Pods bound to this node: a worker per pod (network namespace, volumes, hosts file, status),
//! a runner per container (process, probes, restarts with the kubelet's back-off).
//!
//! [`worker`] runs a pod and [`status`] reports it; [`container`] runs one container from what
//! [`prepare`] made ready (its user, mounts, program and run script), [`probing`] probes it, and
//! [`events`] records what happens.

mod container;
mod env;
mod events;
mod prepare;
mod probing;
mod status;
mod worker;

use crate::SharedCtx;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

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
                let handle = tokio::spawn(worker::pod_worker(ctx.clone(), p.clone(), rx));
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

/// A pod's init containers and containers, and the runners of those started so far.
struct Containers {
    restart_policy: String,
    init_specs: Vec<Container>,
    main_specs: Vec<Container>,
    init_runners: Vec<Runner>,
    main_runners: Vec<Runner>,
}

impl Containers {
    fn of(spec: &PodSpec) -> Containers {
        Containers {
            restart_policy: spec
                .restart_policy
                .clone()
                .unwrap_or_else(|| "Always".into()),
            init_specs: spec.init_containers.clone().unwrap_or_default(),
            main_specs: spec.containers.clone(),
            init_runners: Vec::new(),
            main_runners: Vec::new(),
        }
    }

    /// Every init container is done.
    fn init_done(&self) -> bool {
        self.init_runners.len() == self.init_specs.len()
            && self
                .init_runners
                .iter()
                .zip(&self.init_specs)
                .all(|(r, c)| init_complete(r, c))
    }

    /// Starts what is next: the init containers one after the other, then the containers.
    fn start_next(&mut self, env: &Arc<PodEnv>) {
        let init_done = self.init_done();
        if self.init_runners.len() < self.init_specs.len() {
            let n = self.init_runners.len();
            let prev_ok =
                n == 0 || init_complete(&self.init_runners[n - 1], &self.init_specs[n - 1]);
            if prev_ok {
                let c = self.init_specs[self.init_runners.len()].clone();
                let policy = if c.restart_policy.as_deref() == Some("Always") {
                    "Always" // a sidecar: keeps running beside the containers
                } else if self.restart_policy == "Never" {
                    "Never"
                } else {
                    "OnFailure"
                };
                self.init_runners
                    .push(spawn_runner(env.clone(), c, policy.to_string()));
            }
        } else if init_done && self.main_runners.is_empty() {
            for c in &self.main_specs {
                self.main_runners.push(spawn_runner(
                    env.clone(),
                    c.clone(),
                    self.restart_policy.clone(),
                ));
            }
        }
    }

    /// Stops every runner within `grace`, and waits for them (15 s more at most).
    async fn stop(self, grace: Duration) {
        for r in self.main_runners.iter().chain(self.init_runners.iter()) {
            let _ = r.stop.send(Some(grace));
        }
        for r in self.main_runners.into_iter().chain(self.init_runners) {
            let _ = tokio::time::timeout(grace + Duration::from_secs(15), r.handle).await;
        }
    }
}

/// An init container is done when it exited 0; a sidecar (restartPolicy Always) once started.
fn init_complete(r: &Runner, c: &Container) -> bool {
    let s = r.shared.lock().unwrap();
    s.finished == Some(0)
        || (c.restart_policy.as_deref() == Some("Always") && s.started && s.pid.is_some())
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
    let handle = tokio::spawn(container::run_container(env, c, policy, shared.clone(), rx));
    Runner {
        name,
        image,
        shared,
        stop: tx,
        handle,
    }
}
