//! envoyproxy/ratelimit's HTTP endpoints: `/json` (a `RateLimitRequest` in, its
//! `RateLimitResponse` out, both in the proto3 JSON mapping) and `/healthcheck`, as a tower
//! service.

use super::proto::{
    Code, DescriptorStatus, Entry, HeaderValue, ProtoDuration, RateLimit, RateLimitDescriptor,
    RateLimitOverride, RateLimitRequest, RateLimitResponse, UInt64Value, Unit,
};
use super::service::{RlsService, UnixClock};
use crate::Clock;
use bytes::Buf;
use http::{StatusCode, header};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The largest `/json` request body a [`JsonService`] reads; a longer one is answered
/// `413 Payload Too Large` (a `RateLimitRequest` is a few hundred bytes).
///
/// # Examples
///
/// ```
/// assert_eq!(turnstile::envoy::MAX_JSON_REQUEST_BYTES, 1 << 20);
/// ```
pub const MAX_JSON_REQUEST_BYTES: usize = 1 << 20;

/// envoyproxy/ratelimit's HTTP endpoints for an [`RlsService`], as a
/// `tower::Service<http::Request<B>>` to serve with hyper (or mount in any tower router):
/// made by [`RlsService::json_service`], sharing the service's configuration and counts.
///
/// - `POST /json`: the body is a `RateLimitRequest` in the proto3 JSON mapping (`domain`,
///   `descriptors[].entries[].key` and `.value`, `descriptors[].limit.requestsPerUnit` and
///   `.unit`, `descriptors[].hitsAddend`, `hitsAddend`; the proto field names, such as
///   `hits_addend`, are accepted too, enums names or numbers, `null` is the default), read as
///   Go's protojson (envoyproxy/ratelimit's reader) reads it:
///   - A field given twice in one object is refused, under one name twice or under both
///     (`hitsAddend` and `hits_addend`), `null` included.
///   - `null` as a field's value is its default, but not as an element of `descriptors` or
///     `entries`: refused there.
///   - A number field (`hitsAddend`, `requestsPerUnit`) takes a JSON number or a string holding
///     one, and nothing else: no `+`, no leading zero, no whitespace inside the quotes. Its
///     value is worked out exactly, in decimal: a fraction or an exponent is fine when the value
///     is whole and in range (`1e2` and `"100.0"` are 100, `"-0"` is 0,
///     `18446744073709551615.0` is `u64::MAX`), and refused otherwise (`1.5`, `1e-1`,
///     `1.00000000000000000001`, which a float would round to 1), as is an exponent that takes
///     the digits before the point past 20 (`0.000000000000000000001e21`, though that is 1).
///     protojson reads only the number at the start of a string and ignores what follows a
///     space or a comma (`"1 2"` is 1 there); here such a string is refused.
///   - An enum (`unit`) takes its name, or its number as a JSON number read the same way
///     (`2.0` is `MINUTE`), not as a string.
///
///   It is decided as a gRPC `ShouldRateLimit` is
///   ([`RlsService::decide`]), and the answer is the `RateLimitResponse` in the same mapping,
///   as protojson writes it (`overallCode`, `statuses[].code` by name,
///   `statuses[].currentLimit.requestsPerUnit` and `.unit`, `limitRemaining`,
///   `durationUntilReset` as whole seconds with an `s`, such as `"59s"`,
///   `responseHeadersToAdd`; a field at its default value, 0 or empty, is left out), with
///   `200 OK`, or `429 Too Many Requests` when the overall code is `OVER_LIMIT`.
/// - A body that is not such a request (not JSON, an unknown field, a field given twice, a
///   wrong type, a number out of range or not whole), or a request the service refuses (an empty domain or no descriptors):
///   `400 Bad Request`, with a plain-text message naming the field
///   (`descriptors[0].entries[1].value: must be a string`). A body over
///   [`MAX_JSON_REQUEST_BYTES`]: `413`. Any method is taken, as envoyproxy/ratelimit takes it
///   (clients send `POST`).
/// - `/healthcheck`, any method: `200 OK`, body `OK`; while the service is not
///   [healthy](RlsService::is_healthy) (draining, or with no domain when one is required),
///   `500` with no body, as envoyproxy/ratelimit answers.
/// - Any other path: `404`.
///
/// envoyproxy/ratelimit writes 400 with no message; it serves these on a port of its own
/// (8080), as a server here would.
///
/// The service reads the body as the client sends it and sets no time limit of its own: a
/// client that stops sending holds its call until the server's timeouts end it (hyper's
/// `header_read_timeout`, or a `tower::timeout::TimeoutLayer` around this service).
///
/// # Examples
///
/// ```
/// use tower::Service;
/// use turnstile::envoy::{RlsConfig, RlsService};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let service = RlsService::new(RlsConfig::from_yaml_str("
/// domain: edge
/// descriptors:
///   - key: path
///     rate_limit: { unit: second, requests_per_unit: 100 }
/// ")?)?;
/// let request = http::Request::post("/json").body(String::from(
///     r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "path", "value": "/"}]}]}"#,
/// ))?;
/// let response = service.json_service().call(request).await?;
/// assert_eq!(response.status(), 200);
/// assert!(response.body().contains(r#""limitRemaining":99"#));
/// // With hyper: hyper_util::service::TowerToHyperService::new(service.json_service())
/// # Ok(())
/// # }
/// ```
pub struct JsonService<C: Clock + Clone = UnixClock> {
    service: RlsService<C>,
}

impl<C: Clock + Clone> Clone for JsonService<C> {
    fn clone(&self) -> Self {
        JsonService {
            service: self.service.clone(),
        }
    }
}

impl<C: Clock + Clone> std::fmt::Debug for JsonService<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonService")
            .field("service", &self.service)
            .finish()
    }
}

impl<C: Clock + Clone> RlsService<C> {
    /// envoyproxy/ratelimit's HTTP endpoints (`/json`, `/healthcheck`) for this service: see
    /// [`JsonService`]. It shares this service's configuration, settings and counts.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::{RlsConfig, RlsService};
    ///
    /// let service = RlsService::new(RlsConfig::from_yaml_str("domain: edge\n")?)?;
    /// let http = service.json_service();
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn json_service(&self) -> JsonService<C> {
        JsonService {
            service: self.clone(),
        }
    }
}

impl<C, B> tower::Service<http::Request<B>> for JsonService<C>
where
    C: Clock + Clone,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.service.clone();
        Box::pin(async move { Ok(answer(&service, request).await) })
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> http::Response<String> {
    let mut response = http::Response::new(body.into());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn answer<C, B>(service: &RlsService<C>, request: http::Request<B>) -> http::Response<String>
where
    C: Clock + Clone,
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    match request.uri().path() {
        "/healthcheck" if service.is_healthy() => return text(StatusCode::OK, "OK"),
        // As envoyproxy/ratelimit: the status alone.
        "/healthcheck" => {
            let mut response = http::Response::new(String::new());
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return response;
        }
        "/json" => {}
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "not found: the paths are /json and /healthcheck",
            );
        }
    }
    let body = match read_body(request.into_body(), MAX_JSON_REQUEST_BYTES).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let response = match service.decide(&request).await {
        Ok(response) => response,
        Err(status) => return text(StatusCode::BAD_REQUEST, status.message()),
    };
    let status = match response.overall_code() {
        Code::Ok => StatusCode::OK,
        Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
        // Not answered by this service; as envoyproxy/ratelimit answers it.
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut http = http::Response::new(render_response(&response).to_string());
    *http.status_mut() = status;
    http.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    http
}

/// The body, up to `limit` bytes; past it, or when the body fails, the answer to send.
async fn read_body<B>(body: B, limit: usize) -> Result<Vec<u8>, http::Response<String>>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over {limit} bytes"),
        )
    };
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large());
    }
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|e| {
            text(
                StatusCode::BAD_REQUEST,
                format!("could not read the request body: {}", e.into()),
            )
        })?;
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers
        };
        while data.has_remaining() {
            let chunk = data.chunk();
            let n = chunk.len();
            if bytes.len().saturating_add(n) > limit {
                return Err(too_large());
            }
            bytes.extend_from_slice(chunk);
            data.advance(n);
        }
    }
    Ok(bytes)
}

// ---------------------------------------------------------------------------------------------
// The request, from the proto3 JSON mapping

/// `parent.field`, or `field` at the top.
fn join(parent: &str, field: &str) -> String {
    if parent.is_empty() {
        field.to_owned()
    } else {
        format!("{parent}.{field}")
    }
}

/// A JSON object's members in the order sent, a name given twice kept twice (serde_json's
/// `Map` would keep the last one, where protojson refuses the request), each value as its text.
struct Members<'b>(Vec<(String, &'b RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Object)
    }
}

/// What a JSON value is, by its first character (serde_json gives a value's text without the
/// whitespace around it, and only valid JSON).
#[derive(PartialEq)]
enum Kind {
    Null,
    Object,
    List,
    Text,
    Number,
    Bool,
}

fn kind(v: &RawValue) -> Kind {
    match v.get().as_bytes().first() {
        Some(b'n') => Kind::Null,
        Some(b'{') => Kind::Object,
        Some(b'[') => Kind::List,
        Some(b'"') => Kind::Text,
        Some(b't' | b'f') => Kind::Bool,
        _ => Kind::Number,
    }
}

/// `v`'s text read as a `T` (of the kind already checked).
fn read<'b, T: Deserialize<'b>>(v: &'b RawValue, field: &str) -> Result<T, String> {
    serde_json::from_str(v.get()).map_err(|e| format!("{field}: {e}"))
}

fn object<'b>(v: &'b RawValue, field: &str, what: &str) -> Result<Option<Members<'b>>, String> {
    match kind(v) {
        Kind::Null => Ok(None),
        Kind::Object => read(v, field).map(Some),
        _ => Err(format!("{field}: must be {what} (a JSON object)")),
    }
}

fn list<'b>(v: &'b RawValue, field: &str) -> Result<Vec<&'b RawValue>, String> {
    match kind(v) {
        Kind::Null => Ok(Vec::new()),
        Kind::List => read(v, field),
        _ => Err(format!("{field}: must be a list")),
    }
}

fn string(v: &RawValue, field: &str) -> Result<String, String> {
    match kind(v) {
        Kind::Null => Ok(String::new()),
        Kind::Text => read(v, field),
        _ => Err(format!("{field}: must be a string")),
    }
}

/// The whole number `text` stands for, if it is one, as protojson reads a JSON number into an
/// integer field: `text` must be a JSON number exactly (`-`, no `+`, no leading zero, no
/// whitespace), worked out in decimal, not through a float: a fraction and an exponent are
/// allowed when the value is whole (`1.0`, `1e2`, `15e-1` is not, `-0` is 0), and an exponent
/// that takes the digits before the point past 20 is refused even when the value would fit.
/// `None` for anything else, and for a magnitude of 2^64 or more.
fn integer(text: &str) -> Option<i128> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    // The digits before the point: `0`, or a first digit other than 0 and any after it.
    let whole_len = digits(rest);
    if whole_len == 0 || (whole_len > 1 && rest.starts_with('0')) {
        return None;
    }
    let (whole, rest) = rest.split_at(whole_len);
    let whole = whole.trim_start_matches('0'); // a lone 0 counts no digit, as in protojson
    let (fraction, rest) = match rest.strip_prefix('.') {
        Some(after) => {
            let n = digits(after);
            if n == 0 {
                return None;
            }
            (after[..n].trim_end_matches('0'), &after[n..])
        }
        None => ("", rest),
    };
    let exponent = match rest.strip_prefix(['e', 'E']) {
        Some(after) => {
            let unsigned = after.strip_prefix(['+', '-']).unwrap_or(after);
            if unsigned.is_empty() || digits(unsigned) != unsigned.len() {
                return None;
            }
            Some(after)
        }
        None if rest.is_empty() => None,
        None => return None,
    };
    if whole.is_empty() && fraction.is_empty() {
        return Some(0); // 0, -0.0, 0e99999999999: zero whatever the exponent
    }
    // protojson reads the exponent as a 32-bit integer.
    let exponent: i64 = match exponent {
        Some(e) => i32::try_from(e.parse::<i64>().ok()?).ok()?.into(),
        None => 0,
    };
    let mut number = String::with_capacity(20);
    if exponent >= 0 {
        // The fraction's digits move before the point; zeros pad the rest.
        if fraction.len() as i64 > exponent || whole.len() as i64 + exponent > 20 {
            return None;
        }
        number.push_str(whole);
        number.push_str(fraction);
        number.extend(std::iter::repeat_n(
            '0',
            (exponent - fraction.len() as i64) as usize,
        ));
    } else {
        // The last digits before the point move after it: they must be zeros.
        let point = whole.len() as i64 + exponent;
        if !fraction.is_empty() || point < 0 {
            return None;
        }
        let (kept, moved) = whole.split_at(point as usize);
        if moved.bytes().any(|b| b != b'0') {
            return None;
        }
        number.push_str(kept);
    }
    let magnitude = i128::from(number.parse::<u64>().ok()?);
    Some(if negative { -magnitude } else { magnitude })
}

/// A number field's value as its text: a JSON number's own, or a string's content.
fn number_text(v: &RawValue, field: &str) -> Result<Option<String>, String> {
    Ok(match kind(v) {
        Kind::Number => Some(v.get().to_owned()),
        Kind::Text => Some(read(v, field)?),
        _ => None,
    })
}

/// An unsigned integer up to `max`: a JSON number or a string of one, as proto3 JSON writes
/// 64-bit integers, read as [`integer`] reads it.
fn unsigned(v: &RawValue, field: &str, max: u64) -> Result<u64, String> {
    if kind(v) == Kind::Null {
        return Ok(0);
    }
    (number_text(v, field)?.as_deref())
        .and_then(integer)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n <= max)
        .ok_or_else(|| format!("{field}: must be a whole number from 0 to {max}"))
}

fn unit(v: &RawValue, field: &str) -> Result<i32, String> {
    match kind(v) {
        Kind::Null => Ok(Unit::Unknown as i32),
        Kind::Text => {
            let name: String = read(v, field)?;
            UNITS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, u)| u as i32)
                .ok_or_else(|| {
                    format!(
                        "{field}: unknown unit '{name}': expected UNKNOWN, SECOND, MINUTE, HOUR, DAY, MONTH or YEAR"
                    )
                })
        }
        // A number as `integer` reads it (protojson takes `2.0` for 2 here too).
        Kind::Number => integer(v.get())
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| format!("{field}: must be a unit's name or number")),
        _ => Err(format!("{field}: must be a unit's name or number")),
    }
}

const UNITS: [(&str, Unit); 7] = [
    ("UNKNOWN", Unit::Unknown),
    ("SECOND", Unit::Second),
    ("MINUTE", Unit::Minute),
    ("HOUR", Unit::Hour),
    ("DAY", Unit::Day),
    ("MONTH", Unit::Month),
    ("YEAR", Unit::Year),
];

fn unknown(field: &str, message: &str) -> String {
    format!("{field}: unknown field of {message}")
}

/// The fields of one object met so far, each as `(its JSON name, the name it was given by)`.
#[derive(Default)]
struct Seen<'n>(Vec<(&'static str, &'n str)>);

impl<'n> Seen<'n> {
    /// Refuses the field `json_name`, given as `name` at `field`, if the object gave it before,
    /// under either of its names (protojson refuses a duplicate field, and takes the JSON name
    /// and the proto name for one field).
    fn once(&mut self, json_name: &'static str, name: &'n str, field: &str) -> Result<(), String> {
        match self.0.iter().find(|(j, _)| *j == json_name) {
            Some((_, before)) if *before == name => Err(format!("{field}: given twice")),
            Some((_, before)) => Err(format!(
                "{field}: given twice, as '{before}' and as '{name}' (one field's two names)"
            )),
            None => {
                self.0.push((json_name, name));
                Ok(())
            }
        }
    }
}

/// A `RateLimitRequest` from its proto3 JSON mapping; the error names the field.
pub(super) fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let root: &RawValue =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let map = object(root, "the body", "a RateLimitRequest")?
        .ok_or("the body must be a RateLimitRequest (a JSON object), not null")?;
    let mut request = RateLimitRequest::default();
    let mut seen = Seen::default();
    for (name, v) in &map.0 {
        match name.as_str() {
            "domain" => {
                seen.once("domain", name, name)?;
                request.domain = string(v, "domain")?;
            }
            "descriptors" => {
                seen.once("descriptors", name, name)?;
                for (i, d) in list(v, "descriptors")?.into_iter().enumerate() {
                    request
                        .descriptors
                        .push(parse_descriptor(d, &format!("descriptors[{i}]"))?);
                }
            }
            "hitsAddend" | "hits_addend" => {
                seen.once("hitsAddend", name, name)?;
                request.hits_addend = unsigned(v, name, u64::from(u32::MAX))? as u32;
            }
            other => return Err(unknown(other, "RateLimitRequest")),
        }
    }
    Ok(request)
}

fn parse_descriptor(v: &RawValue, path: &str) -> Result<RateLimitDescriptor, String> {
    let mut descriptor = RateLimitDescriptor::default();
    // A list's element: `null` is not a descriptor (protojson refuses it).
    let Some(map) = object(v, path, "a descriptor")? else {
        return Err(format!(
            "{path}: must be a descriptor (a JSON object), not null"
        ));
    };
    let mut seen = Seen::default();
    for (name, v) in &map.0 {
        let field = join(path, name);
        match name.as_str() {
            "entries" => {
                seen.once("entries", name, &field)?;
                for (i, e) in list(v, &field)?.into_iter().enumerate() {
                    descriptor
                        .entries
                        .push(parse_entry(e, &format!("{field}[{i}]"))?);
                }
            }
            "limit" => {
                seen.once("limit", name, &field)?;
                descriptor.limit = match object(v, &field, "a limit override")? {
                    None => None,
                    Some(map) => Some(parse_override(&map, &field)?),
                };
            }
            "hitsAddend" | "hits_addend" => {
                seen.once("hitsAddend", name, &field)?;
                descriptor.hits_addend = match kind(v) {
                    Kind::Null => None,
                    _ => Some(UInt64Value {
                        value: unsigned(v, &field, u64::MAX)?,
                    }),
                };
            }
            other => return Err(unknown(&join(path, other), "a descriptor")),
        }
    }
    Ok(descriptor)
}

fn parse_entry(v: &RawValue, path: &str) -> Result<Entry, String> {
    let mut entry = Entry::default();
    // A list's element: `null` is not an entry (protojson refuses it).
    let Some(map) = object(v, path, "an entry")? else {
        return Err(format!(
            "{path}: must be an entry (a JSON object), not null"
        ));
    };
    let mut seen = Seen::default();
    for (name, v) in &map.0 {
        let field = join(path, name);
        match name.as_str() {
            "key" => {
                seen.once("key", name, &field)?;
                entry.key = string(v, &field)?;
            }
            "value" => {
                seen.once("value", name, &field)?;
                entry.value = string(v, &field)?;
            }
            other => return Err(unknown(&join(path, other), "an entry")),
        }
    }
    Ok(entry)
}

fn parse_override(map: &Members<'_>, path: &str) -> Result<RateLimitOverride, String> {
    let mut limit = RateLimitOverride::default();
    let mut seen = Seen::default();
    for (name, v) in &map.0 {
        let field = join(path, name);
        match name.as_str() {
            "requestsPerUnit" | "requests_per_unit" => {
                seen.once("requestsPerUnit", name, &field)?;
                limit.requests_per_unit = unsigned(v, &field, u64::from(u32::MAX))? as u32;
            }
            "unit" => {
                seen.once("unit", name, &field)?;
                limit.unit = unit(v, &field)?;
            }
            other => return Err(unknown(&join(path, other), "a limit override")),
        }
    }
    Ok(limit)
}

// ---------------------------------------------------------------------------------------------
// The response, in the proto3 JSON mapping, as protojson writes it

/// An enum's name; `null` for its default (0), which protojson leaves out.
fn code(code: i32) -> Value {
    match Code::try_from(code) {
        Ok(Code::Unknown) => Value::Null,
        Ok(Code::Ok) => "OK".into(),
        Ok(Code::OverLimit) => "OVER_LIMIT".into(),
        // An enum value without a name is written as its number.
        Err(_) => code.into(),
    }
}

fn unit_name(unit: i32) -> Value {
    match UNITS.iter().find(|&&(_, u)| u as i32 == unit) {
        Some((_, Unit::Unknown)) => Value::Null,
        Some((name, _)) => (*name).into(),
        None => unit.into(),
    }
}

/// A Duration as protojson writes it: seconds, with 0, 3, 6 or 9 digits of fraction, and `s`.
fn duration(d: &ProtoDuration) -> Value {
    let (seconds, nanos) = (d.seconds, d.nanos);
    let sign = if seconds < 0 || nanos < 0 { "-" } else { "" };
    let (seconds, nanos) = (seconds.unsigned_abs(), nanos.unsigned_abs());
    let text = if nanos == 0 {
        format!("{sign}{seconds}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{sign}{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{sign}{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{sign}{seconds}.{nanos:09}s")
    };
    text.into()
}

/// Inserts `value` under `name` unless it is the field's default (protojson leaves those out):
/// null (an enum's 0), 0, an empty string or list.
fn put(map: &mut Map<String, Value>, name: &str, value: Value) {
    let default = match &value {
        Value::Null => true,
        Value::Number(n) => n.as_u64() == Some(0) || n.as_i64() == Some(0),
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Bool(b) => !b,
        Value::Object(_) => false,
    };
    if !default {
        map.insert(name.to_owned(), value);
    }
}

fn render_limit(limit: &RateLimit) -> Value {
    let mut map = Map::new();
    put(&mut map, "name", limit.name.clone().into());
    put(&mut map, "requestsPerUnit", limit.requests_per_unit.into());
    put(&mut map, "unit", unit_name(limit.unit));
    Value::Object(map)
}

fn render_status(status: &DescriptorStatus) -> Value {
    let mut map = Map::new();
    put(&mut map, "code", code(status.code));
    if let Some(limit) = &status.current_limit {
        map.insert("currentLimit".to_owned(), render_limit(limit));
    }
    put(&mut map, "limitRemaining", status.limit_remaining.into());
    if let Some(d) = &status.duration_until_reset {
        map.insert("durationUntilReset".to_owned(), duration(d));
    }
    Value::Object(map)
}

fn render_headers(headers: &[HeaderValue]) -> Value {
    headers
        .iter()
        .map(|h| {
            let mut map = Map::new();
            put(&mut map, "key", h.key.clone().into());
            put(&mut map, "value", h.value.clone().into());
            Value::Object(map)
        })
        .collect()
}

/// A `RateLimitResponse` in its proto3 JSON mapping. `raw_body` is never set by this service
/// and is not written.
pub(super) fn render_response(response: &RateLimitResponse) -> Value {
    let mut map = Map::new();
    put(&mut map, "overallCode", code(response.overall_code));
    put(
        &mut map,
        "statuses",
        response.statuses.iter().map(render_status).collect(),
    );
    put(
        &mut map,
        "responseHeadersToAdd",
        render_headers(&response.response_headers_to_add),
    );
    put(
        &mut map,
        "requestHeadersToAdd",
        render_headers(&response.request_headers_to_add),
    );
    Value::Object(map)
}
