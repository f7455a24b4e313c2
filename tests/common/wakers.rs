//! Wakers for tests that poll futures by hand: one that counts its wake-ups, and ones whose
//! `wake` panics (the `Waker` contract allows it), to check that one bad waker strands nobody
//! else.

#![allow(dead_code)] // each test binary uses the helpers it needs

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Counts the wake-ups of the wakers made from it.
#[derive(Default)]
pub struct Counter(AtomicUsize);

impl Counter {
    pub fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker and the counter of its wake-ups.
pub fn counting() -> (Arc<Counter>, Waker) {
    let counter = Arc::new(Counter::default());
    (Arc::clone(&counter), Waker::from(Arc::clone(&counter)))
}

struct Panicky;

impl Wake for Panicky {
    fn wake(self: Arc<Self>) {
        panic!("this waker panics in wake");
    }
}

/// A waker whose `wake` panics.
pub fn panicky() -> Waker {
    Waker::from(Arc::new(Panicky))
}

/// Polls `fut` once with `waker`.
pub fn poll_with<F: Future + ?Sized>(fut: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(waker))
}

/// Runs `f`, which must panic through one of this module's panicking wakers; the panic is
/// caught here. Any other panic (a failed assertion inside `f` or inside a waker, a panic of the
/// limiter itself) is not what the caller meant to provoke, and fails the test.
pub fn must_panic(f: impl FnOnce()) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let payload = outcome.expect_err("expected the panicking waker to panic");
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("<a panic without a message>");
    assert!(
        message.starts_with("this waker panics"),
        "expected the panicking waker's panic, got: {message}"
    );
}

/// A call polled by hand, boxed.
pub type Call<O> = Pin<Box<dyn Future<Output = O> + Send>>;

/// A waker whose `wake` polls another call (with `waker`; it must stay pending) and then
/// panics: a party that looks at a limiter from inside a served head's handover (as a thread of
/// its own could, at that moment), and a handover that unwinds.
pub struct PollThenPanic<O> {
    call: Mutex<Call<O>>,
    waker: Waker,
}

impl<O> PollThenPanic<O> {
    pub fn new(call: Call<O>, waker: Waker) -> Arc<Self> {
        Arc::new(PollThenPanic {
            call: Mutex::new(call),
            waker,
        })
    }

    /// Polls the call once more, with `waker`.
    pub fn poll(&self, waker: &Waker) -> Poll<O> {
        poll_with(self.call.lock().unwrap().as_mut(), waker)
    }
}

impl<O: 'static> Wake for PollThenPanic<O> {
    fn wake(self: Arc<Self>) {
        assert!(self.poll(&self.waker).is_pending());
        panic!("this waker panics after polling another call");
    }
}

/// A served head whose handover unwinds, with a chain caller watching: `head` and `next` wait,
/// in that order, on a limiter whose one permit is taken until `window` ends (tokio's paused
/// time); the chain `caller` needs that permit too. At `window`, `head` takes the new permit and
/// wakes `next`, whose waker polls `caller` (it finds nothing free and goes to sleep) and then
/// panics, so `head` gives its permit back. Returns what `caller` answers after its 1 ms
/// backoff, by which time the give-back must have woken it exactly once.
pub async fn give_back_after_a_handover_panic<H: Future, N: Future, O: 'static>(
    head: H,
    next: N,
    caller: Call<O>,
    window: std::time::Duration,
) -> Poll<O> {
    let (woken, caller_waker) = counting();
    let hook = PollThenPanic::new(caller, caller_waker);
    let (mut head, mut next) = (Box::pin(head), Box::pin(next));
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(next.as_mut(), &Waker::from(Arc::clone(&hook))).is_pending());
    tokio::time::advance(window).await;
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop((head, next));
    // The caller sleeps its 1 ms backoff whatever it is told (the notification is kept), then
    // finds it and tries again.
    tokio::time::advance(std::time::Duration::from_millis(1)).await;
    assert_eq!(woken.wakes(), 1, "the backoff's timer");
    hook.poll(Waker::noop())
}
