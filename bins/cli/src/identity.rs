//! `asterism insecure-test-identity`.

use anyhow::Result;
use std::path::Path;

/// Writes a fresh 32-byte seed to `out` (mode 0600, never overwriting) and prints the
/// public key that validators must pin.
#[cfg(feature = "insecure-test-attestation")]
pub fn create(out: &Path) -> Result<()> {
    use anyhow::Context;
    use asterism_atls::attestation::test_ed25519::InsecureTestIssuer;
    use ring::rand::SecureRandom;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    ring::rand::SystemRandom::new()
        .fill(seed.as_mut())
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    let issuer = InsecureTestIssuer::from_seed(&seed)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {}", out.display()))?;
    file.write_all(seed.as_ref())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", out.display()))?;
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
