//! Benchmark: confidential-VM evidence on one thread, with warm caches, through the path the
//! verifier runs (`TpmQuoteValidator` with `CvmAkTrust`: evidence bytes to verdict), beside
//! the bare signature verifications of that path measured in the same run; then the CPU a
//! forged report costs against a valid one.
//!
//! The reports are the real ones of `tests/data/cvm/`. We hold no cloud vTPM's AK, so no
//! evidence here is accepted; each run goes as far as real evidence lets it, as the positive
//! end-to-end tests do:
//!
//! * Azure SEV-SNP: everything (HCL report, VCEK chain from the cache, report signature,
//!   fields, REPORT_DATA → runtime data → AK) up to and including the quote's RSA-2048
//!   signature by the real vTPM AK, which refuses our software quote. Only the PCR digest,
//!   nonce and measurement comparisons (no signature) are left.
//! * AWS SEV-SNP: the report to AMD's root and every field check; REPORT_DATA names the
//!   instance's own AK, so the AK match and the quote's signature are not reached.
//! * Azure TDX: the DCAP sample quote with its collateral (cached) in Azure TDX evidence;
//!   its REPORT_DATA does not bind the Azure runtime data, so the AK match and the quote's
//!   signature are not reached.
//!
//! Figures are per CPU-second of this thread (`/proc/thread-self/schedstat`), best of
//! interleaved rounds, so that neighbours on a shared machine bias none of them.
//!
//! Run: `cargo bench -p asterism-attestation --bench cvm`. The workspace's bench profile
//! builds this crate unoptimised (for the insecure test variant's build gate); for figures
//! as a release build gives, add
//! `--config 'profile.bench.package.asterism-attestation.opt-level=3'`.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)] // a benchmark binary

use asterism_attestation::explain::Reference;
use asterism_attestation::hcl::{self, HclReport};
use asterism_attestation::snp::{
    MinimumTcb, PerProduct, SnpCerts, SnpPolicy, SnpReport, SnpVerifier,
};
use asterism_attestation::tdx::{TdQuote, TdxCollateral, TdxPolicy, TdxVerifier};
use asterism_attestation::tpm::structures::{
    ClockInfo, PcrSelection, PublicParams, QuoteInfo, alg,
};
use asterism_attestation::tpm::{
    AkTrust, AwsSnp, AzureSnp, AzureTdx, CvmAkTrust, CvmPlatform, PlatformKind, TdxCollateralSet,
    TpmQuoteEvidence, TpmQuoteValidator, TpmsAttest, TpmtSignature,
};
use asterism_attestation::{
    CvmReferences, ExpectedPcr, Measurements, PcrIndex, ReportData, Role, ValidationError,
    Validator,
};
use asterism_testkit::cvm::{aws_snp_report, azure_ak_public, azure_snp_hcl_of, read_cvm};
use prost::Message;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair, UnparsedPublicKey};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use x509_parser::prelude::{FromDer, X509Certificate};

#[path = "support/mod.rs"]
mod support;

const RSA_AK_PEM: &[u8] = include_bytes!("../tests/data/test-ak-rsa2048.pk8.pem");
/// Wall time of one measurement; each figure is the best of `ROUNDS`, interleaved.
const RUN: Duration = Duration::from_millis(400);
const ROUNDS: usize = 5;

/// The best rate of each closure over `ROUNDS` interleaved rounds of `RUN`.
fn best(fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    support::best(fs, ROUNDS, RUN)
}

fn pem_der(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap().to_vec())
        .collect()
}

fn idx(i: u8) -> PcrIndex {
    PcrIndex::new(i).unwrap()
}

/// Our software AK: the test RSA-2048 key, with its public area as a vTPM makes it.
struct SoftRsaAk {
    key: RsaKeyPair,
    public: Vec<u8>,
}

impl SoftRsaAk {
    fn new() -> Self {
        use rustls_pki_types::PrivatePkcs8KeyDer;
        use rustls_pki_types::pem::PemObject;
        let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_AK_PEM).unwrap();
        let key = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap();
        let n = signature::RsaPublicKeyComponents::<Vec<u8>>::from(key.public()).n;
        let public = rsa_ak_public(n);
        Self { key, public }
    }
}

/// An RSA AK public area as Azure's vTPM makes it (without noDA).
fn rsa_ak_public(n: Vec<u8>) -> Vec<u8> {
    asterism_testkit::cvm::cloud_ak_public(PublicParams::rsassa_sha256(n, 0))
}

/// PCR `i` holds `[i; 32]`; all 24 are quoted.
fn pcrs() -> BTreeMap<PcrIndex, [u8; 32]> {
    PcrIndex::all().map(|i| (i, [i.get(); 32])).collect()
}

/// Enforces PCRs 4, 8, 9, 11, 12, 13 and 15, and the launch `cvm`.
fn measurements(cvm: CvmReferences) -> Measurements {
    let values = pcrs();
    let entries: Vec<_> = [4u8, 8, 9, 11, 12, 13, 15]
        .into_iter()
        .map(|i| (idx(i), ExpectedPcr::enforce(values[&idx(i)])))
        .collect();
    Measurements::new(entries).unwrap().with_cvm(cvm)
}

/// Quote evidence over `rd`, signed by our AK, presenting `ak_public` and `platform`.
fn evidence(
    ak: &SoftRsaAk,
    rd: &ReportData,
    ak_public: Vec<u8>,
    platform: PlatformKind,
) -> Vec<u8> {
    use sha2::Digest;
    let values = pcrs();
    let mut name = alg::SHA256.to_be_bytes().to_vec();
    name.extend_from_slice(&sha2::Sha256::digest(&ak.public));
    let mut digest = sha2::Sha256::new();
    for v in values.values() {
        digest.update(v);
    }
    let attest = TpmsAttest {
        qualified_signer: name,
        extra_data: rd.as_bytes().to_vec(),
        clock_info: ClockInfo {
            clock: 1_000,
            reset_count: 1,
            restart_count: 0,
            safe: true,
        },
        firmware_version: 0x2024_0001,
        quote: QuoteInfo {
            pcr_select: vec![PcrSelection::new(alg::SHA256, values.keys().copied())],
            pcr_digest: digest.finalize().to_vec(),
        },
    }
    .to_bytes()
    .unwrap();
    let mut sig = vec![0u8; ak.key.public().modulus_len()];
    ak.key
        .sign(
            &signature::RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            &attest,
            &mut sig,
        )
        .unwrap();
    let signature = TpmtSignature::RsaSsa {
        hash: alg::SHA256,
        sig,
    }
    .to_bytes()
    .unwrap();
    TpmQuoteEvidence::new(attest, signature, &values, ak_public, Vec::new(), None)
        .with_platform(platform)
        .encode_to_vec()
}

/// 2025-06-01: inside the validity of every SEV-SNP certificate of the test data.
fn snp_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_748_736_000)
}

/// 2025-07-01: inside the validity of the TDX sample collateral.
fn tdx_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_751_328_000)
}

/// Every TCB accepted (an explicit all-zero floor per product): the sample reports are
/// older than the default Milan floor, and a floor's comparison costs the same at any value.
fn snp_policy() -> SnpPolicy {
    let any = Some(MinimumTcb {
        bootloader: 0,
        tee: 0,
        snp: 0,
        microcode: 0,
        fmc: 0,
    });
    SnpPolicy {
        minimum_tcb: PerProduct {
            milan: any,
            genoa: any,
            turin: any,
        },
        ..SnpPolicy::default()
    }
}

fn snp_launch(report: &[u8]) -> CvmReferences {
    CvmReferences {
        snp_launch_measurement: Some(Reference::enforce(
            SnpReport::parse(&report[..hcl::SNP_REPORT_SIZE])
                .unwrap()
                .measurement,
        )),
        ..CvmReferences::default()
    }
}

/// The v4 DCAP sample quote, without the zero padding that follows it in the file.
fn dcap_quote() -> Vec<u8> {
    let mut quote = read_cvm("tdx-dcap/tdx_quote");
    let sig_len = u32::from_le_bytes(quote[632..636].try_into().unwrap()) as usize;
    quote.truncate(636 + sig_len);
    quote
}

fn tdx_collateral() -> TdxCollateral {
    TdxCollateral::from_json(&read_cvm("tdx-dcap/tdx_quote_collateral.json")).unwrap()
}

/// One variant through the validator, with the reason real evidence stops at.
struct Variant {
    name: &'static str,
    validator: TpmQuoteValidator,
    evidence: Vec<u8>,
    rd: ReportData,
    stops_at: fn(&ValidationError) -> bool,
}

fn variants() -> Vec<Variant> {
    let ak = SoftRsaAk::new();
    let rd = ReportData::atls(Role::Server, &[0x11; 32]);
    let validator = |trust: CvmAkTrust, cvm: CvmReferences, now: fn() -> SystemTime| {
        TpmQuoteValidator::new(
            AkTrust::confidential_vm(trust),
            measurements(cvm).into_provider(),
        )
        .with_clock(now)
    };

    // Azure SEV-SNP: the HCL report and the VCEK with its ASK, as the evidence carries them.
    let runtime = read_cvm("snp-azure/runtimedata.bin");
    let body = read_cvm("snp-azure/attestation.bin");
    let mut certs = pem_der(&read_cvm("snp-azure/vcek.pem"));
    certs.push(pem_der(&read_cvm("snp-azure/certchain.pem")).remove(0));
    let azure_snp = Variant {
        name: "Azure SEV-SNP vTPM",
        validator: validator(
            CvmAkTrust::sev_snp(CvmPlatform::AzureSevSnp, snp_policy()).unwrap(),
            snp_launch(&body),
            snp_now,
        ),
        evidence: evidence(
            &ak,
            &rd,
            azure_ak_public(&runtime),
            PlatformKind::AzureSevSnp(AzureSnp {
                hcl_report: azure_snp_hcl_of(&body, &runtime),
                certs,
            }),
        ),
        rd: rd.clone(),
        stops_at: |e| matches!(e, ValidationError::BadSignature(_)),
    };

    // AWS SEV-SNP: the report and the VLEK with its ASVK.
    let report = aws_snp_report();
    let mut certs = pem_der(&read_cvm("snp-aws/vlek.pem"));
    certs.push(pem_der(&read_cvm("snp-aws/certchain.pem")).remove(0));
    let aws_snp = Variant {
        name: "AWS SEV-SNP (NitroTPM)",
        validator: validator(
            CvmAkTrust::sev_snp(CvmPlatform::AwsSevSnp, snp_policy()).unwrap(),
            snp_launch(&report),
            snp_now,
        ),
        evidence: evidence(
            &ak,
            &rd,
            ak.public.clone(),
            PlatformKind::AwsSevSnp(AwsSnp { report, certs }),
        ),
        rd: rd.clone(),
        stops_at: |e| matches!(e, ValidationError::BindingMismatch),
    };

    // Azure TDX: the DCAP sample quote, with the runtime data of the Azure TDX HCL report.
    let quote = dcap_quote();
    let hcl_bytes = read_cvm("tdx-azure-hcl/hclreport.bin");
    let runtime = HclReport::parse(&hcl_bytes)
        .unwrap()
        .runtime_data()
        .to_vec();
    let td = TdQuote::parse(&quote).unwrap().report().clone();
    let azure_tdx = Variant {
        name: "Azure TDX vTPM",
        validator: validator(
            CvmAkTrust::azure_tdx(
                TdxPolicy::default(),
                TdxCollateralSet::new(vec![tdx_collateral()]).unwrap(),
            ),
            CvmReferences {
                tdx_mrtd: Some(Reference::enforce(td.mr_td)),
                tdx_rtmrs: td.rtmr.map(|v| Some(Reference::enforce(v))),
                ..CvmReferences::default()
            },
            tdx_now,
        ),
        evidence: evidence(
            &ak,
            &rd,
            azure_ak_public(&runtime),
            PlatformKind::AzureTdx(AzureTdx {
                quote,
                runtime_data: runtime,
            }),
        ),
        rd,
        stops_at: |e| matches!(e, ValidationError::BindingMismatch),
    };
    vec![azure_snp, aws_snp, azure_tdx]
}

/// The bare signature verifications of the three paths.
struct Bare {
    /// The Azure report's P-384 signature by its VCEK.
    p384: Box<dyn Fn() -> bool>,
    /// The DCAP quote's P-256 signature by its attestation key.
    p256: Box<dyn Fn() -> bool>,
    /// An RSA-2048 PKCS#1 SHA-256 TPM quote signature, by the Azure vTPM AK's key size.
    rsa2048: Box<dyn Fn() -> bool>,
}

fn bare() -> Bare {
    let body = read_cvm("snp-azure/attestation.bin");
    let report = SnpReport::parse(&body[..hcl::SNP_REPORT_SIZE]).unwrap();
    let vcek = pem_der(&read_cvm("snp-azure/vcek.pem")).remove(0);
    let (_, leaf) = X509Certificate::from_der(&vcek).unwrap();
    let p384_key = leaf.public_key().subject_public_key.data.to_vec();
    let signed = report.signed_bytes().to_vec();
    let sig = report.signature_fixed();
    let p384 = move || {
        UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, black_box(&p384_key))
            .verify(black_box(&signed), black_box(&sig))
            .is_ok()
    };

    let quote = dcap_quote();
    let mut p256_key = vec![0x04];
    p256_key.extend_from_slice(&quote[700..764]);
    let p256 = move || {
        UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, black_box(&p256_key))
            .verify(black_box(&quote[..632]), black_box(&quote[636..700]))
            .is_ok()
    };

    let ak = SoftRsaAk::new();
    let message = [7u8; 145]; // about the size of a TPMS_ATTEST
    let mut rsa_sig = vec![0u8; ak.key.public().modulus_len()];
    ak.key
        .sign(
            &signature::RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            &message,
            &mut rsa_sig,
        )
        .unwrap();
    let rsa_key = ak.key.public().as_ref().to_vec();
    let rsa2048 = move || {
        UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, black_box(&rsa_key))
            .verify(black_box(&message), black_box(&rsa_sig))
            .is_ok()
    };
    let out = Bare {
        p384: Box::new(p384),
        p256: Box::new(p256),
        rsa2048: Box::new(rsa2048),
    };
    assert!((out.p384)() && (out.p256)() && (out.rsa2048)());
    out
}

fn full_paths() {
    let variants = variants();
    for v in &variants {
        let err = v.validator.validate(&v.evidence, &v.rd).unwrap_err();
        assert!((v.stops_at)(&err), "{}: stopped at {err:?}", v.name);
    }
    let b = bare();
    let mut fs: Vec<Box<dyn FnMut()>> = vec![
        Box::new(|| assert!((b.p384)())),
        Box::new(|| assert!((b.p256)())),
        Box::new(|| assert!((b.rsa2048)())),
    ];
    for v in &variants {
        fs.push(Box::new(move || {
            black_box(v.validator.validate(black_box(&v.evidence), &v.rd)).unwrap_err();
        }));
    }
    // What the runtime-data memo saves once a hardware report bound the runtime data:
    // hashing it (it is parsed only after a report bound it, so the sample TDX quote's
    // path, which binds other data, hashes it and never parses it or fills the memo).
    let runtime = HclReport::parse(&read_cvm("tdx-azure-hcl/hclreport.bin"))
        .unwrap()
        .runtime_data()
        .to_vec();
    fs.push(Box::new(move || {
        black_box(hcl::runtime_data_report_data(black_box(&runtime)));
    }));
    let mut refs: Vec<&mut dyn FnMut()> = fs.iter_mut().map(|f| &mut **f as _).collect();
    let r = best(&mut refs);
    let (p384, p256, rsa) = (r[0], r[1], r[2]);
    let combined = |a: f64, b: f64| 1.0 / (1.0 / a + 1.0 / b);
    println!("Confidential-VM evidence, one thread, per CPU-second, best of {ROUNDS} x {RUN:?}");
    println!("  bare ECDSA P-384 verify (SNP report):     {p384:>8.0} /s");
    println!("  bare ECDSA P-256 verify (TDX quote):      {p256:>8.0} /s");
    println!("  bare RSA-2048 PKCS#1 verify (TPM quote):  {rsa:>8.0} /s");
    let line = |name: &str, full: f64, bare: f64, ops: &str| {
        println!(
            "  {name:<24} {full:>8.0} /s   bare {ops}: {bare:>8.0} /s   ratio {:>5.1} % (target >= 80 %)",
            100.0 * full / bare
        );
    };
    println!("full path, evidence bytes to verdict (warm caches):");
    line(
        "Azure SEV-SNP vTPM",
        r[3],
        combined(p384, rsa),
        "P-384 + RSA-2048",
    );
    line("AWS SEV-SNP", r[4], p384, "P-384           ");
    line("Azure TDX vTPM", r[5], p256, "P-256           ");
    println!(
        "  (AWS and Azure TDX stop at REPORT_DATA: with the quote's RSA-2048 signature added,"
    );
    println!(
        "   AWS would run at about {:.0} /s against a bare {:.0} /s ({:.1} %), Azure TDX at about",
        combined(r[4], rsa),
        combined(p384, rsa),
        100.0 * combined(r[4], rsa) / combined(p384, rsa)
    );
    println!(
        "   {:.0} /s against a bare {:.0} /s ({:.1} %))",
        combined(r[5], rsa),
        combined(p256, rsa),
        100.0 * combined(r[5], rsa) / combined(p256, rsa)
    );
    // The runtime data's hash, skipped by the memo on bound evidence.
    let memo_saves = 1.0 / r[6];
    let tdx_memo = 1.0 / (1.0 / r[5] - memo_saves);
    println!(
        "  Azure TDX runtime data, SHA-256: {:.1} us, which the memo skips once a report bound \
         it:",
        memo_saves * 1e6
    );
    println!(
        "   then about {tdx_memo:.0} /s ({:.1} % of bare P-256), and with the RSA-2048 quote \
         signature about {:.0} /s ({:.1} %)",
        100.0 * tdx_memo / p256,
        combined(tdx_memo, rsa),
        100.0 * combined(tdx_memo, rsa) / combined(p256, rsa)
    );
}

/// `n` random bytes.
fn random(n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    SystemRandom::new().fill(&mut out).unwrap();
    out
}

/// The report with every byte the parser leaves free made random: REPORT_DATA to
/// REPORT_ID_MA, the chip ID unless `keep_chip_id` (a forger who targets a chip copies it
/// from its VCEK), and the signature's R and S.
fn random_report(real: &[u8], keep_chip_id: bool) -> Vec<u8> {
    let mut r = real[..hcl::SNP_REPORT_SIZE].to_vec();
    let chip_id = if keep_chip_id { 0..0 } else { 0x1A0..0x1E0 };
    for range in [0x50..0x180, chip_id, 0x2A0..0x2D0, 0x2E8..0x318] {
        let len = range.len();
        r[range].copy_from_slice(&random(len));
    }
    SnpReport::parse(&r).unwrap();
    r
}

fn forgeries() {
    println!("forged ÷ valid, CPU per verification (target <= 1.1):");
    // SEV-SNP, report level, the verifier's cache warm with the real certificates.
    let now = snp_now();
    for (name, body, certs) in [
        (
            "AWS SEV-SNP (VLEK)",
            aws_snp_report(),
            SnpCerts::from_pem(
                &read_cvm("snp-aws/vlek.pem"),
                Some(&read_cvm("snp-aws/certchain.pem")),
            )
            .unwrap(),
        ),
        (
            "Azure SEV-SNP (VCEK)",
            read_cvm("snp-azure/attestation.bin"),
            SnpCerts::from_pem(
                &read_cvm("snp-azure/vcek.pem"),
                Some(&read_cvm("snp-azure/certchain.pem")),
            )
            .unwrap(),
        ),
    ] {
        let report = body[..hcl::SNP_REPORT_SIZE].to_vec();
        let parsed = SnpReport::parse(&report).unwrap();
        let expected = parsed.report_data;
        let policy = SnpPolicy {
            measurement: Some(Reference::enforce(parsed.measurement)),
            ..snp_policy()
        };
        let verifier = SnpVerifier::new(policy.clone());
        verifier.verify(&report, &certs, &expected, now).unwrap();
        let forged = random_report(&report, false);
        let targeted = random_report(&report, true);
        for f in [&forged, &targeted] {
            assert!(verifier.verify(f, &certs, &expected, now).is_err());
        }
        let r = best(&mut [
            &mut || {
                black_box(verifier.verify(black_box(&report), &certs, &expected, now)).unwrap();
            },
            &mut || {
                black_box(verifier.verify(black_box(&forged), &certs, &expected, now)).unwrap_err();
            },
            &mut || {
                black_box(verifier.verify(black_box(&targeted), &certs, &expected, now))
                    .unwrap_err();
            },
        ]);
        println!("  {name}: {:.0} /s valid (chain cached)", r[0]);
        println!(
            "  (a) real certificates, random report:                      {:.2}  ({:.0} /s)",
            r[0] / r[1],
            r[1]
        );
        println!(
            "  (a) real certificates, random report with their chip ID:   {:.2}  ({:.0} /s)",
            r[0] / r[2],
            r[2]
        );

        // (b) A random report with the chip ID of certificates the verifier has not cached:
        // a chip it has not seen (the real certificates, a verifier that saw none), and a
        // leaf whose bytes were changed (its signature), which never verifies and so never
        // caches.
        let mut leaf = pem_der(&read_cvm(if name.starts_with("AWS") {
            "snp-aws/vlek.pem"
        } else {
            "snp-azure/vcek.pem"
        }))
        .remove(0);
        let last = leaf.len() - 1;
        leaf[last] ^= 1;
        let chain = if name.starts_with("AWS") {
            "snp-aws/certchain.pem"
        } else {
            "snp-azure/certchain.pem"
        };
        let intermediate = pem_der(&read_cvm(chain)).remove(0);
        let altered = SnpCerts::from_der(&leaf, Some(&intermediate), None).unwrap();
        let r = best(&mut [
            &mut || {
                black_box(verifier.verify(black_box(&report), &certs, &expected, now)).unwrap();
            },
            &mut || {
                let fresh = SnpVerifier::new(policy.clone());
                black_box(fresh.verify(black_box(&targeted), &certs, &expected, now)).unwrap_err();
            },
            &mut || {
                black_box(SnpVerifier::new(policy.clone()));
            },
            &mut || {
                black_box(verifier.verify(black_box(&targeted), &altered, &expected, now))
                    .unwrap_err();
            },
        ]);
        // Without the cost of making the verifier.
        let unseen = 1.0 / (1.0 / r[1] - 1.0 / r[2]);
        println!(
            "  (b) uncached chip (real certificates), random report:      {:.2}  ({unseen:.0} /s)",
            r[0] / unseen
        );
        println!(
            "  (b) altered leaf certificate, random report:               {:.2}  ({:.0} /s)",
            r[0] / r[3],
            r[3]
        );
    }

    // TDX, quote level, the collateral checks cached.
    let quote = dcap_quote();
    let collateral = tdx_collateral();
    let td = TdQuote::parse(&quote).unwrap().report().clone();
    let policy = TdxPolicy {
        mrtd: Some(Reference::enforce(td.mr_td)),
        rtmrs: td.rtmr.map(|v| Some(Reference::enforce(v))),
        ..TdxPolicy::default()
    };
    let verifier = TdxVerifier::new(policy);
    let expected = td.report_data;
    verifier
        .verify(&quote, &collateral, &expected, tdx_now())
        .unwrap();
    let mut bad_sig = quote.clone();
    bad_sig[640] ^= 1;
    // Our own attestation key in the quote, signing header and TD report: the signature
    // holds; the QE report does not vouch for the key.
    let rng = SystemRandom::new();
    let pkcs8 =
        EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let own = EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .unwrap();
    let mut own_key = quote.clone();
    own_key[700..764].copy_from_slice(&own.public_key().as_ref()[1..]);
    let sig = own.sign(&rng, &own_key[..632]).unwrap();
    own_key[636..700].copy_from_slice(sig.as_ref());
    for forged in [&bad_sig, &own_key] {
        assert!(
            verifier
                .verify(forged, &collateral, &expected, tdx_now())
                .is_err()
        );
    }
    let r = best(&mut [
        &mut || {
            black_box(verifier.verify(black_box(&quote), &collateral, &expected, tdx_now()))
                .unwrap();
        },
        &mut || {
            black_box(verifier.verify(black_box(&bad_sig), &collateral, &expected, tdx_now()))
                .unwrap_err();
        },
        &mut || {
            black_box(verifier.verify(black_box(&own_key), &collateral, &expected, tdx_now()))
                .unwrap_err();
        },
    ]);
    println!(
        "  (c) TDX, mutated quote signature:            {:.2}  ({:.0} /s valid, {:.0} /s forged)",
        r[0] / r[1],
        r[0],
        r[1]
    );
    println!(
        "  (c) TDX, quote signed by an attacker's key:  {:.2}  ({:.0} /s)",
        r[0] / r[2],
        r[2]
    );

    // TDX through the validator: a quote whose platform (FMSPC) has no collateral in the
    // bundle, against the same evidence with its own platform's collateral.
    let json = String::from_utf8(read_cvm("tdx-dcap/tdx_quote_collateral.json")).unwrap();
    let other =
        TdxCollateral::from_json(json.replace("B0C06F000000", "00906ED50000").as_bytes()).unwrap();
    let mut all = variants();
    let known = all.pop().unwrap();
    let unknown = TpmQuoteValidator::new(
        AkTrust::confidential_vm(CvmAkTrust::azure_tdx(
            TdxPolicy::default(),
            TdxCollateralSet::new(vec![other]).unwrap(),
        )),
        measurements(CvmReferences {
            tdx_mrtd: Some(Reference::enforce(td.mr_td)),
            tdx_rtmrs: td.rtmr.map(|v| Some(Reference::enforce(v))),
            ..CvmReferences::default()
        })
        .into_provider(),
    )
    .with_clock(tdx_now);
    let err = unknown.validate(&known.evidence, &known.rd).unwrap_err();
    assert!(
        matches!(&err, ValidationError::Certificate { reason, .. } if reason.contains("FMSPC")),
        "{err:?}"
    );
    let r = best(&mut [
        &mut || {
            black_box(
                known
                    .validator
                    .validate(black_box(&known.evidence), &known.rd),
            )
            .unwrap_err();
        },
        &mut || {
            black_box(unknown.validate(black_box(&known.evidence), &known.rd)).unwrap_err();
        },
    ]);
    println!(
        "  (c) Azure TDX evidence, unknown FMSPC:       {:.2}  ({:.0} /s known, {:.0} /s unknown)",
        r[0] / r[1],
        r[0],
        r[1]
    );
}

/// `CVM_BENCH_PROFILE=<n>`: runs only variant `n` (0 Azure SEV-SNP, 1 AWS SEV-SNP, 2 Azure
/// TDX) for ten seconds and prints nothing else, for a profiler
/// (`perf record -g -- <bench binary>`).
fn profile(n: usize) {
    let v = variants().into_iter().nth(n).expect("variant 0, 1 or 2");
    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < Duration::from_secs(10) {
        black_box(v.validator.validate(black_box(&v.evidence), &v.rd)).unwrap_err();
        runs += 1;
    }
    println!("{}: {runs} verifications in 10 s", v.name);
}

fn main() {
    if let Ok(n) = std::env::var("CVM_BENCH_PROFILE") {
        profile(n.parse().expect("CVM_BENCH_PROFILE=0, 1 or 2"));
        return;
    }
    full_paths();
    forgeries();
}
