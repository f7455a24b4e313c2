//! The configuration model of the HTTP layer, its loaders (TOML, JSON, YAML, and
//! AspNetCoreRateLimit's JSON) and its errors. Semantic validation happens when an
//! [`HttpLimiter`](crate::http::HttpLimiter) compiles the configuration (see `rules.rs`).

use crate::http::{ClientIpConfig, ResponseConfig};
use serde::Deserialize;
use std::fmt;
use std::path::Path;
use std::time::Duration;

/// The whole configuration of an [`HttpLimiter`](crate::http::HttpLimiter).
///
/// Unknown fields are errors; every field has a default.
///
/// # Examples
///
/// ```
/// use turnstile::http::HttpConfig;
///
/// let config = HttpConfig::from_toml_str(r#"
///     [[rules]]
///     endpoint = "*"
///     period = "1s"
///     limit = 2
/// "#)?;
/// assert_eq!(config.rules.len(), 1);
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpConfig {
    /// How the client's IP address is found.
    pub client_ip: ClientIpConfig,
    /// The header carrying the client id (for client rules and the client lists).
    ///
    /// The id is whatever the request says: any client can send any id. Client rules and client
    /// whitelists that grant more than the general rules need an id the client cannot choose
    /// (the layer's `client_id_fn`, from what the app authenticated); with a header, keep
    /// client rules stricter than the general ones, or count them by `key = "client"` so that
    /// everyone sending an id shares its one quota.
    pub client_id_header: Option<String>,
    /// The longest client id counted (256 bytes by default, at most 4096). A longer one is
    /// treated as no client id (so `missing_key` decides for rules that count by it): every
    /// distinct id is a counter, and without a bound a client could make each one kilobytes.
    /// An empty one is no client id either. The ids of the client lists and client rules
    /// must fit (one that does not, which no request could match, is refused at load).
    pub client_id_max_len: usize,
    /// The client id of a request that carries none (and of one whose id is empty or longer
    /// than `client_id_max_len`): `None` by default, so that `missing_key` decides for the
    /// rules that count by client id. AspNetCoreRateLimit counts such requests as the client
    /// `"anon"`, which its translation sets here; the lists and client rules see it too.
    pub anonymous_client_id: Option<String>,
    /// How rejections look.
    pub response: ResponseConfig,
    /// What happens when a rule needs a key (IP or client id) the request does not have.
    pub missing_key: MissingKey,
    /// Whether rules with an endpoint other than `*` apply (true by default). When false, only
    /// `*` rules apply, as in AspNetCoreRateLimit.
    pub endpoint_rate_limiting: bool,
    /// Whether the request path's trailing `/` is removed before rules match it and
    /// per-endpoint counters key on it, so that `/api/values/` is `/api/values` (`/` stays
    /// `/`). False by default: a router may serve the two paths differently. AspNetCoreRateLimit
    /// trims it, and its translation sets this.
    pub trim_trailing_slash: bool,
    /// The most clients (keys) each rule counts in memory: 1,048,576 by default, at about 60
    /// bytes each, 66–69 as glibc holds them (BENCHMARKS.md, "Memory per client"; a key of
    /// several parts longer than 24 bytes adds its text),
    /// so a full rule holds about 70 MB. A `sliding_window` rule's client also holds a ring of
    /// 8 bytes per permit of its `limit`: with `limit = 100` a full rule holds about 900 MB, and
    /// with a limit in the millions each client costs megabytes (lower this cap, or use
    /// `sliding_counter`, whose clients cost the same at any limit). A key is evicted once it
    /// is idle (its counts back to a fresh client's), to make room for a new one; a rule full
    /// of active keys answers a new client as `key_overflow` says. Rules counted in Redis keep their keys there and are not
    /// bounded by it, but under `[backend] failure = "fallback"` each rule's fallback counts at
    /// most this many clients in this process while Redis is away (a new client meeting a
    /// fallback full of active ones is rejected, [`RejectReason::TooManyKeys`](crate::http::RejectReason::TooManyKeys),
    /// whatever `key_overflow` says). Changing it (or `key_overflow`) in a reload starts every
    /// rule's counts afresh (in Redis, its fallback's).
    pub max_keys_per_rule: usize,
    /// What a new client gets from a rule that already counts `max_keys_per_rule` active keys.
    pub key_overflow: KeyOverflowPolicy,
    /// The general rules, for every client.
    pub rules: Vec<RuleConfig>,
    /// Rules for clients whose IP is in a range; they take precedence over general rules of the
    /// same period that count by the same key (see the engine's semantics).
    pub ip_rules: Vec<IpRulesConfig>,
    /// Rules for one client id; they take precedence over general rules of the same period that
    /// count by the same key. A client rule counting by `key = "ip"` therefore replaces the
    /// general per-IP rule of its period for every request that carries its id: see
    /// `client_id_header` on who can send an id.
    pub client_rules: Vec<ClientRulesConfig>,
    /// Requests that are never limited nor counted.
    pub whitelist: WhitelistConfig,
    /// Clients that are always rejected.
    pub blocklist: BlocklistConfig,
    /// Temporary bans of clients rejected too often; `None`: no bans.
    pub bans: Option<BanConfig>,
    /// Where counters live.
    pub backend: BackendConfig,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            client_ip: ClientIpConfig::default(),
            client_id_header: None,
            client_id_max_len: 256,
            anonymous_client_id: None,
            response: ResponseConfig::default(),
            missing_key: MissingKey::default(),
            endpoint_rate_limiting: true,
            trim_trailing_slash: false,
            max_keys_per_rule: crate::DEFAULT_MAX_KEYS,
            key_overflow: KeyOverflowPolicy::default(),
            rules: Vec::new(),
            ip_rules: Vec::new(),
            client_rules: Vec::new(),
            whitelist: WhitelistConfig::default(),
            blocklist: BlocklistConfig::default(),
            bans: None,
            backend: BackendConfig::default(),
        }
    }
}

/// What happens when a rule needs a key the request does not have.
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::http::MissingKey::default(), turnstile::http::MissingKey::Reject);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MissingKey {
    /// Reject with [`RejectReason::NoKey`](crate::http::RejectReason::NoKey). Enforced rules
    /// only: a monitor rule rejects nothing, and skips a request without its key (no would-be
    /// rejection counted).
    #[default]
    Reject,
    /// Skip the rule.
    Allow,
}

/// What a new client gets from a rule that already counts
/// [`max_keys_per_rule`](HttpConfig::max_keys_per_rule) clients in memory, none of them idle.
///
/// Keys already counted are never affected; idle keys are evicted first, so this applies only
/// while that many distinct clients are active within the rule's period at once (a flood of
/// spoofed or many-prefix IPv6 clients, or a long period on a large site).
///
/// # Examples
///
/// ```
/// use turnstile::http::{HttpConfig, KeyOverflowPolicy};
///
/// assert_eq!(KeyOverflowPolicy::default(), KeyOverflowPolicy::Reject);
/// let config = HttpConfig::from_toml_str("max_keys_per_rule = 100000\nkey_overflow = \"shared\"\n")?;
/// assert_eq!(config.key_overflow, KeyOverflowPolicy::Shared);
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyOverflowPolicy {
    /// Reject the request with [`RejectReason::TooManyKeys`](crate::http::RejectReason::TooManyKeys)
    /// (the configured status, 429 by default, with no `Retry-After`; gRPC
    /// `RESOURCE_EXHAUSTED`). Memory stays bounded and no client goes uncounted; new clients
    /// are refused while the rule is full. Such rejections do not count towards a ban.
    #[default]
    Reject,
    /// Count every new client the rule has no room for on one shared counter, with the rule's
    /// limit: they are admitted, together, at the rule's rate. Memory stays bounded; new
    /// clients are limited more strictly than alone while the rule is full.
    Shared,
    /// Let the request pass this rule uncounted (its other rules still apply). Memory stays
    /// bounded and no new client is refused for it, but while the rule is full its limit does
    /// not hold for new clients: a client able to keep that many keys active (many IPv6
    /// prefixes, say) escapes it.
    Allow,
}

/// The algorithm of a rule.
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::http::RuleAlgorithm::default(), turnstile::http::RuleAlgorithm::FixedWindow);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RuleAlgorithm {
    /// `limit` per window aligned to the clock's epoch (AspNetCoreRateLimit instead starts a
    /// client's window at its first request; both allow up to 2 × `limit` across a boundary).
    #[default]
    FixedWindow,
    /// Exact sliding log: `limit` in any interval of `period`. Each client counted holds 8 bytes
    /// per permit of `limit` (at most 16,777,216), beside the ~60 bytes every rule's client costs.
    SlidingWindow,
    /// Approximate sliding window with O(1) memory.
    SlidingCounter,
    /// GCRA token bucket: burst = `limit`, rate = `limit` per `period`.
    TokenBucket,
}

/// What a rule counts by.
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::http::RuleKey::default(), turnstile::http::RuleKey::Ip);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RuleKey {
    /// The client IP.
    #[default]
    Ip,
    /// The client id.
    Client,
    /// The pair of both.
    IpAndClient,
}

/// One rule: at most `limit` requests per `period` to `endpoint`, per key.
///
/// # Examples
///
/// ```
/// let config = turnstile::http::HttpConfig::from_toml_str(
///     "[[rules]]\nname = \"per-ip\"\nperiod = \"15m\"\nlimit = 100\n",
/// )?;
/// assert_eq!(config.rules[0].name.as_deref(), Some("per-ip"));
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RuleConfig {
    /// The policy name in headers, logs and metrics; default `"{endpoint}-{period}"`, followed,
    /// where an earlier rule of the same list has that name already, by what tells this one
    /// apart: its key, `-monitor`, `-per_endpoint` (`"*-1m-client"` beside a per-IP `"*-1m"`).
    pub name: Option<String>,
    /// `*`, `*:/path`, `verb:/path` (`*` and `?` wildcards in the path, which may start with
    /// one: `*:*/health`), or `re:` + a regex
    /// (after an optional `verb:`, see [`endpoint_regex`](Self::endpoint_regex)).
    /// Matched against the request's path without its query, after RFC 3986's normalizations
    /// that change no resource: `/api/%76alues/%31` is `/api/values/1`, while `%2F` stays an
    /// escape, its hex digits upper-cased; a wildcard pattern is normalized alike
    /// (`get:/%7Euser` is `get:/~user`; a regex is matched as written, against the normalized
    /// path). A path with such escapes left is also matched as a
    /// handler reads it (axum's `Path` decodes them: `/files/a%2Fb` gives `/files/{*path}`
    /// the `a/b` of `/files/a/b`), so escaping steps around no rule; whitelist endpoints match
    /// the first form only. A `get:` pattern matches `HEAD` requests too, which axum serves
    /// with the `GET` handler (`head:` matches `HEAD` only).
    pub endpoint: String,
    /// When `endpoint` (after an optional `verb:`; without one, for any method) is a regular
    /// expression.
    pub regex: bool,
    /// A humantime duration: `1s`, `15m`, `12h`, `7d`.
    pub period: String,
    /// Requests per period; 0 blocks.
    pub limit: u64,
    /// The counting algorithm.
    pub algorithm: RuleAlgorithm,
    /// What the rule counts by.
    pub key: RuleKey,
    /// Count and log would-be rejections without enforcing them.
    pub monitor: bool,
    /// Count each `VERB:path` separately (AspNetCoreRateLimit's endpoint rate limiting); the
    /// path normalized as for `endpoint` and read as a handler reads it (escapes decoded, empty
    /// and `.` segments dropped), so two spellings of one path share a counter, and `HEAD`
    /// counted as the `GET` it is served as.
    pub per_endpoint: bool,
    /// Requests that may wait for this rule at once instead of being rejected (ASP.NET Core's
    /// `QueueLimit`); 0, the default: a rejection answers at once. A request this rule rejects
    /// for its rate, while fewer than `queue_limit` wait for the rule, waits in the rule's queue
    /// for its client's counter, at most `max_wait` from its arrival, and once the rule admits
    /// it is decided again (every rule, all-or-nothing, as a new request is); if its answer
    /// cannot come within `max_wait`, or the queue is full, or another of its rules would still
    /// refuse it after `max_wait` and it cannot wait for that one, it is rejected at once. Waiting
    /// requests hold nothing: a rejection charged no rule. One client's waiting requests are
    /// served in arrival order (see [`HttpLimiter`]'s "Waiting"), the count is of all clients
    /// together, and waiting uses tokio's timer. Memory backend only; not on a monitor rule or
    /// a rule of limit 0.
    ///
    /// [`HttpLimiter`]: crate::http::HttpLimiter
    pub queue_limit: u32,
    /// The longest a request may wait for this rule (a humantime duration), counted from its
    /// arrival; default: the rule's `period`. A request still waiting then is rejected with the
    /// rule's 429, and waits no more. Needs `queue_limit`.
    pub max_wait: Option<String>,
}

impl Default for RuleConfig {
    fn default() -> Self {
        RuleConfig {
            name: None,
            endpoint: "*".to_owned(),
            regex: false,
            period: String::new(),
            limit: 0,
            algorithm: RuleAlgorithm::default(),
            key: RuleKey::default(),
            monitor: false,
            per_endpoint: false,
            queue_limit: 0,
            max_wait: None,
        }
    }
}

/// A duration as the configuration writes it (humantime: `1s`, `15m`, `1h 30m`).
fn humantime_text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// Rules in code: the same rules a configuration file gives, without writing one.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{HttpConfig, RuleConfig};
///
/// let in_code = HttpConfig::default()
///     .rule(RuleConfig::new(Duration::from_secs(1), 2).name("per-ip"));
/// let from_toml = HttpConfig::from_toml_str(
///     "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 2\n",
/// )?;
/// assert_eq!(in_code, from_toml);
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
impl RuleConfig {
    /// At most `limit` requests per `period` from each client IP, on every endpoint, counted
    /// in fixed windows: the defaults of a rule in a file. A zero `period` is refused when the
    /// configuration is compiled, naming the rule; a `limit` of 0 blocks.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::RuleConfig;
    ///
    /// let rule = RuleConfig::new(Duration::from_secs(15 * 60), 100);
    /// assert_eq!((rule.period.as_str(), rule.limit, rule.endpoint.as_str()), ("15m", 100, "*"));
    /// ```
    pub fn new(period: Duration, limit: u64) -> Self {
        RuleConfig {
            period: humantime_text(period),
            limit,
            ..RuleConfig::default()
        }
    }

    /// The policy name in headers, logs and metrics (default `"{endpoint}-{period}"`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::RuleConfig;
    ///
    /// let rule = RuleConfig::new(Duration::from_secs(1), 2).name("per-ip");
    /// assert_eq!(rule.name.as_deref(), Some("per-ip"));
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The requests the rule applies to: `*`, `*:/path` or `verb:/path`, with `*` (any run of
    /// characters) and `?` (one) wildcards in the path.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::RuleConfig;
    ///
    /// let rule = RuleConfig::new(Duration::from_secs(60), 10).endpoint("post:/api/orders*");
    /// assert_eq!(rule.endpoint, "post:/api/orders*");
    /// ```
    pub fn endpoint(mut self, pattern: impl Into<String>) -> Self {
        self.endpoint = pattern.into();
        self.regex = false;
        self
    }

    /// The requests the rule applies to, as a regular expression over the path, after an
    /// optional `verb:` (without one, any method; the `verb:` is what precedes the first `:`
    /// when no `/` does, so `/api/(?:a|b)` is a regex over the path alone). It must match the
    /// whole path, case-insensitively (it is anchored at both ends): end it with `.*` to match
    /// a prefix.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::RuleConfig;
    ///
    /// // `/api/v1/users`, `/api/v2/`, ...: every path under a versioned API.
    /// let rule = RuleConfig::new(Duration::from_secs(60), 10).endpoint_regex(r"get:/api/v\d+/.*");
    /// assert!(rule.regex);
    /// // Any method.
    /// let rule = RuleConfig::new(Duration::from_secs(60), 10).endpoint_regex(r"/api/v\d+/.*");
    /// assert!(rule.regex);
    /// ```
    pub fn endpoint_regex(mut self, pattern: impl Into<String>) -> Self {
        self.endpoint = pattern.into();
        self.regex = true;
        self
    }

    /// The counting algorithm (fixed windows by default).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{RuleAlgorithm, RuleConfig};
    ///
    /// let rule = RuleConfig::new(Duration::from_secs(60), 10).algorithm(RuleAlgorithm::TokenBucket);
    /// assert_eq!(rule.algorithm, RuleAlgorithm::TokenBucket);
    /// ```
    pub fn algorithm(mut self, algorithm: RuleAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// What the rule counts by (the client IP by default).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{RuleConfig, RuleKey};
    ///
    /// let rule = RuleConfig::new(Duration::from_secs(1), 20).key(RuleKey::Client);
    /// assert_eq!(rule.key, RuleKey::Client);
    /// ```
    pub fn key(mut self, key: RuleKey) -> Self {
        self.key = key;
        self
    }

    /// Monitor (shadow) mode: requests the rule would reject are logged and counted, not
    /// rejected.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::RuleConfig;
    ///
    /// assert!(RuleConfig::new(Duration::from_secs(1), 5).monitor().monitor);
    /// ```
    pub fn monitor(mut self) -> Self {
        self.monitor = true;
        self
    }

    /// Counts each `VERB:path` separately (AspNetCoreRateLimit's endpoint rate limiting).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::RuleConfig;
    ///
    /// assert!(RuleConfig::new(Duration::from_secs(1), 5).per_endpoint().per_endpoint);
    /// ```
    pub fn per_endpoint(mut self) -> Self {
        self.per_endpoint = true;
        self
    }

    /// Lets up to `queue_limit` requests at once wait for this rule, each at most `max_wait`
    /// from its arrival, instead of being rejected at once (see
    /// [`queue_limit`](RuleConfig::queue_limit)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{HttpConfig, RuleConfig};
    ///
    /// let rule = RuleConfig::new(Duration::from_secs(1), 10).queue(100, Duration::from_secs(2));
    /// assert_eq!((rule.queue_limit, rule.max_wait.as_deref()), (100, Some("2s")));
    /// let from_toml = HttpConfig::from_toml_str(
    ///     "[[rules]]\nperiod = \"1s\"\nlimit = 10\nqueue_limit = 100\nmax_wait = \"2s\"\n",
    /// )?;
    /// assert_eq!(from_toml.rules[0], rule);
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn queue(mut self, queue_limit: u32, max_wait: Duration) -> Self {
        self.queue_limit = queue_limit;
        self.max_wait = Some(humantime_text(max_wait));
        self
    }
}

/// Rules for the clients whose IP is in `ip` (an address or a CIDR range).
///
/// # Examples
///
/// ```
/// let config = turnstile::http::HttpConfig::from_toml_str(
///     "[[ip_rules]]\nip = \"10.0.0.0/8\"\n[[ip_rules.rules]]\nperiod = \"1s\"\nlimit = 10\n",
/// )?;
/// assert_eq!(config.ip_rules[0].ip, "10.0.0.0/8");
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct IpRulesConfig {
    /// An IP address or CIDR range.
    pub ip: String,
    /// The rules.
    pub rules: Vec<RuleConfig>,
}

/// Rules for one client id.
///
/// # Examples
///
/// ```
/// let config = turnstile::http::HttpConfig::from_toml_str(
///     "[[client_rules]]\nclient_id = \"c1\"\n[[client_rules.rules]]\nperiod = \"1s\"\nlimit = 10\n",
/// )?;
/// assert_eq!(config.client_rules[0].client_id, "c1");
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClientRulesConfig {
    /// The client id.
    pub client_id: String,
    /// The rules.
    pub rules: Vec<RuleConfig>,
}

/// Requests that are admitted without consulting or charging any rule.
///
/// # Examples
///
/// ```
/// let config = turnstile::http::HttpConfig::from_toml_str(
///     "[whitelist]\nendpoints = [\"get:/api/license\"]\n",
/// )?;
/// assert_eq!(config.whitelist.endpoints.len(), 1);
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WhitelistConfig {
    /// IP addresses or CIDR ranges, none narrower than a client group (`client_ip.ipv4_prefix`,
    /// `ipv6_prefix`); IPv4-mapped ones stand for the IPv4 addresses.
    pub ips: Vec<String>,
    /// Client ids.
    pub clients: Vec<String>,
    /// Endpoint patterns, as in rules.
    pub endpoints: Vec<String>,
    /// Whitelists that exempt a request from the rules of one [`RuleKey`] only (their blocklist
    /// and bans still apply): a client whitelisted here from the rules that count by IP is
    /// still counted by the rules that count by client id. AspNetCoreRateLimit's two sections
    /// each have their own whitelists, which its translation puts here.
    pub by_key: Vec<KeyWhitelistConfig>,
}

/// A whitelist for the rules that count by one key (see [`WhitelistConfig::by_key`]).
///
/// A request it matches is not counted by those rules, general or specific, enforced or
/// monitor; the other rules decide it as if those did not exist. When no other rule applies
/// to it, it is [`Outcome::Whitelisted`](crate::http::Outcome::Whitelisted).
///
/// # Examples
///
/// ```
/// let config = turnstile::http::HttpConfig::from_toml_str(
///     "[[whitelist.by_key]]\nkey = \"ip\"\nips = [\"10.0.0.0/8\"]\n",
/// )?;
/// assert_eq!(config.whitelist.by_key[0].key, turnstile::http::RuleKey::Ip);
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct KeyWhitelistConfig {
    /// The rules it exempts from: those counting by this key.
    pub key: RuleKey,
    /// IP addresses or CIDR ranges, as in [`WhitelistConfig::ips`].
    pub ips: Vec<String>,
    /// Client ids.
    pub clients: Vec<String>,
    /// Endpoint patterns, as in rules.
    pub endpoints: Vec<String>,
}

impl KeyWhitelistConfig {
    /// An empty whitelist for the rules counting by `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::{KeyWhitelistConfig, RuleKey};
    ///
    /// let mut list = KeyWhitelistConfig::new(RuleKey::Client);
    /// list.clients.push("monitoring".to_owned());
    /// assert_eq!(list.key, RuleKey::Client);
    /// ```
    pub fn new(key: RuleKey) -> Self {
        KeyWhitelistConfig {
            key,
            ..KeyWhitelistConfig::default()
        }
    }
}

/// Clients that are always rejected with [`RejectReason::Blocked`](crate::http::RejectReason::Blocked).
///
/// # Examples
///
/// ```
/// let config = turnstile::http::HttpConfig::from_toml_str("[blocklist]\nips = [\"192.0.2.0/24\"]\n")?;
/// assert_eq!(config.blocklist.ips.len(), 1);
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BlocklistConfig {
    /// IP addresses or CIDR ranges, none narrower than a client group (`client_ip.ipv4_prefix`,
    /// `ipv6_prefix`); IPv4-mapped ones stand for the IPv4 addresses.
    pub ips: Vec<String>,
    /// Client ids.
    pub clients: Vec<String>,
}

/// Bans: a client rejected `after` times within `within` is rejected for `duration`.
///
/// # Examples
///
/// ```
/// let config = turnstile::http::HttpConfig::from_toml_str(
///     "[bans]\nafter = 10\nwithin = \"1m\"\nduration = \"15m\"\n",
/// )?;
/// assert_eq!(config.bans.unwrap().after, 10);
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BanConfig {
    /// Rejections that trigger a ban.
    pub after: u64,
    /// The interval they must fall in (humantime).
    pub within: String,
    /// How long a ban lasts (humantime). A ban longer than the clock reads (about 146 years
    /// after its epoch: `Duration::MAX`, `"1000000y"`) is for good: no reading reaches its end,
    /// and its `Retry-After` never falls below 4611686019 (seconds: 2^62 ns, rounded up). A
    /// duration humantime cannot hold (beyond about 584 billion years) is refused, naming
    /// `bans.duration`.
    pub duration: String,
    /// The most clients tracked (for rejection counts, and for bans). A rejection of a new
    /// client while every entry is busy is not counted towards a ban (the layer logs it and,
    /// with the feature `metrics`, counts it in `turnstile_http_ban_list_full`); no ban in
    /// force is ever evicted to make room.
    pub max_entries: usize,
}

impl Default for BanConfig {
    fn default() -> Self {
        BanConfig {
            after: 10,
            within: "1m".to_owned(),
            duration: "15m".to_owned(),
            max_entries: 100_000,
        }
    }
}

impl BanConfig {
    /// A client rejected `after` times within `within` is banned for `duration`, with the
    /// default bound on clients tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{BanConfig, HttpConfig};
    ///
    /// let mut config = HttpConfig::default();
    /// config.bans = Some(BanConfig::new(10, Duration::from_secs(60), Duration::from_secs(15 * 60)));
    /// assert_eq!(config.bans.as_ref().unwrap().duration, "15m");
    /// ```
    pub fn new(after: u64, within: Duration, duration: Duration) -> Self {
        BanConfig {
            after,
            within: humantime_text(within),
            duration: humantime_text(duration),
            ..BanConfig::default()
        }
    }
}

/// Where counters live: in this process (`kind = "memory"`, the default), or in Redis
/// (`kind = "redis"`, features `http` and `redis`, the limiter built with
/// [`HttpLimiter::connect`](crate::http::HttpLimiter)).
///
/// # Counting in Redis
///
/// Everything but the counting stays as in memory: whitelists, the blocklist, bans (kept in each
/// process's memory), rule matching and selection, limit 0 and missing keys. Each enforced rule
/// that matches counts in its own `RedisLimiter` (the rule's algorithm, on Redis's clock), so
/// that every process using the same server and prefix shares the limits.
///
/// # Keys
///
/// A rule's keys are `{prefix}:r{id}:{subject}:{fw|sw|sc|tb}` (see `RedisLimiter`), where `id` is
/// 16 hex digits of the SHA-256 of the rule's identity (scope, name, endpoint, regex flag,
/// period, algorithm, key and per-endpoint flag) and `subject` encodes the request's counter key
/// (client IP, client id, `VERB:path`). The limit is not part of the name: a reload that only
/// changes a rule's limit keeps its counters in Redis, and so does a reload that leaves the rule
/// alone. Changing anything in the identity starts the rule from fresh keys (the old ones expire
/// by their TTL). A rule whose keys a reload keeps also keeps its `RedisLimiter` (deny cache,
/// fallback counts), unless the reload changed `failure`, `deadline` or `max_keys_per_rule`; see
/// [`HttpLimiter`](crate::http::HttpLimiter)'s "Reload".
///
/// # All or nothing, and what is not atomic
///
/// A request's enforced rules are decided together in **one script, one round trip**, whatever
/// their number: one matching rule runs its algorithm's script; several (each counting its own
/// subject, with its own algorithm and keys) run one script over all their keys, in which every
/// rule decides on the state before any write, and all are charged only if all admit. A
/// rejected request is therefore charged to no rule, even when other processes race for the
/// same permits: Redis runs one script at a time. After Redis lost its script cache, the first
/// request costs two commands (`EVALSHA`, answered `NOSCRIPT`, then `EVAL`).
///
/// # Redis Cluster
///
/// With `[backend] cluster = true` (`url` lists one or more seed nodes, comma-separated) the
/// rules count in a Cluster. A key's hash tag is the request's subject, so the counters of
/// different clients spread over the masters. One script may only touch one slot, so a
/// request's enforced rules must give it one subject: on a Cluster every enforced rule that
/// counts must have the same `key` and `per_endpoint` (checked when the configuration loads,
/// naming the rule that differs). Rules of different periods, algorithms and endpoints, the
/// usual set of global limits, qualify; an IP rule beside a client-id rule does not. Monitor
/// rules, counted one script each, may count by anything.
///
/// An admitted request reports every rule's quota (remaining after it, reset-after). A rejected
/// one names the rule that asks to wait longest (its retry-after covers every rule that
/// rejected) and reports every rule: the rejecting ones with remaining 0 and reset after their
/// retry-after, the others as they stand, untouched. When rules' deny caches already know that
/// they reject the request, the request is rejected with no round trip, by the one of those
/// rules that asks to wait longest, and only those rules are reported.
///
/// Monitor rules are counted after the enforced ones, one script each, all at once, and only for
/// admitted requests: they never reject, and nothing ties them to the enforced rules' decision.
/// With Redis silent, an admitted request so waits at most two deadlines, its enforced rules'
/// and its monitor rules'.
///
/// # Failures
///
/// When Redis fails or misses the `[backend] deadline`, the `[backend] failure` policy decides
/// for each enforced rule: `open` admits, `closed` rejects with [`RejectReason::Unavailable`](crate::http::RejectReason::Unavailable),
/// `fallback` counts in a local in-memory limiter (`FailurePolicy::Fallback`, holding at most
/// `max_keys_per_rule` clients per rule: a new client meeting one full of active clients is
/// rejected with [`RejectReason::TooManyKeys`](crate::http::RejectReason::TooManyKeys)). The request is
/// admitted only if every rule's policy admits; a rejection names the first rule whose policy
/// made it unavailable (`closed`), else the rule that asks to wait longest (`fallback`), and
/// reports every rule as its policy answered. With several rules the local limiters are still
/// all or nothing: they are charged one after the other, and when one rejects, the ones before
/// it give their permits back (nothing is written to Redis; an exact sliding window's permit
/// comes back late, never early, as in a [`Chain`](crate::Chain)). Every decision the policy
/// made instead of Redis, exactly one per enforced rule per request (and one per monitor
/// rule), is logged (`tracing` warn) and counted in
/// `turnstile_http_backend_fallbacks` (label `rule`) with the feature `metrics`. A timed-out
/// script is never retried: it may still run, and charge every rule.
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::http::BackendConfig::default().kind, "memory");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BackendConfig {
    /// `"memory"` (the default: counters in this process), or `"redis"` (counters in Redis,
    /// shared by every process using the same server and prefix; needs the feature `redis` and
    /// [`HttpLimiter::connect`](crate::http::HttpLimiter)).
    pub kind: String,
    /// The Redis URL, such as `redis://127.0.0.1:6379/` (required by `redis`). With `cluster`,
    /// one seed node of the Cluster, or several separated by commas.
    pub url: Option<String>,
    /// The server is a Redis Cluster (`false` by default). A request's rules are decided in
    /// one script, so their keys must share a slot: every enforced rule must then count by the
    /// same `key` with the same `per_endpoint`, which makes a request's keys differ only in the
    /// rule, outside their hash tag. [`HttpLimiter::connect`](crate::http::HttpLimiter::connect)
    /// keeps redis-rs's Cluster client as it comes, which sends a request again after a
    /// connection error or a redirection (up to 16 times): a script whose reply was lost with
    /// its connection may then run twice and charge the request twice (stricter, never looser).
    /// Where that matters, build the connection with `ClusterClient::builder(..).retries(0)` and
    /// pass it to [`HttpLimiter::with_cluster_connection`](crate::http::HttpLimiter::with_cluster_connection);
    /// a redirection (resharding, a failover) then fails its decision over to `failure`.
    pub cluster: bool,
    /// The key prefix in Redis (default `turnstile`).
    pub prefix: Option<String>,
    /// What happens when Redis fails or misses the deadline: `"open"` (admit), `"closed"`
    /// (reject, the default) or `"fallback"` (count in this process's memory; `"fallback:0.25"`
    /// allows each process a quarter of each limit meanwhile).
    pub failure: Option<String>,
    /// How long one decision in Redis may take (humantime, default `50ms`).
    pub deadline: Option<String>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            kind: "memory".to_owned(),
            url: None,
            cluster: false,
            prefix: None,
            failure: None,
            deadline: None,
        }
    }
}

/// Why a configuration could not be loaded or compiled. The message names the field.
///
/// # Examples
///
/// ```
/// use turnstile::http::{HttpConfig, HttpLimiter};
///
/// let config = HttpConfig::from_toml_str("[[rules]]\nperiod = \"5x\"\nlimit = 1\n")?;
/// let err = HttpLimiter::new(config).unwrap_err();
/// assert!(err.to_string().starts_with("rules[0].period"));
/// # Ok::<(), turnstile::http::HttpConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpConfigError {
    /// The document does not parse or does not fit the model.
    Parse {
        /// `"toml"`, `"json"`, `"yaml"` or `"AspNetCoreRateLimit json"`.
        format: &'static str,
        /// The parser's message (it names the key and position).
        message: String,
    },
    /// A field has a value that is not allowed.
    Invalid {
        /// The field's path, such as `rules[2].period`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The file could not be read, or its extension is not known.
    Io {
        /// The path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The configuration counts in Redis (`backend.kind = "redis"`): connecting is async, so
    /// build the limiter with `HttpLimiter::connect(config).await` (features `http` and
    /// `redis`) instead of `HttpLimiter::new`.
    NeedsConnect,
    /// The backend could not be reached or set up (for example, Redis refused the connection).
    Backend {
        /// What went wrong.
        message: String,
    },
}

impl HttpConfigError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        HttpConfigError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for HttpConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpConfigError::Parse { format, message } => {
                write!(f, "invalid {format} configuration: {message}")
            }
            HttpConfigError::Invalid { field, message } => write!(f, "{field}: {message}"),
            HttpConfigError::Io { path, message } => write!(f, "{path}: {message}"),
            HttpConfigError::NeedsConnect => f.write_str(
                "backend.kind: \"redis\" needs a connection: build the limiter with HttpLimiter::connect(config).await",
            ),
            HttpConfigError::Backend { message } => write!(f, "backend: {message}"),
        }
    }
}

impl std::error::Error for HttpConfigError {}

impl HttpConfig {
    /// Adds a general rule, for every client.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{HttpConfig, HttpLimiter, RuleConfig};
    ///
    /// let config = HttpConfig::default()
    ///     .rule(RuleConfig::new(Duration::from_secs(1), 2).name("per-ip"))
    ///     .rule(RuleConfig::new(Duration::from_secs(15 * 60), 100).endpoint("get:/api/search*"));
    /// assert_eq!(config.rules.len(), 2);
    /// let limiter = HttpLimiter::new(config)?;
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn rule(mut self, rule: RuleConfig) -> Self {
        self.rules.push(rule);
        self
    }

    /// Adds a rule for the clients whose IP is `ip` (an address or a CIDR range), to the
    /// rules already given for `ip` if any. It takes precedence over general rules of the same
    /// period and key.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{HttpConfig, RuleConfig};
    ///
    /// let config = HttpConfig::default()
    ///     .ip_rule("10.0.0.0/8", RuleConfig::new(Duration::from_secs(1), 100))
    ///     .ip_rule("10.0.0.0/8", RuleConfig::new(Duration::from_secs(60), 1000));
    /// assert_eq!(config.ip_rules.len(), 1);
    /// assert_eq!(config.ip_rules[0].rules.len(), 2);
    /// ```
    pub fn ip_rule(mut self, ip: impl Into<String>, rule: RuleConfig) -> Self {
        let ip = ip.into();
        match self.ip_rules.iter_mut().find(|r| r.ip == ip) {
            Some(rules) => rules.rules.push(rule),
            None => self.ip_rules.push(IpRulesConfig {
                ip,
                rules: vec![rule],
            }),
        }
        self
    }

    /// Adds a rule for the client `client_id`, to the rules already given for it if any. It
    /// takes precedence over general rules of the same period and key; a limit of 0 blocks the
    /// client.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{HttpConfig, RuleConfig, RuleKey};
    ///
    /// let config = HttpConfig::default()
    ///     .client_id_header("X-ClientId")
    ///     .client_rule("partner", RuleConfig::new(Duration::from_secs(1), 20).key(RuleKey::Client));
    /// assert_eq!(config.client_rules[0].client_id, "partner");
    /// ```
    pub fn client_rule(mut self, client_id: impl Into<String>, rule: RuleConfig) -> Self {
        let client_id = client_id.into();
        match self
            .client_rules
            .iter_mut()
            .find(|r| r.client_id == client_id)
        {
            Some(rules) => rules.rules.push(rule),
            None => self.client_rules.push(ClientRulesConfig {
                client_id,
                rules: vec![rule],
            }),
        }
        self
    }

    /// The header carrying the client id, for client rules and the client lists.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::HttpConfig;
    ///
    /// let config = HttpConfig::default().client_id_header("X-ClientId");
    /// assert_eq!(config.client_id_header.as_deref(), Some("X-ClientId"));
    /// ```
    pub fn client_id_header(mut self, name: impl Into<String>) -> Self {
        self.client_id_header = Some(name.into());
        self
    }

    /// Sets the most clients each rule counts in memory, and what a new client gets from a rule
    /// that is full ([`max_keys_per_rule`](Self::max_keys_per_rule),
    /// [`key_overflow`](Self::key_overflow)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::http::{HttpConfig, HttpLimiter, KeyOverflowPolicy, RuleConfig};
    ///
    /// let config = HttpConfig::default()
    ///     .rule(RuleConfig::new(Duration::from_secs(24 * 3600), 10_000).name("daily"))
    ///     .max_keys(4_000_000, KeyOverflowPolicy::Shared);
    /// assert_eq!(config.max_keys_per_rule, 4_000_000);
    /// let limiter = HttpLimiter::new(config)?;
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn max_keys(mut self, per_rule: usize, overflow: KeyOverflowPolicy) -> Self {
        self.max_keys_per_rule = per_rule;
        self.key_overflow = overflow;
        self
    }

    /// Parses the native TOML format.
    ///
    /// # Errors
    ///
    /// [`HttpConfigError::Parse`] naming the key and line.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = turnstile::http::HttpConfig::from_toml_str("missing_key = \"allow\"")?;
    /// assert_eq!(config.missing_key, turnstile::http::MissingKey::Allow);
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self, HttpConfigError> {
        toml::from_str(text).map_err(|e| HttpConfigError::Parse {
            format: "toml",
            message: e.to_string(),
        })
    }

    /// Parses the native format as JSON, or AspNetCoreRateLimit's JSON when the document's
    /// top-level keys are its sections (`IpRateLimiting`, `ClientRateLimiting`, ...), read as
    /// ASP.NET reads an `appsettings.json`: comments and trailing commas allowed, names in any
    /// case.
    ///
    /// # Errors
    ///
    /// [`HttpConfigError::Parse`] naming the position.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = turnstile::http::HttpConfig::from_json_str(r#"{"rules": [{"period": "1s", "limit": 3}]}"#)?;
    /// assert_eq!(config.rules[0].limit, 3);
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn from_json_str(text: &str) -> Result<Self, HttpConfigError> {
        let text = without_bom(text);
        let value: serde_json::Value = match serde_json::from_str(text) {
            Ok(value) => value,
            Err(e) => {
                // An `appsettings.json` may have comments and trailing commas, which ASP.NET's
                // JSON configuration accepts; the native format stays plain JSON.
                let stripped = without_comments(text)
                    .map(|text| serde_json::from_str::<serde_json::Value>(&text));
                let message = match stripped {
                    Some(Ok(value)) if crate::http::aspnet::is_aspnet(&value) => {
                        if let Some(stripped) = without_comments(text) {
                            crate::http::aspnet::check_duplicate_keys(&stripped)?;
                        }
                        return crate::http::aspnet::translate(value);
                    }
                    // Not valid even with its comments read as ASP.NET reads them: the plain
                    // error points at the first comment, which an `appsettings.json` may have;
                    // the other says where the document is wrong (positions are kept).
                    Some(Err(stripped)) => format!(
                        "{e} (read as an appsettings.json, whose comments and trailing commas \
                         are allowed: {stripped})"
                    ),
                    _ => e.to_string(),
                };
                return Err(HttpConfigError::Parse {
                    format: "json",
                    message,
                });
            }
        };
        if crate::http::aspnet::is_aspnet(&value) {
            crate::http::aspnet::check_duplicate_keys(text)?;
            return crate::http::aspnet::translate(value);
        }
        if !value.is_object() {
            return Err(not_a_map("json"));
        }
        // From the text, not from `value`: a `Value` has no positions, so its errors would say
        // "invalid type" without saying where.
        serde_json::from_str(text).map_err(|e| HttpConfigError::Parse {
            format: "json",
            message: e.to_string(),
        })
    }

    /// Parses AspNetCoreRateLimit's JSON (an `appsettings.json` with its sections), as ASP.NET
    /// reads it: comments and trailing commas allowed, section and field names in any case.
    ///
    /// # How the document is translated
    ///
    /// The document is read as ASP.NET's configuration binder reads it: section and field names in
    /// any case (`"limit"`, `"Limit"` and `"LIMIT"` are one key; a value given twice in one
    /// object, in one case or two, is an error anywhere in the document, as there, and so are two
    /// objects or lists under one key, which ASP.NET merges), and numbers and booleans also from
    /// their text (`"Limit": "100"`). Fields it does not know are ignored, as there (the
    /// document's other sections too), except turnstile's own top-level settings (`"rules"`,
    /// `"bans"`, ...), which are refused: the document is read only through its translation,
    /// and they would do nothing (set them on the loaded `HttpConfig`); a value of
    /// the wrong kind, and any value the limiter would refuse (a period, an endpoint pattern, an
    /// IP entry, a header name), is an error naming the document's field
    /// (`IpRateLimiting.GeneralRules[2].Limit`), checked as the document is translated.
    ///
    /// Endpoint patterns match the whole `VERB:path` there, with `*` and `?` wildcards and in any
    /// case (AspNetCoreRateLimit 4 and 5; 3.x matched them as prefixes), as they do here:
    /// `*:/api/values` is not `/api/values/1`, `*:/api/values*` is. With `EnableRegexRuleMatching`,
    /// a section's patterns (its rules', its policies' and its `EndpointWhitelist`) are regular
    /// expressions over `verb:path`, anchored and case-insensitive there; each becomes a regex rule
    /// here (`verb:` a method name, or `.+` for any), and a method part that is itself a regex
    /// (`((post)|(put)):/api/values`, as its documentation writes) becomes one rule per method it
    /// matches (one that matches what it matches there in place of the method for any method
    /// is for every method: `*` for general rules, as in `(get|\*)`, and the text `.+` for a
    /// policy's rules and `EndpointWhitelist`); one matching no method is an error naming it. A `|` outside any group
    /// (`get:/a|get:/b`) is refused: there the anchors bind to its first and last alternatives
    /// only, which no rule here reads alike.
    ///
    /// `IpRateLimiting` general rules count by IP, `ClientRateLimiting` ones by client id (named
    /// `client:{endpoint}-{period}` so that both sections can be used at once). The two sections
    /// apply independently, as the two middlewares do there: the lowest limit per period is taken
    /// within each section (and its policies), and both sections' rules must admit. Two rules of
    /// one section with the same endpoint and period are legal there, only the lower limit
    /// applying: the other is left out. A policy's rule replaces the general rules whose `Period`
    /// is the same text, as there: a general rule of another text stays in force for the
    /// policy's clients even when its window is the same (`1m` beside a policy's `60s`), the
    /// lower limit of the two applying. A policy that has rules of a general rule's window
    /// written both as its text and otherwise (`1m` and `60s`) is refused, naming its `Rules`:
    /// there the general rule gives way only to a matching rule of its text, which rules here
    /// cannot express; so is a policy rule of a general rule's text in another window (its
    /// `PeriodTimespan`). A request without the client id header is the client
    /// `"anon"` (`anonymous_client_id`), as there; and the path is matched and counted without its
    /// trailing `/` (`trim_trailing_slash`), as there. A client id has no length limit there:
    /// `client_id_max_len` is raised to the longest id a policy's `ClientId` or a
    /// `ClientWhitelist` names, so that each is read (one over 4096 bytes is refused naming its
    /// field). With `EnableEndpointRateLimiting`, every
    /// rule counts each `VERB:path` separately, as there. A rule's `MonitorMode` is its
    /// `monitor`; where AspNetCoreRateLimit lets a monitor rule take part in the choice of the
    /// lowest limit of its period (so that an enforced rule of that period may stop applying),
    /// monitor rules are chosen apart here, and the enforced rule stays in force: stricter,
    /// never looser.
    ///
    /// A section's `IpWhitelist`, `ClientWhitelist` and `EndpointWhitelist` exempt requests from
    /// that section's rules only (a `whitelist.by_key` entry for its key). IP entries there and in
    /// `IpRules[].Ip` may be addresses, CIDR ranges, `first-last` ranges or `address/mask`
    /// (`192.168.0.0/255.255.255.0`), as there: each becomes the CIDR ranges that cover it exactly
    /// (a range not aligned to one becomes several; an IP policy is then one entry per range, with
    /// the same rules).
    ///
    /// Periods are AspNetCoreRateLimit's (`1s`, `15m`, `12h`, `7d`; a fraction, `1.5m`, is read
    /// as there too). Other units are read here where there they fail every request their rule
    /// applies to (it knows only `s`, `m`, `h` and `d`): `1w` is 7 days, `1mo` 30 days and `1y`
    /// 365, and any other text is read as a humantime duration. A rule's `PeriodTimespan` (a .NET `TimeSpan`, `[d.]hh:mm[:ss[.fffffff]]` or
    /// `d:hh:mm:ss[.fffffff]`) is its
    /// window when given, as there. A `Limit` of zero or less blocks every request its rule
    /// applies to, as there (`-1` becomes `limit = 0`); a fraction, or more than 4294967295, is
    /// refused naming the field. A rule without an `Endpoint` is refused: there it applies to no
    /// request, and read as `*` it would limit every one.
    ///
    /// `RealIpHeader` becomes the only forwarding header read; it is read only from the peers in
    /// `client_ip.trusted_proxies`, which AspNetCoreRateLimit has no notion of (set it yourself).
    /// It is `X-Real-IP` and the client id header `X-ClientId` unless a section names them. There
    /// both middlewares read one header of each, for their rules and their whitelists alike: the
    /// IP section's `RealIpHeader` and the client section's `ClientIdHeader`, the defaults when
    /// that section names none (the other section's are never read). Here too the IP
    /// section's `RealIpHeader` and the client section's `ClientIdHeader` win when both
    /// sections name one; a header only the other section names is read here, where there it
    /// is not.
    ///
    /// `EnableEndpointRateLimiting` is each section's own: a section that leaves it off keeps only
    /// its `*` rules (the others never apply there) while the other section's endpoint rules do.
    ///
    /// `QuotaExceededResponse.Content` (or `QuotaExceededMessage`) is a .NET format string, turned
    /// into the body template (`{0}` limit, `{1}` period, `{2}` retry-after; `{{` and `}}` literal
    /// braces, so `{{rule}}` is the text `{rule}`), sent as `text/plain` unless `ContentType` says
    /// otherwise, with its `StatusCode`, which is 429 unless given (it wins over `HttpStatusCode`
    /// there; a `null` one leaves `HttpStatusCode`). The period is written in its largest whole
    /// unit (`1d`, `15m`), which is the `Period` as written for the usual ones; a period written
    /// otherwise (`60s`, `1.5m`, `1w`) is written `1m`, `90s`, `7d`. Admitted responses carry its
    /// `X-Rate-Limit-Limit`, `-Remaining` and `-Reset` (`response.aspnet_headers`, of the rule
    /// with the longest period, as there) beside the IETF headers. `DisableRateLimitHeaders`
    /// leaves out `Retry-After` as well as the quota headers, as there. Every rejection has one
    /// response here, where each section has its own there: the response one section gives is
    /// that of both (the other giving none of `HttpStatusCode`, `QuotaExceededResponse`,
    /// `QuotaExceededMessage` and `DisableRateLimitHeaders`), and two sections that give
    /// different ones are refused, naming `ClientRateLimiting`.
    ///
    /// `StackBlockedRequests: true` is refused: rejected requests are never counted here. So is a
    /// rule's own `QuotaExceededResponse` (of a rule that applies): every rejection here has the
    /// section's response, and there that rule's would be sent instead.
    /// `RateLimitCounterPrefix` becomes `backend.prefix`, the key prefix in Redis once the backend
    /// is switched to Redis (`backend.kind = "redis"`; the memory backend has no keys).
    ///
    /// # Errors
    ///
    /// [`HttpConfigError::Parse`] naming the position or the section.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = turnstile::http::HttpConfig::from_aspnet_json(r#"{"IpRateLimiting": {
    ///     "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]}}"#)?;
    /// assert_eq!(config.rules[0].period, "1s");
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn from_aspnet_json(text: &str) -> Result<Self, HttpConfigError> {
        // As ASP.NET's JSON configuration reads it: comments and trailing commas allowed.
        let text = without_bom(text);
        let stripped = without_comments(text);
        let text = stripped.as_deref().unwrap_or(text);
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| HttpConfigError::Parse {
                format: "AspNetCoreRateLimit json",
                message: e.to_string(),
            })?;
        crate::http::aspnet::check_duplicate_keys(text)?;
        crate::http::aspnet::translate(value)
    }

    /// Parses the native format as YAML (a leading UTF-8 byte-order mark is skipped, as by the
    /// TOML and JSON parsers).
    ///
    /// # Errors
    ///
    /// [`HttpConfigError::Parse`] naming the key and position.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = turnstile::http::HttpConfig::from_yaml_str("rules:\n  - period: 1m\n    limit: 5\n")?;
    /// assert_eq!(config.rules[0].limit, 5);
    /// # Ok::<(), turnstile::http::HttpConfigError>(())
    /// ```
    pub fn from_yaml_str(text: &str) -> Result<Self, HttpConfigError> {
        serde_norway::from_str(text).map_err(|e| HttpConfigError::Parse {
            format: "yaml",
            message: e.to_string(),
        })
    }

    /// Reads a file, choosing the format by its extension (`.toml`, `.json`, `.yaml`, `.yml`).
    ///
    /// # Errors
    ///
    /// [`HttpConfigError::Io`] when it cannot be read or the extension is unknown; else as the
    /// format's loader.
    ///
    /// # Examples
    ///
    /// ```
    /// let err = turnstile::http::HttpConfig::from_file("/nonexistent/limits.toml").unwrap_err();
    /// assert!(err.to_string().contains("/nonexistent/limits.toml"));
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, HttpConfigError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| HttpConfigError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_file_bytes(path, &bytes)
    }

    /// `bytes`, read from `path`, in the format `path`'s extension names (what
    /// [`from_file`](Self::from_file) does once it has read them).
    pub(crate) fn from_file_bytes(path: &Path, bytes: &[u8]) -> Result<Self, HttpConfigError> {
        let io = |message: String| HttpConfigError::Io {
            path: path.display().to_string(),
            message,
        };
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        // The message `read_to_string` gives.
        let text = std::str::from_utf8(bytes)
            .map_err(|_| io("stream did not contain valid UTF-8".to_owned()))?;
        match ext.as_deref() {
            Some("toml") => Self::from_toml_str(text),
            Some("json") => Self::from_json_str(text),
            Some("yaml") | Some("yml") => Self::from_yaml_str(text),
            _ => Err(io(
                "unknown extension: expected .toml, .json, .yaml or .yml".to_owned(),
            )),
        }
    }
}

/// The error for a JSON document whose top level is not an object of settings (a list, say:
/// serde_json reads an empty list as a configuration with every setting at its default, no
/// rule, and a longer one as the fields in their order; the YAML and TOML readers refuse it).
fn not_a_map(format: &'static str) -> HttpConfigError {
    HttpConfigError::Parse {
        format,
        message: "the document must be an object of settings at its top level, not a list or \
                  a single value"
            .to_owned(),
    }
}

/// `text` without a leading UTF-8 byte-order mark: editors on Windows (Visual Studio's "UTF-8
/// with signature") write one at the start of `appsettings.json` files, ASP.NET's reader skips
/// it, and serde_json would stop at it ("expected value at line 1 column 1").
fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// `text` with what ASP.NET's JSON configuration reads beyond JSON made blank: `//` and
/// `/* */` comments, and a comma before a closing `]` or `}`. Each removed character becomes a
/// space (a newline stays), so that positions in errors stay right. `None` when there is none.
fn without_comments(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut changed = false;
    // The last comma outside strings and comments not yet followed by anything but blanks.
    let mut comma: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                comma = None;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    out[i] = b' ';
                    i += 1;
                }
                changed = true;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |e| i + 2 + e + 2);
                for b in &mut out[i..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
                changed = true;
            }
            b',' => {
                comma = Some(i);
                i += 1;
            }
            b']' | b'}' => {
                if let Some(at) = comma.take() {
                    out[at] = b' ';
                    changed = true;
                }
                i += 1;
            }
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                comma = None;
                i += 1;
            }
        }
    }
    // Only whole characters were blanked (every byte of one): still UTF-8.
    changed.then(|| String::from_utf8(out).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One document in TOML, JSON and YAML is one configuration, periods and limits at their
    /// bounds included, and a value the compiler refuses is refused naming the same field
    /// whichever format it came in (a probe of the review that found nothing, pinned).
    #[test]
    fn toml_json_and_yaml_read_one_document_alike() {
        let rules = [
            ("1s", 0u64),
            ("15m", 1),
            ("12h", 4_294_967_295),
            ("7d", 100),
            ("1.5m", 2),
            ("1m 30s", 3),
        ];
        let toml: String = rules
            .iter()
            .map(|(p, l)| {
                format!("[[rules]]\nendpoint = \"*:/{p}\"\nperiod = \"{p}\"\nlimit = {l}\n")
            })
            .collect();
        let json = format!(
            "{{\"rules\": [{}]}}",
            rules
                .iter()
                .map(|(p, l)| format!(
                    "{{\"endpoint\": \"*:/{p}\", \"period\": \"{p}\", \"limit\": {l}}}"
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let yaml: String = std::iter::once("rules:\n".to_owned())
            .chain(rules.iter().map(|(p, l)| {
                format!("  - endpoint: \"*:/{p}\"\n    period: {p}\n    limit: {l}\n")
            }))
            .collect();
        let from_toml = HttpConfig::from_toml_str(&toml).unwrap();
        assert_eq!(HttpConfig::from_json_str(&json).unwrap(), from_toml);
        assert_eq!(HttpConfig::from_yaml_str(&yaml).unwrap(), from_toml);
        crate::http::HttpLimiter::new(from_toml).unwrap();
        for (period, limit, field) in [
            ("0s", 1u64, "rules[0].period"),
            ("585y", 1, "rules[0].period"),
            ("1s", 4_294_967_296, "rules[0].limit"),
        ] {
            let errors: Vec<String> = [
                HttpConfig::from_toml_str(&format!(
                    "[[rules]]\nperiod = \"{period}\"\nlimit = {limit}\n"
                )),
                HttpConfig::from_json_str(&format!(
                    "{{\"rules\": [{{\"period\": \"{period}\", \"limit\": {limit}}}]}}"
                )),
                HttpConfig::from_yaml_str(&format!(
                    "rules:\n  - period: {period}\n    limit: {limit}\n"
                )),
            ]
            .into_iter()
            .map(|config| {
                crate::http::HttpLimiter::new(config.unwrap())
                    .unwrap_err()
                    .to_string()
            })
            .collect();
            assert!(errors[0].starts_with(field), "{}", errors[0]);
            assert!(errors.iter().all(|e| *e == errors[0]), "{errors:?}");
        }
    }

    /// Deeply nested documents are refused with a typed error by every loader, never a stack
    /// overflow (an abort, which no caller can catch): the parsers' recursion limits hold,
    /// and so does the walk that looks for keys given twice in an AspNetCoreRateLimit document
    /// (a probe of the review that found nothing, pinned). YAML is nested less deeply here:
    /// its scanner takes time quadratic in the depth of flow collections.
    #[test]
    fn deeply_nested_documents_are_refused_not_overflowing_the_stack() {
        let nested = |open: &str, close: &str, depth: usize| {
            format!("{}{}", open.repeat(depth), close.repeat(depth))
        };
        let depth = 100_000;
        for (format, result) in [
            (
                "toml",
                HttpConfig::from_toml_str(&format!("rules = {}\n", nested("[", "]", depth))),
            ),
            (
                "toml",
                HttpConfig::from_toml_str(&format!("rules = {}\n", nested("{a=", "}", depth))),
            ),
            (
                "json",
                HttpConfig::from_json_str(&format!("{{\"rules\": {}}}", nested("[", "]", depth))),
            ),
            (
                "json",
                HttpConfig::from_json_str(&format!(
                    "{{\"IpRateLimiting\": {}}}",
                    nested("{\"a\":", "}", depth)
                )),
            ),
            (
                "json",
                HttpConfig::from_json_str(&format!(
                    "{{\"IpRateLimiting\": {} // a comment\n}}",
                    nested("[", "]", depth)
                )),
            ),
            (
                "AspNetCoreRateLimit json",
                HttpConfig::from_aspnet_json(&format!(
                    "{{\"IpRateLimiting\": {}}}",
                    nested("{\"a\":", "}", depth)
                )),
            ),
            (
                "yaml",
                HttpConfig::from_yaml_str(&format!("rules: {}\n", nested("[", "]", 5_000))),
            ),
            (
                "yaml",
                HttpConfig::from_yaml_str(&format!("rules: {}\n", nested("{a: ", "}", 5_000))),
            ),
        ] {
            match result {
                Err(HttpConfigError::Parse { format: f, .. }) => assert_eq!(f, format),
                other => panic!("{format}: {other:?}"),
            }
        }
    }

    /// A native JSON document that does not fit the model is reported with its position, as
    /// the loader's documentation says (and as TOML and YAML are): not a bare "invalid type".
    #[test]
    fn json_errors_give_the_position() {
        let text = "{\n  \"rules\": [\n    {\"period\": \"1s\", \"limit\": \"ten\"}\n  ]\n}";
        let e = HttpConfig::from_json_str(text).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        let e = HttpConfig::from_json_str("{\"rules\": [],\n\"limt\": 3}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("limt") && e.contains("line 2"), "{e}");
    }
}
