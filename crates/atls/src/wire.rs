//! The aTLS v1 frames (see `docs/atls.md`). Encoding and decoding only; no I/O policy.
//!
//! ```text
//! frame    = type (1 byte) || length (4 bytes, big-endian) || payload (length bytes)
//! HELLO    = version (1) || flags (1)
//! EVIDENCE = variant length (1) || variant (ASCII) || evidence bytes
//! VERDICT  = code (1) || reason (UTF-8, at most 512 bytes)
//! ```

use crate::AtlsError;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Frame type of HELLO.
pub const FRAME_HELLO: u8 = 0x01;
/// Frame type of EVIDENCE.
pub const FRAME_EVIDENCE: u8 = 0x02;
/// Frame type of VERDICT.
pub const FRAME_VERDICT: u8 = 0x03;

/// The only protocol version this implementation speaks.
pub const VERSION: u8 = 1;
/// HELLO flag: this side sends an EVIDENCE frame after its HELLO.
pub const FLAG_SENDS_EVIDENCE: u8 = 0x01;
/// HELLO flag: this side requires the peer's evidence and answers it with a VERDICT.
pub const FLAG_REQUIRES_EVIDENCE: u8 = 0x02;
/// HELLO flag: this side accepts session-key evidence (`docs/atls.md` §4b) from the peer.
pub const FLAG_ACCEPTS_SESSION_KEY: u8 = 0x04;
/// Every flag version 1 defines.
pub const KNOWN_FLAGS: u8 = FLAG_SENDS_EVIDENCE | FLAG_REQUIRES_EVIDENCE | FLAG_ACCEPTS_SESSION_KEY;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 5;
/// Longest verdict reason, in bytes.
pub const MAX_REASON_LEN: usize = 512;
/// Longest variant name, in bytes.
pub const MAX_VARIANT_LEN: usize = 64;

/// The first frame of each side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
}

impl Hello {
    /// Whether the sender announced an EVIDENCE frame.
    pub fn sends_evidence(self) -> bool {
        self.flags & FLAG_SENDS_EVIDENCE != 0
    }

    /// Whether the sender requires evidence and will answer with a VERDICT.
    pub fn requires_evidence(self) -> bool {
        self.flags & FLAG_REQUIRES_EVIDENCE != 0
    }

    /// Whether the sender accepts session-key evidence.
    pub fn accepts_session_key(self) -> bool {
        self.flags & FLAG_ACCEPTS_SESSION_KEY != 0
    }

    /// Refuses flags this version does not define (for a HELLO read under version 1).
    pub fn check_flags(self) -> Result<(), AtlsError> {
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(AtlsError::Protocol(format!(
                "HELLO has unknown flags {:#04x}",
                self.flags
            )));
        }
        Ok(())
    }

    /// Decodes a HELLO payload (exactly 2 bytes). Flags are checked by the caller, under
    /// the negotiated version ([`Hello::check_flags`]).
    pub fn decode(payload: &[u8]) -> Result<Self, AtlsError> {
        match *payload {
            [version, flags] => Ok(Self { version, flags }),
            _ => Err(AtlsError::Protocol(format!(
                "HELLO payload is {} bytes, want 2",
                payload.len()
            ))),
        }
    }
}

/// Verdict codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum VerdictCode {
    /// Evidence verified; the connection proceeds.
    Accepted = 0,
    /// Evidence did not verify.
    Rejected = 1,
    /// The verifier requires evidence, but the peer announced none.
    EvidenceRequired = 2,
    /// The peer's HELLO carried an unsupported version.
    UnsupportedVersion = 3,
    /// A frame was malformed or out of order.
    ProtocolError = 4,
    /// No validator for the evidence variant.
    UnknownVariant = 5,
    /// The verifier failed internally (or could not produce its own evidence).
    InternalError = 6,
    /// This side cannot produce evidence the peer's HELLO requires (no issuer, or no form
    /// the peer accepts).
    CannotAttest = 7,
}

impl VerdictCode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Accepted,
            1 => Self::Rejected,
            2 => Self::EvidenceRequired,
            3 => Self::UnsupportedVersion,
            4 => Self::ProtocolError,
            5 => Self::UnknownVariant,
            6 => Self::InternalError,
            7 => Self::CannotAttest,
            _ => return None,
        })
    }
}

/// The answer of a verifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Outcome.
    pub code: VerdictCode,
    /// Short, non-secret reason (empty on acceptance).
    pub reason: String,
}

impl Verdict {
    /// Decodes a VERDICT payload.
    pub fn decode(payload: &[u8]) -> Result<Self, AtlsError> {
        let (&code, reason) = payload
            .split_first()
            .ok_or_else(|| AtlsError::Protocol("empty VERDICT".into()))?;
        let code = VerdictCode::from_u8(code)
            .ok_or_else(|| AtlsError::Protocol(format!("unknown verdict code {code}")))?;
        if reason.len() > MAX_REASON_LEN {
            return Err(AtlsError::Protocol("VERDICT reason too long".into()));
        }
        let reason = String::from_utf8(reason.to_vec())
            .map_err(|_| AtlsError::Protocol("VERDICT reason is not UTF-8".into()))?;
        Ok(Self { code, reason })
    }
}

/// Evidence as carried in an EVIDENCE frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceFrame {
    /// Variant name, printable ASCII.
    pub variant: String,
    /// The variant's evidence bytes.
    pub evidence: Vec<u8>,
}

impl EvidenceFrame {
    /// Decodes an EVIDENCE payload.
    pub fn decode(payload: &[u8]) -> Result<Self, AtlsError> {
        let (&len, rest) = payload
            .split_first()
            .ok_or_else(|| AtlsError::Protocol("empty EVIDENCE".into()))?;
        let len = usize::from(len);
        if len == 0 || len > MAX_VARIANT_LEN || rest.len() < len {
            return Err(AtlsError::Protocol(
                "EVIDENCE variant length invalid".into(),
            ));
        }
        let (variant, evidence) = rest.split_at(len);
        if !variant.iter().all(|b| b.is_ascii_graphic()) {
            return Err(AtlsError::Protocol(
                "EVIDENCE variant is not printable ASCII".into(),
            ));
        }
        let variant = String::from_utf8(variant.to_vec())
            .map_err(|_| AtlsError::Protocol("EVIDENCE variant is not ASCII".into()))?;
        Ok(Self {
            variant,
            evidence: evidence.to_vec(),
        })
    }
}

/// Appends one frame to `out`.
pub fn encode_frame(out: &mut Vec<u8>, kind: u8, payload: &[&[u8]]) -> Result<(), AtlsError> {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).map_err(|_| AtlsError::Protocol("frame too long".into()))?;
    out.reserve(HEADER_LEN + len as usize);
    out.push(kind);
    out.extend_from_slice(&len.to_be_bytes());
    for p in payload {
        out.extend_from_slice(p);
    }
    Ok(())
}

/// Appends a HELLO frame.
pub fn encode_hello(out: &mut Vec<u8>, hello: Hello) -> Result<(), AtlsError> {
    encode_frame(out, FRAME_HELLO, &[&[hello.version, hello.flags]])
}

/// Appends an EVIDENCE frame.
pub fn encode_evidence(out: &mut Vec<u8>, variant: &str, evidence: &[u8]) -> Result<(), AtlsError> {
    let len = u8::try_from(variant.len())
        .ok()
        .filter(|l| *l > 0 && usize::from(*l) <= MAX_VARIANT_LEN)
        .ok_or_else(|| AtlsError::Protocol(format!("variant name {variant:?} invalid")))?;
    encode_frame(out, FRAME_EVIDENCE, &[&[len], variant.as_bytes(), evidence])
}

/// Appends a VERDICT frame; the reason is cut at a character boundary to fit.
pub fn encode_verdict(out: &mut Vec<u8>, code: VerdictCode, reason: &str) -> Result<(), AtlsError> {
    let mut end = reason.len().min(MAX_REASON_LEN);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = reason.get(..end).unwrap_or_default();
    encode_frame(out, FRAME_VERDICT, &[&[code as u8], reason.as_bytes()])
}

/// Reads one frame of the expected type. The declared length is checked against `cap`
/// *before* anything is allocated.
async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    want: u8,
    cap: usize,
) -> Result<Vec<u8>, AtlsError> {
    let mut header = [0u8; HEADER_LEN];
    r.read_exact(&mut header).await.map_err(AtlsError::read)?;
    let [kind, l0, l1, l2, l3] = header;
    let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
    if kind != want {
        return Err(AtlsError::Protocol(format!(
            "expected frame type {want:#04x}, got {kind:#04x}"
        )));
    }
    if len > cap {
        return Err(AtlsError::FrameTooLarge { claimed: len, cap });
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.map_err(AtlsError::read)?;
    Ok(payload)
}

/// Reads a HELLO frame.
pub async fn read_hello<R: AsyncRead + Unpin>(r: &mut R) -> Result<Hello, AtlsError> {
    let hello = Hello::decode(&read_frame(r, FRAME_HELLO, 2).await?)?;
    hello.check_flags()?;
    Ok(hello)
}

/// Reads an EVIDENCE frame of at most `cap` payload bytes.
pub async fn read_evidence<R: AsyncRead + Unpin>(
    r: &mut R,
    cap: usize,
) -> Result<EvidenceFrame, AtlsError> {
    EvidenceFrame::decode(&read_frame(r, FRAME_EVIDENCE, cap).await?)
}

/// Reads a VERDICT frame.
pub async fn read_verdict<R: AsyncRead + Unpin>(r: &mut R) -> Result<Verdict, AtlsError> {
    Verdict::decode(&read_frame(r, FRAME_VERDICT, 1 + MAX_REASON_LEN).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let mut buf = Vec::new();
        encode_hello(
            &mut buf,
            Hello {
                version: 1,
                flags: FLAG_SENDS_EVIDENCE,
            },
        )
        .unwrap();
        encode_evidence(&mut buf, "v", b"abc").unwrap();
        encode_verdict(&mut buf, VerdictCode::Rejected, "no").unwrap();
        assert_eq!(&buf[..7], &[1, 0, 0, 0, 2, 1, 1]);
        let mut r = buf.as_slice();
        let h = read_hello(&mut r).await.unwrap();
        assert!(h.sends_evidence() && !h.requires_evidence());
        let e = read_evidence(&mut r, 1024).await.unwrap();
        assert_eq!(
            (e.variant.as_str(), e.evidence.as_slice()),
            ("v", &b"abc"[..])
        );
        let v = read_verdict(&mut r).await.unwrap();
        assert_eq!(v.code, VerdictCode::Rejected);
        assert_eq!(v.reason, "no");
        assert!(r.is_empty());
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_before_reading_its_payload() {
        // Claims 4 GiB − 1 and carries nothing: must fail on the header alone.
        let buf = [FRAME_EVIDENCE, 0xff, 0xff, 0xff, 0xff];
        let mut r = &buf[..];
        match read_evidence(&mut r, 1024).await {
            Err(AtlsError::FrameTooLarge { claimed, cap }) => {
                assert_eq!((claimed, cap), (0xffff_ffff, 1024));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_evidence_cap_is_inclusive() {
        let mut at_cap = Vec::new();
        encode_evidence(&mut at_cap, "v", &[7u8; 1022]).unwrap(); // payload 1 + 1 + 1022
        let mut r = at_cap.as_slice();
        assert_eq!(
            read_evidence(&mut r, 1024).await.unwrap().evidence.len(),
            1022
        );
        let mut over = Vec::new();
        encode_evidence(&mut over, "v", &[7u8; 1023]).unwrap();
        let mut r = over.as_slice();
        assert!(matches!(
            read_evidence(&mut r, 1024).await,
            Err(AtlsError::FrameTooLarge {
                claimed: 1025,
                cap: 1024
            })
        ));
    }

    #[tokio::test]
    async fn malformed_frames_are_protocol_errors() {
        for bad in [
            &[FRAME_HELLO, 0, 0, 0, 3, 1, 0, 0][..], // long HELLO
            &[FRAME_HELLO, 0, 0, 0, 2, 1, 0x80][..], // unknown flag
            &[FRAME_VERDICT, 0, 0, 0, 1, 1][..],     // wrong type for HELLO
        ] {
            let mut r = bad;
            assert!(matches!(
                read_hello(&mut r).await,
                Err(AtlsError::Protocol(_)) | Err(AtlsError::FrameTooLarge { .. })
            ));
        }
        let mut r = &[FRAME_EVIDENCE, 0, 0, 0, 2, 5, b'a'][..];
        assert!(matches!(
            read_evidence(&mut r, 100).await,
            Err(AtlsError::Protocol(_))
        ));
        let mut r = &[FRAME_VERDICT, 0, 0, 0, 1, 99][..];
        assert!(matches!(
            read_verdict(&mut r).await,
            Err(AtlsError::Protocol(_))
        ));
    }

    #[test]
    fn verdict_reason_is_truncated_on_a_char_boundary() {
        let mut buf = Vec::new();
        let long = "é".repeat(400); // 800 bytes
        encode_verdict(&mut buf, VerdictCode::Rejected, &long).unwrap();
        let payload = &buf[HEADER_LEN + 1..];
        assert!(payload.len() <= MAX_REASON_LEN);
        assert!(std::str::from_utf8(payload).is_ok());
    }
}
