//! [`GceMetadata`]: the cluster's instances, their roles and addresses from GCE's Compute
//! Engine API, for nodes and join services that run on GCE.
//!
//! Who is in the cluster, and in which role, is the owner's record: the labels the owner
//! set on the instances (`asterism-cluster=<cluster>`, `asterism-role=control-plane` or
//! `worker`), read from the Compute Engine API over TLS checked against public roots. The
//! labels are never read from anything the node or the hypervisor serves: the metadata
//! server does not serve labels, and its instance attributes are not read for them. The
//! project and the cluster come from this program's arguments (for the join service, the
//! manifests the owner's CLI wrote), never from the metadata server: a metadata server that
//! named another project would name another owner's record.
//!
//! The metadata server (plain HTTP on the link-local address, `Metadata-Flavor: Google`)
//! gives only what it cannot lie about to our harm: the instance's own name (a wrong one
//! makes the node not find itself), the service account's access token for the API (a
//! wrong one is refused by the API), and the init secret's hash (public by design).
//!
//! Every call has a deadline ([`CALL_TIMEOUT`]) and a body cap; a listing has at most
//! [`MAX_PAGES`] pages of at most [`MAX_PAGE_LEN`] bytes. A listing that is partial (a zone
//! unreachable), or in which two instances share a name or an address, is refused whole:
//! a role is decided on a whole, unambiguous record or not at all.

use crate::call::{self, CallError};
use crate::instance::control_plane_endpoint;
use crate::{InstanceMetadata, Metadata, MetadataError, Role};
use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// The Compute Engine API. <https://cloud.google.com/compute/docs/reference/rest/v1>
pub const COMPUTE_API_URL: &str = "https://compute.googleapis.com";
/// GCE's metadata server, by address (it is also `metadata.google.internal`).
/// <https://cloud.google.com/compute/docs/metadata/querying-metadata>
pub const METADATA_SERVER_URL: &str = "http://169.254.169.254";
/// The label whose value names the cluster an instance belongs to.
pub const CLUSTER_LABEL: &str = "asterism-cluster";
/// The label whose value is the instance's role: `control-plane` or `worker`.
pub const ROLE_LABEL: &str = "asterism-role";
/// The instance attribute that holds the bcrypt hash of the init secret.
pub const INIT_SECRET_HASH_ATTRIBUTE: &str = "asterism-init-secret-hash";
/// Deadline of one call: connect, request, answer headers and body.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest page of a listing. A page holds at most [`PAGE_SIZE`] instances, each with only
/// the fields asked for.
pub const MAX_PAGE_LEN: usize = 8 * 1024 * 1024;
/// Instances asked for per page (the API's largest `maxResults`).
pub const PAGE_SIZE: usize = 500;
/// Pages of a listing: at most `MAX_PAGES × PAGE_SIZE` instances.
pub const MAX_PAGES: usize = 16;
/// Largest answer of the metadata server (a name, a token, a hash).
pub const MAX_TEXT_ANSWER: usize = 8 * 1024;
/// A token is used until this long before it expires, then fetched again.
pub const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// The longest a token is kept, whatever its answer says: GCE's tokens last an hour.
pub const TOKEN_MAX_LIFETIME: Duration = Duration::from_secs(3600);
/// Deadline of a whole listing, every page: under the join service's 30 s per request, so
/// that a slow API fails a request rather than letting none ever finish.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(20);

const FLAVOR: (&str, &str) = ("metadata-flavor", "Google");
/// <https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys>
const NAME_PATH: &str = "/computeMetadata/v1/instance/name";
/// <https://cloud.google.com/compute/docs/access/authenticate-workloads#applications>
const TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// The access scopes of the instance's service account, one per line.
/// <https://cloud.google.com/compute/docs/access/service-accounts#accesscopesiam>
const SCOPES_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/scopes";
/// Scopes that let the token change instances (their labels among them): refused, so that
/// no node runs with a token that could make it the control plane.
/// <https://developers.google.com/identity/protocols/oauth2/scopes#compute>
pub const WRITE_SCOPES: [&str; 2] = [
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/compute",
];
/// <https://cloud.google.com/compute/docs/metadata/querying-metadata>
const INIT_SECRET_HASH_PATH: &str =
    "/computeMetadata/v1/instance/attributes/asterism-init-secret-hash";
/// What the errors name for a listing.
const LIST_PATH: &str = "/compute/v1/projects/{project}/aggregated/instances";
/// What the errors name when this instance is not in the listing.
const SELF_PATH: &str = "/compute/v1/projects/{project}/aggregated/instances (this instance)";
const ENDPOINT_PATH: &str =
    "/compute/v1/projects/{project}/aggregated/instances (a control-plane instance)";
/// Only the fields used, so that a page stays small: the standard `fields` parameter.
/// <https://cloud.google.com/compute/docs/api/how-tos/performance#partial-response>
const FIELDS: &str = "items/*/instances(name,zone,labels,networkInterfaces(networkIP,aliasIpRanges)),items/*/warning/code,nextPageToken,unreachables,warning/code";

/// A GCE project ID: lowercase letters, digits, hyphens (and the `domain:` prefix of
/// domain-scoped projects), starting with a letter.
/// <https://cloud.google.com/resource-manager/docs/creating-managing-projects>
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectId(String);

impl ProjectId {
    /// Checks `s`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let ok = (1..=100).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && !s.ends_with(['-', '.', ':'])
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(c));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(format!(
                "{s:?} is not a GCE project ID (lowercase letters, digits and hyphens, starting with a letter)"
            ))
        }
    }

    /// The ID.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A GCE label value that names the cluster: 1 to 63 lowercase letters, digits, `-`, `_`.
/// <https://cloud.google.com/compute/docs/labeling-resources#requirements>
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLabel(String);

impl ClusterLabel {
    /// Checks `s`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let ok = (1..=63).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(format!(
                "{s:?} is not a GCE label value (1 to 63 lowercase letters, digits, '-' and '_')"
            ))
        }
    }

    /// The value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where a [`GceMetadata`] reads, and which cluster.
#[derive(Clone)]
pub struct GceConfig {
    /// The project whose instances form the cluster.
    pub project: ProjectId,
    /// The value of [`CLUSTER_LABEL`] on the cluster's instances.
    pub cluster: ClusterLabel,
    /// The Compute Engine API's base URL; `https` only ([`COMPUTE_API_URL`]).
    pub compute_api: String,
    /// The roots the API's certificate must chain to (Mozilla's, compiled in, by default).
    pub compute_roots: rustls::RootCertStore,
    /// The metadata server's base URL ([`METADATA_SERVER_URL`]).
    pub metadata_server: String,
}

impl std::fmt::Debug for GceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceConfig")
            .field("project", &self.project)
            .field("cluster", &self.cluster)
            .field("compute_api", &self.compute_api)
            .field("compute_roots", &self.compute_roots.len())
            .field("metadata_server", &self.metadata_server)
            .finish()
    }
}

impl GceConfig {
    /// The cluster `cluster` of `project`, on GCE's own services.
    pub fn new(project: ProjectId, cluster: ClusterLabel) -> Self {
        Self {
            project,
            cluster,
            compute_api: COMPUTE_API_URL.to_owned(),
            compute_roots: rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
            metadata_server: METADATA_SERVER_URL.to_owned(),
        }
    }
}

/// An OAuth access token of the instance's service account. It grants what that account
/// may do in the project, so it is kept out of every `Debug` and log and zeroed when
/// dropped.
struct AccessToken(Zeroizing<String>);

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken([redacted])")
    }
}

/// The metadata server's token answer.
#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(deserialize_with = "zeroizing")]
    access_token: Zeroizing<String>,
    expires_in: u64,
    token_type: String,
}

fn zeroizing<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Zeroizing<String>, D::Error> {
    String::deserialize(d).map(Zeroizing::new)
}

/// One page of `instances.aggregatedList`, only the fields asked for.
/// <https://cloud.google.com/compute/docs/reference/rest/v1/instances/aggregatedList>
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    #[serde(default)]
    items: BTreeMap<String, Scope>,
    next_page_token: Option<String>,
    #[serde(default)]
    unreachables: Vec<String>,
    warning: Option<Warning>,
}

#[derive(Deserialize)]
struct Scope {
    #[serde(default)]
    instances: Vec<Instance>,
    warning: Option<Warning>,
}

/// A listing's or a zone's warning: `UNREACHABLE` says the listing is partial.
#[derive(Deserialize)]
struct Warning {
    #[serde(default)]
    code: String,
}

impl Warning {
    fn partial(w: Option<&Self>) -> bool {
        w.is_some_and(|w| w.code == "UNREACHABLE")
    }
}

/// <https://cloud.google.com/compute/docs/reference/rest/v1/instances>
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instance {
    name: String,
    zone: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    network_interfaces: Vec<NetworkInterface>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkInterface {
    #[serde(rename = "networkIP")]
    network_ip: Option<String>,
    #[serde(default)]
    alias_ip_ranges: Vec<AliasIpRange>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AliasIpRange {
    ip_cidr_range: String,
}

/// The cluster's metadata on GCE (module docs).
#[derive(Clone)]
pub struct GceMetadata(Arc<Inner>);

/// A token and when to stop using it.
type CachedToken = (Arc<AccessToken>, Instant);

struct Inner {
    config: GceConfig,
    compute: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    metadata: Client<HttpConnector, Empty<Bytes>>,
    token: Mutex<Option<CachedToken>>,
}

impl std::fmt::Debug for GceMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceMetadata")
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

impl GceMetadata {
    /// A client for `config`. The API must be `https`: the service account's token goes
    /// with every call.
    pub fn new(config: GceConfig) -> Result<Self, MetadataError> {
        let invalid = |url: &str, reason: &str| MetadataError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let compute_uri: http::Uri = config
            .compute_api
            .parse()
            .map_err(|_| invalid(&config.compute_api, "not a URL"))?;
        if compute_uri.scheme_str() != Some("https") {
            return Err(invalid(
                &config.compute_api,
                "the Compute Engine API must be https: the access token goes with every call",
            ));
        }
        if compute_uri.query().is_some() || compute_uri.authority().is_none() {
            return Err(invalid(&config.compute_api, "a host, with no query"));
        }
        let metadata_server = call::base_url(&config.metadata_server)
            .map_err(|reason| invalid(&config.metadata_server, reason))?;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(&config.compute_api, &e.to_string()))?
        .with_root_certificates(config.compute_roots.clone())
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CALL_TIMEOUT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let compute = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(2)
            .build(connector);
        let config = GceConfig {
            compute_api: config.compute_api.trim_end_matches('/').to_owned(),
            metadata_server,
            ..config
        };
        Ok(Self(Arc::new(Inner {
            config,
            compute,
            metadata: call::client(None, CALL_TIMEOUT),
            token: Mutex::new(None),
        })))
    }

    /// The configuration in use.
    pub fn config(&self) -> &GceConfig {
        &self.0.config
    }

    /// `GET` on the metadata server, with and checking `Metadata-Flavor: Google`.
    async fn metadata_get(&self, path: &'static str) -> Result<Bytes, MetadataError> {
        let url = format!("{}{path}", self.0.config.metadata_server);
        let request = Request::get(url.as_str())
            .header(FLAVOR.0, FLAVOR.1)
            .body(Empty::<Bytes>::new())
            .map_err(|e| MetadataError::InvalidUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let (headers, body) =
            call::call_with_headers(&self.0.metadata, request, MAX_TEXT_ANSWER, CALL_TIMEOUT)
                .await
                .map_err(|e| call_error(path, e))?;
        if headers.get(FLAVOR.0).and_then(|v| v.to_str().ok()) != Some(FLAVOR.1) {
            return Err(MetadataError::Malformed {
                path,
                reason: "the answer lacks the header Metadata-Flavor: Google".into(),
            });
        }
        Ok(body)
    }

    async fn metadata_text(&self, path: &'static str) -> Result<String, MetadataError> {
        let body = self.metadata_get(path).await?;
        String::from_utf8(body.to_vec()).map_err(|_| MetadataError::NotUtf8 { path })
    }

    /// The service account's token: the cached one until [`TOKEN_MARGIN`] before it
    /// expires, else a fresh one from the metadata server.
    async fn token(&self) -> Result<Arc<AccessToken>, MetadataError> {
        if let Some((token, until)) = self.0.token.lock().ok().and_then(|t| t.clone())
            && Instant::now() < until
        {
            return Ok(token);
        }
        // A token that could relabel instances is refused before it is fetched: with it, a
        // node could label itself the control plane (docs/metadata.md, "On GCE").
        let scopes = self.metadata_text(SCOPES_PATH).await?;
        if let Some(scope) = scopes
            .lines()
            .map(str::trim)
            .find(|s| WRITE_SCOPES.contains(s))
        {
            return Err(MetadataError::Malformed {
                path: SCOPES_PATH,
                reason: format!(
                    "the service account's token has scope {scope}, which may change instances \
                     and their labels; give the VMs only the read-only scope \
                     (gcloud compute instances create … --scopes=compute-ro)"
                ),
            });
        }
        let body = Zeroizing::new(self.metadata_get(TOKEN_PATH).await?.to_vec());
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|_| MetadataError::Malformed {
                path: TOKEN_PATH,
                // serde's message could quote the token.
                reason: "not the token document".into(),
            })?;
        let header_safe = !answer.access_token.is_empty()
            && answer.access_token.len() <= 4096
            && answer.access_token.bytes().all(|b| b.is_ascii_graphic());
        if !answer.token_type.eq_ignore_ascii_case("bearer") || !header_safe {
            return Err(MetadataError::Malformed {
                path: TOKEN_PATH,
                reason: "not a bearer token of printable characters".into(),
            });
        }
        let lifetime = Duration::from_secs(answer.expires_in)
            .min(TOKEN_MAX_LIFETIME)
            .saturating_sub(TOKEN_MARGIN);
        let token = Arc::new(AccessToken(answer.access_token));
        if let (Ok(mut cached), Some(until)) =
            (self.0.token.lock(), Instant::now().checked_add(lifetime))
        {
            *cached = Some((token.clone(), until));
        }
        Ok(token)
    }

    /// Forgets the cached token (the API refused it), so that the next call fetches one.
    fn forget_token(&self) {
        if let Ok(mut cached) = self.0.token.lock() {
            *cached = None;
        }
    }

    /// One page of the cluster's instances.
    async fn page(&self, token: &AccessToken, page: Option<&str>) -> Result<Page, MetadataError> {
        let c = &self.0.config;
        // The filter's value is a label value: letters, digits, '-' and '_' need no escape.
        let mut url = format!(
            "{}/compute/v1/projects/{}/aggregated/instances?filter=labels.{CLUSTER_LABEL}%20%3D%20%22{}%22&maxResults={PAGE_SIZE}&fields={}",
            c.compute_api,
            c.project.as_str(),
            c.cluster.as_str(),
            FIELDS
                .replace('/', "%2F")
                .replace('*', "%2A")
                .replace('(', "%28")
                .replace(')', "%29")
                .replace(',', "%2C"),
        );
        if let Some(page) = page {
            if page.is_empty()
                || page.len() > 1024
                || !page
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
            {
                return Err(MetadataError::Malformed {
                    path: LIST_PATH,
                    reason: "the next page's token is not URL-safe text of at most 1 KiB".into(),
                });
            }
            url.push_str("&pageToken=");
            url.push_str(page);
        }
        let mut authorization = http::HeaderValue::try_from(format!("Bearer {}", token.0.as_str()))
            .map_err(|_| MetadataError::Malformed {
                path: TOKEN_PATH,
                reason: "the token is not a header value".into(),
            })?;
        authorization.set_sensitive(true);
        let request = Request::get(url.as_str())
            .header(http::header::AUTHORIZATION, authorization)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| MetadataError::InvalidUrl {
                url: c.compute_api.clone(),
                reason: e.to_string(),
            })?;
        let body = call::call(&self.0.compute, request, MAX_PAGE_LEN, CALL_TIMEOUT)
            .await
            .map_err(|e| {
                if matches!(e, CallError::Status(401 | 403)) {
                    self.forget_token();
                }
                call_error(LIST_PATH, e)
            })?;
        serde_json::from_slice(&body).map_err(|source| MetadataError::Decode {
            path: LIST_PATH,
            source,
        })
    }
}

/// The record of one listed instance (its labels decide its role), and the addresses of
/// all its interfaces.
fn record(
    project: &ProjectId,
    i: Instance,
) -> Result<(InstanceMetadata, Vec<IpAddr>), MetadataError> {
    let malformed = |reason: String| MetadataError::Malformed {
        path: LIST_PATH,
        reason,
    };
    let zone = i.zone.rsplit('/').next().unwrap_or_default().to_owned();
    if i.name.is_empty() || zone.is_empty() {
        return Err(malformed("an instance without a name or zone".into()));
    }
    let addresses: Vec<IpAddr> = i
        .network_interfaces
        .iter()
        .filter_map(|n| n.network_ip.as_deref()?.parse().ok())
        .collect();
    let nic = i.network_interfaces.into_iter().next();
    let ip = nic
        .as_ref()
        .and_then(|n| n.network_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .ok_or_else(|| {
            malformed(format!(
                "instance {:?} has no address on its first interface",
                i.name
            ))
        })?;
    let role = match i.labels.get(ROLE_LABEL).map(String::as_str) {
        Some("control-plane") => Role::ControlPlane,
        Some("worker") => Role::Worker,
        _ => Role::Unknown,
    };
    let record = InstanceMetadata {
        provider_id: format!("gce://{}/{zone}/{}", project.as_str(), i.name),
        name: i.name,
        role,
        vpc_ip: ip.to_string(),
        secondary_ip_range: String::new(),
        alias_ip_ranges: nic
            .map(|n| {
                n.alias_ip_ranges
                    .into_iter()
                    .map(|r| r.ip_cidr_range)
                    .collect()
            })
            .unwrap_or_default(),
    };
    Ok((record, addresses))
}

fn call_error(path: &'static str, e: CallError) -> MetadataError {
    match e {
        CallError::Request(source) => MetadataError::Request { path, source },
        CallError::Status(status) => MetadataError::Status { path, status },
        CallError::TooLarge { cap } => MetadataError::BodyTooLarge { path, cap },
        CallError::Timeout { after } => MetadataError::Timeout { path, after },
    }
}

impl GceMetadata {
    /// Every page of the listing ([`Metadata::list`]).
    async fn list_pages(&self) -> Result<Vec<InstanceMetadata>, MetadataError> {
        let token = self.token().await?;
        let malformed = |reason: String| MetadataError::Malformed {
            path: LIST_PATH,
            reason,
        };
        let mut out = Vec::new();
        // Every address of every interface, to the instance that has it.
        let mut owners: HashMap<IpAddr, String> = HashMap::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let page = self.page(&token, next.as_deref()).await?;
            let partial = Warning::partial(page.warning.as_ref())
                || page
                    .items
                    .values()
                    .any(|s| Warning::partial(s.warning.as_ref()));
            if partial || !page.unreachables.is_empty() {
                return Err(malformed(format!(
                    "the listing is partial: unreachable {:?}",
                    page.unreachables
                )));
            }
            for scope in page.items.into_values() {
                for instance in scope.instances {
                    // The API filtered by the label; checked again here, so that a filter
                    // the API ignored cannot add another cluster's instance.
                    if instance.labels.get(CLUSTER_LABEL).map(String::as_str)
                        != Some(self.0.config.cluster.as_str())
                    {
                        continue;
                    }
                    let (record, addresses) = record(&self.0.config.project, instance)?;
                    for ip in addresses {
                        let owner = owners.entry(ip).or_insert_with(|| record.name.clone());
                        if *owner != record.name {
                            return Err(malformed(format!("two instances have address {ip}")));
                        }
                    }
                    out.push(record);
                }
            }
            next = page.next_page_token.filter(|t| !t.is_empty());
            if next.is_none() {
                let mut names = HashSet::new();
                if let Some(twice) = out.iter().find(|i| !names.insert(i.name.as_str())) {
                    return Err(malformed(format!(
                        "two instances are named {:?}",
                        twice.name
                    )));
                }
                return Ok(out);
            }
        }
        Err(malformed(format!(
            "more than {MAX_PAGES} pages of {PAGE_SIZE} instances"
        )))
    }
}

impl Metadata for GceMetadata {
    async fn self_instance(&self) -> Result<InstanceMetadata, MetadataError> {
        let name = self.metadata_text(NAME_PATH).await?;
        let name = name.trim();
        self.list()
            .await?
            .into_iter()
            .find(|i| i.name == name)
            .ok_or(MetadataError::Status {
                path: SELF_PATH,
                status: 404,
            })
    }

    /// The instances labelled with the cluster, every page, within [`LIST_TIMEOUT`];
    /// refused whole when partial, too long, or ambiguous.
    async fn list(&self) -> Result<Vec<InstanceMetadata>, MetadataError> {
        tokio::time::timeout(LIST_TIMEOUT, self.list_pages())
            .await
            .map_err(|_| MetadataError::Timeout {
                path: LIST_PATH,
                after: LIST_TIMEOUT,
            })?
    }

    async fn control_plane_endpoint(&self) -> Result<String, MetadataError> {
        control_plane_endpoint(&self.list().await?)
            .map(str::to_owned)
            .ok_or(MetadataError::Status {
                path: ENDPOINT_PATH,
                status: 404,
            })
    }

    async fn init_secret_hash(&self) -> Result<String, MetadataError> {
        Ok(self
            .metadata_text(INIT_SECRET_HASH_PATH)
            .await?
            .trim()
            .to_owned())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn project_ids_and_cluster_labels_are_checked() {
        for ok in ["my-project", "p1", "example.com:my-project"] {
            assert!(ProjectId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1project", "My-Project", "p/../q", "p?x", "p-", "p q"] {
            assert!(ProjectId::parse(bad).is_err(), "{bad}");
        }
        for ok in ["prod", "prod-2", "a_b", "0"] {
            assert!(ClusterLabel::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Prod", "a\"b", "a b", "a%20", &"x".repeat(64)] {
            assert!(ClusterLabel::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_api_must_be_https_since_the_token_goes_with_every_call() {
        let mut config = GceConfig::new(
            ProjectId::parse("p").unwrap(),
            ClusterLabel::parse("c").unwrap(),
        );
        config.compute_api = "http://compute.googleapis.com".into();
        let err = GceMetadata::new(config).unwrap_err().to_string();
        assert!(err.contains("https"), "{err}");
    }

    #[test]
    fn the_token_is_never_in_debug_output() {
        let token = AccessToken(Zeroizing::new("ya29.secret-token".into()));
        assert!(!format!("{token:?}").contains("secret"));
    }
}
