//! Loom models of `KeyedConcurrencyLimiter` (`src/keyed_concurrency.rs`): a key's permit word in
//! the keyed store, released by guards that look the key up again, evicted only when all its
//! permits are back, and woken through a `WAITERS` mark that a blocked queue head sets in the
//! permit word itself.
//!
//! Asserted:
//! - a key with a permit out is never retired, and a release racing a sweep finds its cell (the
//!   permits it gives back are seen by the key's next caller);
//! - no lost wake-up: a release racing a blocking waiter's registration always serves it (loom
//!   reports a deadlock if the waiter could sleep forever);
//! - an acquire racing the eviction of an idle key is decided on a live cell: exactly the limit
//!   is admitted, and the books (keys, evictions) balance.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_keyed_concurrency`
#![cfg(turnstile_loom)]

use loom::thread;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use turnstile::{KeyedConcurrencyLimiter, TryPermitError};

/// A hasher with fixed keys, so every loom execution puts a key in the same shard.
type Fixed = BuildHasherDefault<DefaultHasher>;
type Limiter = KeyedConcurrencyLimiter<u64, Fixed>;

fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_some() {
        loom::model(f);
    } else {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(f);
    }
}

fn limiter(limit: u32) -> Arc<Limiter> {
    Arc::new(
        KeyedConcurrencyLimiter::<u64>::builder(limit)
            .hasher(Fixed::default())
            .max_keys(4)
            .build()
            .unwrap(),
    )
}

/// A key holds two permits; one is released while a sweep runs. The key always has a permit
/// out, so the sweep evicts nothing, and the release lands on the key's one cell.
#[test]
fn release_vs_sweep() {
    model(|| {
        let l = limiter(2);
        let kept = l.try_acquire_owned(1, 1).unwrap();
        let released = l.try_acquire_owned(1, 1).unwrap();
        let sweeper = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        };
        drop(released);
        assert_eq!(
            sweeper.join().unwrap(),
            0,
            "a key with a permit out was evicted"
        );
        assert_eq!(l.available(&1), 1, "the release missed the key's cell");
        assert!(matches!(
            l.try_acquire_n(&1, 2),
            Err(TryPermitError::NoPermits { .. })
        ));
        drop(kept);
        assert_eq!(l.available(&1), 2);
        assert_eq!(l.sweep(), 1);
        assert_eq!(l.len(), 0);
    });
}

/// A blocking waiter registers while the holder releases: whatever the interleaving of the
/// waiter's enqueue, its attempt, its `WAITERS` mark and its sleep with the release's add and
/// wake, the waiter is served.
#[test]
fn release_vs_waiter_registration() {
    model(|| {
        let l = limiter(1);
        let held = l.try_acquire_owned(1, 1).unwrap();
        let waiter = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.acquire_blocking(&1).map(|p| p.permits()))
        };
        drop(held);
        assert_eq!(waiter.join().unwrap(), Ok(1));
        let stats = l.stats();
        assert_eq!(
            (stats.admitted, stats.waiting, stats.waiting_keys),
            (2, 0, 0)
        );
        assert_eq!(l.available(&1), 1);
        assert_eq!(l.sweep(), 1, "a stale WAITERS mark kept the key");
    });
}

/// An idle key (used, all permits back) is evicted while two callers acquire it: each may find
/// the retired cell, remove it and insert a fresh one; exactly one of them gets the one permit.
#[test]
fn acquire_racing_eviction_of_an_idle_key() {
    model(|| {
        let l = limiter(1);
        drop(l.try_acquire(&1).unwrap());
        let sweeper = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        };
        let a = l.try_acquire_owned(1, 1);
        let b = l.try_acquire_owned(1, 1);
        let swept = sweeper.join().unwrap();
        assert!(a.is_ok(), "an idle key refused its first caller");
        assert!(
            matches!(b, Err(TryPermitError::NoPermits { .. })),
            "over-admitted"
        );
        assert!(swept <= 1);
        assert_eq!(l.len(), 1);
        // The retired cell is removed, and counted, by the sweeper or by a caller that found it.
        let evicted = l.stats().evicted as usize;
        assert!(
            swept <= evicted && evicted <= 1,
            "swept {swept}, evicted {evicted}"
        );
        drop(a);
        assert_eq!(l.sweep(), 1);
        assert_eq!(l.len(), 0);
    });
}
