//! The exact sliding window: a sliding log kept in a bounded ring of timestamps.

use super::{too_big, Algo, RETIRED};
use crate::clock::{nanos, Clock};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering, Spin};
use std::time::Duration;
use strength_reduce::StrengthReducedU64;

/// The largest limit the exact sliding window accepts: its ring costs 8 bytes per permit.
pub(crate) const MAX_SLIDING_LIMIT: u32 = 1 << 24;

/// Times are stored shifted left by one bit; later ones saturate (about 292 years after the epoch).
const MAX_TIME: u64 = u64::MAX >> 1;

/// A slot that no ticket has written yet: time 0 with lap parity 1 ("lap −1"), so lap 0 sees it as
/// unpublished and lap 1 (which never reads it before lap 0 wrote it) cannot mistake it.
const UNWRITTEN: u64 = 1;

/// At most `limit` (N) admissions in any interval of length `window` (W), on the times it assigns.
///
/// Every admitted permit takes a ticket `k` from a counter and records its time in ring slot
/// `k mod N`. Ticket k is admitted only if ticket k − N is at least W old. With times non-decreasing
/// in ticket order (see the module docs), any N + 1 admissions include two tickets N apart, which are
/// at least W apart: no interval of length W holds N + 1. There is no trimming thread: expiry is one
/// comparison against the slot that ticket k would overwrite.
///
/// **Publication.** A writer claims tickets with a CAS on `head` and only then writes the slots, so
/// a reader can arrive in between and find the slot still holding the previous lap's time. Each slot
/// therefore carries the parity of its lap, as crossbeam's `ArrayQueue` carries a stamp:
///
/// | slot word | meaning for a reader expecting ticket j |
/// |---|---|
/// | `time << 1 \| (j / N) & 1` | ticket j is published at `time` |
/// | `time << 1 \| ((j / N) + 1) & 1` | ticket j − N is still there: j's writer is between claim and publish (or the reader is stale) |
///
/// A reader that sees the wrong parity never decides on it: it snoozes and reloads `head`. No third
/// state is possible: a claim of tickets `[head, end)` first checks that *every* slot it will
/// overwrite (tickets `[head − N, end − N)`) holds its own ticket's write, so ticket j is only ever
/// claimed after j − N was published and a slot is never two laps behind. (Checking only the newest
/// of them is not enough for multi-permit claims: a preempted writer of an older ticket could then
/// store its time over the next lap. The loom model `multi_ticket_claim_*` found this.)
///
/// **Memory:** N words for the ring plus two counters and the ring's pointer (32 bytes).
///
/// This struct holds the parameters; the [`Ring`] is the [`Algo::Cell`]. Retiring swaps `head` to
/// [`RETIRED`] (ticket counters stay far below it).
pub(crate) struct SlidingWindow {
    limit: u32,
    window: u64,
    per_lap: StrengthReducedU64,
}

/// The state of one exact sliding window.
pub(crate) struct Ring {
    /// Tickets handed out so far: the next admission takes ticket `head`.
    head: AtomicU64,
    /// A hint for `remaining`: every ticket below it had expired when it was stored. It shares the
    /// cache line of `head`, which the admit path has just written anyway.
    expired: AtomicU64,
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
            limit,
            window,
            per_lap: StrengthReducedU64::new(u64::from(limit)),
        })
    }

    /// The slot of ticket `ticket` and the parity its lap writes.
    #[inline]
    fn slot<'r>(&self, ring: &'r Ring, ticket: u64) -> (&'r AtomicU64, u64) {
        let (lap, index) = StrengthReducedU64::div_rem(ticket, self.per_lap);
        (&ring.slots[index as usize], lap & 1)
    }

    /// The time of ticket `ticket`, if its writer has published it.
    #[inline]
    fn published(&self, ring: &Ring, ticket: u64) -> Option<u64> {
        let (slot, parity) = self.slot(ring, ticket);
        // Acquire: pairs with the Release store of the slot. Whoever claimed a later ticket read this
        // slot with Acquire before its Release CAS on `head`, and we loaded `head` with Acquire, so
        // the previous lap's write happens-before this load: we cannot see an older lap (two laps
        // behind, with the right parity by accident).
        let word = slot.load(Ordering::Acquire);
        (word & 1 == parity).then_some(word >> 1)
    }

    #[inline]
    fn expired(&self, ring: &Ring, ticket: u64, now: u64) -> bool {
        matches!(self.published(ring, ticket), Some(t) if t.saturating_add(self.window) <= now)
    }

    /// Permits that tickets `end`, `end + 1`, … could take at `now`: N minus the tickets in
    /// `[end − N, end)` that are still in the window. Finds the first live ticket by galloping from
    /// the `expired` hint, so the cost is amortised O(1) per admission, O(log N) at worst.
    ///
    /// Unpublished tickets count as live; the result is exact when no admission is in flight.
    #[inline]
    fn remaining(&self, ring: &Ring, end: u64, now: u64) -> u32 {
        let limit = u64::from(self.limit);
        // Relaxed: a hint, any value it ever held is a valid lower bound.
        let hint = ring.expired.load(Ordering::Relaxed);
        let low = hint.max(end.saturating_sub(limit));
        if low >= end || !self.expired(ring, low, now) {
            return (limit - (end - low.min(end))) as u32;
        }
        self.remaining_gallop(ring, end, now, hint, low)
    }

    /// The slow part of [`remaining`](Self::remaining): `low` has expired, find the first live
    /// ticket after it.
    #[cold]
    #[inline(never)]
    fn remaining_gallop(&self, ring: &Ring, end: u64, now: u64, hint: u64, mut low: u64) -> u32 {
        let limit = u64::from(self.limit);
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

impl Algo for SlidingWindow {
    type Cell = Ring;

    fn cell(&self) -> Ring {
        Ring {
            head: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            slots: (0..self.limit).map(|_| AtomicU64::new(UNWRITTEN)).collect(),
        }
    }

    fn limit(&self) -> u32 {
        self.limit
    }

    #[inline(always)]
    fn try_acquire<C: Clock>(
        &self,
        ring: &Ring,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        if n > self.limit {
            return Err(too_big(n, self.limit));
        }
        let want = u64::from(n.max(1));
        let limit = u64::from(self.limit);
        let spin = Spin::new();
        // Acquire: pairs with the Release CAS of every earlier claim (a release sequence of RMWs):
        // their clock reads and slot checks happen before our clock read and slot loads.
        let mut head = ring.head.load(Ordering::Acquire);
        loop {
            if head == RETIRED {
                return Err(TryAcquireError::Closed);
            }
            let now = clock.now().min(MAX_TIME);
            let end = head + want;
            if end > limit {
                // The newest of the tickets whose slots we would overwrite must have expired; times
                // are non-decreasing in ticket order, so the older ones have too.
                let newest = end - 1 - limit;
                let published = match self.published(ring, newest) {
                    Some(t) => {
                        let free_at = t.saturating_add(self.window);
                        if free_at > now {
                            return Err(TryAcquireError::Rejected(Rejection::new(
                                free_at - now,
                                self.limit,
                            )));
                        }
                        // Every slot we overwrite must hold its own ticket's write, not only the
                        // newest: a writer of an older one that is still between claim and publish
                        // would otherwise store its time over our lap later.
                        (head.saturating_sub(limit)..newest)
                            .all(|t| self.published(ring, t).is_some())
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
            if n == 0 {
                let reset = match head.checked_sub(1).and_then(|t| self.published(ring, t)) {
                    Some(t) => t.saturating_add(self.window).saturating_sub(now),
                    None => 0,
                };
                return Ok(Admission::new(now, reset, self.remaining(ring, head, now)));
            }
            // Release on success: publishes our clock reading and the slot check above to every
            // later claimer. Acquire on failure: as for the first load.
            match ring
                .head
                .compare_exchange_weak(head, end, Ordering::Release, Ordering::Acquire)
            {
                Ok(_) => {
                    for ticket in head..end {
                        let (slot, parity) = self.slot(ring, ticket);
                        // Release: pairs with the Acquire in `published`.
                        slot.store((now << 1) | parity, Ordering::Release);
                    }
                    return Ok(Admission::new(
                        now,
                        self.window,
                        self.remaining(ring, end, now),
                    ));
                }
                Err(actual) => head = actual,
            }
        }
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

    fn available(&self, ring: &Ring, now: u64) -> u32 {
        // Acquire: as in try_acquire, so the slots we read are at least as new as `head`.
        match ring.head.load(Ordering::Acquire) {
            RETIRED => self.limit,
            head => self.remaining(ring, head, now),
        }
    }

    fn retire<C: Clock>(&self, ring: &Ring, clock: &C) -> Result<(), u64> {
        // Acquire: as in `try_acquire`: the newest ticket's slot write, and our clock read, come
        // after its claimer's clock read.
        let head = ring.head.load(Ordering::Acquire);
        if head == RETIRED {
            return Ok(());
        }
        let now = clock.now().min(MAX_TIME);
        let Some(newest) = head.checked_sub(1) else {
            // Never used: its inserter is about to admit on it (see `Algo::retire`).
            return Err(now);
        };
        // Times are non-decreasing in ticket order, so the newest ticket expires last. A writer
        // still between claim and publish makes the ring busy; look again shortly.
        match self.published(ring, newest) {
            Some(t) if t.saturating_add(self.window) <= now => {}
            Some(t) => return Err(t.saturating_add(self.window)),
            None => return Err(now),
        }
        // Release on success: as in the fixed window's `retire`. Relaxed on failure: busy.
        ring.head
            .compare_exchange(head, RETIRED, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| now)
    }

    fn retired(ring: &Ring) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        ring.head.load(Ordering::Relaxed) == RETIRED
    }
}
