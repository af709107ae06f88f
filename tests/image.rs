//! What users install, as `hack/image.sh` writes it into `target/image/` (run it first; the
//! README's test command does): the operator's OCI image and the packaged charts. The image is
//! read as a runtime reads it (index, manifest, config, layer, every digest checked), its binary
//! runs alone in the image's root filesystem as the image's user, and writing the image again
//! from the same inputs gives the same digest. The e2e test
//! `real_images::the_operator_runs_from_its_packaged_chart_and_image_and_serves_a_cluster` runs
//! the operator's pod from this same image on the local Kubernetes.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn out() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/image");
    assert!(
        dir.join("oci/index.json").is_file(),
        "{} has no image: run `bash hack/image.sh` first",
        dir.display()
    );
    dir
}

fn image_env() -> BTreeMap<String, String> {
    std::fs::read_to_string(out().join("image.env"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.into(), v.into())))
        .collect()
}

fn blob(digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let data = std::fs::read(out().join("oci/blobs/sha256").join(hex)).unwrap();
    assert_eq!(
        format!("sha256:{:x}", Sha256::digest(&data)),
        digest,
        "a blob's content matches its name"
    );
    data
}

struct Image {
    digest: String,
    reference: String,
    config: Value,
    layer: PathBuf,
}

fn image() -> Image {
    let index: Value =
        serde_json::from_slice(&std::fs::read(out().join("oci/index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "one image: {index}");
    let m = &manifests[0];
    let digest = m["digest"].as_str().unwrap().to_string();
    let manifest: Value = serde_json::from_slice(&blob(&digest)).unwrap();
    assert_eq!(m["size"], manifest_size(&digest));
    let config: Value =
        serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "one layer, no base image");
    let layer_digest = layers[0]["digest"].as_str().unwrap();
    let data = blob(layer_digest);
    assert_eq!(layers[0]["size"], data.len());
    let layer = out()
        .join("oci/blobs/sha256")
        .join(layer_digest.trim_start_matches("sha256:"));
    Image {
        digest,
        reference: m["annotations"]["io.containerd.image.name"]
            .as_str()
            .unwrap()
            .to_string(),
        config,
        layer,
    }
}

fn manifest_size(digest: &str) -> usize {
    blob(digest).len()
}

/// The layer unpacked into a fresh folder.
fn unpack(layer: &Path, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("image-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("tar")
        .args(["--same-owner", "--numeric-owner", "-xzpf"])
        .arg(layer)
        .arg("-C")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    dir
}

/// Whether an ELF executable asks for a program interpreter (is dynamically linked).
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    assert_eq!(elf[4], 2, "64-bit");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let o = phoff + i * size;
        u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

/// docs/operations.md, "The image": the image runs the operator binary as the distroless
/// `nonroot` user (65532), starts `run` by default, and holds nothing but the static binary, the CA bundle and the user and name-service files: no
/// shell, no package manager, no dynamic loader.
#[test]
fn the_image_holds_only_the_static_operator_and_runs_it_as_nonroot() {
    let img = image();
    let c = &img.config;
    assert_eq!(c["os"], "linux");
    assert_eq!(c["architecture"], "amd64");
    assert_eq!(c["config"]["User"], "65532:65532");
    assert_eq!(
        c["config"]["Entrypoint"],
        serde_json::json!(["/clickhouse-operator"])
    );
    assert_eq!(c["config"]["Cmd"], serde_json::json!(["run"]));
    let labels = &c["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        labels["io.clickhouse-operator.rust"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    assert_eq!(
        img.reference,
        format!(
            "{}:{}",
            image_env()["IMAGE"].rsplit_once(':').unwrap().0,
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(image_env()["DIGEST"], img.digest);
    // the layer's uncompressed digest is the config's diff_id
    let raw = Command::new("gzip")
        .arg("-dc")
        .arg(&img.layer)
        .output()
        .unwrap();
    assert!(raw.status.success());
    assert_eq!(
        c["rootfs"]["diff_ids"][0],
        format!("sha256:{:x}", Sha256::digest(&raw.stdout))
    );
    let listing = Command::new("tar")
        .args(["-tzf"])
        .arg(&img.layer)
        .output()
        .unwrap();
    let mut entries: Vec<String> = String::from_utf8(listing.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        [
            "clickhouse-operator",
            "etc",
            "etc/group",
            "etc/nsswitch.conf",
            "etc/passwd",
            "etc/ssl",
            "etc/ssl/certs",
            "etc/ssl/certs/ca-certificates.crt",
            "home",
            "home/nonroot",
            "tmp",
        ]
    );
    let root = unpack(&img.layer, "contents");
    let bin = std::fs::read(root.join("clickhouse-operator")).unwrap();
    assert!(
        !has_interpreter(&bin),
        "the operator binary is static: no program interpreter"
    );
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let ca = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    assert!(ca.matches("BEGIN CERTIFICATE").count() > 50, "a CA bundle");
    let _ = std::fs::remove_dir_all(&root);
}

/// The binary needs nothing outside the image: run alone in the image's root filesystem, as the
/// image's user, it answers `--version` and prints the CRDs.
#[test]
fn the_operator_binary_runs_alone_in_the_images_root_filesystem_as_its_user() {
    let img = image();
    let root = unpack(&img.layer, "run");
    for (args, want) in [
        (vec!["--version"], env!("CARGO_PKG_VERSION").to_string()),
        (vec!["crd"], "kind: CustomResourceDefinition".to_string()),
    ] {
        // (absolute: the environment is emptied, as in the container)
        let out = Command::new("/usr/sbin/chroot")
            .arg("--userspec=65532:65532")
            .arg(&root)
            .arg("/clickhouse-operator")
            .args(&args)
            .env_clear()
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&want),
            "/clickhouse-operator {args:?} in the image's root as 65532: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The image is reproducible: written again from the same inputs (the binary and the CA bundle
/// it holds, the reference, the labels), its digest is the same.
#[test]
fn writing_the_image_again_from_the_same_inputs_gives_the_same_digest() {
    let img = image();
    let root = unpack(&img.layer, "again");
    let labels = img.config["config"]["Labels"].as_object().unwrap().clone();
    let label = |k: &str| labels[k].as_str().unwrap().to_string();
    let created = chrono::DateTime::parse_from_rfc3339(&label("org.opencontainers.image.created"))
        .unwrap()
        .timestamp();
    let again = root.with_extension("out");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let wrote = Command::new("python3")
        .arg(repo.join("hack/oci-image.py"))
        .arg("--binary")
        .arg(root.join("clickhouse-operator"))
        .arg("--ca-bundle")
        .arg(root.join("etc/ssl/certs/ca-certificates.crt"))
        .args(["--ref", &img.reference])
        .args(["--version", &label("org.opencontainers.image.version")])
        .args(["--revision", &label("org.opencontainers.image.revision")])
        .args(["--created", &created.to_string()])
        .args([
            "--label",
            &format!(
                "io.clickhouse-operator.rust={}",
                label("io.clickhouse-operator.rust")
            ),
            "--label",
            &format!(
                "io.clickhouse-operator.ca-certificates={}",
                label("io.clickhouse-operator.ca-certificates")
            ),
        ])
        .arg("--out")
        .arg(&again)
        .arg("--archive")
        .arg(again.with_extension("tar"))
        .output()
        .unwrap();
    assert!(
        wrote.status.success(),
        "{}",
        String::from_utf8_lossy(&wrote.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&wrote.stdout).trim(), img.digest);
    assert_eq!(
        std::fs::read(again.join("index.json")).unwrap(),
        std::fs::read(out().join("oci/index.json")).unwrap()
    );
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&again);
    let _ = std::fs::remove_file(again.with_extension("tar"));
}

/// One version in one place: the charts' `version` and `appVersion` are Cargo.toml's, and the
/// packaged operator chart names exactly the image that was built (repository and tag).
#[test]
fn the_packaged_charts_carry_the_version_and_name_the_image_built() {
    let v = env!("CARGO_PKG_VERSION");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for chart in ["clickhouse-operator", "onprem-clickhouse-cluster"] {
        let y =
            std::fs::read_to_string(repo.join("charts").join(chart).join("Chart.yaml")).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&y).unwrap();
        assert_eq!(
            doc["version"].as_str(),
            Some(v),
            "{chart} Chart.yaml version"
        );
        assert_eq!(
            doc["appVersion"].as_str(),
            Some(v),
            "{chart} Chart.yaml appVersion"
        );
        let tgz = out().join(format!("{chart}-{v}.tgz"));
        let read = |file: &str| {
            let o = Command::new("tar")
                .arg("-xzOf")
                .arg(&tgz)
                .arg(format!("{chart}/{file}"))
                .output()
                .unwrap();
            assert!(o.status.success(), "{} {file}", tgz.display());
            String::from_utf8(o.stdout).unwrap()
        };
        let packaged: serde_yaml::Value = serde_yaml::from_str(&read("Chart.yaml")).unwrap();
        assert_eq!(packaged["version"].as_str(), Some(v));
        if chart == "clickhouse-operator" {
            let values: serde_yaml::Value = serde_yaml::from_str(&read("values.yaml")).unwrap();
            let repository = values["image"]["repository"].as_str().unwrap();
            let tag = values["image"]["tag"].as_str().unwrap();
            let tag = if tag.is_empty() { v } else { tag };
            assert_eq!(format!("{repository}:{tag}"), image().reference);
        }
    }
}
