//! Small pure helpers.
pub mod cron;
pub mod limits;
pub mod names;
pub mod networks;
pub mod quantity;
pub mod redact;
pub mod text;
pub mod web_identity;

use sha2::{Digest, Sha256};

/// A short hash of a JSON value (its canonical text: object keys are sorted).
pub fn json_hash(v: &serde_json::Value) -> String {
    let mut h = Sha256::new();
    h.update(v.to_string().as_bytes());
    hex::encode(&h.finalize()[..8])
}
