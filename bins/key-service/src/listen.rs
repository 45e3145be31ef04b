//! Where the service listens, and binding it safely.
//!
//! The service speaks plaintext gRPC without authenticating its callers, so it may only
//! listen where the operating system decides who can connect: a Unix socket (mode 0600),
//! reachable by the service's user and root. A loopback TCP address, which
//! [`KeyServiceAddress`] (the one address type of the service and its clients) can name, is
//! refused: every local user, and every process in the pod's network namespace, could
//! connect to it and derive every key.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use asterism_binkit::socket::{PrivateSocket, SocketError, bind_private};
use asterism_kms::KeyServiceAddress;
use tokio_stream::wrappers::UnixListenerStream;

use crate::serve::{Limits, ServeError, serve_with_limits};
use crate::service::KeyService;

/// Why binding failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The Unix socket could not be bound (`asterism_binkit::socket`).
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// A TCP address: plaintext on TCP is open to every local user.
    #[error(
        "refusing plaintext gRPC on {addr}: any local user could connect to a TCP port and derive every key; listen on a Unix socket (unix:/path, created mode 0600) instead"
    )]
    PlaintextTcp {
        /// The address.
        addr: SocketAddr,
    },
}

/// A bound listener, ready to serve.
#[derive(Debug)]
pub enum Listener {
    /// A Unix socket; the socket file is removed when this is dropped.
    Unix(PrivateSocket),
}

impl Listener {
    /// Binds `address`, which must be a Unix socket ([`BindError::PlaintextTcp`]
    /// otherwise). The socket is created with mode 0600 (it is bound inside a fresh 0700
    /// directory, restricted and then linked into place, so it is never reachable with
    /// wider permissions); a stale socket at the path is replaced, anything else there is
    /// left alone and reported ([`asterism_binkit::socket::bind_private`]).
    pub async fn bind(address: &KeyServiceAddress) -> Result<Listener, BindError> {
        match address {
            KeyServiceAddress::Unix(path) => Ok(Listener::Unix(bind_private(path)?)),
            KeyServiceAddress::Tcp(addr) => Err(BindError::PlaintextTcp { addr: *addr }),
        }
    }

    /// Where the listener listens, for logs and clients (`unix:/path` or `IP:PORT`, with
    /// the actual port when port 0 was asked for).
    pub fn local_addr(&self) -> io::Result<KeyServiceAddress> {
        match self {
            Self::Unix(socket) => Ok(KeyServiceAddress::Unix(socket.file.path().to_owned())),
        }
    }

    /// Serves the key service on this listener until `shutdown` completes (see
    /// [`serve_with_limits`]). A Unix socket file is removed afterwards.
    pub async fn serve(
        self,
        service: KeyService,
        limits: &Limits,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        match self {
            Self::Unix(PrivateSocket { listener, file }) => {
                let result =
                    serve_with_limits(UnixListenerStream::new(listener), service, limits, shutdown)
                        .await;
                drop(file);
                result
            }
        }
    }
}
