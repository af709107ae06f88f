//! Installing and upgrading as the READMEs say: the CRDs applied server-side over older ones, and
//! the "Install with Helm" block run as written.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::Api;

use crate::support::{
    client, docs, helm, helm_cmd, kubeconfig, kubectl, pod_network, repo, skipped,
};

/// CRD upgrades: Helm created the CRDs, so applying the new ones server-side conflicts on every
/// changed field unless the fields are taken over (`--force-conflicts`), as charts/README.md
/// says. Run on copies of the CRDs in a group of their own, so that nobody's CRDs change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_upgrade_with_server_side_apply_over_older_crds() {
    let Ok(_) = helm() else {
        skipped(&format!(
            "helm cannot be built here: {}",
            helm().unwrap_err()
        ));
        return;
    };
    let _ = client().await;
    let group = format!("upgrade-{}.chop.test", std::process::id() % 100_000);
    let new = String::from_utf8(
        Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
            .arg("crd")
            .output()
            .expect("clickhouse-operator crd")
            .stdout,
    )
    .unwrap()
    .replace("clickhouse.com", &group);
    // the older CRDs: no spec.pause, another description
    let mut old_docs = docs(&new);
    for d in &mut old_docs {
        let props = d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .as_mapping_mut()
            .unwrap();
        props.remove("pause");
        d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] =
            serde_yaml::Value::String("an older version".into());
    }
    let old: String = old_docs
        .iter()
        .map(|d| format!("---\n{}", serde_yaml::to_string(d).unwrap()))
        .collect();
    let dir = repo()
        .join("target")
        .join(format!("helm-crd-upgrade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("old.yaml"), &old).unwrap();
    std::fs::write(dir.join("new.yaml"), &new).unwrap();
    let k = kubectl();
    let kubectl_run = |args: &[&str]| {
        Command::new(&k)
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args(args)
            .output()
            .unwrap()
    };
    let names = [
        format!("clickhouseclusters.{group}"),
        format!("clickhousebackups.{group}"),
    ];
    struct Gone<'a>(&'a dyn Fn(&[&str]) -> std::process::Output, &'a [String; 2]);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            (self.0)(&[
                "delete",
                "crd",
                &self.1[0],
                &self.1[1],
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }
    let _gone = Gone(&kubectl_run, &names);
    // as `helm install` does: a plain create
    let out = kubectl_run(&["create", "-f", &dir.join("old.yaml").to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // without --force-conflicts the API server refuses the changed fields
    let out = kubectl_run(&[
        "apply",
        "--server-side",
        "-f",
        &dir.join("new.yaml").to_string_lossy(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success() && stderr.contains("conflict"),
        "apply --server-side over CRDs created by another manager: {} {stderr}",
        out.status
    );
    // with it, as charts/README.md says, the new CRDs are in place
    let out = kubectl_run(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &dir.join("new.yaml").to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl_run(&[
        "get",
        "crd",
        &names[0],
        "-o",
        "jsonpath={.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.pause.type}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "boolean",
        "the new schema is applied"
    );
    let readme = std::fs::read_to_string(repo().join("charts/README.md")).unwrap();
    assert!(
        readme.contains(
            "clickhouse-operator crd | kubectl apply --server-side --force-conflicts -f -"
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// "Install with Helm" runs as written: the marked shell block of README.md (once the section is
/// there) or else of charts/README.md, with only its first two lines (namespaces, pod network and
/// image) replaced to suit the local cluster. The charts it installs are the ones `hack/image.sh`
/// packaged, and the image is the one it built: every operator pod seen while the block runs
/// reports that image's digest as its `imageID` (the node agent runs it from the image's root
/// filesystem, `local-kubelet/src/oci.rs`), so what users install is what ran here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_with_helm_readme_runs_as_written() {
    let helm_bin = match helm() {
        Ok(h) => h,
        Err(why) => {
            skipped(&format!("helm cannot be built here: {why}"));
            return;
        }
    };
    let _ = client().await;
    const MARK: &str = "<!-- tests/helm.rs runs the next block";
    let (file, readme) = ["README.md", "charts/README.md"]
        .iter()
        .map(|f| {
            (
                *f,
                std::fs::read_to_string(repo().join(f)).unwrap_or_default(),
            )
        })
        .find(|(_, text)| text.contains(MARK))
        .expect("a README with the marked \"Install with Helm\" block");
    eprintln!("running the block of {file}");
    let start = readme.find(MARK).unwrap();
    let block = &readme[start..];
    let block = &block[block.find("```sh\n").unwrap() + 6..];
    let block = &block[..block.find("\n```").unwrap()];
    let mut lines: Vec<&str> = block.lines().collect();
    assert!(
        lines[0].starts_with("export OPERATOR_NS=") && lines[1].starts_with("export IMAGE_REPO=")
    );
    let id = std::process::id() % 100_000;
    let (op_ns, ch_ns) = (
        format!("helm-readme-op-{id}"),
        format!("helm-readme-ch-{id}"),
    );
    let first = format!(
        "export OPERATOR_NS={op_ns} CLUSTER_NS={ch_ns} POD_NETWORK={}",
        pod_network()
    );
    lines[0] = &first;
    // the image `hack/image.sh` built, as its image.env names it
    let built = std::fs::read_to_string(repo().join("target/image/image.env"))
        .expect("target/image/image.env: run `bash hack/image.sh` first");
    let built_var = |k: &str| {
        built
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in target/image/image.env"))
            .to_string()
    };
    let (image, digest) = (built_var("IMAGE"), built_var("DIGEST"));
    let (image_repo, image_tag) = image.rsplit_once(':').unwrap();
    assert_eq!(image_tag, env!("CARGO_PKG_VERSION"));
    let second = format!("export IMAGE_REPO={image_repo} IMAGE_TAG={image_tag}");
    lines[1] = &second;
    assert!(
        block.contains(&format!(
            "target/image/clickhouse-operator-{}.tgz",
            env!("CARGO_PKG_VERSION")
        )),
        "the block installs the packaged chart of this version"
    );
    let script = lines.join("\n");
    struct Cleanup(String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let k = kubectl();
            let kc = kubeconfig();
            if let Ok(h) = helm() {
                for (rel, ns) in [("events", &self.1), ("clickhouse-operator", &self.0)] {
                    let _ = helm_cmd(h)
                        .arg("--kubeconfig")
                        .arg(kc)
                        .args(["uninstall", rel, "-n", ns, "--ignore-not-found"])
                        .output();
                }
            }
            let _ = Command::new(&k)
                .arg("--kubeconfig")
                .arg(kc)
                .args([
                    "-n",
                    &self.1,
                    "patch",
                    "chc",
                    "events",
                    "other",
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ])
                .output();
            let _ = Command::new(&k)
                .arg("--kubeconfig")
                .arg(kc)
                .args([
                    "delete",
                    "namespace",
                    &self.0,
                    &self.1,
                    "--wait=false",
                    "--ignore-not-found",
                ])
                .output();
        }
    }
    let _cleanup = Cleanup(op_ns.clone(), ch_ns.clone());
    let path = format!(
        "{}:{}:{}",
        helm_bin.parent().unwrap().display(),
        kubectl().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = helm_cmd(helm_bin);
    // helm_cmd's environment (helm's folders under target/), but bash runs the block
    let envs: Vec<(String, String)> = cmd
        .get_envs()
        .filter_map(|(k, v)| {
            Some((
                k.to_string_lossy().into_owned(),
                v?.to_string_lossy().into_owned(),
            ))
        })
        .collect();
    cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &script])
        .current_dir(repo())
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig())
        .envs(envs);
    // the image ids of the operator's pods (operator and PVC cleaner) while the block runs
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::<(String, String)>::new()));
    let watcher = {
        let (seen, op_ns) = (seen.clone(), op_ns.clone());
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client().await, &op_ns);
        tokio::spawn(async move {
            loop {
                for p in pods
                    .list(&Default::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    for c in p
                        .status
                        .and_then(|s| s.container_statuses)
                        .unwrap_or_default()
                    {
                        if c.state.as_ref().is_some_and(|s| s.running.is_some()) {
                            seen.lock().unwrap().insert((c.image, c.image_id));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("bash"))
        .await
        .unwrap();
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no operator container seen running");
    for (img, id) in &seen {
        assert!(
            img == &image && id.ends_with(&format!("@{digest}")),
            "an operator container ran {img} ({id}), not the built image {image}@{digest}"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}\n(ran in {:?})", started.elapsed());
    assert!(out.status.success(), "the README's block failed");
    assert!(
        stderr.contains("exceeded quota"),
        "the second cluster was not refused by the quota"
    );
    assert!(stdout.contains("refused, as it should be"));
    assert!(
        stdout.contains("ready"),
        "kubectl get chc shows the cluster ready"
    );
}
