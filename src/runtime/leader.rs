//! Leader election through a `coordination.k8s.io` Lease: only the holder reconciles; a standby
//! takes over once the holder has not renewed for a lease duration.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_PERIOD: Duration = Duration::from_secs(4);
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// What the holder of a lease may do, given what it holds now (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody holds it, or the holder stopped renewing: take it.
    Acquire,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it and is alive.
    Wait,
}

pub fn judge(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Verdict {
    let Some(spec) = spec else {
        return Verdict::Acquire;
    };
    match spec.holder_identity.as_deref() {
        None | Some("") => Verdict::Acquire,
        Some(h) if h == me => Verdict::Renew,
        Some(_) => {
            let duration = spec
                .lease_duration_seconds
                .map_or(LEASE_DURATION.as_secs() as i64, i64::from);
            match &spec.renew_time {
                Some(MicroTime(t)) if now < *t + SignedDuration::from_secs(duration) => {
                    Verdict::Wait
                }
                _ => Verdict::Acquire,
            }
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
        }
    }

    /// One attempt to acquire or renew. `Ok(true)` when we hold the lease afterwards.
    pub async fn try_hold(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let verdict = judge(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            now,
        );
        if verdict == Verdict::Wait {
            return Ok(false);
        }
        let mut lease = current.clone().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let mut spec = lease.spec.take().unwrap_or_default();
        if verdict == Verdict::Acquire {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions =
                Some(spec.lease_transitions.unwrap_or(0) + i32::from(current.is_some()));
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        spec.renew_time = Some(MicroTime(now));
        lease.spec = Some(spec);
        let result = if current.is_some() {
            // The resourceVersion in `lease` makes this a compare-and-swap.
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
        } else {
            self.api.create(&PostParams::default(), &lease).await
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the lease, then keeps renewing it in the background. The
    /// returned receiver turns `false` if the lease is lost (renewal failed for a lease
    /// duration); the caller must then stop acting.
    pub async fn acquire(self) -> watch::Receiver<bool> {
        info!(lease = %self.name, identity = %self.identity, "waiting for the leader lease");
        loop {
            match self.try_hold().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election: cannot read or write the lease"),
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
        info!(lease = %self.name, identity = %self.identity, "acquired the leader lease");
        let (tx, rx) = watch::channel(true);
        tokio::spawn(async move {
            let mut last_ok = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(RENEW_PERIOD).await;
                match self.try_hold().await {
                    Ok(true) => last_ok = tokio::time::Instant::now(),
                    Ok(false) => {
                        warn!("the leader lease was taken by another replica");
                        let _ = tx.send(false);
                        return;
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot renew the leader lease");
                        if last_ok.elapsed() >= LEASE_DURATION {
                            let _ = tx.send(false);
                            return;
                        }
                    }
                }
            }
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(
                Timestamp::now() - SignedDuration::from_secs(renewed_secs_ago),
            )),
            ..LeaseSpec::default()
        }
    }

    /// S2-06: one active replica; another takes over only after the holder stops renewing.
    #[test]
    fn lease_is_taken_over_only_after_the_holder_stops_renewing() {
        let now = Timestamp::now();
        assert_eq!(judge(None, "a", now), Verdict::Acquire);
        assert_eq!(judge(Some(&spec(None, 0)), "a", now), Verdict::Acquire);
        assert_eq!(judge(Some(&spec(Some("a"), 1)), "a", now), Verdict::Renew);
        assert_eq!(judge(Some(&spec(Some("b"), 1)), "a", now), Verdict::Wait);
        assert_eq!(judge(Some(&spec(Some("b"), 14)), "a", now), Verdict::Wait);
        assert_eq!(
            judge(Some(&spec(Some("b"), 16)), "a", now),
            Verdict::Acquire
        );
        let mut no_renew = spec(Some("b"), 0);
        no_renew.renew_time = None;
        assert_eq!(judge(Some(&no_renew), "a", now), Verdict::Acquire);
    }
}
