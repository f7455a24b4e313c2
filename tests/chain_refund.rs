//! Receipts of chains (`src/chain/refund.rs`): `Chain::try_acquire_refundable` and
//! `KeyedChain::try_acquire_refundable`, their waiting counterparts, and the receipts' `refund`,
//! which gives every member its permits back under that member's own receipt's rules. Per
//! algorithm: what comes back to each member; who is woken (chain callers, members' queues);
//! timeouts that hold nothing; a reconfiguration (or reset) of one member, which voids that
//! member's refund only. Time is a `ManualClock`, or tokio's paused clock for waiters.

mod common;

use common::algorithms::{SECOND, bucket, counter, fixed, of_kind, sliding};

use proptest::prelude::*;
use std::time::Duration;
use turnstile::{
    AcquireError, Algorithm, Chain, KeyOverflow, KeyedChain, KeyedLimiter, ManualClock,
    RateLimiter, TokioClock, TryAcquireError,
};

/// Every algorithm at `limit`.
fn every(limit: u32) -> [Algorithm; 4] {
    [fixed(limit), counter(limit), bucket(limit), sliding(limit)]
}

/// The same algorithm at another limit.
fn resized(algorithm: Algorithm, limit: u32) -> Algorithm {
    match algorithm {
        Algorithm::FixedWindow { .. } => fixed(limit),
        Algorithm::SlidingCounter { .. } => counter(limit),
        Algorithm::TokenBucket { .. } => bucket(limit),
        _ => sliding(limit),
    }
}

fn manual(algorithm: Algorithm, clock: &ManualClock) -> RateLimiter<ManualClock> {
    RateLimiter::with_clock(algorithm, clock.clone()).unwrap()
}

fn on_tokio(algorithm: Algorithm) -> RateLimiter<TokioClock> {
    RateLimiter::with_clock(algorithm, TokioClock::new()).unwrap()
}

fn keyed_on_tokio(algorithm: Algorithm) -> KeyedLimiter<&'static str, TokioClock> {
    KeyedLimiter::with_clock(algorithm, TokioClock::new()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// What comes back.

/// Per algorithm, a chain of a smaller and a larger member: the refund gives both their
/// permits back, and the next caller gets them.
#[test]
fn a_chain_refund_frees_the_permits_in_every_member() {
    for algorithm in every(2) {
        let clock = ManualClock::new();
        let small = manual(algorithm, &clock);
        let large = manual(resized(algorithm, 3), &clock);
        let chain = Chain::new([small.clone(), large.clone()]).unwrap();
        let taken = chain.try_acquire_refundable(2).unwrap();
        assert_eq!(taken.permits(), 2);
        assert_eq!(taken.admission().remaining(), 0, "{algorithm:?}");
        assert!(chain.try_acquire().is_err(), "{algorithm:?}");
        assert_eq!(large.stats().available, 1, "{algorithm:?}");
        taken.refund();
        assert_eq!(
            (small.stats().available, large.stats().available),
            (2, 3),
            "{algorithm:?}"
        );
        let next = chain
            .try_acquire_n(2)
            .unwrap_or_else(|e| panic!("{algorithm:?}: the refund freed nothing: {e:?}"));
        assert_eq!(next.remaining(), 0, "{algorithm:?}");
        assert_eq!(large.stats().available, 1, "{algorithm:?}");
    }
}

/// Per algorithm, a keyed chain of two per-key members and a global one: the refund goes back
/// to the key on both per-key members and to the global member, and the next caller gets it.
#[test]
fn a_keyed_chain_refund_frees_the_permits_in_every_member() {
    for algorithm in every(2) {
        let clock = ManualClock::new();
        let per_key = KeyedLimiter::with_clock(algorithm, clock.clone()).unwrap();
        let wider = KeyedLimiter::with_clock(resized(algorithm, 4), clock.clone()).unwrap();
        let global = manual(resized(algorithm, 3), &clock);
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .per_key(wider.clone())
            .global(global.clone())
            .build()
            .unwrap();
        let taken = chain.try_acquire_refundable(&"a", 2).unwrap();
        assert_eq!((*taken.key(), taken.permits()), ("a", 2));
        chain.try_acquire(&"b").unwrap();
        assert!(
            chain.try_acquire(&"c").is_err(),
            "{algorithm:?}: global spent"
        );
        taken.refund();
        assert_eq!(per_key.available(&"a"), 2, "{algorithm:?}");
        assert_eq!(wider.available(&"a"), 4, "{algorithm:?}");
        assert_eq!(per_key.available(&"b"), 1, "{algorithm:?}: not b's");
        assert_eq!(global.stats().available, 2, "{algorithm:?}");
        chain
            .try_acquire_n(&"a", 2)
            .unwrap_or_else(|e| panic!("{algorithm:?}: the refund freed nothing: {e:?}"));
    }
}

/// A limiter listed twice was charged twice: both admissions come back.
#[test]
fn a_limiter_listed_twice_gets_both_admissions_back() {
    for algorithm in every(4) {
        let clock = ManualClock::new();
        let twice = manual(algorithm, &clock);
        let chain = Chain::new([twice.clone(), twice.clone()]).unwrap();
        let taken = chain.try_acquire_refundable(2).unwrap();
        assert_eq!(twice.stats().available, 0, "{algorithm:?}");
        taken.refund();
        assert_eq!(twice.stats().available, 4, "{algorithm:?}");
    }
}

/// Receipt calls are counted as calls; refunds are counted nowhere; a probe's receipt gives
/// nothing back; errors are `try_acquire_n`'s.
#[test]
fn chain_receipts_are_counted_as_calls_and_refunds_are_not() {
    let clock = ManualClock::new();
    let member = manual(fixed(2), &clock);
    let chain = Chain::new([member.clone()]).unwrap();
    let probe = chain.try_acquire_refundable(0).unwrap();
    let taken = chain.try_acquire_refundable(2).unwrap();
    probe.refund();
    assert_eq!(member.stats().available, 0, "a probe gave something back");
    assert!(matches!(
        chain.try_acquire_refundable(1),
        Err(TryAcquireError::Rejected(_))
    ));
    assert!(matches!(
        chain.try_acquire_refundable(3),
        Err(TryAcquireError::InsufficientCapacity { .. })
    ));
    taken.refund();
    let stats = chain.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.refunded), (2, 2, 0));
    assert_eq!(member.stats().admitted, 2);
    assert_eq!(member.stats().available, 2);
    member.close();
    assert_eq!(
        chain.try_acquire_refundable(1).unwrap_err(),
        TryAcquireError::Closed
    );
}

/// Every permit `limiter` still admits now (at most 1000).
fn drain(limiter: &RateLimiter<ManualClock>) -> u32 {
    (0..1000)
        .take_while(|_| limiter.try_acquire().is_ok())
        .count() as u32
}

/// Per algorithm, over time (the clock moved 0 to 25 s after the admission, across window
/// boundaries, with the member drained in between): a member's share of a chain refund frees
/// exactly what the member's own receipt for the same admission frees on a twin limiter, never
/// more; and a limiter listed twice, each of whose admissions is refunded as its own receipt
/// would be, never frees more than the limit.
#[test]
fn a_members_share_of_a_refund_is_its_own_receipts_over_time() {
    for algorithm in every(3) {
        for half_seconds in [0, 1, 3, 9, 10, 11, 19, 20, 21, 50] {
            let elapsed = SECOND * half_seconds / 2;
            let (clock, twin_clock) = (ManualClock::new(), ManualClock::new());
            clock.advance(7 * SECOND);
            twin_clock.advance(7 * SECOND);
            let member = manual(algorithm, &clock);
            let twin = manual(algorithm, &twin_clock);
            member.try_acquire().unwrap();
            twin.try_acquire().unwrap();
            let chain = Chain::new([member.clone()]).unwrap();
            let taken = chain.try_acquire_refundable(1).unwrap();
            let own = twin.try_acquire_refundable(1).unwrap();
            clock.advance(elapsed);
            twin_clock.advance(elapsed);
            assert_eq!(drain(&member), drain(&twin), "{algorithm:?} {elapsed:?}");
            taken.refund();
            own.refund();
            assert_eq!(
                drain(&member),
                drain(&twin),
                "{algorithm:?}, {elapsed:?} after the admission"
            );

            let clock = ManualClock::new();
            clock.advance(7 * SECOND);
            let twice = manual(resized(algorithm, 4), &clock);
            let chain = Chain::new([twice.clone(), twice.clone()]).unwrap();
            let taken = chain.try_acquire_refundable(2).unwrap();
            clock.advance(elapsed);
            let before = drain(&twice);
            taken.refund();
            let after = drain(&twice);
            assert!(
                before + after <= 4,
                "{algorithm:?}, {elapsed:?}: {before} + {after} after a refund of 4"
            );
        }
    }
}

/// Per algorithm: a per-key member's key evicted (idle once the admission stopped weighing)
/// and made again, and its new cell drained, between the admission and the refund: the refund
/// finds nothing of its admission there and frees nothing.
#[test]
fn a_refund_after_the_key_was_evicted_and_made_again_frees_nothing() {
    for algorithm in every(2) {
        let clock = ManualClock::new();
        let per_key = KeyedLimiter::builder(algorithm)
            .clock(clock.clone())
            .max_keys(1)
            .build()
            .unwrap();
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .global(manual(fixed(100), &clock))
            .build()
            .unwrap();
        let taken = chain.try_acquire_refundable(&"a", 2).unwrap();
        clock.advance(30 * SECOND);
        per_key.try_acquire(&"b").unwrap(); // evicts "a", at the cap
        clock.advance(30 * SECOND);
        per_key.try_acquire_n(&"a", 2).unwrap(); // evicts "b": a new cell for "a", drained
        assert_eq!(per_key.stats().evicted, 2, "{algorithm:?}");
        taken.refund();
        assert!(
            per_key.try_acquire(&"a").is_err(),
            "{algorithm:?}: the refund freed a permit of the key's new cell"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Who is woken.

/// Per algorithm: a chain caller waiting for the chain (its own waiting receipt call) is
/// admitted as soon as another receipt is refunded, not when its retry-after comes; and its
/// own receipt gives the permit back in turn.
#[tokio::test(start_paused = true)]
async fn a_chain_caller_is_admitted_when_a_receipt_is_refunded() {
    for algorithm in every(1) {
        let a = on_tokio(algorithm);
        let b = on_tokio(resized(algorithm, 1));
        let chain = Chain::new([a, b]).unwrap();
        let taken = chain.try_acquire_refundable(1).unwrap();
        let waiter = tokio::spawn({
            let chain = chain.clone();
            async move { chain.acquire_refundable(1).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "{algorithm:?}: the caller waits");
        let start = tokio::time::Instant::now();
        taken.refund();
        let got = waiter.await.unwrap().unwrap();
        assert!(
            start.elapsed() < SECOND / 10,
            "{algorithm:?}: the caller slept out its retry-after: {:?}",
            start.elapsed()
        );
        assert!(chain.try_acquire().is_err(), "{algorithm:?}: it holds it");
        got.refund();
        chain
            .try_acquire()
            .unwrap_or_else(|e| panic!("{algorithm:?}: the waiter's refund freed nothing: {e:?}"));
    }
}

/// The same for a keyed chain, per key and global members both spent by the receipt.
#[tokio::test(start_paused = true)]
async fn a_keyed_chain_caller_is_admitted_when_a_receipt_is_refunded() {
    for algorithm in every(1) {
        let chain = KeyedChain::builder()
            .per_key(keyed_on_tokio(algorithm))
            .global(on_tokio(algorithm))
            .build()
            .unwrap();
        let taken = chain.try_acquire_refundable(&"k", 1).unwrap();
        let waiter = tokio::spawn({
            let chain = chain.clone();
            async move { chain.acquire_refundable(&"k", 1).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "{algorithm:?}: the caller waits");
        let start = tokio::time::Instant::now();
        taken.refund();
        let got = waiter.await.unwrap().unwrap();
        assert!(
            start.elapsed() < SECOND / 10,
            "{algorithm:?}: the caller slept out its retry-after: {:?}",
            start.elapsed()
        );
        assert_eq!(*got.key(), "k");
        got.refund();
        chain.try_acquire(&"k").unwrap();
    }
}

/// Per algorithm: a refund wakes the head of every member's own queue (a key's queue on a
/// per-key member), which the permits now admit, as a member's own receipt's refund does.
#[tokio::test(start_paused = true)]
async fn a_chain_refund_wakes_the_members_queues() {
    for algorithm in every(1) {
        let per_key = keyed_on_tokio(algorithm);
        let global = on_tokio(resized(algorithm, 2));
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .global(global.clone())
            .build()
            .unwrap();
        // The receipt first: an exact sliding window's refund frees the oldest place.
        let taken = chain.try_acquire_refundable(&"k", 1).unwrap();
        global.try_acquire().unwrap();
        let key_waiter = tokio::spawn({
            let per_key = per_key.clone();
            async move { per_key.acquire(&"k").await }
        });
        let global_waiter = tokio::spawn({
            let global = global.clone();
            async move { global.acquire().await }
        });
        tokio::task::yield_now().await;
        assert_eq!(per_key.stats().waiting, 1, "{algorithm:?}");
        assert_eq!(global.stats().waiting, 1, "{algorithm:?}");
        let start = tokio::time::Instant::now();
        taken.refund();
        key_waiter.await.unwrap().unwrap();
        global_waiter.await.unwrap().unwrap();
        assert!(
            start.elapsed() < SECOND / 10,
            "{algorithm:?}: a queue's head slept out its timer: {:?}",
            start.elapsed()
        );
    }
}

/// A reset of a per-key member voids its share of a refund, but not a share its shared overflow
/// cell admitted (no reset touches that cell), as for a keyed receipt of its own.
#[test]
fn a_reset_leaves_a_refund_to_the_overflow_cell_whole() {
    for algorithm in every(2) {
        let clock = ManualClock::new();
        let per_key = KeyedLimiter::builder(algorithm)
            .clock(clock.clone())
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap();
        let global = manual(resized(algorithm, 3), &clock);
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .global(global.clone())
            .build()
            .unwrap();
        per_key.try_acquire(&"own").unwrap(); // holds the only key slot, busy
        let taken = chain.try_acquire_refundable(&"a", 2).unwrap(); // on the overflow cell
        per_key.reset(&"a");
        per_key.reset(&"other");
        taken.refund();
        per_key
            .try_acquire_n(&"b", 2)
            .unwrap_or_else(|e| panic!("{algorithm:?}: the overflow cell got nothing: {e:?}"));
        assert_eq!(global.stats().available, 3, "{algorithm:?}");
    }
}

/// Per algorithm: a receipt a per-key member's shared overflow cell admitted (at the key cap)
/// gives that cell its permits back, and the refund wakes the waiters of the other keys the
/// cell serves, in their own keys' queues, not only the refunded key's queue.
#[tokio::test(start_paused = true)]
async fn an_overflow_refund_wakes_the_waiters_of_other_overflow_keys() {
    for algorithm in every(1) {
        let per_key = KeyedLimiter::builder(algorithm)
            .clock(TokioClock::new())
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap();
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .global(on_tokio(resized(algorithm, 5)))
            .build()
            .unwrap();
        per_key.try_acquire(&"own").unwrap(); // holds the only key slot, busy
        let taken = chain.try_acquire_refundable(&"a", 1).unwrap(); // on the overflow cell
        let waiter = tokio::spawn({
            let per_key = per_key.clone();
            async move { per_key.acquire(&"b").await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert_eq!(per_key.stats().waiting, 1, "{algorithm:?}");
        let start = tokio::time::Instant::now();
        taken.refund();
        waiter.await.unwrap().unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "{algorithm:?}: the overflow key's waiter slept out its timer"
        );
    }
}

/// A thread blocked on the chain (whose clock never moves: only a refund can admit it) gets
/// its receipt once another is refunded; the same on a keyed chain.
#[test]
fn a_blocked_chain_caller_is_admitted_when_a_receipt_is_refunded() {
    for algorithm in every(1) {
        let clock = ManualClock::new();
        let chain = Chain::new([manual(algorithm, &clock), manual(algorithm, &clock)]).unwrap();
        let taken = chain.try_acquire_refundable(1).unwrap();
        let start = std::time::Instant::now();
        let got = std::thread::scope(|s| {
            let waiter = s.spawn(|| chain.acquire_blocking_refundable(1));
            // Queued before the refund, so that the refund is what must admit it.
            while chain.stats().waiting == 0 && !waiter.is_finished() {
                std::thread::yield_now();
            }
            taken.refund();
            waiter.join().unwrap()
        })
        .unwrap();
        assert!(
            start.elapsed() < 5 * SECOND,
            "{algorithm:?}: slept out its retry-after"
        );
        assert!(chain.try_acquire().is_err(), "{algorithm:?}");
        got.refund();
        chain.try_acquire().unwrap();

        let chain = KeyedChain::builder()
            .per_key(KeyedLimiter::with_clock(algorithm, clock.clone()).unwrap())
            .global(manual(algorithm, &clock))
            .build()
            .unwrap();
        let taken = chain.try_acquire_refundable(&"k", 1).unwrap();
        let start = std::time::Instant::now();
        let got = std::thread::scope(|s| {
            let waiter = s.spawn(|| chain.acquire_blocking_refundable(&"k", 1));
            while chain.stats().waiting == 0 && !waiter.is_finished() {
                std::thread::yield_now();
            }
            taken.refund();
            waiter.join().unwrap()
        })
        .unwrap();
        assert!(
            start.elapsed() < 5 * SECOND,
            "{algorithm:?}: slept out its retry-after"
        );
        assert!(chain.try_acquire(&"k").is_err(), "{algorithm:?}");
        got.refund();
        chain.try_acquire(&"k").unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Timeouts hold nothing.

/// A waiting receipt call that times out holds nothing in any member: the token the bucket
/// accrued while it waited for two, and the fixed window's permits, are there for the next
/// caller.
#[tokio::test(start_paused = true)]
async fn a_chain_wait_that_times_out_holds_nothing() {
    let window = on_tokio(fixed(5));
    let chain = Chain::new([on_tokio(bucket(2)), window.clone()]).unwrap();
    chain.try_acquire_n(2).unwrap();
    let late = chain.acquire_refundable_timeout(2, SECOND).await;
    assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    assert_eq!(chain.stats().cancelled, 1);
    assert_eq!(window.stats().available, 3);
    chain.try_acquire().unwrap();

    let per_key = keyed_on_tokio(bucket(2));
    let global = on_tokio(fixed(5));
    let chain = KeyedChain::builder()
        .per_key(per_key.clone())
        .global(global.clone())
        .build()
        .unwrap();
    chain.try_acquire_n(&"k", 2).unwrap();
    let late = chain.acquire_refundable_timeout(&"k", 2, SECOND).await;
    assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    assert_eq!(chain.stats().cancelled, 1);
    assert_eq!(global.stats().available, 3);
    chain.try_acquire(&"k").unwrap();
}

/// The blocking timeouts too, per algorithm.
#[test]
fn a_blocking_chain_wait_that_times_out_holds_nothing() {
    for algorithm in every(1) {
        let clock = ManualClock::new();
        let wide = manual(resized(algorithm, 3), &clock);
        let chain = Chain::new([manual(algorithm, &clock), wide.clone()]).unwrap();
        chain.try_acquire().unwrap();
        let late = chain.acquire_blocking_refundable_timeout(1, Duration::ZERO);
        assert_eq!(late.unwrap_err(), AcquireError::Timeout, "{algorithm:?}");
        assert_eq!(chain.stats().cancelled, 1);
        assert_eq!(wide.stats().available, 2, "{algorithm:?}");

        let wide = KeyedLimiter::with_clock(resized(algorithm, 3), clock.clone()).unwrap();
        let global = manual(resized(algorithm, 3), &clock);
        let chain = KeyedChain::builder()
            .per_key(KeyedLimiter::with_clock(algorithm, clock.clone()).unwrap())
            .per_key(wide.clone())
            .global(global.clone())
            .build()
            .unwrap();
        chain.try_acquire(&"k").unwrap();
        let late = chain.acquire_blocking_refundable_timeout(&"k", 1, Duration::ZERO);
        assert_eq!(late.unwrap_err(), AcquireError::Timeout, "{algorithm:?}");
        assert_eq!(wide.available(&"k"), 2, "{algorithm:?}");
        assert_eq!(global.stats().available, 2, "{algorithm:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Reconfigurations and resets between the admission and the refund.

/// Per algorithm: a reconfiguration of one member between the admission and the refund voids
/// that member's refund (as for its own receipt), and the other member still gets its permits.
#[test]
fn a_reconfigured_member_gets_nothing_back_and_the_others_get_theirs() {
    for (before, after) in [
        (fixed(4), fixed(5)),
        (counter(4), counter(5)),
        (bucket(4), bucket(5)),
        (sliding(4), sliding(5)),
    ] {
        let clock = ManualClock::new();
        let changed = RateLimiter::builder(before)
            .max_limit(8)
            .clock(clock.clone())
            .build()
            .unwrap();
        let kept = manual(before, &clock);
        let chain = Chain::new([changed.clone(), kept.clone()]).unwrap();
        let taken = chain.try_acquire_refundable(4).unwrap();
        changed.reconfigure(after).unwrap();
        let available = changed.stats().available;
        taken.refund();
        assert_eq!(changed.stats().available, available, "{before:?}");
        assert_eq!(kept.stats().available, 4, "{before:?}");
    }
}

/// The same on a keyed chain, either way round: a reconfigured per-key member, or global
/// member, gets nothing back; so does a per-key member after a reset of any of its keys.
#[test]
fn a_keyed_chain_refund_skips_a_reconfigured_or_reset_member() {
    for (before, after) in [
        (fixed(4), fixed(5)),
        (counter(4), counter(5)),
        (bucket(4), bucket(5)),
        (sliding(4), sliding(5)),
    ] {
        let clock = ManualClock::new();
        let per_key = KeyedLimiter::builder(before)
            .max_limit(8)
            .clock(clock.clone())
            .build()
            .unwrap();
        let global = RateLimiter::builder(before)
            .max_limit(8)
            .clock(clock.clone())
            .build()
            .unwrap();
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .global(global.clone())
            .build()
            .unwrap();

        let taken = chain.try_acquire_refundable(&"a", 2).unwrap();
        per_key.reconfigure(after).unwrap();
        let available = per_key.available(&"a");
        taken.refund();
        assert_eq!(per_key.available(&"a"), available, "{before:?}");
        assert_eq!(global.stats().available, 4, "{before:?}");

        let taken = chain.try_acquire_refundable(&"b", 2).unwrap();
        global.reconfigure(after).unwrap();
        let available = global.stats().available;
        taken.refund();
        assert_eq!(global.stats().available, available, "{before:?}");
        assert_eq!(per_key.available(&"b"), 5, "{before:?}");

        // A reset, on fresh members.
        let per_key = KeyedLimiter::with_clock(before, clock.clone()).unwrap();
        let global = manual(before, &clock);
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .global(global.clone())
            .build()
            .unwrap();
        let taken = chain.try_acquire_refundable(&"c", 1).unwrap();
        per_key.reset(&"unrelated");
        taken.refund();
        assert_eq!(
            per_key.available(&"c"),
            3,
            "{before:?}: refunded across a reset"
        );
        assert_eq!(global.stats().available, 4, "{before:?}");
    }
}

/// A waiting receipt reads the versions at the attempt that admits it: a reconfiguration while
/// it waited leaves its refund whole; one after its admission voids that member's only.
#[tokio::test(start_paused = true)]
async fn a_waiting_chain_receipt_is_voided_only_by_a_reconfiguration_after_its_admission() {
    let a = on_tokio(fixed(1));
    let b = on_tokio(fixed(1));
    let chain = Chain::new([a.clone(), b.clone()]).unwrap();
    chain.try_acquire().unwrap();
    let waiter = tokio::spawn({
        let chain = chain.clone();
        async move { chain.acquire_refundable(1).await }
    });
    tokio::task::yield_now().await;
    a.reconfigure(fixed(1)).unwrap();
    let taken = waiter.await.unwrap().unwrap();
    b.reconfigure(fixed(1)).unwrap();
    taken.refund();
    assert!(
        a.try_acquire().is_ok(),
        "a reconfiguration before the admission voided it"
    );
    assert!(
        b.try_acquire().is_err(),
        "refunded across a reconfiguration"
    );

    let per_key = keyed_on_tokio(fixed(1));
    let global = on_tokio(fixed(1));
    let chain = KeyedChain::builder()
        .per_key(per_key.clone())
        .global(global.clone())
        .build()
        .unwrap();
    chain.try_acquire(&"k").unwrap();
    let waiter = tokio::spawn({
        let chain = chain.clone();
        async move { chain.acquire_refundable(&"k", 1).await }
    });
    tokio::task::yield_now().await;
    per_key.reconfigure(fixed(1)).unwrap();
    per_key.reset(&"other");
    let taken = waiter.await.unwrap().unwrap();
    global.reconfigure(fixed(1)).unwrap();
    taken.refund();
    assert_eq!(
        per_key.available(&"k"),
        1,
        "a reconfiguration or reset before the admission voided it"
    );
    assert!(
        global.try_acquire().is_err(),
        "refunded across a reconfiguration"
    );
}

/// The exact sliding window's admission token keeps only 7 bits of the parameters' version,
/// enough for a chain's own immediate refund, not for a receipt held across 128
/// reconfigurations: the chain's receipt must compare the whole version, as a member's own
/// receipt does. Here the window changes make a later lap's ticket, live, hold exactly the word
/// the refund expects in the refunded ticket's slot; zeroing it would admit a second permit at
/// one instant under a limit of 1. The other member, never reconfigured, gets its permit back.
#[test]
fn a_sliding_window_member_refunded_after_128_reconfigurations_gets_nothing() {
    let window = |secs| Algorithm::SlidingWindow {
        limit: 1,
        window: secs * SECOND,
    };
    let hour = Algorithm::FixedWindow {
        limit: 5,
        window: 3600 * SECOND,
    };
    let clock = ManualClock::new();
    let sliding = manual(window(10), &clock);
    let other = manual(hour, &clock);
    let chain = Chain::new([sliding.clone(), other.clone()]).unwrap();
    let per_key = KeyedLimiter::with_clock(window(10), clock.clone()).unwrap();
    let keyed = KeyedChain::builder()
        .per_key(per_key.clone())
        .global(other.clone())
        .build()
        .unwrap();
    let taken = chain.try_acquire_refundable(1).unwrap(); // ticket 0 at 0 s, expires at 10 s
    let keyed_taken = keyed.try_acquire_refundable(&"k", 1).unwrap();
    clock.advance(10 * SECOND);
    sliding.try_acquire().unwrap(); // ticket 1 at 10 s, expires at 20 s
    per_key.try_acquire(&"k").unwrap();
    clock.advance(10 * SECOND);
    sliding.reconfigure(window(5)).unwrap();
    per_key.reconfigure(window(5)).unwrap();
    sliding.try_acquire().unwrap(); // ticket 2 at 20 s, expires at 25 s: ticket 0's slot and parity
    per_key.try_acquire(&"k").unwrap();
    for _ in 0..126 {
        sliding.reconfigure(window(5)).unwrap();
        per_key.reconfigure(window(5)).unwrap();
    }
    // The 128th: a refund of ticket 0 now expects expiry 0 s + 25 s, ticket 2's.
    sliding.reconfigure(window(25)).unwrap();
    per_key.reconfigure(window(25)).unwrap();
    assert_eq!(other.stats().available, 3);
    taken.refund();
    keyed_taken.refund();
    assert!(
        matches!(sliding.try_acquire(), Err(TryAcquireError::Rejected(_))),
        "a second permit at 20 s under a limit of 1"
    );
    assert!(
        matches!(per_key.try_acquire(&"k"), Err(TryAcquireError::Rejected(_))),
        "a second permit for the key at 20 s under a limit of 1"
    );
    assert_eq!(other.stats().available, 5, "the other member's permits");
}

// ---------------------------------------------------------------------------------------------
// Exactness under chain refunds at any age.

/// One step of [`chain_refunds_keep_what_stays_admitted_exact`].
#[derive(Debug, Clone)]
enum ChainOp {
    /// `Chain::try_acquire_n`, kept for good.
    Take(u32),
    /// `Chain::try_acquire_refundable`, the receipt kept for a later `Refund`.
    Receipt(u32),
    /// The first member's own `try_acquire_refundable`, beside the chain's.
    Own(u32),
    /// A plain `try_acquire_n` on the second member, beside the chain.
    Direct(u32),
    /// Refunds the outstanding receipt at this index (modulo their number), whatever its age.
    Refund(usize),
    /// Moves the clock on, by milliseconds (windows are 10 s).
    Advance(u64),
    /// Reconfigures the first member (or the second) to its own parameters: a new version.
    Reconfigure(bool),
}

fn chain_op(limit: u32) -> impl Strategy<Value = ChainOp> {
    prop_oneof![
        2 => (1..=limit).prop_map(ChainOp::Take),
        4 => (1..=limit).prop_map(ChainOp::Receipt),
        2 => (1..=limit).prop_map(ChainOp::Own),
        2 => (1..=limit).prop_map(ChainOp::Direct),
        4 => any::<usize>().prop_map(ChainOp::Refund),
        2 => (0u64..3_000).prop_map(ChainOp::Advance),
        1 => (3_000u64..25_000).prop_map(ChainOp::Advance),
        1 => any::<bool>().prop_map(ChainOp::Reconfigure),
    ]
}

/// An admission as `(time, permits)`, `None` once refunded.
type Entry = Option<(u64, u64)>;

/// A receipt and the audit entries (first member's, second member's) its refund takes back.
enum Held {
    Chain(
        turnstile::ChainRefundable<ManualClock>,
        Vec<usize>,
        Vec<usize>,
    ),
    Own(turnstile::Refundable<ManualClock>, usize),
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// A chain of two members of one algorithm (the first listed once or twice), with chain
    /// calls plain and refundable, the first member's own receipts and plain calls on the
    /// second beside them, refunds at any age, clock advances and reconfigurations of either
    /// member: the admissions each member keeps (never refunded) satisfy the algorithm's
    /// exactness audit. A chain receipt's refund gives each listing of a member back its own
    /// admission, never more, and never one a reconfiguration voided.
    #[test]
    fn chain_refunds_keep_what_stays_admitted_exact(
        kind in 0u8..4,
        (first, second) in (1u32..=4, 1u32..=4),
        twice in any::<bool>(),
        ops in proptest::collection::vec(chain_op(4), 1..100),
    ) {
        let of = |limit| of_kind(kind, limit);
        let clock = ManualClock::new();
        let (a, b) = (manual(of(first), &clock), manual(of(second), &clock));
        let listed = if twice { 2 } else { 1 };
        let mut members = vec![a.clone(); listed];
        members.push(b.clone());
        let chain = Chain::new(members).unwrap();
        // Per member: (time, permits) of every admission, None once refunded.
        let (mut on_a, mut on_b): (Vec<Entry>, Vec<Entry>) = (Vec::new(), Vec::new());
        let mut held: Vec<Held> = Vec::new();
        for op in &ops {
            let now = clock.elapsed().as_nanos() as u64;
            let record = |on: &mut Vec<Entry>, n: u32, times: usize| {
                (0..times)
                    .map(|_| {
                        on.push(Some((now, u64::from(n))));
                        on.len() - 1
                    })
                    .collect::<Vec<_>>()
            };
            match *op {
                ChainOp::Take(n) => {
                    if chain.try_acquire_n(n).is_ok() {
                        record(&mut on_a, n, listed);
                        record(&mut on_b, n, 1);
                    }
                }
                ChainOp::Receipt(n) => {
                    if let Ok(r) = chain.try_acquire_refundable(n) {
                        let at_a = record(&mut on_a, n, listed);
                        let at_b = record(&mut on_b, n, 1);
                        held.push(Held::Chain(r, at_a, at_b));
                    }
                }
                ChainOp::Own(n) => {
                    if let Ok(r) = a.try_acquire_refundable(n) {
                        let at = record(&mut on_a, n, 1)[0];
                        held.push(Held::Own(r, at));
                    }
                }
                ChainOp::Direct(n) => {
                    if b.try_acquire_n(n).is_ok() {
                        record(&mut on_b, n, 1);
                    }
                }
                ChainOp::Refund(i) if !held.is_empty() => {
                    match held.swap_remove(i % held.len()) {
                        Held::Chain(r, at_a, at_b) => {
                            r.refund();
                            at_a.into_iter().for_each(|i| on_a[i] = None);
                            at_b.into_iter().for_each(|i| on_b[i] = None);
                        }
                        Held::Own(r, at) => {
                            r.refund();
                            on_a[at] = None;
                        }
                    }
                }
                ChainOp::Refund(_) => {}
                ChainOp::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                ChainOp::Reconfigure(which) => {
                    let (member, limit) = if which { (&a, first) } else { (&b, second) };
                    member.reconfigure(of(limit)).unwrap();
                }
            }
        }
        let kept = |on: &[Entry]| on.iter().flatten().copied().collect::<Vec<_>>();
        prop_assert_eq!(common::violations(of(first), &kept(&on_a)), 0, "first member");
        prop_assert_eq!(common::violations(of(second), &kept(&on_b)), 0, "second member");
    }
}

#[derive(Debug, Clone)]
enum KeyedOp {
    /// A plain `try_acquire_n` of the keyed chain for key `.0`.
    Take(u8, u32),
    /// A `try_acquire_refundable` of the keyed chain, its receipt kept.
    Receipt(u8, u32),
    /// The per-key member's own receipt for key `.0`.
    Own(u8, u32),
    /// A plain `try_acquire_n` on the global member, beside the chain.
    Global(u32),
    /// Refunds the outstanding receipt at this index (modulo their number), whatever its age.
    Refund(usize),
    /// Moves the clock on, by milliseconds (windows are 10 s).
    Advance(u64),
    /// A sweep of the per-key member (evicts its idle keys).
    Sweep,
    /// A reset of one key of the per-key member (it voids every outstanding keyed refund).
    Reset(u8),
    /// Reconfigures the per-key member (or the global one) to its own parameters.
    Reconfigure(bool),
}

fn keyed_op(limit: u32) -> impl Strategy<Value = KeyedOp> {
    prop_oneof![
        2 => (0u8..3, 1..=limit).prop_map(|(k, n)| KeyedOp::Take(k, n)),
        4 => (0u8..3, 1..=limit).prop_map(|(k, n)| KeyedOp::Receipt(k, n)),
        2 => (0u8..3, 1..=limit).prop_map(|(k, n)| KeyedOp::Own(k, n)),
        1 => (1..=limit).prop_map(KeyedOp::Global),
        4 => any::<usize>().prop_map(KeyedOp::Refund),
        2 => (0u64..3_000).prop_map(KeyedOp::Advance),
        1 => (3_000u64..25_000).prop_map(KeyedOp::Advance),
        1 => Just(KeyedOp::Sweep),
        1 => (0u8..3).prop_map(KeyedOp::Reset),
        1 => any::<bool>().prop_map(KeyedOp::Reconfigure),
    ]
}

/// Records a keyed chain's admission of `n` for `key` at `now`: one entry per listing of the
/// per-key member, one on the global member. Returns where, for a receipt's refund.
fn record(
    on_key: &mut [Vec<Entry>; 3],
    on_global: &mut Vec<Entry>,
    listed: usize,
    key: u8,
    (now, n): (u64, u32),
) -> (Vec<(u8, usize)>, Vec<usize>) {
    let on = &mut on_key[usize::from(key)];
    let at_key = (0..listed)
        .map(|_| {
            on.push(Some((now, u64::from(n))));
            (key, on.len() - 1)
        })
        .collect();
    on_global.push(Some((now, u64::from(n))));
    (at_key, vec![on_global.len() - 1])
}

/// An outstanding receipt's refund, and the audit entries it takes back: per key on the
/// per-key member (one per listing), and on the global member.
type KeyedHeld = (Box<dyn FnOnce()>, Vec<(u8, usize)>, Vec<usize>);

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// `chain_refunds_keep_what_stays_admitted_exact` for a keyed chain: a per-key member
    /// (listed once or twice) and a global one, with chain calls plain and refundable on three
    /// keys, the per-key member's own receipts and plain calls on the global member beside
    /// them, refunds at any age, clock advances, sweeps that evict idle keys (a refund then
    /// finds the key's cell made again, or none), resets of a key (which void the per-key
    /// member's outstanding refunds) and reconfigurations of either member. The admissions each
    /// member keeps satisfy the algorithm's exactness audit: per key on the per-key member (its
    /// admissions before a reset of the key audited apart, since the reset forgets them), and
    /// over every call on the global member.
    #[test]
    fn keyed_chain_refunds_keep_what_stays_admitted_exact(
        kind in 0u8..4,
        (first, second) in (1u32..=4, 1u32..=6),
        twice in any::<bool>(),
        ops in proptest::collection::vec(keyed_op(4), 1..120),
    ) {
        let of = |limit| of_kind(kind, limit);
        let clock = ManualClock::new();
        let per_key: KeyedLimiter<u8, ManualClock> =
            KeyedLimiter::with_clock(of(first), clock.clone()).unwrap();
        let global = manual(of(second), &clock);
        let listed = if twice { 2 } else { 1 };
        let mut builder = KeyedChain::builder().per_key(per_key.clone());
        if twice {
            builder = builder.per_key(per_key.clone());
        }
        let chain = builder.global(global.clone()).build().unwrap();
        // Per key, then the global member: (time, permits) of every admission, None once
        // refunded; a key's admissions before a reset are moved to `forgotten`.
        let mut on_key: [Vec<Entry>; 3] = Default::default();
        let mut on_global: Vec<Entry> = Vec::new();
        let mut forgotten: Vec<Vec<Entry>> = Vec::new();
        let mut held: Vec<KeyedHeld> = Vec::new();
        for op in &ops {
            let now = clock.elapsed().as_nanos() as u64;
            match *op {
                KeyedOp::Take(key, n) => {
                    if chain.try_acquire_n(&key, n).is_ok() {
                        record(&mut on_key, &mut on_global, listed, key, (now, n));
                    }
                }
                KeyedOp::Receipt(key, n) => {
                    if let Ok(r) = chain.try_acquire_refundable(&key, n) {
                        let (at_key, at_global) =
                            record(&mut on_key, &mut on_global, listed, key, (now, n));
                        held.push((Box::new(move || r.refund()), at_key, at_global));
                    }
                }
                KeyedOp::Own(key, n) => {
                    if let Ok(r) = per_key.try_acquire_refundable(&key, n) {
                        let on = &mut on_key[usize::from(key)];
                        on.push(Some((now, u64::from(n))));
                        held.push((Box::new(move || r.refund()), vec![(key, on.len() - 1)], vec![]));
                    }
                }
                KeyedOp::Global(n) => {
                    if global.try_acquire_n(n).is_ok() {
                        on_global.push(Some((now, u64::from(n))));
                    }
                }
                KeyedOp::Refund(i) if !held.is_empty() => {
                    let (refund, at_key, at_global) = held.swap_remove(i % held.len());
                    refund();
                    at_key.into_iter().for_each(|(k, i)| on_key[usize::from(k)][i] = None);
                    at_global.into_iter().for_each(|i| on_global[i] = None);
                }
                KeyedOp::Refund(_) => {}
                KeyedOp::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                KeyedOp::Sweep => {
                    per_key.sweep();
                }
                KeyedOp::Reset(key) => {
                    per_key.reset(&key);
                    let on = &mut on_key[usize::from(key)];
                    forgotten.push(std::mem::replace(on, vec![None; on.len()]));
                }
                KeyedOp::Reconfigure(which) => {
                    if which {
                        per_key.reconfigure(of(first)).unwrap();
                    } else {
                        global.reconfigure(of(second)).unwrap();
                    }
                }
            }
        }
        let kept = |on: &[Entry]| on.iter().flatten().copied().collect::<Vec<_>>();
        for (key, on) in on_key.iter().enumerate() {
            prop_assert_eq!(common::violations(of(first), &kept(on)), 0, "key {}", key);
        }
        for on in &forgotten {
            prop_assert_eq!(common::violations(of(first), &kept(on)), 0, "before a reset");
        }
        prop_assert_eq!(common::violations(of(second), &kept(&on_global)), 0, "global member");
    }
}
