//! Backups: schedules, S3 destinations (static keys, web identity, plain HTTP) and the
//! agent's environment.

use super::*;

#[test]
fn backup_schedules_are_checked() {
    let mut s = spec();
    s.backup.destination = Some(crate::api::S3Destination {
        endpoint: "http://s3:8333".into(),
        bucket: "backups".into(),
        secret_name: "s3".into(),
        insecure: true,
        ..Default::default()
    });
    let sched = |name: &str, cron: &str, keep| BackupSchedule {
        name: name.into(),
        schedule: cron.into(),
        keep,
        incremental: true,
    };
    s.backup.schedules = vec![sched("daily", "0 3 * * *", 7)];
    assert!(fields("c1", &s).is_empty());
    s.backup.schedules = vec![sched("daily", "0 3 * *", 7), sched("daily", "0 3 * * *", 0)];
    let f = fields("c1", &s);
    assert!(f.contains(&"spec.backup.schedules[0].schedule".to_string()));
    assert!(f.contains(&"spec.backup.schedules[1].name".to_string()));
    assert!(f.contains(&"spec.backup.schedules[1].keep".to_string()));
    s.backup.schedules = vec![sched("daily", "0 3 * * *", 7)];
    s.backup.destination = None;
    assert_eq!(
        fields("c1", &s),
        vec!["spec.backup.destination".to_string()]
    );
}

/// A destination must be usable: an http(s) endpoint, an S3 bucket name, a Secret name, a
/// relative prefix; each problem names its field.
#[test]
fn s3_destinations_are_checked_field_by_field() {
    let mut s = spec();
    s.backup.destination = Some(crate::api::S3Destination {
        endpoint: "s3.example.com".into(),
        bucket: "Backups_1".into(),
        prefix: Some("/abs/../x".into()),
        secret_name: "Bad_Secret".into(),
        ..Default::default()
    });
    assert_eq!(
        fields("c1", &s),
        [
            "spec.backup.destination.endpoint",
            "spec.backup.destination.bucket",
            "spec.backup.destination.secretName",
            "spec.backup.destination.prefix",
        ]
    );
}

/// Decision 43: a destination has static keys or web identity, never both and never
/// neither; its role ARN, ServiceAccount, audience and STS endpoint are each checked, and an
/// http STS endpoint needs `insecure` as the endpoint does.
#[test]
fn web_identity_destinations_are_checked_and_exclude_static_keys() {
    let mut s = spec();
    let web = |role: &str, sa: &str, sts: Option<&str>| crate::api::WebIdentity {
        role_arn: role.into(),
        service_account_name: sa.into(),
        audience: None,
        sts_endpoint: sts.map(str::to_string),
    };
    let d = |secret: &str, w: Option<crate::api::WebIdentity>| crate::api::S3Destination {
        endpoint: "https://s3.example.com".into(),
        bucket: "backups".into(),
        secret_name: secret.into(),
        web_identity: w,
        ..Default::default()
    };
    let good = web("arn:aws:iam::123456789012:role/backups", "ch-backups", None);
    s.backup.destination = Some(d("", Some(good.clone())));
    assert!(fields("c1", &s).is_empty(), "{:?}", fields("c1", &s));
    s.backup.destination = Some(d("", None));
    assert_eq!(fields("c1", &s), ["spec.backup.destination.secretName"]);
    let mut both = d("s3", Some(good.clone()));
    both.access_key_id_key = Some("id".into());
    s.backup.destination = Some(both);
    assert_eq!(
        fields("c1", &s),
        [
            "spec.backup.destination.secretName",
            "spec.backup.destination.accessKeyIdKey"
        ]
    );
    let mut bad = web(
        "arn:aws:iam::role/x",
        "Bad_SA",
        Some("http://sts.local:8333"),
    );
    bad.audience = Some("two words".into());
    s.backup.destination = Some(d("", Some(bad)));
    let (errors, _) = validate("c1", &s);
    let named: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        named,
        [
            "spec.backup.destination.webIdentity.roleArn",
            "spec.backup.destination.webIdentity.serviceAccountName",
            "spec.backup.destination.webIdentity.audience",
            "spec.backup.destination.webIdentity.stsEndpoint",
        ]
    );
    assert!(
        errors[3].message.contains("insecure"),
        "{}",
        errors[3].message
    );
    let mut insecure = d(
        "",
        Some(web(
            "arn:aws:iam::123456789012:role/b",
            "sa",
            Some("http://sts.local:8333"),
        )),
    );
    insecure.insecure = true;
    s.backup.destination = Some(insecure);
    assert!(fields("c1", &s).is_empty());
}

/// Decision 26: the agent's pods take extra environment variables, never one the agent is
/// configured with.
#[test]
fn agent_environment_cannot_override_the_agents_own() {
    let mut s = spec();
    let var = |n: &str| k8s_openapi::api::core::v1::EnvVar {
        name: n.into(),
        value: Some("x".into()),
        ..Default::default()
    };
    s.backup.agent.env = vec![
        var("HTTPS_PROXY"),
        var("NO_PROXY"),
        var("S3_ENDPOINT"),
        var("CH_HOSTS"),
        var("SHARD"),
        var("AWS_ROLE_ARN"),
        var("AWS_CA_BUNDLE"),
    ];
    assert_eq!(
        fields("c1", &s),
        [
            "spec.backup.agent.env[2].name",
            "spec.backup.agent.env[3].name",
            "spec.backup.agent.env[4].name",
            "spec.backup.agent.env[5].name"
        ]
    );
}

/// Decision 29: a plain-HTTP endpoint only with `insecure`, for the cluster's destination
/// and every destination it allows.
#[test]
fn plain_http_destinations_need_insecure() {
    let mut s = spec();
    let d = |endpoint: &str, insecure| crate::api::S3Destination {
        endpoint: endpoint.into(),
        bucket: "backups".into(),
        secret_name: "s3".into(),
        insecure,
        ..Default::default()
    };
    s.backup.destination = Some(d("http://minio:9000", false));
    s.backup.allowed_destinations = vec![d("https://s3.example.com", false), d("http://x", false)];
    let (errors, _) = validate("c1", &s);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.backup.destination.endpoint",
            "spec.backup.allowedDestinations[1].endpoint"
        ]
    );
    assert!(
        errors[0].message.contains("insecure: true"),
        "{}",
        errors[0].message
    );
    s.backup.destination = Some(d("http://minio:9000", true));
    s.backup.allowed_destinations = vec![d("https://s3.example.com", false)];
    assert!(validate("c1", &s).0.is_empty());
}
