//! Loom models of `charge` racing `try_acquire` on one limiter (`Charge::run` in
//! `src/algorithm/`): a charge is an admission's compare-and-swap loop minus the limit check, so
//! it must neither lose an admission's update nor be lost by one, and every admission that
//! starts after a charge has finished must see it.
//!
//! Each model runs a charging thread (it charges, then sets a flag with Release) against a thread
//! taking single permits (it loads the flag with Acquire before each call, so an admission that
//! saw the flag happens after the charge), sometimes with a thread moving the clock. They assert:
//! - never more admitted than the limit minus the charge allows: in the charge's window (or, for
//!   the bucket and the log, at one instant), if any admission came after the charge, then all
//!   admissions plus the charge fit in the limit;
//! - no lost update: with the clock still, the state at the end holds exactly the admissions and
//!   the charge (the permits left, or the bucket's `tat`, read by a `charge(0)`);
//! - each admission was within the limit (admitted permits ≤ limit).
//!
//! The exact sliding window's model takes its overdraw path (a charge that does not fit claims
//! the whole ring) against claims that may be between their CAS and their slot writes.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p turnstile-loom-tests --test loom_charge`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use std::time::Duration;
use turnstile::{Algorithm, Clock, ManualClock, Rate, RateLimiter, TryAcquireError};

const WINDOW: u64 = 10;

type Limiter = RateLimiter<ManualClock>;

fn limiter(algorithm: Algorithm) -> Limiter {
    RateLimiter::with_clock(algorithm, ManualClock::new()).unwrap()
}

/// What one race produced: the charge's time, and each admission's time and whether it started
/// after the charge had finished.
struct Outcome {
    charged_at: u64,
    admitted: Vec<(u64, bool)>,
}

/// Races `charge(charge)` against `attempts` single-permit `try_acquire`s, and, if `advance` is
/// set, a thread moving the clock by that much.
fn race(limiter: &Limiter, charge: u32, attempts: usize, advance: Option<u64>) -> Outcome {
    let done = Arc::new(AtomicBool::new(false));
    let charger = {
        let (limiter, done) = (limiter.clone(), Arc::clone(&done));
        thread::spawn(move || {
            let charged = limiter.charge(charge).unwrap();
            // Release: an acquirer that loads `true` (Acquire) starts after the charge's CAS.
            done.store(true, Ordering::Release);
            charged.at_nanos()
        })
    };
    let mover = advance.map(|d| {
        let limiter = limiter.clone();
        thread::spawn(move || limiter.clock().advance(Duration::from_nanos(d)))
    });
    let mut admitted = Vec::new();
    for _ in 0..attempts {
        // Acquire: pairs with the charger's Release store (see there).
        let after = done.load(Ordering::Acquire);
        match limiter.try_acquire() {
            Ok(a) => admitted.push((a.at_nanos(), after)),
            Err(TryAcquireError::Rejected(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    let charged_at = charger.join().unwrap();
    if let Some(mover) = mover {
        mover.join().unwrap();
    }
    Outcome {
        charged_at,
        admitted,
    }
}

/// The admissions that share the charge's window (`same`), and the check that, if one of them
/// started after the charge, all of them and the charge fit in `limit` together.
fn after_charge_fits(outcome: &Outcome, limit: u64, charged: u64, same: impl Fn(u64) -> bool) {
    let together: Vec<_> = outcome
        .admitted
        .iter()
        .filter(|(at, _)| same(*at))
        .collect();
    if together.iter().any(|(_, after)| *after) {
        assert!(
            together.len() as u64 + charged <= limit,
            "admitted over a charge: {} admitted + {charged} charged > {limit}",
            together.len(),
        );
    }
    assert!(together.len() as u64 <= limit, "over the limit");
}

/// Fixed window, limit 2, the clock still: a charge of 1 against three single permits.
#[test]
fn fixed_window_charge_races_admissions() {
    model(|| {
        let limiter = limiter(Algorithm::FixedWindow {
            limit: 2,
            window: Duration::from_nanos(WINDOW),
        });
        let outcome = race(&limiter, 1, 3, None);
        after_charge_fits(&outcome, 2, 1, |_| true);
        // No lost update: what is left is the limit minus everything taken, saturating.
        let taken = outcome.admitted.len() as u32 + 1;
        assert_eq!(
            limiter.charge(0).unwrap().remaining(),
            2u32.saturating_sub(taken)
        );
    });
}

/// Fixed window, limit 2, with the clock crossing into the next window: the charge lands in one
/// window, and the admissions in that window that came after it must fit with it.
#[test]
fn fixed_window_charge_races_admissions_across_windows() {
    model(|| {
        let limiter = limiter(Algorithm::FixedWindow {
            limit: 2,
            window: Duration::from_nanos(WINDOW),
        });
        let outcome = race(&limiter, 2, 2, Some(WINDOW));
        let window = outcome.charged_at / WINDOW;
        after_charge_fits(&outcome, 2, 2, |at| at / WINDOW == window);
    });
}

/// Token bucket, burst 2, T = 10 ns, the clock still: a charge of 1 against three permits; at
/// the end `tat` must be exactly (admitted + charged)·T.
#[test]
fn token_bucket_charge_races_admissions() {
    model(|| {
        let limiter = limiter(Algorithm::TokenBucket {
            rate: Rate::new(1, Duration::from_nanos(WINDOW)),
            burst: 2,
        });
        let outcome = race(&limiter, 1, 3, None);
        after_charge_fits(&outcome, 2, 1, |_| true);
        let taken = outcome.admitted.len() as u64 + 1;
        assert_eq!(
            limiter.charge(0).unwrap().reset_after(),
            Duration::from_nanos(taken * WINDOW)
        );
    });
}

/// Token bucket in debt: a charge of 3 (one beyond the burst) against two permits, the clock
/// moving one interval: an admission after the charge needs the debt paid first, which one
/// interval cannot do, so any admission must have come before the charge.
#[test]
fn token_bucket_debt_races_admissions() {
    model(|| {
        let limiter = limiter(Algorithm::TokenBucket {
            rate: Rate::new(1, Duration::from_nanos(WINDOW)),
            burst: 2,
        });
        let outcome = race(&limiter, 3, 2, Some(WINDOW));
        assert!(
            outcome.admitted.iter().all(|(_, after)| !after),
            "admitted while in debt: {:?}",
            outcome.admitted
        );
    });
}

/// Exact sliding window, limit 2, the clock still: a charge of 2 against two permits. Whenever
/// an admission came first the charge overdraws (claims the whole ring, rewriting it), racing
/// the other claim's publication.
#[test]
fn sliding_window_overdraw_races_admissions() {
    model(|| {
        let limiter = limiter(Algorithm::SlidingWindow {
            limit: 2,
            window: Duration::from_nanos(WINDOW),
        });
        let outcome = race(&limiter, 2, 2, None);
        after_charge_fits(&outcome, 2, 2, |_| true);
        // No lost update: the ring is full, whatever the order.
        assert_eq!(limiter.charge(0).unwrap().remaining(), 0);
        assert!(limiter.try_acquire().is_err());
    });
}

/// Exact sliding window, limit 2 in a ring of 3 (`max_limit`), the clock still: a charge of 2
/// against two permits. An overdraw claims all three tickets (expired, then the two latest
/// entries), racing the other claim's publication, and rewrites every slot: once the limit is
/// raised to 3 the log's two kept entries leave one permit, whatever the order. (Claiming two
/// tickets left an admission in the third slot beside its copy, and the raise found none.)
#[test]
fn sliding_window_overdraw_of_a_larger_ring_races_admissions() {
    model(|| {
        let sliding = |limit| Algorithm::SlidingWindow {
            limit,
            window: Duration::from_nanos(WINDOW),
        };
        let limiter = RateLimiter::builder(sliding(2))
            .clock(ManualClock::new())
            .max_limit(3)
            .build()
            .unwrap();
        let outcome = race(&limiter, 2, 2, None);
        after_charge_fits(&outcome, 2, 2, |_| true);
        assert_eq!(limiter.charge(0).unwrap().remaining(), 0);
        limiter.reconfigure(sliding(3)).unwrap();
        assert_eq!(limiter.charge(0).unwrap().remaining(), 1);
        limiter.try_acquire().unwrap();
        assert!(limiter.try_acquire().is_err());
    });
}

/// Exact sliding window, limit 2, W = 10 ns: a charge of 1 against three single permits while
/// the clock moves one window on, so that the charge may find the ring full (and overdraw) or
/// not, and admissions may see any mix of live and expired entries. Every admission that started
/// after the charge must leave at most 2 entries, admissions and the charge, in the window that
/// ends at its own time; every admission, at most 2 admissions.
#[test]
fn sliding_window_charge_races_admissions_as_the_window_slides() {
    model(|| {
        let limiter = limiter(Algorithm::SlidingWindow {
            limit: 2,
            window: Duration::from_nanos(WINDOW),
        });
        let outcome = race(&limiter, 1, 3, Some(WINDOW));
        let live_at = |t: u64, at: u64| at <= t && t < at + WINDOW;
        for &(t, after) in &outcome.admitted {
            let admissions = outcome
                .admitted
                .iter()
                .filter(|(at, _)| live_at(t, *at))
                .count();
            let charge = usize::from(after && live_at(t, outcome.charged_at));
            assert!(
                admissions + charge <= 2,
                "at {t}: {admissions} admissions + {charge} charged > 2: {:?}, charged at {}",
                outcome.admitted,
                outcome.charged_at
            );
        }
        // No lost update: with nothing in flight the ring counts the log's live entries (the
        // log in time order: no refund, no reconfiguration), up to the limit.
        let now = limiter.clock().now();
        let live = outcome
            .admitted
            .iter()
            .filter(|(at, _)| live_at(now, *at))
            .count()
            + usize::from(live_at(now, outcome.charged_at));
        assert_eq!(
            limiter.charge(0).unwrap().remaining() as usize,
            2 - live.min(2),
            "at {now}: {:?}, charged at {}",
            outcome.admitted,
            outcome.charged_at
        );
    });
}
