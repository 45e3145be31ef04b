//! The SEV-SNP certificate parsers and chain checks on arbitrary certificates: a real Azure
//! report with a fuzzed VCEK and ASK (DER, or a THIM JSON document) must never panic, and
//! must never verify unless the certificates are AMD's.
#![no_main]

use asterism_attestation::InsecureNoLaunchMeasurement;
use asterism_attestation::snp::{PerProduct, SnpCerts, SnpPolicy, SnpVerifier};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

/// The real Azure report (the HCL report's hardware part, without its 32-byte header).
const AZURE: &[u8] = include_bytes!("../../crates/attestation/tests/data/cvm/snp-azure/attestation.bin");
const VCEK: &[u8] = include_bytes!("../../crates/attestation/tests/data/cvm/snp-azure/vcek.cert");

fn verifier() -> &'static SnpVerifier {
    static V: OnceLock<SnpVerifier> = OnceLock::new();
    V.get_or_init(|| {
        SnpVerifier::new(SnpPolicy {
            minimum_tcb: PerProduct::default(),
            insecure_no_launch_measurement: Some(InsecureNoLaunchMeasurement::insecure_new()),
            ..SnpPolicy::default()
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Some(report) = AZURE.get(..1184) else {
        return;
    };
    let Some(expected) = report
        .get(0x50..0x90)
        .and_then(|r| <[u8; 64]>::try_from(r).ok())
    else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs(1_748_736_000);
    // First byte: where the leaf ends; the rest, the intermediate.
    let (leaf, intermediate) = match data.split_first() {
        Some((&cut, rest)) => rest.split_at((usize::from(cut) * 8).min(rest.len())),
        None => (data, &[][..]),
    };
    let mut shapes = Vec::new();
    if let Ok(certs) = SnpCerts::from_der(
        leaf,
        (!intermediate.is_empty()).then_some(intermediate),
        None,
    ) {
        shapes.push(certs);
    }
    if let Ok(certs) = SnpCerts::from_thim_json(data) {
        shapes.push(certs);
    }
    if let Ok(certs) = SnpCerts::from_pem(leaf, Some(intermediate)) {
        shapes.push(certs);
    }
    for certs in shapes {
        if verifier().verify(report, &certs, &expected, now).is_ok() {
            // Only the real VCEK signed this report.
            assert_eq!(certs.leaf_der(), VCEK);
        }
    }
});
