//! Which concurrent map holds the keyed limiters' per-key state: a bake-off in one run.
//!
//! Each candidate maps a `u64` key to one `AtomicU64` (the size of a fixed window's or a token
//! bucket's state) and is measured on what a keyed `try_acquire` does to it: look an existing key
//! up and compare-and-swap its word. Lookups follow a fixed pseudo-random key sequence so that the
//! 1,000,000-key runs miss the CPU caches as real traffic would.
//!
//! - `papaya::HashMap`: lock-free reads; each entry is its own allocation, so a reference to a
//!   value stays valid (and keeps pointing at the live value) across resizes.
//! - `scc::HashMap` (`read_sync`): entries inline in buckets, a shared bucket lock per read.
//! - `dashmap::DashMap` 6 (governor's keyed store): a shard `RwLock` read lock per lookup.
//!
//! (`scc::HashIndex::peek` would be lock-free too, but its documentation warns that a peeked value
//! may be an old copy after a resize, so interior mutability through it can be lost: unusable for
//! atomics that must never lose an admission.)
//!
//! Each map runs with std's SipHash (governor's keyed store uses it) and with foldhash; a third
//! group has two threads look up one hot key and only load its word, as rejected calls under
//! attack do: the case where a lookup that writes a lock word makes two cores fight over it.
//!
//! After the timings, the run prints the heap bytes per key of each map with 1,000,000 keys,
//! measured by a counting global allocator, and writes them to
//! `target/criterion/keyed_map-memory.txt`.
//!
//! Run: `cargo bench --bench keyed_map`.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group};
#[path = "common/heap.rs"]
mod heap;

use foldhash::fast::RandomState as Fold;
use heap::{Heap, key_sequence};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The operation every candidate performs on a hit: what a fixed window's admit does.
#[inline(always)]
fn touch(word: &AtomicU64) -> bool {
    let current = word.load(Ordering::Acquire);
    word.compare_exchange(current, current + 1, Ordering::Release, Ordering::Relaxed)
        .is_ok()
}

trait Candidate: Sync {
    fn name() -> String;
    fn with_keys(n: u64) -> Self;
    fn hit(&self, key: u64) -> bool;
    /// A lookup that only loads the word: what a rejected `try_acquire` does.
    fn peek(&self, key: u64) -> u64;
}

/// The two hashers compared: std's SipHash-1-3 (governor's keyed store uses it) and foldhash
/// (hashbrown's default), both seeded at random per map.
trait Hasher: BuildHasher + Default + Clone + Send + Sync {
    const NAME: &'static str;
}
impl Hasher for RandomState {
    const NAME: &'static str = "siphash";
}
impl Hasher for foldhash::fast::RandomState {
    const NAME: &'static str = "foldhash";
}

struct Papaya<S>(papaya::HashMap<u64, AtomicU64, S>);
struct Scc<S: BuildHasher>(scc::HashMap<u64, AtomicU64, S>);
struct Dash<S>(dashmap::DashMap<u64, AtomicU64, S>);

impl<S: Hasher> Candidate for Papaya<S> {
    fn name() -> String {
        format!("papaya/{}", S::NAME)
    }
    fn with_keys(n: u64) -> Self {
        let map = papaya::HashMap::with_hasher(S::default());
        {
            let map = map.pin();
            for k in 0..n {
                map.insert(k, AtomicU64::new(0));
            }
        }
        Papaya(map)
    }
    #[inline(always)]
    fn hit(&self, key: u64) -> bool {
        let guard = self.0.guard();
        self.0.get(&key, &guard).is_some_and(touch)
    }
    #[inline(always)]
    fn peek(&self, key: u64) -> u64 {
        let guard = self.0.guard();
        self.0
            .get(&key, &guard)
            .map_or(0, |v| v.load(Ordering::Acquire))
    }
}

impl<S: Hasher> Candidate for Scc<S> {
    fn name() -> String {
        format!("scc/{}", S::NAME)
    }
    fn with_keys(n: u64) -> Self {
        let map = scc::HashMap::with_hasher(S::default());
        for k in 0..n {
            let _ = map.insert_sync(k, AtomicU64::new(0));
        }
        Scc(map)
    }
    #[inline(always)]
    fn hit(&self, key: u64) -> bool {
        self.0.read_sync(&key, |_, v| touch(v)).unwrap_or(false)
    }
    #[inline(always)]
    fn peek(&self, key: u64) -> u64 {
        self.0
            .read_sync(&key, |_, v| v.load(Ordering::Acquire))
            .unwrap_or(0)
    }
}

impl<S: Hasher> Candidate for Dash<S> {
    fn name() -> String {
        format!("dashmap/{}", S::NAME)
    }
    fn with_keys(n: u64) -> Self {
        let map = dashmap::DashMap::with_hasher(S::default());
        for k in 0..n {
            map.insert(k, AtomicU64::new(0));
        }
        Dash(map)
    }
    #[inline(always)]
    fn hit(&self, key: u64) -> bool {
        self.0.get(&key).is_some_and(|v| touch(&v))
    }
    #[inline(always)]
    fn peek(&self, key: u64) -> u64 {
        self.0.get(&key).map_or(0, |v| v.load(Ordering::Acquire))
    }
}

fn bench_candidate<M: Candidate>(c: &mut Criterion, n: u64, label: &str) {
    let map = M::with_keys(n);
    let keys = key_sequence(n, 1 << 16, 0x9E37_79B9_7F4A_7C15);
    let mut group = c.benchmark_group(format!("keyed_map/hit_1t/{label}"));
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::from_parameter(M::name()), |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & (keys.len() - 1);
            black_box(map.hit(black_box(keys[i])))
        })
    });
    group.finish();

    // Two threads on the same map, different key sequences: per-operation time of one thread
    // while the other runs the same loop.
    let other = key_sequence(n, 1 << 16, 0xD1B5_4A32_D192_ED03);
    let mut group = c.benchmark_group(format!("keyed_map/hit_2t/{label}"));
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::from_parameter(M::name()), |b| {
        b.iter_custom(|iters| {
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    start.wait();
                    for i in 0..iters as usize {
                        black_box(map.hit(other[i & (other.len() - 1)]));
                    }
                });
                start.wait();
                let t = Instant::now();
                for i in 0..iters as usize {
                    black_box(map.hit(keys[i & (keys.len() - 1)]));
                }
                t.elapsed()
            })
        })
    });
    group.finish();
}

/// Two threads look up the same key and only load its word: a hot key under attack, where every
/// call is rejected. A map whose lookups write shared memory (a lock word) makes the two cores
/// fight over that cache line; a lock-free lookup leaves it shared and clean.
fn bench_hot_key<M: Candidate>(c: &mut Criterion) {
    let map = M::with_keys(1_000);
    let mut group = c.benchmark_group("keyed_map/hot_key_reject_2t");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::from_parameter(M::name()), |b| {
        b.iter_custom(|iters| {
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..iters {
                        black_box(map.peek(black_box(7)));
                    }
                });
                start.wait();
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(map.peek(black_box(7)));
                }
                t.elapsed()
            })
        })
    });
    group.finish();
}

fn hits(c: &mut Criterion) {
    bench_hot_key::<Papaya<Fold>>(c);
    bench_hot_key::<Scc<Fold>>(c);
    bench_hot_key::<Dash<Fold>>(c);
    for (n, label) in [(1_000u64, "1k_keys"), (1_000_000, "1m_keys")] {
        bench_candidate::<Papaya<RandomState>>(c, n, label);
        bench_candidate::<Scc<RandomState>>(c, n, label);
        bench_candidate::<Dash<RandomState>>(c, n, label);
        bench_candidate::<Papaya<Fold>>(c, n, label);
        bench_candidate::<Scc<Fold>>(c, n, label);
        bench_candidate::<Dash<Fold>>(c, n, label);
    }
}

fn bytes_per_key<M: Candidate>(n: u64) -> f64 {
    let before = Heap::now().live;
    let map = M::with_keys(n);
    let after = Heap::now().live;
    assert!(map.hit(n - 1), "{}: the last key is missing", M::name());
    drop(map);
    (after - before) as f64 / n as f64
}

fn memory() {
    let n = 1_000_000;
    let rows = [
        (Papaya::<Fold>::name(), bytes_per_key::<Papaya<Fold>>(n)),
        (Scc::<Fold>::name(), bytes_per_key::<Scc<Fold>>(n)),
        (Dash::<Fold>::name(), bytes_per_key::<Dash<Fold>>(n)),
    ];
    let mut text = String::from("map\theap bytes per key (1,000,000 u64 keys -> AtomicU64)\n");
    for (name, bytes) in rows {
        text.push_str(&format!("{name}\t{bytes:.1}\n"));
    }
    print!("\n{text}");
    let dir = std::path::Path::new("target/criterion");
    if std::fs::create_dir_all(dir).is_ok() {
        let _ = std::fs::write(dir.join("keyed_map-memory.txt"), text);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = hits
}

fn main() {
    benches();
    memory();
    Criterion::default().configure_from_args().final_summary();
}
