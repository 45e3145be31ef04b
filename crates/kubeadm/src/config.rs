//! Typed kubeadm configuration: InitConfiguration, ClusterConfiguration,
//! KubeletConfiguration and JoinConfiguration, rendered as YAML documents joined by `---`.
//!
//! `kubeadm.k8s.io/v1beta4` is used from Kubernetes v1.31 on (kubeadm 1.31 introduced it;
//! its extra arguments are lists of `{name, value}`), `v1beta3` (extra arguments as maps)
//! before. Rendering is pure: values in, text out. [`PrivateConfigFile`] is the one I/O
//! piece: it writes a rendered file (which may hold a bootstrap token) into a private
//! temporary directory and removes it when dropped.
//!
//! Init and join use the same cloud-provider setting; the join configuration always pins
//! the cluster CA (`caCertHashes` must not be empty, `unsafeSkipCAVerification` is never
//! set), so kubeadm's discovery trusts no API server but the cluster's; an empty cloud
//! provider is left out instead of being passed as an empty flag; join also passes
//! `provider-id` as a kubelet argument, as init does, because kubeadm join may ignore the
//! KubeletConfiguration's.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use asterism_basics::PathError;
use asterism_kubernetes_versions::KubernetesVersion;
use serde::Serialize;
use serde::ser::{SerializeMap as _, SerializeSeq as _};
use zeroize::Zeroizing;

/// `kubeadm.k8s.io/v1beta3`.
pub const KUBEADM_V1BETA3: &str = "kubeadm.k8s.io/v1beta3";
/// `kubeadm.k8s.io/v1beta4`.
pub const KUBEADM_V1BETA4: &str = "kubeadm.k8s.io/v1beta4";
/// The KubeletConfiguration API version.
pub const KUBELET_CONFIG_API: &str = "kubelet.config.k8s.io/v1beta1";
/// The containerd socket.
pub const CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";
pub use asterism_cluster::{API_SERVER_PORT, BootstrapToken, is_bootstrap_token};
/// The kubeadm phase a joining control-plane node skips: it got the control-plane files
/// from the join service.
pub const SKIP_DOWNLOAD_CERTS: &str = "control-plane-prepare/download-certs";
/// The TLS cipher suites of the kubelet's serving endpoint.
pub const KUBELET_TLS_CIPHER_SUITES: [&str; 8] = [
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
];

/// The audit policy written before init and join.
pub const AUDIT_POLICY: &str =
    "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n";

/// The configuration could not be rendered: an input is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The node name cannot be made a Kubernetes node name.
    #[error("node name {0:?} is not a valid Kubernetes node name")]
    NodeName(String),
    /// The cluster name is empty.
    #[error("the cluster name is empty")]
    ClusterName,
    /// The API server endpoint is not `host:port`.
    #[error("API server endpoint {0:?} is not host:port")]
    Endpoint(String),
    /// No CA hash, or a hash that is not `sha256:<64 hex>`.
    #[error("CA certificate hash {0:?} is not sha256:<64 hex> (at least one is required)")]
    CaCertHash(String),
    /// A value holds a character YAML or the flag would misread (a newline).
    #[error("{0} holds a newline")]
    Newline(&'static str),
    /// YAML serialisation failed.
    #[error("rendering YAML")]
    Yaml(#[source] serde_norway::Error),
    /// Writing the private configuration file failed.
    #[error(transparent)]
    Io(#[from] PathError),
}

/// The kubeadm configuration API version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    /// `kubeadm.k8s.io/v1beta3`: extra arguments are maps.
    V1Beta3,
    /// `kubeadm.k8s.io/v1beta4` (kubeadm ≥ 1.31): extra arguments are `{name, value}` lists.
    V1Beta4,
}

impl ApiVersion {
    /// v1beta4 for Kubernetes ≥ v1.31, v1beta3 below.
    #[must_use]
    pub fn for_kubernetes(version: &KubernetesVersion) -> Self {
        if (version.major(), version.minor()) >= (1, 31) {
            Self::V1Beta4
        } else {
            Self::V1Beta3
        }
    }

    /// `kubeadm.k8s.io/v1beta3` or `kubeadm.k8s.io/v1beta4`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1Beta3 => KUBEADM_V1BETA3,
            Self::V1Beta4 => KUBEADM_V1BETA4,
        }
    }
}

/// The cloud-provider setting, the same for init and join: a node's kubelet and the
/// cluster's controller manager must agree on whether a cloud controller manager runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloudProvider {
    /// A cloud controller manager runs in the cluster: `cloud-provider: external` for the
    /// kubelet and the controller manager.
    External,
    /// No cloud controller manager; no `cloud-provider` argument is passed.
    #[default]
    None,
}

/// Where kubeadm and the kubelet find their files on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePaths {
    /// kubeadm's directory: `pki/`, `manifests/`, `admin.conf`, `audit-policy.yaml`
    /// (`/etc/kubernetes`; only tests use another).
    pub kubernetes_dir: PathBuf,
    /// The kubelet's serving certificate (`/run/state/kubelet/pki/kubelet-client-crt.pem`).
    pub kubelet_cert: PathBuf,
    /// Its key (`/run/state/kubelet/pki/kubelet-client-key.pem`).
    pub kubelet_key: PathBuf,
    /// kubeadm's patches directory (`/opt/kubernetes/patches`).
    pub patches_dir: PathBuf,
}

impl NodePaths {
    /// The production layout.
    #[must_use]
    pub fn standard() -> Self {
        Self {
            kubernetes_dir: "/etc/kubernetes".into(),
            kubelet_cert: "/run/state/kubelet/pki/kubelet-client-crt.pem".into(),
            kubelet_key: "/run/state/kubelet/pki/kubelet-client-key.pem".into(),
            patches_dir: "/opt/kubernetes/patches".into(),
        }
    }

    /// `<kubernetes dir>/pki`.
    #[must_use]
    pub fn pki_dir(&self) -> PathBuf {
        self.kubernetes_dir.join("pki")
    }

    /// `<kubernetes dir>/manifests`.
    #[must_use]
    pub fn manifests_dir(&self) -> PathBuf {
        self.kubernetes_dir.join("manifests")
    }

    /// `<kubernetes dir>/audit-policy.yaml`.
    #[must_use]
    pub fn audit_policy(&self) -> PathBuf {
        self.kubernetes_dir.join("audit-policy.yaml")
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Makes an instance name Kubernetes-compliant (lower case, `_` → `-`: the node names
/// existing clusters already have) and checks it is a DNS-1123 subdomain.
pub fn k8s_node_name(raw: &str) -> Result<String, ConfigError> {
    let name = raw.to_lowercase().replace('_', "-");
    if asterism_basics::is_node_name(&name) {
        Ok(name)
    } else {
        Err(ConfigError::NodeName(raw.to_owned()))
    }
}

fn check_ca_hash(h: &str) -> Result<(), ConfigError> {
    let ok = h
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::CaCertHash(h.to_owned()))
    }
}

fn check_endpoint(e: &str) -> Result<(), ConfigError> {
    let bad = || ConfigError::Endpoint(e.to_owned());
    let (host, port) = e.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty()
        || host.contains(char::is_whitespace)
        || port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(bad());
    }
    Ok(())
}

fn no_newline(what: &'static str, v: &str) -> Result<(), ConfigError> {
    if v.contains(['\n', '\r']) {
        Err(ConfigError::Newline(what))
    } else {
        Ok(())
    }
}

/// Extra arguments: a map in v1beta3, a `{name, value}` list in v1beta4. Kept in insertion
/// order for v1beta4 and sorted by name for v1beta3 (Go marshals maps sorted).
#[derive(Debug, Clone)]
struct ExtraArgs {
    api: ApiVersion,
    args: Vec<(&'static str, String)>,
}

impl ExtraArgs {
    fn is_empty(&self) -> bool {
        self.args.is_empty()
    }
}

impl Serialize for ExtraArgs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Arg<'a> {
            name: &'a str,
            value: &'a str,
        }
        match self.api {
            ApiVersion::V1Beta3 => {
                let sorted: BTreeMap<_, _> = self.args.iter().map(|(k, v)| (*k, v)).collect();
                let mut m = s.serialize_map(Some(sorted.len()))?;
                for (k, v) in sorted {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
            ApiVersion::V1Beta4 => {
                let mut seq = s.serialize_seq(Some(self.args.len()))?;
                for (name, value) in &self.args {
                    seq.serialize_element(&Arg { name, value })?;
                }
                seq.end()
            }
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeRegistration<'a> {
    name: &'a str,
    cri_socket: &'static str,
    #[serde(skip_serializing_if = "ExtraArgs::is_empty")]
    kubelet_extra_args: ExtraArgs,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiEndpoint {
    #[serde(skip_serializing_if = "Option::is_none")]
    advertise_address: Option<String>,
    bind_port: u16,
}

#[derive(Serialize)]
struct Patches {
    directory: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InitConfiguration<'a> {
    api_version: &'static str,
    kind: &'static str,
    node_registration: NodeRegistration<'a>,
    #[serde(rename = "localAPIEndpoint")]
    local_api_endpoint: ApiEndpoint,
    patches: Patches,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Networking<'a> {
    service_subnet: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HostPathMount {
    name: &'static str,
    host_path: String,
    mount_path: String,
    read_only: bool,
    path_type: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiServer<'a> {
    #[serde(rename = "certSANs")]
    cert_sans: Vec<&'a str>,
    extra_args: ExtraArgs,
    extra_volumes: Vec<HostPathMount>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ControlPlaneComponent {
    extra_args: ExtraArgs,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterConfiguration<'a> {
    api_version: &'static str,
    kind: &'static str,
    cluster_name: &'a str,
    kubernetes_version: KubernetesVersion,
    #[serde(skip_serializing_if = "str::is_empty")]
    control_plane_endpoint: &'a str,
    certificates_dir: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    networking: Option<Networking<'a>>,
    api_server: ApiServer<'a>,
    controller_manager: ControlPlaneComponent,
    scheduler: ControlPlaneComponent,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    feature_gates: BTreeMap<&'static str, bool>,
}

#[derive(Serialize)]
struct Taint {
    key: &'static str,
    value: &'static str,
    effect: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InitKubeletConfiguration {
    api_version: &'static str,
    kind: &'static str,
    protect_kernel_defaults: bool,
    tls_cipher_suites: [&'static str; 8],
    static_pod_path: String,
    register_with_taints: [Taint; 2],
    tls_cert_file: String,
    tls_private_key_file: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JoinKubeletConfiguration<'a> {
    api_version: &'static str,
    kind: &'static str,
    #[serde(rename = "providerID", skip_serializing_if = "str::is_empty")]
    provider_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BootstrapTokenDiscovery<'a> {
    api_server_endpoint: &'a str,
    token: &'a str,
    ca_cert_hashes: &'a [String],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Discovery<'a> {
    bootstrap_token: BootstrapTokenDiscovery<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JoinControlPlane {
    #[serde(rename = "localAPIEndpoint")]
    local_api_endpoint: ApiEndpoint,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JoinConfiguration<'a> {
    api_version: &'static str,
    kind: &'static str,
    node_registration: NodeRegistration<'a>,
    ca_cert_path: String,
    discovery: Discovery<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    control_plane: Option<JoinControlPlane>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    skip_phases: Vec<&'static str>,
    patches: Patches,
}

/// What the init configuration is made of.
#[derive(Debug, Clone)]
pub struct InitParams {
    /// The Kubernetes version (also chooses the API version).
    pub kubernetes_version: KubernetesVersion,
    /// The cluster name.
    pub cluster_name: String,
    /// The node name (made Kubernetes-compliant by [`k8s_node_name`]).
    pub node_name: String,
    /// The node's address in the cluster network.
    pub node_ip: IpAddr,
    /// The provider ID (may be empty).
    pub provider_id: String,
    /// The load balancer host in front of the API servers, without port (may be empty).
    pub control_plane_endpoint: String,
    /// The service CIDR (may be empty: kubeadm's default).
    pub service_cidr: String,
    /// Extra API server certificate SANs (empty entries are skipped).
    pub cert_sans: Vec<String>,
    /// The cloud-provider setting.
    pub cloud_provider: CloudProvider,
    /// Where files live on the node.
    pub paths: NodePaths,
}

impl InitParams {
    /// The configuration API version for this Kubernetes version.
    #[must_use]
    pub fn api_version(&self) -> ApiVersion {
        ApiVersion::for_kubernetes(&self.kubernetes_version)
    }
}

/// What the join configuration is made of.
#[derive(Debug)]
pub struct JoinParams {
    /// The configuration API version (of the installed kubeadm).
    pub api_version: ApiVersion,
    /// The node name (made Kubernetes-compliant by [`k8s_node_name`]).
    pub node_name: String,
    /// The node's address in the cluster network.
    pub node_ip: IpAddr,
    /// The provider ID (may be empty).
    pub provider_id: String,
    /// `host:port` of the API server (the load balancer).
    pub api_server_endpoint: String,
    /// The bootstrap token.
    pub token: BootstrapToken,
    /// Public-key pins of the cluster CA, `sha256:<hex>` (at least one).
    pub ca_cert_hashes: Vec<String>,
    /// Join as a control-plane node.
    pub control_plane: bool,
    /// The cloud-provider setting (the same as the cluster's init used).
    pub cloud_provider: CloudProvider,
    /// Where files live on the node.
    pub paths: NodePaths,
}

fn kubelet_args(
    api: ApiVersion,
    cloud: CloudProvider,
    node_ip: IpAddr,
    provider_id: &str,
) -> ExtraArgs {
    let mut args = Vec::new();
    if cloud == CloudProvider::External {
        args.push(("cloud-provider", "external".to_owned()));
    }
    args.push(("node-ip", node_ip.to_string()));
    if !provider_id.is_empty() {
        args.push(("provider-id", provider_id.to_owned()));
    }
    ExtraArgs { api, args }
}

fn to_yaml<T: Serialize>(doc: &T) -> Result<String, ConfigError> {
    serde_norway::to_string(doc).map_err(ConfigError::Yaml)
}

/// Renders the init file: InitConfiguration, ClusterConfiguration, KubeletConfiguration.
pub fn render_init(p: &InitParams) -> Result<String, ConfigError> {
    let node_name = k8s_node_name(&p.node_name)?;
    if p.cluster_name.is_empty() {
        return Err(ConfigError::ClusterName);
    }
    no_newline("the cluster name", &p.cluster_name)?;
    no_newline("the provider ID", &p.provider_id)?;
    no_newline("the control-plane endpoint", &p.control_plane_endpoint)?;
    no_newline("the service CIDR", &p.service_cidr)?;
    for san in &p.cert_sans {
        no_newline("a certificate SAN", san)?;
    }
    let api = p.api_version();
    let paths = &p.paths;
    let init = InitConfiguration {
        api_version: api.as_str(),
        kind: "InitConfiguration",
        node_registration: NodeRegistration {
            name: &node_name,
            cri_socket: CRI_SOCKET,
            kubelet_extra_args: kubelet_args(api, p.cloud_provider, p.node_ip, &p.provider_id),
        },
        local_api_endpoint: ApiEndpoint {
            advertise_address: None,
            bind_port: API_SERVER_PORT,
        },
        patches: Patches {
            directory: path_str(&paths.patches_dir),
        },
    };
    let node_ip = p.node_ip.to_string();
    let mut cert_sans = vec!["127.0.0.1", node_ip.as_str()];
    cert_sans.extend(
        p.cert_sans
            .iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty()),
    );
    let audit_policy = path_str(&paths.audit_policy());
    let mut controller_manager = vec![(
        "flex-volume-plugin-dir",
        "/opt/libexec/kubernetes/kubelet-plugins/volume/exec/".to_owned(),
    )];
    if p.cloud_provider == CloudProvider::External {
        controller_manager.push(("cloud-provider", "external".to_owned()));
    }
    controller_manager.extend([
        ("configure-cloud-routes", "false".to_owned()),
        ("profiling", "false".to_owned()),
        ("terminated-pod-gc-threshold", "1000".to_owned()),
    ]);
    let mut feature_gates = BTreeMap::new();
    if p.kubernetes_version >= KubernetesVersion::new(1, 31, 0) {
        feature_gates.insert("ControlPlaneKubeletLocalMode", true);
    }
    let cluster = ClusterConfiguration {
        api_version: api.as_str(),
        kind: "ClusterConfiguration",
        cluster_name: &p.cluster_name,
        kubernetes_version: p.kubernetes_version,
        control_plane_endpoint: &p.control_plane_endpoint,
        certificates_dir: path_str(&paths.pki_dir()),
        networking: (!p.service_cidr.is_empty()).then_some(Networking {
            service_subnet: &p.service_cidr,
        }),
        api_server: ApiServer {
            cert_sans,
            extra_args: ExtraArgs {
                api,
                args: vec![
                    ("audit-policy-file", audit_policy.clone()),
                    (
                        "audit-log-path",
                        "/var/log/kubernetes/audit/audit.log".into(),
                    ),
                    ("audit-log-maxage", "30".into()),
                    ("audit-log-maxbackup", "10".into()),
                    ("audit-log-maxsize", "100".into()),
                    ("profiling", "false".into()),
                    (
                        "kubelet-certificate-authority",
                        path_str(&paths.pki_dir().join("ca.crt")),
                    ),
                ],
            },
            extra_volumes: vec![
                HostPathMount {
                    name: "audit-log",
                    host_path: "/var/log/kubernetes/audit/".into(),
                    mount_path: "/var/log/kubernetes/audit/".into(),
                    read_only: false,
                    path_type: "DirectoryOrCreate",
                },
                HostPathMount {
                    name: "audit",
                    host_path: audit_policy.clone(),
                    mount_path: audit_policy,
                    read_only: true,
                    path_type: "File",
                },
            ],
        },
        controller_manager: ControlPlaneComponent {
            extra_args: ExtraArgs {
                api,
                args: controller_manager,
            },
        },
        scheduler: ControlPlaneComponent {
            extra_args: ExtraArgs {
                api,
                args: vec![("profiling", "false".into())],
            },
        },
        feature_gates,
    };
    let kubelet = InitKubeletConfiguration {
        api_version: KUBELET_CONFIG_API,
        kind: "KubeletConfiguration",
        protect_kernel_defaults: true,
        tls_cipher_suites: KUBELET_TLS_CIPHER_SUITES,
        static_pod_path: path_str(&paths.manifests_dir()),
        register_with_taints: [
            Taint {
                key: "node.cloudprovider.kubernetes.io/uninitialized",
                value: "true",
                effect: "PreferNoSchedule",
            },
            Taint {
                key: "node.cilium.io/agent-not-ready",
                value: "true",
                effect: "PreferNoSchedule",
            },
        ],
        tls_cert_file: path_str(&paths.kubelet_cert),
        tls_private_key_file: path_str(&paths.kubelet_key),
    };
    Ok(join_documents(&[
        to_yaml(&init)?,
        to_yaml(&cluster)?,
        to_yaml(&kubelet)?,
    ]))
}

/// Renders the join file: JoinConfiguration, KubeletConfiguration. The result holds the
/// bootstrap token (once, at `discovery.bootstrapToken.token`).
pub fn render_join(p: &JoinParams) -> Result<Zeroizing<String>, ConfigError> {
    let node_name = k8s_node_name(&p.node_name)?;
    check_endpoint(&p.api_server_endpoint)?;
    if p.ca_cert_hashes.is_empty() {
        return Err(ConfigError::CaCertHash(String::new()));
    }
    for h in &p.ca_cert_hashes {
        check_ca_hash(h)?;
    }
    no_newline("the provider ID", &p.provider_id)?;
    let api = p.api_version;
    let join = JoinConfiguration {
        api_version: api.as_str(),
        kind: "JoinConfiguration",
        node_registration: NodeRegistration {
            name: &node_name,
            cri_socket: CRI_SOCKET,
            kubelet_extra_args: kubelet_args(api, p.cloud_provider, p.node_ip, &p.provider_id),
        },
        ca_cert_path: path_str(&p.paths.pki_dir().join("ca.crt")),
        discovery: Discovery {
            bootstrap_token: BootstrapTokenDiscovery {
                api_server_endpoint: &p.api_server_endpoint,
                token: p.token.expose_secret(),
                ca_cert_hashes: &p.ca_cert_hashes,
            },
        },
        control_plane: p.control_plane.then(|| JoinControlPlane {
            local_api_endpoint: ApiEndpoint {
                advertise_address: Some(p.node_ip.to_string()),
                bind_port: API_SERVER_PORT,
            },
        }),
        skip_phases: if p.control_plane {
            vec![SKIP_DOWNLOAD_CERTS]
        } else {
            Vec::new()
        },
        patches: Patches {
            directory: path_str(&p.paths.patches_dir),
        },
    };
    let kubelet = JoinKubeletConfiguration {
        api_version: KUBELET_CONFIG_API,
        kind: "KubeletConfiguration",
        provider_id: &p.provider_id,
    };
    let join_yaml = Zeroizing::new(to_yaml(&join)?);
    Ok(Zeroizing::new(join_documents(&[
        join_yaml.as_str().to_owned(),
        to_yaml(&kubelet)?,
    ])))
}

/// Joins YAML documents with `---` lines.
fn join_documents(docs: &[String]) -> String {
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(d);
        if !d.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// A rendered configuration file in a private temporary directory (0700; the file 0600),
/// removed with its directory when dropped — also when kubeadm failed. kubeadm reads it by
/// path.
#[derive(Debug)]
pub struct PrivateConfigFile {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl PrivateConfigFile {
    /// Creates a private directory under `base` and writes `contents` to `<dir>/<name>`.
    pub fn write(base: &Path, name: &str, contents: &[u8]) -> Result<Self, ConfigError> {
        let io = PathError::at;
        fs::create_dir_all(base).map_err(io("cannot create directory", base))?;
        let dir = tempfile::Builder::new()
            .prefix("asterism-kubeadm-")
            .permissions(fs::Permissions::from_mode(0o700))
            .tempdir_in(base)
            .map_err(io("cannot create a private directory in", base))?;
        let path = dir.path().join(name);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io("cannot create", &path))?;
        // The mode of a new file is subject to the umask, which can only remove bits.
        file.write_all(contents)
            .and_then(|()| file.sync_all())
            .map_err(io("cannot write", &path))?;
        Ok(Self { dir, path })
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The private directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Removes the file and its directory now, reporting failure (dropping removes them
    /// too, silently).
    pub fn remove(self) -> Result<(), ConfigError> {
        let path = self.dir.path().to_path_buf();
        Ok(self
            .dir
            .close()
            .map_err(PathError::at("cannot remove", &path))?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn v1beta4_from_kubernetes_1_31() {
        let api =
            |s: &str| ApiVersion::for_kubernetes(&KubernetesVersion::parse_reported(s).unwrap());
        assert_eq!(api("v1.30.14"), ApiVersion::V1Beta3);
        assert_eq!(api("v1.31.0"), ApiVersion::V1Beta4);
        assert_eq!(api("v1.31.0-rc.0"), ApiVersion::V1Beta4);
        assert_eq!(api("v1.33.1"), ApiVersion::V1Beta4);
        assert_eq!(api("v2.0.0"), ApiVersion::V1Beta4);
    }

    #[test]
    fn node_names_are_made_compliant() {
        assert_eq!(k8s_node_name("Worker_1").unwrap(), "worker-1");
        assert_eq!(k8s_node_name("cp-0.example").unwrap(), "cp-0.example");
        assert!(k8s_node_name("-bad").is_err());
        assert!(k8s_node_name("").is_err());
    }

    #[test]
    fn endpoints_need_host_and_port() {
        assert!(check_endpoint("10.0.0.1:6443").is_ok());
        assert!(check_endpoint("lb.example:6443").is_ok());
        assert!(check_endpoint("[fd00::1]:6443").is_ok());
        assert!(check_endpoint("10.0.0.1").is_err());
        assert!(check_endpoint(":6443").is_err());
        assert!(check_endpoint("h:0").is_err());
    }
}
