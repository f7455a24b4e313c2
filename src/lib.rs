//! # turnstile
//!
//! Admit or reject work by rate and by concurrency, per key, on one machine or across many.
//!
//! This release provides four lock-free rate-limit algorithms behind one handle, [`RateLimiter`],
//! with a non-blocking [`try_acquire`](RateLimiter::try_acquire), waiting in a fair, bounded,
//! cancel-safe queue
#![cfg_attr(feature = "tokio", doc = "([`acquire`](RateLimiter::acquire)")]
#![cfg_attr(not(feature = "tokio"), doc = "(`acquire`")]
//! `.await`,
//! [`acquire_blocking`](RateLimiter::acquire_blocking)), and a [`ConcurrencyLimiter`] for "at most
//! N in flight". [`Chain`] (and, per key, `KeyedChain`) applies several limits at once, all or
//! nothing.
//!
//! Per key (feature `keyed`, on by default), `KeyedLimiter`, `KeyedConcurrencyLimiter`, the
//! keyed reader/writer locks `KeyLocks` and `BanList` (ban a key for a while after repeated
//! failures: login brute-force protection); across processes, `RedisLimiter` (feature
//! `redis`), and `StoreLimiter` over any store with get and set-with-expiry (feature `store`;
//! exact within one process only); for HTTP services, the tower layer in `turnstile::http`
//! (feature `http`): rules per endpoint, client IP and client id, trusted proxies, bans, IETF
//! `RateLimit` headers and 429 with `Retry-After`; for Envoy, its rate limit service's
//! `ShouldRateLimit` gRPC API from envoyproxy/ratelimit's configuration files, in
//! `turnstile::envoy` (feature `envoy`).
//!
//! The README maps the concepts of governor, tower_governor, .NET's
//! `System.Threading.RateLimiting`, AspNetCoreRateLimit, rate-limiter-flexible and Envoy's
//! ratelimit service to the items of this crate, and says where there is no equivalent.
//!
//! | algorithm | exactness | memory | bursts |
//! |---|---|---|---|
//! | fixed window | ≤ limit per aligned window; up to 2 × limit across a boundary | 8 bytes | a full window's worth at each boundary |
//! | sliding window (exact log) | ≤ limit in *every* interval of length window | 8 bytes × limit | up to limit at once, then paced by expiry |
//! | sliding counter | approximate: < 2 × limit in any window-long interval | 24 bytes | smoothed |
//! | token bucket (GCRA) | ≤ burst + rate × t in any interval of length t | 8 bytes | up to burst, refilled continuously |
//!
//! ```
//! use std::time::Duration;
//! use turnstile::{RateLimiter, TryAcquireError};
//!
//! let limiter = RateLimiter::sliding_window(100, Duration::from_secs(60))?;
//! match limiter.try_acquire() {
//!     Ok(admission) => println!("admitted, {} left", admission.remaining()),
//!     Err(TryAcquireError::Rejected(r)) => println!("retry in {:?}", r.retry_after()),
//!     Err(e) => println!("{e}"),
//! }
//! # Ok::<(), turnstile::ConfigError>(())
//! ```
//!
//! ## Guarantees
//!
//! - **Exactness** under any thread interleaving, on the times the limiter assigns (each
//!   [`Admission::at`]): proven for small cases by loom models (`loom-tests/`) and audited on real
//!   threads (`tests/stress.rs`).
//! - **Denials are free**: a rejected `try_acquire` writes no shared memory (but for one cold
//!   case: while waiters are queued oldest first, a refusal briefly takes the queue's mutex to
//!   count what they wait for in its `retry_after`).
//! - **Waiting is fair and cancel-safe**: waiters are served in [`QueueOrder`]; dropping a waiting
//!   future consumes nothing and passes the turn on.
//! - **Waiting runs on any executor** (feature `tokio`, on by default): a waiter that must sleep
//!   does so on tokio's timer inside a tokio runtime (which must then have its time driver
//!   enabled, and be running: a current-thread runtime only entered with `Handle::enter`, not
//!   inside its `block_on`, never fires a timer, as tokio's own `sleep` would not) and on
//!   futures-timer's helper thread anywhere else (`futures::executor::block_on`, smol,
//!   async-std); so do the sweepers (`run_sweeper`). What still needs a tokio runtime:
//!   `RedisLimiter`, the HTTP layer and the Envoy service, which run on tokio.
//! - **Bad input** gets a [`ConfigError`], never a panic.
//! - **Time** comes from one [`Clock`] per limiter; tests use [`ManualClock`].

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

// The unit tests of the Redis backend start their server with the integration tests' helper,
// which names this crate `turnstile`.
#[cfg(all(test, feature = "redis"))]
extern crate self as turnstile;

mod algorithm;
#[cfg(feature = "redis")]
mod backend;
#[cfg(feature = "keyed")]
mod bans;
mod chain;
mod clock;
mod concurrency;
mod decision;
#[cfg(feature = "envoy")]
pub mod envoy;
mod error;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "keyed")]
mod keyed;
#[cfg(feature = "keyed")]
mod keyed_concurrency;
#[cfg(feature = "keyed")]
mod keylocks;
mod limiter;
mod queue;
mod refund;
#[cfg(feature = "store")]
mod store;
mod sync;
#[cfg(feature = "tokio")]
mod timer;
mod watchers;

#[cfg(feature = "redis")]
pub use backend::{
    FailurePolicy, REDIS_ACQUIRE_RECORDS, REDIS_MAX_SLIDING_LIMIT, RedisLimiter,
    RedisLimiterBuilder, RedisStats,
};
#[cfg(feature = "keyed")]
pub use bans::{
    BAN_RESOLUTION, BanList, BanListBuilder, BanListFull, BanStats, Banned, FailOutcome,
};
pub use chain::{Chain, ChainBuilder, ChainRefundable, ChainStats};
#[cfg(feature = "keyed")]
pub use chain::{KeyedChain, KeyedChainBuilder, KeyedChainRefundable};
#[cfg(feature = "tokio")]
pub use clock::TokioClock;
/// The upkeep clock's protocol, for its loom model (`loom-tests/loom_upkeep.rs`) only.
#[cfg(turnstile_loom)]
#[doc(hidden)]
pub use clock::Upkeep;
pub use clock::{Clock, DefaultClock, ManualClock, MonotonicClock, UpkeepClock};
pub use concurrency::{ConcurrencyLimiter, ConcurrencyLimiterBuilder, OwnedPermit, Permit};
pub use decision::{Admission, Rejection};
pub use error::{AcquireError, ConfigError, TryAcquireError, TryPermitError};
#[cfg(feature = "keyed")]
pub use keyed::{DEFAULT_MAX_KEYS, KeyOverflow, KeyedLimiter, KeyedLimiterBuilder, KeyedStats};
#[cfg(feature = "keyed")]
pub use keyed_concurrency::{
    KeyedConcurrencyLimiter, KeyedConcurrencyLimiterBuilder, KeyedPermit, OwnedKeyedPermit,
};
#[cfg(feature = "keyed")]
pub use keylocks::{
    DEFAULT_POOL_PER_SHARD, KeyLocks, KeyLocksBuilder, OwnedReadGuard, OwnedWriteGuard, ReadGuard,
    TryLockError, WriteGuard,
};
pub use limiter::{Algorithm, Rate, RateLimiter, RateLimiterBuilder, Stats};
pub use queue::{DEFAULT_QUEUE_LIMIT, QueueOrder};
#[cfg(feature = "keyed")]
pub use refund::KeyedRefundable;
pub use refund::Refundable;
#[cfg(feature = "store")]
pub use store::{Store, StoreLimiter, StoreStats};
/// The chain watchers' protocol, for its loom model (`loom-tests/loom_chain.rs`) only.
#[cfg(turnstile_loom)]
#[doc(hidden)]
pub use watchers::{ModelWaiter, Watchers};

/// The redis-rs crate this one is built against (feature `redis`): build the connection for a
/// [`RedisLimiter`] with it, so that the versions match.
///
/// # Examples
///
/// ```no_run
/// use turnstile::redis::{aio::ConnectionManager, Client};
///
/// # async fn demo() -> Result<(), turnstile::redis::RedisError> {
/// let connection = ConnectionManager::new(Client::open("redis://127.0.0.1/")?).await?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "redis")]
pub use ::redis;

/// The README's examples, compiled and run as doc tests so that they cannot rot. They use the
/// Redis and HTTP parts, so they run with those features (CI runs `--all-features`).
#[cfg(all(doctest, feature = "redis", feature = "http", feature = "axum"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
