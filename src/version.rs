//! The server version and what it can do, the versions an image tag and `upgradeOptions.apply`
//! name, and this operator's own version: below every layer, so that the resource types, the
//! builders, the planner and the SQL side share one definition.
//!
//! The operator reads `SELECT version()` on every run (S1-10), so upgrading ClickHouse needs
//! no change to the operator's configuration. Every statement that differs between versions
//! asks [`Version::supports`] with a [`Capability`]; the thresholds live in [`CAPABILITIES`]
//! and nowhere else.

use std::fmt;
use std::str::FromStr;

/// A ClickHouse server version, `year.month.patch.build` (e.g. `24.8.4.13`, `18.16.1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Release year (18, 22, 24, …).
    pub major: u32,
    /// Release month / minor number.
    pub minor: u32,
    /// Patch number; 0 when absent.
    pub patch: u32,
    /// Build number; 0 when absent.
    pub build: u32,
}

impl Version {
    /// A version from its first two components.
    pub const fn new(major: u32, minor: u32) -> Version {
        Version {
            major,
            minor,
            patch: 0,
            build: 0,
        }
    }

    /// Whether this version has `capability`, per [`CAPABILITIES`].
    pub fn supports(&self, capability: Capability) -> bool {
        *self >= capability.since()
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.{}.{}",
            self.major, self.minor, self.patch, self.build
        )
    }
}

/// `SELECT version()` returned something that is not a version.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse ClickHouse version {0:?}")]
pub struct VersionParseError(pub String);

impl FromStr for Version {
    type Err = VersionParseError;

    /// Parses `18.16.1`, `24.8.4.13`, `23.3.1.2823-lts` or `24.3.2.23-altinitystable`:
    /// two to four numeric components, anything after a `-` or `+` ignored.
    fn from_str(s: &str) -> Result<Version, VersionParseError> {
        let err = || VersionParseError(s.to_string());
        let core = s.trim().split(['-', '+', ' ']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        if !(2..=4).contains(&parts.len()) {
            return Err(err());
        }
        let mut nums = [0u32; 4];
        for (slot, part) in nums.iter_mut().zip(&parts) {
            *slot = part.parse().map_err(|_| err())?;
        }
        Ok(Version {
            major: nums[0],
            minor: nums[1],
            patch: nums[2],
            build: nums[3],
        })
    }
}

/// A statement or feature that only some server versions have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// `CREATE/DROP DICTIONARY` (DDL dictionaries) and `system.dictionaries.database`.
    DdlDictionaries,
    /// The `clusterAllReplicas(cluster, table)` table function.
    ClusterAllReplicas,
    /// `SYSTEM DROP REPLICA 'r' FROM TABLE db.t`.
    SystemDropReplica,
    /// `DROP TABLE … SYNC` / `DROP DATABASE … SYNC`.
    DropSync,
    /// Atomic databases: `create_table_query` can show the table `UUID` with
    /// `show_table_uuid_in_table_create_query_if_not_nil = 1`.
    TableUuids,
    /// Databases with `ENGINE = Replicated(…)`.
    ReplicatedDatabase,
    /// SQL user-defined functions copied from `system.functions` (`origin`, `create_query`).
    SqlUserDefinedFunctions,
    /// `SYSTEM DROP DATABASE REPLICA 'shard|replica' FROM DATABASE db`.
    SystemDropDatabaseReplica,
    /// `BACKUP … TO …` / `RESTORE` and `system.backups`.
    Backup,
    /// `BACKUP … TO S3(named_collection, 'path')` with a collection from the configuration
    /// files, hidden from the preprocessed copy and usable only with the grant `NAMED
    /// COLLECTION`: the S3 keys stay out of the statement.
    BackupNamedCollection,
    /// `system.databases.engine_full` is used to recreate a database (S1-10: from 22.12).
    DatabaseEngineFull,
    /// `SYSTEM SYNC REPLICA db.t LIGHTWEIGHT`.
    SyncReplicaLightweight,
    /// A cluster `<secret>` in `remote_servers`: the servers authenticate each other with it
    /// and a Distributed query runs on the remote shards as the user who started it.
    ClusterSecret,
    /// `<grants>` of a user defined in the users file (SQL privileges for XML users).
    UserGrantsInUsersFile,
    /// Keeper over TLS: `keeper_server/tcp_port_secure`, `raft_configuration/secure`, and a
    /// server's `zookeeper/node/secure`.
    KeeperTls,
    /// `password_double_sha1_hex` of a user of the users file (the hash the MySQL protocol
    /// needs).
    PasswordDoubleSha1,
    /// `access_management` of a user of the users file (SQL-driven access control).
    AccessManagement,
    /// `user_directories/replicated`: users, roles and grants created with SQL kept in Keeper.
    ReplicatedAccessStorage,
    /// The MySQL wire protocol (`mysql_port`).
    MysqlProtocol,
    /// The PostgreSQL wire protocol (`postgresql_port`).
    PostgresqlProtocol,
    /// gRPC (`grpc_port`, `grpc/enable_ssl`).
    GrpcProtocol,
    /// A `<ttl>` of a system log table's configuration (`query_log/ttl`): the table is created
    /// with that TTL (decision 49).
    SystemLogTtl,
    /// A server that finds no Keeper at start keeps trying: its distributed DDL worker retries
    /// its initialisation instead of giving up for the life of the process, and replicated
    /// tables reconnect. Such servers may start beside their Keeper rather than after it.
    StartsBeforeKeeper,
    /// `DEFINER` and `SQL SECURITY` of views and materialized views: a view may run as its
    /// definer rather than as whoever reads it, and the server settings
    /// `default_materialized_view_sql_security`, `default_view_definer` and
    /// `ignore_empty_sql_security_in_create_view_query` say what a view created without the
    /// clause gets.
    SqlSecurity,
}

/// The one table of version thresholds, from ClickHouse's changelog and the pull requests it
/// names (looked up in `docs/changelogs` of ClickHouse/ClickHouse and the PR threads). Where
/// the first release could not be pinned exactly, the later candidate is used: a threshold
/// that is too high only means the older statement, valid everywhere, is chosen.
///
/// What 18.16 (the test server) has was checked against a running 18.16.1: `SYSTEM SYNC
/// REPLICA db.t`, `SETTINGS` in `SELECT`, `remote()`, `system.zookeeper`,
/// `system.tables.create_table_query`/`engine_full`/`dependencies_*`, HTTPS; it rejects
/// `SYSTEM DROP REPLICA`, `… LIGHTWEIGHT`, `DROP TABLE … SYNC` and `NO DELAY` (Code 62),
/// `clusterAllReplicas` (Code 46) and `system.databases.engine_full` (Code 47).
pub const CAPABILITIES: &[(Capability, Version)] = &[
    // 19.17: DDL dictionaries (`CREATE DICTIONARY`, `DROP DICTIONARY`), changelog 2019.
    (Capability::DdlDictionaries, Version::new(19, 17)),
    // clusterAllReplicas is documented by PR #12156 (2020-07-06, master = 20.6) as existing;
    // its first release is not pinned, so 20.6.
    (Capability::ClusterAllReplicas, Version::new(20, 6)),
    // v20.6.1.4066-prestable changelog, New Feature: "Add `Alter table drop replica
    // replica_name` support. This fixes #7080. #10679" (the SYSTEM DROP REPLICA query; it is
    // absent from v20.5.1.3833-prestable).
    (Capability::SystemDropReplica, Version::new(20, 6)),
    // 20.10: Atomic became the default database engine; `DROP … SYNC` (alias of `NO DELAY`)
    // and `show_table_uuid_in_table_create_query_if_not_nil` came with Atomic databases.
    (Capability::DropSync, Version::new(20, 10)),
    (Capability::TableUuids, Version::new(20, 10)),
    // 21.3: the experimental `Replicated` database engine.
    (Capability::ReplicatedDatabase, Version::new(21, 3)),
    // PR #27796 (merged for 21.10) added `CREATE FUNCTION`; `system.functions.origin` and
    // `create_query`, which the copy reads, are taken from 21.11.
    (Capability::SqlUserDefinedFunctions, Version::new(21, 11)),
    // PR #42807 "Implement SYSTEM DROP DATABASE REPLICA", merged after the 22.12 branch
    // (last CI note 2022-12-16), so 23.1.
    (Capability::SystemDropDatabaseReplica, Version::new(23, 1)),
    // 22.8: `BACKUP`/`RESTORE` usable without the experimental flag.
    (Capability::Backup, Version::new(22, 8)),
    // `BACKUP … TO S3(named_collection, 'directory')` with `<named_collections>` of the
    // configuration was described by ClickHouse's maintainers in issue #42721 (2022-10-26) as
    // already there. The operator keeps S3 keys there only where the keys are also hidden from
    // the preprocessed copy on the data volume (`hide_in_preprocessed`, PR #53818, 23.8) and a
    // user needs the grant `NAMED COLLECTION` to use a collection (seen on 26.x in
    // `tests/modern_config/backups.rs`; its first release is not pinned): 23.8, the later candidate.
    (Capability::BackupNamedCollection, Version::new(23, 8)),
    // 22.12: S1-10.
    (Capability::DatabaseEngineFull, Version::new(22, 12)),
    // PR #48085 "More options for SYSTEM SYNC REPLICA" (LIGHTWEIGHT and PULL), opened
    // 2023-03-27 after the 23.3 branch: v23.4 (2023-04-26).
    (Capability::SyncReplicaLightweight, Version::new(23, 4)),
    // v20.10.2.20-stable changelog, New Feature: "Secure inter-cluster query execution (with
    // initial_user as current query user) #13156" (the cluster `<secret>`); 18.16 refuses the
    // element (Code 137, "Unknown element in config: secret", `tests/model_boot.rs`).
    (Capability::ClusterSecret, Version::new(20, 10)),
    // PR #49381 "Specify grants for users in users.xml", opened 2023-05-02 after the 23.4
    // release; its first release is not pinned (23.5 or 23.6), so 23.6.
    (Capability::UserGrantsInUsersFile, Version::new(23, 6)),
    // ClickHouse Keeper (with `tcp_port_secure` and raft `secure`) came with 21.8 and was
    // declared ready for production in 22.3, by which a server's `zookeeper/node/secure`
    // (PR #18184, 21.1) existed too: 22.3 for both.
    (Capability::KeeperTls, Version::new(22, 3)),
    // PR #17438 "Support configure System log table`s ttl in config.xml" (the `<ttl>` element
    // of a system log table), merged in December 2020 after the 20.12 branch: 21.1. Before it
    // the element is ignored (ClickHouse reads only the keys it knows there); 18.16 has no
    // table TTL at all (MergeTree TTL came with 19.6).
    (Capability::SystemLogTtl, Version::new(21, 1)),
    // `password_double_sha1_hex` came with the MySQL wire protocol's native password
    // authentication in 19.x; its first release is not pinned, so 20.1. 18.16 knows only
    // `password` and `password_sha256_hex` and refuses a user with neither, which would stop
    // every reload of the users file.
    (Capability::PasswordDoubleSha1, Version::new(20, 1)),
    // The client protocols of `spec.protocols`; none exists in 18.16. The MySQL interface
    // came in 19.x, PostgreSQL's and gRPC's in late 2020; their first releases are not pinned
    // here, so the later candidates: 20.1 and 21.1.
    // SQL-driven access control (`access_management`, RBAC) came with 20.4; replicated access
    // storage with 21.9 (the later candidate of 21.8/21.9, not pinned).
    (Capability::AccessManagement, Version::new(20, 4)),
    (Capability::ReplicatedAccessStorage, Version::new(21, 9)),
    (Capability::MysqlProtocol, Version::new(20, 1)),
    (Capability::PostgresqlProtocol, Version::new(21, 1)),
    (Capability::GrpcProtocol, Version::new(21, 1)),
    // PR #18285 "Reinitialize DDLWorker state on unexpected errors" (merged January 2021; it
    // closes #17991, a DDL worker left useless by a Keeper that failed at start): its first
    // release (21.1 or 21.2) is not pinned here, so 21.3. 18.16 gives its DDL queue up for
    // good when Keeper cannot be reached at start.
    (Capability::StartsBeforeKeeper, Version::new(21, 3)),
    // PR #60439 "Add definers for views (Attempt 2)": `ParserSQLSecurity`, and the settings
    // `default_view_definer`, `default_materialized_view_sql_security` and
    // `default_normal_view_sql_security` listed under 24.2 in `SettingsChangesHistory.h`; the
    // server setting `ignore_empty_sql_security_in_create_view_query` came with it (the fix
    // #63136 was backported to 24.2). Before it a view's query ran with the rights of whoever
    // read it, and a materialized view's with those of whoever inserted into its source.
    (Capability::SqlSecurity, Version::new(24, 2)),
];

impl Capability {
    /// The first version that has this capability (from [`CAPABILITIES`]).
    pub fn since(self) -> Version {
        CAPABILITIES
            .iter()
            .find(|(c, _)| *c == self)
            .map(|(_, v)| *v)
            // Every variant is in the table (unit-tested); an absent one is never assumed.
            .unwrap_or(Version::new(u32::MAX, 0))
    }
}

/// This operator's version, also the newest resource format it understands (`spec.crVersion`):
/// the package version, or `CLICKHOUSE_OPERATOR_VERSION` when set at build time (a release
/// build, or the test that swaps one build for another).
pub const OPERATOR_VERSION: &str = match option_env!("CLICKHOUSE_OPERATOR_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// `spec.upgradeOptions.apply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Apply {
    Disabled,
    Recommended,
    Latest,
    Exact(Version),
}

impl Apply {
    /// `Disabled`, `Recommended`, `Latest` (any case), or a version.
    pub fn parse(s: &str) -> Result<Apply, String> {
        match s.to_ascii_lowercase().as_str() {
            "disabled" => Ok(Apply::Disabled),
            "recommended" => Ok(Apply::Recommended),
            "latest" => Ok(Apply::Latest),
            _ => s.parse().map(Apply::Exact).map_err(|_| {
                format!("{s:?} is not Disabled, Recommended, Latest or a version such as 24.8.4.13")
            }),
        }
    }
}

/// The repository and version of an image `repo:tag` whose tag is a version.
pub fn image_version(image: &str) -> Option<(&str, Version)> {
    let (repo, tag) = image.rsplit_once(':')?;
    if repo.is_empty() || tag.contains('/') {
        return None;
    }
    Some((repo, tag.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_strings_of_every_era() {
        let cases = [
            (
                "18.16.1",
                Version {
                    major: 18,
                    minor: 16,
                    patch: 1,
                    build: 0,
                },
            ),
            ("22.12", Version::new(22, 12)),
            (
                "24.8.4.13",
                Version {
                    major: 24,
                    minor: 8,
                    patch: 4,
                    build: 13,
                },
            ),
            (
                "23.3.1.2823-lts",
                Version {
                    major: 23,
                    minor: 3,
                    patch: 1,
                    build: 2823,
                },
            ),
            (
                " 24.3.2.23-altinitystable\n",
                Version {
                    major: 24,
                    minor: 3,
                    patch: 2,
                    build: 23,
                },
            ),
        ];
        for (s, want) in cases {
            assert_eq!(s.parse::<Version>(), Ok(want), "{s}");
        }
        for bad in ["", "18", "x.y", "1.2.3.4.5", "18.16.a", "Code: 46"] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_capability_is_in_the_table_once() {
        let all = [
            Capability::DdlDictionaries,
            Capability::ClusterAllReplicas,
            Capability::SystemDropReplica,
            Capability::DropSync,
            Capability::TableUuids,
            Capability::ReplicatedDatabase,
            Capability::SqlUserDefinedFunctions,
            Capability::SystemDropDatabaseReplica,
            Capability::Backup,
            Capability::BackupNamedCollection,
            Capability::DatabaseEngineFull,
            Capability::SyncReplicaLightweight,
            Capability::ClusterSecret,
            Capability::UserGrantsInUsersFile,
            Capability::KeeperTls,
            Capability::SystemLogTtl,
            Capability::PasswordDoubleSha1,
            Capability::AccessManagement,
            Capability::ReplicatedAccessStorage,
            Capability::MysqlProtocol,
            Capability::PostgresqlProtocol,
            Capability::GrpcProtocol,
            Capability::StartsBeforeKeeper,
            Capability::SqlSecurity,
        ];
        assert_eq!(all.len(), CAPABILITIES.len());
        for c in all {
            assert_eq!(
                CAPABILITIES.iter().filter(|(x, _)| *x == c).count(),
                1,
                "{c:?}"
            );
        }
    }

    /// The test server (18.16) has none of the modern statements; 24.8 has all of them.
    #[test]
    fn test_server_has_no_modern_capability_and_24_8_has_all() {
        let old: Version = "18.16.1".parse().unwrap_or(Version::new(0, 0));
        let new: Version = "24.8.4.13".parse().unwrap_or(Version::new(0, 0));
        for (c, _) in CAPABILITIES {
            assert!(!old.supports(*c), "18.16 must not have {c:?}");
            assert!(new.supports(*c), "24.8 must have {c:?}");
        }
    }

    /// S1-10: engine_full for databases from 22.12, engine below.
    #[test]
    fn database_engine_full_is_used_from_22_12() {
        assert!(!Version::new(22, 11).supports(Capability::DatabaseEngineFull));
        assert!(Version::new(22, 12).supports(Capability::DatabaseEngineFull));
        assert!(Version::new(23, 1).supports(Capability::DatabaseEngineFull));
        assert!(!Version::new(18, 16).supports(Capability::DatabaseEngineFull));
    }

    /// S0-25 / decision 17: LIGHTWEIGHT from 23.4, plain SYNC REPLICA below.
    #[test]
    fn lightweight_sync_is_used_from_23_4() {
        assert!(!Version::new(23, 3).supports(Capability::SyncReplicaLightweight));
        assert!(Version::new(23, 4).supports(Capability::SyncReplicaLightweight));
    }
}
