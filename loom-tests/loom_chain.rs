//! Loom model of chains (`src/chain.rs`) and of the refunds they make (`Algo::refund` in
//! `src/algorithm/`).
//!
//! Protocol: a chain call first *checks* every member (no writes), then *commits* them one by
//! one (each an ordinary admission); if a member rejects in the commit pass, the members that
//! already admitted are given their permits back: the fixed window and the sliding counter CAS
//! their count down (only while the word is still the admission's window), the token bucket
//! CASes `tat` back by n·T less the time elapsed since the admission, the exact sliding window
//! CASes each of the admission's slots from its own word to "expiry 0" (positional).
//!
//! The models race two threads over two members with limits of 1 or 2 on a `ManualClock`: two
//! chain calls against each other, and a chain call against direct calls on the members, so that
//! a refund races a concurrent admission on the same member (the direct call can see the chain's
//! permit before the refund, or its absence after). They assert:
//! - no member ever over-admits: every member's kept admissions (chain and direct, by each
//!   admission's `at_nanos`) satisfy its contract (per window, the sliding log, the weighted
//!   estimate, GCRA conformance);
//! - refunds restore exactly where the algorithm promises it (the clock has not moved): after
//!   the threads join, every member's `available` is what its kept admissions alone leave, and
//!   the main thread can take exactly that many more;
//! - the chain's statistics add up, and `refunded` counts exactly the calls that gave back.
//! - a chain's `charge` racing a chain call's refund on the same member (`charge_races_refund_*`)
//!   loses neither the charge nor the refund.
//!
//! The exact sliding window's refund is positional, so its models assert the contract and what
//! the position allows, not a full restore. Not modelled: the sliding counter's roll-over under a
//! refund excursion (two rollers, a refund and a stale-clock admission: four threads, and the
//! refund itself needs a lost race; at 3 preemptions such a model ran for over 20 minutes). The
//! fix (`publish_previous`: the slot only grows within an id, no roll-over without a publish) is
//! argued in its docs, replayed step by step by the unit test
//! `refund_excursion_cannot_lower_previous` in `src/algorithm/sliding_counter.rs`, and
//! `loom_sliding_counter` checks the changed publish without refunds.
//!
//! A chain caller that must wait sleeps, registered with its members' watchers
//! (`src/watchers.rs`); a close, a reconfiguration or a refund of a member notifies it. The
//! `*_is_never_missed` models run that protocol (`turnstile::ModelWaiter::wait_until`, the
//! steps a chain's `acquire` takes, with an untimed wait so that a lost notification is a
//! deadlock) against changers that make a change visible with a Relaxed store, as a close sets
//! its closed bit, and then tell the watchers; `a_chain_callers_own_refunds_*` with a caller
//! whose every failed attempt refunds, which tells every watcher but itself.
//! `an_overflow_refund_racing_another_keys_head_is_never_missed` races a receipt's refund to a
//! per-key member's shared overflow cell with the first attempt of another overflow key's head,
//! which the refund must wake (the cell's waiters wait in their own keys' queues).
//!
//! A chain caller that must wait queues in the chain's own line: room (permits of a
//! `ConcurrencyLimiter` of `queue_limit`), then the turn (a `ConcurrencyLimiter` of 1); a call
//! that finds room in use does not barge. The order and the handoff are the concurrency
//! limiter's (`loom_waiters`); `waiting_chain_callers_*` race the composition, with callers
//! that give up at once (a deadline already passed, so no model sleeps): whatever the
//! interleaving, nothing stays held (no caller counted as waiting, the gate open again, the
//! member's permits untouched by refusals).
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release -p turnstile-loom-tests --test loom_chain`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::thread;
use std::time::Duration;
use turnstile::{AcquireError, Algorithm, Chain, ManualClock, Rate, RateLimiter, TryAcquireError};

const WINDOW: u64 = 10;

type Limiter = RateLimiter<ManualClock>;

fn fixed(limit: u32) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window: Duration::from_nanos(WINDOW),
    }
}

fn sliding(limit: u32) -> Algorithm {
    Algorithm::SlidingWindow {
        limit,
        window: Duration::from_nanos(WINDOW),
    }
}

fn counter(limit: u32) -> Algorithm {
    Algorithm::SlidingCounter {
        limit,
        window: Duration::from_nanos(WINDOW),
    }
}

/// One permit per `WINDOW` ns, bursts of `burst`.
fn bucket(burst: u32) -> Algorithm {
    Algorithm::TokenBucket {
        rate: Rate::new(1, Duration::from_nanos(WINDOW)),
        burst,
    }
}

fn members(clock: &ManualClock, a: Algorithm, b: Algorithm) -> [Limiter; 2] {
    [a, b].map(|alg| RateLimiter::with_clock(alg, clock.clone()).unwrap())
}

/// Kept admissions `(at, n)` of one member.
type Kept = Vec<(u64, u32)>;

/// A chain call: on success both members keep the permits, at their own times.
fn chain_call(chain: &Chain<ManualClock>, n: u32, kept: &mut [Kept; 2]) -> bool {
    let mut each = Vec::new();
    match chain.try_acquire_n_into(n, &mut each) {
        Ok(_) => {
            for (k, a) in kept.iter_mut().zip(&each) {
                k.push((a.at_nanos(), n));
            }
            true
        }
        Err(TryAcquireError::Rejected(_)) => false,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn direct(member: &Limiter, n: u32, kept: &mut Kept) -> bool {
    match member.try_acquire_n(n) {
        Ok(a) => {
            kept.push((a.at_nanos(), n));
            true
        }
        Err(TryAcquireError::Rejected(_)) => false,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn merge(a: &mut [Kept; 2], b: [Kept; 2]) {
    for (x, y) in a.iter_mut().zip(b) {
        x.extend(y);
    }
}

/// The member's contract over its kept admissions.
fn audit(algorithm: Algorithm, kept: &Kept) {
    let mut sorted = kept.clone();
    sorted.sort_unstable();
    match algorithm {
        Algorithm::FixedWindow { limit, .. } => {
            let mut per_window = std::collections::BTreeMap::new();
            for &(at, n) in &sorted {
                *per_window.entry(at / WINDOW).or_insert(0) += n;
            }
            assert!(
                per_window.values().all(|&c| c <= limit),
                "fixed window over its limit: {sorted:?}"
            );
        }
        Algorithm::SlidingWindow { limit, .. } => {
            let times: Vec<u64> = sorted
                .iter()
                .flat_map(|&(t, n)| std::iter::repeat_n(t, n as usize))
                .collect();
            let l = limit as usize;
            assert!(
                (0..times.len().saturating_sub(l)).all(|i| times[i + l] - times[i] >= WINDOW),
                "more than {limit} in one window: {times:?}"
            );
        }
        Algorithm::SlidingCounter { limit, .. } => {
            let mut per_window = std::collections::BTreeMap::new();
            for &(at, n) in &sorted {
                let (w, e) = (at / WINDOW, at % WINDOW);
                let prev = w
                    .checked_sub(1)
                    .and_then(|p| per_window.get(&p).copied())
                    .unwrap_or(0u32);
                let cur = per_window.get(&w).copied().unwrap_or(0);
                assert!(
                    u64::from(prev) * (WINDOW - e) + u64::from(cur + n) * WINDOW
                        <= u64::from(limit) * WINDOW,
                    "admission of {n} at {at} above the estimate: {sorted:?}"
                );
                *per_window.entry(w).or_insert(0) += n;
            }
        }
        Algorithm::TokenBucket { burst, .. } => {
            let mut tat = 0u64;
            for &(at, n) in &sorted {
                let next = tat.max(at) + u64::from(n) * WINDOW;
                assert!(
                    next - at <= u64::from(burst) * WINDOW,
                    "admission of {n} at {at} does not conform: {sorted:?}"
                );
                tat = next;
            }
        }
        other => panic!("unknown {other:?}"),
    }
}

fn permits(kept: &Kept) -> u32 {
    kept.iter().map(|&(_, n)| n).sum()
}

/// Two chain calls race on a fixed window of 2 and a fixed window of 1: exactly one is
/// admitted, and whichever lost its commit on the second member gave the first its permit back.
#[test]
fn two_chain_calls_fixed_windows() {
    model(|| {
        let clock = ManualClock::new();
        let [a, b] = members(&clock, fixed(2), fixed(1));
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let chain = chain.clone();
                thread::spawn(move || {
                    let mut kept = [Kept::new(), Kept::new()];
                    let ok = chain_call(&chain, 1, &mut kept);
                    (ok, kept)
                })
            })
            .collect();
        let mut kept = [Kept::new(), Kept::new()];
        let mut admitted = 0;
        for h in handles {
            let (ok, k) = h.join().unwrap();
            admitted += u32::from(ok);
            merge(&mut kept, k);
        }
        assert_eq!(admitted, 1, "exactly one chain call fits the second member");
        audit(fixed(2), &kept[0]);
        audit(fixed(1), &kept[1]);
        assert_eq!(a.stats().available, 1, "the loser's permit was given back");
        assert_eq!(b.stats().available, 0);
        let stats = chain.stats();
        assert_eq!((stats.admitted, stats.rejected), (1, 1));
        assert!(stats.refunded <= 1);
    });
}

/// A chain call races direct calls on both members (the second member first, so that the chain
/// can lose its commit there and refund the first member while the direct call on the first
/// member runs). Returns the members' kept admissions and the chain's outcome.
fn chain_against_direct(
    clock: &ManualClock,
    algorithms: [Algorithm; 2],
    prelude: impl Fn(&[Limiter; 2], &mut [Kept; 2]),
    direct_n: [u32; 2],
) -> ([Limiter; 2], Chain<ManualClock>, [Kept; 2], bool) {
    let members = members(clock, algorithms[0], algorithms[1]);
    let chain = Chain::new(members.clone()).unwrap();
    let mut kept = [Kept::new(), Kept::new()];
    prelude(&members, &mut kept);
    let racer = {
        let members = members.clone();
        thread::spawn(move || {
            let mut kept = [Kept::new(), Kept::new()];
            direct(&members[1], direct_n[1], &mut kept[1]);
            direct(&members[0], direct_n[0], &mut kept[0]);
            kept
        })
    };
    let ok = chain_call(&chain, 1, &mut kept);
    merge(&mut kept, racer.join().unwrap());
    audit(algorithms[0], &kept[0]);
    audit(algorithms[1], &kept[1]);
    let stats = chain.stats();
    assert_eq!(stats.admitted + stats.rejected, 1);
    (members, chain, kept, ok)
}

/// Fixed windows of 1 and 1: the refund of the first member races the direct admission on it.
/// With the clock still, the refund is exact: the first member ends with exactly what its kept
/// admissions leave, whichever side of the refund the direct call landed on.
#[test]
fn refund_races_admission_fixed_window() {
    model(|| {
        let clock = ManualClock::new();
        let (members, chain, kept, ok) =
            chain_against_direct(&clock, [fixed(1), fixed(1)], |_, _| {}, [1, 1]);
        assert_eq!(members[0].stats().available, 1 - permits(&kept[0]));
        assert_eq!(members[1].stats().available, 1 - permits(&kept[1]));
        // A refund happened iff the chain lost on the second member after taking the first.
        assert!(chain.stats().refunded <= u64::from(!ok));
        // The main thread can take exactly what is left.
        for (m, k) in members.iter().zip(&kept) {
            let left = 1 - permits(k);
            assert_eq!(m.try_acquire_n(left.max(1)).is_ok(), left > 0);
        }
    });
}

/// The same with a token bucket (burst 1) first: `tat` is moved back by exactly one interval.
#[test]
fn refund_races_admission_token_bucket() {
    model(|| {
        let clock = ManualClock::new();
        let (members, _, kept, _) =
            chain_against_direct(&clock, [bucket(1), fixed(1)], |_, _| {}, [1, 1]);
        assert_eq!(members[0].stats().available, 1 - permits(&kept[0]));
        assert_eq!(members[1].stats().available, 1 - permits(&kept[1]));
    });
}

/// A sliding counter of 2 first, with one permit already taken: the refund's CAS on `current`
/// races the direct admission's CAS on it.
#[test]
fn refund_races_admission_sliding_counter() {
    model(|| {
        let clock = ManualClock::new();
        let (members, _, kept, _) = chain_against_direct(
            &clock,
            [counter(2), fixed(1)],
            |m, kept| assert!(direct(&m[0], 1, &mut kept[0])),
            [1, 1],
        );
        assert_eq!(members[0].stats().available, 2 - permits(&kept[0]));
        assert_eq!(members[1].stats().available, 1 - permits(&kept[1]));
    });
}

/// The sliding counter's refund races a roll-over: the racer moves the clock into the next
/// window and then takes 2 permits, so it rolls `current` over (publishing `previous`) while the
/// chain's admission in the first window is being refunded, or after. The counter must never
/// admit above its estimate of the kept admissions (the refund may be conservative).
#[test]
fn refund_races_rollover_sliding_counter() {
    model(|| {
        let clock = ManualClock::new();
        let [a, b] = members(&clock, counter(2), fixed(1));
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        let mut kept = [Kept::new(), Kept::new()];
        assert!(direct(&a, 1, &mut kept[0]));
        let racer = {
            let (a, b, clock) = (a.clone(), b.clone(), clock.clone());
            thread::spawn(move || {
                let mut kept = [Kept::new(), Kept::new()];
                direct(&b, 1, &mut kept[1]);
                clock.advance(Duration::from_nanos(WINDOW + WINDOW / 2));
                direct(&a, 1, &mut kept[0]);
                kept
            })
        };
        chain_call(&chain, 1, &mut kept);
        merge(&mut kept, racer.join().unwrap());
        audit(counter(2), &kept[0]);
        audit(fixed(1), &kept[1]);
    });
}

/// Two exact sliding windows (limits 2 and 1; the chain commits them in that order), the first
/// holding a live ticket 0: the chain takes ticket 1, loses on the second member and zeroes
/// ticket 1 while the racer asks the first member for 2 permits, which would overwrite tickets
/// 0 and 1. Ticket 0 is live, so however the refund and the claim interleave the claim must be
/// refused: a refunded newest ticket does not vouch for the older ones.
#[test]
fn refund_races_claim_sliding_window() {
    model(|| {
        let clock = ManualClock::new();
        let (_, _, kept, ok) = chain_against_direct(
            &clock,
            [sliding(2), sliding(1)],
            |m, kept| assert!(direct(&m[0], 1, &mut kept[0])),
            [2, 1],
        );
        assert_eq!(
            permits(&kept[0]),
            1 + u32::from(ok),
            "the 2-permit claim never fits"
        );
    });
}

/// The same rings without the live ticket: the racer's 2-permit claim overwrites only ticket 0's
/// slot after the chain's refund zeroed it, so it fits at once (the positional refund is exact
/// here, the refunded ticket being the oldest); before the refund it is refused.
#[test]
fn refund_frees_the_oldest_ticket_sliding_window() {
    model(|| {
        let clock = ManualClock::new();
        let (members, _, kept, _) =
            chain_against_direct(&clock, [sliding(2), sliding(1)], |_, _| {}, [2, 1]);
        // Whatever happened, the first ring ends with exactly what its kept admissions leave.
        assert_eq!(members[0].stats().available, 2 - permits(&kept[0]));
        let left = 2 - permits(&kept[0]);
        if left > 0 {
            members[0].try_acquire_n(left).unwrap();
        }
    });
}

/// Two chain calls race on a token bucket (burst 2) and a sliding counter of 1: exactly one is
/// admitted; the loser's refund of the bucket is exact (the clock is still), so one permit is
/// left in it.
#[test]
fn two_chain_calls_bucket_and_counter() {
    model(|| {
        let clock = ManualClock::new();
        let [a, b] = members(&clock, bucket(2), counter(1));
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let chain = chain.clone();
                thread::spawn(move || {
                    let mut kept = [Kept::new(), Kept::new()];
                    let ok = chain_call(&chain, 1, &mut kept);
                    (ok, kept)
                })
            })
            .collect();
        let mut kept = [Kept::new(), Kept::new()];
        let mut admitted = 0;
        for h in handles {
            let (ok, k) = h.join().unwrap();
            admitted += u32::from(ok);
            merge(&mut kept, k);
        }
        assert_eq!(admitted, 1);
        audit(bucket(2), &kept[0]);
        audit(counter(1), &kept[1]);
        assert_eq!(a.stats().available, 1, "the loser's permit was given back");
        a.try_acquire().unwrap();
    });
}

/// Two chain calls race on two exact sliding windows (limits 2 and 1): exactly one is admitted,
/// and the first ring, refunded positionally by the loser, never holds more than 2 in a window.
#[test]
fn two_chain_calls_sliding_windows() {
    model(|| {
        let clock = ManualClock::new();
        let [a, b] = members(&clock, sliding(2), sliding(1));
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        let racer = {
            let chain = chain.clone();
            thread::spawn(move || {
                let mut kept = [Kept::new(), Kept::new()];
                chain_call(&chain, 1, &mut kept);
                kept
            })
        };
        let mut kept = [Kept::new(), Kept::new()];
        chain_call(&chain, 1, &mut kept);
        merge(&mut kept, racer.join().unwrap());
        assert_eq!(permits(&kept[1]), 1, "exactly one chain call");
        // The main thread then takes what the first ring gives: never more than 2 in all. If the
        // loser's ticket was the later one, its position comes after the winner's, live for the
        // whole window, so the ring gives only 1 more now (positional, conservative).
        while direct(&a, 1, &mut kept[0]) {}
        audit(sliding(2), &kept[0]);
        assert!((1..=2).contains(&permits(&kept[0])));
    });
}

/// A refund racing the clock: the racer takes the second member (so the chain refunds), moves
/// the clock `advance` on and takes a permit from the first member, before or after the refund
/// reads the clock; then the main thread takes what is left. The first member must never admit
/// what its contract forbids over the kept admissions.
fn refund_races_clock(first: Algorithm, advance: u64) {
    model(move || {
        let clock = ManualClock::new();
        let [a, b] = members(&clock, first, fixed(1));
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        let racer = {
            let (a, b, clock) = (a.clone(), b.clone(), clock.clone());
            thread::spawn(move || {
                let mut kept = [Kept::new(), Kept::new()];
                direct(&b, 1, &mut kept[1]);
                clock.advance(Duration::from_nanos(advance));
                direct(&a, 1, &mut kept[0]);
                kept
            })
        };
        let mut kept = [Kept::new(), Kept::new()];
        chain_call(&chain, 1, &mut kept);
        merge(&mut kept, racer.join().unwrap());
        while direct(&a, 1, &mut kept[0]) {}
        audit(first, &kept[0]);
        audit(fixed(1), &kept[1]);
    });
}

/// The token bucket (burst 1), the clock two intervals on: the bucket drains, so the racer's
/// admission moves `tat` to 3 intervals from 1, not 2. Refunding the whole interval after that
/// would credit a permit the bucket never lacked; the refund, decayed by the time elapsed, gives
/// back nothing then, and the main thread's attempt fails. (Without the decay this model fails.)
#[test]
fn refund_races_clock_token_bucket() {
    refund_races_clock(bucket(1), 2 * WINDOW);
}

/// The fixed window (limit 1), the clock one window on: a refund that reads the new window must
/// not take the racer's admission off the new window's count.
#[test]
fn refund_races_clock_fixed_window() {
    refund_races_clock(fixed(1), WINDOW);
}

/// The sliding counter (limit 1), the clock one and a half windows on: the refund races the
/// roll-over, so the refunded permit may stay in `previous` (conservative), never less.
#[test]
fn refund_races_clock_sliding_counter() {
    refund_races_clock(counter(1), WINDOW + WINDOW / 2);
}

/// The sliding counter (limit 2) in window 2^31, whose 31-bit id wraps to 0, with a permit in
/// the window before it (id 2^31 − 1), which still weighs in full: the chain's refund empties
/// window 0 and must keep that weight (it writes `(ID_MASK, prev)`, `prev` read from
/// `previous`), while the racer's direct call races the refund. Then the main thread asks for
/// two permits, which the estimate never has room for, and takes what is left one by one:
/// never above the estimate, and one permit in window 2^31 in all. (With the refund writing
/// `(ID_MASK, 0)`, the two were admitted whenever the racer's call came before the refund.)
#[test]
fn refund_of_a_wrapped_window_zero_races_admission_sliding_counter() {
    model(|| {
        let clock = ManualClock::new();
        let [a, b] = members(&clock, counter(2), fixed(1));
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        let mut kept = [Kept::new(), Kept::new()];
        clock.set(Duration::from_nanos(((1 << 31) - 1) * WINDOW));
        assert!(direct(&a, 1, &mut kept[0]));
        clock.set(Duration::from_nanos((1 << 31) * WINDOW));
        let racer = {
            let (a, b) = (a.clone(), b.clone());
            thread::spawn(move || {
                let mut kept = [Kept::new(), Kept::new()];
                direct(&b, 1, &mut kept[1]);
                direct(&a, 1, &mut kept[0]);
                kept
            })
        };
        chain_call(&chain, 1, &mut kept);
        merge(&mut kept, racer.join().unwrap());
        direct(&a, 2, &mut kept[0]);
        while direct(&a, 1, &mut kept[0]) {}
        audit(counter(2), &kept[0]);
        audit(fixed(1), &kept[1]);
        assert_eq!(permits(&kept[0]), 2, "one before the wrap, one after");
    });
}

/// A chain charge racing a chain call's refund on the same word. The racer takes the second
/// member's only permit, then charges the chain 1 (`Chain::charge`: the first member, then the
/// second); the main thread's chain call commits the first member and, having lost the second,
/// refunds the first, its refund CAS racing the charge's CAS there. The chain's charge adds no
/// atomic step of its own (each member's `charge`, in turn), so what is checked is that a
/// member's charge and a refund on it lose neither update: with the clock still, the first
/// member ends with exactly its capacity less its kept admissions and the charge.
fn charge_races_refund(first: Algorithm) {
    model(move || {
        let clock = ManualClock::new();
        let [a, b] = members(&clock, first, fixed(1));
        let chain = Chain::new([a.clone(), b.clone()]).unwrap();
        let racer = {
            let (b, chain) = (b.clone(), chain.clone());
            thread::spawn(move || {
                let mut kept = [Kept::new(), Kept::new()];
                direct(&b, 1, &mut kept[1]);
                chain.charge(1).unwrap();
                kept
            })
        };
        let mut kept = [Kept::new(), Kept::new()];
        chain_call(&chain, 1, &mut kept);
        merge(&mut kept, racer.join().unwrap());
        audit(first, &kept[0]);
        audit(fixed(1), &kept[1]);
        assert_eq!(
            permits(&kept[1]),
            1,
            "one of the two takes the second member"
        );
        assert_eq!(
            a.charge(0).unwrap().remaining(),
            2 - permits(&kept[0]) - 1,
            "the first member lost the charge or the refund"
        );
        assert_eq!(b.charge(0).unwrap().remaining(), 0);
        let stats = chain.stats();
        assert_eq!(
            stats.admitted + stats.rejected,
            1,
            "the charge is not counted"
        );
    });
}

/// `charge_races_refund` on a token bucket of burst 2: the refund moves `tat` back by one
/// interval, the charge forward by one, in either order.
#[test]
fn charge_races_refund_token_bucket() {
    charge_races_refund(bucket(2));
}

/// `charge_races_refund` on a fixed window of 2: the refund's CAS down and the charge's CAS up
/// on the same count.
#[test]
fn charge_races_refund_fixed_window() {
    charge_races_refund(fixed(2));
}

/// `charge_races_refund` on a sliding counter of 2 (still clock: no roll-over).
#[test]
fn charge_races_refund_sliding_counter() {
    charge_races_refund(counter(2));
}

/// The keyed models' chain: a fixed window of 1 per key, then a global fixed window of 1, on
/// one manual clock; with handles on both members for direct calls.
fn keyed_chain() -> (
    turnstile::KeyedLimiter<u8, ManualClock>,
    Limiter,
    turnstile::KeyedChain<u8, ManualClock>,
) {
    let clock = ManualClock::new();
    let per_key = turnstile::KeyedLimiter::with_clock(fixed(1), clock.clone()).unwrap();
    let global = RateLimiter::with_clock(fixed(1), clock).unwrap();
    let chain = turnstile::KeyedChain::builder()
        .per_key(per_key.clone())
        .global(global.clone())
        .build()
        .unwrap();
    (per_key, global, chain)
}

/// A keyed chain (a fixed window of 1 per key, a global fixed window of 1): the refund of the
/// key's cell races a direct admission for the same key.
#[test]
fn keyed_refund_races_admission() {
    model(|| {
        let (per_key, global, chain) = keyed_chain();
        let racer = {
            let (per_key, global) = (per_key.clone(), global.clone());
            thread::spawn(move || {
                let mut kept = [Kept::new(), Kept::new()];
                direct(&global, 1, &mut kept[1]);
                if let Ok(a) = per_key.try_acquire(&7) {
                    kept[0].push((a.at_nanos(), 1));
                }
                kept
            })
        };
        let mut kept = [Kept::new(), Kept::new()];
        if let Ok(a) = chain.try_acquire(&7) {
            kept[0].push((a.at_nanos(), 1));
            kept[1].push((a.at_nanos(), 1));
        }
        merge(&mut kept, racer.join().unwrap());
        audit(fixed(1), &kept[0]);
        audit(fixed(1), &kept[1]);
        assert_eq!(per_key.available(&7), 1 - permits(&kept[0]));
    });
}

/// A keyed chain's refund after a reset (`KeyedLimiter::reset`) of its key. The chain (a fixed
/// window of 1 per key, then a global one of 1) commits the key's permit; the racer takes the
/// global permit, so that the chain's second commit fails and it gives the key's permit back,
/// and resets the key and takes the key's fresh permit. Should the reset land between the
/// chain's commit and its refund, the refund must not go to the key's new cell, which never held
/// the chain's permit: the racer's admission there would be undone and the key would admit a
/// second time in the window. The main thread's final attempt checks just that.
#[test]
fn keyed_refund_after_a_reset_stays_out_of_the_new_cell() {
    model(|| {
        let (per_key, global, chain) = keyed_chain();
        let racer = {
            let (per_key, global) = (per_key.clone(), global.clone());
            thread::spawn(move || {
                let _ = global.try_acquire();
                per_key.reset(&7);
                per_key.try_acquire(&7).is_ok()
            })
        };
        let chained = chain.try_acquire(&7).is_ok();
        let racer_kept = racer.join().unwrap();
        if racer_kept {
            // The racer's permit was taken after its reset: the key's fresh state is spent.
            assert!(
                per_key.try_acquire(&7).is_err(),
                "the key admitted twice after its reset (chained: {chained})"
            );
        }
    });
}

/// A keyed chain at its per-key member's key cap: a call for a key that a sweep is evicting
/// is admitted (the key's idle cell is being retired, and its slot comes back or the spare slot
/// serves it), never refused by the chain's check or its commit as over the cap.
#[test]
fn a_keyed_chain_call_racing_the_eviction_of_its_key_at_the_cap_is_admitted() {
    model(|| {
        let clock = ManualClock::new();
        // A hasher with fixed keys, so every execution puts the key in the same shard.
        type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
        let per_key = turnstile::KeyedLimiter::<u8>::builder(fixed(1))
            .clock(clock.clone())
            .hasher(Fixed::default())
            .max_keys(1)
            .build()
            .unwrap();
        let global = RateLimiter::with_clock(fixed(1), clock.clone()).unwrap();
        let chain = turnstile::KeyedChain::builder()
            .per_key(per_key.clone())
            .global(global.clone())
            .build()
            .unwrap();
        assert!(chain.try_acquire(&7).is_ok());
        clock.advance(Duration::from_nanos(WINDOW));
        let sweeper = {
            let per_key = per_key.clone();
            thread::spawn(move || per_key.sweep())
        };
        let mine = chain.try_acquire(&7).map(|a| a.at_nanos());
        assert!(sweeper.join().unwrap() <= 1);
        assert_eq!(mine, Ok(WINDOW), "an idle key's call was refused");
        assert_eq!(per_key.len(), 1);
        assert_eq!(per_key.stats().overflowed, 0);
    });
}

/// A sweep that frees room under a per-key member's key cap tells the chain callers sleeping on
/// it (`Inner::sweep` in `src/keyed.rs`), after giving the slot back, as every change is told. The member (a
/// token bucket of 1 per `WINDOW`, one key, `KeyOverflow::Shared`) holds key 1, spent at 0, and
/// its overflow cell was spent at `WINDOW / 2` by key 2. The sweeper moves the clock to
/// `WINDOW`, where key 1 is idle (the overflow cell is not), and sweeps; the chain caller for
/// key 3, running the real chain decision as its attempt, is rejected on the overflow cell
/// until it or the sweeper evicts key 1. Wherever the sweep lands (before the caller's first
/// read of the epoch, during its attempt, while its own search for room finds the shard being
/// swept, between the attempt and its registration, or after it), the caller gets the room:
/// a lost notification is a deadlock here.
#[test]
fn a_sweep_freeing_room_at_the_key_cap_during_a_chain_wait_is_never_missed() {
    model(|| {
        let clock = ManualClock::new();
        // A hasher with fixed keys, so every execution puts the keys in the same shards.
        type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
        let per_key = turnstile::KeyedLimiter::<u8>::builder(bucket(1))
            .clock(clock.clone())
            .hasher(Fixed::default())
            .max_keys(1)
            .overflow(turnstile::KeyOverflow::Shared)
            .build()
            .unwrap();
        assert!(per_key.try_acquire(&1).is_ok());
        clock.advance(Duration::from_nanos(WINDOW / 2));
        assert!(per_key.try_acquire(&2).is_ok());
        assert_eq!(per_key.stats().overflowed, 1);
        let chain = turnstile::KeyedChain::builder()
            .per_key(per_key.clone())
            .build()
            .unwrap();
        let sweeper = {
            let (per_key, clock) = (per_key.clone(), clock.clone());
            thread::spawn(move || {
                clock.advance(Duration::from_nanos(WINDOW / 2));
                per_key.sweep()
            })
        };
        turnstile::ModelWaiter::default().wait_until(per_key.watchers_for_model(), || {
            chain.try_acquire(&3).is_ok()
        });
        assert!(sweeper.join().unwrap() <= 1);
        // On a cell of its own: the overflow cell is spent until 3 * WINDOW / 2.
        assert_eq!((per_key.len(), per_key.available(&3)), (1, 0));
    });
}

/// A change made between the caller's first read of the epoch and its registration is either
/// seen by its attempt, or by the second read (then it attempts again), or notifies it.
#[test]
fn close_during_a_chain_wait_is_never_missed() {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};
    model(|| {
        let watchers = Arc::new(turnstile::Watchers::default());
        let closed = Arc::new(AtomicBool::new(false));
        let closer = {
            let (watchers, closed) = (Arc::clone(&watchers), Arc::clone(&closed));
            thread::spawn(move || {
                closed.store(true, Ordering::Relaxed);
                watchers.changed_for_model();
            })
        };
        turnstile::ModelWaiter::default().wait_until(&watchers, || closed.load(Ordering::Relaxed));
        closer.join().unwrap();
    });
}

/// The caller stays registered between attempts: it needs two changes, each by its own thread,
/// and neither notification is lost, whether it lands before the registration, between two
/// attempts, or during the wait.
#[test]
fn two_changes_during_a_chain_wait_are_never_missed() {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU32, Ordering};
    model(|| {
        let watchers = Arc::new(turnstile::Watchers::default());
        let changes = Arc::new(AtomicU32::new(0));
        let changers: Vec<_> = (0..2)
            .map(|_| {
                let (watchers, changes) = (Arc::clone(&watchers), Arc::clone(&changes));
                thread::spawn(move || {
                    changes.fetch_add(1, Ordering::Relaxed);
                    watchers.changed_for_model();
                })
            })
            .collect();
        turnstile::ModelWaiter::default()
            .wait_until(&watchers, || changes.load(Ordering::Relaxed) == 2);
        for changer in changers {
            changer.join().unwrap();
        }
    });
}

/// A caller whose every failed attempt gives permits back (a commit that keeps losing after its
/// check passed) expects its own refunds' bumps at its registration, and that never hides a
/// real change: one always reaches it (a lost one is a deadlock here). That its own refunds do
/// not wake it is checked by `tests/chain.rs` (`a_*_chain_caller_is_not_woken_by_its_own_refunds`):
/// loom schedules the closer into a caller's loop either way.
#[test]
fn a_chain_callers_own_refunds_neither_wake_it_nor_hide_a_change() {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};
    model(|| {
        let watchers = Arc::new(turnstile::Watchers::default());
        let closed = Arc::new(AtomicBool::new(false));
        let closer = {
            let (watchers, closed) = (Arc::clone(&watchers), Arc::clone(&closed));
            thread::spawn(move || {
                closed.store(true, Ordering::Relaxed);
                watchers.changed_for_model();
            })
        };
        turnstile::ModelWaiter::default()
            .wait_until_refunding(&watchers, || closed.load(Ordering::Relaxed));
        closer.join().unwrap();
    });
}

/// A waker that records that it was woken (loom-visible).
#[derive(Default)]
struct Flag(loom::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, loom::sync::atomic::Ordering::SeqCst);
    }
}

/// A keyed chain's receipt taken from its per-key member's shared overflow cell (the member at
/// its key cap) is refunded while the head of another overflow key's queue makes its first
/// attempt on that cell. The cell's waiters wait in their own keys' queues, so the refund wakes
/// every queue's head (`KeyedLimiter::chain_wake`): either the head's attempt sees the permit
/// back, or its queue is found and its head woken, and served. Waking only the refunded key's
/// queue (which has no waiter) left the head asleep until its timer with the permit free.
#[test]
fn an_overflow_refund_racing_another_keys_head_is_never_missed() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    model(|| {
        let rt = common::paused_runtime();
        let _entered = rt.enter();
        type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
        let per_key = turnstile::KeyedLimiter::<u8>::builder(fixed(1))
            .hasher(Fixed::default())
            .clock(ManualClock::new())
            .max_keys(1)
            .overflow(turnstile::KeyOverflow::Shared)
            .build()
            .unwrap();
        let chain = turnstile::KeyedChain::builder()
            .per_key(per_key.clone())
            .build()
            .unwrap();
        per_key.try_acquire(&0).unwrap(); // holds the only key slot, busy
        let taken = chain.try_acquire_refundable(&1, 1).unwrap(); // the overflow cell's permit
        let refunder = thread::spawn(move || taken.refund());
        let woken = std::sync::Arc::new(Flag::default());
        let waker = Waker::from(std::sync::Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        let mut head = Box::pin(per_key.acquire(&2));
        let first = head.as_mut().poll(&mut cx);
        refunder.join().unwrap();
        if first.is_pending() {
            assert!(
                woken.0.load(loom::sync::atomic::Ordering::SeqCst),
                "the overflow key's head was left asleep with the permit free"
            );
            assert!(
                matches!(head.as_mut().poll(&mut cx), Poll::Ready(Ok(_))),
                "the woken head was not served"
            );
        }
    });
}

/// Two chain callers that must wait race for the chain's turn, each giving up at once: one may
/// take the turn while the other queues for it, or queue behind a turn held, promoted or not
/// when the first leaves. Both time out, and they leave nothing held: nobody waits, the room
/// is free (the gate is open: a call is admitted once the member allows it).
#[test]
fn waiting_chain_callers_racing_for_the_turn_leave_nothing_held() {
    model(|| {
        let clock = ManualClock::new();
        let member = Limiter::with_clock(fixed(1), clock.clone()).unwrap();
        member.try_acquire().unwrap();
        let chain = Chain::builder([member]).queue_limit(2).build().unwrap();
        let other = {
            let chain = chain.clone();
            thread::spawn(move || chain.acquire_blocking_timeout(1, Duration::ZERO))
        };
        let mine = chain.acquire_blocking_timeout(1, Duration::ZERO);
        let theirs = other.join().unwrap();
        assert_eq!(mine, Err(AcquireError::Timeout));
        assert_eq!(theirs, Err(AcquireError::Timeout));
        let stats = chain.stats();
        assert_eq!((stats.waiting, stats.cancelled), (0, 2));
        clock.advance(Duration::from_nanos(WINDOW));
        assert!(chain.try_acquire().is_ok(), "the gate stayed shut");
    });
}

/// A newcomer's `try_acquire` racing a chain caller that must wait (for 2, one free): the
/// newcomer either came first (and takes the free permit) or is refused, taking nothing; the
/// waiter gives up at once. Either way nothing stays held, and the gate opens again.
#[test]
fn waiting_chain_callers_against_a_newcomer_take_nothing_and_reopen() {
    model(|| {
        let clock = ManualClock::new();
        let member = Limiter::with_clock(fixed(2), clock.clone()).unwrap();
        member.try_acquire().unwrap();
        let chain = Chain::builder([member.clone()]).build().unwrap();
        let waiter = {
            let chain = chain.clone();
            thread::spawn(move || chain.acquire_blocking_timeout(2, Duration::ZERO))
        };
        let newcomer = chain.try_acquire();
        assert_eq!(waiter.join().unwrap(), Err(AcquireError::Timeout));
        match newcomer {
            Ok(_) => assert_eq!(member.stats().available, 0),
            Err(TryAcquireError::Rejected(_)) => assert_eq!(member.stats().available, 1),
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert_eq!(chain.stats().waiting, 0);
        clock.advance(Duration::from_nanos(WINDOW));
        assert!(chain.try_acquire_n(2).is_ok(), "the gate stayed shut");
    });
}
