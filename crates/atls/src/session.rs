//! Attested session keys (`docs/atls.md` §4b): a server quotes its TPM once per refresh
//! interval over a fresh Ed25519 key, and signs each connection's exporter with that key.
//!
//! Evidence of variant [`VARIANT`] (the EVIDENCE frame's `evidence` field):
//!
//! ```text
//! signature (64) || public_key (32) || not_after (u64, big-endian, Unix seconds)
//!   || inner_variant_len (u8, 1..=64) || inner_variant (printable ASCII) || inner_evidence
//! ```
//!
//! * `inner_evidence` (of `inner_variant`, e.g. `tpm-quote`) is bound to
//!   `ReportData::atls_session_key(role, public_key, not_after)`;
//! * `signature` is Ed25519 by `public_key` over
//!   `"asterism/atls-session-key/v1/connection" || role || E`.

use crate::AtlsError;
use asterism_attestation::{
    IssueError, Issuer, ReportData, Role, ValidationError, Validator, VerifiedEvidence,
};
use ring::rand::SystemRandom;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Variant name of session-key evidence in an EVIDENCE frame.
pub const VARIANT: &str = "atls-session-key";
/// Context of the per-connection signature.
pub const CONNECTION_CONTEXT: &[u8] = b"asterism/atls-session-key/v1/connection";
/// Bytes before the inner variant: signature, public key, expiry, variant length.
pub const PREFIX_LEN: usize = 64 + 32 + 8 + 1;
/// Default: a server quotes a new session key when the current one is this old.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(60);
/// How long past its refresh a key stays valid: covers the refresh itself and clock skew
/// between server and verifier.
pub const VALIDITY_MARGIN: Duration = Duration::from_secs(30);
/// A failed background refresh is retried no sooner than this, so a failing TPM is not
/// asked once per connection.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Default: the longest remaining validity (`not_after - now`) a verifier accepts.
pub const DEFAULT_MAX_VALIDITY: Duration = Duration::from_secs(120);

/// The message a session key signs for one connection.
pub fn connection_message(role: Role, exporter: &[u8; 32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(CONNECTION_CONTEXT.len() + 6 + 32);
    m.extend_from_slice(CONNECTION_CONTEXT);
    m.extend_from_slice(role.label());
    m.extend_from_slice(exporter);
    m
}

/// Session-key evidence, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKeyEvidence {
    /// Ed25519 signature over [`connection_message`].
    pub signature: [u8; 64],
    /// The session key.
    pub public_key: [u8; 32],
    /// Expiry, seconds since the Unix epoch.
    pub not_after: u64,
    /// Variant of the inner evidence.
    pub inner_variant: String,
    /// Evidence over `ReportData::atls_session_key(role, public_key, not_after)`.
    pub inner_evidence: Vec<u8>,
}

impl SessionKeyEvidence {
    /// Encodes the evidence.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(PREFIX_LEN + self.inner_variant.len() + self.inner_evidence.len());
        out.extend_from_slice(&self.signature);
        out.extend_from_slice(&self.public_key);
        out.extend_from_slice(&self.not_after.to_be_bytes());
        out.push(u8::try_from(self.inner_variant.len()).unwrap_or(0));
        out.extend_from_slice(self.inner_variant.as_bytes());
        out.extend_from_slice(&self.inner_evidence);
        out
    }

    /// Decodes the evidence strictly.
    pub fn decode(bytes: &[u8]) -> Result<Self, ValidationError> {
        let bad = |m: &str| ValidationError::Malformed(format!("session-key evidence: {m}"));
        let (signature, rest) = bytes
            .split_first_chunk::<64>()
            .ok_or_else(|| bad("short"))?;
        let (public_key, rest) = rest.split_first_chunk::<32>().ok_or_else(|| bad("short"))?;
        let (not_after, rest) = rest.split_first_chunk::<8>().ok_or_else(|| bad("short"))?;
        let (&len, rest) = rest.split_first().ok_or_else(|| bad("short"))?;
        let len = usize::from(len);
        if len == 0 || len > crate::wire::MAX_VARIANT_LEN || rest.len() < len {
            return Err(bad("inner variant length invalid"));
        }
        let (variant, inner) = rest.split_at(len);
        if !variant.iter().all(u8::is_ascii_graphic) {
            return Err(bad("inner variant is not printable ASCII"));
        }
        Ok(Self {
            signature: *signature,
            public_key: *public_key,
            not_after: u64::from_be_bytes(*not_after),
            inner_variant: String::from_utf8_lossy(variant).into_owned(),
            inner_evidence: inner.to_vec(),
        })
    }
}

/// What a verifier checks session-key evidence against.
pub(crate) struct SessionKeyCheck<'a> {
    pub validators: &'a [Arc<dyn Validator>],
    /// The attesting side's role (the verifier's peer).
    pub role: Role,
    pub exporter: &'a [u8; 32],
    pub now_unix: u64,
    pub max_validity: Duration,
}

/// Verifies session-key evidence: freshness, the per-connection signature, and the inner
/// evidence over the session key with the normal validator of its variant.
pub(crate) fn verify(
    evidence: &[u8],
    check: &SessionKeyCheck<'_>,
) -> Result<VerifiedEvidence, AtlsError> {
    let ev = SessionKeyEvidence::decode(evidence).map_err(AtlsError::Rejected)?;
    // Freshness: not expired, and not valid for longer than any honest server asks.
    if ev.not_after <= check.now_unix {
        return Err(AtlsError::Rejected(ValidationError::Policy(
            "session key expired".into(),
        )));
    }
    if ev.not_after - check.now_unix > check.max_validity.as_secs() {
        return Err(AtlsError::Rejected(ValidationError::Policy(
            "session key valid for longer than this verifier accepts".into(),
        )));
    }
    // This connection, this role: a signature made on another connection (relay) or in
    // the other role (reflection) does not verify.
    UnparsedPublicKey::new(&ED25519, ev.public_key)
        .verify(
            &connection_message(check.role, check.exporter),
            &ev.signature,
        )
        .map_err(|_| AtlsError::Rejected(ValidationError::BindingMismatch))?;
    // The platform vouches for the key, its expiry and its role, under the session-key
    // purpose label.
    let validator = check
        .validators
        .iter()
        .find(|v| v.variant() == ev.inner_variant)
        .ok_or_else(|| AtlsError::UnknownVariant(ev.inner_variant.clone()))?;
    let expected = ReportData::atls_session_key(check.role, &ev.public_key, ev.not_after);
    validator
        .validate(&ev.inner_evidence, &expected)
        .map_err(AtlsError::Rejected)
}

struct Current {
    key: Ed25519KeyPair,
    public_key: [u8; 32],
    not_after: u64,
    quoted_at: Instant,
    inner_variant: &'static str,
    inner_evidence: Vec<u8>,
}

/// A server's attested session key: one inner [`Issuer`] call (one TPM quote) per
/// refresh interval, one Ed25519 signature per connection.
pub struct SessionKeyIssuer {
    inner: Arc<dyn Issuer>,
    refresh: Duration,
    current: Mutex<Option<Arc<Current>>>,
    refreshing: Arc<tokio::sync::Mutex<()>>,
    last_failure: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for SessionKeyIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionKeyIssuer")
            .field("inner", &self.inner.variant())
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl SessionKeyIssuer {
    /// A session-key issuer over `inner`, refreshing every `refresh`.
    pub fn new(inner: Arc<dyn Issuer>, refresh: Duration) -> Self {
        Self {
            inner,
            refresh,
            current: Mutex::new(None),
            refreshing: Arc::new(tokio::sync::Mutex::new(())),
            last_failure: Mutex::new(None),
        }
    }

    /// The inner issuer's variant.
    pub fn inner_variant(&self) -> &'static str {
        self.inner.variant()
    }

    /// The current key if it is younger than `max_age`.
    fn younger_than(&self, max_age: Duration) -> Option<Arc<Current>> {
        let cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        cur.as_ref()
            .filter(|c| c.quoted_at.elapsed() < max_age)
            .cloned()
    }

    async fn current(self: &Arc<Self>) -> Result<Arc<Current>, AtlsError> {
        if let Some(c) = self.younger_than(self.refresh) {
            return Ok(c);
        }
        // Due for refresh but still well within its validity: keep using it while one
        // background task quotes the next key, so no connection waits for the TPM.
        if let Some(c) = self.younger_than(self.refresh + VALIDITY_MARGIN / 2) {
            if !self.failed_within(RETRY_AFTER)
                && let Ok(guard) = self.refreshing.clone().try_lock_owned()
            {
                let this = self.clone();
                tokio::spawn(async move {
                    let _guard = guard;
                    if let Err(e) = this.quote_new_key().await {
                        *this.last_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(Instant::now());
                        tracing::warn!(error = %e, "refreshing the aTLS session key failed");
                    }
                });
            }
            return Ok(c);
        }
        // No usable key: wait for one. One refresh at a time; connections arriving
        // meanwhile wait for it rather than each quoting.
        let _guard = self.refreshing.lock().await;
        if let Some(c) = self.younger_than(self.refresh) {
            return Ok(c);
        }
        self.quote_new_key().await
    }

    /// Whether a background refresh failed within `d`.
    fn failed_within(&self, d: Duration) -> bool {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < d)
    }

    /// Generates a key, quotes it with the inner issuer and makes it current. Callers
    /// hold `refreshing`.
    async fn quote_new_key(&self) -> Result<Arc<Current>, AtlsError> {
        let issue_err = |message: String| IssueError {
            variant: self.inner.variant(),
            message,
            source: None,
        };
        let key = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| issue_err("generating the session key failed".into()))
            .and_then(|pkcs8| {
                Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
                    .map_err(|_| issue_err("loading the session key failed".into()))
            })?;
        let mut public_key = [0u8; 32];
        public_key.copy_from_slice(key.public_key().as_ref());
        let quoted_at = Instant::now();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| issue_err("the clock is before 1970".into()))?;
        let not_after = (now + self.refresh + VALIDITY_MARGIN).as_secs();
        let report_data = ReportData::atls_session_key(Role::Server, &public_key, not_after);
        let inner_evidence = crate::issue::issue(self.inner.clone(), report_data).await?;
        tracing::debug!(not_after, "quoted a new aTLS session key");
        let c = Arc::new(Current {
            key,
            public_key,
            not_after,
            quoted_at,
            inner_variant: self.inner.variant(),
            inner_evidence,
        });
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Session-key evidence for one connection of `role` with exporter value `exporter`.
    pub async fn evidence(
        self: &Arc<Self>,
        role: Role,
        exporter: &[u8; 32],
    ) -> Result<Vec<u8>, AtlsError> {
        let c = self.current().await?;
        let mut signature = [0u8; 64];
        signature.copy_from_slice(c.key.sign(&connection_message(role, exporter)).as_ref());
        Ok(SessionKeyEvidence {
            signature,
            public_key: c.public_key,
            not_after: c.not_after,
            inner_variant: c.inner_variant.to_string(),
            inner_evidence: c.inner_evidence.clone(),
        }
        .encode())
    }
}
