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

/// A log of `limit` in `window` ns that may be raised up to `capacity`, on a clock of its own,
/// and the ticket model it starts equal to.
fn log_and_model(
    limit: u32,
    capacity: u32,
    window: u64,
) -> (ManualClock, RateLimiter<ManualClock>, Tickets) {
    let clock = ManualClock::new();
    let limiter = RateLimiter::builder(Algorithm::SlidingWindow {
        limit,
        window: NS(window),
    })
    .clock(clock.clone())
    .max_limit(capacity)
    .build()
    .unwrap();
    let model = Tickets {
        limit: u64::from(limit),
        window,
        expiries: Vec::new(),
    };
    (clock, limiter, model)
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
        let capacity = limit + extra;
        let (clock, limiter, mut model) = log_and_model(limit, capacity, window);
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
        let capacity = limit + extra;
        let (clock, limiter, mut model) = log_and_model(limit, capacity, window);
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

mod concurrency_model {
    //! The unkeyed concurrency limiter against a sequential model of its documented queue:
    //! futures polled by hand, each with a waker that records its wake-ups. After every step
    //! the woken futures are polled until none is woken; then every future the model says is
    //! served or failed must have been (a future the model serves that is still pending and
    //! was never woken is a lost wake-up), and the permits free, the queue and the counts must
    //! agree.

    use proptest::prelude::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    use turnstile::{AcquireError, ConcurrencyLimiter, OwnedPermit, QueueOrder, TryPermitError};

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    type Pending = Pin<Box<dyn Future<Output = Result<OwnedPermit, AcquireError>> + Send>>;

    struct Waiting {
        id: u64,
        n: u32,
        future: Pending,
        flag: Arc<Flag>,
    }

    #[derive(Debug, Clone)]
    pub(super) enum Step {
        Try(u32),
        Acquire(u32),
        Release(usize),
        Cancel(usize),
        SetLimit(u32),
        Close,
    }

    pub(super) fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                2 => (0u32..5).prop_map(Step::Try),
                4 => (0u32..5).prop_map(Step::Acquire),
                4 => any::<usize>().prop_map(Step::Release),
                2 => any::<usize>().prop_map(Step::Cancel),
                2 => (1u32..5).prop_map(Step::SetLimit),
                1 => Just(Step::Close),
            ],
            1..80,
        )
    }

    /// The model: the limit, the permits in use, the queue in arrival order (id, n).
    #[derive(Debug)]
    struct Model {
        order: QueueOrder,
        queue_limit: u64,
        limit: u32,
        in_use: u32,
        closed: bool,
        queue: Vec<(u64, u32)>,
        admitted: u64,
        rejected: u64,
        cancelled: u64,
    }

    impl Model {
        fn free(&self) -> u32 {
            self.limit.saturating_sub(self.in_use)
        }

        fn room(&self) -> u64 {
            self.queue.iter().map(|&(_, n)| u64::from(n.max(1))).sum()
        }

        fn head(&self) -> Option<usize> {
            match self.order {
                _ if self.queue.is_empty() => None,
                QueueOrder::NewestFirst => Some(self.queue.len() - 1),
                _ => Some(0),
            }
        }

        /// Serves heads while they fit; returns (id, outcome) of those that left.
        fn settle(&mut self, out: &mut Vec<(u64, Result<u32, AcquireError>)>) {
            while let Some(h) = self.head() {
                let (id, n) = self.queue[h];
                if n > self.limit {
                    self.queue.remove(h);
                    self.rejected += 1;
                    out.push((
                        id,
                        Err(AcquireError::InsufficientCapacity {
                            requested: n,
                            capacity: self.limit,
                        }),
                    ));
                } else if self.free() >= n.max(1) {
                    self.queue.remove(h);
                    self.in_use += n;
                    self.admitted += 1;
                    out.push((id, Ok(n)));
                } else {
                    break;
                }
            }
        }
    }

    pub(super) fn run(order: QueueOrder, queue_limit: u64, limit: u32, steps: Vec<Step>) {
        let limiter = ConcurrencyLimiter::builder(limit)
            .queue_order(order)
            .queue_limit(queue_limit)
            .build()
            .unwrap();
        let mut model = Model {
            order,
            queue_limit,
            limit,
            in_use: 0,
            closed: false,
            queue: Vec::new(),
            admitted: 0,
            rejected: 0,
            cancelled: 0,
        };
        let mut held: Vec<OwnedPermit> = Vec::new();
        let mut waiting: Vec<Waiting> = Vec::new();
        let mut next_id = 0u64;
        for (i, step) in steps.into_iter().enumerate() {
            // What the model decides at this step: outcomes of futures by id.
            let mut expected: Vec<(u64, Result<u32, AcquireError>)> = Vec::new();
            match step {
                Step::Try(n) => {
                    let got = limiter.try_acquire_owned(n);
                    let want = if model.closed {
                        Err(TryPermitError::Closed)
                    } else if n <= model.limit
                        && !model.queue.is_empty()
                        && order == QueueOrder::OldestFirst
                    {
                        Err(TryPermitError::NoPermits {
                            available: model.free(),
                            requested: n,
                        })
                    } else if n > model.limit {
                        Err(TryPermitError::InsufficientCapacity {
                            requested: n,
                            capacity: model.limit,
                        })
                    } else if model.free() < n.max(1) {
                        Err(TryPermitError::NoPermits {
                            available: model.free(),
                            requested: n,
                        })
                    } else {
                        Ok(n)
                    };
                    assert_eq!(
                        got.as_ref().map(OwnedPermit::permits).map_err(Clone::clone),
                        want,
                        "step {i}: try {n}: {model:?}"
                    );
                    match got {
                        Ok(p) => {
                            model.in_use += n;
                            model.admitted += 1;
                            held.push(p);
                        }
                        Err(_) => model.rejected += 1,
                    }
                }
                Step::Acquire(n) => {
                    let id = next_id;
                    next_id += 1;
                    let flag = Arc::new(Flag(AtomicBool::new(true)));
                    waiting.push(Waiting {
                        id,
                        n,
                        future: Box::pin(limiter.acquire_owned(n)),
                        flag,
                    });
                    // The fast path, then the queue.
                    if model.closed {
                        model.rejected += 1;
                        expected.push((id, Err(AcquireError::Closed)));
                    } else if n <= model.limit
                        && !model.queue.is_empty()
                        && order == QueueOrder::OldestFirst
                        || n <= model.limit && model.free() < n.max(1)
                    {
                        let need = u64::from(n.max(1));
                        if need > model.queue_limit
                            || order == QueueOrder::OldestFirst
                                && model.room() + need > model.queue_limit
                        {
                            model.rejected += 1;
                            expected.push((
                                id,
                                Err(AcquireError::QueueFull {
                                    requested: n,
                                    queue_limit: model.queue_limit,
                                }),
                            ));
                        } else {
                            while model.room() + need > model.queue_limit {
                                let (old, m) = model.queue.remove(0);
                                model.rejected += 1;
                                expected.push((
                                    old,
                                    Err(AcquireError::QueueFull {
                                        requested: m,
                                        queue_limit: model.queue_limit,
                                    }),
                                ));
                            }
                            model.queue.push((id, n));
                        }
                    } else if n > model.limit {
                        model.rejected += 1;
                        expected.push((
                            id,
                            Err(AcquireError::InsufficientCapacity {
                                requested: n,
                                capacity: model.limit,
                            }),
                        ));
                    } else {
                        model.in_use += n;
                        model.admitted += 1;
                        expected.push((id, Ok(n)));
                    }
                }
                Step::Release(which) => {
                    if held.is_empty() {
                        continue;
                    }
                    let permit = held.swap_remove(which % held.len());
                    model.in_use -= permit.permits();
                    drop(permit);
                }
                Step::Cancel(which) => {
                    if waiting.is_empty() {
                        continue;
                    }
                    let w = waiting.swap_remove(which % waiting.len());
                    let at = model.queue.iter().position(|&(id, _)| id == w.id);
                    // Futures are polled to quiescence after every step: one still here is
                    // queued.
                    let at =
                        at.unwrap_or_else(|| panic!("step {i}: cancelled {} not queued", w.id));
                    model.queue.remove(at);
                    model.cancelled += 1;
                    drop(w);
                }
                Step::SetLimit(to) => {
                    limiter.set_limit(to).unwrap();
                    model.limit = to;
                    let (fail, keep): (Vec<_>, Vec<_>) =
                        model.queue.iter().partition(|&&(_, n)| n > to);
                    model.queue = keep;
                    for (id, n) in fail {
                        model.rejected += 1;
                        expected.push((
                            id,
                            Err(AcquireError::InsufficientCapacity {
                                requested: n,
                                capacity: to,
                            }),
                        ));
                    }
                }
                Step::Close => {
                    limiter.close();
                    model.closed = true;
                    for (id, _) in model.queue.drain(..) {
                        model.rejected += 1;
                        expected.push((id, Err(AcquireError::Closed)));
                    }
                }
            }
            if !model.closed {
                model.settle(&mut expected);
            }
            // Poll the woken futures until none is woken.
            let mut got: Vec<(u64, Result<u32, AcquireError>)> = Vec::new();
            loop {
                let mut progress = false;
                let mut k = 0;
                while k < waiting.len() {
                    if !waiting[k].flag.0.swap(false, Ordering::SeqCst) {
                        k += 1;
                        continue;
                    }
                    progress = true;
                    let waker = Waker::from(Arc::clone(&waiting[k].flag));
                    let mut cx = Context::from_waker(&waker);
                    match waiting[k].future.as_mut().poll(&mut cx) {
                        Poll::Ready(outcome) => {
                            let w = waiting.swap_remove(k);
                            got.push((
                                w.id,
                                outcome
                                    .as_ref()
                                    .map(OwnedPermit::permits)
                                    .map_err(Clone::clone),
                            ));
                            if let Ok(p) = outcome {
                                assert_eq!(p.permits(), w.n);
                                held.push(p);
                            }
                        }
                        Poll::Pending => k += 1,
                    }
                }
                if !progress {
                    break;
                }
            }
            got.sort_by_key(|&(id, _)| id);
            expected.sort_by_key(|&(id, _)| id);
            assert_eq!(got, expected, "step {i} ({step:?}): {model:?}");
            let stats = limiter.stats();
            assert_eq!(
                (stats.available, stats.waiting, stats.queued_permits),
                (model.free(), model.queue.len(), model.room()),
                "step {i} ({step:?}): {model:?}"
            );
            assert_eq!(
                (stats.admitted, stats.rejected, stats.cancelled),
                (model.admitted, model.rejected, model.cancelled),
                "step {i} ({step:?}) counts: {model:?}"
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, ..Default::default() })]

    /// See [`concurrency_model`]: both queue orders, queue limits small enough to fill.
    #[test]
    fn the_concurrency_limiter_matches_its_queue_model(
        newest in proptest::bool::ANY,
        queue_limit in 0u64..8,
        limit in 1u32..5,
        steps in concurrency_model::steps(),
    ) {
        let order = if newest { turnstile::QueueOrder::NewestFirst } else { turnstile::QueueOrder::OldestFirst };
        concurrency_model::run(order, queue_limit, limit, steps);
    }
}

/// As [`the_log_under_load_never_over_admits_across_reconfigurations`], with receipts given
/// back by the workers as they go (races between a refund's compare-and-swap of its slots and
/// the other thread's claims). A refund takes effect only under the parameters of its
/// admission (reconfigurations fall between rounds here), so the bound counts every admission
/// still live at the round's instant except those refunded, in that round or before, under the
/// version they were admitted with: a refund that landed before the round's last claim may have
/// let it admit, one after it only lowers the count.
#[test]
fn the_log_with_refunds_under_load_never_over_admits() {
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
    // Per round: (instant, limit, window, version).
    let mut rounds = vec![(0u64, 0u32, 0u64, 0u64)];
    // (round, at, n, refunded in round)
    type Admitted = (u64, u64, u64, Option<u64>);
    let admitted: Vec<Admitted> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u32)
            .map(|id| {
                let (limiter, round, acks, done) = (&limiter, &round, &acks, &done);
                s.spawn(move || {
                    let mut mine: Vec<Admitted> = Vec::new();
                    let mut held = std::collections::VecDeque::new();
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
                            let k = i + id + r as u32;
                            if k.is_multiple_of(3)
                                && let Some((receipt, at)) = held.pop_front()
                            {
                                turnstile::Refundable::refund(receipt);
                                let m: &mut Admitted = &mut mine[at];
                                m.3 = Some(r);
                            }
                            let n = 1 + k % 3;
                            if let Ok(receipt) = limiter.try_acquire_refundable(n) {
                                mine.push((r, receipt.admission().at_nanos(), u64::from(n), None));
                                if k.is_multiple_of(2) {
                                    held.push_back((receipt, mine.len() - 1));
                                }
                            }
                        }
                        acks.fetch_add(1, Ordering::AcqRel);
                    }
                })
            })
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut limit, mut window, mut version) = (3u32, 10u64, 0u64);
        for r in 1..=ROUNDS {
            clock.advance(NS(next() % 5));
            if next() % 4 == 0 {
                limit = 1 + (next() % u64::from(MAX)) as u32;
                window = [3, 10, 25][(next() % 3) as usize];
                limiter
                    .reconfigure(Algorithm::SlidingWindow {
                        limit,
                        window: NS(window),
                    })
                    .unwrap();
                version += 1;
            }
            rounds.push((clock.now(), limit, window, version));
            round.store(r, Ordering::Release);
            while acks.load(Ordering::Acquire) < 2 * r {
                std::thread::yield_now();
            }
        }
        done.store(true, Ordering::Release);
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert!(
        admitted.len() > 1000,
        "too few admissions: {}",
        admitted.len()
    );
    let refunds = admitted
        .iter()
        .filter(|&&(ar, _, _, by)| {
            by.is_some_and(|by| rounds[by as usize].3 == rounds[ar as usize].3)
        })
        .count();
    assert!(refunds > 300, "too few refunds that count: {refunds}");
    for r in 1..=ROUNDS {
        let (at, limit, ..) = rounds[r as usize];
        if !admitted.iter().any(|&(ar, ..)| ar == r) {
            continue;
        }
        let live: u64 = admitted
            .iter()
            .filter(|&&(ar, t, _, by)| {
                let (_, _, window, version) = rounds[ar as usize];
                let refunded = by.is_some_and(|by| by <= r && rounds[by as usize].3 == version);
                ar <= r && at < t + window && !refunded
            })
            .map(|&(_, _, n, _)| n)
            .sum();
        assert!(
            live <= u64::from(limit),
            "round {r} at {at}: {live} live > limit {limit}"
        );
    }
}
