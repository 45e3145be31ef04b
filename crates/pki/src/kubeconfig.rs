//! Rendering an admin kubeconfig (`apiVersion: v1`, `kind: Config`).

use crate::x509::{CertifiedKey, PrivateKeyPem};
use base64::Engine as _;
use zeroize::Zeroizing;

/// A kubeconfig file's text. Secret (it embeds a client key): not `Clone`, `Debug` is
/// redacted, wiped on drop.
pub struct Kubeconfig(Zeroizing<String>);

impl Kubeconfig {
    /// The YAML text. Keep it out of logs.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kubeconfig(<redacted>)")
    }
}

/// Renders a kubeconfig with one cluster (`server`, e.g. `https://127.0.10.1:6443`, and the
/// CA certificate), one user (`kubernetes-admin` with the client certificate and key) and a
/// current context joining them. Certificates and key are embedded as base64 of their PEM,
/// as kubeadm does; strings are YAML double-quoted (JSON escaping), so no input can break
/// the document's structure.
pub fn render_admin_kubeconfig(
    cluster_name: &str,
    server: &str,
    ca_cert_pem: &str,
    admin: &CertifiedKey,
) -> Kubeconfig {
    render(
        cluster_name,
        server,
        ca_cert_pem,
        &admin.cert_pem,
        &admin.key_pem,
    )
}

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn render(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &PrivateKeyPem,
) -> Kubeconfig {
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let user = "kubernetes-admin";
    let context = format!("{user}@{cluster}");
    let key_b64 = Zeroizing::new(b64(key_pem.expose_secret().as_bytes()));
    let mut out = Zeroizing::new(String::new());
    out.push_str("apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n");
    out.push_str(&format!(
        "    certificate-authority-data: {}\n    server: {}\n  name: {}\n",
        b64(ca_pem.as_bytes()),
        q(server),
        q(cluster)
    ));
    out.push_str(&format!(
        "contexts:\n- context:\n    cluster: {}\n    user: {}\n  name: {}\ncurrent-context: {}\n",
        q(cluster),
        q(user),
        q(&context),
        q(&context)
    ));
    out.push_str("preferences: {}\nusers:\n");
    out.push_str(&format!(
        "- name: {}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        q(user),
        b64(cert_pem.as_bytes()),
        key_b64.as_str()
    ));
    Kubeconfig(out)
}
