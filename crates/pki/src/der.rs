//! Private-key container conversions that the ring backend lacks: SEC1 `EC PRIVATE KEY`
//! and PKCS#1 `RSA PRIVATE KEY` to and from PKCS#8.

use yasna::models::ObjectIdentifier;
use yasna::{ASN1Error, Tag};
use zeroize::Zeroizing;

const OID_EC_PUBLIC_KEY: &[u64] = &[1, 2, 840, 10045, 2, 1];
const OID_P256: &[u64] = &[1, 2, 840, 10045, 3, 1, 7];
const OID_RSA_ENCRYPTION: &[u64] = &[1, 2, 840, 113549, 1, 1, 1];

/// The fields of an ECPrivateKey (RFC 5915).
struct EcPrivateKey {
    private: Zeroizing<Vec<u8>>,
    public: Option<(Vec<u8>, usize)>,
}

fn parse_ec_private_key(der: &[u8]) -> Result<(EcPrivateKey, Option<ObjectIdentifier>), ASN1Error> {
    yasna::parse_der(der, |r| {
        r.read_sequence(|r| {
            let version = r.next().read_u8()?;
            if version != 1 {
                return Err(ASN1Error::new(yasna::ASN1ErrorKind::Invalid));
            }
            let private = Zeroizing::new(r.next().read_bytes()?);
            let params = r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_oid()))?;
            let public =
                r.read_optional(|r| r.read_tagged(Tag::context(1), |r| r.read_bitvec_bytes()))?;
            Ok((EcPrivateKey { private, public }, params))
        })
    })
}

fn write_ec_private_key(key: &EcPrivateKey, with_params: bool) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_u8(1);
            w.next().write_bytes(&key.private);
            if with_params {
                w.next().write_tagged(Tag::context(0), |w| {
                    w.write_oid(&ObjectIdentifier::from_slice(OID_P256));
                });
            }
            if let Some((bits, len)) = &key.public {
                w.next().write_tagged(Tag::context(1), |w| {
                    w.write_bitvec_bytes(bits, *len);
                });
            }
        });
    }))
}

/// A SEC1 `ECPrivateKey` (P-256) as PKCS#8. The curve parameters move to the algorithm
/// identifier, as ring expects.
pub fn sec1_p256_to_pkcs8(sec1: &[u8]) -> Result<Zeroizing<Vec<u8>>, ASN1Error> {
    let (key, params) = parse_ec_private_key(sec1)?;
    if params.is_some_and(|p| p != ObjectIdentifier::from_slice(OID_P256)) {
        return Err(ASN1Error::new(yasna::ASN1ErrorKind::Invalid));
    }
    let inner = write_ec_private_key(&key, false);
    Ok(Zeroizing::new(yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_u8(0);
            w.next().write_sequence(|w| {
                w.next()
                    .write_oid(&ObjectIdentifier::from_slice(OID_EC_PUBLIC_KEY));
                w.next().write_oid(&ObjectIdentifier::from_slice(OID_P256));
            });
            w.next().write_bytes(&inner);
        });
    })))
}

/// A PKCS#1 `RSAPrivateKey` as PKCS#8.
pub fn pkcs1_to_pkcs8(pkcs1: &[u8]) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_u8(0);
            w.next().write_sequence(|w| {
                w.next()
                    .write_oid(&ObjectIdentifier::from_slice(OID_RSA_ENCRYPTION));
                w.next().write_null();
            });
            w.next().write_bytes(pkcs1);
        });
    }))
}

/// A PKCS#8 P-256 key as a SEC1 `ECPrivateKey` with the named-curve parameters, as
/// OpenSSL and kubeadm write `EC PRIVATE KEY` files.
pub fn pkcs8_p256_to_sec1(pkcs8: &[u8]) -> Result<Zeroizing<Vec<u8>>, ASN1Error> {
    let inner: Zeroizing<Vec<u8>> = yasna::parse_der(pkcs8, |r| {
        r.read_sequence(|r| {
            let _version = r.next().read_u8()?;
            r.next().read_sequence(|r| {
                let alg = r.next().read_oid()?;
                let curve = r.next().read_oid()?;
                if alg != ObjectIdentifier::from_slice(OID_EC_PUBLIC_KEY)
                    || curve != ObjectIdentifier::from_slice(OID_P256)
                {
                    return Err(ASN1Error::new(yasna::ASN1ErrorKind::Invalid));
                }
                Ok(())
            })?;
            let inner = Zeroizing::new(r.next().read_bytes()?);
            // PKCS#8 v2 may carry the public key as [1]; ignore it.
            let _ = r.read_optional(|r| {
                r.read_tagged_implicit(Tag::context(1), |r| r.read_bitvec_bytes())
            })?;
            Ok(inner)
        })
    })?;
    let (key, _) = parse_ec_private_key(&inner)?;
    Ok(write_ec_private_key(&key, true))
}
