//! Stress audits on real threads with a real clock: every admission's assigned time is recorded and
//! the algorithm's contract is checked over all windows afterwards. The answer must be 0 violations.
//!
//! Each audit makes at least 10^6 attempts, from more threads than the machine has cores (so threads
//! are preempted mid-protocol), with a mix of single and multi-permit requests.

use std::collections::HashMap;
use std::sync::Barrier;
use std::time::Duration;
use turnstile::{Algorithm, Clock, MonotonicClock, Rate, RateLimiter, UpkeepClock};

const THREADS: usize = 4;
const ATTEMPTS_PER_THREAD: usize = 250_000;

/// Runs the hammer and returns every admission as (time, permits), sorted by time.
fn hammer<C: Clock>(limiter: &RateLimiter<C>) -> Vec<(u64, u64)> {
    let barrier = Barrier::new(THREADS);
    let mut admissions: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|id| {
                let (limiter, barrier) = (limiter.clone(), &barrier);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    barrier.wait();
                    for i in 0..ATTEMPTS_PER_THREAD {
                        // Threads 0 and 1 take single permits; 2 and 3 take 1–3 at a time.
                        let n = if id < 2 { 1 } else { 1 + (i % 3) as u32 };
                        if let Ok(a) = limiter.try_acquire_n(n) {
                            mine.push((a.at_nanos(), u64::from(n)));
                        }
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    admissions.sort_unstable();
    let stats = limiter.stats();
    let attempts = (THREADS * ATTEMPTS_PER_THREAD) as u64;
    assert_eq!(stats.admitted + stats.rejected, attempts, "stats add up");
    assert_eq!(stats.admitted, admissions.len() as u64);
    assert!(
        stats.rejected > attempts / 10,
        "the audit must exercise rejections"
    );
    assert!(
        admissions.len() > 1000,
        "the audit must exercise admissions"
    );
    admissions
}

fn permits(admissions: &[(u64, u64)]) -> Vec<u64> {
    admissions
        .iter()
        .flat_map(|&(t, n)| std::iter::repeat_n(t, n as usize))
        .collect()
}

fn audit_fixed<C: Clock>(clock: C, limit: u32, window: Duration) {
    let limiter = RateLimiter::with_clock(Algorithm::FixedWindow { limit, window }, clock).unwrap();
    let w = window.as_nanos() as u64;
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    for (t, n) in hammer(&limiter) {
        *per_window.entry(t / w).or_default() += n;
    }
    let violations = per_window
        .values()
        .filter(|&&c| c > u64::from(limit))
        .count();
    assert_eq!(violations, 0, "windows over the limit");
    assert!(
        per_window.values().any(|&c| c == u64::from(limit)),
        "some window filled up"
    );
}

fn audit_sliding<C: Clock>(clock: C, limit: u32, window: Duration) {
    let limiter =
        RateLimiter::with_clock(Algorithm::SlidingWindow { limit, window }, clock).unwrap();
    let w = window.as_nanos() as u64;
    let times = permits(&hammer(&limiter));
    let n = limit as usize;
    // Any limit + 1 permits within one window would put two permits `limit` apart in sorted
    // order less than a window apart.
    let violations = (0..times.len().saturating_sub(n))
        .filter(|&i| times[i + n] - times[i] < w)
        .count();
    assert_eq!(
        violations, 0,
        "intervals of one window holding more than the limit"
    );
}

fn audit_counter<C: Clock>(clock: C, limit: u32, window: Duration) {
    let limiter =
        RateLimiter::with_clock(Algorithm::SlidingCounter { limit, window }, clock).unwrap();
    let w = window.as_nanos() as u64;
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let mut violations = 0;
    // Replay in time order: each admission must have satisfied prev·(W − e) + (cur + n)·W ≤ limit·W
    // given the admissions before it (ties at one instant may come in any order).
    for (t, n) in hammer(&limiter) {
        let (k, e) = (t / w, t % w);
        let prev = if k == 0 {
            0
        } else {
            counts.get(&(k - 1)).copied().unwrap_or(0)
        };
        let cur = counts.get(&k).copied().unwrap_or(0);
        let lhs = prev as u128 * (w - e) as u128 + (cur + n) as u128 * w as u128;
        if lhs > u128::from(limit) * w as u128 {
            violations += 1;
        }
        *counts.entry(k).or_default() += n;
    }
    assert_eq!(violations, 0, "admissions above the weighted estimate");
    assert!(counts.values().all(|&c| c <= u64::from(limit)));
}

fn audit_bucket<C: Clock>(clock: C, rate: Rate, burst: u32) {
    let limiter = RateLimiter::with_clock(Algorithm::TokenBucket { rate, burst }, clock).unwrap();
    let interval = (rate.period.as_nanos() as u64).div_ceil(u64::from(rate.permits));
    let capacity = interval * u64::from(burst);
    let (mut credit, mut last, mut violations) = (capacity, 0u64, 0);
    for (t, n) in hammer(&limiter) {
        credit = (credit + (t - last)).min(capacity);
        last = t;
        match credit.checked_sub(n * interval) {
            Some(left) => credit = left,
            None => {
                violations += 1;
                credit = 0;
            }
        }
    }
    assert_eq!(
        violations, 0,
        "admissions the token bucket had no credit for"
    );
}

// Nanosecond clock: timestamps are nearly all distinct.

#[test]
fn fixed_window_never_over_admits_monotonic_clock() {
    audit_fixed(MonotonicClock::new(), 40, Duration::from_micros(20));
}

#[test]
fn sliding_window_never_over_admits_monotonic_clock() {
    audit_sliding(MonotonicClock::new(), 40, Duration::from_micros(20));
}

#[test]
fn sliding_counter_respects_its_estimate_monotonic_clock() {
    audit_counter(MonotonicClock::new(), 40, Duration::from_micros(20));
}

#[test]
fn token_bucket_conforms_monotonic_clock() {
    audit_bucket(
        MonotonicClock::new(),
        Rate::new(2, Duration::from_micros(1)),
        20,
    );
}

// The default 1 ms upkeep clock: many admissions share one timestamp.

#[test]
fn fixed_window_never_over_admits_upkeep_clock() {
    audit_fixed(UpkeepClock::new(), 500, Duration::from_millis(2));
}

#[test]
fn sliding_window_never_over_admits_upkeep_clock() {
    audit_sliding(UpkeepClock::new(), 500, Duration::from_millis(2));
}

#[test]
fn sliding_counter_respects_its_estimate_upkeep_clock() {
    audit_counter(UpkeepClock::new(), 500, Duration::from_millis(2));
}

#[test]
fn token_bucket_conforms_upkeep_clock() {
    audit_bucket(UpkeepClock::new(), Rate::per_second(250_000), 500);
}
