//! What a backup holds, written as JSON into the bucket:
//!
//! - `backups/<backup>/shard-<n>.json` ([`ShardManifest`]): the schema and the parts of shard
//!   `n`, written by the shard's agent once every part is uploaded;
//! - `backups/<backup>/manifest.json` ([`Manifest`]): written last by the operator, once every
//!   shard's manifest is there. A backup without it is not complete and is never restored from
//!   or built upon.
//!
//! A part is stored under the backup that uploaded it first:
//! `backups/<backup>/shard-<n>/<database>/<table>/<part>/<file>`. Parts never change, so an
//! incremental backup lists the parts its base already holds with the base's key instead of
//! uploading them again ([`plan_parts`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Format version of the manifests.
pub const FORMAT: u32 = 1;

/// Folder of one backup.
pub fn backup_dir(backup: &str) -> String {
    format!("backups/{backup}")
}

/// Key of a backup's manifest.
pub fn manifest_key(backup: &str) -> String {
    format!("{}/manifest.json", backup_dir(backup))
}

/// Folder a server with `BACKUP` writes one shard's backup to.
pub fn native_dir(backup: &str, shard: i32) -> String {
    format!("{}/shard-{shard}/native", backup_dir(backup))
}

/// Key of one shard's manifest.
pub fn shard_manifest_key(backup: &str, shard: i32) -> String {
    format!("{}/shard-{shard}.json", backup_dir(backup))
}

/// Folder of one part uploaded by `backup`.
pub fn part_dir(backup: &str, shard: i32, database: &str, table: &str, part: &str) -> String {
    format!(
        "{}/shard-{shard}/{}/{}/{}",
        backup_dir(backup),
        escape(database),
        escape(table),
        escape(part)
    )
}

/// A name as one path segment: alphanumerics, `_`, `-`, `.` kept, the rest `%XX`.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The checksum a manifest lists for a part: the first 8 bytes of the SHA-256 of its
/// `checksums.txt`, in hexadecimal (ClickHouse checks every other file against that file when
/// it attaches the part).
pub fn checksum_of(checksums_txt: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(checksums_txt)[..8])
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub format: u32,
    pub backup: String,
    pub namespace: String,
    pub cluster: String,
    pub shards: Vec<i32>,
    /// The backup whose parts this one references, if incremental.
    #[serde(default)]
    pub base: Option<String>,
    pub completed: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShardManifest {
    pub format: u32,
    pub backup: String,
    pub shard: i32,
    /// The backup replica every statement and read of this shard ran on.
    pub replica: String,
    pub server_version: String,
    /// `CREATE DATABASE` statements, by database.
    pub databases: BTreeMap<String, String>,
    pub tables: Vec<Table>,
    /// Set when the server wrote the backup itself (`BACKUP … TO S3`, 22.8 and later): the
    /// folder it wrote (relative to the prefix); `tables` then list no parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    pub database: String,
    pub name: String,
    pub engine: String,
    /// The `CREATE` statement as the server keeps it (macros unexpanded).
    pub create: String,
    /// Active parts at the time of the backup (MergeTree family only).
    pub parts: Vec<Part>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    pub name: String,
    /// Hash of the part's `checksums.txt`: two parts with the same name and hash are the same.
    pub checksum: String,
    /// Folder in the bucket holding the part's files (possibly an earlier backup's).
    pub key: String,
    /// File names and sizes.
    pub files: BTreeMap<String, u64>,
}

impl Part {
    pub fn bytes(&self) -> u64 {
        self.files.values().sum()
    }
}

impl ShardManifest {
    /// The part of `database.table` named `name` with that checksum, if this backup has it.
    pub fn find(&self, database: &str, table: &str, name: &str, checksum: &str) -> Option<&Part> {
        self.tables
            .iter()
            .find(|t| t.database == database && t.name == table)?
            .parts
            .iter()
            .find(|p| p.name == name && p.checksum == checksum)
    }

    /// Every part folder this shard's backup references.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tables
            .iter()
            .flat_map(|t| t.parts.iter().map(|p| p.key.as_str()))
    }
}

/// Whether a part is uploaded or taken from the base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartSource {
    Upload { key: String },
    Reuse { key: String },
}

/// Where each part of `database.table` comes from in `backup`: the base's copy when the base
/// (an earlier, complete backup of the same shard) holds the same part, else a new upload.
pub fn plan_parts(
    backup: &str,
    shard: i32,
    database: &str,
    table: &str,
    parts: &[(String, String)],
    base: Option<&ShardManifest>,
) -> Vec<PartSource> {
    parts
        .iter()
        .map(
            |(name, checksum)| match base.and_then(|b| b.find(database, table, name, checksum)) {
                Some(p) => PartSource::Reuse { key: p.key.clone() },
                None => PartSource::Upload {
                    key: part_dir(backup, shard, database, table, name),
                },
            },
        )
        .collect()
}

/// The objects under `backup`'s folder that no backup in `keep` references: what removing
/// `backup` may delete. `objects` are the keys under its folder.
pub fn deletable<'a>(
    backup: &str,
    objects: &'a [String],
    keep: &[ShardManifest],
) -> Vec<&'a String> {
    let referenced: Vec<&str> = keep
        .iter()
        .filter(|m| m.backup != backup)
        .flat_map(|m| m.keys())
        .collect();
    objects
        .iter()
        .filter(|o| !referenced.iter().any(|k| o.starts_with(&format!("{k}/"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(backup: &str, parts: &[(&str, &str, &str)]) -> ShardManifest {
        ShardManifest {
            format: FORMAT,
            backup: backup.into(),
            shard: 0,
            tables: vec![Table {
                database: "db".into(),
                name: "t".into(),
                parts: parts
                    .iter()
                    .map(|(n, c, k)| Part {
                        name: n.to_string(),
                        checksum: c.to_string(),
                        key: k.to_string(),
                        files: BTreeMap::from([("data.bin".into(), 10)]),
                    })
                    .collect(),
                ..Table::default()
            }],
            ..ShardManifest::default()
        }
    }

    /// An incremental backup references the parts its base holds (same name and checksum) and
    /// uploads the rest; a part merged since (new name) or changed (new checksum) is uploaded.
    #[test]
    fn an_incremental_backup_uploads_only_parts_its_base_does_not_hold() {
        let base = manifest(
            "b1",
            &[("all_1_1_0", "c1", "backups/b1/shard-0/db/t/all_1_1_0")],
        );
        let parts = vec![
            ("all_1_1_0".to_string(), "c1".to_string()),
            ("all_2_2_0".to_string(), "c2".to_string()),
            ("all_3_3_0".to_string(), "other".to_string()),
        ];
        let plan = plan_parts("b2", 0, "db", "t", &parts, Some(&base));
        assert_eq!(
            plan,
            [
                PartSource::Reuse {
                    key: "backups/b1/shard-0/db/t/all_1_1_0".into()
                },
                PartSource::Upload {
                    key: "backups/b2/shard-0/db/t/all_2_2_0".into()
                },
                PartSource::Upload {
                    key: "backups/b2/shard-0/db/t/all_3_3_0".into()
                },
            ]
        );
        let changed = vec![("all_1_1_0".to_string(), "c9".to_string())];
        assert!(matches!(
            plan_parts("b2", 0, "db", "t", &changed, Some(&base))[0],
            PartSource::Upload { .. }
        ));
        assert!(matches!(
            plan_parts("b2", 0, "db", "t", &parts, None)[0],
            PartSource::Upload { .. }
        ));
    }

    /// Removing a backup deletes only the objects no remaining backup references.
    #[test]
    fn removing_a_backup_keeps_what_a_later_backup_references() {
        let b2 = manifest("b2", &[("p1", "c", "backups/b1/shard-0/db/t/p1")]);
        let objects = vec![
            "backups/b1/manifest.json".to_string(),
            "backups/b1/shard-0/db/t/p1/data.bin".to_string(),
            "backups/b1/shard-0/db/t/p2/data.bin".to_string(),
        ];
        let gone = deletable("b1", &objects, &[b2]);
        assert_eq!(
            gone,
            [&objects[0], &objects[2]],
            "p1 stays: b2 references it"
        );
    }

    #[test]
    fn names_become_safe_path_segments() {
        assert_eq!(
            part_dir("b", 1, "my db", "t/x", "all_1_1_0"),
            "backups/b/shard-1/my%20db/t%2Fx/all_1_1_0"
        );
    }
}
