//! Services (S2-09): the headless Service of the servers, the client Service unless switched
//! off, and Keeper's client Service.

use super::{Pass, json_of};
use crate::plan::facts::Kind;

pub fn plan(pass: &mut Pass) {
    let d = pass.desired();
    let services: Vec<serde_json::Value> = std::iter::once(json_of(&d.headless_service))
        .chain(d.client_service.iter().map(json_of))
        .chain(d.keeper.iter().map(|k| json_of(&k.client_service)))
        .collect();
    for s in services {
        pass.apply(Kind::Service, s);
    }
}
