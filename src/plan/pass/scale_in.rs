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
    );
    for chain in p.chains {
        for step in chain {
            pass.emit(Step::ScaleIn(step));
        }
    }
    pass.waits.extend(p.waiting);
}
