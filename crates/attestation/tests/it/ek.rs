//! EK certificates against a bundle of TPM manufacturers' CAs: the real vendors' CA files
//! load (PEM and DER alike), bad bundle files are refused by name, and every profile check
//! refuses a certificate made to miss it. swtpm's real EK certificates are verified in
//! `asterism-tpm`'s tests (`ek_certificate.rs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::ca_params;
use asterism_attestation::tpm::ek::{EkCaBundle, EkCaBundleError, EkError, certificates_from_nv};
use asterism_attestation::tpm::structures::{
    AsymScheme, KdfScheme, ObjectAttributes, PublicParams, SymDefObject, TpmtPublic, alg,
};
use rcgen::{
    CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

fn data(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tpm-ek-ca")
        .join(dir)
}

/// 2025-06-01: inside the validity of every vendor file (two expire on 2025-10-20).
fn june_2025() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_748_736_000)
}

fn read(dir: &str, file: &str) -> Vec<u8> {
    std::fs::read(data(dir).join(file)).unwrap()
}

fn bundle_dir(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    dir
}

#[test]
fn every_vendor_ca_file_loads() {
    let bundle = EkCaBundle::load_dir(&data("vendors"), june_2025()).unwrap();
    assert_eq!(bundle.len(), 51);
}

#[test]
fn der_and_pem_files_load_side_by_side() {
    let dir = bundle_dir(&[
        ("tpm_ek_root_1.cer", &read("gcp", "tpm_ek_root_1.cer")),
        (
            "tpm_ek_intermediate_2.crt",
            &read("gcp", "tpm_ek_intermediate_2.crt"),
        ),
        (
            "gcp_ek_ak_ca_root.crt",
            &read("gcp", "gcp_ek_ak_ca_root.crt"),
        ),
        ("STM_RSA_RT.pem", &read("vendors", "STM_RSA_RT.pem")),
    ]);
    let bundle = EkCaBundle::load_dir(dir.path(), june_2025()).unwrap();
    assert_eq!(bundle.len(), 4);
}

#[test]
fn an_expired_vendor_file_is_refused_by_name() {
    // IFX1.pem expired on 2025-10-20; a bundle checked after that refuses it.
    let dir = bundle_dir(&[
        ("IFX1.pem", &read("vendors", "IFX1.pem")),
        ("IFX15.pem", &read("vendors", "IFX15.pem")),
    ]);
    let later = june_2025() + Duration::from_secs(365 * 86_400);
    let err = EkCaBundle::load_dir(dir.path(), later).unwrap_err();
    assert!(
        matches!(&err, EkCaBundleError::NotValid { file, .. } if file == "IFX1.pem"),
        "{err}"
    );
    assert!(err.to_string().contains("2025"), "{err}");
}

#[test]
fn a_file_that_is_not_a_certificate_is_refused_by_name() {
    let stm = read("vendors", "STM_RSA_RT.pem");
    // A PEM block of another kind is refused even when it holds a certificate's bytes.
    let relabelled = String::from_utf8(stm.clone())
        .unwrap()
        .replace("CERTIFICATE-----", "TRUSTED CERTIFICATE-----");
    for (name, bytes) in [
        ("trusted.pem", relabelled.as_bytes()),
        ("notes.txt", b"these are the Infineon roots".as_slice()),
        (
            "key.pem",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".as_slice(),
        ),
        ("truncated.der", &stm_der()[..200]),
    ] {
        let dir = bundle_dir(&[("STM_RSA_RT.pem", &stm), (name, bytes)]);
        let err = EkCaBundle::load_dir(dir.path(), june_2025()).unwrap_err();
        assert!(
            matches!(&err, EkCaBundleError::NotACertificate { file, .. } if file == name),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
    let dir = bundle_dir(&[("STM_RSA_RT.pem", &stm)]);
    std::fs::create_dir(dir.path().join("more")).unwrap();
    let err = EkCaBundle::load_dir(dir.path(), june_2025()).unwrap_err();
    assert!(matches!(&err, EkCaBundleError::NotACertificate { file, .. } if file == "more"));
}

fn stm_der() -> Vec<u8> {
    let pem = read("vendors", "STM_RSA_RT.pem");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    pem.contents
}

#[test]
fn an_empty_bundle_is_refused() {
    let dir = bundle_dir(&[]);
    let err = EkCaBundle::load_dir(dir.path(), june_2025()).unwrap_err();
    assert!(matches!(err, EkCaBundleError::Empty { .. }), "{err}");
}

// ---- a synthetic manufacturer: root → intermediate → EK certificate ----

fn now() -> SystemTime {
    SystemTime::now()
}

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: Vec<u8>,
}

impl Ca {
    fn root_with(name: &str, edit: impl FnOnce(&mut CertificateParams)) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = ca_params(name);
        edit(&mut params);
        let der = params.self_signed(&key).unwrap().der().to_vec();
        Self {
            issuer: Issuer::new(params, key),
            der,
        }
    }

    fn root(name: &str) -> Self {
        Self::root_with(name, |_| {})
    }

    fn intermediate_with(&self, name: &str, edit: impl FnOnce(&mut CertificateParams)) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = ca_params(name);
        edit(&mut params);
        let der = params.signed_by(&key, &self.issuer).unwrap().der().to_vec();
        Self {
            issuer: Issuer::new(params, key),
            der,
        }
    }

    fn intermediate(&self, name: &str) -> Self {
        self.intermediate_with(name, |_| {})
    }

    /// An EK certificate for `ek` as the profile wants it, after `edit`.
    fn certify_ek(&self, ek: &KeyPair, edit: impl FnOnce(&mut CertificateParams)) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.key_usages = vec![KeyUsagePurpose::KeyAgreement];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::Other(vec![2, 23, 133, 8, 1])];
        params.custom_extensions = vec![san_extension(true), tpm_specification_extension()];
        edit(&mut params);
        params.signed_by(ek, &self.issuer).unwrap().der().to_vec()
    }

    fn pem(&self) -> Vec<u8> {
        let mut out = b"-----BEGIN CERTIFICATE-----\n".to_vec();
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&self.der);
        for line in b64.as_bytes().chunks(64) {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
        out.extend_from_slice(b"-----END CERTIFICATE-----\n");
        out
    }
}

fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    assert!(content.len() < 0x80);
    let mut out = vec![tag, content.len() as u8];
    out.extend_from_slice(content);
    out
}

fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    der(0x30, &parts.concat())
}

/// subjectAltName with a directoryName holding manufacturer, model and version, one RDN
/// each (`all`) or without the version.
fn san_extension(all: bool) -> CustomExtension {
    let attr = |last: u8, value: &str| {
        der(
            0x31,
            &seq(&[
                der(0x06, &[0x67, 0x81, 0x05, 0x02, last]),
                der(0x0C, value.as_bytes()),
            ]),
        )
    };
    let mut rdns = vec![attr(1, "id:414D4400"), attr(2, "test model")];
    if all {
        rdns.push(attr(3, "id:00010002"));
    }
    let name = seq(&rdns);
    let mut ext = CustomExtension::from_oid_content(&[2, 5, 29, 17], seq(&[der(0xA4, &name)]));
    ext.set_criticality(true);
    ext
}

/// subjectDirectoryAttributes with tpmSpecification { "2.0", 0, 164 }.
fn tpm_specification_extension() -> CustomExtension {
    let spec = seq(&[der(0x0C, b"2.0"), der(0x02, &[0]), der(0x02, &[0, 0xA4])]);
    let attr = seq(&[der(0x06, &[0x67, 0x81, 0x05, 0x02, 0x10]), der(0x31, &spec)]);
    CustomExtension::from_oid_content(&[2, 5, 29, 9], seq(&[attr]))
}

/// The TPMT_PUBLIC of an ECC P-256 EK whose key is `key`'s (TCG template L-2's shape).
fn ek_public(key: &KeyPair) -> Vec<u8> {
    let raw = key.public_key_raw();
    TpmtPublic {
        name_alg: alg::SHA256,
        attributes: ObjectAttributes(0x0003_00B2),
        auth_policy: vec![0x83; 32],
        params: PublicParams::Ecc {
            symmetric: SymDefObject::Cipher {
                algorithm: alg::AES,
                key_bits: 128,
                mode: 0x0043,
            },
            scheme: AsymScheme::Null,
            curve: 0x0003,
            kdf: KdfScheme::Null,
            x: raw[1..33].to_vec(),
            y: raw[33..65].to_vec(),
        },
    }
    .to_bytes()
    .unwrap()
}

struct Manufacturer {
    root: Ca,
    intermediate: Ca,
    bundle: EkCaBundle,
}

/// A manufacturer whose bundle holds its root and intermediate.
fn manufacturer() -> Manufacturer {
    let root = Ca::root("Test TPM Root CA");
    let intermediate = root.intermediate("Test TPM EK CA 01");
    let bundle = EkCaBundle::from_files(
        [
            ("root.pem".to_owned(), root.pem()),
            ("intermediate.der".to_owned(), intermediate.der.clone()),
        ],
        now(),
    )
    .unwrap();
    Manufacturer {
        root,
        intermediate,
        bundle,
    }
}

fn root_only(root: &Ca) -> EkCaBundle {
    EkCaBundle::from_files([("root.pem".to_owned(), root.pem())], now()).unwrap()
}

#[test]
fn an_ek_certificate_of_a_trusted_manufacturer_verifies() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |_| {});
    let verified = m.bundle.verify(&cert, &[], &ek_public(&ek), now()).unwrap();
    assert_eq!(verified.tpm().manufacturer, "id:414D4400");
    assert_eq!(verified.tpm().manufacturer_id(), Some(0x414D_4400));
    assert_eq!(verified.tpm().model, "test model");
    assert_eq!(verified.tpm().version, "id:00010002");
    assert_eq!(verified.tpm().specification.family, "2.0");
    assert_eq!(verified.tpm().specification.revision, 164);
    assert_eq!(verified.anchor_file(), "intermediate.der");
    assert_eq!(verified.certificate(), cert.as_slice());

    // NV padding after the certificate is not part of it.
    let mut padded = cert.clone();
    padded.extend_from_slice(&[0xFF; 64]);
    m.bundle
        .verify(&padded, &[], &ek_public(&ek), now())
        .unwrap();
}

#[test]
fn the_intermediate_may_come_from_the_tpms_chain_indices() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |_| {});
    let bundle = root_only(&m.root);
    // Without the chain, the refusal names the intermediate the bundle lacks.
    let err = bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert_eq!(
        err,
        EkError::UntrustedIssuer {
            issuer: "CN=Test TPM EK CA 01".into()
        }
    );
    let mut nv = m.intermediate.der.clone();
    nv.extend_from_slice(&[0; 16]);
    let chain = certificates_from_nv(&nv).unwrap();
    let verified = bundle
        .verify(&cert, &chain, &ek_public(&ek), now())
        .unwrap();
    assert_eq!(verified.anchor_file(), "root.pem");
}

#[test]
fn a_certificate_of_another_manufacturer_is_untrusted_and_names_its_issuer() {
    let trusted = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let elsewhere = Ca::root("Other TPM Root CA").intermediate("Other TPM EK CA 07");
    let cert = elsewhere.certify_ek(&ek, |_| {});
    let err = trusted
        .bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert_eq!(
        err,
        EkError::UntrustedIssuer {
            issuer: "CN=Other TPM EK CA 07".into()
        }
    );
    assert!(err.to_string().contains("CN=Other TPM EK CA 07"), "{err}");
    // With its intermediate, the missing name is the other root's.
    let err = trusted
        .bundle
        .verify(
            &cert,
            std::slice::from_ref(&elsewhere.der),
            &ek_public(&ek),
            now(),
        )
        .unwrap_err();
    assert_eq!(
        err,
        EkError::UntrustedIssuer {
            issuer: "CN=Other TPM Root CA".into()
        }
    );

    let other = manufacturer();
    let cert = other.intermediate.certify_ek(&ek, |_| {});
    // Same names, other keys: found by name, refused by signature.
    let err = trusted
        .bundle
        .verify(
            &cert,
            std::slice::from_ref(&other.intermediate.der),
            &ek_public(&ek),
            now(),
        )
        .unwrap_err();
    assert!(matches!(err, EkError::Chain(_)), "{err}");

    // The real vendors' bundle does not know a test manufacturer either.
    let vendors = EkCaBundle::load_dir(&data("vendors"), june_2025()).unwrap();
    let err = vendors
        .verify(
            &cert,
            &[],
            &ek_public(&ek),
            june_2025() + Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(
        matches!(err, EkError::UntrustedIssuer { .. } | EkError::Chain(_)),
        "{err}"
    );
}

#[test]
fn a_certificate_for_another_key_is_refused() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |_| {});
    let other = KeyPair::generate().unwrap();
    let err = m
        .bundle
        .verify(&cert, &[], &ek_public(&other), now())
        .unwrap_err();
    assert!(matches!(err, EkError::KeyMismatch(_)), "{err}");
}

#[test]
fn an_ecc_ek_certificate_without_key_agreement_is_refused() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |p| {
        p.key_usages = vec![KeyUsagePurpose::KeyEncipherment];
    });
    let err = m
        .bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert!(
        matches!(&err, EkError::KeyUsage(m) if m.contains("keyAgreement")),
        "{err}"
    );
    let cert = m.intermediate.certify_ek(&ek, |p| p.key_usages.clear());
    let err = m
        .bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert!(matches!(err, EkError::KeyUsage(_)), "{err}");
}

#[test]
fn an_ek_certificate_without_the_tpm_attributes_is_refused() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |p| {
        p.custom_extensions = vec![san_extension(false), tpm_specification_extension()];
    });
    let err = m
        .bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert!(
        matches!(&err, EkError::TpmAttributes(m) if m.contains("tpmVersion")),
        "{err}"
    );
    let cert = m.intermediate.certify_ek(&ek, |p| {
        p.custom_extensions = vec![tpm_specification_extension()];
    });
    let err = m
        .bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert!(matches!(err, EkError::TpmAttributes(_)), "{err}");
}

#[test]
fn an_ek_certificate_without_the_tpm_specification_is_refused() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |p| {
        p.custom_extensions = vec![san_extension(true)];
    });
    let err = m
        .bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert!(matches!(err, EkError::TpmSpecification(_)), "{err}");
}

#[test]
fn an_expired_ek_certificate_is_refused() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |p| {
        p.not_after = rcgen::date_time_ymd(2030, 1, 1);
    });
    let after = UNIX_EPOCH + Duration::from_secs(1_893_542_400); // 2030-01-02
    let bundle = EkCaBundle::from_files(
        [("intermediate.der".to_owned(), m.intermediate.der.clone())],
        now(),
    )
    .unwrap();
    let err = bundle
        .verify(&cert, &[], &ek_public(&ek), after)
        .unwrap_err();
    assert!(
        matches!(&err, EkError::Chain(m) if m.contains("Expired")),
        "{err}"
    );
}

#[test]
fn an_issuer_that_is_not_a_ca_is_refused() {
    let m = manufacturer();
    let not_ca = m.root.intermediate_with("Test TPM EK CA 01", |p| {
        p.is_ca = IsCa::ExplicitNoCa;
    });
    let ek = KeyPair::generate().unwrap();
    let cert = not_ca.certify_ek(&ek, |_| {});
    let err = root_only(&m.root)
        .verify(
            &cert,
            std::slice::from_ref(&not_ca.der),
            &ek_public(&ek),
            now(),
        )
        .unwrap_err();
    assert!(matches!(err, EkError::Chain(_)), "{err}");
}

#[test]
fn an_issuer_without_key_cert_sign_is_refused() {
    let m = manufacturer();
    let no_sign = m.root.intermediate_with("Test TPM EK CA 01", |p| {
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    });
    let ek = KeyPair::generate().unwrap();
    let cert = no_sign.certify_ek(&ek, |_| {});
    let err = root_only(&m.root)
        .verify(
            &cert,
            std::slice::from_ref(&no_sign.der),
            &ek_public(&ek),
            now(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, EkError::Issuer { reason, .. } if reason.contains("keyCertSign")),
        "{err}"
    );
}

#[test]
fn a_bundle_certificate_that_expired_since_loading_is_refused() {
    let root = Ca::root_with("Test TPM Root CA", |p| {
        p.not_after = rcgen::date_time_ymd(2030, 1, 1);
    });
    let bundle = root_only(&root);
    let intermediate = root.intermediate("Test TPM EK CA 01");
    let ek = KeyPair::generate().unwrap();
    let cert = intermediate.certify_ek(&ek, |_| {});
    let chain = [intermediate.der.clone()];
    bundle
        .verify(&cert, &chain, &ek_public(&ek), now())
        .unwrap();
    let after = UNIX_EPOCH + Duration::from_secs(1_893_542_400); // 2030-01-02
    let err = bundle
        .verify(&cert, &chain, &ek_public(&ek), after)
        .unwrap_err();
    assert!(
        matches!(&err, EkError::Issuer { subject, reason } if subject == "CN=Test TPM Root CA" && reason.contains("not valid")),
        "{err}"
    );
}

#[test]
fn a_bundle_file_that_is_not_a_ca_is_refused() {
    let root = Ca::root("Test TPM Root CA");
    let ek = KeyPair::generate().unwrap();
    let leaf = root.certify_ek(&ek, |_| {});
    let err = EkCaBundle::from_files(
        [
            ("root.pem".to_owned(), root.pem()),
            ("ek.der".to_owned(), leaf),
        ],
        now(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, EkCaBundleError::NotACa { file, .. } if file == "ek.der"),
        "{err}"
    );
    let no_sign = Ca::root_with("Test TPM Root CA 2", |p| {
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    });
    let err = EkCaBundle::from_files([("no-sign.der".to_owned(), no_sign.der)], now()).unwrap_err();
    assert!(
        matches!(&err, EkCaBundleError::NotACa { file, reason, .. } if file == "no-sign.der" && reason.contains("keyCertSign")),
        "{err}"
    );
}

#[test]
fn a_bundle_file_that_has_expired_is_refused() {
    let expired = Ca::root_with("Old TPM Root CA", |p| {
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2020, 1, 1);
    });
    let err = EkCaBundle::from_files([("old.der".to_owned(), expired.der)], now()).unwrap_err();
    assert!(
        matches!(&err, EkCaBundleError::NotValid { file, .. } if file == "old.der"),
        "{err}"
    );
}

#[test]
fn an_ek_certificate_for_another_extended_key_usage_is_refused() {
    let m = manufacturer();
    let ek = KeyPair::generate().unwrap();
    let cert = m.intermediate.certify_ek(&ek, |p| {
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    });
    let err = m
        .bundle
        .verify(&cert, &[], &ek_public(&ek), now())
        .unwrap_err();
    assert!(matches!(err, EkError::Chain(_)), "{err}");
    // Without any extended key usage, as many EK certificates are, it verifies.
    let cert = m
        .intermediate
        .certify_ek(&ek, |p| p.extended_key_usages.clear());
    m.bundle.verify(&cert, &[], &ek_public(&ek), now()).unwrap();
}
