//! What deleting a backup removes from its bucket (`deletionPolicy: Delete`), run by the
//! operator, which every cluster shares: so nothing of the bucket is held whole (review M-1,
//! decision 70). A bucket is chosen by a cluster's editor (`spec.backup.destination`) and
//! written by whoever holds its keys, so it may list millions of keys and serve manifests of
//! any size, or endless ones.
//!
//! - Listings are read page by page and not kept.
//! - Every other backup's shard manifest is parsed as it arrives, on a blocking thread, keeping
//!   only the part folders under the deleted backup's folder (what it must not delete):
//!   everything else of the manifest (statements, file lists) is skipped unread into memory.
//! - Bounds: a manifest of more than [`crate::backup::checks::limits::SHARD_MANIFEST_BYTES`],
//!   one JSON string or number longer than [`TOKEN_BYTES`], more than [`REFERENCED_BYTES`] of
//!   referenced folders, or a removal longer than its deadline fails the removal with the
//!   reason, before anything is deleted for the first three; the data then stays and the
//!   deletion is retried (the caller says so in an Event).
//!
//! A manifest that is not JSON of a shard manifest protects nothing, as before (a restore
//! refuses it too).

use std::collections::BTreeSet;
use std::io::Read;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::TryStreamExt;
use serde::Deserialize;
use serde::de::{Deserializer, SeqAccess, Visitor};

use super::checks::limits::SHARD_MANIFEST_BYTES;
use super::store::{Bucket, Error};
use crate::model::manifest;

/// The longest JSON string or number of a manifest read while removing (a statement is at
/// most [`crate::backup::checks::limits::STATEMENT_BYTES`], escaped maybe twice that).
pub const TOKEN_BYTES: usize = 4 << 20;
/// The most bytes of part folders other backups may reference in the deleted one's folder
/// (each counted with [`KEY_OVERHEAD`]).
pub const REFERENCED_BYTES: usize = 16 << 20;
/// What keeping one referenced folder costs besides its bytes.
pub const KEY_OVERHEAD: usize = 64;
/// How long one removal may take.
pub const DEADLINE: Duration = Duration::from_secs(300);

/// What a removal did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Objects deleted (the backup's manifest among them).
    pub gone: usize,
    /// Objects kept, referenced by other backups.
    pub kept: usize,
}

/// Removes backup `name`'s data from `bucket` within `deadline`: every object under its folder
/// that no other backup's shard manifest references, its manifest first (so that it stops being
/// complete at once).
pub async fn remove(bucket: &Bucket, name: &str, deadline: Duration) -> Result<Removed, Error> {
    match tokio::time::timeout(deadline, remove_now(bucket, name)).await {
        Ok(done) => done,
        Err(_) => Err(bucket.other(format!(
            "removing backup {name} took longer than {} s (a bucket that lists or serves without end?); it is retried",
            deadline.as_secs()
        ))),
    }
}

async fn remove_now(bucket: &Bucket, name: &str) -> Result<Removed, Error> {
    let dir = format!("{}/", manifest::backup_dir(name));
    let mut referenced = Referenced::default();
    let mut listing = bucket.list_stream("backups/");
    while let Some(key) = listing.try_next().await? {
        let is_shard_manifest = key
            .rsplit('/')
            .next()
            .is_some_and(|f| f.starts_with("shard-") && f.ends_with(".json"));
        if is_shard_manifest && !key.starts_with(&dir) {
            referenced_by(bucket, &key, name, &dir, &mut referenced).await?;
        }
    }
    drop(listing);
    let top = manifest::manifest_key(name);
    bucket.delete(&top).await?;
    let mut done = Removed::default();
    let mut listing = bucket.list_stream(&dir);
    while let Some(key) = listing.try_next().await? {
        if referenced.covers(&key) {
            done.kept += 1;
            continue;
        }
        if key != top {
            bucket.delete(&key).await?;
        }
        done.gone += 1;
    }
    Ok(done)
}

/// The part folders under the deleted backup's folder that other backups reference.
#[derive(Debug, Default)]
pub struct Referenced {
    keys: BTreeSet<String>,
    /// A manifest references a folder the whole backup is in: nothing is deleted.
    everything: bool,
    bytes: usize,
}

impl Referenced {
    /// Whether `object` (a key under the deleted backup's folder) is in a referenced folder.
    pub fn covers(&self, object: &str) -> bool {
        self.everything
            || object
                .match_indices('/')
                .any(|(i, _)| self.keys.contains(&object[..i]))
    }

    /// Adds the part folder `key`, if it concerns `dir` (the deleted backup's folder, with its
    /// `/`); false once more than [`REFERENCED_BYTES`] would be kept.
    fn add(&mut self, key: &str, dir: &str) -> bool {
        let folder = format!("{key}/");
        if dir.starts_with(&folder) {
            self.everything = true;
        } else if folder.starts_with(dir) && !self.keys.contains(key) {
            self.bytes += key.len() + KEY_OVERHEAD;
            if self.bytes > REFERENCED_BYTES {
                return false;
            }
            self.keys.insert(key.to_string());
        }
        true
    }
}

/// Reads the shard manifest at `key` as it arrives and adds what it references under `dir`
/// unless it is a manifest of `name` itself.
async fn referenced_by(
    bucket: &Bucket,
    key: &str,
    name: &str,
    dir: &str,
    referenced: &mut Referenced,
) -> Result<(), Error> {
    let Some(mut stream) = bucket.get_stream(key, SHARD_MANIFEST_BYTES).await? else {
        return Ok(());
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let room = REFERENCED_BYTES.saturating_sub(referenced.bytes);
    let dir_owned = dir.to_string();
    let parser = tokio::task::spawn_blocking(move || parse(rx, &dir_owned, room));
    let mut failed = None;
    loop {
        match stream.try_next().await {
            Ok(Some(chunk)) => {
                if tx.send(chunk).await.is_err() {
                    break; // the parser is done
                }
            }
            Ok(None) => break,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let parsed = parser
        .await
        .map_err(|e| bucket.other(format!("reading {}: {e}", bucket.url(key))))?;
    if let Some(e) = failed {
        return Err(e);
    }
    match parsed {
        Parsed::Manifest { backup, keys } => {
            if backup != name {
                for k in keys {
                    if !referenced.add(&k, dir) {
                        return Err(too_many(bucket));
                    }
                }
            }
            Ok(())
        }
        Parsed::NotAManifest => Ok(()),
        Parsed::Refused(why) => Err(bucket.other(format!(
            "{} {why}; the backup's data stays",
            bucket.url(key)
        ))),
        Parsed::TooManyReferences => Err(too_many(bucket)),
    }
}

fn too_many(bucket: &Bucket) -> Error {
    bucket.other(format!(
        "other backups' manifests reference more than {} MiB of part folders of this backup, more than the operator keeps while deleting; the backup's data stays",
        REFERENCED_BYTES >> 20
    ))
}

/// What one manifest gave.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// The backup it belongs to and the part folders under the deleted backup's folder it
    /// references (or that reach above it).
    Manifest {
        backup: String,
        keys: Vec<String>,
    },
    /// Not JSON of a shard manifest: it protects nothing.
    NotAManifest,
    /// A bound was passed (the reason).
    Refused(String),
    TooManyReferences,
}

/// What the parse on the blocking thread collects.
struct Collect {
    dir: String,
    room: usize,
    keys: Vec<String>,
    over: bool,
}

thread_local! {
    static COLLECT: std::cell::RefCell<Option<Collect>> = const { std::cell::RefCell::new(None) };
}

/// Parses a manifest from the chunks `rx` brings, keeping the part folders under `dir` (at
/// most `room` bytes of them).
fn parse(rx: tokio::sync::mpsc::Receiver<Bytes>, dir: &str, room: usize) -> Parsed {
    COLLECT.with(|c| {
        *c.borrow_mut() = Some(Collect {
            dir: dir.to_string(),
            room,
            keys: Vec::new(),
            over: false,
        })
    });
    let mut reader = Guarded {
        rx,
        current: Bytes::new(),
        guard: Guard::default(),
    };
    let result = {
        let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(
            8 << 10,
            &mut reader,
        ));
        KeysOnly::deserialize(&mut de).and_then(|m| de.end().map(|()| m))
    };
    let collect = COLLECT.with(|c| c.borrow_mut().take());
    let Some(collect) = collect else {
        return Parsed::NotAManifest;
    };
    if collect.over {
        return Parsed::TooManyReferences;
    }
    if let Some(why) = reader.guard.refused.take() {
        return Parsed::Refused(why);
    }
    match result {
        Ok(m) => Parsed::Manifest {
            backup: m.backup,
            keys: collect.keys,
        },
        Err(_) => Parsed::NotAManifest,
    }
}

/// Of a shard manifest, only its backup and its tables' parts (everything else skipped).
#[derive(Deserialize)]
struct KeysOnly {
    backup: String,
    #[serde(default)]
    #[allow(dead_code)]
    tables: Vec<TableKeys>,
}

#[derive(Deserialize)]
struct TableKeys {
    #[serde(default)]
    #[allow(dead_code)]
    parts: Parts,
}

/// A table's parts, each looked at as it is read and not kept.
#[derive(Default)]
struct Parts;

#[derive(Deserialize)]
struct PartKey {
    key: String,
}

impl<'de> Deserialize<'de> for Parts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Parts, D::Error> {
        struct Each;
        impl<'de> Visitor<'de> for Each {
            type Value = Parts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of parts")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Parts, A::Error> {
                while let Some(p) = seq.next_element::<PartKey>()? {
                    let over = COLLECT.with(|c| {
                        let mut c = c.borrow_mut();
                        let Some(c) = c.as_mut() else {
                            return false;
                        };
                        let folder = format!("{}/", p.key);
                        if folder.starts_with(&c.dir) || c.dir.starts_with(&folder) {
                            let cost = p.key.len() + KEY_OVERHEAD;
                            if cost > c.room {
                                c.over = true;
                                return true;
                            }
                            c.room -= cost;
                            c.keys.push(p.key);
                        }
                        false
                    });
                    if over {
                        return Err(serde::de::Error::custom("too many references"));
                    }
                }
                Ok(Parts)
            }
        }
        d.deserialize_seq(Each)
    }
}

/// A reader of the chunks a channel brings, with a [`Guard`] on what passes.
struct Guarded {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
    guard: Guard,
}

impl Read for Guarded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.current = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        self.guard.pass(&buf[..n])?;
        Ok(n)
    }
}

/// Follows JSON's strings in the bytes that pass and refuses a string, or a run of other bytes
/// that are not punctuation or space (a number, a literal), longer than [`TOKEN_BYTES`]: the
/// parser buffers such a token whole.
#[derive(Debug, Default)]
pub struct Guard {
    in_string: bool,
    escaped: bool,
    run: usize,
    /// Why the bytes were refused.
    pub refused: Option<String>,
}

impl Guard {
    /// Passes `bytes` or refuses them.
    pub fn pass(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        for &b in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    self.run = 0;
                    continue;
                }
                self.run += 1;
            } else if b == b'"' {
                self.in_string = true;
                self.run = 0;
            } else if matches!(b, b',' | b':' | b'[' | b']' | b'{' | b'}')
                || b.is_ascii_whitespace()
            {
                self.run = 0;
            } else {
                self.run += 1;
            }
            if self.run > TOKEN_BYTES {
                let why = format!(
                    "holds a value longer than {} MiB, more than a manifest's",
                    TOKEN_BYTES >> 20
                );
                self.refused = Some(why.clone());
                return Err(std::io::Error::other(why));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str, dir: &str, room: usize) -> Parsed {
        let (tx, rx) = tokio::sync::mpsc::channel(128);
        for chunk in text.as_bytes().chunks((text.len() / 100).max(7)) {
            tx.try_send(Bytes::copy_from_slice(chunk)).unwrap();
        }
        drop(tx);
        parse(rx, dir, room)
    }

    /// Review M-1, decision 70: a manifest read while deleting keeps only the part folders
    /// under the deleted backup's folder (other folders, statements and file lists are
    /// skipped), and the folders it keeps cover the objects in them, as `manifest::deletable`
    /// did.
    #[test]
    fn only_the_folders_under_the_deleted_backup_are_kept() {
        let m = r#"{"format":1,"backup":"b2","shard":0,"replica":"r","serverVersion":"18.16",
            "databases":{"db":"CREATE DATABASE db"},
            "tables":[{"database":"db","name":"t","engine":"MergeTree","create":"CREATE TABLE \"x\" ...",
              "parts":[{"name":"p1","checksum":"c","key":"backups/b1/shard-0/db/t/p1","files":{"a.bin":1}},
                       {"name":"p2","checksum":"c","key":"backups/b2/shard-0/db/t/p2","files":{}},
                       {"name":"p3","checksum":"c","key":"backups/b10/shard-0/db/t/p3","files":{}}]}]}"#;
        let got = parse_text(m, "backups/b1/", REFERENCED_BYTES);
        assert_eq!(
            got,
            Parsed::Manifest {
                backup: "b2".into(),
                keys: vec!["backups/b1/shard-0/db/t/p1".into()]
            }
        );
        let Parsed::Manifest { keys, .. } = got else {
            unreachable!()
        };
        let mut r = Referenced::default();
        for k in &keys {
            assert!(r.add(k, "backups/b1/"));
        }
        assert!(r.covers("backups/b1/shard-0/db/t/p1/a.bin"));
        assert!(!r.covers("backups/b1/shard-0/db/t/p10/a.bin"));
        assert!(!r.covers("backups/b1/manifest.json"));
        // a folder above the backup's keeps all of it
        let mut r = Referenced::default();
        assert!(r.add("backups", "backups/b1/"));
        assert!(r.covers("backups/b1/manifest.json"));
        // not a manifest: protects nothing
        assert_eq!(
            parse_text("not json", "backups/b1/", 100),
            Parsed::NotAManifest
        );
        assert_eq!(
            parse_text(r#"{"tables":[]}"#, "backups/b1/", 100),
            Parsed::NotAManifest
        );
    }

    /// Review M-1: the bounds of a manifest read while deleting: a string longer than
    /// [`TOKEN_BYTES`] and more referenced folders than the room left are refused.
    #[test]
    fn long_values_and_too_many_references_are_refused() {
        let long = format!(
            r#"{{"backup":"b2","tables":[{{"create":"{}"}}]}}"#,
            "x".repeat(TOKEN_BYTES + 1)
        );
        let got = parse_text(&long, "backups/b1/", 100);
        assert!(
            matches!(&got, Parsed::Refused(why) if why.contains("longer than 4 MiB")),
            "{got:?}"
        );
        // escaped quotes do not end a string
        let mut g = Guard::default();
        let escaped = format!("\"{}", "\\\"".repeat(TOKEN_BYTES));
        assert!(g.pass(escaped.as_bytes()).is_err());
        let number = "1".repeat(TOKEN_BYTES + 1);
        assert!(Guard::default().pass(number.as_bytes()).is_err());
        assert!(
            Guard::default()
                .pass(b"[\"a\", 1, true, {\"k\": null}]")
                .is_ok()
        );
        let many = r#"{"backup":"b2","tables":[{"parts":[{"key":"backups/b1/a"},{"key":"backups/b1/b"}]}]}"#;
        assert_eq!(
            parse_text(many, "backups/b1/", 2 * (12 + KEY_OVERHEAD) - 1),
            Parsed::TooManyReferences
        );
    }
}
