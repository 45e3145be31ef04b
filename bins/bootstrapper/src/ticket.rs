//! The checks a join ticket passes before the node uses any of it (before the node lock):
//! it comes from the control plane (signed by its identity key over this connection's
//! channel binding; module `trust`), and what it carries is what its fields say, for this
//! node, under the cluster CA the ticket names.
//!
//! * The kubelet certificate is PEM: the leaf, then the cluster CA certificate (a worker
//!   receives no `ca.crt`; a control-plane node's `ca.crt` must be that same certificate).
//!   The CA certificate's public key hashes to the ticket's discovery hash (kubeadm's pin);
//!   the leaf is signed by it, within its validity period, for this node's name
//!   (`CN=system:node:<name>`, `O=system:nodes`), with this node's IP as its only IP SAN,
//!   and certifies the public key of the kubelet key the node made for this request.
//! * Control-plane files: only the names kubeadm's certificate directory uses, each once;
//!   `*.crt` parse as CA certificates, each `*.key` of a CA belongs to its `*.crt` (both
//!   must be there), `sa.key` is a private key whose public half is `sa.pub`; a
//!   control-plane node needs `ca.crt` and `ca.key`, and `ca.crt` hashes to the discovery
//!   hash.
//! * The SSH CA key parses as an OpenSSH public key; the SSH host certificate parses, is
//!   for this node's host key, is signed by that CA and valid now, and names only
//!   principals the node asked for (at least one).
//! * Component install paths lie strictly inside one directory (the components directory),
//!   lexically (absolute, no `.` or `..`) and on disk (no existing part of the path below
//!   that directory is a symlink).
//! * The Kubernetes version is `v<major>.<minor>.<patch>`, or empty when the join service
//!   names no release.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Component as PathPart, Path, PathBuf};

use asterism_binkit::error_chain;
use asterism_cluster::{
    BootstrapToken, CONTROL_PLANE_FILES, MEASUREMENT_SALT_LEN, REQUIRED_CONTROL_PLANE_FILES,
    TokenError,
};
use asterism_components::ComponentError;
use asterism_kms::{ClusterId, DataKey, DeriveError, derive_cluster_id};
use asterism_kubernetes_versions::{KubernetesVersion, VersionSyntaxError};
use asterism_proto::join::IssueJoinTicketResponse;
use x509_parser::prelude::{FromDer as _, GeneralName, SubjectPublicKeyInfo, X509Certificate};
use zeroize::Zeroizing;

use crate::effects::{ApiServerEndpoint, Components, EndpointError};
use crate::trust::{ClusterMismatch, JoinServiceTrust, SignatureError};
use asterism_kms::{ChannelBinding, Purpose};
use prost::Message as _;

/// The most control-plane files a ticket may carry.
const MAX_CONTROL_PLANE_FILES: usize = 64;

/// Why a ticket is refused.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// A key has the wrong length.
    #[error("{field} has {len} bytes, 32 expected")]
    KeyLength {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// The measurement salt has the wrong length.
    #[error("measurement_salt has {0} bytes, {MEASUREMENT_SALT_LEN} expected")]
    SaltLength(usize),
    /// A Kubernetes component is unusable.
    #[error("kubernetes_components")]
    Components(#[source] ComponentError),
    /// The Kubernetes version is neither empty nor `v<major>.<minor>.<patch>`.
    #[error("kubernetes_version")]
    Version(#[source] VersionSyntaxError),
    /// The bootstrap token does not have kubeadm's format.
    #[error("token")]
    Token(#[source] TokenError),
    /// The API server endpoint is not `host:port`.
    #[error("api_server_endpoint")]
    Endpoint(#[source] EndpointError),
    /// The ticket carries too many control-plane files.
    #[error("too many control-plane files")]
    TooManyFiles,
    /// A control-plane file name could leave the PKI directory.
    #[error("control-plane file name {0:?} is not a plain relative path")]
    FileName(String),
    /// The cluster ID cannot be derived from the ticket.
    #[error("cluster ID")]
    ClusterId(#[source] DeriveError),
    /// The ticket is for another cluster.
    #[error(transparent)]
    Cluster(#[from] ClusterMismatch),
    /// The ticket is not the control plane's.
    #[error(transparent)]
    NotControlPlane(#[from] SignatureError),
    /// A certificate, key or path in the ticket is not what it must be (the reason).
    #[error("{0}")]
    Refused(String),
}

/// A join ticket whose every part has been checked (see the module documentation).
pub(crate) struct JoinTicket {
    pub(crate) cluster_id: ClusterId,
    pub(crate) state_disk_key: DataKey,
    pub(crate) measurement_salt: [u8; MEASUREMENT_SALT_LEN],
    pub(crate) kubelet_cert: Vec<u8>,
    pub(crate) api_server_endpoint: ApiServerEndpoint,
    pub(crate) token: BootstrapToken,
    pub(crate) discovery_token_ca_cert_hash: String,
    pub(crate) control_plane_files: Vec<(String, Zeroizing<Vec<u8>>)>,
    pub(crate) ssh_ca_public_key: Vec<u8>,
    pub(crate) host_certificate: Vec<u8>,
    pub(crate) components: Components,
    /// `None` when the join service names no release.
    pub(crate) kubernetes_version: Option<KubernetesVersion>,
}

/// A ticket's fields, parsed: the form of each is right, nothing is checked against the
/// node yet.
struct Parsed {
    state_disk_key: DataKey,
    measurement_secret: DataKey,
    measurement_salt: [u8; MEASUREMENT_SALT_LEN],
    kubelet_cert: Vec<u8>,
    api_server_endpoint: ApiServerEndpoint,
    token: BootstrapToken,
    discovery_token_ca_cert_hash: String,
    control_plane_files: Vec<(String, Zeroizing<Vec<u8>>)>,
    ssh_ca_public_key: Vec<u8>,
    host_certificate: Vec<u8>,
    components: Components,
    kubernetes_version: Option<KubernetesVersion>,
}

/// A 32-byte key from a ticket field.
pub(crate) fn key32(bytes: &mut Vec<u8>, field: &'static str) -> Result<DataKey, TicketError> {
    if bytes.len() != 32 {
        return Err(TicketError::KeyLength {
            field,
            len: bytes.len(),
        });
    }
    DataKey::new(std::mem::take(bytes)).map_err(|_| TicketError::KeyLength { field, len: 0 })
}

impl TryFrom<IssueJoinTicketResponse> for Parsed {
    type Error = TicketError;

    fn try_from(mut r: IssueJoinTicketResponse) -> Result<Self, TicketError> {
        let state_disk_key = key32(&mut r.state_disk_key, "state_disk_key")?;
        let measurement_secret = key32(&mut r.measurement_secret, "measurement_secret")?;
        let measurement_salt =
            <[u8; MEASUREMENT_SALT_LEN]>::try_from(r.measurement_salt.as_slice())
                .map_err(|_| TicketError::SaltLength(r.measurement_salt.len()))?;
        // Checked here, so that a ticket with a bad component is refused before the lock.
        let components = Components::try_from(std::mem::take(&mut r.kubernetes_components))
            .map_err(TicketError::Components)?;
        // The version names what the node was handed (the node records it); an empty one
        // is a join service that records no release.
        let kubernetes_version = if r.kubernetes_version.is_empty() {
            None
        } else {
            Some(
                r.kubernetes_version
                    .parse::<KubernetesVersion>()
                    .map_err(TicketError::Version)?,
            )
        };
        let api_server_endpoint =
            ApiServerEndpoint::parse(&r.api_server_endpoint).map_err(TicketError::Endpoint)?;
        let token = BootstrapToken::new(Zeroizing::new(std::mem::take(&mut r.token)))
            .map_err(TicketError::Token)?;
        if r.control_plane_files.len() > MAX_CONTROL_PLANE_FILES {
            return Err(TicketError::TooManyFiles);
        }
        let mut control_plane_files = Vec::with_capacity(r.control_plane_files.len());
        for f in &mut r.control_plane_files {
            if !safe_relative_name(&f.name) {
                return Err(TicketError::FileName(f.name.clone()));
            }
            control_plane_files.push((f.name.clone(), Zeroizing::new(std::mem::take(&mut f.data))));
        }
        Ok(Self {
            state_disk_key,
            measurement_secret,
            measurement_salt,
            kubelet_cert: r.kubelet_cert,
            api_server_endpoint,
            token,
            discovery_token_ca_cert_hash: r.discovery_token_ca_cert_hash,
            control_plane_files,
            ssh_ca_public_key: r.authorized_ca_public_key,
            host_certificate: r.host_certificate,
            components,
            kubernetes_version,
        })
    }
}

/// Checks a join ticket exactly as the JoinClient does before it takes the node lock, up
/// to the checks against the node, and drops it. Public only so that the ticket checks can
/// be fuzzed from outside the crate.
#[doc(hidden)]
pub fn check_join_ticket(ticket: IssueJoinTicketResponse) -> Result<(), String> {
    Parsed::try_from(ticket)
        .map(drop)
        .map_err(|e| error_chain(&e))
}

/// Who the ticket must be for, beyond [`Expect`]: the SSH host key and principals the node
/// asked for, the cluster it trusts, and where components may install.
pub(crate) struct ForNode<'a> {
    /// The kubelet certificate and control-plane files must be for this node.
    pub(crate) expect: Expect<'a>,
    /// The SSH host key the node sent, in SSH wire format.
    pub(crate) host_public_wire: &'a [u8],
    /// The principals the node asked for.
    pub(crate) principals: &'a [String],
    /// Which cluster the ticket must be for, and whose signature it must carry.
    pub(crate) trust: &'a JoinServiceTrust,
    /// The channel binding of the connection the ticket came on.
    pub(crate) binding: Option<ChannelBinding>,
    /// The directories components may install into.
    pub(crate) components_dirs: &'a [PathBuf],
}

/// Checks everything in a ticket before any of it is used, and that it is for the cluster
/// this node expects.
pub(crate) fn check(
    mut ticket: IssueJoinTicketResponse,
    node: &ForNode<'_>,
) -> Result<JoinTicket, TicketError> {
    // First: whatever a worker could make (its own CAs, the measurement secret and salt it
    // was given) is accepted only from the control plane.
    let signature = std::mem::take(&mut ticket.control_plane_signature);
    let signed = Zeroizing::new(ticket.encode_to_vec());
    node.trust
        .check_signature(Purpose::JoinTicket, node.binding, &signed, &signature)?;
    drop(signed);
    let t = Parsed::try_from(ticket)?;
    let cluster_id = derive_cluster_id(&t.measurement_secret, &t.measurement_salt)
        .map_err(TicketError::ClusterId)?;
    node.trust.accepts_cluster(&cluster_id)?;
    let ca_crt = t
        .control_plane_files
        .iter()
        .find(|(n, _)| n == "ca.crt")
        .map(|(_, d)| d.as_slice());
    check_control_plane_files(
        &t.control_plane_files,
        &t.discovery_token_ca_cert_hash,
        &node.expect,
    )
    .map_err(TicketError::Refused)?;
    check_kubelet_cert(
        &t.kubelet_cert,
        &t.discovery_token_ca_cert_hash,
        ca_crt,
        &node.expect,
    )
    .map_err(TicketError::Refused)?;
    check_ssh(
        &t.ssh_ca_public_key,
        &t.host_certificate,
        node.host_public_wire,
        node.principals,
    )
    .map_err(TicketError::Refused)?;
    check_component_paths(&t.components, node.components_dirs).map_err(TicketError::Refused)?;
    Ok(JoinTicket {
        cluster_id,
        state_disk_key: t.state_disk_key,
        measurement_salt: t.measurement_salt,
        kubelet_cert: t.kubelet_cert,
        api_server_endpoint: t.api_server_endpoint,
        token: t.token,
        discovery_token_ca_cert_hash: t.discovery_token_ca_cert_hash,
        control_plane_files: t.control_plane_files,
        ssh_ca_public_key: t.ssh_ca_public_key,
        host_certificate: t.host_certificate,
        components: t.components,
        kubernetes_version: t.kubernetes_version,
    })
}

/// Checks a control-plane file name from a join ticket: a relative path of plain
/// components (`ca.crt`, `etcd/ca.key`), nothing that could leave the PKI directory.
fn safe_relative_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
        })
}

/// The organisation of every node certificate.
const NODES_ORGANIZATION: &str = "system:nodes";
/// The common name prefix of a node certificate.
const NODE_CN_PREFIX: &str = "system:node:";
/// The CA key / certificate pairs among the control-plane files.
const CA_PAIRS: [(&str, &str); 3] = [
    ("ca.crt", "ca.key"),
    ("front-proxy-ca.crt", "front-proxy-ca.key"),
    ("etcd/ca.crt", "etcd/ca.key"),
];

/// Who the ticket must be for.
pub(crate) struct Expect<'a> {
    /// The node's name.
    pub(crate) node_name: &'a str,
    /// The node's IP.
    pub(crate) node_ip: IpAddr,
    /// The DER SubjectPublicKeyInfo of the kubelet key made for this request.
    pub(crate) kubelet_spki: &'a [u8],
    /// Whether the node joins as a control-plane node.
    pub(crate) control_plane: bool,
}

/// The PEM blocks of `bytes` as `(label, DER)`.
fn pem_blocks(bytes: &[u8], what: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(bytes) {
        let block = block.map_err(|e| format!("{what} is not PEM: {e}"))?;
        out.push((block.label, block.contents));
    }
    if out.is_empty() {
        return Err(format!("{what} holds no PEM block"));
    }
    Ok(out)
}

/// The certificates of a PEM bundle (every block must be a `CERTIFICATE`).
fn certificates(bytes: &[u8], what: &str) -> Result<Vec<Vec<u8>>, String> {
    pem_blocks(bytes, what)?
        .into_iter()
        .map(|(label, der)| {
            if label != "CERTIFICATE" {
                return Err(format!("{what} holds a {label} block, not a CERTIFICATE"));
            }
            X509Certificate::from_der(&der)
                .map_err(|e| format!("{what} does not parse as a certificate: {e}"))?;
            Ok(der)
        })
        .collect()
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    X509Certificate::from_der(der)
        .map(|(_, c)| c)
        .map_err(|e| format!("certificate does not parse: {e}"))
}

/// Checks the kubelet certificate of a ticket; `ca_crt` is the control-plane file `ca.crt`
/// when the ticket carries one.
pub(crate) fn check_kubelet_cert(
    kubelet_cert: &[u8],
    discovery_hash: &str,
    ca_crt: Option<&[u8]>,
    expect: &Expect<'_>,
) -> Result<(), String> {
    let chain = certificates(kubelet_cert, "the kubelet certificate")?;
    let (leaf_der, rest) = chain
        .split_first()
        .ok_or("the kubelet certificate is empty")?;
    let ca_der = match (rest, ca_crt) {
        ([ca], _) => ca.clone(),
        ([], Some(ca_crt)) => certificates(ca_crt, "ca.crt")?
            .into_iter()
            .next()
            .ok_or("ca.crt is empty")?,
        ([], None) => {
            return Err("the kubelet certificate comes without the cluster CA certificate".into());
        }
        _ => return Err("the kubelet certificate holds more than a leaf and its CA".into()),
    };
    let hash = asterism_pki::discovery_hash(&ca_der).map_err(|e| e.to_string())?;
    if hash != discovery_hash {
        return Err(format!(
            "the cluster CA of the kubelet certificate ({hash}) is not the CA the ticket names ({discovery_hash})"
        ));
    }
    // The discovery hash pins the CA's key; nothing else about the CA certificate matters.
    let ca = parse(&ca_der)?;
    let leaf = parse(leaf_der)?;
    leaf.verify_signature(Some(ca.public_key()))
        .map_err(|e| format!("the kubelet certificate is not signed by the cluster CA: {e}"))?;
    if !leaf.validity().is_valid() {
        return Err("the kubelet certificate is not valid now".into());
    }
    if leaf.public_key().raw != expect.kubelet_spki {
        return Err("the kubelet certificate does not certify this node's kubelet key".into());
    }
    let subject = leaf.subject();
    let cns: Vec<&str> = subject
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .collect();
    let want_cn = format!("{NODE_CN_PREFIX}{}", expect.node_name);
    if cns != [want_cn.as_str()] {
        return Err(format!(
            "the kubelet certificate is for {cns:?}, not {want_cn:?}"
        ));
    }
    let orgs: Vec<&str> = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .collect();
    if orgs != [NODES_ORGANIZATION] {
        return Err(format!(
            "the kubelet certificate's organisation is {orgs:?}, not [{NODES_ORGANIZATION:?}]"
        ));
    }
    let sans = leaf
        .subject_alternative_name()
        .map_err(|e| format!("the kubelet certificate's SANs: {e}"))?;
    let names: Vec<&GeneralName<'_>> = sans
        .map(|s| s.value.general_names.iter().collect())
        .unwrap_or_default();
    let want_ip: Vec<u8> = match expect.node_ip {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    };
    let only_this_ip =
        matches!(names.as_slice(), [GeneralName::IPAddress(ip)] if *ip == want_ip.as_slice());
    if !only_this_ip {
        return Err(format!(
            "the kubelet certificate's SANs are not exactly this node's IP {}",
            expect.node_ip
        ));
    }
    Ok(())
}

/// Checks the control-plane files of a ticket.
pub(crate) fn check_control_plane_files(
    files: &[(String, Zeroizing<Vec<u8>>)],
    discovery_hash: &str,
    expect: &Expect<'_>,
) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for (name, _) in files {
        if !CONTROL_PLANE_FILES.contains(&name.as_str()) {
            return Err(format!("{name:?} is not a control-plane file"));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("the control-plane file {name:?} comes twice"));
        }
    }
    let get = |name: &str| {
        files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.as_slice())
    };
    if expect.control_plane
        && let Some(missing) = REQUIRED_CONTROL_PLANE_FILES
            .into_iter()
            .find(|name| get(name).is_none())
    {
        return Err(format!("a control-plane node needs {missing}"));
    }
    for (crt_name, key_name) in CA_PAIRS {
        match (get(crt_name), get(key_name)) {
            (None, None) => {}
            (Some(crt), None) => {
                let der = certificates(crt, crt_name)?;
                let first = der.first().ok_or_else(|| format!("{crt_name} is empty"))?;
                if !parse(first)?.is_ca() {
                    return Err(format!("{crt_name} is not a CA certificate"));
                }
            }
            (None, Some(_)) => return Err(format!("{key_name} comes without {crt_name}")),
            (Some(crt), Some(key)) => {
                let crt =
                    std::str::from_utf8(crt).map_err(|_| format!("{crt_name} is not text"))?;
                let key = Zeroizing::new(
                    std::str::from_utf8(key)
                        .map_err(|_| format!("{key_name} is not text"))?
                        .to_owned(),
                );
                asterism_pki::ClusterCa::from_pem(crt, &key).map_err(|e| {
                    format!(
                        "{crt_name} and {key_name} are not a CA and its key: {}",
                        error_chain(&e)
                    )
                })?;
            }
        }
    }
    if let Some(ca) = get("ca.crt") {
        let der = certificates(ca, "ca.crt")?;
        let first = der.first().ok_or("ca.crt is empty")?;
        let hash = asterism_pki::discovery_hash(first).map_err(|e| e.to_string())?;
        if hash != discovery_hash {
            return Err(format!(
                "ca.crt ({hash}) is not the CA the ticket names ({discovery_hash})"
            ));
        }
    }
    match (get("sa.key"), get("sa.pub")) {
        (None, None) => {}
        (Some(key), Some(public)) => check_service_account_pair(key, public)?,
        (Some(_), None) => return Err("sa.key comes without sa.pub".into()),
        (None, Some(_)) => return Err("sa.pub comes without sa.key".into()),
    }
    Ok(())
}

/// `sa.key` is an RSA private key (PKCS#1 or PKCS#8) and `sa.pub` its public key (SPKI).
fn check_service_account_pair(key: &[u8], public: &[u8]) -> Result<(), String> {
    let blocks = Zeroizing::new(pem_blocks(key, "sa.key")?);
    let [(label, der)] = blocks.as_slice() else {
        return Err("sa.key holds more than one PEM block".into());
    };
    let pair = match label.as_str() {
        "RSA PRIVATE KEY" => ring::rsa::KeyPair::from_der(der),
        "PRIVATE KEY" => ring::rsa::KeyPair::from_pkcs8(der),
        other => return Err(format!("sa.key is a {other} block, not an RSA private key")),
    }
    .map_err(|e| format!("sa.key is not an RSA private key: {e}"))?;
    let blocks = pem_blocks(public, "sa.pub")?;
    let [(label, der)] = blocks.as_slice() else {
        return Err("sa.pub holds more than one PEM block".into());
    };
    if label != "PUBLIC KEY" {
        return Err(format!("sa.pub is a {label} block, not a PUBLIC KEY"));
    }
    let (_, spki) = SubjectPublicKeyInfo::from_der(der)
        .map_err(|e| format!("sa.pub does not parse as a public key: {e}"))?;
    let ours: &[u8] = ring::signature::KeyPair::public_key(&pair).as_ref();
    if spki.subject_public_key.data.as_ref() != ours {
        return Err("sa.pub is not the public key of sa.key".into());
    }
    Ok(())
}

/// Checks the SSH CA key and host certificate of a ticket: `host_public_wire` is the host
/// key the node sent, `asked` the principals it asked for.
pub(crate) fn check_ssh(
    ca_line: &[u8],
    host_certificate: &[u8],
    host_public_wire: &[u8],
    asked: &[String],
) -> Result<(), String> {
    let text = |bytes: &[u8], what: &str| {
        std::str::from_utf8(bytes)
            .map(|s| s.trim().to_owned())
            .map_err(|_| format!("the {what} is not text"))
    };
    let ca = ssh_key::PublicKey::from_openssh(&text(ca_line, "SSH CA key")?)
        .map_err(|e| format!("the SSH CA key does not parse: {e}"))?;
    let cert = ssh_key::Certificate::from_openssh(&text(host_certificate, "SSH host certificate")?)
        .map_err(|e| format!("the SSH host certificate does not parse: {e}"))?;
    let host = ssh_key::PublicKey::from_bytes(host_public_wire)
        .map_err(|e| format!("this node's SSH host key: {e}"))?;
    if cert.public_key() != host.key_data() {
        return Err("the SSH host certificate is not for this node's host key".into());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    cert.validate_at(now, [&ca.fingerprint(ssh_key::HashAlg::Sha256)])
        .map_err(|e| {
            format!("the SSH host certificate is not signed by the SSH CA, or not valid now: {e}")
        })?;
    let principals = cert.valid_principals();
    if principals.is_empty() || principals.iter().any(|p| !asked.contains(p)) {
        return Err(format!(
            "the SSH host certificate names {principals:?}, not a part of {asked:?}"
        ));
    }
    Ok(())
}

/// Checks that every component installs inside one of `roots`, lexically and through no
/// symlink that exists now: a file strictly inside, an archive inside or into the
/// directory itself (the versions table unpacks the CNI plugins into `/opt/cni/bin`; the
/// unpacking keeps every entry inside its destination).
pub(crate) fn check_component_paths(
    components: &Components,
    roots: &[std::path::PathBuf],
) -> Result<(), String> {
    for c in components.as_slice() {
        let path = Path::new(&c.install_path);
        let plain = path.is_absolute()
            && path
                .components()
                .all(|p| matches!(p, PathPart::RootDir | PathPart::Normal(_)));
        let inside = roots.iter().find_map(|root| {
            let rel = path.strip_prefix(root).ok().filter(|_| plain)?;
            (c.extract || rel.components().next().is_some()).then_some((root, rel))
        });
        let Some((root, rel)) = inside else {
            return Err(format!(
                "component install path {:?} is not inside {}",
                c.install_path,
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        let mut cur = root.to_path_buf();
        for part in rel.components() {
            cur.push(part);
            match std::fs::symlink_metadata(&cur) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(format!(
                        "component install path {:?} goes through the symlink {}",
                        c.install_path,
                        cur.display()
                    ));
                }
                Ok(_) => {}
                // Nothing further exists: nothing further can be a symlink.
                Err(_) => break,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use asterism_pki::{ClusterCa, KubeletCsr, kubelet_key_and_csr};
    use std::time::{Duration, SystemTime};

    const NAME: &str = "worker-0";
    const IP: &str = "10.0.0.1";

    struct Fixture {
        ca: ClusterCa,
        spki: Vec<u8>,
        csr: KubeletCsr,
    }

    fn spki_of_csr(der: &[u8]) -> Vec<u8> {
        x509_parser::certification_request::X509CertificationRequest::from_der(der)
            .unwrap()
            .1
            .certification_request_info
            .subject_pki
            .raw
            .to_vec()
    }

    fn csr(name: &str, ip: &str) -> (KubeletCsr, Vec<u8>) {
        let made = kubelet_key_and_csr(name, &[ip.parse().unwrap()]).unwrap();
        (
            KubeletCsr::parse(&made.csr_der).unwrap(),
            spki_of_csr(&made.csr_der),
        )
    }

    fn fixture() -> Fixture {
        let (csr, spki) = csr(NAME, IP);
        Fixture {
            ca: ClusterCa::generate(SystemTime::now()).unwrap(),
            spki,
            csr,
        }
    }

    fn expect(f: &Fixture, control_plane: bool) -> Expect<'_> {
        Expect {
            node_name: NAME,
            node_ip: IP.parse().unwrap(),
            kubelet_spki: &f.spki,
            control_plane,
        }
    }

    fn chain(ca: &ClusterCa, leaf: &str) -> Vec<u8> {
        format!("{leaf}{}", ca.cert_pem()).into_bytes()
    }

    fn check(f: &Fixture, cert: &[u8]) -> Result<(), String> {
        check_kubelet_cert(
            cert,
            &f.ca.discovery_hash().unwrap(),
            None,
            &expect(f, false),
        )
    }

    #[test]
    fn a_kubelet_certificate_for_this_node_under_the_named_ca_passes() {
        let f = fixture();
        let leaf = f.ca.sign_kubelet(&f.csr, SystemTime::now()).unwrap();
        check(&f, &chain(&f.ca, &leaf)).unwrap();
        // A control-plane node may take the CA from its ca.crt instead.
        check_kubelet_cert(
            leaf.as_bytes(),
            &f.ca.discovery_hash().unwrap(),
            Some(f.ca.cert_pem().as_bytes()),
            &expect(&f, true),
        )
        .unwrap();
    }

    #[test]
    fn a_kubelet_certificate_that_is_not_a_certificate_is_refused() {
        let f = fixture();
        for bad in [
            &b"not a certificate"[..],
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ] {
            assert!(check(&f, bad).is_err());
        }
    }

    #[test]
    fn a_kubelet_certificate_without_its_ca_is_refused() {
        let f = fixture();
        let leaf = f.ca.sign_kubelet(&f.csr, SystemTime::now()).unwrap();
        let e = check(&f, leaf.as_bytes()).unwrap_err();
        assert!(e.contains("without the cluster CA"), "{e}");
    }

    #[test]
    fn a_kubelet_certificate_under_another_ca_than_the_named_one_is_refused() {
        let f = fixture();
        let other = ClusterCa::generate(SystemTime::now()).unwrap();
        let leaf = other.sign_kubelet(&f.csr, SystemTime::now()).unwrap();
        let e = check(&f, &chain(&other, &leaf)).unwrap_err();
        assert!(e.contains("is not the CA the ticket names"), "{e}");
    }

    #[test]
    fn a_kubelet_certificate_not_signed_by_the_named_ca_is_refused() {
        let f = fixture();
        let other = ClusterCa::generate(SystemTime::now()).unwrap();
        let leaf = other.sign_kubelet(&f.csr, SystemTime::now()).unwrap();
        // The named CA comes along, but did not sign the leaf.
        let e = check(&f, &chain(&f.ca, &leaf)).unwrap_err();
        assert!(e.contains("not signed by the cluster CA"), "{e}");
    }

    #[test]
    fn an_expired_kubelet_certificate_is_refused() {
        let f = fixture();
        let long_ago = SystemTime::now() - Duration::from_secs(3 * 365 * 24 * 3600);
        let leaf = f.ca.sign_kubelet(&f.csr, long_ago).unwrap();
        let e = check(&f, &chain(&f.ca, &leaf)).unwrap_err();
        assert!(e.contains("not valid now"), "{e}");
    }

    #[test]
    fn a_kubelet_certificate_for_another_key_is_refused() {
        let f = fixture();
        let (other_csr, _) = csr(NAME, IP);
        let leaf = f.ca.sign_kubelet(&other_csr, SystemTime::now()).unwrap();
        let e = check(&f, &chain(&f.ca, &leaf)).unwrap_err();
        assert!(e.contains("kubelet key"), "{e}");
    }

    #[test]
    fn a_kubelet_certificate_for_another_name_or_address_is_refused() {
        let f = fixture();
        for (name, ip, want) in [
            ("control-plane-0", IP, "is for"),
            (NAME, "10.0.0.9", "SANs"),
        ] {
            let (other_csr, other_spki) = csr(name, ip);
            let leaf = f.ca.sign_kubelet(&other_csr, SystemTime::now()).unwrap();
            // It certifies the key the node holds, but not this node.
            let e = check_kubelet_cert(
                &chain(&f.ca, &leaf),
                &f.ca.discovery_hash().unwrap(),
                None,
                &Expect {
                    kubelet_spki: &other_spki,
                    ..expect(&f, false)
                },
            )
            .unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    fn file(name: &str, data: &[u8]) -> (String, Zeroizing<Vec<u8>>) {
        (name.to_owned(), Zeroizing::new(data.to_vec()))
    }

    fn ca_files(ca: &ClusterCa) -> Vec<(String, Zeroizing<Vec<u8>>)> {
        vec![
            file("ca.crt", ca.cert_pem().as_bytes()),
            file("ca.key", ca.key_pem().unwrap().expose_secret().as_bytes()),
        ]
    }

    fn check_files(f: &Fixture, files: &[(String, Zeroizing<Vec<u8>>)]) -> Result<(), String> {
        check_control_plane_files(files, &f.ca.discovery_hash().unwrap(), &expect(f, true))
    }

    /// An RSA key pair as kubeadm writes sa.key and sa.pub.
    fn rsa_pair() -> (Vec<u8>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("sa.key");
        let run = |args: &[&str]| {
            assert!(
                asterism_children::status(std::process::Command::new("openssl").args(args))
                    .unwrap()
                    .success()
            );
        };
        let key_s = key.to_str().unwrap();
        let public = dir.path().join("sa.pub");
        run(&["genrsa", "-traditional", "-out", key_s, "2048"]);
        run(&[
            "rsa",
            "-in",
            key_s,
            "-pubout",
            "-out",
            public.to_str().unwrap(),
        ]);
        (
            std::fs::read(&key).unwrap(),
            std::fs::read(&public).unwrap(),
        )
    }

    #[test]
    fn control_plane_files_that_are_what_their_names_say_pass() {
        let f = fixture();
        let front = ClusterCa::generate(SystemTime::now()).unwrap();
        let (sa_key, sa_pub) = rsa_pair();
        let mut files = ca_files(&f.ca);
        files.push(file("front-proxy-ca.crt", front.cert_pem().as_bytes()));
        files.push(file(
            "front-proxy-ca.key",
            front.key_pem().unwrap().expose_secret().as_bytes(),
        ));
        files.push(file("sa.key", &sa_key));
        files.push(file("sa.pub", &sa_pub));
        check_files(&f, &files).unwrap();
        // A worker is sent none.
        check_control_plane_files(&[], &f.ca.discovery_hash().unwrap(), &expect(&f, false))
            .unwrap();
    }

    #[test]
    fn control_plane_files_with_other_names_or_twice_are_refused() {
        let f = fixture();
        for name in ["kubelet.conf", "../ca.crt", "/etc/passwd", "etcd/peer.key"] {
            let mut files = ca_files(&f.ca);
            files.push(file(name, f.ca.cert_pem().as_bytes()));
            let e = check_files(&f, &files).unwrap_err();
            assert!(e.contains("is not a control-plane file"), "{e}");
        }
        let mut files = ca_files(&f.ca);
        files.push(file("ca.crt", f.ca.cert_pem().as_bytes()));
        assert!(check_files(&f, &files).unwrap_err().contains("twice"));
    }

    #[test]
    fn a_control_plane_node_needs_the_cluster_ca_and_its_key() {
        let f = fixture();
        let files = ca_files(&f.ca);
        for keep in ["ca.crt", "ca.key"] {
            let only: Vec<_> = files.iter().filter(|(n, _)| n == keep).cloned().collect();
            assert!(check_files(&f, &only).is_err(), "only {keep}");
        }
    }

    #[test]
    fn a_certificate_file_that_is_no_ca_certificate_is_refused() {
        let f = fixture();
        let leaf = f.ca.sign_kubelet(&f.csr, SystemTime::now()).unwrap();
        for (data, want) in [
            (&b"garbage"[..], "PEM"),
            (leaf.as_bytes(), "not a CA certificate"),
        ] {
            let mut files = ca_files(&f.ca);
            files.push(file("etcd/ca.crt", data));
            let e = check_files(&f, &files).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn a_ca_key_that_is_not_its_certificates_key_is_refused() {
        let f = fixture();
        let other = ClusterCa::generate(SystemTime::now()).unwrap();
        let files = vec![
            file("ca.crt", f.ca.cert_pem().as_bytes()),
            file(
                "ca.key",
                other.key_pem().unwrap().expose_secret().as_bytes(),
            ),
        ];
        let e = check_files(&f, &files).unwrap_err();
        assert!(e.contains("are not a CA and its key"), "{e}");
        let mut files = ca_files(&f.ca);
        files.push(file(
            "etcd/ca.key",
            other.key_pem().unwrap().expose_secret().as_bytes(),
        ));
        assert!(check_files(&f, &files).unwrap_err().contains("without"));
    }

    #[test]
    fn a_ca_certificate_other_than_the_named_one_is_refused() {
        let f = fixture();
        let other = ClusterCa::generate(SystemTime::now()).unwrap();
        let e = check_files(&f, &ca_files(&other)).unwrap_err();
        assert!(e.contains("is not the CA the ticket names"), "{e}");
    }

    #[test]
    fn a_service_account_key_that_is_not_the_pair_of_its_public_key_is_refused() {
        let f = fixture();
        let (key_a, pub_a) = rsa_pair();
        let (_, pub_b) = rsa_pair();
        for (key, public, want) in [
            (&key_a[..], &pub_b[..], "not the public key of sa.key"),
            (b"garbage", &pub_a, "PEM"),
            (&pub_a, &pub_a, "not an RSA private key"),
            (&key_a, &key_a, "not a PUBLIC KEY"),
        ] {
            let mut files = ca_files(&f.ca);
            files.push(file("sa.key", key));
            files.push(file("sa.pub", public));
            let e = check_files(&f, &files).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let mut files = ca_files(&f.ca);
        files.push(file("sa.key", &key_a));
        assert!(
            check_files(&f, &files)
                .unwrap_err()
                .contains("without sa.pub")
        );
    }

    struct Ssh {
        ca: asterism_pki::SshCa,
        host: asterism_pki::HostKey,
        wire: Vec<u8>,
        asked: Vec<String>,
    }

    fn ssh() -> Ssh {
        let ca = asterism_pki::SshCa::from_seed(&asterism_disk::DataKey::new(vec![7; 32]).unwrap())
            .unwrap();
        let host = asterism_pki::HostKey::generate().unwrap();
        let wire = host.public_key_wire().unwrap();
        Ssh {
            ca,
            host,
            wire,
            asked: vec![IP.to_owned(), NAME.to_owned()],
        }
    }

    fn host_cert(
        ca: &asterism_pki::SshCa,
        host: &asterism_pki::HostKey,
        principals: &[String],
    ) -> Vec<u8> {
        ca.sign_host_certificate(host.public_key(), principals, SystemTime::now())
            .unwrap()
            .to_authorized_keys_line()
            .unwrap()
            .into_bytes()
    }

    #[test]
    fn an_ssh_host_certificate_for_this_host_from_the_ssh_ca_passes() {
        let s = ssh();
        let cert = host_cert(&s.ca, &s.host, &s.asked);
        check_ssh(
            s.ca.authorized_keys_line().as_bytes(),
            &cert,
            &s.wire,
            &s.asked,
        )
        .unwrap();
    }

    #[test]
    fn ssh_files_that_do_not_parse_are_refused() {
        let s = ssh();
        let cert = host_cert(&s.ca, &s.host, &s.asked);
        let e = check_ssh(b"not a key", &cert, &s.wire, &s.asked).unwrap_err();
        assert!(e.contains("SSH CA key does not parse"), "{e}");
        let ca = s.ca.authorized_keys_line();
        let e = check_ssh(ca.as_bytes(), b"not a certificate", &s.wire, &s.asked).unwrap_err();
        assert!(e.contains("host certificate does not parse"), "{e}");
    }

    #[test]
    fn an_ssh_host_certificate_for_another_key_is_refused() {
        let s = ssh();
        let other = asterism_pki::HostKey::generate().unwrap();
        let cert = host_cert(&s.ca, &other, &s.asked);
        let ca = s.ca.authorized_keys_line();
        let e = check_ssh(ca.as_bytes(), &cert, &s.wire, &s.asked).unwrap_err();
        assert!(e.contains("not for this node's host key"), "{e}");
    }

    #[test]
    fn an_ssh_host_certificate_from_another_ca_is_refused() {
        let s = ssh();
        let other =
            asterism_pki::SshCa::from_seed(&asterism_disk::DataKey::new(vec![8; 32]).unwrap())
                .unwrap();
        let cert = host_cert(&other, &s.host, &s.asked);
        let ca = s.ca.authorized_keys_line();
        let e = check_ssh(ca.as_bytes(), &cert, &s.wire, &s.asked).unwrap_err();
        assert!(e.contains("not signed by the SSH CA"), "{e}");
    }

    #[test]
    fn an_ssh_host_certificate_for_principals_not_asked_for_is_refused() {
        let s = ssh();
        let cert = host_cert(&s.ca, &s.host, &["*".to_owned()]);
        let ca = s.ca.authorized_keys_line();
        let e = check_ssh(ca.as_bytes(), &cert, &s.wire, &s.asked).unwrap_err();
        assert!(e.contains("not a part of"), "{e}");
    }

    fn components(paths: &[&str]) -> Components {
        Components::new(
            paths
                .iter()
                .map(|p| asterism_components::Component {
                    url: "https://example.com/x".into(),
                    hash: format!("sha256:{}", "ab".repeat(32)),
                    install_path: (*p).into(),
                    extract: false,
                })
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn component_paths_stay_inside_the_components_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bin");
        std::fs::create_dir(&root).unwrap();
        let inside = format!("{}/kubelet", root.display());
        let nested = format!("{}/cni/plugins", root.display());
        check_component_paths(
            &components(&[&inside, &nested]),
            std::slice::from_ref(&root),
        )
        .unwrap();
        for bad in [
            "/usr/bin/kubelet".to_string(),
            root.display().to_string(),
            format!("{}-other/kubelet", root.display()),
        ] {
            let e = check_component_paths(&components(&[&bad]), std::slice::from_ref(&root))
                .unwrap_err();
            assert!(e.contains("is not inside"), "{bad}: {e}");
        }
        // `..` is refused (by the component check before this one, and here).
        let dotdot = Components::new(vec![asterism_components::Component {
            url: "https://example.com/x".into(),
            hash: format!("sha256:{}", "ab".repeat(32)),
            install_path: format!("{}/../etc/kubelet", root.display()),
            extract: false,
        }]);
        assert!(dotdot.is_err());
    }

    #[test]
    fn component_paths_may_use_any_of_the_fixed_directories_and_nothing_between_them() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let cni = dir.path().join("cni");
        let roots = [bin.clone(), cni.clone()];
        let ok = [
            format!("{}/kubelet", bin.display()),
            format!("{}/bridge", cni.display()),
        ];
        check_component_paths(&components(&[&ok[0], &ok[1]]), &roots).unwrap();
        for bad in [
            format!("{}/etc/kubelet", dir.path().display()),
            dir.path().display().to_string(),
            cni.display().to_string(),
        ] {
            let e = check_component_paths(&components(&[&bad]), &roots).unwrap_err();
            assert!(e.contains("is not inside"), "{bad}: {e}");
        }
    }

    #[test]
    fn archives_may_unpack_into_a_fixed_directory_itself_files_may_not() {
        let dir = tempfile::tempdir().unwrap();
        let cni = dir.path().join("cni");
        let archive = |path: String| {
            Components::new(vec![asterism_components::Component {
                url: "https://example.com/plugins.tgz".into(),
                hash: format!("sha256:{}", "ab".repeat(32)),
                install_path: path,
                extract: true,
            }])
            .unwrap()
        };
        let roots = std::slice::from_ref(&cni);
        check_component_paths(&archive(cni.display().to_string()), roots).unwrap();
        check_component_paths(&archive(format!("{}/sub", cni.display())), roots).unwrap();
        for bad in [
            dir.path().display().to_string(),
            format!("{}-other", cni.display()),
            "/opt".to_owned(),
        ] {
            let e = check_component_paths(&archive(bad.clone()), roots).unwrap_err();
            assert!(e.contains("is not inside"), "{bad}: {e}");
        }
        let e =
            check_component_paths(&components(&[&cni.display().to_string()]), roots).unwrap_err();
        assert!(e.contains("is not inside"), "{e}");
    }

    #[test]
    fn every_release_of_the_versions_table_installs_into_the_default_directories() {
        let roots: Vec<PathBuf> = crate::config::DEFAULT_COMPONENTS_DIRS
            .iter()
            .map(PathBuf::from)
            .collect();
        let table = asterism_kubernetes_versions::VersionTable::builtin().unwrap();
        for version in table.versions() {
            let release = table
                .resolve(asterism_kubernetes_versions::VersionRequest::Exact(version))
                .unwrap();
            let list = Components::new(release.components().to_vec()).unwrap();
            check_component_paths(&list, &roots).unwrap_or_else(|e| panic!("{version}: {e}"));
        }
    }

    #[test]
    fn component_paths_through_a_symlink_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bin");
        std::fs::create_dir(&root).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("cni")).unwrap();
        std::os::unix::fs::symlink(outside.join("k"), root.join("kubelet")).unwrap();
        for bad in [
            format!("{}/cni/bridge", root.display()),
            format!("{}/kubelet", root.display()),
        ] {
            let e = check_component_paths(&components(&[&bad]), std::slice::from_ref(&root))
                .unwrap_err();
            assert!(e.contains("symlink"), "{bad}: {e}");
        }
    }

    fn ticket(components: Vec<asterism_proto::components::Component>) -> IssueJoinTicketResponse {
        IssueJoinTicketResponse {
            state_disk_key: vec![1; 32],
            measurement_secret: vec![2; 32],
            measurement_salt: vec![3; 32],
            api_server_endpoint: "10.0.0.2:6443".into(),
            token: "abcdef.0123456789abcdef".into(),
            kubernetes_components: components,
            ..IssueJoinTicketResponse::default()
        }
    }

    fn component(hash: &str) -> asterism_proto::components::Component {
        asterism_proto::components::Component {
            url: "https://example.com/kubeadm".into(),
            hash: hash.into(),
            install_path: "/run/state/bin/kubeadm".into(),
            extract: false,
        }
    }

    #[test]
    fn a_ticket_with_a_bad_component_is_refused() {
        for bad in [
            "",
            "sha256:00",
            "md5:0123",
            &format!("sha256:{}", "AB".repeat(32)),
        ] {
            let Err(e) = Parsed::try_from(ticket(vec![component(bad)])) else {
                panic!("accepted the hash {bad:?}");
            };
            let e = error_chain(&e);
            assert!(e.starts_with("kubernetes_components"), "{e}");
        }
    }

    #[test]
    fn the_ticket_components_are_kept_in_order() {
        let hashes = [
            format!("sha256:{}", "ab".repeat(32)),
            format!("sha256:{}", "cd".repeat(32)),
        ];
        let t = Parsed::try_from(ticket(hashes.iter().map(|h| component(h)).collect())).unwrap();
        let got: Vec<_> = t.components.as_slice().iter().map(|c| &c.hash).collect();
        assert_eq!(got, [&hashes[0], &hashes[1]]);
        assert!(
            Parsed::try_from(ticket(Vec::new()))
                .unwrap()
                .components
                .is_empty()
        );
    }

    #[test]
    fn a_ticket_whose_kubernetes_version_is_not_a_patch_version_is_refused() {
        for ok in ["", "v1.31.13", "v1.30.14"] {
            let mut t = ticket(Vec::new());
            t.kubernetes_version = ok.into();
            let parsed = Parsed::try_from(t).unwrap().kubernetes_version;
            assert_eq!(parsed.map(|v| v.to_string()).unwrap_or_default(), ok);
        }
        for bad in [
            "v1.31",
            "1.31.13",
            "v1.31.13-rc.0",
            "v1.31.13\n",
            "v01.31.13",
            "latest",
        ] {
            let mut t = ticket(Vec::new());
            t.kubernetes_version = bad.into();
            match Parsed::try_from(t) {
                Err(TicketError::Version(e)) => assert_eq!(e.text, bad),
                Err(e) => panic!("{bad:?}: refused for another reason: {e}"),
                Ok(_) => panic!("{bad:?}: accepted"),
            }
        }
    }

    #[test]
    fn a_ticket_whose_api_server_endpoint_is_not_host_and_port_is_refused() {
        for ok in ["10.0.0.2:6443", "[fd00::1]:6443", "api.example:6443"] {
            let mut t = ticket(Vec::new());
            t.api_server_endpoint = ok.into();
            let parsed = Parsed::try_from(t).unwrap();
            assert_eq!(parsed.api_server_endpoint.as_str(), ok);
        }
        for bad in [
            "",
            "10.0.0.2",
            "10.0.0.2:",
            "10.0.0.2:0",
            "10.0.0.2:65536",
            ":6443",
            "fd00::1:6443",
            "a b:6443",
            "https://10.0.0.2:6443",
        ] {
            let mut t = ticket(Vec::new());
            t.api_server_endpoint = bad.into();
            assert!(
                matches!(Parsed::try_from(t), Err(TicketError::Endpoint(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_ticket_whose_token_is_not_a_bootstrap_token_is_refused() {
        for bad in ["", "abcdef.0123456789abcde", "ABCDEF.0123456789abcdef"] {
            let mut t = ticket(Vec::new());
            t.token = bad.into();
            assert!(
                matches!(Parsed::try_from(t), Err(TicketError::Token(_))),
                "{bad:?}"
            );
        }
        let parsed = Parsed::try_from(ticket(Vec::new())).unwrap();
        assert_eq!(parsed.token.id(), "abcdef");
    }

    #[test]
    fn control_plane_file_names_cannot_leave_the_pki_directory() {
        for ok in ["ca.crt", "etcd/ca.key", "front-proxy-ca.crt", "sa.pub"] {
            assert!(safe_relative_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "etcd/../../x",
            "a//b",
            "./a",
            "a b",
        ] {
            assert!(!safe_relative_name(bad), "{bad}");
        }
    }
}
