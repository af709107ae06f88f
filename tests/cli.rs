//! The command line of the operator's binary.

use std::io::Read;
use std::process::{Command, Stdio};

/// docs/operations.md, "The commands": `clickhouse-operator crd | head` ends quietly when the
/// reader goes away: exit code 0, nothing on standard error (the CRDs are far larger than a pipe's
/// buffer, so the writer meets the closed pipe).
#[test]
fn crd_output_into_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .arg("crd")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 64];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    // the pipe's reader is gone now
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(String::from_utf8_lossy(&head).contains("clickhouse-operator crd"));
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
}

/// docs/operations.md, "The commands": without a cluster to read (`--offline`, or a kubeconfig that
/// does not exist), `plan` shows the first pass over an empty namespace, and exits 2 as the live
/// plan does when something would change (a new cluster always does).
#[test]
fn plan_without_a_cluster_shows_the_first_pass_offline() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/cluster.yaml");
    for offline in [true, false] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"));
        cmd.args(["plan", "-f", example])
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env("HOME", "/nonexistent")
            .env_remove("KUBERNETES_SERVICE_HOST");
        if offline {
            cmd.arg("--offline");
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("apply StatefulSet"), "{stdout}");
        assert!(stdout.contains("(does not exist yet)"), "{stdout}");
        assert!(stdout.ends_with("Changes would be applied.\n"), "{stdout}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .args(["plan", "-f", example, "--offline", "-o", "yaml"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "an unknown output format is refused"
    );
}

const CLUSTER_KIND: &str = "apiVersion: clickhouse.com/v1alpha1\nkind: ClickHouseCluster\n";

/// `plan --offline` with `input` on standard input: exit code, standard output, standard error.
fn plan_stdin(input: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["plan", "--offline", "-f", "-"];
    all.extend(args);
    run_cli_with_stdin(&all, input)
}

/// The operator's command line with `args` and `input` on standard input: exit code, standard
/// output, standard error.
fn run_cli_with_stdin(args: &[&str], input: &str) -> (Option<i32>, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every JSON object of a `plan -o json` output, one per cluster.
fn json_objects(stdout: &str) -> Vec<serde_json::Value> {
    serde_json::Deserializer::from_str(stdout)
        .into_iter::<serde_json::Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// `plan -f -` reads standard input (other kinds skipped, every cluster planned), and `-o json`
/// prints one object per cluster with the same fields as the live plan's, its exit code among
/// them.
#[test]
fn offline_plan_reads_standard_input_and_prints_json() {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/examples/cluster.yaml"
    ))
    .unwrap();
    let input = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: skipped}}\n---\n{example}\n---\n\
         {CLUSTER_KIND}metadata: {{name: second, namespace: other}}\nspec: {{replicas: 1}}\n"
    );
    let (code, stdout, stderr) = plan_stdin(&input, &["-o", "json"]);
    assert_eq!(code, Some(2), "{stderr}");
    let plans = json_objects(&stdout);
    assert_eq!(plans.len(), 2, "{stdout}");
    let names: Vec<_> = plans
        .iter()
        .map(|p| {
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap(),
                p["cluster"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(names, ["demo/demo", "other/second"]);
    for p in &plans {
        assert_eq!(p["live"], false);
        assert_eq!(p["exitCode"], 2);
        assert_eq!(p["changes"], serde_json::json!(["the cluster is created"]));
        assert_eq!(p["refused"], serde_json::json!([]));
        let steps: Vec<&str> = p["firstPass"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(
            steps.iter().any(|s| s.starts_with("apply StatefulSet")),
            "{steps:?}"
        );
        assert!(
            p["objects"]
                .as_array()
                .unwrap()
                .iter()
                .all(|o| o.as_str().unwrap().ends_with(": created"))
        );
    }
    // the text output of the same input: the same plans for people, the same exit code
    let (code, text, _) = plan_stdin(&input, &[]);
    assert_eq!(code, Some(2));
    assert!(
        text.contains("ClickHouseCluster demo/demo (does not exist yet)"),
        "{text}"
    );
    assert!(
        text.contains("ClickHouseCluster other/second (does not exist yet)"),
        "{text}"
    );
}

/// The exit codes of the offline plan are the live plan's: 1 when something is refused or
/// invalid (the refusal named, in JSON too), also for a file that holds no cluster or cannot be
/// read and for a wrong command line; 2 when something would change.
#[test]
fn offline_plan_exit_codes_are_the_live_plans() {
    // refused by the operator: a newer resource format
    let refused = format!("{CLUSTER_KIND}metadata: {{name: x}}\nspec: {{crVersion: \"99.0.0\"}}\n");
    let (code, stdout, stderr) = plan_stdin(&refused, &["-o", "json"]);
    assert_eq!(code, Some(1), "{stderr}");
    let plans = json_objects(&stdout);
    assert_eq!(plans[0]["exitCode"], 1);
    assert!(
        plans[0]["refused"][0]
            .as_str()
            .unwrap()
            .contains("spec.crVersion"),
        "{stdout}"
    );
    assert_eq!(plans[0]["firstPass"], serde_json::json!([]));
    let (code, text, _) = plan_stdin(&refused, &[]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains("Refused:") && text.contains("spec.crVersion"),
        "{text}"
    );

    // one cluster refused, one fine: the highest code
    let both = format!("{refused}---\n{CLUSTER_KIND}metadata: {{name: y}}\nspec: {{}}\n");
    let (code, stdout, _) = plan_stdin(&both, &["-o", "json"]);
    assert_eq!(code, Some(1));
    let codes: Vec<_> = json_objects(&stdout)
        .iter()
        .map(|p| p["exitCode"].clone())
        .collect();
    assert_eq!(codes, [1, 2]);

    // invalid: not a ClickHouseCluster spec, no cluster at all, not YAML
    let invalid = format!("{CLUSTER_KIND}metadata: {{name: x}}\nspec: {{shards: many}}\n");
    for (input, says) in [
        (
            invalid.as_str(),
            "standard input holds an invalid ClickHouseCluster",
        ),
        (
            "kind: ConfigMap\n",
            "standard input holds no ClickHouseCluster",
        ),
        ("{{{", ""),
    ] {
        let (code, stdout, stderr) = plan_stdin(input, &["-o", "json"]);
        assert_eq!(code, Some(1), "{input}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains(says), "{stderr}");
    }
    // a file that does not exist, a wrong command line
    for args in [
        &["plan", "--offline", "-f", "/nonexistent/cluster.yaml"][..],
        &["plan", "--offline"][..],
        &["plan", "--offline", "-f", "-", "--no-such-flag"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
    }
    // and the codes are documented where they are used
    let help = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .args(["plan", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    for line in [
        "0  nothing would change",
        "1  something is refused or invalid",
        "2  something would change",
        "`-` reads standard input",
    ] {
        assert!(help.contains(line), "{help}");
    }
}

/// `run --help` lists every environment variable the settings read, and the settings read only
/// the listed ones: the list is `settings::ENV`, and the settings' source names no variable
/// outside it. The table of variables in docs/operations.md lists them too.
#[test]
fn run_help_lists_every_environment_variable_the_operator_reads() {
    use clickhouse_operator::runtime::settings::ENV;
    let out = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let listed: std::collections::BTreeSet<&str> = ENV.iter().map(|(n, _, _)| *n).collect();
    for name in &listed {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{name} "))),
            "{name} is not in `run --help`:\n{help}"
        );
    }
    // every variable named in the settings' source, read through `get("…")` or `env::var("…")`
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/runtime/settings.rs"
    ))
    .unwrap();
    let mut read = std::collections::BTreeSet::new();
    for opener in ["get(\"", "env::var(\""] {
        for (i, _) in source.match_indices(opener) {
            let rest = &source[i + opener.len()..];
            let name = &rest[..rest.find('"').unwrap()];
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                read.insert(name.to_string());
            }
        }
    }
    assert!(read.len() >= 15, "{read:?}");
    for name in &read {
        assert!(
            listed.contains(name.as_str()),
            "{name} is read by src/runtime/settings.rs but not listed in settings::ENV"
        );
    }
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    for name in &listed {
        assert!(
            docs.contains(&format!("| `{name}`")) || docs.contains(&format!(", `{name}` |")),
            "{name} is not in the table of variables of docs/operations.md"
        );
    }
}

fn run_cli(args: &[&str]) -> (Option<i32>, String, String) {
    run_cli_with_stdin(args, "")
}

/// `render` prints every object the operator would create for the example cluster (2 shards
/// × 2 replicas, 3 Keeper members) as YAML a reader and `kubectl apply --dry-run` can take:
/// a StatefulSet per replica and one for Keeper, the configuration files readable in the
/// ConfigMaps and the users Secret's `stringData` (with no real password: they are generated
/// at creation), and the names a pass would give. An invalid spec is refused with its field.
#[test]
fn render_prints_every_object_and_configuration_file_of_a_spec() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/cluster.yaml");
    let (code, stdout, stderr) = run_cli(&["render", "-f", example]);
    assert_eq!(code, Some(0), "{stderr}");
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let kind = |d: &serde_yaml::Value| d["kind"].as_str().unwrap_or_default().to_string();
    let name = |d: &serde_yaml::Value| {
        d["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let of = |k: &str| -> Vec<String> { docs.iter().filter(|d| kind(d) == k).map(name).collect() };
    assert_eq!(
        of("StatefulSet"),
        [
            "demo-keeper",
            "demo-0-0",
            "demo-0-1",
            "demo-1-2",
            "demo-1-3"
        ],
        "{stdout}"
    );
    assert_eq!(of("Secret"), ["demo-users"]);
    assert!(of("ConfigMap").contains(&"demo-common".to_string()));
    assert!(
        docs.iter()
            .all(|d| d["apiVersion"].is_string() && d["metadata"]["namespace"] == "demo")
    );
    let users = docs.iter().find(|d| kind(d) == "Secret").unwrap();
    assert!(users.get("data").is_none());
    let remote = users["stringData"]["00-operator-remote-servers.xml"]
        .as_str()
        .unwrap();
    assert!(
        remote.contains("<remote_servers") && remote.contains("demo-1-3-0.demo-headless.demo.svc"),
        "{remote}"
    );
    let common = docs.iter().find(|d| name(d) == "demo-common").unwrap();
    assert!(
        common["data"]["00-operator-server.xml"]
            .as_str()
            .unwrap()
            .contains("<http_port>8123</http_port>")
    );

    let (code, _, stderr) = run_cli_with_stdin(
        &["render", "-f", "-"],
        "apiVersion: clickhouse.com/v1alpha1\nkind: ClickHouseCluster\nmetadata: {name: c1}\nspec: {shards: -1}\n",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("shards"), "{stderr}");
}

/// `completions <shell>` prints a script that completes the subcommands and their flags.
#[test]
fn completions_complete_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, stdout, stderr) = run_cli(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}: {stderr}");
        for word in ["clickhouse-operator", "render", "plan", "--offline"] {
            assert!(stdout.contains(word), "{shell}: no {word}");
        }
    }
    let (code, _, _) = run_cli(&["completions", "cmd.exe"]);
    assert_eq!(code, Some(1));
}

/// Decision 52 in `plan` and `render`: the operator-level defaults (`--defaults`, else
/// `CLUSTER_DEFAULTS_FILE`) go under each cluster's spec as the operator merges them, the
/// cluster's own fields winning; a defaults file that names a field it may not is refused
/// with that field.
#[test]
fn plan_and_render_merge_the_operator_defaults_under_the_spec() {
    let dir = std::env::temp_dir().join(format!("chop-cli-defaults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let defaults = dir.join("defaults.yaml");
    std::fs::write(
        &defaults,
        "pod:\n  nodeSelector:\n    pool: db\n  tolerations:\n  - {key: dedicated, operator: Exists}\n\
         storage: {storageClassName: fast-ssd}\n",
    )
    .unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/cluster.yaml");
    let d = defaults.to_str().unwrap();
    let (code, stdout, stderr) = run_cli(&["render", "-f", example, "--defaults", d]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("pool: db"), "the default node selector");
    assert!(stdout.contains("dedicated"), "the default toleration");
    // decision 59: a cluster from a file has no volume yet, so it takes the default class
    assert!(
        stdout.contains("storageClassName: fast-ssd"),
        "the default storage class"
    );
    let (_, plain, _) = run_cli(&["render", "-f", example]);
    assert!(!plain.contains("pool: db") && !plain.contains("fast-ssd"));
    // the same through CLUSTER_DEFAULTS_FILE, in plan
    let out = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .args(["plan", "--offline", "-o", "json", "-f", example])
        .env("CLUSTER_DEFAULTS_FILE", d)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    // the cluster's own field wins
    let own = "apiVersion: clickhouse.com/v1alpha1\nkind: ClickHouseCluster\nmetadata: {name: c1}\nspec:\n  pod:\n    nodeSelector: {pool: fast}\n";
    let (code, stdout, stderr) = run_cli_with_stdin(&["render", "-f", "-", "--defaults", d], own);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("pool: fast") && !stdout.contains("pool: db"));
    // a field defaults may not name
    std::fs::write(&defaults, "shards: 3\n").unwrap();
    let (code, _, stderr) = run_cli(&["render", "-f", example, "--defaults", d]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("shards"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
