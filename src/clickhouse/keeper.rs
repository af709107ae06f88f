//! A small client of the ZooKeeper protocol that ClickHouse Keeper speaks: one session to one
//! member, the few requests the operator needs, every call under one deadline.
//!
//! The operator reads each member's committed cluster configuration with it (decision 25: a
//! Keeper membership change is done only when every remaining member lists the new members).
//! ClickHouse Keeper keeps that configuration in the virtual node [`KEEPER_CONFIG`]; ZooKeeper
//! (3.5 and later, with dynamic reconfiguration) in [`ZOOKEEPER_CONFIG`]. [`Session::members`]
//! reads the first that exists, so both work.
//!
//! Wire format (jute): every packet is a big-endian `i32` length and then the record; strings
//! and buffers are an `i32` length (`-1` for none) and the bytes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// ClickHouse Keeper's virtual node with the last committed cluster configuration.
pub const KEEPER_CONFIG: &str = "/keeper/config";
/// ZooKeeper's node with the last committed dynamic configuration.
pub const ZOOKEEPER_CONFIG: &str = "/zookeeper/config";

/// Largest reply accepted (a configuration or a list of children, never data of users).
const MAX_PACKET: usize = 16 << 20;

/// What went wrong talking to a Keeper member.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Keeper {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("Keeper {addr}: no answer within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("Keeper {addr}: {what} failed with error {code} ({})", code_name(*.code))]
    Server {
        addr: SocketAddr,
        what: &'static str,
        code: i32,
    },
    #[error("Keeper {0}: malformed reply: {1}")]
    Protocol(SocketAddr, String),
}

impl Error {
    /// The server's error code, if the server answered with one.
    pub fn code(&self) -> Option<i32> {
        match self {
            Error::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// `ZNONODE`: the node does not exist.
pub const NO_NODE: i32 = -101;
/// `ZNODEEXISTS`.
pub const NODE_EXISTS: i32 = -110;
/// ZooKeeper's error code for a node whose ACL refuses the session.
pub const NO_AUTH: i32 = -102;

fn code_name(code: i32) -> &'static str {
    match code {
        -4 => "connection loss",
        -7 => "operation timeout",
        -8 => "bad arguments",
        -13 => "new configuration has no quorum",
        -14 => "reconfiguration in progress",
        -101 => "no node",
        -102 => "no auth",
        -110 => "node exists",
        -112 => "session expired",
        -115 => "authentication failed",
        -123 => "reconfiguration disabled",
        _ => "see the ZooKeeper error codes",
    }
}

/// Opcodes of the requests this client sends.
mod op {
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const SET_ACL: i32 = 7;
    pub const GET_CHILDREN: i32 = 8;
    pub const RECONFIG: i32 = 16;
    pub const AUTH: i32 = 100;
    pub const CLOSE: i32 = -11;
}

/// ZooKeeper's permissions of an ACL entry.
pub mod perms {
    pub const READ: i32 = 1;
    pub const WRITE: i32 = 2;
    pub const CREATE: i32 = 4;
    pub const DELETE: i32 = 8;
    pub const ADMIN: i32 = 16;
    pub const ALL: i32 = 31;
}

/// One entry of a znode's ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclEntry {
    pub perms: i32,
    /// `world`, `digest`, `ip`, …
    pub scheme: String,
    /// `anyone`, or `<user>:<base64 of SHA-1 of user:password>` for a digest.
    pub id: String,
}

impl AclEntry {
    /// Everyone, with `perms`.
    pub fn world(perms: i32) -> AclEntry {
        AclEntry {
            perms,
            scheme: "world".into(),
            id: "anyone".into(),
        }
    }

    /// The digest identity `user:password`, with `perms`: the id ZooKeeper and ClickHouse
    /// Keeper compare, `user:base64(sha1("user:password"))`.
    pub fn digest(identity: &str, perms: i32) -> AclEntry {
        use sha1::{Digest, Sha1};
        let user = identity.split(':').next().unwrap_or_default();
        let hash = Sha1::digest(identity.as_bytes());
        AclEntry {
            perms,
            scheme: "digest".into(),
            id: format!("{user}:{}", base64(&hash)),
        }
    }
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn put_acl(body: &mut Vec<u8>, acl: &[AclEntry]) {
    put_i32(body, acl.len() as i32);
    for e in acl {
        put_i32(body, e.perms);
        put_str(body, &e.scheme);
        put_str(body, &e.id);
    }
}

/// One member's view of the ensemble: raft id → address and role, as its committed
/// configuration lists them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Membership {
    pub servers: BTreeMap<u32, Member>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Host of the member's raft (quorum) address.
    pub host: String,
    /// `participant` (votes) or `learner`/`observer` (does not).
    pub role: String,
}

impl Membership {
    /// Parses `server.<id>=<host>:<port>[:<port>][:<role>][;…]` lines (both ClickHouse Keeper's
    /// `/keeper/config` and ZooKeeper's `/zookeeper/config`); other lines (`version=…`) are
    /// skipped.
    pub fn parse(text: &str) -> Result<Membership, String> {
        let mut servers = BTreeMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let Some(rest) = line.strip_prefix("server.") else {
                continue;
            };
            let (id, value) = rest
                .split_once('=')
                .ok_or_else(|| format!("no '=' in {line:?}"))?;
            let id: u32 = id
                .trim()
                .parse()
                .map_err(|_| format!("server id in {line:?}"))?;
            let mut parts = value.trim().split(';');
            let addr = parts.next().unwrap_or_default();
            let mut fields = addr.split(':');
            let host = fields.next().unwrap_or_default().trim().to_string();
            if host.is_empty() {
                return Err(format!("no host in {line:?}"));
            }
            // ZooKeeper: host:quorum:election[:role]; ClickHouse Keeper: host:port;role;priority
            let zk_role = fields
                .filter(|f| f.parse::<u16>().is_err())
                .map(str::to_string)
                .next();
            let ch_role = parts
                .next()
                .filter(|p| p.parse::<u64>().is_err() && !p.contains(':'))
                .map(str::to_string);
            let role = zk_role.or(ch_role).unwrap_or_else(|| "participant".into());
            servers.insert(id, Member { host, role });
        }
        Ok(Membership { servers })
    }

    /// Ids of the voting members.
    pub fn voters(&self) -> Vec<u32> {
        self.servers
            .iter()
            .filter(|(_, m)| m.role == "participant")
            .map(|(id, _)| *id)
            .collect()
    }
}

/// A session with one member.
pub struct Session {
    addr: SocketAddr,
    stream: TcpStream,
    timeout: Duration,
    xid: i32,
}

impl Session {
    /// Opens a session (the whole handshake within `timeout`); every later call has the same
    /// deadline.
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Session, Error> {
        let stream = within(addr, timeout, async {
            TcpStream::connect(addr)
                .await
                .map_err(|source| Error::Io { addr, source })
        })
        .await?;
        let _ = stream.set_nodelay(true);
        let mut s = Session {
            addr,
            stream,
            timeout,
            xid: 0,
        };
        let mut req = Vec::new();
        put_i32(&mut req, 0); // protocol version
        put_i64(&mut req, 0); // last zxid seen
        put_i32(&mut req, timeout.as_millis().clamp(2_000, 60_000) as i32); // session timeout
        put_i64(&mut req, 0); // session id
        put_buf(&mut req, Some(&[0u8; 16])); // password
        req.push(0); // read-only: no
        let reply = s.round_trip(req).await?;
        let mut r = Reader::new(addr, &reply);
        let _protocol = r.i32()?;
        let negotiated = r.i32()?;
        let session = r.i64()?;
        if negotiated <= 0 || session == 0 {
            return Err(Error::Protocol(addr, "session refused".into()));
        }
        Ok(s)
    }

    /// The member's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Authenticates with a digest identity (`user:password`).
    pub async fn add_digest_auth(&mut self, identity: &str) -> Result<(), Error> {
        let mut req = Vec::new();
        put_i32(&mut req, -4);
        put_i32(&mut req, op::AUTH);
        put_i32(&mut req, 0);
        put_str(&mut req, "digest");
        put_buf(&mut req, Some(identity.as_bytes()));
        let reply = self.round_trip(req).await?;
        let mut r = Reader::new(self.addr, &reply);
        let (_, _, err) = (r.i32()?, r.i64()?, r.i32()?);
        if err != 0 {
            return Err(self.server_error("authentication", err));
        }
        Ok(())
    }

    /// The data of `path`, or `None` if it does not exist.
    pub async fn get(&mut self, path: &str) -> Result<Option<Vec<u8>>, Error> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        body.push(0); // no watch
        match self.call(op::GET_DATA, "get", body).await {
            Ok(reply) => {
                let mut r = Reader::new(self.addr, &reply);
                Ok(Some(r.buf()?.unwrap_or_default()))
            }
            Err(e) if e.code() == Some(NO_NODE) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The names of the children of `path`.
    pub async fn children(&mut self, path: &str) -> Result<Vec<String>, Error> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        body.push(0);
        let reply = self.call(op::GET_CHILDREN, "list", body).await?;
        let mut r = Reader::new(self.addr, &reply);
        // each name is at least its 4-byte length
        let n = r.count(4)?;
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            names.push(r.string()?);
        }
        Ok(names)
    }

    /// Creates a persistent node with `acl`; the path created.
    pub async fn create(
        &mut self,
        path: &str,
        data: &[u8],
        acl: &[AclEntry],
    ) -> Result<String, Error> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        put_buf(&mut body, Some(data));
        put_acl(&mut body, acl);
        put_i32(&mut body, 0); // persistent
        let reply = self.call(op::CREATE, "create", body).await?;
        Reader::new(self.addr, &reply).string()
    }

    /// The ACL of `path`.
    pub async fn acl(&mut self, path: &str) -> Result<Vec<AclEntry>, Error> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        let reply = self.call(op::GET_ACL, "get acl", body).await?;
        let mut r = Reader::new(self.addr, &reply);
        // each entry is at least its permissions and two string lengths
        let n = r.count(12)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(AclEntry {
                perms: r.i32()?,
                scheme: r.string()?,
                id: r.string()?,
            });
        }
        Ok(out)
    }

    /// Replaces the ACL of `path` (any version).
    pub async fn set_acl(&mut self, path: &str, acl: &[AclEntry]) -> Result<(), Error> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        put_acl(&mut body, acl);
        put_i32(&mut body, -1);
        self.call(op::SET_ACL, "set acl", body).await?;
        Ok(())
    }

    /// Replaces the data of `path` (any version).
    pub async fn set(&mut self, path: &str, data: &[u8]) -> Result<(), Error> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        put_buf(&mut body, Some(data));
        put_i32(&mut body, -1);
        self.call(op::SET_DATA, "set", body).await?;
        Ok(())
    }

    /// Deletes `path` (any version); it must have no children.
    pub async fn delete(&mut self, path: &str) -> Result<(), Error> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        put_i32(&mut body, -1);
        self.call(op::DELETE, "delete", body).await?;
        Ok(())
    }

    /// Asks the ensemble to add (`server.<id>=<address>` lines) and remove (ids) members.
    /// Needs an identity allowed to reconfigure; returns the new configuration.
    pub async fn reconfig(&mut self, joining: &[String], leaving: &[u32]) -> Result<String, Error> {
        let mut body = Vec::new();
        put_opt_str(&mut body, (!joining.is_empty()).then(|| joining.join(",")));
        put_opt_str(
            &mut body,
            (!leaving.is_empty()).then(|| {
                leaving
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            }),
        );
        put_opt_str(&mut body, None); // not a whole new member list
        put_i64(&mut body, -1); // whatever the current configuration is
        let reply = self.call(op::RECONFIG, "reconfig", body).await?;
        let data = Reader::new(self.addr, &reply).buf()?.unwrap_or_default();
        Ok(String::from_utf8_lossy(&data).into_owned())
    }

    /// This member's committed view of the ensemble ([`KEEPER_CONFIG`], else
    /// [`ZOOKEEPER_CONFIG`]); `None` when neither exists (a Keeper too old to publish it).
    pub async fn members(&mut self) -> Result<Option<Membership>, Error> {
        for path in [KEEPER_CONFIG, ZOOKEEPER_CONFIG] {
            if let Some(data) = self.get(path).await? {
                let text = String::from_utf8_lossy(&data);
                if text.trim().is_empty() {
                    continue;
                }
                return Membership::parse(&text)
                    .map(Some)
                    .map_err(|e| Error::Protocol(self.addr, e));
            }
        }
        Ok(None)
    }

    /// Ends the session (best effort).
    pub async fn close(mut self) {
        let _ = self.call(op::CLOSE, "close", Vec::new()).await;
    }

    fn server_error(&self, what: &'static str, code: i32) -> Error {
        Error::Server {
            addr: self.addr,
            what,
            code,
        }
    }

    /// Sends one request and returns the reply body after its header; an error code in the
    /// header is an [`Error::Server`].
    async fn call(
        &mut self,
        opcode: i32,
        what: &'static str,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        self.xid += 1;
        let xid = self.xid;
        let mut req = Vec::with_capacity(body.len() + 8);
        put_i32(&mut req, xid);
        put_i32(&mut req, opcode);
        req.extend_from_slice(&body);
        let addr = self.addr;
        let timeout = self.timeout;
        within(addr, timeout, async {
            self.send(&req).await?;
            loop {
                let reply = self.receive().await?;
                let mut r = Reader::new(addr, &reply);
                let got = r.i32()?;
                let _zxid = r.i64()?;
                let err = r.i32()?;
                if got != xid {
                    // a watch event (-1) or a ping reply (-2): not ours
                    continue;
                }
                if err != 0 {
                    return Err(self.server_error(what, err));
                }
                return Ok(reply[16..].to_vec());
            }
        })
        .await
    }

    async fn round_trip(&mut self, req: Vec<u8>) -> Result<Vec<u8>, Error> {
        let (addr, timeout) = (self.addr, self.timeout);
        within(addr, timeout, async {
            self.send(&req).await?;
            self.receive().await
        })
        .await
    }

    async fn send(&mut self, body: &[u8]) -> Result<(), Error> {
        let mut packet = Vec::with_capacity(body.len() + 4);
        put_i32(&mut packet, body.len() as i32);
        packet.extend_from_slice(body);
        let addr = self.addr;
        self.stream
            .write_all(&packet)
            .await
            .map_err(|source| Error::Io { addr, source })
    }

    async fn receive(&mut self) -> Result<Vec<u8>, Error> {
        let addr = self.addr;
        let io = |source| Error::Io { addr, source };
        let len = self.stream.read_i32().await.map_err(io)?;
        if len < 0 || len as usize > MAX_PACKET {
            return Err(Error::Protocol(addr, format!("packet length {len}")));
        }
        // grown as the bytes arrive: a peer that announces 16 MiB and sends nothing costs
        // nothing (review M-1)
        let mut buf = Vec::new();
        (&mut self.stream)
            .take(len as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(io)?;
        if buf.len() != len as usize {
            return Err(Error::Protocol(
                addr,
                format!("packet of {len} bytes ended after {}", buf.len()),
            ));
        }
        Ok(buf)
    }
}

/// The longest four-letter-word answer read (a `mntr` is about 1 KiB).
const MAX_FOUR_LETTER_ANSWER: u64 = 64 << 10;

/// Sends the four-letter word `word` (`mntr`, `srvr`, `ruok`) to the member at `addr` and
/// returns its answer (the member closes the connection after it), all within `timeout`.
pub async fn four_letter_word(
    addr: SocketAddr,
    word: &str,
    timeout: Duration,
) -> Result<String, Error> {
    within(addr, timeout, async {
        let io = |source| Error::Io { addr, source };
        let mut s = TcpStream::connect(addr).await.map_err(io)?;
        s.write_all(word.as_bytes()).await.map_err(io)?;
        let mut out = Vec::new();
        s.take(MAX_FOUR_LETTER_ANSWER)
            .read_to_end(&mut out)
            .await
            .map_err(io)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    })
    .await
}

async fn within<T>(
    addr: SocketAddr,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(timeout, f)
        .await
        .unwrap_or(Err(Error::Timeout { addr, timeout }))
}

fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_buf(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        Some(b) => {
            put_i32(out, b.len() as i32);
            out.extend_from_slice(b);
        }
        None => put_i32(out, -1),
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_buf(out, Some(s.as_bytes()));
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<String>) {
    put_buf(out, s.as_deref().map(str::as_bytes));
}

struct Reader<'a> {
    addr: SocketAddr,
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(addr: SocketAddr, data: &'a [u8]) -> Reader<'a> {
        Reader { addr, data, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(Error::Protocol(
                self.addr,
                format!("{} bytes wanted at {} of {}", n, self.at, self.data.len()),
            ));
        };
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn i32(&mut self) -> Result<i32, Error> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self) -> Result<i64, Error> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    /// A count of items that follow, each at least `min_bytes` long: refused when the rest of
    /// the reply cannot hold that many, before anything is allocated for them (review M-1: a
    /// peer's count of 2^31 - 1 ACL entries would otherwise ask for about 120 GB at once).
    fn count(&mut self, min_bytes: usize) -> Result<usize, Error> {
        let n = self.i32()?;
        let left = self.data.len() - self.at;
        let n = usize::try_from(n.max(0)).unwrap_or(0);
        if n > left / min_bytes.max(1) {
            return Err(Error::Protocol(
                self.addr,
                format!("{n} items announced in the {left} bytes left of the reply"),
            ));
        }
        Ok(n)
    }

    fn buf(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(None);
        }
        Ok(Some(self.take(n as usize)?.to_vec()))
    }

    fn string(&mut self) -> Result<String, Error> {
        Ok(String::from_utf8_lossy(&self.buf()?.unwrap_or_default()).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest id ZooKeeper and ClickHouse Keeper compare: `user:base64(sha1(user:pw))`.
    #[test]
    fn digest_ids_are_the_ones_zookeeper_computes() {
        assert_eq!(
            AclEntry::digest("clickhouse:pw", perms::ALL).id,
            "clickhouse:tqaygLm/2ElCUwNvSmNLKyJ8qVk="
        );
        assert_eq!(
            AclEntry::digest("super:adminsecret", perms::ALL).id,
            "super:GcMT0ijsx21yLyTWAWMqFV/azZE="
        );
        assert_eq!(
            (base64(b"a"), base64(b"ab"), base64(b"abc")),
            ("YQ==".into(), "YWI=".into(), "YWJj".into())
        );
    }

    #[test]
    fn membership_is_read_from_both_keeper_and_zookeeper_formats() {
        let keeper = "server.1=k-0.k.ns.svc.cluster.local:9234;participant;1\n\
                      server.2=k-1.k.ns.svc.cluster.local:9234;learner;0\n";
        let m = Membership::parse(keeper).unwrap();
        assert_eq!(m.servers.len(), 2);
        assert_eq!(m.servers[&1].host, "k-0.k.ns.svc.cluster.local");
        assert_eq!(m.voters(), vec![1]);

        let zk = "server.1=k-0.k:9234:9235:participant;0.0.0.0:9181\n\
                  server.3=k-2.k:9234:9235:observer;0.0.0.0:9181\n\
                  server.2=k-1.k:9234:9235;9181\nversion=100000003\n";
        let m = Membership::parse(zk).unwrap();
        assert_eq!(m.servers.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(m.voters(), vec![1, 2]);
        assert_eq!(m.servers[&3].role, "observer");
    }

    #[test]
    fn malformed_membership_lines_are_refused_with_the_line() {
        let e = Membership::parse("server.x=a:1").unwrap_err();
        assert!(e.contains("server.x=a:1"), "{e}");
        assert!(Membership::parse("server.1=:9234").is_err());
        assert_eq!(Membership::parse("").unwrap(), Membership::default());
    }

    /// Review M-1: a count of items larger than the reply can hold (a peer announcing
    /// 2^31 - 1 ACL entries or children) is a protocol error, not an allocation of that many.
    #[test]
    fn counts_beyond_the_reply_are_refused_before_allocating() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut reply = i32::MAX.to_be_bytes().to_vec();
        reply.extend_from_slice(&[0; 64]);
        let e = Reader::new(addr, &reply).count(12).unwrap_err();
        assert!(e.to_string().contains("2147483647 items announced"), "{e}");
        let mut ok = 2i32.to_be_bytes().to_vec();
        ok.extend_from_slice(&[0; 8]);
        assert_eq!(Reader::new(addr, &ok).count(4).unwrap(), 2);
        assert!(Reader::new(addr, &ok).count(5).is_err());
        assert_eq!(
            Reader::new(addr, &(-1i32).to_be_bytes()).count(4).unwrap(),
            0
        );
    }

    #[test]
    fn short_replies_are_protocol_errors_not_panics() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut r = Reader::new(addr, &[0, 0, 0, 9, 1]);
        assert!(matches!(r.buf(), Err(Error::Protocol(..))));
        let mut r = Reader::new(addr, &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(r.buf().unwrap(), None);
    }
}
