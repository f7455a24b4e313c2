//! Sliding window counter: the previous and current fixed-window counts, weighted.

use super::{
    Algo, Charge, Divisor, EachCell, Grid, ID_MASK, RETIRED, pack, too_big, unpack, window_id,
};
use crate::clock::{Clock, nanos};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering, Params};
use std::time::Duration;

/// Approximates a sliding window with two counts: at elapsed time `e` into window `w`, the estimate
/// is `prev · (W − e) / W + cur`, where `prev` is window `w − 1`'s final count. A request for n
/// permits is admitted iff `estimate + n ≤ limit`, evaluated exactly in integers
/// (`prev·(W−e) + (cur+n)·W ≤ limit·W`, in u128).
///
/// **Error bound.** Every fixed window still admits at most `limit`, and the estimate never exceeds
/// `limit` at an admission; but the estimate assumes the previous window's admissions were spread
/// evenly. Any interval of length `W` that starts `W − x` before the current window began holds at
/// most `limit + prev · x / W < 2·limit` admissions; the worst case needs the previous window's
/// admissions bunched at its very end. Use the exact sliding window when that matters.
///
/// **Memory:** three words whatever the limit: 1,000,000 per minute costs what 10 per second costs.
///
/// State: `current` = (window id, count) as in [`pack`]; `previous[id & 1]` = (id, final count) of
/// window `id`, written when `current` rolls over from `id` to `id + 1`, so readers in window
/// `id + 1` can find `prev` once `current` has moved on.
///
/// | `current` holds (now in window w) | prev used | cur used | admit writes |
/// |---|---|---|---|
/// | (w, c) | `previous[(w − 1) & 1]`.count if its id is w − 1, else 0 | c | `current` = (w, c + n) |
/// | (w − 1, c) | c | 0 | `previous[(w − 1) & 1]` = (w − 1, c), then `current` = (w, n) |
/// | older | 0 | 0 | `current` = (w, n) |
///
/// Rolling over stores `previous` *before* the CAS that moves `current` to the new window, so a
/// thread that loads the new `current` (Acquire) finds the final count of the window before it.
///
/// **Why two `previous` slots.** The roll-over from `w` to `w + 1` publishes `(w, c)` before its CAS,
/// and that CAS can lose to a caller still deciding in window `w` (its clock read came first). With
/// one slot that caller would read `(w, c)` where it expects `(w − 1, _)`, take prev = 0, and admit
/// over the estimate (the stress audit and the loom model
/// `rollover_publish_does_not_hide_prev_from_old_window` both caught this). With a slot per parity the
/// roll-over into `w + 1` writes the slot window `w` callers do not read; the next writer of their
/// slot rolls into `w + 2`, which needs `current` to have reached `w + 1` already, and from then on
/// no CAS expecting a window-`w` word can succeed.
///
/// This struct holds the parameters; the three words are the [`Algo::Cell`], [`Words`]. Retiring
/// swaps `current` to [`RETIRED`] (window words never have bit 63 set).
pub(crate) struct SlidingCounter {
    /// [`Shape`] as words, replaceable at run time by [`Algo::reconfigure`].
    params: Params<6>,
}

/// The sliding counter's parameters: a snapshot of [`SlidingCounter::params`].
#[derive(Clone, Copy)]
struct Shape {
    limit: u32,
    /// `grid.len()`, the window length W.
    window: u64,
    /// `grid.window`: W strength-reduced.
    per_window: Divisor,
    grid: Grid,
}

/// The state of one sliding counter.
pub(crate) struct Words {
    current: AtomicU64,
    /// `previous[id & 1]` holds (id, final count) of window `id` once it has been rolled over.
    previous: [AtomicU64; 2],
}

/// The id of the window before window `id`, modulo 2^31 like the ids themselves.
#[inline(always)]
fn before(id: u32) -> u32 {
    id.wrapping_sub(1) & ID_MASK
}

/// `a / b` (b > 0), in 64 bits when both fit: a u128 division is a library call several times slower.
#[inline]
fn div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

impl SlidingCounter {
    pub(crate) fn new(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        let window = nanos(window, "window")?;
        if window == 0 {
            return Err(ConfigError::Zero { what: "window" });
        }
        Ok(SlidingCounter {
            params: Params::new(Shape::words(limit, Grid::new(window))),
        })
    }

    /// The time from `now` to the start of the first window that begins later than `after`
    /// nanoseconds from `now` (the end of the window `now + after` falls in, as this window's
    /// end is reckoned by a rejection's retry-after). From then on, what was admitted by `now +
    /// after` counts only with the previous window's fading weight.
    ///
    /// A rejection held back by queued waiters needs it (see `limiter::refused_for_waiters`):
    /// the estimate weighs admissions by the window they fell in, so a call admitted a window
    /// after the queue's can fit sooner than all of them at once would.
    #[cold]
    pub(crate) fn next_window_after(&self, now: u64, after: u64) -> u64 {
        let (p, _) = self.shape();
        let (_, elapsed) = p.grid.locate(now);
        let to_end = p.window - elapsed;
        if after < to_end {
            return p.grid.wait(now, to_end);
        }
        let windows = (after - to_end) / p.window + 1;
        p.grid
            .wait(now, to_end.saturating_add(windows.saturating_mul(p.window)))
    }

    /// The parameters now, and the version they were published under.
    #[inline(always)]
    fn shape(&self) -> (Shape, u64) {
        let (w, version) = self.params.load();
        let grid = Grid::from_words([w[1], w[2], w[3], w[4], w[5]]);
        let shape = Shape {
            limit: w[0] as u32,
            window: grid.len(),
            per_window: grid.window,
            grid,
        };
        (shape, version)
    }

    /// (prev, cur) as seen by a caller in window `id` whose `current` word is `word`.
    #[inline]
    fn counts(&self, words: &Words, word: u64, id: u32) -> (u32, u32) {
        let (wid, count) = unpack(word);
        if wid == id {
            // Relaxed is enough: the Acquire load of `current` that produced `word` synchronised
            // with the CAS that rolled into window `id`, and that CAS came after the store of
            // `previous`, so coherence guarantees we read that store or a later one. A later one is
            // either a larger count for the same window (within an id the slot only grows, see
            // `publish_previous`: conservative) or window id + 1's (publishes are validated against
            // `current`), which means `current` has left window `id` and our CAS on `word` will
            // fail anyway.
            let slot = &words.previous[(before(id) & 1) as usize];
            let (pid, pcount) = unpack(slot.load(Ordering::Relaxed));
            let prev = if pid == before(id) { pcount } else { 0 };
            (prev, count)
        } else if wid == before(id) {
            (count, 0)
        } else {
            (0, 0)
        }
    }

    /// Makes `previous[id & 1]` hold (id, at least count) for `word` = (id, count), before the
    /// roll-over CAS out of window `id`. Returns false, publishing nothing, if `current` no
    /// longer holds `word`: the caller must then decide again rather than attempt its CAS.
    ///
    /// The publish is validated rather than ordered: load the slot (Acquire), check that `current`
    /// still holds `word`, then CAS the slot from what was loaded. A publisher whose word is stale
    /// either sees the newer publish (and through its Acquire, the newer `current`, so the check
    /// fails) or loaded the slot before it (so its CAS fails and it looks again). So a stale word
    /// never overwrites a newer window's, and ids are only ever compared for equality: no
    /// wrapping-distance judgement that a slot left idle for 2^30 windows could fool.
    ///
    /// **Refunds.** A chain's [`refund`](Algo::refund) lowers `current`'s count, so within one
    /// window `current` can go down and back up to a value it held before (ABA). Two rules keep
    /// the published count at least the window's final count anyway:
    /// - *within one id the slot only grows*: a slot already holding (id, c′ ≥ count) is left
    ///   alone, so a publisher that saw a lower count mid-excursion cannot lower it;
    /// - *no roll-over without a publish*: if the check fails, the caller reloads instead of
    ///   trying its CAS, which could succeed after the excursion returned to `word` and roll the
    ///   window over with nothing (or an older window) in the slot.
    ///
    /// Without refunds both rules change nothing: counts only grow within a window, and a failed
    /// check meant a failing CAS.
    #[cold]
    fn publish_previous(words: &Words, word: u64) -> bool {
        let (id, count) = unpack(word);
        let slot = &words.previous[(id & 1) as usize];
        // Acquire: pairs with the Release CAS of the publisher of `seen`, whose check of `current`
        // then happens before ours: if it saw a later word, so do we.
        let mut seen = slot.load(Ordering::Acquire);
        loop {
            let (sid, scount) = unpack(seen);
            if sid == id && scount >= count {
                return true;
            }
            // Acquire: we need the newest `current` the publisher of `seen` saw, or a later one.
            // (Relaxed would do for the comparison alone; Acquire is what carries the argument.)
            if words.current.load(Ordering::Acquire) != word {
                return false;
            }
            // Release on success: the next publisher that loads our value must also see the
            // `current` we checked. Acquire on failure: as for the first load.
            match slot.compare_exchange_weak(seen, word, Ordering::Release, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => seen = actual,
            }
        }
    }
}

impl Shape {
    fn words(limit: u32, grid: Grid) -> [u64; 6] {
        let [a, b, c, d, e] = grid.to_words();
        [u64::from(limit), a, b, c, d, e]
    }

    #[inline]
    fn fits(&self, prev: u32, cur: u32, n: u32, elapsed: u64) -> bool {
        let w = u128::from(self.window);
        u128::from(prev) * u128::from(self.window - elapsed) + (u128::from(cur) + u128::from(n)) * w
            <= u128::from(self.limit) * w
    }

    /// Exact time until n permits fit, given the counts now and no further admissions.
    ///
    /// Out of line and cold: only rejections need it, and its divisions would crowd the admit path.
    #[cold]
    #[inline(never)]
    fn retry_after(&self, prev: u32, cur: u32, n: u32, elapsed: u64) -> u64 {
        let w = u128::from(self.window);
        let (prev, cur, n, limit) = (
            u128::from(prev),
            u128::from(cur),
            u128::from(n),
            u128::from(self.limit),
        );
        if cur + n <= limit && prev > 0 {
            // Later in this window: need prev·(W − e') ≤ (limit − cur − n)·W.
            let first = w - div((limit - cur - n) * w, prev).min(w);
            if first < w {
                return (first as u64).saturating_sub(elapsed);
            }
        }
        // In the next window this window's count becomes prev and cur starts at 0; `first == W`
        // means the window after that (where prev is 0).
        let first = if cur == 0 {
            0
        } else {
            w - div((limit - n) * w, cur).min(w)
        };
        // Saturating: for a window above 2^63 ns (the constructor takes up to u64::MAX, ~584
        // years) the sum can exceed u64; the clock never gets that far anyway.
        (self.window - elapsed).saturating_add(first as u64)
    }

    /// ⌈prev · (W − e) / W⌉: the previous window's share of the estimate, in whole permits.
    #[inline(always)]
    fn weighted(&self, prev: u32, elapsed: u64) -> u32 {
        if prev == 0 {
            return 0;
        }
        let product = u128::from(prev) * u128::from(self.window - elapsed);
        // The share never exceeds prev, so it fits in u32; the division is strength-reduced when
        // the product fits in 64 bits (windows under ~4 s always, longer ones at small counts).
        let share = match u64::try_from(product + u128::from(self.window) - 1) {
            Ok(p) => u128::from(self.per_window.div(p)),
            Err(_) => product.div_ceil(u128::from(self.window)),
        };
        share as u32
    }
}

impl Algo for SlidingCounter {
    type Cell = Words;

    fn cell(&self) -> Words {
        Words {
            current: AtomicU64::new(pack(0, 0)),
            // (ID_MASK, 0): "window −1 admitted nothing", in the slot window 0 reads.
            previous: [
                AtomicU64::new(pack(ID_MASK, 0)),
                AtomicU64::new(pack(ID_MASK, 0)),
            ],
        }
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
        words: &Words,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        self.run::<C, COMMIT, false>(words, n, clock)
    }

    /// Takes `n` off `current`'s count if `current` still holds the admission's window and the
    /// clock is at most one window past it. Once `current` has rolled over, the count lives on in
    /// `previous` as the next window's `prev`, and it stays there: conservative (the refunded
    /// permits keep weighing on the estimate until that window ends), never looser.
    ///
    /// **Why it is exact and never looser.** Invariant: `current`'s count, and a published
    /// `previous` count, are at least the permits of the never-refunded admissions in their
    /// window. Admissions add their own n; a refund subtracts only an n its admission added to
    /// that same window, while it is still counted there; `publish_previous` never lowers a
    /// published count within a window (see there for why refunds need that). The estimate is
    /// monotone in both counts, so every decision is at least as strict as without the refunded
    /// admissions; before the roll-over, with the clock in the admission's window, it is exact.
    /// The clock bound rules out the 31-bit id wrap: `current`'s window lies between the
    /// admission's and the clock's, and ids of windows w and w + 1 differ.
    ///
    /// **Saturated.** A [charge](Charge) saturates `current`'s count at `u32::MAX`, where it
    /// stops holding every admission of its window: nothing is given back from it (nor from a
    /// window of limit `u32::MAX` that admissions filled to that count: the two cannot be told
    /// apart).
    ///
    /// **Reconfigured since.** If the admission's parameters version (its token) is no longer
    /// current, nothing is given back (conservative).
    fn refund<C: Clock>(&self, words: &Words, n: u32, admission: &Admission, clock: &C) {
        let (p, version) = self.shape();
        if version as u32 != admission.token() {
            return;
        }
        let window = p.grid.locate(admission.at_nanos()).0;
        let id = window_id(window);
        // Acquire: as in `try_acquire`: our clock read below is no earlier than the last writer's.
        let mut word = words.current.load(Ordering::Acquire);
        loop {
            let (wid, count) = unpack(word);
            // A count at u32::MAX may be a charge's saturated one (see the fixed window's refund).
            if word == RETIRED
                || wid != id
                || count == u32::MAX
                || p.grid.locate(clock.now()).0.wrapping_sub(window) > 1
            {
                return;
            }
            let mut left = pack(id, count.saturating_sub(n));
            if left == pack(0, 0) {
                // Never the fresh word (see `not_fresh`), so that `retire` can still retire the
                // key: `(ID_MASK, prev)` instead, with window 0's `prev` as a reader of `(0, 0)`
                // finds it in `previous` (our `word` was loaded with Acquire, as `counts`
                // needs). It reads as `(0, 0)` does in window 0 (prev, 0) and in window 1 (0, 0),
                // the only ones a refund runs in, and as nothing from window 2 on. Ids wrap, so
                // window 0 comes round every 2^31 windows, where the window before it can weigh:
                // `(ID_MASK, 0)` dropped that weight, and the limiter admitted what a twin
                // without the refunded admission refused
                // (`a_refund_that_empties_a_wrapped_window_zero_keeps_the_previous_weight`).
                left = pack(ID_MASK, self.counts(words, left, 0).0);
            }
            // Release on success: publishes our clock reading like an admission does (a reader
            // that loads our word decides at a time no earlier). Acquire on failure: as above.
            match words.current.compare_exchange_weak(
                word,
                left,
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    #[cfg(feature = "store")]
    fn save(words: &Words) -> Vec<u64> {
        vec![
            words.current.load(Ordering::Relaxed),
            words.previous[0].load(Ordering::Relaxed),
            words.previous[1].load(Ordering::Relaxed),
        ]
    }

    #[cfg(feature = "store")]
    fn restore(&self, saved: &[u64]) -> Option<Words> {
        match saved {
            [current, a, b] if *current != RETIRED => Some(Words {
                current: AtomicU64::new(*current),
                previous: [AtomicU64::new(*a), AtomicU64::new(*b)],
            }),
            _ => None,
        }
    }

    #[cfg(all(test, not(turnstile_loom)))]
    fn words(words: &Words) -> Vec<u64> {
        vec![
            words.current.load(Ordering::Relaxed),
            words.previous[0].load(Ordering::Relaxed),
            words.previous[1].load(Ordering::Relaxed),
        ]
    }

    /// What a window admits counts in full until it ends, and never more than the limit: of
    /// `limit + extra` admitted from `now` on, this window takes at most the limit (its previous
    /// window's weight falls to nothing by its end), and the rest go at most a limit per window
    /// after it, the last in the window that starts `(⌈extra / limit⌉ − 1)` windows after the
    /// next one.
    fn beyond_limit(&self, now: u64, _at_limit: u64, extra: u64) -> u64 {
        let p = self.shape().0;
        let later = extra.max(1).div_ceil(u64::from(p.limit.max(1))) - 1;
        let wait = self
            .next_window_after(now, 0)
            .saturating_add(later.saturating_mul(p.window));
        p.grid.wait(now, wait)
    }

    fn available(&self, words: &Words, now: u64) -> u32 {
        // Acquire: as in try_acquire, so that `previous` is current for this word.
        let p = self.shape().0;
        let word = words.current.load(Ordering::Acquire);
        if word == RETIRED {
            return p.limit;
        }
        let (window, elapsed) = p.grid.locate(now);
        let (prev, cur) = self.counts(words, word, window_id(window));
        p.limit
            .saturating_sub(cur)
            .saturating_sub(p.weighted(prev, elapsed))
    }

    /// Judged as a decision is: the parameters first, then the word, then the clock, and the
    /// version re-checked before the CAS (as the fixed window's `retire`: parameters loaded
    /// after the clock read could be those of a reconfiguration that read its clock later, whose
    /// rebased grid placed our reading before the current window and read its counts as stale).
    fn retire_unless<C: Clock>(
        &self,
        words: &Words,
        clock: &C,
        waited: impl FnOnce() -> bool,
    ) -> Result<(), u64> {
        let (p, version) = self.shape();
        // Acquire: as in `try_acquire`.
        let word = words.current.load(Ordering::Acquire);
        let now = clock.now();
        if word == RETIRED {
            // Retired by a reset (`retire_now`), which counts it: not ours to count.
            return Err(now);
        }
        if word == pack(0, 0) {
            // Never used: its inserter is about to admit on it (see `Algo::retire`).
            return Err(now);
        }
        let (window, elapsed) = p.grid.locate(now);
        let id = window_id(window);
        if self.counts(words, word, id) != (0, 0) {
            // Counts of window w weigh on windows w and w + 1; a word of window `id` is forgotten
            // from window id + 2 on, one of the window before from id + 1 on. A word of window
            // `id` whose count a refund took back to 0 only has `prev` left, which window id + 1
            // no longer weighs: idle from then on (reporting id + 2 kept a keyed store from
            // sweeping, and at its cap from admitting a new key, for a window too long).
            let (wid, count) = unpack(word);
            let ahead = if wid == id && count > 0 { 2 } else { 1 };
            // Saturating: as in `Grid::rebase`, for a clock that went back against its contract.
            let start = now.saturating_sub(elapsed);
            return Err(start.saturating_add(p.window.saturating_mul(ahead)));
        }
        if self.params.changed(version) {
            // Reconfigured since our snapshot: look again under the new parameters.
            return Err(now);
        }
        if waited() {
            // Idle, but its key has waiters queued: not evicted (see `Algo::retire_unless`).
            return Err(now);
        }
        // Release on success: as in the fixed window's `retire`. Relaxed on failure: busy.
        words
            .current
            .compare_exchange(word, RETIRED, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| now)
    }

    /// New parameters, published in one step (no cell is written): a new limit applies at once
    /// to the counts kept; a new window length rebases the grid ([`Grid::rebase`]) so that the
    /// current window keeps its id, count and start (and the previous window its count, now
    /// weighted over the new length), as the fixed window's does.
    fn reconfigure<C: Clock>(
        &self,
        to: &Self,
        clock: &C,
        _cells: EachCell<'_, Words>,
    ) -> Result<(), ConfigError> {
        let (from, target) = (self.shape().0, to.shape().0);
        // The clock read between closing the old parameters and publishing the new ones, as in
        // the fixed window's `reconfigure`.
        let writing = self.params.begin();
        let now = clock.now();
        let grid = if target.window == from.window {
            from.grid
        } else {
            from.grid.rebase(target.window, now)
        };
        writing.finish(Shape::words(target.limit, grid));
        Ok(())
    }

    fn retired(words: &Words) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        words.current.load(Ordering::Relaxed) == RETIRED
    }
}

/// Adds `n` to the current window's count (rolling over first, as an admission does),
/// saturating at `u32::MAX`. The debt weighs on the estimate for at most two windows: the count
/// is `cur` for the rest of this window, then `prev`, weighted down to nothing over the next.
impl Charge for SlidingCounter {
    /// [`Algo::decide`] (`CHARGE` off) and [`Charge::charge`] (`COMMIT` and `CHARGE` on): one
    /// protocol, where a charge skips the two limit checks and saturates the count.
    #[inline(always)]
    fn run<C: Clock, const COMMIT: bool, const CHARGE: bool>(
        &self,
        words: &Words,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        'params: loop {
            let (p, version) = self.shape();
            if !CHARGE && n > p.limit {
                return Err(too_big(n, p.limit));
            }
            // Acquire: pairs with the Release CAS that wrote this word: our clock read below is
            // no earlier than the writer's, the roll-over store of `previous` is visible (see
            // counts), and if the writer decided under newer parameters, `changed` sees them.
            let mut word = words.current.load(Ordering::Acquire);
            loop {
                if word == RETIRED {
                    return Err(TryAcquireError::Closed);
                }
                let now = clock.now();
                let (window, elapsed) = p.grid.locate(now);
                let id = window_id(window);
                let (prev, cur) = self.counts(words, word, id);
                if !CHARGE && !p.fits(prev, cur, n.max(1), elapsed) {
                    return Err(TryAcquireError::Rejected(Rejection::new(
                        p.grid
                            .wait(now, p.retry_after(prev, cur, n.max(1), elapsed)),
                        p.limit,
                    )));
                }
                // A charge's count saturates at u32::MAX (the word's 32-bit field).
                let counted = if CHARGE {
                    cur.saturating_add(n)
                } else {
                    cur + n
                };
                let remaining = |counted: u32| {
                    let reset = if counted > 0 {
                        p.window.saturating_mul(2) - elapsed
                    } else if prev > 0 {
                        p.window - elapsed
                    } else {
                        0
                    };
                    // One call for both branches: one in each cost the admit path 3 ns of its
                    // 13 (criterion, admit_1t/turnstile/sliding_counter).
                    let reset = p.grid.wait(now, reset);
                    Admission::with_token(
                        now,
                        reset,
                        // Saturating: a charge may leave the estimate above the limit (debt).
                        p.limit
                            .saturating_sub(counted)
                            .saturating_sub(p.weighted(prev, elapsed)),
                        version as u32,
                    )
                };
                if n == 0 || !COMMIT {
                    return Ok(remaining(cur));
                }
                if self.params.changed(version) {
                    // Reconfigured since our snapshot: decide again under the new parameters.
                    continue 'params;
                }
                let (wid, count) = unpack(word);
                if wid != id
                    && wid == before(id)
                    && !Self::publish_previous(words, pack(wid, count))
                {
                    // `current` moved on: decide again on its new value. (Our CAS would fail
                    // anyway, unless refunds took `current` away and back to `word`; rolling over
                    // without the publish would then hide the window's count. See
                    // `publish_previous`.) Acquire: as for the first load.
                    word = words.current.load(Ordering::Acquire);
                    continue;
                }
                // Release on success: orders the `previous` store above (and our clock read)
                // before the new word for every thread that loads it with Acquire. Acquire on
                // failure: as for the first load.
                match words.current.compare_exchange_weak(
                    word,
                    pack(id, counted),
                    Ordering::Release,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Ok(remaining(counted)),
                    Err(actual) => word = actual,
                }
            }
        }
    }
}

/// A never-used cell has the fresh `(0, 0)` in `current` (an admission writes its count there,
/// and a refund that empties window 0 writes `(ID_MASK, prev)`); `retire` judges and CASes the
/// same word.
#[cfg(feature = "keyed")]
impl crate::keyed::Unused for SlidingCounter {
    fn unused(words: &Words) -> bool {
        // Relaxed: a hint; `retire_unused`'s CAS decides.
        words.current.load(Ordering::Relaxed) == pack(0, 0)
    }

    fn retire_unused(words: &Words) -> bool {
        // Release on success, as `retire`'s. Relaxed on failure: an admission landed; the cell
        // is used and stays.
        words
            .current
            .compare_exchange(pack(0, 0), RETIRED, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    fn retire_now(words: &Words) -> bool {
        super::retire_word(&words.current, |word| word == pack(0, 0))
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    /// The docs' "three words whatever the limit": a counter's state is its three 64-bit words,
    /// with nothing sized by the limit.
    #[test]
    fn a_counters_state_is_three_words() {
        assert_eq!(std::mem::size_of::<Words>(), 3 * 8);
    }

    /// The refund excursion of `publish_previous`'s docs, replayed step by step: roller R (in
    /// window 1) publishes (0, 2); a refund takes `current` to (0, 1); roller S publishes (0, 1);
    /// an admission still in window 0 takes `current` back to (0, 2); R's roll-over CAS from
    /// (0, 2) succeeds. Window 1 must then see prev = 2, not 1.
    #[test]
    fn refund_excursion_cannot_lower_previous() {
        let algo = SlidingCounter::new(3, Duration::from_nanos(10)).unwrap();
        let words = algo.cell();
        let clock = ManualClock::new();
        algo.try_acquire(&words, 1, &clock).unwrap();
        let refunded = algo.try_acquire(&words, 1, &clock).unwrap();
        let r_word = words.current.load(Ordering::Relaxed);
        assert_eq!(unpack(r_word), (0, 2));
        // R, in window 1, publishes (0, 2) and is preempted before its CAS.
        assert!(SlidingCounter::publish_previous(&words, r_word));
        algo.refund(&words, 1, &refunded, &clock);
        let s_word = words.current.load(Ordering::Relaxed);
        assert_eq!(unpack(s_word), (0, 1));
        // S publishes (0, 1): the slot keeps the larger count of the same window.
        assert!(SlidingCounter::publish_previous(&words, s_word));
        assert_eq!(unpack(words.previous[0].load(Ordering::Relaxed)), (0, 2));
        // An admission with a window-0 clock reading takes `current` back to (0, 2) ...
        algo.try_acquire(&words, 1, &clock).unwrap();
        // ... so R's roll-over CAS succeeds, and window 1 finds prev = 2. (Orderings as the
        // roll-over's own; one thread here, so they only mirror it.)
        words
            .current
            .compare_exchange(r_word, pack(1, 1), Ordering::Release, Ordering::Relaxed)
            .unwrap();
        clock.set(Duration::from_nanos(10));
        assert_eq!(algo.counts(&words, pack(1, 1), 1), (2, 1));
        // At e = 0 of window 1 the estimate is 2 + 1: a third permit is refused.
        assert!(algo.try_acquire(&words, 1, &clock).is_err());
    }

    /// A cell whose current window's count was refunded to 0 weighs only its previous window's
    /// count, which is forgotten when the current window ends: `retire` must say so, not a
    /// window later (a keyed store trusts the time as the earliest a key turns idle, skips
    /// sweeps and refuses new keys at its cap until then).
    #[test]
    fn a_refunded_current_window_is_idle_when_it_ends() {
        let algo = SlidingCounter::new(2, Duration::from_nanos(10)).unwrap();
        let words = algo.cell();
        let clock = ManualClock::new();
        algo.try_acquire(&words, 1, &clock).unwrap();
        clock.set(Duration::from_nanos(13));
        let given_back = algo.try_acquire(&words, 1, &clock).unwrap();
        algo.refund(&words, 1, &given_back, &clock);
        assert_eq!(unpack(words.current.load(Ordering::Relaxed)), (1, 0));
        // Busy: window 0's permit still weighs on window 1, until it ends at 20.
        assert_eq!(algo.retire(&words, &clock), Err(20));
        clock.set(Duration::from_nanos(20));
        assert_eq!(algo.retire(&words, &clock), Ok(()));
    }

    /// Window ids wrap after 2^31 windows, so window id 0 comes round again, and then the
    /// window before it (id `ID_MASK`) can still weigh on it. A refund that empties such a
    /// window must keep that weight. Writing `(ID_MASK, 0)` in place of the fresh word (see
    /// `not_fresh`) read as "the previous window admitted nothing" until the next admission
    /// found the weight again in `previous`: limit 2, windows of 10 ns, one permit in window
    /// 2^31 − 1, one in window 2^31 (id 0) given back; a call for two permits in window 2^31 was
    /// then admitted (three permits against an estimate of two; a twin that never saw the
    /// refunded admission refuses it), `available` said 2, and `retire` retired the cell (a
    /// keyed sweep evicted the key, and its fresh cell admitted two).
    #[test]
    fn a_refund_that_empties_a_wrapped_window_zero_keeps_the_previous_weight() {
        let algo = SlidingCounter::new(2, Duration::from_nanos(10)).unwrap();
        let (words, twin) = (algo.cell(), algo.cell());
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(10 * u64::from(ID_MASK)));
        algo.try_acquire(&words, 1, &clock).unwrap();
        algo.try_acquire(&twin, 1, &clock).unwrap();
        clock.set(Duration::from_nanos(10 << 31));
        let given_back = algo.try_acquire(&words, 1, &clock).unwrap();
        algo.refund(&words, 1, &given_back, &clock);
        assert!(algo.try_acquire(&twin, 2, &clock).is_err());
        assert!(
            algo.try_acquire(&words, 2, &clock).is_err(),
            "looser than a twin without the refunded admission"
        );
        assert_eq!(
            algo.available(&words, clock.now()),
            1,
            "the previous window's weight"
        );
        // Busy (for a sweep) until window 2^31 ends, where that weight is gone.
        assert_eq!(algo.retire(&words, &clock), Err(10 * ((1 << 31) + 1)));
        algo.try_acquire(&words, 1, &clock).unwrap();
        assert!(algo.try_acquire(&words, 1, &clock).is_err());
    }

    /// A roller whose check of `current` fails publishes nothing and must not try its CAS.
    #[test]
    fn publish_refuses_a_stale_word() {
        let algo = SlidingCounter::new(3, Duration::from_nanos(10)).unwrap();
        let words = algo.cell();
        let clock = ManualClock::new();
        let first = algo.try_acquire(&words, 1, &clock).unwrap();
        let stale = words.current.load(Ordering::Relaxed);
        algo.refund(&words, 1, &first, &clock);
        assert!(!SlidingCounter::publish_previous(&words, stale));
        assert_eq!(
            unpack(words.previous[0].load(Ordering::Relaxed)),
            (ID_MASK, 0)
        );
    }
}
