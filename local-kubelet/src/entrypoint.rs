//! The images' entrypoints, emulated: the scripts the agent writes and bind-mounts read-only
//! into a container (`/entrypoint.sh`, and for Keeper the emulated `clickhouse-keeper` program
//! that starts the ZooKeeper stand-in behind its gate).
//!
//! - `clickhouse/clickhouse-keeper` (`docker/keeper/entrypoint.sh`, non-root path): creates
//!   `$DATA_DIR` (`CLICKHOUSE_DATA_DIR`, default `/var/lib/clickhouse`), `$LOG_DIR`,
//!   `$DATA_DIR/coordination{,/log,/snapshots}` or exits 1 ("Couldn't create necessary
//!   directory: …"), checks each is a readable and writable folder ("Necessary directory '…'
//!   isn't accessible by user with id '…'"), `cd "$DATA_DIR"`, then runs Keeper.
//! - `clickhouse/clickhouse-server` (`docker/server/entrypoint.sh`, 24.x–26.x, non-root path):
//!   creates the folders the configuration names, copies `users.xml` to `/tmp`, and unless
//!   `CLICKHOUSE_SKIP_USER_SETUP=1` is honoured (25.1 and newer) writes
//!   `users.d/default-user.xml` when `CLICKHOUSE_USER`/`CLICKHOUSE_PASSWORD`/
//!   `CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT` ask for it; then runs the server.
//! - `-distroless` tags run `clickhouse docker-init` instead (no shell in the image): the same
//!   steps, but a folder it cannot create is only logged.

use crate::keeper::{self, KeeperConfig};
use crate::util::shell_quote;

/// Where the emulated Keeper program and the ZooKeeper files are, inside the container.
pub const ZK_CONF: &str = "/etc/zookeeper/conf";
/// The emulated `clickhouse-keeper` program.
pub const KEEPER_PROGRAM: &str = "/etc/zookeeper/conf/clickhouse-keeper";
/// The agent's own binary inside a Keeper container (for `keeper-gate`).
pub const AGENT_IN_CONTAINER: &str = "/etc/zookeeper/conf/local-kubelet";

/// `mkdir -p` and (non-root) the access check of each folder; a failure exits 1, or with
/// `log_only` (docker-init) is only written to stderr.
fn ensure_dirs(dirs: &str, check_access: bool, log_only: bool) -> String {
    let fail = if log_only { "" } else { "; exit 1" };
    let mut s = format!(
        "for dir in {dirs}\ndo\n    [ -z \"$dir\" ] && continue\n    \
         if ! mkdir -p \"$dir\"; then\n        echo \"Couldn't create necessary directory: $dir\"{fail}\n    fi\n"
    );
    if check_access {
        s.push_str(&format!(
            "    if [ \"$USER\" != 0 ] && ! test -d \"$dir\" -a -w \"$dir\" -a -r \"$dir\"; then\n        \
             echo \"Necessary directory '$dir' isn't accessible by user with id '$USER'\"{fail}\n    fi\n"
        ));
    }
    s.push_str("done\n");
    s
}

/// The Keeper image's `/entrypoint.sh` (or, `distroless`, its `docker-init --keeper`).
pub fn keeper_entrypoint(distroless: bool) -> String {
    let mut s = String::from(
        "#!/bin/bash\n# clickhouse/clickhouse-keeper's entrypoint, emulated by local-kubelet\n\
         set -eo pipefail\nshopt -s nullglob\n\nUSER=\"$(id -u)\"\nGROUP=\"$(id -g)\"\n\
         KEEPER_CONFIG=\"${KEEPER_CONFIG:-/etc/clickhouse-keeper/keeper_config.xml}\"\n\n\
         if [ -f \"$KEEPER_CONFIG\" ] && ! test -f \"$KEEPER_CONFIG\" -a -r \"$KEEPER_CONFIG\"; then\n    \
         echo \"Configuration file '$KEEPER_CONFIG' isn't readable by user with id '$USER'\"\n    exit 1\nfi\n\n\
         DATA_DIR=\"${CLICKHOUSE_DATA_DIR:-/var/lib/clickhouse}\"\n\
         LOG_DIR=\"${LOG_DIR:-/var/log/clickhouse-keeper}\"\n\
         COORDINATION_DIR=\"${DATA_DIR}/coordination\"\n\
         COORDINATION_LOG_DIR=\"${DATA_DIR}/coordination/log\"\n\
         COORDINATION_SNAPSHOT_DIR=\"${DATA_DIR}/coordination/snapshots\"\n\
         CLICKHOUSE_WATCHDOG_ENABLE=${CLICKHOUSE_WATCHDOG_ENABLE:-0}\n\n",
    );
    s.push_str(&ensure_dirs(
        "\"$DATA_DIR\" \"$LOG_DIR\" \"${TMP_DIR:-}\" \"$COORDINATION_DIR\" \"$COORDINATION_LOG_DIR\" \"$COORDINATION_SNAPSHOT_DIR\"",
        true,
        distroless,
    ));
    s.push_str(&format!(
        "\nif [[ $# -lt 1 ]] || [[ \"$1\" == \"--\"* ]]; then\n    export CLICKHOUSE_WATCHDOG_ENABLE\n    \
         cd \"${{DATA_DIR}}\"{}\n    exec {KEEPER_PROGRAM} --config-file=\"$KEEPER_CONFIG\" \"$@\"\nfi\n\nexec \"$@\"\n",
        if distroless { " 2>/dev/null || true" } else { "" }
    ));
    s
}

/// The emulated `clickhouse-keeper --config-file=…`: takes the member's id from `server_id`
/// now (a literal, or `from_env` read from this process's environment), refuses what Keeper
/// refuses, writes ZooKeeper's `myid` and `zoo.cfg` into Keeper's state folder, starts the gate
/// on the client port and execs ZooKeeper on the loopback port behind it.
pub fn keeper_program(kc: &KeeperConfig, java: &[String]) -> String {
    let data = keeper::state_dir(kc);
    let ids: Vec<String> = kc.servers.iter().map(|(id, _, _)| id.to_string()).collect();
    let port = kc.tcp_port.unwrap_or(9181);
    let internal = keeper::internal_client_port(kc);
    let timeout = kc
        .startup_timeout_ms
        .unwrap_or(keeper::DEFAULT_STARTUP_TIMEOUT_MS);
    let java: Vec<String> = java.iter().map(|a| shell_quote(a)).collect();
    format!(
        r#"#!/bin/bash
# clickhouse-keeper, emulated by local-kubelet: ZooKeeper 3.8 behind Keeper's client port
ID_ENV={id_env}
ID_LITERAL={id_literal}
IDS=' {ids} '
DATA={data}
if [ -n "$ID_ENV" ]; then
    if [ -z "${{!ID_ENV+x}}" ]; then
        echo "<Error> Application: keeper_server.server_id: environment variable $ID_ENV (from_env) is not set" >&2
        exit 1
    fi
    id="${{!ID_ENV}}"
else
    id="$ID_LITERAL"
fi
case "$id" in
    ''|0*|*[!0-9]*)
        echo "<Error> Application: keeper_server.server_id: '$id' is not a positive integer" >&2
        exit 1 ;;
esac
if [ "$IDS" != '  ' ] && [[ "$IDS" != *" $id "* ]]; then
    echo "<Error> Application: Our server id $id not found in raft_configuration section" >&2
    exit 1
fi
if ! mkdir -p "$DATA" || ! printf '%s\n' "$id" > "$DATA/myid"; then
    echo "<Error> Application: cannot write Keeper's state in $DATA" >&2
    exit 1
fi
rm -f "$DATA"/zoo.cfg "$DATA"/zoo.cfg.*
cp {conf}/zoo.cfg "$DATA/zoo.cfg"
{agent} keeper-gate --port {port} --upstream 127.0.0.1:{internal} --startup-timeout-ms {timeout} &
exec {java} "$DATA/zoo.cfg"
"#,
        id_env = shell_quote(kc.server_id_env.as_deref().unwrap_or_default()),
        id_literal = shell_quote(kc.server_id.as_deref().unwrap_or_default()),
        ids = ids.join(" "),
        data = shell_quote(&data),
        conf = ZK_CONF,
        agent = AGENT_IN_CONTAINER,
        java = java.join(" "),
    )
}

/// The folders the server image's entrypoint creates, from the merged server configuration
/// (`config.xml` first, then `config.d/*.xml` in name order): `path`, `tmp_path`,
/// `user_files_path`, `format_schema_path` (the server's defaults when absent), the logger's
/// `log`/`errorlog` folders, `storage_configuration/disks/*/path|metadata_path`.
fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.has_tag_name(name))
}

pub fn server_dirs(files: &[String]) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut keys: BTreeMap<String, String> = BTreeMap::new();
    let mut disks: BTreeMap<String, String> = BTreeMap::new();
    for text in files {
        let Ok(doc) = roxmltree::Document::parse(text) else {
            continue;
        };
        let root = doc.root_element();
        let text_of = |n: roxmltree::Node<'_, '_>| n.text().unwrap_or_default().trim().to_string();
        for k in ["path", "tmp_path", "user_files_path", "format_schema_path"] {
            if let Some(n) = child(root, k) {
                keys.insert(k.into(), text_of(n));
            }
        }
        if let Some(l) = child(root, "logger") {
            for k in ["log", "errorlog"] {
                if let Some(n) = child(l, k) {
                    keys.insert(format!("logger.{k}"), text_of(n));
                }
            }
        }
        if let Some(d) = child(root, "storage_configuration").and_then(|s| child(s, "disks")) {
            for disk in d.children().filter(|c| c.is_element()) {
                for k in ["path", "metadata_path"] {
                    if let Some(n) = child(disk, k) {
                        disks.insert(format!("{}.{k}", disk.tag_name().name()), text_of(n));
                    }
                }
            }
        }
    }
    let path = keys
        .get("path")
        .cloned()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/var/lib/clickhouse/".into());
    let under = |sub: &str| format!("{}/{sub}/", path.trim_end_matches('/'));
    let mut out = vec![
        path.clone(),
        keys.get("tmp_path")
            .cloned()
            .unwrap_or_else(|| under("tmp")),
        keys.get("user_files_path")
            .cloned()
            .unwrap_or_else(|| under("user_files")),
        keys.get("format_schema_path")
            .cloned()
            .unwrap_or_else(|| under("format_schemas")),
    ];
    for k in ["logger.errorlog", "logger.log"] {
        if let Some(f) = keys.get(k).filter(|f| !f.is_empty()) {
            let dir = std::path::Path::new(f)
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            out.insert(1, dir);
        }
    }
    out.extend(disks.into_values());
    out.retain(|d| !d.is_empty());
    out
}

/// The server image's `/entrypoint.sh` (or, `distroless`, its `docker-init`). `skip_honoured`:
/// the image knows `CLICKHOUSE_SKIP_USER_SETUP` (25.1 and newer).
pub fn server_entrypoint(dirs: &[String], skip_honoured: bool, distroless: bool) -> String {
    let quoted: Vec<String> = dirs.iter().map(|d| shell_quote(d)).collect();
    let mut s = String::from(
        "#!/bin/bash\n# clickhouse/clickhouse-server's entrypoint, emulated by local-kubelet\n\
         set -eo pipefail\nshopt -s nullglob\n\nUSER=\"$(id -u)\"\nGROUP=\"$(id -g)\"\n\
         CLICKHOUSE_CONFIG=\"${CLICKHOUSE_CONFIG:-/etc/clickhouse-server/config.xml}\"\n\
         # the folders of the configuration (read when the container was created)\n",
    );
    s.push_str(&ensure_dirs(&quoted.join(" \\\n  "), false, distroless));
    s.push_str(&format!(
        r#"
CLICKHOUSE_USER="${{CLICKHOUSE_USER:-default}}"
CLICKHOUSE_PASSWORD="${{CLICKHOUSE_PASSWORD:-}}"
CLICKHOUSE_ACCESS_MANAGEMENT="${{CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT:-0}}"

# manage_clickhouse_user
cp /etc/clickhouse-server/users.xml /tmp
if [ {skip} = 1 ] && [ "${{CLICKHOUSE_SKIP_USER_SETUP:-0}}" = 1 ]; then
    echo "$0: explicitly skip changing user 'default'"
elif [ -n "$CLICKHOUSE_USER" ] && [ "$CLICKHOUSE_USER" != "default" ] || [ -n "$CLICKHOUSE_PASSWORD" ] || [ "$CLICKHOUSE_ACCESS_MANAGEMENT" != "0" ]; then
    echo "$0: create new user '$CLICKHOUSE_USER' instead 'default'"
    cat <<EOT > /etc/clickhouse-server/users.d/default-user.xml
    <clickhouse>
      <users>
        <default remove="remove">
        </default>
        <${{CLICKHOUSE_USER}}>
          <profile>default</profile>
          <networks>
            <ip>::/0</ip>
          </networks>
          <password>${{CLICKHOUSE_PASSWORD}}</password>
          <quota>default</quota>
          <access_management>${{CLICKHOUSE_ACCESS_MANAGEMENT}}</access_management>
        </${{CLICKHOUSE_USER}}>
      </users>
    </clickhouse>
EOT
fi

if [[ $# -lt 1 ]] || [[ "$1" == "--"* ]]; then
    CLICKHOUSE_WATCHDOG_ENABLE=${{CLICKHOUSE_WATCHDOG_ENABLE:-0}}
    export CLICKHOUSE_WATCHDOG_ENABLE
    exec /usr/sbin/clickhouse-server --config-file="$CLICKHOUSE_CONFIG" "$@"
fi

exec "$@"
"#,
        skip = if skip_honoured { 1 } else { 0 },
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn sh(script: &str, env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
        let dir = std::env::temp_dir().join(format!(
            "lk-ep-{}-{}",
            std::process::id(),
            script.len() ^ env.len()
        ));
        let _ = std::fs::create_dir_all(&dir);
        let f = dir.join("ep.sh");
        std::fs::write(&f, script).unwrap();
        let out = Command::new("bash")
            .arg(&f)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    #[test]
    fn keeper_entrypoint_creates_its_folders_or_exits() {
        let base = std::env::temp_dir().join(format!("lk-kep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let data = base.join("data");
        let logs = base.join("logs");
        let ep = keeper_entrypoint(false);
        // a command is run after the checks
        let (code, out) = sh(
            &ep,
            &[
                ("CLICKHOUSE_DATA_DIR", data.to_str().unwrap()),
                ("LOG_DIR", logs.to_str().unwrap()),
            ],
            &["sh", "-c", "pwd; echo ran"],
        );
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("ran"), "{out}");
        assert!(data.join("coordination/snapshots").is_dir());
        assert!(data.join("coordination/log").is_dir());
        // a folder it cannot create
        let blocked = base.join("file");
        std::fs::write(&blocked, "").unwrap();
        let (code, out) = sh(
            &ep,
            &[
                ("CLICKHOUSE_DATA_DIR", blocked.to_str().unwrap()),
                ("LOG_DIR", logs.to_str().unwrap()),
            ],
            &["true"],
        );
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains(&format!(
                "Couldn't create necessary directory: {}",
                blocked.display()
            )),
            "{out}"
        );
        // docker-init (distroless) only logs it
        let (code, out) = sh(
            &keeper_entrypoint(true),
            &[
                ("CLICKHOUSE_DATA_DIR", blocked.to_str().unwrap()),
                ("LOG_DIR", logs.to_str().unwrap()),
            ],
            &["true"],
        );
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("Couldn't create necessary directory"), "{out}");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn keeper_program_takes_its_id_at_start() {
        let mut kc = KeeperConfig::default();
        keeper::merge(
            &mut kc,
            r#"<clickhouse><keeper_server><tcp_port>9181</tcp_port><server_id from_env="KEEPER_SERVER_ID"/>
            <raft_configuration><server><id>1</id><hostname>a</hostname></server><server><id>2</id><hostname>b</hostname></server></raft_configuration>
            </keeper_server></clickhouse>"#,
        )
        .unwrap();
        let prog = keeper_program(&kc, &["echo".into(), "java".into()]);
        let (code, out) = sh(&prog, &[], &[]);
        assert_eq!(code, 1);
        assert!(
            out.contains("KEEPER_SERVER_ID (from_env) is not set"),
            "{out}"
        );
        let (code, out) = sh(&prog, &[("KEEPER_SERVER_ID", "x1")], &[]);
        assert_eq!(code, 1);
        assert!(out.contains("not a positive integer"), "{out}");
        let (code, out) = sh(&prog, &[("KEEPER_SERVER_ID", "3")], &[]);
        assert_eq!(code, 1);
        assert!(out.contains("Our server id 3 not found"), "{out}");
        assert!(prog.contains("--upstream 127.0.0.1:2181 --startup-timeout-ms 180000"));
        assert!(prog.contains("DATA='/var/lib/clickhouse-keeper/coordination'"));
    }

    #[test]
    fn server_entrypoint_folders_and_user_setup() {
        let dirs = server_dirs(&[
            "<yandex><path>/var/lib/clickhouse/</path><tmp_path>/var/lib/clickhouse/tmp/</tmp_path>\
             <logger><log>/var/log/clickhouse-server/clickhouse-server.log</log></logger></yandex>"
                .into(),
            "<clickhouse><storage_configuration><disks><d1><path>/var/lib/clickhouse-disks/d1/</path></d1></disks></storage_configuration></clickhouse>"
                .into(),
        ]);
        assert_eq!(
            dirs,
            [
                "/var/lib/clickhouse/",
                "/var/log/clickhouse-server",
                "/var/lib/clickhouse/tmp/",
                "/var/lib/clickhouse/user_files/",
                "/var/lib/clickhouse/format_schemas/",
                "/var/lib/clickhouse-disks/d1/",
            ]
        );
        let old = server_entrypoint(&[], false, false);
        let new = server_entrypoint(&[], true, false);
        assert!(old.contains("if [ 0 = 1 ] && [ \"${CLICKHOUSE_SKIP_USER_SETUP:-0}\" = 1 ]"));
        assert!(new.contains("if [ 1 = 1 ] && [ \"${CLICKHOUSE_SKIP_USER_SETUP:-0}\" = 1 ]"));
        assert!(new.contains("cp /etc/clickhouse-server/users.xml /tmp\n"));
        let base = std::env::temp_dir().join(format!("lk-sep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("f"), "").unwrap();
        let blocked = base.join("f/data");
        let ep = server_entrypoint(&[blocked.display().to_string()], true, false);
        let (code, out) = sh(&ep, &[], &["true"]);
        assert_eq!(code, 1);
        assert!(out.contains("Couldn't create necessary directory"), "{out}");
        let _ = std::fs::remove_dir_all(&base);
    }
}
