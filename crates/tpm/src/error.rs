//! Errors of this crate, and TSS/TPM response codes decoded to their specification names.

use std::fmt;

use crate::config::ConfigError;

/// A TSS2 return code: a TPM 2.0 response code (layer 0) or an error from one of the TSS
/// software layers (ESAPI, SAPI, marshalling, TCTI, resource manager), decoded to its name.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResponseCode(u32);

/// The TSS layer a [`ResponseCode`] comes from (bits 16..24 of the code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layer {
    /// The TPM itself.
    Tpm,
    /// The feature API (FAPI).
    Fapi,
    /// The enhanced system API (ESAPI).
    Esapi,
    /// The system API (SAPI).
    Sapi,
    /// Marshalling/unmarshalling.
    Mu,
    /// The transmission interface (TCTI): connection and I/O.
    Tcti,
    /// A resource manager.
    ResourceManager,
    /// A TPM response code relayed by a resource manager.
    ResourceManagerTpm,
    /// Any other layer number.
    Other(u8),
}

const RC_VER1: u32 = 0x100;
const RC_FMT1: u32 = 0x080;
const RC_WARN: u32 = 0x900;

/// `TPM_RC_RETRY`: the TPM could not start the command; retry.
pub const TPM_RC_RETRY: u32 = RC_WARN + 0x022;
/// `TPM_RC_YIELDED`: the TPM suspended the command; retry.
pub const TPM_RC_YIELDED: u32 = RC_WARN + 0x008;
/// `TPM_RC_TESTING`: the TPM is self-testing; retry later.
pub const TPM_RC_TESTING: u32 = RC_WARN + 0x00A;
/// `TPM_RC_NV_RATE`: NV writes are rate-limited; retry later.
pub const TPM_RC_NV_RATE: u32 = RC_WARN + 0x020;
/// `TPM_RC_OBJECT_MEMORY`: no room for another transient object.
pub const TPM_RC_OBJECT_MEMORY: u32 = RC_WARN + 0x002;
/// `TPM_RC_SESSION_MEMORY`: no room for another session.
pub const TPM_RC_SESSION_MEMORY: u32 = RC_WARN + 0x003;
/// `TPM_RC_MEMORY`: out of shared object/session memory.
pub const TPM_RC_MEMORY: u32 = RC_WARN + 0x004;
/// `TPM_RC_HANDLE` (format one, no handle number): the handle is not correct for the use,
/// e.g. an absent persistent object or NV index.
pub const TPM_RC_HANDLE: u32 = RC_FMT1 + 0x00B;

impl ResponseCode {
    /// Wraps a raw `TSS2_RC`.
    pub const fn new(raw: u32) -> Self {
        ResponseCode(raw)
    }

    /// The raw `TSS2_RC` value.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// The layer that produced the code.
    pub fn layer(self) -> Layer {
        match (self.0 >> 16) & 0xff {
            0 => Layer::Tpm,
            6 => Layer::Fapi,
            7 => Layer::Esapi,
            8 => Layer::Sapi,
            9 => Layer::Mu,
            10 => Layer::Tcti,
            11 => Layer::ResourceManager,
            12 => Layer::ResourceManagerTpm,
            n => Layer::Other(n as u8),
        }
    }

    /// For a TPM code (also one relayed by a resource manager): the code with the
    /// handle/parameter/session number of a format-one code cleared, so it can be compared
    /// with the `TPM_RC_*` constants. `None` for a TSS software-layer code.
    pub fn tpm_base(self) -> Option<u32> {
        match self.layer() {
            Layer::Tpm | Layer::ResourceManagerTpm => {
                let rc = self.0 & 0xffff;
                if rc & RC_FMT1 != 0 {
                    Some(rc & (RC_FMT1 | 0x3f))
                } else {
                    Some(rc)
                }
            }
            _ => None,
        }
    }

    /// The specification name, e.g. `TPM_RC_RETRY` or `TSS2_ESYS_RC_BAD_REFERENCE`; `None`
    /// when the code is not one this crate knows by name.
    pub fn name(self) -> Option<&'static str> {
        if self.0 == 0 {
            return Some("TPM_RC_SUCCESS");
        }
        if let Some(base) = self.tpm_base() {
            return tpm_rc_name(base);
        }
        let base = tss_base_name(self.0 & 0xffff)?;
        let table = match self.layer() {
            Layer::Esapi => ESYS_NAMES,
            Layer::Sapi => SYS_NAMES,
            Layer::Mu => MU_NAMES,
            Layer::Tcti => TCTI_NAMES,
            _ => return None,
        };
        table.iter().find(|(b, _)| *b == base).map(|(_, n)| *n)
    }

    /// For a format-one TPM code: which handle, parameter or session it refers to.
    fn subject(self) -> Option<String> {
        if self.tpm_base().is_none() || self.0 & RC_FMT1 == 0 {
            return None;
        }
        let n = (self.0 >> 8) & 0xf;
        if self.0 & 0x40 != 0 {
            Some(format!("parameter {n}"))
        } else if n == 0 {
            None
        } else if n <= 7 {
            Some(format!("handle {n}"))
        } else {
            Some(format!("session {}", n - 8))
        }
    }
}

impl fmt::Display for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}")?,
            None => write!(f, "unknown {:?} response code", self.layer())?,
        }
        write!(f, " ({:#010x}", self.0)?;
        if let Some(subject) = self.subject() {
            write!(f, ", {subject}")?;
        }
        write!(f, ")")
    }
}

impl fmt::Debug for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn tpm_rc_name(base: u32) -> Option<&'static str> {
    if base & RC_FMT1 != 0 {
        return FMT1_NAMES
            .iter()
            .find(|(n, _)| *n == base & 0x3f)
            .map(|(_, name)| *name);
    }
    if base & RC_VER1 == 0 {
        // A TPM 1.2 code, or a vendor code: no TPM 2.0 name.
        return None;
    }
    if base & 0x400 != 0 {
        return Some("TPM_RC_VENDOR");
    }
    let table = if base & 0x800 != 0 {
        WARN_NAMES
    } else {
        ERROR_NAMES
    };
    table
        .iter()
        .find(|(n, _)| *n == base & 0x7f)
        .map(|(_, name)| *name)
}

/// TPM 2.0 Part 2, table "TPM_RC": format-zero errors (`RC_VER1 + n`).
const ERROR_NAMES: &[(u32, &str)] = &[
    (0x000, "TPM_RC_INITIALIZE"),
    (0x001, "TPM_RC_FAILURE"),
    (0x003, "TPM_RC_SEQUENCE"),
    (0x00B, "TPM_RC_PRIVATE"),
    (0x019, "TPM_RC_HMAC"),
    (0x020, "TPM_RC_DISABLED"),
    (0x021, "TPM_RC_EXCLUSIVE"),
    (0x024, "TPM_RC_AUTH_TYPE"),
    (0x025, "TPM_RC_AUTH_MISSING"),
    (0x026, "TPM_RC_POLICY"),
    (0x027, "TPM_RC_PCR"),
    (0x028, "TPM_RC_PCR_CHANGED"),
    (0x02D, "TPM_RC_UPGRADE"),
    (0x02E, "TPM_RC_TOO_MANY_CONTEXTS"),
    (0x02F, "TPM_RC_AUTH_UNAVAILABLE"),
    (0x030, "TPM_RC_REBOOT"),
    (0x031, "TPM_RC_UNBALANCED"),
    (0x042, "TPM_RC_COMMAND_SIZE"),
    (0x043, "TPM_RC_COMMAND_CODE"),
    (0x044, "TPM_RC_AUTHSIZE"),
    (0x045, "TPM_RC_AUTH_CONTEXT"),
    (0x046, "TPM_RC_NV_RANGE"),
    (0x047, "TPM_RC_NV_SIZE"),
    (0x048, "TPM_RC_NV_LOCKED"),
    (0x049, "TPM_RC_NV_AUTHORIZATION"),
    (0x04A, "TPM_RC_NV_UNINITIALIZED"),
    (0x04B, "TPM_RC_NV_SPACE"),
    (0x04C, "TPM_RC_NV_DEFINED"),
    (0x050, "TPM_RC_BAD_CONTEXT"),
    (0x051, "TPM_RC_CPHASH"),
    (0x052, "TPM_RC_PARENT"),
    (0x053, "TPM_RC_NEEDS_TEST"),
    (0x054, "TPM_RC_NO_RESULT"),
    (0x055, "TPM_RC_SENSITIVE"),
];

/// Format-zero warnings (`RC_WARN + n`).
const WARN_NAMES: &[(u32, &str)] = &[
    (0x001, "TPM_RC_CONTEXT_GAP"),
    (0x002, "TPM_RC_OBJECT_MEMORY"),
    (0x003, "TPM_RC_SESSION_MEMORY"),
    (0x004, "TPM_RC_MEMORY"),
    (0x005, "TPM_RC_SESSION_HANDLES"),
    (0x006, "TPM_RC_OBJECT_HANDLES"),
    (0x007, "TPM_RC_LOCALITY"),
    (0x008, "TPM_RC_YIELDED"),
    (0x009, "TPM_RC_CANCELED"),
    (0x00A, "TPM_RC_TESTING"),
    (0x010, "TPM_RC_REFERENCE_H0"),
    (0x011, "TPM_RC_REFERENCE_H1"),
    (0x012, "TPM_RC_REFERENCE_H2"),
    (0x013, "TPM_RC_REFERENCE_H3"),
    (0x014, "TPM_RC_REFERENCE_H4"),
    (0x015, "TPM_RC_REFERENCE_H5"),
    (0x016, "TPM_RC_REFERENCE_H6"),
    (0x018, "TPM_RC_REFERENCE_S0"),
    (0x019, "TPM_RC_REFERENCE_S1"),
    (0x01A, "TPM_RC_REFERENCE_S2"),
    (0x01B, "TPM_RC_REFERENCE_S3"),
    (0x01C, "TPM_RC_REFERENCE_S4"),
    (0x01D, "TPM_RC_REFERENCE_S5"),
    (0x01E, "TPM_RC_REFERENCE_S6"),
    (0x020, "TPM_RC_NV_RATE"),
    (0x021, "TPM_RC_LOCKOUT"),
    (0x022, "TPM_RC_RETRY"),
    (0x023, "TPM_RC_NV_UNAVAILABLE"),
];

/// Format-one errors (`RC_FMT1 + n`).
const FMT1_NAMES: &[(u32, &str)] = &[
    (0x001, "TPM_RC_ASYMMETRIC"),
    (0x002, "TPM_RC_ATTRIBUTES"),
    (0x003, "TPM_RC_HASH"),
    (0x004, "TPM_RC_VALUE"),
    (0x005, "TPM_RC_HIERARCHY"),
    (0x007, "TPM_RC_KEY_SIZE"),
    (0x008, "TPM_RC_MGF"),
    (0x009, "TPM_RC_MODE"),
    (0x00A, "TPM_RC_TYPE"),
    (0x00B, "TPM_RC_HANDLE"),
    (0x00C, "TPM_RC_KDF"),
    (0x00D, "TPM_RC_RANGE"),
    (0x00E, "TPM_RC_AUTH_FAIL"),
    (0x00F, "TPM_RC_NONCE"),
    (0x010, "TPM_RC_PP"),
    (0x012, "TPM_RC_SCHEME"),
    (0x015, "TPM_RC_SIZE"),
    (0x016, "TPM_RC_SYMMETRIC"),
    (0x017, "TPM_RC_TAG"),
    (0x018, "TPM_RC_SELECTOR"),
    (0x01A, "TPM_RC_INSUFFICIENT"),
    (0x01B, "TPM_RC_SIGNATURE"),
    (0x01C, "TPM_RC_KEY"),
    (0x01D, "TPM_RC_POLICY_FAIL"),
    (0x01F, "TPM_RC_INTEGRITY"),
    (0x020, "TPM_RC_TICKET"),
    (0x021, "TPM_RC_RESERVED_BITS"),
    (0x022, "TPM_RC_BAD_AUTH"),
    (0x023, "TPM_RC_EXPIRED"),
    (0x024, "TPM_RC_POLICY_CC"),
    (0x025, "TPM_RC_BINDING"),
    (0x026, "TPM_RC_CURVE"),
    (0x027, "TPM_RC_ECC_POINT"),
];

/// The TSS "base" error codes shared by every software layer (TSS 2.0 TCTI/SAPI/ESAPI specs).
fn tss_base_name(base: u32) -> Option<&'static str> {
    Some(match base {
        1 => "GENERAL_FAILURE",
        2 => "NOT_IMPLEMENTED",
        3 => "BAD_CONTEXT",
        4 => "ABI_MISMATCH",
        5 => "BAD_REFERENCE",
        6 => "INSUFFICIENT_BUFFER",
        7 => "BAD_SEQUENCE",
        8 => "NO_CONNECTION",
        9 => "TRY_AGAIN",
        10 => "IO_ERROR",
        11 => "BAD_VALUE",
        12 => "NOT_PERMITTED",
        13 => "INVALID_SESSIONS",
        14 => "NO_DECRYPT_PARAM",
        15 => "NO_ENCRYPT_PARAM",
        16 => "BAD_SIZE",
        17 => "MALFORMED_RESPONSE",
        18 => "INSUFFICIENT_CONTEXT",
        19 => "INSUFFICIENT_RESPONSE",
        20 => "INCOMPATIBLE_TCTI",
        21 => "NOT_SUPPORTED",
        22 => "BAD_TCTI_STRUCTURE",
        23 => "MEMORY",
        24 => "BAD_TR",
        25 => "MULTIPLE_DECRYPT_SESSIONS",
        26 => "MULTIPLE_ENCRYPT_SESSIONS",
        27 => "RSP_AUTH_FAILED",
        _ => return None,
    })
}

macro_rules! layer_names {
    ($name:ident, $prefix:literal) => {
        const $name: &[(&str, &str)] = &[
            ("GENERAL_FAILURE", concat!($prefix, "GENERAL_FAILURE")),
            ("NOT_IMPLEMENTED", concat!($prefix, "NOT_IMPLEMENTED")),
            ("BAD_CONTEXT", concat!($prefix, "BAD_CONTEXT")),
            ("ABI_MISMATCH", concat!($prefix, "ABI_MISMATCH")),
            ("BAD_REFERENCE", concat!($prefix, "BAD_REFERENCE")),
            (
                "INSUFFICIENT_BUFFER",
                concat!($prefix, "INSUFFICIENT_BUFFER"),
            ),
            ("BAD_SEQUENCE", concat!($prefix, "BAD_SEQUENCE")),
            ("NO_CONNECTION", concat!($prefix, "NO_CONNECTION")),
            ("TRY_AGAIN", concat!($prefix, "TRY_AGAIN")),
            ("IO_ERROR", concat!($prefix, "IO_ERROR")),
            ("BAD_VALUE", concat!($prefix, "BAD_VALUE")),
            ("NOT_PERMITTED", concat!($prefix, "NOT_PERMITTED")),
            ("INVALID_SESSIONS", concat!($prefix, "INVALID_SESSIONS")),
            ("NO_DECRYPT_PARAM", concat!($prefix, "NO_DECRYPT_PARAM")),
            ("NO_ENCRYPT_PARAM", concat!($prefix, "NO_ENCRYPT_PARAM")),
            ("BAD_SIZE", concat!($prefix, "BAD_SIZE")),
            ("MALFORMED_RESPONSE", concat!($prefix, "MALFORMED_RESPONSE")),
            (
                "INSUFFICIENT_CONTEXT",
                concat!($prefix, "INSUFFICIENT_CONTEXT"),
            ),
            (
                "INSUFFICIENT_RESPONSE",
                concat!($prefix, "INSUFFICIENT_RESPONSE"),
            ),
            ("INCOMPATIBLE_TCTI", concat!($prefix, "INCOMPATIBLE_TCTI")),
            ("NOT_SUPPORTED", concat!($prefix, "NOT_SUPPORTED")),
            ("BAD_TCTI_STRUCTURE", concat!($prefix, "BAD_TCTI_STRUCTURE")),
            ("MEMORY", concat!($prefix, "MEMORY")),
            ("BAD_TR", concat!($prefix, "BAD_TR")),
            (
                "MULTIPLE_DECRYPT_SESSIONS",
                concat!($prefix, "MULTIPLE_DECRYPT_SESSIONS"),
            ),
            (
                "MULTIPLE_ENCRYPT_SESSIONS",
                concat!($prefix, "MULTIPLE_ENCRYPT_SESSIONS"),
            ),
            ("RSP_AUTH_FAILED", concat!($prefix, "RSP_AUTH_FAILED")),
        ];
    };
}

layer_names!(ESYS_NAMES, "TSS2_ESYS_RC_");
layer_names!(SYS_NAMES, "TSS2_SYS_RC_");
layer_names!(MU_NAMES, "TSS2_MU_RC_");
layer_names!(TCTI_NAMES, "TSS2_TCTI_RC_");

/// Everything that can go wrong in this crate. Each variant names the operation and carries
/// the context needed to act on it; TSS/TPM codes are decoded ([`ResponseCode`]).
#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    /// The TCTI configuration string was malformed.
    #[error("invalid TPM configuration: {0}")]
    Config(#[from] ConfigError),

    /// The configured TCTI cannot be used with the linked TSS binding.
    #[error("TPM interface `{tcti}` is not supported: {reason}")]
    UnsupportedTcti {
        /// The configuration as text.
        tcti: String,
        /// Why.
        reason: &'static str,
    },

    /// Opening the TCTI or initialising ESAPI failed (no device, nothing listening, …).
    #[error("cannot open TPM `{tcti}`: {code}")]
    Open {
        /// The configuration as text.
        tcti: String,
        /// The decoded TSS/TPM code.
        code: ResponseCode,
    },

    /// A TPM command failed with a code that retrying does not fix.
    #[error("{operation} failed: {code}")]
    Tpm {
        /// The operation, e.g. `TPM2_Quote`.
        operation: &'static str,
        /// The decoded TSS/TPM code.
        code: ResponseCode,
    },

    /// A TPM command kept failing with a transient code until the retry budget ran out.
    #[error("{operation} still failing with {code} after {attempts} attempts")]
    RetriesExhausted {
        /// The operation.
        operation: &'static str,
        /// The last code seen.
        code: ResponseCode,
        /// How many times the command was sent.
        attempts: u32,
    },

    /// The Rust TSS binding rejected a value before or after talking to the TPM.
    #[error("{operation}: TSS binding error: {detail}")]
    Binding {
        /// The operation.
        operation: &'static str,
        /// The binding's description.
        detail: String,
    },

    /// A PCR index outside 0..=23.
    #[error("PCR index {index} is out of range (0..=23)")]
    InvalidPcrIndex {
        /// The index given.
        index: u32,
    },

    /// An empty PCR selection.
    #[error("the PCR selection is empty")]
    EmptyPcrSelection,

    /// Qualifying data longer than this crate accepts.
    #[error("qualifying data is {len} bytes; at most {max} are accepted")]
    QualifyingDataTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// Event data longer than a TPM2B_EVENT holds.
    #[error("event data is {len} bytes; a TPM2B_EVENT holds at most {max}")]
    EventDataTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// A handle outside the persistent-object range.
    #[error("{handle:#010x} is not a persistent handle (0x81000000..=0x81ffffff)")]
    InvalidPersistentHandle {
        /// The handle given.
        handle: u32,
    },

    /// No persistent object at the AK's handle (it was evicted since it was loaded).
    #[error("no attestation key at persistent handle {handle:#010x}; load it again")]
    AkNotFound {
        /// The handle.
        handle: u32,
    },

    /// The persistent object at the AK's handle is no longer the key that was loaded.
    #[error(
        "the key at persistent handle {handle:#010x} is not the attestation key that was loaded; load it again"
    )]
    AkReplaced {
        /// The handle.
        handle: u32,
    },

    /// No key at the handle where the platform provisions its AK.
    #[error(
        "no key at persistent handle {handle:#010x}, where the platform provisions its attestation key"
    )]
    NoProvisionedKey {
        /// The handle.
        handle: u32,
    },

    /// The platform's key at the handle cannot serve as an attestation key.
    #[error("the key at persistent handle {handle:#010x} is no attestation key: {reason}")]
    ProvisionedKeyUnusable {
        /// The handle.
        handle: u32,
        /// What is wrong with it.
        reason: String,
    },

    /// None of the NV indices where a cloud keeps its AK template is defined.
    #[error(
        "no AK template in NV index {}: the vTPM holds none of the cloud's AK templates",
        indices.iter().map(|i| format!("{i:#010x}")).collect::<Vec<_>>().join(" or ")
    )]
    NoAkTemplate {
        /// The NV indices looked at.
        indices: Vec<u32>,
    },

    /// The AK template in the NV index cannot make an attestation key.
    #[error("the AK template in NV index {index:#010x} is unusable: {reason}")]
    AkTemplateUnusable {
        /// The template's NV index.
        index: u32,
        /// What is wrong with it.
        reason: String,
    },

    /// The key made from the AK template again is not the one that was loaded.
    #[error(
        "the key made from the AK template in NV index {index:#010x} is not the attestation \
         key that was loaded (the template changed); load it again"
    )]
    TemplateAkChanged {
        /// The template's NV index.
        index: u32,
    },

    /// The NV index that should hold an AK certificate holds none.
    #[error("NV index {index:#010x} holds no usable AK certificate: {reason}")]
    NvCertificateUnusable {
        /// The certificate's NV index.
        index: u32,
        /// What is wrong.
        reason: String,
    },

    /// An allocated PCR bank whose hash this crate cannot compute in software.
    #[error("PCR bank {algorithm} is allocated but cannot be hashed in software for PCR_Event")]
    UnsupportedPcrBank {
        /// The bank's algorithm.
        algorithm: String,
    },

    /// The TPM answered, but not with what was asked for.
    #[error("{operation}: unexpected TPM answer: {detail}")]
    UnexpectedResponse {
        /// The operation.
        operation: &'static str,
        /// What was wrong.
        detail: String,
    },

    /// No NV index is defined at this handle.
    #[error("NV index {index:#010x} is not defined")]
    NvIndexNotDefined {
        /// The NV index.
        index: u32,
    },

    /// The NV index holds more than this crate reads.
    #[error("NV index {index:#010x} holds {size} bytes; at most {max} are read")]
    NvIndexTooLarge {
        /// The NV index.
        index: u32,
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },

    /// The PCRs kept changing between the quote and the read-back.
    #[error(
        "PCR values changed between TPM2_Quote and TPM2_PCR_Read on {attempts} attempts; \
         PCRs are being extended concurrently"
    )]
    PcrsChangedDuringQuote {
        /// Quotes taken.
        attempts: u32,
    },
}

impl TpmError {
    /// The decoded TSS/TPM code, when the error came from the TSS or the TPM.
    pub fn response_code(&self) -> Option<ResponseCode> {
        match self {
            TpmError::Open { code, .. }
            | TpmError::Tpm { code, .. }
            | TpmError::RetriesExhausted { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_tpm_warnings_and_errors_to_spec_names() {
        assert_eq!(ResponseCode::new(0x922).name(), Some("TPM_RC_RETRY"));
        assert_eq!(
            ResponseCode::new(0x902).name(),
            Some("TPM_RC_OBJECT_MEMORY")
        );
        assert_eq!(ResponseCode::new(0x908).name(), Some("TPM_RC_YIELDED"));
        assert_eq!(ResponseCode::new(0x90A).name(), Some("TPM_RC_TESTING"));
        assert_eq!(ResponseCode::new(0x14C).name(), Some("TPM_RC_NV_DEFINED"));
        assert_eq!(ResponseCode::new(0x101).name(), Some("TPM_RC_FAILURE"));
        assert_eq!(ResponseCode::new(0).name(), Some("TPM_RC_SUCCESS"));
    }

    #[test]
    fn decodes_format_one_codes_with_their_subject() {
        // TPM_RC_HANDLE on handle 1: what an absent persistent handle or NV index returns.
        let rc = ResponseCode::new(0x18B);
        assert_eq!(rc.name(), Some("TPM_RC_HANDLE"));
        assert_eq!(rc.tpm_base(), Some(TPM_RC_HANDLE));
        assert_eq!(rc.to_string(), "TPM_RC_HANDLE (0x0000018b, handle 1)");
        // TPM_RC_VALUE on parameter 2.
        let rc = ResponseCode::new(0x2C4);
        assert_eq!(rc.name(), Some("TPM_RC_VALUE"));
        assert_eq!(rc.to_string(), "TPM_RC_VALUE (0x000002c4, parameter 2)");
        // TPM_RC_AUTH_FAIL on session 1.
        assert_eq!(
            ResponseCode::new(0x98E).to_string(),
            "TPM_RC_AUTH_FAIL (0x0000098e, session 1)"
        );
    }

    #[test]
    fn decodes_tss_layer_codes() {
        assert_eq!(
            ResponseCode::new(0x0007_0005).name(),
            Some("TSS2_ESYS_RC_BAD_REFERENCE")
        );
        assert_eq!(ResponseCode::new(0x000a_000a).layer(), Layer::Tcti);
        assert_eq!(
            ResponseCode::new(0x000a_000a).name(),
            Some("TSS2_TCTI_RC_IO_ERROR")
        );
        // A TPM code relayed by a resource manager keeps its TPM meaning.
        assert_eq!(
            ResponseCode::new(0x000c_0922).tpm_base(),
            Some(TPM_RC_RETRY)
        );
        assert_eq!(ResponseCode::new(0x0007_0005).tpm_base(), None);
    }

    #[test]
    fn unknown_codes_still_print_their_value() {
        let text = ResponseCode::new(0x0007_00ff).to_string();
        assert!(text.contains("0x000700ff"), "{text}");
    }
}
