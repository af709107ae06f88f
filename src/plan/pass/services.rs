//! Services (S2-09): the headless Service of the servers, the client Service unless switched
//! off, and Keeper's client Service. A server through which a query does not reach every shard
//! is made to resolve the cluster's host names again: a pod that came back with a new address
//! stays unreachable from servers that cache DNS for good (decision 17).

use super::{Pass, json_of};
use crate::plan::action::Action;
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
    let unreachable: Vec<String> = pass
        .obs
        .distributed
        .iter()
        .filter(|(_, e)| e.is_some())
        .map(|(r, _)| r.clone())
        .collect();
    for replica in unreachable {
        pass.emit(Action::DropDnsCache { replica });
    }
}
