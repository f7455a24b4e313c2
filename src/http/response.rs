//! The responses: 429 (configurable) with `Retry-After`, an `application/problem+json` body, and
//! the IETF `RateLimit` / `RateLimit-Policy` headers (legacy `X-RateLimit-*` as an option).

use crate::http::{Outcome, QuotaState, RejectReason, Verdict};
use bytes::Bytes;
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde::Deserialize;
use std::cell::RefCell;
use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// How rejections look and which headers every response carries.
///
/// # Examples
///
/// ```
/// use turnstile::http::ResponseConfig;
///
/// let config = ResponseConfig::default();
/// assert_eq!(config.status, 429);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ResponseConfig {
    /// The status of a rejection (429 by default; an error status, `400..=599`).
    pub status: u16,
    /// The status when the client's key cannot be determined and such requests are rejected
    /// (400 by default; `400..=599`).
    pub no_key_status: u16,
    /// The status when the counting backend (Redis) failed and its failure policy rejects
    /// ([`RejectReason::Unavailable`]; 503 by default, `400..=599`): the client did not exceed
    /// anything, and a 429 would tell it, and the dashboards counting 429s, that it had.
    pub unavailable_status: u16,
    /// The rejection body's content type. `None` (the default): `application/problem+json`
    /// for the built-in problem+json body, `text/plain; charset=utf-8` for a `body` template
    /// (set it when the template is JSON or HTML).
    pub content_type: Option<String>,
    /// The rejection body; `None` gives a problem+json document. A template: `{rule}`,
    /// `{limit}`, `{period}`, `{retry_after}` (whole seconds) and `{reason}` are replaced, and
    /// `{{` is a literal `{` (so `{{rule}` is the text `{rule}`; any other brace is text as
    /// it is). `{period}` is the window in its largest whole unit among `d`, `h`, `m`, `s` and
    /// `ms` (`1d`, `15m`, `90s`), as periods are usually written. When
    /// `content_type` is JSON (`application/json`, or any `+json` type) the values are written
    /// as the inside of a JSON string (a rule named `say "hi"` gives `say \"hi\"`), and when it
    /// is `text/html` HTML-escaped, so that a template of either kind stays well-formed
    /// whatever the rules are named. A value the rejection does not have (`{retry_after}` for
    /// a blocklisted client, `{limit}` without a quota) is empty, or `null` outside a string
    /// of a JSON template (`"retry_after": {retry_after}` stays JSON).
    pub body: Option<String>,
    /// `RateLimit` and `RateLimit-Policy` on every response whose verdict reports a quota (see
    /// [`Verdict::quotas`]); monitor rules, the blocklist, bans, a rule of limit 0 and a rule
    /// the request has no key for report none.
    pub ietf_headers: bool,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` as well.
    pub legacy_headers: bool,
    /// AspNetCoreRateLimit's own quota headers on admitted responses, as it sends them: of the
    /// matched rules, the one with the longest period gives `X-Rate-Limit-Limit` (that period,
    /// in its largest whole unit: `1s`, `15m`, `12h`, `7d`), `X-Rate-Limit-Remaining` (requests
    /// left in its window) and `X-Rate-Limit-Reset` (when its window ends: UTC, ISO 8601 with
    /// seven decimals as .NET's round-trip format writes it, `2026-11-29T14:03:00.0000000Z`).
    /// Rejections do not carry them (there they carry `Retry-After` alone). Off by default;
    /// [`HttpConfig::from_aspnet_json`](crate::http::HttpConfig::from_aspnet_json) turns it on
    /// unless the document sets `DisableRateLimitHeaders`, so clients that read these headers
    /// keep working after a migration.
    pub aspnet_headers: bool,
    /// `Retry-After` on rejections that say when to retry (true by default).
    /// AspNetCoreRateLimit sends it only with its quota headers, so its translation turns it
    /// off with `DisableRateLimitHeaders`.
    pub retry_after_header: bool,
    /// Reject gRPC requests (`content-type` `application/grpc` or `application/grpc+proto`, ...,
    /// and gRPC-Web's `application/grpc-web...`) with a gRPC status (trailers-only: HTTP 200,
    /// `grpc-status`, `grpc-message`) instead of `status` and a body, so that gRPC clients see
    /// `RESOURCE_EXHAUSTED` rather than a protocol error. `true` by default (`grpc = false` in
    /// `[response]` turns it off); see
    /// [`grpc_rejection_response`](crate::http::grpc_rejection_response) for the codes.
    pub grpc: bool,
}

impl Default for ResponseConfig {
    fn default() -> Self {
        ResponseConfig {
            status: 429,
            no_key_status: 400,
            unavailable_status: 503,
            content_type: None,
            body: None,
            ietf_headers: true,
            legacy_headers: false,
            aspnet_headers: false,
            retry_after_header: true,
            grpc: true,
        }
    }
}

/// A [`ResponseConfig`] that cannot be used.
///
/// # Examples
///
/// ```
/// use turnstile::http::{ResponseConfig, ResponseConfigError};
///
/// let mut config = ResponseConfig::default();
/// config.status = 1000;
/// assert!(matches!(config.validate(), Err(ResponseConfigError::InvalidStatus { field: "status", .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseConfigError {
    /// A status that is not an error status (`400..=599`): a rejection answered 1xx, 2xx or
    /// 3xx would tell the client, and any proxy, something else than "not served" (`101`
    /// switches protocols, `204` and `304` must carry no body).
    InvalidStatus {
        /// The field: `status`, `no_key_status` or `unavailable_status`.
        field: &'static str,
        /// The configured value.
        status: u16,
    },
    /// The content type is not a valid header value, or is blank.
    InvalidContentType(String),
}

impl fmt::Display for ResponseConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseConfigError::InvalidStatus { field, status } => {
                write!(
                    f,
                    "{field}: {status} is not an error status (a rejection needs 400..=599)"
                )
            }
            ResponseConfigError::InvalidContentType(value) => {
                write!(
                    f,
                    "content_type: {value:?} is not a content type (a header value, not blank; \
                     leave it out for the body's default)"
                )
            }
        }
    }
}

impl std::error::Error for ResponseConfigError {}

impl ResponseConfig {
    /// Checks that the statuses are error statuses (`400..=599`) and the content type is a
    /// header value, not blank. At request time an invalid status is replaced by 429 and an
    /// invalid or blank content type by the body's default (`application/problem+json` for the built-in body,
    /// `text/plain; charset=utf-8` for a `body` template), never a panic.
    ///
    /// # Errors
    ///
    /// [`ResponseConfigError`], naming the field.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::ResponseConfig;
    ///
    /// assert!(ResponseConfig::default().validate().is_ok());
    /// let mut config = ResponseConfig::default();
    /// config.no_key_status = 42;
    /// assert!(config.validate().unwrap_err().to_string().contains("no_key_status"));
    /// ```
    pub fn validate(&self) -> Result<(), ResponseConfigError> {
        for (field, status) in [
            ("status", self.status),
            ("no_key_status", self.no_key_status),
            ("unavailable_status", self.unavailable_status),
        ] {
            if !is_error_status(status) {
                return Err(ResponseConfigError::InvalidStatus { field, status });
            }
        }
        if let Some(content_type) = &self.content_type
            && (content_type.trim().is_empty() || HeaderValue::from_str(content_type).is_err())
        {
            return Err(ResponseConfigError::InvalidContentType(
                content_type.clone(),
            ));
        }
        Ok(())
    }
}

/// Whether `status` may answer a rejection: a client or server error.
pub(crate) fn is_error_status(status: u16) -> bool {
    (400..=599).contains(&status)
}

/// Whole seconds, rounded up: 300 ms is 1, exactly 2 s is 2, and only zero is 0.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::whole_seconds_up;
///
/// assert_eq!(whole_seconds_up(Duration::from_millis(300)), 1);
/// assert_eq!(whole_seconds_up(Duration::from_secs(2)), 2);
/// assert_eq!(whole_seconds_up(Duration::ZERO), 0);
/// ```
pub fn whole_seconds_up(duration: Duration) -> u64 {
    let secs = duration.as_secs();
    if duration.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

/// The seconds a rejection says to wait (`Retry-After`, the problem+json `retry_after`, a
/// template's `{retry_after}`, gRPC's `retry-after`): `wait` rounded up, at least 1 (a rejection
/// that says "retry after 0 seconds" invites a retry at once, which a policy returning a zero
/// wait would only reject again), and at most the largest sf-integer, 15 digits, as the
/// `RateLimit` field's `t` beside it must be. A longer wait (over 31 million years: a custom
/// `Policy`'s or `ConcurrencyLayer::retry_after`'s `Duration::MAX`; the engine's longest ban
/// is about 146 years) written in full is `u64::MAX`, 20 digits, past the signed 64-bit
/// integers many clients parse `Retry-After` into; those then take it as absent and retry on
/// their own backoff.
pub(crate) fn retry_seconds(wait: Duration) -> u64 {
    whole_seconds_up(wait).clamp(1, SF_INTEGER_MAX)
}

/// The seconds until `quota` resets as the `RateLimit` field's `t` and `X-RateLimit-Reset` say
/// them: its `reset_after` rounded up, at most the largest sf-integer (as [`retry_seconds`]),
/// and at least 1 when nothing remains. A rejection's quota
/// resets after its retry-after, which is 0 when the permit the request found is about to go to
/// a request queued before it (see `RateLimiter::try_acquire_n`): `Retry-After` says 1 then,
/// as it never says 0, and `t=0` beside it would both disagree and invite a retry at once.
pub(crate) fn reset_seconds(quota: &QuotaState) -> u64 {
    let secs = whole_seconds_up(quota.reset_after).min(SF_INTEGER_MAX);
    if quota.remaining == 0 {
        secs.max(1)
    } else {
        secs
    }
}

/// Appends `name` to `out` as a structured-field string (RFC 8941): quoted, with `"` and `\`
/// escaped. The bytes an sf-string cannot hold (controls, non-ASCII) are percent-encoded
/// (`é` is `%C3%A9`), and so is `%` itself (`%25`): every name is written distinctly, where a
/// placeholder such as `?` would make `é` and `è` one policy to a client.
fn push_sf_string(out: &mut Sink, name: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push(b'"');
    for &b in name.as_bytes() {
        match b {
            b'"' | b'\\' => out.put(&[b'\\', b]),
            b'%' => out.put(b"%25"),
            // Printable ASCII: one byte.
            b' '..=b'~' => out.push(b),
            _ => out.put(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]),
        }
    }
    out.push(b'"');
}

/// Appends `;{key}={value}` to `out`, the value capped at the largest sf-integer. Formatted with
/// `itoa` rather than `fmt::Write`: these values are written for every response.
fn push_param(out: &mut Sink, key: u8, value: u64) {
    out.put(&[b';', key, b'=']);
    out.put(
        itoa::Buffer::new()
            .format(value.min(SF_INTEGER_MAX))
            .as_bytes(),
    );
}

/// Where a header value is written: first counted, then written into a buffer of exactly that
/// size, which becomes the value's bytes without a copy or a second allocation.
enum Sink {
    Count(usize),
    Write(Vec<u8>),
}

impl Sink {
    fn push(&mut self, byte: u8) {
        match self {
            Sink::Count(n) => *n += 1,
            Sink::Write(out) => out.push(byte),
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        match self {
            Sink::Count(n) => *n += bytes.len(),
            Sink::Write(out) => out.extend_from_slice(bytes),
        }
    }
}

/// The `RateLimit-Policy` field value for `quotas`: `"per-ip";q=100;w=60`, one list member per
/// quota, comma-separated. `None` when `quotas` is empty.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{ratelimit_policy_value, QuotaState};
///
/// let quota = QuotaState {
///     policy: "per-ip".into(),
///     limit: 100,
///     window: Duration::from_secs(60),
///     remaining: 42,
///     reset_after: Duration::from_millis(16_200),
/// };
/// assert_eq!(ratelimit_policy_value(&[quota]).unwrap(), r#""per-ip";q=100;w=60"#);
/// ```
pub fn ratelimit_policy_value(quotas: &[QuotaState]) -> Option<HeaderValue> {
    list_value(quotas, |quota| {
        [(b'q', quota.limit), (b'w', whole_seconds_up(quota.window))]
    })
}

/// The `RateLimit` field value for `quotas`: `"per-ip";r=42;t=17` (remaining, and seconds until
/// reset rounded up, and at least 1 when nothing remains, as `Retry-After` never says 0).
/// `None` when `quotas` is empty.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{ratelimit_value, QuotaState};
///
/// let quota = QuotaState {
///     policy: "per-ip".into(),
///     limit: 100,
///     window: Duration::from_secs(60),
///     remaining: 42,
///     reset_after: Duration::from_millis(16_200),
/// };
/// assert_eq!(ratelimit_value(&[quota]).unwrap(), r#""per-ip";r=42;t=17"#);
/// ```
pub fn ratelimit_value(quotas: &[QuotaState]) -> Option<HeaderValue> {
    list_value(quotas, |quota| {
        [(b'r', quota.remaining), (b't', reset_seconds(quota))]
    })
}

/// The largest structured-field integer (15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// The common case of [`list_value`]: one quota whose name needs no escaping, written in one go.
/// `params` are the two parameters (key and value). `None` when the name needs escaping,
/// `%` included (see [`push_sf_string`]: written as it is, a name `%C3%A9` would read as the
/// encoding of `é`).
fn single_value(quota: &QuotaState, params: [(u8, u64); 2]) -> Option<HeaderValue> {
    let name = quota.policy.as_bytes();
    if !name
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && !matches!(b, b'"' | b'\\' | b'%'))
    {
        return None;
    }
    let mut first = itoa::Buffer::new();
    let first = first.format(params[0].1.min(SF_INTEGER_MAX)).as_bytes();
    let mut second = itoa::Buffer::new();
    let second = second.format(params[1].1.min(SF_INTEGER_MAX)).as_bytes();
    let mut out = Vec::with_capacity(name.len() + 8 + first.len() + second.len());
    out.push(b'"');
    out.extend_from_slice(name);
    out.extend_from_slice(&[b'"', b';', params[0].0, b'=']);
    out.extend_from_slice(first);
    out.extend_from_slice(&[b';', params[1].0, b'=']);
    out.extend_from_slice(second);
    HeaderValue::from_maybe_shared(Bytes::from(out)).ok()
}

fn list_value(
    quotas: &[QuotaState],
    params_of: impl Fn(&QuotaState) -> [(u8, u64); 2],
) -> Option<HeaderValue> {
    let params = |out: &mut Sink, quota: &QuotaState| {
        for (key, value) in params_of(quota) {
            push_param(out, key, value);
        }
    };
    if quotas.is_empty() {
        return None;
    }
    if let [quota] = quotas
        && let Some(value) = single_value(quota, params_of(quota))
    {
        return Some(value);
    }
    let write = |out: &mut Sink| {
        for (i, quota) in quotas.iter().enumerate() {
            if i > 0 {
                out.put(b", ");
            }
            push_sf_string(out, &quota.policy);
            params(out, quota);
        }
    };
    let mut count = Sink::Count(0);
    write(&mut count);
    let Sink::Count(len) = count else {
        return None;
    };
    let mut out = Sink::Write(Vec::with_capacity(len));
    write(&mut out);
    let Sink::Write(out) = out else {
        return None;
    };
    // A vector as long as its capacity becomes `Bytes` without another allocation. Only
    // printable ASCII was written, so the value is valid; stay panic-free regardless.
    HeaderValue::from_maybe_shared(Bytes::from(out)).ok()
}

/// One key and its value, or nothing yet.
type Memo<K, V> = RefCell<Option<(K, V)>>;
type Slot<K, V> = std::thread::LocalKey<Memo<K, V>>;

/// A one-entry cache per thread: the value of the last key `hit` accepts, or `make`'s (which is
/// then remembered). The values cached here are header values and bodies that stay the same
/// for many responses in a row (a rule's policy; a rejection's, until the next second), and a
/// thread serves the same few rules over and over: a hit saves formatting and allocating. A
/// cached value is a `Bytes` made on this thread, so cloning it touches no other core's cache
/// line. Keys hold the rule's `Arc`, so its address is not reused by another name meanwhile.
fn memo<K: 'static, V: Clone + 'static>(
    slot: &'static Slot<K, V>,
    hit: impl Fn(&K) -> bool,
    make: impl FnOnce() -> Option<(K, V)>,
) -> Option<V> {
    let mut make = Some(make);
    let cached = slot.try_with(|cell| {
        let mut last = cell.try_borrow_mut().ok()?;
        if let Some((key, value)) = &*last
            && hit(key)
        {
            return Some(value.clone());
        }
        let (key, value) = make.take()?()?;
        *last = Some((key, value.clone()));
        Some(value)
    });
    match (cached, make) {
        (Ok(Some(value)), _) => Some(value),
        // The thread is exiting, or `make` gave nothing: no cache.
        (_, Some(make)) => make().map(|(_, value)| value),
        (_, None) => None,
    }
}

thread_local! {
    /// The last single-quota `RateLimit-Policy` value: policy, limit, window.
    static LAST_POLICY: Memo<(Arc<str>, u64, Duration), HeaderValue> =
        const { RefCell::new(None) };
    /// The last single-quota `RateLimit` value with nothing remaining (a rejection's): policy,
    /// seconds to reset.
    static LAST_EXHAUSTED: Memo<(Arc<str>, u64), HeaderValue> = const { RefCell::new(None) };
    /// The last `Retry-After` value over a minute.
    static LAST_RETRY_AFTER: Memo<u64, HeaderValue> = const { RefCell::new(None) };
    /// The last problem+json rejection body: reason, rule, retry-after seconds, status.
    static LAST_PROBLEM: Memo<(RejectReason, Arc<str>, Option<u64>, u16), Bytes> =
        const { RefCell::new(None) };
}

/// [`ratelimit_policy_value`], from the thread's cache when `quotas` is the one quota it last
/// wrote the value of.
fn cached_policy_value(quotas: &[QuotaState]) -> Option<HeaderValue> {
    let [quota] = quotas else {
        return ratelimit_policy_value(quotas);
    };
    memo(
        &LAST_POLICY,
        |(policy, limit, window)| {
            Arc::ptr_eq(policy, &quota.policy) && *limit == quota.limit && *window == quota.window
        },
        || {
            let value = ratelimit_policy_value(quotas)?;
            Some(((quota.policy.clone(), quota.limit, quota.window), value))
        },
    )
}

/// A `Retry-After` value: the small ones (seconds up to 60, as rejections within a minute's
/// window give) without formatting or allocating.
pub(crate) fn retry_after_value(secs: u64) -> HeaderValue {
    const SMALL: [&str; 61] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
        "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31",
        "32", "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46",
        "47", "48", "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60",
    ];
    match usize::try_from(secs).ok().and_then(|i| SMALL.get(i)) {
        Some(text) => HeaderValue::from_static(text),
        // Longer waits (a rule of an hour or a day, a ban) repeat for a second at a time.
        None => memo(
            &LAST_RETRY_AFTER,
            |last| *last == secs,
            || Some((secs, HeaderValue::from(secs))),
        )
        .unwrap_or_else(|| HeaderValue::from(secs)),
    }
}

/// [`ratelimit_value`], from the thread's cache for a single exhausted quota (every rejection
/// by one rule within a second has the same value). Values with permits remaining change with
/// every request and are not cached.
fn cached_ratelimit_value(quotas: &[QuotaState]) -> Option<HeaderValue> {
    let [quota] = quotas else {
        return ratelimit_value(quotas);
    };
    if quota.remaining > 0 {
        return ratelimit_value(quotas);
    }
    let reset = reset_seconds(quota);
    memo(
        &LAST_EXHAUSTED,
        |(policy, secs)| Arc::ptr_eq(policy, &quota.policy) && *secs == reset,
        || {
            let value = ratelimit_value(quotas)?;
            Some(((quota.policy.clone(), reset), value))
        },
    )
}

/// The most restrictive quota: the fewest remaining, and of those the longest to reset.
fn most_restrictive(quotas: &[QuotaState]) -> Option<&QuotaState> {
    quotas.iter().min_by(|a, b| {
        a.remaining
            .cmp(&b.remaining)
            .then(b.reset_after.cmp(&a.reset_after))
    })
}

/// Adds the quota headers `config` asks for to `headers`: `RateLimit-Policy` and `RateLimit`
/// (when `ietf_headers`), and `X-RateLimit-Limit`, `-Remaining` and `-Reset` (seconds, rounded
/// up) of the most restrictive quota (when `legacy_headers`), and AspNetCoreRateLimit's
/// `X-Rate-Limit-*` of the longest window (when `aspnet_headers`; for an admitted response, as
/// there: a rejection built by [`rejection_response`] leaves them out). Nothing when `quotas` is
/// empty.
///
/// Headers already there (a layer inside this one) are kept: `RateLimit-Policy` and
/// `RateLimit` lines are appended (lists, so the response lists both layers' policies), and
/// the `X-RateLimit-*` trio is replaced only by a more restrictive quota: fewer requests
/// remaining, or as many and a later reset (the rule that picks among one layer's quotas).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{insert_quota_headers, QuotaState, ResponseConfig};
///
/// let quota = QuotaState {
///     policy: "per-ip".into(),
///     limit: 10,
///     window: Duration::from_secs(1),
///     remaining: 3,
///     reset_after: Duration::from_millis(500),
/// };
/// let mut headers = http::HeaderMap::new();
/// insert_quota_headers(&mut headers, &[quota], &ResponseConfig::default());
/// assert_eq!(headers["ratelimit"], r#""per-ip";r=3;t=1"#);
/// ```
pub fn insert_quota_headers(
    headers: &mut HeaderMap,
    quotas: &[QuotaState],
    config: &ResponseConfig,
) {
    QuotaHeaders::of(config).insert(headers, quotas);
}

static PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

// Built at compile time: `from_static` looks the name up among the standard ones.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const X_RATE_LIMIT_LIMIT: HeaderName = HeaderName::from_static("x-rate-limit-limit");
const X_RATE_LIMIT_REMAINING: HeaderName = HeaderName::from_static("x-rate-limit-remaining");
const X_RATE_LIMIT_RESET: HeaderName = HeaderName::from_static("x-rate-limit-reset");

/// Which quota headers responses carry: the flags of a [`ResponseConfig`], copied so that an
/// admitted request's response future holds three bools rather than the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuotaHeaders {
    ietf: bool,
    legacy: bool,
    aspnet: bool,
}

impl QuotaHeaders {
    /// The headers of an admitted response.
    pub(crate) fn of(config: &ResponseConfig) -> Self {
        QuotaHeaders {
            ietf: config.ietf_headers,
            legacy: config.legacy_headers,
            aspnet: config.aspnet_headers,
        }
    }

    /// The headers of a rejection: AspNetCoreRateLimit sends its own on admitted responses only.
    pub(crate) fn of_rejection(config: &ResponseConfig) -> Self {
        QuotaHeaders {
            aspnet: false,
            ..QuotaHeaders::of(config)
        }
    }

    /// See [`insert_quota_headers`].
    pub(crate) fn insert(self, headers: &mut HeaderMap, quotas: &[QuotaState]) {
        if quotas.is_empty() || !(self.ietf || self.legacy || self.aspnet) {
            return;
        }
        if self.aspnet {
            insert_aspnet_headers(headers, quotas);
        }
        // One growth for all of them rather than one per insert.
        headers.reserve(usize::from(self.ietf) * 2 + usize::from(self.legacy) * 3);
        // Appended, not inserted: both fields are structured-field lists, and two field lines
        // of a list are one list (RFC 9110 5.3), so the policies of a layer inside this one
        // (a route's beside the router's) stay listed beside ours instead of being replaced.
        if self.ietf {
            if let Some(value) = cached_policy_value(quotas) {
                headers.append(RATELIMIT_POLICY, value);
            }
            if let Some(value) = cached_ratelimit_value(quotas) {
                headers.append(RATELIMIT, value);
            }
        }
        if self.legacy {
            // One quota only: the most restrictive of ours and the one already there, by
            // `most_restrictive`'s rule (the fewest remaining, then the longest to reset).
            let number = |name| {
                headers
                    .get(name)
                    .and_then(|v: &HeaderValue| v.to_str().ok()?.parse::<u64>().ok())
            };
            let already = number(X_RATELIMIT_REMAINING);
            if let Some(quota) = most_restrictive(quotas) {
                let reset = reset_seconds(quota);
                let replace = match already {
                    None => true,
                    Some(already) if quota.remaining == already => {
                        number(X_RATELIMIT_RESET).is_none_or(|already| reset > already)
                    }
                    Some(already) => quota.remaining < already,
                };
                if replace {
                    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(quota.limit));
                    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(quota.remaining));
                    headers.insert(X_RATELIMIT_RESET, HeaderValue::from(reset));
                }
            }
        }
    }
}

/// AspNetCoreRateLimit's `X-Rate-Limit-*` headers for the quota of the longest window (see
/// [`ResponseConfig::aspnet_headers`]), unless headers already there (a layer inside this one)
/// are for a window as long or longer: the longest of every layer's, as AspNetCoreRateLimit
/// picks among its rules.
fn insert_aspnet_headers(headers: &mut HeaderMap, quotas: &[QuotaState]) {
    let Some(quota) = quotas.iter().max_by(|a, b| {
        // Of equal windows, the one with the fewest remaining.
        a.window.cmp(&b.window).then(b.remaining.cmp(&a.remaining))
    }) else {
        return;
    };
    let theirs = headers
        .get(X_RATE_LIMIT_LIMIT)
        .and_then(|v| humantime::parse_duration(v.to_str().ok()?).ok());
    if theirs.is_some_and(|theirs| theirs >= quota.window) {
        return;
    }
    let period = compact_period(quota.window);
    // The period is ASCII digits and a unit (or humantime's words and spaces): a valid value.
    if let Ok(period) = HeaderValue::from_str(&period) {
        headers.insert(X_RATE_LIMIT_LIMIT, period);
    }
    headers.insert(X_RATE_LIMIT_REMAINING, HeaderValue::from(quota.remaining));
    let reset = std::time::SystemTime::now().checked_add(quota.reset_after);
    headers.insert(X_RATE_LIMIT_RESET, dotnet_round_trip(reset));
}

/// The latest time .NET's `DateTime` holds, 9999-12-31T23:59:59.9999999Z, in seconds since the
/// Unix epoch (its whole seconds).
const DOTNET_MAX_SECS: u64 = 253_402_300_799;

/// `at` (UTC) as .NET's round-trip format `o` writes a UTC `DateTime`:
/// `yyyy-MM-ddTHH:mm:ss.fffffffZ`, seven decimals (its 100 ns ticks, truncated). A time past
/// `DateTime.MaxValue` (or none: past `SystemTime`'s range) is written as that maximum, a time
/// before the Unix epoch (a clock set far back) as the epoch.
fn dotnet_round_trip(at: Option<std::time::SystemTime>) -> HeaderValue {
    const MAX: &str = "9999-12-31T23:59:59.9999999Z";
    let since_epoch = match at.map(|at| at.duration_since(std::time::UNIX_EPOCH)) {
        Some(Ok(d)) if d.as_secs() <= DOTNET_MAX_SECS => d,
        Some(Err(_)) => Duration::ZERO,
        _ => return HeaderValue::from_static(MAX),
    };
    // humantime writes nine decimals, always: keep seven.
    let mut text = humantime::format_rfc3339_nanos(std::time::UNIX_EPOCH + since_epoch).to_string();
    // "…ss.nnnnnnnnnZ": drop the last two digits before the `Z`.
    let z = text.len() - 1;
    text.replace_range(z - 2..z, "");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(MAX))
}

/// Appends `text` to `out` as the inside of a JSON string (RFC 8259): `"`, `\\` and control
/// characters escaped (the short forms where JSON has them), everything else as it is.
fn push_json_chars(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    if !bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\') {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let short = match byte {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            0x00..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.extend_from_slice(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0xf)]]);
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// The problem+json document of a rejection (RFC 9457): `detail`, `retry_after`, `rule`,
/// `status`, `title` and `type`, in that (alphabetical) order. Written straight into one buffer
/// rather than through a serializer: it is built for every rejected request, which should cost
/// less than an admitted one.
fn problem_json(
    reason: RejectReason,
    rule: &str,
    retry_secs: Option<u64>,
    status: StatusCode,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(176 + 2 * rule.len());
    out.extend_from_slice(b"{\"detail\":\"");
    out.extend_from_slice(reason.as_str().as_bytes());
    out.extend_from_slice(b" by rule ");
    push_json_chars(&mut out, rule);
    let mut secs_buffer = itoa::Buffer::new();
    let secs = retry_secs.map(|secs| secs_buffer.format(secs).as_bytes());
    if let Some(secs) = secs {
        out.extend_from_slice(b"; retry after ");
        out.extend_from_slice(secs);
        out.extend_from_slice(b" s");
    }
    out.extend_from_slice(b"\",\"retry_after\":");
    out.extend_from_slice(secs.unwrap_or(b"null"));
    out.extend_from_slice(b",\"rule\":\"");
    push_json_chars(&mut out, rule);
    out.extend_from_slice(b"\",\"status\":");
    out.extend_from_slice(itoa::Buffer::new().format(status.as_u16()).as_bytes());
    out.extend_from_slice(b",\"title\":\"");
    push_json_chars(
        &mut out,
        status.canonical_reason().unwrap_or("Request Rejected"),
    );
    out.extend_from_slice(b"\",\"type\":\"about:blank\"}");
    out
}

/// `content_type` as a header value: the common ones without an allocation, `fallback` when it
/// is not set, blank, or not a valid header value.
fn content_type_value(content_type: Option<&str>, fallback: &HeaderValue) -> HeaderValue {
    let Some(content_type) = content_type.filter(|c| !c.trim().is_empty()) else {
        return fallback.clone();
    };
    // A static, not a constant: a constant array is built (and its unused values dropped) at
    // every use. `from_static` checks its bytes, here once at compile time.
    static KNOWN: [(&str, HeaderValue); 3] = [
        (
            "application/problem+json",
            HeaderValue::from_static("application/problem+json"),
        ),
        (
            "application/json",
            HeaderValue::from_static("application/json"),
        ),
        (
            "text/plain; charset=utf-8",
            HeaderValue::from_static("text/plain; charset=utf-8"),
        ),
    ];
    match KNOWN.iter().find(|(known, _)| *known == content_type) {
        Some((_, value)) => value.clone(),
        None => HeaderValue::from_str(content_type).unwrap_or_else(|_| fallback.clone()),
    }
}

/// The response to a rejected request: the configured status (`no_key_status` for
/// [`RejectReason::NoKey`], `unavailable_status` for [`RejectReason::Unavailable`]), `Retry-After` when the verdict says when to retry, the quota
/// headers, and the body (a problem+json document, or the configured template). `None` when the
/// verdict admits the request.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{rejection_response, Outcome, Quotas, RejectReason, ResponseConfig, Verdict};
///
/// let verdict = Verdict {
///     outcome: Outcome::Rejected {
///         reason: RejectReason::RateLimited,
///         rule: "per-ip".into(),
///         retry_after: Some(Duration::from_millis(300)),
///     },
///     quotas: Quotas::new(),
/// };
/// let response = rejection_response(&verdict, &ResponseConfig::default()).unwrap();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "1");
/// ```
pub fn rejection_response(
    verdict: &Verdict,
    config: &ResponseConfig,
) -> Option<http::Response<Bytes>> {
    let rejection = Rejection::of(verdict)?;
    let (reason, rule, retry_secs) = (&rejection.reason, rejection.rule, rejection.retry_secs);
    let configured = match reason {
        RejectReason::NoKey => config.no_key_status,
        RejectReason::Unavailable => config.unavailable_status,
        _ => config.status,
    };
    let status = if is_error_status(configured) {
        StatusCode::from_u16(configured).unwrap_or(StatusCode::TOO_MANY_REQUESTS)
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };

    let (body, content_type) = match &config.body {
        Some(template) => (
            Bytes::from(rejection.render(template, config.content_type.as_deref())),
            content_type_value(config.content_type.as_deref(), &TEXT_PLAIN),
        ),
        None => (
            memo(
                &LAST_PROBLEM,
                |(r, name, secs, code)| {
                    *r == *reason
                        && Arc::ptr_eq(name, rule)
                        && *secs == retry_secs
                        && *code == status.as_u16()
                },
                || {
                    let body = problem_json(*reason, rule, retry_secs, status);
                    Some((
                        (*reason, rule.clone(), retry_secs, status.as_u16()),
                        Bytes::from(body),
                    ))
                },
            )
            .unwrap_or_default(),
            content_type_value(config.content_type.as_deref(), &PROBLEM_JSON),
        ),
    };

    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type);
    if let Some(secs) = retry_secs.filter(|_| config.retry_after_header) {
        headers.insert(RETRY_AFTER, retry_after_value(secs));
    }
    QuotaHeaders::of_rejection(config).insert(headers, &verdict.quotas);
    Some(response)
}

/// What a rejecting verdict says, for the HTTP and the gRPC answers alike.
pub(crate) struct Rejection<'a> {
    pub(crate) reason: RejectReason,
    pub(crate) rule: &'a Arc<str>,
    /// The retry-after in whole seconds, rounded up, at least 1 and at most 15 digits (see
    /// [`retry_seconds`]).
    pub(crate) retry_secs: Option<u64>,
    quotas: &'a [QuotaState],
}

impl<'a> Rejection<'a> {
    /// `None` when the verdict admits.
    pub(crate) fn of(verdict: &'a Verdict) -> Option<Self> {
        let Outcome::Rejected {
            reason,
            rule,
            retry_after,
        } = &verdict.outcome
        else {
            return None;
        };
        Some(Rejection {
            reason: *reason,
            rule,
            // At least 1, at most 15 digits: see `retry_seconds`.
            retry_secs: retry_after.map(retry_seconds),
            quotas: &verdict.quotas,
        })
    }

    /// `template` rendered for this rejection, with the rejecting rule's quota (or the most
    /// restrictive one) for `{limit}` and `{period}`, the values escaped for `content_type`
    /// (see [`ResponseConfig::body`]).
    pub(crate) fn render(&self, template: &str, content_type: Option<&str>) -> String {
        let quota = self
            .quotas
            .iter()
            .find(|q| q.policy == *self.rule)
            .or_else(|| most_restrictive(self.quotas));
        let escape = Escape::for_content_type(content_type);
        render_template(
            template,
            escape,
            self.reason,
            self.rule,
            quota,
            self.retry_secs,
        )
    }

    /// The default message: `rate limited by rule per-ip; retry after 1 s` (the problem+json
    /// `detail`).
    pub(crate) fn detail(&self) -> String {
        let mut detail = format!("{} by rule {}", self.reason, self.rule);
        if let Some(secs) = self.retry_secs {
            let _ = write!(detail, "; retry after {secs} s");
        }
        detail
    }
}

/// How a template's values are written into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    /// As they are (plain text, or a content type this crate does not know).
    None,
    /// As the inside of a JSON string.
    Json,
    /// With HTML's five special characters as entities.
    Html,
}

impl Escape {
    /// The escaping a body of `content_type` needs: its media type (parameters and case
    /// ignored) `application/json` or any `+json` type is JSON, `text/html` HTML.
    fn for_content_type(content_type: Option<&str>) -> Escape {
        let Some(content_type) = content_type else {
            return Escape::None;
        };
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        if essence == "application/json" || essence.ends_with("+json") {
            Escape::Json
        } else if essence == "text/html" {
            Escape::Html
        } else {
            Escape::None
        }
    }

    /// Appends `value` to `out`, escaped.
    fn push(self, out: &mut String, value: &str) {
        match self {
            Escape::None => out.push_str(value),
            Escape::Json => {
                for c in value.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        '\r' => out.push_str("\\r"),
                        '\t' => out.push_str("\\t"),
                        c if u32::from(c) < 0x20 => {
                            let _ = write!(out, "\\u{:04x}", u32::from(c));
                        }
                        c => out.push(c),
                    }
                }
            }
            Escape::Html => {
                for c in value.chars() {
                    match c {
                        '&' => out.push_str("&amp;"),
                        '<' => out.push_str("&lt;"),
                        '>' => out.push_str("&gt;"),
                        '"' => out.push_str("&quot;"),
                        '\'' => out.push_str("&#39;"),
                        c => out.push(c),
                    }
                }
            }
        }
    }
}

/// Where a JSON template's text stands: inside a string or not (an absent value is `null`
/// outside one: `"retry_after": {retry_after}` must stay a document when there is none).
#[derive(Default)]
struct JsonPosition {
    in_string: bool,
    escaped: bool,
}

impl JsonPosition {
    /// Moves past `text`, a piece of the template as written.
    fn pass(&mut self, text: &str) {
        for byte in text.bytes() {
            if !self.in_string {
                self.in_string = byte == b'"';
            } else if self.escaped {
                self.escaped = false;
            } else if byte == b'\\' {
                self.escaped = true;
            } else if byte == b'"' {
                self.in_string = false;
            }
        }
    }
}

/// `window` in its largest whole unit among `d`, `h`, `m`, `s` and `ms` (`1d`, `15m`, `90s`),
/// the way periods are written in configurations (and in AspNetCoreRateLimit's messages),
/// rather than humantime's `1day`. A window of no whole milliseconds is written by humantime.
pub(crate) fn compact_period(window: Duration) -> String {
    let millis = window.as_millis();
    if !window.subsec_nanos().is_multiple_of(1_000_000) || millis == 0 {
        return humantime::format_duration(window).to_string();
    }
    let (per, unit) = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ]
    .into_iter()
    .find(|(per, _)| millis.is_multiple_of(*per))
    .unwrap_or((1, "ms"));
    format!("{}{unit}", millis / per)
}

fn render_template(
    template: &str,
    escape: Escape,
    reason: RejectReason,
    rule: &str,
    quota: Option<&QuotaState>,
    retry_secs: Option<u64>,
) -> String {
    let limit = quota.map(|q| q.limit.to_string());
    let period = quota.map(|q| compact_period(q.window));
    let retry = retry_secs.map(|s| s.to_string());
    let reason = reason.to_string();
    let mut out = String::with_capacity(template.len());
    let mut json = JsonPosition::default();
    let mut rest = template;
    // One pass, so that a replaced value containing `{rule}` is not replaced again.
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        json.pass(&rest[..start]);
        let after = &rest[start..];
        if let Some(after_escape) = after.strip_prefix("{{") {
            out.push('{');
            json.pass("{");
            rest = after_escape;
            continue;
        }
        let replaced = [
            ("{rule}", Some(rule)),
            ("{limit}", limit.as_deref()),
            ("{period}", period.as_deref()),
            ("{retry_after}", retry.as_deref()),
            ("{reason}", Some(reason.as_str())),
        ]
        .into_iter()
        .find(|(key, _)| after.starts_with(key));
        match replaced {
            Some((key, value)) => {
                match value {
                    Some(value) => escape.push(&mut out, value),
                    // Nothing in a string or in text; a JSON value where one is expected.
                    None if escape == Escape::Json && !json.in_string => out.push_str("null"),
                    None => {}
                }
                rest = &after[key.len()..];
            }
            None => {
                out.push('{');
                json.pass("{");
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Quotas;

    fn quota(policy: &str, remaining: u64, reset_ms: u64) -> QuotaState {
        QuotaState {
            policy: policy.into(),
            limit: 100,
            window: Duration::from_secs(60),
            remaining,
            reset_after: Duration::from_millis(reset_ms),
        }
    }

    fn rejected(reason: RejectReason, retry: Option<Duration>, quotas: Vec<QuotaState>) -> Verdict {
        Verdict {
            outcome: Outcome::Rejected {
                reason,
                rule: "per-ip".into(),
                retry_after: retry,
            },
            quotas: quotas.into(),
        }
    }

    /// A `body` template is plain text unless `content_type` says otherwise; the built-in
    /// body is problem+json. A template sent as `application/problem+json` would be
    /// mislabelled for every client that trusts the header.
    #[test]
    fn content_type_follows_the_body() {
        let verdict = rejected(
            RejectReason::RateLimited,
            Some(Duration::from_secs(1)),
            vec![quota("per-ip", 0, 1_000)],
        );
        let content_type = |toml: &str| {
            let config: ResponseConfig = toml::from_str(toml).unwrap();
            let response = rejection_response(&verdict, &config).unwrap();
            response.headers()[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(content_type(""), "application/problem+json");
        assert_eq!(
            content_type("body = \"Slow down, {retry_after} s\""),
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            content_type("body = \"{{}}\"\ncontent_type = \"application/json\""),
            "application/json"
        );
        assert_eq!(
            content_type("content_type = \"application/vnd.api+json\""),
            "application/vnd.api+json"
        );
    }

    /// Two layers' headers on one response: the IETF lists carry both policies, the legacy
    /// trio the most restrictive quota.
    #[test]
    fn headers_of_stacked_layers_are_kept() {
        let config = ResponseConfig {
            legacy_headers: true,
            ..ResponseConfig::default()
        };
        let mut headers = HeaderMap::new();
        insert_quota_headers(&mut headers, &[quota("route", 3, 1_000)], &config);
        insert_quota_headers(&mut headers, &[quota("global", 40, 30_000)], &config);
        fn lines(headers: &HeaderMap, name: HeaderName) -> Vec<&str> {
            headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        }
        assert_eq!(
            lines(&headers, RATELIMIT),
            [r#""route";r=3;t=1"#, r#""global";r=40;t=30"#]
        );
        assert_eq!(lines(&headers, RATELIMIT_POLICY).len(), 2);
        assert_eq!(lines(&headers, X_RATELIMIT_REMAINING), ["3"]);
        assert_eq!(lines(&headers, X_RATELIMIT_RESET), ["1"]);
        // A tighter outer quota replaces the trio.
        insert_quota_headers(&mut headers, &[quota("tight", 1, 5_000)], &config);
        assert_eq!(lines(&headers, X_RATELIMIT_REMAINING), ["1"]);
        assert_eq!(lines(&headers, X_RATELIMIT_RESET), ["5"]);
        assert_eq!(lines(&headers, RATELIMIT).len(), 3);
    }

    /// Stacked layers report the most restrictive quota in the legacy trio by the same rule as
    /// one layer with both quotas: the fewest remaining, and of those the longest to reset. A
    /// tie on remaining kept the inner layer's shorter reset, so a client told "0 left, reset
    /// in 1 s" came back in a second to an outer quota exhausted for 30.
    #[test]
    fn stacked_layers_tie_on_remaining_by_the_longer_reset() {
        let config = ResponseConfig {
            legacy_headers: true,
            ietf_headers: false,
            ..ResponseConfig::default()
        };
        let one_layer = |quotas: &[QuotaState]| {
            let mut headers = HeaderMap::new();
            insert_quota_headers(&mut headers, quotas, &config);
            headers
        };
        let stacked = |inner: QuotaState, outer: QuotaState| {
            let mut headers = HeaderMap::new();
            insert_quota_headers(&mut headers, &[inner], &config);
            insert_quota_headers(&mut headers, &[outer], &config);
            headers
        };
        let short = QuotaState {
            limit: 5,
            ..quota("inner", 0, 1_000)
        };
        let long = QuotaState {
            limit: 7,
            ..quota("outer", 0, 30_000)
        };
        let want = one_layer(&[short.clone(), long.clone()]);
        assert_eq!(want[X_RATELIMIT_RESET], "30");
        assert_eq!(want[X_RATELIMIT_LIMIT], "7");
        for headers in [
            stacked(short.clone(), long.clone()),
            stacked(long.clone(), short.clone()),
        ] {
            for name in [X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET] {
                assert_eq!(headers[&name], want[&name], "{name}");
            }
        }
        // A tie on both keeps the inner layer's trio.
        let twin = QuotaState {
            limit: 9,
            ..quota("twin", 0, 30_000)
        };
        assert_eq!(stacked(long.clone(), twin)[X_RATELIMIT_LIMIT], "7");
    }

    #[test]
    fn rounding_up() {
        assert_eq!(whole_seconds_up(Duration::from_millis(300)), 1);
        assert_eq!(whole_seconds_up(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds_up(Duration::from_nanos(2_000_000_001)), 3);
        assert_eq!(whole_seconds_up(Duration::from_nanos(1)), 1);
        assert_eq!(whole_seconds_up(Duration::ZERO), 0);
        assert_eq!(whole_seconds_up(Duration::MAX), u64::MAX);
    }

    #[test]
    fn ietf_values() {
        let quotas = [quota("per-ip", 42, 16_200), quota(r#"a"b\c"#, 0, 0)];
        assert_eq!(
            ratelimit_policy_value(&quotas).unwrap(),
            r#""per-ip";q=100;w=60, "a\"b\\c";q=100;w=60"#
        );
        assert_eq!(
            ratelimit_value(&quotas).unwrap(),
            r#""per-ip";r=42;t=17, "a\"b\\c";r=0;t=1"#
        );
        assert_eq!(
            ratelimit_value(&[quota("é\n", 1, 1)]).unwrap(),
            r#""%C3%A9%0A";r=1;t=1"#
        );
        // Written distinctly: `è` is not `é`, and a `%` of the name is not an escape.
        assert_eq!(
            ratelimit_value(&[quota("è%C3%A9", 1, 1)]).unwrap(),
            r#""%C3%A8%25C3%25A9";r=1;t=1"#
        );
        assert!(ratelimit_value(&[]).is_none());
    }

    #[test]
    fn legacy_headers_most_restrictive() {
        let config = ResponseConfig {
            legacy_headers: true,
            ietf_headers: false,
            ..ResponseConfig::default()
        };
        let mut headers = HeaderMap::new();
        let quotas = [quota("a", 5, 1000), quota("b", 2, 100), quota("c", 2, 2500)];
        insert_quota_headers(&mut headers, &quotas, &config);
        assert_eq!(headers["x-ratelimit-remaining"], "2");
        assert_eq!(headers["x-ratelimit-reset"], "3");
        assert_eq!(headers["x-ratelimit-limit"], "100");
        assert!(headers.get("ratelimit").is_none());
    }

    #[test]
    fn aspnet_headers_are_the_longest_windows_on_admissions_only() {
        let config = ResponseConfig {
            aspnet_headers: true,
            ietf_headers: false,
            ..ResponseConfig::default()
        };
        let window = |q: QuotaState, secs| QuotaState {
            window: Duration::from_secs(secs),
            ..q
        };
        let quotas = [
            window(quota("a", 1, 1000), 1),
            window(quota("b", 90, 120_000), 900),
            window(quota("c", 80, 120_000), 900),
        ];
        let mut headers = HeaderMap::new();
        insert_quota_headers(&mut headers, &quotas, &config);
        // Of the two 15-minute windows, the one with fewer left.
        assert_eq!(headers["x-rate-limit-limit"], "15m");
        assert_eq!(headers["x-rate-limit-remaining"], "80");
        let reset = headers["x-rate-limit-reset"].to_str().unwrap();
        let reset = humantime::parse_rfc3339_weak(&reset[..reset.len() - 1]).unwrap();
        let ends_in = reset.duration_since(std::time::SystemTime::now()).unwrap();
        assert!(ends_in > Duration::from_secs(110) && ends_in <= Duration::from_secs(120));
        // A layer outside with a shorter window leaves them; one with a longer window replaces
        // them, as AspNetCoreRateLimit picks the longest period among its rules.
        insert_quota_headers(&mut headers, &[window(quota("d", 0, 500), 60)], &config);
        assert_eq!(headers["x-rate-limit-limit"], "15m");
        insert_quota_headers(&mut headers, &[window(quota("e", 7, 500), 86_400)], &config);
        assert_eq!(headers["x-rate-limit-limit"], "1d");
        assert_eq!(headers["x-rate-limit-remaining"], "7");
        assert!(headers.get("ratelimit").is_none());
        // A rejection carries `Retry-After` alone, as there.
        let verdict = rejected(
            RejectReason::RateLimited,
            Some(Duration::from_millis(1500)),
            vec![window(quota("a", 0, 1500), 1)],
        );
        let response = rejection_response(&verdict, &config).unwrap();
        assert_eq!(response.headers()["retry-after"], "2");
        assert!(response.headers().get("x-rate-limit-limit").is_none());
        let grpc = crate::http::grpc_rejection_response(&verdict, &config).unwrap();
        assert!(grpc.headers().get("x-rate-limit-limit").is_none());
    }

    #[test]
    fn dotnet_round_trip_has_seven_decimals_and_stays_in_dotnets_range() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let at = |secs, nanos| Some(UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(
            dotnet_round_trip(at(1, 123_456_789)),
            "1970-01-01T00:00:01.1234567Z"
        );
        assert_eq!(
            dotnet_round_trip(at(1_795_957_380, 0)),
            "2026-11-29T13:03:00.0000000Z"
        );
        let max = "9999-12-31T23:59:59.9999999Z";
        assert_eq!(dotnet_round_trip(None), max);
        assert_eq!(dotnet_round_trip(at(DOTNET_MAX_SECS, 999_999_999)), max);
        assert_eq!(
            dotnet_round_trip(at(DOTNET_MAX_SECS, 0)),
            "9999-12-31T23:59:59.0000000Z"
        );
        assert_eq!(dotnet_round_trip(at(DOTNET_MAX_SECS + 1, 0)), max);
        assert_eq!(
            dotnet_round_trip(UNIX_EPOCH.checked_sub(Duration::from_secs(1))),
            "1970-01-01T00:00:00.0000000Z"
        );
        // The longest wait a limiter reports, from now.
        let far = SystemTime::now().checked_add(Duration::from_nanos(u64::MAX));
        assert!(dotnet_round_trip(far).to_str().unwrap().starts_with("2"));
    }

    #[test]
    fn problem_json() {
        let verdict = rejected(
            RejectReason::RateLimited,
            Some(Duration::from_millis(1500)),
            vec![quota("per-ip", 0, 1500)],
        );
        let response = rejection_response(&verdict, &ResponseConfig::default()).unwrap();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        assert_eq!(response.headers()["ratelimit"], r#""per-ip";r=0;t=2"#);
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(body["type"], "about:blank");
        assert_eq!(body["title"], "Too Many Requests");
        assert_eq!(body["status"], 429);
        assert_eq!(body["rule"], "per-ip");
        assert_eq!(body["retry_after"], 2);
        assert!(body["detail"].as_str().unwrap().contains("per-ip"));
    }

    /// The document as a serializer writes it: `problem_json` must write the same bytes.
    #[derive(serde::Serialize)]
    struct Problem<'a> {
        detail: &'a str,
        retry_after: Option<u64>,
        rule: &'a str,
        status: u16,
        title: &'a str,
        #[serde(rename = "type")]
        kind: &'a str,
    }

    fn serialized(
        reason: RejectReason,
        rule: &str,
        secs: Option<u64>,
        status: StatusCode,
    ) -> Vec<u8> {
        let detail = match secs {
            Some(secs) => format!("{reason} by rule {rule}; retry after {secs} s"),
            None => format!("{reason} by rule {rule}"),
        };
        serde_json::to_vec(&Problem {
            detail: &detail,
            retry_after: secs,
            rule,
            status: status.as_u16(),
            title: status.canonical_reason().unwrap_or("Request Rejected"),
            kind: "about:blank",
        })
        .unwrap()
    }

    #[test]
    fn problem_json_is_what_a_serializer_writes() {
        for rule in [
            "per-ip",
            "",
            "quo\"te",
            "back\\slash",
            "ctl\u{1}\n\t\r\u{8}\u{c}\u{1f}",
            "ünï 𝄞",
        ] {
            for secs in [None, Some(0), Some(3_600)] {
                for status in [
                    StatusCode::TOO_MANY_REQUESTS,
                    StatusCode::from_u16(599).unwrap(),
                ] {
                    assert_eq!(
                        String::from_utf8(super::problem_json(
                            RejectReason::RateLimited,
                            rule,
                            secs,
                            status
                        ))
                        .unwrap(),
                        String::from_utf8(serialized(
                            RejectReason::RateLimited,
                            rule,
                            secs,
                            status
                        ))
                        .unwrap(),
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn problem_json_escapes_any_rule_name(rule in ".*", secs in proptest::option::of(0u64..u64::MAX)) {
            let status = StatusCode::TOO_MANY_REQUESTS;
            proptest::prop_assert_eq!(
                super::problem_json(RejectReason::Banned, &rule, secs, status),
                serialized(RejectReason::Banned, &rule, secs, status)
            );
        }
    }

    /// The per-thread caches answer for the rule, the second and the reason they were made
    /// for, never for another.
    #[test]
    fn cached_rejections_follow_rule_second_and_reason() {
        let config = ResponseConfig::default();
        let rule = |name: &str, millis: u64, reason: RejectReason| {
            let verdict = Verdict {
                outcome: Outcome::Rejected {
                    reason,
                    rule: name.into(),
                    retry_after: Some(Duration::from_millis(millis)),
                },
                quotas: quota(name, 0, millis).into(),
            };
            let response = rejection_response(&verdict, &config).unwrap();
            let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            (
                body["rule"].as_str().unwrap().to_owned(),
                body["retry_after"].as_u64().unwrap(),
                body["detail"].as_str().unwrap().to_owned(),
                response.headers()["ratelimit"].to_str().unwrap().to_owned(),
                response.headers()["ratelimit-policy"]
                    .to_str()
                    .unwrap()
                    .to_owned(),
            )
        };
        for _ in 0..2 {
            let a = rule("a", 1_500, RejectReason::RateLimited);
            assert_eq!(
                (a.0.as_str(), a.1, a.3.as_str()),
                ("a", 2, r#""a";r=0;t=2"#)
            );
            assert!(a.4.starts_with(r#""a";"#));
            let a_later = rule("a", 2_500, RejectReason::RateLimited);
            assert_eq!((a_later.1, a_later.3.as_str()), (3, r#""a";r=0;t=3"#));
            let banned = rule("a", 2_500, RejectReason::Banned);
            assert!(banned.2.starts_with("banned"), "{}", banned.2);
            let b = rule("b", 2_500, RejectReason::RateLimited);
            assert_eq!((b.0.as_str(), b.3.as_str()), ("b", r#""b";r=0;t=3"#));
            assert!(b.4.starts_with(r#""b";"#));
        }
    }

    /// A backend that failed under a rejecting policy is the service's trouble, not the
    /// client's excess: 503 by default (not the 429 of `status`), configurable, with no
    /// `Retry-After` (nobody knows when the backend comes back).
    #[test]
    fn an_unavailable_backend_is_answered_with_its_own_status() {
        let verdict = rejected(RejectReason::Unavailable, None, Vec::new());
        let response = rejection_response(&verdict, &ResponseConfig::default()).unwrap();
        assert_eq!(response.status(), 503);
        assert!(response.headers().get("retry-after").is_none());
        let config = ResponseConfig {
            status: 420,
            unavailable_status: 500,
            ..ResponseConfig::default()
        };
        assert!(config.validate().is_ok());
        assert_eq!(rejection_response(&verdict, &config).unwrap().status(), 500);
        let limited = rejected(RejectReason::RateLimited, None, Vec::new());
        assert_eq!(rejection_response(&limited, &config).unwrap().status(), 420);
    }

    #[test]
    fn no_key_status_and_invalid_fallback() {
        let verdict = rejected(RejectReason::NoKey, None, Vec::new());
        let response = rejection_response(&verdict, &ResponseConfig::default()).unwrap();
        assert_eq!(response.status(), 400);
        assert!(response.headers().get("retry-after").is_none());
        let config = ResponseConfig {
            status: 1000,
            ..ResponseConfig::default()
        };
        assert!(config.validate().is_err());
        let verdict = rejected(RejectReason::Banned, None, Vec::new());
        assert_eq!(rejection_response(&verdict, &config).unwrap().status(), 429);
        let config = ResponseConfig {
            status: 99,
            ..ResponseConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ResponseConfigError::InvalidStatus {
                field: "status",
                status: 99
            })
        );
        let admitted = Verdict {
            outcome: Outcome::Admitted,
            quotas: Quotas::new(),
        };
        assert!(rejection_response(&admitted, &ResponseConfig::default()).is_none());
    }

    /// The longest waits are written alike everywhere, within sf-integer's 15 digits: the
    /// `RateLimit` field's `t` cannot say more, and a 20-digit `Retry-After` (`u64::MAX`) is
    /// beyond the signed 64-bit integers many clients parse it into (Go's `ParseInt`, Java's
    /// `Long.parseLong`), which then take it as absent and retry on their own backoff, into a
    /// refusal that lasts for ever (a custom `Policy`'s `Duration::MAX`). 999 999 999 999 999 s is over 31 million years.
    #[test]
    fn the_longest_waits_agree_within_fifteen_digits() {
        const MAX: &str = "999999999999999";
        let config = ResponseConfig {
            legacy_headers: true,
            ..ResponseConfig::default()
        };
        for (wait, secs) in [
            (Duration::MAX, MAX),
            (Duration::from_secs(u64::MAX), MAX),
            (
                Duration::from_secs(SF_INTEGER_MAX) + Duration::from_nanos(1),
                MAX,
            ),
            (Duration::from_secs(SF_INTEGER_MAX), MAX),
            (Duration::from_secs(SF_INTEGER_MAX - 1), "999999999999998"),
        ] {
            let verdict = Verdict {
                outcome: Outcome::Rejected {
                    reason: RejectReason::Banned,
                    rule: "ban".into(),
                    retry_after: Some(wait),
                },
                quotas: QuotaState {
                    policy: "ban".into(),
                    limit: 1,
                    window: wait,
                    remaining: 0,
                    reset_after: wait,
                }
                .into(),
            };
            let response = rejection_response(&verdict, &config).unwrap();
            let headers = response.headers();
            assert_eq!(headers["retry-after"], secs, "{wait:?}");
            assert_eq!(headers["x-ratelimit-reset"], secs, "{wait:?}");
            assert_eq!(
                headers["ratelimit"],
                format!(r#""ban";r=0;t={secs}"#).as_str(),
                "{wait:?}"
            );
            let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            assert_eq!(body["retry_after"].to_string(), secs, "{wait:?}");
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("retry after {secs} s")),
                "{wait:?}"
            );
            let templated = ResponseConfig {
                body: Some("{retry_after}".into()),
                ..config.clone()
            };
            let response = rejection_response(&verdict, &templated).unwrap();
            assert_eq!(response.body(), secs, "{wait:?}");
            let grpc = crate::http::grpc_rejection_response(&verdict, &config).unwrap();
            assert_eq!(grpc.headers()["retry-after"], secs, "{wait:?}");
        }
    }

    /// A rejection must be an error status: 101 switches protocols, 204 and 304 carry no body,
    /// and 2xx/3xx say the request was served or moved. Refused by validation, and replaced by
    /// 429 if a config was never validated; 400 and 599, the ends of the range, are kept.
    #[test]
    fn a_rejection_status_is_an_error_status() {
        let verdict = rejected(RejectReason::RateLimited, None, Vec::new());
        for status in [100, 101, 200, 204, 304, 399, 600] {
            let config = ResponseConfig {
                status,
                ..ResponseConfig::default()
            };
            assert_eq!(
                config.validate(),
                Err(ResponseConfigError::InvalidStatus {
                    field: "status",
                    status
                })
            );
            assert_eq!(rejection_response(&verdict, &config).unwrap().status(), 429);
        }
        for status in [400, 599] {
            let config = ResponseConfig {
                status,
                ..ResponseConfig::default()
            };
            assert_eq!(config.validate(), Ok(()));
            assert_eq!(
                rejection_response(&verdict, &config).unwrap().status(),
                status
            );
        }
    }

    #[test]
    fn template() {
        let config = ResponseConfig {
            body: Some(
                "{reason}: {rule} allows {limit} per {period}; retry in {retry_after}s {x}".into(),
            ),
            content_type: Some("text/plain".into()),
            status: 503,
            ..ResponseConfig::default()
        };
        let verdict = rejected(
            RejectReason::RateLimited,
            Some(Duration::from_millis(300)),
            vec![quota("other", 0, 0), quota("per-ip", 0, 300)],
        );
        let response = rejection_response(&verdict, &config).unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["content-type"], "text/plain");
        assert_eq!(
            response.body(),
            "rate limited: per-ip allows 100 per 1m; retry in 1s {x}"
        );
    }

    /// A rule name with quotes, a backslash, a control character and markup stays inside its
    /// string in a JSON template and is inert in an HTML one; plain text takes it as it is.
    #[test]
    fn template_values_are_escaped_for_the_content_type() {
        let name = "say \"hi\" \\ <b>&'\u{1}";
        let verdict = Verdict {
            outcome: Outcome::Rejected {
                reason: RejectReason::RateLimited,
                rule: name.into(),
                retry_after: Some(Duration::from_secs(2)),
            },
            quotas: Quotas::new(),
        };
        let render = |content_type: &str, body: &str| {
            let config = ResponseConfig {
                body: Some(body.into()),
                content_type: Some(content_type.into()),
                ..ResponseConfig::default()
            };
            rejection_response(&verdict, &config).unwrap().into_body()
        };
        for content_type in [
            "application/json",
            "application/problem+json; charset=utf-8",
            "Application/JSON",
        ] {
            let body = render(
                content_type,
                r#"{"rule": "{rule}", "retry": {retry_after}}"#,
            );
            let parsed: serde_json::Value = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("{content_type}: {e}: {body:?}"));
            assert_eq!(parsed["rule"], name, "{content_type}");
            assert_eq!(parsed["retry"], 2, "{content_type}");
        }
        assert_eq!(
            render("text/html; charset=utf-8", "<p>{rule}</p>"),
            "<p>say &quot;hi&quot; \\ &lt;b&gt;&amp;&#39;\u{1}</p>"
        );
        assert_eq!(render("text/plain", "{rule}"), name);
    }
}

/// The review's probes of the rejection and the quota headers that found nothing, pinned.
#[cfg(test)]
mod probes {
    use super::*;

    /// Checks `value` is an RFC 9651 list of sf-strings, each with integer parameters whose keys
    /// are `keys`, and returns the strings (unescaped) and the integers.
    fn parse_list(value: &str, keys: [u8; 2]) -> Vec<(String, [u64; 2])> {
        let bytes = value.as_bytes();
        let mut members = Vec::new();
        let mut i = 0;
        loop {
            assert_eq!(bytes[i], b'"', "{value}: a string at {i}");
            i += 1;
            let mut name = String::new();
            loop {
                match bytes[i] {
                    b'\\' => {
                        assert!(matches!(bytes[i + 1], b'"' | b'\\'), "{value}: escape");
                        name.push(char::from(bytes[i + 1]));
                        i += 2;
                    }
                    b'"' => break,
                    b @ 0x20..=0x7e => {
                        name.push(char::from(b));
                        i += 1;
                    }
                    b => panic!("{value}: byte {b} in a string"),
                }
            }
            i += 1;
            let mut numbers = [0; 2];
            for (key, number) in keys.iter().zip(&mut numbers) {
                assert_eq!(&bytes[i..i + 3], [b';', *key, b'='], "{value}");
                i += 3;
                let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                assert!((1..=15).contains(&digits), "{value}: {digits} digits");
                *number = value[i..i + digits].parse().unwrap();
                i += digits;
            }
            members.push((name, numbers));
            if i == bytes.len() {
                return members;
            }
            assert_eq!(&bytes[i..i + 2], b", ", "{value}");
            i += 2;
        }
    }

    /// Percent-decodes what `push_sf_string` encoded.
    fn decode(name: &str) -> String {
        let bytes = name.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&name[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    fn quota(
        name: &str,
        limit: u64,
        window: Duration,
        remaining: u64,
        reset: Duration,
    ) -> QuotaState {
        QuotaState {
            policy: name.into(),
            limit,
            window,
            remaining,
            reset_after: reset,
        }
    }

    /// Names of every awkward kind (empty, quotes, backslashes, `%`, commas and semicolons,
    /// spaces at the ends, controls, DEL, non-ASCII) and the largest numbers give valid
    /// structured-field lists, alone (the fast path) or listed, whose names decode back to the
    /// originals and whose integers stop at 15 digits.
    #[test]
    fn ietf_values_parse_for_any_name_and_the_largest_numbers() {
        let names = [
            "",
            "per-ip",
            "a\"b",
            "\\",
            "\\\"",
            "%",
            "%41",
            "a,b;c=d",
            " sp ",
            "\u{0}\t\r\n",
            "\u{7f}",
            "é",
            "𝄞",
            "{rule}",
        ];
        let extremes = [
            (u64::MAX, Duration::MAX, u64::MAX, Duration::MAX),
            (0, Duration::ZERO, 0, Duration::ZERO),
            (
                SF_INTEGER_MAX,
                Duration::from_secs(SF_INTEGER_MAX),
                SF_INTEGER_MAX,
                Duration::from_nanos(1),
            ),
        ];
        for (limit, window, remaining, reset) in extremes {
            let quotas: Vec<_> = names
                .iter()
                .map(|name| quota(name, limit, window, remaining, reset))
                .collect();
            let capped = |n: u64| n.min(SF_INTEGER_MAX);
            let want_policy = [capped(limit), capped(whole_seconds_up(window))];
            let want_state = [capped(remaining), reset_seconds(&quotas[0])];
            for list in [&quotas[..1], &quotas[..]]
                .into_iter()
                .chain(quotas.chunks(1))
            {
                let policy = ratelimit_policy_value(list).unwrap();
                let state = ratelimit_value(list).unwrap();
                let policy = parse_list(policy.to_str().unwrap(), [b'q', b'w']);
                let state = parse_list(state.to_str().unwrap(), [b'r', b't']);
                assert_eq!(policy.len(), list.len());
                for ((quota, (p_name, p)), (s_name, s)) in list.iter().zip(policy).zip(state) {
                    assert_eq!(decode(&p_name), *quota.policy);
                    assert_eq!(decode(&s_name), *quota.policy);
                    assert_eq!(p, want_policy, "{:?}", quota.policy);
                    assert_eq!(s, want_state, "{:?}", quota.policy);
                }
            }
        }
    }

    /// `Retry-After` and `t` at the boundaries of a second: rounded up, never 0 on a rejection,
    /// and the same number in both (the engine's rejecting quota resets after the retry-after).
    #[test]
    fn retry_after_and_t_agree_at_the_edges_of_a_second() {
        for (wait, secs) in [
            (Duration::ZERO, "1"),
            (Duration::from_nanos(1), "1"),
            (Duration::from_millis(999), "1"),
            (Duration::from_nanos(999_999_999), "1"),
            (Duration::from_secs(1), "1"),
            (Duration::from_nanos(1_000_000_001), "2"),
            (Duration::from_millis(1_001), "2"),
            (Duration::from_secs(60), "60"),
            (Duration::from_nanos(60_000_000_001), "61"),
            (Duration::from_secs(3_600), "3600"),
        ] {
            let verdict = Verdict {
                outcome: Outcome::Rejected {
                    reason: RejectReason::RateLimited,
                    rule: "r".into(),
                    retry_after: Some(wait),
                },
                quotas: quota("r", 5, Duration::from_secs(60), 0, wait).into(),
            };
            let config = ResponseConfig {
                legacy_headers: true,
                ..ResponseConfig::default()
            };
            let response = rejection_response(&verdict, &config).unwrap();
            let headers = response.headers();
            assert_eq!(headers[RETRY_AFTER], secs, "{wait:?}");
            assert_eq!(headers[X_RATELIMIT_RESET], secs, "{wait:?}");
            assert_eq!(
                headers[RATELIMIT],
                format!(r#""r";r=0;t={secs}"#).as_str(),
                "{wait:?}"
            );
            let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            assert_eq!(body["retry_after"].to_string(), secs, "{wait:?}");
        }
    }

    /// Templates with stray and doubled braces, unknown or miscased placeholders, a rule whose
    /// name is itself a placeholder, and the largest values render without a panic, each
    /// placeholder once; a JSON template stays JSON with every value at its largest.
    #[test]
    fn templates_with_stray_braces_and_extreme_values() {
        let verdict = Verdict {
            outcome: Outcome::Rejected {
                reason: RejectReason::RateLimited,
                rule: "{rule}\"}{".into(),
                retry_after: Some(Duration::MAX),
            },
            quotas: quota("{rule}\"}{", u64::MAX, Duration::MAX, 0, Duration::MAX).into(),
        };
        let render = |template: &str, content_type: Option<&str>| {
            let config = ResponseConfig {
                body: Some(template.into()),
                content_type: content_type.map(Into::into),
                ..ResponseConfig::default()
            };
            let response = rejection_response(&verdict, &config).unwrap();
            String::from_utf8(response.into_body().to_vec()).unwrap()
        };
        for (template, text) in [
            ("", ""),
            ("{", "{"),
            ("}", "}"),
            ("{{", "{"),
            ("x{", "x{"),
            ("{}", "{}"),
            ("{{}}", "{}}"),
            ("{rule", "{rule"),
            ("{{{rule}", "{{rule}\"}{"),
            ("{{rule}", "{rule}"),
            ("{RULE}{ rule }{x}", "{RULE}{ rule }{x}"),
            ("{rule}{rule}", "{rule}\"}{{rule}\"}{"),
            ("{limit}", "18446744073709551615"),
            ("{retry_after}", "999999999999999"),
            ("é{reason}ü", "érate limitedü"),
        ] {
            assert_eq!(render(template, None), text, "{template:?}");
        }
        let json = render(
            r#"{"rule": "{rule}", "limit": {limit}, "period": "{period}", "retry": {retry_after}, "why": "{reason}", "nested": {"a": ["{"]}}"#,
            Some("application/json"),
        );
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["rule"], "{rule}\"}{");
        assert_eq!(parsed["limit"].to_string(), "18446744073709551615");
        assert_eq!(parsed["retry"].to_string(), "999999999999999");
        assert_eq!(parsed["nested"]["a"][0], "{");
        assert!(
            parsed["period"]
                .as_str()
                .unwrap()
                .starts_with("584542046090years")
        );
    }

    /// Every status outside `400..=599` is refused by validation and answered 429 if a
    /// configuration was never validated, for `no_key_status` and `unavailable_status` as for
    /// `status`; a content type
    /// that is no header value (a line break, a control) is refused and answered as the
    /// default.
    #[test]
    fn statuses_and_content_types_that_cannot_be_sent() {
        for status in [0, 1, 99, 100, 399, 600, 999, 1000, u16::MAX] {
            for field in ["status", "no_key_status", "unavailable_status"] {
                let mut config = ResponseConfig::default();
                let reason = match field {
                    "status" => {
                        config.status = status;
                        RejectReason::RateLimited
                    }
                    "no_key_status" => {
                        config.no_key_status = status;
                        RejectReason::NoKey
                    }
                    _ => {
                        config.unavailable_status = status;
                        RejectReason::Unavailable
                    }
                };
                assert_eq!(
                    config.validate(),
                    Err(ResponseConfigError::InvalidStatus { field, status })
                );
                let verdict = Verdict {
                    outcome: Outcome::Rejected {
                        reason,
                        rule: "r".into(),
                        retry_after: None,
                    },
                    quotas: crate::http::Quotas::new(),
                };
                let response = rejection_response(&verdict, &config).unwrap();
                assert_eq!(response.status(), 429, "{field} = {status}");
            }
        }
        for content_type in [
            "application/json\r\nx-injected: 1",
            "text/plain\u{0}",
            "a\u{7f}",
            "",
            "  ",
        ] {
            let config = ResponseConfig {
                content_type: Some(content_type.into()),
                ..ResponseConfig::default()
            };
            assert_eq!(
                config.validate(),
                Err(ResponseConfigError::InvalidContentType(content_type.into()))
            );
            let verdict = Verdict {
                outcome: Outcome::Rejected {
                    reason: RejectReason::RateLimited,
                    rule: "r".into(),
                    retry_after: None,
                },
                quotas: crate::http::Quotas::new(),
            };
            let response = rejection_response(&verdict, &config).unwrap();
            assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
            assert!(response.headers().get("x-injected").is_none());
            // A template's body keeps a template's default, as `validate` says.
            let config = ResponseConfig {
                body: Some("slow down".into()),
                ..config
            };
            let response = rejection_response(&verdict, &config).unwrap();
            assert_eq!(
                response.headers()[CONTENT_TYPE],
                "text/plain; charset=utf-8"
            );
            assert!(response.headers().get("x-injected").is_none());
        }
    }
}
