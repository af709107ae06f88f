//! Settings, profiles, quotas and users of the spec, custom files and the order they merge in,
//! what fails the load, and secret settings from the environment.

use std::path::{Path, PathBuf};

use clickhouse_operator::model::names;

use crate::support::{C1_HOSTS, CLUSTERS, build, c1, check_clusters, lay_out, run, run_with_env};

/// docs/testing.md: `spec.configuration.settings`, `profiles`, `quotas` and a users Secret load on
/// ClickHouse 26.x: the settings file overrides the image (`max_connections`), nested and
/// reloadable settings are in force, every profile and its settings are in
/// `system.settings_profile_elements`, the Secret's users get `spec.users.profile` and the
/// operator's user the default profile, all with SHA-256 hashes of their passwords (as the
/// engine computes them), each account only from its networks (decision 27: the operator's, an
/// account's own, the cluster's pods by name for the cluster's account and `default`); the
/// quota's limits are in `system.quota_limits`.
#[test]
fn settings_profiles_quotas_and_users_are_in_force() {
    let (c, i) = c1(serde_json::json!({
        "users": {"secretName": "c1-app-users", "profile": "app",
                  "accounts": {"bob": {"networks": ["198.18.0.0/16", "fd00::/8"], "databases": ["sales"]}}},
        "configuration": {
            "settings": {
                "max_concurrent_queries": "150",
                "max_connections": "2048",
                "max_table_size_to_drop": "123456",
                "merge_tree/parts_to_throw_insert": "777"
            },
            "profiles": {
                "default": {"max_memory_usage": "1234567890", "max_execution_time": "60"},
                "app": {"max_threads": "3", "readonly": "1"}
            },
            "quotas": {"default": {"duration": "3600", "queries": "1000", "errors": "50"}}
        }
    }));
    let d = build(&c, &i);
    let layout = lay_out("settings", &d, "c1-0-1", "");
    let r = run(
        &layout,
        &[
            "SELECT name, value FROM system.server_settings WHERE name IN \
             ('max_connections', 'max_table_size_to_drop') ORDER BY name",
            "SELECT value FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'",
            "SELECT name, value FROM system.settings WHERE name IN \
             ('max_memory_usage', 'max_execution_time') ORDER BY name",
            "SELECT profile_name, setting_name, value FROM system.settings_profile_elements \
             WHERE profile_name IS NOT NULL ORDER BY profile_name, setting_name",
            "SELECT user_name, inherit_profile FROM system.settings_profile_elements \
             WHERE user_name IS NOT NULL ORDER BY user_name",
            "SELECT name, auth_type, host_ip, host_names, host_names_regexp FROM system.users \
             ORDER BY name",
            "SELECT quota_name, duration, max_queries, max_errors FROM system.quota_limits",
            "SELECT arraySort(apply_to_list) FROM system.quotas WHERE name = 'default'",
            "SHOW CREATE USER alice SETTINGS format_display_secrets_in_show_and_select = 1",
            "SELECT upper(hex(SHA256('alice pw & <x>')))",
            "SHOW CREATE USER clickhouse_operator SETTINGS format_display_secrets_in_show_and_select = 1",
            "SELECT upper(hex(SHA256('op3rator-pw')))",
            CLUSTERS,
            "SELECT substitution FROM system.macros WHERE macro = 'replica'",
        ],
    );
    assert_eq!(
        r.rows(0),
        ["max_connections\t2048", "max_table_size_to_drop\t123456"]
    );
    assert_eq!(r.rows(1), ["777"]);
    assert_eq!(
        r.rows(2),
        ["max_execution_time\t60", "max_memory_usage\t1234567890"]
    );
    assert_eq!(
        r.rows(3),
        [
            "app\tmax_threads\t3",
            "app\treadonly\t1",
            // decision 36: the exporter's account reads and sets nothing but its session
            "clickhouse_exporter\tmax_execution_time\t10",
            "clickhouse_exporter\treadonly\t2",
            "default\tmax_execution_time\t60",
            "default\tmax_memory_usage\t1234567890",
            // the operator's own: a stopping server waits at most 1 s for an idle connection
            "default\tpoll_interval\t1",
            "readonly\treadonly\t1",
        ]
    );
    assert_eq!(
        r.rows(4),
        [
            "alice\tapp",
            "bob\tapp",
            "clickhouse_cluster\tdefault",
            "clickhouse_exporter\tclickhouse_exporter",
            "clickhouse_operator\tdefault",
            "default\tdefault"
        ]
    );
    // decision 27: every account only from its networks (the IPv4-mapped form of an IPv4 network
    // is taken as it is); the cluster's account and `default` from the cluster's pods by name
    let servers = C1_HOSTS
        .iter()
        .flat_map(|shard| shard.iter())
        .map(|h| format!("'{h}'"))
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        r.rows(5),
        [
            // ::1 and 127.0.0.1 are shown as `localhost`.
            "alice\t['sha256_password']\t['::ffff:10.244.0.0/112']\t['localhost']\t[]".to_string(),
            "bob\t['sha256_password']\t['::ffff:198.18.0.0/112', 'fd00::/8']\t['localhost']\t[]".to_string(),
            format!("clickhouse_cluster\t['sha256_password']\t[]\t['localhost', {servers}]\t[]"),
            "clickhouse_exporter\t['sha256_password']\t['::ffff:10.244.0.0/112']\t['localhost']\t[]".to_string(),
            "clickhouse_operator\t['sha256_password']\t['::ffff:10.244.0.0/112']\t['localhost']\t[]".to_string(),
            format!("default\t['plaintext_password']\t[]\t['localhost', {servers}]\t[]"),
        ]
    );
    assert_eq!(r.rows(6), ["default\t3600\t1000\t50"]);
    assert_eq!(
        r.rows(7),
        [
            "['alice', 'bob', 'clickhouse_cluster', 'clickhouse_exporter', 'clickhouse_operator', 'default']"
        ]
    );
    let alice = &r.rows(8)[0];
    assert!(
        alice.contains(&format!("sha256_hash BY '{}'", r.rows(9)[0])),
        "{alice}"
    );
    assert!(alice.contains("SETTINGS PROFILE `app`"), "{alice}");
    let op = &r.rows(10)[0];
    assert!(
        op.contains(&format!("sha256_hash BY '{}'", r.rows(11)[0])),
        "{op}"
    );
    check_clusters(&r.rows(12), "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
    assert_eq!(r.rows(13), ["c1-0-1"]);
}

/// The custom files of the tests below: one adds a cluster, one sets a nested setting the
/// spec also sets and overrides a setting of the spec.
fn custom_files() -> serde_json::Value {
    serde_json::json!({
        "50-extra-cluster.xml": "<clickhouse><remote_servers><analytics><shard><replica>\
            <host>analytics.example.com</host><port>9000</port></replica></shard>\
            </analytics></remote_servers></clickhouse>",
        "60-tuning.xml": "<?xml version=\"1.0\"?>\n<clickhouse>\n  <merge_tree>\n    \
            <parts_to_throw_insert>700</parts_to_throw_insert>\n  </merge_tree>\n  \
            <max_connections>3000</max_connections>\n</clickhouse>\n"
    })
}

/// docs/testing.md: `spec.configuration.files` load on ClickHouse 26.x next to the operator's files
/// and merge after them (their names sort after `00-operator-`): a custom cluster is added to
/// the operator's `remote_servers`, and where a custom file and the spec's settings set the
/// same element (nested or not), the custom file wins — the later file in name order wins.
#[test]
fn custom_files_merge_after_the_operators_files() {
    let (c, i) = c1(serde_json::json!({
        "configuration": {
            "settings": {"max_connections": "2048", "merge_tree/parts_to_throw_insert": "500"},
            "files": custom_files()
        }
    }));
    let d = build(&c, &i);
    let layout = lay_out("files", &d, "c1-1-2", "");
    let r = run(
        &layout,
        &[
            "SELECT cluster, shard_num, replica_num, host_name FROM system.clusters \
             WHERE cluster = 'analytics'",
            CLUSTERS,
            "SELECT value FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'",
            "SELECT value FROM system.server_settings WHERE name = 'max_connections'",
        ],
    );
    assert_eq!(r.rows(0), ["analytics\t1\t1\tanalytics.example.com"]);
    let c1_rows: Vec<String> = r
        .rows(1)
        .into_iter()
        .filter(|l| l.starts_with("c1\t"))
        .collect();
    check_clusters(&c1_rows, "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
    assert_eq!(r.rows(2), ["700"]);
    assert_eq!(r.rows(3), ["3000"]);
}

/// docs/testing.md: a profile setting ClickHouse 26.x does not know fails the whole load (the users
/// file is refused, so no user could log in). The operator passes the names of
/// `spec.configuration.profiles` through unchecked: a misspelt setting in the spec gives a
/// users file a current server refuses.
#[test]
fn an_unknown_profile_setting_fails_the_load() {
    let (c, i) = c1(serde_json::json!({
        "configuration": {"profiles": {"default": {"max_memory_usag": "1"}}}
    }));
    let d = build(&c, &i);
    let layout = lay_out("unknown-setting", &d, "c1-0-0", "");
    let r = run(&layout, &["SELECT 1"]);
    let e = r
        .load_error
        .as_deref()
        .unwrap_or_else(|| panic!("a profile with an unknown setting loaded: {r:?}"));
    assert!(
        r.stderr.contains("Unknown setting 'max_memory_usag'")
            || e.contains("Unknown setting 'max_memory_usag'"),
        "{e}\n{}",
        r.stderr
    );
}

/// docs/testing.md: malformed XML fails the load on ClickHouse 26.x, in `config.d/` (a custom file
/// with a mismatched closing tag) and in `users.d/` (the generated users file with one closing
/// tag dropped), while the same layout with the well-formed file loads.
#[test]
fn malformed_xml_fails_the_load() {
    let good = "<clickhouse><max_connections>1</max_connections></clickhouse>";
    let broken = "<clickhouse><max_connections>1</max_connection></clickhouse>";
    let (c, i) = c1(serde_json::json!({"configuration": {"files": {"50-custom.xml": good}}}));
    let d = build(&c, &i);
    let layout = lay_out("malformed", &d, "c1-0-0", "");
    let query = ["SELECT value FROM system.server_settings WHERE name = 'max_connections'"];
    assert_eq!(run(&layout, &query).rows(0), ["1"]);

    layout.rewrite(&layout.config_d("50-custom.xml"), |s| {
        assert_eq!(s, good);
        broken.to_string()
    });
    let r = run(&layout, &query);
    assert!(r.load_error.is_some(), "malformed config.d loaded: {r:?}");

    layout.rewrite(&layout.config_d("50-custom.xml"), |_| good.to_string());
    layout.rewrite(&layout.users_d(names::USERS_FILE), |s| {
        assert!(s.contains("</networks>"), "{s}");
        s.replacen("</networks>", "", 1)
    });
    let r = run(&layout, &query);
    let e = r.load_error.as_deref().unwrap_or_default();
    assert!(
        e.contains(names::USERS_FILE) || r.stderr.contains(names::USERS_FILE),
        "malformed users.d loaded or failed for another reason: {r:?}"
    );
}

/// Decision 34: the 26.x engine takes the settings of `secretSettings` from the environment
/// variables the pod sets from their Secret keys (`from_env`, with `hide_in_preprocessed`):
/// a server setting (`max_table_size_to_drop`) and a nested one (a `merge_tree` setting) are in force with
/// the values of the variables, which appear in no file of the layout.
#[test]
fn secret_settings_are_read_from_the_environment() {
    let key = |k: &str| serde_json::json!({"name": "cfg", "key": k});
    let (c, i) = c1(serde_json::json!({"configuration": {"secretSettings": {
        "max_table_size_to_drop": key("drop"),
        "merge_tree/parts_to_throw_insert": key("parts")}}}));
    let d = build(&c, &i);
    let layout = lay_out("secret-settings", &d, "c1-1-3", "");
    // in the order of their paths: max_table_size_to_drop, then merge_tree/…
    let r = run_with_env(
        &layout,
        &[
            "SELECT value FROM system.server_settings WHERE name = 'max_table_size_to_drop'",
            "SELECT value FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'",
        ],
        &[
            (&names::secret_setting_env(0), "98765432109"),
            (&names::secret_setting_env(1), "1234567891"),
        ],
    );
    assert_eq!(r.rows(0), ["98765432109"]);
    assert_eq!(r.rows(1), ["1234567891"]);
    // (values long enough that a log's timestamps and ids cannot hold them by chance)
    for entry in walk(&layout.dir) {
        let text = std::fs::read_to_string(&entry).unwrap_or_default();
        assert!(
            !text.contains("98765432109") && !text.contains("1234567891"),
            "{}",
            entry.display()
        );
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
