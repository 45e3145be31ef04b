//! The instance metadata record and node roles, with the JSON field names of the wire format.

use serde::{Deserialize, Deserializer, Serialize};
use std::net::IpAddr;

pub use asterism_cluster::Role;

/// What the metadata service knows about one instance (docs/metadata.md). The JSON field
/// names are the service's wire format, which existing metadata services speak, so they
/// must not change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct InstanceMetadata {
    /// The instance (and Kubernetes node) name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The provider ID, `asterism-local:///<name>` in local mode.
    #[serde(rename = "ProviderID", default)]
    pub provider_id: String,
    /// The node's role.
    #[serde(rename = "Role", default)]
    pub role: Role,
    /// The node's address in the cluster network (in local mode `127.0.10.<n>`).
    #[serde(rename = "VPCIP")]
    pub vpc_ip: String,
    /// The secondary IP range (pod CIDR) of the node, if any.
    #[serde(rename = "SecondaryIPRange", default)]
    pub secondary_ip_range: String,
    /// Alias IP ranges; `null` is read as empty.
    #[serde(rename = "AliasIPRanges", default, deserialize_with = "null_as_empty")]
    pub alias_ip_ranges: Vec<String>,
}

impl InstanceMetadata {
    /// The VPC IP as an address, if it parses as one.
    pub fn vpc_ip_addr(&self) -> Option<IpAddr> {
        self.vpc_ip
            .parse::<IpAddr>()
            .ok()
            .map(|ip| ip.to_canonical())
    }

    /// Whether `ip` is this instance's VPC IP (IPv4-mapped IPv6 addresses compare equal to
    /// their IPv4 form).
    pub fn has_vpc_ip(&self, ip: IpAddr) -> bool {
        self.vpc_ip_addr() == Some(ip.to_canonical())
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

/// The control-plane endpoint host: the VPC IP of the first control-plane instance in
/// `instances`, in order.
pub fn control_plane_endpoint(instances: &[InstanceMetadata]) -> Option<&str> {
    instances
        .iter()
        .find(|i| i.role == Role::ControlPlane)
        .map(|i| i.vpc_ip.as_str())
}

/// The instance whose VPC IP is `ip`.
pub fn find_by_ip(instances: &[InstanceMetadata], ip: IpAddr) -> Option<&InstanceMetadata> {
    instances.iter().find(|i| i.has_vpc_ip(ip))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn role_parsing_is_case_insensitive_and_accepts_control_plane_with_a_hyphen() {
        for s in [
            "ControlPlane",
            "controlplane",
            "CONTROLPLANE",
            "control-plane",
            "Control-Plane",
        ] {
            assert_eq!(Role::parse(s), Role::ControlPlane, "{s}");
        }
        for s in ["Worker", "worker", "WORKER"] {
            assert_eq!(Role::parse(s), Role::Worker, "{s}");
        }
        for s in ["", "Unknown", "master", "control plane"] {
            assert_eq!(Role::parse(s), Role::Unknown, "{s}");
        }
    }

    #[test]
    fn instance_json_uses_the_original_field_names() {
        let i = InstanceMetadata {
            name: "worker-0".into(),
            provider_id: "asterism-local:///worker-0".into(),
            role: Role::Worker,
            vpc_ip: "127.0.10.2".into(),
            secondary_ip_range: String::new(),
            alias_ip_ranges: vec![],
        };
        let json = serde_json::to_value(&i).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "Name": "worker-0",
                "ProviderID": "asterism-local:///worker-0",
                "Role": "Worker",
                "VPCIP": "127.0.10.2",
                "SecondaryIPRange": "",
                "AliasIPRanges": []
            })
        );
        let back: InstanceMetadata = serde_json::from_value(json).unwrap();
        assert_eq!(back, i);
    }

    #[test]
    fn go_json_with_null_alias_ranges_and_lower_case_role_parses() {
        let i: InstanceMetadata = serde_json::from_str(
            r#"{"Name":"cp-0","ProviderID":"x","Role":"control-plane","VPCIP":"10.0.0.1","SecondaryIPRange":"","AliasIPRanges":null}"#,
        )
        .unwrap();
        assert_eq!(i.role, Role::ControlPlane);
        assert!(i.alias_ip_ranges.is_empty());
    }

    #[test]
    fn vpc_ip_matching_treats_ipv4_mapped_addresses_as_ipv4() {
        let i = InstanceMetadata {
            vpc_ip: "127.0.10.3".into(),
            ..Default::default()
        };
        assert!(i.has_vpc_ip("127.0.10.3".parse().unwrap()));
        assert!(i.has_vpc_ip("::ffff:127.0.10.3".parse().unwrap()));
        assert!(!i.has_vpc_ip("127.0.10.4".parse().unwrap()));
    }

    #[test]
    fn endpoint_is_the_first_control_plane_instance() {
        let mk = |name: &str, role, ip: &str| InstanceMetadata {
            name: name.into(),
            role,
            vpc_ip: ip.into(),
            ..Default::default()
        };
        let list = vec![
            mk("w", Role::Worker, "127.0.10.2"),
            mk("cp1", Role::ControlPlane, "127.0.10.1"),
            mk("cp2", Role::ControlPlane, "127.0.10.3"),
        ];
        assert_eq!(control_plane_endpoint(&list), Some("127.0.10.1"));
        assert_eq!(control_plane_endpoint(&list[..1]), None);
    }
}
