//! The real confidential-VM evidence of `asterism-attestation`'s test data, in the forms
//! tests outside that crate need.

use asterism_attestation::snp::{MinimumTcb, PerProduct, SnpPolicy};
use asterism_attestation::tpm::TpmtPublic;
use asterism_attestation::tpm::structures::{ObjectAttributes, PublicParams, alg};
use base64::Engine as _;
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

/// The vTPM AK that Azure runtime data names (the RSA JWK `HCLAkPub`), as a public area
/// the way Azure's vTPM makes it ([`cloud_ak_public`]). Read with `serde_json`, apart from
/// the verifier's own runtime-data parser.
#[allow(clippy::expect_used)] // a test helper fails the test loudly
pub fn azure_ak_public(runtime: &[u8]) -> Vec<u8> {
    let json: serde_json::Value = serde_json::from_slice(runtime).expect("runtime data is JSON");
    let n = json
        .get("keys")
        .and_then(serde_json::Value::as_array)
        .expect("runtime data has keys")
        .iter()
        .find(|k| k.get("kid").and_then(serde_json::Value::as_str) == Some("HCLAkPub"))
        .and_then(|k| k.get("n")?.as_str())
        .expect("runtime data names HCLAkPub with its modulus");
    let n = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(n)
        .expect("the modulus is base64url");
    cloud_ak_public(PublicParams::rsassa_sha256(n, 0))
}

/// The directory of the real evidence (`crates/attestation/tests/data/cvm`).
pub fn cvm_data_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../attestation/tests/data/cvm"
    ))
}

/// A file of the real evidence, by its path below [`cvm_data_dir`] (`snp-azure/vcek.pem`).
#[allow(clippy::panic)] // a test helper fails the test loudly
pub fn read_cvm(path: &str) -> Vec<u8> {
    let file = cvm_data_dir().join(path);
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// The real AWS SEV-SNP report (`snp-aws/report.txt`, stored in base64), decoded.
#[allow(clippy::expect_used)] // a test helper fails the test loudly
pub fn aws_snp_report() -> Vec<u8> {
    let text = String::from_utf8(read_cvm("snp-aws/report.txt")).expect("the report is text");
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .expect("the report is base64")
}

/// The real Azure SEV-SNP report's own TCB (boot loader 2, TEE 0, SNP 6, microcode 93):
/// older than the default Milan floor, and the lowest of the three real reports, so each of
/// them meets it.
const AZURE_SNP_TCB: MinimumTcb = MinimumTcb {
    bootloader: 2,
    tee: 0,
    snp: 6,
    microcode: 93,
    fmc: 0,
};

/// The default SEV-SNP policy with the Milan floor at the real Azure report's own TCB,
/// which the default floor refuses; no floor for Genoa and Turin, as by default. The floors have tests of
/// their own (`asterism-attestation`'s `tests/it/snp.rs`).
pub fn snp_policy_at_the_azure_tcb() -> SnpPolicy {
    SnpPolicy {
        minimum_tcb: PerProduct {
            milan: Some(AZURE_SNP_TCB),
            ..PerProduct::default()
        },
        ..SnpPolicy::default()
    }
}

/// The real Azure SEV-SNP HCL report, whole (1820 bytes): [`azure_snp_hcl_of`] its SNP
/// report and runtime data.
pub fn azure_snp_hcl_report() -> std::io::Result<Vec<u8>> {
    let dir = cvm_data_dir().join("snp-azure");
    let body = std::fs::read(dir.join("attestation.bin"))?;
    let runtime = std::fs::read(dir.join("runtimedata.bin"))?;
    Ok(azure_snp_hcl_of(&body, &runtime))
}

/// An Azure SEV-SNP HCL report of `body` (the SNP report and its padding, as
/// `snp-azure/attestation.bin` holds it) and `runtime` (its runtime data). The test files
/// hold the report without its 32-byte header (`HCLA`, version 2, size, request type 2,
/// reserved), which this puts back in front.
pub fn azure_snp_hcl_of(body: &[u8], runtime: &[u8]) -> Vec<u8> {
    let size = u32::try_from(32 + body.len() + runtime.len()).unwrap_or(u32::MAX);
    let mut out = b"HCLA".to_vec();
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(body);
    out.extend_from_slice(runtime);
    out
}
