//! A call refused because others wait first gets a retry-after that is a lower bound: it is never
//! admitted sooner, once the waiters ahead have taken their permits (`Rejection::retry_after`).
//!
//! Each case builds a history of admissions on a limiter driven by a `ManualClock`, queues one to
//! three waiters behind it (their futures polled once by hand, so they hold their places), and then
//! refuses a newcomer. A twin limiter on a clock of its own replays the same history and then serves
//! the same waiters in arrival order, each at the earliest instant its algorithm admits it (what
//! the queue does), and last the newcomer: the time the twin needs for that is when the newcomer
//! could be admitted at the earliest, and the refusal's retry-after must not exceed it.
//!
//! The same for a keyed limiter, whose queue is per key.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
#[cfg(feature = "keyed")]
use turnstile::KeyedLimiter;
use turnstile::{Algorithm, ManualClock, Rate, RateLimiter, TryAcquireError};

type Waiting<'a> =
    Pin<Box<dyn Future<Output = Result<turnstile::Admission, turnstile::AcquireError>> + 'a>>;

/// One of the four algorithms at `limit` per `window_ms`.
fn algorithm(which: u8, limit: u32, window_ms: u64) -> Algorithm {
    let window = Duration::from_millis(window_ms);
    match which {
        0 => Algorithm::FixedWindow { limit, window },
        1 => Algorithm::SlidingWindow { limit, window },
        2 => Algorithm::SlidingCounter { limit, window },
        _ => Algorithm::TokenBucket {
            rate: Rate::new(limit, window),
            burst: limit,
        },
    }
}

/// Polls once with a waker that does nothing: the future either completes at once or holds its
/// place in the queue.
fn poll_once(
    future: &mut Waiting<'_>,
) -> Poll<Result<turnstile::Admission, turnstile::AcquireError>> {
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

/// How long the twin takes, from now, to admit each of `sizes` in order at the earliest instant
/// its algorithm allows (a refusal with no queue is exact), then `n`.
fn earliest(
    mut try_n: impl FnMut(u32) -> Result<(), u64>,
    clock: &ManualClock,
    sizes: &[u32],
    n: u32,
) -> u64 {
    let mut waited = 0u64;
    // A probe (0 permits) asks when one permit would be admitted.
    for &k in sizes.iter().chain(std::iter::once(&n.max(1))) {
        let mut rounds = 0;
        loop {
            match try_n(k) {
                Ok(()) => break,
                Err(after) => {
                    assert!(after > 0, "a refusal without a queue says when");
                    clock.advance(Duration::from_nanos(after));
                    waited += after;
                }
            }
            rounds += 1;
            assert!(rounds < 64, "{k} permits never admitted");
        }
    }
    waited
}

fn retry_after<T>(outcome: Result<T, TryAcquireError>) -> Option<u64> {
    match outcome {
        Ok(_) => None,
        Err(TryAcquireError::Rejected(r)) => Some(r.retry_after_nanos()),
        Err(other) => panic!("unexpected {other:?}"),
    }
}

/// A case: algorithm, limit, window, a history of (ms advanced, permits), the waiters' sizes, the
/// ms advanced before they queue, the newcomer's permits.
type Case = (u8, u32, u64, Vec<(u64, u32)>, Vec<u32>, u64, u32);

fn cases() -> impl Strategy<Value = Case> {
    (
        0u8..4,
        1u32..=6,
        prop::sample::select(vec![100u64, 250, 1000]),
    )
        .prop_flat_map(|(which, limit, window)| {
            (
                Just(which),
                Just(limit),
                Just(window),
                prop::collection::vec((0u64..=window, 1u32..=limit), 0..8),
                prop::collection::vec(1u32..=limit, 1..=3),
                0u64..=window / 2,
                0u32..=limit,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn a_refusal_behind_waiters_is_never_later_than_the_earliest_admission(case in cases()) {
        let (which, limit, window, history, waiters, pause, n) = case;
        let algorithm = algorithm(which, limit, window);
        let (clock, twin_clock) = (ManualClock::new(), ManualClock::new());
        let limiter = RateLimiter::with_clock(algorithm, clock.clone()).unwrap();
        let twin = RateLimiter::with_clock(algorithm, twin_clock.clone()).unwrap();
        for &(ms, k) in &history {
            clock.advance(Duration::from_millis(ms));
            twin_clock.advance(Duration::from_millis(ms));
            prop_assert_eq!(limiter.try_acquire_n(k).is_ok(), twin.try_acquire_n(k).is_ok());
        }
        clock.advance(Duration::from_millis(pause));
        twin_clock.advance(Duration::from_millis(pause));
        let mut queued = Vec::new();
        let mut held: Vec<Waiting<'_>> = Vec::new();
        for &k in &waiters {
            let mut future: Waiting<'_> = Box::pin(limiter.acquire_n(k));
            match poll_once(&mut future) {
                Poll::Ready(Ok(_)) => prop_assert!(twin.try_acquire_n(k).is_ok()),
                Poll::Ready(Err(e)) => panic!("waiter of {k}: {e:?}"),
                Poll::Pending => {
                    queued.push(k);
                    held.push(future);
                }
            }
        }
        let Some(bound) = retry_after(limiter.try_acquire_n(n)) else {
            // Admitted: nobody waits, or a probe found room; nothing to bound.
            prop_assert!(queued.is_empty() || n == 0);
            return Ok(());
        };
        let earliest = earliest(|k| twin.try_acquire_n(k).map(drop).map_err(|e| retry_after::<()>(Err(e)).unwrap()), &twin_clock, &queued, n);
        prop_assert!(
            bound <= earliest,
            "{algorithm:?}: told {bound} ns, admissible after {earliest} ns (waiters {queued:?}, n {n})"
        );
        drop(held);
    }
}

#[cfg(feature = "keyed")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn a_keyed_refusal_behind_waiters_is_never_later_than_the_earliest_admission(case in cases()) {
        let (which, limit, window, history, waiters, pause, n) = case;
        let algorithm = algorithm(which, limit, window);
        let (clock, twin_clock) = (ManualClock::new(), ManualClock::new());
        let limiter = KeyedLimiter::<u32, _>::with_clock(algorithm, clock.clone()).unwrap();
        let twin = RateLimiter::with_clock(algorithm, twin_clock.clone()).unwrap();
        let (key, other) = (7u32, 8u32);
        for &(ms, k) in &history {
            clock.advance(Duration::from_millis(ms));
            twin_clock.advance(Duration::from_millis(ms));
            prop_assert_eq!(limiter.try_acquire_n(&key, k).is_ok(), twin.try_acquire_n(k).is_ok());
            // Another key's traffic changes nothing for this one.
            let _ = limiter.try_acquire_n(&other, k);
        }
        clock.advance(Duration::from_millis(pause));
        twin_clock.advance(Duration::from_millis(pause));
        let mut queued = Vec::new();
        let mut held: Vec<Waiting<'_>> = Vec::new();
        for &k in &waiters {
            let mut future: Waiting<'_> = Box::pin(limiter.acquire_n(&key, k));
            match poll_once(&mut future) {
                Poll::Ready(Ok(_)) => prop_assert!(twin.try_acquire_n(k).is_ok()),
                Poll::Ready(Err(e)) => panic!("waiter of {k}: {e:?}"),
                Poll::Pending => {
                    queued.push(k);
                    held.push(future);
                }
            }
        }
        let Some(bound) = retry_after(limiter.try_acquire_n(&key, n)) else {
            prop_assert!(queued.is_empty() || n == 0);
            return Ok(());
        };
        let earliest = earliest(|k| twin.try_acquire_n(k).map(drop).map_err(|e| retry_after::<()>(Err(e)).unwrap()), &twin_clock, &queued, n);
        prop_assert!(
            bound <= earliest,
            "{algorithm:?}: told {bound} ns, admissible after {earliest} ns (waiters {queued:?}, n {n})"
        );
        drop(held);
    }
}
