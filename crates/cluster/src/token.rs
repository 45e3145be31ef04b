//! The kubeadm bootstrap token a joining node authenticates with.

use std::fmt;
use std::time::SystemTime;

use zeroize::Zeroizing;

/// The length of a token's ID, the public part before the dot.
pub const TOKEN_ID_LEN: usize = 6;
/// The length of a token's secret, the part after the dot.
pub const TOKEN_SECRET_LEN: usize = 16;
const TOKEN_LEN: usize = TOKEN_ID_LEN + 1 + TOKEN_SECRET_LEN;
const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A text is not a bootstrap token. The text is never shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the bootstrap token is not of the form [a-z0-9]{{6}}.[a-z0-9]{{16}}")]
pub struct TokenError;

/// A kubeadm bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}`, checked once when it is made.
/// Secret: not `Clone`, no `Serialize`, `Debug` shows the ID only, wiped on drop.
pub struct BootstrapToken(Zeroizing<String>);

/// Whether `s` has the bootstrap token format `[a-z0-9]{6}.[a-z0-9]{16}`.
#[must_use]
pub fn is_bootstrap_token(s: &str) -> bool {
    s.len() == TOKEN_LEN
        && s.bytes().enumerate().all(|(i, b)| {
            if i == TOKEN_ID_LEN {
                b == b'.'
            } else {
                b.is_ascii_lowercase() || b.is_ascii_digit()
            }
        })
}

impl BootstrapToken {
    /// The token `text` (`id.secret`), which must have the kubeadm format. A refused text
    /// is wiped all the same.
    pub fn new(text: Zeroizing<String>) -> Result<Self, TokenError> {
        if is_bootstrap_token(&text) {
            Ok(Self(text))
        } else {
            Err(TokenError)
        }
    }

    /// The token `text` (`id.secret`), copied into memory that is wiped on drop.
    pub fn parse(text: &str) -> Result<Self, TokenError> {
        Self::new(Zeroizing::new(text.to_owned()))
    }

    /// A random token, uniform over the 36 characters, from the random bytes `fill` writes
    /// (the caller's secure random generator).
    pub fn generate<E>(mut fill: impl FnMut(&mut [u8]) -> Result<(), E>) -> Result<Self, E> {
        let mut out = Zeroizing::new(String::with_capacity(TOKEN_LEN));
        let mut buf = Zeroizing::new([0u8; 64]);
        while out.len() < TOKEN_LEN {
            fill(buf.as_mut())?;
            for &b in buf.iter() {
                if out.len() == TOKEN_ID_LEN {
                    out.push('.');
                }
                // 252 = 7 × 36: rejection sampling keeps the characters uniform.
                if b < 252
                    && out.len() < TOKEN_LEN
                    && let Some(&c) = ALPHABET.get(usize::from(b % 36))
                {
                    out.push(char::from(c));
                }
            }
        }
        Ok(Self(out))
    }

    /// The token text (`id.secret`). Keep it out of logs.
    #[must_use]
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// The token ID (the public part before the dot; it names the token's Secret).
    #[must_use]
    pub fn id(&self) -> &str {
        self.0.get(..TOKEN_ID_LEN).unwrap_or_default()
    }

    /// The secret part after the dot. Keep it out of logs.
    #[must_use]
    pub fn expose_secret_part(&self) -> &str {
        self.0.get(TOKEN_ID_LEN + 1..).unwrap_or_default()
    }
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BootstrapToken {{ id: {:?}, secret: <redacted> }}",
            self.id()
        )
    }
}

/// A bootstrap token with its expiry, as a token store (the join service's database, the
/// Kubernetes API's Secrets) keeps it.
#[derive(Debug)]
pub struct ExpiringToken {
    /// The token.
    pub token: BootstrapToken,
    /// When Kubernetes stops accepting it.
    pub expires: SystemTime,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn os_random(buf: &mut [u8]) -> Result<(), ()> {
        // A test's stand-in for a secure generator: distinct bytes per call are enough to
        // exercise the format (the callers pass ring's SystemRandom).
        use std::sync::atomic::{AtomicU64, Ordering};
        static STATE: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
        for b in buf {
            let x = STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
            *b = (x.wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 56) as u8;
        }
        Ok(())
    }

    #[test]
    fn generated_tokens_have_the_kubeadm_format_and_debug_hides_the_secret() {
        for _ in 0..200 {
            let t = BootstrapToken::generate(os_random).unwrap();
            assert!(is_bootstrap_token(t.expose_secret()), "{t:?}");
            let again = BootstrapToken::parse(t.expose_secret()).unwrap();
            assert_eq!(again.expose_secret(), t.expose_secret());
            let debug = format!("{t:?}");
            assert!(!debug.contains(t.expose_secret_part()), "{debug}");
            assert!(debug.contains(t.id()), "{debug}");
        }
    }

    #[test]
    fn a_failing_generator_fails_the_token() {
        assert_eq!(
            BootstrapToken::generate(|_| Err("no randomness")).unwrap_err(),
            "no randomness"
        );
    }

    #[test]
    fn parse_rejects_anything_but_the_kubeadm_format() {
        for bad in [
            "",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef0",
            "ABCDEF.0123456789abcdef",
            "abcdef-0123456789abcdef",
            "abcdef0123456789abcdef",
            "abcde.f0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcd_f",
            "abcdéf.0123456789abcdef",
        ] {
            assert_eq!(BootstrapToken::parse(bad).unwrap_err(), TokenError, "{bad}");
            assert!(!is_bootstrap_token(bad), "{bad}");
        }
        let t = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        assert_eq!(t.id(), "abcdef");
        assert_eq!(t.expose_secret_part(), "0123456789abcdef");
    }

    #[test]
    fn the_error_does_not_show_the_text() {
        let err = BootstrapToken::parse("not-a-token-secret").unwrap_err();
        assert!(!err.to_string().contains("not-a-token-secret"));
    }
}
