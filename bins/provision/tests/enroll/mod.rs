//! `asterism-provision enroll` end to end with real swtpm processes whose EKs swtpm's local CA
//! certified (it plays the TPM manufacturer): a machine is enrolled and its certified AK is
//! accepted by the verifier; an AK of another TPM, a wrong proof and an EK certificate the
//! bundle does not reach are each refused, and nothing is certified.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use asterism_attestation::{
    AkTrust, ExpectedPcr, Issuer, Measurements, PcrIndex, PlatformCa, ReportData,
    TpmQuoteValidator, Validator,
};
use asterism_testkit::Swtpm;
use asterism_tpm::{AkAlgorithm, AkConfig, PcrSelection, Tpm, TpmIssuer};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use crate::{fails, mode, ok, s};

/// A machine: an swtpm manufactured with EK certificates by its own local CA.
fn machine() -> Swtpm {
    Swtpm::builder().with_ek_cert(true).start().unwrap()
}

/// The owner's side: a platform CA and a manufacturers' bundle, in a temporary directory.
struct Owner {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ca: PathBuf,
    bundle: PathBuf,
}

/// An owner whose EK bundle holds the local CA (root and EK-signing CA) of `manufacturer`.
fn owner(manufacturer: &Swtpm) -> Owner {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let ca = root.join("ca");
    ok(&["platform-ca", "init", "--dir", s(&ca)]);
    let bundle = root.join("ek-bundle");
    fs::create_dir(&bundle).unwrap();
    let local = manufacturer.ek_ca_dir().unwrap();
    for (from, to) in [
        ("swtpm-localca-rootca-cert.pem", "swtpm-root.pem"),
        ("issuercert.pem", "swtpm-ek-ca.pem"),
    ] {
        fs::copy(local.join(from), bundle.join(to)).unwrap();
    }
    Owner {
        _dir: dir,
        root,
        ca,
        bundle,
    }
}

impl Owner {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn request(&self, tpm: &Swtpm, ek: &str) -> PathBuf {
        let out = self.path("request.json");
        ok(&[
            "enroll",
            "request",
            "--tpm",
            &tpm.tcti(),
            "--ek",
            ek,
            "--out",
            s(&out),
        ]);
        out
    }

    fn challenge_args<'a>(&'a self, request: &'a Path) -> Vec<String> {
        [
            "enroll",
            "challenge",
            "--request",
            s(request),
            "--ek-ca-dir",
            s(&self.bundle),
            "--pending",
            s(&self.path("pending.json")),
            "--out",
            s(&self.path("challenge.json")),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn challenge(&self, request: &Path) -> PathBuf {
        let args = self.challenge_args(request);
        ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        self.path("challenge.json")
    }

    fn refused_challenge(&self, request: &Path) -> String {
        let args = self.challenge_args(request);
        let error = fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!self.path("challenge.json").exists(), "no challenge made");
        assert!(!self.path("pending.json").exists(), "nothing pending");
        error
    }

    fn activate_args(&self, tpm: &Swtpm, challenge: &Path, out: &Path) -> Vec<String> {
        [
            "enroll",
            "activate",
            "--tpm",
            &tpm.tcti(),
            "--challenge",
            s(challenge),
            "--out",
            s(out),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn activate(&self, tpm: &Swtpm, challenge: &Path) -> PathBuf {
        let out = self.path("response.json");
        let args = self.activate_args(tpm, challenge, &out);
        ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        out
    }

    fn finish_args(&self, response: &Path) -> Vec<String> {
        [
            "enroll",
            "finish",
            "--pending",
            s(&self.path("pending.json")),
            "--response",
            s(response),
            "--ca-dir",
            s(&self.ca),
            "--out",
            s(&self.path("out")),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn finish(&self, response: &Path) {
        let args = self.finish_args(response);
        ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }

    /// `finish` fails, certifies nothing and leaves the challenge pending.
    fn refused_finish(&self, response: &Path) -> String {
        let args = self.finish_args(response);
        let error = fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!self.path("out/ak-cert.der").exists(), "nothing certified");
        assert!(self.path("pending.json").exists(), "still pending");
        error
    }
}

/// Rewrites a JSON file's string field.
fn set_field(path: &Path, field: &str, value: &str) {
    let mut json: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    json[field] = serde_json::Value::String(value.to_owned());
    fs::write(path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
}

fn field(path: &Path, field: &str) -> String {
    let json: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    json[field].as_str().unwrap().to_owned()
}

/// The AK public area of `tpm` (created and persisted if missing).
fn ak_public(tpm: &Swtpm) -> Vec<u8> {
    let mut tpm = Tpm::open(&tpm.config()).unwrap();
    tpm.load_attestation_key(&AkConfig::new(AkAlgorithm::EccP256))
        .unwrap()
        .public_area()
        .to_vec()
}

/// The verifier's acceptance check, as `node` runs it: a quote with a fresh nonce, carrying
/// the written AK certificate, validated with only the written platform CA trusted.
fn quote_is_accepted(tpm: &Swtpm, out: &Path) {
    let mut device = Tpm::open(&tpm.config()).unwrap();
    let pcrs = device.read_pcrs(&PcrSelection::all()).unwrap();
    let measurements = Measurements::new(
        pcrs.iter()
            .filter(|(i, _)| *i < 8)
            .map(|(i, v)| (PcrIndex::try_from(*i).unwrap(), ExpectedPcr::enforce(*v)))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let ak_config = AkConfig::new(AkAlgorithm::EccP256);
    let issuer = TpmIssuer::new(
        device,
        &ak_config,
        PcrSelection::all(),
        vec![fs::read(out.join("ak-cert.der")).unwrap()],
    )
    .unwrap();
    assert_eq!(
        issuer.ak_public(),
        fs::read(out.join("ak-public.bin")).unwrap()
    );
    let report = ReportData::verify(b"a verifier's nonce after enrolment");
    let evidence = issuer.issue(&report).unwrap();
    let ca = PlatformCa::from_pem(&fs::read(out.join("platform-ca.pem")).unwrap()).unwrap();
    TpmQuoteValidator::new(AkTrust::platform_ca(ca), measurements.into_provider())
        .validate(&evidence, &report)
        .unwrap();
}

#[test]
fn an_enrolled_machines_certified_ak_is_accepted_by_the_verifier() {
    let tpm = machine();
    let owner = owner(&tpm);
    let request = owner.request(&tpm, "rsa2048");
    let challenge = owner.challenge(&request);
    assert_eq!(mode(&owner.path("pending.json")), 0o600);
    let response = owner.activate(&tpm, &challenge);
    owner.finish(&response);
    assert!(
        !owner.path("pending.json").exists(),
        "the challenge is used up"
    );
    let out = owner.path("out");
    assert_eq!(
        fs::read(out.join("ak-public.bin")).unwrap(),
        ak_public(&tpm)
    );
    quote_is_accepted(&tpm, &out);
}

#[test]
fn a_request_names_an_ek_with_a_certificate() {
    let tpm = machine();
    let owner = owner(&tpm);
    // swtpm_setup certifies only the RSA and P-384 EKs: this machine's request names the
    // P-256 EK, which has no certificate.
    let out = owner.path("request.json");
    let error = fails(&[
        "enroll",
        "request",
        "--tpm",
        &tpm.tcti(),
        "--ek",
        "ecc-p256",
        "--out",
        s(&out),
    ]);
    assert!(error.contains("no EccP256 EK certificate"), "{error}");
}

#[test]
fn an_ak_of_another_tpm_presented_with_this_tpms_ek_certificate_is_never_certified() {
    let tpm = machine();
    let attacker = machine();
    let owner = owner(&tpm);
    let request = owner.request(&tpm, "rsa2048");
    // The attacker's AK behind the genuine TPM's EK certificate.
    set_field(&request, "ak_public", &B64.encode(ak_public(&attacker)));
    let challenge = owner.challenge(&request);

    // The attacker's TPM holds the AK but not the EK: it cannot open the challenge.
    let out = owner.path("response.json");
    let error = fails(
        &owner
            .activate_args(&attacker, &challenge, &out)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(error.contains("cannot open the challenge"), "{error}");
    assert!(!out.exists());
    // The genuine TPM holds the EK but not the AK.
    let error = fails(
        &owner
            .activate_args(&tpm, &challenge, &out)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(error.contains("the challenge is for AK"), "{error}");

    // Without the credential, any proof is a guess: refused, nothing certified.
    let forged = owner.path("forged.json");
    fs::write(
        &forged,
        serde_json::json!({
            "format": "asterism-enrolment-response-v1",
            "request_digest": field(&challenge, "request_digest"),
            "ak_name": field(&challenge, "ak_name"),
            "proof": "00".repeat(32),
        })
        .to_string(),
    )
    .unwrap();
    let error = owner.refused_finish(&forged);
    assert!(error.contains("the proof is wrong"), "{error}");
}

#[test]
fn a_tampered_response_or_wrong_proof_is_refused() {
    let tpm = machine();
    let owner = owner(&tpm);
    let request = owner.request(&tpm, "rsa2048");
    let challenge = owner.challenge(&request);
    let response = owner.activate(&tpm, &challenge);
    let honest = fs::read(&response).unwrap();

    // One bit of the proof.
    let mut proof = hex::decode(field(&response, "proof")).unwrap();
    proof[7] ^= 0x10;
    set_field(&response, "proof", &hex::encode(&proof));
    let error = owner.refused_finish(&response);
    assert!(error.contains("the proof is wrong"), "{error}");

    // A proof of the wrong length.
    set_field(&response, "proof", &hex::encode(&proof[..31]));
    owner.refused_finish(&response);

    // An oversized response is refused by its size, unread.
    fs::write(&response, vec![b' '; 128 * 1024]).unwrap();
    let error = owner.refused_finish(&response);
    assert!(error.contains("response.json is larger than"), "{error}");

    // The right proof for another request or another AK.
    fs::write(&response, &honest).unwrap();
    set_field(&response, "request_digest", &"ab".repeat(32));
    let error = owner.refused_finish(&response);
    assert!(error.contains("answers another challenge"), "{error}");
    fs::write(&response, &honest).unwrap();
    set_field(&response, "ak_name", &format!("000b{}", "cd".repeat(32)));
    owner.refused_finish(&response);

    // A pending file others may read is refused before anything else.
    fs::write(&response, &honest).unwrap();
    fs::set_permissions(
        owner.path("pending.json"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let error = owner.refused_finish(&response);
    assert!(error.contains("accessible to others"), "{error}");
    fs::set_permissions(
        owner.path("pending.json"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();

    // The honest answer still works, once.
    owner.finish(&response);
    quote_is_accepted(&tpm, &owner.path("out"));
    fs::remove_dir_all(owner.path("out")).unwrap();
    let error = fails(
        &owner
            .finish_args(&response)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(error.contains("pending.json"), "{error}");
}

#[test]
fn an_ek_certificate_the_bundle_does_not_reach_is_refused_before_any_challenge() {
    let tpm = machine();
    let other = machine();
    // The owner trusts only the other machine's manufacturer.
    let owner = owner(&other);
    let request = owner.request(&tpm, "rsa2048");
    // Both local CAs are called `CN=swtpm-localca`: the chain is found by name and fails
    // on the signature.
    let error = owner.refused_challenge(&request);
    assert!(
        error.contains("the EK certificate is refused; no challenge is made")
            && error.contains("does not verify"),
        "{error}"
    );
    assert!(error.contains("request.json"), "names the file: {error}");

    // A bundle with another manufacturer only: the issuer is not found.
    for file in fs::read_dir(&owner.bundle).unwrap() {
        fs::remove_file(file.unwrap().path()).unwrap();
    }
    fs::write(
        owner.bundle.join("platform-ca.pem"),
        fs::read(owner.ca.join("platform-ca.pem")).unwrap(),
    )
    .unwrap();
    let error = owner.refused_challenge(&request);
    assert!(error.contains("untrusted EK certificate"), "{error}");
}

#[test]
fn a_challenge_needs_the_ek_the_certificate_names_and_an_ak_of_our_template() {
    let tpm = machine();
    let other = machine();
    let owner = owner(&tpm);
    let request = owner.request(&tpm, "rsa2048");
    let genuine = fs::read(&request).unwrap();

    // Another TPM's EK behind this TPM's EK certificate.
    let other_ek = Tpm::open(&other.config())
        .unwrap()
        .read_ek_public(asterism_tpm::EkCertSlot::Rsa2048)
        .unwrap();
    set_field(&request, "ek_public", &B64.encode(other_ek));
    let error = owner.refused_challenge(&request);
    assert!(error.contains("is not the TPM's EK"), "{error}");

    // An AK that is not restricted (it could sign a forged quote).
    fs::write(&request, &genuine).unwrap();
    let mut ak = ak_public(&tpm);
    ak[5] &= !0x01; // objectAttributes (bytes 4..8, big-endian) bit 16: restricted
    set_field(&request, "ak_public", &B64.encode(&ak));
    let error = owner.refused_challenge(&request);
    assert!(
        error.contains("not an attestation key of our template"),
        "{error}"
    );

    // An oversized request is refused by its size, unread.
    fs::write(&request, vec![b' '; 2 * 1024 * 1024]).unwrap();
    let error = owner.refused_challenge(&request);
    assert!(error.contains("request.json is larger than"), "{error}");
}

/// Enrolment time per machine with swtpm, the four commands as separate processes (as an
/// operator runs them). `cargo test -p asterism-provision --test provision -- --ignored
/// --nocapture enrolment_time`.
#[test]
#[ignore = "a benchmark: prints timings"]
fn enrolment_time_per_machine() {
    const MACHINES: usize = 5;
    let mut totals = [0f64; 4];
    for _ in 0..MACHINES {
        let tpm = machine();
        let owner = owner(&tpm);
        let t = Instant::now();
        let request = owner.request(&tpm, "rsa2048");
        let t1 = t.elapsed().as_secs_f64();
        let challenge = owner.challenge(&request);
        let t2 = t.elapsed().as_secs_f64();
        let response = owner.activate(&tpm, &challenge);
        let t3 = t.elapsed().as_secs_f64();
        owner.finish(&response);
        let t4 = t.elapsed().as_secs_f64();
        for (total, step) in totals.iter_mut().zip([t1, t2 - t1, t3 - t2, t4 - t3]) {
            *total += step;
        }
    }
    let n = MACHINES as f64;
    let ms = |s: f64| s * 1000.0 / n;
    println!(
        "enrolment per machine (swtpm, {MACHINES} machines, mean): request {:.1} ms, \
         challenge {:.1} ms, activate {:.1} ms, finish {:.1} ms, total {:.1} ms",
        ms(totals[0]),
        ms(totals[1]),
        ms(totals[2]),
        ms(totals[3]),
        ms(totals.iter().sum())
    );
}
