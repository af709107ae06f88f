//! Backups to S3-compatible storage and restores from them (S0-04: on each shard's backup
//! replica; S2-40 and S2-27: schedules, Smart Update waits). See decision 26 for the design:
//!
//! The Job side: what runs in an agent's pod. The decisions are in `plan::backup`, the Job and
//! the manifests' format in `model::job` and `model::manifest`.
//!
//! - [`store`]: the bucket (`object_store`), errors that say what to fix;
//! - [`checks`]: the rules a manifest read from a bucket must keep before a restore uses it;
//! - [`removal`]: what deleting a backup removes from its bucket, read as a stream;
//! - [`agent`]: freezing and uploading, checking, downloading and attaching;
//! - [`sts`]: short-lived credentials through web identity (decision 43).

pub mod agent;
pub mod checks;
pub mod removal;
pub mod store;
pub mod sts;
