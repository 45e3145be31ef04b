//! The JoinClient and the rejoin client (docs/bootstrapper.md): both find control-plane
//! endpoints through the metadata and dial a join service over aTLS from the node's own
//! address, attesting with the node's TPM (and, in mutual mode, verifying the join
//! service).
//!
//! The path of a join: endpoints from the metadata, a dial, a ticket received, the ticket
//! checked (module `ticket`) into an [`Activation`], the node lock, then
//! [`Activation::activate`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use asterism_binkit::error_chain;
use asterism_cluster::Role;
use asterism_kms::{ChannelBinding, ClusterId, DiskUuid, Purpose};
use asterism_metadata::Metadata;
use asterism_proto::join::api_client::ApiClient;
use asterism_proto::join::{IssueJoinTicketRequest, IssueRejoinTicketRequest};
use prost::Message as _;
use tokio::sync::watch;
use tonic::transport::Channel;
use tracing::{debug, info, warn};
use zeroize::Zeroizing;

use crate::activation::Activation;
use crate::dial::Dialer;
use crate::error::{ResumeError, StepError, blocking};
use crate::flow::{JoinEnd, rounds_until};
use crate::identity::ThisNode;
use crate::lock::Holder;
use crate::node::Node;
use crate::pki;
use crate::recover::{RejoinKeys, Resume, Source};
use crate::ticket::{self, Expect, ForNode, JoinTicket, TicketError, key32};

fn dialer<M>(node: &Node<M>) -> Result<Dialer, StepError> {
    Ok(Dialer::new(
        node.issuer.clone(),
        node.config.join_service.validator(),
        node.config.node_ip,
        node.config.rpc_timeout,
    )?)
}

/// Dials the join service at `addr` and makes one call on the channel: the answer, and the
/// binding of the connection it came on (which the ticket's checks need).
async fn ask<M, R>(
    dialer: &Dialer,
    addr: SocketAddr,
    node: &Node<M>,
    call: impl AsyncFnOnce(ApiClient<Channel>) -> Result<tonic::Response<R>, tonic::Status>,
) -> Result<(R, Option<ChannelBinding>), StepError> {
    let dialed = dialer.dial(addr, node.config.rpc_timeout).await?;
    let answer = call(ApiClient::new(dialed.channel.clone()))
        .await
        .map_err(|status| StepError::JoinService {
            endpoint: addr,
            status,
        })?;
    Ok((answer.into_inner(), dialed.binding()))
}

/// This round's join service endpoints: the control-plane endpoint, then every
/// control-plane instance's VPC IP; empty or unparsable hosts are skipped, and so is this
/// node's own address.
async fn endpoints<M: Metadata>(node: &Node<M>) -> Vec<SocketAddr> {
    let timeout = node.config.rpc_timeout;
    let mut hosts: Vec<IpAddr> = Vec::new();
    match tokio::time::timeout(timeout, node.metadata.control_plane_endpoint()).await {
        Ok(Ok(host)) => match host.trim().parse::<IpAddr>() {
            Ok(ip) => hosts.push(ip),
            Err(_) if host.trim().is_empty() => {
                debug!("the metadata names no control-plane endpoint")
            }
            Err(_) => {
                warn!(host = %host, "the control-plane endpoint is not an IP address; skipped")
            }
        },
        Ok(Err(e)) => {
            debug!(error = %error_chain(&e), "no control-plane endpoint from the metadata")
        }
        Err(_) => debug!("the control-plane endpoint lookup timed out"),
    }
    match tokio::time::timeout(timeout, node.metadata.list()).await {
        Ok(Ok(instances)) => hosts.extend(
            instances
                .iter()
                .filter(|i| i.role == Role::ControlPlane)
                .filter_map(|i| i.vpc_ip_addr()),
        ),
        Ok(Err(e)) => warn!(error = %error_chain(&e), "cannot list the cluster's instances"),
        Err(_) => warn!("listing the cluster's instances timed out"),
    }
    let own = node.config.node_ip.to_canonical();
    let mut out: Vec<SocketAddr> = Vec::new();
    for ip in hosts {
        let ip = ip.to_canonical();
        let addr = SocketAddr::new(ip, node.config.join_port);
        if ip != own && !ip.is_unspecified() && !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

/// The JoinClient: find a join service, get a checked ticket, take the node lock,
/// activate.
pub(crate) async fn join_client<M: Metadata + 'static>(
    node: Arc<Node<M>>,
    this: ThisNode,
    mut stop: watch::Receiver<bool>,
    stop_init: watch::Sender<bool>,
) -> Result<JoinEnd, StepError> {
    if !node.config.join_service.may_join() {
        info!("no cluster to join is configured (--cluster-id): this node waits to be initialised");
        return Ok(JoinEnd::Stopped);
    }
    let dialer = dialer(&node)?;
    let (node_ref, dialer_ref, this_ref) = (&node, &dialer, &this);
    let Some((ticket, kubelet_key)) =
        rounds_until(&mut stop, node.config.retry_interval, |attempt| {
            join_round(node_ref, dialer_ref, this_ref, attempt)
        })
        .await
    else {
        return Ok(JoinEnd::Stopped);
    };
    let activation = Activation::from_ticket(ticket, kubelet_key, this.identity, node.dir());

    // The node lock.
    let cluster_id = *activation.cluster_id();
    let locking = node.clone();
    match blocking(move || locking.lock.try_lock_once(Holder::Join, &cluster_id)).await {
        Ok(true) => {}
        Ok(false) => {
            info!("the node is already being initialised; the JoinClient stops");
            return Ok(JoinEnd::LostRace);
        }
        Err(e) => {
            let _ = stop_init.send(true);
            node.reset_after_failure(&e).await;
            return Err(e);
        }
    }
    // Stop the InitServer, then activate (on failure the disk is marked for reset).
    let _ = stop_init.send(true);
    let activated = activation.activate(&node).await?;
    Ok(JoinEnd::Joined(activated.cluster_id))
}

/// One round over all endpoints; the first checked ticket wins.
async fn join_round<M: Metadata>(
    node: &Node<M>,
    dialer: &Dialer,
    this: &ThisNode,
    attempt: u64,
) -> Option<(JoinTicket, Zeroizing<Vec<u8>>)> {
    let endpoints = endpoints(node).await;
    if endpoints.is_empty() {
        info!(attempt, "no join service endpoint known yet");
        return None;
    }
    let identity = &this.identity;
    let principals = pki::host_principals(node.config.node_ip, &identity.name);
    for addr in endpoints {
        node.config.join_service.warn_if_insecure("join");
        // A new kubelet key and CSR per attempt: a key is never reused.
        let csr = match pki::kubelet_csr(&identity.name, node.config.node_ip) {
            Ok(csr) => csr,
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot make a kubelet CSR");
                return None;
            }
        };
        let request = IssueJoinTicketRequest {
            disk_uuid: this.disk_uuid.as_str().to_owned(),
            certificate_request: csr.csr_der,
            is_control_plane: identity.role == Role::ControlPlane,
            host_public_key: this.host_key.public_wire.clone(),
            host_certificate_principals: principals.clone(),
        };
        info!(step = "join", attempt, endpoint = %addr, "asking the join service for a join ticket");
        let response = ask(dialer, addr, node, async |mut api| {
            api.issue_join_ticket(request).await
        });
        match response.await {
            Ok((r, binding)) => {
                let for_node = ForNode {
                    expect: Expect {
                        node_name: &identity.name,
                        node_ip: node.config.node_ip,
                        kubelet_spki: &csr.spki_der,
                        control_plane: identity.role == Role::ControlPlane,
                    },
                    host_public_wire: &this.host_key.public_wire,
                    principals: &principals,
                    trust: &node.config.join_service,
                    binding,
                    components_dirs: &node.config.components_dirs,
                };
                match ticket::check(r, &for_node) {
                    Ok(ticket) => {
                        info!(step = "join", endpoint = %addr, "received a join ticket");
                        return Some((ticket, csr.key_pem));
                    }
                    Err(e) => {
                        warn!(endpoint = %addr, error = %error_chain(&e), "the join service sent an unusable ticket")
                    }
                }
            }
            Err(e) => {
                warn!(attempt, endpoint = %addr, error = %error_chain(&e), "join attempt failed")
            }
        }
    }
    None
}

/// How the rejoin client ended.
#[derive(Debug)]
pub(crate) enum RejoinEnd {
    /// The node is back in its cluster.
    Rejoined(ClusterId),
    /// The recovery server brought the node back first.
    LostRace,
    /// Stopped before it got a rejoin ticket.
    Stopped,
}

/// The rejoin client of a reboot: asks a join service for the disk key and the
/// measurement secret until it gets them or `stop`, then hands them to `resume` (which
/// unlocks the disk, reads the node state, derives the cluster ID and marks PCR 15).
pub(crate) async fn rejoin<M: Metadata + 'static>(
    node: &Node<M>,
    resume: &Resume<M>,
    mut stop: watch::Receiver<bool>,
) -> Result<RejoinEnd, ResumeError> {
    let dialer = dialer(node).map_err(ResumeError::Step)?;
    let uuid = resume.uuid();
    info!(step = "rejoin", uuid = %uuid, "the state disk is initialized: this is a reboot; asking a join service for a rejoin ticket");
    let dialer = &dialer;
    let Some(keys) = rounds_until(&mut stop, node.config.retry_interval, |attempt| {
        rejoin_round(node, dialer, uuid, attempt)
    })
    .await
    else {
        return Ok(RejoinEnd::Stopped);
    };
    match resume.resume(keys, Source::RejoinTicket).await {
        Ok(cluster_id) => Ok(RejoinEnd::Rejoined(cluster_id)),
        Err(ResumeError::AlreadyDone) => {
            info!("the node was recovered first; the rejoin client stops");
            Ok(RejoinEnd::LostRace)
        }
        Err(e) => Err(e),
    }
}

async fn rejoin_round<M: Metadata>(
    node: &Node<M>,
    dialer: &Dialer,
    uuid: &DiskUuid,
    attempt: u64,
) -> Option<RejoinKeys> {
    let endpoints = endpoints(node).await;
    if endpoints.is_empty() {
        info!(attempt, "no join service endpoint known yet");
        return None;
    }
    for addr in endpoints {
        node.config.join_service.warn_if_insecure("rejoin");
        info!(step = "rejoin", attempt, endpoint = %addr, "asking for a rejoin ticket");
        let request = IssueRejoinTicketRequest {
            disk_uuid: uuid.as_str().to_owned(),
        };
        let response = ask(dialer, addr, node, async |mut api| {
            api.issue_rejoin_ticket(request).await
        });
        match response.await {
            Ok((mut r, binding)) => {
                let signature = std::mem::take(&mut r.control_plane_signature);
                let signed = Zeroizing::new(r.encode_to_vec());
                let keys: Result<_, TicketError> = node
                    .config
                    .join_service
                    .check_signature(Purpose::RejoinTicket, binding, &signed, &signature)
                    .map_err(TicketError::from)
                    .and_then(|()| key32(&mut r.state_disk_key, "state_disk_key"))
                    .and_then(|disk_key| {
                        Ok(RejoinKeys {
                            disk_key,
                            measurement_secret: key32(
                                &mut r.measurement_secret,
                                "measurement_secret",
                            )?,
                        })
                    });
                match keys {
                    Ok(keys) => {
                        info!(step = "rejoin", endpoint = %addr, "received a rejoin ticket");
                        return Some(keys);
                    }
                    Err(e) => {
                        warn!(endpoint = %addr, error = %error_chain(&e), "the join service sent an unusable rejoin ticket")
                    }
                }
            }
            Err(e) => {
                warn!(attempt, endpoint = %addr, error = %error_chain(&e), "rejoin attempt failed")
            }
        }
    }
    None
}
