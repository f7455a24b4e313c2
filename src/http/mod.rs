//! The HTTP layer (feature `http`): a [`tower::Layer`] that rate-limits requests by rules per
//! endpoint, per client IP and per client id, for axum, hyper and tonic.
//!
//! The parts, each in its own module:
//!
//! - `config`: the configuration model ([`HttpConfig`]), loaded from TOML, JSON or YAML (with
//!   humantime periods such as `1s`, `15m`, `7d`), or built in code ([`RuleConfig::new`],
//!   [`HttpConfig::rule`] and their builder methods), validated with errors that name the
//!   field, and AspNetCoreRateLimit's `IpRateLimiting` / `ClientRateLimiting` / policy sections.
//! - `client_ip`: who the client is. The peer address, or, only when the peer is a trusted
//!   proxy, the first untrusted address walking the forwarding header right to left
//!   (`X-Forwarded-For` by default; `Forwarded`, `X-Real-IP` or a custom one by setting); IPv6
//!   grouped by prefix.
//! - `engine`: [`HttpLimiter`], the compiled rules. It decides a [`RequestInfo`] into a
//!   [`Verdict`]: which rules match, whitelists, the static blocklist, bans, monitor mode, one
//!   limiter per rule (in memory, or in Redis with `[backend] kind = "redis"` and the feature
//!   `redis`), and hot reload that keeps the counters of rules that did not change.
//! - `response`: 429 (configurable) with `Retry-After` in whole seconds rounded up, an
//!   `application/problem+json` body, and the IETF `RateLimit` / `RateLimit-Policy` headers (the
//!   legacy `X-RateLimit-*` as an option).
//! - `grpc`: for gRPC requests, the rejection as a gRPC status instead
//!   ([`grpc_rejection_response`]: `RESOURCE_EXHAUSTED`, trailers-only), so that gRPC clients
//!   see the rate limit rather than a protocol error.
//! - `layer`: [`RateLimitLayer`] and its service, which glue the three together (with
//!   [`RateLimitLayer::on_rejection`] for rejections answered by your own code); and
//!   `concurrency`: [`ConcurrencyLayer`], an in-flight cap per route.
//!
//! The contract between them is the small set of types in this module: the layer extracts a
//! [`RequestInfo`], the engine (or a [`Policy`] of your own) answers with a [`Check`], and the
//! layer turns the [`Verdict`] into a response.
//!
//! # Where the layer goes in an axum app
//!
//! Around the whole router, with the routes turned into services first:
//! `limiter.layer().layer(router.with_state(()))`, served with
//! `ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(app)` (axum's
//! `ServiceExt`, named with axum's request type; see `examples/axum_server.rs`). A request is
//! then decided before it is routed: a rejection costs no routing and no per-route service, and
//! requests for paths without a route are counted too. The rules match the request's own path,
//! so they need nothing from the router. `Router::layer(limiter.layer())` works as well, and
//! `route_layer` limits only the routes that match; both put the layer inside every route (axum
//! boxes each route's service again), so a request is routed before it is decided.
//! `benches/http.rs` (`http-service`) measures both.
//!
//! # The peer address
//!
//! The layer finds the connected peer in the request's extensions: a [`PeerAddr`], a bare
//! `SocketAddr`, with the `axum` feature axum's `ConnectInfo<SocketAddr>`, and with the `tonic`
//! feature tonic's `TcpConnectInfo` (so `Server::builder().layer(limiter.layer())` needs nothing
//! more). axum apps and tonic servers need their feature anyway: it also makes their body type a
//! [`RejectionBody`], the type the layer writes its rejections in. A server of your own inserts
//! a [`PeerAddr`]; with hyper, from its accept loop:
//!
//! ```no_run
//! use std::convert::Infallible;
//! use hyper::body::Incoming;
//! use tower::{Layer, ServiceExt};
//! use turnstile::http::{Check, Outcome, PeerAddr, Policy, Quotas, RateLimitLayer, RequestInfo, Verdict};
//!
//! struct AdmitAll;
//! impl Policy for AdmitAll {
//!     fn check(&self, _: &RequestInfo<'_>) -> Check {
//!         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
//!     }
//! }
//!
//! # #[tokio::main]
//! # async fn main() -> std::io::Result<()> {
//! let layer = RateLimitLayer::new(AdmitAll);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! loop {
//!     let (stream, peer) = listener.accept().await?;
//!     let limited = layer.layer(tower::service_fn(|_: http::Request<Incoming>| async {
//!         Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
//!             bytes::Bytes::from_static(b"hello"),
//!         )))
//!     }));
//!     // Every request of this connection comes from `peer`: put it where the layer looks.
//!     let service = tower::service_fn(move |mut request: http::Request<Incoming>| {
//!         request.extensions_mut().insert(PeerAddr(peer));
//!         limited.clone().oneshot(request)
//!     });
//!     tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
//!         hyper_util::rt::TokioIo::new(stream),
//!         hyper_util::service::TowerToHyperService::new(service),
//!     ));
//! }
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// What a [`Policy`] needs to know about one request, extracted by the layer.
///
/// # Examples
///
/// ```
/// use turnstile::http::RequestInfo;
///
/// let info = RequestInfo {
///     method: &http::Method::GET,
///     path: "/api/values",
///     client_ip: Some("203.0.113.7".parse().unwrap()),
///     client_id: Some("mobile-app"),
/// };
/// assert_eq!(info.path, "/api/values");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo<'a> {
    /// The request's method.
    pub method: &'a http::Method,
    /// The request's path, without the query string.
    pub path: &'a str,
    /// The client's address as the layer determined it (trusted proxies resolved, IPv6 already
    /// grouped by prefix), or `None` when it cannot be determined.
    pub client_ip: Option<IpAddr>,
    /// The client id from the configured header, or `None`.
    pub client_id: Option<&'a str>,
}

/// Why a request was rejected.
///
/// # Examples
///
/// ```
/// use turnstile::http::RejectReason;
///
/// assert_eq!(RejectReason::RateLimited.to_string(), "rate limited");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// A rule's limit was reached.
    RateLimited,
    /// A rule with limit 0 matched, or the client is on the static blocklist.
    Blocked,
    /// The client is banned for having been rejected too often.
    Banned,
    /// The client's key could not be determined and the configuration rejects such requests.
    NoKey,
    /// The counting backend failed and its failure policy is to reject.
    Unavailable,
    /// The rule already counts as many clients as it may hold in memory
    /// ([`HttpConfig::max_keys_per_rule`]), none of them idle, and
    /// [`HttpConfig::key_overflow`] is [`KeyOverflowPolicy::Reject`].
    TooManyKeys,
}

impl RejectReason {
    /// The reason in words, as [`Display`](fmt::Display) writes it and the problem+json
    /// `detail` says it.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::RejectReason;
    ///
    /// assert_eq!(RejectReason::Banned.as_str(), "banned");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::RateLimited => "rate limited",
            RejectReason::Blocked => "blocked",
            RejectReason::Banned => "banned",
            RejectReason::NoKey => "client key unknown",
            RejectReason::Unavailable => "rate-limit backend unavailable",
            RejectReason::TooManyKeys => "too many clients to count",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of one rule's quota for this client after the decision, as the `RateLimit` and
/// `RateLimit-Policy` headers report it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::QuotaState;
///
/// let quota = QuotaState {
///     policy: "per-ip".into(),
///     limit: 100,
///     window: Duration::from_secs(60),
///     remaining: 42,
///     reset_after: Duration::from_millis(16_200),
/// };
/// assert_eq!(quota.remaining, 42);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaState {
    /// The policy's name (the rule's name), as it appears in the headers.
    pub policy: Arc<str>,
    /// The quota: requests allowed per window.
    pub limit: u64,
    /// The window the quota applies to.
    pub window: Duration,
    /// Requests left in the current window after this decision.
    pub remaining: u64,
    /// Time until the quota is fully available again (exact; headers round it up, to at least
    /// 1 s when nothing remains).
    pub reset_after: Duration,
}

/// The quotas a [`Verdict`] reports, one per enforced rule that counted the request: a list that
/// holds one quota inline (the usual single rule), so that deciding a request allocates nothing.
/// It reads as a slice of [`QuotaState`]s.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{QuotaState, Quotas};
///
/// let mut quotas = Quotas::new();
/// assert!(quotas.is_empty());
/// quotas.push(QuotaState {
///     policy: "per-ip".into(),
///     limit: 100,
///     window: Duration::from_secs(60),
///     remaining: 42,
///     reset_after: Duration::from_secs(17),
/// });
/// assert_eq!(quotas.len(), 1);
/// assert_eq!(quotas[0].remaining, 42);
/// let listed: Quotas = vec![quotas[0].clone(), quotas[0].clone()].into();
/// assert_eq!(listed.iter().map(|q| q.limit).sum::<u64>(), 200);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Quotas(smallvec::SmallVec<[QuotaState; 1]>);

impl Quotas {
    /// No quotas.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(turnstile::http::Quotas::new().is_empty());
    /// ```
    pub fn new() -> Self {
        Quotas(smallvec::SmallVec::new())
    }

    /// Room for `capacity` quotas (inline up to one).
    ///
    /// # Examples
    ///
    /// ```
    /// let quotas = turnstile::http::Quotas::with_capacity(3);
    /// assert!(quotas.is_empty());
    /// ```
    pub fn with_capacity(capacity: usize) -> Self {
        Quotas(smallvec::SmallVec::with_capacity(capacity))
    }

    /// Adds a quota at the end.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{QuotaState, Quotas};
    ///
    /// let mut quotas = Quotas::new();
    /// quotas.push(QuotaState {
    ///     policy: "per-ip".into(),
    ///     limit: 2,
    ///     window: Duration::from_secs(1),
    ///     remaining: 1,
    ///     reset_after: Duration::from_secs(1),
    /// });
    /// assert_eq!(&*quotas[0].policy, "per-ip");
    /// ```
    pub fn push(&mut self, quota: QuotaState) {
        self.0.push(quota);
    }
}

impl fmt::Debug for Quotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl std::ops::Deref for Quotas {
    type Target = [QuotaState];

    fn deref(&self) -> &[QuotaState] {
        &self.0
    }
}

impl std::ops::DerefMut for Quotas {
    fn deref_mut(&mut self) -> &mut [QuotaState] {
        &mut self.0
    }
}

impl From<Vec<QuotaState>> for Quotas {
    fn from(quotas: Vec<QuotaState>) -> Self {
        Quotas(smallvec::SmallVec::from_vec(quotas))
    }
}

impl From<QuotaState> for Quotas {
    fn from(quota: QuotaState) -> Self {
        Quotas(smallvec::smallvec![quota])
    }
}

impl FromIterator<QuotaState> for Quotas {
    fn from_iter<I: IntoIterator<Item = QuotaState>>(iter: I) -> Self {
        Quotas(iter.into_iter().collect())
    }
}

impl Extend<QuotaState> for Quotas {
    fn extend<I: IntoIterator<Item = QuotaState>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl<'a> IntoIterator for &'a Quotas {
    type Item = &'a QuotaState;
    type IntoIter = std::slice::Iter<'a, QuotaState>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl PartialEq<[QuotaState]> for Quotas {
    fn eq(&self, other: &[QuotaState]) -> bool {
        *self.0 == *other
    }
}

/// The outcome of a [`Policy`] for one request.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{Outcome, RejectReason};
///
/// let outcome = Outcome::Rejected {
///     reason: RejectReason::RateLimited,
///     rule: "per-ip".into(),
///     retry_after: Some(Duration::from_millis(300)),
/// };
/// assert!(!outcome.is_admitted());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Every matching rule admitted the request (rules in monitor mode may have wanted to
    /// reject it; they are counted and logged, not enforced).
    Admitted,
    /// The request matched a whitelist: no rule was consulted or charged.
    Whitelisted,
    /// The request is rejected.
    Rejected {
        /// Why.
        reason: RejectReason,
        /// The rule (or list, or ban) that rejected it, for logs, metrics and the body.
        rule: Arc<str>,
        /// When the client may retry, if that is known (exact; `Retry-After` rounds it up).
        retry_after: Option<Duration>,
    },
}

impl Outcome {
    /// Whether the request goes on to the inner service.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(turnstile::http::Outcome::Whitelisted.is_admitted());
    /// ```
    pub fn is_admitted(&self) -> bool {
        matches!(self, Outcome::Admitted | Outcome::Whitelisted)
    }
}

/// A [`Policy`]'s answer for one request: the outcome and the quotas to report in headers.
///
/// # Examples
///
/// ```
/// use turnstile::http::{Outcome, Quotas, Verdict};
///
/// let verdict = Verdict { outcome: Outcome::Whitelisted, quotas: Quotas::new() };
/// assert!(verdict.outcome.is_admitted());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Admit or reject.
    pub outcome: Outcome,
    /// The quota of every enforced rule that counted the request (on a rejection, as
    /// [`HttpLimiter`] describes), for the `RateLimit*` headers. Empty when none did: no rule
    /// matched, the request was whitelisted, only monitor rules matched, or it was rejected
    /// before any rule counted it (the blocklist, a ban, a rule of limit 0, a missing key).
    pub quotas: Quotas,
}

/// A [`Policy`]'s answer: ready at once (in-memory counting), or a future (a remote backend).
///
/// # Examples
///
/// ```
/// use turnstile::http::{Check, Outcome, Quotas, Verdict};
///
/// let check = Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() });
/// assert!(matches!(check, Check::Ready(_)));
/// ```
#[non_exhaustive]
pub enum Check {
    /// The decision, made without waiting.
    Ready(Verdict),
    /// The decision, once a backend answers, or once a request waiting for its rule
    /// (`queue_limit`) is admitted or finally rejected. The future owns what it needs (it does
    /// not borrow the request).
    Pending(Pin<Box<dyn Future<Output = Verdict> + Send + 'static>>),
}

impl fmt::Debug for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Check::Ready(verdict) => f.debug_tuple("Ready").field(verdict).finish(),
            Check::Pending(_) => f.write_str("Pending(..)"),
        }
    }
}

/// Decides requests for [`RateLimitLayer`]: implement it for custom decisions, and give the
/// layer its [`LayerSettings`] ([`RateLimitLayer::new`], [`RateLimitLayer::with_settings`]).
/// [`HttpLimiter`], the configured decisions, is not one: it keeps its rules and its settings
/// in one snapshot, which the layer reads once per request (see [`LayerPolicy`]).
///
/// # Examples
///
/// ```
/// use turnstile::http::{Check, Outcome, Policy, Quotas, RequestInfo, Verdict};
///
/// struct AdmitAll;
/// impl Policy for AdmitAll {
///     fn check(&self, _request: &RequestInfo<'_>) -> Check {
///         Check::Ready(Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() })
///     }
/// }
/// let request = RequestInfo { method: &http::Method::GET, path: "/", client_ip: None, client_id: None };
/// assert!(matches!(AdmitAll.check(&request), Check::Ready(v) if v.outcome.is_admitted()));
/// ```
pub trait Policy: Send + Sync + 'static {
    /// Decides one request. Must not block: anything slow goes in [`Check::Pending`].
    ///
    /// # Examples
    ///
    /// A policy that asks a backend: the decision comes later, in a future that owns what it
    /// needs.
    ///
    /// ```
    /// use turnstile::http::{Check, Outcome, Policy, Quotas, RequestInfo, Verdict};
    ///
    /// struct Remote;
    /// impl Policy for Remote {
    ///     fn check(&self, request: &RequestInfo<'_>) -> Check {
    ///         let path = request.path.to_owned();
    ///         Check::Pending(Box::pin(async move {
    ///             // ... ask the backend about `path` ...
    ///             let _ = path;
    ///             Verdict { outcome: Outcome::Admitted, quotas: Quotas::new() }
    ///         }))
    ///     }
    /// }
    /// let request = RequestInfo { method: &http::Method::GET, path: "/", client_ip: None, client_id: None };
    /// assert!(matches!(Remote.check(&request), Check::Pending(_)));
    /// ```
    fn check(&self, request: &RequestInfo<'_>) -> Check;
}

/// What the layer itself needs from the configuration: how to find the client, and how to
/// answer. [`HttpLimiter`] keeps one with its rules, in one snapshot that a reload swaps whole;
/// a layer deciding with a [`Policy`] keeps its own ([`RateLimitLayer::settings`]).
///
/// # Examples
///
/// ```
/// use turnstile::http::LayerSettings;
///
/// let settings = LayerSettings::default();
/// assert_eq!(settings.response.status, 429);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerSettings {
    /// How the client's IP address is found.
    pub client_ip: ClientIpConfig,
    /// The header carrying the client id, if client rules are used.
    pub client_id_header: Option<http::HeaderName>,
    /// How rejections look and which headers responses carry.
    pub response: ResponseConfig,
}

mod aspnet;
mod body;
mod client_ip;
mod concurrency;
mod config;
mod engine;
mod grpc;
mod layer;
#[cfg(feature = "redis")]
mod redis_rules;
mod response;
mod rules;

pub use body::{RateLimitBody, RejectionBody};
pub use client_ip::{ClientIpConfig, ForwardedHeader, client_ip};
pub use concurrency::{ConcurrencyFuture, ConcurrencyLayer, ConcurrencyService};
pub use config::{
    BackendConfig, BanConfig, BlocklistConfig, ClientRulesConfig, HttpConfig, HttpConfigError,
    IpRulesConfig, KeyOverflowPolicy, KeyWhitelistConfig, MissingKey, RuleAlgorithm, RuleConfig,
    RuleKey, WhitelistConfig,
};
pub use engine::HttpLimiter;
pub use grpc::grpc_rejection_response;
pub use layer::{LayerPolicy, PeerAddr, RateLimitLayer, RateLimitService, ResponseFuture};
pub use response::{
    ResponseConfig, ResponseConfigError, insert_quota_headers, ratelimit_policy_value,
    ratelimit_value, rejection_response, whole_seconds_up,
};
