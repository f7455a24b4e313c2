//! The crate's clocks at their edges: read in several tokio runtimes, at and past the
//! algorithms' cap on time.

use std::time::Duration;
use turnstile::{Algorithm, Clock, RateLimiter, TokioClock};

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// tokio's "now" is the runtime's own: a runtime whose paused time was advanced by an hour is an
/// hour ahead of real time and of the next test's runtime. A `TokioClock` read there and then
/// elsewhere (a limiter kept in a static across `#[tokio::test(start_paused = true)]`s, or used
/// after its runtime is gone) went back by the hour, against the `Clock` contract: the fixed
/// window it had filled at 1 h read as an earlier one, and admitted its limit again.
#[test]
fn a_tokio_clock_never_goes_back_when_read_in_another_runtime() {
    let hour = 3_600_000_000_000;
    let first = paused_runtime();
    let (clock, limiter) = first.block_on(async {
        let clock = TokioClock::new();
        let window = Duration::from_secs(60);
        let limiter =
            RateLimiter::with_clock(Algorithm::FixedWindow { limit: 3, window }, clock.clone())
                .unwrap();
        tokio::time::advance(Duration::from_secs(3600)).await;
        for _ in 0..3 {
            limiter.try_acquire().unwrap();
        }
        assert!(limiter.try_acquire().is_err());
        assert_eq!(clock.now(), hour);
        (clock, limiter)
    });
    drop(first);
    // Out of any runtime: real time since the clock's epoch, a few milliseconds.
    assert!(clock.now() >= hour, "the clock went back: {}", clock.now());
    assert!(limiter.try_acquire().is_err(), "the window's limit again");
    // In another paused runtime, whose time starts at real time.
    let second = paused_runtime();
    second.block_on(async {
        assert!(clock.now() >= hour, "the clock went back: {}", clock.now());
        assert!(limiter.try_acquire().is_err(), "the window's limit again");
        // Once that runtime's time passes the hour mark, the clock moves again.
        tokio::time::advance(Duration::from_secs(3600 + 60)).await;
        assert!(clock.now() >= hour + 60_000_000_000);
        assert!(limiter.try_acquire().is_ok());
    });
}

/// At the algorithms' cap on time (2^62 − 1 ns after the epoch; a `ManualClock` advanced by
/// `Duration::MAX` reads `u64::MAX`), time stands still: an exact sliding window's permits taken
/// there never expire. Its rejection said to retry in 1 ns, so a waiting head slept 1 ns and
/// retried for ever: `acquire_blocking_timeout` spun a core until its time limit. The wait now
/// says "never" as a ban for good does (2^62 ns), and the head sleeps until its time limit.
#[test]
fn a_sliding_window_full_at_the_time_cap_says_never_rather_than_one_nanosecond() {
    let clock = turnstile::ManualClock::new();
    let window = Duration::from_secs(1);
    let limiter =
        RateLimiter::with_clock(Algorithm::SlidingWindow { limit: 3, window }, clock.clone())
            .unwrap();
    clock.advance(Duration::MAX);
    for _ in 0..3 {
        limiter.try_acquire().unwrap();
    }
    let wait = match limiter.try_acquire() {
        Err(turnstile::TryAcquireError::Rejected(rejection)) => rejection.retry_after(),
        other => panic!("not a rejection: {other:?}"),
    };
    assert!(
        wait >= Duration::from_nanos(1 << 62),
        "a permit that never frees: retry after {wait:?}"
    );
    // Still true after the clock is pushed on (it cannot move past the cap).
    clock.advance(Duration::from_secs(3600));
    assert!(limiter.try_acquire().is_err());
}

/// The four algorithms at the end of time. The fixed window and the sliding counter locate a
/// reading on their grid with saturating arithmetic (a `ManualClock` advanced by `Duration::MAX`
/// reads `u64::MAX`), so the window holding the last reading never ends; the token bucket caps
/// readings at 2^62 − 1 ns, so a bucket emptied there never refills. A full limiter's rejection
/// said to retry at the end of that window or at the refill (1 ns for a power-of-two window,
/// 0.29 s for a window of a second, the time to the cap for the bucket), a wait that never ends:
/// a waiting head slept it and retried for ever. Every algorithm now says "never" (at least
/// 2^62 ns) there, for a rejection's `retry_after` and an admission's `reset_after`, and keeps
/// the exact wait where the clock still gets there.
#[test]
fn every_algorithm_full_at_the_end_of_time_says_never() {
    let never = Duration::from_nanos(1 << 62);
    let second = Duration::from_secs(1);
    let power_of_two = Duration::from_nanos(1 << 30);
    let algorithms = [
        Algorithm::FixedWindow {
            limit: 3,
            window: second,
        },
        Algorithm::FixedWindow {
            limit: 3,
            window: power_of_two,
        },
        Algorithm::SlidingCounter {
            limit: 3,
            window: second,
        },
        Algorithm::SlidingCounter {
            limit: 3,
            window: power_of_two,
        },
        Algorithm::SlidingWindow {
            limit: 3,
            window: second,
        },
        Algorithm::TokenBucket {
            rate: turnstile::Rate::per_second(1),
            burst: 3,
        },
    ];
    for algorithm in algorithms {
        let clock = turnstile::ManualClock::new();
        let limiter = RateLimiter::with_clock(algorithm, clock.clone()).unwrap();
        clock.advance(Duration::MAX);
        let mut resets = Vec::new();
        resets.push(limiter.try_acquire().unwrap().reset_after());
        // A probe with room left is admitted; its reset is "never" too.
        let probe = limiter.try_acquire_n(0).map(|a| a.reset_after());
        for _ in 0..2 {
            resets.push(limiter.try_acquire().unwrap().reset_after());
        }
        let wait = match limiter.try_acquire() {
            Err(turnstile::TryAcquireError::Rejected(rejection)) => rejection.retry_after(),
            other => panic!("{algorithm:?}: not a rejection: {other:?}"),
        };
        assert!(
            wait >= never,
            "{algorithm:?}: a wait that never ends: retry after {wait:?}"
        );
        assert!(
            resets.iter().all(|&reset| reset >= never),
            "{algorithm:?}: never full again, yet reset after {resets:?}"
        );
        let Ok(reset) = probe else {
            panic!("{algorithm:?}: a probe with room left was refused: {probe:?}");
        };
        assert!(
            reset >= never,
            "{algorithm:?}: a probe's reset after {reset:?}"
        );
        clock.advance(Duration::from_secs(3600));
        assert!(
            limiter.try_acquire().is_err(),
            "{algorithm:?}: admitted past the end"
        );

        // An hour before the end the clock still gets to the next window or the refill: the
        // exact wait, not "never".
        let clock = turnstile::ManualClock::new();
        let limiter = RateLimiter::with_clock(algorithm, clock.clone()).unwrap();
        clock.set(Duration::from_nanos((1 << 62) - 3_600_000_000_000));
        for _ in 0..3 {
            let reset = limiter.try_acquire().unwrap().reset_after();
            assert!(
                reset <= Duration::from_secs(3),
                "{algorithm:?}: reset after {reset:?}"
            );
        }
        let wait = match limiter.try_acquire() {
            Err(turnstile::TryAcquireError::Rejected(rejection)) => rejection.retry_after(),
            other => panic!("{algorithm:?}: not a rejection: {other:?}"),
        };
        assert!(
            wait <= Duration::from_secs(3),
            "{algorithm:?}: retry after {wait:?} an hour before the end"
        );
        clock.advance(wait);
        limiter.try_acquire().unwrap();
    }
}

/// A head that must wait for time inside a tokio runtime sleeps on that runtime's timer, which
/// must be enabled (documented, as for tokio's own `sleep`): without it the `acquire` panics with
/// tokio's message naming `enable_time`. The panic must not strand the queue: the waiter leaves
/// it as it unwinds, and the next one is served.
#[test]
fn a_wait_in_a_runtime_without_timers_panics_with_tokios_message_and_leaves_the_queue() {
    let clock = turnstile::ManualClock::new();
    let window = Duration::from_secs(1);
    let limiter =
        RateLimiter::with_clock(Algorithm::FixedWindow { limit: 1, window }, clock.clone())
            .unwrap();
    limiter.try_acquire().unwrap();
    let no_timers = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        no_timers.block_on(limiter.acquire())
    }))
    .unwrap_err();
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(message.contains("enable_time"), "{message}");
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.queued_permits), (0, 0));
    clock.advance(window);
    let admission = futures_executor::block_on(limiter.acquire()).unwrap();
    assert_eq!(admission.at(), window);
}

/// A clock that goes back breaks the `Clock` contract, but it is the user's: the limiters it
/// drives answer, reconfigure and sweep without a panic (debug builds checked `now - elapsed`
/// on a grid rebased at a later time, in `Grid::rebase` and the sliding counter's sweep).
#[test]
fn a_clock_that_goes_back_makes_nothing_panic() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    #[derive(Clone)]
    struct Settable(Arc<AtomicU64>);
    impl Clock for Settable {
        fn now(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }
    let secs = |s: u64| Duration::from_secs(s).as_nanos() as u64;
    for window in [
        |w| Algorithm::FixedWindow {
            limit: 2,
            window: Duration::from_secs(w),
        },
        |w| Algorithm::SlidingCounter {
            limit: 2,
            window: Duration::from_secs(w),
        },
        |w| Algorithm::SlidingWindow {
            limit: 2,
            window: Duration::from_secs(w),
        },
        |w| Algorithm::TokenBucket {
            rate: turnstile::Rate::new(2, Duration::from_secs(w)),
            burst: 2,
        },
    ] {
        let time = Arc::new(AtomicU64::new(secs(15)));
        let limiter =
            turnstile::KeyedLimiter::with_clock(window(10), Settable(time.clone())).unwrap();
        limiter.try_acquire(&1u32).unwrap();
        // Rebased at 15 s onto a 7 s grid (shifted by 4 s), then the clock goes back to 0.
        limiter.reconfigure(window(7)).unwrap();
        limiter.try_acquire(&1u32).unwrap();
        time.store(0, Ordering::SeqCst);
        let _ = limiter.try_acquire(&1u32);
        limiter.sweep();
        limiter.reconfigure(window(3)).unwrap();
        let _ = limiter.try_acquire(&2u32);
        limiter.sweep();
        time.store(secs(60), Ordering::SeqCst);
        assert!(limiter.try_acquire(&1u32).is_ok(), "{:?}", window(3));
    }
}
