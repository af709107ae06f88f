//! The backup and restore throughput benchmark (`hack/bench.sh backup`).

use super::*;

/// Empties the page cache (as root), so that each measurement reads from the disk; says whether
/// it could.
fn drop_page_cache() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Benchmark (docs/internals.md, "Benchmarks"), not a test: backup and restore throughput of a
/// table of at least 1 GiB on disk (random 64-bit columns, which do not compress), beside a plain
/// copy of the same parts on the same disk and to and from the same S3 server by another client
/// (curl, SigV4, four files at a time). The backup and restore times include the operator's passes
/// and the agent Jobs' start. Run it with `hack/bench.sh backup`.
#[tokio::test]
#[ignore = "a benchmark: hack/bench.sh backup"]
async fn benchmark_backup_and_restore_throughput() {
    let gib: f64 = std::env::var("BENCH_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let (server, client, ns, op) = setup("bench", &[]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "20Gi"},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let replica = ready
        .status
        .unwrap()
        .replica_state_map
        .keys()
        .next()
        .unwrap()
        .clone();
    let ch = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
    exec(&ch, "CREATE TABLE default.big (id UInt64, a UInt64, b UInt64, c UInt64, d UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/big', '{replica}') ORDER BY id").await;
    // 40 bytes a row, of which only the sorted ids compress (to about 36 bytes on disk)
    let rows = (gib * 1024.0 * 1024.0 * 1024.0 / 36.0) as u64 + 1_000_000;
    let loaded = std::time::Instant::now();
    let step = 5_000_000;
    let mut first = 0;
    while first < rows {
        exec(&ch, &format!("INSERT INTO default.big SELECT {first} + number, rand64(), rand64(1), rand64(2), rand64(3) FROM system.numbers LIMIT {}", step.min(rows - first))).await;
        first += step;
    }
    // the same parts for every copy below: no merge from here on
    exec(&ch, "SYSTEM STOP MERGES default.big").await;
    wait_for(
        Duration::from_secs(300),
        "merges of default.big to end",
        || {
            let ch = ch.clone();
            async move {
                let running = ch
                    .query(
                        "SELECT count() AS v FROM system.merges WHERE table = 'big'",
                        &QueryOptions::new(),
                    )
                    .await
                    .ok()?;
                (running.iter().next()?.str("v").ok()? == "0").then_some(())
            }
        },
    )
    .await;
    let active: Vec<String> = query(&ch, "SELECT name AS v FROM system.parts WHERE database = 'default' AND table = 'big' AND active ORDER BY name").await;
    let bytes: u64 = query(&ch, "SELECT sum(bytes_on_disk) AS v FROM system.parts WHERE database = 'default' AND table = 'big' AND active").await[0].parse().unwrap();
    let parts = query(&ch, "SELECT count() AS v FROM system.parts WHERE database = 'default' AND table = 'big' AND active").await[0].clone();
    println!(
        "loaded {rows} rows, {:.2} GiB in {parts} parts, in {:.1?}",
        bytes as f64 / (1u64 << 30) as f64,
        loaded.elapsed()
    );
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);

    // a plain copy of the same parts on the same disk
    let volume = volume_path(
        &client,
        &ns,
        &clickhouse_operator::model::names::data_pvc(&replica),
    )
    .await;
    let table_dir = volume.join("data/default/big");
    let copy_to = volume.join("bench-copy");
    let cold = drop_page_cache();
    std::fs::create_dir_all(&copy_to).unwrap();
    let t = std::time::Instant::now();
    let ok = Command::new("cp")
        .arg("-r")
        .args(active.iter().map(|p| table_dir.join(p)))
        .arg(&copy_to)
        .status()
        .unwrap()
        .success();
    let copy_secs = t.elapsed().as_secs_f64();
    assert!(ok, "cp -r {}", table_dir.display());
    let _ = std::fs::remove_dir_all(&copy_to);

    // a plain copy of the same parts to the same S3 server and back, by another client: curl
    // signing each request itself (SigV4), four files at a time, as the agent moves them
    let files: Vec<String> = walk(&table_dir)
        .into_iter()
        .filter(|f| table_dir.join(f).is_file())
        .filter(|f| active.iter().any(|p| f.starts_with(&format!("{p}/"))))
        .collect();
    let curl = |upload: bool| {
        let list = files.join("\n");
        let script = if upload {
            format!(
                "cd {dir} && xargs -P 4 -I{{}} curl -sf --aws-sigv4 aws:amz:us-east-1:s3 --user {ACCESS}:{SECRET} -T {{}} http://127.0.0.1:{S3_PORT}/{BUCKET}/plain-copy/{{}}",
                dir = table_dir.display()
            )
        } else {
            format!(
                "mkdir -p {dir} && cd {dir} && xargs -P 4 -I{{}} curl -sf --create-dirs --aws-sigv4 aws:amz:us-east-1:s3 --user {ACCESS}:{SECRET} -o {{}} http://127.0.0.1:{S3_PORT}/{BUCKET}/plain-copy/{{}}",
                dir = copy_to.display()
            )
        };
        let mut child = Command::new("bash")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(list.as_bytes())
            .unwrap();
        assert!(
            child.wait().unwrap().success(),
            "curl {}",
            if upload { "upload" } else { "download" }
        );
    };
    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    curl(true);
    let plain_up_secs = t.elapsed().as_secs_f64();
    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    curl(false);
    let plain_down_secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&copy_to);

    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    start_backup(&client, &ns, "big", json!({"clusterName": "c1"})).await;
    let b = wait_backup_done(&client, &ns, "big").await.status.unwrap();
    let backup_secs = t.elapsed().as_secs_f64();
    assert_eq!(b.state, BackupState::Succeeded, "{:?}", b.message);

    exec(&ch, "DROP TABLE default.big").await;
    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    start_restore(
        &client,
        &ns,
        "big",
        json!({"clusterName": "c1", "backupName": "big"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "big").await.status.unwrap();
    let restore_secs = t.elapsed().as_secs_f64();
    assert_eq!(r.state, RestoreState::Succeeded, "{:?}", r.message);
    let back = query(&ch, "SELECT count() AS v FROM default.big").await[0].clone();
    assert_eq!(back, rows.to_string(), "every row restored");

    println!();
    println!(
        "backup benchmark: {:.0} MiB in {parts} parts, page cache dropped before each: {cold}",
        mib(bytes)
    );
    let row = |what: &str, secs: f64, bytes: u64| {
        println!("{what:<44} {secs:>8.1} {:>10.1}", mib(bytes) / secs)
    };
    println!("{:<44} {:>8} {:>10}", "", "seconds", "MiB/s");
    row("plain copy (cp -r, same disk)", copy_secs, bytes);
    row(
        "plain upload to the same S3 (curl, 4 at once)",
        plain_up_secs,
        bytes,
    );
    row(
        "backup (to S3, object created → Succeeded)",
        backup_secs,
        b.bytes_uploaded,
    );
    row(
        "plain download from the same S3 (curl, 4)",
        plain_down_secs,
        bytes,
    );
    row(
        "restore (from S3, → Succeeded)",
        restore_secs,
        r.bytes_downloaded,
    );
    println!(
        "backup/plain upload time ratio {:.2}, restore/plain download time ratio {:.2}",
        backup_secs / plain_up_secs,
        restore_secs / plain_down_secs
    );
    finish(&client, &ns, op).await;
}
