//! Cloud vTPMs bound to a hardware report.
//!
//! **Azure (SEV-SNP and TDX).** The paravisor (HCL) writes an *HCL report* into the vTPM's
//! NV index [`HCL_REPORT_NV_INDEX`]: a header, the hardware report (an SNP attestation
//! report or a TDX TDREPORT) and the *runtime data*, a JSON document that holds the vTPM's
//! attestation key (`HCLAkPub`) as an RSA JWK. The hardware report's REPORT_DATA is
//! SHA-256(runtime data) followed by 32 zero bytes, so the chain runs hardware report →
//! runtime data → AK → quote → PCRs. [`HclReport::parse`] splits the report,
//! [`HclReport::check_report_data`] checks the first link against the REPORT_DATA the
//! hardware verifier returned, and [`hcl_ak_matches`] the second against the AK's public
//! area.
//!
//! **AWS (SEV-SNP).** The SNP report's REPORT_DATA is SHA-512 of the AK's public key as a
//! DER SubjectPublicKeyInfo ([`aws_snp_report_data`], [`aws_snp_ak_matches`]).
//!
//! Layout of the HCL report (all integers little-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | signature `HCLA` |
//! | 4 | 4 | version (2) |
//! | 8 | 4 | report size: every byte from offset 0 to the end of the runtime data |
//! | 12 | 4 | request type (2: AK certificate request) |
//! | 16 | 4 | status (0) |
//! | 20 | 12 | reserved (zero) |
//! | 32 | 1184 | hardware report: the SNP report, or the TDREPORT (1024 bytes) and zeros |
//! | 1216 | 4 | data size: 20 + variable data size |
//! | 1220 | 4 | data version (1) |
//! | 1224 | 4 | report type (2: SNP, 4: TDX) |
//! | 1228 | 4 | REPORT_DATA hash type (1: SHA-256) |
//! | 1232 | 4 | variable data size |
//! | 1236 | n | variable data: the runtime data JSON |
//!
//! The NV index is read whole and is larger than the report, so zero bytes may follow the
//! declared size; any other byte there is refused.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::ValidationError;
use crate::explain::Check;
use crate::tpm::AkKey;
use crate::tpm::structures::{ECC_NIST_P256, PublicParams, TpmtPublic};

/// The vTPM NV index Azure's paravisor writes the HCL report into.
pub const HCL_REPORT_NV_INDEX: u32 = 0x0140_0001;

/// Largest HCL report accepted, trailing zero padding included. Azure's NV index holds a
/// few kilobytes; this leaves room without letting a peer make the parser work on megabytes.
pub const MAX_HCL_REPORT_SIZE: usize = 16 * 1024;

/// Largest runtime-data JSON accepted (Azure's are about 0.5 to 1.5 KiB).
pub const MAX_RUNTIME_DATA_SIZE: usize = 8 * 1024;

/// Size of an SEV-SNP attestation report, and of the hardware-report area of an HCL report.
pub const SNP_REPORT_SIZE: usize = 1184;

/// Size of a TDX TDREPORT.
pub const TD_REPORT_SIZE: usize = 1024;

/// The `kid` of the vTPM attestation key in the runtime data.
pub const AK_KEY_ID: &str = "HCLAkPub";

const SIGNATURE: &[u8; 4] = b"HCLA";
const HEADER_SIZE: usize = 32;
const HEADER_VERSION: u32 = 2;
const REQUEST_AK_CERT: u32 = 2;
const IGVM_FIXED_SIZE: usize = 20;
const IGVM_DATA_VERSION: u32 = 1;
const REPORT_TYPE_SNP: u32 = 2;
const REPORT_TYPE_TDX: u32 = 4;
const HASH_TYPE_SHA256: u32 = 1;
const RUNTIME_DATA_OFFSET: usize = HEADER_SIZE + SNP_REPORT_SIZE + IGVM_FIXED_SIZE;
/// Where REPORT_DATA sits in an SNP report and in a TDREPORT (inside REPORTMACSTRUCT).
const SNP_REPORT_DATA_OFFSET: usize = 0x50;
const TD_REPORT_DATA_OFFSET: usize = 0x80;

fn malformed(msg: impl Into<String>) -> ValidationError {
    ValidationError::Malformed(format!("HCL report: {}", msg.into()))
}

/// The little-endian u32 at `offset`.
fn u32_at(bytes: &[u8], offset: usize, field: &str) -> Result<u32, ValidationError> {
    let raw: [u8; 4] = offset
        .checked_add(4)
        .and_then(|end| bytes.get(offset..end))
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| malformed(format!("truncated at {field}")))?;
    Ok(u32::from_le_bytes(raw))
}

fn usize_from(v: u32) -> usize {
    // u32 always fits in usize on the 32- and 64-bit targets this crate builds for.
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Which hardware report an HCL report carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardwareKind {
    /// AMD SEV-SNP attestation report.
    Snp,
    /// Intel TDX TDREPORT.
    Tdx,
}

/// The hardware report inside an HCL report, exactly as long as its kind defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardwareReport<'a> {
    /// An SEV-SNP attestation report ([`SNP_REPORT_SIZE`] bytes), signed by the VCEK/VLEK.
    Snp(&'a [u8]),
    /// A TDX TDREPORT ([`TD_REPORT_SIZE`] bytes). It is MAC-ed, not signed: the verifier
    /// checks the quote made from it, whose REPORT_DATA is the same.
    Tdx(&'a [u8]),
}

impl HardwareReport<'_> {
    /// The REPORT_DATA field as written in the report, **not verified**: the binding must
    /// be checked against the REPORT_DATA the hardware verifier returns from a verified
    /// report or quote. Useful for tools and for explaining a mismatch. Zeros for a slice
    /// shorter than its kind's report (only a hand-made value can be).
    pub fn unverified_report_data(&self) -> [u8; 64] {
        let (bytes, offset) = match self {
            Self::Snp(b) => (*b, SNP_REPORT_DATA_OFFSET),
            Self::Tdx(b) => (*b, TD_REPORT_DATA_OFFSET),
        };
        let mut out = [0u8; 64];
        if let Some(src) = bytes.get(offset..offset + 64) {
            out.copy_from_slice(src);
        }
        out
    }
}

/// An Azure HCL report, parsed with exact sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HclReport {
    kind: HardwareKind,
    hardware: Vec<u8>,
    runtime_data: Vec<u8>,
}

impl HclReport {
    /// Parses an HCL report as read from the NV index: size cap, header, hardware report,
    /// runtime-data block. Only zero bytes may follow the size the header declares.
    pub fn parse(bytes: &[u8]) -> Result<Self, ValidationError> {
        if bytes.len() > MAX_HCL_REPORT_SIZE {
            return Err(malformed(format!(
                "{} bytes, at most {MAX_HCL_REPORT_SIZE} accepted",
                bytes.len()
            )));
        }
        if bytes.len() < RUNTIME_DATA_OFFSET {
            return Err(malformed(format!(
                "{} bytes, shorter than header, hardware report and data header ({RUNTIME_DATA_OFFSET})",
                bytes.len()
            )));
        }
        if bytes.get(..4) != Some(SIGNATURE.as_slice()) {
            return Err(malformed("signature is not HCLA"));
        }
        let version = u32_at(bytes, 4, "version")?;
        if version != HEADER_VERSION {
            return Err(malformed(format!(
                "version {version}, only {HEADER_VERSION} is known"
            )));
        }
        let report_size = usize_from(u32_at(bytes, 8, "report size")?);
        let request_type = u32_at(bytes, 12, "request type")?;
        if request_type != REQUEST_AK_CERT {
            return Err(malformed(format!(
                "request type {request_type}, expected {REQUEST_AK_CERT} (AK certificate request)"
            )));
        }
        let status = u32_at(bytes, 16, "status")?;
        if status != 0 {
            return Err(malformed(format!("status {status:#x}, expected 0")));
        }
        if bytes
            .get(20..HEADER_SIZE)
            .is_none_or(|r| r.iter().any(|b| *b != 0))
        {
            return Err(malformed("reserved header bytes are not zero"));
        }

        let data_at = HEADER_SIZE + SNP_REPORT_SIZE;
        let data_size = usize_from(u32_at(bytes, data_at, "data size")?);
        let data_version = u32_at(bytes, data_at + 4, "data version")?;
        let report_type = u32_at(bytes, data_at + 8, "report type")?;
        let hash_type = u32_at(bytes, data_at + 12, "report data hash type")?;
        let variable_size = usize_from(u32_at(bytes, data_at + 16, "variable data size")?);
        if data_version != IGVM_DATA_VERSION {
            return Err(malformed(format!(
                "data version {data_version}, only {IGVM_DATA_VERSION} is known"
            )));
        }
        if hash_type != HASH_TYPE_SHA256 {
            return Err(ValidationError::Field {
                field: "hcl.report_data_hash_type".into(),
                expected: format!("{HASH_TYPE_SHA256} (SHA-256)"),
                observed: hash_type.to_string(),
            });
        }
        if variable_size > MAX_RUNTIME_DATA_SIZE {
            return Err(malformed(format!(
                "runtime data is {variable_size} bytes, at most {MAX_RUNTIME_DATA_SIZE} accepted"
            )));
        }
        if data_size != IGVM_FIXED_SIZE + variable_size {
            return Err(malformed(format!(
                "data size {data_size} is not {IGVM_FIXED_SIZE} + variable data size {variable_size}"
            )));
        }
        let end = RUNTIME_DATA_OFFSET + variable_size;
        if report_size != end {
            return Err(malformed(format!(
                "report size {report_size} is not the {end} bytes its parts add up to"
            )));
        }
        let (declared, padding) = bytes
            .split_at_checked(end)
            .ok_or_else(|| malformed(format!("truncated: {} of {end} bytes", bytes.len())))?;
        if let Some(at) = padding.iter().position(|b| *b != 0) {
            return Err(malformed(format!(
                "non-zero byte at offset {} after the declared {end} bytes",
                end + at
            )));
        }

        let area = declared
            .get(HEADER_SIZE..data_at)
            .ok_or_else(|| malformed("truncated in the hardware report"))?;
        let (kind, hardware) = match report_type {
            REPORT_TYPE_SNP => (HardwareKind::Snp, area),
            REPORT_TYPE_TDX => {
                let (td_report, rest) = area.split_at(TD_REPORT_SIZE);
                if rest.iter().any(|b| *b != 0) {
                    return Err(malformed(
                        "bytes after the 1024-byte TDREPORT in the hardware-report area are not zero",
                    ));
                }
                (HardwareKind::Tdx, td_report)
            }
            other => {
                return Err(malformed(format!(
                    "report type {other}, expected {REPORT_TYPE_SNP} (SNP) or {REPORT_TYPE_TDX} (TDX)"
                )));
            }
        };
        let runtime_data = declared
            .get(RUNTIME_DATA_OFFSET..)
            .ok_or_else(|| malformed("truncated in the runtime data"))?;
        Ok(Self {
            kind,
            hardware: hardware.to_vec(),
            runtime_data: runtime_data.to_vec(),
        })
    }

    /// Which hardware report this is.
    pub fn kind(&self) -> HardwareKind {
        self.kind
    }

    /// The hardware report, to be verified by the SNP or TDX verifier.
    pub fn hardware_report(&self) -> HardwareReport<'_> {
        match self.kind {
            HardwareKind::Snp => HardwareReport::Snp(&self.hardware),
            HardwareKind::Tdx => HardwareReport::Tdx(&self.hardware),
        }
    }

    /// The runtime data (JSON) exactly as hashed into REPORT_DATA.
    pub fn runtime_data(&self) -> &[u8] {
        &self.runtime_data
    }

    /// The REPORT_DATA a hardware report bound to this runtime data carries.
    pub fn expected_report_data(&self) -> [u8; 64] {
        runtime_data_report_data(&self.runtime_data)
    }

    /// The binding as an explained check: `report_data` (from the verified hardware report)
    /// against SHA-256(runtime data) || 32 zero bytes.
    pub fn report_data_check(&self, verified_report_data: &[u8; 64]) -> Check {
        let expected = self.expected_report_data();
        Check::pass_if(
            expected == *verified_report_data,
            "report_data",
            format!(
                "{} (SHA-256 of the HCL runtime data, then zeros)",
                hex::encode(expected)
            ),
            hex::encode(verified_report_data),
        )
    }

    /// Checks the binding; refuses with a [`ValidationError::Field`] naming `report_data`.
    pub fn check_report_data(
        &self,
        verified_report_data: &[u8; 64],
    ) -> Result<(), ValidationError> {
        let check = self.report_data_check(verified_report_data);
        match check.outcome {
            crate::explain::Outcome::Pass => Ok(()),
            _ => Err(ValidationError::from(&check)),
        }
    }
}

/// REPORT_DATA for runtime data: SHA-256(runtime data) || 32 zero bytes.
pub fn runtime_data_report_data(runtime_data: &[u8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    let (digest, _zeros) = out.split_at_mut(32);
    digest.copy_from_slice(&crate::sha::sha256(runtime_data));
    out
}

/// An RSA public key from a JWK: modulus and exponent, big-endian, leading zeros removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsaJwk {
    /// The modulus `n`.
    pub n: Vec<u8>,
    /// The public exponent `e`.
    pub e: Vec<u8>,
}

/// The `vm-configuration` object of the runtime data: informational, every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct VmConfiguration {
    /// Whether the serial console is enabled.
    pub console_enabled: Option<bool>,
    /// Whether UEFI secure boot is on.
    pub secure_boot: Option<bool>,
    /// Whether the vTPM is enabled.
    pub tpm_enabled: Option<bool>,
    /// Whether the vTPM state persists across reboots.
    pub tpm_persisted: Option<bool>,
    /// Thumbprint of the root certificate of the AK certificate chain.
    pub root_cert_thumbprint: Option<String>,
    /// Time the report was made, as the paravisor saw it (unix seconds).
    pub current_time: Option<u64>,
    /// Azure's VM ID.
    #[serde(rename = "vmUniqueId")]
    pub vm_unique_id: Option<String>,
}

/// The HCL runtime data: the vTPM AK and the VM configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeData {
    /// The vTPM attestation key (`kid` [`AK_KEY_ID`]).
    pub ak: RsaJwk,
    /// `vm-configuration`, when present.
    pub vm_configuration: Option<VmConfiguration>,
    /// `user-data` (hex in the JSON): what the guest asked the paravisor to include.
    pub user_data: Option<Vec<u8>>,
}

#[derive(Deserialize)]
struct RawRuntimeData {
    keys: Vec<RawJwk>,
    #[serde(rename = "vm-configuration")]
    vm_configuration: Option<VmConfiguration>,
    #[serde(rename = "user-data")]
    user_data: Option<String>,
}

#[derive(Deserialize)]
struct RawJwk {
    kid: Option<String>,
    kty: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

impl RuntimeData {
    /// Parses the runtime data JSON. Exactly one key has `kid` [`AK_KEY_ID`], of type RSA,
    /// with base64url `n` and `e`; unknown members are ignored.
    pub fn parse(json: &[u8]) -> Result<Self, ValidationError> {
        let bad = |m: String| ValidationError::Malformed(format!("HCL runtime data: {m}"));
        if json.len() > MAX_RUNTIME_DATA_SIZE {
            return Err(bad(format!(
                "{} bytes, at most {MAX_RUNTIME_DATA_SIZE} accepted",
                json.len()
            )));
        }
        let raw: RawRuntimeData =
            serde_json::from_slice(json).map_err(|e| bad(format!("not the expected JSON: {e}")))?;
        let mut aks = raw
            .keys
            .iter()
            .filter(|k| k.kid.as_deref() == Some(AK_KEY_ID));
        let (Some(jwk), None) = (aks.next(), aks.next()) else {
            return Err(bad(format!("not exactly one key with kid {AK_KEY_ID}")));
        };
        if jwk.kty.as_deref() != Some("RSA") {
            return Err(bad(format!("{AK_KEY_ID} has kty {:?}, not RSA", jwk.kty)));
        }
        let integer = |name: &str, v: &Option<String>| -> Result<Vec<u8>, ValidationError> {
            let text = v
                .as_deref()
                .ok_or_else(|| bad(format!("{AK_KEY_ID} has no {name}")))?;
            let bytes = URL_SAFE_NO_PAD
                .decode(text)
                .map_err(|e| bad(format!("{AK_KEY_ID}.{name} is not base64url: {e}")))?;
            let stripped = strip_zeros(&bytes);
            if stripped.is_empty() {
                return Err(bad(format!("{AK_KEY_ID}.{name} is zero")));
            }
            Ok(stripped.to_vec())
        };
        let ak = RsaJwk {
            n: integer("n", &jwk.n)?,
            e: integer("e", &jwk.e)?,
        };
        let user_data = raw
            .user_data
            .map(|h| hex::decode(h).map_err(|e| bad(format!("user-data is not hex: {e}"))))
            .transpose()?;
        Ok(Self {
            ak,
            vm_configuration: raw.vm_configuration,
            user_data,
        })
    }
}

fn strip_zeros(v: &[u8]) -> &[u8] {
    let skip = v.iter().take_while(|b| **b == 0).count();
    v.get(skip..).unwrap_or_default()
}

fn digest_summary(v: &[u8]) -> String {
    format!(
        "{} bytes, SHA-256 {}",
        v.len(),
        hex::encode(Sha256::digest(v))
    )
}

/// An RSA key from a TPMT_PUBLIC's modulus and exponent: without leading zeros, and
/// exponent 0 (the public area's encoding of the default) as 65537.
fn rsa_key(exponent: u32, modulus: &[u8]) -> RsaJwk {
    let e = if exponent == 0 { 65537 } else { exponent };
    RsaJwk {
        n: strip_zeros(modulus).to_vec(),
        e: strip_zeros(&e.to_be_bytes()).to_vec(),
    }
}

fn parse_public(ak_public: &[u8]) -> Result<TpmtPublic, ValidationError> {
    TpmtPublic::parse(ak_public)
        .map_err(|e| ValidationError::Malformed(format!("AK public area: {e}")))
}

/// Checks that `ak_public` (a TPMT_PUBLIC, the key that signs the quote) is the AK the
/// runtime data names: same RSA modulus and exponent. Refuses another key with a
/// [`ValidationError::Field`] naming the JWK member that differs.
pub fn hcl_ak_matches(runtime: &RuntimeData, ak_public: &[u8]) -> Result<(), ValidationError> {
    let public = parse_public(ak_public)?;
    let PublicParams::Rsa {
        exponent, modulus, ..
    } = &public.params
    else {
        return Err(ValidationError::Field {
            field: format!("runtime_data.keys[{AK_KEY_ID}].kty"),
            expected: "RSA".into(),
            observed: "an ECC AK public area".into(),
        });
    };
    let key = rsa_key(*exponent, modulus);
    if key.n != runtime.ak.n {
        return Err(ValidationError::Field {
            field: format!("runtime_data.keys[{AK_KEY_ID}].n"),
            expected: digest_summary(&runtime.ak.n),
            observed: format!("AK modulus of {}", digest_summary(&key.n)),
        });
    }
    if key.e != runtime.ak.e {
        return Err(ValidationError::Field {
            field: format!("runtime_data.keys[{AK_KEY_ID}].e"),
            expected: hex::encode(&runtime.ak.e),
            observed: format!("AK exponent {}", hex::encode(&key.e)),
        });
    }
    Ok(())
}

/// The REPORT_DATA of an AWS SEV-SNP report bound to the AK `ak_public` (TPMT_PUBLIC):
/// SHA-512 of the AK's public key as a DER SubjectPublicKeyInfo (PKIX). RSA keys and ECC
/// P-256 keys with 32-byte coordinates are accepted.
pub fn aws_snp_report_data(ak_public: &[u8]) -> Result<[u8; 64], ValidationError> {
    let public = parse_public(ak_public)?;
    let key = match &public.params {
        PublicParams::Rsa {
            exponent, modulus, ..
        } => {
            let RsaJwk { n, e } = rsa_key(*exponent, modulus);
            AkKey::RsaSsa { n, e }
        }
        PublicParams::Ecc { curve, x, y, .. } => {
            let mut point = [0u8; 65];
            let (tag, xy) = point.split_at_mut(1);
            let (px, py) = xy.split_at_mut(32);
            if *curve != ECC_NIST_P256 || x.len() != 32 || y.len() != 32 {
                return Err(ValidationError::Malformed(format!(
                    "AK public area: ECC curve {curve:#06x} with {}- and {}-byte coordinates, \
                     only P-256 with 32 each is supported",
                    x.len(),
                    y.len()
                )));
            }
            tag.copy_from_slice(&[0x04]);
            px.copy_from_slice(x);
            py.copy_from_slice(y);
            AkKey::EcdsaP256(point)
        }
    };
    Ok(crate::sha::sha512(&key.spki_der()))
}

/// Checks an AWS SEV-SNP binding: `verified_report_data` (from the verified SNP report)
/// must be [`aws_snp_report_data`] of `ak_public`; refuses with a
/// [`ValidationError::Field`] naming `report_data`.
pub fn aws_snp_ak_matches(
    verified_report_data: &[u8; 64],
    ak_public: &[u8],
) -> Result<(), ValidationError> {
    let expected = aws_snp_report_data(ak_public)?;
    if expected != *verified_report_data {
        return Err(ValidationError::Field {
            field: "report_data".into(),
            expected: format!(
                "{} (SHA-512 of the AK's SubjectPublicKeyInfo)",
                hex::encode(expected)
            ),
            observed: hex::encode(verified_report_data),
        });
    }
    Ok(())
}
