//! The cluster's Kubernetes release: the version and the components the first node was
//! initialised with, which every join ticket carries so that a joining node installs the
//! same binaries. Loaded once at start from the cluster state and checked there: a list
//! with a malformed hash stops the service rather than reach a node.

use asterism_cluster::InitNode;
use asterism_kubernetes_versions::{
    Component, HashFormatError, KubernetesVersion, Sha256Hash, VersionSyntaxError,
};

/// A checked Kubernetes release: the version parses (`v<major>.<minor>.<patch>`) and every
/// component carries a well-formed SHA-256 hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRelease {
    version: KubernetesVersion,
    components: Vec<Component>,
}

/// Why a recorded release is refused.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// The version is not `v<major>.<minor>.<patch>`.
    #[error("the recorded Kubernetes version does not parse")]
    Version(#[source] VersionSyntaxError),
    /// A component's hash is missing or malformed.
    #[error("component {index} (install path {install_path:?}) has no valid hash")]
    Hash {
        /// Its position in the list.
        index: usize,
        /// Where it installs, to name it.
        install_path: String,
        /// What is wrong with the hash.
        #[source]
        source: HashFormatError,
    },
}

impl ClusterRelease {
    /// Parses a version recorded as text (the components ConfigMap's) and checks the
    /// release as [`ClusterRelease::new`] does.
    pub fn parse(version: &str, components: Vec<Component>) -> Result<Self, ReleaseError> {
        Self::new(version.parse().map_err(ReleaseError::Version)?, components)
    }

    /// Checks the `components` of `version`; the first bad one refuses the whole.
    pub fn new(
        version: KubernetesVersion,
        components: Vec<Component>,
    ) -> Result<Self, ReleaseError> {
        for (index, c) in components.iter().enumerate() {
            Sha256Hash::parse(&c.hash).map_err(|source| ReleaseError::Hash {
                index,
                install_path: c.install_path.clone(),
                source,
            })?;
        }
        Ok(Self {
            version,
            components,
        })
    }

    /// The release the init node recorded, checked; `None` when the record names neither a
    /// version nor components (tickets then carry none, as before the record held them).
    pub fn of_init_node(init: &InitNode) -> Result<Option<Self>, ReleaseError> {
        match init.kubernetes_version {
            None if init.kubernetes_components.is_empty() => Ok(None),
            // Components without the version they belong to.
            None => Err(ReleaseError::Version(VersionSyntaxError {
                text: String::new(),
            })),
            Some(version) => Self::new(version, init.kubernetes_components.clone()).map(Some),
        }
    }

    /// The version.
    #[must_use]
    pub fn version(&self) -> KubernetesVersion {
        self.version
    }

    /// The components, in their recorded order.
    #[must_use]
    pub fn components(&self) -> &[Component] {
        &self.components
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn component(hash: &str) -> Component {
        Component {
            url: "https://example.com/kubelet".into(),
            hash: hash.into(),
            install_path: "/run/state/bin/kubelet".into(),
            extract: false,
        }
    }

    const GOOD: &str = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    #[test]
    fn a_release_with_valid_hashes_and_an_exact_version_is_kept_as_recorded() {
        let r = ClusterRelease::parse("v1.31.13", vec![component(GOOD)]).unwrap();
        assert_eq!(r.version().to_string(), "v1.31.13");
        assert_eq!(r.components(), [component(GOOD)]);
    }

    #[test]
    fn a_component_without_a_valid_hash_refuses_the_release() {
        for bad in [
            "",
            "sha256:00",
            "md5:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
            "sha256:2C26B46B68FFC68FF99B453C1D30413413422D706483BFA0F98A5E886266E7AE",
        ] {
            let err = ClusterRelease::parse("v1.31.13", vec![component(GOOD), component(bad)])
                .unwrap_err();
            assert!(
                matches!(err, ReleaseError::Hash { index: 1, .. }),
                "{bad:?}: {err:?}"
            );
        }
    }

    #[test]
    fn a_version_without_its_patch_refuses_the_release() {
        let err = ClusterRelease::parse("v1.31", vec![component(GOOD)]).unwrap_err();
        assert!(matches!(err, ReleaseError::Version(_)), "{err:?}");
    }
}
