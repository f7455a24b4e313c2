//! The Redis backend against a real `redis-server`, started by each test (see
//! `common/redis_server.rs`; a missing server fails the test, never skips it).
//!
//! Redis's `TIME` is real time, so windows here are short (a few hundred milliseconds) and every
//! timing assertion brackets the server's decision between two `TIME` readings instead of
//! guessing. After each test, `SCAN` must find no key of ours without a TTL.

#![cfg(feature = "redis")]

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use redis_server::{RedisServer, redis_now, room_in_window};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use turnstile::redis::{self, Commands, aio::ConnectionManager};
use turnstile::{
    AcquireError, Admission, Algorithm, ConfigError, FailurePolicy, REDIS_ACQUIRE_RECORDS,
    REDIS_MAX_SLIDING_LIMIT, Rate, RedisLimiter, Rejection, TryAcquireError,
};

const PREFIX: &str = "t";

/// Sleeps (real time) until `margin` after the start of the next window of `window` on Redis's
/// clock, so that a test's admissions all fall in one window.
fn align_to_window(con: &mut redis::Connection, window: Duration, margin: Duration) {
    let w = window.as_micros() as u64;
    let now = redis_now(con);
    std::thread::sleep(Duration::from_micros(w - now % w) + margin);
}

async fn manager(server: &RedisServer) -> ConnectionManager {
    ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap()
}

async fn limiter(
    server: &RedisServer,
    algorithm: Algorithm,
    policy: FailurePolicy,
) -> RedisLimiter {
    RedisLimiter::builder(algorithm, policy)
        .prefix(PREFIX)
        .deadline(Duration::from_millis(200))
        .build(manager(server).await)
        .unwrap()
}

/// Every key of ours carries a TTL, and the keys found are returned.
fn assert_all_keys_expire(con: &mut redis::Connection) -> Vec<String> {
    redis_server::assert_all_keys_expire(con, PREFIX)
}

/// `INFO commandstats` as command → calls.
fn command_calls(con: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

fn rejection(result: Result<Admission, TryAcquireError>) -> Rejection {
    match result {
        Err(TryAcquireError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The tests run against the server they name: Redis by default, Valkey when `.ci/run` sets
/// `TURNSTILE_REDIS_SERVER=valkey-server` (Valkey's INFO says `server_name:valkey`; Redis 7's
/// has no such line, and Valkey keeps `redis_version` for clients that look).
#[test]
fn the_server_is_the_one_named() {
    let server = RedisServer::start();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.connection())
        .unwrap();
    assert!(info.contains("redis_version:"), "{info}");
    let valkey = info.contains("server_name:valkey");
    assert_eq!(
        valkey,
        redis_server::server_binary().contains("valkey"),
        "asked for {}, got: {info}",
        redis_server::server_binary()
    );
}

fn dump(con: &mut redis::Connection, key: &[u8]) -> Option<Vec<u8>> {
    redis::cmd("DUMP").arg(key).query(con).unwrap()
}

/// Rejects once and checks: the retry-after is `free_at − t` for the server's decision time t,
/// bracketed by TIME readings; whole microseconds; and the key is unchanged (and its TTL was not
/// refreshed).
async fn check_rejection(
    limiter: &RedisLimiter,
    con: &mut redis::Connection,
    subject: &str,
    free_at_us: u64,
) -> Rejection {
    let key = limiter.key(subject);
    let before = dump(con, &key);
    let ttl_before: i64 = con.pttl(&key).unwrap();
    let t0 = redis_now(con);
    let r = rejection(limiter.try_acquire(subject).await);
    let t1 = redis_now(con);
    assert_eq!(r.retry_after_nanos() % 1000, 0, "retry-after in whole µs");
    let retry = r.retry_after_nanos() / 1000;
    let (low, high) = (free_at_us.saturating_sub(t1), free_at_us.saturating_sub(t0));
    assert!(
        low <= retry && retry <= high,
        "retry-after {retry} µs outside [{low}, {high}]"
    );
    assert_eq!(dump(con, &key), before, "a rejection changed the key");
    let ttl_after: i64 = con.pttl(&key).unwrap();
    assert!(ttl_after <= ttl_before, "a rejection refreshed the TTL");
    r
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

#[tokio::test]
async fn fixed_window_limit_retry_after_and_free_rejections() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_millis(400);
    let limiter = limiter(
        &server,
        Algorithm::FixedWindow { limit: 3, window },
        FailurePolicy::FailClosed,
    )
    .await;
    align_to_window(&mut con, window, Duration::from_millis(5));
    let a = limiter.try_acquire_n("alice", 2).await.unwrap();
    assert_eq!(a.remaining(), 1);
    let b = limiter.try_acquire("alice").await.unwrap();
    assert_eq!(b.remaining(), 0);
    let window_end = (b.at_nanos() / 1000 / micros(window) + 1) * micros(window);
    assert_eq!(b.at_nanos() / 1000 + b.reset_after_us(), window_end);
    let r = check_rejection(&limiter, &mut con, "alice", window_end).await;
    assert_eq!(r.limit(), 3);
    // Another subject is independent.
    assert!(limiter.try_acquire("bob").await.is_ok());
    // The next window admits again.
    tokio::time::sleep(r.retry_after() + Duration::from_millis(2)).await;
    let c = limiter.try_acquire_n("alice", 3).await.unwrap();
    assert_eq!(c.remaining(), 0);
    assert_eq!(
        c.at_nanos() / 1000 / micros(window),
        window_end / micros(window)
    );
    // Bob's key went with his window.
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

trait MicrosExt {
    fn reset_after_us(&self) -> u64;
}

impl MicrosExt for Admission {
    fn reset_after_us(&self) -> u64 {
        self.reset_after().as_micros() as u64
    }
}

#[tokio::test]
async fn sliding_window_is_exact_on_redis_times() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_millis(300);
    let limiter = limiter(
        &server,
        Algorithm::SlidingWindow { limit: 3, window },
        FailurePolicy::FailClosed,
    )
    .await;
    let first = limiter.try_acquire("s").await.unwrap();
    assert_eq!(first.remaining(), 2);
    assert_eq!(first.reset_after(), window);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = limiter.try_acquire_n("s", 2).await.unwrap();
    assert_eq!(second.remaining(), 0);
    // The oldest permit leaves the window at first.at + window.
    let free_at = first.at_nanos() / 1000 + micros(window);
    check_rejection(&limiter, &mut con, "s", free_at).await;
    // Two permits need the second admission's permits to leave too.
    let t0 = redis_now(&mut con);
    let r2 = rejection(limiter.try_acquire_n("s", 2).await);
    let t1 = redis_now(&mut con);
    let free2 = second.at_nanos() / 1000 + micros(window);
    let retry = r2.retry_after_nanos() / 1000;
    assert!(free2 - t1 <= retry && retry <= free2 - t0);
    // The log holds one member per admitted permit, never more than the limit.
    let members: u64 = con.zcard(limiter.key("s")).unwrap();
    assert_eq!(members, 3);
    // Once the first permit has left, exactly one more fits.
    let now = redis_now(&mut con);
    tokio::time::sleep(
        Duration::from_micros(free_at.saturating_sub(now)) + Duration::from_millis(2),
    )
    .await;
    let third = limiter.try_acquire("s").await.unwrap();
    assert_eq!(third.remaining(), 0);
    assert!(third.at_nanos() / 1000 >= free_at);
    rejection(limiter.try_acquire("s").await);
    let members: u64 = con.zcard(limiter.key("s")).unwrap();
    assert_eq!(members, 3, "expired members are trimmed on admission");
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

#[tokio::test]
async fn token_bucket_is_gcra_on_redis_times() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // 10 per second: one permit every 100,000 µs; bursts of 3.
    let limiter = limiter(
        &server,
        Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 3,
        },
        FailurePolicy::FailClosed,
    )
    .await;
    let a = limiter.try_acquire_n("k", 3).await.unwrap();
    assert_eq!(a.remaining(), 0);
    assert_eq!(a.reset_after(), Duration::from_millis(300));
    // TAT = at + 300 ms; one more permit fits once TAT − now ≤ 200 ms.
    let tat = a.at_nanos() / 1000 + 300_000;
    check_rejection(&limiter, &mut con, "k", tat - 200_000).await;
    let stored: String = con.get(limiter.key("k")).unwrap();
    assert_eq!(
        stored,
        format!("{tat}:300000"),
        "the key holds the TAT and the capacity it was written under, in µs"
    );
    // The key expires when the bucket is full again: at TAT, rounded up to the millisecond.
    let expires: u64 = redis::cmd("PEXPIRETIME")
        .arg(limiter.key("k"))
        .query(&mut con)
        .unwrap();
    assert_eq!(expires, tat.div_ceil(1000));
    // More than the burst can never fit.
    assert_eq!(
        limiter.try_acquire_n("k", 4).await,
        Err(TryAcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    );
    let now = redis_now(&mut con);
    tokio::time::sleep(
        Duration::from_micros((tat - 200_000).saturating_sub(now)) + Duration::from_millis(2),
    )
    .await;
    let b = limiter.try_acquire("k").await.unwrap();
    assert_eq!(b.remaining(), 0);
    assert_eq!(b.at_nanos() / 1000 + b.reset_after_us(), tat + 100_000);
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

#[tokio::test]
async fn sliding_counter_weighs_the_previous_window() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_millis(400);
    let w = micros(window);
    let limiter = limiter(
        &server,
        Algorithm::SlidingCounter { limit: 4, window },
        FailurePolicy::FailClosed,
    )
    .await;
    align_to_window(&mut con, window, Duration::from_millis(5));
    let a = limiter.try_acquire_n("c", 4).await.unwrap();
    assert_eq!(a.remaining(), 0);
    let start = a.at_nanos() / 1000 / w * w;
    assert_eq!(a.at_nanos() / 1000 + a.reset_after_us(), start + 2 * w);
    // cur = 4, prev = 0: one permit fits in the next window once 4·(W − e) ≤ 3·W, that is
    // e ≥ W − ⌊3W/4⌋.
    let free_at = start + w + (w - 3 * w / 4);
    check_rejection(&limiter, &mut con, "c", free_at).await;
    let now = redis_now(&mut con);
    tokio::time::sleep(Duration::from_micros(free_at - now) + Duration::from_millis(2)).await;
    let b = limiter.try_acquire("c").await.unwrap();
    assert!(b.at_nanos() / 1000 >= free_at);
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

#[tokio::test]
async fn probes_take_nothing() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // Hour-long windows, with 10 s of the current one left: no fixed window ends (and no key
    // goes) before the count of keys at the end.
    let window = Duration::from_secs(3600);
    room_in_window(&mut con, window, Duration::from_secs(10));
    for algorithm in common::all_algorithms(2, window) {
        let limiter = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
        let subject = format!("{algorithm:?}");
        let probe = limiter.try_acquire_n(&subject, 0).await.unwrap();
        assert_eq!(probe.remaining(), 2, "{algorithm:?}");
        assert_eq!(
            dump(&mut con, &limiter.key(&subject)),
            None,
            "{algorithm:?}"
        );
        limiter.try_acquire_n(&subject, 2).await.unwrap();
        let state = dump(&mut con, &limiter.key(&subject));
        rejection(limiter.try_acquire_n(&subject, 0).await);
        assert_eq!(
            dump(&mut con, &limiter.key(&subject)),
            state,
            "{algorithm:?}"
        );
    }
    assert_eq!(assert_all_keys_expire(&mut con).len(), 4);
}

#[tokio::test]
async fn keys_found_without_a_ttl_are_repaired() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // The fixed window's admission and rejection in one window.
    room_in_window(&mut con, Duration::from_secs(5), Duration::from_secs(2));
    for algorithm in common::all_algorithms(1, Duration::from_secs(5)) {
        let limiter = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
        let subject = format!("{algorithm:?}");
        let key = limiter.key(&subject);
        limiter.try_acquire(&subject).await.unwrap();
        let _: bool = con.persist(&key).unwrap();
        assert_eq!(con.pttl::<_, i64>(&key).unwrap(), -1);
        // A rejection, which otherwise writes nothing, gives the key its TTL back.
        rejection(limiter.try_acquire(&subject).await);
        let ttl: i64 = con.pttl(&key).unwrap();
        // Up to two windows for the sliding counter (it needs the previous window's count).
        assert!(ttl > 0 && ttl <= 10_000, "{algorithm:?}: PTTL {ttl}");
    }
    assert_eq!(assert_all_keys_expire(&mut con).len(), 4);
}

/// A key holding what no script writes (a foreign writer, a hand edit, a corrupt restore) is read
/// as no state and overwritten, and counted in `stats().repaired`: a window of length 0, a
/// negative or fractional count, a time beyond 2^53 or not a number, a bucket of capacity 0, a
/// log member that never expires, a key of another type. Each made every call fail (or a
/// negative count admit beyond the limit) until someone deleted the key. Decisions, charges
/// and chains alike.
#[tokio::test]
async fn unreadable_state_is_read_as_none_and_overwritten() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    // Each case counts 2, 1, 0 left, then a rejection, in hour-long fixed windows and sliding
    // counters aligned to Redis's clock: no hour may end among them.
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let h = "3600000000";
    let corruptions: Vec<(Algorithm, Vec<Vec<&str>>)> = vec![
        (
            Algorithm::FixedWindow {
                limit: 3,
                window: hour,
            },
            vec![
                vec!["HSET", "{key}", "w", "{now}", "l", "0", "c", "1"],
                vec!["HSET", "{key}", "w", "{now}", "l", h, "c", "-5"],
                vec!["HSET", "{key}", "w", "{now}", "l", h, "c", "1.5"],
                vec!["HSET", "{key}", "w", "inf", "l", h, "c", "0"],
                vec!["HSET", "{key}", "w", "{now}", "l", "nan", "c", "0"],
                vec![
                    "HSET",
                    "{key}",
                    "w",
                    "99999999999999999999",
                    "l",
                    h,
                    "c",
                    "0",
                ],
                vec!["SET", "{key}", "x"],
            ],
        ),
        (
            Algorithm::SlidingCounter {
                limit: 3,
                window: hour,
            },
            vec![
                vec!["HSET", "{key}", "w", "{now}", "l", "0", "c", "1", "p", "0"],
                vec!["HSET", "{key}", "w", "{now}", "l", h, "c", "0", "p", "-1"],
                vec!["HSET", "{key}", "w", "{now}", "l", h, "c", "-2", "p", "0"],
                vec!["HSET", "{key}", "w", "-inf", "l", h, "c", "0", "p", "0"],
                vec!["RPUSH", "{key}", "x"],
            ],
        ),
        (
            Algorithm::TokenBucket {
                rate: Rate::new(3, hour),
                burst: 3,
            },
            vec![
                vec!["SET", "{key}", "{now}:0"],
                vec!["SET", "{key}", "99999999999999999999:3600000000"],
                vec!["SET", "{key}", "99999999999999999999"],
                vec!["SET", "{key}", "nan"],
                vec!["HSET", "{key}", "w", "1"],
            ],
        ),
        (
            Algorithm::SlidingWindow {
                limit: 3,
                window: hour,
            },
            vec![
                vec!["ZADD", "{key}", "inf", "a"],
                vec!["ZADD", "{key}", "1e300", "a"],
                vec!["SET", "{key}", "x"],
            ],
        ),
    ];
    let mut case = 0;
    for (algorithm, corruptions) in corruptions {
        let limiter = RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
            .prefix(PREFIX)
            .deny_cache(0)
            .build(manager(&server).await)
            .unwrap();
        let chain = RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
            .and_limit(Algorithm::FixedWindow {
                limit: 10,
                window: hour,
            })
            .prefix(PREFIX)
            .deny_cache(0)
            .build(manager(&server).await)
            .unwrap();
        let count = corruptions.len() as u64;
        for corruption in corruptions {
            // A decision, a charge and a chain's decision each meet the corrupt key.
            for way in 0..3 {
                case += 1;
                let subject = format!("s{case}");
                let key = match way {
                    2 => chain.keys(&subject).remove(0),
                    _ => limiter.key(&subject),
                };
                let now = (redis_now(&mut con) - 1_000_000).to_string();
                let mut cmd = redis::cmd(corruption[0]);
                for arg in &corruption[1..] {
                    match *arg {
                        "{key}" => cmd.arg(&key),
                        "{now}" => cmd.arg(&now),
                        other => cmd.arg(other),
                    };
                }
                let () = cmd.query(&mut con).unwrap();
                let what = format!("{algorithm:?} {corruption:?} way {way}");
                let first = match way {
                    0 => limiter.try_acquire(&subject).await,
                    1 => Ok(limiter.charge(&subject, 1).await.expect(&what)),
                    _ => chain.try_acquire(&subject).await,
                };
                assert_eq!(first.map(|a| a.remaining()), Ok(2), "{what}");
                // Rewritten as this limiter's state: counted on from there.
                let by = if way == 2 { &chain } else { &limiter };
                for left in [1, 0] {
                    assert_eq!(
                        by.try_acquire(&subject).await.map(|a| a.remaining()),
                        Ok(left),
                        "{what}"
                    );
                }
                rejection(by.try_acquire(&subject).await);
            }
        }
        // Counted once each, where found (a charge too), never again once rewritten.
        assert_eq!(limiter.stats().repaired, 2 * count, "{algorithm:?}");
        assert_eq!(chain.stats().repaired, count, "{algorithm:?}");
    }
    assert!(!assert_all_keys_expire(&mut con).is_empty());
}

/// Every admission leaves its key expiring at the millisecond its state becomes a missing key's
/// (the admission's time plus its `reset_after`, rounded up), an absolute time on Redis's clock.
/// A TTL instead (`PEXPIRE key 1` in a window's last millisecond) was deleted at once when
/// Redis's millisecond clock ticked inside the call, about 1 call in 30,000 on Redis 7.0,
/// losing the admission.
#[tokio::test]
async fn keys_expire_at_the_millisecond_their_state_ends() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // Windows of a few milliseconds: the calls land at every point of a window, the last
    // millisecond included.
    for algorithm in common::all_algorithms(1_000, Duration::from_micros(3_700)) {
        let limiter = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
        for i in 0..200 {
            let subject = format!("{algorithm:?}/{}", i % 3);
            let admission = limiter.try_acquire(&subject).await.unwrap();
            let end_us = (admission.at_nanos() + admission.reset_after().as_nanos() as u64) / 1000;
            let expires: i64 = redis::cmd("PEXPIRETIME")
                .arg(limiter.key(&subject))
                .query(&mut con)
                .unwrap();
            let due = end_us.div_ceil(1000) as i64;
            // A key whose time has come may be gone when we look (-2): then its time must have
            // passed on Redis's clock (a nearly full bucket lives for microseconds).
            if expires == -2 {
                let now_ms = (redis_now(&mut con) / 1000) as i64;
                assert!(
                    now_ms >= due,
                    "{algorithm:?}, call {i}: gone before {due} ms, now {now_ms} ms"
                );
                continue;
            }
            assert_eq!(expires, due, "{algorithm:?}, call {i}: {admission:?}");
        }
    }
}

#[tokio::test]
async fn long_subjects_are_hashed_into_the_tag() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(5),
        },
        FailurePolicy::FailClosed,
    )
    .await;
    // The rejection and the two keys counted need one 5 s window (aligned to Redis's clock).
    room_in_window(&mut con, Duration::from_secs(5), Duration::from_secs(2));
    let long = "x".repeat(1000);
    let other = format!("{long}y");
    limiter.try_acquire(&long).await.unwrap();
    rejection(limiter.try_acquire(&long).await);
    limiter.try_acquire(&other).await.unwrap();
    let keys = assert_all_keys_expire(&mut con);
    assert_eq!(keys.len(), 2);
    for key in keys {
        assert!(
            key.starts_with("t:{sha256:") && key.len() == "t:{}:fw".len() + 71,
            "{key}"
        );
    }
}

/// Subjects are bytes, whatever they hold: spaces, braces (the hash tag's delimiters), NUL,
/// CR LF, bytes that are no UTF-8, one of a megabyte. Each counts on its own for every
/// algorithm (two subjects whose tags Redis cuts alike, `a}b` and `a}c`, too), and every key
/// they leave has a TTL.
#[tokio::test]
async fn subjects_of_any_bytes_count_apart() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let subjects: Vec<Vec<u8>> = [
        &b""[..],
        b" ",
        b"a b",
        b"{",
        b"}",
        b"{}",
        b"}{",
        b"a}b",
        b"a}c",
        b"\0",
        b"\r\n",
        &[0xff; 64],
        &[0xff; 65],
    ]
    .iter()
    .map(|s| s.to_vec())
    .chain([vec![b'{'; 1 << 20]])
    .collect();
    for algorithm in common::all_algorithms(2, hour) {
        let limiter = RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
            .prefix(PREFIX)
            .deny_cache(0)
            // The megabyte's SHA-256, unoptimised in a debug build, is part of the decision.
            .deadline(Duration::from_secs(5))
            .build(manager(&server).await)
            .unwrap();
        for subject in &subjects {
            let what = format!("{algorithm:?}, {:?}", &subject[..subject.len().min(8)]);
            let first = limiter.try_acquire(subject).await;
            assert_eq!(first.map(|a| a.remaining()), Ok(1), "{what}");
            let second = limiter.try_acquire(subject).await;
            assert_eq!(second.map(|a| a.remaining()), Ok(0), "{what}");
            rejection(limiter.try_acquire(subject).await);
        }
        assert_eq!(limiter.stats().errors, 0, "{algorithm:?}");
        for subject in &subjects {
            let ttl: i64 = con.pttl(limiter.key(subject)).unwrap();
            assert!(ttl > 0, "{algorithm:?}: {ttl}");
        }
    }
}

/// An exact sliding window at its largest limit, [`REDIS_MAX_SLIDING_LIMIT`]: one call for the
/// whole limit is admitted (its members added in batches, within Lua's stack), a charge of
/// 2^32 − 1 after it keeps exactly `limit` members, and the next call is rejected until the
/// first of them expires.
#[tokio::test]
async fn a_sliding_window_at_its_largest_limit_takes_and_charges_it_whole() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limit = REDIS_MAX_SLIDING_LIMIT;
    let window = Duration::from_secs(60);
    let limiter = RedisLimiter::builder(
        Algorithm::SlidingWindow { limit, window },
        FailurePolicy::FailClosed,
    )
    .prefix(PREFIX)
    // 100,000 members take a debug build's test run some 100 ms.
    .deadline(Duration::from_secs(20))
    .build(manager(&server).await)
    .unwrap();
    let key = limiter.key("s");
    let taken = limiter.try_acquire_n("s", limit).await.unwrap();
    assert_eq!((taken.remaining(), taken.reset_after()), (0, window));
    let members: u64 = con.zcard(&key).unwrap();
    assert_eq!(members, u64::from(limit));
    let charged = limiter.charge("s", u32::MAX).await.unwrap();
    assert_eq!(charged.remaining(), 0);
    let members: u64 = con.zcard(&key).unwrap();
    assert_eq!(members, u64::from(limit));
    let r = rejection(limiter.try_acquire("s").await);
    assert!(r.retry_after() <= window, "{r:?}");
    assert_eq!(r.limit(), limit);
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

#[tokio::test]
async fn one_command_per_decision_and_two_after_script_flush() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::TokenBucket {
            rate: Rate::per_second(1000),
            burst: 1000,
        },
        FailurePolicy::FailClosed,
    )
    .await;
    // First call ever: the script is not cached yet.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    limiter.try_acquire("a").await.unwrap();
    let calls = command_calls(&mut con);
    assert_eq!(calls.get("evalsha"), Some(&1));
    assert_eq!(calls.get("eval"), Some(&1));
    for _ in 0..100 {
        limiter.try_acquire("a").await.unwrap();
    }
    let calls = command_calls(&mut con);
    assert_eq!(calls.get("evalsha"), Some(&101), "one EVALSHA per decision");
    assert_eq!(calls.get("eval"), Some(&1));
    // Redis loses its scripts: the next call costs EVALSHA (NOSCRIPT) + EVAL, then one again.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    limiter.try_acquire("a").await.unwrap();
    limiter.try_acquire("a").await.unwrap();
    let calls = command_calls(&mut con);
    assert_eq!(calls.get("evalsha"), Some(&2));
    assert_eq!(calls.get("eval"), Some(&1));
    // Redis also counts the commands a script calls (TIME, GET, SET): no other command came
    // from the client.
    for name in calls.keys() {
        assert!(
            matches!(
                name.as_str(),
                "evalsha" | "eval" | "config|resetstat" | "time" | "get" | "set"
            ),
            "unexpected command {name}: {calls:?}"
        );
    }
    assert_eq!(limiter.stats().admitted, 103);
    assert_all_keys_expire(&mut con);
}

#[tokio::test]
async fn the_deny_cache_answers_without_a_round_trip() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::TokenBucket {
            rate: Rate::per_second(4),
            burst: 2,
        },
        FailurePolicy::FailClosed,
    )
    .await;
    limiter.try_acquire_n("d", 2).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let first = rejection(limiter.try_acquire("d").await);
    for _ in 0..50 {
        let r = rejection(limiter.try_acquire("d").await);
        assert!(r.retry_after() <= first.retry_after());
        assert_eq!(r.limit(), 2);
    }
    // Another subject still goes to Redis.
    limiter.try_acquire("e").await.unwrap();
    let calls = command_calls(&mut con);
    assert_eq!(calls.get("evalsha"), Some(&2), "{calls:?}");
    let stats = limiter.stats();
    assert_eq!((stats.rejected, stats.denied_locally), (1, 50));
    assert_eq!(limiter.denied_subjects(), 1);
    // Once the retry-after has passed, the subject is admitted at once (never stricter).
    tokio::time::sleep(first.retry_after()).await;
    limiter.try_acquire("d").await.unwrap();
    assert_all_keys_expire(&mut con);
}

#[tokio::test]
async fn acquire_waits_for_the_retry_after() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::TokenBucket {
            rate: Rate::per_second(20),
            burst: 1,
        },
        FailurePolicy::FailClosed,
    )
    .await;
    let started = Instant::now();
    let mut times = Vec::new();
    for _ in 0..5 {
        times.push(limiter.acquire("w").await.unwrap().at_nanos() / 1000);
    }
    let elapsed = started.elapsed();
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= 50_000,
            "spacing {} µs",
            pair[1] - pair[0]
        );
    }
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(600), "{elapsed:?}");
    assert_eq!(
        limiter.acquire_n("w", 2).await,
        Err(AcquireError::InsufficientCapacity {
            requested: 2,
            capacity: 1
        })
    );
    assert_all_keys_expire(&mut con);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_tasks_never_over_admit() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_millis(200);
    let limit = 25;
    let run = Duration::from_millis(1200);
    for algorithm in common::all_algorithms(limit, window) {
        let limiter = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
        let stop = Instant::now() + run;
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let mut admitted = Vec::new();
                    while Instant::now() < stop {
                        let n = 1 + (i % 2);
                        match limiter.try_acquire_n("audit", n).await {
                            Ok(a) => admitted.push((a.at_nanos(), u64::from(n))),
                            Err(TryAcquireError::Rejected(_)) => {
                                tokio::time::sleep(Duration::from_millis(1)).await
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut admissions = Vec::new();
        for task in tasks {
            admissions.extend(task.await.unwrap());
        }
        admissions.sort_unstable();
        let total: u64 = admissions.iter().map(|a| a.1).sum();
        let violations = common::violations(algorithm, &admissions);
        assert_eq!(violations, 0, "{algorithm:?}: {total} admitted");
        // Not vacuous: the limit was actually reached most of the time.
        let windows = (run.as_millis() / window.as_millis()) as u64;
        assert!(
            total >= u64::from(limit) * (windows - 1) / 2,
            "{algorithm:?}: only {total} admitted in {windows} windows"
        );
        let stats = limiter.stats();
        assert_eq!(stats.errors + stats.timeouts, 0);
    }
    assert_all_keys_expire(&mut con);
}

/// Each decision ends within its deadline (plus scheduling slack) while the server is gone.
async fn timed<T>(deadline: Duration, f: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let out = f.await;
    let took = started.elapsed();
    assert!(
        took <= deadline + Duration::from_millis(100),
        "a decision took {took:?} with a deadline of {deadline:?}"
    );
    out
}

/// `fallback_max_keys` bounds the subjects the local fallback counts while Redis is away: at
/// the cap with every subject active, a new one gets `TooManyKeys`; the ones counted go on being
/// decided there, and a reconfiguration keeps the cap.
#[tokio::test]
async fn the_fallback_counts_at_most_fallback_max_keys_subjects() {
    let mut server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    let fw = Algorithm::FixedWindow {
        limit: 4,
        window: Duration::from_secs(60),
    };
    let limiter = RedisLimiter::builder(fw, FailurePolicy::Fallback { share: 0.5 })
        .prefix(PREFIX)
        .deadline(deadline)
        .fallback_max_keys(2)
        .build(manager(&server).await)
        .unwrap();
    server.kill();
    for subject in ["a", "b"] {
        timed(deadline, limiter.try_acquire(subject)).await.unwrap();
    }
    assert!(matches!(
        timed(deadline, limiter.try_acquire("c")).await,
        Err(TryAcquireError::TooManyKeys { .. })
    ));
    timed(deadline, limiter.try_acquire("a")).await.unwrap();
    limiter
        .reconfigure(Algorithm::FixedWindow {
            limit: 6,
            window: Duration::from_secs(60),
        })
        .unwrap();
    assert!(matches!(
        timed(deadline, limiter.try_acquire("c")).await,
        Err(TryAcquireError::TooManyKeys { .. })
    ));
    // a's two still count under the new share of 3.
    timed(deadline, limiter.try_acquire("a")).await.unwrap();
    rejection(timed(deadline, limiter.try_acquire("a")).await);
}

#[tokio::test]
async fn failure_policies_with_the_server_killed_then_back() {
    let mut server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    let fw = Algorithm::FixedWindow {
        limit: 4,
        window: Duration::from_secs(60),
    };
    let build = |policy| {
        let server = &server;
        async move {
            RedisLimiter::builder(fw, policy)
                .prefix(PREFIX)
                .deadline(deadline)
                .build(manager(server).await)
                .unwrap()
        }
    };
    let open = build(FailurePolicy::FailOpen).await;
    let closed = build(FailurePolicy::FailClosed).await;
    let fallback = build(FailurePolicy::Fallback { share: 0.5 }).await;
    open.try_acquire("x").await.unwrap();
    server.kill();
    for _ in 0..3 {
        let a = timed(deadline, open.try_acquire("x")).await.unwrap();
        assert_eq!(a.remaining(), 4);
        assert_eq!(
            timed(deadline, closed.try_acquire("x")).await,
            Err(TryAcquireError::Unavailable)
        );
    }
    // The fallback admits half the global limit locally, then rejects.
    timed(deadline, fallback.try_acquire("x")).await.unwrap();
    timed(deadline, fallback.try_acquire("x")).await.unwrap();
    rejection(timed(deadline, fallback.try_acquire("x")).await);
    assert_eq!(
        timed(deadline, closed.acquire("x")).await,
        Err(AcquireError::Unavailable)
    );
    let s = open.stats();
    assert_eq!(
        (s.admitted, s.failed_open, s.errors + s.timeouts),
        (1, 3, 3)
    );
    let s = closed.stats();
    assert_eq!((s.failed_closed, s.errors + s.timeouts), (4, 4));
    let s = fallback.stats();
    assert_eq!((s.fallbacks, s.admitted), (3, 0));

    // Recovery is automatic: once the server is back, decisions go to Redis again.
    server.restart();
    let started = Instant::now();
    loop {
        match closed.try_acquire("y").await {
            Ok(_) => break,
            Err(TryAcquireError::Unavailable) => {
                assert!(started.elapsed() < Duration::from_secs(10), "no recovery");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    fallback.try_acquire("y").await.unwrap();
    assert_eq!(fallback.stats().admitted, 1);
    assert_all_keys_expire(&mut server.connection());
}

/// Redis away, back, then away again within one window: the fallback keeps what it admitted
/// during the first outage (nothing resets it when Redis answers again), so the subject gets at
/// most the limit in Redis plus its share in the fallback over the window, not its share again
/// with each outage.
#[tokio::test]
async fn a_fallback_spent_in_one_outage_stays_spent_in_the_next() {
    let mut server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut server.connection(), hour, Duration::from_secs(60));
    let deadline = Duration::from_millis(100);
    let limiter = RedisLimiter::builder(
        Algorithm::FixedWindow {
            limit: 4,
            window: hour,
        },
        FailurePolicy::Fallback { share: 0.5 },
    )
    .prefix(PREFIX)
    .deadline(deadline)
    .deny_cache(0)
    .build(manager(&server).await)
    .unwrap();
    let mut admitted = 0;
    let mut take = async |limiter: &RedisLimiter, times: u32| {
        for _ in 0..times {
            if timed(deadline, limiter.try_acquire("x")).await.is_ok() {
                admitted += 1;
            }
        }
    };
    server.kill();
    take(&limiter, 4).await;
    server.restart();
    // Until Redis answers again (a probe Redis admits counts as admitted).
    let started = Instant::now();
    while limiter.stats().admitted == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "no recovery");
        let _ = limiter.try_acquire_n("y", 0).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    take(&limiter, 6).await;
    server.kill();
    take(&limiter, 4).await;
    assert_eq!(admitted, 4 + 2, "the limit in Redis and the share once");
    let s = limiter.stats();
    assert_eq!((s.admitted, s.rejected), (1 + 4, 2), "{s:?}");
}

#[tokio::test]
async fn a_black_hole_times_out_within_the_deadline_and_recovers() {
    let server = RedisServer::start();
    let deadline = Duration::from_millis(80);
    let limiter = RedisLimiter::builder(
        Algorithm::SlidingWindow {
            limit: 100,
            window: Duration::from_secs(30),
        },
        FailurePolicy::Fallback { share: 0.1 },
    )
    .prefix(PREFIX)
    .deadline(deadline)
    .build(manager(&server).await)
    .unwrap();
    limiter.try_acquire("z").await.unwrap();
    server.pause();
    for _ in 0..10 {
        timed(deadline, limiter.try_acquire("z")).await.unwrap();
    }
    rejection(timed(deadline, limiter.try_acquire("z")).await);
    let s = limiter.stats();
    assert_eq!((s.timeouts, s.fallbacks), (11, 11));
    server.resume();
    // The requests that timed out may still run now (they were sent): that is why a timed-out
    // decision is never retried. The server answers again at once.
    let a = limiter.try_acquire("z").await.unwrap();
    let members: u64 = server.connection().zcard(limiter.key("z")).unwrap();
    assert!((2..=13).contains(&members), "{members} members");
    assert_eq!(u64::from(a.remaining()), 100 - members);
    assert_eq!(limiter.stats().admitted, 2);
    assert_all_keys_expire(&mut server.connection());
}

#[tokio::test]
async fn bad_configuration_is_a_typed_error() {
    let server = RedisServer::start();
    let fw = Algorithm::FixedWindow {
        limit: 1,
        window: Duration::from_secs(1),
    };
    let m = manager(&server).await;
    let err = RedisLimiter::builder(fw, FailurePolicy::Fallback { share: f64::NAN })
        .build(m.clone())
        .unwrap_err();
    assert!(err.to_string().contains("fallback share"), "{err}");
    let err = RedisLimiter::builder(fw, FailurePolicy::FailOpen)
        .prefix("}")
        .build(m.clone())
        .unwrap_err();
    assert!(err.to_string().contains("key prefix"), "{err}");
    let err = RedisLimiter::builder(
        Algorithm::SlidingWindow {
            limit: turnstile::REDIS_MAX_SLIDING_LIMIT + 1,
            window: Duration::from_secs(1),
        },
        FailurePolicy::FailOpen,
    )
    .build(m)
    .unwrap_err();
    assert!(err.to_string().contains("too large"), "{err}");
}

/// A chain of two limits (1 per hour, and a bucket of 5) on `client`'s cluster: its one script
/// touches two keys of each subject, so it runs only if they share a slot. The tests expect
/// the fixed window to reject a subject's second call: it is an hour long, and they make room
/// for themselves in it (`room_in_window`); a 5 s window ended within them about one run in 20.
async fn cluster_chain(
    client: &redis::cluster::ClusterClient,
) -> RedisLimiter<redis::cluster_async::ClusterConnection> {
    RedisLimiter::builder(
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        },
        FailurePolicy::FailClosed,
    )
    .and_limit(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 5,
    })
    .prefix(PREFIX)
    .deadline(Duration::from_millis(500))
    .build(client.get_async_connection().await.unwrap())
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_subjects_spread_over_masters_and_decide_in_one_script() {
    let cluster = redis_server::RedisCluster::start(3);
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let connection = client.get_async_connection().await.unwrap();
    let limiter = RedisLimiter::builder(
        Algorithm::SlidingWindow {
            limit: 2,
            window: Duration::from_secs(5),
        },
        FailurePolicy::FailClosed,
    )
    .prefix(PREFIX)
    .deadline(Duration::from_millis(500))
    .build(connection)
    .unwrap();
    let subjects: Vec<String> = (0..30).map(|i| format!("tenant-{i}")).collect();
    for subject in &subjects {
        limiter.try_acquire(subject).await.unwrap();
        limiter.try_acquire(subject).await.unwrap();
        let r = rejection(limiter.try_acquire(subject).await);
        assert!(r.retry_after() <= Duration::from_secs(5));
    }
    // Every master holds some subjects' keys, each with a TTL, and each subject's key is on the
    // master that owns its slot.
    let mut total = 0;
    for node in &cluster.nodes {
        let mut con = node.connection();
        let keys = assert_all_keys_expire(&mut con);
        assert!(!keys.is_empty(), "a master holds no subject");
        for key in &keys {
            let members: u64 = con.zcard(key).unwrap();
            assert_eq!(members, 2, "{key}");
        }
        total += keys.len();
    }
    assert_eq!(total, subjects.len());
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.errors), (60, 30, 0));

    // A chain's keys share the subject's slot, so its one script runs on one master.
    let chain = cluster_chain(&client).await;
    let hour = Duration::from_secs(3600);
    room_in_window(
        &mut cluster.nodes[0].connection(),
        hour,
        Duration::from_secs(60),
    );
    for subject in &subjects {
        chain.try_acquire(subject).await.unwrap();
        assert_eq!(rejection(chain.try_acquire(subject).await).limit(), 1);
    }
    assert_eq!(chain.stats().errors, 0);
    // So does a reset's one DEL of both keys: routed to that master, no CROSSSLOT.
    for subject in &subjects[..5] {
        assert_eq!(chain.reset(subject).await, Ok(true));
        chain.try_acquire(subject).await.unwrap();
    }
    assert_eq!(chain.reset("nobody").await, Ok(false));
    // A charge to every limit runs in one script too.
    for subject in &subjects[..5] {
        chain.charge(subject, 3).await.unwrap();
        assert_eq!(rejection(chain.try_acquire(subject).await).limit(), 1);
    }
    for node in &cluster.nodes {
        assert_all_keys_expire(&mut node.connection());
    }
}

/// The parameters of the cross-process audit, shared by the parent and its workers.
const AUDIT_LIMIT: u32 = 40;
const AUDIT_WINDOW: Duration = Duration::from_millis(250);

fn audit_algorithm(name: &str) -> Algorithm {
    match name {
        "fixed" => Algorithm::FixedWindow {
            limit: AUDIT_LIMIT,
            window: AUDIT_WINDOW,
        },
        "sliding" => Algorithm::SlidingWindow {
            limit: AUDIT_LIMIT,
            window: AUDIT_WINDOW,
        },
        "counter" => Algorithm::SlidingCounter {
            limit: AUDIT_LIMIT,
            window: AUDIT_WINDOW,
        },
        _ => Algorithm::TokenBucket {
            rate: Rate::new(AUDIT_LIMIT, AUDIT_WINDOW),
            burst: AUDIT_LIMIT,
        },
    }
}

/// Not a test of its own: the worker process of `three_processes_never_over_admit`, which runs
/// this test binary again with `TURNSTILE_AUDIT_URL` set. Without it, there is nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cross_process_worker() {
    let (Ok(url), Ok(name), Ok(millis)) = (
        std::env::var("TURNSTILE_AUDIT_URL"),
        std::env::var("TURNSTILE_AUDIT_ALGORITHM"),
        std::env::var("TURNSTILE_AUDIT_MILLIS"),
    ) else {
        return;
    };
    let connection = ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let limiter = RedisLimiter::builder(audit_algorithm(&name), FailurePolicy::FailClosed)
        .prefix(PREFIX)
        .deadline(Duration::from_secs(1))
        .build(connection)
        .unwrap();
    let stop = Instant::now() + Duration::from_millis(millis.parse().unwrap());
    let tasks: Vec<_> = (0..8u32)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                while Instant::now() < stop {
                    let n = 1 + i % 3;
                    match limiter.try_acquire_n("shared", n).await {
                        Ok(a) => admitted.push((a.at_nanos(), n)),
                        Err(TryAcquireError::Rejected(_)) => {
                            tokio::time::sleep(Duration::from_micros(500)).await
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                admitted
            })
        })
        .collect();
    let mut out = String::new();
    for task in tasks {
        for (at, n) in task.await.unwrap() {
            out.push_str(&format!("ADMIT {at} {n}\n"));
        }
    }
    print!("{out}");
}

#[test]
fn three_processes_never_over_admit() {
    let server = RedisServer::start();
    let run = Duration::from_millis(1500);
    for name in ["sliding", "fixed", "counter", "bucket"] {
        let workers: Vec<_> = (0..3)
            .map(|_| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "cross_process_worker", "--nocapture"])
                    .env("TURNSTILE_AUDIT_URL", server.url())
                    .env("TURNSTILE_AUDIT_ALGORITHM", name)
                    .env("TURNSTILE_AUDIT_MILLIS", run.as_millis().to_string())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut admissions = Vec::new();
        let mut per_process = Vec::new();
        for worker in workers {
            let output = worker.wait_with_output().unwrap();
            assert!(output.status.success(), "a worker failed");
            let text = String::from_utf8(output.stdout).unwrap();
            let mut permits = 0;
            for line in text.lines().filter_map(|l| l.strip_prefix("ADMIT ")) {
                let (at, n) = line.split_once(' ').unwrap();
                let n: u64 = n.parse().unwrap();
                permits += n;
                admissions.push((at.parse::<u64>().unwrap(), n));
            }
            per_process.push(permits);
        }
        admissions.sort_unstable();
        let algorithm = audit_algorithm(name);
        let violations = common::violations(algorithm, &admissions);
        let total: u64 = per_process.iter().sum();
        assert_eq!(violations, 0, "{name}: per process {per_process:?}");
        // Every process got a share, and together they used the limit.
        assert!(
            per_process.iter().all(|&p| p > 0),
            "{name}: {per_process:?}"
        );
        let windows = (run.as_millis() / AUDIT_WINDOW.as_millis()) as u64;
        assert!(
            total >= u64::from(AUDIT_LIMIT) * (windows - 1) / 2,
            "{name}: only {total} permits in {windows} windows"
        );
    }
    assert_all_keys_expire(&mut server.connection());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_load_kill_restart_black_hole_and_script_flush_keep_deadlines_and_recover() {
    let mut server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    let limiter = RedisLimiter::builder(
        Algorithm::TokenBucket {
            rate: Rate::per_second(2_000),
            burst: 100,
        },
        FailurePolicy::FailClosed,
    )
    .prefix(PREFIX)
    .deadline(deadline)
    .build(manager(&server).await)
    .unwrap();
    let stop = Instant::now() + Duration::from_millis(2600);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                // (when the call started, how long it took, admitted, unavailable)
                let mut calls = Vec::new();
                while Instant::now() < stop {
                    let started = Instant::now();
                    let out = limiter.try_acquire("load").await;
                    let unavailable = out == Err(TryAcquireError::Unavailable);
                    calls.push((started, started.elapsed(), out.is_ok(), unavailable));
                    match out {
                        Ok(_) | Err(TryAcquireError::Rejected(_)) => {}
                        Err(TryAcquireError::Unavailable) => {
                            tokio::time::sleep(Duration::from_millis(5)).await
                        }
                        Err(e) => panic!("{e}"),
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                calls
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.restart();
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    server.pause();
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.resume();
    let resumed = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Redis loses its scripts under load: the next calls reload them and none fails.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    let flushed = Instant::now();
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(task.await.unwrap());
    }
    let slowest = calls.iter().map(|c| c.1).max().unwrap();
    assert!(
        slowest <= deadline + Duration::from_millis(100),
        "a decision took {slowest:?} (deadline {deadline:?})"
    );
    let stats = limiter.stats();
    assert!(stats.errors + stats.timeouts > 0, "{stats:?}");
    assert!(
        stats.timeouts > 0,
        "the paused server caused timeouts: {stats:?}"
    );
    assert_eq!(stats.failed_closed, stats.errors + stats.timeouts);
    let admitted_after = |t: Instant| calls.iter().filter(|c| c.0 > t && c.2).count();
    assert!(
        admitted_after(restarted) > 0,
        "no recovery after the restart"
    );
    assert!(admitted_after(resumed) > 0, "no recovery after SIGCONT");
    assert!(
        admitted_after(flushed) > 0,
        "no admission after SCRIPT FLUSH"
    );
    let failed_after_flush = calls.iter().filter(|c| c.0 > flushed && c.3).count();
    assert_eq!(
        failed_after_flush, 0,
        "a decision failed after SCRIPT FLUSH"
    );
    assert_all_keys_expire(&mut server.connection());
}

#[tokio::test]
async fn a_chain_is_checked_and_charged_in_one_script() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // 10 per second with bursts of 3, and at most 4 in any 5 seconds, per subject.
    let limiter = RedisLimiter::builder(
        Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 3,
        },
        FailurePolicy::FailClosed,
    )
    .and_limit(Algorithm::SlidingWindow {
        limit: 4,
        window: Duration::from_secs(5),
    })
    .prefix(PREFIX)
    .deadline(Duration::from_millis(200))
    .build(manager(&server).await)
    .unwrap();
    assert_eq!(limiter.capacity(), 3);
    let keys = limiter.keys("u");
    assert_eq!(keys.len(), 2);
    for key in &keys {
        assert!(key.starts_with(b"t:{u}:c"), "one hash tag for all members");
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let first = limiter.try_acquire_n("u", 3).await.unwrap();
    assert_eq!(first.remaining(), 0, "the smallest remaining: the bucket's");
    assert_eq!(
        first.reset_after(),
        Duration::from_secs(5),
        "the largest reset"
    );
    // The bucket rejects; the log is not charged.
    let before: Vec<_> = keys.iter().map(|k| dump(&mut con, k)).collect();
    let r = rejection(limiter.try_acquire("u").await);
    assert_eq!(r.limit(), 3, "the bucket's limit");
    assert!(r.retry_after() <= Duration::from_millis(100));
    let after: Vec<_> = keys.iter().map(|k| dump(&mut con, k)).collect();
    assert_eq!(before, after, "a rejected chain charges no member");
    tokio::time::sleep(r.retry_after() + Duration::from_millis(2)).await;
    limiter.try_acquire("u").await.unwrap();
    // Now the log is full: the bucket would admit, the chain must not, and must not charge it.
    tokio::time::sleep(Duration::from_millis(110)).await;
    let tat_before: String = con.get(&keys[0]).unwrap();
    let t0 = redis_now(&mut con);
    let r = rejection(limiter.try_acquire("u").await);
    assert_eq!(r.limit(), 4, "the log's limit");
    let free_at = first.at_nanos() / 1000 + 5_000_000;
    let retry = r.retry_after_nanos() / 1000;
    assert!(
        retry <= free_at - t0 && retry + 1_000_000 > free_at - t0,
        "{retry}"
    );
    let tat_after: String = con.get(&keys[0]).unwrap();
    assert_eq!(
        tat_before, tat_after,
        "the admitting member was not charged"
    );
    let members: u64 = con.zcard(&keys[1]).unwrap();
    assert_eq!(members, 4);
    // One command per decision, all of them the one chain script.
    let calls = command_calls(&mut con);
    assert_eq!(calls.get("evalsha"), Some(&4), "{calls:?}");
    assert_eq!(calls.get("eval"), Some(&1), "{calls:?}");
    assert_eq!(assert_all_keys_expire(&mut con).len(), 2);
}

/// One backend's `try_acquire_n(subject, n)`, boxed so that the suite below can run on each.
type Backend = Box<
    dyn Fn(
        String,
        u32,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Admission, TryAcquireError>> + Send>,
    >,
>;

/// The behavioural cases every backend must answer alike: (what, outcome) with the outcome
/// reduced to what does not depend on when the call ran.
async fn shared_cases(backend: &Backend, limit: u32) -> Vec<(String, String)> {
    let outcome = |r: Result<Admission, TryAcquireError>| match r {
        Ok(a) => format!("admitted, {} left", a.remaining()),
        Err(TryAcquireError::Rejected(r)) => format!("rejected at limit {}", r.limit()),
        Err(e) => format!("{e:?}"),
    };
    let mut out = Vec::new();
    let mut case = |what: &str, r| out.push((what.to_owned(), outcome(r)));
    case("probe on a fresh subject", backend("a".into(), 0).await);
    case("all but one", backend("a".into(), limit - 1).await);
    case("probe takes nothing", backend("a".into(), 0).await);
    case("the last one", backend("a".into(), 1).await);
    case("over the limit", backend("a".into(), 1).await);
    case("probe when full", backend("a".into(), 0).await);
    case("more than the limit", backend("a".into(), limit + 1).await);
    case("another subject", backend("b".into(), limit).await);
    out
}

#[tokio::test]
async fn the_same_cases_answer_alike_in_memory_in_redis_and_in_a_store() {
    let server = RedisServer::start();
    let limit = 4;
    // The fixed window and the sliding counter in Redis (and in the store, on the wall clock)
    // are aligned to the Unix epoch: an hour, with room for the whole suite in it. (In 30 s
    // windows a boundary within the suite turned "over the limit" into an admission.)
    let hour = Duration::from_secs(3600);
    room_in_window(&mut server.connection(), hour, Duration::from_secs(30));
    for algorithm in common::all_algorithms(limit, hour) {
        let memory = turnstile::KeyedLimiter::<String>::new(algorithm).unwrap();
        let in_memory: Backend = Box::new(move |subject, n| {
            let out = memory.try_acquire_n(&subject, n);
            Box::pin(async move { out })
        });
        let redis = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
        let in_redis: Backend = Box::new(move |subject, n| {
            let redis = redis.clone();
            Box::pin(async move { redis.try_acquire_n(&subject, n).await })
        });
        let expected = shared_cases(&in_memory, limit).await;
        let got = shared_cases(&in_redis, limit).await;
        assert_eq!(got, expected, "{algorithm:?}");
        // The get/set store backend too (feature `store`).
        #[cfg(feature = "store")]
        {
            let store =
                turnstile::StoreLimiter::new(algorithm, "t", MemoryStore::default()).unwrap();
            let in_store: Backend = Box::new(move |subject, n| {
                let store = store.clone();
                Box::pin(async move { store.try_acquire_n(&subject, n).await })
            });
            assert_eq!(
                shared_cases(&in_store, limit).await,
                expected,
                "{algorithm:?}"
            );
        }
        // Spot-check that the suite is not vacuous.
        assert_eq!(
            expected[4].1,
            format!("rejected at limit {limit}"),
            "{algorithm:?}"
        );
        // Next algorithm on fresh subjects.
        assert_eq!(assert_all_keys_expire(&mut server.connection()).len(), 2);
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut server.connection())
            .unwrap();
    }
}

#[tokio::test]
async fn a_cancelled_acquire_consumes_nothing() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::TokenBucket {
            rate: Rate::per_second(5),
            burst: 1,
        },
        FailurePolicy::FailClosed,
    )
    .await;
    limiter.try_acquire("c").await.unwrap();
    let state = dump(&mut con, &limiter.key("c"));
    // The waiter sleeps for the retry-after (200 ms); cut it short while it sleeps.
    let cut = tokio::time::timeout(Duration::from_millis(50), limiter.acquire("c")).await;
    assert!(cut.is_err());
    assert_eq!(
        dump(&mut con, &limiter.key("c")),
        state,
        "nothing was charged"
    );
    assert_eq!(limiter.stats().admitted, 1);
    assert_all_keys_expire(&mut con);
}

#[tokio::test]
async fn a_chain_falls_back_to_a_local_chain_at_its_share() {
    let mut server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    let limiter = RedisLimiter::builder(
        Algorithm::FixedWindow {
            limit: 10,
            window: Duration::from_secs(60),
        },
        FailurePolicy::Fallback { share: 0.5 },
    )
    .and_limit(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 6,
    })
    .prefix(PREFIX)
    .deadline(deadline)
    .build(manager(&server).await)
    .unwrap();
    server.kill();
    // Locally: 5 per minute and a bucket of 3: the bucket binds first.
    for _ in 0..3 {
        timed(deadline, limiter.try_acquire("f")).await.unwrap();
    }
    let r = rejection(timed(deadline, limiter.try_acquire("f")).await);
    assert_eq!(r.limit(), 3, "the local bucket's burst");
    assert_eq!(limiter.stats().fallbacks, 4);
}

/// A get/set store in memory, for running the shared cases on `StoreLimiter`.
#[cfg(feature = "store")]
#[derive(Default)]
struct MemoryStore(std::sync::Mutex<Entries>);

/// Key → (value, expiry).
#[cfg(feature = "store")]
type Entries = HashMap<Vec<u8>, (Vec<u8>, Instant)>;

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
        self.0
            .lock()
            .unwrap()
            .insert(key.to_vec(), (value, Instant::now() + ttl));
        Ok(())
    }
}

/// A chain's keys share a slot whatever the subject: the empty subject and one starting with `}`
/// would leave `{…}` empty, and Redis then hashes each whole key (suffix included) to its own slot,
/// so every call of the chain's one script would fail with CROSSSLOT (and the policy decide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_chain_decides_subjects_that_would_leave_the_tag_empty() {
    let cluster = redis_server::RedisCluster::start(3);
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let chain = cluster_chain(&client).await;
    let hour = Duration::from_secs(3600);
    room_in_window(
        &mut cluster.nodes[0].connection(),
        hour,
        Duration::from_secs(30),
    );
    for subject in ["", "}", "}x"] {
        chain.try_acquire(subject).await.unwrap();
        assert_eq!(rejection(chain.try_acquire(subject).await).limit(), 1);
    }
    assert_eq!(chain.stats().errors, 0);
    for node in &cluster.nodes {
        assert_all_keys_expire(&mut node.connection());
    }
}

/// A probe of the exact sliding window reports, as the in-memory one does, the time until the
/// log is empty again: 0 for a fresh subject, else until its newest permit leaves, not a whole
/// window from the probe (a probe takes nothing, so it adds no permit that would leave then).
#[tokio::test]
async fn a_sliding_window_probe_resets_when_its_newest_permit_leaves() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_secs(2);
    let algorithm = Algorithm::SlidingWindow { limit: 3, window };
    let memory = turnstile::KeyedLimiter::<String>::new(algorithm).unwrap();
    let fresh = memory.try_acquire_n(&"s".to_owned(), 0).unwrap();
    assert_eq!(fresh.reset_after(), Duration::ZERO, "in memory");
    let limiter = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
    let fresh = limiter.try_acquire_n("s", 0).await.unwrap();
    assert_eq!(fresh.reset_after(), Duration::ZERO, "in Redis");
    limiter.try_acquire("s").await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let newest = limiter.try_acquire("s").await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let probe = limiter.try_acquire_n("s", 0).await.unwrap();
    assert_eq!(probe.remaining(), 1);
    assert_eq!(
        probe.at_nanos() / 1000 + probe.reset_after_us(),
        newest.at_nanos() / 1000 + micros(window),
        "{probe:?} after {newest:?}"
    );
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

/// `reset` forgets a subject in Redis (every limit of a chain: one `DEL`), in the deny cache
/// (the next call goes to Redis, not to the cached rejection) and in the local fallback; other
/// subjects keep their state. With the server gone it fails with the error and still forgets
/// the fallback's state.
#[tokio::test]
async fn reset_forgets_a_subject_everywhere() {
    let mut server = RedisServer::start();
    let mut con = server.connection();
    let minute = Duration::from_secs(60);
    let deadline = Duration::from_millis(100);
    let limiter = RedisLimiter::builder(
        Algorithm::FixedWindow {
            limit: 2,
            window: minute,
        },
        FailurePolicy::Fallback { share: 0.5 },
    )
    .and_limit(Algorithm::SlidingWindow {
        limit: 3,
        window: minute,
    })
    .prefix(PREFIX)
    .deadline(deadline)
    .build(manager(&server).await)
    .unwrap();
    // The fixed window (aligned to Redis's clock) must reject alice and bob until the end of
    // the Redis part, and keep its keys: no minute ends in it.
    room_in_window(&mut con, minute, Duration::from_secs(10));
    for subject in ["alice", "bob"] {
        limiter.try_acquire_n(subject, 2).await.unwrap();
        rejection(limiter.try_acquire(subject).await);
    }
    assert_eq!(limiter.denied_subjects(), 2);
    let calls = |con: &mut redis::Connection| command_calls(con).get("evalsha").copied();
    let before = calls(&mut con);
    assert!(before.is_some());
    assert_eq!(limiter.reset("alice").await, Ok(true));
    assert_eq!(limiter.denied_subjects(), 1);
    for key in limiter.keys("alice") {
        assert!(dump(&mut con, &key).is_none(), "a key of alice survived");
    }
    // Decided in Redis again, on fresh state: the whole limit.
    assert_eq!(
        limiter.try_acquire_n("alice", 2).await.unwrap().remaining(),
        0
    );
    assert_eq!(calls(&mut con), before.map(|n| n + 1));
    rejection(limiter.try_acquire("bob").await);
    assert_eq!(limiter.reset("carol").await, Ok(false));
    assert_eq!(assert_all_keys_expire(&mut con).len(), 4);

    // Redis gone: the fallback (half of each limit, so one permit) decides; a reset fails with
    // the error, and still gives the fallback's permit back.
    server.kill();
    timed(deadline, limiter.try_acquire("dave")).await.unwrap();
    rejection(timed(deadline, limiter.try_acquire("dave")).await);
    assert!(limiter.reset("dave").await.is_err());
    timed(deadline, limiter.try_acquire("dave")).await.unwrap();
}

/// A reset in one process forgets the subject in Redis and in that process's deny cache only:
/// another process that cached a rejection keeps answering it locally until its retry-after
/// (here most of an hour), while one built with `deny_cache(0)` sees the fresh state at once.
#[tokio::test]
async fn a_reset_reaches_other_processes_only_past_their_deny_caches() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // A log, not a fixed window: a window aligned to Redis's clock may end within the test (the
    // Valkey pass of CI once ran it a minute before the hour), and its retry-after with it.
    let algorithm = Algorithm::SlidingWindow {
        limit: 1,
        window: Duration::from_secs(3600),
    };
    // Three processes: three limiters on one prefix, each with its own deny cache (or none).
    let build = |deny_cache: usize| {
        let server = &server;
        async move {
            RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
                .prefix(PREFIX)
                .deny_cache(deny_cache)
                .build(manager(server).await)
                .unwrap()
        }
    };
    let (a, cached, uncached) = (build(10).await, build(10).await, build(0).await);
    a.try_acquire("alice").await.unwrap();
    let first = rejection(cached.try_acquire("alice").await);
    assert!(first.retry_after() > Duration::from_secs(60), "{first:?}");
    rejection(uncached.try_acquire("alice").await);
    assert_eq!(a.reset("alice").await, Ok(true));
    // Redis holds nothing for alice, but `cached` answers from its cache, without a round trip.
    let again = rejection(cached.try_acquire("alice").await);
    assert!(again.retry_after() <= first.retry_after());
    assert_eq!(cached.stats().denied_locally, 1);
    assert_eq!(uncached.denied_subjects(), 0);
    uncached.try_acquire("alice").await.unwrap();
    assert_all_keys_expire(&mut con);
}

/// Two limiters on one prefix: `first` as deployed before, `second` with other parameters, as
/// after a redeploy that meets the keys `first` wrote.
async fn redeploy(
    server: &RedisServer,
    first: Algorithm,
    second: Algorithm,
) -> (RedisLimiter, RedisLimiter) {
    let build = |algorithm| async move {
        RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
            .prefix(PREFIX)
            .deny_cache(0)
            .build(manager(server).await)
            .unwrap()
    };
    (build(first).await, build(second).await)
}

/// The in-memory answer for `ask` permits right after `first` admitted `taken` permits at one
/// instant and the limiter was reconfigured to `second`, `later` after that.
fn reconfigured_in_memory(
    first: Algorithm,
    second: Algorithm,
    taken: u32,
    later: Duration,
    ask: u32,
) -> Result<Admission, TryAcquireError> {
    let clock = turnstile::ManualClock::new();
    let memory = turnstile::RateLimiter::builder(first)
        .max_limit(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    clock.set(Duration::from_secs(1000));
    memory.try_acquire_n(taken).unwrap();
    memory.reconfigure(second).unwrap();
    clock.advance(later);
    memory.try_acquire_n(ask)
}

/// A token bucket's new rate meets a debt written under the old one: the bucket stays as full
/// as it was, as after `reconfigure` in memory. It kept TAT alone, so a debt of 5 permits at
/// 1 s each read as 0.05 permits at 100 s each, and 9 more were admitted at once.
#[tokio::test]
async fn a_bucket_with_another_rate_keeps_how_full_it_was() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let fast = Algorithm::TokenBucket {
        rate: Rate::new(10, Duration::from_secs(10)),
        burst: 10,
    };
    let slow = Algorithm::TokenBucket {
        rate: Rate::new(1, Duration::from_secs(100)),
        burst: 10,
    };
    // Slower and faster: a debt of 5 of 10 stays 5 of 10 either way.
    for (first, second) in [(fast, slow), (slow, fast)] {
        let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
        let (old, new) = redeploy(&server, first, second).await;
        old.try_acquire_n("s", 5).await.unwrap();
        let memory = reconfigured_in_memory(first, second, 5, Duration::ZERO, 6);
        let redis = new.try_acquire_n("s", 6).await;
        assert_eq!(redis.is_ok(), memory.is_ok(), "{redis:?} vs {memory:?}");
        let admitted = new.try_acquire_n("s", 5).await.unwrap();
        assert_eq!(admitted.remaining(), 0, "{first:?} -> {second:?}");
        assert!(
            admitted.reset_after() > Duration::from_secs(9),
            "{admitted:?}"
        );
    }
    assert_all_keys_expire(&mut con);
}

/// A fixed window or sliding counter with another window length keeps the count of the window
/// running when it meets the key, as `reconfigure` rebases the grid in memory; it handed out a
/// fresh, epoch-aligned window (the whole limit again). Shorter and longer windows both.
#[tokio::test]
async fn a_window_with_another_length_keeps_the_count() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let (hour, almost, day) = (
        Duration::from_secs(3600),
        Duration::from_secs(3599),
        Duration::from_secs(86_400),
    );
    // The old limiter's hour (aligned to Redis's clock) must not end before the new limiter
    // meets its count.
    room_in_window(&mut con, hour, Duration::from_secs(30));
    type Make = fn(u32, Duration) -> Algorithm;
    let algorithms: [Make; 2] = [
        |limit, window| Algorithm::FixedWindow { limit, window },
        |limit, window| Algorithm::SlidingCounter { limit, window },
    ];
    for make in algorithms {
        for other in [almost, day] {
            let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
            let (first, second) = (make(5, hour), make(5, other));
            let (old, new) = redeploy(&server, first, second).await;
            old.try_acquire_n("s", 3).await.unwrap();
            let memory = reconfigured_in_memory(first, second, 3, Duration::ZERO, 3);
            assert!(memory.is_err(), "in memory the kept count rejects");
            let redis = new.try_acquire_n("s", 3).await;
            assert!(redis.is_err(), "{first:?} -> {second:?}: {redis:?}");
            // The two left are there; the rebased window is kept for the old limiter too.
            assert_eq!(new.try_acquire_n("s", 2).await.unwrap().remaining(), 0);
            rejection(old.try_acquire("s").await);
        }
    }
    assert_all_keys_expire(&mut con);
}

/// The exact sliding window with a shorter window still counts the permits admitted under the
/// longer one until they expire, as in memory (each admission keeps its expiry). The log was
/// scored by admission time and read with the caller's window, so 5 permits admitted under an
/// hour stopped counting after a millisecond: 10 permits within milliseconds. A longer window
/// does not stretch the old permits either.
#[tokio::test]
async fn a_log_with_another_window_keeps_each_permits_expiry() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let (hour, ms) = (Duration::from_secs(3600), Duration::from_millis(1));
    let long = Algorithm::SlidingWindow {
        limit: 5,
        window: hour,
    };
    let short = Algorithm::SlidingWindow {
        limit: 5,
        window: ms,
    };
    let (old, new) = redeploy(&server, long, short).await;
    old.try_acquire_n("s", 5).await.unwrap();
    // Real time must pass for a 1 ms window (Redis's TIME): a few ms.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let memory = reconfigured_in_memory(long, short, 5, Duration::from_millis(5), 5);
    let redis = new.try_acquire_n("s", 5).await;
    assert_eq!(redis.is_ok(), memory.is_ok(), "{redis:?} vs {memory:?}");
    let r = rejection(redis);
    assert!(r.retry_after() > hour - Duration::from_secs(60), "{r:?}");
    // The key lives as long as the hour-long permits, not the new window.
    let key = new.key("s");
    let ttl: i64 = con.pttl(&key).unwrap();
    assert!(ttl > 3_500_000, "PTTL {ttl}");

    // Longer: permits admitted under 1 ms leave after it, whatever the new window.
    let (old, new) = redeploy(&server, short, long).await;
    old.try_acquire_n("t", 5).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let memory = reconfigured_in_memory(short, long, 5, Duration::from_millis(5), 5);
    let redis = new.try_acquire_n("t", 5).await;
    assert_eq!(redis.is_ok(), memory.is_ok(), "{redis:?} vs {memory:?}");
    assert_all_keys_expire(&mut con);
}

// ---------------------------------------------------------------------------------------------
// Charges: usage recorded after the fact, unchecked (`RedisLimiter::charge`).
// ---------------------------------------------------------------------------------------------

/// A hash field of `key` as a number.
fn field(con: &mut redis::Connection, key: &[u8], name: &str) -> u64 {
    redis::cmd("HGET").arg(key).arg(name).query(con).unwrap()
}

/// A fixed window charged beyond its limit rejects until the window ends, exactly then (the
/// rejection bracketed by TIME readings writes nothing), and starts the next window empty.
#[tokio::test]
async fn a_charge_puts_a_fixed_window_in_debt_until_it_ends() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_millis(400);
    let limiter = limiter(
        &server,
        Algorithm::FixedWindow { limit: 3, window },
        FailurePolicy::FailClosed,
    )
    .await;
    align_to_window(&mut con, window, Duration::from_millis(5));
    limiter.try_acquire("f").await.unwrap();
    let charged = limiter.charge("f", 4).await.unwrap();
    assert_eq!(charged.remaining(), 0, "two permits in debt");
    let window_end = (charged.at_nanos() / 1000 / micros(window) + 1) * micros(window);
    assert_eq!(
        charged.at_nanos() / 1000 + charged.reset_after_us(),
        window_end
    );
    assert_eq!(field(&mut con, &limiter.key("f"), "c"), 5);
    // The debt lives exactly as long as the window, and no longer.
    let expires: u64 = redis::cmd("PEXPIRETIME")
        .arg(limiter.key("f"))
        .query(&mut con)
        .unwrap();
    assert_eq!(expires, window_end.div_ceil(1000));
    let r = check_rejection(&limiter, &mut con, "f", window_end).await;
    assert_eq!(r.limit(), 3);
    tokio::time::sleep(r.retry_after() + Duration::from_millis(2)).await;
    let next = limiter.try_acquire_n("f", 3).await.unwrap();
    assert_eq!(next.remaining(), 0, "the next window starts empty");
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

/// The exact sliding window: a charge that does not fit claims every slot with the latest
/// expiries (the log keeps `limit` members, not one per permit charged), and the subject is
/// refused until they leave.
#[tokio::test]
async fn a_charge_fills_a_sliding_window_with_its_latest_expiries() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_millis(300);
    let limiter = limiter(
        &server,
        Algorithm::SlidingWindow { limit: 3, window },
        FailurePolicy::FailClosed,
    )
    .await;
    limiter.try_acquire("s").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let fits = limiter.charge("s", 1).await.unwrap();
    assert_eq!(
        fits.remaining(),
        1,
        "a charge that fits is taken as an admission"
    );
    let charged = limiter.charge("s", 5).await.unwrap();
    assert_eq!(charged.remaining(), 0);
    assert_eq!(charged.reset_after(), window);
    let key = limiter.key("s");
    let members: Vec<(String, u64)> = con.zrange_withscores(&key, 0, -1).unwrap();
    let expiry = charged.at_nanos() / 1000 + micros(window);
    assert_eq!(
        members.iter().map(|m| m.1).collect::<Vec<_>>(),
        [expiry; 3],
        "the log keeps its 3 latest expiries: {members:?}"
    );
    let expires: u64 = redis::cmd("PEXPIRETIME").arg(&key).query(&mut con).unwrap();
    assert_eq!(expires, expiry.div_ceil(1000));
    check_rejection(&limiter, &mut con, "s", expiry).await;
    let now = redis_now(&mut con);
    tokio::time::sleep(Duration::from_micros(expiry - now) + Duration::from_millis(2)).await;
    assert_eq!(limiter.try_acquire_n("s", 3).await.unwrap().remaining(), 0);
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

/// The token bucket: TAT = max(TAT, now) + n·T, so a charge's debt refuses until it has been
/// paid back at the rate, then admits.
#[tokio::test]
async fn a_charge_moves_a_buckets_arrival_time() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // One permit every 100,000 µs, bursts of 3.
    let limiter = limiter(
        &server,
        Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 3,
        },
        FailurePolicy::FailClosed,
    )
    .await;
    let charged = limiter.charge("b", 5).await.unwrap();
    assert_eq!(charged.remaining(), 0);
    assert_eq!(charged.reset_after(), Duration::from_millis(500));
    let tat = charged.at_nanos() / 1000 + 500_000;
    let stored: String = con.get(limiter.key("b")).unwrap();
    assert_eq!(stored, format!("{tat}:300000"));
    let expires: u64 = redis::cmd("PEXPIRETIME")
        .arg(limiter.key("b"))
        .query(&mut con)
        .unwrap();
    assert_eq!(expires, tat.div_ceil(1000));
    // One permit fits once TAT − now ≤ 200 ms.
    check_rejection(&limiter, &mut con, "b", tat - 200_000).await;
    // A second charge adds on to the debt.
    let more = limiter.charge("b", 1).await.unwrap();
    assert_eq!(
        more.at_nanos() / 1000 + more.reset_after_us(),
        tat + 100_000
    );
    let now = redis_now(&mut con);
    tokio::time::sleep(Duration::from_micros(tat - 100_000 - now) + Duration::from_millis(2)).await;
    let a = limiter.try_acquire("b").await.unwrap();
    assert_eq!(a.remaining(), 0);
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

/// The sliding counter: the charged count weighs fully to the window's end, then fades over
/// the next, and the retry-after says exactly when one permit fits again.
#[tokio::test]
async fn a_charge_weighs_on_a_sliding_counter_for_two_windows() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_millis(400);
    let w = micros(window);
    let limiter = limiter(
        &server,
        Algorithm::SlidingCounter { limit: 4, window },
        FailurePolicy::FailClosed,
    )
    .await;
    align_to_window(&mut con, window, Duration::from_millis(5));
    let charged = limiter.charge("c", 6).await.unwrap();
    assert_eq!(charged.remaining(), 0);
    let start = charged.at_nanos() / 1000 / w * w;
    assert_eq!(
        charged.at_nanos() / 1000 + charged.reset_after_us(),
        start + 2 * w
    );
    assert_eq!(field(&mut con, &limiter.key("c"), "c"), 6);
    // The charged count weighs until the next window's end: the key lives until then.
    let expires: u64 = redis::cmd("PEXPIRETIME")
        .arg(limiter.key("c"))
        .query(&mut con)
        .unwrap();
    assert_eq!(expires, (start + 2 * w).div_ceil(1000));
    // In the next window prev = 6: one permit fits once 6·(W − e) ≤ 3·W, e ≥ W − ⌊3W/6⌋.
    let free_at = start + w + (w - 3 * w / 6);
    check_rejection(&limiter, &mut con, "c", free_at).await;
    let now = redis_now(&mut con);
    tokio::time::sleep(Duration::from_micros(free_at - now) + Duration::from_millis(2)).await;
    let b = limiter.try_acquire("c").await.unwrap();
    assert!(b.at_nanos() / 1000 >= free_at);
    assert_eq!(assert_all_keys_expire(&mut con).len(), 1);
}

/// `charge(0)` records nothing and reports the state, even for a full subject, where a probe
/// is rejected; it creates no key for a subject without state.
#[tokio::test]
async fn a_charge_of_zero_records_nothing_and_never_fails() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // As in `probes_take_nothing`: no fixed window ends during the test.
    let window = Duration::from_secs(3600);
    room_in_window(&mut con, window, Duration::from_secs(10));
    for algorithm in common::all_algorithms(2, window) {
        let limiter = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
        let subject = format!("{algorithm:?}");
        let key = limiter.key(&subject);
        let fresh = limiter.charge(&subject, 0).await.unwrap();
        assert_eq!(fresh.remaining(), 2, "{algorithm:?}");
        if matches!(algorithm, Algorithm::FixedWindow { .. }) {
            // The time until the window ends, as for a probe.
            assert!(fresh.reset_after() <= window);
        } else {
            assert_eq!(fresh.reset_after(), Duration::ZERO, "{algorithm:?}");
        }
        assert_eq!(dump(&mut con, &key), None, "{algorithm:?}");
        limiter.try_acquire_n(&subject, 2).await.unwrap();
        let state = dump(&mut con, &key);
        rejection(limiter.try_acquire_n(&subject, 0).await);
        let full = limiter.charge(&subject, 0).await.unwrap();
        assert_eq!(full.remaining(), 0, "{algorithm:?}");
        assert!(full.reset_after() > Duration::ZERO, "{algorithm:?}");
        assert_eq!(dump(&mut con, &key), state, "{algorithm:?}");
    }
    assert_eq!(assert_all_keys_expire(&mut con).len(), 4);
}

/// A charge of 2^32 − 1 permits, twice, saturates every algorithm's state within what Lua's
/// doubles hold exactly, without an error, and leaves every key with a valid expiry.
#[tokio::test]
async fn a_huge_charge_saturates_without_errors() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // The fixed window's charges and rejection in one window.
    room_in_window(&mut con, Duration::from_secs(60), Duration::from_secs(10));
    for algorithm in common::all_algorithms(3, Duration::from_secs(60)) {
        let limiter = limiter(&server, algorithm, FailurePolicy::FailClosed).await;
        let subject = format!("{algorithm:?}");
        let key = limiter.key(&subject);
        limiter.try_acquire(&subject).await.unwrap();
        for _ in 0..2 {
            let charged = limiter.charge(&subject, u32::MAX).await.unwrap();
            assert_eq!(charged.remaining(), 0, "{algorithm:?}");
        }
        let t0 = redis_now(&mut con);
        let r = rejection(limiter.try_acquire(&subject).await);
        let t1 = redis_now(&mut con);
        match algorithm {
            Algorithm::FixedWindow { .. } => {
                assert_eq!(field(&mut con, &key, "c"), u64::from(u32::MAX));
                assert!(r.retry_after() <= Duration::from_secs(60));
            }
            Algorithm::SlidingCounter { .. } => {
                assert_eq!(field(&mut con, &key, "c"), u64::from(u32::MAX));
                assert!(r.retry_after() <= Duration::from_secs(120));
            }
            Algorithm::SlidingWindow { .. } => {
                let members: u64 = con.zcard(&key).unwrap();
                assert_eq!(members, 3, "min(n, limit) members, then the 3 latest kept");
                assert!(r.retry_after() <= Duration::from_secs(60));
            }
            _ => {
                // The token bucket, of capacity 60 s: the arrival time is held at 2^53 µs minus it.
                let stored: String = con.get(&key).unwrap();
                let max_tat = (1u64 << 53) - 60_000_000;
                assert_eq!(stored, format!("{max_tat}:60000000"));
                let expires: u64 = redis::cmd("PEXPIRETIME").arg(&key).query(&mut con).unwrap();
                assert_eq!(expires, max_tat.div_ceil(1000));
                // 20 s per permit: one fits once TAT − now ≤ 60 s − 20 s.
                let free_at = max_tat - 40_000_000;
                let retry = r.retry_after_nanos() / 1000;
                assert!(
                    free_at - t1 <= retry && retry <= free_at - t0,
                    "{retry} outside [{}, {}]",
                    free_at - t1,
                    free_at - t0
                );
            }
        }
    }
    assert_eq!(assert_all_keys_expire(&mut con).len(), 4);
}

/// A limiter with several limits charges every member in one script: each member's state
/// moves as its own charge would move it, and the reply is the tightest and slowest member's.
#[tokio::test]
async fn a_charge_to_a_chain_charges_every_member_in_one_script() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let window = Duration::from_secs(5);
    let limiter = RedisLimiter::builder(
        Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 3,
        },
        FailurePolicy::FailClosed,
    )
    .and_limit(Algorithm::SlidingWindow { limit: 4, window })
    .and_limit(Algorithm::FixedWindow { limit: 10, window })
    .prefix(PREFIX)
    .deadline(Duration::from_millis(200))
    .build(manager(&server).await)
    .unwrap();
    let keys = limiter.keys("u");
    // Both charges in one fixed window.
    room_in_window(&mut con, window, Duration::from_secs(2));
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let first = limiter.charge("u", 2).await.unwrap();
    assert_eq!(first.remaining(), 1, "the bucket's");
    assert!(
        first.reset_after() >= Duration::from_millis(200),
        "{first:?}"
    );
    assert!(first.reset_after() <= window, "{first:?}");
    let charged = limiter.charge("u", 5).await.unwrap();
    assert_eq!(charged.remaining(), 0);
    let tat = charged.at_nanos() / 1000 + 700_000 - (charged.at_nanos() - first.at_nanos()) / 1000;
    let stored: String = con.get(&keys[0]).unwrap();
    assert_eq!(stored, format!("{tat}:300000"), "the bucket: 7 permits");
    let members: u64 = con.zcard(&keys[1]).unwrap();
    assert_eq!(members, 4, "the log: full, 4 members kept");
    assert_eq!(field(&mut con, &keys[2], "c"), 7, "the window: 7 counted");
    let r = rejection(limiter.try_acquire("u").await);
    assert_eq!(r.limit(), 4, "the log refuses longest");
    // One command per charge, the one chain charge script, and one per decision (each script
    // loaded by its first EVALSHA's EVAL).
    let calls = command_calls(&mut con);
    assert_eq!(calls.get("evalsha"), Some(&3), "{calls:?}");
    assert_eq!(calls.get("eval"), Some(&2), "{calls:?}");
    assert_eq!(assert_all_keys_expire(&mut con).len(), 3);
}

/// The deny cache never lets a charge go unseen: a subject it does not hold goes to Redis,
/// which sees the debt; a rejection it holds still holds after a charge.
#[tokio::test]
async fn after_a_charge_into_debt_the_next_call_is_rejected() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::FixedWindow {
            limit: 2,
            window: Duration::from_secs(60),
        },
        FailurePolicy::FailClosed,
    )
    .await;
    // One minute (aligned to Redis's clock) holds the whole debt and both rejections.
    room_in_window(&mut con, Duration::from_secs(60), Duration::from_secs(10));
    limiter.try_acquire("d").await.unwrap();
    limiter.charge("d", 3).await.unwrap();
    rejection(limiter.try_acquire("d").await);
    let stats = limiter.stats();
    assert_eq!(
        (stats.rejected, stats.denied_locally),
        (1, 0),
        "asked of Redis"
    );
    limiter.charge("d", 1).await.unwrap();
    rejection(limiter.try_acquire("d").await);
    let stats = limiter.stats();
    assert_eq!(
        (stats.rejected, stats.denied_locally),
        (1, 1),
        "the cached rejection"
    );
    assert_eq!(field(&mut con, &limiter.key("d"), "c"), 5);
    assert_eq!(stats.admitted, 1, "charges are not counted as decisions");
    assert_all_keys_expire(&mut con);
}

/// With Redis away a charge is an error under every policy (it cannot be admitted open or
/// rejected closed), within the deadline; under `Fallback` it is also recorded in the local
/// limiter, which then decides for the subject.
#[tokio::test]
async fn a_charge_with_the_server_killed_is_an_error_and_charges_the_fallback() {
    let mut server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    let fw = Algorithm::FixedWindow {
        limit: 4,
        window: Duration::from_secs(60),
    };
    let build = |policy| {
        let server = &server;
        async move {
            RedisLimiter::builder(fw, policy)
                .prefix(PREFIX)
                .deadline(deadline)
                .build(manager(server).await)
                .unwrap()
        }
    };
    let open = build(FailurePolicy::FailOpen).await;
    let closed = build(FailurePolicy::FailClosed).await;
    let fallback = build(FailurePolicy::Fallback { share: 0.5 }).await;
    server.kill();
    assert!(timed(deadline, open.charge("x", 1)).await.is_err());
    assert!(timed(deadline, closed.charge("x", 1)).await.is_err());
    assert!(timed(deadline, fallback.charge("x", 2)).await.is_err());
    // The local share is 2 per minute, all charged to "x": "y" is admitted, "x" is not.
    timed(deadline, fallback.try_acquire("y")).await.unwrap();
    rejection(timed(deadline, fallback.try_acquire("x")).await);
    let s = open.stats();
    assert_eq!(
        (s.errors, s.timeouts, s.failed_open),
        (0, 0, 0),
        "not decisions"
    );
}

/// A charge that misses the deadline under `Fallback` is recorded in the fallback, and its script,
/// already sent, still runs in Redis once the server answers again: each place counts it once,
/// never twice, and the two are never added up (the fallback decides only while Redis fails).
/// So is a decision that timed out and was answered by the fallback. Counting in both is
/// at-least-once: Redis may hold a charge the caller was told failed, but never misses one
/// that ran, and the fallback never misses one that Redis might not have recorded.
#[tokio::test]
async fn a_late_charge_counts_once_in_redis_and_once_in_the_fallback() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // As in `probes_take_nothing`: no fixed window ends during the test.
    room_in_window(&mut con, Duration::from_secs(3600), Duration::from_secs(10));
    let deadline = Duration::from_millis(100);
    let limiter = RedisLimiter::builder(
        Algorithm::FixedWindow {
            limit: 4,
            window: Duration::from_secs(3600),
        },
        FailurePolicy::Fallback { share: 1.0 },
    )
    .prefix(PREFIX)
    .deadline(deadline)
    .deny_cache(0)
    .build(manager(&server).await)
    .unwrap();
    // Both scripts cached: a late EVALSHA then runs (after NOSCRIPT the EVAL would never go).
    limiter.charge("warm", 0).await.unwrap();
    limiter.try_acquire_n("warm", 0).await.unwrap();
    server.pause();
    assert!(timed(deadline, limiter.charge("s", 3)).await.is_err());
    // The fallback holds the charge: 1 of its 4 left, taken now by a decision Redis also got.
    let admission = timed(deadline, limiter.try_acquire("s")).await.unwrap();
    assert_eq!(admission.remaining(), 0, "the fallback's 4 − 3 − 1");
    server.resume();
    // The same connection, after the two late scripts: Redis counted 3 + 1, not more.
    let probe = limiter.try_acquire_n("s", 0).await;
    rejection(probe);
    let key = limiter.key("s");
    assert_eq!(
        field(&mut con, &key, "c"),
        4,
        "the charge and the admission, once each"
    );
    let s = limiter.stats();
    // The warming probe admitted, the last one rejected; one timeout answered by the fallback
    // (the charge's is not a decision).
    assert_eq!(
        (s.timeouts, s.fallbacks, s.admitted, s.rejected),
        (1, 1, 1, 1)
    );
    // The fallback counted each once too: 4 of 4, so a second outage rejects "s" locally.
    server.pause();
    rejection(timed(deadline, limiter.try_acquire("s")).await);
    server.resume();
}

// ---------------------------------------------------------------------------------------------
// Reconfiguration at run time (`RedisLimiter::reconfigure`, `reconfigure_all`,
// `reconfigure_limit`).
// ---------------------------------------------------------------------------------------------

/// A limiter of `algorithm` under `PREFIX` with the deny cache on, failing closed.
async fn cached(server: &RedisServer, algorithm: Algorithm) -> RedisLimiter {
    RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
        .prefix(PREFIX)
        .deadline(Duration::from_millis(500))
        .build(manager(server).await)
        .unwrap()
}

/// A raised limit admits at once, also a subject the deny cache held under the old limit (its
/// cached rejection was of the old parameters), and every accessor reports the new parameters.
#[tokio::test]
async fn a_raised_limit_admits_at_once_even_a_subject_denied_locally() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let two = Algorithm::FixedWindow {
        limit: 2,
        window: hour,
    };
    let four = Algorithm::FixedWindow {
        limit: 4,
        window: hour,
    };
    let limiter = cached(&server, two).await;
    let clone = limiter.clone();
    limiter.try_acquire_n("d", 2).await.unwrap();
    assert_eq!(rejection(limiter.try_acquire("d").await).limit(), 2);
    assert_eq!(rejection(limiter.try_acquire("d").await).limit(), 2);
    assert_eq!(limiter.stats().denied_locally, 1, "held by the deny cache");
    limiter.reconfigure(four).unwrap();
    assert_eq!((clone.algorithm(), clone.capacity()), (four, 4));
    assert_eq!(clone.algorithms().collect::<Vec<_>>(), [four]);
    assert_eq!(clone.denied_subjects(), 0);
    // The two admitted still count: two more, then a rejection naming the new limit.
    assert_eq!(clone.try_acquire("d").await.unwrap().remaining(), 1);
    assert_eq!(clone.try_acquire("d").await.unwrap().remaining(), 0);
    assert_eq!(rejection(clone.try_acquire("d").await).limit(), 4);
    let stats = clone.stats();
    assert_eq!((stats.admitted, stats.rejected), (3, 2), "the stats go on");
    // n = 3 fits the new capacity: not InsufficientCapacity any more.
    assert!(matches!(
        clone.try_acquire_n("e", 3).await,
        Ok(a) if a.remaining() == 1
    ));
    assert_all_keys_expire(&mut con);
}

/// A decision in flight under the old parameters when the limit is raised is rejected under
/// them, and that rejection is not cached where the new parameters' calls look: the next call,
/// under the raised limit, goes to Redis and is admitted.
#[tokio::test]
async fn a_rejection_under_the_old_limit_arriving_after_a_raise_is_not_cached() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let limit = |limit| Algorithm::FixedWindow {
        limit,
        window: hour,
    };
    let limiter = cached(&server, limit(2)).await;
    limiter.try_acquire_n("d", 2).await.unwrap();
    server.pause();
    let raise = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        limiter.reconfigure(limit(4)).unwrap();
        server.resume();
    };
    let (late, ()) = tokio::join!(limiter.try_acquire("d"), raise);
    assert_eq!(rejection(late).limit(), 2, "decided under the old limit");
    assert_eq!(limiter.denied_subjects(), 0);
    assert_eq!(limiter.try_acquire("d").await.unwrap().remaining(), 1);
    let stats = limiter.stats();
    assert_eq!(
        (stats.admitted, stats.rejected, stats.denied_locally),
        (2, 1, 0)
    );
    assert_all_keys_expire(&mut con);
}

/// A lowered limit judges the counts kept under it at once (as in memory): above it, nothing
/// is admitted until the window ends; raised again, what is left is there. A token bucket
/// stays as full as it was.
#[tokio::test]
async fn a_lowered_limit_judges_the_counts_kept() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let fixed = |limit| Algorithm::FixedWindow {
        limit,
        window: hour,
    };
    let limiter = cached(&server, fixed(5)).await;
    limiter.try_acquire_n("l", 3).await.unwrap();
    limiter.reconfigure(fixed(2)).unwrap();
    let r = rejection(limiter.try_acquire("l").await);
    assert_eq!(r.limit(), 2);
    assert!(r.retry_after() <= hour);
    assert_eq!(
        limiter.try_acquire_n("l", 3).await,
        Err(TryAcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    );
    limiter.reconfigure(fixed(5)).unwrap();
    assert_eq!(limiter.try_acquire_n("l", 2).await.unwrap().remaining(), 0);

    // A bucket of 10 with 6 taken, halved: 4 of 10 left is 2 of 5.
    let bucket = |burst| Algorithm::TokenBucket {
        rate: Rate::new(burst, hour),
        burst,
    };
    let limiter = cached(&server, bucket(10)).await;
    limiter.try_acquire_n("b", 6).await.unwrap();
    limiter.reconfigure(bucket(5)).unwrap();
    assert_eq!(limiter.try_acquire_n("b", 2).await.unwrap().remaining(), 0);
    assert_eq!(rejection(limiter.try_acquire("b").await).limit(), 5);
    assert_all_keys_expire(&mut con);
}

/// A new window length keeps the count of the window running (rebased as the in-memory
/// `reconfigure` does), for the fixed window and the sliding counter; the exact sliding
/// window's permits keep their expiry.
#[tokio::test]
async fn a_new_window_keeps_the_counts() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let (hour, almost, day) = (
        Duration::from_secs(3600),
        Duration::from_secs(3599),
        Duration::from_secs(86_400),
    );
    room_in_window(&mut con, hour, Duration::from_secs(30));
    type Make = fn(u32, Duration) -> Algorithm;
    let algorithms: [Make; 3] = [
        |limit, window| Algorithm::FixedWindow { limit, window },
        |limit, window| Algorithm::SlidingCounter { limit, window },
        |limit, window| Algorithm::SlidingWindow { limit, window },
    ];
    for (i, make) in algorithms.into_iter().enumerate() {
        for (j, other) in [almost, day].into_iter().enumerate() {
            let subject = format!("w{i}.{j}");
            let limiter = cached(&server, make(5, hour)).await;
            limiter.try_acquire_n(&subject, 3).await.unwrap();
            limiter.reconfigure(make(5, other)).unwrap();
            let what = format!("{:?}", make(5, other));
            // Rejected as in memory, where the same reconfiguration keeps the count.
            let memory =
                reconfigured_in_memory(make(5, hour), make(5, other), 3, Duration::ZERO, 3);
            assert!(memory.is_err(), "{what}: {memory:?}");
            let r = rejection(limiter.try_acquire_n(&subject, 3).await);
            // At most the new window, plus the weighing of the counter's previous window.
            assert!(r.retry_after() <= 2 * day, "{what}: {r:?}");
            assert_eq!(
                limiter
                    .try_acquire_n(&subject, 2)
                    .await
                    .map(|a| a.remaining()),
                Ok(0),
                "{what}"
            );
        }
    }
    assert_all_keys_expire(&mut con);
}

/// Bad parameters, another algorithm, the wrong number of limits or a limit index past the
/// last: a typed error each, and the parameters in force stay, decisions included.
#[tokio::test]
async fn a_bad_reconfiguration_is_a_typed_error_and_changes_nothing() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let three = Algorithm::FixedWindow {
        limit: 3,
        window: hour,
    };
    let limiter = cached(&server, three).await;
    limiter.try_acquire("s").await.unwrap();
    let errors = [
        limiter.reconfigure(Algorithm::FixedWindow {
            limit: 0,
            window: hour,
        }),
        limiter.reconfigure(Algorithm::FixedWindow {
            limit: 3,
            window: Duration::ZERO,
        }),
        limiter.reconfigure(Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 3,
        }),
        limiter.reconfigure_all([three, three]),
        limiter.reconfigure_all([]),
        limiter.reconfigure_limit(1, three),
    ];
    assert_eq!(errors[0], Err(ConfigError::Zero { what: "limit" }));
    assert_eq!(errors[1], Err(ConfigError::Zero { what: "window" }));
    assert!(
        matches!(
            errors[2],
            Err(ConfigError::AlgorithmChanged {
                from: "fixed window",
                to: "token bucket"
            })
        ),
        "{errors:?}"
    );
    for error in &errors[3..5] {
        assert!(
            matches!(
                error,
                Err(ConfigError::Invalid {
                    what: "algorithms",
                    ..
                })
            ),
            "{error:?}"
        );
    }
    assert!(
        matches!(
            errors[5],
            Err(ConfigError::Invalid {
                what: "limit index",
                ..
            })
        ),
        "{errors:?}"
    );
    let log = Algorithm::SlidingWindow {
        limit: 3,
        window: hour,
    };
    let sliding = cached(&server, log).await;
    let too_many = Algorithm::SlidingWindow {
        limit: turnstile::REDIS_MAX_SLIDING_LIMIT + 1,
        window: hour,
    };
    assert!(matches!(
        sliding.reconfigure(too_many),
        Err(ConfigError::TooLarge { .. })
    ));
    assert_eq!(sliding.algorithm(), log);
    // Still 3 per hour, one taken.
    assert_eq!((limiter.algorithm(), limiter.capacity()), (three, 3));
    assert_eq!(limiter.try_acquire_n("s", 2).await.unwrap().remaining(), 0);
    assert_eq!(rejection(limiter.try_acquire("s").await).limit(), 3);
    // A chain takes one algorithm per limit: `reconfigure` alone says so.
    let chain = RedisLimiter::builder(three, FailurePolicy::FailClosed)
        .and_limit(log)
        .prefix(PREFIX)
        .build(manager(&server).await)
        .unwrap();
    assert!(matches!(
        chain.reconfigure(three),
        Err(ConfigError::Invalid {
            what: "reconfigure",
            ..
        })
    ));
    assert_eq!(chain.algorithms().collect::<Vec<_>>(), [three, log]);
}

/// A chain's limits change together (`reconfigure_all`) or one at a time (`reconfigure_limit`),
/// each keeping its counts; the capacity is the new smallest limit.
#[tokio::test]
async fn a_chain_reconfigures_all_its_limits_or_one() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let fixed = |limit| Algorithm::FixedWindow {
        limit,
        window: hour,
    };
    let log = |limit| Algorithm::SlidingWindow {
        limit,
        window: hour,
    };
    let chain = RedisLimiter::builder(fixed(3), FailurePolicy::FailClosed)
        .and_limit(log(5))
        .prefix(PREFIX)
        .build(manager(&server).await)
        .unwrap();
    chain.try_acquire_n("c", 3).await.unwrap();
    assert_eq!(rejection(chain.try_acquire("c").await).limit(), 3);
    chain.reconfigure_all([fixed(10), log(4)]).unwrap();
    assert_eq!(chain.capacity(), 4);
    assert_eq!(chain.algorithms().collect::<Vec<_>>(), [fixed(10), log(4)]);
    // The log has 3 of 4: one more, then the log (now the tighter) rejects.
    assert_eq!(chain.try_acquire("c").await.unwrap().remaining(), 0);
    assert_eq!(rejection(chain.try_acquire("c").await).limit(), 4);
    chain.reconfigure_limit(1, log(6)).unwrap();
    assert_eq!(chain.algorithms().collect::<Vec<_>>(), [fixed(10), log(6)]);
    assert_eq!(chain.capacity(), 6);
    assert_eq!(chain.try_acquire_n("c", 2).await.unwrap().remaining(), 0);
    assert_all_keys_expire(&mut con);
}

/// Under `Fallback` the local limiter follows: with Redis away, it decides at the share of the
/// new parameters.
#[tokio::test]
async fn the_fallback_follows_a_reconfiguration() {
    let mut server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    let fixed = |limit| Algorithm::FixedWindow {
        limit,
        window: Duration::from_secs(3600),
    };
    let limiter = RedisLimiter::builder(fixed(4), FailurePolicy::Fallback { share: 0.5 })
        .prefix(PREFIX)
        .deadline(deadline)
        .build(manager(&server).await)
        .unwrap();
    limiter.reconfigure(fixed(8)).unwrap();
    server.kill();
    // Half of 8: four locally, then the local limit rejects.
    for _ in 0..4 {
        timed(deadline, limiter.try_acquire("f")).await.unwrap();
    }
    assert_eq!(
        rejection(timed(deadline, limiter.try_acquire("f")).await).limit(),
        4
    );
    limiter.reconfigure(fixed(2)).unwrap();
    timed(deadline, limiter.try_acquire("g")).await.unwrap();
    rejection(timed(deadline, limiter.try_acquire("g")).await);
    assert_eq!(limiter.stats().fallbacks, 7);
}

/// Many tasks decide while another reconfigures over and over between two parameter sets: each
/// decision is made under one set wholly. A fresh subject's admission tells the set apart by
/// its remaining (the limit) and its reset (the window's end, from the admission's time), both
/// computed by the script from the parameters sent; a call for more than one set's capacity is
/// refused before the round trip under that set, and admitted by the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decisions_racing_reconfigurations_use_one_parameter_set_wholly() {
    let server = RedisServer::start();
    let (a, b) = (
        Algorithm::FixedWindow {
            limit: 5,
            window: Duration::from_secs(1000),
        },
        Algorithm::FixedWindow {
            limit: 10,
            window: Duration::from_secs(3000),
        },
    );
    let limiter = cached(&server, a).await;
    let stop = Instant::now() + Duration::from_millis(1500);
    let flipper = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let mut flips = 0u32;
            while Instant::now() < stop {
                limiter
                    .reconfigure(if flips.is_multiple_of(2) { b } else { a })
                    .unwrap();
                flips += 1;
                tokio::task::yield_now().await;
            }
            flips
        })
    };
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let (mut seen_a, mut seen_b, mut i) = (0u32, 0u32, 0u64);
                while Instant::now() < stop {
                    i += 1;
                    let n = if i.is_multiple_of(2) { 1 } else { 7 };
                    let subject = format!("race/{t}/{i}");
                    match limiter.try_acquire_n(&subject, n).await {
                        Ok(admission) => {
                            let at = admission.at_nanos() / 1000;
                            let end = at + admission.reset_after_us();
                            // The limit tells the set; the window's end must be that set's.
                            let (limit, window) = if admission.remaining() + n == 5 {
                                (5, 1_000_000_000)
                            } else {
                                (10, 3_000_000_000)
                            };
                            assert_eq!(admission.remaining(), limit - n, "{admission:?}");
                            assert_eq!(end, (at / window + 1) * window, "{admission:?}");
                            if limit == 5 {
                                seen_a += 1;
                            } else {
                                seen_b += 1;
                            }
                        }
                        Err(TryAcquireError::InsufficientCapacity {
                            requested: 7,
                            capacity: 5,
                        }) => seen_a += 1,
                        Err(e) => panic!("{subject} for {n}: {e:?}"),
                    }
                }
                (seen_a, seen_b)
            })
        })
        .collect();
    let (mut seen_a, mut seen_b) = (0, 0);
    for task in tasks {
        let (x, y) = task.await.unwrap();
        seen_a += x;
        seen_b += y;
    }
    let flips = flipper.await.unwrap();
    assert!(flips > 10, "{flips} reconfigurations");
    assert!(
        seen_a > 10 && seen_b > 10,
        "{seen_a} under a, {seen_b} under b"
    );
    let stats = limiter.stats();
    assert_eq!((stats.errors, stats.timeouts), (0, 0));
}

/// For the once-charge tests: a bucket of 4 per second, burst 8, under `Fallback` (locally 1
/// per second, burst 2: a retry-after of about a second), and a log of the hour that counts
/// every admission in Redis; every script cached, so that a late `EVALSHA` runs (after
/// `NOSCRIPT` its `EVAL` would never go). Then 4 of the subject `s`'s permits taken in Redis,
/// so that a late admission still weighs on the bucket (its reset outlives the local
/// retry-after) when the call's retry comes: a chain's admission is answered only while it
/// counts in every limit.
async fn once_charge_limiter(
    server: &RedisServer,
    deadline: Duration,
) -> RedisLimiter<ConnectionManager> {
    let limiter = RedisLimiter::builder(
        Algorithm::TokenBucket {
            rate: Rate::per_second(4),
            burst: 8,
        },
        FailurePolicy::Fallback { share: 0.25 },
    )
    .and_limit(Algorithm::SlidingWindow {
        limit: 100,
        window: Duration::from_secs(3600),
    })
    .prefix(PREFIX)
    .deadline(deadline)
    .deny_cache(0)
    .build(manager(server).await)
    .unwrap();
    limiter.acquire("warm").await.unwrap();
    limiter.try_acquire("warm").await.unwrap();
    limiter.try_acquire_n("s", 4).await.unwrap();
    limiter
}

/// An `acquire` whose attempt missed the deadline under `Fallback`, and whose fallback then
/// rejected, waits and tries again; the timed-out attempt's script, already sent, still runs
/// once the server answers, and admits. The retry must answer that admission, not charge the
/// subject a second time for one call. (The server is stopped, SIGSTOP, while the attempt is
/// in flight: its command waits in the socket and runs at SIGCONT, long before the retry.)
#[tokio::test]
async fn an_acquire_retrying_after_a_timeout_is_charged_once() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let deadline = Duration::from_millis(50);
    let limiter = once_charge_limiter(&server, deadline).await;
    let log = limiter.keys("s").remove(1);
    let logged = |con: &mut redis::Connection| -> u64 { con.zcard(&log).unwrap() };
    let settled = |con: &mut redis::Connection, expected: u64| {
        let started = Instant::now();
        while logged(con) != expected {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "never {expected}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // The local bucket emptied by two decisions that timed out (and ran late in Redis).
    server.pause();
    for _ in 0..2 {
        timed(deadline, limiter.try_acquire("s")).await.unwrap();
    }
    server.resume();
    settled(&mut con, 6);
    // Now an acquire: its attempt times out, the empty local bucket rejects it for about a
    // second, the attempt runs late in Redis meanwhile, and the retry goes to Redis.
    server.pause();
    let resume = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.resume();
    };
    let (admission, ()) = tokio::join!(limiter.acquire("s"), resume);
    let admission = admission.unwrap();
    assert_eq!(logged(&mut con), 7, "one call charged once: {admission:?}");
    let stats = limiter.stats();
    assert_eq!((stats.timeouts, stats.fallbacks), (3, 3), "{stats:?}");
    // The answer is an admission the log holds: the late attempt's, scored by its expiry.
    let expiry = admission.at_nanos() / 1000 + 3_600_000_000;
    let at_expiry: u64 = con.zcount(&log, expiry, expiry).unwrap();
    assert_eq!(at_expiry, 1, "{admission:?}");
    assert_all_keys_expire(&mut con);
}

/// Two `acquire` calls on one subject, both timing out (the server stopped while their attempts
/// are in flight) and both rejected by the spent fallback: both late attempts admit in Redis, and
/// each call's retry must answer its own call's admission. With one record per subject (the
/// latest admission's), the first late attempt's record was overwritten by the second's, and
/// its call's retry was charged again.
#[tokio::test]
async fn concurrent_acquires_retrying_after_a_timeout_are_each_charged_once() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let deadline = Duration::from_millis(50);
    let limiter = once_charge_limiter(&server, deadline).await;
    let log = limiter.keys("s").remove(1);
    let logged = |con: &mut redis::Connection| -> u64 { con.zcard(&log).unwrap() };
    // The local bucket emptied by two decisions that timed out (and ran late in Redis).
    server.pause();
    for _ in 0..2 {
        timed(deadline, limiter.try_acquire("s")).await.unwrap();
    }
    server.resume();
    let started = Instant::now();
    while logged(&mut con) != 6 {
        assert!(started.elapsed() < Duration::from_secs(5), "never logged");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Two calls, each attempt timing out and rejected by the empty local bucket, each running
    // late in Redis meanwhile; then each retry goes to Redis.
    server.pause();
    let resume = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.resume();
    };
    let (a, b, ()) = tokio::join!(limiter.acquire("s"), limiter.acquire("s"), resume);
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        logged(&mut con),
        8,
        "two calls charged once each: {a:?} {b:?}"
    );
    let stats = limiter.stats();
    assert_eq!((stats.timeouts, stats.fallbacks), (4, 4), "{stats:?}");
    // Each answer is its own call's late admission, which the log holds (the second one ran
    // after the first had taken its permit: one fewer remains), not the same record twice.
    assert_ne!(a.remaining(), b.remaining(), "{a:?} {b:?}");
    let expiry = |admission: &Admission| admission.at_nanos() / 1000 + 3_600_000_000;
    for admission in [&a, &b] {
        let at_expiry: u64 = con
            .zcount(&log, expiry(admission), expiry(admission))
            .unwrap();
        // Two scripts may run within one microsecond of Redis's clock.
        let answers = [&a, &b]
            .iter()
            .filter(|other| expiry(other) == expiry(admission))
            .count();
        assert_eq!(at_expiry, answers as u64, "{admission:?}");
    }
    assert_all_keys_expire(&mut con);
}

/// An `acquire` whose attempt timed out and then admitted late in Redis must find that
/// admission on its retry even when this process's deny cache meanwhile holds a rejection of
/// the subject that the late permit caused (another caller's, by the hour the permit filled):
/// Redis answers the call's recorded admission, so a cached rejection is stricter than Redis.
/// The retry was rejected locally until the hour's end, and charged again after it.
#[tokio::test]
async fn an_acquire_retrying_after_a_timeout_finds_its_admission_past_the_deny_cache() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(40));
    let deadline = Duration::from_millis(50);
    let period = Duration::from_secs(2);
    let limiter = RedisLimiter::builder(
        Algorithm::TokenBucket {
            rate: Rate::new(1, period),
            burst: 1,
        },
        FailurePolicy::Fallback { share: 1.0 },
    )
    .and_limit(Algorithm::FixedWindow {
        limit: 2,
        window: hour,
    })
    .prefix(PREFIX)
    .deadline(deadline)
    .build(manager(&server).await)
    .unwrap();
    // Every script cached, so that a late `EVALSHA` runs.
    limiter.acquire("warm").await.unwrap();
    limiter.try_acquire("warm too").await.unwrap();
    // Redis: the bucket emptied, the hour's first permit taken.
    limiter.try_acquire("s").await.unwrap();
    let emptied = tokio::time::Instant::now();
    // The local bucket emptied later, by a decision that timed out (its script, run late,
    // found Redis's bucket empty and took nothing).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    server.pause();
    timed(deadline, limiter.try_acquire("s")).await.unwrap();
    server.resume();
    // Redis's bucket full again, the local one still empty for about a second: the acquire's
    // attempt times out, the local bucket rejects it, and the attempt admits late in Redis,
    // taking the hour's last permit (recorded under the call's id).
    tokio::time::sleep_until(emptied + period + Duration::from_millis(100)).await;
    server.pause();
    let record = [PREFIX, ":{s}:acq"].concat();
    let other = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.resume();
        let mut raw = server.connection();
        while !raw.exists::<_, bool>(&record).unwrap() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Another caller: the hour is full; Redis rejects it until the hour's end, and the
        // deny cache keeps that.
        let rejected = rejection(limiter.try_acquire("s").await);
        assert!(
            rejected.retry_after() > Duration::from_secs(10),
            "{rejected:?}"
        );
        assert_eq!(limiter.denied_subjects(), 1);
    };
    let (admission, ()) = tokio::join!(
        limiter.acquire_timeout("s", 1, Duration::from_secs(5)),
        other
    );
    assert!(
        admission.is_ok(),
        "the late admission answered: {admission:?}"
    );
    let hourly = limiter.keys("s").remove(1);
    assert_eq!(field(&mut con, &hourly, "c"), 2, "the call charged once");
    assert_all_keys_expire(&mut con);
}

/// Every algorithm's `acquire` script: distinct calls are each charged (only a call's own
/// retry finds its field in the subject's record), and the records expire with the state; a
/// reset deletes both. Only a limiter with a fallback writes records: under the other policies
/// no attempt follows a timed-out one.
#[tokio::test]
async fn distinct_acquire_calls_are_each_charged() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    room_in_window(&mut con, hour, Duration::from_secs(30));
    let fallback = FailurePolicy::Fallback { share: 1.0 };
    for algorithm in common::all_algorithms(3, hour) {
        let limiter = limiter(&server, algorithm, fallback).await;
        let subject = format!("{algorithm:?}");
        for left in [2, 1, 0] {
            let admission = limiter.acquire(&subject).await.unwrap();
            assert_eq!(admission.remaining(), left, "{algorithm:?}");
        }
        rejection(limiter.try_acquire(&subject).await);
    }
    // A state key and a record per subject, holding one field per call, all expiring.
    let keys = assert_all_keys_expire(&mut con);
    assert_eq!(keys.len(), 8, "{keys:?}");
    let records: Vec<&String> = keys.iter().filter(|k| k.ends_with("}:acq")).collect();
    assert_eq!(records.len(), 4, "{keys:?}");
    for record in records {
        let calls: u64 = con.hlen(record).unwrap();
        assert_eq!(calls, 3, "{record}");
    }
    let first = common::all_algorithms(3, hour)[0];
    let resetter = limiter(&server, first, fallback).await;
    let subject = format!("{first:?}");
    assert_eq!(resetter.reset(&subject).await, Ok(true));
    assert_eq!(
        assert_all_keys_expire(&mut con).len(),
        6,
        "the state key and the record deleted"
    );
    for policy in [FailurePolicy::FailClosed, FailurePolicy::FailOpen] {
        let limiter = limiter(&server, first, policy).await;
        let subject = format!("{policy:?}");
        limiter.acquire(&subject).await.unwrap();
        limiter.acquire(&subject).await.unwrap();
    }
    let keys = assert_all_keys_expire(&mut con);
    assert_eq!(keys.len(), 8, "one state key each, no record: {keys:?}");
}

/// Many `acquire` calls admitted on one subject leave one record key, the subject's hash of the
/// latest calls (at most the cap of them: the oldest are evicted first), not a key per call: a
/// subject admitted through `acquire` a million times per window held a million keys. The hash
/// expires at the latest of its admissions' resets: an admission with an earlier reset (here a
/// fixed window of 10 s after a sliding window of an hour, on one prefix) never shortens it.
#[tokio::test]
async fn many_acquire_calls_on_one_subject_keep_one_bounded_record() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    let cap = REDIS_ACQUIRE_RECORDS as usize;
    let fallback = FailurePolicy::Fallback { share: 0.5 };
    let long = limiter(
        &server,
        Algorithm::SlidingWindow {
            limit: 1000,
            window: hour,
        },
        fallback,
    )
    .await;
    let calls = 2 * cap + 5;
    let mut ats = Vec::with_capacity(calls);
    for _ in 0..calls {
        ats.push(long.acquire("s").await.unwrap().at_nanos() / 1000);
    }
    let keys = assert_all_keys_expire(&mut con);
    let records: Vec<&String> = keys.iter().filter(|k| k.contains(":acq")).collect();
    assert_eq!(records, ["t:{s}:acq"], "{keys:?}");
    let held: HashMap<String, String> = con.hgetall("t:{s}:acq").unwrap();
    assert_eq!(held.len(), cap);
    // The latest calls' admissions: "now:reset_after:remaining:held", now in µs.
    let mut times: Vec<u64> = held
        .values()
        .map(|v| v.split(':').next().unwrap().parse().unwrap())
        .collect();
    times.sort_unstable();
    assert_eq!(times, ats[calls - cap..], "the oldest evicted first");
    let ttl = |con: &mut redis::Connection| -> i64 { con.pttl("t:{s}:acq").unwrap() };
    assert!(ttl(&mut con) > 3_590_000, "{}", ttl(&mut con));
    let short = limiter(
        &server,
        Algorithm::FixedWindow {
            limit: 10,
            window: Duration::from_secs(10),
        },
        fallback,
    )
    .await;
    short.acquire("s").await.unwrap();
    let held: HashMap<String, String> = con.hgetall("t:{s}:acq").unwrap();
    assert_eq!(held.len(), cap);
    assert!(ttl(&mut con) > 3_590_000, "shortened to {}", ttl(&mut con));
    // An older version's record (a string) is replaced, not an error.
    let _: () = con.set_ex("t:{old}:acq", "1:2:3", 60).unwrap();
    assert_eq!(long.acquire("old").await.unwrap().remaining(), 999);
    let calls: u64 = con.hlen("t:{old}:acq").unwrap();
    assert_eq!(calls, 1);
    assert_eq!(long.reset("old").await, Ok(true));
    // A reset deletes the record with the state.
    assert_eq!(short.reset("s").await, Ok(true));
    assert_eq!(long.reset("s").await, Ok(true));
    assert_eq!(assert_all_keys_expire(&mut con), Vec::<String>::new());
}

/// Redis stopped (SIGSTOP: every decision times out) and `Fallback`: a subject has spent its
/// local share, and a reconfiguration that leaves the share as it is (a limit raised by one,
/// rounded down to the same half) or lowers it must not give the share back. When the fallback
/// was rebuilt empty by every reconfiguration, each one during an outage (an HTTP reload that
/// changed a rule's limit) handed every client its fallback share again. Only an exact sliding
/// window's share raised above the ring it was built with cannot be kept, and starts empty.
#[tokio::test]
async fn a_reconfiguration_during_an_outage_keeps_the_fallback_spent() {
    let server = RedisServer::start();
    let deadline = Duration::from_millis(50);
    let hour = Duration::from_secs(3600);
    let fallback = FailurePolicy::Fallback { share: 0.5 };
    let build = |algorithm| {
        RedisLimiter::builder(algorithm, fallback)
            .prefix(PREFIX)
            .deadline(deadline)
    };
    let mut limiters = Vec::new();
    for algorithm in common::all_algorithms(4, hour) {
        limiters.push(build(algorithm).build(manager(&server).await).unwrap());
    }
    let fixed = |limit| Algorithm::FixedWindow {
        limit,
        window: hour,
    };
    let chain = build(fixed(10))
        .and_limit(common::all_algorithms(4, hour)[1])
        .build(manager(&server).await)
        .unwrap();
    server.pause();
    let spend = |limiter: &RedisLimiter| {
        let limiter = limiter.clone();
        async move {
            for _ in 0..2 {
                timed(deadline, limiter.try_acquire("s")).await.unwrap();
            }
            rejection(timed(deadline, limiter.try_acquire("s")).await);
        }
    };
    for (limiter, (raised, lowered)) in limiters.iter().zip(
        common::all_algorithms(5, hour)
            .into_iter()
            .zip(common::all_algorithms(2, hour)),
    ) {
        spend(limiter).await;
        limiter.reconfigure(raised).unwrap();
        let r = rejection(timed(deadline, limiter.try_acquire("s")).await);
        assert_eq!(r.limit(), 2, "{raised:?}");
        limiter.reconfigure(lowered).unwrap();
        let r = rejection(timed(deadline, limiter.try_acquire("s")).await);
        assert_eq!(r.limit(), 1, "{lowered:?}");
    }
    spend(&chain).await;
    chain.reconfigure_limit(0, fixed(12)).unwrap();
    rejection(timed(deadline, chain.try_acquire("s")).await);
    chain
        .reconfigure_all([fixed(8), common::all_algorithms(5, hour)[1]])
        .unwrap();
    rejection(timed(deadline, chain.try_acquire("s")).await);
    // The log's share raised past the ring of two it was built with: that member starts
    // empty (the fixed window's count of two, under a share of 5, is kept).
    let log = &limiters[1];
    log.reconfigure(common::all_algorithms(8, hour)[1]).unwrap();
    for _ in 0..4 {
        timed(deadline, log.try_acquire("s")).await.unwrap();
    }
    rejection(timed(deadline, log.try_acquire("s")).await);
    chain
        .reconfigure_all([fixed(10), common::all_algorithms(8, hour)[1]])
        .unwrap();
    for _ in 0..3 {
        timed(deadline, chain.try_acquire("s")).await.unwrap();
    }
    assert_eq!(
        rejection(timed(deadline, chain.try_acquire("s")).await).limit(),
        5
    );
}

/// `acquire_timeout` gives up at its time limit, the sleep toward the retry-after (200 ms)
/// cut short there and nothing charged, and is admitted when the permit frees within it.
#[tokio::test]
async fn acquire_timeout_gives_up_at_its_time_limit_and_is_admitted_within_it() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::TokenBucket {
            rate: Rate::per_second(5),
            burst: 1,
        },
        FailurePolicy::FailClosed,
    )
    .await;
    limiter.try_acquire("t").await.unwrap();
    let state = dump(&mut con, &limiter.key("t"));
    let started = Instant::now();
    assert_eq!(
        limiter
            .acquire_timeout("t", 1, Duration::from_millis(50))
            .await,
        Err(AcquireError::Timeout)
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(50) && took < Duration::from_millis(150),
        "{took:?}"
    );
    assert_eq!(dump(&mut con, &limiter.key("t")), state, "nothing charged");
    let admission = limiter
        .acquire_timeout("t", 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(admission.remaining(), 0);
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(limiter.stats().admitted, 2);
    assert_all_keys_expire(&mut con);
}

/// The time limit ends a sleep between attempts, never a round trip: the server stopped
/// (SIGSTOP) while the first attempt is in flight, and answering only after the 50 ms limit
/// (within the limiter's 200 ms deadline), the call answers that admission. A
/// `tokio::time::timeout` around `acquire_n` drops the call there and leaves the permit charged
/// in Redis with nobody holding it.
#[tokio::test]
async fn acquire_timeout_answers_the_round_trip_in_flight_at_its_time_limit() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let limiter = limiter(
        &server,
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        },
        FailurePolicy::FailClosed,
    )
    .await;
    // A first decision, so that the connection and the script are ready before the pause.
    limiter.try_acquire("warm").await.unwrap();
    server.pause();
    let resume = async {
        tokio::time::sleep(Duration::from_millis(120)).await;
        server.resume();
    };
    let started = Instant::now();
    let (admission, ()) = tokio::join!(
        limiter.acquire_timeout("s", 1, Duration::from_millis(50)),
        resume
    );
    let admission = admission.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(120));
    assert_eq!(admission.remaining(), 0);
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.timeouts), (2, 0), "{stats:?}");
    // The admission answered is the one Redis holds: the window is spent.
    assert_eq!(
        rejection(limiter.try_acquire("s").await).limit(),
        1,
        "the permit was charged once, to this call"
    );
    assert_all_keys_expire(&mut con);
}
