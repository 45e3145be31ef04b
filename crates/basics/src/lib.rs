//! The few helpers that libraries and binaries alike need and that would otherwise be
//! copied into each: an error with its causes on one line ([`error_chain`]), the syntax
//! of a host name and of a node name ([`is_host_name`], [`is_node_name`]), reads that refuse more than a cap instead of
//! truncating ([`read_capped_from`], [`read_file_capped`]), a file operation's error with
//! its path ([`PathError`]), the network source an address counts against ([`source_of`]),
//! connection slots shared fairly between sources ([`slots::PendingSlots`]), and a cap on
//! what one key holds at once ([`shares::Shares`]).
//!
//! It must never depend on anything but `std` (scripts/check-deps), so that any crate of
//! the workspace, the verifier included, can use it without taking on a dependency. Nothing
//! here logs or reads flags, and nothing keeps state of its own (a [`shares::Shares`] is its
//! caller's): binary plumbing belongs in `asterism-binkit`. Children that must not inherit
//! the C libraries' descriptors are started by `asterism-children`.
#![forbid(unsafe_code)]

pub mod shares;
pub mod slots;

use std::fmt;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// A file operation that failed: what was being done, on which path, and the cause.
/// Displayed as `cannot create "/a/b"`, the cause kept as its source.
#[derive(Debug)]
pub struct PathError {
    /// What was being done ("cannot create").
    pub what: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The cause.
    pub source: io::Error,
}

impl PathError {
    /// What `map_err` takes: turns the cause of `what` on `path` into a [`PathError`], and
    /// with `?`, into any error that converts from one.
    pub fn at<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Self + 'a {
        move |source| Self {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.what, self.path)
    }
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// An error and its causes on one line, `a: b: c`, for a log line or an error that keeps
/// a cause from another crate as text (a `Display` of the error alone would drop the
/// causes).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// Longest host name in text form (RFC 1035).
pub const MAX_HOST_NAME_LEN: usize = 253;

/// Longest label of a host name (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// Whether `text` is a host name (RFC 1123): dot-separated labels of ASCII letters,
/// digits and hyphens, each 1 to 63 characters, neither starting nor ending with a hyphen,
/// at most 253 characters in all. Letters of either case; an IP address is not checked
/// here (`1.2.3.4` passes as a name, `::1` does not).
pub fn is_host_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_HOST_NAME_LEN
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= MAX_LABEL_LEN
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Whether `text` is a Kubernetes node name: a lower-case RFC 1123 subdomain, that is a
/// [host name](is_host_name) without upper-case letters (labels of
/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, each at most 63 characters, joined by dots, at most 253
/// in all). Dotted names are node names. Nothing else can reach a request path or an object
/// name built from it.
pub fn is_node_name(text: &str) -> bool {
    is_host_name(text) && !text.bytes().any(|b| b.is_ascii_uppercase())
}

/// Reads `reader` to its end if it yields at most `cap` bytes: `None` if it yields more
/// (at most `cap + 1` bytes are read, so a huge or endless source costs no more).
pub fn read_capped_from(reader: impl Read, cap: u64) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    reader.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    Ok((len <= cap).then_some(bytes))
}

/// Reads the file at `path` whole if it holds at most `cap` bytes: `None` if it is larger,
/// never truncated. A wrong path (a device, a huge log) fails at once instead of filling
/// memory. Opening and reading errors are returned as they are (a missing file is
/// [`io::ErrorKind::NotFound`]).
pub fn read_file_capped(path: &Path, cap: u64) -> io::Result<Option<Vec<u8>>> {
    read_capped_from(std::fs::File::open(path)?, cap)
}

/// The source an address counts against in per-source limits: an IPv4 address itself (an
/// IPv4-mapped IPv6 address counts as its IPv4 address), or an IPv6 address's /64, since
/// one host commonly holds a whole /64.
#[must_use]
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_addresses_count_by_their_64_prefix_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        assert_ne!(source_of(a), source_of(other));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_of(mapped), IpAddr::from([10, 0, 0, 1]));
        let v4 = IpAddr::from([10, 0, 0, 2]);
        assert_eq!(source_of(v4), v4);
    }

    #[derive(Debug)]
    struct Outer(io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_chain_names_every_cause_in_order() {
        let e = Outer(io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
        assert_eq!(error_chain(&io::Error::other("alone")), "alone");
    }

    #[test]
    fn a_path_error_says_what_and_where_and_keeps_its_cause() {
        let e = PathError::at("cannot create", Path::new("/run/x"))(io::Error::other("full"));
        assert_eq!(e.to_string(), r#"cannot create "/run/x""#);
        assert_eq!(error_chain(&e), r#"cannot create "/run/x": full"#);
    }

    #[test]
    fn host_names_follow_rfc_1123() {
        for good in [
            "a",
            "node-1",
            "Node-1.example.COM",
            "1.2.3.4",
            &"a".repeat(63),
        ] {
            assert!(is_host_name(good), "{good}");
        }
        let long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(long.len(), 253);
        assert!(is_host_name(&long));
        for bad in [
            "",
            ".",
            "a..b",
            "a.",
            "-a",
            "a-",
            "a_b",
            "a b",
            "::1",
            "ä",
            &"a".repeat(64),
            &format!("{long}a"),
        ] {
            assert!(!is_host_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_read_over_the_cap_is_refused_not_truncated() {
        assert_eq!(
            read_capped_from(&b"four"[..], 4).unwrap(),
            Some(b"four".to_vec())
        );
        assert_eq!(read_capped_from(&b"four"[..], 3).unwrap(), None);
        assert_eq!(read_capped_from(&b""[..], 0).unwrap(), Some(Vec::new()));
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let err = read_file_capped(Path::new("/nonexistent/asterism"), 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn node_names_are_lower_case_subdomains_with_short_labels() {
        for good in ["cp-0", "worker-1.example", "a", "0", &"a".repeat(63)] {
            assert!(is_node_name(good), "{good}");
        }
        let long_label = "a".repeat(64);
        let label = "a".repeat(63);
        let long_name = [label.as_str(); 4].join(".") + ".ab";
        for bad in [
            "",
            "Worker-1",
            "worker_1",
            "-cp",
            "cp-",
            "cp..0",
            ".cp",
            "cp.",
            "cp/0",
            "cp 0",
            "ü",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
        let at_limit = [label.as_str(); 3].join(".") + "." + &"a".repeat(61);
        assert_eq!(at_limit.len(), MAX_HOST_NAME_LEN);
        assert!(is_node_name(&at_limit));
        assert!(!is_node_name(&(at_limit + "a")));
    }
}
