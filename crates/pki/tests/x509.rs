//! The cluster CA, kubelet CSRs and certificates, the admin certificate, the discovery hash
//! and the kubeconfig: everything produced is parsed back with x509-parser and checked
//! field by field; every CSR check has a request that fails it.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asterism_pki::x509::{BACKDATE, LEAF_VALIDITY};
use asterism_pki::{
    ClusterCa, CsrError, KubeletCsr, X509Error, discovery_hash, kubelet_key_and_csr,
    render_admin_kubeconfig,
};
use base64::Engine as _;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_750_000_000)
}

fn der_of(pem: &str) -> Vec<u8> {
    x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .unwrap()
        .1
        .contents
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn kubelet_certificate_has_the_reference_template_and_chains_to_the_ca() {
    let ca = ClusterCa::generate(now()).unwrap();
    let kc = kubelet_key_and_csr("worker-0", &[ip("127.0.10.2")]).unwrap();
    assert!(
        kc.key_pem
            .expose_secret()
            .starts_with("-----BEGIN EC PRIVATE KEY-----\n")
    );
    let csr = KubeletCsr::parse(&kc.csr_der).unwrap();
    assert_eq!(csr.node_name(), "worker-0");
    assert_eq!(csr.ip_addresses(), &[ip("127.0.10.2")]);

    let pem = ca.sign_kubelet(&csr, now()).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"));
    let der = der_of(&pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let (_, ca_cert) = X509Certificate::from_der(ca.cert_der()).unwrap();

    cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    assert_eq!(cert.issuer(), ca_cert.subject());
    let subject: Vec<(String, String)> = cert
        .subject()
        .iter_attributes()
        .map(|a| (a.attr_type().to_id_string(), a.as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        subject,
        vec![
            ("2.5.4.10".to_owned(), "system:nodes".to_owned()),
            ("2.5.4.3".to_owned(), "system:node:worker-0".to_owned())
        ]
    );
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    assert_eq!(
        cert.validity().not_before.timestamp(),
        secs(now() - BACKDATE)
    );
    assert_eq!(
        cert.validity().not_after.timestamp(),
        secs(now() + LEAF_VALIDITY)
    );
    assert_eq!(LEAF_VALIDITY, Duration::from_secs(8760 * 3600));
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment());
    assert!(!ku.key_cert_sign() && !ku.crl_sign() && !ku.non_repudiation());
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && eku.server_auth);
    assert!(!eku.any && !eku.code_signing && eku.other.is_empty());
    let bc = cert.basic_constraints().unwrap().unwrap().value;
    assert!(!bc.ca);
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(
        san.general_names,
        vec![GeneralName::IPAddress(&[127, 0, 10, 2])]
    );
    assert_eq!(
        cert.public_key().raw,
        x509_parser::certification_request::X509CertificationRequest::from_der(&kc.csr_der)
            .unwrap()
            .1
            .certification_request_info
            .subject_pki
            .raw
    );
    let serial = cert.raw_serial();
    assert!(
        serial.len() <= 17,
        "a 128-bit serial (plus a sign byte): {serial:?}"
    );
}

#[test]
fn serials_are_random() {
    let ca = ClusterCa::generate(now()).unwrap();
    let csr = KubeletCsr::parse(&kubelet_key_and_csr("n", &[]).unwrap().csr_der).unwrap();
    let a = der_of(&ca.sign_kubelet(&csr, now()).unwrap());
    let b = der_of(&ca.sign_kubelet(&csr, now()).unwrap());
    let serial = |d: &[u8]| {
        X509Certificate::from_der(d)
            .unwrap()
            .1
            .raw_serial()
            .to_vec()
    };
    assert_ne!(serial(&a), serial(&b));
}

#[test]
fn dns_names_in_the_csr_are_ignored_and_dotted_node_names_are_accepted() {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "system:nodes");
    dn.push(DnType::CommonName, "system:node:node-1.example");
    params.distinguished_name = dn;
    params.subject_alt_names = vec![
        SanType::DnsName("evil.example".try_into().unwrap()),
        SanType::IpAddress(ip("127.0.10.5")),
    ];
    let csr = KubeletCsr::parse(params.serialize_request(&key).unwrap().der()).unwrap();
    assert_eq!(csr.node_name(), "node-1.example");
    let ca = ClusterCa::generate(now()).unwrap();
    let der = der_of(&ca.sign_kubelet(&csr, now()).unwrap());
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(
        san.general_names,
        vec![GeneralName::IPAddress(&[127, 0, 10, 5])]
    );
}

fn csr_with(subject: &[(DnType, &str)]) -> Vec<u8> {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    for (t, v) in subject {
        dn.push(t.clone(), *v);
    }
    params.distinguished_name = dn;
    params.serialize_request(&key).unwrap().der().to_vec()
}

/// The organization's OID as a "custom" type, so rcgen writes a second O attribute.
fn second_o() -> DnType {
    DnType::CustomDnType(vec![2, 5, 4, 10])
}

#[test]
fn csrs_failing_a_check_are_refused_with_the_reason() {
    let o = DnType::OrganizationName;
    let cn = DnType::CommonName;
    let cases: Vec<(&str, Vec<u8>, CsrError)> = vec![
        (
            "no organization",
            csr_with(&[(cn.clone(), "system:node:a")]),
            CsrError::Organization,
        ),
        (
            "wrong organization",
            csr_with(&[(o.clone(), "system:masters"), (cn.clone(), "system:node:a")]),
            CsrError::Organization,
        ),
        (
            "two organizations",
            csr_with(&[
                (o.clone(), "system:nodes"),
                (second_o(), "system:masters"),
                (cn.clone(), "system:node:a"),
            ]),
            CsrError::Organization,
        ),
        (
            "two organizations, both system:nodes",
            csr_with(&[
                (o.clone(), "system:nodes"),
                (second_o(), "system:nodes"),
                (cn.clone(), "system:node:a"),
            ]),
            CsrError::Organization,
        ),
        (
            "common name without the prefix",
            csr_with(&[(o.clone(), "system:nodes"), (cn.clone(), "a")]),
            CsrError::CommonName,
        ),
        (
            "no common name",
            csr_with(&[(o.clone(), "system:nodes")]),
            CsrError::CommonName,
        ),
        (
            "empty node name",
            csr_with(&[(o.clone(), "system:nodes"), (cn.clone(), "system:node:")]),
            CsrError::NodeName,
        ),
        (
            "upper-case node name",
            csr_with(&[
                (o.clone(), "system:nodes"),
                (cn.clone(), "system:node:Worker"),
            ]),
            CsrError::NodeName,
        ),
        (
            "extra subject attribute",
            csr_with(&[
                (o.clone(), "system:nodes"),
                (DnType::OrganizationalUnitName, "x"),
                (cn.clone(), "system:node:a"),
            ]),
            CsrError::SubjectAttribute("2.5.4.11".into()),
        ),
    ];
    for (what, der, want) in cases {
        assert_eq!(KubeletCsr::parse(&der).unwrap_err(), want, "{what}");
    }
}

#[test]
fn a_csr_whose_signature_does_not_verify_is_refused() {
    let mut der = kubelet_key_and_csr("a", &[]).unwrap().csr_der;
    let last = der.len() - 1;
    der[last] ^= 0x01;
    assert_eq!(KubeletCsr::parse(&der).unwrap_err(), CsrError::BadSignature);
}

#[test]
fn malformed_trailing_or_oversized_csrs_are_refused() {
    let mut der = kubelet_key_and_csr("a", &[]).unwrap().csr_der;
    assert_eq!(
        KubeletCsr::parse(&der[..10]).unwrap_err(),
        CsrError::Malformed
    );
    der.push(0);
    assert_eq!(KubeletCsr::parse(&der).unwrap_err(), CsrError::Malformed);
    assert!(matches!(
        KubeletCsr::parse(&vec![0x30; 20_000]).unwrap_err(),
        CsrError::TooLong(20_000)
    ));
}

#[test]
fn the_ca_round_trips_through_its_pem_files_and_signs_the_same() {
    let ca = ClusterCa::generate(now()).unwrap();
    let key_pem = ca.key_pem().unwrap();
    assert!(
        key_pem
            .expose_secret()
            .starts_with("-----BEGIN EC PRIVATE KEY-----\n")
    );
    assert_eq!(format!("{key_pem:?}"), "PrivateKeyPem(<redacted>)");
    let loaded = ClusterCa::from_pem(ca.cert_pem(), key_pem.expose_secret()).unwrap();
    assert_eq!(loaded.cert_der(), ca.cert_der());

    let (_, ca_cert) = X509Certificate::from_der(ca.cert_der()).unwrap();
    assert!(ca_cert.is_ca());
    ca_cert.verify_signature(None).unwrap();
    let csr = KubeletCsr::parse(&kubelet_key_and_csr("a", &[]).unwrap().csr_der).unwrap();
    let der = der_of(&loaded.sign_kubelet(&csr, now()).unwrap());
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    cert.verify_signature(Some(ca_cert.public_key())).unwrap();
}

#[test]
fn a_key_that_does_not_belong_to_the_certificate_is_refused() {
    let a = ClusterCa::generate(now()).unwrap();
    let b = ClusterCa::generate(now()).unwrap();
    let err = ClusterCa::from_pem(a.cert_pem(), b.key_pem().unwrap().expose_secret()).unwrap_err();
    assert!(matches!(err, X509Error::KeyMismatch), "{err:?}");
}

#[test]
fn a_leaf_certificate_is_not_accepted_as_the_ca() {
    let ca = ClusterCa::generate(now()).unwrap();
    let admin = ca.issue_admin(now()).unwrap();
    let err = ClusterCa::from_pem(&admin.cert_pem, admin.key_pem.expose_secret()).unwrap_err();
    assert!(matches!(err, X509Error::NotACa), "{err:?}");
}

#[test]
fn a_pkcs8_ca_key_is_accepted() {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let ca = ClusterCa::from_pem(&cert.pem(), &key.serialize_pem()).unwrap();
    let csr = KubeletCsr::parse(&kubelet_key_and_csr("a", &[]).unwrap().csr_der).unwrap();
    let der = der_of(&ca.sign_kubelet(&csr, now()).unwrap());
    let (_, leaf) = X509Certificate::from_der(&der).unwrap();
    let (_, root) = X509Certificate::from_der(cert.der()).unwrap();
    leaf.verify_signature(Some(root.public_key())).unwrap();
}

#[test]
fn discovery_hash_is_sha256_of_the_ca_subject_public_key_info() {
    let ca = ClusterCa::generate(now()).unwrap();
    let (_, cert) = X509Certificate::from_der(ca.cert_der()).unwrap();
    let want = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.public_key().raw))
    );
    assert_eq!(ca.discovery_hash().unwrap(), want);
    assert_eq!(discovery_hash(ca.cert_der()).unwrap(), want);
    assert_eq!(want.len(), "sha256:".len() + 64);
}

#[test]
fn admin_certificate_is_a_system_masters_client_certificate() {
    let ca = ClusterCa::generate(now()).unwrap();
    let admin = ca.issue_admin(now()).unwrap();
    let der = der_of(&admin.cert_pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let (_, ca_cert) = X509Certificate::from_der(ca.cert_der()).unwrap();
    cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    let o: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|a| a.as_str().unwrap())
        .collect();
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!((o, cn), (vec!["system:masters"], vec!["kubernetes-admin"]));
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
    assert!(!cert.is_ca());
}

#[test]
fn kubeconfig_embeds_the_server_ca_and_admin_credentials() {
    let ca = ClusterCa::generate(now()).unwrap();
    let admin = ca.issue_admin(now()).unwrap();
    let kc = render_admin_kubeconfig("mini", "https://127.0.10.1:6443", ca.cert_pem(), &admin);
    assert_eq!(format!("{kc:?}"), "Kubeconfig(<redacted>)");
    let text = kc.expose_secret();
    assert!(text.starts_with("apiVersion: v1\nkind: Config\n"), "{text}");
    assert!(
        text.contains("    server: \"https://127.0.10.1:6443\"\n"),
        "{text}"
    );
    assert!(
        text.contains("current-context: \"kubernetes-admin@mini\"\n"),
        "{text}"
    );
    let field = |name: &str| -> Vec<u8> {
        let line = text
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(line)
            .unwrap()
    };
    assert_eq!(
        field("certificate-authority-data"),
        ca.cert_pem().as_bytes()
    );
    assert_eq!(field("client-certificate-data"), admin.cert_pem.as_bytes());
    assert_eq!(
        field("client-key-data"),
        admin.key_pem.expose_secret().as_bytes()
    );
    // A hostile cluster name cannot add YAML structure.
    let kc = render_admin_kubeconfig("a\"\nusers: []", "https://x", ca.cert_pem(), &admin);
    assert!(!kc.expose_secret().contains("\nusers: []"));
}
