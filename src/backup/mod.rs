//! Backups to S3-compatible storage and restores from them (seed 000: on each shard's backup
//! replica; seed 002: schedules, Smart Update waits). See decision 26 for the design:
//!
//! - [`store`]: the bucket (`object_store`), errors that say what to fix;
//! - [`manifest`]: what a backup holds and where each part is (incremental by reference);
//! - [`checks`]: the rules a manifest read from a bucket must keep before a restore uses it;
//! - [`agent`]: the Job side, freezing and uploading, downloading and attaching;
//! - [`job`]: the Job that runs the agent next to a shard's backup replica;
//! - [`schedule`]: when a schedule's backup is due, and what its retention removes.

pub mod agent;
pub mod checks;
pub mod job;
pub mod manifest;
pub mod schedule;
pub mod store;
