//! Small pure helpers.
pub mod cron;
pub mod names;
pub mod networks;
pub mod quantity;
pub mod redact;
pub mod text;
pub mod web_identity;
