//! Time sources. A limiter reads exactly one [`Clock`], as `u64` nanoseconds since that clock's epoch.
//!
//! | clock | cost of `now()` here | resolution | monotonic across threads |
//! |---|---|---|---|
//! | [`UpkeepClock`] (the default) | ~0.7 ns (one atomic load) while its thread ticks; `Instant`'s when the clock is rarely read | its tick, 1 ms by default, while ticking | yes: every write keeps the larger reading of one atomic |
//! | [`MonotonicClock`] | ~27 ns (`Instant::now`, a vDSO call) | 1 ns (the OS clock) | yes: `CLOCK_MONOTONIC` |
//! | [`ManualClock`] | ~0.5 ns | whatever you advance it by | yes: it only moves forward |
//!
//! Costs were measured on this project's 2-core CI machine (AMD EPYC, `tsc` clocksource); see
//! BENCHMARKS.md for the run and the command. quanta's TSC clock (~10 ns here, governor's default) was
//! measured too but is not offered: TSC reads are not guaranteed monotonic across cores, and the
//! algorithms rely on monotonic time (see the [`Clock`] contract).

use crate::error::ConfigError;
use crate::sync::{Arc, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic time source: nanoseconds since an epoch fixed when the clock was made.
///
/// # Contract
///
/// `now` must never go backwards along happens-before: if one read happens before another (in the
/// same thread, or in two threads that synchronise through a limiter's state), the second returns a
/// value at least as large. The limiters depend on it: each reads the clock *after* loading its state
/// (with `Acquire`), so the times it assigns are non-decreasing in the order its admissions take
/// effect. A clock that jumps backwards across threads could let a fixed window reset early.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_micros(3));
/// assert_eq!(clock.now(), 3_000);
/// ```
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's epoch.
    ///
    /// # Examples
    ///
    /// A clock of your own, here one that reads a counter your runtime advances:
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use turnstile::Clock;
    ///
    /// #[derive(Clone, Default)]
    /// struct Ticks(Arc<AtomicU64>);
    /// impl Clock for Ticks {
    ///     fn now(&self) -> u64 {
    ///         // Relaxed suffices: reads of one atomic never go back along happens-before
    ///         // (coherence), which is all the contract asks, as long as it only moves forward.
    ///         self.0.load(Ordering::Relaxed)
    ///     }
    /// }
    /// let clock = Ticks::default();
    /// clock.0.fetch_add(1_000, Ordering::Relaxed);
    /// assert_eq!(clock.now(), 1_000);
    /// ```
    fn now(&self) -> u64;

    /// Brings a cached reading up to date, for a caller about to act on a deadline it has just
    /// slept until (a waiting head retrying when its slot frees). Clocks that read the time source
    /// on every `now` need nothing; the default does nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Clock, UpkeepClock};
    ///
    /// let clock = UpkeepClock::new();
    /// let before = clock.now();
    /// std::thread::sleep(std::time::Duration::from_micros(300));
    /// clock.catch_up();
    /// assert!(clock.now() >= before + 300_000);
    /// ```
    fn catch_up(&self) {}
}

/// Converts a duration to whole nanoseconds, or names the parameter that does not fit in `u64`.
pub(crate) fn nanos(d: Duration, what: &'static str) -> Result<u64, ConfigError> {
    u64::try_from(d.as_nanos()).map_err(|_| ConfigError::TooLarge {
        what,
        max: "u64::MAX nanoseconds (about 584 years)",
    })
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The clock limiters use unless told otherwise: [`UpkeepClock`] at its default 1 ms tick.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, DefaultClock, RateLimiter};
///
/// // `RateLimiter::new` is `RateLimiter::with_clock(algorithm, DefaultClock::new())`.
/// let limiter: RateLimiter<DefaultClock> =
///     RateLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) })?;
/// assert!(limiter.try_acquire().is_ok());
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
pub type DefaultClock = UpkeepClock;

/// `std::time::Instant`: nanosecond resolution, about 27 ns per read on the CI machine.
///
/// Choose it when sub-millisecond precision matters more than the cost of a clock read.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, MonotonicClock, RateLimiter};
///
/// let limiter = RateLimiter::with_clock(
///     Algorithm::SlidingWindow { limit: 100, window: Duration::from_millis(10) },
///     MonotonicClock::new(),
/// )?;
/// assert!(limiter.try_acquire().is_ok());
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    epoch: Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Clock, MonotonicClock};
    ///
    /// let clock = MonotonicClock::new();
    /// let (a, b) = (clock.now(), clock.now());
    /// assert!(b >= a);
    /// ```
    pub fn new() -> Self {
        MonotonicClock {
            epoch: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        saturating_nanos(self.epoch.elapsed())
    }
}

/// A clock that one background thread keeps up to date while it is read; reading it is one atomic
/// load.
///
/// The thread ("turnstile-clock") stores `Instant::elapsed()` into an atomic every tick (1 ms by
/// default) and exits by itself once every `UpkeepClock` sharing it has been dropped. All clocks made
/// with [`UpkeepClock::new`] share one thread and one epoch; [`UpkeepClock::with_interval`] makes a
/// private one.
///
/// - **Resolution:** the tick. Readings lag real time by at most one tick plus the thread's
///   scheduling delay; a stalled thread makes time stand still. A limit holds in the clock's
///   time, and so in real time only to within the lag: while time stands still limiters are
///   stricter, but an admission stamped with a lagging reading ends its window (or refills its
///   bucket) that much earlier in real time. A sliding window of 1 per 50 ms whose reading lagged
///   60 ms admitted a call, and another 45 µs later once the reading caught up. Choose
///   [`MonotonicClock`] where a limit must hold in real time whatever the scheduler does.
/// - **Idle, it costs nothing:** after two ticks in a row with no read the thread parks until it
///   is needed. Meanwhile each read takes `Instant` itself (so it is exact, at `Instant`'s cost),
///   and a read that comes within an eighth of a tick of the reading before it wakes the thread.
///   So a ticking clock read at least every other tick keeps ticking, a burst of reads wakes a
///   parked one, reads far apart leave it parked, and a clock not read costs no CPU. A thread
///   woken 1,000 times a second is not free: on the CI machine (a VM) it took 4–5% of a core
///   with nothing else running and 2% beside busy cores (BENCHMARKS.md, "The upkeep thread's
///   own CPU").
/// - **Monotonic:** every write raises one atomic to an `Instant` reading (a compare-and-swap
///   that keeps the larger), and atomic reads of a single location never go backwards along
///   happens-before (coherence).
/// - **Catching up:** [`Clock::catch_up`] reads `Instant` once and raises the shared value to it, so
///   a waiter that slept until its slot frees does not find the clock a tick behind.
/// - **Cost:** ~0.7 ns per read while the thread ticks, against ~27 ns for `Instant::now` and
///   ~10 ns for a TSC read on the CI machine.
///
/// If the thread cannot be spawned, the clock falls back to reading `Instant` on every call.
///
/// # Examples
///
/// ```
/// use turnstile::{Clock, UpkeepClock};
///
/// let clock = UpkeepClock::new();
/// let a = clock.now();
/// std::thread::sleep(std::time::Duration::from_millis(5));
/// // The ticking thread may not have run yet (it sleeps while nobody reads, and a loaded
/// // machine may not schedule it): a reader that slept brings the clock up to date itself.
/// clock.catch_up();
/// assert!(clock.now() >= a + 5_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct UpkeepClock {
    ticker: std::sync::Arc<Ticker>,
}

#[derive(Debug)]
struct Ticker {
    upkeep: Upkeep,
    epoch: Instant,
    interval: Duration,
    /// An eighth of `interval`, in nanoseconds: how close two readings taken while the thread
    /// sleeps must be for the second to wake it.
    wake_within: u64,
    /// Set when no thread could be spawned: read `Instant` instead.
    direct: bool,
    /// The upkeep thread, set by the thread itself before its first tick: woken by the read that
    /// ends its sleep, and when the last clock goes, so that it exits now rather than a tick
    /// later (a tick may be long).
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Ticker {
    fn reading(&self) -> u64 {
        saturating_nanos(self.epoch.elapsed())
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        // The last clock is gone: wake the thread, which then finds no ticker and exits.
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

/// The state bits of `Upkeep::word`: the thread ticks; someone read the clock since its last
/// tick.
const READ: u64 = 0;
/// State: the thread ticks; nobody read the clock since its last tick.
const QUIET: u64 = 1;
/// State: the thread is parked; readers read the OS clock themselves.
const ASLEEP: u64 = 2;
/// The low bits of `Upkeep::word` that hold the state; the reading is above them.
const STATE: u64 = 0b11;
/// The largest reading the word holds: 2^62 ns, about 146 years after the clock's epoch.
const MAX_READING: u64 = u64::MAX >> 2;
/// Ticks in a row with no read after which the thread parks.
const QUIET_TICKS: u32 = 2;

/// What an upkeep thread and the readers of its clock share: the reading, and whether the thread
/// is ticking, in one word so that a read is one load. The thread ticks only while the clock is
/// read, so that an idle process holding a limiter is not woken 1,000 times a second.
///
/// `word` = reading (nanoseconds since the epoch) `<< 2` | state. The reading only grows (every
/// write is a compare-and-swap that keeps the larger of the old and the new reading), so values
/// read from it are monotone along happens-before (coherence of one location). The state:
///
/// | state | the thread | a reader |
/// |---|---|---|
/// | `READ` | at its tick, publishes a reading and moves to `QUIET` | returns the reading |
/// | `QUIET` | at its tick, publishes a reading; the `QUIET_TICKS`th in a row moves to `ASLEEP` (`Release`), then it parks | moves to `READ`, returns the reading |
/// | `ASLEEP` | parked; when unparked, parks again unless the state left `ASLEEP` | reads the OS clock and raises the reading to it; if the reading before was less than `wake_within` earlier, moves to `READ` in the same swap (`Acquire`) and unparks the thread |
///
/// Only the thread moves `READ → QUIET → ASLEEP`; readers move `QUIET → READ` and
/// `ASLEEP → READ`. Every move is a compare-and-swap from the word its maker saw, so a thread
/// going to sleep and a reader marking its read cannot both win. Whatever the race, a reader's
/// value is a reading some thread published or took itself, never later than real time; the
/// worst a lost race can do is leave the value a tick stale, a lag the clock's resolution
/// allows anyway (see [`UpkeepClock`]). The loom model is `loom-tests/loom_upkeep.rs`.
#[derive(Debug)]
#[doc(hidden)]
// Public only for the loom model, which reaches it through a re-export under `turnstile_loom`.
#[cfg_attr(not(turnstile_loom), allow(unreachable_pub))]
pub struct Upkeep {
    word: AtomicU64,
}

/// `word`'s reading.
fn reading_of(word: u64) -> u64 {
    word >> 2
}

/// The word with `reading` raised to at least `to`, and `state`.
fn raised(word: u64, to: u64, state: u64) -> u64 {
    reading_of(word).max(to.min(MAX_READING)) << 2 | state
}

#[cfg_attr(not(turnstile_loom), allow(unreachable_pub))]
impl Upkeep {
    /// A ticking, unread clock at 0.
    #[doc(hidden)]
    pub fn new() -> Self {
        Upkeep {
            word: AtomicU64::new(QUIET),
        }
    }

    /// A reader's `now`: the published reading while the thread ticks; while it sleeps, `fresh()`
    /// (the OS clock), published, and `wake()` called when this read came within `wake_within`
    /// of the one before it (the clock is being read often enough to be worth ticking for).
    #[inline]
    #[doc(hidden)]
    pub fn read(&self, wake_within: u64, fresh: impl FnOnce() -> u64, wake: impl FnOnce()) -> u64 {
        // SeqCst: the reading is the whole message (coherence keeps it monotone), but a
        // reconfiguration's argument (`Params::changed` in src/sync.rs) places clock reads in
        // the single order of SeqCst operations. On x86 the same plain load as Relaxed.
        let word = self.word.load(Ordering::SeqCst);
        if word & STATE == READ {
            return reading_of(word);
        }
        self.read_slow(word, wake_within, fresh, wake)
    }

    #[cold]
    fn read_slow(
        &self,
        mut word: u64,
        wake_within: u64,
        fresh: impl FnOnce() -> u64,
        wake: impl FnOnce(),
    ) -> u64 {
        // Ticking: mark the read so that the thread keeps ticking.
        while word & STATE != ASLEEP {
            if word & STATE == READ {
                return reading_of(word);
            }
            // Relaxed: the move only tells the thread that someone read.
            match self.word.compare_exchange_weak(
                word,
                word & !STATE | READ,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return reading_of(word),
                Err(now) => word = now,
            }
        }
        // Asleep: the reading is ours to take, and to publish, so that a read that happens after
        // this one (through a limiter's state) never sees an earlier time.
        let now = fresh();
        loop {
            let before = reading_of(word);
            let state = word & STATE;
            let wakes = state == ASLEEP && now.saturating_sub(before) < wake_within;
            let new = raised(word, now, if wakes { READ } else { state });
            // Acquire: pairs with the thread's Release move to `ASLEEP`, so that the handle it
            // stored before (in `wake`) is visible here.
            match self
                .word
                .compare_exchange_weak(word, new, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    if wakes {
                        wake();
                    }
                    return reading_of(new);
                }
                Err(current) => word = current,
            }
        }
    }

    /// The thread's tick: publishes `reading`, and says whether to park now (`quiet` counts the
    /// ticks in a row with no read).
    #[doc(hidden)]
    pub fn tick(&self, reading: u64, quiet: &mut u32) -> bool {
        // Relaxed: the current word is only the base of the swap below.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let (state, parks) = match word & STATE {
                READ => (QUIET, false),
                QUIET if quiet.saturating_add(1) >= QUIET_TICKS => (ASLEEP, true),
                other => (other, false),
            };
            // Release: what the thread did before (storing its handle) is seen by the reader
            // that wakes it (its Acquire move out of `ASLEEP`).
            match self.word.compare_exchange_weak(
                word,
                raised(word, reading, state),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    *quiet = if word & STATE == READ {
                        0
                    } else {
                        quiet.saturating_add(1)
                    };
                    return parks;
                }
                Err(current) => word = current,
            }
        }
    }

    /// Whether a parked thread was woken by a reader (else the unpark was spurious, or the last
    /// clock's drop). The unpark that woke it synchronises with its park, so the move out of
    /// `ASLEEP` made before it is seen here.
    #[doc(hidden)]
    pub fn woken(&self) -> bool {
        // Relaxed: ordered by unpark/park (see above).
        self.word.load(Ordering::Relaxed) & STATE != ASLEEP
    }

    /// Raises the reading to `reading` (a caller's own, fresh from the OS clock).
    #[doc(hidden)]
    pub fn catch_up(&self, reading: u64) {
        // Relaxed: the reading is the whole message.
        let mut word = self.word.load(Ordering::Relaxed);
        while reading_of(word) < reading.min(MAX_READING) {
            // Relaxed: as above.
            match self.word.compare_exchange_weak(
                word,
                raised(word, reading, word & STATE),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(current) => word = current,
            }
        }
    }
}

impl Default for Upkeep {
    fn default() -> Self {
        Self::new()
    }
}

/// The upkeep thread's body: every `interval` while the clock is read, raises `weak`'s reading
/// to `Instant`; parked while it is not; until the last clock using it has been dropped.
fn upkeep(weak: std::sync::Weak<Ticker>, interval: Duration) {
    match weak.upgrade() {
        // Before any tick, so before any move to `ASLEEP` (see `Upkeep::tick`).
        Some(ticker) => drop(ticker.thread.set(std::thread::current())),
        None => return,
    }
    let mut quiet = 0;
    loop {
        // Parked rather than asleep so that the last clock's drop can wake it; an early wake-up
        // only writes one more reading.
        std::thread::park_timeout(interval);
        let Some(ticker) = weak.upgrade() else { return };
        if !ticker.upkeep.tick(ticker.reading(), &mut quiet) {
            continue;
        }
        // Nobody reads the clock: sleep until a reader wakes us, holding no strong reference
        // (so that the last clock's drop ends the thread).
        drop(ticker);
        loop {
            std::thread::park();
            let Some(ticker) = weak.upgrade() else { return };
            if ticker.upkeep.woken() {
                ticker.upkeep.catch_up(ticker.reading());
                break;
            }
        }
        quiet = 0;
    }
}

static SHARED_TICKER: std::sync::Mutex<std::sync::Weak<Ticker>> =
    std::sync::Mutex::new(std::sync::Weak::new());

impl UpkeepClock {
    /// The default tick: 1 ms.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(1);

    /// The process-wide clock with a 1 ms tick, starting its thread if none is running.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Clock, UpkeepClock};
    ///
    /// let clock = UpkeepClock::new();
    /// let earlier = clock.now();
    /// std::thread::sleep(std::time::Duration::from_millis(5));
    /// clock.catch_up(); // what a limiter does before it reports a rejection
    /// assert!(clock.now() >= earlier + 5_000_000);
    /// ```
    pub fn new() -> Self {
        let mut shared = SHARED_TICKER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ticker) = shared.upgrade() {
            return UpkeepClock { ticker };
        }
        let ticker = Self::start(Self::DEFAULT_INTERVAL);
        *shared = std::sync::Arc::downgrade(&ticker);
        UpkeepClock { ticker }
    }

    /// A private clock with its own thread and the given tick.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if `interval` is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::UpkeepClock;
    ///
    /// let fine = UpkeepClock::with_interval(Duration::from_micros(200))?;
    /// assert_eq!(fine.interval(), Duration::from_micros(200));
    /// assert!(UpkeepClock::with_interval(Duration::ZERO).is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn with_interval(interval: Duration) -> Result<Self, ConfigError> {
        if interval.is_zero() {
            return Err(ConfigError::Zero {
                what: "upkeep interval",
            });
        }
        Ok(UpkeepClock {
            ticker: Self::start(interval),
        })
    }

    fn start(interval: Duration) -> std::sync::Arc<Ticker> {
        let ticker = |direct| Ticker {
            upkeep: Upkeep::new(),
            epoch: Instant::now(),
            interval,
            wake_within: saturating_nanos(interval) / 8,
            direct,
            thread: std::sync::OnceLock::new(),
        };
        // Under loom the clock reads `Instant` (no thread: model atomics cannot be touched from
        // outside the model); the protocol itself is modelled in `loom-tests/loom_upkeep.rs`.
        if cfg!(turnstile_loom) {
            return std::sync::Arc::new(ticker(true));
        }
        let live = std::sync::Arc::new(ticker(false));
        let weak = std::sync::Arc::downgrade(&live);
        let spawned = std::thread::Builder::new()
            .name("turnstile-clock".into())
            .spawn(move || upkeep(weak, interval));
        match spawned {
            Ok(_) => live,
            Err(_) => std::sync::Arc::new(ticker(true)),
        }
    }

    /// The tick this clock advances by; zero if it fell back to reading `Instant` directly.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::UpkeepClock;
    ///
    /// let clock = UpkeepClock::with_interval(Duration::from_millis(2))?;
    /// // Zero only where the thread could not be started.
    /// assert!([Duration::from_millis(2), Duration::ZERO].contains(&clock.interval()));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn interval(&self) -> Duration {
        if self.ticker.direct {
            Duration::ZERO
        } else {
            self.ticker.interval
        }
    }
}

impl Default for UpkeepClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for UpkeepClock {
    #[inline]
    fn now(&self) -> u64 {
        let ticker = &*self.ticker;
        if ticker.direct {
            return ticker.reading();
        }
        ticker.upkeep.read(
            ticker.wake_within,
            || ticker.reading(),
            || {
                if let Some(thread) = ticker.thread.get() {
                    thread.unpark();
                }
            },
        )
    }

    fn catch_up(&self) {
        if !self.ticker.direct {
            self.ticker.upkeep.catch_up(self.ticker.reading());
        }
    }
}

/// A clock that only moves when told to: for tests and simulations. Clones share one time.
///
/// For decisions (`try_acquire`, `check`, refunds), not for waits: a waiting head (`acquire`,
/// `acquire_blocking`) sleeps on a real timer (tokio's, futures-timer's, or its thread's) for
/// the wait the limiter reported, and advancing this clock does not wake it, so it wakes a real
/// wait later (a window's length, say) and then finds the time wherever the test left it. Drive
/// waits with `TokioClock` (feature `tokio`) under tokio's paused time instead.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
///     clock.clone(),
/// )?;
/// assert!(limiter.try_acquire().is_ok());
/// assert!(limiter.try_acquire().is_err());
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.try_acquire().is_ok());
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Clock, ManualClock};
    ///
    /// assert_eq!(ManualClock::new().now(), 0);
    /// ```
    pub fn new() -> Self {
        ManualClock {
            nanos: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Moves time forward by `d` (saturating at `u64::MAX` nanoseconds).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let other = clock.clone(); // clones share the time
    /// clock.advance(Duration::from_millis(1500));
    /// assert_eq!(other.now(), 1_500_000_000);
    /// clock.advance(Duration::MAX);
    /// assert_eq!(other.now(), u64::MAX);
    /// ```
    pub fn advance(&self, d: Duration) {
        let step = saturating_nanos(d);
        // Relaxed: a clock value carries no other data; coherence keeps reads monotonic. A CAS loop
        // rather than fetch_add so that time saturates instead of wrapping.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(step))
            });
    }

    /// Moves time forward to `t` since the epoch; never backwards (an earlier `t` is ignored).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::ManualClock;
    ///
    /// let clock = ManualClock::new();
    /// clock.set(Duration::from_secs(10));
    /// clock.set(Duration::from_secs(3)); // ignored: time never goes back
    /// assert_eq!(clock.elapsed(), Duration::from_secs(10));
    /// ```
    pub fn set(&self, t: Duration) {
        // Relaxed: as in `advance`; fetch_max keeps the clock monotonic.
        self.nanos.fetch_max(saturating_nanos(t), Ordering::Relaxed);
    }

    /// The current time as a `Duration` since the epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::ManualClock;
    ///
    /// let clock = ManualClock::new();
    /// clock.advance(Duration::from_micros(250));
    /// assert_eq!(clock.elapsed(), Duration::from_micros(250));
    /// ```
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now())
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        // SeqCst: a reconfiguration's argument (`Params::changed` in src/sync.rs) places clock
        // reads in the single order of SeqCst operations. Otherwise Relaxed would do: see
        // `advance`.
        self.nanos.load(Ordering::SeqCst)
    }
}

/// tokio's clock (`tokio::time::Instant`): follows tokio's paused and auto-advanced time in tests.
///
/// Give a limiter this clock when its `acquire().await` runs under `#[tokio::test(start_paused =
/// true)]` or `tokio::time::pause()`: waiting heads sleep on tokio's timer, and with this clock the
/// limiter reads the same time the timer advances. Outside paused time it reads `Instant::now`, at
/// about the cost of [`MonotonicClock`] (plus the high-water mark below). Must be created inside
/// a tokio runtime when time is paused (its epoch is tokio's "now"). It is for limiters waited on
/// inside tokio: off tokio, waiters sleep on futures-timer's thread, which knows nothing of
/// paused time, so use the default clock.
///
/// - **Resolution:** 1 ns (the OS clock); paused time moves in the steps tokio takes.
/// - **Monotonic:** yes, as the [`Clock`] contract requires, even read in several runtimes.
///   tokio's "now" is the runtime's own: one whose time is paused, and advanced by an hour, is an
///   hour ahead of real time and of another runtime's. So the clock (and its clones) never
///   returns less than the latest reading it returned: read after that runtime is gone, it stands
///   still until the time it reads catches up. (Without it, a limiter kept from one paused test
///   runtime into another, or out of it, saw its time go back by the hour, and a fixed window
///   admitted its limit a second time.) That high-water mark is one shared atomic: a read that
///   finds the time moved on raises it, which costs a contended write where readers on many
///   cores share a clock in real time.
///
/// **What paused time reads after a wait.** A waiting head sleeps on tokio's timer for exactly
/// the wait its algorithm reports, but tokio's timer counts whole milliseconds (from the
/// runtime's start) and rounds a sleep's deadline up to the next one; paused time then jumps, in
/// whole milliseconds, from the millisecond it is in to that one. So a head whose wait is not a
/// whole number of milliseconds is admitted, and reads this clock, later than its deadline: a
/// wait of 1.0005 s from 0 ends at 1.001 s, and one from 0.4 ms (after an `advance` by a part of
/// a millisecond) ends at 1.0014 s, the part carried along. Waits and `advance`s in whole
/// milliseconds land exactly. This is tokio's timer, not the limiter, which asked for 1.0005 s
/// either way; the admission's [`at`](crate::Admission::at) is the time it really happened.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Clock, TokioClock};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let clock = TokioClock::new();
/// tokio::time::sleep(Duration::from_secs(3)).await; // paused time: returns at once
/// assert_eq!(clock.now(), 3_000_000_000);
/// # }
/// ```
#[cfg(feature = "tokio")]
#[derive(Debug, Clone)]
pub struct TokioClock {
    epoch: tokio::time::Instant,
    /// The latest reading returned (shared by clones): tokio's "now" depends on the runtime it
    /// is read in, and one runtime's paused time may be far ahead of another's, or of real time.
    latest: Arc<AtomicU64>,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// A clock whose epoch is tokio's now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let clock = TokioClock::new();
    /// assert_eq!(clock.now(), 0);
    /// tokio::time::advance(Duration::from_millis(20)).await;
    /// assert_eq!(clock.now(), 20_000_000);
    /// # }
    /// ```
    pub fn new() -> Self {
        TokioClock {
            epoch: tokio::time::Instant::now(),
            latest: Arc::new(AtomicU64::new(0)),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> u64 {
        let reading = saturating_nanos(self.epoch.elapsed());
        // SeqCst (both): a reconfiguration's argument (`Params::changed` in src/sync.rs) places
        // this crate's atomic clocks' reads in the single order of SeqCst operations. The value
        // is the whole message otherwise: coherence keeps the high-water mark monotone.
        let latest = self.latest.load(Ordering::SeqCst);
        if reading <= latest {
            return latest;
        }
        self.latest
            .fetch_max(reading, Ordering::SeqCst)
            .max(reading)
    }
}

/// The backends' `acquire_n` (Redis, the get/set store): `attempt` until it admits, sleeping
/// ([`crate::timer`]) for each rejection's retry-after plus [`jitter`]; any other failure ends the
/// wait. Waiters do not queue: whoever asks first after the permits free up gets them.
///
/// With a `limit` (their `acquire_timeout`), the wait ends with
/// [`AcquireError::Timeout`](crate::AcquireError::Timeout) once `limit` has passed since the call began, but only
/// between attempts: a sleep is cut short at the time limit, while an attempt in flight then is
/// awaited and answered, admission included. Cutting it instead, as a `tokio::time::timeout`
/// around `acquire_n` does, could leave its permits charged in the store with nobody holding
/// them. A `limit` past what an `Instant` holds never passes.
#[cfg(all(feature = "tokio", any(feature = "redis", feature = "store")))]
pub(crate) async fn retry_rejections<F, Fut>(
    limit: Option<Duration>,
    mut attempt: F,
) -> Result<crate::Admission, crate::AcquireError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<crate::Admission, crate::TryAcquireError>>,
{
    use std::pin::Pin;
    use std::task::Poll;
    // Made before the first attempt, so that its round trip counts in the limit.
    let mut deadline = limit.and_then(crate::timer::Sleep::new_or_never);
    loop {
        let rejection = match attempt().await {
            Ok(admission) => return Ok(admission),
            Err(e) => e.wait_or_fail()?,
        };
        let wait = rejection.retry_after();
        let mut retry = crate::timer::Sleep::new(wait + jitter(wait));
        // The time limit first: when both have passed, the call is over.
        let timed_out = std::future::poll_fn(|cx| {
            if let Some(deadline) = deadline.as_mut()
                && Pin::new(deadline).poll(cx).is_ready()
            {
                return Poll::Ready(true);
            }
            Pin::new(&mut retry).poll(cx).map(|()| false)
        })
        .await;
        if timed_out {
            return Err(crate::AcquireError::Timeout);
        }
    }
}

/// A random extra sleep for the retry loops of the backends' `acquire` (waiters that do not
/// queue, so that many of them do not return at the same instant): up to 1/8 of `retry_after`,
/// at least 0.1 ms and at most 50 ms.
#[cfg(all(feature = "tokio", any(feature = "redis", feature = "store")))]
pub(crate) fn jitter(retry_after: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let max = (retry_after / 8).clamp(Duration::from_micros(100), Duration::from_millis(50));
    let random = RandomState::new().hash_one(Instant::now());
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(random % nanos.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `done` every millisecond for up to ten seconds.
    fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn state(clock: &UpkeepClock) -> u64 {
        clock.ticker.upkeep.word.load(Ordering::Relaxed) & STATE
    }

    fn published(clock: &UpkeepClock) -> u64 {
        reading_of(clock.ticker.upkeep.word.load(Ordering::Relaxed))
    }

    /// Real time is the thing under test here: an unread clock's thread stops ticking, reads
    /// meanwhile are exact, and reads close together start it again.
    #[test]
    fn the_upkeep_thread_sleeps_while_nobody_reads_and_wakes_for_frequent_reads() {
        let clock = UpkeepClock::with_interval(Duration::from_millis(1)).unwrap();
        if clock.interval().is_zero() {
            panic!("no upkeep thread could be started");
        }
        eventually("the unread clock's thread parks", || {
            state(&clock) == ASLEEP
        });
        // Parked: nothing is published while nobody reads.
        let parked_at = published(&clock);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(published(&clock), parked_at, "a sleeping thread ticked");
        // A read now takes the OS clock itself: exact, not a tick behind.
        let before = clock.ticker.reading();
        let first = clock.now();
        assert!(
            first >= before,
            "a read while asleep is stale: {first} < {before}"
        );
        assert!(first >= parked_at + 30_000_000);
        // One read, long after the one before: not worth waking the thread for.
        assert_eq!(state(&clock), ASLEEP);
        // A second read right after the first wakes it, and it ticks again. (Retried: on a
        // loaded machine this thread can be descheduled between two reads for longer than
        // "close together", and then the pair is rightly not worth waking for.)
        let mut second = clock.now();
        assert!(second >= first);
        eventually("two reads in a row wake it", || {
            let a = clock.now();
            second = clock.now();
            assert!(second >= a, "the clock went back: {second} < {a}");
            state(&clock) != ASLEEP
        });
        eventually("the woken thread ticks", || published(&clock) > second);
        // Then, unread, it parks again.
        eventually("the thread parks again", || state(&clock) == ASLEEP);
        // And a clock read all the time keeps it ticking: its readings keep moving, never back.
        // (Until it has moved 10 times, within 10 s rather than a fixed 30 ms: on a loaded
        // machine the ticking thread, or this one, may wait for a core.)
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = clock.now();
        let mut moves = 0;
        while moves < 10 {
            assert!(
                Instant::now() < deadline,
                "10 s of reads saw the clock move {moves} times"
            );
            let now = clock.now();
            assert!(now >= last, "the clock went back: {now} < {last}");
            moves += u32::from(now > last);
            last = now;
        }
        // Read an instant ago and all the time before: not asleep.
        let _ = clock.now();
        assert_ne!(
            state(&clock),
            ASLEEP,
            "a clock read all the time stopped ticking"
        );
    }

    /// However long the tick, the upkeep thread exits soon after the last clock using it is
    /// dropped, instead of sleeping out the tick.
    #[test]
    fn the_upkeep_thread_exits_when_its_last_clock_goes_even_with_a_long_tick() {
        let hour = Duration::from_secs(3600);
        let ticker = std::sync::Arc::new(Ticker {
            upkeep: Upkeep::new(),
            epoch: Instant::now(),
            interval: hour,
            wake_within: saturating_nanos(hour) / 8,
            direct: false,
            thread: std::sync::OnceLock::new(),
        });
        let weak = std::sync::Arc::downgrade(&ticker);
        let handle = std::thread::spawn(move || upkeep(weak, hour));
        // The thread stores its own handle before its first tick.
        while ticker.thread.get().is_none() {
            std::thread::yield_now();
        }
        let clock = UpkeepClock { ticker };
        let copy = clock.clone();
        drop(clock);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!handle.is_finished(), "a clock is still using it");
        drop(copy);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !handle.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the thread outlives its last clock"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // The thread hands the ticker its handle, so that the drop above is what a real clock does.
        let private = UpkeepClock::with_interval(hour).unwrap();
        assert!(
            !private.interval().is_zero(),
            "no upkeep thread could be started"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while private.ticker.thread.get().is_none() {
            assert!(
                Instant::now() < deadline,
                "the thread never stored its handle"
            );
            std::thread::yield_now();
        }
    }
}
