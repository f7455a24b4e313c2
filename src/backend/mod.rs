//! [`RedisLimiter`]: the crate's algorithms run atomically inside Redis or Valkey, shared by every
//! process that uses the same server and key prefix.
//!
//! Each algorithm is one Lua script (`src/backend/scripts/*.lua`), run with `EVALSHA`: one round
//! trip per decision. A script reads Redis's own clock (`TIME`, in microseconds), decides from what
//! it read, and writes only when it admits (or records a [charge](RedisLimiter::charge)), so a
//! rejection changes nothing (except to repair a key: one found without a TTL is given one,
//! state written under other parameters is rewritten once under the caller's, and state no
//! script writes is deleted; see [`RedisLimiter`]). Every key it writes gets a TTL in the same script.

// The connection of the HTTP rules' and Envoy's service's limiters.
#[cfg(any(feature = "http", feature = "envoy"))]
mod connection;
mod deny;
mod keys;
// Used by the HTTP rules and Envoy's rate limit service counted in Redis.
#[cfg_attr(
    not(any(feature = "http", feature = "envoy")),
    allow(dead_code, unused_imports)
)]
mod multi;

#[cfg(any(feature = "http", feature = "envoy"))]
pub(crate) use connection::Connection;
// The HTTP rules' deny caches, each asked before one script decides them all.
#[cfg(any(feature = "http", feature = "envoy"))]
pub(crate) use multi::settled;
#[cfg(feature = "http")]
pub(crate) use multi::try_acquire_all;
// Envoy's service on a Cluster: one call per slot, given back when another slot rejects.
#[cfg(feature = "envoy")]
pub(crate) use multi::{Held, Over, try_acquire_all_held};

use crate::chain::{KeyedChain, Taken};
use crate::decision::{Admission, Rejection};
use crate::error::{AcquireError, ConfigError, TryAcquireError};
use crate::keyed::KeyedLimiter;
use crate::limiter::{Algorithm, Rate};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{ErrorKind, RedisError, ServerErrorKind};
use arc_swap::ArcSwap;
use deny::DenyCache;
use keys::Tag;
use std::fmt;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// The largest `limit` a [`RedisLimiter`] accepts for [`Algorithm::SlidingWindow`].
///
/// The exact sliding window keeps one sorted-set member per permit admitted in the last window:
/// up to `limit` members per subject. Measured with `MEMORY USAGE` (BENCHMARKS.md): about 37 bytes
/// per permit while the set keeps Redis's compact encoding (up to 128 members), about 130 bytes
/// per permit beyond, so a subject at this limit costs about 13 MB. It costs time as well: one
/// call of `n` permits adds `n` members in one script, which takes time in proportion to `n`
/// and blocks the server meanwhile; a call of many thousands can outlast the deadline, and its
/// caller then gets the failure policy's answer while the script goes on to take the permits
/// (the default deadline is 50 ms). For large limits use
/// [`Algorithm::SlidingCounter`] or [`Algorithm::TokenBucket`], which cost one small key whatever
/// the limit and the same time whatever `n`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, ConfigError, FailurePolicy, RedisLimiter, REDIS_MAX_SLIDING_LIMIT};
///
/// let too_big = Algorithm::SlidingWindow { limit: REDIS_MAX_SLIDING_LIMIT + 1, window: Duration::from_secs(60) };
/// let err = RedisLimiter::builder(too_big, FailurePolicy::FailClosed).check().unwrap_err();
/// assert!(matches!(err, ConfigError::TooLarge { .. }));
/// ```
pub const REDIS_MAX_SLIDING_LIMIT: u32 = 100_000;

/// The most [`acquire`](RedisLimiter::acquire_n) calls a [`RedisLimiter`] under
/// [`FailurePolicy::Fallback`] remembers per subject, so as to charge each call once when an
/// attempt that timed out was admitted late (see [`acquire_n`](RedisLimiter::acquire_n)).
///
/// The record is one hash per subject, `prefix:{subject}:acq`, of call id → admission; a full
/// one drops its oldest admissions first. Small, so that a subject admitted through `acquire`
/// at a high rate (workers sharing one global limit, a million calls an hour) costs one small
/// key, not one per call; large enough that a call's retry, which follows its timed-out attempt
/// within about a retry-after, finds its record unless this many other `acquire` calls on the
/// subject were admitted in between. A call whose record was dropped is charged a second time:
/// a permit nobody uses, never an admission beyond the limit.
///
/// # Examples
///
/// ```
/// // `HLEN prefix:{subject}:acq` is at most this, whatever the subject's traffic.
/// let most = turnstile::REDIS_ACQUIRE_RECORDS;
/// assert_eq!(most, 32);
/// ```
pub const REDIS_ACQUIRE_RECORDS: u32 = 32;

/// Products of microseconds and counts must stay exact in a Lua number (a double).
const MAX_EXACT: u128 = 1 << 52;

/// The deadline of one decision unless the builder says otherwise.
const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);

/// The deny cache's capacity unless the builder says otherwise.
const DEFAULT_DENY_CACHE: usize = 10_000;

/// One algorithm's script: its source and the SHA-1 that `EVALSHA` names it by.
struct Lua {
    body: &'static str,
    sha: String,
}

impl Lua {
    fn new(body: &'static str) -> Self {
        Lua {
            body,
            sha: ::redis::Script::new(body).get_hash().to_owned(),
        }
    }
}

/// One algorithm's script: the prelude, the algorithm's function, and a one-key runner of the
/// prelude (`single` for decisions, `charge_one` for charges).
macro_rules! one_key {
    ($file:literal, $function:literal, $runner:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!($file),
            "\nreturn ",
            $runner,
            "(",
            $function,
            ")\n"
        )
    };
}

static FIXED_WINDOW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/fixed_window.lua",
        "fixed_window",
        "single"
    ))
});
static SLIDING_WINDOW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/sliding_window.lua",
        "sliding_window",
        "single"
    ))
});
static SLIDING_COUNTER: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/sliding_counter.lua",
        "sliding_counter",
        "single"
    ))
});
static TOKEN_BUCKET: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/token_bucket.lua",
        "token_bucket",
        "single"
    ))
});

/// One algorithm's script for the attempts of an `acquire` call: `single` inside `once`
/// (`scripts/once.lua`), which answers a retry of a call already admitted from its record.
macro_rules! one_key_once {
    ($file:literal, $function:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!($file),
            include_str!("scripts/once.lua"),
            "\nreturn once(function() return single(",
            $function,
            ") end)\n"
        )
    };
}

static FIXED_WINDOW_ONCE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(one_key_once!("scripts/fixed_window.lua", "fixed_window")));
static SLIDING_WINDOW_ONCE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key_once!(
        "scripts/sliding_window.lua",
        "sliding_window"
    ))
});
static SLIDING_COUNTER_ONCE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key_once!(
        "scripts/sliding_counter.lua",
        "sliding_counter"
    ))
});
static TOKEN_BUCKET_ONCE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(one_key_once!("scripts/token_bucket.lua", "token_bucket")));

static FIXED_WINDOW_CHARGE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/fixed_window.lua",
        "fixed_window",
        "charge_one"
    ))
});
static SLIDING_WINDOW_CHARGE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/sliding_window.lua",
        "sliding_window",
        "charge_one"
    ))
});
static SLIDING_COUNTER_CHARGE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/sliding_counter.lua",
        "sliding_counter",
        "charge_one"
    ))
});
static TOKEN_BUCKET_CHARGE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(one_key!(
        "scripts/token_bucket.lua",
        "token_bucket",
        "charge_one"
    ))
});
/// A script over several members: the prelude, every algorithm's function, the all-or-nothing
/// runner (`members.lua`), then `$file`'s reply.
macro_rules! members {
    ($file:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/fixed_window.lua"),
            include_str!("scripts/sliding_window.lua"),
            include_str!("scripts/sliding_counter.lua"),
            include_str!("scripts/token_bucket.lua"),
            include_str!("scripts/members.lua"),
            include_str!($file),
        )
    };
    // `$file`'s body as a function, run inside `once` (`scripts/once.lua`).
    (once $file:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/fixed_window.lua"),
            include_str!("scripts/sliding_window.lua"),
            include_str!("scripts/sliding_counter.lua"),
            include_str!("scripts/token_bucket.lua"),
            include_str!("scripts/members.lua"),
            include_str!("scripts/once.lua"),
            "local function chain_decision()\n",
            include_str!($file),
            "\nend\nreturn once(chain_decision)\n",
        )
    };
}

/// Several limits for one subject: one aggregated reply.
static CHAIN: LazyLock<Lua> = LazyLock::new(|| Lua::new(members!("scripts/chain.lua")));
/// [`CHAIN`] for the attempts of an `acquire` call, inside `once` (`scripts/once.lua`).
static CHAIN_ONCE: LazyLock<Lua> = LazyLock::new(|| Lua::new(members!(once "scripts/chain.lua")));
/// Several limiters, each with its own subject: one reply per member ([`multi`]).
static MULTI: LazyLock<Lua> = LazyLock::new(|| Lua::new(members!("scripts/multi.lua")));
/// A charge to every limit of one subject: one aggregated reply.
static CHAIN_CHARGE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(members!("scripts/chain_charge.lua")));

/// What a [`RedisLimiter`] does when Redis does not answer within the deadline, or answers with an
/// error.
///
/// A decision that timed out is never retried: the script may have run (and admitted) even though
/// its reply was lost, and retrying could charge the subject twice. (An
/// [`acquire`](RedisLimiter::acquire_n) whose fallback rejected tries again after the
/// retry-after, as it does after any rejection; its attempts carry one call id, so that a
/// timed-out attempt that admitted late is answered, not charged again.)
///
/// # Examples
///
/// ```
/// use turnstile::FailurePolicy;
///
/// // Serve each process at a quarter of the global limit while Redis is away
/// // (for example with four processes sharing the limit).
/// let policy = FailurePolicy::Fallback { share: 0.25 };
/// assert_ne!(policy, FailurePolicy::FailOpen);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit: availability over protection. The admission has `remaining` = the full capacity
    /// and `reset_after` = 0, and its `at` is this machine's wall clock.
    FailOpen,
    /// Reject with [`TryAcquireError::Unavailable`]: protection over availability.
    FailClosed,
    /// Decide in a local in-memory [`KeyedLimiter`] running the same algorithm at `share` of the
    /// global limit (limit and burst each scaled by `share`, rounded down, at least 1; the
    /// rate's permits per period scaled likewise while at least one remains, and otherwise one
    /// permit per period stretched in proportion: a quarter of 1 per minute is 1 per 4
    /// minutes). `share` must be in (0, 1]; with P processes, 1/P keeps the global total near
    /// the limit.
    /// The admission's `at` is then on the local limiter's clock, not Redis's. The local
    /// limiter counts at most
    /// [`fallback_max_keys`](RedisLimiterBuilder::fallback_max_keys) subjects. A call for more
    /// permits than the local share can ever admit gets [`TryAcquireError::Unavailable`] (not
    /// `InsufficientCapacity`: Redis admits it once it is back).
    Fallback {
        /// The fraction of the global limit each process may admit on its own.
        share: f64,
    },
}

/// Counts kept by a [`RedisLimiter`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(limiter: turnstile::RedisLimiter) {
/// let stats = limiter.stats();
/// println!("{} admitted, {} fallback decisions", stats.admitted, stats.fallbacks);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RedisStats {
    /// Decisions Redis admitted.
    pub admitted: u64,
    /// Decisions Redis rejected.
    pub rejected: u64,
    /// Calls rejected by the local deny cache, with no round trip.
    pub denied_locally: u64,
    /// Decisions that failed because Redis answered with an error or could not be reached.
    pub errors: u64,
    /// Decisions that failed because Redis did not answer within the deadline.
    pub timeouts: u64,
    /// Failed decisions answered by the local fallback limiter ([`FailurePolicy::Fallback`]).
    pub fallbacks: u64,
    /// Failed decisions admitted by [`FailurePolicy::FailOpen`].
    pub failed_open: u64,
    /// Failed decisions rejected by [`FailurePolicy::FailClosed`].
    pub failed_closed: u64,
    /// Keys found holding what this limiter's script cannot read as its state (a window of
    /// length 0, a negative count, a time past 2^53 µs, a key of another type, ...: written by
    /// something else), by decisions and charges alike. Each was read as no state and
    /// overwritten (deleted if the call wrote nothing), so it is counted once.
    pub repaired: u64,
}

const ADMITTED: usize = 0;
const REJECTED: usize = 1;
const DENIED_LOCALLY: usize = 2;
const ERRORS: usize = 3;
const TIMEOUTS: usize = 4;
const FALLBACKS: usize = 5;
const FAILED_OPEN: usize = 6;
const FAILED_CLOSED: usize = 7;
const REPAIRED: usize = 8;

/// A rate limiter whose state lives in Redis or Valkey, shared by every process that uses the same
/// server and key prefix. Keyed by string-like subjects (`&str`, `String`, `&[u8]`, ...).
///
/// - **Algorithms**: the four of [`Algorithm`], each as one atomic Lua script. Windows and the
///   token bucket's time per permit are kept in whole microseconds (rounded up: never looser).
///   The exact sliding window's limit is at most [`REDIS_MAX_SLIDING_LIMIT`]; the sliding
///   counter needs `limit × window` ≤ 2^52 µs (for example 10^6 per hour), so that its arithmetic
///   stays exact in Lua's doubles.
/// - **One clock**: Redis's `TIME`. [`Admission::at`] is Redis's time since the Unix epoch;
///   application clocks are never read for a decision.
/// - **One round trip** per decision: `EVALSHA`. After Redis lost its script cache (restart,
///   failover, `SCRIPT FLUSH`) the first call per script costs two commands: `EVALSHA`, which
///   answers `NOSCRIPT`, then `EVAL`, which runs the script and caches it again.
/// - **Keys**: `prefix:{subject}:fw` (or `:sw`, `:sc`, `:tb`), and under
///   [`FailurePolicy::Fallback`] `prefix:{subject}:acq` for a subject Redis admitted through
///   [`acquire`](Self::acquire_n) (its record: a hash of at most [`REDIS_ACQUIRE_RECORDS`]
///   call ids, whatever the subject's traffic). The subject is
///   the hash tag, so a subject's keys share one Cluster slot. Subjects longer than 64 bytes are
///   replaced by `sha256:` and their SHA-256 in hex, and so are the empty subject and those
///   starting with `}` (they would leave the tag empty). Every key carries a TTL: it disappears
///   once its state is indistinguishable from a fresh key's. What a key holds: the fixed window a
///   hash of the current window's start, its length, its count and when the key was created
///   (Redis's µs); the sliding counter a hash of the window's start, length and count and the
///   previous window's count; the exact sliding window a sorted set of one member per permit,
///   scored by its expiry; the token bucket a string `"<TAT>:<capacity>"` (µs). A key holding
///   anything else (another type, a window of length 0, a negative count, a time past 2^53 µs) is
///   read as no state and deleted, and counted in [`RedisStats::repaired`]: the call decides as for
///   a subject seen for the first time.
/// - **Deadline and failure policy**: each decision must complete within the
///   [deadline](RedisLimiterBuilder::deadline) (default 50 ms), or the [`FailurePolicy`] decides;
///   a timed-out decision is never retried (the script may have run; an `acquire` that goes on
///   waiting is charged once all the same: see [`acquire_n`](Self::acquire_n)). Service returns
///   to Redis on the next call that succeeds: there is no circuit breaker to reset.
/// - **Deny cache**: after Redis rejects a subject with a retry-after t, calls for it asking as
///   many permits are rejected in-process until t, without a round trip (but for the attempts
///   of an [`acquire`](Self::acquire_n) call after one that got no reply, which Redis may
///   have admitted late: they ask Redis). Never stricter
///   than Redis's answer at the time: t is counted from when the rejected request was sent. But
///   the cache is this process's own: when the subject's state changes by other means (a
///   [`reset`](Self::reset) from another process, a `DEL`), this process keeps rejecting it
///   from the cache until t has passed. Bounded ([`deny_cache`](RedisLimiterBuilder::deny_cache));
///   `deny_cache(0)` turns it off, so that every call asks Redis.
///
/// **A limiter with other parameters on existing keys.** A limiter meets keys written under
/// other parameters after [`reconfigure`](Self::reconfigure) (or
/// [`reconfigure_all`](Self::reconfigure_all)), and after a redeploy with another limit,
/// window, rate or burst, whose new limiter meets the keys the old one wrote under the same
/// prefix. It carries their state over as the in-memory
/// [`RateLimiter::reconfigure`](crate::RateLimiter::reconfigure) does, at the first call that
/// meets each key: a new limit applies to the counts kept; a fixed window or sliding counter
/// with another window length keeps the count of the window running, which keeps its start if
/// it is younger than the new length (and then ends at start + the new length) and otherwise
/// ends at the earlier of its old end and now + the new length, later windows following on from
/// that end (the previous window's count, for the counter, is weighed over the new length); the
/// exact sliding
/// window's permits each keep the expiry they were admitted with; a token bucket stays as full
/// as it was (its debt scaled to the new capacity, rounded up). The translated state is written
/// back at that first call, even if it rejects or only probes. A key that has expired is fresh
/// under any parameters (and windows are then aligned to the Unix epoch again). While old and new
/// parameters are both in use (a rolling deploy, or a process reconfigured before another), each
/// call decides under its own limiter's parameters,
/// translating the state it finds; nothing is handed out afresh by the switch either way. The
/// exact sliding window counts its live permits, where the in-memory ring decides by position
/// after a shorter window (stricter there); every other answer matches. Only keys of the same
/// name are met, and a key is named by its limit's kind and place (`:fw` for a lone fixed
/// window, `:c0.fw` for the first limit of a chain): a redeploy that changes a limit's
/// algorithm, or turns a lone limit into a chain (or back), meets none of the old keys, and
/// those limits start afresh for every subject; one that reorders a chain's limits meets at
/// each place what the limit there before wrote.
///
/// `Clone` is cheap and shares everything. The connection type `C` is any redis-rs async
/// connection that is `Clone` (each decision clones it): [`ConnectionManager`] for a standalone
/// server (it reconnects by itself and never resends a command), or
/// `redis::cluster_async::ClusterConnection` for Redis Cluster (`EVALSHA` is routed by the key's
/// slot; `NOSCRIPT` is repaired per node). Note that redis-rs's cluster client by default resends
/// a request after a connection error (`ClusterClientBuilder::retries`, 16 by default): a script
/// whose reply was lost with the connection then runs twice, charging twice. Set the retries low
/// where a double charge matters; the deadline bounds the time either way.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use turnstile::{Algorithm, FailurePolicy, Rate, RedisLimiter};
/// use turnstile::redis::{aio::ConnectionManager, Client};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let connection = ConnectionManager::new(Client::open("redis://127.0.0.1/")?).await?;
/// let limiter = RedisLimiter::builder(
///     Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 20 },
///     FailurePolicy::Fallback { share: 0.25 },
/// )
/// .prefix("api")
/// .deadline(Duration::from_millis(20))
/// .build(connection)?;
///
/// match limiter.try_acquire("user:42").await {
///     Ok(admission) => println!("admitted, {} left", admission.remaining()),
///     Err(e) => println!("{e}"),
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisLimiter<C = ConnectionManager> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    connection: C,
    prefix: String,
    deadline: Duration,
    policy: FailurePolicy,
    /// The deny cache's capacity, for the fresh cache of each reconfiguration.
    deny_cache: usize,
    /// The most subjects the local fallback counts, for a reconfiguration's fresh limiters.
    fallback_keys: usize,
    /// The parameters in force. Every call takes one snapshot ([`Inner::config`]) and decides
    /// under it alone; [`RedisLimiter::reconfigure_all`] replaces it whole. An `ArcSwap`, not a
    /// mutex: a call the deny cache rejects reads it without writing a line other threads read
    /// (arc-swap's load borrows through the thread's own debt slot), so that denials stay free
    /// under a flood; a call that goes to Redis then takes its own reference.
    config: ArcSwap<Config>,
    /// Serialises reconfigurations (a change of one limit reads the others in force).
    reconfiguring: Mutex<()>,
    counters: [AtomicU64; 9],
}

/// One set of parameters of a [`RedisLimiter`], and what was derived from them: replaced whole
/// by a reconfiguration, so that no decision mixes two sets.
struct Config {
    /// The limits, in the order given; one for a plain limiter, several for a chain.
    members: Vec<Member>,
    /// The algorithm's script, or [`CHAIN`] for several members.
    script: &'static Lua,
    /// The script of an `acquire` call's attempts, or [`CHAIN_ONCE`] for several members.
    once: &'static Lua,
    /// The algorithm's charge script, or [`CHAIN_CHARGE`] for several members.
    charge: &'static Lua,
    /// The most permits one call can get: the smallest member capacity.
    capacity: u32,
    /// The local fallback at these parameters' share ([`FailurePolicy::Fallback`]).
    fallback: Option<Local>,
    /// Rejections Redis gave under these parameters. A reconfiguration starts an empty cache:
    /// a rejection under the old parameters says nothing of the new ones (a raised limit
    /// admits at once), and one arriving late from a call under the old parameters lands in
    /// the old cache, which nothing reads any more.
    deny: DenyCache,
}

impl<C> Clone for RedisLimiter<C> {
    fn clone(&self) -> Self {
        RedisLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("algorithms", &self.algorithms().collect::<Vec<_>>())
            .field("prefix", &self.inner.prefix)
            .field("deadline", &self.inner.deadline)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisLimiter`]; see [`RedisLimiter::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, FailurePolicy, RedisLimiter};
///
/// let builder = RedisLimiter::builder(
///     Algorithm::FixedWindow { limit: 100, window: Duration::from_secs(60) },
///     FailurePolicy::FailClosed,
/// )
/// .prefix("login")
/// .deadline(Duration::from_millis(10))
/// .deny_cache(1_000);
/// assert!(builder.check().is_ok());
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisLimiterBuilder {
    algorithms: Vec<Algorithm>,
    policy: FailurePolicy,
    prefix: String,
    deadline: Duration,
    deny_cache: usize,
    fallback_keys: usize,
}

/// The local fallback: the same limits at a share, per subject tag (a chain of one for a plain
/// limiter).
type Local = KeyedChain<Box<[u8]>>;

/// How one limit runs in Redis.
struct Plan {
    script: &'static Lua,
    /// The script of an `acquire` call's attempts (`once`).
    once: &'static Lua,
    /// The script of [`RedisLimiter::charge`].
    charge: &'static Lua,
    /// The algorithm's number in `chain.lua` (1 fixed window ... 4 token bucket).
    kind: u8,
    suffix: &'static str,
    /// The script's parameters: window (or time per permit) in µs, then limit (or burst).
    params: [u64; 2],
    capacity: u32,
}

/// One limit of a limiter: its algorithm, how it runs, and its key's suffix.
struct Member {
    algorithm: Algorithm,
    plan: Plan,
    /// `fw`, `sw`, `sc` or `tb` alone; `c<i>.<that>` for member i of a chain.
    suffix: String,
}

/// `d` in whole microseconds, rounded up; `Zero` if `d` is zero.
fn micros(d: Duration, what: &'static str) -> Result<u128, ConfigError> {
    let us = d.as_nanos().div_ceil(1000);
    if us == 0 {
        return Err(ConfigError::Zero { what });
    }
    if us > MAX_EXACT {
        return Err(ConfigError::TooLarge {
            what,
            max: "2^52 microseconds (about 142 years)",
        });
    }
    Ok(us)
}

fn nonzero(value: u32, what: &'static str) -> Result<u32, ConfigError> {
    if value == 0 {
        Err(ConfigError::Zero { what })
    } else {
        Ok(value)
    }
}

fn plan(algorithm: Algorithm) -> Result<Plan, ConfigError> {
    Ok(match algorithm {
        Algorithm::FixedWindow { limit, window } => Plan {
            script: &FIXED_WINDOW,
            once: &FIXED_WINDOW_ONCE,
            charge: &FIXED_WINDOW_CHARGE,
            kind: 1,
            suffix: "fw",
            params: [
                micros(window, "window")? as u64,
                u64::from(nonzero(limit, "limit")?),
            ],
            capacity: limit,
        },
        Algorithm::SlidingWindow { limit, window } => {
            if limit > REDIS_MAX_SLIDING_LIMIT {
                return Err(ConfigError::TooLarge {
                    what: "limit of a sliding window in Redis",
                    max: "100000 (REDIS_MAX_SLIDING_LIMIT; use the sliding counter or the token bucket)",
                });
            }
            Plan {
                script: &SLIDING_WINDOW,
                once: &SLIDING_WINDOW_ONCE,
                charge: &SLIDING_WINDOW_CHARGE,
                kind: 2,
                suffix: "sw",
                params: [
                    micros(window, "window")? as u64,
                    u64::from(nonzero(limit, "limit")?),
                ],
                capacity: limit,
            }
        }
        Algorithm::SlidingCounter { limit, window } => {
            let us = micros(window, "window")?;
            nonzero(limit, "limit")?;
            if u128::from(limit) * us > MAX_EXACT {
                return Err(ConfigError::TooLarge {
                    what: "limit × window (in microseconds) of a sliding counter in Redis",
                    max: "2^52, for example 1,000,000 per hour",
                });
            }
            Plan {
                script: &SLIDING_COUNTER,
                once: &SLIDING_COUNTER_ONCE,
                charge: &SLIDING_COUNTER_CHARGE,
                kind: 3,
                suffix: "sc",
                params: [us as u64, u64::from(limit)],
                capacity: limit,
            }
        }
        Algorithm::TokenBucket { rate, burst } => {
            let permits = nonzero(rate.permits, "rate permits")?;
            let period = rate.period.as_nanos();
            if period == 0 {
                return Err(ConfigError::Zero {
                    what: "rate period",
                });
            }
            nonzero(burst, "burst")?;
            // The time per permit in whole microseconds, rounded up: the long-run rate never
            // exceeds the configured one (rates above 10^6 per second are served at 10^6).
            let interval = period.div_ceil(u128::from(permits) * 1000).max(1);
            if interval * u128::from(burst) > MAX_EXACT {
                return Err(ConfigError::TooLarge {
                    what: "burst × (period / permits)",
                    max: "2^52 microseconds (about 142 years)",
                });
            }
            Plan {
                script: &TOKEN_BUCKET,
                once: &TOKEN_BUCKET_ONCE,
                charge: &TOKEN_BUCKET_CHARGE,
                kind: 4,
                suffix: "tb",
                params: [interval as u64, u64::from(burst)],
                capacity: burst,
            }
        }
    })
}

/// `x × share` rounded down, at least 1.
fn scaled(x: u32, share: f64) -> u32 {
    ((f64::from(x) * share).floor() as u32).max(1)
}

/// `rate × share`: whole permits per period, rounded down, while at least one remains;
/// otherwise one permit per period ÷ (permits × share), rounded up to the nanosecond (never
/// faster than the share) and held where a bucket of `burst` still fits the in-memory bound
/// (b·T ≤ 2^62 ns, about 146 years). Rounded down and then raised to one permit, a share of a
/// slow rate was the whole rate (a quarter of 1 per minute was 1 per minute).
fn scaled_rate(rate: Rate, share: f64, burst: u32) -> Rate {
    let permits = f64::from(rate.permits) * share;
    if permits >= 1.0 {
        return Rate::new(permits.floor() as u32, rate.period);
    }
    let most = (u64::MAX / 4) / u64::from(burst.max(1));
    // Float to integer casts saturate: a period beyond u64 nanoseconds is held at `most` too.
    let nanos = ((rate.period.as_nanos() as f64 / permits).ceil() as u64).min(most);
    Rate::new(1, Duration::from_nanos(nanos))
}

/// The local fallback's algorithm: the global one at `share` of its limit.
fn share_of(algorithm: Algorithm, share: f64) -> Algorithm {
    match algorithm {
        Algorithm::FixedWindow { limit, window } => Algorithm::FixedWindow {
            limit: scaled(limit, share),
            window,
        },
        Algorithm::SlidingWindow { limit, window } => Algorithm::SlidingWindow {
            limit: scaled(limit, share),
            window,
        },
        Algorithm::SlidingCounter { limit, window } => Algorithm::SlidingCounter {
            limit: scaled(limit, share),
            window,
        },
        Algorithm::TokenBucket { rate, burst } => {
            let burst = scaled(burst, share);
            Algorithm::TokenBucket {
                rate: scaled_rate(rate, share, burst),
                burst,
            }
        }
    }
}

impl RedisLimiter<ConnectionManager> {
    /// A builder for a limiter running `algorithm` in Redis, with `policy` for when Redis fails.
    ///
    /// Defaults: key prefix `turnstile`, a 50 ms deadline per decision, a deny cache of 10,000
    /// subjects.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, FailurePolicy, RedisLimiter};
    /// use turnstile::redis::{aio::ConnectionManager, Client};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = ConnectionManager::new(Client::open("redis://127.0.0.1/")?).await?;
    /// let limiter = RedisLimiter::builder(
    ///     Algorithm::SlidingWindow { limit: 5, window: Duration::from_secs(60) },
    ///     FailurePolicy::FailOpen,
    /// )
    /// .build(connection)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(algorithm: Algorithm, policy: FailurePolicy) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            algorithms: vec![algorithm],
            policy,
            prefix: "turnstile".to_owned(),
            deadline: DEFAULT_DEADLINE,
            deny_cache: DEFAULT_DENY_CACHE,
            fallback_keys: crate::DEFAULT_MAX_KEYS,
        }
    }
}

impl RedisLimiterBuilder {
    /// Adds another limit for the same subjects: the limiter becomes a chain that admits a call
    /// only if every limit admits it, and then charges all of them, in one script and one round
    /// trip. A rejection charges none (each limit decides on the state before any write) and
    /// reports the largest retry-after, with the limit of the member that gave it; an admission
    /// reports the smallest `remaining` and the largest `reset_after`. The members' keys are
    /// `prefix:{subject}:c<i>.<fw|sw|sc|tb>`, in one hash tag.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, FailurePolicy, Rate, RedisLimiter};
    ///
    /// // 10 per second, and 1,000 per hour, per user.
    /// let builder = RedisLimiter::builder(
    ///     Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 10 },
    ///     FailurePolicy::FailClosed,
    /// )
    /// .and_limit(Algorithm::FixedWindow { limit: 1_000, window: Duration::from_secs(3600) });
    /// assert!(builder.check().is_ok());
    /// ```
    pub fn and_limit(mut self, algorithm: Algorithm) -> Self {
        self.algorithms.push(algorithm);
        self
    }

    /// The prefix of every key (default `turnstile`). Limiters sharing a prefix, an algorithm
    /// and a subject share their limit. Must be non-empty, at most 256 bytes, without `{` or `}`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, FailurePolicy, RedisLimiter};
    ///
    /// let fw = Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) };
    /// let err = RedisLimiter::builder(fw, FailurePolicy::FailClosed).prefix("a{b").check().unwrap_err();
    /// assert!(matches!(err, ConfigError::Invalid { what: "key prefix", .. }));
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one decision may take, round trip included (default 50 ms). Past it the
    /// [`FailurePolicy`] decides and the decision is not retried.
    ///
    /// A shorter response timeout of the connection's own ends a decision sooner (as an error):
    /// redis-rs's [`ConnectionManager`] has one of 500 ms unless its
    /// `ConnectionManagerConfig::set_response_timeout` says otherwise. For a longer deadline,
    /// build the connection without it (`set_response_timeout(None)`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, FailurePolicy, RedisLimiter};
    ///
    /// let fw = Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) };
    /// let err = RedisLimiter::builder(fw, FailurePolicy::FailClosed).deadline(Duration::ZERO).check();
    /// assert_eq!(err, Err(ConfigError::Zero { what: "deadline" }));
    /// ```
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The most subjects the local deny cache holds (default 10,000); 0 turns it off. A subject
    /// longer than 64 bytes is held by its SHA-256 (71 bytes), as in its Redis key names.
    ///
    /// The cache saves a round trip per rejected call, but it is per process: a
    /// [`reset`](RedisLimiter::reset) elsewhere reaches this process only once the cached
    /// rejection's retry-after has passed. Turn it off where resets must apply at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, FailurePolicy, RedisLimiter};
    ///
    /// let fw = Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) };
    /// assert!(RedisLimiter::builder(fw, FailurePolicy::FailClosed).deny_cache(0).check().is_ok());
    /// ```
    pub fn deny_cache(mut self, subjects: usize) -> Self {
        self.deny_cache = subjects;
        self
    }

    /// The most subjects the local fallback of [`FailurePolicy::Fallback`] counts at once
    /// (default 1,048,576, as a [`KeyedLimiter`]'s): its memory while Redis is away, when every
    /// subject seen meanwhile is counted in this process. Idle subjects are evicted to make
    /// room; a new subject meeting a fallback full of active ones gets
    /// [`TryAcquireError::TooManyKeys`]. Not used under the other policies; never 0.
    ///
    /// A subject costs the fallback what a [`KeyedLimiter`] key of its algorithm costs: tens of
    /// bytes, but for an exact sliding window also 8 bytes per permit of its share of the limit
    /// (its ring of timestamps). At the default cap, a 10,000-permit sliding window at share 1.0
    /// could so take about 84 GB while Redis is away: lower the cap, or the share, for large
    /// sliding windows.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, FailurePolicy, RedisLimiter};
    ///
    /// let fw = Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) };
    /// let policy = FailurePolicy::Fallback { share: 0.5 };
    /// assert!(RedisLimiter::builder(fw, policy).fallback_max_keys(10_000).check().is_ok());
    /// let err = RedisLimiter::builder(fw, policy).fallback_max_keys(0).check();
    /// assert_eq!(err, Err(ConfigError::Zero { what: "fallback max_keys" }));
    /// ```
    pub fn fallback_max_keys(mut self, subjects: usize) -> Self {
        self.fallback_keys = subjects;
        self
    }

    /// Validates the configuration without a connection: what [`build`](Self::build) checks.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a zero or out-of-range parameter, a bad prefix, a zero deadline, a
    /// fallback share outside (0, 1], or a `fallback_max_keys` of 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, FailurePolicy, RedisLimiter};
    ///
    /// let fw = Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) };
    /// let err = RedisLimiter::builder(fw, FailurePolicy::Fallback { share: 1.5 }).check().unwrap_err();
    /// assert!(matches!(err, ConfigError::Invalid { what: "fallback share", .. }));
    /// ```
    pub fn check(&self) -> Result<(), ConfigError> {
        self.validate().map(drop)
    }

    fn validate(&self) -> Result<Config, ConfigError> {
        if self.fallback_keys == 0 {
            return Err(ConfigError::Zero {
                what: "fallback max_keys",
            });
        }
        let config = Config::new(
            &self.algorithms,
            self.policy,
            self.deny_cache,
            self.fallback_keys,
        )?;
        keys::check_prefix(&self.prefix)?;
        if self.deadline.is_zero() {
            return Err(ConfigError::Zero { what: "deadline" });
        }
        Ok(config)
    }

    /// The limiter, deciding through `connection`. Connects nothing and sends nothing: the first
    /// decision loads its script into Redis if needed.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, FailurePolicy, RedisLimiter};
    /// use turnstile::redis::{cluster::ClusterClient};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // Redis Cluster: any node's address; the client discovers the others.
    /// let cluster = ClusterClient::new(vec!["redis://127.0.0.1:7000/"])?;
    /// let connection = cluster.get_async_connection().await?;
    /// let limiter = RedisLimiter::builder(
    ///     Algorithm::FixedWindow { limit: 100, window: Duration::from_secs(1) },
    ///     FailurePolicy::FailClosed,
    /// )
    /// .build(connection)?;
    /// limiter.try_acquire("tenant-7").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn build<C>(self, connection: C) -> Result<RedisLimiter<C>, ConfigError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let config = self.validate()?;
        Ok(RedisLimiter {
            inner: Arc::new(Inner {
                connection,
                prefix: self.prefix,
                deadline: self.deadline,
                policy: self.policy,
                deny_cache: self.deny_cache,
                fallback_keys: self.fallback_keys,
                config: ArcSwap::from_pointee(config),
                reconfiguring: Mutex::new(()),
                counters: Default::default(),
            }),
        })
    }
}

impl Config {
    /// The parameters of `algorithms` (one per limit, in order), each checked as the builder
    /// checks it, with a fallback at `policy`'s share counting at most `fallback_keys`
    /// subjects, and an empty deny cache of `deny_cache` subjects.
    fn new(
        algorithms: &[Algorithm],
        policy: FailurePolicy,
        deny_cache: usize,
        fallback_keys: usize,
    ) -> Result<Config, ConfigError> {
        let chain = algorithms.len() > 1;
        let members = algorithms
            .iter()
            .enumerate()
            .map(|(i, &algorithm)| {
                let plan = plan(algorithm)?;
                let suffix = if chain {
                    format!("c{i}.{}", plan.suffix)
                } else {
                    plan.suffix.to_owned()
                };
                Ok(Member {
                    algorithm,
                    plan,
                    suffix,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let fallback = match policy {
            FailurePolicy::Fallback { share } => {
                if !(share > 0.0 && share <= 1.0) {
                    return Err(ConfigError::Invalid {
                        what: "fallback share",
                        requirement: "it must be greater than 0 and at most 1",
                    });
                }
                let mut local = KeyedChain::builder();
                for &algorithm in algorithms {
                    local = local.per_key(
                        KeyedLimiter::builder(share_of(algorithm, share))
                            .max_keys(fallback_keys)
                            .build()?,
                    );
                }
                Some(local.build()?)
            }
            FailurePolicy::FailOpen | FailurePolicy::FailClosed => None,
        };
        let (script, once, charge) = match &members[..] {
            [single] => (single.plan.script, single.plan.once, single.plan.charge),
            _ => (&*CHAIN, &*CHAIN_ONCE, &*CHAIN_CHARGE),
        };
        let capacity = members.iter().map(|m| m.plan.capacity).min().unwrap_or(0);
        Ok(Config {
            members,
            script,
            once,
            charge,
            capacity,
            fallback,
            deny: DenyCache::new(deny_cache),
        })
    }
}

/// Why a round trip gave no decision.
#[derive(Debug, Clone, Copy)]
enum Failure {
    Error,
    Timeout,
}

impl<C> RedisLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Takes one permit for `subject`, or says when to retry. See
    /// [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::TryAcquireError;
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// match limiter.try_acquire("203.0.113.9").await {
    ///     Ok(admission) => println!("{} left", admission.remaining()),
    ///     Err(TryAcquireError::Rejected(r)) => println!("retry in {:?}", r.retry_after()),
    ///     Err(e) => println!("{e}"),
    /// }
    /// # }
    /// ```
    pub async fn try_acquire<K>(&self, subject: &K) -> Result<Admission, TryAcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        self.try_acquire_n(subject, 1).await
    }

    /// Takes `n` permits for `subject`, all or nothing, in one round trip to Redis; `n == 0` asks
    /// whether one permit would be admitted and takes nothing.
    ///
    /// # Errors
    ///
    /// - [`TryAcquireError::Rejected`]: not enough permits; the exact retry-after, from Redis's
    ///   clock (or from the deny cache, without a round trip; or, under
    ///   [`FailurePolicy::Fallback`] while Redis fails, from the local fallback, on its clock).
    /// - [`TryAcquireError::InsufficientCapacity`]: `n` exceeds the limit (or burst); nothing is
    ///   sent.
    /// - [`TryAcquireError::Unavailable`]: Redis failed or missed the deadline and the policy is
    ///   [`FailurePolicy::FailClosed`], or [`FailurePolicy::Fallback`] with `n` above the local
    ///   share.
    /// - [`TryAcquireError::TooManyKeys`]: under [`FailurePolicy::Fallback`], the local limiter
    ///   is full of keys ([`fallback_max_keys`](RedisLimiterBuilder::fallback_max_keys)).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes leaves no local state behind, but if the request
    /// was already sent the script may still run in Redis and take the permits: as with a
    /// timed-out decision, a cancelled one may have been charged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), turnstile::TryAcquireError> {
    /// // An upload of 5 MB against a per-user budget counted in megabytes.
    /// let admission = limiter.try_acquire_n("user:7", 5).await?;
    /// println!("admitted at {:?} after the Unix epoch (Redis's clock)", admission.at());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire_n<K>(&self, subject: &K, n: u32) -> Result<Admission, TryAcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        self.decide(&Tag::of(subject.as_ref()), n, None).await
    }

    /// One decision for `n` permits, as [`try_acquire_n`](Self::try_acquire_n); an attempt of
    /// the `acquire` call `call` runs the parameters' `once` script, which answers a call
    /// already admitted from its record instead of charging it again, and skips the deny cache
    /// once an earlier attempt of the call got no reply (see [`Call`]).
    async fn decide(
        &self,
        subject: &Tag<'_>,
        n: u32,
        call: Option<&Call>,
    ) -> Result<Admission, TryAcquireError> {
        let inner = &*self.inner;
        let loaded = inner.config.load();
        let sent = Instant::now();
        let deny = !call.is_some_and(Call::unanswered);
        inner.before(&loaded, subject, n, sent, deny)?;
        // Past the deny cache: the round trip and its answer use this snapshot.
        let config = arc_swap::Guard::into_inner(loaded);
        let script = if call.is_some() {
            config.once
        } else {
            config.script
        };
        let reply = within(
            inner.deadline,
            inner.eval_call(&config, script, subject, n, call.map(|c| c.id)),
        )
        .await
        .and_then(|reply| parse(inner.repaired(&reply, 4)));
        match reply {
            Ok(Ok((at, reset_after, remaining))) => {
                inner.count(ADMITTED);
                Ok(Admission::new(at, reset_after, remaining))
            }
            Ok(Err((retry_after, member))) => {
                Err(inner.rejected(&config, subject, n, sent, retry_after, member, true))
            }
            Err(failure) => {
                if let Some(call) = call {
                    call.unanswered.store(1, Ordering::Relaxed);
                }
                inner.fail(&config, failure, subject, n)
            }
        }
    }

    /// Records `n` permits as used by `subject` now, without checking the limit, in one round
    /// trip: for usage known only after the fact (the tokens of a reply, the bytes of a
    /// response, a failed login's penalty; rate-limiter-flexible's `penalty`). As
    /// [`RateLimiter::charge`](crate::RateLimiter::charge), whose per-algorithm semantics the
    /// scripts follow on Redis's clock: it is never rejected, may put the subject in *debt*
    /// (later calls, from every process, are then rejected with an exact retry-after until the
    /// debt has passed), and `n == 0` records nothing and reports the state. A limiter built
    /// with [`and_limit`](RedisLimiterBuilder::and_limit) charges every limit, in one script.
    ///
    /// The [`Admission`] says what is left: [`remaining`](Admission::remaining) is 0 while in
    /// debt, [`reset_after`](Admission::reset_after) the time until the subject is back to its
    /// full capacity if nothing else is taken (the window's end for a fixed window; for a chain,
    /// the smallest remaining and the largest reset, as for an admission), and
    /// [`at`](Admission::at) Redis's time.
    ///
    /// **Bounds.** Every `n` is accepted; what a key cannot hold saturates, so that Lua's doubles
    /// stay exact: a window's count at 2^32 − 1 (as the in-memory one), a token bucket's
    /// theoretical arrival time at 2^53 µs after the Unix epoch minus the bucket's capacity (the
    /// year 2255 for most buckets, 2112 at the least), where the in-memory bucket stops at
    /// 2^63 ns after its clock's epoch; the exact sliding window records min(n, limit) permits
    /// and keeps its `limit` latest expiries.
    ///
    /// **No failure policy.** A charge is not a decision: it cannot be admitted open or
    /// rejected closed. If Redis fails or misses the deadline, the error says so, whatever the
    /// [`FailurePolicy`]; under [`FailurePolicy::Fallback`] the charge is also recorded in the
    /// local fallback limiter, which decides for this process while Redis is away. A charge
    /// that missed the deadline may still run in Redis once the server answers: it is then
    /// counted once in Redis and once in the fallback, each of which decides alone (at least
    /// once in each, never twice in either). Charges are
    /// not counted in [`stats`](Self::stats), and the deny cache is left as it is: a charge only
    /// makes the subject stricter, so a rejection it holds still holds, and a subject it does not
    /// hold is asked of Redis on its next call, which sees the debt.
    ///
    /// # Errors
    ///
    /// The [`RedisError`] of the script, a malformed reply (`UnexpectedReturnType`), or a
    /// timeout after the limiter's deadline (an `IoError` kind): the charge may then have been
    /// recorded or not. Never a rejection.
    ///
    /// # Cancel safety
    ///
    /// Dropped before the request is sent, nothing is recorded. Dropped after, the script may
    /// still run in Redis and record the charge (as a timed-out charge may have); the fallback,
    /// charged only once Redis has failed, is then left as it is.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// // An LLM gateway: admit the request, then charge the tokens its reply used.
    /// limiter.try_acquire("tenant-7").await?;
    /// let used = 1_500; // counted from the reply
    /// let state = limiter.charge("tenant-7", used).await?;
    /// if state.remaining() == 0 {
    ///     println!("tenant-7 is at or over its budget for {:?}", state.reset_after());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn charge<K>(&self, subject: &K, n: u32) -> Result<Admission, RedisError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        let inner = &*self.inner;
        let config = inner.config();
        let subject = Tag::of(subject.as_ref());
        let reply = tokio::time::timeout(
            inner.deadline,
            inner.eval(&config, config.charge, &subject, n),
        )
        .await;
        let failed = |error: RedisError| {
            // The local limiter decides for the subject while Redis is away: it must see the
            // usage too. Recorded only once Redis has failed, as its decisions are made.
            if let Some(local) = &config.fallback {
                let key: Box<[u8]> = subject.bytes().into();
                for member in local.per_key() {
                    // Only a full key map refuses (a charge is never rejected): the error
                    // returned says that Redis did not record it either way.
                    let _ = member.charge(&key, n);
                }
            }
            Err(error)
        };
        match reply {
            Ok(Ok(reply)) => match parse(inner.repaired(&reply, 4)) {
                Ok(Ok((at, reset_after, remaining))) => {
                    Ok(Admission::new(at, reset_after, remaining))
                }
                _ => failed(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "the charge script's reply is not {1, now, reset_after, remaining}",
                ))),
            },
            Ok(Err(error)) => failed(error),
            Err(_) => failed(RedisError::from((
                ErrorKind::Io,
                "the charge missed the limiter's deadline",
            ))),
        }
    }

    /// Forgets `subject`'s state in Redis (one `DEL` of its keys, every limit of a chain), in
    /// this limiter's deny cache and in its local fallback: its next call through this limiter,
    /// and every call that reaches Redis from any process, starts fresh. `Ok(true)` if Redis held
    /// state for it. Under [`FailurePolicy::Fallback`] the `DEL` also takes the subject's record
    /// of [`acquire`](Self::acquire_n) calls (`prefix:{subject}:acq`; a record alone, whose
    /// state has expired, counts as state held).
    ///
    /// Other processes (and other limiters in this one) keep their own deny caches: one that
    /// cached a rejection of `subject` goes on answering it locally, without asking Redis, until
    /// that rejection's retry-after has passed (for a fixed window, up to the end of the window).
    /// Where a reset must take effect everywhere at once, build the limiters with
    /// [`deny_cache(0)`](RedisLimiterBuilder::deny_cache), which turns the cache off (every
    /// rejected call then costs a round trip).
    ///
    /// A decision already on its way to Redis when the reset runs may still be answered from the
    /// state before it (and a rejection then noted in this process's deny cache, for at most its
    /// retry-after).
    ///
    /// # Errors
    ///
    /// The [`RedisError`] of the `DEL`, or a timeout after the limiter's deadline (an `IoError`
    /// kind); the local state is forgotten even then.
    ///
    /// # Cancel safety
    ///
    /// The local state is forgotten before the first await. Dropped after the `DEL` was sent, the
    /// keys may or may not have been deleted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), turnstile::redis::RedisError> {
    /// // The password was right: forgive the failed attempts counted for this account.
    /// limiter.reset("login:alice").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset<K>(&self, subject: &K) -> Result<bool, RedisError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        let inner = &*self.inner;
        let config = inner.config();
        let subject = Tag::of(subject.as_ref());
        config.deny.forget(subject.bytes());
        if let Some(local) = &config.fallback {
            let key: Box<[u8]> = subject.bytes().into();
            for member in local.per_key() {
                member.reset(&key);
            }
        }
        let mut connection = inner.connection.clone();
        let mut delete = ::redis::cmd("DEL");
        delete.arg(self.tagged_keys(&subject));
        if inner.records() {
            delete.arg(record(&inner.prefix, &subject));
        }
        let deleted = delete.query_async::<u64>(&mut connection);
        match tokio::time::timeout(inner.deadline, deleted).await {
            Ok(deleted) => Ok(deleted? > 0),
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "the reset's DEL missed the limiter's deadline",
            ))),
        }
    }

    /// Takes one permit for `subject`, waiting as long as it takes. See
    /// [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), turnstile::AcquireError> {
    /// limiter.acquire("crawler:example.org").await?;
    /// // ... fetch one page ...
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire<K>(&self, subject: &K) -> Result<Admission, AcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        self.acquire_n(subject, 1).await
    }

    /// Takes `n` permits for `subject`, waiting as long as it takes: after each rejection it
    /// sleeps for the retry-after plus a little jitter (up to 1/8 of the retry-after, between
    /// 0.1 ms and 50 ms, so that many waiters do not return at the same instant) and tries again.
    ///
    /// **Charged once, within a bound.** Every attempt of one call carries the call's random id.
    /// An attempt that missed the deadline may still run in Redis and admit after the failure
    /// policy answered; if that answer was a rejection (a [`FailurePolicy::Fallback`] whose local
    /// share is spent), the call waits and tries again, and that attempt finds the call's id in
    /// the subject's record (`prefix:{subject}:acq`, a hash of call id → admission, written by
    /// the admission of an `acquire` call's attempt) and answers the recorded admission instead
    /// of taking the permits a second time (while that admission still counts in every limit:
    /// after its reset, for a chain its shortest limit's, for an exact sliding window a window
    /// after the admission (its own permits' expiry, which older permits of a longer window may
    /// outlive), the retry decides afresh, as the first permit no longer weighs on that limit; a
    /// chain's longer limits are then charged twice,
    /// rather than the call let through on nothing in the shorter one; and only under the
    /// parameters it was admitted under: after a [`reconfigure`](Self::reconfigure), which may
    /// end the permit's window sooner, the retry decides afresh too). The attempts after one
    /// that got no reply skip the deny cache: a rejection of the subject cached since may be
    /// one the late admission caused, where Redis answers the record. Calls
    /// racing on one subject each have their own field, so each is charged once however their
    /// attempts interleave, unless
    /// [`REDIS_ACQUIRE_RECORDS`] or more other `acquire` calls were admitted on the subject
    /// between the late admission and the retry: the record keeps that many calls, dropping the
    /// oldest first, and a call whose field was dropped is charged again (a permit nobody uses,
    /// never an admission beyond the limit). So the memory is bounded per subject: one small
    /// hash, expiring at the latest of its admissions' resets (for a window, up to the window's
    /// length), however many `acquire` calls the subject gets. Only a limiter with
    /// [`FailurePolicy::Fallback`] writes it: under the other policies a timed-out attempt is
    /// never followed by another (`FailClosed` ends the call with [`AcquireError::Unavailable`],
    /// `FailOpen` admits it), so their `acquire` writes no record.
    /// [`try_acquire_n`](Self::try_acquire_n) writes none either (a caller retrying it makes a
    /// new decision), and [`reset`](Self::reset) deletes the record with the state.
    ///
    /// **Not FIFO.** Waiters in different processes (or tasks) do not queue: whoever asks first
    /// after the permits free up gets them. Under contention a waiter can be overtaken many times;
    /// [`acquire_timeout`](Self::acquire_timeout) bounds the wait.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit;
    /// [`AcquireError::Unavailable`] when a decision fails and the policy is to fail closed (or
    /// to fall back to a local share smaller than `n`); [`AcquireError::TooManyKeys`] from a
    /// full fallback limiter.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps consumes nothing. Dropping it while a request is in
    /// flight may leave the permits charged in Redis, as for [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let admission = limiter.acquire_n("batch", 10).await?;
    /// println!("{} left", admission.remaining());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n<K>(&self, subject: &K, n: u32) -> Result<Admission, AcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        let subject = Tag::of(subject.as_ref());
        let call = self.inner.records().then(|| Call::new(call_id()));
        crate::clock::retry_rejections(None, || self.decide(&subject, n, call.as_ref())).await
    }

    /// [`acquire_n`](Self::acquire_n) within a time limit: the wait ends with
    /// [`AcquireError::Timeout`] once `timeout` has passed since the call, unless the permits
    /// were admitted first.
    ///
    /// The limit ends a sleep between attempts, never a decision: a round trip under way when
    /// the time is up runs to its end (or to the limiter's own deadline and failure policy)
    /// and is answered, an admission included, so the call returns up to one decision's time
    /// late rather than leave permits charged in Redis that nobody holds, as a
    /// `tokio::time::timeout` around [`acquire_n`](Self::acquire_n) can. Measured on tokio's
    /// timer (its paused time counts); a `timeout` past what an `Instant` holds never passes.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`] when the time is up.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::AcquireError;
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// match limiter.acquire_timeout("batch", 10, Duration::from_secs(5)).await {
    ///     Ok(admission) => println!("{} left", admission.remaining()),
    ///     Err(AcquireError::Timeout) => println!("busy: try the next batch later"),
    ///     Err(other) => return Err(other.into()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_timeout<K>(
        &self,
        subject: &K,
        n: u32,
        timeout: Duration,
    ) -> Result<Admission, AcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        let subject = Tag::of(subject.as_ref());
        let call = self.inner.records().then(|| Call::new(call_id()));
        crate::clock::retry_rejections(Some(timeout), || self.decide(&subject, n, call.as_ref()))
            .await
    }
}

impl<C> RedisLimiter<C> {
    /// The counts so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// let _ = limiter.try_acquire("a").await;
    /// let stats = limiter.stats();
    /// assert_eq!(stats.admitted + stats.rejected + stats.errors + stats.timeouts, 1);
    /// # }
    /// ```
    pub fn stats(&self) -> RedisStats {
        let c = |i: usize| self.inner.counters[i].load(Ordering::Relaxed);
        RedisStats {
            admitted: c(ADMITTED),
            rejected: c(REJECTED),
            denied_locally: c(DENIED_LOCALLY),
            errors: c(ERRORS),
            timeouts: c(TIMEOUTS),
            fallbacks: c(FALLBACKS),
            failed_open: c(FAILED_OPEN),
            failed_closed: c(FAILED_CLOSED),
            repaired: c(REPAIRED),
        }
    }

    /// The algorithm and its parameters in force (the first limit of a chain): those it was
    /// built with, or the last successful [`reconfigure`](Self::reconfigure)'s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// println!("{:?}", limiter.algorithm());
    /// # }
    /// ```
    pub fn algorithm(&self) -> Algorithm {
        self.inner.config().members[0].algorithm
    }

    /// Every limit, in the order given (one unless built with
    /// [`and_limit`](RedisLimiterBuilder::and_limit)), as in force now: those it was built with,
    /// or the last successful reconfiguration's (all from one parameter set).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// for algorithm in limiter.algorithms() {
    ///     println!("{algorithm:?}");
    /// }
    /// # }
    /// ```
    pub fn algorithms(&self) -> impl Iterator<Item = Algorithm> + '_ {
        let config = self.inner.config();
        let algorithms: Vec<Algorithm> = config.members.iter().map(|m| m.algorithm).collect();
        algorithms.into_iter()
    }

    /// The most permits one call can get: the limit (or burst), the smallest over a chain, under
    /// the parameters in force.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// assert!(limiter.capacity() >= 1);
    /// # }
    /// ```
    pub fn capacity(&self) -> u32 {
        self.inner.config().capacity
    }

    /// The Redis key holding `subject`'s state: `prefix:{subject}:suffix`, the subject hashed if
    /// longer than 64 bytes, empty or starting with `}` (for a chain, the first limit's key; see
    /// [`keys`](Self::keys)). For inspection (`PTTL`, `MEMORY USAGE`); never write to it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// assert_eq!(limiter.key("alice"), b"turnstile:{alice}:tb".to_vec());
    /// # }
    /// ```
    pub fn key<K: AsRef<[u8]> + ?Sized>(&self, subject: &K) -> Vec<u8> {
        keys::key(
            &self.inner.prefix,
            &Tag::of(subject.as_ref()),
            &self.inner.config().members[0].suffix,
        )
    }

    /// The Redis keys of `subject`, one per limit, in order.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// for key in limiter.keys("alice") {
    ///     println!("{}", String::from_utf8_lossy(&key));
    /// }
    /// # }
    /// ```
    pub fn keys<K: AsRef<[u8]> + ?Sized>(&self, subject: &K) -> Vec<Vec<u8>> {
        self.tagged_keys(&Tag::of(subject.as_ref()))
    }

    /// [`keys`](Self::keys) of a subject's tag.
    fn tagged_keys(&self, tag: &Tag<'_>) -> Vec<Vec<u8>> {
        self.inner
            .config()
            .members
            .iter()
            .map(|m| keys::key(&self.inner.prefix, tag, &m.suffix))
            .collect()
    }

    /// Subjects held in the deny cache now (expired ones included until they are looked up or
    /// pushed out).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(limiter: turnstile::RedisLimiter) {
    /// println!("{} subjects denied locally", limiter.denied_subjects());
    /// # }
    /// ```
    pub fn denied_subjects(&self) -> usize {
        self.inner.config().deny.len()
    }

    /// Changes the limit, window, rate or burst of a limiter with one limit at run time, keeping
    /// the state in Redis; for a limiter built with
    /// [`and_limit`](RedisLimiterBuilder::and_limit), see
    /// [`reconfigure_all`](Self::reconfigure_all) and
    /// [`reconfigure_limit`](Self::reconfigure_limit).
    ///
    /// Clones share the change, and every later call decides under the new parameters; a call
    /// already started decides under the parameters it started with, wholly (never some of each).
    /// The state in Redis carries over as after
    /// [`RateLimiter::reconfigure`](crate::RateLimiter::reconfigure), translated by the first
    /// call that meets each key under the new parameters: the counts kept are judged under a new
    /// limit at once (a lowered limit below what was admitted admits nothing until the window
    /// ends), a new window length keeps the window running (its start if younger than the new
    /// length, otherwise its end moved to the earlier of its old end and now + the new length),
    /// a token bucket stays as full as it was and refills at the new rate, and the exact sliding
    /// window's permits keep the expiry they were admitted with (its limit can be raised up to
    /// [`REDIS_MAX_SLIDING_LIMIT`], with no ring to size). Other processes still running the old
    /// parameters on the same prefix go on deciding under them, each call translating the state
    /// it meets, as in a rolling deploy (see [`RedisLimiter`]).
    ///
    /// The deny cache starts afresh: it is emptied, so a raised limit admits a subject it held at
    /// once, and a lowered one is judged by Redis, whose retry-after is then cached anew (a
    /// rejection arriving late from a call under the old parameters is not cached). Under
    /// [`FailurePolicy::Fallback`] the local fallback is reconfigured in place to the share of
    /// the new parameters, as [`KeyedLimiter::reconfigure`] does: what each subject was admitted
    /// there still counts, so that a reconfiguration during an outage (an HTTP reload that
    /// changes a rule's limit) gives no subject its share again. The one exception is an exact
    /// sliding window whose share is raised above the limit its local ring was built with: that
    /// limit's fallback starts empty at the new share (a chain's other limits keep theirs). A
    /// fallback decision made while a chain is being reconfigured may judge one limit under the
    /// new share and another under the old (each limit wholly under one); Redis's decisions
    /// never mix. [`algorithm`](Self::algorithm),
    /// [`capacity`](Self::capacity) and the rejections' limits report the new parameters; the
    /// [`stats`](Self::stats) go on counting.
    ///
    /// # Errors
    ///
    /// Nothing changes on error:
    /// - [`ConfigError::AlgorithmChanged`] if `algorithm` is another kind than the limiter runs
    ///   (its keys hold another state);
    /// - [`ConfigError::Invalid`] (`what: "reconfigure"`) if the limiter has several limits;
    /// - the builder's [`ConfigError`]s for parameters that are zero or too large (as
    ///   [`RedisLimiterBuilder::check`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, Rate};
    ///
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let window = Duration::from_secs(60);
    /// // Built with 100 per minute; a plan change for every subject: 150 per minute. What each
    /// // subject was admitted in the current minute still counts.
    /// limiter.reconfigure(Algorithm::FixedWindow { limit: 150, window })?;
    /// assert_eq!(limiter.capacity(), 150);
    /// // Another algorithm is a typed error, and changes nothing.
    /// let bucket = Algorithm::TokenBucket { rate: Rate::per_second(2), burst: 10 };
    /// assert!(matches!(limiter.reconfigure(bucket), Err(ConfigError::AlgorithmChanged { .. })));
    /// assert_eq!(limiter.algorithm(), Algorithm::FixedWindow { limit: 150, window });
    /// # Ok(())
    /// # }
    /// ```
    pub fn reconfigure(&self, algorithm: Algorithm) -> Result<(), ConfigError> {
        self.reconfigure_with(|current| {
            if current.len() != 1 {
                return Err(ConfigError::Invalid {
                    what: "reconfigure",
                    requirement: "a limiter with several limits (and_limit) takes one algorithm \
                                  per limit: use reconfigure_all or reconfigure_limit",
                });
            }
            Ok(vec![algorithm])
        })
    }

    /// Changes every limit of a limiter at once, one algorithm per limit in the order given
    /// (the builder's, then each [`and_limit`](RedisLimiterBuilder::and_limit)'s): a plan
    /// change of "10 per second and 1,000 per hour" to "20 per second and 5,000 per hour" in one
    /// step, so that no call decides under one new limit and one old. Otherwise as
    /// [`reconfigure`](Self::reconfigure), limit by limit.
    ///
    /// # Errors
    ///
    /// Nothing changes on error:
    /// - [`ConfigError::Invalid`] (`what: "algorithms"`) unless there is exactly one algorithm
    ///   per limit;
    /// - [`ConfigError::AlgorithmChanged`] if one is another kind than its limit runs;
    /// - the builder's [`ConfigError`]s for parameters that are zero or too large.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Rate};
    ///
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// // Built with a bucket of 10 per second and `.and_limit` 1,000 per hour.
    /// let hour = Duration::from_secs(3600);
    /// limiter.reconfigure_all([
    ///     Algorithm::TokenBucket { rate: Rate::per_second(20), burst: 20 },
    ///     Algorithm::FixedWindow { limit: 5_000, window: hour },
    /// ])?;
    /// assert_eq!(limiter.algorithms().count(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reconfigure_all<I>(&self, algorithms: I) -> Result<(), ConfigError>
    where
        I: IntoIterator<Item = Algorithm>,
    {
        let algorithms: Vec<Algorithm> = algorithms.into_iter().collect();
        self.reconfigure_with(|current| {
            if algorithms.len() != current.len() {
                return Err(ConfigError::Invalid {
                    what: "algorithms",
                    requirement: "one per limit of the limiter, in order (the builder's, then \
                                  each and_limit's)",
                });
            }
            Ok(algorithms)
        })
    }

    /// Changes limit `index` (0 for the builder's, then 1, 2, ... for each
    /// [`and_limit`](RedisLimiterBuilder::and_limit)) and keeps the others as they are in
    /// force: [`reconfigure_all`](Self::reconfigure_all) with one algorithm replaced.
    /// Reconfigurations are serialised, so two of them changing different limits both hold.
    ///
    /// # Errors
    ///
    /// Nothing changes on error: [`ConfigError::Invalid`] (`what: "limit index"`) for an index
    /// past the last limit; otherwise as [`reconfigure_all`](Self::reconfigure_all).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::Algorithm;
    ///
    /// # async fn demo(limiter: turnstile::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// // The hourly limit (the second) only.
    /// let hour = Duration::from_secs(3600);
    /// limiter.reconfigure_limit(1, Algorithm::FixedWindow { limit: 2_000, window: hour })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn reconfigure_limit(&self, index: usize, algorithm: Algorithm) -> Result<(), ConfigError> {
        self.reconfigure_with(|current| {
            let mut algorithms = current.to_vec();
            match algorithms.get_mut(index) {
                Some(slot) => *slot = algorithm,
                None => {
                    return Err(ConfigError::Invalid {
                        what: "limit index",
                        requirement: "it must be less than the number of limits",
                    });
                }
            }
            Ok(algorithms)
        })
    }

    /// Replaces the parameters in force by those `next` makes of them (one algorithm per limit),
    /// checked whole before anything changes. Serialised by `reconfiguring`, so that `next` reads
    /// the parameters it replaces.
    fn reconfigure_with(
        &self,
        next: impl FnOnce(&[Algorithm]) -> Result<Vec<Algorithm>, ConfigError>,
    ) -> Result<(), ConfigError> {
        let inner = &*self.inner;
        let _serial = crate::sync::lock(&inner.reconfiguring);
        let current = inner.config();
        let old: Vec<Algorithm> = current.members.iter().map(|m| m.algorithm).collect();
        let algorithms = next(&old)?;
        for (from, to) in old.iter().zip(&algorithms) {
            if std::mem::discriminant(from) != std::mem::discriminant(to) {
                return Err(ConfigError::AlgorithmChanged {
                    from: from.name(),
                    to: to.name(),
                });
            }
        }
        let mut config = Config::new(
            &algorithms,
            inner.policy,
            inner.deny_cache,
            inner.fallback_keys,
        )?;
        // Checked whole: from here on nothing fails, and the fallback's counts carry over.
        if let (FailurePolicy::Fallback { share }, Some(old), Some(fresh)) =
            (inner.policy, &current.fallback, config.fallback.take())
        {
            config.fallback = Some(carried(old, fresh, &algorithms, share));
        }
        // The one write: later calls take the new snapshot whole; calls holding the old one
        // finish under it.
        inner.config.store(Arc::new(config));
        Ok(())
    }
}

/// The fallback after a reconfiguration to `algorithms`: `old`'s limiters reconfigured in place
/// to their `share` ([`KeyedLimiter::reconfigure`]: each subject's counts carry over as in
/// memory), so that a reconfiguration during an outage gives no subject its share again. A limit
/// that cannot be reconfigured so (an exact sliding window's share raised above the ring it was
/// built with) takes `fresh`'s limiter, empty, in its place; the others keep theirs.
fn carried(old: &Local, fresh: Local, algorithms: &[Algorithm], share: f64) -> Local {
    let members: Vec<&KeyedLimiter<Box<[u8]>>> = old.per_key().collect();
    if members.len() != algorithms.len() {
        return fresh;
    }
    let kept: Vec<bool> = members
        .iter()
        .zip(algorithms)
        .map(|(member, &algorithm)| member.reconfigure(share_of(algorithm, share)).is_ok())
        .collect();
    if kept.iter().all(|&k| k) {
        return old.clone();
    }
    let mut local = KeyedChain::builder();
    for ((member, new), keep) in members.into_iter().zip(fresh.per_key()).zip(kept) {
        local = local.per_key(if keep { member.clone() } else { new.clone() });
    }
    local.build().unwrap_or(fresh)
}

impl<C> Inner<C> {
    fn count(&self, counter: usize) {
        self.counters[counter].fetch_add(1, Ordering::Relaxed);
    }

    /// The parameters in force now: a call decides under this one snapshot from start to end.
    fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// What is settled before any round trip: `n` must fit the capacity, and (if `deny`)
    /// `subject` must not be denied for `n` at `sent` by the deny cache (counted as denied
    /// locally).
    fn before(
        &self,
        config: &Config,
        subject: &Tag<'_>,
        n: u32,
        sent: Instant,
        deny: bool,
    ) -> Result<(), TryAcquireError> {
        if n > config.capacity {
            return Err(TryAcquireError::InsufficientCapacity {
                requested: n,
                capacity: config.capacity,
            });
        }
        if !deny {
            return Ok(());
        }
        if let Some((left, limit)) = config.deny.check(subject.bytes(), n, sent) {
            self.count(DENIED_LOCALLY);
            return Err(TryAcquireError::Rejected(Rejection::new(left, limit)));
        }
        Ok(())
    }

    /// Redis rejected `n` permits for `subject` (asked at `sent`) with `retry_after` (ns), given
    /// by `member` (1-based in a chain; 0 for one limit): counted, and remembered by the deny
    /// cache if `remember` (a rejection of `n` on the subject's state as it stands).
    #[allow(clippy::too_many_arguments)]
    fn rejected(
        &self,
        config: &Config,
        subject: &Tag<'_>,
        n: u32,
        sent: Instant,
        retry_after: u64,
        member: usize,
        remember: bool,
    ) -> TryAcquireError {
        self.count(REJECTED);
        let limit = member
            .checked_sub(1)
            .and_then(|i| config.members.get(i))
            .map_or(config.capacity, |m| m.plan.capacity);
        if n > 0 && remember {
            let until = sent.checked_add(Duration::from_nanos(retry_after));
            if let Some(until) = until {
                config
                    .deny
                    .deny(subject.bytes(), n, limit, until, Instant::now());
            }
        }
        TryAcquireError::Rejected(Rejection::new(retry_after, limit))
    }

    /// The failure policy's answer for a decision that got no reply.
    fn fail(
        &self,
        config: &Config,
        failure: Failure,
        subject: &Tag<'_>,
        n: u32,
    ) -> Result<Admission, TryAcquireError> {
        self.count_failure(failure);
        let (answer, counter) = self.policy(config, subject, n);
        self.count(counter);
        answer
    }

    /// `reply` without the count of unreadable keys that a script appends after its `len`
    /// usual fields when it found any (see `discard` in `scripts/prelude.lua`), which is
    /// counted as repaired. A reply of another length is left whole, for the parser to refuse.
    fn repaired<'r>(&self, reply: &'r [i64], len: usize) -> &'r [i64] {
        match reply.split_at_checked(len) {
            Some((reply, &[found])) => {
                if let Ok(found) = u64::try_from(found) {
                    self.counters[REPAIRED].fetch_add(found, Ordering::Relaxed);
                }
                reply
            }
            _ => reply,
        }
    }

    fn count_failure(&self, failure: Failure) {
        self.count(match failure {
            Failure::Error => ERRORS,
            Failure::Timeout => TIMEOUTS,
        });
    }

    /// The failure policy's answer for `n` permits taken so that they can be given back
    /// ([`give_back`](Self::give_back)): what a fallback limiter took, if anything. Open and
    /// closed take nothing. Counts nothing.
    fn policy_taken(
        &self,
        config: &Config,
        subject: &Tag<'_>,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, usize, Option<Taken>) {
        match (self.policy, &config.fallback) {
            (FailurePolicy::Fallback { .. }, Some(local)) => {
                let key: Box<[u8]> = subject.bytes().into();
                match local.try_acquire_n_taken(&key, n) {
                    Ok((admission, taken)) => (Ok(admission), FALLBACKS, Some(taken)),
                    Err(error) => (Err(unavailable_if_too_big(error)), FALLBACKS, None),
                }
            }
            _ => {
                let (answer, counter) = self.policy(config, subject, n);
                (answer, counter, None)
            }
        }
    }

    /// Gives back to the fallback limiter what [`policy_taken`](Self::policy_taken) took.
    fn give_back(&self, config: &Config, subject: &Tag<'_>, n: u32, taken: &Taken) {
        if let Some(local) = &config.fallback {
            let key: Box<[u8]> = subject.bytes().into();
            local.give_back(&key, n, taken);
        }
    }

    /// Whether `acquire` calls keep a record of their admissions in Redis: only a fallback's
    /// rejection follows a timed-out attempt with another (a closed policy ends the call, an
    /// open one admits it), so other policies need none.
    fn records(&self) -> bool {
        matches!(self.policy, FailurePolicy::Fallback { .. })
    }

    /// Whether the failure policy rejects every call (`FailClosed`).
    fn fails_closed(&self) -> bool {
        matches!(self.policy, FailurePolicy::FailClosed)
    }

    /// The failure policy's answer for `n` permits (`n == 0`: a probe, which takes nothing from
    /// the fallback), and the counter it belongs to; counts nothing.
    fn policy(
        &self,
        config: &Config,
        subject: &Tag<'_>,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, usize) {
        match (self.policy, &config.fallback) {
            (FailurePolicy::Fallback { .. }, Some(local)) => {
                let key: Box<[u8]> = subject.bytes().into();
                let answer = local.try_acquire_n(&key, n).map_err(unavailable_if_too_big);
                (answer, FALLBACKS)
            }
            (FailurePolicy::FailOpen, _) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                (Ok(Admission::new(now, 0, config.capacity)), FAILED_OPEN)
            }
            _ => (Err(TryAcquireError::Unavailable), FAILED_CLOSED),
        }
    }
}

impl<C> Inner<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One decision (`script`: [`Config::script`]) or charge ([`Config::charge`]) in Redis:
    /// `EVALSHA`, and `EVAL` if Redis has lost the script.
    async fn eval(
        &self,
        config: &Config,
        script: &Lua,
        subject: &Tag<'_>,
        n: u32,
    ) -> Result<Vec<i64>, RedisError> {
        self.eval_call(config, script, subject, n, None).await
    }

    /// As [`eval`](Self::eval); with a `call` id (an `acquire` call's attempt, `script` a
    /// `once` script), the subject's record key ([`record`]) after the members' keys, and the
    /// id (in hex) and [`REDIS_ACQUIRE_RECORDS`] after the arguments.
    async fn eval_call(
        &self,
        config: &Config,
        script: &Lua,
        subject: &Tag<'_>,
        n: u32,
        call: Option<u64>,
    ) -> Result<Vec<i64>, RedisError> {
        let chain = config.members.len() > 1;
        let keys = config.members.len() + usize::from(call.is_some());
        run(&self.connection, script, keys, |cmd| {
            for member in &config.members {
                cmd.arg(keys::key(&self.prefix, subject, &member.suffix));
            }
            if call.is_some() {
                cmd.arg(record(&self.prefix, subject));
            }
            cmd.arg(n);
            for member in &config.members {
                if chain {
                    cmd.arg(member.plan.kind);
                }
                cmd.arg(member.plan.params[0]).arg(member.plan.params[1]);
            }
            if let Some(call) = call {
                cmd.arg(format!("{call:016x}")).arg(REDIS_ACQUIRE_RECORDS);
            }
        })
        .await
    }
}

/// The key of `subject`'s record of the `acquire` calls Redis admitted for it (see `once` in
/// `scripts/once.lua`): `prefix:{subject}:acq`, in the subject's hash tag (so its Cluster slot),
/// a hash of at most [`REDIS_ACQUIRE_RECORDS`] call ids.
fn record(prefix: &str, subject: &Tag<'_>) -> Vec<u8> {
    keys::key(prefix, subject, "acq")
}

/// The attempts of one `acquire` call that keeps a record ([`FailurePolicy::Fallback`]): its
/// id, and whether an attempt of it got no reply.
struct Call {
    /// The id every attempt carries ([`call_id`]).
    id: u64,
    /// 1 once an attempt got no reply (it missed the deadline, or its connection failed): Redis
    /// may have run it and admitted the call, and then answers the call's next attempts from
    /// its record. Those attempts skip the deny cache: a rejection of the subject cached since
    /// (another caller's, on the permits the late admission took) is stricter than Redis for
    /// this call, and held it back until that rejection's end, past which its admission no
    /// longer counted and the retry was charged again. Relaxed: the attempts run one after the
    /// other in the call's task, which orders the store before the next attempt's load.
    unanswered: AtomicU64,
}

impl Call {
    fn new(id: u64) -> Self {
        Call {
            id,
            unanswered: AtomicU64::new(0),
        }
    }

    /// Whether an earlier attempt got no reply.
    fn unanswered(&self) -> bool {
        self.unanswered.load(Ordering::Relaxed) != 0
    }
}

/// A fresh id for one `acquire` call, carried by each of its attempts: random, so that calls
/// from every process on a subject are told apart (two of 2^64 meeting is negligible).
fn call_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

/// Runs `script` over `keys` keys through a clone of `connection`: `EVALSHA`, and `EVAL` if
/// Redis has lost the script. `args` adds the keys, then the arguments.
async fn run<C>(
    connection: &C,
    script: &Lua,
    keys: usize,
    args: impl Fn(&mut ::redis::Cmd),
) -> Result<Vec<i64>, RedisError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut connection = connection.clone();
    let command = |name: &str, script: &str| {
        let mut cmd = ::redis::cmd(name);
        cmd.arg(script).arg(keys);
        args(&mut cmd);
        cmd
    };
    match command("EVALSHA", &script.sha)
        .query_async(&mut connection)
        .await
    {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            command("EVAL", script.body)
                .query_async(&mut connection)
                .await
        }
        other => other,
    }
}

/// The fallback's answer as the limiter's: `n` above the local share (but within the limiter's
/// capacity, checked before the round trip) is no `InsufficientCapacity`, which promises that
/// retrying cannot help: Redis admits it once it is back. Until then it is `Unavailable`.
fn unavailable_if_too_big(error: TryAcquireError) -> TryAcquireError {
    match error {
        TryAcquireError::InsufficientCapacity { .. } => TryAcquireError::Unavailable,
        other => other,
    }
}

/// A round trip's reply within `deadline`, or why there is none.
async fn within<T>(
    deadline: Duration,
    round_trip: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(deadline, round_trip).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(_)) => Err(Failure::Error),
        Err(_) => Err(Failure::Timeout),
    }
}

/// A decision from a script's reply `{admitted, now, t, remaining or member}` (times in µs):
/// admitted `(at, reset_after, remaining)` in nanoseconds, or the retry-after in nanoseconds and
/// the member that gave it (1-based; 0 for a single limit).
#[allow(clippy::type_complexity)]
fn parse(reply: &[i64]) -> Result<Result<(u64, u64, u32), (u64, usize)>, Failure> {
    let &[admitted, now, t, remaining] = reply else {
        return Err(Failure::Error);
    };
    let (Ok(now), Ok(t), Ok(remaining)) = (
        u64::try_from(now),
        u64::try_from(t),
        u32::try_from(remaining),
    ) else {
        return Err(Failure::Error);
    };
    let ns = |us: u64| us.saturating_mul(1000);
    Ok(match admitted {
        1 => Ok((ns(now), ns(t), remaining)),
        _ => Err((ns(t), remaining as usize)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_whole_microseconds_rounded_up() {
        let p = plan(Algorithm::TokenBucket {
            rate: Rate::per_second(3),
            burst: 2,
        })
        .ok()
        .unwrap();
        assert_eq!(p.kind, 4);
        assert_eq!(p.params, [333_334, 2]);
        let p = plan(Algorithm::FixedWindow {
            limit: 5,
            window: Duration::from_nanos(1_500),
        })
        .ok()
        .unwrap();
        assert_eq!(p.params, [2, 5]);
        assert!(matches!(
            plan(Algorithm::SlidingCounter {
                limit: u32::MAX,
                window: Duration::from_secs(3600)
            }),
            Err(ConfigError::TooLarge { .. })
        ));
        assert!(matches!(
            plan(Algorithm::FixedWindow {
                limit: 1,
                window: Duration::ZERO
            }),
            Err(ConfigError::Zero { what: "window" })
        ));
    }

    #[test]
    fn fallback_runs_at_its_share() {
        let a = share_of(
            Algorithm::TokenBucket {
                rate: Rate::per_second(10),
                burst: 7,
            },
            0.3,
        );
        assert_eq!(
            a,
            Algorithm::TokenBucket {
                rate: Rate::per_second(3),
                burst: 2
            }
        );
    }

    #[test]
    fn a_slow_rate_is_shared_by_stretching_its_period() {
        let a = share_of(
            Algorithm::TokenBucket {
                rate: Rate::per_minute(1),
                burst: 3,
            },
            0.25,
        );
        assert_eq!(
            a,
            Algorithm::TokenBucket {
                rate: Rate::new(1, Duration::from_secs(240)),
                burst: 1
            }
        );
        // Far beyond what a bucket can hold: held at the in-memory bound, still a valid limiter.
        let a = share_of(
            Algorithm::TokenBucket {
                rate: Rate::new(1, Duration::from_secs(100 * 365 * 86_400)),
                burst: 7,
            },
            0.001,
        );
        assert!(KeyedLimiter::<Box<[u8]>>::new(a).is_ok(), "{a:?}");
    }

    #[test]
    fn jitter_stays_in_its_bounds() {
        for ms in [0u64, 1, 100, 10_000] {
            let j = crate::clock::jitter(Duration::from_millis(ms));
            assert!(j <= Duration::from_millis(50));
        }
    }

    #[test]
    fn malformed_replies_are_failures() {
        assert!(parse(&[1, 2, 3]).is_err());
        assert!(parse(&[1, -2, 3, 4]).is_err());
        assert!(matches!(parse(&[0, 5, 7, 0]), Ok(Err((7_000, 0)))));
        assert!(matches!(parse(&[0, 5, 7, 2]), Ok(Err((7_000, 2)))));
    }

    /// The deny cache and the fallback hold a subject by its tag: a long subject costs them at
    /// most 71 bytes of key (`sha256:` and the digest in hex), not its own length (10,000
    /// subjects of 64 KB in the deny cache held 640 MB), and is still told apart from another
    /// long subject.
    #[tokio::test]
    async fn a_long_subject_costs_the_local_state_its_tag_only() {
        use super::multi::redis_server::RedisServer;
        let server = RedisServer::start();
        let client = ::redis::Client::open(server.url()).unwrap();
        let connection = ::redis::aio::ConnectionManager::new(client).await.unwrap();
        let limiter = RedisLimiter::builder(
            Algorithm::FixedWindow {
                limit: 1,
                window: Duration::from_secs(3600),
            },
            FailurePolicy::Fallback { share: 1.0 },
        )
        .prefix("long")
        .build(connection)
        .unwrap();
        let long = vec![b'x'; 64 * 1024];
        let mut other = long.clone();
        *other.last_mut().unwrap() = b'y';
        limiter.try_acquire(&long).await.unwrap();
        assert!(limiter.try_acquire(&long).await.is_err(), "Redis rejects");
        let config = limiter.inner.config();
        assert_eq!(config.deny.len(), 1);
        assert_eq!(config.deny.key_bytes(), 71, "the tag, not the subject");
        assert!(limiter.try_acquire(&long).await.is_err());
        assert_eq!(limiter.stats().denied_locally, 1, "denied by its tag");
        limiter.try_acquire(&other).await.unwrap();
        // Redis away: the fallback decides, keyed by the tag too.
        let fallback = config.fallback.as_ref().unwrap();
        let tag: Box<[u8]> = Tag::of(&other).bytes().into();
        for member in fallback.per_key() {
            assert!(member.try_acquire_n(&tag, 0).is_ok());
        }
        drop(server);
        assert!(
            limiter.try_acquire(&other).await.is_ok(),
            "the fallback's own count"
        );
        assert_eq!(limiter.stats().fallbacks, 1);
        for member in fallback.per_key() {
            assert!(member.try_acquire(&tag).is_err(), "counted under the tag");
        }
    }

    /// A field of an `acquire` record outlives its admission when a later admission (another
    /// call's) extends the record's TTL. A retry of that call, finding the field after the
    /// admission's reset, must not answer it: its permit no longer counts, so answering it
    /// admitted the call now on nothing, past a window already full.
    #[tokio::test]
    async fn a_stale_acquire_record_is_not_answered() {
        use super::multi::redis_server::{RedisServer, redis_now, room_in_window};
        let server = RedisServer::start();
        let mut raw = server.connection();
        let hour = Duration::from_secs(3600);
        room_in_window(&mut raw, hour, Duration::from_secs(10));
        let client = ::redis::Client::open(server.url()).unwrap();
        let connection = ::redis::aio::ConnectionManager::new(client).await.unwrap();
        let limiter = RedisLimiter::builder(
            Algorithm::FixedWindow {
                limit: 1,
                window: hour,
            },
            FailurePolicy::Fallback { share: 1.0 },
        )
        .prefix("st")
        .deny_cache(0)
        .build(connection)
        .unwrap();
        // Call 7's admission of a window that ended 10 s ago, kept by a record that lives on.
        let now = redis_now(&mut raw);
        let at = now - 20_000_000;
        let () = ::redis::cmd("HSET")
            .arg(record("st", &Tag::of(b"s")))
            .arg(format!("{:016x}", 7))
            .arg(format!("{at}:10000000:0"))
            .query(&mut raw)
            .unwrap();
        let () = ::redis::cmd("PEXPIRE")
            .arg(record("st", &Tag::of(b"s")))
            .arg(3_600_000)
            .query(&mut raw)
            .unwrap();
        // This window's one permit, taken by another caller.
        assert!(limiter.try_acquire("s").await.is_ok());
        // Call 7's retry: the window is full.
        let retry = limiter.decide(&Tag::of(b"s"), 1, Some(&Call::new(7))).await;
        assert!(
            matches!(retry, Err(TryAcquireError::Rejected(_))),
            "{retry:?}"
        );
    }

    /// A chain's admission counts in every limit only until its shortest limit's reset: the
    /// chain's reply (and the record's `reset_after`) is the longest. A retry finding its call's
    /// field after the short limit's permit stopped counting, but within the long limit's
    /// reset, must not answer it: that admitted the call now on nothing in the short limit,
    /// whose window others had since filled (two admitted in a window of one).
    #[tokio::test]
    async fn a_chain_s_acquire_record_is_not_answered_past_its_shortest_reset() {
        use super::multi::redis_server::{RedisServer, redis_now, room_in_window};
        let server = RedisServer::start();
        let mut raw = server.connection();
        let (short, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
        room_in_window(&mut raw, hour, Duration::from_secs(30));
        room_in_window(&mut raw, short, Duration::from_millis(900));
        let client = ::redis::Client::open(server.url()).unwrap();
        let connection = ::redis::aio::ConnectionManager::new(client).await.unwrap();
        let limiter = RedisLimiter::builder(
            Algorithm::FixedWindow {
                limit: 1,
                window: short,
            },
            FailurePolicy::Fallback { share: 1.0 },
        )
        .and_limit(Algorithm::FixedWindow {
            limit: 100,
            window: hour,
        })
        .prefix("sc")
        .deny_cache(0)
        .build(connection)
        .unwrap();
        // Call 7's attempt admitted (its reply lost, say): a permit in this second's window and
        // one in the hour's, which counts it still after this second.
        let first = limiter
            .decide(&Tag::of(b"s"), 1, Some(&Call::new(7)))
            .await
            .unwrap();
        assert!(first.reset_after() > Duration::from_secs(30), "{first:?}");
        // The next second's window (Redis's clock is the real one), whose one permit another
        // caller takes.
        let left = 1_000_000 - redis_now(&mut raw) % 1_000_000;
        std::thread::sleep(Duration::from_micros(left) + Duration::from_millis(5));
        assert!(limiter.try_acquire("s").await.is_ok());
        // Call 7's retry: this window is full.
        let retry = limiter.decide(&Tag::of(b"s"), 1, Some(&Call::new(7))).await;
        assert!(
            matches!(retry, Err(TryAcquireError::Rejected(_))),
            "{retry:?}"
        );
    }

    /// A reconfiguration to a shorter window between an `acquire` call's attempts: the call's
    /// admission, recorded with the reset of the hour it was admitted under, stops counting
    /// when the rebased window ends, a second later. A retry after that must not answer it:
    /// that let the call through on nothing, into the next second's window, which another
    /// caller had filled (two admitted in a window of one).
    #[tokio::test]
    async fn an_acquire_record_is_not_answered_under_other_parameters() {
        use super::multi::redis_server::{RedisServer, redis_now, room_in_window};
        let server = RedisServer::start();
        let mut raw = server.connection();
        let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
        room_in_window(&mut raw, hour, Duration::from_secs(30));
        let client = ::redis::Client::open(server.url()).unwrap();
        let connection = ::redis::aio::ConnectionManager::new(client).await.unwrap();
        let limiter = RedisLimiter::builder(
            Algorithm::FixedWindow {
                limit: 1,
                window: hour,
            },
            FailurePolicy::Fallback { share: 1.0 },
        )
        .prefix("rc")
        .deny_cache(0)
        .build(connection)
        .unwrap();
        // Call 7's attempt admitted (its reply lost, say).
        let first = limiter
            .decide(&Tag::of(b"s"), 1, Some(&Call::new(7)))
            .await
            .unwrap();
        assert!(first.reset_after() > Duration::from_secs(30), "{first:?}");
        limiter
            .reconfigure(Algorithm::FixedWindow {
                limit: 1,
                window: second,
            })
            .unwrap();
        // The first call under the new window rebases the hour's to end within a second; the
        // call's permit counts until then.
        assert!(limiter.try_acquire("s").await.is_err());
        let end: u64 = ::redis::cmd("HGET")
            .arg(limiter.key("s"))
            .arg("w")
            .query::<u64>(&mut raw)
            .unwrap()
            + 1_000_000;
        let now = redis_now(&mut raw);
        std::thread::sleep(
            Duration::from_micros(end.saturating_sub(now)) + Duration::from_millis(5),
        );
        // The next window's one permit, taken by another caller.
        assert!(limiter.try_acquire("s").await.is_ok());
        // Call 7's retry: this window is full.
        let retry = limiter.decide(&Tag::of(b"s"), 1, Some(&Call::new(7))).await;
        assert!(
            matches!(retry, Err(TryAcquireError::Rejected(_))),
            "{retry:?}"
        );
    }

    /// An exact sliding window's admission replies the reset of the whole log, which outlives
    /// the admission's own permits when older ones, admitted under a longer window (before a
    /// reconfiguration, or by a limiter with other parameters), expire later. An `acquire`
    /// call's record was held until that reset: a retry after the call's permit had expired,
    /// into a window others had filled since, was answered with the recorded admission, and
    /// let the call through on nothing (three in a window of two). The record holds the
    /// admission until its own permits expire: alone, and as a chain's member (whose record
    /// was held until the shortest of the members' resets, that same reset here).
    #[tokio::test]
    async fn a_sliding_window_s_acquire_record_is_held_as_long_as_its_own_permits() {
        use super::multi::redis_server::RedisServer;
        let server = RedisServer::start();
        let (hour, short) = (Duration::from_secs(3600), Duration::from_millis(300));
        let log = |window| Algorithm::SlidingWindow { limit: 2, window };
        let hourly = Algorithm::FixedWindow {
            limit: 100,
            window: hour,
        };
        for chain in [false, true] {
            let client = ::redis::Client::open(server.url()).unwrap();
            let connection = ::redis::aio::ConnectionManager::new(client).await.unwrap();
            let mut builder =
                RedisLimiter::builder(log(hour), FailurePolicy::Fallback { share: 1.0 });
            if chain {
                builder = builder.and_limit(hourly);
            }
            let limiter = builder
                .prefix(if chain { "shc" } else { "sh" })
                .deny_cache(0)
                .build(connection)
                .unwrap();
            // A permit of the hour, then the log's window shortened.
            limiter.try_acquire("s").await.unwrap();
            limiter.reconfigure_limit(0, log(short)).unwrap();
            // Call 7's attempt admitted (its reply lost, say): its permit counts for 300 ms,
            // the hour's permit for the hour (the admission's reset).
            let first = limiter
                .decide(&Tag::of(b"s"), 1, Some(&Call::new(7)))
                .await
                .unwrap();
            assert!(first.reset_after() > Duration::from_secs(60), "{first:?}");
            // The call's permit has expired; another caller takes the room it left.
            std::thread::sleep(short + Duration::from_millis(50));
            assert!(limiter.try_acquire("s").await.is_ok(), "chain: {chain}");
            // Call 7's retry: the log holds two live permits, its limit.
            let retry = limiter.decide(&Tag::of(b"s"), 1, Some(&Call::new(7))).await;
            assert!(
                matches!(retry, Err(TryAcquireError::Rejected(_))),
                "chain: {chain}: {retry:?}"
            );
        }
    }
}
