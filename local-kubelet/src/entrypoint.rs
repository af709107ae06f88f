//! The images' entrypoints, emulated: the scripts the agent writes and bind-mounts read-only
//! into a container (`/entrypoint.sh`, and for Keeper the emulated `clickhouse-keeper` program
//! that starts the ZooKeeper stand-in behind its gate).
//!
//! - `clickhouse/clickhouse-keeper` (`docker/keeper/entrypoint.sh`, non-root path): creates
//!   `$DATA_DIR` (`CLICKHOUSE_DATA_DIR`, default `/var/lib/clickhouse`), `$LOG_DIR`,
//!   `$DATA_DIR/coordination{,/log,/snapshots}` or exits 1 ("Couldn't create necessary
//!   directory: …"), checks each is a readable and writable folder ("Necessary directory '…'
//!   isn't accessible by user with id '…'"), `cd "$DATA_DIR"`, then runs Keeper.
//! - `clickhouse/clickhouse-server` (`docker/server/entrypoint.sh`, 24.x–26.x): started as root
//!   (the image has no `USER`) it takes the `clickhouse` user (101:101), creates the folders the
//!   configuration names and gives them to that user (`chown -R` where the owner differs);
//!   started as another user it runs `clickhouse su "$(id -u):$(id -g)" mkdir -p` for each
//!   folder. Then it copies `users.xml` to `/tmp`, and unless `CLICKHOUSE_SKIP_USER_SETUP=1` is
//!   honoured (25.1 and newer) writes `users.d/default-user.xml` when `CLICKHOUSE_USER`/
//!   `CLICKHOUSE_PASSWORD`/`CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT` ask for it; then runs the
//!   server through `clickhouse su "$USER:$GROUP"`. `clickhouse su` is emulated
//!   ([`CLICKHOUSE_SU`]) as `programs/su/su.cpp` behaves, with the group-0 bug of the images
//!   built before ClickHouse #71626 ([`crate::images::su_takes_numeric_group`]).
//! - `clickhouse/clickhouse-keeper` started as root: the same switch to 101:101 (`su-exec`),
//!   after giving it its folders.
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
    s.push_str(
        "    if [ \"${DO_CHOWN:-0}\" = 1 ] && { [ \"$(stat -c %u \"$dir\")\" != \"$USER\" ] || [ \"$(stat -c %g \"$dir\")\" != \"$GROUP\" ]; }; then\n        \
         chown -R \"$USER:$GROUP\" \"$dir\"\n    fi\n",
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

/// `clickhouse su USER:GROUP COMMAND…` as `programs/su/su.cpp` does it, as a shell function
/// (`exec`s the command): the group first, then the user; a number that is 0 or not a number
/// is looked up by name (`getgrnam_r`/`getpwnam_r`), and with `SU_BY_ID=1` (the fix of
/// ClickHouse #71626) by id when no such name exists; a name not found is "Group 0 is not
/// found in the system" (exit 36, `BAD_ARGUMENTS`). Dropping to id 0 when not 0 is refused;
/// `setgid`/`setuid` to another id than its own fails when not root (EPERM, exit 1000 & 255).
pub const CLICKHOUSE_SU: &str = r#"clickhouse_su() {
    local spec="$1"; shift
    local u="${spec%%:*}" g="" gid uid entry
    [[ "$spec" == *:* ]] && g="${spec#*:}"
    if [ -n "$g" ]; then
        gid="$g"
        if ! [[ "$g" =~ ^[0-9]+$ ]] || [ "$g" = 0 ]; then
            gid=""; entry="$(getent group -- "$g" 2>/dev/null | head -n 1)" || entry=""
            [ "${entry%%:*}" = "$g" ] && gid="$(cut -d: -f3 <<< "$entry")"
            if [ -z "$gid" ] && [ "$SU_BY_ID" = 1 ] && [[ "$g" =~ ^[0-9]+$ ]] && getent group -- "$g" >/dev/null 2>&1; then
                gid="$g"
            fi
            if [ -z "$gid" ]; then
                echo "Code: 36. DB::Exception: Group $g is not found in the system. (BAD_ARGUMENTS)" >&2
                exit 36
            fi
        fi
        if [ "$gid" = 0 ] && [ "$(id -g)" != 0 ]; then
            echo "Code: 36. DB::Exception: Group has id 0, but dropping privileges to gid 0 does not make sense. (BAD_ARGUMENTS)" >&2
            exit 36
        fi
        if [ "$(id -u)" != 0 ] && [ "$gid" != "$(id -g)" ]; then
            echo "Code: 1000. DB::ErrnoException: Cannot do 'setgid' to user ($g), errno: 1, strerror: Operation not permitted. (SYSTEM_ERROR)" >&2
            exit 232
        fi
    fi
    uid="$u"
    if ! [[ "$u" =~ ^[0-9]+$ ]] || [ "$u" = 0 ]; then
        uid=""; entry="$(getent passwd -- "$u" 2>/dev/null | head -n 1)" || entry=""
        [ "${entry%%:*}" = "$u" ] && uid="$(cut -d: -f3 <<< "$entry")"
        if [ -z "$uid" ] && [ "$SU_BY_ID" = 1 ] && [[ "$u" =~ ^[0-9]+$ ]] && getent passwd -- "$u" >/dev/null 2>&1; then
            uid="$u"
        fi
        if [ -z "$uid" ]; then
            echo "Code: 36. DB::Exception: User $u is not found in the system. (BAD_ARGUMENTS)" >&2
            exit 36
        fi
    fi
    if [ "$uid" = 0 ] && [ "$(id -u)" != 0 ]; then
        echo "Code: 36. DB::Exception: User has id 0, but dropping privileges to uid 0 does not make sense. (BAD_ARGUMENTS)" >&2
        exit 36
    fi
    if [ "$(id -u)" = 0 ]; then
        exec setpriv --regid="${gid:-$(id -g)}" --reuid="$uid" --keep-groups -- "$@"
    fi
    if [ "$uid" != "$(id -u)" ]; then
        echo "Code: 1000. DB::ErrnoException: Cannot do 'setuid' to user ($u), errno: 1, strerror: Operation not permitted. (SYSTEM_ERROR)" >&2
        exit 232
    fi
    exec "$@"
}
"#;

/// The Keeper image's `/entrypoint.sh` (or, `distroless`, its `docker-init --keeper`).
pub fn keeper_entrypoint(distroless: bool) -> String {
    let mut s = String::from(
        "#!/bin/bash\n# clickhouse/clickhouse-keeper's entrypoint, emulated by local-kubelet\n\
         set -eo pipefail\nshopt -s nullglob\n\n\
         if [ \"$(id -u)\" = 0 ]; then\n    USER=101\n    GROUP=101\n    gosu=\"setpriv --regid=101 --reuid=101 --keep-groups --\"\n    DO_CHOWN=1\n\
         else\n    USER=\"$(id -u)\"\n    GROUP=\"$(id -g)\"\n    gosu=\"\"\n    DO_CHOWN=0\nfi\n\
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
    if distroless {
        // docker-init: no change of user (the image's user is 101)
        s = s.replacen("if [ \"$(id -u)\" = 0 ]; then", "if false; then", 1);
    }
    s.push_str(&ensure_dirs(
        "\"$DATA_DIR\" \"$LOG_DIR\" \"${TMP_DIR:-}\" \"$COORDINATION_DIR\" \"$COORDINATION_LOG_DIR\" \"$COORDINATION_SNAPSHOT_DIR\"",
        true,
        distroless,
    ));
    s.push_str(&format!(
        "\nif [[ $# -lt 1 ]] || [[ \"$1\" == \"--\"* ]]; then\n    export CLICKHOUSE_WATCHDOG_ENABLE\n    \
         cd \"${{DATA_DIR}}\"{}\n    exec $gosu {KEEPER_PROGRAM} --config-file=\"$KEEPER_CONFIG\" \"$@\"\nfi\n\nexec $gosu \"$@\"\n",
        if distroless { " 2>/dev/null || true" } else { "" }
    ));
    s
}

/// A Keeper pod's annotation: how fast (bytes per second) the stand-in loads its state at start
/// ([`keeper_program`]). Unset, it loads at once.
pub const KEEPER_LOAD_RATE_ANNOTATION: &str =
    "local-kubelet.clickhouse.com/keeper-load-bytes-per-second";

/// The emulated `clickhouse-keeper --config-file=…`: takes the member's id from `server_id`
/// now (a literal, or `from_env` read from this process's environment), refuses what Keeper
/// refuses, writes ZooKeeper's `myid` and `zoo.cfg` into Keeper's state folder, loads its
/// state, then starts the gate on the client port and execs ZooKeeper on the loopback port
/// behind it.
///
/// Loading: Keeper reads its latest snapshot and its logs (`KeeperServer::startup`) before it
/// waits for a quorum (`startup_timeout`, counted from then) and before it opens any port. The
/// stand-in takes the bytes of its state folder (snapshots, logs and ZooKeeper's own data)
/// divided by `load_rate` (bytes per second) seconds, every port closed; with no rate, none.
pub fn keeper_program(kc: &KeeperConfig, java: &[String], load_rate: Option<u64>) -> String {
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
LOAD_RATE={load_rate}
if [ "$LOAD_RATE" -gt 0 ] 2>/dev/null; then
    bytes=$(du -sbc "$DATA/snapshots" "$DATA/log" 2>/dev/null | tail -n 1 | cut -f1)
    secs=$(( ${{bytes:-0}} / LOAD_RATE ))
    echo "<Information> KeeperServer: loading $bytes bytes of snapshots and logs ($secs s)" >&2
    sleep "$secs"
    echo "<Information> KeeperServer: loaded" >&2
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
        load_rate = load_rate.unwrap_or(0),
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
/// the image knows `CLICKHOUSE_SKIP_USER_SETUP` (25.1 and newer); `su_by_id`: its `clickhouse
/// su` takes a numeric group that has no name ([`crate::images::su_takes_numeric_group`]).
pub fn server_entrypoint(
    dirs: &[String],
    skip_honoured: bool,
    distroless: bool,
    su_by_id: bool,
) -> String {
    let quoted: Vec<String> = dirs.iter().map(|d| shell_quote(d)).collect();
    let mut s = String::from(
        "#!/bin/bash\n# clickhouse/clickhouse-server's entrypoint, emulated by local-kubelet\n\
         set -eo pipefail\nshopt -s nullglob\n\n",
    );
    s.push_str(&format!("SU_BY_ID={}\n", u8::from(su_by_id)));
    s.push_str(CLICKHOUSE_SU);
    if distroless {
        // docker-init: no `su`, the folders as the image's user (101)
        s.push_str("USER=\"$(id -u)\"\nGROUP=\"$(id -g)\"\nDO_CHOWN=0\nsu_cmd=\"\"\n");
    } else {
        s.push_str(
            "if [ \"$(id -u)\" = 0 ]; then\n    USER=101\n    GROUP=101\n    DO_CHOWN=1\nelse\n    \
             USER=\"$(id -u)\"\n    GROUP=\"$(id -g)\"\n    DO_CHOWN=0\nfi\n\
             su_cmd=\"clickhouse_su $USER:$GROUP\"\n",
        );
    }
    s.push_str(
        "CLICKHOUSE_CONFIG=\"${CLICKHOUSE_CONFIG:-/etc/clickhouse-server/config.xml}\"\n\
         # the folders of the configuration (read when the container was created)\n",
    );
    let fail = if distroless { "" } else { "; exit 1" };
    s.push_str(&format!(
        "for dir in {}\ndo\n    [ -z \"$dir\" ] && continue\n    \
         if [ \"$DO_CHOWN\" = 1 ] || [ -z \"$su_cmd\" ]; then\n        \
         mkdir -p \"$dir\" || {{ echo \"Couldn't create necessary directory: $dir\"{fail}; }}\n    \
         else\n        \
         ( $su_cmd mkdir -p \"$dir\" ) || {{ echo \"Couldn't create necessary directory: $dir\"{fail}; }}\n    \
         fi\n    \
         if [ \"$DO_CHOWN\" = 1 ] && {{ [ \"$(stat -c %u \"$dir\")\" != \"$USER\" ] || [ \"$(stat -c %g \"$dir\")\" != \"$GROUP\" ]; }}; then\n        \
         chown -R \"$USER:$GROUP\" \"$dir\"\n    fi\ndone\n",
        quoted.join(" \\\n  ")
    ));
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
    ${{su_cmd:-exec}} /usr/sbin/clickhouse-server --config-file="$CLICKHOUSE_CONFIG" "$@"
fi

${{su_cmd:-exec}} "$@"
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
        let prog = keeper_program(&kc, &["echo".into(), "java".into()], None);
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
        let old = server_entrypoint(&[], false, false, true);
        let new = server_entrypoint(&[], true, false, true);
        assert!(old.contains("if [ 0 = 1 ] && [ \"${CLICKHOUSE_SKIP_USER_SETUP:-0}\" = 1 ]"));
        assert!(new.contains("if [ 1 = 1 ] && [ \"${CLICKHOUSE_SKIP_USER_SETUP:-0}\" = 1 ]"));
        assert!(new.contains("cp /etc/clickhouse-server/users.xml /tmp\n"));
        let base = std::env::temp_dir().join(format!("lk-sep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("f"), "").unwrap();
        let blocked = base.join("f/data");
        let ep = server_entrypoint(&[blocked.display().to_string()], true, false, true);
        let (code, out) = sh(&ep, &[], &["true"]);
        assert_eq!(code, 1);
        assert!(out.contains("Couldn't create necessary directory"), "{out}");
        let _ = std::fs::remove_dir_all(&base);
    }

    /// `script` run by bash as `uid:gid` (no supplementary groups): (exit code, output).
    fn sh_as(uid: u32, gid: u32, script: &str, args: &[&str]) -> (i32, String) {
        let dir = std::env::temp_dir().join(format!(
            "lk-su-{}-{uid}-{}",
            std::process::id(),
            script.len()
        ));
        let _ = std::fs::create_dir_all(&dir);
        let f = dir.join("ep.sh");
        std::fs::write(&f, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={gid}"),
                "--clear-groups",
                "--",
                "bash",
            ])
            .arg(&f)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
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

    fn is_root() -> bool {
        // SAFETY: getuid has no preconditions
        unsafe { libc::getuid() == 0 }
    }

    /// Issue 52 item 2: `clickhouse su` as `programs/su/su.cpp` behaves. OpenShift's ids (a uid
    /// of the namespace's range, group 0): before ClickHouse #71626 the numeric group 0 is
    /// looked up by name and `su` exits 36 with "Group 0 is not found in the system"; with the
    /// fix it runs the command. The images' own ids and a switch by root work on both; a
    /// non-root process cannot change to another uid. Needs root (as the agent).
    #[test]
    fn clickhouse_su_fails_on_group_zero_before_the_fix() {
        assert!(is_root(), "run as root, as the node agent runs");
        let su = |by_id: bool, cmd: &str| {
            format!("SU_BY_ID={}\n{CLICKHOUSE_SU}{cmd}\n", u8::from(by_id))
        };
        let (code, out) = sh_as(
            1_000_650_000,
            0,
            &su(false, "clickhouse_su 1000650000:0 echo ran"),
            &[],
        );
        assert_eq!(code, 36, "{out}");
        assert!(
            out.contains("DB::Exception: Group 0 is not found in the system"),
            "{out}"
        );
        let (code, out) = sh_as(
            1_000_650_000,
            0,
            &su(true, "clickhouse_su 1000650000:0 echo ran"),
            &[],
        );
        assert_eq!((code, out.trim()), (0, "ran"));
        for by_id in [false, true] {
            let (code, out) = sh_as(101, 101, &su(by_id, "clickhouse_su 101:101 echo ran"), &[]);
            assert_eq!((code, out.trim()), (0, "ran"), "{by_id}");
            let (code, out) = sh_as(101, 101, &su(by_id, "clickhouse_su 102:101 echo ran"), &[]);
            assert_eq!(code, 232, "{out}");
            assert!(out.contains("Cannot do 'setuid' to user (102)"), "{out}");
            let (code, out) = sh_as(0, 0, &su(by_id, "clickhouse_su 101:101 id -u"), &[]);
            assert_eq!((code, out.trim()), (0, "101"), "{by_id}");
        }
    }

    /// Issue 52 items 1 and 2: the server image's entrypoint as the real one runs it. Started
    /// as root (the image has no `USER`), it gives its folders to 101:101 and runs the server
    /// as 101; started with OpenShift's ids on a tag before the `su` fix, its first `clickhouse
    /// su` fails and the container exits; with the fix it runs.
    #[test]
    fn server_entrypoint_runs_su_with_the_pods_ids() {
        assert!(is_root(), "run as root, as the node agent runs");
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let base = std::env::temp_dir().join(format!("lk-sesu-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
        let data = base.join("data");
        let dirs = [data.display().to_string()];
        // as root: the folder given to 101, the command run as 101 (no users.xml here: the
        // copy fails after the folders, so the command runs from a script of its own)
        let ep = server_entrypoint(&dirs, true, false, false)
            .replace("cp /etc/clickhouse-server/users.xml /tmp", ":");
        let (code, out) = sh_as(0, 0, &ep, &["id", "-u"]);
        assert_eq!((code, out.trim()), (0, "101"), "{out}");
        let meta = std::fs::metadata(&data).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (101, 101));
        std::fs::remove_dir_all(&data).unwrap();
        // OpenShift's ids, before the fix: exits at the first folder
        let (code, out) = sh_as(1_000_650_000, 0, &ep, &["id", "-u"]);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("Group 0 is not found in the system"), "{out}");
        assert!(out.contains("Couldn't create necessary directory"), "{out}");
        assert!(!data.exists());
        // with the fix: the folder made as that uid, the command run as it
        let ep = server_entrypoint(&dirs, true, false, true)
            .replace("cp /etc/clickhouse-server/users.xml /tmp", ":");
        let (code, out) = sh_as(1_000_650_000, 0, &ep, &["id", "-u"]);
        assert_eq!((code, out.trim()), (0, "1000650000"), "{out}");
        assert_eq!(std::fs::metadata(&data).unwrap().uid(), 1_000_650_000);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Issue 52 item 5: the stand-in loads its state before it opens any port: the bytes of
    /// its state folder at the pod's rate, then the gate (whose `startup_timeout` counts from
    /// there).
    #[test]
    fn keeper_program_loads_its_state_before_the_gate() {
        let kc = KeeperConfig {
            server_id: Some("1".into()),
            ..KeeperConfig::default()
        };
        let prog = keeper_program(&kc, &["true".into()], Some(1_000_000));
        let load = prog.find("sleep \"$secs\"").unwrap();
        let gate = prog.find("keeper-gate").unwrap();
        assert!(load < gate);
        assert!(prog.contains("LOAD_RATE=1000000\n"));
        assert!(keeper_program(&kc, &["true".into()], None).contains("LOAD_RATE=0\n"));
        // run with a state of 2 MB at 1 MB/s: about 2 s before the gate would start
        let base = std::env::temp_dir().join(format!("lk-load-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("snapshots")).unwrap();
        std::fs::write(base.join("snapshots/snapshot_1.bin"), vec![7u8; 2_000_000]).unwrap();
        let kc = KeeperConfig {
            server_id: Some("1".into()),
            storage_path: Some(base.display().to_string()),
            ..KeeperConfig::default()
        };
        let prog = keeper_program(&kc, &["true".into()], Some(1_000_000))
            .replace("keeper-gate", "true")
            .replace(&format!("cp {ZK_CONF}/zoo.cfg"), "true");
        let started = std::time::Instant::now();
        let (code, out) = sh(&prog, &[], &[]);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("loading 2"), "{out}");
        assert!(
            started.elapsed() >= std::time::Duration::from_secs(2),
            "{out}"
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
