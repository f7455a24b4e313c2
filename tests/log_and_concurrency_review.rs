//! Review probes of the exact sliding window (the log in a ring of timestamps) and the unkeyed
//! concurrency limiter. Time is driven by `ManualClock`; everything is in nanoseconds.

use std::time::Duration;
use turnstile::{Algorithm, ManualClock, RateLimiter, TryAcquireError};

const NS: fn(u64) -> Duration = Duration::from_nanos;

fn log(limit: u32, window: u64) -> (ManualClock, RateLimiter<ManualClock>) {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(
        Algorithm::SlidingWindow {
            limit,
            window: NS(window),
        },
        clock.clone(),
    )
    .unwrap();
    (clock, limiter)
}

#[allow(dead_code)]
fn retry(got: Result<turnstile::Admission, TryAcquireError>) -> u64 {
    match got {
        Err(TryAcquireError::Rejected(r)) => r.retry_after_nanos(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Limit 3: ticket 0 admitted at 0 (live until 10), ticket 1 admitted at 3 and refunded. A
/// probe at 3 sees one permit held until 10: the ring is full again in 7 ns, not at once (the
/// probe read the newest ticket alone, whose refunded expiry 0 said "now"). A check agrees.
#[test]
fn a_probe_looks_past_a_refunded_newest_ticket_for_its_reset_time() {
    let (clock, limiter) = log(3, 10);
    limiter.try_acquire().unwrap();
    clock.advance(NS(3));
    limiter.try_acquire_refundable(1).unwrap().refund();
    let probe = limiter.try_acquire_n(0).unwrap();
    assert_eq!((probe.remaining(), probe.reset_after()), (1, NS(7)));
    clock.advance(NS(6));
    let probe = limiter.try_acquire_n(0).unwrap();
    assert_eq!((probe.remaining(), probe.reset_after()), (1, NS(1)));
    clock.advance(NS(1));
    let probe = limiter.try_acquire_n(0).unwrap();
    assert_eq!((probe.remaining(), probe.reset_after()), (3, NS(0)));
}
