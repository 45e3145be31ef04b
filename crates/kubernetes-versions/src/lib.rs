//! The Kubernetes versions Asterism supports, the components each one installs, and the
//! component as it travels in the init request, the join ticket and the components
//! ConfigMap.
//!
//! The versions table is a JSON file built into the crate byte for byte
//! ([`BUILTIN_TABLE`]); a test holds it to a recorded digest ([`BUILTIN_TABLE_SHA256`]), so
//! changing it is a deliberate edit (docs/kubernetes.md says how). Loading it checks every
//! component: each carries a well-formed SHA-256 hash, and a `data:` component, which the
//! file leaves unhashed, gets the hash of its decoded bytes, so the installer checks it like
//! a downloaded one.
//!
//! A crate of its own, apart from the installer (`asterism-components`), because the
//! installer carries an HTTP client and TLS: the operator's CLI, which only reads the table
//! to fill the init request, builds this crate alone. It never does I/O.
#![forbid(unsafe_code)]

mod component;
mod table;

pub use component::{
    Component, DataUrlError, HashFormatError, Sha256Hash, decode_data_url, is_data_url, list_hash,
};
pub use table::{
    BUILTIN_TABLE, BUILTIN_TABLE_SHA256, DEFAULT_REQUEST, KubernetesVersion, Release, SelectError,
    TableError, VersionRequest, VersionSyntaxError, VersionTable,
};
