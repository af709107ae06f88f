//! A pod's worker: its sandbox (an address and a network namespace), then every second its hosts
//! file, its volumes, the next container to start and its status; at the end its teardown.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::status::pod_status;
use super::{Containers, Ctl, PodEnv};
use crate::SharedCtx;
use crate::hosts;
use crate::net;
use crate::util;
use crate::volumes::VolumeState;

/// Runs `pod` until told to stop or to delete it.
pub(super) async fn pod_worker(ctx: SharedCtx, pod: Arc<Pod>, mut rx: watch::Receiver<Ctl>) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let dir = ctx
        .data_dir
        .join("pods")
        .join(format!("{ns}_{name}_{}", &uid[..uid.len().min(8)]));
    tracing::info!("pod {ns}/{name}: starting");
    let ip = allocate_ip(&ctx, &ns, &name).await;
    let netns = sandbox(&ctx, &rx, &dir, ip, &uid, &ns, &name).await;
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
    let mut volumes = Volumes::default();
    let mut containers = Containers::of(&pod.spec.clone().unwrap_or_default());
    let mut last_status = Value::Null;
    let mut hosts_file = HostsFile {
        path: dir.join("hosts"),
        written: None,
    };
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
        hosts_file.refresh(&ctx, &cur, ip);
        volumes.sync(&env, &cur).await;
        if volumes.ready {
            containers.start_next(&env);
        }
        let status = pod_status(
            &cur,
            &ip.to_string(),
            &start_time,
            &containers,
            volumes.error(),
        );
        if status != last_status && patch_status(&ctx, &ns, &name, &status).await {
            last_status = status;
        }
    }
    stop(&env, ctl, containers).await;
}

/// The pod's address, once the pool has one.
async fn allocate_ip(ctx: &SharedCtx, ns: &str, name: &str) -> Ipv4Addr {
    loop {
        if let Some(ip) = ctx
            .ipam
            .lock()
            .unwrap()
            .allocate_for(&format!("{ns}/{name}"))
        {
            return ip;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The pod's sandbox: its folder with a `resolv.conf`, and its network namespace at `ip` with the
/// pod's NetworkPolicy rules in place before any of its containers runs. Tried again every 2 s
/// while the pod is to run; the namespace's name, empty if the pod was stopped before.
async fn sandbox(
    ctx: &SharedCtx,
    rx: &watch::Receiver<Ctl>,
    dir: &Path,
    ip: Ipv4Addr,
    uid: &str,
    ns: &str,
    name: &str,
) -> String {
    let mut last_err = String::new();
    while *rx.borrow() == Ctl::Run {
        let r: Result<String> = async {
            std::fs::create_dir_all(dir)?;
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
                crate::policy::register(ctx, uid, ns, name, &n).await;
                return n;
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
    String::new()
}

/// The pod's hosts file, and the fingerprint of what it was last rendered from.
struct HostsFile {
    path: PathBuf,
    written: Option<((u64, u64), Instant)>,
}

impl HostsFile {
    /// A hollow server resolves no name: its hosts file is written once; the others' are
    /// rendered again when what they are made of changed (and at least once a minute, should
    /// the file have been changed behind the agent's back).
    fn refresh(&mut self, ctx: &SharedCtx, pod: &Pod, ip: Ipv4Addr) {
        if crate::hollow::is_hollow(pod) && self.path.exists() {
            return;
        }
        let ip = ip.to_string();
        let print = (
            hosts::world_fingerprint(ctx),
            hosts::own_fingerprint(pod, &ip),
        );
        if self
            .written
            .is_none_or(|(p, at)| p != print || at.elapsed() >= Duration::from_secs(60))
            && hosts::write_in_place(&self.path, &hosts::render(ctx, pod, &ip)).is_ok()
        {
            self.written = Some((print, Instant::now()));
        }
    }
}

/// The pod's volumes: ready once they synced, and why the last sync failed.
#[derive(Default)]
struct Volumes {
    state: VolumeState,
    ready: bool,
    error: String,
}

impl Volumes {
    /// Syncs the volumes of `pod` and hands them to its containers; a new error is logged.
    async fn sync(&mut self, env: &PodEnv, pod: &Pod) {
        match self.state.sync(&env.ctx, pod, &env.dir).await {
            Ok(()) => {
                self.ready = true;
                self.error.clear();
                *env.volumes.lock().unwrap() = self.state.vols.clone();
            }
            Err(e) => {
                let m = format!("{e:#}");
                if m != self.error {
                    tracing::warn!("pod {}/{}: volumes: {m}", env.ns, env.name);
                    self.error = m;
                }
            }
        }
    }

    /// What the containers wait for: nothing once the volumes were ready.
    fn error(&self) -> &str {
        if self.ready { "" } else { &self.error }
    }
}

/// Writes the pod's status when it changed; whether it was written.
async fn patch_status(ctx: &SharedCtx, ns: &str, name: &str, status: &Value) -> bool {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    match api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!("pod {ns}/{name}: status: {e}");
            false
        }
    }
}

/// Stops the pod's containers within its grace period (at most 10 s when the agent shuts
/// down), tears its sandbox down and, told to delete it, deletes the Pod object.
async fn stop(env: &PodEnv, ctl: Ctl, containers: Containers) {
    let (ctx, ns, name) = (&env.ctx, &env.ns, &env.name);
    let mut grace = env.grace();
    if ctl == Ctl::Stop && ctx.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        grace = grace.min(Duration::from_secs(10));
    }
    tracing::info!(
        "pod {ns}/{name}: stopping (grace {}s, {:?})",
        grace.as_secs(),
        ctl
    );
    containers.stop(grace).await;
    crate::policy::unregister(ctx, &env.uid);
    net::teardown_pod(env.ip).await;
    ctx.ipam.lock().unwrap().release(env.ip);
    let _ = std::fs::remove_dir_all(&env.dir);
    if ctl == Ctl::Delete {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(env.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => tracing::info!("pod {ns}/{name}: deleted"),
            Err(e) => tracing::warn!("pod {ns}/{name}: delete: {e}"),
        }
    } else {
        tracing::info!("pod {ns}/{name}: stopped");
    }
}
