//! The HTTP layer's rules counted in Redis (`[backend] kind = "redis"`), against a real
//! `redis-server` started by each test (a missing server fails the test, never skips it).
//!
//! Redis's `TIME` is real time: the rules use windows of a minute or more, exact sliding windows
//! (which have no boundary to straddle) wherever a test counts in Redis, so that no test depends
//! on how fast it runs or when. The few fixed windows (the default algorithm) counted in Redis
//! are an hour long, and their tests make room for themselves in the hour (`room_in_window`): a
//! window ending within a test expires its key. Fixed windows in the tests where Redis is
//! killed first count in the fallback's memory, on a clock that starts with the limiter.

#![cfg(all(feature = "http", feature = "redis"))]

#[path = "common/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;
use std::net::IpAddr;
use std::time::Duration;
use tower::Layer;
use turnstile::http::{
    Check, HttpConfig, HttpConfigError, HttpLimiter, Outcome, PeerAddr, RateLimitLayer,
    RejectReason, RequestInfo, Verdict,
};
use turnstile::redis::Commands;

/// A Redis configuration: `failure` policy, a 200 ms deadline, then `rules` (TOML).
fn config(url: &str, failure: &str, rules: &str) -> HttpConfig {
    config_with_deadline(url, failure, "200ms", rules)
}

fn config_with_deadline(url: &str, failure: &str, deadline: &str, rules: &str) -> HttpConfig {
    HttpConfig::from_toml_str(&format!(
        "[backend]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"myapp\"\nfailure = \"{failure}\"\ndeadline = \"{deadline}\"\n{rules}"
    ))
    .unwrap()
}

/// Two requests per minute per IP, counted exactly.
const TWO_PER_MINUTE: &str =
    "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 2\nalgorithm = \"sliding_window\"\n";

/// Decides a GET of `path` from `ip`; a rule counted in Redis must answer `Pending`.
async fn get(limiter: &HttpLimiter, path: &str, ip: &str) -> Verdict {
    let ip: IpAddr = ip.parse().unwrap();
    let request = RequestInfo {
        method: &http::Method::GET,
        path,
        client_ip: Some(ip),
        client_id: None,
    };
    match limiter.check(&request) {
        Check::Pending(pending) => pending.await,
        other => panic!("a rule counted in Redis must be pending, got {other:?}"),
    }
}

fn rejection(verdict: &Verdict) -> Option<(RejectReason, &str, Option<Duration>)> {
    match &verdict.outcome {
        Outcome::Rejected {
            reason,
            rule,
            retry_after,
        } => Some((*reason, rule, *retry_after)),
        _ => None,
    }
}

#[tokio::test]
async fn third_request_is_rejected_with_retry_after() {
    let server = RedisServer::start();
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", TWO_PER_MINUTE))
        .await
        .unwrap();
    let first = get(&limiter, "/", "203.0.113.7").await;
    assert_eq!(first.outcome, Outcome::Admitted);
    assert_eq!(first.quotas[0].remaining, 1);
    assert_eq!(first.quotas[0].limit, 2);
    assert_eq!(
        get(&limiter, "/", "203.0.113.7").await.quotas[0].remaining,
        0
    );
    let third = get(&limiter, "/", "203.0.113.7").await;
    let (reason, rule, retry_after) = rejection(&third).expect("the third must be rejected");
    assert_eq!((reason, rule), (RejectReason::RateLimited, "per-ip"));
    let retry_after = retry_after.expect("a rate-limit rejection says when to retry");
    assert!(
        retry_after > Duration::from_secs(30) && retry_after <= Duration::from_secs(60),
        "{retry_after:?}"
    );
    assert_eq!(third.quotas[0].remaining, 0);
    // Another client has its own count.
    assert!(
        get(&limiter, "/", "203.0.113.8")
            .await
            .outcome
            .is_admitted()
    );
    // The keys are in Redis under the configured prefix, and all expire.
    let keys = redis_server::assert_all_keys_expire(&mut server.connection(), "myapp");
    assert_eq!(keys.len(), 2, "{keys:?}");
}

#[tokio::test]
async fn two_limiters_on_one_redis_share_the_limit() {
    let server = RedisServer::start();
    let a = HttpLimiter::connect(config(&server.url(), "closed", TWO_PER_MINUTE))
        .await
        .unwrap();
    let b = HttpLimiter::connect(config(&server.url(), "closed", TWO_PER_MINUTE))
        .await
        .unwrap();
    assert!(get(&a, "/", "198.51.100.1").await.outcome.is_admitted());
    assert!(get(&b, "/", "198.51.100.1").await.outcome.is_admitted());
    let verdict = get(&a, "/", "198.51.100.1").await;
    assert_eq!(
        rejection(&verdict).map(|r| r.0),
        Some(RejectReason::RateLimited)
    );
    let verdict = get(&b, "/", "198.51.100.1").await;
    assert_eq!(
        rejection(&verdict).map(|r| r.0),
        Some(RejectReason::RateLimited)
    );
}

/// Two rules match `/narrow` ("wide" first, then "narrow"): a request "narrow" rejects must not
/// be charged to "wide", although "wide" is decided first.
#[tokio::test]
async fn a_rejected_request_is_charged_to_no_rule() {
    let server = RedisServer::start();
    let rules = "[[rules]]\nname = \"wide\"\nendpoint = \"*\"\nperiod = \"1m\"\nlimit = 5\nalgorithm = \"sliding_window\"\n\
                 [[rules]]\nname = \"narrow\"\nendpoint = \"*:/narrow\"\nperiod = \"1h\"\nlimit = 1\nalgorithm = \"sliding_window\"\n";
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", rules))
        .await
        .unwrap();
    let ip = "192.0.2.10";
    let first = get(&limiter, "/narrow", ip).await;
    assert_eq!(first.outcome, Outcome::Admitted);
    assert_eq!(first.quotas.len(), 2);
    for _ in 0..3 {
        let verdict = get(&limiter, "/narrow", ip).await;
        let (reason, rule, _) = rejection(&verdict).expect("narrow allows one per hour");
        assert_eq!((reason, rule), (RejectReason::RateLimited, "narrow"));
    }
    // "wide" counted only the admitted request: 4 left.
    let other = get(&limiter, "/other", ip).await;
    assert_eq!(other.outcome, Outcome::Admitted);
    assert_eq!(other.quotas.len(), 1);
    assert_eq!(
        (other.quotas[0].policy.as_ref(), other.quotas[0].remaining),
        ("wide", 3)
    );
}

#[tokio::test]
async fn reload_keeps_counters_in_redis_unless_the_rule_identity_changes() {
    let server = RedisServer::start();
    let url = server.url();
    let limiter = HttpLimiter::connect(config(&url, "closed", TWO_PER_MINUTE))
        .await
        .unwrap();
    let ip = "192.0.2.20";
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    // Only the limit changes: the same keys, one more request.
    let three = TWO_PER_MINUTE.replace("limit = 2", "limit = 3");
    limiter.reload(config(&url, "closed", &three)).unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert_eq!(verdict.outcome, Outcome::Admitted);
    assert_eq!(verdict.quotas[0].remaining, 0);
    assert!(!get(&limiter, "/", ip).await.outcome.is_admitted());
    // A renamed rule is another rule: fresh keys.
    let renamed = three.replace("per-ip", "per-client-ip");
    limiter.reload(config(&url, "closed", &renamed)).unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert_eq!(verdict.outcome, Outcome::Admitted);
    assert_eq!(verdict.quotas[0].remaining, 2);
    // A reload cannot move to another Redis.
    let elsewhere = config("redis://127.0.0.1:1/", "closed", &renamed);
    assert!(limiter.reload(elsewhere).is_err());
    // Nor to memory, where each process would count on its own: refused, and the rules in
    // force still count in Redis.
    let in_memory = HttpConfig::from_toml_str(&renamed).unwrap();
    let error = limiter.reload(in_memory).unwrap_err().to_string();
    assert!(error.starts_with("backend.kind"), "{error}");
    assert!(matches!(
        limiter.check(&RequestInfo {
            method: &http::Method::GET,
            path: "/",
            client_ip: Some(ip.parse().unwrap()),
            client_id: None,
        }),
        Check::Pending(_)
    ));
}

/// The same IP range listed twice, once with an enforced rule and once with a monitor rule of
/// the default name and the same period (so of one identity: the monitor flag and the limit are
/// not part of it), is two rules in Redis as in memory, each counting on its own keys. When
/// they shared keys, every request was counted twice on one state, and the enforced rule of
/// limit 3 rejected the third request.
#[tokio::test]
async fn rules_of_one_identity_count_on_their_own_keys() {
    let server = RedisServer::start();
    let rules = "[[ip_rules]]\nip = \"192.0.2.0/24\"\n[[ip_rules.rules]]\nperiod = \"1m\"\nlimit = 3\nalgorithm = \"sliding_window\"\n\
                 [[ip_rules]]\nip = \"192.0.2.0/24\"\n[[ip_rules.rules]]\nperiod = \"1m\"\nlimit = 2\nalgorithm = \"sliding_window\"\nmonitor = true\n";
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", rules))
        .await
        .unwrap();
    let ip = "192.0.2.7";
    for i in 0..3 {
        let verdict = get(&limiter, "/", ip).await;
        assert!(verdict.outcome.is_admitted(), "request {i}: {verdict:?}");
    }
    let verdict = get(&limiter, "/", ip).await;
    assert!(rejection(&verdict).is_some(), "{verdict:?}");
    let mut con = server.connection();
    let keys: Vec<String> = con.keys("myapp:*").unwrap();
    assert_eq!(keys.len(), 2, "one key per rule: {keys:?}");
    // A reload keeps each rule on its keys: the enforced rule is still spent.
    limiter
        .reload(config(&server.url(), "closed", rules))
        .unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert!(rejection(&verdict).is_some(), "{verdict:?}");
}

/// Redis gone and `fallback`: the rule's local fallback has spent a client's share, and a
/// reload that changes nothing must not give it back. When every reload built each rule a new
/// `RedisLimiter`, the fallback started empty and admitted the client's whole share again (in
/// every process of the fleet at once: over-admission while Redis is down).
#[tokio::test]
async fn a_reload_during_an_outage_keeps_the_fallback_spent() {
    let mut server = RedisServer::start();
    let url = server.url();
    let limiter = HttpLimiter::connect(config(&url, "fallback", TWO_PER_MINUTE))
        .await
        .unwrap();
    server.kill();
    let ip = "192.0.2.40";
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    assert!(rejection(&get(&limiter, "/", ip).await).is_some());
    // The same configuration, and then one with another rule beside it: "per-ip" is kept.
    limiter
        .reload(config(&url, "fallback", TWO_PER_MINUTE))
        .unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert_eq!(
        rejection(&verdict).map(|r| (r.0, r.1)),
        Some((RejectReason::RateLimited, "per-ip")),
        "the fallback's count survives a reload: {verdict:?}"
    );
    let more = format!("{TWO_PER_MINUTE}{}", rule("other", "ip", 5, "1h"));
    limiter.reload(config(&url, "fallback", &more)).unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert_eq!(
        rejection(&verdict).map(|r| (r.0, r.1)),
        Some((RejectReason::RateLimited, "per-ip")),
        "{verdict:?}"
    );
    // A changed limit reconfigures the rule's limiter, and its fallback in place: the two
    // requests counted there still count under a limit of one (a fallback rebuilt empty
    // admitted the client again).
    let one = TWO_PER_MINUTE.replace("limit = 2", "limit = 1");
    limiter.reload(config(&url, "fallback", &one)).unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert_eq!(
        rejection(&verdict).map(|r| (r.0, r.1)),
        Some((RejectReason::RateLimited, "per-ip")),
        "the fallback's count survives a reconfiguration: {verdict:?}"
    );
}

/// A reload keeps the `RedisLimiter` of a rule whose identity is unchanged: its deny cache goes
/// on answering a client it rejected without a round trip; a changed limit reconfigures it in
/// place (the counts in Redis kept, the deny cache emptied, so that a raised limit admits at
/// once); a changed prefix names other keys, and so starts afresh.
#[tokio::test]
async fn a_reload_keeps_a_rules_redis_limiter() {
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.connection();
    let limiter = HttpLimiter::connect(config(&url, "closed", TWO_PER_MINUTE))
        .await
        .unwrap();
    let ip = "192.0.2.41";
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    assert!(rejection(&get(&limiter, "/", ip).await).is_some());
    let scripts = calls(&mut con, "evalsha");
    assert!(rejection(&get(&limiter, "/", ip).await).is_some());
    assert_eq!(calls(&mut con, "evalsha"), scripts, "denied locally");
    limiter
        .reload(config(&url, "closed", TWO_PER_MINUTE))
        .unwrap();
    assert!(rejection(&get(&limiter, "/", ip).await).is_some());
    assert_eq!(
        calls(&mut con, "evalsha"),
        scripts,
        "still denied locally after a reload that changed nothing"
    );
    // A new limit: the counts kept in Redis are judged under it at once.
    let three = TWO_PER_MINUTE.replace("limit = 2", "limit = 3");
    limiter.reload(config(&url, "closed", &three)).unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert_eq!(verdict.outcome, Outcome::Admitted, "{verdict:?}");
    assert_eq!(
        (verdict.quotas[0].limit, verdict.quotas[0].remaining),
        (3, 0)
    );
    assert!(rejection(&get(&limiter, "/", ip).await).is_some());
    // Another prefix: other keys, nothing counted there yet.
    let mut moved = config(&url, "closed", &three);
    moved.backend.prefix = Some("elsewhere".to_owned());
    limiter.reload(moved).unwrap();
    let verdict = get(&limiter, "/", ip).await;
    assert_eq!(verdict.outcome, Outcome::Admitted, "{verdict:?}");
    assert_eq!(verdict.quotas[0].remaining, 2);
}

#[tokio::test]
async fn redis_down_fail_open_admits() {
    let mut server = RedisServer::start();
    let limiter = HttpLimiter::connect(config(&server.url(), "open", TWO_PER_MINUTE))
        .await
        .unwrap();
    server.kill();
    for _ in 0..4 {
        let verdict = get(&limiter, "/", "192.0.2.30").await;
        assert_eq!(verdict.outcome, Outcome::Admitted);
    }
}

#[tokio::test]
async fn redis_down_fail_closed_rejects_as_unavailable() {
    let mut server = RedisServer::start();
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", TWO_PER_MINUTE))
        .await
        .unwrap();
    assert!(get(&limiter, "/", "192.0.2.31").await.outcome.is_admitted());
    server.kill();
    let verdict = get(&limiter, "/", "192.0.2.31").await;
    assert_eq!(
        rejection(&verdict),
        Some((RejectReason::Unavailable, "per-ip", None))
    );
}

#[tokio::test]
async fn redis_down_fallback_counts_in_memory() {
    let mut server = RedisServer::start();
    let limiter = HttpLimiter::connect(config(&server.url(), "fallback", TWO_PER_MINUTE))
        .await
        .unwrap();
    server.kill();
    assert!(get(&limiter, "/", "192.0.2.32").await.outcome.is_admitted());
    assert!(get(&limiter, "/", "192.0.2.32").await.outcome.is_admitted());
    let verdict = get(&limiter, "/", "192.0.2.32").await;
    assert_eq!(
        rejection(&verdict).map(|r| (r.0, r.1)),
        Some((RejectReason::RateLimited, "per-ip"))
    );
    // Counted per client, as in Redis.
    assert!(get(&limiter, "/", "192.0.2.33").await.outcome.is_admitted());
}

/// Redis gone and `fallback`: each rule's fallback counts at most `max_keys_per_rule` clients in
/// this process, as the rule does in memory. It was built with the default cap (1,048,576)
/// whatever the configuration said, so an outage let memory grow a thousand times past a cap of
/// 1,000 (8 GB for a `sliding_window` rule of limit 1,000). A new client meeting a fallback full
/// of active ones is rejected as `TooManyKeys` (it was reported `Unavailable`, had it come to
/// that); a reload that changes the cap gives the rule a new fallback under it.
#[tokio::test]
async fn a_rules_fallback_counts_at_most_max_keys_per_rule_clients() {
    let mut server = RedisServer::start();
    let url = server.url();
    let config = |max_keys: u32| {
        HttpConfig::from_toml_str(&format!(
            "max_keys_per_rule = {max_keys}\n[backend]\nkind = \"redis\"\nurl = \"{url}\"\n\
             failure = \"fallback\"\ndeadline = \"200ms\"\n{TWO_PER_MINUTE}"
        ))
        .unwrap()
    };
    let limiter = HttpLimiter::connect(config(2)).await.unwrap();
    server.kill();
    for ip in ["192.0.2.40", "192.0.2.41"] {
        assert!(get(&limiter, "/", ip).await.outcome.is_admitted(), "{ip}");
    }
    let verdict = get(&limiter, "/", "192.0.2.42").await;
    assert_eq!(
        rejection(&verdict).map(|r| (r.0, r.1)),
        Some((RejectReason::TooManyKeys, "per-ip"))
    );
    // The clients it counts still count there.
    assert!(get(&limiter, "/", "192.0.2.40").await.outcome.is_admitted());
    limiter.reload(config(3)).unwrap();
    assert!(get(&limiter, "/", "192.0.2.42").await.outcome.is_admitted());
}

/// An admitted request's monitor rules are counted in Redis at once: with Redis silent
/// (paused) and `failure = "open"`, one enforced rule and three monitor rules take two
/// deadlines (the enforced rules', then the monitors' together), not four, as when each monitor
/// waited out its deadline after the one before. Real time: the deadline is what is measured.
#[tokio::test]
async fn monitor_rules_wait_out_one_deadline_together_when_redis_is_silent() {
    let server = RedisServer::start();
    let mut rules = String::from(TWO_PER_MINUTE);
    // Of different periods: of rules of one period and key only the lowest limit applies.
    for hours in [1, 2, 3] {
        rules.push_str(&format!(
            "[[rules]]\nname = \"m{hours}\"\nperiod = \"{hours}h\"\nlimit = 100\n\
             monitor = true\nalgorithm = \"sliding_window\"\n"
        ));
    }
    let limiter =
        HttpLimiter::connect(config_with_deadline(&server.url(), "open", "300ms", &rules))
            .await
            .unwrap();
    // Warm: the scripts are loaded, so that the paused server's silence is the only wait.
    assert!(get(&limiter, "/", "192.0.2.50").await.outcome.is_admitted());
    server.pause();
    let started = std::time::Instant::now();
    let verdict = get(&limiter, "/", "192.0.2.50").await;
    let took = started.elapsed();
    server.resume();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_millis(1_000),
        "two deadlines of 300 ms, not four: {took:?}"
    );
}

/// `GET /` from `peer` through `service`, once it is ready.
async fn get_from<S>(service: &mut S, peer: &str) -> S::Response
where
    S: tower::Service<http::Request<String>>,
    S::Error: std::fmt::Debug,
{
    let mut request = http::Request::get("/").body(String::new()).unwrap();
    request
        .extensions_mut()
        .insert(PeerAddr(peer.parse().unwrap()));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    service.call(request).await.unwrap()
}

/// A service answering "ok" behind the layer of a limiter counting in the Redis at `url` (two
/// requests a minute per IP, failing closed).
async fn ok_behind_the_layer(
    url: String,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<impl Sized>,
    Error = impl std::fmt::Debug,
> {
    let limiter = std::sync::Arc::new(
        HttpLimiter::connect(config(&url, "closed", TWO_PER_MINUTE))
            .await
            .unwrap(),
    );
    let layer: RateLimitLayer<HttpLimiter> = limiter.layer();
    layer.layer(tower::service_fn(|_: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
    }))
}

/// Through the layer, a request Redis could not decide under `failure = "closed"` is answered
/// 503 (`unavailable_status`), not the 429 that tells a client it sent too much, and with no
/// `Retry-After`: nobody knows when Redis comes back.
#[tokio::test]
async fn the_layer_answers_503_while_redis_is_down_under_a_closed_policy() {
    let mut server = RedisServer::start();
    let mut service = ok_behind_the_layer(server.url()).await;
    let peer = "192.0.2.41:5000";
    assert_eq!(get_from(&mut service, peer).await.status(), 200);
    server.kill();
    let response = get_from(&mut service, peer).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_none());
}

#[tokio::test]
async fn the_layer_answers_429_with_retry_after() {
    let server = RedisServer::start();
    let mut service = ok_behind_the_layer(server.url()).await;
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let response = get_from(&mut service, "192.0.2.40:5000").await;
        statuses.push(response.status().as_u16());
        last = Some(response);
    }
    assert_eq!(statuses, [200, 200, 429]);
    let last = last.unwrap();
    let retry_after: u64 = last.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((31..=60).contains(&retry_after), "{retry_after}");
}

#[test]
fn configuration_errors_name_the_field() {
    // The sync constructor cannot connect: a typed error says what to use.
    let cfg = config("redis://127.0.0.1:6379/", "closed", TWO_PER_MINUTE);
    assert_eq!(
        HttpLimiter::new(cfg).unwrap_err(),
        HttpConfigError::NeedsConnect
    );
    let bad_failure = config("redis://127.0.0.1:6379/", "sometimes", TWO_PER_MINUTE);
    assert!(
        HttpLimiter::new(bad_failure)
            .unwrap_err()
            .to_string()
            .starts_with("backend.failure")
    );
    let no_url =
        HttpConfig::from_toml_str(&format!("[backend]\nkind = \"redis\"\n{TWO_PER_MINUTE}"))
            .unwrap();
    assert!(
        HttpLimiter::new(no_url)
            .unwrap_err()
            .to_string()
            .starts_with("backend.url")
    );
    let bad_deadline = HttpConfig::from_toml_str(&format!(
        "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\ndeadline = \"soon\"\n{TWO_PER_MINUTE}"
    ))
    .unwrap();
    assert!(
        HttpLimiter::new(bad_deadline)
            .unwrap_err()
            .to_string()
            .starts_with("backend.deadline")
    );
}

/// A rule the scripts cannot count (an exact sliding window above 100,000 in Redis, valid in
/// memory) is refused naming its field, by `connect` before it connects and by a reload before
/// anything changes: the limits in force stay. It used to be refused only as its Redis limiter
/// was built, naming `backend`, after the reload had compiled and reconfigured the limiters it
/// keeps.
#[tokio::test]
async fn a_rule_redis_cannot_count_is_refused_naming_its_field() {
    let too_wide = |url: &str| {
        config(
            url,
            "closed",
            &format!(
                "{TWO_PER_MINUTE}[[ip_rules]]\nip = \"192.0.2.0/24\"\n[[ip_rules.rules]]\nperiod = \"1h\"\nlimit = 200000\nalgorithm = \"sliding_window\"\n"
            ),
        )
    };
    // Refused before connecting: the port has no server, and the error is not about that.
    let error = HttpLimiter::connect(too_wide("redis://127.0.0.1:1/"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("ip_rules[0].rules[0]") && error.contains("100000"),
        "{error}"
    );
    let server = RedisServer::start();
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", TWO_PER_MINUTE))
        .await
        .unwrap();
    let ip = "192.0.2.30";
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    let error = limiter
        .reload(too_wide(&server.url()))
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("ip_rules[0].rules[0]"), "{error}");
    // The rules in force are the old ones: one more request, then a rejection.
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    assert!(rejection(&get(&limiter, "/", ip).await).is_some());
}

#[tokio::test]
async fn connect_fails_clearly_when_redis_is_not_there() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let err = HttpLimiter::connect(config(&url, "closed", TWO_PER_MINUTE))
        .await
        .unwrap_err();
    assert!(matches!(err, HttpConfigError::Backend { .. }), "{err}");
}

#[cfg(feature = "metrics")]
#[path = "common/tally.rs"]
mod tally;

/// The global recorder (the decisions run in futures), installed once for every test of this
/// binary by the first call; each test's rule names are its own. A test calls it before
/// anything it counts.
#[cfg(feature = "metrics")]
fn recorder() -> &'static tally::Counts {
    static COUNTS: std::sync::OnceLock<tally::Counts> = std::sync::OnceLock::new();
    COUNTS.get_or_init(|| {
        let counts = tally::Counts::default();
        metrics::set_global_recorder(tally::Tally(counts.clone())).unwrap();
        counts
    })
}

/// The total of counter `key` (`name{rule}`) so far.
#[cfg(feature = "metrics")]
fn n(key: &str) -> u64 {
    recorder().lock().unwrap().get(key).copied().unwrap_or(0)
}

/// Every decision the failure policy made instead of Redis is counted once, by rule.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn fallbacks_are_counted_by_rule() {
    recorder();
    let mut server = RedisServer::start();
    let rules = TWO_PER_MINUTE.replace("per-ip", "metered");
    let limiter = HttpLimiter::connect(config(&server.url(), "fallback", &rules))
        .await
        .unwrap();
    assert!(get(&limiter, "/", "192.0.2.50").await.outcome.is_admitted());
    server.kill();
    for _ in 0..3 {
        get(&limiter, "/", "192.0.2.50").await;
    }
    assert_eq!(n("turnstile_http_backend_fallbacks{metered}"), 3);
    // One in Redis, then two of the three counted locally (the fallback starts empty).
    assert_eq!(n("turnstile_http_admitted{metered}"), 3);
    assert_eq!(n("turnstile_http_rejected{metered}"), 1);
}

/// Monitor rules count in Redis too and never reject; the sync `decide` cannot wait for Redis and
/// says so without charging anything.
#[tokio::test]
async fn monitor_rules_count_in_redis_and_sync_decide_is_unavailable() {
    let server = RedisServer::start();
    let rules = format!(
        "{TWO_PER_MINUTE}[[rules]]\nname = \"shadow\"\nperiod = \"1h\"\nlimit = 1\nmonitor = true\n"
    );
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", &rules))
        .await
        .unwrap();
    // "shadow" is a fixed window aligned to Redis's clock: its key must outlive the test.
    let mut con = server.connection();
    let hour = Duration::from_secs(3600);
    redis_server::room_in_window(&mut con, hour, Duration::from_secs(10));
    let request = RequestInfo {
        method: &http::Method::GET,
        path: "/",
        client_ip: Some("192.0.2.60".parse().unwrap()),
        client_id: None,
    };
    assert_eq!(
        rejection(&limiter.decide(&request)),
        Some((RejectReason::Unavailable, "backend", None))
    );
    for remaining in [1, 0] {
        let verdict = limiter.decide_async(&request).await;
        assert_eq!(verdict.outcome, Outcome::Admitted);
        // Monitor rules are reported in no header.
        assert_eq!(verdict.quotas.len(), 1);
        assert_eq!(verdict.quotas[0].remaining, remaining);
    }
    // Both rules wrote their keys (the sync decide wrote none): 2 keys.
    let keys: Vec<String> = con.keys("myapp:*").unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
}

/// Decides a GET of `path` from `ip` as `client`.
async fn get_as(limiter: &HttpLimiter, path: &str, ip: &str, client: &str) -> Verdict {
    let ip: IpAddr = ip.parse().unwrap();
    let request = RequestInfo {
        method: &http::Method::GET,
        path,
        client_ip: Some(ip),
        client_id: Some(client),
    };
    limiter.decide_async(&request).await
}

/// A rule counting by `key` (`ip` or `client`), exactly (sliding window).
fn rule(name: &str, key: &str, limit: u32, period: &str) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nkey = \"{key}\"\nperiod = \"{period}\"\nlimit = {limit}\nalgorithm = \"sliding_window\"\n"
    )
}

/// The permits counted now in the one key whose subject is `subject` (`i<ip>;` or
/// `c<len>:<client>;`): the size of its sliding-window log, 0 without a key.
fn counted(con: &mut redis::Connection, subject: &str) -> usize {
    let keys: Vec<String> = con.keys(format!("myapp:*{{{subject}}}*")).unwrap();
    assert!(keys.len() <= 1, "{keys:?}");
    keys.first().map_or(0, |k| con.zcard(k).unwrap())
}

/// How many times the server has run `command` (lower case), from `INFO commandstats`.
fn calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

fn quota_of<'a>(verdict: &'a Verdict, policy: &str) -> &'a turnstile::http::QuotaState {
    verdict
        .quotas
        .iter()
        .find(|q| q.policy.as_ref() == policy)
        .unwrap_or_else(|| panic!("no quota {policy} in {verdict:?}"))
}

/// Rules whose deny caches both refuse a request name the one that asks to wait longest, as
/// Redis does when it decides: the deny caches answered with the first rule listed, so after a
/// rejection that said "retry in an hour" (Redis), every request within the next ten seconds
/// was told "retry in 10 s" (the short rule's cache), and one that waited as told met the long
/// rule's hour.
#[tokio::test]
async fn deny_caches_name_the_longest_wait_of_the_rules_they_refuse() {
    let server = RedisServer::start();
    let rules = rule("short", "ip", 1, "10s") + &rule("long", "ip", 1, "1h");
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", &rules))
        .await
        .unwrap();
    let mut con = server.connection();
    let ip = "192.0.2.90";
    assert!(get(&limiter, "/", ip).await.outcome.is_admitted());
    let sent = calls(&mut con, "evalsha");
    for attempt in 0..3 {
        let verdict = get(&limiter, "/", ip).await;
        let (reason, rule, retry_after) = rejection(&verdict).expect("both rules allow 1");
        assert_eq!(
            (reason, rule),
            (RejectReason::RateLimited, "long"),
            "{attempt}"
        );
        assert!(
            retry_after.unwrap() > Duration::from_secs(59 * 60),
            "{attempt}: {retry_after:?}"
        );
        assert_eq!(quota_of(&verdict, "long").remaining, 0);
        assert_eq!(quota_of(&verdict, "short").remaining, 0);
    }
    assert_eq!(
        calls(&mut con, "evalsha") - sent,
        1,
        "the deny caches answered twice"
    );
}

/// Two rules counting different subjects (per IP, per client): a request one rejects is not
/// charged to the other, and each request is one script for both.
#[tokio::test]
async fn a_rule_rejecting_leaves_the_other_rules_counter_unchanged() {
    let server = RedisServer::start();
    let rules = rule("per-ip", "ip", 3, "1m") + &rule("per-client", "client", 5, "1h");
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", &rules))
        .await
        .unwrap();
    let mut con = server.connection();
    let (a, b) = ("192.0.2.70", "192.0.2.71");
    let sent = calls(&mut con, "evalsha");
    for left in [2, 1, 0] {
        let verdict = get_as(&limiter, "/", a, "app").await;
        assert_eq!(verdict.outcome, Outcome::Admitted);
        assert_eq!(quota_of(&verdict, "per-ip").remaining, left);
        assert_eq!(quota_of(&verdict, "per-client").remaining, left + 2);
    }
    assert_eq!(
        calls(&mut con, "evalsha") - sent,
        3,
        "one round trip per request"
    );
    for attempt in 0..3 {
        let verdict = get_as(&limiter, "/", a, "app").await;
        let (reason, rule, retry_after) = rejection(&verdict).expect("per-ip allows 3");
        assert_eq!((reason, rule), (RejectReason::RateLimited, "per-ip"));
        assert!(retry_after.unwrap() > Duration::from_secs(30));
        assert_eq!(quota_of(&verdict, "per-ip").remaining, 0);
        if attempt == 0 {
            // Redis decided: both rules are reported, the untouched one as it stands.
            assert_eq!(quota_of(&verdict, "per-client").remaining, 2);
        } else {
            // per-ip's deny cache decided, with no round trip: only per-ip is reported.
            assert_eq!(verdict.quotas.len(), 1);
        }
    }
    assert_eq!(
        calls(&mut con, "evalsha") - sent,
        4,
        "the deny cache answered twice"
    );
    assert_eq!(counted(&mut con, &format!("i{a};")), 3);
    assert_eq!(
        counted(&mut con, "c3:app;"),
        3,
        "rejections charged nothing"
    );
    // The client's last two permits, from another IP; then the client rule rejects.
    for _ in 0..2 {
        assert!(get_as(&limiter, "/", b, "app").await.outcome.is_admitted());
    }
    let verdict = get_as(&limiter, "/", b, "app").await;
    let (_, rule, retry_after) = rejection(&verdict).expect("per-client allows 5");
    assert_eq!(rule, "per-client");
    assert!(retry_after.unwrap() > Duration::from_secs(30 * 60));
    assert_eq!(quota_of(&verdict, "per-ip").remaining, 1);
    assert_eq!(counted(&mut con, &format!("i{b};")), 2);
    assert_eq!(counted(&mut con, &format!("i{a};")), 3);
    assert_eq!(counted(&mut con, "c3:app;"), 5);
}

/// Many concurrent requests of one client from three IPs, through two limiters (two processes)
/// on one server, at the edge of both rules: every rule admits at most its limit, and Redis
/// counts exactly the admitted requests, so no rejected request was charged to any rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_requests_at_the_edge_of_two_rules_charge_only_admissions() {
    const PER_IP: u32 = 4;
    const PER_CLIENT: u32 = 10;
    let server = RedisServer::start();
    let rules =
        rule("race-ip", "ip", PER_IP, "1m") + &rule("race-client", "client", PER_CLIENT, "1h");
    // A generous deadline: a timed-out script may have charged, and this test counts exactly.
    let cfg = || config_with_deadline(&server.url(), "closed", "5s", &rules);
    let limiters = [
        std::sync::Arc::new(HttpLimiter::connect(cfg()).await.unwrap()),
        std::sync::Arc::new(HttpLimiter::connect(cfg()).await.unwrap()),
    ];
    let ips = ["198.51.100.10", "198.51.100.11", "198.51.100.12"];
    let mut tasks = Vec::new();
    for t in 0..12 {
        let limiter = std::sync::Arc::clone(&limiters[t % 2]);
        let ip = ips[t % 3];
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..10 {
                let verdict = get_as(&limiter, "/", ip, "racer").await;
                match rejection(&verdict) {
                    None => admitted += 1,
                    Some((reason, _, _)) => assert_eq!(reason, RejectReason::RateLimited),
                }
            }
            (ip, admitted)
        }));
    }
    let mut per_ip = std::collections::HashMap::new();
    for task in tasks {
        let (ip, admitted) = task.await.unwrap();
        *per_ip.entry(ip).or_insert(0u32) += admitted;
    }
    let total: u32 = per_ip.values().sum();
    let mut con = server.connection();
    for ip in ips {
        let admitted = per_ip[ip];
        assert!(admitted <= PER_IP, "{ip}: {admitted}");
        assert_eq!(
            counted(&mut con, &format!("i{ip};")),
            admitted as usize,
            "{ip}"
        );
    }
    // 3 × 4 permits per IP exceed the client's 10, and every IP keeps asking: the client rule
    // is the one exhausted, exactly.
    assert_eq!(total, PER_CLIENT, "{per_ip:?}");
    assert_eq!(counted(&mut con, "c5:racer;"), total as usize);
}

/// Redis gone, several rules: `closed` rejects as unavailable, naming the first rule; `open`
/// admits.
#[tokio::test]
async fn redis_down_with_several_rules_fail_closed_or_open() {
    let mut server = RedisServer::start();
    let rules = rule("down-ip", "ip", 1, "1m") + &rule("down-client", "client", 1, "1h");
    let closed = HttpLimiter::connect(config(&server.url(), "closed", &rules))
        .await
        .unwrap();
    let open = HttpLimiter::connect(config(&server.url(), "open", &rules))
        .await
        .unwrap();
    assert!(
        get_as(&closed, "/", "192.0.2.80", "c")
            .await
            .outcome
            .is_admitted()
    );
    server.kill();
    let verdict = get_as(&closed, "/", "192.0.2.80", "c").await;
    assert_eq!(
        rejection(&verdict),
        Some((RejectReason::Unavailable, "down-ip", None))
    );
    assert_eq!(verdict.quotas.len(), 2);
    for _ in 0..3 {
        let verdict = get_as(&open, "/", "192.0.2.80", "c").await;
        assert_eq!(verdict.outcome, Outcome::Admitted);
        assert_eq!(verdict.quotas.len(), 2);
    }
}

/// Redis gone, several rules, `fallback`: the rules count locally, all or nothing (a request one
/// rule rejects is not charged to the other), and each request counts one fallback per rule.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn redis_down_with_several_rules_falls_back_and_counts_one_fallback_per_rule() {
    recorder();
    let mut server = RedisServer::start();
    let rules = rule("fb-ip", "ip", 2, "1m") + &rule("fb-client", "client", 3, "1h");
    let limiter = HttpLimiter::connect(config(&server.url(), "fallback", &rules))
        .await
        .unwrap();
    server.kill();
    let (a, b) = ("192.0.2.90", "192.0.2.91");
    let mut outcomes = Vec::new();
    for ip in [a, a, a, b, b] {
        let verdict = get_as(&limiter, "/", ip, "fb").await;
        outcomes.push(rejection(&verdict).map_or("admitted".to_owned(), |r| r.1.to_owned()));
    }
    // The third request from `a` is rejected by fb-ip and not charged to fb-client, which
    // therefore still admits one request from `b`.
    assert_eq!(
        outcomes,
        ["admitted", "admitted", "fb-ip", "admitted", "fb-client"]
    );
    assert_eq!(n("turnstile_http_backend_fallbacks{fb-ip}"), 5);
    assert_eq!(n("turnstile_http_backend_fallbacks{fb-client}"), 5);
    assert_eq!(n("turnstile_http_admitted{fb-ip}"), 3);
    assert_eq!(n("turnstile_http_rejected{fb-ip}"), 1);
    assert_eq!(n("turnstile_http_rejected{fb-client}"), 1);
}

/// Redis gone, several rules, `fallback`, and requests racing for the last permits: a request
/// that one rule rejects is charged to no rule, however the concurrent requests interleave (the
/// local limiters are charged one after the other, and the earlier ones give back when a later
/// one rejects). Audited: the IP rule has counted exactly the admitted requests. Fixed windows,
/// whose refunds are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_down_several_rules_racing_requests_are_charged_all_or_nothing() {
    const CLIENTS: usize = 64;
    const TASKS: usize = 8;
    const IP_LIMIT: u64 = 100_000;
    let mut server = RedisServer::start();
    // Two rules counting by different keys: both apply, whatever their periods.
    let fixed = |name: &str, key: &str, limit: u64, period: &str| {
        format!(
            "[[rules]]\nname = \"{name}\"\nkey = \"{key}\"\nperiod = \"{period}\"\nlimit = {limit}\n"
        )
    };
    let rules = fixed("race-ip", "ip", IP_LIMIT, "2h") + &fixed("race-client", "client", 1, "1h");
    let limiter = std::sync::Arc::new(
        // A short deadline: each request waits for it while Redis is away.
        HttpLimiter::connect(config_with_deadline(
            &server.url(),
            "fallback",
            "10ms",
            &rules,
        ))
        .await
        .unwrap(),
    );
    server.kill();
    // Every task asks for every client, in the same order: the requests for one client race.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let limiter = std::sync::Arc::clone(&limiter);
        tasks.spawn(async move {
            let mut admitted = Vec::new();
            for client in 0..CLIENTS {
                let verdict = get_as(&limiter, "/", "192.0.2.120", &format!("r{client}")).await;
                match rejection(&verdict) {
                    None => admitted.push(client),
                    Some((reason, rule, _)) => {
                        assert_eq!((reason, rule), (RejectReason::RateLimited, "race-client"));
                    }
                }
            }
            admitted
        });
    }
    let mut admitted = Vec::new();
    while let Some(result) = tasks.join_next().await {
        admitted.extend(result.unwrap());
    }
    admitted.sort_unstable();
    assert_eq!(
        admitted,
        (0..CLIENTS).collect::<Vec<_>>(),
        "each client admitted once"
    );
    // The IP rule was charged for the admitted requests only: the next one leaves exactly this.
    let verdict = get_as(&limiter, "/", "192.0.2.120", "another").await;
    assert_eq!(verdict.outcome, Outcome::Admitted);
    assert_eq!(
        quota_of(&verdict, "race-ip").remaining,
        IP_LIMIT - CLIENTS as u64 - 1
    );
}

/// After Redis lost its scripts, several rules still decide in one script: `EVALSHA` answers
/// NOSCRIPT, `EVAL` runs it (and caches it again), and the counts go on.
#[tokio::test]
async fn several_rules_survive_a_script_flush() {
    let server = RedisServer::start();
    let rules = rule("flush-ip", "ip", 3, "1m") + &rule("flush-client", "client", 5, "1h");
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", &rules))
        .await
        .unwrap();
    let mut con = server.connection();
    assert!(
        get_as(&limiter, "/", "192.0.2.100", "f")
            .await
            .outcome
            .is_admitted()
    );
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    let before = calls(&mut con, "eval");
    for left in [1, 0] {
        let verdict = get_as(&limiter, "/", "192.0.2.100", "f").await;
        assert_eq!(verdict.outcome, Outcome::Admitted);
        assert_eq!(quota_of(&verdict, "flush-ip").remaining, left);
        assert_eq!(quota_of(&verdict, "flush-client").remaining, left + 2);
    }
    assert_eq!(calls(&mut con, "eval") - before, 1, "loaded once again");
}

/// A server that answers nothing (SIGSTOP): the request with several rules is decided by the
/// failure policy once the deadline has passed, not later. (Real time is what is under test.)
#[tokio::test]
async fn several_rules_on_a_black_hole_fail_within_the_deadline() {
    let server = RedisServer::start();
    let rules = rule("hole-ip", "ip", 3, "1m") + &rule("hole-client", "client", 5, "1h");
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", &rules))
        .await
        .unwrap();
    assert!(
        get_as(&limiter, "/", "192.0.2.110", "h")
            .await
            .outcome
            .is_admitted()
    );
    server.pause();
    let started = std::time::Instant::now();
    let verdict = get_as(&limiter, "/", "192.0.2.110", "h").await;
    let took = started.elapsed();
    server.resume();
    assert_eq!(
        rejection(&verdict),
        Some((RejectReason::Unavailable, "hole-ip", None))
    );
    // The deadline (200 ms) bounds the whole request; the upper bound leaves room for a busy
    // machine.
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_secs(1),
        "{took:?}"
    );
}

/// A Redis Cluster configuration of two exact per-IP rules (3 a minute, 2 an hour).
fn cluster_config(url: &str) -> HttpConfig {
    HttpConfig::from_toml_str(&format!(
        r#"
        [backend]
        kind = "redis"
        cluster = true
        url = "{url}"
        prefix = "myapp"
        failure = "closed"
        deadline = "500ms"
        [[rules]]
        name = "per-minute"
        period = "1m"
        limit = 3
        algorithm = "sliding_window"
        [[rules]]
        name = "per-hour"
        period = "1h"
        limit = 2
        algorithm = "sliding_window"
        "#
    ))
    .unwrap()
}

/// `backend.cluster = true`: the rules count in a Redis Cluster. Two limiters (two processes)
/// share the counts; a request under two rules is still decided in one script, since its keys
/// share the slot of its subject, so a rejected request is charged to neither rule; and the
/// counters of different clients spread over the masters, every key with a TTL.
#[tokio::test]
async fn cluster_rules_are_shared_all_or_nothing_and_spread_over_masters() {
    let cluster = redis_server::RedisCluster::start(3);
    let url = cluster.urls().join(",");
    let a = HttpLimiter::connect(cluster_config(&url)).await.unwrap();
    let b = HttpLimiter::connect(cluster_config(&url)).await.unwrap();
    let remaining = |v: &Verdict, rule: &str| {
        v.quotas
            .iter()
            .find(|q| &*q.policy == rule)
            .map(|q| q.remaining)
    };
    for i in 0..24 {
        let ip = format!("198.51.100.{i}");
        let first = get(&a, "/", &ip).await;
        assert_eq!(first.outcome, Outcome::Admitted, "{ip}");
        assert_eq!(remaining(&first, "per-minute"), Some(2));
        assert_eq!(remaining(&first, "per-hour"), Some(1));
        let second = get(&b, "/", &ip).await;
        assert_eq!(
            second.outcome,
            Outcome::Admitted,
            "{ip}: shared by both limiters"
        );
        assert_eq!(remaining(&second, "per-hour"), Some(0));
        for limiter in [&a, &b] {
            let rejected = get(limiter, "/", &ip).await;
            let (reason, rule, retry_after) = rejection(&rejected).expect("over the hourly limit");
            assert_eq!((reason, rule), (RejectReason::RateLimited, "per-hour"));
            assert!(retry_after.unwrap() > Duration::from_secs(3500));
            assert_eq!(
                remaining(&rejected, "per-minute"),
                Some(1),
                "{ip}: the minute rule was not charged for a rejected request"
            );
        }
    }
    let mut masters_with_keys = 0;
    let mut total = 0;
    for node in &cluster.nodes {
        let keys = redis_server::assert_all_keys_expire(&mut node.connection(), "myapp");
        masters_with_keys += usize::from(!keys.is_empty());
        total += keys.len();
    }
    assert_eq!(
        total,
        24 * 2,
        "one key per rule per client (exact sliding windows)"
    );
    assert!(
        masters_with_keys >= 2,
        "the clients' counters spread over the masters"
    );
}

/// On a Cluster every enforced rule must count alike (the same key and per_endpoint), so that a
/// request's keys share a slot; the error names the rule that does not, before connecting.
/// `cluster` belongs to the Redis backend only.
#[tokio::test]
async fn cluster_rules_must_count_alike() {
    let mixed = HttpConfig::from_toml_str(
        r#"
        client_id_header = "X-ClientId"
        [backend]
        kind = "redis"
        cluster = true
        url = "redis://127.0.0.1:1/,redis://127.0.0.1:2/"
        [[rules]]
        period = "1s"
        limit = 5
        [[rules]]
        period = "1h"
        limit = 0
        key = "client"
        [[rules]]
        period = "1m"
        limit = 50
        key = "client"
        monitor = true
        [[client_rules]]
        client_id = "partner"
        [[client_rules.rules]]
        period = "1m"
        limit = 100
        key = "client"
        "#,
    )
    .unwrap();
    let error = HttpLimiter::connect(mixed).await.unwrap_err().to_string();
    assert!(
        error.starts_with("client_rules[0].rules[0]:") && error.contains("Cluster slot"),
        "{error}"
    );

    let no_node =
        HttpConfig::from_toml_str("[backend]\nkind = \"redis\"\ncluster = true\nurl = \" , \"\n")
            .unwrap();
    let error = HttpLimiter::connect(no_node).await.unwrap_err().to_string();
    assert!(error.starts_with("backend.url:"), "{error}");

    let memory = HttpConfig::from_toml_str("[backend]\ncluster = true\n").unwrap();
    let error = HttpLimiter::new(memory).unwrap_err().to_string();
    assert!(error.starts_with("backend.cluster:"), "{error}");
}

/// Monitor rules count in Redis also when no enforced rule counts the request there: a
/// shadow-only configuration (the usual first rollout of a limit), or an enforced rule the
/// request has no key for. Counted in each process's memory instead, a fleet's shadow rule saw
/// only each process's share of a client's traffic, and would-be rejections went unseen.
#[tokio::test]
async fn monitor_rules_count_in_redis_without_an_enforced_rule_in_redis() {
    let server = RedisServer::start();
    let shadow = "[[rules]]\nname = \"shadow\"\nperiod = \"1h\"\nlimit = 1\nmonitor = true\n";
    let by_client =
        "[[rules]]\nname = \"per-client\"\nkey = \"client\"\nperiod = \"1m\"\nlimit = 5\n";
    for rules in [shadow.to_owned(), format!("{by_client}{shadow}")] {
        let mut con = server.connection();
        // "shadow" is a fixed window aligned to Redis's clock: its key must outlive the case.
        redis_server::room_in_window(&mut con, Duration::from_secs(3600), Duration::from_secs(10));
        let _: () = turnstile::redis::cmd("FLUSHALL").query(&mut con).unwrap();
        let mut config = config(&server.url(), "closed", &rules);
        // The requests have no client id: "per-client" lets them pass uncounted.
        config.missing_key = turnstile::http::MissingKey::Allow;
        let limiter = HttpLimiter::connect(config).await.unwrap();
        // The sync `decide` cannot count in Redis: it admits (a monitor never rejects) and
        // writes nothing.
        let request = RequestInfo {
            method: &http::Method::GET,
            path: "/",
            client_ip: Some("192.0.2.61".parse().unwrap()),
            client_id: None,
        };
        assert_eq!(
            limiter.decide(&request).outcome,
            Outcome::Admitted,
            "{rules}"
        );
        let keys: Vec<String> = con.keys("myapp:*").unwrap();
        assert!(keys.is_empty(), "{keys:?}\n{rules}");
        let verdict = get(&limiter, "/", "192.0.2.61").await;
        assert_eq!(verdict.outcome, Outcome::Admitted, "{rules}");
        assert!(verdict.quotas.is_empty(), "monitor rules report no quota");
        let keys: Vec<String> = con.keys("myapp:*").unwrap();
        assert_eq!(
            keys.len(),
            1,
            "the monitor rule counted in Redis: {keys:?}\n{rules}"
        );
    }
}

/// A monitor rule of limit 0 (a block tried out in shadow first) would reject every request the
/// enforced rules admit, whatever key the request has, and says so in
/// `turnstile_http_shadow_rejected` with the Redis backend as in memory; it has no limiter in
/// Redis, and was skipped there, so the shadow block showed no request it would have refused.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn a_monitor_rule_of_limit_zero_counts_its_would_be_rejections_in_redis() {
    recorder();
    let server = RedisServer::start();
    let rules = format!(
        "{}[[rules]]\nname = \"shadow-block\"\nendpoint = \"*:/admin/*\"\nperiod = \"1m\"\nlimit = 0\nmonitor = true\n\
         [[rules]]\nname = \"shadow-block-by-client\"\nkey = \"client\"\nendpoint = \"*:/admin/*\"\nperiod = \"1h\"\nlimit = 0\nmonitor = true\n",
        TWO_PER_MINUTE
            .replace("per-ip", "enforced-beside-blocks")
            .replace("limit = 2", "limit = 3")
    );
    let limiter = HttpLimiter::connect(config(&server.url(), "closed", &rules))
        .await
        .unwrap();
    for path in ["/admin/users", "/admin/users", "/public"] {
        let verdict = get(&limiter, path, "192.0.2.62").await;
        assert_eq!(verdict.outcome, Outcome::Admitted, "{path}");
    }
    // Rejected by the enforced rule: no monitor is asked.
    assert!(rejection(&get(&limiter, "/admin/users", "192.0.2.62").await).is_some());
    assert_eq!(n("turnstile_http_shadow_rejected{shadow-block}"), 2);
    // The request has no client id: a block needs none.
    assert_eq!(
        n("turnstile_http_shadow_rejected{shadow-block-by-client}"),
        2
    );
}

/// Counting in Redis answers as counting in memory: random rule sets (general, IP and client
/// rules; five endpoint patterns; limits 0 to 3; the three keys; per-endpoint; monitors;
/// exact sliding windows of an hour or two, which nothing ends within the test), a
/// `missing_key` and bans, and random requests (clients inside and outside the IP range, with
/// and without client ids, `GET`, `POST`, `HEAD`), decided by an in-memory limiter and by one
/// counting in Redis: every request is admitted by both with the same quotas, or rejected by
/// both for the same reason. (Which rule a rejection names, and the quotas it reports, may
/// differ: both name the longest wait, but of equal waits memory names the first rule charged
/// that rejects and Redis the first listed, and a deny cache names the first rule it denies and
/// reports that one alone, as `BackendConfig` documents.)
#[test]
fn memory_and_redis_decide_alike() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    type Rule = (usize, u64, u64, usize, bool, bool);
    fn rules_toml(out: &mut String, table: &str, prefix: &str, rules: &[Rule]) {
        const ENDPOINTS: [&str; 5] = ["*", "get:/a", "*:/a*", "post:/b", "head:/a"];
        const KEYS: [&str; 3] = ["ip", "client", "ip_and_client"];
        for (i, (endpoint, hours, limit, key, per_endpoint, monitor)) in rules.iter().enumerate() {
            out.push_str(&format!(
                "[[{table}]]\nname = \"{prefix}{i}\"\nendpoint = \"{}\"\nperiod = \"{hours}h\"\nlimit = {limit}\nkey = \"{}\"\nper_endpoint = {per_endpoint}\nmonitor = {monitor}\nalgorithm = \"sliding_window\"\n",
                ENDPOINTS[*endpoint], KEYS[*key],
            ));
        }
    }
    fn summary(verdict: &Verdict) -> String {
        match &verdict.outcome {
            Outcome::Rejected { reason, .. } => format!("rejected: {reason:?}"),
            outcome => {
                let quotas: Vec<_> = verdict
                    .quotas
                    .iter()
                    .map(|q| (q.policy.to_string(), q.remaining))
                    .collect();
                format!("{outcome:?} {quotas:?}")
            }
        }
    }

    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rule = || {
        (
            0..5usize,
            1..3u64,
            0..4u64,
            0..3usize,
            any::<bool>(),
            prop::bool::weighted(0.2),
        )
    };
    let case = (
        proptest::collection::vec(rule(), 0..4),
        proptest::collection::vec(rule(), 0..3),
        proptest::collection::vec(rule(), 0..3),
        any::<bool>(),
        proptest::option::of(1..4u64),
        proptest::collection::vec((0..3usize, 0..3usize, 0..3usize, 0..3usize), 1..30),
    );
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    runner
        .run(
            &case,
            |(general, ip_rules, client_rules, allow_missing, bans, requests)| {
                let mut doc = format!(
                    "missing_key = \"{}\"\n",
                    if allow_missing { "allow" } else { "reject" }
                );
                if let Some(after) = bans {
                    doc.push_str(&format!(
                        "[bans]\nafter = {after}\nwithin = \"1h\"\nduration = \"1h\"\n"
                    ));
                }
                rules_toml(&mut doc, "rules", "g", &general);
                if !ip_rules.is_empty() {
                    doc.push_str("[[ip_rules]]\nip = \"1.1.1.0/24\"\n");
                    rules_toml(&mut doc, "ip_rules.rules", "i", &ip_rules);
                }
                if !client_rules.is_empty() {
                    doc.push_str("[[client_rules]]\nclient_id = \"c1\"\n");
                    rules_toml(&mut doc, "client_rules.rules", "c", &client_rules);
                }
                let memory = HttpLimiter::new(HttpConfig::from_toml_str(&doc).unwrap()).unwrap();
                let _: () = turnstile::redis::cmd("FLUSHALL")
                    .query(&mut server.connection())
                    .unwrap();
                let redis = runtime
                    .block_on(HttpLimiter::connect(
                        // After the document's top-level keys (`missing_key`).
                        HttpConfig::from_toml_str(&format!(
                            "{doc}[backend]\nkind = \"redis\"\nurl = \"{}\"\nfailure = \"closed\"\ndeadline = \"2s\"\n",
                            server.url()
                        ))
                        .unwrap(),
                    ))
                    .unwrap();
                for (m, p, i, c) in requests {
                    let method =
                        [http::Method::GET, http::Method::POST, http::Method::HEAD][m].clone();
                    let request = RequestInfo {
                        method: &method,
                        path: ["/a", "/a/x", "/b"][p],
                        client_ip: ["1.1.1.1", "2.2.2.2", "1.1.1.9"][i].parse().ok(),
                        client_id: [None, Some("c1"), Some("c2")][c],
                    };
                    let in_memory = summary(&memory.decide(&request));
                    let in_redis = summary(&runtime.block_on(redis.decide_async(&request)));
                    prop_assert_eq!(in_memory, in_redis, "{}\n{:?}", doc, request);
                }
                Ok(())
            },
        )
        .unwrap();
}

/// A `[backend] deadline` is how long Redis may take, also past half a second: the connection
/// `HttpLimiter::connect` makes must not give up sooner. redis-rs's `ConnectionManager` ends a
/// request after 500 ms by default; with a deadline of 2 s, a server that answers after 800 ms
/// (paused, then resumed) had the request failed closed at 500 ms (its script then ran all the
/// same). (Real time is what is under test.)
#[tokio::test]
async fn a_deadline_longer_than_half_a_second_waits_for_redis_that_long() {
    let server = RedisServer::start();
    let limiter = HttpLimiter::connect(config_with_deadline(
        &server.url(),
        "closed",
        "2s",
        TWO_PER_MINUTE,
    ))
    .await
    .unwrap();
    assert!(
        get(&limiter, "/", "192.0.2.120")
            .await
            .outcome
            .is_admitted()
    );
    server.pause();
    let started = std::time::Instant::now();
    let (verdict, ()) = tokio::join!(get(&limiter, "/", "192.0.2.120"), async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        server.resume();
    });
    let took = started.elapsed();
    assert_eq!(verdict.outcome, Outcome::Admitted, "after {took:?}");
    assert_eq!(verdict.quotas[0].remaining, 0);
    assert!(took >= Duration::from_millis(790), "{took:?}");
}
