//! A cloud's AK made from the template it keeps in NV, as on a GCE vTPM: here an swtpm
//! stands in for the vTPM and the test plays Google, writing an AK template into NV index
//! 0x01c10003 and a certificate into 0x01c10002.

use asterism_testkit::Swtpm;
use asterism_tpm::{
    AkAlgorithm, AkLocation, EkCertSlot, NvTemplateAk, PcrSelection, Tpm, TpmError,
};
use tss_esapi::attributes::{ObjectAttributes, ObjectAttributesBuilder};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::structures::{
    EccPoint, EccScheme, HashScheme, KeyDerivationFunctionScheme, PublicBuilder,
    PublicEccParametersBuilder, SymmetricDefinitionObject,
};
use tss_esapi::traits::Marshall;

use crate::common::{parse_public, verify_quote_signature};
use crate::hcl_report::paravisor_writes;

/// Google's AK attributes: fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth |
/// restricted | sign (no noDA).
const GOOGLE_AK_ATTRIBUTES: u32 = 0x0005_0072;

/// An ECC P-256 ECDSA-SHA256 signing-key template with `attributes`, marshalled.
fn ecc_template(attributes: ObjectAttributes, restricted: bool) -> Vec<u8> {
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Ecc)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_ecc_parameters(
            PublicEccParametersBuilder::new()
                .with_symmetric(SymmetricDefinitionObject::Null)
                .with_ecc_scheme(EccScheme::EcDsa(HashScheme::new(HashingAlgorithm::Sha256)))
                .with_curve(EccCurve::NistP256)
                .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                .with_is_signing_key(true)
                .with_restricted(restricted)
                .build()
                .unwrap(),
        )
        .with_ecc_unique_identifier(EccPoint::default())
        .build()
        .unwrap()
        .marshall()
        .unwrap()
}

/// Google's ECC AK template.
fn google_ecc_template() -> Vec<u8> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_restricted(true)
        .with_sign_encrypt(true)
        .build()
        .unwrap();
    assert_eq!(u32::from(attributes), GOOGLE_AK_ATTRIBUTES);
    ecc_template(attributes, true)
}

#[test]
fn the_gce_ak_is_made_from_its_nv_template_and_quotes_with_its_certificate() {
    let swtpm = Swtpm::builder().with_ek_cert(true).start().unwrap();
    let open = || Tpm::open(&swtpm.config()).unwrap();

    // No template: refused, naming both indices where GCE keeps them.
    let err = open().load_gce_ak(None).unwrap_err();
    assert!(matches!(err, TpmError::NoAkTemplate { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("0x01c10003") && message.contains("0x01c10001"),
        "{message}"
    );

    // The template, padded as NV indices often are; no certificate yet.
    let mut template = google_ecc_template();
    template.resize(template.len() + 8, 0);
    paravisor_writes(&swtpm, NvTemplateAk::GCE_ECC.template_index, &template);
    let err = open().load_gce_ak(None).unwrap_err();
    assert!(
        matches!(err, TpmError::NvIndexNotDefined { index: 0x01c1_0002 }),
        "{err}"
    );
    // The RSA AK, asked for by name: its template is not there.
    let err = open().load_gce_ak(Some(AkAlgorithm::Rsa2048)).unwrap_err();
    assert!(err.to_string().contains("0x01c10001"), "{err}");

    // Any certificate will do here (the verifier's side is tested elsewhere): swtpm's EK
    // certificate, padded.
    let cert = open()
        .read_ek_certificate(EkCertSlot::Rsa2048)
        .unwrap()
        .unwrap();
    let mut nv = cert.clone();
    nv.resize(cert.len() + 8, 0xff);
    paravisor_writes(&swtpm, NvTemplateAk::GCE_ECC.certificate_index, &nv);

    let mut tpm = open();
    let (ak, read) = tpm.load_gce_ak(None).unwrap();
    assert_eq!(read, cert, "the certificate without its padding");
    assert_eq!(ak.location(), AkLocation::NvTemplate(NvTemplateAk::GCE_ECC));
    assert_eq!(ak.handle(), None, "not persisted");
    assert_eq!(ak.algorithm(), AkAlgorithm::EccP256);
    assert_eq!(
        parse_public(ak.public_area()).attributes,
        GOOGLE_AK_ATTRIBUTES
    );

    // A primary key: the same key on every load, on this connection and on others.
    let again = tpm.load_nv_template_ak(&NvTemplateAk::GCE_ECC).unwrap();
    assert_eq!(again.public_area(), ak.public_area());
    let quote = tpm
        .quote(&ak, &[5; 32], &PcrSelection::new([0, 7]).unwrap())
        .unwrap();
    verify_quote_signature(ak.public_area(), &quote.attest, &quote.signature);
    drop(tpm);
    for _ in 0..4 {
        let (other, _) = open().load_gce_ak(None).unwrap();
        assert_eq!(other.public_area(), ak.public_area());
    }
}

#[test]
fn a_template_that_makes_no_attestation_key_is_refused_naming_its_index() {
    let swtpm = Swtpm::start().unwrap();
    let index = NvTemplateAk::GCE_ECC.template_index;
    // Unrestricted: the key could sign anything, a forged quote included.
    let unrestricted = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_sign_encrypt(true)
        .build()
        .unwrap();
    let template = ecc_template(unrestricted, false);
    paravisor_writes(&swtpm, index, &template);
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let err = tpm.load_nv_template_ak(&NvTemplateAk::GCE_ECC).unwrap_err();
    assert!(
        matches!(&err, TpmError::AkTemplateUnusable { index: 0x01c1_0003, reason } if reason.contains("restricted")),
        "{err}"
    );
    assert!(err.to_string().contains("0x01c10003"), "{err}");
    // An ECC template where an RSA AK is asked for.
    let rsa_here = NvTemplateAk {
        algorithm: AkAlgorithm::Rsa2048,
        ..NvTemplateAk::GCE_ECC
    };
    assert!(matches!(
        tpm.load_nv_template_ak(&rsa_here),
        Err(TpmError::AkTemplateUnusable { .. })
    ));
    drop(tpm);

    // Not a TPMT_PUBLIC at all.
    let garbage = NvTemplateAk {
        template_index: 0x01c1_0005,
        ..NvTemplateAk::GCE_ECC
    };
    paravisor_writes(&swtpm, garbage.template_index, &[0xde, 0xad, 0xbe, 0xef]);
    let err = Tpm::open(&swtpm.config())
        .unwrap()
        .load_nv_template_ak(&garbage)
        .unwrap_err();
    assert!(
        matches!(&err, TpmError::AkTemplateUnusable { reason, .. } if reason.contains("TPMT_PUBLIC")),
        "{err}"
    );
}

/// The transient handles loaded in `swtpm`, as tpm2-tools lists them; `None` when tpm2-tools
/// is not installed.
fn transient_handles(swtpm: &Swtpm) -> Option<String> {
    let output = match asterism_children::output(std::process::Command::new("tpm2_getcap").args([
        "handles-transient",
        "-T",
        &swtpm.tcti(),
    ])) {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("running tpm2_getcap: {e}"),
    };
    assert!(output.status.success(), "tpm2_getcap failed");
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn a_flushed_template_ak_is_made_again_and_a_dropped_connection_leaves_none_loaded() {
    let swtpm = Swtpm::start().unwrap();
    // The same template in more NV indices than swtpm has transient slots (3): loading
    // them all exhausts the slots, and the retry flushes every transient object, the
    // first AK among them.
    let aks: Vec<NvTemplateAk> = (0..4u32)
        .map(|i| NvTemplateAk {
            template_index: 0x01c1_0003 + (i << 4),
            ..NvTemplateAk::GCE_ECC
        })
        .collect();
    for ak in &aks {
        paravisor_writes(&swtpm, ak.template_index, &google_ecc_template());
    }
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let first = tpm.load_nv_template_ak(&aks[0]).unwrap();
    for ak in &aks[1..] {
        let other = tpm.load_nv_template_ak(ak).unwrap();
        assert_eq!(
            other.public_area(),
            first.public_area(),
            "one template, one key"
        );
    }
    // The first AK was flushed: quoting makes it again from its template.
    let quote = tpm
        .quote(&first, &[1; 32], &PcrSelection::new([0]).unwrap())
        .unwrap();
    verify_quote_signature(first.public_area(), &quote.attest, &quote.signature);
    drop(tpm);

    // Without a resource manager a transient object outlives its connection unless
    // flushed; the binding flushes what the connection created when it is dropped.
    if let Some(handles) = transient_handles(&swtpm) {
        assert!(!handles.contains("0x80"), "left loaded: {handles}");
    }
}
