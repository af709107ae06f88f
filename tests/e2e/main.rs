//! End-to-end tests against the real local Kubernetes (see `support`).

mod backup;
mod benchmarks;
mod exporter;
mod external_keeper;
mod faults;
mod features;
mod foundation;
mod isolation;
mod keeper;
mod kills;
mod lifecycle;
mod node_failures;
mod nodes;
mod placement;
mod plan;
mod real_images;
mod recovery;
mod secrets;
mod security;
mod status;
mod storage;
mod strategies;
mod support;
mod templates;
mod upgrade;
mod workload;
