//! Dialling a join service over aTLS from the node's own address.
//!
//! The join service tells nodes apart by source address (as cloud services do by VPC IP),
//! so the TCP connection leaves from the node's IP (`AtlsConnector::from_address`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use asterism_atls::{AtlsConfig, AtlsConnector, AtlsError, Validator};
use asterism_attestation::Issuer;
use asterism_kms::ChannelBinding;
use hyper_util::rt::TokioIo;
use std::sync::{Arc, Mutex, PoisonError};
use tonic::transport::{Channel, Endpoint, Uri};

/// Why a join service could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The aTLS configuration is unusable.
    #[error("aTLS setup: {0}")]
    Atls(#[from] AtlsError),
    /// The endpoint is not a valid URI.
    #[error("invalid endpoint {0}")]
    Endpoint(String),
    /// The connection failed (TCP, TLS, or the attestation exchange).
    #[error("cannot connect to {addr}")]
    Connect {
        /// The endpoint.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
}

/// How the node dials join services: it attests with its issuer and, in mutual mode,
/// verifies the join service's evidence.
#[derive(Clone)]
pub struct Dialer {
    connector: AtlsConnector,
    local_ip: IpAddr,
    timeout: Duration,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("local_ip", &self.local_ip)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Dialer {
    /// A dialer from `local_ip` that attests with `issuer` and, if given, requires the
    /// peer's evidence to satisfy `verify_peer`. `timeout` bounds the TCP connect, the TLS
    /// handshake and the attestation exchange each.
    pub fn new(
        issuer: Arc<dyn Issuer>,
        verify_peer: Option<Arc<dyn Validator>>,
        local_ip: IpAddr,
        timeout: Duration,
    ) -> Result<Self, DialError> {
        let mut cfg = AtlsConfig::attesting(issuer)
            .with_handshake_timeout(timeout)
            .with_exchange_timeout(timeout);
        if let Some(v) = verify_peer {
            cfg = cfg.with_validator(v);
        }
        Ok(Self {
            connector: AtlsConnector::new(cfg)?.from_address(local_ip),
            local_ip,
            timeout,
        })
    }

    /// The address outgoing connections leave from.
    #[must_use]
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// Opens an attested channel to `addr`, with `rpc_timeout` on every request.
    pub async fn channel(
        &self,
        addr: SocketAddr,
        rpc_timeout: Duration,
    ) -> Result<Channel, DialError> {
        Ok(self.dial(addr, rpc_timeout).await?.channel)
    }

    /// Opens an attested channel to `addr`, with `rpc_timeout` on every request, and
    /// keeps the channel binding of its connection.
    pub async fn dial(&self, addr: SocketAddr, rpc_timeout: Duration) -> Result<Dialed, DialError> {
        let binding: Arc<Mutex<Option<ChannelBinding>>> = Arc::default();
        let cell = binding.clone();
        let connector = self.connector.clone();
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|_| DialError::Endpoint(addr.to_string()))?
            .connect_timeout(self.timeout)
            .timeout(rpc_timeout);
        let channel = endpoint
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let connector = connector.clone();
                let cell = cell.clone();
                async move {
                    // From the node's address, within the handshake timeout (`timeout`).
                    let stream = connector.connect_tcp(&addr.to_string()).await?;
                    // The latest connection's: an answer that came on an earlier one fails
                    // its signature check, which is safe.
                    *cell.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(ChannelBinding(stream.info().channel_binding));
                    Ok::<_, AtlsError>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|source| DialError::Connect { addr, source })?;
        Ok(Dialed { channel, binding })
    }
}

/// An attested channel and the channel binding of its connection.
#[derive(Debug)]
pub struct Dialed {
    /// The gRPC channel.
    pub channel: Channel,
    binding: Arc<Mutex<Option<ChannelBinding>>>,
}

impl Dialed {
    /// The channel binding of the connection the channel last made (none before it made
    /// one).
    #[must_use]
    pub fn binding(&self) -> Option<ChannelBinding> {
        *self.binding.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
