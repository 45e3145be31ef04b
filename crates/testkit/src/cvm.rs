//! The real confidential-VM evidence of `asterism-attestation`'s test data, in the forms
//! tests outside that crate need.

use asterism_attestation::tpm::TpmtPublic;
use asterism_attestation::tpm::structures::{ObjectAttributes, PublicParams, alg};
use std::path::PathBuf;

/// An AK's public area as Azure's and Google's vTPMs make it, encoded: named with SHA-256,
/// fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | restricted | sign, without
/// the noDA of the AKs `asterism-tpm` creates, with `params` (for example
/// [`PublicParams::rsassa_sha256`], [`PublicParams::ecdsa_p256`]).
#[allow(clippy::expect_used)] // a test helper fails the test loudly
pub fn cloud_ak_public(params: PublicParams) -> Vec<u8> {
    TpmtPublic {
        name_alg: alg::SHA256,
        attributes: ObjectAttributes(
            ObjectAttributes::FIXED_TPM
                | ObjectAttributes::FIXED_PARENT
                | ObjectAttributes::SENSITIVE_DATA_ORIGIN
                | ObjectAttributes::USER_WITH_AUTH
                | ObjectAttributes::RESTRICTED
                | ObjectAttributes::SIGN,
        ),
        auth_policy: Vec::new(),
        params,
    }
    .to_bytes()
    .expect("an AK public area encodes")
}

/// The directory of the real evidence (`crates/attestation/tests/data/cvm`).
pub fn cvm_data_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../attestation/tests/data/cvm"
    ))
}

/// The real Azure SEV-SNP HCL report, whole (1820 bytes): its test files hold it without
/// the 32-byte header (`HCLA`, version 2, size, request type 2, reserved), which this puts
/// back in front of the SNP report and the runtime data.
pub fn azure_snp_hcl_report() -> std::io::Result<Vec<u8>> {
    let dir = cvm_data_dir().join("snp-azure");
    let body = std::fs::read(dir.join("attestation.bin"))?;
    let runtime = std::fs::read(dir.join("runtimedata.bin"))?;
    let size = u32::try_from(32 + body.len() + runtime.len()).unwrap_or(u32::MAX);
    let mut out = b"HCLA".to_vec();
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&body);
    out.extend_from_slice(&runtime);
    Ok(out)
}
