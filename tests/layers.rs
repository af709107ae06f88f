//! The crate's layers (docs/internals.md, "Layers"): a module reaches only the layers below
//! it. Every `crate::<module>` path in the production code of `src/` (comments and the test
//! modules at the end of a file left out) is checked against the arrows allowed; a forbidden
//! one fails the test with the file, the line and the arrow.

use std::path::{Path, PathBuf};

/// The top-level modules of the crate, each with the modules it must not reach.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("util", UPPER_THAN_BASE),
    ("version", UPPER_THAN_BASE),
    ("conventions", UPPER_THAN_BASE),
    (
        "api",
        &[
            "model",
            "plan",
            "clickhouse",
            "runtime",
            "backup",
            "exporter",
            "controller",
        ],
    ),
    (
        "model",
        &[
            "plan",
            "clickhouse",
            "runtime",
            "backup",
            "exporter",
            "controller",
        ],
    ),
    (
        "plan",
        &["clickhouse", "runtime", "backup", "exporter", "controller"],
    ),
    (
        "clickhouse",
        &[
            "model",
            "plan",
            "runtime",
            "backup",
            "exporter",
            "controller",
        ],
    ),
    (
        "runtime",
        &[
            "api",
            "model",
            "plan",
            "clickhouse",
            "backup",
            "exporter",
            "controller",
        ],
    ),
    ("backup", &["plan", "runtime", "exporter", "controller"]),
];

/// Everything above the bottom modules (`util`, `version`, `conventions`).
const UPPER_THAN_BASE: &[&str] = &[
    "api",
    "model",
    "plan",
    "clickhouse",
    "runtime",
    "backup",
    "exporter",
    "controller",
];

/// Arrows that exist and go the wrong way, each to be moved below (file, module reached):
/// none now. One listed here is let through until it is gone, and then must leave the list.
const KNOWN: &[(&str, &str)] = &[];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            // test shelves
            if p.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs")
            && !p
                .file_name()
                .is_some_and(|n| n == "tests.rs" || n == "testing.rs")
        {
            out.push(p);
        }
    }
}

/// The production lines of a file: up to its test module, without comments.
fn production(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines[i + 1..]
                .iter()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.trim_start().starts_with("mod "))
        {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push((i + 1, *line));
    }
    out
}

/// The top-level modules a line names with `crate::<module>`.
fn reached(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // not `some_crate::` (another crate's path)
        let before = rest[..i].chars().last();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
            out.push(name);
        }
        rest = after;
    }
    out
}

/// The layers hold: no module of `src/` reaches one it must not.
#[test]
fn every_module_reaches_only_the_layers_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    files(&root.join("src"), &mut all);
    all.sort();
    let mut wrong = Vec::new();
    let mut known_seen = Vec::new();
    for path in &all {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let top = rel
            .trim_start_matches("src/")
            .split(['/', '.'])
            .next()
            .unwrap_or_default()
            .to_string();
        let Some((_, forbidden)) = FORBIDDEN.iter().find(|(m, _)| *m == top) else {
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap();
        for (n, line) in production(&text) {
            for target in reached(line) {
                if !forbidden.contains(&target.as_str()) {
                    continue;
                }
                if KNOWN.contains(&(rel.as_str(), target.as_str())) {
                    known_seen.push((rel.clone(), target));
                    continue;
                }
                wrong.push(format!("{rel}:{n}: {top} -> {target}: {}", line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows that point up:\n{}",
        wrong.join("\n")
    );
    // an exception that no longer exists goes from the list
    for (file, target) in KNOWN {
        assert!(
            known_seen.iter().any(|(f, t)| f == file && t == target),
            "{file} no longer reaches {target}: remove it from KNOWN"
        );
    }
}

/// The check sees what it looks for: a path in code, not in a comment or another crate's.
#[test]
fn a_crate_path_is_found_in_code_and_nowhere_else() {
    assert_eq!(reached("use crate::model::names;"), ["model"]);
    assert_eq!(
        reached("let x = crate::plan::a(crate::clickhouse::b);"),
        ["plan", "clickhouse"]
    );
    assert!(reached("use my_crate::model;").is_empty());
    let text = "use crate::util;\n// crate::model\nfn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::testing;\n}\n";
    let lines: Vec<&str> = production(text).into_iter().map(|(_, l)| l).collect();
    assert_eq!(lines, ["use crate::util;", "fn f() {}"]);
}
