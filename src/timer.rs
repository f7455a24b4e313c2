//! The timer every async wait sleeps on (a queue's head waiting for its permits' time, a chain
//! caller between attempts, the `acquire*_timeout`s): tokio's when the sleep is created inside a
//! tokio runtime, futures-timer's helper thread anywhere else (`futures::executor::block_on`,
//! smol, async-std), so that waiting works on any executor.
//!
//! The choice is made once per sleep, when it is created, with
//! [`Handle::try_current`](tokio::runtime::Handle::try_current): inside a runtime, waits keep
//! tokio's timer wheel and follow its paused time (which the tests, and users' tests, rely on);
//! that runtime must have its time driver enabled, as before, and be running: a current-thread
//! runtime merely entered (`Handle::enter`) while another executor polls never fires the timer,
//! as tokio's own `sleep` would not. Only a waiter that must sleep pays
//! for the look-up: the fast path of an `acquire` creates no sleep.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A sleep that can be reset to a new deadline; see the module's documentation for which timer
/// it runs on.
pub(crate) struct Sleep(Kind);

enum Kind {
    /// Boxed: tokio's `Sleep` is `!Unpin`, and pinning it inline would need `unsafe` projection.
    Tokio(Pin<Box<tokio::time::Sleep>>),
    /// futures-timer's global timer thread, started on first use.
    Thread(futures_timer::Delay),
}

impl Sleep {
    /// A sleep that ends `after` from now (for an `after` past what an `Instant` holds, in about
    /// 30 years, as tokio's `sleep` does).
    pub(crate) fn new(after: Duration) -> Self {
        if tokio::runtime::Handle::try_current().is_ok() {
            Sleep(Kind::Tokio(Box::pin(tokio::time::sleep(after))))
        } else {
            Sleep(Kind::Thread(futures_timer::Delay::new(held(after))))
        }
    }

    /// A sleep that ends `after` from now, or `None` if that is past what an `Instant` holds: a
    /// time that never comes (a time limit of `Duration::MAX`), as tokio's `timeout` takes it.
    pub(crate) fn new_or_never(after: Duration) -> Option<Self> {
        if tokio::runtime::Handle::try_current().is_ok() {
            let deadline = tokio::time::Instant::now().checked_add(after)?;
            Some(Sleep(Kind::Tokio(Box::pin(tokio::time::sleep_until(
                deadline,
            )))))
        } else {
            std::time::Instant::now().checked_add(after)?;
            Some(Sleep(Kind::Thread(futures_timer::Delay::new(after))))
        }
    }

    /// Moves the end to `after` from now (on the timer it was created on), whether or not it had
    /// ended.
    pub(crate) fn reset(&mut self, after: Duration) {
        match &mut self.0 {
            Kind::Tokio(sleep) => {
                let now = tokio::time::Instant::now();
                // As tokio's `sleep` does for a deadline past what an `Instant` holds: about 30
                // years, which no wait of this crate outlives.
                let deadline = now.checked_add(after).unwrap_or_else(|| now + FAR_FUTURE);
                sleep.as_mut().reset(deadline);
            }
            Kind::Thread(delay) => delay.reset(held(after)),
        }
    }
}

/// About 30 years: how far tokio's `sleep` puts a deadline past what an `Instant` holds, and
/// what no wait of this crate outlives.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `after`, or [`FAR_FUTURE`] if it is past what an `Instant` holds: futures-timer before 3.0.4
/// (which Cargo.toml's `"3"` admits) adds it to `Instant::now()` unchecked, and panics.
fn held(after: Duration) -> Duration {
    match std::time::Instant::now().checked_add(after) {
        Some(_) => after,
        None => FAR_FUTURE,
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.get_mut().0 {
            Kind::Tokio(sleep) => sleep.as_mut().poll(cx),
            Kind::Thread(delay) => Pin::new(delay).poll(cx),
        }
    }
}

/// Sleeps for `after`.
pub(crate) async fn sleep(after: Duration) {
    Sleep::new(after).await;
}

/// `future` did not finish within its [`timeout`].
#[derive(Debug)]
pub(crate) struct Elapsed;

/// `future`'s output, or [`Elapsed`] if `after` passes first; an `after` past what an `Instant`
/// holds never passes.
///
/// `future` is polled first, and the timer is created only when it is pending: an `acquire`
/// admitted at its first poll sets no timer (the time of that first poll, the fast path's, is
/// not counted in `after`). Every poll polls `future` before the timer, as tokio's `timeout`
/// does: a future that is ready when the time passes is answered, not dropped.
pub(crate) async fn timeout<F: Future>(after: Duration, future: F) -> Result<F::Output, Elapsed> {
    let mut future = std::pin::pin!(future);
    // `None` until `future` is first pending; then `Some(None)` for a time that never comes.
    let mut sleep: Option<Option<Sleep>> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match sleep.get_or_insert_with(|| Sleep::new_or_never(after)) {
            Some(sleep) => Pin::new(sleep).poll(cx).map(|()| Err(Elapsed)),
            None => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_tokio(sleep: &Sleep) -> bool {
        matches!(sleep.0, Kind::Tokio(_))
    }

    #[test]
    fn off_tokio_a_sleep_runs_on_the_timer_thread_and_can_be_reset() {
        let mut sleep = Sleep::new(Duration::from_secs(3600));
        assert!(!is_tokio(&sleep));
        sleep.reset(Duration::from_millis(1));
        let start = std::time::Instant::now();
        futures_executor::block_on(&mut sleep);
        assert!(start.elapsed() >= Duration::from_millis(1));
        // Reset after it ended: it sleeps again.
        sleep.reset(Duration::from_millis(20));
        let start = std::time::Instant::now();
        futures_executor::block_on(&mut sleep);
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn off_tokio_a_timeout_passes_or_answers() {
        let pending = std::future::pending::<()>();
        let slept = futures_executor::block_on(timeout(Duration::from_millis(5), pending));
        assert!(slept.is_err());
        let ready = futures_executor::block_on(timeout(Duration::ZERO, async { 7 }));
        assert_eq!(ready.unwrap(), 7);
        assert!(Sleep::new_or_never(Duration::MAX).is_none());
        assert!(Sleep::new_or_never(Duration::from_secs(1)).is_some());
    }

    /// Off tokio, a sleep (or a reset) past what an `Instant` holds (a sweeper's `every` of
    /// `Duration::MAX`) is a sleep of about 30 years, as on tokio, whatever futures-timer does
    /// with it: its releases before 3.0.4 (which Cargo.toml's `"3"` admits) add it to
    /// `Instant::now()` and panic on the overflow.
    #[test]
    fn off_tokio_a_sleep_past_what_an_instant_holds_does_not_panic() {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut sleep = Sleep::new(Duration::MAX);
        assert!(!is_tokio(&sleep));
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        sleep.reset(Duration::MAX);
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        sleep.reset(Duration::from_millis(1));
        futures_executor::block_on(&mut sleep);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn inside_tokio_a_sleep_follows_its_paused_clock() {
        let start = tokio::time::Instant::now();
        let mut sleep = Sleep::new(Duration::from_secs(3600));
        assert!(is_tokio(&sleep));
        sleep.reset(Duration::from_secs(7200));
        (&mut sleep).await;
        assert_eq!(start.elapsed(), Duration::from_secs(7200));
        let late = timeout(Duration::from_secs(60), std::future::pending::<()>()).await;
        assert!(late.is_err());
        assert_eq!(start.elapsed(), Duration::from_secs(7260));
        // A huge reset does not overflow; a time limit that large never passes.
        sleep.reset(Duration::MAX);
        assert!(Sleep::new_or_never(Duration::MAX).is_none());
        assert!(Sleep::new_or_never(Duration::from_secs(1)).is_some());
    }
}
