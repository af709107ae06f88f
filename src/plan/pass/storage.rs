//! Storage (S2-09, S2-13): a data volume grows in place when `spec.storage.size` grows and
//! `spec.storageScaling.enableVolumeScaling` is set. The PVC is patched first; then the
//! StatefulSet, whose claim template cannot change, is deleted with its pod kept (orphan), and
//! the Servers phase of a later pass creates it again with the new size. A shrink, or growth
//! without volume scaling, is refused with the field named and nothing changed. While a volume
//! grows, no rollout starts.

use super::{Pass, json_of};
use crate::plan::FailureReason;
use crate::plan::action::Action;
use crate::plan::facts::claim_size;
use crate::util::quantity;

pub fn plan(pass: &mut Pass) {
    let wanted: Vec<(String, Option<String>)> = pass
        .desired()
        .server_statefulsets
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                claim_size(&json_of(s)),
            )
        })
        .collect();
    for (sts, want) in wanted {
        let f = pass.facts.server(&sts).clone();
        if f.statefulset.is_none() {
            continue;
        }
        if let Some(pvc) = &f.pvc {
            if pvc.resizing {
                pass.waits
                    .push(format!("PVC {} is being resized", pvc.name));
                pass.gates.storage_busy.push(sts.clone());
                continue;
            }
            if pvc.file_system_resize_pending {
                // Some drivers grow the file system only when the pod starts again: that is
                // left to the next restart, and it holds nothing back.
                pass.waits.push(format!(
                    "PVC {}: the file system grows when its pod next starts",
                    pvc.name
                ));
            }
        }
        let have = f.claim_size.clone();
        if want == have {
            continue;
        }
        let grows = match (
            want.as_deref().and_then(quantity::parse_bytes),
            have.as_deref().and_then(quantity::parse_bytes),
        ) {
            (Some(w), Some(h)) => w > h,
            _ => false,
        };
        let want = want.unwrap_or_default();
        if !grows {
            let message = format!(
                "spec.storage.size: the storage of {sts} cannot shrink below {}",
                have.unwrap_or_default()
            );
            pass.fail(FailureReason::StorageChangeRefused, message);
            continue;
        }
        if !pass.spec.storage_scaling.enable_volume_scaling {
            let message = format!(
                "spec.storage.size: the storage of {sts} grows to {want} only with spec.storageScaling.enableVolumeScaling: true; nothing was changed"
            );
            pass.fail(FailureReason::StorageChangeRefused, message);
            continue;
        }
        if let Some(pvc) = f.pvc.as_ref().filter(|p| p.size.as_deref() != Some(&want)) {
            pass.emit(Action::ResizePvc {
                name: pvc.name.clone(),
                size: want.clone(),
            });
        }
        if !f.deleting {
            pass.emit(Action::OrphanStatefulSet { name: sts.clone() });
        }
        pass.again();
        pass.gates.storage_busy.push(sts);
    }
    if !pass.gates.storage_busy.is_empty() {
        let busy = pass.gates.storage_busy.join(", ");
        pass.waits.push(format!("resizing storage of {busy}"));
    }
}
