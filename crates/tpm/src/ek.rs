//! Where TPMs keep their endorsement-key (EK) certificates.
//!
//! TCG EK Credential Profile: a manufacturer (or swtpm_setup) writes the DER certificate of
//! each EK into a well-known NV index in the platform range.

/// An NV index that holds an EK certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EkCertSlot {
    /// RSA-2048 EK certificate, NV index `0x01C00002`.
    Rsa2048,
    /// ECC NIST P-256 EK certificate, NV index `0x01C0000A`.
    EccP256,
    /// ECC NIST P-384 EK certificate (high range), NV index `0x01C00016`. swtpm_setup
    /// 0.7 writes its ECC EK certificate here.
    EccP384,
}

impl EkCertSlot {
    /// Every slot, in the order a caller would usually look.
    pub const ALL: [EkCertSlot; 3] = [
        EkCertSlot::Rsa2048,
        EkCertSlot::EccP256,
        EkCertSlot::EccP384,
    ];

    /// The NV index.
    pub const fn nv_index(self) -> u32 {
        match self {
            EkCertSlot::Rsa2048 => 0x01C0_0002,
            EkCertSlot::EccP256 => 0x01C0_000A,
            EkCertSlot::EccP384 => 0x01C0_0016,
        }
    }
}
