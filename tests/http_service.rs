//! The tower contracts of `RateLimitLayer` and `ConcurrencyLayer`: reservations of an inner
//! `Buffer` or `ConcurrencyLimit` across pending decisions and dropped futures, permits held
//! until a streamed body (and its trailers) ends, the `wait` timeout, and rejections framed right
//! for HEAD, HTTP/1.0 and `Connection: close`.

#![cfg(feature = "http")]

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::sync::oneshot;
use tower::{Layer, Service};
use turnstile::ConcurrencyLimiter;
use turnstile::http::{
    Check, ConcurrencyLayer, Outcome, Policy, QuotaState, Quotas, RateLimitLayer, RejectReason,
    RequestInfo, Verdict,
};

fn admitted(name: &'static str) -> Verdict {
    Verdict {
        outcome: Outcome::Admitted,
        quotas: QuotaState {
            policy: name.into(),
            limit: 10,
            window: Duration::from_secs(1),
            remaining: 5,
            reset_after: Duration::from_millis(500),
        }
        .into(),
    }
}

fn rejected() -> Verdict {
    Verdict {
        outcome: Outcome::Rejected {
            reason: RejectReason::RateLimited,
            rule: "r".into(),
            retry_after: Some(Duration::from_secs(1)),
        },
        quotas: Quotas::new(),
    }
}

/// Decides every request through `Check::Pending`, with a decision the test sends.
#[derive(Default, Clone)]
struct Remote {
    senders: Arc<Mutex<VecDeque<oneshot::Sender<Verdict>>>>,
}

impl Remote {
    fn decide(&self, verdict: Verdict) -> Result<(), Verdict> {
        let sender = self
            .senders
            .lock()
            .unwrap()
            .pop_front()
            .expect("a pending check");
        sender.send(verdict)
    }
}

impl Policy for Remote {
    fn check(&self, _: &RequestInfo<'_>) -> Check {
        let (tx, rx) = oneshot::channel();
        self.senders.lock().unwrap().push_back(tx);
        Check::Pending(Box::pin(
            async move { rx.await.unwrap_or_else(|_| rejected()) },
        ))
    }
}

// Only the raw HTTP/1 test, which needs axum's body type, decides with it.
#[cfg(feature = "axum")]
struct Fixed(fn() -> Verdict);

#[cfg(feature = "axum")]
impl Policy for Fixed {
    fn check(&self, _: &RequestInfo<'_>) -> Check {
        Check::Ready((self.0)())
    }
}

fn noop() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

fn ok_service() -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = Infallible,
    Future = std::future::Ready<Result<http::Response<String>, Infallible>>,
> + Clone {
    tower::service_fn(|_: http::Request<String>| {
        std::future::ready(Ok::<_, Infallible>(http::Response::new(String::from("ok"))))
    })
}

/// With `Buffer` inside, a request waiting for a pending decision (a remote backend, a rule's
/// queue) holds no slot: what its `poll_ready` reserved is given back at once, so that a wait
/// of seconds cannot starve admitted requests. Dropping its future (a client that disconnects)
/// drops the decision.
#[tokio::test]
async fn pending_decision_holds_no_buffer_slot_and_a_drop_drops_the_decision() {
    let remote = Remote::default();
    let buffer = tower::buffer::Buffer::new(ok_service(), 1);
    let mut service = RateLimitLayer::new(remote.clone()).layer(buffer.clone());
    let mut other = buffer;
    assert!(service.poll_ready(&mut noop()).is_ready());
    let mut future = Box::pin(service.call(http::Request::new(String::new())));
    assert!(future.as_mut().poll(&mut noop()).is_pending());
    assert!(
        other.poll_ready(&mut noop()).is_ready(),
        "the waiting request holds no slot"
    );
    drop(other);
    drop(future);
    assert!(
        remote.decide(admitted("a")).is_err(),
        "the decision future was dropped"
    );
}

/// A pending decision holds no `ConcurrencyLimit` permit while it waits; once admitted, the
/// request waits for a permit as any other, and is served when one frees; a rejection never
/// takes one.
#[tokio::test]
async fn pending_decision_takes_the_concurrency_limit_permit_only_once_admitted() {
    let remote = Remote::default();
    let limited = tower::limit::ConcurrencyLimit::new(ok_service(), 1);
    let mut service = RateLimitLayer::new(remote.clone()).layer(limited.clone());
    assert!(service.poll_ready(&mut noop()).is_ready());
    let mut future = Box::pin(service.call(http::Request::new(String::new())));
    assert!(future.as_mut().poll(&mut noop()).is_pending());
    // The permit is free while the decision is pending: another request takes it.
    let mut other = limited.clone();
    assert!(other.poll_ready(&mut noop()).is_ready());
    remote.decide(admitted("a")).unwrap();
    assert!(
        future.as_mut().poll(&mut noop()).is_pending(),
        "admitted, it waits for the permit the other request holds"
    );
    let served = other.call(http::Request::new(String::new())).await.unwrap();
    assert_eq!(served.status(), 200);
    let response = std::future::poll_fn(|cx| future.as_mut().poll(cx))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["ratelimit-policy"], "\"a\";q=10;w=1");

    // A rejection: the permit stays with whoever holds it, none is taken.
    assert!(service.poll_ready(&mut noop()).is_ready());
    let mut future = Box::pin(service.call(http::Request::new(String::new())));
    assert!(future.as_mut().poll(&mut noop()).is_pending());
    let mut holder = limited;
    assert!(holder.poll_ready(&mut noop()).is_ready());
    remote.decide(rejected()).unwrap();
    let response = std::future::poll_fn(|cx| future.as_mut().poll(cx))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
}

/// A service that answers "served" once it has taken a permit of `gate` (for good): a request
/// held inside until the test lets it go.
fn gated(
    gate: &Arc<tokio::sync::Semaphore>,
) -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    let gate = Arc::clone(gate);
    tower::service_fn(move |_: http::Request<String>| {
        let gate = Arc::clone(&gate);
        async move {
            gate.acquire().await.unwrap().forget();
            Ok::<_, Infallible>(http::Response::new(String::from("served")))
        }
    })
}

/// Decides the requests in turn with the verdicts it is given.
struct Turns(Mutex<VecDeque<Verdict>>);

impl Policy for Turns {
    fn check(&self, _: &RequestInfo<'_>) -> Check {
        Check::Ready(self.0.lock().unwrap().pop_front().expect("a verdict"))
    }
}

/// A rejection does not wait for the inner service to be ready: with a `ConcurrencyLimit` at
/// its cap inside, the layer is ready and the rejected request is answered at once, where it
/// waited (the layer's `poll_ready` was the inner one's) until the request holding the permit
/// was done, so that a flood of rejected requests queued behind the overloaded service instead
/// of being shed. An admitted request then waits for the permit in its response future, and
/// keeps its place: served once the permit frees, before a request polled ready after it.
#[tokio::test]
async fn a_rejection_does_not_wait_for_the_inner_service_to_be_ready() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let limited = tower::limit::ConcurrencyLimit::new(gated(&gate), 1);
    let turns = [admitted("a"), rejected(), admitted("a")];
    let mut service = RateLimitLayer::new(Turns(Mutex::new(turns.into()))).layer(limited.clone());
    assert!(service.poll_ready(&mut noop()).is_ready());
    let mut holding = Box::pin(service.call(http::Request::new(String::new())));
    assert!(
        holding.as_mut().poll(&mut noop()).is_pending(),
        "holds the permit"
    );

    assert!(
        service.poll_ready(&mut noop()).is_ready(),
        "ready for a decision while the inner service is at its cap"
    );
    let mut refused = Box::pin(service.call(http::Request::new(String::new())));
    match refused.as_mut().poll(&mut noop()) {
        Poll::Ready(Ok(response)) => assert_eq!(response.status(), 429),
        _ => panic!("the rejection waited for the inner service"),
    }

    // Admitted while the permit is held: waits for it, ahead of a later comer.
    assert!(service.poll_ready(&mut noop()).is_ready());
    let mut waiting = Box::pin(service.call(http::Request::new(String::new())));
    assert!(waiting.as_mut().poll(&mut noop()).is_pending());
    let mut later = limited;
    assert!(later.poll_ready(&mut noop()).is_pending());
    gate.add_permits(2);
    let served = std::future::poll_fn(|cx| holding.as_mut().poll(cx)).await;
    assert_eq!(served.unwrap().status(), 200);
    assert!(
        later.poll_ready(&mut noop()).is_pending(),
        "the freed permit went to the admitted request, which asked first"
    );
    let response = std::future::poll_fn(|cx| waiting.as_mut().poll(cx))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["ratelimit-policy"], "\"a\";q=10;w=1");
    assert!(later.poll_ready(&mut noop()).is_ready());
}

/// The same for the concurrency layer: over its cap, a request is rejected at once while the
/// inner service is not ready (it waited, its `poll_ready` being the inner one's); under the
/// cap, one the inner service is not ready for holds its permit and is served once the inner
/// service is ready.
#[tokio::test]
async fn a_concurrency_rejection_does_not_wait_for_the_inner_service_to_be_ready() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let limited = tower::limit::ConcurrencyLimit::new(gated(&gate), 1);
    let limiter = ConcurrencyLimiter::new(2).unwrap();
    let mut service = ConcurrencyLayer::new(limiter.clone()).layer(limited);
    assert!(service.poll_ready(&mut noop()).is_ready());
    let mut holding = service.call(http::Request::new(String::new()));
    assert!(
        holding.as_mut().poll(&mut noop()).is_pending(),
        "holds both permits"
    );

    // Under the cap: admitted, it waits for the inner permit with its own.
    assert!(
        service.poll_ready(&mut noop()).is_ready(),
        "ready while the inner service is at its cap"
    );
    let mut waiting = service.call(http::Request::new(String::new()));
    assert!(waiting.as_mut().poll(&mut noop()).is_pending());
    assert_eq!(limiter.available(), 0);

    // Over the cap: rejected at once.
    assert!(service.poll_ready(&mut noop()).is_ready());
    let mut refused = service.call(http::Request::new(String::new()));
    match refused.as_mut().poll(&mut noop()) {
        Poll::Ready(Ok(response)) => assert_eq!(response.status(), 503),
        _ => panic!("the rejection waited for the inner service"),
    }

    gate.add_permits(2);
    for future in [holding, waiting] {
        let response = future.await.unwrap();
        assert_eq!(response.status(), 200);
        drop(response);
    }
    assert_eq!(limiter.available(), 2);
}

/// A body with trailers (gRPC's): passed through `RateLimitBody`, which ends after them.
struct WithTrailers {
    frames: VecDeque<http_body::Frame<Bytes>>,
}

impl Body for WithTrailers {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.frames.pop_front().map(Ok))
    }
    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }
}

#[tokio::test]
async fn concurrency_body_passes_trailers_and_releases_at_the_end() {
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        Ok::<_, Infallible>(http::Response::new(WithTrailers {
            frames: VecDeque::from([
                http_body::Frame::data(Bytes::from_static(b"abc")),
                http_body::Frame::trailers(trailers),
            ]),
        }))
    }));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let response = service.call(http::Request::new(())).await.unwrap();
    assert_eq!(limiter.available(), 0);
    let mut body = response.into_body();
    assert_eq!(body.size_hint().exact(), None);
    let data = body.frame().await.unwrap().unwrap();
    assert_eq!(data.into_data().unwrap(), "abc");
    assert_eq!(limiter.available(), 0, "held while the body streams");
    let trailers = body.frame().await.unwrap().unwrap();
    assert_eq!(trailers.into_trailers().unwrap()["grpc-status"], "0");
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
    assert_eq!(
        limiter.available(),
        1,
        "released at the end, body still alive"
    );
    drop(body);
}

/// An empty request, a gRPC one (by its content type) if `grpc`.
fn empty_request(grpc: bool) -> http::Request<String> {
    let mut request = http::Request::new(String::new());
    if grpc {
        request
            .headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
    }
    request
}

/// `service` polled ready, then called with `request`: its response.
async fn ready_call<S>(service: &mut S, request: http::Request<String>) -> S::Response
where
    S: Service<http::Request<String>>,
    S::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    service.call(request).await.unwrap()
}

/// `wait`'s timeout: a request still queued then is rejected (gRPC status for gRPC), leaves the
/// queue, and takes no permit.
#[tokio::test(start_paused = true)]
async fn concurrency_wait_times_out_into_a_rejection() {
    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).wait(Duration::from_secs(2));
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(ok_service());
    let held = limiter.try_acquire_owned(1).unwrap();
    for grpc in [false, true] {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let request = empty_request(grpc);
        let started = tokio::time::Instant::now();
        let response = service.call(request).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        if grpc {
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["grpc-status"], "8");
            assert!(response.body().is_end_stream());
        } else {
            assert_eq!(response.status(), 503);
        }
        assert_eq!(limiter.stats().waiting, 0);
    }
    drop(held);
    assert_eq!(limiter.available(), 1);
}

/// `wait` sets a timer only for a request that must wait: on a runtime without its time driver
/// (or off tokio, under `futures::executor::block_on`) a request that finds a permit free is
/// served. tokio's `timeout`, used before, looked the time driver up for every request and
/// panicked ("A Tokio 1.x context was found, but timers are disabled"). Off tokio, a request
/// that must wait times out on the crate's helper-thread timer.
#[test]
fn concurrency_wait_sets_no_timer_for_a_request_that_finds_a_permit() {
    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).wait(Duration::from_millis(20));
    let limiter = layer.limiter().clone();
    let no_timers = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut service = layer.layer(ok_service());
    let response = no_timers.block_on(ready_call(&mut service, empty_request(false)));
    assert_eq!(response.status(), 200);
    drop(response);
    assert_eq!(limiter.available(), 1);
    // Off tokio: served at once, and a wait times out into the rejection.
    let response = futures_executor::block_on(ready_call(&mut service, empty_request(false)));
    assert_eq!(response.status(), 200);
    drop(response);
    let held = limiter.try_acquire_owned(1).unwrap();
    let response = futures_executor::block_on(ready_call(&mut service, empty_request(false)));
    assert_eq!(response.status(), 503);
    assert_eq!(limiter.stats().waiting, 0);
    drop(held);
    assert_eq!(limiter.available(), 1);
}

/// With `wait`, a request that finds a permit free is served by the service polled ready, as
/// without `wait`: it keeps the slot its `poll_ready` reserved in the inner service (tower's
/// rule). It gave the slot back in `call` and asked for it again, behind a caller that asked
/// for it later. Only a request that has to wait for a permit gives its reservation back.
#[tokio::test]
async fn concurrency_wait_keeps_the_inner_reservation_of_a_request_that_need_not_wait() {
    let inner = tower::limit::ConcurrencyLimit::new(ok_service(), 1);
    // Another caller of the inner service, which has one slot.
    let mut other = inner.clone();
    let mut service = concurrency_layer(2, Some(Duration::from_secs(10))).layer(inner);
    let mut cx = noop();
    // The layer's service is polled ready first: the slot is its.
    assert!(service.poll_ready(&mut cx).is_ready());
    // The other caller asks after it, and waits.
    assert!(other.poll_ready(&mut cx).is_pending());
    let mut future = service.call(http::Request::new(String::new()));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(response)) => assert_eq!(response.status(), 200),
        Poll::Ready(Err(error)) => match error {},
        Poll::Pending => panic!("a permit was free, and the request lost its slot"),
    }
    // The inner call done, the slot passes on.
    assert!(other.poll_ready(&mut cx).is_ready());
}

/// A waiter dropped after the permit was handed to it (its client gone) gives it back.
#[tokio::test(start_paused = true)]
async fn concurrency_waiter_dropped_after_the_grant_gives_the_permit_back() {
    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).wait(Duration::from_secs(2));
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(ok_service());
    let held = limiter.try_acquire_owned(1).unwrap();
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let mut future = service.call(http::Request::new(String::new()));
    assert!(future.as_mut().poll(&mut noop()).is_pending());
    drop(held);
    drop(future);
    assert_eq!(limiter.available(), 1);
    assert_eq!(limiter.stats().waiting, 0);
}

/// Raw HTTP/1 exchanges with a whole-router service: a rejected HEAD gets the GET's
/// Content-Length and no body; an HTTP/1.0 client gets a delimited rejection.
#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_http1_head_and_http10() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    let service = RateLimitLayer::new(Fixed(rejected)).layer(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            axum::ServiceExt::<axum::extract::Request>::into_make_service(service),
        )
        .await
        .unwrap();
    });
    let exchange = |request: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .expect("a content-length")
            .parse()
            .unwrap();
        (
            head.lines().next().unwrap().to_owned(),
            length,
            body.to_owned(),
        )
    };
    let (status, length, body) =
        exchange("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 429 Too Many Requests");
    assert_eq!(length, body.len());
    assert!(length > 0);
    let (status, head_length, head_body) =
        exchange("HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 429 Too Many Requests");
    assert_eq!(head_length, length, "HEAD: the GET's length");
    assert!(head_body.is_empty(), "HEAD: no body");
    let (status, length, body) = exchange("GET / HTTP/1.0\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.0 429 Too Many Requests");
    assert_eq!(length, body.len());
}

/// The concurrency layer's `Retry-After` is at least 1, as every rejection's is: a zero (or
/// sub-second, rounded up) setting must not tell clients to come back at once, into the same
/// full cap; gRPC's `retry-after` metadata and `grpc-retry-pushback-ms` likewise.
#[tokio::test]
async fn concurrency_retry_after_is_at_least_one_second() {
    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).retry_after(Duration::ZERO);
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(ok_service());
    let _held = limiter.try_acquire_owned(1).unwrap();
    for grpc in [false, true] {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let request = empty_request(grpc);
        let response = service.call(request).await.unwrap();
        assert_eq!(response.headers()["retry-after"], "1", "grpc: {grpc}");
        if grpc {
            // What a gRPC retry policy obeys says the same second, not "retry in 1 ms".
            assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1000");
        }
    }
}

/// A large data frame goes on in pieces of at most 64 KiB while the permit is held (so that the
/// server takes it as the client reads it): the same bytes in order, the size hint and the end
/// of the stream counting what is left of it, trailers after it, the permit back at the end.
#[tokio::test]
async fn concurrency_body_passes_a_large_frame_in_pieces() {
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let limiter = layer.limiter().clone();
    let payload = Bytes::from((0..200_000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let mut service = layer.layer(tower::service_fn({
        let payload = payload.clone();
        move |_: http::Request<()>| {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            let frames = VecDeque::from([
                http_body::Frame::data(payload.clone()),
                http_body::Frame::trailers(trailers),
            ]);
            async move { Ok::<_, Infallible>(http::Response::new(WithTrailers { frames })) }
        }
    }));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let mut body = service
        .call(http::Request::new(()))
        .await
        .unwrap()
        .into_body();
    let mut received = Vec::new();
    loop {
        let frame = body.frame().await.unwrap().unwrap();
        match frame.into_data() {
            Ok(data) => {
                assert!(data.len() <= 64 * 1024, "{}", data.len());
                received.extend_from_slice(&data);
                if received.len() < payload.len() {
                    assert!(!body.is_end_stream());
                    assert!(body.size_hint().lower() >= (payload.len() - received.len()) as u64);
                }
                assert_eq!(limiter.available(), 0);
            }
            Err(frame) => {
                assert_eq!(frame.into_trailers().unwrap()["grpc-status"], "0");
                break;
            }
        }
    }
    assert_eq!(received, payload);
    assert!(body.frame().await.is_none());
    assert_eq!(limiter.available(), 1);
}

/// A body of data frames and optional trailers that knows its exact length, as `Full` or a
/// `Vec` does (hyper writes that length as `Content-Length`).
struct ExactFrames {
    frames: VecDeque<http_body::Frame<Bytes>>,
}

impl Body for ExactFrames {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.frames.pop_front().map(Ok))
    }
    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        let data = self.frames.iter().filter_map(http_body::Frame::data_ref);
        http_body::SizeHint::with_exact(data.map(|d| d.len() as u64).sum())
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// A probe that found nothing, pinned: whatever the data frames (none, empty, small, several
    /// times 64 KiB) and trailers, the body holding a permit passes the same bytes in pieces of
    /// at most 64 KiB, its size hint stays exact (what is left, so a `Content-Length` taken at
    /// any point is right), it never says it ended before a frame, and the permit goes back
    /// exactly at its end.
    #[test]
    fn concurrency_body_pieces_keep_an_exact_size_and_every_byte(
        sizes in proptest::collection::vec(0usize..200_000, 0..5),
        trailers in proptest::bool::ANY,
    ) {
        let mut frames = VecDeque::new();
        let mut sent = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|j| (i * 7 + j) as u8).collect();
            sent.extend_from_slice(&data);
            frames.push_back(http_body::Frame::data(Bytes::from(data)));
        }
        if trailers {
            frames.push_back(http_body::Frame::trailers(http::HeaderMap::new()));
        }
        let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
        let limiter = layer.limiter().clone();
        let frames = Arc::new(Mutex::new(Some(frames)));
        let mut service = layer.layer(tower::service_fn(move |_: http::Request<()>| {
            let frames = frames.lock().unwrap().take().expect("one call");
            std::future::ready(Ok::<_, Infallible>(http::Response::new(ExactFrames { frames })))
        }));
        let mut cx = noop();
        proptest::prop_assert!(service.poll_ready(&mut cx).is_ready());
        let Poll::Ready(Ok(response)) = service.call(http::Request::new(())).as_mut().poll(&mut cx)
        else {
            panic!("an immediate response");
        };
        let mut body = std::pin::pin!(response.into_body());
        let mut received = Vec::new();
        loop {
            proptest::prop_assert_eq!(limiter.available(), 0, "held until the end");
            proptest::prop_assert_eq!(
                body.size_hint().exact(),
                Some((sent.len() - received.len()) as u64)
            );
            let ended = body.is_end_stream();
            let Poll::Ready(frame) = body.as_mut().poll_frame(&mut cx) else {
                panic!("the frames are all there");
            };
            let Some(frame) = frame else { break };
            proptest::prop_assert!(!ended, "a frame after the end");
            if let Some(data) = frame.unwrap().data_ref() {
                proptest::prop_assert!(data.len() <= 64 * 1024, "{}", data.len());
                received.extend_from_slice(data);
            }
        }
        proptest::prop_assert_eq!(received, sent);
        proptest::prop_assert_eq!(limiter.available(), 1);
    }
}

/// The concurrency layer's rejection status is an error status: a 101 would tell the client
/// (and every proxy on the way) that the connection now speaks another protocol, a 204 went out
/// with a `content-length` that a 204 must not have, and a 2xx or 3xx is no rejection at all.
/// Any other status is replaced by the default 503.
#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_rejection_status_is_an_error_status() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for (status, sent) in [
        (
            http::StatusCode::SWITCHING_PROTOCOLS,
            "503 Service Unavailable",
        ),
        (http::StatusCode::NO_CONTENT, "503 Service Unavailable"),
        (http::StatusCode::OK, "503 Service Unavailable"),
        (http::StatusCode::NOT_MODIFIED, "503 Service Unavailable"),
        (http::StatusCode::TOO_MANY_REQUESTS, "429 Too Many Requests"),
        (http::StatusCode::from_u16(499).unwrap(), "499 <none>"),
    ] {
        let layer =
            ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).rejection_status(status);
        let _held = layer.limiter().try_acquire_owned(1).unwrap();
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "hello" }))
            .route_layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        let status_line = out.lines().next().unwrap();
        assert_eq!(status_line, format!("HTTP/1.1 {sent}"), "{status}");
        assert!(out.contains("retry-after: 1"), "{status}: {out}");
        // The body is the status's reason phrase, or says what happened when it has none.
        let sent_status = http::StatusCode::from_bytes(&sent.as_bytes()[..3]).unwrap();
        let body = sent_status
            .canonical_reason()
            .unwrap_or("concurrency limit reached");
        assert!(out.ends_with(&format!("\r\n\r\n{body}")), "{status}: {out}");
        server.abort();
    }
}

/// A service whose readiness and calls the test scripts: `poll_ready` fails once `fail_ready`
/// is set, and its response future fails when `fail_call` is.
#[derive(Clone, Default)]
struct Scripted {
    fail_ready: Arc<std::sync::atomic::AtomicBool>,
    fail_call: Arc<std::sync::atomic::AtomicBool>,
}

impl Service<http::Request<String>> for Scripted {
    type Response = http::Response<String>;
    type Error = &'static str;
    type Future = std::future::Ready<Result<http::Response<String>, &'static str>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        use std::sync::atomic::Ordering::SeqCst;
        Poll::Ready(match self.fail_ready.load(SeqCst) {
            true => Err("not ready"),
            false => Ok(()),
        })
    }

    fn call(&mut self, _: http::Request<String>) -> Self::Future {
        use std::sync::atomic::Ordering::SeqCst;
        std::future::ready(match self.fail_call.load(SeqCst) {
            true => Err("failed"),
            false => Ok(http::Response::new(String::from("ok"))),
        })
    }
}

/// Probes of the concurrency layer's permit that found nothing, pinned: a response future
/// dropped before it is polled, an inner call that fails, an inner `poll_ready` that fails after
/// a waiter got its permit, a limiter closed meanwhile, and two services of one layer sharing
/// the cap. The permit always goes back, and nothing is left queued.
#[tokio::test(start_paused = true)]
async fn concurrency_permit_goes_back_on_every_early_end() {
    use std::sync::atomic::Ordering::SeqCst;
    for wait in [None, Some(Duration::from_secs(1))] {
        let layer = concurrency_layer(1, wait);
        let limiter = layer.limiter().clone();
        let inner = Scripted::default();
        let mut service = layer.layer(inner.clone());
        let mut twin = layer.layer(inner.clone());

        // Dropped before its first poll.
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        drop(service.call(http::Request::new(String::new())));
        assert_eq!(limiter.available(), 1, "wait {wait:?}: dropped unpolled");

        // The inner call fails: the error passes, the permit goes back.
        inner.fail_call.store(true, SeqCst);
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let failed = service.call(http::Request::new(String::new())).await;
        assert_eq!(failed.unwrap_err(), "failed");
        assert_eq!(limiter.available(), 1, "wait {wait:?}: failed call");
        inner.fail_call.store(false, SeqCst);

        // One layer, two services: one cap. The twin's request is refused (at once, or after
        // the wait) while the first response's body holds the permit.
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let held = service
            .call(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(limiter.available(), 0);
        std::future::poll_fn(|cx| twin.poll_ready(cx))
            .await
            .unwrap();
        let refused = twin.call(http::Request::new(String::new())).await.unwrap();
        assert_eq!(refused.status(), 503, "wait {wait:?}: shared cap");
        assert_eq!(refused.headers()["retry-after"], "1");
        assert_eq!(limiter.stats().waiting, 0);
        drop(held);
        assert_eq!(limiter.available(), 1);

        if wait.is_some() {
            // A waiter gets the permit, and then the inner service fails to become ready: the
            // error passes and the permit goes back.
            let held = limiter.try_acquire_owned(1).unwrap();
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .unwrap();
            let mut future = service.call(http::Request::new(String::new()));
            assert!(future.as_mut().poll(&mut noop()).is_pending());
            inner.fail_ready.store(true, SeqCst);
            drop(held);
            assert_eq!(future.await.unwrap_err(), "not ready");
            assert_eq!(limiter.available(), 1, "failed readiness after the grant");
            inner.fail_ready.store(false, SeqCst);
        }

        // A closed limiter refuses every request with the layer's rejection (a waiter queued
        // when it closes as well), and panics nowhere.
        let held = limiter.try_acquire_owned(1).unwrap();
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let mut queued = service.call(http::Request::new(String::new()));
        let first = queued.as_mut().poll(&mut noop());
        assert_eq!(first.is_pending(), wait.is_some());
        limiter.close();
        let status = match first {
            Poll::Ready(response) => response.unwrap().status(),
            Poll::Pending => queued.await.unwrap().status(),
        };
        assert_eq!(status, 503, "wait {wait:?}: closed");
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let after = service
            .call(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(after.status(), 503);
        drop(held);
    }
}

/// Probes of the rejection's headers that found nothing, pinned: the longest `retry_after`
/// is written (whole seconds, rounded up, at most 15 digits) without a panic, and gRPC's pushback stays within
/// the 32 bits clients parse; `wait(Duration::MAX)` waits as long as it takes, and
/// `wait(Duration::ZERO)` admits a request that finds a permit free and rejects at once
/// otherwise.
#[tokio::test(start_paused = true)]
async fn concurrency_extreme_retry_after_and_wait() {
    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).retry_after(Duration::MAX);
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(ok_service());
    let held = limiter.try_acquire_owned(1).unwrap();
    for grpc in [false, true] {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let response = service.call(empty_request(grpc)).await.unwrap();
        // At most sf-integer's 15 digits, as the `RateLimit` field's `t`: `u64::MAX` would
        // not parse as the signed 64-bit integer many clients read `Retry-After` into.
        assert_eq!(
            response.headers()["retry-after"],
            "999999999999999",
            "grpc: {grpc}"
        );
        if grpc {
            assert_eq!(response.headers()["grpc-retry-pushback-ms"], "2147483647");
        }
    }
    drop(held);

    for (timeout, waited) in [(Duration::MAX, true), (Duration::ZERO, false)] {
        let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).wait(timeout);
        let limiter = layer.limiter().clone();
        let mut service = layer.layer(ok_service());
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let free = service.call(empty_request(false)).await.unwrap();
        assert_eq!(free.status(), 200, "{timeout:?}: a free permit");
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let mut second = service.call(empty_request(false));
        let polled = second.as_mut().poll(&mut noop());
        if waited {
            assert!(polled.is_pending());
            tokio::time::advance(Duration::from_secs(86_400 * 365)).await;
            assert!(
                second.as_mut().poll(&mut noop()).is_pending(),
                "still waiting"
            );
            drop(free);
            assert_eq!(second.await.unwrap().status(), 200);
        } else {
            match polled {
                Poll::Ready(Ok(response)) => assert_eq!(response.status(), 503),
                other => panic!("a zero wait answers at once: {:?}", other.is_ready()),
            }
            drop(free);
        }
        assert_eq!(limiter.available(), 1);
    }
}

/// Admits every request with one quota, `"layer";r=5;t=1` (10 per second).
struct AdmitWithQuota;

impl Policy for AdmitWithQuota {
    fn check(&self, _: &RequestInfo<'_>) -> Check {
        Check::Ready(admitted("layer"))
    }
}

/// A body that fails on its first frame.
struct Failing;

impl Body for Failing {
    type Data = Bytes;
    type Error = &'static str;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, &'static str>>> {
        Poll::Ready(Some(Err("the handler's body failed")))
    }
}

/// Probes of the headers on admitted responses that found nothing, pinned. Every response the
/// inner service gives gets the quota headers, whatever its status (204 and 304, which carry
/// no body, keep none; HEAD's is the server's to drop), and its body is passed on untouched,
/// errors included. A handler's own `RateLimit` and `RateLimit-Policy` lines stay, ours appended
/// after them (one structured-field list, as two layers give); its `X-RateLimit-*` trio is
/// replaced only by a more restrictive quota, or when its remaining is no number.
#[tokio::test]
async fn admitted_responses_get_the_quota_headers_beside_the_handlers_own() {
    use http::StatusCode;
    use turnstile::http::{LayerSettings, RateLimitBody};
    let layer = RateLimitLayer::new(AdmitWithQuota);
    let mut settings = LayerSettings::clone(&layer.settings().load());
    settings.response.legacy_headers = true;
    layer.settings().store(Arc::new(settings));
    let mut service = layer.layer(tower::service_fn(|request: http::Request<String>| {
        let mut response = http::Response::new(RateLimitBody::new(
            http_body_util::Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed(),
        ));
        let headers = response.headers_mut();
        match request.uri().path() {
            "/204" => *response.status_mut() = StatusCode::NO_CONTENT,
            "/304" => *response.status_mut() = StatusCode::NOT_MODIFIED,
            "/own" | "/own-tight" | "/own-garbled" => {
                headers.insert("ratelimit", r#""app";r=1;t=9"#.parse().unwrap());
                headers.insert("ratelimit-policy", r#""app";q=2;w=9"#.parse().unwrap());
                headers.insert("x-ratelimit-limit", "2".parse().unwrap());
                headers.insert("x-ratelimit-reset", "9".parse().unwrap());
                let remaining = match request.uri().path() {
                    "/own" => "99",
                    "/own-tight" => "1",
                    _ => "many",
                };
                headers.insert("x-ratelimit-remaining", remaining.parse().unwrap());
            }
            "/failing" => *response.body_mut() = RateLimitBody::new(Failing.boxed()),
            _ => {}
        }
        std::future::ready(Ok::<_, Infallible>(response))
    }));
    let mut call = async |method: http::Method, path: &str| {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .body(String::new())
            .unwrap();
        service.call(request).await.unwrap()
    };
    let lines = |response: &http::Response<_>, name: &str| -> Vec<String> {
        response
            .headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let ours = [r#""layer";r=5;t=1"#];
    for (method, path, status) in [
        (http::Method::GET, "/204", 204),
        (http::Method::GET, "/304", 304),
        (http::Method::HEAD, "/", 200),
    ] {
        let response = call(method, path).await;
        assert_eq!(response.status(), status, "{path}");
        assert_eq!(lines(&response, "ratelimit"), ours, "{path}");
        assert_eq!(
            lines(&response, "ratelimit-policy"),
            [r#""layer";q=10;w=1"#],
            "{path}"
        );
        assert_eq!(lines(&response, "x-ratelimit-remaining"), ["5"], "{path}");
        assert!(
            response.into_body().is_end_stream(),
            "{path}: no body added"
        );
    }

    for (path, trio) in [
        ("/own", ["10", "5", "1"]),
        ("/own-garbled", ["10", "5", "1"]),
        ("/own-tight", ["2", "1", "9"]),
    ] {
        let response = call(http::Method::GET, path).await;
        assert_eq!(
            lines(&response, "ratelimit"),
            [r#""app";r=1;t=9"#, ours[0]],
            "{path}"
        );
        assert_eq!(
            lines(&response, "ratelimit-policy"),
            [r#""app";q=2;w=9"#, r#""layer";q=10;w=1"#],
            "{path}"
        );
        let got: Vec<_> = ["limit", "remaining", "reset"]
            .iter()
            .map(|name| lines(&response, &format!("x-ratelimit-{name}")))
            .collect();
        assert_eq!(got, trio.map(|value| vec![value.to_owned()]), "{path}");
    }

    let response = call(http::Method::GET, "/failing").await;
    assert_eq!(lines(&response, "ratelimit"), ours);
    let error = response.into_body().collect().await.unwrap_err();
    assert_eq!(error, "the handler's body failed");
}

/// The requests in flight as the handler and its body see them: counted from the handler's
/// start until its body ends (or is dropped), the span the concurrency permit must cover.
#[derive(Clone, Default)]
struct InFlight {
    now: Arc<std::sync::atomic::AtomicUsize>,
    max: Arc<std::sync::atomic::AtomicUsize>,
}

impl InFlight {
    /// One more in flight, until the guard is dropped.
    fn enter(&self) -> InFlightGuard {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(now, SeqCst);
        InFlightGuard(self.clone())
    }
}

struct InFlightGuard(InFlight);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A body of `left` one-byte frames, each after a pending poll, that leaves the count of
/// requests in flight at its end (or when dropped before it).
struct Streamed {
    guard: Option<InFlightGuard>,
    left: u32,
    pending: bool,
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            self.guard = None;
            return Poll::Ready(None);
        }
        self.pending = !self.pending;
        if self.pending {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"x")))))
    }
}

/// A handler counted in `flight`: it yields once, then answers with a [`Streamed`] body.
fn counted(
    flight: InFlight,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<Streamed>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<Streamed>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: http::Request<()>| {
        let flight = flight.clone();
        async move {
            let guard = flight.enter();
            tokio::task::yield_now().await;
            Ok(http::Response::new(Streamed {
                guard: Some(guard),
                left: 3,
                pending: false,
            }))
        }
    })
}

/// A concurrency layer of `limit` permits that waits up to `wait` for one, or rejects at once.
fn concurrency_layer(limit: u32, wait: Option<Duration>) -> ConcurrencyLayer {
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(limit).unwrap());
    match wait {
        Some(timeout) => layer.wait(timeout),
        None => layer,
    }
}

/// A probe that found nothing, pinned: hundreds of requests at once through one layer on a
/// multi-thread runtime never have more handlers and bodies in flight than the cap, whether
/// the extra ones are rejected or wait (when every one is served); every permit comes back and
/// nobody is left queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_cap_holds_for_many_requests_on_many_threads() {
    use std::sync::atomic::Ordering::SeqCst;
    for wait in [None, Some(Duration::from_secs(600))] {
        let layer = concurrency_layer(3, wait);
        let limiter = layer.limiter().clone();
        let flight = InFlight::default();
        let service = layer.layer(counted(flight.clone()));
        let tasks: Vec<_> = (0..300)
            .map(|_| {
                let mut service = service.clone();
                tokio::spawn(async move {
                    std::future::poll_fn(|cx| service.poll_ready(cx))
                        .await
                        .unwrap();
                    let response = service.call(http::Request::new(())).await.unwrap();
                    let status = response.status();
                    response.into_body().collect().await.unwrap();
                    status
                })
            })
            .collect();
        let mut served = 0;
        for task in tasks {
            if task.await.unwrap() == 200 {
                served += 1;
            }
        }
        assert!(
            flight.max.load(SeqCst) <= 3,
            "wait {wait:?}: {flight_max}",
            flight_max = flight.max.load(SeqCst)
        );
        assert!(served >= 3, "wait {wait:?}: {served}");
        if wait.is_some() {
            assert_eq!(served, 300);
        }
        assert_eq!(limiter.available(), 3, "wait {wait:?}");
        assert_eq!(limiter.stats().waiting, 0, "wait {wait:?}");
    }
}

/// A probe that found nothing, pinned: waiters that time out, callers that give up at every
/// stage (queued, granted, in the handler, mid-body) and limit changes meanwhile, on a
/// multi-thread runtime, leave every permit back and nobody queued, and never more in flight
/// than the highest limit set. Real time, in microseconds: only invariants are asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_permits_come_back_when_callers_give_up_at_any_stage() {
    use std::sync::atomic::Ordering::SeqCst;
    for round in 0..10u64 {
        let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(2).unwrap())
            .wait(Duration::from_micros(500 + round * 100));
        let limiter = layer.limiter().clone();
        let flight = InFlight::default();
        let service = layer.layer(counted(flight.clone()));
        let changer = tokio::spawn({
            let limiter = limiter.clone();
            async move {
                for i in 0..50u32 {
                    limiter.set_limit(1 + i % 4).unwrap();
                    tokio::task::yield_now().await;
                }
                limiter.set_limit(2).unwrap();
            }
        });
        let tasks: Vec<_> = (0..200u64)
            .map(|i| {
                let mut service = service.clone();
                tokio::spawn(async move {
                    std::future::poll_fn(|cx| service.poll_ready(cx))
                        .await
                        .unwrap();
                    let call = async {
                        let response = service.call(http::Request::new(())).await.unwrap();
                        response.into_body().collect().await.unwrap();
                    };
                    let _ = tokio::time::timeout(Duration::from_micros(50 * (i % 20)), call).await;
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        changer.await.unwrap();
        assert!(
            flight.max.load(SeqCst) <= 4,
            "round {round}: {}",
            flight.max.load(SeqCst)
        );
        assert_eq!(flight.now.load(SeqCst), 0, "round {round}");
        assert_eq!(limiter.available(), 2, "round {round}");
        assert_eq!(limiter.stats().waiting, 0, "round {round}");
    }
}

/// A probe that found nothing, pinned: an inner future that panics (a handler's bug) gives the
/// permit back as its task unwinds, waiting or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_permit_goes_back_when_the_handler_panics() {
    for wait in [None, Some(Duration::from_secs(1))] {
        let layer = concurrency_layer(1, wait);
        let limiter = layer.limiter().clone();
        let mut service = layer.layer(tower::service_fn(|request: http::Request<()>| async move {
            tokio::task::yield_now().await;
            assert!(request.uri().path() != "/", "the handler panics");
            Ok::<_, Infallible>(http::Response::new(String::new()))
        }));
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let future = service.call(http::Request::new(()));
        assert!(tokio::spawn(future).await.unwrap_err().is_panic());
        assert_eq!(limiter.available(), 1, "wait {wait:?}");
    }
}
