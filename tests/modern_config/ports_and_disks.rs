//! What the servers serve and store on beside the defaults: their own Prometheus endpoint, the
//! client protocols' ports, further disks and storage policies.

use clickhouse_operator::model::config::server::SERVER_FILE;
use clickhouse_operator::model::names;

use crate::support::{C1_HOSTS, CLUSTERS, build, c1, check_clusters, lay_out, run};

/// docs/monitoring.md, "The servers' own endpoint": with `serverMetrics` on, the generated
/// `prometheus` section (the servers' own endpoint of ClickHouse 20.1 and later) loads on 26.x with
/// everything else. chDB serves no port, so that the endpoint answers is not shown here.
#[test]
fn the_servers_own_prometheus_section_loads() {
    let (c, i) = c1(serde_json::json!({"serverMetrics": {"enabled": true, "port": 9400}}));
    let d = build(&c, &i);
    assert!(d.common_config.data.as_ref().unwrap()[SERVER_FILE].contains("<prometheus>"));
    let layout = lay_out("prometheus", &d, "c1-0-0", "");
    let r = run(&layout, &[CLUSTERS]);
    check_clusters(&r.rows(0), "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
}

/// docs/configuration.md, "Storage": the disks and storage policy of `spec.storage` load on
/// ClickHouse 26.x and work: `system.disks` has the further disk, `system.storage_policies` the
/// policy's volumes in the spec's order with their disks and move factor, and a table of the policy
/// with a `TTL … TO VOLUME 'cold'` keeps its expired rows on the cold disk and its current rows on
/// the default one (`system.parts.disk_name`). Test-only: the disk's path is moved into the
/// temporary folder (the pod mounts its volume at `/var/lib/clickhouse-disks/cold/`, which the
/// model's unit test checks); the data volume is chDB's own.
#[test]
fn disks_and_a_storage_policy_move_expired_parts_to_the_cold_disk() {
    let (c, i) = c1(serde_json::json!({"storage": {
        "size": "10Gi",
        "disks": [{"name": "cold", "size": "100Gi"}],
        "policies": {"tiered": {"moveFactor": 0.2, "volumes": [
            {"name": "hot", "disks": ["default"], "maxDataPartSize": "1Gi"},
            {"name": "cold", "disks": ["cold"]}]}}
    }}));
    let d = build(&c, &i);
    let tag = "storage";
    let dir = std::env::temp_dir().join(format!("modern-config-{tag}-{}", std::process::id()));
    let cold = dir.join("disks").join("cold");
    let extra = format!(
        "<storage_configuration><disks><cold><path>{}/</path></cold></disks></storage_configuration>",
        cold.display()
    );
    let layout = lay_out(tag, &d, "c1-0-0", &extra);
    std::fs::create_dir_all(&cold).unwrap();
    let server =
        layout.read(&layout.config_d(clickhouse_operator::model::config::server::SERVER_FILE));
    assert!(
        server.contains("<path>/var/lib/clickhouse-disks/cold/</path>"),
        "{server}"
    );
    let run = run(
        &layout,
        &[
            "SELECT name FROM system.disks ORDER BY name",
            "SELECT policy_name, volume_name, volume_priority, arrayStringConcat(disks, ','), \
             max_data_part_size, move_factor FROM system.storage_policies \
             WHERE policy_name = 'tiered' ORDER BY volume_priority",
            "CREATE TABLE default.events (d DateTime, x UInt64) ENGINE = MergeTree ORDER BY x \
             TTL d + INTERVAL 1 DAY TO VOLUME 'cold' SETTINGS storage_policy = 'tiered'",
            "INSERT INTO default.events SELECT now() - INTERVAL 10 DAY, number FROM numbers(100)",
            "INSERT INTO default.events SELECT now(), number FROM numbers(50)",
            "SELECT disk_name, sum(rows) FROM system.parts WHERE database = 'default' \
             AND table = 'events' AND active GROUP BY disk_name ORDER BY disk_name",
        ],
    );
    assert_eq!(run.rows(0), ["cold", "default"]);
    assert_eq!(
        run.rows(1),
        [
            "tiered\thot\t1\tdefault\t1073741824\t0.2",
            "tiered\tcold\t2\tcold\t0\t0.2"
        ]
    );
    run.rows(2);
    run.rows(3);
    run.rows(4);
    assert_eq!(run.rows(5), ["cold\t100", "default\t50"]);
}

/// `spec.protocols` on ClickHouse 26.x: the MySQL, PostgreSQL and gRPC ports, and gRPC's TLS
/// section with `spec.tls`, load (chDB serves no port, so that they answer is not shown here),
/// and the MySQL and PostgreSQL ports are no longer removed.
#[test]
fn the_client_protocols_load() {
    for extra in [
        serde_json::json!({"protocols": {"mysql": true, "postgresql": true, "grpc": true}}),
        serde_json::json!({"protocols": {"mysql": true, "postgresql": true, "grpc": true},
            "tls": {"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"}}),
    ] {
        let tls = extra.get("tls").is_some();
        let (c, i) = c1(extra);
        let d = build(&c, &i);
        let files = d.common_config.data.as_ref().unwrap();
        assert!(files[SERVER_FILE].contains("<grpc_port>9100</grpc_port>"));
        assert_eq!(
            files[SERVER_FILE].contains("<enable_ssl>1</enable_ssl>"),
            tls
        );
        let layout = lay_out(
            if tls { "protocols-tls" } else { "protocols" },
            &d,
            "c1-0-0",
            "",
        );
        let r = run(&layout, &[CLUSTERS]);
        let port = if tls {
            names::TCP_SECURE_PORT
        } else {
            names::TCP_PORT
        };
        check_clusters(&r.rows(0), "c1", &C1_HOSTS, port).unwrap();
    }
}
