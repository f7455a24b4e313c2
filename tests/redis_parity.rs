//! The Redis backend decides as the in-memory limiters do: the shipped Lua algorithms and chain,
//! run on a clock the test controls, against the same algorithms on a `ManualClock`; and the
//! answers the backend makes itself (its deny cache, its fallback) keep the limiter's contract.

#![cfg(feature = "redis")]

#[path = "common/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;
use std::time::Duration;
use turnstile::redis::{self, aio::ConnectionManager};
use turnstile::{
    AcquireError, Admission, Algorithm, FailurePolicy, ManualClock, Rate, RateLimiter,
    RedisLimiter, TryAcquireError,
};

const PREFIX: &str = "parity";

async fn manager(server: &RedisServer) -> ConnectionManager {
    ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Parity: the algorithm functions of the shipped Lua files, run on a clock the test controls
// (`now` passed in ARGV instead of read from TIME), against the in-memory algorithm on a
// `ManualClock` for the same sequence of (time, permits).
// ---------------------------------------------------------------------------------------------

const PRELUDE: &str = include_str!("../src/backend/scripts/prelude.lua");
const FIXED: &str = include_str!("../src/backend/scripts/fixed_window.lua");
const SLIDING: &str = include_str!("../src/backend/scripts/sliding_window.lua");
const COUNTER: &str = include_str!("../src/backend/scripts/sliding_counter.lua");
const BUCKET: &str = include_str!("../src/backend/scripts/token_bucket.lua");

/// Placed between the prelude and the algorithms: a `redis` whose `call` drops expiries
/// (`PEXPIREAT`, and `SET`'s `PXAT`). The fake clock's times are in 2023, so every absolute
/// expiry would delete the key at once, and real time must not expire state the fake clock
/// still needs: only decisions are compared.
const NO_EXPIRY: &str = "
local real = redis
local redis = setmetatable({
  call = function(command, ...)
    local args = {...}
    if command == 'PEXPIREAT' then return 1 end
    if command == 'SET' then return real.call('SET', args[1], args[2]) end
    return real.call(command, ...)
  end,
}, {__index = real})
";

/// The four algorithms' scripts with the test's clock (see `fake_clock_script`): fixed window,
/// sliding window, sliding counter, token bucket.
fn fake_clock_scripts() -> [String; 4] {
    [
        fake_clock_script(FIXED, "fixed_window"),
        fake_clock_script(SLIDING, "sliding_window"),
        fake_clock_script(COUNTER, "sliding_counter"),
        fake_clock_script(BUCKET, "token_bucket"),
    ]
}

/// The shipped prelude and algorithm, and a runner like `single` that takes `now` (µs) from
/// ARGV[4], without expiries (see `NO_EXPIRY`). Like `single` it repairs whenever it does not
/// commit: that is where state met under other parameters is rewritten.
fn fake_clock_script(file: &str, function: &str) -> String {
    format!(
        "{PRELUDE}{NO_EXPIRY}{file}
local now = tonumber(ARGV[4])
local n = tonumber(ARGV[1])
local admitted, t, remaining, commit, repair =
  {function}(KEYS[1], n, tonumber(ARGV[2]), tonumber(ARGV[3]), now)
if admitted and n > 0 then
  commit()
else
  repair()
end
if not admitted then return {{0, now, t, 0}} end
return {{1, now, t, remaining}}
"
    )
}

/// Placed before the prelude: a `redis` whose `TIME` answers ARGV[4] (µs) and which drops
/// expiries as `NO_EXPIRY` does, so that the prelude's own runners (`charge_one`) run on the
/// test's clock.
const FAKE_TIME: &str = "
local real = redis
local redis = setmetatable({
  call = function(command, ...)
    local args = {...}
    if command == 'TIME' then
      local now = tonumber(ARGV[4])
      local us = math.fmod(now, 1000000)
      return {string.format('%d', (now - us) / 1000000), string.format('%d', us)}
    end
    if command == 'PEXPIREAT' then return 1 end
    if command == 'SET' then return real.call('SET', args[1], args[2]) end
    return real.call(command, ...)
  end,
}, {__index = real})
";

/// The four algorithms' charge scripts as shipped (prelude, algorithm, `charge_one`), on the
/// test's clock (ARGV[4]) and without expiries: fixed window, sliding window, sliding counter,
/// token bucket.
fn fake_clock_charge_scripts() -> [String; 4] {
    let script = |file: &str, function: &str| {
        format!("{FAKE_TIME}{PRELUDE}{file}\nreturn charge_one({function})\n")
    };
    [
        script(FIXED, "fixed_window"),
        script(SLIDING, "sliding_window"),
        script(COUNTER, "sliding_counter"),
        script(BUCKET, "token_bucket"),
    ]
}

/// A script's reply `{admitted, now, reset_after µs, remaining}` says what the in-memory
/// admission `a` says.
fn assert_admitted_alike(reply: &[i64], a: &Admission, context: &str) {
    assert_eq!(
        reply[0], 1,
        "Redis rejected, memory admitted {a:?}; {context}"
    );
    assert_eq!(reply[3] as u32, a.remaining(), "remaining; {context}");
    assert_eq!(
        reply[2] as u128 * 1000,
        a.reset_after().as_nanos(),
        "reset_after; {context}"
    );
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Runs 400 random (time step, permits) calls on the script and on the in-memory limiter and
/// asserts that they decide alike. `p1` is the window (or time per permit) in µs, `limit` the
/// limit (or burst); `exact_retry` is false for the sliding counter, whose retry-after Redis
/// rounds up to its microsecond clock. `scripts`: the decision script, and the charge script
/// if charges are interleaved (see `differential_across`).
fn differential(
    con: &mut redis::Connection,
    (script, charge_script): (&str, Option<&str>),
    algorithm: Algorithm,
    p1: u64,
    limit: u32,
    exact_retry: bool,
    seed: u64,
) {
    let phase = Phase {
        algorithm,
        p1,
        limit,
    };
    differential_across(
        con,
        script,
        charge_script,
        &[phase],
        exact_retry,
        false,
        seed,
    );
}

/// One parameter set of a [`differential_across`] run: the algorithm as the in-memory limiter
/// takes it, and the script's `p1` (µs) and `limit`.
#[derive(Debug, Clone, Copy)]
struct Phase {
    algorithm: Algorithm,
    p1: u64,
    limit: u32,
}

/// The phases of a windowed algorithm (`make` builds it from a limit and a window) over `sets`
/// of (limit, window in µs): the script's `p1` is the window.
fn window_phases(sets: &[(u32, u64)], make: fn(u32, Duration) -> Algorithm) -> Vec<Phase> {
    (sets.iter())
        .map(|&(limit, w)| Phase {
            algorithm: make(limit, Duration::from_micros(w)),
            p1: w,
            limit,
        })
        .collect()
}

/// [`differential`] over several parameter sets in turn, 400 calls in all: at each change the
/// in-memory limiter is reconfigured and the script gets the new parameters on the same key (a
/// limiter with other parameters meeting existing state), at the same instant, so that both
/// translate the state at the same time. `rounded` lets Redis's reset-after be up to a
/// microsecond later than memory's (as `exact_retry` = false does for the retry-after).
///
/// With `charge_script`, about one call in four is a charge instead (`RateLimiter::charge` in
/// memory): of 0, 1, the limit, up to three limits, or (but for the token bucket, whose bound
/// is another, see `RedisLimiter::charge`) 2^32 − 1 permits; its reply must say what memory's
/// says, and the decisions after it must too.
fn differential_across(
    con: &mut redis::Connection,
    script: &str,
    charge_script: Option<&str>,
    phases: &[Phase],
    exact_retry: bool,
    rounded: bool,
    seed: u64,
) {
    let clock = ManualClock::new();
    // Room for every limit of the run (the exact sliding window's ring is allocated once).
    let max_limit = phases.iter().map(|p| p.limit).max().unwrap_or(1);
    let memory = RateLimiter::builder(phases[0].algorithm)
        .max_limit(max_limit)
        .clock(clock.clone())
        .build()
        .unwrap();
    // Today's epoch in µs, on a boundary of every window, so that the Lua windows (aligned to
    // the epoch) and the in-memory ones (aligned to the clock's zero) coincide.
    let lcm = phases.iter().fold(1, |a, p| lcm(a, p.p1));
    let base = 1_700_000_000_000_000u64 / lcm * lcm;
    let key = format!("{PREFIX}:{{diff{seed}}}:x");
    let _: () = redis::cmd("DEL").arg(&key).query(con).unwrap();
    let mut rng = Rng(seed | 1);
    let mut t = 0u64; // µs
    let mut history = Vec::new();
    let per_phase = 400 / phases.len();
    // From which step on an exact log runs after its window was shortened.
    let shrunk_log = phases.windows(2).position(|pair| {
        matches!(pair[0].algorithm, Algorithm::SlidingWindow { .. }) && pair[1].p1 < pair[0].p1
    });
    let shrunk_log = shrunk_log.map(|i| (i + 1) * per_phase);
    let mut log = matches!(phases[0].algorithm, Algorithm::SlidingWindow { .. }).then(Log::default);
    for step in 0..per_phase * phases.len() {
        let phase = phases[step / per_phase];
        let (p1, limit) = (phase.p1, phase.limit);
        if step > 0 && step % per_phase == 0 {
            // No time passes: the script meets the old state at the reconfiguration's instant.
            memory.reconfigure(phase.algorithm).unwrap();
            history.push((t, "reconfigure", 0, vec![]));
        } else {
            t += match rng.below(6) {
                0 => 0,
                1 => 1,
                2 => rng.below(p1 / 4 + 1),
                3 => rng.below(p1 * 2 + 1),
                // Just before or just at a window boundary.
                4 => (p1 - (t % p1)).saturating_sub(rng.below(2)),
                _ => rng.below(p1 / 20 + 1),
            };
        }
        clock.set(Duration::from_micros(t));
        let charge = charge_script.filter(|_| rng.below(4) == 0);
        let n = match (charge.is_some(), rng.below(8)) {
            (_, 0) => 0,
            (_, 1) => limit,
            (false, 2) => rng.below(u64::from(limit) + 1) as u32,
            (true, 2 | 3) => rng.below(3 * u64::from(limit) + 1) as u32,
            (true, 4) if !matches!(phase.algorithm, Algorithm::TokenBucket { .. }) => u32::MAX,
            _ => 1,
        };
        let algorithm = phase.algorithm;
        let reply: Vec<i64> = redis::cmd("EVAL")
            .arg(charge.unwrap_or(script))
            .arg(1)
            .arg(&key)
            .arg(n)
            .arg(p1)
            .arg(limit)
            .arg(base + t)
            .query(con)
            .unwrap_or_else(|e| panic!("{algorithm:?} step {step}: {e}"));
        let kind = if charge.is_some() { "charge" } else { "take" };
        history.push((t, kind, n, reply.clone()));
        let context = || format!("{phases:?}, seed {seed}, step {step}: {history:?}");
        // Every reply carries the script's `now` (the comparisons below take its other fields).
        assert_eq!(reply[1], (base + t) as i64, "now; {}", context());
        if let Some(log) = &mut log {
            if charge.is_some() {
                log.charge(&reply, t, n, p1, limit, &context());
            } else {
                log.check(&reply, t, n, p1, limit, &context());
            }
        }
        if shrunk_log.is_some_and(|at| step >= at) {
            // After a shorter window the exact log (what Redis keeps) and the in-memory ring
            // part ways: the ring decides by position, which is stricter than a count of the
            // live admissions (see `Log`). Redis is held to the log model alone from here.
            continue;
        }
        let expected = if charge.is_some() {
            let charged = memory.charge(n);
            assert!(charged.is_ok(), "{charged:?}; {}", context());
            charged
        } else {
            memory.try_acquire_n(n)
        };
        match expected {
            Ok(a) if rounded => {
                // The bucket's debt scaled in µs (rounded up) against ns: the same verdicts and
                // remaining, times up to a microsecond later.
                assert_eq!(reply[0], 1, "memory admitted {a:?}; {}", context());
                assert_eq!(reply[3] as u32, a.remaining(), "remaining; {}", context());
                let (redis, memory) = (reply[2] as u128 * 1000, a.reset_after().as_nanos());
                assert!(
                    redis >= memory && redis - memory < 1000,
                    "reset_after {redis} vs {memory}; {}",
                    context()
                );
            }
            Ok(a) => assert_admitted_alike(&reply, &a, &context()),
            Err(TryAcquireError::Rejected(r)) => {
                assert_eq!(
                    reply[0],
                    0,
                    "Redis admitted, memory rejected {r:?}; {}",
                    context()
                );
                let redis_ns = reply[2] as u64 * 1000;
                let memory_ns = r.retry_after_nanos();
                if exact_retry {
                    assert_eq!(redis_ns, memory_ns, "retry_after; {}", context());
                } else {
                    assert!(
                        redis_ns >= memory_ns && redis_ns - memory_ns < 1000,
                        "retry_after {redis_ns} vs {memory_ns}; {}",
                        context()
                    );
                }
            }
            Err(e) => panic!("{e:?}; {}", context()),
        }
    }
}

/// The exact sliding log as the Redis script keeps it, written out plainly: the expiry of every
/// permit admitted, each keeping the window it was admitted under. n permits are admitted iff
/// the live ones (expiry later than now) plus n are at most the limit.
#[derive(Default)]
struct Log {
    expiries: Vec<u64>,
}

impl Log {
    /// Asserts that `reply` is the log's answer for `n` permits at `now` under (`window`,
    /// `limit`), and records the admission.
    fn check(&mut self, reply: &[i64], now: u64, n: u32, window: u64, limit: u32, context: &str) {
        self.expiries.retain(|&e| e > now);
        self.expiries.sort_unstable();
        let live = self.expiries.len() as u64;
        let (n, limit) = (u64::from(n), u64::from(limit));
        let need = n.max(1);
        let latest = self.expiries.last().map_or(0, |e| e - now);
        if live + need > limit {
            let first = self.expiries[(live + need - limit - 1) as usize];
            assert_eq!(
                reply[..3],
                [0, reply[1], (first - now) as i64],
                "log; {context}"
            );
            return;
        }
        let reset = if n == 0 { latest } else { latest.max(window) };
        let expected = [1, reply[1], reset as i64, (limit - live - n) as i64];
        assert_eq!(reply, expected, "log; {context}");
        self.expiries.extend((0..n).map(|_| now + window));
    }

    /// Asserts that `reply` is the log's answer to a charge of `n` permits at `now` under
    /// (`window`, `limit`), and records it: min(n, limit) permits enter unchecked, and the log
    /// keeps its `limit` latest expiries.
    fn charge(&mut self, reply: &[i64], now: u64, n: u32, window: u64, limit: u32, context: &str) {
        self.expiries.retain(|&e| e > now);
        self.expiries.sort_unstable();
        let live = self.expiries.len() as u64;
        let latest = self.expiries.last().map_or(0, |e| e - now);
        let (k, limit) = (u64::from(n.min(limit)), u64::from(limit));
        let reset = if k == 0 { latest } else { latest.max(window) };
        let left = limit.saturating_sub(live + k);
        let expected = [1, reply[1], reset as i64, left as i64];
        assert_eq!(reply, expected, "log charge of {n}; {context}");
        self.expiries.extend((0..k).map(|_| now + window));
        self.expiries.sort_unstable();
        let over = self.expiries.len().saturating_sub(limit as usize);
        self.expiries.drain(..over);
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// Every algorithm's Lua decides exactly as the in-memory algorithm over random sequences that
/// cross window boundaries, with probes (n = 0), whole-limit requests and repeated instants.
#[test]
fn lua_algorithms_decide_as_the_in_memory_ones() {
    decide_alike(false);
}

/// Charges interleaved with the admissions of `lua_algorithms_decide_as_the_in_memory_ones`
/// (see `differential_across`): the shipped charge scripts record them as `RateLimiter::charge`
/// does, for every algorithm: the same remaining and reset after each charge, and the same
/// verdicts, remaining and retry-afters after, debt included.
#[test]
fn lua_charges_record_as_the_in_memory_ones() {
    decide_alike(true);
}

fn decide_alike(charges: bool) {
    let server = RedisServer::start();
    let mut con = server.connection();
    let [fixed, sliding, counter, bucket] = fake_clock_scripts();
    let charge_scripts = fake_clock_charge_scripts();
    let charge = |i: usize| charges.then_some(charge_scripts[i].as_str());
    for seed in 1..=6u64 {
        for (limit, window_us) in [
            (1u32, 1_000_000u64),
            (5, 1_000_000),
            (7, 3_000_000),
            (3, 1),
            (4, 3),
            (1000, 2_000_000),
            (60, 3_600_000_000),
            // Windows of 2^40 µs (12.7 days): products of a saturated count with the window
            // far beyond 2^53, where only the comparisons must stay right.
            (1, 1 << 40),
            (64, 1 << 40),
        ] {
            let window = Duration::from_micros(window_us);
            differential(
                &mut con,
                (&fixed, charge(0)),
                Algorithm::FixedWindow { limit, window },
                window_us,
                limit,
                true,
                seed,
            );
            differential(
                &mut con,
                (&sliding, charge(1)),
                Algorithm::SlidingWindow { limit, window },
                window_us,
                limit,
                true,
                seed,
            );
            differential(
                &mut con,
                (&counter, charge(2)),
                Algorithm::SlidingCounter { limit, window },
                window_us,
                limit,
                false,
                seed,
            );
            // A bucket of `limit` refilled one permit per `window / limit` (whole µs here).
            let interval = (window_us / u64::from(limit)).max(1);
            differential(
                &mut con,
                (&bucket, charge(3)),
                Algorithm::TokenBucket {
                    rate: Rate::new(1, Duration::from_micros(interval)),
                    burst: limit,
                },
                interval,
                limit,
                true,
                seed,
            );
        }
    }
}

/// A limiter with other parameters meeting existing keys (a redeploy) decides as the in-memory
/// limiter does after `reconfigure` at that instant, for every algorithm: limit lowered and
/// raised, window (or time per permit) shortened and lengthened, and both at once. The random
/// sequences before and after the change cross window boundaries, repeat instants and mix
/// probes with whole-limit requests, as in `lua_algorithms_decide_as_the_in_memory_ones`.
#[test]
fn lua_algorithms_meeting_other_parameters_decide_as_reconfigured_in_memory_ones() {
    meet_other_parameters_alike(false);
}

/// Charges interleaved with the calls of
/// `lua_algorithms_meeting_other_parameters_decide_as_reconfigured_in_memory_ones`: a debt
/// (beyond a token bucket's capacity, too) is carried over to other parameters as the in-memory
/// `reconfigure` carries it.
#[test]
fn lua_charges_meeting_other_parameters_record_as_reconfigured_in_memory_ones() {
    meet_other_parameters_alike(true);
}

fn meet_other_parameters_alike(charges: bool) {
    let server = RedisServer::start();
    let mut con = server.connection();
    let [fixed, sliding, counter, bucket] = fake_clock_scripts();
    let charge_scripts = fake_clock_charge_scripts();
    let charge = |i: usize| charges.then_some(charge_scripts[i].as_str());
    // (limit, window µs) before and after: lowered, raised, shorter, longer, and both.
    let changes = [
        ((5u32, 1_000_000u64), (2u32, 1_000_000u64)),
        ((3, 1_000_000), (7, 1_000_000)),
        ((5, 3_000_000), (5, 1_000_000)),
        ((5, 1_000_000), (5, 3_000_000)),
        ((4, 2_000_000), (6, 700_000)),
        ((6, 700_000), (2, 2_000_000)),
        ((1, 5), (3, 2)),
        ((60, 3_600_000_000), (60, 60_000_000)),
    ];
    for seed in 1..=6u64 {
        for ((l1, w1), (l2, w2)) in changes {
            let window = |w: u64| Duration::from_micros(w);
            let phases = |make: fn(u32, Duration) -> Algorithm| {
                [
                    Phase {
                        algorithm: make(l1, window(w1)),
                        p1: w1,
                        limit: l1,
                    },
                    Phase {
                        algorithm: make(l2, window(w2)),
                        p1: w2,
                        limit: l2,
                    },
                ]
            };
            let fw = phases(|limit, window| Algorithm::FixedWindow { limit, window });
            differential_across(&mut con, &fixed, charge(0), &fw, true, false, seed);
            let sw = phases(|limit, window| Algorithm::SlidingWindow { limit, window });
            differential_across(&mut con, &sliding, charge(1), &sw, true, false, seed);
            let sc = phases(|limit, window| Algorithm::SlidingCounter { limit, window });
            differential_across(&mut con, &counter, charge(2), &sc, false, false, seed);
            // A bucket of `limit` refilled one permit per `window / limit` µs. The in-memory
            // bucket scales its debt in ns, Redis in whole µs rounded up (never looser): its
            // arrival time is memory's rounded up to the µs, so verdicts and remaining agree
            // and its times are up to a microsecond later.
            let interval = |l: u32, w: u64| (w / u64::from(l)).max(1);
            let (i1, i2) = (interval(l1, w1), interval(l2, w2));
            let bucket_phase = |i: u64, burst: u32| Phase {
                algorithm: Algorithm::TokenBucket {
                    rate: Rate::new(1, Duration::from_micros(i)),
                    burst,
                },
                p1: i,
                limit: burst,
            };
            let tb = [bucket_phase(i1, l1), bucket_phase(i2, l2)];
            let rounded = (i1 * u64::from(l1)) != (i2 * u64::from(l2));
            differential_across(&mut con, &bucket, charge(3), &tb, !rounded, rounded, seed);
        }
    }
}

/// The extremes of each algorithm's parameters decide as in memory too: a limit of 2^32 − 1 (the
/// largest count a window holds, where a charge saturates), a limit of four billion over a
/// window of one microsecond, and a bucket of 2^32 − 1 permits refilled one per microsecond.
/// `lua_algorithms_decide_as_the_in_memory_ones` goes up to a limit of 1000.
#[test]
fn lua_algorithms_at_the_largest_limits_decide_as_the_in_memory_ones() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let [fixed, _, counter, bucket] = fake_clock_scripts();
    let [fixed_charge, _, counter_charge, bucket_charge] = fake_clock_charge_scripts();
    for seed in 1..=2u64 {
        for charges in [false, true] {
            for (limit, window_us) in [
                (u32::MAX, 1_000_000u64),
                (u32::MAX - 1, 1_000),
                (4_000_000_000, 1),
                (u32::MAX, 1 << 20),
            ] {
                let window = Duration::from_micros(window_us);
                let fw = Algorithm::FixedWindow { limit, window };
                let scripts = (&*fixed, charges.then_some(&*fixed_charge));
                differential(&mut con, scripts, fw, window_us, limit, true, seed);
                // The sliding counter needs limit × window ≤ 2^52 (the builder's check).
                if u128::from(limit) * u128::from(window_us) <= 1 << 52 {
                    let sc = Algorithm::SlidingCounter { limit, window };
                    let scripts = (&*counter, charges.then_some(&*counter_charge));
                    differential(&mut con, scripts, sc, window_us, limit, false, seed);
                }
                let interval = (window_us / u64::from(limit)).max(1);
                let tb = Algorithm::TokenBucket {
                    rate: Rate::new(1, Duration::from_micros(interval)),
                    burst: limit,
                };
                let scripts = (&*bucket, charges.then_some(&*bucket_charge));
                differential(&mut con, scripts, tb, interval, limit, true, seed);
            }
        }
    }
}

/// The other parity tests use a few chosen parameter sets; here they are drawn at random, so
/// that windows (and times per permit) of any whole number of microseconds, not just round or
/// small ones, from 1 µs to about a year (2^45 µs), and limits from 1 to 1000, decide and charge
/// as in memory: one parameter set on a key, or two or three met in turn on the same key.
#[test]
fn lua_algorithms_at_random_parameters_decide_as_the_in_memory_ones() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let [fixed, sliding, counter, bucket] = fake_clock_scripts();
    let charge_scripts = fake_clock_charge_scripts();
    let mut rng = Rng(0x0005_EED0_FA11_0DD5);
    let limits = [1u32, 2, 3, 5, 17, 100, 1000];
    for round in 0..60u64 {
        // Log-uniform: as many short windows as long ones. Several sets on one key have windows
        // of 1 to 12 times one unit, so that a time on a boundary of all of them (where the
        // Lua windows, aligned to the epoch, and the in-memory ones, to the clock's zero,
        // coincide) is near today's.
        let bits = 1 + rng.below(if round % 2 == 0 { 45 } else { 26 });
        let unit = 1 + rng.below(1 << bits);
        let sets: Vec<(u32, u64)> = (0..if round % 2 == 0 { 1 } else { 2 + round % 4 / 2 })
            .map(|_| {
                let limit = limits[rng.below(limits.len() as u64) as usize];
                let times = if round % 2 == 0 { 1 } else { 1 + rng.below(12) };
                (limit, unit * times)
            })
            .collect();
        let charges = round % 8 < 4;
        let charge = |i: usize| charges.then_some(charge_scripts[i].as_str());
        let seed = 1_000 + round;
        let phases = |make| window_phases(&sets, make);
        let fw = phases(|limit, window| Algorithm::FixedWindow { limit, window });
        differential_across(&mut con, &fixed, charge(0), &fw, true, false, seed);
        let sw = phases(|limit, window| Algorithm::SlidingWindow { limit, window });
        differential_across(&mut con, &sliding, charge(1), &sw, true, false, seed);
        let sc = phases(|limit, window| Algorithm::SlidingCounter { limit, window });
        // The sliding counter needs limit × window ≤ 2^52 (the builder's check).
        if sc
            .iter()
            .all(|p| u128::from(p.limit) * u128::from(p.p1) <= 1 << 52)
        {
            differential_across(&mut con, &counter, charge(2), &sc, false, false, seed);
        }
        // A bucket of `limit` refilled one permit per `window / limit` µs. Across one change of
        // capacity Redis's times may be a microsecond later than memory's (see
        // `lua_algorithms_meeting_other_parameters_decide_as_reconfigured_in_memory_ones`);
        // across two, more: those are left out.
        let tb: Vec<Phase> = (sets.iter())
            .map(|&(burst, w)| {
                let interval = (w / u64::from(burst)).max(1);
                let rate = Rate::new(1, Duration::from_micros(interval));
                Phase {
                    algorithm: Algorithm::TokenBucket { rate, burst },
                    p1: interval,
                    limit: burst,
                }
            })
            .collect();
        let capacity = |p: &Phase| p.p1 * u64::from(p.limit);
        let changes = tb.windows(2).filter(|w| capacity(&w[0]) != capacity(&w[1]));
        match changes.count() {
            0 => differential_across(&mut con, &bucket, charge(3), &tb, true, false, seed),
            1 => differential_across(&mut con, &bucket, charge(3), &tb, false, true, seed),
            _ => {}
        }
    }
}

/// A key that meets several parameter sets in turn (a limit reconfigured three times, a window
/// shortened and lengthened back, a window of a microsecond more or less and back) decides as
/// the in-memory limiter reconfigured at the same instants, charges interleaved or not. The
/// single changes of `lua_algorithms_meeting_other_parameters_decide_as_reconfigured_in_memory_ones`
/// leave out a state translated twice, once back to the parameters it was first written under.
/// The token bucket runs the sequences whose capacity (time per permit × burst) stays the
/// same: across a change of capacity Redis's debt is rounded up to the microsecond at each
/// translation, and two translations may part from memory by more than one.
#[test]
fn lua_algorithms_meeting_several_parameter_sets_in_turn_decide_as_in_memory() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let [fixed, sliding, counter, bucket] = fake_clock_scripts();
    let charge_scripts = fake_clock_charge_scripts();
    let sequences: [&[(u32, u64)]; 5] = [
        &[(5, 1_000_000), (3, 3_000_000), (5, 1_000_000), (8, 700_000)],
        &[
            (2, 3_000_000),
            (6, 1_000_000),
            (1, 4_000_000),
            (6, 2_000_000),
        ],
        &[(3, 7), (3, 2), (9, 11), (1, 3)],
        &[
            (10, 1_000_000),
            (10, 999_999),
            (10, 1_000_001),
            (10, 1_000_000),
        ],
        &[
            (4, 1_000_000),
            (2, 1_000_000),
            (8, 1_000_000),
            (4, 1_000_000),
        ],
    ];
    let mut buckets = 0;
    for seed in 1..=3u64 {
        for charges in [false, true] {
            let charge = |i: usize| charges.then_some(charge_scripts[i].as_str());
            for sequence in sequences {
                let phases = |make| window_phases(sequence, make);
                let fw = phases(|limit, window| Algorithm::FixedWindow { limit, window });
                differential_across(&mut con, &fixed, charge(0), &fw, true, false, seed);
                let sw = phases(|limit, window| Algorithm::SlidingWindow { limit, window });
                differential_across(&mut con, &sliding, charge(1), &sw, true, false, seed);
                let sc = phases(|limit, window| Algorithm::SlidingCounter { limit, window });
                differential_across(&mut con, &counter, charge(2), &sc, false, false, seed);
                // A bucket of `limit` refilled one permit per `window / limit` µs.
                let tb: Vec<Phase> = (sequence.iter())
                    .map(|&(burst, w)| {
                        let interval = (w / u64::from(burst)).max(1);
                        Phase {
                            algorithm: Algorithm::TokenBucket {
                                rate: Rate::new(1, Duration::from_micros(interval)),
                                burst,
                            },
                            p1: interval,
                            limit: burst,
                        }
                    })
                    .collect();
                let capacity = |p: &Phase| p.p1 * u64::from(p.limit);
                if tb.iter().all(|p| capacity(p) == capacity(&tb[0])) {
                    buckets += 1;
                    differential_across(&mut con, &bucket, charge(3), &tb, true, false, seed);
                }
            }
        }
    }
    assert!(buckets > 0, "no sequence kept the bucket's capacity");
}

const MEMBERS: &str = include_str!("../src/backend/scripts/members.lua");
const CHAIN: &str = include_str!("../src/backend/scripts/chain.lua");
const CHAIN_CHARGE: &str = include_str!("../src/backend/scripts/chain_charge.lua");

/// The shipped chain script on a clock the test controls: `now` (µs) is the last ARGV, and
/// keys expire on that clock as Redis would expire them (see `FAKE_EXPIRY`), so that a member
/// key whose TTL ends before its state stops counting decides unlike memory.
fn fake_clock_chain_script() -> String {
    fake_clock_members_script(CHAIN)
}

/// The members' runner and `reply` (chain.lua or chain_charge.lua) on the test's clock, the
/// last ARGV, with expiries on that clock (`FAKE_EXPIRY`, reading its time there).
fn fake_clock_members_script(reply: &str) -> String {
    let expiry = FAKE_EXPIRY.replace("ARGV[4]", "ARGV[#ARGV]");
    format!("{expiry}{PRELUDE}{FIXED}{SLIDING}{COUNTER}{BUCKET}{MEMBERS}{reply}")
}

/// A chain decides as the in-memory `Chain` of the same members: all or nothing, the smallest
/// remaining and largest reset, the largest retry-after with the limit of its member.
#[test]
fn the_lua_chain_decides_as_the_in_memory_chain() {
    chain_alike(false);
}

/// A chain's charge (about one call in four, of 0, 1, the capacity or up to three capacities,
/// interleaved with the decisions of `the_lua_chain_decides_as_the_in_memory_chain`) charges
/// every member as `RateLimiter::charge` charges each in-memory member, and answers with the
/// smallest remaining and the largest reset; the decisions after it agree too.
#[test]
fn the_lua_chain_charges_every_member_as_in_memory() {
    chain_alike(true);
}

fn chain_alike(charges: bool) {
    let server = RedisServer::start();
    let mut con = server.connection();
    let script = fake_clock_chain_script();
    let charge_script = fake_clock_members_script(CHAIN_CHARGE);
    let base = 1_700_000_000_000_000u64; // a multiple of every window below
    let windows = [1_000_000u64, 2_000_000, 4_000_000, 5_000_000];
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let members: Vec<(Algorithm, u8, u64, u32)> = (0..2 + rng.below(2))
            .map(|_| {
                let limit = 1 + rng.below(6) as u32;
                let w = windows[rng.below(4) as usize];
                let window = Duration::from_micros(w);
                match rng.below(4) {
                    0 => (Algorithm::FixedWindow { limit, window }, 1, w, limit),
                    1 => (Algorithm::SlidingWindow { limit, window }, 2, w, limit),
                    2 => (Algorithm::SlidingCounter { limit, window }, 3, w, limit),
                    _ => {
                        let interval = w / u64::from(limit);
                        let rate = Rate::new(1, Duration::from_micros(interval));
                        let a = Algorithm::TokenBucket { rate, burst: limit };
                        (a, 4, interval, limit)
                    }
                }
            })
            .collect();
        let clock = ManualClock::new();
        let memory = turnstile::Chain::new(
            members
                .iter()
                .map(|m| RateLimiter::with_clock(m.0, clock.clone()).unwrap()),
        )
        .unwrap();
        let capacity = memory.capacity();
        let keys: Vec<String> = (0..members.len())
            .map(|i| format!("{PREFIX}:{{chain{seed}}}:c{i}"))
            .collect();
        let mut t = 0u64;
        let mut history = Vec::new();
        for step in 0..300 {
            t += match rng.below(5) {
                0 => 0,
                1 => 1,
                2 => rng.below(300_000),
                3 => rng.below(3_000_000),
                _ => 1_000_000 - t % 1_000_000,
            };
            clock.set(Duration::from_micros(t));
            let charge = charges && rng.below(4) == 0;
            let n = match rng.below(6) {
                0 => 0,
                1 => capacity,
                2 if charge => rng.below(3 * u64::from(capacity) + 1) as u32,
                2 => rng.below(u64::from(capacity) + 1) as u32,
                _ => 1,
            };
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(if charge { &charge_script } else { &script })
                .arg(keys.len());
            for key in &keys {
                cmd.arg(key);
            }
            cmd.arg(n);
            for m in &members {
                cmd.arg(m.1).arg(m.2).arg(m.3);
            }
            cmd.arg(base + t);
            let reply: Vec<i64> = cmd.query(&mut con).unwrap();
            // Every reply carries the script's `now` (the comparisons below take its other
            // fields).
            assert_eq!(reply[1], (base + t) as i64, "now; {members:?}, step {step}");
            let expected = if charge {
                // Every member charged; what is left is the tightest's, and the slowest's reset.
                let each: Vec<Admission> = memory
                    .members()
                    .iter()
                    .map(|m| m.charge(n).unwrap())
                    .collect();
                let remaining = each.iter().map(Admission::remaining).min().unwrap();
                let reset = each.iter().map(Admission::reset_after).max().unwrap();
                assert_eq!(
                    reply,
                    [1, reply[1], reset.as_micros() as i64, i64::from(remaining)],
                    "charge of {n}; {members:?}, step {step}: {history:?}"
                );
                history.push((t, "charge", n, reply));
                continue;
            } else {
                memory.try_acquire_n(n)
            };
            history.push((t, "take", n, reply.clone()));
            let context = || format!("{members:?}, step {step}: {history:?}");
            match expected {
                Ok(a) => assert_admitted_alike(&reply, &a, &context()),
                Err(TryAcquireError::Rejected(r)) => {
                    assert_eq!(reply[0], 0, "memory rejected {r:?}; {}", context());
                    let redis_ns = reply[2] as u64 * 1000;
                    let memory_ns = r.retry_after_nanos();
                    assert!(
                        redis_ns >= memory_ns && redis_ns - memory_ns < 1000,
                        "retry_after {redis_ns} vs {memory_ns}; {}",
                        context()
                    );
                    let member = members[reply[3] as usize - 1].3;
                    assert_eq!(member, r.limit(), "rejecting limit; {}", context());
                }
                Err(e) => panic!("{e:?}; {}", context()),
            }
        }
    }
}

/// A chain's rejection names the limit of the member that rejected (as the in-memory chain
/// does, and as Redis's own answer does); the deny cache, answering the very same rejection
/// again without a round trip, must not name another one. It named the chain's capacity (its
/// smallest limit) instead: a client shown `limit 4` on one 429 and `limit 2` on the next.
#[tokio::test]
async fn a_chain_rejection_from_the_deny_cache_names_the_same_limit() {
    let server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    // The hour is aligned to Redis's clock: within its last minute the window's rejection has
    // a retry-after under the minute this test waits for, and the loop went on into the next
    // hour (8 admitted). Start with two minutes of it left.
    redis_server::room_in_window(&mut server.connection(), hour, Duration::from_secs(120));
    // A bucket of 2 refilled every millisecond, and 4 per hour: the hour's limit rejects
    // first, and it is not the smallest limit.
    let limiter = RedisLimiter::builder(
        Algorithm::TokenBucket {
            rate: Rate::new(1, Duration::from_millis(1)),
            burst: 2,
        },
        FailurePolicy::FailClosed,
    )
    .and_limit(Algorithm::FixedWindow {
        limit: 4,
        window: hour,
    })
    .prefix(PREFIX)
    .deadline(Duration::from_secs(2))
    .build(manager(&server).await)
    .unwrap();
    assert_eq!(limiter.capacity(), 2);
    let mut admitted = 0;
    let first = loop {
        match limiter.try_acquire("s").await {
            Ok(_) => admitted += 1,
            Err(TryAcquireError::Rejected(r)) if r.retry_after() > Duration::from_secs(60) => {
                break r;
            }
            // The bucket, between refills.
            Err(TryAcquireError::Rejected(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    };
    assert_eq!(admitted, 4);
    assert_eq!(first.limit(), 4, "Redis names the hourly limit");
    let stats = limiter.stats();
    let again = match limiter.try_acquire("s").await {
        Err(TryAcquireError::Rejected(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        limiter.stats().denied_locally,
        stats.denied_locally + 1,
        "answered by the deny cache"
    );
    assert_eq!(again.limit(), first.limit(), "{again:?} after {first:?}");
}

/// `InsufficientCapacity` means "can never be admitted, retrying cannot help". Under
/// `FailurePolicy::Fallback` a call for more permits than the local share (but within the
/// limiter's capacity) got exactly that while Redis was away, with the local share as the
/// capacity: a caller that trusts the error gives up on a request that Redis admits as soon as
/// it is back. Redis being away is `Unavailable`.
#[tokio::test]
async fn a_fallback_too_small_for_the_request_is_unavailable_not_insufficient_capacity() {
    let mut server = RedisServer::start();
    let limiter = RedisLimiter::builder(
        Algorithm::FixedWindow {
            limit: 8,
            window: Duration::from_secs(3600),
        },
        FailurePolicy::Fallback { share: 0.25 },
    )
    .prefix(PREFIX)
    .deadline(Duration::from_millis(200))
    .build(manager(&server).await)
    .unwrap();
    assert_eq!(limiter.capacity(), 8);
    assert!(limiter.try_acquire_n("s", 3).await.is_ok());
    server.kill();
    // The fallback allows 2 per hour for this process; 3 is within the limiter's capacity.
    let during = limiter.try_acquire_n("s", 3).await;
    assert_eq!(during, Err(TryAcquireError::Unavailable));
    assert_eq!(
        limiter.acquire_n("s", 3).await,
        Err(AcquireError::Unavailable)
    );
    // What fits the share is still decided locally.
    assert!(limiter.try_acquire_n("s", 2).await.is_ok());
    assert!(limiter.stats().fallbacks >= 3);
    // Retrying did help: Redis is back (empty) and admits the same call.
    server.restart();
    let mut back = Err(TryAcquireError::Unavailable);
    for _ in 0..100 {
        back = limiter.try_acquire_n("s", 3).await;
        if back.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back.is_ok(), "{back:?}");
}

/// The fallback's share of a token bucket's rate: `share` of 1 permit per minute is a quarter
/// permit per minute, one permit per 4 minutes. Rounded down to whole permits per period and
/// then raised to at least 1, it was 1 permit per minute, the whole rate: with four processes
/// (the share's P) four times the limit while Redis was away.
#[tokio::test]
async fn a_fallback_of_less_than_one_permit_per_period_stretches_the_period() {
    let mut server = RedisServer::start();
    let limiter = RedisLimiter::builder(
        Algorithm::TokenBucket {
            rate: Rate::per_minute(1),
            burst: 1,
        },
        FailurePolicy::Fallback { share: 0.25 },
    )
    .prefix(PREFIX)
    .deadline(Duration::from_millis(200))
    .build(manager(&server).await)
    .unwrap();
    server.kill();
    assert!(limiter.try_acquire("s").await.is_ok(), "the local burst");
    match limiter.try_acquire("s").await {
        Err(TryAcquireError::Rejected(r)) => assert!(
            r.retry_after() > Duration::from_secs(230)
                && r.retry_after() <= Duration::from_secs(240),
            "a quarter of 1 per minute is 1 per 4 minutes: {r:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(limiter.stats().fallbacks, 2);
}

/// Placed before the prelude: a `redis` whose `TIME` answers ARGV[4] (µs), as `FAKE_TIME`, and
/// whose expiries run on that clock too: `PEXPIREAT` and `SET … PXAT` note the key's expiry (ms)
/// in a hash beside it, `PTTL` answers from it, and a key whose time has passed (Redis's rule:
/// the clock's millisecond is later than the expiry) is deleted before the script reads it. So
/// a key expires between two calls exactly when Redis would delete it at the fake clock's times.
const FAKE_EXPIRY: &str = "
local real = redis
local EXPIRY = '__fake_expiry'
local function now_ms() return math.floor(tonumber(ARGV[4]) / 1000) end
local function forget(key) real.call('HDEL', EXPIRY, key) end
for i = 1, #KEYS do
  local when = real.call('HGET', EXPIRY, KEYS[i])
  if real.call('EXISTS', KEYS[i]) == 0 then
    forget(KEYS[i])
  elseif when and now_ms() > tonumber(when) then
    real.call('DEL', KEYS[i])
    forget(KEYS[i])
  end
end
local function expire(key, when)
  if tonumber(when) <= now_ms() then
    real.call('DEL', key)
    forget(key)
  else
    real.call('HSET', EXPIRY, key, when)
  end
end
local redis = setmetatable({
  call = function(command, ...)
    local args = {...}
    if command == 'TIME' then
      local now = tonumber(ARGV[4])
      local us = math.fmod(now, 1000000)
      return {string.format('%d', (now - us) / 1000000), string.format('%d', us)}
    end
    if command == 'PEXPIREAT' then
      if real.call('EXISTS', args[1]) == 0 then return 0 end
      expire(args[1], args[2])
      return 1
    end
    if command == 'SET' then
      real.call('SET', args[1], args[2])
      if args[3] == 'PXAT' then expire(args[1], args[4]) else forget(args[1]) end
      return 'OK'
    end
    if command == 'PTTL' then
      if real.call('EXISTS', args[1]) == 0 then return -2 end
      local when = real.call('HGET', EXPIRY, args[1])
      if not when then return -1 end
      return tonumber(when) - now_ms()
    end
    local reply = real.call(command, ...)
    if args[1] and real.call('EXISTS', args[1]) == 0 then forget(args[1]) end
    return reply
  end,
}, {__index = real})
";

/// After a window-length change rebased a fixed window's grid, its key lived only to the end of
/// its window. The next call then found no key and took the epoch-aligned window of that
/// instant, which can start before the old window ended: the permits admitted there were
/// forgotten while still in the new window, and the whole limit was handed out again (here 4
/// permits in one 4 s window of limit 2, and a call admitted that the reconfigured in-memory
/// limiter rejects). The key must live until the epoch grid's next boundary.
#[test]
fn a_rebased_fixed_window_outlives_the_epoch_window_its_permits_fall_in() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let script = format!("{FAKE_EXPIRY}{PRELUDE}{FIXED}\nreturn single(fixed_window)\n");
    let s = 1_000_000u64;
    let (long, short) = (10 * s, 4 * s);
    // On a boundary of both grids, as the in-memory clock's zero is.
    let base = 1_700_000_000_000_000u64 / (20 * s) * (20 * s);
    let key = format!("{PREFIX}:{{rebased}}:fw");
    let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
    let make = |window: u64| Algorithm::FixedWindow {
        limit: 2,
        window: Duration::from_micros(window),
    };
    let clock = ManualClock::new();
    let memory = RateLimiter::builder(make(long))
        .clock(clock.clone())
        .build()
        .unwrap();
    // (time, window, permits): one permit late in a 10 s window; then a 4 s limiter meets it
    // (rebased: the count is kept, its window is [6 s, 10 s)) and takes the other; then the
    // windows after it, the key idle in between.
    let steps = [
        (9 * s, long, 1),
        (9 * s, short, 1),
        (10 * s + s / 2, short, 2),
        (12 * s + s / 2, short, 1),
        (14 * s, short, 2),
    ];
    for (i, &(t, window, n)) in steps.iter().enumerate() {
        clock.set(Duration::from_micros(t));
        if i == 1 {
            memory.reconfigure(make(short)).unwrap();
        }
        let reply: Vec<i64> = redis::cmd("EVAL")
            .arg(&script)
            .arg(1)
            .arg(&key)
            .arg(n)
            .arg(window)
            .arg(2)
            .arg(base + t)
            .query(&mut con)
            .unwrap();
        let context = format!("step {i} at {t} µs");
        match memory.try_acquire_n(n) {
            Ok(a) => assert_admitted_alike(&reply, &a, &context),
            Err(TryAcquireError::Rejected(r)) => {
                assert_eq!(
                    reply[0], 0,
                    "Redis admitted, memory rejected {r:?}; {context}"
                );
                assert_eq!(reply[2] as u64 * 1000, r.retry_after_nanos(), "{context}");
            }
            Err(e) => panic!("{e:?}; {context}"),
        }
    }
}

/// The keys' expiries lose no state that still counts: the shipped runners (`single`,
/// `charge_one`) on the test's clock with Redis's expiry rule on that clock too (`FAKE_EXPIRY`),
/// so that a key is deleted between two calls exactly when Redis would delete it, decide and
/// charge as the in-memory limiters over the random sequences of `differential_across`, windows
/// of a few milliseconds (where a key's expiry is rounded up to the millisecond) to seconds,
/// and limits changed on existing keys. The other parity tests drop every expiry; a TTL too
/// short for its state (a window's count, the log's latest permit, a bucket's arrival time, a
/// counter's previous window) would admit here what memory rejects. (A window length changed
/// on a key is left out: a key that expired after it is fresh on the epoch-aligned grid, where
/// memory keeps its rebased one.)
#[test]
fn keys_expire_no_sooner_than_their_state_stops_counting() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let script = |file: &str, function: &str, runner: &str| {
        format!("{FAKE_EXPIRY}{PRELUDE}{file}\nreturn {runner}({function})\n")
    };
    let files = [
        (FIXED, "fixed_window"),
        (SLIDING, "sliding_window"),
        (COUNTER, "sliding_counter"),
        (BUCKET, "token_bucket"),
    ];
    // (limit, window µs) before and after: the same, or another limit.
    let sequences = [
        ((1u32, 1_000_000u64), (1u32, 1_000_000u64)),
        ((5, 1_000_000), (5, 1_000_000)),
        ((7, 3_000_000), (7, 3_000_000)),
        ((3, 1_000), (3, 1_000)),
        ((4, 3_000), (4, 3_000)),
        ((1000, 2_000_000), (1000, 2_000_000)),
        ((5, 1_000_000), (2, 1_000_000)),
        ((3, 1_000_000), (7, 1_000_000)),
    ];
    for seed in 1..=3u64 {
        for charges in [false, true] {
            for ((l1, w1), (l2, w2)) in sequences {
                for (i, (file, function)) in files.iter().enumerate() {
                    let decide = script(file, function, "single");
                    let charge = script(file, function, "charge_one");
                    let phase = |limit: u32, w: u64| -> Phase {
                        let window = Duration::from_micros(w);
                        let (algorithm, p1) = match i {
                            0 => (Algorithm::FixedWindow { limit, window }, w),
                            1 => (Algorithm::SlidingWindow { limit, window }, w),
                            2 => (Algorithm::SlidingCounter { limit, window }, w),
                            _ => {
                                // A bucket of `limit` refilled one permit per `w / limit` µs:
                                // the same capacity (to the µs) before and after here.
                                let interval = (w / u64::from(limit)).max(1);
                                let rate = Rate::new(1, Duration::from_micros(interval));
                                (Algorithm::TokenBucket { rate, burst: limit }, interval)
                            }
                        };
                        Phase {
                            algorithm,
                            p1,
                            limit,
                        }
                    };
                    let phases = [phase(l1, w1), phase(l2, w2)];
                    let charge = charges.then_some(charge.as_str());
                    // The sliding counter's retry-after is rounded up to the µs (see
                    // `differential`).
                    differential_across(&mut con, &decide, charge, &phases, i != 2, false, seed);
                }
            }
        }
    }
}
