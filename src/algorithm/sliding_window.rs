//! The exact sliding window: a sliding log kept in a bounded ring of timestamps.

use super::{Algo, Charge, EachCell, RETIRED, too_big};
use crate::clock::{Clock, nanos};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering, Params, Spin};
use std::time::Duration;
use strength_reduce::StrengthReducedU64;

/// The largest limit the exact sliding window accepts: its ring costs 8 bytes per permit.
pub(crate) const MAX_SLIDING_LIMIT: u32 = 1 << 24;

/// Expiry times are stored shifted left by one bit, under the [`OVERDRAWN`] bit; later ones
/// saturate (about 146 years after the epoch), and a saturated one never expires (clock readings
/// are capped one below it).
const MAX_TIME: u64 = (1 << 62) - 1;

/// The wait, read at `now`, for a permit that frees at `expiry` (0 if it has): a rejection's
/// `retry_after`, an admission's `reset_after`. A saturated expiry never frees: its wait is
/// [`NEVER`](super::NEVER), not the 1 ns to the last reading.
fn wait_until(expiry: u64, now: u64) -> u64 {
    if expiry >= MAX_TIME {
        super::NEVER
    } else {
        expiry.saturating_sub(now)
    }
}

/// Bit 63 of a slot word: written by an [overdraw](SlidingWindow::overdraw), which claims
/// tickets past live ones. A refund never matches such a word (see [`Algo::refund`]): two
/// overdraws bring a slot back to the parity of a ticket two laps older, and with the same
/// expiry (everything at one clock reading) its word would be that ticket's, whose refund would
/// then free a charge's permit. A value stored before this bit existed that has it set held a
/// saturated expiry, and reads as one still.
const OVERDRAWN: u64 = 1 << 63;

/// The expiry in a slot word (0: refunded, or never written).
#[inline(always)]
pub(crate) fn slot_expiry(word: u64) -> u64 {
    (word & !OVERDRAWN) >> 1
}

/// A slot that no ticket has written yet: expiry 0 with lap parity 1 ("lap −1"), so lap 0 sees it
/// as unpublished and lap 1 (which never reads it before lap 0 wrote it) cannot mistake it.
const UNWRITTEN: u64 = 1;

/// `Ring::settled` before any admission has settled the ring under some parameter version (odd:
/// published versions are even).
const UNSETTLED: u64 = u64::MAX;

/// The refund token's slot index (bits 0..24; limits are at most 2^24), the parameters' version
/// it was admitted under (bits 24..31: `version / 2` modulo 2^7, see [`token_version`]) and lap
/// parity (bit 31).
const TOKEN_INDEX: u32 = (1 << 24) - 1;
const TOKEN_VERSION: u32 = 0x7f << 24;
const TOKEN_PARITY: u32 = 1 << 31;

/// The token bits of a parameters version (published versions are even: one step is 2).
#[inline(always)]
fn token_version(version: u64) -> u32 {
    (((version >> 1) as u32) << 24) & TOKEN_VERSION
}

/// At most `limit` (N) admissions in any interval of length `window` (W), on the times it assigns.
///
/// Every admitted permit takes a ticket `k` from a counter and records its expiry (its time plus W)
/// in ring slot `k mod N`. Ticket k is admitted only if ticket k − N has expired. With times
/// non-decreasing in ticket order (see the module docs), any N + 1 admissions include two tickets
/// N apart, which are at least W apart: no interval of length W holds N + 1. There is no trimming
/// thread: expiry is one comparison against the slot that ticket k would overwrite.
///
/// Storing the expiry rather than the time is what lets a [refund](Algo::refund) write "expired"
/// as expiry 0, which every clock reading passes, even in the first window after the epoch.
///
/// **Publication.** A writer claims tickets with a CAS on `head` and only then writes the slots, so
/// a reader can arrive in between and find the slot still holding the previous lap's time. Each slot
/// therefore carries the parity of its lap, as crossbeam's `ArrayQueue` carries a stamp:
///
/// | slot word (bit 63: [`OVERDRAWN`], bits 62..1: expiry, bit 0: lap parity) | meaning for a reader expecting ticket j |
/// |---|---|
/// | `expiry << 1 \| (j / N) & 1`, bit 63 clear | ticket j is published; it expires at `expiry` (0: refunded) |
/// | the same with bit 63 set | ticket j is published by an overdraw (a charge): as above, but never refunded |
/// | `expiry << 1 \| ((j / N) + 1) & 1` (either bit 63) | ticket j − N is still there: j's writer is between claim and publish (or the reader is stale) |
///
/// A reader that sees the wrong parity never decides on it: it snoozes and reloads `head`. No third
/// state is possible: a claim of tickets `[head, end)` first checks that *every* slot it will
/// overwrite (tickets `[head − N, end − N)`) holds its own ticket's write, so ticket j is only ever
/// claimed after j − N was published and a slot is never two laps behind. (Checking only the newest
/// of them is not enough for multi-permit claims: a preempted writer of an older ticket could then
/// store its time over the next lap. The loom model `multi_ticket_claim_*` found this.)
///
/// **Refunds (positional).** A [chain](crate::Chain) gives an admission back by overwriting its
/// tickets' slots with expiry 0, keeping their lap parity, if they still hold its own words.
/// The tickets stay claimed, so a refunded permit is reused when its *position* comes round:
/// ticket k + N finds k expired at once, but claims go in ticket order, so it comes after the
/// admissions older than k have left the window. That is conservative (at the latest, the
/// permit comes back when the refunded admission itself would have expired), never looser:
///
/// - *Claims stay exact.* In any interval of length W, each residue class mod N holds at most
///   one live (never-refunded) ticket: for live k < k′ ≡ k, ticket k + N ≤ k′ lies between them
///   in time, and its claim saw k's own word (k is never zeroed), unexpired, and would have
///   refused. So no interval holds more than N live admissions. (That argument needs N to be
///   the same for all those claims; after a lowering see "Lowering" below.)
/// - Refunded tickets read as expired out of time order, so a claim of several tickets checks
///   that *every* slot it overwrites has expired, not only the newest, and retiring and a
///   probe's (or check's) reset time look past refunded tickets for the newest real one.
/// - `remaining` (headers and `available`, never a decision) gallops assuming expiry is a prefix
///   in ticket order; a refunded ticket among live ones can make it over-count what is free,
///   by at most the live tickets older than the refunded one, until those expire. The
///   `expired` hint it stores can then lie past such a live ticket, and a window shortened
///   while it is live makes the reset time (walked from the hint, see "Shortening") miss its
///   expiry: `reset_after` then names an earlier time, never a decision.
///
/// Taking the tickets back instead (moving `head` back) would be exact, but lets `head` repeat a
/// value: a claimer that validated its slots before the refund could then succeed with its CAS
/// on slots that a third thread has since refilled. Chains therefore commit sliding-window members
/// last, so that with one such member its refund is never needed.
///
/// **Reconfiguration.** The ring cannot grow without a lock, so it has a fixed *capacity* R ≥ N
/// (the limit it was built with, or a larger `max_limit`), and the limit N can be set anywhere in
/// 1..=R at run time. Slots, laps and parities are counted in R (ticket k lives in slot k mod R);
/// the decision is counted in N (ticket k needs ticket k − N expired). A claim of `[head, end)`
/// checks that the slots it overwrites (tickets `[head − R, end − R)`) are published *and* that
/// the tickets it is decided on (`[head − N, end − N)`) are published and expired; with R = N
/// the two ranges are the same, as before. Every admission keeps the expiry it was admitted with:
/// a new window applies to admissions made after the change.
///
/// **Lowering.** What a claim of `[head, end)` under limit N really needs is that *every* ticket
/// below `end − N` has expired (or was refunded): then at most `head − (end − N) = N − n` older
/// admissions are live, and with ours at most N. Checking only `[head − N, end − N)` is enough
/// when the claim before ours ran under a limit N′ ≤ N, because that claim already established
/// "every ticket below `head − N′`". After the limit is *lowered* (N < N′) the tickets
/// `[head − N′, head − N)` have been checked by nobody, and the refund holes (expiry 0) and
/// shorter-window expiries in `[head − N, end − N)` no longer vouch for them (expiries are in
/// ticket order only without those): limit 2 with ticket 0 live and ticket 1 refunded, lowered to
/// 1, would admit ticket 2 on ticket 1's hole, two live under limit 1.
///
/// So the parameters also carry the *reach*: the largest limit set since construction, an upper
/// bound on the limit of every claim ever made on any ring (it only grows, and every claim's
/// parameters are at least as new as those of the claims before it, by the re-check before the
/// CAS). While N equals the reach (never lowered: the common path) nothing changes. Once N is
/// below it, a claim reads the ring's `settled` word, the parameter version under which some
/// earlier claim on this ring checked back that far: if it is ours, every claim since that one
/// ran under our N and the usual range suffices; otherwise the claim also checks
/// `[head − reach, head − N)`, and stores its version in `settled` once admitted. So each ring
/// pays one longer scan (at most reach − N slots) per reconfiguration after a lowering, and a
/// rejection pays it only when the usual range would have admitted (the newest decided-on
/// ticket has expired). A rejection from the usual range keeps its retry-after from that range:
/// exact unless a window shrink also made an older, unchecked ticket outlive it, in which case
/// the retry is refused once more with the rest of the wait.
///
/// **Shortening.** Expiries are in ticket order only while the window stays the same: after it
/// is shortened, an admission made under the longer window can outlive every later one. The
/// decision does not mind (a claim checks the latest expiry of every ticket it is decided on),
/// but the "full again" time (`reset_after`) and a keyed sweep's idleness read the newest
/// ticket. So the parameters carry `outlived_until`: the latest expiry any admission under an
/// earlier, longer window can have (the reconfiguration's clock reading plus that window; every
/// call that commits under the old parameters read its clock before, see `Params::begin`).
/// Before that time a probe's `reset_after` is the latest expiry among the tickets that can be
/// live (`[head − N, head)`, or back to the reach while unsettled: every ticket below that has
/// expired, by the claims' checks), an admission's the later of that and its own window, and
/// retiring looks at every slot rather than stopping at the newest expired ticket. The reset
/// walk starts at the `expired` hint (the tickets behind it have expired), so it costs the
/// live tickets, up to N, per decision; retiring's scan is O(N) per sweep. Both are paid only
/// until the longer window's admissions are gone; otherwise the one comparison with
/// `outlived_until` is all it costs. `remaining` walks the tickets in order
/// then too, instead of galloping (which assumes expiry is a prefix in ticket order), from the
/// `expired` hint to the first live one, and moves the hint there: amortised O(1) as well.
///
/// **Memory:** R words for the ring plus three counters and the ring's pointer (40 bytes).
///
/// This struct holds the parameters; the [`Ring`] is the [`Algo::Cell`]. Retiring swaps `head` to
/// [`RETIRED`] (ticket counters stay far below it).
pub(crate) struct SlidingWindow {
    /// `[limit | reach << 32, window, outlived_until]`, replaceable at run time by
    /// [`Algo::reconfigure`]:
    ///
    /// | word 0 bits | meaning |
    /// |---|---|
    /// | 0..32 | the limit N (1..=R) |
    /// | 32..64 | the reach: the largest limit set since construction (N..=R; see "Lowering") |
    ///
    /// Word 2 is a clock time before which an admission made under a longer window may still be
    /// in the ring (0: none ever was); see "Shortening" on the type.
    params: Params<3>,
    /// R: slots per ring, fixed at construction.
    capacity: u32,
    /// R, strength-reduced: a ticket's slot and lap.
    per_lap: StrengthReducedU64,
}

/// The sliding window's parameters: a snapshot of [`SlidingWindow::params`].
#[derive(Clone, Copy)]
struct Shape {
    limit: u32,
    /// The largest limit set since construction (see "Lowering" on [`SlidingWindow`]).
    reach: u32,
    window: u64,
    /// Until this time an older admission can outlive the newest ("Shortening").
    outlived_until: u64,
}

/// Word 0 of [`SlidingWindow::params`].
#[inline(always)]
fn pack_limits(limit: u32, reach: u32) -> u64 {
    u64::from(limit) | (u64::from(reach) << 32)
}

/// The state of one exact sliding window.
pub(crate) struct Ring {
    /// Tickets handed out so far: the next admission takes ticket `head`.
    head: AtomicU64,
    /// A hint for `remaining`: every ticket below it had expired when it was stored. It shares the
    /// cache line of `head`, which the admit path has just written anyway.
    expired: AtomicU64,
    /// Only read once the limit is below the reach: the parameter version under which an
    /// admission on this ring checked every ticket back to `head − reach` ([`UNSETTLED`] before
    /// any). See "Lowering" on [`SlidingWindow`].
    settled: AtomicU64,
    slots: Box<[AtomicU64]>,
}

impl SlidingWindow {
    pub(crate) fn new(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        if limit > MAX_SLIDING_LIMIT {
            return Err(ConfigError::TooLarge {
                what: "sliding window limit",
                max: "16777216 (8 bytes of ring per permit; use the sliding counter for more)",
            });
        }
        let window = nanos(window, "window")?;
        if window == 0 {
            return Err(ConfigError::Zero { what: "window" });
        }
        Ok(SlidingWindow {
            params: Params::new([pack_limits(limit, limit), window, 0]),
            capacity: limit,
            per_lap: StrengthReducedU64::new(u64::from(limit)),
        })
    }

    /// The same parameters with a ring of `max_limit.max(limit)` slots, so that a later
    /// reconfiguration can raise the limit up to it.
    pub(crate) fn with_capacity(self, max_limit: u32) -> Result<Self, ConfigError> {
        if max_limit > MAX_SLIDING_LIMIT {
            return Err(ConfigError::TooLarge {
                what: "sliding window max_limit",
                max: "16777216 (8 bytes of ring per permit; use the sliding counter for more)",
            });
        }
        let capacity = max_limit.max(self.capacity);
        Ok(SlidingWindow {
            params: self.params,
            capacity,
            per_lap: StrengthReducedU64::new(u64::from(capacity)),
        })
    }

    /// The parameters now, and the version they were published under.
    #[inline(always)]
    fn shape(&self) -> (Shape, u64) {
        let ([limits, window, outlived_until], version) = self.params.load();
        (
            Shape {
                limit: limits as u32,
                reach: (limits >> 32) as u32,
                window,
                outlived_until,
            },
            version,
        )
    }

    /// A charge of `k` tickets that an admission would refuse (some ticket they are decided on is
    /// still live): the log keeps only its N latest entries, so the charge claims every ticket
    /// the ring holds at once, R of them (its capacity: the limit, or a larger `max_limit`),
    /// `[head, head + R)`, and writes into them, in ascending order, R − N expired entries (0)
    /// and then the N latest expiries among the tickets that can still be live (`[head − N,
    /// head)`, or back to the reach while a lowering is unsettled) and the k charged ones.
    ///
    /// **Exact, and never looser.** Whatever the clock reads later, the ring then counts as many
    /// live entries as the whole log would, up to N: an entry left out expires no later than
    /// every one kept, so if it is still live, all N kept ones are (full either way), and if it
    /// has expired it counts in neither. Written in ascending order, expiries are non-decreasing
    /// in ticket order, so a later claim that finds one of ours expired knows every older one
    /// has. The old tickets all lie below `head`, where no claim looks again (the newest R
    /// tickets are ours): a chain's refund that later zeroes one of them (a positional refund)
    /// changes no decision, and a limit raised later counts the N kept entries, as the log
    /// (and Redis's sorted set, trimmed alike) does. Claiming only N tickets left the entries
    /// before them in the other R − N slots beside their copies, which a raised limit counted
    /// twice (stricter than the log). Refunded tickets (expiry 0) sort first and are the first
    /// left out. After a window was shortened the log is not in ticket order, and the sort
    /// makes it so again: tighter than the positional order, exact all the same.
    ///
    /// The protocol is the admission's: `head` was loaded before the clock was read, every slot
    /// read or overwritten must be published (else `Retry`: snooze and reload `head`), the
    /// parameters' version is re-checked before the Release CAS on `head`, and the slots are then
    /// stored with Release in ticket order. It allocates and sorts the entries (at most
    /// reach + k) and writes R slots: a cold path.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn overdraw(
        &self,
        ring: &Ring,
        p: &Shape,
        version: u64,
        head: u64,
        k: u64,
        back: u64,
        now: u64,
    ) -> Overdraw {
        let limit = p.limit as usize;
        let capacity = u64::from(self.capacity);
        let end = head + capacity;
        // Tickets below `head − N` matter only after a lowering: none has checked them then.
        let from = head.saturating_sub(back);
        let mut log = Vec::with_capacity((head - from + k) as usize);
        for ticket in from..head {
            match self.published(ring, ticket) {
                Some(expiry) => log.push(expiry),
                None => return Overdraw::Retry,
            }
        }
        // We overwrite every slot: the older tickets in them must be published too.
        if !self
            .all_published(ring, head.saturating_sub(capacity), from)
            .0
        {
            return Overdraw::Retry;
        }
        log.extend(std::iter::repeat_n(Self::expiry(now, p.window), k as usize));
        log.sort_unstable();
        // The N latest, preceded by expired entries (0) in the rest of the ring.
        let kept = log.split_off(log.len().saturating_sub(limit));
        let expired = std::iter::repeat_n(0, capacity as usize - kept.len());
        if self.params.changed(version) {
            return Overdraw::Reconfigured;
        }
        // Release on success: publishes our clock reading and the slot checks above to every
        // later claimer, as an admission's CAS does. Acquire on failure: the caller reloads
        // `head` (with Acquire) anyway; this only keeps the pair as elsewhere.
        if ring
            .head
            .compare_exchange(head, end, Ordering::Release, Ordering::Acquire)
            .is_err()
        {
            return Overdraw::Retry;
        }
        let (lap, first) = StrengthReducedU64::div_rem(head, self.per_lap);
        let (mut index, mut parity) = (first as usize, lap & 1);
        let latest = kept.last().copied().unwrap_or(0);
        for expiry in expired.chain(kept) {
            // Release: pairs with the Acquire in `published`, as an admission's store. Marked,
            // so that no refund of an older ticket ever matches it (see `OVERDRAWN`).
            ring.slots[index].store((expiry << 1) | parity | OVERDRAWN, Ordering::Release);
            index += 1;
            if index == ring.slots.len() {
                (index, parity) = (0, parity ^ 1);
            }
        }
        Overdraw::Done(Admission::new(
            now,
            wait_until(latest, now),
            self.remaining(ring, end, now, p),
        ))
    }

    /// Whether tickets `[from, to)` are all published (their writers have stored them), and the
    /// latest expiry among them.
    #[inline]
    fn all_published(&self, ring: &Ring, from: u64, to: u64) -> (bool, u64) {
        let mut latest = 0;
        let all = (from..to).all(|t| {
            self.published(ring, t)
                .map(|expiry| latest = latest.max(expiry))
                .is_some()
        });
        (all, latest)
    }

    /// The latest expiry among the published tickets `[from, to)` that may still be live, or 0:
    /// only while an admission under a longer window may outlive the newest ("Shortening" on
    /// the type). The walk starts at the `expired` hint when that is later: the tickets behind
    /// it have expired and weigh on no reset time, and walking them cost every call O(N) until
    /// `outlived_until`; it now costs the live tickets.
    #[cold]
    #[inline(never)]
    fn latest_published(&self, ring: &Ring, from: u64, to: u64) -> u64 {
        // Relaxed: a hint (see the load in `remaining`).
        let from = from.max(ring.expired.load(Ordering::Relaxed));
        (from..to)
            .filter_map(|t| self.published(ring, t))
            .max()
            .unwrap_or(0)
    }

    /// The slot of ticket `ticket` and the parity its lap writes.
    #[inline]
    fn slot<'r>(&self, ring: &'r Ring, ticket: u64) -> (&'r AtomicU64, u64) {
        let (lap, index) = StrengthReducedU64::div_rem(ticket, self.per_lap);
        (&ring.slots[index as usize], lap & 1)
    }

    /// The expiry of ticket `ticket` (0 if refunded), if its writer has published it.
    #[inline]
    fn published(&self, ring: &Ring, ticket: u64) -> Option<u64> {
        let (slot, parity) = self.slot(ring, ticket);
        // Acquire: pairs with the Release store of the slot. Whoever claimed a later ticket read this
        // slot with Acquire before its Release CAS on `head`, and we loaded `head` with Acquire, so
        // the previous lap's write happens-before this load: we cannot see an older lap (two laps
        // behind, with the right parity by accident).
        let word = slot.load(Ordering::Acquire);
        (word & 1 == parity).then_some(slot_expiry(word))
    }

    #[inline]
    fn expired(&self, ring: &Ring, ticket: u64, now: u64) -> bool {
        matches!(self.published(ring, ticket), Some(expiry) if expiry <= now)
    }

    /// The expiry stored for an admission at `now` (a clock reading capped at `MAX_TIME − 1`).
    #[inline(always)]
    fn expiry(now: u64, window: u64) -> u64 {
        now.saturating_add(window).min(MAX_TIME)
    }

    /// Permits that tickets `end`, `end + 1`, … could take at `now`, as claims decide them:
    /// N minus the tickets in `[end − N, end)` from the first live one on (ticket `end + m`
    /// needs every ticket up to `end + m − N` expired). Finds the first live ticket by galloping
    /// from the `expired` hint, so the cost is amortised O(1) per admission, O(log N) at worst.
    /// Galloping needs expiry to be a prefix in ticket order, which a shorter window breaks
    /// ("Shortening": an older ticket can outlive newer ones); until `outlived_until` the tickets
    /// are walked in order instead, from the hint, which then moves as the gallop's does. (The gallop
    /// over-counted: limit 8 with ticket 2 live among expired ones reported 8 free permits
    /// where calls could take 2.) The caller makes sure that the tickets below `end − N` have
    /// expired (a claim checked them, or [`available`](Algo::available) does).
    ///
    /// Unpublished tickets count as live; the result is exact when no admission is in flight.
    #[inline]
    fn remaining(&self, ring: &Ring, end: u64, now: u64, p: &Shape) -> u32 {
        let limit = u64::from(p.limit);
        // Relaxed: a hint, any value it ever held is a valid lower bound.
        let hint = ring.expired.load(Ordering::Relaxed);
        let low = hint.max(end.saturating_sub(limit));
        if low >= end || !self.expired(ring, low, now) {
            return (limit - (end - low.min(end))) as u32;
        }
        if now < p.outlived_until {
            return self.remaining_scan(ring, end, now, hint, low, limit);
        }
        self.remaining_gallop(ring, end, now, hint, low, limit)
    }

    /// [`remaining`](Self::remaining) while an older ticket may outlive newer ones: the first
    /// live ticket after `low` (which has expired), in ticket order. Every ticket below it has
    /// expired (those below `low` by the hint or the caller, the others were just looked at),
    /// so it becomes the hint, as the gallop's answer does: each expired ticket is walked past
    /// once, not by every call until `outlived_until` (which may be a whole old window away),
    /// and a call stops at the first live ticket.
    #[cold]
    #[inline(never)]
    fn remaining_scan(
        &self,
        ring: &Ring,
        end: u64,
        now: u64,
        hint: u64,
        low: u64,
        limit: u64,
    ) -> u32 {
        let live = (low + 1..end)
            .find(|&t| !self.expired(ring, t, now))
            .unwrap_or(end);
        if live > hint {
            // Relaxed: a hint (see the load in `remaining`).
            ring.expired.store(live, Ordering::Relaxed);
        }
        (limit - (end - live)) as u32
    }

    /// The slow part of [`remaining`](Self::remaining): `low` has expired, find the first live
    /// ticket after it.
    #[cold]
    #[inline(never)]
    fn remaining_gallop(
        &self,
        ring: &Ring,
        end: u64,
        now: u64,
        hint: u64,
        mut low: u64,
        limit: u64,
    ) -> u32 {
        // Invariant: `low` has expired; find `high`, the first live ticket (or `end`).
        let mut step = 1;
        let mut high = loop {
            let probe = low + step;
            if probe >= end {
                break end;
            }
            if !self.expired(ring, probe, now) {
                break probe;
            }
            low = probe;
            step *= 2;
        };
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if self.expired(ring, mid, now) {
                low = mid;
            } else {
                high = mid;
            }
        }
        if high > hint {
            // Relaxed: a hint (see the load).
            ring.expired.store(high, Ordering::Relaxed);
        }
        (limit - (end - high)) as u32
    }
}

/// What [`SlidingWindow::overdraw`] did.
enum Overdraw {
    /// Charged: what to answer.
    Done(Admission),
    /// A ticket it reads or overwrites is unpublished, or `head` moved: reload `head`.
    Retry,
    /// The parameters changed since the caller's snapshot: decide again under the new ones.
    Reconfigured,
}

impl Algo for SlidingWindow {
    type Cell = Ring;

    fn cell(&self) -> Ring {
        Ring {
            head: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            settled: AtomicU64::new(UNSETTLED),
            slots: (0..self.capacity)
                .map(|_| AtomicU64::new(UNWRITTEN))
                .collect(),
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
        ring: &Ring,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        self.run::<C, COMMIT, false>(ring, n, clock)
    }

    /// Overwrites the admission's tickets with expiry 0 ("refunded", lap parity kept), each only
    /// if its slot still holds exactly the word the admission wrote. See the type's docs for why
    /// this is positional (conservative) and why claims stay exact.
    ///
    /// The token names the first ticket's slot and lap parity; the admission's `at` gives the
    /// expiry it stored. A slot holding anything else has been taken by ticket k + N (our ticket
    /// had expired, so there is nothing left to give back): ticket k + 2N carries k's parity but
    /// an expiry at least W later, so the comparison cannot mistake it for ours. A
    /// [charge](Charge::charge) that overdraws claims tickets past live ones, so two of them can
    /// bring ours back to a word equal to ours (our parity, and our expiry when the clock has
    /// not moved): its words carry [`OVERDRAWN`], which no refund expects. A refund after an
    /// overdraw over our tickets therefore gives nothing back (stricter, never looser: the
    /// overdraw kept the log's N latest expiries, ours among them or later ones). Nothing is
    /// written if the ring is retired or our tickets have expired (the ring was then possibly
    /// judged idle; refunding an expired ticket would change no decision anyway).
    ///
    /// **Reconfigured since.** The token carries the parameters' version (7 bits of it); under
    /// another one nothing is given back (conservative), as with the other algorithms. The
    /// expiry comparison alone does not cover it: it recomputes the expiry with the window *now*,
    /// and after two window changes a later lap's ticket in our slot (same parity, admitted once
    /// ours had expired under its shorter window) can hold exactly that expiry; zeroing it would
    /// free a live permit (`refund_after_window_changes_leaves_a_later_laps_ticket_alone`). The
    /// version bits wrap after 128 reconfigurations, which then leaves only that coincidence: a
    /// chain's refund follows its commit at once, and a receipt's (`refund::Refundable`), which
    /// can come any time later, also compares the version in full, under the reconfiguration
    /// mutex (`RateLimiter::receipt_refund`).
    fn refund<C: Clock>(&self, ring: &Ring, n: u32, admission: &Admission, clock: &C) {
        let (p, version) = self.shape();
        if admission.token() & TOKEN_VERSION != token_version(version) {
            return;
        }
        let expiry = Self::expiry(admission.at_nanos(), p.window);
        // Acquire: as in `try_acquire`: our clock read comes after the last claimer's. Capped as
        // every decision's is: past the cap the admission's time (capped) and ours are one, and
        // its saturated expiry never passes; compared uncapped, it had always passed.
        let now = clock.now().min(MAX_TIME - 1);
        if ring.head.load(Ordering::Acquire) == RETIRED || expiry <= now {
            return;
        }
        let token = admission.token();
        let mut index = (token & TOKEN_INDEX) as usize;
        let mut parity = u64::from(token & TOKEN_PARITY != 0);
        for _ in 0..n {
            // Release on success: pairs with the Acquire in `published`, like a claim's store, so
            // that whoever claims over our zero sees everything before it. Relaxed on failure: the
            // slot has moved on to a later lap; there is nothing to give back.
            let _ = ring.slots[index].compare_exchange(
                (expiry << 1) | parity,
                parity,
                Ordering::Release,
                Ordering::Relaxed,
            );
            index += 1;
            if index == ring.slots.len() {
                (index, parity) = (0, parity ^ 1);
            }
        }
    }

    fn exact_refund(&self) -> bool {
        false
    }

    #[cfg(feature = "store")]
    fn save(ring: &Ring) -> Vec<u64> {
        let mut words = vec![
            ring.head.load(Ordering::Relaxed),
            ring.expired.load(Ordering::Relaxed),
        ];
        words.extend(ring.slots.iter().map(|s| s.load(Ordering::Relaxed)));
        words
    }

    #[cfg(feature = "store")]
    fn restore(&self, words: &[u64]) -> Option<Ring> {
        let [head, expired, slots @ ..] = words else {
            return None;
        };
        if *head == RETIRED || slots.len() != self.capacity as usize || expired > head {
            return None;
        }
        // A ring as `save` writes it after a finished decision: every ticket below `head` was
        // published, so the R tickets before it show their own lap's parity. One that does not
        // (a corrupt value, another layout) would make a decision wait forever for a writer
        // "between claim and publish" that does not exist: it is not this algorithm's state.
        let laps = slots.len() as u64;
        let published = |t: u64| slots[(t % laps) as usize] & 1 == (t / laps) & 1;
        if !(head.saturating_sub(laps)..*head).all(published) {
            return None;
        }
        // A head beyond 2^62 (far beyond any real count: a foreign value) would let claims
        // overflow near `u64::MAX`. Moved back by whole pairs of laps, every ticket keeps its
        // slot and its lap's parity, so the ring decides as it stands, and what is saved after
        // the decision is read again. (Refused, a ring just below the bound was read as no state
        // once a write had taken its head past it.)
        let back = if *head > 1 << 62 {
            (head - laps) / (2 * laps) * (2 * laps)
        } else {
            0
        };
        Some(Ring {
            head: AtomicU64::new(head - back),
            expired: AtomicU64::new(expired.saturating_sub(back)),
            // Its tickets may have been claimed under any limit up to R: check back as far
            // as the reach once, as after a lowering.
            settled: AtomicU64::new(UNSETTLED),
            slots: slots.iter().map(|&s| AtomicU64::new(s)).collect(),
        })
    }

    #[cfg(all(test, not(turnstile_loom)))]
    fn words(ring: &Ring) -> Vec<u64> {
        let mut words = vec![
            ring.head.load(Ordering::Relaxed),
            ring.expired.load(Ordering::Relaxed),
        ];
        words.extend(ring.slots.iter().map(|s| s.load(Ordering::Relaxed)));
        words
    }

    /// At most the limit in any window's length: of `limit + extra` admitted one after another
    /// from `now` on, admission `i + limit` comes at least a window after admission `i`. So the
    /// last comes `⌈extra / limit⌉` windows after the first (at `now` at the earliest), and
    /// `⌊extra / limit⌋` windows after the limit-th, which is no earlier than the time the
    /// limit fits at once (`at_limit`: every live ticket must have expired by then).
    fn beyond_limit(&self, now: u64, at_limit: u64, extra: u64) -> u64 {
        let p = self.shape().0;
        let limit = u64::from(p.limit.max(1));
        let from_first = extra.div_ceil(limit).saturating_mul(p.window);
        let from_limit = at_limit.saturating_add((extra / limit).saturating_mul(p.window));
        let wait = from_first.max(from_limit);
        // Readings stop at `MAX_TIME − 1`: a later time never comes.
        if now.min(MAX_TIME - 1).saturating_add(wait) >= MAX_TIME {
            wait.max(super::NEVER)
        } else {
            wait
        }
    }

    /// As a probe's `remaining`, without deciding: after a lowering, while the ring is not
    /// settled under the current parameters, a live ticket among `[head − reach, head − N)`
    /// refuses every call ("Lowering" on the type), so none is free; it reported the newest N
    /// tickets' free permits (limit 2 lowered to 1, ticket 0 live and ticket 1 expired: 1 free,
    /// where every call was refused). That scan (at most reach − N slots) is paid by each call
    /// until an admission settles the ring.
    fn available(&self, ring: &Ring, now: u64) -> u32 {
        let now = now.min(MAX_TIME - 1);
        let (p, version) = self.shape();
        let lowered = p.limit < p.reach;
        // Acquire: as in `run` (read before `head`): an admission that stored our version
        // checked every ticket below the `head` we then load, back to the reach.
        let settled = lowered && ring.settled.load(Ordering::Acquire) == version;
        // Acquire: as in `run`, so the slots we read are at least as new as `head`.
        match ring.head.load(Ordering::Acquire) {
            RETIRED => p.limit,
            head => {
                let unchecked = head.saturating_sub(u64::from(p.reach))
                    ..head.saturating_sub(u64::from(p.limit));
                if lowered && !settled && !unchecked.into_iter().all(|t| self.expired(ring, t, now))
                {
                    return 0;
                }
                self.remaining(ring, head, now, &p)
            }
        }
    }

    fn retire_unless<C: Clock>(
        &self,
        ring: &Ring,
        clock: &C,
        waited: impl FnOnce() -> bool,
    ) -> Result<(), u64> {
        // Acquire: as in `try_acquire`: the newest ticket's slot write, and our clock read, come
        // after its claimer's clock read.
        let head = ring.head.load(Ordering::Acquire);
        let now = clock.now().min(MAX_TIME - 1);
        if head == RETIRED {
            // Retired by a reset (`retire_now`), which counts it: not ours to count.
            return Err(now);
        }
        if head == 0 {
            // Never used: its inserter is about to admit on it (see `Algo::retire`).
            return Err(now);
        }
        // Times are non-decreasing in ticket order, so the newest ticket expires last; refunded
        // tickets (expiry 0) are skipped, since they say nothing about the older ones. A writer
        // still between claim and publish makes the ring busy; look again shortly. Until
        // `outlived_until` an older ticket can outlive the newest ("Shortening"): every slot is
        // looked at then, and the ring is busy until the latest expiry among them (the first
        // live one met, walking back, could expire before an older one: a sweep told to come
        // back then found the ring busy still).
        let outlived = now < self.shape().0.outlived_until;
        let mut busy_until = None;
        for ticket in (head.saturating_sub(u64::from(self.capacity))..head).rev() {
            match self.published(ring, ticket) {
                Some(0) => continue,
                Some(expiry) if expiry <= now => {
                    if outlived {
                        continue;
                    }
                    break;
                }
                Some(expiry) if outlived => busy_until = busy_until.max(Some(expiry)),
                Some(expiry) => return Err(expiry),
                None => return Err(now),
            }
        }
        if let Some(expiry) = busy_until {
            return Err(expiry);
        }
        if waited() {
            // Idle, but its key has waiters queued: not evicted (see `Algo::retire_unless`).
            return Err(now);
        }
        // Release on success: as in the fixed window's `retire`. Relaxed on failure: busy.
        ring.head
            .compare_exchange(head, RETIRED, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| now)
    }

    /// New parameters, published in one step (no slot is written): the limit can move anywhere
    /// in 1..=R (the ring's capacity; beyond it a typed error), a new window applies to
    /// admissions made from now on, and every admission already in the ring keeps the expiry
    /// it was admitted with. The reach becomes the larger of the old reach and the new limit
    /// (see "Lowering" on the type); a shorter window moves `outlived_until` to the latest
    /// expiry an admission under the old one can have ("Shortening").
    fn reconfigure<C: Clock>(
        &self,
        to: &Self,
        clock: &C,
        _cells: EachCell<'_, Ring>,
    ) -> Result<(), ConfigError> {
        let target = to.shape().0;
        if target.limit > self.capacity {
            return Err(ConfigError::AboveMaxLimit {
                limit: target.limit,
                max_limit: self.capacity,
            });
        }
        // Under the caller's mutex: the words are the last ones stored.
        let [limits, window, outlived_until] = self.params.current();
        let reach = ((limits >> 32) as u32).max(target.limit);
        // The old parameters are closed before the clock is read (`Params::begin`): every call
        // that commits under them read its clock before `now`, so its admission expires by
        // `now + window`.
        let writing = self.params.begin();
        let now = clock.now().min(MAX_TIME - 1);
        let outlived_until = if target.window < window {
            outlived_until.max(Self::expiry(now, window))
        } else {
            outlived_until
        };
        writing.finish([
            pack_limits(target.limit, reach),
            target.window,
            outlived_until,
        ]);
        Ok(())
    }

    fn retired(ring: &Ring) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        ring.head.load(Ordering::Relaxed) == RETIRED
    }
}

/// min(n, N) tickets stamped now: taken as an admission would take them when they fit, else
/// [overdrawn](SlidingWindow::overdraw) (the ring keeps the N latest expiries of the log).
impl Charge for SlidingWindow {
    /// [`Algo::decide`] (`CHARGE` off) and [`Charge::charge`] (`COMMIT` and `CHARGE` on): one
    /// protocol. A charge of n takes min(n, N) tickets exactly as an admission would when they
    /// fit; where an admission would be rejected, it [overdraws](Self::overdraw) instead.
    #[inline(always)]
    fn run<C: Clock, const COMMIT: bool, const CHARGE: bool>(
        &self,
        ring: &Ring,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        let spin = Spin::new();
        'params: loop {
            let (p, version) = self.shape();
            if !CHARGE && n > p.limit {
                return Err(too_big(n, p.limit));
            }
            let want = u64::from(if CHARGE {
                n.clamp(1, p.limit)
            } else {
                n.max(1)
            });
            let limit = u64::from(p.limit);
            let capacity = u64::from(self.capacity);
            // How far back the tickets we are decided on may hide live ones ("Lowering" in the
            // type's docs): N on the common path, without touching `settled`. Read before `head`.
            let lowered = p.limit < p.reach;
            // Acquire: pairs with the Release store of `settled` after an admission's CAS on
            // `head`, so that CAS happens before our load of `head` below: the `head` we decide
            // on is at or after the admission that checked back to its reach under `version`,
            // and every claim since (parameters never go back along `head`) ran under it too.
            let settled = lowered && ring.settled.load(Ordering::Acquire) == version;
            let back = if lowered && !settled {
                u64::from(p.reach)
            } else {
                limit
            };
            // Acquire: pairs with the Release CAS of every earlier claim (a release sequence of
            // RMWs): their clock reads and slot checks happen before our clock read and slot
            // loads.
            let mut head = ring.head.load(Ordering::Acquire);
            loop {
                if head == RETIRED {
                    return Err(TryAcquireError::Closed);
                }
                let now = clock.now().min(MAX_TIME - 1);
                let end = head + want;
                if end > limit {
                    // Every ticket we are decided on must have expired. Times are
                    // non-decreasing in ticket order, so the newest decides, unless it was
                    // refunded (expiry 0) or admitted under a longer window: those expire out
                    // of order, so the others are checked too.
                    let newest = end - 1 - limit;
                    let published = match self.published(ring, newest) {
                        // A charge is never rejected: it overdraws (n = 0: it reports).
                        Some(expiry) if CHARGE && expiry > now => {
                            n == 0
                                || match self.overdraw(ring, &p, version, head, want, back, now) {
                                    Overdraw::Done(charged) => return Ok(charged),
                                    Overdraw::Reconfigured => continue 'params,
                                    Overdraw::Retry => false,
                                }
                        }
                        Some(expiry) if expiry > now => {
                            // Older tickets expire no later (or were refunded), unless admitted
                            // under a longer window: then the latest of them is when a retry
                            // succeeds. (Empty for one permit; writes nothing.) After a
                            // lowering the unchecked tickets before this range are not read
                            // here, to keep rejections cheap (see "Lowering").
                            let latest = (head.saturating_sub(limit)..newest)
                                .filter_map(|t| self.published(ring, t))
                                .fold(expiry, u64::max);
                            return Err(TryAcquireError::Rejected(Rejection::new(
                                wait_until(latest, now),
                                p.limit,
                            )));
                        }
                        Some(_) => {
                            // Every slot we overwrite must hold its own ticket's write, not only
                            // the newest: a writer of an older one that is still between claim
                            // and publish would otherwise store its time over our lap later.
                            let (mut all, mut latest) =
                                self.all_published(ring, head.saturating_sub(limit), newest);
                            if all && latest <= now && back > limit {
                                // Lowered and not yet settled: the older tickets that no claim
                                // under our limit has checked must have expired too. Not scanned
                                // when the range above already refuses (rejections stay cheap).
                                (all, latest) = self.all_published(
                                    ring,
                                    head.saturating_sub(back),
                                    head.saturating_sub(limit),
                                );
                            }
                            if all && latest > now {
                                // Only after a refund in place (or a shorter window): an older
                                // ticket outlives the newest.
                                if !CHARGE {
                                    return Err(TryAcquireError::Rejected(Rejection::new(
                                        wait_until(latest, now),
                                        p.limit,
                                    )));
                                }
                                n == 0
                                    || match self.overdraw(ring, &p, version, head, want, back, now)
                                    {
                                        Overdraw::Done(charged) => return Ok(charged),
                                        Overdraw::Reconfigured => continue 'params,
                                        Overdraw::Retry => false,
                                    }
                            } else {
                                // With a ring larger than the limit, the slots we overwrite
                                // hold older tickets than those we decided on: they too must be
                                // published.
                                all && (capacity == limit
                                    || end <= capacity
                                    || self
                                        .all_published(
                                            ring,
                                            head.saturating_sub(capacity),
                                            end - capacity,
                                        )
                                        .0)
                            }
                        }
                        None => false,
                    };
                    if !published {
                        // A writer is between claim and publish: never decide on a stale slot.
                        spin.snooze();
                        // Acquire: as above.
                        head = ring.head.load(Ordering::Acquire);
                        continue;
                    }
                }
                if n == 0 || !COMMIT {
                    // The newest ticket expires last, unless it was refunded (expiry 0, which
                    // says nothing about the older ones): then the newest one that was not.
                    // Read as 0, a refunded newest ticket reported the ring full again at once
                    // while older admissions still held permits. The tickets before `head −
                    // back` have expired (the claims checked them).
                    let mut latest = (head.saturating_sub(back)..head)
                        .rev()
                        .filter_map(|t| self.published(ring, t))
                        .find(|&expiry| expiry != 0)
                        .unwrap_or(0);
                    if now < p.outlived_until {
                        // An older ticket may outlive the newest ("Shortening").
                        latest = latest.max(self.latest_published(
                            ring,
                            head.saturating_sub(back),
                            head,
                        ));
                    }
                    let reset = wait_until(latest, now);
                    // A check (n > 0) only needs the verdict; `remaining` may store its hint,
                    // and a check writes nothing.
                    let remaining = if n == 0 {
                        self.remaining(ring, head, now, &p)
                    } else {
                        0
                    };
                    return Ok(Admission::new(now, reset, remaining));
                }
                if self.params.changed(version) {
                    // Reconfigured since our snapshot: decide again under the new parameters.
                    continue 'params;
                }
                // Release on success: publishes our clock reading and the slot check above to
                // every later claimer. Acquire on failure: as for the first load.
                match ring.head.compare_exchange_weak(
                    head,
                    end,
                    Ordering::Release,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        let expiry = Self::expiry(now, p.window);
                        let (lap, first) = StrengthReducedU64::div_rem(head, self.per_lap);
                        let mut index = first as usize;
                        let mut parity = lap & 1;
                        for _ in head..end {
                            // Release: pairs with the Acquire in `published`.
                            ring.slots[index].store((expiry << 1) | parity, Ordering::Release);
                            index += 1;
                            if index == ring.slots.len() {
                                (index, parity) = (0, parity ^ 1);
                            }
                        }
                        if back > limit {
                            // (A charge that got here took its tickets as an admission would,
                            // checks included: it may settle the ring too.)
                            // We checked every ticket below `end − N`: later claims under this
                            // version need only their usual range. Release: pairs with the
                            // Acquire load of `settled`, so our CAS on `head` happens before
                            // whatever `head` a reader of this value then loads. Stored after
                            // the slots so that the claim-to-publish gap stays short.
                            ring.settled.store(version, Ordering::Release);
                        }
                        let token = first as u32
                            | token_version(version)
                            | if lap & 1 == 1 { TOKEN_PARITY } else { 0 };
                        let mut reset = wait_until(Self::expiry(now, p.window), now);
                        if now < p.outlived_until {
                            // Full again when the latest of the live tickets expires, which may
                            // be an older one ("Shortening"); every ticket below `end − N` has
                            // expired (we or the claims before us checked).
                            let older =
                                self.latest_published(ring, end.saturating_sub(limit), head);
                            reset = reset.max(wait_until(older, now));
                        }
                        return Ok(Admission::with_token(
                            now,
                            reset,
                            self.remaining(ring, end, now, &p),
                            token,
                        ));
                    }
                    Err(actual) => head = actual,
                }
            }
        }
    }
}

/// A never-used ring has handed out no ticket: `head` is 0 (every claim moves it up).
#[cfg(feature = "keyed")]
impl crate::keyed::Unused for SlidingWindow {
    fn unused(ring: &Ring) -> bool {
        // Relaxed: a hint; `retire_unused`'s CAS decides.
        ring.head.load(Ordering::Relaxed) == 0
    }

    fn retire_unused(ring: &Ring) -> bool {
        // Release on success, as `retire`'s. Relaxed on failure: a claim landed; the ring is
        // used and stays.
        ring.head
            .compare_exchange(0, RETIRED, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    fn retire_now(ring: &Ring) -> bool {
        // A writer between its claim and its publish keeps its ticket (it was admitted before
        // the reset); its slot write lands in the dead ring.
        super::retire_word(&ring.head, |head| head == 0)
    }

    /// A ring without slots. A call for zero permits on a ring that has handed out no ticket
    /// (`head` 0) is decided for one permit, ticket 0, which is decided on no earlier ticket
    /// (the limit is at least 1), so it reads no slot; `remaining` and the reset time look at
    /// tickets below `head` only, of which there are none. Such a call therefore answers on it
    /// exactly as on a fresh ring, without allocating one (8 bytes per permit).
    fn probe_cell(&self) -> Ring {
        Ring {
            head: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            settled: AtomicU64::new(UNSETTLED),
            slots: Box::new([]),
        }
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    fn retry_after(result: Result<Admission, TryAcquireError>) -> u64 {
        match result {
            Err(TryAcquireError::Rejected(r)) => r.retry_after_nanos(),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn lower(algo: &SlidingWindow, ring: &Ring, limit: u32, window: u64, clock: &ManualClock) {
        let to = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
        algo.reconfigure(&to, clock, &|each| each(ring)).unwrap();
    }

    /// Limit 2: ticket 0 kept, ticket 1 refunded; then the limit is lowered to 1. Ticket 2 is
    /// decided on ticket 1 (2 − N), a refund hole, while ticket 0 is still live: the next call
    /// must be refused (one live admission already fills limit 1), and stay refused until
    /// ticket 0 expires. (A refund after the lowering gives nothing back: see `refund`.)
    #[test]
    fn refund_after_lowering_does_not_hide_older_live_tickets() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(2, Duration::from_nanos(10)).unwrap();
        let ring = algo.cell();
        algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 0, kept
        let held = algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 1, held
        algo.refund(&ring, 1, &held, &clock);
        lower(&algo, &ring, 1, 10, &clock);
        assert_eq!(
            retry_after(algo.try_acquire(&ring, 1, &clock)),
            10,
            "admitted a second live permit under limit 1"
        );
        assert!(algo.check(&ring, 1, &clock).is_err(), "check admits");
        assert!(algo.try_acquire(&ring, 0, &clock).is_err(), "probe admits");
        clock.advance(Duration::from_nanos(9));
        assert!(algo.try_acquire(&ring, 1, &clock).is_err());
        clock.advance(Duration::from_nanos(1));
        algo.try_acquire(&ring, 1, &clock).unwrap();
        assert!(algo.try_acquire(&ring, 1, &clock).is_err());
    }

    /// A refund that comes after the window was changed, and changed again to a length that
    /// makes the admission's time plus the current window equal a later ticket's expiry, must
    /// not take that ticket's permit: limit 1, ticket 0 held at 0 (expiry 10); the window goes
    /// to 1, ticket 1 at 10 (expiry 11); to 50, ticket 2 at 11 (expiry 61, ticket 0's slot and
    /// parity); to 61. Ticket 0's refund then computes expiry 0 + 61, ticket 2's word.
    #[test]
    fn refund_after_window_changes_leaves_a_later_laps_ticket_alone() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(1, Duration::from_nanos(10)).unwrap();
        let ring = algo.cell();
        let held = algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 0
        lower(&algo, &ring, 1, 1, &clock);
        clock.advance(Duration::from_nanos(10));
        algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 1, expires at 11
        clock.advance(Duration::from_nanos(1));
        lower(&algo, &ring, 1, 50, &clock);
        algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 2, expires at 61
        lower(&algo, &ring, 1, 61, &clock);
        algo.refund(&ring, 1, &held, &clock);
        assert_eq!(
            retry_after(algo.try_acquire(&ring, 1, &clock)),
            50,
            "ticket 2 is live until 61: limit 1 is full"
        );
    }

    /// Two overdrawing charges at one clock reading bring a held admission's slot back to its
    /// own parity and expiry (limit 1: ticket 0 held, tickets 1 and 2 charged, all expiring at
    /// 4). Its refund must not match the second charge's word: that freed the charged permit,
    /// and the ring admitted what a twin that saw only the two charges refuses (found by the
    /// `sliding_window_refunds` property).
    #[test]
    fn a_refund_after_two_overdraws_leaves_the_charges_alone() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(1, Duration::from_nanos(4)).unwrap();
        let ring = algo.cell();
        let held = algo.try_acquire(&ring, 1, &clock).unwrap();
        algo.charge(&ring, 1, &clock).unwrap();
        algo.charge(&ring, 1, &clock).unwrap();
        algo.refund(&ring, 1, &held, &clock);
        assert_eq!(
            retry_after(algo.try_acquire(&ring, 1, &clock)),
            4,
            "the charges fill the window until 4"
        );
        clock.advance(Duration::from_nanos(4));
        algo.try_acquire(&ring, 1, &clock).unwrap();
    }

    /// The same hole without a refund: after a window shrink a newer ticket expires before an
    /// older one, so once the limit is lowered the ticket at head − N can have expired while an
    /// older one is still live.
    #[test]
    fn window_shrink_after_lowering_does_not_hide_older_live_tickets() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(2, Duration::from_nanos(10)).unwrap();
        let ring = algo.cell();
        algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 0, expires at 10
        lower(&algo, &ring, 2, 1, &clock);
        algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 1, expires at 1
        lower(&algo, &ring, 1, 1, &clock);
        clock.advance(Duration::from_nanos(1));
        // Ticket 0 is live until 10: limit 1 is full.
        assert_eq!(retry_after(algo.try_acquire(&ring, 1, &clock)), 9);
        clock.advance(Duration::from_nanos(9));
        algo.try_acquire(&ring, 1, &clock).unwrap();
    }

    /// After a lowering, the first admission on a ring settles it: later decisions check only
    /// the N newest tickets again, and stay exact (limit 1 paces one per window).
    #[test]
    fn lowered_ring_settles_and_stays_exact() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(4, Duration::from_nanos(10)).unwrap();
        let ring = algo.cell();
        for _ in 0..4 {
            algo.try_acquire(&ring, 1, &clock).unwrap();
        }
        lower(&algo, &ring, 1, 10, &clock);
        assert_eq!(retry_after(algo.try_acquire(&ring, 1, &clock)), 10);
        assert_eq!(
            ring.settled.load(Ordering::Relaxed),
            UNSETTLED,
            "a rejection wrote"
        );
        for round in 0..10 {
            clock.advance(Duration::from_nanos(10));
            algo.try_acquire(&ring, 1, &clock).unwrap();
            assert_ne!(ring.settled.load(Ordering::Relaxed), UNSETTLED);
            assert_eq!(retry_after(algo.try_acquire(&ring, 1, &clock)), 10);
            if round == 5 {
                // Any new version unsettles the ring again (the reach stays 4).
                lower(&algo, &ring, 1, 10, &clock);
                assert_eq!(algo.shape().0.reach, 4);
            }
        }
    }

    /// One step of [`never_more_live_than_the_limit_in_force`].
    #[derive(Debug, Clone)]
    enum Step {
        Keep(u32),
        Hold(u32),
        Refund(usize),
        Limit(u32),
        Window(u64),
        Advance(u64),
    }

    /// A limit, a ring capacity of at least it (a `max_limit`), and steps within that capacity.
    fn steps() -> impl Strategy<Value = (u32, u32, Vec<Step>)> {
        (1u32..5, 0u32..4).prop_flat_map(|(limit, extra)| {
            let capacity = limit + extra;
            (
                Just(limit),
                Just(capacity),
                prop::collection::vec(step(capacity), 1..60),
            )
        })
    }

    fn step(capacity: u32) -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (1..=capacity).prop_map(Step::Keep),
            3 => (1..=capacity).prop_map(Step::Hold),
            3 => any::<usize>().prop_map(Step::Refund),
            2 => (1..=capacity).prop_map(Step::Limit),
            1 => (1u64..30).prop_map(Step::Window),
            3 => (0u64..15).prop_map(Step::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Whatever sequence of admissions, refunds, limit and window changes: after every
        /// admission, the permits still live (admitted, not refunded, before their expiry) are
        /// at most the limit in force. The refund only gives back while the parameters are
        /// the ones the admission was made under (see `refund`), and so does the model.
        #[test]
        fn never_more_live_than_the_limit_in_force(
            (limit, capacity, steps) in steps()
        ) {
            let clock = ManualClock::new();
            let mut window = 10;
            let algo = SlidingWindow::new(limit, Duration::from_nanos(window))
                .unwrap()
                .with_capacity(capacity)
                .unwrap();
            let ring = algo.cell();
            let mut limit = limit;
            // Reconfigurations so far.
            let mut version = 0;
            // (expiry, n, version admitted under, admission) of every admission not refunded.
            let mut live: Vec<(u64, u32, u64, Option<Admission>)> = Vec::new();
            for step in steps {
                match step {
                    Step::Keep(n) | Step::Hold(n) => {
                        if let Ok(admission) = algo.try_acquire(&ring, n, &clock) {
                            let now = clock.now();
                            let held = matches!(step, Step::Hold(_)).then_some(admission);
                            live.push((now + window, n, version, held));
                            let in_force: u32 = live
                                .iter()
                                .filter(|&&(expiry, ..)| expiry > now)
                                .map(|&(_, n, ..)| n)
                                .sum();
                            prop_assert!(
                                in_force <= limit,
                                "{in_force} live permits under limit {limit} at {now}: {live:?}"
                            );
                        }
                    }
                    Step::Refund(which) => {
                        let held: Vec<usize> = (0..live.len()).filter(|&i| live[i].3.is_some()).collect();
                        if let Some(&i) = held.get(which % held.len().max(1)) {
                            let (_, n, admitted_under, admission) = live[i];
                            algo.refund(&ring, n, &admission.unwrap(), &clock);
                            if admitted_under == version {
                                live.swap_remove(i);
                            } else {
                                live[i].3 = None;
                            }
                        }
                    }
                    Step::Limit(to) => {
                        limit = to;
                        version += 1;
                        let to = SlidingWindow::new(to, Duration::from_nanos(window)).unwrap();
                        algo.reconfigure(&to, &clock, &|each| each(&ring)).unwrap();
                    }
                    Step::Window(to) => {
                        window = to;
                        version += 1;
                        let to = SlidingWindow::new(limit, Duration::from_nanos(to)).unwrap();
                        algo.reconfigure(&to, &clock, &|each| each(&ring)).unwrap();
                    }
                    Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
                }
            }
        }
    }

    /// The slotless ring a keyed limiter answers a probe for an unknown key on reads as a fresh
    /// one, whatever the parameters went through (a raise, a lowering, a shrink).
    #[cfg(feature = "keyed")]
    #[test]
    fn a_probe_cell_answers_zero_permit_calls_as_a_fresh_ring() {
        use crate::keyed::Unused;
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(3, Duration::from_nanos(10))
            .unwrap()
            .with_capacity(5)
            .unwrap();
        let ring = algo.cell();
        for (limit, window) in [(3, 10), (5, 10), (2, 10), (2, 4), (4, 1)] {
            lower(&algo, &ring, limit, window, &clock);
            clock.advance(Duration::from_nanos(1));
            let probe = algo.probe_cell();
            assert!(probe.slots.is_empty());
            let fresh = algo.cell();
            assert_eq!(
                algo.try_acquire(&probe, 0, &clock).unwrap(),
                algo.try_acquire(&fresh, 0, &clock).unwrap()
            );
            assert_eq!(
                algo.charge(&probe, 0, &clock).unwrap(),
                algo.charge(&fresh, 0, &clock).unwrap()
            );
            assert_eq!(
                SlidingWindow::words(&fresh),
                SlidingWindow::words(&algo.cell()),
                "a probe wrote"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Whatever sequence of admissions, charges, limit and window changes (no refunds: a
        /// refund hole among live tickets over-counts, as documented on the type): what the
        /// ring reports free (`available`, a probe's `remaining`) is exactly how many permits
        /// one call could take now, as the decisions (`check`) see it.
        #[test]
        fn remaining_is_what_a_call_could_take(
            (limit, capacity, steps) in steps()
        ) {
            let clock = ManualClock::new();
            let mut window = 10;
            let algo = SlidingWindow::new(limit, Duration::from_nanos(window))
                .unwrap()
                .with_capacity(capacity)
                .unwrap();
            let ring = algo.cell();
            let mut limit = limit;
            for step in steps {
                match step {
                    Step::Keep(n) => {
                        let _ = algo.try_acquire(&ring, n, &clock);
                    }
                    Step::Hold(n) => {
                        algo.charge(&ring, n, &clock).unwrap();
                    }
                    Step::Refund(_) => {}
                    Step::Limit(to) => {
                        limit = to;
                        lower(&algo, &ring, to, window, &clock);
                    }
                    Step::Window(to) => {
                        window = to;
                        lower(&algo, &ring, limit, to, &clock);
                    }
                    Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
                }
                let could = (1..=limit)
                    .take_while(|&n| algo.check(&ring, n, &clock).is_ok())
                    .count() as u32;
                prop_assert_eq!(algo.available(&ring, clock.now()), could, "available");
                let probe = algo.try_acquire(&ring, 0, &clock).map(|a| a.remaining());
                prop_assert_eq!(probe.unwrap_or(0), could, "probe");
            }
        }
    }

    /// After a window shrink `remaining` walks the tickets in order (an older one can outlive
    /// newer ones); the expired ones it walked past go behind the `expired` hint, as after a
    /// gallop, so that the next call starts after them. Left behind, every admission walked
    /// them all again until `outlived_until`: O(N) per call for as long as the old window
    /// (a day-long window shortened at limit 100,000 cost each admission 100,000 loads a day).
    #[test]
    fn remaining_after_a_shrink_moves_the_hint_past_expired_tickets() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(8, Duration::from_nanos(100)).unwrap();
        let ring = algo.cell();
        lower(&algo, &ring, 8, 10, &clock); // outlived until 100
        algo.try_acquire(&ring, 8, &clock).unwrap(); // tickets 0..8, expire at 10
        clock.advance(Duration::from_nanos(20));
        let admission = algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 8, expires at 30
        assert_eq!(admission.remaining(), 7);
        assert_eq!(
            SlidingWindow::words(&ring)[1],
            8,
            "the expired tickets 0..8 stay ahead of the hint"
        );
        assert_eq!(algo.available(&ring, clock.now()), 7);
    }

    /// After a window shrink the reset time is the latest expiry among the live tickets, found
    /// by walking them: from the `expired` hint, since every ticket behind it has expired and
    /// weighs on no reset. Walked from `head − N`, every admission read every expired ticket
    /// again until `outlived_until`, as `remaining` did. The slot planted behind the hint
    /// (a state no claim makes) shows which tickets the walk reads.
    #[test]
    fn reset_after_a_shrink_walks_no_ticket_behind_the_hint() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(8, Duration::from_nanos(100)).unwrap();
        let ring = algo.cell();
        lower(&algo, &ring, 8, 10, &clock); // outlived until 100
        algo.try_acquire(&ring, 8, &clock).unwrap(); // tickets 0..8, expire at 10
        clock.advance(Duration::from_nanos(20));
        algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 8, expires at 30
        assert_eq!(
            SlidingWindow::words(&ring)[1],
            8,
            "the hint moved past 0..8"
        );
        // Ticket 3 (lap 0, parity 0) behind the hint, as if it expired at 90.
        ring.slots[3].store(90 << 1, Ordering::Relaxed);
        let probe = algo.try_acquire(&ring, 0, &clock).unwrap();
        assert_eq!(
            probe.reset_after(),
            Duration::from_nanos(10),
            "probe read behind the hint"
        );
        let admission = algo.try_acquire(&ring, 1, &clock).unwrap(); // ticket 9, expires at 30
        assert_eq!(
            admission.reset_after(),
            Duration::from_nanos(10),
            "admission read behind the hint"
        );
    }

    /// After a window shrink an older ticket outlives a newer one: retiring's busy-until is the
    /// latest expiry in the ring, not the newest live ticket's. Window 100: ticket 0 at 0
    /// (expiry 100); shrunk to 10: ticket 1 at 1 (expiry 11). Retire said "busy until 11", and
    /// at 11 "busy until 100".
    #[test]
    fn retire_after_a_shrink_is_busy_until_the_latest_expiry() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(2, Duration::from_nanos(100)).unwrap();
        let ring = algo.cell();
        algo.try_acquire(&ring, 1, &clock).unwrap();
        lower(&algo, &ring, 2, 10, &clock);
        clock.advance(Duration::from_nanos(1));
        algo.try_acquire(&ring, 1, &clock).unwrap();
        assert_eq!(algo.retire(&ring, &clock), Err(100));
        clock.set(Duration::from_nanos(99));
        assert_eq!(algo.retire(&ring, &clock), Err(100));
        clock.set(Duration::from_nanos(100));
        assert_eq!(algo.retire(&ring, &clock), Ok(()));
    }

    /// After a window shrink an older ticket outlives a newer one; a multi-permit rejection
    /// must not point at the newer ticket's expiry, or the retry is rejected again.
    #[test]
    fn multi_permit_retry_after_waits_for_longer_lived_older_tickets() {
        let clock = ManualClock::new();
        let algo = SlidingWindow::new(2, Duration::from_nanos(10)).unwrap();
        let ring = algo.cell();
        algo.try_acquire(&ring, 1, &clock).unwrap(); // expires at 10
        let shorter = SlidingWindow::new(2, Duration::from_nanos(1)).unwrap();
        algo.reconfigure(&shorter, &clock, &|each| each(&ring))
            .unwrap();
        algo.try_acquire(&ring, 1, &clock).unwrap(); // expires at 1
        let wait = retry_after(algo.try_acquire(&ring, 2, &clock));
        clock.advance(Duration::from_nanos(wait));
        assert!(
            algo.try_acquire(&ring, 2, &clock).is_ok(),
            "a retry after {wait} ns was rejected again"
        );
    }
}
