//! Small pure helpers.
pub mod cron;
pub mod quantity;
