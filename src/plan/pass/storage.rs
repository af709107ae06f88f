//! Storage (S2-09, S2-13): the volumes of a server replica are the claim templates of its
//! StatefulSet: the data volume, one per disk of `spec.storage.disks`, the log volume. A
//! volume grows in place when its size grows and `spec.storageScaling.enableVolumeScaling` is
//! set: the PVC is patched first. A StatefulSet's claim templates cannot change, so when they
//! do (a size, an added disk or log volume, the PVC labels or annotations) the StatefulSet is
//! deleted with its pod kept (orphan), and the Servers phase of a later pass creates it again;
//! a pod that lacks a new volume's mount is then outdated and restarted by the rollout. Existing
//! PVCs get the labels and annotations of `spec.storage` patched on. A shrink, growth without
//! volume scaling, a changed class or a removed volume is refused with the field named and
//! nothing changed for that replica. While a volume grows, no rollout starts.

use std::collections::BTreeMap;

use super::{Pass, json_of};
use crate::plan::FailureReason;
use crate::plan::facts::{Claim, PvcFacts, claims};
use crate::plan::step::Step;
use crate::util::quantity;

/// The spec field behind a claim template, under `at` (`spec.storage`, `spec.keeper.storage`).
fn field(at: &str, claim: &str) -> String {
    match claim {
        "data" => at.into(),
        "logs" => format!("{at}.logs"),
        other => match other.strip_prefix("disk-") {
            Some(disk) => format!("{at}.disks[{disk}]"),
            None => format!("{at} ({other})"),
        },
    }
}

/// One StatefulSet's volumes: what its desired claim templates ask for against what it has.
struct Volumes {
    sts: String,
    /// `spec.storage` or `spec.keeper.storage`.
    at: &'static str,
    want: BTreeMap<String, Claim>,
    have: BTreeMap<String, Claim>,
    /// Its pods' PVCs, with the claim template each comes from.
    pvcs: Vec<(String, PvcFacts)>,
    deleting: bool,
}

pub fn plan(pass: &mut Pass) {
    let mut all: Vec<Volumes> = pass
        .built
        .desired
        .server_statefulsets
        .iter()
        .filter_map(|s| {
            let sts = s.metadata.name.clone().unwrap_or_default();
            let f = pass.input.facts.server(&sts);
            f.statefulset.is_some().then(|| Volumes {
                want: claims(&json_of(s)),
                have: f.claims.clone(),
                pvcs: f.pvcs.iter().map(|(t, p)| (t.clone(), p.clone())).collect(),
                deleting: f.deleting,
                at: "spec.storage",
                sts,
            })
        })
        .collect();
    if let Some(k) = &pass.built.desired.keeper {
        let f = &pass.input.facts.keeper;
        if f.exists {
            all.push(Volumes {
                want: claims(&json_of(&k.statefulset)),
                have: f.claims.clone(),
                pvcs: f.pvcs.clone(),
                deleting: f.deleting,
                at: "spec.keeper.storage",
                sts: k.statefulset.metadata.name.clone().unwrap_or_default(),
            });
        }
    }
    for v in all {
        statefulset(pass, v);
    }
    if !pass.gates.storage_busy.is_empty() {
        let busy = pass.gates.storage_busy.join(", ");
        pass.waits.push(format!("changing the volumes of {busy}"));
    }
}

fn statefulset(pass: &mut Pass, v: Volumes) {
    let Volumes {
        sts,
        at,
        want,
        have,
        pvcs,
        deleting,
        ..
    } = v;
    let storage = if at == "spec.storage" {
        &pass.input.spec.storage.data
    } else {
        &pass.input.spec.keeper.storage
    };
    let user_labels = storage.labels.clone();
    let user_annotations = storage.annotations.clone();
    let scaling = pass.input.spec.storage_scaling.enable_volume_scaling;
    let field = |claim: &str| field(at, claim);
    if let Some((_, pvc)) = pvcs.iter().find(|(_, p)| p.resizing) {
        pass.waits
            .push(format!("PVC {} is being resized", pvc.name));
        pass.gates.storage_busy.push(sts.clone());
        return;
    }
    for (_, pvc) in pvcs.iter().filter(|(_, p)| p.file_system_resize_pending) {
        // Some drivers grow the file system only when the pod starts again: it holds
        // nothing back, and Smart Update restarts the pod for it once (decision 44).
        pass.waits.push(format!(
            "PVC {}: the file system grows when its pod next starts",
            pvc.name
        ));
    }
    let mut refusals = Vec::new();
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        refusals.push(format!(
            "{}: {sts} has this volume and it cannot be removed (its data would be lost); nothing was changed",
            field(name)
        ));
    }
    let mut recreate = false;
    let mut resizes = Vec::new();
    for (name, w) in &want {
        let Some(h) = have.get(name) else {
            recreate = true; // a volume added
            continue;
        };
        if w.class != h.class {
            refusals.push(format!(
                "{}.storageClassName: the PVCs of {sts} keep the class {}; nothing was changed",
                field(name),
                h.class.as_deref().unwrap_or("(the default)")
            ));
        }
        if w.labels != h.labels || w.annotations != h.annotations {
            recreate = true;
        }
        if w.size == h.size {
            continue;
        }
        let grows = match (
            w.size.as_deref().and_then(quantity::parse_bytes),
            h.size.as_deref().and_then(quantity::parse_bytes),
        ) {
            (Some(w), Some(h)) => w > h,
            _ => false,
        };
        let size = w.size.clone().unwrap_or_default();
        if !grows {
            refusals.push(format!(
                "{}.size: the storage of {sts} cannot shrink below {}",
                field(name),
                h.size.clone().unwrap_or_default()
            ));
        } else if !scaling {
            refusals.push(format!(
                "{}.size: the storage of {sts} grows to {size} only with spec.storageScaling.enableVolumeScaling: true; nothing was changed",
                field(name)
            ));
        } else {
            recreate = true;
            for (_, pvc) in pvcs
                .iter()
                .filter(|(t, p)| t == name && p.size.as_deref() != Some(&size))
            {
                resizes.push(Step::ResizePvc {
                    name: pvc.name.clone(),
                    size: size.clone(),
                });
            }
        }
    }
    if !refusals.is_empty() {
        for message in refusals {
            pass.fail(FailureReason::StorageChangeRefused, message);
        }
        return;
    }
    let missing = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter().any(|(k, v)| have.get(k) != Some(v))
    };
    for (_, pvc) in &pvcs {
        if missing(&user_labels, &pvc.labels) || missing(&user_annotations, &pvc.annotations) {
            pass.emit(Step::LabelPvc {
                name: pvc.name.clone(),
                labels: user_labels.clone(),
                annotations: user_annotations.clone(),
            });
        }
    }
    for a in resizes {
        pass.emit(a);
    }
    if recreate {
        if !deleting {
            pass.emit(Step::OrphanStatefulSet { name: sts.clone() });
        }
        pass.again();
        pass.gates.storage_busy.push(sts);
    }
}
