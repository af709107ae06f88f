//! What a restore takes from a bucket, checked before anything is written (decision 29). A bucket
//! is hostile until checked: whoever can write to it, or point a restore at a bucket of their own,
//! chooses every byte of the manifests. So a restore never executes a statement or uses a name from
//! a manifest as it is:
//!
//! - every statement is lexed ([`crate::clickhouse::lexer`]), checked as one `CREATE` of the
//!   object the manifest lists it for, and rebuilt from its tokens in the operator's own quoting;
//!   engines outside the cluster (`URL`, `S3`, `MySQL`, `Kafka`, …), table functions and
//!   dictionaries are refused unless the restore allows external sources; `AS SELECT` is allowed
//!   only as a view's own query;
//! - a view or materialized view is rebuilt from its parts ([`views`], decision 64): no
//!   `DEFINER` or `SQL SECURITY` of the bucket is kept, a view gets `SQL SECURITY INVOKER` on
//!   servers that have the clause, a materialized view runs as whoever inserts into its source
//!   or is refused ([`CheckedTable::statement_for`]), every `TO` target is a table of the backup;
//! - a replicated table or database gets the cluster's own Keeper path for its name, and a
//!   `Buffer` flushes only into a table of the backup ([`engines`]);
//! - a statement holding `'[HIDDEN]'` (a credential the server masked when the backup read it)
//!   is refused;
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
use crate::clickhouse::{Capability, Version};
use crate::model::manifest::{self, FORMAT, Manifest, Part, ShardManifest};

pub mod engines;
pub mod views;

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

/// What a restore must know of a server to write its views' statements (decision 64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Server {
    pub version: Version,
    /// The server setting `ignore_empty_sql_security_in_create_view_query` (24.2 and later,
    /// default on): a view created without a `SQL SECURITY` clause is kept without one, so a
    /// materialized view runs as before 24.2 (its query with the rights of whoever inserts into
    /// its source, its target not checked) instead of as its creator.
    pub keeps_empty_sql_security: bool,
}

/// What [`Server::keeps_empty_sql_security`] is read from on a server with `SQL SECURITY`
/// (`1`: on; a server that does not report it counts as off).
pub const KEEPS_EMPTY_SQL_SECURITY: &str = "SELECT value FROM system.server_settings \
     WHERE name = 'ignore_empty_sql_security_in_create_view_query'";

/// The replicated tables of a server and their Keeper paths, for
/// [`CheckedShard::check_keeper_paths`].
pub const REPLICAS: &str = "SELECT database, table, zookeeper_path FROM system.replicas";

impl Server {
    /// A server without `SQL SECURITY` (below 24.2).
    pub fn of_version(version: Version) -> Server {
        Server {
            version,
            keeps_empty_sql_security: false,
        }
    }

    fn sql_security(&self) -> bool {
        self.version.supports(Capability::SqlSecurity)
    }
}

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
    #[error(
        "{object}: a materialized view created by a restore on a {version} server whose ignore_empty_sql_security_in_create_view_query is off would run as its creator, the operator's account: create it by hand with the definer you choose"
    )]
    MaterializedViewDefiner { object: String, version: String },
    #[error(
        "{object}: a refreshable materialized view runs its query on a schedule as its definer, which a restore would make the operator's account: create it by hand with the definer you choose"
    )]
    Refresh { object: String },
    #[error(
        "{object}: the server created it with {found:?}, not what the restore wrote; it was dropped again"
    )]
    CreatedWith { object: String, found: String },
    #[error(
        "{object}: its Keeper path {path} is the path of {other} on this shard: drop that table or restore into a cluster without it"
    )]
    KeeperPathInUse {
        object: String,
        path: String,
        other: String,
    },
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
    #[error("it writes to {target}, which is not a table of the backup")]
    Target { target: String },
    #[error("it has no ENGINE")]
    NoEngine,
    #[error(
        "its Keeper path {0}; a restore gives a replicated table or database the cluster's own path for its name"
    )]
    KeeperPath(&'static str),
    #[error(
        "its statement holds '[HIDDEN]' where the server masked a credential when the backup read it: create it by hand"
    )]
    Hidden,
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
    /// `CREATE … IF NOT EXISTS …`, rebuilt from checked tokens; a view's and a materialized
    /// view's without `DEFINER` and `SQL SECURITY` (see [`CheckedTable::statement_for`]).
    pub statement: String,
    /// A view's statement with `SQL SECURITY INVOKER`, for servers that have the clause.
    pub invoker: Option<String>,
    /// A materialized view with `REFRESH`.
    pub refresh: bool,
    /// The Keeper path the restore gave a replicated table (macros unexpanded), see
    /// [`engines::table_path`].
    pub keeper_path: Option<String>,
    pub parts: Vec<Part>,
}

impl CheckedTable {
    /// The statement that creates this object on `server` (decision 64). Below 24.2 a view
    /// runs as whoever reads it and a materialized view as whoever inserts into its source,
    /// so the statement carries no clause. From 24.2 a view gets `SQL SECURITY INVOKER`; a
    /// materialized view cannot be `INVOKER`, `NONE` skips every check, and any definer would
    /// be one the bucket chose or the operator itself, so it is created without a clause only
    /// where the server then keeps it without one (`keeps_empty_sql_security`) and refused
    /// elsewhere. A refreshable one is refused everywhere.
    pub fn statement_for(&self, server: &Server) -> Result<&str, Refusal> {
        match self.kind {
            Kind::Table | Kind::Dictionary => Ok(&self.statement),
            Kind::View if server.sql_security() => {
                Ok(self.invoker.as_deref().unwrap_or(&self.statement))
            }
            Kind::View => Ok(&self.statement),
            Kind::MaterializedView if self.refresh => Err(Refusal::Refresh {
                object: self.object(),
            }),
            Kind::MaterializedView if server.sql_security() && !server.keeps_empty_sql_security => {
                Err(Refusal::MaterializedViewDefiner {
                    object: self.object(),
                    version: server.version.to_string(),
                })
            }
            Kind::MaterializedView => Ok(&self.statement),
        }
    }

    /// Checks the statement a server keeps for this object after the restore created it
    /// (`system.tables.create_table_query`): a view has the clause the restore wrote
    /// (`SQL SECURITY INVOKER` from 24.2, none below), a materialized view none. Anything else
    /// (a server that filled in a definer after all) is refused.
    pub fn check_created(&self, server: &Server, create_table_query: &str) -> Result<(), Refusal> {
        if !matches!(self.kind, Kind::View | Kind::MaterializedView) {
            return Ok(());
        }
        let found = views::security_of(create_table_query).map_err(|rule| Refusal::Statement {
            object: self.object(),
            rule,
        })?;
        let invoker = self.kind == Kind::View && server.sql_security();
        let meant = found.as_ref().is_some_and(|s| {
            invoker && s.definer.is_none() && s.kind.as_deref() == Some("INVOKER")
        }) || (found.is_none() && !invoker);
        if meant {
            Ok(())
        } else {
            Err(Refusal::CreatedWith {
                object: self.object(),
                found: found.map(|s| s.describe()).unwrap_or_default(),
            })
        }
    }

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
    /// Every statement of this shard for `server`, databases first, in order of creation; a
    /// refusal if one object cannot be created there (see [`CheckedTable::statement_for`]).
    pub fn statements_for(&self, server: &Server) -> Result<Vec<&str>, Refusal> {
        let mut out: Vec<&str> = self
            .databases
            .iter()
            .map(|d| d.statement.as_str())
            .collect();
        for t in &self.tables {
            out.push(t.statement_for(server)?);
        }
        Ok(out)
    }

    /// Refuses a replicated table whose Keeper path ([`engines::table_path`], `{shard}` being
    /// shard `shard`'s macro) is the path of another table of the server already
    /// (`replicas`: database, table and `zookeeper_path` of `system.replicas`): creating it would
    /// join that table's replication group. A table that exists already is not created again.
    pub fn check_keeper_paths(
        &self,
        shard: i32,
        replicas: &[(String, String, String)],
    ) -> Result<(), Refusal> {
        for t in &self.tables {
            let Some(path) = &t.keeper_path else {
                continue;
            };
            if replicas
                .iter()
                .any(|(db, name, _)| *db == t.database && *name == t.name)
            {
                continue;
            }
            let expanded = path.replace("{shard}", &shard.to_string());
            if let Some((db, name, _)) = replicas.iter().find(|(_, _, p)| *p == expanded) {
                return Err(Refusal::KeeperPathInUse {
                    object: t.object(),
                    path: expanded,
                    other: object(db, name),
                });
            }
        }
        Ok(())
    }

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
            invoker: created.invoker,
            refresh: created.refresh,
            keeper_path: created.keeper_path,
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
    if tokens
        .iter()
        .any(|t| matches!(t, Token::Str(s) if s == "[HIDDEN]"))
    {
        return Err(StatementRule::Hidden);
    }
    Ok(tokens)
}

/// For each token, whether it stands at bracket depth 0 (a bracket itself counts as outside);
/// unbalanced brackets are refused.
fn depth0(tokens: &[Token]) -> Result<Vec<bool>, StatementRule> {
    let unbalanced = || StatementRule::Lex(LexError::Unterminated("bracket", 0));
    let mut depth = 0i32;
    let mut out = Vec::with_capacity(tokens.len());
    for t in tokens {
        if t.is(")") || t.is("]") {
            depth -= 1;
            if depth < 0 {
                return Err(unbalanced());
            }
        }
        out.push(depth == 0);
        if t.is("(") || t.is("[") {
            depth += 1;
        }
    }
    if depth != 0 {
        return Err(unbalanced());
    }
    Ok(out)
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
    let mut rest = tokens[i + 1..].to_vec();
    clauses(&rest, Kind::Table)?;
    let object = format!("database {}", quote_name(name));
    if let Some(engine) = engine_of(&rest)
        && !allow.external
        && !local_database_engine(&engine)
    {
        return Err(Checked::Refusal(Refusal::Engine { object, engine }));
    }
    check_functions(&rest, &object, allow)?;
    engines::database(&mut rest, name)?;
    let mut out = format!("CREATE DATABASE IF NOT EXISTS {}", quote_name(name));
    if !rest.is_empty() {
        out.push(' ');
        out.push_str(&render(&rest));
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
    invoker: Option<String>,
    refresh: bool,
    keeper_path: Option<String>,
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
    let mut created = Created {
        kind,
        engine: engine.clone(),
        statement: String::new(),
        invoker: None,
        refresh: false,
        keeper_path: None,
    };
    let head = kind.words().join(" ");
    match kind {
        Kind::Table | Kind::Dictionary => {
            let d0 = depth0(body)?;
            if (0..body.len()).any(|n| {
                d0[n]
                    && (body[n].is_word("DEFINER")
                        || (body[n].is_word("SQL")
                            && body.get(n + 1).is_some_and(|t| t.is_word("SECURITY"))))
            }) {
                return Err(StatementRule::Clause("DEFINER or SQL SECURITY").into());
            }
        }
        Kind::View | Kind::MaterializedView => {}
    }
    match kind {
        Kind::Table => {
            if !body.first().is_some_and(|t| t.is("(")) {
                return Err(StatementRule::Clause("no column list").into());
            }
            let engine = engine.ok_or(StatementRule::NoEngine)?;
            if !allow.external && !local_engine(&engine) {
                return Err(Checked::Refusal(Refusal::Engine { object, engine }));
            }
            let mut body = body.to_vec();
            created.keeper_path = engines::table(&mut body, database, name, known)?;
            created.statement = format!("CREATE {head} IF NOT EXISTS {object} {}", render(&body));
        }
        Kind::View | Kind::MaterializedView => {
            let materialized = kind == Kind::MaterializedView;
            if let Some(engine) = &engine
                && materialized
                && !allow.external
                && !local_engine(engine)
            {
                return Err(Checked::Refusal(Refusal::Engine {
                    object,
                    engine: engine.clone(),
                }));
            }
            let view = views::check(materialized, body, database, name, known)?;
            created.statement = view.plain;
            created.invoker = view.invoker;
            created.refresh = view.refresh;
            created.keeper_path = view.keeper_path;
        }
        Kind::Dictionary => {
            if !allow.external {
                return Err(Checked::Refusal(Refusal::Engine {
                    object,
                    engine: "Dictionary (its SOURCE)".into(),
                }));
            }
            created.statement = format!("CREATE {head} IF NOT EXISTS {object} {}", render(body));
        }
    }
    check_functions(body, &object, allow)?;
    created.statement = created.statement.trim_end().to_string();
    Ok(created)
}

#[cfg(test)]
mod tests;
