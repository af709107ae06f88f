//! A thin client for ClickHouse's HTTP interface (S1-02: the schema SQL goes over HTTP).
//!
//! Why not the `clickhouse` crate: by default it asks for `RowBinaryWithNamesAndTypes`, which
//! the 18.16 test server lacks ("Unknown format"), so its behaviour would have to switch per
//! server version; and nearly everything the operator sends is plain DDL or `SYSTEM`
//! statements whose text must be chosen per version anyway. Plain HTTP with `JSONCompact`
//! (present in 18.16 and every later version; 64-bit integers arrive as strings) keeps one
//! code path for all versions and lets errors keep ClickHouse's own code and message.
//!
//! Every call has a timeout; every statement is logged at debug level before it is sent
//! (Altinity's `SetLogQueries`), its string literals masked; [`QueryOptions::retry`] retries
//! failures that may pass on their own with exponential backoff (`SetRetry`).
//!
//! Errors name a statement by its [`summary`] (its leading words and names, never a string
//! literal), and a server's message has the statement's literals hidden: literals are where
//! credentials are (an S3 key in `BACKUP … TO S3(…)`, a password in a MySQL engine), and an
//! error reaches statuses, Events and logs.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::lexer::{hide_literals_of, mask_literals, summary};
use crate::api::ClickHouseCluster;
use crate::conventions::{HTTP_PORT, HTTPS_PORT};

/// Where a replica answers HTTP: the address as the operator observes it (the pod IP, or a
/// host name) and the HTTP(S) port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// IP address or host name.
    pub host: String,
    /// The HTTP port (8123) or HTTPS port (8443).
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The operator's own ClickHouse user.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub user: String,
    /// Password, sent in the `X-ClickHouse-Key` header (18.16 honours it: a wrong key gives
    /// Code 193 "Wrong password").
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How failed statements are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// Delay after the first failure; doubles with each further one.
    pub first_delay: Duration,
    /// Upper bound of the delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            first_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt `n` (1 = the first attempt).
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.first_delay
            .checked_mul(factor)
            .map_or(self.max_delay, |d| d.min(self.max_delay))
    }
}

/// Everything needed to talk to one replica.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The replica's address.
    pub endpoint: Endpoint,
    /// The operator's user.
    pub credentials: Credentials,
    /// `Some(ca.pem)`: HTTPS, trusting only the CA certificate(s) in this PEM bundle.
    /// `None`: plain HTTP.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// Without a CA: HTTPS all the same, the certificate not verified (TLS enabled without a CA:
    /// encrypted, not authenticated; the password never travels in clear).
    pub tls_unverified: bool,
    /// With TLS: the DNS name the server's certificate is verified against (and sent as SNI),
    /// while the connection still goes to the endpoint's address. `None`: the endpoint's host.
    pub tls_server_name: Option<String>,
    /// Timeout of each call unless [`QueryOptions::timeout`] says otherwise.
    pub timeout: Duration,
    /// Retry policy of calls with [`QueryOptions::retry`].
    pub retry: RetryPolicy,
    /// The most bytes of an answer read (review M-1): a larger one fails with
    /// [`Error::TooLarge`] once that many arrived, whatever the server goes on sending.
    pub max_answer_bytes: usize,
}

/// The most bytes of an answer the operator and the backup agent read from a server
/// ([`ClientConfig::max_answer_bytes`] by default, decision 69): a server is code a cluster's
/// editor chooses (`spec.image`), and the operator is shared by every cluster.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The most bytes of an error answer kept (the rest is cut off, the error still reported).
pub const MAX_ERROR_BYTES: usize = 64 << 10;

/// The bytes all answers being read, parsed or held as [`Rows`] may take at once in the
/// operator's process (decision 69): each answer is charged its bytes as they arrive and, before
/// it is parsed, [`PARSED_BYTES_PER_VALUE`] for every value it may hold, and waits for room
/// while other answers fill the budget. One answer that could never fit is refused.
pub const ANSWER_BUDGET_BYTES: usize = 64 << 20;

/// What a parsed JSON value may cost at most (its `Value` and its share of the row vectors).
pub const PARSED_BYTES_PER_VALUE: usize = 64;

/// The unit of the budget's permits.
const BUDGET_UNIT: usize = 1 << 10;

static BUDGET: std::sync::OnceLock<(Arc<tokio::sync::Semaphore>, usize)> =
    std::sync::OnceLock::new();

/// Sets this process's budget for answers (the exporter's is smaller than the operator's);
/// false once the budget is in use.
pub fn set_answer_budget(bytes: usize) -> bool {
    let units = bytes.div_ceil(BUDGET_UNIT);
    BUDGET
        .set((
            Arc::new(tokio::sync::Semaphore::new(units)),
            units * BUDGET_UNIT,
        ))
        .is_ok()
}

fn budget() -> &'static (Arc<tokio::sync::Semaphore>, usize) {
    BUDGET.get_or_init(|| {
        let units = ANSWER_BUDGET_BYTES / BUDGET_UNIT;
        (
            Arc::new(tokio::sync::Semaphore::new(units)),
            units * BUDGET_UNIT,
        )
    })
}

/// The answer budget's bytes not taken now (for tests and metrics).
pub fn answer_budget_free() -> usize {
    budget().0.available_permits() * BUDGET_UNIT
}

/// The share of the answer budget one answer holds; given back when dropped (with the last
/// [`Rows`] cloned from it).
#[derive(Clone, Default)]
pub struct Charge(Option<Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>>);

impl Charge {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.0
            .as_ref()
            .and_then(|m| {
                m.lock()
                    .ok()
                    .map(|p| p.as_ref().map_or(0, |p| p.num_permits()))
            })
            .unwrap_or(0)
            * BUDGET_UNIT
    }

    /// Grows the charge to `bytes` in all. A charge that holds nothing yet waits up to `wait`
    /// for room; one that holds some takes only room that is free now, so that no answer waits
    /// while holding a share (answers growing together would otherwise wait for each other
    /// until their timeouts). `Err(true)`: it can never fit the budget; `Err(false)`: no room.
    async fn grow_to(&mut self, bytes: usize, wait: Duration) -> Result<(), bool> {
        let (sem, total) = budget();
        if bytes > *total {
            return Err(true);
        }
        let held = self.bytes() / BUDGET_UNIT;
        let want = bytes.div_ceil(BUDGET_UNIT);
        if want <= held {
            return Ok(());
        }
        let more = u32::try_from(want - held).map_err(|_| true)?;
        let permit = if held == 0 {
            tokio::time::timeout(wait, sem.clone().acquire_many_owned(more))
                .await
                .map_err(|_| false)?
                .map_err(|_| false)?
        } else {
            sem.clone()
                .try_acquire_many_owned(more)
                .map_err(|_| false)?
        };
        let slot = self.0.get_or_insert_with(Default::default);
        let mut guard = slot.lock().map_err(|_| false)?;
        match guard.as_mut() {
            Some(p) => p.merge(permit),
            None => *guard = Some(permit),
        }
        Ok(())
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes())
    }
}

/// Charges are not part of what rows are.
impl PartialEq for Charge {
    fn eq(&self, _: &Charge) -> bool {
        true
    }
}

/// At most how many JSON values `body` holds: every value but the first follows a `,` or
/// opens an array or object (commas inside strings only make it more).
fn values_at_most(body: &str) -> usize {
    1 + body
        .bytes()
        .filter(|b| matches!(b, b',' | b'[' | b'{'))
        .count()
}

/// How a client speaks TLS to a server: what it trusts, and the name it verifies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tls {
    /// The CA certificate(s), PEM, the server's certificate is verified with; `None`:
    /// encrypted, not verified.
    pub ca: Option<Vec<u8>>,
    /// The DNS name the certificate is verified against; `None`: the endpoint's host.
    pub server_name: Option<String>,
}

impl ClientConfig {
    /// Plain HTTP with a 30 s timeout and the default retry policy.
    pub fn new(endpoint: Endpoint, credentials: Credentials) -> ClientConfig {
        ClientConfig {
            endpoint,
            credentials,
            tls_ca_pem: None,
            tls_unverified: false,
            tls_server_name: None,
            timeout: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            max_answer_bytes: MAX_ANSWER_BYTES,
        }
    }

    /// How `credentials` reach the server at `endpoint`: with `tls`, HTTPS only (the password
    /// never travels in clear), verified with its CA by its server name, encrypted but not
    /// verified without a CA; plain HTTP without. Every client of a server is configured here
    /// (the operator's passes, the metrics exporter, the backup agent), then given its timeout
    /// and retries.
    pub fn for_server(
        endpoint: Endpoint,
        credentials: Credentials,
        tls: Option<Tls>,
    ) -> ClientConfig {
        let mut config = ClientConfig::new(endpoint, credentials);
        if let Some(tls) = tls {
            config.tls_unverified = tls.ca.is_none();
            config.tls_ca_pem = tls.ca;
            config.tls_server_name = tls.server_name;
        }
        config
    }

    /// How `credentials` reach the server of `replica` of `cluster` at `ip` (its pod's
    /// address): with the cluster's TLS on, HTTPS on [`HTTPS_PORT`], verified by the pod's DNS
    /// name (as cert-manager names hosts) with the cluster's CA `ca` (`ca.crt` of
    /// `spec.tls.caSecret`); plain HTTP on [`HTTP_PORT`] without TLS (see [`Self::for_server`]).
    pub fn for_replica(
        cluster: &ClickHouseCluster,
        replica: &str,
        ip: String,
        credentials: Credentials,
        ca: Option<Vec<u8>>,
    ) -> ClientConfig {
        let address = ReplicaAddress {
            cluster: cluster.metadata.name.as_deref().unwrap_or_default(),
            namespace: cluster.metadata.namespace.as_deref().unwrap_or_default(),
            domain: cluster.spec.cluster_domain(),
            tls: cluster.spec.tls.enabled,
            replica,
        };
        ClientConfig::for_replica_of(&address, ip, credentials, ca)
    }

    /// [`Self::for_replica`] for a replica known by its [`ReplicaAddress`].
    pub fn for_replica_of(
        address: &ReplicaAddress,
        ip: String,
        credentials: Credentials,
        ca: Option<Vec<u8>>,
    ) -> ClientConfig {
        let on = address.tls;
        let tls = on.then(|| Tls {
            ca,
            server_name: Some(crate::util::names::replica_host(
                address.cluster,
                address.namespace,
                address.domain,
                address.replica,
            )),
        });
        let port = if on { HTTPS_PORT } else { HTTP_PORT };
        let endpoint = Endpoint {
            host: ip,
            port: port as u16,
        };
        ClientConfig::for_server(endpoint, credentials, tls)
    }
}

/// What names a replica's server for a client: its cluster, namespace and DNS domain, whether
/// the cluster has TLS on, and the replica.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaAddress<'a> {
    pub cluster: &'a str,
    pub namespace: &'a str,
    pub domain: &'a str,
    pub tls: bool,
    pub replica: &'a str,
}

/// Per-statement options: ClickHouse settings (sent as URL parameters), retry, timeout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryOptions {
    settings: Vec<(String, String)>,
    retry: bool,
    timeout: Option<Duration>,
}

impl QueryOptions {
    /// No settings, no retry, the client's timeout.
    pub fn new() -> QueryOptions {
        QueryOptions::default()
    }

    /// Adds a ClickHouse setting, e.g. `("skip_unavailable_shards", "1")`.
    pub fn setting(mut self, name: &str, value: impl ToString) -> QueryOptions {
        self.settings.push((name.to_string(), value.to_string()));
        self
    }

    /// Retries retryable failures with backoff (`SetRetry(true)`).
    pub fn retry(mut self, retry: bool) -> QueryOptions {
        self.retry = retry;
        self
    }

    /// Overrides the client's timeout for this statement.
    pub fn timeout(mut self, timeout: Duration) -> QueryOptions {
        self.timeout = Some(timeout);
        self
    }
}

/// A ClickHouse error code (`Code: 253`), kept so callers can classify failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// `UNKNOWN_TABLE`.
    pub const UNKNOWN_TABLE: ErrorCode = ErrorCode(60);
    /// `SYNTAX_ERROR`: the statement does not exist in this version.
    pub const SYNTAX_ERROR: ErrorCode = ErrorCode(62);
    /// `UNKNOWN_DATABASE`.
    pub const UNKNOWN_DATABASE: ErrorCode = ErrorCode(81);
    /// `TIMEOUT_EXCEEDED`.
    pub const TIMEOUT_EXCEEDED: ErrorCode = ErrorCode(159);
    /// `WRONG_PASSWORD` (18.16) / `AUTHENTICATION_FAILED` (516, later).
    pub const WRONG_PASSWORD: ErrorCode = ErrorCode(193);
    /// `SOCKET_TIMEOUT`.
    pub const SOCKET_TIMEOUT: ErrorCode = ErrorCode(209);
    /// `NETWORK_ERROR`.
    pub const NETWORK_ERROR: ErrorCode = ErrorCode(210);
    /// `NO_ZOOKEEPER`.
    pub const NO_ZOOKEEPER: ErrorCode = ErrorCode(225);
    /// `TABLE_IS_READ_ONLY` (the replica lost its Keeper session).
    pub const TABLE_IS_READ_ONLY: ErrorCode = ErrorCode(242);
    /// `REPLICA_ALREADY_EXISTS`: stale Keeper metadata of a replica of the same name.
    pub const REPLICA_ALREADY_EXISTS: ErrorCode = ErrorCode(253);
    /// `ALL_CONNECTION_TRIES_FAILED`.
    pub const ALL_CONNECTION_TRIES_FAILED: ErrorCode = ErrorCode(279);
    /// `TABLE_WAS_NOT_DROPPED`: also `SYSTEM DROP REPLICA`'s refusal of an active replica.
    pub const TABLE_WAS_NOT_DROPPED: ErrorCode = ErrorCode(305);
    /// `AUTHENTICATION_FAILED`.
    pub const AUTHENTICATION_FAILED: ErrorCode = ErrorCode(516);
    /// `KEEPER_EXCEPTION` (`Coordination::Exception`, "ZooKeeper" in 18.16).
    pub const KEEPER_EXCEPTION: ErrorCode = ErrorCode(999);
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Code: {}", self.0)
    }
}

/// A failed call to one replica.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// ClickHouse answered with an exception.
    #[error("{endpoint}: ClickHouse error {}: {message} (statement: {statement})", .code.map_or("without code".to_string(), |c| c.0.to_string()))]
    Server {
        /// The replica.
        endpoint: Endpoint,
        /// `Code: N` of the exception, when the answer had one.
        code: Option<ErrorCode>,
        /// The HTTP status.
        status: u16,
        /// ClickHouse's message, the statement's string literals hidden.
        message: String,
        /// What the statement was, for the status message (S1-06): its [`summary`].
        statement: String,
    },
    /// The replica could not be reached or did not answer in time.
    #[error("{endpoint}: {} (statement: {statement})", chain(.source))]
    Transport {
        /// The replica.
        endpoint: Endpoint,
        /// What reqwest reported.
        source: reqwest::Error,
        /// What the statement was: its [`summary`].
        statement: String,
    },
    /// The answer could not be read as the expected rows.
    #[error("{endpoint}: unexpected answer to {statement}: {detail}")]
    Decode {
        /// The replica.
        endpoint: Endpoint,
        /// What did not fit.
        detail: String,
        /// What the statement was: its [`summary`].
        statement: String,
    },
    /// The answer was larger than the client reads (review M-1): the server is broken or
    /// hostile; the rest of it was not read.
    #[error("{endpoint}: the answer to {statement} is larger than {} KiB, the most read from a server; the rest was not read", .limit >> 10)]
    TooLarge {
        /// The replica.
        endpoint: Endpoint,
        /// The limit, in bytes.
        limit: usize,
        /// What the statement was: its [`summary`].
        statement: String,
    },
    /// The answers of other servers held the answer budget when this one needed more of it:
    /// retried.
    #[error("{endpoint}: no room to read the answer to {statement}: answers of other servers fill the {} MiB read at once", .budget >> 20)]
    Busy {
        /// The replica.
        endpoint: Endpoint,
        /// The budget, in bytes.
        budget: usize,
        /// What the statement was: its [`summary`].
        statement: String,
    },
    /// The client could not be built (e.g. an invalid CA certificate).
    #[error("ClickHouse client for {endpoint}: {detail}")]
    Config {
        /// The replica.
        endpoint: Endpoint,
        /// What was wrong.
        detail: String,
    },
}

impl Error {
    /// The statement did not finish in time (the server's `TIMEOUT_EXCEEDED`, or no answer
    /// within the client's timeout): it may succeed when run again later.
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Server { code, .. } => *code == Some(ErrorCode::TIMEOUT_EXCEEDED),
            Error::Transport { source, .. } => source.is_timeout(),
            _ => false,
        }
    }

    /// ClickHouse's error code, if the server sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { code, .. } => *code,
            _ => None,
        }
    }

    /// The replica the error came from.
    pub fn endpoint(&self) -> &Endpoint {
        match self {
            Error::Server { endpoint, .. }
            | Error::Transport { endpoint, .. }
            | Error::Decode { endpoint, .. }
            | Error::TooLarge { endpoint, .. }
            | Error::Busy { endpoint, .. }
            | Error::Config { endpoint, .. } => endpoint,
        }
    }

    /// `SYSTEM DROP REPLICA` / `SYSTEM DROP DATABASE REPLICA` refused because the replica is
    /// still active ("Can't drop replica: …, because it's active"): it goes away once the
    /// leaving server has stopped, so this is retried, never forgotten.
    pub fn is_replica_active(&self) -> bool {
        match self {
            Error::Server { message, .. } => {
                let m = message.to_ascii_lowercase();
                m.contains("because it's active") || m.contains("replica is active")
            }
            _ => false,
        }
    }

    /// Whether the same statement may succeed later without anyone changing anything:
    /// unreachable or slow servers, Keeper trouble, an active replica. Syntax errors,
    /// authentication failures, `REPLICA_ALREADY_EXISTS` and a Keeper "No node" answer (a
    /// definite one) are not retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport { .. } | Error::Busy { .. } => true,
            Error::Decode { .. } | Error::Config { .. } | Error::TooLarge { .. } => false,
            Error::Server {
                code,
                status,
                message,
                ..
            } => {
                if self.is_replica_active() {
                    return true;
                }
                if message.contains("No node") {
                    return false;
                }
                match code {
                    Some(c) => matches!(
                        *c,
                        ErrorCode::TIMEOUT_EXCEEDED
                            | ErrorCode::SOCKET_TIMEOUT
                            | ErrorCode::NETWORK_ERROR
                            | ErrorCode::NO_ZOOKEEPER
                            | ErrorCode::TABLE_IS_READ_ONLY
                            | ErrorCode::ALL_CONNECTION_TRIES_FAILED
                            | ErrorCode::KEEPER_EXCEPTION
                    ),
                    // A proxy or a starting server answering without a ClickHouse exception.
                    None => *status >= 500,
                }
            }
        }
    }
}

/// Rows of a `JSONCompact` answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    columns: Vec<String>,
    data: Vec<Vec<Value>>,
    /// The share of the answer budget these rows hold.
    charge: Charge,
}

#[derive(Deserialize)]
struct JsonCompact {
    meta: Vec<Column>,
    data: Vec<Vec<Value>>,
}

#[derive(Deserialize)]
struct Column {
    name: String,
}

impl Rows {
    /// Parses a `JSONCompact` body.
    pub fn from_json_compact(body: &str) -> Result<Rows, String> {
        let parsed: JsonCompact = serde_json::from_str(body).map_err(|e| e.to_string())?;
        let columns: Vec<String> = parsed.meta.into_iter().map(|c| c.name).collect();
        if let Some(bad) = parsed.data.iter().find(|r| r.len() != columns.len()) {
            return Err(format!(
                "a row has {} values for {} columns",
                bad.len(),
                columns.len()
            ));
        }
        Ok(Rows {
            columns,
            data: parsed.data,
            charge: Charge::default(),
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The rows, in order.
    pub fn iter(&self) -> impl Iterator<Item = Row<'_>> {
        self.data.iter().map(move |values| Row {
            columns: &self.columns,
            values,
        })
    }

    /// Every row read by `f`; the first row `f` refuses becomes an [`Error::Decode`] of
    /// `statement` on `endpoint`.
    pub(crate) fn decode<T>(
        &self,
        endpoint: &Endpoint,
        statement: &str,
        f: impl Fn(&Row<'_>) -> Result<T, String>,
    ) -> Result<Vec<T>, Error> {
        self.iter()
            .map(|r| f(&r))
            .collect::<Result<Vec<T>, String>>()
            .map_err(|detail| Error::Decode {
                endpoint: endpoint.clone(),
                detail,
                statement: summary(statement),
            })
    }
}

/// One row; typed getters by column name, each failing (never panicking) on a missing column
/// or a value of another type.
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    columns: &'a [String],
    values: &'a [Value],
}

impl<'a> Row<'a> {
    fn get(&self, column: &str) -> Result<&'a Value, String> {
        self.columns
            .iter()
            .position(|c| c == column)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| format!("no column {column:?}"))
    }

    /// A `String` column.
    pub fn str(&self, column: &str) -> Result<&'a str, String> {
        self.get(column)?
            .as_str()
            .ok_or_else(|| format!("column {column:?} is not a string"))
    }

    /// An unsigned integer column (JSON number, or string for 64-bit types).
    /// A number column (JSON number, or string for 64-bit types and `nan`/`inf`).
    pub fn f64(&self, column: &str) -> Result<f64, String> {
        let v = self.get(column)?;
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| format!("column {column:?} is not a number: {v}"))
    }

    pub fn u64(&self, column: &str) -> Result<u64, String> {
        let v = self.get(column)?;
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| format!("column {column:?} is not an unsigned integer: {v}"))
    }

    /// A `UInt8` flag column.
    pub fn flag(&self, column: &str) -> Result<bool, String> {
        Ok(self.u64(column)? != 0)
    }

    /// An `Array(String)` column.
    pub fn strings(&self, column: &str) -> Result<Vec<String>, String> {
        let v = self.get(column)?;
        v.as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| format!("column {column:?} is not an array of strings: {v}"))
    }
}

/// An error with its causes, `a: b: c` (reqwest's own message hides why a connection failed,
/// such as a certificate that does not name the host).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// A client of one replica. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    endpoint: Endpoint,
    credentials: Credentials,
    timeout: Duration,
    retry: RetryPolicy,
    max_answer_bytes: usize,
}

/// What an HTTP client is built from: clients made through the same [`Connections`] that reach
/// servers the same way share one.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Transport {
    /// `Some`: HTTPS only, trusting only these CA certificates (PEM).
    ca_pem: Option<Vec<u8>>,
    /// HTTPS only, the certificate not verified.
    unverified: bool,
    /// With HTTPS by server name: the name and the address it resolves to, for this client
    /// only.
    resolve: Option<(String, SocketAddr)>,
    timeout: Duration,
}

impl Transport {
    fn https(&self) -> bool {
        self.ca_pem.is_some() || self.unverified
    }

    /// A new HTTP client; fails on an unusable CA certificate.
    fn build(&self) -> Result<reqwest::Client, String> {
        // No built-in roots: a server is verified against the cluster's CA only (or not at
        // all), and loading the system's roots (a file read and the parse of every
        // certificate) took most of the CPU of a pass.
        // No proxy either: servers are reached at their pods' addresses, never through the
        // HTTP(S)_PROXY a pod may carry for its way to a bucket.
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(self.timeout.min(Duration::from_secs(10)))
            .timeout(self.timeout)
            .pool_idle_timeout(Duration::from_secs(2))
            .tls_built_in_root_certs(false);
        if let Some(pem) = &self.ca_pem {
            let cas = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("invalid CA certificate: {e}"))?;
            if cas.is_empty() {
                return Err("the CA bundle holds no PEM certificate".into());
            }
            builder = builder.use_rustls_tls().https_only(true);
            for ca in cas {
                builder = builder.add_root_certificate(ca);
            }
        } else if self.unverified {
            builder = builder
                .use_rustls_tls()
                .https_only(true)
                .danger_accept_invalid_certs(true);
        }
        // Verify by name, connect by address.
        if let Some((name, addr)) = &self.resolve {
            builder = builder.resolve(name, *addr);
        }
        builder.build().map_err(|e| e.to_string())
    }
}

/// The HTTP clients of one pass or one scrape: the clients made through it share an HTTP
/// client (and its pooled connections) per way of reaching a server (plain HTTP, or HTTPS with
/// the same trust, server name and address), so that the calls of a pass build no TLS
/// configuration each. Kept for as long as the pass: an HTTP client's connections belong to
/// the runtime that made them.
#[derive(Clone, Default)]
pub struct Connections {
    built: Arc<Mutex<HashMap<Transport, reqwest::Client>>>,
}

impl fmt::Debug for Connections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connections").finish_non_exhaustive()
    }
}

impl Connections {
    /// A client of `config`'s server, on the HTTP client built before for the same transport
    /// when there is one; fails only on an unusable CA certificate.
    pub fn client(&self, config: ClientConfig) -> Result<Client, Error> {
        Client::with(self, config)
    }

    fn http(&self, transport: &Transport) -> Result<reqwest::Client, String> {
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(http) = built.get(transport) {
            return Ok(http.clone());
        }
        let http = transport.build()?;
        built.insert(transport.clone(), http.clone());
        Ok(http)
    }
}

impl Client {
    /// Builds a client with an HTTP client of its own; fails only on an unusable CA
    /// certificate. The clients of a pass share theirs ([`Connections`]).
    pub fn new(config: ClientConfig) -> Result<Client, Error> {
        Client::with(&Connections::default(), config)
    }

    fn with(connections: &Connections, config: ClientConfig) -> Result<Client, Error> {
        let endpoint = config.endpoint.clone();
        let mut transport = Transport {
            ca_pem: config.tls_ca_pem.clone(),
            unverified: config.tls_ca_pem.is_none() && config.tls_unverified,
            resolve: None,
            timeout: config.timeout,
        };
        let scheme = if transport.https() { "https" } else { "http" };
        // Verify by name, connect by address: the name resolves to the endpoint's address for
        // this client only.
        let base = match (&config.tls_server_name, scheme) {
            (Some(name), "https") => {
                if let Ok(ip) = endpoint.host.parse::<std::net::IpAddr>() {
                    transport.resolve = Some((name.clone(), SocketAddr::new(ip, endpoint.port)));
                }
                format!("https://{name}:{}/", endpoint.port)
            }
            _ => format!("{scheme}://{endpoint}/"),
        };
        let http = connections
            .http(&transport)
            .map_err(|detail| Error::Config {
                endpoint: endpoint.clone(),
                detail,
            })?;
        Ok(Client {
            http,
            base,
            endpoint,
            credentials: config.credentials,
            timeout: config.timeout,
            retry: config.retry,
            max_answer_bytes: config.max_answer_bytes,
        })
    }

    /// The replica this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Runs a query and returns its rows (`default_format=JSONCompact`).
    pub async fn query(&self, sql: &str, options: &QueryOptions) -> Result<Rows, Error> {
        let (body, mut charge) = self.run(sql, options, true).await?;
        // what parsing may cost is charged before it starts
        let values = values_at_most(&body);
        let parsed = values.saturating_mul(PARSED_BYTES_PER_VALUE);
        let wait = options.timeout.unwrap_or(self.timeout);
        match charge
            .grow_to(body.len().saturating_add(parsed), wait)
            .await
        {
            Ok(()) => {}
            Err(true) => {
                return Err(Error::Decode {
                    endpoint: self.endpoint.clone(),
                    detail: format!(
                        "up to {values} values, more than the {} MiB for answers can hold parsed",
                        budget().1 >> 20
                    ),
                    statement: summary(sql),
                });
            }
            Err(false) => return Err(self.busy(sql)),
        }
        let mut rows = Rows::from_json_compact(&body).map_err(|detail| Error::Decode {
            endpoint: self.endpoint.clone(),
            detail,
            statement: summary(sql),
        })?;
        rows.charge = charge;
        Ok(rows)
    }

    fn busy(&self, sql: &str) -> Error {
        Error::Busy {
            endpoint: self.endpoint.clone(),
            budget: budget().1,
            statement: summary(sql),
        }
    }

    /// Runs a statement whose answer is not needed (DDL, `SYSTEM …`).
    pub async fn exec(&self, sql: &str, options: &QueryOptions) -> Result<(), Error> {
        self.run(sql, options, false).await.map(drop)
    }

    /// `SELECT version()`, parsed.
    pub async fn version(&self) -> Result<super::version::Version, Error> {
        let rows = self
            .query(
                super::sql::select_version(),
                &QueryOptions::new().retry(true),
            )
            .await?;
        let raw = rows
            .iter()
            .next()
            .and_then(|r| r.str("version()").ok().map(str::to_string));
        let decode = |detail: String| Error::Decode {
            endpoint: self.endpoint.clone(),
            detail,
            statement: summary(super::sql::select_version()),
        };
        let raw = raw.ok_or_else(|| decode("no version in the answer".into()))?;
        let version = raw
            .parse()
            .map_err(|e: super::version::VersionParseError| decode(e.to_string()))?;
        tracing::debug!(endpoint = %self.endpoint, %version, "detected ClickHouse version");
        Ok(version)
    }

    async fn run(
        &self,
        sql: &str,
        options: &QueryOptions,
        rows: bool,
    ) -> Result<(String, Charge), Error> {
        let attempts = if options.retry {
            self.retry.attempts.max(1)
        } else {
            1
        };
        let mut n = 1;
        loop {
            match self.once(sql, options, rows).await {
                Ok(body) => return Ok(body),
                Err(e) if n < attempts && e.is_retryable() => {
                    let delay = self.retry.delay(n);
                    tracing::warn!(
                        endpoint = %self.endpoint, attempt = n, ?delay, error = %e,
                        "ClickHouse statement failed, retrying"
                    );
                    tokio::time::sleep(delay).await;
                    n += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn once(
        &self,
        sql: &str,
        options: &QueryOptions,
        rows: bool,
    ) -> Result<(String, Charge), Error> {
        tracing::debug!(endpoint = %self.endpoint, statement = %mask_literals(sql), settings = ?options.settings, "ClickHouse statement");
        let mut params: Vec<(&str, &str)> = options
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if rows {
            params.push(("default_format", "JSONCompact"));
        }
        let deadline = tokio::time::Instant::now() + options.timeout.unwrap_or(self.timeout);
        let transport = |source: reqwest::Error| Error::Transport {
            endpoint: self.endpoint.clone(),
            source,
            statement: summary(sql),
        };
        let response = self
            .http
            .post(&self.base)
            .query(&params)
            .header("X-ClickHouse-User", &self.credentials.user)
            .header("X-ClickHouse-Key", &self.credentials.password)
            .timeout(options.timeout.unwrap_or(self.timeout))
            .body(sql.to_string())
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        let header_code = response
            .headers()
            .get("X-ClickHouse-Exception-Code")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .map(ErrorCode);
        let limit = if status.is_success() {
            self.max_answer_bytes
        } else {
            self.max_answer_bytes.min(MAX_ERROR_BYTES)
        };
        let (body, cut, charge) = match read_bounded(response, limit, deadline).await {
            Ok(read) => read,
            Err(Read::Transport(e)) => return Err(transport(e)),
            Err(Read::Busy) => return Err(self.busy(sql)),
        };
        if status.is_success() {
            if cut {
                return Err(Error::TooLarge {
                    endpoint: self.endpoint.clone(),
                    limit,
                    statement: summary(sql),
                });
            }
            return Ok((body, charge));
        }
        Err(Error::Server {
            endpoint: self.endpoint.clone(),
            code: header_code.or_else(|| parse_error_code(&body)),
            status: status.as_u16(),
            message: hide_literals_of(sql, body.trim()),
            statement: summary(sql),
        })
    }
}

/// Why an answer could not be read.
enum Read {
    Transport(reqwest::Error),
    Busy,
}

/// Reads at most `limit` bytes of `response`'s body, chunk by chunk (never more than one
/// chunk beyond what is kept), each chunk charged to the answer budget before it is kept
/// (waiting until `deadline` for room): the text, whether more was sent, and the charge. A
/// declared length above the limit is not read at all. Invalid UTF-8 is replaced, as `text()`
/// does.
async fn read_bounded(
    mut response: reqwest::Response,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Result<(String, bool, Charge), Read> {
    let mut charge = Charge::default();
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Ok((String::new(), true, charge));
    }
    let mut body: Vec<u8> = Vec::new();
    let mut cut = false;
    while let Some(chunk) = response.chunk().await.map_err(Read::Transport)? {
        let room = limit - body.len();
        let keep = chunk.len().min(room);
        // twice what is kept: a vector that grows by doubling holds up to that much
        let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
        match charge.grow_to(2 * (body.len() + keep), wait).await {
            Ok(()) => {}
            // more than the whole budget: too large, however long it waits
            Err(true) => {
                cut = true;
                break;
            }
            Err(false) => return Err(Read::Busy),
        }
        if body.capacity() < body.len() + keep {
            body.reserve_exact((body.len() + keep).max(2 * body.len()).min(limit) - body.len());
        }
        body.extend_from_slice(&chunk[..keep]);
        if chunk.len() > room {
            cut = true;
            break;
        }
    }
    let text = match String::from_utf8(body) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Ok((text, cut, charge))
}

/// The `Code: N` of an exception text: `Code: 193, e.displayText() = …` (18.16) or
/// `Code: 253. DB::Exception: … (REPLICA_ALREADY_EXISTS)` (modern).
pub fn parse_error_code(body: &str) -> Option<ErrorCode> {
    let start = body.find("Code: ")? + "Code: ".len();
    let digits: String = body[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok().map(ErrorCode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: Option<u32>, message: &str) -> Error {
        Error::Server {
            endpoint: Endpoint {
                host: "127.0.0.1".into(),
                port: 8123,
            },
            code: code.map(ErrorCode),
            status: 500,
            message: message.into(),
            statement: "X".into(),
        }
    }

    #[test]
    fn error_codes_are_read_from_old_and_new_exception_texts() {
        assert_eq!(
            parse_error_code(
                "Code: 193, e.displayText() = DB::Exception: Wrong password for user op, e.what() = DB::Exception"
            ),
            Some(ErrorCode::WRONG_PASSWORD)
        );
        assert_eq!(
            parse_error_code(
                "Code: 253. DB::Exception: Replica /clickhouse/tables/0/db/t/replicas/r1 already exists. (REPLICA_ALREADY_EXISTS) (version 24.8.4.13 (official build))"
            ),
            Some(ErrorCode::REPLICA_ALREADY_EXISTS)
        );
        assert_eq!(parse_error_code("Bad Gateway"), None);
        assert_eq!(parse_error_code("Code: x"), None);
    }

    #[test]
    fn classification_of_failures() {
        let active = server_error(
            Some(305),
            "Code: 305. DB::Exception: Can't drop replica: r2, because it's active. (TABLE_WAS_NOT_DROPPED)",
        );
        assert!(active.is_replica_active());
        assert!(active.is_retryable());
        let exists = server_error(
            Some(253),
            "Code: 253. DB::Exception: Replica … already exists. (REPLICA_ALREADY_EXISTS)",
        );
        assert_eq!(exists.code(), Some(ErrorCode::REPLICA_ALREADY_EXISTS));
        assert!(!exists.is_retryable());
        assert!(server_error(Some(999), "Coordination::Exception: Connection loss").is_retryable());
        assert!(
            !server_error(
                Some(999),
                "Code: 999, e.displayText() = Coordination::Exception: No node, path: /x"
            )
            .is_retryable()
        );
        assert!(server_error(Some(242), "Table is in readonly mode").is_retryable());
        assert!(!server_error(Some(62), "Syntax error").is_retryable());
        assert!(!server_error(Some(516), "Authentication failed").is_retryable());
        assert!(server_error(None, "Bad Gateway").is_retryable());
        // The message is kept verbatim for the status.
        assert!(exists.to_string().contains("REPLICA_ALREADY_EXISTS"));
    }

    #[test]
    fn retry_delays_double_and_are_capped() {
        let p = RetryPolicy {
            attempts: 5,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
        };
        let d: Vec<u128> = (1..=5).map(|n| p.delay(n).as_millis()).collect();
        assert_eq!(d, [100, 200, 400, 500, 500]);
        assert_eq!(p.delay(200), Duration::from_millis(500));
    }

    #[test]
    fn json_compact_rows_are_read_by_column_name() {
        let body = r#"{"meta":[{"name":"database","type":"String"},{"name":"absolute_delay","type":"UInt64"},
            {"name":"is_readonly","type":"UInt8"},{"name":"deps","type":"Array(String)"}],
            "data":[["db1","7",1,["mv"]]],"rows":1}"#;
        let rows = Rows::from_json_compact(body).unwrap_or_default();
        assert_eq!(rows.len(), 1);
        let row = rows.iter().next();
        let row = row.as_ref();
        assert_eq!(row.map(|r| r.str("database")), Some(Ok("db1")));
        assert_eq!(row.map(|r| r.u64("absolute_delay")), Some(Ok(7)));
        assert_eq!(row.map(|r| r.flag("is_readonly")), Some(Ok(true)));
        assert_eq!(
            row.map(|r| r.strings("deps")),
            Some(Ok(vec!["mv".to_string()]))
        );
        assert!(row.map(|r| r.str("missing").is_err()).unwrap_or(false));
        assert!(row.map(|r| r.u64("database").is_err()).unwrap_or(false));
        assert!(Rows::from_json_compact("Code: 60, e.displayText()").is_err());
        assert!(Rows::from_json_compact(r#"{"meta":[{"name":"a"}],"data":[[1,2]]}"#).is_err());
    }

    #[test]
    fn credentials_are_not_printed() {
        let c = Credentials {
            user: "op".into(),
            password: "secret".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
        let e = Endpoint {
            host: "::1".into(),
            port: 8123,
        };
        assert_eq!(e.to_string(), "[::1]:8123");
    }
}
