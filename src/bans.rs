//! [`BanList`]: "ban a key for D after K failures within T" (login brute-force protection,
//! rate-limiter-flexible's `blockDuration` and `block(key, secs)`), per key, in memory.
//!
//! Built from two [`KeyedLimiter`]s, so it inherits their lock-free lookups, idle eviction and
//! hard key cap:
//!
//! - **failures**: a fixed window of `within` per key whose limit is `u32::MAX`, used only as a
//!   counter: each failure is one admission, and the count is read back from what remains.
//! - **bans**: a token bucket of one token per millisecond ([`BAN_RESOLUTION`]) and a burst of
//!   one per key. A key with no token is banned, and its `retry_after` is exactly when the ban
//!   ends. A ban of `d` is a [`charge`](KeyedLimiter::charge) of `d` in milliseconds, which
//!   holds any length up to the bucket's saturation (at least 146 years) with no limit to
//!   reconfigure, and a ban that has run out leaves a full bucket, which the limiter evicts as
//!   idle.
//!
//! Failures and everything that starts, extends or lifts a ban are serialised per key by one
//! of a few striped mutexes (a failure holds its key's for one counter update, and for its ban
//! if it starts one), so keys of different stripes never wait for each other; checks take no
//! lock.

use crate::clock::{Clock, DefaultClock};
use crate::error::{ConfigError, TryAcquireError};
use crate::keyed::{DEFAULT_MAX_KEYS, KeyOverflow, KeyedLimiter};
use crate::limiter::{Algorithm, Rate};
use crate::sync::{Arc, Counters, Mutex, MutexGuard, lock};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

/// The unit of a ban's length: bans are whole milliseconds, rounded up.
///
/// A ban that starts on a key that is not banned ends exactly its length (rounded up to whole
/// milliseconds) after it started; one that extends a ban in force ends at least its length
/// from now and less than one resolution later (see [`BanList::ban`]).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::BAN_RESOLUTION;
///
/// assert_eq!(BAN_RESOLUTION, Duration::from_millis(1));
/// ```
pub const BAN_RESOLUTION: Duration = Duration::from_millis(1);

/// Nanoseconds in [`BAN_RESOLUTION`].
const RESOLUTION_NS: u128 = 1_000_000;

/// The most tokens a ban ever charges: the bans' bucket holds its `tat` at 2^63 − 2 ns after
/// the clock's epoch, so charging beyond 2^63 ns of ban changes nothing.
const MAX_BAN_TOKENS: u128 = (1u128 << 63) / RESOLUTION_NS + 1;

/// Most stripes of `Inner::banning`: each is cache-padded, so 64 of them cost 8 KiB a list,
/// and a flood of failures over many keys meets another key's lock one time in 64 at most.
const MAX_STRIPES: usize = 64;

/// Index in `Inner::counters` of failures counted.
const FAILURES: usize = 0;
/// Index in `Inner::counters` of bans started or lengthened.
const BANS: usize = 1;
/// Index in `Inner::counters` of checks answered [`Banned`].
const REFUSED: usize = 2;
/// Index in `Inner::counters` of [`BanListFull`] errors returned.
const FULL: usize = 3;

/// Counts of a [`BanList`], for monitoring: from [`BanList::stats`].
///
/// The four event counts are kept per thread (no shared cache line is written to count) and
/// summed when read: each is exact once the calls it counts have returned, and may lag by calls
/// in flight. The key counts are snapshots.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{BanList, ManualClock};
///
/// let bans = BanList::builder(2, Duration::from_secs(60), Duration::from_secs(600))
///     .clock(ManualClock::new())
///     .build()?;
/// bans.fail(&"mallory")?;
/// bans.fail(&"mallory")?; // the second failure bans
/// assert!(bans.check(&"mallory").is_err());
/// let stats = bans.stats();
/// assert_eq!((stats.failures, stats.bans, stats.refused, stats.full), (2, 1, 1, 0));
/// assert_eq!((stats.failing_keys, stats.banned_keys), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BanStats {
    /// Failures counted by [`fail`](BanList::fail): not those beyond `u32::MAX` in one window
    /// of a key, nor those refused as [`BanListFull`] (a failure whose ban a full table could
    /// not record is given back, not counted).
    pub failures: u64,
    /// Bans started or lengthened: failures whose [`FailOutcome::ban_started`] is true (also
    /// when a ban in force that ends later was kept), and [`ban`](BanList::ban) calls that
    /// started a ban or made one in force longer (not those that found it at its saturation,
    /// which no ban can lengthen).
    pub bans: u64,
    /// [`check`](BanList::check) calls answered [`Banned`]: the attempts a caller refused.
    pub refused: u64,
    /// [`BanListFull`] errors returned by [`fail`](BanList::fail) and [`ban`](BanList::ban):
    /// failures or bans not recorded for want of room.
    pub full: u64,
    /// Keys with failures held now, including those of a window that has passed and not yet
    /// been evicted.
    pub failing_keys: usize,
    /// Keys with a ban held now, including bans that have ended and not yet been evicted.
    pub banned_keys: usize,
}

/// A key is banned: the answer of [`BanList::check`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{BanList, ManualClock};
///
/// let bans = BanList::builder(3, Duration::from_secs(60), Duration::from_secs(600))
///     .clock(ManualClock::new())
///     .build()?;
/// bans.ban(&"mallory", Duration::from_secs(30))?;
/// let banned = bans.check(&"mallory").unwrap_err();
/// assert_eq!(banned.retry_after(), Duration::from_secs(30));
/// assert_eq!(banned.to_string(), "banned for another 30s");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Banned {
    retry_after: Duration,
}

impl Banned {
    /// How long until the ban ends: exact, to the nanosecond of the list's clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let bans = BanList::builder(1, Duration::from_secs(60), Duration::from_secs(60))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// bans.fail(&"mallory")?;
    /// clock.advance(Duration::from_secs(15));
    /// assert_eq!(bans.check(&"mallory").unwrap_err().retry_after(), Duration::from_secs(45));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for Banned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "banned for another {:?}", self.retry_after)
    }
}

impl std::error::Error for Banned {}

/// A failure or a ban that a [`BanList`] could not record: the key is new, the list already
/// holds [`max_keys`](BanListBuilder::max_keys) keys in the table it needed, and none of them
/// is idle (every one has failures in the current window, or a ban in force).
///
/// The list neither drops a ban nor bans a key it cannot track: bans in force are never
/// evicted, a key it has no room for is not banned (it is not shared with other keys, as
/// [`KeyOverflow::Shared`] would), and this error tells the caller that the failure or ban was
/// not recorded, so that it can refuse the attempt itself.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{BanList, BanListFull, ManualClock};
///
/// let bans = BanList::builder(5, Duration::from_secs(60), Duration::from_secs(600))
///     .clock(ManualClock::new())
///     .max_keys(1)
///     .build()?;
/// bans.fail(&"alice")?;
/// assert_eq!(bans.fail(&"bob"), Err(BanListFull { max_keys: 1 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BanListFull {
    /// The list's key cap (per table).
    pub max_keys: usize,
}

impl fmt::Display for BanListFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the ban list holds {} keys, none of them idle: the failure or ban was not recorded",
            self.max_keys
        )
    }
}

impl std::error::Error for BanListFull {}

/// What [`BanList::fail`] recorded.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{BanList, ManualClock};
///
/// let bans = BanList::builder(2, Duration::from_secs(60), Duration::from_secs(300))
///     .clock(ManualClock::new())
///     .build()?;
/// let first = bans.fail(&"mallory")?;
/// assert_eq!((first.failures, first.ban_started, first.banned_for), (1, false, None));
/// let second = bans.fail(&"mallory")?;
/// assert_eq!(second.failures, 2);
/// assert!(second.ban_started);
/// assert_eq!(second.banned_for, Some(Duration::from_secs(300)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct FailOutcome {
    /// The key's failures in the current window of `within`, this one included (saturating at
    /// `u32::MAX`: that many is counted, and can start a ban, but failures beyond it in one
    /// window are not counted and start no ban).
    pub failures: u32,
    /// This failure was an `after`-th of its window, so the key is now banned for at least the
    /// list's ban duration from now (a ban in force that ends later is kept as it is).
    pub ban_started: bool,
    /// How long the key stays banned, seen right after this failure; `None` if it is not.
    pub banned_for: Option<Duration>,
}

/// A ban list: a key that fails `after` times within a window of `within` is banned for a
/// duration, and any key can be banned or unbanned by hand.
///
/// For login brute-force protection (rate-limiter-flexible's `blockDuration`, `block`,
/// `delete`; AspNetCoreRateLimit's "blacklist after abuse"): [`check`](Self::check) before the
/// attempt, [`fail`](Self::fail) when it fails, [`forgive`](Self::forgive) when it succeeds.
///
/// - **Failures** are counted per key in fixed windows of `within`, aligned to the clock's
///   epoch (as [`Algorithm::FixedWindow`]'s). *Every* `after`-th failure of a window starts a
///   ban, not only the first, so a key that goes on failing after a ban shorter than `within`
///   ended is banned again after `after` more, not let off until the window ends.
/// - **Bans** last the configured duration, or any duration given to [`ban`](Self::ban). A
///   ban never shortens a ban in force: the key stays banned until the later of the two ends.
///   Lengths are whole [`BAN_RESOLUTION`]s (rounded up), and a ban's end saturates at 2^63 − 2
///   ns after the clock's epoch, beyond the last reading the default clock gives (2^62 − 1 ns,
///   about 146 years): a longer ban never ends on it (a [`ManualClock`](crate::ManualClock)
///   advanced past that point sees it end).
/// - **Checks** are one lookup in a lock-free map, take no lock, write nothing and never add a
///   key; a ban's `retry_after` is exact.
/// - **Memory** is bounded: each of the two tables (failures, bans) holds at most
///   [`max_keys`](BanListBuilder::max_keys) keys; a key whose window has passed with no ban in
///   force is idle and evicted (incrementally, at the cap, by [`sweep`](Self::sweep), or in
///   the background by `run_sweeper`, feature `tokio`). At the cap with nothing idle, a new
///   key's failure or ban is not recorded and the call says so ([`BanListFull`]): no ban in
///   force is ever evicted, and no key is banned for another's failures.
///
/// Cloning is cheap and clones share state. Everything lives in this process.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{BanList, ManualClock};
///
/// // Five failed logins within 15 minutes ban the account for an hour.
/// let clock = ManualClock::new();
/// let logins = BanList::builder(5, Duration::from_secs(15 * 60), Duration::from_secs(3600))
///     .clock(clock.clone())
///     .build()?;
/// for _ in 0..4 {
///     logins.fail(&"alice")?;
/// }
/// assert!(logins.check(&"alice").is_ok());
/// assert!(logins.fail(&"alice")?.ban_started);
/// assert_eq!(logins.check(&"alice").unwrap_err().retry_after(), Duration::from_secs(3600));
/// clock.advance(Duration::from_secs(3600));
/// assert!(logins.check(&"alice").is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BanList<K, C: Clock = DefaultClock, S = crate::sync::RandomHasher> {
    inner: Arc<Inner<K, C, S>>,
}

struct Inner<K, C: Clock, S> {
    after: u32,
    within: Duration,
    duration: Duration,
    /// Failures per key: a fixed window of `within` with a limit of `u32::MAX`; the count is
    /// `u32::MAX` minus what an admission says remains.
    failures: KeyedLimiter<K, C, S>,
    /// One token per [`BAN_RESOLUTION`], a burst of one: a key without its token is banned
    /// until the token comes back.
    bans: KeyedLimiter<K, C, S>,
    /// Serialise failures and what changes a ban (start, extend, lift) of the keys of one
    /// stripe (`BanList::stripe`: the key's shard in the failures table, modulo the stripe
    /// count, a power of two); keys of different stripes never wait for each other. A ban
    /// change reads the ban in force and then charges or resets it, and a charge adds to what
    /// is there, so two of them interleaved would add up (a longer ban than either asked for)
    /// or a lift between a read and its charge would shorten the ban. A failure holds it from
    /// its count to its ban: an `unban` between the two would forget the failure and then see
    /// the ban it started land after it, a key banned with no failure counted. Checks take no
    /// lock.
    banning: Box<[CachePadded<Mutex<()>>]>,
    /// Event counts for [`BanList::stats`], indexed by `FAILURES`, `BANS`, `REFUSED`, `FULL`.
    counters: Counters,
}

impl<K, C: Clock, S> Clone for BanList<K, C, S> {
    fn clone(&self) -> Self {
        BanList {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, C: Clock, S> fmt::Debug for BanList<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BanList")
            .field("after", &self.inner.after)
            .field("within", &self.inner.within)
            .field("duration", &self.inner.duration)
            .field("max_keys", &self.inner.failures.max_keys())
            .field("failing_keys", &self.inner.failures.len())
            .field("banned_keys", &self.inner.bans.len())
            .finish()
    }
}

/// Builds a [`BanList`]; from [`BanList::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{BanList, ManualClock};
///
/// let bans = BanList::<String, _>::builder(10, Duration::from_secs(60), Duration::from_secs(900))
///     .clock(ManualClock::new())
///     .max_keys(100_000)
///     .build()?;
/// assert_eq!(bans.max_keys(), 100_000);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct BanListBuilder<K, C = DefaultClock, S = crate::sync::RandomHasher> {
    after: u32,
    within: Duration,
    duration: Duration,
    clock: C,
    hasher: S,
    max_keys: usize,
    _key: std::marker::PhantomData<fn(&K)>,
}

impl<K> BanList<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A ban list on the [`DefaultClock`] with at most [`DEFAULT_MAX_KEYS`] keys per table: a
    /// key that fails `after` times within a window of `within` is banned for `duration`.
    ///
    /// # Errors
    ///
    /// As [`BanListBuilder::build`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ConfigError};
    ///
    /// let bans: BanList<String> = BanList::new(5, Duration::from_secs(60), Duration::from_secs(600))?;
    /// assert!(bans.check(&"alice".to_owned()).is_ok());
    /// assert_eq!(
    ///     BanList::<String>::new(0, Duration::from_secs(60), Duration::from_secs(600)).unwrap_err(),
    ///     ConfigError::Zero { what: "after" },
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(after: u32, within: Duration, duration: Duration) -> Result<Self, ConfigError> {
        Self::builder(after, within, duration).build()
    }

    /// A builder for a ban list of `after` failures within `within`, banned for `duration`, to
    /// set the clock, the key cap or the hasher.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let bans = BanList::builder(3, Duration::from_secs(60), Duration::from_secs(60))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// bans.fail(&7u64)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(after: u32, within: Duration, duration: Duration) -> BanListBuilder<K> {
        BanListBuilder {
            after,
            within,
            duration,
            clock: DefaultClock::default(),
            hasher: crate::sync::RandomHasher::default(),
            max_keys: DEFAULT_MAX_KEYS,
            _key: std::marker::PhantomData,
        }
    }
}

impl<K, C, S> BanListBuilder<K, C, S> {
    /// Uses `clock` for failure windows and bans ([`ManualClock`](crate::ManualClock) in
    /// tests).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let bans = BanList::builder(1, Duration::from_secs(1), Duration::from_secs(5))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// bans.fail(&"k")?;
    /// clock.advance(Duration::from_secs(5));
    /// assert!(bans.check(&"k").is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> BanListBuilder<K, C2, S> {
        BanListBuilder {
            after: self.after,
            within: self.within,
            duration: self.duration,
            clock,
            hasher: self.hasher,
            max_keys: self.max_keys,
            _key: std::marker::PhantomData,
        }
    }

    /// Hashes keys with `hasher` instead of a randomly seeded foldhash (keep it seeded: keys
    /// such as user names are chosen by clients).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use std::time::Duration;
    /// use turnstile::BanList;
    ///
    /// let bans = BanList::<String>::builder(5, Duration::from_secs(60), Duration::from_secs(60))
    ///     .hasher(RandomState::new())
    ///     .build()?;
    /// assert!(bans.is_empty());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn hasher<S2: BuildHasher + Clone>(self, hasher: S2) -> BanListBuilder<K, C, S2> {
        BanListBuilder {
            after: self.after,
            within: self.within,
            duration: self.duration,
            clock: self.clock,
            hasher,
            max_keys: self.max_keys,
            _key: std::marker::PhantomData,
        }
    }

    /// At most `max_keys` keys with failures counted, and at most `max_keys` banned (default
    /// [`DEFAULT_MAX_KEYS`]); see [`BanListFull`] for a new key at the cap.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::BanList;
    ///
    /// let bans = BanList::<u64>::builder(5, Duration::from_secs(60), Duration::from_secs(60))
    ///     .max_keys(1000)
    ///     .build()?;
    /// assert_eq!(bans.max_keys(), 1000);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }
}

impl<K, C: Clock + Clone, S> BanListBuilder<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Builds the list.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for `after`, `within`, the ban `duration` or `max_keys` of zero;
    /// [`ConfigError::TooLarge`] for a `within` too long for a fixed window. A ban `duration`
    /// is never too long: it saturates (see [`BanList`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ConfigError};
    ///
    /// let zero = BanList::<u64>::builder(5, Duration::ZERO, Duration::from_secs(60)).build();
    /// assert_eq!(zero.unwrap_err(), ConfigError::Zero { what: "within" });
    /// let forever = BanList::<u64>::builder(5, Duration::from_secs(60), Duration::MAX).build();
    /// assert!(forever.is_ok());
    /// ```
    pub fn build(self) -> Result<BanList<K, C, S>, ConfigError> {
        if self.after == 0 {
            return Err(ConfigError::Zero { what: "after" });
        }
        if self.within.is_zero() {
            return Err(ConfigError::Zero { what: "within" });
        }
        if self.duration.is_zero() {
            return Err(ConfigError::Zero {
                what: "ban duration",
            });
        }
        let keyed = |algorithm| {
            KeyedLimiter::builder(algorithm)
                .clock(self.clock.clone())
                .hasher(self.hasher.clone())
                .max_keys(self.max_keys)
                // Never share a cell between keys: a shared failure count or ban would ban keys
                // for others' failures (see `BanListFull`).
                .overflow(KeyOverflow::Reject)
                .build()
        };
        let failures = keyed(Algorithm::FixedWindow {
            limit: u32::MAX,
            window: self.within,
        })
        .map_err(|e| match e {
            ConfigError::Zero { .. } if self.max_keys == 0 => e,
            ConfigError::Zero { .. } => ConfigError::Zero { what: "within" },
            ConfigError::TooLarge { max, .. } => ConfigError::TooLarge {
                what: "within",
                max,
            },
            e => e,
        })?;
        let bans = keyed(Algorithm::TokenBucket {
            rate: Rate::new(1, BAN_RESOLUTION),
            burst: 1,
        })?;
        // As many stripes as the failures table has shards, up to `MAX_STRIPES` (both powers
        // of two, so a key's stripe is its shard's low bits).
        let stripes = crate::keyed::shard_count(self.max_keys).min(MAX_STRIPES);
        Ok(BanList {
            inner: Arc::new(Inner {
                after: self.after,
                within: self.within,
                duration: self.duration,
                failures,
                bans,
                banning: (0..stripes)
                    .map(|_| CachePadded::new(Mutex::new(())))
                    .collect(),
                counters: Counters::new(),
            }),
        })
    }
}

impl<K, C: Clock, S> BanList<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// `Err(Banned)` while `key` is banned, with exactly how long the ban has left; `Ok` if it
    /// is not (or is a key the list holds nothing for). Never blocks, takes no lock, writes
    /// nothing and never adds a key.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let bans = BanList::builder(3, Duration::from_secs(60), Duration::from_secs(600))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert!(bans.check(&"203.0.113.7").is_ok());
    /// assert!(bans.is_empty(), "a check adds no key");
    /// bans.ban(&"203.0.113.7", Duration::from_secs(60))?;
    /// assert_eq!(bans.check(&"203.0.113.7").unwrap_err().retry_after(), Duration::from_secs(60));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self, key: &K) -> Result<(), Banned> {
        match self.left(key) {
            Some(retry_after) => {
                self.inner.counters.bump(REFUSED);
                Err(Banned { retry_after })
            }
            None => Ok(()),
        }
    }

    /// Records a failure of `key` (a wrong password, a rejected request) now: every `after`-th
    /// failure within a window of `within` bans the key for the list's duration from now,
    /// unless a ban in force already ends later (it is kept).
    ///
    /// Failures are counted whether or not the key is banned; a caller that refuses banned
    /// keys before the attempt (as it should) counts only the failures made since the ban
    /// ended.
    ///
    /// A failure holds its key's lock from its count to the ban it starts, so that an
    /// [`unban`](Self::unban) comes wholly before it (and the failure counts after the unban)
    /// or wholly after it (and lifts its ban); checks never wait for it.
    ///
    /// # Errors
    ///
    /// [`BanListFull`]: `key` is new to a table at its cap with nothing idle, so the failure
    /// was not counted; or the ban it was due to start could not be recorded, and the failure
    /// is not counted either (the key's next failure is that `after`-th one again).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let bans = BanList::builder(2, Duration::from_secs(60), Duration::from_secs(10))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert!(!bans.fail(&"mallory")?.ban_started);
    /// assert!(bans.fail(&"mallory")?.ban_started);
    /// clock.advance(Duration::from_secs(10)); // the ban ends; the window goes on
    /// assert!(!bans.fail(&"mallory")?.ban_started);
    /// let fourth = bans.fail(&"mallory")?;
    /// assert_eq!((fourth.failures, fourth.ban_started), (4, true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fail(&self, key: &K) -> Result<FailOutcome, BanListFull> {
        // From the count to the ban: an `unban` in between would forget this failure and then
        // see its ban start after it (see `Inner::banning`).
        let _one_at_a_time = self.stripe(key);
        // Committed with what a refund needs: a failure whose ban is not recorded is given back.
        let (decision, committed) = self.inner.failures.chain_decide::<true>(key, 1);
        let counted = match decision {
            Ok(admission) => Some((admission, u32::MAX - admission.remaining())),
            // `u32::MAX` failures in this window already: no more are counted.
            Err(TryAcquireError::Rejected(_)) => None,
            Err(_) => return Err(self.full()),
        };
        let due = starts_ban(counted.map(|(_, n)| n), self.inner.after);
        let failures = counted.map_or(u32::MAX, |(_, n)| n);
        let banned_for = if due {
            match self.extend_locked(key, self.inner.duration) {
                Ok((left, _)) => {
                    self.inner.counters.bump(BANS);
                    Some(left)
                }
                Err(full) => {
                    // Neither the failure nor its ban recorded: kept, the failure left the key
                    // one past its `after`-th, and its next `after - 1` failures banned nobody
                    // (`a_ban_the_full_table_refused_is_started_by_the_next_failure`). Given back,
                    // the next failure is this `after`-th again. (A `forgive` or `unban` of any
                    // key that lands between the count and the refund makes the refund give
                    // nothing back, as for every keyed refund: the count then stays as it was.)
                    if let Some((admission, _)) = counted {
                        self.inner
                            .failures
                            .chain_refund(key, 1, &admission, committed);
                    }
                    return Err(full);
                }
            }
        } else {
            self.left(key)
        };
        if counted.is_some() {
            self.inner.counters.bump(FAILURES);
        }
        Ok(FailOutcome {
            failures,
            ban_started: due,
            banned_for,
        })
    }

    /// Bans `key` for `duration` from now, by hand (rate-limiter-flexible's `block(key,
    /// secs)`): any duration, rounded up to whole [`BAN_RESOLUTION`]s and saturating (see
    /// [`BanList`]). It extends a ban in force that would end sooner, and never shortens one
    /// that ends later (use [`unban`](Self::unban) first to shorten). Returns how long the key
    /// is banned now. A `duration` of zero changes nothing.
    ///
    /// A ban that starts on a key not banned ends exactly `duration` (rounded up) from now; one
    /// that extends a ban in force ends at least `duration` from now and less than one
    /// resolution later. Past the clock's last reading the bans tell apart (2^62 − 1 ns after
    /// its epoch, 146 years; a `ManualClock` advanced by `Duration::MAX`) time stands still for
    /// them: every ban started there never ends, and reads as at least 2^62 ns.
    ///
    /// # Errors
    ///
    /// [`BanListFull`]: `key` is not banned, and the bans table is at its cap with every key in
    /// it banned; the ban was not recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let bans = BanList::builder(5, Duration::from_secs(60), Duration::from_secs(60))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert_eq!(bans.ban(&"mallory", Duration::from_secs(3600))?, Duration::from_secs(3600));
    /// // A shorter ban leaves the longer one in force.
    /// assert_eq!(bans.ban(&"mallory", Duration::from_secs(60))?, Duration::from_secs(3600));
    /// assert_eq!(bans.ban(&"mallory", Duration::from_secs(7200))?, Duration::from_secs(7200));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ban(&self, key: &K, duration: Duration) -> Result<Duration, BanListFull> {
        let _one_at_a_time = self.stripe(key);
        let (left, lengthened) = self.extend_locked(key, duration)?;
        if lengthened {
            self.inner.counters.bump(BANS);
        }
        Ok(left)
    }

    /// Lifts `key`'s ban now and forgets its failures (rate-limiter-flexible's `delete`): it
    /// is banned again only after `after` more failures. True if it was banned.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let bans = BanList::builder(2, Duration::from_secs(60), Duration::from_secs(600))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// bans.fail(&"alice")?;
    /// bans.fail(&"alice")?;
    /// assert!(bans.unban(&"alice"));
    /// assert!(bans.check(&"alice").is_ok());
    /// assert_eq!(bans.failures(&"alice"), 0);
    /// assert!(!bans.unban(&"alice"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unban(&self, key: &K) -> bool {
        let _one_at_a_time = self.stripe(key);
        let banned = self.left(key).is_some();
        self.inner.failures.reset(key);
        self.inner.bans.reset(key);
        banned
    }

    /// Forgets `key`'s failures and leaves any ban in force as it is: what a successful login
    /// does, so that its next `after` failures are needed for a ban. True if the list held
    /// failures of the key to forget (of this window, or of one that passed and was not yet
    /// evicted).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let bans = BanList::builder(3, Duration::from_secs(900), Duration::from_secs(3600))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// bans.fail(&"alice")?;
    /// bans.fail(&"alice")?;
    /// assert!(bans.forgive(&"alice")); // the third try was right
    /// assert_eq!(bans.failures(&"alice"), 0);
    /// assert!(!bans.fail(&"alice")?.ban_started);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forgive(&self, key: &K) -> bool {
        self.inner.failures.reset(key)
    }

    /// `key`'s failures in the current window of `within` (a snapshot; 0 for a key the list
    /// holds no failures of, also one whose failure a full table refused as [`BanListFull`]).
    /// Adds no key.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let bans = BanList::builder(5, Duration::from_secs(60), Duration::from_secs(60))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// bans.fail(&"bob")?;
    /// bans.fail(&"bob")?;
    /// assert_eq!(bans.failures(&"bob"), 2);
    /// clock.advance(Duration::from_secs(60));
    /// assert_eq!(bans.failures(&"bob"), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn failures(&self, key: &K) -> u32 {
        // What the key's cell holds, not `available`: for a key without a cell that answers
        // what its next failure would be decided on, none at a full table, which read as
        // `u32::MAX` failures.
        self.inner
            .failures
            .held_available(key)
            .map_or(0, |free| u32::MAX - free)
    }

    /// The keys banned now, each with how long it stays banned: for an operator's listing, or
    /// for carrying the bans in force over to another list. A snapshot, weakly consistent
    /// under concurrent changes (a ban started, ended or lifted meanwhile may or may not be
    /// in it), in no particular order. Takes no lock, writes nothing; it visits every key of
    /// the bans table, so it costs time in their number.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let bans = BanList::builder(1, Duration::from_secs(60), Duration::from_secs(600))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// bans.fail(&"mallory")?;
    /// bans.ban(&"eve", Duration::from_secs(60))?;
    /// clock.advance(Duration::from_secs(30));
    /// let mut banned = bans.banned();
    /// banned.sort();
    /// assert_eq!(
    ///     banned,
    ///     [("eve", Duration::from_secs(30)), ("mallory", Duration::from_secs(570))],
    /// );
    /// clock.advance(Duration::from_secs(30));
    /// assert_eq!(bans.banned(), [("mallory", Duration::from_secs(540))]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn banned(&self) -> Vec<(K, Duration)> {
        // The keys first, then each one's ban: no lookup runs inside the table's walk.
        self.inner
            .bans
            .keys()
            .into_iter()
            .filter_map(|key| {
                let left = self.left(&key)?;
                Some((key, left))
            })
            .collect()
    }

    /// Evicts every idle key now (failures of a window that has passed, bans that have ended);
    /// returns how many entries were evicted. Idle keys are also evicted as new keys arrive
    /// and at the cap: this is for returning memory sooner.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let bans = BanList::builder(1, Duration::from_secs(60), Duration::from_secs(60))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// bans.fail(&1u32)?; // a failure and a ban: two entries
    /// assert_eq!(bans.len(), 2);
    /// clock.advance(Duration::from_secs(60));
    /// assert_eq!(bans.sweep(), 2);
    /// assert!(bans.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sweep(&self) -> usize {
        self.inner.failures.sweep() + self.inner.bans.sweep()
    }

    /// Sweeps every `every` (as [`sweep`](Self::sweep)) until the last handle to the list is
    /// dropped: spawn it on tokio (`tokio::spawn(bans.run_sweeper(Duration::from_secs(10)))`)
    /// to return memory from idle keys without waiting for new keys to arrive. An `every`
    /// under one millisecond sweeps every millisecond. Like `acquire`, it runs on any executor:
    /// it sleeps on tokio's timer inside a tokio runtime (with its time driver enabled), on
    /// futures-timer's thread elsewhere. Each sleep of `every` starts when the sweep before it
    /// ends.
    ///
    /// It holds only a weak reference, so it does not keep the list alive (it ends when it
    /// next wakes after the list is dropped, within `every`), and the tables' sweep flags keep
    /// it from sweeping a shard that a call is already sweeping.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it holds nothing across its awaits but the weak reference; dropping it
    /// stops the sweeping and leaves the list as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let bans = BanList::builder(1, Duration::from_secs(1), Duration::from_secs(2))
    ///     .clock(TokioClock::new())
    ///     .build()?;
    /// let sweeper = tokio::spawn(bans.run_sweeper(Duration::from_secs(5)));
    /// bans.fail(&"mallory")?; // a failure and a ban: two entries
    /// tokio::time::sleep(Duration::from_secs(6)).await;
    /// assert!(bans.is_empty());
    /// drop(bans);
    /// sweeper.await?; // ends when it next wakes: the list is gone
    /// # Ok(())
    /// # }
    /// ```
    // Not under loom: loom's `Arc` has no weak references (as `KeyedLimiter::run_sweeper`).
    #[cfg(all(feature = "tokio", not(turnstile_loom)))]
    pub fn run_sweeper(
        &self,
        every: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static
    where
        C: 'static,
    {
        let weak = Arc::downgrade(&self.inner);
        async move {
            let every = every.max(BAN_RESOLUTION);
            loop {
                crate::timer::sleep(every).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                inner.failures.sweep();
                inner.bans.sweep();
            }
        }
    }

    /// Counts for monitoring: failures, bans and refusals so far, and keys held now (see
    /// [`BanStats`]). Cheap: it sums a few per-thread counters and reads two key counts.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let bans = BanList::builder(5, Duration::from_secs(60), Duration::from_secs(60))
    ///     .clock(ManualClock::new())
    ///     .max_keys(1)
    ///     .build()?;
    /// bans.ban(&"mallory", Duration::from_secs(60))?;
    /// assert!(bans.ban(&"eve", Duration::from_secs(60)).is_err()); // no room
    /// let stats = bans.stats();
    /// assert_eq!((stats.bans, stats.full, stats.banned_keys), (1, 1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> BanStats {
        let counters = &self.inner.counters;
        BanStats {
            failures: counters.sum(FAILURES),
            bans: counters.sum(BANS),
            refused: counters.sum(REFUSED),
            full: counters.sum(FULL),
            failing_keys: self.inner.failures.len(),
            banned_keys: self.inner.bans.len(),
        }
    }

    /// Entries held now: keys with failures counted plus keys with a ban (a key with both
    /// counts twice; a key whose window passed or whose ban ended counts until evicted).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, ManualClock};
    ///
    /// let bans = BanList::builder(3, Duration::from_secs(60), Duration::from_secs(60))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// bans.fail(&"a")?;
    /// bans.ban(&"b", Duration::from_secs(1))?;
    /// assert_eq!(bans.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.inner.failures.len() + self.inner.bans.len()
    }

    /// Whether the list holds no entry (see [`len`](Self::len)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::BanList;
    ///
    /// let bans = BanList::<u64>::new(3, Duration::from_secs(60), Duration::from_secs(60))?;
    /// assert!(bans.is_empty());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key cap of each table (failures, bans).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{BanList, DEFAULT_MAX_KEYS};
    ///
    /// let bans = BanList::<u64>::new(3, Duration::from_secs(60), Duration::from_secs(60))?;
    /// assert_eq!(bans.max_keys(), DEFAULT_MAX_KEYS);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn max_keys(&self) -> usize {
        self.inner.failures.max_keys()
    }

    /// Failures within a window that start a ban.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::BanList;
    ///
    /// let bans = BanList::<u64>::new(3, Duration::from_secs(60), Duration::from_secs(600))?;
    /// assert_eq!((bans.after(), bans.within(), bans.duration()), (3, Duration::from_secs(60), Duration::from_secs(600)));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn after(&self) -> u32 {
        self.inner.after
    }

    /// The window failures are counted in.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::BanList;
    ///
    /// let bans = BanList::<u64>::new(3, Duration::from_secs(60), Duration::from_secs(600))?;
    /// assert_eq!(bans.within(), Duration::from_secs(60));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn within(&self) -> Duration {
        self.inner.within
    }

    /// How long the ban an `after`-th failure starts lasts.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::BanList;
    ///
    /// let bans = BanList::<u64>::new(3, Duration::from_secs(60), Duration::from_secs(600))?;
    /// assert_eq!(bans.duration(), Duration::from_secs(600));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn duration(&self) -> Duration {
        self.inner.duration
    }

    /// Locks `key`'s stripe of `Inner::banning`.
    fn stripe(&self, key: &K) -> MutexGuard<'_, ()> {
        let stripes = &self.inner.banning;
        // `stripes.len()` is a power of two, so the mask keeps the shard's low bits.
        lock(&stripes[self.inner.failures.shard(key) & (stripes.len() - 1)])
    }

    /// What is left of `key`'s ban; `None` if it is not banned. Counts nothing.
    fn left(&self, key: &K) -> Option<Duration> {
        // A check of one token that takes nothing and inserts no cell; a key not held (or one
        // the table has no room for) has its token.
        match self.inner.bans.chain_decide::<false>(key, 1).0 {
            Err(TryAcquireError::Rejected(r)) => Some(r.retry_after()),
            _ => None,
        }
    }

    /// A [`BanListFull`] to return, counted.
    fn full(&self) -> BanListFull {
        self.inner.counters.bump(FULL);
        BanListFull {
            max_keys: self.inner.failures.max_keys(),
        }
    }

    /// Makes `key`'s ban last at least `duration` from now; returns how long it lasts now and
    /// whether this started or lengthened it. The caller holds `banning`.
    fn extend_locked(&self, key: &K, duration: Duration) -> Result<(Duration, bool), BanListFull> {
        // The ban in force: a charge of nothing records nothing and adds no key, and says when
        // the key's bucket is full again (`max(tat, now)`, the ban's end, or now if none) and
        // what is left of the ban until then (0: none). Under the lock nothing else changes
        // it; time may pass before the charge, and if the ban ends meanwhile the charge starts
        // from a later now, so the ban still ends at least `duration` after this reading.
        let (left, end) = match self.inner.bans.charge(key, 0) {
            Ok(probe) => (probe.reset_after(), ban_end(&probe)),
            // Never for a charge of nothing; answered as no ban.
            Err(_) => (Duration::ZERO, 0),
        };
        let Some(more) = duration.checked_sub(left).filter(|d| !d.is_zero()) else {
            return Ok((left, false));
        };
        // Whole resolutions, rounded up, in charges of at most `u32::MAX` tokens; beyond
        // `MAX_BAN_TOKENS` the bucket saturates and a charge would change nothing.
        let mut tokens = more.as_nanos().div_ceil(RESOLUTION_NS).min(MAX_BAN_TOKENS);
        let mut ends = end;
        while tokens > 0 {
            let n = u32::try_from(tokens).unwrap_or(u32::MAX);
            match self.inner.bans.charge(key, n) {
                Ok(charged) => {
                    tokens -= u128::from(n);
                    let moved = ban_end(&charged) > ends;
                    ends = ban_end(&charged);
                    // Saturated: the charges left would change nothing (up to ~2,000 of them,
                    // under the lock, for a failure of a key banned for `Duration::MAX`).
                    if !moved {
                        break;
                    }
                }
                // Only `TooManyKeys` (a charge is never rejected): a new key at the cap. It
                // can only fail the first charge, which records nothing: the key holds a cell
                // from then on, banned and so never idle.
                Err(_) => return Err(self.full()),
            }
        }
        // Lengthened only if the end moved: a ban already at the bucket's saturation (a ban
        // of `Duration::MAX`, say) takes charges that change nothing, and is not lengthened.
        Ok((self.left(key).unwrap_or(Duration::ZERO), ends > end))
    }
}

/// When the bans' bucket that answered `admission` is full again, in nanoseconds of the
/// clock: the end of the key's ban (`tat`), or the time of the call if it is not banned.
fn ban_end(admission: &crate::Admission) -> u64 {
    admission
        .at_nanos()
        .saturating_add(admission.reset_after_nanos())
}

/// Whether a failure starts a ban: it was counted (`Some` of its count in the window; `None`
/// once the window's count is saturated) as an `after`-th.
fn starts_ban(counted: Option<u32>, after: u32) -> bool {
    counted.is_some_and(|n| n % after == 0)
}

#[cfg(test)]
mod tests {
    use super::starts_ban;

    /// The `u32::MAX`-th failure of a window is counted (the next ones are not), so it starts a
    /// ban when `after` divides it: with `after = u32::MAX` it is the only one that can.
    #[test]
    fn the_last_counted_failure_of_a_window_can_start_a_ban() {
        assert!(starts_ban(Some(u32::MAX), u32::MAX));
        assert!(starts_ban(Some(u32::MAX), 3)); // 3 divides 2^32 - 1
        assert!(!starts_ban(Some(u32::MAX), 2));
        assert!(!starts_ban(None, 1), "uncounted failures start no ban");
        assert!(starts_ban(Some(4), 2));
        assert!(!starts_ban(Some(5), 2));
    }
}
