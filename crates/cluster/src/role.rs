//! The role of a node in the cluster.

use std::fmt;
use std::str::FromStr;

/// The role of a node in the cluster: what the metadata says an instance is, what a node
/// asks to join as, and what it records in its node state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Role {
    /// The role is not known: what the metadata reports for an instance without a role or
    /// with one this crate does not recognise. It never matches a role check.
    #[default]
    Unknown,
    /// A control-plane node.
    ControlPlane,
    /// A worker node.
    Worker,
}

impl Role {
    /// The canonical spelling (of the metadata API and the node state file): `Unknown`,
    /// `ControlPlane` or `Worker`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Unknown => "Unknown",
            Role::ControlPlane => "ControlPlane",
            Role::Worker => "Worker",
        }
    }

    /// Parses a role case-insensitively; `control-plane` is accepted as well. Anything
    /// else is [`Role::Unknown`] rather than an error, so a record with a role this version
    /// does not know still reads, and an unknown role never matches a role check.
    #[must_use]
    pub fn parse(s: &str) -> Role {
        match s.to_ascii_lowercase().as_str() {
            "controlplane" | "control-plane" => Role::ControlPlane,
            "worker" => Role::Worker,
            _ => Role::Unknown,
        }
    }

    /// The role a join request asks for with its `is_control_plane` flag.
    #[must_use]
    pub fn from_control_plane_flag(control_plane: bool) -> Role {
        if control_plane {
            Role::ControlPlane
        } else {
            Role::Worker
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Role::parse(s))
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(Role::parse(&s))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn roles_parse_case_insensitively_and_anything_else_is_unknown() {
        for (text, role) in [
            ("ControlPlane", Role::ControlPlane),
            ("controlplane", Role::ControlPlane),
            ("control-plane", Role::ControlPlane),
            ("Worker", Role::Worker),
            ("WORKER", Role::Worker),
            ("", Role::Unknown),
            ("boss", Role::Unknown),
        ] {
            assert_eq!(Role::parse(text), role, "{text}");
        }
        for role in [Role::Unknown, Role::ControlPlane, Role::Worker] {
            assert_eq!(Role::parse(role.as_str()), role);
        }
    }

    #[test]
    fn the_control_plane_flag_names_a_known_role() {
        assert_eq!(Role::from_control_plane_flag(true), Role::ControlPlane);
        assert_eq!(Role::from_control_plane_flag(false), Role::Worker);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn roles_are_json_strings() {
        assert_eq!(
            serde_json::to_string(&Role::ControlPlane).unwrap(),
            "\"ControlPlane\""
        );
        assert_eq!(
            serde_json::from_str::<Role>("\"worker\"").unwrap(),
            Role::Worker
        );
        assert_eq!(
            serde_json::from_str::<Role>("\"x\"").unwrap(),
            Role::Unknown
        );
    }
}
