//! Who may send what where (decision 29): which bucket a backup or restore of a cluster uses,
//! and which Secret keys become its S3 credentials. PURE.
//!
//! - A backup or restore uses its cluster's `spec.backup.destination`, or a destination of its
//!   own only when it is that one or one of the cluster's `spec.backup.allowedDestinations`,
//!   field for field: whoever may create a ClickHouseBackup cannot send the cluster's data, or
//!   a Secret's keys (SigV4 sends the access key id in clear), anywhere the cluster did not name.
//! - A Secret is read for S3 credentials only when it carries [`CREDENTIALS_LABEL`], and never
//!   when it is one of the cluster's own (the operator's and users' Secrets, those the cluster
//!   spec reads).
//! - A plain-HTTP endpoint needs `insecure: true` (checked with the rest of the destination).

use k8s_openapi::api::core::v1::Secret;

use crate::api::{ClickHouseCluster, ClickHouseClusterSpec, S3Destination};
const ACCESS_KEY_ID: &str = crate::api::S3Destination::ACCESS_KEY_ID;
const SECRET_ACCESS_KEY: &str = crate::api::S3Destination::SECRET_ACCESS_KEY;
use crate::util::names;

/// The label a Secret carries, with the value `"true"`, to be used for S3 credentials.
pub const CREDENTIALS_LABEL: &str = "clickhouse.com/s3-credentials";

/// Why a backup or restore may not use a destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestinationRefusal {
    #[error(
        "no destination: set spec.destination, or spec.backup.destination of cluster {cluster}"
    )]
    Missing { cluster: String },
    #[error(
        "destination {endpoint}, bucket {bucket} is neither cluster {cluster}'s spec.backup.destination nor one of its spec.backup.allowedDestinations (every field the same): a backup or restore uses only the destinations its cluster names"
    )]
    NotAllowed {
        cluster: String,
        endpoint: String,
        bucket: String,
    },
    #[error("invalid destination: {0}")]
    Invalid(String),
}

/// Why a Secret's keys may not be used as S3 credentials.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialRefusal {
    #[error(
        "Secret {secret} (the destination's credentials) does not exist in namespace {namespace}"
    )]
    Missing { secret: String, namespace: String },
    #[error(
        "Secret {secret} does not carry the label {CREDENTIALS_LABEL}: \"true\": only Secrets that opt in are read for S3 credentials"
    )]
    NotOptedIn { secret: String },
    #[error(
        "Secret {secret} is one of cluster {cluster}'s own ({why}): it is never used for S3 credentials"
    )]
    Reserved {
        secret: String,
        cluster: String,
        why: &'static str,
    },
    #[error("Secret {secret} has no key {key}")]
    NoKey { secret: String, key: String },
    #[error(
        "ServiceAccount {service_account} (the destination's webIdentity) does not exist in namespace {namespace}"
    )]
    NoServiceAccount {
        service_account: String,
        namespace: String,
    },
    #[error(
        "ServiceAccount {service_account} does not carry the label {CREDENTIALS_LABEL}: \"true\": only ServiceAccounts that opt in have their tokens exchanged for S3 credentials"
    )]
    ServiceAccountNotOptedIn { service_account: String },
    #[error("the destination has webIdentity: it has no static keys")]
    WebIdentity,
}

/// Whether `labels` opt in to S3 credentials.
fn opts_in(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(CREDENTIALS_LABEL))
        .is_some_and(|v| v == "true")
}

/// The role of `d` when its ServiceAccount (`account`, if it exists) may have its tokens
/// exchanged for it: only a ServiceAccount that carries [`CREDENTIALS_LABEL`] (decision 43),
/// as a Secret must for its keys. A token of it, with an audience of the destination's
/// choosing, is sent to the destination's STS endpoint.
pub fn web_identity<'a>(
    d: &'a S3Destination,
    account: Option<&k8s_openapi::api::core::v1::ServiceAccount>,
    namespace: &str,
) -> Result<&'a crate::api::WebIdentity, CredentialRefusal> {
    let w = d
        .web_identity
        .as_ref()
        .ok_or(CredentialRefusal::WebIdentity)?;
    let Some(account) = account else {
        return Err(CredentialRefusal::NoServiceAccount {
            service_account: w.service_account_name.clone(),
            namespace: namespace.into(),
        });
    };
    if !opts_in(account.metadata.labels.as_ref()) {
        return Err(CredentialRefusal::ServiceAccountNotOptedIn {
            service_account: w.service_account_name.clone(),
        });
    }
    Ok(w)
}

/// `d` with every default filled in, so that two ways of writing one destination compare equal.
fn normalized(d: &S3Destination, default_prefix: &str) -> S3Destination {
    S3Destination {
        endpoint: d.endpoint.trim_end_matches('/').to_string(),
        bucket: d.bucket.clone(),
        prefix: Some(
            d.prefix
                .clone()
                .unwrap_or_else(|| default_prefix.to_string())
                .trim_matches('/')
                .to_string(),
        ),
        region: Some(d.region.clone().unwrap_or_else(|| "us-east-1".into())),
        secret_name: d.secret_name.clone(),
        access_key_id_key: d
            .web_identity
            .is_none()
            .then(|| d.access_key_id_key().to_string()),
        secret_access_key_key: d
            .web_identity
            .is_none()
            .then(|| d.secret_access_key_key().to_string()),
        web_identity: d.web_identity.as_ref().map(|w| crate::api::WebIdentity {
            role_arn: w.role_arn.clone(),
            service_account_name: w.service_account_name.clone(),
            audience: Some(w.audience().to_string()),
            sts_endpoint: Some(w.sts_endpoint(d.region())),
        }),
        insecure: d.insecure,
    }
}

/// The prefix under which a cluster's backups go when the destination names none.
pub fn default_prefix(namespace: &str, cluster: &str) -> String {
    format!("{namespace}/{cluster}")
}

/// The destination a backup or restore of `cluster` uses: `requested` (its own `destination`)
/// when the cluster names it, else the cluster's.
pub fn choose(
    requested: Option<&S3Destination>,
    cluster: &ClickHouseCluster,
    namespace: &str,
) -> Result<S3Destination, DestinationRefusal> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let own = &cluster.spec.backup;
    let chosen = match requested {
        None => own.destination.clone().ok_or(DestinationRefusal::Missing {
            cluster: name.clone(),
        })?,
        Some(d) => {
            let prefix = default_prefix(namespace, &name);
            let wanted = normalized(d, &prefix);
            let named = own
                .destination
                .iter()
                .chain(&own.allowed_destinations)
                .any(|n| normalized(n, &prefix) == wanted);
            if !named {
                return Err(DestinationRefusal::NotAllowed {
                    cluster: name,
                    endpoint: d.endpoint.clone(),
                    bucket: d.bucket.clone(),
                });
            }
            d.clone()
        }
    };
    let problems = crate::api::validate::destination_errors("destination", &chosen);
    if !problems.is_empty() {
        let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        return Err(DestinationRefusal::Invalid(text.join("; ")));
    }
    Ok(chosen)
}

/// The destination a restore into `cluster` reads `requested` from: as [`choose`], but the
/// prefix may also be another cluster's of the same namespace (`<namespace>/<cluster>`, the
/// folder of a backup of a cluster that is gone) when the destination the cluster names sets no
/// prefix of its own.
pub fn choose_for_restore(
    requested: &S3Destination,
    cluster: &ClickHouseCluster,
    namespace: &str,
) -> Result<S3Destination, DestinationRefusal> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let own = &cluster.spec.backup;
    let sibling_prefix = |p: &str| {
        p.trim_matches('/')
            .strip_prefix(&format!("{namespace}/"))
            .is_some_and(|c| !c.is_empty() && !c.contains('/'))
    };
    let without_prefix = |d: &S3Destination| {
        let mut n = normalized(d, "");
        n.prefix = None;
        n
    };
    let wanted = without_prefix(requested);
    let named = own
        .destination
        .iter()
        .chain(&own.allowed_destinations)
        .any(|n| {
            without_prefix(n) == wanted
                && match (&n.prefix, &requested.prefix) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.trim_matches('/') == b.trim_matches('/'),
                    (None, Some(b)) => sibling_prefix(b),
                    (Some(_), None) => false,
                }
        });
    if !named {
        return Err(DestinationRefusal::NotAllowed {
            cluster: name,
            endpoint: requested.endpoint.clone(),
            bucket: requested.bucket.clone(),
        });
    }
    choose(None, &with_destination(cluster, requested), namespace)
}

/// `cluster` with `d` as its destination, to check `d` the same way.
fn with_destination(cluster: &ClickHouseCluster, d: &S3Destination) -> ClickHouseCluster {
    let mut c = cluster.clone();
    c.spec.backup.destination = Some(d.clone());
    c
}

/// The named collections of the cluster's backup destinations (`spec.backup.destination` and
/// `allowedDestinations`) whose Secret may be used (see [`credentials`]); `secret` finds a
/// Secret of the namespace by name. A destination whose Secret is refused gets none: a backup
/// to it is refused with the reason when it runs.
pub fn collections<'a>(
    cluster: &ClickHouseCluster,
    secret: impl Fn(&str) -> Option<&'a Secret>,
) -> Vec<crate::model::S3Collection> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let ns = cluster.metadata.namespace.clone().unwrap_or_default();
    let mut out: Vec<crate::model::S3Collection> = Vec::new();
    let own = &cluster.spec.backup;
    for d in own.destination.iter().chain(&own.allowed_destinations) {
        let collection = crate::model::S3Collection::name_of(d);
        if out.iter().any(|c| c.name == collection) {
            continue;
        }
        if d.web_identity.is_some() {
            // decision 43: the servers hold one role, that of `spec.backup.destination`
            if own
                .destination
                .as_ref()
                .and_then(|p| p.web_identity.as_ref())
                == d.web_identity.as_ref()
            {
                out.push(crate::model::S3Collection {
                    name: collection,
                    url: crate::model::S3Collection::url_of(d),
                    auth: crate::model::S3Auth::Environment,
                });
            }
            continue;
        }
        if let Ok((access_key_id, secret_access_key)) =
            credentials(d, secret(&d.secret_name), &name, Some(&cluster.spec), &ns)
        {
            out.push(crate::model::S3Collection {
                name: collection,
                url: crate::model::S3Collection::url_of(d),
                auth: crate::model::S3Auth::Keys {
                    access_key_id,
                    secret_access_key,
                },
            });
        }
    }
    out
}

/// The access key id and secret key of `d` from `secret` (the Secret it names, if it exists),
/// for a backup or restore of cluster `name` (whose spec is `spec`, if the cluster exists).
pub fn credentials(
    d: &S3Destination,
    secret: Option<&Secret>,
    name: &str,
    spec: Option<&ClickHouseClusterSpec>,
    namespace: &str,
) -> Result<(String, String), CredentialRefusal> {
    if d.web_identity.is_some() {
        return Err(CredentialRefusal::WebIdentity);
    }
    let name = name.to_string();
    let reserved = if d.secret_name == names::operator_secret(&name) {
        Some("the operator's credentials")
    } else if d.secret_name == names::users_secret(&name) {
        Some("the servers' users")
    } else if spec.is_some_and(|spec| {
        spec.referenced_secrets()
            .iter()
            .any(|(_, s)| *s == d.secret_name)
    }) {
        Some("read by the cluster's spec")
    } else {
        None
    };
    if let Some(why) = reserved {
        return Err(CredentialRefusal::Reserved {
            secret: d.secret_name.clone(),
            cluster: name,
            why,
        });
    }
    let Some(secret) = secret else {
        return Err(CredentialRefusal::Missing {
            secret: d.secret_name.clone(),
            namespace: namespace.into(),
        });
    };
    if !opts_in(secret.metadata.labels.as_ref()) {
        return Err(CredentialRefusal::NotOptedIn {
            secret: d.secret_name.clone(),
        });
    }
    let data = secret.data.clone().unwrap_or_default();
    let key = |k: &Option<String>, default: &str| {
        let k = k.clone().unwrap_or_else(|| default.to_string());
        data.get(&k)
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
            .ok_or(CredentialRefusal::NoKey {
                secret: d.secret_name.clone(),
                key: k,
            })
    };
    Ok((
        key(&d.access_key_id_key, ACCESS_KEY_ID)?,
        key(&d.secret_access_key_key, SECRET_ACCESS_KEY)?,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use serde_json::json;

    use super::*;

    fn dest(endpoint: &str, bucket: &str, secret: &str) -> S3Destination {
        S3Destination {
            endpoint: endpoint.into(),
            bucket: bucket.into(),
            secret_name: secret.into(),
            ..S3Destination::default()
        }
    }

    fn cluster() -> ClickHouseCluster {
        let mut c: ClickHouseCluster = serde_json::from_value(json!({
            "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
            "metadata": {"name": "c1", "namespace": "ns"},
            "spec": {"users": {"secretName": "app-users"}}
        }))
        .unwrap();
        c.spec.backup.destination = Some(dest("https://s3.example.com/", "backups", "s3-creds"));
        c.spec.backup.allowed_destinations =
            vec![dest("https://dr.example.com", "dr-backups", "dr-creds")];
        c
    }

    fn s3_secret(name: &str, opted_in: bool) -> Secret {
        let labels = if opted_in {
            json!({CREDENTIALS_LABEL: "true"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "data": {"accessKeyId": "QUtJRA==", "secretAccessKey": "U0VDUkVU"},
        }))
        .unwrap()
    }

    /// Decision 35: each destination the cluster names becomes one named collection with
    /// its bucket's URL and its Secret's keys, only when that Secret opts in; the name stays
    /// the same for another prefix in the same bucket and differs for another bucket or
    /// Secret.
    #[test]
    fn the_clusters_destinations_become_named_collections_when_their_secrets_opt_in() {
        let mut c = cluster();
        // the same bucket and Secret under another prefix: no second collection
        let mut sibling = dest("https://s3.example.com", "backups", "s3-creds");
        sibling.prefix = Some("elsewhere".into());
        c.spec.backup.allowed_destinations.push(sibling);
        let secrets = [s3_secret("s3-creds", true), s3_secret("dr-creds", false)];
        let find = |n: &str| {
            secrets
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(n))
        };
        let got = collections(&c, find);
        assert_eq!(got.len(), 1, "{got:?}");
        let main = &got[0];
        assert_eq!(main.url, "https://s3.example.com/backups/");
        assert_eq!(
            main.auth,
            crate::model::S3Auth::Keys {
                access_key_id: "AKID".into(),
                secret_access_key: "SECRET".into()
            }
        );
        assert!(main.name.starts_with("chop_s3_") && main.name.len() == "chop_s3_".len() + 16);
        let dr_opted = [s3_secret("s3-creds", true), s3_secret("dr-creds", true)];
        let find = |n: &str| {
            dr_opted
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(n))
        };
        let both = collections(&c, find);
        assert_eq!(both.len(), 2);
        assert_ne!(both[0].name, both[1].name);
        assert_eq!(both[1].url, "https://dr.example.com/dr-backups/");
        // the cluster's own Secrets never: the operator's, as a destination's Secret
        c.spec.backup.destination = Some(dest("https://s3.example.com", "backups", "c1-operator"));
        c.spec.backup.allowed_destinations.clear();
        let own = [s3_secret("c1-operator", true)];
        let find = |n: &str| own.iter().find(|s| s.metadata.name.as_deref() == Some(n));
        assert!(collections(&c, find).is_empty());
    }

    /// Decision 29: a backup's own destination is used only when its cluster names it,
    /// every field the same (defaults filled in); otherwise the cluster's own.
    #[test]
    fn a_backup_uses_only_destinations_its_cluster_names() {
        let c = cluster();
        assert_eq!(choose(None, &c, "ns").unwrap().bucket, "backups");
        let same = S3Destination {
            prefix: Some("ns/c1".into()),
            region: Some("us-east-1".into()),
            access_key_id_key: Some("accessKeyId".into()),
            ..dest("https://s3.example.com", "backups", "s3-creds")
        };
        assert!(
            choose(Some(&same), &c, "ns").is_ok(),
            "defaults written out"
        );
        assert!(
            choose(
                Some(&dest("https://dr.example.com", "dr-backups", "dr-creds")),
                &c,
                "ns"
            )
            .is_ok()
        );
        for other in [
            dest("https://attacker.example", "backups", "s3-creds"),
            dest("https://s3.example.com", "other", "s3-creds"),
            dest("https://s3.example.com", "backups", "c1-operator"),
            S3Destination {
                access_key_id_key: Some("password".into()),
                ..dest("https://s3.example.com", "backups", "s3-creds")
            },
            S3Destination {
                prefix: Some("elsewhere".into()),
                ..dest("https://s3.example.com", "backups", "s3-creds")
            },
        ] {
            assert!(
                matches!(
                    choose(Some(&other), &c, "ns"),
                    Err(DestinationRefusal::NotAllowed { .. })
                ),
                "{other:?}"
            );
        }
        let mut none = cluster();
        none.spec.backup.destination = None;
        assert!(matches!(
            choose(None, &none, "ns"),
            Err(DestinationRefusal::Missing { .. })
        ));
        let mut plain = cluster();
        plain.spec.backup.destination = Some(dest("http://minio:9000", "backups", "s3-creds"));
        assert!(
            matches!(choose(None, &plain, "ns"), Err(DestinationRefusal::Invalid(m)) if m.contains("insecure"))
        );
    }

    /// A restore may read the folder of another cluster of its namespace (a cluster that is
    /// gone) in a bucket its cluster names, but no other folder and no other bucket.
    #[test]
    fn a_restore_reads_a_named_bucket_in_its_namespaces_folders() {
        let c = cluster();
        let at = |prefix: Option<&str>| S3Destination {
            prefix: prefix.map(str::to_string),
            ..dest("https://s3.example.com", "backups", "s3-creds")
        };
        for ok in [None, Some("ns/old-cluster"), Some("ns/c1/")] {
            assert!(choose_for_restore(&at(ok), &c, "ns").is_ok(), "{ok:?}");
        }
        for refused in [
            Some("other-ns/c1"),
            Some("ns/a/b"),
            Some("ns/"),
            Some("elsewhere"),
        ] {
            assert!(
                choose_for_restore(&at(refused), &c, "ns").is_err(),
                "{refused:?}"
            );
        }
        assert!(
            choose_for_restore(&dest("https://attacker", "backups", "s3-creds"), &c, "ns").is_err()
        );
    }

    fn secret(labelled: bool, keys: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        if labelled {
            s.metadata.labels = Some(BTreeMap::from([(CREDENTIALS_LABEL.into(), "true".into())]));
        }
        s.data = Some(
            keys.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s
    }

    /// Decision 29: a Secret gives S3 credentials only when it opts in, and never when it is
    /// one of the cluster's own; a missing key or Secret says which.
    #[test]
    fn only_secrets_that_opt_in_give_s3_credentials() {
        let c = cluster();
        let d = dest("https://s3.example.com", "backups", "s3-creds");
        let good = secret(true, &[("accessKeyId", "AK"), ("secretAccessKey", "SK\n")]);
        assert_eq!(
            credentials(&d, Some(&good), "c1", Some(&c.spec), "ns").unwrap(),
            ("AK".to_string(), "SK".to_string())
        );
        assert!(matches!(
            credentials(
                &d,
                Some(&secret(
                    false,
                    &[("accessKeyId", "AK"), ("secretAccessKey", "SK")]
                )),
                "c1",
                Some(&c.spec),
                "ns"
            ),
            Err(CredentialRefusal::NotOptedIn { .. })
        ));
        assert!(matches!(
            credentials(&d, None, "c1", Some(&c.spec), "ns"),
            Err(CredentialRefusal::Missing { .. })
        ));
        assert!(matches!(
            credentials(&d, Some(&secret(true, &[("accessKeyId", "AK")])), "c1", Some(&c.spec), "ns"),
            Err(CredentialRefusal::NoKey { key, .. }) if key == "secretAccessKey"
        ));
        // the cluster gone: its own Secrets by name are still refused
        let operator = dest("https://s3.example.com", "backups", "c1-operator");
        let labelled = secret(true, &[("accessKeyId", "AK"), ("secretAccessKey", "SK")]);
        assert!(matches!(
            credentials(&operator, Some(&labelled), "c1", None, "ns"),
            Err(CredentialRefusal::Reserved { .. })
        ));
        for own in ["c1-operator", "c1-users", "app-users"] {
            let d = dest("https://s3.example.com", "backups", own);
            let labelled = secret(true, &[("accessKeyId", "AK"), ("secretAccessKey", "SK")]);
            assert!(
                matches!(
                    credentials(&d, Some(&labelled), "c1", Some(&c.spec), "ns"),
                    Err(CredentialRefusal::Reserved { .. })
                ),
                "{own}"
            );
        }
    }

    /// Decision 43: a ServiceAccount's tokens are exchanged for a destination's role only when
    /// it exists and opts in with the label, as a Secret must; such a destination has no static
    /// keys; and a backup naming the cluster's bucket with another role or ServiceAccount is not
    /// the destination the cluster named.
    #[test]
    fn only_service_accounts_that_opt_in_get_a_role_and_another_role_is_another_destination() {
        use k8s_openapi::api::core::v1::ServiceAccount;
        let web = |role: &str, sa: &str| S3Destination {
            endpoint: "https://s3.example.com".into(),
            bucket: "backups".into(),
            web_identity: Some(crate::api::WebIdentity {
                role_arn: role.into(),
                service_account_name: sa.into(),
                audience: None,
                sts_endpoint: None,
            }),
            ..S3Destination::default()
        };
        let d = web("arn:aws:iam::123456789012:role/backups", "ch-backups");
        let account = |labels: serde_json::Value| -> ServiceAccount {
            serde_json::from_value(json!({"metadata": {"name": "ch-backups", "labels": labels}}))
                .unwrap()
        };
        assert!(matches!(
            web_identity(&d, None, "ns"),
            Err(CredentialRefusal::NoServiceAccount { .. })
        ));
        let refused = web_identity(&d, Some(&account(json!({}))), "ns").unwrap_err();
        assert!(refused.to_string().contains(CREDENTIALS_LABEL), "{refused}");
        let ok =
            web_identity(&d, Some(&account(json!({CREDENTIALS_LABEL: "true"}))), "ns").unwrap();
        assert_eq!(ok.audience(), "sts.amazonaws.com");
        assert_eq!(
            credentials(&d, None, "c1", None, "ns"),
            Err(CredentialRefusal::WebIdentity)
        );
        let mut c = cluster();
        c.spec.backup.destination = Some(d.clone());
        c.spec.backup.allowed_destinations.clear();
        let mut explicit = d.clone();
        if let Some(w) = explicit.web_identity.as_mut() {
            w.audience = Some("sts.amazonaws.com".into());
            w.sts_endpoint = Some("https://sts.us-east-1.amazonaws.com/".into());
        }
        assert!(
            choose(Some(&explicit), &c, "ns").is_ok(),
            "defaults written out"
        );
        for other in [
            web("arn:aws:iam::123456789012:role/admin", "ch-backups"),
            web("arn:aws:iam::123456789012:role/backups", "default"),
        ] {
            assert!(matches!(
                choose(Some(&other), &c, "ns"),
                Err(DestinationRefusal::NotAllowed { .. })
            ));
        }
    }
}
