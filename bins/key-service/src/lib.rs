//! The Asterism key service: answers `kms.API/GetDataKey` with data keys that a
//! [`ClusterKms`](asterism_kms::ClusterKms) derives from the cluster's master secret, and
//! reports its health over `grpc.health.v1.Health`.
//!
//! The library holds everything but argument parsing: the gRPC handler ([`KeyService`]),
//! [`serve`] over any stream of connections, binding of plaintext listeners ([`Listener::bind`] on an
//! [`asterism_kms::KeyServiceAddress`]),
//! and reading of the secret files ([`read_secret_file`]).
//!
//! It must never log, return or keep a copy of key material, and it must never serve
//! plaintext anywhere but on a Unix socket or a loopback address: any peer that can connect
//! can obtain every key.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use asterism_key_service::{KeyService, serve};
//! use asterism_kms::{ClusterKms, MasterSecret, Salt};
//! use tokio_stream::wrappers::TcpListenerStream;
//!
//! let kms = ClusterKms::new(MasterSecret::generate()?, Salt::generate()?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! serve(TcpListenerStream::new(listener), KeyService::new(kms), async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod listen;
mod secret_file;
mod serve;
mod service;

pub use asterism_binkit::socket::{PrivateSocket, SocketError, SocketFile};
pub use listen::{BindError, Listener};
pub use secret_file::{MAX_SECRET_FILE_LEN, SecretFileError, read_secret_file};
pub use serve::{
    ATLS_CONNECTIONS, ATLS_LIMITS, BoxError, LIMITS, Limits, ServeError, serve, serve_with_limits,
};
pub use service::{
    AuthorizationError, DataKeyRequest, KeyService, MAX_KEY_LEN, RequestError, authorize_attested,
};
