//! The cluster's key and join services run on the control plane itself, outside Kubernetes
//! (a local VM cluster, docs/vm-image.md "The cluster's services"): the init request says
//! what they trust, and the first node keeps that, with the key service's secrets, on its
//! encrypted state disk.
//!
//! With Kubernetes, the owner's CLI creates the same things as objects after init (the
//! master-secret Secret and `join-config`, docs/kubernetes.md), and they live in etcd on
//! the control plane's state disk. Without it, the init request is the one attested channel
//! from the owner to the node, so the node takes them from there, and only when its
//! operator started it with `--host-cluster-services` on a mapped (encrypted) state disk.

use asterism_attestation::{Measurements, PlatformCa};
use asterism_kms::ClusterKms;
use asterism_proto::init::HostedServices;

use crate::activation::NodeFile;
use crate::files::SECRET_MODE;
use asterism_cluster::NodeDir;

/// The files of the hosted services, checked: the key service's master secret and salt,
/// the join service's measurement salt, the measurements it expects of joining nodes and
/// the platform CA(s) it trusts.
///
/// `hosting` is whether this node runs the services (`--host-cluster-services`). A request
/// that configures them for a node that does not, or leaves them out for one that does, is
/// refused: either way the owner and the node disagree about the cluster's shape. Errors
/// are for the (authenticated) caller.
pub(crate) fn files(
    hosting: bool,
    request: Option<HostedServices>,
    kms: &ClusterKms,
    measurement_salt: &[u8],
    dir: &NodeDir,
) -> Result<Vec<NodeFile>, String> {
    let services = match (hosting, request) {
        (false, None) => return Ok(Vec::new()),
        (false, Some(_)) => {
            return Err(
                "this node does not host the cluster's key and join services \
                        (--host-cluster-services), yet the request configures them"
                    .into(),
            );
        }
        (true, None) => {
            return Err("this node hosts the cluster's key and join services \
                        (--host-cluster-services): the request must say what its join \
                        service trusts"
                .into());
        }
        (true, Some(services)) => services,
    };
    Measurements::from_json(&services.join_measurements)
        .map_err(|e| format!("the hosted join service's measurements: {e}"))?;
    PlatformCa::from_pem(&services.platform_ca)
        .map_err(|e| format!("the hosted join service's platform CA: {e}"))?;
    let d = dir.hosted_services();
    Ok(vec![
        NodeFile::new(
            d.join("mastersecret"),
            kms.master_secret().expose_secret().to_vec(),
            SECRET_MODE,
        ),
        NodeFile::new(
            d.join("salt"),
            kms.salt().expose_secret().to_vec(),
            SECRET_MODE,
        ),
        NodeFile::new(
            d.join("measurementSalt"),
            measurement_salt.to_vec(),
            SECRET_MODE,
        ),
        NodeFile::new(
            d.join("join-measurements.json"),
            services.join_measurements,
            SECRET_MODE,
        ),
        NodeFile::new(d.join("platform-ca.pem"), services.platform_ca, SECRET_MODE),
    ])
}
