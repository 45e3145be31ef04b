//! Node settings: the per-node values a node image needs before its bootstrapper starts
//! (addresses, gateway, host name, the cluster to join and the join service to trust, the
//! platform's AK certificate), read from the **one** place the platform keeps them.
//!
//! Sources (docs/node-settings.md): QEMU's fw_cfg ([`fw_cfg`]), SMBIOS OEM strings
//! ([`smbios`]), a JSON file on the EFI system partition ([`document`]), and the instance
//! metadata of GCE, Azure and AWS ([`cloud`]). Every source is untrusted input: each value
//! is parsed into its type, anything unknown, repeated, oversized or malformed is refused
//! with an error that names the source and the field, and [`NodeSettings`] is only ever
//! returned whole. Nothing here is secret, but the blobs (certificates, measurements) are
//! never logged: `Debug` prints their lengths.

pub mod cloud;
pub mod document;
pub mod fw_cfg;
pub mod smbios;

use asterism_kms::{ClusterId, ControlPlaneKey};
use base64::Engine as _;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Largest blob accepted (AK certificate, platform CA bundle, measurements), in bytes.
pub const MAX_BLOB_LEN: usize = 64 * 1024;
/// Largest host name (RFC 1035: 253 characters in text form).
pub const MAX_HOSTNAME_LEN: usize = asterism_basics::MAX_HOST_NAME_LEN;

/// Where node settings come from. Exactly one is read at boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// QEMU's fw_cfg files under `opt/asterism/`.
    FwCfg,
    /// SMBIOS type 11 (OEM strings) entries, `asterism.<key>=<value>`.
    Smbios,
    /// A JSON document on the EFI system partition.
    Esp,
    /// GCE's metadata server: instance attributes `asterism-<key>`.
    Gce,
    /// Azure's instance metadata service: `userData`, a JSON document in base64.
    Azure,
    /// AWS's instance metadata service (IMDSv2): `user-data`, a JSON document.
    Aws,
}

impl Source {
    /// Every source.
    pub const ALL: [Source; 6] = [
        Source::FwCfg,
        Source::Gce,
        Source::Azure,
        Source::Aws,
        Source::Smbios,
        Source::Esp,
    ];

    /// The name used on command lines (`fw-cfg`, `smbios`, `esp`, `gce`, `azure`, `aws`).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::FwCfg => "fw-cfg",
            Source::Smbios => "smbios",
            Source::Esp => "esp",
            Source::Gce => "gce",
            Source::Azure => "azure",
            Source::Aws => "aws",
        }
    }

    /// Whether the platform's own metadata gives the node's name and address (a cloud); the
    /// settings document may then not set them.
    pub fn is_cloud(self) -> bool {
        matches!(self, Source::Gce | Source::Azure | Source::Aws)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::FwCfg => "fw_cfg",
            Source::Smbios => "SMBIOS OEM strings",
            Source::Esp => "ESP settings file",
            Source::Gce => "GCE metadata",
            Source::Azure => "Azure IMDS",
            Source::Aws => "AWS IMDSv2",
        })
    }
}

impl FromStr for Source {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Source::ALL
            .into_iter()
            .find(|source| source.as_str() == s)
            .ok_or_else(|| format!("unknown node settings source {s:?}"))
    }
}

/// One setting, by the key every source spells it with (after the source's prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// `ip`: the address of the node's first interface, `ADDR[/PREFIX]`.
    Ip,
    /// `gw`: the default gateway.
    Gateway,
    /// `node-ip`: the node's address in the cluster network, `ADDR[/PREFIX]`.
    NodeIp,
    /// `hostname`.
    Hostname,
    /// `cluster-id`: 64 lowercase hex digits.
    ClusterId,
    /// `control-plane-key`: 64 lowercase hex digits.
    ControlPlaneKey,
    /// `ak-cert`: the platform's certificate of the TPM's attestation key, DER.
    AkCert,
    /// `join-platform-ca`: the CA the join service's AK certificate must chain to, PEM.
    JoinPlatformCa,
    /// `join-measurements`: the measurements the join service must show, a JSON object.
    JoinMeasurements,
}

impl Field {
    /// Every field.
    pub const ALL: [Field; 9] = [
        Field::Ip,
        Field::Gateway,
        Field::NodeIp,
        Field::Hostname,
        Field::ClusterId,
        Field::ControlPlaneKey,
        Field::AkCert,
        Field::JoinPlatformCa,
        Field::JoinMeasurements,
    ];

    /// The key.
    pub fn key(self) -> &'static str {
        match self {
            Field::Ip => "ip",
            Field::Gateway => "gw",
            Field::NodeIp => "node-ip",
            Field::Hostname => "hostname",
            Field::ClusterId => "cluster-id",
            Field::ControlPlaneKey => "control-plane-key",
            Field::AkCert => "ak-cert",
            Field::JoinPlatformCa => "join-platform-ca",
            Field::JoinMeasurements => "join-measurements",
        }
    }

    /// The field whose key is `key`.
    pub fn from_key(key: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.key() == key)
    }

    /// Set by the platform itself on a cloud (the name and addresses).
    fn is_network(self) -> bool {
        matches!(
            self,
            Field::Ip | Field::Gateway | Field::NodeIp | Field::Hostname
        )
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Why node settings were refused. Each names the source; a value's error names its field.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value is not what its field takes.
    #[error("{origin}: {field}: {reason}")]
    Invalid {
        /// The source.
        origin: Source,
        /// The field.
        field: Field,
        /// What is wrong (never the value of a blob).
        reason: String,
    },
    /// A key with this source's prefix that is no setting.
    #[error("{origin}: unknown key {key:?}")]
    UnknownKey {
        /// The source.
        origin: Source,
        /// The key as found (truncated to 64 characters).
        key: String,
    },
    /// A field given twice.
    #[error("{origin}: {field} is given more than once")]
    Duplicate {
        /// The source.
        origin: Source,
        /// The field.
        field: Field,
    },
    /// A field that needs another one that is missing.
    #[error("{origin}: {field} is given without {missing}")]
    Incomplete {
        /// The source.
        origin: Source,
        /// The field given.
        field: Field,
        /// The field it needs.
        missing: Field,
    },
    /// The source's container (a file, an SMBIOS structure, a JSON document, an HTTP answer)
    /// is not of the documented form.
    #[error("{origin}: {what}: {reason}")]
    Malformed {
        /// The source.
        origin: Source,
        /// What was read (a path, a URL, an SMBIOS entry).
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Something read is larger than its cap.
    #[error("{origin}: {what} is larger than {cap} bytes")]
    TooLarge {
        /// The source.
        origin: Source,
        /// What was read.
        what: String,
        /// The cap.
        cap: usize,
    },
    /// A file of the source could not be read.
    #[error("{origin}: cannot read {}", path.display())]
    Read {
        /// The source.
        origin: Source,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The source is not there (no fw_cfg directory, no settings file).
    #[error("{origin}: not present: {what}")]
    Absent {
        /// The source.
        origin: Source,
        /// What is missing.
        what: String,
    },
    /// A metadata service call failed.
    #[error("{origin}: {method} {url}: {reason}")]
    Http {
        /// The source.
        origin: Source,
        /// `GET` or `PUT`.
        method: &'static str,
        /// The URL called.
        url: String,
        /// What happened.
        reason: String,
    },
    /// No source was named and none was detected.
    #[error("no node settings source detected")]
    NoSource,
}

/// An address with an optional prefix length (`10.0.2.15/24`, `10.0.2.15`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// The address.
    pub ip: IpAddr,
    /// The prefix length, at most 32 for IPv4 and 128 for IPv6.
    pub prefix: Option<u8>,
}

impl Address {
    /// Parses `ADDR` or `ADDR/PREFIX` (decimal prefix, no sign, no leading zeros).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (ip, prefix) = match text.split_once('/') {
            Some((ip, prefix)) => (ip, Some(prefix)),
            None => (text, None),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("{ip:?} is not an IP address"))?;
        let prefix = prefix
            .map(|p| {
                let ok = !p.is_empty()
                    && p.len() <= 3
                    && p.bytes().all(|b| b.is_ascii_digit())
                    && (p == "0" || !p.starts_with('0'));
                let n: u8 = if ok {
                    p.parse().unwrap_or(u8::MAX)
                } else {
                    u8::MAX
                };
                let max = if ip.is_ipv4() { 32 } else { 128 };
                if n > max {
                    Err(format!("{p:?} is not a prefix length (0 to {max})"))
                } else {
                    Ok(n)
                }
            })
            .transpose()?;
        Ok(Self { ip, prefix })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.prefix {
            Some(p) => write!(f, "{}/{p}", self.ip),
            None => write!(f, "{}", self.ip),
        }
    }
}

/// A host name: dot-separated labels of letters, digits and hyphens (RFC 1123), each 1 to 63
/// characters, neither starting nor ending with a hyphen, at most 253 characters in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostname(String);

impl Hostname {
    /// Parses a host name.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() || text.len() > MAX_HOSTNAME_LEN {
            return Err(format!(
                "a host name has 1 to {MAX_HOSTNAME_LEN} characters, not {}",
                text.len()
            ));
        }
        if !asterism_basics::is_host_name(text) {
            return Err("not a host name (letters, digits, hyphens and dots)".into());
        }
        Ok(Self(text.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The cluster a node joins and the join service it trusts. All four come together or not
/// at all.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinSettings {
    /// The cluster's ID.
    pub cluster_id: ClusterId,
    /// The control plane's public key.
    pub control_plane_key: ControlPlaneKey,
    /// The CA bundle (PEM) the join service's AK certificate must chain to.
    pub platform_ca: String,
    /// The join service's measurements (a JSON object, as the bootstrapper's
    /// `--verify-join-service-measurements` file).
    pub measurements: Vec<u8>,
}

impl fmt::Debug for JoinSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinSettings")
            .field("cluster_id", &self.cluster_id)
            .field("control_plane_key", &self.control_plane_key)
            .field("platform_ca_len", &self.platform_ca.len())
            .field("measurements_len", &self.measurements.len())
            .finish()
    }
}

/// The image init's own flags, which the QEMU and bare-metal sources (fw_cfg, SMBIOS OEM
/// strings) may carry beside the settings as `asterism.reference=1` and
/// `asterism.keep-running=1`. They change no value the node trusts: `reference` makes the
/// init print its PCRs and power off without running the bootstrapper, `keep_running` keeps
/// the node up after its bootstrapper succeeded. Settings documents (the ESP file, cloud
/// user data) have no key for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InitFlags {
    /// `asterism.reference=1`: a reference boot.
    pub reference: bool,
    /// `asterism.keep-running=1`: stay up after the bootstrapper succeeded.
    pub keep_running: bool,
}

impl InitFlags {
    /// Sets the flag `key` (`reference`, `keep-running`) from `value`, which must be `1`;
    /// `Ok(false)` when `key` is no init flag.
    pub(crate) fn set(
        &mut self,
        origin: Source,
        key: &str,
        value: &str,
    ) -> Result<bool, SettingsError> {
        let flag = match key {
            "reference" => &mut self.reference,
            "keep-running" => &mut self.keep_running,
            _ => return Ok(false),
        };
        if value != "1" {
            return Err(SettingsError::Malformed {
                origin,
                what: format!("asterism.{key}"),
                reason: "an init flag takes the value 1 or is left out".into(),
            });
        }
        if *flag {
            return Err(SettingsError::Malformed {
                origin,
                what: format!("asterism.{key}"),
                reason: "given more than once".into(),
            });
        }
        *flag = true;
        Ok(true)
    }
}

/// A node's settings, parsed whole from one source.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NodeSettings {
    /// The address of the node's first interface (`ip`).
    pub address: Option<Address>,
    /// The default gateway (`gw`); only with an address.
    pub gateway: Option<IpAddr>,
    /// The node's address in the cluster network (`node-ip`).
    pub node_ip: Option<Address>,
    /// The host name.
    pub hostname: Option<Hostname>,
    /// The cluster to join and the join service to trust.
    pub join: Option<JoinSettings>,
    /// The platform's certificate of the TPM's attestation key (DER).
    pub ak_cert: Option<Vec<u8>>,
    /// The init's own flags, where the source carries them (fw_cfg, SMBIOS).
    pub init_flags: InitFlags,
}

impl fmt::Debug for NodeSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeSettings")
            .field("address", &self.address)
            .field("gateway", &self.gateway)
            .field("node_ip", &self.node_ip)
            .field("hostname", &self.hostname)
            .field("join", &self.join)
            .field("ak_cert_len", &self.ak_cert.as_ref().map(Vec::len))
            .field("init_flags", &self.init_flags)
            .finish()
    }
}

/// Where each source is: the sysfs trees, the ESP file, the cloud's service, the deadline
/// of each call.
#[derive(Debug, Clone)]
pub struct Locations {
    /// fw_cfg's sysfs tree ([`fw_cfg::DEFAULT_FW_CFG_ROOT`]).
    pub fw_cfg_root: PathBuf,
    /// The SMBIOS structures in sysfs ([`smbios::DEFAULT_DMI_ENTRIES`]).
    pub dmi_entries: PathBuf,
    /// The DMI identity files (`sys_vendor`, `product_name`), for detection.
    pub dmi_id: PathBuf,
    /// The settings file on the ESP ([`document::DEFAULT_ESP_FILE`]).
    pub esp_file: PathBuf,
    /// The cloud's metadata service; `None`: the cloud's documented address.
    pub metadata_url: Option<String>,
    /// Deadline of each metadata call.
    pub timeout: std::time::Duration,
}

impl Default for Locations {
    fn default() -> Self {
        Self {
            fw_cfg_root: fw_cfg::DEFAULT_FW_CFG_ROOT.into(),
            dmi_entries: smbios::DEFAULT_DMI_ENTRIES.into(),
            dmi_id: DEFAULT_DMI_ID.into(),
            esp_file: document::DEFAULT_ESP_FILE.into(),
            metadata_url: None,
            timeout: cloud::CALL_TIMEOUT,
        }
    }
}

/// The DMI identity of the machine in sysfs.
pub const DEFAULT_DMI_ID: &str = "/sys/class/dmi/id";

/// Reads the node settings from `source`, whole or not at all.
pub async fn read(source: Source, at: &Locations) -> Result<NodeSettings, SettingsError> {
    let settings = match source {
        Source::FwCfg => fw_cfg::read(&at.fw_cfg_root)?,
        Source::Smbios => smbios::read(&at.dmi_entries)?,
        Source::Esp => document::read_esp(&at.esp_file)?,
        Source::Gce | Source::Azure | Source::Aws => {
            let url = at
                .metadata_url
                .as_deref()
                .unwrap_or(cloud::CloudSettings::default_url(source));
            cloud::CloudSettings::new(source, url)?
                .with_timeout(at.timeout)
                .read()
                .await?
        }
    };
    tracing::info!(
        %source,
        hostname = settings.hostname.as_ref().map(tracing::field::display),
        node_ip = settings.node_ip.as_ref().map(tracing::field::display),
        cluster_id = settings.join.as_ref().map(|j| tracing::field::display(j.cluster_id)),
        ak_cert = settings.ak_cert.is_some(),
        "node settings read"
    );
    Ok(settings)
}

/// The source this machine's identity points to, or `None`: fw_cfg when QEMU gives
/// `opt/asterism/` entries; GCE, AWS or Azure by the DMI system vendor and product the
/// clouds document; else SMBIOS when an OEM string structure exists, else the ESP file when
/// it exists. Detection only picks which untrusted source is read; naming the source on the
/// measured command line removes even that choice from the platform.
pub fn detect(at: &Locations) -> Option<Source> {
    let id = |name: &str| {
        fw_cfg::read_file(Source::Smbios, &at.dmi_id.join(name), 256)
            .ok()
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
            .unwrap_or_default()
    };
    let vendor = id("sys_vendor");
    let product = id("product_name");
    detect_from(
        at.fw_cfg_root.join("by_name/opt/asterism").is_dir(),
        &vendor,
        &product,
        std::fs::read_dir(&at.dmi_entries)
            .map(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().starts_with("11-"))
            })
            .unwrap_or(false),
        at.esp_file.is_file(),
    )
}

/// [`detect`] on the facts it reads.
pub fn detect_from(
    fw_cfg: bool,
    sys_vendor: &str,
    product_name: &str,
    oem_strings: bool,
    esp_file: bool,
) -> Option<Source> {
    if fw_cfg {
        Some(Source::FwCfg)
    } else if sys_vendor == "Google" && product_name == "Google Compute Engine" {
        Some(Source::Gce)
    } else if sys_vendor == "Amazon EC2" {
        Some(Source::Aws)
    } else if sys_vendor == "Microsoft Corporation" && product_name == "Virtual Machine" {
        Some(Source::Azure)
    } else if oem_strings {
        Some(Source::Smbios)
    } else if esp_file {
        Some(Source::Esp)
    } else {
        None
    }
}

/// A value as a source delivered it: text (everything in text forms; the AK certificate in
/// base64) or bytes (fw_cfg's files).
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Text(String),
    Bytes(Vec<u8>),
}

/// The values of one source, gathered before any is interpreted: each field at most once.
#[derive(Debug)]
pub(crate) struct Raw {
    origin: Source,
    values: BTreeMap<Field, Value>,
    /// The init's flags, where the source may carry them.
    pub(crate) init_flags: InitFlags,
}

impl Raw {
    pub(crate) fn new(origin: Source) -> Self {
        Self {
            origin,
            values: BTreeMap::new(),
            init_flags: InitFlags::default(),
        }
    }

    /// Records `field`; a second value for it is refused.
    pub(crate) fn set(&mut self, field: Field, value: Value) -> Result<(), SettingsError> {
        if self.values.contains_key(&field) {
            return Err(SettingsError::Duplicate {
                origin: self.origin,
                field,
            });
        }
        self.values.insert(field, value);
        Ok(())
    }

    /// Records the value of `key` (after the source's prefix); an unknown key is refused.
    pub(crate) fn set_key(&mut self, key: &str, value: Value) -> Result<(), SettingsError> {
        let field = Field::from_key(key).ok_or_else(|| unknown_key(self.origin, key))?;
        self.set(field, value)
    }

    /// Interprets every value; the settings only if all are valid and consistent.
    pub(crate) fn into_settings(self) -> Result<NodeSettings, SettingsError> {
        let origin = self.origin;
        let init_flags = self.init_flags;
        let invalid = |field: Field| {
            move |reason: String| SettingsError::Invalid {
                origin,
                field,
                reason,
            }
        };
        let mut values = self.values;
        if origin.is_cloud()
            && let Some(field) = values.keys().copied().find(|f| f.is_network())
        {
            return Err(invalid(field)(
                "set by the platform's own metadata on a cloud, not by the settings".into(),
            ));
        }
        let mut take_text = |field: Field| -> Result<Option<String>, SettingsError> {
            match values.remove(&field) {
                None => Ok(None),
                Some(Value::Text(text)) => Ok(Some(text)),
                Some(Value::Bytes(bytes)) => String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| invalid(field)("not UTF-8 text".into())),
            }
        };
        let address = take_text(Field::Ip)?
            .map(|t| Address::parse(&t).map_err(invalid(Field::Ip)))
            .transpose()?;
        let gateway = take_text(Field::Gateway)?
            .map(|t| {
                t.parse::<IpAddr>()
                    .map_err(|_| invalid(Field::Gateway)(format!("{t:?} is not an IP address")))
            })
            .transpose()?;
        let node_ip = take_text(Field::NodeIp)?
            .map(|t| Address::parse(&t).map_err(invalid(Field::NodeIp)))
            .transpose()?;
        let hostname = take_text(Field::Hostname)?
            .map(|t| Hostname::parse(&t).map_err(invalid(Field::Hostname)))
            .transpose()?;
        let cluster_id = take_text(Field::ClusterId)?
            .map(|t| {
                hex32(&t)
                    .map(ClusterId::from)
                    .map_err(invalid(Field::ClusterId))
            })
            .transpose()?;
        let control_plane_key = take_text(Field::ControlPlaneKey)?
            .map(|t| {
                hex32(&t)
                    .and_then(|b| ControlPlaneKey::try_from(&b[..]).map_err(|e| e.to_string()))
                    .map_err(invalid(Field::ControlPlaneKey))
            })
            .transpose()?;
        let platform_ca = take_text(Field::JoinPlatformCa)?
            .map(|t| {
                pem_certificates(&t)
                    .map(|()| t)
                    .map_err(invalid(Field::JoinPlatformCa))
            })
            .transpose()?;
        let measurements = take_text(Field::JoinMeasurements)?
            .map(|t| {
                json_object(&t)
                    .map(|()| t.into_bytes())
                    .map_err(invalid(Field::JoinMeasurements))
            })
            .transpose()?;
        let ak_cert = match values.remove(&Field::AkCert) {
            None => None,
            Some(Value::Bytes(bytes)) => Some(bytes),
            Some(Value::Text(text)) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(text.trim().as_bytes())
                    .map_err(|e| invalid(Field::AkCert)(format!("not base64: {e}")))?,
            ),
        };
        if let Some(cert) = &ak_cert {
            der_sequence(cert).map_err(invalid(Field::AkCert))?;
        }
        if gateway.is_some() && address.is_none() {
            return Err(SettingsError::Incomplete {
                origin,
                field: Field::Gateway,
                missing: Field::Ip,
            });
        }
        let join = match (cluster_id, control_plane_key, platform_ca, measurements) {
            (None, None, None, None) => None,
            (Some(cluster_id), Some(control_plane_key), Some(platform_ca), Some(measurements)) => {
                Some(JoinSettings {
                    cluster_id,
                    control_plane_key,
                    platform_ca,
                    measurements,
                })
            }
            (id, key, ca, m) => {
                let given = [
                    (Field::ClusterId, id.is_some()),
                    (Field::ControlPlaneKey, key.is_some()),
                    (Field::JoinPlatformCa, ca.is_some()),
                    (Field::JoinMeasurements, m.is_some()),
                ];
                let field = given.iter().find(|(_, g)| *g).map(|(f, _)| *f);
                let missing = given.iter().find(|(_, g)| !*g).map(|(f, _)| *f);
                return Err(SettingsError::Incomplete {
                    origin,
                    field: field.unwrap_or(Field::ClusterId),
                    missing: missing.unwrap_or(Field::ControlPlaneKey),
                });
            }
        };
        Ok(NodeSettings {
            address,
            gateway,
            node_ip,
            hostname,
            join,
            ak_cert,
            init_flags,
        })
    }
}

/// An unknown key, shortened for the error.
pub(crate) fn unknown_key(origin: Source, key: &str) -> SettingsError {
    SettingsError::UnknownKey {
        origin,
        key: key.chars().take(64).collect(),
    }
}

/// Exactly 64 lowercase hex digits.
fn hex32(text: &str) -> Result<[u8; 32], String> {
    if text.len() != 64 {
        return Err(format!(
            "64 hex digits expected, found {} characters",
            text.len()
        ));
    }
    if !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err("not lowercase hex".into());
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).map_err(|e| format!("not hex: {e}"))?;
    Ok(out)
}

/// A non-empty PEM bundle of certificates, within [`MAX_BLOB_LEN`]. The certificates
/// themselves are checked where they are used (the bootstrapper's AK trust).
fn pem_certificates(text: &str) -> Result<(), String> {
    if text.len() > MAX_BLOB_LEN {
        return Err(format!("larger than {MAX_BLOB_LEN} bytes"));
    }
    let begins = text.matches("-----BEGIN CERTIFICATE-----").count();
    let ends = text.matches("-----END CERTIFICATE-----").count();
    if begins == 0 || begins != ends {
        return Err("not a PEM bundle of certificates".into());
    }
    Ok(())
}

/// A JSON object, within [`MAX_BLOB_LEN`].
fn json_object(text: &str) -> Result<(), String> {
    if text.len() > MAX_BLOB_LEN {
        return Err(format!("larger than {MAX_BLOB_LEN} bytes"));
    }
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
        .map(|_| ())
        .map_err(|e| format!("not a JSON object: {e}"))
}

/// One DER SEQUENCE (a certificate's outer structure) filling `der` exactly, within
/// [`MAX_BLOB_LEN`]: no truncation, no trailing bytes.
fn der_sequence(der: &[u8]) -> Result<(), String> {
    if der.len() > MAX_BLOB_LEN {
        return Err(format!("larger than {MAX_BLOB_LEN} bytes"));
    }
    let (&tag, rest) = der.split_first().ok_or("empty")?;
    if tag != 0x30 {
        return Err("not a DER certificate (no SEQUENCE)".into());
    }
    let (&first, rest) = rest.split_first().ok_or("truncated DER length")?;
    let (len, body) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 3 {
            return Err("unsupported DER length".into());
        }
        let (len_bytes, body) = rest.split_at_checked(n).ok_or("truncated DER length")?;
        let len = len_bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, body)
    };
    if len != body.len() {
        return Err(format!(
            "DER length {len} does not match the {} bytes that follow",
            body.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const CLUSTER_ID: &str =
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    pub(crate) const CP_KEY: &str =
        "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
    pub(crate) const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    pub(crate) const MEASUREMENTS: &str = r#"{"pcrs":{}}"#;
    /// A minimal DER SEQUENCE standing in for a certificate.
    pub(crate) const AK_CERT: &[u8] = &[0x30, 0x03, 0x02, 0x01, 0x07];

    fn raw(values: &[(Field, &str)]) -> Raw {
        let mut raw = Raw::new(Source::Smbios);
        for (f, v) in values {
            raw.set(*f, Value::Text((*v).into())).unwrap();
        }
        raw
    }

    fn join_values() -> Vec<(Field, &'static str)> {
        vec![
            (Field::ClusterId, CLUSTER_ID),
            (Field::ControlPlaneKey, CP_KEY),
            (Field::JoinPlatformCa, CA),
            (Field::JoinMeasurements, MEASUREMENTS),
        ]
    }

    #[test]
    fn complete_join_settings_parse_into_their_types() {
        let s = raw(&join_values()).into_settings().unwrap();
        let join = s.join.unwrap();
        assert_eq!(join.cluster_id.to_hex(), CLUSTER_ID);
        assert_eq!(join.control_plane_key.to_string(), CP_KEY);
    }

    #[test]
    fn join_settings_without_one_of_the_four_are_refused_whole() {
        for skip in 0..4 {
            let mut values = join_values();
            let removed = values.remove(skip).0;
            let err = raw(&values).into_settings().unwrap_err();
            assert!(
                matches!(err, SettingsError::Incomplete { missing, .. } if missing == removed),
                "{err}"
            );
        }
    }

    #[test]
    fn a_cluster_id_must_be_64_lowercase_hex_digits() {
        for bad in [&CLUSTER_ID[..62], "zz", &CLUSTER_ID.to_uppercase(), ""] {
            let mut values = join_values();
            values[0].1 = bad;
            let err = raw(&values).into_settings().unwrap_err();
            assert!(
                matches!(
                    err,
                    SettingsError::Invalid {
                        field: Field::ClusterId,
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
        let mut values = join_values();
        values[1].1 = &CP_KEY[..63];
        assert!(matches!(
            raw(&values).into_settings().unwrap_err(),
            SettingsError::Invalid {
                field: Field::ControlPlaneKey,
                ..
            }
        ));
    }

    #[test]
    fn the_join_trust_blobs_must_be_a_pem_bundle_and_a_json_object() {
        let mut values = join_values();
        values[2].1 = "not pem";
        assert!(matches!(
            raw(&values).into_settings().unwrap_err(),
            SettingsError::Invalid {
                field: Field::JoinPlatformCa,
                ..
            }
        ));
        let mut values = join_values();
        values[3].1 = "[1,2]";
        assert!(matches!(
            raw(&values).into_settings().unwrap_err(),
            SettingsError::Invalid {
                field: Field::JoinMeasurements,
                ..
            }
        ));
        let big = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_BLOB_LEN));
        let mut values = join_values();
        values[3].1 = &big;
        assert!(matches!(
            raw(&values).into_settings().unwrap_err(),
            SettingsError::Invalid {
                field: Field::JoinMeasurements,
                ..
            }
        ));
    }

    #[test]
    fn addresses_prefixes_and_host_names_are_checked() {
        let s = raw(&[
            (Field::Ip, "10.0.2.15/24"),
            (Field::Gateway, "10.0.2.2"),
            (Field::NodeIp, "fd00::5"),
            (Field::Hostname, "worker-0.example"),
        ])
        .into_settings()
        .unwrap();
        assert_eq!(s.address.unwrap().to_string(), "10.0.2.15/24");
        assert_eq!(s.node_ip.unwrap().prefix, None);
        for (field, bad) in [
            (Field::Ip, "10.0.2.15/33"),
            (Field::Ip, "10.0.2.15/024"),
            (Field::Ip, "10.0.2/24"),
            (Field::NodeIp, "fd00::5/129"),
            (Field::Hostname, "-bad"),
            (Field::Hostname, "a b"),
            (Field::Hostname, "x;reboot"),
        ] {
            let err = raw(&[(field, bad)]).into_settings().unwrap_err();
            assert!(
                matches!(err, SettingsError::Invalid { field: f, .. } if f == field),
                "{bad}: {err}"
            );
        }
        let long = vec!["a".repeat(63); 5].join(".");
        assert!(raw(&[(Field::Hostname, &long)]).into_settings().is_err());
    }

    #[test]
    fn a_gateway_without_an_address_is_refused() {
        let err = raw(&[(Field::Gateway, "10.0.2.2")])
            .into_settings()
            .unwrap_err();
        assert!(matches!(
            err,
            SettingsError::Incomplete {
                field: Field::Gateway,
                ..
            }
        ));
    }

    #[test]
    fn the_ak_certificate_must_be_one_der_sequence_of_its_stated_length() {
        let mut r = Raw::new(Source::FwCfg);
        r.set(Field::AkCert, Value::Bytes(AK_CERT.to_vec()))
            .unwrap();
        assert_eq!(r.into_settings().unwrap().ak_cert.unwrap(), AK_CERT);
        for bad in [
            &[][..],
            &[0x31, 0x00],
            &[0x30, 0x05, 0x02],
            &[0x30, 0x01, 0x00, 0x00],
        ] {
            let mut r = Raw::new(Source::FwCfg);
            r.set(Field::AkCert, Value::Bytes(bad.to_vec())).unwrap();
            assert!(
                matches!(
                    r.into_settings(),
                    Err(SettingsError::Invalid {
                        field: Field::AkCert,
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        let err = raw(&[(Field::AkCert, "!!")]).into_settings().unwrap_err();
        assert!(matches!(
            err,
            SettingsError::Invalid {
                field: Field::AkCert,
                ..
            }
        ));
    }

    #[test]
    fn a_field_given_twice_or_an_unknown_key_is_refused() {
        let mut r = raw(&[(Field::Hostname, "a")]);
        assert!(matches!(
            r.set(Field::Hostname, Value::Text("b".into())),
            Err(SettingsError::Duplicate {
                field: Field::Hostname,
                ..
            })
        ));
        assert!(matches!(
            r.set_key("shell", Value::Text("1".into())),
            Err(SettingsError::UnknownKey { .. })
        ));
    }

    #[test]
    fn a_cloud_settings_document_may_not_set_the_name_or_addresses() {
        let mut r = Raw::new(Source::Aws);
        r.set(Field::Hostname, Value::Text("x".into())).unwrap();
        assert!(matches!(
            r.into_settings(),
            Err(SettingsError::Invalid {
                field: Field::Hostname,
                origin: Source::Aws,
                ..
            })
        ));
    }

    #[test]
    fn detection_prefers_fw_cfg_then_the_clouds_identity_then_bare_metal_sources() {
        assert_eq!(
            detect_from(true, "Google", "Google Compute Engine", true, true),
            Some(Source::FwCfg)
        );
        assert_eq!(
            detect_from(false, "Google", "Google Compute Engine", true, true),
            Some(Source::Gce)
        );
        assert_eq!(
            detect_from(false, "Amazon EC2", "m7i.large", false, false),
            Some(Source::Aws)
        );
        assert_eq!(
            detect_from(
                false,
                "Microsoft Corporation",
                "Virtual Machine",
                false,
                false
            ),
            Some(Source::Azure)
        );
        assert_eq!(
            detect_from(false, "Dell Inc.", "PowerEdge R650", true, true),
            Some(Source::Smbios)
        );
        assert_eq!(
            detect_from(false, "Dell Inc.", "PowerEdge R650", false, true),
            Some(Source::Esp)
        );
        assert_eq!(
            detect_from(false, "QEMU", "Standard PC", false, false),
            None
        );
        for source in Source::ALL {
            assert_eq!(source.as_str().parse::<Source>().unwrap(), source);
        }
    }

    #[test]
    fn debug_output_names_blob_lengths_not_their_bytes() {
        let mut values = join_values();
        values.push((Field::AkCert, "MAMCAQc="));
        let s = raw(&values).into_settings().unwrap();
        let debug = format!("{s:?}");
        assert!(!debug.contains("BEGIN CERTIFICATE"), "{debug}");
        assert!(debug.contains("ak_cert_len: Some(5)"), "{debug}");
    }
}
