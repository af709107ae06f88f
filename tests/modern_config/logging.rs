//! The server log and the system log tables: the merged `logger/level`, the JSON format, the
//! tables' TTLs.

use std::collections::BTreeMap;

use clickhouse_operator::model::Desired;
use clickhouse_operator::model::config::server::{RUNTIME_FILE, SERVER_FILE};

use crate::support::{build, c1, lay_out, run};

/// The value of `logger/level` after merging `config.d/` as ClickHouse does: files in name
/// order, a later file's element replacing an earlier one's (shown on 26.x by
/// `custom_files_merge_after_the_operators_files`).
fn merged_logger_level(d: &Desired) -> Option<String> {
    let files = d.common_config.data.as_ref().unwrap();
    let mut level = None;
    for (name, xml) in files {
        let doc = roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(l) = doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("logger"))
            .flat_map(|n| n.children())
            .rfind(|n| n.has_tag_name("level"))
        {
            level = l.text().map(str::to_string);
        }
    }
    level
}

/// docs/testing.md: `spec.configuration.settings: {logger/level: debug}` is reloadable, so it goes
/// to the runtime file; the server file sets `logger/level` to `information` by default. Files
/// merge in name order, the later one winning, so the runtime file must sort after the server file
/// (it once did not, and the spec's level was silently ignored). chDB cannot show the level (it
/// forces `logger.level` to `trace`), so the merge is computed from the files, by the rule the
/// custom-files test proves on 26.x. Checked by hand on Debian's 18.16 server: with the runtime
/// file sorting first no `<Debug>` line is logged; sorting last, `<Debug>` lines are.
#[test]
fn a_logger_level_from_the_spec_is_not_overridden_by_the_operators_default() {
    let (c, i) = c1(serde_json::json!({
        "configuration": {"settings": {"logger/level": "debug"}}
    }));
    let d = build(&c, &i);
    let files = d.common_config.data.as_ref().unwrap();
    assert!(files[RUNTIME_FILE].contains("<level>debug</level>"));
    assert!(RUNTIME_FILE > SERVER_FILE);
    assert_eq!(merged_logger_level(&d).as_deref(), Some("debug"));
}

/// `spec.logging.format: Json` on ClickHouse 26.x: the generated `logger/formatting` makes the
/// server write its log as one JSON object per line (chDB honours `logger`; the test only moves
/// the files into the temporary folder).
#[test]
fn a_json_log_format_writes_one_json_object_per_line() {
    let (c, i) = c1(serde_json::json!({"logging": {"format": "Json", "size": "10M", "count": 2}}));
    let d = build(&c, &i);
    let layout = lay_out("json-log", &d, "c1-0-0", "");
    let r = run(&layout, &["SELECT 1"]);
    assert_eq!(r.rows(0), ["1"]);
    let lines: Vec<&str> = r.log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no server log");
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(v["message"].is_string(), "{line}");
    }
}

/// `spec.logging.level` wins over the operator's default in the merged files, as the setting
/// `logger/level` it replaces does (files merge in name order).
#[test]
fn the_level_of_spec_logging_is_the_merged_level() {
    let (c, i) = c1(serde_json::json!({"logging": {"level": "warning"}}));
    assert_eq!(
        merged_logger_level(&build(&c, &i)).as_deref(),
        Some("warning")
    );
}

/// Decision 49, docs/configuration.md "System log tables": the TTLs of `spec.systemLogs` are the
/// TTLs ClickHouse 26.x creates its system log tables with: `ttlDays` on every default table,
/// a table's own days over it, an optional table named (`text_log`) turned on with its days,
/// and a default table set to 0 left as the image has it (no TTL).
#[test]
fn system_log_tables_are_created_with_the_specs_ttls() {
    use clickhouse_operator::model::config::system_logs::{DEFAULT_TABLES, SYSTEM_LOGS_FILE};
    let (c, i) = c1(serde_json::json!({"systemLogs": {"ttlDays": 7,
        "tables": {"query_log": 30, "trace_log": 0, "text_log": 3}}}));
    let d = build(&c, &i);
    assert!(d.common_config.data.as_ref().unwrap()[SYSTEM_LOGS_FILE].contains("text_log"));
    // trace_log is in the image's configuration (here the stand-in's), without a TTL
    let layout = lay_out(
        "system-logs",
        &d,
        "c1-0-0",
        "<trace_log><database>system</database><table>trace_log</table></trace_log>",
    );
    let r = run(
        &layout,
        &[
            "SYSTEM FLUSH LOGS",
            "SELECT name, engine_full FROM system.tables WHERE database = 'system' \
             AND name LIKE '%_log' ORDER BY name",
        ],
    );
    let tables: BTreeMap<String, String> = r
        .rows(1)
        .iter()
        .filter_map(|row| {
            let (n, e) = row.split_once('\t')?;
            Some((n.to_string(), e.to_string()))
        })
        .collect();
    let ttl = |t: &str| {
        let e = tables
            .get(t)
            .unwrap_or_else(|| panic!("no system.{t}: {tables:?}"));
        e.split_once(" TTL ").map(|(_, rest)| {
            rest.split(" SETTINGS")
                .next()
                .unwrap_or_default()
                .to_string()
        })
    };
    for t in DEFAULT_TABLES
        .iter()
        .filter(|t| !["query_log", "trace_log"].contains(t))
    {
        assert_eq!(
            ttl(t).as_deref(),
            Some("event_date + toIntervalDay(7)"),
            "{t}"
        );
    }
    assert_eq!(
        ttl("query_log").as_deref(),
        Some("event_date + toIntervalDay(30)")
    );
    assert_eq!(
        ttl("text_log").as_deref(),
        Some("event_date + toIntervalDay(3)")
    );
    assert_eq!(ttl("trace_log"), None);
}
