//! Loom model of the GCRA token bucket (`src/algorithm/token_bucket.rs`).
//!
//! Protocol: one word holds the theoretical arrival time `tat`. A caller loads it (Acquire), *then*
//! reads the clock, computes `next = max(tat, now) + n·T`, and admits iff `next − now ≤ burst·T` by
//! a CAS (Release on success, Acquire on failure) from the loaded `tat` to `next`; a failed CAS
//! re-reads the clock.
//!
//! The models use burst 2 and an emission interval T = 10 ns (`Rate::new(1, 10 ns)`) on a
//! `ManualClock`, with 2-3 racing threads (n = 1 and n = 2) and a thread moving the clock. They
//! assert:
//! - conformance: replaying the admissions sorted by `at_nanos` (ties in any order) through a
//!   sequential GCRA starting from `tat = 0`, every admission conforms;
//! - the bound: admitted permits <= burst + (final clock) / T;
//! - `stats().admitted + stats().rejected` equals the number of calls;
//! - no rejection while capacity provably exists (at one instant exactly `burst` permits go; one
//!   emission interval later exactly one more).
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p turnstile-loom-tests`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::thread;
use std::time::Duration;
use turnstile::{Algorithm, Clock, ManualClock, Rate, RateLimiter, TryAcquireError};

/// Emission interval T in nanoseconds.
const T: u64 = 10;
const BURST: u32 = 2;

type Limiter = RateLimiter<ManualClock>;

fn limiter() -> Limiter {
    RateLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::new(1, Duration::from_nanos(T)),
            burst: BURST,
        },
        ManualClock::new(),
    )
    .unwrap()
}

/// One step of a model thread.
#[derive(Clone, Copy)]
enum Op {
    Acquire(u32),
    Advance(u64),
}

/// Admitted `(at, n)` pairs and the number of `try_acquire_n` calls.
#[derive(Default)]
struct Log {
    admitted: Vec<(u64, u32)>,
    calls: u64,
}

fn run(limiter: &Limiter, script: &[Op]) -> Log {
    let mut log = Log::default();
    for op in script {
        match *op {
            Op::Acquire(n) => {
                log.calls += 1;
                match limiter.try_acquire_n(n) {
                    Ok(a) => log.admitted.push((a.at_nanos(), n)),
                    Err(TryAcquireError::Rejected(_)) => {}
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            Op::Advance(d) => limiter.clock().advance(Duration::from_nanos(d)),
        }
    }
    log
}

/// Runs `prelude` on the model's main thread, then each script on its own loom thread; returns the
/// merged log (prelude included).
fn race(limiter: &Limiter, prelude: &[Op], scripts: &[&'static [Op]]) -> Log {
    let mut total = run(limiter, prelude);
    let handles: Vec<_> = scripts
        .iter()
        .map(|&script| {
            let limiter = limiter.clone();
            thread::spawn(move || run(&limiter, script))
        })
        .collect();
    for h in handles {
        let log = h.join().unwrap();
        total.admitted.extend(log.admitted);
        total.calls += log.calls;
    }
    total
}

/// Sequential GCRA conformance, the rate bound and the stats identity. Returns admitted permits.
fn check(limiter: &Limiter, log: &Log) -> u64 {
    let mut sorted = log.admitted.clone();
    sorted.sort_unstable();
    let mut tat = 0u64;
    for &(at, n) in &sorted {
        let next = tat.max(at) + u64::from(n) * T;
        assert!(
            next - at <= u64::from(BURST) * T,
            "admission of {n} at {at} does not conform (tat {tat}): {sorted:?}"
        );
        tat = next;
    }
    let permits: u64 = sorted.iter().map(|&(_, n)| u64::from(n)).sum();
    let bound = u64::from(BURST) + limiter.clock().now() / T;
    assert!(
        permits <= bound,
        "{permits} permits > burst + elapsed/T = {bound}: {sorted:?}"
    );
    let stats = limiter.stats();
    assert_eq!(
        stats.admitted as usize,
        log.admitted.len(),
        "stats.admitted vs observed"
    );
    assert_eq!(
        stats.admitted + stats.rejected,
        log.calls,
        "stats total vs calls"
    );
    permits
}

/// Three n = 1 calls at t = 0: exactly `burst` admitted.
#[test]
fn burst_three_singles() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[],
            &[&[Op::Acquire(1)], &[Op::Acquire(1)], &[Op::Acquire(1)]],
        );
        assert_eq!(check(&l, &log), u64::from(BURST));
    });
}

/// n = 2 against two n = 1 calls at t = 0: exactly `burst` permits, whatever the order.
#[test]
fn burst_mixed_sizes() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[],
            &[&[Op::Acquire(2)], &[Op::Acquire(1), Op::Acquire(1)]],
        );
        assert_eq!(check(&l, &log), u64::from(BURST));
    });
}

/// The bucket is emptied at t = 0; one thread moves the clock one interval on and acquires while
/// two others acquire (their calls land at t = 0 or t = T). Exactly one permit has been earned, and
/// the advancing thread's own call after the advance guarantees it is taken.
#[test]
fn refill_one_interval() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[Op::Acquire(2)],
            &[
                &[Op::Advance(T), Op::Acquire(1)],
                &[Op::Acquire(1), Op::Acquire(1)],
                &[Op::Acquire(1)],
            ],
        );
        assert_eq!(check(&l, &log), u64::from(BURST) + 1);
    });
}

/// Two threads asking for n = 2 and n = 1 while a third moves the clock by half an interval and
/// then by a full one (t = 5, then t = 15), so admissions see `tat` ahead of and behind `now`.
#[test]
fn partial_intervals() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[],
            &[
                &[Op::Advance(T / 2), Op::Advance(T)],
                &[Op::Acquire(2), Op::Acquire(1)],
                &[Op::Acquire(1), Op::Acquire(2)],
            ],
        );
        assert!(
            check(&l, &log) >= 1,
            "the first call on a full bucket always fits"
        );
    });
}
