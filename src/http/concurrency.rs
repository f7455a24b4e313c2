//! [`ConcurrencyLayer`]: an in-flight cap for the routes it wraps.

use crate::http::RateLimitBody;
use crate::http::response::retry_seconds;
use crate::{ConcurrencyLimiter, OwnedPermit};
use bytes::Bytes;
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// A tower layer that caps the requests in flight through the services it wraps, with a
/// [`ConcurrencyLimiter`]. A request's permit is held until its response body has ended (or is
/// dropped), not merely until the headers are sent, so a slow download counts as in flight.
/// "Ended" is when the server has taken the body's last frame: a large data frame (a handler's
/// whole `Vec`, `String` or `Full`) is passed on in pieces of 64 KiB, which the server takes as
/// the client reads, so the permit goes back with at most the server's and the socket's buffers
/// still to send.
///
/// An upgraded connection (a WebSocket: the inner service answers 101 and hyper hands the
/// connection over) counts only until that 101 response's empty body ends: the upgraded stream
/// itself is not in flight for the layer. To cap open WebSocket sessions, take a permit in the
/// handler ([`ConcurrencyLimiter::try_acquire_owned`]) and move it into the task that serves
/// the upgraded stream.
///
/// When the cap is reached the request is, by default, rejected at once with 503 and
/// `Retry-After: 1`; with [`wait`](Self::wait) it waits in the limiter's queue up to a time
/// limit and is rejected after that. Cloning the layer shares the limiter, so one cap can
/// cover several routes.
///
/// The service is ready whenever the wrapped service has not failed: a request over the cap
/// is rejected at once even while the wrapped service is not ready (an inner `Buffer` full),
/// and an admitted request the wrapped service was not ready for waits for it holding its
/// permit (the order of tower's `ConcurrencyLimit`: the permit, then the inner service).
///
/// A gRPC request (`content-type: application/grpc...`) is rejected with a gRPC status instead
/// (trailers-only: HTTP 200, `grpc-status: 8` `RESOURCE_EXHAUSTED`, `retry-after`), which gRPC
/// clients report as such rather than as a transport error; [`grpc`](Self::grpc) turns that off.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::ConcurrencyLayer;
/// use turnstile::ConcurrencyLimiter;
///
/// let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(64)?)
///     .rejection_status(http::StatusCode::TOO_MANY_REQUESTS)
///     .wait(Duration::from_millis(200));
/// assert_eq!(layer.limiter().limit(), 64);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ConcurrencyLayer {
    limiter: ConcurrencyLimiter,
    status: StatusCode,
    retry_after: Duration,
    wait: Option<Duration>,
    grpc: bool,
    on_rejection: Option<OnRejection>,
}

type OnRejection = Arc<
    dyn Fn(&http::request::Parts, http::Response<Bytes>) -> http::Response<Bytes> + Send + Sync,
>;

impl fmt::Debug for ConcurrencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLayer")
            .field("limiter", &self.limiter)
            .field("status", &self.status)
            .field("retry_after", &self.retry_after)
            .field("wait", &self.wait)
            .field("grpc", &self.grpc)
            .field("on_rejection", &self.on_rejection.is_some())
            .finish()
    }
}

impl ConcurrencyLayer {
    /// A layer admitting as many requests at once as `limiter` has permits (one each).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?);
    /// # let _ = layer;
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn new(limiter: ConcurrencyLimiter) -> Self {
        ConcurrencyLayer {
            limiter,
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: Duration::from_secs(1),
            wait: None,
            grpc: true,
            on_rejection: None,
        }
    }

    /// Whether gRPC requests are rejected with a gRPC status (`true`, the default) or with the
    /// HTTP rejection like any other request.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?).grpc(false);
    /// # let _ = layer;
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn grpc(mut self, grpc: bool) -> Self {
        self.grpc = grpc;
        self
    }

    /// The status of a rejection (503 by default; 429 is the other usual choice). It must be an
    /// error status (4xx or 5xx): any other is no rejection (a 2xx says the request succeeded,
    /// a 3xx redirects it, a 101 tells the client and every proxy on the way that the connection
    /// switched protocols, and a 204 or 304 cannot carry the body), so it is logged as a warning
    /// and 503 is sent instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?)
    ///     .rejection_status(http::StatusCode::TOO_MANY_REQUESTS);
    /// # let _ = layer;
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn rejection_status(mut self, status: StatusCode) -> Self {
        if status.is_client_error() || status.is_server_error() {
            self.status = status;
        } else {
            // Infallible builder: refused here, once, rather than sent as a response that
            // breaks the connection (101) or the framing (204, 304) on every rejection.
            tracing::warn!(
                %status,
                "ConcurrencyLayer::rejection_status: not an error status; 503 is sent instead"
            );
            self.status = StatusCode::SERVICE_UNAVAILABLE;
        }
        self
    }

    /// The `Retry-After` of a rejection (1 s by default; sent in whole seconds rounded up, at
    /// most 15 digits, and at least 1, as every rejection's: "retry after 0" sends clients straight back into the
    /// full cap). A gRPC rejection's `grpc-retry-pushback-ms` is the setting in milliseconds,
    /// rounded up, and 1000 for zero, for the same reason.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?)
    ///     .retry_after(Duration::from_secs(5));
    /// # let _ = layer;
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Waits up to `timeout` in the limiter's queue for a permit instead of rejecting at once.
    ///
    /// A request that finds a permit free takes it at once, as without `wait`, and is served by
    /// the wrapped service as it was polled ready. A waiting request holds nothing of the
    /// wrapped service's: what its `poll_ready` reserved (a `Buffer` slot, say) is given back
    /// when the request starts to wait, and the service is made ready again once the permit is
    /// granted. The timeout bounds the wait for the permit only, and is set only for a request
    /// that finds no permit free. It runs on tokio's timer inside a tokio runtime, which then
    /// needs its time driver (`enable_time` or `enable_all`, which `#[tokio::main]` turns on:
    /// tokio panics on a timer without one), and on a helper thread on other executors. A
    /// `timeout` too long for an `Instant` never ends.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?)
    ///     .wait(Duration::from_millis(100));
    /// # let _ = layer;
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// Lets `f` answer the requests the cap rejects, as
    /// [`RateLimitLayer::on_rejection`](crate::http::RateLimitLayer::on_rejection) does for
    /// rate limits: it gets the request's parts and the response the layer would send (the
    /// status, `Retry-After` and a short text body, or the gRPC status of a gRPC request), and
    /// returns the response to send. Leave a gRPC request's answer (the one carrying
    /// `grpc-status`) as it is: a gRPC client reads that status, and a body or another
    /// `content-type` makes it report a protocol error instead of `RESOURCE_EXHAUSTED`.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?).on_rejection(
    ///     |_request, mut response| {
    ///         if response.headers().contains_key("grpc-status") {
    ///             return response;
    ///         }
    ///         *response.body_mut() = r#"{"error":"busy, retry shortly"}"#.into();
    ///         response.headers_mut().insert("content-type", "application/json".parse().unwrap());
    ///         response
    ///     },
    /// );
    /// # let _ = layer;
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::request::Parts, http::Response<Bytes>) -> http::Response<Bytes>
            + Send
            + Sync
            + 'static,
    {
        self.on_rejection = Some(Arc::new(f));
        self
    }

    /// The shared limiter (to read its state, or change its limit).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?);
    /// assert_eq!(layer.limiter().available(), 8);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn limiter(&self) -> &ConcurrencyLimiter {
        &self.limiter
    }

    /// The answer to `request`, rejected: the layer's response, or what `on_rejection` makes of
    /// it.
    fn rejection<B, ResBody>(
        &self,
        request: http::Request<B>,
        grpc: Option<&'static str>,
    ) -> http::Response<RateLimitBody<ResBody>> {
        let response = self.response(grpc);
        let response = match &self.on_rejection {
            Some(f) => f(&request.into_parts().0, response),
            None => response,
        };
        response.map(RateLimitBody::full)
    }

    fn response(&self, grpc: Option<&'static str>) -> http::Response<Bytes> {
        // At least 1, as the rate layer's (`Rejection::of`): a zero setting would invite a
        // retry at once, into the cap that just turned the request away.
        let secs = retry_seconds(self.retry_after);
        if let Some(content_type) = grpc {
            return crate::http::grpc::trailers_only(
                content_type,
                crate::http::grpc::CONCURRENCY_CODE,
                "concurrency limit reached",
                Some(self.retry_after),
            );
        }
        let mut response = http::Response::new(Bytes::from_static(
            self.status
                .canonical_reason()
                // A status without a reason phrase (499, say): what happened, in the gRPC
                // rejection's words, not "Unavailable", which a 4xx is not.
                .unwrap_or("concurrency limit reached")
                .as_bytes(),
        ));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

impl<S> tower::Layer<S> for ConcurrencyLayer {
    type Service = ConcurrencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyService {
            inner,
            inner_ready: false,
            layer: self.clone(),
        }
    }
}

/// The service of [`ConcurrencyLayer`].
///
/// # Examples
///
/// ```
/// use tower::Layer;
/// use turnstile::http::{ConcurrencyLayer, ConcurrencyService};
///
/// let inner = tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let layer = ConcurrencyLayer::new(turnstile::ConcurrencyLimiter::new(8)?);
/// let _service: ConcurrencyService<_> = layer.layer(inner);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct ConcurrencyService<S> {
    inner: S,
    /// Whether `inner` answered ready to the last `poll_ready`, which answers ready either way
    /// (as [`RateLimitLayer`](crate::http::RateLimitLayer)'s); the next `call` uses it up.
    inner_ready: bool,
    layer: ConcurrencyLayer,
}

impl<S: Clone> Clone for ConcurrencyService<S> {
    fn clone(&self) -> Self {
        ConcurrencyService {
            inner: self.inner.clone(),
            // A clone has not been polled ready, as a `Buffer`'s clone has no slot.
            inner_ready: false,
            layer: self.layer.clone(),
        }
    }
}

/// The response future of [`ConcurrencyService`].
///
/// # Cancel safety
///
/// Dropping it while it waits for a permit leaves the queue and holds nothing; dropping it
/// later gives the permit back.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use tower::{Layer, Service, ServiceExt};
/// use turnstile::http::{ConcurrencyFuture, ConcurrencyLayer, RateLimitBody};
/// use turnstile::ConcurrencyLimiter;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = ConcurrencyLimiter::new(1)?;
/// let mut service = ConcurrencyLayer::new(limiter.clone()).layer(tower::service_fn(
///     |_: http::Request<()>| async { Ok::<_, Infallible>(http::Response::new("ok")) },
/// ));
/// let future: ConcurrencyFuture<http::Response<RateLimitBody<&str>>, Infallible> =
///     service.ready().await?.call(http::Request::new(()));
/// // `call` takes a free permit (with `wait`, a request that finds none queues for it when its
/// // future is first polled); it is held until the response body is done.
/// let response = future.await?;
/// assert_eq!(response.status(), 200);
/// assert_eq!(limiter.available(), 0);
/// drop(response);
/// assert_eq!(limiter.available(), 1);
/// # Ok(())
/// # }
/// ```
pub type ConcurrencyFuture<Res, E> = Pin<Box<dyn Future<Output = Result<Res, E>> + Send>>;

impl<S, B, ResBody> tower::Service<http::Request<B>> for ConcurrencyService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ConcurrencyFuture<Self::Response, S::Error>;

    /// Ready unless the inner service failed: a request over the cap is rejected at once,
    /// whether the inner service is ready or not; an admitted request the inner service was
    /// not ready for waits for it, its permit held, in its response future.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => self.inner_ready = true,
            Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
            // `inner` goes on with its reservation, which the request takes over in `call`.
            Poll::Pending => self.inner_ready = false,
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let inner_ready = std::mem::replace(&mut self.inner_ready, false);
        // The service polled leaves with this call (its reservation, a `Buffer` slot or a
        // concurrency permit of the inner service's, or its place in the queue for one, is
        // this request's), and a clone takes its place.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let grpc = if layer.grpc {
            crate::http::grpc::grpc_content_type(request.headers())
        } else {
            None
        };
        let permit = match layer.wait {
            None => layer.limiter.try_acquire_owned(1).ok(),
            // With `wait` too, a permit free is taken now: a request that finds one never
            // waits, so it keeps what `poll_ready` reserved for it and is served by the service
            // polled ready (tower's rule), as without `wait`. Only one that has to queue gives
            // that back.
            Some(timeout) => match layer.limiter.acquire_owned_now(1) {
                // Granted, or failed at once (a closed limiter).
                Poll::Ready(outcome) => outcome.ok(),
                Poll::Pending => {
                    return queue(ready, self.inner.clone(), layer, timeout, request, grpc);
                }
            },
        };
        let Some(permit) = permit else {
            // `ready` is dropped here: a rejected request gives the reservation back at once.
            let response = layer.rejection(request, grpc);
            return Box::pin(async move { Ok(response) });
        };
        if inner_ready {
            let future = ready.call(request);
            return Box::pin(async move { Ok(with_permit(future.await?, permit)) });
        }
        // The permit, then the inner service: the order of tower's `ConcurrencyLimit`.
        Box::pin(async move {
            std::future::poll_fn(|cx| ready.poll_ready(cx)).await?;
            Ok(with_permit(ready.call(request).await?, permit))
        })
    }
}

/// The response future of a request that has to queue for a permit (see
/// [`ConcurrencyLayer::wait`]): it waits up to `timeout`, then readies `service` (a clone that
/// holds no reservation) and calls it, or answers the rejection.
fn queue<S, B, ResBody>(
    ready: S,
    mut service: S,
    layer: ConcurrencyLayer,
    timeout: Duration,
    request: http::Request<B>,
    grpc: Option<&'static str>,
) -> ConcurrencyFuture<http::Response<RateLimitBody<ResBody>>, S::Error>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResBody: Send + 'static,
{
    // A request waiting in the queue holds nothing of the inner service's: the reservation goes
    // back now, and an unreserved clone is made ready once the permit is ours (the order of
    // tower's `ConcurrencyLimit`: the permit, then the inner service). Holding it would let a
    // queue of waiters keep the slots of an inner `Buffer` while doing nothing, shutting out
    // the others that share it.
    drop(ready);
    Box::pin(async move {
        let acquire = layer.limiter.acquire_owned(1);
        // The crate's timer: none is set for a request whose permit comes at the first poll
        // (tokio's `timeout` looked the time driver up for every request, and a runtime
        // without one panicked even when no request had to wait).
        let permit = match crate::timer::timeout(timeout, acquire).await {
            Ok(Ok(permit)) => permit,
            // Timed out, or the limiter is closed.
            Ok(Err(_)) | Err(_) => {
                return Ok(layer.rejection(request, grpc));
            }
        };
        std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
        Ok(with_permit(service.call(request).await?, permit))
    })
}

fn with_permit<B>(
    response: http::Response<B>,
    permit: OwnedPermit,
) -> http::Response<RateLimitBody<B>> {
    response.map(|body| RateLimitBody::with_permit(body, permit))
}
