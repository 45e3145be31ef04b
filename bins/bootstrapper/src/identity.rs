//! Who this node is: its name and role, as the metadata says. Learned once, before the
//! InitServer and the JoinClient start, and handed to both.

use std::time::Duration;

use asterism_binkit::error_chain;
use asterism_cluster::Role;
use asterism_kms::DiskUuid;
use asterism_metadata::Metadata;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::flow::pause;
use crate::pki::HostKey;

/// What metadata says about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The instance name (the Kubernetes node name).
    pub name: String,
    /// The node's role: never [`Role::Unknown`] (the metadata is asked until it names one).
    pub role: Role,
}

/// What this node is, learned before the flows start and handed to both.
#[derive(Debug, Clone)]
pub(crate) struct ThisNode {
    /// Its name and role.
    pub(crate) identity: Identity,
    /// Its SSH host key.
    pub(crate) host_key: HostKey,
    /// Its (new) state disk's UUID.
    pub(crate) disk_uuid: DiskUuid,
}

/// Asks the metadata who this node is until it names this node and its role, pausing
/// `retry` between questions; `None` when `stop` is set first.
pub(crate) async fn learn<M: Metadata>(
    metadata: &M,
    timeout: Duration,
    retry: Duration,
    stop: &mut watch::Receiver<bool>,
) -> Option<Identity> {
    loop {
        if let Some(identity) = ask(metadata, timeout).await {
            info!(step = "metadata", name = %identity.name, role = %identity.role, "learned this node's identity");
            return Some(identity);
        }
        if pause(stop, retry).await {
            return None;
        }
    }
}

/// One question to the metadata; `None` when it does not answer with a name and a role.
async fn ask<M: Metadata>(metadata: &M, timeout: Duration) -> Option<Identity> {
    match tokio::time::timeout(timeout, metadata.self_instance()).await {
        Ok(Ok(me)) => {
            // A node without a known role waits: it cannot tell which flow it is in.
            if me.role != Role::Unknown && !me.name.is_empty() {
                return Some(Identity {
                    name: me.name,
                    role: me.role,
                });
            }
            warn!("the metadata does not name this node or its role yet");
        }
        Ok(Err(e)) => warn!(error = %error_chain(&e), "cannot ask the metadata who this node is"),
        Err(_) => warn!("the metadata did not answer in time"),
    }
    None
}
