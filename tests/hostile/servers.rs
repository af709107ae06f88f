//! Hostile servers on ephemeral local ports, in-process: what a cluster's editor can put at
//! the addresses the operator reads (review M-1). They are stand-ins on purpose: no real
//! ClickHouse, S3 store or Keeper misbehaves this way on request.

#![allow(dead_code)] // each test binary uses a part

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads one HTTP request's head and body: (method, target).
pub async fn read_request(s: &mut TcpStream) -> Option<(String, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
        if head.len() > 64 << 10 {
            return None;
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut first = text.lines().next()?.split(' ');
    let method = first.next()?.to_string();
    let target = first.next()?.to_string();
    let length: usize = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length.min(1 << 20)];
    s.read_exact(&mut body).await.ok()?;
    Some((method, target))
}

/// What a ClickHouse-like server answers every statement with.
#[derive(Clone, Copy)]
pub enum ClickHouseAnswer {
    /// `JSONCompact` rows of zeros without end (up to `total` bytes, then it closes).
    Endless { total: usize },
    /// A `Content-Length` of a GiB, then zeros.
    Declared,
    /// A valid `JSONCompact` answer of `bytes` bytes of one-digit values.
    TinyValues { bytes: usize },
    /// `rows` rows of `system.replicas`' shape, each a table of its own.
    ManyTables { rows: usize },
}

/// A ClickHouse-like HTTP server; the bytes it sent, counted.
pub async fn clickhouse(answer: ClickHouseAnswer) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let sent = counter.clone();
            tokio::spawn(async move {
                if read_request(&mut s).await.is_none() {
                    return;
                }
                let _ = answer_with(&mut s, answer, &sent).await;
            });
        }
    });
    (addr, sent)
}

async fn answer_with(
    s: &mut TcpStream,
    answer: ClickHouseAnswer,
    sent: &AtomicUsize,
) -> std::io::Result<()> {
    let zeros = "0,".repeat(32 << 10);
    match answer {
        ClickHouseAnswer::Endless { total } => {
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"meta\":[{\"name\":\"a\",\"type\":\"UInt8\"}],\"data\":[[")
                .await?;
            while sent.load(Ordering::Relaxed) < total {
                s.write_all(zeros.as_bytes()).await?;
                sent.fetch_add(zeros.len(), Ordering::Relaxed);
            }
        }
        ClickHouseAnswer::Declared => {
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\nConnection: close\r\n\r\n")
                .await?;
            for _ in 0..64 {
                s.write_all(zeros.as_bytes()).await?;
                sent.fetch_add(zeros.len(), Ordering::Relaxed);
            }
        }
        ClickHouseAnswer::TinyValues { bytes } => {
            let mut body =
                String::from("{\"meta\":[{\"name\":\"a\",\"type\":\"UInt8\"}],\"data\":[");
            while body.len() < bytes {
                body.push_str("[0],");
            }
            body.push_str("[0]],\"rows\":1}");
            s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .await?;
            s.write_all(body.as_bytes()).await?;
            sent.fetch_add(body.len(), Ordering::Relaxed);
        }
        ClickHouseAnswer::ManyTables { rows } => {
            // the shape of every statement the exporter sends: name columns then figures
            let mut body = String::from(
                "{\"meta\":[{\"name\":\"metric\"},{\"name\":\"event\"},{\"name\":\"v\"},{\"name\":\"database\"},{\"name\":\"table\"},{\"name\":\"ro\"},{\"name\":\"expired\"},{\"name\":\"queue\"},{\"name\":\"delay\"},{\"name\":\"parts\"},{\"name\":\"most\"},{\"name\":\"name\"},{\"name\":\"free\"},{\"name\":\"total\"}],\"data\":[",
            );
            for i in 0..rows {
                if i > 0 {
                    body.push(',');
                }
                body.push_str(&format!(
                    "[\"m{i}\",\"e{i}\",1,\"db\",\"t{i}\",0,0,0,0,1,1,\"d{i}\",1,2]"
                ));
            }
            body.push_str("]}");
            s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .await?;
            s.write_all(body.as_bytes()).await?;
            sent.fetch_add(body.len(), Ordering::Relaxed);
        }
    }
    s.shutdown().await
}

/// An object of the S3-like server.
#[derive(Clone)]
pub enum Object {
    Bytes(Vec<u8>),
    /// `prefix`, then `item` repeated, announced as `declared` bytes (it is sent until then).
    Generated {
        declared: usize,
        prefix: String,
        item: Arc<dyn Fn(usize) -> String + Send + Sync>,
    },
    /// Its head (100 bytes announced), and then nothing for a minute.
    Stall,
}

/// What the S3-like server holds and saw.
#[derive(Default)]
pub struct S3State {
    pub objects: BTreeMap<String, Object>,
    pub deleted: Vec<String>,
    pub sent: usize,
}

/// An S3-like server for one bucket: lists (ListObjectsV2, one page), serves and deletes
/// objects. Every answer closes its connection.
pub async fn s3(state: Arc<Mutex<S3State>>, bucket: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let Some((method, target)) = read_request(&mut s).await else {
                    return;
                };
                let _ = s3_answer(&mut s, &state, bucket, &method, &target).await;
            });
        }
    });
    addr
}

fn decode(s: &str) -> String {
    urlencoding::decode(s)
        .map(|c| c.into_owned())
        .unwrap_or_default()
}

async fn s3_answer(
    s: &mut TcpStream,
    state: &Mutex<S3State>,
    bucket: &str,
    method: &str,
    target: &str,
) -> std::io::Result<()> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let key = decode(
        path.trim_start_matches('/')
            .strip_prefix(bucket)
            .unwrap_or(""),
    )
    .trim_start_matches('/')
    .to_string();
    let head = |status: &str, length: usize, extra: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {length}\r\nLast-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\nETag: \"e\"\r\n{extra}Connection: close\r\n\r\n"
        )
    };
    if method == "DELETE" {
        state.lock().unwrap().deleted.push(key);
        s.write_all(head("204 No Content", 0, "").as_bytes())
            .await?;
        return s.shutdown().await;
    }
    if key.is_empty() {
        let prefix = query
            .split('&')
            .find_map(|p| p.strip_prefix("prefix="))
            .map(decode)
            .unwrap_or_default();
        let mut xml = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
        );
        xml.push_str(&format!(
            "<Name>{bucket}</Name><Prefix>{prefix}</Prefix><IsTruncated>false</IsTruncated>"
        ));
        for (k, o) in state.lock().unwrap().objects.range(prefix.clone()..) {
            if !k.starts_with(&prefix) {
                break;
            }
            let size = match o {
                Object::Bytes(b) => b.len(),
                Object::Generated { declared, .. } => *declared,
                Object::Stall => 100,
            };
            xml.push_str(&format!(
                "<Contents><Key>{k}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            ));
        }
        xml.push_str("</ListBucketResult>");
        s.write_all(head("200 OK", xml.len(), "Content-Type: application/xml\r\n").as_bytes())
            .await?;
        s.write_all(xml.as_bytes()).await?;
        return s.shutdown().await;
    }
    let object = state.lock().unwrap().objects.get(&key).cloned();
    match object {
        None => {
            let body = "<Error><Code>NoSuchKey</Code></Error>";
            s.write_all(head("404 Not Found", body.len(), "").as_bytes())
                .await?;
            s.write_all(body.as_bytes()).await?;
        }
        Some(Object::Stall) => {
            s.write_all(head("200 OK", 100, "").as_bytes()).await?;
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        }
        Some(Object::Bytes(b)) => {
            s.write_all(head("200 OK", b.len(), "").as_bytes()).await?;
            s.write_all(&b).await?;
        }
        Some(Object::Generated {
            declared,
            prefix,
            item,
        }) => {
            s.write_all(head("200 OK", declared, "").as_bytes()).await?;
            let mut left = declared;
            let mut chunk = prefix.into_bytes();
            let mut i = 0;
            while left > 0 {
                while chunk.len() < 64 << 10 {
                    chunk.extend_from_slice(item(i).as_bytes());
                    i += 1;
                }
                let n = chunk.len().min(left);
                s.write_all(&chunk[..n]).await?;
                state.lock().unwrap().sent += n;
                left -= n;
                chunk.clear();
            }
        }
    }
    s.shutdown().await
}

/// What the Keeper-like peer answers the first request after the handshake with.
#[derive(Clone, Copy)]
pub enum KeeperAnswer {
    /// A reply header and then this count of items, and nothing more.
    Count(i32),
    /// A packet length of 16 MiB, and then nothing.
    Announce16MiB,
}

/// A Keeper-like peer: a proper handshake, then `answer`.
pub async fn keeper(answer: KeeperAnswer) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = keeper_answer(&mut s, answer).await;
            });
        }
    });
    addr
}

async fn read_packet(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = s.read_i32().await?;
    let mut b = vec![0u8; len.clamp(0, 1 << 20) as usize];
    s.read_exact(&mut b).await?;
    Ok(b)
}

async fn keeper_answer(s: &mut TcpStream, answer: KeeperAnswer) -> std::io::Result<()> {
    read_packet(s).await?;
    // connect response: protocol, timeout, session id, password
    let mut r = Vec::new();
    r.extend_from_slice(&0i32.to_be_bytes());
    r.extend_from_slice(&30_000i32.to_be_bytes());
    r.extend_from_slice(&7i64.to_be_bytes());
    r.extend_from_slice(&16i32.to_be_bytes());
    r.extend_from_slice(&[0u8; 16]);
    s.write_all(&(r.len() as i32).to_be_bytes()).await?;
    s.write_all(&r).await?;
    let request = read_packet(s).await?;
    let xid = &request[..4];
    match answer {
        KeeperAnswer::Count(n) => {
            let mut r = Vec::new();
            r.extend_from_slice(xid);
            r.extend_from_slice(&1i64.to_be_bytes());
            r.extend_from_slice(&0i32.to_be_bytes());
            r.extend_from_slice(&n.to_be_bytes());
            r.extend_from_slice(&[0u8; 32]);
            s.write_all(&(r.len() as i32).to_be_bytes()).await?;
            s.write_all(&r).await?;
        }
        KeeperAnswer::Announce16MiB => {
            s.write_all(&(16i32 << 20).to_be_bytes()).await?;
            s.write_all(xid).await?;
        }
    }
    // hold the connection open without a further byte
    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    Ok(())
}
