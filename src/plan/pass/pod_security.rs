//! `spec.podSecurity.ids: Platform` where the platform assigns no ids (decision 65). The
//! ClickHouse server and Keeper images declare no `USER` (they start as root and their
//! entrypoints change to the `clickhouse` user), so with `runAsNonRoot` and no `runAsUser` a
//! kubelet refuses every pod ("container has runAsNonRoot and image will run as root"). Only an
//! admission that gives each pod a uid (OpenShift's `restricted-v2`) makes Platform work; on
//! other clusters the pods cannot start until the spec changes. The operator cannot tell the
//! platform's admission from the spec, so it reads the kubelet's refusal from the pods and
//! turns it into a status error that says what to do; the pods are left as they are (they run
//! nothing) and the next pass after a change of the spec heals them.

use super::Pass;
use crate::api::PodIds;
use crate::plan::FailureReason;

/// The kubelet's refusals of `runAsNonRoot` for an image user it cannot verify as non-root.
const REFUSALS: [&str; 2] = [
    "container has runAsNonRoot and image will run as root",
    "container has runAsNonRoot and image has non-numeric user",
];

/// The status error for pods that a kubelet refuses under `ids: Platform`, from the pods'
/// failures (`pod <name>: <reason>: <message>`), or `None`.
pub fn refusal(ids: PodIds, failing: &[String]) -> Option<String> {
    if ids != PodIds::Platform {
        return None;
    }
    let refused: Vec<&str> = failing
        .iter()
        .filter(|f| REFUSALS.iter().any(|r| f.contains(r)))
        .map(|f| f.split(": ").next().unwrap_or(f).trim_start_matches("pod "))
        .collect();
    let first = failing
        .iter()
        .find(|f| REFUSALS.iter().any(|r| f.contains(r)))?;
    Some(format!(
        "spec.podSecurity.ids: Platform, but the platform assigned no uid to {} and the \
         ClickHouse images start as root, so the kubelet refuses them ({first}). Platform needs an \
         admission that gives each pod a uid, as OpenShift's restricted-v2 does; on other \
         clusters set spec.podSecurity.ids: Fixed, or runAsUser, runAsGroup and fsGroup in \
         spec.pod.template and spec.keeper.pod.template",
        refused.join(", ")
    ))
}

/// Fails the pass (without halting it) when a kubelet refuses the cluster's pods as above.
pub fn plan(pass: &mut Pass) {
    let facts = &pass.input.facts;
    let failing: Vec<String> = facts
        .servers
        .values()
        .filter_map(|f| f.pod.failing.clone())
        .chain(
            facts
                .keeper
                .members
                .values()
                .filter_map(|m| m.failing.clone()),
        )
        .collect();
    if let Some(why) = refusal(pass.input.spec.pod_security.ids, &failing) {
        pass.fail(FailureReason::InvalidSpec, why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 52 item 1, decision 65: the kubelet's refusal of a pod under `ids: Platform`
    /// becomes a status error naming the pods and the two ways out; other failures, and the
    /// same message under `Fixed` (where the operator fixes uid 101), do not.
    #[test]
    fn platform_ids_refused_by_the_kubelet_are_an_error_that_says_what_to_do() {
        let failing = vec![
            "pod c1-keeper-0: CreateContainerConfigError: container has runAsNonRoot and image \
             will run as root (pod: \"c1-keeper-0_ns(u)\", container: keeper)"
                .to_string(),
            "pod c1-0-0-0: CrashLoopBackOff: container clickhouse exited with code 70".into(),
            "pod c1-0-1-0: CreateContainerConfigError: container has runAsNonRoot and image \
             will run as root (pod: \"c1-0-1-0_ns(u)\", container: clickhouse)"
                .into(),
        ];
        let why = refusal(PodIds::Platform, &failing).unwrap();
        assert!(
            why.starts_with(
                "spec.podSecurity.ids: Platform, but the platform assigned no uid to c1-keeper-0, c1-0-1-0 "
            ),
            "{why}"
        );
        assert!(why.contains("set spec.podSecurity.ids: Fixed, or runAsUser, runAsGroup and fsGroup in spec.pod.template and spec.keeper.pod.template"), "{why}");
        assert!(
            why.contains(
                "(pod c1-keeper-0: CreateContainerConfigError: container has runAsNonRoot"
            ),
            "{why}"
        );
        assert_eq!(refusal(PodIds::Fixed, &failing), None);
        assert_eq!(refusal(PodIds::Platform, &failing[1..2]), None);
    }
}
