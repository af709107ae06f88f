//! Pod volumes as folders of this machine: ConfigMap, Secret, downwardAPI and projected volumes
//! are written under the pod's folder and kept up to date (like the kubelet: files replaced by
//! rename inside the bind-mounted folder), emptyDir is a folder, a PVC is its PV's folder.

use crate::SharedCtx;
use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod,
    Secret, ServiceAccount, Volume,
};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Clone, Debug, PartialEq)]
pub enum VolKind {
    /// written by the agent (configMap, secret, projected, downwardAPI)
    Generated,
    EmptyDir,
    Persistent,
    HostPath,
}

#[derive(Clone, Debug)]
pub struct Vol {
    pub path: PathBuf,
    pub kind: VolKind,
}

/// service account, audiences, expiration
type TokenKey = (String, Vec<String>, i64);

#[derive(Default)]
pub struct VolumeState {
    pub vols: HashMap<String, Vol>,
    tokens: HashMap<TokenKey, (String, Instant, i64)>,
    /// per generated volume folder: what was last written there and when
    written: HashMap<PathBuf, (u64, Instant)>,
}

/// How often a generated volume whose content did not change is compared with its files on
/// disk anyway (something else changed or removed them): the sync runs every second for every
/// pod, and reading back every file of a thousand pods each second is needless work.
const RESYNC: std::time::Duration = std::time::Duration::from_secs(60);

type Files = BTreeMap<String, (Vec<u8>, u32)>;

pub fn field_value(pod: &Pod, path: &str) -> Result<String> {
    let md = &pod.metadata;
    let map_fmt = |m: Option<&BTreeMap<String, String>>| -> String {
        m.map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
    };
    let status = pod.status.as_ref();
    Ok(match path {
        "metadata.name" => md.name.clone().unwrap_or_default(),
        "metadata.namespace" => md.namespace.clone().unwrap_or_default(),
        "metadata.uid" => md.uid.clone().unwrap_or_default(),
        "metadata.labels" => map_fmt(md.labels.as_ref()),
        "metadata.annotations" => map_fmt(md.annotations.as_ref()),
        "spec.nodeName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        "status.podIP" | "status.podIPs" => {
            status.and_then(|s| s.pod_ip.clone()).unwrap_or_default()
        }
        "status.hostIP" | "status.hostIPs" => crate::net::node_ip().to_string(),
        p if p.starts_with("metadata.labels['") || p.starts_with("metadata.annotations['") => {
            let key = p
                .split("['")
                .nth(1)
                .and_then(|k| k.strip_suffix("']"))
                .unwrap_or_default();
            let m = if p.starts_with("metadata.labels") {
                md.labels.as_ref()
            } else {
                md.annotations.as_ref()
            };
            m.and_then(|m| m.get(key).cloned()).unwrap_or_default()
        }
        other => bail!("unsupported fieldPath {other}"),
    })
}

fn resource_value(pod: &Pod, container: Option<&str>, resource: &str) -> String {
    let c = pod.spec.as_ref().and_then(|s| {
        s.containers
            .iter()
            .find(|c| Some(c.name.as_str()) == container)
            .or(s.containers.first())
    });
    let (kind, res) = resource.split_once('.').unwrap_or(("limits", resource));
    let r = c.and_then(|c| c.resources.as_ref());
    let q = r.and_then(|r| {
        if kind == "limits" {
            r.limits.as_ref()
        } else {
            r.requests.as_ref()
        }
        .and_then(|m| m.get(res))
        .map(|q| q.0.clone())
    });
    match (q, res) {
        (Some(q), _) => q,
        (None, "cpu") => "2".into(),
        (None, "memory") => (24u64 << 30).to_string(),
        _ => "0".into(),
    }
}

fn cm_files(
    ctx: &SharedCtx,
    ns: &str,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    mode: u32,
    optional: bool,
    out: &mut Files,
) -> Result<()> {
    let Some(cm) = ctx
        .configmaps
        .get(&ObjectRef::<ConfigMap>::new(name).within(ns))
    else {
        if optional {
            return Ok(());
        }
        bail!("configmap \"{name}\" not found");
    };
    let mut all: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in cm.data.iter().flatten() {
        all.insert(k.clone(), v.clone().into_bytes());
    }
    for (k, v) in cm.binary_data.iter().flatten() {
        all.insert(k.clone(), v.0.clone());
    }
    select_items(
        all,
        items,
        mode,
        optional,
        &format!("configmap {ns}/{name}"),
        out,
    )
}

fn secret_files(
    ctx: &SharedCtx,
    ns: &str,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    mode: u32,
    optional: bool,
    out: &mut Files,
) -> Result<()> {
    let Some(s) = ctx.secrets.get(&ObjectRef::<Secret>::new(name).within(ns)) else {
        if optional {
            return Ok(());
        }
        bail!("secret \"{name}\" not found");
    };
    let mut all: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in s.data.iter().flatten() {
        all.insert(k.clone(), v.0.clone());
    }
    for (k, v) in s.string_data.iter().flatten() {
        all.insert(k.clone(), v.clone().into_bytes());
    }
    select_items(
        all,
        items,
        mode,
        optional,
        &format!("secret {ns}/{name}"),
        out,
    )
}

fn select_items(
    all: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    mode: u32,
    optional: bool,
    what: &str,
    out: &mut Files,
) -> Result<()> {
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                match all.get(&it.key) {
                    Some(v) => {
                        out.insert(
                            it.path.clone(),
                            (v.clone(), it.mode.map(|m| m as u32).unwrap_or(mode)),
                        );
                    }
                    None if optional => {}
                    None => bail!("couldn't find key {} in {what}", it.key),
                }
            }
        }
        _ => {
            for (k, v) in all {
                out.insert(k, (v, mode));
            }
        }
    }
    Ok(())
}

fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    mode: u32,
    out: &mut Files,
) -> Result<()> {
    for it in items {
        let v = if let Some(f) = &it.field_ref {
            field_value(pod, &f.field_path)?
        } else if let Some(r) = &it.resource_field_ref {
            resource_value(pod, r.container_name.as_deref(), &r.resource)
        } else {
            String::new()
        };
        out.insert(
            it.path.clone(),
            (v.into_bytes(), it.mode.map(|m| m as u32).unwrap_or(mode)),
        );
    }
    Ok(())
}

impl VolumeState {
    /// Writes a generated volume's files unless the same content was written to the same
    /// folder within [`RESYNC`].
    fn write(
        &mut self,
        dir: &Path,
        files: &Files,
        fs_group: Option<u32>,
        keep: &[String],
    ) -> Result<()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (files, fs_group, keep).hash(&mut h);
        let hash = h.finish();
        if let Some((last, at)) = self.written.get(dir)
            && *last == hash
            && at.elapsed() < RESYNC
        {
            return Ok(());
        }
        write_files(dir, files, fs_group, keep)?;
        self.written
            .insert(dir.to_path_buf(), (hash, Instant::now()));
        Ok(())
    }

    async fn token(
        &mut self,
        ctx: &SharedCtx,
        pod: &Pod,
        audiences: Vec<String>,
        exp: i64,
    ) -> Result<String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let key = (sa.clone(), audiences.clone(), exp);
        if let Some((t, at, e)) = self.tokens.get(&key)
            && at.elapsed().as_secs() < (*e as u64) * 8 / 10
        {
            return Ok(t.clone());
        }
        let tr: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": audiences, "expirationSeconds": exp,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                    "name": pod.metadata.name, "uid": pod.metadata.uid}}
        }))?;
        let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &ns);
        let res = api
            .create_token_request(&sa, &PostParams::default(), &tr)
            .await
            .with_context(|| format!("token for serviceaccount {ns}/{sa}"))?;
        let token = res.status.and_then(|s| s.token).unwrap_or_default();
        let granted = exp.max(600);
        self.tokens
            .insert(key, (token.clone(), Instant::now(), granted));
        Ok(token)
    }

    /// Makes every volume of the pod exist and be current. Errors name what is missing.
    pub async fn sync(&mut self, ctx: &SharedCtx, pod: &Pod, pod_dir: &Path) -> Result<()> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let spec = pod.spec.as_ref().context("pod without spec")?;
        let fs_group = spec
            .security_context
            .as_ref()
            .and_then(|s| s.fs_group)
            .map(|g| g as u32);
        let vols: Vec<Volume> = spec.volumes.clone().unwrap_or_default();
        for v in &vols {
            let dir = pod_dir.join("volumes").join(&v.name);
            let vol = if let Some(files) = self.generated_files(ctx, pod, &ns, v).await? {
                self.write(&dir, &files, fs_group, &nested_mount_points(spec, &v.name))?;
                Vol {
                    path: dir,
                    kind: VolKind::Generated,
                }
            } else {
                self.storage(ctx, pod, &ns, v, dir).await?
            };
            self.vols.insert(v.name.clone(), vol);
        }
        Ok(())
    }

    /// The files of a configMap, secret, downwardAPI or projected volume; `None` for a volume
    /// of another kind.
    async fn generated_files(
        &mut self,
        ctx: &SharedCtx,
        pod: &Pod,
        ns: &str,
        v: &Volume,
    ) -> Result<Option<Files>> {
        let mut files = Files::new();
        if let Some(cm) = &v.config_map {
            let mode = cm.default_mode.unwrap_or(0o644) as u32;
            cm_files(
                ctx,
                ns,
                &cm.name,
                cm.items.as_ref(),
                mode,
                cm.optional.unwrap_or(false),
                &mut files,
            )?;
        } else if let Some(s) = &v.secret {
            let mode = s.default_mode.unwrap_or(0o644) as u32;
            let name = s.secret_name.clone().unwrap_or_default();
            secret_files(
                ctx,
                ns,
                &name,
                s.items.as_ref(),
                mode,
                s.optional.unwrap_or(false),
                &mut files,
            )?;
        } else if let Some(d) = &v.downward_api {
            let mode = d.default_mode.unwrap_or(0o644) as u32;
            downward_files(
                pod,
                d.items.as_deref().unwrap_or_default(),
                mode,
                &mut files,
            )?;
        } else if let Some(p) = &v.projected {
            let mode = p.default_mode.unwrap_or(0o644) as u32;
            for src in p.sources.iter().flatten() {
                if let Some(t) = &src.service_account_token {
                    let token = self
                        .token(
                            ctx,
                            pod,
                            t.audience.clone().into_iter().collect(),
                            t.expiration_seconds.unwrap_or(3607),
                        )
                        .await?;
                    files.insert(t.path.clone(), (token.into_bytes(), mode));
                }
                if let Some(cm) = &src.config_map {
                    cm_files(
                        ctx,
                        ns,
                        &cm.name,
                        cm.items.as_ref(),
                        mode,
                        cm.optional.unwrap_or(false),
                        &mut files,
                    )?;
                }
                if let Some(s) = &src.secret {
                    secret_files(
                        ctx,
                        ns,
                        &s.name,
                        s.items.as_ref(),
                        mode,
                        s.optional.unwrap_or(false),
                        &mut files,
                    )?;
                }
                if let Some(d) = &src.downward_api {
                    downward_files(
                        pod,
                        d.items.as_deref().unwrap_or_default(),
                        mode,
                        &mut files,
                    )?;
                }
            }
        } else {
            return Ok(None);
        }
        Ok(Some(files))
    }

    /// A volume that holds data: an emptyDir (made once, kept while the pod runs), a claim's
    /// volume folder, or a hostPath; any other kind is an error.
    async fn storage(
        &self,
        ctx: &SharedCtx,
        pod: &Pod,
        ns: &str,
        v: &Volume,
        dir: PathBuf,
    ) -> Result<Vol> {
        Ok(if v.empty_dir.is_some() {
            if let Some(v) = self.vols.get(&v.name) {
                v.clone()
            } else {
                std::fs::create_dir_all(&dir)?;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
                Vol {
                    path: dir,
                    kind: VolKind::EmptyDir,
                }
            }
        } else if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
            if let Some(v) = self.vols.get(&v.name) {
                v.clone()
            } else {
                let claim = match &v.persistent_volume_claim {
                    Some(c) => c.claim_name.clone(),
                    None => format!(
                        "{}-{}",
                        pod.metadata.name.clone().unwrap_or_default(),
                        v.name
                    ),
                };
                let path = pv_path(ctx, ns, &claim).await?;
                std::fs::create_dir_all(&path)?;
                Vol {
                    path,
                    kind: VolKind::Persistent,
                }
            }
        } else if let Some(h) = &v.host_path {
            let p = PathBuf::from(&h.path);
            if !p.exists() && h.type_.as_deref() == Some("DirectoryOrCreate") {
                std::fs::create_dir_all(&p)?;
            }
            Vol {
                path: p,
                kind: VolKind::HostPath,
            }
        } else {
            bail!(
                "volume {}: this node supports configMap, secret, projected, downwardAPI, emptyDir, persistentVolumeClaim, ephemeral and hostPath volumes",
                v.name
            );
        })
    }
}

async fn pv_path(ctx: &SharedCtx, ns: &str, claim: &str) -> Result<PathBuf> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let pvc = pvcs
        .get_opt(claim)
        .await?
        .ok_or_else(|| anyhow!("persistentvolumeclaim \"{claim}\" not found"))?;
    crate::storage::expand_at_mount(ctx, &pvc).await;
    let vn = pvc
        .spec
        .and_then(|s| s.volume_name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| anyhow!("persistentvolumeclaim \"{claim}\" is not bound"))?;
    let pv = Api::<PersistentVolume>::all(ctx.client.clone())
        .get(&vn)
        .await?;
    let spec = pv.spec.context("pv without spec")?;
    if let Some(h) = spec.host_path {
        return Ok(PathBuf::from(h.path));
    }
    if let Some(l) = spec.local {
        return Ok(PathBuf::from(l.path));
    }
    bail!("persistentvolume {vn} is neither hostPath nor local")
}

/// The folders of volume `volume`, relative to it, where other volumes are mounted (a volume
/// mounted at `/etc/x/a` while `volume` is at `/etc/x`: `a`), with every folder above them:
/// the mount points a sync of the volume's files must keep, as a real kubelet does (removing
/// one on the host detaches the mount in the pod).
fn nested_mount_points(spec: &k8s_openapi::api::core::v1::PodSpec, volume: &str) -> Vec<String> {
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let mut keep = Vec::new();
    for c in containers {
        let mounts = c.volume_mounts.as_deref().unwrap_or_default();
        for m in mounts.iter().filter(|m| m.name == volume) {
            let base = format!("{}/", m.mount_path.trim_end_matches('/'));
            let sub = m.sub_path.as_deref().unwrap_or_default().trim_matches('/');
            for other in mounts {
                let Some(rel) = other.mount_path.strip_prefix(&base) else {
                    continue;
                };
                let rel = rel.trim_matches('/');
                if rel.is_empty() {
                    continue;
                }
                let rel = if sub.is_empty() {
                    rel.to_string()
                } else {
                    format!("{sub}/{rel}")
                };
                let mut at = String::new();
                for part in rel.split('/') {
                    if !at.is_empty() {
                        at.push('/');
                    }
                    at.push_str(part);
                    keep.push(at.clone());
                }
            }
        }
    }
    keep.sort();
    keep.dedup();
    keep
}

/// Writes the files (replacing changed ones by rename), removes files no longer wanted, except
/// the folders in `keep` (mount points of other volumes).
fn write_files(dir: &Path, files: &Files, fs_group: Option<u32>, keep: &[String]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for (rel, (data, mode)) in files {
        let rel = rel.trim_start_matches('/');
        if rel.split('/').any(|c| c == "..") {
            bail!("invalid path {rel}");
        }
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut mode = *mode & 0o7777;
        if fs_group.is_some() {
            mode |= 0o040;
        }
        let same = std::fs::read(&p).ok().as_deref() == Some(data.as_slice())
            && std::fs::metadata(&p)
                .map(|m| m.permissions().mode() & 0o7777 == mode)
                .unwrap_or(false);
        if same {
            continue;
        }
        let tmp = p.with_file_name(format!(
            ".{}.tmp",
            p.file_name().unwrap_or_default().to_string_lossy()
        ));
        std::fs::write(&tmp, data)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        if let Some(g) = fs_group {
            crate::util::chown(&tmp, None, Some(g));
        }
        std::fs::rename(&tmp, &p)?;
    }
    remove_unwanted(dir, dir, files, keep);
    Ok(())
}

fn remove_unwanted(root: &Path, dir: &Path, files: &Files, keep: &[String]) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let rel = p
            .strip_prefix(root)
            .unwrap_or(&p)
            .to_string_lossy()
            .to_string();
        if p.is_dir() {
            let kept = keep.contains(&rel);
            // a mount point itself is left alone; what is above it is cleaned around it
            if kept && !keep.iter().any(|k| k.starts_with(&format!("{rel}/"))) {
                continue;
            }
            remove_unwanted(root, &p, files, keep);
            if !kept && !files.keys().any(|k| k.starts_with(&format!("{rel}/"))) {
                let _ = std::fs::remove_dir(&p);
            }
        } else if !files.contains_key(&rel) && !keep.contains(&rel) {
            // (a file that is another volume's mount point stays)
            let _ = std::fs::remove_file(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generated volume is written when its content changes, not read back from disk every
    /// second while it does not, and compared with the disk again after [`RESYNC`] (a file
    /// removed behind the agent's back comes back then).
    #[test]
    fn generated_volumes_are_written_on_change_and_resynced_periodically() {
        let dir = std::env::temp_dir().join(format!("lk-vol-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut st = VolumeState::default();
        let mut files = Files::new();
        files.insert("a.xml".into(), (b"one".to_vec(), 0o644));
        st.write(&dir, &files, None, &[]).unwrap();
        assert_eq!(std::fs::read(dir.join("a.xml")).unwrap(), b"one");
        std::fs::remove_file(dir.join("a.xml")).unwrap();
        st.write(&dir, &files, None, &[]).unwrap();
        assert!(
            !dir.join("a.xml").exists(),
            "unchanged content is not rewritten"
        );
        files.insert("a.xml".into(), (b"two".to_vec(), 0o644));
        st.write(&dir, &files, None, &[]).unwrap();
        assert_eq!(std::fs::read(dir.join("a.xml")).unwrap(), b"two");
        std::fs::remove_file(dir.join("a.xml")).unwrap();
        let aged = Instant::now().checked_sub(RESYNC * 2).unwrap();
        st.written.get_mut(&dir).unwrap().1 = aged;
        st.write(&dir, &files, None, &[]).unwrap();
        assert_eq!(std::fs::read(dir.join("a.xml")).unwrap(), b"two");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Mount points of other volumes inside a volume, through a subPath too, with the folders
    /// above them; nothing for a volume with none inside.
    #[test]
    fn nested_mount_points_of_a_volume() {
        let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(json!({
            "initContainers": [{"name": "i", "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/x", "subPath": "s"},
                {"name": "d", "mountPath": "/etc/x/deep/er"}]}],
            "containers": [{"name": "c", "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/x/"},
                {"name": "a", "mountPath": "/etc/x/a"},
                {"name": "b", "mountPath": "/etc/xy"},
                {"name": "o", "mountPath": "/other"}]}]
        }))
        .unwrap();
        assert_eq!(
            nested_mount_points(&spec, "cfg"),
            ["a", "s", "s/deep", "s/deep/er"]
        );
        assert!(nested_mount_points(&spec, "o").is_empty());
    }
}
