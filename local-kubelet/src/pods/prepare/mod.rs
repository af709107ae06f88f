//! What a container needs before it starts: its image (a program of this machine, or a stored
//! image's own root filesystem), its user and environment, its mounts ([`mounts`]), its program
//! ([`program`]) and the script that mounts everything in its namespaces and runs it
//! ([`script`]).

mod mounts;
mod program;
mod script;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::PodEnv;
use super::env::{container_env, run_as, verify_run_as_non_root};
use crate::images::{self, Kind};
use crate::keeper;
use crate::oci;
use mounts::Mounts;
use program::Prep;

pub(super) enum PrepErr {
    Image(String),
    Config(String),
    /// the runtime cannot start the command (e.g. no shell in a distroless image)
    Start(String),
}

pub(super) struct Launch {
    pub(super) script: PathBuf,
    pub(super) env: Vec<(String, String)>,
    pub(super) program: String,
    /// A Keeper member: its runtime membership changes ([`keeper::follow_membership`]).
    pub(super) membership: Option<keeper::MembershipWatch>,
}

/// An image of the image store, and its unpacked root filesystem.
type Stored = (oci::Image, PathBuf);

/// Who the container runs as.
struct User {
    uid: u32,
    gid: u32,
    home: String,
    /// the pod's `fsGroup`
    fs_group: Option<u32>,
    /// `fsGroup` and the pod's supplemental groups
    groups: Vec<u32>,
}

/// Makes container `c` of `pod` ready to start: its run script written, its environment.
pub(super) async fn prepare(
    env: &PodEnv,
    pod: &Pod,
    c: &Container,
) -> std::result::Result<Launch, PrepErr> {
    let ctx = &env.ctx;
    let image = c.image.clone().unwrap_or_default();
    let stored = stored_image(env, &image)?;
    let kind = if stored.is_some() {
        Kind::Unknown
    } else {
        images::kind(&image)
    };
    if kind == Kind::Unknown && stored.is_none() {
        return Err(PrepErr::Image(format!(
            "image {image:?} cannot run on node {}: local-kubelet runs clickhouse-server, \
             clickhouse-keeper, clickhouse-operator and busybox/debian/ubuntu/alpine/bash images \
             as programs of this machine, and no other image",
            ctx.node
        )));
    }
    let mut cenv = container_env(env, pod, c).map_err(PrepErr::Config)?;
    let user = user(env, pod, c, kind, stored.as_ref(), &mut cenv)?;
    if !cenv.iter().any(|(k, _)| k == "HOME") {
        cenv.push(("HOME".into(), user.home.clone()));
    }
    let cdir = env.dir.join("containers").join(&c.name);
    let _ = std::fs::create_dir_all(&cdir);
    let volumes = mounts::volume_mounts(env, c, &cenv, &user)?;
    let ro_root = c
        .security_context
        .as_ref()
        .and_then(|s| s.read_only_root_filesystem)
        .unwrap_or(false);
    let node_mode = std::env::var(images::IMAGE_VOLUMES_ENV).ok();
    let image_volumes = images::ImageVolumes::of(
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(images::IMAGE_VOLUMES_ANNOTATION))
            .map(String::as_str),
        node_mode.as_deref(),
    )
    .map_err(PrepErr::Config)?;
    let mut mounts = Mounts::new(volumes, user.uid, user.gid);
    mounts.image_folders(kind, image_volumes, &cdir, c);
    let prep = Prep {
        env,
        pod,
        c,
        image: &image,
        kind,
        cenv: &cenv,
        cdir: &cdir,
        distroless: images::is_distroless(&image),
    };
    let program = program::program(&prep, stored.as_ref(), &mut mounts)?;
    let script = script::run_script(env, &mounts.in_order(), &program, ro_root, &user);
    let script_path = cdir.join("run.sh");
    std::fs::write(&script_path, script)
        .map_err(|e| PrepErr::Config(format!("writing {}: {e}", script_path.display())))?;
    Ok(Launch {
        script: script_path,
        env: cenv,
        program: program.name,
        membership: program.membership,
    })
}

/// The image from the image store, unpacked; `None` without a store or when the store does
/// not have it (the image is then a program of this machine, images.rs).
fn stored_image(env: &PodEnv, image: &str) -> std::result::Result<Option<Stored>, PrepErr> {
    let ctx = &env.ctx;
    Ok(match ctx.image_store.as_deref() {
        Some(store) => oci::find(store, image)
            .map_err(PrepErr::Image)?
            .map(|img| oci::unpack(&img, &ctx.data_dir).map(|rootfs| (img, rootfs)))
            .transpose()
            .map_err(PrepErr::Image)?,
        None => None,
    })
}

/// Who the container runs as: its security context's user, else the pod's, else the image's
/// `User` (a stored image's config, whose `Env` goes under the kubelet's variables in `cenv`,
/// or what the emulated image declares, [`images::image_user`]: root for the ClickHouse
/// images). `runAsNonRoot` is checked as the kubelet does ([`verify_run_as_non_root`]), but for
/// the operator's image run from this machine, which runs as the distroless `nonroot` user.
fn user(
    env: &PodEnv,
    pod: &Pod,
    c: &Container,
    kind: Kind,
    stored: Option<&Stored>,
    cenv: &mut Vec<(String, String)>,
) -> std::result::Result<User, PrepErr> {
    let image = c.image.as_deref().unwrap_or_default();
    let image_user = match stored {
        Some((img, _)) => img.config.user.clone(),
        None => images::image_user(kind, image).to_string(),
    };
    let (mut uid, mut gid, mut home) = run_as(pod, c, &image_user);
    let sc = |f: fn(&k8s_openapi::api::core::v1::SecurityContext) -> Option<i64>,
              p: fn(&k8s_openapi::api::core::v1::PodSecurityContext) -> Option<i64>| {
        c.security_context.as_ref().and_then(f).or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(p)
        })
    };
    let run_as_user = sc(|s| s.run_as_user, |s| s.run_as_user);
    if let Some((img, rootfs)) = stored {
        // the image's Env under the kubelet's variables and the pod's (the image's PATH over
        // the default one), its User unless the pod sets one
        for (i, kv) in img.config.env.iter().enumerate() {
            cenv.insert(1 + i, kv.clone());
        }
        let (iu, ig, ih) = oci::user(rootfs, &img.config.user).map_err(PrepErr::Config)?;
        if run_as_user.is_none() {
            (uid, home) = (iu, ih);
            gid = sc(|s| s.run_as_group, |s| s.run_as_group).map_or(ig, |g| g as u32);
        }
    }
    let psc0 = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let non_root = c
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc0.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if non_root && uid == 0 && kind == Kind::Operator && run_as_user.is_none() && stored.is_none() {
        // the operator's image runs as the distroless `nonroot` user
        (uid, gid, home) = (65532, 65532, "/".to_string());
    } else {
        let who = format!("{}_{}({})", env.name, env.ns, env.uid);
        verify_run_as_non_root(non_root, run_as_user, &image_user, &who, &c.name)
            .map_err(PrepErr::Config)?;
    }
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let fs_group = psc.and_then(|s| s.fs_group).map(|g| g as u32);
    let mut groups: Vec<u32> = fs_group.into_iter().collect();
    groups.extend(
        psc.and_then(|s| s.supplemental_groups.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|g| g as u32),
    );
    Ok(User {
        uid,
        gid,
        home,
        fs_group,
        groups,
    })
}
