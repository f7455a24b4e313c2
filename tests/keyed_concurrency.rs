//! `KeyedConcurrencyLimiter`: the per-key limit on real threads, eviction that never drops a key
//! with permits out, the cap, waiting (try/async/blocking), per-key FIFO on paused time, and
//! cancellation that leaves the books balanced and no queue behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::Waker;
use std::time::Duration;
use turnstile::{AcquireError, KeyOverflow, KeyedConcurrencyLimiter, QueueOrder, TryPermitError};

#[path = "common/wakers.rs"]
mod wakers;

#[path = "common/close_race.rs"]
mod close_race;
use close_race::waiters_racing_close;
use wakers::{counting, must_panic, panicky, poll_with};

#[test]
fn per_key_limit_holds_on_real_threads() {
    const LIMIT: u32 = 3;
    const KEYS: usize = 4;
    let limiter = KeyedConcurrencyLimiter::<usize>::new(LIMIT).unwrap();
    let inside: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let calls = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (limiter, inside, calls) = (limiter.clone(), inside.clone(), calls.clone());
            std::thread::spawn(move || {
                for i in 0..1500 {
                    let key = (t + i) % KEYS;
                    calls.fetch_add(1, Ordering::Relaxed);
                    let permit = if i % 3 == 0 {
                        match limiter.try_acquire(&key) {
                            Ok(p) => p,
                            Err(TryPermitError::NoPermits { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    } else {
                        limiter.acquire_blocking(&key).unwrap()
                    };
                    let now = inside[key].fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= LIMIT, "key {key}: {now} in flight");
                    if i % 7 == 0 {
                        std::thread::yield_now();
                    }
                    inside[key].fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    if i % 100 == 0 {
                        limiter.sweep();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = limiter.stats();
    assert_eq!(
        stats.admitted + stats.rejected + stats.cancelled,
        calls.load(Ordering::Relaxed)
    );
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
    for key in 0..KEYS {
        assert_eq!(limiter.available(&key), LIMIT);
    }
    limiter.sweep();
    assert!(limiter.is_empty(), "{} keys left", limiter.len());
}

#[test]
fn keys_are_independent() {
    let limiter = KeyedConcurrencyLimiter::new(1).unwrap();
    let _a = limiter.try_acquire(&"a").unwrap();
    assert!(matches!(
        limiter.try_acquire(&"a"),
        Err(TryPermitError::NoPermits {
            available: 0,
            requested: 1
        })
    ));
    let _b = limiter.try_acquire(&"b").unwrap();
    assert!(matches!(
        limiter.try_acquire_n(&"c", 2),
        Err(TryPermitError::InsufficientCapacity {
            requested: 2,
            capacity: 1
        })
    ));
    // A probe creates no key.
    assert!(limiter.try_acquire_n(&"d", 0).is_ok());
    assert_eq!(limiter.len(), 2);
}

#[test]
fn eviction_takes_idle_keys_and_never_keys_with_permits_out() {
    let limiter = KeyedConcurrencyLimiter::new(2).unwrap();
    for k in 0..100u32 {
        drop(limiter.try_acquire(&k).unwrap());
    }
    let held = limiter.try_acquire_n(&7u32, 2).unwrap();
    let owned = limiter.try_acquire_owned(8u32, 1).unwrap();
    // Calls for new keys may have evicted some idle keys already (an insert sweeps its shard
    // once it has had as many inserts as keys): the sweep takes the rest, 98 in all.
    let inline = limiter.stats().evicted;
    let swept = limiter.sweep() as u64;
    assert_eq!(
        inline + swept,
        98,
        "evicted by inserts: {inline}, by the sweep: {swept}"
    );
    assert_eq!(limiter.len(), 2);
    assert_eq!(limiter.sweep(), 0, "held keys stay");
    assert!(limiter.try_acquire(&7u32).is_err(), "key 7 kept its state");
    assert_eq!(limiter.available(&8u32), 1);
    drop(held);
    assert_eq!(limiter.available(&7u32), 2);
    drop(owned);
    assert_eq!(limiter.sweep(), 2);
    assert!(limiter.is_empty());
    assert_eq!(limiter.stats().evicted, 100);
}

#[test]
fn a_sweeper_racing_holders_never_loses_a_permit() {
    let limiter = KeyedConcurrencyLimiter::<u64>::new(1).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (limiter, stop) = (limiter.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                limiter.sweep();
            }
        })
    };
    let inside: Arc<Vec<AtomicU32>> = Arc::new((0..8).map(|_| AtomicU32::new(0)).collect());
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let (limiter, inside) = (limiter.clone(), inside.clone());
            std::thread::spawn(move || {
                for i in 0..3000u64 {
                    let key = (i * 3 + t) % 8;
                    let p = limiter.acquire_blocking(&key).unwrap();
                    assert_eq!(inside[key as usize].fetch_add(1, Ordering::SeqCst), 0);
                    inside[key as usize].fetch_sub(1, Ordering::SeqCst);
                    drop(p);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    sweeper.join().unwrap();
    limiter.sweep();
    assert!(limiter.is_empty());
}

#[test]
fn the_cap_evicts_idle_keys_first_then_applies_the_policy() {
    let limiter = KeyedConcurrencyLimiter::builder(1)
        .max_keys(2)
        .overflow(KeyOverflow::Reject)
        .build()
        .unwrap();
    let _a = limiter.try_acquire(&1u8).unwrap();
    drop(limiter.try_acquire(&2u8).unwrap()); // idle now
    let _c = limiter.try_acquire(&3u8).unwrap(); // evicts key 2
    assert_eq!(limiter.len(), 2);
    assert_eq!(
        limiter.try_acquire(&4u8).unwrap_err(),
        TryPermitError::TooManyKeys { max_keys: 2 }
    );
    assert_eq!(limiter.stats().overflowed, 1);
    drop(_c);
    assert!(limiter.try_acquire(&4u8).is_ok(), "room once key 3 is idle");

    let shared = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _a = shared.try_acquire(&1u8).unwrap();
    let b = shared.try_acquire(&2u8).unwrap();
    assert!(
        shared.try_acquire(&3u8).is_err(),
        "one pool for all overflow keys"
    );
    drop(b); // back to the pool, not to a key
    let _c = shared.try_acquire(&3u8).unwrap();
    assert_eq!(shared.len(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn overflow_waiters_are_woken_by_pool_releases() {
    let limiter = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _a = limiter.try_acquire_owned(1u8, 1).unwrap();
    let b = limiter.try_acquire_owned(2u8, 1).unwrap(); // the pool
    let waiter = tokio::spawn(limiter.acquire_owned(3u8, 1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!waiter.is_finished());
    drop(b);
    let c = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    assert_eq!(*c.key(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn waiters_of_a_key_are_served_in_order() {
    let limiter = KeyedConcurrencyLimiter::new(1).unwrap();
    let first = limiter.try_acquire_owned("k", 1).unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (limiter, order) = (limiter.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let permit = limiter.acquire(&"k").await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(permit);
        }));
        tokio::time::sleep(Duration::from_millis(1)).await; // arrival order
    }
    // No barging while they wait; other keys are free.
    assert!(limiter.try_acquire(&"k").is_err());
    assert!(limiter.try_acquire(&"other").is_ok());
    assert_eq!(limiter.stats().waiting, 5);
    drop(first);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
}

#[test]
fn a_blocked_thread_is_woken_by_a_release_and_timeouts_leave() {
    let limiter = KeyedConcurrencyLimiter::new(2).unwrap();
    let held = limiter.try_acquire_n(&1u32, 2).unwrap();
    let late = limiter.acquire_blocking_timeout(&1, 1, Duration::from_millis(5));
    assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    let waiter = {
        let limiter = limiter.clone();
        std::thread::spawn(move || limiter.acquire_blocking_n(&1u32, 2).map(|p| p.permits()))
    };
    // Queued before the release, so that the release is what must wake it.
    while limiter.stats().waiting == 0 && !waiter.is_finished() {
        std::thread::yield_now();
    }
    drop(held);
    assert_eq!(waiter.join().unwrap().unwrap(), 2);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.cancelled, stats.waiting), (2, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stress_balances_the_books() {
    let limiter = KeyedConcurrencyLimiter::<u32>::new(2).unwrap();
    let inside: Arc<Vec<AtomicU32>> = Arc::new((0..4).map(|_| AtomicU32::new(0)).collect());
    let mut tasks = Vec::new();
    let calls = 4 * 400;
    for t in 0..4u32 {
        let (limiter, inside) = (limiter.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..400u32 {
                let key = (t + i) % 4;
                let wait = Duration::from_micros(u64::from(i % 5) * 50);
                let attempt = limiter.acquire_timeout(&key, 1 + i % 2, wait);
                if i % 11 == 0 {
                    // Dropped mid-wait by a select: an abort at an await point.
                    tokio::select! {
                        _ = attempt => {}
                        _ = tokio::task::yield_now() => {}
                    }
                    continue;
                }
                if let Ok(permit) = attempt.await {
                    let now = inside[key as usize].fetch_add(permit.permits(), Ordering::SeqCst)
                        + permit.permits();
                    assert!(now <= 2);
                    tokio::task::yield_now().await;
                    inside[key as usize].fetch_sub(permit.permits(), Ordering::SeqCst);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = limiter.stats();
    assert_eq!(stats.admitted + stats.rejected + stats.cancelled, calls);
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
    for key in 0..4 {
        assert_eq!(limiter.available(&key), 2);
    }
    limiter.sweep();
    assert!(limiter.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_permits_cross_tasks() {
    let limiter = KeyedConcurrencyLimiter::new(1).unwrap();
    let mut handles = Vec::new();
    for i in 0..20u32 {
        let permit = limiter.acquire_owned(i % 2, 1).await.unwrap();
        handles.push(tokio::spawn(async move {
            tokio::task::yield_now().await;
            drop(permit);
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(limiter.stats().admitted, 20);
    assert_eq!(limiter.available(&0), 1);
}

// ---- set_limit (issue 4: reconfiguration applies to every key) ----

/// Awaits `handle`, failing (not hanging) if it never finishes: paused time auto-advances to
/// the deadline only when every task is idle, so a lost wake-up shows as an error here.
async fn finished<T>(handle: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), handle)
        .await
        .expect("a waiter was never woken")
        .unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn set_limit_raise_wakes_waiters_on_several_keys() {
    let limiter = KeyedConcurrencyLimiter::<u32>::new(1).unwrap();
    let held: Vec<_> = (0..3).map(|k| limiter.try_acquire(&k).unwrap()).collect();
    let waiters: Vec<_> = (0..3)
        .map(|k| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire_owned(k, 1).await.map(|p| *p.key()) })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 3);
    limiter.set_limit(2).unwrap();
    assert_eq!(limiter.limit(), 2);
    let mut served = Vec::new();
    for waiter in waiters {
        served.push(finished(waiter).await.unwrap());
    }
    assert_eq!(served, vec![0, 1, 2]);
    // The held permits are still counted: each key is at its new limit of 2 (1 held + 1 served,
    // the latter dropped by now), so one more fits per key and no second.
    for k in 0..3 {
        assert_eq!(limiter.available(&k), 1);
    }
    drop(held);
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
}

#[test]
fn set_limit_lowering_keeps_held_permits_and_admits_nothing_until_below() {
    let limiter = KeyedConcurrencyLimiter::<&str>::new(4).unwrap();
    let a1 = limiter.try_acquire_n(&"a", 2).unwrap();
    let a2 = limiter.try_acquire(&"a").unwrap();
    let b = limiter.try_acquire(&"b").unwrap();
    limiter.set_limit(2).unwrap();
    assert_eq!(limiter.limit(), 2);
    // "a" holds 3 > 2: nothing revoked, nothing new.
    assert_eq!(limiter.available(&"a"), 0);
    assert!(matches!(
        limiter.try_acquire(&"a"),
        Err(TryPermitError::NoPermits { available: 0, .. })
    ));
    assert_eq!(limiter.len(), 2, "a key with permits out is kept");
    assert_eq!(limiter.sweep(), 0);
    drop(a2); // 2 in use: still not below the limit
    assert!(limiter.try_acquire(&"a").is_err());
    drop(a1); // 0 in use
    let again = limiter.try_acquire_n(&"a", 2).unwrap();
    assert!(limiter.try_acquire(&"a").is_err());
    // "b" holds 1 of 2: exactly one more.
    let b2 = limiter.try_acquire(&"b").unwrap();
    assert!(limiter.try_acquire(&"b").is_err());
    // New keys get the new limit.
    assert!(matches!(
        limiter.try_acquire_n(&"c", 3),
        Err(TryPermitError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    ));
    drop((again, b, b2));
    assert_eq!(limiter.sweep(), 2);
    assert!(limiter.is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn set_limit_fails_waiters_that_can_never_fit() {
    let limiter = KeyedConcurrencyLimiter::<u32>::new(4).unwrap();
    let held: Vec<_> = (0..2)
        .map(|k| limiter.try_acquire_n(&k, 4).unwrap())
        .collect();
    let big: Vec<_> = (0..2)
        .map(|k| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire_owned(k, 3).await.map(|p| p.permits()) })
        })
        .collect();
    let small = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_owned(0, 1).await.map(|p| p.permits()) })
    };
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 3);
    limiter.set_limit(2).unwrap();
    for waiter in big {
        assert_eq!(
            finished(waiter).await,
            Err(AcquireError::InsufficientCapacity {
                requested: 3,
                capacity: 2
            })
        );
    }
    // The one that fits waits for the drain, then is served.
    tokio::task::yield_now().await;
    assert!(!small.is_finished());
    drop(held);
    assert_eq!(finished(small).await, Ok(1));
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
    assert_eq!(stats.rejected, 2);
}

#[test]
fn a_key_evicted_and_recreated_after_set_limit_uses_the_new_limit() {
    let limiter = KeyedConcurrencyLimiter::<u8>::new(2).unwrap();
    drop(limiter.try_acquire_n(&1, 2).unwrap());
    drop(limiter.try_acquire_n(&2, 2).unwrap());
    assert_eq!(limiter.sweep(), 1 + 1);
    limiter.set_limit(3).unwrap();
    // Key 1 was evicted before the change, and is recreated after it.
    let three = limiter.try_acquire_n(&1, 3).unwrap();
    assert!(limiter.try_acquire(&1).is_err());
    drop(three);
    // Key 1 is evicted after the change and recreated after a lowering.
    assert_eq!(limiter.sweep(), 1);
    limiter.set_limit(1).unwrap();
    let one = limiter.try_acquire(&1).unwrap();
    assert!(matches!(
        limiter.try_acquire(&1),
        Err(TryPermitError::NoPermits { available: 0, .. })
    ));
    assert!(matches!(
        limiter.try_acquire_n(&2, 2),
        Err(TryPermitError::InsufficientCapacity { .. })
    ));
    drop(one);
    assert_eq!(limiter.stats().evicted, 3);
}

#[test]
fn set_limit_zero_errors_and_changes_nothing() {
    let limiter = KeyedConcurrencyLimiter::<u8>::new(3).unwrap();
    let held = limiter.try_acquire_n(&1, 2).unwrap();
    assert_eq!(
        limiter.set_limit(0),
        Err(turnstile::ConfigError::Zero { what: "limit" })
    );
    assert_eq!(limiter.limit(), 3);
    assert_eq!(limiter.available(&1), 1);
    assert_eq!(limiter.len(), 1);
    let last = limiter.try_acquire(&1).unwrap();
    assert!(limiter.try_acquire(&1).is_err());
    drop((held, last));
    assert_eq!(limiter.available(&1), 3);
}

/// Real threads acquire and release on many keys while another thread flips the limit between
/// `LOW` and `HIGH`. Asserted inside every critical section:
///
/// 1. per key, holders in flight ≤ `HIGH` = max(old, new) at every moment, during changes too
///    (a lowering revokes nothing, so `LOW` cannot be asserted while older holders drain);
/// 2. per key, holders whose whole acquisition ran inside one stable period (the flip count was
///    the same even value before and after `try_acquire`: no `set_limit` started or ran) are
///    counted apart by the limit of that period
///    (flips alternate, so the parity of the count names the limit). Each of them was decided
///    under that limit against an in-use count that included every holder still out, so at
///    most that limit of them are ever in flight at once: ≤ `LOW` for the `LOW` periods.
///
/// What this cannot catch: an admission decided under the old limit whose compare-and-swap
/// lands after the change straddles the flip, so it is counted only in (1). That race is the
/// loom model `set_limit_racing_acquire_and_eviction` (which fails when the stale admission is
/// kept).
#[test]
fn set_limit_audit_on_real_threads() {
    const LOW: u32 = 2;
    const HIGH: u32 = 5;
    const KEYS: usize = 6;
    let limiter = KeyedConcurrencyLimiter::<usize>::new(LOW).unwrap();
    // 2f: f flips done and stable (f even: LOW in force, f odd: HIGH); 2f − 1: flip f running.
    let flips = Arc::new(AtomicU64::new(0));
    let inside: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let stable: Arc<Vec<[AtomicU32; 2]>> = Arc::new(
        (0..KEYS)
            .map(|_| [AtomicU32::new(0), AtomicU32::new(0)])
            .collect(),
    );
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (limiter, flips, inside, stable, done, admitted) = (
                limiter.clone(),
                flips.clone(),
                inside.clone(),
                stable.clone(),
                done.clone(),
                admitted.clone(),
            );
            std::thread::spawn(move || {
                let mut i = t;
                while !done.load(Ordering::Relaxed) {
                    i += 1;
                    let key = i % KEYS;
                    let before = flips.load(Ordering::SeqCst);
                    let Ok(permit) = limiter.try_acquire(&key) else {
                        continue;
                    };
                    let after = flips.load(Ordering::SeqCst);
                    admitted.fetch_add(1, Ordering::Relaxed);
                    let now = inside[key].fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= HIGH, "key {key}: {now} in flight > max(old, new)");
                    let slot =
                        (before == after && before % 2 == 0).then_some(((before / 2) & 1) as usize);
                    if let Some(p) = slot {
                        let limit = [LOW, HIGH][p];
                        let n = stable[key][p].fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(n <= limit, "key {key}: {n} decided under {limit}");
                    }
                    if i % 5 == 0 {
                        std::thread::yield_now();
                    }
                    if let Some(p) = slot {
                        stable[key][p].fetch_sub(1, Ordering::SeqCst);
                    }
                    inside[key].fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    if i % 97 == 0 {
                        limiter.sweep();
                    }
                }
            })
        })
        .collect();
    for flip in 1..=400u64 {
        let limit = if flip % 2 == 1 { HIGH } else { LOW };
        flips.store(2 * flip - 1, Ordering::SeqCst);
        limiter.set_limit(limit).unwrap();
        // Stable only once `set_limit` has returned and until the next one starts: a holder
        // that reads the same even value before and after its acquisition decided under it.
        flips.store(2 * flip, Ordering::SeqCst);
        for _ in 0..200 {
            std::hint::spin_loop();
        }
        std::thread::yield_now();
    }
    done.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    assert!(admitted.load(Ordering::Relaxed) > 0);
    assert_eq!(limiter.limit(), LOW);
    for key in 0..KEYS {
        assert_eq!(limiter.available(&key), LOW, "key {key} lost a permit");
    }
    // Everything is back: a sweep leaves no key.
    limiter.sweep();
    assert!(limiter.is_empty());
}

/// A waker that counts its wake-ups, for polling futures by hand in a chosen order.
fn counting_waker() -> (std::task::Waker, Arc<AtomicU32>) {
    struct Count(Arc<AtomicU32>);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let count = Arc::new(AtomicU32::new(0));
    (Arc::new(Count(count.clone())).into(), count)
}

/// Two overflow keys wait on the shared pool, in different keys' queues: `b` for 2 permits (short,
/// so its head marks the pool) and `a` for 1. A release wakes both heads; `b` is still short and
/// marks again, then `a` takes the last free permit. `a`'s take must not erase `b`'s mark: the
/// releases that follow must wake `b`, or it waits forever with the whole pool free.
#[test]
fn a_pool_head_served_keeps_the_mark_of_another_keys_head() {
    use std::future::Future;
    use std::task::{Context, Poll};
    let limiter = KeyedConcurrencyLimiter::builder(2)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _own = limiter.try_acquire(&0u8).unwrap(); // the only key slot, busy
    let x = limiter.try_acquire(&1u8).unwrap(); // the pool: 1 of 2 in use
    let y = limiter.try_acquire(&2u8).unwrap(); // the pool: 2 of 2
    let (b_waker, b_wakes) = counting_waker();
    let (a_waker, _) = counting_waker();
    let mut b = Box::pin(limiter.acquire_n(&3u8, 2));
    let mut a = Box::pin(limiter.acquire_n(&4u8, 1));
    let mut b_cx = Context::from_waker(&b_waker);
    let mut a_cx = Context::from_waker(&a_waker);
    assert!(b.as_mut().poll(&mut b_cx).is_pending());
    assert!(a.as_mut().poll(&mut a_cx).is_pending());
    drop(x); // the pool: 1 of 2; wakes both heads
    assert!(b.as_mut().poll(&mut b_cx).is_pending(), "b needs 2, 1 free");
    let Poll::Ready(Ok(a_permit)) = a.as_mut().poll(&mut a_cx) else {
        panic!("a fits in the free permit");
    };
    let woken = b_wakes.load(Ordering::SeqCst);
    drop(y);
    drop(a_permit); // the pool: 0 of 2
    assert!(
        b_wakes.load(Ordering::SeqCst) > woken,
        "b's head was never woken though the pool is free"
    );
    let Poll::Ready(Ok(b_permit)) = b.as_mut().poll(&mut b_cx) else {
        panic!("b fits now");
    };
    assert_eq!(b_permit.permits(), 2);
}

/// A key whose `Clone` runs a hook armed on this thread, once: the store clones a new key just
/// before it inserts the key's cell, after it has checked `n` against the limit, so the hook
/// can change the limit exactly between that check and the first take on the fresh cell.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Hooked(u64);

thread_local! {
    static ON_CLONE: std::cell::Cell<Option<Box<dyn FnOnce()>>> = const { std::cell::Cell::new(None) };
}

impl Clone for Hooked {
    fn clone(&self) -> Self {
        if let Some(hook) = ON_CLONE.with(|h| h.take()) {
            hook();
        }
        Hooked(self.0)
    }
}

/// `set_limit` lowers the limit below `n` between a new key's limit check and its first take:
/// the take fails, and the never-used cell it was to be made on must not stay in the map (no
/// sweep ever evicts a cell that has never given out a permit, so it would hold a key of the
/// cap for good).
#[test]
fn a_first_take_failed_by_a_lowered_limit_leaves_no_key() {
    let limiter = KeyedConcurrencyLimiter::<Hooked>::builder(2)
        .max_keys(1)
        .build()
        .unwrap();
    let lower = limiter.clone();
    ON_CLONE.with(|h| h.set(Some(Box::new(move || lower.set_limit(1).unwrap()))));
    assert!(matches!(
        limiter.try_acquire_n(&Hooked(1), 2),
        Err(TryPermitError::InsufficientCapacity {
            requested: 2,
            capacity: 1
        })
    ));
    assert!(
        ON_CLONE.with(|h| h.take()).is_none(),
        "the hook did not run"
    );
    assert_eq!(limiter.len(), 0, "a never-used cell stayed in the map");
    assert_eq!(limiter.sweep(), 0);
    assert_eq!(limiter.stats().evicted, 0, "not an eviction");
    // The cap's one slot is free for another key, and key 1 starts afresh.
    drop(limiter.try_acquire(&Hooked(2)).unwrap());
    assert_eq!(limiter.sweep(), 1);
    assert_eq!(limiter.try_acquire(&Hooked(1)).unwrap().permits(), 1);
    assert_eq!(limiter.len(), 1);
}

/// Newest first, the key's queue full: a newcomer whose permits are free *now* is admitted at
/// once, as `try_acquire` would be (and as `ConcurrencyLimiter`, `RateLimiter` and
/// `KeyedLimiter` do). It must not join the key's queue first, which failed the oldest waiter
/// with `QueueFull` to make room for a caller that then never waited.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn newest_first_acquire_that_fits_now_does_not_evict_a_waiter() {
    let limiter: KeyedConcurrencyLimiter<&'static str> = KeyedConcurrencyLimiter::builder(3)
        .queue_order(QueueOrder::NewestFirst)
        .queue_limit(3)
        .build()
        .unwrap();
    let held = limiter.try_acquire_owned("a", 1).unwrap(); // 2 of 3 free
    let big = tokio::spawn(limiter.acquire_owned("a", 3)); // waits for all 3: the queue is full
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().queued_permits, 3, "the key's queue is full");

    // Both entry points: one permit each is free now, so each is admitted at once.
    let async_one = tokio::time::timeout(Duration::from_secs(1), limiter.acquire_n(&"a", 1))
        .await
        .expect("admitted at once")
        .unwrap();
    let blocking_one = limiter
        .acquire_blocking_timeout(&"a", 1, Duration::ZERO)
        .unwrap();
    tokio::task::yield_now().await;
    assert!(
        !big.is_finished(),
        "the queued waiter was failed: {:?}",
        limiter.stats()
    );
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.rejected), (1, 0), "{stats:?}");

    // The queued waiter is still served once everything is back.
    drop((held, async_one, blocking_one));
    let permit = tokio::time::timeout(Duration::from_secs(1), big)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    assert_eq!(permit.permits(), 3);
    drop(permit);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.waiting), (4, 0, 0));
}

/// A release wakes the head waiting for its key, and before the head runs the key's word reads
/// idle (nothing in use, the mark consumed). Neither a sweep nor a new key looking for room
/// under the cap may evict the key then: the head is still queued, and at the cap a fresh cell
/// for it could be refused (`TooManyKeys`) though the permit was freed for it.
#[test]
fn a_woken_head_keeps_its_key_from_sweeps_and_the_cap() {
    use std::future::Future;
    use std::task::{Context, Poll};
    for at_the_cap in [false, true] {
        let limiter = KeyedConcurrencyLimiter::builder(1)
            .max_keys(1)
            .overflow(KeyOverflow::Reject)
            .build()
            .unwrap();
        let held = limiter.try_acquire(&"a").unwrap();
        let (waker, wakes) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut head = Box::pin(limiter.acquire(&"a"));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        drop(held);
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        if at_the_cap {
            assert!(matches!(
                limiter.try_acquire(&"b"),
                Err(TryPermitError::TooManyKeys { max_keys: 1 })
            ));
        } else {
            assert_eq!(limiter.sweep(), 0, "a key with a queued waiter was evicted");
        }
        match head.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(permit)) => assert_eq!(permit.permits(), 1),
            other => panic!("the woken head got {:?}", other.map(|r| r.map(|_| ()))),
        }
        drop(head);
        // Served and given back: now the key is idle with nobody waiting.
        assert_eq!(limiter.sweep(), 1);
        assert_eq!(limiter.stats().evicted, 1);
    }
}

/// A served head whose wake-up of the next waiter panics gives its permit back to the key.
#[test]
fn a_panicking_waker_of_the_next_waiter_does_not_cost_the_served_head_its_permit() {
    let limiter = KeyedConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire(&7u64).unwrap();
    let mut head = Box::pin(limiter.acquire(&7));
    let mut next = Box::pin(limiter.acquire(&7));
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(next.as_mut(), &panicky()).is_pending());
    drop(held);
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop((head, next));
    assert_eq!(
        limiter.available(&7),
        1,
        "the permit went down with the panic"
    );
    assert!(limiter.try_acquire(&7).is_ok());
}

/// `set_limit` walks every key's queue; a panicking waker in one of them must not stop the walk
/// (nor the wake-ups in its own queue). Several keys, so that the walk meets a panic early
/// whatever order it visits them in.
#[test]
fn set_limit_reaches_every_key_even_if_a_waker_panics() {
    let limiter = KeyedConcurrencyLimiter::new(2).unwrap();
    let keys: Vec<u64> = (0..8).collect();
    let held: Vec<_> = keys
        .iter()
        .map(|k| limiter.try_acquire_n(k, 2).unwrap())
        .collect();
    let mut waiters = Vec::new();
    let mut counters = Vec::new();
    for k in &keys {
        let (woken, waker) = counting();
        let mut first = Box::pin(limiter.acquire_n(k, 2));
        let mut second = Box::pin(limiter.acquire_n(k, 2));
        assert!(poll_with(first.as_mut(), &panicky()).is_pending());
        assert!(poll_with(second.as_mut(), &waker).is_pending());
        waiters.push((first, second));
        counters.push(woken);
    }
    // Both waiters of every key now ask for more than the limit: all fail, all are woken.
    must_panic(|| {
        let _ = limiter.set_limit(1);
    });
    let woken: Vec<usize> = counters.iter().map(|c| c.wakes()).collect();
    assert_eq!(woken, vec![1; 8], "some failed waiters were never woken");
    for (_, second) in &mut waiters {
        assert!(matches!(
            poll_with(second.as_mut(), Waker::noop()),
            std::task::Poll::Ready(Err(AcquireError::InsufficientCapacity { .. }))
        ));
    }
    drop((waiters, held));
    assert_eq!(limiter.stats().waiting, 0);
}

/// A key's permit dropped by a panic in the code that held it wakes the key's head from inside
/// that unwind; the head's waker panicking too must not abort the process, and the head gets the
/// permit.
#[test]
fn a_permit_dropped_by_an_unwinding_holder_wakes_a_panicking_head_without_aborting() {
    let limiter = KeyedConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire(&7u64).unwrap();
    let mut head = Box::pin(limiter.acquire(&7));
    assert!(poll_with(head.as_mut(), &panicky()).is_pending());
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _held = held;
        panic!("user code panics while holding a permit");
    }));
    let payload = unwound.expect_err("the user's panic was not propagated");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"user code panics while holding a permit"),
        "the panic that reached catch_unwind is not the user's"
    );
    let std::task::Poll::Ready(Ok(permit)) = poll_with(head.as_mut(), Waker::noop()) else {
        panic!("the head was not served by the permit the unwinding holder gave back");
    };
    assert_eq!(limiter.available(&7), 0);
    drop((permit, head));
    assert_eq!(limiter.available(&7), 1);
    assert_eq!(limiter.stats().waiting, 0);
}

/// A head blocked on the shared pool is woken by room under the key cap too: with one key slot
/// (key 0's, busy) and the pool's one permit out, key 3 waits; key 0's release leaves key 0
/// idle, which is room for key 3's own cell, and key 3 is woken and served there with the pool
/// still out. It slept until a pool release before.
#[test]
fn a_pool_head_is_woken_when_another_key_goes_idle() {
    let limiter = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let own = limiter.try_acquire(&0u8).unwrap(); // the only key slot, busy
    let _pool = limiter.try_acquire(&2u8).unwrap(); // the pool's one permit
    let (wakes, waker) = counting();
    let mut waiter = Box::pin(limiter.acquire(&3u8));
    assert!(poll_with(waiter.as_mut(), &waker).is_pending());
    drop(own); // key 0 idle: room for key 3's own cell
    assert_eq!(
        wakes.wakes(),
        1,
        "the pool's head was not woken by the room"
    );
    let std::task::Poll::Ready(Ok(permit)) = poll_with(waiter.as_mut(), Waker::noop()) else {
        panic!("key 3 was not served in the room key 0 left");
    };
    assert_eq!(permit.permits(), 1);
    assert_eq!(limiter.available(&3u8), 0, "served on its own cell");
}

/// As above, but key 0's release comes while key 0 has a waiter of its own, which keeps the idle
/// key from eviction: the pool's head, woken by the release, finds key 0 kept and sleeps again.
/// Then key 0's waiter leaves (its future dropped): that is the room, and the pool's head must
/// be woken for it. It was not: it slept, with room for its own cell, until the pool's permit
/// came back (here: never), though a poll would have served it at once.
#[test]
fn a_pool_head_is_woken_when_an_idle_keys_last_waiter_leaves() {
    let limiter = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let own = limiter.try_acquire(&0u8).unwrap(); // the only key slot, busy
    let _pool = limiter.try_acquire(&2u8).unwrap(); // the pool's one permit, kept out
    let mut kept = Box::pin(limiter.acquire(&0u8)); // key 0's own waiter
    assert!(poll_with(kept.as_mut(), Waker::noop()).is_pending());
    let (wakes, waker) = counting();
    let mut head = Box::pin(limiter.acquire(&3u8)); // waits for the pool
    assert!(poll_with(head.as_mut(), &waker).is_pending());
    drop(own); // key 0 idle, but kept by its waiter (woken, not yet run)
    assert!(
        poll_with(head.as_mut(), &waker).is_pending(),
        "key 0 is kept while its waiter waits"
    );
    let before = wakes.wakes();
    drop(kept); // key 0's last waiter leaves
    assert!(
        wakes.wakes() > before,
        "the pool's head slept through the room key 0's waiter left"
    );
    let std::task::Poll::Ready(Ok(permit)) = poll_with(head.as_mut(), Waker::noop()) else {
        panic!("key 3 was not served in the room key 0 left");
    };
    assert_eq!(limiter.available(&3u8), 0, "served on its own cell");
    drop(permit);
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
}

/// The other side of `a_pool_head_is_woken_when_an_idle_keys_last_waiter_leaves`: a waiter that
/// leaves a key still busy leaves no room, and wakes nobody. (Every waiter's exit woke every
/// head of the pool while it was marked: a flood of timeouts on busy keys cost a wake of each
/// pool head per timeout.)
#[test]
fn a_waiter_leaving_a_busy_key_wakes_no_pool_head() {
    let limiter = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _own = limiter.try_acquire(&0u8).unwrap(); // the only key slot, busy throughout
    let _pool = limiter.try_acquire(&2u8).unwrap(); // the pool's one permit
    let (wakes, waker) = counting();
    let mut head = Box::pin(limiter.acquire(&3u8)); // waits for the pool
    assert!(poll_with(head.as_mut(), &waker).is_pending());
    for _ in 0..3 {
        let mut left = Box::pin(limiter.acquire(&0u8));
        assert!(poll_with(left.as_mut(), Waker::noop()).is_pending());
        drop(left);
        assert_eq!(
            limiter
                .acquire_blocking_timeout(&0u8, 1, Duration::ZERO)
                .err(),
            Some(AcquireError::Timeout)
        );
    }
    assert_eq!(wakes.wakes(), 0, "woken with no room anywhere");
    assert!(poll_with(head.as_mut(), &waker).is_pending());
}

/// `stats().overflowed` counts calls for a new key that met the cap, not their attempts: a
/// waiting call served by the shared pool after two wakes is one call. Each of its head's
/// attempts (and second looks) counted one: three calls at the cap reported 8.
#[test]
fn overflowed_counts_a_waiting_call_once() {
    for queued_behind in [false, true] {
        let limiter = KeyedConcurrencyLimiter::builder(2)
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap();
        let _own = limiter.try_acquire(&0u8).unwrap(); // the only key slot
        let one = limiter.try_acquire(&1u8).unwrap(); // the pool, one call at the cap
        let two = limiter.try_acquire(&2u8).unwrap(); // two calls
        assert_eq!(limiter.stats().overflowed, 2);
        // `queued_behind`: key 3 has a waiter already, so the call queues without a fast path.
        let first = queued_behind.then(|| {
            let mut first = Box::pin(limiter.acquire_n(&3u8, 2));
            assert!(poll_with(first.as_mut(), Waker::noop()).is_pending());
            first
        });
        let calls = 3 + u64::from(queued_behind);
        let (wakes, waker) = counting();
        let mut call = Box::pin(limiter.acquire_n(&3u8, 1));
        assert!(poll_with(call.as_mut(), &waker).is_pending());
        drop(first); // if any: our call is the head now
        drop(one);
        assert!(wakes.wakes() > 0);
        let _served = match poll_with(call.as_mut(), &waker) {
            std::task::Poll::Ready(served) => served.unwrap(),
            std::task::Poll::Pending => {
                drop(two);
                let std::task::Poll::Ready(served) = poll_with(call.as_mut(), &waker) else {
                    panic!("the pool is free");
                };
                served.unwrap()
            }
        };
        assert_eq!(
            limiter.stats().overflowed,
            calls,
            "queued behind: {queued_behind}"
        );
    }
}

/// A `try_acquire` for a key without a cell at the cap, refused because the key's own waiters
/// (waiting on the shared pool) go first, is a call that met the cap: counted in `overflowed`,
/// as a `KeyedLimiter` counts it (`a_held_back_call_at_the_key_cap_counts_as_overflowed_once`
/// in keyed_waiting.rs) and as the same call refused by the pool itself is. It was refused
/// before reaching the store, and counted nowhere. A held-back call for a key with a cell of its
/// own met no cap: not counted.
#[test]
fn a_try_acquire_held_back_by_its_keys_pool_waiter_counts_as_overflowed() {
    let limiter = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _own = limiter.try_acquire(&0u8).unwrap(); // the only key slot
    let _pooled = limiter.try_acquire(&1u8).unwrap(); // the pool's only permit
    let mut pool_waiter = Box::pin(limiter.acquire(&1u8));
    assert!(poll_with(pool_waiter.as_mut(), Waker::noop()).is_pending());
    let mut own_waiter = Box::pin(limiter.acquire(&0u8));
    assert!(poll_with(own_waiter.as_mut(), Waker::noop()).is_pending());
    let before = limiter.stats();
    assert_eq!((before.overflowed, before.waiting), (2, 2));
    assert!(matches!(
        limiter.try_acquire(&1u8),
        Err(TryPermitError::NoPermits { available: 0, .. })
    ));
    assert_eq!(limiter.stats().overflowed, 3, "held back at the cap");
    assert!(limiter.try_acquire(&0u8).is_err());
    assert_eq!(limiter.stats().overflowed, 3, "held back on its own cell");
}

/// A key whose `Hash` runs a hook once (for key 1 only), to run a call in the middle of a sweep:
/// the sweep hashes an idle key as it asks whether the key has waiters.
#[derive(Clone, PartialEq, Eq, Debug)]
struct HashHooked(u64);

thread_local! {
    static ON_HASH: std::cell::Cell<Option<Box<dyn FnOnce()>>> = const { std::cell::Cell::new(None) };
}

impl std::hash::Hash for HashHooked {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.0 == 1
            && let Some(hook) = ON_HASH.with(|h| h.take())
        {
            hook();
        }
        self.0.hash(state);
    }
}

/// An owned acquire's future, as the hooks below keep it.
type HeadCall<K, S> = wakers::Call<Result<turnstile::OwnedKeyedPermit<K, S>, AcquireError>>;

/// Sets `ON_HASH` to start an acquire of one permit for `key` the next time a hooked key is
/// hashed (in the middle of a sweep's or a search's walk), polled once with `waker`: it must
/// wait (it saw no room). The call is then in the slot returned.
fn head_when_hashed<K, S>(
    limiter: &KeyedConcurrencyLimiter<K, S>,
    key: K,
    waker: &Waker,
) -> Arc<std::sync::Mutex<Option<HeadCall<K, S>>>>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    S: std::hash::BuildHasher + Clone + Send + Sync + 'static,
{
    let head = Arc::new(std::sync::Mutex::new(None));
    let (limiter, slot, waker) = (limiter.clone(), head.clone(), waker.clone());
    ON_HASH.with(|h| {
        h.set(Some(Box::new(move || {
            let mut call: HeadCall<K, S> = Box::pin(limiter.acquire_owned(key, 1));
            assert!(
                poll_with(call.as_mut(), &waker).is_pending(),
                "no room seen"
            );
            *slot.lock().unwrap() = Some(call);
        })))
    });
    head
}

/// A head that looks for room under the cap while `sweep` holds the shard of an idle key skips
/// that shard (it is left to its sweeper); the sweep then evicts the key and gives its slot
/// back. Two key slots (key 0 busy, key 1 idle) and the pool's one permit out: key 3 asks in the
/// middle of the sweep's walk of key 1's shard and waits for the pool. The sweep must wake it:
/// it slept, with a slot free, until the pool's permit came back (here: never).
#[test]
fn a_pool_head_that_looked_during_a_sweep_is_woken_by_the_room_it_made() {
    type Call = wakers::Call<Result<turnstile::OwnedKeyedPermit<HashHooked>, AcquireError>>;
    let limiter = KeyedConcurrencyLimiter::<HashHooked>::builder(1)
        .max_keys(2)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _busy = limiter.try_acquire_owned(HashHooked(0), 1).unwrap();
    let one = limiter.try_acquire_owned(HashHooked(1), 1).unwrap();
    let _pool = limiter.try_acquire_owned(HashHooked(9), 1).unwrap(); // the pool's one permit
    drop(one); // key 1 idle
    // A queue (key 0's), so that the sweep asks whether idle key 1 has waiters, hashing it.
    let mut queued: Call = Box::pin(limiter.acquire_owned(HashHooked(0), 1));
    assert!(poll_with(queued.as_mut(), Waker::noop()).is_pending());
    let (wakes, waker) = counting();
    let head = head_when_hashed(&limiter, HashHooked(3), &waker);
    assert_eq!(limiter.sweep(), 1, "key 1 evicted");
    let mut head = head.lock().unwrap().take().expect("the hook ran mid-sweep");
    assert!(
        wakes.wakes() > 0,
        "the pool's head slept through the slot the sweep gave back"
    );
    let std::task::Poll::Ready(Ok(permit)) = poll_with(head.as_mut(), &waker) else {
        panic!("key 3 was not served in the room the sweep made");
    };
    assert_eq!(
        limiter.available(&HashHooked(3)),
        0,
        "served on its own cell"
    );
    drop(permit);
}

/// A key (0 and up, below 8) whose `Hash` writes its number as the hash, so that with
/// [`SameShard`] every such key lands in the same shard; keys 1 and 2 run `ON_HASH`'s hook the
/// first time either is hashed (a sweep hashes an idle key as it asks whether it has waiters).
#[derive(Clone, PartialEq, Eq, Debug)]
struct Shard0(u64);

impl std::hash::Hash for Shard0 {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if (1..=2).contains(&self.0)
            && let Some(hook) = ON_HASH.with(|h| h.take())
        {
            hook();
        }
        state.write_u64(self.0);
    }
}

/// Hashes a `u64` to itself: the shard (the high half of the hash) is 0 for every small key.
#[derive(Default, Clone)]
struct SameShard(u64);

impl std::hash::Hasher for SameShard {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl std::hash::BuildHasher for SameShard {
    type Hasher = SameShard;
    fn build_hasher(&self) -> SameShard {
        SameShard(0)
    }
}

/// A new key's search for room at the cap evicts every idle key of the shard it walks, and
/// takes one slot: the others are room for a head waiting on the shared pool, whose own looks
/// skipped that shard while the search held it (a search leaves a shard being swept to its
/// sweeper). Three key slots (key 0 busy, keys 1 and 2 idle, one shard) and the pool's one
/// permit out: key 5 asks while key 4's search walks the shard, and waits for the pool. The
/// search evicts keys 1 and 2 and takes one slot; the other is free. The search must wake key
/// 5's head, as `sweep` does: it slept, with a slot free, until a pool permit came back (here:
/// never).
#[test]
fn a_pool_head_is_woken_by_the_room_another_keys_search_leaves_over() {
    type Call = HeadCall<Shard0, SameShard>;
    let limiter = KeyedConcurrencyLimiter::<Shard0>::builder(1)
        .hasher(SameShard::default())
        .max_keys(3)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _busy = limiter.try_acquire_owned(Shard0(0), 1).unwrap();
    let one = limiter.try_acquire_owned(Shard0(1), 1).unwrap();
    let two = limiter.try_acquire_owned(Shard0(2), 1).unwrap();
    let _pool = limiter.try_acquire_owned(Shard0(7), 1).unwrap(); // the pool's one permit
    drop((one, two)); // keys 1 and 2 idle
    // A queue (busy key 0's), so that the search asks whether idle keys have waiters.
    let mut queued: Call = Box::pin(limiter.acquire_owned(Shard0(0), 1));
    assert!(poll_with(queued.as_mut(), Waker::noop()).is_pending());
    let (wakes, waker) = counting();
    let head = head_when_hashed(&limiter, Shard0(5), &waker);
    let _four = limiter.try_acquire_owned(Shard0(4), 1).unwrap();
    let mut head = head
        .lock()
        .unwrap()
        .take()
        .expect("the hook ran mid-search");
    assert_eq!(
        (limiter.len(), limiter.stats().evicted),
        (2, 2),
        "a slot is free"
    );
    assert!(
        wakes.wakes() > 0,
        "the pool's head slept through the slot the search left over"
    );
    let std::task::Poll::Ready(Ok(permit)) = poll_with(head.as_mut(), &waker) else {
        panic!("key 5 was not served in the room the search left");
    };
    assert_eq!(limiter.available(&Shard0(5)), 0, "served on its own cell");
    drop(permit);
}

/// `available` for a key without a cell tells what a take for it would get: the full limit
/// while a key slot is free, and at the cap what the overflow policy gives (the shared pool's
/// free permits, or none under `Reject`). It reported the full limit at the cap before.
#[test]
fn available_for_a_key_at_the_cap_is_what_the_overflow_gives() {
    let shared = KeyedConcurrencyLimiter::builder(2)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    assert_eq!(shared.available(&3u8), 2, "a slot is free");
    let _own = shared.try_acquire(&0u8).unwrap(); // the only key slot, busy
    assert_eq!(shared.available(&3u8), 2, "the pool is free");
    let pooled = shared.try_acquire(&1u8).unwrap();
    assert_eq!(shared.available(&3u8), 1);
    let pooled_too = shared.try_acquire(&2u8).unwrap();
    assert_eq!(shared.available(&3u8), 0, "the pool is full");
    assert!(shared.try_acquire(&3u8).is_err(), "and a take gets nothing");
    drop(pooled);
    assert_eq!(shared.available(&3u8), 1);
    assert!(shared.try_acquire(&3u8).is_ok());
    drop(pooled_too);

    let reject = KeyedConcurrencyLimiter::builder(2)
        .max_keys(1)
        .overflow(KeyOverflow::Reject)
        .build()
        .unwrap();
    let own = reject.try_acquire(&0u8).unwrap();
    assert_eq!(reject.available(&3u8), 0, "at the cap, no idle key");
    assert!(reject.try_acquire(&3u8).is_err());
    drop(own);
    // Key 0 is idle: a take would evict it, but `available` does not search (a lower bound).
    assert_eq!(reject.available(&0u8), 2, "a held key reports its own cell");
}

/// One key slot (key 0's, busy) and a pool of one permit, shared, oldest first.
fn one_slot_one_pool_permit() -> KeyedConcurrencyLimiter<u8> {
    KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .queue_order(QueueOrder::OldestFirst)
        .build()
        .unwrap()
}

/// No barging past a head waiting for the shared pool (oldest first): key 3's head waits for
/// the pool; the pool's permit comes back and wakes it; before it runs, key 4 (no queue, at
/// the cap) is refused by `try_acquire`, and the head is served. Key 4 took the permit before.
/// Once the head is gone, key 4 is served again (no lasting refusal).
#[test]
fn a_pool_take_does_not_barge_past_a_pool_head() {
    let limiter = one_slot_one_pool_permit();
    let _own = limiter.try_acquire(&0).unwrap();
    let pooled = limiter.try_acquire(&2).unwrap();
    let (wakes, waker) = counting();
    let mut head = Box::pin(limiter.acquire(&3));
    assert!(poll_with(head.as_mut(), &waker).is_pending());
    drop(pooled);
    assert_eq!(wakes.wakes(), 1, "the pool's release wakes its head");
    assert_eq!(limiter.available(&4), 1, "the permit is free");
    assert!(
        matches!(
            limiter.try_acquire(&4),
            Err(TryPermitError::NoPermits { requested: 1, .. })
        ),
        "key 4 barged past key 3's head"
    );
    let std::task::Poll::Ready(Ok(served)) = poll_with(head.as_mut(), Waker::noop()) else {
        panic!("the head was not served");
    };
    assert_eq!(*served.key(), 3);
    drop(head);
    assert!(limiter.try_acquire(&4).is_err(), "the pool is out");
    drop(served);
    assert!(limiter.try_acquire(&4).is_ok(), "no head waits any more");
}

/// `acquire` for a key at the cap queues behind a pool head rather than barging: it waits,
/// the head is served, and it is woken and served when the head's permit comes back.
#[test]
fn a_pool_acquire_queues_behind_a_pool_head() {
    let limiter = one_slot_one_pool_permit();
    let _own = limiter.try_acquire(&0).unwrap();
    let pooled = limiter.try_acquire(&2).unwrap();
    let mut head = Box::pin(limiter.acquire(&3));
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    drop(pooled);
    let (wakes, waker) = counting();
    let mut late = Box::pin(limiter.acquire(&4));
    assert!(
        poll_with(late.as_mut(), &waker).is_pending(),
        "key 4 barged past key 3's head"
    );
    let std::task::Poll::Ready(Ok(served)) = poll_with(head.as_mut(), Waker::noop()) else {
        panic!("the head was not served");
    };
    assert!(
        poll_with(late.as_mut(), &waker).is_pending(),
        "the pool is out"
    );
    drop(served);
    assert!(wakes.wakes() >= 1, "the release wakes key 4's head");
    let std::task::Poll::Ready(Ok(permit)) = poll_with(late.as_mut(), Waker::noop()) else {
        panic!("key 4 was not served");
    };
    assert_eq!(*permit.key(), 4);
}

/// A head that deferred to another pool head is woken when that head leaves without taking
/// the free permit (here its future is dropped): no wait for nothing, and no lasting refusal.
#[test]
fn a_pool_head_leaving_wakes_the_heads_that_deferred_to_it() {
    let limiter = one_slot_one_pool_permit();
    let _own = limiter.try_acquire(&0).unwrap();
    let pooled = limiter.try_acquire(&2).unwrap();
    let mut first = Box::pin(limiter.acquire(&3));
    assert!(poll_with(first.as_mut(), Waker::noop()).is_pending());
    drop(pooled); // wakes key 3's head; the permit is free
    let (wakes, waker) = counting();
    let mut second = Box::pin(limiter.acquire(&4));
    assert!(
        poll_with(second.as_mut(), &waker).is_pending(),
        "key 4 barged past key 3's head"
    );
    let before = wakes.wakes();
    drop(first); // cancelled, the free permit untaken
    assert!(
        wakes.wakes() > before,
        "key 4's head was left asleep with the pool free"
    );
    let std::task::Poll::Ready(Ok(permit)) = poll_with(second.as_mut(), Waker::noop()) else {
        panic!("key 4 was not served");
    };
    assert_eq!(*permit.key(), 4);
    drop(permit);
    drop(second);
    assert!(limiter.try_acquire(&5).is_ok(), "no head waits any more");
}

/// A `BuildHasher` that runs a hook (once) at its `countdown`-th hasher from `arm`: the keyed
/// limiters hash the key at every lookup, so this puts a racing call between two lookups of
/// one call.
#[derive(Clone, Default)]
struct HookHasher(Arc<HookHasherState>);

#[derive(Default)]
struct HookHasherState {
    countdown: std::sync::atomic::AtomicUsize,
    hook: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl HookHasher {
    fn arm(&self, countdown: usize, hook: Box<dyn FnOnce() + Send>) {
        *self.0.hook.lock().unwrap() = Some(hook);
        self.0.countdown.store(countdown, Ordering::SeqCst);
    }

    /// Disarms; true if the hook had run.
    fn disarm(&self) -> bool {
        self.0.countdown.store(0, Ordering::SeqCst);
        self.0.hook.lock().unwrap().take().is_none()
    }
}

impl std::hash::BuildHasher for HookHasher {
    type Hasher = std::collections::hash_map::DefaultHasher;

    fn build_hasher(&self) -> Self::Hasher {
        let fire = self
            .0
            .countdown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
            == Ok(1);
        if fire {
            let hook = self.0.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
        }
        std::collections::hash_map::DefaultHasher::new()
    }
}

/// A call for 2 checks `n` against the limit in its fast path, without the key's queue's mutex,
/// then looks the key's queue up and joins it behind a head waiting for a permit held for good.
/// `set_limit(1)` lands at each of the call's first key lookups in turn (a `HookHasher`), so
/// also between its check and its enqueue, where the sweep finds nothing too big in the queue.
/// Wherever it lands the call must fail `InsufficientCapacity` at once: the request can never
/// fit. Before the enqueue read the limit under the queue's mutex, a call that had checked
/// against 2 waited behind the head for good.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_a_racing_set_limit_makes_too_big_fails_at_once_behind_a_head() {
    for countdown in 1..=3 {
        let hasher = HookHasher::default();
        let limiter = KeyedConcurrencyLimiter::<u64>::builder(2)
            .hasher(hasher.clone())
            .build()
            .unwrap();
        let held = limiter.try_acquire_n(&1, 2).unwrap();
        let mut head = Box::pin(limiter.acquire(&1));
        assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
        // The hook holds a handle (a cycle through the limiter's hasher until it runs).
        let lowering = limiter.clone();
        hasher.arm(countdown, Box::new(move || lowering.set_limit(1).unwrap()));
        let outcome = tokio::time::timeout(Duration::from_secs(60), limiter.acquire_n(&1, 2)).await;
        assert!(hasher.disarm(), "lookup {countdown}: the hook did not run");
        assert_eq!(
            outcome.map(|o| o.map(|p| p.permits())),
            Ok(Err(AcquireError::InsufficientCapacity {
                requested: 2,
                capacity: 1
            })),
            "lookup {countdown}: a request that can never fit waited behind the head"
        );
        drop(held);
        let permit = poll_with(head.as_mut(), Waker::noop());
        assert!(
            matches!(&permit, std::task::Poll::Ready(Ok(p)) if p.permits() == 1),
            "lookup {countdown}: the head was not served"
        );
    }
}

/// Probe: the per-key limit under the key cap (`Reject`), with more keys than slots, so that
/// keys are evicted and made again all the time, by sweeps and by `make_room`, while threads take
/// 1 or 2 permits by `try_acquire_n`, `acquire_blocking_timeout` and `acquire_blocking_n`.
#[test]
fn per_key_limit_holds_at_the_cap_while_keys_churn() {
    const LIMIT: u32 = 2;
    const KEYS: usize = 5;
    let limiter = KeyedConcurrencyLimiter::<usize>::builder(LIMIT)
        .max_keys(2)
        .overflow(KeyOverflow::Reject)
        .build()
        .unwrap();
    let inside: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let calls = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (limiter, inside, calls) = (limiter.clone(), inside.clone(), calls.clone());
            std::thread::spawn(move || {
                for i in 0..1500usize {
                    let key = (t * 7 + i) % KEYS;
                    let n = 1 + (i % 2) as u32;
                    calls.fetch_add(1, Ordering::Relaxed);
                    let permit = match i % 3 {
                        0 => limiter.try_acquire_n(&key, n).ok(),
                        1 => limiter
                            .acquire_blocking_timeout(&key, n, Duration::from_micros(200))
                            .ok(),
                        _ => match limiter.acquire_blocking_n(&key, n) {
                            Ok(p) => Some(p),
                            Err(AcquireError::TooManyKeys { .. }) => None,
                            Err(e) => panic!("{e}"),
                        },
                    };
                    let Some(permit) = permit else { continue };
                    let now = inside[key].fetch_add(n, Ordering::SeqCst) + n;
                    assert!(now <= LIMIT, "key {key}: {now} in flight");
                    if i % 5 == 0 {
                        std::thread::yield_now();
                    }
                    inside[key].fetch_sub(n, Ordering::SeqCst);
                    drop(permit);
                    if i % 50 == 0 {
                        limiter.sweep();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = limiter.stats();
    assert_eq!(
        stats.admitted + stats.rejected + stats.cancelled,
        calls.load(Ordering::Relaxed)
    );
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
    limiter.sweep();
    assert!(limiter.is_empty(), "{} keys left", limiter.len());
    for key in 0..KEYS {
        assert_eq!(limiter.try_acquire_n(&key, LIMIT).unwrap().permits(), LIMIT);
    }
}

/// Probe: under `Shared` at the cap, the overflow pool never has more than `limit` permits out
/// over all the keys it serves, and every permit comes back (async waiters, some cancelled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_pool_never_gives_out_more_than_the_limit() {
    const LIMIT: u32 = 2;
    let limiter = KeyedConcurrencyLimiter::<u32>::builder(LIMIT)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    // Key 0 holds the only key slot for the whole run: every other key is served by the pool.
    let _slot = limiter.try_acquire(&0).unwrap();
    let pooled = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..4u32 {
        let (limiter, pooled) = (limiter.clone(), pooled.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..300u32 {
                let key = 1 + (t + i) % 6;
                let n = 1 + i % 2;
                let wait = Duration::from_micros(u64::from(i % 4) * 100);
                if let Ok(permit) = limiter.acquire_timeout(&key, n, wait).await {
                    let now = pooled.fetch_add(n, Ordering::SeqCst) + n;
                    assert!(now <= LIMIT, "{now} pool permits out");
                    tokio::task::yield_now().await;
                    pooled.fetch_sub(n, Ordering::SeqCst);
                    drop(permit);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
    assert_eq!(limiter.available(&99), LIMIT, "every pool permit is back");
    assert_eq!(limiter.len(), 1);
}

/// `try_acquire_n(key, 0)` "succeeds iff a permit is free": for a new key at the cap that is
/// what the overflow policy gives, as `available` and a take of one say. The probe answered for
/// a fresh cell instead, so it succeeded where a take of one was refused (`TooManyKeys`, or the
/// shared pool exhausted), and `acquire_n(key, 0)` returned at once instead of waiting.
#[test]
fn a_zero_permit_probe_at_the_cap_answers_as_a_take_of_one() {
    let reject = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .build()
        .unwrap();
    let _a = reject.try_acquire(&1u8).unwrap();
    assert_eq!(reject.available(&2), 0);
    assert_eq!(
        reject.try_acquire_n(&2, 0).map(|p| p.permits()),
        Err(TryPermitError::TooManyKeys { max_keys: 1 })
    );
    assert_eq!(
        reject
            .acquire_blocking_timeout(&2, 0, Duration::from_millis(1))
            .map(|p| p.permits()),
        Err(AcquireError::TooManyKeys { max_keys: 1 })
    );
    // An idle key makes room: the probe succeeds, and creates no key.
    let idle = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .build()
        .unwrap();
    drop(idle.try_acquire(&1u8).unwrap());
    assert_eq!(idle.try_acquire_n(&2, 0).unwrap().permits(), 0);
    assert!(idle.len() <= 1);
    assert_eq!(idle.try_acquire(&2).unwrap().permits(), 1);

    let shared = KeyedConcurrencyLimiter::builder(1)
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    let _a = shared.try_acquire(&1u8).unwrap();
    assert_eq!(
        shared.try_acquire_n(&3, 0).unwrap().permits(),
        0,
        "the pool has one"
    );
    let b = shared.try_acquire(&2u8).unwrap(); // the pool's only permit
    assert_eq!(shared.available(&3), 0);
    assert_eq!(
        shared.try_acquire_n(&3, 0).map(|p| p.permits()),
        Err(TryPermitError::NoPermits {
            available: 0,
            requested: 0
        })
    );
    assert_eq!(
        shared
            .acquire_blocking_timeout(&3, 0, Duration::from_millis(5))
            .map(|p| p.permits()),
        Err(AcquireError::Timeout),
        "waits for a pool permit"
    );
    let waiter = {
        let shared = shared.clone();
        std::thread::spawn(move || shared.acquire_blocking_n(&3, 0).map(|p| p.permits()))
    };
    // Queued before the pool's permit comes back, so that its return is what must wake it.
    while shared.stats().waiting == 0 && !waiter.is_finished() {
        std::thread::yield_now();
    }
    drop(b);
    assert_eq!(waiter.join().unwrap(), Ok(0));
    assert_eq!(shared.available(&3), 1, "a probe holds nothing");
    assert_eq!(shared.len(), 1);
}

/// Probe: the extremes of `n` and of the limit: `u32::MAX` permits taken, held across a
/// lowering and given back to an evictable key; `n` above the limit refused by every entry
/// point without creating a key; a request above the queue limit refused at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn extreme_counts_take_and_give_back_exactly() {
    let limiter = KeyedConcurrencyLimiter::<u8>::builder(u32::MAX)
        .queue_limit(4)
        .build()
        .unwrap();
    let all = limiter.try_acquire_n(&1, u32::MAX).unwrap();
    assert_eq!(limiter.available(&1), 0);
    assert!(matches!(
        limiter.try_acquire(&1),
        Err(TryPermitError::NoPermits { available: 0, .. })
    ));
    limiter.set_limit(1).unwrap();
    assert_eq!(limiter.available(&1), 0, "held past the lowered limit");
    assert_eq!(limiter.sweep(), 0, "a key with permits out stays");
    drop(all);
    assert_eq!(limiter.available(&1), 1);
    assert_eq!(limiter.sweep(), 1);
    assert!(limiter.is_empty());

    let too_big = TryPermitError::InsufficientCapacity {
        requested: 2,
        capacity: 1,
    };
    assert_eq!(
        limiter.try_acquire_n(&2, 2).map(|p| p.permits()),
        Err(too_big)
    );
    let too_big = AcquireError::InsufficientCapacity {
        requested: 2,
        capacity: 1,
    };
    assert_eq!(
        limiter.acquire_n(&2, 2).await.map(|p| p.permits()),
        Err(too_big)
    );
    assert_eq!(
        limiter.acquire_blocking_n(&2, 2).map(|p| p.permits()),
        Err(too_big)
    );
    assert!(limiter.is_empty(), "refused calls create no key");

    limiter.set_limit(10).unwrap();
    let _held = limiter.try_acquire_n(&3, 10).unwrap();
    assert_eq!(
        limiter.acquire_n(&3, 5).await.map(|p| p.permits()),
        Err(AcquireError::QueueFull {
            requested: 5,
            queue_limit: 4
        })
    );
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
}

/// A key whose `Clone` panics once the permits are taken (the guard keeps a clone of the key,
/// made after the take): the permits must go back as the panic unwinds. They were leaked: the
/// key stayed short of a permit for good, and, never idle again, held a slot of the cap.
#[test]
fn a_key_clone_that_panics_after_the_take_leaks_no_permit() {
    let limiter = KeyedConcurrencyLimiter::<Hooked>::builder(1)
        .max_keys(1)
        .build()
        .unwrap();
    // The key's cell exists: the next takes clone the key only for their guards.
    drop(limiter.try_acquire(&Hooked(1)).unwrap());
    let arm = || ON_CLONE.with(|h| h.set(Some(Box::new(|| panic!("Clone panics")))));
    arm();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = limiter.try_acquire(&Hooked(1));
    }));
    assert!(outcome.is_err(), "the hook did not run");
    assert_eq!(
        limiter.available(&Hooked(1)),
        1,
        "try_acquire leaked its permit"
    );
    arm();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = limiter.acquire_blocking(&Hooked(1));
    }));
    assert!(outcome.is_err(), "the hook did not run");
    assert_eq!(
        limiter.available(&Hooked(1)),
        1,
        "acquire_blocking leaked its permit"
    );
    // Idle: evictable, and the cap's one slot is free for another key.
    assert_eq!(limiter.sweep(), 1);
    assert_eq!(limiter.try_acquire(&Hooked(2)).unwrap().permits(), 1);
}

/// Probe: blocking waiters on a few keys under a small cap (`Reject`), while the limit flips
/// between 1 and 3 and sweeps run: never more than the larger limit in flight per key, and no
/// waiter stranded (holders hold for moments, so a wait of seconds is a lost wake-up).
#[test]
fn blocking_waiters_at_the_cap_through_limit_flips_are_never_stranded() {
    const HIGH: u32 = 3;
    const KEYS: usize = 3;
    let limiter = KeyedConcurrencyLimiter::<usize>::builder(1)
        .max_keys(KEYS)
        .build()
        .unwrap();
    let inside: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (limiter, inside, done) = (limiter.clone(), inside.clone(), done.clone());
            std::thread::spawn(move || {
                let mut i = t;
                let mut served = 0u32;
                while !done.load(Ordering::Relaxed) {
                    i += 1;
                    let key = i % KEYS;
                    match limiter.acquire_blocking_timeout(&key, 1, Duration::from_secs(5)) {
                        Ok(permit) => {
                            served += 1;
                            let now = inside[key].fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= HIGH, "key {key}: {now} in flight");
                            std::thread::yield_now();
                            inside[key].fetch_sub(1, Ordering::SeqCst);
                            drop(permit);
                        }
                        Err(AcquireError::Timeout) => panic!("key {key}: a waiter stranded"),
                        // Two first uses of one key racing for the last slot: the loser is
                        // refused, as documented (see
                        // `two_first_uses_of_one_new_key_at_the_cap_the_loser_is_refused_...`).
                        Err(AcquireError::TooManyKeys { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                    if i % 31 == 0 {
                        limiter.sweep();
                    }
                }
                served
            })
        })
        .collect();
    for flip in 0..300u32 {
        limiter
            .set_limit(if flip % 2 == 0 { HIGH } else { 1 })
            .unwrap();
        std::thread::yield_now();
    }
    done.store(true, Ordering::Relaxed);
    let served: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(served > 0);
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
    for key in 0..KEYS {
        assert_eq!(
            limiter.available(&key),
            limiter.limit(),
            "key {key} lost a permit"
        );
    }
}

/// Two first uses of one new key at the cap, the second running between the first's
/// reservation of the last key slot and its insert of the key's cell (the store clones a new key
/// just before its insert; the hook runs the second call there): as ARCHITECTURE.md documents
/// ("The spare slot"), the second is refused `TooManyKeys`, a refusal a retry answers: the key
/// then has its cell, with a permit free for it. Pinned so that a change to it is seen.
#[test]
fn two_first_uses_of_one_new_key_at_the_cap_the_loser_is_refused_and_a_retry_served() {
    let limiter = KeyedConcurrencyLimiter::<Hooked>::builder(2)
        .max_keys(2)
        .build()
        .unwrap();
    let _busy = limiter.try_acquire(&Hooked(0)).unwrap();
    let second = Arc::new(std::sync::Mutex::new(None));
    let (other, seen) = (limiter.clone(), second.clone());
    ON_CLONE.with(|h| {
        h.set(Some(Box::new(move || {
            let outcome = other.try_acquire_owned(Hooked(1), 1).map(|p| p.permits());
            *seen.lock().unwrap() = Some(outcome);
        })))
    });
    let first = limiter.try_acquire(&Hooked(1)).unwrap();
    assert_eq!(
        *second.lock().unwrap(),
        Some(Err(TryPermitError::TooManyKeys { max_keys: 2 }))
    );
    assert_eq!(
        limiter.try_acquire(&Hooked(1)).unwrap().permits(),
        1,
        "the retry"
    );
    assert_eq!((first.permits(), limiter.len()), (1, 2));
}

/// Probe: a head dropped at each of its await points (queued and marked; woken by the release
/// that consumed its mark but not polled again) passes the turn on: the waiter behind it is
/// woken and served, and once everything is back the key is idle and evictable.
#[test]
fn a_head_dropped_at_each_await_point_passes_the_turn_on() {
    use std::task::{Context, Poll};
    for woken_first in [false, true] {
        let limiter = KeyedConcurrencyLimiter::new(1).unwrap();
        let held = limiter.try_acquire(&"k").unwrap();
        let (head_waker, head_wakes) = counting_waker();
        let (next_waker, next_wakes) = counting_waker();
        let mut head = Box::pin(limiter.acquire(&"k"));
        let mut next = Box::pin(limiter.acquire(&"k"));
        assert!(
            head.as_mut()
                .poll(&mut Context::from_waker(&head_waker))
                .is_pending()
        );
        assert!(
            next.as_mut()
                .poll(&mut Context::from_waker(&next_waker))
                .is_pending()
        );
        if woken_first {
            drop(held);
            assert_eq!(
                head_wakes.load(Ordering::SeqCst),
                1,
                "the release wakes the head"
            );
            drop(head);
        } else {
            drop(head);
            drop(held);
        }
        assert!(
            next_wakes.load(Ordering::SeqCst) >= 1,
            "the next waiter was never woken"
        );
        let Poll::Ready(Ok(permit)) = next.as_mut().poll(&mut Context::from_waker(&next_waker))
        else {
            panic!("the permit is free for the next waiter");
        };
        drop(permit);
        drop(next);
        let stats = limiter.stats();
        assert_eq!(
            (stats.waiting, stats.waiting_keys, stats.cancelled),
            (0, 0, 1)
        );
        assert_eq!(limiter.sweep(), 1, "idle once everything is back");
    }
}

/// Probe: the same on the shared pool, the heads in different keys' queues (oldest first, so
/// the second defers to the first): the first dropped, before or after the pool release that
/// woke it, the second is woken and served from the pool.
#[test]
fn a_pool_head_dropped_at_each_await_point_passes_the_pool_on() {
    use std::task::{Context, Poll};
    for woken_first in [false, true] {
        let limiter = KeyedConcurrencyLimiter::builder(1)
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap();
        let _own = limiter.try_acquire(&0u8).unwrap(); // the only key slot, busy
        let pooled = limiter.try_acquire(&1u8).unwrap(); // the pool's one permit
        let (a_waker, _) = counting_waker();
        let (b_waker, b_wakes) = counting_waker();
        let mut a = Box::pin(limiter.acquire(&2u8));
        let mut b = Box::pin(limiter.acquire(&3u8));
        assert!(
            a.as_mut()
                .poll(&mut Context::from_waker(&a_waker))
                .is_pending()
        );
        assert!(
            b.as_mut()
                .poll(&mut Context::from_waker(&b_waker))
                .is_pending()
        );
        if woken_first {
            drop(pooled);
            drop(a);
        } else {
            drop(a);
            drop(pooled);
        }
        assert!(b_wakes.load(Ordering::SeqCst) >= 1, "b was never woken");
        let Poll::Ready(Ok(permit)) = b.as_mut().poll(&mut Context::from_waker(&b_waker)) else {
            panic!("the pool's permit is free for b");
        };
        assert_eq!(*permit.key(), 3);
        drop(permit);
        drop(b);
        assert_eq!(limiter.available(&9), 1, "the pool's permit is back");
        let stats = limiter.stats();
        assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
    }
}

/// A new key's `Clone` that panics in the store's insert (the store clones the key once it has
/// reserved the key's slot under the cap): the slot must be given back as the panic unwinds. It
/// was kept: each such panic took a slot of the cap for good, until every new key was refused.
#[test]
fn a_new_key_clone_that_panics_in_the_insert_gives_its_slot_back() {
    let limiter = KeyedConcurrencyLimiter::<Hooked>::builder(1)
        .max_keys(1)
        .build()
        .unwrap();
    ON_CLONE.with(|h| h.set(Some(Box::new(|| panic!("Clone panics")))));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = limiter.try_acquire(&Hooked(1));
    }));
    assert!(outcome.is_err(), "the hook did not run");
    assert_eq!(limiter.len(), 0, "the slot stayed reserved");
    assert_eq!(limiter.try_acquire(&Hooked(2)).unwrap().permits(), 1);
    assert_eq!(limiter.len(), 1);
}

/// `close` ends every key's waiters at once with `Closed`, a waiter on the shared pool among
/// them (one key slot, held), in either queue order; later calls fail at once, and the permits
/// held stay valid: dropped after the close, they come back (`available`). The books balance.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn close_fails_every_keys_waiters_and_later_calls_and_held_permits_return() {
    for order in [QueueOrder::OldestFirst, QueueOrder::NewestFirst] {
        let limiter = KeyedConcurrencyLimiter::builder(1)
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .queue_order(order)
            .build()
            .unwrap();
        let a = limiter.try_acquire_owned(1u8, 1).unwrap();
        let pooled = limiter.try_acquire_owned(2u8, 1).unwrap();
        let waiters = [1u8, 1, 3].map(|key| tokio::spawn(limiter.acquire_owned(key, 1)));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(limiter.stats().waiting, 3, "{order:?}");
        assert!(!limiter.is_closed());
        limiter.close();
        limiter.close();
        assert!(limiter.is_closed());
        for waiter in waiters {
            let outcome = waiter.await.unwrap().map(|p| p.permits());
            assert_eq!(outcome, Err(AcquireError::Closed), "{order:?}");
        }
        assert_eq!(limiter.try_acquire(&4).unwrap_err(), TryPermitError::Closed);
        assert_eq!(limiter.acquire(&4).await.unwrap_err(), AcquireError::Closed);
        assert_eq!(
            limiter.acquire_blocking(&1).unwrap_err(),
            AcquireError::Closed
        );
        assert_eq!(limiter.available(&1), 0);
        drop((a, pooled));
        assert_eq!(
            limiter.available(&1),
            1,
            "a held permit comes back after the close"
        );
        let s = limiter.stats();
        assert_eq!((s.admitted, s.rejected), (2, 3 + 3), "{order:?} {s:?}");
        assert_eq!((s.waiting, s.waiting_keys, s.cancelled), (0, 0, 0), "{s:?}");
    }
}

/// Blocking waiters on real threads racing `close`, on keys of their own (whose queues they
/// make) and on one they share: every one returns `Closed`; one left in a queue the close
/// missed would wait for good (the channel's timeout reports it).
#[test]
fn blocking_waiters_racing_close_all_end() {
    for round in 0..50u64 {
        let limiter = KeyedConcurrencyLimiter::<u64>::new(1).unwrap();
        let threads = 6u64;
        let held: Vec<_> = (0..=threads)
            .map(|key| limiter.try_acquire_owned(key, 1).unwrap())
            .collect();
        let waiting = limiter.clone();
        let outcomes = waiters_racing_close(
            threads,
            round,
            move |key| waiting.acquire_blocking(&key).map(|p| p.permits()),
            || limiter.close(),
        );
        for outcome in outcomes {
            assert_eq!(outcome, Err(AcquireError::Closed), "round {round}");
        }
        drop(held);
        let s = limiter.stats();
        assert_eq!((s.admitted, s.rejected), (threads + 1, threads), "{s:?}");
        assert_eq!((s.waiting, s.waiting_keys), (0, 0), "{s:?}");
    }
}

/// A waiting call polled by hand, its waker's count, and the count at its last poll.
struct Parked {
    call: std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<turnstile::OwnedKeyedPermit<u8>, AcquireError>>
                + Send,
        >,
    >,
    wakes: Arc<wakers::Counter>,
    waker: Waker,
    seen: usize,
}

type Held = Vec<turnstile::OwnedKeyedPermit<u8>>;

/// Polls the oldest waiting call woken since its last poll, if any.
fn run_woken(parked: &mut Vec<(String, Parked)>, held: &mut Held, log: &mut Vec<String>) -> bool {
    use std::task::Poll;
    let Some(at) = parked.iter().position(|(_, c)| c.wakes.wakes() != c.seen) else {
        return false;
    };
    let (name, mut call) = parked.remove(at);
    call.seen = call.wakes.wakes();
    match poll_with(call.call.as_mut(), &call.waker) {
        Poll::Ready(Ok(permit)) => held.push(permit),
        Poll::Ready(Err(_)) => {}
        Poll::Pending => parked.insert(at, (name.clone(), call)),
    }
    log.push(format!("{name} runs"));
    true
}

/// Runs `ops` (each op one random word) against a small limiter, polling waiting calls by hand.
/// `spurious`: after every op, polls each waiting call that has not been woken since its last
/// poll: it must still be waiting. One that completes instead could have been served (or
/// failed) with nobody to wake it: a lost wake-up, however long it then sleeps. Then, in either
/// mode, drains: runs the woken calls and releases the permits held, one at a time, until
/// nothing is held; every waiting call must then have been woken and have ended, none left
/// asleep for good. Returns the op log of the first failure.
fn first_unwoken_completion(
    config: (u32, usize, KeyOverflow, QueueOrder, u64),
    ops: &[u64],
    spurious: bool,
) -> Option<Vec<String>> {
    use std::task::Poll;
    let (limit, max_keys, overflow, order, queue_limit) = config;
    let limiter = KeyedConcurrencyLimiter::<u8>::builder(limit)
        .max_keys(max_keys)
        .overflow(overflow)
        .queue_order(order)
        .queue_limit(queue_limit)
        .build()
        .unwrap();
    let mut log = Vec::new();
    let mut parked: Vec<(String, Parked)> = Vec::new();
    let mut held = Vec::new();
    for (i, &r) in ops.iter().enumerate() {
        let (key, n) = ((r % 4) as u8, ((r >> 4) % 3) as u32);
        match (r >> 8) % 8 {
            0 | 1 => {
                let (wakes, waker) = counting();
                let mut call: Parked = Parked {
                    call: Box::pin(limiter.acquire_owned(key, n)),
                    seen: 0,
                    wakes,
                    waker,
                };
                let name = format!("#{i} acquire({key}, {n})");
                match poll_with(call.call.as_mut(), &call.waker) {
                    Poll::Ready(Ok(permit)) => held.push(permit),
                    Poll::Ready(Err(_)) => {}
                    Poll::Pending => {
                        call.seen = call.wakes.wakes();
                        parked.push((name.clone(), call));
                    }
                }
                log.push(name);
            }
            2 => {
                run_woken(&mut parked, &mut held, &mut log);
            }
            3 if !parked.is_empty() => {
                let (name, _) = parked.remove((r >> 16) as usize % parked.len());
                log.push(format!("{name} dropped"));
            }
            4 | 5 if !held.is_empty() => {
                let permit = held.remove((r >> 16) as usize % held.len());
                log.push(format!("release {} x{}", permit.key(), permit.permits()));
            }
            6 => {
                if let Ok(permit) = limiter.try_acquire_owned(key, n) {
                    held.push(permit);
                }
                log.push(format!("try({key}, {n})"));
            }
            7 if r % 3 == 0 => {
                let to = 1 + ((r >> 20) % 2) as u32;
                limiter.set_limit(to).unwrap();
                log.push(format!("set_limit({to})"));
            }
            7 => {
                limiter.sweep();
                log.push("sweep".into());
            }
            _ => {}
        }
        for (name, call) in parked.iter_mut().filter(|_| spurious) {
            if call.wakes.wakes() != call.seen {
                continue;
            }
            if poll_with(call.call.as_mut(), &call.waker).is_ready() {
                log.push(format!("{name} was never woken, yet completes when polled"));
                return Some(log);
            }
            call.seen = call.wakes.wakes();
        }
    }
    log.push("drain".into());
    loop {
        while run_woken(&mut parked, &mut held, &mut log) {}
        let Some(permit) = held.pop() else { break };
        log.push(format!("release {} x{}", permit.key(), permit.permits()));
    }
    if let Some((name, _)) = parked.first() {
        log.push(format!(
            "{name} still waits, asleep, with every permit back"
        ));
        return Some(log);
    }
    let stats = limiter.stats();
    if (stats.waiting, stats.waiting_keys) != (0, 0) {
        log.push(format!("queues left behind: {stats:?}"));
        return Some(log);
    }
    None
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 1_000, ..Default::default() })]

    /// No lost wake-up, over random interleavings of waits, runs of woken calls, cancellations,
    /// releases, `try_acquire`, `set_limit` and sweeps on one or two key slots: a waiting call
    /// that nobody woke never finds, when polled anyway, that it could complete. (A head of the
    /// shared pool under `OldestFirst` is left out of that check: it defers to the pool's other
    /// waiters by design, taking nothing until one of them leaves or a pool permit comes back,
    /// though a poll of its own would then serve it; see `PoolWait`. It is drained as the
    /// others: once every permit is back, no call is left waiting.) Found a pool head left
    /// asleep after an idle key's last waiter left
    /// (`a_pool_head_is_woken_when_an_idle_keys_last_waiter_leaves`).
    #[test]
    fn a_waiting_call_that_could_complete_has_been_woken(
        limit in 1u32..=2,
        max_keys in 1usize..=2,
        config in 0..4u8,
        queue_limit in 1u64..=4,
        ops in proptest::collection::vec(proptest::prelude::any::<u64>(), 1..60),
    ) {
        let (overflow, order) = match config {
            0 => (KeyOverflow::Reject, QueueOrder::OldestFirst),
            1 => (KeyOverflow::Reject, QueueOrder::NewestFirst),
            2 => (KeyOverflow::Shared, QueueOrder::NewestFirst),
            _ => (KeyOverflow::Shared, QueueOrder::OldestFirst),
        };
        let spurious = config != 3;
        let config = (limit, max_keys, overflow, order, queue_limit);
        let lost = first_unwoken_completion(config, &ops, spurious);
        proptest::prop_assert!(lost.is_none(), "{}", lost.unwrap_or_default().join("\n"));
    }
}

/// Probe: blocking waiters at a cap of 2 keys for 5 under `Shared` (so most wait on the shared
/// pool, some on cells of their own, and keys churn through sweeps), in both queue orders,
/// through limit flips and short timeouts: no waiter is stranded (a 5 s wait that times out is
/// a lost wake-up), and every permit and queue is back at the end.
/// `blocking_waiters_at_the_cap_through_limit_flips_are_never_stranded` never meets the pool.
#[test]
fn shared_pool_blocking_waiters_through_limit_flips_are_never_stranded() {
    const KEYS: usize = 5;
    for order in [QueueOrder::OldestFirst, QueueOrder::NewestFirst] {
        let limiter = KeyedConcurrencyLimiter::<usize>::builder(1)
            .max_keys(2)
            .overflow(KeyOverflow::Shared)
            .queue_order(order)
            .build()
            .unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (limiter, done, calls) = (limiter.clone(), done.clone(), calls.clone());
                std::thread::spawn(move || {
                    let mut i = t;
                    let mut served = 0u32;
                    while !done.load(Ordering::Relaxed) {
                        i += 1;
                        let key = i % KEYS;
                        let n = 1 + (i % 2) as u32;
                        let wait = if i % 3 == 0 {
                            Duration::from_micros(50)
                        } else {
                            Duration::from_secs(5)
                        };
                        calls.fetch_add(1, Ordering::Relaxed);
                        let started = std::time::Instant::now();
                        match limiter.acquire_blocking_timeout(&key, n, wait) {
                            Ok(permit) => {
                                served += 1;
                                std::thread::yield_now();
                                drop(permit);
                            }
                            Err(AcquireError::Timeout) => assert!(
                                started.elapsed() < Duration::from_secs(4),
                                "{order:?} key {key}: a waiter stranded"
                            ),
                            Err(AcquireError::InsufficientCapacity { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                        if i % 31 == 0 {
                            limiter.sweep();
                        }
                    }
                    served
                })
            })
            .collect();
        for flip in 0..400u32 {
            limiter
                .set_limit(if flip % 2 == 0 { 3 } else { 1 })
                .unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        done.store(true, Ordering::Relaxed);
        let served: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(served > 0);
        let stats = limiter.stats();
        assert!(stats.overflowed > 0, "{order:?}: the pool was never met");
        assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
        assert_eq!(
            stats.admitted + stats.rejected + stats.cancelled,
            calls.load(Ordering::Relaxed),
            "{order:?}: {stats:?}"
        );
        limiter.sweep();
        assert!(limiter.is_empty(), "{order:?}: {} keys left", limiter.len());
        assert_eq!(limiter.available(&99), limiter.limit(), "{order:?}: pool");
    }
}

/// Probe: as `shared_pool_blocking_waiters_through_limit_flips_are_never_stranded`, with async
/// waiters on a multi-thread runtime, a quarter of them dropped after one poll and a quarter
/// timing out at once, while another thread flips the limit and sweeps.
#[test]
fn shared_pool_async_waiters_cancelled_through_limit_flips_are_never_stranded() {
    const KEYS: u32 = 5;
    for order in [QueueOrder::OldestFirst, QueueOrder::NewestFirst] {
        let limiter = KeyedConcurrencyLimiter::<u32>::builder(1)
            .max_keys(2)
            .overflow(KeyOverflow::Shared)
            .queue_order(order)
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let (limiter, done) = (limiter.clone(), done.clone());
            std::thread::spawn(move || {
                let mut flip = 0u32;
                while !done.load(Ordering::Relaxed) {
                    flip += 1;
                    limiter
                        .set_limit(if flip.is_multiple_of(2) { 3 } else { 1 })
                        .unwrap();
                    if flip.is_multiple_of(7) {
                        limiter.sweep();
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
        };
        let served: u32 = runtime.block_on(async {
            let tasks: Vec<_> = (0..6u32)
                .map(|t| {
                    let limiter = limiter.clone();
                    tokio::spawn(async move {
                        let mut served = 0;
                        for i in 0..400u32 {
                            let key = (t * 3 + i) % KEYS;
                            let n = 1 + i % 2;
                            let started = std::time::Instant::now();
                            let outcome = match i % 4 {
                                0 => {
                                    limiter
                                        .acquire_timeout(&key, n, Duration::from_micros(40))
                                        .await
                                }
                                1 => tokio::select! {
                                    biased;
                                    p = limiter.acquire_n(&key, n) => p,
                                    () = tokio::task::yield_now() => Err(AcquireError::Timeout),
                                },
                                _ => {
                                    limiter
                                        .acquire_timeout(&key, n, Duration::from_secs(5))
                                        .await
                                }
                            };
                            match outcome {
                                Ok(permit) => {
                                    served += 1;
                                    tokio::task::yield_now().await;
                                    drop(permit);
                                }
                                Err(AcquireError::Timeout) => assert!(
                                    started.elapsed() < Duration::from_secs(4),
                                    "{order:?} key {key}: a waiter stranded"
                                ),
                                Err(AcquireError::InsufficientCapacity { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        served
                    })
                })
                .collect();
            let mut served = 0;
            for t in tasks {
                served += t.await.unwrap();
            }
            served
        });
        done.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        assert!(served > 0);
        let stats = limiter.stats();
        assert!(stats.overflowed > 0, "{order:?}: the pool was never met");
        assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
        // Every call was polled at least once (`select!` is biased to the acquisition).
        assert_eq!(
            stats.admitted + stats.rejected + stats.cancelled,
            6 * 400,
            "{order:?}: {stats:?}"
        );
        limiter.sweep();
        assert!(limiter.is_empty(), "{order:?}: {} keys left", limiter.len());
        assert_eq!(limiter.available(&99), limiter.limit(), "{order:?}: pool");
    }
}

/// The limiter is never reported closed unless `close` was called. The count of keys with a
/// wait queue shares its word with the closed bit (bit 63), and a queue was counted only after
/// its insert into the queue map: a waiter of the same key that found the new queue, timed out
/// and retired it in between took the count from 0 to `u64::MAX`, closed bit set, until the
/// inserter's increment. Meanwhile every `try_acquire` of any key failed `Closed`, and so did
/// any waiter that met the closed bit (it takes a retired queue's `Closed` as final then).
#[test]
fn waiters_creating_and_retiring_queues_never_make_the_limiter_look_closed() {
    let limiter = KeyedConcurrencyLimiter::<u32>::new(1).unwrap();
    let held = limiter.try_acquire(&0).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let closed_seen = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    // Key 0 is held throughout: each call queues and gives up at once, so the
                    // key's queue is created and retired over and over by racing waiters.
                    match limiter.acquire_blocking_timeout(&0, 1, Duration::ZERO) {
                        Err(AcquireError::Timeout) => {}
                        Err(AcquireError::Closed) => {
                            closed_seen.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("{other:?}"),
                    }
                }
            });
        }
        s.spawn(|| {
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_millis(300) {
                match limiter.try_acquire(&1) {
                    Ok(permit) => drop(permit),
                    Err(TryPermitError::Closed) => {
                        closed_seen.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            done.store(true, Ordering::Relaxed);
        });
    });
    drop(held);
    assert!(!limiter.is_closed());
    assert_eq!(
        closed_seen.load(Ordering::Relaxed),
        0,
        "calls failed Closed"
    );
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0));
}

thread_local! {
    static HASHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts on this thread the hashes the limiter makes (each lookup of a key in a map is one).
#[derive(Clone, Default)]
struct CountingHasher;

impl std::hash::BuildHasher for CountingHasher {
    type Hasher = std::collections::hash_map::DefaultHasher;
    fn build_hasher(&self) -> Self::Hasher {
        HASHES.with(|h| h.set(h.get() + 1));
        std::collections::hash_map::DefaultHasher::new()
    }
}

/// A key's `Clone` that panics as its first waiter makes the key's queue (the queue map keeps a
/// clone of the key) leaves no key counted as waiting: the count was made before the clone and
/// stayed one high for good, so that every later `try_acquire` of every key looked its key up
/// among the queues (one more hash) though nobody ever waited again.
#[test]
fn a_first_waiters_key_clone_that_panics_leaves_no_waiting_key_counted() {
    let limiter = KeyedConcurrencyLimiter::<Hooked, _>::builder(1)
        .hasher(CountingHasher)
        .build()
        .unwrap();
    let held = limiter.try_acquire(&Hooked(1)).unwrap();
    // A waiter that comes and goes, so that the queue map has a table (a lookup in a map that
    // never had one hashes nothing).
    {
        let mut waiter = std::pin::pin!(limiter.acquire(&Hooked(1)));
        let (_, waker) = counting();
        assert!(poll_with(waiter.as_mut(), &waker).is_pending());
        assert_eq!(limiter.stats().waiting_keys, 1);
    }
    assert_eq!(limiter.stats().waiting_keys, 0);
    let hashes = || HASHES.with(|h| h.get());
    let refused = || {
        let before = hashes();
        assert!(matches!(
            limiter.try_acquire(&Hooked(1)),
            Err(TryPermitError::NoPermits { .. })
        ));
        hashes() - before
    };
    let per_call = refused();
    // The key's cell exists and its permit is out: the waiter's first clone is its queue's.
    ON_CLONE.with(|h| h.set(Some(Box::new(|| panic!("Clone panics")))));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = limiter.acquire_blocking(&Hooked(1));
    }));
    assert!(outcome.is_err(), "the hook did not run");
    assert_eq!(limiter.stats().waiting_keys, 0);
    assert_eq!(
        refused(),
        per_call,
        "a try_acquire looked for waiters that nobody has"
    );
    drop(held);
    assert_eq!(limiter.try_acquire(&Hooked(1)).unwrap().permits(), 1);
}

thread_local! {
    static PANIC_ON_EQ: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A key whose `Clone` runs `ON_CLONE`'s hook (as [`Hooked`]'s) and whose `Eq` panics on the
/// `n`th comparison once `PANIC_ON_EQ` is set to `n`.
#[derive(Debug)]
struct Fragile(u64);

impl std::hash::Hash for Fragile {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl Clone for Fragile {
    fn clone(&self) -> Self {
        if let Some(hook) = ON_CLONE.with(|h| h.take()) {
            hook();
        }
        Fragile(self.0)
    }
}

impl PartialEq for Fragile {
    fn eq(&self, other: &Self) -> bool {
        let countdown = PANIC_ON_EQ.with(|c| c.get());
        if countdown > 0 {
            PANIC_ON_EQ.with(|c| c.set(countdown - 1));
            if countdown == 1 {
                panic!("Fragile's Eq panicked");
            }
        }
        self.0 == other.0
    }
}

impl Eq for Fragile {}

/// A new key's first take failed by a lowered limit (`set_limit` between the store's check of
/// `n` and the take on the fresh cell), and the key's `Eq` panicking in what follows: the
/// never-used cell must not keep the key's slot of the cap. The inserter looked its cell up
/// again to take it back, and a panic in that lookup left the cell in the map unretired, where
/// no sweep ever evicts a never-used cell: at `max_keys(1)` every other key was refused
/// `TooManyKeys` for good.
#[test]
fn a_first_take_failed_by_a_lowered_limit_and_a_panicking_eq_keeps_no_slot() {
    let limiter = KeyedConcurrencyLimiter::<Fragile>::builder(2)
        .max_keys(1)
        .build()
        .unwrap();
    let lower = limiter.clone();
    ON_CLONE.with(|h| {
        h.set(Some(Box::new(move || {
            lower.set_limit(1).unwrap();
            // The first comparison from here on panics (the shard is empty: the insert makes
            // none).
            PANIC_ON_EQ.with(|c| c.set(1));
        })))
    });
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = limiter.try_acquire_n(&Fragile(1), 2);
    }));
    PANIC_ON_EQ.with(|c| c.set(0));
    assert!(outcome.is_err(), "Eq did not panic");
    assert!(
        ON_CLONE.with(|h| h.take()).is_none(),
        "the hook did not run"
    );
    assert_eq!(limiter.len(), 0, "the never-used cell kept its slot");
    assert_eq!(limiter.try_acquire(&Fragile(2)).unwrap().permits(), 1);
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.sweep(), 1);
    assert_eq!(limiter.stats().evicted, 1, "the take-back is no eviction");
    // Key 1 starts afresh.
    assert_eq!(limiter.try_acquire(&Fragile(1)).unwrap().permits(), 1);
    assert_eq!(limiter.len(), 1);
}
