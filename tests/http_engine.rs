//! The HTTP rule engine, decided directly with a manual clock.
#![cfg(feature = "http")]

use proptest::prelude::*;
use std::net::IpAddr;
use std::time::Duration;
use turnstile::ManualClock;
use turnstile::http::{HttpConfig, HttpLimiter, Outcome, RejectReason, RequestInfo, Verdict};

#[path = "common/http_rules.rs"]
mod http_rules;
use http_rules::PER_IP;

fn limiter(toml: &str) -> (HttpLimiter<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let config = HttpConfig::from_toml_str(toml).expect("valid toml");
    (
        HttpLimiter::with_clock(config, clock.clone()).expect("valid config"),
        clock,
    )
}

fn req<'a>(
    method: &'a http::Method,
    path: &'a str,
    ip: &str,
    client: Option<&'a str>,
) -> RequestInfo<'a> {
    RequestInfo {
        method,
        path,
        client_ip: ip.parse::<IpAddr>().ok(),
        client_id: client,
    }
}

fn get(l: &HttpLimiter<ManualClock>, path: &str, ip: &str, client: Option<&str>) -> Verdict {
    l.decide(&req(&http::Method::GET, path, ip, client))
}

fn reason(v: &Verdict) -> Option<(RejectReason, String, Option<Duration>)> {
    match &v.outcome {
        Outcome::Rejected {
            reason,
            rule,
            retry_after,
        } => Some((*reason, rule.to_string(), *retry_after)),
        _ => None,
    }
}

#[test]
fn third_request_rejected_with_retry_after() {
    let (l, clock) = limiter(PER_IP);
    clock.advance(Duration::from_millis(300));
    let first = get(&l, "/", "1.2.3.4", None);
    assert_eq!(first.outcome, Outcome::Admitted);
    assert_eq!(first.quotas[0].remaining, 1);
    assert_eq!(&*first.quotas[0].policy, "per-ip");
    assert_eq!(get(&l, "/", "1.2.3.4", None).outcome, Outcome::Admitted);
    let third = get(&l, "/", "1.2.3.4", None);
    let (r, rule, retry) = reason(&third).expect("rejected");
    assert_eq!((r, rule.as_str()), (RejectReason::RateLimited, "per-ip"));
    let retry = retry.unwrap();
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(1),
        "{retry:?}"
    );
    // another IP has its own counter
    assert_eq!(get(&l, "/", "1.2.3.5", None).outcome, Outcome::Admitted);
    clock.advance(retry);
    assert_eq!(get(&l, "/", "1.2.3.4", None).outcome, Outcome::Admitted);
}

#[test]
fn limit_zero_blocks_and_blocklist_blocks() {
    let (l, _) = limiter(
        "[[rules]]\nendpoint = \"post:/admin/*\"\nperiod = \"1m\"\nlimit = 0\n[blocklist]\nips = [\"192.0.2.0/24\"]\nclients = [\"evil\"]\n",
    );
    let v = l.decide(&req(&http::Method::POST, "/ADMIN/users", "1.1.1.1", None));
    assert_eq!(reason(&v).unwrap().0, RejectReason::Blocked);
    assert_eq!(reason(&v).unwrap().1, "post:/admin/*-1m");
    assert_eq!(
        get(&l, "/admin/users", "1.1.1.1", None).outcome,
        Outcome::Admitted
    );
    assert_eq!(
        reason(&get(&l, "/", "192.0.2.9", None)).unwrap().0,
        RejectReason::Blocked
    );
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", Some("evil"))).unwrap().0,
        RejectReason::Blocked
    );
}

/// One global rule (the engine's one-rule path): limit 0 blocks every request, and a rule
/// counting by client id rejects a request without one, or admits it uncounted when
/// `missing_key = "allow"`.
#[test]
fn one_global_rule_blocks_at_limit_zero_and_handles_a_missing_key() {
    let (l, _) = limiter("[[rules]]\nname = \"closed\"\nperiod = \"1s\"\nlimit = 0\n");
    for path in ["/", "/api/values"] {
        let v = get(&l, path, "1.1.1.1", None);
        assert_eq!(reason(&v).unwrap().0, RejectReason::Blocked);
        assert_eq!(reason(&v).unwrap().1, "closed");
        assert!(v.quotas.is_empty());
    }

    let by_client =
        "[[rules]]\nname = \"per-client\"\nperiod = \"1s\"\nlimit = 1\nkey = \"client\"\n";
    let (l, _) = limiter(by_client);
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
        RejectReason::NoKey
    );
    assert_eq!(
        get(&l, "/", "1.1.1.1", Some("a")).outcome,
        Outcome::Admitted
    );
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", Some("a"))).unwrap().0,
        RejectReason::RateLimited
    );

    let (l, _) = limiter(&format!("missing_key = \"allow\"\n{by_client}"));
    for _ in 0..3 {
        let v = get(&l, "/", "1.1.1.1", None);
        assert_eq!(v.outcome, Outcome::Admitted);
        assert!(v.quotas.is_empty(), "not counted, so no quota to report");
    }
}

#[test]
fn whitelists_pass_and_are_not_charged() {
    let (l, _) = limiter(&format!(
        "{PER_IP}\n[whitelist]\nips = [\"10.0.0.0/8\", \"127.0.0.1\"]\nclients = [\"dev\"]\nendpoints = [\"get:/api/license\", \"*:/api/status\"]\n"
    ));
    for _ in 0..5 {
        assert_eq!(get(&l, "/", "10.1.2.3", None).outcome, Outcome::Whitelisted);
        assert_eq!(
            get(&l, "/", "127.0.0.1", None).outcome,
            Outcome::Whitelisted
        );
        assert_eq!(
            get(&l, "/", "8.8.8.8", Some("dev")).outcome,
            Outcome::Whitelisted
        );
        assert_eq!(
            get(&l, "/api/license", "8.8.4.4", None).outcome,
            Outcome::Whitelisted
        );
        let put = l.decide(&req(&http::Method::PUT, "/api/status", "8.8.4.4", None));
        assert_eq!(put.outcome, Outcome::Whitelisted);
    }
    // not charged: 8.8.8.8 and 8.8.4.4 still have their full quota
    assert_eq!(get(&l, "/", "8.8.8.8", None).quotas[0].remaining, 1);
    assert_eq!(get(&l, "/", "8.8.4.4", None).quotas[0].remaining, 1);
    // a POST to /api/license is not whitelisted
    let post = l.decide(&req(&http::Method::POST, "/api/license", "8.8.4.4", None));
    assert_eq!(post.outcome, Outcome::Admitted);
    assert_eq!(post.quotas[0].remaining, 0);
}

#[test]
fn client_rule_overrides_general_rule_of_same_period() {
    let (l, _) = limiter(
        r#"
client_id_header = "X-ClientId"
[[rules]]
period = "1s"
limit = 1
key = "client"
[[rules]]
period = "1m"
limit = 100
key = "client"
[[client_rules]]
client_id = "big"
[[client_rules.rules]]
name = "big-1s"
period = "1s"
limit = 3
key = "client"
"#,
    );
    for _ in 0..3 {
        let v = get(&l, "/", "1.1.1.1", Some("big"));
        assert_eq!(v.outcome, Outcome::Admitted);
        let names: Vec<_> = v.quotas.iter().map(|q| q.policy.to_string()).collect();
        assert_eq!(names, ["big-1s", "*-1m"]);
    }
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", Some("big"))).unwrap().1,
        "big-1s"
    );
    assert_eq!(
        get(&l, "/", "1.1.1.1", Some("small")).outcome,
        Outcome::Admitted
    );
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", Some("small"))).unwrap().1,
        "*-1s"
    );
    // no client id: the client rules cannot count it
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
        RejectReason::NoKey
    );
}

#[test]
fn every_algorithm_admits_its_limit_then_rejects() {
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "sliding_counter",
        "token_bucket",
    ] {
        let (l, clock) = limiter(&format!(
            "[[rules]]\nname = \"r\"\nperiod = \"10s\"\nlimit = 3\nkey = \"ip_and_client\"\nalgorithm = \"{algorithm}\"\n"
        ));
        for _ in 0..3 {
            assert_eq!(
                get(&l, "/", "1.1.1.1", Some("a")).outcome,
                Outcome::Admitted,
                "{algorithm}"
            );
        }
        let (r, _, retry) = reason(&get(&l, "/", "1.1.1.1", Some("a"))).expect(algorithm);
        assert_eq!(r, RejectReason::RateLimited);
        // the sliding counter weighs the previous window, so its wait can exceed one period
        let bound = if algorithm == "sliding_counter" {
            20
        } else {
            10
        };
        let retry = retry.unwrap();
        assert!(
            retry > Duration::ZERO && retry <= Duration::from_secs(bound),
            "{algorithm}: {retry:?}"
        );
        // the pair is the key: another client id on the same IP has its own counter
        assert_eq!(
            get(&l, "/", "1.1.1.1", Some("b")).outcome,
            Outcome::Admitted,
            "{algorithm}"
        );
        assert_eq!(
            reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
            RejectReason::NoKey
        );
        clock.advance(retry);
        assert_eq!(
            get(&l, "/", "1.1.1.1", Some("a")).outcome,
            Outcome::Admitted,
            "{algorithm}"
        );
    }
}

#[test]
fn missing_key_allow_skips_the_rule() {
    let (l, _) = limiter(&format!("missing_key = \"allow\"\n{PER_IP}"));
    for _ in 0..5 {
        let v = get(&l, "/", "not an ip", None);
        assert_eq!(v.outcome, Outcome::Admitted);
        assert!(v.quotas.is_empty());
    }
}

#[test]
fn monitor_mode_passes_but_counts() {
    let (l, _) = limiter(
        "[[rules]]\nname = \"shadow\"\nperiod = \"1s\"\nlimit = 1\nmonitor = true\n[[rules]]\nname = \"real\"\nperiod = \"1m\"\nlimit = 3\n",
    );
    for _ in 0..3 {
        let v = get(&l, "/", "1.1.1.1", None);
        assert_eq!(v.outcome, Outcome::Admitted);
        assert_eq!(v.quotas.len(), 1, "monitor rules are not reported");
    }
    assert_eq!(reason(&get(&l, "/", "1.1.1.1", None)).unwrap().1, "real");
    // it was counted: switch it to enforcing and the same counter (same identity) rejects
    let config =
        HttpConfig::from_toml_str("[[rules]]\nname = \"shadow\"\nperiod = \"1s\"\nlimit = 1\n")
            .unwrap();
    l.reload(config).unwrap();
    assert_eq!(reason(&get(&l, "/", "1.1.1.1", None)).unwrap().1, "shadow");
}

#[test]
fn reload_keeps_unchanged_counters_and_applies_new_limit() {
    let base = "[[rules]]\nname = \"a\"\nperiod = \"1m\"\nlimit = 3\n[[rules]]\nname = \"b\"\nperiod = \"1h\"\nlimit = 10\n";
    let (l, _) = limiter(base);
    for _ in 0..2 {
        get(&l, "/", "1.1.1.1", None);
    }
    let changed = "[[rules]]\nname = \"a\"\nperiod = \"1m\"\nlimit = 3\n[[rules]]\nname = \"b\"\nperiod = \"1h\"\nlimit = 3\n";
    l.reload(HttpConfig::from_toml_str(changed).unwrap())
        .unwrap();
    let v = get(&l, "/", "1.1.1.1", None);
    assert_eq!(v.outcome, Outcome::Admitted);
    assert_eq!(v.quotas[0].remaining, 0, "rule a kept its count of 2");
    assert_eq!(
        v.quotas[1].remaining, 0,
        "rule b kept its count and has the new limit 3"
    );
    // a reload that fails after a changed rule changes nothing, not even that rule's limit
    let half_bad = "[[rules]]\nname = \"a\"\nperiod = \"1m\"\nlimit = 100\n[[rules]]\nname = \"z\"\nperiod = \"1000years\"\nlimit = 4\n";
    let e = l.reload(HttpConfig::from_toml_str(half_bad).unwrap());
    let e = e.unwrap_err().to_string();
    assert!(e.starts_with("rules[1].period: window is too large"), "{e}");
    // (Rule a, at its limit of 3 still, refuses; at 100 it would not.)
    let v = get(&l, "/", "1.1.1.1", None);
    assert_eq!((v.quotas[0].limit, v.quotas[0].remaining), (3, 0));
    // a bad reload keeps the old configuration
    assert!(
        l.reload(HttpConfig::from_toml_str("[[rules]]\nperiod = \"x\"\nlimit = 1\n").unwrap())
            .is_err()
    );
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
        RejectReason::RateLimited
    );
    // a renamed rule starts afresh
    l.reload(
        HttpConfig::from_toml_str("[[rules]]\nname = \"c\"\nperiod = \"1m\"\nlimit = 3\n").unwrap(),
    )
    .unwrap();
    assert_eq!(get(&l, "/", "1.1.1.1", None).quotas[0].remaining, 2);
}

#[test]
fn rejected_request_is_not_charged_against_other_rules() {
    let (l, clock) = limiter(
        "[[rules]]\nname = \"long\"\nperiod = \"1h\"\nlimit = 10\n[[rules]]\nname = \"short\"\nperiod = \"1s\"\nlimit = 1\n",
    );
    assert_eq!(get(&l, "/", "1.1.1.1", None).quotas[0].remaining, 9);
    for _ in 0..5 {
        let v = get(&l, "/", "1.1.1.1", None);
        assert_eq!(reason(&v).unwrap().1, "short");
        let quotas: Vec<_> = v
            .quotas
            .iter()
            .map(|q| (q.policy.to_string(), q.remaining))
            .collect();
        assert_eq!(quotas, [("long".to_owned(), 9), ("short".to_owned(), 0)]);
    }
    clock.advance(Duration::from_secs(1));
    let v = get(&l, "/", "1.1.1.1", None);
    assert_eq!(v.outcome, Outcome::Admitted);
    assert_eq!(
        v.quotas[0].remaining, 8,
        "the five rejections were refunded on `long`"
    );
}

/// A request that two rules would reject is told to wait for the one that asks to wait longest,
/// not for the first rule charged: with a per-second and a per-minute rule both exhausted, the
/// rejection said "retry after 1 s" (the per-second rule's), and the client that waited as told
/// met the per-minute rule's 59 s, one more rejection (counted towards a ban) for nothing. The
/// Redis backend names the longest wait likewise. A rule that would admit changes nothing.
#[test]
fn a_rejection_waits_for_the_longest_of_the_rules_that_would_refuse() {
    let (l, clock) = limiter(
        "[[rules]]\nname = \"short\"\nperiod = \"1s\"\nlimit = 1\n\
         [[rules]]\nname = \"long\"\nperiod = \"1m\"\nlimit = 2\n\
         [[rules]]\nname = \"day\"\nperiod = \"1d\"\nlimit = 100\n",
    );
    let quotas = |v: &Verdict| -> Vec<(String, u64, Duration)> {
        v.quotas
            .iter()
            .map(|q| (q.policy.to_string(), q.remaining, q.reset_after))
            .collect()
    };
    clock.advance(Duration::from_millis(200));
    assert_eq!(get(&l, "/", "1.1.1.1", None).outcome, Outcome::Admitted);
    // Only the per-second rule refuses: it is named, with its own wait.
    let v = get(&l, "/", "1.1.1.1", None);
    assert_eq!(
        reason(&v).unwrap(),
        (
            RejectReason::RateLimited,
            "short".to_owned(),
            Some(Duration::from_millis(800))
        )
    );
    clock.advance(Duration::from_millis(800));
    assert_eq!(get(&l, "/", "1.1.1.1", None).outcome, Outcome::Admitted);
    // Both the per-second and the per-minute rule refuse: the per-minute one is named.
    let v = get(&l, "/", "1.1.1.1", None);
    let (why, rule, retry_after) = reason(&v).unwrap();
    assert_eq!((why, rule.as_str()), (RejectReason::RateLimited, "long"));
    assert_eq!(retry_after, Some(Duration::from_secs(59)));
    assert_eq!(
        quotas(&v),
        [
            ("short".to_owned(), 0, Duration::from_secs(1)),
            ("long".to_owned(), 0, Duration::from_secs(59)),
            ("day".to_owned(), 98, Duration::from_secs(86_399)),
        ]
    );
    // Waiting as told is enough.
    clock.advance(retry_after.unwrap());
    assert_eq!(get(&l, "/", "1.1.1.1", None).outcome, Outcome::Admitted);
}

#[test]
fn bans_start_after_k_rejections_and_end_after_d() {
    let (l, clock) = limiter(&format!(
        "{PER_IP}\n[bans]\nafter = 3\nwithin = \"1m\"\nduration = \"10m\"\nmax_entries = 100\n"
    ));
    get(&l, "/", "1.1.1.1", None);
    get(&l, "/", "1.1.1.1", None);
    for _ in 0..3 {
        assert_eq!(
            reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
            RejectReason::RateLimited
        );
    }
    clock.advance(Duration::from_secs(5));
    let (r, rule, retry) = reason(&get(&l, "/", "1.1.1.1", None)).unwrap();
    assert_eq!((r, rule.as_str()), (RejectReason::Banned, "ban"));
    assert_eq!(retry, Some(Duration::from_secs(595)));
    // others are not banned
    assert_eq!(get(&l, "/", "1.1.1.2", None).outcome, Outcome::Admitted);
    clock.advance(Duration::from_secs(594));
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
        RejectReason::Banned
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(get(&l, "/", "1.1.1.1", None).outcome, Outcome::Admitted);
}

/// A reload keeps the bans when `[bans]` did not change, whatever the periods' spelling: `1m`
/// and `60s` are the same window. Compared as text, a reload that only respelled a period
/// (or a configuration built in code, whose periods read as humantime writes them, reloaded
/// from a file) lifted every ban and forgot every count towards one.
#[test]
fn a_reload_keeps_the_bans_whatever_their_periods_spelling() {
    let bans = |within: &str, duration: &str| {
        format!("{PER_IP}[bans]\nafter = 1\nwithin = \"{within}\"\nduration = \"{duration}\"\n")
    };
    let (l, clock) = limiter(&bans("1m", "1h"));
    get(&l, "/", "1.1.1.1", None);
    get(&l, "/", "1.1.1.1", None);
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
        RejectReason::RateLimited
    );
    clock.advance(Duration::from_secs(10));
    l.reload(HttpConfig::from_toml_str(&bans("60s", "60m")).unwrap())
        .unwrap();
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", None)),
        Some((
            RejectReason::Banned,
            "ban".to_owned(),
            Some(Duration::from_secs(3590))
        )),
        "the ban survives a reload that changed no ban setting"
    );
    // A real change starts a new list, which the ban in force is carried over to as it is.
    l.reload(HttpConfig::from_toml_str(&bans("60s", "30m")).unwrap())
        .unwrap();
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.1", None)).unwrap().2,
        Some(Duration::from_secs(3590))
    );
}

/// A reload that changes `[bans]` builds a new list but carries the bans in force over, each
/// for what is left of it: neither lifted (before, tuning `after` unbanned every client at
/// once) nor cut or lengthened to the new duration. Counts towards a ban start over.
#[test]
fn a_reload_that_changes_the_ban_settings_carries_the_bans_in_force() {
    let bans = |after: u32, duration: &str| {
        format!(
            "missing_key = \"allow\"\n{ONE_A_DAY}\
             [[rules]]\nname = \"per-client\"\nperiod = \"1d\"\nlimit = 1\nkey = \"client\"\n\
             [bans]\nafter = {after}\nwithin = \"1h\"\nduration = \"{duration}\"\n"
        )
    };
    let (l, clock) = limiter(&bans(2, "1h"));
    let rejected = |ip: &str, client: Option<&str>| reason(&get(&l, "/", ip, client)).unwrap().0;
    get(&l, "/", "1.1.1.1", None);
    get(&l, "/", "", Some("partner-7")); // known by its id alone
    get(&l, "/", "1.1.1.2", None);
    for _ in 0..2 {
        assert_eq!(rejected("1.1.1.1", None), RejectReason::RateLimited);
        assert_eq!(rejected("", Some("partner-7")), RejectReason::RateLimited);
    }
    assert_eq!(rejected("1.1.1.2", None), RejectReason::RateLimited); // one of two
    assert_eq!(rejected("1.1.1.1", None), RejectReason::Banned);
    assert_eq!(rejected("", Some("partner-7")), RejectReason::Banned);
    clock.advance(Duration::from_secs(10));
    l.reload(HttpConfig::from_toml_str(&bans(3, "10m")).unwrap())
        .unwrap();
    for (ip, client) in [("1.1.1.1", None), ("", Some("partner-7"))] {
        assert_eq!(
            reason(&get(&l, "/", ip, client)),
            Some((
                RejectReason::Banned,
                "ban".to_owned(),
                Some(Duration::from_secs(3590))
            )),
            "{ip}{client:?}: carried over with what was left of it"
        );
    }
    // 1.1.1.2's rejection before the reload no longer counts: three more are needed.
    for _ in 0..3 {
        assert_eq!(rejected("1.1.1.2", None), RejectReason::RateLimited);
    }
    assert_eq!(
        reason(&get(&l, "/", "1.1.1.2", None)).unwrap().2,
        Some(Duration::from_secs(600)),
        "banned under the new duration"
    );
    // The carried bans end when they would have: the rules answer again.
    clock.advance(Duration::from_secs(3590));
    assert_eq!(rejected("1.1.1.1", None), RejectReason::RateLimited);
    assert_eq!(rejected("", Some("partner-7")), RejectReason::RateLimited);
}

/// One request a day per client: every later one is a rejection.
const ONE_A_DAY: &str = "[[rules]]\nname = \"per-ip\"\nperiod = \"1d\"\nlimit = 1\n";

fn grouped(ipv4_prefix: u8, ipv6_prefix: u8) -> String {
    format!(
        "[client_ip]\nipv4_prefix = {ipv4_prefix}\nipv6_prefix = {ipv6_prefix}\n{ONE_A_DAY}\
         [bans]\nafter = 1\nwithin = \"1h\"\nduration = \"1h\"\n"
    )
}

/// A reload that groups addresses more coarsely (`ipv6_prefix` 128, then 64) moves a banned
/// address's ban to its new group: the group is the client now. Before, the ban stayed keyed
/// by the address, which no request named any more (the layer hands the engine the /64), so
/// the reload unbanned it.
#[test]
fn a_reload_to_a_coarser_grouping_bans_the_banned_addresses_groups() {
    let (l, clock) = limiter(&grouped(32, 128));
    for ip in ["2001:db8:0:7::5", "192.0.2.9"] {
        get(&l, "/", ip, None);
        get(&l, "/", ip, None);
        assert_eq!(
            reason(&get(&l, "/", ip, None)).unwrap().0,
            RejectReason::Banned
        );
    }
    clock.advance(Duration::from_secs(10));
    l.reload(HttpConfig::from_toml_str(&grouped(24, 64)).unwrap())
        .unwrap();
    for group in ["2001:db8:0:7::", "192.0.2.0"] {
        assert_eq!(
            reason(&get(&l, "/", group, None)).unwrap().2,
            Some(Duration::from_secs(3590)),
            "{group}"
        );
    }
    for other in ["2001:db8:0:8::", "192.0.3.0"] {
        assert_eq!(get(&l, "/", other, None).outcome, Outcome::Admitted);
    }
    assert!(l.unban("2001:db8:0:7::99".parse().unwrap()), "its /64");
    assert_eq!(
        get(&l, "/", "2001:db8:0:7::", None).outcome,
        Outcome::Admitted
    );
}

/// A reload that groups addresses more finely (`ipv6_prefix` 64, then 128; `ipv4_prefix` 24,
/// then 32) cannot name a banned group's members, so the group's ban is kept as such: every
/// address in it stays banned until the ban ends, through further reloads, and `unban` of any
/// of them lifts it. Before, the ban stayed keyed by the group's network address, which no
/// request named any more.
#[test]
fn a_reload_to_a_finer_grouping_keeps_the_banned_groups_banned() {
    let (l, clock) = limiter(&grouped(24, 64));
    for group in ["2001:db8:0:7::", "192.0.2.0"] {
        get(&l, "/", group, None);
        get(&l, "/", group, None);
        assert_eq!(
            reason(&get(&l, "/", group, None)).unwrap().0,
            RejectReason::Banned
        );
    }
    clock.advance(Duration::from_secs(10));
    l.reload(HttpConfig::from_toml_str(&grouped(32, 128)).unwrap())
        .unwrap();
    let banned_for = |ip: &str| reason(&get(&l, "/", ip, None)).and_then(|r| r.2);
    for member in [
        "2001:db8:0:7::1",
        "2001:db8:0:7:ffff::2",
        "192.0.2.1",
        "192.0.2.200",
    ] {
        assert_eq!(
            banned_for(member),
            Some(Duration::from_secs(3590)),
            "{member}"
        );
    }
    for other in ["2001:db8:0:8::1", "192.0.3.1"] {
        assert_eq!(get(&l, "/", other, None).outcome, Outcome::Admitted);
    }
    clock.advance(Duration::from_secs(1800));
    l.reload(HttpConfig::from_toml_str(&grouped(32, 96)).unwrap())
        .unwrap();
    assert_eq!(
        banned_for("2001:db8:0:7::1"),
        Some(Duration::from_secs(1790))
    );
    assert_eq!(banned_for("192.0.2.1"), Some(Duration::from_secs(1790)));
    // Unbanning a member lifts its group's ban.
    assert!(l.unban("2001:db8:0:7::3".parse().unwrap()));
    assert_eq!(
        get(&l, "/", "2001:db8:0:7::4", None).outcome,
        Outcome::Admitted
    );
    clock.advance(Duration::from_secs(1790));
    assert_eq!(get(&l, "/", "192.0.2.1", None).outcome, Outcome::Admitted);
}

/// Reloads that regroup one way and back (finer, coarser, then finer again for the other
/// family) keep every ban for exactly what is left of it: a group's ban inherited by a finer
/// list comes back as the group's own under the old grouping again, and an address's ban moved
/// to a coarser group stays that group's when a later reload refines the grouping once more.
#[test]
fn reloads_that_regroup_back_and_forth_keep_every_ban() {
    let (l, clock) = limiter(&grouped(32, 64));
    for client in ["2001:db8:0:7::", "192.0.2.9"] {
        get(&l, "/", client, None);
        get(&l, "/", client, None);
    }
    let banned_for = |ip: &str| match reason(&get(&l, "/", ip, None)) {
        Some((RejectReason::Banned, _, left)) => left,
        _ => None,
    };
    let mut left = 3600;
    let mut step = |v4: u8, v6: u8| {
        clock.advance(Duration::from_secs(60));
        left -= 60;
        l.reload(HttpConfig::from_toml_str(&grouped(v4, v6)).unwrap())
            .unwrap();
        Some(Duration::from_secs(left))
    };
    // Finer for IPv6: the /64 is inherited, every member banned.
    let expected = step(32, 128);
    assert_eq!(banned_for("2001:db8:0:7::1"), expected);
    assert_eq!(banned_for("2001:db8:0:7:1::"), expected);
    assert_eq!(banned_for("192.0.2.9"), expected);
    // Back to /64: the group's own ban again.
    let expected = step(32, 64);
    assert_eq!(banned_for("2001:db8:0:7::"), expected);
    assert_eq!(banned_for("192.0.2.9"), expected);
    // Coarser for IPv4: the address's ban is its /24's.
    let expected = step(24, 128);
    assert_eq!(banned_for("192.0.2.0"), expected);
    assert_eq!(banned_for("2001:db8:0:7::2"), expected);
    // Finer for IPv4 again: the /24 is inherited, so a neighbour of the banned address stays
    // banned; the /64 is the list's own once more.
    let expected = step(32, 64);
    assert_eq!(banned_for("192.0.2.200"), expected);
    assert_eq!(banned_for("2001:db8:0:7::"), expected);
    for other in ["192.0.3.1", "2001:db8:0:8::"] {
        assert_eq!(
            get(&l, "/", other, None).outcome,
            Outcome::Admitted,
            "{other}"
        );
    }
    // And every one of them ends on time.
    clock.advance(Duration::from_secs(left));
    for ip in ["192.0.2.9", "192.0.2.200", "2001:db8:0:7::"] {
        assert_eq!(banned_for(ip), None, "{ip}");
    }
}

/// A reload refused after its ban list was built (a later rule is invalid) leaves the list in
/// force untouched: the bans with what was left of them, and the rejections counted towards a
/// ban, so that the next rejection still starts one.
#[test]
fn a_refused_reload_leaves_the_bans_and_their_counts_as_they_were() {
    let bans = |after: u32, v6: u8| {
        format!(
            "[client_ip]\nipv6_prefix = {v6}\n{ONE_A_DAY}\
             [bans]\nafter = {after}\nwithin = \"1h\"\nduration = \"1h\"\n"
        )
    };
    let (l, clock) = limiter(&bans(2, 64));
    // 10.0.0.1 banned (two rejections); 10.0.0.2 one rejection short of a ban.
    for _ in 0..3 {
        get(&l, "/", "10.0.0.1", None);
    }
    get(&l, "/", "10.0.0.2", None);
    get(&l, "/", "10.0.0.2", None);
    clock.advance(Duration::from_secs(10));
    for refused in [bans(3, 64), bans(2, 128), bans(5, 48)] {
        let bad = format!("{refused}[[rules]]\nperiod = \"1s\"\nlimit = 1\nendpoint = \"nope\"\n");
        assert!(l.reload(HttpConfig::from_toml_str(&bad).unwrap()).is_err());
    }
    assert_eq!(
        reason(&get(&l, "/", "10.0.0.1", None)),
        Some((
            RejectReason::Banned,
            "ban".to_owned(),
            Some(Duration::from_secs(3590))
        ))
    );
    assert_eq!(
        reason(&get(&l, "/", "10.0.0.2", None)).unwrap().0,
        RejectReason::RateLimited,
        "the second rejection, which starts the ban"
    );
    assert_eq!(
        reason(&get(&l, "/", "10.0.0.2", None)).unwrap().0,
        RejectReason::Banned
    );
}

/// A reload to a ban list smaller than the bans in force carries what fits, the bans that end
/// last, and says how many were lost, at warn, naming the setting to raise. Which ones were
/// kept was the order of the old list's table before, whichever ended first.
#[test]
fn a_reload_to_a_smaller_ban_list_carries_what_fits_and_warns() {
    let bans = |max: u32| {
        format!(
            "{ONE_A_DAY}[bans]\nafter = 1\nwithin = \"1h\"\nduration = \"1h\"\nmax_entries = {max}\n"
        )
    };
    // Banned at 0, 1, ... minutes, in an order the table's hashing has no reason to follow:
    // the last two banned end last.
    let ips = [
        "10.0.0.7", "10.0.0.2", "10.0.0.5", "10.0.0.1", "10.0.0.6", "10.0.0.3",
    ];
    let (l, clock) = limiter(&bans(10));
    for ip in ips {
        get(&l, "/", ip, None);
        get(&l, "/", ip, None);
        clock.advance(Duration::from_secs(60));
    }
    let logged = warnings_of(|| {
        l.reload(HttpConfig::from_toml_str(&bans(2)).unwrap())
            .unwrap();
    });
    let still: Vec<_> = ips
        .iter()
        .filter(|ip| reason(&get(&l, "/", ip, None)).unwrap().0 == RejectReason::Banned)
        .collect();
    assert_eq!(still, [&"10.0.0.6", &"10.0.0.3"], "the two that end last");
    assert_eq!(logged.matches("carry every ban").count(), 1, "{logged}");
    assert!(logged.contains("lost=4"), "{logged}");
    assert!(logged.contains("bans.max_entries"), "{logged}");
}

/// A ban longer than the clock can read (`Duration::MAX` built in code, `1000000y` in a file)
/// bans for good: the limiters' readings stop at 2^62 ns (about 146 years after the clock's
/// epoch) while such a ban ends later, so no reading reaches its end; its retry-after never
/// falls below 2^62 − 1 ns (Retry-After: 4611686019). A duration humantime cannot represent is
/// refused, naming the field.
#[test]
fn a_ban_longer_than_the_clock_can_read_is_for_good() {
    let forever = Duration::from_nanos((1 << 62) - 1);
    let texts = [
        "1000000y".to_owned(),
        turnstile::http::BanConfig::new(1, Duration::from_secs(60), Duration::MAX).duration,
    ];
    for duration in texts {
        let (l, clock) = limiter(&format!(
            "{PER_IP}[bans]\nafter = 1\nwithin = \"1m\"\nduration = \"{duration}\"\n"
        ));
        get(&l, "/", "1.1.1.1", None);
        get(&l, "/", "1.1.1.1", None);
        assert_eq!(
            reason(&get(&l, "/", "1.1.1.1", None)).unwrap().0,
            RejectReason::RateLimited
        );
        for years in [1, 146, 147, 300, 600] {
            clock.advance(Duration::from_secs(years * 365 * 24 * 3600));
            let (why, _, retry_after) = reason(&get(&l, "/", "1.1.1.1", None)).unwrap();
            assert_eq!(
                why,
                RejectReason::Banned,
                "{duration}: lifted after {years} more years"
            );
            assert!(
                retry_after.unwrap() >= forever,
                "{duration}: {retry_after:?}"
            );
        }
    }
    let refused = HttpLimiter::with_clock(
        HttpConfig::from_toml_str(&format!(
            "{PER_IP}[bans]\nafter = 1\nwithin = \"1m\"\nduration = \"600000000000y\"\n"
        ))
        .unwrap(),
        ManualClock::new(),
    );
    match refused {
        Err(turnstile::http::HttpConfigError::Invalid { field, .. }) => {
            assert_eq!(field, "bans.duration")
        }
        other => panic!("{other:?}"),
    }
}

/// One per-IP rule, 2 per minute, for the key-cap tests.
const PER_IP_MINUTE: &str = "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 2\n";

/// With `key_overflow = "reject"` (the default), a rule holding `max_keys_per_rule` active
/// clients refuses new ones (no Retry-After: when room frees is not known) while those it
/// holds go on as before; once their window has passed, they are idle and make room.
#[test]
fn a_full_rule_rejects_new_clients_until_keys_turn_idle() {
    let (l, clock) = limiter(&format!("max_keys_per_rule = 2\n{PER_IP_MINUTE}"));
    assert_eq!(get(&l, "/", "10.0.0.1", None).outcome, Outcome::Admitted);
    assert_eq!(get(&l, "/", "10.0.0.2", None).outcome, Outcome::Admitted);
    for _ in 0..3 {
        assert_eq!(
            reason(&get(&l, "/", "10.0.0.3", None)),
            Some((RejectReason::TooManyKeys, "per-ip".to_owned(), None))
        );
    }
    let held = get(&l, "/", "10.0.0.1", None);
    assert_eq!(held.outcome, Outcome::Admitted);
    assert_eq!(held.quotas[0].remaining, 0);
    assert_eq!(
        reason(&get(&l, "/", "10.0.0.1", None)).map(|r| r.0),
        Some(RejectReason::RateLimited)
    );
    clock.advance(Duration::from_secs(60));
    let fresh = get(&l, "/", "10.0.0.3", None);
    assert_eq!(fresh.outcome, Outcome::Admitted, "idle keys were evicted");
    assert_eq!(fresh.quotas[0].remaining, 1);
}

/// `key_overflow = "shared"`: the clients a full rule has no room for share one counter with
/// the rule's limit.
#[test]
fn a_full_rule_counts_new_clients_together_when_shared() {
    let (l, _) = limiter(&format!(
        "max_keys_per_rule = 2\nkey_overflow = \"shared\"\n{PER_IP_MINUTE}"
    ));
    for ip in ["10.0.0.1", "10.0.0.2"] {
        assert_eq!(
            get(&l, "/", ip, None).quotas[0].remaining,
            1,
            "{ip}'s own key"
        );
    }
    assert_eq!(get(&l, "/", "10.0.0.3", None).quotas[0].remaining, 1);
    assert_eq!(get(&l, "/", "10.0.0.4", None).quotas[0].remaining, 0);
    let (why, rule, retry) = reason(&get(&l, "/", "10.0.0.5", None)).expect("rejected");
    assert_eq!((why, rule.as_str()), (RejectReason::RateLimited, "per-ip"));
    assert!(retry.is_some_and(|r| r <= Duration::from_secs(60)));
    // the clients with keys of their own are not affected
    assert_eq!(get(&l, "/", "10.0.0.2", None).quotas[0].remaining, 0);
}

/// `key_overflow = "allow"`: a full rule lets new clients pass uncounted and reports no quota
/// for them, in the one-rule path and beside another rule that does count them.
#[test]
fn a_full_rule_lets_new_clients_pass_uncounted_when_allowed() {
    let (l, _) = limiter(&format!(
        "max_keys_per_rule = 2\nkey_overflow = \"allow\"\n{PER_IP_MINUTE}"
    ));
    get(&l, "/", "10.0.0.1", None);
    get(&l, "/", "10.0.0.2", None);
    for _ in 0..5 {
        let v = get(&l, "/", "10.0.0.3", None);
        assert_eq!(v.outcome, Outcome::Admitted);
        assert!(v.quotas.is_empty(), "{v:?}");
    }
    let both = format!(
        "max_keys_per_rule = 2\nkey_overflow = \"allow\"\nclient_id_header = \"x-client\"\n{PER_IP_MINUTE}[[rules]]\nname = \"per-client\"\nperiod = \"1h\"\nlimit = 100\nkey = \"client\"\n"
    );
    let (l, _) = limiter(&both);
    get(&l, "/", "10.0.0.1", Some("c"));
    get(&l, "/", "10.0.0.2", Some("c"));
    let v = get(&l, "/", "10.0.0.3", Some("c"));
    assert_eq!(v.outcome, Outcome::Admitted);
    assert_eq!(v.quotas.len(), 1, "{v:?}");
    assert_eq!(&*v.quotas[0].policy, "per-client");
    assert_eq!(v.quotas[0].remaining, 97);
    // Rejected by the rule that counts it, the request reports that rule's quota only.
    let tight = both.replace("limit = 100", "limit = 3");
    let (l, _) = limiter(&tight);
    get(&l, "/", "10.0.0.1", Some("c"));
    get(&l, "/", "10.0.0.2", Some("c"));
    get(&l, "/", "10.0.0.3", Some("c"));
    let v = get(&l, "/", "10.0.0.3", Some("c"));
    assert_eq!(
        reason(&v).map(|r| (r.0, r.1)),
        Some((RejectReason::RateLimited, "per-client".to_owned()))
    );
    assert_eq!(v.quotas.len(), 1, "{v:?}");
    assert_eq!(&*v.quotas[0].policy, "per-client");
}

/// A client refused because a rule is full did nothing to deserve a ban; a reload that changes
/// the cap starts the counts afresh, one that keeps it keeps them.
#[test]
fn a_full_rule_bans_no_one_and_a_new_cap_starts_afresh() {
    let config = format!(
        "max_keys_per_rule = 1\n{PER_IP_MINUTE}[bans]\nafter = 1\nwithin = \"1m\"\nduration = \"1h\"\n"
    );
    let (l, clock) = limiter(&config);
    get(&l, "/", "10.0.0.1", None);
    for _ in 0..3 {
        assert_eq!(
            reason(&get(&l, "/", "10.0.0.2", None)).map(|r| r.0),
            Some(RejectReason::TooManyKeys)
        );
    }
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        get(&l, "/", "10.0.0.2", None).outcome,
        Outcome::Admitted,
        "not banned"
    );

    // (A rate-limit rejection would ban at once here: the reloads use no bans.)
    let config = format!("max_keys_per_rule = 1\n{PER_IP_MINUTE}");
    let (l, _) = limiter(&config);
    get(&l, "/", "10.0.0.2", None);
    get(&l, "/", "10.0.0.2", None);
    l.reload(HttpConfig::from_toml_str(&config).unwrap())
        .unwrap();
    assert_eq!(
        reason(&get(&l, "/", "10.0.0.2", None)).map(|r| r.0),
        Some(RejectReason::RateLimited),
        "the same cap keeps the counts"
    );
    l.reload(
        HttpConfig::from_toml_str(
            &config.replace("max_keys_per_rule = 1\n", "max_keys_per_rule = 5\n"),
        )
        .unwrap(),
    )
    .unwrap();
    let v = get(&l, "/", "10.0.0.2", None);
    assert_eq!(v.outcome, Outcome::Admitted, "a new cap starts afresh");
    assert_eq!(v.quotas[0].remaining, 1);
    let v = get(&l, "/", "10.0.0.3", None);
    assert_eq!(v.outcome, Outcome::Admitted, "with room for more clients");
}

fn err(toml: &str) -> String {
    match HttpConfig::from_toml_str(toml) {
        Err(e) => e.to_string(),
        Ok(c) => HttpLimiter::with_clock(c, ManualClock::new())
            .unwrap_err()
            .to_string(),
    }
}

#[test]
fn validation_errors_name_the_field() {
    let ok = "[[rules]]\nperiod = \"1s\"\nlimit = 1\n";
    let cases = [
        (format!("{ok}{ok}{ok}[[rules]]\nperiod = \"5x\"\nlimit = 1\n"), "rules[3].period: \"5x\" is not a duration"),
        ("[[rules]]\nname = \"a\"\nperiod = \"1s\"\nlimit = 1\n[[rules]]\nname = \"a\"\nperiod = \"1m\"\nlimit = 1\n".to_owned(), "rules[1].name: duplicate rule name"),
        ("[[rules]]\nperiod = \"0s\"\nlimit = 1\n".to_owned(), "rules[0].period: must be greater than zero"),
        ("[[rules]]\nperiod = \"1s\"\nlimit = 5000000000\n".to_owned(), "rules[0].limit: 5000000000 is too large"),
        ("[[rules]]\nperiod = \"1s\"\nlimit = 1\nendpoint = \"/x\"\n".to_owned(), "rules[0].endpoint:"),
        ("[[rules]]\nperiod = \"1s\"\nlimit = 1\nendpoint = \"re:get:/a(\"\n".to_owned(), "rules[0].endpoint: \"/a(\" is not a valid regex"),
        ("client_id_header = \"bad header\"\n".to_owned(), "client_id_header: \"bad header\" is not a valid header name"),
        ("[[ip_rules]]\nip = \"1.2.3\"\n".to_owned(), "ip_rules[0].ip: \"1.2.3\" is not an IP address"),
        ("[client_ip]\ntrusted_proxies = [\"10.0.0.1\"]\nheaders = []\n".to_owned(), "client_ip.headers: empty, so the address a trusted proxy forwards is never read"),
        ("[whitelist]\nips = [\"ok\"]\n".to_owned(), "whitelist.ips[0]:"),
        ("[bans]\nafter = 0\n".to_owned(), "bans.after:"),
        ("[backend]\nkind = \"etcd\"\n".to_owned(), "backend.kind: \"etcd\" is not a backend"),
        (format!("max_keys_per_rule = 0\n{ok}"), "max_keys_per_rule: must be at least 1"),
        ("[[client_rules]]\nclient_id = \"c\"\n[[client_rules.rules]]\nperiod = \"1s\"\nlimit = 1\nalgorithm = \"sliding_window\"\n[[client_rules.rules]]\nperiod = \"2s\"\nlimit = 20000000\nalgorithm = \"sliding_window\"\n".to_owned(), "client_rules[0].rules[1].limit:"),
    ];
    for (doc, expected) in cases {
        let got = err(&doc);
        assert!(
            got.starts_with(expected),
            "expected {expected:?}, got {got:?}"
        );
    }
    // parse errors name the key
    assert!(err("[[rules]]\nperiod = \"1s\"\nlimit = \"many\"\n").contains("limit"));
    assert!(err("unknown_field = 1\n").contains("unknown_field"));
    let overflow = err("key_overflow = \"drop\"\n");
    assert!(
        overflow.contains("key_overflow")
            && overflow.contains("expected one of `reject`, `shared`, `allow`"),
        "{overflow}"
    );
    let yaml = HttpConfig::from_yaml_str("rules:\n  - period: 1s\n    limt: 3\n")
        .unwrap_err()
        .to_string();
    assert!(yaml.contains("limt"), "{yaml}");
}

#[test]
fn regex_and_per_endpoint_rules() {
    let (l, _) = limiter(
        "[[rules]]\nendpoint = \"re:*:/api/v[0-9]+/items\"\nperiod = \"1m\"\nlimit = 1\nper_endpoint = true\n",
    );
    assert_eq!(
        get(&l, "/api/v1/items", "1.1.1.1", None).outcome,
        Outcome::Admitted
    );
    assert_eq!(
        get(&l, "/api/v2/items", "1.1.1.1", None).outcome,
        Outcome::Admitted,
        "counted per endpoint"
    );
    assert!(reason(&get(&l, "/API/V1/items", "1.1.1.1", None)).is_some());
    assert!(get(&l, "/api/vx/items", "1.1.1.1", None).quotas.is_empty());
}

/// A regex's `verb:` is optional, as `RuleConfig::endpoint_regex` says: without one the regex
/// is over the path, for any method, `:` inside it included. They were refused (`"/api/v\d+"
/// is not an endpoint pattern`, `"/api/(?" is not an HTTP method`).
#[test]
fn a_regex_without_a_verb_is_over_the_path_for_any_method() {
    for endpoint in [
        "\"re:/api/v[0-9]+/.*\"",
        "\"/api/(?:v1|v2)/.*\"\nregex = true",
    ] {
        let (l, _) = limiter(&format!(
            "[[rules]]\nendpoint = {endpoint}\nperiod = \"1m\"\nlimit = 0\n"
        ));
        for method in [http::Method::GET, http::Method::POST] {
            let blocked = l.decide(&req(&method, "/API/V1/items", "1.1.1.1", None));
            assert_eq!(
                reason(&blocked).map(|r| r.0),
                Some(RejectReason::Blocked),
                "{endpoint} {method}"
            );
        }
        assert_eq!(
            get(&l, "/api/v3x", "1.1.1.1", None).outcome,
            Outcome::Admitted
        );
    }
    // A verb is still checked where one is written; a glob still needs one.
    for (doc, expected) in [
        ("endpoint = \"re:g3t:/x\"", "\"g3t\" is not an HTTP method"),
        ("endpoint = \"/x\"", "is not an endpoint pattern"),
    ] {
        let error =
            HttpConfig::from_toml_str(&format!("[[rules]]\n{doc}\nperiod = \"1m\"\nlimit = 1\n"))
                .and_then(HttpLimiter::new)
                .unwrap_err()
                .to_string();
        assert!(error.contains(expected), "{error}");
    }
}

/// The sample configuration of AspNetCoreRateLimit's documentation (IP rate limiting), with
/// its policies section.
const ASPNET: &str = r#"{
  "IpRateLimiting": {
    "EnableEndpointRateLimiting": false,
    "StackBlockedRequests": false,
    "RealIpHeader": "X-Real-IP",
    "ClientIdHeader": "X-ClientId",
    "HttpStatusCode": 429,
    "IpWhitelist": [ "127.0.0.1", "::1/10", "192.168.0.0/24" ],
    "EndpointWhitelist": [ "get:/api/license", "*:/api/status" ],
    "ClientWhitelist": [ "dev-id-1", "dev-id-2" ],
    "GeneralRules": [
      { "Endpoint": "*", "Period": "1s", "Limit": 2 },
      { "Endpoint": "*", "Period": "15m", "Limit": 100 },
      { "Endpoint": "*", "Period": "12h", "Limit": 1000 },
      { "Endpoint": "*", "Period": "7d", "Limit": 10000 }
    ]
  },
  "IpRateLimitPolicies": {
    "IpRules": [
      { "Ip": "84.247.85.224", "Rules": [
          { "Endpoint": "*", "Period": "1s", "Limit": 10 },
          { "Endpoint": "*", "Period": "15m", "Limit": 200 } ] },
      { "Ip": "192.168.3.22/25", "Rules": [
          { "Endpoint": "*", "Period": "1s", "Limit": 5 },
          { "Endpoint": "*", "Period": "15m", "Limit": 150 },
          { "Endpoint": "*", "Period": "12h", "Limit": 500 } ] }
    ]
  }
}"#;

#[test]
fn aspnet_sample_loads_and_behaves() {
    let config = HttpConfig::from_json_str(ASPNET).unwrap();
    assert_eq!(config, HttpConfig::from_aspnet_json(ASPNET).unwrap());
    assert_eq!(config.client_id_header.as_deref(), Some("X-ClientId"));
    let clock = ManualClock::new();
    let l = HttpLimiter::with_clock(config, clock.clone()).unwrap();
    // general rules: 2 per second per IP, four quotas reported
    let v = get(&l, "/api/values", "1.2.3.4", None);
    assert_eq!(v.quotas.len(), 4);
    get(&l, "/api/values", "1.2.3.4", None);
    assert_eq!(
        reason(&get(&l, "/api/other", "1.2.3.4", None)).unwrap().1,
        "*-1s"
    );
    // the IP rule for 84.247.85.224 overrides 1s and 15m: 10 per second
    for _ in 0..10 {
        let v = get(&l, "/", "84.247.85.224", None);
        assert_eq!(v.outcome, Outcome::Admitted);
        let limits: Vec<_> = v.quotas.iter().map(|q| q.limit).collect();
        assert_eq!(limits, [10, 200, 1000, 10000]);
    }
    assert!(reason(&get(&l, "/", "84.247.85.224", None)).is_some());
    // 192.168.3.22/25 contains 192.168.3.1
    let limits: Vec<_> = get(&l, "/", "192.168.3.1", None)
        .quotas
        .iter()
        .map(|q| q.limit)
        .collect();
    assert_eq!(limits, [5, 150, 500, 10000]);
    // whitelists
    assert_eq!(
        get(&l, "/", "127.0.0.1", None).outcome,
        Outcome::Whitelisted
    );
    assert_eq!(
        get(&l, "/", "192.168.0.77", None).outcome,
        Outcome::Whitelisted
    );
    assert_eq!(
        get(&l, "/", "1.2.3.4", Some("dev-id-1")).outcome,
        Outcome::Whitelisted
    );
    assert_eq!(
        get(&l, "/api/license", "1.2.3.4", None).outcome,
        Outcome::Whitelisted
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(get(&l, "/", "1.2.3.4", None).outcome, Outcome::Admitted);
}

#[test]
fn aspnet_endpoint_rate_limiting_counts_each_endpoint() {
    let doc = r#"{"IpRateLimiting": {"EnableEndpointRateLimiting": true, "GeneralRules": [
        {"Endpoint": "*:/api/values", "Period": "1m", "Limit": 1},
        {"Endpoint": "*", "Period": "1h", "Limit": 100}]}}"#;
    let l = HttpLimiter::with_clock(HttpConfig::from_json_str(doc).unwrap(), ManualClock::new())
        .unwrap();
    assert_eq!(get(&l, "/api/values", "1.1.1.1", None).quotas.len(), 2);
    let put = l.decide(&req(&http::Method::PUT, "/api/values", "1.1.1.1", None));
    assert_eq!(
        put.outcome,
        Outcome::Admitted,
        "PUT is counted apart from GET"
    );
    let v = get(&l, "/api/values", "1.1.1.1", None);
    assert_eq!(reason(&v).unwrap().1, "*:/api/values-1m");
    // the whole path, as AspNetCoreRateLimit 4 and 5 match it: not a prefix
    assert_eq!(get(&l, "/api/values/7", "1.1.1.1", None).quotas.len(), 1);
    // other paths: only the `*` rule
    assert_eq!(get(&l, "/other", "1.1.1.1", None).quotas.len(), 1);
}

/// `RateLimitCounterPrefix` is the key prefix in Redis when the backend is switched to Redis;
/// the memory backend stays the default.
#[test]
fn aspnet_counter_prefix_becomes_the_redis_key_prefix() {
    let doc = r#"{"IpRateLimiting": {"RateLimitCounterPrefix": "crlc", "GeneralRules": [
        {"Endpoint": "*", "Period": "1s", "Limit": 2}]}}"#;
    let config = HttpConfig::from_aspnet_json(doc).unwrap();
    assert_eq!(config.backend.prefix.as_deref(), Some("crlc"));
    assert_eq!(config.backend.kind, "memory");
    HttpLimiter::new(config).expect("still a memory configuration");
}

#[test]
fn aspnet_errors_name_the_field() {
    let e = HttpConfig::from_json_str(
        r#"{"IpRateLimiting": {"GeneralRules": [{"Period": "1s", "Limit": 1.5}]}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("IpRateLimiting.GeneralRules[0].Limit"), "{e}");
    // Checked as the document is read, so that the error names the document's field rather
    // than the translated configuration's (`rules[0].period`).
    let e = HttpConfig::from_json_str(
        r#"{"IpRateLimiting": {"GeneralRules": [{"Period": "2q", "Limit": 1}]}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("IpRateLimiting.GeneralRules[0].Period"),
        "{e}"
    );
}

#[test]
fn file_loading_by_extension() {
    let dir = std::env::temp_dir().join(format!("turnstile-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("limits.toml");
    std::fs::write(&toml, PER_IP).unwrap();
    let json = dir.join("aspnet.json");
    std::fs::write(&json, ASPNET).unwrap();
    let yaml = dir.join("limits.yml");
    std::fs::write(&yaml, "rules:\n  - period: 1s\n    limit: 2\n").unwrap();
    assert_eq!(HttpConfig::from_file(&toml).unwrap().rules[0].limit, 2);
    assert_eq!(HttpConfig::from_file(&json).unwrap().rules.len(), 4);
    assert_eq!(HttpConfig::from_file(&yaml).unwrap().rules[0].limit, 2);
    let (l, _) = limiter("");
    l.reload_from_file(&toml).unwrap();
    get(&l, "/", "1.1.1.1", None);
    get(&l, "/", "1.1.1.1", None);
    assert!(reason(&get(&l, "/", "1.1.1.1", None)).is_some());
    assert!(HttpConfig::from_file(dir.join("x.ini")).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

const VALID: &str = r#"
client_id_header = "X-ClientId"
missing_key = "allow"
max_keys_per_rule = 2
key_overflow = "allow"
[[rules]]
name = "per-ip"
endpoint = "*:/api/*"
period = "1s"
limit = 2
algorithm = "token_bucket"
[[ip_rules]]
ip = "10.0.0.0/8"
[[ip_rules.rules]]
period = "1m"
limit = 5
[whitelist]
endpoints = ["get:/health"]
[bans]
after = 2
within = "1m"
duration = "1m"
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_documents_never_panic(text in "\\PC{0,200}") {
        for c in [HttpConfig::from_toml_str(&text), HttpConfig::from_json_str(&text), HttpConfig::from_yaml_str(&text)].into_iter().flatten() {
            let _ = HttpLimiter::with_clock(c, ManualClock::new());
        }
        let _ = HttpConfig::from_aspnet_json(&text);
    }

    #[test]
    fn mutated_valid_documents_never_panic(pos in 0usize..450, insert in "[\\PC]{0,8}", cut in 0usize..8) {
        let mut doc = VALID.to_owned();
        let mut at = pos.min(doc.len());
        while !doc.is_char_boundary(at) { at -= 1; }
        let mut end = (at + cut).min(doc.len());
        while !doc.is_char_boundary(end) { end -= 1; }
        doc.replace_range(at..end, &insert);
        if let Ok(c) = HttpConfig::from_toml_str(&doc)
            && let Ok(l) = HttpLimiter::with_clock(c, ManualClock::new()) {
                for ip in ["10.1.1.1", "1.1.1.1", "x"] {
                    let _ = get(&l, "/api/x", ip, Some("c"));
                }
            }
    }

    #[test]
    fn mutated_aspnet_documents_never_panic(pos in 0usize..1500, insert in "[\\PC]{0,8}", cut in 0usize..8) {
        let mut doc = ASPNET.to_owned();
        let mut at = pos.min(doc.len());
        while !doc.is_char_boundary(at) { at -= 1; }
        let mut end = (at + cut).min(doc.len());
        while !doc.is_char_boundary(end) { end -= 1; }
        doc.replace_range(at..end, &insert);
        if let Ok(c) = HttpConfig::from_json_str(&doc)
            && let Ok(l) = HttpLimiter::with_clock(c, ManualClock::new()) {
                let _ = get(&l, "/", "84.247.85.224", None);
            }
    }
}

/// A fresh directory of this process for the watch test `name`, and the path of its
/// `limits.toml`.
fn watch_dir(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("turnstile-http-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    (dir, path)
}

/// A limiter built from the file at `path` on a manual clock, shared, as `watch` wants it.
fn limiter_from_file(path: &std::path::Path) -> std::sync::Arc<HttpLimiter<ManualClock>> {
    std::sync::Arc::new(
        HttpLimiter::with_clock(HttpConfig::from_file(path).unwrap(), ManualClock::new()).unwrap(),
    )
}

/// One per-IP rule of `limit` requests a second, as a configuration file says it.
fn per_ip_per_second(limit: u32) -> String {
    format!("[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = {limit}\n")
}

/// On paused time: the watcher's polls and the test's waits are timer ticks, not real sleeps.
#[tokio::test(start_paused = true)]
async fn watch_reloads_on_change_and_keeps_old_config_on_error() {
    let (dir, path) = watch_dir("watch");
    std::fs::write(&path, PER_IP).unwrap();
    let clock = ManualClock::new();
    let l = std::sync::Arc::new(
        HttpLimiter::with_clock(HttpConfig::from_file(&path).unwrap(), clock.clone()).unwrap(),
    );
    let handle = l.watch(&path, Duration::from_millis(10));
    let touch = |text: &str, secs: u64| {
        std::fs::write(&path, text).unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    };
    touch(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\n",
        1_000,
    );
    let mut reloaded = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if get(&l, "/", "9.9.9.9", None)
            .quotas
            .first()
            .map(|q| q.limit)
            == Some(1)
        {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "the watcher did not reload");
    touch("[[rules]]\nperiod = \"bad\"\nlimit = 1\n", 2_000);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        get(&l, "/", "9.9.9.8", None).quotas[0].limit,
        1,
        "old config kept"
    );
    handle.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two writes within the file system's timestamp resolution leave the modification time as it
/// was (and a changed limit leaves the length): the watcher notices the change by the content,
/// which is what it reloads. It compared modification times only, and kept the first write.
#[tokio::test(start_paused = true)]
async fn watch_notices_a_rewrite_that_keeps_the_modification_time_and_length() {
    let (dir, path) = watch_dir("watch-same-mtime");
    let write = |limit: u32| {
        std::fs::write(&path, per_ip_per_second(limit)).unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000))
            .unwrap();
    };
    write(1);
    let l = limiter_from_file(&path);
    let handle = l.watch(&path, Duration::from_millis(10));
    let limit = |ip: &str| get(&l, "/", ip, None).quotas[0].limit;
    // Paused time: each sleep lets the watcher poll a few times.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(limit("9.9.9.1"), 1);
    write(2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        limit("9.9.9.2"),
        2,
        "a rewrite of the same time and length was missed"
    );
    write(3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(limit("9.9.9.3"), 3);
    handle.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The watcher compares the file with the configuration in force, not with the file as it was
/// when `watch` was called: an edit made after the limiter was built from the file and before
/// it was watched is loaded by the first poll. The watcher remembered the file's content at the
/// call, so that edit was never loaded (until the next one).
#[tokio::test(start_paused = true)]
async fn watch_loads_an_edit_made_before_it_was_called() {
    let (dir, path) = watch_dir("watch-late");
    std::fs::write(&path, per_ip_per_second(1)).unwrap();
    let l = limiter_from_file(&path);
    std::fs::write(&path, per_ip_per_second(2)).unwrap();
    let handle = l.watch(&path, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        get(&l, "/", "9.9.9.1", None).quotas[0].limit,
        2,
        "the edit made before watch() was not loaded"
    );
    handle.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The watcher holds its limiter weakly: once the limiter is dropped, the watcher's task ends
/// at its next poll rather than polling the file for ever; before that, it reloads each change
/// in turn.
#[tokio::test(start_paused = true)]
async fn a_watcher_ends_when_its_limiter_is_dropped() {
    let (dir, path) = watch_dir("watch-drop");
    std::fs::write(&path, per_ip_per_second(1)).unwrap();
    let l = limiter_from_file(&path);
    let handle = l.watch(&path, Duration::from_secs(1));
    for (limit, ip) in [(2, "9.9.9.2"), (3, "9.9.9.3")] {
        std::fs::write(&path, per_ip_per_second(limit)).unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(get(&l, "/", ip, None).quotas[0].limit, u64::from(limit));
    }
    drop(l);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(handle.is_finished(), "the watcher outlived its limiter");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file rewritten in place (`std::fs::write`, a shell's `>`) is empty between its truncation
/// and its write: a poll then must not load that as a configuration of no rules, which dropped
/// every rule's counters and the bans, so that once the whole file was back each client had a
/// full limit again and no client was banned.
#[tokio::test(start_paused = true)]
async fn watch_does_not_load_a_file_caught_empty_while_it_is_rewritten() {
    let (dir, path) = watch_dir("watch-empty");
    let config = "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n\
                  [bans]\nafter = 1\nwithin = \"1m\"\nduration = \"1h\"\n";
    std::fs::write(&path, config).unwrap();
    let l = limiter_from_file(&path);
    let handle = l.watch(&path, Duration::from_millis(10));
    let reason = |ip: &str| match get(&l, "/", ip, None).outcome {
        Outcome::Rejected { reason, .. } => Some(reason),
        _ => None,
    };
    assert_eq!(reason("9.9.9.1"), None);
    assert_eq!(reason("9.9.9.2"), None);
    assert_eq!(
        reason("9.9.9.2"),
        Some(RejectReason::RateLimited),
        "and banned"
    );
    // Truncated, polled, then written whole again (the same content).
    std::fs::write(&path, "").unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::fs::write(&path, config).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        reason("9.9.9.1"),
        Some(RejectReason::RateLimited),
        "count kept"
    );
    assert_eq!(reason("9.9.9.2"), Some(RejectReason::Banned), "ban kept");
    handle.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "metrics")]
#[path = "common/tally.rs"]
mod tally;

#[cfg(feature = "metrics")]
mod metrics_counters {
    use super::tally::Tally;
    use super::*;

    #[test]
    fn counters_by_rule() {
        let tally = Tally::default();
        let counts = tally.0.clone();
        let (l, _) = limiter(&format!(
            "{PER_IP}[[rules]]\nname = \"shadow\"\nperiod = \"1m\"\nlimit = 1\nmonitor = true\n[bans]\nafter = 1\n"
        ));
        metrics::with_local_recorder(&tally, || {
            for _ in 0..4 {
                get(&l, "/", "1.1.1.1", None);
            }
        });
        let counts = counts.lock().unwrap();
        let n = |k: &str| counts.get(k).copied().unwrap_or(0);
        assert_eq!(n("turnstile_http_admitted{per-ip}"), 2);
        assert_eq!(n("turnstile_http_shadow_rejected{shadow}"), 1);
        assert_eq!(n("turnstile_http_rejected{per-ip}"), 1);
        assert_eq!(n("turnstile_http_banned{per-ip}"), 1);
        assert_eq!(n("turnstile_http_rejected{ban}"), 1);
    }

    /// Each increment goes to the recorder installed at that moment (the rules keep keys, not
    /// handles registered when they compiled), and a request a later rule rejects is counted as
    /// admitted by no rule, though the earlier rule let it through before the refund.
    #[test]
    fn counters_follow_the_recorder_and_count_admissions_only() {
        let (l, _) = limiter(
            "[[rules]]\nname = \"minute\"\nperiod = \"1m\"\nlimit = 10\n[[rules]]\nname = \"second\"\nperiod = \"1s\"\nlimit = 1\n",
        );
        let (first, second) = (Tally::default(), Tally::default());
        metrics::with_local_recorder(&first, || {
            get(&l, "/", "1.1.1.1", None);
        });
        metrics::with_local_recorder(&second, || {
            get(&l, "/", "1.1.1.1", None);
            get(&l, "/", "1.1.1.1", None);
        });
        let n = |tally: &Tally, k: &str| tally.0.lock().unwrap().get(k).copied().unwrap_or(0);
        assert_eq!(n(&first, "turnstile_http_admitted{minute}"), 1);
        assert_eq!(n(&first, "turnstile_http_admitted{second}"), 1);
        assert_eq!(n(&first, "turnstile_http_rejected{second}"), 0);
        assert_eq!(n(&second, "turnstile_http_admitted{minute}"), 0);
        assert_eq!(n(&second, "turnstile_http_admitted{second}"), 0);
        assert_eq!(n(&second, "turnstile_http_rejected{second}"), 2);
        assert_eq!(n(&second, "turnstile_http_rejected{minute}"), 0);
    }

    /// One global rule is decided on a path of its own: it counts the same.
    #[test]
    fn one_rule_counts_admissions_and_rejections() {
        let tally = Tally::default();
        let (l, _) = limiter("[[rules]]\nname = \"only\"\nperiod = \"1m\"\nlimit = 2\n");
        metrics::with_local_recorder(&tally, || {
            for _ in 0..5 {
                get(&l, "/", "1.1.1.1", None);
            }
        });
        let n = |k: &str| tally.0.lock().unwrap().get(k).copied().unwrap_or(0);
        assert_eq!(n("turnstile_http_admitted{only}"), 2);
        assert_eq!(n("turnstile_http_rejected{only}"), 3);
    }

    /// Every request of a client a full rule has no room for is counted, whatever
    /// `key_overflow` does with it.
    #[test]
    fn key_overflow_is_counted_by_rule() {
        for (policy, rejected) in [("reject", 2), ("shared", 1), ("allow", 0)] {
            let tally = Tally::default();
            let counts = tally.0.clone();
            let (l, _) = limiter(&format!(
                "max_keys_per_rule = 1\nkey_overflow = \"{policy}\"\n[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n"
            ));
            metrics::with_local_recorder(&tally, || {
                get(&l, "/", "10.0.0.1", None);
                get(&l, "/", "10.0.0.2", None);
                get(&l, "/", "10.0.0.3", None);
            });
            let counts = counts.lock().unwrap();
            let n = |k: &str| counts.get(k).copied().unwrap_or(0);
            assert_eq!(n("turnstile_http_key_overflow{per-ip}"), 2, "{policy}");
            assert_eq!(n("turnstile_http_rejected{per-ip}"), rejected, "{policy}");
        }
    }

    /// A monitor rule's full key table is counted as an enforced rule's is: every request of a
    /// client it has no room for, whatever `key_overflow` does with it. It was not: under
    /// `"allow"` a full monitor rule stopped counting new clients with no metric at all (its
    /// shadow rejections undercounted, silently), under `"shared"` the newcomers' counter went
    /// unseen, and under `"reject"` only a shadow rejection said anything.
    #[test]
    fn a_monitor_rules_key_overflow_is_counted() {
        for (policy, shadow_rejected) in [("reject", 2), ("shared", 1), ("allow", 0)] {
            let tally = Tally::default();
            let counts = tally.0.clone();
            let (l, _) = limiter(&format!(
                "max_keys_per_rule = 1\nkey_overflow = \"{policy}\"\n[[rules]]\nname = \"shadow\"\n\
                 period = \"1m\"\nlimit = 1\nmonitor = true\n"
            ));
            metrics::with_local_recorder(&tally, || {
                for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
                    assert_eq!(
                        get(&l, "/", ip, None).outcome,
                        Outcome::Admitted,
                        "{policy}"
                    );
                }
            });
            let counts = counts.lock().unwrap();
            let n = |k: &str| counts.get(k).copied().unwrap_or(0);
            assert_eq!(n("turnstile_http_key_overflow{shadow}"), 2, "{policy}");
            assert_eq!(
                n("turnstile_http_shadow_rejected{shadow}"),
                shadow_rejected,
                "{policy}"
            );
        }
    }

    /// A rejection the full ban list cannot count is counted by its rule, and the clients the
    /// list does track are still banned on time.
    #[test]
    fn a_rejection_the_full_ban_list_cannot_count_is_counted() {
        let tally = Tally::default();
        let counts = tally.0.clone();
        let (l, _) = limiter(
            "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n\
             [bans]\nafter = 2\nwithin = \"1m\"\nduration = \"10m\"\nmax_entries = 1\n",
        );
        metrics::with_local_recorder(&tally, || {
            get(&l, "/", "10.0.0.1", None);
            get(&l, "/", "10.0.0.1", None); // rejected: the list's one entry
            get(&l, "/", "10.0.0.2", None);
            get(&l, "/", "10.0.0.2", None); // rejected: no room to count it
            get(&l, "/", "10.0.0.2", None); // again
            get(&l, "/", "10.0.0.1", None); // its second rejection: banned
        });
        let counts = counts.lock().unwrap();
        let n = |k: &str| counts.get(k).copied().unwrap_or(0);
        assert_eq!(n("turnstile_http_ban_list_full{per-ip}"), 2);
        assert_eq!(n("turnstile_http_banned{per-ip}"), 1);
        assert_eq!(n("turnstile_http_rejected{per-ip}"), 4);
        drop(counts);
        let banned = reason(&get(&l, "/", "10.0.0.1", None)).unwrap();
        assert_eq!((banned.0, banned.1.as_str()), (RejectReason::Banned, "ban"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Under any sequence of requests, each fixed window admits at most its limit per IP, each
    /// rule's remaining quota counts admissions only (a rejection by the later rule is refunded
    /// on the earlier one), and every rejection says when to retry within the rule's period.
    #[test]
    fn never_more_than_the_limit(steps in proptest::collection::vec((0u8..3, 0u64..400), 1..200)) {
        let (l, clock) = limiter(
            "[[rules]]\nname = \"m\"\nperiod = \"10s\"\nlimit = 12\n[[rules]]\nname = \"s\"\nperiod = \"1s\"\nlimit = 3\n",
        );
        let mut per_second = std::collections::HashMap::new();
        let mut per_ten = std::collections::HashMap::new();
        for (ip, gap_ms) in steps {
            clock.advance(Duration::from_millis(gap_ms));
            let now = clock.elapsed().as_millis() as u64;
            let addr = format!("10.0.0.{ip}");
            let v = get(&l, "/", &addr, None);
            match &v.outcome {
                Outcome::Admitted => {
                    let in_second = per_second.entry((ip, now / 1000)).or_insert(0u32);
                    *in_second += 1;
                    let in_second = *in_second;
                    let in_ten = per_ten.entry((ip, now / 10_000)).or_insert(0u32);
                    *in_ten += 1;
                    prop_assert_eq!(v.quotas.len(), 2);
                    // both rules were charged for admissions only: rejections were refunded
                    prop_assert_eq!(v.quotas[1].remaining, u64::from(3 - in_second));
                    prop_assert_eq!(v.quotas[0].remaining, u64::from(12 - *in_ten));
                }
                Outcome::Rejected { reason, rule, retry_after } => {
                    prop_assert_eq!(*reason, RejectReason::RateLimited);
                    let period = if &**rule == "s" { 1 } else { 10 };
                    let retry = retry_after.unwrap();
                    prop_assert!(retry > Duration::ZERO && retry <= Duration::from_secs(period));
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
        prop_assert!(per_second.values().all(|&n| n <= 3));
        prop_assert!(per_ten.values().all(|&n| n <= 12));
    }
}

/// Without the feature `redis`, a Redis backend is a configuration error that says so.
#[cfg(not(feature = "redis"))]
#[test]
fn redis_backend_without_the_feature_is_a_config_error() {
    let config = HttpConfig::from_toml_str(&format!(
        "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\n{PER_IP}"
    ))
    .unwrap();
    let err = HttpLimiter::new(config).unwrap_err().to_string();
    assert!(err.starts_with("backend.kind"), "{err}");
    assert!(err.contains("feature `redis`"), "{err}");
}

/// A client id longer than `client_id_max_len` is no client id: it counts under no client rule,
/// matches no client list, and `missing_key` decides; one at the bound counts as usual.
#[test]
fn over_long_client_ids_are_no_client_id() {
    let (l, _clock) = limiter(
        r#"
        client_id_max_len = 16
        missing_key = "reject"
        [[rules]]
        name = "per-client"
        endpoint = "*"
        period = "1m"
        limit = 1
        key = "client"
        "#,
    );
    let at_bound = "a".repeat(16);
    let over = "a".repeat(17);
    assert!(matches!(
        get(&l, "/", "", Some(&at_bound)).outcome,
        Outcome::Admitted
    ));
    assert_eq!(
        reason(&get(&l, "/", "", Some(&at_bound))).map(|r| r.0),
        Some(RejectReason::RateLimited)
    );
    for _ in 0..3 {
        assert_eq!(
            reason(&get(&l, "/", "", Some(&over))).map(|r| r.0),
            Some(RejectReason::NoKey)
        );
    }
    let zero = HttpConfig::from_toml_str("client_id_max_len = 0").expect("valid toml");
    let error = HttpLimiter::with_clock(zero, ManualClock::new()).unwrap_err();
    assert!(error.to_string().contains("client_id_max_len"), "{error}");
}

/// A client id of a list or a client rule that no request's id can be (empty, or longer than
/// `client_id_max_len`, which the engine takes for no client id) is refused at load, naming
/// the field, as `anonymous_client_id` is. Accepted, it matched no request: a blocklisted
/// client whose id was over the bound was not blocked, a client rule of limit 0 blocked no
/// one, and nothing said so.
#[test]
fn list_and_client_rule_ids_no_request_can_have_are_refused() {
    let long = "a".repeat(17);
    let cases = [
        (
            format!("[blocklist]\nclients = [\"ok\", \"{long}\"]\n"),
            "blocklist.clients[1]",
        ),
        (
            format!("[whitelist]\nclients = [\"{long}\"]\n"),
            "whitelist.clients[0]",
        ),
        (
            "[whitelist]\nclients = [\"\"]\n".to_owned(),
            "whitelist.clients[0]",
        ),
        (
            format!("[[whitelist.by_key]]\nkey = \"client\"\nclients = [\"{long}\"]\n"),
            "whitelist.by_key[0].clients[0]",
        ),
        (
            format!(
                "[[client_rules]]\nclient_id = \"{long}\"\n[[client_rules.rules]]\nperiod = \"1m\"\nlimit = 0\n"
            ),
            "client_rules[0].client_id",
        ),
    ];
    for (doc, field) in cases {
        let config = HttpConfig::from_toml_str(&format!("client_id_max_len = 16\n{doc}"))
            .expect("valid toml");
        let error = HttpLimiter::with_clock(config, ManualClock::new())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&format!("{field}:")) && error.contains("client_id_max_len (16)"),
            "{doc}: {error}"
        );
    }
    // At the bound, an id is one a request can have.
    let (l, _clock) = limiter(&format!(
        "client_id_max_len = 16\n[blocklist]\nclients = [\"{}\"]\n",
        "a".repeat(16)
    ));
    let blocked = get(&l, "/", "1.1.1.1", Some(&"a".repeat(16)));
    assert_eq!(reason(&blocked).map(|r| r.0), Some(RejectReason::Blocked));
}

/// Rules written in code are the rules of the same file: the README's configuration, built with
/// the builder methods, equals the one parsed from TOML, and a period that is not a whole unit
/// (90 minutes) becomes a window of exactly that length.
#[test]
fn rules_in_code_equal_the_same_rules_from_toml() {
    use turnstile::http::{BanConfig, RuleAlgorithm, RuleConfig, RuleKey};
    let from_toml = HttpConfig::from_toml_str(
        r#"
        client_id_header = "X-ClientId"
        [[rules]]
        name = "per-ip"
        endpoint = "*"
        period = "1s"
        limit = 2
        [[rules]]
        name = "search"
        endpoint = "get:/api/search*"
        period = "15m"
        limit = 100
        algorithm = "sliding_window"
        [[rules]]
        endpoint = 'get:^/api/v\d+/'
        regex = true
        period = "1h"
        limit = 1000
        monitor = true
        per_endpoint = true
        [[ip_rules]]
        ip = "10.0.0.0/8"
        [[ip_rules.rules]]
        period = "1s"
        limit = 100
        [[ip_rules.rules]]
        period = "1m"
        limit = 1000
        [[client_rules]]
        client_id = "partner"
        [[client_rules.rules]]
        period = "1s"
        limit = 20
        key = "client"
        [bans]
        after = 10
        within = "1m"
        duration = "15m"
        "#,
    )
    .expect("valid toml");
    let second = Duration::from_secs(1);
    let minute = Duration::from_secs(60);
    let mut in_code = HttpConfig::default()
        .client_id_header("X-ClientId")
        .rule(RuleConfig::new(second, 2).name("per-ip"))
        .rule(
            RuleConfig::new(15 * minute, 100)
                .name("search")
                .endpoint("get:/api/search*")
                .algorithm(RuleAlgorithm::SlidingWindow),
        )
        .rule(
            RuleConfig::new(60 * minute, 1000)
                .endpoint_regex(r"get:^/api/v\d+/")
                .monitor()
                .per_endpoint(),
        )
        .ip_rule("10.0.0.0/8", RuleConfig::new(second, 100))
        .ip_rule("10.0.0.0/8", RuleConfig::new(minute, 1000))
        .client_rule("partner", RuleConfig::new(second, 20).key(RuleKey::Client));
    in_code.bans = Some(BanConfig::new(10, minute, 15 * minute));
    assert_eq!(in_code, from_toml);

    let clock = ManualClock::new();
    let config = HttpConfig::default().rule(RuleConfig::new(90 * minute, 1).name("slow"));
    let limiter = HttpLimiter::with_clock(config, clock).expect("valid config");
    let verdict = get(&limiter, "/", "1.2.3.4", None);
    assert_eq!(verdict.outcome, Outcome::Admitted);
    assert_eq!(verdict.quotas[0].window, 90 * minute);
    let (reason, _, retry) = reason(&get(&limiter, "/", "1.2.3.4", None)).unwrap();
    assert_eq!(reason, RejectReason::RateLimited);
    assert!(retry.unwrap() <= 90 * minute && retry.unwrap() > 89 * minute);
}

/// The log lines a closure produces on its thread, at warn and above.
///
/// Through one global subscriber, installed by the first call, that writes an event into the
/// emitting thread's capture buffer if it has one. A subscriber of the thread's own
/// (`with_default`) lost events now and then: a callsite another test thread registered at the
/// same moment could have its interest cached as "never" after the scoped subscriber's rebuild
/// of the cache, and the warning was then not emitted at all (1 run in 6).
fn warnings_of(f: impl FnOnce()) -> String {
    use std::cell::RefCell;
    use std::sync::Once;
    thread_local! {
        static CAPTURE: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
    }
    struct ThreadSink;
    impl std::io::Write for ThreadSink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            CAPTURE.with(|c| {
                if let Some(buffer) = c.borrow_mut().as_mut() {
                    buffer.extend_from_slice(bytes);
                }
            });
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(|| ThreadSink)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("this test binary installs no other global subscriber");
        // Callsites registered before the subscriber was there are looked at again.
        tracing::callsite::rebuild_interest_cache();
    });
    CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
    f();
    let bytes = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    String::from_utf8(bytes).unwrap()
}

/// A rule that can never apply is valid, but the limiter says so when it loads it: a general
/// rule for every endpoint with the same period and counter key as one with a lower limit, and
/// with `endpoint_rate_limiting` off a rule limited to some endpoints. Rules that do apply
/// (one counting by client id beside one counting by IP, of one period), and specific rules
/// overriding general ones, are not reported.
#[test]
fn rules_that_never_apply_are_reported_when_loaded() {
    let dead = warnings_of(|| {
        let (l, _) = limiter(
            r#"
            [[rules]]
            name = "per-ip"
            period = "1s"
            limit = 10
            [[rules]]
            name = "per-ip-loose"
            period = "1s"
            limit = 100
            [[rules]]
            name = "per-client"
            period = "1s"
            limit = 100
            key = "client"
            [[rules]]
            name = "hourly"
            period = "1h"
            limit = 1000
            "#,
        );
        // It is so: the loose per-IP rule is never the one that decides; the others all are.
        let v = get(&l, "/", "1.2.3.4", Some("c"));
        let mut names: Vec<&str> = v.quotas.iter().map(|q| &*q.policy).collect();
        names.sort_unstable();
        assert_eq!(names, ["hourly", "per-client", "per-ip"]);
    });
    assert!(dead.contains("never applies"), "{dead}");
    assert!(dead.contains("rule=per-ip-loose"), "{dead}");
    assert!(dead.contains("applies_instead=per-ip"), "{dead}");
    assert!(dead.contains("field=rules[1]"), "{dead}");
    assert!(!dead.contains("rule=per-ip "), "{dead}");
    assert!(!dead.contains("rule=per-client"), "{dead}");
    assert!(!dead.contains("rule=hourly"), "{dead}");

    // Of three with one period, both losers name the one that applies, not each other.
    let three = warnings_of(|| {
        limiter(
            "[[rules]]\nname = \"ten\"\nperiod = \"1s\"\nlimit = 10\n[[rules]]\nname = \"five\"\nperiod = \"1s\"\nlimit = 5\n[[rules]]\nname = \"one\"\nperiod = \"1s\"\nlimit = 1\n",
        );
    });
    assert_eq!(three.matches("applies_instead=one").count(), 2, "{three}");
    assert!(!three.contains("applies_instead=five"), "{three}");
    assert!(!three.contains("rule=one "), "{three}");

    let off = warnings_of(|| {
        limiter(
            "endpoint_rate_limiting = false\n[[rules]]\nname = \"posts\"\nendpoint = \"post:/api/*\"\nperiod = \"1s\"\nlimit = 1\n[[rules]]\nname = \"all\"\nperiod = \"1s\"\nlimit = 5\n",
        );
    });
    assert!(off.contains("rule=posts"), "{off}");
    assert!(off.contains("endpoint_rate_limiting is off"), "{off}");
    assert!(!off.contains("rule=all"), "{off}");

    let fine = warnings_of(|| {
        limiter(&format!(
            "{PER_IP}\n[[client_rules]]\nclient_id = \"partner\"\n[[client_rules.rules]]\nperiod = \"1s\"\nlimit = 20\n[[rules]]\nname = \"posts\"\nendpoint = \"post:/api/*\"\nperiod = \"1s\"\nlimit = 1\n"
        ));
    });
    assert_eq!(fine, "", "nothing to report");

    // Nor in the example app's configuration.
    let example = warnings_of(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/axum_server.toml");
        HttpLimiter::new(HttpConfig::from_file(path).expect("the example's config loads"))
            .expect("and compiles");
    });
    assert_eq!(example, "", "the example has no dead rules");
}

/// The example app's partner rule does what its comment says: 20 a second for everyone who
/// sends the id, counted by the id, while per-ip's 2 a second per IP still applies to them (its
/// comment promised "a larger per-second quota", which a header's id, anyone's to send, must
/// not grant).
#[test]
fn the_example_partner_quota_is_shared_by_the_id_and_per_ip_still_applies() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/axum_server.toml");
    let config = HttpConfig::from_file(path).unwrap();
    let l = HttpLimiter::with_clock(config, ManualClock::new()).unwrap();
    let partner = |ip: &str| get(&l, "/api/values", ip, Some("partner"));
    for ip in (1..=10).map(|i| format!("10.0.0.{i}")) {
        for _ in 0..2 {
            assert_eq!(partner(&ip).outcome, Outcome::Admitted);
        }
        // (At the tenth address both rules are spent.)
        if ip != "10.0.0.10" {
            let (why, rule, _) = reason(&partner(&ip)).unwrap();
            assert_eq!((why, rule.as_str()), (RejectReason::RateLimited, "per-ip"));
        }
    }
    // 20 admitted from ten addresses: the id's quota is spent wherever it is sent from.
    let (why, rule, _) = reason(&partner("10.0.0.11")).unwrap();
    assert_eq!((why, rule.as_str()), (RejectReason::RateLimited, "partner"));
    assert_eq!(
        get(&l, "/api/values", "10.0.0.11", None).outcome,
        Outcome::Admitted
    );
}

/// A whole `appsettings.json`, with the application's other sections beside AspNetCoreRateLimit's,
/// loads through `from_file` (by its `.json` extension) as the rate-limit sections alone.
#[test]
fn a_whole_appsettings_json_loads_from_file() {
    let dir = std::env::temp_dir().join(format!("turnstile-appsettings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("appsettings.json");
    std::fs::write(
        &path,
        r#"{
          "Logging": {"LogLevel": {"Default": "Information"}},
          "AllowedHosts": "*",
          "ConnectionStrings": {"Main": "Server=db;Database=app"},
          "IpRateLimiting": {
            "RateLimitCounterPrefix": "crlc",
            "GeneralRules": [{"Endpoint": "*", "Period": "1s", "Limit": 2}]
          }
        }"#,
    )
    .unwrap();
    let config = HttpConfig::from_file(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(config.rules.len(), 1);
    let l = HttpLimiter::with_clock(config, ManualClock::new()).unwrap();
    for _ in 0..2 {
        assert_eq!(get(&l, "/", "1.2.3.4", None).outcome, Outcome::Admitted);
    }
    assert_eq!(
        reason(&get(&l, "/", "1.2.3.4", None)).unwrap().0,
        RejectReason::RateLimited
    );
}

/// `unban` lifts a ban at once and forgets the rejections counted towards the next one; it
/// groups the address as the layer does (here an IPv6 /64), and `unban_client` does the same
/// for a client known by its id alone. Without `[bans]`, or for a client never banned, it
/// changes nothing and says so.
#[test]
fn unban_lifts_a_ban_and_its_count() {
    let (l, clock) = limiter(
        "[client_ip]\nipv6_prefix = 64\n[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n\
         [bans]\nafter = 2\nwithin = \"1h\"\nduration = \"1h\"\n",
    );
    // The layer hands the engine the address grouped to its /64.
    let prefix = "2001:db8:0:7::";
    let banned_after_two = |ip: &str| {
        assert_eq!(get(&l, "/", ip, None).outcome, Outcome::Admitted);
        for _ in 0..2 {
            assert_eq!(
                reason(&get(&l, "/", ip, None)).unwrap().0,
                RejectReason::RateLimited
            );
        }
        assert_eq!(
            reason(&get(&l, "/", ip, None)).unwrap().0,
            RejectReason::Banned
        );
    };
    banned_after_two(prefix);
    assert!(!l.unban("2001:db8:0:8::1".parse().unwrap()), "another /64");
    assert!(
        l.unban("2001:db8:0:7:abcd::1".parse().unwrap()),
        "an address of the banned /64"
    );
    assert!(
        !l.unban("2001:db8:0:7::1".parse().unwrap()),
        "lifted already"
    );
    // The rule still says no for the rest of its minute, and one rejection no longer bans:
    // the count started again.
    assert_eq!(
        reason(&get(&l, "/", prefix, None)).unwrap().0,
        RejectReason::RateLimited
    );
    assert_eq!(
        reason(&get(&l, "/", prefix, None)).unwrap().0,
        RejectReason::RateLimited
    );
    assert_eq!(
        reason(&get(&l, "/", prefix, None)).unwrap().0,
        RejectReason::Banned
    );
    // A ban that ran out is no ban to lift.
    clock.advance(Duration::from_secs(2 * 3600));
    assert!(!l.unban("2001:db8:0:7::1".parse().unwrap()));

    // A client without an address is banned, and unbanned, by its id.
    let client = |l: &HttpLimiter<ManualClock>| reason(&get(l, "/", "", Some("partner")));
    let (l, _) = limiter(
        "missing_key = \"allow\"\n[[rules]]\nname = \"per-id\"\nperiod = \"1m\"\nlimit = 1\nkey = \"client\"\n\
         [bans]\nafter = 1\nwithin = \"1h\"\nduration = \"1h\"\n",
    );
    assert_eq!(client(&l), None);
    assert_eq!(client(&l).unwrap().0, RejectReason::RateLimited);
    assert_eq!(client(&l).unwrap().0, RejectReason::Banned);
    assert!(!l.unban_client("someone-else"));
    assert!(l.unban_client("partner"));
    assert_eq!(client(&l).unwrap().0, RejectReason::RateLimited);

    let (l, _) = limiter(PER_IP);
    assert!(!l.unban("192.0.2.1".parse().unwrap()), "no bans configured");
}

/// A request rejected by one rule is charged to no other, whatever their algorithms: with an
/// exact sliding window among them too, whose refund is positional (the permit comes back, its
/// ticket's place in the ring does not until it expires). One request admitted, then ten in
/// the same second rejected by the 1-per-second rule: a second later the client has used one
/// of its ten hourly requests, not ten. The engine charges sliding windows after the other
/// rules, and of several sliding windows the one that would reject first, so the hourly window
/// is never charged and refunded here. Quotas are still reported in the rules' order.
#[test]
fn a_rejected_request_leaves_no_trace_in_a_sliding_window_rule() {
    let algorithms = [
        "fixed_window",
        "sliding_counter",
        "token_bucket",
        "sliding_window",
    ];
    for (hourly, burst) in algorithms
        .iter()
        .map(|a| (*a, "fixed_window"))
        .chain([("sliding_window", "sliding_window")])
    {
        let (l, clock) = limiter(&format!(
            "[[rules]]\nname = \"hourly\"\nperiod = \"1h\"\nlimit = 10\nalgorithm = \"{hourly}\"\n\
             [[rules]]\nname = \"burst\"\nperiod = \"1s\"\nlimit = 1\nalgorithm = \"{burst}\"\n"
        ));
        let case = format!("hourly {hourly}, burst {burst}");
        assert_eq!(
            get(&l, "/", "192.0.2.1", None).outcome,
            Outcome::Admitted,
            "{case}"
        );
        for _ in 0..10 {
            let v = get(&l, "/", "192.0.2.1", None);
            assert_eq!(
                reason(&v).map(|r| r.1),
                Some("burst".to_owned()),
                "{case}: {v:?}"
            );
        }
        clock.advance(Duration::from_secs(1));
        let next = get(&l, "/", "192.0.2.1", None);
        assert_eq!(next.outcome, Outcome::Admitted, "{case}: {next:?}");
        let policies: Vec<&str> = next.quotas.iter().map(|q| &*q.policy).collect();
        assert_eq!(policies, ["hourly", "burst"], "{case}");
        assert_eq!(next.quotas[0].remaining, 8, "{case}: {next:?}");
    }
}

/// A rule of limit 0 blocks every request it matches, whatever key the request has: a block
/// counts nothing, so it needs no key. A `key = "client"` block on the admin endpoints does not
/// let requests without a client id through under `missing_key = "allow"` (as it did when a
/// missing key was looked at first).
#[test]
fn a_limit_zero_rule_blocks_requests_without_its_key() {
    let (l, _) = limiter(
        "missing_key = \"allow\"\n\
         [[rules]]\nname = \"admin-closed\"\nendpoint = \"*:/admin/*\"\nperiod = \"1s\"\nlimit = 0\nkey = \"client\"\n\
         [[rules]]\nname = \"per-client\"\nperiod = \"1m\"\nlimit = 100\nkey = \"client\"\n",
    );
    for client in [None, Some("c")] {
        let v = get(&l, "/admin/users", "1.1.1.1", client);
        assert_eq!(
            reason(&v).map(|r| (r.0, r.1)),
            Some((RejectReason::Blocked, "admin-closed".to_owned())),
            "client {client:?}"
        );
    }
    // Elsewhere the client rule still passes a request without a client id uncounted.
    assert_eq!(get(&l, "/api", "1.1.1.1", None).outcome, Outcome::Admitted);
}

/// Under `missing_key = "reject"`, a request that a rule of limit 0 blocks and that lacks the
/// key of another rule is told it is blocked, whichever rule comes first: the block holds
/// whatever key it sends. It was told "no key" (400, by `no_key_status`) when the rule it
/// lacked the key of came first, inviting a retry with a client id that would still be
/// blocked. Counted as a rejection of the blocking rule alone.
#[test]
fn a_block_is_the_answer_before_a_missing_key_whichever_rule_comes_first() {
    let block =
        "[[rules]]\nname = \"closed\"\nendpoint = \"*:/admin/*\"\nperiod = \"1s\"\nlimit = 0\n";
    let per_client =
        "[[rules]]\nname = \"per-client\"\nperiod = \"1m\"\nlimit = 100\nkey = \"client\"\n";
    for toml in [
        format!("missing_key = \"reject\"\n{per_client}{block}"),
        format!("missing_key = \"reject\"\n{block}{per_client}"),
    ] {
        let (l, _) = limiter(&toml);
        let v = get(&l, "/admin/users", "1.1.1.1", None);
        assert_eq!(
            reason(&v).map(|r| (r.0, r.1)),
            Some((RejectReason::Blocked, "closed".to_owned())),
            "{toml}"
        );
        // Without the block, the missing key is the answer.
        let v = get(&l, "/api", "1.1.1.1", None);
        assert_eq!(reason(&v).map(|r| r.0), Some(RejectReason::NoKey), "{toml}");
    }
}

fn limited(v: &Verdict) -> bool {
    matches!(v.outcome, Outcome::Rejected { .. })
}

/// Rules of one period that count different things are different limits, and both apply: a
/// per-client rule with a lower limit must not lift the per-IP rule, or a client could step
/// around the IP limit by sending a new client id each time. Of rules that count alike, the
/// lowest limit still applies, and a specific rule replaces the general rules of its group
/// only.
#[test]
fn rules_of_one_period_that_count_differently_all_apply() {
    let (l, _) = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 3\n\
         [[rules]]\nname = \"per-client\"\nperiod = \"1m\"\nlimit = 2\nkey = \"client\"\n\
         [[rules]]\nname = \"per-ip-loose\"\nperiod = \"1m\"\nlimit = 50\n\
         [[client_rules]]\nclient_id = \"partner\"\n\
         [[client_rules.rules]]\nname = \"partner\"\nperiod = \"1m\"\nlimit = 100\nkey = \"client\"\n",
    );
    let outcomes: Vec<bool> = (0..4)
        .map(|i| limited(&get(&l, "/", "1.1.1.1", Some(&format!("c{i}")))))
        .collect();
    assert_eq!(outcomes, [false, false, false, true]);
    let v = get(&l, "/", "2.2.2.2", Some("c"));
    let mut names: Vec<&str> = v.quotas.iter().map(|q| &*q.policy).collect();
    names.sort_unstable();
    assert_eq!(names, ["per-client", "per-ip"]);
    // The partner's client rule replaces the per-client rule, not the per-IP one.
    let v = get(&l, "/", "3.3.3.3", Some("partner"));
    let mut names: Vec<&str> = v.quotas.iter().map(|q| &*q.policy).collect();
    names.sort_unstable();
    assert_eq!(names, ["partner", "per-ip"]);
}

/// A whitelist scoped to one key exempts the request from the rules counting by that key
/// only; when no other rule applies the request is whitelisted. Blocklists still apply.
#[test]
fn a_whitelist_by_key_exempts_from_that_keys_rules_only() {
    let (l, _) = limiter(
        "client_id_header = \"X-ClientId\"\n\
         [[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n\
         [[rules]]\nname = \"per-client\"\nperiod = \"1h\"\nlimit = 1\nkey = \"client\"\n\
         [[whitelist.by_key]]\nkey = \"ip\"\nips = [\"10.0.0.0/8\"]\nendpoints = [\"get:/health\"]\n\
         [[whitelist.by_key]]\nkey = \"client\"\nclients = [\"trusted\"]\n\
         [blocklist]\nips = [\"10.9.9.9\"]\n",
    );
    // Exempt from the IP rule, counted by the client rule.
    assert!(!limited(&get(&l, "/", "10.0.0.1", Some("c"))));
    let v = get(&l, "/", "10.0.0.1", Some("c"));
    assert_eq!(reason(&v).unwrap().1, "per-client");
    // Exempt from both: whitelisted, counted by neither.
    for _ in 0..3 {
        assert_eq!(
            get(&l, "/", "10.0.0.2", Some("trusted")).outcome,
            Outcome::Whitelisted
        );
    }
    // An endpoint of the IP whitelist: not counted by the IP rule, counted by the client rule.
    assert!(!limited(&get(&l, "/health", "1.1.1.1", Some("d"))));
    assert!(!limited(&get(&l, "/health", "1.1.1.1", Some("e"))));
    assert!(limited(&get(&l, "/health", "1.1.1.1", Some("e"))));
    assert!(
        !limited(&get(&l, "/", "1.1.1.1", Some("f"))),
        "per-ip counted none"
    );
    assert!(limited(&get(&l, "/", "1.1.1.1", Some("g"))));
    assert!(matches!(
        reason(&get(&l, "/", "10.9.9.9", Some("trusted"))),
        Some((RejectReason::Blocked, _, _))
    ));
    let e = HttpLimiter::with_clock(
        HttpConfig::from_toml_str("[[whitelist.by_key]]\nkey = \"ip\"\nips = [\"nope\"]\n")
            .unwrap(),
        ManualClock::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("whitelist.by_key[0].ips[0]"), "{e}");
}

/// `anonymous_client_id` is the client id of requests without one (AspNetCoreRateLimit's
/// "anon"); without it they have none, and `missing_key` decides.
#[test]
fn requests_without_a_client_id_are_the_anonymous_client_when_set() {
    let rule = "[[rules]]\nname = \"per-client\"\nperiod = \"1m\"\nlimit = 1\nkey = \"client\"\n";
    let (l, _) = limiter(rule);
    assert!(matches!(
        reason(&get(&l, "/", "1.1.1.1", None)),
        Some((RejectReason::NoKey, _, _))
    ));
    let (l, _) = limiter(&format!("anonymous_client_id = \"anon\"\n{rule}"));
    assert!(!limited(&get(&l, "/", "1.1.1.1", None)));
    assert!(
        limited(&get(&l, "/", "2.2.2.2", Some(""))),
        "an empty id too"
    );
    assert!(!limited(&get(&l, "/", "2.2.2.2", Some("other"))));
    let bad = HttpConfig::from_toml_str(&format!("anonymous_client_id = \"\"\n{rule}")).unwrap();
    let e = HttpLimiter::new(bad).unwrap_err().to_string();
    assert!(e.starts_with("anonymous_client_id"), "{e}");
}

/// `trim_trailing_slash` makes `/a/` the endpoint `/a`; by default they are two paths (a
/// router may serve them differently).
#[test]
fn a_trailing_slash_is_trimmed_only_when_asked() {
    let rule = "[[rules]]\nname = \"values\"\nendpoint = \"get:/api/values\"\nperiod = \"1m\"\nlimit = 1\nper_endpoint = true\n";
    let (l, _) = limiter(rule);
    assert!(!limited(&get(&l, "/api/values", "1.1.1.1", None)));
    assert!(get(&l, "/api/values/", "1.1.1.1", None).quotas.is_empty());
    let (l, _) = limiter(&format!("trim_trailing_slash = true\n{rule}"));
    assert!(!limited(&get(&l, "/api/values/", "1.1.1.1", None)));
    assert!(limited(&get(&l, "/api/values", "1.1.1.1", None)));
    assert!(limited(&get(&l, "/api/%76alues/", "1.1.1.1", None)));
}

/// `{period}` is the window as periods are written (`1d`, not humantime's `1day`), `{{` a
/// literal brace, and a zero retry-after is never sent as `Retry-After: 0`.
#[test]
fn rejection_templates_and_retry_after() {
    use turnstile::http::{Quotas, ResponseConfig, rejection_response};
    let (l, _) = limiter(
        "[response]\nbody = \"{{rule} {rule} max {limit} per {period}\"\n\
         [[rules]]\nname = \"daily\"\nperiod = \"1d\"\nlimit = 1\n",
    );
    let config = HttpConfig::from_toml_str(
        "[response]\nbody = \"{{rule} {rule} max {limit} per {period}\"\n",
    )
    .unwrap()
    .response;
    get(&l, "/", "1.1.1.1", None);
    let v = get(&l, "/", "1.1.1.1", None);
    let r = rejection_response(&v, &config).unwrap();
    assert_eq!(
        std::str::from_utf8(r.body()).unwrap(),
        "{rule} daily max 1 per 1d"
    );
    let zero = Verdict {
        outcome: Outcome::Rejected {
            reason: RejectReason::RateLimited,
            rule: "custom".into(),
            retry_after: Some(Duration::ZERO),
        },
        quotas: Quotas::new(),
    };
    let r = rejection_response(&zero, &ResponseConfig::default()).unwrap();
    assert_eq!(r.headers()["retry-after"], "1");
    let mut quiet = ResponseConfig::default();
    quiet.retry_after_header = false;
    assert!(
        rejection_response(&zero, &quiet)
            .unwrap()
            .headers()
            .get("retry-after")
            .is_none()
    );
}

/// A reload that writes a rule's pattern or IP range differently but means the same (the verb's
/// case, the glob's case, spaces around the pattern; an IPv4-mapped range for the IPv4 one, an
/// address inside the range for its network) changes no rule: the counters stay.
#[test]
fn reload_keeps_counters_of_rules_written_differently_but_equal() {
    let config = |endpoint: &str, ip: &str| {
        format!(
            "[[rules]]\nname = \"api\"\nendpoint = \"{endpoint}\"\nperiod = \"1m\"\nlimit = 3\n\
             [[ip_rules]]\nip = \"{ip}\"\n[[ip_rules.rules]]\nname = \"office\"\nendpoint = \"*\"\nperiod = \"1h\"\nlimit = 5\n"
        )
    };
    let remaining = |v: &Verdict, name: &str| {
        v.quotas
            .iter()
            .find(|q| &*q.policy == name)
            .map(|q| q.remaining)
    };
    let (l, _) = limiter(&config("get:/api/*", "10.0.0.0/8"));
    assert_eq!(
        get(&l, "/api/x", "10.1.1.1", None).outcome,
        Outcome::Admitted
    );
    for (charged, (endpoint, ip)) in [
        ("GET:/API/*", "::ffff:10.0.0.0/104"),
        (" Get:/Api/* ", "10.0.0.1/8"),
    ]
    .into_iter()
    .enumerate()
    {
        let charged = charged as u64 + 2;
        l.reload(HttpConfig::from_toml_str(&config(endpoint, ip)).unwrap())
            .unwrap();
        let v = get(&l, "/api/x", "10.1.1.1", None);
        assert_eq!(v.outcome, Outcome::Admitted);
        assert_eq!(
            (remaining(&v, "api"), remaining(&v, "office")),
            (Some(3 - charged), Some(5 - charged)),
            "{endpoint:?} / {ip:?}: a rule that did not change lost its count"
        );
    }
    let v = get(&l, "/api/x", "10.1.1.1", None);
    assert_eq!(
        reason(&v).map(|r| r.1),
        Some("api".to_owned()),
        "4th request in the minute"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A reload that rewrites a rule's pattern in another case or with spaces around it, with
    /// its limit changed or not, keeps its count: the next request sees the new limit less the
    /// requests already admitted in the window.
    #[test]
    fn reload_rewriting_a_pattern_keeps_the_count(
        upper in proptest::collection::vec(any::<bool>(), 16),
        spaces in 0usize..3,
        before in 0u32..4,
        new_limit in 1u32..8,
    ) {
        let written: String = "get:/api/items/*"
            .chars()
            .zip(&upper)
            .map(|(c, &u)| if u { c.to_ascii_uppercase() } else { c })
            .collect();
        let pad = " ".repeat(spaces);
        let config = |endpoint: &str, limit: u32| {
            HttpConfig::from_toml_str(&format!(
                "[[rules]]\nname = \"items\"\nendpoint = \"{endpoint}\"\nperiod = \"1h\"\nlimit = {limit}\n"
            ))
            .unwrap()
        };
        let l = HttpLimiter::with_clock(config("get:/api/items/*", 4), ManualClock::new()).unwrap();
        for _ in 0..before {
            prop_assert_eq!(get(&l, "/api/items/1", "1.1.1.1", None).outcome, Outcome::Admitted);
        }
        l.reload(config(&format!("{pad}{written}{pad}"), new_limit)).unwrap();
        let v = get(&l, "/api/items/1", "1.1.1.1", None);
        if before < new_limit {
            prop_assert_eq!(&v.outcome, &Outcome::Admitted);
            prop_assert_eq!(v.quotas[0].remaining, u64::from(new_limit - before - 1));
        } else {
            prop_assert!(reason(&v).is_some(), "{} admitted before, limit {}", before, new_limit);
        }
    }
}

/// An unnamed rule is named after its pattern as written (`GET:/api/*-1m`), but a reload that
/// only rewrites the pattern keeps its count all the same.
#[test]
fn reload_keeps_counters_of_an_unnamed_rule_written_differently() {
    let config = |endpoint: &str| {
        HttpConfig::from_toml_str(&format!(
            "[[rules]]\nendpoint = \"{endpoint}\"\nperiod = \"1m\"\nlimit = 2\n"
        ))
        .unwrap()
    };
    let l = HttpLimiter::with_clock(config("get:/api/*"), ManualClock::new()).unwrap();
    assert_eq!(
        get(&l, "/api/x", "1.1.1.1", None).outcome,
        Outcome::Admitted
    );
    l.reload(config("GET:/API/*")).unwrap();
    let v = get(&l, "/api/x", "1.1.1.1", None);
    assert_eq!(v.outcome, Outcome::Admitted);
    assert_eq!(
        &*v.quotas[0].policy, "GET:/API/*-1m",
        "the name is the pattern as written"
    );
    assert_eq!(v.quotas[0].remaining, 0, "the count of 1 was kept");
    assert!(reason(&get(&l, "/api/x", "1.1.1.1", None)).is_some());
}

/// A full ban list says so once at warn (naming the setting to raise), not once per request.
#[test]
fn a_full_ban_list_warns_once() {
    let (l, _) = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1m\"\nlimit = 1\n\
         [bans]\nafter = 5\nwithin = \"1m\"\nduration = \"10m\"\nmax_entries = 1\n",
    );
    let logged = warnings_of(|| {
        get(&l, "/", "10.0.0.1", None);
        get(&l, "/", "10.0.0.1", None); // rejected: the list's one entry
        for ip in ["10.0.0.2", "10.0.0.3", "10.0.0.4"] {
            get(&l, "/", ip, None);
            get(&l, "/", ip, None); // rejected: no room to count it
        }
    });
    assert_eq!(logged.matches("ban list full").count(), 1, "{logged}");
    assert!(logged.contains("bans.max_entries"), "{logged}");
}

/// The semantics `HttpLimiter` documents, as a model: a rule of the model's configurations.
#[derive(Debug, Clone)]
struct ModelRule {
    /// An index into `MODEL_ENDPOINTS`.
    endpoint: usize,
    period_s: u64,
    limit: u64,
    /// An index into `MODEL_KEYS`.
    key: usize,
    per_endpoint: bool,
    monitor: bool,
    /// `sliding_window`, else `fixed_window`.
    sliding: bool,
}

const MODEL_ENDPOINTS: [&str; 5] = ["*", "get:/a", "*:/a*", "post:/b", "head:/a"];
const MODEL_KEYS: [&str; 3] = ["ip", "client", "ip_and_client"];

impl ModelRule {
    fn matches(&self, method: &str, path: &str) -> bool {
        match self.endpoint {
            0 => true,
            // `get:` matches `HEAD` too.
            1 => matches!(method, "GET" | "HEAD") && path == "/a",
            2 => path.starts_with("/a"),
            3 => method == "POST" && path == "/b",
            _ => method == "HEAD" && path == "/a",
        }
    }

    /// What `select` groups by: period and counter key.
    fn group(&self) -> (u64, usize, bool) {
        (self.period_s, self.key, self.per_endpoint)
    }
}

fn model_rule() -> impl Strategy<Value = ModelRule> {
    (
        (0..5usize, 1..4u64, 0..4u64),
        (
            0..3usize,
            any::<bool>(),
            prop::bool::weighted(0.2),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((endpoint, period_s, limit), (key, per_endpoint, monitor, sliding))| ModelRule {
                endpoint,
                period_s,
                limit,
                key,
                per_endpoint,
                monitor,
                sliding,
            },
        )
}

fn model_toml(out: &mut String, table: &str, prefix: &str, rules: &[ModelRule]) {
    for (i, r) in rules.iter().enumerate() {
        out.push_str(&format!(
            "[[{table}]]\nname = \"{prefix}{i}\"\nendpoint = \"{}\"\nperiod = \"{}s\"\nlimit = {}\nkey = \"{}\"\nper_endpoint = {}\nmonitor = {}\nalgorithm = \"{}\"\n",
            MODEL_ENDPOINTS[r.endpoint],
            r.period_s,
            r.limit,
            MODEL_KEYS[r.key],
            r.per_endpoint,
            r.monitor,
            if r.sliding { "sliding_window" } else { "fixed_window" },
        ));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Every decision is the one `HttpLimiter`'s documented semantics make, computed by a
    /// model over random rule sets (general, IP and client rules; endpoints, periods, limits
    /// 0 to 3, the three keys, per-endpoint, monitors, fixed and exact sliding windows), a
    /// `missing_key`, bans, an endpoint whitelist and a `whitelist.by_key`: the whitelists,
    /// then bans; specific rules displacing the general ones of their group (period and
    /// counter key), the lowest limit per group; limit 0 and missing keys before counting; the
    /// exact sliding windows charged last; a rejection naming the first rule that rejects, or
    /// another that would reject for longer, and charging none; the quotas of an admission in the rules' order; every `after`-th
    /// rate-limit rejection in a window of `within` starting a ban; monitors never deciding.
    #[test]
    fn decisions_follow_the_documented_semantics(
        general in proptest::collection::vec(model_rule(), 0..4),
        ip_rules in proptest::collection::vec(model_rule(), 0..3),
        client_rules in proptest::collection::vec(model_rule(), 0..3),
        allow_missing in any::<bool>(),
        bans in proptest::option::of((1..4u64, 1..5u64, 1..4u64)),
        whitelisted_endpoint in any::<bool>(),
        exempt_key in proptest::option::of(0..3usize),
        steps in proptest::collection::vec(
            prop_oneof![
                4 => (0..3usize, 0..3usize, 0..3usize, 0..3usize).prop_map(Some),
                1 => Just(None),
            ],
            1..40,
        ),
    ) {
        let mut doc = format!(
            "missing_key = \"{}\"\n",
            if allow_missing { "allow" } else { "reject" }
        );
        if whitelisted_endpoint {
            doc.push_str("[whitelist]\nendpoints = [\"post:/a*\"]\n");
        }
        if let Some(key) = exempt_key {
            doc.push_str(&format!(
                "[[whitelist.by_key]]\nkey = \"{}\"\nips = [\"2.2.2.2\"]\nclients = [\"c2\"]\n",
                MODEL_KEYS[key]
            ));
        }
        if let Some((after, within, duration)) = bans {
            doc.push_str(&format!(
                "[bans]\nafter = {after}\nwithin = \"{within}s\"\nduration = \"{duration}s\"\n"
            ));
        }
        model_toml(&mut doc, "rules", "g", &general);
        if !ip_rules.is_empty() {
            doc.push_str("[[ip_rules]]\nip = \"1.1.1.0/24\"\n");
            model_toml(&mut doc, "ip_rules.rules", "i", &ip_rules);
        }
        if !client_rules.is_empty() {
            doc.push_str("[[client_rules]]\nclient_id = \"c1\"\n");
            model_toml(&mut doc, "client_rules.rules", "c", &client_rules);
        }
        let (l, clock) = limiter(&doc);
        // Every rule with its name; general rules first, then IP rules, then client rules.
        let rules: Vec<(String, bool, &ModelRule)> = general
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("g{i}"), false, r))
            .chain(ip_rules.iter().enumerate().map(|(i, r)| (format!("i{i}"), true, r)))
            .chain(client_rules.iter().enumerate().map(|(i, r)| (format!("c{i}"), true, r)))
            .collect();
        // The admissions of each rule and counter key, in seconds.
        let mut admitted: std::collections::HashMap<(String, String), Vec<u64>> =
            std::collections::HashMap::new();
        // Per IP: the ban window, the rejections counted in it, the end of the ban.
        let mut banned: std::collections::HashMap<&str, (u64, u64, u64)> =
            std::collections::HashMap::new();
        let mut now = 0;
        for step in steps {
            let Some((m, p, i, c)) = step else {
                now += 1;
                clock.advance(Duration::from_secs(1));
                continue;
            };
            let method = ["GET", "POST", "HEAD"][m];
            let path = ["/a", "/a/x", "/b"][p];
            let ip = ["1.1.1.1", "2.2.2.2", "1.1.1.9"][i];
            let client = [None, Some("c1"), Some("c2")][c];
            let http_method = http::Method::from_bytes(method.as_bytes()).unwrap();
            let verdict = l.decide(&req(&http_method, path, ip, client));
            let context = format!("{doc}\nat {now}s: {method} {path} from {ip} {client:?}");

            if whitelisted_endpoint && method == "POST" && path.starts_with("/a") {
                prop_assert_eq!(verdict.outcome, Outcome::Whitelisted, "{}", context);
                continue;
            }
            if bans.is_some() && banned.get(ip).is_some_and(|b| now < b.2) {
                let got = reason(&verdict).map(|r| r.0);
                prop_assert_eq!(got, Some(RejectReason::Banned), "{}", context);
                continue;
            }
            let exempt = exempt_key.filter(|_| ip == "2.2.2.2" || client == Some("c2"));
            let applies = |r: &ModelRule| r.matches(method, path) && Some(r.key) != exempt;
            let specific = |is_specific: bool, name: &str| match &name[..1] {
                "i" => is_specific && ip.starts_with("1.1.1."),
                "c" => is_specific && client == Some("c1"),
                _ => false,
            };
            let select = |monitor: bool| {
                let mut out: Vec<usize> = Vec::new();
                let push = |out: &mut Vec<usize>, e: usize| match out
                    .iter_mut()
                    .find(|o| rules[**o].2.group() == rules[e].2.group())
                {
                    Some(o) if rules[e].2.limit < rules[*o].2.limit => *o = e,
                    Some(_) => {}
                    None => out.push(e),
                };
                let candidates = |e: &usize| rules[*e].2.monitor == monitor && applies(rules[*e].2);
                for e in (0..rules.len()).filter(candidates) {
                    if specific(rules[e].1, &rules[e].0) {
                        push(&mut out, e);
                    }
                }
                let specific_groups: Vec<_> = out.iter().map(|&o| rules[o].2.group()).collect();
                for e in (0..rules.len()).filter(candidates) {
                    if !rules[e].1 && !specific_groups.contains(&rules[e].2.group()) {
                        push(&mut out, e);
                    }
                }
                out
            };
            let enforced = select(false);
            if exempt.is_some() && enforced.is_empty() && select(true).is_empty() {
                prop_assert_eq!(verdict.outcome, Outcome::Whitelisted, "{}", context);
                continue;
            }
            let counter = |r: &ModelRule| {
                let ip = (r.key != 1).then_some(ip);
                let client = if r.key == 0 { Some("") } else { client };
                let endpoint = r.per_endpoint.then(|| {
                    format!("{}:{path}", if method == "HEAD" { "GET" } else { method })
                });
                Some(format!("{:?}|{}|{endpoint:?}", ip, client?))
            };
            let live = |admitted: &std::collections::HashMap<(String, String), Vec<u64>>,
                        name: &str,
                        r: &ModelRule,
                        key: &str| {
                admitted.get(&(name.to_owned(), key.to_owned())).map_or(0, |times| {
                    times
                        .iter()
                        .filter(|&&t| match r.sliding {
                            true => now - t < r.period_s,
                            false => t / r.period_s == now / r.period_s,
                        })
                        .count() as u64
                })
            };
            // Limit 0 first, then missing keys, each in the rules' order; then counting.
            let mut expected = enforced
                .iter()
                .map(|&e| &rules[e])
                .find(|(_, _, r)| r.limit == 0)
                .map(|(name, _, _)| (RejectReason::Blocked, name.clone()));
            let mut plan = Vec::new();
            for &e in enforced.iter().filter(|_| expected.is_none()) {
                let (name, _, r) = &rules[e];
                match counter(r) {
                    None if allow_missing => continue,
                    None => {
                        expected = Some((RejectReason::NoKey, name.clone()));
                        break;
                    }
                    Some(key) => plan.push((name.clone(), *r, key)),
                }
            }
            if expected.is_none() {
                let exhausted =
                    |(name, r, key): &&(String, &ModelRule, String)| live(&admitted, name, r, key) >= r.limit;
                // How long until the rule admits the client again.
                let wait = |(name, r, key): &(String, &ModelRule, String)| match r.sliding {
                    true => admitted[&(name.clone(), key.clone())]
                        .iter()
                        .find(|&&t| now - t < r.period_s)
                        .map_or(0, |&oldest| oldest + r.period_s - now),
                    false => r.period_s - now % r.period_s,
                };
                let exact_first = plan.iter().filter(|p| !p.1.sliding);
                // The first rule charged that rejects, unless another would reject for
                // longer: then the first of those in the rules' order with the longest wait.
                let first = exact_first
                    .chain(plan.iter().filter(|p| p.1.sliding))
                    .find(exhausted);
                expected = first.map(|first| {
                    let mut named = first;
                    for other in plan.iter().filter(exhausted) {
                        if wait(other) > wait(named) {
                            named = other;
                        }
                    }
                    (RejectReason::RateLimited, named.0.clone())
                });
            }
            match expected {
                None => {
                    let mut quotas = Vec::new();
                    for (name, r, key) in &plan {
                        admitted.entry((name.clone(), key.clone())).or_default().push(now);
                        quotas.push((name.clone(), r.limit - live(&admitted, name, r, key)));
                    }
                    let got: Vec<(String, u64)> = verdict
                        .quotas
                        .iter()
                        .map(|q| (q.policy.to_string(), q.remaining))
                        .collect();
                    prop_assert_eq!(&verdict.outcome, &Outcome::Admitted, "{}", context);
                    prop_assert_eq!(got, quotas, "{}", context);
                }
                Some((why, rule)) => {
                    let got = reason(&verdict).map(|r| (r.0, r.1));
                    prop_assert_eq!(got, Some((why, rule)), "{}", context);
                    if let (Some((after, within, duration)), RejectReason::RateLimited) = (bans, why) {
                        let b = banned.entry(ip).or_insert((now / within, 0, 0));
                        if b.0 != now / within {
                            *b = (now / within, 0, b.2);
                        }
                        b.1 += 1;
                        if b.1 == after {
                            *b = (b.0, 0, now + duration);
                        }
                    }
                }
            }
        }
    }
}

/// A per-IP and a per-client limit on the same endpoint and period, and a monitor rule
/// shadowing one, are rules one writes without naming them. Their default names
/// (`"{endpoint}-{period}"`) collided, and the configuration was refused as a "duplicate rule
/// name" at `rules[1].name`, a field nobody wrote. The later ones now take the default name
/// with what tells them apart (`*-1m-client`, `*-1m-ip-monitor`), each counting on its own; the
/// first keeps its name. The same rule twice is still refused, and says why.
#[test]
fn unnamed_rules_that_differ_only_in_key_or_monitor_get_distinct_names() {
    let toml = "client_id_header = \"x-client\"\n\
        [[rules]]\nperiod = \"1m\"\nlimit = 2\n\
        [[rules]]\nperiod = \"1m\"\nlimit = 1\nkey = \"client\"\n\
        [[rules]]\nperiod = \"1m\"\nlimit = 1\nmonitor = true\n";
    let (l, _clock) = limiter(toml);
    let first = get(&l, "/", "1.2.3.4", Some("c"));
    assert_eq!(first.outcome, Outcome::Admitted);
    let mut policies: Vec<&str> = first.quotas.iter().map(|q| &*q.policy).collect();
    policies.sort_unstable();
    assert_eq!(policies, ["*-1m", "*-1m-client"]);
    // The client's limit (1) is spent; another client on the same IP is not.
    let second = get(&l, "/", "1.2.3.4", Some("c"));
    assert_eq!(reason(&second).map(|r| r.1), Some("*-1m-client".to_owned()));
    assert_eq!(
        get(&l, "/", "1.2.3.4", Some("d")).outcome,
        Outcome::Admitted
    );
    // The IP's limit (2) is spent now; the monitor rule (`*-1m-ip-monitor`, limit 1) rejects
    // nothing.
    assert_eq!(
        reason(&get(&l, "/", "1.2.3.4", Some("e"))).map(|r| r.1),
        Some("*-1m".to_owned())
    );
    let twice = "[[rules]]\nperiod = \"1m\"\nlimit = 2\n".repeat(3);
    let e = err(&twice);
    assert!(
        e.starts_with("rules[2].name: duplicate rule name \"*-1m\": an earlier rule counts"),
        "{e}"
    );
}

/// Two configuration mistakes that loaded without a word: a `[backend]` `failure` or
/// `deadline` misspelt under `kind = "memory"` (read only once the kind is switched to
/// "redis", and refused only then), and a JSON document whose top level is a list (serde_json
/// reads an empty one as every setting at its default: no rule at all).
#[test]
fn backend_settings_and_a_list_document_are_checked_even_where_unused() {
    assert!(
        err("[backend]\nfailure = \"bogus\"\n")
            .starts_with("backend.failure: \"bogus\" is not a failure policy"),
        "{}",
        err("[backend]\nfailure = \"bogus\"\n")
    );
    assert!(err("[backend]\ndeadline = \"5x\"\n").starts_with("backend.deadline:"));
    assert!(
        limiter("[backend]\nkind = \"memory\"\nfailure = \"fallback:0.5\"\ndeadline = \"20ms\"\n")
            .0
            .decide(&req(&http::Method::GET, "/", "1.2.3.4", None))
            .outcome
            .is_admitted()
    );
    for loaded in [
        HttpConfig::from_json_str("[]"),
        HttpConfig::from_json_str("[{\"rules\": []}]"),
    ] {
        let e = loaded.unwrap_err().to_string();
        assert!(
            e.contains("json") && e.contains("must be an object of settings"),
            "{e}"
        );
    }
    // YAML refused it already.
    assert!(HttpConfig::from_yaml_str("- rules: []\n").is_err());
    assert_eq!(
        HttpConfig::from_yaml_str("").unwrap(),
        HttpConfig::default(),
        "an empty YAML document is the defaults"
    );
    assert_eq!(
        HttpConfig::from_json_str("{}").unwrap(),
        HttpConfig::default()
    );
}

/// A `per_endpoint` rule counts a method sent in lower case (`get`, an extension method to
/// `http`, which the rule's pattern matches case-insensitively) as the upper-case one: counted
/// apart, a client sending both got the endpoint's quota twice.
#[test]
fn a_per_endpoint_count_is_one_whatever_the_methods_case() {
    let (l, _clock) = limiter(
        "[[rules]]\nendpoint = \"get:/x\"\nperiod = \"1m\"\nlimit = 1\nper_endpoint = true\n",
    );
    assert_eq!(get(&l, "/x", "1.2.3.4", None).outcome, Outcome::Admitted);
    let lower = http::Method::from_bytes(b"get").unwrap();
    let again = l.decide(&req(&lower, "/x", "1.2.3.4", None));
    assert_eq!(reason(&again).map(|r| r.1), Some("get:/x-1m".to_owned()));
}

/// An unnamed rule keeps its counts across a reload that adds, before it, an unnamed rule of
/// the same endpoint and period counting by another key, or that swaps the two: the rule did
/// not change. Its identity followed the name it was given to tell it from an earlier rule
/// (`*-1m-ip` once a per-client `*-1m` came first), so either reload started it afresh.
#[test]
fn an_unnamed_rule_keeps_its_counts_when_a_sibling_is_added_before_it_or_swapped() {
    let per_ip = "[[rules]]\nperiod = \"1m\"\nlimit = 2\n";
    let per_client = "[[rules]]\nperiod = \"1m\"\nlimit = 3\nkey = \"client\"\n";
    let config = |rules: &[&str]| {
        HttpConfig::from_toml_str(&format!(
            "client_id_header = \"x-client\"\n{}",
            rules.concat()
        ))
        .unwrap()
    };
    let l = HttpLimiter::with_clock(config(&[per_ip]), ManualClock::new()).unwrap();
    assert_eq!(
        get(&l, "/", "1.2.3.4", Some("c")).outcome,
        Outcome::Admitted
    );
    // A per-client rule added first: the per-IP rule is now named `*-1m-ip`, and counted on.
    l.reload(config(&[per_client, per_ip])).unwrap();
    assert_eq!(
        get(&l, "/", "1.2.3.4", Some("c")).outcome,
        Outcome::Admitted
    );
    let v = get(&l, "/", "1.2.3.4", Some("d"));
    assert_eq!(
        reason(&v).map(|r| r.1),
        Some("*-1m-ip".to_owned()),
        "the IP's third request in the minute"
    );
    // Swapped back: each rule keeps its count (the IP's 2 of 2, client c's 1 of 3; a rejected
    // request is charged to no rule).
    l.reload(config(&[per_ip, per_client])).unwrap();
    assert_eq!(
        reason(&get(&l, "/", "1.2.3.4", Some("c"))).map(|r| r.1),
        Some("*-1m".to_owned())
    );
    let v = get(&l, "/", "5.6.7.8", Some("c"));
    assert_eq!(v.outcome, Outcome::Admitted);
    let client = v
        .quotas
        .iter()
        .find(|q| &*q.policy == "*-1m-client")
        .unwrap();
    assert_eq!(client.remaining, 1, "client c's second request of 3");
}

/// A reload that writes an unnamed rule's period otherwise (`60s`, then `1m`) keeps its count,
/// as one that rewrites its pattern does: the rule did not change. Its identity took the
/// period as written, so the count started afresh.
#[test]
fn reload_keeps_counters_of_an_unnamed_rule_whose_period_is_written_differently() {
    let config = |period: &str| {
        HttpConfig::from_toml_str(&format!("[[rules]]\nperiod = \"{period}\"\nlimit = 2\n"))
            .unwrap()
    };
    let l = HttpLimiter::with_clock(config("60s"), ManualClock::new()).unwrap();
    assert_eq!(get(&l, "/", "1.1.1.1", None).outcome, Outcome::Admitted);
    for period in ["1m", " 1m ", "60000ms"] {
        l.reload(config(period)).unwrap();
    }
    let v = get(&l, "/", "1.1.1.1", None);
    assert_eq!(v.outcome, Outcome::Admitted);
    assert_eq!(v.quotas[0].remaining, 0, "the count of 1 was kept");
    assert!(reason(&get(&l, "/", "1.1.1.1", None)).is_some());
}
