//! Adversarial parsing in the HTTP layer: the client IP behind trusted proxies (whatever a
//! client writes, it cannot choose its key) and endpoint patterns (the documented wildcards, on
//! paths of any content).
#![cfg(feature = "http")]

use proptest::prelude::*;
use std::net::IpAddr;
use turnstile::ManualClock;
use turnstile::http::{
    ClientIpConfig, ForwardedHeader, HttpConfig, HttpLimiter, RequestInfo, client_ip,
};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Trusts 10.0.0.0/8 and reads `header` only.
fn behind_proxy(header: ForwardedHeader) -> ClientIpConfig {
    let mut config = ClientIpConfig::default();
    config.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    config.headers = vec![header];
    config
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

const PEER: &str = "10.0.0.1";
/// The address the trusted proxy saw and appended: the client.
const SEEN: &str = "203.0.113.9";

/// A proxy that appends its element to the `Forwarded` line it received (nginx's
/// `proxy_set_header Forwarded "$http_forwarded, for=$remote_addr"`): a quote the client left
/// open swallows that element into the client's own, whose `for=` the client chose. The walk
/// must not believe it: the entry the proxy vouched for is unreadable, so the peer is the key.
#[test]
fn forwarded_quote_left_open_by_the_client_cannot_hide_the_proxys_element() {
    let config = behind_proxy(ForwardedHeader::Forwarded);
    let peer = Some(ip(PEER));
    for client_part in [
        r#"for=198.51.100.66;x=""#,
        r#"for=198.51.100.66;by=a"b"#,
        r#"for=198.51.100.66;proto="https\""#,
        r#"for=198.51.100.66;x=", for=198.51.100.67"#,
    ] {
        for appended in [
            format!("for={SEEN}"),
            format!("for=\"{SEEN}:4711\";proto=https"),
            "for=\"[2001:db8::9]:4711\"".to_owned(),
        ] {
            let line = format!("{client_part}, {appended}");
            let got = client_ip(peer, &headers(&[("forwarded", &line)]), &config);
            assert_eq!(got, peer, "{line}");
        }
    }
    // On a line of its own the proxy's element is read whatever the client's line holds.
    let h = headers(&[
        ("forwarded", r#"for=198.51.100.66;x=""#),
        ("forwarded", &format!("for={SEEN}")),
    ]);
    assert_eq!(client_ip(peer, &h, &config), Some(ip(SEEN)));
}

/// Pieces of what a client may write before the proxy's part.
fn client_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "for=198.51.100.66",
        "for=\"[2001:db8::66]:4711\"",
        "10.0.0.7",
        ";x=",
        ";by=",
        "\"",
        "\\",
        ",",
        " ",
        "unknown",
        "_hidden",
        "é",
    ])
}

proptest! {
    /// Whatever a client writes, the entry a trusted proxy appended decides: for
    /// X-Forwarded-For that entry, for `Forwarded` that entry or (when the client's text makes
    /// the line unreadable) the peer; never an address the client wrote.
    #[test]
    fn the_entry_the_proxy_appended_decides(
        pieces in proptest::collection::vec(client_piece(), 0..12),
        same_line in any::<bool>(),
        forwarded in any::<bool>(),
    ) {
        let client_part: String = pieces.concat();
        let (name, header, appended) = if forwarded {
            ("forwarded", ForwardedHeader::Forwarded, format!("for={SEEN}"))
        } else {
            ("x-forwarded-for", ForwardedHeader::XForwardedFor, SEEN.to_owned())
        };
        let config = behind_proxy(header);
        let map = if same_line {
            headers(&[(name, &format!("{client_part}, {appended}"))])
        } else {
            headers(&[(name, &client_part), (name, &appended)])
        };
        let peer = ip(PEER);
        let got = client_ip(Some(peer), &map, &config).unwrap();
        if forwarded && same_line {
            prop_assert!(got == ip(SEEN) || got == peer, "{got} from {client_part:?}");
        } else {
            prop_assert_eq!(got, ip(SEEN), "from {:?}", client_part);
        }
    }
}

/// The ways a proxy may write the address it saw ([`SEEN`]) in `X-Forwarded-For`: with a port,
/// IPv4-mapped (as a dual-stack socket reports it), bracketed, with spaces around.
fn xff_forms() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "203.0.113.9",
        "203.0.113.9:4711",
        "::ffff:203.0.113.9",
        "[::ffff:203.0.113.9]",
        "[::ffff:cb00:7109]:80",
        "  203.0.113.9\t",
    ])
}

/// The same in a `Forwarded` element: parameter names in any case, quoted with a port,
/// IPv4-mapped in brackets, beside other parameters.
fn forwarded_forms() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "for=203.0.113.9",
        "For=203.0.113.9",
        "FOR=\"203.0.113.9:80\"",
        "for=\"[::ffff:203.0.113.9]:4711\"",
        "proto=https;for=203.0.113.9;by=10.0.0.1",
        "by=_proxy;FoR=\"203.0.113.9\";host=\"a,b\"",
    ])
}

proptest! {
    /// However the proxy writes the address it saw, and whether a second trusted proxy appended
    /// its own hop after it (or wrote its line apart), the client is that address, as IPv4:
    /// never an address the client wrote, and never two keys for one client.
    #[test]
    fn every_form_of_the_proxys_entry_is_the_same_client(
        pieces in proptest::collection::vec(client_piece(), 0..8),
        xff in xff_forms(),
        fwd in forwarded_forms(),
        forwarded in any::<bool>(),
        second_hop in 0..3u8,
    ) {
        let client_part: String = pieces.concat();
        let (name, header, appended, hop) = if forwarded {
            ("forwarded", ForwardedHeader::Forwarded, fwd, "for=\"[::ffff:10.0.0.2]:8080\"")
        } else {
            ("x-forwarded-for", ForwardedHeader::XForwardedFor, xff, "::ffff:10.0.0.2")
        };
        let config = behind_proxy(header);
        // The client's line, then the proxy's; the second hop on the proxy's line, on a line
        // of its own, or absent.
        let proxy_line = match second_hop {
            0 => format!("{appended}, {hop}"),
            _ => appended.to_owned(),
        };
        let mut lines = vec![(name, client_part.as_str()), (name, proxy_line.as_str())];
        if second_hop == 1 {
            lines.push((name, hop));
        }
        // A dual-stack listener reports the proxy IPv4-mapped: still trusted.
        for peer in [ip(PEER), ip("::ffff:10.0.0.1")] {
            let got = client_ip(Some(peer), &headers(&lines), &config);
            prop_assert_eq!(got, Some(ip(SEEN)), "{:?}", lines);
        }
    }

    /// From a peer that is not a trusted proxy, no header changes the key, in any form.
    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_sends(
        pieces in proptest::collection::vec(client_piece(), 0..8),
        xff in xff_forms(),
        fwd in forwarded_forms(),
    ) {
        let mut config = behind_proxy(ForwardedHeader::Forwarded);
        config.headers.push(ForwardedHeader::XForwardedFor);
        config.headers.push(ForwardedHeader::XRealIp);
        let client_part: String = pieces.concat();
        let lines = [
            ("forwarded", client_part.as_str()),
            ("forwarded", fwd),
            ("x-forwarded-for", xff),
            ("x-real-ip", SEEN),
        ];
        for (peer, client) in [("198.51.100.1", "198.51.100.1"), ("::ffff:198.51.100.1", "198.51.100.1"), ("2001:db8::1", "2001:db8::1")] {
            let got = client_ip(Some(ip(peer)), &headers(&lines), &config);
            prop_assert_eq!(got, Some(ip(client)), "{:?}", lines);
        }
    }
}

fn limiter(toml: &str) -> HttpLimiter<ManualClock> {
    let config = HttpConfig::from_toml_str(toml).expect("valid toml");
    HttpLimiter::with_clock(config, ManualClock::new()).expect("valid config")
}

/// Whether a GET of `path` from one client is admitted.
fn get(limiter: &HttpLimiter<ManualClock>, path: &str) -> bool {
    limiter
        .decide(&RequestInfo {
            method: &http::Method::GET,
            path,
            client_ip: Some(ip("192.0.2.1")),
            client_id: None,
        })
        .outcome
        .is_admitted()
}

/// Whether a GET of `path` matches the pattern of `limiter`'s only rule, a blocking one
/// (limit 0: every request it matches is rejected).
fn blocked(limiter: &HttpLimiter<ManualClock>, path: &str) -> bool {
    !get(limiter, path)
}

fn blocking(pattern: &str) -> HttpLimiter<ManualClock> {
    limiter(&format!(
        "[[rules]]\nendpoint = \"{pattern}\"\nperiod = \"1m\"\nlimit = 0\n"
    ))
}

/// `RuleConfig::endpoint`: "`*` (any run of characters) and `?` (one) wildcards in the path".
/// A path may hold UTF-8 (the `http` crate accepts it), and `?` must match one character of
/// it, not one byte of its encoding.
#[test]
fn question_mark_matches_one_character_of_a_utf8_path() {
    let rule = blocking("get:/tags/?");
    assert!(blocked(&rule, "/tags/a"));
    assert!(blocked(&rule, "/tags/é"), "é is one character");
    assert!(blocked(&rule, "/tags/€"), "€ is one character");
    assert!(!blocked(&rule, "/tags/ab"), "two characters");
    assert!(!blocked(&rule, "/tags/éa"), "two characters");
    let rule = blocking("get:/v?/items");
    assert!(blocked(&rule, "/v\u{1F600}/items"));
    assert!(!blocked(&rule, "/v/items"));
}

/// The reference semantics of a glob pattern: `*` any run of characters, `?` one character,
/// ASCII letters in either case, everything else itself.
fn reference(pattern: &str) -> regex::Regex {
    let mut re = String::from("^");
    for c in pattern.chars() {
        match c {
            '*' => re.push_str("(?s:.*)"),
            '?' => re.push_str("(?s:.)"),
            c if c.is_ascii_alphabetic() => re.push_str(&format!(
                "[{}{}]",
                c.to_ascii_lowercase(),
                c.to_ascii_uppercase()
            )),
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    regex::Regex::new(&re).unwrap()
}

fn pattern_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["/", "a", "B", "é", "€", "*", "?", ".", "%2F", "x"])
}

fn path_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "/",
        "a",
        "A",
        "b",
        "é",
        "É",
        "€",
        "\u{1F600}",
        ".",
        "%2F",
        "%2f",
        "x",
        "//",
    ])
}

fn one_char() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "Z", "/", "é", "€", "\u{1F600}"])
}

/// A pattern and a path: the path written from the pattern (each `*` some pieces, each `?`
/// one character, letters in either case), or, for half of them, any path, up to some
/// kilobytes.
fn pattern_and_path() -> impl Strategy<Value = (String, String)> {
    let part = (
        pattern_piece(),
        proptest::collection::vec(path_piece(), 0..3),
        one_char(),
        any::<bool>(),
    );
    (
        proptest::collection::vec(part, 0..8),
        any::<bool>(),
        proptest::collection::vec(path_piece(), 0..16),
        1usize..256,
    )
        .prop_map(|(parts, derived, noise, repeat)| {
            let mut pattern = String::from("/");
            let mut path = String::from("/");
            for (piece, fill, one, flip) in parts {
                pattern.push_str(piece);
                match piece {
                    "*" => path.push_str(&fill.concat()),
                    "?" => path.push_str(one),
                    _ if flip => path.push_str(&piece.to_ascii_uppercase()),
                    _ => path.push_str(piece),
                }
            }
            if !derived {
                path = format!("/{}", noise.concat().repeat(repeat));
            }
            (pattern, path)
        })
}

/// `path` as a file server resolves it: empty and `.` segments dropped, a trailing `/` kept.
fn resolved(path: &str) -> String {
    let mut segments = path.split('/');
    let mut out = String::from(segments.next().unwrap_or(""));
    let mut ends_in_slash = false;
    for segment in segments {
        if segment.is_empty() || segment == "." {
            ends_in_slash = true;
        } else {
            out.push('/');
            out.push_str(segment);
            ends_in_slash = false;
        }
    }
    if ends_in_slash {
        out.push('/');
    }
    out
}

proptest! {
    /// Endpoint globs against paths of any content and length: no panic, and the documented
    /// semantics.
    #[test]
    fn endpoint_globs_match_as_documented((pattern, path) in pattern_and_path()) {
        let rule = blocking(&format!("get:{pattern}"));
        // The path as written, or as a handler reads it: `%2F` a `/`, then resolved as a file
        // server resolves it (`/%2F` is `//`, which is `/`).
        let as_read = resolved(&path.replace("%2F", "/").replace("%2f", "/"));
        prop_assert_eq!(
            blocked(&rule, &path),
            reference(&pattern).is_match(&path) || reference(&pattern).is_match(&as_read),
            "{} against {}", pattern, path
        );
    }
}

/// A percent-encoded letter, digit, `-`, `.`, `_` or `~` is the character itself (RFC 3986
/// §6.2.2.2), and axum hands `/api/values/%31` to the handler of `/api/values/1`: the rules must
/// see one path, or encoding a character steps around a rule.
#[test]
fn encoded_unreserved_characters_match_as_themselves() {
    let rule = blocking("get:/api/values/1");
    assert!(blocked(&rule, "/api/values/%31"));
    assert!(blocked(&rule, "/api/%76alues/1"));
    assert!(
        blocked(&rule, "/api/%56ALUES/%31"),
        "hex and letters in either case"
    );
    assert!(!blocked(&rule, "/api/values/%32"));
    // An escaped `/` is matched as written and as a handler reads it (axum's `Path` decodes
    // it: `/files/{*path}` gets `a/b` from `/files/a%2Fb`), so escaping cannot step around a
    // rule (tests/http.rs, `a_rule_matches_the_path_as_the_handler_reads_it`).
    let rule = blocking("get:/a/b");
    assert!(blocked(&rule, "/a%2Fb"));
    assert!(blocked(&rule, "/a%2fb"));
    let rule = blocking("get:/a%2Fb");
    assert!(blocked(&rule, "/a%2fb"));
    assert!(
        !blocked(&rule, "/a/b"),
        "a rule for the escaped form is that form's"
    );
    // A pattern written with an escaped unreserved character is that character too: it
    // matched no path, whose escape is decoded before matching.
    let rule = blocking("get:/api/%7Euser/%31*");
    for path in ["/api/~user/1", "/api/%7euser/%31", "/api/~user/10"] {
        assert!(blocked(&rule, path), "{path}");
    }
    assert!(!blocked(&rule, "/api/~user/2"));
    // Broken escapes are kept as they are, and decide like any other path.
    let rule = blocking("get:/a%*");
    for path in ["/a%", "/a%4", "/a%zz", "/a%C3%A9"] {
        assert!(blocked(&rule, path), "{path}");
    }
}

/// Per-endpoint counters key on the normalized path too: two spellings of one resource share
/// one counter.
#[test]
fn per_endpoint_counters_do_not_split_on_encoding() {
    let limiter =
        limiter("[[rules]]\nendpoint = \"*\"\nperiod = \"1m\"\nlimit = 2\nper_endpoint = true\n");
    assert!(get(&limiter, "/api/values/1"));
    assert!(get(&limiter, "/api/values/%31"));
    assert!(
        !get(&limiter, "/api/%76alues/%31"),
        "the third request to one resource"
    );
    // An escape of a reserved character is one path whatever the case of its hex digits.
    assert!(get(&limiter, "/files/a%2fb"));
    assert!(get(&limiter, "/files/a%2Fb"));
    assert!(!get(&limiter, "/files/a%2fb"));
    // A different resource has its own counter.
    assert!(get(&limiter, "/api/values/2"));
}

/// A forwarding header name that is not a header name can never be read: the client is then
/// always the proxy, and every client behind it shares one key. Refused, as an invalid
/// `client_id_header` is.
#[test]
fn an_invalid_forwarding_header_name_is_refused() {
    let e = HttpConfig::from_toml_str(
        "[client_ip]\nheaders = [\"x-forwarded-for\", {custom = \"X Real IP\"}]\n",
    )
    .and_then(|c| HttpLimiter::new(c).map(|_| ()))
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("client_ip.headers[1]"), "{e}");
    HttpLimiter::new(
        HttpConfig::from_toml_str("[client_ip]\nheaders = [{custom = \"CF-Connecting-IP\"}]\n")
            .unwrap(),
    )
    .expect("a valid custom header");
}

/// A path of unreserved characters, and a spelling of it a client may send: each character as
/// it is, in the other case (letters), or percent-encoded with hex digits in either case.
fn path_and_spelling() -> impl Strategy<Value = (String, String)> {
    proptest::collection::vec(
        (
            prop::sample::select("/abcXYZ019-._~".chars().collect::<Vec<_>>()),
            0u8..4,
        ),
        1..24,
    )
    .prop_map(|chars| {
        let path: String = std::iter::once('/')
            .chain(chars.iter().map(|(c, _)| *c))
            .collect();
        let mut spelled = String::from("/");
        for (c, how) in chars {
            match how {
                1 if c.is_ascii_alphabetic() => spelled.push(if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }),
                // `/` encoded is another path (a segment boundary moved): not a spelling.
                2 if c != '/' => spelled.push_str(&format!("%{:02X}", c as u32)),
                3 if c != '/' => spelled.push_str(&format!("%{:02x}", c as u32)),
                _ => spelled.push(c),
            }
        }
        (path, spelled)
    })
}

proptest! {
    /// However a client spells a path (case, percent-encoding of unreserved characters), a
    /// glob or a regex rule written for it matches it, and a whitelisted endpoint stays
    /// whitelisted: no spelling steps around a rule or falls out of a whitelist.
    #[test]
    fn no_spelling_of_a_path_escapes_its_rule((path, spelled) in path_and_spelling()) {
        let glob = blocking(&format!("get:{path}"));
        prop_assert!(blocked(&glob, &spelled), "glob {} vs {}", path, spelled);
        let regex = blocking(&format!("re:get:{}", regex::escape(&path)).replace('\\', "\\\\"));
        prop_assert!(blocked(&regex, &spelled), "regex {} vs {}", path, spelled);
        let whitelisted = limiter(&format!(
            "[whitelist]\nendpoints = [\"get:{path}\"]\n[[rules]]\nperiod = \"1m\"\nlimit = 0\n"
        ));
        prop_assert!(get(&whitelisted, &spelled), "whitelist {} vs {}", path, spelled);
    }
}
