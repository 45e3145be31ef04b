//! Node settings from a cloud's instance metadata: GCE's metadata server, Azure's IMDS and
//! AWS's IMDSv2. The cluster and trust settings come from what the owner set on the
//! instance (GCE attributes `asterism-<key>`, the settings document as Azure or AWS user
//! data); the node's name and address come from the platform's own metadata, never from
//! the owner's data.
//!
//! Every call is plain HTTP to a link-local service, has a deadline ([`CALL_TIMEOUT`],
//! connect to last body byte) and a body cap (per answer, below); a source makes at most
//! three or four calls. Nothing is retried here: the caller (the image's init) tries again
//! while the node waits. The forms follow each cloud's documentation, cited at each call.

use super::{Address, Field, Hostname, NodeSettings, Raw, SettingsError, Source, Value, document};
use crate::call::{self, CallError};
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use std::time::Duration;

/// GCE's metadata server, by address: it is also `metadata.google.internal`, but a node
/// reads its settings before it has a resolver.
/// <https://cloud.google.com/compute/docs/metadata/querying-metadata>
pub const GCE_METADATA_URL: &str = "http://169.254.169.254";
/// Azure's and AWS's instance metadata service.
pub const IMDS_URL: &str = crate::imds::DEFAULT_IMDS_URL;
/// Deadline of one call: connect, request, answer headers and body.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest one-value answer (a host name, an address, an IMDSv2 token).
pub const MAX_TEXT_ANSWER: usize = 1024;
/// Largest GCE attributes answer: GCE caps all of an instance's metadata at 512 KB.
pub const MAX_GCE_ATTRIBUTES: usize = 512 * 1024;
/// Largest Azure `userData` answer: Azure caps user data at 64 KB, served in base64.
pub const MAX_AZURE_USER_DATA: usize = 96 * 1024;
/// Largest Azure instance document.
pub const MAX_AZURE_INSTANCE: usize = 256 * 1024;
/// Largest AWS `user-data` answer: AWS caps user data at 16 KB.
pub const MAX_AWS_USER_DATA: usize = 16 * 1024;
/// Lifetime asked for the IMDSv2 session token: the few calls that follow.
pub const AWS_TOKEN_TTL_SECONDS: u32 = 60;

/// GCE: `Metadata-Flavor: Google` on every request, and on every answer of the real server.
/// <https://cloud.google.com/compute/docs/metadata/querying-metadata>
const GCE_FLAVOR: (&str, &str) = ("metadata-flavor", "Google");
/// The prefix of this project's GCE instance attributes (attribute keys take letters,
/// digits, `-` and `_`).
/// <https://cloud.google.com/compute/docs/metadata/setting-custom-metadata>
const GCE_PREFIX: &str = "asterism-";
/// GCE: every instance attribute at once, as a JSON object (`recursive=true` on a
/// directory). <https://cloud.google.com/compute/docs/metadata/querying-metadata>
const GCE_ATTRIBUTES: &str = "/computeMetadata/v1/instance/attributes/?recursive=true";
/// GCE: the instance's host name and first interface's address.
/// <https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys>
const GCE_HOSTNAME: &str = "/computeMetadata/v1/instance/hostname";
const GCE_IP: &str = "/computeMetadata/v1/instance/network-interfaces/0/ip";

/// Azure: `Metadata: true` on every request (IMDS refuses requests without it).
/// <https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service>
const AZURE_METADATA: (&str, &str) = ("metadata", "true");
/// Azure: the user data, base64, as text.
/// <https://learn.microsoft.com/en-us/azure/virtual-machines/user-data>
const AZURE_USER_DATA: &str =
    "/metadata/instance/compute/userData?api-version=2021-01-01&format=text";
/// Azure: the instance document (`compute.name`, `network.interface[0].ipv4`).
/// <https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service>
const AZURE_INSTANCE: &str = "/metadata/instance?api-version=2021-02-01";

/// AWS IMDSv2: a session token from `PUT /latest/api/token` with its lifetime in
/// `X-aws-ec2-metadata-token-ttl-seconds`, then every `GET` with the token in
/// `X-aws-ec2-metadata-token`. `user-data` answers 404 when the instance has none.
/// <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html>
const AWS_TOKEN: &str = "/latest/api/token";
const AWS_TOKEN_TTL: &str = "x-aws-ec2-metadata-token-ttl-seconds";
const AWS_TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";
/// <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html>
const AWS_USER_DATA: &str = "/latest/user-data";
/// <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html>
const AWS_LOCAL_IPV4: &str = "/latest/meta-data/local-ipv4";
const AWS_HOSTNAME: &str = "/latest/meta-data/hostname";

/// A client of one cloud's metadata service, for node settings.
#[derive(Debug, Clone)]
pub struct CloudSettings {
    origin: Source,
    base: String,
    timeout: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl CloudSettings {
    /// A client for `origin` (GCE, Azure or AWS) at `base_url` (`http://host[:port]`;
    /// [`GCE_METADATA_URL`] or [`IMDS_URL`] on the clouds).
    pub fn new(origin: Source, base_url: &str) -> Result<Self, SettingsError> {
        if !origin.is_cloud() {
            return Err(SettingsError::Malformed {
                origin,
                what: base_url.to_owned(),
                reason: "not a cloud metadata source".into(),
            });
        }
        let base = call::base_url(base_url).map_err(|reason| SettingsError::Malformed {
            origin,
            what: base_url.to_owned(),
            reason: reason.into(),
        })?;
        Ok(Self {
            origin,
            base,
            timeout: CALL_TIMEOUT,
            client: call::client(None, CALL_TIMEOUT),
        })
    }

    /// The default service URL of `origin`.
    pub fn default_url(origin: Source) -> &'static str {
        match origin {
            Source::Gce => GCE_METADATA_URL,
            _ => IMDS_URL,
        }
    }

    /// Replaces the per-call deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.client = call::client(None, timeout);
        self
    }

    /// Reads the node settings: all calls first, then every value parsed; whole or not at
    /// all.
    pub async fn read(&self) -> Result<NodeSettings, SettingsError> {
        match self.origin {
            Source::Gce => self.gce().await,
            Source::Azure => self.azure().await,
            _ => self.aws().await,
        }
    }

    async fn gce(&self) -> Result<NodeSettings, SettingsError> {
        let attributes = self.gce_get(GCE_ATTRIBUTES, MAX_GCE_ATTRIBUTES).await?;
        let hostname = self.gce_get(GCE_HOSTNAME, MAX_TEXT_ANSWER).await?;
        let ip = self.gce_get(GCE_IP, MAX_TEXT_ANSWER).await?;

        let url = self.url(GCE_ATTRIBUTES);
        let document::Pairs(object) = serde_json::from_slice(&attributes)
            .map_err(|e| self.malformed(&url, format!("not a JSON object: {e}")))?;
        let mut raw = Raw::new(self.origin);
        for (key, value) in object {
            // Other attributes (ssh-keys, startup-script, …) are the platform's or others'.
            let Some(key) = key.strip_prefix(GCE_PREFIX) else {
                continue;
            };
            let serde_json::Value::String(text) = value else {
                return Err(
                    self.malformed(&url, format!("attribute {GCE_PREFIX}{key} is not a string"))
                );
            };
            raw.set_key(key, Value::Text(text))?;
        }
        let settings = raw.into_settings()?;
        self.with_platform_identity(settings, GCE_HOSTNAME, &hostname, GCE_IP, &ip)
    }

    async fn gce_get(&self, path: &str, cap: usize) -> Result<Bytes, SettingsError> {
        let (headers, body) = self
            .fetch(Method::GET, path, &[GCE_FLAVOR], cap)
            .await?
            .ok_or_else(|| self.http(Method::GET, path, "HTTP status 404".into()))?;
        // The real server says who it is; an answer without it is not the metadata server's.
        let flavor = headers.get(GCE_FLAVOR.0).and_then(|v| v.to_str().ok());
        if flavor != Some(GCE_FLAVOR.1) {
            return Err(self.http(
                Method::GET,
                path,
                "the answer lacks the header Metadata-Flavor: Google".into(),
            ));
        }
        Ok(body)
    }

    async fn azure(&self) -> Result<NodeSettings, SettingsError> {
        let user_data = self
            .fetch(
                Method::GET,
                AZURE_USER_DATA,
                &[AZURE_METADATA],
                MAX_AZURE_USER_DATA,
            )
            .await?
            .ok_or_else(|| self.http(Method::GET, AZURE_USER_DATA, "HTTP status 404".into()))?
            .1;
        let instance = self
            .fetch(
                Method::GET,
                AZURE_INSTANCE,
                &[AZURE_METADATA],
                MAX_AZURE_INSTANCE,
            )
            .await?
            .ok_or_else(|| self.http(Method::GET, AZURE_INSTANCE, "HTTP status 404".into()))?
            .1;

        let url = self.url(AZURE_USER_DATA);
        let settings = if user_data.is_empty() {
            NodeSettings::default()
        } else {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(&user_data)
                .map_err(|e| self.malformed(&url, format!("userData is not base64: {e}")))?;
            document::parse(self.origin, &url, &decoded)?
        };

        #[derive(Deserialize)]
        struct Instance {
            compute: Compute,
            network: Network,
        }
        #[derive(Deserialize)]
        struct Compute {
            name: String,
        }
        #[derive(Deserialize)]
        struct Network {
            interface: Vec<Interface>,
        }
        #[derive(Deserialize)]
        struct Interface {
            ipv4: Ipv4,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Ipv4 {
            ip_address: Vec<IpAddress>,
            subnet: Vec<Subnet>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct IpAddress {
            private_ip_address: String,
        }
        #[derive(Deserialize)]
        struct Subnet {
            prefix: String,
        }
        let instance_url = self.url(AZURE_INSTANCE);
        let instance: Instance = serde_json::from_slice(&instance).map_err(|e| {
            self.malformed(&instance_url, format!("not the instance document: {e}"))
        })?;
        let ipv4 = instance
            .network
            .interface
            .into_iter()
            .next()
            .map(|i| i.ipv4)
            .ok_or_else(|| self.malformed(&instance_url, "network.interface is empty".into()))?;
        let ip = ipv4
            .ip_address
            .into_iter()
            .next()
            .map(|a| a.private_ip_address)
            .ok_or_else(|| {
                self.malformed(
                    &instance_url,
                    "network.interface[0].ipv4.ipAddress is empty".into(),
                )
            })?;
        let prefix = ipv4.subnet.into_iter().next().map(|s| s.prefix);
        let address = match prefix {
            Some(prefix) => format!("{ip}/{prefix}"),
            None => ip,
        };
        self.with_platform_identity(
            settings,
            AZURE_INSTANCE,
            instance.compute.name.as_bytes(),
            AZURE_INSTANCE,
            address.as_bytes(),
        )
    }

    async fn aws(&self) -> Result<NodeSettings, SettingsError> {
        let ttl = AWS_TOKEN_TTL_SECONDS.to_string();
        let token = self
            .fetch(
                Method::PUT,
                AWS_TOKEN,
                &[(AWS_TOKEN_TTL, &ttl)],
                MAX_TEXT_ANSWER,
            )
            .await?
            .ok_or_else(|| self.http(Method::PUT, AWS_TOKEN, "HTTP status 404".into()))?
            .1;
        // The token goes back in a header: visible ASCII only.
        let token = std::str::from_utf8(&token)
            .ok()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| {
                self.http(
                    Method::PUT,
                    AWS_TOKEN,
                    "the session token is not visible ASCII".into(),
                )
            })?
            .to_owned();
        let with_token = [(AWS_TOKEN_HEADER, token.as_str())];
        let user_data = self
            .fetch(Method::GET, AWS_USER_DATA, &with_token, MAX_AWS_USER_DATA)
            .await?;
        let ip = self
            .fetch(Method::GET, AWS_LOCAL_IPV4, &with_token, MAX_TEXT_ANSWER)
            .await?
            .ok_or_else(|| self.http(Method::GET, AWS_LOCAL_IPV4, "HTTP status 404".into()))?
            .1;
        let hostname = self
            .fetch(Method::GET, AWS_HOSTNAME, &with_token, MAX_TEXT_ANSWER)
            .await?
            .ok_or_else(|| self.http(Method::GET, AWS_HOSTNAME, "HTTP status 404".into()))?
            .1;

        let settings = match user_data {
            // No user data: a node that waits for init.
            None => NodeSettings::default(),
            Some((_, bytes)) => document::parse(self.origin, &self.url(AWS_USER_DATA), &bytes)?,
        };
        self.with_platform_identity(settings, AWS_HOSTNAME, &hostname, AWS_LOCAL_IPV4, &ip)
    }

    /// The settings with the platform's name and address of the node.
    fn with_platform_identity(
        &self,
        mut settings: NodeSettings,
        hostname_path: &str,
        hostname: &[u8],
        ip_path: &str,
        ip: &[u8],
    ) -> Result<NodeSettings, SettingsError> {
        let origin = self.origin;
        let invalid = |field: Field, path: &str, reason: String| SettingsError::Invalid {
            origin,
            field,
            reason: format!("{}: {reason}", self.url(path)),
        };
        let text = |field: Field, path: &str, bytes: &[u8]| {
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|_| invalid(field, path, "not UTF-8 text".into()))
        };
        let hostname = Hostname::parse(&text(Field::Hostname, hostname_path, hostname)?)
            .map_err(|r| invalid(Field::Hostname, hostname_path, r))?;
        let node_ip = Address::parse(&text(Field::NodeIp, ip_path, ip)?)
            .map_err(|r| invalid(Field::NodeIp, ip_path, r))?;
        settings.hostname = Some(hostname);
        settings.node_ip = Some(node_ip);
        Ok(settings)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn malformed(&self, url: &str, reason: String) -> SettingsError {
        SettingsError::Malformed {
            origin: self.origin,
            what: url.to_owned(),
            reason,
        }
    }

    fn http(&self, method: Method, path: &str, reason: String) -> SettingsError {
        SettingsError::Http {
            origin: self.origin,
            method: if method == Method::PUT { "PUT" } else { "GET" },
            url: self.url(path),
            reason,
        }
    }

    /// One call: the answer's headers and body, `None` for a 404.
    async fn fetch(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        cap: usize,
    ) -> Result<Option<(HeaderMap, Bytes)>, SettingsError> {
        let url = self.url(path);
        let mut request = Request::builder().method(method.clone()).uri(&url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::new())).map_err(|e| {
            self.http(
                method.clone(),
                path,
                format!("cannot build the request: {e}"),
            )
        })?;
        match call::call_with_headers(&self.client, request, cap, self.timeout).await {
            Ok(answer) => Ok(Some(answer)),
            Err(CallError::Status(404)) => Ok(None),
            Err(CallError::Status(status)) => {
                let reason = StatusCode::from_u16(status)
                    .map(|s| format!("HTTP status {s}"))
                    .unwrap_or_else(|_| format!("HTTP status {status}"));
                Err(self.http(method, path, reason))
            }
            Err(CallError::TooLarge { cap }) => Err(SettingsError::TooLarge {
                origin: self.origin,
                what: url,
                cap,
            }),
            Err(CallError::Timeout { after }) => {
                Err(self.http(method, path, format!("no complete answer within {after:?}")))
            }
            Err(CallError::Request(e)) => {
                let mut reason = format!("request failed: {e}");
                let mut cause = e.source();
                while let Some(c) = cause {
                    reason.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                Err(self.http(method, path, reason))
            }
        }
    }
}
