//! The backup agent: `clickhouse-operator backup-agent`, run by a Job on the node of a shard's
//! backup replica with that replica's data volume mounted (decision 26). It is the only place
//! that reads or writes the files of a backup; every statement it sends goes to the backup
//! replica (a restore also creates the schema on the shard's other replicas).
//!
//! Backup: for each table holding parts, `ALTER TABLE … FREEZE`, upload the parts the base does
//! not hold, remove the snapshot; then the shard's manifest. Restore: the schema on every
//! replica of the shard, then each part downloaded into `detached/` and attached on the backup
//! replica (replication copies it to the others).
//!
//! What it did, or why it failed, goes to the container's termination message as JSON
//! ([`Report`]), which the operator reads from the pod's status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::StreamExt;

use super::checks;
use super::store::Bucket;
use crate::clickhouse::backup as sql;
use crate::clickhouse::{Capability, Client, QueryOptions};
use crate::model::manifest::{self, Part, PartSource, ShardManifest, Table};

/// Files uploaded or downloaded at once.
const PARALLEL_FILES: usize = 4;

pub use crate::model::job::Report;

/// One backup of one shard.
pub struct BackupJob {
    pub backup: String,
    pub shard: i32,
    pub replica: String,
    pub server: Client,
    /// The mounted data volume of the backup replica (`/var/lib/clickhouse`).
    pub data_dir: PathBuf,
    /// The replica's further disks, mounted where the server has them.
    pub disk_dirs: Vec<PathBuf>,
    pub bucket: Bucket,
    /// The access key and secret key: a server with `BACKUP` writes to the bucket itself
    /// (none with web identity: the servers then use their own, decision 43).
    pub credentials: Option<(String, String)>,
    /// The named collection of the servers that holds the bucket and its keys (see
    /// [`Target`]).
    pub collection: Option<String>,
    pub base: Option<String>,
    /// `db` or `db.table`; empty: everything.
    pub scope: Vec<String>,
}

fn in_scope(scope: &[String], database: &str, table: &str) -> bool {
    scope.is_empty()
        || scope
            .iter()
            .any(|s| s == database || *s == format!("{database}.{table}"))
}

/// Hash of a part's `checksums.txt` (16 hex digits).
fn part_checksum(dir: &Path) -> Result<String, String> {
    let data = std::fs::read(dir.join("checksums.txt"))
        .map_err(|e| format!("{}: {e}", dir.join("checksums.txt").display()))?;
    Ok(manifest::checksum_of(&data))
}

/// Every file under `dir`, relative, with its size.
fn files_of(dir: &Path) -> Result<BTreeMap<String, u64>, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, u64>) -> Result<(), String> {
        let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in rd {
            let e = e.map_err(|e| e.to_string())?;
            let p = e.path();
            let md = e.metadata().map_err(|e| format!("{}: {e}", p.display()))?;
            if md.is_dir() {
                walk(base, &p, out)?;
            } else {
                let rel = p.strip_prefix(base).map_err(|e| e.to_string())?;
                out.insert(rel.to_string_lossy().into_owned(), md.len());
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// The snapshot folders under `shadow/` now.
fn shadows(data_dir: &Path) -> Vec<String> {
    std::fs::read_dir(data_dir.join("shadow"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A table's folder relative to a disk's root, from its data path on the server:
/// `data/<db>/<table>` (Ordinary databases) or `store/<xyz>/<uuid>` (Atomic databases). Every
/// segment is checked: a folder is never built from a path that could leave the disk.
fn relative_data_path(data_path: &str) -> Result<String, String> {
    let segments: Vec<&str> = data_path.trim_end_matches('/').split('/').collect();
    let ok = |s: &&str| !s.is_empty() && *s != "." && *s != "..";
    match segments.as_slice() {
        [.., kind @ ("data" | "store"), a, b] if ok(a) && ok(b) => Ok(format!("{kind}/{a}/{b}")),
        _ => Err(format!("unexpected table data path {data_path:?}")),
    }
}

impl BackupJob {
    pub async fn run(&self) -> Result<Report, String> {
        let version = self
            .server
            .version()
            .await
            .map_err(|e| format!("backup replica {}: {e}", self.replica))?;
        let base: Option<ShardManifest> = match &self.base {
            None => None,
            Some(b) => {
                let key = manifest::shard_manifest_key(b, self.shard);
                let data = self
                    .bucket
                    .get(&key, checks::limits::SHARD_MANIFEST_BYTES)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| {
                        format!("the base backup {b} has no {}", self.bucket.url(&key))
                    })?;
                let m: ShardManifest =
                    serde_json::from_slice(&data).map_err(|e| format!("{key}: {e}"))?;
                // the base comes from the bucket too: its part keys are reused only once its
                // manifest keeps every rule a restore would hold it to
                let external = checks::Allow { external: true };
                checks::check_shard(&m, b, self.shard, external).map_err(|r| {
                    format!(
                        "the manifest of base backup {b} breaks a rule ({r}): take a full backup"
                    )
                })?;
                Some(m)
            }
        };
        let databases = sql::databases(&self.server)
            .await
            .map_err(|e| e.to_string())?;
        let tables = sql::tables(&self.server).await.map_err(|e| e.to_string())?;
        if version.supports(crate::clickhouse::Capability::Backup) {
            return self
                .run_native(version, databases, tables, base.as_ref())
                .await;
        }
        let mut out = ShardManifest {
            format: manifest::FORMAT,
            backup: self.backup.clone(),
            shard: self.shard,
            replica: self.replica.clone(),
            server_version: version.to_string(),
            ..ShardManifest::default()
        };
        let mut report = Report::default();
        for t in tables
            .iter()
            .filter(|t| in_scope(&self.scope, &t.database, &t.name))
        {
            let mut entry = Table {
                database: t.database.clone(),
                name: t.name.clone(),
                engine: t.engine.clone(),
                create: t.create.clone(),
                parts: Vec::new(),
            };
            if t.has_parts() {
                entry.parts = self.back_up_parts(t, base.as_ref(), &mut report).await?;
            }
            out.tables.push(entry);
        }
        for d in databases.iter().filter(|d| {
            out.tables.iter().any(|t| t.database == d.name) || in_scope(&self.scope, &d.name, "")
        }) {
            out.databases
                .insert(d.name.clone(), sql::create_database_sql(d));
        }
        self.write_manifest(&out).await?;
        report.ok = true;
        Ok(report)
    }

    /// Writes the shard's manifest: this shard's part of the backup is complete.
    async fn write_manifest(&self, m: &ShardManifest) -> Result<(), String> {
        let data = serde_json::to_vec_pretty(m).map_err(|e| e.to_string())?;
        self.bucket
            .put(
                &manifest::shard_manifest_key(&self.backup, self.shard),
                data,
            )
            .await
            .map_err(|e| e.to_string())
    }

    /// A server with `BACKUP` writes the shard's backup to the bucket itself (incremental on
    /// the base's own backup); the agent follows it in `system.backups` and writes the shard's
    /// manifest with the schema. Checked by a current parser only (`tests/modern_sql.rs`).
    async fn run_native(
        &self,
        version: crate::clickhouse::Version,
        databases: Vec<sql::Database>,
        tables: Vec<sql::Table>,
        base: Option<&ShardManifest>,
    ) -> Result<Report, String> {
        let target_of = Target::of(
            version,
            self.collection.as_deref(),
            &self.bucket,
            self.credentials.as_ref(),
        )?;
        let names: Vec<String> = databases
            .iter()
            .filter(|d| {
                in_scope(&self.scope, &d.name, "")
                    || self
                        .scope
                        .iter()
                        .any(|s| s.starts_with(&format!("{}.", d.name)))
            })
            .map(|d| d.name.clone())
            .collect();
        let dir = manifest::native_dir(&self.backup, self.shard);
        let target = target_of.sql(&dir);
        let base_target = base
            .and_then(|b| b.native.as_ref())
            .map(|d| target_of.sql(d));
        let started = start(
            &self.server,
            &sql::backup_sql(&names, &target, base_target.as_deref()),
            &target_of,
        )
        .await
        .map_err(|e| format!("BACKUP on {}: {e}", self.replica))?;
        let id = started
            .decode(self.server.endpoint(), "BACKUP", |r| {
                Ok(r.str("id")?.to_string())
            })
            .map_err(|e| e.to_string())?
            .into_iter()
            .next()
            .ok_or("BACKUP returned no id")?;
        let size = follow(&self.server, &id).await?;
        let out = ShardManifest {
            format: manifest::FORMAT,
            backup: self.backup.clone(),
            shard: self.shard,
            replica: self.replica.clone(),
            server_version: version.to_string(),
            databases: databases
                .iter()
                .filter(|d| names.contains(&d.name))
                .map(|d| (d.name.clone(), sql::create_database_sql(d)))
                .collect(),
            tables: tables
                .into_iter()
                .filter(|t| names.contains(&t.database))
                .map(|t| Table {
                    database: t.database,
                    name: t.name,
                    engine: t.engine,
                    create: t.create,
                    parts: Vec::new(),
                })
                .collect(),
            native: Some(dir),
        };
        self.write_manifest(&out).await?;
        Ok(Report {
            ok: true,
            bytes_uploaded: size,
            ..Report::default()
        })
    }

    /// Every disk's root: the data volume, then the further disks.
    fn roots(&self) -> Vec<&Path> {
        std::iter::once(self.data_dir.as_path())
            .chain(self.disk_dirs.iter().map(PathBuf::as_path))
            .collect()
    }

    /// Freezes one table, uploads what the base does not hold, removes the snapshot (also on
    /// failure). A freeze snapshots each part on the disk that holds it, under the same
    /// `shadow/<n>` on every disk.
    async fn back_up_parts(
        &self,
        t: &sql::Table,
        base: Option<&ShardManifest>,
        report: &mut Report,
    ) -> Result<Vec<Part>, String> {
        let before: Vec<Vec<String>> = self.roots().iter().map(|r| shadows(r)).collect();
        // logged in the server's query_log: every backup statement shows where it ran
        self.server
            .exec(
                &sql::freeze_sql(&t.database, &t.name),
                &QueryOptions::new().setting("log_queries", 1),
            )
            .await
            .map_err(|e| format!("freezing {}.{}: {e}", t.database, t.name))?;
        let mut made: Vec<String> = Vec::new();
        for (root, before) in self.roots().iter().zip(&before) {
            for s in shadows(root) {
                if !before.contains(&s) && !made.contains(&s) {
                    made.push(s);
                }
            }
        }
        let result = async {
            let snapshot = match made.as_slice() {
                [] => return Ok(Vec::new()), // no part: nothing was frozen
                [one] => one,
                _ => {
                    return Err(format!(
                        "freezing {}.{} made {} snapshots ({}), expected one (another FREEZE at \
                         the same time?)",
                        t.database,
                        t.name,
                        made.len(),
                        made.join(", ")
                    ));
                }
            };
            let relative = relative_data_path(&t.data_path)?;
            let mut found: Vec<(String, String, PathBuf)> = Vec::new();
            for root in self.roots() {
                let dir = root.join("shadow").join(snapshot).join(&relative);
                if !dir.exists() {
                    continue;
                }
                let rd = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                for e in rd.flatten().filter(|e| e.path().is_dir()) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    found.push((name, part_checksum(&e.path())?, e.path()));
                }
            }
            found.sort();
            let names: Vec<(String, String)> = found
                .iter()
                .map(|(n, c, _)| (n.clone(), c.clone()))
                .collect();
            let plan =
                manifest::plan_parts(&self.backup, self.shard, &t.database, &t.name, &names, base);
            let mut parts = Vec::new();
            for ((name, checksum, path), source) in found.into_iter().zip(plan) {
                let files = files_of(&path)?;
                let bytes: u64 = files.values().sum();
                let key = match source {
                    PartSource::Reuse { key } => {
                        report.parts_reused += 1;
                        report.bytes_reused += bytes;
                        key
                    }
                    PartSource::Upload { key } => {
                        self.upload(&path, &key, &files).await?;
                        report.parts_uploaded += 1;
                        report.bytes_uploaded += bytes;
                        key
                    }
                };
                parts.push(Part {
                    name,
                    checksum,
                    key,
                    files,
                });
            }
            Ok(parts)
        }
        .await;
        for root in self.roots() {
            for s in &made {
                let _ = std::fs::remove_dir_all(root.join("shadow").join(s));
            }
        }
        result
    }

    async fn upload(
        &self,
        dir: &Path,
        key: &str,
        files: &BTreeMap<String, u64>,
    ) -> Result<(), String> {
        each_file(files, |f| {
            let (object, path) = (format!("{key}/{f}"), dir.join(f));
            async move { self.bucket.put_file(&object, &path).await }
        })
        .await
    }
}

/// Runs `transfer` on every file of a part, [`PARALLEL_FILES`] at a time; the first error wins.
async fn each_file<'a, F, Fut>(files: &'a BTreeMap<String, u64>, transfer: F) -> Result<(), String>
where
    F: Fn(&'a String) -> Fut,
    Fut: std::future::Future<Output = Result<u64, super::store::Error>>,
{
    let results: Vec<_> = futures::stream::iter(files.keys())
        .map(transfer)
        .buffer_unordered(PARALLEL_FILES)
        .collect()
        .await;
    for r in results {
        r.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Polls `system.backups` until the backup or restore `id` is done (its total size) or failed.
async fn follow(server: &Client, id: &str) -> Result<u64, String> {
    loop {
        let rows = server
            .query(&sql::backup_status_sql(id), &QueryOptions::new())
            .await
            .map_err(|e| e.to_string())?;
        let status = rows
            .decode(server.endpoint(), "system.backups", |r| {
                Ok((
                    r.str("status")?.to_string(),
                    r.str("error")?.to_string(),
                    r.u64("total_size").unwrap_or(0),
                ))
            })
            .map_err(|e| e.to_string())?;
        match status.first() {
            Some((s, _, size)) if s == "BACKUP_CREATED" || s == "RESTORED" => return Ok(*size),
            Some((s, error, _)) if s.ends_with("FAILED") || s.ends_with("CANCELLED") => {
                return Err(format!("{s} on {}: {error}", server.endpoint()));
            }
            Some(_) => tokio::time::sleep(std::time::Duration::from_secs(2)).await,
            None => return Err(format!("{id} is not in system.backups")),
        }
    }
}

/// One restore of one shard.
pub struct RestoreJob {
    pub backup: String,
    pub shard: i32,
    /// Every replica of the shard (the schema goes to each), the backup replica first.
    pub servers: Vec<Client>,
    pub data_dir: PathBuf,
    pub bucket: Bucket,
    /// The access key and secret key: a server with `BACKUP` reads the bucket itself (none
    /// with web identity: the servers then use their own, decision 43).
    pub credentials: Option<(String, String)>,
    /// The named collection of the servers that holds the bucket and its keys (see
    /// [`Target`]).
    pub collection: Option<String>,
    /// Restore into tables that already hold rows (their rows stay, the backup's are added).
    pub into_non_empty: bool,
    /// What the restore allows beyond the cluster (engines, table functions, dictionaries).
    pub allow: checks::Allow,
}

impl RestoreJob {
    /// Reads and checks the shard's manifest and what the bucket holds for it, refuses tables
    /// that hold rows, and only then creates the schema on every replica and attaches the parts
    /// on the backup replica: a manifest that breaks a rule changes nothing anywhere.
    pub async fn run(&self) -> Result<Report, String> {
        let key = manifest::shard_manifest_key(&self.backup, self.shard);
        let data = self
            .bucket
            .get(&key, checks::limits::SHARD_MANIFEST_BYTES)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("backup {} has no {}", self.backup, self.bucket.url(&key)))?;
        let m: ShardManifest = serde_json::from_slice(&data)
            .map_err(|e| format!("{} is not a shard manifest: {e}", self.bucket.url(&key)))?;
        let checked =
            checks::check_shard(&m, &self.backup, self.shard, self.allow).map_err(|r| {
                format!(
                    "the manifest of shard {} breaks a rule, nothing was restored: {r}",
                    self.shard
                )
            })?;
        self.verify_bucket(&checked).await?;
        let backup_replica = self.servers.first().ok_or("no replica to restore into")?;
        // decision 64: a view's statement depends on the server it goes to; every server's
        // are known to be writable before the first is sent
        let mut facts = Vec::new();
        for server in &self.servers {
            let f = server_facts(server).await?;
            checked.statements_for(&f).map_err(|r| {
                format!(
                    "shard {} cannot be restored into {}, nothing was restored: {r}",
                    self.shard,
                    server.endpoint()
                )
            })?;
            facts.push(f);
        }
        if checked.tables.iter().any(|t| t.keeper_path.is_some()) {
            let replicas = replicas(backup_replica).await?;
            checked
                .check_keeper_paths(self.shard, &replicas)
                .map_err(|r| {
                    format!(
                        "the manifest of shard {} cannot be restored here, nothing was restored: {r}",
                        self.shard
                    )
                })?;
        }
        if !self.into_non_empty {
            self.refuse_non_empty(backup_replica, &checked).await?;
        }
        let mut report = Report::default();
        for (server, f) in self.servers.iter().zip(&facts) {
            // what existed before is not the restore's to check (nor to drop)
            let before: Vec<(String, String)> = if f.version.supports(Capability::SqlSecurity) {
                sql::tables(server)
                    .await
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .map(|t| (t.database, t.name))
                    .collect()
            } else {
                Vec::new()
            };
            for d in &checked.databases {
                server
                    .exec(&d.statement, &QueryOptions::new().retry(true))
                    .await
                    .map_err(|e| format!("creating database {}: {e}", d.name))?;
            }
            for t in &checked.tables {
                let statement = t.statement_for(f).map_err(|r| r.to_string())?;
                server
                    .exec(statement, &QueryOptions::new().retry(true))
                    .await
                    .map_err(|e| format!("creating {}: {e}", t.object()))?;
            }
            if f.version.supports(Capability::SqlSecurity) {
                self.check_created_views(server, f, &checked, &before)
                    .await?;
            }
        }
        if let Some(dir) = &checked.native {
            report.bytes_downloaded = self.restore_native(backup_replica, &checked, dir).await?;
        } else {
            self.attach_parts(backup_replica, &checked, &mut report)
                .await?;
        }
        report.ok = true;
        Ok(report)
    }

    /// Each view the restore created on `server` runs as the restore meant (decision 64): a
    /// view `SQL SECURITY INVOKER`, a materialized view with no clause. One the server gave a
    /// definer after all is dropped again and fails the restore.
    async fn check_created_views(
        &self,
        server: &Client,
        facts: &checks::Server,
        shard: &checks::CheckedShard,
        before: &[(String, String)],
    ) -> Result<(), String> {
        let now = sql::tables(server).await.map_err(|e| e.to_string())?;
        for t in shard.tables.iter().filter(|t| {
            matches!(t.kind, checks::Kind::View | checks::Kind::MaterializedView)
                && !before
                    .iter()
                    .any(|(db, name)| *db == t.database && *name == t.name)
        }) {
            let Some(live) = now
                .iter()
                .find(|e| e.database == t.database && e.name == t.name)
            else {
                return Err(format!(
                    "{} was not created on {}",
                    t.object(),
                    server.endpoint()
                ));
            };
            if let Err(refused) = t.check_created(facts, &live.create) {
                let drop = crate::clickhouse::sql::drop_table(
                    facts.version,
                    &crate::clickhouse::sql::TableName::new(&t.database, &t.name),
                );
                let dropped = server.exec(&drop, &QueryOptions::new().retry(true)).await;
                return Err(match dropped {
                    Ok(()) => format!("on {}: {refused}", server.endpoint()),
                    Err(e) => format!(
                        "on {}: {refused} (but dropping it failed: {e}; drop it by hand)",
                        server.endpoint()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every file the manifest lists is in the bucket with its size, and every part's
    /// `checksums.txt` is the one the manifest hashed.
    async fn verify_bucket(&self, shard: &checks::CheckedShard) -> Result<(), String> {
        let mut stored = BTreeMap::new();
        for folder in shard.parts_by_folder().keys() {
            stored.extend(
                self.bucket
                    .list_sizes(folder)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let refused = |r: checks::Refusal| {
            format!(
                "the manifest of shard {} does not match the bucket, nothing was restored: {r}",
                self.shard
            )
        };
        checks::verify_stored(shard, &stored).map_err(refused)?;
        let found: Vec<Result<(), String>> = futures::stream::iter(
            shard
                .tables
                .iter()
                .flat_map(|t| t.parts.iter().map(move |p| (t, p))),
        )
        .map(|(t, p)| async move {
            let size = p.files["checksums.txt"];
            let key = format!("{}/checksums.txt", p.key);
            let data = self
                .bucket
                .get(&key, size)
                .await
                .map_err(|e| e.to_string())?
                .unwrap_or_default();
            checks::verify_checksum(t, p, &data).map_err(refused)
        })
        .buffer_unordered(PARALLEL_FILES * 2)
        .collect()
        .await;
        found.into_iter().collect()
    }

    async fn refuse_non_empty(
        &self,
        server: &Client,
        shard: &checks::CheckedShard,
    ) -> Result<(), String> {
        let existing = sql::tables(server).await.map_err(|e| e.to_string())?;
        for t in shard
            .tables
            .iter()
            .filter(|t| !t.parts.is_empty() || shard.native.is_some())
        {
            if t.kind != checks::Kind::Table
                || !existing
                    .iter()
                    .any(|e| e.database == t.database && e.name == t.name)
            {
                continue;
            }
            let n = sql::count(server, &t.database, &t.name)
                .await
                .map_err(|e| e.to_string())?;
            if n > 0 {
                return Err(format!(
                    "table {} already holds {n} rows: drop it first, or restore with intoNonEmptyTables",
                    t.object()
                ));
            }
        }
        Ok(())
    }

    /// A server with `BACKUP` restores the data of the tables the agent created from checked
    /// statements (`create_table = 0`: the server creates none of its own).
    async fn restore_native(
        &self,
        server: &Client,
        shard: &checks::CheckedShard,
        dir: &str,
    ) -> Result<u64, String> {
        let version = server.version().await.map_err(|e| e.to_string())?;
        let source_of = Target::of(
            version,
            self.collection.as_deref(),
            &self.bucket,
            self.credentials.as_ref(),
        )?;
        let source = source_of.sql(dir);
        let names: Vec<String> = shard.databases.iter().map(|d| d.name.clone()).collect();
        let started = start(
            server,
            &sql::restore_sql(&names, &source, self.into_non_empty),
            &source_of,
        )
        .await
        .map_err(|e| format!("RESTORE: {e}"))?;
        let id = started
            .decode(server.endpoint(), "RESTORE", |r| {
                Ok(r.str("id")?.to_string())
            })
            .map_err(|e| e.to_string())?
            .into_iter()
            .next()
            .ok_or("RESTORE returned no id")?;
        follow(server, &id).await
    }

    /// Each part downloaded into its table's `detached/` folder on the backup replica (the
    /// folder found from the server's own table, names from the checked manifest) and attached;
    /// a part that fails is removed from `detached/`.
    async fn attach_parts(
        &self,
        server: &Client,
        shard: &checks::CheckedShard,
        report: &mut Report,
    ) -> Result<(), String> {
        let now = sql::tables(server).await.map_err(|e| e.to_string())?;
        for t in shard.tables.iter().filter(|t| !t.parts.is_empty()) {
            let live = now
                .iter()
                .find(|e| e.database == t.database && e.name == t.name)
                .ok_or_else(|| format!("{} was not created", t.object()))?;
            let detached = self
                .data_dir
                .join(relative_data_path(&live.data_path)?)
                .join("detached");
            for p in &t.parts {
                let into = detached.join(&p.name);
                let _ = std::fs::remove_dir_all(&into);
                let attached = async {
                    self.download(&p.key, &into, &p.files).await?;
                    server
                        .exec(
                            &sql::attach_part_sql(&t.database, &t.name, &p.name),
                            &QueryOptions::new(),
                        )
                        .await
                        .map_err(|e| format!("attaching {} to {}: {e}", p.name, t.object()))
                }
                .await;
                if let Err(e) = attached {
                    let _ = std::fs::remove_dir_all(&into);
                    return Err(e);
                }
                report.parts_attached += 1;
                report.bytes_downloaded += p.bytes();
            }
        }
        Ok(())
    }

    async fn download(
        &self,
        key: &str,
        into: &Path,
        files: &BTreeMap<String, u64>,
    ) -> Result<(), String> {
        for f in files.keys() {
            if let Some(parent) = into.join(f).parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
            }
        }
        each_file(files, |f| {
            let (object, path, size) = (format!("{key}/{f}"), into.join(f), files[f]);
            async move { self.bucket.get_file(&object, &path, size).await }
        })
        .await
    }
}

/// What the restore must know of `server` to write its views' statements (decision 64): its
/// version and, from 24.2, whether it keeps a view created without `SQL SECURITY` without one
/// (a setting it does not report counts as off).
async fn server_facts(server: &Client) -> Result<checks::Server, String> {
    let at = |e: crate::clickhouse::client::Error| format!("{}: {e}", server.endpoint());
    let version = server.version().await.map_err(at)?;
    let mut facts = checks::Server::of_version(version);
    if version.supports(Capability::SqlSecurity) {
        let rows = server
            .query(
                checks::KEEPS_EMPTY_SQL_SECURITY,
                &QueryOptions::new().retry(true),
            )
            .await
            .map_err(at)?;
        let values = rows
            .decode(server.endpoint(), "system.server_settings", |r| {
                Ok(r.str("value")?.to_string())
            })
            .map_err(at)?;
        facts.keeps_empty_sql_security = values.first().is_some_and(|v| v == "1");
    }
    Ok(facts)
}

/// Database, table and Keeper path of every replicated table of `server`.
async fn replicas(server: &Client) -> Result<Vec<(String, String, String)>, String> {
    let at = |e: crate::clickhouse::client::Error| format!("{}: {e}", server.endpoint());
    server
        .query(checks::REPLICAS, &QueryOptions::new().retry(true))
        .await
        .map_err(at)?
        .decode(server.endpoint(), "system.replicas", |r| {
            Ok((
                r.str("database")?.to_string(),
                r.str("table")?.to_string(),
                r.str("zookeeper_path")?.to_string(),
            ))
        })
        .map_err(at)
}

/// Where the report goes (the container's termination message).
const TERMINATION_LOG: &str = "/dev/termination-log";

/// `clickhouse-operator backup-agent`: reads its configuration from the environment the Job
/// sets ([`crate::model::job::AgentJob`]), runs, and writes its [`Report`] to the termination log.
/// The exit code is 0 only when the work is complete. The report's error has every secret the
/// agent holds (the servers' password, the S3 keys) hidden: it reaches the pod's status, the
/// resource's status and an Event.
pub async fn main_from_env() -> i32 {
    let mut report = match run_from_env().await {
        Ok(r) => r,
        Err(e) => Report {
            ok: false,
            error: Some(e),
            ..Report::default()
        },
    };
    let redactor = secrets_from_env();
    if let Some(e) = report.error.as_mut() {
        // the termination message holds 4096 bytes; no token or temporary credential either
        *e = super::sts::scrub(&redactor.scrub(e))
            .chars()
            .take(3000)
            .collect();
    }
    let text = serde_json::to_string(&report).unwrap_or_default();
    println!("{text}");
    let path = std::env::var("TERMINATION_LOG").unwrap_or_else(|_| TERMINATION_LOG.into());
    if let Err(e) = std::fs::write(&path, &text) {
        eprintln!("cannot write the report to {path}: {e}");
    }
    if report.ok { 0 } else { 1 }
}

/// The secrets the agent is given, to hide in what it reports.
fn secrets_from_env() -> crate::util::redact::Redactor {
    let mut r = crate::util::redact::Redactor::new();
    for name in ["CH_PASSWORD", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"] {
        if let Ok(v) = std::env::var(name) {
            r.add(&v);
        }
    }
    r
}

/// The most bytes of one answer the agent reads (the operator's is
/// [`crate::clickhouse::client::MAX_ANSWER_BYTES`]): the agent runs in a Job of its own for one
/// cluster, and reads the parts of whole tables.
pub const AGENT_MAX_ANSWER_BYTES: usize = 128 << 20;

/// The bytes all answers may take at once in an agent.
pub const AGENT_ANSWER_BUDGET_BYTES: usize = 512 << 20;

async fn run_from_env() -> Result<Report, String> {
    crate::clickhouse::client::set_answer_budget(AGENT_ANSWER_BUDGET_BYTES);
    let var = |n: &str| std::env::var(n).map_err(|_| format!("{n} is not set"));
    let opt = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    let shard: i32 = var("SHARD")?.parse().map_err(|e| format!("SHARD: {e}"))?;
    let port: u16 = var("CH_PORT")?
        .parse()
        .map_err(|e| format!("CH_PORT: {e}"))?;
    let credentials = crate::clickhouse::Credentials {
        user: var("CH_USER")?,
        password: var("CH_PASSWORD")?,
    };
    // a CA verifies the servers by their host names; without one, `CH_TLS=unverified` still
    // speaks TLS
    let tls_ca = opt("CH_TLS_CA").map(String::into_bytes);
    let tls_on = tls_ca.is_some() || opt("CH_TLS").as_deref() == Some("unverified");
    let tls = tls_on.then_some(crate::clickhouse::Tls {
        ca: tls_ca,
        server_name: None,
    });
    let servers = var("CH_HOSTS")?
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|host| {
            let endpoint = crate::clickhouse::Endpoint {
                host: host.to_string(),
                port,
            };
            let mut config = crate::clickhouse::ClientConfig::for_server(
                endpoint,
                credentials.clone(),
                tls.clone(),
            );
            config.timeout = std::time::Duration::from_secs(600);
            // the agent's own Job, one cluster's servers: parts lists of large tables
            config.max_answer_bytes = AGENT_MAX_ANSWER_BYTES;
            Client::new(config).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let destination = crate::api::S3Destination {
        endpoint: var("S3_ENDPOINT")?,
        bucket: var("S3_BUCKET")?,
        prefix: opt("S3_PREFIX"),
        region: opt("S3_REGION"),
        web_identity: opt("AWS_ROLE_ARN").map(|role_arn| crate::api::WebIdentity {
            role_arn,
            service_account_name: opt("S3_SERVICE_ACCOUNT").unwrap_or_default(),
            ..crate::api::WebIdentity::default()
        }),
        ..crate::api::S3Destination::default()
    };
    let (credentials, signing) = match opt("AWS_ROLE_ARN") {
        None => {
            let keys = (var("S3_ACCESS_KEY_ID")?, var("S3_SECRET_ACCESS_KEY")?);
            let signing = super::store::Credentials::Keys {
                access_key_id: keys.0.clone(),
                secret_access_key: keys.1.clone(),
            };
            (Some(keys), signing)
        }
        // decision 43: the projected token, exchanged with STS and again before the
        // credentials expire
        Some(role) => {
            let endpoint = var("AWS_ENDPOINT_URL_STS")?;
            let sts = super::sts::Sts::new(
                &endpoint,
                // the operator allowed http only with the destination's `insecure`
                endpoint.starts_with("http://"),
                &role,
                &opt("S3_SERVICE_ACCOUNT").unwrap_or_default(),
                &opt("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "clickhouse-backup-agent".into()),
            )
            .map_err(|e| e.to_string())?;
            let token = super::sts::Token::File(PathBuf::from(var("AWS_WEB_IDENTITY_TOKEN_FILE")?));
            let provider = std::sync::Arc::new(super::sts::WebIdentityCredentials::new(sts, token));
            (None, super::store::Credentials::WebIdentity(provider))
        }
    };
    let bucket = Bucket::open_with(&destination, &signing, "", super::store::Patience::Patient)
        .map_err(|e| e.to_string())?;
    let data_dir = PathBuf::from(var("DATA_DIR")?);
    let backup = var("BACKUP_NAME")?;
    match var("AGENT_MODE")?.as_str() {
        "backup" => {
            let server = servers.into_iter().next().ok_or("CH_HOSTS is empty")?;
            BackupJob {
                backup,
                shard,
                replica: var("REPLICA")?,
                server,
                data_dir,
                disk_dirs: opt("DISK_PATHS")
                    .map(|p| p.split(',').map(PathBuf::from).collect())
                    .unwrap_or_default(),
                bucket,
                credentials,
                collection: opt("S3_COLLECTION"),
                base: opt("BASE_BACKUP"),
                scope: opt("TABLES")
                    .map(|t| t.split(',').map(str::to_string).collect())
                    .unwrap_or_default(),
            }
            .run()
            .await
        }
        "restore" => {
            RestoreJob {
                backup,
                shard,
                servers,
                data_dir,
                bucket,
                credentials,
                collection: opt("S3_COLLECTION"),
                into_non_empty: opt("INTO_NON_EMPTY").is_some_and(|v| v == "true"),
                allow: checks::Allow {
                    external: opt("ALLOW_EXTERNAL_SOURCES").is_some_and(|v| v == "true"),
                },
            }
            .run()
            .await
        }
        other => Err(format!("AGENT_MODE {other:?}: backup or restore")),
    }
}

/// Where a server's own `BACKUP` writes or `RESTORE` reads (decision 35): on a server that
/// reads named collections from its configuration, the collection the operator keeps there
/// with the bucket and its keys, so that no key is in the statement; on older ones
/// (22.8 to 23.7) the keys in the statement, masked in every log and error of the operator and
/// its agents.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Collection {
        name: String,
        /// The bucket's prefix, ending in `/` (or empty).
        prefix: String,
    },
    Keys {
        /// `<endpoint>/<bucket>/<prefix>/`.
        base: String,
        access: String,
        secret: String,
    },
}

/// How long a statement waits for the servers to load a named collection the operator has just
/// written (the kubelet updates a Secret's files within about a minute; the servers reload
/// their configuration within seconds of that).
const COLLECTION_WAIT: std::time::Duration = std::time::Duration::from_secs(150);

impl Target {
    fn of(
        version: crate::clickhouse::Version,
        collection: Option<&str>,
        bucket: &Bucket,
        keys: Option<&(String, String)>,
    ) -> Result<Target, String> {
        match (collection, keys) {
            (Some(name), _)
                if version.supports(crate::clickhouse::Capability::BackupNamedCollection) =>
            {
                Ok(Target::Collection {
                    name: name.to_string(),
                    prefix: bucket.key_prefix(),
                })
            }
            (_, Some((access, secret))) => Ok(Target::Keys {
                base: format!("{}/", bucket.http_url("").trim_end_matches('/')),
                access: access.clone(),
                secret: secret.clone(),
            }),
            (_, None) => Err(format!(
                "a server {version} writes backups itself and takes S3 credentials only as keys in the statement: webIdentity needs servers that read named collections (23.8 and later) or servers without BACKUP"
            )),
        }
    }

    /// `S3(…)` of folder `dir` of the bucket.
    fn sql(&self, dir: &str) -> String {
        match self {
            Target::Collection { name, prefix } => {
                sql::s3_collection_target(name, &format!("{prefix}{dir}/"))
            }
            Target::Keys {
                base,
                access,
                secret,
            } => sql::s3_target(&format!("{base}{dir}/"), access, secret),
        }
    }
}

/// The server does not know the named collection (yet).
fn collection_unknown(e: &impl std::fmt::Display) -> bool {
    let text = e.to_string().to_lowercase();
    text.contains("no collection named")
        || text.contains("no named collection")
        || text.contains("named_collection_doesnt_exist")
}

/// Starts `statement` (a `BACKUP` or `RESTORE … ASYNC`); with a named collection, waits up to
/// [`COLLECTION_WAIT`] for the server to know it.
async fn start(
    server: &Client,
    statement: &str,
    target: &Target,
) -> Result<crate::clickhouse::client::Rows, String> {
    let started = std::time::Instant::now();
    loop {
        let e = match server.query(statement, &QueryOptions::new()).await {
            Ok(rows) => return Ok(rows),
            Err(e) => e,
        };
        match target {
            Target::Collection { name, .. } if collection_unknown(&e) => {
                if started.elapsed() > COLLECTION_WAIT {
                    return Err(format!(
                        "the server has not loaded named collection {name} (the destination's bucket and keys) within {} s: check that the destination's Secret carries the label clickhouse.com/s3-credentials and that the cluster's users Secret reached the pod",
                        COLLECTION_WAIT.as_secs()
                    ));
                }
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
            _ => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decision 35: a server that reads named collections gets the collection and a folder
    /// in it, never a key; an older server (or no collection) gets the keys.
    #[test]
    fn a_server_with_named_collections_gets_no_key_in_the_statement() {
        let d = crate::api::S3Destination {
            endpoint: "https://s3.example.com".into(),
            bucket: "b".into(),
            prefix: Some("ns/c1".into()),
            ..Default::default()
        };
        let bucket = Bucket::open(
            &d,
            "AKID",
            "SECRETKEY",
            "",
            super::super::store::Patience::Quick,
        )
        .unwrap();
        let keys = ("AKID".to_string(), "SECRETKEY".to_string());
        let modern = Target::of(
            "24.8".parse().unwrap(),
            Some("chop_s3_0123456789abcdef"),
            &bucket,
            Some(&keys),
        )
        .unwrap();
        // decision 43: with web identity, a collection (the servers' own credentials) or nothing
        let web = Target::of(
            "24.8".parse().unwrap(),
            Some("chop_s3_0123456789abcdef"),
            &bucket,
            None,
        );
        assert_eq!(web.as_ref(), Ok(&modern));
        let old_web = Target::of(
            "23.7".parse().unwrap(),
            Some("chop_s3_0123456789abcdef"),
            &bucket,
            None,
        );
        assert!(old_web.unwrap_err().contains("23.8"));
        let sql = modern.sql("backups/b1/shard-0");
        assert_eq!(
            sql,
            "S3(chop_s3_0123456789abcdef, 'ns/c1/backups/b1/shard-0/')"
        );
        assert!(!sql.contains("AKID") && !sql.contains("SECRETKEY"));
        for (version, collection) in [("23.7", Some("chop_s3_0123456789abcdef")), ("24.8", None)] {
            let old =
                Target::of(version.parse().unwrap(), collection, &bucket, Some(&keys)).unwrap();
            let sql = old.sql("backups/b1/shard-0");
            assert!(
                sql.contains("'https://s3.example.com/b/ns/c1/backups/b1/shard-0/'"),
                "{sql}"
            );
            assert!(sql.contains("SECRETKEY"), "{sql}");
        }
        assert!(collection_unknown(
            &"Code: 36. DB::Exception: There is no collection named `chop_s3_x` in config. (BAD_ARGUMENTS)"
        ));
        assert!(collection_unknown(
            &"Code: 669. DB::Exception: There is no named collection `chop_s3_x`. (NAMED_COLLECTION_DOESNT_EXIST)"
        ));
        assert!(!collection_unknown(
            &"Code: 243. DB::Exception: Access Denied"
        ));
    }

    #[test]
    fn table_data_paths_map_into_the_snapshot() {
        assert_eq!(
            relative_data_path("/var/lib/clickhouse/data/default/events/").unwrap(),
            "data/default/events"
        );
        assert_eq!(
            relative_data_path("/tmp/data/data/d%2Db/t").unwrap(),
            "data/d%2Db/t"
        );
        assert_eq!(
            relative_data_path(
                "/var/lib/clickhouse/store/3f2/3f2a0c1e-0c55-4d5c-9e3a-7f6b0a9d4c21/"
            )
            .unwrap(),
            "store/3f2/3f2a0c1e-0c55-4d5c-9e3a-7f6b0a9d4c21",
            "Atomic databases"
        );
        assert!(relative_data_path("/elsewhere/x").is_err());
        assert!(relative_data_path("/var/lib/clickhouse/data/../..").is_err());
        assert!(relative_data_path("/var/lib/clickhouse/data//t").is_err());
    }

    #[test]
    fn scope_selects_databases_and_tables() {
        let scope = vec!["db1".to_string(), "db2.t".to_string()];
        assert!(in_scope(&scope, "db1", "anything"));
        assert!(in_scope(&scope, "db2", "t"));
        assert!(!in_scope(&scope, "db2", "u"));
        assert!(in_scope(&[], "x", "y"));
    }
}
