//! Loom models of reconfiguration (`RateLimiter::reconfigure`, `src/sync.rs` `Params`).
//!
//! Protocols checked:
//! - **The parameter seqlock** (`Params`): a writer (serialised by the limiter's mutex) makes the
//!   version odd, `fence(Release)`, stores the words Relaxed, makes the version even with
//!   Release; a reader loads the version (Acquire), the words (Relaxed), `fence(Acquire)`, the
//!   version again, and retries unless both are the same even number. `snapshots_are_never_torn`
//!   observes the snapshot through a probe's `remaining` and `reset_after`, which come from two
//!   different words (the limit and the window grid): a torn read would pair one set's limit
//!   with the other's window. A writer whose clock panics between the two abandons the
//!   replacement, republishing the words it found:
//!   `a_reconfiguration_whose_clock_panics_leaves_the_old_parameters` (a reader spun for good on
//!   the odd version before).
//! - **Deciding under one set, re-checking before the CAS**: a call re-checks the version just
//!   before its CAS and decides again if it moved. A call that loads a cell word written under
//!   newer parameters sees their version by coherence (the writer loaded them with Acquire before
//!   its Release CAS, and we load the word with Acquire), so it cannot add its stale decision on
//!   top of a newer one. `no_over_admission_after_lowering` fails without that re-check (a
//!   stale limit of 2 admits on top of the count 1 written under the new limit of 1).
//! - **Token bucket epochs**: parameters are published with a flipped epoch bit, then the
//!   reconfigure translates every word; a caller meeting an old-epoch word translates it in its
//!   own CAS. `bucket_translation_races_admissions` checks that the translation (by either) and
//!   admissions never lose or double a debt; `bucket_lazy_translation` fails if a caller uses an
//!   old-epoch word untranslated.
//! - **Sliding window ring larger than the limit**: `sliding_raise_within_capacity` raises the
//!   limit of a ring with spare slots while claims race, checking the log bound.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom
//! cargo test --release -p turnstile-loom-tests --test loom_reconfigure`
#![cfg(turnstile_loom)]

mod common;
use common::{model, model_capped};

use loom::thread;
use std::time::Duration;
use turnstile::{
    Algorithm, Chain, Clock, KeyedLimiter, ManualClock, Rate, RateLimiter, TryAcquireError,
};

type Limiter = RateLimiter<ManualClock>;

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

fn fixed(limit: u32, window: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window: ns(window),
    }
}

fn limiter(algorithm: Algorithm) -> Limiter {
    RateLimiter::with_clock(algorithm, ManualClock::new()).unwrap()
}

/// A probe racing a reconfiguration sees one parameter set or the other, never a mix.
#[test]
fn snapshots_are_never_torn() {
    model(|| {
        let l = limiter(fixed(1, 10));
        let reader = {
            let l = l.clone();
            thread::spawn(move || {
                let probe = l.try_acquire_n(0).unwrap();
                (probe.remaining(), probe.reset_after().as_nanos() as u64)
            })
        };
        l.reconfigure(fixed(3, 1000)).unwrap();
        let seen = reader.join().unwrap();
        // Window [0, 10) is young enough to keep its start: it becomes [0, 1000).
        assert!(seen == (1, 10) || seen == (3, 1000), "torn: {seen:?}");
        let after = l.try_acquire_n(0).unwrap();
        assert_eq!(
            (after.remaining(), after.reset_after().as_nanos() as u64),
            (3, 1000)
        );
    });
}

/// Limit 2 lowered to 1. One call races the reconfiguration; another starts after it returned.
/// The later call is decided under limit 1, and the racing one cannot add a permit on top of it
/// with its stale limit of 2: at most one of the two is admitted.
#[test]
fn no_over_admission_after_lowering() {
    model(|| {
        let l = limiter(fixed(2, 10));
        let racer = {
            let l = l.clone();
            thread::spawn(move || l.try_acquire().is_ok())
        };
        l.reconfigure(fixed(1, 10)).unwrap();
        let late = l.try_acquire().is_ok();
        let early = racer.join().unwrap();
        assert!(
            u32::from(early) + u32::from(late) <= 1,
            "both admitted across a lowering"
        );
        assert_eq!(l.stats().available, 0);
        assert_eq!(l.stats().admitted, u64::from(early) + u64::from(late));
    });
}

/// Raising a sliding counter's limit while a call races it and another starts after it: never
/// more than the new limit, and the count is never lost (a later probe sees every admission).
#[test]
fn raise_keeps_the_count() {
    model(|| {
        let counter = |limit| Algorithm::SlidingCounter {
            limit,
            window: ns(10),
        };
        let l = limiter(counter(1));
        let racer = {
            let l = l.clone();
            thread::spawn(move || l.try_acquire().is_ok())
        };
        l.reconfigure(counter(2)).unwrap();
        let late = l.try_acquire().is_ok();
        let admitted = u32::from(racer.join().unwrap()) + u32::from(late);
        assert!(late, "a limit of 2 has room after at most one admission");
        assert!((1..=2).contains(&admitted));
        assert_eq!(l.stats().available, 2 - admitted);
    });
}

/// Burst 2 at one permit per 16 ns, halved to one per 32 ns (same burst: the fullness, and so
/// the permit count, carries over; powers of two keep the divisor's multiplier words unchanged,
/// which keeps the model small). One call takes the whole burst while the reconfiguration
/// publishes and translates; another starts after it. At one instant no more than the burst is
/// ever admitted, and what is left afterwards is exactly the burst minus what was taken.
///
/// Preemptions capped at 2 (`LOOM_MAX_PREEMPTIONS=2`, the architecture's standard run): the
/// reconfiguration's publication and translation loop racing two admissions made CI's bound of
/// 3 take over a minute (four under a loaded machine). The model is otherwise unchanged. The
/// race it exists for needs one preemption, the racer's CAS landing between the translation's
/// load and its write: a translation that stores its word instead of swapping it in (losing
/// that debt) still fails it at this bound.
#[test]
fn bucket_translation_races_admissions() {
    model_capped(2, || {
        let bucket = |period| Algorithm::TokenBucket {
            rate: Rate::new(1, ns(period)),
            burst: 2,
        };
        let l = limiter(bucket(16));
        let racer = {
            let l = l.clone();
            thread::spawn(move || if l.try_acquire_n(2).is_ok() { 2 } else { 0 })
        };
        l.reconfigure(bucket(32)).unwrap();
        let late = match l.try_acquire() {
            Ok(_) => 1,
            Err(TryAcquireError::Rejected(_)) => 0,
            Err(e) => panic!("{e}"),
        };
        let taken = racer.join().unwrap() + late;
        assert!(taken <= 2, "{taken} permits from a burst of 2");
        assert_eq!(l.stats().available, 2 - taken);
        // One new interval (32 ns) later exactly one more permit has accrued.
        l.clock().advance(ns(32));
        assert_eq!(l.stats().available, (3 - taken).min(2));
    });
}

/// An empty bucket stays empty through a rate change, whoever translates its word: a call racing
/// the reconfiguration may meet the word between the publication of the new parameters and the
/// reconfigure's sweep, and must translate it itself (reading the old arrival time under the new
/// interval would hand out a permit).
#[test]
fn bucket_lazy_translation() {
    model(|| {
        let bucket = |period| Algorithm::TokenBucket {
            rate: Rate::new(1, ns(period)),
            burst: 2,
        };
        let l = limiter(bucket(16));
        l.try_acquire_n(2).unwrap();
        let racer = {
            let l = l.clone();
            thread::spawn(move || l.try_acquire().is_ok())
        };
        l.reconfigure(bucket(32)).unwrap();
        assert!(
            !racer.join().unwrap(),
            "an empty bucket handed out a permit"
        );
        assert_eq!(l.stats().available, 0);
    });
}

/// A ring of 2 slots running limit 1, raised to 2 while calls race and the clock moves past the
/// window: every window-long interval holds at most 2 admissions, and at most 1 before the
/// raise could have been seen.
#[test]
fn sliding_raise_within_capacity() {
    model(|| {
        let sliding = |limit| Algorithm::SlidingWindow {
            limit,
            window: ns(10),
        };
        let l = RateLimiter::builder(sliding(1))
            .clock(ManualClock::new())
            .max_limit(2)
            .build()
            .unwrap();
        l.try_acquire().unwrap();
        let racer = {
            let l = l.clone();
            thread::spawn(move || {
                l.clock().advance(ns(10));
                l.try_acquire().ok().map(|a| a.at_nanos())
            })
        };
        l.reconfigure(sliding(2)).unwrap();
        let mine = l.try_acquire().ok().map(|a| a.at_nanos());
        let theirs = racer.join().unwrap();
        let mut times: Vec<u64> = [Some(0), mine, theirs].into_iter().flatten().collect();
        times.sort_unstable();
        for (i, &t) in times.iter().enumerate() {
            let within = times[i..].iter().filter(|&&u| u < t + 10).count();
            assert!(within <= 2, "{times:?}");
        }
        let now = l.clock().now();
        assert!(now == 10);
    });
}

/// A receipt's refund (`Refundable::refund`) racing a reconfiguration, to the same parameters
/// (a new version all the same): the receipt compares the version it read before its admission
/// with the current one under the reconfiguration mutex, so the refund either lands before the
/// reconfiguration (the permit is free after both) or gives nothing; in neither order is a
/// second permit admitted under a limit of 1 within the window, and neither side blocks the
/// other for good.
#[test]
fn receipt_refund_races_reconfigure() {
    model(|| {
        let l = limiter(fixed(1, 10));
        let taken = l.try_acquire_refundable(1).unwrap();
        let reconfigurer = {
            let l = l.clone();
            thread::spawn(move || l.reconfigure(fixed(1, 10)).unwrap())
        };
        taken.refund();
        reconfigurer.join().unwrap();
        // Free if the refund came first, taken still otherwise: one permit at most.
        let _ = l.try_acquire();
        assert!(l.try_acquire().is_err(), "two permits under a limit of 1");
    });
}

/// A chain receipt's refund (`ChainRefundable::refund`) racing a reconfiguration of one member:
/// the refund runs each member's own receipt refund in turn, so the reconfigured member either
/// gets its permit back before the reconfiguration or nothing, while the other member, never
/// reconfigured, always gets its permit back. Neither member ever admits a second permit under
/// its limit of 1, and neither side blocks the other for good.
#[test]
fn chain_receipt_refund_races_reconfigure() {
    model(|| {
        let changed = limiter(fixed(1, 10));
        let kept = limiter(fixed(1, 10));
        let chain = Chain::new([changed.clone(), kept.clone()]).unwrap();
        let taken = chain.try_acquire_refundable(1).unwrap();
        let reconfigurer = {
            let changed = changed.clone();
            thread::spawn(move || changed.reconfigure(fixed(1, 10)).unwrap())
        };
        taken.refund();
        reconfigurer.join().unwrap();
        let _ = changed.try_acquire();
        assert!(
            changed.try_acquire().is_err(),
            "two permits under a limit of 1"
        );
        assert!(
            kept.try_acquire().is_ok(),
            "the other member's refund was lost"
        );
        assert!(
            kept.try_acquire().is_err(),
            "two permits under a limit of 1"
        );
    });
}

/// Polls a waiter once on the calling thread, with a no-op waker.
fn poll_once<F: std::future::Future + ?Sized>(
    future: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// The same for a receipt the queue's head made (`acquire_refundable`): the head, queued
/// behind a receipt that is then refunded, makes its attempt (the version read, then the
/// decision, under the queue's mutex) while a reconfiguration to the same parameters runs. Its
/// receipt was read under the version of its decision or an earlier one, so its refund either
/// gives the permit back or gives nothing: never a second permit under a limit of 1, and the
/// head is served whatever the order (the reconfiguration's sweep only wakes it).
#[test]
fn queue_served_receipt_races_reconfigure() {
    model(|| {
        let rt = common::paused_runtime();
        let _entered = rt.enter();
        let l = limiter(fixed(1, 10));
        let first = l.try_acquire_refundable(1).unwrap();
        let mut waiter = Box::pin(l.acquire_refundable(1));
        assert!(poll_once(waiter.as_mut()).is_pending(), "the head waits");
        first.refund();
        let reconfigurer = {
            let l = l.clone();
            thread::spawn(move || l.reconfigure(fixed(1, 10)).unwrap())
        };
        let std::task::Poll::Ready(taken) = poll_once(waiter.as_mut()) else {
            panic!("the head was not served once the permit came back");
        };
        let taken = taken.unwrap();
        reconfigurer.join().unwrap();
        taken.refund();
        let _ = l.try_acquire();
        assert!(l.try_acquire().is_err(), "two permits under a limit of 1");
    });
}

/// The same on a key's queue, where the head's attempt is a chain member's commit (the version,
/// then the limiter's reset count, then the key's cell) racing a reconfiguration.
#[test]
fn keyed_queue_served_receipt_races_reconfigure() {
    model(|| {
        let rt = common::paused_runtime();
        let _entered = rt.enter();
        let l = KeyedLimiter::with_clock(fixed(1, 10), ManualClock::new()).unwrap();
        let first = l.try_acquire_refundable(&1u8, 1).unwrap();
        let mut waiter = Box::pin(l.acquire_refundable(&1u8, 1));
        assert!(poll_once(waiter.as_mut()).is_pending(), "the head waits");
        first.refund();
        let reconfigurer = {
            let l = l.clone();
            thread::spawn(move || l.reconfigure(fixed(1, 10)).unwrap())
        };
        let std::task::Poll::Ready(taken) = poll_once(waiter.as_mut()) else {
            panic!("the head was not served once the permit came back");
        };
        let taken = taken.unwrap();
        reconfigurer.join().unwrap();
        drop(waiter);
        taken.refund();
        let _ = l.try_acquire(&1);
        assert!(l.try_acquire(&1).is_err(), "two permits under a limit of 1");
    });
}

loom::thread_local! {
    /// Whether `FailingClock` panics when read on this model thread.
    static CLOCK_FAILS: std::cell::Cell<bool> = std::cell::Cell::new(false);
}

/// A manual clock whose readings panic on a model thread that asked for it (the caller's own
/// `Clock`, which may fail).
#[derive(Clone, Default)]
struct FailingClock(ManualClock);

impl Clock for FailingClock {
    fn now(&self) -> u64 {
        if CLOCK_FAILS.with(|fails| fails.get()) {
            panic!("the clock failed");
        }
        self.0.now()
    }
}

/// A reconfiguration whose clock panics between closing the old parameters and publishing the
/// new ones (`Params::begin` … `Writing::finish`) abandons the replacement as it unwinds: a call
/// racing it is decided under the old parameters (it never spins on an odd version for good:
/// loom would report the spin), and so is every later call.
#[test]
fn a_reconfiguration_whose_clock_panics_leaves_the_old_parameters() {
    model(|| {
        let l = RateLimiter::with_clock(fixed(1, 10), FailingClock::default()).unwrap();
        let racer = {
            let l = l.clone();
            thread::spawn(move || l.try_acquire_n(0).unwrap().remaining())
        };
        CLOCK_FAILS.with(|fails| fails.set(true));
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.reconfigure(fixed(3, 10))));
        CLOCK_FAILS.with(|fails| fails.set(false));
        assert!(outcome.is_err());
        assert_eq!(racer.join().unwrap(), 1);
        assert_eq!(l.try_acquire_n(0).unwrap().remaining(), 1);
        // (Not `algorithm()`: under loom its mutex, poisoned by the panic, panics when locked.)
    });
}
