//! A container's runner: it prepares the container, starts its process, probes it, stops it
//! within its grace period, and restarts it as its restart policy says, with the kubelet's
//! back-off.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Container;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::events::{event, pulled};
use super::prepare::{Launch, PrepErr, prepare};
use super::probing::probe_loop;
use super::{CState, PodEnv, waiting};
use crate::keeper;
use crate::probes;
use crate::util;

const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How long a failed pull shows as `ErrImagePull` before its back-off shows (`ImagePullBackOff`):
/// the kubelet's next sync of the pod.
const PULL_FAILED_FOR: Duration = Duration::from_secs(2);

/// Runs container `c` of the pod until `stop` says so, restarting it as `policy` (`Always`,
/// `OnFailure`, `Never`) says; `shared` is what its status reports.
pub(super) async fn run_container(
    env: Arc<PodEnv>,
    c: Container,
    policy: String,
    shared: Arc<Mutex<CState>>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    // container logs outlive the pod (for post-mortems): <log dir>/<ns>_<pod>_<uid8>/<container>.log
    let log_dir = env
        .ctx
        .log_dir
        .join(env.dir.file_name().unwrap_or_default());
    let _ = std::fs::create_dir_all(&log_dir);
    let log_path = log_dir.join(format!("{}.log", c.name));
    let mut backoff = Duration::ZERO;
    let mut pull_backoff = Duration::ZERO;
    let mut starts = 0;
    let id = format!("{}/{}/{}", env.ns, env.name, c.name);
    let mut last_event = String::new();
    loop {
        if stop.borrow().is_some() {
            break;
        }
        let pod = env.pod();
        let launch = match prepare(&env, &pod, &c).await {
            Ok(l) => {
                pull_backoff = Duration::ZERO;
                l
            }
            Err(PrepErr::Image(m)) => {
                // as the kubelet: the failed pull is `ErrImagePull` until its next sync, then
                // `ImagePullBackOff` until the pull's back-off has passed
                pull_failed(&env, &c, &shared, &m, &mut last_event);
                wait_stop(&mut stop, PULL_FAILED_FOR).await;
                if stop.borrow().is_some() {
                    break;
                }
                pull_backoff = if pull_backoff.is_zero() {
                    BACKOFF_START
                } else {
                    (pull_backoff * 2).min(BACKOFF_MAX)
                };
                pull_back_off(&env, &c, &shared, &m, pull_backoff);
                wait_stop(&mut stop, pull_backoff).await;
                continue;
            }
            Err(e) => {
                let wait = not_started(&env, &c, &shared, e, &mut last_event);
                wait_stop(&mut stop, wait).await;
                continue;
            }
        };
        if starts == 0 {
            pulled(&env, &pod, &c);
        }
        let mut cmd = command(&env, &launch, &log_path);
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
        let exit = run_until_exit(&env, &c, &shared, &launch, pid, &mut child, &mut stop).await;
        let code = exit
            .status
            .map(|s| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9)))
            .unwrap_or(137);
        let ran = t0.elapsed();
        let term = terminated(&env, &c, code, &started_at, &container_id, &log_path);
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
        if exit.stopping {
            shared.lock().unwrap().state = term;
            break;
        }
        let restart = match policy.as_str() {
            "Always" => true,
            "OnFailure" => code != 0 || exit.killed,
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
            back_off(&env, &c, &shared, backoff);
            wait_stop(&mut stop, backoff).await;
        }
        backoff = if backoff.is_zero() {
            BACKOFF_START
        } else {
            (backoff * 2).min(BACKOFF_MAX)
        };
    }
}

/// Says why the container cannot start (an Event when the reason is new, its waiting state), as
/// the kubelet does; how long to wait before preparing it again.
fn not_started(
    env: &PodEnv,
    c: &Container,
    shared: &Mutex<CState>,
    err: PrepErr,
    last_event: &mut String,
) -> Duration {
    let (reason, m, message, wait) = match err {
        PrepErr::Image(m) => {
            pull_failed(env, c, shared, &m, last_event);
            return BACKOFF_START;
        }
        PrepErr::Config(m) => {
            let message = format!("Error: {m}");
            ("CreateContainerConfigError", m, message, 2)
        }
        PrepErr::Start(m) => {
            // as containerd reports a command the image cannot run
            let m = format!(
                "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: {m}: unknown"
            );
            let message = format!("Error: {m}");
            ("RunContainerError", m, message, 10)
        }
    };
    if *last_event != m {
        event(env, "Warning", "Failed", Some(&c.name), message);
        *last_event = m.clone();
    }
    shared.lock().unwrap().state = waiting(reason, &m);
    Duration::from_secs(wait)
}

/// A pull of the container's image that failed with `m`, as the kubelet reports one: the
/// `Pulling` Event and `Failed` Events with the error and `Error: ErrImagePull` (when the error
/// is new: the kubelet's repeats only count up), and the waiting state `ErrImagePull`.
fn pull_failed(
    env: &PodEnv,
    c: &Container,
    shared: &Mutex<CState>,
    m: &str,
    last_event: &mut String,
) {
    let image = c.image.clone().unwrap_or_default();
    if *last_event != m {
        *last_event = m.to_string();
        event(
            env,
            "Normal",
            "Pulling",
            Some(&c.name),
            format!("Pulling image {image:?}"),
        );
        event(
            env,
            "Warning",
            "Failed",
            Some(&c.name),
            format!("Failed to pull image {image:?}: {m}"),
        );
        event(
            env,
            "Warning",
            "Failed",
            Some(&c.name),
            "Error: ErrImagePull".into(),
        );
    }
    shared.lock().unwrap().state = waiting("ErrImagePull", m);
}

/// The pull's back-off after a failed pull, as the kubelet reports it: the `BackOff` Event and
/// `Error: ImagePullBackOff` (once per error), and the waiting state `ImagePullBackOff` whose
/// message names the image and the pull's error, as the kubelet's does since 1.30.
fn pull_back_off(env: &PodEnv, c: &Container, shared: &Mutex<CState>, m: &str, backoff: Duration) {
    let image = c.image.clone().unwrap_or_default();
    let backing_off = format!("Back-off pulling image {image:?}");
    if backoff == BACKOFF_START {
        event(env, "Normal", "BackOff", Some(&c.name), backing_off.clone());
        event(
            env,
            "Warning",
            "Failed",
            Some(&c.name),
            "Error: ImagePullBackOff".into(),
        );
    }
    shared.lock().unwrap().state = waiting(
        "ImagePullBackOff",
        &format!("{backing_off}: ErrImagePull: {m}"),
    );
}

/// The container's process: its run script in the pod's network namespace, in mount and UTS
/// namespaces of its own and a session of its own, its output appended to `log_path`.
fn command(env: &PodEnv, launch: &Launch, log_path: &Path) -> tokio::process::Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path);
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
    cmd
}

/// How a run of the container ended.
struct Exit {
    status: Option<std::process::ExitStatus>,
    /// it was stopped (the pod stops), not restarted
    stopping: bool,
    /// a probe failed for good and it was killed
    killed: bool,
}

/// Probes the started process `pid` (and follows a Keeper member's membership) until it exits,
/// is stopped, or a probe kills it.
async fn run_until_exit(
    env: &Arc<PodEnv>,
    c: &Container,
    shared: &Arc<Mutex<CState>>,
    launch: &Launch,
    pid: i32,
    child: &mut tokio::process::Child,
    stop: &mut watch::Receiver<Option<Duration>>,
) -> Exit {
    let id = format!("{}/{}/{}", env.ns, env.name, c.name);
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
    let mut killed = false;
    let status = tokio::select! {
        s = child.wait() => s.ok(),
        g = async { stop.wait_for(|s| s.is_some()).await.ok().and_then(|r| *r) } => {
            stopping = true;
            let grace = g.unwrap_or(Duration::from_secs(30));
            event(env, "Normal", "Killing", Some(&c.name), format!("Stopping container {}", c.name));
            probe_task.abort();
            terminate(env, c, pid, grace, child, &launch.env, true).await
        }
        Some(why) = kill_rx.recv() => {
            tracing::info!("container {id}: {why}; restarting");
            event(env, "Warning", "Unhealthy", Some(&c.name), why.clone());
            event(env, "Normal", "Killing", Some(&c.name), format!("Container {} failed its probe, will be restarted", c.name));
            killed = true;
            probe_task.abort();
            let grace = env.grace();
            terminate(env, c, pid, grace, child, &launch.env, true).await
        }
    };
    probe_task.abort();
    if let Some(t) = membership_task {
        t.abort();
    }
    Exit {
        status,
        stopping,
        killed,
    }
}

/// The container's `terminated` state after a run that ended with `code`.
fn terminated(
    env: &PodEnv,
    c: &Container,
    code: i32,
    started_at: &str,
    container_id: &str,
    log_path: &Path,
) -> Value {
    let message = termination_message(&env.dir.join("containers").join(&c.name), c, code, log_path);
    let mut term = json!({"terminated": {
        "exitCode": code,
        "reason": if code == 0 { "Completed" } else { "Error" },
        "startedAt": started_at, "finishedAt": util::now(),
        "containerID": container_id,
    }});
    if let Some(m) = message {
        term["terminated"]["message"] = json!(m);
    }
    term
}

/// The kubelet's `BackOff` Event and `CrashLoopBackOff` state before a restart `backoff` later.
fn back_off(env: &PodEnv, c: &Container, shared: &Mutex<CState>, backoff: Duration) {
    event(
        env,
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
