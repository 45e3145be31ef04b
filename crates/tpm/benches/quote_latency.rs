//! Quote and PCR-read latency against a local swtpm, in process (no tool is spawned).
//!
//! `cargo bench -p asterism-tpm --bench quote_latency` starts a private swtpm, loads the ECC
//! and RSA AKs, warms up, then times 200 quotes of PCRs 0..=23 per AK (each quote includes
//! the read-back of the 24 PCR values, three TPM2_PCR_Read calls) and 200 reads of all 24
//! PCRs, and prints the median and 99th percentile in milliseconds.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use asterism_testkit::Swtpm;
use asterism_tpm::{AkAlgorithm, AkConfig, PcrSelection, Tpm};

const WARM_UP: usize = 20;
const SAMPLES: usize = 200;

fn main() {
    let swtpm = Swtpm::start().expect("start swtpm (are swtpm and swtpm-tools installed?)");
    let mut tpm = Tpm::open(&swtpm.config()).expect("open swtpm");
    let all = PcrSelection::all();
    let nonce = [0x42u8; 32];

    println!(
        "TPM: swtpm over loopback TCP ({}), {SAMPLES} samples each",
        swtpm.tcti()
    );
    for algorithm in [AkAlgorithm::EccP256, AkAlgorithm::Rsa2048] {
        let started = Instant::now();
        let ak = tpm
            .load_attestation_key(&AkConfig::new(algorithm))
            .expect("load AK");
        println!(
            "{algorithm:?} AK create+persist: {:.1} ms",
            ms(started.elapsed())
        );
        let started = Instant::now();
        tpm.load_attestation_key(&AkConfig::new(algorithm))
            .expect("load AK");
        println!(
            "{algorithm:?} AK load (persistent): {:.2} ms",
            ms(started.elapsed())
        );
        let samples = measure(|| {
            tpm.quote(&ak, &nonce, &all).expect("quote");
        });
        report(
            &format!("quote PCRs 0..=23 + read-back, {algorithm:?} AK"),
            samples,
        );
    }
    let samples = measure(|| {
        tpm.read_pcrs(&all).expect("read PCRs");
    });
    report("read PCRs 0..=23 (3 x TPM2_PCR_Read)", samples);
    let one = PcrSelection::new([15]).expect("selection");
    let samples = measure(|| {
        tpm.read_pcrs(&one).expect("read PCR 15");
    });
    report("read PCR 15 (1 x TPM2_PCR_Read)", samples);
}

fn measure(mut operation: impl FnMut()) -> Vec<Duration> {
    for _ in 0..WARM_UP {
        operation();
    }
    (0..SAMPLES)
        .map(|_| {
            let started = Instant::now();
            operation();
            started.elapsed()
        })
        .collect()
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let median = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99).div_ceil(100) - 1];
    let max = samples[samples.len() - 1];
    println!(
        "{name}: median {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms(median),
        ms(p99),
        ms(max)
    );
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
