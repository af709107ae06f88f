//! Backups: the destinations' named collections, with keys or with `webIdentity`, named by the
//! agents' statements.

use clickhouse_operator::model::names;

use crate::support::{build, c1, lay_out, run, run_with_env, secret_file, write};

/// Decision 35: on a server that reads named collections for `BACKUP`, the operator keeps
/// each backup destination's bucket and keys in a named collection of the file the servers
/// reload, and the agent's statements name the collection and a folder in it: no key is in any
/// statement. The 26.x engine loads the file, and as the operator's account (its grants) a
/// `BACKUP … TO S3(<collection>, …)` and a `RESTORE … FROM` it are accepted and go to the
/// collection's bucket (here on a port nothing listens on, so they fail there with "connection
/// refused", and the error names neither key); a collection the file does not have is refused
/// by name. Without the grant `NAMED COLLECTION ON <collection>` the engine refuses the
/// statement (seen here first): the operator's account gets it for each collection, and a user
/// with the users file's default privileges can neither use nor list it.
#[test]
fn backups_name_the_destinations_named_collection_and_carry_no_key() {
    use clickhouse_operator::clickhouse::backup as chbackup;
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = clickhouse_operator::api::S3Destination {
        endpoint: "http://127.0.0.1:1".into(),
        bucket: "backups".into(),
        secret_name: "s3-creds".into(),
        ..Default::default()
    };
    let name = clickhouse_operator::model::S3Collection::name_of(&d);
    i.backup_collections = vec![clickhouse_operator::model::S3Collection {
        name: name.clone(),
        url: clickhouse_operator::model::S3Collection::url_of(&d),
        auth: clickhouse_operator::model::S3Auth::Keys {
            access_key_id: "AKIDCOLLECTION".into(),
            secret_access_key: "SECRETCOLLECTIONKEY".into(),
        },
    }];
    let built = build(&c, &i);
    let users = secret_file(&built, names::USERS_FILE);
    let operator = &users[users.find("<clickhouse_operator").unwrap()..];
    let grants = &operator[operator.find("<grants>").unwrap()
        ..operator.find("</grants>").unwrap() + "</grants>".len()];
    let layout = lay_out("collections", &built, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!("<clickhouse><users><default>{grants}</default></users></clickhouse>"),
    );
    let dbs = vec!["src".to_string()];
    let target = chbackup::s3_collection_target(&name, "t1/c1/backups/b1/shard-0/");
    let backup = chbackup::backup_sql(&dbs, &target, None).replace(" ASYNC", "");
    let restore = chbackup::restore_sql(&dbs, &target, false).replace(" ASYNC", "");
    let missing = chbackup::backup_sql(
        &dbs,
        &chbackup::s3_collection_target("chop_s3_ffffffffffffffff", "x/"),
        None,
    )
    .replace(" ASYNC", "");
    for q in [&backup, &restore, &missing] {
        assert!(
            !q.contains("AKIDCOLLECTION") && !q.contains("SECRETCOLLECTIONKEY"),
            "{q}"
        );
    }
    let queries = [
        "CREATE DATABASE src",
        "CREATE TABLE src.t (x UInt8) ENGINE = MergeTree ORDER BY x",
        "INSERT INTO src.t VALUES (1)",
        // nothing listens on port 1: fail at once instead of retrying for minutes
        "SET s3_retry_attempts = 0",
        "SET backup_restore_s3_retry_attempts = 0",
        backup.as_str(),
        restore.as_str(),
        missing.as_str(),
    ];
    let r = run(&layout, &queries);
    r.loaded();
    for (q, result) in queries.iter().zip(&r.results).take(5) {
        assert!(result.is_ok(), "{q}: {result:?}");
    }
    for n in [5, 6] {
        let e = r.results[n]
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{} reached a server on port 1?", queries[n]));
        println!(
            "{}\n  -> {}",
            queries[n],
            e.chars().take(400).collect::<String>()
        );
        assert!(
            !e.contains("ACCESS_DENIED") && !e.contains("Code: 497"),
            "{e}"
        );
        assert!(
            !e.to_lowercase().contains("collection"),
            "the collection is known: {e}"
        );
        assert!(
            e.contains("bucket backups")
                && e.contains("t1/c1/backups/b1/shard-0/")
                && e.contains("Connection refused"),
            "it went to the collection's bucket, in the folder named: {e}"
        );
        assert!(
            !e.contains("SECRETCOLLECTIONKEY") && !e.contains("AKIDCOLLECTION"),
            "{e}"
        );
    }
    let e = r.results[7]
        .as_ref()
        .expect_err("an unknown collection is refused");
    println!("{missing}\n  -> {e}");
    assert!(e.contains("chop_s3_ffffffffffffffff"), "{e}");
    // a user of the users file with the default privileges (no grants, even with access
    // management) can neither use nor list the collection: its keys serve the backups only
    let plain = lay_out("collections-plain", &built, "c1-1-3", "");
    let probe = format!(
        "SELECT count() FROM s3({name}, filename = 'x.csv', format = 'CSV', structure = 'x UInt8')"
    );
    let p = run(
        &plain,
        &[
            "SET s3_retry_attempts = 0",
            probe.as_str(),
            "SELECT count() FROM system.named_collections",
        ],
    );
    p.loaded();
    let denied = p.results[1]
        .as_ref()
        .expect_err("a plain user may not use the collection");
    assert!(
        denied.contains("ACCESS_DENIED") && denied.contains(&name),
        "{denied}"
    );
    assert_eq!(p.results[2], Ok(vec![vec![Some("0".to_string())]]));
    // the agent waits for a collection the server has not loaded yet by this text
    // (`backup::agent::collection_unknown`)
    assert!(
        e.to_lowercase().contains("no named collection")
            || e.to_lowercase().contains("no collection named"),
        "{e}"
    );
}

/// Decision 43: a destination with `webIdentity` becomes a named collection with
/// `use_environment_credentials` and no key, which the 26.x engine loads; as the operator's
/// account a `BACKUP … TO S3(<collection>, …)` is accepted and goes to the collection's bucket
/// (nothing listens there: "connection refused"), with the credentials of the server's own
/// environment. That the server's S3 client then exchanges the pod's token with STS is
/// ClickHouse's (`AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`), not exercised here: chDB has no
/// STS to ask.
#[test]
fn a_web_identity_destination_is_a_keyless_collection_backups_can_name() {
    use clickhouse_operator::clickhouse::backup as chbackup;
    let web = serde_json::json!({"endpoint": "http://127.0.0.1:1", "insecure": true,
        "bucket": "backups",
        "webIdentity": {"roleArn": "arn:aws:iam::123456789012:role/backups",
                        "serviceAccountName": "ch-backups"}});
    let (c, mut i) = c1(serde_json::json!({"backup": {"destination": web}}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    i.backup_collections =
        clickhouse_operator::plan::backup::destination::collections(&c, |_| None);
    assert_eq!(i.backup_collections.len(), 1);
    let name = i.backup_collections[0].name.clone();
    let built = build(&c, &i);
    let remote = secret_file(&built, names::REMOTE_SERVERS_FILE);
    assert!(
        remote.contains("<use_environment_credentials>1</use_environment_credentials>")
            && !remote.contains("access_key_id"),
        "{remote}"
    );
    let users = secret_file(&built, names::USERS_FILE);
    let operator = &users[users.find("<clickhouse_operator").unwrap()..];
    let grants = &operator[operator.find("<grants>").unwrap()
        ..operator.find("</grants>").unwrap() + "</grants>".len()];
    let layout = lay_out("web-identity", &built, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!("<clickhouse><users><default>{grants}</default></users></clickhouse>"),
    );
    let target = chbackup::s3_collection_target(&name, "t1/c1/backups/b1/shard-0/");
    let backup = chbackup::backup_sql(&["src".to_string()], &target, None).replace(" ASYNC", "");
    let queries = [
        "CREATE DATABASE src",
        "CREATE TABLE src.t (x UInt8) ENGINE = MergeTree ORDER BY x",
        "INSERT INTO src.t VALUES (1)",
        "SET s3_retry_attempts = 0",
        "SET backup_restore_s3_retry_attempts = 0",
        backup.as_str(),
    ];
    // no instance metadata to ask on this machine: the environment chain ends at once
    let r = run_with_env(&layout, &queries, &[("AWS_EC2_METADATA_DISABLED", "true")]);
    r.loaded();
    for (q, result) in queries.iter().zip(&r.results).take(5) {
        assert!(result.is_ok(), "{q}: {result:?}");
    }
    let e = r.results[5]
        .as_ref()
        .expect_err("nothing listens on port 1");
    println!("{backup}\n  -> {}", e.chars().take(400).collect::<String>());
    assert!(
        !e.to_lowercase().contains("collection"),
        "the collection is known: {e}"
    );
    assert!(
        e.contains("bucket backups")
            && e.contains("t1/c1/backups/b1/shard-0/")
            && e.contains("Connection refused"),
        "it went to the collection's bucket, in the folder named: {e}"
    );
}
