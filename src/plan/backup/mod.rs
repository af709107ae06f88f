//! PURE: the decisions of backups and restores.
//!
//! - [`destination`]: which bucket and which credentials a backup or restore may use.

pub mod destination;
