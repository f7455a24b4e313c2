//! Waiting off tokio: `acquire().await` and the `acquire*_timeout`s on an executor that is not
//! tokio's (`futures_executor::block_on` on a plain thread, with no tokio runtime anywhere in
//! sight), as under smol or async-std. They used to panic there (tokio's timer needs its runtime).
//!
//! Real time is what is under test, so these tests wait for real: 100 ms limits, asserted to wait
//! about that long (at least 90 ms, and at most a generous 5 s for a loaded machine). The last
//! test checks the other side: inside a tokio runtime the waits still follow tokio's paused
//! clock.

use futures_executor::block_on;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};
use turnstile::{
    AcquireError, Algorithm, Chain, ConcurrencyLimiter, KeyedConcurrencyLimiter, KeyedLimiter,
    Rate, RateLimiter, TokioClock,
};

const STEP: Duration = Duration::from_millis(100);
const AT_LEAST: Duration = Duration::from_millis(90);
const AT_MOST: Duration = Duration::from_secs(5);

/// Runs `body` on `block_on`, after checking that no tokio runtime is around.
fn off_tokio<T>(body: impl std::future::Future<Output = T>) -> T {
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "the test must run outside any tokio runtime"
    );
    block_on(body)
}

/// Awaits both futures at once (`futures_executor` has no `join`).
async fn join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut a_out, mut b_out) = (None, None);
    std::future::poll_fn(|cx| {
        if a_out.is_none()
            && let Poll::Ready(out) = a.as_mut().poll(cx)
        {
            a_out = Some(out);
        }
        if b_out.is_none()
            && let Poll::Ready(out) = b.as_mut().poll(cx)
        {
            b_out = Some(out);
        }
        match (a_out.take(), b_out.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (a_out, b_out) = (a, b);
                Poll::Pending
            }
        }
    })
    .await
}

/// Asserts that `waited` is about one `STEP`.
#[track_caller]
fn about_one_step(waited: Duration) {
    assert!(
        (AT_LEAST..AT_MOST).contains(&waited),
        "waited {waited:?}, expected about {STEP:?}"
    );
}

fn one_per_step(algorithm: &str) -> Algorithm {
    match algorithm {
        "bucket" => Algorithm::TokenBucket {
            rate: Rate::new(1, STEP),
            burst: 1,
        },
        "sliding window" => Algorithm::SlidingWindow {
            limit: 1,
            window: STEP,
        },
        other => unreachable!("{other}"),
    }
}

/// The second `acquire` of a 1-per-100-ms limiter waits about 100 ms, on `block_on`.
fn second_acquire_waits(algorithm: &str) {
    let limiter = RateLimiter::new(one_per_step(algorithm)).unwrap();
    let waited = off_tokio(async {
        limiter.acquire().await.unwrap();
        let start = Instant::now();
        limiter.acquire().await.unwrap();
        start.elapsed()
    });
    about_one_step(waited);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.waiting), (2, 0));
}

#[test]
fn a_token_bucket_waits_off_tokio() {
    second_acquire_waits("bucket");
}

#[test]
fn a_sliding_window_waits_off_tokio() {
    second_acquire_waits("sliding window");
}

#[test]
fn waiters_off_tokio_are_served_in_turn() {
    // Two waiters at once on one executor: the head sleeps, then hands the turn on; each is
    // served one step after the one before it.
    let limiter = RateLimiter::new(one_per_step("bucket")).unwrap();
    let start = Instant::now();
    let (first, second) = off_tokio(async {
        limiter.acquire().await.unwrap();
        let waiter = || async {
            limiter.acquire().await.unwrap();
            start.elapsed()
        };
        join(waiter(), waiter()).await
    });
    let (first, second) = (first.min(second), first.max(second));
    about_one_step(first);
    about_one_step(second - first);
}

#[test]
fn an_acquire_timeout_off_tokio_times_out() {
    let limiter = RateLimiter::new(Algorithm::TokenBucket {
        rate: Rate::new(1, Duration::from_secs(3600)),
        burst: 1,
    })
    .unwrap();
    let (outcome, waited) = off_tokio(async {
        limiter.acquire().await.unwrap();
        let start = Instant::now();
        let outcome = limiter.acquire_timeout(1, STEP).await;
        (outcome, start.elapsed())
    });
    assert_eq!(outcome.unwrap_err(), AcquireError::Timeout);
    about_one_step(waited);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.cancelled, stats.waiting), (1, 1, 0));
}

#[test]
fn an_acquire_timeout_off_tokio_that_is_admitted_in_time() {
    let limiter = RateLimiter::new(one_per_step("bucket")).unwrap();
    let waited = off_tokio(async {
        limiter.acquire().await.unwrap();
        let start = Instant::now();
        limiter.acquire_timeout(1, AT_MOST).await.unwrap();
        start.elapsed()
    });
    about_one_step(waited);
}

#[test]
fn a_free_acquire_timeout_off_tokio_needs_no_timer() {
    // Nothing to wait for: admitted at once, with a timeout that could not have passed.
    let limiter = RateLimiter::new(one_per_step("bucket")).unwrap();
    off_tokio(async {
        limiter.acquire_timeout(1, Duration::ZERO).await.unwrap();
    });
}

#[test]
fn a_refundable_acquire_timeout_off_tokio_times_out() {
    let limiter = RateLimiter::new(one_per_step("sliding window")).unwrap();
    let outcome = off_tokio(async {
        limiter.acquire().await.unwrap();
        limiter.acquire_refundable_timeout(1, STEP / 10).await
    });
    assert_eq!(outcome.unwrap_err(), AcquireError::Timeout);
}

#[test]
fn a_keyed_limiter_waits_off_tokio() {
    let limiter = KeyedLimiter::new(one_per_step("bucket")).unwrap();
    let (waited, late) = off_tokio(async {
        limiter.acquire(&"a").await.unwrap();
        let start = Instant::now();
        limiter.acquire(&"a").await.unwrap();
        let waited = start.elapsed();
        let late = limiter.acquire_timeout(&"a", 1, STEP / 10).await;
        (waited, late)
    });
    about_one_step(waited);
    assert_eq!(late.unwrap_err(), AcquireError::Timeout);
}

#[test]
fn a_concurrency_waiter_off_tokio_is_woken_by_a_release_on_another_thread() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    std::thread::scope(|s| {
        let start = Instant::now();
        s.spawn(move || {
            std::thread::sleep(STEP);
            drop(held);
        });
        let waited = off_tokio(async {
            let _permit = limiter.acquire().await.unwrap();
            start.elapsed()
        });
        about_one_step(waited);
    });
    assert_eq!(limiter.available(), 1);
}

#[test]
fn concurrency_acquire_timeouts_off_tokio_time_out() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let keyed = KeyedConcurrencyLimiter::new(1).unwrap();
    let _held = limiter.try_acquire().unwrap();
    let _keyed_held = keyed.try_acquire(&"a").unwrap();
    let (outcome, keyed_outcome, waited) = off_tokio(async {
        let start = Instant::now();
        let outcome = limiter.acquire_timeout(1, STEP).await.map(drop);
        let keyed_outcome = keyed.acquire_timeout(&"a", 1, STEP / 10).await.map(drop);
        (outcome, keyed_outcome, start.elapsed())
    });
    assert_eq!(outcome.unwrap_err(), AcquireError::Timeout);
    assert_eq!(keyed_outcome.unwrap_err(), AcquireError::Timeout);
    assert!(waited >= AT_LEAST && waited < AT_MOST, "{waited:?}");
}

#[test]
fn a_chain_waits_off_tokio() {
    let bucket = RateLimiter::new(one_per_step("bucket")).unwrap();
    let chain = Chain::new([bucket.clone()]).unwrap();
    let (waited, late) = off_tokio(async {
        chain.acquire().await.unwrap();
        let start = Instant::now();
        chain.acquire().await.unwrap();
        let waited = start.elapsed();
        let late = chain.acquire_timeout(1, STEP / 10).await;
        (waited, late)
    });
    about_one_step(waited);
    assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    assert_eq!(bucket.stats().admitted, 2);
}

#[test]
fn a_chain_waiter_off_tokio_queues_behind_another() {
    // Two chain callers at once: the second waits in the chain's queue for the first, which
    // sleeps out the bucket's retry-after, then sleeps out its own.
    let chain = Chain::new([RateLimiter::new(one_per_step("bucket")).unwrap()]).unwrap();
    let start = Instant::now();
    let (first, second) = off_tokio(async {
        chain.acquire().await.unwrap();
        let waiter = || async {
            chain.acquire().await.unwrap();
            start.elapsed()
        };
        join(waiter(), waiter()).await
    });
    let (first, second) = (first.min(second), first.max(second));
    about_one_step(first);
    about_one_step(second - first);
}

/// Inside a tokio runtime, a wait follows tokio's clock: paused here, so an hour's wait takes
/// no real time, and ends exactly an hour later on tokio's clock.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inside_tokio_waits_follow_its_paused_clock() {
    let hour = Duration::from_secs(3600);
    let limiter = RateLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::new(1, hour),
            burst: 1,
        },
        TokioClock::new(),
    )
    .unwrap();
    let chain = Chain::new([limiter.clone()]).unwrap();
    let real = Instant::now();
    let start = tokio::time::Instant::now();
    limiter.acquire().await.unwrap();
    limiter.acquire().await.unwrap();
    assert_eq!(start.elapsed(), hour);
    chain.acquire().await.unwrap();
    assert!(start.elapsed() >= 2 * hour);
    let late = limiter.acquire_timeout(1, hour / 2).await;
    assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    assert!(start.elapsed() >= 2 * hour + hour / 2);
    assert!(
        real.elapsed() < AT_MOST,
        "{:?} of real time",
        real.elapsed()
    );
}

/// A `Store` in this process's memory, entries dropped once expired.
#[cfg(feature = "store")]
#[derive(Default)]
struct MemoryStore(std::sync::Mutex<Entries>);

/// Key → (value, expiry).
#[cfg(feature = "store")]
type Entries = std::collections::HashMap<Vec<u8>, (Vec<u8>, Instant)>;

#[cfg(feature = "store")]
impl turnstile::Store for MemoryStore {
    type Error = std::convert::Infallible;

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
        let map = self.0.lock().unwrap();
        Ok(map
            .get(key)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(v, _)| v.clone()))
    }

    async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
        let until = Instant::now() + ttl;
        self.0.lock().unwrap().insert(key.to_vec(), (value, until));
        Ok(())
    }
}

/// A store limiter's `acquire` sleeps out each rejection's retry-after: off tokio too.
#[cfg(feature = "store")]
#[test]
fn a_store_limiter_waits_off_tokio() {
    let limiter = turnstile::StoreLimiter::new(
        one_per_step("sliding window"),
        "runtimes",
        MemoryStore::default(),
    )
    .unwrap();
    let waited = off_tokio(async {
        limiter.acquire("a").await.unwrap();
        let start = Instant::now();
        limiter.acquire("a").await.unwrap();
        start.elapsed()
    });
    about_one_step(waited);
}

/// A store limiter's `acquire_timeout` off tokio: its time limit runs on futures-timer's
/// thread as its sleeps do, and cuts the sleep toward an hour-long window's end.
#[cfg(feature = "store")]
#[test]
fn a_store_limiter_acquire_timeout_off_tokio_times_out() {
    let limiter = turnstile::StoreLimiter::new(
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        },
        "runtimes",
        MemoryStore::default(),
    )
    .unwrap();
    let (outcome, waited) = off_tokio(async {
        limiter.acquire_timeout("a", 1, STEP).await.unwrap();
        let start = Instant::now();
        let outcome = limiter.acquire_timeout("a", 1, STEP).await;
        (outcome, start.elapsed())
    });
    assert_eq!(outcome.unwrap_err(), AcquireError::Timeout);
    about_one_step(waited);
}

/// A keyed limiter's `run_sweeper` off tokio: it sweeps an idle key on its own, and ends once
/// the limiter is dropped. It ticked on a tokio interval, which panics off tokio.
#[test]
fn a_keyed_limiter_sweeper_runs_off_tokio() {
    let limiter = KeyedLimiter::new(Algorithm::FixedWindow {
        limit: 1,
        window: Duration::from_millis(10),
    })
    .unwrap();
    limiter.try_acquire(&"idle").unwrap();
    assert_eq!(limiter.len(), 1);
    let sweeper = limiter.run_sweeper(Duration::from_millis(20));
    let sweeping = std::thread::spawn(move || off_tokio(sweeper));
    let start = Instant::now();
    while !limiter.is_empty() {
        assert!(start.elapsed() < AT_MOST, "the idle key was never swept");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(limiter);
    // Ends at its next tick, the limiter gone (a hang here fails the test run).
    sweeping.join().unwrap();
}

/// The same for a ban list's sweeper.
#[test]
fn a_ban_list_sweeper_runs_off_tokio() {
    let bans = turnstile::BanList::builder(1, Duration::from_millis(10), Duration::from_millis(10))
        .build()
        .unwrap();
    bans.fail(&"mallory").unwrap();
    assert!(!bans.is_empty());
    let sweeper = bans.run_sweeper(Duration::from_millis(20));
    let sweeping = std::thread::spawn(move || off_tokio(sweeper));
    let start = Instant::now();
    while !bans.is_empty() {
        assert!(start.elapsed() < AT_MOST, "the expired ban was never swept");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(bans);
    sweeping.join().unwrap();
}
