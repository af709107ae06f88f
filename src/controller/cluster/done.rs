//! What a step of the executor comes to ([`Done`]), the time a step that talks to servers may
//! hold a pass, and the helpers both the executor and its scale-in steps use: below both, so
//! that neither imports the other for them.

use std::time::Duration;

use super::Error;
use crate::plan::{EventType, PlannedEvent};

/// What one step did.
pub enum Done {
    /// Finished, with what to tell about it.
    Finished(Option<PlannedEvent>),
    /// Started or checked, not finished: why the pass waits for it.
    Waiting(String),
}

/// The longest a step that talks to servers (a schema copy, a scale-in's drops) may hold a
/// pass: each call is bounded already, but a server that stopped answering (a hung process)
/// costs every call its timeout and retries, and the steps after it (and other clusters'
/// passes) would wait for all of them (decision 31, invariant 11).
pub const SERVER_STEP_BUDGET: Duration = Duration::from_secs(20);

/// Runs `step` for at most `budget`; beyond it, the step is given up for this pass (its
/// statements are idempotent: a schema copy creates `IF NOT EXISTS`, drops are `IF EXISTS`)
/// and the pass waits for it, to try again next pass.
pub async fn bounded(
    what: &str,
    budget: Duration,
    step: impl std::future::Future<Output = Result<Done, Error>>,
) -> Result<Done, Error> {
    match tokio::time::timeout(budget, step).await {
        Ok(done) => done,
        Err(_) => Ok(Done::Waiting(format!(
            "{what} did not finish within {} s (a server is not answering); tried again next pass",
            budget.as_secs()
        ))),
    }
}

/// A finished step, told by a Normal event.
pub fn normal(reason: &'static str, action: &'static str, message: String) -> Done {
    Done::Finished(Some(PlannedEvent {
        kind: EventType::Normal,
        reason,
        action,
        message,
    }))
}
