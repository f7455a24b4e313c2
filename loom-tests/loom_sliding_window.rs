//! Loom model of the exact sliding window (`src/algorithm/sliding_window.rs`).
//!
//! Protocol: an admission claims tickets `[head, head + n)` with a CAS on `head`, *then* stores its
//! time (tagged with the lap parity) into ring slot `ticket mod limit`. Before claiming, it checks that
//! ticket `head + n - 1 - limit` is at least `window` old and that every slot it will overwrite
//! (tickets `[head - limit, head + n - limit)`) is published; a slot with the wrong parity
//! means "claimed but not yet written" and the reader snoozes (a loom yield) and reloads `head`.
//!
//! The models race 2-3 threads on limit-1 and limit-2 rings over a `ManualClock`, including a reader
//! that arrives between a writer's CAS on `head` and its slot store, and n = 2 claims next to n = 1
//! claims. They assert:
//! - the contract: over all admitted permits (each admission's `at_nanos`, repeated `n` times),
//!   sorted, `times[i + limit] - times[i] >= window`: no interval of length `window` holds more
//!   than `limit` permits;
//! - `stats().admitted + stats().rejected` equals the number of calls;
//! - where capacity provably exists, the exact number of admissions (e.g. two n = 1 calls on an
//!   empty limit-2 ring both succeed; one expired slot of a limit-1 ring goes to exactly one of two
//!   racers).
//!
//! At most two threads call `try_acquire_n` concurrently in any model (a third may only move the
//! clock): with two snoozing readers waiting on one preempted writer, loom's scheduler can hand the
//! turn back and forth between the two yielding threads forever and report "Model exceeded maximum
//! number of branches" for a schedule no fair scheduler produces (tokio-rs/loom#53).
//!
//! Two models, `multi_ticket_claim_*`, are regression models for a bug these models found in n >= 2
//! claims (described above them): a claim must check that *every* slot it overwrites is published.
//!
//! Two more cover a lowered limit (see "Lowering" in `src/algorithm/sliding_window.rs`):
//! `refund_after_lowering` races a chain's refund against the lowering and a claim (a refund hole
//! must not hide an older live ticket), and `lowered_ring_settles_under_races` races claims that
//! check back to the old limit and settle the ring against claims that rely on it being settled.
//! `available_after_lowering_under_a_settling_claim` races a keyed `available` (which decides
//! nothing, and checks back to the reach unless the ring is settled) against such a claim.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p turnstile-loom-tests`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::thread;
use std::time::Duration;
use turnstile::{Algorithm, Chain, Clock, KeyedLimiter, ManualClock, RateLimiter, TryAcquireError};

const WINDOW: u64 = 10;

type Limiter = RateLimiter<ManualClock>;

fn sliding(limit: u32) -> Algorithm {
    Algorithm::SlidingWindow {
        limit,
        window: Duration::from_nanos(WINDOW),
    }
}

fn limiter(limit: u32) -> Limiter {
    RateLimiter::with_clock(sliding(limit), ManualClock::new()).unwrap()
}

/// One step of a model thread.
#[derive(Clone, Copy)]
enum Op {
    Acquire(u32),
    Advance(u64),
}

/// Outcome of the acquisitions in one thread's script: admitted `(at, n)` pairs and the call count.
#[derive(Default)]
struct Log {
    admitted: Vec<(u64, u32)>,
    calls: u64,
}

fn run(limiter: &Limiter, script: &[Op]) -> Log {
    let mut log = Log::default();
    for op in script {
        match *op {
            Op::Acquire(n) => {
                log.calls += 1;
                match limiter.try_acquire_n(n) {
                    Ok(a) => log.admitted.push((a.at_nanos(), n)),
                    Err(TryAcquireError::Rejected(_)) => {}
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            Op::Advance(d) => limiter.clock().advance(Duration::from_nanos(d)),
        }
    }
    log
}

/// Runs `prelude` on the model's main thread, then each script on its own loom thread, and returns
/// the merged log (prelude included).
fn race(limiter: &Limiter, prelude: &[Op], scripts: &[&'static [Op]]) -> Log {
    let mut total = run(limiter, prelude);
    let handles: Vec<_> = scripts
        .iter()
        .map(|&script| {
            let limiter = limiter.clone();
            thread::spawn(move || run(&limiter, script))
        })
        .collect();
    for h in handles {
        let log = h.join().unwrap();
        total.admitted.extend(log.admitted);
        total.calls += log.calls;
    }
    total
}

/// The sliding-window contract plus the stats identity.
fn check(limiter: &Limiter, limit: u32, log: &Log) {
    let mut times: Vec<u64> = log
        .admitted
        .iter()
        .flat_map(|&(at, n)| std::iter::repeat_n(at, n as usize))
        .collect();
    times.sort_unstable();
    let limit = limit as usize;
    for i in 0..times.len().saturating_sub(limit) {
        assert!(
            times[i + limit] - times[i] >= WINDOW,
            "{} permits within {WINDOW} ns: sorted admission times {times:?}",
            limit + 1,
        );
    }
    let stats = limiter.stats();
    assert_eq!(
        stats.admitted as usize,
        log.admitted.len(),
        "stats.admitted vs observed admissions"
    );
    assert_eq!(
        stats.admitted + stats.rejected,
        log.calls,
        "stats.admitted + stats.rejected vs calls"
    );
}

fn admissions(log: &Log) -> usize {
    log.admitted.len()
}

/// Limit 2, one slot already taken at t = 0: two threads race for the last slot. Exactly one wins.
#[test]
fn last_slot_race() {
    model(|| {
        let l = limiter(2);
        let log = race(
            &l,
            &[Op::Acquire(1)],
            &[&[Op::Acquire(1)], &[Op::Acquire(1)]],
        );
        check(&l, 2, &log);
        assert_eq!(
            admissions(&log),
            2,
            "the free slot must go to exactly one racer"
        );
    });
}

/// Limit 2, empty ring, t = 0: two n = 1 calls both fit and must both be admitted; a third call
/// from one of the threads must be rejected.
#[test]
fn empty_ring_two_fit() {
    model(|| {
        let l = limiter(2);
        let log = race(
            &l,
            &[],
            &[&[Op::Acquire(1), Op::Acquire(1)], &[Op::Acquire(1)]],
        );
        check(&l, 2, &log);
        assert_eq!(admissions(&log), 2, "capacity 2, demand 3 at one instant");
    });
}

/// Limit 1: A takes the slot at t = 0, the clock moves one window on, then B and C race. The slot
/// has expired, so exactly one of them is admitted. If B wins the ticket and is preempted before it
/// writes the slot, C finds the old lap's parity and must snooze rather than admit on the stale time.
#[test]
fn stale_slot_reader_limit1() {
    model(|| {
        let l = limiter(1);
        let log = race(
            &l,
            &[Op::Acquire(1), Op::Advance(WINDOW)],
            &[&[Op::Acquire(1)], &[Op::Acquire(1)]],
        );
        check(&l, 1, &log);
        assert_eq!(
            admissions(&log),
            2,
            "the expired slot must go to exactly one racer"
        );
    });
}

/// Limit 1 with everything concurrent: two threads acquire twice each while a third moves the clock
/// one window on. Exercises claims over unpublished slots of both laps and the parity check.
#[test]
fn concurrent_advance_limit1() {
    model(|| {
        let l = limiter(1);
        let log = race(
            &l,
            &[],
            &[
                &[Op::Acquire(1), Op::Acquire(1)],
                &[Op::Acquire(1), Op::Acquire(1)],
                &[Op::Advance(WINDOW)],
            ],
        );
        check(&l, 1, &log);
        assert!(
            admissions(&log) >= 1,
            "the first claim on an empty ring always fits"
        );
    });
}

/// Limit 2 at one instant: an n = 2 call against two n = 1 calls. Whatever the order, exactly 2
/// permits are admitted (the first claim always fits, and whoever comes second finds either the
/// second slot free or the ring full).
#[test]
fn mixed_sizes_one_instant() {
    model(|| {
        let l = limiter(2);
        let log = race(
            &l,
            &[],
            &[&[Op::Acquire(2)], &[Op::Acquire(1), Op::Acquire(1)]],
        );
        check(&l, 2, &log);
        let permits: u32 = log.admitted.iter().map(|&(_, n)| n).sum();
        assert_eq!(permits, 2, "capacity 2 at one instant, demand 4");
    });
}

/// Limit 2, ring full at t = 0 (both tickets published before the threads start). One thread moves
/// the clock a window on and takes one permit; the other asks for 2 then 1. n = 2 claims and the
/// lap-1 parity race with an n = 1 writer that is between claim and publish.
#[test]
fn n2_after_rollover() {
    model(|| {
        let l = limiter(2);
        let log = race(
            &l,
            &[Op::Acquire(2)],
            &[
                &[Op::Advance(WINDOW), Op::Acquire(1)],
                &[Op::Acquire(2), Op::Acquire(1)],
            ],
        );
        check(&l, 2, &log);
    });
}

// ---------------------------------------------------------------------------------------------
// A bug these models found (fixed in src/algorithm/sliding_window.rs): an n >= 2 claim of tickets
// [head, end) overwrites the slots of tickets [head - N, end - N) but only checked (with Acquire)
// that the newest of them, end - 1 - N, was published. An older one may still be between its CAS
// on `head` and its slot store, and its late store then replaces the newer lap's record:
//
//   limit N = 2, window 10, t = 0
//   X: try_acquire(1): CAS head 0 -> 1 (ticket 0) ... preempted before storing slot 0
//   M: try_acquire(1): CAS head 1 -> 2 (ticket 1), slot 1 = (0, lap 0). Admitted at 0.
//   M: advance to 10; try_acquire_n(2): checks only ticket 1 (expired) -> CAS 2 -> 4,
//      slot 0 = slot 1 = (10, lap 1). Admitted at 10.
//   X: resumes, slot 0 = (0, lap 0): ticket 2's record is gone.
//   then either
//   (a) M: advance to 20; try_acquire(1): needs ticket 2 with lap-1 parity, finds lap 0, snoozes
//       and reloads `head` forever: every n <= 1 call livelocks until some n >= 2 call rewrites
//       slot 0;
//   (b) M: advance to 20; try_acquire_n(2) claims 4, 5 (checks ticket 3 only); before M stores
//       slot 0, R: try_acquire(1) needs ticket 4 (lap 2, parity 0), reads X's stale (0, lap 0),
//       takes it for ticket 4 "published at 0", admits ticket 6 at 20: 3 permits at t = 20.
//
// The same happens without preemption under the memory model: the claimer never synchronised
// with ticket 0's store, so that store may be ordered after its own in slot 0's modification
// order (loom finds both). The fix: a claim of [head, end) checks that every slot of tickets
// [head - N, end - N) is published before its CAS, not only the newest. The two models below
// reproduced the bug and now guard the fix.
// ---------------------------------------------------------------------------------------------

/// Scenario (a): before the fix it failed with loom's "Model exceeded maximum number of branches"
/// (the spin never ended; the only other thread had finished).
#[test]
fn multi_ticket_claim_livelock() {
    model(|| {
        let l = limiter(2);
        let log = race(
            &l,
            &[],
            &[
                &[Op::Acquire(1)],
                &[
                    Op::Acquire(1),
                    Op::Advance(WINDOW),
                    Op::Acquire(2),
                    Op::Advance(WINDOW),
                    Op::Acquire(1),
                ],
            ],
        );
        check(&l, 2, &log);
    });
}

/// Scenario (b): before the fix it failed the interval check (3 permits admitted at one instant
/// with limit 2).
#[test]
fn multi_ticket_claim_exactness() {
    model(|| {
        let l = limiter(2);
        let mut log = race(
            &l,
            &[],
            &[
                &[Op::Acquire(1)],
                &[Op::Acquire(1), Op::Advance(WINDOW), Op::Acquire(2)],
            ],
        );
        let late = race(
            &l,
            &[Op::Advance(WINDOW)],
            &[&[Op::Acquire(2)], &[Op::Acquire(1)]],
        );
        log.admitted.extend(late.admitted);
        log.calls += late.calls;
        check(&l, 2, &log);
    });
}

// ---------------------------------------------------------------------------------------------
// A lowered limit. A claim of [head, end) under limit N checks tickets [head - N, end - N); that
// is exact only if the claim before it ran under a limit <= N. After lowering 2 -> 1 with ticket
// 0 live and ticket 1 given back by a chain (expiry 0: a refund hole), ticket 2 was decided on
// the hole alone and admitted: two live permits under limit 1. The fix makes the first claim per
// ring after a lowering check back to the largest limit ever set, and settle the ring.
// ---------------------------------------------------------------------------------------------

/// A ring of 2 with ticket 0 live for the whole model (the clock never moves). The main thread
/// makes a chain call over it and a ring of 1 (so it takes ticket 1, then loses the second
/// member to the racer and refunds ticket 1); the racer takes the second member, lowers the
/// first to 1 and asks it for a permit. However the refund, the lowering and the claims
/// interleave, nothing is admitted on the first ring after the lowering: ticket 0 fills limit 1.
#[test]
fn refund_after_lowering() {
    model(|| {
        let clock = ManualClock::new();
        let [a, b] =
            [2, 1].map(|limit| RateLimiter::with_clock(sliding(limit), clock.clone()).unwrap());
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        a.try_acquire().unwrap();
        let racer = {
            let (a, b) = (a.clone(), b.clone());
            thread::spawn(move || {
                let took_b = b.try_acquire().is_ok();
                a.reconfigure(sliding(1)).unwrap();
                (took_b, a.try_acquire().is_ok())
            })
        };
        let chained = chain.try_acquire().is_ok();
        let (took_b, racer_after_lowering) = racer.join().unwrap();
        assert_eq!(
            chained, !took_b,
            "the second member's one permit goes to exactly one"
        );
        assert!(
            !racer_after_lowering,
            "admitted after lowering to 1 with ticket 0 live"
        );
        assert!(
            a.try_acquire().is_err(),
            "admitted after the race with ticket 0 live under limit 1"
        );
        assert!(chain.stats().refunded <= 1);
    });
}

/// A ring of 2, full at t = 0, lowered to 1 before the threads start. One thread moves the clock
/// a window on and asks for a permit; the other asks twice. The first admission after the
/// lowering checks back to ticket 0 and settles the ring; the other relies on the settled word
/// (or checks back itself). Under limit 1, the admissions after the lowering are a window apart,
/// and none comes before the old tickets expire.
#[test]
fn lowered_ring_settles_under_races() {
    model(|| {
        let l = limiter(2);
        let before = run(&l, &[Op::Acquire(2)]);
        assert_eq!(admissions(&before), 1);
        l.reconfigure(sliding(1)).unwrap();
        let log = race(
            &l,
            &[],
            &[
                &[Op::Advance(WINDOW), Op::Acquire(1)],
                &[Op::Acquire(1), Op::Acquire(1)],
            ],
        );
        assert!(
            log.admitted.iter().all(|&(at, _)| at >= WINDOW),
            "admitted before the old tickets expired: {:?}",
            log.admitted
        );
        assert!(admissions(&log) >= 1, "the ring is free after the advance");
        let mut times: Vec<u64> = log.admitted.iter().map(|&(at, _)| at).collect();
        times.sort_unstable();
        assert!(
            times.windows(2).all(|w| w[1] - w[0] >= WINDOW),
            "two admissions within a window under limit 1: {times:?}"
        );
    });
}

/// One key of a keyed ring of 2: ticket 0 admitted under window 10 (live until 10), ticket 1
/// under window 1 (expired at 1), then the limit lowered to 1 and the clock at 1. One thread
/// moves the clock to 10 and takes a permit (checking back to ticket 0, settling the ring);
/// the other reads `available` and then the clock. While the clock read after it is still
/// below 10, nothing is free: ticket 0 fills limit 1 (the newest ticket alone, expired, said 1).
/// Once the claim is in, nothing is free either (its ticket is live), whether `available` sees
/// the ring settled or checks back itself.
#[test]
fn available_after_lowering_under_a_settling_claim() {
    model(|| {
        let sliding = |limit, window| Algorithm::SlidingWindow {
            limit,
            window: Duration::from_nanos(window),
        };
        let l = std::sync::Arc::new(
            KeyedLimiter::<u64, _>::with_clock(sliding(2, WINDOW), ManualClock::new()).unwrap(),
        );
        l.try_acquire(&1).unwrap();
        l.reconfigure(sliding(2, 1)).unwrap();
        l.try_acquire(&1).unwrap();
        l.reconfigure(sliding(1, 1)).unwrap();
        l.clock().advance(Duration::from_nanos(1));
        let claimer = {
            let l = std::sync::Arc::clone(&l);
            thread::spawn(move || {
                l.clock().advance(Duration::from_nanos(WINDOW - 1));
                l.try_acquire(&1).unwrap().at_nanos()
            })
        };
        let free = l.available(&1);
        let after = l.clock().now();
        let claimed_at = claimer.join().unwrap();
        assert_eq!(claimed_at, WINDOW);
        assert!(free <= 1);
        if after < WINDOW {
            assert_eq!(free, 0, "a permit reported free while ticket 0 was live");
        }
        assert_eq!(l.available(&1), 0, "the claim's ticket is live");
    });
}
