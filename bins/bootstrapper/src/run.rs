//! The orchestrator: the boot phase, then what this node is (learned once), then the
//! InitServer and the JoinClient in parallel until one of them has taken the node lock and
//! finished. On a reboot, the rejoin client and the recovery server race the same way.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use asterism_atls::{AtlsConfig, AtlsServer};
use asterism_binkit::error_chain;
use asterism_binkit::grpc::{self, Limits};
use asterism_kms::ClusterId;
use asterism_metadata::Metadata;
use asterism_proto::init::api_server::ApiServer;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::service::Routes;
use tracing::{error, info, warn};

use crate::boot::{Boot, boot_phase};
use crate::error::{ResumeError, StepError, blocking};
use crate::flow::{Event, JoinEnd};
use crate::identity::{self, ThisNode};
use crate::init::{InitService, fetch_secret_hash};
use crate::join::{RejoinEnd, join_client, rejoin};
use crate::node::Node;
use crate::pki;
use crate::recover::{RecoverService, Resume};

/// How long a stopping InitServer may take to deliver its last response.
const SERVER_DRAIN: Duration = Duration::from_secs(10);

/// How a run ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The owner initialised this node as the cluster's first control-plane node.
    Initialized(ClusterId),
    /// The node joined an existing cluster.
    Joined(ClusterId),
    /// A reboot: the node got its disk key back from a join service and re-marked PCR 15.
    Rejoined(ClusterId),
    /// A reboot: the owner sent the node its keys (`asterism recover`); it re-marked PCR 15.
    Recovered(ClusterId),
    /// PCR 15 was already marked: nothing to do.
    AlreadyBootstrapped,
    /// Stopped by a signal before the node lock; nothing irreversible happened.
    Stopped,
}

impl Outcome {
    /// The process exit status: 0, or [`EXIT_STOPPED`] for [`Outcome::Stopped`].
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Stopped => EXIT_STOPPED,
            _ => 0,
        }
    }
}

/// Exit status: a failure before the point of no return (nothing irreversible happened;
/// running again is safe).
pub const EXIT_FAILED: u8 = 1;
/// Exit status: a failure after the point of no return; the state disk is marked for reset
/// and the node must be rebooted (its TPM reset) before it can bootstrap again.
pub const EXIT_RESET: u8 = 3;
/// Exit status: stopped by SIGTERM/SIGINT before the node lock.
pub const EXIT_STOPPED: u8 = 4;

/// How a run failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Before the point of no return: nothing irreversible happened.
    #[error("bootstrapping failed before the point of no return")]
    BeforeLock(#[source] StepError),
    /// After the point of no return: the state disk is marked for reset.
    #[error(
        "bootstrapping failed after the point of no return; the state disk is marked for reset"
    )]
    AfterLock(#[source] StepError),
    /// PCR 15 is marked but the node never finished bootstrapping (a crash after the node
    /// lock); the state disk is marked for reset.
    #[error(
        "the node was marked (PCR 15) but never finished bootstrapping; the state disk is marked for reset: reboot the node"
    )]
    Interrupted,
}

impl Failure {
    /// The process exit status.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::BeforeLock(_) => EXIT_FAILED,
            Self::AfterLock(_) | Self::Interrupted => EXIT_RESET,
        }
    }
}

/// The sockets the bootstrapper may serve, bound by the program before anything else can
/// take the ports. Each is served only in the boot it is for, and closed otherwise.
#[derive(Debug)]
pub struct Listeners {
    /// The InitServer's (`<node ip>:9000`): served only on a fresh boot (an initialised
    /// node takes no Init).
    pub init: TcpListener,
    /// The recovery server's (`<node ip>:9999`): served only on a reboot of an initialised
    /// node, while it waits for its keys.
    pub recover: TcpListener,
}

/// Runs the bootstrapper on `node` until it is bootstrapped, failed, or `shutdown`
/// completes before the node lock.
pub async fn run<M: Metadata + 'static>(
    node: Arc<Node<M>>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Outcome, Failure> {
    let (stop_tx, stop_rx) = watch::channel(false);
    // The signal only stops flows that have not passed the node lock.
    let signal_node = node.clone();
    let signal_stop = stop_tx.clone();
    let signal = tokio::spawn(async move {
        shutdown.await;
        if signal_node.lock.is_taken() {
            warn!("stop requested after the point of no return: finishing the activation first");
        } else {
            info!("stop requested: stopping before the node lock");
            let _ = signal_stop.send(true);
        }
    });
    let result = run_inner(node, listeners, stop_rx).await;
    signal.abort();
    result
}

async fn run_inner<M: Metadata + 'static>(
    node: Arc<Node<M>>,
    listeners: Listeners,
    stop: watch::Receiver<bool>,
) -> Result<Outcome, Failure> {
    let Listeners {
        init: init_listener,
        recover: recover_listener,
    } = listeners;
    let boot = boot_phase(&node.marker, &node.disk, &node.mount, node.dir()).await;
    let uuid = match boot.map_err(Failure::BeforeLock)? {
        Boot::AlreadyBootstrapped => {
            info!(
                "PCR 15 is marked and the node state is present: the node is already bootstrapped; nothing to do (the none driver has no kubelet to start)"
            );
            return Ok(Outcome::AlreadyBootstrapped);
        }
        Boot::Interrupted => {
            error!("PCR 15 is marked, but the node never finished bootstrapping");
            reset_if_initialized(&node).await;
            return Err(Failure::Interrupted);
        }
        Boot::Rejoin => {
            // An initialised node takes no Init: nobody may queue connections meanwhile.
            drop(init_listener);
            return rejoin_or_recover(node, recover_listener, stop).await;
        }
        Boot::Fresh(uuid) => uuid,
    };
    // A fresh node has nothing to recover.
    drop(recover_listener);
    bootstrap(node, uuid, init_listener, stop).await
}

/// A reboot: the rejoin client and the recovery server in parallel, until one of them
/// brought the node back ([`Resume`]), or `stop`.
async fn rejoin_or_recover<M: Metadata + 'static>(
    node: Arc<Node<M>>,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
) -> Result<Outcome, Failure> {
    // Both paths check the measurement secret by the cluster it derives: the node must
    // know its cluster.
    if !node.config.join_service.may_join() {
        return Err(Failure::BeforeLock(StepError::NoClusterToRejoin));
    }
    let disk = node.disk.clone();
    let uuid = blocking(move || disk.uuid())
        .await
        .map_err(Failure::BeforeLock)?;
    let resume = Arc::new(Resume::new(node.clone(), uuid));

    // The recovery server: aTLS where the node attests; the caller is not attested (the
    // keys it sends prove themselves by opening the disk).
    let (done_tx, done_rx) = watch::channel(false);
    let server = AtlsServer::new(server_config(node.issuer.clone(), &node.config.init_limits))
        .map_err(|e| Failure::BeforeLock(StepError::Atls(e)))?;
    let addr = listener
        .local_addr()
        .map_or_else(|e| format!("(unknown: {e})"), |a| a.to_string());
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let service = RecoverService::new(
        resume.clone(),
        node.config.insecure_accept_master_secret,
        node.config.init_limits,
        events_tx,
    );
    let incoming = limited_incoming(
        server,
        listener,
        crate::limits::PeerLimiter::for_handshakes(node.config.init_limits),
    );
    let (mut server_done, mut outer_stop) = (done_rx.clone(), stop.clone());
    let server_shutdown = async move {
        tokio::select! {
            _ = server_done.wait_for(|d| *d) => {},
            _ = outer_stop.wait_for(|s| *s) => {},
        }
    };
    let mut server_task = tokio::spawn(async move {
        let routes = Routes::new(service.into_server());
        if let Err(e) = grpc::serve(incoming, routes, &RECOVERY_GRPC_LIMITS, server_shutdown).await
        {
            error!(error = %error_chain(&e), "the recovery server failed");
        }
    });
    info!(step = "serve", listen = %addr, "recovery server listening (aTLS, the node attests): waiting for a rejoin ticket or the owner's keys");

    // The rejoin client, stopped by the recovery or by the signal.
    let (client_stop_tx, client_stop) = watch::channel(false);
    let mut outer_stop = stop.clone();
    let forward = client_stop_tx.clone();
    let forwarder = tokio::spawn(async move {
        let _ = outer_stop.wait_for(|s| *s).await;
        let _ = forward.send(true);
    });
    let (client_node, client_resume) = (node.clone(), resume.clone());
    let mut client =
        tokio::spawn(async move { rejoin(&client_node, &client_resume, client_stop).await });

    let mut client_running = true;
    let ended: Result<Outcome, ResumeError> = loop {
        tokio::select! {
            Some(recovered) = events.recv() => break recovered.map(Outcome::Recovered),
            joined = &mut client, if client_running => {
                client_running = false;
                match joined {
                    Ok(Ok(RejoinEnd::Rejoined(id))) => break Ok(Outcome::Rejoined(id)),
                    // The recovery's event follows.
                    Ok(Ok(RejoinEnd::LostRace)) => {}
                    Ok(Ok(RejoinEnd::Stopped)) => {
                        if !node.lock.is_taken() {
                            break Ok(Outcome::Stopped);
                        }
                    }
                    Ok(Err(e)) => break Err(e),
                    Err(e) => break Err(ResumeError::Step(StepError::Task(e))),
                }
            }
            else => break Err(ResumeError::Step(StepError::FlowsEnded)),
        }
    };
    let _ = done_tx.send(true);
    let _ = client_stop_tx.send(true);
    drain(&mut server_task).await;
    forwarder.abort();
    if client_running {
        let _ = tokio::time::timeout(SERVER_DRAIN, client).await;
    }
    match ended {
        Ok(outcome) => Ok(outcome),
        Err(ResumeError::Incomplete(e)) => {
            error!(error = %error_chain(&e), "the reopened disk holds no complete node state");
            node.reset_after_failure(&e).await;
            Err(Failure::Interrupted)
        }
        Err(ResumeError::Marking(e)) => {
            node.reset_after_failure(&e).await;
            Err(Failure::AfterLock(e))
        }
        Err(e) => Err(Failure::BeforeLock(StepError::Resume(Box::new(e)))),
    }
}

async fn reset_if_initialized<M: Metadata + 'static>(node: &Arc<Node<M>>) {
    let disk = node.disk.clone();
    if matches!(blocking(move || disk.is_initialized()).await, Ok(true)) {
        node.reset_after_failure(&StepError::Interrupted).await;
    }
}

/// What this node is, then the InitServer and the JoinClient in parallel.
async fn bootstrap<M: Metadata + 'static>(
    node: Arc<Node<M>>,
    uuid: asterism_kms::DiskUuid,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
) -> Result<Outcome, Failure> {
    let (timeout, retry) = (node.config.rpc_timeout, node.config.retry_interval);
    // The init-secret hash must be known before serving: no Init can be checked without it.
    let mut waiting = stop.clone();
    let Some(hash) = fetch_secret_hash(&node.metadata, timeout, retry, &mut waiting).await else {
        return Ok(Outcome::Stopped);
    };
    // The SSH host key exists before the flows start (sshd-keygen makes it before the
    // bootstrapper starts on a real node).
    let host_key = pki::host_key(node.dir()).map_err(|e| Failure::BeforeLock(StepError::Pki(e)))?;
    // Who this node is, once, for both flows.
    let Some(identity) = identity::learn(&node.metadata, timeout, retry, &mut waiting).await else {
        return Ok(Outcome::Stopped);
    };
    let this = ThisNode {
        identity,
        host_key,
        disk_uuid: uuid,
    };

    // The InitServer: aTLS where the node attests; no client evidence (the owner is
    // authenticated by the init secret).
    let addr = listener
        .local_addr()
        .map_or_else(|e| format!("(unknown: {e})"), |a| a.to_string());
    let server = AtlsServer::new(server_config(node.issuer.clone(), &node.config.init_limits))
        .map_err(|e| Failure::BeforeLock(StepError::Atls(e)))?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (stop_init_tx, mut stop_init_rx) = watch::channel(false);
    let service = InitService::new(node.clone(), hash, this.clone(), events_tx.clone());
    let mut outer_stop = stop.clone();
    let init_shutdown = async move {
        tokio::select! {
            _ = stop_init_rx.wait_for(|s| *s) => {},
            _ = outer_stop.wait_for(|s| *s) => {},
        }
    };
    let incoming = limited_incoming(
        server,
        listener,
        crate::limits::PeerLimiter::for_handshakes(node.config.init_limits),
    );
    let server_events = events_tx.clone();
    let mut server_task = tokio::spawn(async move {
        let routes = Routes::new(ApiServer::new(service));
        let served = grpc::serve(incoming, routes, &INIT_GRPC_LIMITS, init_shutdown).await;
        let _ = server_events.send(Event::ServerDone(served));
    });
    info!(step = "serve", listen = %addr, "InitServer listening (aTLS, the node attests)");

    // The JoinClient, stopped by the InitServer's lock or by the signal.
    let (stop_join_tx, stop_join_rx) = watch::channel(false);
    let mut outer_stop = stop.clone();
    let forward = stop_join_tx.clone();
    let forwarder = tokio::spawn(async move {
        let _ = outer_stop.wait_for(|s| *s).await;
        let _ = forward.send(true);
    });
    let join_events = events_tx;
    let join_node = node.clone();
    let join_stop_init = stop_init_tx.clone();
    let join_task = tokio::spawn(async move {
        let ended = join_client(join_node, this, stop_join_rx, join_stop_init).await;
        let _ = join_events.send(Event::JoinDone(ended));
    });

    let mut server_running = true;
    let mut join_running = true;
    let outcome = loop {
        let Some(event) = events.recv().await else {
            break Err(Failure::BeforeLock(StepError::FlowsEnded));
        };
        match event {
            Event::InitLocked => {
                let _ = stop_join_tx.send(true);
            }
            Event::InitDone(result) => {
                break result.map(Outcome::Initialized).map_err(Failure::AfterLock);
            }
            Event::JoinDone(Ok(JoinEnd::Joined(id))) => break Ok(Outcome::Joined(id)),
            Event::JoinDone(Err(e)) => {
                error!(error = %error_chain(&e), "the JoinClient failed");
                break Err(if node.lock.is_taken() {
                    Failure::AfterLock(e)
                } else {
                    Failure::BeforeLock(e)
                });
            }
            Event::JoinDone(Ok(JoinEnd::Stopped | JoinEnd::LostRace)) => {
                join_running = false;
                if !server_running && !node.lock.is_taken() {
                    break Ok(Outcome::Stopped);
                }
            }
            Event::ServerDone(result) => {
                server_running = false;
                if let Err(e) = &result {
                    error!(error = %error_chain(e), "the InitServer failed");
                }
                if !node.lock.is_taken() {
                    if *stop.borrow() {
                        if !join_running {
                            break Ok(Outcome::Stopped);
                        }
                    } else {
                        break Err(Failure::BeforeLock(StepError::InitServerStopped));
                    }
                }
            }
        }
    };
    let _ = stop_init_tx.send(true);
    let _ = stop_join_tx.send(true);
    if server_running {
        drain(&mut server_task).await;
    }
    forwarder.abort();
    if join_running {
        // Stopped before its lock attempt, or finished: either way nothing is left to do.
        let _ = tokio::time::timeout(SERVER_DRAIN, join_task).await;
    }
    outcome
}

/// `server`'s incoming connections, each admitted by `limiter` (per address: how many at
/// once, how often) before its handshake, which costs a TPM quote: a refused connection is
/// closed at once. The handshake slots of all addresses together are the aTLS listener's,
/// shared fairly between addresses (`InitLimits::max_pending_handshakes`), so no set of
/// addresses can hold them all; a client has `asterism_atls::DEFAULT_HELLO_TIMEOUT` after
/// its TLS handshake to send its HELLO.
fn limited_incoming(
    server: AtlsServer,
    listener: tokio::net::TcpListener,
    limiter: std::sync::Arc<crate::limits::PeerLimiter>,
) -> impl futures::Stream<
    Item = Result<asterism_atls::AtlsStream<tokio::net::TcpStream>, std::io::Error>,
> + use<> {
    server.incoming_admitting(listener, move |addr| match limiter.try_acquire(addr.ip()) {
        Ok(permit) => Some(permit),
        Err(refused) => {
            // At debug: a flood must not flood the log too.
            tracing::debug!(peer = %addr, reason = %refused, "InitServer connection refused before the handshake");
            None
        }
    })
}

/// The gRPC caps of the recovery server: tonic's own. Its caps sit in front of it: aTLS's
/// handshake slots and the per-peer limiter of [`limited_incoming`].
const RECOVERY_GRPC_LIMITS: Limits = Limits::TONIC_DEFAULTS;

/// The gRPC caps of the InitServer: those of the recovery server, with a keepalive ping
/// every 15 s, so that the connection of an `Init` call, open for as long as `kubeadm
/// init` takes, is not dropped as idle on the way. No request deadline, for the same
/// reason.
const INIT_GRPC_LIMITS: Limits = Limits {
    keepalive_interval: Some(Duration::from_secs(15)),
    ..RECOVERY_GRPC_LIMITS
};

/// The aTLS configuration of the InitServer and the recovery server: the node attests,
/// with the handshake slots of `limits`.
fn server_config(
    issuer: std::sync::Arc<dyn asterism_atls::Issuer>,
    limits: &crate::limits::InitLimits,
) -> AtlsConfig {
    AtlsConfig::attesting(issuer)
        .with_max_pending_handshakes(limits.max_pending_handshakes)
        .with_max_pending_per_source(limits.per_peer_in_flight)
}

/// Waits for a server (the InitServer, the recovery server) to deliver its last responses
/// and stop.
async fn drain(server: &mut tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(SERVER_DRAIN, &mut *server)
        .await
        .is_err()
    {
        warn!("the server did not stop in time; closing it");
        server.abort();
    } else {
        info!("server stopped");
    }
}
