//! The cluster's X.509 CA (Kubernetes CA): generation, loading, kubelet certificates from
//! checked CSRs, the admin client certificate, and kubeadm's discovery hash.

use crate::der;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, PublicKeyData as _,
    SanType, SerialNumber, SubjectPublicKeyInfo,
};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate, X509CertificationRequest};
use zeroize::Zeroizing;

/// The organization every kubelet certificate carries.
pub const NODES_ORGANIZATION: &str = "system:nodes";
/// The prefix of a kubelet certificate's common name.
pub const NODE_CN_PREFIX: &str = "system:node:";
/// The admin client certificate's common name.
pub const ADMIN_COMMON_NAME: &str = "kubernetes-admin";
/// The admin client certificate's organization.
pub const ADMIN_ORGANIZATION: &str = "system:masters";
/// The cluster CA's common name (as kubeadm names it).
pub const CA_COMMON_NAME: &str = "kubernetes";
/// Largest CSR accepted.
pub const MAX_CSR_LEN: usize = 16 * 1024;
/// Kubelet and admin certificates are valid from this long before issuance (clock skew)…
pub const BACKDATE: Duration = Duration::from_secs(2 * 3600);
/// …until this long after it (8760 h).
pub const LEAF_VALIDITY: Duration = Duration::from_secs(8760 * 3600);
/// The cluster CA is valid for ten years (as kubeadm's).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Why a kubelet CSR was refused. The messages name what is wrong and may go to the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// Longer than [`MAX_CSR_LEN`].
    #[error("the certificate request is {0} bytes long, at most {MAX_CSR_LEN} are accepted")]
    TooLong(usize),
    /// Not a DER PKCS#10 request (or trailing bytes).
    #[error("the certificate request is not a DER PKCS#10 request")]
    Malformed,
    /// The self-signature does not verify.
    #[error("the certificate request's signature does not verify")]
    BadSignature,
    /// Not exactly one organization `system:nodes`.
    #[error("the certificate request must have exactly one organization, system:nodes")]
    Organization,
    /// Not exactly one common name `system:node:<name>` with a valid node name.
    #[error("the certificate request's common name must be system:node:<node name>")]
    CommonName,
    /// The node name is not a valid DNS-1123 subdomain.
    #[error("the node name is not a lower-case DNS-1123 subdomain of at most 253 characters")]
    NodeName,
    /// The subject holds attributes other than O and CN.
    #[error("the certificate request's subject may hold only O and CN, not {0}")]
    SubjectAttribute(String),
    /// A subject attribute is not a string.
    #[error("a subject attribute of the certificate request is not a string")]
    AttributeEncoding,
    /// The public key algorithm is not supported.
    #[error("the certificate request's public key algorithm is not supported")]
    PublicKey,
}

/// Why a CA operation failed.
#[derive(Debug, thiserror::Error)]
pub enum X509Error {
    /// A PEM input is not what it should be.
    #[error("{what}: {reason}")]
    Pem {
        /// Which input.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The CA key does not belong to the CA certificate.
    #[error("the CA private key does not match the CA certificate")]
    KeyMismatch,
    /// The CA certificate is not a CA.
    #[error("the CA certificate is not a CA certificate")]
    NotACa,
    /// Key generation, certificate building or signing failed.
    #[error("{what} failed")]
    Rcgen {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// A key container could not be converted.
    #[error("{0}: malformed key encoding")]
    KeyEncoding(&'static str),
    /// No randomness.
    #[error("the system random number generator failed")]
    Random,
    /// A time is out of range.
    #[error("a certificate validity time is out of range")]
    Time,
}

fn rc(what: &'static str) -> impl FnOnce(rcgen::Error) -> X509Error {
    move |source| X509Error::Rcgen { what, source }
}

/// A PEM-encoded private key. Secret: not `Clone`, `Debug` is redacted, wiped on drop.
pub struct PrivateKeyPem(Zeroizing<String>);

impl PrivateKeyPem {
    /// The PEM text. Keep it out of logs.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for PrivateKeyPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKeyPem(<redacted>)")
    }
}

/// A certificate and its private key, both PEM.
#[derive(Debug)]
pub struct CertifiedKey {
    /// The certificate (`CERTIFICATE`).
    pub cert_pem: String,
    /// The private key (`EC PRIVATE KEY`, SEC1).
    pub key_pem: PrivateKeyPem,
}

/// PEM-encodes DER with the given label (64-character lines).
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn pem_decode(what: &'static str, pem: &[u8]) -> Result<(String, Zeroizing<Vec<u8>>), X509Error> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| X509Error::Pem {
        what,
        reason: format!("not PEM ({e})"),
    })?;
    Ok((p.label, Zeroizing::new(p.contents)))
}

fn random_serial() -> Result<SerialNumber, X509Error> {
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| X509Error::Random)?;
    Ok(SerialNumber::from_slice(&bytes))
}

fn odt(t: SystemTime) -> OffsetDateTime {
    OffsetDateTime::from(t)
}

fn window(
    now: SystemTime,
    before: Duration,
    after: Duration,
) -> Result<(OffsetDateTime, OffsetDateTime), X509Error> {
    let start = now.checked_sub(before).ok_or(X509Error::Time)?;
    let end = now.checked_add(after).ok_or(X509Error::Time)?;
    Ok((odt(start), odt(end)))
}

fn key_pem(key: &KeyPair) -> Result<PrivateKeyPem, X509Error> {
    let pkcs8 = Zeroizing::new(key.serialize_der());
    let sec1 =
        der::pkcs8_p256_to_sec1(&pkcs8).map_err(|_| X509Error::KeyEncoding("private key"))?;
    Ok(PrivateKeyPem(Zeroizing::new(pem_encode(
        "EC PRIVATE KEY",
        &sec1,
    ))))
}

/// A kubelet certificate request that passed every check: the signature, exactly one
/// O = `system:nodes` and one CN = `system:node:<name>`, nothing else in the subject (a
/// kubelet certificate has no use for more), and a node name that is a DNS-1123 subdomain.
#[derive(Debug, Clone)]
pub struct KubeletCsr {
    node_name: String,
    ip_addresses: Vec<IpAddr>,
    public_key: SubjectPublicKeyInfo,
}

impl KubeletCsr {
    /// Parses and checks a DER PKCS#10 request.
    pub fn parse(der: &[u8]) -> Result<Self, CsrError> {
        if der.len() > MAX_CSR_LEN {
            return Err(CsrError::TooLong(der.len()));
        }
        let (rest, csr) =
            X509CertificationRequest::from_der(der).map_err(|_| CsrError::Malformed)?;
        if !rest.is_empty() {
            return Err(CsrError::Malformed);
        }
        csr.verify_signature().map_err(|_| CsrError::BadSignature)?;
        let info = &csr.certification_request_info;

        let mut organizations = Vec::new();
        let mut common_names = Vec::new();
        for attr in info.subject.iter_attributes() {
            let oid = attr.attr_type();
            let value = || attr.as_str().map_err(|_| CsrError::AttributeEncoding);
            if *oid == x509_parser::oid_registry::OID_X509_ORGANIZATION_NAME {
                organizations.push(value()?);
            } else if *oid == x509_parser::oid_registry::OID_X509_COMMON_NAME {
                common_names.push(value()?);
            } else {
                return Err(CsrError::SubjectAttribute(oid.to_id_string()));
            }
        }
        if organizations.as_slice() != [NODES_ORGANIZATION] {
            return Err(CsrError::Organization);
        }
        let [cn] = common_names.as_slice() else {
            return Err(CsrError::CommonName);
        };
        let node_name = cn
            .strip_prefix(NODE_CN_PREFIX)
            .ok_or(CsrError::CommonName)?;
        if !asterism_basics::is_node_name(node_name) {
            return Err(CsrError::NodeName);
        }

        let mut ip_addresses = Vec::new();
        if let Some(extensions) = csr.requested_extensions() {
            for ext in extensions {
                if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
                    for name in &san.general_names {
                        if let x509_parser::extensions::GeneralName::IPAddress(bytes) = name {
                            let ip = match bytes.len() {
                                4 => <[u8; 4]>::try_from(*bytes).map(IpAddr::from).ok(),
                                16 => <[u8; 16]>::try_from(*bytes).map(IpAddr::from).ok(),
                                _ => None,
                            };
                            ip_addresses.push(ip.ok_or(CsrError::Malformed)?);
                        }
                        // DNS names and other SANs are ignored: the certificate names
                        // the node by its CN and its IP addresses only.
                    }
                }
            }
        }
        let public_key = SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
            .map_err(|_| CsrError::PublicKey)?;
        Ok(Self {
            node_name: node_name.to_owned(),
            ip_addresses,
            public_key,
        })
    }

    /// The node name from the common name (without `system:node:`).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The IP address SANs of the request.
    pub fn ip_addresses(&self) -> &[IpAddr] {
        &self.ip_addresses
    }
}

/// A freshly generated kubelet key and its CSR, made by a joining node.
#[derive(Debug)]
pub struct KubeletKeyAndCsr {
    /// The private key, PEM `EC PRIVATE KEY` (SEC1).
    pub key_pem: PrivateKeyPem,
    /// The CSR, DER.
    pub csr_der: Vec<u8>,
}

/// Generates an ECDSA P-256 kubelet key and a CSR with subject `O=system:nodes,
/// CN=system:node:<node_name>`, the given IP SANs, no DNS SANs.
pub fn kubelet_key_and_csr(node_name: &str, ips: &[IpAddr]) -> Result<KubeletKeyAndCsr, X509Error> {
    let key =
        KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(rc("generating the kubelet key"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = node_subject(node_name);
    params.subject_alt_names = ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
    let csr = params
        .serialize_request(&key)
        .map_err(rc("building the kubelet CSR"))?;
    Ok(KubeletKeyAndCsr {
        key_pem: key_pem(&key)?,
        csr_der: csr.der().to_vec(),
    })
}

fn node_subject(node_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, NODES_ORGANIZATION);
    dn.push(DnType::CommonName, format!("{NODE_CN_PREFIX}{node_name}"));
    dn
}

/// `sha256:<hex of SHA-256(SubjectPublicKeyInfo DER)>` of a certificate (kubeadm's public
/// key pin, `--discovery-token-ca-cert-hash`).
pub fn discovery_hash(cert_der: &[u8]) -> Result<String, X509Error> {
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|e| X509Error::Pem {
        what: "certificate",
        reason: e.to_string(),
    })?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.tbs_certificate.subject_pki.raw))
    ))
}

/// The cluster CA (the Kubernetes CA): signs kubelet and admin certificates.
pub struct ClusterCa {
    cert_pem: String,
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
    key_is_p256: bool,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa")
            .field("discovery_hash", &discovery_hash(&self.cert_der).ok())
            .finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new self-signed ECDSA P-256 CA (`CN=kubernetes`), valid from `now` for ten years.
    pub fn generate(now: SystemTime) -> Result<Self, X509Error> {
        let key =
            KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(rc("generating the CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, CA_COMMON_NAME);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyCertSign,
        ];
        (params.not_before, params.not_after) = window(now, Duration::ZERO, CA_VALIDITY)?;
        params.serial_number = Some(random_serial()?);
        let cert = params
            .self_signed(&key)
            .map_err(rc("self-signing the CA"))?;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            issuer: Issuer::new(params, key),
            key_is_p256: true,
        })
    }

    /// Loads a CA from its certificate (the first PEM `CERTIFICATE`) and key (PEM
    /// `EC PRIVATE KEY` P-256, `RSA PRIVATE KEY`, or PKCS#8 `PRIVATE KEY`), checking that
    /// the key belongs to the certificate and the certificate is a CA.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, X509Error> {
        let (label, cert_der) = pem_decode("CA certificate", cert_pem.as_bytes())?;
        if label != "CERTIFICATE" {
            return Err(X509Error::Pem {
                what: "CA certificate",
                reason: format!("PEM label is {label}, expected CERTIFICATE"),
            });
        }
        let (_, parsed) = X509Certificate::from_der(&cert_der).map_err(|e| X509Error::Pem {
            what: "CA certificate",
            reason: e.to_string(),
        })?;
        if !parsed.is_ca() {
            return Err(X509Error::NotACa);
        }
        let (label, key_der) = pem_decode("CA key", key_pem.as_bytes())?;
        let key = match label.as_str() {
            "EC PRIVATE KEY" => {
                let pkcs8 = der::sec1_p256_to_pkcs8(&key_der)
                    .map_err(|_| X509Error::KeyEncoding("CA key (only P-256 EC keys)"))?;
                KeyPair::from_pkcs8_der_and_sign_algo(
                    &pkcs8.as_slice().into(),
                    &PKCS_ECDSA_P256_SHA256,
                )
            }
            "RSA PRIVATE KEY" => {
                let pkcs8 = der::pkcs1_to_pkcs8(&key_der);
                KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8.as_slice().into(), &PKCS_RSA_SHA256)
            }
            "PRIVATE KEY" => KeyPair::try_from(key_der.as_slice()),
            other => {
                return Err(X509Error::Pem {
                    what: "CA key",
                    reason: format!("unsupported PEM label {other}"),
                });
            }
        }
        .map_err(rc("loading the CA key"))?;
        if key.subject_public_key_info() != parsed.tbs_certificate.subject_pki.raw {
            return Err(X509Error::KeyMismatch);
        }
        let key_is_p256 = *key.algorithm() == PKCS_ECDSA_P256_SHA256;
        let issuer = Issuer::from_ca_cert_der(&cert_der.as_slice().into(), key)
            .map_err(rc("reading the CA certificate"))?;
        let cert_der = cert_der.to_vec();
        Ok(Self {
            cert_pem: pem_encode("CERTIFICATE", &cert_der),
            cert_der,
            issuer,
            key_is_p256,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA private key as PEM: `EC PRIVATE KEY` (SEC1) for a P-256 key, as kubeadm writes
    /// `ca.key`; PKCS#8 `PRIVATE KEY` otherwise.
    pub fn key_pem(&self) -> Result<PrivateKeyPem, X509Error> {
        if self.key_is_p256 {
            key_pem(self.issuer.key())
        } else {
            Ok(PrivateKeyPem(Zeroizing::new(
                self.issuer.key().serialize_pem(),
            )))
        }
    }

    /// `sha256:<hex>` of the CA's public key, for `kubeadm join --discovery-token-ca-cert-hash`.
    pub fn discovery_hash(&self) -> Result<String, X509Error> {
        discovery_hash(&self.cert_der)
    }

    /// Issues the kubelet certificate for a checked CSR: random 128-bit
    /// serial, valid from `now − 2 h` to `now + 8760 h`, subject from the CSR, key usages
    /// digitalSignature and keyEncipherment, extended key usages clientAuth and serverAuth,
    /// basicConstraints CA=false, the CSR's IP SANs only. Returns PEM.
    pub fn sign_kubelet(&self, csr: &KubeletCsr, now: SystemTime) -> Result<String, X509Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = node_subject(&csr.node_name);
        params.subject_alt_names = csr
            .ip_addresses
            .iter()
            .map(|ip| SanType::IpAddress(*ip))
            .collect();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = window(now, BACKDATE, LEAF_VALIDITY)?;
        params.serial_number = Some(random_serial()?);
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(rc("signing the kubelet certificate"))?;
        Ok(cert.pem())
    }

    /// Issues an admin client certificate (`CN=kubernetes-admin, O=system:masters`,
    /// clientAuth) with a fresh P-256 key, for the kubeconfig the `none` driver returns.
    pub fn issue_admin(&self, now: SystemTime) -> Result<CertifiedKey, X509Error> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(rc("generating the admin key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, ADMIN_ORGANIZATION);
        dn.push(DnType::CommonName, ADMIN_COMMON_NAME);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = window(now, BACKDATE, LEAF_VALIDITY)?;
        params.serial_number = Some(random_serial()?);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rc("signing the admin certificate"))?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key_pem(&key)?,
        })
    }
}
