//! Short-lived S3 credentials through web identity (decision 43): a ServiceAccount's token is
//! exchanged with STS `AssumeRoleWithWebIdentity` (a form POST; the answer is XML) for a
//! role's temporary access key, secret key and session token, with which S3 requests are signed
//! (`x-amz-security-token`). Everything STS answers is checked before it is used; no token and
//! no temporary secret is ever written to a log, an Event, a status or a report: every one this
//! process holds is remembered ([`remember`]) and hidden in error text ([`scrub`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use object_store::CredentialProvider;
use object_store::aws::AwsCredential;

use crate::util::redact::Redactor;

/// Temporary credentials are renewed when less than this is left of them.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// The largest STS answer read.
const MAX_ANSWER: usize = 64 << 10;

pub use crate::util::web_identity::{
    TOKEN_DIR, TOKEN_FILE, TOKEN_SECONDS, check_endpoint, check_role_arn, session_name,
};

/// A role's temporary credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct TemporaryCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    pub expiration: Timestamp,
}

impl std::fmt::Debug for TemporaryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TemporaryCredentials(until {})", self.expiration)
    }
}

impl TemporaryCredentials {
    pub fn aws(&self) -> AwsCredential {
        AwsCredential {
            key_id: self.access_key_id.clone(),
            secret_key: self.secret_access_key.clone(),
            token: Some(self.session_token.clone()),
        }
    }
}

/// Whether credentials that expire at `expiration` are renewed at `now`: less than
/// [`REFRESH_MARGIN`] is left of them.
pub fn refresh_due(expiration: Timestamp, now: Timestamp) -> bool {
    let margin = k8s_openapi::jiff::SignedDuration::try_from(REFRESH_MARGIN).unwrap_or_default();
    now.saturating_add(margin)
        .map(|later| later >= expiration)
        .unwrap_or(true)
}

/// What went wrong getting temporary credentials, said so that a user knows what to fix. No
/// variant holds a token or a credential.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StsError {
    #[error(
        "STS {endpoint} refused to let ServiceAccount {service_account} assume role {role} ({code}: {message}): check that the role's trust policy allows the cluster's OIDC provider, the audience and the subject system:serviceaccount:<namespace>:{service_account}"
    )]
    Refused {
        endpoint: String,
        role: String,
        service_account: String,
        code: String,
        message: String,
    },
    #[error(
        "cannot reach STS {endpoint} ({detail}): check webIdentity.stsEndpoint and the network"
    )]
    Unreachable { endpoint: String, detail: String },
    #[error("STS {endpoint} answered what is not AssumeRoleWithWebIdentity credentials: {detail}")]
    Malformed { endpoint: String, detail: String },
    #[error("no ServiceAccount token: {0}")]
    Token(String),
}

/// What STS said: the credentials, or its error code and message.
pub fn parse_answer(
    status: u16,
    body: &str,
    now: Timestamp,
) -> Result<TemporaryCredentials, Answer> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: false,
        nodes_limit: 1000,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(body, options)
        .map_err(|e| Answer::Malformed(format!("HTTP {status}, not XML: {e}")))?;
    let text = |parent: roxmltree::Node, name: &str| -> Option<String> {
        parent
            .children()
            .find(|n| n.is_element() && n.tag_name().name() == name)
            .map(|n| n.text().unwrap_or_default().trim().to_string())
    };
    let root = doc.root_element();
    if let Some(error) = root
        .descendants()
        .find(|n| n.is_element() && n.tag_name().name() == "Error")
    {
        let clean = |s: Option<String>, max: usize| -> String {
            s.unwrap_or_default()
                .chars()
                .filter(|c| !c.is_control())
                .take(max)
                .collect()
        };
        return Err(Answer::Refused {
            code: clean(text(error, "Code"), 64),
            message: clean(text(error, "Message"), 300),
        });
    }
    if !(200..300).contains(&status) {
        return Err(Answer::Malformed(format!("HTTP {status} without an error")));
    }
    if root.tag_name().name() != "AssumeRoleWithWebIdentityResponse" {
        return Err(Answer::Malformed(format!(
            "the answer is <{}>",
            root.tag_name().name().chars().take(64).collect::<String>()
        )));
    }
    let credentials = root
        .children()
        .find(|n| n.is_element() && n.tag_name().name() == "AssumeRoleWithWebIdentityResult")
        .and_then(|r| {
            r.children()
                .find(|n| n.is_element() && n.tag_name().name() == "Credentials")
        })
        .ok_or_else(|| Answer::Malformed("no Credentials".into()))?;
    let field = |name: &str, max: usize, ok: &dyn Fn(char) -> bool| -> Result<String, Answer> {
        let v = text(credentials, name).ok_or_else(|| Answer::Malformed(format!("no {name}")))?;
        if v.is_empty() || v.len() > max || !v.chars().all(ok) {
            return Err(Answer::Malformed(format!(
                "{name} is not 1 to {max} of the characters it may hold"
            )));
        }
        Ok(v)
    };
    let access_key_id = field("AccessKeyId", 128, &|c| c.is_ascii_alphanumeric())?;
    let secret_access_key = field("SecretAccessKey", 256, &|c| c.is_ascii_graphic())?;
    let session_token = field("SessionToken", 16 << 10, &|c| c.is_ascii_graphic())?;
    let expiration = field("Expiration", 64, &|c| c.is_ascii_graphic())?;
    let expiration: Timestamp = expiration
        .parse()
        .map_err(|_| Answer::Malformed("Expiration is not an RFC 3339 time".into()))?;
    if expiration <= now {
        return Err(Answer::Malformed(format!(
            "the credentials expired at {expiration}"
        )));
    }
    Ok(TemporaryCredentials {
        access_key_id,
        secret_access_key,
        session_token,
        expiration,
    })
}

/// An STS answer that holds no credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Refused { code: String, message: String },
    Malformed(String),
}

/// The secrets this process holds (tokens, temporary credentials), the most recent ones, to
/// hide in any text it lets out.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
const SEEN_KEPT: usize = 256;

/// Remembers `secret`, to hide it wherever [`scrub`] runs.
pub fn remember(secret: &str) {
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.iter().any(|s| s == secret) {
        seen.push(secret.to_string());
        if seen.len() > SEEN_KEPT {
            seen.remove(0);
        }
    }
}

/// Every token and temporary credential this process still remembers (for a leak scan).
pub fn remembered() -> Vec<String> {
    SEEN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// `text` without any token or temporary credential this process holds.
pub fn scrub(text: &str) -> String {
    let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = Redactor::new();
    for s in seen.iter() {
        r.add(s);
    }
    r.scrub(text)
}

/// One role at one STS endpoint.
#[derive(Clone)]
pub struct Sts {
    http: reqwest::Client,
    endpoint: String,
    role_arn: String,
    service_account: String,
    session_name: String,
}

impl std::fmt::Debug for Sts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sts({}, {})", self.endpoint, self.role_arn)
    }
}

impl Sts {
    /// The role `role_arn` at `endpoint` (checked, see [`check_endpoint`]), assumed as
    /// `service_account` in sessions named `session_name`.
    pub fn new(
        endpoint: &str,
        insecure: bool,
        role_arn: &str,
        service_account: &str,
        session: &str,
    ) -> Result<Sts, StsError> {
        let malformed = |detail: String| StsError::Malformed {
            endpoint: endpoint.to_string(),
            detail,
        };
        check_endpoint(endpoint, insecure).map_err(|e| malformed(format!("the endpoint {e}")))?;
        check_role_arn(role_arn).map_err(|e| malformed(format!("the role ARN {e}")))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .https_only(!insecure)
            .build()
            .map_err(|e| malformed(e.to_string()))?;
        Ok(Sts {
            http,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            role_arn: role_arn.to_string(),
            service_account: service_account.to_string(),
            session_name: session_name(session),
        })
    }

    /// The form `AssumeRoleWithWebIdentity` is sent as.
    fn form(&self, token: &str) -> String {
        [
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", self.role_arn.as_str()),
            ("RoleSessionName", self.session_name.as_str()),
            ("WebIdentityToken", token),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={}", urlencoding::encode(v)))
        .collect::<Vec<_>>()
        .join("&")
    }

    /// Exchanges `token` for the role's temporary credentials.
    pub async fn assume(&self, token: &str) -> Result<TemporaryCredentials, StsError> {
        remember(token);
        let unreachable = |detail: String| StsError::Unreachable {
            endpoint: self.endpoint.clone(),
            detail: scrub(&detail),
        };
        let mut answer = self
            .http
            .post(format!("{}/", self.endpoint))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/xml")
            .body(self.form(token))
            .send()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        let status = answer.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?
        {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(StsError::Malformed {
                    endpoint: self.endpoint.clone(),
                    detail: format!("the answer is larger than {MAX_ANSWER} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        let body = String::from_utf8_lossy(&body);
        match parse_answer(status, &body, Timestamp::now()) {
            Ok(c) => {
                remember(&c.access_key_id);
                remember(&c.secret_access_key);
                remember(&c.session_token);
                Ok(c)
            }
            Err(Answer::Refused { code, message }) => Err(StsError::Refused {
                endpoint: self.endpoint.clone(),
                role: self.role_arn.clone(),
                service_account: self.service_account.clone(),
                code: scrub(&code),
                message: scrub(&message),
            }),
            Err(Answer::Malformed(detail)) => Err(StsError::Malformed {
                endpoint: self.endpoint.clone(),
                detail: scrub(&detail),
            }),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Where the token comes from.
#[derive(Clone)]
pub enum Token {
    /// A projected token file, read again for every exchange (the kubelet renews it).
    File(PathBuf),
    /// A token requested from the API server, for one short piece of work.
    Fixed(String),
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::File(p) => write!(f, "Token::File({})", p.display()),
            Token::Fixed(_) => write!(f, "Token::Fixed(..)"),
        }
    }
}

impl Token {
    fn read(&self) -> Result<String, StsError> {
        match self {
            Token::Fixed(t) => Ok(t.clone()),
            Token::File(p) => std::fs::read_to_string(p)
                .map(|t| t.trim().to_string())
                .map_err(|e| StsError::Token(format!("{}: {e}", p.display())))
                .and_then(|t| {
                    if t.is_empty() {
                        Err(StsError::Token(format!("{} is empty", p.display())))
                    } else {
                        Ok(t)
                    }
                }),
        }
    }
}

/// The credentials of S3 requests with web identity: exchanged when first needed and again
/// when less than [`REFRESH_MARGIN`] is left of them, the token read anew each time; while an
/// exchange fails, credentials that have not expired are used on.
#[derive(Debug)]
pub struct WebIdentityCredentials {
    sts: Sts,
    token: Token,
    cached: tokio::sync::Mutex<Option<TemporaryCredentials>>,
    exchanges: std::sync::atomic::AtomicU64,
}

impl WebIdentityCredentials {
    pub fn new(sts: Sts, token: Token) -> WebIdentityCredentials {
        WebIdentityCredentials {
            sts,
            token,
            cached: tokio::sync::Mutex::new(None),
            exchanges: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many exchanges were made or tried.
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Credentials valid for a while yet.
    pub async fn current(&self) -> Result<TemporaryCredentials, StsError> {
        let mut cached = self.cached.lock().await;
        let now = Timestamp::now();
        if let Some(c) = cached.as_ref()
            && !refresh_due(c.expiration, now)
        {
            return Ok(c.clone());
        }
        let fresh = match self.token.read() {
            Ok(token) => self.sts.assume(&token).await,
            Err(e) => Err(e),
        };
        self.exchanges
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match (fresh, cached.as_ref()) {
            (Ok(c), _) => {
                *cached = Some(c.clone());
                Ok(c)
            }
            (Err(e), Some(old)) if old.expiration > now => {
                tracing::warn!(error = %e, expires = %old.expiration, "renewing the temporary S3 credentials failed; the current ones are used until they expire");
                Ok(old.clone())
            }
            (Err(e), _) => Err(e),
        }
    }
}

impl CredentialProvider for WebIdentityCredentials {
    type Credential = AwsCredential;

    fn get_credential<'a, 'b>(
        &'a self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = object_store::Result<Arc<AwsCredential>>> + Send + 'b>,
    >
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            self.current()
                .await
                .map(|c| Arc::new(c.aws()))
                .map_err(|e| object_store::Error::Generic {
                    store: "S3",
                    source: Box::new(e),
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const OK: &str = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:ns:backups</SubjectFromWebIdentityToken>
    <Credentials>
      <AccessKeyId>ASIAEXAMPLE1234567</AccessKeyId>
      <SecretAccessKey>wJalr/XUtnFEMI+K7MDENG</SecretAccessKey>
      <SessionToken>FwoGZXIvYXdzEBYaD+token=</SessionToken>
      <Expiration>2026-12-04T16:00:00Z</Expiration>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>r1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"#;

    /// Decision 43: the four fields of an `AssumeRoleWithWebIdentity` answer are read, and the
    /// credentials' Debug form shows none of them.
    #[test]
    fn sts_credentials_are_read_from_the_answer() {
        let c = parse_answer(200, OK, at("2026-12-04T15:00:00Z")).unwrap();
        assert_eq!(c.access_key_id, "ASIAEXAMPLE1234567");
        assert_eq!(c.secret_access_key, "wJalr/XUtnFEMI+K7MDENG");
        assert_eq!(c.session_token, "FwoGZXIvYXdzEBYaD+token=");
        assert_eq!(c.expiration, at("2026-12-04T16:00:00Z"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("wJalr") && !shown.contains("Fwo") && !shown.contains("ASIA"));
        let aws = c.aws();
        assert_eq!(aws.token.as_deref(), Some("FwoGZXIvYXdzEBYaD+token="));
    }

    /// Decision 43: STS is not trusted: an error answer gives its code and message (bounded,
    /// without control characters); a missing or odd field, an expired credential, a DTD, a
    /// wrong root, a success status without credentials are each refused.
    #[test]
    fn sts_answers_that_hold_no_usable_credentials_are_refused() {
        let now = at("2026-12-04T15:00:00Z");
        let refused = r#"<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>trust policy denies web identity assumption</Message></Error><RequestId>x</RequestId></ErrorResponse>"#;
        assert_eq!(
            parse_answer(403, refused, now),
            Err(Answer::Refused {
                code: "AccessDenied".into(),
                message: "trust policy denies web identity assumption".into()
            })
        );
        let long = format!(
            "<ErrorResponse><Error><Code>X</Code><Message>a\n\tb{}</Message></Error></ErrorResponse>",
            "m".repeat(5000)
        );
        match parse_answer(400, &long, now) {
            Err(Answer::Refused { message, .. }) => {
                assert_eq!(message.len(), 300);
                assert!(message.starts_with("abmmm"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let malformed = |body: &str| match parse_answer(200, body, now) {
            Err(Answer::Malformed(why)) => why,
            other => panic!("{body}: {other:?}"),
        };
        assert!(
            malformed(&OK.replace("2026-12-04T16:00:00Z", "2026-12-04T14:00:00Z"))
                .contains("expired")
        );
        assert!(malformed(&OK.replace("2026-12-04T16:00:00Z", "tomorrow")).contains("RFC 3339"));
        assert!(
            malformed(&OK.replace("<SessionToken>FwoGZXIvYXdzEBYaD+token=</SessionToken>", ""))
                .contains("no SessionToken")
        );
        assert!(
            malformed(&OK.replace("ASIAEXAMPLE1234567", "ASIA EXAMPLE")).contains("AccessKeyId")
        );
        assert!(malformed(&OK.replace("wJalr/XUtnFEMI+K7MDENG", "")).contains("SecretAccessKey"));
        assert!(
            malformed(&OK.replace("AssumeRoleWithWebIdentityResponse", "AssumeRoleResponse"))
                .contains("<AssumeRoleResponse>")
        );
        let dtd = format!("<!DOCTYPE r [<!ENTITY a \"aaaa\">]>{OK}");
        assert!(malformed(&dtd).contains("not XML"));
        assert!(malformed("{\"Credentials\": {}}").contains("not XML"));
        assert!(malformed("<AssumeRoleWithWebIdentityResponse/>").contains("no Credentials"));
        assert!(matches!(
            parse_answer(500, "<html/>", now),
            Err(Answer::Malformed(why)) if why.contains("HTTP 500")
        ));
    }

    /// Decision 43: credentials are renewed once less than five minutes are left of them, not
    /// before.
    #[test]
    fn credentials_are_renewed_five_minutes_before_they_expire() {
        let expires = at("2026-12-04T16:00:00Z");
        assert!(!refresh_due(expires, at("2026-12-04T15:00:00Z")));
        assert!(!refresh_due(expires, at("2026-12-04T15:54:59Z")));
        assert!(refresh_due(expires, at("2026-12-04T15:55:00Z")));
        assert!(refresh_due(expires, at("2026-12-04T16:30:00Z")));
    }

    /// Decision 43: a role ARN is `arn:<partition>:iam::<12 digits>:role/<path/>name`.
    #[test]
    fn role_arns_are_checked() {
        for good in [
            "arn:aws:iam::123456789012:role/clickhouse-backups",
            "arn:aws-cn:iam::123456789012:role/team/ch+backups@x.y",
        ] {
            assert_eq!(check_role_arn(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "arn:aws:iam::role/legacy",
            "arn:aws:iam::12345678901:role/short-account",
            "arn:aws:iam::123456789012:user/alice",
            "arn:aws:s3:::bucket",
            "arn:AWS:iam::123456789012:role/x",
            "arn:aws:iam::123456789012:role/",
            "arn:aws:iam::123456789012:role/a//b",
            "arn:aws:iam::123456789012:role/has space",
            "arn:aws:iam:us-east-1:123456789012:role/regional",
        ] {
            assert!(check_role_arn(bad).is_err(), "{bad}");
        }
    }

    /// Decision 43: an STS endpoint is https (http only when allowed), with a host and nothing
    /// that could carry another request's parts.
    #[test]
    fn sts_endpoints_are_https_unless_allowed() {
        assert!(check_endpoint("https://sts.eu-west-1.amazonaws.com", false).is_ok());
        assert!(check_endpoint("https://sts.example.com:8443/sts/", false).is_ok());
        assert!(check_endpoint("http://10.0.0.1:8333", true).is_ok());
        let bad = |e: &str, insecure| check_endpoint(e, insecure).unwrap_err();
        assert!(bad("http://10.0.0.1:8333", false).contains("insecure"));
        assert!(bad("ftp://sts.example.com", true).contains("https://"));
        assert!(bad("https://user:pw@sts.example.com", false).contains("user"));
        assert!(bad("https://sts.example.com/?Action=AssumeRole", false).contains("query"));
        assert!(bad("https://sts.example.com/#x", false).contains("fragment"));
        assert!(bad("sts.example.com", false).contains("not a URL"));
    }

    /// Decision 43: the request is the documented form, every value URL-encoded; the session
    /// name keeps only what STS allows.
    #[test]
    fn the_exchange_is_the_documented_form() {
        let sts = Sts::new(
            "https://sts.example.com/",
            false,
            "arn:aws:iam::123456789012:role/r",
            "backups",
            "nightly/shard 0",
        )
        .unwrap();
        assert_eq!(
            sts.form("a.b+c/d="),
            "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fr&RoleSessionName=nightly-shard-0&WebIdentityToken=a.b%2Bc%2Fd%3D"
        );
        assert_eq!(session_name("x"), "x-");
        assert_eq!(session_name(&"a".repeat(100)).len(), 64);
        assert!(format!("{:?}", Token::Fixed("secret-token".into())).contains(".."));
    }

    /// A one-request-per-connection STS on localhost: each answer's credentials expire after
    /// the next of `lifetimes`; returns its URL and the tokens it was sent.
    async fn fake_sts(lifetimes: Vec<i64>) -> (String, Arc<Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tokens = seen.clone();
        tokio::spawn(async move {
            for (n, lifetime) in lifetimes.into_iter().enumerate() {
                let (mut c, _) = listener.accept().await.unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let k = c.read(&mut buf).await.unwrap();
                    req.extend_from_slice(&buf[..k]);
                    let text = String::from_utf8_lossy(&req).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            let token = body
                                .split('&')
                                .find_map(|kv| kv.strip_prefix("WebIdentityToken="))
                                .unwrap_or_default();
                            tokens.lock().unwrap().push(token.to_string());
                            break;
                        }
                    }
                }
                let expires = Timestamp::now()
                    .saturating_add(k8s_openapi::jiff::SignedDuration::from_secs(lifetime))
                    .unwrap();
                let body = OK
                    .replace("ASIAEXAMPLE1234567", &format!("ASIAEXAMPLE{n:07}"))
                    .replace("2026-12-04T16:00:00Z", &expires.to_string());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                c.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        (url, seen)
    }

    /// Decision 43: credentials are exchanged once and used while more than five minutes are
    /// left of them; credentials that end sooner are exchanged again with the token file read
    /// anew (the kubelet renews it).
    #[tokio::test]
    async fn credentials_are_exchanged_again_near_their_end_with_the_renewed_token() {
        let dir = std::env::temp_dir().join(format!("sts-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "first-token\n").unwrap();
        // the first credentials end in 4 minutes: used once, then renewed; the second last
        let (url, tokens) = fake_sts(vec![240, 3600]).await;
        let sts = Sts::new(&url, true, "arn:aws:iam::123456789012:role/r", "sa", "s").unwrap();
        let creds = WebIdentityCredentials::new(sts, Token::File(file.clone()));
        let first = creds.get_credential().await.unwrap();
        assert_eq!(first.key_id, "ASIAEXAMPLE0000000");
        std::fs::write(&file, "second-token").unwrap();
        let second = creds.get_credential().await.unwrap();
        assert_eq!(second.key_id, "ASIAEXAMPLE0000001");
        let third = creds.get_credential().await.unwrap();
        assert_eq!(
            third.key_id, "ASIAEXAMPLE0000001",
            "an hour left: no exchange"
        );
        assert_eq!(creds.exchanges(), 2);
        assert_eq!(
            *tokens.lock().unwrap(),
            vec!["first-token".to_string(), "second-token".to_string()]
        );
        assert!(third.token.is_some(), "requests carry x-amz-security-token");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Decision 43: a token and the credentials it bought are hidden in any text this process
    /// lets out.
    #[test]
    fn remembered_secrets_are_scrubbed() {
        remember("eyJhbGciOiJSUzI1NiJ9.payload.signature");
        let text = "STS said: bad token eyJhbGciOiJSUzI1NiJ9.payload.signature";
        assert!(!scrub(text).contains("payload"));
    }
}
