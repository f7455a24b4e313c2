//! The configuration model of the HTTP layer, its loaders (TOML, JSON, YAML) and validation.
//! PLACEHOLDER: the http-engine branch replaces this file.

use crate::http::{ClientIpConfig, ResponseConfig};

/// The whole configuration of an [`HttpLimiter`](crate::http::HttpLimiter).
///
/// # Examples
///
/// ```
/// let _ = turnstile::http::HttpConfig::default();
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct HttpConfig {
    /// How the client's IP address is found.
    pub client_ip: ClientIpConfig,
    /// The header carrying the client id.
    pub client_id_header: Option<String>,
    /// How rejections look.
    pub response: ResponseConfig,
}
