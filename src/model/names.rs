//! Names of every object and host a cluster has, and the ports its servers listen on. Every
//! other part of the operator takes names from here, so that they are computed one way only.

/// Name of the data volume claim template of the server and Keeper StatefulSets (a replica's
/// PVC is [`data_pvc`]).
pub const DATA_VOLUME: &str = "data";

use crate::api::{ReplicaName, ShardIndex};

pub use crate::conventions::{
    DEFAULT_CLUSTER_DOMAIN, GRPC_PORT, HTTP_PORT, HTTPS_PORT, INTERSERVER_HTTP_PORT,
    INTERSERVER_HTTPS_PORT, MYSQL_PORT, POSTGRESQL_PORT, SECRET_SETTING_ENV_PREFIX, TCP_PORT,
    TCP_SECURE_PORT,
};

/// Keeper path (under the cluster's root) of the users, roles and grants created with SQL when
/// `spec.users.replicatedAccess` is on.
pub const REPLICATED_ACCESS_PATH: &str = "/clickhouse/access";
/// Client port of ClickHouse Keeper (the ZooKeeper protocol).
pub const KEEPER_CLIENT_PORT: i32 = 9181;
/// Raft port of ClickHouse Keeper: members talk to each other here.
pub const KEEPER_RAFT_PORT: i32 = 9234;
/// Keeper's secure client port (`spec.keeper.tls`).
pub const KEEPER_SECURE_CLIENT_PORT: i32 = 9281;
/// Where Keeper pods mount the cluster's certificate and CA (`spec.keeper.tls`).
pub const KEEPER_TLS_PATH: &str = "/etc/clickhouse-keeper/tls";
pub const KEEPER_CA_PATH: &str = "/etc/clickhouse-keeper/ca";

/// The operator's own ClickHouse user.
pub const OPERATOR_USER: &str = "clickhouse_operator";
/// Key of the operator's password in its generated Secret `<cluster>-operator`.
pub const OPERATOR_PASSWORD_KEY: &str = "password";
/// Key of the password of replication between the servers (`interserver_http_credentials`) in
/// `<cluster>-operator`; clusters created before it existed have none until it is added.
pub const INTERSERVER_PASSWORD_KEY: &str = "interserver-password";
/// The user of replication between the servers.
pub const INTERSERVER_USER: &str = "interserver";
/// Key of the generated `interserver_http_credentials` file in the Secret `<cluster>-users`
/// (projected into `config.d/`; read at startup only).
pub const INTERSERVER_FILE: &str = "00-operator-interserver.xml";
/// The metrics exporter's account: reads `system` tables only (decision 36).
pub const EXPORTER_USER: &str = "clickhouse_exporter";
/// Key of [`EXPORTER_USER`]'s password in `<cluster>-operator`; added to a cluster created
/// before it (its account lives in the users file, which the servers reload: no restart).
pub const EXPORTER_PASSWORD_KEY: &str = "exporter-password";
/// The key of a cluster's exporter credential (`what`: [`EXPORTER_CREDENTIAL_PASSWORD`] or
/// [`EXPORTER_CREDENTIAL_CA`]) in the one Secret the operator publishes them in for the
/// exporter (`EXPORTER_CREDENTIALS_SECRET`, decision 36): `<namespace>_<cluster>_<what>`;
/// neither a namespace nor a cluster name has `_`, so no two clusters share a key.
pub fn exporter_credential_key(namespace: &str, cluster: &str, what: &str) -> String {
    format!("{namespace}_{cluster}_{what}")
}
/// See [`exporter_credential_key`]: the exporter account's password.
pub const EXPORTER_CREDENTIAL_PASSWORD: &str = "password";
/// See [`exporter_credential_key`]: the CA the servers' certificates are verified with.
pub const EXPORTER_CREDENTIAL_CA: &str = "ca.crt";
/// The environment variable of the server container that holds the `i`-th setting of
/// `spec.configuration.secretSettings` (in the order of their paths), from its Secret key.
pub fn secret_setting_env(i: usize) -> String {
    format!("{SECRET_SETTING_ENV_PREFIX}{i}")
}
/// The profile of [`EXPORTER_USER`]: `readonly = 2` (queries only; settings such as the output
/// format may still be sent).
pub const EXPORTER_PROFILE: &str = "clickhouse_exporter";
/// The account the servers reach each other with (`remote_servers`: Distributed queries,
/// `ON CLUSTER`), accepted only from the cluster's own server pods.
pub const CLUSTER_USER: &str = "clickhouse_cluster";
/// Key of [`CLUSTER_USER`]'s password in `<cluster>-operator`; clusters created before it
/// existed have none (their servers reach each other as the operator) until it is added.
pub const CLUSTER_PASSWORD_KEY: &str = "cluster-password";
/// Key of the cluster's `<secret>` in `<cluster>-operator`: once every server reports a version
/// that has it (20.10), `remote_servers` carries it instead of an account, and a Distributed
/// query runs on the remote shards as the user who started it.
pub const CLUSTER_SECRET_KEY: &str = "cluster-secret";
/// Key of the password ClickHouse authenticates to Keeper with (digest identity
/// [`KEEPER_USER`]`:<password>`) in `<cluster>-operator`. The znodes ClickHouse creates carry an
/// ACL for that identity only, so it must never change once a cluster runs with it.
pub const KEEPER_PASSWORD_KEY: &str = "keeper-password";
/// The digest user of ClickHouse in Keeper.
pub const KEEPER_USER: &str = "clickhouse";
/// Key of the generated file with ClickHouse's Keeper identity in the Secret `<cluster>-users`
/// (projected into `config.d/`, after the file that lists the Keeper members, so that it merges
/// into their `zookeeper` section).
pub const KEEPER_IDENTITY_FILE: &str = "00-operator-zzz-keeper-identity.xml";
/// Key of the generated users file in the Secret `<cluster>-users` (projected into `users.d/`).
pub const USERS_FILE: &str = "00-operator-users.xml";
/// Key of the generated `remote_servers` file in the Secret `<cluster>-users` (projected into
/// `config.d/`: it holds the password servers use to reach each other).
pub const REMOTE_SERVERS_FILE: &str = "00-operator-remote-servers.xml";
/// Key of the Keeper configuration in the ConfigMap `<cluster>-keeper`.
pub const KEEPER_CONFIG_FILE: &str = "keeper_config.xml";

/// Where the server's data volume is mounted.
pub const SERVER_DATA_PATH: &str = "/var/lib/clickhouse";
/// Where the server's generated `config.d` is mounted.
pub const SERVER_CONFIG_D_PATH: &str = "/etc/clickhouse-server/config.d";
/// Where the server's generated `users.d` is mounted.
pub const SERVER_USERS_D_PATH: &str = "/etc/clickhouse-server/users.d";
/// Where the server writes its log files (an emptyDir: the root filesystem is read-only).
pub const SERVER_LOG_PATH: &str = "/var/log/clickhouse-server";
/// Where the further disks of `spec.storage.disks` are mounted, one folder each.
pub const SERVER_DISKS_PATH: &str = "/var/lib/clickhouse-disks";
/// The claim template (and pod volume) of the log volume, `spec.storage.logs`.
pub const LOGS_CLAIM: &str = "logs";
/// Where the server certificate Secret is mounted (`tls.crt`, `tls.key`).
pub const SERVER_TLS_PATH: &str = "/etc/clickhouse-server/tls";
/// Where the CA Secret is mounted (`ca.crt`).
pub const SERVER_CA_PATH: &str = "/etc/clickhouse-server/ca";
/// Where Keeper's configuration is mounted.
pub const KEEPER_CONFIG_PATH: &str = "/etc/clickhouse-keeper";
/// Where Keeper's data volume is mounted.
pub const KEEPER_DATA_PATH: &str = "/var/lib/clickhouse-keeper";
/// Where Keeper writes its log files (an emptyDir).
pub const KEEPER_LOG_PATH: &str = "/var/log/clickhouse-keeper";

/// Name of the StatefulSet of one server replica: `<cluster>-<shard>-<index>`, where `index` is
/// the replica's global creation index (`status.nextReplicaIndex`), never reused, so a replica
/// added later never collides with the Keeper metadata of a deleted one (invariant 8).
pub fn replica_name(cluster: &str, shard: ShardIndex, index: i64) -> ReplicaName {
    format!("{cluster}-{shard}-{index}").into()
}

/// The only pod of a replica StatefulSet, the headless Service of every server pod (every server
/// StatefulSet's `serviceName`) and a server's DNS name: defined in `util`, where the SQL side
/// finds the name a server's certificate is verified by.
pub use crate::util::names::{headless_service, replica_host, replica_pod};

/// The PVC of a replica's data volume, `data-<sts>-0`: the name Kubernetes gives the claim of
/// the StatefulSet's [`DATA_VOLUME`] template for its only pod.
pub fn data_pvc(replica: &str) -> String {
    format!("{DATA_VOLUME}-{}", replica_pod(replica))
}

/// The claim template (and pod volume) of the disk `<disk>` of `spec.storage.disks`.
pub fn disk_claim(disk: &str) -> String {
    format!("disk-{disk}")
}

/// The PVC of `replica`'s disk `<disk>`: `disk-<disk>-<sts>-0`.
pub fn disk_pvc(disk: &str, replica: &str) -> String {
    format!("{}-{}", disk_claim(disk), replica_pod(replica))
}

/// Where the disk `<disk>` is mounted, with the trailing `/` that ClickHouse's disk `path`
/// must have.
pub fn disk_path(disk: &str) -> String {
    format!("{SERVER_DISKS_PATH}/{disk}/")
}

/// Client Service of the cluster (selects the serving server pods).
pub fn client_service(cluster: &str) -> String {
    cluster.to_string()
}

/// The ConfigMap of configuration shared by every replica.
pub fn common_config(cluster: &str) -> String {
    format!("{cluster}-common")
}

/// The ConfigMap of one replica's own configuration (macros, interserver host): same name as
/// its StatefulSet.
pub fn replica_config(replica: &str) -> String {
    replica.to_string()
}

/// The generated Secrets: `<cluster>-users` with the users file (password hashes only) and
/// `<cluster>-operator` with the operator's own password (key [`OPERATOR_PASSWORD_KEY`]). They
/// are defined in `util`, where the validation of the spec finds them too.
pub use crate::util::names::{operator_secret, users_secret};

/// PodDisruptionBudget of the server pods of one shard.
pub fn shard_pdb(cluster: &str, shard: ShardIndex) -> String {
    format!("{cluster}-shard-{shard}")
}

/// The Keeper StatefulSet, its ConfigMap, its client Service and its PodDisruptionBudget.
pub fn keeper(cluster: &str) -> String {
    format!("{cluster}-keeper")
}

/// NetworkPolicy of the server pods.
pub fn server_network_policy(cluster: &str) -> String {
    format!("{cluster}-server")
}

/// NetworkPolicy of the Keeper pods.
pub fn keeper_network_policy(cluster: &str) -> String {
    format!("{cluster}-keeper")
}

/// Headless Service of the Keeper pods.
pub fn keeper_headless_service(cluster: &str) -> String {
    format!("{cluster}-keeper-headless")
}

/// DNS name of Keeper member `ordinal` (0-based): its raft id is `ordinal + 1`.
pub fn keeper_host(cluster: &str, namespace: &str, domain: &str, ordinal: i32) -> String {
    format!(
        "{}-{ordinal}.{}.{namespace}.svc.{domain}",
        keeper(cluster),
        keeper_headless_service(cluster)
    )
}

/// Key in `<cluster>-users` of a `users.d` file of `spec.configuration.files`.
pub fn users_d_key(file: &str) -> String {
    format!("users-d.{file}")
}

/// The Service of one replica for clients that pin it (`spec.clientService.perReplica`).
pub fn replica_client_service(replica: &str) -> String {
    format!("{replica}-client")
}

/// DNS name of the client Service: the cluster's endpoint inside Kubernetes.
pub fn client_host(cluster: &str, namespace: &str, domain: &str) -> String {
    format!("{}.{namespace}.svc.{domain}", client_service(cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_documented_patterns() {
        assert_eq!(replica_name("c1", ShardIndex(1), 2), "c1-1-2");
        assert_eq!(replica_pod("c1-1-2"), "c1-1-2-0");
        assert_eq!(
            replica_host("c1", "t1", DEFAULT_CLUSTER_DOMAIN, "c1-0-0"),
            "c1-0-0-0.c1-headless.t1.svc.cluster.local"
        );
        assert_eq!(
            keeper_host("c1", "t1", DEFAULT_CLUSTER_DOMAIN, 2),
            "c1-keeper-2.c1-keeper-headless.t1.svc.cluster.local"
        );
        assert_eq!(
            client_host("c1", "t1", DEFAULT_CLUSTER_DOMAIN),
            "c1.t1.svc.cluster.local"
        );
        assert_eq!(
            replica_host("c1", "t1", "corp.example", "c1-0-0"),
            "c1-0-0-0.c1-headless.t1.svc.corp.example"
        );
        assert_eq!(shard_pdb("c1", ShardIndex(0)), "c1-shard-0");
        assert_eq!(data_pvc("c1-1-2"), "data-c1-1-2-0");
    }

    /// S0-11: a name is derived from the creation index, so a new index never gives an old name.
    #[test]
    fn distinct_indexes_give_distinct_names() {
        let names: std::collections::BTreeSet<_> = (0..3)
            .flat_map(|s| {
                (0..50).map(move |i| replica_name("c1", ShardIndex(s), i64::from(s) * 50 + i))
            })
            .collect();
        assert_eq!(names.len(), 150);
    }

    /// The longest cluster name (40) still gives DNS-label names for every object.
    #[test]
    fn names_of_the_longest_cluster_stay_dns_labels() {
        let c = "a".repeat(crate::api::validate::MAX_CLUSTER_NAME_LEN);
        for n in [
            replica_pod(&replica_name(&c, ShardIndex(99), 9_999_999)),
            keeper_headless_service(&c),
            shard_pdb(&c, ShardIndex(99)),
            format!("{}-99", keeper(&c)),
        ] {
            assert!(crate::util::names::is_dns_label(&n), "{n}");
        }
    }
}
