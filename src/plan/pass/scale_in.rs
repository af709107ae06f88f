//! Removal of condemned replicas, step by step ([`crate::plan::scale_in`]). Never while
//! paused, and never in a pass that changes the map's entries (they are persisted first).

use super::Pass;
use crate::plan::scale_in::plan_scale_in;
use crate::plan::step::Step;

pub fn plan(pass: &mut Pass) {
    if pass.gates.map_first || pass.input.facts.mode.paused() {
        return;
    }
    let p = plan_scale_in(
        &pass.map,
        |n| pass.input.facts.server(n).pod.ready,
        |n| pass.input.facts.server(n).statefulset.is_some(),
        // never started on a node, and no volume of it ever bound: it holds no data
        |n| {
            let f = pass.input.facts.server(n);
            f.pod.started.is_none() && !f.pvcs.is_empty() && f.pvcs.values().all(|v| !v.bound)
        },
        |n| {
            let pod = &pass.input.facts.server(n).pod;
            !pod.exists || pod.node_lost.is_some()
        },
        |n, just_left| {
            let pod = crate::model::names::replica_pod(n);
            match &pass.input.obs.client_routes {
                // no client Service (or nothing of it to wait for)
                None => None,
                Some(Err(e)) => Some(format!("its EndpointSlices cannot be read ({e})")),
                Some(Ok(_)) if just_left => Some(format!("{pod} leaves it in this pass")),
                Some(Ok(pods)) => pods
                    .contains(&pod)
                    .then(|| format!("its EndpointSlices still list {pod}")),
            }
        },
    );
    for chain in p.chains {
        for step in chain {
            pass.emit(Step::ScaleIn(step));
        }
    }
    pass.waits.extend(p.waiting);
    pass.recheck |= p.recheck_soon;
}
