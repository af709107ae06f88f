//! Probes: httpGet and tcpSocket from the machine to the pod IP, exec inside the container's
//! namespaces (nsenter).

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub fn resolve_port(c: &Container, p: &IntOrString) -> Option<u16> {
    match p {
        IntOrString::Int(i) => u16::try_from(*i).ok(),
        IntOrString::String(s) => s.parse().ok().or_else(|| {
            c.ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(s.as_str()))
                .and_then(|cp| u16::try_from(cp.container_port).ok())
        }),
    }
}

/// Runs one probe; Ok(()) on success, Err(message) on failure.
pub async fn run(
    probe: &Probe,
    c: &Container,
    pod_ip: &str,
    pid: i32,
    env: &[(String, String)],
) -> Result<(), String> {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let fut = async {
        if let Some(h) = &probe.http_get {
            let port = resolve_port(c, &h.port).ok_or("unknown port")?;
            let host = h.host.clone().unwrap_or_else(|| pod_ip.to_string());
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let mut s = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| format!("Get http://{host}:{port}{path}: {e}"))?;
            let mut req = format!(
                "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n"
            );
            for hd in h.http_headers.iter().flatten() {
                req.push_str(&format!("{}: {}\r\n", hd.name, hd.value));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; 1024];
            let mut got = 0;
            while got < 12 {
                let n = s.read(&mut buf[got..]).await.map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            let line = String::from_utf8_lossy(&buf[..got]).to_string();
            let code: u16 = line
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .ok_or_else(|| format!("bad HTTP response {line:?}"))?;
            if (200..400).contains(&code) {
                Ok(())
            } else {
                Err(format!("HTTP probe failed with statuscode: {code}"))
            }
        } else if let Some(t) = &probe.tcp_socket {
            let port = resolve_port(c, &t.port).ok_or("unknown port")?;
            let host = t.host.clone().unwrap_or_else(|| pod_ip.to_string());
            TcpStream::connect((host.as_str(), port))
                .await
                .map(|_| ())
                .map_err(|e| format!("dial tcp {host}:{port}: {e}"))
        } else if let Some(g) = &probe.grpc {
            let port = u16::try_from(g.port).map_err(|_| "bad port")?;
            TcpStream::connect((pod_ip, port))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else if let Some(e) = &probe.exec {
            let cmd = e.command.clone().unwrap_or_default();
            if cmd.is_empty() {
                return Err("empty exec probe".to_string());
            }
            // a distroless image has no shell
            crate::images::runnable(c.image.as_deref().unwrap_or_default(), &cmd[0]).map_err(
                |e| format!("rpc error: code = Unknown desc = failed to exec in container: {e}"),
            )?;
            exec_in(pid, &cmd, env).await.map(|_| ())
        } else {
            Ok(())
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!("probe timed out after {}s", timeout.as_secs())),
    }
}

/// Runs a command in the namespaces (net, mount, uts) of a container's process.
pub async fn exec_in(pid: i32, cmd: &[String], env: &[(String, String)]) -> Result<String, String> {
    let pid_s = pid.to_string();
    let mut c = tokio::process::Command::new("nsenter");
    c.args(["-t", &pid_s, "-n", "-m", "-u", "--"])
        .args(cmd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = c.output().await.map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "command {:?} exited with {}: {}",
            cmd,
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
