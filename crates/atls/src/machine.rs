//! The aTLS exchange as a sans-I/O state machine: bytes in, frames and requests out.
//!
//! [`Exchange`] never touches a socket, a clock other than the one it is handed, or an
//! issuer. A driver (the async adapter in this crate, a fuzzer, a test) loops:
//!
//! 1. writes everything [`Exchange::take_output`] returns to the peer;
//! 2. asks [`Exchange::step`] what to do next:
//!    * [`Step::Read`]`(n)`: read at most `n` bytes from the peer and hand them to
//!      [`Exchange::feed`]. The machine never asks for a byte beyond its own frames, so
//!      whatever follows them (the HTTP/2 preface) stays in the stream;
//!    * [`Step::Issue`]: produce this side's evidence for the [`IssueRequest`] and hand it
//!      to [`Exchange::provide_evidence`];
//!    * [`Step::Done`]: the exchange succeeded; [`Exchange::into_verified`] gives the peer.
//!
//! When any call returns an error the exchange has failed: the driver writes the output
//! that is still pending (the failure VERDICT, when the protocol calls for one), best
//! effort, and closes the connection.

use crate::session::{self, SessionKeyCheck};
use crate::wire::{self, EvidenceFrame, Hello, Verdict, VerdictCode};
use crate::{AtlsConfig, AtlsError, VerifiedPeer};
use asterism_attestation::{ReportData, Role};
use std::net::SocketAddr;
use std::sync::Arc;

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Read at most this many bytes (at least 1) and [`Exchange::feed`] them.
    Read(usize),
    /// Produce this side's evidence and [`Exchange::provide_evidence`] it.
    Issue(IssueRequest),
    /// The exchange succeeded.
    Done,
}

/// What evidence this side must produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueRequest {
    /// This side's role.
    pub role: Role,
    /// The connection's exporter value `E`.
    pub exporter: [u8; 32],
    /// Whether to answer with session-key evidence (the peer announced
    /// ACCEPTS_SESSION_KEY and this side attests with a session key) rather than
    /// per-connection evidence over `report_data(role)`.
    pub session_key: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Client only: its HELLO is out, its evidence is to be issued.
    IssueFirst,
    AwaitPeerHello,
    /// Server only: its HELLO is out, its evidence is to be issued.
    IssueAfterHello,
    AwaitPeerEvidence,
    AwaitPeerVerdict,
    Done,
    Failed,
}

/// One side of one aTLS exchange. See the module documentation.
pub struct Exchange {
    role: Role,
    cfg: Arc<AtlsConfig>,
    exporter: [u8; 32],
    remote_addr: Option<SocketAddr>,
    now_unix: u64,
    state: State,
    out: Vec<u8>,
    reader: FrameReader,
    peer: Option<Hello>,
    sends: bool,
    verified: Option<VerifiedPeer>,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("role", &self.role)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Exchange {
    /// A new exchange for `role` on a connection whose exporter value is `exporter`.
    /// `now_unix` (seconds since the Unix epoch) is what session-key expiry is checked
    /// against.
    pub fn new(
        role: Role,
        cfg: Arc<AtlsConfig>,
        exporter: [u8; 32],
        remote_addr: Option<SocketAddr>,
        now_unix: u64,
    ) -> Self {
        let mut x = Self {
            role,
            cfg,
            exporter,
            remote_addr,
            now_unix,
            state: State::AwaitPeerHello,
            out: Vec::new(),
            reader: FrameReader::default(),
            peer: None,
            sends: false,
            verified: None,
        };
        if role == Role::Client {
            // A version-1 client speaks first and does not wait: HELLO, then its evidence.
            x.sends = x.cfg.attests_per_connection();
            x.push_hello(wire::VERSION);
            if x.sends {
                x.state = State::IssueFirst;
            }
        }
        x
    }

    fn requires(&self) -> bool {
        !self.cfg.validators.is_empty()
    }

    fn push_hello(&mut self, version: u8) {
        let mut flags = 0;
        if self.sends {
            flags |= wire::FLAG_SENDS_EVIDENCE;
        }
        if self.requires() {
            flags |= wire::FLAG_REQUIRES_EVIDENCE | wire::FLAG_ACCEPTS_SESSION_KEY;
        }
        // Encoding a 2-byte payload cannot fail.
        let _ = wire::encode_hello(&mut self.out, Hello { version, flags });
    }

    /// Bytes to send to the peer, in order. Take them before every [`Exchange::step`] and
    /// after every error.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Whether the machine still waits for the peer's HELLO (a server's first frame).
    #[must_use]
    pub fn awaits_peer_hello(&self) -> bool {
        self.state == State::AwaitPeerHello
    }

    /// Whether this side's unsent frames may wait for its next ones: a server that sends no
    /// evidence, now reading the client's EVIDENCE. A client sends its evidence right behind
    /// its HELLO without waiting for the server's (docs/atls.md §3), so the server's HELLO can
    /// go out with its VERDICT, in one write.
    #[must_use]
    pub fn output_can_wait(&self) -> bool {
        self.role == Role::Server && !self.sends && self.state == State::AwaitPeerEvidence
    }

    /// What to do next.
    pub fn step(&mut self) -> Result<Step, AtlsError> {
        match self.state {
            State::IssueFirst | State::IssueAfterHello => Ok(Step::Issue(IssueRequest {
                role: self.role,
                exporter: self.exporter,
                session_key: self.role == Role::Server
                    && self.cfg.session_key.is_some()
                    && self.peer.is_some_and(Hello::accepts_session_key),
            })),
            State::AwaitPeerHello | State::AwaitPeerEvidence | State::AwaitPeerVerdict => {
                Ok(Step::Read(self.reader.wanted()))
            }
            State::Done => Ok(Step::Done),
            State::Failed => Err(AtlsError::Protocol("the exchange already failed".into())),
        }
    }

    /// Hands bytes read from the peer to the machine; at most what [`Step::Read`] asked.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), AtlsError> {
        let result = (|| {
            while !bytes.is_empty() {
                let expect = match self.state {
                    State::AwaitPeerHello => wire::FRAME_HELLO,
                    State::AwaitPeerEvidence => wire::FRAME_EVIDENCE,
                    State::AwaitPeerVerdict => wire::FRAME_VERDICT,
                    _ => {
                        return Err(AtlsError::Protocol(
                            "bytes fed while the exchange reads nothing".into(),
                        ));
                    }
                };
                let cap = match expect {
                    wire::FRAME_HELLO => 2,
                    wire::FRAME_EVIDENCE => self.cfg.max_frame_len,
                    _ => 1 + wire::MAX_REASON_LEN,
                };
                let used = self.reader.push(bytes, expect, cap)?;
                bytes = bytes.get(used..).unwrap_or_default();
                if let Some((kind, payload)) = self.reader.take_frame() {
                    self.on_frame(kind, &payload)?;
                }
            }
            Ok(())
        })();
        result.map_err(|e| self.fail(e))
    }

    /// Hands this side's evidence (of `variant`) to the machine, after [`Step::Issue`].
    pub fn provide_evidence(&mut self, variant: &str, evidence: &[u8]) -> Result<(), AtlsError> {
        let result = (|| {
            if !matches!(self.state, State::IssueFirst | State::IssueAfterHello) {
                return Err(AtlsError::Protocol("evidence provided out of turn".into()));
            }
            wire::encode_evidence(&mut self.out, variant, evidence)?;
            if self.state == State::IssueFirst {
                self.state = State::AwaitPeerHello;
                Ok(())
            } else {
                self.after_own_evidence()
            }
        })();
        result.map_err(|e| self.fail(e))
    }

    /// Fails the exchange with `e` (for example when issuing evidence failed) and queues
    /// the failure VERDICT the protocol calls for.
    pub fn abort(&mut self, e: AtlsError) -> AtlsError {
        self.fail(e)
    }

    /// The verified peer, once [`Step::Done`]; `None` when this side does not verify.
    pub fn into_verified(self) -> Option<VerifiedPeer> {
        match self.state {
            State::Done => self.verified,
            _ => None,
        }
    }

    fn on_frame(&mut self, kind: u8, payload: &[u8]) -> Result<(), AtlsError> {
        if kind == wire::FRAME_VERDICT && self.state != State::AwaitPeerVerdict {
            // A VERDICT in place of a HELLO or an EVIDENCE frame: the peer aborts.
            let verdict = Verdict::decode(payload)?;
            if verdict.code == VerdictCode::Accepted {
                return Err(AtlsError::Protocol("unexpected ACCEPTED verdict".into()));
            }
            return Err(AtlsError::RefusedByPeer {
                code: verdict.code,
                reason: verdict.reason,
            });
        }
        match self.state {
            State::AwaitPeerHello => self.on_hello(payload),
            State::AwaitPeerEvidence => {
                let frame = EvidenceFrame::decode(payload)?;
                if self.requires() {
                    self.verified = Some(self.verify(&frame)?);
                }
                // A side that does not verify drops the evidence unexamined.
                self.finish_local()
            }
            State::AwaitPeerVerdict => {
                let verdict = Verdict::decode(payload)?;
                if verdict.code != VerdictCode::Accepted {
                    return Err(AtlsError::RefusedByPeer {
                        code: verdict.code,
                        reason: verdict.reason,
                    });
                }
                self.state = State::Done;
                Ok(())
            }
            _ => Err(AtlsError::Protocol("frame out of turn".into())),
        }
    }

    fn on_hello(&mut self, payload: &[u8]) -> Result<(), AtlsError> {
        let hello = Hello::decode(payload)?;
        match self.role {
            Role::Client => {
                // The server names the version it chose; a version-1 client speaks only 1.
                if hello.version != wire::VERSION {
                    return Err(AtlsError::UnsupportedVersion(hello.version));
                }
                hello.check_flags()?;
                self.peer = Some(hello);
                if hello.requires_evidence() && !self.sends {
                    return Err(AtlsError::NoIssuer);
                }
                if self.requires() && !hello.sends_evidence() {
                    return Err(AtlsError::EvidenceRequired);
                }
                if hello.sends_evidence() {
                    self.state = State::AwaitPeerEvidence;
                    Ok(())
                } else {
                    self.finish_local()
                }
            }
            Role::Server => {
                // Negotiation: the client names the highest version it speaks; the server
                // answers with the highest it shares (here always 1) or refuses.
                if hello.version < wire::VERSION {
                    return Err(AtlsError::UnsupportedVersion(hello.version));
                }
                let hello = if hello.version == wire::VERSION {
                    hello.check_flags()?;
                    hello
                } else {
                    // A newer client's flags are read under version 1: unknown bits
                    // are dropped, not refused, so that negotiation can succeed.
                    Hello {
                        version: wire::VERSION,
                        flags: hello.flags & wire::KNOWN_FLAGS,
                    }
                };
                self.peer = Some(hello);
                // Attest only to a peer that asks, and only in a form it accepts.
                self.sends = hello.requires_evidence()
                    && (self.cfg.attests_per_connection()
                        || (self.cfg.session_key.is_some() && hello.accepts_session_key()));
                self.push_hello(wire::VERSION);
                if hello.requires_evidence() && !self.sends {
                    return Err(AtlsError::NoIssuer);
                }
                if self.requires() && !hello.sends_evidence() {
                    return Err(AtlsError::EvidenceRequired);
                }
                if self.sends {
                    self.state = State::IssueAfterHello;
                    Ok(())
                } else {
                    self.after_own_evidence()
                }
            }
        }
    }

    /// Server: its HELLO (and evidence, if any) are out; now the client's evidence.
    fn after_own_evidence(&mut self) -> Result<(), AtlsError> {
        if self.peer.is_some_and(Hello::sends_evidence) {
            self.state = State::AwaitPeerEvidence;
            Ok(())
        } else {
            self.finish_local()
        }
    }

    /// Steps 5 and 6: this side's VERDICT, then the peer's.
    fn finish_local(&mut self) -> Result<(), AtlsError> {
        if self.requires() {
            // Only reachable with a verified peer: every path that sets `requires` and
            // gets here went through `verify`, or was refused as EVIDENCE_REQUIRED.
            wire::encode_verdict(&mut self.out, VerdictCode::Accepted, "")?;
        }
        self.state = if self.peer.is_some_and(Hello::requires_evidence) {
            State::AwaitPeerVerdict
        } else {
            State::Done
        };
        Ok(())
    }

    fn verify(&self, frame: &EvidenceFrame) -> Result<VerifiedPeer, AtlsError> {
        let peer_role = self.role.peer();
        let result = if frame.variant == session::VARIANT {
            session::verify(
                &frame.evidence,
                &SessionKeyCheck {
                    validators: &self.cfg.validators,
                    role: peer_role,
                    exporter: &self.exporter,
                    now_unix: self.now_unix,
                    max_validity: self.cfg.max_session_key_validity,
                },
            )
        } else {
            let validator = self
                .cfg
                .validators
                .iter()
                .find(|v| v.variant() == frame.variant)
                .ok_or_else(|| AtlsError::UnknownVariant(frame.variant.clone()))?;
            // The peer attests in its own role: the opposite of ours.
            let expected = ReportData::atls(peer_role, &self.exporter);
            validator
                .validate(&frame.evidence, &expected)
                .map_err(AtlsError::Rejected)
        };
        match result {
            Ok(evidence) => {
                // A client's record of whom it trusted is this line, at info. A server
                // verifies every connection, and its service logs what it grants or
                // refuses with the same identity; one line per request is enough there.
                macro_rules! verified {
                    ($level:expr) => {
                        tracing::event!(
                            $level,
                            variant = evidence.variant(),
                            identity = evidence.identity(),
                            session_key = frame.variant == session::VARIANT,
                            peer = ?self.remote_addr,
                            "peer evidence verified"
                        )
                    };
                }
                match self.role {
                    Role::Client => verified!(tracing::Level::INFO),
                    Role::Server => verified!(tracing::Level::DEBUG),
                }
                Ok(VerifiedPeer {
                    evidence: evidence.into(),
                    remote_addr: self.remote_addr,
                })
            }
            Err(e) => {
                // The full explanation (expected and observed values) stays here; the
                // peer's VERDICT carries a redacted reason.
                tracing::warn!(variant = %frame.variant, peer = ?self.remote_addr, error = %e, "peer evidence rejected");
                Err(e)
            }
        }
    }

    /// Marks the exchange failed and queues the failure VERDICT, unless the failure
    /// leaves nobody to tell: the peer's own refusal, the peer's close, or I/O.
    fn fail(&mut self, e: AtlsError) -> AtlsError {
        if self.state != State::Failed {
            self.state = State::Failed;
            if let Some((code, reason)) = e.verdict() {
                let _ = wire::encode_verdict(&mut self.out, code, &reason);
            }
        }
        e
    }
}

/// Collects one frame: the 5-byte header, then exactly the payload it declares.
#[derive(Default)]
struct FrameReader {
    header: [u8; wire::HEADER_LEN],
    have: usize,
    /// Type and declared length, once the header is complete.
    kind_len: Option<(u8, usize)>,
    payload: Vec<u8>,
}

impl FrameReader {
    fn wanted(&self) -> usize {
        match self.kind_len {
            None => wire::HEADER_LEN - self.have,
            Some((_, len)) => len - self.payload.len(),
        }
        .max(1)
    }

    /// Consumes bytes of the current frame from `bytes`; returns how many it used.
    fn push(&mut self, bytes: &[u8], expect: u8, cap: usize) -> Result<usize, AtlsError> {
        let Some((_, len)) = self.kind_len else {
            let n = bytes.len().min(wire::HEADER_LEN - self.have);
            if let (Some(dst), Some(src)) = (
                self.header.get_mut(self.have..self.have + n),
                bytes.get(..n),
            ) {
                dst.copy_from_slice(src);
            }
            self.have += n;
            if self.have == wire::HEADER_LEN {
                let [kind, l0, l1, l2, l3] = self.header;
                let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
                // A VERDICT may stand in for any frame (the peer aborts).
                let (want, cap) = if kind == wire::FRAME_VERDICT {
                    (wire::FRAME_VERDICT, 1 + wire::MAX_REASON_LEN)
                } else {
                    (expect, cap)
                };
                if kind != want {
                    return Err(AtlsError::Protocol(format!(
                        "expected frame type {expect:#04x}, got {kind:#04x}"
                    )));
                }
                // Checked on the header, before anything is allocated.
                if len > cap {
                    return Err(AtlsError::FrameTooLarge { claimed: len, cap });
                }
                self.kind_len = Some((kind, len));
                self.payload = Vec::with_capacity(len);
            }
            return Ok(n);
        };
        let n = bytes.len().min(len - self.payload.len());
        self.payload
            .extend_from_slice(bytes.get(..n).unwrap_or_default());
        Ok(n)
    }

    fn take_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        match self.kind_len {
            Some((kind, len)) if self.payload.len() == len => {
                self.kind_len = None;
                self.have = 0;
                Some((kind, std::mem::take(&mut self.payload)))
            }
            _ => None,
        }
    }
}
