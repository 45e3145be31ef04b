//! Where the key service listens, which is where its clients connect: one address type and
//! one parser, for the service's `--listen` and its clients' `--key-service`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// The address of the plaintext key service. Plaintext gRPC hands out every key to whoever
/// can connect, so only addresses where the operating system decides who can connect are
/// accepted: a Unix socket or a loopback address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyServiceAddress {
    /// `unix:/path/to.sock`.
    Unix(PathBuf),
    /// `127.0.0.1:PORT`, `[::1]:PORT` (any loopback address). Only a client may use one
    /// (to reach a key service behind a local proxy, say): `asterism-key-service` refuses
    /// to listen on TCP, since every local user can connect to a loopback port.
    Tcp(SocketAddr),
}

/// Why a key-service address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Neither `unix:/path` nor `IP:PORT`.
    #[error("`{0}` is neither `unix:/path/to.sock` nor an IP address with a port")]
    Syntax(String),
    /// `unix:` without a path.
    #[error("the Unix socket path is empty")]
    EmptyPath,
    /// Plaintext on a non-loopback address.
    #[error(
        "refusing plaintext gRPC on {0}: only a Unix socket or a loopback address \
         (127.0.0.0/8, [::1]) may be used until the attested-TLS mode exists (see docs/atls.md)"
    )]
    NotLoopback(SocketAddr),
}

impl FromStr for KeyServiceAddress {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(AddressError::EmptyPath);
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let addr: SocketAddr = text
            .parse()
            .map_err(|_| AddressError::Syntax(text.to_owned()))?;
        if !addr.ip().is_loopback() {
            return Err(AddressError::NotLoopback(addr));
        }
        Ok(Self::Tcp(addr))
    }
}

impl fmt::Display for KeyServiceAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Tcp(addr) => write!(f, "{addr}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn loopback_and_unix_addresses_are_accepted_and_print_as_parsed() {
        assert_eq!(
            "unix:/run/ks.sock".parse::<KeyServiceAddress>(),
            Ok(KeyServiceAddress::Unix(PathBuf::from("/run/ks.sock")))
        );
        for addr in [
            "127.0.0.1:9000",
            "127.1.2.3:0",
            "[::1]:9000",
            "unix:/run/ks.sock",
        ] {
            let parsed: KeyServiceAddress = addr.parse().unwrap();
            assert_eq!(parsed.to_string(), addr);
        }
    }

    #[test]
    fn non_loopback_addresses_are_refused_for_plaintext() {
        for addr in [
            "0.0.0.0:9000",
            "10.0.0.1:9000",
            "[::]:9000",
            "192.168.1.1:1",
        ] {
            let err = addr.parse::<KeyServiceAddress>().unwrap_err();
            assert_eq!(err, AddressError::NotLoopback(addr.parse().unwrap()));
            assert!(err.to_string().contains("docs/atls.md"), "{err}");
        }
    }

    #[test]
    fn malformed_addresses_are_refused() {
        assert_eq!(
            "unix:".parse::<KeyServiceAddress>(),
            Err(AddressError::EmptyPath)
        );
        for bad in [
            "localhost:9000",
            "127.0.0.1",
            "http://127.0.0.1:9000",
            "/run/ks.sock",
        ] {
            assert!(
                matches!(
                    bad.parse::<KeyServiceAddress>(),
                    Err(AddressError::Syntax(_))
                ),
                "{bad}"
            );
        }
    }
}
