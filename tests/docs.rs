//! The documentation stays true to the code: `docs/reference/api.md` is rendered from the CRDs
//! (`deploy/crds.yaml`), every field of which has a description, and every relative link of the
//! Markdown files points at a file that exists and, with an `#anchor`, at one of its headings.
//!
//! `CHOP_WRITE_DOCS=1 cargo test --test docs` writes the API reference again.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn crds() -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy/crds.yaml")).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Kubernetes' own types inside the CRDs, known by the fields they have: the reference names
/// them and links to Kubernetes' documentation instead of listing their fields.
const KUBERNETES_TYPES: &[(&str, &[&str], &str)] = &[
    (
        "Container",
        &["name", "image", "command", "args", "ports", "livenessProbe"],
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#Container",
    ),
    (
        "EnvVar",
        &["name", "value", "valueFrom"],
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#environment-variables",
    ),
    (
        "Affinity",
        &["nodeAffinity", "podAffinity", "podAntiAffinity"],
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling",
    ),
    (
        "Toleration",
        &["key", "operator", "effect", "tolerationSeconds"],
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling",
    ),
    (
        "ResourceRequirements",
        &["limits", "requests", "claims"],
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#resources",
    ),
    (
        "NetworkPolicyPeer",
        &["ipBlock", "namespaceSelector", "podSelector"],
        "https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/network-policy-v1/#NetworkPolicySpec",
    ),
];

fn kubernetes_type(schema: &Value) -> Option<(&'static str, &'static str)> {
    let props = schema.get("properties")?.as_object()?;
    KUBERNETES_TYPES
        .iter()
        .find(|(_, keys, _)| keys.iter().all(|k| props.contains_key(*k)))
        .map(|(name, _, link)| (*name, *link))
}

/// Every property (at any depth, Kubernetes' types included) without a description.
fn undescribed(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let p = format!("{path}.{name}");
            let described = prop
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.trim().is_empty());
            if !described {
                out.push(p.clone());
            }
            undescribed(prop, &p, out);
        }
    }
    if let Some(items) = schema.get("items") {
        undescribed(items, &format!("{path}[]"), out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        undescribed(values, &format!("{path}.<key>"), out);
    }
}

/// A description as one table cell: one line, `|` escaped, `<` outside code spans escaped so
/// that `<cluster>` is not taken for HTML.
fn cell(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    let mut in_code = false;
    for c in joined.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c)
            }
            '|' => out.push_str("\\|"),
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

fn type_of(schema: &Value) -> String {
    if let Some((name, link)) = kubernetes_type(schema) {
        return format!("[{name}]({link})");
    }
    if schema.get("x-kubernetes-int-or-string").is_some() {
        return "int or string".into();
    }
    let ty = schema.get("type").and_then(Value::as_str).unwrap_or("any");
    match ty {
        "array" => match schema.get("items") {
            Some(items) => format!("[]{}", type_of(items)),
            None => "[]any".into(),
        },
        "object" => {
            if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
                format!("map[string]{}", type_of(values))
            } else if schema.get("x-kubernetes-preserve-unknown-fields").is_some()
                && schema.get("properties").is_none()
            {
                "object (free-form)".into()
            } else {
                "object".into()
            }
        }
        "string" => match schema.get("format").and_then(Value::as_str) {
            Some(f) => format!("string ({f})"),
            None => "string".into(),
        },
        other => other.into(),
    }
}

fn constraints(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| format!("`{}`", v.as_str().map_or(v.to_string(), str::to_string)))
            .collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    if let Some(min) = schema.get("minimum") {
        out.push(format!("at least {min}"));
    }
    if let Some(max) = schema.get("maxLength") {
        out.push(format!("at most {max} characters"));
    }
    if let Some(max) = schema.get("maxItems") {
        out.push(format!("at most {max} items"));
    }
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for rule in rules {
            if let Some(m) = rule.get("message").and_then(Value::as_str) {
                out.push(format!("refused by the API server: {m}"));
            }
        }
    }
    out
}

fn render_fields(schema: &Value, path: &str, out: &mut String) {
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let p = format!("{path}.{name}");
            let mut ty = type_of(prop);
            if required.contains(name.as_str()) {
                ty.push_str(", required");
            }
            let default = prop
                .get("default")
                .map(|d| format!("`{}`", cell(&d.to_string())))
                .unwrap_or_default();
            let mut description = cell(prop["description"].as_str().unwrap_or(""));
            for c in constraints(prop) {
                write!(description, " *{}.*", cell(&c)).unwrap();
            }
            writeln!(out, "| `{p}` | {ty} | {default} | {description} |").unwrap();
            render_children(prop, &p, out);
        }
    }
}

fn render_children(schema: &Value, path: &str, out: &mut String) {
    if kubernetes_type(schema).is_some() {
        return;
    }
    render_fields(schema, path, out);
    if let Some(items) = schema.get("items") {
        render_children(items, &format!("{path}[]"), out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        render_children(values, &format!("{path}.<key>"), out);
    }
}

fn render_api_reference(crds: &[Value]) -> String {
    let mut out = String::new();
    out.push_str(
        "# API reference\n\n\
         <!-- generated from deploy/crds.yaml by tests/docs.rs: \
         CHOP_WRITE_DOCS=1 cargo test --test docs -->\n\n\
         Generated from the CRDs (`deploy/crds.yaml`, the same as \
         `charts/clickhouse-operator/crds/` and `clickhouse-operator crd`); \
         `kubectl explain chc.spec` shows the same descriptions. \
         Fields of Kubernetes' own types (containers, environment variables, affinity, \
         tolerations, resources, NetworkPolicy peers) link to Kubernetes' reference.\n\n\
         | kind | resource | short name | group, version | scope |\n|---|---|---|---|---|\n",
    );
    for crd in crds {
        let names = &crd["spec"]["names"];
        let versions: Vec<&str> = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        let kind = names["kind"].as_str().unwrap();
        writeln!(
            out,
            "| [{kind}](#{}) | `{}` | `{}` | `{}`, `{}` | {} |",
            kind.to_lowercase(),
            crd["metadata"]["name"].as_str().unwrap(),
            names["shortNames"][0].as_str().unwrap_or(""),
            crd["spec"]["group"].as_str().unwrap(),
            versions.join("`, `"),
            crd["spec"]["scope"].as_str().unwrap(),
        )
        .unwrap();
    }
    for crd in crds {
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let root = &version["schema"]["openAPIV3Schema"];
            writeln!(
                out,
                "\n## {kind}\n\n`apiVersion: {}/{}`, `kind: {kind}`.",
                crd["spec"]["group"].as_str().unwrap(),
                version["name"].as_str().unwrap()
            )
            .unwrap();
            for c in constraints(root) {
                writeln!(out, "\n*{}.*", capitalized(&cell(&c))).unwrap();
            }
            if let Some(columns) = version["additionalPrinterColumns"].as_array() {
                let cols: Vec<String> = columns
                    .iter()
                    .map(|c| {
                        format!(
                            "{} (`{}`)",
                            c["name"].as_str().unwrap(),
                            c["jsonPath"].as_str().unwrap()
                        )
                    })
                    .collect();
                writeln!(out, "\n`kubectl get` shows: {}.", cols.join(", ")).unwrap();
            }
            for part in ["spec", "status"] {
                let Some(schema) = root["properties"].get(part) else {
                    continue;
                };
                writeln!(out, "\n### {kind} {part}\n").unwrap();
                writeln!(
                    out,
                    "{}",
                    cell(schema["description"].as_str().unwrap_or(""))
                )
                .unwrap();
                for c in constraints(schema) {
                    writeln!(out, "\n*{}.*", capitalized(&cell(&c))).unwrap();
                }
                out.push_str("\n| field | type | default | description |\n|---|---|---|---|\n");
                render_fields(schema, part, &mut out);
            }
        }
    }
    out
}

#[test]
fn every_crd_field_has_a_description() {
    let mut missing = Vec::new();
    for crd in crds() {
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let root = &version["schema"]["openAPIV3Schema"];
            for part in ["spec", "status"] {
                if let Some(schema) = root["properties"].get(part) {
                    if schema.get("description").is_none() {
                        missing.push(format!("{kind} {part}"));
                    }
                    undescribed(schema, &format!("{kind} {part}"), &mut missing);
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fields without a description in deploy/crds.yaml:\n{}",
        missing.join("\n")
    );
}

#[test]
fn api_reference_is_generated_from_the_crds() {
    let path = repo().join("docs/reference/api.md");
    let want = render_api_reference(&crds());
    if std::env::var_os("CHOP_WRITE_DOCS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &want).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == want,
        "docs/reference/api.md drifted from deploy/crds.yaml: run `CHOP_WRITE_DOCS=1 cargo test --test docs`"
    );
    // every field of the operator's own is listed
    for field in [
        "`spec.shards`",
        "`spec.keeper.external.root`",
        "`spec.pod.sidecars`",
        "`status.replicaStateMap.<key>.state`",
        "`spec.destination.bucket`",
    ] {
        assert!(want.contains(field), "{field} missing");
    }
}

/// Markdown text with fenced code blocks and inline code spans blanked out.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            out.push('\n');
            continue;
        }
        if fence {
            out.push('\n');
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                out.push(' ');
            } else {
                out.push(if in_code { ' ' } else { c });
            }
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation other than `-` and `_`
/// dropped; a repeated one gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        // a link in a heading counts by its text
        let mut plain = String::new();
        let mut rest = heading.trim();
        while let Some(open) = rest.find('[') {
            match rest[open..].find("](").and_then(|m| {
                rest[open + m..]
                    .find(')')
                    .map(|close| (open + m, open + m + close))
            }) {
                Some((mid, close)) => {
                    plain.push_str(&rest[..open]);
                    plain.push_str(&rest[open + 1..mid]);
                    rest = &rest[close + 1..];
                }
                None => break,
            }
        }
        plain.push_str(rest);
        let slug: String = plain
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                '-' | '_' => Some(c),
                c if c.is_alphanumeric() => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` and reference definitions `[x]: target`.
fn links(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        if let Some(end) = after.find(')') {
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        }
        rest = after;
    }
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with('[')
            && let Some(i) = l.find("]: ")
        {
            out.push(
                l[i + 3..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
        }
    }
    out
}

fn markdown_files() -> Vec<PathBuf> {
    let root = repo();
    let mut files = vec![
        root.join("README.md"),
        root.join("SECURITY.md"),
        root.join("charts/README.md"),
    ];
    for entry in std::fs::read_dir(root.join("charts")).unwrap() {
        let readme = entry.unwrap().path().join("README.md");
        if readme.is_file() {
            files.push(readme);
        }
    }
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    walk(&root.join("docs"), &mut files);
    files.retain(|f| f.is_file());
    files.sort();
    files
}

#[test]
fn every_relative_link_points_at_a_file_and_heading_that_exist() {
    let root = repo();
    let files = markdown_files();
    assert!(files.len() >= 10, "{files:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for link in links(&text) {
            if link.is_empty()
                || link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (path, anchor) = match link.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{name}: {link}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                if !target.is_file() || target.extension().is_none_or(|e| e != "md") {
                    broken.push(format!(
                        "{name}: {link}: an anchor into a file that is not Markdown"
                    ));
                    continue;
                }
                let target_text = std::fs::read_to_string(&target).unwrap();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{name}: {link}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > 0);
}

#[test]
fn anchors_follow_githubs_rules() {
    let a = anchors(
        "# What a change does\n## `spec.keeper` and Keeper\n```\n# not a heading\n```\n\
         ## When things go wrong\n## When things go wrong\n### The [API](x.md), v1alpha1!\n",
    );
    assert!(a.contains("what-a-change-does"), "{a:?}");
    assert!(a.contains("speckeeper-and-keeper"), "{a:?}");
    assert!(a.contains("when-things-go-wrong") && a.contains("when-things-go-wrong-1"));
    assert!(a.contains("the-api-v1alpha1"), "{a:?}");
    assert!(!a.contains("not-a-heading"));
    let l = links("see [a](docs/a.md#x) and `[b](c.md)` and [c](https://x)\n\n[d]: e.md\n");
    assert_eq!(l, ["docs/a.md#x", "https://x", "e.md"]);
}

/// Review L-12: every operator replica reports Ready on `/readyz` once it serves, a standby
/// too (`src/main.rs` marks it ready before it waits for the Lease; the chart's rollout relies
/// on it): no document says that only the Lease holder is Ready, and docs/monitoring.md says
/// what is true.
#[test]
fn no_document_says_only_the_lease_holder_is_ready() {
    let main = std::fs::read_to_string(repo().join("src/main.rs")).unwrap();
    let marked = main
        .find("A standby is healthy and ready too")
        .expect("main.rs");
    let waits = main.find("elector.acquire()").expect("main.rs");
    assert!(
        marked < waits,
        "the standby is marked ready before it waits for the Lease"
    );
    let false_claims = [
        "only the replica holding the lease reports ready",
        "only the lease holder is ready",
        "only the lease holder reports ready",
        "only the leader is ready",
        "only the leader reports ready",
        "holding the lease acts and is ready",
    ];
    for file in markdown_files() {
        let text = prose(&std::fs::read_to_string(&file).unwrap()).to_lowercase();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for claim in false_claims {
            assert!(!text.contains(claim), "{}: {claim:?}", file.display());
        }
    }
    let monitoring = std::fs::read_to_string(repo().join("docs/monitoring.md")).unwrap();
    let monitoring = monitoring.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        monitoring
            .contains("every replica reports Ready on `/readyz` once it serves, a standby too"),
        "docs/monitoring.md"
    );
}
