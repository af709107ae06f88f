//! Images → programs of this machine. The repository name decides (registry and tag ignored):
//!
//! | image repository name        | program                                                       |
//! |------------------------------|---------------------------------------------------------------|
//! | `*clickhouse-server*`        | the emulated image entrypoint, then Debian's `clickhouse-server` (18.16), started as the image's user (root; `-distroless`: 101) |
//! | `*clickhouse-keeper*`        | the command, or the emulated image entrypoint: ZooKeeper 3.8 (`QuorumPeerMain`) behind Keeper's client port, zoo.cfg translated from the Keeper XML, started as the image's user (root; `-distroless`: 101) |
//! | `*clickhouse-operator*`      | the locally built operator binary with the container's args    |
//! | `busybox`, `debian`, `ubuntu`, `alpine`, `bash` | the container's command and args, run with this machine's programs |
//! | anything else                | not started: `ErrImagePull`, then `ImagePullBackOff`          |
//!
//! The tag matters for the image's variant (`-distroless`: no shell) and version (what the
//! server entrypoint honours); see `entrypoint.rs`.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ClickHouseServer,
    Keeper,
    Operator,
    Shell,
    Unknown,
}

/// `registry:5000/org/name:tag@sha256:…` → `name`
pub fn repository_name(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or_default();
    let last = no_digest.rsplit('/').next().unwrap_or_default();
    last.split(':').next().unwrap_or_default().to_string()
}

pub fn kind(image: &str) -> Kind {
    let name = repository_name(image);
    if name.contains("clickhouse-server") {
        Kind::ClickHouseServer
    } else if name.contains("clickhouse-keeper") {
        Kind::Keeper
    } else if name.contains("clickhouse-operator") {
        Kind::Operator
    } else if matches!(
        name.as_str(),
        "busybox" | "debian" | "ubuntu" | "alpine" | "bash"
    ) {
        Kind::Shell
    } else {
        Kind::Unknown
    }
}

/// The tag of an image reference (`""` without one).
pub fn tag(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or_default();
    let last = no_digest.rsplit('/').next().unwrap_or_default();
    last.split_once(':')
        .map(|(_, t)| t.to_string())
        .unwrap_or_default()
}

/// A `-distroless` tag (ClickHouse 26.x): no shell, no `/entrypoint.sh`.
pub fn is_distroless(image: &str) -> bool {
    tag(image).ends_with("-distroless")
}

/// The `User` of the image's config, as the real images declare it: none (root) for the
/// ClickHouse server and Keeper images, whose entrypoints start as root and change to the
/// `clickhouse` user (101) themselves, `101:101` for their `-distroless` tags; none for the
/// shell images.
pub fn image_user(kind: Kind, image: &str) -> &'static str {
    match kind {
        Kind::ClickHouseServer | Kind::Keeper if is_distroless(image) => "101:101",
        _ => "",
    }
}

/// Whether the image's `clickhouse su` accepts a numeric group that has no name, as OpenShift
/// gives (`GROUP=0` when the uid has no passwd entry): ClickHouse #71626 (November 2024), in
/// 24.11 and newer and backported to 24.3.14 and 24.8.7. Before it `su` looked a numeric gid of
/// 0 up by name and exited with "Group 0 is not found in the system". The floating tags `24.3`
/// and `24.8` are newer patch releases; an unknown version (`latest`, a digest) is the newest.
/// Images before 24.1 were not checked: emulated without the bug.
pub fn su_takes_numeric_group(image: &str) -> bool {
    let t = tag(image);
    let core = t.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<u32> = core.split('.').map_while(|p| p.parse().ok()).collect();
    match parts.as_slice() {
        [] => true,
        [major, ..] if *major != 24 => true,
        [24, minor, ..] if *minor >= 11 => true,
        [24, 3] | [24, 8] => true,
        [24, 3, patch, ..] => *patch >= 14,
        [24, 8, patch, ..] => *patch >= 7,
        _ => false,
    }
}

/// `major.minor` of the tag (`24.8`, `25.3.2.1-alpine` → (25, 3)); `None` for `latest`, `head`
/// and other names (the newest image).
pub fn version(image: &str) -> Option<(u32, u32)> {
    let t = tag(image);
    let core = t.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

/// The `VOLUME`s an image declares.
pub fn declared_volumes(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::ClickHouseServer => &["/var/lib/clickhouse"],
        Kind::Keeper => &["/var/lib/clickhouse-keeper", "/var/lib/clickhouse"],
        _ => &[],
    }
}

/// What becomes of an image `VOLUME` that no pod volume covers, as container runtimes do it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageVolumes {
    /// containerd (and Docker): a writable folder of its own, seeded from the image.
    Containerd,
    /// CRI-O's default `image_volumes = "mkdir"`: a folder inside the container's root
    /// filesystem (read-only with `readOnlyRootFilesystem`).
    Crio,
    /// no mount at all: the image's folder as it is (read-only with a read-only root).
    Ignore,
}

/// The node's choice, `LOCAL_KUBELET_IMAGE_VOLUMES`.
pub const IMAGE_VOLUMES_ENV: &str = "LOCAL_KUBELET_IMAGE_VOLUMES";
/// A pod's own choice, overriding the node's.
pub const IMAGE_VOLUMES_ANNOTATION: &str = "local-kubelet.clickhouse.com/image-volumes";

impl ImageVolumes {
    pub fn parse(s: &str) -> Option<ImageVolumes> {
        match s.trim() {
            "containerd" | "docker" => Some(ImageVolumes::Containerd),
            "crio" | "cri-o" | "mkdir" => Some(ImageVolumes::Crio),
            "ignore" => Some(ImageVolumes::Ignore),
            _ => None,
        }
    }

    /// The pod's annotation, else the node's environment, else `containerd`.
    pub fn of(annotation: Option<&str>, node: Option<&str>) -> Result<ImageVolumes, String> {
        let (src, v) = match (annotation, node) {
            (Some(a), _) => (IMAGE_VOLUMES_ANNOTATION, a),
            (None, Some(n)) if !n.trim().is_empty() => (IMAGE_VOLUMES_ENV, n),
            _ => return Ok(ImageVolumes::Containerd),
        };
        ImageVolumes::parse(v)
            .ok_or_else(|| format!("{src} {v:?}: one of containerd, crio, ignore"))
    }
}

/// Whether an image has the program a command starts with: a `-distroless` image has no shell
/// and no `/entrypoint.sh`. `Err` is the container runtime's message.
pub fn runnable(image: &str, argv0: &str) -> Result<(), String> {
    if !is_distroless(image) {
        return Ok(());
    }
    const MISSING: [&str; 8] = [
        "/bin/bash",
        "/bin/sh",
        "/usr/bin/bash",
        "/usr/bin/sh",
        "/entrypoint.sh",
        "bash",
        "sh",
        "entrypoint.sh",
    ];
    if !MISSING.contains(&argv0) {
        return Ok(());
    }
    if argv0.starts_with('/') {
        Err(format!(
            "exec: \"{argv0}\": stat {argv0}: no such file or directory"
        ))
    } else {
        Err(format!(
            "exec: \"{argv0}\": executable file not found in $PATH"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn variants_versions_and_image_volumes() {
        assert!(is_distroless(
            "clickhouse/clickhouse-keeper:26.1-distroless"
        ));
        assert!(!is_distroless("clickhouse/clickhouse-keeper:24.8-alpine"));
        assert_eq!(version("clickhouse/clickhouse-server:24.8"), Some((24, 8)));
        assert_eq!(
            version("reg:5000/clickhouse-server:25.3.2.1-alpine"),
            Some((25, 3))
        );
        assert_eq!(version("clickhouse/clickhouse-server:latest"), None);
        assert_eq!(
            ImageVolumes::of(Some("crio"), Some("containerd")),
            Ok(ImageVolumes::Crio)
        );
        assert_eq!(
            ImageVolumes::of(None, Some("ignore")),
            Ok(ImageVolumes::Ignore)
        );
        assert_eq!(ImageVolumes::of(None, None), Ok(ImageVolumes::Containerd));
        assert!(ImageVolumes::of(Some("x"), None).is_err());
        let e = runnable("clickhouse/clickhouse-keeper:26.1-distroless", "/bin/bash").unwrap_err();
        assert_eq!(
            e,
            "exec: \"/bin/bash\": stat /bin/bash: no such file or directory"
        );
        assert!(runnable("clickhouse/clickhouse-keeper:26.1-distroless", "sh").is_err());
        assert!(runnable("clickhouse/clickhouse-keeper:26.1", "/bin/bash").is_ok());
    }

    /// Issue 52 items 1 and 2: the images' own user (root but for `-distroless`) and which tags'
    /// `clickhouse su` takes OpenShift's group 0.
    #[test]
    fn image_users_and_su_fix() {
        let server = "clickhouse/clickhouse-server:24.8";
        assert_eq!(image_user(Kind::ClickHouseServer, server), "");
        assert_eq!(
            image_user(Kind::Keeper, "clickhouse/clickhouse-keeper:24.8-alpine"),
            ""
        );
        assert_eq!(
            image_user(
                Kind::ClickHouseServer,
                "clickhouse/clickhouse-server:26.1-distroless"
            ),
            "101:101"
        );
        for (tag, fixed) in [
            ("24.8", true),
            ("24.3", true),
            ("24.8.6.70", false),
            ("24.8.7.41", true),
            ("24.3.13.40-alpine", false),
            ("24.3.14.35", true),
            ("24.2", false),
            ("24.7.3.42", false),
            ("24.10", false),
            ("24.11", true),
            ("25.3", true),
            ("23.8", true),
            ("18.16.1", true),
            ("latest", true),
        ] {
            assert_eq!(
                su_takes_numeric_group(&format!("clickhouse/clickhouse-server:{tag}")),
                fixed,
                "{tag}"
            );
        }
    }

    #[test]
    fn names() {
        assert_eq!(
            kind("clickhouse/clickhouse-server:24.8"),
            Kind::ClickHouseServer
        );
        assert_eq!(
            kind("docker.io/altinity/clickhouse-server:23.8.16.42.altinitystable"),
            Kind::ClickHouseServer
        );
        assert_eq!(
            kind("clickhouse/clickhouse-keeper:24.8-alpine"),
            Kind::Keeper
        );
        assert_eq!(
            kind("localhost:5000/clickhouse-operator:dev"),
            Kind::Operator
        );
        assert_eq!(kind("busybox:1.36"), Kind::Shell);
        assert_eq!(kind("nginx"), Kind::Unknown);
        assert_eq!(
            kind("reg:5000/x/clickhouse-server@sha256:abc"),
            Kind::ClickHouseServer
        );
    }
}
