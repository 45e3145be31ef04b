//! [`MetadataServer`]: the metadata service over plain HTTP, identifying callers by their
//! source address.

use crate::instance::{control_plane_endpoint, find_by_ip};
use crate::{ConfigError, InstanceMetadata};
use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Largest configuration file read.
pub const MAX_CONFIG_LEN: u64 = 4 * 1024 * 1024;
/// Connections served at once; further ones wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections one source address may hold at once; the next is closed at once. Without
/// it one source could hold every connection and keep every node, and the join service,
/// from the listing.
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 16;
/// Deadline for a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection may stay open.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// How long open connections may finish after shutdown began.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// The service's configuration file: `{"instances": [...], "initSecretHash": "$2b$…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataConfig {
    /// Every instance of the cluster.
    pub instances: Vec<InstanceMetadata>,
    /// The bcrypt hash of the init secret.
    #[serde(rename = "initSecretHash", default)]
    pub init_secret_hash: String,
}

impl MetadataConfig {
    /// Parses and checks a configuration: every VPC IP is an address, and no two instances
    /// share a name or a VPC IP (matching by source address would be ambiguous).
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let config: Self = serde_json::from_slice(bytes).map_err(ConfigError::Json)?;
        config.check()?;
        Ok(config)
    }

    /// Reads and checks the configuration file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let bytes = asterism_basics::read_file_capped(path, MAX_CONFIG_LEN)
            .map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?
            .ok_or_else(|| ConfigError::TooLarge {
                path: path.to_owned(),
                cap: MAX_CONFIG_LEN,
            })?;
        Self::from_json(&bytes)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let mut names = HashSet::new();
        let mut ips = HashSet::new();
        for i in &self.instances {
            if i.name.is_empty() {
                return Err(ConfigError::Invalid("an instance has an empty Name".into()));
            }
            let ip = i.vpc_ip_addr().ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "instance {:?} has VPCIP {:?}, which is not an IP address",
                    i.name, i.vpc_ip
                ))
            })?;
            if !names.insert(i.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "two instances are named {:?}",
                    i.name
                )));
            }
            if !ips.insert(ip) {
                return Err(ConfigError::Invalid(format!(
                    "two instances have VPCIP {ip}"
                )));
            }
        }
        Ok(())
    }
}

/// The metadata service: answers `GET /self` (the caller's own record, by source
/// address), `/peers`, `/endpoint` and `/initsecrethash` from a [`MetadataConfig`].
///
/// [`MetadataServer::respond`] is the whole protocol as a pure function; [`serve`] puts it
/// on a TCP listener with hyper.
#[derive(Debug, Clone)]
pub struct MetadataServer {
    config: Arc<MetadataConfig>,
}

impl MetadataServer {
    /// A server answering from `config`.
    pub fn new(config: MetadataConfig) -> Self {
        Self {
            config: Arc::new(config),
        }
    }

    /// The answer to a request of `method` on `path` from source address `peer`.
    /// `has_body` says whether the request carried (or announced) a body, which is refused.
    pub fn respond(
        &self,
        method: &Method,
        path: &str,
        peer: IpAddr,
        has_body: bool,
    ) -> Response<Full<Bytes>> {
        if method != Method::GET && method != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is supported\n");
        }
        if has_body {
            return text(StatusCode::BAD_REQUEST, "request bodies are not accepted\n");
        }
        let instances = &self.config.instances;
        match path {
            "/self" => match find_by_ip(instances, peer) {
                Some(instance) => json(instance),
                None => {
                    tracing::info!(%peer, "no instance has the caller's address");
                    text(
                        StatusCode::NOT_FOUND,
                        "no instance has the caller's address\n",
                    )
                }
            },
            "/peers" => json(instances),
            "/endpoint" => match control_plane_endpoint(instances) {
                Some(host) => json(&host),
                None => text(StatusCode::NOT_FOUND, "no control-plane instance\n"),
            },
            "/initsecrethash" => Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Full::new(Bytes::from(self.config.init_secret_hash.clone())))
                .unwrap_or_else(|_| internal()),
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    /// Serves on `listener` until `shutdown` completes, then lets open connections finish
    /// for up to [`SHUTDOWN_DRAIN`].
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let per_source = asterism_basics::shares::Shares::new(MAX_CONNECTIONS_PER_SOURCE);
        let mut connections = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                () = &mut shutdown => break,
                permit = permits.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, addr) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(source) = per_source.take(addr.ip().to_canonical()) else {
                tracing::debug!(peer = %addr, max = MAX_CONNECTIONS_PER_SOURCE, "closing a connection: its source holds the most it may");
                continue;
            };
            // Reap finished connection tasks so the set does not grow without bound.
            while connections.try_join_next().is_some() {}
            let server = self.clone();
            let mut stop = stop_rx.clone();
            connections.spawn(async move {
                let _permit = permit;
                let _source = source;
                let peer = addr.ip().to_canonical();
                let service = service_fn(move |req: http::Request<Incoming>| {
                    let server = server.clone();
                    async move {
                        let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
                            || req
                                .headers()
                                .get(header::CONTENT_LENGTH)
                                .is_some_and(|v| v.as_bytes() != b"0");
                        let response =
                            server.respond(req.method(), req.uri().path(), peer, has_body);
                        tracing::debug!(%peer, path = req.uri().path(), status = response.status().as_u16(), "metadata request");
                        Ok::<_, Infallible>(response)
                    }
                });
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_buf_size(16 * 1024);
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                let mut conn = std::pin::pin!(conn);
                let age = tokio::time::sleep(MAX_CONNECTION_AGE);
                let mut age = std::pin::pin!(age);
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(%peer, error = %e, "metadata connection ended with an error");
                        }
                        return;
                    }
                    _ = stop.wait_for(|s| *s) => {}
                    () = &mut age => {}
                }
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(SHUTDOWN_DRAIN, conn).await;
            });
        }
        drop(listener);
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(SHUTDOWN_DRAIN + Duration::from_secs(1), async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            connections.abort_all();
        }
        Ok(())
    }
}

/// Serves `config` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    config: MetadataConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    MetadataServer::new(config).serve(listener, shutdown).await
}

fn json<T: Serialize + ?Sized>(value: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_else(|_| internal()),
        Err(_) => internal(),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_else(|_| internal())
}

fn internal() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"internal error\n")));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Role;
    use http_body_util::BodyExt;

    fn config() -> MetadataConfig {
        MetadataConfig::from_json(
            br#"{"instances": [
                {"Name": "cp-0", "ProviderID": "asterism-local:///cp-0", "Role": "ControlPlane", "VPCIP": "127.0.10.1", "SecondaryIPRange": "", "AliasIPRanges": []},
                {"Name": "worker-0", "ProviderID": "asterism-local:///worker-0", "Role": "Worker", "VPCIP": "127.0.10.2", "SecondaryIPRange": "", "AliasIPRanges": []}
            ], "initSecretHash": "$2b$10$abc"}"#,
        )
        .unwrap()
    }

    async fn body(r: Response<Full<Bytes>>) -> Vec<u8> {
        r.into_body().collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn self_is_the_instance_with_the_callers_address() {
        let s = MetadataServer::new(config());
        let r = s.respond(&Method::GET, "/self", "127.0.10.2".parse().unwrap(), false);
        assert_eq!(r.status(), StatusCode::OK);
        let i: InstanceMetadata = serde_json::from_slice(&body(r).await).unwrap();
        assert_eq!(i.name, "worker-0");
        assert_eq!(i.role, Role::Worker);
    }

    #[tokio::test]
    async fn self_for_an_unknown_address_is_404() {
        let s = MetadataServer::new(config());
        let r = s.respond(&Method::GET, "/self", "127.0.10.9".parse().unwrap(), false);
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn other_methods_and_bodies_are_refused() {
        let s = MetadataServer::new(config());
        let peer = "127.0.10.1".parse().unwrap();
        assert_eq!(
            s.respond(&Method::POST, "/self", peer, false).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            s.respond(&Method::GET, "/self", peer, true).status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            s.respond(&Method::GET, "/nope", peer, false).status(),
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn endpoint_and_init_secret_hash_have_their_formats() {
        let s = MetadataServer::new(config());
        let peer = "127.0.10.2".parse().unwrap();
        let r = s.respond(&Method::GET, "/endpoint", peer, false);
        assert_eq!(body(r).await, br#""127.0.10.1""#);
        let r = s.respond(&Method::GET, "/initsecrethash", peer, false);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/plain");
        assert_eq!(body(r).await, b"$2b$10$abc");
    }

    #[test]
    fn configs_with_ambiguous_or_bad_addresses_are_refused() {
        let dup_ip = br#"{"instances": [{"Name": "a", "VPCIP": "127.0.10.1"}, {"Name": "b", "VPCIP": "127.0.10.1"}]}"#;
        assert!(matches!(
            MetadataConfig::from_json(dup_ip),
            Err(ConfigError::Invalid(_))
        ));
        let dup_name = br#"{"instances": [{"Name": "a", "VPCIP": "127.0.10.1"}, {"Name": "a", "VPCIP": "127.0.10.2"}]}"#;
        assert!(MetadataConfig::from_json(dup_name).is_err());
        let bad_ip = br#"{"instances": [{"Name": "a", "VPCIP": "node-a"}]}"#;
        assert!(MetadataConfig::from_json(bad_ip).is_err());
        let unknown = br#"{"instances": [], "extra": 1}"#;
        assert!(matches!(
            MetadataConfig::from_json(unknown),
            Err(ConfigError::Json(_))
        ));
    }
}
