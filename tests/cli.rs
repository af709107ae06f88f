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
