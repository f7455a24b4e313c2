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

fn apply_options(
    config: &mut HttpConfig,
    options: Options,
    key: RuleKey,
    prefix: &str,
    name: &str,
) -> Result<(), HttpConfigError> {
    if options.stack_blocked_requests {
        return Err(HttpConfigError::invalid(
            format!("{name}.StackBlockedRequests"),
            "true is not supported: rejected requests are never counted",
        ));
    }
    config.endpoint_rate_limiting = options.enable_endpoint_rate_limiting;
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
    if let Some(q) = options.quota_exceeded_response {
        if let Some(status) = q.status_code {
            config.response.status = status;
        }
        if let Some(ct) = q.content_type {
            config.response.content_type = ct;
        }
        if q.content.is_some() {
            config.response.body = q.content;
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
    let per_endpoint = config.endpoint_rate_limiting;
    for (i, r) in options.general_rules.into_iter().enumerate() {
        let field = format!("{name}.GeneralRules[{i}]");
        config
            .rules
            .push(rule(r, key, prefix, per_endpoint, field)?);
    }
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
    let mut config = HttpConfig {
        endpoint_rate_limiting: false,
        ..HttpConfig::default()
    };
    if let Some(o) = section::<Options>(&value, "IpRateLimiting")? {
        apply_options(&mut config, o, RuleKey::Ip, "", "IpRateLimiting")?;
    }
    if let Some(o) = section::<Options>(&value, "ClientRateLimiting")? {
        apply_options(
            &mut config,
            o,
            RuleKey::Client,
            "client:",
            "ClientRateLimiting",
        )?;
    }
    let per_endpoint = config.endpoint_rate_limiting;
    if let Some(p) = section::<IpPolicies>(&value, "IpRateLimitPolicies")? {
        for (i, policy) in p.ip_rules.into_iter().enumerate() {
            let mut rules = Vec::new();
            for (j, r) in policy.rules.into_iter().enumerate() {
                let field = format!("IpRateLimitPolicies.IpRules[{i}].Rules[{j}]");
                rules.push(rule(r, RuleKey::Ip, "", per_endpoint, field)?);
            }
            config.ip_rules.push(IpRulesConfig {
                ip: policy.ip,
                rules,
            });
        }
    }
    if let Some(p) = section::<ClientPolicies>(&value, "ClientRateLimitPolicies")? {
        for (i, policy) in p.client_rules.into_iter().enumerate() {
            let mut rules = Vec::new();
            for (j, r) in policy.rules.into_iter().enumerate() {
                let field = format!("ClientRateLimitPolicies.ClientRules[{i}].Rules[{j}]");
                rules.push(rule(r, RuleKey::Client, "client:", per_endpoint, field)?);
            }
            config.client_rules.push(ClientRulesConfig {
                client_id: policy.client_id,
                rules,
            });
        }
    }
    Ok(config)
}
