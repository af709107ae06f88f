//! The script a container starts with, run as root in its own mount and UTS namespaces: it
//! names the host, binds every mount (a stored image's root filesystem first), makes the root
//! read-only when asked, and runs the program as the container's user.

use std::path::{Path, PathBuf};

use super::User;
use super::mounts::Mount;
use super::program::Program;
use crate::pods::PodEnv;
use crate::util::{self, shell_quote};

/// Makes every mount of the container's namespace read-only but those in `$lk_keep` and the
/// kernel's own (proc, sys, dev, cgroup, …); run as root before the program starts.
const READ_ONLY_ROOT: &str = r#"mapfile -t lk_mounts < /proc/self/mountinfo
for lk_l in "${lk_mounts[@]}"; do
  read -r -a lk_f <<< "$lk_l"
  lk_mp=$(printf '%b' "${lk_f[4]}")
  lk_fs=${lk_l#* - }; lk_fs=${lk_fs%% *}
  case "$lk_fs" in proc|sysfs|devtmpfs|devpts|mqueue|cgroup|cgroup2|nsfs|debugfs|tracefs|securityfs|pstore|bpf|fusectl|configfs|hugetlbfs|autofs|binfmt_misc|efivarfs|rpc_pipefs) continue ;; esac
  case "$lk_mp" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) continue ;; esac
  case "$lk_keep" in *$'\n'"$lk_mp"$'\n'*) continue ;; esac
  case ",${lk_f[5]}," in *,ro,*) continue ;; esac
  mount -o remount,bind,ro "$lk_mp" 2>/dev/null || :
done
unset lk_l lk_f lk_mp lk_fs lk_keep lk_mounts
"#;

/// The container's run script: `all` its mounts in order, `program` what it runs.
pub(super) fn run_script(
    env: &PodEnv,
    all: &[Mount],
    program: &Program,
    ro_root: bool,
    user: &User,
) -> String {
    let root = program.root.as_deref();
    // Every source is opened first and bound through /proc/self/fd/N, so that a volume mounted
    // over a parent of the agent's folders (e.g. an emptyDir on /tmp) cannot hide the others.
    let mut script = String::from("set -e\n");
    script.push_str(&format!("hostname {}\n", shell_quote(&env.hostname)));
    let hosts = env.dir.join("hosts");
    let resolv = env.dir.join("resolv.conf");
    let mut binds: Vec<(PathBuf, String, bool)> = vec![
        (hosts, "/etc/hosts".into(), false),
        (resolv, "/etc/resolv.conf".into(), false),
    ];
    binds.extend(all.iter().map(|m| (m.src.clone(), m.target.clone(), m.ro)));
    for (i, (src, _, _)) in binds.iter().enumerate() {
        script.push_str(&format!(
            "exec {}<{}\n",
            10 + i,
            shell_quote(&src.to_string_lossy())
        ));
    }
    match root {
        Some(r) => script.push_str(&own_root(r)),
        None => script.push_str(&own_dev(&env.dir.join("dev"))),
    }
    for (i, (src, target, ro)) in binds.iter().enumerate() {
        if i >= 2 || root.is_some() {
            script.push_str(&mount_point(env, all, root, target, src.is_dir()));
        }
        let t = shell_quote(&at(root, target));
        script.push_str(&format!(
            "mount --no-canonicalize --bind /proc/self/fd/{} {t}\n",
            10 + i
        ));
        if *ro {
            script.push_str(&format!("mount -o remount,bind,ro {t}\n"));
        }
    }
    for i in 0..binds.len() {
        script.push_str(&format!("exec {}<&-\n", 10 + i));
    }
    if let Some(r) = root {
        if ro_root {
            script.push_str(&format!(
                "mount -o remount,bind,ro {}\n",
                shell_quote(&r.to_string_lossy())
            ));
        }
    } else if ro_root {
        // readOnlyRootFilesystem: every other mount of the namespace becomes read-only (the
        // root, the machine's other filesystems, the image's folders), except the volumes, the
        // image VOLUMEs of their own, the agent's files and /dev, /proc, /sys
        let mut keep = String::from("\n/etc/hosts\n/etc/resolv.conf\n");
        for m in all.iter().filter(|m| m.keep) {
            keep.push_str(&m.target);
            keep.push('\n');
        }
        script.push_str(&format!("lk_keep={}\n", shell_quote(&keep)));
        script.push_str(READ_ONLY_ROOT);
    }
    script.push_str(&run(env, program, user));
    script
}

/// Where the container's path `t` is in the mount namespace: inside a stored image's `root`.
fn at(root: Option<&Path>, t: &str) -> String {
    match root {
        Some(r) => format!("{}{t}", r.display()),
        None => t.to_string(),
    }
}

/// A container of a stored image: its own root filesystem (a bind of itself, so that it can be
/// made read-only), with /proc, /sys and a /dev of its own, as a runtime gives it.
fn own_root(r: &Path) -> String {
    let q = shell_quote(&r.to_string_lossy());
    format!(
        "mount --bind {q} {q}\nmkdir -p {q}/proc {q}/sys {q}/dev\n\
         mount -t proc proc {q}/proc\n\
         mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {q}/sys\n{}",
        dev_at(&format!("{}/dev", r.display()))
    )
}

/// A container on the machine's own filesystem (the operator's image): a /dev of its own too,
/// made in `staging` and moved over the machine's /dev in the container's namespace. A runtime
/// never shows a container the machine's devices, and the mount points made in it (the
/// termination message file) stay the container's: a file made in the machine's /dev could be
/// removed by another node agent of the same machine, which detaches the container's mount
/// there and turns its termination message into a write to the machine's /dev.
fn own_dev(staging: &Path) -> String {
    let q = shell_quote(&staging.to_string_lossy());
    format!(
        "mkdir -p {q}\n{}mount --move {q} /dev\n",
        dev_at(&staging.to_string_lossy())
    )
}

/// A runtime's /dev at `d`: a tmpfs with the machine's null, zero, full, random, urandom and
/// tty bound in, the fd and standard stream links, and a /dev/shm of its own.
fn dev_at(d: &str) -> String {
    let d = shell_quote(d);
    format!(
        "mount -t tmpfs -o nosuid,mode=755 tmpfs {d}\n\
         for d in null zero full random urandom tty; do : > {d}/$d; \
         mount --bind /dev/$d {d}/$d; done\n\
         ln -s /proc/self/fd {d}/fd; ln -s /proc/self/fd/0 {d}/stdin; \
         ln -s /proc/self/fd/1 {d}/stdout; ln -s /proc/self/fd/2 {d}/stderr\n\
         mkdir -p {d}/shm\nmount -t tmpfs -o nosuid,nodev,mode=1777 shm {d}/shm\n"
    )
}

/// The mount point at `target` (a folder when `is_dir`): below another mount it is created
/// inside it, in the source folder when that mount is read-only (a configMap, secret, projected
/// volume), as a kubelet and runtime make it, else in the namespace (the script's lines);
/// others in the container's own /dev, or on the machine's filesystem, recorded for cleanup.
fn mount_point(
    env: &PodEnv,
    all: &[Mount],
    root: Option<&Path>,
    target: &str,
    is_dir: bool,
) -> String {
    let parent = all
        .iter()
        .filter(|m| m.target != *target && target.starts_with(&format!("{}/", m.target)))
        .max_by_key(|m| m.target.len());
    match parent {
        None if root.is_none() && !target.starts_with("/dev/") => {
            let _ = util::ensure_mount_point(&env.ctx.data_dir, Path::new(target), !is_dir);
        }
        None => {}
        Some(p) if p.ro && p.src.is_dir() => {
            let rel = target[p.target.len()..].trim_start_matches('/');
            let at = p.src.join(rel);
            if !at.exists() {
                if is_dir {
                    let _ = std::fs::create_dir_all(&at);
                } else if let Some(d) = at.parent() {
                    let _ = std::fs::create_dir_all(d);
                    let _ = std::fs::write(&at, b"");
                }
            }
        }
        Some(_) => {}
    }
    let t = shell_quote(&at(root, target));
    if all
        .iter()
        .any(|m| m.ro && m.target != *target && target.starts_with(&format!("{}/", m.target)))
    {
        // created above in the read-only source
        String::new()
    } else if is_dir {
        format!("mkdir -p {t}\n")
    } else {
        format!("mkdir -p \"$(dirname {t})\"; [ -e {t} ] || : > {t}\n")
    }
}

/// The script's last lines: into the working folder and `exec` the program as the container's
/// user (through `chroot-exec` into a stored image's root filesystem, else `setpriv`).
fn run(env: &PodEnv, program: &Program, user: &User) -> String {
    let (uid, gid, groups) = (user.uid, user.gid, &user.groups);
    let quoted: Vec<String> = program.argv.iter().map(|a| shell_quote(a)).collect();
    if let Some(r) = &program.root {
        let mut g = groups.clone();
        if !g.is_empty() {
            g.insert(0, gid);
            g.dedup();
        }
        let g: Vec<String> = g.iter().map(|x| x.to_string()).collect();
        return format!(
            "exec {} chroot-exec --root {} --wd {} --uid {uid} --gid {gid} --groups {} -- {}\n",
            shell_quote(&env.ctx.self_exe.to_string_lossy()),
            shell_quote(&r.to_string_lossy()),
            shell_quote(
                program
                    .working_dir
                    .as_deref()
                    .filter(|w| !w.is_empty())
                    .unwrap_or("/")
            ),
            shell_quote(&g.join(",")),
            quoted.join(" ")
        );
    }
    let cd = if let Some(wd) = &program.working_dir {
        format!("cd {} 2>/dev/null || cd /\n", shell_quote(wd))
    } else {
        "cd / \n".to_string()
    };
    if uid == 0 {
        return format!("{cd}exec {}\n", quoted.join(" "));
    }
    let groups_arg = if !groups.is_empty() {
        let mut g = groups.clone();
        g.insert(0, gid);
        g.dedup();
        format!(
            "--groups={}",
            g.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    } else if util::user_by_uid(uid).is_some() {
        "--init-groups".into()
    } else {
        "--clear-groups".into()
    };
    format!(
        "{cd}exec setpriv --reuid={uid} --regid={gid} {groups_arg} -- {}\n",
        quoted.join(" ")
    )
}
