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

/// The production files of `src/` in name order, each with its path relative to the crate.
fn sources() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    files(&root.join("src"), &mut all);
    all.sort();
    all.into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
            (p, rel)
        })
        .collect()
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
    let mut wrong = Vec::new();
    let mut known_seen = Vec::new();
    for (path, rel) in &sources() {
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

/// The module path of a file of `src/` (`src/plan/pass/mod.rs` → `plan::pass`).
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_start_matches("src/")
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The module paths a line names: `crate::a::b`, `super::x`, `self::y`, each item of a group
/// (`crate::a::{b, c::d}`), resolved from `module`, the module of the file (a `mod.rs` is its
/// folder's module, so `super` is the parent's in both kinds of file).
fn paths_named(line: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !line.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|p| line[i..].starts_with(**p));
        let boundary =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
        let Some(_) = starts.filter(|_| boundary) else {
            i += 1;
            continue;
        };
        // the path's segments up to a group, a space or punctuation
        let mut j = i;
        let mut segs: Vec<String> = Vec::new();
        loop {
            let seg: String = line[j..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if seg.is_empty() {
                break;
            }
            j += seg.len();
            segs.push(seg);
            if line[j..].starts_with("::") {
                j += 2;
            } else {
                break;
            }
        }
        let mut base: Vec<String> = Vec::new();
        let mut k = 0;
        match segs.first().map(String::as_str) {
            Some("crate") => k = 1,
            _ => {
                base = module.to_vec();
                while k < segs.len() && (segs[k] == "super" || segs[k] == "self") {
                    if segs[k] == "super" {
                        base.pop();
                    }
                    k += 1;
                }
            }
        }
        base.extend(segs[k..].iter().cloned());
        if line[j..].starts_with('{') {
            // a group: each item's first segment under the path
            let end = line[j..].find('}').map_or(line.len(), |e| j + e);
            for item in line[j + 1..end].split(',') {
                let first: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !first.is_empty() && first != "self" {
                    let mut p = base.clone();
                    p.push(first);
                    out.push(p);
                }
            }
            out.push(base);
            i = end;
        } else {
            out.push(base);
            i = j.max(i + 1);
        }
    }
    out
}

/// Modules that are siblings (children of one parent) never reach each other both ways,
/// directly or through others of their siblings: what two of them share lives below both
/// (docs/internals.md, "Layers"). A child reaching its parent's items is no such cycle.
#[test]
fn no_two_sibling_modules_reach_each_other() {
    use std::collections::{BTreeMap, BTreeSet};
    let sources = sources();
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|(_, r)| module_of(r)).collect();
    // sibling → siblings it reaches, with one line that shows it
    let mut arrows: BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>> = BTreeMap::new();
    for (path, rel) in &sources {
        let module = module_of(rel);
        let text = std::fs::read_to_string(path).unwrap();
        for (n, line) in production(&text) {
            for named in paths_named(line, &module) {
                // the longest prefix that is a module of the crate
                let Some(target) = (1..=named.len())
                    .rev()
                    .map(|k| named[..k].to_vec())
                    .find(|p| modules.contains(p))
                else {
                    continue;
                };
                let common = module
                    .iter()
                    .zip(&target)
                    .take_while(|(a, b)| a == b)
                    .count();
                if common == module.len() || common == target.len() {
                    continue; // the module itself, an ancestor or a descendant
                }
                arrows
                    .entry(module[..=common].to_vec())
                    .or_default()
                    .entry(target[..=common].to_vec())
                    .or_insert_with(|| format!("{rel}:{n}: {}", line.trim()));
            }
        }
    }
    // a cycle: a path from a sibling back to itself
    let mut cycles = Vec::new();
    let mut members_seen: BTreeSet<Vec<Vec<String>>> = BTreeSet::new();
    for start in arrows.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in arrows.get(&at).map(|m| m.keys()).into_iter().flatten() {
                if next == start {
                    let mut members = trail.clone();
                    members.sort();
                    if !members_seen.insert(members) {
                        continue;
                    }
                    let mut shown: Vec<String> = Vec::new();
                    for w in trail
                        .windows(2)
                        .chain(std::iter::once(&[at.clone(), start.clone()][..]))
                    {
                        shown.push(format!(
                            "{} -> {} ({})",
                            w[0].join("::"),
                            w[1].join("::"),
                            arrows[&w[0]][&w[1]]
                        ));
                    }
                    cycles.push(shown.join("\n  "));
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "sibling modules that reach each other:\n  {}",
        cycles.join("\n\n  ")
    );
}

/// The cycle check reads paths as the compiler resolves them: `super` from a file and from a
/// `mod.rs`, `self`, `crate`, and each item of a group.
#[test]
fn paths_are_resolved_from_the_file_that_names_them() {
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    assert_eq!(module_of("src/plan/pass/mod.rs"), m("plan::pass"));
    assert_eq!(module_of("src/plan/report.rs"), m("plan::report"));
    let from_file = paths_named("use super::pass::Pass;", &m("plan::report"));
    assert_eq!(from_file, [m("plan::pass::Pass")]);
    let from_dir = paths_named("use super::report::x;", &m("plan::pass"));
    assert_eq!(from_dir, [m("plan::report::x")]);
    let group = paths_named("use crate::model::{self, labels, names::x};", &m("a"));
    assert_eq!(group, [m("model::labels"), m("model::names"), m("model")]);
    assert!(paths_named("use my_crate::model;", &m("a")).is_empty());
}
