//! The certificate authorities of an Asterism cluster, as pure functions:
//!
//! * [`ssh`]: the emergency SSH CA (an Ed25519 key from the `ca_emergency_ssh` data key),
//!   OpenSSH host certificates, host keys and the SSH wire format;
//! * [`x509`]: the cluster (Kubernetes) CA, kubelet keys and CSRs, checked CSR
//!   signing, the admin client certificate, and the discovery hash;
//! * [`kubeconfig`]: an admin kubeconfig.
//!
//! Nothing here does network I/O, file I/O or reads the environment. Private keys are secret types: not `Clone`,
//! redacted in `Debug`, wiped on drop. This crate must never log key material.
#![forbid(unsafe_code)]

mod der;
pub mod kubeconfig;
pub mod ssh;
pub mod x509;

pub use kubeconfig::{Kubeconfig, render_admin_kubeconfig};
pub use ssh::{
    HOST_CERTIFICATE_VALIDITY, HostCertificate, HostKey, SshCa, SshError, check_principals,
    parse_wire_public_key, wire_public_key,
};
pub use x509::{
    CertifiedKey, ClusterCa, CsrError, KubeletCsr, KubeletKeyAndCsr, PrivateKeyPem, X509Error,
    discovery_hash, kubelet_key_and_csr, pem_encode,
};
