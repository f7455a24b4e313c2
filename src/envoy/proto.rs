//! The messages of Envoy's rate limit service API (`envoy.service.ratelimit.v3`), written by hand
//! with the field numbers and types of Envoy's `.proto` files, so that no `protoc` is needed.
//!
//! Only the fields this service reads or writes are declared; prost skips the others when it
//! decodes, so a request from a newer Envoy with fields unknown here still decodes.
//!
//! Envoy nests some of these messages (`RateLimitResponse.DescriptorStatus`,
//! `RateLimitDescriptor.Entry`, ...); here they are flat, named after their last component.

/// `envoy.service.ratelimit.v3.RateLimitRequest`: what Envoy's rate limit filter asks.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{Entry, RateLimitDescriptor, RateLimitRequest};
///
/// let request = RateLimitRequest {
///     domain: "mongo_cps".into(),
///     descriptors: vec![RateLimitDescriptor {
///         entries: vec![Entry { key: "database".into(), value: "users".into() }],
///         ..Default::default()
///     }],
///     hits_addend: 0, // 0 counts as 1, as in Envoy
/// };
/// assert_eq!(request.descriptors.len(), 1);
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The configuration domain the descriptors are looked up in (field 1).
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors to limit on; the request is over limit if any of them is (field 2).
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// How many hits the request adds to each matched limit; 0 (unset) means 1 (field 3).
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`: a list of key/value entries, with
/// an optional limit override and an optional per-descriptor hits addend.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{Entry, RateLimitDescriptor, UInt64Value};
///
/// let descriptor = RateLimitDescriptor {
///     entries: vec![Entry { key: "remote_address".into(), value: "10.0.0.1".into() }],
///     limit: None,
///     hits_addend: Some(UInt64Value { value: 5 }), // this descriptor costs 5
/// };
/// assert_eq!(descriptor.entries[0].key, "remote_address");
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The entries, outermost first (field 1).
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit to apply instead of the configured one (field 2).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// The hits this descriptor adds, overriding the request's `hits_addend`; an explicit 0 only
    /// checks (field 3, a `google.protobuf.UInt64Value`).
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry`: one key/value pair.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::Entry;
///
/// let entry = Entry { key: "generic_key".into(), value: "slowpath".into() };
/// assert_eq!(entry.value, "slowpath");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Entry {
    /// The descriptor key (field 1).
    #[prost(string, tag = "1")]
    pub key: String,
    /// The descriptor value (field 2).
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride`: a limit sent
/// by Envoy in place of the configured one.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{RateLimitOverride, Unit};
///
/// let limit = RateLimitOverride { requests_per_unit: 42, unit: Unit::Hour as i32 };
/// assert_eq!(limit.unit(), Unit::Hour);
/// ```
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    /// Requests per unit of time (field 1).
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit of time (field 2, an `envoy.type.v3.RateLimitUnit`).
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`: an optional `u64`.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::UInt64Value;
///
/// assert_eq!(UInt64Value { value: 3 }.value, 3);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct UInt64Value {
    /// The value (field 1).
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `google.protobuf.Duration`: seconds and nanoseconds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::envoy::proto::ProtoDuration;
///
/// let d = ProtoDuration::from(Duration::from_millis(1_500));
/// assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
/// assert_eq!(Duration::try_from(d), Ok(Duration::from_millis(1_500)));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ProtoDuration {
    /// Whole seconds (field 1).
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds within the second, 0 to 999,999,999 (field 2).
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl From<std::time::Duration> for ProtoDuration {
    fn from(d: std::time::Duration) -> Self {
        ProtoDuration {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            // Below 10^9: fits in i32.
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        }
    }
}

impl TryFrom<ProtoDuration> for std::time::Duration {
    type Error = ProtoDuration;

    /// Fails (returning the input) on a negative duration or nanoseconds out of range.
    fn try_from(d: ProtoDuration) -> Result<Self, ProtoDuration> {
        match (u64::try_from(d.seconds), u32::try_from(d.nanos)) {
            (Ok(s), Ok(n)) if n < 1_000_000_000 => Ok(std::time::Duration::new(s, n)),
            _ => Err(d),
        }
    }
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`: the answer.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{Code, RateLimitResponse};
///
/// let response = RateLimitResponse { overall_code: Code::Ok as i32, ..Default::default() };
/// assert_eq!(response.overall_code(), Code::Ok);
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// `OVER_LIMIT` if any descriptor is over its limit, else `OK` (field 1).
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    /// One status per request descriptor, in order (field 2).
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for Envoy to add to the response (field 3): the rate limit headers, when the
    /// service is told to send them.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers for Envoy to add to the forwarded request (field 4). This service sends none.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// A body for Envoy to send when the code is not `OK` (field 5). This service sends none.
    #[prost(bytes = "vec", tag = "5")]
    pub raw_body: Vec<u8>,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.Code`.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::Code;
///
/// assert_eq!(Code::OverLimit as i32, 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// Not known (0).
    Unknown = 0,
    /// Under the limit (1).
    Ok = 1,
    /// Over the limit (2).
    OverLimit = 2,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus`: the answer for one
/// descriptor.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{Code, DescriptorStatus};
///
/// let status = DescriptorStatus { code: Code::OverLimit as i32, ..Default::default() };
/// assert_eq!(status.code(), Code::OverLimit);
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// This descriptor's code (field 1).
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    /// The limit applied, if any (field 2).
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// Hits left in the current window (field 3).
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// Time until the current window ends (field 4).
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<ProtoDuration>,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit`: a limit as configured.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{RateLimit, Unit};
///
/// let limit = RateLimit { name: String::new(), requests_per_unit: 1, unit: Unit::Second as i32 };
/// assert_eq!(limit.unit(), Unit::Second);
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    /// The limit's `name` in the configuration, if it has one (field 3).
    #[prost(string, tag = "3")]
    pub name: String,
    /// Requests per unit of time (field 1).
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit of time (field 2).
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`, whose numbers
/// `envoy.type.v3.RateLimitUnit` (the override's unit) shares.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::Unit;
///
/// assert_eq!(Unit::Minute as i32, 2);
/// assert_eq!(Unit::try_from(6), Ok(Unit::Year));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    /// Not known (0).
    Unknown = 0,
    /// A second (1).
    Second = 1,
    /// A minute (2).
    Minute = 2,
    /// An hour (3).
    Hour = 3,
    /// A day (4).
    Day = 4,
    /// A month, counted as 30 days as Envoy's service does (5).
    Month = 5,
    /// A year, counted as 365 days as Envoy's service does (6).
    Year = 6,
}

impl Unit {
    /// The unit's length, which is also the length of its fixed window; `None` for `Unknown`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::envoy::proto::Unit;
    ///
    /// assert_eq!(Unit::Hour.duration(), Some(Duration::from_secs(3_600)));
    /// assert_eq!(Unit::Unknown.duration(), None);
    /// ```
    pub fn duration(self) -> Option<std::time::Duration> {
        let secs = match self {
            Unit::Unknown => return None,
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        };
        Some(std::time::Duration::from_secs(secs))
    }
}

/// `envoy.config.core.v3.HeaderValue`: a header name and value.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::HeaderValue;
///
/// let h = HeaderValue { key: "x-ratelimit-limit".into(), value: "10".into() };
/// assert_eq!(h.key, "x-ratelimit-limit");
/// ```
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderValue {
    /// The header name (field 1).
    #[prost(string, tag = "1")]
    pub key: String,
    /// The header value (field 2).
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `grpc.health.v1.HealthCheckRequest`: the service whose health is asked, `""` for the
/// server as a whole.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::HealthCheckRequest;
///
/// let request = HealthCheckRequest { service: "ratelimit".into() };
/// assert_eq!(request.service, "ratelimit");
/// ```
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HealthCheckRequest {
    /// The service name (field 1).
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`: the service's serving status.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::{HealthCheckResponse, ServingStatus};
///
/// let response = HealthCheckResponse { status: ServingStatus::Serving as i32 };
/// assert_eq!(response.status(), ServingStatus::Serving);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct HealthCheckResponse {
    /// The status (field 1), a [`ServingStatus`].
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::proto::ServingStatus;
///
/// assert_eq!(ServingStatus::NotServing as i32, 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    /// Not known.
    Unknown = 0,
    /// Serving requests.
    Serving = 1,
    /// Not serving requests (draining, or otherwise unhealthy).
    NotServing = 2,
    /// The asked service is not known (used by `Watch`, not by `Check`).
    ServiceUnknown = 3,
}
