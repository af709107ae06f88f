//! End-to-end tests against the real local Kubernetes (see `support`).

mod foundation;
mod support;
