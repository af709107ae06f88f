//! A container's mounts: its volumes, and the folders and files of its own (the image's
//! VOLUMEs and `/tmp`, its termination message).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Container;

use super::{PrepErr, User};
use crate::images::{self, Kind};
use crate::pods::PodEnv;
use crate::util;
use crate::volumes::VolKind;

pub(super) struct Mount {
    pub(super) src: PathBuf,
    pub(super) target: String,
    pub(super) ro: bool,
    /// stays writable under `readOnlyRootFilesystem` (a volume, an image VOLUME given its own
    /// folder, the agent's own files); the rest is the image's root filesystem
    pub(super) keep: bool,
}

/// Where a path of the container is on the machine, through the deepest mount that holds it.
pub(super) fn host_path(mounts: &[&Mount], p: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .filter(|m| m.target == p || p.starts_with(&format!("{}/", m.target)))
        .max_by_key(|m| m.target.len())
        .map(|m| {
            let rel = p[m.target.len()..].trim_start_matches('/');
            if rel.is_empty() {
                m.src.clone()
            } else {
                m.src.join(rel)
            }
        })
        .or_else(|| Some(PathBuf::from(p)))
}

/// The container's volume mounts, each volume ready (a `subPath` created, an emptyDir or
/// persistent volume owned by the user and `fsGroup`, as a real `fsGroup` or the image's
/// entrypoint would make it).
pub(super) fn volume_mounts(
    env: &PodEnv,
    c: &Container,
    cenv: &[(String, String)],
    user: &User,
) -> std::result::Result<Vec<Mount>, PrepErr> {
    let (uid, gid, fs_group) = (user.uid, user.gid, user.fs_group);
    let vols = env.volumes.lock().unwrap().clone();
    let mut mounts: Vec<Mount> = Vec::new();
    for vm in c.volume_mounts.iter().flatten() {
        let Some(v) = vols.get(&vm.name) else {
            return Err(PrepErr::Config(format!("volume {} is not ready", vm.name)));
        };
        let mut src = v.path.clone();
        if let Some(sp) = vm.sub_path.clone().filter(|s| !s.is_empty()) {
            let sp = util::expand(&sp, cenv);
            src = src.join(sp.trim_start_matches('/'));
            if !src.exists() && v.kind != VolKind::Generated {
                let _ = std::fs::create_dir_all(&src);
            }
        }
        if matches!(v.kind, VolKind::EmptyDir | VolKind::Persistent) {
            // as a real fsGroup (or the image's entrypoint) would
            let want_gid = fs_group.unwrap_or(gid);
            let owner = std::fs::metadata(&src).map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.uid(), m.gid())
            });
            if let Ok((ou, og)) = owner
                && (ou != uid || og != want_gid)
            {
                util::chown_recursive(&src, Some(uid), Some(want_gid));
            }
        }
        // configMap, secret, projected and downwardAPI volumes are always read-only
        let ro = vm.read_only.unwrap_or(false) || v.kind == VolKind::Generated;
        mounts.push(Mount {
            src,
            target: vm.mount_path.trim_end_matches('/').to_string(),
            ro,
            keep: true,
        });
    }
    Ok(mounts)
}

/// The container's mounts: its volumes, and its private ones (folders and files of its own,
/// owned by its user).
pub(super) struct Mounts {
    pub(super) volumes: Vec<Mount>,
    pub(super) private: Vec<Mount>,
    uid: u32,
    gid: u32,
}

impl Mounts {
    pub(super) fn new(volumes: Vec<Mount>, uid: u32, gid: u32) -> Mounts {
        Mounts {
            volumes,
            private: Vec::new(),
            uid,
            gid,
        }
    }

    /// A volume is mounted at `p`.
    pub(super) fn mounted(&self, p: &str) -> bool {
        self.volumes.iter().any(|m| m.target == p)
    }

    /// `p` is inside a volume's mount (or is the mount itself).
    pub(super) fn covered(&self, p: &str) -> bool {
        self.volumes.iter().any(|m| {
            m.target == p || p.starts_with(&format!("{}/", m.target)) || m.target.is_empty()
        })
    }

    /// Gives `path` and everything under it to the container's user.
    pub(super) fn own(&self, path: &Path) {
        util::chown_recursive(path, Some(self.uid), Some(self.gid));
    }

    /// A folder of the image's root filesystem (read-only with readOnlyRootFilesystem), or
    /// with `keep` an image VOLUME of its own, at `src` on the machine.
    pub(super) fn private_dir(&mut self, target: &str, src: PathBuf, keep: bool) {
        let _ = std::fs::create_dir_all(&src);
        self.own(&src);
        self.private.push(Mount {
            src,
            target: target.to_string(),
            ro: false,
            keep,
        });
    }

    /// The folders of the image of `kind` that no volume covers, and the termination message
    /// file of `c`, in the container's folder `cdir`.
    pub(super) fn image_folders(
        &mut self,
        kind: Kind,
        image_volumes: images::ImageVolumes,
        cdir: &Path,
        c: &Container,
    ) {
        // The image's declared VOLUMEs that no pod volume covers: with containerd a writable
        // folder of their own; with CRI-O (`mkdir`) or `ignore` the image's folder, part of its
        // root filesystem.
        for (i, v) in images::declared_volumes(kind).iter().enumerate() {
            if self.covered(v) {
                continue;
            }
            let keep = image_volumes == images::ImageVolumes::Containerd;
            self.private_dir(v, cdir.join(format!("image-volume-{i}")), keep);
        }
        // the image's own /tmp (a container's /tmp is never the machine's)
        if matches!(kind, Kind::ClickHouseServer | Kind::Keeper) && !self.covered("/tmp") {
            let t = cdir.join("tmp");
            self.private_dir("/tmp", t.clone(), false);
            let _ =
                std::fs::set_permissions(&t, std::os::unix::fs::PermissionsExt::from_mode(0o1777));
        }
        // the termination message: a fresh file per start, read when the container ends
        let termination = cdir.join("termination-log");
        let _ = std::fs::write(&termination, "");
        util::chown(&termination, Some(self.uid), Some(self.gid));
        self.private.push(Mount {
            src: termination,
            target: c
                .termination_message_path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/dev/termination-log".into()),
            ro: false,
            keep: true,
        });
    }

    /// Every mount in the order they are made: parents first; a volume at the same path wins
    /// over a private folder.
    pub(super) fn in_order(self) -> Vec<Mount> {
        let mut all: Vec<Mount> = self.private;
        all.extend(self.volumes);
        all.sort_by(|a, b| {
            a.target
                .matches('/')
                .count()
                .cmp(&b.target.matches('/').count())
                .then(a.target.cmp(&b.target))
        });
        all
    }
}
