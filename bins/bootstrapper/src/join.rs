//! The JoinClient (REFERENCE §4) and the rejoin client (REFERENCE §10.10): both find
//! control-plane endpoints through the metadata and dial a join service over aTLS from the
//! node's own address, attesting with the node's TPM (and, in mutual mode, verifying the
//! join service).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use asterism_disk::Unlocked;
use asterism_kms::{ClusterId, DataKey, DiskUuid, MEASUREMENT_SALT_LEN, derive_cluster_id};
use asterism_metadata::{Metadata, Role as MetadataRole};
use asterism_proto::join::api_client::ApiClient;
use asterism_proto::join::{
    IssueJoinTicketRequest, IssueJoinTicketResponse, IssueRejoinTicketRequest,
};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use zeroize::Zeroizing;

use crate::dial::Dialer;
use crate::effects::{ClusterJoin, Components};
use crate::lock::Holder;
use crate::node::{Identity, Node, StepError, blocking, chain, safe_relative_name};
use crate::node_state::{NodeState, Role};
use crate::{files, ticket};

/// The API server port (REFERENCE §1.1).
const KUBERNETES_PORT: u16 = 6443;
/// The most control-plane files a ticket may carry.
const MAX_CONTROL_PLANE_FILES: usize = 64;

/// How the JoinClient ended.
#[derive(Debug)]
pub(crate) enum JoinEnd {
    /// The node joined the cluster.
    Joined(ClusterId),
    /// The node lock was taken by the InitServer: nothing to do.
    LostRace,
    /// Stopped before it got a ticket.
    Stopped,
}

/// A checked join ticket.
struct JoinTicket {
    state_disk_key: DataKey,
    measurement_salt: [u8; MEASUREMENT_SALT_LEN],
    measurement_secret: DataKey,
    kubelet_cert: Vec<u8>,
    api_server_endpoint: String,
    token: Zeroizing<String>,
    discovery_token_ca_cert_hash: String,
    control_plane_files: Vec<(String, Zeroizing<Vec<u8>>)>,
    ssh_ca_public_key: Vec<u8>,
    host_certificate: Vec<u8>,
    components: Components,
}

fn key32(bytes: &mut Vec<u8>, what: &str) -> Result<DataKey, String> {
    if bytes.len() != 32 {
        return Err(format!("{what} has {} bytes, 32 expected", bytes.len()));
    }
    DataKey::new(std::mem::take(bytes)).map_err(|e| format!("{what}: {e}"))
}

impl TryFrom<IssueJoinTicketResponse> for JoinTicket {
    type Error = String;

    fn try_from(mut r: IssueJoinTicketResponse) -> Result<Self, String> {
        let state_disk_key = key32(&mut r.state_disk_key, "state_disk_key")?;
        let measurement_secret = key32(&mut r.measurement_secret, "measurement_secret")?;
        let measurement_salt = <[u8; MEASUREMENT_SALT_LEN]>::try_from(
            r.measurement_salt.as_slice(),
        )
        .map_err(|_| {
            format!(
                "measurement_salt has {} bytes, 32 expected",
                r.measurement_salt.len()
            )
        })?;
        // Checked here, so that a ticket with a bad component is refused before the lock.
        let components = Components::try_from(std::mem::take(&mut r.kubernetes_components))
            .map_err(|e| format!("kubernetes_components: {}", chain(&e)))?;
        if r.control_plane_files.len() > MAX_CONTROL_PLANE_FILES {
            return Err("too many control-plane files".into());
        }
        let mut control_plane_files = Vec::with_capacity(r.control_plane_files.len());
        for f in &mut r.control_plane_files {
            if !safe_relative_name(&f.name) {
                return Err(format!(
                    "control-plane file name {:?} is not a plain relative path",
                    f.name
                ));
            }
            control_plane_files.push((f.name.clone(), Zeroizing::new(std::mem::take(&mut f.data))));
        }
        Ok(Self {
            state_disk_key,
            measurement_salt,
            measurement_secret,
            kubelet_cert: r.kubelet_cert,
            api_server_endpoint: r.api_server_endpoint,
            token: Zeroizing::new(std::mem::take(&mut r.token)),
            discovery_token_ca_cert_hash: r.discovery_token_ca_cert_hash,
            control_plane_files,
            ssh_ca_public_key: r.authorized_ca_public_key,
            host_certificate: r.host_certificate,
            components,
        })
    }
}

/// Checks a join ticket exactly as the JoinClient does before it takes the node lock, and
/// drops it. Public only so that the ticket checks can be fuzzed from outside the crate.
#[doc(hidden)]
pub fn check_join_ticket(ticket: IssueJoinTicketResponse) -> Result<(), String> {
    JoinTicket::try_from(ticket).map(drop)
}

/// Waits `interval`, or less if `stop` is set. Returns whether stop is set.
async fn pause(stop: &mut watch::Receiver<bool>, interval: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    let stopped = tokio::select! {
        () = tokio::time::sleep(interval) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    stopped || *stop.borrow()
}

impl<M: Metadata + 'static> Node<M> {
    fn dialer(&self) -> Result<Dialer, StepError> {
        Dialer::new(
            self.issuer.clone(),
            self.config.join_service.validator(),
            self.config.node_ip,
            self.config.rpc_timeout,
        )
        .map_err(|e| StepError::Ticket(format!("cannot set up aTLS: {e}")))
    }

    /// This round's join service endpoints: the control-plane endpoint, then every
    /// control-plane instance's VPC IP; empty or unparsable hosts are skipped (REFERENCE
    /// §14 item 10), and so is this node's own address.
    async fn endpoints(&self) -> Vec<SocketAddr> {
        let timeout = self.config.rpc_timeout;
        let mut hosts: Vec<IpAddr> = Vec::new();
        match tokio::time::timeout(timeout, self.metadata.control_plane_endpoint()).await {
            Ok(Ok(host)) => match host.trim().parse::<IpAddr>() {
                Ok(ip) => hosts.push(ip),
                Err(_) if host.trim().is_empty() => {
                    debug!("the metadata names no control-plane endpoint")
                }
                Err(_) => {
                    warn!(host = %host, "the control-plane endpoint is not an IP address; skipped")
                }
            },
            Ok(Err(e)) => debug!(error = %chain(&e), "no control-plane endpoint from the metadata"),
            Err(_) => debug!("the control-plane endpoint lookup timed out"),
        }
        match tokio::time::timeout(timeout, self.metadata.list()).await {
            Ok(Ok(instances)) => hosts.extend(
                instances
                    .iter()
                    .filter(|i| i.role == MetadataRole::ControlPlane)
                    .filter_map(|i| i.vpc_ip_addr()),
            ),
            Ok(Err(e)) => warn!(error = %chain(&e), "cannot list the cluster's instances"),
            Err(_) => warn!("listing the cluster's instances timed out"),
        }
        let own = self.config.node_ip.to_canonical();
        let mut out: Vec<SocketAddr> = Vec::new();
        for ip in hosts {
            let ip = ip.to_canonical();
            let addr = SocketAddr::new(ip, self.config.join_port);
            if ip != own && !ip.is_unspecified() && !out.contains(&addr) {
                out.push(addr);
            }
        }
        out
    }

    /// Asks the metadata who this node is until it knows a name and a role, or `stop`.
    async fn learn_identity(&self, stop: &mut watch::Receiver<bool>) -> Option<Identity> {
        loop {
            if let Some(identity) = self.identity_now().await {
                return Some(identity);
            }
            if pause(stop, self.config.retry_interval).await {
                return None;
            }
        }
    }

    /// This node's identity: the one already learned, or one question to the metadata
    /// (`None` when it does not answer with a name and a role). The InitServer needs it
    /// too, and a node that only waits for Init has no JoinClient to ask for it.
    pub(crate) async fn identity_now(&self) -> Option<Identity> {
        if let Some(identity) = self.identity.get() {
            return Some(identity.clone());
        }
        let timeout = self.config.rpc_timeout;
        match tokio::time::timeout(timeout, self.metadata.self_instance()).await {
            Ok(Ok(me)) => {
                let role = match me.role {
                    MetadataRole::ControlPlane => Some(Role::ControlPlane),
                    MetadataRole::Worker => Some(Role::Worker),
                    MetadataRole::Unknown => None,
                };
                match role {
                    Some(role) if !me.name.is_empty() => {
                        let identity = Identity {
                            name: me.name,
                            role,
                        };
                        info!(step = "metadata", name = %identity.name, role = %identity.role, "learned this node's identity");
                        let _ = self.identity.set(identity.clone());
                        return self.identity.get().cloned();
                    }
                    _ => warn!("the metadata does not name this node or its role yet"),
                }
            }
            Ok(Err(e)) => warn!(error = %chain(&e), "cannot ask the metadata who this node is"),
            Err(_) => warn!("the metadata did not answer in time"),
        }
        None
    }

    /// The JoinClient: find a join service, get a ticket, take the node lock, activate.
    pub(crate) async fn join_client(
        self: Arc<Self>,
        disk_uuid: DiskUuid,
        mut stop: watch::Receiver<bool>,
        stop_init: watch::Sender<bool>,
    ) -> Result<JoinEnd, StepError> {
        if !self.config.join_service.may_join() {
            info!(
                "no cluster to join is configured (--cluster-id): this node waits to be initialised"
            );
            return Ok(JoinEnd::Stopped);
        }
        let Some(identity) = self.learn_identity(&mut stop).await else {
            return Ok(JoinEnd::Stopped);
        };
        let dialer = self.dialer()?;
        let host_key = self.ensure_host_key().await?;
        let mut attempt: u64 = 0;
        let (ticket, kubelet_key) = loop {
            if *stop.borrow() {
                return Ok(JoinEnd::Stopped);
            }
            attempt += 1;
            let round = self.join_round(&dialer, &identity, &disk_uuid, &host_key, attempt);
            let got = tokio::select! {
                got = round => got,
                _ = stop.wait_for(|s| *s) => return Ok(JoinEnd::Stopped),
            };
            if let Some(got) = got {
                break got;
            }
            if pause(&mut stop, self.config.retry_interval).await {
                return Ok(JoinEnd::Stopped);
            }
        };

        // REFERENCE §4.5, step 1–2: the cluster ID and the node lock.
        let cluster_id = derive_cluster_id(&ticket.measurement_secret, &ticket.measurement_salt)?;
        let node = self.clone();
        match blocking(move || node.lock.try_lock_once(Holder::Join, &cluster_id)).await {
            Ok(true) => {}
            Ok(false) => {
                info!("the node is already being initialised; the JoinClient stops");
                return Ok(JoinEnd::LostRace);
            }
            Err(e) => {
                let _ = stop_init.send(true);
                self.reset_after_failure(&e).await;
                return Err(e);
            }
        }
        // 3. Stop the InitServer.
        let _ = stop_init.send(true);
        let timeout = self.config.activation_timeout;
        let result = tokio::time::timeout(
            timeout,
            self.join_activation(ticket, kubelet_key, &identity),
        )
        .await
        .unwrap_or(Err(StepError::Timeout(timeout)));
        match result {
            Ok(()) => {
                info!(step = "done", cluster_id = %cluster_id, name = %identity.name, role = %identity.role, "the node joined the cluster");
                Ok(JoinEnd::Joined(cluster_id))
            }
            Err(e) => {
                self.reset_after_failure(&e).await;
                Err(e)
            }
        }
    }

    /// One round over all endpoints; the first ticket wins.
    async fn join_round(
        &self,
        dialer: &Dialer,
        identity: &Identity,
        disk_uuid: &DiskUuid,
        host_key: &crate::pki::HostKey,
        attempt: u64,
    ) -> Option<(JoinTicket, Zeroizing<Vec<u8>>)> {
        let endpoints = self.endpoints().await;
        if endpoints.is_empty() {
            info!(attempt, "no join service endpoint known yet");
            return None;
        }
        for addr in endpoints {
            self.config.join_service.warn_if_insecure("join");
            // A new kubelet key and CSR per attempt (REFERENCE §4.4).
            let csr = match crate::pki::kubelet_csr(&identity.name, self.config.node_ip) {
                Ok(csr) => csr,
                Err(e) => {
                    warn!(error = %chain(&e), "cannot make a kubelet CSR");
                    return None;
                }
            };
            let request = IssueJoinTicketRequest {
                disk_uuid: disk_uuid.as_str().to_owned(),
                certificate_request: csr.csr_der,
                is_control_plane: identity.role == Role::ControlPlane,
                host_public_key: host_key.public_wire.clone(),
                host_certificate_principals: self.host_certificate_principals(identity),
            };
            info!(step = "join", attempt, endpoint = %addr, "asking the join service for a join ticket");
            let response = async {
                let channel = dialer.channel(addr, self.config.rpc_timeout).await?;
                ApiClient::new(channel)
                    .issue_join_ticket(request)
                    .await
                    .map_err(|s| StepError::Ticket(format!("{}: {}", s.code(), s.message())))
            };
            match response.await {
                Ok(r) => match JoinTicket::try_from(r.into_inner()).and_then(|t| {
                    self.check_ticket(&t, identity, &csr.spki_der, &host_key.public_wire)?;
                    Ok(t)
                }) {
                    Ok(mut ticket) => {
                        // The API server is reached through the control-plane
                        // endpoint, not the join service's own address (REFERENCE §2.3).
                        let endpoint = tokio::time::timeout(
                            self.config.rpc_timeout,
                            self.metadata.control_plane_endpoint(),
                        )
                        .await;
                        if let Ok(Ok(host)) = endpoint
                            && let Ok(ip) = host.trim().parse::<IpAddr>()
                        {
                            ticket.api_server_endpoint =
                                SocketAddr::new(ip, KUBERNETES_PORT).to_string();
                        }
                        info!(step = "join", endpoint = %addr, "received a join ticket");
                        return Some((ticket, csr.key_pem));
                    }
                    Err(e) => {
                        warn!(endpoint = %addr, error = %e, "the join service sent an unusable ticket")
                    }
                },
                Err(e) => {
                    warn!(attempt, endpoint = %addr, error = %chain(&e), "join attempt failed")
                }
            }
        }
        None
    }

    /// Everything in a ticket is checked before any of it is used (module `ticket`), and
    /// the ticket must be for the cluster this node expects.
    fn check_ticket(
        &self,
        ticket: &JoinTicket,
        identity: &Identity,
        kubelet_spki: &[u8],
        host_public_wire: &[u8],
    ) -> Result<(), String> {
        let cluster_id = derive_cluster_id(&ticket.measurement_secret, &ticket.measurement_salt)
            .map_err(|e| chain(&e))?;
        self.config.join_service.accepts_cluster(&cluster_id)?;
        let expect = ticket::Expect {
            node_name: &identity.name,
            node_ip: self.config.node_ip,
            kubelet_spki,
            control_plane: identity.role == Role::ControlPlane,
        };
        let ca_crt = ticket
            .control_plane_files
            .iter()
            .find(|(n, _)| n == "ca.crt")
            .map(|(_, d)| d.as_slice());
        ticket::check_control_plane_files(
            &ticket.control_plane_files,
            &ticket.discovery_token_ca_cert_hash,
            &expect,
        )?;
        ticket::check_kubelet_cert(
            &ticket.kubelet_cert,
            &ticket.discovery_token_ca_cert_hash,
            ca_crt,
            &expect,
        )?;
        ticket::check_ssh(
            &ticket.ssh_ca_public_key,
            &ticket.host_certificate,
            host_public_wire,
            &self.host_certificate_principals(identity),
        )?;
        ticket::check_component_paths(&ticket.components, &self.config.components_dirs)
    }

    /// The principals a node asks for in its SSH host certificate.
    fn host_certificate_principals(&self, identity: &Identity) -> Vec<String> {
        vec![self.config.node_ip.to_string(), identity.name.clone()]
    }

    /// REFERENCE §4.5 steps 4–11, after the lock.
    async fn join_activation(
        &self,
        ticket: JoinTicket,
        kubelet_key: Zeroizing<Vec<u8>>,
        identity: &Identity,
    ) -> Result<(), StepError> {
        let dir = self.dir().clone();
        // 4.
        self.rekey_disk(ticket.state_disk_key).await?;
        // 5. Control-plane files (only a control-plane node asks for them; the join service
        //    sends them only then), 6–7 the kubelet certificate and key, 8–9 the SSH CA key
        //    and host certificate: one batch, each file atomic, the syncs shared.
        let cp_paths: Vec<_> = if identity.role == Role::ControlPlane {
            ticket
                .control_plane_files
                .iter()
                .map(|(name, data)| (dir.kubernetes_pki().join(name), data))
                .collect()
        } else {
            if !ticket.control_plane_files.is_empty() {
                warn!(
                    count = ticket.control_plane_files.len(),
                    "ignored control-plane files sent to a worker"
                );
            }
            Vec::new()
        };
        let (kubelet_cert, kubelet_key_path) = (dir.kubelet_cert(), dir.kubelet_key());
        let (ssh_ca, host_cert) = (dir.ssh_ca_pub(), dir.ssh_host_cert());
        let mut batch: Vec<files::FileToWrite<'_>> = cp_paths
            .iter()
            .map(|(path, data)| (path.as_path(), data.as_slice(), files::SECRET_MODE))
            .collect();
        batch.extend([
            (
                kubelet_cert.as_path(),
                ticket.kubelet_cert.as_slice(),
                files::PUBLIC_MODE,
            ),
            (
                kubelet_key_path.as_path(),
                &kubelet_key[..],
                files::SECRET_MODE,
            ),
            (
                ssh_ca.as_path(),
                ticket.ssh_ca_public_key.as_slice(),
                files::PUBLIC_MODE,
            ),
            (
                host_cert.as_path(),
                ticket.host_certificate.as_slice(),
                files::PUBLIC_MODE,
            ),
        ]);
        files::write_all_atomic(&batch)?;
        info!(
            step = "files",
            control_plane_files = cp_paths.len(),
            "wrote the kubelet certificate and key, the SSH CA key and host certificate"
        );
        drop(batch);
        // 11.
        let params = ClusterJoin {
            api_server_endpoint: ticket.api_server_endpoint,
            token: ticket.token,
            discovery_token_ca_cert_hash: ticket.discovery_token_ca_cert_hash,
            role: identity.role,
            node_name: identity.name.clone(),
            pki_dir: dir.kubernetes_pki(),
            components: ticket.components,
        };
        info!(
            step = "kubernetes",
            driver = self.driver.name(),
            "joining Kubernetes"
        );
        self.driver.join(&params).await?;
        // 10. The node state, written last: its presence says the node finished.
        let state = NodeState {
            role: identity.role,
            measurement_salt: ticket.measurement_salt,
        };
        state.write(&dir.node_state())?;
        info!(step = "node-state", role = %state.role, "wrote the node state");
        Ok(())
    }

    /// A reboot of an initialized node (REFERENCE §10.6, §10.10): get the disk key and
    /// measurement secret from a join service, unlock the disk, read the node state, derive
    /// the cluster ID and mark PCR 15. `None` when stopped first.
    pub(crate) async fn rejoin(
        &self,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Option<ClusterId>, RejoinError> {
        if !self.config.join_service.may_join() {
            return Err(RejoinError::Before(StepError::Ticket(
                "this node was bootstrapped before, but no cluster to rejoin is configured (--cluster-id)".into(),
            )));
        }
        let disk = self.disk.clone();
        let uuid = blocking(move || disk.uuid())
            .await
            .map_err(RejoinError::Before)?;
        let dialer = self.dialer().map_err(RejoinError::Before)?;
        info!(step = "rejoin", uuid = %uuid, "the state disk is initialized: this is a reboot; asking a join service for a rejoin ticket");
        let mut attempt: u64 = 0;
        let (disk_key, measurement_secret) = loop {
            if *stop.borrow() {
                return Ok(None);
            }
            attempt += 1;
            let round = self.rejoin_round(&dialer, &uuid, attempt);
            let got = tokio::select! {
                got = round => got,
                _ = stop.wait_for(|s| *s) => return Ok(None),
            };
            if let Some(got) = got {
                break got;
            }
            if pause(&mut stop, self.config.retry_interval).await {
                return Ok(None);
            }
        };
        let disk = self.disk.clone();
        let unlocked = blocking(move || disk.unlock(&disk_key))
            .await
            .map_err(RejoinError::Before)?;
        match unlocked {
            Unlocked::KeyChecked => info!(
                step = "rejoin",
                "unlocked the state disk by a key check, without device-mapper: the key opens the disk, nothing is mapped (local mode: the node directory's state/ stands for the mounted disk)"
            ),
            Unlocked::Mapped(path) => {
                info!(step = "rejoin", mapped = %path.display(), "unlocked the state disk")
            }
        }
        let state_path = self.dir().node_state();
        let state = NodeState::read(&state_path).map_err(|e| RejoinError::Incomplete(e.into()))?;
        let cluster_id = derive_cluster_id(&measurement_secret, &state.measurement_salt)
            .map_err(|e| RejoinError::Before(e.into()))?;
        self.config
            .join_service
            .accepts_cluster(&cluster_id)
            .map_err(|e| RejoinError::Before(StepError::Ticket(e)))?;
        let marker = self.marker.clone();
        blocking(move || marker.mark(&cluster_id))
            .await
            .map_err(RejoinError::Before)?;
        info!(step = "done", cluster_id = %cluster_id, role = %state.role, "rejoined: marked PCR 15 with the cluster ID");
        Ok(Some(cluster_id))
    }

    async fn rejoin_round(
        &self,
        dialer: &Dialer,
        uuid: &DiskUuid,
        attempt: u64,
    ) -> Option<(DataKey, DataKey)> {
        let endpoints = self.endpoints().await;
        if endpoints.is_empty() {
            info!(attempt, "no join service endpoint known yet");
            return None;
        }
        for addr in endpoints {
            self.config.join_service.warn_if_insecure("rejoin");
            info!(step = "rejoin", attempt, endpoint = %addr, "asking for a rejoin ticket");
            let response = async {
                let channel = dialer.channel(addr, self.config.rpc_timeout).await?;
                ApiClient::new(channel)
                    .issue_rejoin_ticket(IssueRejoinTicketRequest {
                        disk_uuid: uuid.as_str().to_owned(),
                    })
                    .await
                    .map_err(|s| StepError::Ticket(format!("{}: {}", s.code(), s.message())))
            };
            match response.await {
                Ok(r) => {
                    let mut r = r.into_inner();
                    let keys = key32(&mut r.state_disk_key, "state_disk_key").and_then(|k| {
                        Ok((k, key32(&mut r.measurement_secret, "measurement_secret")?))
                    });
                    match keys {
                        Ok(keys) => {
                            info!(step = "rejoin", endpoint = %addr, "received a rejoin ticket");
                            return Some(keys);
                        }
                        Err(e) => {
                            warn!(endpoint = %addr, error = %e, "the join service sent an unusable rejoin ticket")
                        }
                    }
                }
                Err(e) => {
                    warn!(attempt, endpoint = %addr, error = %chain(&e), "rejoin attempt failed")
                }
            }
        }
        None
    }
}

/// Why a rejoin failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RejoinError {
    /// Before PCR 15 was marked: nothing changed; try again (reboot).
    #[error(transparent)]
    Before(StepError),
    /// The disk opened but the node never finished bootstrapping (no node state): the disk
    /// must be reset.
    #[error("the state disk holds no complete node state")]
    Incomplete(#[source] StepError),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use asterism_proto::components::Component;

    fn ticket(components: Vec<Component>) -> IssueJoinTicketResponse {
        IssueJoinTicketResponse {
            state_disk_key: vec![1; 32],
            measurement_secret: vec![2; 32],
            measurement_salt: vec![3; 32],
            kubernetes_components: components,
            ..IssueJoinTicketResponse::default()
        }
    }

    fn component(hash: &str) -> Component {
        Component {
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
            let Err(e) = JoinTicket::try_from(ticket(vec![component(bad)])) else {
                panic!("accepted the hash {bad:?}");
            };
            assert!(e.starts_with("kubernetes_components"), "{e}");
        }
    }

    #[test]
    fn the_ticket_components_are_kept_in_order() {
        let hashes = [
            format!("sha256:{}", "ab".repeat(32)),
            format!("sha256:{}", "cd".repeat(32)),
        ];
        let t =
            JoinTicket::try_from(ticket(hashes.iter().map(|h| component(h)).collect())).unwrap();
        let got: Vec<_> = t.components.as_slice().iter().map(|c| &c.hash).collect();
        assert_eq!(got, [&hashes[0], &hashes[1]]);
        assert!(
            JoinTicket::try_from(ticket(Vec::new()))
                .unwrap()
                .components
                .is_empty()
        );
    }
}
