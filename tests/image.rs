//! What users install, as `hack/image.sh` writes it into `target/image/` (run it first; the
//! README's test command does): the operator's OCI image, its SBOM and provenance, and the
//! packaged charts. The image is an index of linux/amd64 and linux/arm64, read as a runtime reads
//! it (layout index, image index, manifests, configs, layers, every digest checked); each
//! platform's config names the architecture its binary is built for (the ELF machine); both
//! binaries run alone in the image's root filesystem as the image's user (the arm64 one under
//! qemu-user-static, which `hack/setup.sh` installs); writing the image again from the same
//! inputs gives the same digests. The e2e test
//! `real_images::the_operator_runs_from_its_packaged_chart_and_image_and_serves_a_cluster` runs
//! the operator's pod from this same image on the local Kubernetes (the node agent picks the
//! linux/amd64 manifest of the index).

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn out() -> PathBuf {
    let dir = repo().join("target/image");
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

fn sha256_of(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

fn blob(digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let data = std::fs::read(out().join("oci/blobs/sha256").join(hex)).unwrap();
    assert_eq!(
        sha256_of(&data),
        digest,
        "a blob's content matches its name"
    );
    data
}

fn json_blob(descriptor: &Value) -> Value {
    let digest = descriptor["digest"].as_str().unwrap();
    let data = blob(digest);
    assert_eq!(descriptor["size"], data.len(), "{digest}: its size");
    serde_json::from_slice(&data).unwrap()
}

/// One platform's image of the index.
struct Platform {
    arch: String,
    manifest_digest: String,
    config: Value,
    layer: PathBuf,
}

/// The image as the layout holds it: the index's digest and reference, and each platform.
struct Image {
    digest: String,
    reference: String,
    index: Value,
    platforms: Vec<Platform>,
}

fn image() -> Image {
    let layout: Value =
        serde_json::from_slice(&std::fs::read(out().join("oci/index.json")).unwrap()).unwrap();
    let entries = layout["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "one image: {layout}");
    let e = &entries[0];
    assert_eq!(
        e["mediaType"], "application/vnd.oci.image.index.v1+json",
        "the layout names an image index"
    );
    let index = json_blob(e);
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let platforms = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
            let manifest = json_blob(m);
            let config = json_blob(&manifest["config"]);
            let layers = manifest["layers"].as_array().unwrap();
            assert_eq!(layers.len(), 1, "one layer, no base image");
            let layer_digest = layers[0]["digest"].as_str().unwrap();
            assert_eq!(layers[0]["size"], blob(layer_digest).len());
            assert_eq!(m["platform"]["os"], "linux");
            Platform {
                arch: m["platform"]["architecture"].as_str().unwrap().to_string(),
                manifest_digest: m["digest"].as_str().unwrap().to_string(),
                config,
                layer: out()
                    .join("oci/blobs/sha256")
                    .join(layer_digest.trim_start_matches("sha256:")),
            }
        })
        .collect();
    Image {
        digest: e["digest"].as_str().unwrap().to_string(),
        reference: e["annotations"]["io.containerd.image.name"]
            .as_str()
            .unwrap()
            .to_string(),
        index,
        platforms,
    }
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

/// The ELF header's machine (`e_machine`) and whether the executable asks for a program
/// interpreter (is dynamically linked).
fn elf(elf: &[u8]) -> (u16, bool) {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    assert_eq!(elf[4], 2, "64-bit");
    assert_eq!(elf[5], 1, "little-endian");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    let interp = (0..count).any(|i| {
        let o = phoff + i * size;
        u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) == 3 // PT_INTERP
    });
    (u16_at(0x12) as u16, interp)
}

/// The ELF machine of each OCI architecture.
fn machine_of(arch: &str) -> u16 {
    match arch {
        "amd64" => 62,  // EM_X86_64
        "arm64" => 183, // EM_AARCH64
        other => panic!("architecture {other}"),
    }
}

/// How to run a binary of `arch` on this machine: directly, or under qemu-user-static.
fn runner(arch: &str) -> Option<&'static str> {
    match (arch, std::env::consts::ARCH) {
        ("amd64", "x86_64") | ("arm64", "aarch64") => None,
        ("arm64", _) => Some("/usr/bin/qemu-aarch64-static"),
        ("amd64", _) => Some("/usr/bin/qemu-x86_64-static"),
        (other, _) => panic!("architecture {other}"),
    }
}

/// docs/operations.md, "The image": one image for linux/amd64 and one for linux/arm64 in an
/// image index (what a runtime picks from by the node's platform); each platform's config
/// names the architecture of the binary it holds (the ELF header's machine), both binaries are
/// static; image.env names the index's digest and each manifest's.
#[test]
fn the_image_is_an_index_of_linux_amd64_and_linux_arm64_whose_binaries_match_their_platform() {
    let img = image();
    let arches: Vec<&str> = img.platforms.iter().map(|p| p.arch.as_str()).collect();
    assert_eq!(arches, ["amd64", "arm64"], "{}", img.index);
    let env = image_env();
    assert_eq!(env["DIGEST"], img.digest, "image.env: the index's digest");
    for p in &img.platforms {
        assert_eq!(p.config["os"], "linux");
        assert_eq!(
            p.config["architecture"], p.arch,
            "the config's architecture is its index entry's"
        );
        assert_eq!(
            env[&format!("DIGEST_{}", p.arch.to_uppercase())],
            p.manifest_digest
        );
        let root = unpack(&p.layer, &format!("elf-{}", p.arch));
        let bin = std::fs::read(root.join("clickhouse-operator")).unwrap();
        let (machine, interp) = elf(&bin);
        assert_eq!(
            machine,
            machine_of(&p.arch),
            "{}: the binary's ELF machine is the config's architecture",
            p.arch
        );
        assert!(!interp, "{}: static, no program interpreter", p.arch);
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// docs/operations.md, "The image": each platform's image runs the operator binary as the
/// distroless `nonroot` user (65532), starts `run` by default, and holds nothing but the static
/// binary, the CA bundle and the user and name-service files: no shell, no package manager, no
/// dynamic loader.
#[test]
fn the_image_holds_only_the_static_operator_and_runs_it_as_nonroot() {
    let img = image();
    assert_eq!(
        img.reference,
        format!(
            "{}:{}",
            image_env()["IMAGE"].rsplit_once(':').unwrap().0,
            env!("CARGO_PKG_VERSION")
        )
    );
    for p in &img.platforms {
        let c = &p.config;
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
        // the layer's uncompressed digest is the config's diff_id
        let raw = Command::new("gzip")
            .arg("-dc")
            .arg(&p.layer)
            .output()
            .unwrap();
        assert!(raw.status.success());
        assert_eq!(c["rootfs"]["diff_ids"][0], sha256_of(&raw.stdout));
        let listing = Command::new("tar")
            .args(["-tzf"])
            .arg(&p.layer)
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
        let root = unpack(&p.layer, &format!("contents-{}", p.arch));
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
        let ca = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        assert!(ca.matches("BEGIN CERTIFICATE").count() > 50, "a CA bundle");
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// The binaries need nothing outside the image: each platform's, run alone in its image's root
/// filesystem as the image's user, answers `--version` and prints the CRDs. The arm64 binary
/// runs under qemu-user-static (user-mode emulation of aarch64, copied into the root as a
/// static binary itself), so what is shown is that it is a working static aarch64 Linux
/// program, not how fast it is on an arm64 node.
#[test]
fn each_platforms_binary_runs_alone_in_the_images_root_filesystem_as_its_user() {
    for p in &image().platforms {
        let root = unpack(&p.layer, &format!("run-{}", p.arch));
        let mut prefix: Vec<String> = Vec::new();
        if let Some(qemu) = runner(&p.arch) {
            assert!(
                Path::new(qemu).is_file(),
                "{qemu} is missing: hack/setup.sh installs qemu-user-static"
            );
            std::fs::copy(qemu, root.join("qemu")).unwrap();
            prefix.push("/qemu".into());
        }
        for (args, want) in [
            (vec!["--version"], env!("CARGO_PKG_VERSION").to_string()),
            (vec!["crd"], "kind: CustomResourceDefinition".to_string()),
        ] {
            // (absolute: the environment is emptied, as in the container)
            let out = Command::new("/usr/sbin/chroot")
                .arg("--userspec=65532:65532")
                .arg(&root)
                .args(&prefix)
                .arg("/clickhouse-operator")
                .args(&args)
                .env_clear()
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains(&want),
                "{}: {prefix:?} /clickhouse-operator {args:?} in the image's root as 65532: {}\n{stdout}{}",
                p.arch,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// The image is reproducible: written again from the same inputs (the binaries and the CA
/// bundle it holds, the reference, the labels), its digests are the same, the index's and
/// each platform's.
#[test]
fn writing_the_image_again_from_the_same_inputs_gives_the_same_digest() {
    let img = image();
    let labels = img.platforms[0].config["config"]["Labels"]
        .as_object()
        .unwrap()
        .clone();
    let label = |k: &str| labels[k].as_str().unwrap().to_string();
    let created = chrono::DateTime::parse_from_rfc3339(&label("org.opencontainers.image.created"))
        .unwrap()
        .timestamp();
    let roots: Vec<(String, PathBuf)> = img
        .platforms
        .iter()
        .map(|p| {
            (
                p.arch.clone(),
                unpack(&p.layer, &format!("again-{}", p.arch)),
            )
        })
        .collect();
    let again = roots[0].1.with_extension("out");
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("hack/oci-image.py"));
    for (arch, root) in &roots {
        cmd.arg("--binary").arg(format!(
            "{arch}={}",
            root.join("clickhouse-operator").display()
        ));
    }
    let wrote = cmd
        .arg("--ca-bundle")
        .arg(roots[0].1.join("etc/ssl/certs/ca-certificates.crt"))
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
    let printed = String::from_utf8_lossy(&wrote.stdout).to_string();
    let mut lines = printed.lines();
    assert_eq!(lines.next(), Some(img.digest.as_str()));
    for p in &img.platforms {
        assert_eq!(
            lines.next(),
            Some(format!("{} {}", p.arch, p.manifest_digest).as_str())
        );
    }
    assert_eq!(
        std::fs::read(again.join("index.json")).unwrap(),
        std::fs::read(out().join("oci/index.json")).unwrap()
    );
    for (_, root) in &roots {
        let _ = std::fs::remove_dir_all(root);
    }
    let _ = std::fs::remove_dir_all(&again);
    let _ = std::fs::remove_file(again.with_extension("tar"));
}

/// The packages of Cargo.lock: (name, version) → (source, checksum).
fn locked_packages() -> BTreeMap<(String, String), (Option<String>, Option<String>)> {
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).unwrap();
    let mut out = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |k: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(&format!("{k} = \""))
                    .and_then(|v| v.strip_suffix('"'))
                    .map(String::from)
            })
        };
        let key = (field("name").unwrap(), field("version").unwrap());
        assert!(
            out.insert(key.clone(), (field("source"), field("checksum")))
                .is_none(),
            "{key:?} twice in Cargo.lock"
        );
    }
    out
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `bash hack/image.sh`)", path.display())),
    )
    .unwrap()
}

/// docs/operations.md, "The image": the SBOM (SPDX 2.3) lists exactly the packages of
/// Cargo.lock, each with its version, where it comes from (crates.io download, or this
/// workspace), the checksum Cargo.lock pins, a `pkg:cargo` purl and the licence its Cargo
/// metadata declares; beside them only the image, which it describes. The image CONTAINS the
/// crates linked into the binary (kube, not the test-only proptest), and the proc-macros it
/// is built with are build dependencies.
#[test]
fn the_sbom_lists_every_package_of_cargo_lock_with_its_version_source_and_licence() {
    let v = env!("CARGO_PKG_VERSION");
    let sbom = read_json(&out().join(format!("clickhouse-operator-{v}.spdx.json")));
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    assert_eq!(sbom["dataLicense"], "CC0-1.0");
    let packages = sbom["packages"].as_array().unwrap();
    let image_pkg: Vec<&Value> = packages
        .iter()
        .filter(|p| p["primaryPackagePurpose"] == "CONTAINER")
        .collect();
    assert_eq!(image_pkg.len(), 1, "the image, once");
    assert_eq!(
        image_pkg[0]["checksums"][0]["checksumValue"],
        image().digest.trim_start_matches("sha256:"),
        "the image package is the index's digest"
    );
    let metadata = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(metadata.status.success());
    let metadata: Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let licence: BTreeMap<(String, String), Option<String>> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["version"].as_str().unwrap().to_string(),
                ),
                p["license"].as_str().map(String::from),
            )
        })
        .collect();
    let locked = locked_packages();
    let mut listed = BTreeSet::new();
    let mut ids = BTreeMap::new();
    for p in packages
        .iter()
        .filter(|p| p["primaryPackagePurpose"] != "CONTAINER")
    {
        let key = (
            p["name"].as_str().unwrap().to_string(),
            p["versionInfo"].as_str().unwrap().to_string(),
        );
        assert!(listed.insert(key.clone()), "{key:?} listed twice");
        ids.insert(
            key.0.clone() + "@" + &key.1,
            p["SPDXID"].as_str().unwrap().to_string(),
        );
        let Some((source, checksum)) = locked.get(&key) else {
            panic!("{key:?} is in the SBOM but not in Cargo.lock");
        };
        assert_eq!(
            p["externalRefs"][0]["referenceLocator"],
            format!("pkg:cargo/{}@{}", key.0, key.1)
        );
        match source.as_deref() {
            Some("registry+https://github.com/rust-lang/crates.io-index") => assert_eq!(
                p["downloadLocation"],
                format!(
                    "https://crates.io/api/v1/crates/{}/{}/download",
                    key.0, key.1
                )
            ),
            None => assert!(
                p["sourceInfo"].as_str().unwrap().contains("this workspace"),
                "{p}"
            ),
            Some(other) => panic!("{key:?}: source {other} (sources are crates.io only)"),
        }
        assert_eq!(
            p["checksums"][0]["checksumValue"].as_str(),
            checksum.as_deref(),
            "{key:?}: Cargo.lock's checksum"
        );
        let declared = licence[&key]
            .as_deref()
            .map(|l| l.split('/').map(str::trim).collect::<Vec<_>>().join(" OR "))
            .unwrap_or_else(|| "NOASSERTION".into());
        assert_eq!(p["licenseDeclared"], declared, "{key:?}: Cargo's licence");
    }
    let missing: Vec<_> = locked.keys().filter(|k| !listed.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "in Cargo.lock, not in the SBOM: {missing:?}"
    );
    let related = |kind: &str| -> BTreeSet<String> {
        sbom["relationships"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["relationshipType"] == kind)
            .map(|r| {
                let id = if kind == "CONTAINS" {
                    &r["relatedSpdxElement"]
                } else {
                    &r["spdxElementId"]
                };
                id.as_str().unwrap().to_string()
            })
            .collect()
    };
    let id_of = |name: &str| {
        ids.iter()
            .find(|(k, _)| k.split('@').next() == Some(name))
            .map(|(_, id)| id.clone())
            .unwrap()
    };
    let contains = related("CONTAINS");
    let build = related("BUILD_DEPENDENCY_OF");
    assert!(
        contains.contains(&id_of("kube-client")),
        "kube-client is linked"
    );
    assert!(
        !contains.contains(&id_of("proptest")),
        "proptest (tests only) is not"
    );
    assert!(
        build.contains(&id_of("serde_derive")),
        "serde_derive builds it"
    );
    assert!(!contains.contains(&id_of("serde_derive")));
}

/// docs/operations.md, "The image": the provenance is an in-toto Statement whose subjects are
/// the image index, each platform's manifest and the archive, with their digests, and whose
/// SLSA predicate names the inputs: the commit (the images' revision label), Cargo.lock's
/// digest, the toolchain, the CA bundle; the binaries are its byproducts, with the digests of
/// the binaries the layers hold.
#[test]
fn the_provenance_names_the_subjects_and_the_inputs_of_the_build() {
    let v = env!("CARGO_PKG_VERSION");
    let img = image();
    let prov = read_json(&out().join(format!("clickhouse-operator-{v}.provenance.json")));
    assert_eq!(prov["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(prov["predicateType"], "https://slsa.dev/provenance/v1");
    let subjects: BTreeMap<String, String> = prov["subject"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                format!("sha256:{}", s["digest"]["sha256"].as_str().unwrap()),
            )
        })
        .collect();
    assert_eq!(subjects[&img.reference], img.digest);
    for p in &img.platforms {
        assert_eq!(
            subjects[&format!("{} linux/{}", img.reference, p.arch)],
            p.manifest_digest
        );
    }
    let archive = format!("clickhouse-operator-{v}.oci.tar");
    assert_eq!(
        subjects[&archive],
        sha256_of(&std::fs::read(out().join(&archive)).unwrap())
    );
    let deps = prov["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array()
        .unwrap();
    let dep = |name: &str| {
        deps.iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("{name} in resolvedDependencies: {deps:?}"))
    };
    let revision = img.platforms[0].config["config"]["Labels"]["org.opencontainers.image.revision"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        dep("source")["digest"]["gitCommit"],
        revision.trim_end_matches("-dirty")
    );
    assert_eq!(
        format!(
            "sha256:{}",
            dep("Cargo.lock")["digest"]["sha256"].as_str().unwrap()
        ),
        sha256_of(&std::fs::read(repo().join("Cargo.lock")).unwrap()),
        "the Cargo.lock the image was built from"
    );
    assert!(
        dep("rustc")["annotations"]["version"]
            .as_str()
            .unwrap()
            .contains(
                img.platforms[0].config["config"]["Labels"]["io.clickhouse-operator.rust"]
                    .as_str()
                    .unwrap()
            )
    );
    assert!(dep("ca-certificates.crt")["digest"]["sha256"].is_string());
    let byproducts = prov["predicate"]["runDetails"]["byproducts"]
        .as_array()
        .unwrap();
    for p in &img.platforms {
        let root = unpack(&p.layer, &format!("prov-{}", p.arch));
        let bin = std::fs::read(root.join("clickhouse-operator")).unwrap();
        let b = byproducts
            .iter()
            .find(|b| b["name"] == format!("clickhouse-operator linux/{}", p.arch))
            .unwrap();
        assert_eq!(
            format!("sha256:{}", b["digest"]["sha256"].as_str().unwrap()),
            sha256_of(&bin),
            "{}: the binary in the layer",
            p.arch
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// charts/clickhouse-operator/values.yaml, podSecurityContext: the chart's pods set
/// `runAsNonRoot` and no uid (so that OpenShift can assign one: `helm::openshift`), and leave
/// the user to the image; a kubelet enforcing `runAsNonRoot` accepts an image user only when
/// it is numeric and not 0 ("image has non-numeric user", "image will run as root"
/// otherwise), which each platform's `User` is. The e2e test
/// `real_images::the_operator_runs_from_its_packaged_chart_and_image_and_serves_a_cluster`
/// shows the process running as 65532.
#[test]
fn the_chart_leaves_the_uid_to_the_image_whose_user_is_numeric_and_not_root() {
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("charts/clickhouse-operator/values.yaml")).unwrap(),
    )
    .unwrap();
    for ctx in ["podSecurityContext", "securityContext"] {
        assert!(
            values[ctx].get("runAsUser").is_none() && values[ctx].get("runAsGroup").is_none(),
            "{ctx} fixes no ids: {:?}",
            values[ctx]
        );
        assert_eq!(values[ctx]["runAsNonRoot"].as_bool(), Some(true), "{ctx}");
    }
    for p in image().platforms {
        let user = p.config["config"]["User"].as_str().unwrap().to_string();
        let uid = user.split(':').next().unwrap();
        let uid: u32 = uid
            .parse()
            .unwrap_or_else(|_| panic!("{}: image user {user:?} is not numeric", p.arch));
        assert_ne!(uid, 0, "{}: the image's user is not root", p.arch);
    }
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
