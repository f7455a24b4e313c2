//! Waiting on a `KeyedLimiter`: per-key fair queues on tokio's paused time (and blocking
//! threads), keys independent, no barging, cancel safety, and queues that exist only while a key
//! has waiters.

use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;
use tokio::time::Instant;
use turnstile::{
    AcquireError, Algorithm, KeyOverflow, KeyedLimiter, QueueOrder, Rate, TokioClock,
    TryAcquireError,
};

#[path = "common/wakers.rs"]
mod wakers;

#[path = "common/close_race.rs"]
mod close_race;
use close_race::waiters_racing_close;
use wakers::{Call, PollThenPanic, must_panic, panicky, poll_with};

#[path = "common/hook_clock.rs"]
mod hook_clock;
use hook_clock::HookClock;

type Limiter = KeyedLimiter<&'static str, TokioClock>;

fn bucket(per_second: u32, burst: u32) -> Arc<Limiter> {
    Arc::new(
        KeyedLimiter::with_clock(
            Algorithm::TokenBucket {
                rate: Rate::per_second(per_second),
                burst,
            },
            TokioClock::new(),
        )
        .unwrap(),
    )
}

/// Spawns `count` waiters on `key` one after another (each is queued before the next starts),
/// each recording its index and the time it was served.
async fn spawn_waiters(
    limiter: &Arc<Limiter>,
    key: &'static str,
    count: usize,
    start: Instant,
    served: &Arc<std::sync::Mutex<Vec<(usize, Duration)>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..count {
        let (limiter, served) = (Arc::clone(limiter), Arc::clone(served));
        tasks.push(tokio::spawn(async move {
            limiter.acquire(&key).await.unwrap();
            served.lock().unwrap().push((i, start.elapsed()));
        }));
        // Let the task run until it is queued.
        tokio::task::yield_now().await;
    }
    tasks
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn waiters_of_one_key_are_served_in_order_exactly_when_their_slot_frees() {
    let limiter = bucket(10, 1);
    let start = Instant::now();
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks = spawn_waiters(&limiter, "a", 200, start, &served).await;
    assert_eq!(
        limiter.stats().waiting,
        199,
        "the first is admitted at once"
    );
    for t in tasks {
        t.await.unwrap();
    }
    let served = served.lock().unwrap();
    for (k, &(i, at)) in served.iter().enumerate() {
        assert_eq!(i, k, "served out of order");
        assert_eq!(
            at,
            Duration::from_millis(100 * k as u64),
            "waiter {k} served late"
        );
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.admitted, stats.waiting, stats.waiting_keys),
        (200, 0, 0)
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn keys_do_not_wait_for_each_other() {
    let limiter = bucket(1, 1);
    let start = Instant::now();
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks = spawn_waiters(&limiter, "busy", 10, start, &served).await;
    assert_eq!(limiter.stats().waiting_keys, 1);
    // Another key is served at once, by `acquire` and by `try_acquire`.
    limiter.acquire(&"idle").await.unwrap();
    assert!(limiter.try_acquire(&"other").is_ok());
    assert_eq!(start.elapsed(), Duration::ZERO);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(start.elapsed(), Duration::from_secs(9));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_barging_past_a_keys_queue() {
    let limiter = bucket(10, 2);
    limiter.try_acquire_n(&"a", 2).unwrap();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire_n(&"a", 2).await })
    };
    tokio::task::yield_now().await;
    // 100 ms later one permit is free, but the queued waiter wants two: try_acquire must not
    // take it from them.
    tokio::time::advance(Duration::from_millis(100)).await;
    let refused = limiter.try_acquire(&"a").unwrap_err();
    assert!(matches!(refused, TryAcquireError::Rejected(_)), "{refused}");
    assert!(
        limiter.try_acquire(&"b").is_ok(),
        "another key is not held back"
    );
    waiter.await.unwrap().unwrap();
    assert_eq!(limiter.stats().waiting_keys, 0);
    // With nobody queued, try_acquire on the key works again.
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(limiter.try_acquire(&"a").is_ok());
}

/// As for an unkeyed limiter: a `try_acquire` that a key's waiters hold back says when the
/// key's state could admit the queue's permits and its own together, per algorithm, not 0
/// ("retry now") because the state alone had one permit. Other keys are not counted.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rejection_behind_a_keys_waiters_counts_their_permits() {
    let window = Duration::from_secs(1);
    for algorithm in [
        Algorithm::FixedWindow { limit: 3, window },
        Algorithm::SlidingWindow { limit: 3, window },
        Algorithm::SlidingCounter { limit: 3, window },
        Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 3,
        },
    ] {
        let limiter: Arc<Limiter> =
            Arc::new(KeyedLimiter::with_clock(algorithm, TokioClock::new()).unwrap());
        // The key's history on another key without waiters: what it says for 2 + 1 permits.
        limiter.try_acquire_n(&"a", 2).unwrap();
        limiter.try_acquire_n(&"alone", 2).unwrap();
        let expected = limiter
            .try_acquire_n(&"alone", 3)
            .unwrap_err()
            .rejection()
            .unwrap()
            .retry_after();
        // One permit is free on "a", but a waiter for two is queued first.
        let waiter = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.acquire_n(&"a", 2).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(limiter.stats().waiting, 1, "{algorithm:?}");
        for n in [1, 0] {
            let rejection = limiter
                .try_acquire_n(&"a", n)
                .unwrap_err()
                .rejection()
                .copied()
                .unwrap_or_else(|| panic!("{algorithm:?}: not a rejection"));
            assert_eq!(rejection.retry_after(), expected, "{algorithm:?}, n = {n}");
            assert_eq!(rejection.limit(), 3, "{algorithm:?}");
        }
        let concrete = match algorithm {
            Algorithm::FixedWindow { .. } | Algorithm::SlidingWindow { .. } => Some(window),
            Algorithm::TokenBucket { .. } => Some(Duration::from_millis(200)),
            _ => None,
        };
        if let Some(concrete) = concrete {
            assert_eq!(expected, concrete, "{algorithm:?}");
        }
        assert!(expected > Duration::ZERO, "{algorithm:?}");
        // Another key's queue is not this one's: a fresh key is admitted.
        assert!(limiter.try_acquire_n(&"b", 3).is_ok(), "{algorithm:?}");
        waiter.await.unwrap().unwrap();
    }
}

/// The sliding counter's bound behind a key's waiters: the start of the window after the
/// head's when that is earlier than all of the permits at once (see the unkeyed test in
/// `tests/waiting.rs`), and never later than the call's admission.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn behind_a_keys_waiters_a_sliding_counters_retry_after_stays_a_lower_bound() {
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::with_clock(
            Algorithm::SlidingCounter {
                limit: 10,
                window: Duration::from_secs(1),
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    limiter.try_acquire_n(&"a", 6).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    limiter.try_acquire_n(&"a", 4).unwrap();
    let spawn = |n| {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire_n(&"a", n).await.map(|a| a.at()) })
    };
    let head = spawn(3);
    tokio::task::yield_now().await;
    let retry = limiter
        .try_acquire_n(&"a", 4)
        .unwrap_err()
        .rejection()
        .unwrap()
        .retry_after();
    let behind = spawn(4);
    tokio::task::yield_now().await;
    assert_eq!(head.await.unwrap().unwrap(), Duration::from_millis(1500));
    let admitted = behind.await.unwrap().unwrap();
    assert_eq!(retry, Duration::from_secs(1));
    assert!(Duration::from_secs(1) + retry <= admitted, "{admitted:?}");
}

/// A call for a key served by the shared overflow cell, held back by that key's waiter, is
/// counted once in `overflowed`, though the sliding counter's bound checks the cell twice.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_held_back_call_at_the_key_cap_counts_as_overflowed_once() {
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(Algorithm::SlidingCounter {
            limit: 3,
            window: Duration::from_secs(1),
        })
        .clock(TokioClock::new())
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap(),
    );
    limiter.try_acquire(&"x").unwrap(); // the only key slot, busy for its window
    limiter.try_acquire_n(&"a", 2).unwrap(); // the shared cell
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire_n(&"a", 2).await })
    };
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 1);
    let before = limiter.stats().overflowed;
    let refused = limiter.try_acquire(&"a").unwrap_err();
    assert!(refused.rejection().unwrap().retry_after() > Duration::ZERO);
    assert_eq!(limiter.stats().overflowed, before + 1);
    waiter.await.unwrap().unwrap();
}

/// A key's queued probe takes nothing, and beyond the capacity the token bucket's refill says
/// when the rest fits.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rejection_behind_a_keys_waiters_counts_what_they_take_even_beyond_the_capacity() {
    // 10 tokens a second, burst 5; 4 taken: 1 token left, one more every 100 ms.
    let limiter = bucket(10, 5);
    limiter.try_acquire_n(&"a", 4).unwrap();
    let spawn = |n| {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire_n(&"a", n).await.map(|a| a.at()) })
    };
    let two = spawn(2);
    tokio::task::yield_now().await;
    let probe = spawn(0);
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 2);
    let retry = |n| {
        limiter
            .try_acquire_n(&"a", n)
            .unwrap_err()
            .rejection()
            .unwrap()
            .retry_after()
    };
    let ms = Duration::from_millis;
    assert_eq!(retry(1), ms(200));
    assert_eq!(retry(0), ms(200));
    assert_eq!(retry(3), ms(400));
    let three = spawn(3);
    tokio::task::yield_now().await;
    assert_eq!(retry(1), ms(500));
    assert_eq!(two.await.unwrap().unwrap(), ms(100));
    assert_eq!(probe.await.unwrap().unwrap(), ms(200));
    assert_eq!(three.await.unwrap().unwrap(), ms(400));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn cancelled_waiters_leave_no_trace() {
    let limiter = bucket(100, 1);
    limiter.try_acquire(&"a").unwrap();
    // Calls made: a task aborted before its first poll makes none.
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let mut handles = Vec::new();
    for i in 0..1_000u64 {
        let (limiter, calls) = (Arc::clone(&limiter), Arc::clone(&calls));
        handles.push(tokio::spawn(async move {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Timeouts from 0 to 99 ms: many give up, some are served.
            limiter
                .acquire_timeout(&"a", 1, Duration::from_millis(i % 100))
                .await
                .is_ok()
        }));
    }
    // Let every task make its call and queue up, then abort a few while they wait.
    tokio::task::yield_now().await;
    for h in handles.iter().step_by(7) {
        h.abort();
    }
    let mut served = 0;
    for h in handles {
        if let Ok(true) = h.await {
            served += 1;
        }
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.waiting, stats.queued_permits, stats.waiting_keys),
        (0, 0, 0)
    );
    let calls = calls.load(std::sync::atomic::Ordering::Relaxed);
    assert!(calls > 500, "only {calls} tasks ran");
    assert_eq!(stats.admitted + stats.rejected + stats.cancelled, calls);
    assert_eq!(stats.admitted, served + 1);
    assert!(stats.cancelled > 500, "cancelled {}", stats.cancelled);
    // The key's queue is gone and its permits are all there: the next acquire is immediate
    // once the bucket has refilled.
    tokio::time::advance(Duration::from_millis(10)).await;
    let before = Instant::now();
    limiter.acquire(&"a").await.unwrap();
    assert_eq!(before.elapsed(), Duration::ZERO);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_key_has_its_own_bounded_queue() {
    let limiter = Arc::new(
        KeyedLimiter::<&'static str, _>::builder(Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(1),
        })
        .clock(TokioClock::new())
        .queue_limit(2)
        .build()
        .unwrap(),
    );
    limiter.try_acquire(&"a").unwrap();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let limiter = Arc::clone(&limiter);
        waiters.push(tokio::spawn(async move { limiter.acquire(&"a").await }));
        tokio::task::yield_now().await;
    }
    assert_eq!(
        limiter.acquire(&"a").await.unwrap_err(),
        AcquireError::QueueFull {
            requested: 1,
            queue_limit: 2
        }
    );
    // Key "b" has a queue of its own.
    limiter.try_acquire(&"b").unwrap();
    let b = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire(&"b").await })
    };
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting_keys, 2);
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    b.await.unwrap().unwrap();
    assert_eq!(limiter.stats().waiting_keys, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn impossible_requests_fail_at_once() {
    let limiter = Arc::new(
        KeyedLimiter::<&'static str, _>::builder(Algorithm::FixedWindow {
            limit: 3,
            window: Duration::from_secs(1),
        })
        .clock(TokioClock::new())
        .max_keys(1)
        .overflow(KeyOverflow::Reject)
        .build()
        .unwrap(),
    );
    assert_eq!(
        limiter.acquire_n(&"a", 4).await.unwrap_err(),
        AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }
    );
    limiter.acquire(&"a").await.unwrap();
    assert_eq!(
        limiter.acquire(&"b").await.unwrap_err(),
        AcquireError::TooManyKeys { max_keys: 1 }
    );
    assert_eq!(
        AcquireError::TooManyKeys { max_keys: 1 }.to_string(),
        "the limiter already tracks its maximum of 1 keys and none is idle"
    );
    // A probe waits for nothing and consumes nothing.
    limiter.acquire_n(&"a", 0).await.unwrap();
    assert_eq!(limiter.available(&"a"), 2);
}

#[test]
fn blocking_waiters_share_the_keys_queue() {
    let limiter = Arc::new(
        KeyedLimiter::<u32, _>::with_clock(
            Algorithm::FixedWindow {
                limit: 2,
                window: Duration::from_millis(20),
            },
            turnstile::MonotonicClock::new(),
        )
        .unwrap(),
    );
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || {
                let mut times = Vec::new();
                for _ in 0..5 {
                    times.push(limiter.acquire_blocking(&9).unwrap().at_nanos());
                }
                times
            })
        })
        .collect();
    let mut times: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    times.sort_unstable();
    let window = 20_000_000;
    let mut per_window = std::collections::HashMap::new();
    for t in &times {
        *per_window.entry(t / window).or_insert(0) += 1;
    }
    assert!(per_window.values().all(|&c| c <= 2), "{per_window:?}");
    assert_eq!(times.len(), 20);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.waiting_keys), (20, 0));
}

/// Real threads, real time: tasks on a multi-thread runtime wait on four keys, give up at random
/// (timeouts, aborts), and the keys' queues come and go under them. Afterwards the books balance,
/// no queue is left, and no key ever admitted more than its limit per window.
#[test]
fn keyed_waiting_survives_cancellation_on_real_threads() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_time()
        .build()
        .unwrap();
    let window = Duration::from_millis(2);
    let limiter = Arc::new(
        KeyedLimiter::<u8, _>::with_clock(
            Algorithm::FixedWindow { limit: 3, window },
            turnstile::MonotonicClock::new(),
        )
        .unwrap(),
    );
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let admitted: Vec<(u8, u64, u32)> = runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..4_000u64 {
            let (limiter, calls) = (Arc::clone(&limiter), Arc::clone(&calls));
            let key = (i % 4) as u8;
            tasks.push(tokio::spawn(async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let timeout = Duration::from_micros(500 + (i * 7919) % 20_000);
                let n = 1 + (i % 2) as u32;
                limiter
                    .acquire_timeout(&key, n, timeout)
                    .await
                    .ok()
                    .map(|a| (key, a.at_nanos(), n))
            }));
            if i % 50 == 0 {
                tokio::task::yield_now().await;
            }
        }
        for t in tasks.iter().skip(3).step_by(11) {
            t.abort();
        }
        let mut admitted = Vec::new();
        for t in tasks {
            if let Ok(Some(a)) = t.await {
                admitted.push(a);
            }
        }
        admitted
    });
    let stats = limiter.stats();
    let calls = calls.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(stats.admitted + stats.rejected + stats.cancelled, calls);
    assert_eq!((stats.waiting, stats.waiting_keys), (0, 0), "{stats:?}");
    // How many are served or time out depends on how fast this machine runs the tasks; both
    // must happen for the test to mean anything.
    assert!(stats.cancelled > 0, "no cancellation: {stats:?}");
    assert!(!admitted.is_empty(), "nothing admitted: {stats:?}");
    // Permits per key and window: at most the limit, 3.
    let w = window.as_nanos() as u64;
    let mut per_window = std::collections::HashMap::new();
    for (key, at, n) in &admitted {
        *per_window.entry((*key, at / w)).or_insert(0u32) += n;
    }
    assert!(
        per_window.values().all(|&c| c <= 3),
        "a key admitted more than its limit in one window"
    );
}

/// Newest first, the key's queue full: a newcomer whose permits are there now is admitted at
/// once, as `try_acquire` would be. Joining the queue first failed the oldest waiter with
/// `QueueFull` to make room for a caller that then never waited.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn newest_first_acquire_that_fits_now_does_not_evict_a_queued_waiter() {
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 5,
        })
        .clock(TokioClock::new())
        .queue_order(QueueOrder::NewestFirst)
        .queue_limit(5)
        .build()
        .unwrap(),
    );
    let start = Instant::now();
    limiter.try_acquire_n(&"a", 5).unwrap();
    let big = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire_n(&"a", 5).await.map(|a| a.at()) })
    };
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().queued_permits, 5, "the key's queue is full");
    tokio::time::sleep(Duration::from_millis(2500)).await; // two tokens have accrued

    let async_one = limiter.acquire_n(&"a", 1).await.unwrap();
    let blocking_one = limiter.acquire_blocking_n(&"a", 1).unwrap();
    assert_eq!(
        (async_one.at(), blocking_one.at()),
        (Duration::from_millis(2500), Duration::from_millis(2500))
    );
    tokio::task::yield_now().await;
    assert!(!big.is_finished(), "the queued waiter was failed");
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.rejected), (1, 0), "{stats:?}");

    // The queued waiter is still served, once five tokens have accrued after the two taken.
    assert_eq!(big.await.unwrap(), Ok(Duration::from_secs(7)));
    assert_eq!(start.elapsed(), Duration::from_secs(7));
    assert_eq!(limiter.stats().admitted, 4);
}

/// A waiter on a key that `reset` forgets is served at once, not when the forgotten state
/// would have let it in (an hour later here). Paused time does not move while this task keeps
/// yielding, so the waiter can only have been served by the reset's wake-up.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn reset_serves_the_keys_waiter_at_once() {
    let limiter = Arc::new(
        KeyedLimiter::with_clock(
            Algorithm::FixedWindow {
                limit: 1,
                window: Duration::from_secs(3600),
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    limiter.try_acquire(&"a").unwrap();
    let start = Instant::now();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire(&"a").await.map(|_| start.elapsed()) })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(limiter.stats().waiting, 1);
    assert!(limiter.reset(&"a"));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        waiter.is_finished(),
        "the waiter still sleeps after the reset"
    );
    assert_eq!(waiter.await.unwrap().unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.available(&"a"),
        0,
        "the waiter took the fresh permit"
    );
}

/// A served head whose wake-up of the next waiter panics gives its admission back to the key.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panicking_waker_of_the_next_waiter_does_not_cost_the_served_head_its_admission() {
    let limiter = bucket(1, 1);
    limiter.try_acquire(&"k").unwrap();
    let mut head = Box::pin(limiter.acquire(&"k"));
    let mut next = Box::pin(limiter.acquire(&"k"));
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(next.as_mut(), &panicky()).is_pending());
    tokio::time::advance(Duration::from_secs(1)).await;
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop((head, next));
    assert_eq!(
        limiter.available(&"k"),
        1,
        "the admission went down with the panic"
    );
    assert!(limiter.try_acquire(&"k").is_ok());
}

/// A served head whose admission came from the shared overflow cell, and whose wake-up of the
/// next waiter panics, gives the admission back to that cell: a head of *another* overflow key
/// that looked at the cell in between (here from inside the panicking `Waker`, as a thread of
/// its own could) and went to sleep until its timer is woken, to be served at once. Before, the
/// give-back woke nobody: it slept out the cell's whole `retry_after` with the permit free.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_served_overflow_heads_give_back_after_a_waker_panic_wakes_other_keys_heads() {
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(Algorithm::TokenBucket {
            rate: Rate::new(1, Duration::from_secs(10)),
            burst: 2,
        })
        .clock(TokioClock::new())
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap(),
    );
    limiter.try_acquire_n(&"x", 2).unwrap(); // the only key slot, not idle for 20 s
    limiter.try_acquire_n(&"o", 2).unwrap(); // the shared cell: one permit back in 10 s
    let (woken, other_waker) = wakers::counting();
    let other: Call<_> = {
        let limiter = Arc::clone(&limiter);
        Box::pin(async move { limiter.acquire(&"c").await.map(|a| a.at()) })
    };
    let hook = PollThenPanic::new(other, other_waker);
    let mut head = Box::pin(limiter.acquire(&"b"));
    let mut next = Box::pin(limiter.acquire(&"b"));
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(next.as_mut(), &Waker::from(Arc::clone(&hook))).is_pending());
    tokio::time::advance(Duration::from_secs(10)).await;
    // `head` takes the cell's permit; waking `next` lets "c" look (nothing free until 20 s) and
    // panics; `head` gives the permit back.
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop((head, next));
    assert_eq!(
        woken.wakes(),
        1,
        "the head of \"c\" sleeps until 20 s with the shared permit free"
    );
    let served = hook.poll(Waker::noop());
    assert!(
        matches!(served, std::task::Poll::Ready(Ok(at)) if at == Duration::from_secs(10)),
        "{served:?}"
    );
}

/// A served head whose wake-up of the next waiter panics gives its admission back; a
/// `KeyedChain` caller for the same key that looked in between (from inside the panicking
/// `Waker`) and went to sleep until the next window is told, as a chain refund tells it, and
/// admitted after its backoff. Before, the give-back told no chain caller: it slept out the
/// window with the permit free.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_served_heads_give_back_after_a_waker_panic_wakes_the_chain_callers() {
    let window = Duration::from_secs(10);
    let fixed = |limit| {
        KeyedLimiter::builder(Algorithm::FixedWindow { limit, window })
            .clock(TokioClock::new())
            .build()
            .unwrap()
    };
    let limiter: Limiter = fixed(1);
    let chain = turnstile::KeyedChain::builder()
        .per_key(fixed(100))
        .per_key(limiter.clone())
        .build()
        .unwrap();
    limiter.try_acquire(&"k").unwrap();
    let caller: Call<_> = Box::pin(async move { chain.acquire(&"k").await.map(|a| a.at()) });
    let served = wakers::give_back_after_a_handover_panic(
        limiter.acquire(&"k"),
        limiter.acquire(&"k"),
        caller,
        window,
    )
    .await;
    assert!(
        matches!(served, std::task::Poll::Ready(Ok(at)) if at == window + Duration::from_millis(1)),
        "{served:?}: the chain caller sleeps until 20 s with the permit free"
    );
}

/// A waiter evicted to make room (newest first) and dropped before it looks again was failed by
/// the limiter: it counts as rejected, not as a wait given up.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_evicted_waiter_dropped_unseen_counts_as_rejected() {
    let limiter: Limiter = KeyedLimiter::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 1,
    })
    .clock(TokioClock::new())
    .queue_order(QueueOrder::NewestFirst)
    .queue_limit(1)
    .build()
    .unwrap();
    limiter.try_acquire(&"k").unwrap();
    let mut evicted = Box::pin(limiter.acquire(&"k"));
    let mut newest = Box::pin(limiter.acquire(&"k"));
    assert!(poll_with(evicted.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(newest.as_mut(), Waker::noop()).is_pending());
    drop((evicted, newest));
    let stats = limiter.stats();
    // `newest` gave up its wait; `evicted` was failed with `QueueFull` before it was dropped.
    assert_eq!((stats.admitted, stats.rejected, stats.cancelled), (1, 1, 1));
}

/// A caller checks `n` against the limit in its fast path, without the key's queue's mutex. Here
/// `reconfigure` lowers the limit (2 → 1) right after that check, at the clock reading of the
/// call's fast path (a `HookClock`), and a head joins the key's queue just before: the sweep
/// finds nothing too big, and the call (for 2) then joins the queue behind the head. It must fail
/// `InsufficientCapacity` at once: the request can never fit. Before the enqueue read the limit
/// under the queue's mutex it waited behind the head, which waits for a window that never comes
/// (the clock does not move), so for good.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_a_racing_lowering_makes_too_big_fails_at_once_behind_a_head() {
    type Hooked = KeyedLimiter<&'static str, HookClock>;
    type Head = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
    let clock = HookClock::default();
    let fixed = |limit| Algorithm::FixedWindow {
        limit,
        window: Duration::from_secs(1),
    };
    let limiter: Arc<Hooked> = Arc::new(KeyedLimiter::with_clock(fixed(2), clock.clone()).unwrap());
    limiter.try_acquire_n(&"k", 2).unwrap();
    let head: Arc<std::sync::Mutex<Option<Head>>> = Arc::default();
    {
        let (limiter, head) = (Arc::clone(&limiter), Arc::clone(&head));
        clock.arm(
            1,
            Box::new(move || {
                let waiting = Arc::clone(&limiter);
                let mut queued: Head = Box::pin(async move {
                    let _ = waiting.acquire(&"k").await;
                });
                assert!(poll_with(queued.as_mut(), Waker::noop()).is_pending());
                *head.lock().unwrap() = Some(queued);
                limiter.reconfigure(fixed(1)).unwrap();
            }),
        );
    }
    let outcome = tokio::time::timeout(Duration::from_secs(60), limiter.acquire_n(&"k", 2)).await;
    assert!(clock.disarm(), "the hook did not run");
    assert_eq!(
        outcome.map(|o| o.map(|a| a.remaining())),
        Ok(Err(AcquireError::InsufficientCapacity {
            requested: 2,
            capacity: 1
        })),
        "a request that can never fit waited behind the head"
    );
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.queued_permits), (1, 1), "{stats:?}");
    drop(head.lock().unwrap().take());
    assert_eq!(limiter.stats().waiting_keys, 0);
}

/// A call for a key served by the shared overflow cell, held back by that key's waiter while
/// the cell already has room for the waiter's permits and its own (the waiter's timer has not
/// run yet), is a call that found the cap reached: counted in `overflowed`, as the same call
/// refused by the cell is.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_held_back_call_at_the_key_cap_counts_as_overflowed_when_the_cell_has_room() {
    let clock = HookClock::default();
    let limiter = Arc::new(
        KeyedLimiter::builder(Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 3,
        })
        .clock(clock.clone())
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap(),
    );
    limiter.try_acquire_n(&"x", 3).unwrap(); // the only key slot, busy for 300 ms
    limiter.try_acquire_n(&"a", 3).unwrap(); // the shared cell, empty
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.acquire(&"a").await })
    };
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 1);
    // 200 ms on the limiter's clock: the cell holds 2 tokens, "x" is still busy; the waiter's
    // timer (tokio's, paused) has not run.
    clock.advance(200_000_000);
    let before = limiter.stats().overflowed;
    let refused = limiter.try_acquire(&"a").unwrap_err();
    assert_eq!(refused.rejection().unwrap().retry_after(), Duration::ZERO);
    assert_eq!(limiter.stats().overflowed, before + 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    waiter.await.unwrap().unwrap();
}

/// A served head whose handover unwinds gives its admission back; the key's next waiter, which
/// looked in between (from inside its own `Waker`, as its task polled on another thread could,
/// before that `Waker` panicked) and went to sleep until the next window, is woken by the
/// give-back and admitted at once. Before, the give-back woke only chain callers (and, for the
/// shared overflow cell, other keys' heads): the key's own next head slept out the window with
/// the permit free.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_served_heads_give_back_after_a_waker_panic_wakes_the_keys_next_head() {
    let window = Duration::from_secs(10);
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(Algorithm::FixedWindow { limit: 1, window })
            .clock(TokioClock::new())
            .build()
            .unwrap(),
    );
    limiter.try_acquire(&"k").unwrap();
    let mut head = Box::pin(limiter.acquire(&"k"));
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    let next: Call<_> = {
        let limiter = Arc::clone(&limiter);
        Box::pin(async move { limiter.acquire(&"k").await.map(|a| a.at()) })
    };
    let (woken, next_waker) = wakers::counting();
    let hook = PollThenPanic::new(next, next_waker);
    assert!(hook.poll(&Waker::from(Arc::clone(&hook))).is_pending());
    tokio::time::advance(window).await;
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop(head);
    assert_eq!(
        woken.wakes(),
        1,
        "the key's next head sleeps until 20 s with the permit free"
    );
    let served = hook.poll(Waker::noop());
    assert!(
        matches!(served, std::task::Poll::Ready(Ok(at)) if at == window),
        "{served:?}"
    );
}

/// A reset that forgets a key frees room under the key cap, as a sweep does: the head of a key
/// past the cap, waiting on the shared overflow cell, is woken and served at once on a cell of
/// its own. Before, the reset woke only its own key's head (and chain callers).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_reset_that_frees_room_under_the_key_cap_wakes_an_overflow_keys_head() {
    let window = Duration::from_secs(10);
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(Algorithm::SlidingWindow { limit: 1, window })
            .clock(TokioClock::new())
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap(),
    );
    limiter.try_acquire(&"x").unwrap(); // the only key slot
    limiter.try_acquire(&"o").unwrap(); // the shared cell, full until 10 s
    let (woken, waker) = wakers::counting();
    let mut head = Box::pin(limiter.acquire(&"b"));
    assert!(poll_with(head.as_mut(), &waker).is_pending());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(limiter.reset(&"x"));
    assert_eq!(
        woken.wakes(),
        1,
        "the head sleeps until 10 s with room for its key"
    );
    let served = poll_with(head.as_mut(), &waker);
    assert!(
        matches!(&served, std::task::Poll::Ready(Ok(a)) if a.at() == Duration::from_secs(1)),
        "{served:?}"
    );
}

/// A review probe, kept: `random_waits_match_a_sequential_model_of_the_queue` (tests/waiting.rs)
/// on a keyed limiter, over three keys whose queues come and go (and whose cells sweeps evict):
/// per key, nobody barges past a waiter under
/// oldest-first, queued waiters are admitted in arrival order, `QueueFull` comes exactly when the
/// key's room is spent, a waiter the limit no longer fits fails at once, and no head sleeps while
/// its permits are free; every waiter ends once time runs on.
#[tokio::test(start_paused = true)]
async fn random_keyed_waits_match_a_sequential_model_of_the_queues() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    use turnstile::Admission;
    type Fut = Pin<Box<dyn Future<Output = Result<Admission, AcquireError>> + Send>>;
    struct Pending {
        id: usize,
        key: &'static str,
        n: u32,
        fut: Fut,
        counter: Arc<wakers::Counter>,
        waker: Waker,
        seen: usize,
    }
    static KEYS: [&str; 3] = ["a", "b", "c"];
    const MS: Duration = Duration::from_millis(1);
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % bound
    };
    let window = Duration::from_millis(10);
    let algorithm = |kind: u64, limit: u32| match kind {
        0 => Algorithm::FixedWindow { limit, window },
        1 => Algorithm::SlidingWindow { limit, window },
        2 => Algorithm::SlidingCounter { limit, window },
        _ => Algorithm::TokenBucket {
            rate: Rate::new(1, MS * 4),
            burst: limit,
        },
    };
    for order in [QueueOrder::OldestFirst, QueueOrder::NewestFirst] {
        for round in 0..40 {
            let kind = round % 4;
            let limiter: &'static Limiter = Box::leak(Box::new(
                KeyedLimiter::builder(algorithm(kind, 3))
                    .max_limit(4)
                    .clock(TokioClock::new())
                    .queue_order(order)
                    .queue_limit(5)
                    .build()
                    .unwrap(),
            ));
            let mut capacity = 3u32;
            let mut queue: Vec<Pending> = Vec::new();
            let mut served: Vec<(&str, usize)> = Vec::new();
            let mut ids = 0usize;
            let drain = |queue: &mut Vec<Pending>, served: &mut Vec<(&str, usize)>, cap: u32| loop {
                let mut any = false;
                let mut i = 0;
                while i < queue.len() {
                    let p = &mut queue[i];
                    if p.counter.wakes() == p.seen {
                        i += 1;
                        continue;
                    }
                    any = true;
                    p.seen = p.counter.wakes();
                    match poll_with(p.fut.as_mut(), &p.waker.clone()) {
                        Poll::Pending => i += 1,
                        Poll::Ready(outcome) => {
                            let p = queue.remove(i);
                            match outcome {
                                Ok(_) => served.push((p.key, p.id)),
                                Err(AcquireError::InsufficientCapacity { requested, .. }) => {
                                    assert!(requested > cap, "{requested} fits {cap}")
                                }
                                Err(AcquireError::QueueFull { .. }) => {
                                    assert_eq!(order, QueueOrder::NewestFirst, "evicted")
                                }
                                Err(other) => panic!("unexpected {other:?}"),
                            }
                        }
                    }
                }
                if !any {
                    break;
                }
            };
            let room = |queue: &[Pending], key: &str| -> u64 {
                queue
                    .iter()
                    .filter(|p| p.key == key)
                    .map(|p| u64::from(p.n.max(1)))
                    .sum()
            };
            for _step in 0..40 {
                let key_ref: &'static &'static str = &KEYS[next(3) as usize];
                let key = *key_ref;
                match next(10) {
                    0..=3 => {
                        let n = next(5) as u32;
                        let (counter, waker) = wakers::counting();
                        let mut fut: Fut = Box::pin(limiter.acquire_n(key_ref, n));
                        let taken = room(&queue, key);
                        let was_queued = taken > 0;
                        match poll_with(fut.as_mut(), &waker) {
                            Poll::Ready(Ok(_)) => assert!(
                                !was_queued || order == QueueOrder::NewestFirst,
                                "a newcomer barged past {key}'s waiters"
                            ),
                            Poll::Ready(Err(AcquireError::InsufficientCapacity { .. })) => {
                                assert!(n > capacity)
                            }
                            Poll::Ready(Err(AcquireError::QueueFull { .. })) => {
                                assert!(n <= capacity);
                                assert_eq!(order, QueueOrder::OldestFirst);
                                assert!(taken + u64::from(n.max(1)) > 5);
                            }
                            Poll::Ready(Err(other)) => panic!("unexpected {other:?}"),
                            Poll::Pending => {
                                assert!(n <= capacity);
                                if order == QueueOrder::OldestFirst {
                                    assert!(taken + u64::from(n.max(1)) <= 5);
                                }
                                ids += 1;
                                queue.push(Pending {
                                    id: ids,
                                    key,
                                    n,
                                    fut,
                                    counter,
                                    waker,
                                    seen: 0,
                                });
                            }
                        }
                    }
                    4 if !queue.is_empty() => {
                        let i = next(queue.len() as u64) as usize;
                        drop(queue.remove(i));
                    }
                    5 => {
                        let n = next(4) as u32;
                        let outcome = limiter.try_acquire_n(&key, n);
                        if order == QueueOrder::OldestFirst && room(&queue, key) > 0 {
                            assert!(outcome.is_err(), "try_acquire barged past {key}'s waiters");
                        }
                    }
                    6 => {
                        capacity = 1 + next(4) as u32;
                        limiter.reconfigure(algorithm(kind, capacity)).unwrap();
                    }
                    7 => {
                        limiter.sweep();
                    }
                    _ => tokio::time::advance(MS * (next(12) as u32)).await,
                }
                drain(&mut queue, &mut served, capacity);
                assert!(
                    queue.iter().all(|p| p.n <= capacity),
                    "a waiter no longer fits"
                );
                for key in KEYS {
                    let mine: Vec<&Pending> = queue.iter().filter(|p| p.key == key).collect();
                    let head = match order {
                        QueueOrder::OldestFirst => mine.first(),
                        _ => mine.last(),
                    }
                    .map(|p| (p.id, p.n.max(1)));
                    if let Some((id, need)) = head
                        && limiter.available(&key) >= need
                    {
                        tokio::time::advance(MS).await;
                        drain(&mut queue, &mut served, capacity);
                        assert!(
                            queue.iter().all(|p| p.id != id),
                            "{key}'s head slept with its permits free"
                        );
                    }
                    if order == QueueOrder::OldestFirst {
                        let ids: Vec<usize> = served
                            .iter()
                            .filter(|(k, _)| *k == key)
                            .map(|(_, id)| *id)
                            .collect();
                        let mut sorted = ids.clone();
                        sorted.sort_unstable();
                        assert_eq!(ids, sorted, "{key}'s waiters served out of arrival order");
                    }
                }
                let stats = limiter.stats();
                assert_eq!(stats.waiting, queue.len());
                assert_eq!(
                    stats.queued_permits,
                    queue.iter().map(|p| u64::from(p.n.max(1))).sum::<u64>()
                );
            }
            for _ in 0..(queue.len() * 2 + 2) {
                tokio::time::advance(window).await;
                drain(&mut queue, &mut served, capacity);
            }
            assert!(queue.is_empty(), "{} waiters never woke", queue.len());
            assert_eq!(limiter.stats().waiting, 0);
            assert_eq!(limiter.stats().waiting_keys, 0);
        }
    }
}

/// At the key cap, the head of a new key refused by the shared overflow cell sleeps no later than
/// when a held key turns idle, as a `try_acquire`'s retry-after says: it then evicts that key and
/// is served on a cell of its own. Before, the head's attempt (a commit, which reports the
/// cell's decision inside its outcome) skipped that bound, and the head slept until the shared
/// cell's own wait ended, here 5 ms later.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn at_the_cap_a_head_refused_by_the_shared_cell_wakes_when_a_held_key_turns_idle() {
    let ms = Duration::from_millis(1);
    let window = ms * 10;
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(Algorithm::SlidingWindow { limit: 3, window })
            .clock(TokioClock::new())
            .max_keys(2)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap(),
    );
    let start = Instant::now();
    limiter.try_acquire_n(&"c", 3).unwrap(); // both slots, idle at 10 ms
    limiter.try_acquire_n(&"b", 2).unwrap();
    tokio::time::advance(ms * 5).await;
    limiter.try_acquire_n(&"a", 3).unwrap(); // the shared cell, full until 15 ms
    let told = limiter.try_acquire(&"a").unwrap_err();
    assert_eq!(told.rejection().unwrap().retry_after(), ms * 5);
    let (woken, waker) = wakers::counting();
    let mut head = Box::pin(limiter.acquire(&"a"));
    assert!(poll_with(head.as_mut(), &waker).is_pending());
    tokio::time::advance(ms * 5).await;
    assert_eq!(woken.wakes(), 1, "the head sleeps until 15 ms");
    let served = poll_with(head.as_mut(), &waker);
    assert!(
        matches!(&served, std::task::Poll::Ready(Ok(a)) if a.at() == window && a.remaining() == 2),
        "{served:?}: served at 10 ms, on a cell of its own"
    );
    assert_eq!(start.elapsed(), window);
}

/// `close` ends every key's waiters at once with `Closed` (three waiters on two keys; the
/// clock does not move), in either queue order, and every later call fails at once:
/// `try_acquire`, `acquire`, `acquire_blocking`, `charge`, a refundable one. What the keys
/// hold stays (`available`), a refund of an admission made before still gives back, and the
/// books balance: each failed call is one rejection, and
/// no queue is left.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn close_fails_every_keys_waiters_and_every_later_call() {
    for order in [QueueOrder::OldestFirst, QueueOrder::NewestFirst] {
        let limiter: Arc<Limiter> = Arc::new(
            KeyedLimiter::builder(Algorithm::TokenBucket {
                rate: Rate::per_second(1),
                burst: 2,
            })
            .clock(TokioClock::new())
            .queue_order(order)
            .build()
            .unwrap(),
        );
        limiter.try_acquire_n(&"a", 2).unwrap();
        limiter.try_acquire_n(&"b", 2).unwrap();
        let receipt = limiter.try_acquire_refundable(&"d", 1).unwrap();
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (key, n) in [("a", 1), ("a", 2), ("b", 1)] {
            let limiter = Arc::clone(&limiter);
            tasks.push(tokio::spawn(async move {
                limiter.acquire_n(&key, n).await.map(|_| ())
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(limiter.stats().waiting, 3, "{order:?}");
        assert!(!limiter.is_closed());
        limiter.close();
        limiter.close();
        assert!(limiter.is_closed());
        for task in tasks {
            assert_eq!(task.await.unwrap(), Err(AcquireError::Closed), "{order:?}");
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "{order:?}");
        assert_eq!(limiter.try_acquire(&"c"), Err(TryAcquireError::Closed));
        assert_eq!(limiter.acquire(&"c").await, Err(AcquireError::Closed));
        assert_eq!(limiter.acquire(&"a").await, Err(AcquireError::Closed));
        assert_eq!(limiter.acquire_blocking(&"c"), Err(AcquireError::Closed));
        assert_eq!(limiter.charge(&"c", 1), Err(TryAcquireError::Closed));
        assert_eq!(
            limiter.try_acquire_refundable(&"c", 1).err(),
            Some(TryAcquireError::Closed)
        );
        assert_eq!(limiter.available(&"a"), 0, "the keys keep their state");
        assert_eq!(limiter.available(&"c"), 2);
        assert_eq!(limiter.available(&"d"), 1);
        assert_eq!(limiter.len(), 3, "no key made for a refused call");
        receipt.refund();
        assert_eq!(
            limiter.available(&"d"),
            2,
            "a refund after the close gives back"
        );
        let s = limiter.stats();
        assert_eq!((s.admitted, s.rejected), (3, 3 + 5), "{order:?} {s:?}");
        assert_eq!((s.waiting, s.waiting_keys, s.cancelled), (0, 0, 0), "{s:?}");
    }
}

/// Blocking waiters on real threads racing `close`: each thread waits on a key of its own
/// (made spent first, its next permit an hour away) or on a key all share, entering its wait
/// just before, during or after the close. Every one returns `Closed`; one left waiting in a
/// queue the close missed would wait the hour (the channel's timeout reports it).
#[test]
fn blocking_waiters_racing_close_all_end() {
    for round in 0..50u64 {
        let limiter = Arc::new(
            KeyedLimiter::<u64>::new(Algorithm::FixedWindow {
                limit: 1,
                window: Duration::from_secs(3600),
            })
            .unwrap(),
        );
        let threads = 6u64;
        for key in 0..=threads {
            limiter.try_acquire(&key).unwrap();
        }
        let waiting = Arc::clone(&limiter);
        let outcomes = waiters_racing_close(
            threads,
            round,
            move |key| waiting.acquire_blocking(&key),
            || limiter.close(),
        );
        for outcome in outcomes {
            assert_eq!(outcome, Err(AcquireError::Closed), "round {round}");
        }
        let s = limiter.stats();
        assert_eq!((s.admitted, s.rejected), (threads + 1, threads), "{s:?}");
        assert_eq!((s.waiting, s.waiting_keys), (0, 0), "{s:?}");
    }
}

/// Over the key cap under `KeyOverflow::Shared` (one key slot, held by "a" until 2 s): "b"
/// took one of the shared cell's two tokens at 0, and "c" waits there for two (due at 1 s).
fn overflow_with_a_head_waiting(
    order: QueueOrder,
) -> (Arc<Limiter>, tokio::task::JoinHandle<Duration>) {
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 2,
        })
        .clock(TokioClock::new())
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .queue_order(order)
        .build()
        .unwrap(),
    );
    limiter.try_acquire_n(&"a", 2).unwrap();
    limiter.try_acquire(&"b").unwrap();
    let start = Instant::now();
    let head = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move {
            limiter.acquire_n(&"c", 2).await.unwrap();
            start.elapsed()
        }
    });
    (limiter, head)
}

/// No barging past the heads waiting on the shared overflow cell, oldest first: at 0.5 s the
/// shared cell has a token and a half, so a newcomer of another key over the cap ("d") would
/// get one, and the head ("c", waiting for two) would then wait until 2 s. Now the newcomer
/// is refused (`try_acquire`, a `KeyedChain` over the limiter) or queues behind (`acquire`),
/// the head is served at 1 s, and the queued newcomer after it. Before, every key's queue was
/// its own: the newcomers took the shared cell's tokens first.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn newcomers_over_the_key_cap_wait_behind_the_heads_on_the_shared_cell() {
    let (limiter, head) = overflow_with_a_head_waiting(QueueOrder::OldestFirst);
    let start = Instant::now();
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 1);
    tokio::time::advance(Duration::from_millis(500)).await;
    let refused = limiter.try_acquire(&"d").unwrap_err();
    assert!(
        matches!(refused, TryAcquireError::Rejected(_)),
        "a newcomer took the shared cell's token ahead of its head: {refused:?}"
    );
    let chain = turnstile::KeyedChain::builder()
        .per_key(KeyedLimiter::clone(&limiter))
        .build()
        .unwrap();
    assert!(matches!(
        chain.try_acquire(&"d"),
        Err(TryAcquireError::Rejected(_))
    ));
    assert!(matches!(
        limiter.try_acquire_refundable(&"d", 1),
        Err(TryAcquireError::Rejected(_))
    ));
    let newcomer = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move {
            limiter.acquire(&"e").await.unwrap();
            start.elapsed()
        }
    });
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 2, "the newcomer queued");
    assert_eq!(head.await.unwrap(), Duration::from_secs(1));
    let after = newcomer.await.unwrap();
    assert!(after >= Duration::from_secs(1), "{after:?}");
    // Nobody waits on the shared cell any more: a newcomer is decided as before.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(limiter.try_acquire(&"d").is_ok());
    let s = limiter.stats();
    assert_eq!((s.waiting, s.waiting_keys), (0, 0), "{s:?}");
}

/// A head that stops waiting on the shared cell (its future dropped) no longer holds newcomers
/// back; newest first, nothing does (a newcomer goes before every waiter, as on its own key).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_head_gone_from_the_shared_cell_or_newest_first_holds_no_newcomer_back() {
    let (limiter, head) = overflow_with_a_head_waiting(QueueOrder::OldestFirst);
    tokio::task::yield_now().await;
    head.abort();
    assert!(head.await.unwrap_err().is_cancelled());
    assert_eq!(limiter.stats().waiting, 0);
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(limiter.try_acquire(&"d").is_ok());

    let (limiter, head) = overflow_with_a_head_waiting(QueueOrder::NewestFirst);
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(limiter.try_acquire(&"d").is_ok());
    assert_eq!(head.await.unwrap(), Duration::from_secs(2));
}

/// `stats().overflowed` counts calls, not attempts: a call at the key cap that waits on the
/// shared cell counts once, however many times its head tries (its fast path's attempt, then
/// one per wake), and so does one that queues behind it without an attempt of its own. Before,
/// every head attempt at the cap counted again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_call_at_the_key_cap_counts_as_overflowed_once() {
    let (limiter, head) = overflow_with_a_head_waiting(QueueOrder::OldestFirst);
    tokio::task::yield_now().await;
    // "b" (the shared cell's first call) and the waiting "c" so far.
    assert_eq!(limiter.stats().overflowed, 2);
    let behind = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.acquire(&"e").await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(head.await.unwrap(), Duration::from_secs(1));
    behind.await.unwrap().unwrap();
    let s = limiter.stats();
    assert_eq!((s.admitted, s.overflowed), (4, 3), "{s:?}");
}

/// A still clock that counts its readings.
#[derive(Clone, Default)]
struct CountingClock(Arc<std::sync::atomic::AtomicU64>);

impl turnstile::Clock for CountingClock {
    fn now(&self) -> u64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        0
    }
}

/// At the key cap with every key busy, a search for room that finds nothing raises the hint so
/// that the next new keys are refused at once until a key can turn idle. A busy key with a
/// waiter was reported as "look again now" rather than busy until its window ends, so every
/// new key's call walked every key of every such shard again (1.2 ms per call with 20,000 such
/// keys). Counted here in clock readings: a walk reads the clock at least once per key.
#[tokio::test]
async fn at_the_cap_busy_keys_with_waiters_cost_new_keys_one_search_in_all() {
    let clock = CountingClock::default();
    let keys = 64u64;
    let limiter = Arc::new(
        KeyedLimiter::builder(Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        })
        .clock(clock.clone())
        .max_keys(keys as usize)
        .build()
        .unwrap(),
    );
    for key in 0..keys {
        limiter.try_acquire(&key).unwrap();
    }
    let waiters: Vec<_> = (0..keys)
        .map(|key| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.acquire(&key).await })
        })
        .collect();
    while limiter.stats().waiting < keys as usize {
        tokio::task::yield_now().await;
    }
    let before = clock.0.load(std::sync::atomic::Ordering::Relaxed);
    for key in keys..keys + 10 {
        assert_eq!(
            limiter.try_acquire(&key),
            Err(TryAcquireError::TooManyKeys { max_keys: 64 })
        );
    }
    let reads = clock.0.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(
        reads < 2 * keys,
        "{reads} clock readings for 10 new keys at the cap: a walk of every key per call"
    );
    for waiter in waiters {
        waiter.abort();
    }
}

/// The count of keys with a queue shares its word with the closed bit (63). A waiter that
/// creates its key's queue counted it only after inserting it into the map, so another waiter
/// that found the queue there, failed (`QueueFull`, the queue limit being 0) and retired it
/// could uncount it first: the count went below zero and the word read as closed until the
/// creator's increment. Meanwhile every call on every key of the open limiter failed `Closed`
/// (8,552 times in 80 ms here), and a waiter whose queue was retired under it took `Closed`
/// for the limiter's close and gave up with it. Real threads, counting what they see.
#[test]
fn queues_made_and_retired_at_once_never_make_the_limiter_read_as_closed() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let limiter = Arc::new(
        KeyedLimiter::builder(Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        })
        .clock(turnstile::ManualClock::new())
        .queue_limit(0)
        .build()
        .unwrap(),
    );
    for key in 0..8u64 {
        limiter.try_acquire(&key).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let closed = Arc::new(AtomicU64::new(0));
    let mut threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (limiter, stop, closed) = (limiter.clone(), stop.clone(), closed.clone());
            std::thread::spawn(move || {
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Each waiter makes its key's queue, or finds another's, and retires it.
                    if limiter.acquire_blocking(&((i + t) % 8)) == Err(AcquireError::Closed) {
                        closed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    {
        let (limiter, stop, closed) = (limiter.clone(), stop.clone(), closed.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if limiter.try_acquire(&1_000) == Err(TryAcquireError::Closed) {
                    closed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(2) && closed.load(Ordering::Relaxed) == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(
        closed.load(Ordering::Relaxed),
        0,
        "calls on the open limiter failed Closed"
    );
    assert!(!limiter.is_closed());
    assert_eq!(limiter.stats().waiting_keys, 0);
}

/// A review probe, kept: a key's head whose timer has woken it, dropped before it looks again
/// (a `select!` that picked another branch), hands its turn to the next waiter of the key at
/// once: the next one sleeps with no timer of its own (it is behind), so nothing else would
/// wake it, and its permit is free.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_head_woken_by_its_timer_and_dropped_unlooked_wakes_the_next_waiter() {
    let limiter = Arc::new(
        KeyedLimiter::with_clock(
            Algorithm::FixedWindow {
                limit: 1,
                window: Duration::from_secs(10),
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    limiter.try_acquire(&"k").unwrap();
    let (head_woken, head_waker) = wakers::counting();
    let (next_woken, next_waker) = wakers::counting();
    let mut head = Box::pin(limiter.acquire(&"k"));
    let mut next = Box::pin(limiter.acquire(&"k"));
    assert!(poll_with(head.as_mut(), &head_waker).is_pending());
    assert!(poll_with(next.as_mut(), &next_waker).is_pending());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!((head_woken.wakes(), next_woken.wakes()), (1, 0));
    drop(head);
    assert_eq!(
        next_woken.wakes(),
        1,
        "the next waiter sleeps with the permit free"
    );
    let served = poll_with(next.as_mut(), &next_waker);
    assert!(
        matches!(&served, std::task::Poll::Ready(Ok(a)) if a.at() == Duration::from_secs(10)),
        "{served:?}"
    );
    let stats = limiter.stats();
    assert_eq!(
        (stats.admitted, stats.cancelled, stats.waiting_keys),
        (2, 1, 0),
        "{stats:?}"
    );
}
