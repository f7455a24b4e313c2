//! The responses: 429 (configurable) with `Retry-After`, an `application/problem+json` body, and
//! the IETF `RateLimit` / `RateLimit-Policy` headers (legacy `X-RateLimit-*` as an option).

use crate::http::{Outcome, QuotaState, RejectReason, Verdict};
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::StatusCode;
use serde::Deserialize;
use std::fmt;
use std::fmt::Write as _;
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
    /// The status of a rejection (429 by default).
    pub status: u16,
    /// The status when the client's key cannot be determined and such requests are rejected.
    pub no_key_status: u16,
    /// The rejection body's content type.
    pub content_type: String,
    /// The rejection body; `None` gives a problem+json document. A template: `{rule}`,
    /// `{limit}`, `{period}`, `{retry_after}` (whole seconds) and `{reason}` are replaced.
    pub body: Option<String>,
    /// `RateLimit` and `RateLimit-Policy` on every response that matched a rule.
    pub ietf_headers: bool,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` as well.
    pub legacy_headers: bool,
    /// Reject gRPC requests (`content-type` `application/grpc` or `application/grpc+proto`, ...;
    /// not gRPC-Web) with a gRPC status (trailers-only: HTTP 200, `grpc-status`,
    /// `grpc-message`) instead of `status` and a body, so that gRPC clients see
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
            content_type: "application/problem+json".to_owned(),
            body: None,
            ietf_headers: true,
            legacy_headers: false,
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
    /// A status outside `100..=999`.
    InvalidStatus {
        /// The field: `status` or `no_key_status`.
        field: &'static str,
        /// The configured value.
        status: u16,
    },
    /// The content type is not a valid header value.
    InvalidContentType(String),
}

impl fmt::Display for ResponseConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseConfigError::InvalidStatus { field, status } => {
                write!(f, "{field}: {status} is not an HTTP status (100..=999)")
            }
            ResponseConfigError::InvalidContentType(value) => {
                write!(f, "content_type: {value:?} is not a valid header value")
            }
        }
    }
}

impl std::error::Error for ResponseConfigError {}

impl ResponseConfig {
    /// Checks that the statuses are HTTP statuses and the content type is a header value. At
    /// request time an invalid status is replaced by 429 and an invalid content type by
    /// `application/problem+json`, never a panic.
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
        ] {
            if StatusCode::from_u16(status).is_err() {
                return Err(ResponseConfigError::InvalidStatus { field, status });
            }
        }
        if HeaderValue::from_str(&self.content_type).is_err() {
            return Err(ResponseConfigError::InvalidContentType(
                self.content_type.clone(),
            ));
        }
        Ok(())
    }
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

/// Appends `name` to `out` as a structured-field string (RFC 8941): quoted, with `"` and `\`
/// escaped. Characters an sf-string cannot hold (controls, non-ASCII) become `?`.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
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
    list_value(quotas, |out, quota| {
        let _ = write!(
            out,
            ";q={};w={}",
            quota.limit.min(SF_INTEGER_MAX),
            whole_seconds_up(quota.window).min(SF_INTEGER_MAX)
        );
    })
}

/// The `RateLimit` field value for `quotas`: `"per-ip";r=42;t=17` (remaining, and seconds until
/// reset rounded up). `None` when `quotas` is empty.
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
    list_value(quotas, |out, quota| {
        let _ = write!(
            out,
            ";r={};t={}",
            quota.remaining.min(SF_INTEGER_MAX),
            whole_seconds_up(quota.reset_after).min(SF_INTEGER_MAX)
        );
    })
}

/// The largest structured-field integer (15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

fn list_value(
    quotas: &[QuotaState],
    params: impl Fn(&mut String, &QuotaState),
) -> Option<HeaderValue> {
    if quotas.is_empty() {
        return None;
    }
    // Room for the usual value (`"name";q=100;w=60`) without growing.
    let mut out = String::with_capacity(quotas.iter().map(|q| q.policy.len() + 32).sum());
    for (i, quota) in quotas.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_sf_string(&mut out, &quota.policy);
        params(&mut out, quota);
    }
    // Only printable ASCII was written, so this cannot fail; stay panic-free regardless. The
    // buffer becomes the value's bytes (no copy).
    HeaderValue::from_maybe_shared(Bytes::from(out)).ok()
}

/// The most restrictive quota: the fewest remaining, and of those the longest to reset.
pub(crate) fn most_restrictive(quotas: &[QuotaState]) -> Option<&QuotaState> {
    quotas.iter().min_by(|a, b| {
        a.remaining
            .cmp(&b.remaining)
            .then(b.reset_after.cmp(&a.reset_after))
    })
}

/// Adds the quota headers `config` asks for to `headers`: `RateLimit-Policy` and `RateLimit`
/// (when `ietf_headers`), and `X-RateLimit-Limit`, `-Remaining` and `-Reset` (seconds, rounded
/// up) of the most restrictive quota (when `legacy_headers`). Nothing when `quotas` is empty.
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
    if config.ietf_headers {
        if let Some(value) = ratelimit_policy_value(quotas) {
            headers.insert(HeaderName::from_static("ratelimit-policy"), value);
        }
        if let Some(value) = ratelimit_value(quotas) {
            headers.insert(HeaderName::from_static("ratelimit"), value);
        }
    }
    if config.legacy_headers {
        if let Some(quota) = most_restrictive(quotas) {
            headers.insert(
                HeaderName::from_static("x-ratelimit-limit"),
                HeaderValue::from(quota.limit),
            );
            headers.insert(
                HeaderName::from_static("x-ratelimit-remaining"),
                HeaderValue::from(quota.remaining),
            );
            headers.insert(
                HeaderName::from_static("x-ratelimit-reset"),
                HeaderValue::from(whole_seconds_up(quota.reset_after)),
            );
        }
    }
}

/// The problem+json document of a rejection (RFC 9457), serialized straight from borrowed
/// fields. The fields are in alphabetical order, as the earlier `serde_json::json!` map wrote
/// them, so the body is byte for byte what it was.
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

/// The response to a rejected request: the configured status (`no_key_status` for
/// [`RejectReason::NoKey`]), `Retry-After` when the verdict says when to retry, the quota
/// headers, and the body (a problem+json document, or the configured template). `None` when the
/// verdict admits the request.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{rejection_response, Outcome, RejectReason, ResponseConfig, Verdict};
///
/// let verdict = Verdict {
///     outcome: Outcome::Rejected {
///         reason: RejectReason::RateLimited,
///         rule: "per-ip".into(),
///         retry_after: Some(Duration::from_millis(300)),
///     },
///     quotas: Vec::new(),
/// };
/// let response = rejection_response(&verdict, &ResponseConfig::default()).unwrap();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "1");
/// ```
pub fn rejection_response(
    verdict: &Verdict,
    config: &ResponseConfig,
) -> Option<http::Response<Bytes>> {
    let Outcome::Rejected {
        reason,
        rule,
        retry_after,
    } = &verdict.outcome
    else {
        return None;
    };
    let configured = if *reason == RejectReason::NoKey {
        config.no_key_status
    } else {
        config.status
    };
    let status = StatusCode::from_u16(configured).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let retry_secs = retry_after.map(whole_seconds_up);
    let quota = verdict
        .quotas
        .iter()
        .find(|q| *q.policy == **rule)
        .or_else(|| most_restrictive(&verdict.quotas));

    let (body, content_type) = match &config.body {
        Some(template) => (
            render_template(template, *reason, rule, quota, retry_secs).into_bytes(),
            HeaderValue::from_str(&config.content_type)
                .unwrap_or(HeaderValue::from_static("text/plain; charset=utf-8")),
        ),
        None => {
            let mut detail = format!("{reason} by rule {rule}");
            if let Some(secs) = retry_secs {
                let _ = write!(detail, "; retry after {secs} s");
            }
            let document = Problem {
                detail: &detail,
                retry_after: retry_secs,
                rule,
                status: status.as_u16(),
                title: status.canonical_reason().unwrap_or("Request Rejected"),
                kind: "about:blank",
            };
            (
                // Serializing borrowed fields cannot fail; stay panic-free regardless.
                serde_json::to_vec(&document).unwrap_or_default(),
                HeaderValue::from_str(&config.content_type)
                    .unwrap_or(HeaderValue::from_static("application/problem+json")),
            )
        }
    };

    let mut response = http::Response::new(Bytes::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type);
    if let Some(secs) = retry_secs {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    insert_quota_headers(headers, &verdict.quotas, config);
    Some(response)
}

pub(crate) fn render_template(
    template: &str,
    reason: RejectReason,
    rule: &str,
    quota: Option<&QuotaState>,
    retry_secs: Option<u64>,
) -> String {
    let limit = quota.map(|q| q.limit.to_string()).unwrap_or_default();
    let period = quota
        .map(|q| humantime::format_duration(q.window).to_string())
        .unwrap_or_default();
    let retry = retry_secs.map(|s| s.to_string()).unwrap_or_default();
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    // One pass, so that a replaced value containing `{rule}` is not replaced again.
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let replaced = [
            ("{rule}", rule),
            ("{limit}", limit.as_str()),
            ("{period}", period.as_str()),
            ("{retry_after}", retry.as_str()),
        ]
        .into_iter()
        .find(|(key, _)| after.starts_with(key));
        if let Some((key, value)) = replaced {
            out.push_str(value);
            rest = &after[key.len()..];
        } else if let Some(after_reason) = after.strip_prefix("{reason}") {
            let _ = write!(out, "{reason}");
            rest = after_reason;
        } else {
            out.push('{');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
            quotas,
        }
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
            r#""per-ip";r=42;t=17, "a\"b\\c";r=0;t=0"#
        );
        assert_eq!(
            ratelimit_value(&[quota("é\n", 1, 1)]).unwrap(),
            r#""??";r=1;t=1"#
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
            quotas: Vec::new(),
        };
        assert!(rejection_response(&admitted, &ResponseConfig::default()).is_none());
    }

    #[test]
    fn template() {
        let config = ResponseConfig {
            body: Some(
                "{reason}: {rule} allows {limit} per {period}; retry in {retry_after}s {x}".into(),
            ),
            content_type: "text/plain".into(),
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
}
