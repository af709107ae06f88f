//! The part of the kubelet API the API server proxies for `kubectl logs`:
//! `GET /containerLogs/{ns}/{pod}/{container}` (`follow`, `tailLines`, `limitBytes`) and
//! `/healthz`, over TLS on 198.18.0.1:10250, clients authenticated by certificates of the cluster
//! CA. exec, attach and port-forward answer 501.
//!
//! Difference from a kubelet: `previous=true` is answered like a request without it. The double
//! keeps one log file per container across its runs; while a container waits to be restarted
//! (CrashLoopBackOff, the only time the operator asks for `previous`), the file's tail is the
//! previous run's output, which is what a kubelet answers.

use crate::SharedCtx;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

pub const PORT: u16 = 10250;

pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

fn server_config(tls: &Tls) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&tls.client_ca).context("client CA")? {
        roots.add(c?)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
        .context("serving certificate")?
        .collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).context("serving key")?;
    Ok(rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?)
}

pub async fn run(ctx: SharedCtx, tls: Tls) {
    let cfg = match server_config(&tls) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("kubelet API disabled: {e:#}");
            return;
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = match TcpListener::bind((crate::net::node_ip(), PORT)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                "kubelet API disabled: listen {}:{PORT}: {e}",
                crate::net::node_ip()
            );
            return;
        }
    };
    tracing::info!("kubelet API (logs) on {}:{PORT}", crate::net::node_ip());
    loop {
        let Ok((s, _)) = l.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(s)).await
            {
                let _ = handle(ctx, s).await;
            }
        });
    }
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(ctx: SharedCtx, mut s: S) -> Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 || buf.len() > 65536 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let param = |k: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(a, _)| *a == k)
            .map(|(_, v)| v.to_string())
    };
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if path == "/healthz" {
        return respond(&mut s, "200 OK", "ok").await;
    }
    if method != "GET" || seg.first() != Some(&"containerLogs") || seg.len() != 4 {
        return respond(
            &mut s,
            "501 Not Implemented",
            "local-kubelet serves only container logs (no exec, attach or port-forward)\n",
        )
        .await;
    }
    let (ns, pod, container) = (seg[1], seg[2], seg[3]);
    let Some(p) = ctx.pods.get(&ObjectRef::<Pod>::new(pod).within(ns)) else {
        return respond(&mut s, "404 Not Found", "pod not found\n").await;
    };
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let file = ctx
        .log_dir
        .join(format!("{ns}_{pod}_{}", &uid[..uid.len().min(8)]))
        .join(format!("{container}.log"));
    if !file.exists() {
        return respond(
            &mut s,
            "400 Bad Request",
            &format!("container \"{container}\" in pod \"{pod}\" has not started\n"),
        )
        .await;
    }
    let follow = param("follow").as_deref() == Some("true");
    let tail: Option<usize> = param("tailLines").and_then(|v| v.parse().ok());
    let limit: Option<u64> = param("limitBytes").and_then(|v| v.parse().ok());
    s.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nCache-Control: no-cache\r\n\r\n",
    )
    .await?;
    let mut pos = initial(&file, tail, limit, &mut s).await?;
    if follow {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut f = tokio::fs::File::open(&file).await?;
            let len = f.metadata().await?.len();
            if len > pos {
                f.seek(std::io::SeekFrom::Start(pos)).await?;
                let mut data = vec![0u8; (len - pos) as usize];
                f.read_exact(&mut data).await?;
                s.write_all(&data).await?;
                s.flush().await?;
                pos = len;
            }
            if ctx
                .pods
                .get(&ObjectRef::<Pod>::new(pod).within(ns))
                .is_none()
            {
                break;
            }
        }
    }
    s.shutdown().await?;
    Ok(())
}

async fn initial<S: AsyncWrite + Unpin>(
    file: &Path,
    tail: Option<usize>,
    limit: Option<u64>,
    s: &mut S,
) -> Result<u64> {
    let data = tokio::fs::read(file).await?;
    let len = data.len() as u64;
    let mut start = 0usize;
    if let Some(n) = tail {
        let mut count = 0;
        let body = if data.ends_with(b"\n") {
            &data[..data.len() - 1]
        } else {
            &data[..]
        };
        start = 0;
        for (i, b) in body.iter().enumerate().rev() {
            if *b == b'\n' {
                count += 1;
                if count == n {
                    start = i + 1;
                    break;
                }
            }
        }
        if n == 0 {
            start = data.len();
        }
    }
    let mut out = &data[start..];
    if let Some(l) = limit {
        out = &out[..out.len().min(l as usize)];
    }
    s.write_all(out).await?;
    s.flush().await?;
    Ok(len)
}

async fn respond<S: AsyncWrite + Unpin>(s: &mut S, status: &str, body: &str) -> Result<()> {
    s.write_all(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    s.shutdown().await?;
    Ok(())
}
