//! `KeyedLimiter`: keys are independent, idle keys are evicted and busy ones never are, the key cap
//! holds under a flood of distinct keys, and (on real threads) eviction racing with admissions
//! never lets a key exceed its limit.

mod common;

use common::hook_clock::HookClock;

use std::collections::HashMap;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use turnstile::{
    Algorithm, Clock, DEFAULT_MAX_KEYS, KeyOverflow, KeyedChain, KeyedLimiter, ManualClock,
    MonotonicClock, Rate, TryAcquireError,
};

const SEC: Duration = Duration::from_secs(1);

fn all_algorithms(limit: u32) -> [Algorithm; 4] {
    [
        Algorithm::FixedWindow { limit, window: SEC },
        Algorithm::SlidingWindow { limit, window: SEC },
        Algorithm::SlidingCounter { limit, window: SEC },
        Algorithm::TokenBucket {
            rate: Rate::per_second(limit),
            burst: limit,
        },
    ]
}

fn manual(algorithm: Algorithm) -> KeyedLimiter<u64, ManualClock> {
    KeyedLimiter::with_clock(algorithm, ManualClock::new()).unwrap()
}

#[test]
fn keys_are_independent() {
    for algorithm in all_algorithms(3) {
        let limiter = manual(algorithm);
        for _ in 0..3 {
            limiter.try_acquire(&1).unwrap();
        }
        let rejected = limiter.try_acquire(&1).unwrap_err();
        assert!(rejected.rejection().is_some(), "{algorithm:?}: {rejected}");
        // Another key starts fresh and is not affected by key 1.
        assert_eq!(limiter.try_acquire_n(&2, 3).unwrap().remaining(), 0);
        assert_eq!(limiter.available(&1), 0);
        assert_eq!(
            limiter.available(&3),
            3,
            "a key never seen has the full limit"
        );
        assert_eq!(limiter.len(), 2);
        let stats = limiter.stats();
        assert_eq!((stats.admitted, stats.rejected), (4, 1), "{algorithm:?}");
    }
}

#[test]
fn decisions_match_an_unkeyed_limiter_per_key() {
    // The same script against a keyed limiter (per key) and one unkeyed limiter per key.
    for algorithm in all_algorithms(4) {
        let clock = ManualClock::new();
        let keyed = KeyedLimiter::with_clock(algorithm, clock.clone()).unwrap();
        let single: Vec<_> = (0..3)
            .map(|_| turnstile::RateLimiter::with_clock(algorithm, clock.clone()).unwrap())
            .collect();
        let mut x = 12345u64;
        for step in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 3) as usize;
            let n = (x >> 8) as u32 % 4;
            if step % 7 == 0 {
                clock.advance(Duration::from_millis(x % 170));
            }
            if step % 300 == 0 {
                clock.advance(3 * SEC); // every key goes idle
            }
            if step % 97 == 0 || step % 300 == 1 {
                keyed.sweep(); // eviction must not change any decision
            }
            let a = keyed.try_acquire_n(&(key as u64), n);
            let b = single[key].try_acquire_n(n);
            assert_eq!(a, b, "{algorithm:?} step {step} key {key} n {n}");
        }
        assert!(
            keyed.stats().evicted > 0,
            "{algorithm:?}: sweeps evicted nothing"
        );
    }
}

#[test]
fn idle_keys_are_evicted_and_busy_ones_kept() {
    for algorithm in all_algorithms(5) {
        let limiter = manual(algorithm);
        let clock = limiter.clock().clone();
        for key in 0..100 {
            limiter.try_acquire(&key).unwrap();
        }
        assert_eq!(limiter.sweep(), 0, "{algorithm:?}: evicted a busy key");
        assert_eq!(limiter.len(), 100);
        // Two windows later every key is idle (the counter remembers one window back).
        clock.advance(2 * SEC);
        limiter.try_acquire_n(&7, 2).unwrap(); // key 7 is busy again
        assert_eq!(limiter.sweep(), 99, "{algorithm:?}");
        assert_eq!(limiter.len(), 1);
        assert_eq!(
            limiter.available(&7),
            3,
            "{algorithm:?}: the busy key kept its state"
        );
        let stats = limiter.stats();
        assert_eq!((stats.evicted, stats.keys), (99, 1));
    }
}

#[test]
fn new_keys_evict_idle_ones_incrementally() {
    // No sweep() call: inserting keys sweeps their shard once it has seen as many inserts as it
    // holds keys, so idle keys do not pile up.
    let limiter = manual(Algorithm::FixedWindow {
        limit: 1,
        window: Duration::from_millis(10),
    });
    let clock = limiter.clock().clone();
    let mut peak = 0;
    for key in 0..200_000u64 {
        if key % 1_000 == 0 {
            clock.advance(Duration::from_millis(10)); // every earlier key turns idle
        }
        limiter.try_acquire(&key).unwrap();
        peak = peak.max(limiter.len());
    }
    assert!(limiter.stats().evicted > 150_000);
    assert!(peak < 40_000, "idle keys piled up: {peak} held at once");
}

#[test]
fn cap_rejects_new_keys_when_none_is_idle() {
    let limiter = KeyedLimiter::builder(Algorithm::FixedWindow {
        limit: 2,
        window: SEC,
    })
    .clock(ManualClock::new())
    .max_keys(10)
    .build()
    .unwrap();
    for key in 0..10u64 {
        limiter.try_acquire(&key).unwrap();
    }
    assert_eq!(
        limiter.try_acquire(&10),
        Err(TryAcquireError::TooManyKeys { max_keys: 10 })
    );
    assert_eq!(
        TryAcquireError::TooManyKeys { max_keys: 10 }.to_string(),
        "the limiter already tracks its maximum of 10 keys and none is idle"
    );
    // Keys already held are still served.
    assert!(limiter.try_acquire(&3).is_ok());
    assert!(limiter.try_acquire(&3).is_err());
    // Probes never create keys, so they are answered even at the cap.
    assert_eq!(limiter.try_acquire_n(&10, 0).unwrap().remaining(), 2);
    assert_eq!(limiter.len(), 10);
    let stats = limiter.stats();
    assert_eq!(stats.overflowed, 1);
    // Once keys are idle, a new key takes the place of one.
    limiter.clock().advance(SEC);
    assert!(limiter.try_acquire(&10).is_ok());
    assert!(limiter.len() <= 10);
}

#[test]
fn cap_shares_one_limiter_among_overflow_keys() {
    let limiter = KeyedLimiter::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(2),
        burst: 2,
    })
    .clock(ManualClock::new())
    .max_keys(2)
    .overflow(KeyOverflow::Shared)
    .build()
    .unwrap();
    limiter.try_acquire(&"a").unwrap();
    limiter.try_acquire(&"b").unwrap();
    // Every further key shares one bucket of 2.
    assert!(limiter.try_acquire(&"c").is_ok());
    assert!(limiter.try_acquire(&"d").is_ok());
    let err = limiter.try_acquire(&"e").unwrap_err();
    assert_eq!(
        err.rejection().unwrap().retry_after(),
        Duration::from_millis(500)
    );
    // The held keys are untouched.
    assert_eq!(limiter.available(&"a"), 1);
    assert_eq!(limiter.stats().overflowed, 3);
    assert_eq!(limiter.len(), 2);
}

#[test]
fn a_million_distinct_keys_stay_within_the_cap() {
    // An attacker sends 1,000,000 distinct keys, each once, while time moves slowly: at most
    // `max_keys` are ever held, and once keys go idle new ones are admitted again.
    let max_keys = 10_000;
    let limiter = KeyedLimiter::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 10,
    })
    .clock(ManualClock::new())
    .max_keys(max_keys)
    .build()
    .unwrap();
    let clock = limiter.clock().clone();
    let (mut admitted, mut too_many) = (0u64, 0u64);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..1_000_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if i % 1_000 == 0 {
            clock.advance(Duration::from_millis(20));
        }
        match limiter.try_acquire(&x) {
            Ok(_) => admitted += 1,
            Err(TryAcquireError::TooManyKeys { .. }) => too_many += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(limiter.len() <= max_keys, "cap exceeded at call {i}");
    }
    // A key admitted once is idle 1 s later (one permit at 1/s), 50,000 calls later: the cap binds,
    // and about `max_keys` new keys get in per second of clock, 20 s in all.
    assert!(
        too_many > 500_000,
        "the cap was reached only {too_many} times"
    );
    assert!(
        (150_000..=250_000).contains(&admitted),
        "admitted {admitted}, expected about 200,000"
    );
    let stats = limiter.stats();
    assert_eq!(stats.admitted + stats.rejected, 1_000_000);
    assert_eq!(stats.overflowed, too_many);
}

#[test]
fn bad_input_is_a_typed_error_and_creates_no_key() {
    let limiter = manual(Algorithm::FixedWindow {
        limit: 3,
        window: SEC,
    });
    assert_eq!(
        limiter.try_acquire_n(&1, 4),
        Err(TryAcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    );
    assert!(limiter.try_acquire_n(&1, 0).is_ok());
    assert!(limiter.is_empty(), "a failed call or a probe created a key");
    assert!(
        KeyedLimiter::<u64>::new(Algorithm::FixedWindow {
            limit: 0,
            window: SEC
        })
        .is_err()
    );
    assert!(
        KeyedLimiter::<u64>::builder(Algorithm::FixedWindow {
            limit: 1,
            window: SEC
        })
        .max_keys(0)
        .build()
        .is_err()
    );
}

#[test]
fn u32_max_limits_work_per_key() {
    let limiter = manual(Algorithm::FixedWindow {
        limit: u32::MAX,
        window: SEC,
    });
    assert_eq!(limiter.try_acquire_n(&1, u32::MAX).unwrap().remaining(), 0);
    assert!(limiter.try_acquire(&1).is_err());
    limiter.clock().advance(SEC);
    assert_eq!(limiter.sweep(), 1);
    assert_eq!(limiter.try_acquire(&1).unwrap().remaining(), u32::MAX - 1);
}

// --- Stress: eviction racing with admissions on real threads -------------------------------------

const HOT_KEYS: u64 = 10_000;
const THREADS: usize = 4;
const ATTEMPTS_PER_THREAD: u64 = 250_000;

/// Four threads walk the same key sequence (so they collide on keys) in bursts of 8 attempts per
/// key while a fifth thread sweeps without pause, so keys are retired and re-created under the
/// callers' feet. Returns every admission per key, sorted by time.
fn hammer_keys<C: Clock>(limiter: &KeyedLimiter<u64, C>) -> HashMap<u64, Vec<(u64, u64)>> {
    let barrier = Barrier::new(THREADS + 1);
    let done = AtomicBool::new(false);
    let per_thread: Vec<Vec<(u64, u64, u64)>> = std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            barrier.wait();
            let mut swept = 0;
            while !done.load(Ordering::Relaxed) {
                swept += limiter.sweep();
            }
            swept
        });
        let handles: Vec<_> = (0..THREADS as u64)
            .map(|id| {
                let (barrier, limiter) = (&barrier, limiter);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    barrier.wait();
                    for i in 0..ATTEMPTS_PER_THREAD {
                        let key = (i / 8).wrapping_mul(0x9E37_79B9) % HOT_KEYS;
                        let n = if id < 2 { 1 } else { 1 + (i % 3) as u32 };
                        if let Ok(a) = limiter.try_acquire_n(&key, n) {
                            mine.push((key, a.at_nanos(), u64::from(n)));
                        }
                    }
                    mine
                })
            })
            .collect();
        let results = handles.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        assert!(
            sweeper.join().unwrap() > 0,
            "the sweeper never evicted a key"
        );
        results
    });
    let mut by_key: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut admitted = 0;
    for (key, t, n) in per_thread.into_iter().flatten() {
        by_key.entry(key).or_default().push((t, n));
        admitted += 1;
    }
    for v in by_key.values_mut() {
        v.sort_unstable();
    }
    let stats = limiter.stats();
    let attempts = THREADS as u64 * ATTEMPTS_PER_THREAD;
    assert_eq!(stats.admitted + stats.rejected, attempts, "stats add up");
    assert_eq!(stats.admitted, admitted);
    assert!(
        stats.rejected > attempts / 10,
        "the audit must exercise rejections"
    );
    assert!(stats.evicted > 1_000, "the audit must exercise eviction");
    by_key
}

fn audit(algorithm: Algorithm, violations: impl Fn(&[(u64, u64)]) -> usize) {
    let limiter = KeyedLimiter::with_clock(algorithm, MonotonicClock::new()).unwrap();
    let by_key = hammer_keys(&limiter);
    assert!(
        by_key.len() > (HOT_KEYS / 2) as usize,
        "too few keys admitted"
    );
    let bad: usize = by_key.values().map(|a| violations(a)).sum();
    assert_eq!(bad, 0, "{algorithm:?}: over-admissions across all keys");
}

#[test]
fn keyed_fixed_window_never_over_admits_under_eviction() {
    let (limit, window) = (4, Duration::from_micros(50));
    audit(Algorithm::FixedWindow { limit, window }, |a| {
        common::fixed_violations(a, limit, window)
    });
}

#[test]
fn keyed_sliding_window_never_over_admits_under_eviction() {
    let (limit, window) = (4, Duration::from_micros(50));
    audit(Algorithm::SlidingWindow { limit, window }, |a| {
        common::sliding_violations(a, limit, window)
    });
}

#[test]
fn keyed_sliding_counter_respects_its_estimate_under_eviction() {
    let (limit, window) = (4, Duration::from_micros(50));
    audit(Algorithm::SlidingCounter { limit, window }, |a| {
        common::counter_violations(a, limit, window)
    });
}

#[test]
fn keyed_token_bucket_conforms_under_eviction() {
    let (rate, burst) = (Rate::new(1, Duration::from_micros(20)), 4);
    audit(Algorithm::TokenBucket { rate, burst }, |a| {
        common::bucket_violations(a, rate, burst)
    });
}

/// A reconfiguration that makes keys idle sooner (a shorter window, a faster refill) must not be
/// hidden by the sweep hints computed under the old parameters: `sweep()` evicts every idle key,
/// and a new key at the cap evicts an idle one instead of being refused.
#[test]
fn keys_made_idle_by_a_reconfiguration_are_evicted() {
    let cases = [
        (
            Algorithm::FixedWindow {
                limit: 5,
                window: Duration::from_secs(60),
            },
            Algorithm::FixedWindow {
                limit: 5,
                window: SEC,
            },
        ),
        (
            Algorithm::SlidingCounter {
                limit: 5,
                window: Duration::from_secs(60),
            },
            Algorithm::SlidingCounter {
                limit: 5,
                window: SEC,
            },
        ),
        (
            Algorithm::TokenBucket {
                rate: Rate::per_minute(1),
                burst: 5,
            },
            Algorithm::TokenBucket {
                rate: Rate::per_second(100),
                burst: 5,
            },
        ),
    ];
    for (before, after) in cases {
        // sweep(): a sweep under the old parameters saw key 1 busy for a minute.
        let limiter = manual(before);
        limiter.try_acquire(&1).unwrap();
        assert_eq!(limiter.sweep(), 0, "{before:?}: busy");
        limiter.reconfigure(after).unwrap();
        limiter.clock().advance(Duration::from_secs(5));
        assert_eq!(limiter.available(&1), 5, "{after:?}: key 1 is idle again");
        assert_eq!(limiter.sweep(), 1, "{after:?}: the idle key is evicted");
        assert!(limiter.is_empty());

        // At the cap: the search for room saw every key busy for a minute.
        let limiter = KeyedLimiter::<u64, _>::builder(before)
            .clock(ManualClock::new())
            .max_keys(1)
            .overflow(KeyOverflow::Reject)
            .build()
            .unwrap();
        limiter.try_acquire(&1).unwrap();
        assert!(matches!(
            limiter.try_acquire(&2),
            Err(TryAcquireError::TooManyKeys { max_keys: 1 })
        ));
        limiter.reconfigure(after).unwrap();
        limiter.clock().advance(Duration::from_secs(5));
        assert!(
            limiter.try_acquire(&3).is_ok(),
            "{after:?}: key 1 is idle and makes room"
        );
        assert_eq!(limiter.len(), 1);
    }
}

/// A key whose `Clone` runs a hook armed on this thread, once: the store clones a new key just
/// before it inserts the key's cell, after it has checked `n` against the limit, so the hook
/// can change the limit exactly between that check and the admission on the fresh cell.
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

/// `reconfigure` lowers the limit below `n` between a new key's limit check and its first
/// admission: the admission fails, and the never-used cell it was to be made on must not stay in
/// the map (no sweep ever evicts a cell that has never admitted, so it would hold a key of the
/// cap for good).
#[test]
fn a_first_admission_failed_by_a_lowered_limit_leaves_no_key() {
    for (before, after) in all_algorithms(2).into_iter().zip(all_algorithms(1)) {
        let limiter = KeyedLimiter::<Hooked, _>::builder(before)
            .clock(ManualClock::new())
            .max_keys(1)
            .build()
            .unwrap();
        let lower = limiter.clone();
        ON_CLONE.with(|h| h.set(Some(Box::new(move || lower.reconfigure(after).unwrap()))));
        assert!(
            matches!(
                limiter.try_acquire_n(&Hooked(1), 2),
                Err(TryAcquireError::InsufficientCapacity {
                    requested: 2,
                    capacity: 1
                })
            ),
            "{before:?}"
        );
        assert!(
            ON_CLONE.with(|h| h.take()).is_none(),
            "the hook did not run"
        );
        assert_eq!(
            limiter.len(),
            0,
            "{after:?}: a never-used cell stayed in the map"
        );
        limiter.clock().advance(Duration::from_secs(5));
        assert_eq!(limiter.sweep(), 0);
        assert_eq!(limiter.stats().evicted, 0, "not an eviction");
        // The cap's one slot is free for another key.
        assert!(limiter.try_acquire(&Hooked(2)).is_ok(), "{after:?}");
        assert_eq!(limiter.len(), 1);
    }
}

/// `reset` forgets a key's state whatever the algorithm: an exhausted key gets its whole limit
/// back at once, the key's slot under the cap is given back and counted as reset (not evicted),
/// and a key with nothing to forget is left as it is.
#[test]
fn reset_forgets_a_key_and_gives_back_its_slot() {
    for algorithm in all_algorithms(3) {
        let name = format!("{algorithm:?}");
        let limiter = KeyedLimiter::<u64, _>::builder(algorithm)
            .clock(ManualClock::new())
            .max_keys(1)
            .build()
            .unwrap();
        assert!(!limiter.reset(&1), "{name}: nothing to forget yet");
        limiter.try_acquire_n(&1, 3).unwrap();
        assert!(limiter.try_acquire(&1).is_err(), "{name}");
        assert_eq!(
            limiter.try_acquire(&2),
            Err(TryAcquireError::TooManyKeys { max_keys: 1 }),
            "{name}: the cap is reached and key 1 is busy"
        );
        assert!(limiter.reset(&1), "{name}");
        assert_eq!(limiter.len(), 0, "{name}");
        assert!(!limiter.reset(&1), "{name}: forgotten already");
        // The slot is free again: another key takes it, and key 1 now meets the cap.
        limiter.try_acquire(&2).unwrap();
        assert!(limiter.reset(&2), "{name}");
        assert_eq!(limiter.available(&1), 3, "{name}");
        assert_eq!(
            limiter.try_acquire_n(&1, 3).unwrap().remaining(),
            0,
            "{name}"
        );
        let stats = limiter.stats();
        assert_eq!(
            (stats.reset, stats.evicted, stats.keys),
            (2, 0, 1),
            "{name}"
        );
        // Nothing idle: a sweep evicts nothing and the books still balance.
        assert_eq!(limiter.sweep(), 0, "{name}");
        assert_eq!(limiter.len(), 1, "{name}");
    }
}

/// A key reset while other threads hammer it and sweeps run: the books balance at the end
/// (every key the limiter still counts is really held, a final sweep of idle keys empties it),
/// and the cap still admits exactly `max_keys` keys. A double count of a key both a sweep and
/// a reset retired would leave `len` wrong or the cap short for good.
#[test]
fn resets_racing_admissions_and_sweeps_keep_the_books() {
    for algorithm in all_algorithms(2) {
        let name = format!("{algorithm:?}");
        let clock = ManualClock::new();
        let limiter = KeyedLimiter::<u64, _>::builder(algorithm)
            .clock(clock.clone())
            .max_keys(8)
            .build()
            .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = limiter.try_acquire(&(i % 4));
                    i += 1;
                }
            });
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    limiter.sweep();
                    clock.advance(SEC / 4);
                }
            });
            for round in 0..20_000u64 {
                limiter.reset(&(round % 4));
            }
            stop.store(true, Ordering::Relaxed);
        });
        clock.advance(10 * SEC);
        limiter.sweep();
        assert_eq!(
            limiter.len(),
            0,
            "{name}: keys left counted after every key went idle"
        );
        for key in 0..8 {
            limiter.try_acquire(&(100 + key)).unwrap();
        }
        assert_eq!(
            limiter.try_acquire(&200),
            Err(TryAcquireError::TooManyKeys { max_keys: 8 }),
            "{name}: the cap moved"
        );
    }
}

/// A chain member's refund that gives a new key's only admission back at clock time 0 leaves
/// the key's state as fresh as a new cell's (a token bucket's word back at 0). Sweeps never
/// evict a cell they take for one whose inserter has yet to use it, so unless the store tells
/// the two apart, or takes such a cell back, the key holds a slot of the cap for good, however
/// long it stays idle. (The fixed window and the sliding counter write another word for an
/// emptied window 0; the exact sliding window never refunds its ticket counter back to 0.)
#[test]
fn a_key_whose_only_admission_was_refunded_is_still_evicted() {
    let cases = all_algorithms(1)
        .into_iter()
        .filter(|a| !matches!(a, Algorithm::SlidingWindow { .. }));
    for algorithm in cases {
        let clock = ManualClock::new();
        let per_key = KeyedLimiter::<u64, _>::builder(algorithm)
            .clock(clock.clone())
            .max_keys(1)
            .build()
            .unwrap();
        // A second member whose cap one busy key fills: its check lets a new key through (no
        // search for room has failed yet), and its commit refuses it, after the first member
        // committed: the first member's admission is refunded at once, at time 0.
        let full = KeyedLimiter::<u64, _>::builder(Algorithm::FixedWindow {
            limit: 1,
            window: SEC,
        })
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
        full.try_acquire(&0).unwrap();
        let chain = KeyedChain::builder()
            .per_key(per_key.clone())
            .per_key(full)
            .build()
            .unwrap();
        assert_eq!(
            chain.try_acquire(&1),
            Err(TryAcquireError::TooManyKeys { max_keys: 1 }),
            "{algorithm:?}"
        );
        assert_eq!(chain.stats().refunded, 1, "{algorithm:?}");
        assert_eq!(
            per_key.available(&1),
            1,
            "{algorithm:?}: the refund was exact"
        );
        clock.advance(10 * SEC);
        per_key.sweep();
        assert_eq!(
            per_key.len(),
            0,
            "{algorithm:?}: an idle key stayed counted"
        );
        assert!(
            per_key.try_acquire(&2).is_ok(),
            "{algorithm:?}: the cap's one slot is still taken"
        );
    }
}

/// A fixed hasher, so that tests can pick keys of one shard.
type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// One admission per second per key on `clock`, at most `max_keys` keys, hashed by [`Fixed`].
fn one_per_second_on(clock: &HookClock, max_keys: usize) -> KeyedLimiter<u64, HookClock, Fixed> {
    KeyedLimiter::builder(Algorithm::FixedWindow {
        limit: 1,
        window: SEC,
    })
    .clock(clock.clone())
    .hasher(Fixed::default())
    .max_keys(max_keys)
    .build()
    .unwrap()
}

/// Keys that land in one shard whatever the shard count (at most 4,096 shards: the same low
/// 12 bits of the high half of the hash, which picks the shard).
fn same_shard_keys<S: std::hash::BuildHasher>(hasher: &S, n: usize) -> Vec<u64> {
    let mut by_shard: HashMap<u64, Vec<u64>> = HashMap::new();
    for key in 0u64.. {
        let keys = by_shard
            .entry((hasher.hash_one(key) >> 32) & 4095)
            .or_default();
        keys.push(key);
        if keys.len() == n {
            return keys.clone();
        }
    }
    unreachable!()
}

/// At the cap, a sweep that has retired an idle key's cell must have given back that key's
/// slot: the key's next call meets the retired cell and needs a fresh one, and there is no
/// other room (its shard is being swept, so the search for room skips it). The sweep gave the
/// slots back only at the end of its walk of the shard, so for the rest of the walk (up to
/// thousands of keys) every call for a key it had evicted was refused as over the cap, though
/// the key had been idle and held.
///
/// Deterministic: two idle keys A and B fill the cap (2) in one shard; a new key C in the same
/// shard searches for room, which sweeps that shard first; at the clock reading of the walk's
/// second key the hook calls A and B. One of them was retired just before (its call must get a
/// fresh cell and the slot), the other is being judged (its call admits on its idle cell).
#[test]
fn a_key_evicted_by_a_sweep_gets_its_slot_back_before_the_walk_ends() {
    let keys = same_shard_keys(&Fixed::default(), 3);
    let (a, b, c) = (keys[0], keys[1], keys[2]);
    let clock = HookClock::default();
    let limiter = one_per_second_on(&clock, 2);
    limiter.try_acquire(&a).unwrap();
    limiter.try_acquire(&b).unwrap();
    clock.advance(SEC.as_nanos() as u64);
    let outcomes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let (limiter, outcomes) = (limiter.clone(), outcomes.clone());
        // Readings: the search for room's hint check, the shard sweep's, the first key's
        // `retire`, the second key's `retire`.
        clock.arm(
            4,
            Box::new(move || {
                let mut outcomes = outcomes.lock().unwrap();
                outcomes.push(limiter.try_acquire(&a).map(|_| ()));
                outcomes.push(limiter.try_acquire(&b).map(|_| ()));
            }),
        );
    }
    // C finds no room: A and B are held again by the calls the hook made.
    assert_eq!(
        limiter.try_acquire(&c).map(|_| ()),
        Err(TryAcquireError::TooManyKeys { max_keys: 2 })
    );
    let outcomes = outcomes.lock().unwrap().clone();
    assert_eq!(outcomes, [Ok(()), Ok(())], "A and B were idle and held");
    assert_eq!(limiter.len(), 2);
}

/// Two new keys at the cap while idle keys could make room for both: each must get in. The
/// search for room set the limiter-wide hint to "nothing idle, ever" while it ran, so a second
/// new key arriving meanwhile was refused at once as over the cap (or sent to the shared
/// overflow limiter), though idle keys were there to evict.
///
/// Deterministic: three idle keys fill the cap in one shard; new key X searches for room, and at
/// its second clock reading (its shard sweep's hint check) the hook asks for new key Y.
#[test]
fn a_new_key_arriving_during_another_search_for_room_still_finds_idle_keys() {
    let keys = same_shard_keys(&Fixed::default(), 5);
    let (held, x, y) = (&keys[..3], keys[3], keys[4]);
    let clock = HookClock::default();
    let limiter = one_per_second_on(&clock, 3);
    for key in held {
        limiter.try_acquire(key).unwrap();
    }
    clock.advance(SEC.as_nanos() as u64);
    let theirs = std::sync::Arc::new(std::sync::Mutex::new(None));
    {
        let (limiter, theirs) = (limiter.clone(), theirs.clone());
        // Readings: X's search for room's hint check, then its shard sweep's.
        clock.arm(
            2,
            Box::new(move || {
                *theirs.lock().unwrap() = Some(limiter.try_acquire(&y).map(|_| ()));
            }),
        );
    }
    let mine = limiter.try_acquire(&x).map(|_| ());
    let theirs = theirs.lock().unwrap().take();
    assert_eq!(theirs, Some(Ok(())), "Y was refused though keys were idle");
    assert_eq!(mine, Ok(()), "X was refused though keys were idle");
    assert_eq!(limiter.len(), 2);
    assert_eq!(limiter.stats().overflowed, 0);
}

/// A sweep's `retire` reads the clock, and a reconfiguration that shortens the window runs
/// before it judges the word (the sweeper descheduled after its clock read). The key admitted
/// its whole limit in the current window, which the rebased grid keeps (it ends at the
/// reconfiguration's time plus the new length), so the key must stay busy. `retire` judged its
/// earlier clock reading on the new grid, placed it in the window before, found the count
/// stale and evicted the key: a fresh cell then admitted the whole limit again in that same
/// window.
#[test]
fn a_sweep_racing_a_window_change_never_evicts_a_busy_key() {
    const MS: u64 = 1_000_000;
    // A key in shard 0 whatever the shard count, so that the sweep's second clock reading (after
    // that shard's hint check) is its `retire`'s.
    let key = (0u64..)
        .find(|k| (std::hash::BuildHasher::hash_one(&Fixed::default(), k) >> 32) & 4095 == 0)
        .unwrap();
    for (from, to) in [
        (
            Algorithm::FixedWindow {
                limit: 1,
                window: Duration::from_millis(100),
            },
            Algorithm::FixedWindow {
                limit: 1,
                window: Duration::from_millis(10),
            },
        ),
        (
            Algorithm::SlidingCounter {
                limit: 1,
                window: Duration::from_millis(100),
            },
            Algorithm::SlidingCounter {
                limit: 1,
                window: Duration::from_millis(10),
            },
        ),
    ] {
        let clock = HookClock::default();
        let limiter: KeyedLimiter<u64, HookClock, Fixed> = KeyedLimiter::builder(from)
            .clock(clock.clone())
            .hasher(Fixed::default())
            .build()
            .unwrap();
        limiter.try_acquire(&key).unwrap();
        clock.advance(60 * MS);
        {
            let (limiter, clock) = (limiter.clone(), clock.clone());
            // Readings: shard 0's hint check, then the key's `retire` (at 60 ms), after which
            // the window shrinks at 70 ms: the current window now ends at 80 ms.
            clock.clone().arm_after(
                2,
                Box::new(move || {
                    clock.advance(10 * MS);
                    limiter.reconfigure(to).unwrap();
                }),
            );
        }
        limiter.sweep();
        assert!(clock.disarm(), "{from:?}: the hook did not run");
        assert!(
            matches!(limiter.try_acquire(&key), Err(TryAcquireError::Rejected(_))),
            "{from:?} → {to:?}: the key admitted its limit twice in one window"
        );
    }
}

/// At the key cap, with every key busy, a new key's calls are decided by the overflow policy:
/// `available` must report what that gives (the shared limiter's free permits, or none under
/// `Reject`), not the full limit of a cell the key will not get. It reported the full limit,
/// so a caller that checked it was refused (`Rejected` by the exhausted shared limiter, or
/// `TooManyKeys`). Once a key can be evicted again, a new key has the full limit.
#[test]
fn available_for_a_new_key_at_the_cap_reports_the_overflow_policy() {
    let fixed = Algorithm::FixedWindow {
        limit: 2,
        window: SEC,
    };
    let clock = ManualClock::new();
    let shared = KeyedLimiter::builder(fixed)
        .clock(clock.clone())
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    shared.try_acquire(&1u64).unwrap(); // the only key slot, busy for the window
    shared.try_acquire(&2).unwrap(); // the shared limiter: one of its two permits
    assert_eq!(shared.available(&3), 1);
    shared.try_acquire(&3).unwrap();
    assert_eq!(shared.available(&4), 0, "the shared limiter is exhausted");
    assert!(matches!(
        shared.try_acquire(&4),
        Err(TryAcquireError::Rejected(_))
    ));
    assert_eq!(shared.available(&1), 1, "a held key reports its own cell");

    let reject = KeyedLimiter::builder(fixed)
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    reject.try_acquire(&1u64).unwrap();
    assert_eq!(
        reject.try_acquire(&2),
        Err(TryAcquireError::TooManyKeys { max_keys: 1 })
    );
    assert_eq!(reject.available(&2), 0, "refused at the cap");
    clock.advance(SEC);
    // Key 1 is idle now: a new key's call would evict it and start fresh.
    assert_eq!(reject.available(&2), 2);
    assert_eq!(reject.try_acquire(&2).unwrap().remaining(), 1);
}

/// At the key cap, a new key refused by the shared overflow cell is told no later than when a
/// held key turns idle: a call then evicts it and takes its place with a fresh cell of its own.
/// The shared bucket's wait for 5 tokens (5 s) told it 4 s too late.
#[test]
fn at_the_cap_a_shared_cell_refusal_is_no_later_than_a_key_turning_idle() {
    let limiter = KeyedLimiter::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 10,
    })
    .clock(ManualClock::new())
    .max_keys(1)
    .overflow(KeyOverflow::Shared)
    .build()
    .unwrap();
    // The one key is full again, idle, 1 s from now.
    limiter.try_acquire(&"held").unwrap();
    // The shared cell is drained by the keys beyond the cap.
    limiter.try_acquire_n(&"shared", 10).unwrap();
    let retry = limiter
        .try_acquire_n(&"new", 5)
        .unwrap_err()
        .rejection()
        .copied()
        .unwrap();
    assert_eq!(retry.retry_after(), SEC);
    limiter.clock().advance(retry.retry_after());
    assert!(
        limiter.try_acquire_n(&"new", 5).is_ok(),
        "on a cell of its own"
    );
    assert_eq!(limiter.available(&"new"), 5);
    // With no key turning idle sooner, the shared cell's own wait stands: "new" is busy for 5 s,
    // and the shared bucket has refilled one token.
    assert_eq!(
        limiter
            .try_acquire_n(&"newer", 3)
            .unwrap_err()
            .rejection()
            .unwrap()
            .retry_after(),
        2 * SEC
    );
}

/// A sliding counter key whose current window was refunded to nothing weighs only the window
/// before, and turns idle when the current window ends. The sweep used to report it busy for
/// a window more, and at the key cap a new key was refused over the cap (the search for room
/// trusted that time and did not look) while the key was already idle.
#[test]
fn a_counter_key_refunded_to_its_previous_window_frees_its_slot_when_that_window_ends() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, _>::builder(Algorithm::SlidingCounter {
        limit: 2,
        window: SEC,
    })
    .clock(clock.clone())
    .max_keys(1)
    .build()
    .unwrap();
    limiter.try_acquire(&1).unwrap();
    clock.set(SEC + Duration::from_millis(300));
    limiter.try_acquire_refundable(&1, 1).unwrap().refund();
    // Busy until window 1 ends: window 0's permit weighs on it.
    assert_eq!(limiter.sweep(), 0);
    assert_eq!(
        limiter.try_acquire(&2),
        Err(TryAcquireError::TooManyKeys { max_keys: 1 })
    );
    clock.set(2 * SEC);
    assert!(
        limiter.try_acquire(&2).is_ok(),
        "key 1 is idle from 2 s on, and its slot free"
    );
}

/// At the key cap a search for room that finds every key busy makes new keys be refused at
/// once until the earliest time a key it saw turns idle. A refund makes a key idle sooner
/// than that (its only admission given back): the next new key must get its slot, as it would
/// after any other change no clock predicts (a keyed concurrency limiter's release, a
/// reconfiguration).
#[test]
fn a_key_made_idle_by_a_refund_makes_room_at_the_cap_at_once() {
    for algorithm in all_algorithms(1) {
        let clock = ManualClock::new();
        // Mid-window: no state is left as fresh as a new cell by the refund.
        clock.set(SEC + SEC / 2);
        let limiter = KeyedLimiter::<u64, _>::builder(algorithm)
            .clock(clock.clone())
            .max_keys(1)
            .build()
            .unwrap();
        let taken = limiter.try_acquire_refundable(&1, 1).unwrap();
        assert_eq!(
            limiter.try_acquire(&2),
            Err(TryAcquireError::TooManyKeys { max_keys: 1 }),
            "{algorithm:?}"
        );
        taken.refund();
        assert_eq!(
            limiter.available(&1),
            1,
            "{algorithm:?}: the refund was exact"
        );
        assert!(
            limiter.try_acquire(&2).is_ok(),
            "{algorithm:?}: key 1 is idle, yet a new key is refused at the cap"
        );
        assert_eq!(limiter.len(), 1, "{algorithm:?}");
    }
}

/// A key whose `Eq` panics on the `n`th comparison after being armed (`PANIC_ON_EQ`), hashed
/// to one constant so that every pair of keys is compared.
#[derive(Clone, Debug)]
struct TouchyEq(u64);

impl std::hash::Hash for TouchyEq {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

thread_local! {
    static PANIC_ON_EQ: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl PartialEq for TouchyEq {
    fn eq(&self, other: &Self) -> bool {
        let countdown = PANIC_ON_EQ.with(|c| c.get());
        if countdown > 0 {
            PANIC_ON_EQ.with(|c| c.set(countdown - 1));
            if countdown == 1 {
                panic!("TouchyEq panicked");
            }
        }
        self.0 == other.0
    }
}

impl Eq for TouchyEq {}

#[derive(Default)]
struct Constant;

impl std::hash::Hasher for Constant {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, _: &[u8]) {}
}

/// A limiter of `TouchyEq` keys that all hash alike (so that lookups compare them), on a
/// manual clock, holding at most `max_keys` keys.
fn touchy(
    algorithm: Algorithm,
    max_keys: usize,
) -> KeyedLimiter<TouchyEq, ManualClock, std::hash::BuildHasherDefault<Constant>> {
    KeyedLimiter::builder(algorithm)
        .clock(ManualClock::new())
        .hasher(std::hash::BuildHasherDefault::<Constant>::default())
        .max_keys(max_keys)
        .build()
        .unwrap()
}

/// A key's `Eq` that panics anywhere in a call for a new key (its lookups, the insert that
/// compares it with the keys beside it) takes no slot of the cap and leaves no count behind:
/// the panic unwinds out of the call, and the key can be admitted later. (A panic inside the
/// map's insert, after the slot was reserved, kept the slot for good: at `max_keys(2)` with one
/// busy key held, the new key was then refused `TooManyKeys`.)
#[test]
fn a_key_whose_eq_panics_during_its_insert_takes_no_slot() {
    for algorithm in all_algorithms(3) {
        let limiter = touchy(algorithm, 2);
        limiter.try_acquire(&TouchyEq(1)).unwrap();
        // Panic at every comparison a call for key 2 makes, one after another, until a call
        // makes none that panics.
        let mut panics = 0;
        for nth in 1.. {
            PANIC_ON_EQ.with(|c| c.set(nth));
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                limiter.try_acquire(&TouchyEq(2))
            }));
            PANIC_ON_EQ.with(|c| c.set(0));
            match outcome {
                Err(_) => {
                    panics += 1;
                    assert_eq!(
                        limiter.len(),
                        1,
                        "{algorithm:?}: comparison {nth} kept a slot"
                    );
                }
                Ok(decided) => {
                    assert!(
                        decided.is_ok(),
                        "{algorithm:?}: {decided:?} after {panics} panics"
                    );
                    break;
                }
            }
        }
        assert!(
            panics >= 3,
            "{algorithm:?}: only {panics} comparisons panicked"
        );
        assert_eq!(limiter.len(), 2, "{algorithm:?}");
        // Both keys are held, and a third is refused as the cap says.
        assert!(matches!(
            limiter.try_acquire(&TouchyEq(3)),
            Err(TryAcquireError::TooManyKeys { max_keys: 2 })
        ));
        limiter.clock().advance(Duration::from_secs(5));
        assert_eq!(limiter.sweep(), 2, "{algorithm:?}");
        assert_eq!(limiter.len(), 0, "{algorithm:?}");
    }
}

/// A reset whose key's `Eq` panics (in the lookup of the key to forget) leaves no reset
/// "running" behind it: a refund made after it still gives its permit back. (The count of
/// resets was left odd, as if a reset never ended, so every refund on the limiter was dropped
/// from then on, for every key.)
#[test]
fn a_reset_whose_key_panics_leaves_later_refunds_whole() {
    for algorithm in all_algorithms(1) {
        let limiter = touchy(algorithm, DEFAULT_MAX_KEYS);
        limiter.try_acquire(&TouchyEq(1)).unwrap();
        PANIC_ON_EQ.with(|c| c.set(1));
        let reset =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| limiter.reset(&TouchyEq(2))));
        PANIC_ON_EQ.with(|c| c.set(0));
        assert!(
            reset.is_err(),
            "{algorithm:?}: the comparison did not panic"
        );
        let taken = limiter.try_acquire_refundable(&TouchyEq(3), 1).unwrap();
        taken.refund();
        assert!(
            limiter.try_acquire(&TouchyEq(3)).is_ok(),
            "{algorithm:?}: the refund was dropped"
        );
        // Resets still work.
        assert!(limiter.reset(&TouchyEq(1)));
        assert!(limiter.try_acquire(&TouchyEq(1)).is_ok());
    }
}

/// A sweep that unwinds (a key's `Eq` panicking where the sweep asks whether an idle key has
/// waiters) leaves its shard to later sweeps: they evict its idle keys, and a new key at the cap
/// gets the room. (The shard's "being swept" flag stayed set, so every later sweep and search
/// for room skipped the shard for good: its idle keys held their slots, and new keys were
/// refused `TooManyKeys` though idle keys were there to evict.)
#[cfg(feature = "tokio")]
#[test]
fn a_sweep_that_unwinds_leaves_its_shard_to_later_sweeps() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let limiter = touchy(
        Algorithm::FixedWindow {
            limit: 1,
            window: SEC,
        },
        2,
    );
    // Key 1 exhausted, with a waiter (so a sweep asks about waiters); key 2 admitted.
    limiter.try_acquire(&TouchyEq(1)).unwrap();
    let mut waiter = Box::pin(limiter.acquire(&TouchyEq(1)));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(waiter.as_mut().poll(&mut cx).is_pending());
    limiter.try_acquire(&TouchyEq(2)).unwrap();
    limiter.clock().advance(2 * SEC);
    PANIC_ON_EQ.with(|c| c.set(1));
    let swept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| limiter.sweep()));
    PANIC_ON_EQ.with(|c| c.set(0));
    assert!(swept.is_err(), "the comparison did not panic");
    // Key 2 is idle and evicted now; key 1 has its waiter, and stays.
    assert_eq!(limiter.sweep(), 1);
    assert_eq!(limiter.len(), 1);
    assert!(limiter.try_acquire(&TouchyEq(3)).is_ok());
    assert!(waiter.as_mut().poll(&mut cx).is_ready());
}

/// Decisions across a reconfiguration, with keys evicted under the new parameters, match one
/// unkeyed limiter per key reconfigured alike: a key's state is kept through the change (a
/// shorter window's admissions that outlive it, a token bucket's debt translated to the new
/// epoch), and a key is evicted only once a fresh state would decide as its own would.
#[test]
fn decisions_across_a_reconfiguration_and_evictions_match_an_unkeyed_limiter() {
    let window = |limit, window| {
        [
            Algorithm::FixedWindow { limit, window },
            Algorithm::SlidingWindow { limit, window },
            Algorithm::SlidingCounter { limit, window },
        ]
    };
    let bucket = |per_second, burst| Algorithm::TokenBucket {
        rate: Rate::per_second(per_second),
        burst,
    };
    let mut pairs: Vec<(Algorithm, Algorithm)> = Vec::new();
    for (from, to) in window(3, SEC).into_iter().zip(window(2, SEC / 3)) {
        pairs.push((from, to));
    }
    for (from, to) in window(3, SEC).into_iter().zip(window(5, 3 * SEC)) {
        pairs.push((from, to));
    }
    pairs.push((bucket(3, 3), bucket(1, 2)));
    pairs.push((bucket(3, 3), bucket(10, 6)));
    for (from, to) in pairs {
        let mut evicted = 0;
        for (before_ms, step_ms) in [(0, 111), (300, 7), (950, 333), (950, 1000)] {
            let clock = ManualClock::new();
            // Room for the larger limit in an exact sliding window's rings.
            let keyed = KeyedLimiter::builder(from)
                .clock(clock.clone())
                .max_limit(5)
                .build()
                .unwrap();
            let single = turnstile::RateLimiter::builder(from)
                .clock(clock.clone())
                .max_limit(5)
                .build()
                .unwrap();
            clock.advance(Duration::from_millis(before_ms));
            for _ in 0..3 {
                assert_eq!(keyed.try_acquire(&1), single.try_acquire());
            }
            clock.advance(Duration::from_millis(step_ms));
            keyed.reconfigure(to).unwrap();
            single.reconfigure(to).unwrap();
            for i in 0..100 {
                clock.advance(Duration::from_millis(step_ms));
                keyed.sweep();
                // New keys, whose inserts sweep too.
                keyed.try_acquire(&(100 + i)).unwrap();
                let n = 1 + (i % 2) as u32;
                assert_eq!(
                    keyed.try_acquire_n(&1, n),
                    single.try_acquire_n(n),
                    "{from:?} -> {to:?}, {before_ms} ms then steps of {step_ms} ms, step {i}"
                );
            }
            evicted += keyed.stats().evicted;
        }
        assert!(evicted > 0, "{to:?}: nothing was evicted");
    }
}

/// A reset that unwinds out of its key's `Eq` after it has forgotten the key's state (in the
/// removal of the dead entry) still counts the key as reset, and no sweep counts it as evicted.
/// (The counts came after the removal, so such a key was forgotten and counted nowhere.)
#[test]
fn a_reset_that_unwinds_after_forgetting_still_counts_the_key() {
    for algorithm in all_algorithms(1) {
        let mut forgotten_by_an_unwind = 0;
        for nth in 1.. {
            let limiter = touchy(algorithm, DEFAULT_MAX_KEYS);
            limiter.try_acquire(&TouchyEq(1)).unwrap();
            PANIC_ON_EQ.with(|c| c.set(nth));
            let reset = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                limiter.reset(&TouchyEq(1))
            }));
            PANIC_ON_EQ.with(|c| c.set(0));
            let forgot = match reset {
                Ok(forgot) => {
                    assert!(forgot, "{algorithm:?}");
                    break;
                }
                // Limit 1, taken: the state was forgotten if the key has its permit back.
                Err(_) => limiter.available(&TouchyEq(1)) == 1,
            };
            forgotten_by_an_unwind += u32::from(forgot);
            let stats = limiter.stats();
            assert_eq!(
                stats.reset,
                u64::from(forgot),
                "{algorithm:?}, comparison {nth}"
            );
            assert_eq!(
                stats.keys,
                usize::from(!forgot),
                "{algorithm:?}, comparison {nth}"
            );
            limiter.clock().advance(Duration::from_secs(5));
            limiter.sweep();
            assert_eq!(
                limiter.stats().evicted,
                u64::from(!forgot),
                "{algorithm:?}, comparison {nth}"
            );
            assert!(limiter.is_empty(), "{algorithm:?}");
        }
        assert!(
            forgotten_by_an_unwind > 0,
            "{algorithm:?}: no unwind after forgetting"
        );
    }
}
