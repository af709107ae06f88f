//! What a restore takes from a bucket, checked before anything is written (decision 29). A bucket
//! is hostile until checked: whoever can write to it, or point a restore at a bucket of their own,
//! chooses every byte of the manifests. So a restore never executes a statement or uses a name from
//! a manifest as it is:
//!
//! - every statement is lexed ([`crate::clickhouse::lexer`]), checked as one `CREATE` of the
//!   object the manifest lists it for, and rebuilt from its tokens in the operator's own quoting;
//!   engines outside the cluster (`URL`, `S3`, `MySQL`, `Kafka`, …), table functions and
//!   dictionaries are refused unless the restore allows external sources; `AS SELECT` is allowed
//!   only as a view's own query, and a definer may not be one of the operator's accounts;
//! - part names, file names and object keys must match strict patterns (relative, no `..`, no
//!   separator where none belongs, the key of the part's own table), sizes and counts are
//!   bounded;
//! - a manifest that breaks a rule fails the restore with the rule named ([`Refusal`]).
//!
//! Pure: the agent (`backup::agent`) then checks what the bucket holds against the result, and
//! only then creates anything.

use std::collections::{BTreeMap, BTreeSet};

use crate::clickhouse::lexer::{LexError, Token, quote_name, render, tokenize};
use crate::clickhouse::sql::SYSTEM_DATABASES;
use crate::model::manifest::{self, FORMAT, Manifest, Part, ShardManifest};

/// Bounds on what a manifest may hold.
pub mod limits {
    /// Bytes of a backup's `manifest.json` read from a bucket.
    pub const MANIFEST_BYTES: u64 = 1 << 20;
    /// Bytes of a shard's manifest read from a bucket.
    pub const SHARD_MANIFEST_BYTES: u64 = 256 << 20;
    /// Shards of one backup.
    pub const SHARDS: usize = 1024;
    /// Databases, and tables, of one shard.
    pub const OBJECTS: usize = 100_000;
    /// Bytes of one statement.
    pub const STATEMENT_BYTES: usize = 1 << 20;
    /// Bytes of one name (database, table, part, file segment).
    pub const NAME_BYTES: usize = 255;
    /// Parts of one table.
    pub const PARTS: usize = 1_000_000;
    /// Files of one part.
    pub const FILES: usize = 100_000;
    /// Bytes of one file of a part.
    pub const FILE_BYTES: u64 = 1 << 40;
    /// Folders a file of a part may be nested in (a projection's `p.proj/`).
    pub const FILE_DEPTH: usize = 3;
}

/// What the restore allows beyond the cluster itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allow {
    /// Engines, table functions and dictionary sources that reach outside the cluster.
    pub external: bool,
}

/// The accounts a restored view may not run as (the operator's and the cluster's own).
pub const RESERVED_DEFINERS: &[&str] = &[
    crate::model::names::OPERATOR_USER,
    crate::model::names::CLUSTER_USER,
    crate::model::names::INTERSERVER_USER,
];

/// Why a manifest is refused: the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("format {found} is not one this operator reads ({FORMAT})")]
    Format { found: u32 },
    #[error("it belongs to backup {found:?}, not {expected:?}")]
    OtherBackup { found: String, expected: String },
    #[error("it is the manifest of shard {found}, not of shard {expected}")]
    OtherShard { found: i32, expected: i32 },
    #[error(
        "its shards are {found:?}: each of 0..n once, at most {}",
        limits::SHARDS
    )]
    Shards { found: Vec<i32> },
    #[error("{what} exceeds its limit of {limit}")]
    Oversized { what: String, limit: String },
    #[error("{what} {name:?} is not a name (1 to {} bytes, no control characters{})", limits::NAME_BYTES, if *.system { ", not a system database" } else { "" })]
    Name {
        what: &'static str,
        name: String,
        system: bool,
    },
    #[error("{what} is listed twice")]
    Duplicate { what: String },
    #[error("{object}: its database is not among the backup's databases")]
    UnknownDatabase { object: String },
    #[error("{object}: {rule}")]
    Statement { object: String, rule: StatementRule },
    #[error(
        "{object}: engine {engine} reaches outside the cluster: restored only with allowExternalSources"
    )]
    Engine { object: String, engine: String },
    #[error(
        "{object}: {function}(…) reaches outside the cluster: restored only with allowExternalSources"
    )]
    TableFunction { object: String, function: String },
    #[error("{object}: listed with engine {listed:?}, its statement says {statement:?}")]
    EngineMismatch {
        object: String,
        listed: String,
        statement: String,
    },
    #[error("{object}: part {part:?} is not a part name ([A-Za-z0-9_-], 1 to 255 bytes)")]
    PartName { object: String, part: String },
    #[error("{object}: has parts but is not of the MergeTree family")]
    PartsWithoutMergeTree { object: String },
    #[error(
        "{object}: part {part} is stored at {key:?}, not at a part folder of its own table (backups/<backup>/shard-<n>/<database>/<table>/<part>)"
    )]
    PartKey {
        object: String,
        part: String,
        key: String,
    },
    #[error(
        "{object}: part {part} lists file {file:?}: a file is a relative path of at most {} segments of [A-Za-z0-9._%-], none of them . or ..",
        limits::FILE_DEPTH
    )]
    FileName {
        object: String,
        part: String,
        file: String,
    },
    #[error("{object}: part {part} has no checksums.txt")]
    NoChecksums { object: String, part: String },
    #[error("{object}: part {part} has checksum {checksum:?}, not 16 hexadecimal digits")]
    Checksum {
        object: String,
        part: String,
        checksum: String,
    },
    #[error("the server-written backup is at {found:?}, not at {expected:?}")]
    NativeDir { found: String, expected: String },
    #[error("a server-written backup lists parts ({object})")]
    NativeWithParts { object: String },
    #[error("{object}: part {part} lists {file}, which the bucket does not hold")]
    Missing {
        object: String,
        part: String,
        file: String,
    },
    #[error("{object}: part {part} lists {file} of {listed} bytes, the bucket holds {stored}")]
    Size {
        object: String,
        part: String,
        file: String,
        listed: u64,
        stored: u64,
    },
    #[error("{object}: part {part}'s checksums.txt in the bucket does not match its checksum")]
    ChecksumMismatch { object: String, part: String },
}

/// What a statement breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StatementRule {
    #[error("its statement cannot be read: {0}")]
    Lex(LexError),
    #[error("its statement is longer than {} bytes", limits::STATEMENT_BYTES)]
    TooLong,
    #[error("its statement is more than one statement")]
    Several,
    #[error("its statement is not a CREATE of a {0}")]
    NotCreate(&'static str),
    #[error("its statement creates {found}, not this object")]
    OtherObject { found: String },
    #[error("its statement has {0}, which a restore never runs")]
    Clause(&'static str),
    #[error(
        "its statement names definer {0:?}: the operator's own accounts (and CURRENT_USER, which is the operator when it restores) never define a restored view"
    )]
    Definer(String),
    #[error("it writes to {target}, which is not a table of the backup")]
    Target { target: String },
    #[error("it has no ENGINE")]
    NoEngine,
}

/// One database to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedDatabase {
    pub name: String,
    /// `CREATE DATABASE IF NOT EXISTS …`, rebuilt.
    pub statement: String,
}

/// What a statement creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Table,
    View,
    MaterializedView,
    Dictionary,
}

impl Kind {
    fn words(self) -> &'static [&'static str] {
        match self {
            Kind::Table => &["TABLE"],
            Kind::View => &["VIEW"],
            Kind::MaterializedView => &["MATERIALIZED", "VIEW"],
            Kind::Dictionary => &["DICTIONARY"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Table => "table",
            Kind::View => "view",
            Kind::MaterializedView => "materialized view",
            Kind::Dictionary => "dictionary",
        }
    }
}

/// One table, view or dictionary to create, and its parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedTable {
    pub database: String,
    pub name: String,
    pub kind: Kind,
    /// The table's engine (`ReplicatedMergeTree`, …); `View`/`MaterializedView`/`Dictionary`
    /// for the others.
    pub engine: String,
    /// `CREATE … IF NOT EXISTS …`, rebuilt from checked tokens.
    pub statement: String,
    pub parts: Vec<Part>,
}

impl CheckedTable {
    /// Order of creation: tables holding data, the tables over them, views, materialized views.
    pub fn rank(&self) -> u8 {
        crate::clickhouse::backup::create_rank(&self.engine)
    }

    pub fn object(&self) -> String {
        object(&self.database, &self.name)
    }
}

/// A shard's manifest that passed every rule: what the restore may do, and nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedShard {
    pub databases: Vec<CheckedDatabase>,
    /// In order of creation.
    pub tables: Vec<CheckedTable>,
    /// The server-written backup's folder (relative to the prefix).
    pub native: Option<String>,
}

impl CheckedShard {
    /// The part folders of this shard by the backup folder they are in
    /// (`backups/<backup>/shard-<n>/`), so that each folder is listed once.
    pub fn parts_by_folder(&self) -> BTreeMap<String, Vec<(&CheckedTable, &Part)>> {
        let mut out: BTreeMap<String, Vec<(&CheckedTable, &Part)>> = BTreeMap::new();
        for t in &self.tables {
            for p in &t.parts {
                let folder: Vec<&str> = p.key.splitn(4, '/').take(3).collect();
                out.entry(format!("{}/", folder.join("/")))
                    .or_default()
                    .push((t, p));
            }
        }
        out
    }
}

/// Every file of every part of `shard` against what the bucket holds: `stored` maps the keys
/// listed under the shard's part folders (relative to the prefix) to their sizes. A file the
/// bucket does not hold, or holds with another size, refuses the restore before anything is
/// written.
pub fn verify_stored(shard: &CheckedShard, stored: &BTreeMap<String, u64>) -> Result<(), Refusal> {
    for t in &shard.tables {
        for p in &t.parts {
            for (file, listed) in &p.files {
                let key = format!("{}/{file}", p.key);
                match stored.get(&key) {
                    None => {
                        return Err(Refusal::Missing {
                            object: t.object(),
                            part: p.name.clone(),
                            file: file.clone(),
                        });
                    }
                    Some(size) if size != listed => {
                        return Err(Refusal::Size {
                            object: t.object(),
                            part: p.name.clone(),
                            file: file.clone(),
                            listed: *listed,
                            stored: *size,
                        });
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

/// A part's `checksums.txt` as the bucket holds it against the checksum its manifest lists
/// (the agent's hash of that file when it uploaded the part).
pub fn verify_checksum(
    table: &CheckedTable,
    part: &Part,
    checksums_txt: &[u8],
) -> Result<(), Refusal> {
    if manifest::checksum_of(checksums_txt) == part.checksum {
        Ok(())
    } else {
        Err(Refusal::ChecksumMismatch {
            object: table.object(),
            part: part.name.clone(),
        })
    }
}

fn object(database: &str, name: &str) -> String {
    format!("{}.{}", quote_name(database), quote_name(name))
}

/// Checks a backup's `manifest.json` as the operator reads it before a restore starts.
pub fn check_manifest(m: &Manifest, backup: &str) -> Result<(), Refusal> {
    if m.format != FORMAT {
        return Err(Refusal::Format { found: m.format });
    }
    if m.backup != backup {
        return Err(Refusal::OtherBackup {
            found: m.backup.clone(),
            expected: backup.into(),
        });
    }
    let mut sorted = m.shards.clone();
    sorted.sort_unstable();
    let expected: Vec<i32> = (0..sorted.len() as i32).collect();
    if sorted != expected || sorted.is_empty() || sorted.len() > limits::SHARDS {
        return Err(Refusal::Shards {
            found: m.shards.iter().take(16).copied().collect(),
        });
    }
    Ok(())
}

/// Checks shard `shard`'s manifest of `backup` and rebuilds every statement of it.
pub fn check_shard(
    m: &ShardManifest,
    backup: &str,
    shard: i32,
    allow: Allow,
) -> Result<CheckedShard, Refusal> {
    if m.format != FORMAT {
        return Err(Refusal::Format { found: m.format });
    }
    if m.backup != backup {
        return Err(Refusal::OtherBackup {
            found: m.backup.clone(),
            expected: backup.into(),
        });
    }
    if m.shard != shard {
        return Err(Refusal::OtherShard {
            found: m.shard,
            expected: shard,
        });
    }
    for (what, n) in [("databases", m.databases.len()), ("tables", m.tables.len())] {
        if n > limits::OBJECTS {
            return Err(Refusal::Oversized {
                what: format!("the number of {what} ({n})"),
                limit: limits::OBJECTS.to_string(),
            });
        }
    }
    if let Some(found) = &m.native {
        let expected = manifest::native_dir(backup, shard);
        if *found != expected {
            return Err(Refusal::NativeDir {
                found: found.clone(),
                expected,
            });
        }
        if let Some(t) = m.tables.iter().find(|t| !t.parts.is_empty()) {
            return Err(Refusal::NativeWithParts {
                object: object(&t.database, &t.name),
            });
        }
    }
    let mut databases = Vec::new();
    for (name, statement) in &m.databases {
        check_name("database", name, true)?;
        databases.push(CheckedDatabase {
            name: name.clone(),
            statement: check_database(name, statement, allow).map_err(|e| match e {
                Checked::Rule(rule) => Refusal::Statement {
                    object: format!("database {}", quote_name(name)),
                    rule,
                },
                Checked::Refusal(r) => r,
            })?,
        });
    }
    let known: BTreeSet<(&str, &str)> = m
        .tables
        .iter()
        .map(|t| (t.database.as_str(), t.name.as_str()))
        .collect();
    if known.len() != m.tables.len() {
        return Err(Refusal::Duplicate {
            what: "a table".into(),
        });
    }
    let mut tables = Vec::new();
    for t in &m.tables {
        check_name("database", &t.database, true)?;
        check_name("table", &t.name, false)?;
        let object = object(&t.database, &t.name);
        if !m.databases.contains_key(&t.database) {
            return Err(Refusal::UnknownDatabase { object });
        }
        let created =
            check_create(&t.create, &t.database, &t.name, allow, &known).map_err(|e| match e {
                Checked::Rule(rule) => Refusal::Statement {
                    object: object.clone(),
                    rule,
                },
                Checked::Refusal(r) => r,
            })?;
        let engine = match created.kind {
            Kind::Table => created.engine.clone().unwrap_or_default(),
            Kind::View => "View".into(),
            Kind::MaterializedView => "MaterializedView".into(),
            Kind::Dictionary => "Dictionary".into(),
        };
        if engine != t.engine {
            return Err(Refusal::EngineMismatch {
                object,
                listed: t.engine.clone(),
                statement: engine,
            });
        }
        check_parts(t, shard, &object)?;
        tables.push(CheckedTable {
            database: t.database.clone(),
            name: t.name.clone(),
            kind: created.kind,
            engine,
            statement: created.statement,
            parts: t.parts.clone(),
        });
    }
    tables.sort_by_key(|t| t.rank());
    Ok(CheckedShard {
        databases,
        tables,
        native: m.native.clone(),
    })
}

fn check_name(what: &'static str, name: &str, database: bool) -> Result<(), Refusal> {
    let system = database && SYSTEM_DATABASES.contains(&name);
    if name.is_empty()
        || name.len() > limits::NAME_BYTES
        || name.chars().any(char::is_control)
        || system
    {
        return Err(Refusal::Name {
            what,
            name: name.chars().take(64).collect(),
            system: database,
        });
    }
    Ok(())
}

fn check_parts(t: &manifest::Table, shard: i32, object: &str) -> Result<(), Refusal> {
    if t.parts.is_empty() {
        return Ok(());
    }
    if !t.engine.ends_with("MergeTree") {
        return Err(Refusal::PartsWithoutMergeTree {
            object: object.into(),
        });
    }
    if t.parts.len() > limits::PARTS {
        return Err(Refusal::Oversized {
            what: format!("the number of parts of {object}"),
            limit: limits::PARTS.to_string(),
        });
    }
    let mut seen = BTreeSet::new();
    for p in &t.parts {
        let part_name = || p.name.chars().take(64).collect::<String>();
        let valid = !p.name.is_empty()
            && p.name.len() <= limits::NAME_BYTES
            && p.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(Refusal::PartName {
                object: object.into(),
                part: part_name(),
            });
        }
        if !seen.insert(p.name.as_str()) {
            return Err(Refusal::Duplicate {
                what: format!("part {} of {object}", p.name),
            });
        }
        if p.checksum.len() != 16 || !p.checksum.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Refusal::Checksum {
                object: object.into(),
                part: p.name.clone(),
                checksum: p.checksum.chars().take(64).collect(),
            });
        }
        if !part_key_is_valid(&p.key, shard, &t.database, &t.name, &p.name) {
            return Err(Refusal::PartKey {
                object: object.into(),
                part: p.name.clone(),
                key: p.key.chars().take(200).collect(),
            });
        }
        if p.files.len() > limits::FILES {
            return Err(Refusal::Oversized {
                what: format!("the number of files of part {} of {object}", p.name),
                limit: limits::FILES.to_string(),
            });
        }
        for (file, size) in &p.files {
            if !file_is_valid(file) {
                return Err(Refusal::FileName {
                    object: object.into(),
                    part: p.name.clone(),
                    file: file.chars().take(200).collect(),
                });
            }
            if *size > limits::FILE_BYTES {
                return Err(Refusal::Oversized {
                    what: format!("file {file} of part {} of {object}", p.name),
                    limit: format!("{} bytes", limits::FILE_BYTES),
                });
            }
        }
        if !p.files.contains_key("checksums.txt") {
            return Err(Refusal::NoChecksums {
                object: object.into(),
                part: p.name.clone(),
            });
        }
    }
    Ok(())
}

/// One path segment of a key or file: `[A-Za-z0-9._%-]`, not `.` or `..`.
fn segment_is_valid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= limits::NAME_BYTES
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'%' | b'-'))
}

/// `backups/<backup>/shard-<shard>/<database>/<table>/<part>`, each name escaped as the agent
/// writes it.
fn part_key_is_valid(key: &str, shard: i32, database: &str, table: &str, part: &str) -> bool {
    let s: Vec<&str> = key.split('/').collect();
    s.len() == 6
        && s[0] == "backups"
        && segment_is_valid(s[1])
        && s[2] == format!("shard-{shard}")
        && s[3] == manifest::escape(database)
        && s[4] == manifest::escape(table)
        && s[5] == manifest::escape(part)
}

fn file_is_valid(file: &str) -> bool {
    let segments: Vec<&str> = file.split('/').collect();
    segments.len() <= limits::FILE_DEPTH && segments.iter().all(|s| segment_is_valid(s))
}

/// Either a statement rule or another refusal (an engine, a table function).
enum Checked {
    Rule(StatementRule),
    Refusal(Refusal),
}

impl From<StatementRule> for Checked {
    fn from(r: StatementRule) -> Self {
        Checked::Rule(r)
    }
}

/// Engines whose data stays in the cluster (its disks, its Keeper, its other tables).
fn local_engine(engine: &str) -> bool {
    engine.ends_with("MergeTree")
        || matches!(
            engine,
            "Distributed"
                | "Merge"
                | "Buffer"
                | "Memory"
                | "Log"
                | "TinyLog"
                | "StripeLog"
                | "Null"
                | "Set"
                | "Join"
                | "Dictionary"
                | "EmbeddedRocksDB"
                | "GenerateRandom"
        )
}

fn local_database_engine(engine: &str) -> bool {
    matches!(
        engine,
        "Atomic" | "Ordinary" | "Lazy" | "Memory" | "Replicated"
    )
}

/// Table functions (and the like) that read or write outside the cluster, lowercase.
const EXTERNAL_FUNCTIONS: &[&str] = &[
    "url",
    "urlcluster",
    "s3",
    "s3cluster",
    "gcs",
    "cosn",
    "oss",
    "remote",
    "remotesecure",
    "cluster",
    "clusterallreplicas",
    "mysql",
    "postgresql",
    "mongodb",
    "redis",
    "sqlite",
    "odbc",
    "jdbc",
    "hdfs",
    "hdfscluster",
    "file",
    "filecluster",
    "input",
    "executable",
    "azureblobstorage",
    "azureblobstoragecluster",
    "hive",
    "iceberg",
    "icebergs3",
    "icebergazure",
    "iceberghdfs",
    "deltalake",
    "deltalakecluster",
    "hudi",
    "hudicluster",
    "ytsaurus",
    "arrowflight",
    "arrowflightsql",
    "kafka",
    "rabbitmq",
    "nats",
    "keepermap",
    // a disk configured in a table's SETTINGS (`disk = disk(type = s3, endpoint = …)`)
    "disk",
];

/// Refuses table functions that reach outside the cluster, anywhere in `tokens`.
fn check_functions(tokens: &[Token], object: &str, allow: Allow) -> Result<(), Checked> {
    if allow.external {
        return Ok(());
    }
    for w in tokens.windows(2) {
        if let Some(f) = w[0].name()
            && w[1].is("(")
            && EXTERNAL_FUNCTIONS.contains(&f.to_ascii_lowercase().as_str())
        {
            return Err(Checked::Refusal(Refusal::TableFunction {
                object: object.into(),
                function: f.to_string(),
            }));
        }
    }
    Ok(())
}

fn lex(statement: &str) -> Result<Vec<Token>, StatementRule> {
    if statement.len() > limits::STATEMENT_BYTES {
        return Err(StatementRule::TooLong);
    }
    let mut tokens = tokenize(statement).map_err(StatementRule::Lex)?;
    while tokens.last().is_some_and(|t| t.is(";")) {
        tokens.pop();
    }
    if tokens.iter().any(|t| t.is(";")) {
        return Err(StatementRule::Several);
    }
    Ok(tokens)
}

/// Reads `IF NOT EXISTS` at `i`, if there.
fn skip_if_not_exists(tokens: &[Token], i: usize) -> usize {
    let words = ["IF", "NOT", "EXISTS"];
    if tokens.len() >= i + 3 && words.iter().zip(&tokens[i..]).all(|(w, t)| t.is_word(w)) {
        i + 3
    } else {
        i
    }
}

/// A name at `i` (`name` or `db.name`): (database, name, index after it).
fn qualified(tokens: &[Token], i: usize) -> Option<(Option<String>, String, usize)> {
    let first = tokens.get(i)?.name()?.to_string();
    if tokens.get(i + 1).is_some_and(|t| t.is(".")) {
        let second = tokens.get(i + 2)?.name()?.to_string();
        Some((Some(first), second, i + 3))
    } else {
        Some((None, first, i + 1))
    }
}

fn check_database(name: &str, statement: &str, allow: Allow) -> Result<String, Checked> {
    let tokens = lex(statement)?;
    let not_create = StatementRule::NotCreate("database");
    if !(tokens.first().is_some_and(|t| t.is_word("CREATE"))
        && tokens.get(1).is_some_and(|t| t.is_word("DATABASE")))
    {
        return Err(not_create.into());
    }
    let i = skip_if_not_exists(&tokens, 2);
    let found = tokens.get(i).and_then(Token::name).ok_or(not_create)?;
    if found != name || tokens.get(i + 1).is_some_and(|t| t.is(".")) {
        return Err(StatementRule::OtherObject {
            found: quote_name(found),
        }
        .into());
    }
    let rest = &tokens[i + 1..];
    clauses(rest, Kind::Table)?;
    let object = format!("database {}", quote_name(name));
    if let Some(engine) = engine_of(rest)
        && !allow.external
        && !local_database_engine(&engine)
    {
        return Err(Checked::Refusal(Refusal::Engine { object, engine }));
    }
    check_functions(rest, &object, allow)?;
    let mut out = format!("CREATE DATABASE IF NOT EXISTS {}", quote_name(name));
    if !rest.is_empty() {
        out.push(' ');
        out.push_str(&render(rest));
    }
    Ok(out)
}

/// The engine named by the first `ENGINE = Name` at bracket depth 0.
fn engine_of(tokens: &[Token]) -> Option<String> {
    let mut depth = 0i32;
    for (i, t) in tokens.iter().enumerate() {
        match t {
            t if t.is("(") || t.is("[") => depth += 1,
            t if t.is(")") || t.is("]") => depth -= 1,
            t if depth == 0 && t.is_word("ENGINE") => {
                let j = if tokens.get(i + 1).is_some_and(|t| t.is("=")) {
                    i + 2
                } else {
                    i + 1
                };
                return tokens.get(j).and_then(Token::name).map(str::to_string);
            }
            _ => {}
        }
    }
    None
}

/// Clauses that no restored object may have, at bracket depth 0 of `body`; for tables, also
/// `AS` (a table made from a query or a table function).
fn clauses(body: &[Token], kind: Kind) -> Result<(), StatementRule> {
    let mut depth = 0i32;
    for (i, t) in body.iter().enumerate() {
        if t.is("(") || t.is("[") {
            depth += 1;
        } else if t.is(")") || t.is("]") {
            depth -= 1;
        }
        if depth != 0 {
            continue;
        }
        let next = body.get(i + 1);
        if t.is_word("ON") && next.is_some_and(|n| n.is_word("CLUSTER")) {
            return Err(StatementRule::Clause("ON CLUSTER"));
        }
        if t.is_word("POPULATE") {
            return Err(StatementRule::Clause("POPULATE"));
        }
        if t.is_word("AS") && kind == Kind::Table {
            return Err(StatementRule::Clause(
                "AS (a table from a query or another source)",
            ));
        }
    }
    if depth != 0 {
        return Err(StatementRule::Lex(LexError::Unterminated("bracket", 0)));
    }
    Ok(())
}

struct Created {
    kind: Kind,
    engine: Option<String>,
    statement: String,
}

fn check_create(
    statement: &str,
    database: &str,
    name: &str,
    allow: Allow,
    known: &BTreeSet<(&str, &str)>,
) -> Result<Created, Checked> {
    let tokens = lex(statement)?;
    if !tokens.first().is_some_and(|t| t.is_word("CREATE")) {
        return Err(StatementRule::NotCreate("table, view or dictionary").into());
    }
    let kind = [
        Kind::Table,
        Kind::MaterializedView,
        Kind::View,
        Kind::Dictionary,
    ]
    .into_iter()
    .find(|k| {
        k.words()
            .iter()
            .enumerate()
            .all(|(n, w)| tokens.get(1 + n).is_some_and(|t| t.is_word(w)))
    })
    .ok_or(StatementRule::NotCreate("table, view or dictionary"))?;
    let i = skip_if_not_exists(&tokens, 1 + kind.words().len());
    let (db, found, mut i) = qualified(&tokens, i).ok_or(StatementRule::NotCreate(kind.name()))?;
    if db.as_deref().unwrap_or(database) != database || found != name {
        return Err(StatementRule::OtherObject {
            found: object(db.as_deref().unwrap_or(database), &found),
        }
        .into());
    }
    // a UUID names the table of another server; the server gives the restored one its own
    if tokens.get(i).is_some_and(|t| t.is_word("UUID"))
        && matches!(tokens.get(i + 1), Some(Token::Str(_)))
    {
        i += 2;
    }
    let body = &tokens[i..];
    clauses(body, kind)?;
    let object = object(database, name);
    let engine = engine_of(body);
    match kind {
        Kind::Table => {
            if !body.first().is_some_and(|t| t.is("(")) {
                return Err(StatementRule::Clause("no column list").into());
            }
            let engine = engine.clone().ok_or(StatementRule::NoEngine)?;
            if !allow.external && !local_engine(&engine) {
                return Err(Checked::Refusal(Refusal::Engine { object, engine }));
            }
        }
        Kind::MaterializedView => {
            if let Some(engine) = &engine
                && !allow.external
                && !local_engine(engine)
            {
                return Err(Checked::Refusal(Refusal::Engine {
                    object,
                    engine: engine.clone(),
                }));
            }
            if body.first().is_some_and(|t| t.is_word("TO")) {
                let (db, target, _) =
                    qualified(body, 1).ok_or(StatementRule::NotCreate(kind.name()))?;
                let db = db.as_deref().unwrap_or(database);
                if !known.contains(&(db, target.as_str())) {
                    return Err(StatementRule::Target {
                        target: self::object(db, &target),
                    }
                    .into());
                }
            }
        }
        Kind::View => {}
        Kind::Dictionary => {
            if !allow.external {
                return Err(Checked::Refusal(Refusal::Engine {
                    object,
                    engine: "Dictionary (its SOURCE)".into(),
                }));
            }
        }
    }
    for (n, t) in body.iter().enumerate() {
        if t.is_word("DEFINER")
            && body.get(n + 1).is_some_and(|t| t.is("="))
            && let Some(user) = body.get(n + 2).and_then(Token::name)
            && (RESERVED_DEFINERS.contains(&user) || user.eq_ignore_ascii_case("CURRENT_USER"))
        {
            return Err(StatementRule::Definer(user.into()).into());
        }
    }
    check_functions(body, &object, allow)?;
    let head = kind.words().join(" ");
    Ok(Created {
        kind,
        engine,
        statement: format!(
            "CREATE {head} IF NOT EXISTS {} {}",
            self::object(database, name),
            render(body)
        )
        .trim_end()
        .to_string(),
    })
}

#[cfg(test)]
mod tests;
