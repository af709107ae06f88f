//! The command line of the operator's binary.

use std::io::Read;
use std::process::{Command, Stdio};

/// Issue 16: `clickhouse-operator crd | head` ends quietly when the reader goes away: exit code
/// 0, nothing on standard error (the CRDs are far larger than a pipe's buffer, so the writer
/// meets the closed pipe).
#[test]
fn crd_output_into_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .arg("crd")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 64];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    // the pipe's reader is gone now
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(String::from_utf8_lossy(&head).contains("clickhouse-operator crd"));
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
}

/// Issue 16: without a cluster to read (`--offline`, or a kubeconfig that does not exist),
/// `plan` shows the first pass over an empty namespace, as before, and exits 0.
#[test]
fn plan_without_a_cluster_shows_the_first_pass_offline() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/cluster.yaml");
    for offline in [true, false] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"));
        cmd.args(["plan", "-f", example])
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env("HOME", "/nonexistent")
            .env_remove("KUBERNETES_SERVICE_HOST");
        if offline {
            cmd.arg("--offline");
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("apply StatefulSet"), "{stdout}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .args(["plan", "-f", example, "--offline", "-o", "yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "an unknown output format is refused");
}
