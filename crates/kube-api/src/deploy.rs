//! What `asterism init` stands up in a new cluster after the first node is initialised:
//! `join-config`, the key service's Secret, and the key, join and verify services as
//! DaemonSets on the control-plane nodes with the RBAC each one uses (docs/kubernetes.md).
//!
//! The objects are typed (k8s-openapi), built by [`deployment`] from a [`DeploymentSpec`]
//! (values in, values out), rendered as YAML for the owner's workspace by
//! [`Manifest::to_yaml`], and applied by [`ClusterApi::apply_deployment`] (server-side
//! apply, field manager [`CLI_FIELD_MANAGER`]). [`ClusterApi::wait_for_daemon_set`] waits
//! for a DaemonSet's pods to be ready.
//!
//! The cluster has no CNI and no kube-proxy of Asterism's: every pod uses the host's
//! network. The join service listens on port [`JOIN_SERVICE_PORT`] of each control-plane
//! node (the port nodes reach it on) and talks to its own node's API server; the key
//! service listens only on a Unix socket in a host directory the join service mounts.
//!
//! The master secret and salt travel only in [`KeyServiceSecret`] (no Clone, redacted
//! Debug, zeroized): the manifest written to the workspace holds the Secret without its
//! data, and the request that creates it is sent without kube-rs seeing (or logging) the
//! answer, which echoes the data.

use super::error::{ApiError, Result};
use super::{ATTESTATION_CONFIG_KEY, WaitPolicy};
use super::{ClusterApi, JOIN_CONFIG, MEASUREMENT_SALT_KEY, MEASUREMENT_SALT_LEN, NAMESPACE};
use asterism_cluster::NodeDir;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    ExecAction, HTTPGetAction, HostPathVolumeSource, ObjectFieldSelector, PodSpec, PodTemplateSpec,
    Probe, Secret, SecretVolumeSource, SecurityContext, ServiceAccount, TCPSocketAction,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;
use zeroize::{Zeroize as _, Zeroizing};

/// The key service's DaemonSet and ServiceAccount.
pub const KEY_SERVICE: &str = "key-service";
/// The join service's DaemonSet, ServiceAccount and RBAC objects.
pub const JOIN_SERVICE: &str = "join-service";
/// The verify service's DaemonSet and ServiceAccount.
pub const VERIFY_SERVICE: &str = "verify-service";
/// The Secret the key service reads the master secret and salt from.
pub const KEY_SERVICE_SECRET: &str = "asterism-mastersecret";
/// Its key holding the raw master secret (the key service's `/var/config/mastersecret`).
pub const MASTER_SECRET_KEY: &str = "mastersecret";
/// Its key holding the raw salt (the key service's `/var/config/salt`).
pub const SALT_KEY: &str = "salt";
/// The ConfigMap of files the join service's attestation-key trust flags name.
pub const JOIN_SERVICE_TRUST: &str = "join-service-trust";
/// Where the join service sees [`JOIN_SERVICE_TRUST`]'s files.
pub const TRUST_DIR: &str = "/var/trust";
/// The port of every control-plane node that joining nodes reach the join service on.
pub const JOIN_SERVICE_PORT: u16 = 30090;
/// The port of every control-plane node that `asterism verify` reaches the verify service on.
pub const VERIFY_SERVICE_PORT: u16 = 30081;
/// The field manager of the CLI's server-side applies.
pub const CLI_FIELD_MANAGER: &str = "asterism-cli";
/// The label (and taint key) of control-plane nodes.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// Where the join service and the key service meet: a host directory on each control-plane
/// node, holding the key service's socket (0600, root).
const KEY_SERVICE_SOCKET_DIR: &str = "/run/asterism/key-service";
/// The directory, in the join service's container, of the join-config files.
const CONFIG_DIR: &str = "/var/config";
/// The node directory of a node in the cluster, where its bootstrapper keeps its files.
const HOST_NODE_DIR: &str = "/run";
const INIT_NODE_DIR: &str = "/var/run/asterism-init";
const ATTESTATION_DIR: &str = "/var/run/asterism-attestation";
/// kubeadm's certificate directory (the cluster CA and the control-plane files).
const PKI_DIR: &str = "/etc/kubernetes/pki";
/// The join service's loopback listener of `/healthz` (the readiness probe).
const JOIN_HEALTH_PORT: u16 = 9102;
/// The join service's operator socket (`asterism readmit` on the node).
const JOIN_ADMIN_DIR: &str = "/run/asterism/join-service";

/// The container images of the three services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// The key service's image.
    pub key_service: String,
    /// The join service's image.
    pub join_service: String,
    /// The verify service's image.
    pub verify_service: String,
}

impl Images {
    /// `<repository>/<service>:<tag>` for each service (`ghcr.io/org/join-service:v0.1.0`).
    pub fn from_repository(repository: &str, tag: &str) -> Self {
        let repository = repository.trim_end_matches('/');
        let image = |service: &str| format!("{repository}/{service}:{tag}");
        Self {
            key_service: image(KEY_SERVICE),
            join_service: image(JOIN_SERVICE),
            verify_service: image(VERIFY_SERVICE),
        }
    }
}

/// How the join service decides which nodes' attestation keys to trust: its flags, and the
/// files they name (each mounted as `TRUST_DIR/<name>` from [`JOIN_SERVICE_TRUST`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinServiceTrust {
    /// Flags of the join service (`--platform-ca=/var/trust/platform-ca.pem`, …).
    pub args: Vec<String>,
    /// File name → contents. Public material only (CA certificates, policies, collateral).
    pub files: BTreeMap<String, String>,
}

/// Everything the deployment is built from. No secret: the master secret and salt go
/// separately, in [`KeyServiceSecret`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentSpec {
    /// The images.
    pub images: Images,
    /// The expected measurements (JSON), as the CLI checked the first node against them:
    /// `join-config`'s `attestationConfig`, the join service's `--measurements`.
    pub attestation_config: String,
    /// The measurement salt: `join-config`'s `measurementSalt`.
    pub measurement_salt: [u8; MEASUREMENT_SALT_LEN],
    /// The join service's attestation-key trust.
    pub trust: JoinServiceTrust,
    /// The metadata service the join service asks which node an address is (its name and
    /// role): the join service's `--metadata-url`. Without it the manifest names none and
    /// the join service falls back to the local cluster's address, which is only right there.
    pub metadata_url: Option<String>,
}

/// The master secret and salt for the key service's Secret. Zeroized on drop, never
/// printed, not clonable.
pub struct KeyServiceSecret {
    master_secret: Zeroizing<Vec<u8>>,
    salt: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for KeyServiceSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyServiceSecret(<redacted>)")
    }
}

impl KeyServiceSecret {
    /// The shortest master secret the key service accepts.
    pub const MIN_MASTER_SECRET_LEN: usize = 16;
    /// The shortest salt the key service accepts.
    pub const MIN_SALT_LEN: usize = 32;

    /// Checks the lengths the key service checks at start, so that a Secret it would
    /// refuse is never created.
    pub fn new(master_secret: &[u8], salt: &[u8]) -> Result<Self> {
        if master_secret.len() < Self::MIN_MASTER_SECRET_LEN {
            return Err(ApiError::InvalidInput {
                what: "master secret",
                detail: format!(
                    "{} bytes, the key service needs at least {}",
                    master_secret.len(),
                    Self::MIN_MASTER_SECRET_LEN
                ),
            });
        }
        if salt.len() < Self::MIN_SALT_LEN {
            return Err(ApiError::InvalidInput {
                what: "salt",
                detail: format!(
                    "{} bytes, the key service needs at least {}",
                    salt.len(),
                    Self::MIN_SALT_LEN
                ),
            });
        }
        Ok(Self {
            master_secret: Zeroizing::new(master_secret.to_vec()),
            salt: Zeroizing::new(salt.to_vec()),
        })
    }
}

/// One object of the deployment.
#[derive(Debug, Clone, PartialEq)]
// A dozen objects, built once: boxing the DaemonSet would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Object {
    /// A ConfigMap.
    ConfigMap(ConfigMap),
    /// A Secret (in [`Deployment`], always without data).
    Secret(Secret),
    /// A ServiceAccount.
    ServiceAccount(ServiceAccount),
    /// A namespaced Role.
    Role(Role),
    /// A RoleBinding.
    RoleBinding(RoleBinding),
    /// A ClusterRole.
    ClusterRole(ClusterRole),
    /// A ClusterRoleBinding.
    ClusterRoleBinding(ClusterRoleBinding),
    /// A DaemonSet.
    DaemonSet(DaemonSet),
}

impl Object {
    /// The object's kind (`DaemonSet`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ConfigMap(_) => "ConfigMap",
            Self::Secret(_) => "Secret",
            Self::ServiceAccount(_) => "ServiceAccount",
            Self::Role(_) => "Role",
            Self::RoleBinding(_) => "RoleBinding",
            Self::ClusterRole(_) => "ClusterRole",
            Self::ClusterRoleBinding(_) => "ClusterRoleBinding",
            Self::DaemonSet(_) => "DaemonSet",
        }
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::ConfigMap(o) => &o.metadata,
            Self::Secret(o) => &o.metadata,
            Self::ServiceAccount(o) => &o.metadata,
            Self::Role(o) => &o.metadata,
            Self::RoleBinding(o) => &o.metadata,
            Self::ClusterRole(o) => &o.metadata,
            Self::ClusterRoleBinding(o) => &o.metadata,
            Self::DaemonSet(o) => &o.metadata,
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    /// The object's namespace; `None` for cluster-scoped objects.
    pub fn namespace(&self) -> Option<&str> {
        self.meta().namespace.as_deref()
    }

    /// The object's path on the API server (`/apis/apps/v1/namespaces/kube-system/daemonsets/
    /// join-service`): where an apply goes, and what `kubectl get --raw` reads.
    pub fn api_path(&self) -> String {
        let prefix = match self {
            Self::ConfigMap(_) | Self::Secret(_) | Self::ServiceAccount(_) => "/api/v1",
            Self::Role(_)
            | Self::RoleBinding(_)
            | Self::ClusterRole(_)
            | Self::ClusterRoleBinding(_) => "/apis/rbac.authorization.k8s.io/v1",
            Self::DaemonSet(_) => "/apis/apps/v1",
        };
        let plural = match self {
            Self::ConfigMap(_) => "configmaps",
            Self::Secret(_) => "secrets",
            Self::ServiceAccount(_) => "serviceaccounts",
            Self::Role(_) => "roles",
            Self::RoleBinding(_) => "rolebindings",
            Self::ClusterRole(_) => "clusterroles",
            Self::ClusterRoleBinding(_) => "clusterrolebindings",
            Self::DaemonSet(_) => "daemonsets",
        };
        match self.namespace() {
            Some(ns) => format!("{prefix}/namespaces/{ns}/{plural}/{}", self.name()),
            None => format!("{prefix}/{plural}/{}", self.name()),
        }
    }

    /// `Kind namespace/name` or `Kind name`, for messages.
    pub fn describe(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{} {ns}/{}", self.kind(), self.name()),
            None => format!("{} {}", self.kind(), self.name()),
        }
    }

    fn to_yaml(&self) -> Result<String> {
        let yaml = match self {
            Self::ConfigMap(o) => serde_norway::to_string(o),
            Self::Secret(o) => serde_norway::to_string(o),
            Self::ServiceAccount(o) => serde_norway::to_string(o),
            Self::Role(o) => serde_norway::to_string(o),
            Self::RoleBinding(o) => serde_norway::to_string(o),
            Self::ClusterRole(o) => serde_norway::to_string(o),
            Self::ClusterRoleBinding(o) => serde_norway::to_string(o),
            Self::DaemonSet(o) => serde_norway::to_string(o),
        };
        yaml.map_err(|e| ApiError::InvalidInput {
            what: "manifest",
            detail: format!("{}: {e}", self.describe()),
        })
    }
}

/// One file of the workspace's `manifests/` directory and the objects in it, in apply
/// order.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The file name (`join-service.yaml`).
    pub file: &'static str,
    /// Its objects.
    pub objects: Vec<Object>,
}

impl Manifest {
    /// The objects as YAML documents separated by `---`, after a comment saying where the
    /// file comes from.
    pub fn to_yaml(&self) -> Result<String> {
        let mut out = String::from(
            "# Written by `asterism init`; re-apply with `kubectl apply --server-side -f`.\n",
        );
        for object in &self.objects {
            out.push_str("---\n");
            out.push_str(&object.to_yaml()?);
        }
        Ok(out)
    }
}

/// The whole post-init deployment, in apply order.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    /// The manifests, one per file.
    pub manifests: Vec<Manifest>,
}

impl Deployment {
    /// Every object, in apply order.
    pub fn objects(&self) -> impl Iterator<Item = &Object> {
        self.manifests.iter().flat_map(|m| m.objects.iter())
    }
}

fn meta(name: &str, namespace: Option<&str>, app: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(app_labels(app)),
        ..ObjectMeta::default()
    }
}

fn app_labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), app.to_owned()),
        (
            "app.kubernetes.io/part-of".to_owned(),
            "asterism".to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            CLI_FIELD_MANAGER.to_owned(),
        ),
    ])
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// `kube-system/join-config` as [`ClusterApi::apply_join_config`] creates it: what the join
/// service reads as `/var/config/attestationConfig` and `/var/config/measurementSalt`.
pub fn join_config(spec: &DeploymentSpec) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(JOIN_CONFIG.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            ATTESTATION_CONFIG_KEY.to_owned(),
            spec.attestation_config.clone(),
        )])),
        binary_data: Some(BTreeMap::from([(
            MEASUREMENT_SALT_KEY.to_owned(),
            ByteString(spec.measurement_salt.to_vec()),
        )])),
        ..ConfigMap::default()
    }
}

/// The key service's Secret, immutable, of type Opaque; with `secret`'s data, or without
/// any (what the workspace keeps: its `master-secret.json` holds the values).
fn key_service_secret(secret: Option<&KeyServiceSecret>) -> Secret {
    let mut metadata = meta(KEY_SERVICE_SECRET, Some(NAMESPACE), KEY_SERVICE);
    let data = match secret {
        Some(s) => Some(BTreeMap::from([
            (
                MASTER_SECRET_KEY.to_owned(),
                ByteString(s.master_secret.to_vec()),
            ),
            (SALT_KEY.to_owned(), ByteString(s.salt.to_vec())),
        ])),
        None => {
            metadata.annotations = Some(BTreeMap::from([(
                "asterism.dev/data".to_owned(),
                "left out of the workspace: `mastersecret` and `salt` are the raw bytes of master-secret.json's key and salt".to_owned(),
            )]));
            None
        }
    };
    Secret {
        metadata,
        immutable: Some(true),
        type_: Some("Opaque".to_owned()),
        data,
        ..Secret::default()
    }
}

fn wipe_secret(secret: &mut Secret) {
    for value in secret.data.iter_mut().flat_map(|d| d.values_mut()) {
        value.0.zeroize();
    }
}

fn service_account(name: &str, automount: bool) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(name, Some(NAMESPACE), name),
        automount_service_account_token: Some(automount),
        ..ServiceAccount::default()
    }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

fn join_service_subject() -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: JOIN_SERVICE.to_owned(),
        namespace: Some(NAMESPACE.to_owned()),
        ..Subject::default()
    }]
}

/// The join service's RBAC: exactly the calls of its Kubernetes cluster state
/// (docs/kubernetes-api.md). No `delete` anywhere, no `update` on Secrets.
fn join_service_rbac() -> Vec<Object> {
    let role_ref = |kind: &str| RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: kind.to_owned(),
        name: JOIN_SERVICE.to_owned(),
    };
    vec![
        Object::Role(Role {
            metadata: meta(JOIN_SERVICE, Some(NAMESPACE), JOIN_SERVICE),
            rules: Some(vec![
                // Bootstrap tokens: list the join service's token Secrets, create new ones.
                rule("", &["secrets"], &["list", "create"]),
                // Disk bindings (get, create), members (get, list, create, update), the
                // components ConfigMap (get).
                rule("", &["configmaps"], &["get", "list", "create", "update"]),
            ]),
        }),
        Object::RoleBinding(RoleBinding {
            metadata: meta(JOIN_SERVICE, Some(NAMESPACE), JOIN_SERVICE),
            role_ref: role_ref("Role"),
            subjects: Some(join_service_subject()),
        }),
        Object::ClusterRole(ClusterRole {
            metadata: meta(JOIN_SERVICE, None, JOIN_SERVICE),
            rules: Some(vec![
                // Waiting for the API server at start.
                rule("", &["namespaces"], &["list"]),
                // Which components joining nodes install.
                rule("update.edgeless.systems", &["nodeversions"], &["get"]),
                // JoiningNode records: create (control plane), get (who holds the
                // control-plane record), patch (server-side apply, workers).
                rule(
                    "update.edgeless.systems",
                    &["joiningnodes"],
                    &["get", "create", "patch"],
                ),
            ]),
            ..ClusterRole::default()
        }),
        Object::ClusterRoleBinding(ClusterRoleBinding {
            metadata: meta(JOIN_SERVICE, None, JOIN_SERVICE),
            role_ref: role_ref("ClusterRole"),
            subjects: Some(join_service_subject()),
        }),
    ]
}

/// The directory of the init node's record on the host (`/run/state/asterism`).
fn init_node_host_dir() -> String {
    NodeDir::new(HOST_NODE_DIR)
        .asterism()
        .to_string_lossy()
        .into_owned()
}

/// The directory of the node's AK certificate on the host (`/run/attestation`).
fn attestation_host_dir() -> String {
    NodeDir::new(HOST_NODE_DIR)
        .attestation()
        .to_string_lossy()
        .into_owned()
}

fn host_dir(name: &str, path: &str, kind: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: Some(kind.to_owned()),
        }),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

fn config_map_volume(name: &str, config_map: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.to_owned(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A container that runs as root (to read root-only host files) with no capabilities, no
/// privilege escalation and a read-only root file system.
fn locked_down() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_user: Some(0),
        capabilities: Some(Capabilities {
            drop: Some(strings(&["ALL"])),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// A command that runs `program` with the container's arguments, adding `flag=file` only
/// when `file` exists: the init node's record exists on the first node only, the AK
/// certificate only where the platform provides one.
fn with_optional_file(program: &str, flag: &str, file: &str) -> Vec<String> {
    vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!("if [ -f {file} ]; then set -- \"$@\" {flag}={file}; fi; exec {program} \"$@\""),
        program.to_owned(),
    ]
}

/// A DaemonSet on the control-plane nodes, on the host's network.
fn daemon_set(
    name: &str,
    service_account: &str,
    container: Container,
    volumes: Vec<Volume>,
) -> DaemonSet {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_owned(), name.to_owned())]);
    DaemonSet {
        metadata: meta(name, Some(NAMESPACE), name),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(app_labels(name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(service_account.to_owned()),
                    node_selector: Some(BTreeMap::from([(
                        CONTROL_PLANE_LABEL.to_owned(),
                        String::new(),
                    )])),
                    tolerations: Some(vec![Toleration {
                        key: Some(CONTROL_PLANE_LABEL.to_owned()),
                        operator: Some("Exists".to_owned()),
                        ..Toleration::default()
                    }]),
                    // No CNI or kube-proxy of ours: the host's network is the one there is.
                    host_network: Some(true),
                    dns_policy: Some("ClusterFirstWithHostNet".to_owned()),
                    enable_service_links: Some(false),
                    priority_class_name: Some("system-cluster-critical".to_owned()),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        ..DaemonSet::default()
    }
}

fn key_service(images: &Images) -> Vec<Object> {
    let socket = format!("{KEY_SERVICE_SOCKET_DIR}/kms.sock");
    let container = Container {
        name: KEY_SERVICE.to_owned(),
        image: Some(images.key_service.clone()),
        args: Some(vec![
            format!("--listen=unix:{socket}"),
            format!("--master-secret-file={CONFIG_DIR}/{MASTER_SECRET_KEY}"),
            format!("--salt-file={CONFIG_DIR}/{SALT_KEY}"),
        ]),
        volume_mounts: Some(vec![
            mount("secrets", CONFIG_DIR, true),
            mount("socket", KEY_SERVICE_SOCKET_DIR, false),
        ]),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["test".to_owned(), "-S".to_owned(), socket]),
            }),
            period_seconds: Some(5),
            ..Probe::default()
        }),
        security_context: Some(locked_down()),
        ..Container::default()
    };
    let volumes = vec![
        Volume {
            name: "secrets".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(KEY_SERVICE_SECRET.to_owned()),
                // The key service refuses a secret file that group or others may read.
                default_mode: Some(0o400),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        host_dir("socket", KEY_SERVICE_SOCKET_DIR, "DirectoryOrCreate"),
    ];
    vec![
        Object::ServiceAccount(service_account(KEY_SERVICE, false)),
        Object::DaemonSet(daemon_set(KEY_SERVICE, KEY_SERVICE, container, volumes)),
    ]
}

fn join_service(spec: &DeploymentSpec) -> Vec<Object> {
    let init_node = format!("{INIT_NODE_DIR}/init-node.json");
    let mut args = vec![
        format!("--listen=0.0.0.0:{JOIN_SERVICE_PORT}"),
        "--api-server-host=$(HOST_IP)".to_owned(),
        format!("--metrics-listen=127.0.0.1:{JOIN_HEALTH_PORT}"),
        format!("--admin-socket={JOIN_ADMIN_DIR}/admin.sock"),
        format!("--key-service=unix:{KEY_SERVICE_SOCKET_DIR}/kms.sock"),
        format!("--pki-dir={PKI_DIR}"),
        format!("--measurements={CONFIG_DIR}/{ATTESTATION_CONFIG_KEY}"),
        format!("--measurement-salt-file={CONFIG_DIR}/{MEASUREMENT_SALT_KEY}"),
        "--cluster-state=kubernetes".to_owned(),
        // The JoiningNode and NodeVersion CRDs belong to a node operator Asterism does not
        // deploy yet.
        "--joining-nodes=when-installed".to_owned(),
        // Joining nodes verify the join service (mutual aTLS) by default: it attests with
        // this node's TPM and the AK certificate the bootstrapper found.
        "--tpm=device:/dev/tpmrm0".to_owned(),
        format!("--ak-cert={ATTESTATION_DIR}/ak-cert.der"),
    ];
    if let Some(url) = &spec.metadata_url {
        args.push(format!("--metadata-url={url}"));
    }
    args.extend(spec.trust.args.iter().cloned());
    let env = vec![
        EnvVar {
            name: "HOST_IP".to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.hostIP".to_owned(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        // This node's API server, not the `kubernetes` Service: no kube-proxy routes it.
        EnvVar {
            name: "KUBERNETES_SERVICE_HOST".to_owned(),
            value: Some("127.0.0.1".to_owned()),
            ..EnvVar::default()
        },
        EnvVar {
            name: "KUBERNETES_SERVICE_PORT".to_owned(),
            value: Some("6443".to_owned()),
            ..EnvVar::default()
        },
    ];
    let container = Container {
        name: JOIN_SERVICE.to_owned(),
        image: Some(spec.images.join_service.clone()),
        command: Some(with_optional_file(
            "asterism-join-service",
            "--init-node",
            &init_node,
        )),
        args: Some(args),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("join".to_owned()),
            container_port: i32::from(JOIN_SERVICE_PORT),
            host_port: Some(i32::from(JOIN_SERVICE_PORT)),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        volume_mounts: Some(vec![
            mount("join-config", CONFIG_DIR, true),
            mount("trust", TRUST_DIR, true),
            mount("pki", PKI_DIR, true),
            mount("key-service", KEY_SERVICE_SOCKET_DIR, false),
            mount("init-node", INIT_NODE_DIR, true),
            mount("admin", JOIN_ADMIN_DIR, false),
            mount("attestation", ATTESTATION_DIR, true),
        ]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                host: Some("127.0.0.1".to_owned()),
                path: Some("/healthz".to_owned()),
                port: IntOrString::Int(i32::from(JOIN_HEALTH_PORT)),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(5),
            ..Probe::default()
        }),
        // The node's TPM device (/dev/tpmrm0): a container reaches a host device only when
        // privileged (as the verify service), since no device plugin is deployed.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            read_only_root_filesystem: Some(true),
            run_as_user: Some(0),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let volumes = vec![
        config_map_volume("join-config", JOIN_CONFIG),
        config_map_volume("trust", JOIN_SERVICE_TRUST),
        host_dir("pki", PKI_DIR, "Directory"),
        host_dir("key-service", KEY_SERVICE_SOCKET_DIR, "DirectoryOrCreate"),
        host_dir("init-node", &init_node_host_dir(), "DirectoryOrCreate"),
        host_dir("admin", JOIN_ADMIN_DIR, "DirectoryOrCreate"),
        host_dir("attestation", &attestation_host_dir(), "Directory"),
    ];
    let mut objects = vec![
        Object::ConfigMap(ConfigMap {
            metadata: meta(JOIN_SERVICE_TRUST, Some(NAMESPACE), JOIN_SERVICE),
            data: Some(spec.trust.files.clone()),
            ..ConfigMap::default()
        }),
        Object::ServiceAccount(service_account(JOIN_SERVICE, true)),
    ];
    objects.extend(join_service_rbac());
    objects.push(Object::DaemonSet(daemon_set(
        JOIN_SERVICE,
        JOIN_SERVICE,
        container,
        volumes,
    )));
    objects
}

fn verify_service(images: &Images) -> Vec<Object> {
    let ak_cert = format!("{ATTESTATION_DIR}/ak-cert.der");
    let container = Container {
        name: VERIFY_SERVICE.to_owned(),
        image: Some(images.verify_service.clone()),
        command: Some(with_optional_file(
            "asterism-verify-service",
            "--ak-cert",
            &ak_cert,
        )),
        args: Some(vec![
            format!("--listen=0.0.0.0:{VERIFY_SERVICE_PORT}"),
            "--tpm=device:/dev/tpmrm0".to_owned(),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("verify".to_owned()),
            container_port: i32::from(VERIFY_SERVICE_PORT),
            host_port: Some(i32::from(VERIFY_SERVICE_PORT)),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        volume_mounts: Some(vec![mount("attestation", ATTESTATION_DIR, true)]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(VERIFY_SERVICE_PORT)),
                ..TCPSocketAction::default()
            }),
            period_seconds: Some(5),
            ..Probe::default()
        }),
        // Privileged for the node's TPM device (/dev/tpmrm0): no device plugin is deployed.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            read_only_root_filesystem: Some(true),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let volumes = vec![host_dir(
        "attestation",
        &attestation_host_dir(),
        "DirectoryOrCreate",
    )];
    vec![
        Object::ServiceAccount(service_account(VERIFY_SERVICE, false)),
        Object::DaemonSet(daemon_set(
            VERIFY_SERVICE,
            VERIFY_SERVICE,
            container,
            volumes,
        )),
    ]
}

/// The deployment of `spec`, in apply order: `join-config`, the key service's Secret
/// (without data), the key service, the join service, the verify service.
pub fn deployment(spec: &DeploymentSpec) -> Result<Deployment> {
    serde_json::from_str::<serde_json::Value>(&spec.attestation_config).map_err(|e| {
        ApiError::InvalidInput {
            what: "attestation configuration",
            detail: format!("not JSON: {e}"),
        }
    })?;
    Ok(Deployment {
        manifests: vec![
            Manifest {
                file: "join-config.yaml",
                objects: vec![Object::ConfigMap(join_config(spec))],
            },
            Manifest {
                file: "key-service-secret.yaml",
                objects: vec![Object::Secret(key_service_secret(None))],
            },
            Manifest {
                file: "key-service.yaml",
                objects: key_service(&spec.images),
            },
            Manifest {
                file: "join-service.yaml",
                objects: join_service(spec),
            },
            Manifest {
                file: "verify-service.yaml",
                objects: verify_service(&spec.images),
            },
        ],
    })
}

/// What [`ClusterApi::wait_for_daemon_set`] last saw of a DaemonSet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RolloutStatus {
    /// Nodes that should run a pod.
    pub desired: i32,
    /// Nodes whose pod is of the current template.
    pub updated: i32,
    /// Nodes whose pod is ready.
    pub ready: i32,
    /// Whether the controller has seen the current template.
    pub observed: bool,
}

impl RolloutStatus {
    fn of(ds: &DaemonSet) -> Self {
        let generation = ds.metadata.generation.unwrap_or(0);
        match &ds.status {
            Some(s) => Self {
                desired: s.desired_number_scheduled,
                updated: s.updated_number_scheduled.unwrap_or(0),
                ready: s.number_ready,
                observed: s.observed_generation.unwrap_or(0) >= generation,
            },
            None => Self::default(),
        }
    }

    /// At least one pod, and every node's pod of the current template and ready.
    pub fn is_ready(&self) -> bool {
        self.observed
            && self.desired > 0
            && self.updated >= self.desired
            && self.ready >= self.desired
    }
}

impl std::fmt::Display for RolloutStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} pods ready, {} up to date",
            self.ready, self.desired, self.updated
        )
    }
}

impl ClusterApi {
    /// Applies `deployment` with `secret`'s values: `join-config` through
    /// [`ClusterApi::apply_join_config`] (a different stored salt is refused), the key
    /// service's Secret with its data, then every other object by server-side apply
    /// (field manager [`CLI_FIELD_MANAGER`], forced). Returns what was applied, in order.
    pub async fn apply_deployment(
        &self,
        spec: &DeploymentSpec,
        deployment: &Deployment,
        secret: &KeyServiceSecret,
    ) -> Result<Vec<String>> {
        let mut applied = Vec::new();
        for object in deployment.objects() {
            match object {
                Object::ConfigMap(cm) if cm.metadata.name.as_deref() == Some(JOIN_CONFIG) => {
                    self.apply_join_config(&spec.attestation_config, &spec.measurement_salt)
                        .await?;
                }
                Object::Secret(s) if s.metadata.name.as_deref() == Some(KEY_SERVICE_SECRET) => {
                    self.apply_key_service_secret(secret).await?;
                }
                Object::Secret(_) => {
                    return Err(ApiError::InvalidInput {
                        what: "deployment",
                        detail: format!("{} is not one this module writes", object.describe()),
                    });
                }
                Object::ConfigMap(o) => self.apply(o).await?,
                Object::ServiceAccount(o) => self.apply(o).await?,
                Object::Role(o) => self.apply(o).await?,
                Object::RoleBinding(o) => self.apply(o).await?,
                Object::ClusterRole(o) => self.apply_cluster(o).await?,
                Object::ClusterRoleBinding(o) => self.apply_cluster(o).await?,
                Object::DaemonSet(o) => self.apply(o).await?,
            }
            tracing::info!(object = %object.describe(), "applied");
            applied.push(object.describe());
        }
        Ok(applied)
    }

    /// Server-side applies the namespaced `object` in [`NAMESPACE`].
    async fn apply<K>(&self, object: &K) -> Result<()>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + serde::Serialize
            + serde::de::DeserializeOwned
            + Clone
            + std::fmt::Debug,
    {
        self.apply_with(Api::namespaced(self.client.clone(), NAMESPACE), object)
            .await
    }

    /// Server-side applies the cluster-scoped `object`.
    async fn apply_cluster<K>(&self, object: &K) -> Result<()>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + serde::Serialize
            + serde::de::DeserializeOwned
            + Clone
            + std::fmt::Debug,
    {
        self.apply_with(Api::all(self.client.clone()), object).await
    }

    async fn apply_with<K>(&self, api: Api<K>, object: &K) -> Result<()>
    where
        K: kube::Resource<DynamicType = ()>
            + serde::Serialize
            + serde::de::DeserializeOwned
            + Clone
            + std::fmt::Debug,
    {
        let name = object.meta().name.clone().unwrap_or_default();
        let op = format!("apply {} {name}", K::kind(&()));
        api.patch(
            &name,
            &PatchParams::apply(CLI_FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .map_err(|e| ApiError::from_kube(op, e))?;
        Ok(())
    }

    /// Creates (server-side apply) the key service's immutable Secret with `secret`'s
    /// values. The object is wiped once encoded and the answer (which echoes the values)
    /// once received; the answer is never handed to kube-rs' parsing, which logs a body it
    /// cannot parse.
    pub async fn apply_key_service_secret(&self, secret: &KeyServiceSecret) -> Result<()> {
        let op = format!("apply Secret {NAMESPACE}/{KEY_SERVICE_SECRET}");
        let mut object = key_service_secret(Some(secret));
        let request = kube::core::Request::new(format!("/api/v1/namespaces/{NAMESPACE}/secrets"))
            .patch(
                KEY_SERVICE_SECRET,
                &PatchParams::apply(CLI_FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            );
        wipe_secret(&mut object);
        let request = request.map_err(|e| ApiError::InvalidInput {
            what: "Secret request",
            detail: e.to_string(),
        })?;
        match self.client.request_text(request).await {
            Ok(text) => {
                drop(Zeroizing::new(text));
                tracing::info!(
                    secret = %format!("{NAMESPACE}/{KEY_SERVICE_SECRET}"),
                    "applied the key service's Secret"
                );
                Ok(())
            }
            Err(e) => Err(ApiError::from_kube(op, e)),
        }
    }

    /// Waits until DaemonSet `kube-system/<name>` has a ready pod of its current template on
    /// every node it should run on, reading it every `policy.interval` until
    /// `policy.deadline`; `progress` is called with each status that differs from the one
    /// before. Read errors are retried until the deadline.
    pub async fn wait_for_daemon_set(
        &self,
        name: &str,
        policy: WaitPolicy,
        progress: &mut (dyn FnMut(&RolloutStatus) + Send),
    ) -> Result<RolloutStatus> {
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let started = Instant::now();
        let mut last: Option<RolloutStatus> = None;
        let mut last_error: Option<String> = None;
        loop {
            let remaining = policy.deadline.saturating_sub(started.elapsed());
            match tokio::time::timeout(remaining, api.get(name)).await {
                Ok(Ok(ds)) => {
                    let status = RolloutStatus::of(&ds);
                    if last != Some(status) {
                        progress(&status);
                        last = Some(status);
                    }
                    if status.is_ready() {
                        return Ok(status);
                    }
                }
                Ok(Err(e)) => {
                    let e = ApiError::from_kube(format!("get DaemonSet {NAMESPACE}/{name}"), e);
                    tracing::debug!(error = %e, "reading the DaemonSet failed; retrying");
                    last_error = Some(e.to_string());
                }
                Err(_) => {}
            }
            let waited = started.elapsed();
            if waited.saturating_add(policy.interval) >= policy.deadline {
                return Err(ApiError::DaemonSetNotReady {
                    name: name.to_owned(),
                    waited: round(waited),
                    status: last
                        .map(|s| s.to_string())
                        .or(last_error)
                        .unwrap_or_else(|| "never read".to_owned()),
                });
            }
            tokio::time::sleep(policy.interval).await;
        }
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_services_mount_the_node_directory_where_the_bootstrapper_keeps_it() {
        assert_eq!(init_node_host_dir(), "/run/state/asterism");
        assert_eq!(attestation_host_dir(), "/run/attestation");
    }

    #[test]
    fn key_service_secret_refuses_what_the_key_service_would() {
        let err = KeyServiceSecret::new(&[1; 15], &[2; 32]).unwrap_err();
        assert!(
            matches!(
                err,
                ApiError::InvalidInput {
                    what: "master secret",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = KeyServiceSecret::new(&[1; 32], &[2; 31]).unwrap_err();
        assert!(
            matches!(err, ApiError::InvalidInput { what: "salt", .. }),
            "{err:?}"
        );
        let ok = KeyServiceSecret::new(&[1; 32], &[2; 32]).unwrap();
        assert_eq!(format!("{ok:?}"), "KeyServiceSecret(<redacted>)");
    }

    #[test]
    fn a_daemon_set_is_ready_when_every_pod_is_current_and_ready() {
        let s = |desired, updated, ready, observed| RolloutStatus {
            desired,
            updated,
            ready,
            observed,
        };
        assert!(s(1, 1, 1, true).is_ready());
        assert!(s(3, 3, 3, true).is_ready());
        assert!(!s(0, 0, 0, true).is_ready(), "no control-plane node yet");
        assert!(!s(3, 3, 2, true).is_ready());
        assert!(!s(3, 2, 3, true).is_ready(), "an old pod is still ready");
        assert!(
            !s(1, 1, 1, false).is_ready(),
            "the template was not seen yet"
        );
    }
}
