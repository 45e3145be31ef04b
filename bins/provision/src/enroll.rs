//! `enroll`: an owner certifies the attestation key (AK) of a machine with a real TPM, once
//! per machine, after proving with credential activation that the AK sits in the same TPM
//! as an endorsement key (EK) whose manufacturer certificate the owner's EK CA bundle
//! verifies.
//!
//! Four steps, offline (files carried between the machine and the owner's workstation):
//!
//! 1. machine, [`request`]: reads the EK certificate (and any intermediates from NV), the
//!    EK's public area and the AK's (created and persisted if missing, the same AK the node
//!    quotes with) into `request.json`;
//! 2. owner, [`challenge`]: verifies the EK certificate against the bundle and that it
//!    certifies that EK, checks that the AK is made from our AK template, and makes a
//!    credential for the EK and the AK's name (`TPM2_MakeCredential` in software,
//!    [`crate::credential`]). Writes `challenge.json` and a pending file (mode 0600) that
//!    holds the expected proof, not the credential;
//! 3. machine, [`activate`]: `TPM2_ActivateCredential` with the AK and the EK; answers with
//!    `HMAC-SHA256(credential, "asterism enrolment v1" || AK name || request digest)`, never
//!    the credential itself;
//! 4. owner, [`finish`]: compares the proof in constant time with the pending one and only
//!    then certifies the AK with the platform CA; removes the pending file, so a challenge
//!    is answered at most once.
//!
//! What it proves: the certified AK is a key of a TPM whose EK a trusted manufacturer
//! certified (the TPM would not open the credential otherwise: the seed is encrypted to the
//! EK and the integrity HMAC covers the AK's name). It does not prove which machine the TPM
//! is in: the owner decides which machines to enroll.

use std::fs;
use std::path::Path;
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use asterism_attestation::AkFingerprint;
use asterism_attestation::tpm::check_ak_template;
use asterism_attestation::tpm::ek::{EkCaBundle, certificates_from_nv};
use asterism_attestation::tpm::structures::{ECC_NIST_P256, PublicParams};
use asterism_tpm::{AkAlgorithm, AkConfig, EkCertSlot, Tpm};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use zeroize::Zeroizing;

use crate::ca::PlatformCa;
use crate::credential::{self, Credential};
use crate::node::{AK_CERT_FILE, AK_PUBLIC_FILE, PLATFORM_CA_FILE};
use crate::{AkKind, EkKind, files, progress};

/// The largest request file: an EK certificate and its chain (NV indices of at most 16 KiB).
pub const MAX_REQUEST: u64 = 1024 * 1024;
/// The largest challenge, response and pending files: a few hundred bytes each.
pub const MAX_SMALL_FILE: u64 = 64 * 1024;

const REQUEST_FORMAT: &str = "asterism-enrolment-request-v1";
const CHALLENGE_FORMAT: &str = "asterism-enrolment-challenge-v1";
const RESPONSE_FORMAT: &str = "asterism-enrolment-response-v1";
const PENDING_FORMAT: &str = "asterism-enrolment-pending-v1";

/// What the machine sends to the owner.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// [`REQUEST_FORMAT`].
    pub format: String,
    /// Which EK: `rsa2048` or `ecc-p256`.
    pub ek: EkKind,
    /// The EK certificate as read from NV (base64 of DER, NV padding included).
    pub ek_certificate: String,
    /// Intermediate CA certificates from the EK chain NV indices (base64 of DER each).
    pub ek_chain: Vec<String>,
    /// The EK's `TPMT_PUBLIC` (base64).
    pub ek_public: String,
    /// The AK's `TPMT_PUBLIC` (base64).
    pub ak_public: String,
}

/// What the owner sends back to the machine.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Challenge {
    /// [`CHALLENGE_FORMAT`].
    pub format: String,
    /// SHA-256 of the request file (hex).
    pub request_digest: String,
    /// Which EK the credential is for.
    pub ek: EkKind,
    /// The AK's `TPMT_PUBLIC` (base64), as in the request.
    pub ak_public: String,
    /// The AK's name (hex).
    pub ak_name: String,
    /// The `TPM2B_ID_OBJECT` content (base64).
    pub credential_blob: String,
    /// The `TPM2B_ENCRYPTED_SECRET` content (base64).
    pub encrypted_secret: String,
}

/// What the machine answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    /// [`RESPONSE_FORMAT`].
    pub format: String,
    /// The challenge's request digest (hex).
    pub request_digest: String,
    /// The AK's name (hex).
    pub ak_name: String,
    /// [`credential::enrolment_proof`] (hex).
    pub proof: String,
}

/// What the owner keeps between challenge and finish (mode 0600: the expected proof is as
/// good as an answer). Zeroized when dropped; not `Debug`.
#[derive(Serialize, Deserialize, zeroize::Zeroize, zeroize::ZeroizeOnDrop)]
#[serde(deny_unknown_fields)]
struct Pending {
    format: String,
    request_digest: String,
    ak_public: String,
    ak_name: String,
    /// The TPM as its EK certificate describes it, for the log.
    tpm: String,
    expected_proof: String,
}

impl EkKind {
    fn slot(self) -> EkCertSlot {
        match self {
            EkKind::Rsa2048 => EkCertSlot::Rsa2048,
            EkKind::EccP256 => EkCertSlot::EccP256,
        }
    }
}

fn b64(what: &str, file: &Path, text: &str) -> Result<Vec<u8>> {
    B64.decode(text)
        .with_context(|| format!("{}: {what} is not base64", file.display()))
}

fn read_json<T: for<'de> Deserialize<'de>>(
    path: &Path,
    cap: u64,
    what: &str,
) -> Result<(Vec<u8>, T)> {
    let bytes = asterism_binkit::read_capped(path, cap)?;
    let value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not an enrolment {what}", path.display()))?;
    Ok((bytes, value))
}

fn check_format(path: &Path, found: &str, expected: &str) -> Result<()> {
    if found != expected {
        bail!(
            "{}: format {found:?}, expected {expected:?}",
            path.display()
        );
    }
    Ok(())
}

fn to_json(value: &impl Serialize) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value).context("encoding JSON")?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The AK algorithm of a `TPMT_PUBLIC` (its type field).
fn ak_algorithm(ak_public: &[u8]) -> Result<AkAlgorithm> {
    match ak_public.get(..2) {
        Some([0x00, 0x23]) => Ok(AkAlgorithm::EccP256),
        Some([0x00, 0x01]) => Ok(AkAlgorithm::Rsa2048),
        _ => bail!("the AK public area is neither an ECC nor an RSA key"),
    }
}

/// `enroll request --tpm T [--ek K] [--ak A] --out R`.
pub fn request(tpm: &str, ek: EkKind, ak: AkKind, out: &Path) -> Result<()> {
    files::refuse_existing(&[out.to_owned()])?;
    let mut tpm = Tpm::open(&tpm.parse()?)?;
    let slot = ek.slot();
    let certificate = tpm.read_ek_certificate(slot)?.with_context(|| {
        format!(
            "the TPM has no {ek:?} EK certificate (NV index {:#010x}); try another --ek",
            slot.nv_index()
        )
    })?;
    let mut chain = Vec::new();
    for (index, contents) in tpm.read_ek_certificate_chain()? {
        chain.extend(
            certificates_from_nv(&contents)
                .with_context(|| format!("EK chain NV index {index:#010x}"))?,
        );
    }
    let ek_public = tpm.read_ek_public(slot)?;
    let ak_config = AkConfig::new(match ak {
        AkKind::Ecc => AkAlgorithm::EccP256,
        AkKind::Rsa => AkAlgorithm::Rsa2048,
    });
    let ak = tpm.load_attestation_key(&ak_config)?;
    let request = Request {
        format: REQUEST_FORMAT.to_owned(),
        ek,
        ek_certificate: B64.encode(&certificate),
        ek_chain: chain.iter().map(|c| B64.encode(c)).collect(),
        ek_public: B64.encode(&ek_public),
        ak_public: B64.encode(ak.public_area()),
    };
    files::write_new(out, &to_json(&request)?, 0o644)?;
    progress!(
        "wrote {}: {ek:?} EK certificate ({} intermediates) and AK {} ({})",
        out.display(),
        chain.len(),
        AkFingerprint::of_public_area(ak.public_area()),
        if ak.was_created() {
            "created now"
        } else {
            "already persisted"
        }
    );
    Ok(())
}

/// `enroll challenge --request R --ek-ca-dir B --pending P --out C`.
pub fn challenge(request_path: &Path, bundle_dir: &Path, pending: &Path, out: &Path) -> Result<()> {
    files::refuse_existing(&[pending.to_owned(), out.to_owned()])?;
    let now = SystemTime::now();
    let bundle = EkCaBundle::load_dir(bundle_dir, now)?;
    let (bytes, request): (_, Request) = read_json(request_path, MAX_REQUEST, "request")?;
    check_format(request_path, &request.format, REQUEST_FORMAT)?;
    let request_digest: [u8; 32] = Sha256::digest(&bytes).into();

    let certificate = b64("ek_certificate", request_path, &request.ek_certificate)?;
    let chain = request
        .ek_chain
        .iter()
        .map(|c| b64("ek_chain", request_path, c))
        .collect::<Result<Vec<_>>>()?;
    let ek_public = b64("ek_public", request_path, &request.ek_public)?;
    let ak_public = b64("ak_public", request_path, &request.ak_public)?;

    // The EK: certified by a manufacturer of the bundle, and the key the certificate names.
    let verified = bundle
        .verify(&certificate, &chain, &ek_public, now)
        .with_context(|| {
            format!(
                "{}: the EK certificate is refused; no challenge is made",
                request_path.display()
            )
        })?;
    let tpm = verified.tpm();
    let tpm_text = format!(
        "manufacturer {}, model {}, version {}",
        tpm.manufacturer, tpm.model, tpm.version
    );
    progress!(
        "EK certificate verified: {tpm_text}; chain ends at {} ({})",
        verified.anchor_subject(),
        verified.anchor_file()
    );

    let ek_matches_kind = match (request.ek, &verified.ek_public().params) {
        (EkKind::Rsa2048, PublicParams::Rsa { key_bits, .. }) => *key_bits == 2048,
        (EkKind::EccP256, PublicParams::Ecc { curve, .. }) => *curve == ECC_NIST_P256,
        _ => false,
    };
    if !ek_matches_kind {
        bail!(
            "{}: the EK is not a {:?} key, as the request says",
            request_path.display(),
            request.ek
        );
    }

    // The AK: our template exactly, or a verifier would refuse it anyway.
    check_ak_template(&ak_public).with_context(|| {
        format!(
            "{}: the AK is not an attestation key of our template; no challenge is made",
            request_path.display()
        )
    })?;
    let ak_name = credential::object_name(&ak_public)?;

    let secret = Credential::random()?;
    let made = credential::make_credential(&verified, &ak_name, &secret)
        .context("making the credential for the EK")?;
    let expected = Zeroizing::new(credential::enrolment_proof(
        secret.expose(),
        &ak_name,
        &request_digest,
    ));
    drop(secret);

    let pending_record = Pending {
        format: PENDING_FORMAT.to_owned(),
        request_digest: hex::encode(request_digest),
        ak_public: request.ak_public.clone(),
        ak_name: hex::encode(&ak_name),
        tpm: tpm_text,
        expected_proof: hex::encode(*expected),
    };
    let challenge = Challenge {
        format: CHALLENGE_FORMAT.to_owned(),
        request_digest: hex::encode(request_digest),
        ek: request.ek,
        ak_public: request.ak_public,
        ak_name: hex::encode(&ak_name),
        credential_blob: B64.encode(&made.credential_blob),
        encrypted_secret: B64.encode(&made.encrypted_secret),
    };
    let pending_json = Zeroizing::new(to_json(&pending_record)?);
    files::write_new(pending, &pending_json, 0o600)?;
    if let Err(error) = files::write_new(out, &to_json(&challenge)?, 0o644) {
        let _ = fs::remove_file(pending);
        return Err(error);
    }
    progress!(
        "challenge for AK {} written to {}; keep {} (mode 0600) for `enroll finish`",
        AkFingerprint::of_public_area(&ak_public),
        out.display(),
        pending.display()
    );
    Ok(())
}

/// `enroll activate --tpm T --challenge C --out R`.
pub fn activate(tpm: &str, challenge_path: &Path, out: &Path) -> Result<()> {
    files::refuse_existing(&[out.to_owned()])?;
    let (_, challenge): (_, Challenge) = read_json(challenge_path, MAX_SMALL_FILE, "challenge")?;
    check_format(challenge_path, &challenge.format, CHALLENGE_FORMAT)?;
    let request_digest: [u8; 32] = hex::decode(&challenge.request_digest)
        .ok()
        .and_then(|d| d.try_into().ok())
        .with_context(|| {
            format!(
                "{}: request_digest is not 64 hex digits",
                challenge_path.display()
            )
        })?;
    let ak_public = b64("ak_public", challenge_path, &challenge.ak_public)?;
    let blob = b64(
        "credential_blob",
        challenge_path,
        &challenge.credential_blob,
    )?;
    let secret = b64(
        "encrypted_secret",
        challenge_path,
        &challenge.encrypted_secret,
    )?;

    let mut tpm = Tpm::open(&tpm.parse()?)?;
    let ak = tpm.load_attestation_key(&AkConfig::new(ak_algorithm(&ak_public)?))?;
    let ak_name = credential::object_name(ak.public_area())?;
    if hex::encode(&ak_name) != challenge.ak_name || ak.public_area() != ak_public.as_slice() {
        bail!(
            "{}: the challenge is for AK {}, this TPM's AK is {}",
            challenge_path.display(),
            challenge.ak_name,
            hex::encode(&ak_name)
        );
    }
    let activated = tpm
        .activate_credential(&ak, challenge.ek.slot(), &blob, &secret)
        .with_context(|| {
            format!(
                "{}: this TPM cannot open the challenge (it was made for another TPM's EK or \
                 another AK)",
                challenge_path.display()
            )
        })?;
    let proof = credential::enrolment_proof(activated.expose(), &ak_name, &request_digest);
    drop(activated);
    let response = Response {
        format: RESPONSE_FORMAT.to_owned(),
        request_digest: challenge.request_digest,
        ak_name: challenge.ak_name,
        proof: hex::encode(proof),
    };
    files::write_new(out, &to_json(&response)?, 0o644)?;
    progress!(
        "the TPM activated the credential; response written to {}",
        out.display()
    );
    Ok(())
}

/// `enroll finish --pending P --response R --ca-dir D --out O [--validity-days N]`.
pub fn finish(
    pending_path: &Path,
    response_path: &Path,
    ca_dir: &Path,
    out: &Path,
    validity_days: u32,
) -> Result<()> {
    let ca = PlatformCa::load(ca_dir)?;
    let outputs = [AK_CERT_FILE, AK_PUBLIC_FILE, PLATFORM_CA_FILE].map(|name| out.join(name));
    files::refuse_existing(&outputs)?;
    let pending_bytes = files::read_private(pending_path, MAX_SMALL_FILE)?;
    let pending: Pending = serde_json::from_slice(&pending_bytes).with_context(|| {
        format!(
            "{} is not an enrolment pending file",
            pending_path.display()
        )
    })?;
    check_format(pending_path, &pending.format, PENDING_FORMAT)?;
    let (_, response): (_, Response) = read_json(response_path, MAX_SMALL_FILE, "response")?;
    check_format(response_path, &response.format, RESPONSE_FORMAT)?;

    if response.request_digest != pending.request_digest || response.ak_name != pending.ak_name {
        bail!(
            "{} answers another challenge (request {}, AK {}) than {} (request {}, AK {}); \
             not certified",
            response_path.display(),
            response.request_digest,
            response.ak_name,
            pending_path.display(),
            pending.request_digest,
            pending.ak_name
        );
    }
    let expected = Zeroizing::new(
        hex::decode(&pending.expected_proof)
            .with_context(|| format!("{}: expected_proof", pending_path.display()))?,
    );
    let proof = hex::decode(&response.proof).unwrap_or_default();
    if expected.len() != 32 || !bool::from(proof.as_slice().ct_eq(expected.as_slice())) {
        bail!(
            "{}: the proof is wrong: the AK was not shown to be in the TPM of the verified EK; \
             not certified",
            response_path.display()
        );
    }

    let ak_public = b64("ak_public", pending_path, &pending.ak_public)?;
    if credential::object_name(&ak_public)? != hex::decode(&pending.ak_name).unwrap_or_default() {
        bail!(
            "{}: ak_public does not have the name ak_name",
            pending_path.display()
        );
    }
    check_ak_template(&ak_public)
        .with_context(|| format!("{}: ak_public", pending_path.display()))?;
    let ak_cert = ca.certify_ak(&ak_public, validity_days)?;

    let created_dir = files::ensure_dir(out, 0o755)?;
    let contents: [&[u8]; 3] = [&ak_cert, &ak_public, ca.cert_pem().as_bytes()];
    let mut written = Vec::new();
    for (path, bytes) in outputs.iter().zip(contents) {
        if let Err(error) = files::write_new(path, bytes, 0o644) {
            for path in &written {
                let _ = fs::remove_file(path);
            }
            if let Some(dir) = &created_dir {
                let _ = fs::remove_dir_all(dir);
            }
            return Err(error);
        }
        written.push(path.clone());
    }
    // Single use: the challenge is answered.
    fs::remove_file(pending_path)
        .with_context(|| format!("removing the used {}", pending_path.display()))?;
    progress!(
        "AK {} of the TPM ({}) certified by the platform CA (valid {validity_days} days)",
        AkFingerprint::of_public_area(&ak_public),
        pending.tpm
    );
    for path in &outputs {
        progress!("  {}", path.display());
    }
    Ok(())
}
