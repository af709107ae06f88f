//! Which server settings ClickHouse applies at runtime, and which need a restart.
//!
//! ClickHouse re-reads its configuration files when they change (about every 2 s) and applies a
//! documented subset without a restart: users, profiles and quotas (`users.d`), clusters
//! (`remote_servers`), `macros`, the ZooKeeper/Keeper node list, dictionaries and a few server
//! limits. Everything else is read once at startup. [`RELOADABLE`] is the allow-list of
//! `spec.configuration.settings` keys that go to a file no pod template hashes; any key not on
//! it, including every key this list does not know, is treated as needing a restart, because
//! restarting too often is an annoyance while not restarting leaves a setting silently
//! unapplied.

/// Setting paths (a top-level element, or `element/child`) that ClickHouse reloads at runtime.
/// A key matches an entry when it equals it or lies below it (`entry/...`). Sources: ClickHouse's
/// documentation of the configuration files ("reloads the settings for users and clusters on
/// the fly") and the server's reload handler (server limits, `logger/level`, dictionaries).
pub const RELOADABLE: &[&str] = &[
    "remote_servers",
    "macros",
    "zookeeper",
    "auxiliary_zookeepers",
    "dictionaries_config",
    "user_defined_executable_functions_config",
    "max_concurrent_queries",
    "max_concurrent_insert_queries",
    "max_concurrent_select_queries",
    "max_server_memory_usage",
    "max_server_memory_usage_to_ram_ratio",
    "max_table_size_to_drop",
    "max_partition_size_to_drop",
    "logger/level",
];

/// Whether changing the setting at `path` (`a/b/c`) needs a server restart.
pub fn needs_restart(path: &str) -> bool {
    !RELOADABLE.iter().any(|entry| {
        path == *entry
            || path
                .strip_prefix(entry)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::needs_restart;

    #[test]
    fn only_the_allow_list_is_reloadable_and_unknown_keys_restart() {
        for reload in [
            "max_concurrent_queries",
            "remote_servers/c1/shard",
            "logger/level",
            "max_server_memory_usage",
        ] {
            assert!(!needs_restart(reload), "{reload}");
        }
        for restart in [
            "logger/log",
            "logger",
            "max_concurrent_queries_extra",
            "mark_cache_size",
            "some_future_setting",
            "openSSL/server/certificateFile",
        ] {
            assert!(needs_restart(restart), "{restart}");
        }
    }
}
