//! `charge`: usage recorded after the fact, without the limit check. Per algorithm on a
//! `ManualClock`: the debt refuses later calls exactly until the time the algorithm says, then
//! admits; what a charge returns; the bounds where counts saturate. Then the keyed limiter's cell
//! lifecycle (new keys, the key cap, reset, eviction, reconfiguration), a queued waiter that a
//! charge delays but does not starve, and a proptest of charges mixed with admissions against the
//! sequential reference models of `tests/common/models.rs`.

mod common;

use common::all_algorithms;
use common::models::{AnyModel, Model};
use proptest::prelude::*;
use std::time::Duration;
use turnstile::{
    Algorithm, KeyOverflow, KeyedLimiter, ManualClock, Rate, RateLimiter, TokioClock,
    TryAcquireError,
};

const MS: Duration = Duration::from_millis(1);

fn manual(algorithm: Algorithm) -> (RateLimiter<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (
        RateLimiter::with_clock(algorithm, clock.clone()).unwrap(),
        clock,
    )
}

/// The rejection's retry-after, panicking on anything else.
fn retry_after<T: std::fmt::Debug>(outcome: Result<T, TryAcquireError>) -> Duration {
    match outcome {
        Err(TryAcquireError::Rejected(r)) => r.retry_after(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Refused exactly until `clock` reaches `free_at`: one nanosecond before, then at it.
fn free_exactly_at(limiter: &RateLimiter<ManualClock>, clock: &ManualClock, free_at: Duration) {
    let now = clock.elapsed();
    assert_eq!(retry_after(limiter.try_acquire()), free_at - now);
    clock.set(free_at - Duration::from_nanos(1));
    assert_eq!(
        retry_after(limiter.try_acquire()),
        Duration::from_nanos(1),
        "admitted before the debt passed"
    );
    clock.set(free_at);
    limiter
        .try_acquire()
        .expect("refused after the debt passed");
}

#[test]
fn fixed_window_debt_lasts_until_the_window_ends() {
    let (limiter, clock) = manual(Algorithm::FixedWindow {
        limit: 10,
        window: 100 * MS,
    });
    clock.set(30 * MS);
    limiter.try_acquire_n(4).unwrap();
    let charged = limiter.charge(3).unwrap();
    assert_eq!(
        (charged.remaining(), charged.reset_after(), charged.at()),
        (3, 70 * MS, 30 * MS)
    );
    // 7 + 25 = 32 of 10: in debt, which the next window forgets.
    let charged = limiter.charge(25).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (0, 70 * MS));
    assert_eq!(limiter.stats().available, 0);
    free_exactly_at(&limiter, &clock, 100 * MS);
    assert_eq!(limiter.try_acquire_n(9).unwrap().remaining(), 0);
}

#[test]
fn fixed_window_count_saturates_at_u32_max() {
    let (limiter, clock) = manual(Algorithm::FixedWindow {
        limit: u32::MAX,
        window: 100 * MS,
    });
    limiter.charge(u32::MAX).unwrap();
    let charged = limiter.charge(2).unwrap();
    assert_eq!(charged.remaining(), 0);
    // Saturated, not wrapped (to 1: nearly empty), and not closed.
    assert_eq!(retry_after(limiter.try_acquire()), 100 * MS);
    clock.set(100 * MS);
    assert_eq!(limiter.try_acquire().unwrap().remaining(), u32::MAX - 1);
}

#[test]
fn token_bucket_debt_is_paid_at_the_rate() {
    // T = 10 ms, b = 4: capacity 40 ms.
    let (limiter, clock) = manual(Algorithm::TokenBucket {
        rate: Rate::per_second(100),
        burst: 4,
    });
    clock.set(1000 * MS);
    let charged = limiter.charge(1).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (3, 10 * MS));
    // tat = now + 10 + 60 ms: 70 ms ahead, 30 ms (3 tokens) beyond empty.
    let charged = limiter.charge(6).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (0, 70 * MS));
    // One token needs tat − now + T ≤ 40 ms: at now + 40 ms.
    free_exactly_at(&limiter, &clock, 1040 * MS);
    // A charge on an idle bucket starts from now, not from an old tat.
    clock.set(5000 * MS);
    let charged = limiter.charge(2).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (2, 20 * MS));
}

#[test]
fn token_bucket_debt_saturates_without_closing_the_limiter() {
    // The largest T and capacity the bucket accepts: n·T overflows u64 at once.
    let period = Duration::from_nanos(u64::MAX / 4);
    let (limiter, clock) = manual(Algorithm::TokenBucket {
        rate: Rate::new(1, period),
        burst: 1,
    });
    let charged = limiter.charge(u32::MAX).unwrap();
    assert_eq!(charged.remaining(), 0);
    // tat is held at 2^63 − 2 ns.
    assert_eq!(charged.reset_after(), Duration::from_nanos((1 << 63) - 2));
    let charged = limiter.charge(u32::MAX).unwrap();
    assert_eq!(charged.reset_after(), Duration::from_nanos((1 << 63) - 2));
    // In debt, not closed; a reconfiguration (the odd epoch: the word's top bit set) keeps
    // the word clear of the retired value too.
    assert!(matches!(
        limiter.try_acquire(),
        Err(TryAcquireError::Rejected(_))
    ));
    limiter
        .reconfigure(Algorithm::TokenBucket {
            rate: Rate::new(1, period),
            burst: 1,
        })
        .unwrap();
    clock.set(Duration::from_nanos(1 << 61));
    limiter.charge(u32::MAX).unwrap();
    assert!(matches!(
        limiter.try_acquire(),
        Err(TryAcquireError::Rejected(_))
    ));
    assert!(!limiter.is_closed());
}

#[test]
fn token_bucket_debt_survives_a_reconfiguration_scaled() {
    let (limiter, clock) = manual(Algorithm::TokenBucket {
        rate: Rate::per_second(100),
        burst: 4,
    });
    // 80 ms ahead: 40 ms beyond empty.
    limiter.charge(8).unwrap();
    // The same rate, twice the burst: the debt (80 ms of a 40 ms capacity) scales to 160 ms of
    // an 80 ms capacity, so one token is 90 ms away, not the 50 ms a clamp to "empty" gives.
    limiter
        .reconfigure(Algorithm::TokenBucket {
            rate: Rate::per_second(100),
            burst: 8,
        })
        .unwrap();
    free_exactly_at(&limiter, &clock, 90 * MS);
}

#[test]
fn sliding_counter_debt_fades_over_the_next_window() {
    let (limiter, clock) = manual(Algorithm::SlidingCounter {
        limit: 10,
        window: 100 * MS,
    });
    clock.set(50 * MS);
    let charged = limiter.charge(20).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (0, 150 * MS));
    // In the next window prev = 20 weighs 20·(100 − e)/100; one permit fits once that is ≤ 9,
    // at e = 55 ms.
    free_exactly_at(&limiter, &clock, 155 * MS);
}

#[test]
fn sliding_counter_count_saturates_at_u32_max() {
    let (limiter, clock) = manual(Algorithm::SlidingCounter {
        limit: 3,
        window: 100 * MS,
    });
    limiter.charge(u32::MAX).unwrap();
    // Saturated, not wrapped to 1 (which would leave 2 permits).
    assert_eq!(limiter.charge(2).unwrap().remaining(), 0);
    assert!(limiter.try_acquire().is_err());
    // The previous window still weighs u32::MAX·(W − e)/W: one permit fits only in the window
    // after the next.
    clock.set(199 * MS);
    assert!(limiter.try_acquire().is_err());
    clock.set(200 * MS);
    assert_eq!(limiter.try_acquire().unwrap().remaining(), 2);
}

#[test]
fn sliding_window_charge_that_fits_is_an_admission() {
    let (limiter, clock) = manual(Algorithm::SlidingWindow {
        limit: 5,
        window: 100 * MS,
    });
    limiter.try_acquire_n(2).unwrap();
    clock.set(10 * MS);
    let charged = limiter.charge(3).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (0, 100 * MS));
    free_exactly_at(&limiter, &clock, 100 * MS);
}

#[test]
fn sliding_window_debt_keeps_the_newest_entries_of_the_log() {
    let (limiter, clock) = manual(Algorithm::SlidingWindow {
        limit: 4,
        window: 100 * MS,
    });
    for t in [0, 10, 20] {
        clock.set(t * MS);
        limiter.try_acquire().unwrap();
    }
    // The log: 0, 10, 20, then 30, 30 charged: 5 entries, so the ring keeps 10, 20, 30, 30
    // (and the dropped 0 expires before all of them anyway).
    clock.set(30 * MS);
    let charged = limiter.charge(2).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (0, 100 * MS));
    // One permit needs the oldest kept entry (10) gone: at 110 ms.
    free_exactly_at(&limiter, &clock, 110 * MS);
    // Now 20, 30, 30, 110: the next at 120 ms.
    assert_eq!(retry_after(limiter.try_acquire()), 10 * MS);
}

/// After the window was shortened the log is out of ticket order (an older admission outlives
/// newer ones): the charge keeps the latest expiries, not the newest tickets, or the admission
/// that outlives them would be forgotten.
#[test]
fn sliding_window_debt_keeps_the_latest_expiries_after_a_shorter_window() {
    let (limiter, clock) = manual(Algorithm::SlidingWindow {
        limit: 2,
        window: 100 * MS,
    });
    limiter.try_acquire().unwrap(); // expires at 100 ms
    limiter
        .reconfigure(Algorithm::SlidingWindow {
            limit: 2,
            window: 10 * MS,
        })
        .unwrap();
    clock.set(MS);
    limiter.try_acquire().unwrap(); // expires at 11 ms
    clock.set(2 * MS);
    let charged = limiter.charge(1).unwrap(); // expires at 12 ms
    assert_eq!((charged.remaining(), charged.reset_after()), (0, 98 * MS));
    // At 12 ms only the first admission is live: one permit, not two.
    clock.set(12 * MS);
    assert!(limiter.try_acquire_n(2).is_err());
    limiter.try_acquire().unwrap();
    assert!(limiter.try_acquire().is_err(), "three live in 10 ms");
    clock.set(100 * MS);
    limiter.try_acquire().unwrap();
}

#[test]
fn sliding_window_debt_is_capped_at_one_window() {
    let (limiter, clock) = manual(Algorithm::SlidingWindow {
        limit: 3,
        window: 100 * MS,
    });
    limiter.try_acquire().unwrap();
    clock.set(40 * MS);
    // u32::MAX tickets cannot be remembered: the ring holds 3, all stamped now.
    let charged = limiter.charge(u32::MAX).unwrap();
    assert_eq!((charged.remaining(), charged.reset_after()), (0, 100 * MS));
    free_exactly_at(&limiter, &clock, 140 * MS);
    assert_eq!(limiter.try_acquire_n(2).unwrap().remaining(), 0);
}

#[test]
fn charge_zero_reports_and_records_nothing() {
    for algorithm in all_algorithms(3, 100 * MS) {
        let (limiter, _clock) = manual(algorithm);
        limiter.try_acquire_n(3).unwrap();
        let state = limiter.charge(0).unwrap();
        assert_eq!(state.remaining(), 0, "{algorithm:?}");
        let (fresh, _clock) = manual(algorithm);
        assert_eq!(fresh.charge(0).unwrap().remaining(), 3, "{algorithm:?}");
        assert_eq!(
            fresh.try_acquire_n(3).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
    }
}

#[test]
fn charge_on_a_closed_limiter_fails() {
    let (limiter, _clock) = manual(Algorithm::FixedWindow {
        limit: 3,
        window: 100 * MS,
    });
    limiter.close();
    assert_eq!(limiter.charge(1), Err(TryAcquireError::Closed));
}

#[test]
fn charges_are_not_counted_as_decisions() {
    let (limiter, _clock) = manual(Algorithm::FixedWindow {
        limit: 3,
        window: 100 * MS,
    });
    limiter.charge(5).unwrap();
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.available), (0, 0, 0));
}

fn keyed(
    algorithm: Algorithm,
    max_keys: usize,
    overflow: KeyOverflow,
) -> (KeyedLimiter<u32, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder(algorithm)
        .clock(clock.clone())
        .max_keys(max_keys)
        .overflow(overflow)
        .build()
        .unwrap();
    (limiter, clock)
}

#[test]
fn keyed_charge_makes_new_keys_and_keeps_them_apart() {
    for algorithm in all_algorithms(4, 100 * MS) {
        let (limiter, _clock) = keyed(algorithm, 100, KeyOverflow::Reject);
        assert_eq!(limiter.charge(&1, 0).unwrap().remaining(), 4);
        assert!(limiter.is_empty(), "a zero charge made a key");
        assert_eq!(
            limiter.charge(&1, 9).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert_eq!(limiter.len(), 1);
        assert!(limiter.try_acquire(&1).is_err(), "{algorithm:?}");
        assert_eq!(limiter.try_acquire_n(&2, 4).unwrap().remaining(), 0);
        let stats = limiter.stats();
        assert_eq!((stats.admitted, stats.rejected), (1, 1));
    }
}

#[test]
fn keyed_charge_at_the_cap_follows_the_overflow_policy() {
    for algorithm in all_algorithms(4, 100 * MS) {
        let (limiter, _clock) = keyed(algorithm, 1, KeyOverflow::Reject);
        limiter.try_acquire(&1).unwrap();
        assert_eq!(
            limiter.charge(&2, 3),
            Err(TryAcquireError::TooManyKeys { max_keys: 1 }),
            "{algorithm:?}"
        );
        assert_eq!(limiter.len(), 1);
        // The existing key is still charged.
        assert_eq!(
            limiter.charge(&1, 3).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );

        // Shared: a new key at the cap is charged to the overflow cell, shared by every such key.
        let (limiter, _clock) = keyed(algorithm, 1, KeyOverflow::Shared);
        limiter.try_acquire(&1).unwrap();
        assert_eq!(
            limiter.charge(&2, 3).unwrap().remaining(),
            1,
            "{algorithm:?}"
        );
        assert_eq!(
            limiter.try_acquire_n(&3, 2).map(|a| a.remaining()).ok(),
            None
        );
        assert_eq!(
            limiter.try_acquire(&3).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert_eq!(limiter.len(), 1);
    }
}

/// A charge is not counted in `stats()` (its docs), so a charge for a new key at the cap is
/// not an overflowed call either, whether the policy rejects it or charges the shared cell:
/// `overflowed` counts the calls that met the cap, as `admitted` and `rejected` count calls.
#[test]
fn keyed_charge_at_the_cap_is_not_counted_as_overflowed() {
    for overflow in [KeyOverflow::Reject, KeyOverflow::Shared] {
        let (limiter, _clock) = keyed(
            Algorithm::FixedWindow {
                limit: 4,
                window: 100 * MS,
            },
            1,
            overflow,
        );
        limiter.try_acquire(&1).unwrap();
        let charged = limiter.charge(&2, 3);
        assert_eq!(
            charged.is_ok(),
            overflow == KeyOverflow::Shared,
            "{overflow:?}: {charged:?}"
        );
        let stats = limiter.stats();
        assert_eq!(
            (stats.admitted, stats.rejected, stats.overflowed),
            (1, 0, 0),
            "{overflow:?}: a charge was counted"
        );
        // A call at the cap still is.
        let _ = limiter.try_acquire(&3);
        assert_eq!(limiter.stats().overflowed, 1, "{overflow:?}");
    }
}

#[test]
fn keyed_charge_at_the_cap_evicts_an_idle_key() {
    for algorithm in all_algorithms(4, 100 * MS) {
        let (limiter, clock) = keyed(algorithm, 1, KeyOverflow::Reject);
        limiter.try_acquire(&1).unwrap();
        clock.advance(1000 * MS);
        assert_eq!(
            limiter.charge(&2, 6).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert_eq!(limiter.len(), 1);
        assert!(limiter.try_acquire(&2).is_err(), "{algorithm:?}");
    }
}

#[test]
fn keyed_charge_after_reset_eviction_and_reconfiguration() {
    for algorithm in all_algorithms(4, 100 * MS) {
        let (limiter, clock) = keyed(algorithm, 100, KeyOverflow::Reject);
        // After a reset the key starts fresh, and the charge lands on its new cell.
        limiter.charge(&1, 9).unwrap();
        assert!(limiter.reset(&1));
        assert_eq!(
            limiter.charge(&1, 1).unwrap().remaining(),
            3,
            "{algorithm:?}"
        );
        assert_eq!(limiter.try_acquire_n(&1, 3).unwrap().remaining(), 0);

        // After the sweep evicted it: fresh again, and charged.
        clock.advance(1000 * MS);
        assert_eq!(limiter.sweep(), 1, "{algorithm:?}");
        assert!(limiter.is_empty());
        assert_eq!(
            limiter.charge(&1, 5).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert_eq!(limiter.len(), 1);
        assert!(limiter.try_acquire(&1).is_err());
        // Busy while in debt: the sweep keeps it.
        assert_eq!(limiter.sweep(), 0, "{algorithm:?}");

        // Under new parameters the debt still weighs, and charges use the new limit.
        clock.advance(1000 * MS);
        // (The exact sliding window's ring was built for 4: it takes a shorter window instead.)
        let (wider, limit) = match algorithm {
            Algorithm::TokenBucket { rate, .. } => (Algorithm::TokenBucket { rate, burst: 8 }, 8),
            Algorithm::FixedWindow { window, .. } => {
                (Algorithm::FixedWindow { limit: 8, window }, 8)
            }
            Algorithm::SlidingCounter { window, .. } => {
                (Algorithm::SlidingCounter { limit: 8, window }, 8)
            }
            Algorithm::SlidingWindow { limit, .. } => (
                Algorithm::SlidingWindow {
                    limit,
                    window: 50 * MS,
                },
                limit,
            ),
            other => panic!("{other:?}"),
        };
        limiter.reconfigure(wider).unwrap();
        assert_eq!(
            limiter.charge(&1, limit + 3).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert!(limiter.try_acquire(&1).is_err(), "{algorithm:?}");
        assert_eq!(limiter.try_acquire_n(&2, limit).unwrap().remaining(), 0);
    }
}

/// A waiter at the head of the queue, scheduled to retry when its permit frees, is delayed by a
/// charge landing meanwhile (it is not woken early and admitted over the debt), and is served
/// once the debt has passed.
#[tokio::test(start_paused = true)]
async fn a_queued_waiter_is_served_once_the_debt_has_passed() {
    let limiter = RateLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::per_second(100),
            burst: 1,
        },
        TokioClock::new(),
    )
    .unwrap();
    let start = tokio::time::Instant::now();
    limiter.try_acquire().unwrap();
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire().await.unwrap() })
    };
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    assert_eq!(limiter.stats().waiting, 1);
    // The head sleeps until 10 ms; a charge of 5 tokens moves the bucket's tat to 60 ms.
    tokio::time::sleep(5 * MS).await;
    let charged = limiter.charge(5).unwrap();
    assert_eq!(charged.reset_after(), 55 * MS);
    let admission = waiter.await.unwrap();
    assert_eq!(admission.at(), 60 * MS);
    assert_eq!(start.elapsed(), 60 * MS);
}

/// One step: advance the clock, then take n permits or charge n.
#[derive(Debug, Clone)]
enum Op {
    Acquire { advance: u64, n: u32 },
    Charge { advance: u64, n: u32 },
}

fn ops(limit: u32, max_advance: u64) -> impl Strategy<Value = Vec<Op>> {
    let advance =
        move || prop_oneof![3 => Just(0u64), 5 => 0..=max_advance, 1 => 0..=(4 * max_advance)];
    let op = prop_oneof![
        3 => (advance(), 0..=limit + 1).prop_map(|(advance, n)| Op::Acquire { advance, n }),
        2 => (advance(), 0..=2 * limit + 2).prop_map(|(advance, n)| Op::Charge { advance, n }),
    ];
    prop::collection::vec(op, 1..120)
}

/// Every decision, retry-after and remaining count, and every charge's remaining count and
/// time until full, match the model's.
fn matches_model(algorithm: Algorithm, ops: &[Op]) {
    let (limiter, clock) = manual(algorithm);
    let mut model = AnyModel::new(algorithm);
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Acquire { advance, n } => {
                clock.advance(Duration::from_nanos(advance));
                let now = clock.elapsed().as_nanos() as u64;
                let got = match limiter.try_acquire_n(n) {
                    Ok(a) => Some(Ok(u64::from(a.remaining()))),
                    Err(TryAcquireError::Rejected(r)) => Some(Err(r.retry_after_nanos())),
                    Err(TryAcquireError::InsufficientCapacity { .. }) => None,
                    Err(e) => panic!("unexpected {e:?}"),
                };
                assert_eq!(got, model.decide(now, n.into()), "op {i} {op:?} at {now}");
            }
            Op::Charge { advance, n } => {
                clock.advance(Duration::from_nanos(advance));
                let now = clock.elapsed().as_nanos() as u64;
                let charged = limiter.charge(n).unwrap();
                assert_eq!(charged.at_nanos(), now);
                let got = (
                    u64::from(charged.remaining()),
                    charged.reset_after().as_nanos() as u64,
                );
                assert_eq!(got, model.charge(now, n.into()), "op {i} {op:?} at {now}");
            }
        }
    }
}

/// Limit 2 in a ring of 4: two admissions at 0 and a charge at 1 ms; the log keeps its two
/// latest entries (one admission and the charge), as the charge table documents and Redis
/// trims. Raised to 4, two permits are free. The overdraw used to leave both admissions in the
/// ring beside the copy of one of them, so the raised limit counted four and refused.
#[test]
fn a_raise_after_an_overdraw_counts_each_logged_entry_once() {
    let clock = ManualClock::new();
    let sliding = |limit| Algorithm::SlidingWindow {
        limit,
        window: 10 * MS,
    };
    let limiter = RateLimiter::builder(sliding(2))
        .clock(clock.clone())
        .max_limit(4)
        .build()
        .unwrap();
    limiter.try_acquire_n(2).unwrap();
    clock.advance(MS);
    assert_eq!(limiter.charge(1).unwrap().remaining(), 0);
    limiter.reconfigure(sliding(4)).unwrap();
    assert_eq!(limiter.try_acquire_n(0).unwrap().remaining(), 2);
    assert!(limiter.try_acquire_n(3).is_err());
    assert_eq!(limiter.try_acquire_n(2).unwrap().remaining(), 0);
    // The kept admission leaves at 10 ms: one free until the charge leaves at 11 ms.
    clock.advance(9 * MS);
    assert_eq!(limiter.try_acquire_n(0).unwrap().remaining(), 1);
}

/// One step against a sliding window whose ring is larger than its limit (`max_limit`).
#[derive(Debug, Clone)]
enum Step {
    Acquire { advance: u64, n: u32 },
    Charge { advance: u64, n: u32 },
    Limit(u32),
}

/// The log with a limit that changes, as the charge table on `RateLimiter::charge` documents
/// it (and Redis keeps it): an admission adds its entries; a charge adds min(n, N) and the log
/// then keeps only its N latest entries (a charge of 0 records nothing).
struct ChangingLog {
    limit: u64,
    capacity: u64,
    window: u64,
    log: std::collections::VecDeque<u64>,
}

impl ChangingLog {
    fn live(&mut self, now: u64) -> u64 {
        while self.log.front().is_some_and(|&t| t + self.window <= now) {
            self.log.pop_front();
        }
        self.log.len() as u64
    }

    fn push(&mut self, now: u64, n: u64, keep: u64) {
        self.log.extend(std::iter::repeat_n(now, n as usize));
        while self.log.len() as u64 > keep {
            self.log.pop_front();
        }
    }

    fn decide(&mut self, now: u64, n: u64) -> Option<Result<u64, u64>> {
        if n > self.limit {
            return None;
        }
        let live = self.live(now);
        let want = n.max(1);
        if live + want > self.limit {
            let blocker = self.log[(live + want - self.limit - 1) as usize];
            return Some(Err(blocker + self.window - now));
        }
        self.push(now, n, self.capacity);
        Some(Ok(self.limit - live - n))
    }

    fn charge(&mut self, now: u64, n: u64) -> (u64, u64) {
        self.live(now);
        if n > 0 {
            self.push(now, n.min(self.limit), self.limit);
        }
        let reset = self.log.back().map_or(0, |&t| t + self.window - now);
        (self.limit.saturating_sub(self.log.len() as u64), reset)
    }
}

fn steps(capacity: u32, window: u64) -> impl Strategy<Value = Vec<Step>> {
    let advance = move || prop_oneof![3 => Just(0u64), 5 => 0..=window, 1 => 0..=(3 * window)];
    let step = prop_oneof![
        4 => (advance(), 0..=capacity).prop_map(|(advance, n)| Step::Acquire { advance, n }),
        3 => (advance(), 0..=2 * capacity).prop_map(|(advance, n)| Step::Charge { advance, n }),
        2 => (1..=capacity).prop_map(Step::Limit),
    ];
    prop::collection::vec(step, 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// A sliding window built with a `max_limit` above its limit, charged beyond its limit and
    /// then raised (or lowered), decides, counts and times everything as the log does. An
    /// overdraw claimed only N tickets and wrote the N latest entries into them, leaving older
    /// ones that a raised limit read again beside their copies (stricter than the log).
    #[test]
    fn a_larger_ring_after_overdraws_matches_the_exact_log((limit, capacity, window, steps) in
        (1u32..5, 0u32..4, 1u64..30).prop_flat_map(|(limit, extra, window)| {
            (Just(limit), Just(limit + extra), Just(window), steps(limit + extra, window))
        }))
    {
        let clock = ManualClock::new();
        let sliding = |limit| Algorithm::SlidingWindow { limit, window: Duration::from_nanos(window) };
        let limiter = RateLimiter::builder(sliding(limit))
            .clock(clock.clone())
            .max_limit(capacity)
            .build()
            .unwrap();
        let mut model = ChangingLog {
            limit: limit.into(),
            capacity: capacity.into(),
            window,
            log: Default::default(),
        };
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Step::Acquire { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    let now = clock.elapsed().as_nanos() as u64;
                    let got = match limiter.try_acquire_n(n) {
                        Ok(a) => Some(Ok(u64::from(a.remaining()))),
                        Err(TryAcquireError::Rejected(r)) => Some(Err(r.retry_after_nanos())),
                        Err(TryAcquireError::InsufficientCapacity { .. }) => None,
                        Err(e) => panic!("unexpected {e:?}"),
                    };
                    prop_assert_eq!(got, model.decide(now, n.into()), "step {} {:?} at {}", i, step, now);
                }
                Step::Charge { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    let now = clock.elapsed().as_nanos() as u64;
                    let charged = limiter.charge(n).unwrap();
                    let got = (
                        u64::from(charged.remaining()),
                        charged.reset_after().as_nanos() as u64,
                    );
                    prop_assert_eq!(got, model.charge(now, n.into()), "step {} {:?} at {}", i, step, now);
                }
                Step::Limit(to) => {
                    limiter.reconfigure(sliding(to)).unwrap();
                    model.limit = to.into();
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_charges_match_the_model((limit, window, ops) in (1u32..8, 1u64..40)
        .prop_flat_map(|(l, w)| (Just(l), Just(w), ops(l, w)))) {
        matches_model(Algorithm::FixedWindow { limit, window: Duration::from_nanos(window) }, &ops);
    }

    #[test]
    fn sliding_window_charges_match_the_model((limit, window, ops) in (1u32..8, 1u64..40)
        .prop_flat_map(|(l, w)| (Just(l), Just(w), ops(l, w)))) {
        matches_model(Algorithm::SlidingWindow { limit, window: Duration::from_nanos(window) }, &ops);
    }

    #[test]
    fn sliding_counter_charges_match_the_model((limit, window, ops) in (1u32..8, 1u64..40)
        .prop_flat_map(|(l, w)| (Just(l), Just(w), ops(l, w)))) {
        matches_model(Algorithm::SlidingCounter { limit, window: Duration::from_nanos(window) }, &ops);
    }

    #[test]
    fn token_bucket_charges_match_the_model((burst, permits, period, ops) in (1u32..8, 1u32..5, 1u64..60)
        .prop_flat_map(|(b, p, t)| (Just(b), Just(p), Just(t), ops(b, t)))) {
        matches_model(
            Algorithm::TokenBucket { rate: Rate::new(permits, Duration::from_nanos(period)), burst },
            &ops,
        );
    }
}

/// Real threads on a still clock, each mixing single-permit admissions with charges of 1 to 3:
/// no admission over the limit, and no update lost either way (what is left at the end is the
/// limit minus everything admitted and charged). The exact sliding window's overdraws race
/// claims that are between their CAS and their slot writes.
#[test]
fn threads_mixing_charges_and_admissions_lose_nothing() {
    const LIMIT: u32 = 64;
    for algorithm in all_algorithms(LIMIT, Duration::from_secs(3600)) {
        let (limiter, _clock) = manual(algorithm);
        let totals: Vec<(u64, u64)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let limiter = limiter.clone();
                    s.spawn(move || {
                        let (mut admitted, mut charged) = (0, 0);
                        for i in 0..300u64 {
                            if (i + t) % 4 == 0 {
                                let n = 1 + (i % 3) as u32;
                                limiter.charge(n).unwrap();
                                charged += u64::from(n);
                            } else if limiter.try_acquire().is_ok() {
                                admitted += 1;
                            }
                        }
                        (admitted, charged)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let admitted: u64 = totals.iter().map(|t| t.0).sum();
        let charged: u64 = totals.iter().map(|t| t.1).sum();
        assert!(
            admitted <= u64::from(LIMIT),
            "{algorithm:?}: {admitted} admitted"
        );
        let left = u64::from(LIMIT).saturating_sub(admitted + charged);
        assert_eq!(
            u64::from(limiter.charge(0).unwrap().remaining()),
            left,
            "{algorithm:?}: {admitted} admitted, {charged} charged"
        );
    }
}
