//! The certificates and keys the bootstrapper makes, through `asterism-pki`: the SSH host
//! key and certificate, the emergency SSH CA's public key, the kubelet key and CSR.

use std::net::IpAddr;
use std::time::SystemTime;

use asterism_disk::DataKey;
use asterism_pki::{SshCa, SshError, X509Error};
use tracing::info;
use zeroize::Zeroizing;

use crate::files::{self, FileError, exists};
use asterism_cluster::NodeDir;

/// The largest SSH host key file read back.
const MAX_HOST_KEY_FILE: u64 = 16 * 1024;

/// A certificate or key could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// An SSH key or certificate.
    #[error("SSH")]
    Ssh(#[from] SshError),
    /// An X.509 key, CSR or certificate.
    #[error("X.509")]
    X509(#[from] X509Error),
    /// The SSH host key file could not be read or written.
    #[error(transparent)]
    File(#[from] FileError),
    /// The SSH host key file is not text.
    #[error("the SSH host key {0} is not text")]
    HostKeyNotText(std::path::PathBuf),
}

/// The node's SSH host key: its public half is all the flows need.
#[derive(Debug, Clone)]
pub struct HostKey {
    /// The public key.
    pub public: ssh_key::PublicKey,
    /// The public key in SSH wire format (`ssh-ed25519` blob), as the join request carries
    /// it.
    pub public_wire: Vec<u8>,
}

/// A fresh kubelet key and its CSR.
pub struct KubeletCsr {
    /// DER PKCS#10 CSR: `O=system:nodes`, `CN=system:node:<name>`, the node's IP.
    pub csr_der: Vec<u8>,
    /// The private key, PEM (`EC PRIVATE KEY`).
    pub key_pem: Zeroizing<Vec<u8>>,
    /// The public key as a DER SubjectPublicKeyInfo: what the kubelet certificate must
    /// certify.
    pub spki_der: Vec<u8>,
}

/// A new ECDSA P-256 kubelet key and its CSR with the node's IP: a fresh key for every
/// join attempt, never reused.
pub fn kubelet_csr(node_name: &str, ip: IpAddr) -> Result<KubeletCsr, PkiError> {
    use x509_parser::prelude::FromDer as _;
    let made = asterism_pki::kubelet_key_and_csr(node_name, &[ip])?;
    let spki_der =
        x509_parser::certification_request::X509CertificationRequest::from_der(&made.csr_der)
            .map(|(_, csr)| csr.certification_request_info.subject_pki.raw.to_vec())
            .map_err(|e| {
                PkiError::X509(X509Error::Pem {
                    what: "kubelet CSR",
                    reason: e.to_string(),
                })
            })?;
    Ok(KubeletCsr {
        spki_der,
        csr_der: made.csr_der,
        key_pem: Zeroizing::new(made.key_pem.expose_secret().as_bytes().to_vec()),
    })
}

/// Loads the SSH host key from `state/ssh/ssh_host_ed25519_key`, generating it (0600) if
/// it is missing, as `sshd-keygen` does before the bootstrapper starts on a real node.
pub(crate) fn host_key(dir: &NodeDir) -> Result<HostKey, PkiError> {
    let key = load_or_make_host_key(dir)?;
    Ok(HostKey {
        public_wire: key.public_key_wire()?,
        public: key.public_key().clone(),
    })
}

fn load_or_make_host_key(dir: &NodeDir) -> Result<asterism_pki::HostKey, PkiError> {
    let path = dir.ssh_host_key();
    if exists(&path) {
        let bytes = Zeroizing::new(files::read_capped(&path, MAX_HOST_KEY_FILE)?);
        let text = std::str::from_utf8(&bytes).map_err(|_| PkiError::HostKeyNotText(path))?;
        return Ok(asterism_pki::HostKey::from_openssh(text)?);
    }
    let key = asterism_pki::HostKey::generate()?;
    let text = key.to_openssh()?;
    files::write_atomic(&path, text.as_bytes(), files::SECRET_MODE)?;
    info!(step = "ssh", path = %path.display(), "generated the SSH host key");
    Ok(key)
}

/// The principals a node asks for in its SSH host certificate: its address and its name.
pub(crate) fn host_principals(node_ip: IpAddr, node_name: &str) -> Vec<String> {
    vec![node_ip.to_string(), node_name.to_owned()]
}

/// The emergency SSH CA's files for this node, made from the CA's seed: the CA's public
/// key (an `authorized_keys` line, for `ssh_ca.pub`) and a host certificate for `host`
/// naming `principals` (for `ssh_host_cert.pub`).
pub(crate) struct SshFiles {
    /// The CA's public key line.
    pub(crate) ca_line: String,
    /// The host certificate line.
    pub(crate) host_certificate: String,
}

/// Makes the [`SshFiles`] from the emergency SSH CA's seed.
pub(crate) fn ssh_files_from_ca_seed(
    seed: &DataKey,
    host: &HostKey,
    principals: &[String],
) -> Result<SshFiles, PkiError> {
    let ca = SshCa::from_seed(seed)?;
    let host_certificate = ca
        .sign_host_certificate(&host.public, principals, SystemTime::now())
        .and_then(|c| c.to_authorized_keys_line())?;
    Ok(SshFiles {
        ca_line: ca.authorized_keys_line(),
        host_certificate,
    })
}
