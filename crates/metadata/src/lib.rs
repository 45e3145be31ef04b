//! Instance metadata for Asterism: which instances form the cluster, their roles and
//! addresses, the control-plane endpoint and the init-secret hash.
//!
//! * [`InstanceMetadata`] and [`Role`], serialised with the JSON field names the
//!   metadata service and existing peers use (docs/metadata.md).
//! * The [`Metadata`] trait, the narrow seam every program uses; implemented by
//!   [`HttpMetadata`] (a client of the metadata service) and [`StaticMetadata`] (in memory,
//!   for tests).
//! * [`gce::GceMetadata`]: the cluster's instances and roles from GCE's Compute Engine API,
//!   by the labels the owner set; [`AnyMetadata`] is the one a program's `--metadata-url`
//!   names (`http://…` for the metadata service, `gce://PROJECT/CLUSTER` on GCE).
//! * [`imds::Imds`]: a client for a cloud's instance metadata service, for what a
//!   confidential VM's evidence needs from it (Azure THIM's VCEK, Azure's TDX quotes).
//! * [`node_settings`]: a node's own settings (addresses, host name, the cluster to join),
//!   from the one place its platform keeps them: fw_cfg, SMBIOS OEM strings, a file on the
//!   ESP, or GCE's, Azure's or AWS's instance metadata.
//! * [`MetadataServer`]: the local metadata service, which identifies the caller of `GET
//!   /self` by its source address, as cloud metadata services do by VPC IP. The
//!   `asterism-metadata` program around it is the package `asterism-metadata-server`, so
//!   that this library carries no argument parser or log subscriber.
//!
//! Metadata is **not** a security boundary on its own: it says who a node claims to be by
//! its address. The join service combines it with attestation. The only secret this crate
//! holds is GCE's access token for the Compute Engine API, in a type that redacts and
//! zeroes it (the init secret's *hash* is public by design).
#![forbid(unsafe_code)]

mod any;
mod call;
mod client;
pub mod gce;
pub mod imds;
mod instance;
pub mod node_settings;
mod server;

pub use any::AnyMetadata;
pub use client::{DEFAULT_TIMEOUT, HttpMetadata, MAX_RESPONSE_LEN};
pub use instance::{InstanceMetadata, Role, control_plane_endpoint, find_by_ip};
pub use server::{
    HEADER_READ_TIMEOUT, MAX_CONFIG_LEN, MAX_CONNECTION_AGE, MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_SOURCE, MetadataConfig, MetadataServer, SHUTDOWN_DRAIN, serve,
};

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Why a metadata call failed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The service URL is unusable.
    #[error("metadata URL {url:?} is unusable: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The request failed on the way (connect, I/O, HTTP framing).
    #[error("metadata request GET {path} failed")]
    Request {
        /// The request path.
        path: &'static str,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The call did not complete within its deadline.
    #[error("metadata request GET {path} did not complete within {after:?}")]
    Timeout {
        /// The request path.
        path: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// The service answered with a status other than 200 (404 for `/self`: the caller's
    /// address belongs to no instance).
    #[error("metadata request GET {path} answered HTTP {status}")]
    Status {
        /// The request path.
        path: &'static str,
        /// The HTTP status code.
        status: u16,
    },
    /// The response body exceeded the cap.
    #[error("metadata response to GET {path} exceeds {cap} bytes")]
    BodyTooLarge {
        /// The request path.
        path: &'static str,
        /// The cap.
        cap: usize,
    },
    /// The response was not the expected JSON.
    #[error("metadata response to GET {path} is not the expected JSON")]
    Decode {
        /// The request path.
        path: &'static str,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// The response was not UTF-8 text.
    #[error("metadata response to GET {path} is not UTF-8 text")]
    NotUtf8 {
        /// The request path.
        path: &'static str,
    },
    /// The owner's roster file (`file:PATH`) cannot be read or is refused.
    #[error("the roster {} is unusable", path.display())]
    Roster {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: ConfigError,
    },
    /// The response parsed, but says something unusable: a partial or ambiguous listing,
    /// a token that is not a bearer token, an answer without the header its server sends.
    #[error("metadata response to GET {path} is refused: {reason}")]
    Malformed {
        /// The request path.
        path: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl MetadataError {
    /// Whether the service said "not found" (for `/self`: this node is not in the metadata;
    /// for `/endpoint`: there is no control-plane instance).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status: 404, .. })
    }
}

/// Why a metadata configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read metadata configuration {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_LEN`].
    #[error("metadata configuration {} is larger than {cap} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The cap.
        cap: u64,
    },
    /// The file is not the expected JSON.
    #[error("metadata configuration is not valid JSON of the expected shape")]
    Json(#[source] serde_json::Error),
    /// The content is inconsistent.
    #[error("metadata configuration: {0}")]
    Invalid(String),
}

/// The cloud metadata seam: what a node learns about itself and the
/// cluster from its platform.
///
/// Methods return `Send` futures, so implementations can be used from spawned tasks; use it
/// as a generic parameter (`M: Metadata`).
pub trait Metadata: Send + Sync {
    /// This node's own record (`GET /self`).
    fn self_instance(&self)
    -> impl Future<Output = Result<InstanceMetadata, MetadataError>> + Send;

    /// All instances of the cluster (`GET /peers`).
    fn list(&self) -> impl Future<Output = Result<Vec<InstanceMetadata>, MetadataError>> + Send;

    /// The control-plane endpoint host, without port (`GET /endpoint`); the API server is on
    /// port 6443 of it.
    fn control_plane_endpoint(&self) -> impl Future<Output = Result<String, MetadataError>> + Send;

    /// The bcrypt hash of the init secret (`GET /initsecrethash`).
    fn init_secret_hash(&self) -> impl Future<Output = Result<String, MetadataError>> + Send;
}

impl<M: Metadata> Metadata for Arc<M> {
    fn self_instance(
        &self,
    ) -> impl Future<Output = Result<InstanceMetadata, MetadataError>> + Send {
        (**self).self_instance()
    }

    fn list(&self) -> impl Future<Output = Result<Vec<InstanceMetadata>, MetadataError>> + Send {
        (**self).list()
    }

    fn control_plane_endpoint(&self) -> impl Future<Output = Result<String, MetadataError>> + Send {
        (**self).control_plane_endpoint()
    }

    fn init_secret_hash(&self) -> impl Future<Output = Result<String, MetadataError>> + Send {
        (**self).init_secret_hash()
    }
}

/// In-memory metadata, for tests: a fixed list of instances, which of them is "self", and
/// an init-secret hash. Errors mimic the HTTP service (404 for a missing self or endpoint).
#[derive(Debug, Clone, Default)]
pub struct StaticMetadata {
    instances: Vec<InstanceMetadata>,
    self_name: Option<String>,
    init_secret_hash: String,
}

impl StaticMetadata {
    /// Metadata listing `instances`, with no self and an empty init-secret hash.
    pub fn new(instances: Vec<InstanceMetadata>) -> Self {
        Self {
            instances,
            ..Self::default()
        }
    }

    /// The instance named `name` is this node.
    #[must_use]
    pub fn with_self(mut self, name: impl Into<String>) -> Self {
        self.self_name = Some(name.into());
        self
    }

    /// Sets the init-secret hash.
    #[must_use]
    pub fn with_init_secret_hash(mut self, hash: impl Into<String>) -> Self {
        self.init_secret_hash = hash.into();
        self
    }
}

impl Metadata for StaticMetadata {
    async fn self_instance(&self) -> Result<InstanceMetadata, MetadataError> {
        self.self_name
            .as_deref()
            .and_then(|name| self.instances.iter().find(|i| i.name == name))
            .cloned()
            .ok_or(MetadataError::Status {
                path: "/self",
                status: 404,
            })
    }

    async fn list(&self) -> Result<Vec<InstanceMetadata>, MetadataError> {
        Ok(self.instances.clone())
    }

    async fn control_plane_endpoint(&self) -> Result<String, MetadataError> {
        control_plane_endpoint(&self.instances)
            .map(str::to_owned)
            .ok_or(MetadataError::Status {
                path: "/endpoint",
                status: 404,
            })
    }

    async fn init_secret_hash(&self) -> Result<String, MetadataError> {
        Ok(self.init_secret_hash.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn static_metadata_answers_like_the_service() {
        let cp = InstanceMetadata {
            name: "cp-0".into(),
            role: Role::ControlPlane,
            vpc_ip: "127.0.10.1".into(),
            ..Default::default()
        };
        let m = StaticMetadata::new(vec![cp.clone()]).with_init_secret_hash("$2b$x");
        assert!(m.self_instance().await.unwrap_err().is_not_found());
        let m = m.with_self("cp-0");
        assert_eq!(m.self_instance().await.unwrap(), cp);
        assert_eq!(m.control_plane_endpoint().await.unwrap(), "127.0.10.1");
        assert_eq!(m.init_secret_hash().await.unwrap(), "$2b$x");
        let shared = Arc::new(m);
        assert_eq!(shared.list().await.unwrap(), vec![cp]);
    }
}
