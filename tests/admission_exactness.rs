//! What an `Admission` and a `Rejection` say, checked against the limiter itself by replay: after
//! random admissions, probes, charges, reconfigurations (same algorithm) and refunds of receipts
//! at any age (a refund changes the state every later answer reads), the last
//! admission's `remaining` is what `stats().available` reports, its `reset_after` is exactly when
//! the whole capacity fits again (and not a nanosecond sooner), and a rejection's `retry_after`
//! is exactly when the refused call fits. Each check replays the steps on a fresh limiter, so it
//! reads the state the answer was given for.

use proptest::prelude::*;
use std::time::Duration;
use turnstile::{Admission, Algorithm, ManualClock, Rate, RateLimiter, TryAcquireError};

const NS: fn(u64) -> Duration = Duration::from_nanos;

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Advance the clock, then `try_acquire_n`.
    Take(u64, u32),
    /// Advance the clock, then `charge`.
    Charge(u64, u32),
    /// Reconfigure to this limit (or burst) and window (or period).
    Change(u32, u64),
    /// Advance the clock, then `try_acquire_refundable`, the receipt kept.
    Hold(u64, u32),
    /// Advance the clock, then refund a kept receipt (this one of them, modulo how many).
    Refund(u64, usize),
}

/// Which parameters a `Change` moves.
#[derive(Debug, Clone, Copy)]
enum Moves {
    Both,
    /// The sliding window's window only: its limit kept.
    Window,
    /// The sliding window's limit only: its window kept.
    Limit,
}

fn changed(algorithm: Algorithm, moves: Moves, to: u32, nanos: u64) -> Algorithm {
    let w = NS(nanos);
    match (algorithm, moves) {
        (Algorithm::FixedWindow { .. }, _) => Algorithm::FixedWindow {
            limit: to,
            window: w,
        },
        (Algorithm::SlidingCounter { .. }, _) => Algorithm::SlidingCounter {
            limit: to,
            window: w,
        },
        (Algorithm::TokenBucket { rate, .. }, _) => Algorithm::TokenBucket {
            rate: Rate::new(rate.permits, w),
            burst: to,
        },
        (Algorithm::SlidingWindow { limit, .. }, Moves::Window) => {
            Algorithm::SlidingWindow { limit, window: w }
        }
        (Algorithm::SlidingWindow { window, .. }, Moves::Limit) => {
            Algorithm::SlidingWindow { limit: to, window }
        }
        (Algorithm::SlidingWindow { .. }, Moves::Both) => Algorithm::SlidingWindow {
            limit: to,
            window: w,
        },
        (other, _) => panic!("no such algorithm {other:?}"),
    }
}

/// A limiter (ring of 5 for the sliding window) after `steps`, and the last step's admission.
fn replay(
    algorithm: Algorithm,
    moves: Moves,
    steps: &[Step],
) -> (RateLimiter<ManualClock>, ManualClock, Option<Admission>) {
    let clock = ManualClock::new();
    let limiter = RateLimiter::builder(algorithm)
        .clock(clock.clone())
        .max_limit(5)
        .build()
        .unwrap();
    let mut last = None;
    let mut held = Vec::new();
    for step in steps {
        last = match *step {
            Step::Take(advance, n) => {
                clock.advance(NS(advance));
                limiter.try_acquire_n(n).ok()
            }
            Step::Charge(advance, n) => {
                clock.advance(NS(advance));
                limiter.charge(n).ok()
            }
            Step::Hold(advance, n) => {
                clock.advance(NS(advance));
                let receipt = limiter.try_acquire_refundable(n).ok();
                let admission = receipt.as_ref().map(|r| r.admission());
                held.extend(receipt);
                admission
            }
            Step::Refund(advance, which) => {
                clock.advance(NS(advance));
                if !held.is_empty() {
                    held.swap_remove(which % held.len()).refund();
                }
                None
            }
            Step::Change(to, nanos) => {
                limiter
                    .reconfigure(changed(algorithm, moves, to, nanos))
                    .unwrap();
                None
            }
        };
    }
    (limiter, clock, last)
}

fn check(
    algorithm: Algorithm,
    moves: Moves,
    steps: &[Step],
    then: (u64, u32),
) -> Result<(), TestCaseError> {
    let (limiter, _, last) = replay(algorithm, moves, steps);
    if let Some(admission) = last {
        prop_assert_eq!(admission.remaining(), limiter.stats().available);
        let capacity = limiter.capacity();
        let reset = admission.reset_after().as_nanos() as u64;
        if !matches!(algorithm, Algorithm::FixedWindow { .. }) {
            // (A fixed window's reset is its window's end, full or not.)
            let (at_reset, clock, _) = replay(algorithm, moves, steps);
            clock.advance(NS(reset));
            prop_assert_eq!(
                at_reset.stats().available,
                capacity,
                "reset_after {}",
                reset
            );
            prop_assert!(
                at_reset.try_acquire_n(capacity).is_ok(),
                "reset_after {}",
                reset
            );
            if reset > 0 {
                let (early, clock, _) = replay(algorithm, moves, steps);
                clock.advance(NS(reset - 1));
                prop_assert!(
                    early.try_acquire_n(capacity).is_err(),
                    "reset_after {}",
                    reset
                );
            }
        }
    }
    let (advance, n) = then;
    let (limiter, clock, _) = replay(algorithm, moves, steps);
    clock.advance(NS(advance));
    let Err(TryAcquireError::Rejected(rejection)) = limiter.try_acquire_n(n) else {
        return Ok(());
    };
    let retry = rejection.retry_after_nanos();
    prop_assert!(retry > 0);
    prop_assert_eq!(rejection.limit(), limiter.capacity());
    let (on_time, clock, _) = replay(algorithm, moves, steps);
    clock.advance(NS(advance + retry));
    prop_assert!(
        on_time.try_acquire_n(n).is_ok(),
        "refused at retry_after {}",
        retry
    );
    let (early, clock, _) = replay(algorithm, moves, steps);
    clock.advance(NS(advance + retry - 1));
    prop_assert!(
        early.try_acquire_n(n).is_err(),
        "admitted before retry_after {}",
        retry
    );
    Ok(())
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0u64..30, 0u32..6).prop_map(|(a, n)| Step::Take(a, n)),
            1 => (0u64..30, 0u32..12).prop_map(|(a, n)| Step::Charge(a, n)),
            1 => (1u32..5, 1u64..20).prop_map(|(to, w)| Step::Change(to, w)),
            2 => (0u64..30, 0u32..6).prop_map(|(a, n)| Step::Hold(a, n)),
            2 => (0u64..10, any::<usize>()).prop_map(|(a, w)| Step::Refund(a, w)),
        ],
        1..30,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window(limit in 1u32..5, w in 1u64..20, steps in steps(), then in (0u64..10, 0u32..5)) {
        let algorithm = Algorithm::FixedWindow { limit, window: NS(w) };
        check(algorithm, Moves::Both, &steps, then)?;
    }

    #[test]
    fn sliding_counter(limit in 1u32..5, w in 1u64..20, steps in steps(), then in (0u64..10, 0u32..5)) {
        let algorithm = Algorithm::SlidingCounter { limit, window: NS(w) };
        check(algorithm, Moves::Both, &steps, then)?;
    }

    #[test]
    fn token_bucket(burst in 1u32..5, permits in 1u32..4, w in 1u64..20, steps in steps(),
                    then in (0u64..10, 0u32..5)) {
        let algorithm = Algorithm::TokenBucket { rate: Rate::new(permits, NS(w)), burst };
        check(algorithm, Moves::Both, &steps, then)?;
    }

    /// Window changes only, or limit changes only: a limit lowered together with a shortened
    /// window can leave a rejection's retry_after short (documented on the sliding window's
    /// "Lowering": the older, unchecked tickets are not read by a rejection).
    #[test]
    fn sliding_window(limit in 1u32..5, w in 1u64..20, steps in steps(), then in (0u64..10, 0u32..5),
                      window_only in any::<bool>()) {
        let algorithm = Algorithm::SlidingWindow { limit, window: NS(w) };
        let moves = if window_only { Moves::Window } else { Moves::Limit };
        check(algorithm, moves, &steps, then)?;
    }
}
