//! Measurement shared by this crate's benchmarks: calls per CPU-second of the calling
//! thread (`/proc/thread-self/schedstat`), best of interleaved rounds, so that neighbours on
//! a shared machine bias none of the figures compared in one run.

use std::time::{Duration, Instant};

/// CPU time this thread has used (the scheduler's own account, in nanoseconds).
pub fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    let ns = text.split_whitespace().next().unwrap().parse().unwrap();
    Duration::from_nanos(ns)
}

/// Calls of `f` per CPU-second, over about `run` of wall time.
pub fn rate(f: &mut dyn FnMut(), run: Duration) -> f64 {
    for _ in 0..4 {
        f();
    }
    let (wall, cpu) = (Instant::now(), thread_cpu());
    let mut n = 0u64;
    while wall.elapsed() < run {
        for _ in 0..8 {
            f();
        }
        n += 8;
    }
    n as f64 / (thread_cpu() - cpu).as_secs_f64()
}

/// The best rate of each closure over `rounds` interleaved rounds of `run` each.
pub fn best(fs: &mut [&mut dyn FnMut()], rounds: usize, run: Duration) -> Vec<f64> {
    let mut out = vec![0f64; fs.len()];
    for _ in 0..rounds {
        for (f, r) in fs.iter_mut().zip(&mut out) {
            *r = r.max(rate(*f, run));
        }
    }
    out
}
