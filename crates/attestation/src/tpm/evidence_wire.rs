//! The `tpm-quote` evidence decoder: one pass over the wire bytes that checks the encoding is
//! canonical while it reads, borrowing every field from the input.
//!
//! Canonical here means exactly the bytes an ordinary protobuf encoder (prost, Go's, C++'s)
//! writes for the decoded message: fields in number order; a scalar or `bytes` field left
//! out when it holds its default (0 or empty); an `optional` field present exactly when set;
//! repeated fields consecutive; minimal varints; no unknown fields, no packed encoding, no
//! groups. Anything else is [`EvidenceError::NonCanonical`] (a valid but other encoding) or
//! [`EvidenceError::Protobuf`] (not protobuf at all: a truncated varint or length).
//!
//! The earlier decoder decoded with prost and then re-encoded the whole message to compare
//! it with the input, which allocated the message twice and each of the 24 PCR values on
//! the way (`docs/performance.md`). The prost message types stay the encoder, and the fuzz
//! target `evidence` and the tests in `tests/it/tpm_quote.rs` hold this decoder to them: for
//! every input, it accepts exactly what decode-then-re-encode accepts, with the same result.

use super::evidence::{
    AwsSnp, AzureSnp, AzureTdx, EvidenceError, MAX_CERT_CHAIN, MAX_EVIDENCE_SIZE, PlatformKind,
    QuoteEvidence,
};

/// Protobuf wire types this message uses.
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// A cursor over protobuf wire bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// A varint in its shortest form (no trailing zero byte), at most 10 bytes, fitting
    /// 64 bits.
    fn varint(&mut self) -> Result<u64, EvidenceError> {
        let mut value: u64 = 0;
        for (i, &byte) in self.buf.iter().enumerate().take(10) {
            let part = u64::from(byte & 0x7f);
            if i == 9 && byte > 1 {
                return Err(protobuf("varint overflows 64 bits"));
            }
            value |= part << (7 * i);
            if byte & 0x80 == 0 {
                if i > 0 && byte == 0 {
                    return Err(EvidenceError::NonCanonical);
                }
                self.buf = self.buf.get(i + 1..).unwrap_or_default();
                return Ok(value);
            }
        }
        Err(protobuf(if self.buf.len() < 10 {
            "truncated varint"
        } else {
            "varint longer than 10 bytes"
        }))
    }

    /// The next field's number and wire type; `None` at the end.
    fn key(&mut self) -> Result<Option<(u32, u8)>, EvidenceError> {
        if self.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| protobuf("field number too large"))?;
        if field == 0 {
            return Err(protobuf("field number 0"));
        }
        // The mask keeps three bits, so the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation)]
        let wire_type = (key & 7) as u8;
        Ok(Some((field, wire_type)))
    }

    /// A length-delimited payload.
    fn bytes(&mut self) -> Result<&'a [u8], EvidenceError> {
        let len = usize::try_from(self.varint()?).map_err(|_| protobuf("length too large"))?;
        if len > self.buf.len() {
            return Err(protobuf("length beyond the end of the message"));
        }
        let (payload, rest) = self.buf.split_at(len);
        self.buf = rest;
        Ok(payload)
    }

    /// A `uint32` field's value.
    fn uint32(&mut self) -> Result<u32, EvidenceError> {
        let v = self.varint()?;
        // A uint32 is written as its 32-bit value: a larger varint decodes (truncated) but is
        // not what an encoder writes.
        u32::try_from(v).map_err(|_| EvidenceError::NonCanonical)
    }
}

fn protobuf(what: &str) -> EvidenceError {
    EvidenceError::Protobuf(what.to_owned())
}

/// Field order within one message: strictly ascending, except that a repeated field may
/// follow itself.
struct Order {
    last: u32,
}

impl Order {
    fn new() -> Self {
        Self { last: 0 }
    }

    fn next(&mut self, field: u32, repeated: bool) -> Result<(), EvidenceError> {
        if field < self.last || (field == self.last && !repeated) {
            return Err(EvidenceError::NonCanonical);
        }
        self.last = field;
        Ok(())
    }
}

/// Checks a field's wire type, and that a wire type this message never uses (packed, fixed,
/// groups) is refused as non-canonical.
fn expect(wire_type: u8, want: u8) -> Result<(), EvidenceError> {
    if wire_type == want {
        Ok(())
    } else {
        Err(EvidenceError::NonCanonical)
    }
}

/// A non-optional `bytes` field: an encoder leaves an empty one out.
fn plain_bytes<'a>(r: &mut Reader<'a>, wire_type: u8) -> Result<&'a [u8], EvidenceError> {
    expect(wire_type, LEN)?;
    let b = r.bytes()?;
    if b.is_empty() {
        return Err(EvidenceError::NonCanonical);
    }
    Ok(b)
}

/// A non-optional `uint32` field: an encoder leaves 0 out.
fn plain_uint32(r: &mut Reader<'_>, wire_type: u8) -> Result<u32, EvidenceError> {
    expect(wire_type, VARINT)?;
    match r.uint32()? {
        0 => Err(EvidenceError::NonCanonical),
        v => Ok(v),
    }
}

/// Decodes `TpmQuoteEvidence` bytes (the size cap is checked by the caller).
fn decode(bytes: &[u8]) -> Result<QuoteEvidence, EvidenceError> {
    let mut r = Reader::new(bytes);
    let mut order = Order::new();
    let mut version = 0;
    let mut attest: &[u8] = &[];
    let mut signature: &[u8] = &[];
    let mut pcrs: Vec<(u32, &[u8])> = Vec::with_capacity(24);
    let mut ak_public: &[u8] = &[];
    let mut chain: Vec<&[u8]> = Vec::new();
    let mut event_log = None;
    let mut platform = None;
    while let Some((field, wire_type)) = r.key()? {
        order.next(field, matches!(field, 4 | 6))?;
        match field {
            1 => version = plain_uint32(&mut r, wire_type)?,
            2 => attest = plain_bytes(&mut r, wire_type)?,
            3 => signature = plain_bytes(&mut r, wire_type)?,
            4 => {
                expect(wire_type, LEN)?;
                pcrs.push(pcr_value(r.bytes()?)?);
            }
            5 => ak_public = plain_bytes(&mut r, wire_type)?,
            6 => {
                expect(wire_type, LEN)?;
                // Counted as they come, so a hostile message cannot make a long list.
                if chain.len() == MAX_CERT_CHAIN {
                    return Err(EvidenceError::CertChainTooLong(MAX_CERT_CHAIN + 1));
                }
                chain.push(r.bytes()?);
            }
            7 => {
                expect(wire_type, LEN)?;
                event_log = Some(r.bytes()?);
            }
            8 => {
                expect(wire_type, LEN)?;
                platform = Some(platform_report(r.bytes()?)?);
            }
            _ => return Err(EvidenceError::NonCanonical),
        }
    }
    QuoteEvidence::from_parts(
        version, platform, attest, signature, ak_public, chain, &pcrs, event_log,
    )
}

/// One `PcrValue`: its index (left out when 0) and value.
fn pcr_value(body: &[u8]) -> Result<(u32, &[u8]), EvidenceError> {
    let mut r = Reader::new(body);
    let mut order = Order::new();
    let (mut index, mut value): (u32, &[u8]) = (0, &[]);
    while let Some((field, wire_type)) = r.key()? {
        order.next(field, false)?;
        match field {
            1 => index = plain_uint32(&mut r, wire_type)?,
            2 => value = plain_bytes(&mut r, wire_type)?,
            _ => return Err(EvidenceError::NonCanonical),
        }
    }
    Ok((index, value))
}

/// A `PlatformReport`: `None` inside when no kind is set (refused by the caller), or the
/// one kind its oneof holds.
fn platform_report(body: &[u8]) -> Result<Option<PlatformKind>, EvidenceError> {
    let mut r = Reader::new(body);
    let Some((field, wire_type)) = r.key()? else {
        return Ok(None);
    };
    expect(wire_type, LEN)?;
    let inner = r.bytes()?;
    // A oneof is written once: a second field would be a second kind (or the same again).
    if !r.is_empty() {
        return Err(EvidenceError::NonCanonical);
    }
    let kind = match field {
        1 => {
            let (hcl_report, certs) = report_and_certs(inner)?;
            PlatformKind::AzureSevSnp(AzureSnp { hcl_report, certs })
        }
        2 => {
            let mut r = Reader::new(inner);
            let mut order = Order::new();
            let (mut quote, mut runtime_data): (&[u8], &[u8]) = (&[], &[]);
            while let Some((field, wire_type)) = r.key()? {
                order.next(field, false)?;
                match field {
                    1 => quote = plain_bytes(&mut r, wire_type)?,
                    2 => runtime_data = plain_bytes(&mut r, wire_type)?,
                    _ => return Err(EvidenceError::NonCanonical),
                }
            }
            PlatformKind::AzureTdx(AzureTdx {
                quote: quote.to_vec(),
                runtime_data: runtime_data.to_vec(),
            })
        }
        3 => {
            let (report, certs) = report_and_certs(inner)?;
            PlatformKind::AwsSevSnp(AwsSnp { report, certs })
        }
        _ => return Err(EvidenceError::NonCanonical),
    };
    Ok(Some(kind))
}

/// The shape both SEV-SNP kinds share: `bytes report = 1; repeated bytes certs = 2;`.
fn report_and_certs(body: &[u8]) -> Result<(Vec<u8>, Vec<Vec<u8>>), EvidenceError> {
    let mut r = Reader::new(body);
    let mut order = Order::new();
    let mut report: &[u8] = &[];
    let mut certs = Vec::new();
    while let Some((field, wire_type)) = r.key()? {
        order.next(field, field == 2)?;
        match field {
            1 => report = plain_bytes(&mut r, wire_type)?,
            2 => {
                expect(wire_type, LEN)?;
                certs.push(r.bytes()?.to_vec());
            }
            _ => return Err(EvidenceError::NonCanonical),
        }
    }
    Ok((report.to_vec(), certs))
}

impl QuoteEvidence {
    /// Decodes and parses evidence bytes (see the module documentation for the rules): one
    /// pass that checks the encoding is canonical as it reads (this module).
    pub fn decode(bytes: &[u8]) -> Result<Self, EvidenceError> {
        if bytes.len() > MAX_EVIDENCE_SIZE {
            return Err(EvidenceError::TooLarge(bytes.len()));
        }
        decode(bytes)
    }
}
