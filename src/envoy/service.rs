//! The `ShouldRateLimit` service: decisions over `KeyedLimiter`s, hot reload, and the tonic
//! service that serves them.

use super::config::{LimitSpec, RlsConfig, RlsConfigError};
use super::metrics::{Counters, Decision, detailed_label};
use super::proto::{
    Code, DescriptorStatus, Entry, HeaderValue, HealthCheckRequest, HealthCheckResponse,
    ProtoDuration, RateLimit, RateLimitDescriptor, RateLimitOverride, RateLimitRequest,
    RateLimitResponse, ServingStatus, Unit,
};
use crate::{Algorithm, Clock, DefaultClock, KeyedLimiter, KeyedRefundable, TryAcquireError};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The gRPC path of the one method served.
///
/// # Examples
///
/// ```
/// use tonic::server::NamedService;
/// use turnstile::envoy::{RlsService, SHOULD_RATE_LIMIT_PATH};
///
/// let service = format!("/{}/", <RlsService as NamedService>::NAME);
/// assert_eq!(SHOULD_RATE_LIMIT_PATH, format!("{service}ShouldRateLimit"));
/// ```
pub const SHOULD_RATE_LIMIT_PATH: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC path of `grpc.health.v1.Health/Check`, which [`HealthService`] answers, as
/// envoyproxy/ratelimit's gRPC port does: see [`HEALTH_SERVICE_NAME`].
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::envoy::HEALTH_CHECK_PATH, "/grpc.health.v1.Health/Check");
/// ```
pub const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// The service name whose health the gRPC health check reports, as envoyproxy/ratelimit names
/// it: `SERVING` while the service [is healthy](RlsService::is_healthy), `NOT_SERVING`
/// otherwise (draining, or with no domain when one is required). The server as a whole (`""`)
/// is always `SERVING`, as there; any other name is `NOT_FOUND`.
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::envoy::HEALTH_SERVICE_NAME, "ratelimit");
/// ```
pub const HEALTH_SERVICE_NAME: &str = "ratelimit";

/// The most distinct request `limit` overrides (domain, requests per unit, unit) given a
/// limiter of their own; an override beyond them is ignored (the configured limit applies).
///
/// Each limiter, configured or override, holds at most
/// [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS) counters, and an idle one gives its memory
/// back; the bound on memory is then this many limiters' worth of counters on top of the
/// configured ones, each counter as large as the entries that name it. Overrides come from
/// Envoy's route configuration, not from clients, and a deployment uses a handful.
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::envoy::MAX_OVERRIDE_LIMITS, 1024);
/// ```
pub const MAX_OVERRIDE_LIMITS: usize = 1024;

/// The near-limit ratio of a service until it is
/// [set](RlsService::set_near_limit_ratio): envoyproxy/ratelimit's default
/// `NEAR_LIMIT_RATIO`.
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::envoy::DEFAULT_NEAR_LIMIT_RATIO, 0.8);
/// ```
pub const DEFAULT_NEAR_LIMIT_RATIO: f32 = 0.8;

/// A descriptor's counters: its entries, as the request sent them.
type Key = Vec<Entry>;
type Hasher = crate::sync::RandomHasher;
type Limiter<C> = KeyedLimiter<Key, C, Hasher>;

/// The clock an [`RlsService`] uses unless told otherwise: [`DefaultClock`] read as nanoseconds
/// since the Unix epoch, so that a unit's fixed windows start on UTC's whole seconds, minutes,
/// hours and days (months and years: multiples of 30 and 365 days since 1970), as Envoy's
/// service aligns them.
///
/// The offset is taken from the system clock once, when the clock is made; after that time
/// only moves forward with the monotonic clock, whatever the system clock does. Windows then
/// drift from UTC's as the two clocks drift apart (NTP slews the system clock by up to half a
/// millisecond a second): within one process the windows stay whole and exact, and only their
/// alignment to UTC's minutes moves. Counting in Redis (`with_redis`) uses Redis's clock.
///
/// # Examples
///
/// ```
/// use std::time::{SystemTime, UNIX_EPOCH};
/// use turnstile::Clock;
/// use turnstile::envoy::UnixClock;
///
/// let clock = UnixClock::new();
/// let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
/// assert!(clock.now().abs_diff(unix) < 5_000_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct UnixClock {
    base: DefaultClock,
    offset: u64,
}

impl UnixClock {
    /// A clock reading the Unix time now.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::Clock;
    ///
    /// assert!(turnstile::envoy::UnixClock::new().now() > 1_600_000_000_000_000_000);
    /// ```
    pub fn new() -> Self {
        let base = DefaultClock::new();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        UnixClock {
            offset: unix.saturating_sub(base.now()),
            base,
        }
    }
}

impl Default for UnixClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for UnixClock {
    fn now(&self) -> u64 {
        self.base.now().saturating_add(self.offset)
    }

    fn catch_up(&self) {
        self.base.catch_up();
    }
}

/// Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`), answering
/// `ShouldRateLimit` from an [`RlsConfig`], counting in memory (or, made with `with_redis` or
/// `with_redis_cluster` under the feature `redis`, in Redis or a Redis Cluster: see there for
/// how its decisions differ).
///
/// Mount it on a tonic server with `Server::builder().add_service(service.clone())`; keep a clone
/// to [`reload`](Self::reload) the configuration. Clones share everything.
///
/// # Decisions
///
/// Each request descriptor is matched against its domain's descriptors as Envoy's service
/// matches it (see [`RlsConfig`]); a matched limit counts in fixed windows of its unit, one
/// counter per distinct list of entries (so a descriptor configured without a `value` counts
/// each value apart). A descriptor's cost is its own `hits_addend` if set (0 only checks), else
/// the request's (0 means 1).
///
/// - **All or nothing.** When one descriptor is over its limit, the hits the request took from
///   the others are given back: a rejected request costs nothing, as a rejection of turnstile's
///   HTTP layer costs nothing. Envoy's service charges every descriptor even when one is over
///   (so a client over one limit also eats into the others). This is the main deliberate
///   difference; the others are said where they apply: a check at exactly the limit (below),
///   a request `limit` override counting apart from the configured limit (Envoy's counter
///   is named by the entries and the unit only), and, counting in Redis, the failure policy
///   (see `with_redis`). A descriptor given back answers `OK` with its counter's
///   `limit_remaining` once every descriptor has given back (the hits another descriptor
///   counted past the limit on the same counter stay counted, below); in Redis, with the
///   count before the request (see `with_redis`).
/// - **Over the limit.** A descriptor over its limit counts its hits all the same, past the
///   limit, as Envoy's service counts them, and answers `limit_remaining` 0: a cost reported
///   after the fact (a check with `hits_addend: 0` before the request, then its cost once
///   known, as for a budget of tokens) counts even when it is more than what is left, and the
///   checks and hits after it are over until the window ends.
/// - **Checks.** A descriptor `hits_addend` of 0 answers as one hit would, counting nothing:
///   over once the count has reached the limit (Envoy's service answers `OK` with 0 left at
///   exactly the limit, and over only past it). Checks are decided before the descriptors
///   with hits: a check reads the count as it was before the request.
/// - `shadow_mode: true`: never over the limit; when it would be, its status is `OK` with
///   `limit_remaining` 0, as in Envoy. Its hits count as an enforced descriptor's do, past
///   the limit too, as Envoy's service counts them, so that it measures what enforcing it
///   would do; only on an admitted request (on a rejected one it is given back, as all the
///   others).
/// - The global shadow mode ([`set_global_shadow_mode`](Self::set_global_shadow_mode),
///   envoyproxy/ratelimit's `SHADOW_MODE`): decided and counted as without it, then the
///   overall answer is `OK`; the statuses stay as decided.
/// - `unlimited: true`: `OK`, no counting, `limit_remaining` `u32::MAX`.
/// - `requests_per_unit: 0`: every hit is over the limit.
/// - A request `limit` override counts in a limiter of its own per (domain, requests per unit,
///   unit), keyed by the entries (in Envoy's service it counts in the counter of the entries
///   and unit, which the configured limit and other overrides of that unit share); overrides
///   with an unknown unit are ignored, as are overrides beyond [`MAX_OVERRIDE_LIMITS`]
///   distinct ones.
/// - `replaces`: a matched limit (an unlimited one too, as in Envoy) naming others in
///   `replaces` makes those not apply to the request.
/// - An unknown domain, or a descriptor no limit matches: `OK`, no `current_limit`.
/// - A request with an empty domain or no descriptors: the gRPC status `INVALID_ARGUMENT`.
/// - Statuses: `current_limit` (requests per unit, unit, name), `limit_remaining` and
///   `duration_until_reset` (the time left in the window in whole seconds, rounded up, as
///   Envoy's service answers it). On `OVER_LIMIT`, `limit_remaining` is 0, as in Envoy's
///   service: the hits over the limit are counted (above), so nothing is left, even when the
///   request asked for more hits than were left (100 left, 500 asked: over, 0 left).
/// - A new counter when its limit already holds its most keys
///   ([`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS)) and none is idle: `OVER_LIMIT`, nothing
///   counted (fail closed).
///
/// # Metrics
///
/// With the feature `metrics`, each descriptor with a limit counts its hits through the
/// `metrics` facade, as envoyproxy/ratelimit counts its per-limit stats:
/// `turnstile_envoy_total_hits`; `turnstile_envoy_over_limit`, the hits past the limit;
/// `turnstile_envoy_near_limit`, the hits past the
/// [near-limit ratio](Self::set_near_limit_ratio) of the limit (80% unless set, rounded down)
/// up to it;
/// `turnstile_envoy_within_limit`, the hits of a descriptor within its limit; and
/// `turnstile_envoy_shadow_mode`, the hits of a shadow-mode descriptor past its limit (those
/// `over_limit` counts too). Labels: `domain`, and `limit`, the limit's descriptor path
/// (`domain.key_value.key`), or `override:<requests>/<unit>` for a request's `limit` override,
/// or, on a descriptor with `detailed_metric: true`, the request's entries
/// (`domain.key_value`, one series per value clients send: unbounded, as in Envoy). Each
/// descriptor counts as it decided: within its limit on a request another descriptor rejects,
/// its hits are given back and still counted within the limit, in memory and in Redis alike. Unlimited limits and unmatched
/// descriptors count nothing. In the global shadow mode, `turnstile_envoy_global_shadow_mode`
/// (labelled by `domain` only) counts the requests whose answer it turned into `OK`. The counts
/// go to the recorder installed at each decision.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{Code, Entry, RateLimitDescriptor, RateLimitRequest};
/// use turnstile::envoy::{RlsConfig, RlsService};
///
/// let service = RlsService::new(RlsConfig::from_yaml_str(r#"
/// domain: rl
/// descriptors:
///   - key: category
///     value: account
///     rate_limit: { unit: minute, requests_per_unit: 1 }
/// "#)?)?;
/// let request = RateLimitRequest {
///     domain: "rl".into(),
///     descriptors: vec![RateLimitDescriptor {
///         entries: vec![Entry { key: "category".into(), value: "account".into() }],
///         ..Default::default()
///     }],
///     hits_addend: 0,
/// };
/// assert_eq!(service.should_rate_limit(&request)?.overall_code(), Code::Ok);
/// assert_eq!(service.should_rate_limit(&request)?.overall_code(), Code::OverLimit);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RlsService<C: Clock + Clone = UnixClock> {
    shared: Arc<Shared<C>>,
}

struct Shared<C: Clock + Clone> {
    clock: C,
    state: RwLock<Arc<State<C>>>,
    overrides: Overrides<Limiter<C>>,
    /// Where the counters are when they are in Redis.
    #[cfg(feature = "redis")]
    remote: Option<super::remote::Remote>,
}

struct State<C: Clock + Clone> {
    config: RlsConfig,
    /// Per `config.limits()`: `None` for unlimited limits and for `requests_per_unit: 0`
    /// (and for every limit when counting in Redis).
    limiters: Vec<Option<Limiter<C>>>,
    /// As `limiters`, when counting in Redis; empty otherwise.
    #[cfg(feature = "redis")]
    remote: Vec<Option<super::remote::RedisLimiter>>,
    settings: Settings,
}

/// The service-level settings, kept across reloads.
#[derive(Clone)]
struct Settings {
    headers: Option<Arc<ResponseHeaders>>,
    /// envoyproxy/ratelimit's `SHADOW_MODE`: every answer is `OK`.
    global_shadow_mode: bool,
    /// envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`, from 0 to 1.
    near_limit_ratio: f32,
    /// Draining (envoyproxy/ratelimit after SIGTERM): the health check fails.
    draining: bool,
    /// envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: the health check fails
    /// while the configuration has no domain.
    require_domain: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            headers: None,
            global_shadow_mode: false,
            near_limit_ratio: DEFAULT_NEAR_LIMIT_RATIO,
            draining: false,
            require_domain: false,
        }
    }
}

/// The names of the response headers an [`RlsService`] asks Envoy to add, when it is told to
/// with [`set_response_headers`](RlsService::set_response_headers) (envoyproxy/ratelimit's
/// `LIMIT_RESPONSE_HEADERS_ENABLED`, `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER` and
/// `LIMIT_RESET_HEADER`). They describe the descriptor closest to its limit, chosen as Envoy's
/// service chooses it: the last over its limit, else the first with the least
/// `limit_remaining`; the reset is its `duration_until_reset`, in whole seconds.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::ResponseHeaders;
///
/// assert_eq!(ResponseHeaders::default().remaining, "RateLimit-Remaining");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHeaders {
    /// The header with the limit's requests per unit (default `RateLimit-Limit`).
    pub limit: String,
    /// The header with the hits left (default `RateLimit-Remaining`).
    pub remaining: String,
    /// The header with the seconds until the window ends (default `RateLimit-Reset`).
    pub reset: String,
}

impl Default for ResponseHeaders {
    fn default() -> Self {
        ResponseHeaders {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

impl ResponseHeaders {
    /// Adds the headers for `response`'s descriptor closest to its limit, if any has a limit.
    fn add_to(&self, response: &mut RateLimitResponse) {
        let mut closest: Option<&DescriptorStatus> = None;
        let mut least = u32::MAX;
        for status in &response.statuses {
            if status.code() == Code::OverLimit {
                // As Envoy's service: a later status over its limit replaces an earlier one.
                closest = Some(status);
                least = 0;
            }
            if status.current_limit.is_some() && status.limit_remaining < least {
                closest = Some(status);
                least = status.limit_remaining;
            }
        }
        let Some(status) = closest else { return };
        let Some(limit) = &status.current_limit else {
            return;
        };
        let reset = status
            .duration_until_reset
            .and_then(|d| Duration::try_from(d).ok())
            .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
        let headers = [
            (&self.limit, limit.requests_per_unit.to_string()),
            (&self.remaining, status.limit_remaining.to_string()),
            (&self.reset, reset.to_string()),
        ];
        response.response_headers_to_add = headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.clone(),
                value,
            })
            .collect();
    }
}

impl Settings {
    /// What the settings add to a decided `response` of `domain`: the response headers, then
    /// the global shadow mode's `OK`.
    fn finish(&self, domain: &str, response: &mut RateLimitResponse) {
        if let Some(headers) = &self.headers {
            headers.add_to(response);
        }
        if self.global_shadow_mode && response.overall_code() == Code::OverLimit {
            response.overall_code = Code::Ok as i32;
            super::metrics::count_global_shadow_mode(domain);
        }
    }
}

impl<C: Clock + Clone> Clone for RlsService<C> {
    fn clone(&self) -> Self {
        RlsService {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock + Clone> std::fmt::Debug for RlsService<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("RlsService")
            .field("domains", &state.config.domains().collect::<Vec<_>>())
            .field("limits", &state.config.limits().len())
            .finish_non_exhaustive()
    }
}

impl RlsService {
    /// A service answering from `config`, on a [`UnixClock`].
    ///
    /// # Errors
    ///
    /// [`RlsConfigError::Invalid`] if a limit cannot be built (not expected of a loaded
    /// configuration).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: edge\n")?)?;
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn new(config: RlsConfig) -> Result<Self, RlsConfigError> {
        Self::with_clock(config, UnixClock::new())
    }

    /// A service answering from `config`, counting in Redis (feature `redis`), so that every
    /// process on that Redis shares the counts, as envoyproxy/ratelimit's instances do.
    ///
    /// Each configured limit is a [`RedisLimiter`](crate::RedisLimiter) with a fixed window of
    /// its unit, on Redis's clock (windows aligned to Unix time), with `policy` for when Redis
    /// fails or is slow (50 ms deadline), under keys `prefix:<16 hex digits naming the domain,
    /// descriptor path and unit>:{<the entries>}:fw`: a reload keeps the counts of limits at
    /// the same path and unit, whatever their requests per unit, as in Envoy. Decide with
    /// [`decide`](RlsService::decide) (the gRPC service does);
    /// [`should_rate_limit`](RlsService::should_rate_limit) answers `FAILED_PRECONDITION`.
    ///
    /// **All or nothing.** A request's enforced descriptors (not in shadow mode, with hits) are
    /// decided by one script per *call*, the calls sent together (their round trips in
    /// flight at once): on a standalone server one call for all of them (one per distinct
    /// cost when per-descriptor `hits_addend`s differ); on a Cluster
    /// ([`with_redis_cluster`](RlsService::with_redis_cluster)) one per slot and cost. A
    /// counter named at two costs or more has a call per occurrence, sent in the request's
    /// order, so that each occurrence meets the hits of those before it, as in memory. Each
    /// script decides its descriptors all or nothing. When every call admits, the request is
    /// admitted; when one rejects, the calls that admitted give their hits back (one more
    /// round trip each, in parallel), so that a rejected request costs nothing, as in memory.
    /// What that leaves open, and only when a request needs more than one call:
    ///
    /// - Between a call's charge and its give-back, other requests see those hits taken and
    ///   may be rejected by them (never admitted past a limit): the same window as in memory,
    ///   where the refund also follows the charge, here one round trip long. A process whose
    ///   deny cache keeps such a rejection refuses that counter locally until its window ends,
    ///   although the give-back left it room for the hits given back.
    /// - A give-back that fails or misses the deadline leaves the hits charged (as Envoy
    ///   charges every descriptor), and the status reports the count after the charge; a
    ///   window that ended in between has nothing to give back.
    ///
    /// A descriptor given back answers `OK` with its count as it was before the request. When
    /// a limiter's deny cache already knows that its call rejects, the request is rejected
    /// with no round trip to any slot, and the other descriptors are not asked (`OK`, no
    /// count, no window). Checks (0 hits) take a round trip each, sent together before the
    /// enforced calls (so a check reads the count as it was before the request, as in memory);
    /// shadow-mode descriptors (only when the request is admitted) one each, together after
    /// them. The enforced calls are sent even when a check or a descriptor decided without
    /// Redis has rejected the request already, in the same round trip, each script told to take
    /// nothing from the members that admit (so there is nothing to give back), unless one
    /// counter is named at two costs (in two calls): those calls then take and give back, so
    /// that the later meets the earlier's hits, as in memory. A descriptor
    /// over its limit counts its hits past the limit, in the same script (one of more hits
    /// than its limit, decided without a script, by a charge of its own, sent with the
    /// enforced calls; hits named after it on its counter are over and charged too). A request
    /// thus takes up to three rounds, one after the other: its checks, its enforced calls, its
    /// shadow descriptors; each round waits at most the deadline, so a request waits up to
    /// three deadlines while Redis is silent or down. One more when a counter is named with
    /// hits and then with more hits than its limit: that charge waits for the enforced calls,
    /// which decide the first at the count before it, as in memory.
    ///
    /// While Redis does not answer within the limiters' deadline, `policy` decides each
    /// descriptor of the calls it did not answer (on a Cluster, the calls to the node that is
    /// down; the other slots are decided by Redis):
    /// [`FailurePolicy::FailOpen`](crate::FailurePolicy::FailOpen) answers `OK` with the
    /// admission it makes (`limit_remaining` the whole limit, `duration_until_reset` 0: nothing
    /// is known of the count), `FailClosed` answers `OVER_LIMIT` (and the other calls give
    /// back), and `Fallback` decides in a local limiter at its share (given back there if
    /// another call rejects). envoyproxy/ratelimit answers a gRPC error instead and leaves the
    /// choice to the filter's `failure_mode_deny`; here the service chooses, so that `Fallback`
    /// is possible, and Envoy never sees an error from Redis.
    ///
    /// # Errors
    ///
    /// [`RlsConfigError::Invalid`] naming `prefix` for a prefix Redis keys cannot have (empty,
    /// over 256 bytes, or with `{` or `}`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::envoy::{RlsConfig, RlsService};
    /// use turnstile::redis::{aio::ConnectionManager, Client};
    /// use turnstile::FailurePolicy;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = ConnectionManager::new(Client::open("redis://127.0.0.1/")?).await?;
    /// let config = RlsConfig::from_files(["config/edge.yaml"])?;
    /// let service = RlsService::with_redis(config, connection, "ratelimit", FailurePolicy::FailOpen)?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    pub fn with_redis(
        config: RlsConfig,
        connection: crate::redis::aio::ConnectionManager,
        prefix: impl Into<String>,
        policy: crate::FailurePolicy,
    ) -> Result<Self, RlsConfigError> {
        let connection = super::remote::Connection::Standalone(connection);
        Self::with_remote(config, connection, prefix.into(), policy)
    }

    /// As [`with_redis`](RlsService::with_redis), counting in a Redis (or Valkey) Cluster
    /// through `connection`, as envoyproxy/ratelimit's `REDIS_TYPE=cluster` does.
    ///
    /// A counter's key has the descriptor's entries as its hash tag, so the counters of one
    /// request usually lie in different slots, on different masters, and the counters of all
    /// clients spread over the masters. A request is decided with one script per slot (and
    /// per cost), the slots in parallel, all or nothing across them by giving back: see
    /// [`with_redis`](RlsService::with_redis) for what that leaves open. Descriptors that
    /// share a slot (the same entries under a configured limit and a request's `limit`
    /// override, or entries whose tags collide) are decided in one script.
    ///
    /// redis-rs's cluster client resends a command after a connection error by default
    /// (`ClusterClientBuilder::retries`): a script whose reply was lost with the connection
    /// then runs twice, charging twice, or giving back twice (which hands out the hits again).
    /// Set the retries to 0 where that matters; the limiters' deadline bounds the time either
    /// way.
    ///
    /// # Errors
    ///
    /// As [`with_redis`](RlsService::with_redis).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::envoy::{RlsConfig, RlsService};
    /// use turnstile::redis::cluster::ClusterClient;
    /// use turnstile::FailurePolicy;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // Any node's address; the client discovers the others.
    /// let client = ClusterClient::builder(["redis://10.0.0.1:7000/"]).retries(0).build()?;
    /// let connection = client.get_async_connection().await?;
    /// let config = RlsConfig::from_files(["config/edge.yaml"])?;
    /// let service =
    ///     RlsService::with_redis_cluster(config, connection, "ratelimit", FailurePolicy::FailOpen)?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    pub fn with_redis_cluster(
        config: RlsConfig,
        connection: crate::redis::cluster_async::ClusterConnection,
        prefix: impl Into<String>,
        policy: crate::FailurePolicy,
    ) -> Result<Self, RlsConfigError> {
        let connection = super::remote::Connection::Cluster(connection);
        Self::with_remote(config, connection, prefix.into(), policy)
    }

    #[cfg(feature = "redis")]
    fn with_remote(
        config: RlsConfig,
        connection: super::remote::Connection,
        prefix: String,
        policy: crate::FailurePolicy,
    ) -> Result<Self, RlsConfigError> {
        let remote = super::remote::Remote::new(connection, prefix, policy)?;
        let limiters = remote.limiters(&config)?;
        Ok(RlsService {
            shared: Arc::new(Shared {
                clock: UnixClock::new(),
                state: RwLock::new(Arc::new(State {
                    config,
                    limiters: Vec::new(),
                    remote: limiters,
                    settings: Settings::default(),
                })),
                overrides: Mutex::new(HashMap::new()),
                remote: Some(remote),
            }),
        })
    }
}

impl<C: Clock + Clone> RlsService<C> {
    /// A service answering from `config`, on `clock` (a [`ManualClock`](crate::ManualClock) in
    /// tests). Windows are aligned to the clock's epoch.
    ///
    /// # Errors
    ///
    /// As [`new`](RlsService::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ManualClock;
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let clock = ManualClock::new();
    /// let service = RlsService::with_clock(RlsConfig::from_yaml_str("domain: edge\n")?, clock)?;
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn with_clock(config: RlsConfig, clock: C) -> Result<Self, RlsConfigError> {
        let limiters = build_limiters(&config, &clock, None)?;
        Ok(RlsService {
            shared: Arc::new(Shared {
                clock,
                state: RwLock::new(Arc::new(State {
                    config,
                    limiters,
                    #[cfg(feature = "redis")]
                    remote: Vec::new(),
                    settings: Settings::default(),
                })),
                overrides: Mutex::new(HashMap::new()),
                #[cfg(feature = "redis")]
                remote: None,
            }),
        })
    }

    /// Replaces the configuration. A limit found again at the same descriptor path (domain, keys
    /// and values) with the same unit keeps its counts, wherever it moved in the file and whatever
    /// its name; with other requests per unit, the new limit applies to them (as in Envoy's
    /// service, whose counters do not depend on the limit). Any other limit starts empty, as do
    /// limits whose composite paths are alike (key `a.b`, and `b` under `a`). Requests being
    /// decided finish on the configuration they started with. Limiters of request `limit` overrides
    /// are kept.
    ///
    /// # Errors
    ///
    /// As [`new`](RlsService::new); the old configuration then stays.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: a\n")?)?;
    /// service.reload(RlsConfig::from_yaml_str("domain: b\n")?)?;
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn reload(&self, config: RlsConfig) -> Result<(), RlsConfigError> {
        let mut slot = self
            .shared
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        #[cfg(feature = "redis")]
        if let Some(remote) = &self.shared.remote {
            let limiters = remote.limiters(&config)?;
            *slot = Arc::new(State {
                config,
                limiters: Vec::new(),
                remote: limiters,
                settings: slot.settings.clone(),
            });
            return Ok(());
        }
        let limiters = build_limiters(&config, &self.shared.clock, Some(&slot))?;
        *slot = Arc::new(State {
            config,
            limiters,
            #[cfg(feature = "redis")]
            remote: Vec::new(),
            settings: slot.settings.clone(),
        });
        Ok(())
    }

    /// Asks Envoy to add rate limit headers to its responses (`Some`, with their names), or not
    /// (`None`, the default): see [`ResponseHeaders`]. Kept across reloads.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{ResponseHeaders, RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: edge\n")?)?;
    /// service.set_response_headers(Some(ResponseHeaders::default()));
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn set_response_headers(&self, headers: Option<ResponseHeaders>) {
        self.update_settings(|s| s.headers = headers.map(Arc::new));
    }

    /// Turns the global shadow mode on or off (off by default), as envoyproxy/ratelimit's
    /// `SHADOW_MODE=true` does: every request is decided and counted exactly as it would be
    /// without it, and then, if it was over a limit, its overall answer is `OK` instead of
    /// `OVER_LIMIT`. Kept across reloads; requests being decided finish with the setting they
    /// started with.
    ///
    /// - The statuses are left as decided (a descriptor over its limit still reports
    ///   `OVER_LIMIT` with its `limit_remaining`), as Envoy's service leaves them, so that
    ///   Envoy lets the request through while its logs and the response headers (when
    ///   [enabled](Self::set_response_headers)) show what would have happened.
    /// - All or nothing still holds: the hits a request over one limit took from the others
    ///   are given back. Envoy's service charges every descriptor, shadow mode or not; here
    ///   turning the mode on or off never changes what is counted, only the answer.
    /// - With the feature `metrics`, `turnstile_envoy_global_shadow_mode`, labelled by
    ///   `domain`, counts the requests whose answer the mode turned into `OK` (the per-limit
    ///   counters count as without the mode).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::proto::{Code, Entry, RateLimitDescriptor, RateLimitRequest};
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str(
    ///     "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 0 }\n",
    /// )?)?;
    /// service.set_global_shadow_mode(true);
    /// let request = RateLimitRequest {
    ///     domain: "d".into(),
    ///     descriptors: vec![RateLimitDescriptor {
    ///         entries: vec![Entry { key: "k".into(), value: "v".into() }],
    ///         ..Default::default()
    ///     }],
    ///     hits_addend: 0,
    /// };
    /// let response = service.should_rate_limit(&request)?;
    /// assert_eq!(response.overall_code(), Code::Ok);
    /// assert_eq!(response.statuses[0].code(), Code::OverLimit);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_global_shadow_mode(&self, on: bool) {
        self.update_settings(|s| s.global_shadow_mode = on);
    }

    /// The service with the global shadow mode on or off, to set it as the service is made:
    /// see [`set_global_shadow_mode`](Self::set_global_shadow_mode).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: d\n")?)?
    ///     .with_global_shadow_mode(true);
    /// assert!(service.global_shadow_mode());
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    #[must_use]
    pub fn with_global_shadow_mode(self, on: bool) -> Self {
        self.set_global_shadow_mode(on);
        self
    }

    /// Sets the near-limit ratio, envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` (default
    /// [`DEFAULT_NEAR_LIMIT_RATIO`], 0.8): with the feature `metrics`, the hits of a limit past
    /// `floor(requests_per_unit × ratio)` (in single precision, as in Envoy's service) up to the
    /// limit count in `turnstile_envoy_near_limit`. It changes no decision. Kept across reloads.
    ///
    /// # Errors
    ///
    /// [`RlsConfigError::InvalidSetting`] naming `near_limit_ratio` for a ratio that is not a
    /// number from 0 to 1 (NaN, infinite, negative or over 1); the ratio set before stays.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: d\n")?)?;
    /// service.set_near_limit_ratio(0.9)?;
    /// assert_eq!(service.near_limit_ratio(), 0.9);
    /// assert!(service.set_near_limit_ratio(1.5).is_err());
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn set_near_limit_ratio(&self, ratio: f32) -> Result<(), RlsConfigError> {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(RlsConfigError::InvalidSetting {
                setting: "near_limit_ratio".to_owned(),
                message: format!("must be a number from 0 to 1, not {ratio}"),
            });
        }
        self.update_settings(|s| s.near_limit_ratio = ratio);
        Ok(())
    }

    /// The service with the near-limit ratio `ratio`, to set it as the service is made: see
    /// [`set_near_limit_ratio`](Self::set_near_limit_ratio).
    ///
    /// # Errors
    ///
    /// As [`set_near_limit_ratio`](Self::set_near_limit_ratio).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: d\n")?)?
    ///     .with_near_limit_ratio(0.5)?;
    /// assert_eq!(service.near_limit_ratio(), 0.5);
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn with_near_limit_ratio(self, ratio: f32) -> Result<Self, RlsConfigError> {
        self.set_near_limit_ratio(ratio)?;
        Ok(self)
    }

    /// The near-limit ratio: see [`set_near_limit_ratio`](Self::set_near_limit_ratio).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService, DEFAULT_NEAR_LIMIT_RATIO};
    ///
    /// let service = RlsService::new(RlsConfig::default())?;
    /// assert_eq!(service.near_limit_ratio(), DEFAULT_NEAR_LIMIT_RATIO);
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn near_limit_ratio(&self) -> f32 {
        self.state().settings.near_limit_ratio
    }

    /// Whether the global shadow mode is on: see
    /// [`set_global_shadow_mode`](Self::set_global_shadow_mode).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: d\n")?)?;
    /// assert!(!service.global_shadow_mode());
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn global_shadow_mode(&self) -> bool {
        self.state().settings.global_shadow_mode
    }

    /// Marks the service as draining, or not (the default), as envoyproxy/ratelimit marks
    /// itself on SIGTERM: while it drains, [`is_healthy`](Self::is_healthy) is `false` and the
    /// [`/healthcheck`](super::JsonService) endpoint answers `500` with no body, so that load
    /// balancers and probes stop sending to it. Decisions go on as before (gRPC and `/json`),
    /// for the requests still arriving. Kept across reloads.
    ///
    /// A library cannot take the process's signals: call this from the server's SIGTERM
    /// handler, before the grace period that lets the load balancers notice.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: d\n")?)?;
    /// service.set_draining(true);
    /// assert!(!service.is_healthy());
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn set_draining(&self, on: bool) {
        self.update_settings(|s| s.draining = on);
    }

    /// Makes the health check fail while the configuration has no domain (`on`), as
    /// envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true` does; off by
    /// default, when a service with no domain is healthy. Each [`reload`](Self::reload) that
    /// succeeds decides again from the configuration it loads; one that fails changes nothing.
    /// Kept across reloads.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::default())?;
    /// service.set_healthy_with_at_least_one_config_loaded(true);
    /// assert!(!service.is_healthy());
    /// service.reload(RlsConfig::from_yaml_str("domain: d\n")?)?;
    /// assert!(service.is_healthy());
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn set_healthy_with_at_least_one_config_loaded(&self, on: bool) {
        self.update_settings(|s| s.require_domain = on);
    }

    /// Whether the service is healthy, as the `/healthcheck` endpoint answers: not
    /// [draining](Self::set_draining), and holding a domain if
    /// [required](Self::set_healthy_with_at_least_one_config_loaded).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::default())?;
    /// assert!(service.is_healthy());
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn is_healthy(&self) -> bool {
        let state = self.state();
        let s = &state.settings;
        let lacks_domain = s.require_domain && state.config.domains().next().is_none();
        !(s.draining || lacks_domain)
    }

    /// Replaces the state with one whose settings `change` changed.
    fn update_settings(&self, change: impl FnOnce(&mut Settings)) {
        let mut slot = self
            .shared
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut settings = slot.settings.clone();
        change(&mut settings);
        *slot = Arc::new(State {
            config: slot.config.clone(),
            limiters: slot.limiters.clone(),
            #[cfg(feature = "redis")]
            remote: slot.remote.clone(),
            settings,
        });
    }

    fn state(&self) -> Arc<State<C>> {
        Arc::clone(
            &self
                .shared
                .state
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Decides one `ShouldRateLimit` request (what the gRPC service calls), as described on
    /// [`RlsService`]. Never blocks on the limiters (a read lock on the configuration only).
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for an empty domain or an empty descriptor list.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::proto::{Code, RateLimitRequest};
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::default())?;
    /// let err = service.should_rate_limit(&RateLimitRequest::default()).unwrap_err();
    /// assert_eq!(err.code(), tonic::Code::InvalidArgument);
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        validate(request)?;
        #[cfg(feature = "redis")]
        if self.shared.remote.is_some() {
            return Err(tonic::Status::failed_precondition(
                "this service counts in Redis: decide with `RlsService::decide`",
            ));
        }
        let state = self.state();
        let applied = resolve(&state.config, &state.limiters, request, |domain, o| {
            self.override_limit(domain, o)
        });

        let now = self.shared.clock.now();
        let mut rejected = false;
        let mut outcomes: Vec<Option<Outcome<C>>> = applied.iter().map(|_| None).collect();
        // Checks (0 hits) first, as in Redis: a check reads the count as it was before the
        // request, not after the hits of a descriptor before it on the same counter.
        let hits: Vec<u64> = (request.descriptors.iter())
            .map(|d| hits_of(request, d))
            .collect();
        // Shadow descriptors with hits last, once the request's fate is known: on an admitted
        // one, each counts its hits past the limit when it is over, as an enforced one does (and
        // as Envoy's service counts them: shadow mode changes only the answer), so that it
        // measures what enforcing it would do, and a shadow counter named twice meets, the
        // second time, the hits the first counted (as in Redis and in Envoy's service, which
        // count in order). On a rejected request (in Redis its shadow descriptors are not
        // asked) nothing of theirs is counted: those within the limit are given back below,
        // as every other descriptor's hits.
        let shadow =
            |i: usize| matches!(&applied[i], Applied::Limit { spec, .. } if spec.shadow_mode());
        let order: Vec<usize> = (0..hits.len())
            .filter(|&i| hits[i] == 0)
            .chain((0..hits.len()).filter(|&i| hits[i] > 0 && !shadow(i)))
            .chain((0..hits.len()).filter(|&i| hits[i] > 0 && shadow(i)))
            .collect();
        for i in order {
            let (a, d, hits) = (&applied[i], &request.descriptors[i], hits[i]);
            let outcome = match a {
                Applied::Nothing => Outcome::Nothing,
                Applied::Unlimited(_) => Outcome::Unlimited,
                Applied::Limit {
                    spec,
                    limiter,
                    shared,
                } => {
                    let entries = counter_entries(&d.entries, shared);
                    // Decided after every enforced descriptor (`order`): `rejected` is final.
                    let o = decide(
                        limiter.as_ref(),
                        &entries,
                        hits,
                        (spec.unit(), now),
                        !spec.shadow_mode() || !rejected,
                    );
                    if matches!(o, Outcome::Over { .. }) && !spec.shadow_mode() {
                        rejected = true;
                    }
                    // Counted as this descriptor decided, whatever the others decide.
                    let limit = spec.requests_per_unit();
                    let (before, over) = match &o {
                        Outcome::Admitted(taken) => (
                            u64::from(limit.saturating_sub(taken.admission().remaining()))
                                .saturating_sub(hits),
                            false,
                        ),
                        Outcome::Over { left, .. } => {
                            (u64::from(limit.saturating_sub(*left)), true)
                        }
                        _ => (0, false),
                    };
                    let decision = Decision {
                        limit,
                        before,
                        hits,
                        over,
                        shadow: spec.shadow_mode(),
                        near_ratio: state.settings.near_limit_ratio,
                    };
                    spec.count(&request.domain, &entries, !shared.is_empty(), decision);
                    o
                }
            };
            outcomes[i] = Some(outcome);
        }

        if rejected {
            // All or nothing: every admitted descriptor's hits given back before any status
            // reads its counter, so that a counter named twice reads the count with both
            // occurrences given back, not the first with the second's hits still held.
            for outcome in outcomes.iter_mut().flatten() {
                *outcome = match std::mem::replace(outcome, Outcome::Nothing) {
                    Outcome::Admitted(taken) => {
                        let (admission, key) = (taken.admission(), taken.key().clone());
                        taken.refund();
                        Outcome::GivenBack { admission, key }
                    }
                    other => other,
                };
            }
        }
        let mut statuses = Vec::with_capacity(outcomes.len());
        for (outcome, a) in outcomes.into_iter().flatten().zip(&applied) {
            let current_limit = match a {
                Applied::Limit { spec, .. } => Some(spec.proto()),
                _ => None,
            };
            let shadow = matches!(a, Applied::Limit { spec, .. } if spec.shadow_mode());
            let status = match outcome {
                Outcome::Nothing => status(Code::Ok, None, 0, None),
                Outcome::Unlimited => status(Code::Ok, None, u32::MAX, None),
                Outcome::Admitted(taken) => {
                    let admission = taken.admission();
                    status(
                        Code::Ok,
                        current_limit,
                        admission.remaining(),
                        Some(admission.reset_after()),
                    )
                }
                Outcome::GivenBack { admission, key } => {
                    let remaining = match a {
                        Applied::Limit {
                            limiter: Some(l), ..
                        } => l.available(&key),
                        _ => admission.remaining(),
                    };
                    status(
                        Code::Ok,
                        current_limit,
                        remaining,
                        Some(admission.reset_after()),
                    )
                }
                Outcome::Within { remaining, reset } => {
                    status(Code::Ok, current_limit, remaining, Some(reset))
                }
                Outcome::Over { reset, .. } => status(
                    if shadow { Code::Ok } else { Code::OverLimit },
                    current_limit,
                    0,
                    Some(reset),
                ),
            };
            statuses.push(status);
        }
        let mut response = RateLimitResponse {
            overall_code: if rejected { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        };
        state.settings.finish(&request.domain, &mut response);
        Ok(response)
    }

    /// Decides one `ShouldRateLimit` request wherever the counters are: in memory as
    /// [`should_rate_limit`](Self::should_rate_limit), in Redis (a service made by
    /// `with_redis`, feature `redis`) with the round trips that describes. The gRPC service
    /// calls this.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for an empty domain or an empty descriptor list.
    ///
    /// # Cancel safety
    ///
    /// In memory it completes at its first poll. In Redis, dropping the future leaves no local
    /// state behind, but a script already sent may still run and take the hits (as with
    /// `RedisLimiter::try_acquire_n`); dropped while
    /// the calls of a rejected request give back, some hits may stay charged.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::proto::{Code, Entry, RateLimitDescriptor, RateLimitRequest};
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: d\n")?)?;
    /// let request = RateLimitRequest {
    ///     domain: "d".into(),
    ///     descriptors: vec![RateLimitDescriptor {
    ///         entries: vec![Entry { key: "k".into(), value: "v".into() }],
    ///         ..Default::default()
    ///     }],
    ///     hits_addend: 0,
    /// };
    /// assert_eq!(service.decide(&request).await?.overall_code(), Code::Ok);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn decide(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        #[cfg(feature = "redis")]
        if let Some(remote) = &self.shared.remote {
            validate(request)?;
            let state = self.state();
            let now = self.shared.clock.now();
            let near_ratio = state.settings.near_limit_ratio;
            let mut response = remote
                .decide(&state.config, &state.remote, request, now, near_ratio)
                .await;
            state.settings.finish(&request.domain, &mut response);
            return Ok(response);
        }
        self.should_rate_limit(request)
    }

    fn override_limit(
        &self,
        domain: &str,
        o: RateLimitOverride,
    ) -> Option<Applied<'static, Limiter<C>>> {
        override_applied(&self.shared.overrides, domain, o, |limit, _, window| {
            fixed_window(limit, window, &self.shared.clock).ok()
        })
    }
}

/// Distinct overrides, each with its limiter and counters: (domain, requests per unit, unit).
pub(super) type Overrides<L> = Mutex<HashMap<(String, u32, Unit), (L, Arc<Counters>)>>;

/// The `limit` label of an override's counters.
fn override_label(requests_per_unit: u32, unit: Unit) -> String {
    format!(
        "override:{requests_per_unit}/{}",
        format!("{unit:?}").to_ascii_lowercase()
    )
}

/// What Envoy's `limit` override `o` applies for `domain`: its limiter, found among
/// `overrides` or made by `make(requests per unit, unit, window)` while there are fewer than
/// [`MAX_OVERRIDE_LIMITS`]; `None` (the configured limit applies) for an unknown unit, past the
/// cap, or when `make` fails. `requests_per_unit: 0` needs no limiter: everything is over.
pub(super) fn override_applied<L: Clone>(
    overrides: &Overrides<L>,
    domain: &str,
    o: RateLimitOverride,
    make: impl FnOnce(u32, Unit, Duration) -> Option<L>,
) -> Option<Applied<'static, L>> {
    let unit = Unit::try_from(o.unit).ok()?;
    let window = unit.duration()?;
    let label = || override_label(o.requests_per_unit, unit);
    if o.requests_per_unit == 0 {
        // No limiter to keep them with: made per request (an override of 0 is rare).
        return Some(Applied::Limit {
            spec: Spec::Override {
                requests_per_unit: 0,
                unit,
                counters: Arc::new(Counters::new(domain, &label())),
            },
            limiter: None,
            shared: Vec::new(),
        });
    }
    let mut overrides = overrides.lock().unwrap_or_else(PoisonError::into_inner);
    let id = (domain.to_owned(), o.requests_per_unit, unit);
    let (limiter, counters) = match overrides.get(&id) {
        Some((l, c)) => (l.clone(), Arc::clone(c)),
        None if overrides.len() >= MAX_OVERRIDE_LIMITS => return None,
        None => {
            let l = make(o.requests_per_unit, unit, window)?;
            let c = Arc::new(Counters::new(domain, &label()));
            overrides.insert(id, (l.clone(), Arc::clone(&c)));
            (l, c)
        }
    };
    Some(Applied::Limit {
        spec: Spec::Override {
            requests_per_unit: o.requests_per_unit,
            unit,
            counters,
        },
        limiter: Some(limiter),
        shared: Vec::new(),
    })
}

pub(super) enum Spec<'a> {
    Configured(&'a LimitSpec),
    Override {
        requests_per_unit: u32,
        unit: Unit,
        counters: Arc<Counters>,
    },
}

impl Spec<'_> {
    /// Counts one decision of this limit for a descriptor with `entries` (as counted, wildcards
    /// shared) in `domain`: in the counters built with the limit, or, with `detailed_metric`,
    /// in counters labelled by the entries, made now. `shared`: a `share_threshold` wildcard
    /// named some of the entries.
    pub(super) fn count(&self, domain: &str, entries: &[Entry], shared: bool, decision: Decision) {
        match self {
            // Without the feature nothing counts: no label to build.
            Spec::Configured(s) if s.detailed_metric && cfg!(feature = "metrics") => {
                Counters::new(domain, &detailed_label(domain, entries, shared)).count(decision);
            }
            Spec::Configured(s) => s.counters.count(decision),
            Spec::Override { counters, .. } => counters.count(decision),
        }
    }

    pub(super) fn requests_per_unit(&self) -> u32 {
        match self {
            Spec::Configured(s) => s.requests_per_unit,
            Spec::Override {
                requests_per_unit, ..
            } => *requests_per_unit,
        }
    }

    pub(super) fn unit(&self) -> Unit {
        match self {
            Spec::Configured(s) => s.unit,
            Spec::Override { unit, .. } => *unit,
        }
    }

    pub(super) fn shadow_mode(&self) -> bool {
        match self {
            Spec::Configured(s) => s.shadow_mode,
            Spec::Override { .. } => false,
        }
    }

    pub(super) fn proto(&self) -> RateLimit {
        match self {
            Spec::Configured(s) => RateLimit {
                name: s.name.clone(),
                requests_per_unit: s.requests_per_unit,
                unit: s.unit as i32,
            },
            Spec::Override {
                requests_per_unit,
                unit,
                ..
            } => RateLimit {
                name: String::new(),
                requests_per_unit: *requests_per_unit,
                unit: *unit as i32,
            },
        }
    }
}

pub(super) enum Applied<'a, L> {
    Nothing,
    /// An unlimited limit, with the names it `replaces` (which apply, as in Envoy's service).
    Unlimited(&'a [String]),
    Limit {
        spec: Spec<'a>,
        /// `None` when `requests_per_unit` is 0.
        limiter: Option<L>,
        /// Entries counted as the wildcard they matched (`share_threshold`).
        shared: Vec<(usize, String)>,
    },
}

/// The entries a descriptor's counter is named by: its own, less the values a
/// `share_threshold` wildcard stands for.
pub(super) fn counter_entries<'e>(
    entries: &'e [Entry],
    shared: &[(usize, String)],
) -> Cow<'e, [Entry]> {
    if shared.is_empty() {
        return Cow::Borrowed(entries);
    }
    let mut owned = entries.to_vec();
    for (i, pattern) in shared {
        if let Some(e) = owned.get_mut(*i) {
            e.value.clone_from(pattern);
        }
    }
    Cow::Owned(owned)
}

/// Checks what Envoy's service checks of every request.
pub(super) fn validate(request: &RateLimitRequest) -> Result<(), tonic::Status> {
    if request.domain.is_empty() {
        return Err(tonic::Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if request.descriptors.is_empty() {
        return Err(tonic::Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    Ok(())
}

/// A descriptor's cost: its own `hits_addend` if set (0 only checks), else the request's
/// (0 meaning 1).
pub(super) fn hits_of(request: &RateLimitRequest, d: &RateLimitDescriptor) -> u64 {
    match d.hits_addend {
        Some(h) => h.value,
        None => u64::from(request.hits_addend.max(1)),
    }
}

/// What applies to each descriptor of `request`: its override (through `override_limit`), else
/// the configured limit it matches (with `counters[i]` counting configured limit `i`), less the
/// limits another matched limit `replaces`.
pub(super) fn resolve<'s, L: Clone>(
    config: &'s RlsConfig,
    counters: &[Option<L>],
    request: &RateLimitRequest,
    mut override_limit: impl FnMut(&str, RateLimitOverride) -> Option<Applied<'static, L>>,
) -> Vec<Applied<'s, L>> {
    let known = config.has_domain(&request.domain);
    let mut applied: Vec<Applied<'s, L>> = request
        .descriptors
        .iter()
        .map(|d| {
            if !known {
                return Applied::Nothing;
            }
            if let Some(o) = d.limit
                && let Some(applied) = override_limit(&request.domain, o)
            {
                return applied;
            }
            match config.find(&request.domain, &d.entries) {
                None => Applied::Nothing,
                Some(found) => {
                    let spec = &config.limits()[found.limit];
                    if spec.unlimited {
                        Applied::Unlimited(&spec.replaces)
                    } else {
                        Applied::Limit {
                            spec: Spec::Configured(spec),
                            limiter: counters.get(found.limit).cloned().flatten(),
                            shared: found.shared,
                        }
                    }
                }
            }
        })
        .collect();
    let replaced: HashSet<&str> = applied
        .iter()
        .filter_map(|a| match a {
            Applied::Limit {
                spec: Spec::Configured(s),
                ..
            } => Some(s.replaces.iter().map(String::as_str)),
            Applied::Unlimited(replaces) => Some(replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    if !replaced.is_empty() {
        for a in &mut applied {
            if let Applied::Limit {
                spec: Spec::Configured(s),
                ..
            } = a
                && !s.name.is_empty()
                && replaced.contains(s.name.as_str())
            {
                *a = Applied::Nothing;
            }
        }
    }
    applied
}

enum Outcome<C: Clock + Clone> {
    Nothing,
    Unlimited,
    Admitted(KeyedRefundable<Key, C, Hasher>),
    /// Admitted, then given back (another descriptor rejected the request): the admission,
    /// and the counter's key, read once every descriptor has given back.
    GivenBack {
        admission: crate::Admission,
        key: Key,
    },
    /// Under the limit without taking anything (a check with 0 hits).
    Within {
        remaining: u32,
        reset: Duration,
    },
    /// Over the limit (its hits counted past it, see `decide`): `left` is what the count left
    /// before them, for the metrics; the status says 0.
    Over {
        left: u32,
        reset: Duration,
    },
}

/// Time left in the window of `unit` that holds `now`.
pub(super) fn window_left(unit: Unit, now: u64) -> Duration {
    let w = unit
        .duration()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .unwrap_or(1)
        .max(1);
    Duration::from_nanos(w - now % w)
}

/// One descriptor's decision: `hits` on the counter of `entries` in `limiter` (`None`: a
/// limit of 0), in the window of `unit` that holds `now`. Hits over the limit are counted all
/// the same when `count_over` (an enforced descriptor, or a shadow one of a request known to be
/// admitted).
fn decide<C: Clock + Clone>(
    limiter: Option<&Limiter<C>>,
    entries: &[Entry],
    hits: u64,
    (unit, now): (Unit, u64),
    count_over: bool,
) -> Outcome<C> {
    let reset = window_left(unit, now);
    let Some(limiter) = limiter else {
        // `requests_per_unit: 0`: any hit is over, and so is a check (as one hit would be).
        return Outcome::Over { left: 0, reset };
    };
    let key: Key = entries.to_vec();
    if hits == 0 {
        // A check answers as one hit would, counting nothing: over once the count has reached
        // the limit (past it, after hits counted over it). `available` adds no key.
        return match limiter.available(&key) {
            0 => Outcome::Over { left: 0, reset },
            remaining => Outcome::Within { remaining, reset },
        };
    }
    let Ok(n) = u32::try_from(hits) else {
        // More hits than any limit holds (a limit of `u32::MAX` too, which `u32::MAX` hits
        // would fit): over, and counted past the limit as below, the charge saturating.
        let left = limiter.available(&key);
        if count_over {
            // Fails only at the key cap, as below: over all the same.
            let _ = limiter.charge(&key, u32::MAX);
        }
        return Outcome::Over { left, reset };
    };
    match limiter.try_acquire_refundable(&key, n) {
        Ok(taken) => Outcome::Admitted(taken),
        Err(error) => {
            // What the count left before these hits, for the metrics. One hit rejected: none
            // (a fixed window rejects only a full count), so the flood of single hits a limit
            // exists for is answered without a second look-up.
            let left = match error {
                TryAcquireError::Rejected(_) if n == 1 => 0,
                _ => limiter.available(&key),
            };
            // Over: the hits count all the same, past the limit, as Envoy's service counts
            // them (more than the limit, or a cost reported after the fact that is more than
            // what is left, included): the checks and hits after it are over until the
            // window ends. The key cap reached with no idle key: over as well (fail closed),
            // with nothing counted.
            if count_over
                && matches!(
                    error,
                    TryAcquireError::Rejected(_) | TryAcquireError::InsufficientCapacity { .. }
                )
            {
                // Fails only at the key cap (the key evicted meanwhile, the cap full of busy
                // keys): the request is over all the same.
                let _ = limiter.charge(&key, n);
            }
            Outcome::Over {
                left,
                reset: match error {
                    TryAcquireError::Rejected(r) => r.retry_after(),
                    _ => reset,
                },
            }
        }
    }
}

pub(super) fn status(
    code: Code,
    current_limit: Option<RateLimit>,
    limit_remaining: u32,
    reset: Option<Duration>,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining,
        duration_until_reset: reset.map(|d| ProtoDuration::from(whole_seconds(d))),
    }
}

/// `d` rounded up to whole seconds: envoyproxy/ratelimit reads Unix time in seconds, so its
/// `duration_until_reset` is the unit's seconds less the whole seconds into the window, which
/// is the exact time left rounded up.
fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0)))
}

fn fixed_window<C: Clock + Clone>(
    limit: u32,
    window: Duration,
    clock: &C,
) -> Result<Limiter<C>, crate::ConfigError> {
    KeyedLimiter::builder(Algorithm::FixedWindow { limit, window })
        .clock(clock.clone())
        .hasher(Hasher::default())
        .build()
}

fn build_limiters<C: Clock + Clone>(
    config: &RlsConfig,
    clock: &C,
    old: Option<&State<C>>,
) -> Result<Vec<Option<Limiter<C>>>, RlsConfigError> {
    // A limit's counters are identified as Envoy's are: by domain, descriptor path and unit (its
    // window), not by its requests per unit. A composite path can name two limits (key `a.b`, and
    // key `b` under key `a`, are both `.a.b`): such a path identifies neither, so its limits start
    // empty rather than share (and reconfigure) one limiter.
    // Per identity: the old limiter and its requests per unit; `None` once the identity is
    // seen twice.
    type Kept<'a, C> = HashMap<(&'a str, Unit), Option<(&'a Limiter<C>, u32)>>;
    let mut kept: Kept<'_, C> = HashMap::new();
    if let Some(old) = old {
        for (s, l) in old.config.limits().iter().zip(&old.limiters) {
            if let Some(l) = l {
                kept.entry((s.path.as_str(), s.unit))
                    .and_modify(|k| *k = None)
                    .or_insert(Some((l, s.requests_per_unit)));
            }
        }
    }
    let mut new_paths: HashMap<(&str, Unit), usize> = HashMap::new();
    for s in config.limits() {
        *new_paths.entry((s.path.as_str(), s.unit)).or_default() += 1;
    }
    let invalid = |s: &LimitSpec, e: crate::ConfigError| RlsConfigError::Invalid {
        source: "configuration".to_owned(),
        field: s.path.clone(),
        message: e.to_string(),
    };
    let mut limiters = Vec::with_capacity(config.limits().len());
    let mut changed = Vec::new();
    for s in config.limits() {
        if s.unlimited || s.requests_per_unit == 0 {
            limiters.push(None);
            continue;
        }
        let window = s.unit.duration().unwrap_or(Duration::from_secs(1));
        let id = (s.path.as_str(), s.unit);
        let unique = new_paths.get(&id) == Some(&1);
        match kept.get(&id).copied().flatten().filter(|_| unique) {
            Some((l, old_limit)) => {
                if old_limit != s.requests_per_unit {
                    changed.push((s, l, window));
                }
                limiters.push(Some(l.clone()));
            }
            None => limiters.push(Some(
                fixed_window(s.requests_per_unit, window, clock).map_err(|e| invalid(s, e))?,
            )),
        }
    }
    // Last, once nothing else can fail: a new limit in the same window keeps the counts.
    for (s, l, window) in changed {
        l.reconfigure(Algorithm::FixedWindow {
            limit: s.requests_per_unit,
            window,
        })
        .map_err(|e| invalid(s, e))?;
    }
    Ok(limiters)
}

impl<C: Clock + Clone> tonic::server::NamedService for RlsService<C> {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// The unary method, as tonic's server runs it.
struct ShouldRateLimit<C: Clock + Clone>(RlsService<C>);

impl<C: Clock + Clone> tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit<C> {
    type Response = RateLimitResponse;
    type Future = Pin<
        Box<dyn Future<Output = Result<tonic::Response<RateLimitResponse>, tonic::Status>> + Send>,
    >;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            service
                .decide(request.get_ref())
                .await
                .map(tonic::Response::new)
        })
    }
}

/// gRPC's health checking protocol (`grpc.health.v1.Health`) for an [`RlsService`], as
/// envoyproxy/ratelimit serves it on its gRPC port, so that Envoy's gRPC health checks (and
/// `grpc_health_probe`) of the rate limit cluster keep working: mount it beside the service
/// with `Server::builder().add_service(service.clone()).add_service(service.health_service())`.
///
/// `Check` answers for [`HEALTH_SERVICE_NAME`] (`ratelimit`) whether the service
/// [is healthy](RlsService::is_healthy) (`SERVING`, or `NOT_SERVING` while it drains or lacks
/// a required domain), for `""` (the server as a whole) `SERVING`, as envoyproxy/ratelimit
/// does, and `NOT_FOUND` for any other name. `Watch` is not served (`UNIMPLEMENTED`).
///
/// # Examples
///
/// ```
/// use turnstile::envoy::{RlsConfig, RlsService};
///
/// let service = RlsService::new(RlsConfig::from_yaml_str("domain: edge\n")?)?;
/// let health = service.health_service();
/// // tonic::transport::Server::builder().add_service(service).add_service(health)
/// # Ok::<(), turnstile::envoy::RlsConfigError>(())
/// ```
pub struct HealthService<C: Clock + Clone = UnixClock> {
    service: RlsService<C>,
}

impl<C: Clock + Clone> Clone for HealthService<C> {
    fn clone(&self) -> Self {
        HealthService {
            service: self.service.clone(),
        }
    }
}

impl<C: Clock + Clone> std::fmt::Debug for HealthService<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthService")
            .field("service", &self.service)
            .finish()
    }
}

impl<C: Clock + Clone> RlsService<C> {
    /// gRPC's health checking protocol for this service: see [`HealthService`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: edge\n")?)?;
    /// let health = service.health_service();
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn health_service(&self) -> HealthService<C> {
        HealthService {
            service: self.clone(),
        }
    }
}

impl<C: Clock + Clone> tonic::server::NamedService for HealthService<C> {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl<C, B> tower::Service<http::Request<B>> for HealthService<C>
where
    C: Clock + Clone,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync + 'static>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() == HEALTH_CHECK_PATH {
            let method = HealthCheck(self.service.clone());
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(method, request).await)
            })
        } else {
            Box::pin(
                async move { Ok(tonic::Status::unimplemented("only Check is served").into_http()) },
            )
        }
    }
}

/// `grpc.health.v1.Health/Check`, as envoyproxy/ratelimit's health server answers it.
struct HealthCheck<C: Clock + Clone>(RlsService<C>);

impl<C: Clock + Clone> tonic::server::UnaryService<HealthCheckRequest> for HealthCheck<C> {
    type Response = HealthCheckResponse;
    type Future = std::future::Ready<Result<tonic::Response<HealthCheckResponse>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<HealthCheckRequest>) -> Self::Future {
        let status = match request.get_ref().service.as_str() {
            "" => ServingStatus::Serving,
            HEALTH_SERVICE_NAME if self.0.is_healthy() => ServingStatus::Serving,
            HEALTH_SERVICE_NAME => ServingStatus::NotServing,
            _ => return std::future::ready(Err(tonic::Status::not_found("unknown service"))),
        };
        std::future::ready(Ok(tonic::Response::new(HealthCheckResponse {
            status: status as i32,
        })))
    }
}

impl<C, B> tower::Service<http::Request<B>> for RlsService<C>
where
    C: Clock + Clone,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync + 'static>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() == SHOULD_RATE_LIMIT_PATH {
            let method = ShouldRateLimit(self.clone());
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(method, request).await)
            })
        } else {
            Box::pin(async move {
                Ok(
                    tonic::Status::unimplemented("no such method on the rate limit service")
                        .into_http(),
                )
            })
        }
    }
}
