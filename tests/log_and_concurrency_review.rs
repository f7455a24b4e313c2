//! Review probes of the exact sliding window (the log in a ring of timestamps) and the unkeyed
//! concurrency limiter. Time is driven by `ManualClock`; everything is in nanoseconds.

use std::time::Duration;
use turnstile::{Algorithm, Clock, ManualClock, RateLimiter, TryAcquireError};

const NS: fn(u64) -> Duration = Duration::from_nanos;

fn log(limit: u32, window: u64) -> (ManualClock, RateLimiter<ManualClock>) {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(
        Algorithm::SlidingWindow {
            limit,
            window: NS(window),
        },
        clock.clone(),
    )
    .unwrap();
    (clock, limiter)
}

#[allow(dead_code)]
fn retry(got: Result<turnstile::Admission, TryAcquireError>) -> u64 {
    match got {
        Err(TryAcquireError::Rejected(r)) => r.retry_after_nanos(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Limit 3: ticket 0 admitted at 0 (live until 10), ticket 1 admitted at 3 and refunded. A
/// probe at 3 sees one permit held until 10: the ring is full again in 7 ns, not at once (the
/// probe read the newest ticket alone, whose refunded expiry 0 said "now"). A check agrees.
#[test]
fn a_probe_looks_past_a_refunded_newest_ticket_for_its_reset_time() {
    let (clock, limiter) = log(3, 10);
    limiter.try_acquire().unwrap();
    clock.advance(NS(3));
    limiter.try_acquire_refundable(1).unwrap().refund();
    let probe = limiter.try_acquire_n(0).unwrap();
    assert_eq!((probe.remaining(), probe.reset_after()), (1, NS(7)));
    clock.advance(NS(6));
    let probe = limiter.try_acquire_n(0).unwrap();
    assert_eq!((probe.remaining(), probe.reset_after()), (1, NS(1)));
    clock.advance(NS(1));
    let probe = limiter.try_acquire_n(0).unwrap();
    assert_eq!((probe.remaining(), probe.reset_after()), (3, NS(0)));
}

/// The exact sliding window as its docs define it, ticket by ticket: every admitted permit
/// takes the next ticket and keeps the expiry it was admitted with (its time plus the window
/// then in force); a call for n takes tickets `[head, head + n)` only if every ticket below
/// `head + n − N` has expired (N: the limit now). A rejection's retry is the latest expiry of
/// the tickets `[head − N, end − N)` it is decided on, or, when those have all expired (only
/// after a lowering), of every ticket it waits for. `remaining` is the most one call could
/// take now; `reset_after` the latest expiry of all (at least the window, for an admission).
#[derive(Debug, Default)]
struct Tickets {
    limit: u64,
    window: u64,
    expiries: Vec<u64>,
}

impl Tickets {
    /// The latest expiry of tickets `[from, to)`, 0 if none.
    fn latest(&self, from: u64, to: u64) -> u64 {
        self.expiries[from as usize..to as usize]
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
    }

    fn fits(&self, now: u64, want: u64) -> bool {
        let head = self.expiries.len() as u64;
        (head + want).saturating_sub(self.limit) == 0
            || self.latest(0, head + want - self.limit) <= now
    }

    fn decide(&mut self, now: u64, n: u64) -> Option<Result<(u64, u64), u64>> {
        if n > self.limit {
            return None;
        }
        let head = self.expiries.len() as u64;
        let want = n.max(1);
        if !self.fits(now, want) {
            let end = head + want - self.limit;
            let usual = self.latest(head.saturating_sub(self.limit), end);
            let wait = if usual > now {
                usual
            } else {
                self.latest(0, end)
            };
            return Some(Err(wait - now));
        }
        self.expiries
            .extend(std::iter::repeat_n(now + self.window, n as usize));
        let remaining = (1..=self.limit).take_while(|&m| self.fits(now, m)).count() as u64;
        let mut reset = self
            .latest(0, self.expiries.len() as u64)
            .saturating_sub(now);
        if n > 0 {
            reset = reset.max(self.window);
        }
        Some(Ok((remaining, reset)))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(u32),
    Advance(u64),
    Reconfigure(u32, u64),
}

fn log_ops(capacity: u32) -> impl proptest::strategy::Strategy<Value = Vec<Op>> {
    use proptest::prelude::*;
    prop::collection::vec(
        prop_oneof![
            6 => (0..=capacity + 1).prop_map(Op::Acquire),
            4 => prop_oneof![3 => 0u64..8, 1 => 0u64..40].prop_map(Op::Advance),
            1 => (1..=capacity, 1u64..30).prop_map(|(l, w)| Op::Reconfigure(l, w)),
        ],
        1..120,
    )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, ..Default::default() })]

    /// Decisions, retry-after, remaining and reset-after (admissions and probes) through the
    /// public API match the ticket model exactly, across limit changes within `max_limit`
    /// (raises, lowerings) and window changes (growths, shrinks).
    #[test]
    fn the_log_matches_the_ticket_model_across_reconfigurations(
        (limit, extra, window) in (1u32..5, 0u32..3, 1u64..30),
        ops in log_ops(6),
    ) {
        let clock = ManualClock::new();
        let capacity = limit + extra;
        let limiter = RateLimiter::builder(Algorithm::SlidingWindow { limit, window: NS(window) })
            .clock(clock.clone())
            .max_limit(capacity)
            .build()
            .unwrap();
        let mut model = Tickets { limit: u64::from(limit), window, expiries: Vec::new() };
        let mut now = 0;
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Acquire(n) => {
                    let got = match limiter.try_acquire_n(n) {
                        Ok(a) => Some(Ok((
                            u64::from(a.remaining()),
                            a.reset_after().as_nanos() as u64,
                        ))),
                        Err(TryAcquireError::Rejected(r)) => Some(Err(r.retry_after_nanos())),
                        Err(TryAcquireError::InsufficientCapacity { .. }) => None,
                        Err(other) => panic!("unexpected {other:?}"),
                    };
                    let expected = model.decide(now, u64::from(n));
                    proptest::prop_assert_eq!(got, expected, "op {} (n {}) at {}: {:?}", i, n, now, model);
                }
                Op::Advance(d) => {
                    clock.advance(NS(d));
                    now += d;
                }
                Op::Reconfigure(to, w) => {
                    let to = to.min(capacity);
                    limiter
                        .reconfigure(Algorithm::SlidingWindow { limit: to, window: NS(w) })
                        .unwrap();
                    model.limit = u64::from(to);
                    model.window = w;
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum RefundOp {
    Op(Op),
    Hold(u32),
    Refund(usize),
}

fn refund_ops(capacity: u32) -> impl proptest::strategy::Strategy<Value = Vec<RefundOp>> {
    use proptest::prelude::*;
    prop::collection::vec(
        prop_oneof![
            4 => (0..=capacity + 1).prop_map(|n| RefundOp::Op(Op::Acquire(n))),
            3 => (1..=capacity).prop_map(RefundOp::Hold),
            3 => any::<usize>().prop_map(RefundOp::Refund),
            4 => prop_oneof![3 => 0u64..8, 1 => 0u64..40].prop_map(|d| RefundOp::Op(Op::Advance(d))),
            1 => (1..=capacity, 1u64..30).prop_map(|(l, w)| RefundOp::Op(Op::Reconfigure(l, w))),
        ],
        1..120,
    )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, ..Default::default() })]

    /// With refunds (receipts): a refund made under the parameters of its admission, before
    /// its expiry, marks its tickets expired in place (positional); one after a reconfiguration
    /// gives nothing back. Decisions and retry-after match the ticket model exactly;
    /// `reset_after` too while no window was ever shortened; `remaining` may over-count after a
    /// refund (documented: it gallops over an assumed expired prefix), never under-count.
    #[test]
    fn the_log_with_refunds_matches_the_ticket_model(
        (limit, extra, window) in (1u32..5, 0u32..3, 1u64..30),
        ops in refund_ops(6),
    ) {
        let clock = ManualClock::new();
        let capacity = limit + extra;
        let limiter = RateLimiter::builder(Algorithm::SlidingWindow { limit, window: NS(window) })
            .clock(clock.clone())
            .max_limit(capacity)
            .build()
            .unwrap();
        let mut model = Tickets { limit: u64::from(limit), window, expiries: Vec::new() };
        let mut now = 0;
        let mut version = 0;
        let mut shrunk = false;
        // (receipt, first ticket, permits, version admitted under)
        let mut held = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                RefundOp::Op(Op::Acquire(n)) => {
                    let got = match limiter.try_acquire_n(n) {
                        Ok(a) => Some(Ok((
                            u64::from(a.remaining()),
                            a.reset_after().as_nanos() as u64,
                        ))),
                        Err(TryAcquireError::Rejected(r)) => Some(Err(r.retry_after_nanos())),
                        Err(TryAcquireError::InsufficientCapacity { .. }) => None,
                        Err(other) => panic!("unexpected {other:?}"),
                    };
                    let expected = model.decide(now, u64::from(n));
                    match (got, expected) {
                        (Some(Ok((remaining, reset))), Some(Ok((model_remaining, model_reset)))) => {
                            proptest::prop_assert!(remaining >= model_remaining, "op {} remaining {} < {}: {:?}", i, remaining, model_remaining, model);
                            if shrunk {
                                // The walk from the `expired` hint may miss a live ticket
                                // behind it (documented): earlier, never later.
                                proptest::prop_assert!(reset <= model_reset, "op {} reset {} > {}: {:?}", i, reset, model_reset, model);
                            } else {
                                proptest::prop_assert_eq!(reset, model_reset, "op {} reset: {:?}", i, model);
                            }
                        }
                        (got, expected) => proptest::prop_assert_eq!(got, expected, "op {} (n {}) at {}: {:?}", i, n, now, model),
                    }
                }
                RefundOp::Hold(n) => {
                    let first = model.expiries.len();
                    let got = limiter.try_acquire_refundable(n);
                    let expected = model.decide(now, u64::from(n));
                    proptest::prop_assert_eq!(got.is_ok(), matches!(expected, Some(Ok(_))), "op {} hold {}: {:?}", i, n, model);
                    if let Ok(receipt) = got {
                        held.push((receipt, first, n as usize, version));
                    }
                }
                RefundOp::Refund(which) => {
                    if held.is_empty() {
                        continue;
                    }
                    let (receipt, first, n, admitted_under) = held.swap_remove(which % held.len());
                    receipt.refund();
                    if admitted_under == version && model.expiries[first] > now {
                        model.expiries[first..first + n].fill(0);
                    }
                }
                RefundOp::Op(Op::Advance(d)) => {
                    clock.advance(NS(d));
                    now += d;
                }
                RefundOp::Op(Op::Reconfigure(to, w)) => {
                    let to = to.min(capacity);
                    limiter
                        .reconfigure(Algorithm::SlidingWindow { limit: to, window: NS(w) })
                        .unwrap();
                    shrunk |= w < model.window;
                    model.limit = u64::from(to);
                    model.window = w;
                    version += 1;
                }
            }
        }
    }
}

/// Two threads claim on one exact sliding window in lockstep rounds (the clock stands still
/// within a round) while, between rounds, the driver moves the clock and raises or lowers the
/// limit within `max_limit` and grows or shrinks the window. Whatever order the claims of a
/// round took, the last of them saw every earlier admission: if a round admitted anything, the
/// permits live at its instant (earlier rounds' under the window each was admitted with, and
/// the round's own) are at most the round's limit. Lowerings make the ring check back to the
/// largest limit set until an admission settles it; that is what two racing claims exercise.
#[test]
fn the_log_under_load_never_over_admits_across_reconfigurations() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const ROUNDS: u64 = 3000;
    const MAX: u32 = 6;
    let clock = ManualClock::new();
    let limiter = RateLimiter::builder(Algorithm::SlidingWindow {
        limit: 3,
        window: NS(10),
    })
    .clock(clock.clone())
    .max_limit(MAX)
    .build()
    .unwrap();
    let (round, acks, done) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    // Per round: (instant, limit, window).
    let mut rounds = vec![(0u64, 0u32, 0u64)];
    let admitted = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u32)
            .map(|id| {
                let (limiter, round, acks, done) = (&limiter, &round, &acks, &done);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let mut seen = 0;
                    loop {
                        let r = loop {
                            let r = round.load(Ordering::Acquire);
                            if r != seen || done.load(Ordering::Acquire) {
                                break r;
                            }
                            std::thread::yield_now();
                        };
                        if r == seen {
                            return mine;
                        }
                        seen = r;
                        for i in 0..3u32 {
                            let n = 1 + (i + id + r as u32) % 3;
                            if let Ok(a) = limiter.try_acquire_n(n) {
                                mine.push((r, a.at_nanos(), u64::from(n)));
                            }
                        }
                        acks.fetch_add(1, Ordering::AcqRel);
                    }
                })
            })
            .collect();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut limit, mut window) = (3u32, 10u64);
        for r in 1..=ROUNDS {
            clock.advance(NS(next() % 5));
            if next() % 3 == 0 {
                limit = 1 + (next() % u64::from(MAX)) as u32;
                window = [3, 10, 25][(next() % 3) as usize];
                limiter
                    .reconfigure(Algorithm::SlidingWindow {
                        limit,
                        window: NS(window),
                    })
                    .unwrap();
            }
            rounds.push((clock.now(), limit, window));
            round.store(r, Ordering::Release);
            while acks.load(Ordering::Acquire) < 2 * r {
                std::thread::yield_now();
            }
        }
        done.store(true, Ordering::Release);
        let mut all: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        all.sort_unstable();
        all
    });
    assert!(
        admitted.len() > 1000,
        "too few admissions: {}",
        admitted.len()
    );
    let mut lowered_rounds_admitting = 0;
    for r in 1..=ROUNDS {
        let (at, limit, _) = rounds[r as usize];
        let mine: u64 = admitted
            .iter()
            .filter(|&&(ar, ..)| ar == r)
            .map(|&(_, t, n)| {
                assert_eq!(t, at, "round {r} admitted at another instant");
                n
            })
            .sum();
        if mine == 0 {
            continue;
        }
        if rounds[..r as usize].iter().any(|&(_, l, _)| l > limit) {
            lowered_rounds_admitting += 1;
        }
        let earlier: u64 = admitted
            .iter()
            .filter(|&&(ar, t, _)| ar < r && at < t + rounds[ar as usize].2)
            .map(|&(.., n)| n)
            .sum();
        assert!(
            earlier + mine <= u64::from(limit),
            "round {r} at {at}: {earlier} live from earlier rounds + {mine} admitted > limit {limit}"
        );
    }
    assert!(
        lowered_rounds_admitting > 100,
        "too few admissions after a lowering"
    );
}
