//! AspNetCoreRateLimit's configuration sections, translated to [`HttpConfig`].
//!
//! How each field is read is documented on [`HttpConfig::from_aspnet_json`], where the users
//! who load such a document read it.

use crate::http::config::{
    ClientRulesConfig, HttpConfig, IpRulesConfig, KeyWhitelistConfig, RuleConfig, RuleKey,
};
use crate::http::rules::{Endpoint, parse_net, parse_period, unusable_client_id};
use crate::http::{ClientIpConfig, ForwardedHeader, HttpConfigError, ResponseConfig};
use serde_json::{Map, Value};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const SECTIONS: [&str; 4] = [
    "IpRateLimiting",
    "IpRateLimitPolicies",
    "ClientRateLimiting",
    "ClientRateLimitPolicies",
];

/// The top-level settings of turnstile's own format ([`HttpConfig`]'s fields, as written).
/// Beside AspNetCoreRateLimit's sections they were ignored, as an `appsettings.json`'s other
/// sections are (`Logging`, `AllowedHosts`): a `"bans"` or `"rules"` written there to add to the
/// translation did nothing, and nothing said so. Matched as written (case-sensitively): these
/// snake_case names are turnstile's, not ASP.NET sections.
const NATIVE: [&str; 17] = [
    "client_ip",
    "client_id_header",
    "client_id_max_len",
    "anonymous_client_id",
    "response",
    "missing_key",
    "endpoint_rate_limiting",
    "trim_trailing_slash",
    "max_keys_per_rule",
    "key_overflow",
    "rules",
    "ip_rules",
    "client_rules",
    "whitelist",
    "blocklist",
    "bans",
    "backend",
];

/// Whether the document has one of AspNetCoreRateLimit's sections (named in any case, as
/// ASP.NET's configuration finds them).
pub(crate) fn is_aspnet(value: &serde_json::Value) -> bool {
    value.as_object().is_some_and(|o| {
        o.keys()
            .any(|k| SECTIONS.iter().any(|s| s.eq_ignore_ascii_case(k)))
    })
}

/// Refuses a JSON document with a key given twice in one object, in any case (ASP.NET's JSON
/// configuration compares keys case-insensitively): parsed into a `Value`, the last of the two
/// would silently win. Anywhere in the document, since ASP.NET reads all of it. A value given
/// twice refuses the file there too; two objects or lists given under one key are merged
/// there, which is not done here, so they are refused as well, saying so. The error names the
/// field as the document spells it, at its first spelling.
pub(crate) fn check_duplicate_keys(text: &str) -> Result<(), HttpConfigError> {
    use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// The field given twice, its two spellings, and whether the first is an object or a list.
    type Found = RefCell<Option<(String, String, String, bool)>>;

    /// Walks one value; its result is whether it is an object or a list.
    struct Walk<'a> {
        path: String,
        found: &'a Found,
    }

    impl Walk<'_> {
        fn child(&self, name: &str) -> String {
            if self.path.is_empty() {
                name.to_owned()
            } else {
                format!("{}.{name}", self.path)
            }
        }
    }

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = bool;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_str<E>(self, _: &str) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_unit<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
            let mut i = 0usize;
            while seq
                .next_element_seed(Walk {
                    path: format!("{}[{i}]", self.path),
                    found: self.found,
                })?
                .is_some()
            {
                i += 1;
            }
            Ok(true)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            // Each key in lower case: its first spelling, and whether its value is an object
            // or a list.
            let mut seen: HashMap<String, (String, bool)> = HashMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if let Some((first, container)) = seen.get(&key.to_ascii_lowercase()) {
                    *self.found.borrow_mut() =
                        Some((self.child(first), first.clone(), key, *container));
                    return Err(A::Error::custom("a key given twice"));
                }
                let container = map.next_value_seed(Walk {
                    path: self.child(&key),
                    found: self.found,
                })?;
                seen.insert(key.to_ascii_lowercase(), (key, container));
            }
            Ok(true)
        }
    }

    let found = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    // Any other error is the parser's, which the caller reports.
    let _ = Walk {
        path: String::new(),
        found: &found,
    }
    .deserialize(&mut deserializer);
    let Some((field, first, second, container)) = found.into_inner() else {
        return Ok(());
    };
    let why = if container {
        "ASP.NET's configuration merges the two, which is not done here: write it once"
    } else {
        "ASP.NET's configuration refuses a value given twice in one object, in any case"
    };
    Err(HttpConfigError::invalid(
        field,
        format!("given twice ({first:?} and {second:?}): {why}"),
    ))
}

/// What kind of JSON value `value` is, for error messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `value` for an error message: a scalar as written, anything else by its kind.
fn shown(value: &Value) -> String {
    match value {
        Value::Bool(_) | Value::Number(_) | Value::String(_) => value.to_string(),
        other => kind(other).to_owned(),
    }
}

/// An object of the document, read as ASP.NET's configuration binder reads it: keys
/// case-insensitively, numbers and booleans from their text as well, `null` as absent.
/// `path` names it in errors (`IpRateLimiting.GeneralRules[0]`).
struct Node<'a> {
    map: Option<&'a Map<String, Value>>,
    path: String,
}

impl<'a> Node<'a> {
    /// `value` as an object (`null`: an empty one).
    fn of(value: &'a Value, path: String) -> Result<Self, HttpConfigError> {
        match value {
            Value::Object(map) => Ok(Node {
                map: Some(map),
                path,
            }),
            Value::Null => Ok(Node { map: None, path }),
            other => Err(HttpConfigError::invalid(
                path,
                format!("expected an object, found {}", kind(other)),
            )),
        }
    }

    fn field(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    /// The value of `name`, matched case-insensitively, and its path. A key given twice (in
    /// two cases) is an error, as ASP.NET's JSON configuration makes it.
    fn get(&self, name: &str) -> Result<Option<(&'a Value, String)>, HttpConfigError> {
        let Some(map) = self.map else {
            return Ok(None);
        };
        let mut found: Option<(&String, &'a Value)> = None;
        for (key, value) in map {
            if !key.eq_ignore_ascii_case(name) {
                continue;
            }
            if let Some((first, _)) = found {
                return Err(HttpConfigError::invalid(
                    self.field(name),
                    format!(
                        "given twice ({first:?} and {key:?}): keys are case-insensitive, as in ASP.NET's configuration"
                    ),
                ));
            }
            found = Some((key, value));
        }
        Ok(found
            .filter(|(_, value)| !value.is_null())
            .map(|(_, value)| (value, self.field(name))))
    }

    /// Whether `name` is given as `null` (which `get` reads as absent).
    fn is_null(&self, name: &str) -> bool {
        self.map.is_some_and(|map| {
            map.iter()
                .any(|(key, value)| key.eq_ignore_ascii_case(name) && value.is_null())
        })
    }

    fn string(&self, name: &str) -> Result<Option<String>, HttpConfigError> {
        match self.get(name)? {
            None => Ok(None),
            Some((Value::String(s), _)) => Ok(Some(s.clone())),
            Some((Value::Number(n), _)) => Ok(Some(n.to_string())),
            Some((Value::Bool(b), _)) => Ok(Some(b.to_string())),
            Some((other, field)) => Err(HttpConfigError::invalid(
                field,
                format!("expected a string, found {}", kind(other)),
            )),
        }
    }

    fn bool(&self, name: &str) -> Result<bool, HttpConfigError> {
        match self.get(name)? {
            None => Ok(false),
            Some((Value::Bool(b), _)) => Ok(*b),
            Some((Value::String(s), _)) if s.trim().eq_ignore_ascii_case("true") => Ok(true),
            Some((Value::String(s), _)) if s.trim().eq_ignore_ascii_case("false") => Ok(false),
            Some((other, field)) => Err(HttpConfigError::invalid(
                field,
                format!("expected true or false, found {}", shown(other)),
            )),
        }
    }

    fn number(&self, name: &str) -> Result<Option<f64>, HttpConfigError> {
        let Some((value, field)) = self.get(name)? else {
            return Ok(None);
        };
        let parsed = match value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok().filter(|n| n.is_finite()),
            _ => None,
        };
        parsed.map(Some).ok_or_else(|| {
            HttpConfigError::invalid(field, format!("expected a number, found {}", shown(value)))
        })
    }

    /// The strings of the list `name`, each with its field (`IpWhitelist[2]`): the index is the
    /// document's, `null` entries (which are skipped) counted.
    fn entries(&self, name: &str) -> Result<Vec<(String, String)>, HttpConfigError> {
        match self.get(name)? {
            None => Ok(Vec::new()),
            Some((Value::Array(items), field)) => items
                .iter()
                .enumerate()
                .filter(|(_, item)| !item.is_null())
                .map(|(i, item)| {
                    let at = format!("{field}[{i}]");
                    match item {
                        Value::String(s) => Ok((at, s.clone())),
                        Value::Number(n) => Ok((at, n.to_string())),
                        other => Err(HttpConfigError::invalid(
                            at,
                            format!("expected a string, found {}", kind(other)),
                        )),
                    }
                })
                .collect(),
            Some((other, field)) => Err(HttpConfigError::invalid(
                field,
                format!("expected a list of strings, found {}", kind(other)),
            )),
        }
    }

    fn objects(&self, name: &str) -> Result<Vec<Node<'a>>, HttpConfigError> {
        match self.get(name)? {
            None => Ok(Vec::new()),
            Some((Value::Array(items), field)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| Node::of(item, format!("{field}[{i}]")))
                .collect(),
            Some((other, field)) => Err(HttpConfigError::invalid(
                field,
                format!("expected a list, found {}", kind(other)),
            )),
        }
    }

    fn object(&self, name: &str) -> Result<Option<Node<'a>>, HttpConfigError> {
        self.get(name)?
            .map(|(value, field)| Node::of(value, field))
            .transpose()
    }

    /// An HTTP status (`HttpStatusCode`, `QuotaExceededResponse.StatusCode`).
    fn status(&self, name: &str) -> Result<Option<u16>, HttpConfigError> {
        let Some(n) = self.number(name)? else {
            return Ok(None);
        };
        let status = Some(n)
            .filter(|n| n.fract() == 0.0 && (400.0..=599.0).contains(n))
            .map(|n| n as u16);
        match status {
            Some(status) => Ok(Some(status)),
            None => Err(HttpConfigError::invalid(
                self.field(name),
                format!("{n} is not an error status (a rejection needs 400..=599)"),
            )),
        }
    }
}

/// One section's options (`IpRateLimiting` or `ClientRateLimiting`).
struct Options<'a> {
    enable_endpoint_rate_limiting: bool,
    enable_regex_rule_matching: bool,
    node: Node<'a>,
}

impl<'a> Options<'a> {
    fn of(node: Node<'a>) -> Result<Self, HttpConfigError> {
        Ok(Options {
            enable_endpoint_rate_limiting: node.bool("EnableEndpointRateLimiting")?,
            enable_regex_rule_matching: node.bool("EnableRegexRuleMatching")?,
            node,
        })
    }
}

/// The methods a regular expression over the method part of a pattern is tried against (those
/// of RFC 9110 and `PATCH`).
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// What AspNetCoreRateLimit puts in place of the method to match a `GeneralRules` pattern for
/// any method (`*:path`).
const GENERAL_ANY: &str = "*";
/// What it puts there for a policy's rules and an `EndpointWhitelist` entry, with
/// `EnableRegexRuleMatching` (`.+:path`, the text).
const REGEX_ANY: &str = ".+";

/// A pattern of a section with `EnableRegexRuleMatching`, as this crate's endpoint patterns:
/// `(name, pattern, regex)` each. There it is a regex matched, anchored and case-insensitively,
/// against `verb:path` and against `{any}:path` for "any method" (`any` is [`GENERAL_ANY`] or
/// [`REGEX_ANY`], as text); here the part before the `:` that ends a valid regex is the method
/// part: a method name, `.+`, `.*` or `*` for any, or a regex over methods (`((post)|(put))`,
/// as AspNetCoreRateLimit's documentation writes it), which becomes one pattern per method it
/// matches (named `{method}:{path}`, the method in lower case), unless it matches `any`
/// (`(get|\*)` in general rules), which there matches every method, as `.+` does. The rest is
/// the regex over the path (anchored and case-insensitive here too). `.+` alone matches every
/// request.
fn regex_endpoint(
    pattern: &str,
    any: &str,
    field: &str,
) -> Result<Vec<(String, String, bool)>, HttpConfigError> {
    let trimmed = pattern.trim();
    let mut body = trimmed.strip_prefix('^').unwrap_or(trimmed);
    if let Some(rest) = body.strip_suffix('$') {
        // An escaped `$` is a character of the pattern, not its anchor.
        let backslashes = rest.bytes().rev().take_while(|&b| b == b'\\').count();
        if backslashes % 2 == 0 {
            body = rest;
        }
    }
    let named = |pattern: String, regex| vec![(trimmed.to_owned(), pattern, regex)];
    let cannot = |why: String| {
        HttpConfigError::invalid(
            field,
            format!("{pattern:?} (EnableRegexRuleMatching) cannot be translated: {why}"),
        )
    };
    // There the anchors are written around the whole text (`^` + pattern + `$`), so they bind
    // to the first and the last alternative only: `get:/a|get:/b` is every `verb:path` that
    // starts with `get:/a` or ends with `get:/b`, and `get|post:/x` every GET. Split at the
    // first `:` it became one method and a path alternation (`get` and `/a|get:/b`), GET /a
    // alone, and the rule limited none of the other requests it limits there.
    if top_level_alternation(body) {
        return Err(cannot(
            "a `|` outside any group: there the pattern's anchors bind to its first and last \
             alternatives only; group the alternatives (`(get|post):/api/(a|b)`), or write one \
             rule per alternative"
                .into(),
        ));
    }
    match body {
        "*" => return Ok(named("*".to_owned(), false)),
        // Every request, but not a `*` rule: those alone apply without endpoint rate limiting.
        ".+" | ".*" => return Ok(named("*:.*".to_owned(), true)),
        _ => {}
    }
    // The method part ends at the first `:` before which the text is a whole regex (the `:` of
    // a `(?:get|post)` group is inside it).
    let split = body
        .match_indices(':')
        .map(|(i, _)| (&body[..i], &body[i + 1..]))
        .find(|(verb, _)| regex::Regex::new(verb).is_ok());
    let Some((verb, path)) = split else {
        return Err(cannot(
            "expected \"verb:regex\", the verb a method, \".+\" or a regex over methods".into(),
        ));
    };
    match verb {
        ".+" | ".*" | "*" => return Ok(named(format!("*:{path}"), true)),
        v if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphabetic()) => {
            return Ok(named(format!("{v}:{path}"), true));
        }
        _ => {}
    }
    let methods = regex::Regex::new(&format!("(?i)^(?:{verb})$"))
        .map_err(|e| cannot(format!("the method part {verb:?} is not a regex: {e}")))?;
    // There the pattern is also matched against `{any}:path`, for the rules of any method: a
    // method part that matches `any` (`(get|\*)` or `.` in general rules) matches every request
    // to its path, whatever its method. Read as the methods it names, `(get|\*)` limited GET
    // alone.
    if methods.is_match(any) {
        return Ok(named(format!("*:{path}"), true));
    }
    let matched: Vec<_> = METHODS
        .iter()
        .filter(|m| methods.is_match(m))
        .map(|m| {
            let method = m.to_ascii_lowercase();
            (format!("{method}:{path}"), format!("{method}:{path}"), true)
        })
        .collect();
    if matched.is_empty() {
        return Err(cannot(format!(
            "the method part {verb:?} matches none of {METHODS:?}"
        )));
    }
    Ok(matched)
}

/// Whether the regular expression `pattern` has a `|` outside every group and character class:
/// an alternation of the whole pattern. A `\`-escaped character is no operator; a class may
/// nest classes (`[a-z&&[^x]]`, `[[:alpha:]]`), and a `]` first in one (after its `^`) is one
/// of its characters.
fn top_level_alternation(pattern: &str) -> bool {
    let bytes = pattern.as_bytes();
    let (mut groups, mut classes) = (0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'[' => {
                classes += 1;
                if bytes.get(i + 1) == Some(&b'^') {
                    i += 1;
                }
                if bytes.get(i + 1) == Some(&b']') {
                    i += 1;
                }
            }
            b']' if classes > 0 => classes -= 1,
            _ if classes > 0 => {}
            b'(' => groups += 1,
            b')' => groups = groups.saturating_sub(1),
            b'|' if groups == 0 => return true,
            _ => {}
        }
        i += 1;
    }
    false
}

/// The error for a window longer than a limiter counts (more than u64::MAX nanoseconds), naming
/// `field` and the text it was written as.
fn too_long(text: &str, field: &str) -> HttpConfigError {
    HttpConfigError::invalid(
        field,
        format!("{text:?} is too long: a window is at most u64::MAX nanoseconds (about 584 years)"),
    )
}

/// An AspNetCoreRateLimit period as a humantime one, checked. There a period is a number and
/// one of `s`, `m`, `h`, `d` (the number may have a fraction: `1.5m`, `double.Parse`); any other
/// unit throws on every request its rule applies to. Here `w` is read too, `{n}mo` as `n` times
/// 30 days and `{n}y` as `n` times 365 days (humantime's months and years are longer), and
/// other text is left for humantime to read. The error names `field`, the document's.
fn period(text: &str, field: &str) -> Result<String, HttpConfigError> {
    let trimmed = text.trim();
    let digits = trimmed
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, unit) = trimmed.split_at(digits);
    let seconds_per: Option<u64> = match unit {
        "s" => Some(1),
        "m" => Some(60),
        "h" => Some(3_600),
        "d" => Some(86_400),
        "w" => Some(604_800),
        "mo" => Some(30 * 86_400),
        "y" => Some(365 * 86_400),
        _ => None,
    };
    let translated = match (number.parse::<u64>(), seconds_per) {
        (Ok(_), Some(_)) if !matches!(unit, "mo" | "y") => trimmed.to_owned(),
        (Ok(n), Some(per)) => n
            .checked_mul(per / 86_400)
            .map_or_else(|| trimmed.to_owned(), |days| format!("{days}d")),
        (Err(_), Some(per)) => match number.parse::<f64>() {
            Ok(n) => match std::time::Duration::try_from_secs_f64(n * per as f64) {
                // Whole milliseconds: a binary fraction's noise is no part of the period. A
                // count of them beyond a `u64` is far beyond any window (checked, not cast: a
                // cast wrapped `18446744073709552.5s` around to `384ms`).
                Ok(d) => match u64::try_from(d.as_millis()) {
                    Ok(0) if n > 0.0 => {
                        return Err(HttpConfigError::invalid(
                            field,
                            format!(
                                "{text:?} is below a millisecond, the finest a period with a fraction is counted in"
                            ),
                        ));
                    }
                    Ok(millis) => {
                        humantime::format_duration(std::time::Duration::from_millis(millis))
                            .to_string()
                    }
                    Err(_) => return Err(too_long(text, field)),
                },
                Err(_) => trimmed.to_owned(),
            },
            Err(_) => trimmed.to_owned(),
        },
        _ => trimmed.to_owned(),
    };
    parse_period(&translated, field)?;
    Ok(translated)
}

/// The CIDR ranges that cover an `IpWhitelist` entry or an `IpRules[].Ip` there: an address, a
/// CIDR range, `first-last` (the fewest CIDR ranges that cover it exactly, several when it is
/// not aligned) or `address/mask` (`192.168.0.0/255.255.255.0`), the forms of
/// AspNetCoreRateLimit's IP ranges, read as there with every space removed first
/// (`10.0.0.0 / 8`, `10.0.0.1 - 10.0.0.6`). Each is checked as the lists' entries are (whole
/// client groups of `client_ip`); errors name `field`, the document's.
fn ip_nets(
    text: &str,
    field: &str,
    client_ip: &ClientIpConfig,
) -> Result<Vec<String>, HttpConfigError> {
    let written = text.trim();
    let text = &written.replace(' ', "");
    let invalid = |why: &str| HttpConfigError::invalid(field, format!("{written:?} {why}"));
    let nets = if let Some((first, last)) = text.split_once('-') {
        match (
            first.trim().parse::<IpAddr>(),
            last.trim().parse::<IpAddr>(),
        ) {
            (Ok(IpAddr::V4(a)), Ok(IpAddr::V4(b))) if a <= b => {
                range_cidrs(u32::from(a).into(), u32::from(b).into(), 32)
                    .into_iter()
                    // Within 32 bits by construction.
                    .map(|(start, len)| format!("{}/{len}", Ipv4Addr::from(start as u32)))
                    .collect()
            }
            (Ok(IpAddr::V6(a)), Ok(IpAddr::V6(b))) if a <= b => {
                range_cidrs(a.into(), b.into(), 128)
                    .into_iter()
                    .map(|(start, len)| format!("{}/{len}", Ipv6Addr::from(start)))
                    .collect()
            }
            _ => {
                return Err(invalid(
                    "is not a range of IP addresses (`first-last`, both of one family, the first not after the last)",
                ));
            }
        }
    } else if let Some((address, mask)) = text
        .split_once('/')
        .filter(|(_, mask)| mask.contains(['.', ':']))
    {
        let prefix = match (
            address.trim().parse::<IpAddr>(),
            mask.trim().parse::<IpAddr>(),
        ) {
            (Ok(IpAddr::V4(_)), Ok(IpAddr::V4(m))) => prefix_of_mask(u32::from(m).into(), 32),
            (Ok(IpAddr::V6(_)), Ok(IpAddr::V6(m))) => prefix_of_mask(m.into(), 128),
            _ => None,
        };
        let Some(prefix) = prefix else {
            return Err(invalid(
                "is not an address and a network mask of its family (`192.168.0.0/255.255.255.0`)",
            ));
        };
        vec![format!("{}/{prefix}", address.trim())]
    } else {
        vec![text.to_owned()]
    };
    nets.iter()
        .map(|net| parse_net(net, field, client_ip).map(|net| net.trunc().to_string()))
        .collect()
}

/// The prefix length of a network mask `width` bits wide, if its ones are contiguous from the
/// top.
fn prefix_of_mask(mask: u128, width: u32) -> Option<u32> {
    let aligned = mask << (128 - width);
    let ones = aligned.leading_ones();
    (aligned.count_ones() == ones).then_some(ones)
}

/// The CIDR ranges (start, prefix length) that cover `start..=end` exactly, fewest first: at
/// each step the largest block aligned at the start that does not pass the end.
fn range_cidrs(mut start: u128, end: u128, width: u32) -> Vec<(u128, u32)> {
    let low = |bits: u32| match bits {
        128.. => u128::MAX,
        bits => (1u128 << bits) - 1,
    };
    let mut out = Vec::new();
    loop {
        let mut bits = start.trailing_zeros().min(width);
        while bits > 0 && start | low(bits) > end {
            bits -= 1;
        }
        out.push((start, width - bits));
        let last = start | low(bits);
        if last >= end {
            return out;
        }
        start = last + 1;
    }
}

/// A header name of the document (`RealIpHeader`, `ClientIdHeader`), checked here so that the
/// error names the document's field.
fn header_name(node: &Node<'_>, name: &str) -> Result<Option<String>, HttpConfigError> {
    let Some(header) = node.string(name)? else {
        return Ok(None);
    };
    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        return Err(HttpConfigError::invalid(
            node.field(name),
            format!("{header:?} is not a valid header name"),
        ));
    }
    Ok(Some(header))
}

/// One section's rules, as AspNetCoreRateLimit's matching sees them.
struct Section<'a> {
    key: RuleKey,
    prefix: &'a str,
    /// The section's `EnableEndpointRateLimiting`: each rule counts each `VERB:path` apart.
    per_endpoint: bool,
    /// The section leaves endpoint rate limiting off: its rules other than `*` are left out,
    /// since there they never apply (AspNetCoreRateLimit then takes the rules whose endpoint is
    /// `*`, so not `*:*`, which the engine would take for a rule of every request).
    only_any: bool,
    /// The section's `EnableRegexRuleMatching`: its patterns are regular expressions.
    regex: bool,
}

impl Section<'_> {
    /// The rules of the list `name` of `node`. Two rules of one endpoint and period are legal
    /// there, and only the lower limit can apply (the lowest limit per period is taken): the
    /// other is left out here, where the two would share a name. Each with its `Period` as
    /// written, which policies compare (see [`kept_general_rules`]).
    ///
    /// `any`: what the list's patterns are matched with in place of the method, for any method
    /// (see [`regex_endpoint`]).
    fn rules(
        &self,
        node: &Node<'_>,
        name: &str,
        any: &str,
    ) -> Result<Vec<(RuleConfig, String)>, HttpConfigError> {
        let rules = node.objects(name)?;
        let mut out: Vec<(RuleConfig, String)> = Vec::with_capacity(rules.len());
        for r in rules {
            let period_text = r.string("Period")?.unwrap_or_default();
            let endpoint = r.string("Endpoint")?;
            // Checked even when left out: a mistake in the document is reported wherever it is.
            let rules = self.rule(&r, endpoint.clone().unwrap_or_else(|| "*".to_owned()), any)?;
            // There a rule without a pattern applies to no request (it is no `*` rule, and a
            // missing pattern matches nothing); read as `*` it would limit every request.
            if endpoint.is_none() {
                return Err(HttpConfigError::invalid(
                    r.field("Endpoint"),
                    "missing: AspNetCoreRateLimit applies a rule without one to no request; \
                     write \"*\" for every request, or leave the rule out",
                ));
            }
            if self.only_any && endpoint.as_deref().is_some_and(|e| e.trim() != "*") {
                continue;
            }
            // There a rule's own response is sent for its rejections (and then for every later
            // one of the section: it replaces the section's). A rule has no response of its own
            // here; ignoring it would send the section's status and body instead.
            if let Some((_, field)) = r.get("QuotaExceededResponse")? {
                return Err(HttpConfigError::invalid(
                    field,
                    "a rule's own response is not supported: give it to the section \
                     (its QuotaExceededResponse), whose rejections all share one",
                ));
            }
            for rule in rules {
                match out.iter_mut().find(|(o, _)| o.name == rule.name) {
                    Some((kept, _)) if rule.limit < kept.limit => *kept = rule,
                    Some(_) => {}
                    None => out.push((rule, period_text.clone())),
                }
            }
        }
        Ok(out)
    }

    /// The rules of one AspNetCoreRateLimit rule: one, or one per method of a regex's method
    /// part (see [`regex_endpoint`]).
    fn rule(
        &self,
        r: &Node<'_>,
        endpoint: String,
        any: &str,
    ) -> Result<Vec<RuleConfig>, HttpConfigError> {
        let period_text = r.string("Period")?.unwrap_or_default();
        // A `PeriodTimespan` given is the window there (the period text is then only a name).
        // The window, and the field and text it was read from, for the check below.
        let (period, window, written) = match r.string("PeriodTimespan")? {
            Some(text) => {
                let field = r.field("PeriodTimespan");
                let window = timespan(&text).ok_or_else(|| {
                    HttpConfigError::invalid(
                        &field,
                        format!(
                            "{text:?} is not a .NET TimeSpan (`[d.]hh:mm[:ss[.fffffff]]` or `d:hh:mm:ss`)"
                        ),
                    )
                })?;
                let period = humantime::format_duration(window).to_string();
                (period, window, (field, text))
            }
            None => {
                let field = r.field("Period");
                let period = period(&period_text, &field)?;
                let window = parse_period(&period, &field)?;
                (period, window, (field, period_text.clone()))
            }
        };
        // There a limit of zero or less blocks every request the rule applies to (`-1` as
        // well as `0`), as a limit of 0 does here.
        let limit = r.number("Limit")?.unwrap_or(0.0).max(0.0);
        if limit.fract() != 0.0 {
            return Err(HttpConfigError::invalid(
                r.field("Limit"),
                format!("{limit} is not a whole number of requests"),
            ));
        }
        if limit > f64::from(u32::MAX) {
            return Err(HttpConfigError::invalid(
                r.field("Limit"),
                format!(
                    "{limit} is more requests than a rule counts (at most {})",
                    u32::MAX
                ),
            ));
        }
        // What the compiler would refuse for the translated rule (`rules[1].period`, a field
        // the document does not have), refused here naming the document's. A rule of limit 0
        // builds no limiter, so any period does for it, as in the native format.
        if limit > 0.0 && window.as_nanos() > u128::from(u64::MAX) {
            let (field, text) = written;
            return Err(too_long(&text, &field));
        }
        let monitor = r.bool("MonitorMode")?;
        let patterns = if self.regex {
            regex_endpoint(&endpoint, any, &r.field("Endpoint"))?
        } else {
            let pattern = endpoint.trim().to_owned();
            vec![(endpoint, pattern, false)]
        };
        for (_, pattern, regex) in &patterns {
            Endpoint::parse(pattern, *regex, &r.field("Endpoint"))?;
        }
        Ok(patterns
            .into_iter()
            .map(|(name, pattern, regex)| RuleConfig {
                name: Some(format!("{}{name}-{period_text}", self.prefix)),
                endpoint: pattern,
                regex,
                period: period.clone(),
                limit: limit as u64,
                key: self.key,
                monitor,
                per_endpoint: self.per_endpoint,
                ..RuleConfig::default()
            })
            .collect())
    }
}

/// A .NET `TimeSpan` as ASP.NET's configuration binder reads it (`TimeSpan.Parse`):
/// `[-][d.]hh:mm[:ss[.fffffff]]`, `d:hh:mm:ss[.fffffff]` (its general format, `"g"`), or a whole
/// number of days. `None` for anything else, or a negative or zero span.
fn timespan(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (days, clock) = match text.split_once(':') {
        None => (number(text)?, None),
        Some(_) => match text.split_once('.') {
            // `d.hh:mm...`: the dot before the first colon separates the days.
            Some((d, rest)) if !d.contains(':') => (number(d)?, Some(rest)),
            // `d:hh:mm:ss`: four parts, the first the days (`1:00:00:00` is a day there, and
            // `hh` is at most 23, so no four-part span is anything else).
            _ if text.matches(':').count() == 3 => {
                let (d, rest) = text.split_once(':')?;
                (number(d)?, Some(rest))
            }
            _ => (0, Some(text)),
        },
    };
    let mut nanos = u128::from(days) * 86_400 * 1_000_000_000;
    if let Some(clock) = clock {
        let mut parts = clock.split(':');
        let hours = number(parts.next()?)?;
        let minutes = number(parts.next()?)?;
        let (seconds, fraction) = match parts.next() {
            Some(s) => match s.split_once('.') {
                Some((whole, frac)) if frac.len() <= 7 && number(frac).is_some() => {
                    (number(whole)?, format!("{frac:0<9}").parse::<u128>().ok()?)
                }
                Some(_) => return None,
                None => (number(s)?, 0),
            },
            None => (0, 0),
        };
        if parts.next().is_some() || hours > 23 || minutes > 59 || seconds > 59 {
            return None;
        }
        nanos += (u128::from(hours) * 3600 + u128::from(minutes) * 60 + u128::from(seconds))
            * 1_000_000_000
            + fraction;
    }
    // Longer than a limiter's window can be (`TimeSpan.MaxValue` is 10675199 days): still a
    // `TimeSpan`, refused by the caller for what it is.
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    // Below a second by the remainder.
    let subsec = (nanos % 1_000_000_000) as u32;
    Some(std::time::Duration::new(secs, subsec)).filter(|d| !d.is_zero())
}

/// How AspNetCoreRateLimit formats `QuotaExceededResponse.Content` and `QuotaExceededMessage`
/// (.NET's `string.Format` with the limit, the period and the retry-after), as a body template:
/// `{0}`, `{1}` and `{2}` (alignment and format ignored) become `{limit}`, `{period}` and
/// `{retry_after}`. Every other brace is text: .NET's `{{` and `}}` are one brace each, and a
/// brace .NET would throw on is kept as written. A `{` of text is written `{{` in the template,
/// so that `{{rule}}` there is the text `{rule}` here, not the rule's name.
fn template_of_dotnet_format(format: &str) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut rest = format;
    let push_brace = |out: &mut String, brace: &str| {
        out.push_str(if brace == "{" { "{{" } else { "}" });
    };
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if after.starts_with("{{") || after.starts_with("}}") {
            push_brace(&mut out, &after[..1]);
            rest = &after[2..];
            continue;
        }
        let item = after
            .strip_prefix('{')
            .and_then(|item| item.split_once('}'))
            .and_then(|(item, rest)| {
                let index = item.split([',', ':']).next().unwrap_or_default().trim();
                let placeholder = match index {
                    "0" => "{limit}",
                    "1" => "{period}",
                    "2" => "{retry_after}",
                    _ => return None,
                };
                Some((placeholder, rest))
            });
        match item {
            Some((placeholder, after_item)) => {
                out.push_str(placeholder);
                rest = after_item;
            }
            None => {
                push_brace(&mut out, &after[..1]);
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The rules of a policy, and the section's general rules that still apply beside them there.
///
/// There a general rule gives way to a policy's only when one of the policy's rules has the same
/// `Period` text (`r.Period == generalLimit.Period`); rules of another text all apply, whatever
/// their windows. Here a specific rule displaces the general ones of its window, so a policy
/// rule of `60s` displaced the general `1m` rule that AspNetCoreRateLimit keeps applying (an
/// address with a generous policy escaped the general limit). Such a general rule is given to
/// the policy as well: it then competes with the policy's rules of its window, and the lower
/// limit applies, which is what both applying comes to (in a section every rule counts the
/// same requests, all of them or each `VERB:path`'s).
///
/// A general rule whose text the policy has too gives way there only to a policy rule of that
/// text that matches the request; here it gives way to any policy rule of its window that
/// matches. The two agree unless the policy has rules of that window written otherwise as well
/// (`1m` and `60s`): a request that only one of those matches is held to the general rule
/// there and not here (or, were it given to the policy, held to it here where a `1m` rule
/// replaces it there). That is refused, naming the policy's `rules_field`; so is a policy rule
/// of the general rule's text but another window (its `PeriodTimespan`), which the general rule
/// gives way to there and, in another window, does not here.
fn kept_general_rules(
    policy: Vec<(RuleConfig, String)>,
    general: &[(RuleConfig, String)],
    rules_field: &str,
) -> Result<Vec<RuleConfig>, HttpConfigError> {
    let window = |rule: &RuleConfig| parse_period(&rule.period, "").ok();
    for (g, text) in general {
        let same_text = policy.iter().any(|(_, t)| t == text);
        let other_text = policy
            .iter()
            .find(|(p, t)| t != text && window(p) == window(g));
        if let (true, Some((_, other))) = (same_text, other_text) {
            return Err(HttpConfigError::invalid(
                rules_field,
                format!(
                    "rules of one window written as {text:?} and as {other:?} beside the general \
                     rule {:?}: there that rule gives way only to a policy rule written {text:?} \
                     that matches the request, which rules here cannot express; write the \
                     policy's periods of one window alike",
                    g.name.as_deref().unwrap_or_default()
                ),
            ));
        }
        if policy
            .iter()
            .any(|(p, t)| t == text && window(p) != window(g))
        {
            return Err(HttpConfigError::invalid(
                rules_field,
                format!(
                    "a rule written {text:?} of another window (its PeriodTimespan) than the \
                     general rule {:?}: there that rule gives way to it, here only to rules of \
                     its own window; give the two the same window, or another Period",
                    g.name.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
    let kept: Vec<RuleConfig> = general
        .iter()
        .filter(|(g, text)| {
            !policy.iter().any(|(_, t)| t == text)
                && policy.iter().any(|(p, _)| window(p) == window(g))
        })
        .map(|(g, _)| g.clone())
        .collect();
    Ok(policy.into_iter().map(|(p, _)| p).chain(kept).collect())
}

/// The keys of a section that make its rejections' response.
const RESPONSE_KEYS: [&str; 4] = [
    "HttpStatusCode",
    "QuotaExceededResponse",
    "QuotaExceededMessage",
    "DisableRateLimitHeaders",
];

/// Whether the section `node` gives any of its response's keys.
fn gives_response(node: &Node<'_>) -> Result<bool, HttpConfigError> {
    for key in RESPONSE_KEYS {
        if node.get(key)?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Applies the response of the section `node` (its status, body, content type and headers) to
/// `response`.
fn apply_response(response: &mut ResponseConfig, node: &Node<'_>) -> Result<(), HttpConfigError> {
    if let Some(status) = node.status("HttpStatusCode")? {
        response.status = status;
    }
    let mut content = node.string("QuotaExceededMessage")?;
    let mut content_type = None;
    if let Some(q) = node.object("QuotaExceededResponse")? {
        // Its `StatusCode` defaults to 429 there and wins over `HttpStatusCode`; only a `null`
        // one leaves `HttpStatusCode` in force.
        match q.status("StatusCode")? {
            Some(status) => response.status = status,
            None if !q.is_null("StatusCode") => response.status = 429,
            None => {}
        }
        content_type = q.string("ContentType")?;
        if let Some(value) = &content_type {
            // Checked here so that the error names the document's field, not
            // `response.content_type`.
            if http::HeaderValue::from_str(value).is_err() {
                return Err(HttpConfigError::invalid(
                    q.field("ContentType"),
                    format!("{value:?} is not a valid header value"),
                ));
            }
        }
        content = q.string("Content")?.or(content);
    }
    match content {
        Some(content) => {
            response.body = Some(template_of_dotnet_format(&content));
            // There the content is `text/plain` unless `ContentType` says otherwise, as a
            // template's is here when `content_type` is unset.
            response.content_type = content_type;
        }
        None => {
            if content_type.is_some() {
                response.content_type = content_type;
            }
        }
    }
    if node.bool("DisableRateLimitHeaders")? {
        // There `Retry-After` is one of the rate-limit headers, sent only when they are.
        response.ietf_headers = false;
        response.legacy_headers = false;
        response.aspnet_headers = false;
        response.retry_after_header = false;
    }
    Ok(())
}

/// The largest `client_id_max_len` the compiler accepts.
const CLIENT_ID_MAX_LEN: usize = 4096;

/// Makes `config.client_id_max_len` long enough for the client id `id` that the document names
/// at `field` (a policy's `ClientId`, a `ClientWhitelist` entry). There a client id has no
/// length limit; here a longer one than the limit is no client id (so `anon`), and a policy or
/// whitelist entry for it would never apply.
fn fit_client_id(config: &mut HttpConfig, id: &str, field: &str) -> Result<(), HttpConfigError> {
    if id.len() > CLIENT_ID_MAX_LEN {
        return Err(HttpConfigError::invalid(
            field,
            format!(
                "a client id of {} bytes is longer than a client id is read here (at most {CLIENT_ID_MAX_LEN})",
                id.len()
            ),
        ));
    }
    config.client_id_max_len = config.client_id_max_len.max(id.len());
    Ok(())
}

/// Applies one section's options to `config`, and adds its general rules; returns them, with
/// their `Period` as written.
fn apply_options(
    config: &mut HttpConfig,
    options: &Options<'_>,
    section: &Section<'_>,
) -> Result<Vec<(RuleConfig, String)>, HttpConfigError> {
    let node = &options.node;
    if node.bool("StackBlockedRequests")? {
        return Err(HttpConfigError::invalid(
            node.field("StackBlockedRequests"),
            "true is not supported: rejected requests are never counted",
        ));
    }
    if let Some(p) = node.string("RateLimitCounterPrefix")? {
        config.backend.prefix = Some(p);
    }
    if let Some(h) = header_name(node, "RealIpHeader")? {
        config.client_ip.headers = vec![ForwardedHeader::Custom(h)];
    }
    if let Some(h) = header_name(node, "ClientIdHeader")? {
        config.client_id_header = Some(h);
    }
    apply_response(&mut config.response, node)?;
    // A section's whitelists exempt requests from its own rules only: the IP middleware and
    // the client middleware each check theirs there.
    let mut whitelist = KeyWhitelistConfig::new(section.key);
    for (field, entry) in node.entries("IpWhitelist")? {
        whitelist
            .ips
            .extend(ip_nets(&entry, &field, &config.client_ip)?);
    }
    for (field, endpoint) in node.entries("EndpointWhitelist")? {
        if !section.regex {
            Endpoint::parse(&endpoint, false, &field)?;
            whitelist.endpoints.push(endpoint);
            continue;
        }
        for (_, pattern, regex) in regex_endpoint(&endpoint, REGEX_ANY, &field)? {
            Endpoint::parse(&pattern, regex, &field)?;
            whitelist.endpoints.push(match regex {
                true => format!("re:{pattern}"),
                false => pattern,
            });
        }
    }
    for (field, id) in node.entries("ClientWhitelist")? {
        // Read at any length up to the most a client id is read here (`fit_client_id`), then
        // checked as the compiler checks it (an empty one), naming the document's field.
        fit_client_id(config, &id, &field)?;
        if let Some(message) = unusable_client_id(&id, config.client_id_max_len) {
            return Err(HttpConfigError::invalid(field, message));
        }
        whitelist.clients.push(id);
    }
    if whitelist != KeyWhitelistConfig::new(section.key) {
        config.whitelist.by_key.push(whitelist);
    }
    let rules = section.rules(node, "GeneralRules", GENERAL_ANY)?;
    config
        .rules
        .extend(rules.iter().map(|(rule, _)| rule.clone()));
    Ok(rules)
}

/// Translates a parsed AspNetCoreRateLimit document.
pub(crate) fn translate(value: serde_json::Value) -> Result<HttpConfig, HttpConfigError> {
    if !is_aspnet(&value) {
        return Err(HttpConfigError::Parse {
            format: "AspNetCoreRateLimit json",
            message: format!("none of the sections {SECTIONS:?} is present"),
        });
    }
    if let Some(native) = value
        .as_object()
        .and_then(|o| o.keys().find(|k| NATIVE.contains(&k.as_str())))
    {
        return Err(HttpConfigError::invalid(
            native.clone(),
            "is one of turnstile's own settings, which a document with AspNetCoreRateLimit's \
             sections does not read (it is translated from those): set it on the loaded \
             HttpConfig (its fields are public), or write the whole configuration in \
             turnstile's format",
        ));
    }
    let root = Node::of(&value, String::new())?;
    let options = |name: &str| -> Result<Option<Options<'_>>, HttpConfigError> {
        root.object(name)?.map(Options::of).transpose()
    };
    let ip = options("IpRateLimiting")?;
    let client = options("ClientRateLimiting")?;
    // One switch here, one per section there: on if either section has it on; a section that
    // has it off keeps only its `*` rules.
    let endpoints =
        |o: &Option<Options<'_>>| o.as_ref().is_some_and(|o| o.enable_endpoint_rate_limiting);
    let regex = |o: &Option<Options<'_>>| o.as_ref().is_some_and(|o| o.enable_regex_rule_matching);
    let (ip_endpoints, client_endpoints) = (endpoints(&ip), endpoints(&client));
    let endpoint_rate_limiting = ip_endpoints || client_endpoints;
    let ip_section = Section {
        key: RuleKey::Ip,
        prefix: "",
        per_endpoint: ip_endpoints,
        only_any: !ip_endpoints,
        regex: regex(&ip),
    };
    let client_section = Section {
        key: RuleKey::Client,
        prefix: "client:",
        per_endpoint: client_endpoints,
        only_any: !client_endpoints,
        regex: regex(&client),
    };
    let mut config = HttpConfig {
        endpoint_rate_limiting,
        // AspNetCoreRateLimit's defaults, which a section may replace: a document that relies
        // on them has its client rules and client whitelist count `X-ClientId` (not nothing),
        // and reads the address `X-Real-IP` from trusted proxies, as there.
        client_id_header: Some("X-ClientId".to_owned()),
        // There a request without the client id header is the client "anon"
        // (`clientId ?? "anon"`), counted, listed and given policies like any other.
        anonymous_client_id: Some("anon".to_owned()),
        // There the path is counted and matched without its trailing `/`.
        trim_trailing_slash: true,
        // Its own `X-Rate-Limit-*` on admitted responses, which its clients may read, unless a
        // section's `DisableRateLimitHeaders` turns them off (`apply_response`).
        response: ResponseConfig {
            aspnet_headers: true,
            ..ResponseConfig::default()
        },
        ..HttpConfig::default()
    };
    config.client_ip.headers = vec![ForwardedHeader::Custom("X-Real-IP".to_owned())];
    // One response here for every rejection, where each section has its own there: two
    // sections that give different ones cannot both be kept.
    if let (Some(i), Some(c)) = (&ip, &client)
        && gives_response(&i.node)?
        && gives_response(&c.node)?
    {
        let (mut of_ip, mut of_client) = (ResponseConfig::default(), ResponseConfig::default());
        apply_response(&mut of_ip, &i.node)?;
        apply_response(&mut of_client, &c.node)?;
        if of_ip != of_client {
            return Err(HttpConfigError::invalid(
                c.node.path.clone(),
                format!(
                    "its response ({}) differs from IpRateLimiting's: every rejection has one \
                     response here, so give both sections the same, or give it in one only",
                    RESPONSE_KEYS.join(", ")
                ),
            ));
        }
    }
    let mut ip_general = Vec::new();
    if let Some(o) = &ip {
        ip_general = apply_options(&mut config, o, &ip_section)?;
    }
    let mut client_general = Vec::new();
    if let Some(o) = &client {
        client_general = apply_options(&mut config, o, &client_section)?;
    }
    // One of each is read here, as there (where both middlewares share one resolver of each):
    // the client id the client section's header gives (applied last), and the address the IP
    // section's gives.
    if let Some(h) = ip
        .as_ref()
        .map(|o| header_name(&o.node, "RealIpHeader"))
        .transpose()?
        .flatten()
    {
        config.client_ip.headers = vec![ForwardedHeader::Custom(h)];
    }
    if let Some(p) = root.object("IpRateLimitPolicies")? {
        for policy in p.objects("IpRules")? {
            let ip = policy.string("Ip")?.unwrap_or_default();
            let nets = ip_nets(&ip, &policy.field("Ip"), &config.client_ip)?;
            let rules = kept_general_rules(
                ip_section.rules(&policy, "Rules", REGEX_ANY)?,
                &ip_general,
                &policy.field("Rules"),
            )?;
            // A range that is several CIDR ranges is one entry each, with the same rules: each
            // client is in one of them, and counted by that one's rules alone.
            for ip in nets {
                config.ip_rules.push(IpRulesConfig {
                    ip,
                    rules: rules.clone(),
                });
            }
        }
    }
    if let Some(p) = root.object("ClientRateLimitPolicies")? {
        for policy in p.objects("ClientRules")? {
            let client_id = policy.string("ClientId")?.unwrap_or_default();
            if client_id.is_empty() {
                return Err(HttpConfigError::invalid(
                    policy.field("ClientId"),
                    "must not be empty",
                ));
            }
            // Refused as the compiler refuses it, but naming the document's field (the
            // translated `client_rules[i]` need not have the document's index).
            if config.client_rules.iter().any(|c| c.client_id == client_id) {
                return Err(HttpConfigError::invalid(
                    policy.field("ClientId"),
                    format!("duplicate client id {client_id:?}: give each client one policy"),
                ));
            }
            fit_client_id(&mut config, &client_id, &policy.field("ClientId"))?;
            config.client_rules.push(ClientRulesConfig {
                client_id,
                rules: kept_general_rules(
                    client_section.rules(&policy, "Rules", REGEX_ANY)?,
                    &client_general,
                    &policy.field("Rules"),
                )?,
            });
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use crate::http::{
        ForwardedHeader, HttpConfig, HttpLimiter, Outcome, QuotaState, RejectReason, RequestInfo,
        Verdict, rejection_response,
    };
    use std::time::Duration;

    /// `NATIVE` lists every top-level setting of turnstile's format, as serde names them in
    /// its error for an unknown one: a setting added later is refused beside the sections too.
    #[test]
    fn native_lists_every_top_level_setting() {
        let e = serde_json::from_str::<HttpConfig>(r#"{"not_a_setting": 1}"#)
            .unwrap_err()
            .to_string();
        let (_, expected) = e.split_once("expected one of ").expect(&e);
        let mut fields: Vec<&str> = expected
            .split(", ")
            .map(|f| f.split('`').nth(1).expect(f))
            .collect();
        let mut native = super::NATIVE.to_vec();
        fields.sort_unstable();
        native.sort_unstable();
        assert_eq!(fields, native, "{e}");
    }

    /// The body a translated configuration sends for a rejection by a 2-per-second rule with
    /// 700 ms to wait.
    fn rejection_body(config: &HttpConfig) -> (String, String) {
        let verdict = Verdict {
            outcome: Outcome::Rejected {
                reason: RejectReason::RateLimited,
                rule: "*-1s".into(),
                retry_after: Some(Duration::from_millis(700)),
            },
            quotas: QuotaState {
                policy: "*-1s".into(),
                limit: 2,
                window: Duration::from_secs(1),
                remaining: 0,
                reset_after: Duration::from_millis(700),
            }
            .into(),
        };
        let response = rejection_response(&verdict, &config.response).unwrap();
        (
            String::from_utf8(response.body().to_vec()).unwrap(),
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned(),
        )
    }

    /// AspNetCoreRateLimit's `QuotaExceededResponse.Content` is a .NET format string (`{0}`
    /// the limit, `{1}` the period, `{2}` the retry-after, `{{` and `}}` literal braces), as in
    /// its demo's `appsettings.json`: the body must be the JSON document it formats to.
    #[test]
    fn quota_exceeded_content_is_a_dotnet_format_string() {
        let config = HttpConfig::from_aspnet_json(
            r#"{"IpRateLimiting": {
                "QuotaExceededResponse": {
                  "Content": "{{ \"message\": \"Whoa! Calm down, cowboy!\", \"details\": \"Quota exceeded. Maximum allowed: {0} per {1}. Please try again in {2} second(s).\" }}",
                  "ContentType": "application/json"
                },
                "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]}}"#,
        )
        .unwrap();
        let (body, content_type) = rejection_body(&config);
        assert_eq!(content_type, "application/json");
        let body: serde_json::Value = serde_json::from_str(&body).expect(&body);
        assert_eq!(
            body["details"],
            "Quota exceeded. Maximum allowed: 2 per 1s. Please try again in 1 second(s)."
        );
    }

    /// Without `ContentType`, AspNetCoreRateLimit sends its content as `text/plain`; the older
    /// `QuotaExceededMessage` is the content when `QuotaExceededResponse` gives none.
    #[test]
    fn quota_exceeded_message_and_content_type_default() {
        let config = HttpConfig::from_aspnet_json(
            r#"{"IpRateLimiting": {
                "QuotaExceededMessage": "Slow down: {0} per {1}, retry in {2} s {x}",
                "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]}}"#,
        )
        .unwrap();
        assert_eq!(
            rejection_body(&config),
            (
                "Slow down: 2 per 1s, retry in 1 s {x}".to_owned(),
                "text/plain; charset=utf-8".to_owned()
            )
        );
        let config = HttpConfig::from_aspnet_json(
            r#"{"IpRateLimiting": {
                "QuotaExceededMessage": "ignored",
                "QuotaExceededResponse": {"Content": "Limit {0}{{}}"},
                "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]}}"#,
        )
        .unwrap();
        assert_eq!(
            rejection_body(&config),
            (
                "Limit 2{}".to_owned(),
                "text/plain; charset=utf-8".to_owned()
            )
        );
        // No content configured: the problem+json document, with its own content type.
        let config = HttpConfig::from_aspnet_json(
            r#"{"IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]}}"#,
        )
        .unwrap();
        assert_eq!(rejection_body(&config).1, "application/problem+json");
    }

    /// AspNetCoreRateLimit reads the client id from `X-ClientId` and the forwarded address from
    /// `X-Real-IP` unless told otherwise: a `ClientRateLimiting` section that leaves
    /// `ClientIdHeader` out counts clients by `X-ClientId`, not nothing.
    #[test]
    fn client_id_and_real_ip_headers_default_as_there() {
        let doc = r#"{"ClientRateLimiting": {
            "ClientWhitelist": ["dev-id-1"],
            "GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 1}]}}"#;
        let config = HttpConfig::from_aspnet_json(doc).unwrap();
        assert_eq!(config.client_id_header.as_deref(), Some("X-ClientId"));
        assert_eq!(
            config.client_ip.headers,
            [ForwardedHeader::Custom("X-Real-IP".to_owned())]
        );
        let limiter = HttpLimiter::with_clock(config, crate::ManualClock::new()).unwrap();
        let decide = |client: &str| {
            limiter
                .decide(&RequestInfo {
                    method: &http::Method::GET,
                    path: "/api/values",
                    client_ip: None,
                    client_id: Some(client),
                })
                .outcome
        };
        assert_eq!(decide("cl-1"), Outcome::Admitted);
        assert!(matches!(decide("cl-1"), Outcome::Rejected { .. }));
        assert_eq!(decide("dev-id-1"), Outcome::Whitelisted);
        // A header either section names is kept.
        let config = HttpConfig::from_aspnet_json(
            r#"{"IpRateLimiting": {"RealIpHeader": "CF-Connecting-IP"},
                "ClientRateLimiting": {"ClientIdHeader": "X-Api-Key"}}"#,
        )
        .unwrap();
        assert_eq!(config.client_id_header.as_deref(), Some("X-Api-Key"));
        assert_eq!(
            config.client_ip.headers,
            [ForwardedHeader::Custom("CF-Connecting-IP".to_owned())]
        );
    }

    /// `EnableEndpointRateLimiting` is an option of each section: the IP section's endpoint
    /// rules apply although the client section leaves it off, and the client section's endpoint
    /// rules do not.
    #[test]
    fn endpoint_rate_limiting_is_per_section() {
        let doc = r#"{
          "IpRateLimiting": {"EnableEndpointRateLimiting": true, "GeneralRules": [
            {"Endpoint": "post:/api/orders", "Period": "1m", "Limit": 1}]},
          "IpRateLimitPolicies": {"IpRules": [{"Ip": "10.0.0.1", "Rules": [
            {"Endpoint": "post:/api/orders", "Period": "1m", "Limit": 2}]}]},
          "ClientRateLimiting": {"ClientIdHeader": "X-ClientId", "GeneralRules": [
            {"Endpoint": "get:/api/orders", "Period": "1m", "Limit": 1},
            {"Endpoint": "*", "Period": "1h", "Limit": 100}]},
          "ClientRateLimitPolicies": {"ClientRules": [{"ClientId": "c1", "Rules": [
            {"Endpoint": "get:/api/orders", "Period": "1m", "Limit": 1}]}]}
        }"#;
        let config = HttpConfig::from_aspnet_json(doc).unwrap();
        let limiter = HttpLimiter::with_clock(config, crate::ManualClock::new()).unwrap();
        let decide = |method: &http::Method, ip: [u8; 4], client: &str| {
            let verdict = limiter.decide(&RequestInfo {
                method,
                path: "/api/orders",
                client_ip: Some(ip.into()),
                client_id: Some(client),
            });
            let limited = matches!(verdict.outcome, Outcome::Rejected { .. });
            let mut names: Vec<String> = verdict
                .quotas
                .iter()
                .map(|q| q.policy.to_string())
                .collect();
            names.sort();
            (limited, names)
        };
        let post = http::Method::POST;
        let get = http::Method::GET;
        assert_eq!(
            decide(&post, [1, 1, 1, 1], "a"),
            (
                false,
                vec!["client:*-1h".to_owned(), "post:/api/orders-1m".to_owned()]
            )
        );
        assert!(
            decide(&post, [1, 1, 1, 1], "b").0,
            "the IP endpoint rule applies"
        );
        // The IP policy follows its section's option too: 2 for 10.0.0.1.
        assert!(!decide(&post, [10, 0, 0, 1], "a").0);
        assert!(!decide(&post, [10, 0, 0, 1], "b").0);
        assert!(decide(&post, [10, 0, 0, 1], "c").0);
        // The client section's endpoint rules never apply (only its `*` rules do).
        for _ in 0..3 {
            assert_eq!(
                decide(&get, [2, 2, 2, 2], "c1"),
                (false, vec!["client:*-1h".to_owned()])
            );
        }
    }
}
