//! The quickstart: `cargo run --release --example quickstart`.
//!
//! (a) 100 threads hammer one sliding window of 2 permits per 2 seconds for about 6 seconds; every
//!     admission is printed with its time, and nothing else gets through.
//! (b) The boundary scenario (limit 10 per second; 3 calls in [0, 0.5 s), 7 in [0.5, 1 s), 7 in
//!     [1, 1.5 s), 3 in [1.5, 2 s)) is replayed on a manual clock against the fixed window and the
//!     exact sliding window, and charted per 100 ms.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use turnstile::{Algorithm, ManualClock, RateLimiter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    hammer()?;
    println!();
    boundary()?;
    Ok(())
}

fn hammer() -> Result<(), Box<dyn std::error::Error>> {
    const TASKS: usize = 100;
    let run_for = Duration::from_millis(6_100);
    let window = Duration::from_secs(2);
    let limiter = RateLimiter::sliding_window(2, window)?;
    println!("(a) {TASKS} threads hammer a sliding window of 2 per 2 s for {run_for:?}");
    let attempts = AtomicU64::new(0);
    let admitted = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for task in 0..TASKS {
            let (limiter, attempts, admitted) = (&limiter, &attempts, &admitted);
            s.spawn(move || {
                while start.elapsed() < run_for {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    if let Ok(a) = limiter.try_acquire() {
                        let t = start.elapsed();
                        println!(
                            "  {:>6.3} s  task {task:>2} admitted (limiter time {:>6.3} s, {} left)",
                            t.as_secs_f64(),
                            a.at().as_secs_f64(),
                            a.remaining()
                        );
                        admitted.lock().unwrap().push(a.at());
                    }
                    std::thread::sleep(Duration::from_micros(500));
                }
            });
        }
    });
    let admitted = admitted.into_inner().unwrap();
    let most = admitted
        .iter()
        .map(|&t0| {
            admitted
                .iter()
                .filter(|&&t| t >= t0 && t < t0 + window)
                .count()
        })
        .max()
        .unwrap_or(0);
    let stats = limiter.stats();
    println!(
        "  {} attempts, {} admitted, {} rejected; most admitted in any 2 s window: {most}",
        attempts.load(Ordering::Relaxed),
        stats.admitted,
        stats.rejected
    );
    assert!(most <= 2, "the sliding window let more than 2 through");
    Ok(())
}

fn boundary() -> Result<(), Box<dyn std::error::Error>> {
    let mut calls: Vec<u64> = vec![0, 100, 200];
    calls.extend((0..7).map(|i| 500 + 50 * i));
    calls.extend((0..7).map(|i| 1000 + 50 * i));
    calls.extend([1500, 1600, 1700]);
    let second = Duration::from_secs(1);
    let fixed = replay(
        Algorithm::FixedWindow {
            limit: 10,
            window: second,
        },
        &calls,
    )?;
    let sliding = replay(
        Algorithm::SlidingWindow {
            limit: 10,
            window: second,
        },
        &calls,
    )?;
    println!(
        "(b) limit 10 per 1 s; calls: 3 in [0, 0.5 s), 7 in [0.5, 1 s), 7 in [1, 1.5 s), 3 in [1.5, 2 s)"
    );
    println!("      time      calls  fixed window  sliding window");
    for bucket in 0..20 {
        let range: std::ops::Range<u64> = bucket * 100..(bucket + 1) * 100;
        let count = |v: &[u64]| v.iter().filter(|&&t| range.contains(&t)).count();
        println!(
            "  {:>4}–{:<4} ms  {:>3}    {:<12}  {}",
            range.start,
            range.end,
            count(&calls),
            "#".repeat(count(&fixed)),
            "#".repeat(count(&sliding))
        );
    }
    println!(
        "  admitted: fixed {} of {}, sliding {} of {}",
        fixed.len(),
        calls.len(),
        sliding.len(),
        calls.len()
    );
    println!(
        "  most admitted in any 1 s window: fixed {}, sliding {}",
        most_in_window(&fixed, 1000),
        most_in_window(&sliding, 1000)
    );
    Ok(())
}

/// Plays the calls (in ms) on a manual clock and returns the admitted times.
fn replay(algorithm: Algorithm, calls: &[u64]) -> Result<Vec<u64>, turnstile::ConfigError> {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(algorithm, clock.clone())?;
    Ok(calls
        .iter()
        .filter(|&&ms| {
            clock.set(Duration::from_millis(ms));
            limiter.try_acquire().is_ok()
        })
        .copied()
        .collect())
}

fn most_in_window(times: &[u64], window: u64) -> usize {
    times
        .iter()
        .map(|&t0| {
            times
                .iter()
                .filter(|&&t| t >= t0 && t < t0 + window)
                .count()
        })
        .max()
        .unwrap_or(0)
}
