//! The responses: 429 (configurable) with `Retry-After`, an `application/problem+json` body, and
//! the IETF `RateLimit` / `RateLimit-Policy` headers (legacy `X-RateLimit-*` as an option).

use serde::Deserialize;

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
        }
    }
}
