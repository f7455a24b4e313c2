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
