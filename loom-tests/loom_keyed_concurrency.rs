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
//!   even when the taker then ends on a fresh cell (the old one evicted) or in an error;
//! - a new key's first take that fails on its fresh cell (a `set_limit` lowered the limit after
//!   the store's check) leaves no cell behind, yet never takes back a cell another caller has
//!   taken a permit from meanwhile;
//! - a head woken by a release keeps its key: neither a sweep nor a new key looking for room
//!   at the cap evicts it before the head has taken (the word reads idle meanwhile);
//! - two releases that both read one head's mark, racing a sweep, never turn the retired word
//!   back into a live one;
//! - a head blocked on the shared overflow pool is not left asleep by a release that leaves
//!   another key idle (room under the key cap) as it marks the pool, nor by the last waiter of
//!   an idle key (which kept it from eviction) leaving, nor by a sweep that evicts a key while
//!   the head's search for room skips the shard being swept, nor by another key's search for
//!   room at the cap that evicts more keys than it takes slots
//!   (`a_pool_head_is_served_by_the_room_another_keys_search_leaves_over`).
//! - no barging past the shared pool's waiters (oldest first): a key at the cap with no queue
//!   is refused while a head waits for the pool, and that head is woken and served; a head
//!   that defers to another pool waiter is woken when that waiter leaves (served with a permit
//!   left free, or cancelled), never left asleep with the pool free.
//! - no lock-order deadlock: two pool heads whose attempts (each under its own queue's mutex)
//!   owe each other a wake pay it after unlocking, and that deferred wake is never lost.
//! - a request that a racing `set_limit` makes too big fails at once, never waiting behind the
//!   key's head, wherever the change lands between its fast path's check and its enqueue.
//! - a `close` racing a waiter that creates its key's queue fails it: no waiter is left in a
//!   queue the closing walk missed (`a_waiter_joining_during_close_is_failed`).
//! - a key's queue retired by a waiter that found it just after its creator inserted it never
//!   makes the limiter look closed (the count of queues shares a word with the closed bit)
//!   (`a_queue_retired_as_it_is_created_never_closes_the_limiter`).
//! - a release that leaves a key idle, racing a new key's search for room at the cap (which may
//!   skip the key's shard on a sweep's "never"), leaves room: once it is done a new key gets the
//!   slot (`a_release_racing_a_search_*`).
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p turnstile-loom-tests --test loom_keyed_concurrency`
#![cfg(turnstile_loom)]

mod common;
use common::{model, model_capped};

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::thread;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use turnstile::{AcquireError, KeyOverflow, KeyedConcurrencyLimiter, TryPermitError};

/// A hasher with fixed keys, so every loom execution puts a key in the same shard.
type Fixed = BuildHasherDefault<DefaultHasher>;
type Limiter = KeyedConcurrencyLimiter<u64, Fixed>;

/// `model` with a fixed preemption bound, for models whose interleaving of interest needs no
/// more (checked against the unfixed code) and which a bound of 3 makes take many minutes.
fn model_bounded<F: Fn() + Sync + Send + 'static>(preemptions: usize, f: F) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
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

/// A limiter of one permit per key that holds one key (`max_keys(1)`).
fn one_key_slot() -> Arc<Limiter> {
    Arc::new(
        KeyedConcurrencyLimiter::<u64>::builder(1)
            .hasher(Fixed::default())
            .max_keys(1)
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

/// Limit 2; thread T takes 2 permits of a new key while the main thread lowers the limit to 1.
/// The dangerous interleaving: T checks 2 ≤ 2, the `set_limit(1)` lands, T inserts the key's
/// fresh cell and its take fails (`InsufficientCapacity`). No sweep evicts a cell that has never
/// given out a permit, and nobody else uses key 1 here, so unless T takes its cell back the key
/// stays in the map for good (`len()` 1 after the final sweep). (The taker runs on the spawned
/// thread: with the roles swapped, loom ran the main thread's whole call before the other
/// thread's first step and explored one execution only.)
fn a_first_take_failed_by_set_limit(sweep: bool) {
    model(move || {
        let l = limiter(2);
        let t = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.try_acquire_owned(1, 2))
        };
        l.set_limit(1).unwrap();
        let swept = if sweep { l.sweep() } else { 0 };
        let taken = t.join().unwrap();
        match &taken {
            Ok(permit) => assert_eq!(permit.permits(), 2),
            Err(error) => assert_eq!(
                *error,
                TryPermitError::InsufficientCapacity {
                    requested: 2,
                    capacity: 1
                }
            ),
        }
        drop(taken);
        assert_eq!(l.available(&1), 1);
        let swept = swept + l.sweep();
        assert_eq!(
            l.len(),
            0,
            "a never-used cell stayed in the map, or the key was counted out twice"
        );
        // Evictions are counted by the sweeps that made them; a cell taken back is not one.
        assert!(swept <= 1);
        assert_eq!(l.stats().evicted, swept as u64);
    });
}

#[test]
fn a_first_take_failed_by_set_limit_leaves_no_cell() {
    a_first_take_failed_by_set_limit(false);
}

/// As above with a sweep of the key's shard racing T's take-back: the cell is counted out once,
/// by whichever retired it (a sweep never retires a never-used cell, and must not count the
/// take-back's retirement as its own eviction).
#[test]
fn a_first_take_failed_by_set_limit_and_a_sweep_count_the_key_once() {
    a_first_take_failed_by_set_limit(true);
}

/// As above, and the main thread, after lowering the limit, takes one permit of key 1 itself:
/// it may find T's fresh cell and take from it before T's take fails, or between that failure
/// and T taking the cell back, or meet the cell already taken back (retired) and retry on a
/// fresh one. T must never take back a cell main holds a permit on: main's permit must be on the
/// key's one live cell (available 0 while it is held, not evictable) and come back to it.
#[test]
fn taking_back_a_fresh_cell_spares_a_caller_that_used_it() {
    model(|| {
        let l = limiter(2);
        let t = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.try_acquire_owned(1, 2))
        };
        l.set_limit(1).unwrap();
        let mine = l.try_acquire_owned(1, 1);
        let theirs = t.join().unwrap();
        assert!(
            !(mine.is_ok() && theirs.is_ok()),
            "both held: {mine:?} {theirs:?}"
        );
        if let Ok(permit) = &mine {
            assert_eq!(permit.permits(), 1);
            assert_eq!(l.available(&1), 0, "main's permit is not on the key's cell");
            assert_eq!(l.len(), 1);
            assert_eq!(l.sweep(), 0, "a key with a permit out was evicted");
        }
        drop((mine, theirs));
        assert_eq!(l.available(&1), 1);
        let stats = l.stats();
        assert_eq!(stats.admitted + stats.rejected, 2, "{stats:?}");
        l.sweep();
        assert_eq!(l.len(), 0, "the key count drifted");
    });
}

/// A head marks the key's word and leaves (its future dropped), so the mark outlives it; then
/// the two permits it waited for are released by two threads while a sweep runs. Both releases
/// read the mark; one clears it, the key turns idle and may be evicted, and the other's clear
/// must not land on the retired word (it would turn RETIRED into a live word with every permit
/// "in use", which callers meet until the sweep removes the entry). Whatever the order, the key
/// serves its limit once both permits are back. (Bound 2: fails within a minute on the old
/// clear; bound 3 takes half an hour on this machine.)
#[test]
fn two_releases_of_a_marked_word_race_a_sweep() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    model_bounded(2, || {
        let l = limiter(2);
        let a = l.try_acquire_owned(1, 1).unwrap();
        let b = l.try_acquire_owned(1, 1).unwrap();
        {
            let mut head = std::pin::pin!(l.acquire_n(&1, 2));
            let polled = head.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(matches!(polled, Poll::Pending));
        }
        let releaser = thread::spawn(move || drop(a));
        let sweeper = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        };
        drop(b);
        releaser.join().unwrap();
        // Both permits are back: whatever the sweep has done so far (nothing, retired the cell,
        // or removed it too), the key serves its limit, also between the sweep's retirement and
        // its removal of the entry.
        let both = l.try_acquire_n(&1, 2);
        assert!(
            both.is_ok(),
            "the key no longer serves its limit: {:?}",
            both.err()
        );
        drop(both);
        assert!(sweeper.join().unwrap() <= 1);
    });
}

/// Key 1's head (queued and marked) is woken by the release of the permit it waits for while a
/// caller for key 2 looks for room under a cap of one key. Key 1's word is then idle (nothing in
/// use, the mark consumed), but its woken head has yet to take: the key must not be evicted for
/// key 2, or the head would find no room for a fresh cell and fail with `TooManyKeys`. (Bound 2
/// finds the eviction without the check.)
#[test]
fn a_woken_head_keeps_its_key_at_the_cap() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    model_bounded(2, || {
        let l = one_key_slot();
        let held = l.try_acquire_owned(1, 1).unwrap();
        let mut head = Box::pin(l.acquire(&1));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(head.as_mut().poll(&mut cx).is_pending());
        let other = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.try_acquire(&2).is_ok())
        };
        drop(held);
        let served = match head.as_mut().poll(&mut cx) {
            Poll::Ready(outcome) => outcome.map(|p| p.permits()),
            Poll::Pending => panic!("the woken head was not served"),
        };
        assert_eq!(served, Ok(1), "the woken head lost its key");
        drop(head);
        // Key 2 may get in once key 1's permit (dropped with `served`'s guard) is back.
        let _ = other.join().unwrap();
    });
}

/// One key slot (key 0's, one permit out) and the shared pool's one permit out (key 2's): key 3
/// blocks on the pool while key 0's permit is released, which leaves key 0 idle, room for key
/// 3's own cell. The head marks the pool and looks for room; the release makes its key idle and
/// reads the pool's mark. Either the release sees the mark and wakes the head, or the head's
/// second look (after its fence) finds key 0 idle: it is always served with the pool still out.
/// Without the head's second look, or the release's wake, loom reports the head asleep forever.
#[test]
fn a_pool_head_is_served_by_another_key_going_idle() {
    model(|| {
        let l = shared_pool(1, 1);
        let own = l.try_acquire_owned(0, 1).unwrap();
        let _pool = l.try_acquire_owned(2, 1).unwrap();
        let waiter = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.acquire_blocking(&3).map(|p| p.permits()))
        };
        drop(own);
        assert_eq!(waiter.join().unwrap(), Ok(1));
    });
}

/// As above, but key 0's release comes first, while key 0 has a waiter of its own, which keeps
/// the idle key from eviction; that waiter then leaves (its future dropped) as key 3 blocks on
/// the pool. Its leaving is the room: either key 3's second look (after its fence) finds key 0
/// without waiters and evicts it, or the leaving reads key 3's mark on the pool and wakes it.
/// Without the wake on leaving, loom reports key 3 asleep forever (until a pool release).
/// `racing_release`: key 0's release runs on a thread of its own, racing too: the call that
/// leaves then looks at key 0's cell (only an idle cell is room worth a wake), and must not
/// read it busy while the head's look found the key kept by that call.
fn a_pool_head_and_an_idle_keys_last_waiter_leaving(racing_release: bool) {
    use std::future::Future;
    use std::task::{Context, Waker};
    model(move || {
        let l = shared_pool(1, 1);
        let own = l.try_acquire_owned(0, 1).unwrap();
        let _pool = l.try_acquire_owned(2, 1).unwrap();
        let mut kept = Box::pin(l.acquire(&0));
        assert!(
            kept.as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
        );
        let releaser = if racing_release {
            Some(thread::spawn(move || drop(own)))
        } else {
            drop(own); // key 0 idle, kept by its waiter
            None
        };
        let waiter = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.acquire_blocking(&3).map(|p| p.permits()))
        };
        drop(kept);
        if let Some(releaser) = releaser {
            releaser.join().unwrap();
        }
        assert_eq!(waiter.join().unwrap(), Ok(1));
    });
}

#[test]
fn a_pool_head_is_served_when_an_idle_keys_last_waiter_leaves() {
    a_pool_head_and_an_idle_keys_last_waiter_leaving(false);
}

#[test]
fn a_pool_head_is_served_when_an_idle_keys_last_waiter_leaves_racing_the_release() {
    a_pool_head_and_an_idle_keys_last_waiter_leaving(true);
}

/// Two key slots (key 0 busy, key 1 idle) and the pool's one permit out: key 3 waits for the
/// pool while a `sweep` runs. A search for room skips a shard being swept (left to its
/// sweeper), so key 3's looks may miss idle key 1 while the sweep holds its shard; the sweep
/// then evicts it and gives its slot back. Either key 3's look (after its mark and fence) sees
/// the slot, or the sweep (after its fence) reads the mark and wakes it: it is always served.
/// Without the sweep's wake, loom reports key 3 asleep forever.
#[test]
fn a_pool_head_is_served_by_the_room_a_racing_sweep_makes() {
    model(|| {
        let l = shared_pool(1, 2);
        let _busy = l.try_acquire_owned(0, 1).unwrap();
        let one = l.try_acquire_owned(1, 1).unwrap();
        let _pool = l.try_acquire_owned(2, 1).unwrap();
        drop(one); // key 1 idle
        let sweeper = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.sweep())
        };
        assert_eq!(l.acquire_blocking(&3).map(|p| p.permits()), Ok(1));
        sweeper.join().unwrap();
    });
}

/// The shard (of the two under loom) that the store puts `key` in: the high half of its hash.
fn shard_of(key: u64) -> u64 {
    use std::hash::BuildHasher;
    (Fixed::default().hash_one(key) >> 32) & 1
}

/// Three key slots (key 0 busy, keys `a` and `b` idle, in one shard) and the pool's one permit
/// out: key `t`, new, takes a permit while key `h` waits for the pool. `t`'s search for room
/// evicts both idle keys of the shard it walks and takes one slot; the other is room for `h`,
/// whose looks skip the shard while the search holds it (left to its sweeper). Either `h`'s
/// look (after its mark and fence) reserves the slot, or the search's call (after its fence)
/// reads the mark and wakes it: it is always served. Without that wake, loom reports `h` asleep
/// forever (the pool's permit is never released).
#[test]
fn a_pool_head_is_served_by_the_room_another_keys_search_leaves_over() {
    let same: Vec<u64> = (10..)
        .filter(|&k| shard_of(k) == shard_of(10))
        .take(4)
        .collect();
    let (a, b, t, h) = (same[0], same[1], same[2], same[3]);
    model(move || {
        let l = shared_pool(1, 3);
        let _busy = l.try_acquire_owned(0, 1).unwrap();
        let idle = (
            l.try_acquire_owned(a, 1).unwrap(),
            l.try_acquire_owned(b, 1).unwrap(),
        );
        let _pool = l.try_acquire_owned(2, 1).unwrap();
        drop(idle);
        // The search's call keeps what it took until `h` is served (handed back through the
        // join): its release would leave `t` idle, which is room announced anyway.
        let searcher = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.try_acquire_owned(t, 1).ok())
        };
        assert_eq!(l.acquire_blocking(&h).map(|p| p.permits()), Ok(1));
        // Served, or refused by the pool if its search skipped the shard `h`'s was walking and
        // found no slot yet: a `try_acquire` does not wait.
        drop(searcher.join().unwrap());
    });
}

/// A waker that records that it was woken (loom-visible).
#[derive(Default)]
struct Flag(loom::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `limit` permits per key and for the shared pool (`KeyOverflow::Shared`), `max_keys` key
/// slots, oldest first.
fn shared_pool(limit: u32, max_keys: usize) -> Arc<Limiter> {
    Arc::new(
        KeyedConcurrencyLimiter::<u64>::builder(limit)
            .hasher(Fixed::default())
            .max_keys(max_keys)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap(),
    )
}

/// Key 3's head waits for the shared pool (oldest first); the pool's permit is released while
/// key 4, with no queue and at the cap, tries the pool. Key 4 is always refused (no barging:
/// the head is counted among the pool's waiters before key 4 looks), and the head is always
/// woken by the release and served.
#[test]
fn a_newcomer_at_the_cap_does_not_barge_past_a_pool_head() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    model(|| {
        let l = shared_pool(1, 1);
        let _own = l.try_acquire_owned(0, 1).unwrap();
        let pooled = l.try_acquire_owned(2, 1).unwrap();
        let woken = std::sync::Arc::new(Flag::default());
        let waker = Waker::from(std::sync::Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        let mut head = Box::pin(l.acquire(&3));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        let releaser = thread::spawn(move || drop(pooled));
        let newcomer = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.try_acquire(&4).is_ok())
        };
        releaser.join().unwrap();
        assert!(
            !newcomer.join().unwrap(),
            "key 4 barged past the pool's head"
        );
        assert!(
            woken.0.load(Ordering::SeqCst),
            "the pool's head was not woken"
        );
        let served = match head.as_mut().poll(&mut cx) {
            Poll::Ready(outcome) => outcome.map(|p| p.permits()),
            Poll::Pending => panic!("the woken head was not served"),
        };
        assert_eq!(served, Ok(1));
    });
}

/// The pair between a head joining the pool's waiters and one leaving them. Key 3's head waits
/// for a pool of two permits, which come back and wake it; key 4's `acquire_blocking` at the
/// cap races key 3's head being served (one permit, one left free). Key 4 either takes the
/// free permit (key 3 has left), or defers to key 3 (joins, marks the pool) and must then be
/// woken when key 3 leaves with a permit free: loom reports it asleep forever otherwise.
#[test]
fn a_head_deferring_to_a_pool_head_is_woken_when_it_leaves() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    model(|| {
        let l = shared_pool(2, 1);
        let _own = l.try_acquire_owned(0, 1).unwrap();
        let pooled = l.try_acquire_owned(2, 2).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let mut head = Box::pin(l.acquire(&3));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        drop(pooled); // wakes key 3's head; two permits free
        let late = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.acquire_blocking(&4).map(|p| p.permits()))
        };
        let served = match head.as_mut().poll(&mut cx) {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => panic!("the woken head was not served"),
        };
        let served = served.expect("key 3 served");
        // Key 3 holds its permit: key 4 is served by the one left free.
        assert_eq!(late.join().unwrap(), Ok(1));
        drop(served);
    });
}

/// As above, but key 3's head leaves without taking (its future is dropped) while key 4's
/// `acquire_blocking` at the cap defers to it: key 4 is served by the permit left free.
#[test]
fn a_head_deferring_to_a_cancelled_pool_head_is_woken() {
    use std::future::Future;
    use std::task::{Context, Waker};
    model(|| {
        let l = shared_pool(1, 1);
        let _own = l.try_acquire_owned(0, 1).unwrap();
        let pooled = l.try_acquire_owned(2, 1).unwrap();
        let mut head = Box::pin(l.acquire(&3));
        assert!(
            head.as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
        );
        drop(pooled); // wakes key 3's head; the permit is free
        let late = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.acquire_blocking(&4).map(|p| p.permits()))
        };
        drop(head); // cancelled: leaves the pool's waiters, the permit untaken
        assert_eq!(late.join().unwrap(), Ok(1));
    });
}

/// A waiting `acquire_owned` of the model below, polled by hand.
type Head = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<turnstile::OwnedKeyedPermit<u64, Fixed>, turnstile::AcquireError>,
            > + Send,
    >,
>;

/// Polls `head` once with a waker that does nothing (a spurious poll is allowed: it looks again).
fn poll_head(
    head: &mut Head,
) -> std::task::Poll<Result<turnstile::OwnedKeyedPermit<u64, Fixed>, turnstile::AcquireError>> {
    use std::task::{Context, Waker};
    head.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Two heads in two keys' queues, both waiting for the shared pool (key 3's and key 4's, one
/// permit each), make their attempts at once, each under its own queue's mutex, while the limit
/// changes (2 → 4 before, 4 → 3 during). The interleaving of interest: both take a permit under
/// limit 4 (the pool's `WAITERS` mark stays set); the change lands; key 3's head gives its stale
/// permit back (consuming the mark: it owes every pool head a wake), decides again under limit 3,
/// is short and marks the pool; key 4's head gives its stale permit back (consuming that mark: it
/// owes a wake too) and takes. Each owes a wake to the other's queue. Woken from inside the
/// attempt (under the waker's own queue's mutex), each would lock the other's queue while holding
/// its own (ABBA), and loom reports the deadlock; the wakes must run after the attempt unlocks.
/// Each head is then served once the pool's permits are back.
#[test]
fn two_pool_heads_owing_each_other_a_wake_do_not_deadlock() {
    use std::task::Poll;
    model(|| {
        let l = shared_pool(2, 1);
        let _own = l.try_acquire_owned(0, 1).unwrap();
        let pooled = l.try_acquire_owned(2, 2).unwrap();
        let mut heads: Vec<Head> = vec![
            Box::pin(l.acquire_owned(3, 1)),
            Box::pin(l.acquire_owned(4, 1)),
        ];
        for head in &mut heads {
            assert!(
                poll_head(head).is_pending(),
                "the pool is out: the head waits"
            );
        }
        // Room for both in the pool, whose mark stays set (a change of limit consumes none).
        l.set_limit(4).unwrap();
        let racers: Vec<_> = heads
            .into_iter()
            .map(|mut head| {
                thread::spawn(move || match poll_head(&mut head) {
                    Poll::Ready(served) => Err(served),
                    Poll::Pending => Ok(head),
                })
            })
            .collect();
        l.set_limit(3).unwrap();
        let outcomes: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        drop(pooled);
        let mut held = Vec::new();
        for outcome in outcomes {
            let served = match outcome {
                Err(served) => served,
                Ok(mut head) => match poll_head(&mut head) {
                    Poll::Ready(served) => served,
                    Poll::Pending => panic!("a head was not served with the pool free"),
                },
            };
            held.push(served.expect("served").permits());
        }
        assert_eq!(held, [1, 1]);
    });
}

/// The wake a head's attempt owes is deferred to after its queue's mutex is released, never
/// lost. Key 3's head (polled by hand) and key 4's `acquire_blocking` both want a pool of one
/// permit, which has just been released (waking key 3's head), while the limit is set again
/// (same value, new generation). The interleaving of interest: key 3's head takes the permit
/// under the old `config`; key 4's head, short, marks the pool and sleeps; the change lands;
/// key 3's head gives its stale permit back, consuming key 4's mark (the wake is now its debt),
/// and takes again. Unless that debt is paid after the attempt, key 4 sleeps with no mark for
/// key 3's release to read, and loom reports it asleep forever.
///
/// The pool's permit is released before key 4 starts (as in the two models above): the release
/// racing key 4's registration is a plain release-vs-waiter race (`release_vs_waiter_registration`,
/// `a_pool_head_is_served_by_another_key_going_idle`), and the interleaving above begins only once
/// the permit is free. Released concurrently, it multiplied the interleavings loom explored here
/// for nothing this model is about.
///
/// Preemptions capped at 2 (`LOOM_MAX_PREEMPTIONS=2`, the architecture's standard run): three
/// racing threads (two pool heads and the limit change) made CI's bound of 3 take over a minute.
/// The interleaving above needs one preemption (key 3's head between its CAS and its re-check of
/// `config`; key 4's sleep and the main thread's join hand the turn on without one): with the
/// deferred pool wake dropped, the model still reports key 4 asleep forever at this bound.
#[test]
fn a_head_owing_a_pool_wake_pays_it_after_its_attempt() {
    use std::task::Poll;
    model_capped(2, || {
        let l = shared_pool(1, 1);
        let _own = l.try_acquire_owned(0, 1).unwrap();
        let pooled = l.try_acquire_owned(2, 1).unwrap();
        let mut head: Head = Box::pin(l.acquire_owned(3, 1));
        assert!(
            poll_head(&mut head).is_pending(),
            "the pool is out: the head waits"
        );
        drop(pooled); // wakes key 3's head; the permit is free
        let late = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.acquire_blocking(&4).map(|p| p.permits()))
        };
        let racer = thread::spawn(move || match poll_head(&mut head) {
            Poll::Ready(served) => Err(served),
            Poll::Pending => Ok(head),
        });
        l.set_limit(1).unwrap();
        // Key 3 served (now, or on a poll once key 4 is done with the permit), key 4 too.
        match racer.join().unwrap() {
            Err(served) => {
                drop(served.expect("key 3 served"));
                assert_eq!(late.join().unwrap(), Ok(1));
            }
            Ok(mut head) => {
                assert_eq!(late.join().unwrap(), Ok(1));
                match poll_head(&mut head) {
                    Poll::Ready(served) => assert_eq!(served.map(|p| p.permits()), Ok(1)),
                    Poll::Pending => panic!("key 3's head was not served with the pool free"),
                }
            }
        }
    });
}

/// The keyed twin of loom_waiters' `lowered_limit_vs_enqueue_of_a_request_it_makes_too_big`.
/// Key 1 holds both permits and a head waits for one of them; a `set_limit(1)` races an
/// `acquire_blocking_n(&1, 2)`, which checks the limit in its fast path without the queue's
/// mutex. Whether that call meets the new limit in its fast path, in the key's queue (the
/// sweep fails it), or only as it enqueues after the sweep, it must fail
/// `InsufficientCapacity` and never wait behind the head, which the main thread serves only
/// after joining it (a wait is a deadlock loom reports). Before the enqueue read the limit under
/// the queue's mutex, a call that read 2 and enqueued after the sweep waited there.
#[test]
fn lowered_limit_vs_enqueue_of_a_request_it_makes_too_big() {
    use std::task::Poll;
    model(|| {
        let l = limiter(2);
        let held = l.try_acquire_owned(1, 2).unwrap();
        let mut head: Head = Box::pin(l.acquire_owned(1, 1));
        assert!(poll_head(&mut head).is_pending(), "the key is full");
        let lower = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.set_limit(1).unwrap())
        };
        let big = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.acquire_blocking_n(&1, 2).map(|p| p.permits()))
        };
        lower.join().unwrap();
        assert_eq!(
            big.join().unwrap(),
            Err(turnstile::AcquireError::InsufficientCapacity {
                requested: 2,
                capacity: 1
            })
        );
        drop(held);
        let Poll::Ready(served) = poll_head(&mut head) else {
            panic!("the head was not served once the permits came back");
        };
        assert_eq!(served.map(|p| p.permits()), Ok(1));
        drop(head);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.waiting), (2, 1, 0), "{s:?}");
    });
}

/// `close` races a waiter joining key 1's queue (`Waits::close`, the keyed rate limiter's
/// `a_waiter_joining_during_close` on this limiter's path: its fence is `registered`). Key 1's
/// one permit is held for the whole model, so the waiter ends only if the close fails it: at
/// its first poll or, polled again once the closer is done, at its second. Pending then, it
/// was left in a queue nobody will close. The permit held comes back after the close.
#[test]
fn a_waiter_joining_during_close_is_failed() {
    model(|| {
        let l = limiter(1);
        let held = l.try_acquire_owned(1, 1).unwrap();
        let closer = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.close())
        };
        let mut waiter = Box::pin(l.acquire(&1));
        let outcome = common::outcome_once_joined(waiter.as_mut(), closer);
        assert_eq!(outcome.map(|p| p.permits()), Err(AcquireError::Closed));
        drop(waiter);
        drop(held);
        assert_eq!(l.available(&1), 1);
        assert_eq!(l.try_acquire(&2).unwrap_err(), TryPermitError::Closed);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected), (1, 2), "{s:?}");
        assert_eq!((s.cancelled, s.waiting, s.waiting_keys), (0, 0, 0), "{s:?}");
    });
}

/// Key 1 is held; two callers each wait for it with no time to spare (a zero timeout: they
/// queue, give up at once and retire the key's queue if they leave it empty). The one that
/// finds the queue the other has just inserted may retire it, and uncount it, before its
/// creator has counted it: counted after the insert, the count went from 0 to `u64::MAX` and
/// set the closed bit it shares a word with, so `is_closed` said true and every call failed
/// `Closed` until the creator's increment. Counted before the insert, never.
#[test]
fn a_queue_retired_as_it_is_created_never_closes_the_limiter() {
    model(|| {
        let l = limiter(1);
        let held = l.try_acquire_owned(1, 1).unwrap();
        let other = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                l.acquire_blocking_timeout(&1, 1, std::time::Duration::ZERO)
                    .map(|p| p.permits())
            })
        };
        let mine = l
            .acquire_blocking_timeout(&1, 1, std::time::Duration::ZERO)
            .map(|p| p.permits());
        assert_eq!(mine, Err(AcquireError::Timeout));
        assert!(!l.is_closed(), "a limiter nobody closed says closed");
        drop(l.try_acquire(&2).expect("a free key refused"));
        assert_eq!(other.join().unwrap(), Err(AcquireError::Timeout));
        drop(held);
        let s = l.stats();
        assert_eq!((s.waiting, s.waiting_keys), (0, 0), "{s:?}");
        assert!(!l.is_closed());
    });
}

/// A release that leaves a key idle races a new key's search for room at the cap (one slot,
/// held by that key): once the release is done, a new key gets the slot at once, wherever the
/// search's look at the key landed (the search may find it busy and say "never"). Fails if the
/// sweep's look at a busy cell is a load instead of a read-modify-write (`busy_until_a_release`).
#[test]
fn a_release_racing_a_search_for_room_at_the_cap_leaves_room() {
    release_racing_a_search(false);
}

/// As above, with the key's shard already marked "never" by a sweep that found the key busy:
/// the search may skip the shard on its hint, so either it reads the release's lowering or
/// the release reads its swap of `room_at` (the fences in `make_room` and `Ctx::idle_hint`).
#[test]
fn a_release_racing_a_search_that_skips_the_shard_leaves_room() {
    release_racing_a_search(true);
}

fn release_racing_a_search(swept_first: bool) {
    model(move || {
        let l = one_key_slot();
        let held = l.try_acquire_owned(1, 1).unwrap();
        if swept_first {
            assert_eq!(l.sweep(), 0, "key 1 is busy");
        }
        let releaser = thread::spawn(move || drop(held));
        let newcomer = l.try_acquire(&2).map(drop);
        releaser.join().unwrap();
        if newcomer.is_err() {
            assert!(
                l.try_acquire(&3).is_ok(),
                "key 1 is idle: a new key gets its slot"
            );
        }
    });
}
