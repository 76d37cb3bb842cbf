//! TRUST.md §2 in the plan: a tenant's objects use only the ServiceAccounts and Secrets
//! the admin offered to agents (label `autonomic.sh/agents: allowed`, watched into the
//! store by name), never the manager's own ServiceAccount. A Secret that is missing and
//! one that is not offered give the same answer. A namespace labelled
//! `autonomic.sh/references: any` lifts the offer rule there, never the rule on the
//! manager's own ServiceAccount.

use k8s_openapi::api::core::v1::EnvVar;

use super::Context;
use super::problem::Problem;

/// The ServiceAccount an Agent's pod runs as: `name`, or the namespace's `default` when
/// it names none (not offered, but not the tenant's choice either), never the manager's.
pub fn service_account(ctx: &Context, ns: &str, name: Option<&str>) -> Result<(), Problem> {
    let effective = name.unwrap_or("default");
    if ctx.config.own_service_account.as_deref() == Some(&format!("{ns}/{effective}")) {
        return Err(Problem::ManagersServiceAccount(effective.to_owned()));
    }
    match name {
        Some(name)
            if ctx.store.offered_service_accounts.get(ns, name).is_none()
                && !ctx.references_any(ns) =>
        {
            Err(Problem::ServiceAccountNotAllowed(name.to_owned()))
        }
        _ => Ok(()),
    }
}

/// A Secret the object reads (an env `secretKeyRef`, a Memory's `secretRef`).
pub fn secret(ctx: &Context, ns: &str, name: &str) -> Result<(), Problem> {
    if ctx.store.offered_secrets.get(ns, name).is_some() || ctx.references_any(ns) {
        Ok(())
    } else {
        Err(Problem::SecretNotAllowed(name.to_owned()))
    }
}

/// Every Secret an env list reads.
pub fn env(ctx: &Context, ns: &str, env: Option<&[EnvVar]>) -> Result<(), Problem> {
    let refs = env.into_iter().flatten().filter_map(|e| {
        let r = e.value_from.as_ref()?.secret_key_ref.as_ref()?;
        Some(r.name.as_str())
    });
    for name in refs {
        secret(ctx, ns, name)?;
    }
    Ok(())
}
