//! The shapes of what web identity (STS `AssumeRoleWithWebIdentity`) takes from a spec: a
//! role ARN and an STS endpoint, checked when a spec is validated and again before a call;
//! and where the projected token is and what session name a call gives, shared by the pods
//! the builders make and the agent that calls STS.

/// Why a role ARN is refused, or nothing: `arn:<partition>:iam::<12 digits>:role/<path/>name`.
pub fn check_role_arn(arn: &str) -> Result<(), &'static str> {
    if arn.len() > 2048 {
        return Err("is longer than 2048 characters");
    }
    let mut parts = arn.splitn(6, ':');
    let (Some("arn"), Some(partition), Some("iam"), Some(""), Some(account), Some(resource)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err("is not a role ARN: arn:aws:iam::<account>:role/<name>");
    };
    if partition.is_empty()
        || !partition
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '-')
    {
        return Err("has an invalid partition (aws, aws-cn, aws-us-gov, …)");
    }
    if account.len() != 12 || !account.chars().all(|c| c.is_ascii_digit()) {
        return Err("has an invalid account: 12 digits");
    }
    let Some(path) = resource.strip_prefix("role/") else {
        return Err("does not name a role: …:role/<name>");
    };
    let name = path.rsplit('/').next().unwrap_or_default();
    let name_ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+=,.@_-".contains(c));
    let path_ok = path
        .split('/')
        .all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic()));
    if !name_ok || !path_ok {
        return Err("has an invalid role name (1 to 64 of letters, digits and +=,.@_-)");
    }
    Ok(())
}

/// Why an STS endpoint is refused, or nothing: an `https://` URL (`http://` only when
/// `insecure`) with a host, and no user, query or fragment.
pub fn check_endpoint(endpoint: &str, insecure: bool) -> Result<(), String> {
    let url = reqwest::Url::parse(endpoint).map_err(|e| format!("is not a URL: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if insecure => {}
        "http" => {
            return Err(
                "is plain HTTP: use https://, or set insecure: true to send the token in clear"
                    .into(),
            );
        }
        _ => return Err("must start with https:// (or http:// with insecure)".into()),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry a user or password".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not carry a query or fragment".into());
    }
    Ok(())
}

/// Where the agent finds its ServiceAccount token (the path EKS uses).
pub const TOKEN_DIR: &str = "/var/run/secrets/eks.amazonaws.com/serviceaccount";
/// The token file's name in [`TOKEN_DIR`].
pub const TOKEN_FILE: &str = "token";
/// How long a projected token lives; the kubelet renews it at 80 % of that.
pub const TOKEN_SECONDS: i64 = 3600;
/// A session name STS accepts (`[\w+=,.@-]`, 2 to 64 characters) made of `name`.
pub fn session_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=,.@_-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    while s.len() < 2 {
        s.push('-');
    }
    s
}
