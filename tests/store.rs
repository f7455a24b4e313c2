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

/// A fixed window of `limit` per `window`, the algorithm most tests here need.
fn fixed(limit: u32, window: Duration) -> Algorithm {
    Algorithm::FixedWindow { limit, window }
}

#[tokio::test]
async fn each_algorithm_limits_and_rejections_write_nothing() {
    // The fixed window and the sliding counter are aligned to the Unix epoch on the wall clock:
    // no minute may end between the admissions and the rejection.
    common::room_in_wall_window(Duration::from_secs(60), Duration::from_secs(10));
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
    let limiter = StoreLimiter::new(fixed(1, Duration::from_secs(1)), "t", store.clone()).unwrap();
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
    let fw = fixed(1, Duration::from_secs(60));
    // One minute of the wall clock (the windows' epoch) for both races: the serialised one
    // rejects its second call only within the window of its first.
    common::room_in_wall_window(Duration::from_secs(60), Duration::from_secs(5));
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

/// Keys are injective across prefixes: `a` with subject `b:x` and `a:b` with subject `x` both
/// read `a:b:x:fw` as `prefix:subject:suffix`, so one limiter's admissions were the other's.
/// A prefix without ':' or '%' keeps the key it had (a deploy keeps its counters).
#[tokio::test]
async fn a_prefix_extending_another_has_keys_of_its_own() {
    let store = Memory::default();
    let fw = fixed(1, Duration::from_secs(60));
    let short = StoreLimiter::new(fw, "a", store.clone()).unwrap();
    let long = StoreLimiter::new(fw, "a:b", store.clone()).unwrap();
    assert_ne!(short.key("b:x"), long.key("x"));
    assert_eq!(short.key("b:x"), b"a:b:x:fw");
    short.try_acquire("b:x").await.unwrap();
    assert!(
        long.try_acquire("x").await.is_ok(),
        "counted on the other's key"
    );
    // Escaping is itself injective: a prefix spelling the escape is another prefix.
    let spelled = StoreLimiter::new(fw, "a%3Ab", store.clone()).unwrap();
    assert_ne!(spelled.key("x"), long.key("x"));
    assert!(spelled.try_acquire("x").await.is_ok());
}

/// Stored values the limiter did not write: the docs promise that "a stored value that cannot be
/// this algorithm's state is treated as absent". An exact sliding window's ring of the right
/// length but inconsistent contents (a corrupt value, another version's layout) must be treated
/// so too, not spun on forever or panicked on.
mod stored_values {
    use std::collections::HashMap;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use turnstile::{Admission, Algorithm, Store, StoreLimiter, TryAcquireError};

    /// The wall clock in nanoseconds since the Unix epoch: the store's time.
    fn unix_nanos() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }

    /// An exact sliding window of `limit` per `window`.
    fn sliding(limit: u32, window: Duration) -> Algorithm {
        Algorithm::SlidingWindow { limit, window }
    }

    /// A store in memory, preloaded with values; TTLs are ignored (the values stay).
    #[derive(Default, Clone)]
    struct Preloaded(Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>);

    impl Store for Preloaded {
        type Error = std::convert::Infallible;

        async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
            Ok(self.0.lock().unwrap().get(key).cloned())
        }

        async fn set(&self, key: &[u8], value: Vec<u8>, _: Duration) -> Result<(), Self::Error> {
            self.0.lock().unwrap().insert(key.to_vec(), value);
            Ok(())
        }
    }

    fn bytes(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// `try_acquire_n(subject, n)` on a sliding window of limit 2 whose stored ring is `words`, on
    /// its own thread and runtime, so that a busy spin or a panic inside is reported rather than
    /// hanging the test binary.
    fn decide_on(words: &[u64], n: u32) -> Result<Admission, TryAcquireError> {
        let store = Preloaded::default();
        let limiter =
            StoreLimiter::new(sliding(2, Duration::from_secs(60)), "t", store.clone()).unwrap();
        store
            .0
            .lock()
            .unwrap()
            .insert(limiter.key("x"), bytes(words));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let _ = tx.send(runtime.block_on(limiter.try_acquire_n("x", n)));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(outcome) => outcome,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!(
                    "the decision never returned (busy spin on the restored ring, key lock held)"
                )
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the decision panicked"),
        }
    }

    /// A token bucket whose stored word has bit 63 set: the in-memory bucket's mark of a word
    /// written under parameters before a reconfiguration, which a `StoreLimiter` (never
    /// reconfigured) does not write, so a foreign value. Read as a word to translate from the
    /// previous parameters, of which there are none (capacity 0), it divided by zero: a panic
    /// instead of a value treated as absent. Decisions and charges alike.
    #[test]
    fn a_token_bucket_word_of_another_epoch_is_treated_as_absent() {
        let bucket = Algorithm::TokenBucket {
            rate: turnstile::Rate::per_second(1),
            burst: 2,
        };
        let foreign = (1u64 << 63) | unix_nanos();
        for charge in [false, true] {
            let outcome = decide_with(bucket, &[foreign], move |limiter| async move {
                if charge {
                    limiter.charge("x", 1).await.map_err(|never| match never {})
                } else {
                    limiter.try_acquire("x").await.map_err(|e| panic!("{e:?}"))
                }
            });
            assert_eq!(outcome.remaining(), 1, "charge: {charge}");
        }
    }

    /// `call` on a limiter running `algorithm` whose stored state for subject "x" is `words`,
    /// on its own thread and runtime, so that a busy spin or a panic inside is reported rather
    /// than hanging or aborting the test binary.
    fn decide_with<F, Fut>(algorithm: Algorithm, words: &[u64], call: F) -> Admission
    where
        F: FnOnce(StoreLimiter<Preloaded>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Admission, ()>>,
    {
        let store = Preloaded::default();
        let limiter = StoreLimiter::new(algorithm, "t", store.clone()).unwrap();
        store
            .0
            .lock()
            .unwrap()
            .insert(limiter.key("x"), bytes(words));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let _ = tx.send(runtime.block_on(call(limiter)));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(outcome) => outcome.expect("admitted"),
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("the decision never returned"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the decision panicked"),
        }
    }

    /// head = 2 (two tickets claimed), but both slots still say "never written" (lap parity 1):
    /// the ring claims tickets it never published. The in-memory algorithm waits for the writer it
    /// believes to be between claim and publish; restored from a store there is none, so it spun
    /// forever, holding the subject's lock and an executor thread.
    #[test]
    fn inconsistent_sliding_window_ring_is_treated_as_absent() {
        let admission = decide_on(&[2, 0, 1, 1], 1).expect("a fresh ring admits");
        assert_eq!(admission.remaining(), 1);
    }

    /// A head near u64::MAX (RETIRED excluded, `expired <= head`, the right length: everything the
    /// restore checks) overflowed `head + n` (a panic in debug builds; in release the claim wrapped).
    /// The ring is read with its head moved back by whole pairs of laps (each ticket keeps its
    /// slot and parity); its tickets having expired, it admits as a fresh one would.
    #[test]
    fn a_sliding_window_head_near_the_top_does_not_overflow() {
        let admission = decide_on(&[u64::MAX - 1, 0, 0, 0], 2).expect("a fresh ring admits");
        assert_eq!(admission.remaining(), 0);
    }

    /// A ring whose head is 2^62 (no real count gets there: a foreign value, used as it is, as
    /// the docs say), the bound beyond which the restore refused a head: limit 3, the oldest of
    /// its last three tickets expired and the two newer ones live for an hour. One more is
    /// admitted; its write took the head past the bound, so the next call read the ring as no
    /// state and was admitted too, with three live.
    #[tokio::test]
    async fn a_ring_near_the_head_bound_is_read_again_after_its_write() {
        let now = unix_nanos();
        let head: u64 = 1 << 62;
        // Ticket t in slot t % 3, with its lap's parity.
        let mut ring = vec![head, 0, 0, 0, 0];
        for (t, expiry) in [
            (head - 3, now - 1_000_000_000),
            (head - 2, now + 3_600_000_000_000),
            (head - 1, now + 3_600_000_000_000),
        ] {
            ring[2 + (t % 3) as usize] = (expiry << 1) | ((t / 3) & 1);
        }
        let store = Preloaded::default();
        let limiter =
            StoreLimiter::new(sliding(3, Duration::from_secs(60)), "t", store.clone()).unwrap();
        store
            .0
            .lock()
            .unwrap()
            .insert(limiter.key("x"), bytes(&ring));
        let admitted = limiter.try_acquire("x").await.unwrap();
        assert_eq!(admitted.remaining(), 0);
        match limiter.try_acquire("x").await {
            Err(TryAcquireError::Rejected(r)) => {
                assert!(r.retry_after() > Duration::from_secs(50), "{r:?}")
            }
            other => panic!("three live, limit 3: {other:?}"),
        }
    }

    /// A ring that has wrapped around its slots, met by a limiter of another limit: limit 2,
    /// tickets 1 and 2 live (as in `a_wrapped_ring_is_restored_not_discarded`), head 3. Under
    /// limit 3 one more fits; under limit 1 none does, for about the window.
    #[tokio::test]
    async fn a_wrapped_ring_of_another_limit_keeps_its_live_tickets() {
        let now = unix_nanos();
        let expiry = now + 60_000_000_000;
        let slot = |parity: u64| (expiry << 1) | parity;
        for (limit, admits) in [(3, 1), (1, 0)] {
            let store = Preloaded::default();
            let limiter =
                StoreLimiter::new(sliding(limit, Duration::from_secs(60)), "t", store.clone())
                    .unwrap();
            let ring = bytes(&[3, 1, slot(1), slot(0)]);
            store.0.lock().unwrap().insert(limiter.key("x"), ring);
            for _ in 0..admits {
                limiter.try_acquire("x").await.unwrap();
            }
            match limiter.try_acquire("x").await {
                Err(TryAcquireError::Rejected(r)) => {
                    assert!(r.retry_after() > Duration::from_secs(50), "{limit}: {r:?}")
                }
                other => panic!("limit {limit}: the stored ring was lost: {other:?}"),
            }
        }
    }

    /// A ring lowered to a limit below its length keeps its newest tickets; one left out that
    /// outlives them (admitted under a longer window than the newer ones) still counts: limit 2,
    /// ticket 0 live for an hour, ticket 1 for a minute, met under limit 1.
    #[tokio::test]
    async fn a_lowered_ring_drops_no_live_ticket() {
        let now = unix_nanos();
        let in_secs = |secs: u64| (now + secs * 1_000_000_000) << 1; // lap 0: parity 0
        let store = Preloaded::default();
        let limiter =
            StoreLimiter::new(sliding(1, Duration::from_secs(60)), "t", store.clone()).unwrap();
        let ring = bytes(&[2, 0, in_secs(3600), in_secs(60)]);
        store.0.lock().unwrap().insert(limiter.key("x"), ring);
        match limiter.try_acquire("x").await {
            Err(TryAcquireError::Rejected(r)) => {
                assert!(r.retry_after() > Duration::from_secs(3500), "{r:?}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// A ring lowered to a limit below its length keeps its latest expiries, not its newest
    /// tickets: admitted under other windows, the newest tickets are not the last to expire.
    /// Limit 4: tickets 0 and 1 live for an hour (a process with a long window), tickets 2 and 3
    /// expired (one with a short window). Met under limit 3, the two live ones must both go on
    /// counting. Keeping the newest three tickets (the oldest of them lent the expiry of the one
    /// left out) kept one of them, and the next write, a charge's overdraw, kept that ring: one
    /// live entry and the charge, where the log has three, and the next take was admitted.
    #[tokio::test]
    async fn a_lowered_ring_keeps_its_latest_expiries() {
        let now = unix_nanos();
        let at = |expiry: u64| expiry << 1; // lap 0: parity 0
        let store = Preloaded::default();
        let limiter =
            StoreLimiter::new(sliding(3, Duration::from_secs(60)), "t", store.clone()).unwrap();
        let (live, gone) = (at(now + 3_600_000_000_000), at(now - 1_000_000_000));
        let ring = bytes(&[4, 0, live, live, gone, gone]);
        store.0.lock().unwrap().insert(limiter.key("x"), ring);
        limiter.charge("x", 1).await.unwrap();
        match limiter.try_acquire("x").await {
            Err(TryAcquireError::Rejected(r)) => {
                assert!(r.retry_after() > Duration::from_secs(50), "{r:?}")
            }
            other => panic!("three live (two for an hour, the charge), limit 3: {other:?}"),
        }
    }

    /// A ring lowered after a charge overdrew it: the overdraw marks its slot words with bit 63,
    /// which is no part of the expiry. Limit 2, head 3: ticket 1 (slot 1, lap 0) written by an
    /// overdraw and expired a second ago, ticket 2 (slot 0, lap 1) admitted since, live for a
    /// minute. Met under limit 1, ticket 2 is kept and must go on counting; ticket 1, left out,
    /// must not lend it its (marked, so numerically larger) word.
    #[tokio::test]
    async fn a_lowered_ring_after_an_overdraw_drops_no_live_ticket() {
        const OVERDRAWN: u64 = 1 << 63;
        let now = unix_nanos();
        let overdrawn = ((now - 1_000_000_000) << 1) | OVERDRAWN; // lap 0: parity 0
        let live = ((now + 60_000_000_000) << 1) | 1; // lap 1: parity 1
        let store = Preloaded::default();
        let limiter =
            StoreLimiter::new(sliding(1, Duration::from_secs(60)), "t", store.clone()).unwrap();
        let ring = bytes(&[3, 1, live, overdrawn]);
        store.0.lock().unwrap().insert(limiter.key("x"), ring);
        match limiter.try_acquire("x").await {
            Err(TryAcquireError::Rejected(r)) => {
                assert!(r.retry_after() > Duration::from_secs(50), "{r:?}")
            }
            other => panic!("the live ticket was lost: {other:?}"),
        }
    }

    /// The check that discards inconsistent rings keeps every ring the limiter itself writes,
    /// including one whose tickets have wrapped around the slots: limit 2, tickets 1 and 2 live
    /// (ticket 1 in slot 1 on lap 0, ticket 2 in slot 0 on lap 1), head 3. Restored, it rejects.
    #[test]
    fn a_wrapped_ring_is_restored_not_discarded() {
        let now = unix_nanos();
        let expiry = now + 60_000_000_000;
        let slot = |parity: u64| (expiry << 1) | parity;
        match decide_on(&[3, 1, slot(1), slot(0)], 1) {
            Err(TryAcquireError::Rejected(r)) => {
                assert!(r.retry_after() > Duration::from_secs(50), "{r:?}")
            }
            other => panic!("the stored ring was lost: {other:?}"),
        }
    }
}

/// `reset`: the subject's next call starts fresh, every other subject keeps its state, and the
/// default `Store::delete` (get, then an empty value for 1 ms) leaves nothing that counts.
#[tokio::test]
async fn reset_forgets_one_subject_and_keeps_the_others() {
    // Windows aligned to the wall clock's epoch: no minute may end among the calls.
    common::room_in_wall_window(Duration::from_secs(60), Duration::from_secs(10));
    for algorithm in common::all_algorithms(3, Duration::from_secs(60)) {
        let store = Memory::default();
        let limiter = StoreLimiter::new(algorithm, "t", store.clone()).unwrap();
        limiter.try_acquire_n("a", 3).await.unwrap();
        assert!(limiter.try_acquire("a").await.is_err(), "{algorithm:?}");
        limiter.try_acquire("b").await.unwrap();
        assert!(limiter.reset("a").await.unwrap(), "{algorithm:?}");
        {
            // What the default delete leaves: an empty value, gone within a millisecond.
            let map = store.map.lock().unwrap();
            let (value, until) = &map[&limiter.key("a")];
            assert!(value.is_empty(), "{algorithm:?}");
            assert!(*until <= Instant::now() + Duration::from_millis(1));
        }
        // Nothing left to forget: the empty value is no state.
        assert!(!limiter.reset("a").await.unwrap(), "{algorithm:?}");
        assert!(!limiter.reset("never-seen").await.unwrap());
        for left in [2, 1, 0] {
            let admission = limiter.try_acquire("a").await.unwrap();
            assert_eq!(admission.remaining(), left, "{algorithm:?}");
        }
        assert!(limiter.try_acquire("a").await.is_err(), "{algorithm:?}");
        // "b" still has the one permit it took counted against it.
        assert_eq!(
            limiter.try_acquire_n("b", 2).await.unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert!(limiter.try_acquire("b").await.is_err(), "{algorithm:?}");
    }
}

#[tokio::test]
async fn reset_on_a_failing_store_is_the_store_error() {
    // "The state is still there" holds only within the minute (on the wall clock) of its
    // admission.
    common::room_in_wall_window(Duration::from_secs(60), Duration::from_secs(5));
    let store = Memory::default();
    let limiter = StoreLimiter::new(fixed(1, Duration::from_secs(60)), "t", store.clone()).unwrap();
    limiter.try_acquire("a").await.unwrap();
    store.fail.store(true, Ordering::Relaxed);
    assert!(limiter.reset("a").await.is_err());
    // A reset is not a decision: the stats count none.
    assert_eq!(limiter.stats().errors, 0);
    store.fail.store(false, Ordering::Relaxed);
    assert!(
        limiter.try_acquire("a").await.is_err(),
        "the state is still there"
    );
    assert!(limiter.reset("a").await.unwrap());
    limiter.try_acquire("a").await.unwrap();
}

/// A reset racing a decision on the same subject is serialised with it by the subject's lock.
/// The store answers a `get` with what it held when asked and yields before the reply arrives,
/// and yields before a `set` lands, as a network store does; its `delete` is immediate. Without
/// the lock the reset would run between the decision's `get` and `set`, and the decision would
/// write the state it read before the reset back over it.
mod reset_race {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use turnstile::{Store, StoreLimiter};

    #[derive(Default, Clone)]
    struct Slow {
        map: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>,
        deletes: Arc<AtomicU64>,
    }

    impl Store for Slow {
        type Error = std::convert::Infallible;

        async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
            let value = self.map.lock().unwrap().get(key).cloned();
            tokio::task::yield_now().await;
            Ok(value)
        }

        async fn set(&self, key: &[u8], value: Vec<u8>, _: Duration) -> Result<(), Self::Error> {
            tokio::task::yield_now().await;
            self.map.lock().unwrap().insert(key.to_vec(), value);
            Ok(())
        }

        async fn delete(&self, key: &[u8]) -> Result<bool, Self::Error> {
            self.deletes.fetch_add(1, Ordering::Relaxed);
            Ok(self.map.lock().unwrap().remove(key).is_some())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reset_racing_a_decision_is_serialised_with_it() {
        // The racing decision counts the first admission only within its minute (wall clock).
        crate::common::room_in_wall_window(Duration::from_secs(60), Duration::from_secs(10));
        for algorithm in crate::common::all_algorithms(2, Duration::from_secs(60)) {
            let store = Slow::default();
            let limiter = StoreLimiter::new(algorithm, "t", store.clone()).unwrap();
            limiter.try_acquire("x").await.unwrap();
            // The decision is polled first: it takes the lock and reads the state with one
            // permit taken; the reset then waits for it.
            let (decided, reset) = tokio::join!(limiter.try_acquire("x"), limiter.reset("x"));
            assert_eq!(decided.unwrap().remaining(), 0, "{algorithm:?}");
            assert_eq!(reset, Ok(true), "{algorithm:?}");
            assert_eq!(
                store.deletes.load(Ordering::Relaxed),
                1,
                "the override is used"
            );
            // Decided before the reset, forgotten with the rest: the full limit again.
            let fresh = limiter.try_acquire_n("x", 2).await;
            assert_eq!(fresh.map(|a| a.remaining()), Ok(0), "{algorithm:?}");
        }
    }
}

/// State must not expire while it still restricts. A sliding window's admissions each keep the
/// window they were admitted under, so after a redeploy with a shorter window (another process,
/// or the next version, over the same keys) the ring holds tickets that outlive the new window.
/// The key's TTL must cover them, not only the newest admission's window.
#[tokio::test]
async fn a_shorter_window_does_not_shorten_the_life_of_older_admissions() {
    let store = Memory::default();
    let window = |secs| Algorithm::SlidingWindow {
        limit: 2,
        window: Duration::from_secs(secs),
    };
    let before = StoreLimiter::new(window(3600), "t", store.clone()).unwrap();
    let after = StoreLimiter::new(window(60), "t", store.clone()).unwrap();
    before.try_acquire("x").await.unwrap();
    after.try_acquire("x").await.unwrap();
    // The hour-long admission still counts: the ring is full for about an hour.
    let restricts = match after.try_acquire("x").await {
        Err(TryAcquireError::Rejected(r)) => r.retry_after(),
        other => panic!("{other:?}"),
    };
    assert!(restricts > Duration::from_secs(3500), "{restricts:?}");
    let until = store.map.lock().unwrap()[&after.key("x")].1;
    // Within a second: the TTL is reckoned from the admission's wall-clock time, the store's
    // expiry from its own `Instant` a little later, and `restricts` from the rejection's time.
    assert!(
        until + Duration::from_secs(1) >= Instant::now() + restricts,
        "the key expires {:?} from now, while its state restricts for {restricts:?}",
        until - Instant::now()
    );
}

/// A sliding window's ring has one slot per permit, so a redeploy with another limit (another
/// process, or the next version, over the same keys) meets a ring of another length. It must go
/// on counting the admissions in it under the new limit, as the in-memory `reconfigure` and the
/// Redis backend do, not forget them and hand out the new limit on top.
/// The parameters are not stored (see `StoreLimiter`): two processes over one store with
/// fixed windows of different lengths read each other's window as over, so at every turn of
/// the writer the subject starts a fresh window, and limit 2 each admits 6 in three turns
/// within one hour. Pinned so that the documentation stays true; the Redis backend, which
/// stores them, is the answer for a fleet whose parameters may differ.
#[tokio::test]
async fn processes_with_other_windows_read_each_others_windows_as_over() {
    let store = Memory::default();
    let hour = Duration::from_secs(3600);
    // One hour (and so one two-hour window) of the wall clock holds all the turns.
    common::room_in_wall_window(hour, Duration::from_secs(30));
    let a = StoreLimiter::new(fixed(2, hour), "t", store.clone()).unwrap();
    let b = StoreLimiter::new(fixed(2, 2 * hour), "t", store.clone()).unwrap();
    for limiter in [&a, &b, &a] {
        assert_eq!(
            limiter.try_acquire_n("x", 2).await.map(|a| a.remaining()),
            Ok(0)
        );
        assert!(limiter.try_acquire("x").await.is_err());
    }
    // The same window length, another limit: the count is kept and read under the caller's.
    let c = StoreLimiter::new(fixed(3, hour), "t", store.clone()).unwrap();
    assert_eq!(c.try_acquire("x").await.map(|a| a.remaining()), Ok(0));
}

#[tokio::test]
async fn a_sliding_window_of_another_limit_keeps_counting_the_admissions_made() {
    let hour = Duration::from_secs(3600);
    let limit = |limit| Algorithm::SlidingWindow {
        limit,
        window: hour,
    };
    let store = Memory::default();
    let four = StoreLimiter::new(limit(4), "t", store.clone()).unwrap();
    four.try_acquire_n("x", 4).await.unwrap();
    // Lowered to 2: the four admissions of the last hour already exceed it.
    let two = StoreLimiter::new(limit(2), "t", store.clone()).unwrap();
    match two.try_acquire("x").await {
        Err(TryAcquireError::Rejected(r)) => {
            assert!(r.retry_after() > hour - Duration::from_secs(60), "{r:?}")
        }
        other => panic!("the four admissions were forgotten: {other:?}"),
    }
    // Raised to 6: two more, not six.
    let six = StoreLimiter::new(limit(6), "t", store.clone()).unwrap();
    assert_eq!(
        six.try_acquire_n("x", 2).await.map(|a| a.remaining()),
        Ok(0)
    );
    assert!(six.try_acquire("x").await.is_err());
    // And back at 4, the six are counted.
    assert!(four.try_acquire("x").await.is_err());
    // A ring of another length whose tickets below `head` are not all published is no ring of
    // this algorithm's: treated as absent, as one of the right length is.
    let key = two.key("y");
    let inconsistent = [3u64, 0, 1, 1, 1]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    store
        .map
        .lock()
        .unwrap()
        .insert(key, (inconsistent, Instant::now() + hour));
    assert_eq!(
        two.try_acquire_n("y", 2).await.map(|a| a.remaining()),
        Ok(0)
    );
}

/// The documented cancel safety, with a store whose `get` or `set` can be made to never answer
/// (tokio's paused time runs the timeouts): a decision dropped in `get` or `set` writes nothing
/// and counts nothing, a reset dropped while it waits for the subject's lock removes nothing,
/// and either way the lock is passed on.
mod cancellation {
    use super::fixed;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use turnstile::{Store, StoreLimiter};

    #[derive(Default, Clone)]
    struct Stuck {
        map: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>,
        hang_get: Arc<AtomicBool>,
        hang_set: Arc<AtomicBool>,
    }

    impl Store for Stuck {
        type Error = std::convert::Infallible;

        async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
            if self.hang_get.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            Ok(self.map.lock().unwrap().get(key).cloned())
        }

        async fn set(&self, key: &[u8], value: Vec<u8>, _: Duration) -> Result<(), Self::Error> {
            if self.hang_set.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            self.map.lock().unwrap().insert(key.to_vec(), value);
            Ok(())
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn dropped_decisions_and_resets_leave_the_state_whole() {
        // The paused tokio clock does not move the store's time, the wall clock: make room in
        // its hour (the window's epoch) for the admissions and the rejection.
        let hour = Duration::from_secs(3600);
        crate::common::room_in_wall_window(hour, Duration::from_secs(30));
        let store = Stuck::default();
        let limiter =
            StoreLimiter::new(fixed(2, Duration::from_secs(3600)), "t", store.clone()).unwrap();
        let second = Duration::from_secs(1);
        limiter.try_acquire("x").await.unwrap();
        let before = store.map.lock().unwrap()[&limiter.key("x")].clone();
        // Dropped in `set`: the admission never landed, and is not counted.
        store.hang_set.store(true, Ordering::Relaxed);
        assert!(
            tokio::time::timeout(second, limiter.try_acquire("x"))
                .await
                .is_err()
        );
        store.hang_set.store(false, Ordering::Relaxed);
        assert_eq!(store.map.lock().unwrap()[&limiter.key("x")], before);
        assert_eq!(limiter.stats().admitted, 1);
        // Dropped in `get`, with a reset queued behind it on the subject's lock: both dropped.
        store.hang_get.store(true, Ordering::Relaxed);
        let both = async { tokio::join!(limiter.try_acquire("x"), limiter.reset("x")) };
        assert!(tokio::time::timeout(second, both).await.is_err());
        store.hang_get.store(false, Ordering::Relaxed);
        assert_eq!(store.map.lock().unwrap()[&limiter.key("x")], before);
        // The lock was passed on: the next decision runs, on the state as it was (one taken).
        let admission = limiter.try_acquire("x").await.unwrap();
        assert_eq!(admission.remaining(), 0);
        assert!(limiter.try_acquire("x").await.is_err());
        let stats = limiter.stats();
        assert_eq!((stats.admitted, stats.rejected, stats.errors), (2, 1, 0));
    }
}

/// `acquire_n` waits (real time: the store's state is on the wall clock, which is what is under
/// test): eight tasks take 3 permits each from a 6-per-40 ms fixed window, all are admitted in
/// the end, no window holds more than its 6 (audited on the admissions' own times), and they
/// span at least three windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_waits_for_the_window_and_never_over_admits() {
    let window = Duration::from_millis(40);
    let limiter = StoreLimiter::new(
        Algorithm::FixedWindow { limit: 6, window },
        "w",
        Memory::default(),
    )
    .unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire_n("s", 3).await.unwrap().at_nanos() })
        })
        .collect();
    let mut per_window: HashMap<u64, u32> = HashMap::new();
    for task in tasks {
        let at = task.await.unwrap();
        *per_window.entry(at / window.as_nanos() as u64).or_default() += 3;
    }
    assert!(per_window.values().all(|&n| n <= 6), "{per_window:?}");
    assert_eq!(per_window.values().sum::<u32>(), 24);
    assert!(
        per_window.len() >= 4,
        "24 permits at 6 per window: {per_window:?}"
    );
    assert_eq!(limiter.stats().admitted, 8);
}

/// A wait that can never end fails at once: more than the limit, or a failing store.
#[tokio::test]
async fn acquire_fails_at_once_when_waiting_cannot_help() {
    let store = Memory::default();
    let limiter = StoreLimiter::new(
        Algorithm::TokenBucket {
            rate: turnstile::Rate::per_second(1),
            burst: 2,
        },
        "f",
        store.clone(),
    )
    .unwrap();
    assert_eq!(
        limiter.acquire_n("s", 3).await,
        Err(turnstile::AcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    );
    limiter.acquire_n("s", 2).await.unwrap();
    store.fail.store(true, Ordering::Relaxed);
    // The bucket is empty, but the store is down: the store's error ends the wait.
    assert_eq!(
        limiter.acquire("s").await,
        Err(turnstile::AcquireError::Unavailable)
    );
    assert_eq!(limiter.stats().errors, 1);
}

/// The expiry of `key` in `store`.
fn expiry(store: &Memory, key: &[u8]) -> Instant {
    store.map.lock().unwrap()[key].1
}

/// A charge is stored with the in-memory algorithm's semantics: the subject is in debt for
/// every limiter over the store (another process's too), with the retry-after the debt gives,
/// and its key lives as long as the debt. `charge(0)` writes nothing, and never fails.
#[tokio::test]
async fn a_charge_is_stored_and_puts_each_algorithm_in_debt() {
    let hour = Duration::from_secs(3600);
    // The fixed window's debt lasts to its hour's end (wall clock): not within the test.
    common::room_in_wall_window(hour, Duration::from_secs(30));
    for algorithm in common::all_algorithms(3, hour) {
        let store = Memory::default();
        let limiter = StoreLimiter::new(algorithm, "t", store.clone()).unwrap();
        let other = StoreLimiter::new(algorithm, "t", store.clone()).unwrap();
        let probe = limiter.charge("a", 0).await.unwrap();
        assert_eq!(probe.remaining(), 3, "{algorithm:?}");
        assert_eq!(store.sets.load(Ordering::Relaxed), 0, "charge(0) wrote");
        limiter.try_acquire("a").await.unwrap();
        let charged = limiter.charge("a", 5).await.unwrap();
        assert_eq!(charged.remaining(), 0, "{algorithm:?}");
        assert_eq!(store.sets.load(Ordering::Relaxed), 2, "{algorithm:?}");
        // Stored until the state is fresh again: the charge's reset_after.
        let lives = expiry(&store, &limiter.key("a")).saturating_duration_since(Instant::now());
        assert!(
            lives <= charged.reset_after()
                && lives + Duration::from_secs(1) > charged.reset_after(),
            "{algorithm:?}: {lives:?} vs {charged:?}"
        );
        // What one permit waits for, from the charge's own report (up to the time since).
        let reset = charged.reset_after();
        let free_in = match algorithm {
            // The window's end.
            Algorithm::FixedWindow { .. } => reset,
            // The three latest expiries are all the charge's: one window.
            Algorithm::SlidingWindow { .. } => hour,
            // cur = 6 becomes prev: one fits once 6·(W − e) ≤ 2·W, W/3 before the two windows end.
            Algorithm::SlidingCounter { .. } => reset - hour / 3,
            // TAT = the admission's time + 6 · 20 min; one fits once TAT − now ≤ 60 − 20 min.
            _ => {
                let six = Duration::from_secs(6 * 1200);
                assert!(
                    reset <= six && reset + Duration::from_secs(1) > six,
                    "{reset:?}"
                );
                reset - Duration::from_secs(2400)
            }
        };
        for limiter in [&limiter, &other] {
            let r = match limiter.try_acquire("a").await {
                Err(TryAcquireError::Rejected(r)) => r,
                other => panic!("{algorithm:?}: {other:?}"),
            };
            assert!(
                r.retry_after() <= free_in && r.retry_after() + Duration::from_secs(1) > free_in,
                "{algorithm:?}: {r:?}, free in {free_in:?}"
            );
        }
        // charge(0) on a subject in debt: reported, never refused (a probe is), nothing written.
        assert!(limiter.try_acquire_n("a", 0).await.is_err());
        let full = limiter.charge("a", 0).await.unwrap();
        assert_eq!(full.remaining(), 0, "{algorithm:?}");
        assert_eq!(store.sets.load(Ordering::Relaxed), 2, "{algorithm:?}");
        // Charges are not decisions.
        let stats = limiter.stats();
        assert_eq!((stats.admitted, stats.rejected), (1, 2), "{algorithm:?}");
    }
}

/// Every `n` is accepted: 2^32 − 1 permits saturate as the in-memory algorithms do.
#[tokio::test]
async fn a_huge_charge_saturates_in_a_store() {
    // The fixed window's debt lasts to its minute's end (wall clock): not within the test.
    common::room_in_wall_window(Duration::from_secs(60), Duration::from_secs(5));
    for algorithm in common::all_algorithms(3, Duration::from_secs(60)) {
        let store = Memory::default();
        let limiter = StoreLimiter::new(algorithm, "t", store.clone()).unwrap();
        for _ in 0..2 {
            let charged = limiter.charge("a", u32::MAX).await.unwrap();
            assert_eq!(charged.remaining(), 0, "{algorithm:?}");
        }
        assert!(
            matches!(
                limiter.try_acquire("a").await,
                Err(TryAcquireError::Rejected(_))
            ),
            "{algorithm:?}"
        );
    }
}

/// A store that fails makes the charge fail with the store's error, recording nothing; it is
/// not counted as a decision.
#[tokio::test]
async fn a_charge_on_a_failing_store_is_the_store_error() {
    let store = Memory::default();
    let limiter =
        StoreLimiter::new(fixed(2, Duration::from_secs(3600)), "t", store.clone()).unwrap();
    store.fail.store(true, Ordering::Relaxed);
    assert!(matches!(limiter.charge("a", 5).await, Err(Down)));
    assert_eq!(limiter.stats().errors, 0);
    store.fail.store(false, Ordering::Relaxed);
    assert_eq!(limiter.try_acquire("a").await.unwrap().remaining(), 1);
}

/// A store whose `set` takes `delay` (tokio's time), as a slow network store's would.
#[derive(Clone, Default)]
struct Slow {
    memory: Memory,
    delay: Arc<Mutex<Duration>>,
}

impl Store for Slow {
    type Error = Down;

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Down> {
        self.memory.get(key).await
    }

    async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Down> {
        let delay = *self.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        self.memory.set(key, value, ttl).await
    }
}

/// `acquire_timeout` gives up at its time limit, on tokio's (paused) time, the sleep toward
/// the next window cut short there; the refused attempts took nothing. A limit that never
/// passes (`Duration::MAX`) is taken, and a call admitted at once sets no limit's worth of
/// waiting.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn acquire_timeout_gives_up_at_its_time_limit() {
    let limiter =
        StoreLimiter::new(fixed(3, Duration::from_secs(3600)), "t", Memory::default()).unwrap();
    let started = tokio::time::Instant::now();
    let first = limiter
        .acquire_timeout("a", 2, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(first.remaining(), 1);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        limiter
            .acquire_timeout("a", 2, Duration::from_secs(2))
            .await,
        Err(turnstile::AcquireError::Timeout)
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2001),
        "{waited:?}"
    );
    // Nothing was taken by the refused attempts: the last permit is still there.
    assert_eq!(
        limiter
            .acquire_timeout("a", 1, Duration::MAX)
            .await
            .unwrap()
            .remaining(),
        0
    );
    assert_eq!(
        limiter
            .acquire_timeout("a", 4, Duration::from_secs(1))
            .await,
        Err(turnstile::AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    );
}

/// The time limit ends a sleep between attempts, never a decision: an attempt whose `set` is
/// still under way when the time is up is awaited and its admission answered (a
/// `tokio::time::timeout` around `acquire_n` drops it there, with its write half done). And an
/// attempt under way then that is refused ends the call with `Timeout` without another sleep.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn acquire_timeout_answers_the_decision_under_way_at_its_time_limit() {
    let store = Slow::default();
    *store.delay.lock().unwrap() = Duration::from_secs(3);
    let limiter = StoreLimiter::new(fixed(1, Duration::from_secs(3600)), "t", store).unwrap();
    let started = tokio::time::Instant::now();
    let admission = limiter
        .acquire_timeout("a", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(admission.remaining(), 0);
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    // The admission was written: the next call is refused (a refusal writes nothing, so it
    // does not wait for the slow `set`), at the time limit.
    let started = tokio::time::Instant::now();
    assert_eq!(
        limiter
            .acquire_timeout("a", 1, Duration::from_secs(1))
            .await,
        Err(turnstile::AcquireError::Timeout)
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(limiter.stats().admitted, 1);
}

/// Real time (the store's windows are on the wall clock): a call admitted within its time
/// limit, once the next 30 ms window opens, is answered with that window's admission.
#[tokio::test]
async fn acquire_timeout_is_admitted_when_the_window_opens_in_time() {
    let window = Duration::from_millis(30);
    let limiter = StoreLimiter::new(fixed(1, window), "t", Memory::default()).unwrap();
    let first = limiter.acquire("a").await.unwrap();
    let second = limiter
        .acquire_timeout("a", 1, Duration::from_secs(5))
        .await
        .unwrap();
    let w = window.as_nanos() as u64;
    assert!(
        second.at_nanos() / w > first.at_nanos() / w,
        "{first:?} {second:?}"
    );
}

/// Extreme parameters: limits of `u32::MAX`, windows and periods of `u64::MAX` ns (and the
/// largest bucket the constructor takes), a `Duration::MAX` window a typed error. Takes,
/// probes and charges of every size neither panic nor overflow; what is admitted counts (the
/// next call beyond the limit is refused), and the state is stored for as long as it
/// restricts: to the end of a window of u64::MAX ns (the year 2554), to the sliding window's
/// saturated expiry (2116), to the slow bucket's arrival time (146 years ahead).
#[tokio::test]
async fn extreme_parameters_are_decided_and_stored() {
    const YEAR: u64 = 365 * 86_400;
    let longest = Duration::from_nanos(u64::MAX);
    assert!(StoreLimiter::new(fixed(1, Duration::MAX), "x", Memory::default()).is_err());
    let counter = Algorithm::SlidingCounter {
        limit: u32::MAX,
        window: longest,
    };
    let sliding = Algorithm::SlidingWindow {
        limit: 1000,
        window: longest,
    };
    let slow = Algorithm::TokenBucket {
        rate: turnstile::Rate::new(1, Duration::from_nanos(u64::MAX / 4)),
        burst: 1,
    };
    // (algorithm, limit, the least it must be stored for after taking the limit)
    let cases = [
        (fixed(u32::MAX, longest), u32::MAX, 500 * YEAR),
        (counter, u32::MAX, 500 * YEAR),
        (sliding, 1000, 85 * YEAR),
        (slow, 1, 145 * YEAR),
    ];
    for (algorithm, limit, least) in cases {
        let store = Memory::default();
        let limiter = StoreLimiter::new(algorithm, "x", store.clone()).unwrap();
        let probe = limiter.try_acquire_n("a", 0).await.unwrap();
        assert_eq!(probe.remaining(), limit, "{algorithm:?}");
        let all = limiter.try_acquire_n("a", limit).await;
        let all = all.unwrap_or_else(|e| panic!("{algorithm:?}: {e:?}"));
        assert_eq!(all.remaining(), 0, "{algorithm:?}");
        assert!(
            matches!(
                limiter.try_acquire("a").await,
                Err(TryAcquireError::Rejected(_))
            ),
            "{algorithm:?}: admitted beyond the limit"
        );
        let lives = expiry(&store, &limiter.key("a")).saturating_duration_since(Instant::now());
        assert!(
            lives > Duration::from_secs(least),
            "{algorithm:?}: stored for {lives:?}"
        );
        for n in [0, 1, u32::MAX] {
            let charged = limiter.charge("a", n).await;
            charged.unwrap_or_else(|e| panic!("{algorithm:?}: {e:?}"));
        }
        let other = limiter.try_acquire_n("b", limit).await;
        assert!(other.is_ok(), "{algorithm:?}: {other:?}");
    }
    // u32::MAX permits a nanosecond is one a nanosecond (the interval rounds up to whole
    // nanoseconds): the burst of 2^32 − 1 comes back in about 4.3 s.
    let fast = Algorithm::TokenBucket {
        rate: turnstile::Rate::new(u32::MAX, Duration::from_nanos(1)),
        burst: u32::MAX,
    };
    let limiter = StoreLimiter::new(fast, "x", Memory::default()).unwrap();
    limiter.try_acquire_n("a", u32::MAX).await.unwrap();
    match limiter.try_acquire_n("a", u32::MAX).await {
        Err(TryAcquireError::Rejected(r)) => {
            assert!(
                r.retry_after() <= Duration::from_nanos(u64::from(u32::MAX)),
                "{r:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    limiter.charge("a", u32::MAX).await.unwrap();
}
