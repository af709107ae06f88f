//! What a container runs: a stored image's entrypoint in its own root filesystem, or the program
//! of this machine its image stands for (ClickHouse's entrypoint or a hollow server, ZooKeeper
//! as Keeper, the operator, a shell), with the files and folders that program needs.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::mounts::{Mount, Mounts, host_path};
use super::{PrepErr, Stored};
use crate::images::{self, Kind};
use crate::keeper;
use crate::oci;
use crate::pods::PodEnv;
use crate::util;

/// ZooKeeper's classpath: Debian's `zookeeper.jar` (its manifest lists its dependencies), one
/// SLF4J binding (log4j 1.2, configured by the member's `log4j.properties`) and the
/// configuration folder. Not `/usr/share/java/*`: that holds six SLF4J bindings, of which the
/// no-op one won, and the members logged nothing.
const ZOOKEEPER_CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar:/etc/zookeeper/conf";

/// What [`program`] reads: the container and what [`super::prepare`] found out so far.
pub(super) struct Prep<'a> {
    pub(super) env: &'a PodEnv,
    pub(super) pod: &'a Pod,
    pub(super) c: &'a Container,
    pub(super) image: &'a str,
    pub(super) kind: Kind,
    pub(super) cenv: &'a [(String, String)],
    /// the container's folder on the machine
    pub(super) cdir: &'a Path,
    pub(super) distroless: bool,
}

impl Prep<'_> {
    /// `v` (the container's command or args) with `$(VAR)` references expanded.
    fn expand_all(&self, v: &Option<Vec<String>>) -> Vec<String> {
        v.iter()
            .flatten()
            .map(|s| util::expand(s, self.cenv))
            .collect()
    }
}

/// What the container runs.
pub(super) struct Program {
    pub(super) argv: Vec<String>,
    /// what its status reports as the image's ID
    pub(super) name: String,
    /// A Keeper member: its runtime membership changes.
    pub(super) membership: Option<keeper::MembershipWatch>,
    /// a stored image's root filesystem for this container
    pub(super) root: Option<PathBuf>,
    pub(super) working_dir: Option<String>,
}

impl Program {
    /// `argv` on this machine's root filesystem, in the container's working folder.
    fn on_machine(p: &Prep, argv: Vec<String>, name: &str) -> Program {
        Program {
            argv,
            name: name.into(),
            membership: None,
            root: None,
            working_dir: p.c.working_dir.clone(),
        }
    }
}

/// The container's program; the files and folders it needs are made and added to `mounts`.
pub(super) fn program(
    p: &Prep,
    stored: Option<&Stored>,
    mounts: &mut Mounts,
) -> std::result::Result<Program, PrepErr> {
    match p.kind {
        _ if stored.is_some() => stored_image(p, stored.expect("checked")),
        Kind::ClickHouseServer => server(p, mounts),
        Kind::Keeper => keeper(p, mounts),
        Kind::Operator => {
            let bin = p.env.ctx.operator_bin.clone();
            if !bin.exists() {
                return Err(PrepErr::Image(format!(
                    "image {:?}: the operator binary {} is not built",
                    p.image,
                    bin.display()
                )));
            }
            let mut a = vec![bin.to_string_lossy().to_string()];
            let cmd = p.expand_all(&p.c.command);
            a.extend(cmd.into_iter().skip(1));
            a.extend(p.expand_all(&p.c.args));
            Ok(Program::on_machine(p, a, "clickhouse-operator"))
        }
        Kind::Shell => {
            let mut a = p.expand_all(&p.c.command);
            a.extend(p.expand_all(&p.c.args));
            if a.is_empty() {
                a.push("sh".into());
            }
            Ok(Program::on_machine(p, a, "host-programs"))
        }
        Kind::Unknown => unreachable!(),
    }
}

/// A stored image's entrypoint and command (the container's over them), in a root filesystem
/// of the container's own, in the image's working folder unless the container names one.
fn stored_image(p: &Prep, (img, rootfs): &Stored) -> std::result::Result<Program, PrepErr> {
    let argv = oci::argv(
        &img.config,
        &p.expand_all(&p.c.command),
        &p.expand_all(&p.c.args),
    );
    let name = format!("{}@{}", images::repository_name(p.image), img.digest);
    let root = Some(oci::container_root(rootfs, p.cdir).map_err(PrepErr::Image)?);
    let mut working_dir = p.c.working_dir.clone();
    if working_dir.as_deref().is_none_or(str::is_empty) && !img.config.working_dir.is_empty() {
        working_dir = Some(img.config.working_dir.clone());
    }
    Ok(Program {
        argv,
        name,
        membership: None,
        root,
        working_dir,
    })
}

/// ClickHouse: the image's configuration and log folders unless volumes hold them; a hollow
/// server, or the image's entrypoint for the configuration as it is now.
fn server(p: &Prep, mounts: &mut Mounts) -> std::result::Result<Program, PrepErr> {
    if !mounts.mounted("/etc/clickhouse-server") {
        let etc = p.cdir.join("etc-clickhouse-server");
        if !etc.exists() {
            let _ = util::copy_tree(Path::new("/etc/clickhouse-server"), &etc);
            let _ = std::fs::create_dir_all(etc.join("config.d"));
            let _ = std::fs::create_dir_all(etc.join("users.d"));
            // what the official image adds to config.d
            let _ = std::fs::write(
                etc.join("config.d/docker_related_config.xml"),
                "<clickhouse>\n  <listen_host>::</listen_host>\n  <listen_host>0.0.0.0</listen_host>\n  <listen_try>1</listen_try>\n</clickhouse>\n",
            );
        }
        mounts.private_dir("/etc/clickhouse-server", etc, false);
    }
    if !mounts.covered("/var/log/clickhouse-server") {
        mounts.private_dir("/var/log/clickhouse-server", p.cdir.join("log"), false);
    }
    if let Some(cmd) = p.c.command.as_ref().and_then(|v| v.first()) {
        images::runnable(p.image, cmd).map_err(PrepErr::Start)?;
    }
    if crate::hollow::is_hollow(p.pod) {
        let me = std::env::current_exe()
            .map_err(|e| PrepErr::Config(format!("the agent's own binary: {e}")))?;
        let argv = vec![
            me.display().to_string(),
            "hollow-server".into(),
            "--version".into(),
            crate::hollow::version_of_tag(p.image),
            "--config-dir".into(),
            "/etc/clickhouse-server/config.d".into(),
        ];
        return Ok(Program::on_machine(p, argv, "hollow-server"));
    }
    // the image's entrypoint, with the folders of the configuration as it is now
    let all_now: Vec<&Mount> = mounts.private.iter().chain(mounts.volumes.iter()).collect();
    let host = |path: &str| host_path(&all_now, path);
    let mut files = Vec::new();
    if let Some(f) = host("/etc/clickhouse-server/config.xml") {
        files.push(std::fs::read_to_string(f).unwrap_or_default());
    }
    if let Some(d) = host("/etc/clickhouse-server/config.d") {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&d)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "xml")
                    && !p
                        .file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .starts_with('.')
            })
            .collect();
        names.sort();
        for n in names {
            files.push(std::fs::read_to_string(n).unwrap_or_default());
        }
    }
    let dirs = crate::entrypoint::server_dirs(&files);
    // CLICKHOUSE_SKIP_USER_SETUP: images of 25.1 and newer
    let skip = images::version(p.image).is_none_or(|v| v >= (25, 1));
    let ep = p.cdir.join("entrypoint.sh");
    std::fs::write(
        &ep,
        crate::entrypoint::server_entrypoint(
            &dirs,
            skip,
            p.distroless,
            images::su_takes_numeric_group(p.image),
        ),
    )
    .map_err(|e| PrepErr::Config(format!("writing {}: {e}", ep.display())))?;
    let _ = std::fs::set_permissions(&ep, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    mounts.private.push(Mount {
        src: ep,
        target: "/entrypoint.sh".into(),
        ro: true,
        keep: false,
    });
    // the container's command and args as given (a shell around the entrypoint, say), as a
    // kubelet runs them; none: the image's ENTRYPOINT
    let mut argv = p.expand_all(&p.c.command);
    if argv.is_empty() {
        argv.push("/entrypoint.sh".into());
    }
    argv.extend(p.expand_all(&p.c.args));
    Ok(Program::on_machine(p, argv, "clickhouse-server"))
}

/// Keeper: ZooKeeper 3.8 configured from the Keeper XML files the pod mounts under
/// `/etc/clickhouse-keeper`, behind the image's entrypoint (or the container's command), its
/// runtime membership followed.
fn keeper(p: &Prep, mounts: &mut Mounts) -> std::result::Result<Program, PrepErr> {
    // merge the Keeper XML files the pod mounts under /etc/clickhouse-keeper
    let roots: Vec<PathBuf> = mounts
        .volumes
        .iter()
        .filter(|m| {
            m.target == "/etc/clickhouse-keeper" || m.target.starts_with("/etc/clickhouse-keeper/")
        })
        .map(|m| m.src.clone())
        .collect();
    let kc =
        keeper::configured(&roots).map_err(|e| PrepErr::Config(format!("keeper config {e:#}")))?;
    let membership = Some(keeper::MembershipWatch {
        roots,
        addr: std::net::SocketAddr::from((p.env.ip, kc.tcp_port.unwrap_or(9181))),
    });
    if !mounts.covered("/var/log/clickhouse-keeper") {
        mounts.private_dir("/var/log/clickhouse-keeper", p.cdir.join("log"), false);
    }
    zookeeper_files(p, &kc, mounts)?;
    // the container's command and args as given; none: the image's ENTRYPOINT
    let mut a = p.expand_all(&p.c.command);
    if a.is_empty() {
        a.push(if p.distroless {
            crate::entrypoint::ZK_CONF.to_string() + "/entrypoint.sh"
        } else {
            "/entrypoint.sh".into()
        });
    } else {
        images::runnable(p.image, &a[0]).map_err(PrepErr::Start)?;
    }
    a.extend(p.expand_all(&p.c.args));
    Ok(Program {
        membership,
        ..Program::on_machine(p, a, "zookeeper-3.8")
    })
}

/// The files of the emulated Keeper program, part of the image and read-only: ZooKeeper's
/// configuration, the program that starts it and the image's entrypoint, mounted with the
/// agent's own binary (for the gate).
fn zookeeper_files(
    p: &Prep,
    kc: &keeper::KeeperConfig,
    mounts: &mut Mounts,
) -> std::result::Result<(), PrepErr> {
    let state = keeper::state_dir(kc);
    let cfg = keeper::zoo_cfg(kc, &state).map_err(|e| PrepErr::Config(format!("{e:#}")))?;
    // the files of the emulated Keeper program: part of the image, read-only
    let conf = p.cdir.join("zookeeper-conf");
    let _ = std::fs::remove_dir_all(&conf);
    let _ = std::fs::create_dir_all(&conf);
    let _ = std::fs::write(conf.join("zoo.cfg"), cfg);
    let _ = std::fs::write(
        conf.join("log4j.properties"),
        "log4j.rootLogger=INFO, CONSOLE\nlog4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
         log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
         log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} [myid:%X{myid}] - %-5p [%t:%C{1}@%L] - %m%n\n",
    );
    // The JDK's own security file caches failed name lookups for 10 s: a member that
    // looked a peer up before the peer's pod had an address could not reach it for 10 s
    // more, and sat out the election. Keeper resolves again at each connection attempt.
    let _ = std::fs::write(
        conf.join("dns.security"),
        "networkaddress.cache.ttl=1\nnetworkaddress.cache.negative.ttl=0\n",
    );
    let prog = conf.join("clickhouse-keeper");
    let _ = std::fs::write(
        &prog,
        crate::entrypoint::keeper_program(kc, &java_command(&state), load_rate(p.pod)),
    );
    let ep = conf.join("entrypoint.sh");
    let _ = std::fs::write(&ep, crate::entrypoint::keeper_entrypoint(p.distroless));
    for f in [&prog, &ep] {
        let _ = std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    }
    // the mount point of the agent's binary (for the gate)
    let _ = std::fs::write(conf.join("local-kubelet"), "");
    mounts.own(&conf);
    mounts.private.push(Mount {
        src: conf,
        target: crate::entrypoint::ZK_CONF.into(),
        ro: false,
        keep: false,
    });
    let me = std::env::current_exe()
        .map_err(|e| PrepErr::Config(format!("the agent's own binary: {e}")))?;
    mounts.private.push(Mount {
        src: me,
        target: crate::entrypoint::AGENT_IN_CONTAINER.into(),
        ro: true,
        keep: false,
    });
    if !p.distroless {
        mounts.private.push(Mount {
            src: ep,
            target: "/entrypoint.sh".into(),
            ro: true,
            keep: false,
        });
    }
    Ok(())
}

/// The pod's [`crate::entrypoint::KEEPER_LOAD_RATE_ANNOTATION`], when it is a number.
fn load_rate(pod: &Pod) -> Option<u64> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(crate::entrypoint::KEEPER_LOAD_RATE_ANNOTATION)?
        .trim()
        .parse()
        .ok()
}

/// The JVM's command line for ZooKeeper, its state and logs in `state`.
///
/// Keeper's election: a member that finds no leader retries within its election timeout
/// (1–2 s). ZooKeeper's own doubles its wait up to a minute, so a member that started before
/// its peers could sit out most of a minute; bounded here to Keeper's timing. The JVM flags keep
/// the start cheap on a small machine (one GC thread, the quick compiler only), as Keeper's
/// native start is, and write nothing outside Keeper's folders (no /tmp/hsperfdata_*).
fn java_command(state: &str) -> Vec<String> {
    let super_digest = format!(
        "-Dzookeeper.DigestAuthenticationProvider.superDigest={}",
        keeper::SUPER_DIGEST
    );
    let log_dir = format!("-Dzookeeper.log.dir={state}");
    [
        "/usr/bin/java",
        "-Xmx512m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:-UsePerfData",
        "-Dzookeeper.fastleader.maxNotificationInterval=2000",
        "-Dzookeeper.cnxTimeout=2000",
        super_digest.as_str(),
        log_dir.as_str(),
        "-Dzookeeper.root.logger=INFO,CONSOLE",
        "-Djava.security.properties=/etc/zookeeper/conf/dns.security",
        "-cp",
        ZOOKEEPER_CLASSPATH,
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
