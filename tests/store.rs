//! `StoreLimiter` over a get/set store: exact within one process (KeyLocks serialise each key's
//! read-modify-write), and, as its docs say, not across processes: two limiters over one store
//! over-admit, which is the race the Redis backend exists to close.

#![cfg(all(feature = "store", feature = "tokio"))]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use turnstile::{Algorithm, Store, StoreLimiter, TryAcquireError};

/// A store in memory whose `get` and `set` each yield to the scheduler first, as a network
/// store's would: without per-key locking, concurrent read-modify-writes interleave.
/// Key → (value, expiry).
type Entries = HashMap<Vec<u8>, (Vec<u8>, Instant)>;

#[derive(Default, Clone)]
struct Memory {
    map: Arc<Mutex<Entries>>,
    sets: Arc<AtomicU64>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Debug)]
struct Down;

impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("store down")
    }
}

impl std::error::Error for Down {}

impl Store for Memory {
    type Error = Down;

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Down> {
        tokio::task::yield_now().await;
        if self.fail.load(Ordering::Relaxed) {
            return Err(Down);
        }
        let map = self.map.lock().unwrap();
        Ok(map
            .get(key)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(v, _)| v.clone()))
    }

    async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Down> {
        tokio::task::yield_now().await;
        self.sets.fetch_add(1, Ordering::Relaxed);
        self.map
            .lock()
            .unwrap()
            .insert(key.to_vec(), (value, Instant::now() + ttl));
        Ok(())
    }
}

#[tokio::test]
async fn each_algorithm_limits_and_rejections_write_nothing() {
    for algorithm in common::all_algorithms(3, Duration::from_secs(60)) {
        let store = Memory::default();
        let limiter = StoreLimiter::new(algorithm, "t", store.clone()).unwrap();
        let first = limiter.try_acquire_n("a", 2).await.unwrap();
        assert_eq!(first.remaining(), 1, "{algorithm:?}");
        limiter.try_acquire("a").await.unwrap();
        let sets = store.sets.load(Ordering::Relaxed);
        let r = match limiter.try_acquire("a").await {
            Err(TryAcquireError::Rejected(r)) => r,
            other => panic!("{algorithm:?}: {other:?}"),
        };
        assert_eq!(r.limit(), 3);
        // Up to two windows for the sliding counter (the full window must weigh less first).
        assert!(r.retry_after() > Duration::ZERO && r.retry_after() <= Duration::from_secs(120));
        assert_eq!(
            store.sets.load(Ordering::Relaxed),
            sets,
            "a rejection wrote"
        );
        // Another subject is independent; too many permits are refused without the store.
        limiter.try_acquire("b").await.unwrap();
        assert_eq!(
            limiter.try_acquire_n("b", 4).await,
            Err(TryAcquireError::InsufficientCapacity {
                requested: 4,
                capacity: 3
            })
        );
        // Stored with a TTL no longer than the state matters: one window (two for the sliding
        // counter, whose previous window's count weighs on the next).
        let longest = match algorithm {
            Algorithm::SlidingCounter { .. } => Duration::from_secs(121),
            _ => Duration::from_secs(61),
        };
        let map = store.map.lock().unwrap();
        assert_eq!(map.len(), 2);
        for (_, until) in map.values() {
            assert!(*until <= Instant::now() + longest, "{algorithm:?}");
        }
        let stats = limiter.stats();
        assert_eq!((stats.admitted, stats.rejected, stats.errors), (3, 1, 0));
    }
}

#[tokio::test]
async fn a_failing_store_is_unavailable_and_counted() {
    let store = Memory::default();
    let limiter = StoreLimiter::new(
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(1),
        },
        "t",
        store.clone(),
    )
    .unwrap();
    store.fail.store(true, Ordering::Relaxed);
    assert_eq!(
        limiter.try_acquire("a").await,
        Err(TryAcquireError::Unavailable)
    );
    assert_eq!(limiter.stats().errors, 1);
    store.fail.store(false, Ordering::Relaxed);
    limiter.try_acquire("a").await.unwrap();
}

/// Many tasks on one limiter (one process): every admission audited, 0 over-admissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_process_never_over_admits() {
    let window = Duration::from_millis(100);
    let limit = 20;
    for algorithm in common::all_algorithms(limit, window) {
        let limiter = StoreLimiter::new(algorithm, "t", Memory::default()).unwrap();
        let stop = Instant::now() + Duration::from_millis(600);
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let mut admitted = Vec::new();
                    while Instant::now() < stop {
                        match limiter.try_acquire("hot").await {
                            Ok(a) => admitted.push((a.at_nanos(), 1u64)),
                            Err(TryAcquireError::Rejected(_)) => {
                                tokio::time::sleep(Duration::from_micros(200)).await
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut admissions = Vec::new();
        for t in tasks {
            admissions.extend(t.await.unwrap());
        }
        admissions.sort_unstable();
        let violations = common::violations(algorithm, &admissions);
        assert_eq!(
            violations,
            0,
            "{algorithm:?}: {} admitted",
            admissions.len()
        );
        assert!(admissions.len() >= limit as usize, "{algorithm:?}");
    }
}

/// Two limiters over one store stand for two processes: nothing serialises them, and they
/// over-admit. This is the documented limit of a get/set store, not a bug to fix here.
#[tokio::test(flavor = "current_thread")]
async fn two_processes_over_one_get_set_store_can_over_admit() {
    let store = Memory::default();
    let fw = Algorithm::FixedWindow {
        limit: 1,
        window: Duration::from_secs(60),
    };
    let a = StoreLimiter::new(fw, "t", store.clone()).unwrap();
    let b = StoreLimiter::new(fw, "t", store.clone()).unwrap();
    // Both read the empty state before either writes (each get yields once).
    let (ra, rb) = tokio::join!(a.try_acquire("x"), b.try_acquire("x"));
    assert!(
        ra.is_ok() && rb.is_ok(),
        "expected the race to admit twice: {ra:?} {rb:?}"
    );
    // Within one of them, the same interleaving is serialised by its KeyLocks.
    let c = StoreLimiter::new(fw, "u", store.clone()).unwrap();
    let (r1, r2) = tokio::join!(c.try_acquire("x"), c.try_acquire("x"));
    assert!(r1.is_ok() != r2.is_ok(), "{r1:?} {r2:?}");
}
