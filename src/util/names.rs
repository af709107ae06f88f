//! Kubernetes name syntax, the names of the Secrets the operator generates for a cluster and
//! the DNS names of its servers. They live here, below `api`, `model`, `clickhouse` and
//! `runtime`, because each needs some of them: `api` refuses a spec that references a generated
//! Secret, `model` builds those Secrets and the servers' configuration, `clickhouse` verifies a
//! server's certificate by its DNS name, and `runtime` checks the namespaces it is told to
//! watch.

/// DNS-1035 label: what Service names must be.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// DNS-1123 subdomain: what Secret names must be.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A label key (`prefix/name` or `name`).
pub fn is_label_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(is_dns_subdomain) && is_label_value(name) && !name.is_empty()
}

/// A label value: at most 63 characters, alphanumeric at both ends, `-`, `_` and `.` inside.
pub fn is_label_value(s: &str) -> bool {
    s.len() <= 63
        && (s.is_empty()
            || (s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// The generated Secret with the users file (password hashes only).
pub fn users_secret(cluster: &str) -> String {
    format!("{cluster}-users")
}

/// The generated Secret with the operator's own password.
pub fn operator_secret(cluster: &str) -> String {
    format!("{cluster}-operator")
}

/// The only pod of a replica StatefulSet.
pub fn replica_pod(replica: &str) -> String {
    format!("{replica}-0")
}

/// Headless Service of all server pods; every server StatefulSet's `serviceName`.
pub fn headless_service(cluster: &str) -> String {
    format!("{cluster}-headless")
}

/// DNS name of a server replica's pod: `<sts>-0.<cluster>-headless.<ns>.svc.<domain>`.
pub fn replica_host(cluster: &str, namespace: &str, domain: &str, replica: &str) -> String {
    format!(
        "{}.{}.{namespace}.svc.{domain}",
        replica_pod(replica),
        headless_service(cluster)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_start_with_a_letter_and_have_no_upper_case() {
        for ok in ["a", "c1", "c1-0-0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok:?}");
        }
        for bad in ["", "1c", "C1", "c1-", "c_1", "c.1", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn label_keys_may_have_a_subdomain_prefix() {
        for ok in ["team", "clickhouse.com/shard", "a.b/c_d.e-f"] {
            assert!(is_label_key(ok), "{ok:?}");
        }
        for bad in ["", "/x", "Bad_Prefix/x", "x/", "a b", &"a".repeat(64)] {
            assert!(!is_label_key(bad), "{bad:?}");
        }
        assert!(is_label_value(""));
        assert!(!is_label_value("a b"));
        assert!(!is_label_value("-a"));
    }
}
