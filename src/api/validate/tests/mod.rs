//! Validation of a cluster's spec: each error names its field.

use super::*;
use crate::api::cluster::*;
use std::collections::BTreeMap;

mod backup;
mod cluster;
mod configuration;
mod pods;
mod security;

/// A spec of every default.
fn spec() -> ClickHouseClusterSpec {
    crate::testing::spec(serde_json::json!({}))
}

/// `errors` name `field` with a message containing `words` (for the input `what`).
fn assert_error(errors: &[FieldError], what: &serde_json::Value, field: &str, words: &str) {
    assert!(
        errors
            .iter()
            .any(|e| e.field == field && e.message.contains(words)),
        "{what}: want {field} ({words}) in {errors:?}"
    );
}

fn fields(name: &str, s: &ClickHouseClusterSpec) -> Vec<String> {
    validate(name, s).0.into_iter().map(|e| e.field).collect()
}
