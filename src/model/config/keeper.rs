//! Keeper's `keeper_config.xml`: the client port, the member's own raft id (from the
//! environment: ordinal + 1, computed by the container's command) and the raft configuration
//! listing every member by DNS name.

use super::xml::{Element, ROOT};
use crate::model::{Cluster, names};

/// Environment variable from which Keeper reads its raft id.
pub const SERVER_ID_ENV: &str = "KEEPER_SERVER_ID";

/// The four-letter-word commands a member answers (decision 27): `ruok`, `srvr` (the readiness
/// probe: a member is Ready once it says its Mode), `mntr` (the exporter). Not the default list,
/// which includes commands that reset statistics, take snapshots or yield leadership.
pub const FOUR_LETTER_WORDS: &str = "ruok,srvr,mntr";

/// The Keeper configuration for an ensemble of `members` (ids 1..=members).
pub fn keeper_file(c: &Cluster<'_>, members: i32) -> String {
    keeper_element(c, members, true).to_document()
}

/// What of [`keeper_file`] is read only at startup: everything but the member list, which
/// Keeper reconfigures at runtime when the file changes. Hashed into the Keeper pod template.
/// The four-letter-word list and the operator's `startup_timeout` are left out of it: they
/// came with operator versions after ensembles already ran without them, and an operator
/// upgrade restarts no pod (invariant 9), so they reach a running member at its next restart.
pub fn keeper_restart_part(c: &Cluster<'_>) -> String {
    keeper_element(c, 0, false).to_document()
}

/// Keeper's `startup_timeout` (ms) unless `spec.keeper.settings` names one: half of
/// `spec.keeper.pod.startupSeconds` when it is set, else half of the base budget (60 s), 30 s.
/// Keeper opens its client port only once it has a quorum, or once this timeout has passed
/// (180 s by default) after it loaded its state; the startup probe checks that port, so with
/// Keeper's default a member that waits longer than the probe's budget for its peers (members
/// started a minute apart, a member added on scale-up) would be killed and crash-loop. With
/// this timeout the port opens in time and the readiness probe (`srvr`) keeps the member unready
/// until it serves; the default budget adds the time to load the state on top
/// ([`crate::api::KeeperSpec::startup_seconds`], decision 67).
pub fn startup_timeout_ms(c: &Cluster<'_>) -> i64 {
    let seconds = c
        .spec
        .keeper
        .pod
        .startup_seconds
        .unwrap_or(crate::api::DEFAULT_KEEPER_STARTUP_SECONDS);
    i64::from(seconds) * 1000 / 2
}

/// `coordination_settings`: the operator's defaults (in their order, which the hash of
/// running ensembles was taken over), each replaced by `spec.keeper.settings` where it names
/// it, then the other settings of the spec (names that are not element names were refused by
/// validation and are left out).
fn coordination_settings(c: &Cluster<'_>, added_later: bool) -> Element {
    let user = &c.spec.keeper.settings;
    let defaults = [
        ("operation_timeout_ms", "10000"),
        ("session_timeout_ms", "30000"),
        ("raft_logs_level", "warning"),
    ];
    let mut out = Element::new("coordination_settings");
    for (k, v) in defaults {
        out = out.child(Element::leaf(k, user.get(k).map_or(v, String::as_str)));
    }
    for (k, v) in user {
        if !defaults.iter().any(|(d, _)| d == k) && super::xml::is_element_name(k) {
            out = out.child(Element::leaf(k, v));
        }
    }
    if added_later && !user.contains_key(STARTUP_TIMEOUT) {
        out = out.child(Element::leaf(STARTUP_TIMEOUT, startup_timeout_ms(c)));
    }
    out
}

/// The coordination setting of [`startup_timeout_ms`].
pub const STARTUP_TIMEOUT: &str = "startup_timeout";

/// The configuration; `added_later`: with what came after ensembles already ran (the
/// four-letter-word list and the operator's `startup_timeout`), which is left out of
/// [`keeper_restart_part`].
fn keeper_element(c: &Cluster<'_>, members: i32, added_later: bool) -> Element {
    let data = names::KEEPER_DATA_PATH;
    let servers = (0..members).map(|i| {
        Element::new("server")
            .child(Element::leaf("id", i + 1))
            .child(Element::leaf(
                "hostname",
                names::keeper_host(c.name, c.namespace, c.spec.cluster_domain(), i),
            ))
            .child(Element::leaf("port", names::KEEPER_RAFT_PORT))
    });
    let tls = c.spec.keeper.tls;
    let mut keeper_server = Element::new("keeper_server")
        .child(Element::leaf("tcp_port", names::KEEPER_CLIENT_PORT))
        .children(tls.then(|| Element::leaf("tcp_port_secure", names::KEEPER_SECURE_CLIENT_PORT)))
        .child(Element::new("server_id").attr("from_env", SERVER_ID_ENV))
        .child(Element::leaf(
            "log_storage_path",
            format!("{data}/coordination/log"),
        ))
        .child(Element::leaf(
            "snapshot_storage_path",
            format!("{data}/coordination/snapshots"),
        ))
        .child(coordination_settings(c, added_later));
    if added_later {
        keeper_server = keeper_server.child(Element::leaf(
            "four_letter_word_white_list",
            FOUR_LETTER_WORDS,
        ));
    }
    if members > 0 {
        keeper_server = keeper_server.child(
            Element::new("raft_configuration")
                .children(tls.then(|| Element::leaf("secure", "true")))
                .children(servers),
        );
    }
    Element::new(ROOT)
        .child(
            Element::new("logger")
                .child(Element::leaf("level", "information"))
                .child(Element::leaf(
                    "log",
                    format!("{}/clickhouse-keeper.log", names::KEEPER_LOG_PATH),
                ))
                .child(Element::leaf(
                    "errorlog",
                    format!("{}/clickhouse-keeper.err.log", names::KEEPER_LOG_PATH),
                ))
                .child(Element::leaf("size", "100M"))
                .child(Element::leaf("count", 3))
                .child(Element::leaf("console", 1)),
        )
        .child(Element::leaf("listen_host", "::"))
        .child(Element::leaf("listen_host", "0.0.0.0"))
        .child(Element::leaf("listen_try", 1))
        .child(Element::leaf("path", data))
        .child(keeper_server)
        .children(tls.then(open_ssl))
}

/// Keeper's `openSSL` with `spec.keeper.tls`: the cluster's certificate for the secure client
/// port and for raft, where every member is server and client of the others; both sides verify
/// the peer's certificate against the cluster's CA (`relaxed`: a chain to that CA, the client
/// side also refusing any other certificate).
fn open_ssl() -> Element {
    let common = |e: Element| {
        e.child(Element::leaf(
            "caConfig",
            format!("{}/ca.crt", names::KEEPER_CA_PATH),
        ))
        .child(Element::leaf("loadDefaultCAFile", "false"))
        .child(Element::leaf("cacheSessions", "true"))
        .child(Element::leaf(
            "disableProtocols",
            "sslv2,sslv3,tlsv1,tlsv1_1",
        ))
        .child(Element::leaf("preferServerCiphers", "true"))
    };
    let cert = |e: Element| {
        e.child(Element::leaf(
            "certificateFile",
            format!("{}/tls.crt", names::KEEPER_TLS_PATH),
        ))
        .child(Element::leaf(
            "privateKeyFile",
            format!("{}/tls.key", names::KEEPER_TLS_PATH),
        ))
        .child(Element::leaf("verificationMode", "relaxed"))
    };
    Element::new("openSSL")
        .child(common(cert(Element::new("server"))))
        .child(
            common(cert(Element::new("client"))).child(
                Element::new("invalidCertificateHandler")
                    .child(Element::leaf("name", "RejectCertificateHandler")),
            ),
        )
}
