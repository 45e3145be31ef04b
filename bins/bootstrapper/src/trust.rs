//! Which join services a node trusts.
//!
//! A joining node hands its state disk to whatever key a join service sends and marks PCR
//! 15 with the cluster the ticket names, so it must know that the join service belongs to
//! the cluster it means to join. The join service runs on an initialised control-plane
//! node, whose PCR 15 holds `SHA-256(0³² ‖ SHA-256(clusterID))`; requiring that value in
//! the join service's quote (mutual aTLS) binds the join service to one cluster. The node
//! learns the expected cluster ID from its configuration (`--cluster-id`), never from the
//! metadata or the join service.
//!
//! The marker says what the join service runs and which cluster it is in, not who it is:
//! every joined worker carries the same marker. So a ticket must also be signed by the
//! control plane's identity ([`ControlPlaneIdentity`], a key derived from the master
//! secret, which no worker holds), over this connection's channel binding.
//!
//! Three modes, made only by their constructors:
//!
//! * [`JoinServiceTrust::cluster`] (the secure mode): the join service's evidence must
//!   satisfy the AK trust policy and the measurements, with PCR 15 enforced as the marker
//!   of the expected cluster whatever the measurements say about it; a ticket or rejoin
//!   ticket must be signed by the control plane's key and derive that same cluster ID.
//! * [`JoinServiceTrust::init_only`]: no cluster is configured. The node does not join or
//!   rejoin; it waits to be initialised (the first node of a cluster).
//! * [`JoinServiceTrust::insecure_skip_verification`]: any join service is trusted. Every
//!   join and rejoin attempt logs a warning.

use std::sync::{Arc, Mutex, PoisonError};

use asterism_atls::Validator;
use asterism_attestation::{
    AkTrust, ExpectedPcr, Measurements, MeasurementsError, MeasurementsProvider, PcrIndex,
    TpmQuoteValidator,
};
use asterism_kms::{ChannelBinding, ClusterId, ControlPlaneKey, IdentityError, Purpose};
use tracing::warn;

/// How a node recognises the control plane in the tickets it receives.
#[derive(Clone, Debug)]
pub struct ControlPlaneIdentity(Option<ControlPlaneKey>);

impl ControlPlaneIdentity {
    /// Tickets must be signed by `key` (`--control-plane-key`, from the owner's workspace).
    #[must_use]
    pub fn key(key: ControlPlaneKey) -> Self {
        Self(Some(key))
    }

    /// **Insecure**: tickets are not checked for the control plane's signature, so any
    /// joined worker (genuine TPM, measurements and cluster marker) can pose as the join
    /// service and choose this node's disk key and CAs. Warned now and on every use.
    #[must_use]
    pub fn insecure_unchecked() -> Self {
        warn!(
            "INSECURE: tickets are not checked for the control plane's signature (--insecure-skip-control-plane-identity): any joined worker can pose as the join service"
        );
        Self(None)
    }
}

/// A ticket is not the control plane's.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The connection had no channel binding to check the signature against.
    #[error("no channel binding for the connection the ticket came on")]
    NoBinding,
    /// The signature is missing or not the control plane's.
    #[error("the ticket is not signed by the control plane")]
    Identity(#[source] IdentityError),
}

/// The marker PCR.
const MARKER_PCR: u8 = 15;

/// How a node decides whether to trust a join service. See the module documentation.
#[derive(Clone)]
pub struct JoinServiceTrust(Mode);

#[derive(Clone)]
enum Mode {
    Cluster {
        validator: Arc<dyn Validator>,
        cluster_id: ClusterId,
        identity: ControlPlaneIdentity,
    },
    InitOnly,
    InsecureAny,
}

impl std::fmt::Debug for JoinServiceTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Mode::Cluster { cluster_id, .. } => {
                write!(f, "JoinServiceTrust::Cluster({cluster_id})")
            }
            Mode::InitOnly => f.write_str("JoinServiceTrust::InitOnly"),
            Mode::InsecureAny => f.write_str("JoinServiceTrust::InsecureAny"),
        }
    }
}

impl JoinServiceTrust {
    /// Trusts only join services of `cluster_id`: a TPM quote whose AK `ak_trust` accepts,
    /// whose PCRs match `measurements`, and whose PCR 15 is the marker of `cluster_id`
    /// (whatever `measurements` expects of PCR 15, if anything), and whose tickets
    /// `identity` recognises as the control plane's.
    pub fn cluster(
        ak_trust: AkTrust,
        measurements: Arc<dyn MeasurementsProvider>,
        cluster_id: ClusterId,
        identity: ControlPlaneIdentity,
    ) -> Result<Self, MeasurementsError> {
        let provider = WithClusterMarker::new(measurements, &cluster_id)?;
        Ok(Self(Mode::Cluster {
            validator: Arc::new(TpmQuoteValidator::new(ak_trust, Arc::new(provider))),
            cluster_id,
            identity,
        }))
    }

    /// Checks that `signature` is the control plane's over `signed` (the ticket encoded
    /// with its signature field empty), for `purpose`, on the connection whose channel
    /// binding is `binding`. Passes with a warning in the insecure modes.
    pub(crate) fn check_signature(
        &self,
        purpose: Purpose,
        binding: Option<ChannelBinding>,
        signed: &[u8],
        signature: &[u8],
    ) -> Result<(), SignatureError> {
        let key = match &self.0 {
            Mode::Cluster {
                identity: ControlPlaneIdentity(Some(key)),
                ..
            } => key,
            Mode::Cluster { .. } => {
                warn!(
                    ?purpose,
                    "INSECURE: using a ticket without checking the control plane's signature (--insecure-skip-control-plane-identity)"
                );
                return Ok(());
            }
            Mode::InitOnly | Mode::InsecureAny => return Ok(()),
        };
        let binding = binding.ok_or(SignatureError::NoBinding)?;
        key.verify(purpose, &binding, signed, signature)
            .map_err(SignatureError::Identity)
    }

    /// No cluster to join: the node only waits to be initialised.
    #[must_use]
    pub fn init_only() -> Self {
        Self(Mode::InitOnly)
    }

    /// **Insecure**: trusts whichever join service answers, which then gets to choose the
    /// node's disk key and cluster. Warned now and on every join or rejoin attempt.
    #[must_use]
    pub fn insecure_skip_verification() -> Self {
        warn!(
            "INSECURE: the join service is not verified (--insecure-skip-join-service-verification): any join service can choose this node's disk key and cluster"
        );
        Self(Mode::InsecureAny)
    }

    /// The validator of the join service's evidence (none in the insecure mode).
    pub(crate) fn validator(&self) -> Option<Arc<dyn Validator>> {
        match &self.0 {
            Mode::Cluster { validator, .. } => Some(validator.clone()),
            Mode::InitOnly | Mode::InsecureAny => None,
        }
    }

    /// The cluster a ticket must derive (none in the insecure mode).
    pub(crate) fn expected_cluster(&self) -> Option<&ClusterId> {
        match &self.0 {
            Mode::Cluster { cluster_id, .. } => Some(cluster_id),
            Mode::InitOnly | Mode::InsecureAny => None,
        }
    }

    /// Whether the node may join or rejoin at all.
    pub(crate) fn may_join(&self) -> bool {
        !matches!(self.0, Mode::InitOnly)
    }

    /// Logs the warning of the insecure mode; called on every attempt.
    pub(crate) fn warn_if_insecure(&self, what: &str) {
        if matches!(self.0, Mode::InsecureAny) {
            warn!(
                attempt = what,
                "INSECURE: asking a join service that is not verified (--insecure-skip-join-service-verification)"
            );
        }
    }

    /// Whether a ticket's cluster is the expected one (always, in the insecure mode).
    pub(crate) fn accepts_cluster(&self, got: &ClusterId) -> Result<(), ClusterMismatch> {
        match self.expected_cluster() {
            Some(want) if want != got => Err(ClusterMismatch {
                got: *got,
                want: *want,
            }),
            _ => Ok(()),
        }
    }
}

/// A ticket is for another cluster than the one this node is configured to join.
#[derive(Debug, thiserror::Error)]
#[error("the ticket is for cluster {got}, this node expects cluster {want}")]
pub struct ClusterMismatch {
    /// The cluster the ticket derives.
    pub got: ClusterId,
    /// The configured cluster.
    pub want: ClusterId,
}

/// The configured measurements with PCR 15 enforced as one cluster's marker.
struct WithClusterMarker {
    inner: Arc<dyn MeasurementsProvider>,
    marker: [u8; 32],
    /// The last combination made: reused while `inner` hands out the same measurements.
    last: Mutex<(Arc<Measurements>, Arc<Measurements>)>,
}

impl WithClusterMarker {
    fn new(
        inner: Arc<dyn MeasurementsProvider>,
        cluster_id: &ClusterId,
    ) -> Result<Self, MeasurementsError> {
        let marker = asterism_tpm::marker::expected_marker_pcr(cluster_id.as_bytes());
        let base = inner.current();
        let combined = Arc::new(with_marker(&base, marker)?);
        Ok(Self {
            inner,
            marker,
            last: Mutex::new((base, combined)),
        })
    }
}

fn with_marker(base: &Measurements, marker: [u8; 32]) -> Result<Measurements, MeasurementsError> {
    let pcr15 = PcrIndex::try_from(u32::from(MARKER_PCR))?;
    Measurements::new(
        base.iter()
            .filter(|(i, _)| *i != pcr15)
            .map(|(i, e)| (i, *e))
            .chain([(pcr15, ExpectedPcr::enforce(marker))]),
    )
}

impl MeasurementsProvider for WithClusterMarker {
    fn current(&self) -> Arc<Measurements> {
        let base = self.inner.current();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&last.0, &base) {
            match with_marker(&base, self.marker) {
                Ok(m) => *last = (base, Arc::new(m)),
                // Cannot happen (the marker makes an enforced, non-resettable entry of its
                // own); the previous combination, which enforces the marker, stays.
                Err(e) => {
                    warn!(error = %e, "cannot add the cluster marker to new measurements; keeping the previous ones")
                }
            }
        }
        last.1.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_marker_replaces_whatever_the_measurements_expect_of_pcr_15() {
        let zero = Measurements::new([
            (
                PcrIndex::try_from(0).unwrap(),
                ExpectedPcr::enforce([1; 32]),
            ),
            (
                PcrIndex::try_from(15).unwrap(),
                ExpectedPcr::warn_only([0; 32]),
            ),
        ])
        .unwrap();
        let id = ClusterId::from([7; 32]);
        let p = WithClusterMarker::new(zero.into_provider(), &id).unwrap();
        let m = p.current();
        assert_eq!(
            m.get(PcrIndex::try_from(15).unwrap()),
            Some(&ExpectedPcr::enforce(
                asterism_tpm::marker::expected_marker_pcr(id.as_bytes())
            ))
        );
        assert_eq!(
            m.get(PcrIndex::try_from(0).unwrap()),
            Some(&ExpectedPcr::enforce([1; 32]))
        );
    }
}
