//! Sequential reference models of the four algorithms, written independently of the lock-free
//! code (shared by `tests/model.rs` and `tests/chain.rs`).

use std::collections::VecDeque;
use turnstile::{Algorithm, Rate};

/// What a reference model decides: Ok(remaining) or Err(retry_after), or None for "can never fit".
pub type Expected = Option<Result<u64, u64>>;

pub trait Model {
    fn decide(&mut self, now: u64, n: u64) -> Expected;

    /// Records `n` permits at `now` whatever the limit (a limiter's `charge`): returns the
    /// permits left (0 in debt) and the time until the limiter is full again.
    fn charge(&mut self, now: u64, n: u64) -> (u64, u64);
}

/// Fixed window, kept as "window index → count".
#[derive(Debug, Clone)]
pub struct FixedModel {
    pub limit: u64,
    pub window: u64,
    pub index: u64,
    pub count: u64,
}

impl Model for FixedModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.limit {
            return None;
        }
        if now / self.window != self.index {
            self.index = now / self.window;
            self.count = 0;
        }
        let reset = (self.index + 1) * self.window - now;
        if self.count + n.max(1) > self.limit {
            return Some(Err(reset));
        }
        self.count += n;
        Some(Ok(self.limit - self.count))
    }

    fn charge(&mut self, now: u64, n: u64) -> (u64, u64) {
        if now / self.window != self.index {
            self.index = now / self.window;
            self.count = 0;
        }
        // The count is a 32-bit field.
        self.count = (self.count + n).min(u64::from(u32::MAX));
        let reset = (self.index + 1) * self.window - now;
        (self.limit.saturating_sub(self.count), reset)
    }
}

/// Sliding log: the times of the admissions still inside the window.
#[derive(Debug, Clone)]
pub struct LogModel {
    pub limit: u64,
    pub window: u64,
    pub log: VecDeque<u64>,
}

impl Model for LogModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.limit {
            return None;
        }
        while self.log.front().is_some_and(|&t| t + self.window <= now) {
            self.log.pop_front();
        }
        let live = self.log.len() as u64;
        let want = n.max(1);
        if live + want > self.limit {
            // The (live + want − limit)-th oldest live admission must leave first.
            let blocker = self.log[(live + want - self.limit - 1) as usize];
            return Some(Err(blocker + self.window - now));
        }
        for _ in 0..n {
            self.log.push_back(now);
        }
        Some(Ok(self.limit - live - n))
    }

    fn charge(&mut self, now: u64, n: u64) -> (u64, u64) {
        while self.log.front().is_some_and(|&t| t + self.window <= now) {
            self.log.pop_front();
        }
        // The log remembers `limit` entries: the newest.
        for _ in 0..n.min(self.limit) {
            self.log.push_back(now);
        }
        while self.log.len() as u64 > self.limit {
            self.log.pop_front();
        }
        let reset = self.log.back().map_or(0, |&t| t + self.window - now);
        (self.limit - self.log.len() as u64, reset)
    }
}

/// Sliding counter: counts per fixed window, estimate = prev·(W − e)/W + cur, in rationals.
#[derive(Debug, Clone)]
pub struct CounterModel {
    pub limit: u64,
    pub window: u64,
    pub counts: std::collections::HashMap<u64, u64>,
}

impl CounterModel {
    fn fits(&self, prev: u64, cur: u64, n: u64, e: u64) -> bool {
        // estimate + n ≤ limit, multiplied through by W.
        (prev as u128) * ((self.window - e) as u128) + ((cur + n) as u128) * (self.window as u128)
            <= (self.limit as u128) * (self.window as u128)
    }
}

impl Model for CounterModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.limit {
            return None;
        }
        let (w, e) = (now / self.window, now % self.window);
        let prev = if w == 0 {
            0
        } else {
            *self.counts.get(&(w - 1)).unwrap_or(&0)
        };
        let cur = *self.counts.get(&w).unwrap_or(&0);
        let want = n.max(1);
        if !self.fits(prev, cur, want, e) {
            // Search the first instant (in ns) at which `want` fits, assuming nothing else happens.
            let mut t = now + 1;
            loop {
                let (w2, e2) = (t / self.window, t % self.window);
                let p = if w2 == w {
                    prev
                } else if w2 == w + 1 {
                    cur
                } else {
                    0
                };
                let c = if w2 == w { cur } else { 0 };
                if self.fits(p, c, want, e2) {
                    return Some(Err(t - now));
                }
                t += 1;
            }
        }
        *self.counts.entry(w).or_insert(0) += n;
        let weighted = ((prev as u128) * ((self.window - e) as u128)).div_ceil(self.window as u128);
        Some(Ok(self.limit - cur - n - weighted as u64))
    }

    fn charge(&mut self, now: u64, n: u64) -> (u64, u64) {
        let (w, e) = (now / self.window, now % self.window);
        let prev = if w == 0 {
            0
        } else {
            *self.counts.get(&(w - 1)).unwrap_or(&0)
        };
        let cur = self.counts.entry(w).or_insert(0);
        // The count is a 32-bit field.
        *cur = (*cur + n).min(u64::from(u32::MAX));
        let cur = *cur;
        let weighted = ((prev as u128) * ((self.window - e) as u128)).div_ceil(self.window as u128);
        let reset = if cur > 0 {
            2 * self.window - e
        } else if prev > 0 {
            self.window - e
        } else {
            0
        };
        let remaining = self
            .limit
            .saturating_sub(cur)
            .saturating_sub(weighted as u64);
        (remaining, reset)
    }
}

/// Token bucket as accumulated credit (in nanoseconds of capacity), not as GCRA's arrival time.
/// A charge beyond the credit leaves a debt (credit 0), paid off by time before credit accrues.
#[derive(Debug, Clone)]
pub struct CreditModel {
    pub interval: u64,
    pub burst: u64,
    pub credit: u64,
    pub last: u64,
    pub debt: u64,
}

impl CreditModel {
    fn refill(&mut self, now: u64) {
        let mut elapsed = now - self.last;
        let paid = elapsed.min(self.debt);
        self.debt -= paid;
        elapsed -= paid;
        self.credit = (self.credit + elapsed).min(self.burst * self.interval);
        self.last = now;
    }
}

impl Model for CreditModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.burst {
            return None;
        }
        self.refill(now);
        let cost = n.max(1) * self.interval;
        if self.credit < cost {
            return Some(Err(cost + self.debt - self.credit));
        }
        if n > 0 {
            self.credit -= cost;
        }
        Some(Ok(self.credit / self.interval))
    }

    fn charge(&mut self, now: u64, n: u64) -> (u64, u64) {
        self.refill(now);
        let cost = n * self.interval;
        if self.credit >= cost {
            self.credit -= cost;
        } else {
            self.debt += cost - self.credit;
            self.credit = 0;
        }
        let full_in = self.burst * self.interval - self.credit + self.debt;
        (self.credit / self.interval, full_in)
    }
}

/// One of the four models, built from an [`Algorithm`] as a limiter with a fresh state.
#[derive(Debug, Clone)]
pub enum AnyModel {
    Fixed(FixedModel),
    Log(LogModel),
    Counter(CounterModel),
    Credit(CreditModel),
}

impl AnyModel {
    pub fn new(algorithm: Algorithm) -> Self {
        let nanos = |d: std::time::Duration| d.as_nanos() as u64;
        match algorithm {
            Algorithm::FixedWindow { limit, window } => AnyModel::Fixed(FixedModel {
                limit: limit.into(),
                window: nanos(window),
                index: 0,
                count: 0,
            }),
            Algorithm::SlidingWindow { limit, window } => AnyModel::Log(LogModel {
                limit: limit.into(),
                window: nanos(window),
                log: VecDeque::new(),
            }),
            Algorithm::SlidingCounter { limit, window } => AnyModel::Counter(CounterModel {
                limit: limit.into(),
                window: nanos(window),
                counts: Default::default(),
            }),
            Algorithm::TokenBucket {
                rate: Rate { permits, period },
                burst,
            } => {
                let interval = nanos(period).div_ceil(u64::from(permits));
                AnyModel::Credit(CreditModel {
                    interval,
                    burst: burst.into(),
                    credit: u64::from(burst) * interval,
                    last: 0,
                    debt: 0,
                })
            }
            other => panic!("no model for {other:?}"),
        }
    }
}

impl Model for AnyModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        match self {
            AnyModel::Fixed(m) => m.decide(now, n),
            AnyModel::Log(m) => m.decide(now, n),
            AnyModel::Counter(m) => m.decide(now, n),
            AnyModel::Credit(m) => m.decide(now, n),
        }
    }

    fn charge(&mut self, now: u64, n: u64) -> (u64, u64) {
        match self {
            AnyModel::Fixed(m) => m.charge(now, n),
            AnyModel::Log(m) => m.charge(now, n),
            AnyModel::Counter(m) => m.charge(now, n),
            AnyModel::Credit(m) => m.charge(now, n),
        }
    }
}
