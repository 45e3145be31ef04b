//! The certificates and keys the bootstrapper makes, through `asterism-pki`: the SSH host
//! key and certificate, the emergency SSH CA's public key, the kubelet key and CSR.

use std::net::IpAddr;
use std::time::SystemTime;

use asterism_disk::DataKey;
use asterism_metadata::Metadata;
use asterism_pki::{SshCa, SshError, X509Error};
use tracing::info;
use zeroize::Zeroizing;

use crate::files::{self, FileError};
use crate::node::{Node, StepError, exists};

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
}

/// The node's SSH host key, as the join request carries it.
#[derive(Debug, Clone)]
pub struct HostKey {
    /// The public key in SSH wire format (`ssh-ed25519` blob).
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

/// A new ECDSA P-256 kubelet key and its CSR with the node's IP (REFERENCE §4.4).
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

impl<M: Metadata + 'static> Node<M> {
    /// Loads the SSH host key from `state/ssh/ssh_host_ed25519_key`, generating it (0600)
    /// if it is missing, as `sshd-keygen` does before the original's bootstrapper starts.
    pub(crate) async fn ensure_host_key(&self) -> Result<HostKey, StepError> {
        Ok(HostKey {
            public_wire: self
                .load_or_make_host_key()?
                .public_key_wire()
                .map_err(PkiError::from)?,
        })
    }

    fn load_or_make_host_key(&self) -> Result<asterism_pki::HostKey, StepError> {
        let path = self.dir().ssh_host_key();
        if exists(&path) {
            let bytes = Zeroizing::new(files::read_capped(&path, MAX_HOST_KEY_FILE)?);
            let text = std::str::from_utf8(&bytes).map_err(|_| FileError {
                what: "the SSH host key is not text:",
                path: path.clone(),
                source: std::io::Error::other("not UTF-8"),
            })?;
            return Ok(asterism_pki::HostKey::from_openssh(text).map_err(PkiError::from)?);
        }
        let key = asterism_pki::HostKey::generate().map_err(PkiError::from)?;
        let text = key.to_openssh().map_err(PkiError::from)?;
        files::write_atomic(&path, text.as_bytes(), files::SECRET_MODE)?;
        info!(step = "ssh", path = %path.display(), "generated the SSH host key");
        Ok(key)
    }

    /// REFERENCE §3.2 steps 8–10: the emergency SSH CA from its seed; its public key into
    /// `ssh_ca.pub`; a host certificate for the node's host key into `ssh_host_cert.pub`.
    pub(crate) async fn write_ssh_from_ca_seed(
        &self,
        seed: &DataKey,
        principals: &[String],
    ) -> Result<(), StepError> {
        let ca = SshCa::from_seed(seed).map_err(PkiError::from)?;
        let host = self.load_or_make_host_key()?;
        let cert = ca
            .sign_host_certificate(host.public_key(), principals, SystemTime::now())
            .and_then(|c| c.to_authorized_keys_line())
            .map_err(PkiError::from)?;
        let dir = self.dir();
        files::write_atomic(
            &dir.ssh_ca_pub(),
            ca.authorized_keys_line().as_bytes(),
            files::PUBLIC_MODE,
        )?;
        files::write_atomic(&dir.ssh_host_cert(), cert.as_bytes(), files::PUBLIC_MODE)?;
        info!(step = "ssh", principals = ?principals, "wrote the emergency SSH CA key and the host certificate");
        Ok(())
    }
}
