//! Requests that wait for their rule (`queue_limit`, `max_wait`) instead of being rejected at
//! once: on tokio's paused time, with the rules' limiters on the same clock (`TokioClock`).

#![cfg(feature = "http")]

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use turnstile::TokioClock;
use turnstile::http::{
    HttpConfig, HttpConfigError, HttpLimiter, Outcome, PeerAddr, RejectReason, RequestInfo, Verdict,
};

fn limiter(toml: &str) -> Arc<HttpLimiter<TokioClock>> {
    let config = HttpConfig::from_toml_str(toml).unwrap();
    Arc::new(HttpLimiter::with_clock(config, TokioClock::new()).unwrap())
}

fn from(ip: &str) -> RequestInfo<'static> {
    RequestInfo {
        method: &http::Method::GET,
        path: "/",
        client_ip: Some(ip.parse::<IpAddr>().unwrap()),
        client_id: None,
    }
}

async fn decide(limiter: &HttpLimiter<TokioClock>, ip: &str) -> Verdict {
    limiter.decide_async(&from(ip)).await
}

fn retry_after(verdict: &Verdict) -> Option<Duration> {
    match &verdict.outcome {
        Outcome::Rejected {
            reason: RejectReason::RateLimited,
            retry_after,
            ..
        } => *retry_after,
        other => panic!("expected a rate-limit rejection, got {other:?}"),
    }
}

const ONE_PER_SECOND_QUEUE_2: &str = "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\n\
                                      queue_limit = 2\nmax_wait = \"3s\"\n";

/// The 2nd request of a 1-per-second rule waits for the next window and is admitted then;
/// the 3rd waits for the one after.
#[tokio::test(start_paused = true)]
async fn a_request_over_the_limit_waits_for_its_window() {
    let limiter = limiter(ONE_PER_SECOND_QUEUE_2);
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    assert_eq!(start.elapsed(), Duration::ZERO);
    let second = decide(&limiter, "192.0.2.1").await;
    assert!(second.outcome.is_admitted(), "{second:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(second.quotas[0].remaining, 0);
    // Another client was never held up.
    let other = Instant::now();
    assert!(decide(&limiter, "192.0.2.2").await.outcome.is_admitted());
    assert_eq!(other.elapsed(), Duration::ZERO);
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

/// `queue_limit` requests wait at once; the next is rejected at once, with the exact
/// retry-after, and the waiting ones are admitted in the windows that follow.
#[tokio::test(start_paused = true)]
async fn a_full_queue_rejects_at_once() {
    let limiter = limiter(ONE_PER_SECOND_QUEUE_2);
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { decide(&limiter, "192.0.2.1").await })
        })
        .collect();
    // Let both reach the queue.
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    let third = decide(&limiter, "192.0.2.1").await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Told when it fits behind the two: the window after theirs (it said 1 s, the first
    // waiter's window, and a retry then was refused again).
    assert_eq!(retry_after(&third), Some(Duration::from_secs(3)));
    let mut admitted_at = Vec::new();
    for task in waiting {
        let verdict = task.await.unwrap();
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        admitted_at.push(start.elapsed());
    }
    // Both waited from the first window; one per window, oldest first: at 1 s and 2 s.
    assert_eq!(admitted_at, [1, 2].map(Duration::from_secs));
    // The queue is empty again: two more may wait.
    let again = decide(&limiter, "192.0.2.1").await;
    assert!(again.outcome.is_admitted());
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

/// A request whose answer would come after `max_wait` is rejected at once: waiting would only
/// end in the same rejection.
#[tokio::test(start_paused = true)]
async fn a_wait_beyond_max_wait_is_rejected_at_once() {
    let limiter = limiter(
        "[[rules]]\nperiod = \"10s\"\nlimit = 1\nqueue_limit = 5\nmax_wait = \"2s\"\n\
         [bans]\nafter = 2\nwithin = \"1m\"\nduration = \"1h\"\n",
    );
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let late = decide(&limiter, "192.0.2.1").await;
    assert_eq!(retry_after(&late), Some(Duration::from_secs(10)));
    assert_eq!(start.elapsed(), Duration::ZERO);
    // A final rejection counts towards a ban as any other: the second bans.
    let _ = decide(&limiter, "192.0.2.1").await;
    let banned = decide(&limiter, "192.0.2.1").await;
    assert!(
        matches!(
            banned.outcome,
            Outcome::Rejected {
                reason: RejectReason::Banned,
                ..
            }
        ),
        "{banned:?}"
    );
}

/// A client banned while one of its requests waits is rejected as banned when the request's turn
/// comes ("decided again as a new request is, from step 0 on"), and the request charges no
/// rule: the permit of `a` its wait got is given back (after an unban the client has it at
/// once, in the same window), and `b` counts the first request only.
#[tokio::test(start_paused = true)]
async fn a_waiting_request_of_a_client_banned_meanwhile_is_rejected_as_banned_uncharged() {
    let limiter = limiter(
        "[[rules]]\nname = \"a\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\nmax_wait = \"5s\"\n\
         [[rules]]\nname = \"b\"\nperiod = \"1m\"\nlimit = 10\n\
         [bans]\nafter = 1\nwithin = \"1m\"\nduration = \"1h\"\n",
    );
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let waiting = waiter(&limiter, from("192.0.2.1")).await;
    // The queue is full: this one is rejected at once (told to come back after the waiting
    // request's turn), and that rejection bans the client.
    assert_eq!(
        retry_after(&decide(&limiter, "192.0.2.1").await),
        Some(Duration::from_secs(2))
    );
    let (verdict, at) = waiting.await.unwrap();
    assert!(
        matches!(
            verdict.outcome,
            Outcome::Rejected {
                reason: RejectReason::Banned,
                ..
            }
        ),
        "{verdict:?}"
    );
    assert_eq!(at - start, Duration::from_secs(1), "when its turn came");
    assert!(limiter.unban("192.0.2.1".parse().unwrap()));
    let next = limiter.decide(&from("192.0.2.1"));
    assert!(next.outcome.is_admitted(), "{next:?}");
    let b = next.quotas.iter().find(|q| &*q.policy == "b").unwrap();
    assert_eq!(b.remaining, 8, "{next:?}");
}

/// `max_wait` defaults to the rule's period: a fixed window's next window is always within it.
#[tokio::test(start_paused = true)]
async fn max_wait_defaults_to_the_period() {
    let limiter = limiter("[[rules]]\nperiod = \"5s\"\nlimit = 1\nqueue_limit = 1\n");
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

/// A request that waited and was admitted is no rejection: it counts nothing towards a ban.
#[tokio::test(start_paused = true)]
async fn an_admitted_wait_counts_nothing_towards_a_ban() {
    let limiter = limiter(
        "[[rules]]\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\n\
         [bans]\nafter = 1\nwithin = \"1m\"\nduration = \"1h\"\n",
    );
    for _ in 0..5 {
        let verdict = decide(&limiter, "192.0.2.1").await;
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    }
}

/// A waiting request dropped (its client gone) leaves the queue at once and took nothing.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_the_queue() {
    let limiter = limiter("[[rules]]\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\n");
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { decide(&limiter, "192.0.2.1").await })
    };
    tokio::task::yield_now().await;
    // The queue is full now: another is rejected at once.
    assert!(!decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    let start = Instant::now();
    let verdict = decide(&limiter, "192.0.2.1").await;
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

/// The synchronous `decide` never waits: it answers the rejection.
#[tokio::test(start_paused = true)]
async fn decide_never_waits() {
    let limiter = limiter(ONE_PER_SECOND_QUEUE_2);
    assert!(limiter.decide(&from("192.0.2.1")).outcome.is_admitted());
    let verdict = limiter.decide(&from("192.0.2.1"));
    assert_eq!(retry_after(&verdict), Some(Duration::from_secs(1)));
}

/// A request admitted after its wait is decided by every rule again: `minute` had room for
/// the third request when it began to wait for `second`, and none when its turn came (the
/// second request, ahead of it, took it); it is rejected then, with the minute's retry-after,
/// and `second`'s permit is given back.
#[tokio::test(start_paused = true)]
async fn after_its_wait_a_request_meets_every_rule_again() {
    let limiter = limiter(
        "[[rules]]\nname = \"second\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 4\n\
         max_wait = \"5s\"\n\
         [[rules]]\nname = \"minute\"\nperiod = \"1m\"\nlimit = 2\n",
    );
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let second = waiter(&limiter, from("192.0.2.1")).await;
    let third = waiter(&limiter, from("192.0.2.1")).await;
    let (verdict, at) = second.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(at - start, Duration::from_secs(1));
    let (third, at) = third.await.unwrap();
    match &third.outcome {
        Outcome::Rejected {
            reason: RejectReason::RateLimited,
            rule,
            retry_after,
        } => {
            assert_eq!(&**rule, "minute");
            assert_eq!(*retry_after, Some(Duration::from_secs(58)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(at - start, Duration::from_secs(2));
    // `second` was refunded: its window (the one at 2 s) still has its permit.
    let quota = third
        .quotas
        .iter()
        .find(|q| &*q.policy == "second")
        .unwrap();
    assert_eq!(quota.remaining, 1);
}

/// A request that a rule with a queue rejects is not made to wait when another of its rules,
/// without a queue, would still refuse it when the wait's `max_wait` has passed: it is
/// rejected at once, naming that rule, as when that rule comes first, and holds no place in
/// the queue, which every client's requests share. (It waited a second in `per-ip`'s one
/// place, which another client's request then found taken and was rejected at once, and was
/// rejected all the same.)
#[tokio::test(start_paused = true)]
async fn a_request_another_rule_refuses_past_the_wait_is_rejected_at_once() {
    let per_ip = "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\n\
                  queue_limit = 1\nmax_wait = \"5s\"\n";
    let per_client = "[[rules]]\nname = \"per-client\"\nperiod = \"1m\"\nlimit = 1\n\
                      key = \"client\"\n";
    for config in [
        format!("{per_ip}{per_client}"),
        format!("{per_client}{per_ip}"),
    ] {
        let limiter = limiter(&config);
        let start = Instant::now();
        let a = with_client("192.0.2.1", Some("a"));
        assert!(limiter.decide_async(&a).await.outcome.is_admitted());
        let refused = waiter(&limiter, a).await;
        let other = waiter(&limiter, with_client("192.0.2.1", Some("b"))).await;
        let (verdict, at) = refused.await.unwrap();
        assert_eq!(at, start, "{config}: rejected at once");
        match &verdict.outcome {
            Outcome::Rejected { rule, .. } => assert_eq!(&**rule, "per-client", "{config}"),
            other => panic!("{config}: {other:?}"),
        }
        assert_eq!(retry_after(&verdict), Some(Duration::from_secs(60)));
        let (verdict, at) = other.await.unwrap();
        assert!(verdict.outcome.is_admitted(), "{config}: {verdict:?}");
        assert_eq!(at - start, Duration::from_secs(1), "{config}: waited");
    }
}

/// Another rule's refusal that ends within the wait does not stop it: `per-ip` (2 s) and
/// `burst` (1 s) both refuse the second request; it waits for `per-ip`, and `burst` admits it
/// when its turn comes. In either order of the rules: with `burst`, which has no queue, charged
/// first (listed first, or `per-ip` a sliding window, which is charged last), its refusal was
/// answered at once (a 429 with 1 s), where the other order waited.
#[tokio::test(start_paused = true)]
async fn a_request_another_rule_refuses_only_for_part_of_the_wait_waits() {
    let per_ip = "[[rules]]\nname = \"per-ip\"\nperiod = \"2s\"\nlimit = 1\nqueue_limit = 1\n\
                  max_wait = \"5s\"\n";
    let burst = "[[rules]]\nname = \"burst\"\nperiod = \"1s\"\nlimit = 1\n";
    // A sliding window is charged after the other rules, whatever their order.
    let sliding = "algorithm = \"sliding_window\"\n";
    for config in [
        format!("{per_ip}{burst}"),
        format!("{burst}{per_ip}"),
        format!("{per_ip}{sliding}{burst}"),
    ] {
        let limiter = limiter(&config);
        let start = Instant::now();
        assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
        let second = decide(&limiter, "192.0.2.1").await;
        assert!(second.outcome.is_admitted(), "{config}: {second:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(2), "{config}");
        // Charged once by each rule: both are spent until their windows end.
        for quota in &second.quotas {
            assert_eq!(quota.remaining, 0, "{config}: {second:?}");
        }
    }
}

/// A request that a rule with a queue refuses for its rate and a rule full of other clients
/// (`max_keys_per_rule`, `key_overflow = "reject"`) refuses for its key cap is decided the same
/// whichever of the two is charged first: it waits for the rule with a queue (the key cap is
/// not foreseen: a probe of a client the full rule does not hold sees no cap), then meets the
/// full rule when its turn comes, and is refused by it then. With the full rule charged first,
/// it was refused at once (`TooManyKeys`); with the other first, after 1 s.
#[tokio::test(start_paused = true)]
async fn a_request_a_full_rule_refuses_is_decided_alike_in_either_order() {
    let q = "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"client\"\n\
             queue_limit = 1\nmax_wait = \"5s\"\n";
    let by_ip = "[[rules]]\nname = \"by-ip\"\nperiod = \"1m\"\nlimit = 100\nkey = \"ip\"\n";
    for rules in [format!("{q}{by_ip}"), format!("{by_ip}{q}")] {
        let config = format!("max_keys_per_rule = 1\n{rules}");
        let limiter = limiter(&config);
        let start = Instant::now();
        let first = limiter
            .decide_async(&with_client("10.0.0.1", Some("x")))
            .await;
        assert!(first.outcome.is_admitted(), "{config}: {first:?}");
        // q has spent x's one request for 1 s; by-ip, holding 10.0.0.1, has no room for
        // 10.0.0.2.
        let second = limiter
            .decide_async(&with_client("10.0.0.2", Some("x")))
            .await;
        assert!(
            matches!(
                &second.outcome,
                Outcome::Rejected { reason: RejectReason::TooManyKeys, rule, .. } if &**rule == "by-ip"
            ),
            "{config}: {second:?}"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(1), "{config}");
        // Charged to no rule: x's next request is admitted at once.
        let third = limiter
            .decide_async(&with_client("10.0.0.1", Some("x")))
            .await;
        assert!(third.outcome.is_admitted(), "{config}: {third:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(1), "{config}");
    }
}

/// A rule with a queue that a request would meet only on the rule's shared overflow counter
/// (`key_overflow = "shared"`, the rule full of other clients) is not waited for when another
/// rule, charged first, refuses the request for its rate: a refusal by the shared counter is
/// not one of the client's own counter, which alone a request waits for, as when the rule
/// with the queue is charged first (rejected at once then). The probe of that rule took the
/// shared counter's refusal for the client's own, and the request waited for a counter the
/// rule does not hold for it, then was admitted 1 s later.
#[tokio::test(start_paused = true)]
async fn a_later_rule_refusing_on_its_shared_counter_is_not_waited_for() {
    let by_ip = "[[rules]]\nname = \"by-ip\"\nperiod = \"1s\"\nlimit = 1\nkey = \"ip\"\n";
    let q = "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"client\"\n\
             queue_limit = 5\nmax_wait = \"5s\"\n";
    for rules in [format!("{by_ip}{q}"), format!("{q}{by_ip}")] {
        let config = format!("max_keys_per_rule = 1\nkey_overflow = \"shared\"\n{rules}");
        let limiter = limiter(&config);
        let start = Instant::now();
        // Each rule holds its one client (10.0.0.1, "a"), and its shared counter counts the
        // next (10.0.0.2, "b"): both spent for 1 s.
        for (ip, client) in [("10.0.0.1", "a"), ("10.0.0.2", "b")] {
            let verdict = limiter.decide_async(&with_client(ip, Some(client))).await;
            assert!(verdict.outcome.is_admitted(), "{config}: {verdict:?}");
        }
        // by-ip refuses 10.0.0.1's counter for its rate; q has no room for "c", and its
        // shared counter is spent.
        let verdict = limiter
            .decide_async(&with_client("10.0.0.1", Some("c")))
            .await;
        assert!(
            matches!(verdict.outcome, Outcome::Rejected { .. }),
            "{config}: {verdict:?}"
        );
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "{config}: rejected at once"
        );
    }
}

/// Through the layer: the waiting request's response comes when it is admitted, with its
/// headers.
#[tokio::test(start_paused = true)]
async fn the_layer_answers_a_waiting_request_when_it_is_admitted() {
    let limiter = limiter(ONE_PER_SECOND_QUEUE_2);
    let service = limiter
        .layer()
        .layer(tower::service_fn(|_: http::Request<String>| {
            std::future::ready(Ok::<_, Infallible>(http::Response::new(String::from("ok"))))
        }));
    let request = || {
        let mut request = http::Request::new(String::new());
        request
            .extensions_mut()
            .insert(PeerAddr("192.0.2.1:4000".parse().unwrap()));
        request
    };
    let start = Instant::now();
    let first = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), 200);
    let second = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(second.headers()["ratelimit"], "\"per-ip\";r=0;t=1");
}

/// What cannot wait is refused when the configuration loads, naming the field.
#[test]
fn queue_settings_are_validated() {
    let error = |toml: &str| match HttpLimiter::new(HttpConfig::from_toml_str(toml).unwrap()) {
        Err(HttpConfigError::Invalid { field, message }) => format!("{field}: {message}"),
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(
        error("[[rules]]\nperiod = \"1s\"\nlimit = 1\nmax_wait = \"1s\"\n"),
        "rules[0].max_wait: needs queue_limit: without it no request waits"
    );
    assert_eq!(
        error("[[rules]]\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\nmonitor = true\n"),
        "rules[0].queue_limit: a monitor rule rejects nothing, so nothing waits for it"
    );
    assert_eq!(
        error("[[rules]]\nperiod = \"1s\"\nlimit = 0\nqueue_limit = 1\n"),
        "rules[0].queue_limit: a rule of limit 0 blocks: a request waiting for it would never pass"
    );
    assert!(
        error("[[rules]]\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\nmax_wait = \"0s\"\n")
            .starts_with("rules[0].max_wait: ")
    );
    assert!(
        error(
            "[[ip_rules]]\nip = \"10.0.0.0/8\"\n[[ip_rules.rules]]\nperiod = \"1s\"\nlimit = 1\n\
         max_wait = \"soon\"\nqueue_limit = 1\n"
        )
        .starts_with("ip_rules[0].rules[0].max_wait: \"soon\" is not a duration")
    );
}

/// With the Redis backend, a rule's queue is refused before any connection is tried.
#[cfg(feature = "redis")]
#[tokio::test]
async fn queues_need_the_memory_backend() {
    let config = HttpConfig::from_toml_str(
        "[[rules]]\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\n\
         [backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1/\"\n",
    )
    .unwrap();
    match HttpLimiter::connect(config).await {
        Err(HttpConfigError::Invalid { field, message }) => {
            assert_eq!(field, "rules[0].queue_limit");
            assert_eq!(message, "waiting is available with the memory backend only");
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

fn with_client(ip: &str, client: Option<&'static str>) -> RequestInfo<'static> {
    RequestInfo {
        method: &http::Method::GET,
        path: "/",
        client_ip: Some(ip.parse::<IpAddr>().unwrap()),
        client_id: client,
    }
}

/// A reload keeps a rule's count of waiting requests: with the one place of `queue_limit = 1`
/// taken, a reload of the same configuration does not let a second request wait.
#[tokio::test(start_paused = true)]
async fn a_reload_does_not_reset_the_queue_count() {
    let toml =
        "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 1\nmax_wait = \"5s\"\n";
    let limiter = Arc::new(
        HttpLimiter::with_clock(HttpConfig::from_toml_str(toml).unwrap(), TokioClock::new())
            .unwrap(),
    );
    assert!(
        limiter
            .decide_async(&with_client("192.0.2.1", None))
            .await
            .outcome
            .is_admitted()
    );
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.decide_async(&with_client("192.0.2.1", None)).await })
    };
    tokio::task::yield_now().await;
    // The queue is full: another is rejected at once.
    let start = tokio::time::Instant::now();
    assert!(
        !limiter
            .decide_async(&with_client("192.0.2.1", None))
            .await
            .outcome
            .is_admitted()
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    limiter
        .reload(HttpConfig::from_toml_str(toml).unwrap())
        .unwrap();
    // Still one waiting: the queue is still full.
    let start = tokio::time::Instant::now();
    let verdict = limiter.decide_async(&with_client("192.0.2.1", None)).await;
    let waited = start.elapsed();
    let _ = waiter.await;
    assert_eq!(
        (verdict.outcome.is_admitted(), waited),
        (false, Duration::ZERO),
        "a second request waited although the queue (limit 1) was full: {verdict:?}"
    );
}

#[cfg(feature = "metrics")]
#[path = "common/tally.rs"]
mod tally;

/// `turnstile_http_key_overflow` counts a request of a client a rule had no room for once,
/// though a request that waits for another rule is decided again after its wait; whether the
/// full rule is reached in the first decision (`fixed_window`, charged in the rules' order) or
/// only after the wait (`sliding_window`, charged after the rules that refund exactly, so the
/// waiting rule rejected before it was reached: it was not counted at all).
#[cfg(feature = "metrics")]
#[test]
fn a_waiting_request_counts_its_key_overflow_once() {
    for algorithm in ["fixed_window", "sliding_window"] {
        waiting_request_counts_its_key_overflow_once(algorithm);
    }
}

#[cfg(feature = "metrics")]
fn waiting_request_counts_its_key_overflow_once(algorithm: &str) {
    let tally = tally::Tally::default();
    let counts = tally.0.clone();
    let config = HttpConfig::from_toml_str(&format!(
        "max_keys_per_rule = 1\nkey_overflow = \"allow\"\n\
         [[rules]]\nname = \"by-ip\"\nperiod = \"1m\"\nlimit = 100\nkey = \"ip\"\nalgorithm = \"{algorithm}\"\n\
         [[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"client\"\nqueue_limit = 5\n",
    ))
    .unwrap();
    metrics::with_local_recorder(&tally, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let limiter = HttpLimiter::with_clock(config, TokioClock::new()).unwrap();
            // 10.0.0.1 fills `by-ip` (one key), "x" fills `q`.
            assert!(
                limiter
                    .decide_async(&with_client("10.0.0.1", Some("x")))
                    .await
                    .outcome
                    .is_admitted()
            );
            // Another IP, same client: `by-ip` has no room (allowed, counted), `q` rejects: waits 1 s.
            let start = tokio::time::Instant::now();
            let v = limiter
                .decide_async(&with_client("10.0.0.2", Some("x")))
                .await;
            assert!(v.outcome.is_admitted(), "{v:?}");
            assert_eq!(start.elapsed(), Duration::from_secs(1));
        });
    });
    let n = |k: &str| counts.lock().unwrap().get(k).copied().unwrap_or(0);
    assert_eq!(n("turnstile_http_waited{q}"), 1, "{algorithm}");
    assert_eq!(
        n("turnstile_http_key_overflow{by-ip}"),
        1,
        "one request, one overflow ({algorithm})"
    );
}

/// A request that waits across a reload is decided again under the configuration in force
/// then, all of it: its rule's limiter is the one the reload reconfigured, so the quota its
/// headers report must name the new limit beside the count made under it. It reported the
/// limit of the configuration it arrived under with the remaining of the new one (limit 1,
/// remaining 2).
#[tokio::test(start_paused = true)]
async fn a_request_waiting_across_a_reload_reports_the_new_limit_with_its_count() {
    let rule = |limit: u32| {
        format!(
            "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = {limit}\nqueue_limit = 1\n\
             max_wait = \"5s\"\n"
        )
    };
    let limiter = limiter(&rule(1));
    let first = decide(&limiter, "192.0.2.1").await;
    assert_eq!((first.quotas[0].limit, first.quotas[0].remaining), (1, 0));
    let start = Instant::now();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { decide(&limiter, "192.0.2.1").await })
    };
    tokio::task::yield_now().await;
    limiter
        .reload(HttpConfig::from_toml_str(&rule(3)).unwrap())
        .unwrap();
    let waited = waiter.await.unwrap();
    assert!(waited.outcome.is_admitted(), "{waited:?}");
    // At once, in the first window: the reload raised the limit it waited for, and ended its
    // sleep (it slept out the retry-after the old limit gave it, a second).
    assert_eq!(start.elapsed(), Duration::ZERO);
    let quota = &waited.quotas[0];
    assert_eq!(
        (quota.limit, quota.remaining),
        (3, 1),
        "the limit and the count of one configuration: {quota:?}"
    );
    // And the request after it is counted under the same configuration.
    let next = decide(&limiter, "192.0.2.1").await;
    assert_eq!((next.quotas[0].limit, next.quotas[0].remaining), (3, 0));
}

/// A request that waits across a reload that keeps its rule keeps its place in the rule's
/// queue: rejected again under the lowered limit, it waits on (a full queue of one does not
/// turn it away for the place it holds itself), and is admitted under the new limit.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_across_a_reload_keeps_its_rules_count_of_waiting_requests() {
    let rule = |limit: u32| {
        format!(
            "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = {limit}\n\
             algorithm = \"sliding_window\"\nqueue_limit = 1\nmax_wait = \"5s\"\n"
        )
    };
    let limiter = limiter(&rule(2));
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    // Full until the first request's second ends, at 1 s.
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { decide(&limiter, "192.0.2.1").await })
    };
    tokio::task::yield_now().await;
    limiter
        .reload(HttpConfig::from_toml_str(&rule(1)).unwrap())
        .unwrap();
    // At 1 s the request of 0.5 s still fills the lowered limit: the waiter waits for 1.5 s.
    let waited = waiter.await.unwrap();
    assert!(waited.outcome.is_admitted(), "{waited:?}");
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    let quota = &waited.quotas[0];
    assert_eq!((quota.limit, quota.remaining), (1, 0), "{quota:?}");
}

/// The key overflow of a request that waits across a reload is still counted once: the
/// rules of the reload's configuration are other objects, and the full rule the request met
/// before its wait, kept by the reload, is met again after it.
#[cfg(feature = "metrics")]
#[test]
fn a_request_waiting_across_a_reload_counts_its_key_overflow_once() {
    let tally = tally::Tally::default();
    let counts = tally.0.clone();
    let toml = "max_keys_per_rule = 1\nkey_overflow = \"allow\"\n\
         [[rules]]\nname = \"by-ip\"\nperiod = \"1m\"\nlimit = 100\nkey = \"ip\"\n\
         [[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"client\"\nqueue_limit = 5\n";
    metrics::with_local_recorder(&tally, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let limiter = Arc::new(
                HttpLimiter::with_clock(
                    HttpConfig::from_toml_str(toml).unwrap(),
                    TokioClock::new(),
                )
                .unwrap(),
            );
            assert!(
                limiter
                    .decide_async(&with_client("10.0.0.1", Some("x")))
                    .await
                    .outcome
                    .is_admitted()
            );
            let waiter = {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    limiter
                        .decide_async(&with_client("10.0.0.2", Some("x")))
                        .await
                })
            };
            tokio::task::yield_now().await;
            limiter
                .reload(HttpConfig::from_toml_str(toml).unwrap())
                .unwrap();
            let v = waiter.await.unwrap();
            assert!(v.outcome.is_admitted(), "{v:?}");
        });
    });
    let n = |k: &str| counts.lock().unwrap().get(k).copied().unwrap_or(0);
    assert_eq!(n("turnstile_http_waited{q}"), 1);
    assert_eq!(
        n("turnstile_http_key_overflow{by-ip}"),
        1,
        "one request, one overflow"
    );
}

/// And when the reload leaves the full rule alone (the one-rule path of the decision): the
/// request met it before its wait, counted, and meets it again after the reload, which ends
/// the wait. That path counted it again.
/// Whether the full rule lets the client pass uncounted or counts it on its shared counter.
#[cfg(feature = "metrics")]
#[test]
fn a_request_waiting_across_a_reload_to_one_rule_counts_its_key_overflow_once() {
    for policy in ["allow", "shared"] {
        waiting_across_a_reload_to_one_rule_counts_its_key_overflow_once(policy);
    }
}

#[cfg(feature = "metrics")]
fn waiting_across_a_reload_to_one_rule_counts_its_key_overflow_once(policy: &str) {
    let tally = tally::Tally::default();
    let counts = tally.0.clone();
    let by_ip = format!(
        "max_keys_per_rule = 1\nkey_overflow = \"{policy}\"\n\
         [[rules]]\nname = \"by-ip\"\nperiod = \"1m\"\nlimit = 100\nkey = \"ip\"\n"
    );
    let both = format!(
        "{by_ip}[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\nkey = \"client\"\nqueue_limit = 5\n"
    );
    metrics::with_local_recorder(&tally, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let limiter = Arc::new(
                HttpLimiter::with_clock(
                    HttpConfig::from_toml_str(&both).unwrap(),
                    TokioClock::new(),
                )
                .unwrap(),
            );
            assert!(
                limiter
                    .decide_async(&with_client("10.0.0.1", Some("x")))
                    .await
                    .outcome
                    .is_admitted()
            );
            let waiter = waiter(&limiter, with_client("10.0.0.2", Some("x"))).await;
            assert!(!waiter.is_finished(), "the request waits for q");
            limiter
                .reload(HttpConfig::from_toml_str(&by_ip).unwrap())
                .unwrap();
            let (v, _) = waiter.await.unwrap();
            assert!(v.outcome.is_admitted(), "{v:?}");
        });
    });
    let n = |k: &str| counts.lock().unwrap().get(k).copied().unwrap_or(0);
    assert_eq!(n("turnstile_http_waited{q}"), 1, "{policy}");
    assert_eq!(
        n("turnstile_http_key_overflow{by-ip}"),
        1,
        "one request, one overflow ({policy})"
    );
}

/// Through the layer, a request that waits across a reload is answered with the response
/// settings of the configuration its verdict was made under, as it is counted: the reload's
/// `legacy_headers` apply to it, with the reload's limit. The layer kept the settings of the
/// request's arrival, and wrote the new verdict in the old format.
#[tokio::test(start_paused = true)]
async fn the_layer_answers_a_request_waiting_across_a_reload_with_the_new_settings() {
    let rule = |limit: u32| {
        format!(
            "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = {limit}\nqueue_limit = 1\n\
             max_wait = \"5s\"\n"
        )
    };
    let limiter = limiter(&rule(1));
    let service = limiter
        .layer()
        .layer(tower::service_fn(|_: http::Request<String>| {
            std::future::ready(Ok::<_, Infallible>(http::Response::new(String::from("ok"))))
        }));
    let request = || {
        let mut request = http::Request::new(String::new());
        request
            .extensions_mut()
            .insert(PeerAddr("192.0.2.1:4000".parse().unwrap()));
        request
    };
    let first = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("x-ratelimit-limit").is_none());
    let waiter = tokio::spawn(service.clone().oneshot(request()));
    tokio::task::yield_now().await;
    let reload = format!("{}[response]\nlegacy_headers = true\n", rule(3));
    limiter
        .reload(HttpConfig::from_toml_str(&reload).unwrap())
        .unwrap();
    let waited = waiter.await.unwrap().unwrap();
    assert_eq!(waited.status(), 200);
    // Admitted at once, the reload's limit of 3 counting both requests.
    assert_eq!(waited.headers()["ratelimit"], "\"q\";r=1;t=1");
    assert_eq!(
        waited
            .headers()
            .get("x-ratelimit-limit")
            .map(|v| v.to_str().unwrap()),
        Some("3"),
        "{:?}",
        waited.headers()
    );
}

/// Spawns `decide` for `ip` and lets it reach its rule's queue; the task returns its verdict
/// and when it got it.
async fn waiter(
    limiter: &Arc<HttpLimiter<TokioClock>>,
    request: RequestInfo<'static>,
) -> tokio::task::JoinHandle<(Verdict, Instant)> {
    let limiter = Arc::clone(limiter);
    let task = tokio::spawn(async move {
        let verdict = limiter.decide_async(&request).await;
        (verdict, Instant::now())
    });
    tokio::task::yield_now().await;
    task
}

/// A client's waiting requests are served oldest first (ASP.NET Core's `OldestFirst`): three
/// that queue at 0, 10 and 20 ms behind a one-per-second rule are admitted in that order, one a
/// second, the later ones waiting in the rule's queue for the client rather than each sleeping
/// its own retry-after (which tokio's timer happened to end in the same order, so this alone
/// did not fail before; the newcomer below did).
#[tokio::test(start_paused = true)]
async fn waiters_of_one_client_are_admitted_in_arrival_order() {
    let limiter = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 3\n\
         max_wait = \"5s\"\n",
    );
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let mut waiters = Vec::new();
    for arrival in [0, 10, 20] {
        tokio::time::advance(start + Duration::from_millis(arrival) - Instant::now()).await;
        waiters.push(waiter(&limiter, from("192.0.2.1")).await);
    }
    let mut admitted_at = Vec::new();
    for task in waiters {
        let (verdict, at) = task.await.unwrap();
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        admitted_at.push(at - start);
    }
    assert_eq!(
        admitted_at,
        [1, 2, 3].map(Duration::from_secs),
        "admitted in arrival order, one a second"
    );
}

/// A request arriving when its rule frees a permit does not take it from a request of the same
/// client already waiting for it: it queues behind. (The token bucket's permit frees half a
/// millisecond into a millisecond; the waiter slept to the timer's next millisecond, and the
/// newcomer, arriving in between, took the permit.)
#[tokio::test(start_paused = true)]
async fn a_newcomer_does_not_overtake_a_waiting_request() {
    let limiter = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\nalgorithm = \"token_bucket\"\n\
         queue_limit = 2\nmax_wait = \"5s\"\n",
    );
    tokio::time::advance(Duration::from_micros(500)).await;
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let first = waiter(&limiter, from("192.0.2.1")).await;
    // The permit is free again at `start` + 1 s: a newcomer then.
    tokio::time::advance(Duration::from_secs(1)).await;
    let newcomer = waiter(&limiter, from("192.0.2.1")).await;
    let (verdict, at) = first.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert!(
        at - start < Duration::from_secs(2),
        "the waiting request went first: {:?}",
        at - start
    );
    let (verdict, at) = newcomer.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert!(
        at - start >= Duration::from_secs(2),
        "the newcomer went second, a second later: {:?}",
        at - start
    );
}

/// A waiting request that another rule rejects when its turn comes gives its permit to the
/// next request waiting for the same counter, at once. Client "a" has room in `per-client`
/// when its second request begins to wait for `per-ip`; a request of "a" from another address
/// takes that room meanwhile.
#[tokio::test(start_paused = true)]
async fn a_waiter_another_rule_rejects_leaves_its_permit_to_the_next() {
    let limiter = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 3\n\
         max_wait = \"5s\"\n\
         [[rules]]\nname = \"per-client\"\nperiod = \"1m\"\nlimit = 2\nkey = \"client\"\n",
    );
    let start = Instant::now();
    let a = with_client("192.0.2.1", Some("a"));
    assert!(limiter.decide_async(&a).await.outcome.is_admitted());
    let refused = waiter(&limiter, a).await;
    tokio::time::advance(Duration::from_millis(10)).await;
    let next = waiter(&limiter, with_client("192.0.2.1", Some("b"))).await;
    let elsewhere = with_client("192.0.2.2", Some("a"));
    assert!(limiter.decide_async(&elsewhere).await.outcome.is_admitted());
    let (verdict, at) = refused.await.unwrap();
    match &verdict.outcome {
        Outcome::Rejected { rule, .. } => assert_eq!(&**rule, "per-client"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        at - start,
        Duration::from_secs(1),
        "admitted by per-ip first"
    );
    let (verdict, at) = next.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(
        at - start,
        Duration::from_secs(1),
        "per-ip's permit given back to it"
    );
}

/// A waiting request dropped after its rule's permit came, before its task ran again to take
/// it, holds nothing of any rule: the permit of `a` is the next request's at once, and `b`,
/// charged by neither the dropped request nor its wait, counts the first and the next only.
/// So for every algorithm; and a decision never polled decides nothing.
#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_between_its_permit_and_its_next_poll_holds_nothing() {
    let noop = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(noop);
    // When each algorithm frees the permit: a sliding counter weighs the last window in.
    for (algorithm, frees) in [
        ("fixed_window", 1),
        ("sliding_window", 1),
        ("sliding_counter", 2),
        ("token_bucket", 1),
    ] {
        let limiter = limiter(&format!(
            "[[rules]]\nname = \"a\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 2\n\
             max_wait = \"5s\"\nalgorithm = \"{algorithm}\"\n\
             [[rules]]\nname = \"b\"\nperiod = \"1m\"\nlimit = 10\n"
        ));
        let request = from("192.0.2.1");
        drop(limiter.decide_async(&request));
        assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
        let mut waiting = Box::pin(limiter.decide_async(&request));
        assert!(waiting.as_mut().poll(&mut cx).is_pending(), "{algorithm}");
        // The permit frees (the waiter's timer runs), and the waiter is dropped unpolled.
        tokio::time::advance(Duration::from_secs(frees) + Duration::from_millis(100)).await;
        drop(waiting);
        let next = limiter.decide(&request);
        assert!(next.outcome.is_admitted(), "{algorithm}: {next:?}");
        let b = next.quotas.iter().find(|q| &*q.policy == "b").unwrap();
        assert_eq!(b.remaining, 8, "{algorithm}: {next:?}");
    }
}

/// A waiting request dropped frees its place in its client's queue: the request behind it is
/// admitted when the first would have been.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_frees_its_place_for_the_next() {
    let limiter = limiter(ONE_PER_SECOND_QUEUE_2);
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let first = waiter(&limiter, from("192.0.2.1")).await;
    let second = waiter(&limiter, from("192.0.2.1")).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let (verdict, at) = second.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(at - start, Duration::from_secs(1));
}

/// `max_wait` bounds a wait behind other requests too: a request whose retry-after fits but
/// whose turn comes after `max_wait` is rejected by then.
#[tokio::test(start_paused = true)]
async fn max_wait_bounds_a_wait_behind_others() {
    let limiter = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\nqueue_limit = 3\n\
         max_wait = \"1500ms\"\n",
    );
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let first = waiter(&limiter, from("192.0.2.1")).await;
    let second = waiter(&limiter, from("192.0.2.1")).await;
    let (verdict, at) = first.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(at - start, Duration::from_secs(1));
    let (verdict, at) = second.await.unwrap();
    assert!(retry_after(&verdict).is_some(), "{verdict:?}");
    assert!(
        at - start <= Duration::from_millis(1500),
        "{:?}",
        at - start
    );
    // It was a final rejection: the rule's queue is empty again.
    let third = waiter(&limiter, from("192.0.2.1")).await;
    let (verdict, _) = third.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
}

/// The synchronous `decide`, which never waits, does not take a permit from the requests
/// waiting for it either: while a request waits for its client's counter, a permit that frees
/// is the waiting request's, and `decide` answers a rejection.
#[tokio::test(start_paused = true)]
async fn decide_does_not_take_the_permit_a_request_waits_for() {
    let limiter = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 1\nalgorithm = \"token_bucket\"\n\
         queue_limit = 2\nmax_wait = \"5s\"\n",
    );
    tokio::time::advance(Duration::from_micros(500)).await;
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let first = waiter(&limiter, from("192.0.2.1")).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let verdict = limiter.decide(&from("192.0.2.1"));
    assert!(!verdict.outcome.is_admitted(), "{verdict:?}");
    let (verdict, _) = first.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
}

/// A request behind others waiting for its client's counter is told when the rule could admit
/// them and it, not when the rule alone would have a permit: with that answer beyond its
/// `max_wait` it is rejected at once, with that retry-after, rather than wait out `max_wait`
/// for a turn that cannot come in time.
#[tokio::test(start_paused = true)]
async fn a_request_behind_waiters_is_told_the_time_their_permits_need_too() {
    let limiter = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 3\n\
         algorithm = \"sliding_window\"\nqueue_limit = 5\nmax_wait = \"800ms\"\n",
    );
    let start = Instant::now();
    for at in [0, 100, 200] {
        tokio::time::advance(start + Duration::from_millis(at) - Instant::now()).await;
        assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    }
    tokio::time::advance(Duration::from_millis(100)).await;
    // At 300 ms: the permit of 0 ms frees at 1 s, that of 100 ms at 1.1 s: two wait for them.
    let first = waiter(&limiter, from("192.0.2.1")).await;
    let second = waiter(&limiter, from("192.0.2.1")).await;
    // The third would be admitted at 1.2 s, 900 ms from now: beyond its 800 ms.
    let third = decide(&limiter, "192.0.2.1").await;
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(300),
        "rejected at once"
    );
    assert_eq!(retry_after(&third), Some(Duration::from_millis(900)));
    for (task, at) in [(first, 1000), (second, 1100)] {
        let (verdict, when) = task.await.unwrap();
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        assert_eq!(when - start, Duration::from_millis(at));
    }
}

/// A 429 never says "retry now": a request that finds the permits of a new window free while
/// its client's waiting request (whose timer has not run yet) is about to take one, and has no
/// room to wait, is rejected with a retry-after of 0 (behind that request it would fit at
/// once), sent as `Retry-After: 1`; its `RateLimit` field, nothing remaining, says 1 s too (it
/// said `t=0`, so the two disagreed, and `t=0` invites the same retry at once).
#[tokio::test(start_paused = true)]
async fn a_429_behind_a_waiting_request_never_says_retry_now() {
    // Windows end half a millisecond into a millisecond: the waiter's timer ends at the next.
    tokio::time::advance(Duration::from_micros(500)).await;
    let limiter = limiter(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1s\"\nlimit = 2\nalgorithm = \"fixed_window\"\n\
         queue_limit = 1\nmax_wait = \"5s\"\n[response]\nlegacy_headers = true\n",
    );
    let service = limiter
        .layer()
        .layer(tower::service_fn(|_: http::Request<String>| {
            std::future::ready(Ok::<_, Infallible>(http::Response::new(String::from("ok"))))
        }));
    let request = || {
        let mut request = http::Request::new(String::new());
        request
            .extensions_mut()
            .insert(PeerAddr("192.0.2.1:4000".parse().unwrap()));
        request
    };
    for _ in 0..2 {
        assert_eq!(
            service.clone().oneshot(request()).await.unwrap().status(),
            200
        );
    }
    let waiter = tokio::spawn(service.clone().oneshot(request()));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let refused = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(refused.status(), 429);
    let headers = refused.headers();
    assert_eq!(headers["retry-after"], "1", "{headers:?}");
    assert_eq!(headers["ratelimit"], "\"per-ip\";r=0;t=1", "{headers:?}");
    assert_eq!(headers["x-ratelimit-reset"], "1", "{headers:?}");
    assert_eq!(waiter.await.unwrap().unwrap().status(), 200);
}

/// A 1-per-second rule named `q` whose requests may wait 5 s, `queue_limit` of them.
fn queued_rule(limit: u32, queue_limit: u32) -> HttpConfig {
    HttpConfig::from_toml_str(&format!(
        "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = {limit}\nqueue_limit = {queue_limit}\n\
         max_wait = \"5s\"\n"
    ))
    .unwrap()
}

/// Three requests of 192.0.2.1 waiting for their rule (see [`waiter`]).
async fn three_waiters(
    limiter: &Arc<HttpLimiter<TokioClock>>,
) -> Vec<tokio::task::JoinHandle<(Verdict, Instant)>> {
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(waiter(limiter, from("192.0.2.1")).await);
    }
    waiters
}

/// When each of `waiters` was admitted, from `start`, earliest first; each must be.
async fn admitted_after(
    waiters: Vec<tokio::task::JoinHandle<(Verdict, Instant)>>,
    start: Instant,
) -> Vec<Duration> {
    let mut admitted_at = Vec::new();
    for task in waiters {
        let (verdict, at) = task.await.unwrap();
        assert!(verdict.outcome.is_admitted(), "{verdict:?}");
        admitted_at.push(at - start);
    }
    admitted_at.sort();
    admitted_at
}

/// A reload that raises the limit three requests of one client wait for admits as many of them
/// as the new limit has room for at once, and no more: the other two wait for the next window,
/// which admits both (limit 2).
#[tokio::test(start_paused = true)]
async fn a_raised_limit_admits_only_its_new_room_of_the_waiting_requests_at_once() {
    let limiter = Arc::new(HttpLimiter::with_clock(queued_rule(1, 5), TokioClock::new()).unwrap());
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let waiters = three_waiters(&limiter).await;
    limiter.reload(queued_rule(2, 5)).unwrap();
    assert_eq!(
        admitted_after(waiters, start).await,
        [0, 1, 1].map(Duration::from_secs)
    );
}

/// A reload that removes the rule requests wait for ends their waits at once: no rule applies
/// to them any more, and they are admitted, none stuck until its `max_wait`.
#[tokio::test(start_paused = true)]
async fn a_reload_that_removes_the_rule_admits_its_waiting_requests_at_once() {
    let limiter = Arc::new(HttpLimiter::with_clock(queued_rule(1, 5), TokioClock::new()).unwrap());
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let waiters = three_waiters(&limiter).await;
    limiter.reload(HttpConfig::default()).unwrap();
    for task in waiters {
        let (verdict, at) = task.await.unwrap();
        assert_eq!(verdict.outcome, Outcome::Admitted, "{verdict:?}");
        assert_eq!(at - start, Duration::ZERO);
    }
}

/// A reload that takes the queue off a rule rejects the requests waiting for it at once (they
/// may not wait any more); one that puts it back starts its count of waiting requests from
/// zero: the one place of `queue_limit = 1` is free.
#[tokio::test(start_paused = true)]
async fn a_reload_that_removes_the_queue_rejects_its_waiting_requests_at_once() {
    let limiter = Arc::new(HttpLimiter::with_clock(queued_rule(1, 5), TokioClock::new()).unwrap());
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let waiters = three_waiters(&limiter).await;
    let no_queue = "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 1\n";
    limiter
        .reload(HttpConfig::from_toml_str(no_queue).unwrap())
        .unwrap();
    for task in waiters {
        let (verdict, at) = task.await.unwrap();
        assert!(retry_after(&verdict).is_some(), "{verdict:?}");
        assert_eq!(at - start, Duration::ZERO);
    }
    limiter.reload(queued_rule(1, 1)).unwrap();
    let (verdict, at) = waiter(&limiter, from("192.0.2.1")).await.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(at - start, Duration::from_secs(1));
}

/// A reload that lowers `queue_limit` below the requests waiting turns none of them away: each
/// keeps its place, and is admitted in its turn; no other request starts to wait until fewer
/// than the new limit wait (here, another client's is rejected at once).
#[tokio::test(start_paused = true)]
async fn a_lowered_queue_limit_keeps_the_waiting_requests_and_lets_no_other_wait() {
    let limiter = Arc::new(HttpLimiter::with_clock(queued_rule(1, 3), TokioClock::new()).unwrap());
    let start = Instant::now();
    for ip in ["192.0.2.1", "192.0.2.2"] {
        assert!(decide(&limiter, ip).await.outcome.is_admitted());
    }
    let waiters = three_waiters(&limiter).await;
    limiter.reload(queued_rule(1, 1)).unwrap();
    tokio::task::yield_now().await;
    let other = decide(&limiter, "192.0.2.2").await;
    assert_eq!(retry_after(&other), Some(Duration::from_secs(1)));
    assert_eq!(start.elapsed(), Duration::ZERO, "rejected at once");
    assert_eq!(
        admitted_after(waiters, start).await,
        [1, 2, 3].map(Duration::from_secs)
    );
}

/// A waiting request dropped after a reload woke it, before it was decided again, leaves its
/// place: the one place of `queue_limit = 1` is free for the next.
#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_as_a_reload_wakes_it_frees_its_place() {
    let limiter = Arc::new(HttpLimiter::with_clock(queued_rule(1, 1), TokioClock::new()).unwrap());
    let start = Instant::now();
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let dropped = waiter(&limiter, from("192.0.2.1")).await;
    limiter.reload(queued_rule(1, 1)).unwrap();
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    let (verdict, at) = waiter(&limiter, from("192.0.2.1")).await.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(at - start, Duration::from_secs(1));
}

/// A request that waits across a reload to a coarser grouping of addresses is decided again
/// as "a new request is, from step 0 on (a client banned meanwhile is rejected as banned)":
/// its address was grouped at its arrival (198.51.100.16, its /28), and the client's group
/// under the new grouping (the /24) is banned meanwhile, for longer than the request waits (a
/// reload that keeps its rule leaves it waiting in its place, and it is decided when its turn
/// comes). The ban was looked up under the /28's address, which the /24 list holds nothing
/// for, and the request was admitted by its rule.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_across_a_regrouping_meets_its_new_groups_ban() {
    let config = |prefix: u8| {
        format!(
            "[client_ip]\nipv4_prefix = {prefix}\n\
             [[rules]]\nname = \"q\"\nperiod = \"1h\"\nlimit = 1\nqueue_limit = 1\n\
             max_wait = \"1h\"\n\
             [bans]\nafter = 1\nwithin = \"1h\"\nduration = \"2h\"\n"
        )
    };
    let limiter = limiter(&config(28));
    // What the layer hands the engine under each grouping.
    assert!(
        decide(&limiter, "198.51.100.16")
            .await
            .outcome
            .is_admitted()
    );
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { decide(&limiter, "198.51.100.16").await })
    };
    tokio::task::yield_now().await;
    limiter
        .reload(HttpConfig::from_toml_str(&config(24)).unwrap())
        .unwrap();
    // Another address of the /24 uses its limit and is banned, as the /24, before the waiting
    // request is decided again.
    assert!(limiter.decide(&from("198.51.100.0")).outcome.is_admitted());
    let banning = limiter.decide(&from("198.51.100.0"));
    assert_eq!(retry_after(&banning), Some(Duration::from_secs(3600)));
    assert!(matches!(
        limiter.decide(&from("198.51.100.0")).outcome,
        Outcome::Rejected {
            reason: RejectReason::Banned,
            ..
        }
    ));
    let waited = waiter.await.unwrap();
    assert!(
        matches!(
            waited.outcome,
            Outcome::Rejected {
                reason: RejectReason::Banned,
                ..
            }
        ),
        "the request of a client of the banned /24: {waited:?}"
    );
}

/// A reload that keeps the rule requests wait for (same identity, limiter and `max_wait`)
/// leaves them waiting in their places. Each left its counter's queue and was decided again,
/// so the oldest re-queued behind the younger one still waiting: a sliding window of 2 a
/// second with permits taken at 0 and 0.5 s, A waiting from 0.5 s and B from 0.7 s, and the
/// same configuration reloaded at 0.8 s. A, now second, was told 1.5 s, past its `max_wait`
/// (1.4 s), and rejected at 0.8 s, while B was admitted at 1 s. Now A is admitted at 1 s and B
/// at 1.5 s, as without the reload.
#[tokio::test(start_paused = true)]
async fn a_reload_that_keeps_the_rule_keeps_its_waiting_requests_in_their_places() {
    let toml = "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = 2\n\
                algorithm = \"sliding_window\"\nqueue_limit = 5\nmax_wait = \"900ms\"\n";
    let limiter = limiter(toml);
    let start = Instant::now();
    let at = |ms| start + Duration::from_millis(ms);
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    tokio::time::advance(at(500) - Instant::now()).await;
    assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    let a = waiter(&limiter, from("192.0.2.1")).await;
    tokio::time::advance(at(700) - Instant::now()).await;
    let b = waiter(&limiter, from("192.0.2.1")).await;
    tokio::time::advance(at(800) - Instant::now()).await;
    limiter
        .reload(HttpConfig::from_toml_str(toml).unwrap())
        .unwrap();
    let (verdict, admitted) = a.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "the oldest: {verdict:?}");
    assert_eq!(admitted - start, Duration::from_secs(1));
    let (verdict, admitted) = b.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "the younger: {verdict:?}");
    assert_eq!(admitted - start, Duration::from_millis(1500));
}

/// A reload that keeps the rule but changes its limit reaches the requests waiting in their
/// places: lowered, the one waiting is admitted when the lower limit has room; and a reload
/// that changes `max_wait` decides them again under it: one past the new `max_wait` is
/// rejected at once.
#[tokio::test(start_paused = true)]
async fn a_reload_that_changes_the_rules_limit_or_max_wait_reaches_its_waiting_requests() {
    let rule = |limit: u32, max_wait: &str| {
        HttpConfig::from_toml_str(&format!(
            "[[rules]]\nname = \"q\"\nperiod = \"1s\"\nlimit = {limit}\nqueue_limit = 5\n\
             max_wait = \"{max_wait}\"\n"
        ))
        .unwrap()
    };
    let limiter = Arc::new(HttpLimiter::with_clock(rule(2, "5s"), TokioClock::new()).unwrap());
    let start = Instant::now();
    for _ in 0..2 {
        assert!(decide(&limiter, "192.0.2.1").await.outcome.is_admitted());
    }
    let waiting = waiter(&limiter, from("192.0.2.1")).await;
    // Raised to 3: room for it at once.
    limiter.reload(rule(3, "5s")).unwrap();
    let (verdict, admitted) = waiting.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(admitted - start, Duration::ZERO);
    assert_eq!(verdict.quotas[0].limit, 3);
    // Lowered to 1 with 3 taken this window: the next waits for the next window.
    let waiting = waiter(&limiter, from("192.0.2.1")).await;
    limiter.reload(rule(1, "5s")).unwrap();
    let (verdict, admitted) = waiting.await.unwrap();
    assert!(verdict.outcome.is_admitted(), "{verdict:?}");
    assert_eq!(admitted - start, Duration::from_secs(1));
    // A wait of a second, then a `max_wait` of half a second: rejected at once.
    let waiting = waiter(&limiter, from("192.0.2.1")).await;
    limiter.reload(rule(1, "500ms")).unwrap();
    let (verdict, rejected) = waiting.await.unwrap();
    assert!(retry_after(&verdict).is_some(), "{verdict:?}");
    assert_eq!(rejected - start, Duration::from_secs(1));
}
