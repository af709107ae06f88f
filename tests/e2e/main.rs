//! End-to-end tests against the real local Kubernetes (see `support`).

mod engine;
mod foundation;
mod support;
