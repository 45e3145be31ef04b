//! The Intel TDX DCAP quote (versions 4 and 5), parsed with exact sizes: every length field
//! must match the bytes that follow, and nothing may trail the quote.
//!
//! Layout (Intel's `sgx_quote_4.h` and `sgx_quote_5.h`), all integers little-endian:
//!
//! ```text
//! header (48) | [v5: body type (2) | body size (4)] | TD report body (584, 648 or 885)
//! | signature data size (4)
//! | quote signature (64) | attestation key (64)
//! | certification data: type 6 (2) | size (4)
//! |   QE report (384) | QE report signature (64) | QE auth data size (2) | QE auth data
//! |   certification data: type 5 (2) | size (4) | PEM chain: PCK, PCK CA, root
//! ```
//!
//! The attestation key signs the header and the body; the PCK signs the QE report, whose
//! REPORT_DATA binds the attestation key. The PCK chain itself is not signed here: it is
//! checked against Intel's root.

use crate::ValidationError;

/// The largest quote accepted, checked before anything is parsed. Real quotes are about
/// 5 KiB, most of it the PEM chain.
pub const MAX_QUOTE_LEN: usize = 64 * 1024;

const HEADER_LEN: usize = 48;
const TD_REPORT_10_LEN: usize = 584;
const TD_REPORT_15_LEN: usize = 648;
const TD_REPORT_15_EX_LEN: usize = 885;
const QE_REPORT_LEN: usize = 384;

const TEE_TYPE_TDX: u32 = 0x81;
const ATTESTATION_KEY_ECDSA_P256: u16 = 2;
/// Intel's quoting enclave vendor ID.
const INTEL_QE_VENDOR_ID: [u8; 16] = [
    0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9, 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07,
];
const CERT_DATA_QE_REPORT: u16 = 6;
const CERT_DATA_PCK_CHAIN: u16 = 5;

/// Which TD report layout the quote carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TdReportKind {
    /// TDX 1.0 (`TDREPORT` body of a v4 quote, or v5 body type 2), 584 bytes.
    Td10,
    /// TDX 1.5 (v5 body type 3), 648 bytes: adds `TEE_TCB_SVN2` and `MRSERVICETD`.
    Td15,
    /// TDX 1.5 with the service-TD extension (v5 body type 4), 885 bytes. The extension's
    /// fields are covered by the signature but not exposed: no policy reads them.
    Td15Ex,
}

/// The TD report body of a quote, field by field (Intel TDX DCAP quote library, Appendix A).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TdReport {
    /// The layout this report came in.
    pub kind: TdReportKind,
    /// TEE_TCB_SVN: the TDX module's and its components' security versions.
    pub tee_tcb_svn: [u8; 16],
    /// MRSEAM: measurement of the TDX module.
    pub mr_seam: [u8; 48],
    /// MRSIGNERSEAM: signer of the TDX module (zero for Intel's).
    pub mr_signer_seam: [u8; 48],
    /// SEAMATTRIBUTES of the TDX module.
    pub seam_attributes: [u8; 8],
    /// TDATTRIBUTES, a little-endian bit field (bit 0: DEBUG).
    pub td_attributes: [u8; 8],
    /// XFAM: the extended features the TD may use.
    pub xfam: [u8; 8],
    /// MRTD: measurement of the TD's initial contents (the firmware).
    pub mr_td: [u8; 48],
    /// MRCONFIGID: software-defined configuration ID, set by the host at launch.
    pub mr_config_id: [u8; 48],
    /// MROWNER: software-defined ID of the TD's owner.
    pub mr_owner: [u8; 48],
    /// MROWNERCONFIG: software-defined owner configuration.
    pub mr_owner_config: [u8; 48],
    /// RTMR0 to RTMR3: run-time measurement registers.
    pub rtmr: [[u8; 48]; 4],
    /// REPORT_DATA: the 64 bytes the TD asked to be bound into the report.
    pub report_data: [u8; 64],
    /// TEE_TCB_SVN2 (TDX 1.5): the current TCB after a TD-preserving module update.
    pub tee_tcb_svn2: Option<[u8; 16]>,
    /// MRSERVICETD (TDX 1.5): the digest of the service TDs bound to this TD.
    pub mr_service_td: Option<[u8; 48]>,
}

/// A parsed TDX quote, borrowing the bytes it was parsed from.
#[derive(Debug, Clone)]
pub struct TdQuote<'a> {
    version: u16,
    report: TdReport,
    /// Header and body: what the attestation key signs.
    signed: &'a [u8],
    signature: [u8; 64],
    attestation_key: [u8; 64],
    qe_report: [u8; QE_REPORT_LEN],
    qe_report_signature: [u8; 64],
    qe_auth_data: &'a [u8],
    pck_chain_pem: &'a [u8],
    /// Everything the collateral checks depend on besides the collateral itself: the
    /// header, the body's TDX module fields and all signature data but the quote signature.
    chain_inputs: [&'a [u8]; 4],
}

impl<'a> TdQuote<'a> {
    /// Parses a v4 or v5 TDX quote with an ECDSA P-256 attestation key from Intel's QE and
    /// a PCK certificate chain (certification data type 5). Refuses anything else, a
    /// length field that does not match, truncation and trailing bytes.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ValidationError> {
        if bytes.len() > MAX_QUOTE_LEN {
            return Err(malformed(format!(
                "{} bytes, more than the {MAX_QUOTE_LEN} a quote may have",
                bytes.len()
            )));
        }
        let mut r = Reader::new(bytes);
        let header: [u8; HEADER_LEN] = r.array("header")?;
        let mut h = Reader::new(&header);
        let version = h.u16("header.version")?;
        let key_type = h.u16("header.attestation_key_type")?;
        let tee_type = h.u32("header.tee_type")?;
        let _reserved: [u8; 4] = h.array("header.reserved")?;
        let vendor: [u8; 16] = h.array("header.qe_vendor_id")?;
        if key_type != ATTESTATION_KEY_ECDSA_P256 {
            return Err(malformed(format!(
                "attestation key type {key_type}, want 2 (ECDSA P-256)"
            )));
        }
        if tee_type != TEE_TYPE_TDX {
            return Err(malformed(format!(
                "TEE type {tee_type:#x}, want 0x81 (TDX)"
            )));
        }
        if vendor != INTEL_QE_VENDOR_ID {
            return Err(malformed("QE vendor ID is not Intel's".into()));
        }
        let kind = match version {
            4 => TdReportKind::Td10,
            5 => {
                let body_type = r.u16("body.type")?;
                let size = r.u32("body.size")?;
                let (kind, want) = match body_type {
                    2 => (TdReportKind::Td10, TD_REPORT_10_LEN),
                    3 => (TdReportKind::Td15, TD_REPORT_15_LEN),
                    4 => (TdReportKind::Td15Ex, TD_REPORT_15_EX_LEN),
                    other => {
                        return Err(malformed(format!(
                            "v5 body type {other}, want 2, 3 or 4 (a TD report)"
                        )));
                    }
                };
                if usize::try_from(size).ok() != Some(want) {
                    return Err(malformed(format!(
                        "v5 body of type {body_type} says {size} bytes, want {want}"
                    )));
                }
                kind
            }
            other => return Err(malformed(format!("version {other}, want 4 or 5"))),
        };
        let body_start = r.position();
        let body_len = match kind {
            TdReportKind::Td10 => TD_REPORT_10_LEN,
            TdReportKind::Td15 => TD_REPORT_15_LEN,
            TdReportKind::Td15Ex => TD_REPORT_15_EX_LEN,
        };
        let body = r.take(body_len, "TD report")?;
        let report = TdReport::parse(kind, body)?;
        let signed = bytes
            .get(..r.position())
            .ok_or_else(|| malformed("signed region".into()))?;

        let sig_len = r.len_u32("signature data size")?;
        let sig_data = r.take(sig_len, "signature data")?;
        r.finish("quote")?;

        let mut s = Reader::new(sig_data);
        let signature: [u8; 64] = s.array("quote signature")?;
        let attestation_key: [u8; 64] = s.array("attestation key")?;
        let after_signature = sig_data
            .get(64..)
            .ok_or_else(|| malformed("signature data".into()))?;
        let cert_type = s.u16("certification data type")?;
        if cert_type != CERT_DATA_QE_REPORT {
            return Err(malformed(format!(
                "certification data type {cert_type}, want 6 (QE report)"
            )));
        }
        let cert_len = s.len_u32("certification data size")?;
        let cert = s.take(cert_len, "certification data")?;
        s.finish("signature data")?;

        let mut c = Reader::new(cert);
        let qe_report: [u8; QE_REPORT_LEN] = c.array("QE report")?;
        let qe_report_signature: [u8; 64] = c.array("QE report signature")?;
        let auth_len = usize::from(c.u16("QE auth data size")?);
        let qe_auth_data = c.take(auth_len, "QE auth data")?;
        let pck_type = c.u16("QE certification data type")?;
        if pck_type != CERT_DATA_PCK_CHAIN {
            return Err(malformed(format!(
                "QE certification data type {pck_type}, want 5 (PCK certificate chain)"
            )));
        }
        let pck_len = c.len_u32("PCK chain size")?;
        let pck_chain_pem = c.take(pck_len, "PCK chain")?;
        c.finish("certification data")?;

        // The TDX module fields are the first 120 bytes of every TD report layout.
        let module_fields = body
            .get(..120)
            .ok_or_else(|| malformed("TD report".into()))?;
        let svn2: &[u8] = match kind {
            TdReportKind::Td10 => &[],
            _ => body
                .get(TD_REPORT_10_LEN..TD_REPORT_10_LEN + 16)
                .ok_or_else(|| malformed("TD report".into()))?,
        };
        let header_and_type = bytes
            .get(..body_start)
            .ok_or_else(|| malformed("header".into()))?;
        Ok(Self {
            version,
            report,
            signed,
            signature,
            attestation_key,
            qe_report,
            qe_report_signature,
            qe_auth_data,
            pck_chain_pem,
            chain_inputs: [header_and_type, module_fields, svn2, after_signature],
        })
    }

    /// The quote version (4 or 5).
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The TD report body.
    pub fn report(&self) -> &TdReport {
        &self.report
    }

    /// The PCK certificate chain, PEM, as carried in the quote (leaf first).
    pub fn pck_chain_pem(&self) -> &'a [u8] {
        self.pck_chain_pem
    }

    pub(crate) fn signed(&self) -> &'a [u8] {
        self.signed
    }

    pub(crate) fn signature(&self) -> &[u8; 64] {
        &self.signature
    }

    pub(crate) fn attestation_key(&self) -> &[u8; 64] {
        &self.attestation_key
    }

    pub(crate) fn qe_report(&self) -> &[u8; QE_REPORT_LEN] {
        &self.qe_report
    }

    pub(crate) fn qe_report_signature(&self) -> &[u8; 64] {
        &self.qe_report_signature
    }

    pub(crate) fn qe_auth_data(&self) -> &'a [u8] {
        self.qe_auth_data
    }

    pub(crate) fn chain_inputs(&self) -> &[&'a [u8]; 4] {
        &self.chain_inputs
    }
}

impl TdReport {
    /// Parses a TD report body of the given layout; `body` must be exactly its size.
    pub fn parse(kind: TdReportKind, body: &[u8]) -> Result<Self, ValidationError> {
        let mut r = Reader::new(body);
        let mut report = TdReport {
            kind,
            tee_tcb_svn: r.array("tee_tcb_svn")?,
            mr_seam: r.array("mr_seam")?,
            mr_signer_seam: r.array("mr_signer_seam")?,
            seam_attributes: r.array("seam_attributes")?,
            td_attributes: r.array("td_attributes")?,
            xfam: r.array("xfam")?,
            mr_td: r.array("mr_td")?,
            mr_config_id: r.array("mr_config_id")?,
            mr_owner: r.array("mr_owner")?,
            mr_owner_config: r.array("mr_owner_config")?,
            rtmr: [
                r.array("rtmr0")?,
                r.array("rtmr1")?,
                r.array("rtmr2")?,
                r.array("rtmr3")?,
            ],
            report_data: r.array("report_data")?,
            tee_tcb_svn2: None,
            mr_service_td: None,
        };
        if kind != TdReportKind::Td10 {
            report.tee_tcb_svn2 = Some(r.array("tee_tcb_svn2")?);
            report.mr_service_td = Some(r.array("mr_service_td")?);
        }
        if kind == TdReportKind::Td15Ex {
            r.take(TD_REPORT_15_EX_LEN - TD_REPORT_15_LEN, "TD 1.5 extension")?;
        }
        r.finish("TD report")?;
        Ok(report)
    }

    /// TDATTRIBUTES as the little-endian integer the TDX module defines.
    pub fn td_attributes_bits(&self) -> u64 {
        u64::from_le_bytes(self.td_attributes)
    }
}

/// The QE report fields the verifier reads: its REPORT_DATA (bytes 320..384 of the
/// 384-byte SGX report body).
pub(crate) fn qe_report_data(qe_report: &[u8; QE_REPORT_LEN]) -> [u8; 64] {
    let mut out = [0u8; 64];
    if let Some(src) = qe_report.get(320..) {
        out.copy_from_slice(src);
    }
    out
}

fn malformed(what: String) -> ValidationError {
    ValidationError::Malformed(format!("TDX quote: {what}"))
}

/// Reads fixed-size fields off a byte slice, refusing to run past its end.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn position(&self) -> usize {
        self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ValidationError> {
        let end = self.pos.checked_add(n);
        let out = end.and_then(|end| self.buf.get(self.pos..end));
        match (out, end) {
            (Some(out), Some(end)) => {
                self.pos = end;
                Ok(out)
            }
            _ => Err(malformed(format!(
                "truncated: {what} needs {n} bytes, {} left",
                self.buf.len().saturating_sub(self.pos)
            ))),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ValidationError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u16(&mut self, what: &str) -> Result<u16, ValidationError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, ValidationError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn len_u32(&mut self, what: &str) -> Result<usize, ValidationError> {
        let n = self.u32(what)?;
        usize::try_from(n).map_err(|_| malformed(format!("{what} {n} does not fit")))
    }

    fn finish(&self, what: &str) -> Result<(), ValidationError> {
        let left = self.buf.len().saturating_sub(self.pos);
        if left == 0 {
            Ok(())
        } else {
            Err(malformed(format!("{left} trailing bytes after the {what}")))
        }
    }
}
