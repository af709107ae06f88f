//! ClickHouse and Keeper configuration files: XML for `config.d/`, `users.d/` and Keeper.

pub mod keeper;
pub mod server;
pub mod settings;
pub mod system_logs;
pub mod users;
pub mod xml;
