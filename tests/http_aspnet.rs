//! AspNetCoreRateLimit documents as ASP.NET itself reads them: keys in any case, values from
//! their text, comments and trailing commas, regex rule matching, its periods; errors naming
//! the field; no panic on any shape of document. And a JSON body template stays JSON when a
//! value it names is absent.
#![cfg(feature = "http")]

use proptest::prelude::*;
use std::time::Duration;
use turnstile::ManualClock;
use turnstile::http::{HttpConfig, HttpLimiter, Outcome, RequestInfo, Verdict};

fn limiter(config: HttpConfig) -> HttpLimiter<ManualClock> {
    HttpLimiter::with_clock(config, ManualClock::new()).expect("valid configuration")
}

fn decide(l: &HttpLimiter<ManualClock>, method: &http::Method, path: &str, ip: [u8; 4]) -> Verdict {
    l.decide(&RequestInfo {
        method,
        path,
        client_ip: Some(ip.into()),
        client_id: None,
    })
}

fn rejected(v: &Verdict) -> bool {
    matches!(v.outcome, Outcome::Rejected { .. })
}

fn err(doc: &str) -> String {
    match HttpConfig::from_json_str(doc) {
        Ok(config) => HttpLimiter::with_clock(config, ManualClock::new())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("accepted: {doc}")),
        Err(e) => e.to_string(),
    }
}

/// ASP.NET's configuration binder matches section and property names case-insensitively, so a
/// camelCase `appsettings.json` works there. Read case-sensitively, `"limit": 100` was no
/// limit at all (a limit of 0: every request blocked), `"endpoint"` a rule for every path and
/// `"ipWhitelist"` nobody whitelisted.
#[test]
fn aspnet_keys_are_case_insensitive_as_in_aspnet_configuration() {
    let pascal = r#"{
      "IpRateLimiting": {
        "EnableEndpointRateLimiting": true,
        "IpWhitelist": ["10.0.0.0/8"],
        "GeneralRules": [
          {"Endpoint": "post:/api/orders", "Period": "1m", "Limit": 2},
          {"Endpoint": "*", "Period": "1h", "Limit": 100}]},
      "IpRateLimitPolicies": {"IpRules": [{"Ip": "192.0.2.1", "Rules": [
          {"Endpoint": "*", "Period": "1h", "Limit": 5}]}]}
    }"#;
    let camel = r#"{
      "ipRateLimiting": {
        "enableEndpointRateLimiting": true,
        "ipWhitelist": ["10.0.0.0/8"],
        "generalRules": [
          {"endpoint": "post:/api/orders", "period": "1m", "limit": 2},
          {"ENDPOINT": "*", "PERIOD": "1h", "LIMIT": 100}]},
      "ipRateLimitPolicies": {"ipRules": [{"ip": "192.0.2.1", "rules": [
          {"endpoint": "*", "period": "1h", "limit": 5}]}]}
    }"#;
    let expected = HttpConfig::from_json_str(pascal).unwrap();
    assert_eq!(HttpConfig::from_json_str(camel).unwrap(), expected);
    assert_eq!(HttpConfig::from_aspnet_json(camel).unwrap(), expected);
    let l = limiter(HttpConfig::from_json_str(camel).unwrap());
    let post = http::Method::POST;
    assert!(!rejected(&decide(&l, &post, "/api/orders", [1, 1, 1, 1])));
    assert!(!rejected(&decide(&l, &post, "/api/orders", [1, 1, 1, 1])));
    assert!(rejected(&decide(&l, &post, "/api/orders", [1, 1, 1, 1])));
    assert!(!rejected(&decide(
        &l,
        &http::Method::GET,
        "/",
        [1, 1, 1, 1]
    )));
    assert_eq!(
        decide(&l, &post, "/api/orders", [10, 1, 1, 1]).outcome,
        Outcome::Whitelisted
    );
    // One key in two cases is ambiguous; ASP.NET refuses the file, and so is it refused here.
    let e =
        err(r#"{"IpRateLimiting": {"GeneralRules": [{"Period": "1s", "Limit": 1, "limit": 5}]}}"#);
    assert!(
        e.starts_with("IpRateLimiting.GeneralRules[0].Limit: given twice"),
        "{e}"
    );
}

/// Every configuration value is text to ASP.NET's binder (environment variables and
/// command-line overrides are text too), so `"Limit": "100"` binds there. A value of the wrong
/// kind is an error naming the field, not just the section.
#[test]
fn aspnet_values_bind_from_text_and_errors_name_the_field() {
    let doc = r#"{"IpRateLimiting": {
        "EnableEndpointRateLimiting": "True", "HttpStatusCode": "503",
        "GeneralRules": [{"Endpoint": "get:/a", "Period": "1m", "Limit": "1"}]}}"#;
    let config = HttpConfig::from_json_str(doc).unwrap();
    assert!(config.endpoint_rate_limiting);
    assert_eq!(config.response.status, 503);
    assert_eq!(config.rules[0].limit, 1);
    for (doc, field) in [
        (
            r#"{"IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 1}, {"Endpoint": "*", "Period": "1s", "Limit": "ten"}]}}"#,
            "IpRateLimiting.GeneralRules[1].Limit: expected a number",
        ),
        (
            r#"{"IpRateLimitPolicies": {"IpRules": [{"Ip": "192.0.2.1", "Rules": [{"Period": ["1s"]}]}]}}"#,
            "IpRateLimitPolicies.IpRules[0].Rules[0].Period: expected a string",
        ),
        (
            r#"{"ClientRateLimiting": {"EnableEndpointRateLimiting": "yes"}}"#,
            "ClientRateLimiting.EnableEndpointRateLimiting: expected true or false",
        ),
        (
            r#"{"IpRateLimiting": {"QuotaExceededResponse": {"StatusCode": 4290}}}"#,
            "IpRateLimiting.QuotaExceededResponse.StatusCode: 4290 is not an error status",
        ),
        (
            r#"{"IpRateLimiting": {"HttpStatusCode": 204}}"#,
            "IpRateLimiting.HttpStatusCode: 204 is not an error status",
        ),
    ] {
        let e = err(doc);
        assert!(e.starts_with(field), "expected {field:?}, got {e:?}");
    }
}

/// ASP.NET's JSON configuration skips comments and accepts trailing commas, and many an
/// `appsettings.json` has them; the same file must load here. Text inside strings that looks
/// like a comment stays as it is.
#[test]
fn appsettings_with_comments_and_trailing_commas_load() {
    let doc = r#"{
      // Rate limiting, see https://github.com/stefanprodan/AspNetCoreRateLimit
      "Logging": {"LogLevel": {"Default": "Information",},},
      "IpRateLimiting": {
        /* a block comment,
           over two lines */
        "QuotaExceededMessage": "see http://example.com/limits, /* not a comment */",
        "GeneralRules": [
          { "Endpoint": "*", "Period": "1s", "Limit": 2, }, // two per second
        ],
      },
    }"#;
    for config in [
        HttpConfig::from_json_str(doc).unwrap(),
        HttpConfig::from_aspnet_json(doc).unwrap(),
    ] {
        assert_eq!(config.rules.len(), 1);
        assert_eq!(config.rules[0].limit, 2);
        assert_eq!(
            config.response.body.as_deref(),
            Some("see http://example.com/limits, /* not a comment */")
        );
    }
}

/// With `EnableRegexRuleMatching`, AspNetCoreRateLimit's patterns are regular expressions over
/// `verb:path`, anchored. Read as globs, `get:/api/v\d+/items` matched no request: the rule
/// silently limited nothing.
#[test]
fn aspnet_regex_rule_matching_is_honoured() {
    let get = http::Method::GET;
    let ip = [1, 1, 1, 1];
    let one = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "EnableRegexRuleMatching": true,
        "GeneralRules": [{"Endpoint": "get:/api/v\\d+/items", "Period": "1m", "Limit": 1}]}}"#;
    let l = limiter(HttpConfig::from_json_str(one).unwrap());
    assert!(!rejected(&decide(&l, &get, "/api/v1/items", ip)));
    assert!(
        rejected(&decide(&l, &get, "/api/v1/items", ip)),
        "the rule applies"
    );

    let doc = r#"{"IpRateLimiting": {
        "EnableEndpointRateLimiting": true,
        "EnableRegexRuleMatching": true,
        "EndpointWhitelist": ["get:/api/health"],
        "GeneralRules": [
          {"Endpoint": "get:/api/v\\d+/items", "Period": "1m", "Limit": 1},
          {"Endpoint": ".+:/api/admin/.*", "Period": "1h", "Limit": 1},
          {"Endpoint": ".+", "Period": "1d", "Limit": 1000}]}}"#;
    let l = limiter(HttpConfig::from_json_str(doc).unwrap());
    assert!(!rejected(&decide(&l, &get, "/api/v1/items", ip)));
    assert!(
        rejected(&decide(&l, &get, "/API/V1/items", ip)),
        "case-insensitive, as there"
    );
    // Anchored at both ends, and for GET only.
    assert!(!rejected(&decide(&l, &get, "/api/v1/items/7", ip)));
    assert!(!rejected(&decide(
        &l,
        &http::Method::POST,
        "/api/v1/items",
        ip
    )));
    let delete = http::Method::DELETE;
    assert!(!rejected(&decide(&l, &delete, "/api/admin/users", ip)));
    assert!(rejected(&decide(&l, &delete, "/api/admin/users", ip)));
    // `.+` is every request: one quota more on a path no other rule matches.
    assert_eq!(decide(&l, &get, "/other", ip).quotas.len(), 1);
    // The whitelist is a regex too, anchored.
    assert_eq!(
        decide(&l, &get, "/api/health", ip).outcome,
        Outcome::Whitelisted
    );
    assert_ne!(
        decide(&l, &get, "/api/healthz", ip).outcome,
        Outcome::Whitelisted
    );
    // Without endpoint rate limiting only the `*` rules apply there, and `.+` is not one.
    let off = r#"{"IpRateLimiting": {"EnableRegexRuleMatching": true, "GeneralRules": [
        {"Endpoint": ".+", "Period": "1m", "Limit": 1},
        {"Endpoint": "*", "Period": "1h", "Limit": 100}]}}"#;
    let l = limiter(HttpConfig::from_json_str(off).unwrap());
    let v = decide(&l, &get, "/", ip);
    let policies: Vec<String> = v.quotas.iter().map(|q| q.policy.to_string()).collect();
    assert_eq!(policies, ["*-1h"]);
    // A method part matching no method is refused, naming the rule.
    let e = err(
        r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "EnableRegexRuleMatching": true,
        "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 1},
                         {"Endpoint": "(fetch|grab):/x", "Period": "1s", "Limit": 1}]}}"#,
    );
    assert!(
        e.starts_with("IpRateLimiting.GeneralRules[1].Endpoint:"),
        "{e}"
    );
}

/// AspNetCoreRateLimit's documentation limits POST and PUT together with
/// `((post)|(put)):/api/values`: a regex over the method part becomes one rule per method it
/// matches (each counts its own `VERB:path` there too), and its `(?:...)` groups are read
/// whole.
#[test]
fn aspnet_regex_method_alternatives_become_a_rule_each() {
    let ip = [1, 1, 1, 1];
    for endpoint in ["((post)|(put)):/api/values", "(?:post|put):/api/values"] {
        let doc = format!(
            r#"{{"IpRateLimiting": {{"EnableEndpointRateLimiting": true, "EnableRegexRuleMatching": true,
            "GeneralRules": [{{"Endpoint": "{endpoint}", "Period": "1h", "Limit": 1}}]}}}}"#
        );
        let l = limiter(HttpConfig::from_json_str(&doc).unwrap());
        for method in [http::Method::POST, http::Method::PUT] {
            let first = decide(&l, &method, "/api/values", ip);
            assert!(!rejected(&first), "{endpoint}: {method}");
            let policies: Vec<String> = first.quotas.iter().map(|q| q.policy.to_string()).collect();
            assert_eq!(
                policies,
                [format!("{}:/api/values-1h", method.as_str().to_lowercase())]
            );
            assert!(
                rejected(&decide(&l, &method, "/api/values", ip)),
                "{endpoint}: {method}"
            );
        }
        let get = decide(&l, &http::Method::GET, "/api/values", ip);
        assert!(get.quotas.is_empty(), "{endpoint}: GET is not limited");
    }
}

/// There a general rule's regex is matched against `*:path` as well as `verb:path`, the first
/// for the rules of any method: a method part that matches `*` (`(get|\*)`, `.`) limits every
/// method. `(get|\*)` was read as the methods it names, GET alone, and POST went unlimited;
/// `.` names none, and was refused. A policy's rules are matched against `.+:path` instead
/// (the text): there `(get|\.\+)` is every method and `(get|\*)` GET alone.
#[test]
fn aspnet_regex_method_part_matching_a_star_is_every_method() {
    let ip = [1, 1, 1, 1];
    for endpoint in [r"(get|\\*):/api/values", ".:/api/values"] {
        let doc = format!(
            r#"{{"IpRateLimiting": {{"EnableEndpointRateLimiting": true, "EnableRegexRuleMatching": true,
            "GeneralRules": [{{"Endpoint": "{endpoint}", "Period": "1h", "Limit": 1}}]}}}}"#
        );
        let l = limiter(HttpConfig::from_json_str(&doc).unwrap());
        for method in [http::Method::POST, http::Method::GET, http::Method::DELETE] {
            assert!(
                !rejected(&decide(&l, &method, "/api/values", ip)),
                "{endpoint}: {method}"
            );
            assert!(
                rejected(&decide(&l, &method, "/api/values", ip)),
                "{endpoint}: {method}"
            );
        }
        assert!(
            decide(&l, &http::Method::POST, "/api/other", ip)
                .quotas
                .is_empty()
        );
    }
    let doc = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "EnableRegexRuleMatching": true},
        "IpRateLimitPolicies": {"IpRules": [{"Ip": "1.1.1.1", "Rules": [
          {"Endpoint": "(get|\\.\\+):/api/a", "Period": "1h", "Limit": 1},
          {"Endpoint": "(get|\\*):/api/b", "Period": "1h", "Limit": 1}]}]}}"#;
    let l = limiter(HttpConfig::from_json_str(doc).unwrap());
    let delete = http::Method::DELETE;
    assert!(!rejected(&decide(&l, &delete, "/api/a", ip)));
    assert!(rejected(&decide(&l, &delete, "/api/a", ip)));
    assert!(decide(&l, &delete, "/api/b", ip).quotas.is_empty());
    assert!(!rejected(&decide(&l, &http::Method::GET, "/api/b", ip)));
    assert!(rejected(&decide(&l, &http::Method::GET, "/api/b", ip)));
}

/// There a regex pattern is anchored as `^` + pattern + `$`, so a `|` outside any group splits
/// the whole `verb:path` expression and the anchors bind to its ends only: `get:/api/a|get:/api/b`
/// limits GET /api/b (and every path starting with `/api/a`), `get|post:/x` every GET. Split at
/// its first `:`, it was read as GET and the path `/api/a|get:/api/b`: GET /api/b went
/// unlimited. Refused now, naming the field; grouped alternatives still load.
#[test]
fn aspnet_regex_alternation_of_the_whole_pattern_is_refused() {
    let doc = |endpoint: &str| {
        format!(
            r#"{{"IpRateLimiting": {{"EnableEndpointRateLimiting": true, "EnableRegexRuleMatching": true,
            "EndpointWhitelist": ["get:/health"],
            "GeneralRules": [{{"Endpoint": "*", "Period": "1h", "Limit": 100}},
                             {{"Endpoint": "{endpoint}", "Period": "1m", "Limit": 1}}]}}}}"#
        )
    };
    for endpoint in [
        "get:/api/a|get:/api/b",
        "get|post:/x",
        "^get:/a$|^post:/b$",
        "get:/api/(a|b)|post:/c",
        r"get:/api/\\(a|b\\)",
    ] {
        let e = err(&doc(endpoint));
        assert!(
            e.starts_with("IpRateLimiting.GeneralRules[1].Endpoint:") && e.contains("`|`"),
            "{endpoint}: {e}"
        );
    }
    // The whitelist is read the same way.
    let e = err(&doc("*").replace("get:/health", "get:/health|get:/ready"));
    assert!(e.starts_with("IpRateLimiting.EndpointWhitelist[0]:"), "{e}");
    // A `|` inside a group, a class or escaped is no alternation of the whole pattern.
    for (endpoint, path) in [
        ("get:/api/(a|b)", "/api/b"),
        ("(get|post):/api/b", "/api/b"),
        ("get:/api/[|]b", "/api/|b"),
        ("get:/api/[]|]b", "/api/|b"),
        (r"get:/api/a\\|b", "/api/a|b"),
    ] {
        let l = limiter(
            HttpConfig::from_json_str(&doc(endpoint)).unwrap_or_else(|e| panic!("{endpoint}: {e}")),
        );
        let get = http::Method::GET;
        assert!(
            !rejected(&decide(&l, &get, path, [1, 1, 1, 1])),
            "{endpoint}"
        );
        assert!(
            rejected(&decide(&l, &get, path, [1, 1, 1, 1])),
            "{endpoint}"
        );
    }
}

/// There, wildcard patterns match the whole `VERB:path` (AspNetCoreRateLimit 4 and 5):
/// `*:/api/values` is not `/api/values/1`, which `*:/api/values*` is.
#[test]
fn aspnet_wildcards_match_the_whole_path() {
    let ip = [1, 1, 1, 1];
    let doc = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "GeneralRules": [
        {"Endpoint": "*:/api/values", "Period": "1m", "Limit": 1},
        {"Endpoint": "get:/api/items*", "Period": "1h", "Limit": 1},
        {"Endpoint": "*:/api/?/x", "Period": "1d", "Limit": 1}]}}"#;
    let l = limiter(HttpConfig::from_json_str(doc).unwrap());
    let get = http::Method::GET;
    let names = |path: &str| -> Vec<String> {
        decide(&l, &get, path, ip)
            .quotas
            .iter()
            .map(|q| q.policy.to_string())
            .collect()
    };
    assert_eq!(names("/api/values"), ["*:/api/values-1m"]);
    assert!(names("/api/values/1").is_empty());
    assert_eq!(names("/API/Items/7"), ["get:/api/items*-1h"]);
    assert_eq!(names("/api/a/x"), ["*:/api/?/x-1d"]);
    assert!(names("/api/ab/x").is_empty());
}

/// A wildcard may start the path part there (`*:*/health` is every path that ends in
/// `/health`, the `*` matching its leading `/` too). Such a pattern was refused here ("must
/// start with '/'"), so a document with one did not load; a path part that starts with
/// neither `/` nor a wildcard, which no request matches there, still is.
#[test]
fn aspnet_a_wildcard_may_start_the_path() {
    let ip = [1, 1, 1, 1];
    let doc = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "GeneralRules": [
        {"Endpoint": "*:*/health", "Period": "1m", "Limit": 1},
        {"Endpoint": "get:?api/items", "Period": "1h", "Limit": 1}]}}"#;
    let l = limiter(HttpConfig::from_json_str(doc).expect("loads"));
    let get = http::Method::GET;
    let names = |path: &str| -> Vec<String> {
        decide(&l, &get, path, ip)
            .quotas
            .iter()
            .map(|q| q.policy.to_string())
            .collect()
    };
    assert_eq!(names("/health"), ["*:*/health-1m"]);
    assert_eq!(names("/api/v2/health"), ["*:*/health-1m"]);
    assert!(names("/healthz").is_empty());
    assert_eq!(names("/api/items"), ["get:?api/items-1h"]);
    let e = err(
        r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "GeneralRules": [
        {"Endpoint": "get:api/items", "Period": "1m", "Limit": 1}]}}"#,
    );
    assert!(
        e.starts_with("IpRateLimiting.GeneralRules[0].Endpoint:"),
        "{e}"
    );
}

/// A rule's `PeriodTimespan` (a .NET `TimeSpan`) is its window there, whatever `Period` says;
/// and a `QuotaExceededResponse` without a `StatusCode` answers 429 (its default there), over
/// `HttpStatusCode`.
#[test]
fn aspnet_period_timespan_and_quota_response_status_are_theirs() {
    let doc = r#"{"IpRateLimiting": {"HttpStatusCode": 503,
        "QuotaExceededResponse": {"Content": "slow down"},
        "GeneralRules": [
          {"Endpoint": "*", "Period": "1s", "PeriodTimespan": "00:00:30", "Limit": 1},
          {"Endpoint": "*", "Period": "1d", "PeriodTimespan": "2.00:00:00.5", "Limit": 10}]}}"#;
    let config = HttpConfig::from_json_str(doc).unwrap();
    assert_eq!(config.response.status, 429);
    let periods: Vec<&str> = config.rules.iter().map(|r| r.period.as_str()).collect();
    assert_eq!(periods, ["30s", "2days 500ms"]);
    let windows: Vec<Duration> = limiter(config.clone())
        .decide(&RequestInfo {
            method: &http::Method::GET,
            path: "/",
            client_ip: Some([1, 1, 1, 1].into()),
            client_id: None,
        })
        .quotas
        .iter()
        .map(|q| q.window)
        .collect();
    assert!(windows.contains(&Duration::from_secs(30)), "{windows:?}");
    // A null `StatusCode` leaves `HttpStatusCode` in force.
    let null = r#"{"IpRateLimiting": {"HttpStatusCode": 503,
        "QuotaExceededResponse": {"StatusCode": null},
        "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 1}]}}"#;
    assert_eq!(
        HttpConfig::from_json_str(null).unwrap().response.status,
        503
    );
    // A span that is not one is an error naming the field.
    let e = err(
        r#"{"IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1s", "PeriodTimespan": "30 seconds", "Limit": 1}]}}"#,
    );
    assert!(
        e.starts_with("IpRateLimiting.GeneralRules[0].PeriodTimespan:"),
        "{e}"
    );
}

/// `PeriodTimespan` is bound by .NET's `TimeSpan.Parse`, which also reads its general format,
/// `d:hh:mm:ss[.fffffff]` (`1:00:00:00` is one day; `TimeSpan.ToString("g")` writes a span of
/// days so). Such a document was refused as "not a .NET TimeSpan"; the hours of that form are
/// still at most 23.
#[test]
fn aspnet_period_timespan_reads_the_days_colon_form() {
    let doc = r#"{"IpRateLimiting": {"GeneralRules": [
        {"Endpoint": "*", "Period": "1d", "PeriodTimespan": "1:00:00:00", "Limit": 1},
        {"Endpoint": "*", "Period": "2d", "PeriodTimespan": "2:03:04:05.5", "Limit": 1}]}}"#;
    let config = HttpConfig::from_json_str(doc).expect("loads");
    let windows: Vec<Duration> = limiter(config)
        .decide(&RequestInfo {
            method: &http::Method::GET,
            path: "/",
            client_ip: Some([1, 1, 1, 1].into()),
            client_id: None,
        })
        .quotas
        .iter()
        .map(|q| q.window)
        .collect();
    assert_eq!(
        windows,
        [
            Duration::from_secs(86_400),
            Duration::from_millis(((2 * 24 + 3) * 3_600 + 4 * 60 + 5) * 1_000 + 500)
        ]
    );
    for bad in ["1:24:00:00", "1.02:03:04:05", "1:2:3:4:5", ":01:00:00"] {
        let e = err(&format!(
            r#"{{"IpRateLimiting": {{"GeneralRules": [
                {{"Endpoint": "*", "Period": "1d", "PeriodTimespan": "{bad}", "Limit": 1}}]}}}}"#
        ));
        assert!(
            e.starts_with("IpRateLimiting.GeneralRules[0].PeriodTimespan:"),
            "{bad}: {e}"
        );
    }
}

/// `1mo` is 30 days and `1y` 365 (AspNetCoreRateLimit knows neither unit, only `s`, `m`, `h`
/// and `d`); humantime has no `mo` (the document failed to load) and makes a year 365.25 days.
#[test]
fn aspnet_month_and_year_periods_are_theirs() {
    let doc = r#"{"IpRateLimiting": {"GeneralRules": [
        {"Endpoint": "*", "Period": "1mo", "Limit": 1000},
        {"Endpoint": "*", "Period": "1y", "Limit": 10000}]}}"#;
    let l = limiter(HttpConfig::from_json_str(doc).unwrap());
    let v = decide(&l, &http::Method::GET, "/", [1, 1, 1, 1]);
    let windows: Vec<(String, Duration)> = v
        .quotas
        .iter()
        .map(|q| (q.policy.to_string(), q.window))
        .collect();
    let day = Duration::from_secs(86_400);
    assert_eq!(
        windows,
        [
            ("*-1mo".to_owned(), day * 30),
            ("*-1y".to_owned(), day * 365)
        ]
    );
}

/// Any JSON value in any field of AspNetCoreRateLimit's sections: a translation or an error,
/// never a panic (the mutated-text property rarely changes a value's kind).
fn aspnet_shape() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    let keys = prop::sample::select(vec![
        "IpRateLimiting",
        "ClientRateLimiting",
        "IpRateLimitPolicies",
        "ClientRateLimitPolicies",
        "GeneralRules",
        "IpRules",
        "ClientRules",
        "Rules",
        "Endpoint",
        "endpoint",
        "Period",
        "Limit",
        "limit",
        "Ip",
        "ClientId",
        "IpWhitelist",
        "EndpointWhitelist",
        "ClientWhitelist",
        "EnableEndpointRateLimiting",
        "EnableRegexRuleMatching",
        "StackBlockedRequests",
        "HttpStatusCode",
        "QuotaExceededResponse",
        "QuotaExceededMessage",
        "Content",
        "ContentType",
        "StatusCode",
        "RealIpHeader",
        "ClientIdHeader",
        "MonitorMode",
        "DisableRateLimitHeaders",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "*",
            "1s",
            "7d",
            "1mo",
            "2q",
            "",
            "get:/a",
            "re:x",
            ".+",
            "get:(",
            "(a|b):/x",
            "10.0.0.0/8",
            "true",
            "429",
            "-1",
            "1e99",
            "{0}/{1}",
            "application/json",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 40, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6).prop_map(|kv| Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_shape_of_aspnet_document_never_panics(section in 0usize..4, body in aspnet_shape()) {
        let name = ["IpRateLimiting", "ClientRateLimiting", "IpRateLimitPolicies", "ClientRateLimitPolicies"][section];
        let doc = serde_json::json!({ name: body }).to_string();
        if let Ok(config) = HttpConfig::from_json_str(&doc)
            && let Ok(l) = HttpLimiter::with_clock(config, ManualClock::new()) {
                let _ = decide(&l, &http::Method::GET, "/a", [192, 0, 2, 1]);
            }
    }
}

/// A JSON body template with a value that is a number (`"retry_after": {retry_after}`) stays a
/// JSON document when the rejection has no such value (a blocklisted client, a limit-0 rule:
/// no retry-after, no quota): `null` there, not nothing (`"retry_after": }`). Inside a string
/// an absent value is still the empty string.
#[test]
fn json_template_stays_json_when_a_value_is_absent() {
    let config = HttpConfig::from_toml_str(
        r#"
        [response]
        content_type = "application/json"
        body = '{"error": "{reason}", "limit": {limit}, "retry_after": {retry_after}, "text": "retry in {retry_after} s"}'
        [blocklist]
        ips = ["192.0.2.1"]
        [[rules]]
        name = "closed"
        endpoint = "*:/closed"
        period = "1m"
        limit = 0
        [[rules]]
        period = "1m"
        limit = 1
        "#,
    )
    .unwrap();
    let response = config.response.clone();
    let l = limiter(config);
    let get = http::Method::GET;
    let _ = decide(&l, &get, "/", [1, 1, 1, 1]);
    for (path, ip, limit, retry) in [
        (
            "/",
            [192, 0, 2, 1],
            serde_json::Value::Null,
            serde_json::Value::Null,
        ),
        (
            "/closed",
            [1, 1, 1, 2],
            serde_json::Value::Null,
            serde_json::Value::Null,
        ),
        ("/", [1, 1, 1, 1], 1.into(), 60.into()),
    ] {
        let verdict = decide(&l, &get, path, ip);
        let body = turnstile::http::rejection_response(&verdict, &response)
            .expect("a rejection")
            .into_body();
        let json: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{path} {ip:?}: {e}: {}", String::from_utf8_lossy(&body)));
        assert_eq!(
            (&json["limit"], &json["retry_after"]),
            (&limit, &retry),
            "{json}"
        );
        let text = json["text"].as_str().unwrap();
        assert_eq!(
            text,
            format!(
                "retry in {} s",
                retry.as_u64().map_or(String::new(), |s| s.to_string())
            )
        );
    }
}

/// An `appsettings.json` saved as "UTF-8 with signature" (a byte-order mark first, as Visual
/// Studio writes it) loads as ASP.NET loads it, through every JSON entry point and from a file;
/// the TOML and YAML parsers skip the mark too.
#[test]
fn a_byte_order_mark_before_a_configuration_is_skipped() {
    const BOM: &str = "\u{feff}";
    let aspnet =
        r#"{"IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]}}"#;
    let loaded = [
        HttpConfig::from_json_str(&format!(
            "{BOM}{{\"rules\": [{{\"period\": \"1s\", \"limit\": 2}}]}}"
        )),
        HttpConfig::from_json_str(&format!("{BOM}{aspnet}")),
        HttpConfig::from_aspnet_json(&format!("{BOM}// comment\n{aspnet}")),
        HttpConfig::from_toml_str(&format!("{BOM}[[rules]]\nperiod = \"1s\"\nlimit = 2\n")),
        HttpConfig::from_yaml_str(&format!("{BOM}rules:\n  - period: 1s\n    limit: 2\n")),
        {
            let dir = std::env::temp_dir().join(format!("turnstile-bom-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("appsettings.json");
            std::fs::write(&path, format!("{BOM}{aspnet}")).unwrap();
            let loaded = HttpConfig::from_file(&path);
            std::fs::remove_dir_all(&dir).unwrap();
            loaded
        },
    ];
    for (i, config) in loaded.into_iter().enumerate() {
        let config = config.unwrap_or_else(|e| panic!("document {i}: {e}"));
        assert_eq!(config.rules.len(), 1, "document {i}");
        assert_eq!(config.rules[0].limit, 2, "document {i}");
    }
}

/// Whether `GET /` from `ip` with `client` is rejected.
fn get_rejected(l: &HttpLimiter<ManualClock>, ip: [u8; 4], client: Option<&str>) -> bool {
    rejected(&decide_as(l, &http::Method::GET, "/", ip, client))
}

/// `decide` for a request that may carry a client id.
fn decide_as(
    l: &HttpLimiter<ManualClock>,
    method: &http::Method,
    path: &str,
    ip: [u8; 4],
    client: Option<&str>,
) -> Verdict {
    l.decide(&RequestInfo {
        method,
        path,
        client_ip: Some(ip.into()),
        client_id: client,
    })
}

/// There the IP middleware and the client middleware are independent: each section's rules
/// apply, whatever the other section has for the same period. Taking the lowest limit across
/// both let a client step around its IP limit by sending a new client id each time.
#[test]
fn aspnet_ip_and_client_rules_of_one_period_both_apply() {
    let doc = r#"{
      "IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 3}]},
      "ClientRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 2}]}
    }"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    // One IP, a fresh client id each time: the IP rule (3 per minute) stops the 4th.
    let outcomes: Vec<bool> = (0..4)
        .map(|i| get_rejected(&l, [1, 1, 1, 1], Some(&format!("c{i}"))))
        .collect();
    assert_eq!(outcomes, [false, false, false, true]);
    // One client id from fresh addresses: the client rule (2 per minute) stops the 3rd.
    let outcomes: Vec<bool> = (0..3)
        .map(|i| get_rejected(&l, [2, 2, 2, i], Some("same")))
        .collect();
    assert_eq!(outcomes, [false, false, true]);
}

/// An IP policy replaces the IP section's general rule of its period, not the client
/// section's: a client policy likewise leaves the IP rules in force.
#[test]
fn aspnet_policies_override_their_own_sections_rules_only() {
    let doc = r#"{
      "IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 1}]},
      "ClientRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 100}]},
      "ClientRateLimitPolicies": {"ClientRules": [{"ClientId": "partner", "Rules": [
        {"Endpoint": "*", "Period": "1m", "Limit": 50}]}]}
    }"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    assert!(!get_rejected(&l, [1, 1, 1, 1], Some("partner")));
    assert!(get_rejected(&l, [1, 1, 1, 1], Some("partner")));
}

/// `IpWhitelist` is an option of `IpRateLimiting`: there it exempts the address from the IP
/// middleware only, not from `ClientRateLimiting`'s rules; and `ClientWhitelist` of the client
/// section exempts from the client rules only.
#[test]
fn aspnet_whitelists_apply_to_their_own_section() {
    let doc = r#"{
      "IpRateLimiting": {"IpWhitelist": ["1.1.1.1"],
        "GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 1}]},
      "ClientRateLimiting": {"ClientWhitelist": ["trusted"],
        "GeneralRules": [{"Endpoint": "*", "Period": "1h", "Limit": 1}]}
    }"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    let get = http::Method::GET;
    // Whitelisted by IP, still counted by client id.
    assert!(!get_rejected(&l, [1, 1, 1, 1], Some("c")));
    assert!(get_rejected(&l, [1, 1, 1, 1], Some("c")));
    // Whitelisted by client id, still counted by IP.
    assert!(!get_rejected(&l, [2, 2, 2, 2], Some("trusted")));
    assert!(get_rejected(&l, [2, 2, 2, 2], Some("trusted")));
    // Whitelisted by both: whitelisted.
    assert_eq!(
        decide_as(&l, &get, "/", [1, 1, 1, 1], Some("trusted")).outcome,
        Outcome::Whitelisted
    );
}

/// There `{1}` is the rule's `Period` as written (`string.Format(..., rule.Limit,
/// rule.Period, retryAfter)`): "1d", not humantime's "1day".
#[test]
fn aspnet_period_placeholder_is_the_period_as_written() {
    for period in ["1d", "12h", "15m", "1s"] {
        let doc = format!(
            r#"{{"IpRateLimiting": {{"QuotaExceededMessage": "max {{0}} per {{1}}",
            "GeneralRules": [{{"Endpoint": "*", "Period": "{period}", "Limit": 1}}]}}}}"#
        );
        assert_eq!(second_request_body(&doc), format!("max 1 per {period}"));
    }
}

/// The body of the rejection `doc`'s limit of 1 gives the second `GET /` from one address.
fn second_request_body(doc: &str) -> String {
    let config = HttpConfig::from_aspnet_json(doc).unwrap();
    let response_config = config.response.clone();
    let l = limiter(config);
    let get = http::Method::GET;
    decide(&l, &get, "/", [1, 1, 1, 1]);
    let v = decide(&l, &get, "/", [1, 1, 1, 1]);
    let r = turnstile::http::rejection_response(&v, &response_config).unwrap();
    String::from_utf8(r.body().to_vec()).unwrap()
}

/// `{{rule}}` in a .NET format string is the literal text `{rule}`, not the rule's name.
#[test]
fn aspnet_escaped_braces_are_literal_text() {
    let doc = r#"{"IpRateLimiting": {"QuotaExceededMessage": "{{rule}} {{reason}} {{0}} {0}",
        "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 1}]}}"#;
    assert_eq!(second_request_body(doc), "{rule} {reason} {0} 1");
}

/// There a request without the client id header is the client "anon"
/// (`ClientId = clientId ?? "anon"`): counted, not refused.
#[test]
fn aspnet_missing_client_id_is_anon() {
    let doc = r#"{"ClientRateLimiting": {
        "GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 1}]}}"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    let get = http::Method::GET;
    let first = decide(&l, &get, "/", [1, 1, 1, 1]);
    assert!(!rejected(&first), "{:?}", first.outcome);
    // Another address without a client id is the same client.
    let second = decide(&l, &get, "/", [2, 2, 2, 2]);
    assert!(
        matches!(
            second.outcome,
            Outcome::Rejected {
                reason: turnstile::http::RejectReason::RateLimited,
                ..
            }
        ),
        "{:?}",
        second.outcome
    );
    // And so is one sending the id "anon".
    assert!(get_rejected(&l, [3, 3, 3, 3], Some("anon")));
}

/// There the path is lower-cased and its trailing `/` trimmed before matching and counting.
#[test]
fn aspnet_trailing_slash_is_the_same_endpoint() {
    let doc = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true,
        "GeneralRules": [{"Endpoint": "get:/api/values", "Period": "1m", "Limit": 1}]}}"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    let get = http::Method::GET;
    assert!(!rejected(&decide(&l, &get, "/api/values", [1, 1, 1, 1])));
    assert!(rejected(&decide(&l, &get, "/api/values/", [1, 1, 1, 1])));
    assert!(rejected(&decide(&l, &get, "/api/values//", [1, 1, 1, 1])));
    // The root stays the root.
    let doc = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true,
        "GeneralRules": [{"Endpoint": "get:/", "Period": "1m", "Limit": 1}]}}"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    assert!(!rejected(&decide(&l, &get, "/", [1, 1, 1, 1])));
    assert!(rejected(&decide(&l, &get, "/", [1, 1, 1, 1])));
}

/// There a period is `double.Parse` of the number: `1.5m` is 90 seconds.
#[test]
fn aspnet_fractional_period_loads() {
    let doc = r#"{"IpRateLimiting": {
        "GeneralRules": [{"Endpoint": "*", "Period": "1.5m", "Limit": 1}]}}"#;
    let config = HttpConfig::from_aspnet_json(doc).unwrap();
    assert_eq!(config.rules[0].period, "1m 30s");
    limiter(config);
}

/// A period with a fraction is counted in whole milliseconds. One of more milliseconds than a
/// `u64` holds (`18446744073709552.5s`, some 584 million years) wrapped around to `384ms`: a
/// rule meant to be near permanent counted a window shorter than a second. It is too long, and
/// refused as such naming the field; and a fraction below a millisecond (`0.0001s`) is refused
/// saying so, not as "must be greater than zero".
#[test]
fn aspnet_fractional_periods_out_of_range_are_refused_not_wrapped() {
    for (period, why) in [
        ("18446744073709552.5s", "too long"),
        ("307445734561825.9m", "too long"),
        ("0.0001s", "below a millisecond"),
    ] {
        let doc = format!(
            r#"{{"IpRateLimiting": {{"GeneralRules": [
                {{"Endpoint": "*", "Period": "1m", "Limit": 5}},
                {{"Endpoint": "*", "Period": "{period}", "Limit": 1}}]}}}}"#
        );
        let e = err(&doc);
        assert!(
            e.starts_with("IpRateLimiting.GeneralRules[1].Period") && e.contains(why),
            "{period}: {e}"
        );
    }
}

/// There `IpWhitelist` entries and `IpRules[].Ip` are IP ranges: `first-last` and
/// `address/mask` too. A range that is not one CIDR range becomes the few that cover it. Spaces
/// anywhere in an entry are removed there (`IpAddressRange`): `10.0.0.0 / 8` was refused here
/// as "not an IP address or CIDR range".
#[test]
fn aspnet_ip_ranges_load_as_cidr_ranges() {
    for (entry, nets) in [
        ("192.168.0.0-192.168.0.255", &["192.168.0.0/24"][..]),
        ("192.168.0.0/255.255.255.0", &["192.168.0.0/24"]),
        (
            "10.0.0.1-10.0.0.6",
            &["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"],
        ),
        ("0.0.0.0-255.255.255.255", &["0.0.0.0/0"]),
        ("2001:db8::-2001:db8::ffff", &["2001:db8::/112"]),
        ("10.0.0.7", &["10.0.0.7/32"]),
        // Every space is removed there before the range is read.
        ("10.0.0.0 / 8", &["10.0.0.0/8"]),
        (" 10.0.0.1 - 10.0.0.2 ", &["10.0.0.1/32", "10.0.0.2/32"]),
        ("192.168.0.0 / 255.255.255.0", &["192.168.0.0/24"]),
        // Its README's `IpWhitelist` example: a CIDR range with host bits, masked there.
        ("::1 /10", &["::/10"]),
    ] {
        let doc = format!(
            r#"{{"IpRateLimiting": {{"IpWhitelist": ["{entry}"],
                "GeneralRules": [{{"Endpoint": "*", "Period": "1m", "Limit": 1}}]}},
              "IpRateLimitPolicies": {{"IpRules": [{{"Ip": "{entry}", "Rules": [
                {{"Endpoint": "*", "Period": "1m", "Limit": 5}}]}}]}}}}"#
        );
        let config = HttpConfig::from_aspnet_json(&doc).unwrap_or_else(|e| panic!("{entry}: {e}"));
        assert_eq!(config.whitelist.by_key[0].ips, nets, "{entry}");
        let policies: Vec<&str> = config.ip_rules.iter().map(|p| p.ip.as_str()).collect();
        assert_eq!(policies, nets, "{entry}");
        HttpLimiter::with_clock(config, ManualClock::new())
            .unwrap_or_else(|e| panic!("{entry}: {e}"));
    }
    let l = limiter(
        HttpConfig::from_aspnet_json(
            r#"{"IpRateLimiting": {"IpWhitelist": ["10.0.0.1-10.0.0.6"],
                "GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 1}]}}"#,
        )
        .unwrap(),
    );
    let get = http::Method::GET;
    for last in 1..=6 {
        assert_eq!(
            decide(&l, &get, "/", [10, 0, 0, last]).outcome,
            Outcome::Whitelisted
        );
    }
    for last in [0, 7] {
        decide(&l, &get, "/", [10, 0, 0, last]);
        assert!(rejected(&decide(&l, &get, "/", [10, 0, 0, last])));
    }
    for bad in [
        "10.0.0.9-10.0.0.1",
        "10.0.0.1-::1",
        "10.0.0.0/255.0.255.0",
        "10.0.0.0/x.y",
    ] {
        let doc = format!(r#"{{"IpRateLimiting": {{"IpWhitelist": ["{bad}"]}}}}"#);
        let e = HttpConfig::from_aspnet_json(&doc).unwrap_err().to_string();
        assert!(e.starts_with("IpRateLimiting.IpWhitelist[0]"), "{bad}: {e}");
    }
}

/// There `DisableRateLimitHeaders` also leaves out `Retry-After`.
#[test]
fn aspnet_disable_rate_limit_headers_drops_retry_after() {
    let doc = r#"{"IpRateLimiting": {"DisableRateLimitHeaders": true,
        "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 1}]}}"#;
    let config = HttpConfig::from_aspnet_json(doc).unwrap();
    let response_config = config.response.clone();
    let l = limiter(config);
    let get = http::Method::GET;
    decide(&l, &get, "/", [1, 1, 1, 1]);
    let v = decide(&l, &get, "/", [1, 1, 1, 1]);
    let r = turnstile::http::rejection_response(&v, &response_config).unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_none());
    assert!(r.headers().get("ratelimit").is_none());
    // Nor its own `X-Rate-Limit-*` on admitted responses, which it sends otherwise; also when
    // the other section gives no response of its own.
    assert!(!response_config.aspnet_headers);
    for (doc, sent) in [
        (
            r#"{"IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 1}]}}"#,
            true,
        ),
        (
            r#"{"IpRateLimiting": {"DisableRateLimitHeaders": true},
                "ClientRateLimiting": {"ClientIdHeader": "X-Key"}}"#,
            false,
        ),
        (
            r#"{"IpRateLimiting": {"RealIpHeader": "X-Ip"},
                "ClientRateLimiting": {"DisableRateLimitHeaders": true}}"#,
            false,
        ),
    ] {
        let config = HttpConfig::from_aspnet_json(doc).unwrap();
        assert_eq!(config.response.aspnet_headers, sent, "{doc}");
        assert_eq!(config.response.ietf_headers, sent, "{doc}");
    }
}

/// There two rules of one section with the same endpoint and period are legal: the most
/// restrictive applies ("the most restrictive limit for each period").
#[test]
fn aspnet_two_rules_of_one_endpoint_and_period_load() {
    for rules in [
        r#"{"Endpoint": "*", "Period": "1s", "Limit": 1}, {"Endpoint": "*", "Period": "1s", "Limit": 2}"#,
        r#"{"Endpoint": "*", "Period": "1s", "Limit": 2}, {"Endpoint": "*", "Period": "1s", "Limit": 1}"#,
    ] {
        let doc = format!(r#"{{"IpRateLimiting": {{"GeneralRules": [{rules}]}}}}"#);
        let config = HttpConfig::from_aspnet_json(&doc).unwrap();
        let l = HttpLimiter::with_clock(config, ManualClock::new())
            .unwrap_or_else(|e| panic!("refused: {e}"));
        let get = http::Method::GET;
        assert!(!rejected(&decide(&l, &get, "/", [1, 1, 1, 1])), "{rules}");
        assert!(rejected(&decide(&l, &get, "/", [1, 1, 1, 1])), "{rules}");
    }
}

/// An error in an AspNetCoreRateLimit document names the field of that document
/// (`ClientRateLimiting.GeneralRules[0].Period`), not the translated configuration's
/// (`rules[2].period`, an index the document does not have).
#[test]
fn aspnet_errors_name_the_documents_field() {
    for (doc, field) in [
        (
            r#"{"IpRateLimiting": {"GeneralRules": [
                {"Endpoint": "*", "Period": "1s", "Limit": 1},
                {"Endpoint": "*", "Period": "1m", "Limit": 5}]},
              "ClientRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1x", "Limit": 1}]}}"#,
            "ClientRateLimiting.GeneralRules[0].Period",
        ),
        (
            r#"{"IpRateLimiting": {"IpWhitelist": ["127.0.0.1", "nope"]}}"#,
            "IpRateLimiting.IpWhitelist[1]",
        ),
        (
            r#"{"IpRateLimiting": {"EndpointWhitelist": ["get:nope"]}}"#,
            "IpRateLimiting.EndpointWhitelist[0]",
        ),
        (
            r#"{"IpRateLimiting": {"GeneralRules": [{"Endpoint": "g3t:/x", "Period": "1s", "Limit": 1}]}}"#,
            "IpRateLimiting.GeneralRules[0].Endpoint",
        ),
        (
            r#"{"IpRateLimitPolicies": {"IpRules": [{"Ip": "1.2.3", "Rules": []}]}}"#,
            "IpRateLimitPolicies.IpRules[0].Ip",
        ),
        (
            r#"{"ClientRateLimitPolicies": {"ClientRules": [{"Rules": []}]}}"#,
            "ClientRateLimitPolicies.ClientRules[0].ClientId",
        ),
        (
            r#"{"IpRateLimiting": {"RealIpHeader": "X Real IP"}}"#,
            "IpRateLimiting.RealIpHeader",
        ),
        (
            r#"{"ClientRateLimiting": {"ClientIdHeader": "X Client"}}"#,
            "ClientRateLimiting.ClientIdHeader",
        ),
    ] {
        let e = err(doc);
        assert!(e.starts_with(field), "{field}: {e}");
    }
}

/// Without `EnableEndpointRateLimiting`, AspNetCoreRateLimit applies only the rules whose
/// `Endpoint` is `*` (`r.Endpoint == "*"`): a `*:*` rule, which reads as "any method, any
/// path", never applies there. Loaded as an any-endpoint rule, it limited every request.
#[test]
fn aspnet_star_colon_star_is_no_global_rule_without_endpoint_rate_limiting() {
    for enabled_in_client_section in [false, true] {
        let doc = format!(
            r#"{{
            "IpRateLimiting": {{
                "EnableEndpointRateLimiting": false,
                "GeneralRules": [
                    {{ "Endpoint": "*:*", "Period": "1m", "Limit": 1 }},
                    {{ "Endpoint": "*", "Period": "1h", "Limit": 3 }}
                ]
            }},
            "ClientRateLimiting": {{ "EnableEndpointRateLimiting": {enabled_in_client_section} }}
        }}"#
        );
        let l = limiter(HttpConfig::from_json_str(&doc).unwrap());
        let verdicts: Vec<bool> = (0..4)
            .map(|_| rejected(&decide(&l, &http::Method::GET, "/api/values", [1, 2, 3, 4])))
            .collect();
        assert_eq!(
            verdicts,
            [false, false, false, true],
            "only the `*` rule applies (client section endpoint limiting {enabled_in_client_section})"
        );
    }
}

/// A period too long for any limiter (over u64::MAX nanoseconds, about 584 years: `1000y`, or
/// .NET's `TimeSpan.MaxValue`) is refused naming the document's field and saying why, as every
/// other error in the document is. It used to pass the translation and be refused by the
/// compiler as `rules[0].period`, a field the document does not have; and the largest
/// `TimeSpan` was "not a .NET TimeSpan".
#[test]
fn aspnet_periods_too_long_for_a_limiter_name_the_documents_field() {
    for (rule, field) in [
        (
            r#"{"Endpoint": "*", "Period": "1000y", "Limit": 1}"#,
            "ClientRateLimiting.GeneralRules[1].Period",
        ),
        (
            r#"{"Endpoint": "*", "Period": "1000000000y", "Limit": 5}"#,
            "ClientRateLimiting.GeneralRules[1].Period",
        ),
        (
            r#"{"Endpoint": "*", "Period": "1s", "PeriodTimespan": "10675199.02:48:05.4775807", "Limit": 1}"#,
            "ClientRateLimiting.GeneralRules[1].PeriodTimespan",
        ),
    ] {
        let doc = format!(
            r#"{{"ClientRateLimiting": {{"GeneralRules": [
                {{"Endpoint": "*", "Period": "1m", "Limit": 5}}, {rule}]}}}}"#
        );
        let e = err(&doc);
        assert!(e.starts_with(field), "{field}: {e}");
        assert!(e.contains("584 years"), "says why: {e}");
    }
    // The longest period a limiter counts still loads.
    let doc = r#"{"IpRateLimiting": {"GeneralRules": [
        {"Endpoint": "*", "Period": "584y", "Limit": 1},
        {"Endpoint": "*", "Period": "1s", "PeriodTimespan": "213503.00:00:00", "Limit": 1}]}}"#;
    limiter(HttpConfig::from_aspnet_json(doc).expect("loads"));
}

/// Two more errors that the translation passed on and the compiler reported under the
/// translated configuration's field names (`client_rules[1].client_id`,
/// `response.content_type`), which the document does not have.
#[test]
fn aspnet_duplicate_client_ids_and_bad_content_types_name_the_documents_field() {
    for (doc, field) in [
        (
            r#"{"ClientRateLimitPolicies": {"ClientRules": [
                {"ClientId": "a", "Rules": [{"Endpoint": "*", "Period": "1s", "Limit": 1}]},
                {"ClientId": "b", "Rules": [{"Endpoint": "*", "Period": "1s", "Limit": 1}]},
                {"ClientId": "a", "Rules": [{"Endpoint": "*", "Period": "1m", "Limit": 9}]}]}}"#,
            "ClientRateLimitPolicies.ClientRules[2].ClientId",
        ),
        (
            r#"{"ClientRateLimiting": {"QuotaExceededResponse": {"Content": "{0}", "ContentType": "text/plain\nx"}}}"#,
            "ClientRateLimiting.QuotaExceededResponse.ContentType",
        ),
        (
            r#"{"IpRateLimiting": {"QuotaExceededResponse": {"ContentType": "application/json\u0000"}}}"#,
            "IpRateLimiting.QuotaExceededResponse.ContentType",
        ),
    ] {
        let e = err(doc);
        assert!(e.starts_with(field), "{field}: {e}");
    }
    // A client id longer than the longest a client id is read here (4096 bytes: the document's
    // shorter ids raise `client_id_max_len` to fit, see `aspnet_long_client_ids_the_document_
    // names_are_read`), which no request's id could be, is refused naming the document's field;
    // and so is an empty whitelisted one.
    let long = "k".repeat(4097);
    for (doc, field) in [
        (
            format!(r#"{{"ClientRateLimiting": {{"ClientWhitelist": ["dev", "{long}"]}}}}"#),
            "ClientRateLimiting.ClientWhitelist[1]",
        ),
        (
            format!(
                r#"{{"ClientRateLimitPolicies": {{"ClientRules": [
                    {{"ClientId": "{long}", "Rules": [{{"Endpoint": "*", "Period": "1s", "Limit": 0}}]}}]}}}}"#
            ),
            "ClientRateLimitPolicies.ClientRules[0].ClientId",
        ),
    ] {
        let e = err(&doc);
        assert!(
            e.starts_with(field) && e.contains("(at most 4096)"),
            "{field}: {e}"
        );
    }
    let e = err(r#"{"ClientRateLimiting": {"ClientWhitelist": ["dev", ""]}}"#);
    assert!(
        e.starts_with("ClientRateLimiting.ClientWhitelist[1]"),
        "{e}"
    );
}

/// An `appsettings.json` with comments (which ASP.NET allows) and a mistake elsewhere: the
/// error must say where the mistake is. `from_json_str` reported only the plain-JSON parse's
/// complaint about the first comment ("expected value at line 1 column 1"), sending the reader
/// to a line that is fine.
#[test]
fn an_appsettings_error_after_a_comment_is_reported_where_it_is() {
    let doc = "// limits\n{\"IpRateLimiting\": {\"GeneralRules\": [\n  \
               {\"Endpoint\": \"*\", \"Period\": \"1s\" \"Limit\": 1}]}}";
    let e = HttpConfig::from_json_str(doc).unwrap_err().to_string();
    assert!(e.contains("line 3"), "{e}");
    // As the AspNetCoreRateLimit loader reports it.
    let e = HttpConfig::from_aspnet_json(doc).unwrap_err().to_string();
    assert!(e.contains("line 3"), "{e}");
}

/// There a rule whose `Limit` is zero or less blocks every request it applies to ("if limit
/// is zero or less, block the request"), so `"Limit": -1` is a way to shut out a client in an
/// `IpRules` policy. It was refused here as "not a whole number", and the document did not
/// load; it is a block, as `0` is.
#[test]
fn aspnet_negative_limit_blocks_as_zero_does() {
    let doc = r#"{
      "IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 100}]},
      "IpRateLimitPolicies": {"IpRules": [{"Ip": "192.0.2.1", "Rules": [
        {"Endpoint": "*", "Period": "1m", "Limit": -1}]}]}
    }"#;
    let config = HttpConfig::from_aspnet_json(doc).expect("a negative limit loads");
    assert_eq!(config.ip_rules[0].rules[0].limit, 0);
    let l = limiter(config);
    let v = decide(&l, &http::Method::GET, "/", [192, 0, 2, 1]);
    assert!(
        matches!(
            v.outcome,
            Outcome::Rejected {
                reason: turnstile::http::RejectReason::Blocked,
                ..
            }
        ),
        "{v:?}"
    );
    assert!(!rejected(&decide(
        &l,
        &http::Method::GET,
        "/",
        [1, 1, 1, 1]
    )));
    // Too many requests for a rule to count is still refused, saying so.
    let e = err(
        r#"{"IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 4294967296}]}}"#,
    );
    assert!(
        e.starts_with("IpRateLimiting.GeneralRules[0].Limit") && e.contains("4294967295"),
        "{e}"
    );
}

/// A rule of AspNetCoreRateLimit may have its own `QuotaExceededResponse` (its status, content
/// and content type for the rejections it makes; there it then replaces the section's for every
/// later rejection too). It was ignored here without a word: such a rule's rejections had the
/// section's status and body. A rule cannot have its own response here, so the document is
/// refused naming the field, as `StackBlockedRequests: true` is.
#[test]
fn aspnet_rule_quota_exceeded_response_is_refused_not_ignored() {
    for (doc, field) in [
        (
            r#"{"IpRateLimiting": {"GeneralRules": [
                {"Endpoint": "*", "Period": "1s", "Limit": 5},
                {"Endpoint": "*", "Period": "1m", "Limit": 50,
                 "QuotaExceededResponse": {"StatusCode": 503, "Content": "busy"}}]}}"#,
            "IpRateLimiting.GeneralRules[1].QuotaExceededResponse",
        ),
        (
            r#"{"ClientRateLimitPolicies": {"ClientRules": [{"ClientId": "c", "Rules": [
                {"Endpoint": "*", "Period": "1m", "Limit": 50,
                 "quotaExceededResponse": {"Content": "busy"}}]}]}}"#,
            "ClientRateLimitPolicies.ClientRules[0].Rules[0].QuotaExceededResponse",
        ),
    ] {
        let e = err(doc);
        assert!(e.starts_with(field), "{field}: {e}");
    }
    // A `null` one is none, as there.
    let doc = r#"{"IpRateLimiting": {"GeneralRules": [
        {"Endpoint": "*", "Period": "1s", "Limit": 5, "QuotaExceededResponse": null}]}}"#;
    limiter(HttpConfig::from_aspnet_json(doc).expect("loads"));
}

/// There a policy's rule replaces the general rule whose `Period` is the same text
/// (`r.Period == generalLimit.Period`): a policy of `60s` leaves the general `1m` rule in force,
/// and both apply. Here rules compete by their window, so the policy's `60s` rule displaced the
/// general `1m` one: an address given a generous policy per `60s` escaped the general limit of
/// 2 per `1m`, which AspNetCoreRateLimit kept applying to it. A client policy likewise.
#[test]
fn aspnet_policy_of_the_same_window_written_otherwise_keeps_the_general_rule() {
    let doc = r#"{
      "IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 2}]},
      "IpRateLimitPolicies": {"IpRules": [{"Ip": "10.0.0.1", "Rules": [
        {"Endpoint": "*", "Period": "60s", "Limit": 100}]}]},
      "ClientRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1h", "Limit": 3}]},
      "ClientRateLimitPolicies": {"ClientRules": [{"ClientId": "partner", "Rules": [
        {"Endpoint": "*", "Period": "60m", "Limit": 100}]}]}
    }"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    // The IP policy's address: still 2 per minute.
    assert!(!get_rejected(&l, [10, 0, 0, 1], Some("a")));
    assert!(!get_rejected(&l, [10, 0, 0, 1], Some("b")));
    assert!(get_rejected(&l, [10, 0, 0, 1], Some("c")));
    // The client policy's client: still 3 per hour, from three addresses.
    assert!(!get_rejected(&l, [1, 1, 1, 1], Some("partner")));
    assert!(!get_rejected(&l, [2, 2, 2, 2], Some("partner")));
    assert!(!get_rejected(&l, [3, 3, 3, 3], Some("partner")));
    assert!(get_rejected(&l, [4, 4, 4, 4], Some("partner")));
    // A policy's rule of the same text still replaces the general one, as there.
    let doc = r#"{
      "IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 2}]},
      "IpRateLimitPolicies": {"IpRules": [{"Ip": "10.0.0.1", "Rules": [
        {"Endpoint": "*", "Period": "1m", "Limit": 3}]}]}
    }"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    for _ in 0..3 {
        assert!(!get_rejected(&l, [10, 0, 0, 1], None));
    }
    assert!(get_rejected(&l, [10, 0, 0, 1], None));
}

/// A general rule gives way there only to a policy rule of its own `Period` text that matches
/// the request. A policy with rules of that window written two ways (`1m` for one endpoint,
/// `60s` for every one) cannot be read alike here, where the general rule gives way to any
/// rule of its window: the policy's address got 50 requests a minute on every other endpoint,
/// where AspNetCoreRateLimit holds it to the general 2 (its `60s` rule does not replace the
/// general `1m`). Refused, naming the policy's rules; written alike, it loads.
#[test]
fn aspnet_policy_rules_of_the_general_rules_window_written_two_ways_are_refused() {
    let doc = |other: &str| {
        format!(
            r#"{{
      "IpRateLimiting": {{"EnableEndpointRateLimiting": true,
        "GeneralRules": [{{"Endpoint": "*", "Period": "1m", "Limit": 2}}]}},
      "IpRateLimitPolicies": {{"IpRules": [{{"Ip": "10.0.0.1", "Rules": [
        {{"Endpoint": "get:/api/a", "Period": "1m", "Limit": 100}},
        {{"Endpoint": "*", "Period": "{other}", "Limit": 50}}]}}]}}
    }}"#
        )
    };
    let e = err(&doc("60s"));
    assert!(
        e.starts_with("IpRateLimitPolicies.IpRules[0].Rules: rules of one window written as \"1m\" and as \"60s\""),
        "{e}"
    );
    // A policy rule of the general rule's text, in another window (its `PeriodTimespan`):
    // there the general rule gives way to it, and the address has 100 per 5 minutes; here it
    // was held to the general 2 a minute as well.
    let timespan = r#"{
      "IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 2}]},
      "IpRateLimitPolicies": {"IpRules": [{"Ip": "10.0.0.1", "Rules": [
        {"Endpoint": "*", "Period": "1m", "PeriodTimespan": "00:05:00", "Limit": 100}]}]}
    }"#;
    let e = err(timespan);
    assert!(
        e.starts_with(
            "IpRateLimitPolicies.IpRules[0].Rules: a rule written \"1m\" of another window"
        ),
        "{e}"
    );
    let l = limiter(HttpConfig::from_aspnet_json(&doc("1m")).unwrap());
    for _ in 0..50 {
        assert!(!rejected(&decide(
            &l,
            &http::Method::GET,
            "/api/b",
            [10, 0, 0, 1]
        )));
    }
    assert!(rejected(&decide(
        &l,
        &http::Method::GET,
        "/api/b",
        [10, 0, 0, 1]
    )));
}

/// A `null` entry of a list is skipped (as ASP.NET's binder leaves it out), but the entries
/// after it keep their index in the document: an error in `IpWhitelist[2]` named
/// `IpWhitelist[1]`, the entry before it, which is valid.
#[test]
fn aspnet_list_errors_after_a_null_entry_name_the_right_index() {
    for (doc, field) in [
        (
            r#"{"IpRateLimiting": {"IpWhitelist": [null, "10.0.0.1", "bad"]}}"#,
            "IpRateLimiting.IpWhitelist[2]",
        ),
        (
            r#"{"ClientRateLimiting": {"EndpointWhitelist": [null, "get:/ok", "get:bad"]}}"#,
            "ClientRateLimiting.EndpointWhitelist[2]",
        ),
        (
            r#"{"IpRateLimiting": {"EnableRegexRuleMatching": true,
                "EndpointWhitelist": [null, "get:/ok", "(get:/x"]}}"#,
            "IpRateLimiting.EndpointWhitelist[2]",
        ),
    ] {
        let e = err(doc);
        assert!(e.starts_with(field), "{field}: {e}");
    }
    // The null entries are no entries.
    let config = HttpConfig::from_aspnet_json(
        r#"{"IpRateLimiting": {"IpWhitelist": [null, "10.0.0.1"], "ClientWhitelist": [null, "c"]}}"#,
    )
    .unwrap();
    assert_eq!(config.whitelist.by_key[0].ips, ["10.0.0.1/32"]);
    assert_eq!(config.whitelist.by_key[0].clients, ["c"]);
}

/// There both middlewares read the IP section's `RealIpHeader` and the client section's
/// `ClientIdHeader`: the IP rules count the address the IP section's header gives, the client
/// rules the id the client section's header gives. Here the section translated last won: a
/// `RealIpHeader` of the client section (which counts no address) replaced the IP section's,
/// and the IP rules counted a header their section does not read.
#[test]
fn aspnet_each_header_is_the_section_that_counts_by_it() {
    for (ip, client) in [
        ("IpRateLimiting", "ClientRateLimiting"),
        ("ipratelimiting", "clientratelimiting"),
    ] {
        let doc = format!(
            r#"{{"{client}": {{"RealIpHeader": "X-Real-IP", "ClientIdHeader": "X-Api-Key"}},
                "{ip}": {{"RealIpHeader": "CF-Connecting-IP", "ClientIdHeader": "X-ClientId"}}}}"#
        );
        let config = HttpConfig::from_aspnet_json(&doc).unwrap();
        assert_eq!(
            config.client_ip.headers,
            [turnstile::http::ForwardedHeader::Custom(
                "CF-Connecting-IP".to_owned()
            )]
        );
        assert_eq!(config.client_id_header.as_deref(), Some("X-Api-Key"));
    }
    // One section naming them: its headers, whichever it is.
    let config = HttpConfig::from_aspnet_json(
        r#"{"ClientRateLimiting": {"RealIpHeader": "X-Real-Client", "ClientIdHeader": "X-Key"}}"#,
    )
    .unwrap();
    assert_eq!(
        config.client_ip.headers,
        [turnstile::http::ForwardedHeader::Custom(
            "X-Real-Client".to_owned()
        )]
    );
    assert_eq!(config.client_id_header.as_deref(), Some("X-Key"));
}

/// Probes of the review that found nothing, pinned: periods and limits at their bounds are
/// read as there or refused naming the field; whitelisted endpoints match in any case and
/// without the trailing `/`, as the rules do; client ids are compared exactly, as
/// `List.Contains` does there.
#[test]
fn aspnet_bounds_and_whitelist_matching_hold() {
    let rule = |period: &str, limit: &str| {
        format!(
            r#"{{"IpRateLimiting": {{"GeneralRules": [{{"Endpoint": "*", "Period": "{period}", "Limit": {limit}}}]}}}}"#
        )
    };
    for (period, limit, loaded) in [
        ("1s", "1", ("1s", 1)),
        ("15m", "0", ("15m", 0)),
        ("12h", "-0", ("12h", 0)),
        ("7d", "4294967295", ("7d", 4_294_967_295)),
        (".5m", "\"3\"", ("30s", 3)),
        ("584y", "1", ("213160d", 1)),
    ] {
        let config = HttpConfig::from_aspnet_json(&rule(period, limit)).unwrap();
        assert_eq!(
            (config.rules[0].period.as_str(), config.rules[0].limit),
            loaded,
            "{period} {limit}"
        );
        limiter(config);
    }
    for (period, why) in [
        ("0s", "must be greater than zero"),
        ("0.0s", "must be greater than zero"),
        ("99999999d", "too long"),
        ("-1s", "is not a duration"),
        ("", "is not a duration"),
    ] {
        let e = err(&rule(period, "1"));
        assert!(
            e.starts_with("IpRateLimiting.GeneralRules[0].Period") && e.contains(why),
            "{period:?}: {e}"
        );
    }
    for span in ["00:00:00", "24:00:00", "-00:01:00", "00:60:00"] {
        let doc = format!(
            r#"{{"IpRateLimiting": {{"GeneralRules": [{{"Endpoint": "*", "Period": "1m", "PeriodTimespan": "{span}", "Limit": 1}}]}}}}"#
        );
        let e = err(&doc);
        assert!(
            e.starts_with("IpRateLimiting.GeneralRules[0].PeriodTimespan"),
            "{span}: {e}"
        );
    }

    let doc = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true,
        "EndpointWhitelist": ["get:/api/license", "*:/api/status"],
        "ClientWhitelist": ["Trusted"],
        "GeneralRules": [{"Endpoint": "*", "Period": "1m", "Limit": 0}]}}"#;
    let l = limiter(HttpConfig::from_aspnet_json(doc).unwrap());
    for (method, path, client, whitelisted) in [
        (http::Method::GET, "/api/license", None, true),
        (http::Method::GET, "/API/License/", None, true),
        (http::Method::HEAD, "/api/license", None, true),
        (http::Method::POST, "/api/license", None, false),
        (http::Method::DELETE, "/api/status/", None, true),
        (http::Method::GET, "/api/statusx", None, false),
        (http::Method::GET, "/x", Some("Trusted"), true),
        (http::Method::GET, "/x", Some("trusted"), false),
    ] {
        let outcome = decide_as(&l, &method, path, [1, 1, 1, 1], client).outcome;
        assert_eq!(
            outcome == Outcome::Whitelisted,
            whitelisted,
            "{method} {path} {client:?}: {outcome:?}"
        );
    }
}

/// There each section's rejections have that section's response (`HttpStatusCode`,
/// `QuotaExceededResponse`, `QuotaExceededMessage`, `DisableRateLimitHeaders`). Here every
/// rejection has one, and the section translated last gave it: the IP rules' rejections were
/// sent with the client section's status and body. Two sections that give different responses
/// are refused naming the second; one that gives none takes the other's, and two that give the
/// same load.
#[test]
fn aspnet_sections_with_different_responses_are_refused() {
    let e = err(r#"{
      "IpRateLimiting": {"QuotaExceededResponse": {"Content": "slow down", "StatusCode": 429}},
      "ClientRateLimiting": {"HttpStatusCode": 403, "QuotaExceededMessage": "quota"}
    }"#);
    assert!(e.starts_with("ClientRateLimiting:"), "{e}");
    assert!(e.contains("IpRateLimiting"), "{e}");
    let e = err(r#"{
      "IpRateLimiting": {"HttpStatusCode": 503},
      "clientRateLimiting": {"DisableRateLimitHeaders": true, "HttpStatusCode": 503}
    }"#);
    assert!(e.starts_with("ClientRateLimiting:"), "{e}");
    for doc in [
        r#"{"IpRateLimiting": {"HttpStatusCode": 503, "QuotaExceededMessage": "x"},
            "ClientRateLimiting": {"ClientIdHeader": "X-Key"}}"#,
        r#"{"IpRateLimiting": {"HttpStatusCode": "503"},
            "ClientRateLimiting": {"httpStatusCode": 503, "DisableRateLimitHeaders": false}}"#,
        r#"{"IpRateLimiting": {}, "ClientRateLimiting": {"HttpStatusCode": 503}}"#,
    ] {
        let config = HttpConfig::from_aspnet_json(doc).expect(doc);
        assert_eq!(config.response.status, 503, "{doc}");
    }
}

/// ASP.NET's JSON configuration refuses a file with a key given twice in one object, in any
/// case, exactly the same one included. A key given twice in one case was read here as the
/// last one given: `"Limit": 1, ..., "Limit": 1000` loaded a limit of 1000 from a file ASP.NET
/// does not start with. It is refused naming the field, as a key given in two cases is.
#[test]
fn aspnet_a_key_given_twice_in_one_case_is_refused() {
    for (doc, field) in [
        (
            r#"{"IpRateLimiting": {"GeneralRules": [
                {"Endpoint": "*", "Period": "1s", "Limit": 1, "Limit": 1000}]}}"#,
            "IpRateLimiting.GeneralRules[0].Limit",
        ),
        (
            r#"{"IpRateLimiting": {"IpWhitelist": ["10.0.0.1"]},
                "IpRateLimiting": {"GeneralRules": []}}"#,
            "IpRateLimiting",
        ),
        (
            // Anywhere in the file, as there: ASP.NET reads all of it.
            r#"{"Logging": {"LogLevel": {"Default": "Information", "default": "Warning"}},
                "ClientRateLimiting": {}}"#,
            "Logging.LogLevel.Default",
        ),
    ] {
        for e in [
            err(doc),
            HttpConfig::from_aspnet_json(doc).unwrap_err().to_string(),
            // With a comment, as an appsettings.json may have.
            err(&format!("// limits\n{doc}")),
        ] {
            assert!(
                e.starts_with(&format!("{field}: given twice")),
                "{field}: {e}"
            );
        }
    }
}

/// There a rule without an `Endpoint` applies to no request (its endpoint is no `*`, and a
/// missing pattern matches nothing). Here it was read as `*`, a limit on every request: a rule
/// that did nothing there limited every endpoint once migrated. It is refused naming the field.
#[test]
fn aspnet_rule_without_endpoint_is_refused_not_read_as_every_request() {
    for (doc, field) in [
        (
            r#"{"IpRateLimiting": {"GeneralRules": [
                {"Endpoint": "*", "Period": "1m", "Limit": 100},
                {"Period": "1s", "Limit": 1}]}}"#,
            "IpRateLimiting.GeneralRules[1].Endpoint",
        ),
        (
            r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "GeneralRules": [
                {"Endpoint": null, "Period": "1s", "Limit": 1}]}}"#,
            "IpRateLimiting.GeneralRules[0].Endpoint",
        ),
        (
            r#"{"ClientRateLimitPolicies": {"ClientRules": [{"ClientId": "c", "Rules": [
                {"Period": "1s", "Limit": 1}]}]}}"#,
            "ClientRateLimitPolicies.ClientRules[0].Rules[0].Endpoint",
        ),
    ] {
        let e = err(doc);
        assert!(
            e.starts_with(field) && e.contains("missing"),
            "{field}: {e}"
        );
    }
}

/// There a client id has no length limit; here one longer than `client_id_max_len` (256 bytes
/// by default) is no client id, and a translated request without one is the client `anon`. A
/// policy or whitelist entry for a longer id (an API key, a token) never applied: the client
/// blocked by its policy (limit 0) was admitted as `anon`, and the whitelisted one counted as
/// `anon`. The translation makes room for every client id the document names, up to the
/// largest `client_id_max_len`, and refuses a longer one naming its field.
#[test]
fn aspnet_long_client_ids_the_document_names_are_read() {
    let blocked = "b".repeat(300);
    let trusted = "t".repeat(1000);
    let doc = format!(
        r#"{{"ClientRateLimiting": {{"ClientWhitelist": ["{trusted}"],
            "GeneralRules": [{{"Endpoint": "*", "Period": "1m", "Limit": 1}}]}},
          "ClientRateLimitPolicies": {{"ClientRules": [{{"ClientId": "{blocked}", "Rules": [
            {{"Endpoint": "*", "Period": "1m", "Limit": 0}}]}}]}}}}"#
    );
    let l = limiter(HttpConfig::from_aspnet_json(&doc).unwrap());
    let get = http::Method::GET;
    assert!(get_rejected(&l, [1, 1, 1, 1], Some(&blocked)));
    for _ in 0..3 {
        assert_eq!(
            decide_as(&l, &get, "/", [2, 2, 2, 2], Some(&trusted)).outcome,
            Outcome::Whitelisted
        );
    }
    // Without a client id: `anon`, which the blocked and the whitelisted ids are not.
    assert!(!get_rejected(&l, [3, 3, 3, 3], None));
    assert!(get_rejected(&l, [3, 3, 3, 3], None));

    let too_long = "x".repeat(4097);
    for (doc, field) in [
        (
            format!(r#"{{"ClientRateLimiting": {{"ClientWhitelist": ["a", "{too_long}"]}}}}"#),
            "ClientRateLimiting.ClientWhitelist[1]",
        ),
        (
            format!(r#"{{"IpRateLimiting": {{"ClientWhitelist": ["{too_long}"]}}}}"#),
            "IpRateLimiting.ClientWhitelist[0]",
        ),
        (
            format!(
                r#"{{"ClientRateLimitPolicies": {{"ClientRules": [{{"ClientId": "{too_long}", "Rules": []}}]}}}}"#
            ),
            "ClientRateLimitPolicies.ClientRules[0].ClientId",
        ),
    ] {
        let e = err(&doc);
        assert!(e.starts_with(field) && e.contains("4096"), "{e}");
    }
}

/// turnstile's own settings written beside AspNetCoreRateLimit's sections (to add bans or a
/// rule to the translation) were ignored, as an `appsettings.json`'s other sections are, and
/// nothing said so. They are refused, naming the setting; ASP.NET's own other sections are
/// still ignored.
#[test]
fn turnstiles_own_settings_beside_the_aspnet_sections_are_refused() {
    let section =
        r#""IpRateLimiting": {"GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]}"#;
    for native in [
        r#""bans": {"after": 3, "within": "1m", "ban_for": "1h"}"#,
        r#""rules": [{"period": "1s", "limit": 1}]"#,
        r#""backend": {"kind": "memory"}"#,
    ] {
        let e = err(&format!("{{{section}, {native}}}"));
        let name = native.split('"').nth(1).unwrap();
        assert!(
            e.starts_with(name) && e.contains("turnstile's own settings"),
            "{e}"
        );
    }
    let with_others = format!(
        r#"{{"Logging": {{"LogLevel": {{"Default": "Information"}}}}, "AllowedHosts": "*", {section}}}"#
    );
    assert!(HttpConfig::from_json_str(&with_others).is_ok());
}
