//! The edge of `join.API`: each request decoded into a domain request in one place (a
//! malformed field is `INVALID_ARGUMENT`, [`JoinError::Invalid`]), and each domain ticket
//! encoded into its response in one place. The core in `service.rs` works on these types
//! only.

use crate::error::JoinError;
use crate::release::ClusterRelease;
use asterism_cluster::{BootstrapToken, ControlPlaneFile, Role};
use asterism_kms::{DataKey, DiskUuid};
use asterism_pki::{KubeletCsr, parse_wire_public_key};
use asterism_proto::join::{
    ControlPlaneCertOrKey, IssueJoinTicketRequest, IssueJoinTicketResponse,
    IssueRejoinTicketRequest, IssueRejoinTicketResponse,
};
use std::net::SocketAddr;

/// The SSH host key of a joining node.
pub(crate) type HostKey = ssh_key::PublicKey;

/// A decoded `IssueJoinTicket` request: every field well-formed, nothing yet authorized.
pub(crate) struct JoinRequest {
    /// The node's state disk.
    pub disk: DiskUuid,
    /// The kubelet's certificate request.
    pub csr: KubeletCsr,
    /// The node's SSH host key.
    pub host_key: HostKey,
    /// The principals the SSH host certificate is to name, of a well-formed list; `None`
    /// when the request names none (the core then uses the peer's address).
    pub principals: Option<Vec<String>>,
    /// The role the node asks to join as.
    pub role: Role,
}

fn invalid(field: &'static str, e: impl std::fmt::Display) -> JoinError {
    JoinError::Invalid {
        field,
        detail: e.to_string(),
    }
}

impl TryFrom<IssueJoinTicketRequest> for JoinRequest {
    type Error = JoinError;

    fn try_from(req: IssueJoinTicketRequest) -> Result<Self, JoinError> {
        let disk = DiskUuid::parse(&req.disk_uuid).map_err(|e| invalid("disk_uuid", e))?;
        let csr = KubeletCsr::parse(&req.certificate_request)
            .map_err(|e| invalid("certificate_request", e))?;
        let host_key = parse_wire_public_key(&req.host_public_key)
            .map_err(|e| invalid("host_public_key", e))?;
        // The principal list's shape (count, length, characters) is the CA's to check, and
        // a malformed list is the caller's mistake whoever the caller is.
        let principals = if req.host_certificate_principals.is_empty() {
            None
        } else {
            asterism_pki::check_principals(&req.host_certificate_principals)
                .map_err(|e| invalid("host_certificate_principals", e))?;
            Some(req.host_certificate_principals)
        };
        Ok(Self {
            disk,
            csr,
            host_key,
            principals,
            role: Role::from_control_plane_flag(req.is_control_plane),
        })
    }
}

/// A decoded `IssueRejoinTicket` request.
pub(crate) struct RejoinRequest {
    /// The node's state disk.
    pub disk: DiskUuid,
}

impl TryFrom<IssueRejoinTicketRequest> for RejoinRequest {
    type Error = JoinError;

    fn try_from(req: IssueRejoinTicketRequest) -> Result<Self, JoinError> {
        let disk = DiskUuid::parse(&req.disk_uuid).map_err(|e| invalid("disk_uuid", e))?;
        Ok(Self { disk })
    }
}

/// What a join ticket carries.
pub(crate) struct JoinTicket<'a> {
    /// The node's state-disk key.
    pub disk_key: DataKey,
    /// The cluster's measurement salt.
    pub measurement_salt: &'a [u8],
    /// The cluster's measurement secret.
    pub measurement_secret: &'a DataKey,
    /// The kubelet certificate, then the cluster CA (PEM): a worker receives no `ca.crt`,
    /// and checks the leaf against the CA the discovery hash names before it uses the
    /// ticket.
    pub kubelet_cert_chain: String,
    /// The API server the node joins through (this service decides it; the node uses it
    /// as given).
    pub api_server_endpoint: SocketAddr,
    /// The bootstrap token.
    pub token: BootstrapToken,
    /// `sha256:<hex>` of the cluster CA's public key.
    pub discovery_hash: &'a str,
    /// The control-plane files (none for a worker).
    pub control_plane_files: Vec<ControlPlaneFile>,
    /// The cluster SSH CA's `authorized_keys` line.
    pub ssh_ca_line: &'a [u8],
    /// The node's SSH host certificate (`authorized_keys` format).
    pub host_certificate: String,
    /// The cluster's Kubernetes version and components, the same in every ticket (`None`:
    /// the cluster state records none, and the ticket carries none).
    pub kubernetes: Option<&'a ClusterRelease>,
}

impl From<JoinTicket<'_>> for IssueJoinTicketResponse {
    fn from(t: JoinTicket<'_>) -> Self {
        // The response leaves our control here: tonic encodes and frees it unwiped. The
        // keys themselves are wiped when `t` drops.
        Self {
            state_disk_key: t.disk_key.expose_secret().to_vec(),
            measurement_salt: t.measurement_salt.to_vec(),
            measurement_secret: t.measurement_secret.expose_secret().to_vec(),
            kubelet_cert: t.kubelet_cert_chain.into_bytes(),
            api_server_endpoint: t.api_server_endpoint.to_string(),
            token: t.token.expose_secret().to_owned(),
            discovery_token_ca_cert_hash: t.discovery_hash.to_owned(),
            control_plane_files: t
                .control_plane_files
                .into_iter()
                .map(|f| ControlPlaneCertOrKey {
                    name: f.name,
                    data: f.data.to_vec(),
                })
                .collect(),
            authorized_ca_public_key: t.ssh_ca_line.to_vec(),
            host_certificate: t.host_certificate.into_bytes(),
            kubernetes_version: t
                .kubernetes
                .map(|k| k.version().to_string())
                .unwrap_or_default(),
            kubernetes_components: t
                .kubernetes
                .map(|k| k.components().iter().cloned().map(Into::into).collect())
                .unwrap_or_default(),
            // Signed after encoding (`JoinService::sign`).
            control_plane_signature: Vec::new(),
        }
    }
}

/// What a rejoin ticket carries.
pub(crate) struct RejoinTicket<'a> {
    /// The node's state-disk key.
    pub disk_key: DataKey,
    /// The cluster's measurement secret.
    pub measurement_secret: &'a DataKey,
}

impl From<RejoinTicket<'_>> for IssueRejoinTicketResponse {
    fn from(t: RejoinTicket<'_>) -> Self {
        Self {
            state_disk_key: t.disk_key.expose_secret().to_vec(),
            measurement_secret: t.measurement_secret.expose_secret().to_vec(),
            control_plane_signature: Vec::new(),
        }
    }
}
