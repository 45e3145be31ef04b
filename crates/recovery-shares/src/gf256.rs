//! Shamir's secret sharing over GF(2^8), byte by byte.
//!
//! The field is the AES one (reduction polynomial x^8 + x^4 + x^3 + x + 1). Multiplication
//! is a fixed sequence of shifts and masks, and inversion a fixed chain of multiplications
//! (a^254), so that neither the time taken nor the memory touched depends on secret bytes:
//! the log/exp tables most implementations use leak through the cache.

use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

/// Product in GF(2^8), in constant time.
pub(crate) fn mul(a: u8, b: u8) -> u8 {
    let (mut a, mut b, mut product) = (a, b, 0u8);
    for _ in 0..8 {
        // All ones when the low bit of `b` is set, else zero: no branch on the value.
        product ^= a & 0u8.wrapping_sub(b & 1);
        let carry = 0u8.wrapping_sub(a >> 7);
        a = (a << 1) ^ (carry & 0x1b);
        b >>= 1;
    }
    product
}

/// Inverse in GF(2^8) (and 0 for 0), as a^254, in constant time.
pub(crate) fn inv(a: u8) -> u8 {
    let mut square = a;
    let mut result = 1u8;
    // 254 = 0b1111_1110: the product of a^2, a^4, …, a^128.
    for _ in 0..7 {
        square = mul(square, square);
        result = mul(result, square);
    }
    result
}

/// One share: its x coordinate (1..=255) and the polynomials' values there, one per byte of
/// the secret.
pub(crate) struct RawShare {
    pub(crate) x: u8,
    pub(crate) y: Zeroizing<Vec<u8>>,
}

/// Splits `secret` into `n` shares at x = 1..=n, any `m` of which give it back.
///
/// The caller has checked 1 ≤ m ≤ n ≤ 255.
pub(crate) fn split(
    secret: &[u8],
    m: u8,
    n: u8,
) -> Result<Vec<RawShare>, ring::error::Unspecified> {
    // For each secret byte, m − 1 random coefficients; the constant term is the byte.
    let degree = usize::from(m.saturating_sub(1));
    let mut coefficients = Zeroizing::new(vec![0u8; secret.len() * degree]);
    SystemRandom::new().fill(coefficients.as_mut_slice())?;
    let mut shares = Vec::with_capacity(usize::from(n));
    for x in 1..=n {
        let mut y = Zeroizing::new(Vec::with_capacity(secret.len()));
        for (byte, coeffs) in secret
            .iter()
            .zip(chunks(&coefficients, degree, secret.len()))
        {
            // Horner's rule from the highest coefficient down to the secret byte.
            let value = coeffs.iter().rev().fold(0u8, |acc, c| mul(acc, x) ^ c);
            y.push(mul(value, x) ^ byte);
        }
        shares.push(RawShare { x, y });
    }
    Ok(shares)
}

/// `count` slices of `size` bytes (empty ones when `size` is 0, for m = 1).
fn chunks(bytes: &[u8], size: usize, count: usize) -> impl Iterator<Item = &[u8]> {
    (0..count).map(move |i| bytes.get(i * size..(i + 1) * size).unwrap_or(&[]))
}

/// Interpolates the shares' polynomials at 0. The caller has checked that the x coordinates
/// are distinct and non-zero and that every share has the same length.
pub(crate) fn combine(shares: &[RawShare], len: usize) -> Zeroizing<Vec<u8>> {
    let mut secret = Zeroizing::new(vec![0u8; len]);
    for share in shares {
        // The Lagrange basis polynomial of this share, evaluated at 0:
        // the product over the others of x_j / (x_j − x_i); subtraction is XOR.
        let basis = shares
            .iter()
            .filter(|other| other.x != share.x)
            .fold(1u8, |acc, other| {
                mul(acc, mul(other.x, inv(other.x ^ share.x)))
            });
        for (out, y) in secret.iter_mut().zip(share.y.iter()) {
            *out ^= mul(*y, basis);
        }
    }
    secret
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slow reference multiplication: schoolbook carry-less product, then reduction.
    fn reference_mul(a: u8, b: u8) -> u8 {
        let mut product: u16 = 0;
        for bit in 0..8 {
            if b >> bit & 1 == 1 {
                product ^= u16::from(a) << bit;
            }
        }
        for bit in (8..16).rev() {
            if product >> bit & 1 == 1 {
                product ^= 0x11b << (bit - 8);
            }
        }
        product as u8
    }

    #[test]
    fn multiplication_matches_the_aes_standard_vectors() {
        // FIPS-197 §4.2: {57} • {83} = {c1}, {57} • {13} = {fe}; §5.1.1: {53}⁻¹ = {ca}.
        assert_eq!(mul(0x57, 0x83), 0xc1);
        assert_eq!(mul(0x57, 0x13), 0xfe);
        assert_eq!(inv(0x53), 0xca);
        assert_eq!(inv(0xca), 0x53);
        assert_eq!(inv(1), 1);
        assert_eq!(inv(0), 0);
    }

    #[test]
    fn multiplication_and_inverse_agree_with_a_reference_on_the_whole_field() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), reference_mul(a, b), "{a:#x} * {b:#x}");
            }
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1, "{a:#x} * inv");
            }
        }
    }

    #[test]
    fn a_known_polynomial_gives_known_shares() {
        // f(x) = 0x42 + 0x03 x over GF(2^8): f(1) = 0x41, f(2) = 0x44, f(3) = 0x47.
        let shares = [(1u8, 0x41u8), (2, 0x44), (3, 0x47)];
        for (x, y) in shares {
            assert_eq!(0x42 ^ mul(0x03, x), y);
        }
        let raw = |x: u8, y: u8| RawShare {
            x,
            y: Zeroizing::new(vec![y]),
        };
        assert_eq!(
            combine(&[raw(1, 0x41), raw(3, 0x47)], 1).as_slice(),
            &[0x42]
        );
        assert_eq!(
            combine(&[raw(2, 0x44), raw(3, 0x47)], 1).as_slice(),
            &[0x42]
        );
    }
}
