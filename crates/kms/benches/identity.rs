//! `identity`: what the control plane's signature costs per ticket, against the join
//! service's CPU time per join.
//!
//! The join service signs every ticket (SHA-256 of the encoded ticket, one Ed25519
//! signature) and the joining node verifies it (the same hash, one Ed25519 verification).
//! The ticket here is the size of a worker's (the kubelet certificate chain, the SSH CA
//! and host certificate, components: about 6 KiB) and of a control-plane node's (with the
//! CA files: about 24 KiB).
//!
//! It prints the cost of each, and the join rate with the check on relative to off,
//! `per_join / (per_join + sign)`, for the service's CPU time per join given in
//! `IDENTITY_BENCH_JOIN_CPU_US` (default 1200 µs, the lowest figure of the `join_load`
//! benchmark in docs/join-service.md, so the ratio is the least favourable one).
//!
//! Run: `cargo bench -p asterism-kms --bench identity`

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::cast_precision_loss
)]

use asterism_kms::{ChannelBinding, ControlPlaneSeed, ControlPlaneSigner, Purpose};
use std::time::Instant;

fn per_op_us(n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn main() {
    let join_cpu_us: f64 = std::env::var("IDENTITY_BENCH_JOIN_CPU_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1200.0);
    let signer =
        ControlPlaneSigner::new(&ControlPlaneSeed::from_bytes(vec![7; 32]).unwrap()).unwrap();
    let key = signer.public_key();
    let binding = ChannelBinding([9; 32]);
    println!("join service CPU per join (without the signature): {join_cpu_us:.0} µs");
    for (what, len) in [
        ("worker ticket", 6 * 1024),
        ("control-plane ticket", 24 * 1024),
    ] {
        let ticket = vec![0x5a_u8; len];
        let sig = signer.sign(Purpose::JoinTicket, &binding, &ticket);
        let sign = per_op_us(20_000, || {
            std::hint::black_box(signer.sign(Purpose::JoinTicket, &binding, &ticket));
        });
        let verify = per_op_us(20_000, || {
            key.verify(Purpose::JoinTicket, &binding, &ticket, &sig)
                .unwrap();
        });
        let ratio = join_cpu_us / (join_cpu_us + sign);
        println!(
            "{what} ({len} B): sign {sign:.1} µs (service), verify {verify:.1} µs (node); \
             join rate with the check / without: {ratio:.3}"
        );
    }
}
