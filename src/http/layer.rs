//! [`RateLimitLayer`] and [`RateLimitService`]: extract a [`RequestInfo`], ask the [`Policy`],
//! and either call the inner service (adding the quota headers to its response) or answer with
//! the rejection.

use crate::http::grpc;
use crate::http::response::QuotaHeaders;
use crate::http::{
    Check, LayerSettings, Policy, Quotas, RejectionBody, RequestInfo, ResponseConfig, Verdict,
    client_ip,
};
use arc_swap::ArcSwap;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The peer's address, as a request extension. The layer reads it (or a bare
/// [`SocketAddr`] extension, with the `axum` feature axum's `ConnectInfo<SocketAddr>`, with the
/// `tonic` feature tonic's `TcpConnectInfo`) to know who is connected. Insert it yourself when
/// serving with hyper.
///
/// # Examples
///
/// ```
/// use turnstile::http::PeerAddr;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(PeerAddr("192.0.2.1:4000".parse().unwrap()));
/// assert!(request.extensions().get::<PeerAddr>().is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

type ClientIdFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

type OnRejection = Arc<
    dyn Fn(
            &http::request::Parts,
            &Verdict,
            http::Response<bytes::Bytes>,
        ) -> http::Response<bytes::Bytes>
        + Send
        + Sync,
>;

/// The settings a decision that came later is answered with (see [`Decision::Pending`]).
pub trait HasSettings: Send + Sync {
    fn layer_settings(&self) -> &LayerSettings;
}

impl HasSettings for LayerSettings {
    fn layer_settings(&self) -> &LayerSettings {
        self
    }
}

/// The settings of a decision that came later: those of the snapshot it was made under.
pub(crate) type Answered = Arc<dyn HasSettings>;

/// What [`Sealed::decide`] answers: [`Check`], with the settings a later decision is answered
/// with.
pub enum Decision {
    /// Decided at once, under the snapshot the layer loaded.
    Ready(Verdict),
    /// Decided later, under the snapshot that comes with the verdict.
    Pending(Pin<Box<dyn Future<Output = (Verdict, Answered)> + Send + 'static>>),
}

/// How the layer reads what a request is decided and answered under, and asks for the
/// decision: the [`LayerPolicy`] it is generic over, with nothing callable from outside the
/// crate. `pub` only to be named as [`LayerPolicy`]'s supertrait; not reachable from outside.
pub trait Sealed: Send + Sync + 'static {
    /// What the layer keeps besides the policy: the settings of a [`Policy`]; nothing for an
    /// [`HttpLimiter`](crate::http::HttpLimiter), whose settings are in its snapshot.
    type Source: Clone + Send + Sync + 'static;
    /// What one request is decided and answered under, loaded once per request (a guard:
    /// nothing to count on the common path).
    type Loaded;
    fn load(&self, source: &Self::Source) -> Self::Loaded;
    fn settings(loaded: &Self::Loaded) -> &LayerSettings;
    /// Decides `request` (described with `loaded`'s settings) under `loaded`.
    fn decide(
        &self,
        loaded: &Self::Loaded,
        source: &Self::Source,
        request: &RequestInfo<'_>,
    ) -> Decision;
}

/// What a [`RateLimitLayer`] decides with: any [`Policy`], whose [`LayerSettings`] the layer
/// keeps ([`RateLimitLayer::with_settings`]), or an [`HttpLimiter`](crate::http::HttpLimiter),
/// whose rules and settings are one snapshot: each request reads it once and is decided and
/// answered under it whole, and a reload swaps it in one store. Sealed: implement [`Policy`]
/// for decisions of your own.
///
/// # Examples
///
/// ```
/// use turnstile::http::{Check, LayerPolicy, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
///
/// struct AdmitAll;
/// impl Policy for AdmitAll {
///     fn check(&self, _: &RequestInfo<'_>) -> Check {
///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
///     }
/// }
/// fn layer_of<P: LayerPolicy>(layer: RateLimitLayer<P>) -> RateLimitLayer<P> {
///     layer
/// }
/// let _layer = layer_of(RateLimitLayer::new(AdmitAll));
/// ```
pub trait LayerPolicy: Sealed {}

impl<P: Policy> Sealed for P {
    type Source = Arc<ArcSwap<LayerSettings>>;
    type Loaded = arc_swap::Guard<Arc<LayerSettings>>;

    fn load(&self, source: &Self::Source) -> Self::Loaded {
        source.load()
    }

    fn settings(loaded: &Self::Loaded) -> &LayerSettings {
        loaded
    }

    fn decide(
        &self,
        _: &Self::Loaded,
        source: &Self::Source,
        request: &RequestInfo<'_>,
    ) -> Decision {
        match self.check(request) {
            Check::Ready(verdict) => Decision::Ready(verdict),
            // The policy decides under nothing of the layer's: its verdict is answered with
            // the settings in force when it comes.
            Check::Pending(pending) => {
                let source = Arc::clone(source);
                Decision::Pending(Box::pin(async move {
                    let verdict = pending.await;
                    (verdict, source.load_full() as Answered)
                }))
            }
        }
    }
}

impl<P: Policy> LayerPolicy for P {}

/// A tower [`Layer`](tower::Layer) that decides every request with a [`Policy`] or an
/// [`HttpLimiter`](crate::http::HttpLimiter) (see [`LayerPolicy`]): admitted requests go on
/// (their responses get the `RateLimit` headers), rejected ones get the configured rejection
/// (429 with `Retry-After` by default). Cloning shares the policy and the settings.
///
/// The settings are read on every request, so a reload that swaps them takes effect at once.
/// With an [`HttpLimiter`](crate::http::HttpLimiter) they are read with its rules, in one
/// snapshot: a request is decided, its client found and its response written under one
/// configuration, never the rules of a reload and the settings of the one before. A request
/// whose decision comes later (see [`Check::Pending`] below) is answered with the settings of
/// the snapshot its verdict was made under (a request waiting for its rule's queue is decided
/// again under the snapshot in force when it wakes; the client found at its arrival); with a
/// [`Policy`] of your own, with the layer's settings in force when the verdict comes.
///
/// The peer address comes from the request's extensions: [`PeerAddr`], a [`SocketAddr`],
/// (feature `axum`) axum's `ConnectInfo<SocketAddr>` — serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()` — or (feature `tonic`) tonic's
/// `TcpConnectInfo`, which tonic's server inserts by itself. With plain hyper (or tonic over
/// TLS), insert a [`PeerAddr`] in a layer outside this one. Without a peer address the client IP
/// is `None` and the policy decides what that means.
///
/// Responses keep the inner service's body type: an admitted response passes through as it is
/// (no wrapper that axum or tonic would box again), and a rejection is written in that type,
/// which therefore implements [`RejectionBody`] — (feature `axum`) axum's and (feature `tonic`)
/// tonic's bodies, `http_body_util`'s `Full`, `BoxBody` and `UnsyncBoxBody`, `String`, and
/// [`RateLimitBody`](crate::http::RateLimitBody) of anything (map another body type into it).
///
/// **Readiness.** The service is ready whenever the inner service has not failed: a request
/// is decided whether the inner service is ready or not, so that rejections are answered at
/// once when it is not (an inner `Buffer` full, a `ConcurrencyLimit` at its cap), which is
/// when shedding load matters. The inner service polled ready serves an admitted request, as
/// tower asks; one it was not ready for is taken over by the response future, which polls it
/// until it is ready and then calls it (so the request keeps the place its readiness had,
/// in a semaphore's queue say), a clone taking its place in the service. A request rejected at
/// once releases what the inner service reserved (it is dropped, a clone takes its place), so
/// rejected requests never hold an inner `Buffer` slot or concurrency permit. When the policy
/// answers [`Check::Pending`] (a remote backend, a request waiting for its rule's queue), the
/// reservation is given back the same way and the response future takes a clone, polled
/// ready only once the decision admits: a waiting request holds nothing of the inner
/// service's. An admitted request is thus counted by its rules before it waits for the inner
/// service (as it is before its handler runs); dropped while it waits, it stays counted.
/// Errors of the inner service pass through unchanged.
///
/// With tonic, enable the `tonic` feature and put the layer on the server:
/// `Server::builder().layer(limiter.layer())`. A
/// rejection of a gRPC request (`content-type: application/grpc...`, from tonic or any other
/// gRPC client) is a gRPC status rather than an HTTP 429, which gRPC clients would report as a
/// transport error: `RESOURCE_EXHAUSTED` for a rate limit, with `retry-after` and the
/// `RateLimit` headers as metadata (see
/// [`grpc_rejection_response`](crate::http::grpc_rejection_response) for the other reasons, and
/// [`ResponseConfig::grpc`](crate::http::ResponseConfig::grpc) to turn it off).
///
/// # Examples
///
/// ```
/// use tower::Layer;
/// use turnstile::http::{Check, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
///
/// struct AdmitAll;
/// impl Policy for AdmitAll {
///     fn check(&self, _: &RequestInfo<'_>) -> Check {
///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
///     }
/// }
/// let layer = RateLimitLayer::new(AdmitAll);
/// let _service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// }));
/// ```
pub struct RateLimitLayer<P: LayerPolicy> {
    // One `Arc` for everything the layer shares: axum clones the service for every request, and
    // each reference count touched then is a cache line both cores write.
    shared: Arc<Shared<P>>,
}

struct Shared<P: LayerPolicy> {
    policy: Arc<P>,
    /// The settings of a [`Policy`]; nothing for an `HttpLimiter` (its snapshot has them).
    source: P::Source,
    client_id_fn: Option<ClientIdFn>,
    on_rejection: Option<OnRejection>,
}

impl<P: LayerPolicy> Clone for RateLimitLayer<P> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<P: LayerPolicy> fmt::Debug for RateLimitLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let loaded = self.shared.policy.load(&self.shared.source);
        f.debug_struct("RateLimitLayer")
            .field("settings", P::settings(&loaded))
            .field("client_id_fn", &self.shared.client_id_fn.is_some())
            .field("on_rejection", &self.shared.on_rejection.is_some())
            .finish_non_exhaustive()
    }
}

impl<P: Policy> RateLimitLayer<P> {
    /// A layer deciding with `policy`, with default [`LayerSettings`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::{Check, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
    ///
    /// struct AdmitAll;
    /// impl Policy for AdmitAll {
    ///     fn check(&self, _: &RequestInfo<'_>) -> Check {
    ///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
    ///     }
    /// }
    /// let layer = RateLimitLayer::new(AdmitAll);
    /// assert_eq!(layer.settings().load().response.status, 429);
    /// ```
    pub fn new(policy: P) -> Self {
        Self::with_settings(
            Arc::new(policy),
            Arc::new(ArcSwap::from_pointee(LayerSettings::default())),
        )
    }

    /// A layer deciding with `policy`, reading its settings from `settings` on every request
    /// (so that a reload that swaps them takes effect at once).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use arc_swap::ArcSwap;
    /// use turnstile::http::{Check, LayerSettings, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
    ///
    /// struct AdmitAll;
    /// impl Policy for AdmitAll {
    ///     fn check(&self, _: &RequestInfo<'_>) -> Check {
    ///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
    ///     }
    /// }
    /// let settings = Arc::new(ArcSwap::from_pointee(LayerSettings::default()));
    /// let layer = RateLimitLayer::with_settings(Arc::new(AdmitAll), settings.clone());
    /// settings.store(Arc::new(LayerSettings::default())); // seen by the next request
    /// # let _ = layer;
    /// ```
    pub fn with_settings(policy: Arc<P>, settings: Arc<ArcSwap<LayerSettings>>) -> Self {
        Self::of(policy, settings)
    }

    /// The settings the layer reads on every request; store new ones to change them.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use turnstile::http::{Check, LayerSettings, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
    ///
    /// struct AdmitAll;
    /// impl Policy for AdmitAll {
    ///     fn check(&self, _: &RequestInfo<'_>) -> Check {
    ///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
    ///     }
    /// }
    /// let layer = RateLimitLayer::new(AdmitAll);
    /// let mut settings = LayerSettings::clone(&layer.settings().load());
    /// settings.response.legacy_headers = true;
    /// layer.settings().store(Arc::new(settings));
    /// assert!(layer.settings().load().response.legacy_headers);
    /// ```
    pub fn settings(&self) -> &Arc<ArcSwap<LayerSettings>> {
        &self.shared.source
    }
}

impl<P: LayerPolicy> RateLimitLayer<P> {
    /// A layer deciding with `policy`, reading what it needs besides from `source`.
    pub(crate) fn of(policy: Arc<P>, source: P::Source) -> Self {
        RateLimitLayer {
            shared: Arc::new(Shared {
                policy,
                source,
                client_id_fn: None,
                on_rejection: None,
            }),
        }
    }

    /// Takes the client id from `f` instead of the configured header (for example from a
    /// verified token, or a path segment). `None`: no client id.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::{Check, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
    ///
    /// struct AdmitAll;
    /// impl Policy for AdmitAll {
    ///     fn check(&self, _: &RequestInfo<'_>) -> Check {
    ///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
    ///     }
    /// }
    /// let layer = RateLimitLayer::new(AdmitAll).client_id_fn(|parts| {
    ///     parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
    /// });
    /// # let _ = layer;
    /// ```
    pub fn client_id_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        let client_id_fn: ClientIdFn = Arc::new(f);
        self.shared = Arc::new(Shared {
            policy: Arc::clone(&self.shared.policy),
            source: self.shared.source.clone(),
            client_id_fn: Some(client_id_fn),
            on_rejection: self.shared.on_rejection.clone(),
        });
        self
    }

    /// Lets `f` answer rejected requests: it gets the request's parts (not its body, which a
    /// rejected request never has read), the verdict, and the response the layer would send (the
    /// configured status and body, or the gRPC status of a gRPC request, with `Retry-After` and
    /// the quota headers), and returns
    /// the response to send, that one changed or another. For the answers a template cannot
    /// give: an HTML page for browsers, an API's own error envelope, a header of your own, or a
    /// log line with what the request carries. It runs for every rejection, immediate or after
    /// a pending decision, on the task serving the request; keep it quick. Leave a gRPC
    /// request's answer (the one carrying `grpc-status`) as it is: a gRPC client reads that
    /// status, and a body or another `content-type` makes it report a protocol error instead of
    /// `RESOURCE_EXHAUSTED`.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::{Check, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
    ///
    /// struct AdmitAll;
    /// impl Policy for AdmitAll {
    ///     fn check(&self, _: &RequestInfo<'_>) -> Check {
    ///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
    ///     }
    /// }
    /// let layer = RateLimitLayer::new(AdmitAll).on_rejection(|request, _verdict, mut response| {
    ///     if request.uri.path().starts_with("/app/") {
    ///         *response.body_mut() = "<h1>Slow down</h1>".into();
    ///         response.headers_mut().insert("content-type", "text/html".parse().unwrap());
    ///     }
    ///     response
    /// });
    /// # let _ = layer;
    /// ```
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(
                &http::request::Parts,
                &Verdict,
                http::Response<bytes::Bytes>,
            ) -> http::Response<bytes::Bytes>
            + Send
            + Sync
            + 'static,
    {
        let on_rejection: OnRejection = Arc::new(f);
        self.shared = Arc::new(Shared {
            policy: Arc::clone(&self.shared.policy),
            source: self.shared.source.clone(),
            client_id_fn: self.shared.client_id_fn.clone(),
            on_rejection: Some(on_rejection),
        });
        self
    }
}

impl<S, P: LayerPolicy> tower::Layer<S> for RateLimitLayer<P> {
    type Service = RateLimitService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            inner_ready: false,
            layer: self.clone(),
        }
    }
}

/// The service of [`RateLimitLayer`].
///
/// # Examples
///
/// ```
/// use tower::Layer;
/// use turnstile::http::{Check, Outcome, Policy, Quotas, RateLimitLayer, RateLimitService, RequestInfo, Verdict};
///
/// struct AdmitAll;
/// impl Policy for AdmitAll {
///     fn check(&self, _: &RequestInfo<'_>) -> Check {
///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
///     }
/// }
/// let inner = tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let _service: RateLimitService<_, AdmitAll> = RateLimitLayer::new(AdmitAll).layer(inner);
/// ```
pub struct RateLimitService<S, P: LayerPolicy> {
    inner: S,
    /// Whether `inner` answered ready to the last `poll_ready`, which answers ready either way
    /// (see "Readiness" on [`RateLimitLayer`]); the next `call` uses it up.
    inner_ready: bool,
    layer: RateLimitLayer<P>,
}

impl<S: Clone, P: LayerPolicy> Clone for RateLimitService<S, P> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            // A clone has not been polled ready, as a `Buffer`'s clone has no slot.
            inner_ready: false,
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, P: LayerPolicy> fmt::Debug for RateLimitService<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

fn peer_ip<B>(request: &http::Request<B>) -> Option<IpAddr> {
    let extensions = request.extensions();
    if let Some(PeerAddr(addr)) = extensions.get::<PeerAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = grpc::tonic_peer(extensions) {
        return Some(addr.ip());
    }
    extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

impl<S, P, B, ResBody> tower::Service<http::Request<B>> for RateLimitService<S, P>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>> + Clone,
    P: LayerPolicy,
    ResBody: RejectionBody,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, http::Request<B>>;

    /// Ready unless the inner service failed: a request is decided at once, whether the inner
    /// service is ready or not, so that a rejection does not wait behind a full `Buffer` or a
    /// `ConcurrencyLimit` at its cap; an admitted request the inner service was not ready for
    /// waits for it in its response future (see "Readiness" on [`RateLimitLayer`]).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => self.inner_ready = true,
            Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
            // Still asked: `inner` goes on with its reservation (its place in a semaphore's
            // queue), which an admitted request takes over in `call`.
            Poll::Pending => self.inner_ready = false,
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let inner_ready = std::mem::replace(&mut self.inner_ready, false);
        let shared = &*self.layer.shared;
        // One load for what the request is decided and answered under (an `HttpLimiter`'s
        // rules and settings together). A guard, not an `Arc`: no reference count to bump (and
        // bounce between cores) on the common path; a pending decision comes with the
        // settings it is answered with.
        let loaded = shared.policy.load(&shared.source);
        let settings = P::settings(&loaded);

        let ip = client_ip(peer_ip(&request), request.headers(), &settings.client_ip);
        // The request stays where it is (it is a few hundred bytes, and every move is a copy)
        // except when the closure needs it split into `Parts`.
        let check = match &shared.client_id_fn {
            Some(client_id_fn) => {
                let (parts, body) = request.into_parts();
                let client_id = client_id_fn(&parts);
                let check = shared.policy.decide(
                    &loaded,
                    &shared.source,
                    &RequestInfo {
                        method: &parts.method,
                        path: parts.uri.path(),
                        client_ip: ip,
                        client_id: client_id.as_deref(),
                    },
                );
                request = http::Request::from_parts(parts, body);
                check
            }
            None => {
                let client_id = settings
                    .client_id_header
                    .as_ref()
                    .and_then(|name| request.headers().get(name))
                    .and_then(|value| value.to_str().ok());
                shared.policy.decide(
                    &loaded,
                    &shared.source,
                    &RequestInfo {
                        method: request.method(),
                        path: request.uri().path(),
                        client_ip: ip,
                        client_id,
                    },
                )
            }
        };

        match check {
            // Decided now: the service polled ready serves the request now, as tower asks.
            Decision::Ready(verdict) => match rejection(&verdict, &request, &settings.response) {
                // The inner future goes straight into its own field of the returned future
                // (inside the state enum it was copied twice more on every request).
                None if inner_ready => ResponseFuture {
                    inner: Some(self.inner.call(request)),
                    state: State::Admitted {
                        quotas: verdict.quotas,
                        headers: QuotaHeaders::of(&settings.response),
                        readying: None,
                    },
                },
                // Admitted, the inner service not ready: the future takes it over, with the
                // readiness it is waiting for, and a clone takes its place here.
                None => {
                    let fresh = self.inner.clone();
                    let service = std::mem::replace(&mut self.inner, fresh);
                    ResponseFuture {
                        inner: None,
                        state: State::Admitted {
                            quotas: verdict.quotas,
                            headers: QuotaHeaders::of(&settings.response),
                            readying: Some(Box::new((service, request))),
                        },
                    }
                }
                Some(response) => {
                    // Not served: give back what `poll_ready` reserved (a `Buffer` slot, a
                    // concurrency permit) instead of holding it while the connection idles,
                    // which would let a flood of rejected requests starve admitted ones.
                    let fresh = self.inner.clone();
                    drop(std::mem::replace(&mut self.inner, fresh));
                    ResponseFuture {
                        inner: None,
                        state: State::Rejected {
                            response: Some(answer(
                                shared.on_rejection.as_ref(),
                                request,
                                &verdict,
                                response,
                            )),
                        },
                    }
                }
            },
            // Decided later (a backend's answer, or a request waiting for its rule's queue):
            // what `poll_ready` reserved is given back, as for a rejection, rather than held
            // through the wait (a waiting request must not hold a concurrency permit that
            // admitted ones need); the future takes a clone, polled ready once admitted. Boxed,
            // so that the future of the common, immediate case is no bigger than it needs.
            Decision::Pending(verdict) => {
                let fresh = self.inner.clone();
                drop(std::mem::replace(&mut self.inner, fresh));
                ResponseFuture {
                    inner: None,
                    state: State::Waiting {
                        waiting: Some(Box::new(Waiting {
                            verdict,
                            decided: None,
                            service: self.inner.clone(),
                            request,
                            on_rejection: shared.on_rejection.clone(),
                        })),
                    },
                }
            }
        }
    }
}

/// The rejection of `request` when `verdict` rejects it: a gRPC status for a gRPC request
/// (when [`ResponseConfig::grpc`] allows), the HTTP rejection otherwise. `None` when the verdict
/// admits, which is the only thing an admitted request pays here.
fn rejection<B>(
    verdict: &Verdict,
    request: &http::Request<B>,
    response: &ResponseConfig,
) -> Option<http::Response<bytes::Bytes>> {
    let crate::http::Outcome::Rejected { reason, rule, .. } = &verdict.outcome else {
        return None;
    };
    tracing::debug!(%reason, %rule, "request rejected");
    let grpc = grpc::wants_grpc(request.headers(), response);
    grpc::rejection(verdict, response, grpc)
}

/// The response to a rejected `request`: `response`, or what the layer's
/// [`on_rejection`](RateLimitLayer::on_rejection) makes of it.
fn answer<B>(
    on_rejection: Option<&OnRejection>,
    request: http::Request<B>,
    verdict: &Verdict,
    response: http::Response<bytes::Bytes>,
) -> http::Response<bytes::Bytes> {
    match on_rejection {
        Some(f) => f(&request.into_parts().0, verdict, response),
        None => response,
    }
}

/// A decision still to come, with what serving the request then needs.
struct Waiting<S, R> {
    /// The verdict, with the settings of the snapshot it was made under (a request that
    /// waited for its rule is decided again under the snapshot in force when it wakes): the
    /// response is written as they say.
    verdict: Pin<Box<dyn Future<Output = (Verdict, Answered)> + Send + 'static>>,
    /// The verdict and its settings, once they came, while the service is polled ready.
    decided: Option<(Verdict, Answered)>,
    /// A clone of the inner service, not yet polled ready.
    service: S,
    request: R,
    on_rejection: Option<OnRejection>,
}

/// What a [`ResponseFuture`] is doing besides polling the inner service's future.
enum State<S, R> {
    /// Waiting for a pending decision.
    Waiting {
        // `None` once the decision came.
        waiting: Option<Box<Waiting<S, R>>>,
    },
    /// Admitted: the inner future runs; its response gets these quotas' headers. Before it,
    /// when the inner service was not ready: the service, polled until it is, and the
    /// request it is then called with (`None` once called).
    Admitted {
        quotas: Quotas,
        headers: QuotaHeaders,
        readying: Option<Box<(S, R)>>,
    },
    /// Rejected: this response, once.
    Rejected {
        response: Option<http::Response<bytes::Bytes>>,
    },
}

pin_project! {
    /// The response future of [`RateLimitService`]: waits for a pending decision, then for the
    /// inner service to be ready, then for its response.
    ///
    /// # Cancel safety
    ///
    /// Dropping it drops the pending decision (a remote backend may already have counted the
    /// request; a request waiting for its rule's queue leaves it, having taken nothing) with
    /// the inner service that waits for it, which gives back what its `poll_ready` reserved,
    /// if it got that far (a `Buffer` slot, a concurrency permit); an admitted request waiting
    /// for the inner service to be ready stays counted. Later, it drops the inner service's
    /// future.
    ///
    /// # Examples
    ///
    /// ```
    /// use tower::{Layer, Service, ServiceExt};
    /// use turnstile::http::{Check, Outcome, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
    ///
    /// struct AdmitAll;
    /// impl Policy for AdmitAll {
    ///     fn check(&self, _: &RequestInfo<'_>) -> Check {
    ///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
    ///     }
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut service = RateLimitLayer::new(AdmitAll).layer(tower::service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hi")))
    /// }));
    /// let future = service.ready().await.unwrap().call(http::Request::new(()));
    /// assert_eq!(future.await.unwrap().status(), 200);
    /// # }
    /// ```
    pub struct ResponseFuture<S, R>
    where
        S: tower::Service<R>,
    {
        // The inner service's future, once it is called. A field of its own rather than in
        // `state`: built straight into place, not copied.
        #[pin]
        inner: Option<S::Future>,
        state: State<S, R>,
    }
}

impl<S, R> fmt::Debug for ResponseFuture<S, R>
where
    S: tower::Service<R>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, http::Request<B>>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    ResBody: RejectionBody,
{
    type Output = Result<http::Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let State::Waiting { waiting } = this.state {
            // `None`: polled after completion.
            let Some(w) = waiting.as_mut() else {
                return Poll::Pending;
            };
            let verdict = match &mut w.decided {
                Some(verdict) => verdict,
                None => match w.verdict.as_mut().poll(cx) {
                    Poll::Ready(verdict) => w.decided.insert(verdict),
                    Poll::Pending => return Poll::Pending,
                },
            };
            if verdict.0.outcome.is_admitted() {
                match w.service.poll_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(error)) => {
                        *waiting = None;
                        return Poll::Ready(Err(error));
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
            let Some(done) = waiting.take() else {
                return Poll::Pending;
            };
            let Waiting {
                mut service,
                request,
                on_rejection,
                decided,
                ..
            } = *done;
            let Some((verdict, settings)) = decided else {
                return Poll::Pending;
            };
            let settings = settings.layer_settings();
            *this.state = match rejection(&verdict, &request, &settings.response) {
                None => {
                    this.inner.set(Some(service.call(request)));
                    State::Admitted {
                        quotas: verdict.quotas,
                        headers: QuotaHeaders::of(&settings.response),
                        readying: None,
                    }
                }
                Some(response) => State::Rejected {
                    response: Some(answer(on_rejection.as_ref(), request, &verdict, response)),
                },
            };
        }
        match this.state {
            State::Admitted {
                quotas,
                headers,
                readying,
            } => {
                if let Some(ready) = readying {
                    match ready.0.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(error)) => {
                            *readying = None;
                            return Poll::Ready(Err(error));
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                    if let Some(ready) = readying.take() {
                        let (mut service, request) = *ready;
                        this.inner.set(Some(service.call(request)));
                    }
                }
                let Some(future) = this.inner.as_mut().as_pin_mut() else {
                    return Poll::Pending;
                };
                let mut response = match future.poll(cx) {
                    Poll::Ready(Ok(response)) => response,
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                    Poll::Pending => return Poll::Pending,
                };
                // The inner future is done: dropped now, as a finished future should be.
                this.inner.set(None);
                // The inner body as it is: no wrapper for axum or tonic to box again.
                headers.insert(response.headers_mut(), quotas);
                Poll::Ready(Ok(response))
            }
            State::Rejected { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response.map(ResBody::rejection))),
                // Polled after completion.
                None => Poll::Pending,
            },
            // Still waiting (handled above).
            State::Waiting { .. } => Poll::Pending,
        }
    }
}
