//! The emergency SSH certificate authority and host certificates (how the join service
//! issues them: docs/join-service.md).

use asterism_kms::DataKey;
use ring::rand::{SecureRandom, SystemRandom};
use ssh_key::certificate::{Builder, CertType, Certificate};
use ssh_key::private::{Ed25519Keypair, KeypairData};
use ssh_key::public::KeyData;
use ssh_key::{Algorithm, LineEnding, PrivateKey, PublicKey};
use std::time::{SystemTime, UNIX_EPOCH};
use zeroize::Zeroizing;

/// OpenSSH's "valid forever" `valid before` value (never issued here: host certificates
/// expire, see [`HOST_CERTIFICATE_VALIDITY`]).
pub const VALID_FOREVER: u64 = u64::MAX;
/// How long a host certificate is valid after it is signed: one year, as the kubelet
/// certificate. A node receives a new one when it next joins.
pub const HOST_CERTIFICATE_VALIDITY: std::time::Duration =
    std::time::Duration::from_secs(365 * 24 * 3600);
/// How far before the signing time a host certificate is already valid, for clocks that
/// are behind the signer's.
pub const HOST_CERTIFICATE_BACKDATE: std::time::Duration = std::time::Duration::from_secs(3600);
/// The largest SSH wire-format public key accepted (an Ed25519 key takes 51 bytes).
pub const MAX_WIRE_PUBLIC_KEY_LEN: usize = 1024;
/// Most principals a host certificate may name.
pub const MAX_PRINCIPALS: usize = 64;
/// Longest principal accepted, in bytes.
pub const MAX_PRINCIPAL_LEN: usize = 255;

/// Why an SSH operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// The CA seed is not 32 bytes.
    #[error("the SSH CA seed is {0} bytes long, 32 are required")]
    SeedLength(usize),
    /// The public key is not a valid SSH wire-format key.
    #[error("the host public key is not a valid SSH wire-format key")]
    PublicKey(#[source] ssh_key::Error),
    /// The public key is too long to be one.
    #[error(
        "the host public key is {0} bytes long, at most {MAX_WIRE_PUBLIC_KEY_LEN} are accepted"
    )]
    PublicKeyTooLong(usize),
    /// The public key is of an algorithm that is not accepted.
    #[error("host keys must be ssh-ed25519, not {0}")]
    Algorithm(String),
    /// The principal list is unusable.
    #[error("host certificate principals: {0}")]
    Principals(String),
    /// The clock is before 1970.
    #[error("the system clock is before the Unix epoch")]
    Clock,
    /// No randomness.
    #[error("the system random number generator failed")]
    Random,
    /// Encoding, signing or writing failed.
    #[error("SSH {what} failed")]
    Ssh {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: ssh_key::Error,
    },
}

fn ssh(what: &'static str) -> impl FnOnce(ssh_key::Error) -> SshError {
    move |source| SshError::Ssh { what, source }
}

/// The cluster's emergency SSH certificate authority: an Ed25519 key whose 32-byte seed is
/// the data key `ca_emergency_ssh`, so every control-plane node derives the same CA.
pub struct SshCa {
    key: PrivateKey,
    signer: CaSigner,
}

/// The CA key as it signs: ring's Ed25519 key pair, built once from the seed. Through
/// `PrivateKey`, ssh-key rebuilds the signing key from the seed and re-checks the public key
/// on every signature (two scalar multiplications and a point decompression more per host
/// certificate, on every join ticket).
struct CaSigner {
    key: ring::signature::Ed25519KeyPair,
    public: KeyData,
}

impl signature::Signer<ssh_key::Signature> for CaSigner {
    fn try_sign(&self, msg: &[u8]) -> Result<ssh_key::Signature, signature::Error> {
        ssh_key::Signature::new(Algorithm::Ed25519, self.key.sign(msg).as_ref())
            .map_err(|_| signature::Error::new())
    }
}

impl From<&CaSigner> for KeyData {
    fn from(signer: &CaSigner) -> Self {
        signer.public.clone()
    }
}

impl std::fmt::Debug for SshCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshCa")
            .field("public", &self.authorized_keys_line().trim_end())
            .finish_non_exhaustive()
    }
}

impl SshCa {
    /// The CA whose Ed25519 seed is `seed` (exactly 32 bytes).
    pub fn from_seed(seed: &DataKey) -> Result<Self, SshError> {
        let bytes: Zeroizing<[u8; 32]> = Zeroizing::new(
            seed.expose_secret()
                .try_into()
                .map_err(|_| SshError::SeedLength(seed.len()))?,
        );
        let keypair = Ed25519Keypair::from_seed(&bytes);
        let key = PrivateKey::new(KeypairData::Ed25519(keypair), "")
            .map_err(ssh("building the CA key"))?;
        let ring_key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&*bytes)
            .map_err(|_| SshError::SeedLength(bytes.len()))?;
        // Both libraries derive the public key from the one seed; they must agree.
        if ring::signature::KeyPair::public_key(&ring_key).as_ref()
            != key
                .public_key()
                .key_data()
                .ed25519()
                .map(|k| k.0.as_slice())
                .unwrap_or_default()
        {
            return Err(SshError::Ssh {
                what: "building the CA key",
                source: ssh_key::Error::PublicKey,
            });
        }
        let signer = CaSigner {
            key: ring_key,
            public: key.public_key().key_data().clone(),
        };
        Ok(Self { key, signer })
    }

    /// The CA's public key.
    pub fn public_key(&self) -> &PublicKey {
        self.key.public_key()
    }

    /// The CA public key as an OpenSSH `authorized_keys` line (`ssh-ed25519 AAAA…\n`), as
    /// sshd's `TrustedUserCAKeys` file holds it.
    pub fn authorized_keys_line(&self) -> String {
        authorized_keys_line(self.key.public_key().key_data())
    }

    /// Signs an OpenSSH host certificate for `host_key`: type host, the given
    /// principals, valid from `now` − [`HOST_CERTIFICATE_BACKDATE`] to `now` +
    /// [`HOST_CERTIFICATE_VALIDITY`] (so an expired node's certificate stops working), key ID =
    /// the first principal, a random non-zero 64-bit serial (so one certificate can be
    /// revoked), no critical options or extensions, a fresh 32-byte nonce. Which principals a
    /// node may have is the caller's decision.
    ///
    /// An empty principal list is refused: a certificate without principals is valid for
    /// every host name.
    pub fn sign_host_certificate(
        &self,
        host_key: &PublicKey,
        principals: &[String],
        now: SystemTime,
    ) -> Result<HostCertificate, SshError> {
        check_host_key(host_key)?;
        check_principals(principals)?;
        let first = principals
            .first()
            .ok_or_else(|| SshError::Principals("the list is empty".into()))?;
        let now = now
            .duration_since(UNIX_EPOCH)
            .map_err(|_| SshError::Clock)?
            .as_secs();
        let valid_after = now.saturating_sub(HOST_CERTIFICATE_BACKDATE.as_secs());
        let valid_before = now.saturating_add(HOST_CERTIFICATE_VALIDITY.as_secs());
        let rng = SystemRandom::new();
        let mut nonce = [0u8; 32];
        rng.fill(&mut nonce).map_err(|_| SshError::Random)?;
        let serial = random_serial(&rng)?;
        let mut builder = Builder::new(
            nonce.to_vec(),
            host_key.key_data().clone(),
            valid_after,
            valid_before,
        )
        .map_err(ssh("building the certificate"))?;
        builder
            .cert_type(CertType::Host)
            .and_then(|b| b.serial(serial))
            .and_then(|b| b.key_id(first.clone()))
            .map_err(ssh("building the certificate"))?;
        for p in principals {
            builder
                .valid_principal(p.clone())
                .map_err(ssh("adding a principal"))?;
        }
        let cert = builder
            .sign(&self.signer)
            .map_err(ssh("signing the certificate"))?;
        Ok(HostCertificate(cert))
    }
}

/// A random serial, never 0 (what tools show for "no serial"): two certificates share one
/// with probability 2⁻⁶⁴ per pair, so a serial names one certificate in a revocation list.
fn random_serial(rng: &SystemRandom) -> Result<u64, SshError> {
    loop {
        let mut bytes = [0u8; 8];
        rng.fill(&mut bytes).map_err(|_| SshError::Random)?;
        let serial = u64::from_be_bytes(bytes);
        if serial != 0 {
            return Ok(serial);
        }
    }
}

fn check_host_key(key: &PublicKey) -> Result<(), SshError> {
    match key.algorithm() {
        Algorithm::Ed25519 => Ok(()),
        other => Err(SshError::Algorithm(other.to_string())),
    }
}

/// Checks the shape of a principal list as [`SshCa::sign_host_certificate`] does: 1 to
/// [`MAX_PRINCIPALS`] principals of 1 to [`MAX_PRINCIPAL_LEN`] printable ASCII bytes.
pub fn check_principals(principals: &[String]) -> Result<(), SshError> {
    if principals.is_empty() {
        return Err(SshError::Principals("the list is empty".into()));
    }
    if principals.len() > MAX_PRINCIPALS {
        return Err(SshError::Principals(format!(
            "{} principals, at most {MAX_PRINCIPALS} are accepted",
            principals.len()
        )));
    }
    for p in principals {
        if p.is_empty() || p.len() > MAX_PRINCIPAL_LEN {
            return Err(SshError::Principals(format!(
                "a principal is {} bytes long, 1 to {MAX_PRINCIPAL_LEN} are accepted",
                p.len()
            )));
        }
        if !p.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SshError::Principals(
                "a principal holds a byte outside printable ASCII".into(),
            ));
        }
    }
    Ok(())
}

/// An OpenSSH host certificate signed by the [`SshCa`].
#[derive(Debug, Clone)]
pub struct HostCertificate(Certificate);

impl HostCertificate {
    /// The certificate.
    pub fn certificate(&self) -> &Certificate {
        &self.0
    }

    /// The `authorized_keys` text encoding (`ssh-ed25519-cert-v01@openssh.com AAAA…\n`),
    /// as sshd's `HostCertificate` file holds it.
    pub fn to_authorized_keys_line(&self) -> Result<String, SshError> {
        let mut line = self
            .0
            .to_openssh()
            .map_err(ssh("encoding the certificate"))?;
        line.push('\n');
        Ok(line)
    }
}

/// Parses an SSH wire-format public key (the `ssh-ed25519` blob that a join request carries as the node's host key).
/// Only Ed25519 keys are accepted.
pub fn parse_wire_public_key(bytes: &[u8]) -> Result<PublicKey, SshError> {
    if bytes.len() > MAX_WIRE_PUBLIC_KEY_LEN {
        return Err(SshError::PublicKeyTooLong(bytes.len()));
    }
    let key = PublicKey::from_bytes(bytes).map_err(SshError::PublicKey)?;
    check_host_key(&key)?;
    Ok(key)
}

/// The SSH wire format of `key` (what a node sends as `host_public_key`).
pub fn wire_public_key(key: &PublicKey) -> Result<Vec<u8>, SshError> {
    key.to_bytes().map_err(ssh("encoding the public key"))
}

/// The `authorized_keys` line of a public key, with a trailing newline.
fn authorized_keys_line(key: &KeyData) -> String {
    let mut line = PublicKey::new(key.clone(), "")
        .to_openssh()
        .unwrap_or_default();
    line.push('\n');
    line
}

/// A node's SSH host key (Ed25519).
pub struct HostKey {
    key: PrivateKey,
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKey")
            .field(
                "public",
                &authorized_keys_line(self.key.public_key().key_data()).trim_end(),
            )
            .finish_non_exhaustive()
    }
}

impl HostKey {
    /// A fresh random Ed25519 host key.
    pub fn generate() -> Result<Self, SshError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        SystemRandom::new()
            .fill(seed.as_mut())
            .map_err(|_| SshError::Random)?;
        let keypair = Ed25519Keypair::from_seed(&seed);
        let key = PrivateKey::new(KeypairData::Ed25519(keypair), "")
            .map_err(ssh("building the host key"))?;
        Ok(Self { key })
    }

    /// Parses an OpenSSH private key file's contents (unencrypted Ed25519).
    pub fn from_openssh(text: &str) -> Result<Self, SshError> {
        let key = PrivateKey::from_openssh(text).map_err(ssh("parsing the host key"))?;
        check_host_key(key.public_key())?;
        if key.is_encrypted() {
            return Err(SshError::Algorithm("an encrypted key".into()));
        }
        Ok(Self { key })
    }

    /// The public key.
    pub fn public_key(&self) -> &PublicKey {
        self.key.public_key()
    }

    /// The SSH wire format of the public key.
    pub fn public_key_wire(&self) -> Result<Vec<u8>, SshError> {
        wire_public_key(self.key.public_key())
    }

    /// The OpenSSH private key file contents (`-----BEGIN OPENSSH PRIVATE KEY-----`).
    pub fn to_openssh(&self) -> Result<Zeroizing<String>, SshError> {
        self.key
            .to_openssh(LineEnding::LF)
            .map_err(ssh("encoding the host key"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use ssh_key::HashAlg;

    fn ca(seed: u8) -> SshCa {
        SshCa::from_seed(&DataKey::new(vec![seed; 32]).unwrap()).unwrap()
    }

    #[test]
    fn the_ca_is_a_pure_function_of_its_seed() {
        assert_eq!(ca(7).authorized_keys_line(), ca(7).authorized_keys_line());
        assert_ne!(ca(7).authorized_keys_line(), ca(8).authorized_keys_line());
        let line = ca(7).authorized_keys_line();
        assert!(
            line.starts_with("ssh-ed25519 AAAA") && line.ends_with('\n'),
            "{line}"
        );
        assert_eq!(line.matches('\n').count(), 1);
        PublicKey::from_openssh(line.trim_end()).unwrap();
    }

    #[test]
    fn a_seed_of_the_wrong_length_is_refused() {
        let err = SshCa::from_seed(&DataKey::new(vec![1; 31]).unwrap()).unwrap_err();
        assert!(matches!(err, SshError::SeedLength(31)));
    }

    #[test]
    fn host_certificate_has_every_field_of_the_reference_format() {
        let ca = ca(1);
        let host = HostKey::generate().unwrap();
        let wire = host.public_key_wire().unwrap();
        let parsed = parse_wire_public_key(&wire).unwrap();
        assert_eq!(parsed.key_data(), host.public_key().key_data());
        let principals = vec!["127.0.10.2".to_owned(), "worker-0".to_owned()];
        let now = UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let line = ca
            .sign_host_certificate(&parsed, &principals, now)
            .unwrap()
            .to_authorized_keys_line()
            .unwrap();
        assert!(
            line.starts_with("ssh-ed25519-cert-v01@openssh.com AAAA"),
            "{line}"
        );
        assert!(line.ends_with('\n'));

        let cert = Certificate::from_openssh(line.trim_end()).unwrap();
        assert_eq!(cert.cert_type(), CertType::Host);
        assert_eq!(cert.valid_principals(), principals.as_slice());
        assert_eq!(cert.valid_after(), 1_700_000_000 - 3600);
        assert_eq!(cert.valid_before(), 1_700_000_000 + 365 * 24 * 3600);
        assert_eq!(cert.key_id(), "127.0.10.2");
        assert_ne!(cert.serial(), 0);
        assert!(cert.critical_options().is_empty());
        assert!(cert.extensions().is_empty());
        assert_eq!(cert.nonce().len(), 32);
        assert_eq!(cert.public_key(), host.public_key().key_data());
        assert_eq!(cert.signature_key(), ca.public_key().key_data());
        let ca_fp = ca.public_key().fingerprint(HashAlg::Sha256);
        cert.validate_at(1_700_000_001, [&ca_fp]).unwrap();
        // Another CA's fingerprint does not validate it.
        let other = self::ca(2).public_key().fingerprint(HashAlg::Sha256);
        assert!(cert.validate_at(1_700_000_001, [&other]).is_err());
        // Nor does a year and a day later.
        assert!(
            cert.validate_at(1_700_000_000 + 366 * 24 * 3600, [&ca_fp])
                .is_err()
        );
    }

    #[test]
    fn the_ca_signs_exactly_as_ssh_keys_own_ed25519_key_does() {
        // Ed25519 is deterministic: one seed and one message give one signature, so the
        // signer built once must give ssh-key's signature byte for byte.
        use signature::Signer;
        let ca = ca(3);
        for msg in [&b""[..], b"host certificate", &[0xa5; 1000]] {
            let ours: ssh_key::Signature = ca.signer.try_sign(msg).unwrap();
            let theirs: ssh_key::Signature = ca.key.try_sign(msg).unwrap();
            assert_eq!(ours, theirs);
        }
        assert_eq!(KeyData::from(&ca.signer), *ca.public_key().key_data());
    }

    #[test]
    fn every_host_certificate_has_its_own_serial() {
        let ca = ca(1);
        let host = HostKey::generate().unwrap();
        let principals = vec!["worker-0".to_owned()];
        let serials: std::collections::BTreeSet<u64> = (0..64)
            .map(|_| {
                ca.sign_host_certificate(host.public_key(), &principals, SystemTime::now())
                    .unwrap()
                    .certificate()
                    .serial()
            })
            .collect();
        assert_eq!(serials.len(), 64);
        assert!(!serials.contains(&0));
    }

    #[test]
    fn empty_or_odd_principals_are_refused() {
        let ca = ca(1);
        let host = HostKey::generate().unwrap();
        let now = SystemTime::now();
        for bad in [
            vec![],
            vec![String::new()],
            vec!["a b".to_owned()],
            vec!["x".repeat(256)],
            (0..65).map(|i| i.to_string()).collect(),
        ] {
            assert!(
                matches!(
                    ca.sign_host_certificate(host.public_key(), &bad, now),
                    Err(SshError::Principals(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_or_oversized_wire_keys_are_refused() {
        assert!(matches!(
            parse_wire_public_key(b"garbage"),
            Err(SshError::PublicKey(_))
        ));
        assert!(matches!(
            parse_wire_public_key(&[0u8; 2000]),
            Err(SshError::PublicKeyTooLong(2000))
        ));
    }

    #[test]
    fn host_key_round_trips_through_openssh_format_and_debug_redacts_it() {
        let key = HostKey::generate().unwrap();
        let text = key.to_openssh().unwrap();
        assert!(text.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
        let back = HostKey::from_openssh(&text).unwrap();
        assert_eq!(back.public_key(), key.public_key());
        assert!(!format!("{key:?}").contains("PRIVATE"));
    }
}
