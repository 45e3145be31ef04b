//! What the aTLS tests share: the Ed25519 test identities of a server and a client.

use std::sync::Arc;

use asterism_atls::attestation::test_ed25519::{InsecureTestIssuer, InsecureTestValidator};

/// The server's test identity.
pub const SERVER_SEED: [u8; 32] = [0x51; 32];
/// The client's test identity.
pub const CLIENT_SEED: [u8; 32] = [0xc1; 32];

/// An issuer attesting with the test identity `seed`.
pub fn issuer(seed: [u8; 32]) -> Arc<InsecureTestIssuer> {
    Arc::new(InsecureTestIssuer::from_seed(&seed).unwrap())
}

/// A validator that accepts the test identity `seed` alone.
pub fn validator_for(seed: [u8; 32]) -> Arc<InsecureTestValidator> {
    Arc::new(InsecureTestValidator::new([issuer(seed).public_key()]))
}
