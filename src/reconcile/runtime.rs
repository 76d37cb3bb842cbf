//! Runtime: a template; valid when it has an image. Counts the Agents that use it.

use std::sync::Arc;

use kube::ResourceExt;

use super::common;
use super::problem::{self, Problem};
use super::{Context, Outcome};
use crate::cluster::Error;
use crate::crd::{Reason, Runtime, RuntimePhase, RuntimeStatus};

/// A usable template: an image, and the spec kept (TRUST.md §3; a stub is `Invalid`,
/// the one phase of a Runtime that says something is wrong).
pub fn validate(rt: &Runtime) -> Result<(), Problem> {
    problem::check_spec_size(&rt.metadata)?;
    match rt.spec.image.as_deref().map(str::trim) {
        None | Some("") => Err(Problem::NoImage),
        Some(_) => Ok(()),
    }
}

pub async fn reconcile(ctx: &Context, rt: Arc<Runtime>) -> Result<Outcome, Error> {
    let ns = rt.namespace().unwrap_or_default();
    let name = rt.name_any();
    let (phase, reason, message) = match validate(&rt) {
        Ok(()) => (RuntimePhase::Ready, Reason::Valid, "valid".to_owned()),
        Err(why) => (RuntimePhase::Invalid, why.reason(), why.to_string()),
    };
    let agents = ctx
        .store
        .agents_where(&ns, |a| {
            a.spec.runtime.reference.as_deref() == Some(name.as_str())
        })
        .len() as i64;
    let own = RuntimeStatus {
        agents: Some(agents),
        ..Default::default()
    };
    let status = common::status(
        &rt.metadata,
        rt.status.as_ref(),
        phase,
        reason,
        message,
        own,
    );
    ctx.kube
        .write_status(&*rt, rt.status.as_ref(), &status)
        .await?;
    Ok(Outcome::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Oversized;

    /// TRUST.md §3: a Runtime kept as a stub (its spec over the bound) is `Invalid`,
    /// `SpecTooLarge`, both sizes in the message; under the bound it is valid.
    #[test]
    fn a_spec_over_the_bound_is_invalid() {
        let store = crate::store::Store::with_max_spec_bytes(256);
        let runtime = |args: &str| -> Runtime {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "autonomic.sh/v1alpha1", "kind": "Runtime",
                "metadata": {"name": "rt", "namespace": "n"},
                "spec": {"image": "rt:1", "args": [args]},
            }))
            .unwrap()
        };
        let big = runtime(&"x".repeat(300));
        let bytes = serde_json::to_vec(&big.spec).unwrap().len() as u64;
        let why = validate(&store.runtimes.insert(big)).unwrap_err();
        assert_eq!(why, Problem::SpecTooLarge(Oversized { bytes, max: 256 }));
        assert_eq!(why.reason(), Reason::SpecTooLarge);
        assert_eq!(
            why.to_string(),
            format!(
                "spec is {bytes} bytes as JSON, over the bound of 256 (AUTONOMIC_MAX_SPEC_BYTES)"
            )
        );
        assert_eq!(validate(&store.runtimes.insert(runtime("x"))), Ok(()));
    }
}
