//! Stress audits on real threads with a real clock: every admission's assigned time is recorded and
//! the algorithm's contract is checked over all windows afterwards. The answer must be 0 violations.
//!
//! Each audit makes at least 10^6 attempts, from more threads than the machine has cores (so threads
//! are preempted mid-protocol), with a mix of single and multi-permit requests.

mod common;

use std::collections::HashMap;
use std::sync::Barrier;
use std::time::Duration;
use turnstile::{Algorithm, Clock, MonotonicClock, Rate, RateLimiter, UpkeepClock};

const THREADS: usize = 4;
const ATTEMPTS_PER_THREAD: usize = 250_000;

/// How the threads of an audit make their attempts.
#[derive(Clone, Copy)]
enum Pace {
    /// All at once, without a pause.
    Flat,
    /// In this many bursts, every thread idle for the pause before each (all threads together,
    /// so nobody reads the clock meanwhile): an upkeep clock's thread parks in each pause and is
    /// woken by the burst, so admissions race its sleep and its wake-up.
    Bursts(usize, Duration),
}

/// Runs the hammer and returns every admission as (time, permits), sorted by time.
fn hammer<C: Clock>(limiter: &RateLimiter<C>, pace: Pace) -> Vec<(u64, u64)> {
    let (bursts, pause) = match pace {
        Pace::Flat => (1, Duration::ZERO),
        Pace::Bursts(bursts, pause) => (bursts, pause),
    };
    let barrier = Barrier::new(THREADS);
    let mut admissions: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|id| {
                let (limiter, barrier) = (limiter.clone(), &barrier);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..ATTEMPTS_PER_THREAD {
                        if i % (ATTEMPTS_PER_THREAD / bursts) == 0 {
                            barrier.wait();
                            std::thread::sleep(pause);
                        }
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

fn audit_fixed<C: Clock>(clock: C, limit: u32, window: Duration, pace: Pace) {
    let limiter = RateLimiter::with_clock(Algorithm::FixedWindow { limit, window }, clock).unwrap();
    let admissions = hammer(&limiter, pace);
    assert_eq!(
        common::fixed_violations(&admissions, limit, window),
        0,
        "windows over the limit"
    );
    let w = window.as_nanos() as u64;
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    for (t, n) in admissions {
        *per_window.entry(t / w).or_default() += n;
    }
    assert!(
        per_window.values().any(|&c| c == u64::from(limit)),
        "some window filled up"
    );
}

fn audit_sliding<C: Clock>(clock: C, limit: u32, window: Duration, pace: Pace) {
    let limiter =
        RateLimiter::with_clock(Algorithm::SlidingWindow { limit, window }, clock).unwrap();
    assert_eq!(
        common::sliding_violations(&hammer(&limiter, pace), limit, window),
        0,
        "intervals of one window holding more than the limit"
    );
}

fn audit_counter<C: Clock>(clock: C, limit: u32, window: Duration, pace: Pace) {
    let limiter =
        RateLimiter::with_clock(Algorithm::SlidingCounter { limit, window }, clock).unwrap();
    assert_eq!(
        common::counter_violations(&hammer(&limiter, pace), limit, window),
        0,
        "admissions above the weighted estimate"
    );
}

fn audit_bucket<C: Clock>(clock: C, rate: Rate, burst: u32, pace: Pace) {
    let limiter = RateLimiter::with_clock(Algorithm::TokenBucket { rate, burst }, clock).unwrap();
    assert_eq!(
        common::bucket_violations(&hammer(&limiter, pace), rate, burst),
        0,
        "admissions the token bucket had no credit for"
    );
}

// Nanosecond clock: timestamps are nearly all distinct. The windows are 100 µs: 40 permits per
// window is 400,000 a second, a rate four threads of a debug build exceed several times over even
// on a slow VM, so that rejections stay a large share of the calls (with 20 µs windows a slow
// hour of the shared CI machine left the sliding window under 10% rejected).

#[test]
fn fixed_window_never_over_admits_monotonic_clock() {
    audit_fixed(
        MonotonicClock::new(),
        40,
        Duration::from_micros(100),
        Pace::Flat,
    );
}

#[test]
fn sliding_window_never_over_admits_monotonic_clock() {
    audit_sliding(
        MonotonicClock::new(),
        40,
        Duration::from_micros(100),
        Pace::Flat,
    );
}

#[test]
fn sliding_counter_respects_its_estimate_monotonic_clock() {
    audit_counter(
        MonotonicClock::new(),
        40,
        Duration::from_micros(100),
        Pace::Flat,
    );
}

#[test]
fn token_bucket_conforms_monotonic_clock() {
    audit_bucket(
        MonotonicClock::new(),
        Rate::new(2, Duration::from_micros(1)),
        20,
        Pace::Flat,
    );
}

// The default 1 ms upkeep clock: many admissions share one timestamp.

/// The process-wide upkeep clock, which must have its thread (without one it reads the OS clock
/// itself, and these audits would not share timestamps).
fn shared_upkeep() -> UpkeepClock {
    let clock = UpkeepClock::new();
    assert!(!clock.interval().is_zero(), "no upkeep thread could start");
    clock
}

#[test]
fn fixed_window_never_over_admits_upkeep_clock() {
    audit_fixed(shared_upkeep(), 500, Duration::from_millis(2), Pace::Flat);
}

#[test]
fn sliding_window_never_over_admits_upkeep_clock() {
    audit_sliding(shared_upkeep(), 500, Duration::from_millis(2), Pace::Flat);
}

#[test]
fn sliding_counter_respects_its_estimate_upkeep_clock() {
    audit_counter(shared_upkeep(), 500, Duration::from_millis(2), Pace::Flat);
}

#[test]
fn token_bucket_conforms_upkeep_clock() {
    audit_bucket(shared_upkeep(), Rate::per_second(250_000), 500, Pace::Flat);
}

// The upkeep clock in bursts: before each, every thread idles for 4 ms, long enough for the
// clock's thread to park (after two quiet 1 ms ticks); the burst then reads the OS clock itself
// until two reads come close and wake the thread, so each of the 250 bursts races the switch
// from readers' own readings back to the thread's ticks.

/// Bursts, and the pause before each.
const BURSTS: Pace = Pace::Bursts(250, Duration::from_millis(4));

/// A private 1 ms upkeep clock: the process-wide one is kept ticking by the other audits that
/// run beside these.
fn private_upkeep() -> UpkeepClock {
    let clock = UpkeepClock::with_interval(Duration::from_millis(1)).unwrap();
    assert!(!clock.interval().is_zero(), "no upkeep thread could start");
    clock
}

#[test]
fn fixed_window_never_over_admits_upkeep_clock_waking_up() {
    audit_fixed(private_upkeep(), 100, Duration::from_micros(500), BURSTS);
}

#[test]
fn sliding_window_never_over_admits_upkeep_clock_waking_up() {
    audit_sliding(private_upkeep(), 100, Duration::from_micros(500), BURSTS);
}

#[test]
fn sliding_counter_respects_its_estimate_upkeep_clock_waking_up() {
    audit_counter(private_upkeep(), 100, Duration::from_micros(500), BURSTS);
}

#[test]
fn token_bucket_conforms_upkeep_clock_waking_up() {
    audit_bucket(private_upkeep(), Rate::per_second(200_000), 100, BURSTS);
}
