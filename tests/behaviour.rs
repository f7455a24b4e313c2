//! Behaviour of each algorithm on a ManualClock: window edges, exact retry-after values, probes,
//! capacity errors, configuration errors and statistics.

use std::time::Duration;
use turnstile::{
    Algorithm, ConfigError, ManualClock, Rate, RateLimiter, Rejection, TryAcquireError,
};

const MS: Duration = Duration::from_millis(1);

fn limiter(algorithm: Algorithm) -> (RateLimiter<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(algorithm, clock.clone()).expect("valid config");
    (limiter, clock)
}

fn rejection(result: Result<turnstile::Admission, TryAcquireError>) -> Rejection {
    match result {
        Err(TryAcquireError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The boundary scenario: limit 10 per second; 3 calls in [0, 0.5 s), 7 in [0.5, 1 s), 7 in
/// [1, 1.5 s), 3 in [1.5, 2 s). Returns the admitted call times in milliseconds.
fn boundary_scenario(algorithm: Algorithm) -> (Vec<u64>, Vec<(u64, Duration)>) {
    let (limiter, clock) = limiter(algorithm);
    let mut calls: Vec<u64> = vec![0, 100, 200];
    calls.extend((0..7).map(|i| 500 + 50 * i));
    calls.extend((0..7).map(|i| 1000 + 50 * i));
    calls.extend([1500, 1600, 1700]);
    let (mut admitted, mut rejected) = (vec![], vec![]);
    for at in calls {
        clock.set(MS * at as u32);
        match limiter.try_acquire() {
            Ok(a) => {
                assert_eq!(a.at(), MS * at as u32);
                admitted.push(at);
            }
            Err(e) => rejected.push((at, e.rejection().expect("a rejection").retry_after())),
        }
    }
    (admitted, rejected)
}

fn most_in_any_window(times: &[u64], window: u64) -> usize {
    times
        .iter()
        .map(|&start| {
            times
                .iter()
                .filter(|&&t| t >= start && t < start + window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn boundary_scenario_fixed_window_admits_14_across_the_boundary() {
    let (admitted, rejected) = boundary_scenario(Algorithm::FixedWindow {
        limit: 10,
        window: Duration::from_secs(1),
    });
    assert_eq!(admitted.len(), 20, "every call fits its own fixed window");
    assert!(rejected.is_empty());
    let straddling = admitted
        .iter()
        .filter(|&&t| (500..1500).contains(&t))
        .count();
    assert_eq!(straddling, 14, "the fixed window's known weakness");
    assert_eq!(most_in_any_window(&admitted, 1000), 14);
}

#[test]
fn boundary_scenario_sliding_window_never_exceeds_10_per_second() {
    let (admitted, rejected) = boundary_scenario(Algorithm::SlidingWindow {
        limit: 10,
        window: Duration::from_secs(1),
    });
    assert_eq!(
        admitted,
        vec![
            0, 100, 200, 500, 550, 600, 650, 700, 750, 800, 1000, 1100, 1200, 1500, 1600, 1700
        ]
    );
    assert_eq!(most_in_any_window(&admitted, 1000), 10);
    // Each rejection names the exact moment the oldest relevant admission leaves the window.
    assert_eq!(
        rejected,
        vec![
            (1050, MS * 50),  // waits for the admission at 100 ms
            (1150, MS * 50),  // waits for 200 ms
            (1250, MS * 250), // waits for 500 ms
            (1300, MS * 200),
        ]
    );
}

#[test]
fn fixed_window_edges_and_exact_retry_after() {
    let (limiter, clock) = limiter(Algorithm::FixedWindow {
        limit: 3,
        window: Duration::from_secs(1),
    });
    clock.set(MS * 999);
    let a = limiter.try_acquire_n(3).unwrap();
    assert_eq!((a.remaining(), a.reset_after()), (0, MS));
    let r = rejection(limiter.try_acquire());
    assert_eq!((r.retry_after(), r.limit()), (MS, 3));
    clock.set(MS * 1000); // first instant of the next window
    let a = limiter.try_acquire().unwrap();
    assert_eq!((a.remaining(), a.reset_after()), (2, MS * 1000));
    // A rejection in the middle of a window waits for its end, not a whole window.
    limiter.try_acquire_n(2).unwrap();
    clock.set(MS * 1234);
    assert_eq!(rejection(limiter.try_acquire()).retry_after(), MS * 766);
    assert_eq!(
        rejection(limiter.try_acquire()).retry_after_nanos(),
        766_000_000
    );
}

#[test]
fn sliding_window_retry_after_waits_for_the_oldest_relevant_admission() {
    let (limiter, clock) = limiter(Algorithm::SlidingWindow {
        limit: 4,
        window: Duration::from_secs(1),
    });
    for at in [0u32, 100, 200, 300] {
        clock.set(MS * at);
        limiter.try_acquire().unwrap();
    }
    clock.set(MS * 450);
    // One permit frees when the admission at 0 expires; three need the one at 200.
    assert_eq!(rejection(limiter.try_acquire()).retry_after(), MS * 550);
    assert_eq!(rejection(limiter.try_acquire_n(3)).retry_after(), MS * 750);
    clock.set(MS * 1000);
    let a = limiter.try_acquire().unwrap();
    assert_eq!(
        a.remaining(),
        0,
        "100, 200 and 300 ms are still in the window"
    );
    assert_eq!(a.reset_after(), Duration::from_secs(1));
    clock.set(MS * 1250);
    assert_eq!(limiter.try_acquire_n(0).unwrap().remaining(), 2);
    assert_eq!(limiter.stats().available, 2);
}

#[test]
fn sliding_window_remaining_counts_live_admissions() {
    let (limiter, clock) = limiter(Algorithm::SlidingWindow {
        limit: 100,
        window: Duration::from_secs(10),
    });
    for i in 0..100u32 {
        clock.set(MS * (i * 100));
        let a = limiter.try_acquire().unwrap();
        assert_eq!(a.remaining(), 99 - i);
    }
    // At 15 s the admissions at 0..=5 s (51 of them) have expired.
    clock.set(Duration::from_secs(15));
    assert_eq!(limiter.stats().available, 51);
    let a = limiter.try_acquire_n(51).unwrap();
    assert_eq!(a.remaining(), 0);
}

#[test]
fn sliding_counter_weights_the_previous_window() {
    let (limiter, clock) = limiter(Algorithm::SlidingCounter {
        limit: 10,
        window: Duration::from_secs(1),
    });
    clock.set(MS * 900);
    limiter.try_acquire_n(10).unwrap();
    // At 1.25 s the previous window counts for 75 %: 7.5 used, so 2 more fit and a third does not.
    clock.set(MS * 1250);
    let a = limiter.try_acquire_n(2).unwrap();
    assert_eq!(a.remaining(), 0, "10 × 0.75 + 2 = 9.5 → floor(0.5) = 0");
    let r = rejection(limiter.try_acquire());
    // 10·(1 − e) + 3 ≤ 10  ⇔  e ≥ 0.3: 50 ms from now.
    assert_eq!(r.retry_after(), MS * 50);
    clock.set(MS * 1300);
    limiter.try_acquire().unwrap();
    // A request that cannot fit in this window waits into the next: there prev = 3 (this window).
    clock.set(MS * 1400);
    let r = rejection(limiter.try_acquire_n(8));
    // In window 2: 3·(1 − e) + 8 ≤ 10 ⇔ e ≥ 1/3 s; from 1.4 s that is 0.6 s + 333,333,334 ns.
    assert_eq!(r.retry_after_nanos(), 600_000_000 + 333_333_334);
}

/// A sliding counter takes a limit of a million and weighs the previous window exactly at that
/// size. (Its memory, three words whatever the limit, is checked on the state's type, in the
/// algorithm's unit tests.)
#[test]
fn sliding_counter_of_a_million_weighs_the_previous_window() {
    let (big, clock) = limiter(Algorithm::SlidingCounter {
        limit: 1_000_000,
        window: Duration::from_secs(60),
    });
    big.try_acquire_n(999_999).unwrap();
    assert_eq!(big.try_acquire().unwrap().remaining(), 0);
    clock.advance(Duration::from_secs(90));
    // Half of the previous window still counts: 500,000 free.
    assert_eq!(big.stats().available, 500_000);
}

#[test]
fn token_bucket_is_gcra_with_burst() {
    let (limiter, clock) = limiter(Algorithm::TokenBucket {
        rate: Rate::per_second(10),
        burst: 5,
    });
    let a = limiter.try_acquire_n(5).unwrap();
    assert_eq!((a.remaining(), a.reset_after()), (0, MS * 500));
    assert_eq!(rejection(limiter.try_acquire()).retry_after(), MS * 100);
    assert_eq!(rejection(limiter.try_acquire_n(3)).retry_after(), MS * 300);
    clock.set(MS * 130);
    let a = limiter.try_acquire().unwrap();
    assert_eq!(a.remaining(), 0);
    assert_eq!(rejection(limiter.try_acquire()).retry_after(), MS * 70);
    clock.set(Duration::from_secs(10));
    assert_eq!(limiter.try_acquire().unwrap().remaining(), 4);
}

#[test]
fn token_bucket_rounds_the_interval_up_so_the_rate_is_never_exceeded() {
    let (limiter, clock) = limiter(Algorithm::TokenBucket {
        rate: Rate::per_second(3),
        burst: 1,
    });
    limiter.try_acquire().unwrap();
    assert_eq!(
        rejection(limiter.try_acquire()).retry_after_nanos(),
        333_333_334
    );
    clock.set(Duration::from_nanos(333_333_333));
    assert!(limiter.try_acquire().is_err());
    clock.set(Duration::from_nanos(333_333_334));
    assert!(limiter.try_acquire().is_ok());
}

#[test]
fn zero_permits_is_a_probe_that_consumes_nothing() {
    for algorithm in all_algorithms(2, Duration::from_secs(1)) {
        let (limiter, _clock) = limiter(algorithm);
        for _ in 0..5 {
            assert_eq!(
                limiter.try_acquire_n(0).unwrap().remaining(),
                2,
                "{algorithm:?}"
            );
        }
        limiter.try_acquire_n(2).unwrap();
        let r = rejection(limiter.try_acquire_n(0));
        assert!(r.retry_after() > Duration::ZERO, "{algorithm:?}");
        assert_eq!(limiter.stats().available, 0);
    }
}

#[test]
fn more_than_the_capacity_is_insufficient_capacity_not_a_rejection() {
    for algorithm in all_algorithms(5, Duration::from_secs(1)) {
        let (limiter, _clock) = limiter(algorithm);
        assert_eq!(
            limiter.try_acquire_n(6),
            Err(TryAcquireError::InsufficientCapacity {
                requested: 6,
                capacity: 5
            }),
            "{algorithm:?}"
        );
        assert_eq!(
            limiter.try_acquire_n(u32::MAX).unwrap_err().rejection(),
            None
        );
        // Nothing was consumed.
        assert_eq!(limiter.try_acquire_n(5).unwrap().remaining(), 0);
    }
}

#[test]
fn rejections_change_nothing() {
    for algorithm in all_algorithms(3, Duration::from_secs(1)) {
        let (limiter, clock) = limiter(algorithm);
        limiter.try_acquire_n(3).unwrap();
        clock.set(MS * 10);
        let first = rejection(limiter.try_acquire());
        for _ in 0..100 {
            assert_eq!(rejection(limiter.try_acquire()), first, "{algorithm:?}");
        }
        clock.advance(first.retry_after());
        assert!(
            limiter.try_acquire().is_ok(),
            "{algorithm:?}: free exactly at retry_after"
        );
    }
}

#[test]
fn limits_at_u32_max_do_not_overflow() {
    for algorithm in [
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window: Duration::from_secs(1),
        },
        Algorithm::SlidingCounter {
            limit: u32::MAX,
            window: Duration::from_secs(1),
        },
        Algorithm::TokenBucket {
            rate: Rate::per_second(u32::MAX),
            burst: u32::MAX,
        },
    ] {
        let (limiter, clock) = limiter(algorithm);
        limiter.try_acquire_n(u32::MAX - 1).unwrap();
        assert_eq!(
            limiter.try_acquire().unwrap().remaining(),
            0,
            "{algorithm:?}"
        );
        assert!(limiter.try_acquire().is_err());
        // The token bucket's interval rounds up to 1 ns, so it refills in u32::MAX ns (~4.3 s).
        clock.advance(Duration::from_secs(5));
        assert_eq!(limiter.try_acquire_n(u32::MAX).unwrap().remaining(), 0);
    }
}

#[test]
fn huge_and_tiny_windows_are_handled() {
    let century = Duration::from_secs(100 * 365 * 86_400);
    for algorithm in all_algorithms(2, century) {
        let (limiter, clock) = limiter(algorithm);
        limiter.try_acquire_n(2).unwrap();
        let r = rejection(limiter.try_acquire());
        assert!(r.retry_after() <= century * 2, "{algorithm:?}");
        clock.set(Duration::from_secs(u64::MAX / 4));
        // The far future (the clock saturates at its last nanosecond): no panic, no overflow,
        // and the century's two permits have long stopped counting.
        let late = limiter.try_acquire();
        assert!(late.is_ok(), "{algorithm:?}: {late:?}");
    }
    for algorithm in all_algorithms(1, Duration::from_nanos(1)) {
        let (limiter, clock) = limiter(algorithm);
        for _ in 0..10 {
            // Two windows: the sliding counter still weighs the previous 1 ns window fully at the
            // first instant of the next one.
            clock.advance(Duration::from_nanos(2));
            limiter.try_acquire().unwrap();
        }
    }
}

#[test]
fn invalid_configurations_are_typed_errors() {
    let second = Duration::from_secs(1);
    let cases = [
        (
            Algorithm::FixedWindow {
                limit: 0,
                window: second,
            },
            ConfigError::Zero { what: "limit" },
        ),
        (
            Algorithm::SlidingWindow {
                limit: 1,
                window: Duration::ZERO,
            },
            ConfigError::Zero { what: "window" },
        ),
        (
            Algorithm::SlidingCounter {
                limit: 0,
                window: second,
            },
            ConfigError::Zero { what: "limit" },
        ),
        (
            Algorithm::TokenBucket {
                rate: Rate::per_second(0),
                burst: 1,
            },
            ConfigError::Zero {
                what: "rate permits",
            },
        ),
        (
            Algorithm::TokenBucket {
                rate: Rate::new(1, Duration::ZERO),
                burst: 1,
            },
            ConfigError::Zero {
                what: "rate period",
            },
        ),
        (
            Algorithm::TokenBucket {
                rate: Rate::per_second(1),
                burst: 0,
            },
            ConfigError::Zero { what: "burst" },
        ),
    ];
    for (algorithm, expected) in cases {
        assert_eq!(
            RateLimiter::with_clock(algorithm, ManualClock::new()).unwrap_err(),
            expected
        );
    }
    let too_long = Duration::MAX;
    assert!(matches!(
        RateLimiter::fixed_window(1, too_long).unwrap_err(),
        ConfigError::TooLarge { what: "window", .. }
    ));
    assert!(matches!(
        RateLimiter::sliding_window(20_000_000, second).unwrap_err(),
        ConfigError::TooLarge { .. }
    ));
    assert!(matches!(
        RateLimiter::token_bucket(
            Rate::new(1, Duration::from_secs(u64::MAX / 1_000_000_000)),
            2
        )
        .unwrap_err(),
        ConfigError::TooLarge { .. }
    ));
    let message = RateLimiter::sliding_window(20_000_000, second)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("sliding window limit is too large"),
        "{message}"
    );
}

#[test]
fn stats_add_up_over_a_scripted_sequence() {
    let (limiter, clock) = limiter(Algorithm::FixedWindow {
        limit: 3,
        window: Duration::from_secs(1),
    });
    let script = [1, 1, 0, 1, 1, 5, 2];
    let outcomes: Vec<bool> = script
        .iter()
        .map(|&n| limiter.try_acquire_n(n).is_ok())
        .collect();
    assert_eq!(outcomes, [true, true, true, true, false, false, false]);
    assert_eq!(
        limiter.stats(),
        limiter_stats(4, 3, 0),
        "3 permits taken, probe counted as admitted"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.stats().available, 3);
    // Clones share everything.
    let clone = limiter.clone();
    clone.try_acquire().unwrap();
    assert_eq!(limiter.stats().admitted, 5);
}

fn limiter_stats(admitted: u64, rejected: u64, available: u32) -> turnstile::Stats {
    let mut s = turnstile::Stats::default();
    s.admitted = admitted;
    s.rejected = rejected;
    s.available = available;
    s
}

#[test]
fn clones_share_state_across_threads() {
    let (limiter, _clock) = limiter(Algorithm::SlidingWindow {
        limit: 1000,
        window: Duration::from_secs(1),
    });
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let l = limiter.clone();
            std::thread::spawn(move || (0..500).filter(|_| l.try_acquire().is_ok()).count())
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 1000);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.rejected), (1000, 1000));
}

#[test]
fn default_clock_limiters_work_in_real_time() {
    let limiter = RateLimiter::sliding_window(2, Duration::from_millis(50)).unwrap();
    assert!(limiter.try_acquire().is_ok());
    assert!(limiter.try_acquire().is_ok());
    let wait = rejection(limiter.try_acquire()).retry_after();
    assert!(wait <= Duration::from_millis(50));
    std::thread::sleep(wait + Duration::from_millis(5));
    assert!(limiter.try_acquire().is_ok());
}

fn all_algorithms(limit: u32, window: Duration) -> [Algorithm; 4] {
    [
        Algorithm::FixedWindow { limit, window },
        Algorithm::SlidingWindow { limit, window },
        Algorithm::SlidingCounter { limit, window },
        Algorithm::TokenBucket {
            rate: Rate::new(limit, window),
            burst: limit,
        },
    ]
}

/// A probe (`n == 0`) that would have to wait takes one permit's room in the queue, so a full
/// queue refuses it with `QueueFull { requested: 0 }`. Its message must say that, not that there
/// is "no room for 0 more permits", which no queue limit can be too small for.
#[test]
fn a_probe_refused_by_a_full_queue_says_why() {
    let limiter = turnstile::ConcurrencyLimiter::builder(1)
        .queue_limit(0)
        .build()
        .unwrap();
    let _held = limiter.try_acquire().unwrap();
    let err = limiter.acquire_blocking_n(0).unwrap_err();
    assert_eq!(
        err,
        turnstile::AcquireError::QueueFull {
            requested: 0,
            queue_limit: 0
        }
    );
    assert_eq!(
        err.to_string(),
        "the wait queue has no room for a probe, which waits as one permit (its limit is 0)"
    );
    // A request for permits keeps its message.
    assert_eq!(
        turnstile::AcquireError::QueueFull {
            requested: 3,
            queue_limit: 2
        }
        .to_string(),
        "the wait queue has no room for 3 more permits (its limit is 2)"
    );
}

/// `Stats::available` is what the algorithm could admit, whatever the gate: a closed limiter
/// still counts its free permits (as `ConcurrencyLimiter::available` does), though no call can
/// take them.
#[test]
fn a_closed_limiters_stats_still_count_what_the_algorithm_has_free() {
    for algorithm in all_algorithms(3, Duration::from_secs(1)) {
        let (limiter, _clock) = limiter(algorithm);
        limiter.try_acquire().unwrap();
        limiter.close();
        assert_eq!(limiter.stats().available, 2, "{algorithm:?}");
        assert_eq!(
            limiter.try_acquire_n(0).unwrap_err(),
            TryAcquireError::Closed
        );
    }
}

/// A sliding window's `max_limit` below the limit it is built with is raised to that limit: the
/// ring always holds the limit, a reconfiguration may go back up to it, and no further.
#[test]
fn a_max_limit_below_the_limit_is_raised_to_it() {
    let window = Duration::from_secs(1);
    let limiter = RateLimiter::builder(Algorithm::SlidingWindow { limit: 10, window })
        .clock(ManualClock::new())
        .max_limit(0)
        .build()
        .unwrap();
    limiter
        .reconfigure(Algorithm::SlidingWindow { limit: 4, window })
        .unwrap();
    limiter
        .reconfigure(Algorithm::SlidingWindow { limit: 10, window })
        .unwrap();
    assert_eq!(
        limiter
            .reconfigure(Algorithm::SlidingWindow { limit: 11, window })
            .unwrap_err(),
        ConfigError::AboveMaxLimit {
            limit: 11,
            max_limit: 10
        }
    );
    assert_eq!(limiter.try_acquire_n(10).unwrap().remaining(), 0);
}
