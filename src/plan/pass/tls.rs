//! Turning TLS on or off (S2-23) is a full stop and start: every running server StatefulSet
//! goes to 0 with the template it has; once none runs, the Rollout phase writes them all at
//! once on the new template.

use super::{Pass, json_of, with_claims_of, with_template_of};
use crate::plan::facts::Mode;

pub fn plan(pass: &mut Pass) {
    if pass.input.facts.mode != Mode::SwitchingTls {
        return;
    }
    let stops: Vec<serde_json::Value> = pass
        .built
        .desired
        .server_statefulsets
        .iter()
        .filter_map(|d| {
            let n = d.metadata.name.as_deref()?;
            let f = pass.input.facts.server(n);
            let observed = f.statefulset.as_ref().filter(|_| f.scale != Some(0))?;
            let mut stop = d.clone();
            stop.spec.replicas = Some(0);
            // the pod and claim templates it has: stopping restarts nothing of its own accord,
            // and claim templates cannot change
            Some(with_claims_of(
                with_template_of(&json_of(&stop), observed),
                observed,
            ))
        })
        .collect();
    for stop in stops {
        pass.apply(crate::plan::facts::Kind::StatefulSet, stop);
    }
    pass.waits.push(format!(
        "turning TLS {}: stopping every server before starting them again",
        if pass.input.spec.tls.enabled {
            "on"
        } else {
            "off"
        }
    ));
}
