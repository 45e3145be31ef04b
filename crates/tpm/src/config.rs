//! Which TPM to open: a typed TCTI (TPM Command Transmission Interface) configuration.
//!
//! The text form follows the TSS convention `NAME:CONF`:
//!
//! | text | meaning |
//! | --- | --- |
//! | `device` or `device:/dev/tpmrm0` | a character device; the default is the kernel resource manager `/dev/tpmrm0` |
//! | `swtpm:host=127.0.0.1,port=2321` | an swtpm speaking its TCP protocol; the control channel is `port + 1` |
//! | `swtpm` | the same, with the TSS defaults `localhost` and `2321` |
//! | `swtpm:path=/run/swtpm.sock` | an swtpm on a UNIX socket (see [`TpmConfig::SwtpmUnix`]) |
//!
//! Parsing is strict: unknown names and keys, repeated keys, empty values, relative paths and
//! bad ports are rejected with a [`ConfigError`] that says which.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The default TPM device: the kernel's in-kernel resource manager, which virtualises
/// transient handles per open file and so lets several processes share the TPM.
pub const DEFAULT_DEVICE: &str = "/dev/tpmrm0";

/// The host the TSS swtpm TCTI uses when none is given.
pub const DEFAULT_SWTPM_HOST: &str = "localhost";

/// The port the TSS swtpm TCTI uses when none is given (the control channel is `port + 1`).
pub const DEFAULT_SWTPM_PORT: u16 = 2321;

/// Where the TPM is: parsed once from configuration, valid by construction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TpmConfig {
    /// A TPM character device such as `/dev/tpmrm0` (absolute path).
    Device(PathBuf),
    /// An swtpm listening on TCP: commands on `port`, control channel on `port + 1`.
    SwtpmTcp {
        /// Host name or IP address.
        host: String,
        /// The command port; must leave room for the control port `port + 1`.
        port: u16,
    },
    /// An swtpm listening on a UNIX socket (control channel at `<path>.ctrl`).
    ///
    /// Parsed and printed, but [`crate::Tpm::open`] refuses it with
    /// [`crate::TpmError::UnsupportedTcti`]: the TSS Rust binding this crate links (tss-esapi 7,
    /// the newest that builds against TSS 3.x) can only hand a host and port to the swtpm
    /// TCTI. Use TCP, or `device:` on a real TPM.
    SwtpmUnix(PathBuf),
}

impl Default for TpmConfig {
    fn default() -> Self {
        TpmConfig::Device(PathBuf::from(DEFAULT_DEVICE))
    }
}

impl TpmConfig {
    /// An swtpm on TCP at `host:port`.
    pub fn swtpm_tcp(host: impl Into<String>, port: u16) -> Result<Self, ConfigError> {
        let host = host.into();
        validate_host(&host)?;
        validate_port(port)?;
        Ok(TpmConfig::SwtpmTcp { host, port })
    }

    /// A TPM character device at an absolute `path`.
    pub fn device(path: impl Into<PathBuf>) -> Result<Self, ConfigError> {
        let path = path.into();
        validate_path(&path)?;
        Ok(TpmConfig::Device(path))
    }
}

/// Why a TCTI string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The string was empty.
    #[error(
        "empty TPM configuration; expected e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`"
    )]
    Empty,
    /// The part before `:` is not a known TCTI.
    #[error("unknown TCTI `{name}`; expected `device` or `swtpm`")]
    UnknownTcti {
        /// The name that was given.
        name: String,
    },
    /// A `key=value` pair had an unknown key.
    #[error("unknown swtpm option `{key}`; expected `host`, `port` or `path`")]
    UnknownKey {
        /// The key that was given.
        key: String,
    },
    /// A `key=value` pair had no `=` or an empty value.
    #[error("swtpm option `{option}` needs a non-empty value (`key=value`)")]
    MissingValue {
        /// The option as written.
        option: String,
    },
    /// The same key twice.
    #[error("swtpm option `{key}` given more than once")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// `path` together with `host` or `port`.
    #[error("swtpm `path` (UNIX socket) cannot be combined with `host` or `port` (TCP)")]
    PathWithTcp,
    /// The port is not a number in 1..=65534 (the control channel needs `port + 1`).
    #[error("invalid swtpm port `{value}`; expected 1..=65534 (the control port is port + 1)")]
    InvalidPort {
        /// The value as written.
        value: String,
    },
    /// The host is neither an IP address nor a plausible host name.
    #[error("invalid swtpm host `{value}`; expected an IP address or a host name")]
    InvalidHost {
        /// The value as written.
        value: String,
    },
    /// Device and socket paths must be absolute.
    #[error("path `{}` must be absolute", path.display())]
    RelativePath {
        /// The path as written.
        path: PathBuf,
    },
}

impl FromStr for TpmConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ConfigError::Empty);
        }
        let (name, conf) = match s.split_once(':') {
            Some((name, conf)) => (name, conf),
            None => (s, ""),
        };
        match name {
            "device" => {
                if conf.is_empty() {
                    Ok(TpmConfig::default())
                } else {
                    TpmConfig::device(conf)
                }
            }
            "swtpm" => parse_swtpm(conf),
            other => Err(ConfigError::UnknownTcti {
                name: other.to_owned(),
            }),
        }
    }
}

fn parse_swtpm(conf: &str) -> Result<TpmConfig, ConfigError> {
    let mut host: Option<&str> = None;
    let mut port: Option<&str> = None;
    let mut path: Option<&str> = None;
    for option in conf.split(',').filter(|o| !o.is_empty()) {
        let Some((key, value)) = option.split_once('=') else {
            return Err(ConfigError::MissingValue {
                option: option.to_owned(),
            });
        };
        if value.is_empty() {
            return Err(ConfigError::MissingValue {
                option: option.to_owned(),
            });
        }
        let slot = match key {
            "host" => &mut host,
            "port" => &mut port,
            "path" => &mut path,
            other => {
                return Err(ConfigError::UnknownKey {
                    key: other.to_owned(),
                });
            }
        };
        if slot.replace(value).is_some() {
            return Err(ConfigError::DuplicateKey {
                key: key.to_owned(),
            });
        }
    }
    if let Some(path) = path {
        if host.is_some() || port.is_some() {
            return Err(ConfigError::PathWithTcp);
        }
        let path = PathBuf::from(path);
        validate_path(&path)?;
        return Ok(TpmConfig::SwtpmUnix(path));
    }
    let port = match port {
        None => DEFAULT_SWTPM_PORT,
        Some(value) => value.parse::<u16>().map_err(|_| ConfigError::InvalidPort {
            value: value.to_owned(),
        })?,
    };
    TpmConfig::swtpm_tcp(host.unwrap_or(DEFAULT_SWTPM_HOST), port)
}

fn validate_port(port: u16) -> Result<(), ConfigError> {
    if port == 0 || port == u16::MAX {
        return Err(ConfigError::InvalidPort {
            value: port.to_string(),
        });
    }
    Ok(())
}

fn validate_host(host: &str) -> Result<(), ConfigError> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if asterism_basics::is_host_name(host) {
        Ok(())
    } else {
        Err(ConfigError::InvalidHost {
            value: host.to_owned(),
        })
    }
}

fn validate_path(path: &Path) -> Result<(), ConfigError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(ConfigError::RelativePath {
            path: path.to_owned(),
        })
    }
}

impl fmt::Display for TpmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TpmConfig::Device(path) => write!(f, "device:{}", path.display()),
            TpmConfig::SwtpmTcp { host, port } => write!(f, "swtpm:host={host},port={port}"),
            TpmConfig::SwtpmUnix(path) => write!(f, "swtpm:path={}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<TpmConfig, ConfigError> {
        s.parse()
    }

    #[test]
    fn default_is_the_kernel_resource_manager() {
        assert_eq!(
            TpmConfig::default(),
            TpmConfig::Device(PathBuf::from("/dev/tpmrm0"))
        );
        assert_eq!(parse("device"), Ok(TpmConfig::default()));
        assert_eq!(parse("device:"), Ok(TpmConfig::default()));
    }

    #[test]
    fn parses_every_form_and_prints_it_back() {
        for text in [
            "device:/dev/tpm0",
            "swtpm:host=127.0.0.1,port=2321",
            "swtpm:host=localhost,port=40000",
            "swtpm:host=::1,port=2321",
            "swtpm:path=/run/swtpm/tpm.sock",
        ] {
            let config = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(config.to_string(), text);
            assert_eq!(parse(&config.to_string()), Ok(config));
        }
    }

    #[test]
    fn swtpm_defaults_match_the_tss() {
        assert_eq!(
            parse("swtpm"),
            Ok(TpmConfig::SwtpmTcp {
                host: "localhost".into(),
                port: 2321
            })
        );
        assert_eq!(
            parse("swtpm:port=5000"),
            Ok(TpmConfig::SwtpmTcp {
                host: "localhost".into(),
                port: 5000
            })
        );
    }

    #[test]
    fn rejects_malformed_configuration_with_a_reason() {
        assert_eq!(parse(""), Err(ConfigError::Empty));
        // Each text with the variant (by name) that refuses it.
        for (text, reason) in [
            ("mssim:host=x", "UnknownTcti"),
            ("device:dev/tpm0", "RelativePath"),
            ("swtpm:host=a,colour=red", "UnknownKey"),
            ("swtpm:host", "MissingValue"),
            ("swtpm:host=", "MissingValue"),
            ("swtpm:port=1,port=2", "DuplicateKey"),
            ("swtpm:port=http", "InvalidPort"),
            ("swtpm:port=65535", "InvalidPort"),
            ("swtpm:port=0", "InvalidPort"),
            ("swtpm:host=bad_host!", "InvalidHost"),
            ("swtpm:path=/x.sock,port=1", "PathWithTcp"),
            ("swtpm:path=x.sock", "RelativePath"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(format!("{err:?}").starts_with(reason), "{text:?}: {err:?}");
        }
    }
}
