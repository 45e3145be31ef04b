//! The certificates and keys the bootstrapper makes, through `asterism-pki`: the SSH host
//! key and certificate, the emergency SSH CA's public key, the kubelet key and CSR.

use std::net::IpAddr;

use asterism_disk::DataKey;
use asterism_metadata::Metadata;
use tracing::info;
use zeroize::Zeroizing;

use crate::files;
use crate::node::{Node, StepError};

/// A certificate or key could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The PKI library refused.
    #[error("PKI: {0}")]
    Pki(String),
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
}

/// A new ECDSA P-256 kubelet key and its CSR (REFERENCE §4.4).
pub fn kubelet_csr(node_name: &str, ip: IpAddr) -> Result<KubeletCsr, PkiError> {
    let _ = (node_name, ip);
    Err(PkiError::Pki("asterism-pki is not available yet".into()))
}

impl<M: Metadata + 'static> Node<M> {
    /// Loads the SSH host key from `state/ssh/ssh_host_ed25519_key`, generating it (0600)
    /// if it is missing, as `sshd-keygen` does before the original's bootstrapper starts.
    pub(crate) async fn ensure_host_key(&self) -> Result<HostKey, StepError> {
        let path = self.dir().ssh_host_key();
        let _ = path;
        Err(PkiError::Pki("asterism-pki is not available yet".into()).into())
    }

    /// REFERENCE §3.2 steps 8–10: the emergency SSH CA from its seed; its public key into
    /// `ssh_ca.pub`; a host certificate for the node's host key into `ssh_host_cert.pub`.
    pub(crate) async fn write_ssh_from_ca_seed(
        &self,
        seed: &DataKey,
        principals: &[String],
    ) -> Result<(), StepError> {
        let _ = (seed, principals, files::PUBLIC_MODE);
        info!(step = "ssh", "writing the SSH CA key and host certificate");
        Err(PkiError::Pki("asterism-pki is not available yet".into()).into())
    }
}
