//! Images from an OCI image layout folder (`--image-store`, `LOCAL_KUBELET_IMAGE_STORE`): a pod
//! whose image reference is in the store runs *from the image*, as a kubelet with a container
//! runtime would: its layers unpacked into a root filesystem of its own, its `Entrypoint`, `Cmd`,
//! `Env`, `User` and `WorkingDir` honoured with Kubernetes' rules, and `imageID` the digest the
//! reference resolves to (the image index's for a multi-platform image, as a runtime reports
//! the repository digest). An image index is resolved as a runtime does: the manifest whose
//! `platform` is the node's (`os`/`architecture`; an arm64 `variant` of `v8` or none), refused
//! with the runtime's words when there is none ("no matching manifest for linux/amd64 in the
//! manifest list entries"). Every blob is checked against its digest before it is used; a
//! reference not in the store falls back to the programs of this machine (`images.rs`).
//!
//! Differences from a runtime, written down: the node's platform is this machine's (linux/amd64
//! where the tests run), and no pulling (the store is filled by `hack/image.sh`); a reference
//! by the digest of one platform's manifest inside an index is not resolved (by the index's
//! digest or by tag it is); whiteout files in layers are refused rather than applied (the
//! operator's image has one layer); no user namespace, seccomp or capability set beyond what
//! `setuid` to a non-root user drops.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

pub const STORE_ENV: &str = "LOCAL_KUBELET_IMAGE_STORE";

/// What an image's config says about running it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunConfig {
    pub user: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: String,
}

#[derive(Debug, Clone)]
pub struct Image {
    /// `sha256:<hex>` the reference resolves to: the image index's, or the manifest's for a
    /// single-platform image (what `imageID` reports)
    pub digest: String,
    /// `sha256:<hex>` of the manifest of the node's platform (what is unpacked)
    pub manifest_digest: String,
    pub config: RunConfig,
    /// gzip-compressed layer blobs, lowest first, with their digests
    layers: Vec<(PathBuf, String)>,
}

/// `docker.io/library/x:tag` and `x:tag` are the same reference; no tag is `latest`.
pub fn normalize(reference: &str) -> String {
    let (name, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    let mut name = name
        .strip_prefix("docker.io/")
        .or_else(|| name.strip_prefix("index.docker.io/"))
        .unwrap_or(name)
        .to_string();
    if let Some(rest) = name.strip_prefix("library/") {
        name = rest.to_string();
    }
    let last = name.rsplit('/').next().unwrap_or_default();
    if !last.contains(':') && digest.is_none() {
        name.push_str(":latest");
    }
    match digest {
        Some(d) => format!("{name}@{d}"),
        None => name,
    }
}

fn read_blob(store: &Path, digest: &str) -> Result<Vec<u8>, String> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("digest {digest:?} is not sha256"))?;
    let path = store.join("blobs/sha256").join(hex);
    let data = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    check_digest(&data, digest)?;
    Ok(data)
}

fn check_digest(data: &[u8], digest: &str) -> Result<(), String> {
    let got = format!("sha256:{:x}", Sha256::digest(data));
    if got != digest {
        return Err(format!("blob {digest} has digest {got}"));
    }
    Ok(())
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The platform of this node as OCI names it (`os`, `architecture`): this machine's.
pub fn node_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    ("linux", arch)
}

const INDEX_MEDIA_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// Whether a descriptor's platform is `platform`: the same os and architecture; arm64's
/// variant, when given, `v8` (what a runtime on an arm64 node takes).
fn platform_matches(p: &serde_json::Value, platform: (&str, &str)) -> bool {
    let variant = p["variant"].as_str().unwrap_or_default();
    p["os"] == platform.0
        && p["architecture"] == platform.1
        && (variant.is_empty() || (platform.1 == "arm64" && variant == "v8"))
}

/// The manifest a descriptor leads to on `platform`: itself, or for an image index (nested
/// ones too, a few levels) the entry of that platform. Returns its digest and its JSON.
fn resolve_manifest(
    store: &Path,
    descriptor: &serde_json::Value,
    platform: (&str, &str),
) -> Result<(String, serde_json::Value), String> {
    let mut digest = descriptor["digest"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for _ in 0..4 {
        let doc: serde_json::Value = serde_json::from_slice(&read_blob(store, &digest)?)
            .map_err(|e| format!("manifest {digest}: {e}"))?;
        let media = doc["mediaType"].as_str().unwrap_or_default();
        let is_index =
            INDEX_MEDIA_TYPES.contains(&media) || (media.is_empty() && doc["manifests"].is_array());
        if !is_index {
            return Ok((digest, doc));
        }
        let Some(entry) = doc["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| platform_matches(&m["platform"], platform))
        else {
            return Err(format!(
                "no matching manifest for {}/{} in the manifest list entries",
                platform.0, platform.1
            ));
        };
        digest = entry["digest"].as_str().unwrap_or_default().to_string();
    }
    Err(format!("image index {digest}: nested too deeply"))
}

/// The image of `reference` in the store for this node's platform, `Ok(None)` when the store
/// does not hold it.
pub fn find(store: &Path, reference: &str) -> Result<Option<Image>, String> {
    find_for(store, reference, node_platform())
}

/// The image of `reference` in the store for `platform` (`os`, `architecture`).
pub fn find_for(
    store: &Path,
    reference: &str,
    platform: (&str, &str),
) -> Result<Option<Image>, String> {
    let index_path = store.join("index.json");
    let Ok(index) = std::fs::read(&index_path) else {
        return Ok(None);
    };
    let index: serde_json::Value =
        serde_json::from_slice(&index).map_err(|e| format!("{}: {e}", index_path.display()))?;
    let want = normalize(reference);
    let Some(entry) = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| {
            let name = m["annotations"]["io.containerd.image.name"]
                .as_str()
                .unwrap_or_default();
            let digest = m["digest"].as_str().unwrap_or_default();
            !name.is_empty()
                && (normalize(name) == want || {
                    // `name@sha256:…` (or `name:tag@sha256:…`) of this manifest
                    let base = name.rsplit_once(':').map_or(name, |(n, _)| n);
                    want == normalize(&format!("{base}@{digest}"))
                        || want == normalize(&format!("{name}@{digest}"))
                })
        })
    else {
        return Ok(None);
    };
    let digest = entry["digest"].as_str().unwrap_or_default().to_string();
    let (manifest_digest, manifest) =
        resolve_manifest(store, entry, platform).map_err(|e| format!("image {reference}: {e}"))?;
    let config_digest = manifest["config"]["digest"].as_str().unwrap_or_default();
    let config: serde_json::Value = serde_json::from_slice(&read_blob(store, config_digest)?)
        .map_err(|e| format!("config {config_digest}: {e}"))?;
    if config["os"] != platform.0 || config["architecture"] != platform.1 {
        return Err(format!(
            "image {reference}: platform {}/{} cannot run on this {}/{} node",
            config["os"], config["architecture"], platform.0, platform.1
        ));
    }
    let c = &config["config"];
    let run = RunConfig {
        user: c["User"].as_str().unwrap_or_default().to_string(),
        entrypoint: strings(&c["Entrypoint"]),
        cmd: strings(&c["Cmd"]),
        env: strings(&c["Env"])
            .into_iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect(),
        working_dir: c["WorkingDir"].as_str().unwrap_or_default().to_string(),
    };
    let mut layers = Vec::new();
    for l in manifest["layers"].as_array().into_iter().flatten() {
        let media = l["mediaType"].as_str().unwrap_or_default();
        if !media.ends_with("tar+gzip") && !media.ends_with(".tar.gzip") {
            return Err(format!(
                "image {reference}: layer type {media} is not handled"
            ));
        }
        let d = l["digest"].as_str().unwrap_or_default();
        let hex = d.strip_prefix("sha256:").unwrap_or_default();
        layers.push((store.join("blobs/sha256").join(hex), d.to_string()));
    }
    Ok(Some(Image {
        digest,
        manifest_digest,
        config: run,
        layers,
    }))
}

/// The image's root filesystem, unpacked once under `data_dir/images/<digest>/rootfs`.
pub fn unpack(image: &Image, data_dir: &Path) -> Result<PathBuf, String> {
    let hex = image.manifest_digest.trim_start_matches("sha256:");
    let dir = data_dir.join("images").join(hex);
    let rootfs = dir.join("rootfs");
    if rootfs.is_dir() {
        return Ok(rootfs);
    }
    let tmp = dir.join(format!("rootfs.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    for (path, digest) in &image.layers {
        let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        check_digest(&data, digest)?;
        let list = std::process::Command::new("tar")
            .args(["-tzf"])
            .arg(path)
            .output()
            .map_err(|e| format!("tar: {e}"))?;
        let names = String::from_utf8_lossy(&list.stdout);
        if let Some(bad) = names.lines().find(|n| {
            n.starts_with('/')
                || n.split('/').any(|p| p == "..")
                || n.rsplit('/').next().is_some_and(|b| b.starts_with(".wh."))
        }) {
            return Err(format!(
                "layer {digest}: entry {bad:?} (absolute, `..` or a whiteout) is refused"
            ));
        }
        let out = std::process::Command::new("tar")
            .args([
                "--same-owner",
                "--same-permissions",
                "--numeric-owner",
                "-xzf",
            ])
            .arg(path)
            .arg("-C")
            .arg(&tmp)
            .output()
            .map_err(|e| format!("tar: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "unpacking layer {digest}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    std::fs::rename(&tmp, &rootfs).map_err(|e| format!("{}: {e}", rootfs.display()))?;
    Ok(rootfs)
}

/// The container's own copy of the image's root filesystem (a runtime's writable layer), fresh
/// at each start.
pub fn container_root(rootfs: &Path, container_dir: &Path) -> Result<PathBuf, String> {
    let root = container_dir.join("rootfs");
    let _ = std::fs::remove_dir_all(&root);
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(rootfs)
        .arg(&root)
        .output()
        .map_err(|e| format!("cp: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "copying {}: {}",
            rootfs.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(root)
}

/// `User` of the config (`uid`, `uid:gid`, `name`, `name:group`) as numbers, names looked up in
/// the image's own `/etc/passwd` and `/etc/group`; empty is root. Returns (uid, gid, home).
pub fn user(rootfs: &Path, spec: &str) -> Result<(u32, u32, String), String> {
    if spec.is_empty() {
        return Ok((0, 0, "/root".into()));
    }
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap_or_default();
    let group = std::fs::read_to_string(rootfs.join("etc/group")).unwrap_or_default();
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let entry = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 6 && (f[0] == u || f[2] == u)).then(|| {
            (
                f[2].parse::<u32>().ok(),
                f[3].parse::<u32>().ok(),
                f[5].to_string(),
            )
        })
    });
    let uid = match u.parse::<u32>() {
        Ok(n) => n,
        Err(_) => entry
            .as_ref()
            .and_then(|e| e.0)
            .ok_or_else(|| format!("image user {u:?} is not in the image's /etc/passwd"))?,
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => group
                .lines()
                .find_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    (f.len() >= 3 && f[0] == g).then(|| f[2].parse::<u32>().ok())?
                })
                .ok_or_else(|| format!("image group {g:?} is not in the image's /etc/group"))?,
        },
        None => entry.as_ref().and_then(|e| e.1).unwrap_or(uid),
    };
    let home = entry.map(|e| e.2).unwrap_or_else(|| "/".into());
    Ok((uid, gid, home))
}

/// The process a container runs, by Kubernetes' rules: `command` replaces the image's
/// `Entrypoint` (and drops its `Cmd`), `args` replace `Cmd`.
pub fn argv(config: &RunConfig, command: &[String], args: &[String]) -> Vec<String> {
    let mut a: Vec<String> = if command.is_empty() {
        config.entrypoint.clone()
    } else {
        command.to_vec()
    };
    if !args.is_empty() {
        a.extend(args.iter().cloned());
    } else if command.is_empty() {
        a.extend(config.cmd.iter().cloned());
    }
    a
}

/// `local-kubelet chroot-exec --root R --wd W --uid U --gid G --groups a,b -- argv…`: enters
/// the container's root filesystem, becomes its user and runs its process (what a runtime's
/// `runc init` does last). Never returns; 127 when the program cannot be started.
pub fn chroot_exec(args: &[String]) -> ! {
    let fail = |m: String| -> ! {
        eprintln!("local-kubelet chroot-exec: {m}");
        std::process::exit(127)
    };
    let mut root = None;
    let mut wd = "/".to_string();
    let (mut uid, mut gid) = (0u32, 0u32);
    let mut groups: Vec<libc::gid_t> = Vec::new();
    let mut it = args.iter();
    let mut argv: Vec<String> = Vec::new();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .unwrap_or_else(|| fail(format!("{a} needs a value")))
        };
        match a.as_str() {
            "--root" => root = Some(val()),
            "--wd" => wd = val(),
            "--uid" => uid = val().parse().unwrap_or_else(|_| fail("--uid".into())),
            "--gid" => gid = val().parse().unwrap_or_else(|_| fail("--gid".into())),
            "--groups" => {
                groups = val()
                    .split(',')
                    .filter(|g| !g.is_empty())
                    .map(|g| g.parse().unwrap_or_else(|_| fail("--groups".into())))
                    .collect()
            }
            "--" => {
                argv = it.by_ref().cloned().collect();
                break;
            }
            other => fail(format!("unknown argument {other}")),
        }
    }
    let root = root.unwrap_or_else(|| fail("--root is required".into()));
    if argv.is_empty() {
        fail("no program: the image has no Entrypoint or Cmd and the pod no command".into());
    }
    let cstr = |s: &str| {
        std::ffi::CString::new(s).unwrap_or_else(|_| fail(format!("{s:?} holds a NUL byte")))
    };
    let c_root = cstr(&root);
    let c_wd = cstr(&wd);
    let c_argv: Vec<std::ffi::CString> = argv.iter().map(|a| cstr(a)).collect();
    let mut ptrs: Vec<*const libc::c_char> = c_argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: plain system calls on valid NUL-terminated strings and a NULL-terminated argv
    // that outlive them; on success execvp does not return.
    unsafe {
        if libc::chroot(c_root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
            fail(format!(
                "chroot {root}: {}",
                std::io::Error::last_os_error()
            ));
        }
        if libc::chdir(c_wd.as_ptr()) != 0 {
            fail(format!(
                "working directory {wd}: {}",
                std::io::Error::last_os_error()
            ));
        }
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
        {
            fail(format!(
                "becoming {uid}:{gid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        libc::execvp(ptrs[0], ptrs.as_ptr());
    }
    fail(format!(
        "exec {:?}: {}",
        argv[0],
        std::io::Error::last_os_error()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_compared_as_a_runtime_normalizes_them() {
        assert_eq!(
            normalize("clickhouse-operator"),
            "clickhouse-operator:latest"
        );
        assert_eq!(
            normalize("docker.io/library/clickhouse-operator:0.1.0"),
            "clickhouse-operator:0.1.0"
        );
        assert_eq!(
            normalize("registry.example:5000/team/clickhouse-operator:0.1.0"),
            "registry.example:5000/team/clickhouse-operator:0.1.0"
        );
        assert_eq!(
            normalize("registry.example:5000/clickhouse-operator"),
            "registry.example:5000/clickhouse-operator:latest"
        );
    }

    #[test]
    fn command_replaces_the_entrypoint_and_args_replace_cmd() {
        let c = RunConfig {
            entrypoint: vec!["/clickhouse-operator".into()],
            cmd: vec!["run".into()],
            ..Default::default()
        };
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(argv(&c, &[], &[]), s(&["/clickhouse-operator", "run"]));
        assert_eq!(
            argv(&c, &[], &s(&["exporter"])),
            s(&["/clickhouse-operator", "exporter"])
        );
        assert_eq!(argv(&c, &s(&["/other"]), &[]), s(&["/other"]));
        assert_eq!(argv(&c, &s(&["/other"]), &s(&["x"])), s(&["/other", "x"]));
    }

    #[test]
    fn the_image_user_is_read_from_its_own_passwd_and_group() {
        let dir = std::env::temp_dir().join(format!("lk-oci-user-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(
            dir.join("etc/passwd"),
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n",
        )
        .unwrap();
        std::fs::write(dir.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
        assert_eq!(
            user(&dir, "65532:65532").unwrap(),
            (65532, 65532, "/home/nonroot".into())
        );
        assert_eq!(
            user(&dir, "nonroot").unwrap(),
            (65532, 65532, "/home/nonroot".into())
        );
        assert_eq!(user(&dir, "nonroot:root").unwrap().1, 0);
        assert_eq!(user(&dir, "").unwrap(), (0, 0, "/root".into()));
        assert_eq!(user(&dir, "1000").unwrap(), (1000, 1000, "/".into()));
        assert!(user(&dir, "nobody").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_blob_whose_content_does_not_match_its_digest_is_refused() {
        let dir = std::env::temp_dir().join(format!("lk-oci-blob-{}", std::process::id()));
        let data = b"{}";
        let good = format!("{:x}", Sha256::digest(data));
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("blobs/sha256").join(&good), b"{ }").unwrap();
        let err = read_blob(&dir, &format!("sha256:{good}")).unwrap_err();
        assert!(err.contains("has digest"), "{err}");
        assert!(read_blob(&dir, "sha256:../../etc/passwd").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A layout in a fresh folder: blobs written under their digests, index.json naming `top`
    /// as `clickhouse-operator:0.1.0`. Returns the folder and the digest of each blob given.
    fn layout(
        name: &str,
        blobs: &[Vec<u8>],
        top: usize,
        top_media: &str,
    ) -> (PathBuf, Vec<String>) {
        let dir = std::env::temp_dir().join(format!("lk-oci-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        let digests: Vec<String> = blobs
            .iter()
            .map(|b| {
                let hex = format!("{:x}", Sha256::digest(b));
                std::fs::write(dir.join("blobs/sha256").join(&hex), b).unwrap();
                format!("sha256:{hex}")
            })
            .collect();
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": top_media, "digest": digests[top], "size": blobs[top].len(),
            "annotations": {"io.containerd.image.name": "clickhouse-operator:0.1.0"}}]});
        std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
        (dir, digests)
    }

    fn config(arch: &str, user: &str) -> Vec<u8> {
        serde_json::json!({"os": "linux", "architecture": arch,
            "config": {"User": user, "Entrypoint": ["/clickhouse-operator"]}})
        .to_string()
        .into_bytes()
    }

    fn manifest(config: &[u8]) -> Vec<u8> {
        serde_json::json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"digest": format!("sha256:{:x}", Sha256::digest(config))},
            "layers": []})
        .to_string()
        .into_bytes()
    }

    fn image_index(entries: &[(&[u8], &str, Option<&str>)]) -> Vec<u8> {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(m, arch, variant)| {
                let mut platform = serde_json::json!({"os": "linux", "architecture": arch});
                if let Some(v) = variant {
                    platform["variant"] = serde_json::json!(v);
                }
                serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": format!("sha256:{:x}", Sha256::digest(m)), "size": m.len(),
                    "platform": platform})
            })
            .collect();
        serde_json::json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests})
        .to_string()
        .into_bytes()
    }

    const INDEX: &str = "application/vnd.oci.image.index.v1+json";

    /// An image index of linux/amd64 and linux/arm64 (what `hack/image.sh` writes): an amd64
    /// node runs the amd64 manifest, an arm64 node the arm64 one; both report the index's
    /// digest as the image's, as a runtime reports the repository digest.
    #[test]
    fn an_image_index_resolves_to_the_manifest_of_the_nodes_platform() {
        let (ca, cr) = (config("amd64", "65532:65532"), config("arm64", "1:1"));
        let (ma, mr) = (manifest(&ca), manifest(&cr));
        let idx = image_index(&[(&ma, "amd64", None), (&mr, "arm64", Some("v8"))]);
        let (dir, d) = layout("index", &[ca, cr, ma, mr, idx], 4, INDEX);
        let amd = find_for(&dir, "clickhouse-operator:0.1.0", ("linux", "amd64"))
            .unwrap()
            .unwrap();
        assert_eq!(amd.digest, d[4], "imageID: the index's digest");
        assert_eq!(amd.manifest_digest, d[2], "the amd64 manifest");
        assert_eq!(amd.config.user, "65532:65532");
        let arm = find_for(&dir, "clickhouse-operator:0.1.0", ("linux", "arm64"))
            .unwrap()
            .unwrap();
        assert_eq!(arm.manifest_digest, d[3], "the arm64 manifest (variant v8)");
        assert_eq!(arm.config.user, "1:1");
        // by the index's digest too
        let by_digest = format!("clickhouse-operator@{}", d[4]);
        assert_eq!(
            find_for(&dir, &by_digest, ("linux", "amd64"))
                .unwrap()
                .unwrap()
                .manifest_digest,
            d[2]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An index without the node's platform is refused with the runtime's words, as a kubelet
    /// reports it (the pod does not start); so is a manifest whose config names another
    /// platform than its index entry.
    #[test]
    fn an_image_index_without_the_nodes_platform_is_refused_as_a_runtime_refuses_it() {
        let cr = config("arm64", "65532:65532");
        let mr = manifest(&cr);
        let idx = image_index(&[(&mr, "arm64", None)]);
        let (dir, _) = layout("noamd64", &[cr.clone(), mr.clone(), idx], 2, INDEX);
        let err = find_for(&dir, "clickhouse-operator:0.1.0", ("linux", "amd64")).unwrap_err();
        assert!(
            err.contains("no matching manifest for linux/amd64 in the manifest list entries"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        // an index entry that says amd64 for an arm64 image
        let lying = image_index(&[(&mr, "amd64", None)]);
        let (dir, _) = layout("lying", &[cr, mr, lying], 2, INDEX);
        let err = find_for(&dir, "clickhouse-operator:0.1.0", ("linux", "amd64")).unwrap_err();
        assert!(err.contains("cannot run on this linux/amd64 node"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A single-platform image (a manifest named directly by index.json) still runs, with the
    /// manifest's digest as the image's.
    #[test]
    fn a_single_platform_manifest_is_read_as_before() {
        let ca = config("amd64", "65532:65532");
        let ma = manifest(&ca);
        let (dir, d) = layout(
            "single",
            &[ca, ma],
            1,
            "application/vnd.oci.image.manifest.v1+json",
        );
        let img = find_for(&dir, "clickhouse-operator:0.1.0", ("linux", "amd64"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (img.digest.as_str(), img.manifest_digest.as_str()),
            (d[1].as_str(), d[1].as_str())
        );
        assert!(
            find_for(&dir, "other:0.1.0", ("linux", "amd64"))
                .unwrap()
                .is_none()
        );
        let err = find_for(&dir, "clickhouse-operator:0.1.0", ("linux", "arm64")).unwrap_err();
        assert!(err.contains("cannot run on this linux/arm64 node"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
