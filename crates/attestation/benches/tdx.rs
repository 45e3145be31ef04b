//! Benchmark: TDX quote verifications per second on one thread, beside the bare P-256
//! signature verifications the quote needs, measured in the same run.
//!
//! The quote is the real v4 sample with its real PCS collateral, parsed once. A verifier
//! that saw the quote before (its cache holds the collateral checks for this platform and
//! collateral) costs one P-256 verification per quote (the attestation key's signature
//! over the TD report) plus parsing and field checks; a fresh verifier checks everything:
//! 12 P-256 verifications (quote, QE report twice, PCK leaf and PCK CA, TCB signing
//! certificate, TCB info, QE identity, two CRLs, and one more QE report signature).
//!
//! Run: `cargo bench -p asterism-attestation --bench tdx`. The workspace's bench profile
//! builds this crate unoptimised (for the insecure test variant's build gate), so its own
//! code (parsing, field checks) runs at opt-level 0 while ring and dcap-qvl are optimised;
//! for figures as a release build would give, add
//! `--config 'profile.bench.package.asterism-attestation.opt-level=3'`.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)] // a benchmark binary

use asterism_attestation::explain::Reference;
use asterism_attestation::tdx::{TdQuote, TdxCollateral, TdxPolicy, TdxVerifier};
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

const QUOTE: &[u8] = include_bytes!("../tests/data/cvm/tdx-dcap/tdx_quote");
const COLLATERAL: &[u8] = include_bytes!("../tests/data/cvm/tdx-dcap/tdx_quote_collateral.json");
/// 2025-07-01T00:00:00Z, inside every validity period of the collateral.
const NOW: u64 = 1_751_328_000;
/// Each figure is the best of `ROUNDS` runs of `RUN`, the figures' runs interleaved, so
/// that load from other processes biases none of them.
const RUN: Duration = Duration::from_millis(500);
const ROUNDS: usize = 6;
/// P-256 verifications of a full (uncached) verification.
const FULL_P256: f64 = 12.0;

/// Runs `f` for about `RUN` and returns calls per second.
fn rate(mut f: impl FnMut()) -> f64 {
    for _ in 0..20 {
        f();
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < RUN {
        for _ in 0..50 {
            f();
        }
        n += 50;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // The sample is followed by zero padding; the quote ends where its signature data does.
    let sig_len = u32::from_le_bytes(QUOTE[632..636].try_into().unwrap()) as usize;
    let quote = &QUOTE[..636 + sig_len];
    let collateral = TdxCollateral::from_json(COLLATERAL).unwrap();
    let parsed = TdQuote::parse(quote).unwrap();
    let report_data = parsed.report().report_data;
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(NOW);

    // The bare operation: the quote's own P-256 signature over its header and TD report.
    let signed = &quote[..632];
    let signature = &quote[636..700];
    let mut key = vec![0x04];
    key.extend_from_slice(&quote[700..764]);
    let public = ring::signature::UnparsedPublicKey::new(
        &ring::signature::ECDSA_P256_SHA256_FIXED,
        key.as_slice(),
    );
    public.verify(signed, signature).unwrap();
    // Pinned to the quote's own launch, as every verifier must be.
    let td = parsed.report();
    let policy = TdxPolicy {
        mrtd: Some(Reference::enforce(td.mr_td)),
        rtmrs: td.rtmr.map(|v| Some(Reference::enforce(v))),
        ..TdxPolicy::default()
    };
    let verifier = TdxVerifier::new(policy.clone());
    verifier
        .verify(quote, &collateral, &report_data, now)
        .unwrap();
    let (mut bare, mut cached, mut full) = (0f64, 0f64, 0f64);
    for _ in 0..ROUNDS {
        bare = bare.max(rate(|| {
            black_box(public.verify(black_box(signed), black_box(signature))).unwrap();
        }));
        cached = cached.max(rate(|| {
            black_box(verifier.verify(black_box(quote), &collateral, &report_data, now)).unwrap();
        }));
        full = full.max(rate(|| {
            let fresh = TdxVerifier::new(policy.clone());
            black_box(fresh.verify(black_box(quote), &collateral, &report_data, now)).unwrap();
        }));
    }

    println!("TDX DCAP quote verification, one thread, best of {ROUNDS} x {RUN:?} per figure");
    println!("  bare P-256 verify (ring):            {bare:>10.0} /s");
    println!(
        "  cached collateral (1 P-256 / quote): {cached:>10.0} /s  = {:.1} % of the bare rate",
        100.0 * cached / bare
    );
    println!(
        "  full, no cache ({FULL_P256} P-256 / quote):  {full:>10.0} /s  = {:.1} % of bare / {FULL_P256}",
        100.0 * full * FULL_P256 / bare
    );
}
