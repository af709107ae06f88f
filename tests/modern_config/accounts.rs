//! The accounts and their rights: the cluster secret and the operator's grants, the exporter's
//! account, users given by their hashes, users managed with SQL.

use clickhouse_operator::model::{Password, names};

use crate::support::{C1_HOSTS, build, c1, lay_out, run, secret_file, write};

/// Decision 33: for servers that report 20.10 or later the cluster carries its `<secret>` and no
/// replica names an account; the 26.x engine loads it and lists the cluster with every pod
/// (the account column then shows `default`: remote shards run a query as its initiator).
/// With 23.6 or later the operator's account has its grants (`SHOW GRANTS`), nothing else
/// changes for the other accounts.
#[test]
fn a_cluster_secret_and_the_operators_grants_load() {
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("24.8.4.13".parse().unwrap());
    let d = build(&c, &i);
    let remote = secret_file(&d, names::REMOTE_SERVERS_FILE);
    assert!(
        remote.contains("<secret hide_in_preprocessed=\"true\">c1uster-secret</secret>"),
        "{remote}"
    );
    assert!(!remote.contains("c1uster-pw"), "{remote}");
    let layout = lay_out("secret", &d, "c1-1-3", "");
    let r = run(
        &layout,
        &[
            "SELECT cluster, shard_num, replica_num, host_name, user FROM system.clusters \
             ORDER BY cluster, shard_num, replica_num",
            "SHOW GRANTS FOR clickhouse_operator",
            "SHOW GRANTS FOR alice",
        ],
    );
    let mut want = Vec::new();
    for (s, hosts) in C1_HOSTS.iter().enumerate() {
        for (n, host) in hosts.iter().enumerate() {
            want.push(format!("c1\t{}\t{}\t{host}\tdefault", s + 1, n + 1));
        }
    }
    assert_eq!(r.rows(0), want);
    // the engine merges the grants: compare what is granted on what
    fn granted(lines: &[String], to: &str) -> std::collections::BTreeSet<(String, String)> {
        let mut out = std::collections::BTreeSet::new();
        for l in lines {
            let l = l.trim_start_matches("GRANT ").trim_end_matches(to).trim();
            let (what, on) = l.rsplit_once(" ON ").unwrap_or_else(|| panic!("{l}"));
            for p in what.split(", ") {
                out.insert((p.to_string(), on.replace('`', "")));
            }
        }
        out
    }
    let grants = r.rows(1);
    let expected: Vec<String> = clickhouse_operator::model::config::users::operator_grants(&[
        "default",
        names::OPERATOR_USER,
        "alice",
        "bob",
    ]);
    assert_eq!(
        granted(&grants, " TO clickhouse_operator"),
        granted(&expected, ""),
        "{grants:?}"
    );
    for definer in ["alice", "bob", "default", names::OPERATOR_USER] {
        assert!(
            grants
                .iter()
                .any(|g| g.starts_with(&format!("GRANT SET DEFINER ON {definer} "))),
            "{definer}: {grants:?}"
        );
    }
    // a user of the users Secret keeps what the version gives a users-file user without
    // grants (every privilege but access management), not the operator's list
    let alice = r.rows(2);
    assert!(alice.iter().any(|g| g.contains("TRUNCATE")), "{alice:?}");
    assert!(
        alice
            .iter()
            .all(|g| !g.contains("ACCESS MANAGEMENT") && !g.contains("CREATE USER")),
        "{alice:?}"
    );
}

/// SECURITY.md, "What the operator protects": the operator's grants allow every kind of statement
/// the operator, its backup agents and the exporter send — built by the operator's own statement
/// builders — and refuse what it never sends. The chDB session is always `default`, so a test-only
/// users file gives `default` exactly the grants the generated users file gives the operator's
/// account (copied out of that file); every statement must then pass the access check (it may still
/// fail for another reason: no Keeper, no remote server, no S3 here, a table that is not
/// replicated), and access management, mutations, `TRUNCATE`, other `SYSTEM` statements and file or
/// URL table functions are refused with ACCESS_DENIED (`KILL QUERY` is not among them: a user may
/// always kill its own queries).
#[test]
fn the_operators_grants_allow_its_statements_and_nothing_else() {
    use clickhouse_operator::clickhouse::backup as chbackup;
    use clickhouse_operator::clickhouse::sql::{
        self, ClusterName, DatabaseName, ReplicaMacro, Source, TableName,
    };
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = build(&c, &i);
    let users = secret_file(&d, names::USERS_FILE);
    let operator = &users[users.find("<clickhouse_operator").unwrap()..];
    let grants = &operator[operator.find("<grants>").unwrap()
        ..operator.find("</grants>").unwrap() + "</grants>".len()];
    let layout = lay_out("grants", &d, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!("<clickhouse><users><default>{grants}</default></users></clickhouse>"),
    );
    let v = clickhouse_operator::clickhouse::Version::new(26, 9);
    let db = DatabaseName("src".into());
    let table = TableName {
        database: db.clone(),
        name: "t".into(),
    };
    let cluster = ClusterName("c1".into());
    let replica = ReplicaMacro("c1-0-1".into());
    let create = |q: &str| sql::create_if_not_exists(q).unwrap_or_else(|| q.to_string());
    let mut allowed: Vec<String> = vec![
        sql::create_database(&db, "Atomic"),
        create("CREATE TABLE src.t (x UInt8) ENGINE = MergeTree ORDER BY x"),
        create("CREATE TABLE src.t2 (x UInt8) ENGINE = MergeTree ORDER BY x"),
        "INSERT INTO src.t VALUES (1)".into(),
        create("CREATE VIEW src.v (x UInt8) AS SELECT x FROM src.t"),
        create(
            "CREATE MATERIALIZED VIEW src.mv TO src.t2 (x UInt8) DEFINER = alice \
             SQL SECURITY DEFINER AS SELECT x FROM src.t",
        ),
        create(
            "CREATE DICTIONARY src.d (x UInt8) PRIMARY KEY x SOURCE(CLICKHOUSE(TABLE 't' DB \
             'src')) LIFETIME(0) LAYOUT(FLAT())",
        ),
        create("CREATE FUNCTION linear AS (x, k, b) -> ((k * x) + b)"),
        sql::select_version().into(),
        sql::discover_databases(v, Source::Local),
        sql::discover_databases(v, Source::AllReplicas(&cluster)),
        sql::discover_tables(v, Source::Local),
        sql::server_glance(&cluster),
        sql::shards_answering(&cluster),
        sql::fetches_from(&replica),
        sql::replicated_tables().into(),
        sql::replication_status().into(),
        sql::discover_droppable_tables(),
        sql::discover_replicated_databases().into(),
        sql::zookeeper_children("/clickhouse"),
        sql::sync_replica(v, &table),
        sql::drop_dns_cache().into(),
        chbackup::freeze_sql("src", "t"),
        chbackup::attach_part_sql("src", "t2", "all_1_1_0"),
        chbackup::backup_sql(
            &["src".into()],
            "S3('http://127.0.0.1:1/backups/c1/x', 'key', 'secret')",
            None,
        ),
    ];
    allowed.extend(sql::discover_functions(v, Source::Local));
    allowed.extend(sql::discover_dictionaries(v));
    allowed.extend(sql::drop_replica(v, &replica, &table));
    allowed.extend(sql::drop_database_replica(
        v,
        &sql::ShardMacro("0".into()),
        &replica,
        &db,
    ));
    allowed.extend([
        sql::drop_dictionary(&TableName {
            database: db.clone(),
            name: "d".into(),
        }),
        sql::drop_table(
            v,
            &TableName {
                database: db.clone(),
                name: "mv".into(),
            },
        ),
        sql::drop_table(
            v,
            &TableName {
                database: db.clone(),
                name: "v".into(),
            },
        ),
        sql::drop_database(v, &db),
    ]);
    let refused = [
        "CREATE USER mallory",
        "GRANT SELECT ON *.* TO alice",
        "ALTER TABLE src.t DELETE WHERE 1",
        "ALTER TABLE src.t DROP PARTITION tuple()",
        "TRUNCATE TABLE src.t",
        "SYSTEM SHUTDOWN",
        "SYSTEM DROP MARK CACHE",
        "SYSTEM STOP MERGES src.t",
        "SELECT * FROM file('x', 'CSV', 'x UInt8')",
        "SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'x UInt8')",
    ];
    // the refused statements run on tables that exist: before the drops
    let drops = allowed.len() - 4;
    let mut queries: Vec<&str> = allowed[..drops].iter().map(String::as_str).collect();
    queries.extend(refused);
    queries.extend(allowed[drops..].iter().map(String::as_str));
    let r = run(&layout, &queries);
    r.loaded();
    let denied = |e: &str| e.contains("ACCESS_DENIED") || e.contains("Code: 497");
    for (n, q) in queries.iter().enumerate() {
        let result = &r.results[n];
        if refused.contains(q) {
            let e = result
                .as_ref()
                .err()
                .unwrap_or_else(|| panic!("{q} was allowed"));
            assert!(denied(e), "{q}: refused, but not for access: {e}");
        } else if let Err(e) = result {
            assert!(!denied(e), "{q}: {e}");
        }
    }
    // what must have worked outright
    for n in [0, 1, 2, 3, 4, 5, 6, 7, 9, 11] {
        assert!(r.results[n].is_ok(), "{}: {:?}", queries[n], r.results[n]);
    }
}

/// Decision 36: the exporter's account reads what the exporter sends and nothing else. As in
/// the operator's grants test, the chDB session is `default`, so a test-only users file gives
/// `default` the exporter's grants and profile copied out of the generated users file. Every
/// statement of [`clickhouse_operator::exporter::queries`] passes; reading a table outside
/// `system`, writing, DDL and access management are refused.
#[test]
fn the_exporters_account_reads_the_system_tables_and_nothing_else() {
    use clickhouse_operator::exporter::queries;
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = build(&c, &i);
    let users = secret_file(&d, names::USERS_FILE);
    // the account in `<users>` (its profile of the same name comes before, in `<profiles>`)
    let exporter = &users[users.find("<users>").unwrap()..];
    let exporter = &exporter[exporter
        .find(&format!("<{}", names::EXPORTER_USER))
        .unwrap()..];
    let exporter = &exporter[..exporter
        .find(&format!("</{}>", names::EXPORTER_USER))
        .unwrap()];
    let grants = &exporter[exporter.find("<grants>").unwrap()
        ..exporter.find("</grants>").unwrap() + "</grants>".len()];
    assert!(
        !exporter.contains("allow_databases"),
        "grants exclude other access settings: {exporter}"
    );
    let layout = lay_out("exporter", &d, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!(
            "<clickhouse><users><default><profile>{}</profile>{grants}</default></users></clickhouse>",
            names::EXPORTER_PROFILE
        ),
    );
    // chDB's `default` database reads files: its tables are refused as files
    let refused = [
        "SELECT * FROM default.t",
        "INSERT INTO default.t VALUES (1)",
        "CREATE TABLE default.u (x UInt8) ENGINE = Memory",
        "DROP TABLE default.t",
        "CREATE USER mallory",
        "SET readonly = 0",
        "SELECT * FROM file('x', 'CSV', 'x UInt8')",
    ];
    let mut all: Vec<&str> = queries::ALL.to_vec();
    all.extend(refused);
    all.push("SELECT getSetting('readonly')");
    let r = run(&layout, &all);
    r.loaded();
    let denied = |e: &str| e.contains("ACCESS_DENIED") || e.contains("Code: 497");
    for (n, q) in queries::ALL.iter().enumerate() {
        match &r.results[n] {
            Ok(_) => {}
            // chDB, an embedded engine, has no `system.asynchronous_metrics`
            Err(e) if *q == queries::ASYNCHRONOUS_METRICS && e.contains("UNKNOWN_TABLE") => {}
            Err(e) => panic!("{q}: {e}"),
        }
    }
    for (n, q) in refused.iter().enumerate() {
        let e = r.error(queries::ALL.len() + n);
        assert!(denied(e) || e.contains("READONLY"), "{q}: {e}");
    }
    assert_eq!(r.rows(all.len() - 1), ["2"], "the session is read-only");
}

/// Passwords not in the clear on ClickHouse 26.x: users Secret keys `<user>.sha256_hex` and
/// `<user>.double_sha1_hex` give their user that hash as it is (`system.users.auth_type`, and
/// the hash of `SHOW CREATE USER` is the SHA-256 of the password, or its double SHA-1).
#[test]
fn users_given_by_their_hashes_have_those_hashes() {
    use sha2::{Digest, Sha256};
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("24.8.4.13".parse().unwrap());
    i.user_passwords.insert(
        "carol.sha256_hex".into(),
        Password(hex::encode(Sha256::digest(b"carol pw"))),
    );
    let d = build(&c, &i);
    let layout = lay_out("hashed-users", &d, "c1-0-0", "");
    let mysql = "dave.double_sha1_hex";
    let r = run(
        &layout,
        &[
            "SELECT name, auth_type FROM system.users WHERE name = 'carol'",
            "SHOW CREATE USER carol SETTINGS format_display_secrets_in_show_and_select = 1",
            "SELECT upper(hex(SHA256('carol pw')))",
        ],
    );
    assert_eq!(r.rows(0), ["carol\t['sha256_password']"]);
    assert!(r.rows(1)[0].contains(&r.rows(2)[0]), "{:?}", r.rows(1));

    // double SHA-1: its hash, computed by the engine itself from the password
    let probe = run(&layout, &["SELECT hex(SHA1(unhex(hex(SHA1('dave pw')))))"]);
    let double = probe.rows(0)[0].to_lowercase();
    i.user_passwords
        .insert(mysql.into(), Password(double.clone()));
    let d = build(&c, &i);
    let layout = lay_out("hashed-users-2", &d, "c1-0-0", "");
    let r = run(
        &layout,
        &[
            "SELECT name, auth_type FROM system.users WHERE name = 'dave'",
            "SHOW CREATE USER dave SETTINGS format_display_secrets_in_show_and_select = 1",
        ],
    );
    assert_eq!(r.rows(0), ["dave\t['double_sha1_password']"]);
    assert!(
        r.rows(1)[0].to_lowercase().contains(&double),
        "{:?}",
        r.rows(1)
    );
}

/// Users managed with SQL on ClickHouse 26.x: `spec.users.accounts.<user>.accessManagement`
/// gives that user the right to create users and grant (`SHOW GRANTS FOR`), and not another;
/// `replicatedAccess` loads (chDB keeps no replicated access storage, so where the users go is
/// not shown here; see docs/testing.md).
#[test]
fn access_management_lets_the_user_manage_users_with_sql() {
    let (c, mut i) = c1(
        serde_json::json!({"users": {"secretName": "u", "replicatedAccess": true,
        "accounts": {"alice": {"accessManagement": true}}}}),
    );
    i.server_version = Some("24.8.4.13".parse().unwrap());
    let d = build(&c, &i);
    let layout = lay_out("access-management", &d, "c1-0-0", "");
    let r = run(&layout, &["SHOW GRANTS FOR alice", "SHOW GRANTS FOR bob"]);
    let alice = r.rows(0).join("\n");
    assert!(
        alice.contains("CREATE USER") && alice.contains("WITH GRANT OPTION"),
        "{alice}"
    );
    assert!(
        !r.rows(1).join("\n").contains("CREATE USER"),
        "{:?}",
        r.rows(1)
    );
}
