//! `asterism insecure-test-identity`.

use anyhow::Result;
use std::path::Path;

/// Writes a fresh 32-byte seed to `out` (mode 0600, never overwriting) and prints the
/// public key that validators must pin.
#[cfg(feature = "insecure-test-attestation")]
pub fn create(out: &Path) -> Result<()> {
    use asterism_atls::attestation::test_ed25519::InsecureTestIssuer;
    use ring::rand::SecureRandom;
    use std::io::Write;

    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    ring::rand::SystemRandom::new()
        .fill(seed.as_mut())
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    let issuer = InsecureTestIssuer::from_seed(&seed)?;
    asterism_binkit::write_new(out, seed.as_ref(), asterism_binkit::fs::PRIVATE_MODE)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", hex::encode(issuer.public_key()))?;
    Ok(())
}

/// Without the development feature there is no test identity to create.
#[cfg(not(feature = "insecure-test-attestation"))]
pub fn create(_out: &Path) -> Result<()> {
    anyhow::bail!(
        "this build has no insecure test attestation; rebuild with \
         `--features insecure-test-attestation` (development only)"
    )
}
