//! Who the client is: the peer address, or — only when the peer is a trusted proxy — the first
//! untrusted address in the forwarding headers, walking right to left.

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::ControlFlow;

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
    /// address is always the client. IPv4-mapped IPv6 addresses and ranges (`::ffff:10.0.0.0/104`)
    /// match the IPv4 addresses they map, and the reverse.
    #[serde(deserialize_with = "deserialize_nets")]
    pub trusted_proxies: Vec<IpNet>,
    /// The headers read from a trusted peer, in order of preference: the first one present in
    /// the request decides. Default: `X-Forwarded-For` only, the header that nginx, HAProxy,
    /// Envoy, Traefik, Caddy and the cloud load balancers append to. Empty only while no proxy
    /// is trusted (refused otherwise: every client behind a proxy would count as the proxy).
    ///
    /// List only headers that your trusted proxies write (set or append to). A header they pass
    /// on untouched is written by the client: behind a proxy that appends to `X-Forwarded-For`
    /// but forwards `Forwarded` as it came, listing `Forwarded` first would let any client pick
    /// its own key by sending `Forwarded: for=<any address>`.
    pub headers: Vec<ForwardedHeader>,
    /// IPv4 clients are grouped by this prefix length (32: each address is its own client).
    /// A group is one client everywhere: whitelist, blocklist and IP rule entries must be
    /// whole groups (an entry inside one is refused when the configuration loads).
    pub ipv4_prefix: u8,
    /// IPv6 clients are grouped by this prefix length (for example 64: one client per /64),
    /// with the same consequence for the lists and IP rules.
    pub ipv6_prefix: u8,
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        ClientIpConfig {
            trusted_proxies: Vec::new(),
            // One header, not a list of every header some proxy writes: with several, the
            // first present decides, and one the proxy does not write is the client's to fill.
            headers: vec![ForwardedHeader::XForwardedFor],
            ipv4_prefix: 32,
            ipv6_prefix: 128,
        }
    }
}

/// Parses a trusted proxy: a CIDR range (`10.0.0.0/8`) or a bare address (`10.0.0.1`, taken as
/// the single-address range).
fn parse_net(text: &str) -> Option<IpNet> {
    let text = text.trim();
    if let Ok(net) = text.parse::<IpNet>() {
        return Some(net);
    }
    text.parse::<IpAddr>().ok().map(IpNet::from)
}

fn deserialize_nets<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    let texts = Vec::<String>::deserialize(deserializer)?;
    texts
        .iter()
        .map(|text| {
            parse_net(text).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "trusted_proxies: `{text}` is neither an IP address nor a CIDR range"
                ))
            })
        })
        .collect()
}

impl ClientIpConfig {
    /// The prefix length that groups addresses of `ip`'s family (capped at the family's
    /// width).
    pub(crate) fn prefix_of(&self, ip: IpAddr) -> u8 {
        match ip {
            IpAddr::V4(_) => self.ipv4_prefix.min(32),
            IpAddr::V6(_) => self.ipv6_prefix.min(128),
        }
    }

    /// Checks the prefix lengths (`ipv4_prefix` at most 32, `ipv6_prefix` at most 128) and that
    /// every custom forwarding header is a valid header name. The error names the field.
    ///
    /// # Errors
    ///
    /// A message naming the field that is wrong: a prefix out of range, a header that is no
    /// header name, or no header at all while proxies are trusted.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::http::ClientIpConfig;
    ///
    /// let mut config = ClientIpConfig::default();
    /// assert!(config.validate().is_ok());
    /// config.ipv6_prefix = 129;
    /// assert!(config.validate().unwrap_err().contains("ipv6_prefix"));
    /// config.ipv6_prefix = 64;
    /// config.headers = vec![turnstile::http::ForwardedHeader::Custom("X Real IP".into())];
    /// assert!(config.validate().unwrap_err().starts_with("headers[0]"));
    /// config.headers = Vec::new(); // no proxy trusted: the peer is the client
    /// assert!(config.validate().is_ok());
    /// config.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    /// assert!(config.validate().unwrap_err().starts_with("headers: empty"));
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        if self.ipv4_prefix > 32 {
            return Err(format!("ipv4_prefix: {} is more than 32", self.ipv4_prefix));
        }
        if self.ipv6_prefix > 128 {
            return Err(format!(
                "ipv6_prefix: {} is more than 128",
                self.ipv6_prefix
            ));
        }
        // A name that is no header name can never be read: the client would always be the
        // proxy, and every client behind it would share one key.
        for (i, header) in self.headers.iter().enumerate() {
            if let ForwardedHeader::Custom(name) = header
                && http::HeaderName::from_bytes(name.as_bytes()).is_err()
            {
                return Err(format!("headers[{i}]: {name:?} is not a valid header name"));
            }
        }
        // Likewise with no header to read: the proxies' trust would do nothing.
        if self.headers.is_empty() && !self.trusted_proxies.is_empty() {
            return Err(
                "headers: empty, so the address a trusted proxy forwards is never read and every \
                 client behind it counts as the proxy: name the header it writes (for example \
                 x-forwarded-for), or trust no proxy"
                    .to_owned(),
            );
        }
        Ok(())
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted_proxies
            .iter()
            .any(|net| canonical_net(*net).contains(&ip))
    }
}

/// A range of IPv4-mapped IPv6 addresses (`::ffff:10.0.0.0/104`) is the IPv4 range
/// (`10.0.0.0/8`), as addresses are compared in their [`canonical`] form.
pub(crate) fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && let (Some(v4), Some(len)) = (
            v6.network().to_ipv4_mapped(),
            v6.prefix_len().checked_sub(96),
        )
        && let Ok(v4net) = ipnet::Ipv4Net::new(v4, len)
    {
        return IpNet::V4(v4net);
    }
    net
}

/// An IPv4-mapped IPv6 address (`::ffff:1.2.3.4`, as dual-stack sockets report IPv4 peers) is
/// the IPv4 address.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The client's address, grouped by prefix.
///
/// If `peer` is not a trusted proxy (or is unknown), the peer's address is the client and the
/// headers are ignored: a forwarding header from an untrusted peer never changes the key. If the
/// peer is trusted, the configured headers are read in order; the first one present decides.
/// Its addresses (all its lines, comma-separated; empty list elements are ignored, as RFC 9110
/// asks) are walked right to left, skipping trusted proxies; the first untrusted address is the
/// client, or the leftmost when every entry is trusted. An entry that cannot be parsed (garbage,
/// `Forwarded`'s `unknown` and obfuscated identifiers, or a `Forwarded` element with a quote
/// left open at the end of its line) where the walk reaches it stops the walk, and the peer is
/// the client: what a trusted proxy could not vouch for is not believed.
///
/// The result is masked to `ipv4_prefix` / `ipv6_prefix` (prefixes above 32 / 128 are taken as
/// 32 / 128).
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use turnstile::http::{client_ip, ClientIpConfig};
///
/// let mut config = ClientIpConfig::default();
/// config.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
/// let mut headers = HeaderMap::new();
/// headers.insert("x-forwarded-for", "203.0.113.9, 10.0.0.2".parse().unwrap());
///
/// let proxy = Some("10.0.0.1".parse().unwrap());
/// assert_eq!(client_ip(proxy, &headers, &config), Some("203.0.113.9".parse().unwrap()));
/// // From an untrusted peer the header is ignored.
/// let direct = Some("198.51.100.1".parse().unwrap());
/// assert_eq!(client_ip(direct, &headers, &config), direct);
/// ```
pub fn client_ip(
    peer: Option<IpAddr>,
    headers: &http::HeaderMap,
    config: &ClientIpConfig,
) -> Option<IpAddr> {
    let peer = canonical(peer?);
    let chosen = if config.is_trusted(peer) {
        from_headers(headers, config).unwrap_or(peer)
    } else {
        peer
    };
    Some(mask(chosen, config))
}

/// The address the configured headers name, or `None` (no header present, or a stop).
///
/// Lazily, right to left: the walk parses an entry only when it gets to it and stops at the
/// first untrusted address, so what a client wrote to the left of it (which a proxy that
/// appends passes on, up to the server's header limit) costs a scan for commas, not a parse per
/// entry. Parsing every entry first cost 56 µs for 1,000 spoofed `X-Forwarded-For` entries
/// beside 0.25 µs for the honest two (BENCHMARKS.md, "The client address behind a proxy").
fn from_headers(headers: &http::HeaderMap, config: &ClientIpConfig) -> Option<IpAddr> {
    for header in &config.headers {
        let name: &str = match header {
            ForwardedHeader::Forwarded => "forwarded",
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::XRealIp => "x-real-ip",
            ForwardedHeader::Custom(name) => name.as_str(),
        };
        let lines = headers.get_all(name);
        let mut lines = lines.iter().rev().peekable();
        if lines.peek().is_none() {
            continue;
        }
        let mut walk = Walk {
            config,
            leftmost: None,
        };
        for line in lines {
            // Bytes, not text: a line is scanned only as far as the walk goes, and a byte above
            // 0x7f (obs-text), in no address, hides none of the addresses beside it, which a
            // trusted proxy may have appended; an entry holding one is unparseable.
            let line = line.as_bytes();
            let stop = match header {
                ForwardedHeader::Forwarded => walk.forwarded_line(line),
                _ => line
                    .rsplit(|&b| b == b',')
                    .filter(|element| !blank(element))
                    .try_for_each(|element| walk.step(parse_bytes(element))),
            };
            if let ControlFlow::Break(found) = stop {
                return found;
            }
        }
        return walk.leftmost;
    }
    None
}

/// A walk over a forwarding header's entries, right to left.
struct Walk<'a> {
    config: &'a ClientIpConfig,
    /// The leftmost entry seen, all of them trusted so far: the client if none is untrusted.
    leftmost: Option<IpAddr>,
}

impl Walk<'_> {
    /// The next entry to the left (`None`: unparseable): stops at the first untrusted address,
    /// the client, and at an unparseable entry (`None`: the peer is the client).
    fn step(&mut self, entry: Option<IpAddr>) -> ControlFlow<Option<IpAddr>> {
        let Some(ip) = entry else {
            return ControlFlow::Break(None);
        };
        let ip = canonical(ip);
        if !self.config.is_trusted(ip) {
            return ControlFlow::Break(Some(ip));
        }
        self.leftmost = Some(ip);
        ControlFlow::Continue(())
    }

    /// The `for=` values of an RFC 7239 `Forwarded` line, right to left, one entry per
    /// forwarded element (an element without `for=` is an unparseable entry; an empty list
    /// element is no element).
    ///
    /// A quoted-string still open at the end of the line makes its element, the last, an
    /// unparseable entry: the line is malformed there, and the open quote may have swallowed
    /// the element that a proxy appended to the line (`for=1.2.3.4;x="` from the client, then
    /// `, for=<the client's address>` from the proxy), leaving the client's `for=` in its
    /// place. Quotes are known only from the left, so the line is split first (a scan, no
    /// parse) and its elements parsed from the right.
    fn forwarded_line(&mut self, line: &[u8]) -> ControlFlow<Option<IpAddr>> {
        let (elements, unterminated) = split_outside_quotes(line, b',');
        if unterminated {
            return ControlFlow::Break(None);
        }
        elements
            .into_iter()
            .rev()
            .filter(|element| !blank(element))
            .try_for_each(|element| self.step(forwarded_for(element)))
    }
}

/// Whether a list element is empty or white space (Unicode's, as `str::trim` reads it): no
/// element at all. Bytes that are no UTF-8 are not white space.
fn blank(element: &[u8]) -> bool {
    std::str::from_utf8(element).is_ok_and(|text| text.trim().is_empty())
}

/// [`parse_node`] of an entry's bytes: `None` unless they are UTF-8.
fn parse_bytes(entry: &[u8]) -> Option<IpAddr> {
    parse_node(std::str::from_utf8(entry).ok()?)
}

/// The address of a `Forwarded` element's `for=` parameter; `None` without one, or if it is
/// no address.
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    for pair in split_outside_quotes(element, b';').0 {
        let Some(eq) = memchr::memchr(b'=', pair) else {
            continue;
        };
        let (name, value) = (&pair[..eq], &pair[eq + 1..]);
        if std::str::from_utf8(name).is_ok_and(|name| name.trim().eq_ignore_ascii_case("for")) {
            return parse_node(&unquote(std::str::from_utf8(value).ok()?.trim()));
        }
    }
    None
}

/// Splits on `separator` (ASCII) outside double quotes; `true` with the parts when a
/// quoted-string is still open at the end. A quoted-pair (`\x`) inside quotes escapes its
/// character (its first byte skipped, and the others, if it is UTF-8, are no byte searched
/// for). Byte by byte with `memchr`, jumping from one byte that matters to the next: the
/// line comes from the client, up to the server's header limit, and is scanned whole (quotes
/// are known only from the left).
fn split_outside_quotes(bytes: &[u8], separator: u8) -> (Vec<&[u8]>, bool) {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    let mut at = 0;
    loop {
        let next = if quoted {
            memchr::memchr2(b'"', b'\\', &bytes[at..])
        } else {
            memchr::memchr2(b'"', separator, &bytes[at..])
        };
        let Some(offset) = next else {
            break;
        };
        let i = at + offset;
        at = i + 1;
        match bytes[i] {
            // A quoted-pair: the escaped byte is skipped.
            b'\\' => at = (i + 2).min(bytes.len()),
            b'"' => quoted = !quoted,
            _ => {
                parts.push(&bytes[start..i]);
                start = i + 1;
            }
        }
    }
    parts.push(&bytes[start..]);
    (parts, quoted)
}

/// A value as it reads: a quoted-string (RFC 7230) without its quotes and with each quoted-pair
/// (`\x`) as the character it escapes; a token as it is.
fn unquote(value: &str) -> Cow<'_, str> {
    let Some(inside) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return Cow::Borrowed(value);
    };
    if !inside.contains('\\') {
        return Cow::Borrowed(inside);
    }
    let mut out = String::with_capacity(inside.len());
    let mut chars = inside.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// One node: `1.2.3.4`, `1.2.3.4:8080`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:4711`.
/// `unknown`, obfuscated identifiers (`_hidden`) and anything else: `None`.
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || is_port(after.strip_prefix(':')?)) {
            return None;
        }
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, port) = text.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// A port: digits (RFC 7239 also allows obfuscated ports, `_abc`).
fn is_port(text: &str) -> bool {
    !text.is_empty()
        && (text.bytes().all(|b| b.is_ascii_digit())
            || (text.starts_with('_')
                && text[1..]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')))
}

fn mask(ip: IpAddr, config: &ClientIpConfig) -> IpAddr {
    mask_to(ip, config.prefix_of(ip))
}

/// `ip`'s network of `prefix` bits (at most the family's width: more is the whole address), as
/// an address.
pub(crate) fn mask_to(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        // The usual configuration: whole addresses.
        IpAddr::V4(_) if prefix >= 32 => ip,
        IpAddr::V6(_) if prefix >= 128 => ip,
        IpAddr::V4(v4) => {
            let prefix = u32::from(prefix);
            let bits = u32::from(v4);
            let masked = if prefix == 0 {
                0
            } else {
                bits & (u32::MAX << (32 - prefix))
            };
            IpAddr::V4(Ipv4Addr::from(masked))
        }
        IpAddr::V6(v6) => {
            let prefix = u32::from(prefix);
            let bits = u128::from(v6);
            let masked = if prefix == 0 {
                0
            } else {
                bits & (u128::MAX << (128 - prefix))
            };
            IpAddr::V6(Ipv6Addr::from(masked))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// The three standard headers, `Forwarded` preferred: what these tests parse.
    fn all_three() -> Vec<ForwardedHeader> {
        vec![
            ForwardedHeader::Forwarded,
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::XRealIp,
        ]
    }

    fn trusting(nets: &[&str]) -> ClientIpConfig {
        ClientIpConfig {
            trusted_proxies: nets.iter().map(|n| parse_net(n).unwrap()).collect(),
            headers: all_three(),
            ..ClientIpConfig::default()
        }
    }

    #[test]
    fn by_default_only_x_forwarded_for_is_read() {
        // Behind a proxy that appends to X-Forwarded-For and forwards the rest as they came,
        // the client's own `Forwarded` and `X-Real-IP` must not choose its key.
        let config = ClientIpConfig {
            trusted_proxies: vec![parse_net("10.0.0.0/8").unwrap()],
            ..ClientIpConfig::default()
        };
        assert_eq!(config.headers, [ForwardedHeader::XForwardedFor]);
        let peer = Some(ip("10.0.0.1"));
        let h = headers(&[
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "7.7.7.7"),
            ("x-forwarded-for", "8.8.8.8, 203.0.113.9"),
        ]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("203.0.113.9")));
        // Without X-Forwarded-For the peer is the client, whatever else was sent.
        let h = headers(&[("forwarded", "for=6.6.6.6"), ("x-real-ip", "7.7.7.7")]);
        assert_eq!(client_ip(peer, &h, &config), peer);
    }

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn untrusted_peer_ignores_headers() {
        let config = trusting(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "1.1.1.1"), ("forwarded", "for=2.2.2.2")]);
        assert_eq!(
            client_ip(Some(ip("9.9.9.9")), &h, &config),
            Some(ip("9.9.9.9"))
        );
        assert_eq!(client_ip(None, &h, &config), None);
    }

    #[test]
    fn right_to_left_skipping_trusted() {
        let config = trusting(&["10.0.0.0/8", "127.0.0.1"]);
        let peer = Some(ip("127.0.0.1"));
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.1.1.1")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("203.0.113.9")));
        // Several lines are one list.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.9:4711, 10.1.1.1"),
        ]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("203.0.113.9")));
        // All trusted: the leftmost.
        let h = headers(&[("x-forwarded-for", "10.0.0.5, 10.1.1.1")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("10.0.0.5")));
        // Garbage where the walk reaches it: the peer.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, garbage, 10.1.1.1")]);
        assert_eq!(client_ip(peer, &h, &config), peer);
        // Garbage beyond the first untrusted address does not matter.
        let h = headers(&[("x-forwarded-for", "garbage, 6.6.6.6, 10.1.1.1")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("6.6.6.6")));
    }

    #[test]
    fn forwarded_rfc7239() {
        let config = trusting(&["10.0.0.0/8"]);
        let peer = Some(ip("10.0.0.1"));
        let h = headers(&[(
            "forwarded",
            r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711""#,
        )]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("2001:db8:cafe::17")));
        let h = headers(&[("forwarded", "for=192.0.2.60, for=unknown")]);
        assert_eq!(client_ip(peer, &h, &config), peer);
        let h = headers(&[("forwarded", "for=_hidden, for=\"198.51.100.17:80\"")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("198.51.100.17")));
        // Quoted-pairs stand for the characters they escape (none is needed in an address,
        // but a sender may write them).
        let h = headers(&[("forwarded", r#"for="\[2001:db8::9\]:4711", for=10.0.0.2"#)]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("2001:db8::9")));
        let h = headers(&[("forwarded", r#"for="198.51.100.\1\8""#)]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("198.51.100.18")));
        // A quoted separator does not split the element.
        let h = headers(&[("forwarded", r#"for="\"6.6.6.6, 7.7.7.7\"""#)]);
        assert_eq!(client_ip(peer, &h, &config), peer);
        // Forwarded is preferred over X-Forwarded-For when listed first.
        let h = headers(&[("x-forwarded-for", "1.1.1.1"), ("forwarded", "for=2.2.2.2")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("2.2.2.2")));
        // Absent: the next header.
        let h = headers(&[("x-real-ip", "3.3.3.3")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("3.3.3.3")));
        // None at all: the peer.
        assert_eq!(client_ip(peer, &headers(&[]), &config), peer);
    }

    #[test]
    fn custom_headers_even_invalid_names() {
        let mut config = trusting(&["10.0.0.0/8"]);
        config.headers = vec![
            ForwardedHeader::Custom("not a header name".into()),
            ForwardedHeader::Custom("CF-Connecting-IP".into()),
        ];
        let peer = Some(ip("10.0.0.1"));
        let h = headers(&[
            ("cf-connecting-ip", "192.0.2.5"),
            ("x-forwarded-for", "6.6.6.6"),
        ]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("192.0.2.5")));
        // X-Forwarded-For is not among the configured headers.
        let h = headers(&[("x-forwarded-for", "6.6.6.6")]);
        assert_eq!(client_ip(peer, &h, &config), peer);
    }

    #[test]
    fn one_line_with_a_non_ascii_byte_keeps_the_proxys_entries() {
        // A client's X-Forwarded-For with a byte above 0x7f, to which a trusted proxy appended
        // the address it saw on the same line: that address is the client.
        let config = trusting(&["10.0.0.0/8"]);
        let peer = Some(ip("10.0.0.1"));
        for (name, value) in [
            ("x-forwarded-for", &b"\xff6.6.6.6, 203.0.113.9"[..]),
            ("forwarded", &b"for=\"\xe9\", for=203.0.113.9"[..]),
        ] {
            let mut map = http::HeaderMap::new();
            map.insert(name, http::HeaderValue::from_bytes(value).unwrap());
            assert_eq!(
                client_ip(peer, &map, &config),
                Some(ip("203.0.113.9")),
                "{name}"
            );
        }
        // Where the walk reaches it, the entry with that byte still stops the walk.
        let mut map = http::HeaderMap::new();
        map.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"6.6.6.6\xff, 10.0.0.2").unwrap(),
        );
        assert_eq!(client_ip(peer, &map, &config), peer);
    }

    #[test]
    fn empty_list_elements_are_ignored() {
        // RFC 9110 5.6.1.2: a recipient ignores empty list elements.
        let config = trusting(&["10.0.0.0/8"]);
        let peer = Some(ip("10.0.0.1"));
        let h = headers(&[("x-forwarded-for", "203.0.113.9, ,10.0.0.2, ")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("203.0.113.9")));
        let h = headers(&[("forwarded", "for=203.0.113.9, , for=10.0.0.2,")]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("203.0.113.9")));
        // An element with parameters but no `for=` is not empty: it stops the walk.
        let h = headers(&[("forwarded", "for=203.0.113.9, proto=https")]);
        assert_eq!(client_ip(peer, &h, &config), peer);
    }

    #[test]
    fn ipv4_mapped_peers_and_ranges() {
        let peer = Some(ip("::ffff:10.0.0.1"));
        let h = headers(&[("x-forwarded-for", "203.0.113.9, ::ffff:10.0.0.2")]);
        // A dual-stack socket's mapped peer against an IPv4 range, and a mapped entry.
        let config = trusting(&["10.0.0.0/8"]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("203.0.113.9")));
        // The same proxies written as IPv4-mapped addresses, as such a socket reports them.
        let config = trusting(&["::ffff:10.0.0.0/104"]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("203.0.113.9")));
        assert_eq!(
            client_ip(Some(ip("10.0.0.1")), &h, &config),
            Some(ip("203.0.113.9"))
        );
        // All of IPv6 is not all of IPv4.
        let config = trusting(&["::/0"]);
        assert_eq!(client_ip(peer, &h, &config), Some(ip("10.0.0.1")));
    }

    #[test]
    fn forwarded_lines_case_whitespace_and_grouping() {
        let config = ClientIpConfig {
            ipv4_prefix: 24,
            ipv6_prefix: 64,
            ..trusting(&["10.0.0.0/8"])
        };
        let peer = Some(ip("10.0.0.1"));
        let cases: &[(&[(&str, &str)], &str)] = &[
            // Several lines are one list, the last line rightmost.
            (
                &[
                    ("forwarded", "for=6.6.6.6"),
                    ("forwarded", "for=203.0.113.9, for=10.0.0.2"),
                ],
                "203.0.113.0",
            ),
            (
                &[(
                    "forwarded",
                    " FOR=203.0.113.9 ; proto=https ,  for=10.0.0.2 ;by=x",
                )],
                "203.0.113.0",
            ),
            // Every entry trusted: the leftmost.
            (&[("forwarded", "for=10.0.0.3, for=10.0.0.2")], "10.0.0.0"),
            // Addresses from the headers are grouped too, an IPv4-mapped one as IPv4.
            (
                &[("forwarded", r#"for="[2001:db8:1:2::1]""#)],
                "2001:db8:1:2::",
            ),
            (
                &[("forwarded", r#"for="[::ffff:203.0.113.9]:80""#)],
                "203.0.113.0",
            ),
        ];
        for (h, want) in cases {
            assert_eq!(
                client_ip(peer, &headers(h), &config),
                Some(ip(want)),
                "{h:?}"
            );
        }
    }

    #[test]
    fn nodes() {
        assert_eq!(parse_node(" 1.2.3.4:8080 "), Some(ip("1.2.3.4")));
        assert_eq!(parse_node("[::1]:80"), Some(ip("::1")));
        assert_eq!(parse_node("[::1]"), Some(ip("::1")));
        assert_eq!(parse_node("::1"), Some(ip("::1")));
        assert_eq!(parse_node("[::1]x"), None);
        assert_eq!(parse_node("1.2.3.4:"), None);
        assert_eq!(parse_node("unknown"), None);
    }

    #[test]
    fn prefixes_group() {
        let config = ClientIpConfig {
            ipv4_prefix: 24,
            ipv6_prefix: 64,
            ..ClientIpConfig::default()
        };
        let none = headers(&[]);
        assert_eq!(
            client_ip(Some(ip("2001:db8:1:2:aaaa::1")), &none, &config),
            Some(ip("2001:db8:1:2::"))
        );
        assert_eq!(
            client_ip(Some(ip("192.0.2.77")), &none, &config),
            Some(ip("192.0.2.0"))
        );
        let zero = ClientIpConfig {
            ipv4_prefix: 0,
            ipv6_prefix: 0,
            ..ClientIpConfig::default()
        };
        assert_eq!(
            client_ip(Some(ip("192.0.2.77")), &none, &zero),
            Some(ip("0.0.0.0"))
        );
        assert_eq!(
            client_ip(Some(ip("::ffff:192.0.2.77")), &none, &config),
            Some(ip("192.0.2.0"))
        );
    }

    #[test]
    fn validate_names_fields() {
        let config = ClientIpConfig {
            ipv4_prefix: 33,
            ..ClientIpConfig::default()
        };
        assert!(config.validate().unwrap_err().contains("ipv4_prefix"));
        // The message of a trusted proxy without a header reads as one sentence (it had runs
        // of spaces where its source lines were joined).
        let config = ClientIpConfig {
            trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
            headers: Vec::new(),
            ..ClientIpConfig::default()
        };
        let message = config.validate().unwrap_err();
        assert!(
            message.contains("never read and every client behind it") && !message.contains("  "),
            "{message}"
        );
    }

    #[test]
    fn trusted_proxies_accept_bare_addresses() {
        let config: ClientIpConfig =
            serde_json::from_str(r#"{"trusted_proxies": ["10.0.0.1", "192.168.0.0/16", "::1"]}"#)
                .unwrap();
        assert!(config.is_trusted(ip("10.0.0.1")));
        assert!(!config.is_trusted(ip("10.0.0.2")));
        assert!(config.is_trusted(ip("192.168.7.7")));
        assert!(config.is_trusted(ip("::1")));
        let bad = serde_json::from_str::<ClientIpConfig>(r#"{"trusted_proxies": ["nope"]}"#);
        assert!(bad.unwrap_err().to_string().contains("trusted_proxies"));
    }

    /// The model of `Walk::forwarded_line`: every element's entry, left to right, split by
    /// the model of `split_outside_quotes`.
    fn eager_forwarded(text: &str, entries: &mut Vec<Option<IpAddr>>) {
        let (elements, unterminated) = model_split(text, ',');
        let last = elements.len() - 1;
        for (i, element) in elements.into_iter().enumerate() {
            if unterminated && i == last {
                entries.push(None);
                continue;
            }
            if element.trim().is_empty() {
                continue;
            }
            let mut found = None;
            for pair in model_split(element, ';').0 {
                if let Some((name, value)) = pair.split_once('=')
                    && name.trim().eq_ignore_ascii_case("for")
                {
                    found = parse_node(&unquote(value.trim()));
                    break;
                }
            }
            entries.push(found);
        }
    }

    /// The model of `split_outside_quotes`, a character at a time.
    fn model_split(text: &str, separator: char) -> (Vec<&str>, bool) {
        let mut parts = Vec::new();
        let (mut quoted, mut escaped, mut start) = (false, false, 0);
        for (i, c) in text.char_indices() {
            if escaped {
                escaped = false;
            } else if quoted && c == '\\' {
                escaped = true;
            } else if c == '"' {
                quoted = !quoted;
            } else if c == separator && !quoted {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
        }
        parts.push(&text[start..]);
        (parts, quoted)
    }

    /// The model of the walk over every entry parsed: right to left, the first untrusted
    /// address; the leftmost if all are trusted; `None` at an unparseable entry.
    fn eager_walk(entries: &[Option<IpAddr>], config: &ClientIpConfig) -> Option<IpAddr> {
        let mut leftmost = None;
        for entry in entries.iter().rev() {
            let ip = canonical((*entry)?);
            if !config.is_trusted(ip) {
                return Some(ip);
            }
            leftmost = Some(ip);
        }
        leftmost
    }

    fn appears_in(text: &str, got: IpAddr) -> bool {
        text.split([',', ';', '=', '"', ' ', '\t', '[', ']'])
            .flat_map(|t| [Some(t), t.rsplit_once(':').map(|p| p.0)])
            .flatten()
            .any(|t| t.trim().parse::<IpAddr>().ok().map(canonical) == Some(got))
    }

    /// Pieces that make header values close to valid ones, so the walk gets exercised.
    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "203.0.113.9",
            "127.0.0.1",
            "10.0.0.7",
            "2001:db8::1",
            "::ffff:10.0.0.7",
            "[",
            "]",
            ":4711",
            ":",
            ",",
            ", ",
            ";",
            "for=",
            "For=",
            "\"",
            "unknown",
            "_hidden",
            "by=",
            "proto=http",
            " ",
            "x",
            "1.2.3",
        ])
    }

    proptest! {
        #[test]
        fn near_valid_headers(pieces in proptest::collection::vec(piece(), 0..16), which in 0usize..3) {
            let config = ClientIpConfig {
                trusted_proxies: vec![parse_net("127.0.0.1").unwrap(), parse_net("10.0.0.0/8").unwrap()],
                headers: all_three(),
                ..ClientIpConfig::default()
            };
            let text: String = pieces.concat();
            let name = ["forwarded", "x-forwarded-for", "x-real-ip"][which];
            let mut map = http::HeaderMap::new();
            map.insert(name, http::HeaderValue::from_str(&text).unwrap());
            let peer = ip("127.0.0.1");
            let got = client_ip(Some(peer), &map, &config).unwrap();
            prop_assert!(got == peer || appears_in(&text, got), "{got} not in {text:?}");
        }

        /// The walk parses lazily, right to left, on the line's bytes, and stops at the client:
        /// it finds what parsing every entry of every line, read as text (lossily), and then
        /// walking them finds (the model, as the walk was written before it went lazy), on
        /// lines of pieces of near-valid headers and bytes that are no UTF-8 or are white space
        /// only to Unicode, one line or several, behind one or two trusted proxies.
        #[test]
        fn the_lazy_walk_finds_what_parsing_every_entry_finds(
            lines in proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![
                        4 => piece().prop_map(|p| p.as_bytes().to_vec()),
                        1 => prop::sample::select(vec![
                            vec![0xff],
                            vec![0xc3],
                            "é".as_bytes().to_vec(),
                            "\u{a0}".as_bytes().to_vec(),
                            b"\\".to_vec(),
                        ]),
                    ],
                    0..12,
                ),
                1..4,
            ),
            forwarded in any::<bool>(),
        ) {
            let header = if forwarded { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor };
            let config = ClientIpConfig {
                trusted_proxies: vec![parse_net("127.0.0.1").unwrap(), parse_net("10.0.0.0/8").unwrap()],
                headers: vec![header.clone()],
                ..ClientIpConfig::default()
            };
            let name = if forwarded { "forwarded" } else { "x-forwarded-for" };
            let mut map = http::HeaderMap::new();
            let mut entries = Vec::new();
            for pieces in &lines {
                let bytes: Vec<u8> = pieces.concat();
                map.append(name, http::HeaderValue::from_bytes(&bytes).unwrap());
                let text = String::from_utf8_lossy(&bytes);
                if forwarded {
                    eager_forwarded(&text, &mut entries);
                } else {
                    entries.extend(
                        text.split(',')
                            .filter(|element| !element.trim().is_empty())
                            .map(parse_node),
                    );
                }
            }
            let peer = ip("127.0.0.1");
            let expected = eager_walk(&entries, &config).unwrap_or(peer);
            prop_assert_eq!(client_ip(Some(peer), &map, &config), Some(expected), "{:?}", lines);
        }

        /// `split_outside_quotes` jumps between the bytes that matter; it splits as a
        /// character-at-a-time reading does, escapes, multi-byte characters and a trailing
        /// backslash included.
        #[test]
        fn splitting_by_bytes_splits_as_by_characters(
            pieces in proptest::collection::vec(
                prop::sample::select(vec!["\"", "\\", ",", ";", "a", "é", "\\\"", " ", "for=1.2.3.4"]),
                0..24,
            ),
        ) {
            let text: String = pieces.concat();
            for (separator, byte) in [(',', b','), (';', b';')] {
                let (parts, open) = split_outside_quotes(text.as_bytes(), byte);
                let parts: Vec<&str> = parts.iter().map(|p| std::str::from_utf8(p).unwrap()).collect();
                prop_assert_eq!((parts, open), model_split(&text, separator));
            }
        }

        #[test]
        fn arbitrary_headers_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            which in 0usize..3,
        ) {
            let config = ClientIpConfig {
                trusted_proxies: vec![IpNet::from(ip("127.0.0.1"))],
                headers: all_three(),
                ..ClientIpConfig::default()
            };
            let name = ["forwarded", "x-forwarded-for", "x-real-ip"][which];
            let Ok(value) = http::HeaderValue::from_bytes(&bytes) else { return Ok(()); };
            let mut map = http::HeaderMap::new();
            map.insert(name, value);
            let peer = ip("127.0.0.1");
            let got = client_ip(Some(peer), &map, &config).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            prop_assert!(got == peer || appears_in(&text, got), "{got} not in {text:?}");
        }
    }
}
