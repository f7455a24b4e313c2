//! Time sources. A limiter reads exactly one [`Clock`], as `u64` nanoseconds since that clock's epoch.
//!
//! | clock | cost of `now()` here | resolution | monotonic across threads |
//! |---|---|---|---|
//! | [`UpkeepClock`] (the default) | ~0.5 ns (one atomic load) | its tick, 1 ms by default | yes: one writer, read through one atomic |
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

/// A clock that one background thread keeps up to date; reading it is a single atomic load.
///
/// The thread ("turnstile-clock") stores `Instant::elapsed()` into an atomic every tick (1 ms by
/// default) and exits by itself once every `UpkeepClock` sharing it has been dropped. All clocks made
/// with [`UpkeepClock::new`] share one thread and one epoch; [`UpkeepClock::with_interval`] makes a
/// private one.
///
/// - **Resolution:** the tick. Readings lag real time by at most one tick plus the thread's
///   scheduling delay; a stalled thread makes time stand still, which only makes limiters stricter.
/// - **Monotonic:** every write is a `fetch_max` of an `Instant` reading into one atomic, and atomic
///   reads of a single location never go backwards along happens-before (coherence).
/// - **Catching up:** [`Clock::catch_up`] reads `Instant` once and raises the shared value to it, so
///   a waiter that slept until its slot frees does not find the clock a tick behind.
/// - **Cost:** ~0.5 ns per read, against ~27 ns for `Instant::now` and ~10 ns for a TSC read on the
///   CI machine; about 1,000 wake-ups per second for the thread.
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
/// assert!(clock.now() > a);
/// ```
#[derive(Debug, Clone)]
pub struct UpkeepClock {
    ticker: std::sync::Arc<Ticker>,
}

#[derive(Debug)]
struct Ticker {
    // The upkeep thread is never run under loom, so this one cell uses std's atomic directly.
    nanos: std::sync::atomic::AtomicU64,
    epoch: Instant,
    interval: Duration,
    /// Set when no thread could be spawned: read `Instant` instead.
    direct: bool,
    /// The upkeep thread, woken when the last clock goes so that it exits now rather than a tick
    /// later (a tick may be long).
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        // The last clock is gone: wake the thread, which then finds no ticker and exits.
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

/// The upkeep thread's body: every `interval`, raises `weak`'s reading to `Instant`, until the
/// last clock using it has been dropped.
fn upkeep(weak: std::sync::Weak<Ticker>, interval: Duration) {
    loop {
        // Parked rather than asleep so that the last clock's drop can wake it; an early wake-up
        // only writes one more reading.
        std::thread::park_timeout(interval);
        let Some(ticker) = weak.upgrade() else { return };
        // Relaxed: the value is the whole message. fetch_max rather than a store because
        // `catch_up` writes too: a max of non-decreasing readings keeps the clock monotonic
        // (read coherence on one location), where a late store could move it back.
        ticker
            .nanos
            .fetch_max(saturating_nanos(ticker.epoch.elapsed()), Ordering::Relaxed);
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
        let epoch = Instant::now();
        let live = std::sync::Arc::new(Ticker {
            nanos: std::sync::atomic::AtomicU64::new(0),
            epoch,
            interval,
            direct: false,
            thread: std::sync::OnceLock::new(),
        });
        let weak = std::sync::Arc::downgrade(&live);
        let spawned = std::thread::Builder::new()
            .name("turnstile-clock".into())
            .spawn(move || upkeep(weak, interval));
        match spawned {
            Ok(handle) => {
                let _ = live.thread.set(handle.thread().clone());
                live
            }
            Err(_) => std::sync::Arc::new(Ticker {
                nanos: std::sync::atomic::AtomicU64::new(0),
                epoch,
                interval,
                direct: true,
                thread: std::sync::OnceLock::new(),
            }),
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
        if self.ticker.direct {
            return saturating_nanos(self.ticker.epoch.elapsed());
        }
        // Relaxed: see the write in the upkeep thread.
        self.ticker.nanos.load(Ordering::Relaxed)
    }

    fn catch_up(&self) {
        if !self.ticker.direct {
            // Relaxed: as in the upkeep thread.
            self.ticker.nanos.fetch_max(
                saturating_nanos(self.ticker.epoch.elapsed()),
                Ordering::Relaxed,
            );
        }
    }
}

/// A clock that only moves when told to: for tests and simulations. Clones share one time.
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
        // Relaxed: see `advance`.
        self.nanos.load(Ordering::Relaxed)
    }
}

/// tokio's clock (`tokio::time::Instant`): follows tokio's paused and auto-advanced time in tests.
///
/// Give a limiter this clock when its `acquire().await` runs under `#[tokio::test(start_paused =
/// true)]` or `tokio::time::pause()`: waiting heads sleep on tokio's timer, and with this clock the
/// limiter reads the same time the timer advances. Outside paused time it reads `Instant::now`, at
/// the same cost as [`MonotonicClock`]. Must be created inside a tokio runtime when time is paused
/// (its epoch is tokio's "now").
///
/// - **Resolution:** 1 ns (the OS clock); paused time moves in the steps tokio takes.
/// - **Monotonic:** yes (tokio's `Instant` never goes back).
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
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch: tokio::time::Instant,
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
        saturating_nanos(self.epoch.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However long the tick, the upkeep thread exits soon after the last clock using it is
    /// dropped, instead of sleeping out the tick.
    #[test]
    fn the_upkeep_thread_exits_when_its_last_clock_goes_even_with_a_long_tick() {
        let hour = Duration::from_secs(3600);
        let ticker = std::sync::Arc::new(Ticker {
            nanos: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
            interval: hour,
            direct: false,
            thread: std::sync::OnceLock::new(),
        });
        let weak = std::sync::Arc::downgrade(&ticker);
        let handle = std::thread::spawn(move || upkeep(weak, hour));
        ticker.thread.set(handle.thread().clone()).unwrap();
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
        // `start` hands the ticker its thread, so that the drop above is what a real clock does.
        let private = UpkeepClock::with_interval(hour).unwrap();
        assert!(private.interval() == Duration::ZERO || private.ticker.thread.get().is_some());
    }
}
