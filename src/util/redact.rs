//! Secret values kept out of text that leaves the process: statuses, Events, logs and the
//! backup agent's report. Errors are built to hold no secret in the first place (statements are
//! named by their summary, see `clickhouse::lexer`); this is the second line, for text the
//! operator does not control (a server's or an S3 server's message quoting what it was sent).

/// What a hidden secret is replaced with.
pub const HIDDEN: &str = "[hidden]";

/// The secret values one piece of work holds (its S3 keys, a password), to scrub from text.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    pub fn new() -> Redactor {
        Redactor::default()
    }

    /// Adds a secret; values under four characters are not scrubbed (they would blank ordinary
    /// words), nor are empty ones.
    pub fn with(mut self, secret: &str) -> Redactor {
        self.add(secret);
        self
    }

    pub fn add(&mut self, secret: &str) {
        let s = secret.trim();
        if s.chars().count() >= 4 && !self.secrets.iter().any(|k| k == s) {
            self.secrets.push(s.to_string());
            // longest first, so that a secret holding another is hidden whole
            self.secrets.sort_by_key(|k| std::cmp::Reverse(k.len()));
        }
    }

    /// `text` with every secret, and every secret as a URL or SQL literal would escape it,
    /// replaced by [`HIDDEN`].
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            for form in forms(s) {
                if out.contains(&form) {
                    out = out.replace(&form, HIDDEN);
                }
            }
        }
        out
    }

    /// Whether `text` holds any secret, in any of the forms [`Redactor::scrub`] hides.
    pub fn finds(&self, text: &str) -> bool {
        self.secrets
            .iter()
            .any(|s| forms(s).iter().any(|f| text.contains(f.as_str())))
    }
}

/// A secret as it may appear in text: as is, URL-encoded, and with SQL or JSON escapes.
fn forms(secret: &str) -> Vec<String> {
    let mut out = vec![secret.to_string()];
    for f in [
        urlencoding::encode(secret).into_owned(),
        secret.replace('\\', "\\\\").replace('\'', "\\'"),
        serde_json::to_string(secret)
            .map(|j| j.trim_matches('"').to_string())
            .unwrap_or_default(),
    ] {
        if !f.is_empty() && !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_hidden_as_is_and_escaped() {
        let r = Redactor::new()
            .with("s3cr/t'key")
            .with("AKIA1234")
            .with("ab");
        let text =
            "denied for AKIA1234 with 's3cr/t\\'key' (s3cr%2Ft%27key), \"s3cr/t'key\"; ab stays";
        let out = r.scrub(text);
        assert_eq!(
            out,
            "denied for [hidden] with '[hidden]' ([hidden]), \"[hidden]\"; ab stays"
        );
        assert!(r.finds(text));
        assert!(!r.finds(&out));
        assert_eq!(
            format!("{r:?}"),
            "Redactor(2 secrets)",
            "Debug names no secret"
        );
    }
}
