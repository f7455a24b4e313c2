//! gRPC-aware rejections, and (feature `tonic`) the peer address from tonic's `TcpConnectInfo`.
//!
//! A gRPC client that receives a plain HTTP 429 reports a transport-level error, not the reason:
//! `UNAVAILABLE` by gRPC's HTTP mapping, or (tonic, which tries to read the problem+json body as
//! gRPC frames) `INTERNAL`. For requests whose `content-type` starts with `application/grpc` the
//! layer therefore answers with a gRPC "trailers-only" response: HTTP 200,
//! `content-type: application/grpc`, `grpc-status` and a percent-encoded `grpc-message` in the
//! headers, and an empty body. gRPC-Web requests (`application/grpc-web...`, from browsers)
//! get the same, which gRPC-Web also allows as a trailers-only response, with the content type
//! of their framing (`application/grpc-web` or `application/grpc-web-text`); a browser reads
//! `grpc-status` only if CORS exposes it, as for every gRPC-Web answer. This is plain HTTP: any
//! gRPC server behind the layer benefits, with or without the `tonic` feature.

use crate::http::response::QuotaHeaders;
use crate::http::response::{Rejection, retry_seconds};
use crate::http::{Outcome, RejectReason, ResponseConfig, Verdict};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use std::fmt::Write as _;
use std::time::Duration;

/// gRPC's `RESOURCE_EXHAUSTED`.
const RESOURCE_EXHAUSTED: u16 = 8;
/// gRPC's `PERMISSION_DENIED`.
const PERMISSION_DENIED: u16 = 7;
/// gRPC's `INVALID_ARGUMENT`.
const INVALID_ARGUMENT: u16 = 3;
/// gRPC's `UNAVAILABLE`.
const UNAVAILABLE: u16 = 14;

/// The gRPC status code of a rejection for `reason`.
fn grpc_code(reason: RejectReason) -> u16 {
    match reason {
        RejectReason::RateLimited | RejectReason::TooManyKeys => RESOURCE_EXHAUSTED,
        RejectReason::Blocked | RejectReason::Banned => PERMISSION_DENIED,
        RejectReason::NoKey => INVALID_ARGUMENT,
        RejectReason::Unavailable => UNAVAILABLE,
    }
}

/// The content type of a gRPC rejection of this request, when its rejection should be a gRPC
/// status: `config.grpc` is on and the request is gRPC (see [`grpc_content_type`]).
pub(crate) fn wants_grpc(headers: &HeaderMap, config: &ResponseConfig) -> Option<&'static str> {
    if config.grpc {
        grpc_content_type(headers)
    } else {
        None
    }
}

/// The content type a trailers-only answer to this request has, when its `content-type` is
/// gRPC's: `application/grpc`, optionally followed by `+format` (`application/grpc+proto`) or
/// parameters, answered as `application/grpc`; gRPC-Web's `application/grpc-web` and
/// `application/grpc-web-text` (with the same options), answered with their own. Anything
/// else: `None`. A media type's type and subtype are case-insensitive (RFC 9110, 8.3.1), so
/// `Application/gRPC` is gRPC too: a client that wrote it expects a gRPC status, and would read
/// an HTTP 429 as a transport failure.
pub(crate) fn grpc_content_type(headers: &HeaderMap) -> Option<&'static str> {
    let value = headers.get(CONTENT_TYPE)?.as_bytes();
    let rest = strip_prefix_ignore_case(value, b"application/grpc")?;
    let (answer, rest) = if let Some(rest) = strip_prefix_ignore_case(rest, b"-web-text") {
        ("application/grpc-web-text", rest)
    } else if let Some(rest) = strip_prefix_ignore_case(rest, b"-web") {
        ("application/grpc-web", rest)
    } else {
        ("application/grpc", rest)
    };
    matches!(rest.first(), None | Some(b'+' | b';' | b' ' | b'\t')).then_some(answer)
}

/// `value` without `prefix` (lowercase ASCII), compared ignoring ASCII case.
fn strip_prefix_ignore_case<'a>(value: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let (head, rest) = value.split_at_checked(prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then_some(rest)
}

/// A trailers-only gRPC response: HTTP 200, `content_type` (`application/grpc` or a gRPC-Web
/// one, see [`grpc_content_type`]), `grpc-status` `code`, `message` percent-encoded in
/// `grpc-message`, and when `retry` is given `retry-after` (whole seconds, rounded up, at
/// least 1) and `grpc-retry-pushback-ms` (milliseconds, rounded up, at most `i32::MAX`; a
/// zero wait as long as `retry-after`, 1000 ms); no body.
///
/// `grpc-retry-pushback-ms` is what gRPC clients with a retry policy read (gRPC's retry design,
/// A6): they wait that long before the next attempt instead of their own backoff, where
/// `retry-after` is only metadata to them.
pub(crate) fn trailers_only(
    content_type: &'static str,
    code: u16,
    message: &str,
    retry: Option<Duration>,
) -> http::Response<Bytes> {
    let mut encoded = String::with_capacity(message.len());
    push_percent_encoded(&mut encoded, message);
    let mut response = http::Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(code),
    );
    // Only printable ASCII was written, so this cannot fail; stay panic-free regardless.
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(encoded)) {
        headers.insert(HeaderName::from_static("grpc-message"), value);
    }
    if let Some(retry) = retry {
        let secs = retry_seconds(retry);
        headers.insert(RETRY_AFTER, crate::http::response::retry_after_value(secs));
        // At most `i32::MAX` (24.8 days): clients read the value as a 32-bit integer (grpc-java
        // parses an `Integer`), and one that cannot parse it never retries at all; a longer
        // wait (only a long ban) is met by another rejection with the rest of it.
        //
        // A zero wait pushes back as long as `retry-after` says (1 s), not 1 ms: zero is no
        // wait at all (a custom policy's, a rule whose free permit goes to the request queued
        // first, `ConcurrencyLayer::retry_after(ZERO)`), and a client with a retry policy would
        // spend its attempts within milliseconds, each rejected again; "retry after 0" is what
        // the 1-second floor of `retry-after` (and of the message's "retry after 1 s") is there
        // to prevent. Any other wait is the limiter's exact one, rounded up to whole ms.
        let millis = if retry.is_zero() {
            u128::from(secs).saturating_mul(1_000)
        } else {
            retry.as_nanos().div_ceil(1_000_000)
        }
        .clamp(1, PUSHBACK_MAX_MS);
        headers.insert(
            HeaderName::from_static("grpc-retry-pushback-ms"),
            HeaderValue::from(u32::try_from(millis).unwrap_or(i32::MAX as u32)),
        );
    }
    response
}

/// The largest `grpc-retry-pushback-ms`: `i32::MAX` milliseconds.
const PUSHBACK_MAX_MS: u128 = i32::MAX as u128;

/// gRPC's `RESOURCE_EXHAUSTED`, for the concurrency layer's rejections.
pub(crate) const CONCURRENCY_CODE: u16 = RESOURCE_EXHAUSTED;

/// The rejection for a request: [`grpc_rejection_response`] (with `grpc` as its content type)
/// when `grpc` is given (see [`wants_grpc`]), otherwise
/// [`rejection_response`](crate::http::rejection_response).
pub(crate) fn rejection(
    verdict: &Verdict,
    config: &ResponseConfig,
    grpc: Option<&'static str>,
) -> Option<http::Response<Bytes>> {
    match grpc {
        Some(content_type) => grpc_rejection(verdict, config, content_type),
        None => crate::http::rejection_response(verdict, config),
    }
}

/// Appends `message` percent-encoded as gRPC asks of `grpc-message`: every byte of its UTF-8
/// outside printable ASCII (`0x20..=0x7E`), and `%` itself, becomes `%XX`. So does a space at
/// either end: gRPC allows it, but an HTTP field value must not begin or end with whitespace
/// (RFC 9110 5.5), and HTTP/2 peers may reset the stream while HTTP/1 parsers trim it.
fn push_percent_encoded(out: &mut String, message: &str) {
    let last = message.len().saturating_sub(1);
    for (i, byte) in message.bytes().enumerate() {
        let at_an_end = i == 0 || i == last;
        if (0x20..=0x7E).contains(&byte) && byte != b'%' && !(byte == b' ' && at_an_end) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// The gRPC rejection of a rejected request: a "trailers-only" response (HTTP 200,
/// `content-type: application/grpc`, an empty body) whose headers carry
///
/// - `grpc-status`: 8 `RESOURCE_EXHAUSTED` for [`RejectReason::RateLimited`] and
///   [`RejectReason::TooManyKeys`]; 7
///   `PERMISSION_DENIED` for [`RejectReason::Blocked`] and [`RejectReason::Banned`] (the client
///   is refused as such, not for the count of this request, so retrying soon will not help);
///   3 `INVALID_ARGUMENT` for [`RejectReason::NoKey`] (the HTTP answer is 400); 14
///   `UNAVAILABLE` for [`RejectReason::Unavailable`] (the counting backend failed: a retry may
///   succeed). `status` and `no_key_status` of the configuration do not apply.
/// - `grpc-message`, percent-encoded: the configured `body` template rendered as for HTTP
///   (`{rule}`, `{limit}`, `{period}`, `{retry_after}`, `{reason}`), or by default
///   `rate limited by rule per-ip; retry after 1 s`.
/// - `retry-after` (whole seconds, rounded up, at least 1) and `grpc-retry-pushback-ms`
///   (milliseconds, rounded up: what gRPC clients with a retry policy wait before their next
///   attempt; for a zero wait 1000, as long as `retry-after`, never a retry at once) when the
///   verdict says when to retry and [`ResponseConfig::retry_after_header`] is on, and the quota
///   headers the configuration asks for; gRPC clients see them as metadata of the status.
///
/// `None` when the verdict admits the request. The layer sends this instead of
/// [`rejection_response`](crate::http::rejection_response) when [`ResponseConfig::grpc`] is on
/// (the default) and the request's `content-type` starts with `application/grpc`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::http::{grpc_rejection_response, Outcome, Quotas, RejectReason, ResponseConfig, Verdict};
///
/// let verdict = Verdict {
///     outcome: Outcome::Rejected {
///         reason: RejectReason::RateLimited,
///         rule: "per-ip".into(),
///         retry_after: Some(Duration::from_millis(300)),
///     },
///     quotas: Quotas::new(),
/// };
/// let response = grpc_rejection_response(&verdict, &ResponseConfig::default()).unwrap();
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.headers()["grpc-status"], "8");
/// assert_eq!(response.headers()["grpc-message"], "rate limited by rule per-ip; retry after 1 s");
/// assert_eq!(response.headers()["retry-after"], "1");
/// assert_eq!(response.headers()["grpc-retry-pushback-ms"], "300");
/// assert!(response.body().is_empty());
/// ```
pub fn grpc_rejection_response(
    verdict: &Verdict,
    config: &ResponseConfig,
) -> Option<http::Response<Bytes>> {
    grpc_rejection(verdict, config, "application/grpc")
}

/// [`grpc_rejection_response`] with `content_type` (a gRPC-Web one for a gRPC-Web request).
fn grpc_rejection(
    verdict: &Verdict,
    config: &ResponseConfig,
    content_type: &'static str,
) -> Option<http::Response<Bytes>> {
    let rejection = Rejection::of(verdict)?;
    let message = match &config.body {
        Some(template) => rejection.render(template, config.content_type.as_deref()),
        None => rejection.detail(),
    };
    let retry = match &verdict.outcome {
        Outcome::Rejected { retry_after, .. } => retry_after.filter(|_| config.retry_after_header),
        _ => None,
    };
    let mut response = trailers_only(content_type, grpc_code(rejection.reason), &message, retry);
    let headers = response.headers_mut();
    // As a rejection's: without AspNetCoreRateLimit's headers, which it sends on admissions only.
    QuotaHeaders::of_rejection(config).insert(headers, &verdict.quotas);
    Some(response)
}

/// The peer address tonic's server put in the request: `TcpConnectInfo::remote_addr`.
#[cfg(feature = "tonic")]
pub(crate) fn tonic_peer(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
    extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Outcome, QuotaState, Quotas};
    use std::time::Duration;

    fn rejected(reason: RejectReason, retry: Option<Duration>) -> Verdict {
        Verdict {
            outcome: Outcome::Rejected {
                reason,
                rule: "per-ip".into(),
                retry_after: retry,
            },
            quotas: QuotaState {
                policy: "per-ip".into(),
                limit: 2,
                window: Duration::from_secs(1),
                remaining: 0,
                reset_after: Duration::from_millis(400),
            }
            .into(),
        }
    }

    #[test]
    fn trailers_only_shape() {
        let verdict = rejected(RejectReason::RateLimited, Some(Duration::from_millis(1500)));
        let response = grpc_rejection_response(&verdict, &ResponseConfig::default()).unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "rate limited by rule per-ip; retry after 2 s"
        );
        assert_eq!(headers["retry-after"], "2");
        assert_eq!(headers["grpc-retry-pushback-ms"], "1500");
        assert_eq!(headers["ratelimit-policy"], r#""per-ip";q=2;w=1"#);
        assert_eq!(headers["ratelimit"], r#""per-ip";r=0;t=1"#);
        assert!(response.body().is_empty());
    }

    /// A wait beyond 32-bit milliseconds (a long ban) is pushed back by `i32::MAX` ms, which
    /// every client parses, rather than by a number some cannot parse and then never retry.
    #[test]
    fn a_pushback_beyond_32_bits_is_capped() {
        let day = Duration::from_secs(86_400);
        let verdict = rejected(RejectReason::Banned, Some(100 * day));
        let response = grpc_rejection_response(&verdict, &ResponseConfig::default()).unwrap();
        let headers = response.headers();
        assert_eq!(headers["grpc-retry-pushback-ms"], "2147483647");
        assert_eq!(headers["retry-after"], "8640000");
    }

    /// A zero wait (a custom policy's, a rule whose queue head is about to take the free
    /// permit, `ConcurrencyLayer::retry_after(ZERO)`) pushes back as long as `retry-after`
    /// and `grpc-message` say, 1 s, not 1 ms: a pushback of 1 ms is a retry at once, which the
    /// 1-second floor of `retry-after` is there to prevent, and a client with a retry policy
    /// would spend its attempts within a few milliseconds, every one rejected again. A wait
    /// of a nanosecond is a real wait: its exact 1 ms stays.
    #[test]
    fn a_zero_wait_pushes_back_as_long_as_retry_after_says() {
        let verdict = rejected(RejectReason::RateLimited, Some(Duration::ZERO));
        let response = grpc_rejection_response(&verdict, &ResponseConfig::default()).unwrap();
        let headers = response.headers();
        assert_eq!(headers["retry-after"], "1");
        assert_eq!(
            headers["grpc-message"],
            "rate limited by rule per-ip; retry after 1 s"
        );
        assert_eq!(headers["grpc-retry-pushback-ms"], "1000");
        // The concurrency layer's answer, with its `retry_after` set to zero.
        let response = trailers_only(
            "application/grpc",
            CONCURRENCY_CODE,
            "concurrency limit reached",
            Some(Duration::ZERO),
        );
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1000");
        // Rounded up to whole milliseconds, as before: a computed wait is not stretched.
        for (wait, pushback) in [
            (Duration::from_nanos(1), "1"),
            (Duration::from_micros(999), "1"),
            (Duration::from_micros(1_001), "2"),
            (Duration::from_millis(999), "999"),
            (Duration::from_millis(1_000), "1000"),
            (Duration::from_nanos(1_000_000_001), "1001"),
        ] {
            let verdict = rejected(RejectReason::RateLimited, Some(wait));
            let response = grpc_rejection_response(&verdict, &ResponseConfig::default()).unwrap();
            assert_eq!(
                response.headers()["grpc-retry-pushback-ms"],
                pushback,
                "{wait:?}"
            );
        }
    }

    /// Without the Retry-After option (AspNet's `DisableRateLimitHeaders`), no pushback
    /// either: both say when to retry.
    #[test]
    fn no_pushback_without_retry_after() {
        let verdict = rejected(RejectReason::RateLimited, Some(Duration::from_millis(1500)));
        let config = ResponseConfig {
            retry_after_header: false,
            ..ResponseConfig::default()
        };
        let response = grpc_rejection_response(&verdict, &config).unwrap();
        assert!(response.headers().get("retry-after").is_none());
        assert!(response.headers().get("grpc-retry-pushback-ms").is_none());
        assert_eq!(response.headers()["grpc-status"], "8");
    }

    #[test]
    fn codes_per_reason() {
        let config = ResponseConfig::default();
        for (reason, code) in [
            (RejectReason::RateLimited, "8"),
            (RejectReason::Blocked, "7"),
            (RejectReason::Banned, "7"),
            (RejectReason::NoKey, "3"),
            (RejectReason::Unavailable, "14"),
            (RejectReason::TooManyKeys, "8"),
        ] {
            let response = grpc_rejection_response(&rejected(reason, None), &config).unwrap();
            assert_eq!(response.status(), 200, "{reason}");
            assert_eq!(response.headers()["grpc-status"], code, "{reason}");
            assert!(response.headers().get("retry-after").is_none());
        }
        let admitted = Verdict {
            outcome: Outcome::Admitted,
            quotas: Quotas::new(),
        };
        assert!(grpc_rejection_response(&admitted, &config).is_none());
    }

    #[test]
    fn message_is_percent_encoded_template() {
        let config = ResponseConfig {
            body: Some(
                "100% {reason}: {rule} allows {limit}/{period} — wait {retry_after}s\n".into(),
            ),
            legacy_headers: true,
            ietf_headers: false,
            ..ResponseConfig::default()
        };
        let verdict = rejected(RejectReason::RateLimited, Some(Duration::from_millis(300)));
        let response = grpc_rejection_response(&verdict, &config).unwrap();
        let headers = response.headers();
        assert_eq!(
            headers["grpc-message"],
            "100%25 rate limited: per-ip allows 2/1s %E2%80%94 wait 1s%0A"
        );
        assert_eq!(headers["x-ratelimit-remaining"], "0");
        assert!(headers.get("ratelimit").is_none());
        assert!(response.body().is_empty());
    }

    #[test]
    fn percent_encoding_edges() {
        let mut out = String::new();
        push_percent_encoded(&mut out, "a ~%\u{7f}\u{1}é");
        assert_eq!(out, "a ~%25%7F%01%C3%A9");
        // A space at either end is encoded: no field value begins or ends with whitespace.
        for (message, encoded) in [
            (" a b ", "%20a b%20"),
            (" ", "%20"),
            ("  ", "%20%20"),
            ("", ""),
        ] {
            let mut out = String::new();
            push_percent_encoded(&mut out, message);
            assert_eq!(out, encoded, "{message:?}");
            assert!(http::HeaderValue::from_str(&out).is_ok());
        }
    }

    proptest::proptest! {
        /// A probe that found nothing, pinned: any message is a valid field value once
        /// encoded (printable ASCII, no whitespace at either end) and decodes back to itself
        /// as a gRPC client decodes `grpc-message`.
        #[test]
        fn any_message_encodes_to_a_field_value_that_decodes_back(message in "\\PC*|.*|[ %\r\n\t\u{0}-\u{1f}\u{7f}-\u{ff}]*") {
            let mut out = String::new();
            push_percent_encoded(&mut out, &message);
            let value = HeaderValue::from_str(&out).unwrap();
            let bytes = value.as_bytes();
            proptest::prop_assert!(bytes.iter().all(|b| (0x20..=0x7e).contains(b)));
            proptest::prop_assert!(bytes.first() != Some(&b' ') && bytes.last() != Some(&b' '));
            let mut decoded = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i] == b'%' {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                    decoded.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    decoded.push(bytes[i]);
                    i += 1;
                }
            }
            proptest::prop_assert_eq!(String::from_utf8(decoded).unwrap(), message);
        }
    }

    #[test]
    fn which_requests_are_grpc() {
        let mut headers = HeaderMap::new();
        let config = ResponseConfig::default();
        assert_eq!(wants_grpc(&headers, &config), None);
        for other in [
            "application/json",
            "application/grpcx",
            "application/grpc-webx",
            "application/grpc-web-textual",
            "application/grp",
            "application/grpcX",
            "Application/JSON",
            "text/grpc",
        ] {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(other));
            assert_eq!(wants_grpc(&headers, &config), None, "{other}");
        }
        for (request, answer) in [
            ("application/grpc", "application/grpc"),
            ("application/grpc+proto", "application/grpc"),
            ("application/grpc; x=y", "application/grpc"),
            ("application/grpc\t;x=y", "application/grpc"),
            ("Application/gRPC", "application/grpc"),
            ("APPLICATION/GRPC+PROTO", "application/grpc"),
            ("application/gRPC-Web", "application/grpc-web"),
            (
                "Application/Grpc-Web-Text+proto",
                "application/grpc-web-text",
            ),
            ("application/grpc-web", "application/grpc-web"),
            ("application/grpc-web+proto", "application/grpc-web"),
            ("application/grpc-web-text", "application/grpc-web-text"),
            (
                "application/grpc-web-text+proto",
                "application/grpc-web-text",
            ),
        ] {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(request));
            assert_eq!(wants_grpc(&headers, &config), Some(answer), "{request}");
        }
        let off = ResponseConfig {
            grpc: false,
            ..ResponseConfig::default()
        };
        assert_eq!(wants_grpc(&headers, &off), None);
        let verdict = rejected(RejectReason::RateLimited, None);
        assert_eq!(rejection(&verdict, &off, None).unwrap().status(), 429);
        let web = rejection(&verdict, &config, Some("application/grpc-web-text")).unwrap();
        assert_eq!(web.status(), 200);
        assert_eq!(web.headers()["content-type"], "application/grpc-web-text");
        assert_eq!(web.headers()["grpc-status"], "8");
        assert!(web.body().is_empty());
    }
}
