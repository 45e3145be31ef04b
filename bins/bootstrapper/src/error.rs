//! Why a step of a flow failed: one error type for the steps of both flows, each variant
//! with its cause in `source`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use asterism_atls::AtlsError;
use asterism_cluster::RecordError;
use asterism_disk::{DiskError, FileSystemError};
use asterism_kms::{DeriveError, KeyIdError};

use crate::dial::DialError;
use crate::effects::{DriverError, MarkError};
use crate::files::FileError;
use crate::lock::LockError;
use crate::node_state::NodeStateError;
use crate::pki::PkiError;
use crate::ticket::TicketError;
use crate::trust::ClusterMismatch;
use asterism_basics::PathError;

/// A step of a flow failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A state disk operation failed.
    #[error("state disk")]
    Disk(#[from] DiskError),
    /// The state disk's file system could not be made or mounted.
    #[error("state disk file system")]
    FileSystem(#[from] FileSystemError),
    /// A file could not be read or written.
    #[error(transparent)]
    File(#[from] FileError),
    /// The node state file is missing or malformed.
    #[error(transparent)]
    NodeState(#[from] NodeStateError),
    /// A record for another program (`asterism_cluster`'s node records) did not serialise.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// PCR 15 could not be read or extended.
    #[error("node marker")]
    Marker(#[from] MarkError),
    /// The node lock was taken but the node could not be marked.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A key derivation failed.
    #[error("key derivation")]
    Derive(#[from] DeriveError),
    /// A key ID could not be formed.
    #[error("key ID")]
    KeyId(#[from] KeyIdError),
    /// The Kubernetes driver failed.
    #[error("Kubernetes driver")]
    Driver(#[from] DriverError),
    /// A certificate or key could not be made.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// The InitServer's aTLS could not be set up.
    #[error("aTLS setup")]
    Atls(#[source] AtlsError),
    /// A join service could not be reached.
    #[error(transparent)]
    Dial(#[from] DialError),
    /// A join service refused or failed the call.
    #[error("the join service at {endpoint} answered")]
    JoinService {
        /// The join service.
        endpoint: SocketAddr,
        /// Its answer.
        #[source]
        status: tonic::Status,
    },
    /// A join or rejoin ticket is unusable.
    #[error("unusable ticket")]
    Ticket(#[from] TicketError),
    /// A ticket is for another cluster than the configured one.
    #[error(transparent)]
    Cluster(#[from] ClusterMismatch),
    /// The first-boot passphrase file is empty.
    #[error("the first-boot passphrase file {path} is empty")]
    EmptyInitialKey {
        /// The file.
        path: PathBuf,
    },
    /// A node that was bootstrapped before has no cluster to rejoin configured.
    #[error(
        "this node was bootstrapped before, but no cluster to rejoin is configured (--cluster-id)"
    )]
    NoClusterToRejoin,
    /// PCR 15 is marked but the node never finished bootstrapping.
    #[error("interrupted bootstrap: PCR 15 is marked but the node state is missing")]
    Interrupted,
    /// The InitServer stopped before the node was bootstrapped.
    #[error("the InitServer stopped unexpectedly")]
    InitServerStopped,
    /// A reboot's keys were refused or could not be used.
    #[error("the node could not be brought back")]
    Resume(#[source] Box<ResumeError>),
    /// Every flow ended without a result.
    #[error("every flow ended without a result")]
    FlowsEnded,
    /// The activation did not finish in time.
    #[error("did not finish within {0:?}")]
    Timeout(Duration),
    /// A blocking task died.
    #[error("a background task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Why a rebooted node's keys (from a rejoin ticket or the owner) did not bring it back.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The disk key opens no keyslot: nothing changed.
    #[error("the disk key does not open this node's state disk")]
    WrongKey,
    /// The measurement secret derives another cluster: nothing was marked.
    #[error("the measurement secret derives another cluster")]
    OtherCluster(#[source] ClusterMismatch),
    /// The node lock is taken: the node is already back (or going).
    #[error("the node is already rejoined or recovered")]
    AlreadyDone,
    /// The disk opened but holds no complete node state (or, mapped, its file system does
    /// not mount): the disk must be reset.
    #[error("the state disk holds no complete node state")]
    Incomplete(#[source] StepError),
    /// The node lock was taken but PCR 15 could not be marked: past the point of no return.
    #[error("took the node lock but could not mark PCR 15")]
    Marking(#[source] StepError),
    /// The disk or a derivation failed before anything was marked.
    #[error(transparent)]
    Step(StepError),
}

impl ResumeError {
    /// Whether the run must end: the node cannot come back in this boot.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(self, Self::Incomplete(_) | Self::Marking(_))
    }
}

/// Runs `f` on a blocking thread.
pub(crate) async fn blocking<T, E>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, StepError>
where
    T: Send + 'static,
    E: Into<StepError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(StepError::Task)?
        .map_err(Into::into)
}

/// A file operation that failed is a [`StepError::File`].
impl From<PathError> for StepError {
    fn from(error: PathError) -> Self {
        Self::File(error.into())
    }
}
