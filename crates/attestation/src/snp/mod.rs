//! AMD SEV-SNP attestation reports: parsing, the AMD certificate chain, and the policy a
//! report must meet.
//!
//! [`SnpVerifier::verify`] checks, in order, stopping at the first failure of the first four
//! steps (nothing after them could be trusted) and running every field check of step 5:
//!
//! 1. the report's layout ([`SnpReport::parse`]) and that the policy allows its signer (VCEK
//!    or VLEK);
//! 2. the chain: the signing key's certificate (VCEK or VLEK) is signed by an ASK (or ASVK),
//!    which is signed by one of the AMD roots embedded here (Milan, Genoa, Turin); each
//!    certificate is inside its validity at the `now` the caller passes. The product is the
//!    root the chain ends at, and must agree with the certificate's product name and, from
//!    report version 3 on, with the CPUID family and model;
//! 3. the certificate against the report: the chip ID (VCEK only) and each part of
//!    `reported_tcb` equal the certificate's extensions;
//! 4. the report's ECDSA P-384 signature over bytes 0 to 0x29F;
//! 5. the fields ([`check_fields`]): REPORT_DATA (constant time), each TCB part against its
//!    minimum, the guest policy bits, the VMPL, the launch measurement, host data and the ID
//!    and author key digests.
//!
//! Nothing here reads the clock, the network or files: certificates come in as
//! [`SnpCerts`], and where to fetch them is [`kds`]'s business.

mod certs;
pub mod kds;
mod policy;
mod report;
mod verify;

pub(crate) use certs::verify_pss_raw;
pub use certs::{SnpCerts, embedded_ark, embedded_intermediate};
pub use policy::{
    GENOA_SNP_FLOOR, MILAN_SNP_FLOOR, MinimumTcb, PerProduct, SnpPolicy, check_fields,
};
pub use report::{
    Cpuid, FirmwareVersion, GuestPolicy, KeyInfo, MAX_VERSION, MIN_VERSION, PlatformInfo,
    REPORT_SIZE, RawTcb, SIGNED_LEN, SignerKind, SnpReport, Tcb,
};
pub use verify::{SnpVerifier, VerifiedSnpReport};

/// An AMD EPYC generation with SEV-SNP, each with its own root key (ARK).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Product {
    /// EPYC 7003 (Zen 3).
    Milan,
    /// EPYC 9004 (Zen 4).
    Genoa,
    /// EPYC 9005 (Zen 5).
    Turin,
}

impl Product {
    /// Every product, in order of release.
    pub const ALL: [Product; 3] = [Product::Milan, Product::Genoa, Product::Turin];

    /// The name AMD uses in certificates and KDS URLs (`Milan`, `Genoa`, `Turin`).
    pub fn name(self) -> &'static str {
        match self {
            Product::Milan => "Milan",
            Product::Genoa => "Genoa",
            Product::Turin => "Turin",
        }
    }

    /// The product a VCEK's product name extension names. AMD appends the stepping
    /// (`Milan-B0`), which is not part of the product.
    pub fn from_product_name(name: &str) -> Option<Product> {
        let base = name.split('-').next().unwrap_or(name);
        Product::ALL.into_iter().find(|p| p.name() == base)
    }
}

impl std::fmt::Display for Product {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
