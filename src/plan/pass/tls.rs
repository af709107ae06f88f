//! Turning TLS on or off (S2-23) is a full stop and start: every running server StatefulSet
//! goes to 0 with the template it has; once none runs, the Rollout phase writes them all at
//! once on the new template.

use serde_json::json;

use super::{Pass, json_of, with_template_of};
use crate::plan::facts::Mode;

pub fn plan(pass: &mut Pass) {
    if pass.facts.mode != Mode::SwitchingTls {
        return;
    }
    let stops: Vec<serde_json::Value> = pass
        .desired()
        .server_statefulsets
        .iter()
        .filter_map(|d| {
            let n = d.metadata.name.as_deref()?;
            let f = pass.facts.server(n);
            let observed = f.statefulset.as_ref().filter(|_| f.scale != Some(0))?;
            let mut stop = with_template_of(&json_of(d), observed);
            stop["spec"]["volumeClaimTemplates"] = observed["spec"]["volumeClaimTemplates"].clone();
            stop["spec"]["replicas"] = json!(0);
            Some(stop)
        })
        .collect();
    for stop in stops {
        pass.apply(crate::plan::facts::Kind::StatefulSet, stop);
    }
    pass.waits.push(format!(
        "turning TLS {}: stopping every server before starting them again",
        if pass.spec.tls.enabled { "on" } else { "off" }
    ));
}
