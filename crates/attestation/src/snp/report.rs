//! The SEV-SNP attestation report: 1184 bytes, little-endian, read field by field at the
//! offsets of AMD's SEV-SNP firmware ABI. Parsing checks the size, the version, the signature
//! algorithm and that reserved bytes are zero; it checks nothing the signature vouches for.

use super::Product;
use crate::ValidationError;

/// Size of an attestation report in bytes.
pub const REPORT_SIZE: usize = 0x4A0;

/// The report bytes the signature covers: everything before the signature.
pub const SIGNED_LEN: usize = 0x2A0;

/// The oldest report version this parser reads (versions 0 and 1 predate the current
/// layout).
pub const MIN_VERSION: u32 = 2;

/// The newest report version this parser reads. A later version may give meaning to bytes
/// that are reserved today, so it is refused until its layout has been read.
pub const MAX_VERSION: u32 = 5;

/// The only signature algorithm of SEV-SNP reports: ECDSA on P-384 with SHA-384.
pub const SIG_ALGO_ECDSA_P384_SHA384: u32 = 1;

/// A raw TCB version, as the report carries it (8 bytes). Its layout depends on the product;
/// [`RawTcb::parts`] decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawTcb(pub [u8; 8]);

impl RawTcb {
    /// The TCB as one little-endian number, the form AMD tools and Azure's `tcbm` print.
    pub fn as_u64(&self) -> u64 {
        u64::from_le_bytes(self.0)
    }

    /// The security version of each component. Milan and Genoa: byte 0 boot loader, 1 TEE,
    /// 6 SNP, 7 microcode. Turin: byte 0 FMC, 1 boot loader, 2 TEE, 3 SNP, 7 microcode.
    pub fn parts(&self, product: Product) -> Tcb {
        let [b0, b1, b2, b3, _, _, b6, b7] = self.0;
        match product {
            Product::Milan | Product::Genoa => Tcb {
                fmc: None,
                bootloader: b0,
                tee: b1,
                snp: b6,
                microcode: b7,
            },
            Product::Turin => Tcb {
                fmc: Some(b0),
                bootloader: b1,
                tee: b2,
                snp: b3,
                microcode: b7,
            },
        }
    }

    /// Whether the bytes the product's layout reserves are zero.
    pub fn reserved_is_zero(&self, product: Product) -> bool {
        let [_, _, b2, b3, b4, b5, b6, _] = self.0;
        match product {
            Product::Milan | Product::Genoa => [b2, b3, b4, b5] == [0; 4],
            Product::Turin => [b4, b5, b6] == [0; 3],
        }
    }
}

/// A decoded TCB version: the security version number (SPL) of each firmware component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tcb {
    /// The FMC (first mutable code) version; Turin and later only.
    pub fmc: Option<u8>,
    /// The PSP boot loader version.
    pub bootloader: u8,
    /// The PSP operating system (TEE) version.
    pub tee: u8,
    /// The SNP firmware version.
    pub snp: u8,
    /// The CPU microcode patch level.
    pub microcode: u8,
}

/// The guest policy the guest owner set at launch (64 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestPolicy(pub u64);

impl GuestPolicy {
    /// Bit 16: the host may run the guest with simultaneous multithreading.
    pub fn smt_allowed(&self) -> bool {
        self.0 & (1 << 16) != 0
    }

    /// Bit 18: the guest may be associated with a migration agent.
    pub fn migrate_ma_allowed(&self) -> bool {
        self.0 & (1 << 18) != 0
    }

    /// Bit 19: the hypervisor may debug the guest (read and write its memory).
    pub fn debug_allowed(&self) -> bool {
        self.0 & (1 << 19) != 0
    }

    /// Bit 20: the guest may only be activated on one socket.
    pub fn single_socket_required(&self) -> bool {
        self.0 & (1 << 20) != 0
    }

    /// Bits 15:8 and 7:0: the minimum firmware ABI (major, minor) the guest requires.
    pub fn abi(&self) -> (u8, u8) {
        let [minor, major, ..] = self.0.to_le_bytes();
        (major, minor)
    }
}

/// Facts about the platform the report was produced on (64 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlatformInfo(pub u64);

impl PlatformInfo {
    /// Bit 0: SMT is enabled on the host.
    pub fn smt_enabled(&self) -> bool {
        self.0 & 1 != 0
    }

    /// Bit 1: transparent memory encryption (TSME) is enabled.
    pub fn tsme_enabled(&self) -> bool {
        self.0 & 2 != 0
    }
}

/// Which key signed the report, from the report's key information field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignerKind {
    /// The chip's Versioned Chip Endorsement Key, certified by AMD per chip and TCB.
    Vcek,
    /// A Versioned Loaded Endorsement Key that AMD issued to a cloud provider.
    Vlek,
}

impl SignerKind {
    /// The certificate name in AMD's documents (`VCEK`, `VLEK`).
    pub fn name(self) -> &'static str {
        match self {
            SignerKind::Vcek => "VCEK",
            SignerKind::Vlek => "VLEK",
        }
    }

    /// The name of the intermediate that certifies this kind of key (`ASK`, `ASVK`).
    pub fn intermediate_name(self) -> &'static str {
        match self {
            SignerKind::Vcek => "ASK",
            SignerKind::Vlek => "ASVK",
        }
    }
}

impl std::fmt::Display for SignerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The key information field (32 bits): author key, chip key masking and the signing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo(pub u32);

impl KeyInfo {
    /// Bit 0: AUTHOR_KEY_DIGEST holds the digest of an author key.
    pub fn author_key_en(&self) -> bool {
        self.0 & 1 != 0
    }

    /// Bit 1: the chip key is masked (the firmware does not sign reports).
    pub fn mask_chip_key(&self) -> bool {
        self.0 & 2 != 0
    }

    /// Bits 4:2: the signing key selector (0 VCEK, 1 VLEK, 7 none).
    pub fn signing_key(&self) -> u32 {
        (self.0 >> 2) & 0b111
    }

    /// The signer the selector names, if it is one that signs.
    pub fn signer(&self) -> Option<SignerKind> {
        match self.signing_key() {
            0 => Some(SignerKind::Vcek),
            1 => Some(SignerKind::Vlek),
            _ => None,
        }
    }
}

/// The CPUID family, model and stepping (report version 3 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpuid {
    /// Combined extended family and family.
    pub family: u8,
    /// Combined extended model and model.
    pub model: u8,
    /// Stepping.
    pub stepping: u8,
}

impl Cpuid {
    /// The product these identify, if a known one.
    pub fn product(&self) -> Option<Product> {
        match (self.family, self.model) {
            (0x19, 0x00..=0x0F) => Some(Product::Milan),
            (0x19, 0x10..=0x1F | 0xA0..=0xAF) => Some(Product::Genoa),
            (0x1A, 0x00..=0x11) => Some(Product::Turin),
            _ => None,
        }
    }
}

/// A firmware version (build, minor, major as stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirmwareVersion {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
    /// Build number.
    pub build: u8,
}

impl std::fmt::Display for FirmwareVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.build)
    }
}

/// A parsed SEV-SNP attestation report. Parsing proves the layout, not the content: only
/// [`super::SnpVerifier`] establishes that AMD's firmware signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnpReport {
    /// Report version (2 to 5).
    pub version: u32,
    /// The guest SVN from the ID block.
    pub guest_svn: u32,
    /// The guest policy.
    pub policy: GuestPolicy,
    /// The family ID from the ID block.
    pub family_id: [u8; 16],
    /// The image ID from the ID block.
    pub image_id: [u8; 16],
    /// The VMPL that requested the report.
    pub vmpl: u32,
    /// The signature algorithm (always 1 after parsing: ECDSA P-384 with SHA-384).
    pub signature_algo: u32,
    /// The platform's current TCB.
    pub current_tcb: RawTcb,
    /// Platform information.
    pub platform_info: PlatformInfo,
    /// Author key, chip key masking and signing key selection.
    pub key_info: KeyInfo,
    /// The 64 bytes the guest asked to be bound into the report.
    pub report_data: [u8; 64],
    /// The launch measurement.
    pub measurement: [u8; 48],
    /// Data the hypervisor provided at launch.
    pub host_data: [u8; 32],
    /// SHA-384 of the ID key that signed the ID block.
    pub id_key_digest: [u8; 48],
    /// SHA-384 of the author key that certified the ID key.
    pub author_key_digest: [u8; 48],
    /// The guest's report ID.
    pub report_id: [u8; 32],
    /// The report ID of the guest's migration agent.
    pub report_id_ma: [u8; 32],
    /// The TCB the signing key was derived for.
    pub reported_tcb: RawTcb,
    /// CPUID family, model and stepping (version 3 and later).
    pub cpuid: Option<Cpuid>,
    /// The chip identifier (zero when masked; on Turin only the first 8 bytes are used).
    pub chip_id: [u8; 64],
    /// The committed TCB.
    pub committed_tcb: RawTcb,
    /// The current firmware version.
    pub current_version: FirmwareVersion,
    /// The committed firmware version.
    pub committed_version: FirmwareVersion,
    /// The current TCB when the guest was launched.
    pub launch_tcb: RawTcb,
    /// The mitigation vector at launch (version 5 and later).
    pub launch_mit_vector: Option<u64>,
    /// The current mitigation vector (version 5 and later).
    pub current_mit_vector: Option<u64>,
    /// Signature component R, little-endian, zero-extended to 72 bytes.
    pub signature_r: [u8; 72],
    /// Signature component S, little-endian, zero-extended to 72 bytes.
    pub signature_s: [u8; 72],
    raw: Box<[u8; REPORT_SIZE]>,
}

/// Reads fixed-size fields in order; every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], ValidationError> {
        let out = self
            .pos
            .checked_add(N)
            .and_then(|end| self.buf.get(self.pos..end))
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or_else(|| malformed(format!("report truncated at offset {:#x}", self.pos)))?;
        self.pos += N;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, ValidationError> {
        Ok(u8::from_le_bytes(self.take()?))
    }

    fn u32(&mut self) -> Result<u32, ValidationError> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, ValidationError> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    fn tcb(&mut self) -> Result<RawTcb, ValidationError> {
        Ok(RawTcb(self.take()?))
    }

    /// Reads `N` reserved bytes that must be zero.
    fn reserved<const N: usize>(&mut self) -> Result<(), ValidationError> {
        let at = self.pos;
        if self.take::<N>()? != [0; N] {
            return Err(malformed(format!(
                "reserved bytes {at:#x}..{:#x} are not zero",
                at + N
            )));
        }
        Ok(())
    }

    fn version(&mut self) -> Result<FirmwareVersion, ValidationError> {
        let [build, minor, major] = self.take()?;
        Ok(FirmwareVersion {
            major,
            minor,
            build,
        })
    }
}

fn malformed(msg: String) -> ValidationError {
    ValidationError::Malformed(format!("SEV-SNP report: {msg}"))
}

impl SnpReport {
    /// Parses a report: exactly [`REPORT_SIZE`] bytes, version 2 to 5, signature algorithm 1,
    /// reserved bytes zero (after key information, after the CPUID fields, after both
    /// firmware versions, after the launch TCB or mitigation vectors, after the signature, and
    /// the unused high bytes of R and S), and reserved key information bits 31:5 zero.
    pub fn parse(bytes: &[u8]) -> Result<Self, ValidationError> {
        let raw: [u8; REPORT_SIZE] = bytes.try_into().map_err(|_| {
            malformed(format!(
                "{} bytes, expected exactly {REPORT_SIZE}",
                bytes.len()
            ))
        })?;
        let mut r = Reader { buf: &raw, pos: 0 };
        let version = r.u32()?;
        if !(MIN_VERSION..=MAX_VERSION).contains(&version) {
            return Err(malformed(format!(
                "version {version}, this parser reads {MIN_VERSION} to {MAX_VERSION}"
            )));
        }
        let guest_svn = r.u32()?;
        let policy = GuestPolicy(r.u64()?);
        let family_id = r.take()?;
        let image_id = r.take()?;
        let vmpl = r.u32()?;
        let signature_algo = r.u32()?;
        if signature_algo != SIG_ALGO_ECDSA_P384_SHA384 {
            return Err(malformed(format!(
                "signature_algo {signature_algo}, expected {SIG_ALGO_ECDSA_P384_SHA384} (ECDSA P-384 SHA-384)"
            )));
        }
        let current_tcb = r.tcb()?;
        let platform_info = PlatformInfo(r.u64()?);
        let key_info = KeyInfo(r.u32()?);
        if key_info.0 >> 5 != 0 {
            return Err(malformed(format!(
                "key information {:#x} has reserved bits 31:5 set",
                key_info.0
            )));
        }
        r.reserved::<4>()?;
        let report_data = r.take()?;
        let measurement = r.take()?;
        let host_data = r.take()?;
        let id_key_digest = r.take()?;
        let author_key_digest = r.take()?;
        let report_id = r.take()?;
        let report_id_ma = r.take()?;
        let reported_tcb = r.tcb()?;
        let cpuid = if version >= 3 {
            let cpuid = Cpuid {
                family: r.u8()?,
                model: r.u8()?,
                stepping: r.u8()?,
            };
            r.reserved::<21>()?;
            Some(cpuid)
        } else {
            r.reserved::<24>()?;
            None
        };
        let chip_id = r.take()?;
        let committed_tcb = r.tcb()?;
        let current_version = r.version()?;
        r.reserved::<1>()?;
        let committed_version = r.version()?;
        r.reserved::<1>()?;
        let launch_tcb = r.tcb()?;
        let (launch_mit_vector, current_mit_vector) = if version >= 5 {
            let launch = r.u64()?;
            let current = r.u64()?;
            r.reserved::<152>()?;
            (Some(launch), Some(current))
        } else {
            r.reserved::<168>()?;
            (None, None)
        };
        // R and S are 48-byte numbers stored little-endian in 72-byte fields.
        let signature_r = r.take()?;
        let signature_s = r.take()?;
        for (name, v) in [("R", &signature_r), ("S", &signature_s)] {
            if v.get(48..).is_some_and(|high| high.iter().any(|b| *b != 0)) {
                return Err(malformed(format!(
                    "signature {name} is wider than 48 bytes"
                )));
            }
        }
        r.reserved::<{ REPORT_SIZE - SIGNED_LEN - 144 }>()?;
        if r.pos != REPORT_SIZE {
            return Err(malformed(format!("layout ends at {:#x}", r.pos)));
        }
        Ok(Self {
            version,
            guest_svn,
            policy,
            family_id,
            image_id,
            vmpl,
            signature_algo,
            current_tcb,
            platform_info,
            key_info,
            report_data,
            measurement,
            host_data,
            id_key_digest,
            author_key_digest,
            report_id,
            report_id_ma,
            reported_tcb,
            cpuid,
            chip_id,
            committed_tcb,
            current_version,
            committed_version,
            launch_tcb,
            launch_mit_vector,
            current_mit_vector,
            signature_r,
            signature_s,
            raw: Box::new(raw),
        })
    }

    /// The report as received.
    pub fn as_bytes(&self) -> &[u8; REPORT_SIZE] {
        &self.raw
    }

    /// The bytes the signature covers (offsets 0 to 0x29F).
    pub fn signed_bytes(&self) -> &[u8] {
        self.raw.get(..SIGNED_LEN).unwrap_or_default()
    }

    /// The signature as big-endian R ‖ S (96 bytes), the fixed form of ECDSA P-384.
    pub fn signature_fixed(&self) -> [u8; 96] {
        let mut out = [0u8; 96];
        let (r_out, s_out) = out.split_at_mut(48);
        for (dst, src) in r_out.iter_mut().rev().zip(self.signature_r.iter()) {
            *dst = *src;
        }
        for (dst, src) in s_out.iter_mut().rev().zip(self.signature_s.iter()) {
            *dst = *src;
        }
        out
    }
}
