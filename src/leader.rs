//! Leader election on a `coordination.k8s.io/v1` Lease, client-go's algorithm by hand.
//!
//! Every replica reads the Lease every [`RETRY_PERIOD`]. A standby takes it when it is
//! free (no holder: released) or expired: [`LEASE_DURATION`] after the local instant
//! this replica first saw its current record, so clocks need not agree. Writes replace
//! the object with the `resourceVersion` read: of two replicas racing, the second gets
//! 409 and stays standby. The leader renews every retry period and steps down as soon
//! as it sees another holder, or when it has not renewed within [`RENEW_DEADLINE`]
//! (counted from the start of its last successful write), strictly before any other
//! replica could take over: 10 s < 15 s leaves the connection 5 s to close.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

pub const LEASE_NAME: &str = "autonomic-manager";
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
// The leader must be gone (connection closed, up to 4 s) before anyone may take over.
const _: () = assert!(RENEW_DEADLINE.as_secs() + 4 < LEASE_DURATION.as_secs());
const _: () = assert!(RETRY_PERIOD.as_secs() < RENEW_DEADLINE.as_secs());

/// Why the leader stepped down.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    #[error("the Lease is held by {0:?}")]
    Taken(String),
    #[error("the Lease was changed by someone else (409 on renew)")]
    Conflict,
    #[error("the Lease was not renewed within the renew deadline ({RENEW_DEADLINE:?})")]
    Deadline,
}

/// The Lease annotation where the leader publishes its control-plane link state.
pub const LINK_ANNOTATION: &str = "autonomic.sh/link";

/// What the leader says about its link, read at each renewal.
pub type LinkState = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// One replica's view of the Lease.
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    /// Published on the Lease while leading ([`LINK_ANNOTATION`]).
    link: LinkState,
    /// The leader's link state as this standby last logged it.
    link_seen: Option<String>,
    /// The record last seen and the local instant it was first seen.
    observed: Option<(LeaseSpec, Instant)>,
    /// Start of the last successful acquire or renew, while leading.
    renewed: Option<Instant>,
}

/// Whether `me` may write itself into a Lease holding `spec`, first seen at `seen`.
fn may_take(spec: &LeaseSpec, me: &str, seen: Instant, now: Instant) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == me {
        return true;
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    now >= seen + duration
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or_default()
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Elector {
    /// `link` is what this replica publishes about its control-plane link while it
    /// leads; while it stands by, it logs what the leader publishes, so that whichever
    /// pod `kubectl logs deploy/…` picks shows the connection's state.
    pub fn new(client: kube::Client, namespace: &str, identity: String, link: LinkState) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            identity,
            link,
            link_seen: None,
            observed: None,
            renewed: None,
        }
    }

    /// Logs the leader's link state when it changed since this standby last said it.
    fn mirror(&mut self, lease: &Lease, spec: &LeaseSpec) {
        let leader = holder(spec);
        if leader.is_empty() || leader == self.identity {
            return;
        }
        let state = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LINK_ANNOTATION));
        if let Some(state) = state
            && self.link_seen.as_ref() != Some(state)
        {
            tracing::info!(leader, "standby; the leader says: {state}");
            self.link_seen = Some(state.clone());
        }
    }

    /// The Lease's metadata with this replica's link state published on it.
    fn publish(&self, meta: &mut kube::api::ObjectMeta) {
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(LINK_ANNOTATION.to_owned(), (self.link)());
    }

    fn observe(&mut self, spec: &LeaseSpec, now: Instant) {
        if self.observed.as_ref().map(|(s, _)| s) != Some(spec) {
            self.observed = Some((spec.clone(), now));
        }
    }

    fn record(&self, old: Option<&LeaseSpec>) -> LeaseSpec {
        let now = now_micro();
        let mine = old.is_some_and(|o| holder(o) == self.identity);
        let transitions = old.and_then(|o| o.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: match old {
                Some(o) if mine => o.acquire_time.clone(),
                _ => Some(now.clone()),
            },
            renew_time: Some(now),
            lease_transitions: Some(if mine || old.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }

    /// One attempt. `Ok(true)`: this replica holds the Lease now. `Ok(false)`: someone
    /// else does (or won a race: 409).
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Instant::now();
        let Some(mut lease) = self.api.get_opt(LEASE_NAME).await? else {
            let mut lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    ..Default::default()
                },
                spec: Some(self.record(None)),
            };
            self.publish(&mut lease.metadata);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(l) => {
                    self.observe(&l.spec.unwrap_or_default(), now);
                    Ok(true)
                }
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.take().unwrap_or_default();
        self.observe(&spec, now);
        let seen = self.observed.as_ref().map_or(now, |(_, at)| *at);
        if !may_take(&spec, &self.identity, seen, now) {
            self.mirror(&lease, &spec);
            return Ok(false);
        }
        lease.spec = Some(self.record(Some(&spec)));
        self.publish(&mut lease.metadata);
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                self.observe(&l.spec.unwrap_or_default(), now);
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits as a standby until this replica holds the Lease.
    pub async fn acquire(&mut self) {
        loop {
            let start = Instant::now();
            match tokio::time::timeout(RETRY_PERIOD, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    self.renewed = Some(start);
                    tracing::info!(identity = %self.identity, "leader election: acquired the Lease; leading");
                    return;
                }
                Ok(Ok(false)) => {
                    tracing::debug!(holder = %self.observed.as_ref().map(|(s, _)| holder(s)).unwrap_or_default(), "leader election: standing by")
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "leader election: cannot read or write the Lease")
                }
                Err(_) => tracing::warn!("leader election: the API server did not answer in time"),
            }
            // Poll every retry period, and try again right when the current record
            // expires rather than up to a retry period later.
            let mut next = start + RETRY_PERIOD;
            if let Some((spec, seen)) = &self.observed {
                let expiry = *seen
                    + Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
                if expiry > Instant::now() {
                    next = next.min(expiry + Duration::from_millis(10));
                }
            }
            tokio::time::sleep_until(next).await;
        }
    }

    /// Renews while leading; returns when leadership is lost. Call after [`acquire`].
    pub async fn hold(&mut self) -> Lost {
        let mut renewed = self.renewed.unwrap_or_else(Instant::now);
        let mut start = renewed;
        loop {
            tokio::time::sleep_until(start + RETRY_PERIOD).await;
            start = Instant::now();
            let left = (renewed + RENEW_DEADLINE).saturating_duration_since(start);
            if left.is_zero() {
                return Lost::Deadline;
            }
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    renewed = start;
                    self.renewed = Some(start);
                }
                Ok(Ok(false)) => {
                    return match &self.observed {
                        Some((spec, _)) if holder(spec) != self.identity => {
                            Lost::Taken(holder(spec).to_owned())
                        }
                        _ => Lost::Conflict,
                    };
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "leader election: renewing the Lease failed")
                }
                Err(_) => return Lost::Deadline,
            }
        }
    }

    /// Gives the Lease up (client-go's way: no holder, a 1 s duration), so a standby
    /// takes over on its next retry instead of after a lease duration.
    pub async fn release(&mut self) {
        let attempt = async {
            let Some(mut lease) = self.api.get_opt(LEASE_NAME).await? else {
                return Ok(false);
            };
            let spec = lease.spec.take().unwrap_or_default();
            if holder(&spec) != self.identity {
                return Ok(false);
            }
            let now = now_micro();
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: spec.lease_transitions,
                ..Default::default()
            });
            self.api
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
                .map(|_| true)
        };
        match tokio::time::timeout(Duration::from_millis(1500), attempt).await {
            Ok(Ok(true)) => tracing::info!("leader election: released the Lease"),
            Ok(Ok(false)) => tracing::info!("leader election: the Lease was not ours to release"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "leader election: releasing the Lease failed; a standby takes over when it expires")
            }
            Err(_) => tracing::warn!(
                "leader election: releasing the Lease timed out; a standby takes over when it expires"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_taken_when_free_ours_or_expired_on_the_local_clock() {
        let seen = Instant::now();
        let later = |s| seen + Duration::from_secs(s);
        // Free: never held, or released (empty holder, as client-go releases).
        assert!(may_take(&LeaseSpec::default(), "me", seen, seen));
        assert!(may_take(&spec("", 1), "me", seen, seen));
        // Ours: renewed whatever its age.
        assert!(may_take(&spec("me", 15), "me", seen, seen));
        // Someone else's: only once a full duration has passed since we first saw it.
        assert!(!may_take(&spec("other", 15), "me", seen, later(14)));
        assert!(may_take(&spec("other", 15), "me", seen, later(15)));
        // A nonsense duration counts as expired, not as forever.
        assert!(may_take(&spec("other", -5), "me", seen, seen));
    }
}
