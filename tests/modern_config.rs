//! The server configuration and users files the operator generates load in a current ClickHouse
//! engine (docs/testing.md, "What is proven on which ClickHouse"): chDB 4.4, the ClickHouse 26.x
//! engine as a Python module (installed from PyPI by `hack/chdb.sh`), is started on them with
//! `chdb.connect(':memory:?config-file=…')`, and its own system tables are read back.
//!
//! Layout: one replica's files are written into a temporary folder as the server pod has them
//! under `/etc/clickhouse-server` (see `src/model/statefulset.rs`): `config.d/` holds the common
//! ConfigMap (the operator's files and `spec.configuration.files`), the replica's own ConfigMap
//! and `remote_servers` from the users Secret; `users.d/` holds the users file from the users
//! Secret. Underneath lie a small `config.xml` and `users.xml` standing in for the image's own
//! (the parts the generated files override or rely on: ports, `openSSL`, an example cluster,
//! `user_directories`, the passwordless `default` user). Test-only files, named `zz-test.xml` so
//! they merge last, only move the log files into the temporary folder (chDB honours `logger`,
//! and would otherwise write into `/var/log/clickhouse-server`), let the `default` user read the
//! access system tables (`access_management`) and show password hashes
//! (`display_secrets_in_show_and_select`); the TLS test also moves the certificate paths.
//!
//! What the 26.x engine proves here: every generated file merges (malformed XML fails the
//! load, see the negative tests); the users file is accepted, including every profile setting
//! (an unknown setting name fails the load); `system.clusters` lists exactly the cluster of the
//! spec with the pods' DNS names, the secure port with TLS and the operator's user;
//! `system.macros` and `interserver_http_host` are the replica's; profiles, quotas, users, their
//! profiles, networks and SHA-256 password hashes are what the spec and the Secrets say;
//! settings of the settings file and nested settings (`merge_tree/…`) are in force; the Keeper
//! nodes are the ones ReplicatedMergeTree tries; the generated `openSSL` server and client
//! sections build TLS contexts (with a test certificate), and an invalid value there is refused.
//!
//! What it does not prove: chDB has no network listeners, so ports are parsed, not served, and
//! `listen_host` is not exercised; nobody logs in (chDB's session is always `default`), so
//! passwords are compared as hashes, not used; the Keeper and pod hosts do not resolve here, so
//! nothing is replicated; chDB does not apply `max_concurrent_queries` (it reports 0 whatever
//! the file says) and forces `logger.level` to `trace`, so neither can be read back; what a
//! real 26.x server does at startup beyond loading the configuration (binding ports, the
//! `path`, access storage on disk) is not run.
//!
//! Where things are: `modern_config/support.rs` has the stand-ins for the image's files, the
//! layout, chDB's run and the clusters the tests build; the tests are in `modern_config/`, by
//! topic: `clusters.rs` (`system.clusters`, macros, Keeper members), `settings.rs` (settings,
//! profiles, quotas, users, custom files, the negative tests, secret settings), `tls.rs`,
//! `accounts.rs` (the cluster secret, the operator's and the exporter's grants, hashed passwords,
//! users managed with SQL), `backups.rs` (named collections), `logging.rs` (the server log and
//! the system log tables) and `ports_and_disks.rs` (the servers' own Prometheus endpoint, client
//! protocols, disks and storage policies) and `restores.rs` (what a restore creates for views
//! and replicated tables).

mod chdb;
#[path = "modern_config/support.rs"]
mod support;

#[path = "modern_config/accounts.rs"]
mod accounts;
#[path = "modern_config/backups.rs"]
mod backups;
#[path = "modern_config/clusters.rs"]
mod clusters;
#[path = "modern_config/logging.rs"]
mod logging;
#[path = "modern_config/ports_and_disks.rs"]
mod ports_and_disks;
#[path = "modern_config/restores.rs"]
mod restores;
#[path = "modern_config/settings.rs"]
mod settings;
#[path = "modern_config/tls.rs"]
mod tls;
