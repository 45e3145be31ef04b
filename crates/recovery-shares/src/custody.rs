//! Custodians' keys and the age encryption of a share to one of them.

use crate::Error;
use crate::format::{DecryptedShareFile, EncryptedShareFile, label_of};
use age::armor::{ArmoredReader, ArmoredWriter, Format};
use std::fmt;
use std::io::{Read as _, Write as _};
use std::str::FromStr;
use zeroize::Zeroizing;

/// A decrypted share is a few hundred bytes; a larger plaintext is not one of ours.
const MAX_PLAINTEXT: u64 = 64 * 1024;

/// One custodian's public key: an age X25519 recipient (`age1…`) or an SSH Ed25519 public
/// key (`ssh-ed25519 AAAA… comment`). SSH RSA keys are refused: one kind of SSH key keeps
/// the custodians' side simple, and Ed25519 is what `ssh-keygen` makes by default.
#[derive(Clone)]
pub struct Custodian {
    text: String,
    key: CustodianKey,
}

#[derive(Clone)]
enum CustodianKey {
    Age(age::x25519::Recipient),
    Ssh(age::ssh::Recipient),
}

impl Custodian {
    /// Parses the single key in `text` (surrounding whitespace and `#` comment lines
    /// ignored); `origin` (the file name) is what errors will name.
    pub fn parse(text: &str, origin: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::Custodian {
            origin: origin.to_owned(),
            reason,
        };
        let mut lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        let line = lines
            .next()
            .ok_or_else(|| bad("no key in it (want one age1… or ssh-ed25519 … line)".into()))?;
        if lines.next().is_some() {
            return Err(bad(
                "more than one key in it; give one file per custodian".into()
            ));
        }
        let key = if line.starts_with("age1") {
            CustodianKey::Age(
                age::x25519::Recipient::from_str(line)
                    .map_err(|e| bad(format!("not a valid age X25519 recipient: {e}")))?,
            )
        } else if line.starts_with("ssh-ed25519 ") {
            CustodianKey::Ssh(
                age::ssh::Recipient::from_str(line)
                    .map_err(|e| bad(format!("not a valid SSH Ed25519 public key: {e:?}")))?,
            )
        } else {
            return Err(bad(
                "want an age X25519 recipient (age1…) or an SSH Ed25519 public key \
                 (ssh-ed25519 …); other key types are not accepted"
                    .into(),
            ));
        };
        Ok(Self {
            text: line.to_owned(),
            key,
        })
    }

    fn recipient(&self) -> &dyn age::Recipient {
        match &self.key {
            CustodianKey::Age(r) => r,
            CustodianKey::Ssh(r) => r,
        }
    }

    /// Encrypts `share` to this custodian.
    pub(crate) fn encrypt(&self, share: &DecryptedShareFile) -> Result<EncryptedShareFile, Error> {
        let fail = |reason: String| Error::Encrypt {
            index: share.index(),
            reason,
        };
        let encryptor = age::Encryptor::with_recipients(std::iter::once(self.recipient()))
            .map_err(|e| fail(e.to_string()))?;
        let armor = ArmoredWriter::wrap_output(Vec::new(), Format::AsciiArmor)
            .map_err(|e| fail(e.to_string()))?;
        let mut writer = encryptor
            .wrap_output(armor)
            .map_err(|e| fail(e.to_string()))?;
        writer
            .write_all(&share.to_json())
            .map_err(|e| fail(e.to_string()))?;
        let armored = writer
            .finish()
            .and_then(ArmoredWriter::finish)
            .map_err(|e| fail(e.to_string()))?;
        let ciphertext = String::from_utf8(armored).map_err(|e| fail(e.to_string()))?;
        Ok(EncryptedShareFile::new(
            share,
            self.text.clone(),
            ciphertext,
        ))
    }
}

impl fmt::Display for Custodian {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Custodian {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Custodian({})", self.text)
    }
}

/// A custodian's private key: an age identity file (`AGE-SECRET-KEY-1…`) or an unencrypted
/// OpenSSH Ed25519 private key. Passphrase-protected SSH keys are refused with a message
/// saying how to make an unencrypted copy: this tool never prompts for a passphrase.
pub struct CustodianIdentity {
    origin: String,
    identities: Vec<Box<dyn age::Identity + Send + Sync>>,
}

impl CustodianIdentity {
    /// Parses the contents of an identity file; `origin` (its name) is what errors name.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::Identity {
            origin: origin.to_owned(),
            reason,
        };
        let is_ssh = bytes
            .trim_ascii_start()
            .starts_with(b"-----BEGIN OPENSSH PRIVATE KEY-----");
        let identities: Vec<Box<dyn age::Identity + Send + Sync>> = if is_ssh {
            // The key's type and protection, read from its public part before age sees it.
            let text = std::str::from_utf8(bytes)
                .map_err(|_| bad("not a readable OpenSSH private key".into()))?;
            let key = ssh_key::PrivateKey::from_openssh(text)
                .map_err(|e| bad(format!("not a readable OpenSSH private key: {e}")))?;
            if key.algorithm() != ssh_key::Algorithm::Ed25519 {
                return Err(bad(format!(
                    "an SSH {} key; only SSH Ed25519 keys are accepted",
                    key.algorithm()
                )));
            }
            if key.is_encrypted() {
                return Err(bad(
                    "the SSH key is protected by a passphrase, and this tool never prompts \
                     for one; make an unencrypted copy on a trusted machine \
                     (cp KEY COPY && ssh-keygen -p -N '' -f COPY), use it, then shred it"
                        .into(),
                ));
            }
            match age::ssh::Identity::from_buffer(bytes, Some(origin.to_owned()))
                .map_err(|e| bad(format!("not a readable OpenSSH private key: {e}")))?
            {
                key @ age::ssh::Identity::Unencrypted(_) => vec![Box::new(key)],
                _ => return Err(bad("age cannot use this SSH key".into())),
            }
        } else {
            age::IdentityFile::from_buffer(bytes)
                .map_err(|e| bad(format!("not an age identity file: {e}")))?
                .into_identities()
                .map_err(|e| bad(format!("not an age identity file: {e}")))?
        };
        if identities.is_empty() {
            return Err(bad(
                "no key in it (want AGE-SECRET-KEY-1… or an OpenSSH Ed25519 private key)".into(),
            ));
        }
        Ok(Self {
            origin: origin.to_owned(),
            identities,
        })
    }
}

impl fmt::Debug for CustodianIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CustodianIdentity({}, <redacted>)", self.origin)
    }
}

/// Decrypts `file` with the custodian's `identity` and checks that its contents agree with
/// its labels. The result names `file`'s origin in later errors.
pub fn decrypt_share(
    file: &EncryptedShareFile,
    identity: &CustodianIdentity,
) -> Result<DecryptedShareFile, Error> {
    let origin = file.origin();
    let fail = |reason: String| Error::Decrypt {
        origin: origin.to_owned(),
        reason,
    };
    let decryptor = age::Decryptor::new(ArmoredReader::new(file.ciphertext().as_bytes()))
        .map_err(|e| fail(e.to_string()))?;
    let mut reader = decryptor
        .decrypt(
            identity
                .identities
                .iter()
                .map(|i| i.as_ref() as &dyn age::Identity),
        )
        .map_err(|e| match e {
            age::DecryptError::NoMatchingKeys => Error::NotForThisIdentity {
                origin: origin.to_owned(),
                identity: identity.origin.clone(),
            },
            other => fail(other.to_string()),
        })?;
    let mut plaintext = Zeroizing::new(Vec::new());
    (&mut reader)
        .take(MAX_PLAINTEXT)
        .read_to_end(&mut plaintext)
        .map_err(|e| fail(e.to_string()))?;
    let share = DecryptedShareFile::from_json(&plaintext, origin)?;
    if label_of(&share) != file.label() {
        return Err(Error::EnvelopeMismatch {
            origin: origin.to_owned(),
            inside: label_of(&share),
            outside: file.label(),
        });
    }
    Ok(share)
}
