//! [`AnyMetadata`]: the metadata a program's `--metadata-url` names, one parser for every
//! program that takes it.

use crate::gce::{ClusterLabel, GceConfig, GceMetadata, ProjectId};
use crate::instance::control_plane_endpoint;
use crate::{ConfigError, HttpMetadata, InstanceMetadata, Metadata, MetadataConfig, MetadataError};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use std::net::IpAddr;
use std::path::PathBuf;

/// Largest `compute-ca` file read.
const MAX_CA_FILE: u64 = 1024 * 1024;

/// The cluster's metadata, from where `--metadata-url` says:
///
/// * `http://HOST:PORT[/PREFIX]`: the metadata service (`asterism-metadata`, docs/metadata.md);
/// * `gce://PROJECT/CLUSTER`: GCE's Compute Engine API, the instances of `PROJECT` labelled
///   `asterism-cluster=CLUSTER` ([`crate::gce`]). Optional query parameters, for a private
///   endpoint or a test: `compute=https://…` (the API), `compute-ca=PATH` (a PEM bundle of
///   the roots the API's certificate must chain to, in place of the public roots),
///   `metadata-server=http://…`;
/// * `file:PATH`: the owner's roster, a file in the metadata service's configuration format
///   (docs/metadata.md), read again for every question, so that a roster the owner updates
///   counts from the next request. It names no instance as "this node": it is for the join
///   service, whose decisions need only the list, not for a node's bootstrapper.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per program, made once at start
pub enum AnyMetadata {
    /// The metadata service.
    Service(HttpMetadata),
    /// GCE.
    Gce(GceMetadata),
    /// The owner's roster file.
    Roster(PathBuf),
}

impl AnyMetadata {
    /// Parses `url` (type docs).
    pub fn from_url(url: &str) -> Result<Self, MetadataError> {
        Self::parse(url, true)
    }

    /// Checks `url` as [`AnyMetadata::from_url`] does, for a program that will run
    /// elsewhere (the CLI, for the join service it deploys): a `compute-ca` file is not read
    /// here, only required to be an absolute path.
    pub fn check_url(url: &str) -> Result<(), MetadataError> {
        Self::parse(url, false).map(drop)
    }

    fn parse(url: &str, read_files: bool) -> Result<Self, MetadataError> {
        let invalid = |reason: String| MetadataError::InvalidUrl {
            url: url.to_owned(),
            reason,
        };
        if let Some(path) = url.strip_prefix("file:") {
            if !path.starts_with('/') {
                return Err(invalid("file:PATH needs an absolute path".into()));
            }
            return Ok(Self::Roster(PathBuf::from(path)));
        }
        let Some(rest) = url.strip_prefix("gce://") else {
            return HttpMetadata::new(url).map(Self::Service);
        };
        let (target, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (project, cluster) = target
            .split_once('/')
            .ok_or_else(|| invalid("gce://PROJECT/CLUSTER".into()))?;
        let mut config = GceConfig::new(
            ProjectId::parse(project).map_err(&invalid)?,
            ClusterLabel::parse(cluster).map_err(&invalid)?,
        );
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| invalid(format!("{pair:?} is not KEY=VALUE")))?;
            match key {
                "compute" => config.compute_api = value.to_owned(),
                "metadata-server" => config.metadata_server = value.to_owned(),
                "compute-ca" if read_files => {
                    config.compute_roots = read_roots(value).map_err(&invalid)?;
                }
                "compute-ca" if !value.starts_with('/') => {
                    return Err(invalid("compute-ca needs an absolute path".into()));
                }
                "compute-ca" => {}
                _ => {
                    return Err(invalid(format!(
                        "unknown parameter {key:?} (compute, compute-ca, metadata-server)"
                    )));
                }
            }
        }
        GceMetadata::new(config).map(Self::Gce)
    }

    /// The roster at `path`, read and checked (off the runtime's threads: a file read).
    async fn roster(path: &std::path::Path) -> Result<MetadataConfig, MetadataError> {
        let owned = path.to_owned();
        tokio::task::spawn_blocking(move || MetadataConfig::load(&owned))
            .await
            .map_err(|e| MetadataError::Roster {
                path: path.to_owned(),
                source: ConfigError::Invalid(format!("the read did not finish: {e}")),
            })?
            .map_err(|source| MetadataError::Roster {
                path: path.to_owned(),
                source,
            })
    }

    /// Replaces the metadata service's per-call deadline. GCE's calls keep theirs
    /// ([`crate::gce::CALL_TIMEOUT`]); callers bound the whole of each question as well.
    #[must_use]
    pub fn with_timeout(self, timeout: std::time::Duration) -> Self {
        match self {
            Self::Service(m) => Self::Service(m.with_timeout(timeout)),
            other => other,
        }
    }

    /// Binds the metadata service's connections to `ip`, which is how it tells nodes
    /// apart. GCE's API knows its callers by their credentials; it is left as it is.
    #[must_use]
    pub fn with_local_address(self, ip: IpAddr) -> Self {
        match self {
            Self::Service(m) => Self::Service(m.with_local_address(ip)),
            other => other,
        }
    }
}

/// The roots of a PEM bundle at `path`.
fn read_roots(path: &str) -> Result<rustls::RootCertStore, String> {
    let pem = asterism_basics::read_file_capped(std::path::Path::new(path), MAX_CA_FILE)
        .map_err(|e| format!("compute-ca {path}: {e}"))?
        .ok_or_else(|| format!("compute-ca {path}: larger than {MAX_CA_FILE} bytes"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("compute-ca {path}: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("compute-ca {path}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("compute-ca {path}: no certificate"));
    }
    Ok(roots)
}

impl std::fmt::Display for AnyMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Service(m) => f.write_str(m.base_url()),
            Self::Roster(path) => write!(f, "file:{}", path.display()),
            Self::Gce(m) => {
                let c = m.config();
                write!(
                    f,
                    "gce://{}/{} (API {})",
                    c.project.as_str(),
                    c.cluster.as_str(),
                    c.compute_api
                )
            }
        }
    }
}

impl Metadata for AnyMetadata {
    async fn self_instance(&self) -> Result<InstanceMetadata, MetadataError> {
        match self {
            Self::Service(m) => m.self_instance().await,
            Self::Gce(m) => m.self_instance().await,
            Self::Roster(path) => Err(MetadataError::Roster {
                path: path.clone(),
                source: ConfigError::Invalid(
                    "a roster names no instance as this node; a node's bootstrapper needs the \
                     metadata service or its cloud's"
                        .into(),
                ),
            }),
        }
    }

    async fn list(&self) -> Result<Vec<InstanceMetadata>, MetadataError> {
        match self {
            Self::Service(m) => m.list().await,
            Self::Gce(m) => m.list().await,
            Self::Roster(path) => Ok(Self::roster(path).await?.instances),
        }
    }

    async fn control_plane_endpoint(&self) -> Result<String, MetadataError> {
        match self {
            Self::Service(m) => m.control_plane_endpoint().await,
            Self::Gce(m) => m.control_plane_endpoint().await,
            Self::Roster(path) => control_plane_endpoint(&Self::roster(path).await?.instances)
                .map(str::to_owned)
                .ok_or(MetadataError::Status {
                    path: "/endpoint",
                    status: 404,
                }),
        }
    }

    async fn init_secret_hash(&self) -> Result<String, MetadataError> {
        match self {
            Self::Service(m) => m.init_secret_hash().await,
            Self::Gce(m) => m.init_secret_hash().await,
            Self::Roster(path) => Ok(Self::roster(path).await?.init_secret_hash),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_url_names_the_service_or_a_gce_cluster() {
        assert!(matches!(
            AnyMetadata::from_url("http://10.0.0.254:8080").unwrap(),
            AnyMetadata::Service(_)
        ));
        assert_eq!(
            AnyMetadata::from_url("file:/var/trust/roster.json")
                .unwrap()
                .to_string(),
            "file:/var/trust/roster.json"
        );
        let gce = AnyMetadata::from_url("gce://my-project/prod").unwrap();
        assert_eq!(
            gce.to_string(),
            "gce://my-project/prod (API https://compute.googleapis.com)"
        );
        for bad in [
            "gce://my-project",
            "gce://My-Project/prod",
            "gce://my-project/Prod",
            "gce://my-project/prod?compute=http://compute.googleapis.com",
            "gce://my-project/prod?zone=x",
            "gce://my-project/prod?compute-ca=/nonexistent",
            "ftp://x",
            "file:relative/roster.json",
        ] {
            assert!(AnyMetadata::from_url(bad).is_err(), "{bad}");
            if !bad.contains("compute-ca") {
                assert!(AnyMetadata::check_url(bad).is_err(), "{bad}");
            }
        }
        // Checked for elsewhere: the CA file is that machine's, not read here.
        AnyMetadata::check_url("gce://p/c?compute-ca=/etc/ssl/private-api-ca.pem").unwrap();
        assert!(AnyMetadata::check_url("gce://p/c?compute-ca=ca.pem").is_err());
    }
}
