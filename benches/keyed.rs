//! Keyed limiters (issue 4): turnstile's `KeyedLimiter<u64>` against governor 0.10's keyed
//! `RateLimiter` (its default `DashMap` store), in one run.
//!
//! ```text
//! cargo bench --bench keyed        # about 4 minutes
//! ```
//!
//! What is measured (criterion ids are `group/function`; a `/` in a group name becomes `_` in
//! the directory under `target/criterion`):
//!
//! | group | what |
//! |---|---|
//! | `keyed_admit_1t/{1k,1m}_keys` | `try_acquire` / `check_key` on a key already present, admitted; one thread |
//! | `keyed_admit_2t/{1k,1m}_keys` | the same while a second thread runs the same loop on another key sequence; time of one thread per call |
//! | `keyed_reject_1t/…`, `keyed_reject_2t/…` | the same with every key's budget spent at setup: every call is rejected |
//! | `…/turnstile/fixed_window (swept)` | admit runs again after one `sweep()` that evicts nothing (the state a limiter with a periodic sweeper settles in) |
//! | `keyed_concurrency_{1t,2t}/1k_keys` | `KeyedConcurrencyLimiter::try_acquire` and the permit's drop on a key already present (every release leaves its key idle); turnstile only, for comparisons across trees |
//! | `keyed_sweep/1m_keys` | one `sweep()` over 1,000,000 keys, all idle (evicts all) or all busy (evicts none); governor's `retain_recent()` beside it |
//!
//! and, before the timings, the heap bytes per key of each of turnstile's four algorithms and of
//! governor's keyed store with 1,000,000 keys, and with the feature `http` of an HTTP rule
//! counting 1,000,000 clients by IP or by client id (printed, and written to
//! `target/criterion/keyed-memory.txt`; `cargo bench --features http --bench keyed -- none`
//! measures memory only).
//!
//! **Keys.** `u64`, `0..n` inserted at setup (n = 1,000 or 1,000,000); the timed loops look them
//! up in a fixed pseudo-random order (xorshift, 65,536 precomputed entries), so that the
//! 1,000,000-key runs miss the CPU caches as real traffic does. Both libraries get the same
//! sequence; the second thread of the 2-thread runs walks another one.
//!
//! **Clocks.** turnstile runs on its default [`UpkeepClock`] (an atomic refreshed every 1 ms by a
//! background thread). governor runs twice: `governor/default_clock` is `RateLimiter::keyed`
//! exactly as documented (quanta's TSC clock), and `governor/upkeep_clock` is the same DashMap
//! store on governor's `QuantaUpkeepClock` with a 1 ms upkeep, the same kind of clock as
//! turnstile's default. Each library keeps its default hasher (turnstile: foldhash; governor:
//! std's SipHash).
//!
//! **Limits.** Admit runs never reject and no key turns idle during the run (an idle key is
//! evicted by the sweeps that inserting other keys triggers, so "a huge rate" would empty the
//! 1,000,000-key limiter while it is being filled): fixed window `u32::MAX` per hour per key,
//! token bucket (and governor, same GCRA parameters) one per minute with a burst of 2^26. Reject
//! runs allow one call per hour per key, taken at setup. After each benchmark the limiter is checked: admit runs rejected nothing, reject runs
//! admitted nothing, and no key was added or evicted (a failed check panics: the figure would
//! be wrong).
//!
//! **Memory.** A counting global allocator sums the bytes requested from the allocator; a key's
//! cost is (live bytes after inserting 1,000,000 keys − before) / 1,000,000, the key included.
//! Keys are inserted on a frozen `ManualClock`, so none turns idle and nothing is removed: papaya
//! frees removed entries late (seize's deferred reclamation), so removals would count garbage.
//! Resizes still leave some replaced papaya tables awaiting reclamation (the store flushes its
//! reclamation batch every 256 inserts into a shard, and after every sweep); the `(after a
//! sweep)` rows measure the same limiters after one `sweep()` that evicts nothing, and the table
//! of live large allocations printed per structure shows the tables. A second column estimates
//! what glibc malloc really holds (a chunk of max(32, size + 8 rounded up to 16) bytes per
//! allocation), which matters for stores that allocate every entry separately.
//!
//! **Sweep.** Fixed window and token bucket, 10 per second. Setup (untimed, per iteration)
//! builds a `KeyedLimiter` on a `ManualClock` with `max_keys(2_000_000)` and inserts 1,000,000
//! keys; for the idle case it then advances the clock two windows. One `sweep()` is timed; it
//! must return 1,000,000 (idle) or 0 (busy). The busy sweep is
//! the first one after population, which walks every key; later busy sweeps skip each shard on
//! its `not_before` hint, so that is measured too (`busy_repeat`). governor's `retain_recent()`
//! over 1,000,000 keys on its `FakeRelativeClock` is the peer.

use criterion::{BatchSize, Criterion, SamplingMode, criterion_group};
use governor::Quota;
use governor::clock::{Clock as GovClock, FakeRelativeClock, QuantaUpkeepClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use std::fmt::Write as _;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use turnstile::{Algorithm, KeyedLimiter, ManualClock, Rate};

#[path = "common/heap.rs"]
mod heap;
use heap::{Heap, LARGE, key_sequence};

// ---------------------------------------------------------------------------------------------
// Configurations
// ---------------------------------------------------------------------------------------------

/// Upkeep interval of the quanta clock given to governor: the same 1 ms as turnstile's default.
const QUANTA_UPKEEP: Duration = Duration::from_millis(1);

/// Length of the precomputed key sequences (a power of two).
const SEQ_LEN: usize = 1 << 16;
/// Seeds of the timed thread's key sequence and of the second thread's.
const SEED_MAIN: u64 = 0x9E37_79B9_7F4A_7C15;
const SEED_OTHER: u64 = 0xD1B5_4A32_D192_ED03;

const SIZES: [(u64, &str); 2] = [(1_000, "1k_keys"), (1_000_000, "1m_keys")];

/// Admit-path configurations: never rejected, and no key turns idle during the run (an idle key
/// would be evicted by the sweeps that inserting the other keys triggers).
///
/// - Fixed window: `u32::MAX` per hour per key.
/// - Token bucket: one permit a minute with a burst of 2^26: an admission pushes the key's
///   arrival time a minute ahead, and a key is rejected only after 2^26 admissions in a minute
///   (the whole run makes fewer than 2^30 calls over at least 1,000 keys). b·T = 4.0e18 ns, just
///   under turnstile's cap of `u64::MAX / 4`.
const ADMIT: [(&str, Algorithm); 2] = [
    (
        "fixed_window",
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window: Duration::from_secs(3600),
        },
    ),
    (
        "token_bucket",
        Algorithm::TokenBucket {
            rate: Rate::per_minute(1),
            burst: ADMIT_BURST,
        },
    ),
];
const ADMIT_BURST: u32 = 1 << 26;

/// Reject-path configurations: one permit per hour per key, taken at setup.
const REJECT: [(&str, Algorithm); 2] = [
    (
        "fixed_window",
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        },
    ),
    (
        "token_bucket",
        Algorithm::TokenBucket {
            rate: Rate::per_hour(1),
            burst: 1,
        },
    ),
];

/// Memory and sweep configurations: ordinary limits (10 per second).
const ORDINARY: [(&str, Algorithm); 4] = [
    (
        "fixed_window",
        Algorithm::FixedWindow {
            limit: 10,
            window: Duration::from_secs(1),
        },
    ),
    (
        "token_bucket",
        Algorithm::TokenBucket {
            rate: Rate::per_second(10),
            burst: 10,
        },
    ),
    (
        "sliding_counter",
        Algorithm::SlidingCounter {
            limit: 10,
            window: Duration::from_secs(1),
        },
    ),
    (
        "sliding_window",
        Algorithm::SlidingWindow {
            limit: 10,
            window: Duration::from_secs(1),
        },
    ),
];

fn governor_admit_quota() -> Quota {
    // The token bucket above: one a minute, burst 2^26.
    Quota::per_minute(NonZeroU32::MIN).allow_burst(NonZeroU32::new(ADMIT_BURST).expect("> 0"))
}

fn governor_reject_quota() -> Quota {
    Quota::per_hour(NonZeroU32::MIN)
}

/// governor's keyed limiter with its default store (DashMap, std hasher) on clock `C`.
type GovKeyed<C> =
    governor::RateLimiter<u64, DashMapStateStore<u64>, C, NoOpMiddleware<<C as GovClock>::Instant>>;

fn governor_ordinary_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(10).expect("10 > 0"))
}

// ---------------------------------------------------------------------------------------------
// try_acquire / check_key on existing keys
// ---------------------------------------------------------------------------------------------

/// Benchmarks `call` on the key sequences: one thread in `{prefix}_1t/{label}`, then two in
/// `{prefix}_2t/{label}`, both under the function name `id`.
fn bench_calls<R>(
    c: &mut Criterion,
    prefix: &str,
    label: &str,
    id: &str,
    keys: &[u64],
    other: &[u64],
    call: impl Fn(u64) -> R + Sync,
) {
    let mask = SEQ_LEN - 1;
    let mut g = c.benchmark_group(format!("{prefix}_1t/{label}"));
    g.bench_function(id, |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & mask;
            call(black_box(keys[i]))
        })
    });
    g.finish();

    // Two threads on the same limiter, different key sequences: the per-call time of one thread
    // while the other runs the same loop (thread start-up is not timed).
    let mut g = c.benchmark_group(format!("{prefix}_2t/{label}"));
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let start = Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    start.wait();
                    for i in 0..iters as usize {
                        black_box(call(black_box(other[i & mask])));
                    }
                });
                start.wait();
                let t = Instant::now();
                for i in 0..iters as usize {
                    black_box(call(black_box(keys[i & mask])));
                }
                t.elapsed()
            })
        })
    });
    g.finish();
}

/// A turnstile keyed limiter on its default clock with keys `0..n`, each taken once.
fn turnstile_populated(alg: Algorithm, n: u64) -> KeyedLimiter<u64> {
    let limiter = KeyedLimiter::new(alg).expect("valid bench configuration");
    for k in 0..n {
        limiter.try_acquire(&k).expect("the first call for a key");
    }
    assert_eq!(limiter.len() as u64, n, "keys after population");
    limiter
}

/// A governor keyed limiter with keys `0..n`, each checked once.
fn governor_populated<C: GovClock>(limiter: GovKeyed<C>, n: u64) -> GovKeyed<C> {
    for k in 0..n {
        limiter.check_key(&k).expect("the first call for a key");
    }
    assert_eq!(limiter.len() as u64, n, "keys after population");
    limiter
}

fn bench_existing_keys(c: &mut Criterion) {
    let upkeep = QuantaUpkeepClock::from_interval(QUANTA_UPKEEP).expect("quanta upkeep thread");
    std::thread::sleep(QUANTA_UPKEEP * 3);
    for (n, label) in SIZES {
        let keys = key_sequence(n, SEQ_LEN, SEED_MAIN);
        let other = key_sequence(n, SEQ_LEN, SEED_OTHER);

        for (admit, prefix) in [(true, "keyed_admit"), (false, "keyed_reject")] {
            let configs = if admit { ADMIT } else { REJECT };
            for (name, alg) in configs {
                let id = format!("turnstile/{name}");
                let limiter = turnstile_populated(alg, n);
                bench_calls(c, prefix, label, &id, &keys, &other, |k| {
                    limiter.try_acquire(&k)
                });
                turnstile_checks(&limiter, admit, n, &id);
            }
            if admit {
                // The fixed window again after one `sweep()`, which evicts nothing here (every
                // key is busy) but walks every shard and flushes reclamation: the state a
                // limiter with a periodic sweeper settles in.
                let id = "turnstile/fixed_window (swept)";
                let limiter = turnstile_populated(ADMIT[0].1, n);
                assert_eq!(limiter.sweep(), 0, "{id}: evicted a busy key");
                bench_calls(c, prefix, label, id, &keys, &other, |k| {
                    limiter.try_acquire(&k)
                });
                turnstile_checks(&limiter, admit, n, id);
            }

            let quota = if admit {
                governor_admit_quota()
            } else {
                governor_reject_quota()
            };
            let gov = governor_populated(governor::RateLimiter::keyed(quota), n);
            bench_calls(
                c,
                prefix,
                label,
                "governor/default_clock",
                &keys,
                &other,
                |k| gov.check_key(&k),
            );
            governor_checks(&gov, admit, n);
            drop(gov);

            let gov = governor_populated(
                governor::RateLimiter::dashmap_with_clock(quota, upkeep.clone()),
                n,
            );
            bench_calls(
                c,
                prefix,
                label,
                "governor/upkeep_clock",
                &keys,
                &other,
                |k| gov.check_key(&k),
            );
            governor_checks(&gov, admit, n);
        }
    }
}

/// Checks that an admit run rejected nothing, a reject run admitted nothing (beyond the
/// population's one call per key), and that no key was added or evicted.
fn turnstile_checks(limiter: &KeyedLimiter<u64>, admit: bool, n: u64, id: &str) {
    let stats = limiter.stats();
    if admit {
        assert_eq!(stats.rejected, 0, "{id}: an admit run rejected calls");
    } else {
        assert_eq!(stats.admitted, n, "{id}: a reject run admitted calls");
    }
    assert_eq!(
        (stats.keys as u64, stats.evicted),
        (n, 0),
        "{id}: keys changed"
    );
}

/// governor keeps no statistics: checks that the key count is unchanged and that a key still
/// answers as every call in the run should have.
fn governor_checks<C: GovClock>(gov: &GovKeyed<C>, admit: bool, n: u64) {
    assert_eq!(gov.len() as u64, n, "governor: keys changed");
    assert_eq!(
        gov.check_key(&(n / 2)).is_ok(),
        admit,
        "governor: wrong outcome"
    );
}

// ---------------------------------------------------------------------------------------------
// sweep
// ---------------------------------------------------------------------------------------------

const SWEEP_KEYS: u64 = 1_000_000;

/// A keyed limiter on a manual clock with `SWEEP_KEYS` keys, each taken once at time zero; with
/// `idle`, the clock is then moved two windows on, so that every key is idle.
fn sweep_setup(alg: Algorithm, idle: bool) -> KeyedLimiter<u64, ManualClock> {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder(alg)
        .clock(clock.clone())
        .max_keys(2_000_000)
        .build()
        .expect("valid bench configuration");
    for k in 0..SWEEP_KEYS {
        limiter.try_acquire(&k).expect("the first call for a key");
    }
    assert_eq!(limiter.len() as u64, SWEEP_KEYS, "keys after population");
    if idle {
        clock.advance(Duration::from_secs(2));
    }
    limiter
}

fn governor_sweep_setup(idle: bool) -> GovKeyed<FakeRelativeClock> {
    let clock = FakeRelativeClock::default();
    let gov = governor_populated(
        governor::RateLimiter::dashmap_with_clock(governor_ordinary_quota(), clock.clone()),
        SWEEP_KEYS,
    );
    if idle {
        clock.advance(Duration::from_secs(2));
    }
    gov
}

fn bench_sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_sweep/1m_keys");
    // Each iteration needs a fresh population (about a second, untimed): one iteration per
    // sample, ten samples. (criterion warns that 10 samples do not fit in 100 ms and estimates
    // the time without the setups; the target only keeps it at one iteration per sample.)
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(100));
    for (name, alg) in ORDINARY.into_iter().take(2) {
        for (idle, case) in [(true, "idle"), (false, "busy")] {
            let expected = if idle { SWEEP_KEYS as usize } else { 0 };
            g.bench_function(format!("turnstile/{name}/{case}"), |b| {
                b.iter_batched(
                    || sweep_setup(alg, idle),
                    |limiter| {
                        let evicted = limiter.sweep();
                        assert_eq!(evicted, expected, "{name}/{case}: evicted");
                        // Returned so that it is dropped outside the timing.
                        limiter
                    },
                    BatchSize::PerIteration,
                )
            });
        }
        // Sweeps after the first skip every shard whose keys were all busy (its hint says when
        // the first can turn idle): the cost of a periodic sweeper while nothing expires.
        let limiter = sweep_setup(alg, false);
        assert_eq!(limiter.sweep(), 0);
        g.bench_function(format!("turnstile/{name}/busy_repeat"), |b| {
            b.iter(|| limiter.sweep())
        });
        assert_eq!(limiter.len() as u64, SWEEP_KEYS);
    }
    // governor's equivalent: `retain_recent` (DashMap::retain over every key, every time).
    for (idle, case) in [(true, "idle"), (false, "busy")] {
        g.bench_function(format!("governor/retain_recent/{case}"), |b| {
            b.iter_batched(
                || governor_sweep_setup(idle),
                |gov| {
                    gov.retain_recent();
                    let expected = if idle { 0 } else { SWEEP_KEYS as usize };
                    assert_eq!(gov.len(), expected, "governor/{case}: keys left");
                    gov
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// Bytes per key
// ---------------------------------------------------------------------------------------------

const MEMORY_KEYS: u64 = 1_000_000;

/// One measurement: the bytes a structure holding `keys` keys added to the heap (requested, and
/// estimated malloc chunks) and its live large allocations, by size class.
struct Footprint {
    name: String,
    keys: u64,
    bytes: usize,
    chunks: usize,
    /// Time to build the structure and insert the keys (one run, indicative).
    fill: Duration,
    large: Vec<(usize, usize, usize)>,
}

impl Footprint {
    fn per_key(&self, x: f64) -> String {
        if self.keys == 0 {
            "—".to_string()
        } else {
            format!("{:.1}", x / self.keys as f64)
        }
    }
}

fn footprint<T>(
    name: &str,
    keys: u64,
    build: impl FnOnce() -> T,
    check: impl FnOnce(&T),
) -> Footprint {
    let before = Heap::now();
    let start = Instant::now();
    let structure = build();
    let fill = start.elapsed();
    let after = Heap::now();
    check(&structure);
    let large = (0..64)
        .filter_map(|class| {
            let count = after.large_count[class] as isize - before.large_count[class] as isize;
            let bytes = after.large_bytes[class] as isize - before.large_bytes[class] as isize;
            (count > 0).then_some((class, count as usize, bytes as usize))
        })
        .collect();
    drop(structure);
    Footprint {
        name: name.to_string(),
        keys,
        bytes: after.live - before.live,
        chunks: after.chunks - before.chunks,
        fill,
        large,
    }
}

/// A turnstile keyed limiter (default `max_keys`) on a frozen clock with keys `0..n`: no key
/// turns idle, so nothing is evicted (or left to deferred reclamation) while inserting. With
/// `swept`, one `sweep()` (which evicts nothing) follows, as a periodic sweeper would run.
fn turnstile_footprint(name: &str, alg: Algorithm, n: u64, swept: bool) -> Footprint {
    let label = if swept {
        format!("turnstile/{name} (after a sweep)")
    } else {
        format!("turnstile/{name}")
    };
    footprint(
        &label,
        n,
        || {
            let limiter = KeyedLimiter::builder(alg)
                .clock(ManualClock::new())
                .build()
                .expect("valid bench configuration");
            for k in 0..n {
                limiter.try_acquire(&k).expect("the first call for a key");
            }
            if swept {
                assert_eq!(limiter.sweep(), 0, "a sweep evicted a busy key");
            }
            limiter
        },
        |limiter| {
            assert_eq!(limiter.len() as u64, n);
            assert_eq!(limiter.stats().evicted, 0);
        },
    )
}

fn governor_footprint(n: u64) -> Footprint {
    footprint(
        "governor/keyed (DashMap)",
        n,
        || governor_populated(governor::RateLimiter::keyed(governor_ordinary_quota()), n),
        |gov| assert_eq!(gov.len() as u64, n),
    )
}

/// An HTTP limiter (feature `http`) with one rule counting by `key` (`"ip"` or `"client"`), and
/// with `per_endpoint` by endpoint too (`GET:/api/values`), on a frozen clock, after one
/// request from each of `n` clients (distinct IPv4 addresses, or client ids `client-{i}`):
/// what a rule's keys cost, the rule's `CounterKey` included.
#[cfg(feature = "http")]
fn http_footprint(key: &str, per_endpoint: bool, n: u64) -> Footprint {
    use std::net::{IpAddr, Ipv4Addr};
    use turnstile::http::{HttpConfig, HttpLimiter, Outcome, RequestInfo};
    footprint(
        &format!("turnstile/http rule, key = {key:?}, per_endpoint = {per_endpoint}"),
        n,
        || {
            let config = HttpConfig::from_toml_str(&format!(
                "client_id_header = \"x-client\"\n[[rules]]\nname = \"r\"\nperiod = \"1h\"\nlimit = 10\nkey = \"{key}\"\nper_endpoint = {per_endpoint}\n"
            ))
            .expect("valid bench configuration");
            let limiter =
                HttpLimiter::with_clock(config, ManualClock::new()).expect("valid bench limiter");
            let method = http::Method::GET;
            let mut id = String::new();
            for i in 0..n {
                id.clear();
                let _ = write!(id, "client-{i}");
                let verdict = limiter.decide(&RequestInfo {
                    method: &method,
                    path: "/api/values",
                    client_ip: Some(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i as u32))),
                    client_id: Some(&id),
                });
                assert_eq!(
                    verdict.outcome,
                    Outcome::Admitted,
                    "the first request of a client"
                );
            }
            limiter
        },
        |_| {},
    )
}

fn memory() {
    let mut rows: Vec<Footprint> = ORDINARY
        .iter()
        .map(|&(name, alg)| turnstile_footprint(name, alg, MEMORY_KEYS, false))
        .collect();
    for &(name, alg) in &ORDINARY[..2] {
        rows.push(turnstile_footprint(name, alg, MEMORY_KEYS, true));
    }
    rows.push(governor_footprint(MEMORY_KEYS));
    #[cfg(feature = "http")]
    for (key, per_endpoint) in [("ip", false), ("client", false), ("ip", true)] {
        rows.push(http_footprint(key, per_endpoint, MEMORY_KEYS));
    }
    // The fixed cost of a limiter, and its share at 1,000 keys.
    for n in [0, 1_000] {
        rows.push(turnstile_footprint("fixed_window", ORDINARY[0].1, n, false));
        rows.push(governor_footprint(n));
    }

    let mut text = String::from(
        "heap bytes added by a keyed limiter holding `keys` u64 keys (limit 10 per second; \
         turnstile with its default max_keys), the key included\n\n\
         | structure | keys | total bytes | bytes/key (requested) | bytes/key (est. glibc malloc chunks) | fill ns/key (one run) |\n\
         |---|---|---|---|---|---|\n",
    );
    for row in &rows {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} |",
            row.name,
            row.keys,
            row.bytes,
            row.per_key(row.bytes as f64),
            row.per_key(row.chunks as f64),
            row.per_key(row.fill.as_nanos() as f64)
        );
    }
    text.push_str(&format!(
        "\nlive allocations of {LARGE} bytes or more added by each structure with {MEMORY_KEYS} keys, \
         by size class\n\n| structure | size class | count | bytes | bytes/key |\n|---|---|---|---|---|\n"
    ));
    for row in rows.iter().filter(|r| r.keys == MEMORY_KEYS) {
        for &(class, count, bytes) in &row.large {
            let _ = writeln!(
                text,
                "| {} | [{}, {}) | {} | {} | {:.1} |",
                row.name,
                1usize << class,
                1usize << (class + 1),
                count,
                bytes,
                bytes as f64 / MEMORY_KEYS as f64
            );
        }
    }
    print!("\n{text}");
    let dir = std::path::Path::new("target/criterion");
    if std::fs::create_dir_all(dir).is_ok() {
        let _ = std::fs::write(dir.join("keyed-memory.txt"), text);
    }
}

// ---------------------------------------------------------------------------------------------
// keyed concurrency: a permit taken and given back
// ---------------------------------------------------------------------------------------------

/// `KeyedConcurrencyLimiter<u64>` (limit 4, the default cap) with keys `0..1,000` present: one
/// `try_acquire` and the permit's drop per call, on the key sequence. Every release leaves its
/// key idle, the path that lowers the sweep hints (a load of each, and the SeqCst fence that
/// orders them against a racing sweep: see `KeyedConcurrencyLimiter::key_idled`).
fn bench_keyed_concurrency(c: &mut Criterion) {
    let (n, label) = SIZES[0];
    let keys = key_sequence(n, SEQ_LEN, SEED_MAIN);
    let other = key_sequence(n, SEQ_LEN, SEED_OTHER);
    // The default policy, and the shared overflow pool, whose calls also note the evictions
    // their sweeps make (for the pool's waiters), below the cap as here.
    for (overflow, id) in [
        (turnstile::KeyOverflow::Reject, "turnstile/acquire_release"),
        (
            turnstile::KeyOverflow::Shared,
            "turnstile/acquire_release_shared",
        ),
    ] {
        let limiter = turnstile::KeyedConcurrencyLimiter::<u64>::builder(4)
            .overflow(overflow)
            .build()
            .expect("limit 4 is valid");
        for k in 0..n {
            drop(limiter.try_acquire(&k).expect("a key's first permit"));
        }
        bench_calls(c, "keyed_concurrency", label, id, &keys, &other, |k| {
            drop(
                limiter
                    .try_acquire(&k)
                    .expect("never more than 2 permits out"),
            );
        });
        assert_eq!(limiter.len() as u64, n, "{id}: a key was added or evicted");
    }
}

// ---------------------------------------------------------------------------------------------

criterion_group! {
    name = calls;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(25);
    targets = bench_existing_keys, bench_keyed_concurrency
}

criterion_group! {
    name = sweeps;
    config = Criterion::default();
    targets = bench_sweep
}

fn main() {
    // Memory first, while the heap holds nothing else of ours.
    memory();
    calls();
    sweeps();
    Criterion::default().configure_from_args().final_summary();
}
