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
//!   is admitted, and the books (keys, evictions) balance;
//! - `set_limit` racing an acquire on a key and the eviction of that key: no admission is kept
//!   that the limit in force at its moment would refuse (a compare-and-swap prepared under the
//!   old limit and landing after the change is given back);
//! - a stale admission given back (after a `set_limit`) wakes the head whose mark it consumed,
//!   even when the taker then ends on a fresh cell (the old one evicted) or in an error.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_keyed_concurrency`
#![cfg(turnstile_loom)]

use loom::sync::atomic::{AtomicU32, Ordering};
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

/// Limit 2 with one permit of key 1 held by the main thread. Main lowers the limit to 1, gives
/// its permit back, evicts the key if it is idle (`evict`: a sweep on the main thread, so the
/// model stays at two threads) and takes one again, on the old cell or a fresh one; thread B
/// takes one with `try_acquire`, racing all of it. Never may main (which acquires after
/// `set_limit(1)` returned) and B hold at once: B got in before the lowering only if main's later
/// acquire then finds the key full. The dangerous interleaving: B loads the limit 2 and the count
/// 1 before the change, and CASes 1 → 2 after main's release and re-acquire brought the count
/// back to 1 (an ABA on the count). The limit is not in the word, so nothing makes that CAS fail;
/// B must see the new `config` afterwards and give the permit back. With `evict`, B's CAS may
/// instead meet the retired cell, and B must then decide on the fresh one under the new limit.
fn set_limit_racing_acquire(evict: bool) {
    const MAIN_IN: u32 = 0x100;
    model(move || {
        let l = limiter(2);
        let inside = Arc::new(AtomicU32::new(0));
        let held = l.try_acquire_owned(1, 1).unwrap();
        let b = {
            let (l, inside) = (Arc::clone(&l), Arc::clone(&inside));
            thread::spawn(move || {
                if let Ok(permit) = l.try_acquire(&1) {
                    let before = inside.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(
                        before & MAIN_IN,
                        0,
                        "B admitted while main holds under limit 1"
                    );
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                }
            })
        };
        l.set_limit(1).unwrap();
        drop(held);
        let swept = if evict { l.sweep() } else { 0 };
        let a = l.try_acquire(&1).ok();
        if a.is_some() {
            let before = inside.fetch_add(MAIN_IN, Ordering::SeqCst);
            assert_eq!(before, 0, "main admitted while B holds, under limit 1");
            inside.fetch_sub(MAIN_IN, Ordering::SeqCst);
        }
        drop(a);
        b.join().unwrap();
        assert!(swept <= 1);
        assert_eq!(l.limit(), 1);
        let stats = l.stats();
        assert_eq!(stats.admitted + stats.rejected, 3, "{stats:?}");
        // Every permit is back, under the new limit, on whichever cell the key has now.
        assert_eq!(l.available(&1), 1);
        assert!(matches!(
            l.try_acquire_n(&1, 2),
            Err(TryPermitError::InsufficientCapacity {
                requested: 2,
                capacity: 1
            })
        ));
        l.sweep();
        assert_eq!(l.len(), 0);
    });
}

/// `set_limit` vs a stale compare-and-swap on the key's one cell (the ABA on the count).
#[test]
fn set_limit_racing_acquire_on_a_key() {
    set_limit_racing_acquire(false);
}

/// `set_limit` vs a stale compare-and-swap and the eviction of the key it targets.
#[test]
fn set_limit_racing_acquire_and_eviction() {
    set_limit_racing_acquire(true);
}

/// A stale admission given back owes a wake to the key's head, and that debt survives the take
/// ending on another cell or in an error. Limit `n` with nothing held. The main thread (T) takes
/// `n` permits with `try_acquire_n`; thread H lowers (or just re-sets) the limit to 1 and then
/// waits for one permit with `acquire_blocking`; with `evict`, thread S sweeps. The dangerous
/// interleaving: T loads the old `config` and CASes its permits in; H's `set_limit` lands; H
/// finds the key full, queues and marks `WAITERS`; T sees the new `config`, gives its permits
/// back (consuming H's mark, so the wake is now T's to deliver) and decides again: on a key whose
/// cell S has meanwhile retired (`evict`: T retries on a fresh cell), or for `n` above the
/// lowered limit (T fails with `InsufficientCapacity`). If T dropped the debt, H would sleep
/// forever: loom reports the deadlock.
///
/// Loom needs a preemption bound of 4 to reach the interleaving (fails at 4 without the fix,
/// not at 2), so the model fixes it whatever `LOOM_MAX_PREEMPTIONS` says. Only the lowered-limit
/// form is run: with the sweeper thread the same bound does not finish in minutes. Both forms
/// lose the debt the same way (an error out of the take's closure) and share the fix.
fn given_back_wake_survives(n: u32, evict: bool, preemptions: usize) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(move || {
        let l = limiter(n);
        let h = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                l.set_limit(1).unwrap();
                l.acquire_blocking(&1).map(|p| p.permits())
            })
        };
        let s = evict.then(|| {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        });
        drop(l.try_acquire_n(&1, n));
        assert_eq!(h.join().unwrap(), Ok(1), "the head was not served");
        let swept = s.map_or(0, |s| s.join().unwrap());
        assert!(swept <= 1);
        assert_eq!(l.available(&1), 1);
        l.sweep();
        assert_eq!(l.len(), 0, "a stale WAITERS mark kept the key");
    });
}

/// The taker's retry fails: it asked for more than the lowered limit.
#[test]
fn given_back_wake_survives_a_lowered_limit() {
    given_back_wake_survives(2, false, 4);
}
