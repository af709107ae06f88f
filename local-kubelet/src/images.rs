//! Images → programs of this machine. The repository name decides (registry and tag ignored):
//!
//! | image repository name        | program                                                       |
//! |------------------------------|---------------------------------------------------------------|
//! | `*clickhouse-server*`        | Debian's `clickhouse-server --config-file=/etc/clickhouse-server/config.xml` as `clickhouse` |
//! | `*clickhouse-keeper*`        | ZooKeeper 3.8 (`QuorumPeerMain`), zoo.cfg translated from the Keeper XML, as `zookeeper` |
//! | `*clickhouse-operator*`      | the locally built operator binary with the container's args    |
//! | `busybox`, `debian`, `ubuntu`, `alpine`, `bash` | the container's command and args, run with this machine's programs |
//! | anything else                | not started: `ErrImagePull`                                   |

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ClickHouseServer,
    Keeper,
    Operator,
    Shell,
    Unknown,
}

/// `registry:5000/org/name:tag@sha256:…` → `name`
pub fn repository_name(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or_default();
    let last = no_digest.rsplit('/').next().unwrap_or_default();
    last.split(':').next().unwrap_or_default().to_string()
}

pub fn kind(image: &str) -> Kind {
    let name = repository_name(image);
    if name.contains("clickhouse-server") {
        Kind::ClickHouseServer
    } else if name.contains("clickhouse-keeper") {
        Kind::Keeper
    } else if name.contains("clickhouse-operator") {
        Kind::Operator
    } else if matches!(
        name.as_str(),
        "busybox" | "debian" | "ubuntu" | "alpine" | "bash"
    ) {
        Kind::Shell
    } else {
        Kind::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn names() {
        assert_eq!(
            kind("clickhouse/clickhouse-server:24.8"),
            Kind::ClickHouseServer
        );
        assert_eq!(
            kind("docker.io/altinity/clickhouse-server:23.8.16.42.altinitystable"),
            Kind::ClickHouseServer
        );
        assert_eq!(
            kind("clickhouse/clickhouse-keeper:24.8-alpine"),
            Kind::Keeper
        );
        assert_eq!(
            kind("localhost:5000/clickhouse-operator:dev"),
            Kind::Operator
        );
        assert_eq!(kind("busybox:1.36"), Kind::Shell);
        assert_eq!(kind("nginx"), Kind::Unknown);
        assert_eq!(
            kind("reg:5000/x/clickhouse-server@sha256:abc"),
            Kind::ClickHouseServer
        );
    }
}
