//! Process-level machinery: settings, backoff, leader election, metrics, health and logging.

pub mod backoff;
pub mod leader;
pub mod metrics;
pub mod settings;

use settings::LogFormat;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Installs the global logger (JSON by default).
pub fn init_logging(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Json => registry
            .with(fmt::layer().json().flatten_event(true))
            .try_init(),
        LogFormat::Text => registry.with(fmt::layer()).try_init(),
    };
}
