//! M-of-N custody of a cluster's master secret.
//!
//! [`split`] cuts the master secret into N shares with Shamir's scheme over GF(2^8), any M of
//! which give it back, and encrypts each share to one custodian's public key (an age X25519
//! recipient or an SSH Ed25519 key) with age. It also returns a [`RecoveryRecord`] for the
//! workspace: public metadata, a digest of every share and a commitment to the secret, so
//! that [`reconstruct`] detects a forged, corrupted, foreign or duplicated share before its
//! bytes are used, and a wrong result after.
//!
//! Fewer than M shares reveal nothing about the secret; the record reveals nothing either.
//! This crate never writes files and never logs: the callers (the `asterism` CLI) decide
//! where the bytes go, and the secret bytes never leave zeroizing memory here.
#![forbid(unsafe_code)]

mod custody;
mod format;
mod gf256;

pub use custody::{Custodian, CustodianIdentity, decrypt_share};
pub use format::{DecryptedShareFile, EncryptedShareFile, RecoveryRecord, ShareSetId};

use asterism_kms::{MasterSecret, Salt};
use std::fmt;
use std::str::FromStr;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// Why splitting, decrypting or reconstructing failed. Every variant that concerns one share
/// names the file it came from; none carries secret bytes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The threshold is not `M-of-N` with 2 ≤ M ≤ N ≤ 255.
    #[error("invalid recovery-share threshold {given:?}: {reason}")]
    Threshold {
        /// What was given.
        given: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The number of custodians is not N.
    #[error("{threshold} shares need {} custodians, {given} given", threshold.total())]
    CustodianCount {
        /// The threshold asked for.
        threshold: Threshold,
        /// The number of custodians given.
        given: usize,
    },
    /// A custodian's public key is neither an age X25519 recipient nor an SSH Ed25519 key.
    #[error("custodian key {origin}: {reason}")]
    Custodian {
        /// Where the key came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A custodian's private key file cannot be used.
    #[error("identity {origin}: {reason}")]
    Identity {
        /// Where the key came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file does not parse as the format it should have.
    #[error("{origin}: not a valid {what}: {reason}")]
    Malformed {
        /// The file.
        origin: String,
        /// Which format was expected.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Encryption to a custodian failed.
    #[error("encrypting share {index} to its custodian: {reason}")]
    Encrypt {
        /// The share index.
        index: u8,
        /// What failed.
        reason: String,
    },
    /// The share was not encrypted to this identity.
    #[error("{origin}: this share was not encrypted to the identity {identity}")]
    NotForThisIdentity {
        /// The share file.
        origin: String,
        /// The identity file.
        identity: String,
    },
    /// The encrypted share does not decrypt (a corrupted or forged ciphertext).
    #[error("{origin}: the share does not decrypt: {reason}")]
    Decrypt {
        /// The share file.
        origin: String,
        /// What age reported.
        reason: String,
    },
    /// The decrypted contents disagree with the labels of the encrypted share file.
    #[error("{origin}: the decrypted share says {inside}, its envelope says {outside}")]
    EnvelopeMismatch {
        /// The share file.
        origin: String,
        /// What the authenticated contents say.
        inside: String,
        /// What the unauthenticated envelope says.
        outside: String,
    },
    /// Fewer shares than the threshold.
    #[error("{needed} of {total} shares needed, {given} given")]
    TooFewShares {
        /// M.
        needed: u8,
        /// N.
        total: u8,
        /// How many were given.
        given: usize,
    },
    /// The share belongs to another share set (another secret or cluster).
    #[error(
        "{origin}: this share belongs to another secret (share set {share}, the workspace's is {record})"
    )]
    OtherShareSet {
        /// The share file.
        origin: String,
        /// The share's set.
        share: ShareSetId,
        /// The workspace's set.
        record: ShareSetId,
    },
    /// Two shares with the same index.
    #[error("{origin} and {first} are both share {index}; give {needed} different shares")]
    DuplicateIndex {
        /// The later file.
        origin: String,
        /// The earlier file with the same index.
        first: String,
        /// The repeated index.
        index: u8,
        /// M.
        needed: u8,
    },
    /// The share's digest is not the one the workspace recorded for its index: its value or
    /// its metadata (index, M, N) was changed.
    #[error(
        "{origin}: share {index} does not match the digest the workspace recorded for it (tampered or corrupted)"
    )]
    ShareDigest {
        /// The share file.
        origin: String,
        /// The index it claims.
        index: u8,
    },
    /// The share claims an index the workspace has no share for.
    #[error("{origin}: share index {index} is outside 1..={total}")]
    IndexOutOfRange {
        /// The share file.
        origin: String,
        /// The index it claims.
        index: u8,
        /// N.
        total: u8,
    },
    /// The reconstructed secret is not the one the workspace committed to.
    #[error("the reconstructed secret does not match the workspace's commitment")]
    SecretCommitment,
    /// The system's random generator failed.
    #[error("the system random number generator failed")]
    Random,
    /// The reconstructed bytes are not a valid master secret or salt.
    #[error(transparent)]
    Secret(#[from] asterism_kms::SecretError),
}

/// M-of-N: M shares out of N give the secret back. 2 ≤ M ≤ N ≤ 255.
///
/// M = 1 is refused: every share would be the secret itself, encrypted to one custodian,
/// which is several copies of the master-secret file rather than custody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    needed: u8,
    total: u8,
}

impl Threshold {
    /// M-of-N, checked.
    pub fn new(needed: u8, total: u8) -> Result<Self, Error> {
        let given = format!("{needed}-of-{total}");
        if needed < 2 {
            return Err(Error::Threshold {
                given,
                reason: "M must be at least 2 (one share alone would be the whole secret)",
            });
        }
        if needed > total {
            return Err(Error::Threshold {
                given,
                reason: "M cannot exceed N",
            });
        }
        Ok(Self { needed, total })
    }

    /// M: how many shares reconstruct the secret.
    #[must_use]
    pub fn needed(self) -> u8 {
        self.needed
    }

    /// N: how many shares there are.
    #[must_use]
    pub fn total(self) -> u8 {
        self.total
    }
}

impl FromStr for Threshold {
    type Err = Error;

    /// Parses `M-of-N`, for example `3-of-5`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |reason| Error::Threshold {
            given: s.to_owned(),
            reason,
        };
        let (m, n) = s
            .split_once("-of-")
            .ok_or_else(|| bad("expected M-of-N, for example 3-of-5"))?;
        let m = m
            .parse::<u8>()
            .map_err(|_| bad("M must be a number from 2 to 255"))?;
        let n = n
            .parse::<u8>()
            .map_err(|_| bad("N must be a number from 2 to 255"))?;
        Self::new(m, n)
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-of-{}", self.needed, self.total)
    }
}

/// What [`split`] produced: the workspace's record and one encrypted share per custodian, in
/// the custodians' order (share `i + 1` for custodian `i`).
#[derive(Debug)]
pub struct Split {
    /// Goes into the workspace as `recovery.json`.
    pub record: RecoveryRecord,
    /// One per custodian, to hand over.
    pub shares: Vec<EncryptedShareFile>,
}

/// Splits `secret` into `threshold.total()` shares, encrypts share `i + 1` to
/// `custodians[i]`, and commits to the result. `salt` goes into the record as it is (it is
/// needed with the secret to derive keys and is worthless without it).
pub fn split(
    secret: &MasterSecret,
    salt: &Salt,
    threshold: Threshold,
    custodians: &[Custodian],
) -> Result<Split, Error> {
    if custodians.len() != usize::from(threshold.total()) {
        return Err(Error::CustodianCount {
            threshold,
            given: custodians.len(),
        });
    }
    let set = ShareSetId::generate()?;
    let raw = gf256::split(
        secret.expose_secret(),
        threshold.needed(),
        threshold.total(),
    )
    .map_err(|_| Error::Random)?;
    let mut shares = Vec::with_capacity(raw.len());
    let mut digests = Vec::with_capacity(raw.len());
    for (share, custodian) in raw.into_iter().zip(custodians) {
        let decrypted = DecryptedShareFile::new(set, share.x, threshold, share.y);
        digests.push((custodian.to_string(), decrypted.digest()));
        shares.push(custodian.encrypt(&decrypted)?);
    }
    let record = RecoveryRecord::new(
        set,
        threshold,
        secret.len(),
        format::commit_to_secret(secret.expose_secret(), &set),
        salt,
        digests,
    );
    Ok(Split { record, shares })
}

/// Reconstructs the master secret from decrypted shares, checking each against `recovery`
/// first and the result against its commitment after.
///
/// Every share is checked before any is used: that it belongs to this share set, that its
/// index is in range and not repeated, and that its digest (over its index, M, N and value)
/// is the one recorded for that index. Then at least M are required. Extra shares beyond M
/// are checked too, and only the first M are used.
pub fn reconstruct(
    shares: &[DecryptedShareFile],
    recovery: &RecoveryRecord,
) -> Result<MasterSecret, Error> {
    let threshold = recovery.threshold();
    let mut seen: Vec<&DecryptedShareFile> = Vec::with_capacity(shares.len());
    for share in shares {
        if share.share_set() != recovery.share_set() {
            return Err(Error::OtherShareSet {
                origin: share.origin().to_owned(),
                share: share.share_set(),
                record: recovery.share_set(),
            });
        }
        if share.index() == 0 || share.index() > threshold.total() {
            return Err(Error::IndexOutOfRange {
                origin: share.origin().to_owned(),
                index: share.index(),
                total: threshold.total(),
            });
        }
        if let Some(first) = seen.iter().find(|s| s.index() == share.index()) {
            return Err(Error::DuplicateIndex {
                origin: share.origin().to_owned(),
                first: first.origin().to_owned(),
                index: share.index(),
                needed: threshold.needed(),
            });
        }
        // The digest covers the index, M, N and the value: a change to any fails here.
        // The digest covers the value's length; the record's length is checked with it.
        let digest_ok = share.value().len() == recovery.secret_len()
            && recovery
                .share_digest(share.index())
                .is_some_and(|expected| bool::from(expected.ct_eq(&share.digest())));
        if !digest_ok {
            return Err(Error::ShareDigest {
                origin: share.origin().to_owned(),
                index: share.index(),
            });
        }
        seen.push(share);
    }
    if seen.len() < usize::from(threshold.needed()) {
        return Err(Error::TooFewShares {
            needed: threshold.needed(),
            total: threshold.total(),
            given: seen.len(),
        });
    }
    let raw: Vec<gf256::RawShare> = seen
        .iter()
        .take(usize::from(threshold.needed()))
        .map(|s| gf256::RawShare {
            x: s.index(),
            y: Zeroizing::new(s.value().to_vec()),
        })
        .collect();
    let bytes = gf256::combine(&raw, recovery.secret_len());
    let commitment = format::commit_to_secret(&bytes, &recovery.share_set());
    if !bool::from(commitment.ct_eq(recovery.secret_commitment())) {
        return Err(Error::SecretCommitment);
    }
    Ok(MasterSecret::new(bytes.to_vec())?)
}
