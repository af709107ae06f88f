//! Who a container runs as and the environment it gets.

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use kube::runtime::reflector::ObjectRef;

use super::PodEnv;
use crate::util;

/// The uid, gid and home folder the container runs as: its security context's, else the pod's,
/// else the image's `User` (`image_user`, as in an image config: `uid[:gid]`; empty is root).
pub(super) fn run_as(pod: &Pod, c: &Container, image_user: &str) -> (u32, u32, String) {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = c.security_context.as_ref();
    let uid = csc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    let gid = csc
        .and_then(|s| s.run_as_group)
        .or_else(|| psc.and_then(|s| s.run_as_group));
    let (u, g, home) = match uid {
        Some(u) => match util::user_by_uid(u as u32) {
            Some((_, g, h)) => (u as u32, g, h),
            None => (u as u32, u as u32, "/".into()),
        },
        None => match numeric_user(image_user) {
            Some((0, g)) => (0, g.unwrap_or(0), "/root".into()),
            Some((u, g)) => (u, g.unwrap_or(u), "/".into()),
            None => util::lookup_user(image_user).unwrap_or((0, 0, "/root".into())),
        },
    };
    (u, gid.map(|g| g as u32).unwrap_or(g), home)
}

/// An image config's `User` as numbers: `""` is root, `"101:101"` (101, Some(101)); `None` for
/// a name.
fn numeric_user(spec: &str) -> Option<(u32, Option<u32>)> {
    if spec.is_empty() {
        return Some((0, None));
    }
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, g.parse().ok()),
        None => (spec, None),
    };
    Some((u.parse().ok()?, g))
}

/// The kubelet's check of `runAsNonRoot` (`verifyRunAsNonRoot`) before it creates a container:
/// with `runAsNonRoot`, a `runAsUser` of 0 breaks it; without a `runAsUser` the image's `User`
/// decides: none or 0 runs as root, a name cannot be verified; both are refused with the
/// kubelet's words. `pod` is the kubelet's `name_namespace(uid)`.
pub(crate) fn verify_run_as_non_root(
    non_root: bool,
    run_as_user: Option<i64>,
    image_user: &str,
    pod: &str,
    container: &str,
) -> Result<(), String> {
    if !non_root {
        return Ok(());
    }
    if let Some(u) = run_as_user {
        return if u == 0 {
            Err(format!(
                "container's runAsUser breaks non-root policy (pod: \"{pod}\", container: {container})"
            ))
        } else {
            Ok(())
        };
    }
    let user = image_user.split(':').next().unwrap_or_default();
    match numeric_user(image_user) {
        Some((0, _)) => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: \"{pod}\", container: {container})"
        )),
        Some(_) => Ok(()),
        None => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: \"{pod}\", container: {container})"
        )),
    }
}

/// The container's environment as the kubelet gives it: the kubelet's own variables, then
/// `envFrom`, then `env` (with `$(VAR)` references expanded); an error names a missing
/// ConfigMap, Secret or key that is not optional.
pub(super) fn container_env(
    env: &PodEnv,
    pod: &Pod,
    c: &Container,
) -> std::result::Result<Vec<(String, String)>, String> {
    let ctx = &env.ctx;
    let ns = &env.ns;
    let kip = ctx
        .services
        .get(&ObjectRef::<Service>::new("kubernetes").within("default"))
        .and_then(|s| s.spec.as_ref().and_then(|s| s.cluster_ip.clone()))
        .unwrap_or_else(|| "198.19.0.1".into());
    let mut out: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOSTNAME".into(), env.hostname.clone()),
        ("KUBERNETES_SERVICE_HOST".into(), kip.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), "443".into()),
        ("KUBERNETES_PORT".into(), format!("tcp://{kip}:443")),
        ("KUBERNETES_PORT_443_TCP".into(), format!("tcp://{kip}:443")),
        ("KUBERNETES_PORT_443_TCP_PROTO".into(), "tcp".into()),
        ("KUBERNETES_PORT_443_TCP_PORT".into(), "443".into()),
        ("KUBERNETES_PORT_443_TCP_ADDR".into(), kip),
    ];
    let cm = |name: &str| {
        ctx.configmaps
            .get(&ObjectRef::<ConfigMap>::new(name).within(ns))
    };
    let secret = |name: &str| ctx.secrets.get(&ObjectRef::<Secret>::new(name).within(ns));
    for ef in c.env_from.iter().flatten() {
        let prefix = ef.prefix.clone().unwrap_or_default();
        if let Some(r) = &ef.config_map_ref {
            match cm(&r.name) {
                Some(m) => {
                    for (k, v) in m.data.iter().flatten() {
                        out.push((format!("{prefix}{k}"), v.clone()));
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => return Err(format!("configmap \"{}\" not found", r.name)),
            }
        }
        if let Some(r) = &ef.secret_ref {
            match secret(&r.name) {
                Some(s) => {
                    for (k, v) in s.data.iter().flatten() {
                        out.push((
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        ));
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => return Err(format!("secret \"{}\" not found", r.name)),
            }
        }
    }
    let mut pod_with_ip = pod.clone();
    pod_with_ip
        .status
        .get_or_insert_with(Default::default)
        .pod_ip = Some(env.ip.to_string());
    for e in c.env.iter().flatten() {
        let v = if let Some(v) = &e.value {
            util::expand(v, &out)
        } else if let Some(vf) = &e.value_from {
            if let Some(f) = &vf.field_ref {
                crate::volumes::field_value(&pod_with_ip, &f.field_path)
                    .map_err(|e| e.to_string())?
            } else if let Some(r) = &vf.config_map_key_ref {
                match cm(&r.name).and_then(|m| m.data.as_ref().and_then(|d| d.get(&r.key).cloned()))
                {
                    Some(v) => v,
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(format!(
                            "couldn't find key {} in ConfigMap {ns}/{}",
                            r.key, r.name
                        ));
                    }
                }
            } else if let Some(r) = &vf.secret_key_ref {
                match secret(&r.name).and_then(|s| {
                    s.data
                        .as_ref()
                        .and_then(|d| d.get(&r.key))
                        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                }) {
                    Some(v) => v,
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(format!(
                            "couldn't find key {} in Secret {ns}/{}",
                            r.key, r.name
                        ));
                    }
                }
            } else if let Some(r) = &vf.resource_field_ref {
                c.resources
                    .as_ref()
                    .and_then(|res| {
                        let (k, n) = r.resource.split_once('.')?;
                        if k == "limits" {
                            res.limits.as_ref()
                        } else {
                            res.requests.as_ref()
                        }
                        .and_then(|m| m.get(n))
                        .map(|q| q.0.clone())
                    })
                    .unwrap_or_else(|| "0".into())
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        out.push((e.name.clone(), v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 52 item 1: the kubelet refuses `runAsNonRoot` for an image whose config has no
    /// numeric non-root `User` and no `runAsUser`, which the ClickHouse server and Keeper images
    /// (no `USER` line) are; a `runAsUser` or a numeric image user passes.
    #[test]
    fn run_as_non_root_is_checked_as_the_kubelet_does() {
        let p = "c1-keeper-0_ns(uid)";
        let e = verify_run_as_non_root(true, None, "", p, "keeper").unwrap_err();
        assert_eq!(
            e,
            "container has runAsNonRoot and image will run as root (pod: \"c1-keeper-0_ns(uid)\", container: keeper)"
        );
        assert!(verify_run_as_non_root(true, None, "0:0", p, "k").is_err());
        let e = verify_run_as_non_root(true, None, "clickhouse", p, "k").unwrap_err();
        assert!(
            e.contains("image has non-numeric user (clickhouse), cannot verify user is non-root"),
            "{e}"
        );
        let e = verify_run_as_non_root(true, Some(0), "101", p, "k").unwrap_err();
        assert!(
            e.starts_with("container's runAsUser breaks non-root policy"),
            "{e}"
        );
        assert!(verify_run_as_non_root(true, Some(101), "", p, "k").is_ok());
        assert!(verify_run_as_non_root(true, None, "101:101", p, "k").is_ok());
        assert!(verify_run_as_non_root(true, None, "65532", p, "k").is_ok());
        assert!(verify_run_as_non_root(false, None, "", p, "k").is_ok());
        assert_eq!(numeric_user("101:0"), Some((101, Some(0))));
    }
}
