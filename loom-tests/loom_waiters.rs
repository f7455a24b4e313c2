//! Loom model of the waiter protocol (`src/queue.rs`, `src/concurrency.rs`).
//!
//! Protocol: waiters sit in a queue under a mutex that only the slow path takes; only the **head**
//! tries to take permits, itself, under that mutex, and registers its waker (task waker or thread
//! signal) in the same critical section when it is blocked. The gate bits `WAITERS` and `CLOSED`
//! live in the concurrency limiter's permit word (a rate limiter has a separate gate word). The
//! queue sets `WAITERS` under the mutex when the first waiter arrives and clears it when the last
//! one leaves. A release is one `fetch_sub` (Release) on the permit word; if the value it replaced
//! had `WAITERS`, it takes the mutex and wakes the head. A head that leaves (served, cancelled,
//! failed) wakes the next head (a served or cancelled one only if the next head's permits are
//! free then: otherwise the release that frees them does). Permits are never handed to a waiter
//! that is not running, so a dropped waiter holds nothing and cancelling is "remove my entry; if
//! I was the head, wake the next". `close` sets `CLOSED`, fails every waiter and wakes them; later enqueues fail at once.
//! Under loom a blocking waiter sleeps on a `Mutex` + `Condvar` (so a lost wake-up is a deadlock
//! that loom reports), and a wait for time just yields.
//!
//! The models use the public API only: `ConcurrencyLimiter` (limit 1 or 2) with `try_acquire`,
//! `acquire_blocking`, `acquire_owned` futures polled by hand with a no-op waker or driven by a
//! `block_on` whose waker is a loom `Mutex` + `Condvar`, `close`, `available` and `stats`; and a
//! fixed-window `RateLimiter` on a `ManualClock` for a blocking head that waits for time. Each
//! model has at most two threads besides the main one. They assert:
//! - no lost wake-up: every blocking waiter and every `block_on` future that can be served returns
//!   (a lost release wake-up or a lost promotion is a loom deadlock), whether the release comes
//!   before, during or after its enqueue, whether the head ahead of it is served or cancelled, and
//!   when a head short of permits needs a second release;
//! - no permit lost or duplicated: when everyone is done, `available() == limit`; while a waiter
//!   holds all the permits nobody else does (`available()` reads 0), an in-flight counter never
//!   exceeds the limit, and a holder's non-atomic writes happen before the next holder's accesses
//!   (a loom `UnsafeCell` handed from holder to holder through the permit word reports any race);
//! - cancel safety: a queued future dropped while a release races with it (or with its last poll)
//!   is counted exactly once (admitted if its poll took the permit, cancelled otherwise), leaves
//!   the queue empty and leaves no stale `WAITERS` bit (a later `try_acquire_n(limit)` succeeds
//!   under oldest-first order, which would refuse while `WAITERS` is set);
//! - no barging: under oldest-first order `try_acquire` fails while a waiter is queued, even when
//!   permits are free;
//! - close vs enqueue: a waiter racing with `close` returns `Err(Closed)` (or, if a release let it
//!   in first, its permit), never hangs; every later call fails `Closed`; a blocking waiter whose
//!   deadline passes as the close lands answers what `stats()` counts (`Closed`, rejected, or
//!   `Timeout`, cancelled);
//! - newest-first eviction vs cancel: a waiter evicted by a newer one (woken to see
//!   `QueueFull`; rejected even if dropped before it looks), cancelled, or served is counted
//!   once, and the newer waiter is served;
//! - the lock-free release path: racing `try_acquire` + drop never puts more than `limit` permits
//!   in flight, admits when capacity provably exists, and gives every permit back;
//! - a rate limiter's head waiting for time is served once another thread moves the clock (at a
//!   time in the new window), and is failed `Closed` by a racing `close`;
//! - racing reconfigurations of a rate limiter never fail a waiter for a capacity that was
//!   superseded before it started (each sweep of the queue runs under the reconfiguring mutex);
//! - a request that a racing `set_limit` makes too big fails `InsufficientCapacity` however its
//!   fast path, the sweep and its enqueue interleave, and never waits behind the head;
//! - in every model, `stats()` adds up: admitted + rejected + cancelled equals the calls made, and
//!   `waiting` and `queued_permits` are 0 at the end.
//!
//! A model that finds a lost wake-up fails with loom's "deadlock" panic; unwinding then drops loom
//! objects outside the model, so the test binary aborts right after printing it.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p turnstile-loom-tests --test loom_waiters`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::thread;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use turnstile::{
    AcquireError, Algorithm, ConcurrencyLimiter, ManualClock, QueueOrder, RateLimiter,
    TryAcquireError, TryPermitError,
};

/// Polls `future` once with a waker that does nothing (the caller polls again or drops it).
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// A task waker whose wake sets a flag under a loom `Mutex` and signals a loom `Condvar`, so
/// that a task waiting for a wake-up that never comes is a deadlock loom reports.
struct Notified {
    woken: loom::sync::Mutex<bool>,
    changed: loom::sync::Condvar,
}

impl std::task::Wake for Notified {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        *self.woken.lock().unwrap() = true;
        self.changed.notify_one();
    }
}

/// Drives `future` to completion on the calling model thread, sleeping between polls until its
/// waker is woken (what `loom::future::block_on` does, without needing loom's `futures` feature).
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let notified = std::sync::Arc::new(Notified {
        woken: loom::sync::Mutex::new(false),
        changed: loom::sync::Condvar::new(),
    });
    let waker = Waker::from(std::sync::Arc::clone(&notified));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        let mut woken = notified.woken.lock().unwrap();
        while !*woken {
            woken = notified.changed.wait(woken).unwrap();
        }
        *woken = false;
    }
}

/// Data that only a permit holder of a limit-1 limiter touches. Loom reports a race if one
/// holder's write does not happen before the next holder's access.
#[derive(Clone)]
struct Guarded(Arc<UnsafeCell<u32>>);

impl Guarded {
    fn new() -> Self {
        Guarded(Arc::new(UnsafeCell::new(0)))
    }

    /// Increments the value; the caller must hold the limit-1 limiter's permit (or have joined
    /// every other thread).
    fn bump(&self) {
        // SAFETY: the permit (or a join) gives exclusive access; loom checks exactly that.
        self.0.with_mut(|p| unsafe { *p += 1 });
    }

    fn get(&self) -> u32 {
        // SAFETY: as in `bump`.
        self.0.with(|p| unsafe { *p })
    }
}

/// Checks the end state of a concurrency limiter after every thread is joined and every permit
/// dropped: all permits back, nobody queued, each of the `calls` acquisition calls counted once;
/// then (unless closed) that no stale `WAITERS` bit blocks an oldest-first `try_acquire`.
fn assert_idle(l: &ConcurrencyLimiter, calls: u64) {
    let s = l.stats();
    assert_eq!(s.available, l.limit(), "permit lost or duplicated: {s:?}");
    assert_eq!(l.available(), l.limit(), "permit lost or duplicated");
    assert_eq!(
        (s.waiting, s.queued_permits),
        (0, 0),
        "queue not empty: {s:?}"
    );
    assert_eq!(
        s.admitted + s.rejected + s.cancelled,
        calls,
        "stats vs calls: {s:?}"
    );
    if !l.is_closed() {
        let all = l
            .try_acquire_n(l.limit())
            .expect("every permit free and nobody queued, yet try_acquire fails: stale WAITERS");
        drop(all);
        assert_eq!(l.available(), l.limit());
    }
}

// ---------------------------------------------------------------------------------------------
// Enqueue vs release: no lost wake-up.
// ---------------------------------------------------------------------------------------------

/// Limit 1, the permit held by the main thread. A thread calls `acquire_blocking` (fast path, or
/// enqueue and sleep) while the main thread writes the guarded data and drops the permit. The
/// waiter must return with the permit whatever the interleaving (a lost wake-up deadlocks), own
/// it alone, and see the previous holder's write.
#[test]
fn release_vs_blocking_enqueue() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let data = Guarded::new();
        let held = l.try_acquire_owned(1).unwrap();
        let waiter = {
            let (l, data) = (l.clone(), data.clone());
            thread::spawn(move || {
                let permit = l.acquire_blocking().expect("a release is coming");
                assert_eq!(l.available(), 0, "permit duplicated");
                data.bump();
                drop(permit);
            })
        };
        data.bump();
        drop(held);
        waiter.join().unwrap();
        assert_eq!(data.get(), 2);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (2, 0, 0), "{s:?}");
        assert_idle(&l, 2);
    });
}

/// Limit 1, held by the main thread; two blocking waiters race to enqueue while the main thread
/// releases. The release wakes the head; the head, when served, hands the turn to the next
/// (each waiter releases when done). Both must be served, one at a time, in happens-before order.
#[test]
fn release_wakes_head_then_head_wakes_next() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let data = Guarded::new();
        let held = l.try_acquire_owned(1).unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (l, data) = (l.clone(), data.clone());
                thread::spawn(move || {
                    let permit = l.acquire_blocking().expect("a release is coming");
                    assert_eq!(l.available(), 0, "permit duplicated");
                    data.bump();
                    drop(permit);
                })
            })
            .collect();
        data.bump();
        drop(held);
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(data.get(), 3);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (3, 0, 0), "{s:?}");
        assert_idle(&l, 3);
    });
}

/// Limit 2, both permits held by the main thread; a blocking waiter wants both. One thread
/// releases one permit while the main thread releases the other: the head, still short after the
/// first release, must be woken again by the second (each release wakes the head, not just the
/// one that makes it fit) and take both at once.
#[test]
fn head_short_of_permits_is_woken_by_each_release() {
    model(|| {
        let l = ConcurrencyLimiter::new(2).unwrap();
        let first = l.try_acquire_owned(1).unwrap();
        let second = l.try_acquire_owned(1).unwrap();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || {
                let permit = l.acquire_blocking_n(2).expect("two releases are coming");
                assert_eq!(l.available(), 0, "permit duplicated");
                drop(permit);
            })
        };
        let releaser = thread::spawn(move || drop(first));
        drop(second);
        releaser.join().unwrap();
        waiter.join().unwrap();
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (3, 0, 0), "{s:?}");
        assert_idle(&l, 3);
    });
}

/// Limit 2, both permits held by the main thread; two async waiters of one permit queued by
/// hand. A served head wakes the next head only if a permit is free for it then (`Room`): here
/// the head is served (in its own thread) on the main thread's release while a third thread
/// releases the other permit. Either the served head sees that release and wakes the next, or
/// the release comes after its look, sees `WAITERS` and wakes the next head itself: the next
/// head (the main thread, asleep in `block_on`) must be served, never left asleep with a permit
/// free.
#[test]
fn served_head_leaves_the_next_asleep_vs_release() {
    model(|| {
        let l = ConcurrencyLimiter::new(2).unwrap();
        let first = l.try_acquire_owned(1).unwrap();
        let second = l.try_acquire_owned(1).unwrap();
        let mut head = Box::pin(l.acquire_owned(1));
        let mut next = Box::pin(l.acquire_owned(1));
        assert!(poll_once(head.as_mut()).is_pending());
        assert!(poll_once(next.as_mut()).is_pending());
        let served = thread::spawn(move || block_on(head).expect("a release is coming"));
        let releaser = thread::spawn(move || drop(second));
        drop(first);
        let mine = block_on(next).expect("the other release is coming");
        let theirs = served.join().unwrap();
        releaser.join().unwrap();
        assert_eq!(l.available(), 0, "permit duplicated");
        drop((mine, theirs));
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (4, 0, 0), "{s:?}");
        assert_idle(&l, 4);
    });
}

/// The same rule for a head that leaves unserved: limit 2, both permits held by the main thread;
/// a head of two permits and a next head of one queued by hand. The head is dropped (cancelled)
/// in one thread while another releases one permit: a cancelled head wakes the next head only if
/// its permit is free then (`Room`). Either the cancel sees the release and wakes the next head,
/// or the release comes after its look, sees `WAITERS` and wakes the next head itself (or it
/// came first and spent its wake on the head, whose cancel then sees its permit free): the next
/// head (the main thread, asleep in `block_on`) must be served, never left asleep with a permit
/// free.
#[test]
fn cancelled_head_leaves_the_next_asleep_vs_release() {
    model(|| {
        let l = ConcurrencyLimiter::new(2).unwrap();
        let first = l.try_acquire_owned(1).unwrap();
        let second = l.try_acquire_owned(1).unwrap();
        let mut head = Box::pin(l.acquire_owned(2));
        let mut next = Box::pin(l.acquire_owned(1));
        assert!(poll_once(head.as_mut()).is_pending());
        assert!(poll_once(next.as_mut()).is_pending());
        let canceller = thread::spawn(move || drop(head));
        let releaser = thread::spawn(move || drop(second));
        let mine = block_on(next).expect("a release is coming");
        canceller.join().unwrap();
        releaser.join().unwrap();
        assert_eq!(l.available(), 0, "permit duplicated");
        drop((mine, first));
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (3, 0, 1), "{s:?}");
        assert_idle(&l, 4);
    });
}

/// Enqueue vs grant: an async waiter queued first (head) is driven by `block_on` in one thread
/// and, once served, releases; a blocking waiter enqueues concurrently (behind it, or into an
/// empty queue after the head left and cleared `WAITERS`); the main thread releases the original
/// permit. Both waiters must be served.
#[test]
fn grant_vs_enqueue() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let data = Guarded::new();
        let held = l.try_acquire_owned(1).unwrap();
        let mut head = Box::pin(l.acquire_owned(1));
        assert!(poll_once(head.as_mut()).is_pending());
        let async_waiter = {
            let (l, data) = (l.clone(), data.clone());
            thread::spawn(move || {
                let permit = block_on(head).expect("a release is coming");
                assert_eq!(l.available(), 0, "permit duplicated");
                data.bump();
                drop(permit);
            })
        };
        let blocking_waiter = {
            let (l, data) = (l.clone(), data.clone());
            thread::spawn(move || {
                let permit = l.acquire_blocking().expect("the head releases");
                assert_eq!(l.available(), 0, "permit duplicated");
                data.bump();
                drop(permit);
            })
        };
        data.bump();
        drop(held);
        async_waiter.join().unwrap();
        blocking_waiter.join().unwrap();
        assert_eq!(data.get(), 3);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (3, 0, 0), "{s:?}");
        assert_idle(&l, 3);
    });
}

// ---------------------------------------------------------------------------------------------
// Release vs cancel, grant vs cancel.
// ---------------------------------------------------------------------------------------------

/// A queued future is dropped in one thread while the main thread releases the permit. The
/// dropped future can hold nothing: exactly one cancellation, every permit back, the queue empty,
/// no stale `WAITERS`.
#[test]
fn release_vs_cancel() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut waiter = Box::pin(l.acquire_owned(1));
        assert!(poll_once(waiter.as_mut()).is_pending());
        assert_eq!(l.stats().waiting, 1);
        let canceller = thread::spawn(move || drop(waiter));
        drop(held);
        canceller.join().unwrap();
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (1, 0, 1), "{s:?}");
        assert_idle(&l, 2);
    });
}

/// Grant vs cancel: the queued future is polled once more (it takes the permit if the release is
/// visible to it) and then dropped, while the main thread releases. Either it was granted the
/// permit (and released it) or it was cancelled, never both, never neither; nothing is lost.
#[test]
fn grant_vs_cancel() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut waiter = Box::pin(l.acquire_owned(1));
        assert!(poll_once(waiter.as_mut()).is_pending());
        let racer = {
            let l = l.clone();
            thread::spawn(move || match poll_once(waiter.as_mut()) {
                Poll::Ready(permit) => {
                    let permit = permit.expect("granted or pending, never failed");
                    assert_eq!(l.available(), 0, "permit duplicated");
                    drop(permit);
                    true
                }
                Poll::Pending => false,
            })
        };
        drop(held);
        let granted = racer.join().unwrap();
        let s = l.stats();
        let expected = if granted { (2, 0, 0) } else { (1, 0, 1) };
        assert_eq!((s.admitted, s.rejected, s.cancelled), expected, "{s:?}");
        assert_idle(&l, 2);
    });
}

/// A cancelled head must promote the waiter behind it: the head future is dropped in one thread,
/// a blocking waiter enqueues in another (behind the head, or alone if the cancel came first),
/// and the main thread releases. The blocking waiter must be served (a lost promotion or a wake
/// spent on the cancelled head is a deadlock).
#[test]
fn cancelled_head_promotes_blocking_waiter() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut head = Box::pin(l.acquire_owned(1));
        assert!(poll_once(head.as_mut()).is_pending());
        let canceller = thread::spawn(move || drop(head));
        let waiter = {
            let l = l.clone();
            thread::spawn(move || {
                let permit = l.acquire_blocking().expect("a release is coming");
                assert_eq!(l.available(), 0, "permit duplicated");
                drop(permit);
            })
        };
        drop(held);
        canceller.join().unwrap();
        waiter.join().unwrap();
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (2, 0, 1), "{s:?}");
        assert_idle(&l, 3);
    });
}

/// As above with an async waiter that is certainly behind the cancelled head (both polled once,
/// in order, before the race) and then driven by `block_on`: the promotion wakes its task.
#[test]
fn cancelled_head_promotes_async_waiter() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut head = Box::pin(l.acquire_owned(1));
        let mut next = Box::pin(l.acquire_owned(1));
        assert!(poll_once(head.as_mut()).is_pending());
        assert!(poll_once(next.as_mut()).is_pending());
        assert_eq!(l.stats().waiting, 2);
        let canceller = thread::spawn(move || drop(head));
        let waiter = {
            let l = l.clone();
            thread::spawn(move || {
                let permit = block_on(next).expect("a release is coming");
                assert_eq!(l.available(), 0, "permit duplicated");
                drop(permit);
            })
        };
        drop(held);
        canceller.join().unwrap();
        waiter.join().unwrap();
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (2, 0, 1), "{s:?}");
        assert_idle(&l, 3);
    });
}

/// No barging: under oldest-first order, while a waiter is queued `try_acquire` fails even if the
/// permit is being released concurrently (and so may be free); once the waiter is gone it succeeds.
#[test]
fn no_barging_past_a_queued_waiter() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut waiter = Box::pin(l.acquire_owned(1));
        assert!(poll_once(waiter.as_mut()).is_pending());
        let barger = {
            let l = l.clone();
            thread::spawn(move || {
                assert!(
                    matches!(l.try_acquire(), Err(TryPermitError::NoPermits { .. })),
                    "barged past a queued waiter"
                );
            })
        };
        drop(held);
        barger.join().unwrap();
        drop(waiter);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (1, 1, 1), "{s:?}");
        assert_idle(&l, 3);
    });
}

// ---------------------------------------------------------------------------------------------
// Close vs enqueue.
// ---------------------------------------------------------------------------------------------

/// Limit 1, the permit held throughout. One thread closes while another calls `acquire_blocking`:
/// the waiter fails `Closed` (at the fast path, at enqueue, or woken by `close`), never hangs;
/// every later call fails `Closed`, and nobody is left queued.
#[test]
fn close_vs_blocking_enqueue() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || l.acquire_blocking().map(drop))
        };
        let closer = {
            let l = l.clone();
            thread::spawn(move || l.close())
        };
        closer.join().unwrap();
        assert_eq!(waiter.join().unwrap(), Err(AcquireError::Closed));
        assert!(l.is_closed());
        assert_eq!(l.try_acquire().unwrap_err(), TryPermitError::Closed);
        assert_eq!(l.acquire_blocking().unwrap_err(), AcquireError::Closed);
        let mut late = Box::pin(l.acquire());
        assert!(matches!(
            poll_once(late.as_mut()),
            Poll::Ready(Err(AcquireError::Closed))
        ));
        drop(late);
        drop(held);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (1, 4, 0), "{s:?}");
        assert_idle(&l, 5);
    });
}

/// Close vs a blocking waiter whose deadline has passed (timeout zero, the permit held): the
/// waiter returns `Closed` (counted rejected) if the close failed it before it gave up, or
/// `Timeout` (counted cancelled) otherwise; what it returns and what `stats()` counts agree.
/// (A close landing between the waiter's last look and its deadline check returned `Timeout`
/// while the close's failure was counted as a rejection.)
#[test]
fn close_vs_blocking_deadline() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || l.acquire_blocking_timeout(1, Duration::ZERO).map(drop))
        };
        l.close();
        let outcome = waiter.join().unwrap();
        drop(held);
        let s = l.stats();
        let expected = match outcome {
            Err(AcquireError::Closed) => (1, 1, 0),
            Err(AcquireError::Timeout) => (1, 0, 1),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            (s.admitted, s.rejected, s.cancelled),
            expected,
            "{outcome:?} vs {s:?}"
        );
        assert_idle(&l, 2);
    });
}

/// Close vs a queued async waiter driven by `block_on`: `close` fails it and wakes its task.
#[test]
fn close_wakes_async_waiter() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut waiter = Box::pin(l.acquire_owned(1));
        assert!(poll_once(waiter.as_mut()).is_pending());
        let waiter = thread::spawn(move || block_on(waiter).map(drop));
        l.close();
        assert_eq!(waiter.join().unwrap(), Err(AcquireError::Closed));
        drop(held);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (1, 1, 0), "{s:?}");
        assert_idle(&l, 2);
    });
}

/// Close vs release vs a blocking waiter: the waiter returns either with the permit (the release
/// reached it first) or with `Closed`, never hangs, and the permit comes back either way.
#[test]
fn close_vs_release_vs_blocking_waiter() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || match l.acquire_blocking() {
                Ok(permit) => {
                    assert_eq!(l.available(), 0, "permit duplicated");
                    drop(permit);
                    true
                }
                Err(e) => {
                    assert_eq!(e, AcquireError::Closed);
                    false
                }
            })
        };
        let closer = {
            let l = l.clone();
            thread::spawn(move || l.close())
        };
        drop(held);
        let served = waiter.join().unwrap();
        closer.join().unwrap();
        let s = l.stats();
        let expected = if served { (2, 0, 0) } else { (1, 1, 0) };
        assert_eq!((s.admitted, s.rejected, s.cancelled), expected, "{s:?}");
        assert_idle(&l, 2);
    });
}

// ---------------------------------------------------------------------------------------------
// The lock-free release path.
// ---------------------------------------------------------------------------------------------

/// Limit 2, three callers (two threads and the main thread) each `try_acquire` + drop, counting
/// permits in flight. Never more than 2 in flight; at least 2 admitted (a call fails only while
/// 2 others hold); all back at the end.
#[test]
fn try_acquire_release_never_exceeds_limit() {
    const LIMIT: u32 = 2;
    fn caller(l: &ConcurrencyLimiter, in_flight: &AtomicU32) -> u64 {
        match l.try_acquire() {
            Ok(permit) => {
                let before = in_flight.fetch_add(1, Ordering::SeqCst);
                assert!(before < LIMIT, "{} permits in flight", before + 1);
                in_flight.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
                1
            }
            Err(TryPermitError::NoPermits { .. }) => 0,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    model(|| {
        let l = ConcurrencyLimiter::new(LIMIT).unwrap();
        let in_flight = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (l, in_flight) = (l.clone(), in_flight.clone());
                thread::spawn(move || caller(&l, &in_flight))
            })
            .collect();
        let mut admitted = caller(&l, &in_flight);
        admitted += threads.into_iter().map(|t| t.join().unwrap()).sum::<u64>();
        assert!(
            admitted >= 2,
            "only {admitted} admitted with 3 callers and limit 2"
        );
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected), (admitted, 3 - admitted), "{s:?}");
        assert_idle(&l, 3);
    });
}

/// Limit 2, an n = 2 caller against two n = 1 calls in a row, counting permits in flight: never
/// more than 2 in flight, the first caller in the word's order always gets in, all back at the end.
#[test]
fn mixed_sizes_never_exceed_limit() {
    model(|| {
        const LIMIT: u32 = 2;
        let l = ConcurrencyLimiter::new(LIMIT).unwrap();
        let in_flight = Arc::new(AtomicU32::new(0));
        let script = |l: ConcurrencyLimiter, in_flight: Arc<AtomicU32>, sizes: &'static [u32]| {
            thread::spawn(move || {
                let mut admitted = 0;
                for &n in sizes {
                    match l.try_acquire_n(n) {
                        Ok(permit) => {
                            let before = in_flight.fetch_add(n, Ordering::SeqCst);
                            assert!(before + n <= LIMIT, "{} permits in flight", before + n);
                            in_flight.fetch_sub(n, Ordering::SeqCst);
                            drop(permit);
                            admitted += 1;
                        }
                        Err(TryPermitError::NoPermits { .. }) => {}
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                admitted
            })
        };
        let a = script(l.clone(), in_flight.clone(), &[2]);
        let b = script(l.clone(), in_flight.clone(), &[1, 1]);
        let admitted: u64 = a.join().unwrap() + b.join().unwrap();
        assert!(admitted >= 1, "nobody admitted on a free limiter");
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected), (admitted, 3 - admitted), "{s:?}");
        assert_idle(&l, 3);
    });
}

/// Limit 1: two threads each try twice and touch the guarded data while they hold the permit.
/// The permit word alone (Acquire CAS, Release `fetch_add`) must order the holders: loom reports
/// a race otherwise. The first call in the word's order always gets in.
#[test]
fn permit_word_orders_holders() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let data = Guarded::new();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (l, data) = (l.clone(), data.clone());
                thread::spawn(move || {
                    let mut admitted = 0;
                    for _ in 0..2 {
                        if let Ok(permit) = l.try_acquire() {
                            data.bump();
                            drop(permit);
                            admitted += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        let admitted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(admitted >= 1);
        assert_eq!(u64::from(data.get()), admitted);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected), (admitted, 4 - admitted), "{s:?}");
        assert_idle(&l, 4);
    });
}

// ---------------------------------------------------------------------------------------------
// Newest-first eviction vs cancel.
// ---------------------------------------------------------------------------------------------

/// Newest-first, queue limit 1, limit 1 held by the main thread. A queued future is polled once
/// more and then dropped in one thread, while a blocking waiter arrives in another (evicting the
/// future if it is still queued) and the main thread releases. The future ends exactly one way
/// (served, failed `QueueFull` by eviction, or cancelled, counted once), and the newer waiter
/// is served. A future evicted after its last poll and dropped without seeing it was still failed
/// by the limiter: it counts as rejected, not cancelled.
#[test]
fn newest_first_eviction_vs_cancel() {
    model(|| {
        let l = ConcurrencyLimiter::builder(1)
            .queue_order(QueueOrder::NewestFirst)
            .queue_limit(1)
            .build()
            .unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut old = Box::pin(l.acquire_owned(1));
        assert!(poll_once(old.as_mut()).is_pending());
        let old_waiter = {
            let l = l.clone();
            thread::spawn(move || match poll_once(old.as_mut()) {
                Poll::Ready(Ok(permit)) => {
                    assert_eq!(l.available(), 0, "permit duplicated");
                    drop(permit);
                    "served"
                }
                Poll::Ready(Err(e)) => {
                    assert!(matches!(e, AcquireError::QueueFull { .. }), "{e:?}");
                    "evicted"
                }
                Poll::Pending => "cancelled",
            })
        };
        let new_waiter = {
            let l = l.clone();
            thread::spawn(move || {
                let permit = l.acquire_blocking().expect("a release is coming");
                assert_eq!(l.available(), 0, "permit duplicated");
                drop(permit);
            })
        };
        drop(held);
        let old_outcome = old_waiter.join().unwrap();
        new_waiter.join().unwrap();
        let s = l.stats();
        let counts = (s.admitted, s.rejected, s.cancelled);
        match old_outcome {
            "served" => assert_eq!(counts, (3, 0, 0), "old waiter served: {s:?}"),
            "evicted" => assert_eq!(counts, (2, 1, 0), "old waiter evicted: {s:?}"),
            // Pending at its last poll: dropped while queued, or evicted in between and dropped
            // unseen.
            _ => assert!(
                counts == (2, 0, 1) || counts == (2, 1, 0),
                "old waiter dropped: {s:?}"
            ),
        }
        assert_idle(&l, 3);
    });
}

/// Newest-first, queue limit 1: a queued future driven by `block_on` in one thread while a
/// blocking waiter arrives in another (evicting it if it is still queued) and the main thread
/// releases. The evicted waiter must be woken to see its failure, the served ones must be woken
/// by the release or the promotion: both threads return.
#[test]
fn newest_first_eviction_wakes_the_evicted() {
    model(|| {
        let l = ConcurrencyLimiter::builder(1)
            .queue_order(QueueOrder::NewestFirst)
            .queue_limit(1)
            .build()
            .unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let mut old = Box::pin(l.acquire_owned(1));
        assert!(poll_once(old.as_mut()).is_pending());
        let old_waiter = {
            let l = l.clone();
            thread::spawn(move || match block_on(old) {
                Ok(permit) => {
                    assert_eq!(l.available(), 0, "permit duplicated");
                    drop(permit);
                    true
                }
                Err(e) => {
                    assert!(matches!(e, AcquireError::QueueFull { .. }), "{e:?}");
                    false
                }
            })
        };
        let new_waiter = {
            let l = l.clone();
            thread::spawn(move || {
                let permit = l.acquire_blocking().expect("a release is coming");
                assert_eq!(l.available(), 0, "permit duplicated");
                drop(permit);
            })
        };
        drop(held);
        let old_served = old_waiter.join().unwrap();
        new_waiter.join().unwrap();
        let s = l.stats();
        let expected = if old_served { (3, 0, 0) } else { (2, 1, 0) };
        assert_eq!((s.admitted, s.rejected, s.cancelled), expected, "{s:?}");
        assert_idle(&l, 3);
    });
}

// ---------------------------------------------------------------------------------------------
// A rate limiter's head waiting for time.
// ---------------------------------------------------------------------------------------------

/// Window length in nanoseconds of the rate-limiter models.
const WINDOW: u64 = 10;

/// A fixed window of 1 per `WINDOW` ns on a `ManualClock`, its window at t = 0 already used.
fn exhausted_rate_limiter() -> RateLimiter<ManualClock> {
    let l = RateLimiter::with_clock(
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_nanos(WINDOW),
        },
        ManualClock::new(),
    )
    .unwrap();
    assert_eq!(l.try_acquire().unwrap().at_nanos(), 0);
    l
}

/// A blocking waiter on an exhausted window (head, waiting for time; under loom its timed wait
/// just yields) while the main thread moves the clock into the next window: the waiter is
/// admitted in the new window, leaves the queue, and clears the gate (a later `try_acquire` in
/// the window after succeeds under oldest-first order).
#[test]
fn rate_head_waits_for_clock() {
    model(|| {
        let l = exhausted_rate_limiter();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || l.acquire_blocking().expect("the clock moves"))
        };
        l.clock().advance(Duration::from_nanos(WINDOW));
        let admission = waiter.join().unwrap();
        assert_eq!(
            admission.at_nanos() / WINDOW,
            1,
            "admitted at {} ns",
            admission.at_nanos()
        );
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (2, 0, 0), "{s:?}");
        assert_eq!((s.waiting, s.queued_permits), (0, 0), "{s:?}");
        l.clock().advance(Duration::from_nanos(WINDOW));
        assert!(l.try_acquire().is_ok(), "stale WAITERS on the gate");
    });
}

/// A blocking head waiting for time that never comes, and a racing `close`: the head fails
/// `Closed` and returns; later calls fail `Closed`.
#[test]
fn rate_close_vs_time_waiter() {
    model(|| {
        let l = exhausted_rate_limiter();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || l.acquire_blocking().map(|_| ()))
        };
        l.close();
        assert_eq!(waiter.join().unwrap(), Err(AcquireError::Closed));
        assert_eq!(l.try_acquire().unwrap_err(), TryAcquireError::Closed);
        assert_eq!(l.acquire_blocking().unwrap_err(), AcquireError::Closed);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.cancelled), (1, 3, 0), "{s:?}");
        assert_eq!((s.waiting, s.queued_permits), (0, 0), "{s:?}");
    });
}

/// Two reconfigurations of a rate limiter race: thread A lowers its capacity to 1 while the main
/// thread sets it to 2, then (once that call has returned) starts a waiter for 2 on the exhausted
/// window. If A's change came first (the capacity is 2 at the end), the capacity has been 2 ever
/// since the waiter started, so nothing may fail it as too large: it is served in the next
/// window. If A's came last, the waiter fails with capacity 1 (at once or in A's sweep). Fails if
/// `reconfigure` sweeps the queue after releasing its mutex: A's sweep, computed for capacity 1,
/// then runs after the main thread's change to 2 and fails the waiter for a capacity superseded
/// before it even started.
///
/// The waiter is an `acquire_n` future polled by hand on the main thread (inside a paused
/// current-thread tokio runtime, whose timer it sleeps on; nothing else touches the runtime), not
/// a blocking call on a third thread: its enqueue still lands anywhere in A's reconfiguration,
/// which is the race this model is about, while a blocking waiter waiting for the next window
/// spins on `yield_now` under loom until the clock moves, and loom explored every interleaving of
/// that spin with the other two threads for nothing this property needs (a blocking head's wait
/// for time is `rate_head_waits_for_clock`).
#[test]
fn rate_reconfigure_sweep_never_uses_a_superseded_capacity() {
    fn limit(limit: u32) -> Algorithm {
        let window = Duration::from_nanos(WINDOW);
        Algorithm::FixedWindow { limit, window }
    }
    model(|| {
        let rt = common::paused_runtime();
        let _entered = rt.enter();
        let l = RateLimiter::with_clock(limit(2), ManualClock::new()).unwrap();
        l.try_acquire_n(2).unwrap();
        let lower = {
            let l = l.clone();
            thread::spawn(move || l.reconfigure(limit(1)).unwrap())
        };
        l.reconfigure(limit(2)).unwrap();
        let mut waiter = Box::pin(l.acquire_n(2));
        let first = poll_once(waiter.as_mut());
        lower.join().unwrap();
        let raised = l.capacity() == 2;
        if raised {
            l.clock().advance(Duration::from_nanos(WINDOW));
        }
        let outcome = match first {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => match poll_once(waiter.as_mut()) {
                Poll::Ready(outcome) => outcome,
                Poll::Pending => panic!("the waiter was neither served nor failed"),
            },
        };
        drop(waiter);
        if raised {
            assert_eq!(
                outcome.map(|a| a.at_nanos()),
                Ok(WINDOW),
                "failed by a capacity superseded before it started"
            );
        } else {
            assert_eq!(
                outcome.map(|a| a.at_nanos()),
                Err(AcquireError::InsufficientCapacity {
                    requested: 2,
                    capacity: 1
                })
            );
        }
        let s = l.stats();
        assert_eq!(s.admitted + s.rejected, 2, "{s:?}");
        assert_eq!(
            (s.cancelled, s.waiting, s.queued_permits),
            (0, 0, 0),
            "{s:?}"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// set_limit: the limit in an atomic of its own, published by a generation bump in the word.
// ---------------------------------------------------------------------------------------------

/// Limit 2 with one permit held by the main thread. Thread A lowers the limit to 1, then gives
/// its permit back and takes one again; thread B takes one with `try_acquire`, racing all of it.
/// Never may A (which acquires after `set_limit(1)` returned) and B hold at once: B got in before
/// the lowering only if A's later acquire then finds the word full, and a B that loaded the limit
/// 2 before the change and CASes after A's release-and-reacquire (the same count, an ABA on the
/// count) must fail because the generation moved. Fails if `set_limit` does not bump the
/// generation, or if `take` loads the word Relaxed (B could pair the new word with the old limit).
#[test]
fn set_limit_lowering_vs_acquire_release() {
    const A_IN: u32 = 0x100;
    model(|| {
        let l = ConcurrencyLimiter::new(2).unwrap();
        let inside = Arc::new(AtomicU32::new(0));
        let held = l.try_acquire_owned(1).unwrap();
        let b = {
            let (l, inside) = (l.clone(), Arc::clone(&inside));
            thread::spawn(move || {
                if let Ok(permit) = l.try_acquire() {
                    let before = inside.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(before & A_IN, 0, "B admitted while A holds under limit 1");
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    true
                } else {
                    false
                }
            })
        };
        l.set_limit(1).unwrap();
        drop(held);
        let a = l.try_acquire().ok();
        if let Some(permit) = &a {
            let before = inside.fetch_add(A_IN, Ordering::SeqCst);
            assert_eq!(before, 0, "A admitted while B holds, under limit 1");
            inside.fetch_sub(A_IN, Ordering::SeqCst);
            assert_eq!(permit.permits(), 1);
        }
        drop(a);
        b.join().unwrap();
        assert_eq!(l.limit(), 1);
        let s = l.stats();
        assert_eq!(s.admitted + s.rejected, 3, "{s:?}");
        assert_idle(&l, 3);
    });
}

/// Limit 1, held by the main thread for the whole model; a blocking waiter queues (or is about
/// to) while another thread raises the limit to 2. The waiter must be served without any release:
/// the raise wakes the head under the queue's mutex, so it cannot fall between the head's failed
/// attempt and its registration (a lost wake-up is a loom deadlock).
#[test]
fn set_limit_raise_wakes_queued_head() {
    model(|| {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let held = l.try_acquire_owned(1).unwrap();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || l.acquire_blocking().map(|p| p.permits()))
        };
        let raiser = {
            let l = l.clone();
            thread::spawn(move || l.set_limit(2).unwrap())
        };
        assert_eq!(waiter.join().unwrap(), Ok(1), "served by the raise alone");
        raiser.join().unwrap();
        assert_eq!(l.available(), 1);
        drop(held);
        assert_idle(&l, 2);
    });
}

/// Limit 2, both permits held; a blocking waiter for 2 races a lowering to 1. Whether it
/// validates before or after the change, and queues before or after the sweep of oversized
/// waiters, it fails `InsufficientCapacity` and returns (never waits for permits that can never
/// come), and leaves the queue empty.
#[test]
fn set_limit_lowering_fails_oversized_waiter() {
    model(|| {
        let l = ConcurrencyLimiter::new(2).unwrap();
        let held = l.try_acquire_owned(2).unwrap();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || l.acquire_blocking_n(2).map(|p| p.permits()))
        };
        l.set_limit(1).unwrap();
        assert_eq!(
            waiter.join().unwrap(),
            Err(AcquireError::InsufficientCapacity {
                requested: 2,
                capacity: 1
            })
        );
        drop(held);
        assert_idle(&l, 2);
    });
}

// ---------------------------------------------------------------------------------------------
// A lowered limit vs the enqueue of a request it makes too big.
// ---------------------------------------------------------------------------------------------

/// Limit 2, both permits held by the main thread, and a head queued for 1 (a future polled by
/// hand). One thread lowers the limit to 1 while another asks for 2 permits, blocking. That
/// request can never fit: it must fail `InsufficientCapacity` whether it meets the new limit in
/// its fast path, in the queue (`set_limit`'s sweep fails it), or only as it enqueues after the
/// sweep; it must never wait behind the head, which the main thread serves only after joining
/// it (so a wait is a deadlock loom reports).
#[test]
fn lowered_limit_vs_enqueue_of_a_request_it_makes_too_big() {
    model(|| {
        let l = ConcurrencyLimiter::new(2).unwrap();
        let held = l.try_acquire_owned(2).unwrap();
        let mut head = Box::pin(l.acquire_owned(1));
        assert!(poll_once(head.as_mut()).is_pending());
        let lower = {
            let l = l.clone();
            thread::spawn(move || l.set_limit(1).unwrap())
        };
        let big = {
            let l = l.clone();
            thread::spawn(move || l.acquire_blocking_n(2).map(|p| p.permits()))
        };
        lower.join().unwrap();
        let outcome = big.join().unwrap();
        assert!(
            matches!(
                outcome,
                Err(AcquireError::InsufficientCapacity {
                    requested: 2,
                    capacity: 1
                })
            ),
            "{outcome:?}"
        );
        drop(held);
        let Poll::Ready(permit) = poll_once(head.as_mut()) else {
            panic!("the head was not served once the permits came back");
        };
        drop(permit.unwrap());
        drop(head);
        assert_idle(&l, 3);
    });
}
