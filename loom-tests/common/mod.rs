//! What every loom model file shares (each file is its own test crate and includes this with
//! `mod common;`).

/// Runs `f` under loom. `loom::model` reads `LOOM_MAX_PREEMPTIONS` (and `LOOM_LOG`, …) from the
/// environment; without `LOOM_MAX_PREEMPTIONS` the models default to 2 preemptions rather than an
/// unbounded search.
pub fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_some() {
        loom::model(f);
    } else {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(f);
    }
}

/// [`model`] with the preemption bound capped at `cap`: `LOOM_MAX_PREEMPTIONS` (or the default
/// of 2) applies when it is lower. For the few models whose search at CI's bound of 3 takes
/// minutes while the interleavings they exist for need no more than `cap` preemptions; each
/// says so where it calls this, and what it still covers.
#[allow(dead_code)] // Not every model file has such a model.
pub fn model_capped<F: Fn() + Sync + Send + 'static>(cap: usize, f: F) {
    let asked = std::env::var("LOOM_MAX_PREEMPTIONS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2);
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(asked.min(cap));
    builder.check(f);
}

/// A paused current-thread tokio runtime, for a model that polls a waiter (whose head sleeps on
/// tokio's timer) by hand on the main thread: enter it for the model's run. tokio's own
/// synchronisation is not modelled; nothing but the main thread touches the runtime.
#[allow(dead_code)] // Not every model file has such a model.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Polls `call` (by hand, with a no-op waker) once, joins `other`, and if the call was pending
/// polls it once more: its outcome. Panics if it is still pending then: `other` finished
/// whatever should have ended it (a `close`, say) and it was left waiting.
#[allow(dead_code)] // Not every model file has such a model.
pub fn outcome_once_joined<F: std::future::Future + ?Sized>(
    mut call: std::pin::Pin<&mut F>,
    other: loom::thread::JoinHandle<()>,
) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut cx = Context::from_waker(Waker::noop());
    let polled = call.as_mut().poll(&mut cx);
    other.join().unwrap();
    match polled {
        Poll::Ready(outcome) => outcome,
        Poll::Pending => match call.as_mut().poll(&mut cx) {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => panic!("the call was left waiting once the other thread was done"),
        },
    }
}
