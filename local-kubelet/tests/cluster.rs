//! Tests of the local cluster against the real control plane: `hack/local-cluster.sh up` into a
//! temporary folder once, every scenario in its own namespace, `down` at the end (also when a
//! scenario fails or panics), then a check that nothing of the cluster is left on the machine.
//!
//! Needs root (network namespaces). Run: `cargo test -p local-kubelet --test cluster`
//! (an argument filters scenarios by name).

mod common;
#[path = "cluster/images.rs"]
mod images;
#[path = "cluster/pods.rs"]
mod pods;
#[path = "cluster/servers.rs"]
mod servers;

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

fn main() {
    let scenarios: Vec<Scenario> = vec![
        (
            "statefulset_two_clickhouse_replicas",
            servers::statefulset_two_clickhouse_replicas,
        ),
        (
            "pod_deleted_keeps_data_and_sigkill_restarts",
            servers::pod_deleted_keeps_data_and_sigkill_restarts,
        ),
        (
            "keeper_quorum_and_replication",
            servers::keeper_quorum_and_replication,
        ),
        (
            "crash_loop_and_unknown_image",
            pods::crash_loop_and_unknown_image,
        ),
        (
            "volumes_env_probes_and_api_access",
            pods::volumes_env_probes_and_api_access,
        ),
        (
            "volume_expansion_and_reclaim",
            pods::volume_expansion_and_reclaim,
        ),
        ("operator_image_in_cluster", pods::operator_image_in_cluster),
        (
            "termination_message_in_a_dev_of_its_own",
            pods::termination_message_in_a_dev_of_its_own,
        ),
        (
            "read_only_root_and_image_volumes",
            images::read_only_root_and_image_volumes,
        ),
        (
            "keeper_entrypoint_and_variants",
            images::keeper_entrypoint_and_variants,
        ),
        (
            "keeper_client_port_waits_for_quorum",
            images::keeper_client_port_waits_for_quorum,
        ),
        (
            "server_entrypoint_user_setup",
            images::server_entrypoint_user_setup,
        ),
    ];
    common::run(scenarios, 1);
}
