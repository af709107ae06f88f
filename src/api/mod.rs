//! The custom resources: types, defaults, normalisation, validation and the generated CRDs.

pub mod backup;
pub mod cluster;
pub mod crd;
pub mod defaults;
pub mod replica;
pub mod restore;
pub mod schema_policy;
pub mod validate;

pub use backup::*;
pub use cluster::*;
pub use replica::{ReplicaName, ShardIndex};
pub use restore::*;
pub use schema_policy::SchemaPolicy;
