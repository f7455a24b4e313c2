//! AspNetCoreRateLimit's configuration sections, translated to [`HttpConfig`].
//!
//! Endpoint patterns match as prefixes there (`*:/api/values` also matches `/api/values/1`), so
//! each translated `verb:/path` pattern gets a trailing `*`; the rule keeps its name from the
//! original pattern.
//! `IpRateLimiting` general rules count by IP, `ClientRateLimiting` ones by client id (named
//! `client:{endpoint}-{period}` so that both sections can be used at once). With
//! `EnableEndpointRateLimiting`, every rule counts each `VERB:path` separately, as there.
//! `RealIpHeader` becomes the only forwarding header read; it is read only from the peers in
//! `client_ip.trusted_proxies`, which AspNetCoreRateLimit has no notion of (set it yourself).
//! As there, it is `X-Real-IP` and the client id header `X-ClientId` unless a section names
//! them.
//! `EnableEndpointRateLimiting` is each section's own: a section that leaves it off keeps only
//! its `*` rules (the others never apply there) while the other section's endpoint rules do.
//! `QuotaExceededResponse.Content` (or `QuotaExceededMessage`) is a .NET format string, turned
//! into the body template (`{0}` limit, `{1}` period, `{2}` retry-after), sent as `text/plain`
//! unless `ContentType` says otherwise.
//! `StackBlockedRequests: true` is refused: rejected requests are never counted here.
//! `RateLimitCounterPrefix` becomes `backend.prefix`, the key prefix in Redis once the backend
//! is switched to Redis (`backend.kind = "redis"`; the memory backend has no keys).

use crate::http::config::{ClientRulesConfig, HttpConfig, IpRulesConfig, RuleConfig, RuleKey};
use crate::http::{ForwardedHeader, HttpConfigError};
use serde::Deserialize;

const SECTIONS: [&str; 4] = [
    "IpRateLimiting",
    "IpRateLimitPolicies",
    "ClientRateLimiting",
    "ClientRateLimitPolicies",
];

pub(crate) fn is_aspnet(value: &serde_json::Value) -> bool {
    value
        .as_object()
        .is_some_and(|o| o.keys().any(|k| SECTIONS.contains(&k.as_str())))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct Options {
    enable_endpoint_rate_limiting: bool,
    stack_blocked_requests: bool,
    real_ip_header: Option<String>,
    client_id_header: Option<String>,
    http_status_code: Option<u16>,
    quota_exceeded_message: Option<String>,
    ip_whitelist: Vec<String>,
    endpoint_whitelist: Vec<String>,
    client_whitelist: Vec<String>,
    general_rules: Vec<Rule>,
    quota_exceeded_response: Option<QuotaResponse>,
    disable_rate_limit_headers: bool,
    rate_limit_counter_prefix: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct Rule {
    endpoint: Option<String>,
    period: String,
    limit: f64,
    #[allow(dead_code)]
    period_timespan: Option<String>,
    monitor_mode: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct QuotaResponse {
    content: Option<String>,
    content_type: Option<String>,
    status_code: Option<u16>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct IpPolicies {
    ip_rules: Vec<IpPolicy>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct IpPolicy {
    ip: String,
    rules: Vec<Rule>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ClientPolicies {
    client_rules: Vec<ClientPolicy>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ClientPolicy {
    client_id: String,
    rules: Vec<Rule>,
}

fn section<T: for<'de> Deserialize<'de> + Default>(
    value: &serde_json::Value,
    name: &str,
) -> Result<Option<T>, HttpConfigError> {
    match value.get(name) {
        None => Ok(None),
        Some(v) => T::deserialize(v).map(Some).map_err(|e| {
            HttpConfigError::invalid(name, format!("does not fit AspNetCoreRateLimit: {e}"))
        }),
    }
}

/// AspNetCoreRateLimit matches `verb:/path` as a prefix of the request's `VERB:path`: the
/// pattern is given a trailing `*` unless it has one (or is `*`).
fn prefix_match(endpoint: &str) -> String {
    let trimmed = endpoint.trim();
    if trimmed == "*" || trimmed.ends_with('*') || !trimmed.contains(':') {
        trimmed.to_owned()
    } else {
        format!("{trimmed}*")
    }
}

fn rule(
    r: Rule,
    key: RuleKey,
    prefix: &str,
    per_endpoint: bool,
    field: String,
) -> Result<RuleConfig, HttpConfigError> {
    let endpoint = r.endpoint.unwrap_or_else(|| "*".to_owned());
    if !(r.limit >= 0.0 && r.limit.fract() == 0.0 && r.limit <= u32::MAX as f64) {
        return Err(HttpConfigError::invalid(
            format!("{field}.Limit"),
            format!(
                "{} is not a whole number of requests up to {}",
                r.limit,
                u32::MAX
            ),
        ));
    }
    Ok(RuleConfig {
        name: Some(format!("{prefix}{endpoint}-{}", r.period)),
        endpoint: prefix_match(&endpoint),
        period: r.period,
        limit: r.limit as u64,
        key,
        monitor: r.monitor_mode,
        per_endpoint,
        ..RuleConfig::default()
    })
}

/// How AspNetCoreRateLimit formats `QuotaExceededResponse.Content` and `QuotaExceededMessage`
/// (.NET's `string.Format` with the limit, the period and the retry-after), as a body template:
/// `{0}`, `{1}` and `{2}` (alignment and format ignored) become `{limit}`, `{period}` and
/// `{retry_after}`, `{{` and `}}` single braces. Any other brace is kept as written (.NET
/// would throw instead).
fn template_of_dotnet_format(format: &str) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut rest = format;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if after.starts_with("{{") || after.starts_with("}}") {
            out.push_str(&after[..1]);
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
                out.push_str(&after[..1]);
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// One section's rules, as AspNetCoreRateLimit's matching sees them.
struct Section<'a> {
    key: RuleKey,
    prefix: &'a str,
    /// The section's `EnableEndpointRateLimiting`: each rule counts each `VERB:path` apart.
    per_endpoint: bool,
    /// The section leaves endpoint rate limiting off while the configuration turns it on for
    /// the other section: its rules other than `*` are left out, since there they never apply.
    only_any: bool,
}

impl Section<'_> {
    fn rules(&self, rules: Vec<Rule>, field: &str) -> Result<Vec<RuleConfig>, HttpConfigError> {
        let mut out = Vec::with_capacity(rules.len());
        for (i, r) in rules.into_iter().enumerate() {
            if self.only_any && r.endpoint.as_deref().is_some_and(|e| e.trim() != "*") {
                continue;
            }
            let field = format!("{field}[{i}]");
            out.push(rule(r, self.key, self.prefix, self.per_endpoint, field)?);
        }
        Ok(out)
    }
}

fn apply_options(
    config: &mut HttpConfig,
    options: Options,
    section: &Section<'_>,
    name: &str,
) -> Result<(), HttpConfigError> {
    if options.stack_blocked_requests {
        return Err(HttpConfigError::invalid(
            format!("{name}.StackBlockedRequests"),
            "true is not supported: rejected requests are never counted",
        ));
    }
    if let Some(p) = options.rate_limit_counter_prefix {
        config.backend.prefix = Some(p);
    }
    if let Some(h) = options.real_ip_header {
        config.client_ip.headers = vec![ForwardedHeader::Custom(h)];
    }
    if options.client_id_header.is_some() {
        config.client_id_header = options.client_id_header;
    }
    if let Some(status) = options.http_status_code {
        config.response.status = status;
    }
    let mut content = options.quota_exceeded_message;
    let mut content_type = None;
    if let Some(q) = options.quota_exceeded_response {
        if let Some(status) = q.status_code {
            config.response.status = status;
        }
        content_type = q.content_type;
        content = q.content.or(content);
    }
    match content {
        Some(content) => {
            config.response.body = Some(template_of_dotnet_format(&content));
            // There the content is `text/plain` unless `ContentType` says otherwise, as a
            // template's is here when `content_type` is unset.
            config.response.content_type = content_type;
        }
        None => {
            if content_type.is_some() {
                config.response.content_type = content_type;
            }
        }
    }
    if options.disable_rate_limit_headers {
        config.response.ietf_headers = false;
        config.response.legacy_headers = false;
    }
    config.whitelist.ips.extend(options.ip_whitelist);
    config
        .whitelist
        .endpoints
        .extend(options.endpoint_whitelist);
    config.whitelist.clients.extend(options.client_whitelist);
    let rules = section.rules(options.general_rules, &format!("{name}.GeneralRules"))?;
    config.rules.extend(rules);
    Ok(())
}

/// Translates a parsed AspNetCoreRateLimit document.
pub(crate) fn translate(value: serde_json::Value) -> Result<HttpConfig, HttpConfigError> {
    if !is_aspnet(&value) {
        return Err(HttpConfigError::Parse {
            format: "AspNetCoreRateLimit json",
            message: format!("none of the sections {SECTIONS:?} is present"),
        });
    }
    let ip = section::<Options>(&value, "IpRateLimiting")?;
    let client = section::<Options>(&value, "ClientRateLimiting")?;
    // One switch here, one per section there: on if either section has it on, and then the
    // section that has it off keeps only its `*` rules.
    let endpoints =
        |o: &Option<Options>| o.as_ref().is_some_and(|o| o.enable_endpoint_rate_limiting);
    let (ip_endpoints, client_endpoints) = (endpoints(&ip), endpoints(&client));
    let endpoint_rate_limiting = ip_endpoints || client_endpoints;
    let ip_section = Section {
        key: RuleKey::Ip,
        prefix: "",
        per_endpoint: ip_endpoints,
        only_any: endpoint_rate_limiting && !ip_endpoints,
    };
    let client_section = Section {
        key: RuleKey::Client,
        prefix: "client:",
        per_endpoint: client_endpoints,
        only_any: endpoint_rate_limiting && !client_endpoints,
    };
    let mut config = HttpConfig {
        endpoint_rate_limiting,
        // AspNetCoreRateLimit's defaults, which a section may replace: a document that relies
        // on them has its client rules and client whitelist count `X-ClientId` (not nothing),
        // and reads the address `X-Real-IP` from trusted proxies, as there.
        client_id_header: Some("X-ClientId".to_owned()),
        ..HttpConfig::default()
    };
    config.client_ip.headers = vec![ForwardedHeader::Custom("X-Real-IP".to_owned())];
    if let Some(o) = ip {
        apply_options(&mut config, o, &ip_section, "IpRateLimiting")?;
    }
    if let Some(o) = client {
        apply_options(&mut config, o, &client_section, "ClientRateLimiting")?;
    }
    if let Some(p) = section::<IpPolicies>(&value, "IpRateLimitPolicies")? {
        for (i, policy) in p.ip_rules.into_iter().enumerate() {
            let field = format!("IpRateLimitPolicies.IpRules[{i}].Rules");
            config.ip_rules.push(IpRulesConfig {
                ip: policy.ip,
                rules: ip_section.rules(policy.rules, &field)?,
            });
        }
    }
    if let Some(p) = section::<ClientPolicies>(&value, "ClientRateLimitPolicies")? {
        for (i, policy) in p.client_rules.into_iter().enumerate() {
            let field = format!("ClientRateLimitPolicies.ClientRules[{i}].Rules");
            config.client_rules.push(ClientRulesConfig {
                client_id: policy.client_id,
                rules: client_section.rules(policy.rules, &field)?,
            });
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use crate::http::{
        rejection_response, ForwardedHeader, HttpConfig, HttpLimiter, Outcome, QuotaState,
        RejectReason, RequestInfo, Verdict,
    };
    use std::time::Duration;

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
