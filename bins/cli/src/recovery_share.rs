//! `asterism recovery-share decrypt`: a custodian decrypts their share of the master secret
//! with their own key, for `asterism recover --share`. Also the reading of custodians' public
//! keys for `asterism init --recovery-recipient`.

use anyhow::{Context, Result, bail};
use asterism_binkit::fs::{PRIVATE_MODE, read_capped, write_atomic};
use asterism_recovery_shares::{Custodian, CustodianIdentity, EncryptedShareFile, decrypt_share};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Key and share files are small; a larger file is not one of them.
const MAX_FILE: u64 = 256 * 1024;

/// Arguments of `asterism recovery-share`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `asterism recovery-share`.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Decrypt one share with its custodian's private key, for `asterism recover --share`.
    Decrypt(DecryptArgs),
}

/// Arguments of `asterism recovery-share decrypt`.
#[derive(clap::Args, Debug)]
pub struct DecryptArgs {
    /// The encrypted share (`share-I-of-N.json` from the workspace's `recovery-shares/`).
    #[arg(long, value_name = "FILE")]
    pub share: PathBuf,
    /// The custodian's private key: an age identity file (AGE-SECRET-KEY-1…) or an
    /// unencrypted OpenSSH Ed25519 private key. Passphrase-protected SSH keys are refused.
    #[arg(long, value_name = "FILE")]
    pub identity: PathBuf,
    /// Where to write the decrypted share (mode 0600). Default: the share's name with
    /// `.decrypted.json` in place of `.json`, next to it. Refuses to overwrite.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Runs `asterism recovery-share`.
pub fn run(args: &Args) -> Result<PathBuf> {
    match &args.command {
        Command::Decrypt(args) => decrypt(args),
    }
}

/// Decrypts one share and writes it, 0600, to the returned path.
pub fn decrypt(args: &DecryptArgs) -> Result<PathBuf> {
    let share_name = args.share.display().to_string();
    let share = EncryptedShareFile::from_json(&read_capped(&args.share, MAX_FILE)?, &share_name)?;
    let identity_name = args.identity.display().to_string();
    let key = Zeroizing::new(read_capped(&args.identity, MAX_FILE)?);
    let identity = CustodianIdentity::from_bytes(&key, &identity_name)?;
    let decrypted = decrypt_share(&share, &identity)?;
    let out = args.out.clone().unwrap_or_else(|| default_out(&args.share));
    if out.exists() {
        bail!(
            "{} already exists; not overwriting a decrypted share (choose another --out)",
            out.display()
        );
    }
    write_atomic(&out, &decrypted.to_json(), PRIVATE_MODE)?;
    Ok(out)
}

/// `share-2-of-3.json` → `share-2-of-3.decrypted.json`, next to it.
fn default_out(share: &Path) -> PathBuf {
    let stem = share
        .file_stem()
        .map_or_else(|| "share".into(), |s| s.to_string_lossy().into_owned());
    share.with_file_name(format!("{stem}.decrypted.json"))
}

/// Reads one custodian's public key from each file, in order.
pub fn read_custodians(files: &[PathBuf]) -> Result<Vec<Custodian>> {
    files
        .iter()
        .map(|path| {
            let bytes = read_capped(path, MAX_FILE)?;
            let text = std::str::from_utf8(&bytes)
                .with_context(|| format!("{} is not text", path.display()))?;
            Ok(Custodian::parse(text, &path.display().to_string())?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use age::secrecy::ExposeSecret as _;
    use asterism_kms::{MasterSecret, Salt};
    use asterism_recovery_shares::{DecryptedShareFile, RecoveryRecord, reconstruct, split};
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn decrypt_writes_a_private_share_that_reconstructs_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<age::x25519::Identity> =
            (0..2).map(|_| age::x25519::Identity::generate()).collect();
        let mut recipients = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let path = dir.path().join(format!("c{i}.pub"));
            std::fs::write(&path, format!("# custodian {i}\n{}\n", key.to_public())).unwrap();
            recipients.push(path);
        }
        let secret = MasterSecret::generate().unwrap();
        let split = split(
            &secret,
            &Salt::generate().unwrap(),
            "2-of-2".parse().unwrap(),
            &read_custodians(&recipients).unwrap(),
        )
        .unwrap();
        let mut decrypted = Vec::new();
        for (i, (share, key)) in split.shares.iter().zip(&keys).enumerate() {
            let share_path = dir.path().join(share.file_name());
            std::fs::write(&share_path, share.to_json()).unwrap();
            let key_path = dir.path().join(format!("c{i}.key"));
            std::fs::write(&key_path, key.to_string().expose_secret()).unwrap();
            let args = DecryptArgs {
                share: share_path.clone(),
                identity: key_path,
                out: None,
            };
            let out = decrypt(&args).unwrap();
            assert_eq!(
                out,
                dir.path()
                    .join(format!("share-{}-of-2.decrypted.json", i + 1))
            );
            assert_eq!(
                std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
                0o600
            );
            let err = decrypt(&args).unwrap_err();
            assert!(err.to_string().contains("already exists"), "{err}");
            let bytes = std::fs::read(&out).unwrap();
            decrypted
                .push(DecryptedShareFile::from_json(&bytes, &out.display().to_string()).unwrap());
        }
        let record = RecoveryRecord::from_json(&split.record.to_json(), "recovery.json").unwrap();
        assert_eq!(reconstruct(&decrypted, &record).unwrap(), secret);
    }
}
