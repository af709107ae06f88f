//! Users and passwords (S2-09): every referenced Secret must exist, and the operator's own
//! credentials Secret is created before anything that uses its password.

use super::Pass;
use crate::plan::FailureReason;
use crate::plan::action::Action;

pub fn plan(pass: &mut Pass) {
    if let Some((field, secret)) = pass.obs.missing_secrets.first() {
        let message = format!(
            "Secret {secret} (named by {field}) does not exist in namespace {}",
            pass.namespace
        );
        pass.fail_and_halt(FailureReason::MissingSecret, message);
        return;
    }
    if !pass.obs.operator_secret_present {
        pass.emit(Action::CreateOperatorSecret);
        pass.again();
        pass.gates.halted = true;
    }
}
