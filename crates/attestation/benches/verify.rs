//! Benchmark: tpm-quote verifications per second.

fn main() {}
