//! A running container's startup, readiness and liveness probes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Container;
use tokio::sync::mpsc;

use super::{CState, PodEnv};
use crate::probes;

/// Probes the container of process `pid` as its spec says: startup first, then readiness and
/// liveness side by side; `kill` is told why when a startup or liveness probe fails for good.
pub(super) async fn probe_loop(
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
