//! Scenarios in the spirit of .NET's System.Threading.RateLimiting tests (their ideas, our code):
//! queued requests that are cancelled, newest-first eviction, limits at `u32::MAX`, and statistics
//! after a scripted sequence.

use std::time::Duration;
use tokio::time::Instant;
use turnstile::{
    AcquireError, Algorithm, ConcurrencyLimiter, QueueOrder, Rate, RateLimiter, Stats, TokioClock,
    TryPermitError,
};

async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_queued_request_frees_queue_space_and_consumes_nothing() {
    let limiter = RateLimiter::builder(Algorithm::FixedWindow {
        limit: 2,
        window: Duration::from_secs(1),
    })
    .clock(TokioClock::new())
    .queue_limit(2)
    .build()
    .unwrap();
    limiter.try_acquire_n(2).unwrap();
    let start = Instant::now();
    let queued = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(2).await })
    };
    settle().await;
    // The queue holds 2 permits: another request does not fit.
    assert!(matches!(
        limiter.acquire().await,
        Err(AcquireError::QueueFull { .. })
    ));
    queued.abort();
    let _ = queued.await;
    // Space is free again, and the cancelled request consumed nothing: the next window's two
    // permits both go to the new waiter.
    let admission = limiter.acquire_n(2).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(admission.remaining(), 0);
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.admitted,
            stats.rejected,
            stats.cancelled,
            stats.waiting
        ),
        (2, 1, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn newest_first_full_queue_fails_the_oldest_waiters_to_make_room() {
    let limiter = RateLimiter::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 3,
    })
    .clock(TokioClock::new())
    .queue_order(QueueOrder::NewestFirst)
    .queue_limit(3)
    .build()
    .unwrap();
    limiter.try_acquire_n(3).unwrap();
    let spawn = |n: u32| {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire_n(n).await.map(|a| a.at()) })
    };
    let oldest = spawn(1);
    settle().await;
    let middle = spawn(1);
    settle().await;
    // 2 queued + 2 > 3: the oldest goes; 1 + 2 = 3 fits.
    let newest = spawn(2);
    settle().await;
    assert_eq!(
        oldest.await.unwrap().unwrap_err(),
        AcquireError::QueueFull {
            requested: 1,
            queue_limit: 3
        }
    );
    // Newest first: 2 permits accrue by t = 2 s, then the middle one by t = 3 s.
    assert_eq!(newest.await.unwrap().unwrap(), Duration::from_secs(2));
    assert_eq!(middle.await.unwrap().unwrap(), Duration::from_secs(3));
    // At t = 3 s the bucket is empty again. A waiter for 1 queues; a request for 3 then needs the
    // whole queue, evicts it, and gets its 3 permits when they have accrued, at t = 6 s.
    let evicted = spawn(1);
    settle().await;
    let big = limiter.acquire_n(3).await.unwrap();
    assert_eq!(big.at(), Duration::from_secs(6));
    assert!(matches!(
        evicted.await.unwrap(),
        Err(AcquireError::QueueFull { requested: 1, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn limits_at_u32_max_do_not_overflow() {
    let permits = ConcurrencyLimiter::builder(u32::MAX)
        .queue_limit(u64::MAX)
        .build()
        .unwrap();
    let all = permits.try_acquire_n(u32::MAX).unwrap();
    assert_eq!(permits.available(), 0);
    // Waiters for u32::MAX permits each: the queue counts them in 64 bits.
    let waiters: Vec<_> = (0..3)
        .map(|_| tokio::spawn(permits.acquire_owned(u32::MAX)))
        .collect();
    settle().await;
    assert_eq!(permits.stats().queued_permits, 3 * u64::from(u32::MAX));
    drop(all);
    for w in waiters {
        drop(w.await.unwrap().unwrap());
    }
    assert_eq!(permits.available(), u32::MAX);
    assert!(matches!(
        permits.try_acquire_n(u32::MAX).map(|p| p.permits()),
        Ok(u32::MAX)
    ));

    let w = Duration::from_secs(1);
    for algorithm in [
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window: w,
        },
        Algorithm::SlidingCounter {
            limit: u32::MAX,
            window: w,
        },
        Algorithm::TokenBucket {
            rate: Rate::per_second(u32::MAX),
            burst: u32::MAX,
        },
    ] {
        let limiter = RateLimiter::builder(algorithm)
            .clock(TokioClock::new())
            .queue_limit(u64::MAX)
            .build()
            .unwrap();
        assert_eq!(
            limiter.try_acquire_n(u32::MAX).unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert!(limiter.try_acquire().is_err(), "{algorithm:?}");
        let admission = limiter.acquire_n(u32::MAX).await.unwrap();
        assert_eq!(admission.remaining(), 0, "{algorithm:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn stats_follow_a_scripted_sequence() {
    let limiter = ConcurrencyLimiter::builder(2)
        .queue_limit(2)
        .build()
        .unwrap();
    let stats = |l: &ConcurrencyLimiter| {
        let Stats {
            admitted,
            rejected,
            cancelled,
            available,
            waiting,
            queued_permits,
            ..
        } = l.stats();
        (
            admitted,
            rejected,
            cancelled,
            available,
            waiting,
            queued_permits,
        )
    };
    assert_eq!(stats(&limiter), (0, 0, 0, 2, 0, 0));
    let a = limiter.try_acquire().unwrap();
    assert_eq!(stats(&limiter), (1, 0, 0, 1, 0, 0));
    let b = limiter.try_acquire().unwrap();
    assert_eq!(
        limiter.try_acquire().unwrap_err(),
        TryPermitError::NoPermits {
            available: 0,
            requested: 1
        }
    );
    assert_eq!(stats(&limiter), (2, 1, 0, 0, 0, 0));
    let queued = tokio::spawn(limiter.acquire_owned(2));
    settle().await;
    assert_eq!(stats(&limiter), (2, 1, 0, 0, 1, 2));
    assert!(limiter.acquire().await.is_err()); // queue full
    assert_eq!(stats(&limiter), (2, 2, 0, 0, 1, 2));
    drop(a);
    settle().await;
    assert_eq!(stats(&limiter), (2, 2, 0, 1, 1, 2)); // one free, the head needs two
    drop(b);
    let both = queued.await.unwrap().unwrap();
    assert_eq!(stats(&limiter), (3, 2, 0, 0, 0, 0));
    let impatient = limiter.acquire_timeout(1, Duration::from_millis(5)).await;
    assert_eq!(impatient.unwrap_err(), AcquireError::Timeout);
    assert_eq!(stats(&limiter), (3, 2, 1, 0, 0, 0));
    drop(both);
    assert_eq!(stats(&limiter), (3, 2, 1, 2, 0, 0));
    limiter.close();
    assert!(limiter.try_acquire().is_err());
    assert_eq!(stats(&limiter), (3, 3, 1, 2, 0, 0));
}
