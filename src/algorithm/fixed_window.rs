//! Fixed window: one atomic word, updated by compare-and-swap.

use super::{Algo, Charge, EachCell, Grid, RETIRED, not_fresh, pack, too_big, unpack, window_id};
use crate::clock::{Clock, nanos};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering, Params};
use std::time::Duration;

/// At most `limit` permits per window; windows are `[k·window, (k+1)·window)` on the clock's epoch,
/// until a reconfiguration changes the window length and rebases the grid ([`Grid`]).
///
/// State: one word, see [`pack`] for its layout. Transitions (n ≥ 1 permits at time `now` in window
/// `w`):
///
/// | word holds | decision | new word |
/// |---|---|---|
/// | (`w`, c) with c + n ≤ limit | admit | (`w`, c + n) |
/// | (`w`, c) with c + n > limit | reject, retry at the end of `w` | unchanged |
/// | (v ≠ `w`, _) and n ≤ limit | admit (a new window) | (`w`, n) |
///
/// "v ≠ w" always means an *older* window: the word is loaded before the clock is read, and the clock
/// is monotonic, so no thread can see a window id newer than its own `now` under the parameters
/// it decides with. (A word written under newer parameters is caught by the version re-check
/// before the CAS: see [`Algo::reconfigure`] and ARCHITECTURE.md.)
///
/// This struct holds the parameters; the word is the [`Algo::Cell`], kept by the limiter (one per
/// key in a keyed limiter). A word of [`RETIRED`] belongs to a key that eviction removed.
pub(crate) struct FixedWindow {
    /// [`Shape`] as words, replaceable at run time by [`Algo::reconfigure`].
    params: Params<6>,
}

/// The fixed window's parameters: a snapshot of [`FixedWindow::params`].
#[derive(Clone, Copy)]
struct Shape {
    limit: u32,
    grid: Grid,
}

impl Shape {
    fn to_words(self) -> [u64; 6] {
        let [a, b, c, d, e] = self.grid.to_words();
        [u64::from(self.limit), a, b, c, d, e]
    }

    #[inline(always)]
    fn from_words(w: [u64; 6]) -> Self {
        Shape {
            limit: w[0] as u32,
            grid: Grid::from_words([w[1], w[2], w[3], w[4], w[5]]),
        }
    }

    /// Permits used in `word` and free at `now`, the time until `now`'s window ends, and that
    /// window's id. `used` can exceed the limit after a reconfiguration lowered it.
    #[inline(always)]
    fn free(&self, word: u64, now: u64) -> (u32, u32, u64, u32) {
        let (window, elapsed) = self.grid.locate(now);
        let until_reset = self.grid.wait(now, self.grid.len() - elapsed);
        let id = window_id(window);
        let (wid, count) = unpack(word);
        let used = if wid == id { count } else { 0 };
        (used, self.limit.saturating_sub(used), until_reset, id)
    }
}

impl FixedWindow {
    pub(crate) fn new(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        let window = nanos(window, "window")?;
        if window == 0 {
            return Err(ConfigError::Zero { what: "window" });
        }
        let shape = Shape {
            limit,
            grid: Grid::new(window),
        };
        Ok(FixedWindow {
            params: Params::new(shape.to_words()),
        })
    }

    /// The parameters now, and the version they were published under.
    #[inline(always)]
    fn shape(&self) -> (Shape, u64) {
        let (words, version) = self.params.load();
        (Shape::from_words(words), version)
    }
}

impl Algo for FixedWindow {
    type Cell = AtomicU64;

    fn cell(&self) -> AtomicU64 {
        AtomicU64::new(pack(0, 0))
    }

    fn limit(&self) -> u32 {
        self.shape().0.limit
    }

    fn version(&self) -> u64 {
        self.shape().1
    }

    #[inline(always)]
    fn decide<C: Clock, const COMMIT: bool>(
        &self,
        state: &AtomicU64,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        self.run::<C, COMMIT, false>(state, n, clock)
    }

    /// Takes `n` off the count if the word still holds the admission's window, and the clock is
    /// still in it; otherwise the window has ended, the admission no longer weighs on any
    /// decision, and there is nothing to give back.
    ///
    /// **Why it is exact and never looser.** Invariant: the word's count is at least the permits
    /// of the never-refunded admissions in its window (every admission adds its own n, every
    /// refund subtracts only an n that it added, in the window it added it to). The admission
    /// being refunded is still counted when its refund runs, so the count minus n is still at
    /// least the rest; and with the clock unchanged it is exactly the count the window would have
    /// without it. Requiring the clock to be in the admission's window also rules out the 31-bit
    /// id wrap: the word's window lies between the admission's and the clock's (load-then-clock),
    /// so a matching id is that very window.
    ///
    /// **Saturated.** A [charge](Charge) saturates the count at `u32::MAX`, where it stops
    /// holding every admission: a refund then gives nothing back (with a limit above 2^31 the
    /// subtraction handed a charged window's permits out again). A window of limit `u32::MAX`
    /// filled to its last permit by admissions holds the same count, and is given nothing back
    /// either: the two cannot be told apart.
    ///
    /// **Reconfigured since.** The admission carries the parameters' version (its token); if it
    /// is no longer current, nothing is given back (conservative: the grid may have moved).
    fn refund<C: Clock>(&self, state: &AtomicU64, n: u32, admission: &Admission, clock: &C) {
        let (p, version) = self.shape();
        if version as u32 != admission.token() {
            return;
        }
        let window = p.grid.locate(admission.at_nanos()).0;
        let id = window_id(window);
        // Acquire: as in `try_acquire`: our clock read below is no earlier than the last writer's.
        let mut word = state.load(Ordering::Acquire);
        loop {
            let (wid, count) = unpack(word);
            // A count at u32::MAX may be a charge's saturated one, which no longer holds every
            // admission of the window: subtracting from it could leave less than the others.
            // Nothing comes back then (only a charge gets there, and the window stays full).
            if word == RETIRED
                || wid != id
                || count == u32::MAX
                || p.grid.locate(clock.now()).0 != window
            {
                return;
            }
            // Release on success: publishes our clock reading like an admission does. Acquire on
            // failure: as for the first load.
            match state.compare_exchange_weak(
                word,
                not_fresh(pack(id, count.saturating_sub(n))),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    #[cfg(feature = "store")]
    fn save(state: &AtomicU64) -> Vec<u64> {
        vec![state.load(Ordering::Relaxed)]
    }

    #[cfg(feature = "store")]
    fn restore(&self, words: &[u64]) -> Option<AtomicU64> {
        match words {
            [word] if *word != RETIRED => Some(AtomicU64::new(*word)),
            _ => None,
        }
    }

    #[cfg(all(test, not(turnstile_loom)))]
    fn words(state: &AtomicU64) -> Vec<u64> {
        vec![state.load(Ordering::Relaxed)]
    }

    /// A window admits at most the limit. Of `limit + extra` admitted from `now` on, this window
    /// takes at most the limit, and at most `limit − 1` when the limit does not fit at once
    /// (`at_limit > 0`); the rest go a limit per window after it, the last in the window that
    /// starts `(⌈rest / limit⌉ − 1)` windows after the next one.
    fn beyond_limit(&self, now: u64, at_limit: u64, extra: u64) -> u64 {
        let (p, _) = self.shape();
        let (_, elapsed) = p.grid.locate(now);
        let len = p.grid.len();
        let rest = extra.saturating_add(u64::from(at_limit > 0)).max(1);
        let later = rest.div_ceil(u64::from(p.limit.max(1))) - 1;
        p.grid.wait(
            now,
            (len - elapsed).saturating_add(later.saturating_mul(len)),
        )
    }

    fn available(&self, state: &AtomicU64, now: u64) -> u32 {
        // Relaxed: a statistic; no decision depends on it.
        let p = self.shape().0;
        match state.load(Ordering::Relaxed) {
            RETIRED => p.limit,
            word => p.free(word, now).1,
        }
    }

    /// Judged as a decision is: the parameters first, then the word, then the clock, and the
    /// version re-checked before the CAS. Parameters loaded after the clock read could be a
    /// reconfiguration's that read its clock later: a shrunk window's rebased grid places our
    /// earlier reading in the window before the current one, the key's count in the current
    /// window reads as stale, and the key was evicted with the whole limit taken (a fresh cell
    /// then admitted it again in that window).
    fn retire_unless<C: Clock>(
        &self,
        state: &AtomicU64,
        clock: &C,
        waited: impl FnOnce() -> bool,
    ) -> Result<(), u64> {
        let (p, version) = self.shape();
        // Acquire: as in `try_acquire`, so our clock read is no earlier than the last admission's.
        let word = state.load(Ordering::Acquire);
        let now = clock.now();
        if word == RETIRED {
            // Retired by a reset (`retire_now`), which counts it: not ours to count.
            return Err(now);
        }
        if word == pack(0, 0) {
            // Never used: its inserter is about to admit on it (see `Algo::retire`).
            return Err(now);
        }
        let (used, _, until_reset, _) = p.free(word, now);
        if used > 0 {
            // Busy until its window ends.
            return Err(now.saturating_add(until_reset));
        }
        if self.params.changed(version) {
            // Reconfigured since our snapshot: idle under the old grid at `now` says nothing
            // about the new one. Look again (as `try_acquire` decides again).
            return Err(now);
        }
        if waited() {
            // Idle, but its key has waiters queued: not evicted (see `Algo::retire_unless`).
            return Err(now);
        }
        // Release on success: publishes our clock reading to whoever sees RETIRED and re-creates
        // the key, so the fresh word is used at times no earlier than ours. Relaxed on failure: an
        // admission landed; we only report "busy".
        state
            .compare_exchange(word, RETIRED, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| now)
    }

    /// New parameters, published in one step (no cell is written): a new limit applies at once
    /// to the count already in the current window (a count above a lowered limit admits nothing
    /// until the window ends); a new window length rebases the grid ([`Grid::rebase`]): the
    /// current window keeps its id, count and start and takes the new length (or, if it is
    /// already older than that, ends at the earlier of its old end and now + the new length),
    /// so a reconfiguration never hands out a fresh window.
    fn reconfigure<C: Clock>(
        &self,
        to: &Self,
        clock: &C,
        _cells: EachCell<'_, AtomicU64>,
    ) -> Result<(), ConfigError> {
        let from = Shape::from_words(self.params.current());
        let target = Shape::from_words(to.params.current());
        // The old parameters are closed before the clock is read, and the new ones published
        // after: every call that commits under the old ones read its clock before `now`, so its
        // word is of a window the rebased grid reads as it does (`Params::begin`), and every
        // call that loads the new ones reads its clock later, so it never locates a time before
        // `now` on the new grid.
        let writing = self.params.begin();
        let now = clock.now();
        let grid = if target.grid.len() == from.grid.len() {
            from.grid
        } else {
            from.grid.rebase(target.grid.len(), now)
        };
        writing.finish(
            Shape {
                limit: target.limit,
                grid,
            }
            .to_words(),
        );
        Ok(())
    }

    fn retired(state: &AtomicU64) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        state.load(Ordering::Relaxed) == RETIRED
    }
}

/// Adds `n` to the current window's count (a word of an older window starts it at `n`),
/// saturating at `u32::MAX`: the debt never outlives the window, which ends it whatever the count.
impl Charge for FixedWindow {
    /// [`Algo::decide`] (`CHARGE` off) and [`Charge::charge`] (`COMMIT` and `CHARGE` on): one
    /// protocol, where a charge skips the two limit checks and saturates the count.
    #[inline(always)]
    fn run<C: Clock, const COMMIT: bool, const CHARGE: bool>(
        &self,
        state: &AtomicU64,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        'params: loop {
            let (p, version) = self.shape();
            if !CHARGE && n > p.limit {
                return Err(too_big(n, p.limit));
            }
            // Acquire: pairs with the Release of the CAS that wrote this word, so the clock read
            // below happens after the writer's clock read and returns a time no earlier than its
            // window (and, if the writer decided under newer parameters, `changed` below sees
            // their version).
            let mut current = state.load(Ordering::Acquire);
            loop {
                if current == RETIRED {
                    return Err(TryAcquireError::Closed);
                }
                let now = clock.now();
                let (used, free, until_reset, id) = p.free(current, now);
                if !CHARGE && free < n.max(1) {
                    // The next window starts empty and n ≤ limit, so that is exactly when n fits.
                    return Err(TryAcquireError::Rejected(Rejection::new(
                        until_reset,
                        p.limit,
                    )));
                }
                if n == 0 || !COMMIT {
                    return Ok(Admission::new(now, until_reset, free));
                }
                if self.params.changed(version) {
                    // Reconfigured since our snapshot: decide again under the new parameters
                    // rather than write a word the new grid would read differently.
                    continue 'params;
                }
                // A charge saturates the count at u32::MAX (the word's 32-bit field).
                let next = pack(
                    id,
                    if CHARGE {
                        used.saturating_add(n)
                    } else {
                        used + n
                    },
                );
                // Release on success: publishes our clock reading to the next thread that loads
                // the word (see the load above). Acquire on failure: we use the new word the same
                // way.
                match state.compare_exchange_weak(
                    current,
                    next,
                    Ordering::Release,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        return Ok(Admission::with_token(
                            now,
                            until_reset,
                            free.saturating_sub(n),
                            version as u32,
                        ));
                    }
                    Err(actual) => current = actual,
                }
            }
        }
    }
}

/// A never-used word is the fresh `(0, 0)`: an admission writes its count, and a refund that
/// empties window 0 writes `(ID_MASK, 0)` instead ([`not_fresh`]).
#[cfg(feature = "keyed")]
impl crate::keyed::Unused for FixedWindow {
    fn unused(state: &AtomicU64) -> bool {
        // Relaxed: a hint; `retire_unused`'s CAS decides.
        state.load(Ordering::Relaxed) == pack(0, 0)
    }

    fn retire_unused(state: &AtomicU64) -> bool {
        // Release on success, as `retire`'s: whoever sees RETIRED and re-creates the key happens
        // after us (the word held no admission, so no clock reading is handed on). Relaxed on
        // failure: an admission landed; the cell is used and stays.
        state
            .compare_exchange(pack(0, 0), RETIRED, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    fn retire_now(state: &AtomicU64) -> bool {
        super::retire_word(state, |word| word == pack(0, 0))
    }
}
