//! Session-bound attested TLS (aTLS) for Asterism, on rustls, with tonic glue.
//!
//! After a TLS 1.3 handshake, each side that attests sends one EVIDENCE frame whose report
//! data is `SHA-256("asterism/atls/v1" || role || E)`, where `E` is the connection's TLS
//! exporter value. Each side that verifies checks that binding and the evidence, answers
//! with a VERDICT frame, and only then does HTTP/2 start. Evidence captured on one
//! connection is useless on another (different `E`), and evidence of one role is useless in
//! the other (different label). The wire format is specified in `docs/atls.md`.
//!
//! * [`AtlsServer`] accepts connections; [`AtlsServer::incoming`] feeds tonic's
//!   `serve_with_incoming*` with streams whose connection info is the verified peer
//!   ([`AtlsConnectInfo`]); handlers get it with [`verified_peer`].
//! * [`AtlsConnector`] dials; it is a `tower::Service<Uri>` for tonic's
//!   `Endpoint::connect_with_connector`.
//! * [`SessionKeyIssuer`]: a server's attested session key, quoted once per refresh
//!   interval and signing each connection's exporter (`docs/atls.md` §4b).
//! * [`machine::Exchange`]: the exchange as a sans-I/O state machine, which the async
//!   adapter drives and the fuzz targets feed.
//!
//! This crate is the only one that may depend on rustls. It must never let application
//! data flow before the exchange has succeeded, and never log evidence or secrets.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

/// Builder setters: `name(param: Type) => field;` is `pub fn name(mut self, param: Type) ->
/// Self`, which sets `field` and returns the builder.
macro_rules! setters {
    ($($(#[doc = $doc:expr])* $name:ident($param:ident: $ty:ty) => $field:ident;)*) => {
        $(
            $(#[doc = $doc])*
            pub fn $name(mut self, $param: $ty) -> Self {
                self.$field = $param;
                self
            }
        )*
    };
}

mod client;
mod exchange;
mod issue;
pub mod machine;
pub mod pending;
mod server;
pub mod session;
mod stream;
mod tls;
pub mod wire;

pub use asterism_attestation as attestation;
pub use asterism_attestation::{Issuer, Role, ValidationError, Validator, VerifiedEvidence};
pub use client::AtlsConnector;
pub use server::AtlsServer;
pub use session::SessionKeyIssuer;
pub use stream::{AtlsConnectInfo, AtlsStream};
pub use tls::{ALPN_H2, CHANNEL_BINDING_LABEL, EXPORTER_LABEL};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use wire::VerdictCode;

/// Largest EVIDENCE payload: the variant-length byte, the longest variant name and the
/// largest evidence any variant may carry ([`asterism_attestation::tpm::MAX_EVIDENCE_SIZE`],
/// 64 KiB). Inclusive: a payload of exactly this many bytes is read, one more is refused
/// on the frame header. Nothing larger can ever verify, so nothing larger is worth reading.
///
/// Of the two forms, session-key evidence (§4b) is the longer: variant length (1), the
/// variant `atls-session-key` (16), the session-key prefix (105), the longest inner variant
/// name (64) and the inner evidence (65,536): 65,722 bytes. Plain evidence needs at most
/// 1 + 64 + 65,536 = 65,601.
pub const MAX_EVIDENCE_FRAME_LEN: usize = max(
    1 + wire::MAX_VARIANT_LEN + asterism_attestation::tpm::MAX_EVIDENCE_SIZE,
    1 + session::VARIANT.len()
        + session::PREFIX_LEN
        + wire::MAX_VARIANT_LEN
        + asterism_attestation::tpm::MAX_EVIDENCE_SIZE,
);
/// Default cap on one frame's payload: [`MAX_EVIDENCE_FRAME_LEN`] (65,722 bytes).
pub const DEFAULT_MAX_FRAME_LEN: usize = MAX_EVIDENCE_FRAME_LEN;
const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

/// Smallest configurable frame cap.
pub const MIN_MAX_FRAME_LEN: usize = 1024;
/// Default deadline for the TLS handshake and, separately, for the evidence exchange.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default deadline for a new connection's first byte (the TLS ClientHello).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default deadline, on a server, for the client's HELLO after the TLS handshake. An
/// honest client sends it at once, with its last handshake flight; a peer that finishes
/// TLS and then stays silent gives its handshake slot back after this, not after the
/// whole exchange deadline.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(3);
/// Default lifetime of a connection whose peer this side verified: after it the
/// connection is closed and the peer must attest again, so a revoked measurement reaches
/// every verified connection within this bound.
pub const DEFAULT_MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Default cap on handshakes in progress at once per [`AtlsServer::incoming`].
pub const DEFAULT_MAX_PENDING_HANDSHAKES: usize = 512;
/// Default cap on handshakes in progress at once from one source (an IPv4 address or an
/// IPv6 /64).
pub const DEFAULT_MAX_PENDING_PER_SOURCE: usize = 8;

/// What one side of an aTLS connection does: attest (with an issuer), verify the peer
/// (with validators), or both, within limits.
#[derive(Clone)]
pub struct AtlsConfig {
    issuer: Option<Arc<dyn Issuer>>,
    session_key: Option<Arc<SessionKeyIssuer>>,
    max_session_key_validity: Duration,
    validators: Vec<Arc<dyn Validator>>,
    max_frame_len: usize,
    exchange_timeout: Duration,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    hello_timeout: Duration,
    max_connection_lifetime: Duration,
    max_pending_handshakes: usize,
    max_pending_per_source: usize,
    on_refusal: Option<RefusalObserver>,
}

/// Called by a listener ([`AtlsServer::incoming`]) with a short, fixed reason label
/// ([`AtlsError::kind`], `source_limit` or `silent_peer`) for every connection it refuses,
/// so that a service can count refusals in its metrics. The full reason goes to the log.
pub type RefusalObserver = Arc<dyn Fn(&'static str) + Send + Sync>;

impl std::fmt::Debug for AtlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsConfig")
            .field("issuer", &self.issuer.as_ref().map(|i| i.variant()))
            .field("session_key", &self.session_key)
            .field("max_session_key_validity", &self.max_session_key_validity)
            .field(
                "validators",
                &self
                    .validators
                    .iter()
                    .map(|v| v.variant())
                    .collect::<Vec<_>>(),
            )
            .field("max_frame_len", &self.max_frame_len)
            .field("exchange_timeout", &self.exchange_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("hello_timeout", &self.hello_timeout)
            .field("max_connection_lifetime", &self.max_connection_lifetime)
            .field("max_pending_handshakes", &self.max_pending_handshakes)
            .field("max_pending_per_source", &self.max_pending_per_source)
            .field("on_refusal", &self.on_refusal.is_some())
            .finish()
    }
}

impl Default for AtlsConfig {
    fn default() -> Self {
        Self {
            issuer: None,
            session_key: None,
            max_session_key_validity: session::DEFAULT_MAX_VALIDITY,
            validators: Vec::new(),
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            exchange_timeout: DEFAULT_TIMEOUT,
            handshake_timeout: DEFAULT_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            max_connection_lifetime: DEFAULT_MAX_CONNECTION_LIFETIME,
            max_pending_handshakes: DEFAULT_MAX_PENDING_HANDSHAKES,
            max_pending_per_source: DEFAULT_MAX_PENDING_PER_SOURCE,
            on_refusal: None,
        }
    }
}

impl AtlsConfig {
    /// A side that attests with `issuer` (and does not verify the peer).
    pub fn attesting(issuer: Arc<dyn Issuer>) -> Self {
        Self::default().with_issuer(issuer)
    }

    /// A side that verifies the peer with `validator` (and does not attest).
    pub fn verifying(validator: Arc<dyn Validator>) -> Self {
        Self::default().with_validator(validator)
    }

    /// Attest with `issuer`, per connection. A client attests on every connection; a
    /// server only to a client whose HELLO asks for evidence (servers facing untrusted
    /// networks should prefer [`AtlsConfig::with_session_key_issuer`]). Replaces a
    /// session key.
    pub fn with_issuer(mut self, issuer: Arc<dyn Issuer>) -> Self {
        self.session_key = None;
        self.issuer = Some(issuer);
        self
    }

    /// Server side: attest with an attested session key (`docs/atls.md` §4b) whose evidence
    /// `issuer` produces once per refresh interval (default 60 s), instead of per
    /// connection. The server then attests only to clients that ask for evidence and
    /// accept session keys, and no client can make it call `issuer` more than once per
    /// interval. Replaces a per-connection issuer.
    pub fn with_session_key_issuer(self, issuer: Arc<dyn Issuer>) -> Self {
        self.with_session_key(Arc::new(SessionKeyIssuer::new(
            issuer,
            session::DEFAULT_REFRESH,
        )))
    }

    /// Server side: attest with this session key (see
    /// [`AtlsConfig::with_session_key_issuer`]); share one between servers to share its
    /// quotes.
    pub fn with_session_key(mut self, key: Arc<SessionKeyIssuer>) -> Self {
        self.issuer = None;
        self.session_key = Some(key);
        self
    }

    /// Verifier side: the longest remaining validity (`not_after - now`) accepted in the
    /// peer's session-key evidence (default 120 s). Bounds how long a session key, and the
    /// quote behind it, can be used after it was made.
    pub fn with_max_session_key_validity(mut self, validity: Duration) -> Self {
        self.max_session_key_validity = validity;
        self
    }

    /// Whether this side attests with per-connection evidence.
    pub(crate) fn attests_per_connection(&self) -> bool {
        self.issuer.is_some()
    }

    /// Also accept evidence of `validator`'s variant. With at least one validator, the
    /// peer must attest.
    pub fn with_validator(mut self, validator: Arc<dyn Validator>) -> Self {
        self.validators.push(validator);
        self
    }

    setters! {
        /// Cap on one EVIDENCE frame's payload (inclusive), checked on the frame header before
        /// anything is allocated. Between [`MIN_MAX_FRAME_LEN`] and [`MAX_EVIDENCE_FRAME_LEN`]
        /// (the default); a smaller cap only makes sense for variants with small evidence.
        with_max_frame_len(bytes: usize) => max_frame_len;

        /// Deadline for the evidence exchange after the TLS handshake.
        with_exchange_timeout(timeout: Duration) => exchange_timeout;

        /// Deadline for the TLS handshake.
        with_handshake_timeout(timeout: Duration) => handshake_timeout;

        /// Server side: how long a new connection may stay silent before its first byte (the
        /// TLS ClientHello) arrives; a silent peer is dropped then, instead of holding a
        /// handshake slot for the whole [`AtlsConfig::with_handshake_timeout`].
        with_idle_timeout(timeout: Duration) => idle_timeout;

        /// Server side: how long after the TLS handshake the client's HELLO may take (default
        /// [`DEFAULT_HELLO_TIMEOUT`]). Counted within the exchange deadline, and much shorter:
        /// a client sends its HELLO right behind its handshake, so a peer that completes TLS
        /// and then says nothing is dropped early instead of holding its handshake slot for
        /// the whole [`AtlsConfig::with_exchange_timeout`].
        with_hello_timeout(timeout: Duration) => hello_timeout;

        /// How long a connection whose peer this side verified may live, counted from the
        /// verification. Then reads see end of stream and writes fail, HTTP/2 closes the
        /// connection, and the peer must connect and attest again: a measurement revoked in
        /// the reference values reaches every verified connection within this bound. Servers
        /// should also set HTTP/2's graceful `max_connection_age` a little below it (see
        /// [`AtlsServer::max_connection_lifetime`]).
        with_max_connection_lifetime(lifetime: Duration) => max_connection_lifetime;

        /// Server side: handshakes (TLS and exchange) in progress at once per
        /// [`AtlsServer::incoming`]. When all are taken, a connection from a source holding
        /// fewer than the busiest source takes that source's oldest handshake's slot
        /// ([`pending::PendingSlots`]), so no set of sources can keep another out.
        with_max_pending_handshakes(n: usize) => max_pending_handshakes;

        /// Server side: handshakes in progress at once from one source (an IPv4 address, or
        /// an IPv6 /64 since one host commonly holds a whole /64). A connection beyond it is
        /// closed at once, without taking one of the global slots.
        with_max_pending_per_source(n: usize) => max_pending_per_source;
    }

    /// Reports every connection [`AtlsServer::incoming`] refuses to `observer`, with a
    /// fixed reason label (for a service's metrics).
    pub fn with_refusal_observer(mut self, observer: RefusalObserver) -> Self {
        self.on_refusal = Some(observer);
        self
    }

    fn check(&self) -> Result<(), AtlsError> {
        if self.issuer.is_none() && self.session_key.is_none() && self.validators.is_empty() {
            return Err(AtlsError::Config(
                "an aTLS side needs an issuer, a validator, or both".into(),
            ));
        }
        if !(MIN_MAX_FRAME_LEN..=MAX_EVIDENCE_FRAME_LEN).contains(&self.max_frame_len) {
            return Err(AtlsError::Config(format!(
                "max frame length {} is outside {MIN_MAX_FRAME_LEN}..={MAX_EVIDENCE_FRAME_LEN}",
                self.max_frame_len
            )));
        }
        if self.max_pending_handshakes == 0 || self.max_pending_per_source == 0 {
            return Err(AtlsError::Config(
                "pending-handshake limits must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// A peer whose evidence a validator accepted on this very connection.
///
/// Only this crate makes one, and only after verification succeeded; handlers that
/// release secrets take this type. The evidence is shared: the connection's every
/// request carries a copy of its connect info, and a copy costs a reference count.
#[derive(Clone, Debug)]
pub struct VerifiedPeer {
    evidence: std::sync::Arc<VerifiedEvidence>,
    remote_addr: Option<SocketAddr>,
}

impl VerifiedPeer {
    /// The verified evidence (variant, attesting key identity, measurements).
    pub fn evidence(&self) -> &VerifiedEvidence {
        &self.evidence
    }

    /// The peer's address, when the transport has one.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote_addr
    }
}

/// Returns the verified peer of the connection `request` arrived on, or
/// `PermissionDenied` when the connection was not verified (for example, a server that
/// does not verify clients).
pub fn verified_peer<T>(request: &tonic::Request<T>) -> Result<&VerifiedPeer, tonic::Status> {
    request
        .extensions()
        .get::<AtlsConnectInfo>()
        .and_then(|info| info.peer.as_ref())
        .ok_or_else(|| tonic::Status::permission_denied("peer is not attested"))
}

/// Everything that can go wrong on an aTLS connection.
#[derive(Debug, thiserror::Error)]
pub enum AtlsError {
    /// The configuration cannot work.
    #[error("aTLS configuration: {0}")]
    Config(String),
    /// Socket I/O failed.
    #[error("I/O: {0}")]
    Io(#[source] std::io::Error),
    /// The peer closed the connection during the exchange.
    #[error("peer closed the connection during the attestation exchange")]
    Closed,
    /// The TLS layer failed (including a TLS 1.2-only peer).
    #[error("TLS: {0}")]
    Tls(#[source] rustls::Error),
    /// A deadline passed.
    #[error("{stage} did not finish within {after:?}")]
    Timeout {
        /// `first byte`, `TCP connect`, `TLS handshake` or `attestation exchange`.
        stage: &'static str,
        /// The deadline.
        after: std::time::Duration,
    },
    /// A frame declared a payload above the cap; nothing was allocated for it.
    #[error("frame of {claimed} bytes exceeds the {cap}-byte cap")]
    FrameTooLarge {
        /// Length in the frame header.
        claimed: usize,
        /// The cap.
        cap: usize,
    },
    /// A frame was malformed or out of order.
    #[error("aTLS protocol: {0}")]
    Protocol(String),
    /// The peer speaks another protocol version.
    #[error("peer speaks aTLS version {0}, this side speaks {v}", v = wire::VERSION)]
    UnsupportedVersion(u8),
    /// This side requires evidence and the peer announced none.
    #[error("peer did not attest, but this side requires evidence")]
    EvidenceRequired,
    /// The peer requires evidence this side cannot produce (no issuer, or only a session
    /// key and the peer does not accept session keys).
    #[error(
        "peer requires evidence this side cannot produce (no issuer, or a session key the peer does not accept)"
    )]
    NoIssuer,
    /// No validator for the evidence variant the peer sent.
    #[error("no validator for evidence variant {0:?}")]
    UnknownVariant(String),
    /// This side could not issue its evidence.
    #[error(transparent)]
    Issue(#[from] asterism_attestation::IssueError),
    /// This side rejected the peer's evidence. The full reason (with expected and observed
    /// values) stays on this side; the peer's VERDICT carries a redacted one.
    #[error("peer evidence rejected: {0}")]
    Rejected(#[source] ValidationError),
    /// The peer rejected this side's evidence (or the exchange).
    #[error("peer refused the exchange ({code:?}): {reason}")]
    RefusedByPeer {
        /// The peer's verdict code.
        code: VerdictCode,
        /// The peer's reason.
        reason: String,
    },
}

impl AtlsError {
    /// A short, fixed label of what failed, for metrics (never a peer-chosen string).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::Io(_) => "io",
            Self::Closed => "closed",
            Self::Tls(_) => "tls",
            Self::Timeout { .. } => "timeout",
            Self::FrameTooLarge { .. } => "frame_too_large",
            Self::Protocol(_) => "protocol",
            Self::UnsupportedVersion(_) => "unsupported_version",
            Self::EvidenceRequired => "evidence_required",
            Self::NoIssuer => "cannot_attest",
            Self::UnknownVariant(_) => "unknown_variant",
            Self::Issue(_) => "issue",
            Self::Rejected(_) => "rejected",
            Self::RefusedByPeer { .. } => "refused_by_peer",
        }
    }

    pub(crate) fn read(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Self::Closed
        } else {
            Self::Io(e)
        }
    }

    /// The VERDICT this side sends when it fails with this error, or `None` when there is
    /// nobody to tell (the peer refused or closed, or the connection broke). Reasons are
    /// short and never contain secrets or the verifier's policy values.
    fn verdict(&self) -> Option<(VerdictCode, String)> {
        Some(match self {
            Self::Rejected(e) => (VerdictCode::Rejected, redacted_reason(e)),
            Self::EvidenceRequired => (VerdictCode::EvidenceRequired, self.to_string()),
            Self::UnsupportedVersion(_) => (VerdictCode::UnsupportedVersion, self.to_string()),
            Self::UnknownVariant(_) => (VerdictCode::UnknownVariant, self.to_string()),
            Self::Protocol(_) | Self::FrameTooLarge { .. } => {
                (VerdictCode::ProtocolError, self.to_string())
            }
            Self::NoIssuer => (VerdictCode::CannotAttest, self.to_string()),
            Self::Issue(_) => (
                VerdictCode::InternalError,
                "this side could not produce its evidence".into(),
            ),
            Self::Closed
            | Self::RefusedByPeer { .. }
            | Self::Io(_)
            | Self::Tls(_)
            | Self::Timeout { .. }
            | Self::Config(_) => return None,
        })
    }
}

/// What an unverified peer may learn about why its evidence was rejected: which check
/// failed, and for a measurement which index, but never the expected or the observed value
/// (the expected values are the verifier's policy; the full explanation goes to this
/// side's log at warn).
fn redacted_reason(e: &ValidationError) -> String {
    match e {
        ValidationError::Measurement { index, .. } => {
            format!("measurement mismatch at index {index}")
        }
        other => other.to_string(),
    }
}

impl From<AtlsError> for tonic::Status {
    fn from(e: AtlsError) -> Self {
        match e {
            AtlsError::Rejected(_) | AtlsError::RefusedByPeer { .. } => {
                tonic::Status::permission_denied(e.to_string())
            }
            _ => tonic::Status::unavailable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_verdict_names_the_index_but_no_value() {
        let e = AtlsError::Rejected(ValidationError::Measurement {
            index: 7,
            expected: "aa".repeat(32),
            observed: "bb".repeat(32),
        });
        let (code, reason) = e.verdict().unwrap();
        assert_eq!(code, VerdictCode::Rejected);
        assert_eq!(reason, "measurement mismatch at index 7");
        // The local error keeps the full explanation for the log.
        assert!(e.to_string().contains(&"aa".repeat(32)));
    }
}
