//! Review M-1, decisions 69 and 70: the operator reads what a cluster's editor
//! controls (the server at a pod's address is their `spec.image`, a backup's bucket their
//! `spec.backup.destination`, an external Keeper their `keeper.external.nodes`) within bounds
//! of size and time. Each test starts a hostile server on an ephemeral local port in this
//! process (a stand-in: no real ClickHouse, S3 store or Keeper misbehaves on request), calls
//! the operator's own client code against it, and checks that the call fails cleanly with an
//! error that says why, within a time budget, and that the memory the process allocated at
//! once (counted by this binary's global allocator) stays within the stated bound.
//!
//! Run: `cargo test --test hostile` (about 20 s in a debug build).

#[path = "hostile/alloc.rs"]
mod alloc;
#[path = "hostile/servers.rs"]
mod servers;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloc::{MIB, ONE_AT_A_TIME, peak_since, start};
use clickhouse_operator::backup::removal;
use clickhouse_operator::backup::store::{Bucket, Patience};
use clickhouse_operator::clickhouse::client::{
    ANSWER_BUDGET_BYTES, MAX_ANSWER_BYTES, answer_budget_free,
};
use clickhouse_operator::clickhouse::keeper::{Error as KeeperError, Session};
use clickhouse_operator::clickhouse::{
    Client, ClientConfig, Credentials, Endpoint, Error, QueryOptions,
};
use servers::{ClickHouseAnswer, KeeperAnswer, Object, S3State};

#[global_allocator]
static COUNTING: alloc::Counting = alloc::Counting;

fn client(addr: std::net::SocketAddr, timeout: Duration) -> Client {
    let mut config = ClientConfig::new(
        Endpoint {
            host: addr.ip().to_string(),
            port: addr.port(),
        },
        Credentials {
            user: "clickhouse_operator".into(),
            password: "pw".into(),
        },
    );
    config.timeout = timeout;
    Client::new(config).unwrap()
}

async fn lock() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}

/// M-1: a "ClickHouse server" that streams an answer without end (256 MiB, then it closes),
/// or announces a GiB, is read up to the operator's 16 MiB per answer and no further: the call
/// fails with `TooLarge` naming the limit within 10 s, the process holds at most 40 MiB more
/// at once while it runs, and its share of the answer budget is given back. Before the bound,
/// `text()` read the whole 256 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_without_end_is_cut_off_at_the_answer_limit() {
    let _one = lock().await;
    for answer in [
        ClickHouseAnswer::Endless { total: 256 * MIB },
        ClickHouseAnswer::Declared,
    ] {
        let (addr, sent) = servers::clickhouse(answer).await;
        let c = client(addr, Duration::from_secs(20));
        let base = start();
        let started = Instant::now();
        let got = c.query("SELECT 1", &QueryOptions::new()).await;
        let took = started.elapsed();
        let peak = peak_since(base);
        let e = got.expect_err("a hostile answer must fail");
        assert!(matches!(e, Error::TooLarge { .. }), "{e}");
        let said = e.to_string();
        assert!(
            said.contains(&format!("larger than {} KiB", MAX_ANSWER_BYTES >> 10)),
            "{said}"
        );
        assert!(took < Duration::from_secs(10), "took {took:?}");
        assert!(peak < 40 * MIB, "held {} MiB at once", peak / MIB);
        assert_eq!(answer_budget_free(), ANSWER_BUDGET_BYTES);
        eprintln!(
            "answer cut off after {took:?}: {} MiB held at most, {} MiB sent by the server",
            peak / MIB,
            sent.load(std::sync::atomic::Ordering::Relaxed) / MIB
        );
    }
}

/// M-1: eight such servers asked at once (one pass asks every server of a cluster together)
/// are read within the process's 64 MiB answer budget: every call fails with `TooLarge` or
/// `Busy`, within 15 s, and the process holds at most the budget and 16 MiB more at once.
/// Without the budget eight answers of 16 MiB each were held together (128 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_hostile_servers_at_once_stay_within_the_answer_budget() {
    let _one = lock().await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (addr, _) = servers::clickhouse(ClickHouseAnswer::Endless { total: 64 * MIB }).await;
        clients.push(client(addr, Duration::from_secs(8)));
    }
    let options = QueryOptions::new();
    let base = start();
    let started = Instant::now();
    let results =
        futures::future::join_all(clients.iter().map(|c| c.query("SELECT 1", &options))).await;
    let took = started.elapsed();
    let peak = peak_since(base);
    for r in &results {
        let e = r.as_ref().expect_err("a hostile answer must fail");
        assert!(
            matches!(e, Error::TooLarge { .. } | Error::Busy { .. }),
            "{e}"
        );
    }
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(
        peak < ANSWER_BUDGET_BYTES + 16 * MIB,
        "held {} MiB at once",
        peak / MIB
    );
    assert_eq!(answer_budget_free(), ANSWER_BUDGET_BYTES);
    eprintln!(
        "8 hostile servers: {} MiB held at most, {took:?}",
        peak / MIB
    );
}

/// M-1: an answer under the byte limit made of one-digit values (12 MiB of `[0],`, some 6
/// million JSON values, which parsed would take some 400 MiB) is refused before it is parsed,
/// naming the budget, and the process holds at most 40 MiB more at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_would_swell_when_parsed_is_refused_before_parsing() {
    let _one = lock().await;
    let (addr, _) = servers::clickhouse(ClickHouseAnswer::TinyValues { bytes: 12 * MIB }).await;
    let c = client(addr, Duration::from_secs(20));
    let base = start();
    let e = c
        .query("SELECT 1", &QueryOptions::new())
        .await
        .expect_err("must be refused");
    let peak = peak_since(base);
    let said = e.to_string();
    assert!(
        said.contains("more than the 64 MiB for answers can hold parsed"),
        "{said}"
    );
    assert!(peak < 40 * MIB, "held {} MiB at once", peak / MIB);
    assert_eq!(answer_budget_free(), ANSWER_BUDGET_BYTES);
}

/// M-1: a Keeper peer (`keeper.external.nodes`) announcing 2^31 - 1 ACL entries or children in
/// a reply of 48 bytes is a protocol error naming the count, within a second, allocating
/// under 1 MiB; before, the client asked for `Vec::with_capacity(2^31 - 1)` entries (about
/// 120 GB for an ACL) and the process aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_peer_announcing_2_31_entries_is_refused_without_allocating_them() {
    let _one = lock().await;
    for children in [false, true] {
        let addr = servers::keeper(KeeperAnswer::Count(i32::MAX)).await;
        let mut s = Session::connect(addr, Duration::from_secs(5))
            .await
            .unwrap();
        let base = start();
        let started = Instant::now();
        let e = if children {
            s.children("/clickhouse").await.map(drop)
        } else {
            s.acl("/clickhouse").await.map(drop)
        }
        .expect_err("must be refused");
        let peak = peak_since(base);
        assert!(matches!(e, KeeperError::Protocol(..)), "{e}");
        assert!(e.to_string().contains("2147483647 items announced"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(peak < MIB, "allocated {peak} bytes at once");
    }
}

/// M-1: a Keeper peer that announces a packet of 16 MiB and sends nothing more costs no
/// buffer of that size (the reply grows as bytes arrive): the call times out with a clear error
/// holding under 1 MiB; before, 16 MiB were allocated at the announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_peer_announcing_a_large_packet_and_stalling_costs_nothing() {
    let _one = lock().await;
    let addr = servers::keeper(KeeperAnswer::Announce16MiB).await;
    let mut s = Session::connect(addr, Duration::from_secs(2))
        .await
        .unwrap();
    let base = start();
    let e = s.children("/").await.expect_err("must time out");
    let peak = peak_since(base);
    assert!(matches!(e, KeeperError::Timeout { .. }), "{e}");
    assert!(peak < MIB, "allocated {peak} bytes at once");
}

fn bucket(addr: std::net::SocketAddr) -> Bucket {
    let d: clickhouse_operator::api::S3Destination = serde_json::from_value(serde_json::json!({
        "endpoint": format!("http://{addr}"),
        "bucket": "b",
        "prefix": "pfx",
        "secretName": "s3",
        "insecure": true,
    }))
    .unwrap();
    Bucket::open(
        &d,
        "AKIAEXAMPLE",
        "secret-key-example",
        "unused",
        Patience::Quick,
    )
    .unwrap()
}

/// The objects of backup `b1` (one part kept by `b2`, one not), and `b2`'s shard manifest.
fn backups(other: Object) -> S3State {
    let mut s = S3State::default();
    for k in [
        "backups/b1/manifest.json",
        "backups/b1/shard-0.json",
        "backups/b1/shard-0/db/t/p1/data.bin",
        "backups/b1/shard-0/db/t/p2/data.bin",
        "backups/b2/manifest.json",
    ] {
        s.objects
            .insert(format!("pfx/{k}"), Object::Bytes(b"{}".to_vec()));
    }
    s.objects
        .insert("pfx/backups/b2/shard-0.json".into(), other);
    s
}

/// M-1 (decision 70): deleting backup `b1` against an S3-like server keeps the part another
/// backup's manifest references and deletes the rest, its manifest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_backup_keeps_what_other_backups_reference() {
    let _one = lock().await;
    let manifest = serde_json::json!({
        "format": 1, "backup": "b2", "shard": 0, "replica": "r", "serverVersion": "18.16",
        "databases": {"db": "CREATE DATABASE db"},
        "tables": [{"database": "db", "name": "t", "engine": "MergeTree", "create": "CREATE TABLE db.t",
            "parts": [{"name": "p1", "checksum": "c", "key": "backups/b1/shard-0/db/t/p1", "files": {"data.bin": 2}}]}]
    });
    let state = Arc::new(Mutex::new(backups(Object::Bytes(
        serde_json::to_vec(&manifest).unwrap(),
    ))));
    let addr = servers::s3(state.clone(), "b").await;
    let done = removal::remove(&bucket(addr), "b1", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((done.gone, done.kept), (3, 1));
    let deleted = state.lock().unwrap().deleted.clone();
    assert_eq!(
        deleted,
        [
            "pfx/backups/b1/manifest.json",
            "pfx/backups/b1/shard-0.json",
            "pfx/backups/b1/shard-0/db/t/p2/data.bin"
        ]
    );
}

/// M-1 (decision 70): another backup's shard manifest of 200 MiB that references ever more
/// part folders of the deleted backup, one that is a single 200 MiB string, and one that says
/// it holds a GiB each fail the deletion with the reason (the Event's text) and delete nothing,
/// each within 60 s, the process holding at most 48 MiB more at once (the referenced folders
/// kept, 16 MiB, and their set). Before, every manifest was read whole into memory (200 MiB)
/// and parsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_backup_reads_hostile_manifests_within_bounds() {
    let _one = lock().await;
    let endless_parts = Object::Generated {
        declared: 200 * MIB,
        prefix: r#"{"backup":"b2","tables":[{"parts":["#.into(),
        item: Arc::new(|i| format!(r#"{{"key":"backups/b1/shard-0/db/t/p{i}","files":{{}}}},"#)),
    };
    let one_string = Object::Generated {
        declared: 200 * MIB,
        prefix: r#"{"backup":"b2","tables":[{"create":""#.into(),
        item: Arc::new(|_| "x".repeat(1024)),
    };
    let declared = Object::Generated {
        declared: 1 << 30,
        prefix: String::new(),
        item: Arc::new(|_| " ".repeat(1024)),
    };
    for (other, reason) in [
        (endless_parts, "more than 16 MiB of part folders"),
        (one_string, "holds a value longer than 4 MiB"),
        (declared, "more than the 268435456 expected"),
    ] {
        let state = Arc::new(Mutex::new(backups(other)));
        let addr = servers::s3(state.clone(), "b").await;
        let b = bucket(addr);
        let base = start();
        let started = Instant::now();
        let e = removal::remove(&b, "b1", Duration::from_secs(120))
            .await
            .expect_err("must fail");
        let took = started.elapsed();
        let peak = peak_since(base);
        assert!(e.to_string().contains(reason), "{e}");
        assert!(
            !e.to_string().contains("secret-key-example"),
            "the key leaked: {e}"
        );
        let s = state.lock().unwrap();
        assert!(s.deleted.is_empty(), "deleted {:?}", s.deleted);
        assert!(took < Duration::from_secs(60), "took {took:?}");
        assert!(peak < 48 * MIB, "held {} MiB at once", peak / MIB);
        eprintln!(
            "{reason}: {took:?}, {} MiB held at most, {} MiB sent by the bucket",
            peak / MIB,
            s.sent / MIB
        );
    }
}

/// M-1: a bucket that stops sending in the middle of a manifest fails the removal at its
/// deadline with the reason, nothing deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_ends_by_its_deadline() {
    let _one = lock().await;
    let state = Arc::new(Mutex::new(backups(Object::Stall)));
    let addr = servers::s3(state.clone(), "b").await;
    let started = Instant::now();
    let e = removal::remove(&bucket(addr), "b1", Duration::from_secs(1))
        .await
        .expect_err("must end by its deadline");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("took longer than 1 s"), "{e}");
    assert!(state.lock().unwrap().deleted.is_empty());
}
