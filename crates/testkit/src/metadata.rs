//! Instance metadata as the local metadata service serves it.

use asterism_metadata::{InstanceMetadata, Role};

/// The local instance `name` with `role` at `ip`: provider ID `asterism-local:///<name>`,
/// no pod range, no alias ranges.
pub fn instance(name: &str, role: Role, ip: impl ToString) -> InstanceMetadata {
    InstanceMetadata {
        name: name.into(),
        provider_id: format!("asterism-local:///{name}"),
        role,
        vpc_ip: ip.to_string(),
        ..InstanceMetadata::default()
    }
}
