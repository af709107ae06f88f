//! Review M-1, decision 69: the metrics exporter reads the servers of every cluster
//! it scrapes within bounds: at most `exporter::MAX_ANSWER_BYTES` of one answer, all answers
//! at once within its `exporter::ANSWER_BUDGET_BYTES`, at most `MAX_SERIES_PER_HOST` series of
//! one server. Hostile "servers" run on ephemeral local ports in this process (stand-ins: no
//! real ClickHouse misbehaves on request); the scrape is the exporter's own
//! (`scrape_targets_by`), the memory counted by this binary's global allocator. A binary of its
//! own because the answer budget is the process's, and the exporter's is not the operator's.
//!
//! Run: `cargo test --test hostile_exporter` (about 10 s in a debug build).

#[path = "hostile/alloc.rs"]
mod alloc;
#[path = "hostile/servers.rs"]
mod servers;

use std::time::{Duration, Instant};

use alloc::{MIB, ONE_AT_A_TIME, peak_since, start};
use clickhouse_operator::clickhouse::client::{answer_budget_free, set_answer_budget};
use clickhouse_operator::clickhouse::{ClientConfig, Credentials, Endpoint};
use clickhouse_operator::exporter::{self, Host, Naming, Target};
use servers::ClickHouseAnswer;

#[global_allocator]
static COUNTING: alloc::Counting = alloc::Counting;

/// `n` servers answering `answer`, named `c-r<i>-0` from `first` on.
async fn targets(first: usize, n: usize, answer: ClickHouseAnswer) -> Vec<Target> {
    let mut out = Vec::new();
    for i in first..first + n {
        let (addr, _) = servers::clickhouse(answer).await;
        let config = exporter::host_config(ClientConfig::new(
            Endpoint {
                host: addr.ip().to_string(),
                port: addr.port(),
            },
            Credentials {
                user: "clickhouse_exporter".into(),
                password: "pw".into(),
            },
        ));
        out.push(Target::Server {
            host: Host {
                namespace: "tenant".into(),
                cluster: "c".into(),
                shard: "0".into(),
                replica: format!("r{i}"),
                pod: format!("c-r{i}-0"),
            },
            config: Some(config),
        });
    }
    out
}

async fn setup() -> tokio::sync::MutexGuard<'static, ()> {
    set_answer_budget(exporter::ANSWER_BUDGET_BYTES);
    ONE_AT_A_TIME.lock().await
}

/// M-1: sixteen servers of one tenant streaming answers without end (the exporter asks 16
/// hosts at once) are each reported down (`clickhouse_up 0`), the scrape ends within its 15 s
/// deadline, and the exporter's process holds at most its 32 MiB answer budget and 16 MiB
/// more at once (its pod's limit is 128 Mi). Before, each answer was read whole for the
/// host's 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_of_servers_answering_without_end_stays_within_the_exporters_budget() {
    let _one = setup().await;
    let t = targets(0, 16, ClickHouseAnswer::Endless { total: 256 * MIB }).await;
    let naming = Naming::parse(None, None).unwrap();
    let base = start();
    let started = Instant::now();
    let text = exporter::scrape_targets_by(
        t,
        naming,
        tokio::time::Instant::now() + exporter::SCRAPE_DEADLINE,
    )
    .await;
    let took = started.elapsed();
    let peak = peak_since(base);
    for i in 0..16 {
        assert!(
            text.lines().any(|l| l.starts_with("clickhouse_up{")
                && l.contains(&format!("pod=\"c-r{i}-0\""))
                && l.ends_with(" 0")),
            "c-r{i}-0 not reported down:\n{text}"
        );
    }
    assert!(took < Duration::from_secs(16), "took {took:?}");
    assert!(
        peak < exporter::ANSWER_BUDGET_BYTES + 16 * MIB,
        "held {} MiB at once",
        peak / MIB
    );
    assert_eq!(answer_budget_free(), exporter::ANSWER_BUDGET_BYTES);
    eprintln!(
        "16 endless servers: {took:?}, {} MiB held at most",
        peak / MIB
    );
}

/// M-1: a server whose answers give 25,000 series (each a table, or a metric, of its own) is
/// reported down with none of its series in the answer, the other host's series kept; the
/// scrape's answer stays small. Before, every series was kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_too_many_series_is_reported_down() {
    let _one = setup().await;
    let mut t = targets(0, 1, ClickHouseAnswer::ManyTables { rows: 25_000 }).await;
    t.extend(targets(1, 1, ClickHouseAnswer::ManyTables { rows: 10 }).await);
    let naming = Naming::parse(None, None).unwrap();
    let text = exporter::scrape_targets_by(
        t,
        naming,
        tokio::time::Instant::now() + exporter::SCRAPE_DEADLINE,
    )
    .await;
    let up = |pod: &str| {
        text.lines()
            .find(|l| l.starts_with("clickhouse_up{") && l.contains(&format!("pod=\"{pod}\"")))
            .map(|l| l.ends_with(" 1"))
    };
    assert_eq!(
        up("c-r0-0"),
        Some(false),
        "{}",
        &text[..text.len().min(2000)]
    );
    assert_eq!(
        up("c-r1-0"),
        Some(true),
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(text.contains("pod=\"c-r1-0\",database=\"db\",table=\"t9\""));
    assert!(
        !text.contains("m24999"),
        "the flooding host's series are kept"
    );
    assert!(
        text.lines().count() < exporter::MAX_SERIES_PER_HOST,
        "{} lines",
        text.lines().count()
    );
    let _ = MIB;
}
