//! Waiting: `acquire().await` and `acquire_blocking` on rate and concurrency limiters.
//!
//! Rate-limiter waits run on tokio's paused time with a `TokioClock`, so a head waiter's timer and
//! the limiter's clock agree to the nanosecond and "wakes exactly when its slot frees" can be
//! asserted with `==` (for waits in whole milliseconds: tokio's timer rounds the others up, as
//! `under_paused_time_a_head_is_admitted_on_tokios_millisecond_after_its_deadline` pins).
//! Concurrency waits need no time at all. Only the blocking tests use real threads, because
//! blocking is what they test.
//!
//! Last, calls that fail or serve several waiters at once (close, eviction, a new limit) must wake
//! every one of them even when one `Waker` panics; those tests poll by hand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
#[cfg(feature = "keyed")]
use turnstile::KeyedLimiter;
use turnstile::{
    AcquireError, Algorithm, ConcurrencyLimiter, QueueOrder, Rate, RateLimiter, TokioClock,
    TryAcquireError, TryPermitError,
};

#[path = "common/wakers.rs"]
mod wakers;
use wakers::{counting, must_panic, panicky, poll_with};

const MS: Duration = Duration::from_millis(1);

/// Lets every spawned task run until it blocks (on a current-thread runtime).
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

fn bucket(rate: Rate, burst: u32) -> RateLimiter<TokioClock> {
    RateLimiter::with_clock(Algorithm::TokenBucket { rate, burst }, TokioClock::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_thousand_waiters_are_served_in_arrival_order_exactly_on_time() {
    let limiter = bucket(Rate::per_second(1000), 1);
    let start = Instant::now();
    limiter.try_acquire().unwrap(); // the bucket is now empty: every waiter queues
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..1000u64 {
        let (limiter, order) = (limiter.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let admission = limiter.acquire().await.unwrap();
            order
                .lock()
                .unwrap()
                .push((i, admission.at(), start.elapsed()));
        }));
        settle().await; // task i is queued before task i + 1 is spawned
    }
    assert_eq!(limiter.stats().waiting, 1000);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    for (k, &(i, at, woke)) in order.iter().enumerate() {
        assert_eq!(i, k as u64, "served out of order");
        let slot = MS * (k as u32 + 1);
        assert_eq!(at, slot, "admission {k} not at its slot");
        assert_eq!(woke, slot, "waiter {k} woke late or early");
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.admitted, stats.waiting, stats.queued_permits),
        (1001, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn every_algorithm_wakes_its_head_exactly_when_the_slot_frees() {
    let w = Duration::from_secs(1);
    // (algorithm, the time the second acquire must return)
    let cases = [
        (
            Algorithm::FixedWindow {
                limit: 1,
                window: w,
            },
            w,
        ),
        (
            Algorithm::SlidingWindow {
                limit: 1,
                window: w,
            },
            w + MS * 250,
        ),
        (
            Algorithm::TokenBucket {
                rate: Rate::per_second(4),
                burst: 1,
            },
            MS * 500,
        ),
        // Window 0 is full; in window 1 the previous count (1) still weighs (W − e)/W > 0, so
        // the first fit is the start of window 2.
        (
            Algorithm::SlidingCounter {
                limit: 1,
                window: w,
            },
            w * 2,
        ),
    ];
    for (algorithm, expected) in cases {
        let limiter = RateLimiter::with_clock(algorithm, TokioClock::new()).unwrap();
        let start = Instant::now();
        tokio::time::sleep(MS * 250).await;
        limiter.acquire().await.unwrap();
        let admission = limiter.acquire().await.unwrap();
        assert_eq!(start.elapsed(), expected, "{algorithm:?}");
        assert_eq!(admission.at(), expected, "{algorithm:?}");
    }
}

/// Paused time moves in tokio's timer steps: whole milliseconds, from the millisecond the clock
/// is in to the first one at or after the sleep's deadline. A head waiting 1.0005 s is admitted,
/// and reads its `TokioClock`, at 1.001 s; off the millisecond grid (0.4 ms in) the part of a
/// millisecond rides along, so a wait of 1.0005 s from 0.4 ms ends at 1.0014 s, not 1.0009 s.
/// The limiter sleeps for exactly its `retry_after`: the rounding is the timer's.
#[tokio::test(start_paused = true)]
async fn under_paused_time_a_head_is_admitted_on_tokios_millisecond_after_its_deadline() {
    let wait = Duration::from_micros(1_000_500);
    let limiter = bucket(Rate::new(1, wait), 1);
    let start = Instant::now();
    limiter.try_acquire().unwrap();
    match limiter.try_acquire() {
        Err(TryAcquireError::Rejected(r)) => assert_eq!(r.retry_after(), wait),
        other => panic!("expected a rejection, got {other:?}"),
    }
    let admission = limiter.acquire().await.unwrap();
    assert_eq!(admission.at(), Duration::from_millis(1001));
    assert_eq!(start.elapsed(), Duration::from_millis(1001));

    let limiter = bucket(Rate::new(1, wait), 1);
    let start = Instant::now(); // 1.001 s: on the grid
    tokio::time::advance(Duration::from_micros(400)).await;
    let first = limiter.try_acquire().unwrap();
    assert_eq!(first.at(), Duration::from_micros(400));
    let admission = limiter.acquire().await.unwrap();
    assert_eq!(admission.at(), Duration::from_micros(1_001_400));
    assert_eq!(start.elapsed(), Duration::from_micros(1_001_400));
}

#[tokio::test(start_paused = true)]
async fn a_large_request_at_the_head_is_not_overtaken() {
    let limiter = bucket(Rate::per_second(10), 5);
    let start = Instant::now();
    limiter.try_acquire_n(5).unwrap();
    let big = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(5).await.map(|_| start.elapsed()) })
    };
    settle().await;
    let small = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(1).await.map(|_| start.elapsed()) })
    };
    // One permit accrues after 100 ms: enough for `small`, but `big` is first in line.
    assert_eq!(big.await.unwrap().unwrap(), MS * 500);
    assert_eq!(small.await.unwrap().unwrap(), MS * 600);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_does_not_barge_past_waiters() {
    let limiter = ConcurrencyLimiter::new(2).unwrap();
    let held = limiter.try_acquire_n(2).unwrap();
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(limiter.acquire_owned(2))
    };
    settle().await;
    drop(held);
    // Two permits are free for an instant, but the queued waiter gets them, not a barger.
    assert!(matches!(
        limiter.try_acquire(),
        Err(TryPermitError::NoPermits { .. })
    ));
    let permit = waiter.await.unwrap().unwrap();
    assert_eq!(permit.permits(), 2);

    // Rate limiter: while a waiter is queued, try_acquire is rejected.
    let rate = bucket(Rate::per_second(10), 1);
    rate.try_acquire().unwrap();
    let queued = {
        let rate = rate.clone();
        tokio::spawn(async move { rate.acquire().await.map(|a| a.at()) })
    };
    settle().await;
    assert!(matches!(
        rate.try_acquire(),
        Err(TryAcquireError::Rejected(_))
    ));
    assert_eq!(queued.await.unwrap().unwrap(), MS * 100);
}

/// The four algorithms, each allowing 3 permits (per second, or a burst of 3 at 10 a second).
fn three_of_each() -> [Algorithm; 4] {
    let window = Duration::from_secs(1);
    [
        Algorithm::FixedWindow { limit: 3, window },
        Algorithm::SlidingWindow { limit: 3, window },
        Algorithm::SlidingCounter { limit: 3, window },
        Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 3,
        },
    ]
}

/// A `try_acquire` held back by queued waiters (no barging) says when it could be admitted
/// behind them: once the algorithm could admit the queue's permits and its own together. It
/// said 0 ("retry now") whenever the algorithm alone had one permit, so a caller that retried
/// on it spun until the queue drained.
#[tokio::test(start_paused = true)]
async fn a_rejection_behind_waiters_counts_their_permits() {
    for algorithm in three_of_each() {
        let limiter = RateLimiter::with_clock(algorithm, TokioClock::new()).unwrap();
        // The same history without the waiter: what the algorithm says for 2 + 1 permits.
        let alone = RateLimiter::with_clock(algorithm, TokioClock::new()).unwrap();
        limiter.try_acquire_n(2).unwrap();
        alone.try_acquire_n(2).unwrap();
        let expected = alone
            .try_acquire_n(3)
            .unwrap_err()
            .rejection()
            .unwrap()
            .retry_after();
        // One permit is free, but a waiter for two is queued first.
        assert!(alone.try_acquire().is_ok(), "{algorithm:?}");
        let waiter = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire_n(2).await.map(|a| a.at()) })
        };
        settle().await;
        assert_eq!(limiter.stats().waiting, 1, "{algorithm:?}");
        let behind = |n| {
            limiter
                .try_acquire_n(n)
                .unwrap_err()
                .rejection()
                .copied()
                .unwrap_or_else(|| panic!("{algorithm:?}: not a rejection"))
        };
        let rejection = behind(1);
        assert_eq!(rejection.retry_after(), expected, "{algorithm:?}");
        assert_eq!(rejection.limit(), 3, "{algorithm:?}");
        // A probe needs one permit behind the queue, as a call for one does.
        assert_eq!(behind(0).retry_after(), expected, "{algorithm:?}");
        let concrete = match algorithm {
            // The next window: 2 + 1 never fit in this one.
            Algorithm::FixedWindow { .. } | Algorithm::SlidingWindow { .. } => {
                Some(Duration::from_secs(1))
            }
            // Two more tokens, at 100 ms each.
            Algorithm::TokenBucket { .. } => Some(MS * 200),
            _ => None,
        };
        if let Some(concrete) = concrete {
            assert_eq!(expected, concrete, "{algorithm:?}");
        }
        assert!(expected > Duration::ZERO, "{algorithm:?}");
        waiter.await.unwrap().unwrap();
    }
}

/// Behind a waiter about to be served (the permits it waits for free, its timer not run yet), a
/// call whose permits and the waiter's exceed the limit is told what more than the limit in a
/// row needs, not 0: the next window, or a window's length for the sliding window (the waiter
/// takes what is free now first).
#[tokio::test(start_paused = true)]
async fn behind_a_waiter_about_to_be_served_a_call_beyond_the_limit_waits_for_the_next_window() {
    let window = Duration::from_secs(1);
    for algorithm in [
        Algorithm::FixedWindow { limit: 2, window },
        Algorithm::SlidingWindow { limit: 2, window },
    ] {
        // Permits free half a millisecond into a millisecond: timers end at the next one.
        tokio::time::advance(Duration::from_micros(500)).await;
        let limiter = RateLimiter::with_clock(algorithm, TokioClock::new()).unwrap();
        limiter.try_acquire_n(2).unwrap();
        let waiter = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire_n(2).await.map(|a| a.at()) })
        };
        settle().await;
        tokio::time::advance(window).await;
        assert_eq!(
            limiter.stats().waiting,
            1,
            "{algorithm:?}: the waiter has not run"
        );
        let retry = limiter
            .try_acquire()
            .unwrap_err()
            .rejection()
            .unwrap()
            .retry_after();
        assert_eq!(retry, window, "{algorithm:?}");
        waiter.await.unwrap().unwrap();
        assert!(
            limiter.try_acquire().is_err(),
            "{algorithm:?}: the waiter took both"
        );
    }
}

/// The sliding counter weighs a window's admissions less as the next window goes by, so a call
/// admitted a window after the queue's can fit sooner than all of them would at once: its
/// retry-after behind the queue is then the start of the window after the head's, still a
/// lower bound of when it is admitted.
#[tokio::test(start_paused = true)]
async fn behind_waiters_a_sliding_counters_retry_after_stays_a_lower_bound() {
    let limiter = RateLimiter::with_clock(
        Algorithm::SlidingCounter {
            limit: 10,
            window: Duration::from_secs(1),
        },
        TokioClock::new(),
    )
    .unwrap();
    limiter.try_acquire_n(6).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    // 6 in the previous window, 4 in this one (which starts at 1 s).
    limiter.try_acquire_n(4).unwrap();
    let spawn = |n| {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(n).await.map(|a| a.at()) })
    };
    // 3 fit once the previous window weighs 3: halfway through this one.
    let head = spawn(3);
    settle().await;
    let retry = limiter
        .try_acquire_n(4)
        .unwrap_err()
        .rejection()
        .unwrap()
        .retry_after();
    let behind = spawn(4);
    settle().await;
    assert_eq!(head.await.unwrap().unwrap(), MS * 1500);
    // 4 more fit once the 7 of the window from 1 s weigh 6, a seventh into the next: at
    // 2.142… s. All 7 at once would fit only at 2.25 s, when this window's 4 weigh 3.
    let admitted = behind.await.unwrap().unwrap();
    assert!(admitted > MS * 2142 && admitted < MS * 2150, "{admitted:?}");
    assert_eq!(
        retry,
        Duration::from_secs(1),
        "the start of the window after the head's"
    );
    assert!(Duration::from_secs(1) + retry <= admitted);
}

/// What the queue takes is counted: a queued probe takes nothing, and beyond the capacity the
/// token bucket's refill (one permit a period) says when the rest fits.
#[tokio::test(start_paused = true)]
async fn a_rejection_behind_waiters_counts_what_they_take_even_beyond_the_capacity() {
    // 10 tokens a second, burst 5; 4 taken: 1 token left, one more every 100 ms.
    let limiter = bucket(Rate::per_second(10), 5);
    limiter.try_acquire_n(4).unwrap();
    let spawn = |n| {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(n).await.map(|a| a.at()) })
    };
    let two = spawn(2);
    settle().await;
    let probe = spawn(0);
    settle().await;
    assert_eq!(limiter.stats().waiting, 2);
    let retry = |n| {
        limiter
            .try_acquire_n(n)
            .unwrap_err()
            .rejection()
            .unwrap()
            .retry_after()
    };
    // 2 queued (the probe takes none) + 1: 2 more tokens.
    assert_eq!(retry(1), MS * 200);
    assert_eq!(retry(0), MS * 200);
    // 2 + 3: 4 more tokens.
    assert_eq!(retry(3), MS * 400);
    let three = spawn(3);
    settle().await;
    // 5 queued + 1 is beyond the burst of 5: the time 5 need (400 ms), and 100 ms more.
    assert_eq!(retry(1), MS * 500);
    assert_eq!(two.await.unwrap().unwrap(), MS * 100);
    // The probe waits for a token it does not take.
    assert_eq!(probe.await.unwrap().unwrap(), MS * 200);
    assert_eq!(three.await.unwrap().unwrap(), MS * 400);
}

/// Behind waiters holding several windows' worth, a window algorithm's retry-after counts the
/// windows they fill: it said one window, whatever the queue held, so a caller that retried on
/// it was refused again and again.
#[tokio::test(start_paused = true)]
async fn behind_several_windows_of_waiters_a_windows_retry_after_counts_them() {
    let window = Duration::from_secs(1);
    for algorithm in [
        Algorithm::FixedWindow { limit: 2, window },
        Algorithm::SlidingWindow { limit: 2, window },
        Algorithm::SlidingCounter { limit: 2, window },
    ] {
        let limiter = RateLimiter::with_clock(algorithm, TokioClock::new()).unwrap();
        let start = tokio::time::Instant::now();
        limiter.try_acquire_n(2).unwrap();
        let spawn = |n| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                limiter.acquire_n(n).await.unwrap();
                start.elapsed()
            })
        };
        let first = spawn(2);
        settle().await;
        let second = spawn(2);
        settle().await;
        let retry = limiter
            .try_acquire()
            .unwrap_err()
            .rejection()
            .unwrap()
            .retry_after();
        // 4 queued + 1: this window holds no more, the next two windows take 2 each at most
        // (this one has none free, which the bound cannot know, so it allows it one).
        assert_eq!(retry, 2 * window, "{algorithm:?}");
        let call = spawn(1);
        settle().await;
        let (first, second, call) = (
            first.await.unwrap(),
            second.await.unwrap(),
            call.await.unwrap(),
        );
        assert!(first < second && second < call, "{algorithm:?}");
        assert!(call >= retry, "{algorithm:?}: a lower bound ({call:?})");
    }
}

#[tokio::test(start_paused = true)]
async fn newest_first_serves_the_newest_and_evicts_the_oldest_when_full() {
    let limiter = ConcurrencyLimiter::builder(1)
        .queue_order(QueueOrder::NewestFirst)
        .queue_limit(2)
        .build()
        .unwrap();
    let held = limiter.try_acquire().unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let spawn = |name: &'static str| {
        let (limiter, served) = (limiter.clone(), Arc::clone(&served));
        tokio::spawn(async move {
            let outcome = limiter.acquire_owned(1).await.map(|permit| {
                served.lock().unwrap().push(name);
                tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    drop(permit);
                })
            });
            outcome.map(|_| ())
        })
    };
    let a = spawn("a");
    settle().await;
    let b = spawn("b");
    settle().await;
    let c = spawn("c"); // the queue (limit 2) is full: the oldest, a, fails
    settle().await;
    assert_eq!(
        a.await.unwrap().unwrap_err(),
        AcquireError::QueueFull {
            requested: 1,
            queue_limit: 2
        }
    );
    drop(held);
    b.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
    assert_eq!(*served.lock().unwrap(), ["c", "b"]);
    settle().await;
    assert_eq!(limiter.available(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_oldest_first_queue_fails_new_waiters_at_once() {
    let limiter = RateLimiter::builder(Algorithm::FixedWindow {
        limit: 5,
        window: Duration::from_secs(1),
    })
    .clock(TokioClock::new())
    .queue_limit(3)
    .build()
    .unwrap();
    limiter.try_acquire_n(5).unwrap();
    let spawn = |n| {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(n).await.map(|a| a.at()) })
    };
    let first = spawn(1);
    settle().await;
    let second = spawn(2); // 1 + 2 queued permits: exactly the limit, fits
    settle().await;
    assert_eq!(limiter.stats().queued_permits, 3);
    // One more permit would not fit: fails without waiting.
    let before = Instant::now();
    assert_eq!(
        limiter.acquire_n(1).await.unwrap_err(),
        AcquireError::QueueFull {
            requested: 1,
            queue_limit: 3
        }
    );
    assert_eq!(before.elapsed(), Duration::ZERO);
    // More than the queue could ever hold, even when empty:
    let small_queue = ConcurrencyLimiter::builder(10)
        .queue_limit(4)
        .build()
        .unwrap();
    let _all = small_queue.try_acquire_n(10).unwrap();
    assert!(matches!(
        small_queue.acquire_n(5).await,
        Err(AcquireError::QueueFull { requested: 5, .. })
    ));
    assert_eq!(first.await.unwrap().unwrap(), Duration::from_secs(1));
    assert_eq!(second.await.unwrap().unwrap(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn close_fails_every_waiter_and_every_later_call() {
    let limiter = bucket(Rate::per_minute(1), 1);
    limiter.try_acquire().unwrap();
    let waiters: Vec<JoinHandle<_>> = (0..3)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire().await })
        })
        .collect();
    settle().await;
    assert_eq!(limiter.stats().waiting, 3);
    limiter.close();
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap_err(), AcquireError::Closed);
    }
    assert_eq!(limiter.try_acquire().unwrap_err(), TryAcquireError::Closed);
    assert_eq!(limiter.acquire().await.unwrap_err(), AcquireError::Closed);
    assert_eq!(
        limiter.acquire_blocking().unwrap_err(),
        AcquireError::Closed
    );
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.waiting), (1, 6, 0));

    let permits = ConcurrencyLimiter::new(1).unwrap();
    let held = permits.try_acquire().unwrap();
    let waiter = tokio::spawn(permits.acquire_owned(1));
    settle().await;
    permits.close();
    assert_eq!(waiter.await.unwrap().unwrap_err(), AcquireError::Closed);
    drop(held); // a permit held across close is still given back
    assert_eq!(permits.available(), 1);
    assert_eq!(permits.try_acquire().unwrap_err(), TryPermitError::Closed);
}

/// A closed limiter says `Closed` to every call, before it looks at `n`: a request above the
/// limit is not told it could never fit (it could not be served at all). Both limiters, every
/// entry point. The concurrency limiter answered `InsufficientCapacity` there.
#[tokio::test(start_paused = true)]
async fn a_closed_limiter_says_closed_before_too_big() {
    let limiter = bucket(Rate::per_second(1), 2);
    limiter.close();
    assert_eq!(
        limiter.try_acquire_n(3).unwrap_err(),
        TryAcquireError::Closed
    );
    assert_eq!(
        limiter.acquire_n(3).await.unwrap_err(),
        AcquireError::Closed
    );
    assert_eq!(
        limiter.acquire_blocking_n(3).unwrap_err(),
        AcquireError::Closed
    );

    let permits = ConcurrencyLimiter::new(2).unwrap();
    permits.close();
    assert_eq!(
        permits.try_acquire_n(3).unwrap_err(),
        TryPermitError::Closed
    );
    assert_eq!(
        permits.try_acquire_owned(3).unwrap_err(),
        TryPermitError::Closed
    );
    assert_eq!(
        permits.acquire_n(3).await.unwrap_err(),
        AcquireError::Closed
    );
    assert_eq!(
        permits.acquire_owned(3).await.unwrap_err(),
        AcquireError::Closed
    );
    assert_eq!(
        permits.acquire_blocking_n(3).unwrap_err(),
        AcquireError::Closed
    );
    // And with others queued (the gate's `WAITERS` bit set too): still `Closed` first.
    let queued = ConcurrencyLimiter::new(1).unwrap();
    let held = queued.try_acquire().unwrap();
    let mut waiter = Box::pin(queued.acquire());
    assert!(poll_with(waiter.as_mut(), Waker::noop()).is_pending());
    queued.close();
    assert_eq!(queued.try_acquire_n(2).unwrap_err(), TryPermitError::Closed);
    drop((waiter, held));
}

#[tokio::test(start_paused = true)]
async fn acquire_zero_waits_for_a_permit_and_takes_nothing() {
    let limiter = bucket(Rate::per_second(10), 2);
    let start = Instant::now();
    limiter.try_acquire_n(2).unwrap();
    let probe = limiter.acquire_n(0).await.unwrap();
    assert_eq!(start.elapsed(), MS * 100);
    assert_eq!(probe.remaining(), 1);
    // It consumed nothing: the permit that freed is still there.
    assert_eq!(limiter.try_acquire().unwrap().remaining(), 0);

    let permits = ConcurrencyLimiter::new(1).unwrap();
    let held = permits.try_acquire().unwrap();
    let probe = tokio::spawn(permits.acquire_owned(0));
    settle().await;
    assert!(!probe.is_finished());
    drop(held);
    assert_eq!(probe.await.unwrap().unwrap().permits(), 0);
    assert_eq!(permits.available(), 1);
}

#[tokio::test(start_paused = true)]
async fn more_than_the_limit_fails_at_once_without_queueing() {
    let limiter = bucket(Rate::per_second(10), 3);
    assert_eq!(
        limiter.acquire_n(4).await.unwrap_err(),
        AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }
    );
    assert_eq!(
        limiter.acquire_blocking_n(4).unwrap_err(),
        AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }
    );
    let permits = ConcurrencyLimiter::new(3).unwrap();
    let _all = permits.try_acquire_n(3).unwrap(); // even while it is exhausted
    assert!(matches!(
        permits.acquire_n(4).await,
        Err(AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    ));
    assert_eq!(limiter.stats().waiting, 0);
    assert_eq!(permits.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_waiter_consumes_nothing_and_promotes_the_next() {
    let limiter = bucket(Rate::per_second(1), 1);
    let start = Instant::now();
    limiter.try_acquire().unwrap();
    let patient = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire().await.map(|a| a.at()) })
    };
    settle().await; // queued first
    let impatient = limiter.acquire_timeout(1, MS * 300).await;
    assert_eq!(impatient.unwrap_err(), AcquireError::Timeout);
    assert_eq!(start.elapsed(), MS * 300);
    assert_eq!(patient.await.unwrap().unwrap(), Duration::from_secs(1));
    // A head that times out hands the turn on: with NewestFirst the impatient one was the head.
    let newest = RateLimiter::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 1,
    })
    .clock(TokioClock::new())
    .queue_order(QueueOrder::NewestFirst)
    .build()
    .unwrap();
    let t0 = Instant::now();
    newest.try_acquire().unwrap();
    let older = {
        let newest = newest.clone();
        tokio::spawn(async move { newest.acquire().await.map(|_| t0.elapsed()) })
    };
    settle().await;
    assert_eq!(
        newest.acquire_timeout(1, MS * 300).await.unwrap_err(),
        AcquireError::Timeout
    );
    assert_eq!(older.await.unwrap().unwrap(), Duration::from_secs(1));
    let stats = newest.stats();
    assert_eq!((stats.admitted, stats.cancelled, stats.waiting), (2, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_future_frees_its_place() {
    let permits = ConcurrencyLimiter::builder(1)
        .queue_limit(1)
        .build()
        .unwrap();
    let held = permits.try_acquire().unwrap();
    let first = tokio::spawn(permits.acquire_owned(1));
    settle().await;
    assert!(matches!(
        permits.acquire_n(1).await,
        Err(AcquireError::QueueFull { .. })
    ));
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The aborted waiter's place is free again and it took nothing.
    let second = tokio::spawn(permits.acquire_owned(1));
    settle().await;
    assert_eq!(permits.stats().waiting, 1);
    drop(held);
    let permit = second.await.unwrap().unwrap();
    assert_eq!(permits.available(), 0);
    drop(permit);
    let stats = permits.stats();
    assert_eq!(
        (
            stats.admitted,
            stats.rejected,
            stats.cancelled,
            stats.available
        ),
        (2, 1, 1, 1)
    );
}

#[test]
fn blocking_waiters_exclude_each_other_and_all_get_through() {
    let limiter = ConcurrencyLimiter::new(3).unwrap();
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (limiter, inside, most) = (&limiter, &inside, &most);
            s.spawn(move || {
                for i in 0..200 {
                    let n = 1 + (t + i) % 3;
                    let permit = limiter.acquire_blocking_n(n as u32).unwrap();
                    let now = inside.fetch_add(n, Ordering::SeqCst) + n;
                    most.fetch_max(now, Ordering::SeqCst);
                    assert!(now <= 3, "{now} permits held at once");
                    std::thread::yield_now();
                    inside.fetch_sub(n, Ordering::SeqCst);
                    drop(permit);
                }
            });
        }
    });
    assert_eq!(most.load(Ordering::SeqCst), 3);
    let stats = limiter.stats();
    assert_eq!(
        (stats.admitted, stats.available, stats.waiting),
        (1600, 3, 0)
    );
}

#[test]
fn blocking_waiters_are_served_in_arrival_order() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let order = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for i in 0..8 {
            let (limiter, order) = (&limiter, &order);
            s.spawn(move || {
                let _permit = limiter.acquire_blocking().unwrap();
                order.lock().unwrap().push(i);
            });
            // Wait until thread i is queued before starting thread i + 1.
            while limiter.stats().waiting < i + 1 {
                std::thread::yield_now();
            }
        }
        drop(held);
    });
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

#[test]
fn blocking_rate_waits_sleep_until_the_slot_frees() {
    // Real time is the thing under test here: the head parks for the retry-after.
    let limiter = RateLimiter::with_clock(
        Algorithm::SlidingWindow {
            limit: 2,
            window: Duration::from_millis(50),
        },
        turnstile::MonotonicClock::new(),
    )
    .unwrap();
    let start = std::time::Instant::now();
    let times: Vec<Duration> = (0..6)
        .map(|_| limiter.acquire_blocking().unwrap().at())
        .collect();
    // Pairs 50 ms apart, and never early: at most 2 in any 50 ms.
    for i in 2..times.len() {
        assert!(
            times[i] - times[i - 2] >= Duration::from_millis(50),
            "{times:?}"
        );
    }
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "woke far too late"
    );
    assert_eq!(
        limiter.acquire_blocking_timeout(1, Duration::ZERO).err(),
        Some(AcquireError::Timeout)
    );
}

#[test]
fn blocking_timeout_on_a_concurrency_limiter_leaves_the_queue() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let start = std::time::Instant::now();
    assert_eq!(
        limiter
            .acquire_blocking_timeout(1, Duration::from_millis(20))
            .unwrap_err(),
        AcquireError::Timeout
    );
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(limiter.stats().waiting, 0);
    drop(held);
    assert!(limiter.try_acquire().is_ok());
}

/// A waker that closes its limiter when its last clone is dropped: a `close` that lands inside
/// a poll of an `acquire_timeout`, after the waiter's look and before the time limit is checked
/// (as a `close` on another thread can land at that moment).
struct CloseOnDrop(Box<dyn Fn() + Send + Sync>);

impl std::task::Wake for CloseOnDrop {
    fn wake(self: Arc<Self>) {}
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// An async `acquire_timeout` whose time limit passes just as the queue fails the waiter (a
/// `close` here) answers that failure, as `stats` counts it (rejected), not `Timeout` (which is
/// counted cancelled), as the blocking `acquire_blocking_timeout` does. The close lands in the
/// poll that finds the time up, after the waiter's look: the waiter's replaced waker closes the
/// limiter when the queue (or a timer) drops it.
#[tokio::test(start_paused = true)]
async fn an_acquire_timeout_failed_as_its_time_passes_answers_what_stats_count() {
    async fn check<T: std::fmt::Debug>(
        call: impl std::future::Future<Output = Result<T, AcquireError>>,
        close: Box<dyn Fn() + Send + Sync>,
        stats: impl Fn() -> (u64, u64),
    ) {
        let mut call = Box::pin(call);
        let closer = Waker::from(Arc::new(CloseOnDrop(close)));
        assert!(poll_with(call.as_mut(), &closer).is_pending());
        drop(closer); // the queue and the timers hold the only clones
        tokio::time::advance(10 * MS).await;
        let outcome = poll_with(call.as_mut(), Waker::noop());
        let (rejected, cancelled) = stats();
        match outcome {
            Poll::Ready(Err(AcquireError::Closed)) => assert_eq!((rejected, cancelled), (1, 0)),
            Poll::Ready(Err(AcquireError::Timeout)) => assert_eq!(
                (rejected, cancelled),
                (0, 1),
                "answered Timeout, counted rejected"
            ),
            other => panic!("{other:?}"),
        }
    }

    let permits = ConcurrencyLimiter::new(1).unwrap();
    let _held = permits.try_acquire().unwrap();
    let closing = permits.clone();
    check(
        permits.acquire_timeout(1, 10 * MS),
        Box::new(move || closing.close()),
        || (permits.stats().rejected, permits.stats().cancelled),
    )
    .await;

    let rate = bucket(Rate::per_second(1), 1);
    rate.try_acquire().unwrap();
    let closing = rate.clone();
    check(
        rate.acquire_timeout(1, 10 * MS),
        Box::new(move || closing.close()),
        || (rate.stats().rejected, rate.stats().cancelled),
    )
    .await;

    #[cfg(feature = "keyed")]
    {
        let keyed = turnstile::KeyedConcurrencyLimiter::<&str>::new(1).unwrap();
        let _held = keyed.try_acquire(&"k").unwrap();
        let closing = keyed.clone();
        check(
            keyed.acquire_timeout(&"k", 1, 10 * MS),
            Box::new(move || closing.close()),
            || (keyed.stats().rejected, keyed.stats().cancelled),
        )
        .await;

        let algorithm = Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 1,
        };
        let keyed = KeyedLimiter::with_clock(algorithm, TokioClock::new()).unwrap();
        keyed.try_acquire(&"k").unwrap();
        let closing = keyed.clone();
        check(
            keyed.acquire_timeout(&"k", 1, 10 * MS),
            Box::new(move || closing.close()),
            || (keyed.stats().rejected, keyed.stats().cancelled),
        )
        .await;
    }
}

/// A blocked head whose time limit passes hands its turn on: the waiter behind it, which the
/// free permits fit (but not the head's), is served then, without waiting for a release. Real
/// time is what is under test (the head's deadline).
#[test]
fn a_blocking_head_that_times_out_lets_the_next_waiter_in() {
    let limiter = ConcurrencyLimiter::new(3).unwrap();
    let held = limiter.try_acquire_n(2).unwrap();
    let queued = |n| {
        while limiter.stats().waiting < n {
            std::thread::yield_now();
        }
    };
    std::thread::scope(|s| {
        let head = s.spawn(|| {
            let start = std::time::Instant::now();
            let outcome = limiter
                .acquire_blocking_timeout(2, 50 * MS)
                .map(|p| p.permits());
            (outcome, start.elapsed())
        });
        queued(1);
        // A time limit only so that a lost hand-over fails instead of hanging (at its limit the
        // waiter looks again, finds itself the head, and is served: hence the time check).
        let behind = s.spawn(|| {
            let outcome = limiter
                .acquire_blocking_timeout(1, Duration::from_secs(10))
                .map(|p| p.permits());
            (outcome, std::time::Instant::now())
        });
        queued(2);
        let (outcome, waited) = head.join().unwrap();
        assert_eq!(outcome, Err(AcquireError::Timeout));
        assert!(waited >= 50 * MS, "woke early: {waited:?}");
        let left = std::time::Instant::now();
        // Served by the head's leaving alone (`held` is still held), at once.
        let (outcome, served) = behind.join().unwrap();
        assert_eq!(outcome, Ok(1));
        let late = served.saturating_duration_since(left);
        assert!(
            late < Duration::from_secs(5),
            "served {late:?} after the head left"
        );
    });
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.cancelled, stats.available), (0, 1, 1));
    drop(held);
    assert_eq!(limiter.available(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_and_blocking_waiters_share_one_queue() {
    let limiter = ConcurrencyLimiter::new(2).unwrap();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..4 {
        let (l, inside) = (limiter.clone(), Arc::clone(&in_flight));
        handles.push(tokio::task::spawn_blocking(move || {
            for _ in 0..100 {
                let _p = l.acquire_blocking().unwrap();
                assert!(inside.fetch_add(1, Ordering::SeqCst) < 2);
                inside.fetch_sub(1, Ordering::SeqCst);
            }
        }));
        let (l, inside) = (limiter.clone(), Arc::clone(&in_flight));
        handles.push(tokio::spawn(async move {
            for _ in 0..100 {
                let _p = l.acquire().await.unwrap();
                assert!(inside.fetch_add(1, Ordering::SeqCst) < 2);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(limiter.stats().admitted, 800);
    assert_eq!(limiter.available(), 2);
}

/// The acquire futures are plain `Future`s with a fast first poll: one that completed on the fast
/// path and is polled again (a contract violation) panics, as a finished `async fn` does, instead
/// of taking a second permit. Both kinds of limiter, both paths.
#[test]
fn an_acquire_future_polled_after_completion_panics_and_takes_nothing_more() {
    use std::future::Future;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::task::{Context, Waker};

    fn poll_twice<F: Future>(future: F) -> (bool, bool) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut future = std::pin::pin!(future);
        let first = future.as_mut().poll(&mut cx).is_ready();
        let again = catch_unwind(AssertUnwindSafe(|| {
            let _ = future.as_mut().poll(&mut cx);
        }));
        (first, again.is_err())
    }

    let limiter = RateLimiter::fixed_window(10, Duration::from_secs(60)).unwrap();
    assert_eq!(poll_twice(limiter.acquire()), (true, true));
    assert_eq!(limiter.stats().admitted, 1);
    assert_eq!(limiter.stats().available, 9);

    // A failed fast path (n above the limit) completes too.
    assert_eq!(poll_twice(limiter.acquire_n(11)), (true, true));
    assert_eq!((limiter.stats().admitted, limiter.stats().rejected), (1, 1));

    let concurrency = ConcurrencyLimiter::new(2).unwrap();
    let (first, panicked) = poll_twice(concurrency.acquire());
    assert!(first && panicked);
    assert_eq!(
        concurrency.available(),
        2,
        "the permit was dropped with the future"
    );
    assert_eq!(concurrency.stats().admitted, 1);
}

/// A future that had to queue completes on a later poll, and is finished after that too.
#[tokio::test(start_paused = true)]
async fn an_acquire_that_queued_completes_once() {
    let limiter = bucket(Rate::per_second(10), 1);
    limiter.acquire().await.unwrap();
    let start = Instant::now();
    let admission = limiter.acquire().await.unwrap();
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(admission.remaining(), 0);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.waiting, stats.cancelled), (2, 0, 0));
}

/// A probe (`n == 0`) waits for one permit, so it takes one permit's room in the queue: a
/// `queue_limit(0)` limiter never lets it wait ("0 means that `acquire` never waits"), and a
/// bounded queue cannot fill up with any number of probes.
#[tokio::test(start_paused = true)]
async fn a_waiting_probe_takes_room_in_the_queue() {
    let full = |outcome: Result<(), AcquireError>| {
        matches!(
            outcome,
            Err(AcquireError::QueueFull {
                requested: 0,
                queue_limit: _
            })
        )
    };
    // A wait that should fail at once; with paused time, 1 s elapses only if it queued.
    async fn at_once<T>(
        wait: impl std::future::Future<Output = Result<T, AcquireError>>,
    ) -> Result<(), AcquireError> {
        match tokio::time::timeout(Duration::from_secs(1), wait).await {
            Ok(outcome) => outcome.map(drop),
            Err(_) => Err(AcquireError::Timeout),
        }
    }
    let permits = ConcurrencyLimiter::builder(1)
        .queue_limit(0)
        .build()
        .unwrap();
    let held = permits.try_acquire().unwrap();
    assert!(full(at_once(permits.acquire_n(0)).await));
    assert!(full(permits.acquire_blocking_timeout(0, 50 * MS).map(drop)));
    drop(held);

    let limiter = RateLimiter::builder(Algorithm::FixedWindow {
        limit: 1,
        window: Duration::from_secs(60),
    })
    .clock(TokioClock::new())
    .queue_limit(0)
    .build()
    .unwrap();
    limiter.try_acquire().unwrap();
    assert!(full(at_once(limiter.acquire_n(0)).await));

    // Room for two permits: two probes wait, the third does not.
    let permits = ConcurrencyLimiter::builder(1)
        .queue_limit(2)
        .build()
        .unwrap();
    let held = permits.try_acquire().unwrap();
    let probes: Vec<_> = (0..2)
        .map(|_| tokio::spawn(permits.acquire_owned(0)))
        .collect();
    settle().await;
    assert_eq!(permits.stats().waiting, 2);
    assert!(full(at_once(permits.acquire_owned(0)).await));
    drop(held);
    for probe in probes {
        assert_eq!(probe.await.unwrap().unwrap().permits(), 0);
    }
    let stats = permits.stats();
    assert_eq!((stats.waiting, stats.queued_permits), (0, 0));
}

/// Newest first, the queue full: a newcomer whose permits are there *now* is admitted at once, as
/// `try_acquire` would be (and as the concurrency limiter and .NET's `NewestFirst` do). It must
/// not join the queue first, which evicted the oldest waiter with `QueueFull` to make room for a
/// caller that then never waited.
#[tokio::test(start_paused = true)]
async fn newest_first_acquire_that_fits_now_does_not_evict_a_queued_waiter() {
    let limiter = RateLimiter::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 5,
    })
    .clock(TokioClock::new())
    .queue_order(QueueOrder::NewestFirst)
    .queue_limit(5)
    .build()
    .unwrap();
    let start = Instant::now();
    limiter.try_acquire_n(5).unwrap();
    let big = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(5).await.map(|a| a.at()) })
    };
    settle().await;
    assert_eq!(limiter.stats().queued_permits, 5); // the queue is full
    tokio::time::sleep(Duration::from_millis(2500)).await; // two tokens have accrued

    // Both entry points: each is admitted at once, without waiting.
    let async_one = limiter.acquire_n(1).await.unwrap();
    let blocking_one = limiter.acquire_blocking_n(1).unwrap();
    assert_eq!(
        (async_one.at(), blocking_one.at()),
        (Duration::from_millis(2500), Duration::from_millis(2500))
    );
    settle().await;
    assert!(
        !big.is_finished(),
        "the queued waiter was failed: {:?}",
        limiter.stats()
    );
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.rejected), (1, 0), "{stats:?}");

    // The queued waiter is still served, once five more tokens have accrued after the two taken.
    assert_eq!(big.await.unwrap(), Ok(Duration::from_secs(7)));
    assert_eq!(start.elapsed(), Duration::from_secs(7));
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.waiting), (4, 0, 0));
}

// Calls that fail or serve several waiters at once wake them all, even when one `Waker` panics:
// each of them already has its outcome and sees it only when polled again.

/// One wake per freed slot, counted: a release wakes the head alone, and a served head wakes
/// the next waiter only if that one's permits are free (it stays registered otherwise, for the
/// release that frees them). Nobody is woken to look, find nothing and sleep again, and nobody
/// further back is woken at all.
#[test]
fn each_freed_slot_wakes_one_waiter_and_only_when_its_permits_are_free() {
    type Waiting<'a> = (
        Arc<wakers::Counter>,
        Waker,
        std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<turnstile::Permit<'a>, AcquireError>>
                    + Send
                    + 'a,
            >,
        >,
    );
    fn queue(limiter: &ConcurrencyLimiter, waiters: usize) -> Vec<Waiting<'_>> {
        (0..waiters)
            .map(|_| {
                let (woken, waker) = counting();
                let mut call: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
                    Box::pin(limiter.acquire());
                assert!(poll_with(call.as_mut(), &waker).is_pending());
                (woken, waker, call)
            })
            .collect()
    }
    fn wakes(waiters: &[Waiting<'_>]) -> Vec<usize> {
        waiters.iter().map(|(woken, _, _)| woken.wakes()).collect()
    }
    fn serve<'a>(waiters: &mut [Waiting<'a>], i: usize) -> turnstile::Permit<'a> {
        let (_, waker, call) = &mut waiters[i];
        match poll_with(call.as_mut(), waker) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("waiter {i}: {other:?}"),
        }
    }

    // One permit: each release serves one waiter, with one wake-up.
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let mut waiters = queue(&limiter, 4);
    drop(held);
    assert_eq!(
        wakes(&waiters),
        [1, 0, 0, 0],
        "a release wakes the head alone"
    );
    let permit = serve(&mut waiters, 0);
    assert_eq!(
        wakes(&waiters),
        [1, 0, 0, 0],
        "nothing is free for the next head"
    );
    drop(permit);
    assert_eq!(wakes(&waiters), [1, 1, 0, 0], "the release wakes it");
    let permit = serve(&mut waiters, 1);
    drop(permit);
    assert_eq!(wakes(&waiters), [1, 1, 1, 0]);
    assert_eq!(limiter.stats().waiting, 2);
    drop(waiters);

    // Two permits freed at once: the served head passes the second one on, with one wake-up.
    let limiter = ConcurrencyLimiter::new(2).unwrap();
    let held = limiter.try_acquire_n(2).unwrap();
    let mut waiters = queue(&limiter, 3);
    drop(held);
    assert_eq!(wakes(&waiters), [1, 0, 0]);
    let first = serve(&mut waiters, 0);
    assert_eq!(
        wakes(&waiters),
        [1, 1, 0],
        "a permit is free for the next head"
    );
    let second = serve(&mut waiters, 1);
    assert_eq!(wakes(&waiters), [1, 1, 0], "none for the third");
    drop(first);
    assert_eq!(wakes(&waiters), [1, 1, 1]);
    drop((second, waiters));
}

/// The same rule when the head leaves without being served: a cancelled head (its future
/// dropped, or a blocking head past its deadline) wakes the next head only if that one's
/// permits are free, and then once; otherwise the release that frees them wakes it. A release
/// whose wake the cancelled head took without looking has freed its permits: the next head is
/// woken for them.
#[test]
fn a_cancelled_head_wakes_the_next_only_when_its_permits_are_free() {
    type Call<'a> = std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<turnstile::Permit<'a>, AcquireError>>
                + Send
                + 'a,
        >,
    >;
    fn queued(limiter: &ConcurrencyLimiter, n: u32) -> (Arc<wakers::Counter>, Waker, Call<'_>) {
        let (woken, waker) = counting();
        let mut call: Call<'_> = Box::pin(limiter.acquire_n(n));
        assert!(poll_with(call.as_mut(), &waker).is_pending());
        (woken, waker, call)
    }

    // Nothing free: the next head stays asleep until the release.
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let (head_woken, _, head) = queued(&limiter, 1);
    let (next_woken, next_waker, mut next) = queued(&limiter, 1);
    drop(head);
    assert_eq!(
        next_woken.wakes(),
        0,
        "woken with nothing free, to look and sleep again"
    );
    drop(held);
    assert_eq!((head_woken.wakes(), next_woken.wakes()), (0, 1));
    assert!(matches!(
        poll_with(next.as_mut(), &next_waker),
        Poll::Ready(Ok(_))
    ));

    // The head woken by a release, then dropped before it looks: the next head gets the wake.
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let (head_woken, _, head) = queued(&limiter, 1);
    let (next_woken, next_waker, mut next) = queued(&limiter, 1);
    drop(held);
    assert_eq!((head_woken.wakes(), next_woken.wakes()), (1, 0));
    drop(head);
    assert_eq!(next_woken.wakes(), 1, "the freed permit's wake was lost");
    assert!(matches!(
        poll_with(next.as_mut(), &next_waker),
        Poll::Ready(Ok(_))
    ));

    // A head too big for what is free, cancelled: the next head, which fits, is woken at once.
    let limiter = ConcurrencyLimiter::new(3).unwrap();
    let held = limiter.try_acquire_n(2).unwrap();
    let (_, _, head) = queued(&limiter, 2);
    let (next_woken, next_waker, mut next) = queued(&limiter, 1);
    let (last_woken, _, last) = queued(&limiter, 1);
    drop(head);
    assert_eq!((next_woken.wakes(), last_woken.wakes()), (1, 0));
    let permit = match poll_with(next.as_mut(), &next_waker) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("{other:?}"),
    };
    assert_eq!(last_woken.wakes(), 0, "nothing is free for the last");
    drop((permit, held, last));
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.cancelled, stats.available), (0, 2, 3));
}

#[test]
fn close_wakes_every_waiter_even_if_a_waker_panics() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let _held = limiter.try_acquire().unwrap();
    let (woken, waker) = counting();
    let mut first = Box::pin(limiter.acquire());
    let mut second = Box::pin(limiter.acquire());
    assert!(poll_with(first.as_mut(), &panicky()).is_pending());
    assert!(poll_with(second.as_mut(), &waker).is_pending());
    must_panic(|| limiter.close());
    assert_eq!(
        woken.wakes(),
        1,
        "the waiter behind the panicking waker was never woken"
    );
    assert!(matches!(
        poll_with(second.as_mut(), Waker::noop()),
        Poll::Ready(Err(AcquireError::Closed))
    ));
}

#[test]
fn a_waiter_failed_by_close_and_dropped_unseen_counts_as_rejected() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let _held = limiter.try_acquire().unwrap();
    let mut waiter = Box::pin(limiter.acquire());
    assert!(poll_with(waiter.as_mut(), Waker::noop()).is_pending());
    limiter.close();
    drop(waiter);
    let stats = limiter.stats();
    // The limiter failed it; it gave nothing up.
    assert_eq!((stats.admitted, stats.rejected, stats.cancelled), (1, 1, 0));
}

#[test]
fn eviction_wakes_every_evicted_waiter_even_if_a_waker_panics() {
    let limiter = ConcurrencyLimiter::builder(2)
        .queue_order(QueueOrder::NewestFirst)
        .queue_limit(2)
        .build()
        .unwrap();
    let held = limiter.try_acquire_n(2).unwrap();
    let (woken, waker) = counting();
    let mut oldest = Box::pin(limiter.acquire());
    let mut older = Box::pin(limiter.acquire());
    let mut newest = Box::pin(limiter.acquire_n(2));
    assert!(poll_with(oldest.as_mut(), &panicky()).is_pending());
    assert!(poll_with(older.as_mut(), &waker).is_pending());
    // `newest` needs the whole queue: both are evicted, the oldest's waker panics first.
    must_panic(|| {
        let _ = poll_with(newest.as_mut(), Waker::noop());
    });
    assert_eq!(woken.wakes(), 1, "an evicted waiter was never woken");
    assert!(matches!(
        poll_with(older.as_mut(), Waker::noop()),
        Poll::Ready(Err(AcquireError::QueueFull { .. }))
    ));
    // The unwind took `newest` out of the queue: nobody is left waiting for a poll that never
    // comes, so the released permit is free.
    assert_eq!(limiter.stats().waiting, 0);
    drop((oldest, newest, held));
    assert_eq!(limiter.available(), 2);
    let stats = limiter.stats();
    // Both evicted waiters were rejected (`oldest` dropped without looking); `newest` gave up.
    assert_eq!((stats.admitted, stats.rejected, stats.cancelled), (1, 2, 1));
}

#[test]
fn set_limit_wakes_every_failed_waiter_and_the_head_even_if_a_waker_panics() {
    let limiter = ConcurrencyLimiter::new(4).unwrap();
    let held = limiter.try_acquire_n(4).unwrap();
    let (failed_woken, failed_waker) = counting();
    let (head_woken, head_waker) = counting();
    let mut too_big = Box::pin(limiter.acquire_n(4));
    let mut also_too_big = Box::pin(limiter.acquire_n(3));
    let mut fits = Box::pin(limiter.acquire_n(1));
    assert!(poll_with(too_big.as_mut(), &panicky()).is_pending());
    assert!(poll_with(also_too_big.as_mut(), &failed_waker).is_pending());
    assert!(poll_with(fits.as_mut(), &head_waker).is_pending());
    must_panic(|| {
        let _ = limiter.set_limit(2);
    });
    assert_eq!((failed_woken.wakes(), head_woken.wakes()), (1, 1));
    assert!(matches!(
        poll_with(also_too_big.as_mut(), Waker::noop()),
        Poll::Ready(Err(AcquireError::InsufficientCapacity { .. }))
    ));
    drop(held);
    assert!(matches!(
        poll_with(fits.as_mut(), Waker::noop()),
        Poll::Ready(Ok(_))
    ));
    drop(too_big);
}

/// Runs `f` on its own thread and fails if it has not finished within a minute: a test whose bug
/// is a self-deadlock would otherwise hang the whole run instead of failing. On correct code the
/// wait ends as soon as `f` does (a watchdog, not a sleep that moves time).
fn must_not_deadlock(what: &str, f: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => worker.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(worker.join().unwrap_err())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("deadlocked: {what}"),
    }
}

/// A waker whose drop runs user code that uses the same limiter: it owns a permit of it (like an
/// `ArcWake` holding resources, tokio#5429). Dropping such a waker under the queue's mutex makes
/// the permit's release take that mutex again on the same thread.
struct HoldsAPermit(#[allow(dead_code)] turnstile::OwnedPermit);

impl std::task::Wake for HoldsAPermit {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn a_replaced_waker_is_dropped_after_the_queue_is_unlocked() {
    must_not_deadlock(
        "a replaced waker was dropped under the queue's mutex",
        || {
            let limiter = ConcurrencyLimiter::new(2).unwrap();
            let in_waker = limiter.try_acquire_owned(1).unwrap();
            let held = limiter.try_acquire().unwrap();
            let mut waiter = Box::pin(limiter.acquire());
            let first = Waker::from(Arc::new(HoldsAPermit(in_waker)));
            assert!(poll_with(waiter.as_mut(), &first).is_pending());
            // The queue's clone is now the last one: replacing it drops the permit inside.
            drop(first);
            assert!(poll_with(waiter.as_mut(), Waker::noop()).is_pending());
            // That permit's release woke the waiter, which takes it.
            let Poll::Ready(Ok(permit)) = poll_with(waiter.as_mut(), Waker::noop()) else {
                panic!("the permit released by the replaced waker did not reach the waiter");
            };
            assert_eq!(limiter.available(), 0);
            drop((permit, held));
            assert_eq!(limiter.available(), 2);
        },
    );
}

#[test]
fn a_cancelled_waiters_waker_is_dropped_after_the_queue_is_unlocked() {
    must_not_deadlock(
        "a cancelled waiter's waker was dropped under the queue's mutex",
        || {
            let limiter = ConcurrencyLimiter::new(2).unwrap();
            let in_waker = limiter.try_acquire_owned(1).unwrap();
            let held = limiter.try_acquire().unwrap();
            let mut first = Box::pin(limiter.acquire());
            let mut second = Box::pin(limiter.acquire());
            let waker = Waker::from(Arc::new(HoldsAPermit(in_waker)));
            assert!(poll_with(first.as_mut(), &waker).is_pending());
            assert!(poll_with(second.as_mut(), Waker::noop()).is_pending());
            drop(waker);
            // Leaving the queue drops the last clone, and the permit inside goes back.
            drop(first);
            let Poll::Ready(Ok(permit)) = poll_with(second.as_mut(), Waker::noop()) else {
                panic!(
                    "the permit released by the cancelled waiter's waker did not reach the next"
                );
            };
            drop((permit, held));
            assert_eq!(limiter.available(), 2);
            assert_eq!(limiter.stats().waiting, 0);
        },
    );
}

/// A time limit too large for `Instant` (now + `Duration::MAX` overflows) means "no limit": the
/// waiter neither panics nor times out, and is served by the release.
#[test]
fn a_blocking_time_limit_beyond_instant_waits_for_the_release() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            limiter
                .acquire_blocking_timeout(1, Duration::MAX)
                .map(|permit| permit.permits())
        });
        while limiter.stats().waiting < 1 {
            std::thread::yield_now();
        }
        drop(held);
        assert_eq!(waiter.join().unwrap(), Ok(1));
    });
    assert_eq!(limiter.available(), 1);
    assert_eq!(limiter.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn an_async_time_limit_beyond_instant_waits_for_the_release() {
    let limiter = Arc::new(ConcurrencyLimiter::new(1).unwrap());
    let held = limiter.try_acquire_owned(1).unwrap();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            limiter
                .acquire_timeout(1, Duration::MAX)
                .await
                .map(|permit| permit.permits())
        })
    };
    settle().await;
    assert_eq!(limiter.stats().waiting, 1);
    // Years of paused time pass: still waiting, not timed out.
    tokio::time::advance(Duration::from_secs(100 * 365 * 24 * 3600)).await;
    settle().await;
    assert_eq!(limiter.stats().waiting, 1);
    drop(held);
    assert_eq!(waiter.await.unwrap(), Ok(1));
}

/// A waker that runs `then` when woken: a task whose wake-up uses the limiter that woke it (here
/// through its reconfiguration API, which takes the limiter's reconfiguration mutex).
struct OnWake(Box<dyn Fn() + Send + Sync>);

impl std::task::Wake for OnWake {
    fn wake(self: Arc<Self>) {
        (self.0)();
    }
}

fn on_wake(then: impl Fn() + Send + Sync + 'static) -> Waker {
    Waker::from(Arc::new(OnWake(Box::new(then))))
}

/// `set_limit` sweeps the queue under its mutex and wakes the head after it: a waker woken by it
/// that changes the limit again (or reads it) runs with the mutex free. Woken under it, as it
/// was, such a waker locked the mutex its own thread held.
#[test]
fn a_waker_woken_by_set_limit_may_set_the_limit_again() {
    must_not_deadlock("set_limit woke its head under its own mutex", || {
        let limiter = ConcurrencyLimiter::new(1).unwrap();
        let held = limiter.try_acquire().unwrap();
        let mut waiter = Box::pin(limiter.acquire());
        let again = limiter.clone();
        let waker = on_wake(move || again.set_limit(3).unwrap());
        assert!(poll_with(waiter.as_mut(), &waker).is_pending());
        limiter.set_limit(2).unwrap(); // wakes the head, whose waker raises it to 3
        assert_eq!(limiter.limit(), 3);
        let Poll::Ready(Ok(permit)) = poll_with(waiter.as_mut(), Waker::noop()) else {
            panic!("the head was not admitted under the raised limit");
        };
        assert_eq!(limiter.available(), 1);
        drop((permit, held));
        assert_eq!(limiter.available(), 3);
    });
}

/// The keyed twin: `KeyedConcurrencyLimiter::set_limit` sweeps every key's queue under its
/// mutex and wakes after it.
#[cfg(feature = "keyed")]
#[test]
fn a_waker_woken_by_a_keyed_set_limit_may_set_the_limit_again() {
    must_not_deadlock(
        "the keyed set_limit woke a head under its own mutex",
        || {
            let limiter = turnstile::KeyedConcurrencyLimiter::<u64>::new(1).unwrap();
            let held = limiter.try_acquire(&7).unwrap();
            let mut waiter = Box::pin(limiter.acquire(&7));
            let again = limiter.clone();
            let waker = on_wake(move || again.set_limit(3).unwrap());
            assert!(poll_with(waiter.as_mut(), &waker).is_pending());
            limiter.set_limit(2).unwrap();
            assert_eq!(limiter.limit(), 3);
            let Poll::Ready(Ok(permit)) = poll_with(waiter.as_mut(), Waker::noop()) else {
                panic!("the head was not admitted under the raised limit");
            };
            assert_eq!(limiter.available(&7), 1);
            drop((permit, held));
            assert_eq!(limiter.available(&7), 3);
        },
    );
}

/// `KeyedLimiter::reconfigure` sweeps every key's queue under the mutex that holds
/// `algorithm()`, and wakes after releasing it: a waker woken by it that reads the parameters
/// (or reconfigures again) finds the mutex free.
#[cfg(feature = "keyed")]
#[test]
fn a_waker_woken_by_a_keyed_reconfigure_may_read_the_algorithm() {
    must_not_deadlock(
        "KeyedLimiter::reconfigure woke a head under its mutex",
        || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async {
                let window = Duration::from_secs(1);
                let limit = |limit| Algorithm::FixedWindow { limit, window };
                let limiter = KeyedLimiter::with_clock(limit(1), TokioClock::new()).unwrap();
                limiter.try_acquire(&"alice").unwrap();
                let mut waiter = Box::pin(limiter.acquire(&"alice"));
                let seen = Arc::new(Mutex::new(None));
                let waker = {
                    let (limiter, seen) = (limiter.clone(), Arc::clone(&seen));
                    on_wake(move || *seen.lock().unwrap() = Some(limiter.algorithm()))
                };
                assert!(poll_with(waiter.as_mut(), &waker).is_pending());
                limiter.reconfigure(limit(2)).unwrap(); // wakes the head, whose waker reads it
                assert_eq!(*seen.lock().unwrap(), Some(limit(2)));
                let Poll::Ready(Ok(admission)) = poll_with(waiter.as_mut(), Waker::noop()) else {
                    panic!("the head was not admitted under the raised limit");
                };
                assert_eq!(admission.remaining(), 0);
            });
        },
    );
}

/// A review probe, kept: random arrivals, cancellations, `try_acquire`s, limit changes and time
/// steps on a fixed window, checked against a sequential model of the queue. Under oldest-first
/// nobody barges past a waiter (a newcomer queues, `try_acquire` is refused), queued waiters are
/// admitted in arrival order, `QueueFull` comes exactly when the room (one for a probe) is spent,
/// a waiter the limit no longer fits fails at once, and no waiter sleeps while its head's permits
/// are free (a lost wake-up): every waiter ends once time runs on, or is woken once by a close
/// and fails with `Closed`; every call ends in exactly one of the statistics' three counts. Futures are polled by hand,
/// each again only when its waker was woken, as an executor would.
#[tokio::test(start_paused = true)]
async fn random_waits_match_a_sequential_model_of_the_queue() {
    use std::future::Future;
    use std::pin::Pin;
    use turnstile::Admission;
    type Fut = Pin<Box<dyn Future<Output = Result<Admission, AcquireError>> + Send>>;
    struct Pending {
        id: usize,
        n: u32,
        fut: Fut,
        counter: Arc<wakers::Counter>,
        waker: Waker,
        seen: usize,
    }
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % bound
    };
    let window = Duration::from_millis(10);
    let algorithm = |kind: u64, limit: u32| match kind {
        0 => Algorithm::FixedWindow { limit, window },
        1 => Algorithm::SlidingWindow { limit, window },
        2 => Algorithm::SlidingCounter { limit, window },
        _ => Algorithm::TokenBucket {
            rate: Rate::new(1, MS * 4),
            burst: limit,
        },
    };
    for order in [QueueOrder::OldestFirst, QueueOrder::NewestFirst] {
        for round in 0..200 {
            let kind = round % 4;
            let limiter: &'static RateLimiter<TokioClock> = Box::leak(Box::new(
                RateLimiter::builder(algorithm(kind, 3))
                    .max_limit(4)
                    .clock(TokioClock::new())
                    .queue_order(order)
                    .queue_limit(6)
                    .build()
                    .unwrap(),
            ));
            let mut capacity = 3u32;
            // The model: queued waiters in arrival order, and the order queued ones were served.
            let mut queue: Vec<Pending> = Vec::new();
            let mut served: Vec<usize> = Vec::new();
            let mut ids = 0usize;
            // Calls made: each ends in exactly one of admitted, rejected, cancelled.
            let mut calls = 0u64;
            // Polls every woken waiter until nobody is woken; takes out the finished ones.
            let drain = |queue: &mut Vec<Pending>, served: &mut Vec<usize>, cap: u32| loop {
                let mut any = false;
                let mut i = 0;
                while i < queue.len() {
                    let p = &mut queue[i];
                    if p.counter.wakes() == p.seen {
                        i += 1;
                        continue;
                    }
                    any = true;
                    p.seen = p.counter.wakes();
                    match poll_with(p.fut.as_mut(), &p.waker.clone()) {
                        Poll::Pending => i += 1,
                        Poll::Ready(outcome) => {
                            let p = queue.remove(i);
                            match outcome {
                                Ok(_) => served.push(p.id),
                                Err(AcquireError::InsufficientCapacity { requested, .. }) => {
                                    assert!(requested > cap, "{requested} fits {cap}")
                                }
                                Err(AcquireError::QueueFull { .. }) => {
                                    assert_eq!(order, QueueOrder::NewestFirst, "evicted")
                                }
                                Err(other) => panic!("unexpected {other:?}"),
                            }
                        }
                    }
                }
                if !any {
                    break;
                }
            };
            for _step in 0..40 {
                match next(10) {
                    0..=3 => {
                        let n = next(5) as u32;
                        calls += 1;
                        let (counter, waker) = counting();
                        let mut fut: Fut = Box::pin(limiter.acquire_n(n));
                        let room: u64 = queue.iter().map(|p| u64::from(p.n.max(1))).sum();
                        let was_queued = !queue.is_empty();
                        let outcome = poll_with(fut.as_mut(), &waker);
                        match outcome {
                            Poll::Ready(Ok(_)) => {
                                assert!(
                                    !was_queued || order == QueueOrder::NewestFirst,
                                    "a newcomer barged past {} waiters",
                                    queue.len()
                                );
                            }
                            Poll::Ready(Err(AcquireError::InsufficientCapacity { .. })) => {
                                assert!(n > capacity)
                            }
                            Poll::Ready(Err(AcquireError::QueueFull { .. })) => {
                                assert!(n <= capacity);
                                assert_eq!(order, QueueOrder::OldestFirst);
                                assert!(room + u64::from(n.max(1)) > 6, "room {room}, n {n}");
                            }
                            Poll::Ready(Err(other)) => panic!("unexpected {other:?}"),
                            Poll::Pending => {
                                assert!(n <= capacity);
                                if order == QueueOrder::OldestFirst {
                                    assert!(room + u64::from(n.max(1)) <= 6);
                                }
                                ids += 1;
                                queue.push(Pending {
                                    id: ids,
                                    n,
                                    fut,
                                    counter,
                                    waker,
                                    seen: 0,
                                });
                            }
                        }
                    }
                    4 if !queue.is_empty() => {
                        let i = next(queue.len() as u64) as usize;
                        drop(queue.remove(i));
                    }
                    5 => {
                        let n = next(4) as u32;
                        calls += 1;
                        let outcome = limiter.try_acquire_n(n);
                        if order == QueueOrder::OldestFirst && !queue.is_empty() {
                            assert!(outcome.is_err(), "try_acquire barged past waiters");
                        }
                    }
                    6 => {
                        capacity = 1 + next(4) as u32;
                        limiter.reconfigure(algorithm(kind, capacity)).unwrap();
                    }
                    _ => tokio::time::advance(MS * (next(12) as u32)).await,
                }
                drain(&mut queue, &mut served, capacity);
                // A head whose permits are free is about to take them: its timer is due (within
                // tokio's millisecond) or it has been woken; never asleep for later.
                let head = match order {
                    QueueOrder::OldestFirst => queue.first(),
                    _ => queue.last(),
                }
                .map(|p| (p.id, p.n.max(1)));
                if let Some((id, need)) = head
                    && limiter.stats().available >= need
                {
                    tokio::time::advance(MS).await;
                    drain(&mut queue, &mut served, capacity);
                    assert!(
                        queue.iter().all(|p| p.id != id),
                        "a head slept with its permits free"
                    );
                }
                // Too big for the limit in force: failed by the reconfiguration, at once.
                assert!(
                    queue.iter().all(|p| p.n <= capacity),
                    "a waiter no longer fits"
                );
                let stats = limiter.stats();
                assert_eq!(stats.waiting, queue.len());
                assert_eq!(
                    stats.queued_permits,
                    queue.iter().map(|p| u64::from(p.n.max(1))).sum::<u64>()
                );
                if order == QueueOrder::OldestFirst {
                    let mut sorted = served.clone();
                    sorted.sort_unstable();
                    assert_eq!(served, sorted, "served out of arrival order");
                }
            }
            if round % 8 == 7 {
                // A close fails every waiter, each woken once to see it.
                limiter.close();
                for p in &mut queue {
                    assert_eq!(p.counter.wakes(), p.seen + 1, "a waiter not woken by close");
                    let outcome = poll_with(p.fut.as_mut(), &p.waker.clone());
                    assert!(matches!(outcome, Poll::Ready(Err(AcquireError::Closed))));
                }
                queue.clear();
            }
            // Time runs on: everyone still queued is served, in order (no lost wake-up).
            for _ in 0..(queue.len() * 2 + 2) {
                tokio::time::advance(window).await;
                drain(&mut queue, &mut served, capacity);
            }
            assert!(queue.is_empty(), "{} waiters never woke", queue.len());
            let stats = limiter.stats();
            assert_eq!(stats.waiting, 0);
            assert_eq!(stats.admitted + stats.rejected + stats.cancelled, calls);
        }
    }
}

/// Real threads, since the parking is what is under test: `close` wakes every blocking waiter
/// of a rate limiter at once, however it sleeps: the head parked for its hour-long retry-after
/// (a timed park), a waiter behind it on the futex (an untimed wait), one behind it with a
/// deadline (a timed park). Each answers `Closed`, counted rejected once, and none waits out
/// its time.
#[test]
fn close_wakes_blocking_waiters_parked_for_time_on_the_futex_or_until_a_deadline() {
    let limiter = RateLimiter::with_clock(
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        },
        turnstile::MonotonicClock::new(),
    )
    .unwrap();
    limiter.try_acquire().unwrap();
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        let waiters: Vec<_> = (0..3)
            .map(|i| {
                let limiter = &limiter;
                let waiter = s.spawn(move || match i {
                    2 => limiter.acquire_blocking_timeout(1, Duration::from_secs(3600)),
                    _ => limiter.acquire_blocking(),
                });
                // Queued in this order: the first is the head.
                while limiter.stats().waiting < i + 1 {
                    std::thread::yield_now();
                }
                waiter
            })
            .collect();
        // Let them all reach their park.
        std::thread::sleep(20 * MS);
        limiter.close();
        for waiter in waiters {
            assert_eq!(waiter.join().unwrap().unwrap_err(), AcquireError::Closed);
        }
    });
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "a waiter slept on"
    );
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.admitted,
            stats.rejected,
            stats.cancelled,
            stats.waiting
        ),
        (1, 3, 0, 0)
    );
}
