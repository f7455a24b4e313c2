//! Contract checks shared by the stress audits: each takes one limiter's (or one key's) admissions
//! as `(time, permits)` sorted by time and counts the admissions that break the algorithm's
//! contract. The answer must be 0.

#![allow(dead_code)] // each test binary uses the checks it needs

pub mod algorithms;
pub mod hook_clock;
pub mod models;

use std::collections::HashMap;
use std::time::Duration;
use turnstile::{Algorithm, Rate};

/// Fixed windows holding more than `limit` permits.
pub fn fixed_violations(admissions: &[(u64, u64)], limit: u32, window: Duration) -> usize {
    let w = window.as_nanos() as u64;
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    for &(t, n) in admissions {
        *per_window.entry(t / w).or_default() += n;
    }
    per_window
        .values()
        .filter(|&&c| c > u64::from(limit))
        .count()
}

/// Intervals of length `window` holding more than `limit` permits.
pub fn sliding_violations(admissions: &[(u64, u64)], limit: u32, window: Duration) -> usize {
    let w = window.as_nanos() as u64;
    let times: Vec<u64> = admissions
        .iter()
        .flat_map(|&(t, n)| std::iter::repeat_n(t, n as usize))
        .collect();
    let n = limit as usize;
    // Any limit + 1 permits within one window would put two permits `limit` apart in sorted
    // order less than a window apart.
    (0..times.len().saturating_sub(n))
        .filter(|&i| times[i + n] - times[i] < w)
        .count()
}

/// Admissions above the sliding counter's weighted estimate, replayed in time order: each must
/// have satisfied prev·(W − e) + (cur + n)·W ≤ limit·W given the admissions before it (ties at
/// one instant may come in any order). Also counts fixed windows over the limit.
pub fn counter_violations(admissions: &[(u64, u64)], limit: u32, window: Duration) -> usize {
    let w = window.as_nanos() as u64;
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let mut violations = 0;
    for &(t, n) in admissions {
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
    violations + counts.values().filter(|&&c| c > u64::from(limit)).count()
}

/// Admissions a GCRA token bucket had no credit for.
pub fn bucket_violations(admissions: &[(u64, u64)], rate: Rate, burst: u32) -> usize {
    let interval = (rate.period.as_nanos() as u64).div_ceil(u64::from(rate.permits));
    let capacity = interval * u64::from(burst);
    let (mut credit, mut last, mut violations) = (capacity, 0u64, 0);
    for &(t, n) in admissions {
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
    violations
}

/// The check that fits `algorithm`, with the algorithm's own parameters.
pub fn violations(algorithm: Algorithm, admissions: &[(u64, u64)]) -> usize {
    match algorithm {
        Algorithm::FixedWindow { limit, window } => fixed_violations(admissions, limit, window),
        Algorithm::SlidingWindow { limit, window } => sliding_violations(admissions, limit, window),
        Algorithm::SlidingCounter { limit, window } => {
            counter_violations(admissions, limit, window)
        }
        Algorithm::TokenBucket { rate, burst } => bucket_violations(admissions, rate, burst),
        other => panic!("no contract check for {other:?}"),
    }
}

/// Each of the four algorithms at `limit` per `window` (the token bucket: `limit` per `window`
/// with a burst of `limit`).
pub fn all_algorithms(limit: u32, window: Duration) -> [Algorithm; 4] {
    [
        Algorithm::FixedWindow { limit, window },
        Algorithm::SlidingWindow { limit, window },
        Algorithm::SlidingCounter { limit, window },
        Algorithm::TokenBucket {
            rate: Rate::new(limit, window),
            burst: limit,
        },
    ]
}

/// The wall clock in µs since the Unix epoch: the time of a `StoreLimiter`'s state.
pub fn wall_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Makes sure at least `room` is left of the current epoch-aligned window of `window` on the
/// wall clock, waiting for the next window if less is (plus 5 ms): for tests that decide in a
/// `StoreLimiter`'s fixed windows or sliding counters, which are aligned to the Unix epoch on
/// the wall clock, so that none ends between two of their calls (the count would start afresh,
/// a retry-after would be cut short). The wait is at most `room`.
pub fn room_in_wall_window(window: Duration, room: Duration) {
    assert!(
        room < window,
        "room {room:?} must be shorter than the window {window:?}"
    );
    let w = window.as_micros() as u64;
    let left = w - wall_now_us() % w;
    if left < room.as_micros() as u64 {
        std::thread::sleep(Duration::from_micros(left) + Duration::from_millis(5));
    }
}
