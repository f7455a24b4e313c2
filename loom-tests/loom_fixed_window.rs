//! Loom model of the fixed window (`src/algorithm/fixed_window.rs`).
//!
//! Protocol: one word packs (window id, count). A caller loads it (Acquire), *then* reads the clock,
//! and admits by a CAS (Release on success, Acquire on failure) to (its window, count + n), or to
//! (its window, n) when the word holds an older window. A failed CAS re-reads the clock.
//!
//! The models race 2-3 threads calling `try_acquire_n` (n = 1 and n = 2) on a `ManualClock`, with
//! and without a thread that moves the clock across the window boundary between its calls. They
//! assert:
//! - per fixed window (admissions grouped by `at_nanos / window`), admitted permits <= limit;
//! - `stats().admitted + stats().rejected` equals the number of calls, and `stats().admitted` the
//!   number of admissions observed;
//! - with no clock movement and only n = 1 requests, exactly `min(limit, demand)` are admitted (no
//!   rejection while capacity is left, no lost update);
//! - a thread's admissions carry non-decreasing times (program order + a monotonic clock).
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p turnstile-loom-tests`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::thread;
use std::collections::BTreeMap;
use std::time::Duration;
use turnstile::{Algorithm, ManualClock, RateLimiter, TryAcquireError};

const WINDOW: u64 = 10;
const LIMIT: u32 = 2;

type Limiter = RateLimiter<ManualClock>;

fn limiter() -> Limiter {
    RateLimiter::with_clock(
        Algorithm::FixedWindow {
            limit: LIMIT,
            window: Duration::from_nanos(WINDOW),
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
                    Ok(a) => {
                        if let Some(&(last, _)) = log.admitted.last() {
                            assert!(a.at_nanos() >= last, "time went backwards in one thread");
                        }
                        log.admitted.push((a.at_nanos(), n));
                    }
                    Err(TryAcquireError::Rejected(_)) => {}
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            Op::Advance(d) => limiter.clock().advance(Duration::from_nanos(d)),
        }
    }
    log
}

/// Runs each script on its own loom thread and returns the merged log.
fn race(limiter: &Limiter, scripts: &[&'static [Op]]) -> Log {
    let handles: Vec<_> = scripts
        .iter()
        .map(|&script| {
            let limiter = limiter.clone();
            thread::spawn(move || run(&limiter, script))
        })
        .collect();
    let mut total = Log::default();
    for h in handles {
        let log = h.join().unwrap();
        total.admitted.extend(log.admitted);
        total.calls += log.calls;
    }
    total
}

/// Per-window limit and the stats identity; returns the admitted permits per window.
fn check(limiter: &Limiter, log: &Log) -> BTreeMap<u64, u32> {
    let mut per_window = BTreeMap::new();
    for &(at, n) in &log.admitted {
        *per_window.entry(at / WINDOW).or_insert(0) += n;
    }
    for (&w, &permits) in &per_window {
        assert!(
            permits <= LIMIT,
            "window {w} admitted {permits} permits > limit {LIMIT}: {:?}",
            log.admitted
        );
    }
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
    per_window
}

/// Three n = 1 calls at one instant on limit 2: exactly 2 admitted, 1 rejected.
#[test]
fn three_singles_one_window() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[&[Op::Acquire(1)], &[Op::Acquire(1)], &[Op::Acquire(1)]],
        );
        check(&l, &log);
        assert_eq!(log.admitted.len(), 2, "min(limit, demand) must be admitted");
        assert_eq!(l.stats().rejected, 1);
    });
}

/// Two threads, two n = 1 calls each, one instant: exactly 2 of the 4 admitted.
#[test]
fn two_threads_two_calls_each() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[
                &[Op::Acquire(1), Op::Acquire(1)],
                &[Op::Acquire(1), Op::Acquire(1)],
            ],
        );
        check(&l, &log);
        assert_eq!(log.admitted.len(), 2, "min(limit, demand) must be admitted");
    });
}

/// n = 2 against n = 1 twice, one instant. The first CAS always fits, so at least one call is
/// admitted; the permits admitted are exactly 2 (n = 2 first: both; an n = 1 first: the n = 2 call no
/// longer fits, and the second n = 1 call does).
#[test]
fn mixed_sizes_one_window() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[&[Op::Acquire(2)], &[Op::Acquire(1)], &[Op::Acquire(1)]],
        );
        let per_window = check(&l, &log);
        assert_eq!(
            per_window.get(&0).copied(),
            Some(LIMIT),
            "{:?}",
            log.admitted
        );
    });
}

/// A thread moves the clock into the next window between its own calls while two others acquire
/// (one with n = 2). Checks the per-window bound across the reset, and that the caller's call after
/// its own advance is counted in window 1 (it reads the clock after loading the word).
#[test]
fn boundary_advance_between_calls() {
    model(|| {
        let l = limiter();
        let log = race(
            &l,
            &[
                &[Op::Acquire(1), Op::Advance(WINDOW), Op::Acquire(1)],
                &[Op::Acquire(2)],
                &[Op::Acquire(1), Op::Acquire(1)],
            ],
        );
        check(&l, &log);
        for &(at, _) in &log.admitted {
            assert!(at == 0 || at == WINDOW, "time {at} was never on the clock");
        }
    });
}

/// Window 0 is filled before the threads start; one thread moves the clock to window 1 while two
/// others each try n = 2 then n = 1. Checks the roll-over CAS against CASes that still carry window
/// 0's word, and that window 1 cannot be left unused: the advancing thread's own n = 1 call after the
/// advance is rejected only if window 1 is already full.
#[test]
fn rollover_from_full_window() {
    model(|| {
        let l = limiter();
        assert!(l.try_acquire_n(2).is_ok());
        let mut log = race(
            &l,
            &[
                &[Op::Advance(WINDOW), Op::Acquire(1)],
                &[Op::Acquire(2), Op::Acquire(1)],
            ],
        );
        log.admitted.push((0, 2));
        log.calls += 1;
        let per_window = check(&l, &log);
        assert_eq!(per_window.get(&0).copied(), Some(LIMIT));
        // After the advance, the advancing thread's call sees window 1; it can only be rejected if
        // window 1 already holds LIMIT permits.
        let in_window_1 = per_window.get(&1).copied().unwrap_or(0);
        assert!(
            in_window_1 >= 1,
            "window 1 was never used: {:?}",
            log.admitted
        );
    });
}
