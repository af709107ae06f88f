//! Users and passwords (S2-09): every referenced Secret must exist, and the operator's own
//! credentials Secret is created before anything that uses its password. ClickHouse's Keeper
//! identity never changes once the servers have it (decision 27).

use super::Early;
use crate::model::config::server::keeper_identity_text;
use crate::model::names;
use crate::plan::FailureReason;
use crate::plan::step::Step;

pub fn plan(pass: &mut Early) {
    if let Some((field, secret)) = pass.input.obs.missing_secrets.first() {
        let message = format!(
            "Secret {secret} (named by {field}) does not exist in namespace {}",
            pass.input.namespace
        );
        pass.fail_and_halt(FailureReason::MissingSecret, message);
        return;
    }
    // a key a Secret does not have would keep the pods from starting (secretSettings,
    // secretFiles): said here, before anything is written
    let missing_key = pass
        .input
        .cluster
        .spec
        .configuration
        .secret_keys()
        .find(|(_, k)| {
            pass.input
                .obs
                .inputs
                .secrets
                .get(&k.name)
                .is_some_and(|d| !d.contains_key(&k.key))
        })
        .map(|(field, k)| (field, k.clone()));
    if let Some((field, k)) = missing_key {
        let message = format!("Secret {} (named by {field}) has no key {}", k.name, k.key);
        pass.fail_and_halt(FailureReason::MissingSecret, message);
        return;
    }
    if let Some(in_use) = &pass.input.obs.keeper_identity_in_use {
        let wanted = pass
            .input
            .obs
            .inputs
            .keeper_password
            .as_ref()
            .map(keeper_identity_text);
        if wanted.as_deref() != Some(in_use.as_str()) {
            let message = format!(
                "{} in Secret {} was changed or removed: the servers created their Keeper nodes \
                 with an ACL for the previous identity and would lose access to them; put the \
                 previous value back (the servers' Secret {} still has it, in {})",
                names::KEEPER_PASSWORD_KEY,
                names::operator_secret(&pass.input.name),
                names::users_secret(&pass.input.name),
                names::KEEPER_IDENTITY_FILE,
            );
            pass.fail_and_halt(FailureReason::CredentialChangeRefused, message);
            return;
        }
    }
    if !pass.input.obs.operator_secret_present {
        pass.emit(Step::CreateOperatorSecret);
        pass.again();
        pass.gates.halted = true;
    } else if pass.input.obs.operator_secret_orphaned {
        // the credentials the retained volumes were written with: the Keeper identity their
        // replicated tables' nodes were created for above all (decision 30)
        pass.emit(Step::AdoptOperatorSecret);
        pass.again();
    } else if pass.input.obs.inputs.exporter_password.is_none() {
        // the exporter's read-only account (decision 36): the users file, which the servers
        // reload, gets it at the next pass; no pod restarts for it
        pass.emit(Step::AddExporterPassword);
        pass.again();
    } else if pass.input.obs.exporter_credentials_published == Some(false) {
        pass.emit(Step::PublishExporterCredentials);
    }
}
