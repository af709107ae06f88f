//! PURE: automatic version upgrades (S2-24, decision 15). At a scheduled time, and only while the
//! cluster is `ready`, the operator reads a version document and, if it offers a newer allowed
//! version than the one in `spec.image`, writes that version's image into `spec.image`; Smart
//! Update then rolls it out. Never a downgrade, unless `apply` names that exact version.

use serde::Deserialize;

use crate::version::Version;
pub use crate::version::{Apply, image_version};

/// The document a version source answers with.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct VersionDocument {
    /// The version the publisher recommends (one of `versions`).
    #[serde(default)]
    pub recommended: Option<String>,
    pub versions: Vec<Offered>,
}

/// One version a source offers.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Offered {
    pub version: String,
    /// Its image; default: the current image's repository with `version` as its tag.
    #[serde(default)]
    pub image: Option<String>,
}

/// What a check decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not now (the cluster is not ready, or paused): why. The slot is skipped.
    Skip(String),
    /// Nothing newer to apply: why.
    Current(String),
    /// Write `image` into `spec.image`.
    Upgrade {
        from: String,
        to: String,
        image: String,
    },
    /// The source could not be read or used: an event and a condition, not a cluster error.
    Problem(String),
}

/// Parses a version document.
/// Errors say where the document is wrong, never what it holds: a source may be any URL, and
/// its answer must not travel into a status (decision 37).
pub fn parse_document(text: &str) -> Result<VersionDocument, String> {
    let doc: VersionDocument = serde_json::from_str(text).map_err(|e| {
        let kind = match e.classify() {
            serde_json::error::Category::Io | serde_json::error::Category::Eof => "incomplete",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "not the expected fields",
        };
        format!(
            "not a version document ({kind} at line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    if doc.versions.is_empty() {
        return Err("the document lists no versions".into());
    }
    for (i, o) in doc.versions.iter().enumerate() {
        o.version
            .parse::<Version>()
            .map_err(|_| format!("versions[{i}].version of the document is not a version"))?;
    }
    Ok(doc)
}

/// The repository of an image: without its digest (`@sha256:…`) and its tag.
pub fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(r, _)| r);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

/// The decision of one check for a cluster running `image`; an offered image must come from
/// `image`'s repository or one of `allowed` (decision 37: a version source picks a version,
/// not what runs with the cluster's credentials and volumes).
pub fn decide(
    apply: &Apply,
    image: &str,
    allowed: &[String],
    ready: bool,
    paused: bool,
    document: Result<&VersionDocument, String>,
) -> Verdict {
    if *apply == Apply::Disabled {
        return Verdict::Current("automatic upgrades are disabled".into());
    }
    if paused {
        return Verdict::Skip("the cluster is paused: no upgrade at this slot".into());
    }
    if !ready {
        return Verdict::Skip("the cluster is not ready: no upgrade at this slot".into());
    }
    let doc = match document {
        Ok(d) => d,
        Err(e) => return Verdict::Problem(format!("cannot use the version source: {e}")),
    };
    let Some((repo, current)) = image_version(image) else {
        return Verdict::Problem(format!(
            "the tag of spec.image {image:?} is not a version: cannot compare it"
        ));
    };
    let offered: Vec<(Version, &Offered)> = doc
        .versions
        .iter()
        .filter_map(|o| Some((o.version.parse().ok()?, o)))
        .collect();
    let target = match apply {
        Apply::Disabled => unreachable!("handled above"),
        Apply::Latest => offered.iter().max_by_key(|(v, _)| *v),
        Apply::Recommended => {
            let Some(r) = &doc.recommended else {
                return Verdict::Problem("the version source recommends no version".into());
            };
            let Ok(r) = r.parse::<Version>() else {
                return Verdict::Problem(format!("the recommended {r:?} is not a version"));
            };
            match offered.iter().find(|(v, _)| *v == r) {
                Some(t) => Some(t),
                None => {
                    return Verdict::Problem(format!(
                        "the recommended version {r} is not among the versions offered"
                    ));
                }
            }
        }
        Apply::Exact(want) => match offered.iter().find(|(v, _)| v == want) {
            Some(t) => Some(t),
            None => {
                return Verdict::Problem(format!(
                    "version {want} is not offered by the version source"
                ));
            }
        },
    };
    let Some((to, o)) = target else {
        return Verdict::Problem("the document lists no versions".into());
    };
    if *to == current {
        return Verdict::Current(format!("{current} is the version to run"));
    }
    if *to < current && !matches!(apply, Apply::Exact(_)) {
        return Verdict::Current(format!(
            "never a downgrade: {} is older than the running {current}",
            o.version
        ));
    }
    let offered_image = o
        .image
        .clone()
        .unwrap_or_else(|| format!("{repo}:{}", o.version));
    let from = repository(&offered_image);
    if from != repo && !allowed.iter().any(|a| a == from) {
        return Verdict::Problem(format!(
            "the version source offers {to} as an image of repository {from:?}, not of {repo:?}: list it in spec.upgradeOptions.allowedRepositories to accept it"
        ));
    }
    Verdict::Upgrade {
        from: current.to_string(),
        to: to.to_string(),
        image: offered_image,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> VersionDocument {
        parse_document(
            r#"{"recommended": "25.3.2.39",
                "versions": [{"version": "24.3.12.75"}, {"version": "24.8"},
                             {"version": "25.3.2.39"},
                             {"version": "25.8.1.1", "image": "mirror.example/ch/server:25.8.1.1"}]}"#,
        )
        .unwrap()
    }

    const RUNNING: &str = "clickhouse/clickhouse-server:24.8";

    /// (name, apply, ready, paused, source, verdict)
    type Case<'a> = (
        &'a str,
        Apply,
        bool,
        bool,
        Result<&'a VersionDocument, String>,
        Verdict,
    );

    fn upgrade(to: &str, image: &str) -> Verdict {
        Verdict::Upgrade {
            from: "24.8.0.0".into(),
            to: to.into(),
            image: image.into(),
        }
    }

    /// S2-24, decision 15: the decision table of an upgrade check.
    #[test]
    fn an_upgrade_check_decides_by_apply_state_and_source() {
        let d = doc();
        let v = |s: &str| Apply::Exact(s.parse().unwrap());
        let cases: Vec<Case> = vec![
            (
                "disabled",
                Apply::Disabled,
                true,
                false,
                Ok(&d),
                Verdict::Current("automatic upgrades are disabled".into()),
            ),
            (
                "not ready",
                Apply::Latest,
                false,
                false,
                Ok(&d),
                Verdict::Skip("the cluster is not ready: no upgrade at this slot".into()),
            ),
            (
                "paused",
                Apply::Latest,
                true,
                true,
                Ok(&d),
                Verdict::Skip("the cluster is paused: no upgrade at this slot".into()),
            ),
            (
                "recommended, newer",
                Apply::Recommended,
                true,
                false,
                Ok(&d),
                upgrade("25.3.2.39", "clickhouse/clickhouse-server:25.3.2.39"),
            ),
            (
                "latest, with its own image",
                Apply::Latest,
                true,
                false,
                Ok(&d),
                upgrade("25.8.1.1", "mirror.example/ch/server:25.8.1.1"),
            ),
            (
                "named version, same",
                v("24.8"),
                true,
                false,
                Ok(&d),
                Verdict::Current("24.8.0.0 is the version to run".into()),
            ),
            (
                "named version, older: the one way down",
                v("24.3.12.75"),
                true,
                false,
                Ok(&d),
                upgrade("24.3.12.75", "clickhouse/clickhouse-server:24.3.12.75"),
            ),
            (
                "named version not offered",
                v("23.8"),
                true,
                false,
                Ok(&d),
                Verdict::Problem("version 23.8.0.0 is not offered by the version source".into()),
            ),
            (
                "unreadable source",
                Apply::Latest,
                true,
                false,
                Err("connection refused".into()),
                Verdict::Problem("cannot use the version source: connection refused".into()),
            ),
        ];
        let mirror = vec!["mirror.example/ch/server".to_string()];
        for (name, apply, ready, paused, source, want) in cases {
            assert_eq!(
                decide(&apply, RUNNING, &mirror, ready, paused, source),
                want,
                "{name}"
            );
        }
    }

    /// Never a downgrade: a recommendation older than the running version is not applied.
    #[test]
    fn a_recommendation_older_than_the_running_version_is_not_applied() {
        let d = doc();
        assert_eq!(
            decide(
                &Apply::Recommended,
                "clickhouse/clickhouse-server:25.8.1.1",
                &[],
                true,
                false,
                Ok(&d)
            ),
            Verdict::Current(
                "never a downgrade: 25.3.2.39 is older than the running 25.8.1.1".into()
            )
        );
        assert_eq!(
            decide(
                &Apply::Latest,
                "clickhouse/clickhouse-server:25.8.1.1",
                &[],
                true,
                false,
                Ok(&d)
            ),
            Verdict::Current("25.8.1.1 is the version to run".into())
        );
    }

    #[test]
    fn images_without_a_version_tag_and_bad_documents_are_problems() {
        let d = doc();
        for image in [
            "clickhouse/clickhouse-server:latest",
            "clickhouse/clickhouse-server",
            "localhost:5000/ch",
        ] {
            assert!(
                matches!(
                    decide(&Apply::Latest, image, &[], true, false, Ok(&d)),
                    Verdict::Problem(_)
                ),
                "{image}"
            );
        }
        assert_eq!(
            image_version("registry.local:5000/ch/server:24.8.4.13")
                .map(|(r, v)| (r, v.to_string())),
            Some(("registry.local:5000/ch/server", "24.8.4.13".to_string()))
        );
        assert!(parse_document("{}").is_err());
        assert!(parse_document(r#"{"versions": []}"#).is_err());
        assert!(parse_document(r#"{"versions": [{"version": "new"}]}"#).is_err());
        assert!(parse_document("not json").is_err());
        let no_rec = parse_document(r#"{"versions": [{"version": "25.3"}]}"#).unwrap();
        assert_eq!(
            decide(&Apply::Recommended, RUNNING, &[], true, false, Ok(&no_rec)),
            Verdict::Problem("the version source recommends no version".into())
        );
        assert_eq!(Apply::parse("LATEST"), Ok(Apply::Latest));
        assert!(Apply::parse("soon").is_err());
    }

    /// Decision 37: a version source picks a version, not a repository: an image of another
    /// repository is refused unless the cluster allows it; a digest is fine.
    #[test]
    fn an_offered_image_of_another_repository_is_refused_unless_allowed() {
        let d = parse_document(
            r#"{"versions": [{"version": "25.3", "image": "attacker.example/evil:25.3"}]}"#,
        )
        .unwrap();
        let v = decide(&Apply::Latest, RUNNING, &[], true, false, Ok(&d));
        assert!(
            matches!(&v, Verdict::Problem(m) if m.contains("attacker.example/evil") && m.contains("allowedRepositories")),
            "{v:?}"
        );
        let allowed = vec!["attacker.example/evil".to_string()];
        assert!(matches!(
            decide(&Apply::Latest, RUNNING, &allowed, true, false, Ok(&d)),
            Verdict::Upgrade { .. }
        ));
        let digest = parse_document(
            r#"{"versions": [{"version": "25.3", "image": "clickhouse/clickhouse-server@sha256:0123"}]}"#,
        )
        .unwrap();
        assert_eq!(
            decide(&Apply::Latest, RUNNING, &[], true, false, Ok(&digest)),
            upgrade("25.3.0.0", "clickhouse/clickhouse-server@sha256:0123")
        );
        assert_eq!(
            repository("registry:5000/ch/server:25.3@sha256:ab"),
            "registry:5000/ch/server"
        );
        assert_eq!(
            repository("registry:5000/ch/server"),
            "registry:5000/ch/server"
        );
        assert_eq!(repository("ch/server:25.3"), "ch/server");
    }
}
