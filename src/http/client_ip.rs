//! Who the client is: the peer address, or — only when the peer is a trusted proxy — the first
//! untrusted address in the forwarding headers, walking right to left.

use ipnet::IpNet;
use serde::Deserialize;

/// A header that proxies use to pass on the client's address.
///
/// # Examples
///
/// ```
/// use turnstile::http::ForwardedHeader;
///
/// assert_ne!(ForwardedHeader::Forwarded, ForwardedHeader::XForwardedFor);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// RFC 7239 `Forwarded: for=...`.
    Forwarded,
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    XForwardedFor,
    /// `X-Real-IP: client` (one address).
    XRealIp,
    /// Another header holding a comma-separated list of addresses, such as `CF-Connecting-IP`.
    Custom(String),
}

/// How the client's IP address is determined.
///
/// # Examples
///
/// ```
/// use turnstile::http::ClientIpConfig;
///
/// let config = ClientIpConfig::default();
/// assert!(config.trusted_proxies.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClientIpConfig {
    /// Peers whose forwarding headers are believed (addresses or CIDR ranges). Empty: the peer
    /// address is always the client.
    pub trusted_proxies: Vec<IpNet>,
    /// The headers read from a trusted peer, in order of preference.
    pub headers: Vec<ForwardedHeader>,
    /// IPv4 clients are grouped by this prefix length (32: each address is its own client).
    pub ipv4_prefix: u8,
    /// IPv6 clients are grouped by this prefix length (for example 64: one client per /64).
    pub ipv6_prefix: u8,
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        ClientIpConfig {
            trusted_proxies: Vec::new(),
            headers: vec![
                ForwardedHeader::Forwarded,
                ForwardedHeader::XForwardedFor,
                ForwardedHeader::XRealIp,
            ],
            ipv4_prefix: 32,
            ipv6_prefix: 128,
        }
    }
}
