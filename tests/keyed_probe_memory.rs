//! A probe (a call for zero permits, `charge(0)`, a chain's probe) for a key the limiter does not
//! hold answers for a fresh state and creates none: no key, and no per-key memory either, even
//! transiently (an exact sliding window's fresh state is a ring of 8 bytes per permit, so a flood
//! of probes for unknown keys cost one such ring each). Its own test binary, since it installs a
//! counting allocator.

use std::time::Duration;
use turnstile::{Algorithm, KeyedChain, KeyedLimiter, ManualClock};

/// Heap bytes allocated per thread (frees not subtracted), so that a test reads its own thread's
/// figure while the other tests run in parallel.
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        // `const` and no destructor: reading it never allocates, so the allocator may use it.
        static ALLOCATED: Cell<usize> = const { Cell::new(0) };
    }

    fn track(bytes: usize) {
        // `try_with`: an allocation while the thread's locals are being torn down is not counted.
        let _ = ALLOCATED.try_with(|total| total.set(total.get() + bytes));
    }

    /// Bytes the calling thread has allocated so far.
    pub fn allocated() -> usize {
        ALLOCATED.with(Cell::get)
    }

    pub struct Counting;

    // SAFETY: every method forwards to `System` with the caller's arguments unchanged, so this
    // allocator keeps `System`'s contract; it only adds a thread-local counter (no allocation).
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            track(layout.size());
            // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            track(layout.size());
            // SAFETY: as for `alloc`.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator with this `layout`.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            track(new_size);
            // SAFETY: as for `alloc` and `dealloc`.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;
}

/// Bytes `f` allocates on this thread.
fn allocated_by(f: impl FnOnce()) -> usize {
    let before = heap::allocated();
    f();
    heap::allocated() - before
}

/// Limit 2^20: a key's ring is 8 MiB. A hundred probes for unknown keys, in every form, make no
/// key and allocate less than one ring in all (each allocated a whole ring before).
#[test]
fn probes_for_unknown_keys_allocate_no_ring_and_make_no_key() {
    let limit = 1 << 20;
    let limiter = KeyedLimiter::<u64, _>::builder(Algorithm::SlidingWindow {
        limit,
        window: Duration::from_secs(60),
    })
    .clock(ManualClock::new())
    .build()
    .unwrap();
    let chain = KeyedChain::builder()
        .per_key(limiter.clone())
        .build()
        .unwrap();
    let bytes = allocated_by(|| {
        for key in 0..100u64 {
            assert_eq!(limiter.try_acquire_n(&key, 0).unwrap().remaining(), limit);
            assert_eq!(limiter.charge(&key, 0).unwrap().remaining(), limit);
            assert_eq!(limiter.available(&key), limit);
            assert_eq!(chain.try_acquire_n(&key, 0).unwrap().remaining(), limit);
            assert_eq!(chain.charge(&key, 0).unwrap().remaining(), limit);
        }
    });
    assert!(
        bytes < 1 << 20,
        "a hundred probes allocated {bytes} bytes (a ring is {} bytes)",
        8 * limit
    );
    assert_eq!(limiter.len(), 0, "a probe made a key");
    assert_eq!(limiter.stats().keys, 0);
    // A real call still makes the key, with its full ring.
    assert_eq!(limiter.try_acquire(&7).unwrap().remaining(), limit - 1);
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.try_acquire_n(&7, 0).unwrap().remaining(), limit - 1);
}

/// The same for a `StoreLimiter`: a probe (`try_acquire_n(0)`, `charge(0)`) of a subject the
/// store holds nothing for answers for a fresh state without building one (each built a whole
/// ring), and writes nothing.
#[cfg(feature = "store")]
#[test]
fn store_probes_for_unknown_subjects_allocate_no_ring() {
    use turnstile::{Store, StoreLimiter};

    /// A store that holds nothing, and refuses writes (a probe makes none).
    struct Empty;

    impl Store for Empty {
        type Error = std::convert::Infallible;
        async fn get(&self, _: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
            Ok(None)
        }
        async fn set(&self, _: &[u8], _: Vec<u8>, _: Duration) -> Result<(), Self::Error> {
            panic!("a probe wrote to the store");
        }
    }

    let limit = 1 << 20;
    let algorithm = Algorithm::SlidingWindow {
        limit,
        window: Duration::from_secs(60),
    };
    let limiter = StoreLimiter::new(algorithm, "p", Empty).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let bytes = allocated_by(|| {
        runtime.block_on(async {
            for subject in 0..100u64 {
                let subject = subject.to_le_bytes();
                let probe = limiter.try_acquire_n(&subject, 0).await.unwrap();
                assert_eq!(probe.remaining(), limit);
                assert_eq!(
                    limiter.charge(&subject, 0).await.unwrap().remaining(),
                    limit
                );
            }
        })
    });
    assert!(
        bytes < 1 << 20,
        "two hundred probes allocated {bytes} bytes (a ring is {} bytes)",
        8 * limit
    );
}

/// A keyed chain's per-key queues of waiting chain callers (keyed concurrency limiters, a few
/// MiB of shards each at their default key cap) are made by the first caller that waits, not
/// with the chain: building one, and calls admitted at once, stay small.
#[test]
fn a_keyed_chain_makes_its_queues_only_when_a_caller_waits() {
    let limiter = KeyedLimiter::<u64, _>::builder(Algorithm::FixedWindow {
        limit: 1,
        window: Duration::from_secs(60),
    })
    .clock(ManualClock::new())
    .build()
    .unwrap();
    limiter.try_acquire(&1).unwrap();
    let mut chain = None;
    let bytes = allocated_by(|| {
        let built = KeyedChain::builder()
            .per_key(limiter.clone())
            .build()
            .unwrap();
        assert!(built.try_acquire(&1).is_err());
        chain = Some(built);
    });
    assert!(bytes < 64 << 10, "a keyed chain allocated {bytes} bytes");
    // The first caller that must wait makes them, and times out holding nothing.
    let chain = chain.unwrap();
    let waited = chain.acquire_blocking_timeout(&1, 1, Duration::from_millis(1));
    assert_eq!(waited, Err(turnstile::AcquireError::Timeout));
    assert_eq!(chain.stats().waiting, 0);
}
