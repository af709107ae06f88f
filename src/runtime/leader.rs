//! Leader election through a `coordination.k8s.io` Lease: only the holder reconciles; a standby
//! takes over once the holder has not renewed for a lease duration. The holder renews from its
//! own last write (one request per renewal, no read before it); only a conflict makes it read
//! the lease again.

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
/// The holder stops acting once it has not renewed for this long, which is shorter than
/// [`LEASE_DURATION`]: after a partition the old leader has stopped before another replica may
/// take the lease over (a renewal request still pending at the deadline is given up).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// Whether the holder must stop acting, the last renewal that succeeded having been sent
/// `since_renewed` ago.
pub fn must_stop(since_renewed: Duration) -> bool {
    since_renewed >= RENEW_DEADLINE
}

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
    /// The lease as this replica last wrote it: a renewal replaces it without reading it first
    /// (its resourceVersion makes the write fail if anyone else wrote the lease since).
    written: std::sync::Mutex<Option<Lease>>,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            written: std::sync::Mutex::new(None),
        }
    }

    /// Renews the lease from this replica's own last write, without reading it: `Some(true)`
    /// when renewed, `None` when there is no such write or the lease changed since (read it).
    async fn renew_written(&self, now: Timestamp) -> Result<Option<bool>, kube::Error> {
        let Some(mut lease) = self.written.lock().unwrap().take() else {
            return Ok(None);
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        spec.renew_time = Some(MicroTime(now));
        lease.spec = Some(spec);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                *self.written.lock().unwrap() = Some(l);
                Ok(Some(true))
            }
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One attempt to acquire or renew. `Ok(true)` when we hold the lease afterwards.
    pub async fn try_hold(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        if let Some(renewed) = self.renew_written(now).await? {
            return Ok(renewed);
        }
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
            Ok(l) => {
                *self.written.lock().unwrap() = Some(l);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the lease, then keeps renewing it in the background. The
    /// returned receiver turns `false` if the lease is lost (taken, or not renewed for
    /// [`RENEW_DEADLINE`]); the caller must then stop acting.
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
            // when the last successful renewal was sent: the lease's renewTime, from which
            // the others count the lease duration
            let mut last_ok = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(RENEW_PERIOD).await;
                let sent = tokio::time::Instant::now();
                let left = RENEW_DEADLINE.saturating_sub(last_ok.elapsed());
                match tokio::time::timeout(left, self.try_hold()).await {
                    Ok(Ok(true)) => last_ok = sent,
                    Ok(Ok(false)) => {
                        warn!("the leader lease was taken by another replica");
                        let _ = tx.send(false);
                        return;
                    }
                    Ok(Err(e)) => warn!(error = %e, "cannot renew the leader lease"),
                    Err(_) => warn!("renewing the leader lease timed out"),
                }
                if must_stop(last_ok.elapsed()) {
                    warn!(
                        "the leader lease was not renewed for {RENEW_DEADLINE:?}: stopping before \
                         another replica may take it over"
                    );
                    let _ = tx.send(false);
                    return;
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

    /// S2-06: after a partition the old leader stops acting before its lease can be taken
    /// over: it gives up once it has not renewed for the renew deadline, which leaves a margin
    /// of at least one renew period before the lease duration runs out.
    #[test]
    fn a_leader_stops_acting_before_its_lease_can_be_taken_over() {
        assert!(!must_stop(RENEW_DEADLINE - Duration::from_millis(1)));
        assert!(must_stop(RENEW_DEADLINE));
        assert!(must_stop(LEASE_DURATION - RENEW_PERIOD));
        assert!(RENEW_DEADLINE + RENEW_PERIOD <= LEASE_DURATION);
    }
}
