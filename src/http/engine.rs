//! [`HttpLimiter`]: the compiled rules, and how it decides a request (documented on
//! [`HttpLimiter`] itself, where users of the crate read it).

use crate::http::config::{HttpConfig, KeyOverflowPolicy, MissingKey, RuleKey};
use crate::http::layer::{Answered, Decision, Sealed};
use crate::http::rules::{
    BanKey, Bans, Compiler, CounterKey, Identity, LocalName, Metric, Rule, RuleSet, WaitSlot,
    parse_header,
};
use crate::http::{
    Check, HttpConfigError, LayerPolicy, LayerSettings, Outcome, QuotaState, Quotas,
    RateLimitLayer, RejectReason, RequestInfo, Verdict, client_ip,
};
use crate::{AcquireError, Clock, MonotonicClock, TryAcquireError};
use arc_swap::ArcSwap;
use compact_str::CompactString;
use smallvec::SmallVec;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

/// Counts a rejection by a list no rule names (`"blocklist"`, `"ban"`) in the `metrics` facade:
/// literals, so the key is a static one.
macro_rules! count_list_rejection {
    ($list:literal) => {{
        #[cfg(feature = "metrics")]
        metrics::counter!("turnstile_http_rejected", "rule" => $list).increment(1);
    }};
}

/// The configured rules, limiters and bans of the HTTP layer.
///
/// Its limiters read [`MonotonicClock`] unless given another with
/// [`with_clock`](HttpLimiter::with_clock): an HTTP decision takes about a microsecond, beside
/// which `Instant`'s ~27 ns is small, while the default [`UpkeepClock`](crate::UpkeepClock)'s
/// thread, woken every millisecond while requests keep coming, costs 2–5% of a core on a VM
/// at any request rate (ARCHITECTURE.md, "The HTTP layer's clock").
///
/// # Semantics
///
/// In this order, for each request:
///
/// 0. **The request as the rules see it.** Its path with RFC 3986's normalizations that change
///    no resource, and without its trailing `/` with `trim_trailing_slash`; when escapes are
///    left (`%2F`, non-ASCII) or it has empty or `.` segments (`//`, `/./`), the rules of step
///    4 also match it, and count it, as a handler reads it, every escape decoded, and as a file
///    server resolves it, those segments dropped (whitelists match the first form only); a
///    client id that is
///    empty or longer than `client_id_max_len` is none, and none is `anonymous_client_id` when
///    that is set.
/// 1. **Whitelists.** A client IP in `whitelist.ips` (addresses or CIDR ranges), a client id in
///    `whitelist.clients`, or a request matching a pattern of `whitelist.endpoints` is
///    [`Outcome::Whitelisted`]: no rule is consulted or charged. A request matching an entry
///    of `whitelist.by_key` is exempt from the rules counting by that entry's key only (step
///    4 leaves them out); the blocklist and bans still apply to it, and if no other rule
///    applies it is [`Outcome::Whitelisted`] as well.
/// 2. **Blocklist.** A client IP in `blocklist.ips` or a client id in `blocklist.clients` is
///    rejected with [`RejectReason::Blocked`] (rule `"blocklist"`).
///
///    The client IP is the client's group when `client_ip` groups addresses (`ipv6_prefix =
///    64`), so list and `ip_rules` entries are whole groups: one inside a group is refused at
///    load, as it would match no request.
/// 3. **Bans.** A banned client (by IP, or by client id when the IP is unknown) is rejected with
///    [`RejectReason::Banned`] (rule `"ban"`), `retry_after` being the time the ban has left.
/// 4. **Matching rules**, as AspNetCoreRateLimit matches them. A rule applies when its endpoint
///    pattern matches the request: `*` always; `verb:/path` or `*:/path` when the method (or any
///    method) and the path match, case-insensitively, `*` in the path matching any run of
///    characters and `?` any one; with `regex = true` or a `re:` prefix the path part is a
///    regular expression that must match the whole path. A `HEAD` request matches `get:`
///    patterns too and counts as `GET` for `per_endpoint`: axum serves it with the `GET`
///    handler, which a `HEAD` must not reach unlimited. Likewise a method in lower case (`get`)
///    counts as the upper-case one, as patterns match it. With `endpoint_rate_limiting = false`
///    only `*` rules apply.
///    Rules are grouped by period and counter key (`key` and `per_endpoint`): rules that count
///    different things never displace each other, so that a client cannot step around a limit
///    on its IP by changing its client id (AspNetCoreRateLimit's IP and client middlewares
///    likewise apply their rules independently). Within a group, specific rules (the
///    `ip_rules` whose range contains the client IP, the `client_rules` of the client id) take
///    precedence: a general rule applies only if no specific rule of its group applies. Of the
///    rules left, per group, the most restrictive (lowest limit) applies. Monitor rules are
///    selected the same way, separately from enforced ones.
/// 5. **Counting.** Each rule has its own [`KeyedLimiter`](crate::KeyedLimiter), keyed by the
///    client IP (`key = "ip"`), the client id (`"client"`) or both (`"ip_and_client"`), and,
///    with `per_endpoint`, by `VERB:path` as well. A rule with limit 0 rejects with
///    [`RejectReason::Blocked`], whatever key the request has (a block counts nothing). A rule
///    whose key the request lacks rejects it with [`RejectReason::NoKey`]
///    (`missing_key = "reject"`) or is skipped (`"allow"`); a block is the answer when both
///    apply, whichever rule comes first (a key would not help). Otherwise every enforced rule must
///    admit: they are charged one by one, and when one rejects, the ones already charged are
///    **refunded** (commit-then-refund, as [`KeyedChain`](crate::KeyedChain) does). The refund
///    is exact for every algorithm but the exact sliding window, whose refund is positional
///    (the permit is freed, its ticket's place in the ring is not until it expires), so rules
///    are charged as a chain commits its members: the exact sliding windows last, and of
///    several of them one that would reject now first. A rejected request is thus not charged
///    against the other rules. The rejection names the rule that rejected it, or, when other
///    rules would reject it too (each probed, nothing written), the one of them that asks to
///    wait longest, as the Redis backend does: its exact `retry_after` covers every rule seen
///    refusing, so a client that waits as told is not turned away by another. Quotas are
///    reported in the rules' order. This holds within one `HttpLimiter`: two layers stacked
///    on one route (one on the router, one on the route) decide one after the other, so a
///    request the inner one rejects stays charged in the outer one. Rules that must admit
///    all-or-nothing belong in one configuration.
///    A rule counts at most `max_keys_per_rule` clients in memory, evicting idle ones to make
///    room; a new client meeting a rule full of active ones is rejected with
///    [`RejectReason::TooManyKeys`] (`key_overflow = "reject"`), counted with the others the rule
///    has no room for on one shared counter (`"shared"`), or passes the rule uncounted
///    (`"allow"`).
/// 6. **Monitor rules** are charged only for requests the enforced rules admit; a would-be
///    rejection is logged (debug) and counted (`turnstile_http_shadow_rejected`), never enforced,
///    and reported in no header. A monitor rule whose key the request lacks counts nothing for
///    it, whatever `missing_key` says (`"reject"` counts no would-be rejection); one of limit 0
///    counts a would-be block whatever key the request has.
/// 7. **Bans** (a [`BanList`](crate::BanList) of clients) count rate-limit rejections
///    ([`RejectReason::RateLimited`], but not those of a full rule's shared counter) per client
///    in fixed windows of `bans.within` aligned to the clock; every `after`-th starts a ban of
///    `bans.duration`, in whole milliseconds rounded up (a banned client's requests are
///    not counted: after a ban, `after` more rejections start the next, in the same window or
///    a later one). Both tables hold at most `bans.max_entries` clients (idle ones are
///    evicted first); when full of active entries, new clients are not tracked: they are not
///    banned (the limits still apply). [`HttpLimiter::unban`] lifts a ban early.
///
/// The [`Verdict`] carries the quota of every enforced matching rule that counted (policy = the
/// rule's name, by default `"{endpoint}-{period}"`).
///
/// On a rejection the [`Verdict`] carries the same quotas: the rejecting rule's, and the named
/// rule's when that is another (step 5), with remaining 0 and reset after their `retry_after`;
/// the others (refunded or never charged) as a probe, which writes nothing, sees them.
///
/// # Observability
///
/// `tracing`: a debug event for every rejection (rule, key or client, reason) and every
/// would-be rejection of a monitor rule; info when a client is banned and when the watcher
/// reloads; warn the first time the ban list is too full to count a rejection (debug after
/// that); error when a watched file fails to load. With the feature `metrics`, counters
/// through the `metrics` facade, labelled `rule`: `turnstile_http_admitted` (once per enforced
/// rule that admitted a request), `turnstile_http_rejected` (rule, `"blocklist"` or `"ban"`),
/// `turnstile_http_banned` (the rule whose rejection started the ban),
/// `turnstile_http_ban_list_full` (the rule whose rejection the full ban list could not count:
/// raise `bans.max_entries`),
/// `turnstile_http_shadow_rejected`, `turnstile_http_key_overflow` (a request of a client the
/// rule had no room for, whatever `key_overflow` did with it) and `turnstile_http_waited` (a
/// request that started to wait for the rule, see "Waiting"); with the Redis backend,
/// `turnstile_http_backend_fallbacks` (one per decision the failure policy made instead of
/// Redis: fail-open, fail-closed or the local fallback; one per enforced rule of the request,
/// and one per monitor rule), with a `tracing` warn each.
///
/// # Counting in Redis
///
/// With `[backend] kind = "redis"` (features `http` and `redis`; build with
/// `HttpLimiter::connect`), steps 1 to 4 and the checks of step 5 are as above; the counting of
/// step 5 and monitor rules go to Redis, and [`HttpLimiter::check`] returns [`Check::Pending`]
/// (the layer waits for it). Each rule counts in its own `RedisLimiter` under keys named by the
/// rule's identity (not its limit).
/// A request's matching rules are decided together in one atomic script (one round trip): a
/// rejected request is charged to no rule, whatever other processes do. Bans stay in this
/// process's memory. With `[backend] cluster = true` the rules count in a Redis Cluster; every
/// enforced rule must then count by the same key (and `per_endpoint`), so that one request's
/// keys share a slot. [`BackendConfig`](crate::http::BackendConfig) has the details: key names,
/// what is atomic, Cluster, failures.
///
/// # Waiting
///
/// A rule with `queue_limit` > 0 lets requests wait for it instead of being rejected at once
/// (ASP.NET Core's `QueueLimit`, oldest first). A request that such a rule rejects for its rate
/// (step 5, the client's own counter) waits, if fewer than `queue_limit` requests wait for the
/// rule and the rejection's retry-after ends within the rule's `max_wait` (default: its period)
/// of the request's arrival, unless another of the request's rules that it could not wait for
/// (no queue, or its answer past its own `max_wait`) would still refuse it when that
/// `max_wait` has passed (probed, not charged): such a wait could only end in that rule's
/// rejection, which is answered at once. The order the rules are charged in changes none of
/// this: a rule without a queue that refuses the request before the rule with a queue is
/// reached (probed then) makes it wait all the same when its refusal ends within the wait,
/// and rejects it at once when not. Nor does it for a rule full of other clients: one that
/// refuses the request with `TooManyKeys` (`key_overflow = "reject"`), before or after the rule
/// with a queue, lets it wait all the same (room may be made by the time its turn comes: the
/// cap is not foreseen), and its refusal, if the rule still has no room for the client then, is
/// the final answer; under `"shared"`, the shared counter's refusal is weighed as a rule's rate
/// refusal is, as far as a probe of the rule sees it (a probe of a client the rule does not
/// hold sees a fresh counter, unless a recent search for room found none). It waits in the queue
/// of the rule's limiter for its counter key (one client's, or one client's per endpoint): the
/// requests waiting for one counter are admitted by the rule **in arrival order**, the head
/// when a permit frees (on tokio's timer: the runtime needs its time driver, `enable_time` or
/// `enable_all`), and a request arriving meanwhile for that counter is refused the freed
/// permit: it queues behind them (or is rejected at once, if it may not wait). Admitted by
/// the rule, it is decided again as a new request is, from step 0 on (a client banned meanwhile
/// is rejected as banned; the client it is, its IP and id, as found at its arrival, its IP
/// grouped for bans as a reload to a coarser grouping groups it), with that
/// rule's permit already taken (it is not charged twice), and the layer answers it with the
/// response settings of the configuration it is decided under. If it is not admitted then
/// (another rule rejects it, a list answers it first), the rule's permit is given back, to the
/// next request waiting for it: a rejected request is charged to no rule, as always (a permit
/// given back because a later rule rejected its request, waiting or not, wakes the request at
/// the head of its counter's queue at once). A request still waiting when its `max_wait` ends
/// is rejected then, with the rate-limit rejection it would have had without waiting, and
/// waits no more. One whose turn comes when the rule has no room left for its client (its
/// counter was taken out, see `max_keys_per_rule`) is decided again as a newcomer is:
/// `key_overflow` answers for that rule, and it may wait for another. A reload while it waits
/// applies to its next decision. One that keeps the rule it waits for, enforced, with its
/// limiter and its `max_wait` (same identity, and the limiter not made a new one as described
/// under "Reload") leaves it waiting in its place, even if the new rules no longer hold the
/// request back (they whitelist its client, or select another rule of the group for it: it is
/// not woken for that): the limiter applies a changed limit
/// to its queue itself (a raised one admits at once as many as it has room for), and the
/// request is decided under the rules in force when its turn comes (its headers report the new
/// limit beside the count made under it). Any other reload ends its wait at once: it is
/// decided under the new rules (a permit the wait got as the reload came is given back, or,
/// when the reload made the rule a monitor, counted as the monitor's charge), and if
/// it waits again, it queues again, after the requests of its counter still waiting, so that
/// such a reload can let a request arriving meanwhile go first (a rule the reload kept, same
/// identity, keeps its count of waiting requests). It waits again as long as each answer comes in time; when one does
/// not, or another rule without a queue rejects it, that rejection is final. Only the final
/// rejection is logged, counted (`turnstile_http_rejected`) and counted towards a ban; each
/// wait is counted in `turnstile_http_waited`. A waiting request holds no permit of any rule,
/// and the layer gives back what the inner service's `poll_ready` reserved while it waits, so
/// dropping it (the client gone) takes nothing and frees its place for the next.
/// [`decide`](HttpLimiter::decide) never waits (it answers the rejection, and a counter with
/// requests waiting rejects it as it rejects a newcomer);
/// [`decide_async`](HttpLimiter::decide_async) and the layer do. Memory backend only (the
/// Redis backend refuses `queue_limit` when the configuration loads). The count of
/// `queue_limit` is the rule's, not each client's: it counts the waiting requests of all
/// clients together (one client can fill it; the others are then rejected at once, as without
/// a queue), and a reload keeps the count of a rule whose identity is unchanged: one that lowers
/// `queue_limit` below the requests waiting turns none of them away (each keeps its place and
/// waits again as above), and no other request starts to wait for the rule until fewer than the
/// new limit wait. Arrival order
/// is kept per counter, not across clients (each client's requests are admitted at its own
/// rate), and the permit a `sliding_window` rule gives back frees only when the admission it
/// replaced would have expired (see `KeyedLimiter::try_acquire_refundable`).
///
/// # Reload
///
/// [`HttpLimiter::reload`] compiles the new configuration completely before swapping it in; on
/// error the old one stays. The rules and the layer's settings (client IP, client id header,
/// response) are swapped together, in one store: the layer reads them once per request, so
/// each request is decided and answered under one configuration, the old or the new, never
/// the rules of one and the settings of the other. A rule whose identity (scope, name,
/// endpoint, period, algorithm, key,
/// per-endpoint) is unchanged keeps its limiter and counters; if only its limit changed the
/// limiter is reconfigured in place, except that of a `sliding_window` rule whose limit is
/// raised: its ring of timestamps cannot grow in place, so the rule starts with fresh counters
/// (each client may then make the new limit's requests at once, whatever it made in the last
/// period), and every rule starts with fresh counters when `max_keys_per_rule` or
/// `key_overflow` changed (a limiter's key cap is fixed when it is built). A pattern or IP range is compared as it reads, not as it is written (`GET:/API/*`
/// is `get:/api/*`), and so is the period in an unnamed rule's default name (`60s` is `1m`). Bans are kept when `[bans]` and the grouping of addresses
/// (`client_ip.ipv4_prefix`, `ipv6_prefix`) did not change (periods compared as they read: `1m` is
/// `60s`). A reload that changes either builds a new ban list and carries every ban in force over
/// to it for what is left of it, rounded up to a whole millisecond (not cut to, nor lengthened to,
/// a new `duration`), a ban that a request still deciding under the old configuration starts
/// during the reload included: a client's ban as it is; an address's to its group when the new grouping is
/// as coarse or coarser (an address banned under `ipv6_prefix = 128` bans its /64 under 64); and
/// when it is finer, the old group stays banned as a group, every address in it, until its ban ends
/// (`unban` of any of them lifts it; a later reload stops looking the group up once its ban has
/// ended and no request still decides under a list from before the grouping changed). An unban
/// made while a reload carries the bans over stays done: the reload lifts the ban again in the
/// new list once that list holds every ban it carries (which also lifts a ban the same client
/// earned during the reload); so does one made after it while a request still deciding under the
/// old configuration passes its ban on (the unban lifts it in the old list too, and there the bans
/// of every address of the group it lifted, when the old grouping was finer). Counts of
/// rejections towards a ban start over. Bans that do not fit a smaller `max_entries` are lost,
/// those that end soonest, and the reload says how many at `warn`. The counters
/// of rules that count by address are not carried over a new grouping: they are keyed by the old
/// groups, so each client starts from a full limit under its new key (a rule's counts cannot be
/// split among a group's members, and summing members into a group would need every key visited).
/// With the Redis backend the counters live in Redis under names derived
/// from the rule's identity, so the same rules find them again; a reload may change the prefix
/// (new keys), failure policy and deadline, not the URL nor `cluster`. A kept rule also keeps its
/// `RedisLimiter`, and with it what this process holds besides the counts in Redis: its deny
/// cache, its counts of failure-policy decisions, and the counts of its `fallback` limiter (a
/// reload during an outage gives no client its fallback share again). If only its limit
/// changed the limiter is reconfigured in place (`RedisLimiter::reconfigure`: the counts in
/// Redis judged under the new limit, the deny cache emptied, the fallback's counts judged under
/// the new limit's share, except that a `sliding_window` rule's fallback starts empty when its
/// limit is raised, as in memory). A rule under a changed prefix, failure policy or deadline
/// gets a new limiter.
///
/// # Examples
///
/// ```
/// use turnstile::http::{HttpConfig, HttpLimiter, RequestInfo, Check};
///
/// let config = HttpConfig::from_toml_str("[[rules]]\nperiod = \"1s\"\nlimit = 1\n")?;
/// // Reads `Instant` for its decisions unless given another clock with `with_clock`.
/// let limiter: HttpLimiter<turnstile::MonotonicClock> = HttpLimiter::new(config)?;
/// let request = RequestInfo {
///     method: &http::Method::GET,
///     path: "/",
///     client_ip: Some("203.0.113.7".parse().unwrap()),
///     client_id: None,
/// };
/// assert!(matches!(limiter.check(&request), Check::Ready(v) if v.outcome.is_admitted()));
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
pub struct HttpLimiter<C: Clock + Clone = MonotonicClock> {
    clock: C,
    /// The rules and the layer settings, in one snapshot that a reload swaps in one store: a
    /// request reads it once and is decided and answered under it whole. Shared with the
    /// requests that wait for a rule: each decides again under the snapshot in force when it
    /// wakes.
    config: Arc<ArcSwap<Snapshot<C>>>,
    /// Wakes the requests that wait for a rule after a reload, which may have raised the limit
    /// they wait for (or removed their rule): each decides again at once.
    reloaded: Arc<tokio::sync::Notify>,
    /// The configuration in force, locked for the whole of a reload: reloads are done one at
    /// a time, and [`watch`](Self::watch) compares a file with it.
    in_force: Mutex<HttpConfig>,
    /// The unbans asked for while a reload carries the bans over to a new list, to be done
    /// again on the new list once it has (see [`reload`](Self::reload)); `None` while no
    /// reload runs. An unban takes this lock for its whole lifting, so that the reload's last
    /// step sees every unban made before it.
    unbans_in_reload: Mutex<Option<Vec<Unban>>>,
    /// The Redis connection, when the rules count in Redis.
    #[cfg(feature = "redis")]
    backend: Option<crate::http::redis_rules::RedisBackend>,
}

impl<C: Clock + Clone> fmt::Debug for HttpLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = self.config.load();
        f.debug_struct("HttpLimiter")
            .field(
                "rules",
                &config
                    .rules
                    .all_rules()
                    .map(|r| r.name.clone())
                    .collect::<Vec<_>>(),
            )
            .field("settings", &config.settings)
            .finish_non_exhaustive()
    }
}

/// What one request is decided and answered under: the compiled rules and the layer's
/// settings of one configuration. [`HttpLimiter::reload`] swaps the whole of it in one store,
/// and the layer reads it once per request (one guard), so that no request meets the rules of
/// one configuration and the client-IP or response settings of another. `pub` only to name it
/// in the layer's sealed trait; not reachable from outside the crate.
pub struct Snapshot<C: Clock> {
    pub(crate) rules: RuleSet<C>,
    pub(crate) settings: LayerSettings,
}

impl<C: Clock> crate::http::layer::HasSettings for Snapshot<C> {
    fn layer_settings(&self) -> &LayerSettings {
        &self.settings
    }
}

fn settings_of(config: &HttpConfig) -> Result<LayerSettings, HttpConfigError> {
    // Both validators name the field inside their section ("ipv6_prefix: ..."); prefix the
    // section so that the error names the whole path.
    let in_section = |section: &str, message: String| match message.split_once(": ") {
        Some((field, what)) => HttpConfigError::invalid(format!("{section}.{field}"), what),
        None => HttpConfigError::invalid(section, message),
    };
    config
        .client_ip
        .validate()
        .map_err(|message| in_section("client_ip", message))?;
    config
        .response
        .validate()
        .map_err(|e| in_section("response", e.to_string()))?;
    Ok(LayerSettings {
        client_ip: config.client_ip.clone(),
        client_id_header: config
            .client_id_header
            .as_deref()
            .map(parse_header)
            .transpose()?,
        response: config.response.clone(),
    })
}

impl HttpLimiter {
    /// Compiles `config` on the default clock.
    ///
    /// # Errors
    ///
    /// [`HttpConfigError::Invalid`] naming the field at fault.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// let config = HttpConfig::from_toml_str("[[rules]]\nperiod = \"0s\"\nlimit = 1\n")?;
    /// assert_eq!(
    ///     HttpLimiter::new(config).unwrap_err().to_string(),
    ///     "rules[0].period: must be greater than zero"
    /// );
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn new(config: HttpConfig) -> Result<Self, HttpConfigError> {
        Self::with_clock(config, MonotonicClock::new())
    }
}

#[cfg(feature = "redis")]
impl HttpLimiter {
    /// Builds a limiter whose rules count in Redis (`[backend] kind = "redis"`, features `http`
    /// and `redis`): connects to `backend.url` with a
    /// [`ConnectionManager`](crate::redis::aio::ConnectionManager) (which reconnects by itself;
    /// without a response timeout of its own, so that `backend.deadline` alone bounds a
    /// decision), then compiles as [`with_connection`](HttpLimiter::with_connection). A configuration with
    /// the memory backend is compiled as by [`new`](HttpLimiter::new).
    ///
    /// # Errors
    ///
    /// [`HttpConfigError::Invalid`] naming the field at fault; [`HttpConfigError::Backend`] if
    /// Redis cannot be reached now (the failure policy applies only once the limiter runs).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the connection being made; nothing is left behind.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// # async fn demo() -> Result<(), turnstile::http::HttpConfigError> {
    /// let config = HttpConfig::from_toml_str(r#"
    ///     [backend]
    ///     kind = "redis"
    ///     url = "redis://127.0.0.1:6379/"
    ///     prefix = "myapp"
    ///     failure = "fallback"
    ///     deadline = "20ms"
    ///
    ///     [[rules]]
    ///     period = "1m"
    ///     limit = 100
    /// "#)?;
    /// let limiter = HttpLimiter::connect(config).await?;
    /// # let _ = limiter;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: HttpConfig) -> Result<Self, HttpConfigError> {
        use crate::http::redis_rules::{Connection, RedisSettings};
        if config.backend.kind != "redis" {
            return Self::new(config);
        }
        // The whole configuration is checked before connecting: a mistake is named at once,
        // not after a connection attempt (or its failure).
        Compiler::<MonotonicClock>::precheck(&config)?;
        let redis = RedisSettings::of(&config)?;
        let backend_error = |e: crate::redis::RedisError| HttpConfigError::Backend {
            message: format!("cannot connect to {}: {e}", redis.url),
        };
        let connection = if redis.cluster {
            let client =
                crate::redis::cluster::ClusterClient::new(redis.seeds()).map_err(backend_error)?;
            Connection::Cluster(client.get_async_connection().await.map_err(backend_error)?)
        } else {
            let client = crate::redis::Client::open(redis.url.as_str()).map_err(backend_error)?;
            // No response timeout of the connection's own: each decision has the rules'
            // `backend.deadline`, which a reload may change. redis-rs's default (500 ms) failed
            // every decision at 500 ms under a longer deadline.
            let unbounded =
                crate::redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
            Connection::Standalone(
                crate::redis::aio::ConnectionManager::new_with_config(client, unbounded)
                    .await
                    .map_err(backend_error)?,
            )
        };
        Self::with_backend(config, connection)
    }

    /// Builds a limiter whose rules count in Redis through `connection` (made by you, to
    /// `backend.url`; the URL is only compared on reload). Connects nothing and sends nothing.
    ///
    /// Every process that uses the same Redis and `backend.prefix` shares the limits. See the
    /// module's semantics for what is atomic. A response timeout of the connection's own
    /// shorter than `backend.deadline` ends decisions sooner: build a `ConnectionManager`
    /// with `ConnectionManagerConfig::set_response_timeout(None)` (its default is 500 ms), as
    /// [`connect`](HttpLimiter::connect) does.
    ///
    /// # Errors
    ///
    /// As [`connect`](HttpLimiter::connect), but never [`HttpConfigError::Backend`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    /// use turnstile::redis::{aio::ConnectionManager, Client};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = HttpConfig::from_toml_str(
    ///     "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\n[[rules]]\nperiod = \"1m\"\nlimit = 100\n",
    /// )?;
    /// let connection = ConnectionManager::new(Client::open("redis://127.0.0.1/")?).await?;
    /// let limiter = HttpLimiter::with_connection(config, connection)?;
    /// # let _ = limiter;
    /// # Ok(()) }
    /// ```
    pub fn with_connection(
        config: HttpConfig,
        connection: crate::redis::aio::ConnectionManager,
    ) -> Result<Self, HttpConfigError> {
        if config.backend.cluster {
            return Err(HttpConfigError::invalid(
                "backend.cluster",
                "is true: count through a Cluster connection (with_cluster_connection)",
            ));
        }
        Self::with_backend(
            config,
            crate::http::redis_rules::Connection::Standalone(connection),
        )
    }

    /// Builds a limiter whose rules count in a Redis Cluster through `connection` (made by
    /// you, to the nodes in `backend.url`, with `backend.cluster = true`). Connects nothing
    /// and sends nothing.
    ///
    /// Each rule's keys lie in the slot of the request's subject (its IP, client id or
    /// `VERB:path`), so counters spread over the masters, and a request's rules, which must
    /// count alike on a Cluster, are still decided in one script.
    ///
    /// # Errors
    ///
    /// As [`connect`](HttpLimiter::connect), but never [`HttpConfigError::Backend`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    /// use turnstile::redis::cluster::ClusterClient;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = HttpConfig::from_toml_str(
    ///     "[backend]\nkind = \"redis\"\ncluster = true\nurl = \"redis://10.0.0.1:7000/\"\n[[rules]]\nperiod = \"1m\"\nlimit = 100\n",
    /// )?;
    /// let connection = ClusterClient::new(vec!["redis://10.0.0.1:7000/"])?
    ///     .get_async_connection()
    ///     .await?;
    /// let limiter = HttpLimiter::with_cluster_connection(config, connection)?;
    /// # let _ = limiter;
    /// # Ok(()) }
    /// ```
    pub fn with_cluster_connection(
        config: HttpConfig,
        connection: crate::redis::cluster_async::ClusterConnection,
    ) -> Result<Self, HttpConfigError> {
        if !config.backend.cluster {
            return Err(HttpConfigError::invalid(
                "backend.cluster",
                "must be true to count through a Cluster connection",
            ));
        }
        Self::with_backend(
            config,
            crate::http::redis_rules::Connection::Cluster(connection),
        )
    }

    fn with_backend(
        config: HttpConfig,
        connection: crate::http::redis_rules::Connection,
    ) -> Result<Self, HttpConfigError> {
        use crate::http::redis_rules::{RedisBackend, RedisSettings, attach};
        if config.backend.kind != "redis" {
            return Err(HttpConfigError::invalid(
                "backend.kind",
                "must be \"redis\" to count through a Redis connection",
            ));
        }
        let redis = RedisSettings::of(&config)?;
        let settings = settings_of(&config)?;
        let clock = MonotonicClock::new();
        let mut rules = Compiler::new(&clock, None).compile(&config)?;
        let backend = RedisBackend {
            url: redis.url.clone(),
            cluster: redis.cluster,
            connection,
        };
        attach(&mut rules, &redis, &backend, None)?;
        Ok(HttpLimiter {
            clock,
            config: Arc::new(ArcSwap::from_pointee(Snapshot { rules, settings })),
            reloaded: Arc::new(tokio::sync::Notify::new()),
            in_force: Mutex::new(config),
            unbans_in_reload: Mutex::new(None),
            backend: Some(backend),
        })
    }
}

impl<C: Clock + Clone> HttpLimiter<C> {
    /// Compiles `config`, every limiter reading `clock` (a [`ManualClock`](crate::ManualClock)
    /// in tests).
    ///
    /// # Errors
    ///
    /// As [`new`](HttpLimiter::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ManualClock;
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// let limiter = HttpLimiter::with_clock(HttpConfig::default(), ManualClock::new())?;
    /// # let _ = limiter;
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn with_clock(config: HttpConfig, clock: C) -> Result<Self, HttpConfigError> {
        let settings = settings_of(&config)?;
        let rules = Compiler::new(&clock, None).compile(&config)?;
        #[cfg(feature = "redis")]
        if config.backend.kind == "redis" {
            return Err(HttpConfigError::NeedsConnect);
        }
        Ok(HttpLimiter {
            clock,
            config: Arc::new(ArcSwap::from_pointee(Snapshot { rules, settings })),
            reloaded: Arc::new(tokio::sync::Notify::new()),
            in_force: Mutex::new(config),
            unbans_in_reload: Mutex::new(None),
            #[cfg(feature = "redis")]
            backend: None,
        })
    }

    /// Replaces the configuration, keeping the counters of the rules that did not change (see
    /// the module's semantics). On error nothing changes. The backend stays: a limiter made by
    /// [`connect`](HttpLimiter::connect) reloads only configurations for the same Redis, and
    /// one counting in memory only configurations that count in memory.
    ///
    /// # Errors
    ///
    /// As [`new`](HttpLimiter::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ManualClock;
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// let limiter = HttpLimiter::with_clock(HttpConfig::default(), ManualClock::new())?;
    /// let bad = HttpConfig::from_toml_str("[[rules]]\nperiod = \"1s\"\nlimit = 1\nendpoint = \"nope\"\n")?;
    /// assert!(limiter.reload(bad).is_err());
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn reload(&self, config: HttpConfig) -> Result<(), HttpConfigError> {
        let mut in_force = self
            .in_force
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.reload_locked(&mut in_force, config)
    }

    /// [`reload`](Self::reload), unless `config` is the configuration in force: true if it
    /// reloaded.
    fn reload_if_changed(&self, config: HttpConfig) -> Result<bool, HttpConfigError> {
        let mut in_force = self
            .in_force
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *in_force == config {
            return Ok(false);
        }
        self.reload_locked(&mut in_force, config).map(|()| true)
    }

    /// The reload, `in_force` locked by the caller; on success `config` is put there.
    fn reload_locked(
        &self,
        in_force: &mut HttpConfig,
        config: HttpConfig,
    ) -> Result<(), HttpConfigError> {
        let settings = settings_of(&config)?;
        // The backend is checked before compiling: compiling changes the limits of the live
        // limiters it keeps (once the whole configuration has compiled), so a reload refused
        // after it would have changed them.
        #[cfg(feature = "redis")]
        let redis = if config.backend.kind == "redis" {
            let redis = crate::http::redis_rules::RedisSettings::of(&config)?;
            match &self.backend {
                Some(backend) if backend.url == redis.url && backend.cluster == redis.cluster => {
                    Some((redis, backend))
                }
                _ => {
                    return Err(HttpConfigError::invalid(
                        "backend.url",
                        "a reload cannot connect to a different Redis (or switch from memory to Redis, or to or from a Cluster): restart with HttpLimiter::connect",
                    ));
                }
            }
        } else if self.backend.is_some() {
            // Not quietly: the rules would count in each process's memory from then on, each
            // process admitting the whole limit (and from zero), where the fleet shared one.
            return Err(HttpConfigError::invalid(
                "backend.kind",
                "a reload cannot switch from Redis to memory (the limits would count per process): restart with HttpLimiter::new",
            ));
        } else {
            None
        };
        let old = self.config.load_full();
        // From here until the new list has every ban it will carry, an unban may lift a ban
        // from the old list that the new one has already copied (or will copy again after the
        // swap): each is recorded and done again on the new list at the end. Stopped however
        // the reload ends.
        let recording = Recording::start(&self.unbans_in_reload);
        #[allow(unused_mut)] // mutated only to attach Redis limiters
        let mut rules = Compiler::new(&self.clock, Some(&old.rules)).compile(&config)?;
        #[cfg(feature = "redis")]
        if let Some((redis, backend)) = redis {
            crate::http::redis_rules::attach(&mut rules, &redis, backend, Some(&old.rules))?;
        }
        // Bans started under the old list since compiling carried them over (requests go on
        // under it until the store) are carried after it too.
        let carry = match (&old.rules.bans, &rules.bans) {
            (Some(old), Some(new)) if !Arc::ptr_eq(old, new) => {
                Some((Arc::clone(old), Arc::clone(new)))
            }
            _ => None,
        };
        // One store for the rules and the settings: a request sees both of the old
        // configuration or both of the new one.
        self.config.store(Arc::new(Snapshot { rules, settings }));
        let carried = carry.is_some();
        if let Some((old, new)) = carry {
            // Before the carry reads the old list: a ban that starts there after it, from a
            // request still deciding under the old snapshot, is passed on (`Bans::pass_on`).
            old.hand_over(&new);
            let lost = new.carry(&old);
            if lost > 0 {
                tracing::warn!(
                    lost,
                    max_entries = new.config.max_entries,
                    "the reload could not carry every ban in force over to the new ban list, \
                     which is full (raise bans.max_entries): those clients are no longer banned"
                );
            }
        }
        // Only a new list can have kept (or been given back) a ban an unban lifted meanwhile.
        if carried {
            recording.redo(&self.config.load());
        }
        // After the store: a waiting request that misses this (it was deciding) finds the new
        // rules when it compares them with its own before sleeping (`wait_and_decide`).
        self.reloaded.notify_waiters();
        *in_force = config;
        Ok(())
    }

    /// Reads `path` (format by extension, as [`HttpConfig::from_file`]) and reloads.
    ///
    /// # Errors
    ///
    /// As [`HttpConfig::from_file`] and [`reload`](Self::reload).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ManualClock;
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// let limiter = HttpLimiter::with_clock(HttpConfig::default(), ManualClock::new())?;
    /// assert!(limiter.reload_from_file("/nonexistent.toml").is_err());
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn reload_from_file(&self, path: impl AsRef<Path>) -> Result<(), HttpConfigError> {
        self.reload(HttpConfig::from_file(path)?)
    }

    /// Reads `path` every `interval` and reloads when its content changed, logging failures
    /// (with `tracing`, at error level) and keeping the old configuration. Needs a tokio
    /// runtime; abort the handle to stop.
    ///
    /// A content is compared with the content last read, not the modification time: two
    /// writes within the file system's timestamp resolution (a second on some) leave the time
    /// as it was, and an edit of one digit the length. The bytes compared are the bytes
    /// reloaded, so a write landing between a poll and its reload is not taken for the one
    /// reloaded. A new content is parsed and reloaded only if it says something else than the
    /// configuration in force (an edited comment reloads nothing). The first poll, at once,
    /// reads the file as new: an edit made between building the limiter and calling `watch`
    /// is loaded then. A file that cannot be read
    /// (replaced by a rename, say) is tried again at the next poll; a content that fails to
    /// load is not tried again until it changes.
    ///
    /// An empty file is not loaded, but tried again at the next poll: a file rewritten in place
    /// (`std::fs::write`, a shell's `>`) is empty between its truncation and its write, and
    /// loaded, that would drop every rule with its counters, and the bans: the whole file, read
    /// at the next poll, would bring the rules back with fresh counters and no client banned. A
    /// configuration of no rules is written as one (a comment will do). A file written in
    /// several writes can also be read half-written: write a new file and rename it over the
    /// old one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), turnstile::http::HttpConfigError> {
    /// use std::{sync::Arc, time::Duration};
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// let limiter = Arc::new(HttpLimiter::new(HttpConfig::from_file("limits.toml")?)?);
    /// let watcher = limiter.watch("limits.toml", Duration::from_secs(5));
    /// watcher.abort();
    /// # Ok(()) }
    /// ```
    pub fn watch(
        self: &Arc<Self>,
        path: impl Into<PathBuf>,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let path = path.into();
        let limiter = Arc::downgrade(self);
        let interval = interval.max(Duration::from_millis(1));
        // The content last read (loaded, found unloadable, or found to say what is in force):
        // a configuration file is small, and kept whole it is compared exactly, with no hash to
        // collide. None at first: the first poll compares the file with the configuration in
        // force, which it may already be at odds with.
        let mut seen: Option<Vec<u8>> = None;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            loop {
                ticker.tick().await;
                let Some(limiter) = limiter.upgrade() else {
                    return;
                };
                // Empty: being rewritten in place (see above), not a configuration.
                let Some(now) = std::fs::read(&path).ok().filter(|now| !now.is_empty()) else {
                    continue;
                };
                if seen.as_deref() == Some(now.as_slice()) {
                    continue;
                }
                let result = HttpConfig::from_file_bytes(&path, &now)
                    .and_then(|config| limiter.reload_if_changed(config));
                seen = Some(now);
                match result {
                    Ok(true) => {
                        tracing::info!(path = %path.display(), "rate-limit configuration reloaded")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "rate-limit configuration not reloaded; keeping the old one")
                    }
                }
            }
        })
    }

    /// Decides one request at once (what [`check`](HttpLimiter::check) returns, without the
    /// wrapper).
    ///
    /// A limiter counting in Redis cannot decide without a round trip: for a request that would
    /// be counted there, `decide` rejects with [`RejectReason::Unavailable`] (rule `"backend"`)
    /// and charges nothing; one only monitor rules would count there is admitted, uncounted (a
    /// monitor rule never rejects). Use [`decide_async`](HttpLimiter::decide_async) (or the
    /// layer) then.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ManualClock;
    /// use turnstile::http::{HttpConfig, HttpLimiter, Outcome, RequestInfo};
    ///
    /// let limiter = HttpLimiter::with_clock(HttpConfig::default(), ManualClock::new())?;
    /// let request = RequestInfo { method: &http::Method::GET, path: "/", client_ip: None, client_id: None };
    /// assert_eq!(limiter.decide(&request).outcome, Outcome::Admitted);
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn decide(&self, request: &RequestInfo<'_>) -> Verdict {
        match decide(&self.config.load().rules, request, None) {
            Check::Ready(verdict) => verdict,
            Check::Pending(_) => rejected(RejectReason::Unavailable, BACKEND.get(), None),
        }
    }

    /// Decides one request, waiting for the backend if the rules count in Redis, and for a rule
    /// with a queue if one rejects it (see "Waiting" on [`HttpLimiter`]; that needs tokio's
    /// timer).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes may leave some of the request's rules charged
    /// in Redis (a request already sent may still run there), as for `RedisLimiter::try_acquire`
    /// (feature `redis`). With the memory backend the decision is made in the first poll (a
    /// future dropped before it is polled decides nothing and charges nothing), unless the
    /// request waits for a rule's queue: dropped while it waits, it leaves the queue and has
    /// taken nothing, also when its permit has come and its task has not run yet.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::{HttpConfig, HttpLimiter, Outcome, RequestInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), turnstile::http::HttpConfigError> {
    /// let limiter = HttpLimiter::new(HttpConfig::default())?;
    /// let request = RequestInfo { method: &http::Method::GET, path: "/", client_ip: None, client_id: None };
    /// assert_eq!(limiter.decide_async(&request).await.outcome, Outcome::Admitted);
    /// # Ok(()) }
    /// ```
    pub async fn decide_async(&self, request: &RequestInfo<'_>) -> Verdict {
        match self.check(request) {
            Check::Ready(verdict) => verdict,
            Check::Pending(pending) => pending.await,
        }
    }

    /// Lifts the ban of the client at `ip` now (a false positive, a customer an operator
    /// cleared), and forgets the rejections counted towards its next ban: it is banned again
    /// only after `bans.after` more. The address is grouped as the layer groups clients
    /// (IPv4-mapped addresses as IPv4, `ipv6_prefix`), so any address of a banned IPv6 prefix
    /// lifts that prefix's ban. Its rules' counters are left as they are. True if the client
    /// was banned.
    ///
    /// Bans live in this process, whatever the backend (see [`HttpLimiter`]): each process
    /// of a fleet lifts its own. A static `[blocklist]` entry is lifted by a reload.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use turnstile::ManualClock;
    /// use turnstile::http::{HttpConfig, HttpLimiter, Outcome, RejectReason, RequestInfo};
    ///
    /// let config = HttpConfig::from_toml_str(
    ///     "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n\
    ///      [bans]\nafter = 1\nwithin = \"1m\"\nduration = \"1h\"\n",
    /// )?;
    /// let limiter = HttpLimiter::with_clock(config, ManualClock::new())?;
    /// let ip: IpAddr = "203.0.113.9".parse().unwrap();
    /// let request = RequestInfo { method: &http::Method::GET, path: "/", client_ip: Some(ip), client_id: None };
    /// let reason = |limiter: &HttpLimiter<ManualClock>| match limiter.decide(&request).outcome {
    ///     Outcome::Rejected { reason, .. } => Some(reason),
    ///     _ => None,
    /// };
    /// assert_eq!(reason(&limiter), None);
    /// assert_eq!(reason(&limiter), Some(RejectReason::RateLimited)); // and banned for an hour
    /// assert_eq!(reason(&limiter), Some(RejectReason::Banned));
    /// assert!(limiter.unban(ip));
    /// assert!(!limiter.unban(ip));
    /// // Back to the rule's own answer: rate-limited until the minute ends, not banned.
    /// assert_eq!(reason(&limiter), Some(RejectReason::RateLimited));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unban(&self, ip: IpAddr) -> bool {
        self.lift(Unban::Ip(ip))
    }

    /// Lifts the ban of the client with id `client_id` (a client known by its id alone: its
    /// address was unknown), as [`unban`](Self::unban) does for an address. True if it was
    /// banned.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// let config = HttpConfig::from_toml_str("[bans]\nafter = 3\nwithin = \"1m\"\nduration = \"5m\"\n")?;
    /// let limiter = HttpLimiter::new(config)?;
    /// assert!(!limiter.unban_client("partner-7"), "never banned");
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn unban_client(&self, client_id: &str) -> bool {
        self.lift(Unban::Client(CompactString::from(client_id)))
    }

    /// Resets `who`'s ban and its count of rejections; whether it was banned. Under the
    /// reload's record of unbans, which it joins while a reload runs.
    fn lift(&self, who: Unban) -> bool {
        let mut recorded = self
            .unbans_in_reload
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let banned = who.lift(&self.config.load());
        if banned {
            tracing::info!(client = ?who, "client unbanned");
        }
        if let Some(recorded) = recorded.as_mut() {
            recorded.push(who);
        }
        banned
    }
}

/// A client to unban, as [`HttpLimiter::unban`] and [`HttpLimiter::unban_client`] name it: an
/// address is grouped under the configuration the ban is lifted in (a reload may change the
/// grouping between an unban and its redoing).
#[derive(Debug)]
enum Unban {
    Ip(IpAddr),
    Client(CompactString),
}

impl Unban {
    /// Lifts the ban in `snapshot`'s list, grouping an address by its settings; whether one
    /// was in force.
    fn lift<C: Clock>(&self, snapshot: &Snapshot<C>) -> bool {
        let Some(bans) = snapshot.rules.bans.as_ref() else {
            return false;
        };
        let (client, address) = match self {
            Unban::Ip(ip) => {
                match client_ip(
                    Some(*ip),
                    &http::HeaderMap::new(),
                    &snapshot.settings.client_ip,
                ) {
                    Some(grouped) => (
                        BanKey::Ip(grouped),
                        Some(crate::http::client_ip::canonical(*ip)),
                    ),
                    None => return false,
                }
            }
            Unban::Client(id) => (BanKey::Client(id.clone()), None),
        };
        bans.lift(&client, address)
    }
}

/// A reload's record of the unbans made while it carries the bans over (see
/// `HttpLimiter::unbans_in_reload`): started before it compiles, redone and stopped at its
/// end, and stopped when dropped (a reload refused midway has nothing to redo: the list in
/// force was never replaced).
struct Recording<'a>(&'a Mutex<Option<Vec<Unban>>>);

impl<'a> Recording<'a> {
    fn start(unbans: &'a Mutex<Option<Vec<Unban>>>) -> Self {
        *unbans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Vec::new());
        Recording(unbans)
    }

    /// Does the recorded unbans again in `snapshot` (the configuration just stored, whose list
    /// has carried every ban it will), and stops recording; under the lock, so that an unban
    /// made after this finds `snapshot` in force.
    fn redo<C: Clock>(self, snapshot: &Snapshot<C>) {
        let mut recorded = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for who in recorded.take().into_iter().flatten() {
            who.lift(snapshot);
        }
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

/// The rule names of rejections no configured rule makes, each handed out as the thread's copy
/// of one name (see [`LocalName`]). A flood from a blocked or banned client is exactly when these
/// are made over and over: a name allocated per rejection would also miss the thread's cached
/// rejection body, keyed by the name's `Arc`.
static BLOCKLIST: LazyLock<LocalName> = LazyLock::new(|| LocalName::new("blocklist".into()));
static BAN: LazyLock<LocalName> = LazyLock::new(|| LocalName::new("ban".into()));
static BACKEND: LazyLock<LocalName> = LazyLock::new(|| LocalName::new("backend".into()));

fn rejected(reason: RejectReason, rule: Arc<str>, retry_after: Option<Duration>) -> Verdict {
    Verdict {
        outcome: Outcome::Rejected {
            reason,
            rule,
            retry_after,
        },
        quotas: Quotas::new(),
    }
}

/// The rules a request is decided by: a few, kept on the stack.
type Selected<'a, C> = SmallVec<[&'a Arc<Rule<C>>; 4]>;

/// Whether two rules compete in selection: the same period and the same counter key (`key`
/// and `per_endpoint`). Rules that count different things are different limits: were a rule
/// counting by client id allowed to displace one counting by IP, a client could step around
/// the IP limit by sending a new client id with every request. AspNetCoreRateLimit's IP and
/// client middlewares likewise each apply their own rules.
pub(crate) fn same_group<C: Clock>(a: &Rule<C>, b: &Rule<C>) -> bool {
    a.period == b.period && a.key == b.key && a.per_endpoint == b.per_endpoint
}

/// Of the `monitor` (or enforced) rules, per group (see [`same_group`]): the specific ones
/// first; a general one only for a group no specific rule is in; the lowest limit per group.
/// Iterators rather than collected lists, and the result on the stack, so that a request under
/// up to four rules allocates nothing here.
pub(crate) fn select<'a, C: Clock + 'a>(
    specific: impl Iterator<Item = &'a Arc<Rule<C>>>,
    general: impl Iterator<Item = &'a Arc<Rule<C>>>,
    monitor: bool,
) -> Selected<'a, C> {
    let mut out: Selected<'a, C> = SmallVec::new();
    let push = |r: &'a Arc<Rule<C>>, out: &mut Selected<'a, C>| match out
        .iter_mut()
        .find(|o| same_group(o, r))
    {
        Some(o) => {
            if r.limit < o.limit {
                *o = r;
            }
        }
        None => out.push(r),
    };
    for r in specific.filter(|r| r.monitor == monitor) {
        push(r, &mut out);
    }
    // The entries so far are all specific: their groups are the ones general rules yield.
    let specific_count = out.len();
    for r in general.filter(|r| r.monitor == monitor) {
        if !out[..specific_count].iter().any(|o| same_group(o, r)) {
            push(r, &mut out);
        }
    }
    out
}

/// `key` as a bit of a set of keys.
fn key_bit(key: RuleKey) -> u8 {
    match key {
        RuleKey::Ip => 1,
        RuleKey::Client => 2,
        RuleKey::IpAndClient => 4,
    }
}

fn counter_key<C: Clock>(rule: &Rule<C>, request: &RequestInfo<'_>) -> Option<CounterKey> {
    let ip = request.client_ip;
    let client = request.client_id;
    // Only the parts the rule counts by go into the key.
    let (ip, client) = match rule.key {
        RuleKey::Ip if !rule.per_endpoint => return Some(CounterKey::Ip(ip?)),
        RuleKey::Ip => (Some(ip?), None),
        RuleKey::Client => (None, Some(client?)),
        RuleKey::IpAndClient => (Some(ip?), Some(client?)),
    };
    // `HEAD` counts as the `GET` it is served as (see `Endpoint::matches`): one endpoint, one
    // counter, rather than a second quota for the same handler. A method in another case
    // (`get`, an extension method to `http`) counts as the upper-case one: patterns match it
    // case-insensitively, so counted apart it was a second quota for a client that sends it.
    let upper;
    let endpoint = if rule.per_endpoint {
        let method = match *request.method {
            http::Method::HEAD => "GET",
            ref method if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) => {
                upper = method.as_str().to_ascii_uppercase();
                upper.as_str()
            }
            ref method => method.as_str(),
        };
        Some((method, request.path))
    } else {
        None
    };
    Some(CounterKey::parts(ip, client, endpoint))
}

/// The quota of a rule that was not charged: the permits available now, and the reset a probe
/// (it writes nothing) reports; with the probe's rate-limit rejection, when the rule would
/// reject the request too.
fn probe_quota<C: Clock>(
    rule: &Rule<C>,
    limiter: &crate::KeyedLimiter<CounterKey, C>,
    key: &CounterKey,
) -> (QuotaState, Option<TryAcquireError>) {
    let remaining = u64::from(limiter.available(key));
    // Uncounted: a probe is no call of the rule's, and one of a client the rule does not hold
    // meets the key cap after a search for room failed (until room may be found), which
    // `chain_decide` counts in the limiter's `overflowed`.
    let (reset_after, refused) = match limiter.chain_decide_uncounted::<false>(key, 1) {
        (Ok(a), _, _) => (a.reset_after(), None),
        (Err(TryAcquireError::Rejected(r)), _, _) => {
            (r.retry_after(), Some(TryAcquireError::Rejected(r)))
        }
        (Err(_), _, _) => (rule.period, None),
    };
    (rule.quota(remaining, reset_after), refused)
}

/// `path` in the form rules match and per-endpoint counters key on, when it differs: its
/// percent-encoded unreserved characters (letters, digits, `-`, `.`, `_`, `~`) decoded and the
/// hex digits of the other escapes upper-cased, RFC 3986's normalizations that change no
/// resource (§6.2.2.1–2). Without them `/api/values/%31` would be another path than
/// `/api/values/1` to the rules, while the app's router hands both to the same handler (axum
/// decodes path parameters): a client could step around an endpoint rule, or take a fresh
/// per-endpoint counter, by encoding a character. Escapes of reserved characters (`%2F`) stay
/// escaped: decoded, they would change the path's segments, and the whitelists match this form
/// only. The rules also match the form a handler reads ([`decoded_path`]).
pub(crate) fn normalized_path(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    if !bytes.contains(&b'%') {
        return None;
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?)))
            .flatten();
        match escape {
            Some((high, low)) => {
                let byte = high << 4 | low;
                if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                    out.push(byte);
                } else {
                    out.push(b'%');
                    out.push(bytes[i + 1].to_ascii_uppercase());
                    out.push(bytes[i + 2].to_ascii_uppercase());
                }
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    // Only ASCII bytes were written in place of ASCII escapes: still UTF-8.
    String::from_utf8(out).ok().filter(|normal| normal != path)
}

/// `path` (normalized) with every escape decoded, as a router's extractors hand it to a
/// handler, when that differs and is UTF-8: axum's `Path` percent-decodes what it captures,
/// `%2F` and non-ASCII escapes included, so `/files/secret%2Fdoc` reaches the handler of
/// `/files/{*path}` with the `secret/doc` of `/files/secret/doc`, and a rule that saw only
/// the escaped path could be stepped around by escaping a `/`. Not UTF-8: the extractor
/// refuses the request, and there is no other reading. A broken escape stays as it is.
fn decoded_path(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16)).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) = (hex(bytes.get(i + 1)), hex(bytes.get(i + 2)))
        {
            out.push(high << 4 | low);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out)
        .ok()
        .filter(|decoded| decoded != path)
}

/// `path` (normalized, decoded when it has a second reading) without its empty and `.`
/// segments, as a file server resolves it, when that differs: tower-http's `ServeDir` (and
/// `std::path::Path::components`, which it walks) reads `/static//secret/x` and
/// `/static/./secret/x` as the `secret/x` of `/static/secret/x`, so behind a wildcard route
/// (`/static/{*path}`) a rule for `/static/secret/*` that saw only the path as written could
/// be stepped around by doubling a `/` or inserting a `.` segment. A final `.` leaves its
/// `/` (`/a/.` is `/a/`, as RFC 3986's `remove_dot_segments` has it). `..` stays: it names
/// another resource, which file servers refuse and clients resolve before sending.
fn resolved_path(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    // One pass on the common path: no `//`, no `/.`, nothing to resolve.
    if !bytes
        .windows(2)
        .any(|pair| pair[0] == b'/' && matches!(pair[1], b'/' | b'.'))
    {
        return None;
    }
    let mut segments = path.split('/');
    // What precedes the first `/`: nothing in an origin-form path.
    let mut out = String::from(segments.next().unwrap_or(""));
    out.reserve(path.len());
    let mut ends_in_slash = false;
    for segment in segments {
        if segment.is_empty() || segment == "." {
            ends_in_slash = true;
        } else {
            out.push('/');
            out.push_str(segment);
            ends_in_slash = false;
        }
    }
    if ends_in_slash {
        out.push('/');
    }
    Some(out).filter(|resolved| resolved != path)
}

/// `path` without its trailing `/`s (`/` itself stays), as AspNetCoreRateLimit counts it.
fn without_trailing_slash(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" if !path.is_empty() => "/",
        trimmed => trimmed,
    }
}

/// `patience`: `None` when the request may not wait (the answer is needed now: the sync
/// [`HttpLimiter::decide`], which cannot wait for Redis either); otherwise a
/// rejection that the request waits for (see [`Patience::waits_for`]) is recorded there, and
/// the verdict returned is the rejection it would have been, counted nowhere.
fn decide<C: Clock>(
    set: &RuleSet<C>,
    request: &RequestInfo<'_>,
    mut patience: Option<&mut Patience<C>>,
) -> Check {
    let normal;
    let normalized;
    // The path as a handler reads it, when it differs from the normalized one (an escape of a
    // reserved or non-ASCII character left, see `decoded_path`; an empty or `.` segment, see
    // `resolved_path`).
    let mut decoded = None;
    let request = if set.reads_path {
        // One byte search on the common path, as before: a path without `%` has one reading.
        let escaped = request.path.as_bytes().contains(&b'%');
        normal = if escaped {
            normalized_path(request.path)
        } else {
            None
        };
        let mut path = normal.as_deref().unwrap_or(request.path);
        if set.trim_trailing_slash {
            path = without_trailing_slash(path);
        }
        // Only a path with an escape left after normalizing, or with an empty or `.` segment,
        // has another reading.
        if escaped && path.contains('%') {
            decoded = decoded_path(path);
        }
        if let Some(resolved) = resolved_path(decoded.as_deref().unwrap_or(path)) {
            decoded = Some(resolved);
        }
        if let Some(text) = decoded.as_mut()
            && set.trim_trailing_slash
        {
            let trimmed = without_trailing_slash(text).len();
            text.truncate(trimmed);
        }
        if path.len() == request.path.len() && normal.is_none() {
            request
        } else {
            normalized = RequestInfo { path, ..*request };
            &normalized
        }
    } else {
        request
    };
    // An over-long client id is no client id: it would be a counter (and a key in the lists)
    // of any size the client chose. Nor is an empty one (`X-ClientId:` with no value): as a
    // key it would pass `missing_key = "reject"` and put every such client on one counter.
    // A request without a usable client id is the anonymous client, when there is one.
    let capped;
    let request = match request.client_id {
        Some(id) if id.is_empty() || id.len() > set.client_id_max_len => {
            capped = RequestInfo {
                client_id: set.anonymous_client.as_deref(),
                ..*request
            };
            &capped
        }
        None if set.anonymous_client.is_some() => {
            capped = RequestInfo {
                client_id: set.anonymous_client.as_deref(),
                ..*request
            };
            &capped
        }
        _ => request,
    };
    let ip = request.client_ip;
    let client = request.client_id;
    let whitelisted = ip.is_some_and(|ip| set.white_ips.contains(ip))
        || client.is_some_and(|c| set.white_clients.contains(c))
        || set
            .white_endpoints
            .iter()
            .any(|e| e.matches(request.method, request.path));
    if whitelisted {
        return Check::Ready(Verdict {
            outcome: Outcome::Whitelisted,
            quotas: Quotas::new(),
        });
    }
    if ip.is_some_and(|ip| set.block_ips.contains(ip))
        || client.is_some_and(|c| set.block_clients.contains(c))
    {
        tracing::debug!(ip = ?ip, client = ?client, "request rejected: blocklist");
        count_list_rejection!("blocklist");
        return Check::Ready(rejected(RejectReason::Blocked, BLOCKLIST.get(), None));
    }
    let ban = set
        .bans
        .as_ref()
        .and_then(|b| Some((b, b.key_of(request.client_ip, request.client_id)?)));
    if let Some((bans, key)) = &ban
        && let Some(left) = bans.check(key)
    {
        count_list_rejection!("ban");
        return Check::Ready(rejected(RejectReason::Banned, BAN.get(), Some(left)));
    }

    // The keys whose rules this request is exempt from (`whitelist.by_key`), as a bit each.
    let exempt: u8 = set
        .key_whitelists
        .iter()
        .filter(|w| w.matches(ip, client, request.method, request.path))
        .fold(0, |bits, w| bits | key_bit(w.key));

    // The whitelists exempt the path as written (normalized); the rules limit it as written
    // and as the handler reads it, and count it as the handler reads it, so that the
    // spellings a handler cannot tell apart share one counter.
    let written = request.path;
    let as_read;
    let request = match decoded.as_deref() {
        Some(path) => {
            as_read = RequestInfo { path, ..*request };
            &as_read
        }
        None => request,
    };

    // The common case, one global rule counted in memory and no monitors: decided without
    // collecting the selection, the plan or the refunds.
    if let (Some([rule]), false, 0) = (set.fixed_enforced.as_deref(), set.has_monitors, exempt) {
        #[cfg(feature = "redis")]
        let local = rule.remote.is_none();
        #[cfg(not(feature = "redis"))]
        let local = true;
        if local {
            return Check::Ready(decide_one(set, rule, request, ban.as_ref(), patience));
        }
    }

    let applies = |r: &&Arc<Rule<C>>| {
        if exempt & key_bit(r.key) != 0 {
            false
        } else if set.endpoint_rate_limiting {
            r.endpoint.matches(request.method, request.path)
                || (decoded.is_some() && r.endpoint.matches(request.method, written))
        } else {
            r.endpoint.is_any()
        }
    };
    let client_rules = client.and_then(|c| set.client.get(c));
    let specific = || {
        set.ip
            .iter()
            .filter(move |(net, _)| ip.is_some_and(|ip| net.contains(&ip)))
            .flat_map(|(_, rules)| rules.iter())
            .chain(client_rules.into_iter().flatten())
            .filter(applies)
    };
    let general = || set.general.iter().filter(applies);
    let enforced = match &set.fixed_enforced {
        Some(fixed) if exempt == 0 => fixed.iter().collect(),
        _ => select(specific(), general(), false),
    };
    // Exempt from the rules of some key and none of the others applies: as whitelisted as
    // a request the global whitelist matches.
    if exempt != 0
        && enforced.is_empty()
        && !(set.has_monitors && specific().chain(general()).any(|r| r.monitor))
    {
        return Check::Ready(Verdict {
            outcome: Outcome::Whitelisted,
            quotas: Quotas::new(),
        });
    }

    // Check limit 0 and missing keys before charging anything. A block wins over a missing
    // key whatever the rules' order: it holds whatever key the request has, so the client is
    // told it is blocked rather than to send a key that would not help.
    let mut plan: SmallVec<[_; 4]> = SmallVec::new();
    let mut no_key = None;
    for rule in &enforced {
        match planned(set, rule, request) {
            Ok(Some((limiter, key))) => plan.push((rule, limiter, key)),
            Ok(None) => continue,
            Err(Unplanned::Blocked) => {
                return Check::Ready(unplanned(rule, Unplanned::Blocked, request));
            }
            Err(Unplanned::NoKey) => {
                no_key.get_or_insert(rule);
            }
        }
    }
    if let Some(rule) = no_key {
        return Check::Ready(unplanned(rule, Unplanned::NoKey, request));
    }

    // Selected before counting: with the Redis backend they decide where the request counts.
    let monitors = if set.has_monitors {
        select(specific(), general(), true)
    } else {
        SmallVec::new()
    };

    // Monitor rules count in Redis too, also when no enforced rule counts the request there (a
    // configuration of monitor rules only, an enforced rule the request has no key for).
    #[cfg(feature = "redis")]
    if plan.iter().any(|(rule, _, _)| rule.remote.is_some())
        || monitors.iter().any(|rule| rule.remote.is_some())
    {
        use crate::http::redis_rules::{Step, count};
        // Only monitor rules count: the sync `decide`, which cannot wait for Redis, admits the
        // request uncounted rather than have a monitor rule reject it.
        if plan.is_empty() && patience.is_none() {
            return Check::Ready(Verdict {
                outcome: Outcome::Admitted,
                quotas: Quotas::new(),
            });
        }
        let steps = |list: Vec<(&Arc<Rule<C>>, CounterKey)>| {
            list.into_iter()
                .map(|(rule, key)| Step {
                    rule: Arc::clone(rule),
                    key,
                })
                .collect()
        };
        // A monitor of limit 0 (no limiter) would block whatever key the request has, as in
        // memory; one that counts needs the request's key.
        let monitors = monitors
            .iter()
            .filter_map(|r| match (&r.limiter, counter_key(r, request)) {
                (None, _) => Some((Arc::clone(r), None)),
                (Some(_), None) => None,
                (Some(_), key) => Some((Arc::clone(r), key)),
            })
            .collect();
        return count(
            steps(plan.into_iter().map(|(r, _, k)| (*r, k)).collect()),
            monitors,
            ban.map(|(bans, key)| (Arc::clone(bans), key)),
        );
    }

    // The order the rules are charged in, as a `Chain` commits its members: the rules whose
    // refunds are exact first, in their order, then the exact sliding windows. A sliding
    // window's refund is positional (the permit is freed, but its ticket's place in the ring
    // stays taken until it expires), so a client rejected over and over by a rule charged after
    // one would fill that window with places. The last rule charged is never refunded. Of
    // several sliding windows, one that would reject now goes first among them, so that none
    // of the others is charged for a rejection seen coming.
    let mut order: SmallVec<[usize; 4]> = (0..plan.len()).collect();
    let exact: SmallVec<[bool; 4]> = plan
        .iter()
        .map(|(_, limiter, _)| limiter.chain_exact_refund())
        .collect();
    if exact.iter().any(|&exact| !exact) {
        let several = exact.iter().filter(|&&exact| !exact).count() > 1;
        let rank: SmallVec<[u8; 4]> = plan
            .iter()
            .zip(&exact)
            .map(|((_, limiter, key), &exact)| match exact {
                true => 0,
                false
                    if several
                        && matches!(
                            limiter.chain_decide_uncounted::<false>(key, 1).0,
                            Err(TryAcquireError::Rejected(_))
                        ) =>
                {
                    1
                }
                false => 2,
            })
            .collect();
        order.sort_by_key(|&index| rank[index]);
    }
    // The admissions to refund if a later rule rejects: the last rule's never is.
    let mut charged: SmallVec<[_; 3]> = SmallVec::new();
    // The quotas, reported in the rules' order whatever the order of charging.
    let mut quota_of: SmallVec<[Option<QuotaState>; 4]> = SmallVec::from_elem(None, plan.len());
    // The rules a full limiter let this request pass uncounted (`key_overflow = "allow"`):
    // they report no quota, admitted or rejected.
    let mut uncounted: SmallVec<[usize; 2]> = SmallVec::new();
    // The permit a wait in a rule's queue got this request, and once that rule is reached, the
    // same permit as its charge, given back if another rule rejects.
    let mut held = patience.as_deref_mut().and_then(|p| p.held.take());
    let mut used = None;
    for (step, &index) in order.iter().enumerate() {
        let (rule, limiter, key) = &plan[index];
        let ((decided, committed), waited) = match take_held(&mut held, limiter, key) {
            Some(receipt) => {
                let admission = receipt.admission();
                used = Some(receipt);
                ((Ok(admission), Default::default()), true)
            }
            None => (limiter.chain_decide::<true>(key, 1), false),
        };
        // The queue's admission may have been the shared overflow cell's (the key was taken
        // out of the limiter while the request waited, and the rule was full of others).
        let overflow = match &used {
            Some(receipt) if waited => receipt.overflowed(),
            _ => committed.overflow,
        };
        // A request decided again after a wait is counted in the overflow metric once per rule.
        count_shared_overflow(
            rule,
            overflow && first_overflow(patience.as_deref_mut(), rule),
        );
        match decided {
            Ok(admission) => {
                quota_of[index] =
                    Some(rule.quota(u64::from(admission.remaining()), admission.reset_after()));
                // The permit of the wait is given back through its receipt.
                if step + 1 < order.len() && !waited {
                    charged.push((limiter, key, admission, committed));
                }
            }
            // Not charged, nothing to refund: the rule does not count this client.
            Err(error) if passes_full_rule(set, rule, key, &error, patience.as_deref_mut()) => {
                uncounted.push(index)
            }
            Err(error) => {
                give_back(charged.drain(..).map(|(l, k, a, o)| (*l, k, a, o)));
                if let Some(receipt) = used.take().or(held.take()) {
                    receipt.refund();
                }
                if let Some(patience) = patience.as_deref_mut()
                    && !(matches!(error, TryAcquireError::Rejected(_))
                        && !overflow
                        && refused_past_the_wait(rule, &plan, &order[step + 1..], patience))
                    && patience.waits_for(rule, key, &error, overflow)
                {
                    return Check::Ready(would_reject(rule, &error));
                }
                // A rule it cannot wait for refused it: it may wait for a rule not reached yet
                // that refuses it too, as when that rule is charged first. Also when the
                // refusal is the key cap's (`TooManyKeys`, or the shared overflow counter's):
                // charged first, that rule weighs this one by a probe, which never takes a
                // `TooManyKeys` for a refusal to wait out and sees the shared counter only as
                // a search for room left it; it waits then, and meets the cap when its turn
                // comes, as here (`refused_past_the_wait` weighs this rule the same way).
                if let Some(patience) = patience.as_deref_mut()
                    && matches!(
                        error,
                        TryAcquireError::Rejected(_) | TryAcquireError::TooManyKeys { .. }
                    )
                    && let Some(waits) = waits_for_a_later_rule(&plan, &order[step..], patience)
                {
                    return Check::Ready(waits);
                }
                let own_retry = match &error {
                    TryAcquireError::Rejected(r) => Some(r.retry_after()),
                    _ => None,
                };
                // The quotas, in the rules' order; and of the other rules that would reject
                // the request for its rate as well (probed, not charged), the one that asks to
                // wait longest, if longer than the rule that rejected it: a client that waits
                // as the rejection says must not be turned away by a rule this decision saw
                // would still refuse it (two rules of 1 s and 1 m both exhausted said "retry
                // after 1 s", and the retry met the other's 59 s). The Redis backend names the
                // same rule (`BackendConfig`, "a rejected one names the rule that asks to wait
                // longest").
                let mut quotas = Quotas::with_capacity(plan.len());
                // The rule's index in `plan`, its quota's in `quotas`, its rejection, its wait.
                let mut longest: Option<(usize, usize, TryAcquireError, Duration)> = None;
                for (other, (other_rule, other_limiter, other_key)) in plan.iter().enumerate() {
                    if uncounted.contains(&other) {
                        continue;
                    }
                    if other == index {
                        quotas.push(rule.quota(0, own_retry.unwrap_or(rule.period)));
                        continue;
                    }
                    let (quota, refused) = probe_quota(other_rule, other_limiter, other_key);
                    quotas.push(quota);
                    let wait = longest.as_ref().map(|l| l.3).or(own_retry);
                    if let (Some(wait), Some(TryAcquireError::Rejected(r))) = (wait, &refused)
                        && r.retry_after() > wait
                    {
                        let retry = r.retry_after();
                        let at = quotas.len() - 1;
                        longest = refused.map(|refused| (other, at, refused, retry));
                    }
                }
                // The bookkeeping is the named rule's; whether the rejection counts towards a
                // ban is the rejecting rule's answer (its own counter, or the shared overflow
                // counter that bans no one). The named rule reports nothing left, as the rule
                // that rejected does (a probe counts the permits free, which requests waiting
                // for them may hold back).
                let (named, named_key, named_error) = match longest {
                    Some((other, at, refused, _)) => {
                        quotas[at].remaining = 0;
                        (*plan[other].0, &plan[other].2, refused)
                    }
                    None => (**rule, key, error),
                };
                let (reason, retry_after) =
                    rejected_by(named, named_key, &named_error, overflow, ban.as_ref());
                return Check::Ready(Verdict {
                    outcome: Outcome::Rejected {
                        reason,
                        rule: named.local_name(),
                        retry_after,
                    },
                    quotas,
                });
            }
        }
    }
    for rule in &monitors {
        // A monitor of limit 0 would block whatever key the request has, as an enforced one
        // does (`planned`).
        let key = counter_key(rule, request);
        // The permit the request waited for in this rule's queue, the rule made a monitor by a
        // reload as the permit came: that permit is its charge (kept, not given back). Charged
        // again, the monitor met the request's own permit held and counted a rejection the
        // request never earned (at limit 1, always).
        if let (Some(l), Some(key)) = (&rule.limiter, &key)
            && let Some(receipt) = take_held(&mut held, l, key)
        {
            if receipt.overflowed() {
                rule.counters.increment(Metric::KeyOverflow);
            }
            continue;
        }
        let would_reject = match (&rule.limiter, &key) {
            (None, _) => true,
            (Some(_), None) => continue,
            (Some(l), Some(key)) => {
                // Taken as an enforced rule's last member is (never refunded), so that the
                // overflow is seen: a client the rule has no room for is counted as for an
                // enforced rule, whatever `key_overflow` does with it (under `"allow"` a full
                // monitor rule counts no new client, and this is all that says so).
                let (decided, committed) = l.chain_decide::<true>(key, 1);
                let full = matches!(decided, Err(TryAcquireError::TooManyKeys { .. }));
                if committed.overflow || full {
                    rule.counters.increment(Metric::KeyOverflow);
                }
                match decided {
                    Ok(_) => false,
                    Err(TryAcquireError::TooManyKeys { .. }) => {
                        set.key_overflow != KeyOverflowPolicy::Allow
                    }
                    Err(_) => true,
                }
            }
        };
        if would_reject {
            tracing::debug!(rule = %rule.name, key = ?key, "monitor rule would reject");
            rule.counters.increment(Metric::ShadowRejected);
        }
    }
    for (index, (rule, _, _)) in plan.iter().enumerate() {
        if !uncounted.contains(&index) {
            rule.counters.increment(Metric::Admitted);
        }
    }
    // The rule the request waited for no longer applies to it (a reload): not charged.
    if let Some(receipt) = held {
        receipt.refund();
    }
    Check::Ready(Verdict {
        outcome: Outcome::Admitted,
        quotas: quota_of.into_iter().flatten().collect(),
    })
}

/// Whether a wait for `rule` would end in a rejection whenever it ended: a rule of `later` (the
/// request's rules not decided yet, in `plan`), probed, not charged, would still refuse the
/// request when all that remains of `rule`'s `max_wait` has passed, and the request could not
/// wait for that one (it has no queue, or its answer comes after its own `max_wait`). Such a
/// request is rejected at once, as it is when that rule comes first: waiting, it held a place
/// in `rule`'s queue, which counts the requests of every client (a client over a 1-minute
/// limit could keep the 1-second rule's queue full, and other clients were rejected at once
/// rather than wait), and then was rejected all the same. Probed only when the request could
/// wait for `rule` otherwise (a rate-limit rejection of its own counter by a rule with a queue,
/// the request not past waiting).
#[cold]
fn refused_past_the_wait<C: Clock>(
    rule: &Rule<C>,
    plan: &[Planned<'_, '_, C>],
    later: &[usize],
    patience: &Patience<C>,
) -> bool {
    let (Some(queue), false) = (&rule.queue, patience.done) else {
        return false;
    };
    let budget = patience.budget(queue.max_wait);
    later.iter().any(|&index| {
        let (other, limiter, key) = &plan[index];
        // Uncounted, as a quota's probe (`probe_quota`).
        let (Err(TryAcquireError::Rejected(refused)), _, _) =
            limiter.chain_decide_uncounted::<false>(key, 1)
        else {
            return false;
        };
        let retry = refused.retry_after();
        retry > budget
            && other
                .queue
                .as_ref()
                .is_none_or(|q| retry > patience.budget(q.max_wait))
    })
}

/// The wait, if any, for a rule of `rest[1..]` (the request's rules not charged yet, in
/// `plan`) after `rest[0]` refused the request (for its rate, or for the rule's key cap:
/// `TooManyKeys` or the shared overflow counter), and the request could not wait for that one: the first of them with a queue that refuses the request too
/// (probed, not charged) and that it would wait for had it been charged first (see
/// [`Patience::waits_for`] and [`refused_past_the_wait`], which then weighs `rest[0]` as a rule
/// after it). Recorded in `patience`; the rejection it would have been, counted nowhere, is
/// returned. Without this, a rule without a queue charged before the one with a queue answered
/// a refusal that ends within the wait at once, where the other order waited and admitted.
/// Only before the request's first wait: once it has waited, a rule without a queue that
/// rejects it gives the final answer (see "Waiting" on [`HttpLimiter`]).
#[cold]
fn waits_for_a_later_rule<C: Clock>(
    plan: &[Planned<'_, '_, C>],
    rest: &[usize],
    patience: &mut Patience<C>,
) -> Option<Verdict> {
    // A place held in a queue: the request has waited.
    if patience.done || patience.slot.is_some() {
        return None;
    }
    for (at, &index) in rest.iter().enumerate().skip(1) {
        let (rule, limiter, key) = &plan[index];
        if rule.queue.is_none() {
            continue;
        }
        // A refusal by the rule's shared overflow counter (the rule full of other clients) is
        // none of the client's own counter: not waited for, as when the rule is charged first
        // (`Patience::waits_for`). Told by the probe's third value (it met the key cap): its
        // `Committed` is always empty, so that read took the shared counter's refusal for the
        // client's own, and the request waited in the queue of a counter the rule does not
        // hold for it. Uncounted too: a probe is no call of the rule's.
        let (Err(error @ TryAcquireError::Rejected(_)), _, false) =
            limiter.chain_decide_uncounted::<false>(key, 1)
        else {
            continue;
        };
        let others: SmallVec<[usize; 4]> = rest
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != at)
            .map(|(_, &index)| index)
            .collect();
        if !refused_past_the_wait(rule, plan, &others, patience)
            && patience.waits_for(rule, key, &error, false)
        {
            return Some(would_reject(rule, &error));
        }
    }
    None
}

/// A rule of a request's plan (`decide`): the rule, its limiter, the request's counter key.
type Planned<'a, 'r, C> = (
    &'a &'r Arc<Rule<C>>,
    &'r crate::KeyedLimiter<CounterKey, C>,
    CounterKey,
);

/// Gives back the charges of the rules that admitted a request a later rule rejected, as
/// [`KeyedChain`](crate::KeyedChain) does: each permit goes back to its key, and the head of
/// the key's queue is woken, as a receipt's refund wakes it
/// ([`KeyedRefundable::refund`](crate::KeyedRefundable::refund)). A request that queued for
/// that key while this one held the permit (another thread's, rejected in between) is then
/// admitted now, not when its own timer ends.
fn give_back<'r, C: Clock>(
    charged: impl Iterator<
        Item = (
            &'r crate::KeyedLimiter<CounterKey, C>,
            &'r CounterKey,
            crate::Admission,
            crate::chain::Committed,
        ),
    >,
) {
    for (limiter, key, admission, committed) in charged {
        // A charge the shared overflow cell took wakes every key's head: that cell's waiters
        // wait in their own keys' queues (see `KeyedLimiter::chain_wake`).
        let overflow = committed.overflow;
        limiter.chain_refund(key, 1, &admission, committed);
        limiter.chain_wake(key, overflow, None);
    }
}

/// A rule's limiter and the key it counts a request under.
type Charge<'r, C> = (&'r crate::KeyedLimiter<CounterKey, C>, CounterKey);

/// Why a rule cannot be charged for a request: it blocks (limit 0), or the request has no key
/// for it and `missing_key` rejects.
#[derive(Clone, Copy)]
enum Unplanned {
    Blocked,
    NoKey,
}

/// What charging `rule` for `request` takes: its limiter and the request's counter key.
/// [`Unplanned::Blocked`] when the rule blocks (limit 0), whatever key the request has: a
/// block counts nothing, so it needs none (a `key = "client"` rule of limit 0 on `*:/admin/*`
/// must not let requests without a client id through under `missing_key = "allow"`).
/// Otherwise `None` when the request has no key for the rule and `missing_key` lets it pass
/// uncounted, [`Unplanned::NoKey`] when it has none and `missing_key` rejects.
#[inline]
fn planned<'r, C: Clock>(
    set: &RuleSet<C>,
    rule: &'r Rule<C>,
    request: &RequestInfo<'_>,
) -> Result<Option<Charge<'r, C>>, Unplanned> {
    let Some(limiter) = &rule.limiter else {
        return Err(Unplanned::Blocked);
    };
    let Some(key) = counter_key(rule, request) else {
        if set.missing_key == MissingKey::Reject {
            return Err(Unplanned::NoKey);
        }
        return Ok(None);
    };
    Ok(Some((limiter, key)))
}

/// The rejection of `request` by `rule`, which cannot be charged for it (see [`planned`]):
/// logged and counted.
#[cold]
fn unplanned<C: Clock>(rule: &Rule<C>, why: Unplanned, request: &RequestInfo<'_>) -> Verdict {
    rule.counters.increment(Metric::Rejected);
    match why {
        Unplanned::Blocked => {
            tracing::debug!(rule = %rule.name, ip = ?request.client_ip, client = ?request.client_id, "request rejected: blocked by a rule with limit 0");
            rejected(RejectReason::Blocked, rule.local_name(), None)
        }
        Unplanned::NoKey => {
            tracing::debug!(rule = %rule.name, "request rejected: no client key");
            rejected(RejectReason::NoKey, rule.local_name(), None)
        }
    }
}

/// The rejection of a request that waits for `rule` instead: what it would have been, for the
/// caller that then waits, with no bookkeeping.
fn would_reject<C: Clock>(rule: &Rule<C>, error: &TryAcquireError) -> Verdict {
    let retry_after = match error {
        TryAcquireError::Rejected(r) => Some(r.retry_after()),
        _ => None,
    };
    rejected(RejectReason::RateLimited, rule.local_name(), retry_after)
}

/// The bookkeeping of a request `rule` rejected with `error`: the log line, the metric, and the
/// rejection counted towards a ban. `overflow`: the rule's shared overflow counter decided
/// (`key_overflow = "shared"`). Returns the reason and the retry-after.
fn rejected_by<C: Clock>(
    rule: &Rule<C>,
    key: &CounterKey,
    error: &TryAcquireError,
    overflow: bool,
    ban: Option<&(&Arc<Bans<C>>, BanKey)>,
) -> (RejectReason, Option<Duration>) {
    tracing::debug!(rule = %rule.name, key = ?key, error = %error, "request rejected");
    rule.counters.increment(Metric::Rejected);
    let rate_limited = matches!(error, TryAcquireError::Rejected(_));
    // Only rate-limit rejections of the client's own counter count towards a ban: a client
    // refused because the rule is full of other clients (`TooManyKeys`, or the shared overflow
    // counter that the other new clients used up) did nothing to deserve one.
    if let (Some((bans, client)), true, false) = (ban, rate_limited, overflow) {
        bans.count_rejection(client, &rule.counters);
    }
    match error {
        TryAcquireError::Rejected(r) => (RejectReason::RateLimited, Some(r.retry_after())),
        TryAcquireError::TooManyKeys { .. } => (RejectReason::TooManyKeys, None),
        _ => (RejectReason::Unavailable, None),
    }
}

/// Whether `rule`'s answer `error` is its limiter being full of other clients with
/// `key_overflow = "allow"`: the request then passes the rule uncounted. Counts the overflow
/// (`Reject` rejects after this; `Shared` never gets here, its decisions are counted by
/// [`count_shared_overflow`]), once per rule for a request decided again after a wait (see
/// [`first_overflow`]).
fn passes_full_rule<C: Clock>(
    set: &RuleSet<C>,
    rule: &Arc<Rule<C>>,
    key: &CounterKey,
    error: &TryAcquireError,
    patience: Option<&mut Patience<C>>,
) -> bool {
    if !matches!(error, TryAcquireError::TooManyKeys { .. }) {
        return false;
    }
    if first_overflow(patience, rule) {
        rule.counters.increment(Metric::KeyOverflow);
    }
    let allow = set.key_overflow == KeyOverflowPolicy::Allow;
    tracing::debug!(rule = %rule.name, key = ?key, allow, "rule full: a new client is not counted");
    allow
}

/// Whether the overflow `rule` met for this request is the first it met for it: a request that
/// waits is decided again, and reaches rules after the wait it did not reach before (the rule
/// that made it wait may be charged first), so what counts once per request is kept per rule.
fn first_overflow<C: Clock>(patience: Option<&mut Patience<C>>, rule: &Arc<Rule<C>>) -> bool {
    match patience {
        None => true,
        Some(patience) => {
            // The rule's address names it: the request holds the rule set it was last decided
            // under, and carries the addresses over to a reload's (`Patience::follow`); no
            // clone of the rule, no reference count to touch on a path that clients a full
            // rule take.
            let address = Arc::as_ptr(rule) as usize;
            if patience.overflowed.contains(&address) {
                false
            } else {
                patience.overflowed.push(address);
                true
            }
        }
    }
}

/// Counts a decision, admission or rejection, the shared overflow counter made
/// (`key_overflow = "shared"`).
fn count_shared_overflow<C: Clock>(rule: &Rule<C>, overflow: bool) {
    if overflow {
        rule.counters.increment(Metric::KeyOverflow);
    }
}

/// [`decide`] for a request under exactly one enforced rule, counted in memory, with no monitor
/// rules: the same answers, without the lists the general case keeps.
fn decide_one<C: Clock>(
    set: &RuleSet<C>,
    rule: &Arc<Rule<C>>,
    request: &RequestInfo<'_>,
    ban: Option<&(&Arc<Bans<C>>, BanKey)>,
    mut patience: Option<&mut Patience<C>>,
) -> Verdict {
    let (limiter, key) = match planned(set, rule, request) {
        Ok(Some(plan)) => plan,
        Ok(None) => {
            return Verdict {
                outcome: Outcome::Admitted,
                quotas: Quotas::new(),
            };
        }
        Err(why) => return unplanned(rule, why, request),
    };
    let mut held = patience.as_deref_mut().and_then(|p| p.held.take());
    let receipt = take_held(&mut held, limiter, &key);
    // The rule the request waited for no longer applies to it (a reload): not charged.
    if let Some(other) = held {
        other.refund();
    }
    let (decided, overflow) = match receipt {
        // The permit of the wait is the charge; dropped, it stays spent. It may have been the
        // shared overflow cell's, as in `decide`.
        Some(receipt) => (Ok(receipt.admission()), receipt.overflowed()),
        None => {
            let (decided, committed) = limiter.chain_decide::<true>(&key, 1);
            (decided, committed.overflow)
        }
    };
    // Once per rule for a request decided again after a wait, as in `decide` (a reload may
    // have left this rule alone of the rules it met before).
    count_shared_overflow(
        rule,
        overflow && first_overflow(patience.as_deref_mut(), rule),
    );
    match decided {
        Ok(admission) => {
            rule.counters.increment(Metric::Admitted);
            Verdict {
                outcome: Outcome::Admitted,
                quotas: rule
                    .quota(u64::from(admission.remaining()), admission.reset_after())
                    .into(),
            }
        }
        Err(error) if passes_full_rule(set, rule, &key, &error, patience.as_deref_mut()) => {
            Verdict {
                outcome: Outcome::Admitted,
                quotas: Quotas::new(),
            }
        }
        Err(error) => {
            if let Some(patience) = patience
                && patience.waits_for(rule, &key, &error, overflow)
            {
                return would_reject(rule, &error);
            }
            let (reason, retry_after) = rejected_by(rule, &key, &error, overflow, ban);
            Verdict {
                outcome: Outcome::Rejected {
                    reason,
                    rule: rule.local_name(),
                    retry_after,
                },
                quotas: rule.quota(0, retry_after.unwrap_or(rule.period)).into(),
            }
        }
    }
}

impl<C: Clock + Clone> HttpLimiter<C> {
    /// Decides one request as the layer does: at once ([`Check::Ready`]), or later
    /// ([`Check::Pending`]) when the rules count in Redis or the request waits for a rule's
    /// queue (see "Waiting" above; the future then needs tokio's timer).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ManualClock;
    /// use turnstile::http::{Check, HttpConfig, HttpLimiter, RequestInfo};
    ///
    /// let config = HttpConfig::from_toml_str("[[rules]]\nperiod = \"1s\"\nlimit = 1\n")?;
    /// let limiter = HttpLimiter::with_clock(config, ManualClock::new())?;
    /// let request = RequestInfo {
    ///     method: &http::Method::GET,
    ///     path: "/",
    ///     client_ip: Some("203.0.113.7".parse().unwrap()),
    ///     client_id: None,
    /// };
    /// assert!(matches!(limiter.check(&request), Check::Ready(v) if v.outcome.is_admitted()));
    /// assert!(matches!(limiter.check(&request), Check::Ready(v) if !v.outcome.is_admitted()));
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn check(&self, request: &RequestInfo<'_>) -> Check {
        match self.decide_in(&self.config.load(), request) {
            Decision::Ready(verdict) => Check::Ready(verdict),
            Decision::Pending(pending) => Check::Pending(Box::pin(async move { pending.await.0 })),
        }
    }

    /// Decides `request` under `snapshot`'s rules. A decision that comes later comes with the
    /// snapshot it was made under: `snapshot`, or for a request that waited across a reload,
    /// the one in force when it was decided again.
    fn decide_in(&self, snapshot: &Arc<Snapshot<C>>, request: &RequestInfo<'_>) -> Decision {
        let mut patience = Patience::new();
        let check = decide(&snapshot.rules, request, Some(&mut patience));
        if let Some(wait) = patience.wait.take() {
            return Decision::Pending(wait_and_decide(
                Arc::clone(&self.config),
                Arc::clone(&self.reloaded),
                Arc::clone(snapshot),
                OwnedRequest::of(request),
                patience,
                wait,
            ));
        }
        match check {
            Check::Ready(verdict) => Decision::Ready(verdict),
            Check::Pending(pending) => {
                let answered: Answered = Arc::clone(snapshot) as Answered;
                Decision::Pending(Box::pin(async move { (pending.await, answered) }))
            }
        }
    }
}

impl<C: Clock + Clone> Sealed for HttpLimiter<C> {
    type Source = ();
    type Loaded = arc_swap::Guard<Arc<Snapshot<C>>>;

    fn load(&self, _: &()) -> Self::Loaded {
        self.config.load()
    }

    fn settings(loaded: &Self::Loaded) -> &LayerSettings {
        &loaded.settings
    }

    fn decide(&self, loaded: &Self::Loaded, _: &(), request: &RequestInfo<'_>) -> Decision {
        self.decide_in(loaded, request)
    }
}

impl<C: Clock + Clone> LayerPolicy for HttpLimiter<C> {}

/// A request's waiting for its rules (`queue_limit`), across its decisions: when it arrived,
/// the place it holds among a rule's waiting requests, what the last decision asked, and the
/// permit its wait in a rule's limiter got it.
struct Patience<C: Clock> {
    /// When the request first met a rule it may wait for (its arrival: a decision is made at
    /// once). Read only then, so that requests that never wait read no clock here.
    since: Option<tokio::time::Instant>,
    /// The place held among a rule's waiting requests.
    slot: Option<WaitSlot<C>>,
    /// Set by a decision that chose to wait: the rule and counter key to wait for (boxed: a
    /// request that never waits carries a pointer).
    wait: Option<Box<Wait<C>>>,
    /// The permit the waited-for rule's limiter admitted the request with, from the key's
    /// queue: the next decision counts it as that rule's charge (see [`take_held`]), and gives
    /// it back if the request is not admitted. Boxed, as `wait` is.
    held: Option<Box<Receipt<C>>>,
    /// The wait ended without a permit and waiting again would end the same way (`max_wait`
    /// reached, or the limiter refused the request a place: see [`queued`]): the next decision
    /// is final, its rejection the request's answer.
    done: bool,
    /// The rules (by address) whose key overflow this request was counted in (see
    /// [`first_overflow`]).
    overflowed: SmallVec<[usize; 2]>,
}

/// A permit of a rule's limiter that can be given back.
type Receipt<C> = crate::KeyedRefundable<CounterKey, C, crate::sync::RandomHasher>;

/// What a request waits for: a permit of `rule`'s limiter for `key`.
struct Wait<C: Clock> {
    rule: Arc<Rule<C>>,
    key: CounterKey,
}

impl<C: Clock> Patience<C> {
    fn new() -> Self {
        Patience {
            since: None,
            slot: None,
            wait: None,
            held: None,
            done: false,
            overflowed: SmallVec::new(),
        }
    }

    /// Whether the request `rule` rejected with `error` waits for it: a rate-limit rejection of
    /// the client's own counter (`key`), by a rule with a queue that has room (or whose place
    /// the request holds), answered within the rule's `max_wait` of the request's arrival. If
    /// so, holds the place and records the wait.
    fn waits_for(
        &mut self,
        rule: &Arc<Rule<C>>,
        key: &CounterKey,
        error: &TryAcquireError,
        overflow: bool,
    ) -> bool {
        let (Some(queue), TryAcquireError::Rejected(rejection), false, false) =
            (&rule.queue, error, overflow, self.done)
        else {
            return false;
        };
        let now = tokio::time::Instant::now();
        let since = *self.since.get_or_insert(now);
        let retry = rejection.retry_after();
        // An instant beyond `Instant`'s range: a wait of centuries, past any deadline; a
        // deadline beyond it: none.
        let fits = match (now.checked_add(retry), since.checked_add(queue.max_wait)) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(answer), Some(deadline)) => answer <= deadline,
        };
        if !fits {
            return false;
        }
        if !self.slot.as_ref().is_some_and(|s| s.is_for(rule)) {
            let Some(slot) = WaitSlot::enter(rule) else {
                tracing::debug!(rule = %rule.name, "rule's queue full: the request may not wait for it");
                return false;
            };
            rule.counters.increment(Metric::Waited);
            self.slot = Some(slot);
        }
        tracing::debug!(rule = %rule.name, retry_after = ?retry, "request waits for its rule");
        self.wait = Some(Box::new(Wait {
            rule: Arc::clone(rule),
            key: key.clone(),
        }));
        true
    }

    /// How long the request may still wait: what remains of `max_wait` since its arrival
    /// (`Duration::MAX` when that deadline is beyond `Instant`'s range).
    fn budget(&self, max_wait: Duration) -> Duration {
        let since = self.since.unwrap_or_else(tokio::time::Instant::now);
        match since.checked_add(max_wait) {
            Some(deadline) => deadline.saturating_duration_since(tokio::time::Instant::now()),
            None => Duration::MAX,
        }
    }
}

/// The permit `held` holds for `limiter` and `key`, taken out of it: a request admitted from
/// the key's queue of `limiter` (a rule, or that rule as a reload kept it, which keeps its
/// limiter) counts it as the rule's charge instead of being charged again.
#[inline]
fn take_held<C: Clock>(
    held: &mut Option<Box<Receipt<C>>>,
    limiter: &crate::KeyedLimiter<CounterKey, C>,
    key: &CounterKey,
) -> Option<Box<Receipt<C>>> {
    match held {
        Some(receipt) if receipt.is_from(limiter) && receipt.key() == key => held.take(),
        _ => None,
    }
}

impl<C: Clock> Patience<C> {
    /// Carries what is kept per rule from the rules of `old` to those of `new`, a reload's
    /// configuration: the rules whose key overflow was counted are named by address, and a
    /// rule the reload kept (same identity) has a new one. (The place in a queue needs nothing:
    /// a kept rule keeps its queue's count, see [`WaitSlot::is_for`].)
    fn follow(&mut self, old: &RuleSet<C>, new: &RuleSet<C>) {
        if self.overflowed.is_empty() {
            return;
        }
        let counted: Vec<&Identity> = old
            .all_rules()
            .filter(|r| self.overflowed.contains(&(Arc::as_ptr(r) as usize)))
            .map(|r| &r.identity)
            .collect();
        self.overflowed = new
            .all_rules()
            .filter(|r| counted.contains(&&r.identity))
            .map(|r| Arc::as_ptr(r) as usize)
            .collect();
    }
}

/// A request as [`RequestInfo`] has it, owned by a decision that waits.
struct OwnedRequest {
    method: http::Method,
    path: String,
    client_ip: Option<IpAddr>,
    client_id: Option<String>,
}

impl OwnedRequest {
    fn of(request: &RequestInfo<'_>) -> Self {
        OwnedRequest {
            method: request.method.clone(),
            path: request.path.to_owned(),
            client_ip: request.client_ip,
            client_id: request.client_id.map(str::to_owned),
        }
    }

    fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            method: &self.method,
            path: &self.path,
            client_ip: self.client_ip,
            client_id: self.client_id.as_deref(),
        }
    }
}

/// The decision of a request that waits: waits in the queue of its rule's limiter for its
/// counter key (`wait`), oldest first, at most what remains of the rule's `max_wait` (less if a
/// reload that does not keep its wait comes, `reloaded`: see [`queued`]); then decides again (under the snapshot in force then, `config`;
/// `set` is the one it was last decided under, and the one its verdict comes with), counting
/// the permit the queue gave it as that rule's charge, and so on while the decisions ask it to
/// wait. Holds no permit while it waits, only its places in the queues, so dropping it
/// consumes nothing; a permit its next decision does not count (another rule rejects, a
/// reload dropped the rule) is given back, to the next request waiting for it.
///
/// Not under the rules it arrived under: a reload reconfigures the limiters of the rules it
/// keeps in place, which those rules share with the old ones, so the old rule's limit would
/// be reported beside a count made under the new one; and the limiters of the rules a reload
/// replaced count for no one any more.
fn wait_and_decide<C: Clock>(
    config: Arc<ArcSwap<Snapshot<C>>>,
    reloaded: Arc<tokio::sync::Notify>,
    mut set: Arc<Snapshot<C>>,
    request: OwnedRequest,
    mut patience: Patience<C>,
    mut wait: Box<Wait<C>>,
) -> Pin<Box<dyn Future<Output = (Verdict, Answered)> + Send + 'static>> {
    Box::pin(async move {
        loop {
            {
                // A reload that does not keep the wait ends it (see `queued`). Registered
                // before the rules are compared, so a reload after the comparison wakes it, and
                // one before it is seen there (no wait at all: decided again at once).
                let mut notified = std::pin::pin!(reloaded.notified());
                notified.as_mut().enable();
                // Whether the configuration in force still has the request wait where it
                // waits: under `set`, or under a reload that kept its rule's limiter and
                // `max_wait` (the limiter applies a changed limit to its queue itself, and the
                // request is decided under the rules in force once its turn comes).
                let keeps = || {
                    let current = config.load();
                    Arc::ptr_eq(&current, &set)
                        || current
                            .rules
                            .all_rules()
                            .any(|rule| waits_alike(rule, &wait.rule))
                };
                if Arc::ptr_eq(&config.load(), &set) {
                    patience.held = match &wait.rule.limiter {
                        Some(limiter) => {
                            let budget = wait
                                .rule
                                .queue
                                .as_ref()
                                .map_or(Duration::ZERO, |q| patience.budget(q.max_wait));
                            let done = &mut patience.done;
                            queued(limiter, &wait.key, budget, &reloaded, notified, keeps, done)
                                .await
                        }
                        // A rule of limit 0 has no queue (refused at load): never here.
                        None => None,
                    };
                }
            }
            let current = config.load_full();
            if !Arc::ptr_eq(&current, &set) {
                patience.follow(&set.rules, &current.rules);
                set = current;
            }
            let check = decide(&set.rules, &request.info(), Some(&mut patience));
            // Not counted (a list or a whitelist answered before the rules): not charged.
            if let Some(receipt) = patience.held.take() {
                receipt.refund();
            }
            match patience.wait.take() {
                Some(next) => wait = next,
                None => {
                    // The verdict with the snapshot it was made under, whose settings the
                    // layer answers it with.
                    let verdict = match check {
                        Check::Ready(verdict) => verdict,
                        Check::Pending(pending) => pending.await,
                    };
                    return (verdict, set as Answered);
                }
            }
        }
    })
}

/// Whether `new`, a rule of a reloaded configuration, has a request wait as `old` had it: the
/// same rule (identity), still enforced, with the same limiter, so the same queue, and the
/// same `max_wait`.
fn waits_alike<C: Clock>(new: &Rule<C>, old: &Rule<C>) -> bool {
    let same_limiter = match (&new.limiter, &old.limiter) {
        (Some(new), Some(old)) => new.chain_same(old),
        _ => false,
    };
    let same_wait = match (&new.queue, &old.queue) {
        (Some(new), Some(old)) => new.max_wait == old.max_wait,
        _ => false,
    };
    same_limiter && same_wait && !new.monitor && new.identity == old.identity
}

/// Waits in `limiter`'s queue for `key` for a permit, at most `budget`: the permit, or `None`,
/// after which the request is decided again. A reload (`notified`, then again from `reloaded`)
/// that `keeps` the wait (see [`waits_alike`]) leaves the request waiting in its place; one
/// that does not ends the wait. How the wait ended says whether that decision may make it
/// wait again:
///
/// - a reload that does not keep the wait: it may (nothing taken); the reload dropped the rule
///   or its queue, gave it a new limiter or a new `max_wait`, and the request is decided under
///   the new rules as if it had just arrived (within its `max_wait`, counted from its
///   arrival);
/// - `Timeout` (`max_wait` reached): it may not (`done`): the decision's rejection, the 429 the
///   request would have had without waiting, is final;
/// - `QueueFull`, `InsufficientCapacity`, `Closed`, `Unavailable` (the limiter gives the
///   request no place to wait: never for a rule's limiter, whose key queues are bounded by
///   the rule's count (`rules::build`), whose limit is at least 1 and which is never closed,
///   but each would answer the same at once if asked again): it may not (`done`), so that it
///   is rejected at once rather than asking again in a loop;
/// - `TooManyKeys`: the client's counter left the limiter while it waited (a refund left it
///   as new, and the limiter takes such a key out) and the rule is full of other clients: it
///   may, as a newcomer may. The decision meets the full rule as a newcomer does
///   (`key_overflow`) and may wait for another rule, or for this one if its counter is back.
///
/// Cancel-safe: dropped, it leaves the key's queue and holds nothing.
async fn queued<'a, C: Clock>(
    limiter: &crate::KeyedLimiter<CounterKey, C>,
    key: &CounterKey,
    budget: Duration,
    reloaded: &'a tokio::sync::Notify,
    mut notified: Pin<&mut tokio::sync::futures::Notified<'a>>,
    keeps: impl Fn() -> bool,
    done: &mut bool,
) -> Option<Box<Receipt<C>>> {
    let mut acquire = std::pin::pin!(limiter.acquire_refundable_timeout(key, 1, budget));
    let outcome = loop {
        let outcome = std::future::poll_fn(|cx| {
            if notified.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(None);
            }
            acquire.as_mut().poll(cx).map(Some)
        })
        .await;
        if outcome.is_some() {
            break outcome;
        }
        // A reload. Registered for the next one before the configuration is read, so that a
        // reload after the read wakes us and one before it is read.
        notified.set(reloaded.notified());
        notified.as_mut().enable();
        if !keeps() {
            break None;
        }
    };
    let error = match outcome {
        Some(Ok(receipt)) => return Some(Box::new(receipt)),
        None => return None,
        Some(Err(error)) => error,
    };
    tracing::debug!(error = %error, "request's wait for its rule ended without a permit");
    let again = match error {
        AcquireError::TooManyKeys { .. } => true,
        AcquireError::Timeout
        | AcquireError::QueueFull { .. }
        | AcquireError::InsufficientCapacity { .. }
        | AcquireError::Closed
        | AcquireError::Unavailable => false,
    };
    if !again {
        *done = true;
    }
    None
}

impl<C: Clock + Clone> HttpLimiter<C> {
    /// A tower layer that decides every request with this limiter. Layers built from one
    /// limiter share its rules, counters and bans, and follow its reloads: new rules and new
    /// client-IP and response settings apply from the next request.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower::Layer;
    /// use turnstile::http::{HttpConfig, HttpLimiter};
    ///
    /// let limiter = Arc::new(HttpLimiter::new(HttpConfig::from_toml_str(
    ///     "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 2\n",
    /// )?)?);
    /// let _service = limiter.layer().layer(tower::service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn layer(self: &Arc<Self>) -> RateLimitLayer<Self> {
        RateLimitLayer::of(Arc::clone(self), ())
    }
}

/// The integration tests' `metrics` recorder, for the tests below that count metrics.
#[cfg(all(test, feature = "metrics"))]
#[path = "../../tests/common/tally.rs"]
#[allow(unreachable_pub)]
mod tally;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;

    /// A `GET /` from `ip`, with no client id.
    fn from_ip(ip: &str) -> RequestInfo<'static> {
        RequestInfo {
            method: &http::Method::GET,
            path: "/",
            client_ip: Some(ip.parse().unwrap()),
            client_id: None,
        }
    }

    /// A limiter of the TOML configuration `toml`, on a manual clock.
    fn manual(toml: &str) -> HttpLimiter<ManualClock> {
        HttpLimiter::with_clock(HttpConfig::from_toml_str(toml).unwrap(), ManualClock::new())
            .unwrap()
    }

    /// Rule "a" counting client ids, `a_limit` requests each, and rule "b" counting IPs, 5
    /// requests each, holding one IP (`max_keys_per_rule = 1`): for the quota probes below.
    fn client_and_ip_rules(a_limit: u32) -> HttpLimiter<ManualClock> {
        manual(&format!(
            "max_keys_per_rule = 1\n\
             [[rules]]\nname = \"a\"\nperiod = \"1s\"\nlimit = {a_limit}\nkey = \"client\"\n\
             [[rules]]\nname = \"b\"\nperiod = \"1s\"\nlimit = 5\nkey = \"ip\"\n",
        ))
    }

    /// A request of the client "mobile" from `ip`.
    fn mobile(ip: &str) -> RequestInfo<'_> {
        RequestInfo {
            client_id: Some("mobile"),
            ..from_ip(ip)
        }
    }

    /// Asserts that `verdict` is a rejection by the rule `name`.
    fn assert_rejected_by(verdict: &Verdict, name: &str) {
        assert!(
            matches!(&verdict.outcome, Outcome::Rejected { rule, .. } if &**rule == name),
            "{verdict:?}"
        );
    }

    /// The `overflowed` count of the limiter of each rule named in `names`.
    fn overflowed<const N: usize>(
        limiter: &HttpLimiter<ManualClock>,
        names: [&str; N],
    ) -> [u64; N] {
        let snapshot = limiter.config.load_full();
        names.map(|name| {
            let rule = snapshot
                .rules
                .all_rules()
                .find(|r| &*r.name == name)
                .unwrap();
            rule.limiter.as_ref().unwrap().stats().overflowed
        })
    }

    /// A rejection's quotas probe the other rules, and a probe is no call of theirs: a rule at
    /// its key cap, probed for a client it does not hold, reports a fresh client's quota and
    /// counts nothing in its `overflowed` (a probe of an absent key takes no slot, so it meets
    /// no cap; a review suspected it counted, and this pins that it does not).
    #[test]
    fn a_quota_probe_at_the_key_cap_is_not_counted_as_an_overflow() {
        let limiter = client_and_ip_rules(1);
        assert!(limiter.decide(&mobile("10.0.0.1")).outcome.is_admitted());
        // Refused by "a" (its client's one request is spent); "b", full with 10.0.0.1, is
        // probed for its quota and has no room for 10.0.0.2.
        let verdict = limiter.decide(&mobile("10.0.0.2"));
        assert_rejected_by(&verdict, "a");
        assert_eq!(overflowed(&limiter, ["a", "b"]), [0, 0]);
        // The probe saw a fresh client's quota, without taking a slot.
        assert_eq!(verdict.quotas[1].remaining, 5);
    }

    /// Nor when a search for room at the cap has just failed, which has probes of a client the
    /// rule does not hold meet the cap (until room may be found): the probe of a rejection's
    /// quotas counted an overflow in the probed rule's `overflowed`, one no call made.
    #[test]
    fn a_quota_probe_after_a_failed_search_for_room_is_not_counted_as_an_overflow() {
        let limiter = client_and_ip_rules(2);
        assert!(limiter.decide(&mobile("10.0.0.1")).outcome.is_admitted());
        // "b" has no room for 10.0.0.3 (one overflow), and "a" is refunded.
        assert_rejected_by(&limiter.decide(&mobile("10.0.0.3")), "b");
        assert!(limiter.decide(&mobile("10.0.0.1")).outcome.is_admitted());
        // Refused by "a"; "b" is probed for 10.0.0.2's quota.
        assert_rejected_by(&limiter.decide(&mobile("10.0.0.2")), "a");
        assert_eq!(overflowed(&limiter, ["a", "b"]), [0, 1]);
    }

    /// The path is normalized only for rule sets that look at it: a whitelisted endpoint, a
    /// rule limited to some endpoints (while endpoint rate limiting is on), a per-endpoint
    /// counter; monitor rules count. Global rules alone never look.
    #[test]
    fn only_rule_sets_that_read_the_path_normalize_it() {
        let rule =
            |extra: &str| format!("[[rules]]\nname = \"r\"\nperiod = \"1s\"\nlimit = 5\n{extra}");
        let reads = |toml: &str| manual(toml).config.load().rules.reads_path;
        assert!(!reads(&rule("")));
        assert!(!reads(&rule("endpoint = \"*\"\nmonitor = true\n")));
        assert!(reads(&rule("endpoint = \"get:/api/*\"\n")));
        assert!(reads(&rule("endpoint = \"*:/x\"\nmonitor = true\n")));
        assert!(!reads(&format!(
            "endpoint_rate_limiting = false\n{}",
            rule("endpoint = \"get:/api/*\"\n")
        )));
        assert!(reads(&rule("per_endpoint = true\n")));
        assert!(reads(&format!(
            "{}[whitelist]\nendpoints = [\"get:/health\"]\n",
            rule("")
        )));
        assert!(reads(&format!(
            "{}[[ip_rules]]\nip = \"10.0.0.0/8\"\n[[ip_rules.rules]]\nname = \"i\"\nendpoint = \"*:/a\"\nperiod = \"1s\"\nlimit = 1\n",
            rule("")
        )));
        // A reload recomputes it.
        let limiter = manual(&rule(""));
        limiter
            .reload(HttpConfig::from_toml_str(&rule("per_endpoint = true\n")).unwrap())
            .unwrap();
        assert!(limiter.config.load().rules.reads_path);
    }

    /// Keys are inline up to 24 bytes and on the heap beyond: both count apart, per client and
    /// per endpoint (the path lower-cased, the rest of it kept).
    #[test]
    fn long_and_short_keys_count_apart() {
        let limiter = manual(
            "client_id_header = \"x-client\"\n[[rules]]\nname = \"per-client-endpoint\"\nendpoint = \"*\"\nperiod = \"1m\"\nlimit = 1\nkey = \"client\"\nper_endpoint = true\n",
        );
        let long = "c".repeat(100);
        let long_path = format!("/API/{}/Ünïcode", "x".repeat(40));
        let decide = |client: &str, path: &str| {
            let verdict = limiter.decide(&RequestInfo {
                method: &http::Method::GET,
                path,
                client_ip: None,
                client_id: Some(client),
            });
            matches!(verdict.outcome, Outcome::Admitted)
        };
        for (client, path) in [
            ("a", "/x"),
            (long.as_str(), "/x"),
            ("a", long_path.as_str()),
            (long.as_str(), long_path.as_str()),
        ] {
            assert!(
                decide(client, path),
                "first request of {client:.8}… {path:.12}…"
            );
            assert!(
                !decide(client, path),
                "second request of {client:.8}… {path:.12}…"
            );
        }
        // The path's case does not make a new counter; the client id's does.
        assert!(!decide("a", "/X"));
        assert!(!decide(
            &long,
            &long_path.to_lowercase().replace("ünïcode", "Ünïcode")
        ));
        assert!(decide("A", "/x"));
    }

    #[test]
    fn paths_are_normalized_as_rfc_3986_says() {
        let normal = |path: &str| normalized_path(path);
        assert_eq!(normal("/api/values"), None, "nothing to do: no copy");
        assert_eq!(normal("/a%2Fb"), None, "already normal");
        assert_eq!(
            normal("/%41%7a%30%2D%2e%5F%7E").as_deref(),
            Some("/Az0-._~")
        );
        assert_eq!(normal("/a%2fb%3a").as_deref(), Some("/a%2Fb%3A"));
        assert_eq!(normal("/%c3%a9").as_deref(), Some("/%C3%A9"));
        // Broken escapes stay as they are; `%%31` is a `%` and then an escaped `1`.
        assert_eq!(normal("/a%"), None);
        assert_eq!(normal("/a%4"), None);
        assert_eq!(normal("/a%g1"), None);
        assert_eq!(normal("/%%31").as_deref(), Some("/%1"));
        assert_eq!(normal("/é%31é").as_deref(), Some("/é1é"));
        // One pass: a decoded `%` does not start an escape.
        assert_eq!(normal("/%2531").as_deref(), None);
    }

    #[test]
    fn empty_and_dot_segments_resolve_as_a_file_server_resolves_them() {
        let resolved = |path: &str| resolved_path(path);
        assert_eq!(resolved("/static/secret/x"), None, "nothing to do: no copy");
        assert_eq!(
            resolved("/static/.secret/x"),
            None,
            "a name starting with `.`"
        );
        assert_eq!(resolved("/a/../b"), None, "`..` names another resource");
        assert_eq!(resolved("//a//b").as_deref(), Some("/a/b"));
        assert_eq!(resolved("/a/./b/.").as_deref(), Some("/a/b/"));
        assert_eq!(resolved("/a/.//./b//").as_deref(), Some("/a/b/"));
        assert_eq!(resolved("/./").as_deref(), Some("/"));
        assert_eq!(resolved("//").as_deref(), Some("/"));
        assert_eq!(resolved("/"), None);
        assert_eq!(resolved("*"), None);
    }

    /// A rejection by the blocklist or a ban names its "rule" with the thread's one copy of a
    /// fixed name, not a name made per rejection (which would also miss the thread's cached
    /// rejection body).
    #[test]
    fn blocklist_and_ban_rejections_share_their_name() {
        let limiter = manual(
            "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n[blocklist]\nips = [\"192.0.2.1\"]\n[bans]\nafter = 1\nwithin = \"1m\"\nduration = \"5m\"\n",
        );
        let decide = |ip: &str| match limiter.decide(&from_ip(ip)).outcome {
            Outcome::Rejected { reason, rule, .. } => Some((reason, rule)),
            _ => None,
        };
        let (reason, first) = decide("192.0.2.1").unwrap();
        assert_eq!((reason, &*first), (RejectReason::Blocked, "blocklist"));
        let (_, second) = decide("192.0.2.1").unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        // One admitted, one rejected by the rule (the ban's one rejection), then banned.
        assert!(decide("192.0.2.2").is_none());
        assert_eq!(decide("192.0.2.2").unwrap().0, RejectReason::RateLimited);
        let (reason, first) = decide("192.0.2.2").unwrap();
        assert_eq!((reason, &*first), (RejectReason::Banned, "ban"));
        let (_, second) = decide("192.0.2.2").unwrap();
        assert!(Arc::ptr_eq(&first, &second));
    }

    /// Sets of general, any-endpoint rules select once, when compiled; the rules chosen are the
    /// ones the per-request selection chooses (the specific ones of other sets select per
    /// request).
    #[test]
    fn a_fixed_selection_is_the_per_request_selection() {
        let rule = |name: &str, endpoint: &str, period: &str, limit: u32, monitor: bool| {
            format!(
                "[[rules]]\nname = \"{name}\"\nendpoint = \"{endpoint}\"\nperiod = \"{period}\"\nlimit = {limit}\nmonitor = {monitor}\n"
            )
        };
        let names = |rules: &[Arc<Rule<ManualClock>>]| {
            let mut names: Vec<String> = rules.iter().map(|r| r.name.to_string()).collect();
            names.sort();
            names
        };
        let cases = [
            (
                vec![
                    rule("a", "*", "1s", 5, false),
                    rule("b", "*", "1s", 3, false),
                    rule("c", "*", "1m", 100, false),
                    rule("d", "*", "1h", 1000, true),
                ],
                Some(vec!["b", "c"]),
            ),
            (vec![rule("a", "*", "1s", 5, false)], Some(vec!["a"])),
            (Vec::new(), Some(Vec::new())),
            // A rule for some endpoints: chosen per request.
            (
                vec![
                    rule("a", "*", "1s", 5, false),
                    rule("e", "get:/api/*", "1s", 1, false),
                ],
                None,
            ),
        ];
        for (rules, expected) in cases {
            let toml = rules.concat();
            let limiter = manual(&toml);
            let config = limiter.config.load();
            let set = &config.rules;
            let fixed = set.fixed_enforced.as_deref().map(names);
            let expected = expected.map(|e| e.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            assert_eq!(fixed, expected, "{toml}");
            if let Some(fixed) = fixed {
                let per_request: Vec<Arc<Rule<ManualClock>>> =
                    select(std::iter::empty(), set.general.iter(), false)
                        .into_iter()
                        .cloned()
                        .collect();
                assert_eq!(fixed, names(&per_request), "{toml}");
            }
        }
        // IP and client rules make the selection depend on the request.
        let toml = format!(
            "{}[[ip_rules]]\nip = \"10.0.0.0/8\"\n[[ip_rules.rules]]\nendpoint = \"*\"\nperiod = \"1s\"\nlimit = 1\n",
            rule("a", "*", "1s", 5, false)
        );
        let limiter = manual(&toml);
        assert!(limiter.config.load().rules.fixed_enforced.is_none());
    }

    /// An empty client id is no client id: `missing_key = "reject"` rejects it as it rejects a
    /// request without the header, instead of counting every such client on one key.
    #[test]
    fn an_empty_client_id_is_no_client_id() {
        let limiter = manual(
            "[[rules]]\nname = \"per-client\"\nperiod = \"1m\"\nlimit = 5\nkey = \"client\"\n",
        );
        let outcome = |client_id| {
            limiter
                .decide(&RequestInfo {
                    client_id,
                    ..from_ip("192.0.2.1")
                })
                .outcome
        };
        for client_id in [None, Some("")] {
            assert!(
                matches!(
                    outcome(client_id),
                    Outcome::Rejected {
                        reason: RejectReason::NoKey,
                        ..
                    }
                ),
                "{client_id:?}"
            );
        }
        assert!(outcome(Some("app-1")).is_admitted());
    }

    /// Lists and IP rules match clients as the layer groups them: an IPv4-mapped entry as the
    /// IPv4 one, a range of whole groups as those groups, and an entry inside one group is
    /// refused at load with the group to write instead (it would have matched no one).
    #[test]
    fn lists_match_whole_client_groups() {
        let limiter = manual(
            "[client_ip]\nipv6_prefix = 64\n[blocklist]\nips = [\"2001:db8:1:2::/64\", \"::ffff:192.0.2.0/120\"]\n\
             [[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 10\n",
        );
        let outcome = |ip: &str| limiter.decide(&from_ip(ip)).outcome;
        let blocked = |ip| {
            matches!(
                outcome(ip),
                Outcome::Rejected {
                    reason: RejectReason::Blocked,
                    ..
                }
            )
        };
        // What the layer hands over for 2001:db8:1:2::5 grouped by /64, and for 192.0.2.7.
        assert!(blocked("2001:db8:1:2::"));
        assert!(blocked("192.0.2.7"), "a mapped entry");
        assert!(outcome("2001:db8:1:3::").is_admitted());
        for (list, field) in [
            ("[whitelist]\nips", "whitelist.ips[1]"),
            ("[blocklist]\nips", "blocklist.ips[1]"),
        ] {
            let toml = format!(
                "[client_ip]\nipv6_prefix = 64\nipv4_prefix = 24\n{list} = [\"10.0.0.0/8\", \"2001:db8:1:2::5\"]\n"
            );
            let error = HttpLimiter::with_clock(
                HttpConfig::from_toml_str(&toml).unwrap(),
                ManualClock::new(),
            )
            .expect_err("an entry inside a client group is refused")
            .to_string();
            assert!(
                error.contains(field) && error.contains("2001:db8:1:2::/64"),
                "{error}"
            );
        }
        let toml = "[client_ip]\nipv4_prefix = 24\n[[ip_rules]]\nip = \"192.0.2.7\"\n\
                    [[ip_rules.rules]]\nperiod = \"1m\"\nlimit = 1\n";
        let error =
            HttpLimiter::with_clock(HttpConfig::from_toml_str(toml).unwrap(), ManualClock::new())
                .expect_err("an IP rule inside a client group is refused")
                .to_string();
        assert!(
            error.contains("ip_rules[0].ip")
                && error.contains("192.0.2.0/24")
                && error.contains("ipv4_prefix"),
            "{error}"
        );
    }

    /// A client a full rule counts on its shared counter (`key_overflow = "shared"`) is
    /// rejected when the other clients of that counter used it up: it did nothing to deserve a
    /// ban, as with `key_overflow = "reject"`. So on one rule (decided by `decide_one`) and on
    /// two (the general path).
    #[test]
    fn rejections_by_the_shared_overflow_counter_ban_no_one() {
        let one = "max_keys_per_rule = 1\nkey_overflow = \"shared\"\n[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n[bans]\nafter = 1\nwithin = \"1m\"\nduration = \"1h\"\n";
        let two = format!("{one}[[rules]]\nname = \"hourly\"\nperiod = \"1h\"\nlimit = 100\n");
        for toml in [one.to_owned(), two] {
            let limiter = manual(&toml);
            let decide = |ip: &str| limiter.decide(&from_ip(ip));
            // The rule's one key; then a new client admitted on the shared counter.
            assert!(decide("10.0.0.1").outcome.is_admitted());
            assert!(decide("10.0.0.2").outcome.is_admitted());
            for attempt in 0..3 {
                let verdict = decide("10.0.0.3");
                assert!(
                    matches!(
                        verdict.outcome,
                        Outcome::Rejected {
                            reason: RejectReason::RateLimited,
                            ..
                        }
                    ),
                    "attempt {attempt}: {:?}\n{toml}",
                    verdict.outcome
                );
            }
        }
    }

    /// A reload refused because it names a Redis this limiter is not connected to changes
    /// nothing: not the limits of the rules it would have kept either.
    #[cfg(feature = "redis")]
    #[test]
    fn a_reload_refused_for_its_backend_changes_no_limit() {
        let rule = |limit: u32| {
            format!("[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = {limit}\n")
        };
        let limiter = manual(&rule(2));
        let redis = format!(
            "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1/\"\n{}",
            rule(1)
        );
        assert!(
            limiter
                .reload(HttpConfig::from_toml_str(&redis).unwrap())
                .is_err()
        );
        let request = from_ip("192.0.2.1");
        for n in 1..=2 {
            let verdict = limiter.decide(&request);
            assert!(verdict.outcome.is_admitted(), "request {n}: {verdict:?}");
        }
    }

    #[test]
    fn reload_swaps_the_layer_settings_with_the_rules() {
        let config = HttpConfig::from_toml_str("client_id_header = \"X-ClientId\"\n").unwrap();
        let limiter = HttpLimiter::with_clock(config, ManualClock::new()).unwrap();
        let settings = |limiter: &HttpLimiter<ManualClock>| {
            let loaded = Sealed::load(limiter, &());
            <HttpLimiter<ManualClock> as Sealed>::settings(&loaded).clone()
        };
        assert_eq!(
            settings(&limiter)
                .client_id_header
                .as_ref()
                .map(|h| h.as_str()),
            Some("x-clientid")
        );
        let next = HttpConfig::from_toml_str("[response]\nstatus = 503\n").unwrap();
        limiter.reload(next).unwrap();
        assert_eq!(settings(&limiter).response.status, 503);
        assert_eq!(settings(&limiter).client_id_header, None);
        // a failed reload leaves them alone
        let bad = HttpConfig::from_toml_str("client_id_header = \"a b\"\n").unwrap();
        assert!(limiter.reload(bad).is_err());
        assert_eq!(settings(&limiter).response.status, 503);
    }

    /// A request one rule admits and a later one rejects has its charge of the first given
    /// back (`give_back`): a request of the same client that queued for the first rule's key
    /// meanwhile (on another thread; here by hand, between the charge and the refund that
    /// `decide` makes in one call) is admitted at once, as the refund of a receipt wakes it.
    /// It slept until its own timer, the permit free all along.
    #[tokio::test(start_paused = true)]
    async fn giving_back_a_charge_wakes_the_request_waiting_for_its_key() {
        let toml = "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\n\
                    max_wait = \"5s\"\n";
        let limiter = Arc::new(
            HttpLimiter::with_clock(
                HttpConfig::from_toml_str(toml).unwrap(),
                crate::TokioClock::new(),
            )
            .unwrap(),
        );
        let snapshot = limiter.config.load_full();
        let rule = snapshot.rules.all_rules().next().unwrap();
        let rule_limiter = rule.limiter.as_ref().unwrap();
        let key = counter_key(rule, &from_ip("192.0.2.1")).unwrap();
        // What `decide` does when the rule admits: the key's only permit is charged.
        let (admission, committed) = match rule_limiter.chain_decide::<true>(&key, 1) {
            (Ok(admission), committed) => (admission, committed),
            (Err(error), _) => panic!("{error}"),
        };
        let start = tokio::time::Instant::now();
        let waiter = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let verdict = limiter.decide_async(&from_ip("192.0.2.1")).await;
                (verdict, tokio::time::Instant::now())
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the request waits for the rule");
        // A later rule rejected the first request: the charge goes back.
        give_back(std::iter::once((rule_limiter, &key, admission, committed)));
        let (verdict, at) = waiter.await.unwrap();
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        assert_eq!(
            at - start,
            Duration::ZERO,
            "admitted when the permit was given back, not when its timer ended"
        );
    }

    /// A request that its rule's queue admits on the shared overflow counter
    /// (`key_overflow = "shared"`) is counted in `turnstile_http_key_overflow`, once. Its
    /// client's own counter rejected it, so it waited; the counter was then given back the only
    /// permit it had counted (a request another rule rejected, charged on another thread just
    /// before it queued: here by hand, as above), which took the key out of the limiter, and
    /// another client took its place, so that the queue admitted it on the shared counter. The
    /// receipt's admission was taken for one of the client's own counter: not counted. With the
    /// rule alone (the one-rule path of the decision) and beside another rule.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_request_its_rules_queue_admits_on_the_shared_overflow_counter_counts_its_overflow() {
        let other = "[[rules]]\nname = \"c\"\nperiod = \"1m\"\nlimit = 100\nkey = \"client\"\n";
        for other in ["", other] {
            admitted_on_the_shared_overflow_counter_from_the_queue(other);
        }
    }

    #[cfg(feature = "metrics")]
    fn admitted_on_the_shared_overflow_counter_from_the_queue(other: &str) {
        let tally = tally::Tally::default();
        let counts = tally.0.clone();
        // A token bucket, on a clock that stays at 0: its only permit given back, the key's
        // counter is as new, and the limiter takes it out.
        let toml = format!(
            "max_keys_per_rule = 1\nkey_overflow = \"shared\"\n\
             [[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"ip\"\n\
             algorithm = \"token_bucket\"\nqueue_limit = 5\nmax_wait = \"5s\"\n{other}"
        );
        let request = |ip: &str| RequestInfo {
            client_id: Some("c"),
            ..from_ip(ip)
        };
        metrics::with_local_recorder(&tally, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let limiter = Arc::new(manual(&toml));
                let snapshot = limiter.config.load_full();
                let rule = snapshot
                    .rules
                    .all_rules()
                    .find(|r| &*r.name == "q")
                    .unwrap();
                let rule_limiter = rule.limiter.as_ref().unwrap();
                let key = counter_key(rule, &request("10.0.0.1")).unwrap();
                let (admission, committed) = match rule_limiter.chain_decide::<true>(&key, 1) {
                    (Ok(admission), committed) => (admission, committed),
                    (Err(error), _) => panic!("{error}"),
                };
                let waiter = {
                    let limiter = Arc::clone(&limiter);
                    tokio::spawn(async move { limiter.decide_async(&request("10.0.0.1")).await })
                };
                tokio::task::yield_now().await;
                assert!(!waiter.is_finished(), "the request waits for the rule");
                give_back(std::iter::once((rule_limiter, &key, admission, committed)));
                // Another client takes the place 10.0.0.1's counter left, before the waiting
                // request's turn.
                let verdict = limiter.decide(&request("10.0.0.2"));
                assert!(verdict.outcome.is_admitted(), "{verdict:?}");
                let verdict = waiter.await.unwrap();
                assert!(verdict.outcome.is_admitted(), "{verdict:?}");
            });
        });
        let n = |k: &str| counts.lock().unwrap().get(k).copied().unwrap_or(0);
        assert_eq!(n("turnstile_http_waited{q}"), 1, "{other}");
        assert_eq!(
            n("turnstile_http_key_overflow{q}"),
            1,
            "admitted on the shared counter, once ({other})"
        );
    }

    /// A request that its client's waiting request holds back, when the client's counter was
    /// taken out of the full rule (as above) and another new client found no room either, so
    /// that the shared overflow counter answers for it, is a request the rule had no room for: counted in `turnstile_http_key_overflow`, and
    /// its rejection not counted towards a ban (the counter that refused it is the one other
    /// new clients share). It was taken for a rejection by the client's own counter: a ban
    /// then rejected the waiting request too, once its turn came.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_request_held_back_behind_its_clients_waiter_on_the_shared_counter_is_an_overflow() {
        let tally = tally::Tally::default();
        let counts = tally.0.clone();
        let toml = "max_keys_per_rule = 1\nkey_overflow = \"shared\"\n\
             [bans]\nafter = 1\nwithin = \"1m\"\nduration = \"1h\"\n\
             [[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"ip\"\n\
             algorithm = \"token_bucket\"\nqueue_limit = 5\nmax_wait = \"5s\"\n";
        metrics::with_local_recorder(&tally, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let clock = ManualClock::new();
                let config = HttpConfig::from_toml_str(toml).unwrap();
                let limiter = Arc::new(HttpLimiter::with_clock(config, clock.clone()).unwrap());
                let snapshot = limiter.config.load_full();
                let rule = snapshot
                    .rules
                    .all_rules()
                    .find(|r| &*r.name == "q")
                    .unwrap();
                let rule_limiter = rule.limiter.as_ref().unwrap();
                let key = counter_key(rule, &from_ip("10.0.0.1")).unwrap();
                let (admission, committed) = match rule_limiter.chain_decide::<true>(&key, 1) {
                    (Ok(admission), committed) => (admission, committed),
                    (Err(error), _) => panic!("{error}"),
                };
                let waiter = {
                    let limiter = Arc::clone(&limiter);
                    tokio::spawn(async move { limiter.decide_async(&from_ip("10.0.0.1")).await })
                };
                tokio::task::yield_now().await;
                assert!(!waiter.is_finished(), "the request waits for the rule");
                give_back(std::iter::once((rule_limiter, &key, admission, committed)));
                let verdict = limiter.decide(&from_ip("10.0.0.2"));
                assert!(verdict.outcome.is_admitted(), "{verdict:?}");
                // Before the waiting request's turn, another of its client's: held back.
                // A third client finds the rule full, and the shared counter admits it.
                let verdict = limiter.decide(&from_ip("10.0.0.3"));
                assert!(verdict.outcome.is_admitted(), "{verdict:?}");
                // Before the waiting request's turn, another of its client's: held back, and
                // refused by the shared counter.
                let verdict = limiter.decide(&from_ip("10.0.0.1"));
                assert!(!verdict.outcome.is_admitted(), "{verdict:?}");
                assert_eq!(rule_limiter.stats().overflowed, 2);
                // The waiting request's turn comes once the shared counter has a permit again.
                clock.advance(Duration::from_secs(1));
                tokio::time::advance(Duration::from_secs(1)).await;
                let verdict = waiter.await.unwrap();
                assert!(verdict.outcome.is_admitted(), "not banned: {verdict:?}");
            });
        });
        let n = |k: &str| counts.lock().unwrap().get(k).copied().unwrap_or(0);
        assert_eq!(n("turnstile_http_banned{q}"), 0);
        assert_eq!(
            n("turnstile_http_key_overflow{q}"),
            2,
            "the third client and the held-back request (the waiting one, a second later, found \
             room: the second client's counter had gone idle)"
        );
    }

    /// With `key_overflow = "reject"`, a request whose wait ends because its rule has no room
    /// left for its client (as below) is rejected then, as a newcomer is (`TooManyKeys`), not
    /// made to wait again, and counted once in each metric: it waited, it met the full rule,
    /// it was rejected.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_wait_its_rule_has_no_room_for_ends_in_a_too_many_keys_rejection_under_reject() {
        let tally = tally::Tally::default();
        let counts = tally.0.clone();
        let toml = "max_keys_per_rule = 1\nkey_overflow = \"reject\"\n\
             [[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"ip\"\n\
             algorithm = \"token_bucket\"\nqueue_limit = 5\nmax_wait = \"5s\"\n";
        metrics::with_local_recorder(&tally, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let limiter = Arc::new(manual(toml));
                let snapshot = limiter.config.load_full();
                let rule = snapshot
                    .rules
                    .all_rules()
                    .find(|r| &*r.name == "q")
                    .unwrap();
                let rule_limiter = rule.limiter.as_ref().unwrap();
                let key = counter_key(rule, &from_ip("10.0.0.1")).unwrap();
                let (admission, committed) = match rule_limiter.chain_decide::<true>(&key, 1) {
                    (Ok(admission), committed) => (admission, committed),
                    (Err(error), _) => panic!("{error}"),
                };
                let start = tokio::time::Instant::now();
                let waiter = {
                    let limiter = Arc::clone(&limiter);
                    tokio::spawn(async move {
                        let verdict = limiter.decide_async(&from_ip("10.0.0.1")).await;
                        (verdict, tokio::time::Instant::now())
                    })
                };
                tokio::task::yield_now().await;
                assert!(!waiter.is_finished(), "the request waits for the rule");
                give_back(std::iter::once((rule_limiter, &key, admission, committed)));
                let verdict = limiter.decide(&from_ip("10.0.0.2"));
                assert!(verdict.outcome.is_admitted(), "{verdict:?}");
                let (verdict, at) = waiter.await.unwrap();
                assert!(
                    matches!(
                        verdict.outcome,
                        Outcome::Rejected {
                            reason: RejectReason::TooManyKeys,
                            ..
                        }
                    ),
                    "{verdict:?}"
                );
                assert_eq!(at - start, Duration::ZERO, "rejected when its turn came");
            });
        });
        let n = |k: &str| counts.lock().unwrap().get(k).copied().unwrap_or(0);
        assert_eq!(n("turnstile_http_waited{q}"), 1);
        assert_eq!(n("turnstile_http_key_overflow{q}"), 1);
        assert_eq!(n("turnstile_http_rejected{q}"), 1);
    }

    /// A request whose wait ends because its rule has no room left for its client (its key
    /// taken out of the limiter, as above, and another client in its place; `TooManyKeys`) is
    /// decided again as a newcomer is, not for good: `key_overflow = "allow"` lets it pass that
    /// rule, and another rule's queue lets it wait there. The wait's end was taken for a
    /// timeout: the next rejection, by the other rule, was final, though the request could
    /// wait for it within its `max_wait`.
    #[tokio::test(start_paused = true)]
    async fn a_wait_its_rule_has_no_room_for_is_decided_again_and_may_wait_again() {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            HttpLimiter::with_clock(
                HttpConfig::from_toml_str(
                    "max_keys_per_rule = 1\nkey_overflow = \"allow\"\n\
                     [[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"ip\"\n\
                     algorithm = \"token_bucket\"\nqueue_limit = 5\nmax_wait = \"5s\"\n\
                     [[rules]]\nname = \"r\"\nperiod = \"1m\"\nlimit = 1\nkey = \"client\"\n\
                     queue_limit = 5\nmax_wait = \"2m\"\n",
                )
                .unwrap(),
                clock.clone(),
            )
            .unwrap(),
        );
        let request = |ip: &str, client: &'static str| RequestInfo {
            client_id: Some(client),
            ..from_ip(ip)
        };
        let snapshot = limiter.config.load_full();
        let rule = |name: &str| {
            snapshot
                .rules
                .all_rules()
                .find(|r| &*r.name == name)
                .unwrap()
        };
        let charge = |name: &str, request: &RequestInfo<'_>| {
            let rule = rule(name);
            let key = counter_key(rule, request).unwrap();
            match rule.limiter.as_ref().unwrap().chain_decide::<true>(&key, 1) {
                (Ok(admission), committed) => (key, admission, committed),
                (Err(error), _) => panic!("{error}"),
            }
        };
        // Client "w" has used `r`'s minute; 10.0.0.1's only permit of `q` is charged (by a
        // request that `r` will reject, on another thread).
        let _ = charge("r", &request("10.0.0.1", "w"));
        let (key, admission, committed) = charge("q", &request("10.0.0.1", "w"));
        let start = tokio::time::Instant::now();
        let waiter = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let verdict = limiter.decide_async(&request("10.0.0.1", "w")).await;
                (verdict, tokio::time::Instant::now())
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the request waits for q");
        give_back(std::iter::once((
            rule("q").limiter.as_ref().unwrap(),
            &key,
            admission,
            committed,
        )));
        // 10.0.0.2 takes the place in `q` that 10.0.0.1's counter, as new, left.
        let verdict = limiter.decide(&request("10.0.0.2", "z"));
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        // `q` has no room for 10.0.0.1 now: it lets the request pass, and `r` makes it wait.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "the request waits for r: {:?}",
            waiter.await.unwrap()
        );
        clock.advance(Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(60)).await;
        let (verdict, at) = waiter.await.unwrap();
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        assert_eq!(at - start, Duration::from_secs(60));
    }

    /// A reload that makes the rule a request waits for a monitor rule, at the instant the
    /// rule's queue gives the request its permit (the permit taken, the reload swapped in
    /// before the request is decided again: another thread's reload), has the request decided
    /// under the monitor with that permit as the monitor's charge: counted once, and no
    /// would-be rejection. The monitor was charged again while the permit was still held, and
    /// at limit 1 always counted a rejection (`turnstile_http_shadow_rejected`) that the
    /// request did not earn, then gave the permit back, leaving the request uncounted. The
    /// race is replayed by hand: the permit the queue would give, then the reload, then the
    /// decision the waiting request makes.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_permit_that_comes_as_its_rule_becomes_a_monitor_is_the_monitors_charge() {
        let tally = tally::Tally::default();
        let counts = tally.0.clone();
        let rule = "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"ip\"\n";
        let limiter = manual(&format!("{rule}queue_limit = 1\n"));
        let snapshot = limiter.config.load_full();
        let q = snapshot
            .rules
            .all_rules()
            .find(|r| &*r.name == "q")
            .unwrap();
        let key = counter_key(q, &from_ip("10.0.0.1")).unwrap();
        let permit = q
            .limiter
            .as_ref()
            .unwrap()
            .try_acquire_refundable(&key, 1)
            .unwrap();
        limiter
            .reload(HttpConfig::from_toml_str(&format!("{rule}monitor = true\n")).unwrap())
            .unwrap();
        let reloaded = limiter.config.load_full();
        let monitor = reloaded
            .rules
            .all_rules()
            .find(|r| &*r.name == "q")
            .unwrap();
        let monitor_limiter = monitor.limiter.as_ref().unwrap();
        assert!(
            permit.is_from(monitor_limiter),
            "the reload keeps the rule's limiter"
        );
        let mut patience = Patience::new();
        patience.held = Some(Box::new(permit));
        let verdict = metrics::with_local_recorder(&tally, || {
            match decide(&reloaded.rules, &from_ip("10.0.0.1"), Some(&mut patience)) {
                Check::Ready(verdict) => verdict,
                Check::Pending(_) => panic!("counted in memory"),
            }
        });
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        assert!(patience.wait.is_none(), "nothing to wait for");
        let n = |k: &str| counts.lock().unwrap().get(k).copied().unwrap_or(0);
        assert_eq!(
            n("turnstile_http_shadow_rejected{q}"),
            0,
            "no false rejection"
        );
        assert_eq!(
            monitor_limiter.available(&key),
            0,
            "the request is counted by the monitor, once"
        );
    }
}
