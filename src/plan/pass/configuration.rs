//! Server configuration (S2-09): the common ConfigMap, the users Secret and one ConfigMap per
//! replica. ClickHouse reloads them without a restart; what needs a restart is hashed into the
//! pod templates by the model, so it reaches the pods through the rollout.

use super::{Pass, json_of};
use crate::plan::facts::Kind;

pub fn plan(pass: &mut Pass) {
    let d = pass.desired();
    let objects: Vec<(Kind, serde_json::Value)> = [
        (Kind::ConfigMap, json_of(&d.common_config)),
        (Kind::Secret, json_of(&d.users_secret)),
    ]
    .into_iter()
    .chain(
        d.replica_configs
            .iter()
            .map(|c| (Kind::ConfigMap, json_of(c))),
    )
    .collect();
    for (kind, object) in objects {
        pass.apply(kind, object);
    }
}
