//! `local-kubelet keeper-gate`: ClickHouse Keeper's client port, in front of the ZooKeeper
//! stand-in.
//!
//! Standalone Keeper initialises RAFT before it creates its `keeper_server.tcp_port` listeners:
//! it waits until a leader is known and the member is caught up, or until
//! `coordination_settings.startup_timeout` (default 180 s) has passed, and only then opens the
//! port (afterwards, without a quorum, four-letter words answer that the instance is not
//! serving). ZooKeeper opens its client port at once. So ZooKeeper serves on a loopback port and
//! this gate, started by the emulated Keeper in the container's namespaces and process group,
//! opens the configured port on every address once ZooKeeper serves (it accepts a session) or
//! once the startup timeout has passed, then forwards every connection byte for byte for the
//! life of the container.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Whether the ZooKeeper at `upstream` serves: it answers a session request (a member without
/// a quorum closes the connection instead). The session is closed again at once.
pub fn serving(upstream: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&upstream, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(3)));
    // ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly
    let mut req = Vec::with_capacity(49);
    req.extend_from_slice(&45i32.to_be_bytes());
    req.extend_from_slice(&0i32.to_be_bytes());
    req.extend_from_slice(&0i64.to_be_bytes());
    req.extend_from_slice(&10_000i32.to_be_bytes());
    req.extend_from_slice(&0i64.to_be_bytes());
    req.extend_from_slice(&16i32.to_be_bytes());
    req.extend_from_slice(&[0u8; 16]);
    req.push(0);
    if s.write_all(&req).is_err() {
        return false;
    }
    let mut len = [0u8; 4];
    if s.read_exact(&mut len).is_err() {
        return false;
    }
    let n = i32::from_be_bytes(len);
    if n <= 0 {
        return false;
    }
    let mut body = vec![0u8; n as usize];
    if s.read_exact(&mut body).is_err() {
        return false;
    }
    // closeSession: xid 1, type -11
    let mut close = Vec::with_capacity(12);
    close.extend_from_slice(&8i32.to_be_bytes());
    close.extend_from_slice(&1i32.to_be_bytes());
    close.extend_from_slice(&(-11i32).to_be_bytes());
    let _ = s.write_all(&close);
    let _ = s.read(&mut len);
    true
}

fn forward(mut client: TcpStream, upstream: SocketAddr) {
    // ZooKeeper is dialled once the client says something: a bare connection (a tcpSocket
    // probe) never reaches it, as it never reaches Keeper's request handling
    let mut first = [0u8; 4096];
    let n = match client.read(&mut first) {
        Ok(0) | Err(_) => return,
        Ok(n) => n,
    };
    let Ok(mut server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    if server.write_all(&first[..n]).is_err() {
        return;
    }
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(mut c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let mut c = client;
        let mut s = server;
        let _ = std::io::copy(&mut c, &mut s);
        let _ = s.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut s2, &mut c2);
    let _ = c2.shutdown(Shutdown::Write);
    let _ = up.join();
}

fn listen(port: u16) -> TcpListener {
    let t0 = Instant::now();
    loop {
        if let Ok(l) =
            TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        {
            return l;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            eprintln!("keeper-gate: cannot listen on port {port}");
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn run(port: u16, upstream: SocketAddr, startup_timeout: Duration) -> ! {
    let t0 = Instant::now();
    loop {
        if serving(upstream) {
            eprintln!(
                "keeper-gate: RAFT initialised after {} ms, listening on port {port}",
                t0.elapsed().as_millis()
            );
            break;
        }
        if t0.elapsed() >= startup_timeout {
            eprintln!(
                "keeper-gate: Failed to wait for RAFT initialization in {}ms, will continue in background; listening on port {port}",
                startup_timeout.as_millis()
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let l = listen(port);
    for c in l.incoming().flatten() {
        std::thread::spawn(move || forward(c, upstream));
    }
    std::process::exit(0)
}
