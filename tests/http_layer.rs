//! The HTTP layers end to end: a real axum server on 127.0.0.1:0 and a real HTTP client.

use arc_swap::ArcSwap;
use axum::Router;
use axum::routing::get;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tower::{Layer, Service};
use turnstile::http::{
    Check, ClientIpConfig, ConcurrencyLayer, ForwardedHeader, LayerSettings, Outcome, PeerAddr,
    Policy, QuotaState, Quotas, RateLimitLayer, RejectReason, RequestInfo, Verdict,
};
use turnstile::{Algorithm, ConcurrencyLimiter, KeyedLimiter, ManualClock, TryAcquireError};

/// 2 requests per second per client IP, on a manual clock; remembers the keys it saw.
struct PerIp {
    limiter: KeyedLimiter<IpAddr, ManualClock>,
    seen: Mutex<Vec<Option<IpAddr>>>,
    name: &'static str,
}

impl PerIp {
    fn new(name: &'static str) -> Self {
        PerIp {
            limiter: KeyedLimiter::with_clock(
                Algorithm::FixedWindow {
                    limit: 2,
                    window: Duration::from_secs(1),
                },
                ManualClock::new(),
            )
            .unwrap(),
            seen: Mutex::new(Vec::new()),
            name,
        }
    }

    fn last_key(&self) -> Option<IpAddr> {
        self.seen.lock().unwrap().last().copied().flatten()
    }

    fn decide(&self, ip: Option<IpAddr>) -> Verdict {
        self.seen.lock().unwrap().push(ip);
        let Some(ip) = ip else {
            return Verdict {
                outcome: Outcome::Rejected {
                    reason: RejectReason::NoKey,
                    rule: self.name.into(),
                    retry_after: None,
                },
                quotas: Quotas::new(),
            };
        };
        let quota = |remaining, reset_after| QuotaState {
            policy: self.name.into(),
            limit: 2,
            window: Duration::from_secs(1),
            remaining,
            reset_after,
        };
        match self.limiter.try_acquire(&ip) {
            Ok(admission) => Verdict {
                outcome: Outcome::Admitted,
                quotas: quota(u64::from(admission.remaining()), admission.reset_after()).into(),
            },
            Err(TryAcquireError::Rejected(rejection)) => Verdict {
                outcome: Outcome::Rejected {
                    reason: RejectReason::RateLimited,
                    rule: self.name.into(),
                    retry_after: Some(rejection.retry_after()),
                },
                quotas: quota(0, rejection.retry_after()).into(),
            },
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
}

impl Policy for PerIp {
    fn check(&self, request: &RequestInfo<'_>) -> Check {
        Check::Ready(self.decide(request.client_ip))
    }
}

/// The same decision, answered through `Check::Pending` (as a remote backend would).
struct Deferred(Arc<PerIp>);

impl Policy for Deferred {
    fn check(&self, request: &RequestInfo<'_>) -> Check {
        let inner = Arc::clone(&self.0);
        let ip = request.client_ip;
        Check::Pending(Box::pin(async move {
            tokio::task::yield_now().await;
            inner.decide(ip)
        }))
    }
}

// ---- a minimal RFC 8941 list parser: members are sf-strings or tokens with parameters ----

type Member = (String, Vec<(String, i64)>);

fn parse_sf_list(input: &str) -> Result<Vec<Member>, String> {
    let bytes = input.as_bytes();
    let mut i = 0;
    let mut members = Vec::new();
    let skip_ows = |i: &mut usize| {
        while *i < bytes.len() && (bytes[*i] == b' ' || bytes[*i] == b'\t') {
            *i += 1;
        }
    };
    while i < bytes.len() {
        let name = if bytes[i] == b'"' {
            i += 1;
            let mut s = String::new();
            loop {
                let &c = bytes.get(i).ok_or("unterminated string")?;
                i += 1;
                match c {
                    b'\\' => {
                        let &e = bytes.get(i).ok_or("dangling escape")?;
                        if e != b'"' && e != b'\\' {
                            return Err(format!("bad escape {}", e as char));
                        }
                        s.push(e as char);
                        i += 1;
                    }
                    b'"' => break,
                    0x20..=0x7e => s.push(c as char),
                    _ => return Err("non-printable in string".into()),
                }
            }
            s
        } else if bytes[i].is_ascii_alphabetic() || bytes[i] == b'*' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&bytes[i]))
            {
                i += 1;
            }
            input[start..i].to_owned()
        } else {
            return Err(format!("bad item at {i}"));
        };
        let mut params = Vec::new();
        while i < bytes.len() && bytes[i] == b';' {
            i += 1;
            skip_ows(&mut i);
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_lowercase()
                    || bytes[i].is_ascii_digit()
                    || b"_-.*".contains(&bytes[i]))
            {
                i += 1;
            }
            if start == i || !bytes[start].is_ascii_lowercase() {
                return Err(format!("bad key at {start}"));
            }
            let key = input[start..i].to_owned();
            if bytes.get(i) != Some(&b'=') {
                return Err("parameter without integer value".into());
            }
            i += 1;
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if start == i || i - start > 15 {
                return Err("bad integer".into());
            }
            params.push((key, input[start..i].parse().map_err(|_| "integer")?));
        }
        members.push((name, params));
        skip_ows(&mut i);
        if i == bytes.len() {
            break;
        }
        if bytes[i] != b',' {
            return Err(format!("expected , at {i}"));
        }
        i += 1;
        skip_ows(&mut i);
        if i == bytes.len() {
            return Err("trailing comma".into());
        }
    }
    Ok(members)
}

#[test]
fn the_sf_parser_rejects_what_it_should() {
    assert!(parse_sf_list(r#""a";q=1, b;w=2"#).is_ok());
    assert!(parse_sf_list(r#""a"b"#).is_err());
    assert!(parse_sf_list(r#""a\x""#).is_err());
    assert!(parse_sf_list(r#""a";Q=1"#).is_err());
    assert!(parse_sf_list(r#""a",""#).is_err());
    assert!(parse_sf_list(r#"per ip"#).is_err());
}

// ---- the server ----

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The `axum` feature reads `ConnectInfo`, where `into_make_service_with_connect_info` puts
    // the peer.
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    format!("http://{addr}")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A `GET` route whose handler says it has entered (on the receiver), then waits for a permit
/// of `gate` (taken for good) and answers "done": a request held inside the layer until the
/// test lets it go.
fn gated(gate: &Arc<Semaphore>) -> (axum::routing::MethodRouter, mpsc::UnboundedReceiver<()>) {
    let (entered_tx, entered) = mpsc::unbounded_channel::<()>();
    let gate = Arc::clone(gate);
    let handler = move || {
        let gate = Arc::clone(&gate);
        let entered_tx = entered_tx.clone();
        async move {
            let _ = entered_tx.send(());
            gate.acquire().await.unwrap().forget();
            "done"
        }
    };
    (get(handler), entered)
}

fn settings() -> Arc<ArcSwap<LayerSettings>> {
    Arc::new(ArcSwap::from_pointee(LayerSettings::default()))
}

fn with_trusted_localhost(settings: &ArcSwap<LayerSettings>) {
    let mut next = LayerSettings::clone(&settings.load());
    let mut client_ip = ClientIpConfig::default();
    client_ip.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    // The proxy of these tests writes both (the default reads X-Forwarded-For only).
    client_ip.headers = vec![ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded];
    next.client_ip = client_ip;
    settings.store(Arc::new(next));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_request_is_rejected_with_problem_json_and_headers() {
    let policy = Arc::new(PerIp::new("per-ip"));
    let layer = RateLimitLayer::with_settings(Arc::clone(&policy), settings());
    let base = serve(
        Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(layer),
    )
    .await;
    let client = client();

    for remaining in [1, 0] {
        let response = client.get(&base).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers();
        let policy_header = parse_sf_list(headers["ratelimit-policy"].to_str().unwrap()).unwrap();
        assert_eq!(
            policy_header,
            vec![(
                "per-ip".to_owned(),
                vec![("q".to_owned(), 2), ("w".to_owned(), 1)]
            )]
        );
        let state = parse_sf_list(headers["ratelimit"].to_str().unwrap()).unwrap();
        assert_eq!(state[0].0, "per-ip");
        assert_eq!(state[0].1[0], ("r".to_owned(), remaining));
        assert_eq!(state[0].1[1].0, "t");
        assert!(headers.get("x-ratelimit-limit").is_none());
        assert_eq!(response.text().await.unwrap(), "hello");
    }
    assert_eq!(policy.last_key(), Some("127.0.0.1".parse().unwrap()));

    let response = client.get(&base).send().await.unwrap();
    assert_eq!(response.status(), 429);
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1, "Retry-After {retry}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert!(parse_sf_list(response.headers()["ratelimit"].to_str().unwrap()).is_ok());
    let body: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["rule"], "per-ip");
    assert_eq!(body["retry_after"], retry);

    // The window passes: admitted again.
    policy.limiter.clock().advance(Duration::from_secs(1));
    assert_eq!(client.get(&base).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_names_are_escaped_sf_strings() {
    let policy = Arc::new(PerIp::new(r#"a "quoted" \ name"#));
    let layer = RateLimitLayer::with_settings(Arc::clone(&policy), settings());
    let base = serve(
        Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(layer),
    )
    .await;
    let response = client().get(&base).send().await.unwrap();
    let parsed = parse_sf_list(response.headers()["ratelimit-policy"].to_str().unwrap()).unwrap();
    assert_eq!(parsed[0].0, r#"a "quoted" \ name"#);
}

/// A policy name is written distinctly whatever it holds, alone or beside others: its `%` is
/// `%25`, so that the name `%C3%A9` is not the encoding of `é` (they are two policies to a
/// client). The one-quota fast path wrote `%` as it is.
#[test]
fn a_percent_in_a_lone_policy_name_is_encoded() {
    let quota = |name: &str| QuotaState {
        policy: name.into(),
        limit: 5,
        window: Duration::from_secs(1),
        remaining: 1,
        reset_after: Duration::from_secs(1),
    };
    let lone = |name: &str| {
        turnstile::http::ratelimit_value(&[quota(name)])
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_ne!(lone("%C3%A9"), lone("é"));
    assert_eq!(lone("%C3%A9"), r#""%25C3%25A9";r=1;t=1"#);
    assert_eq!(lone("100%"), r#""100%25";r=1;t=1"#);
    let policy = turnstile::http::ratelimit_policy_value(&[quota("a%b")]).unwrap();
    assert_eq!(policy, r#""a%25b";q=5;w=1"#);
    // The same as in a list of several.
    let two = turnstile::http::ratelimit_value(&[quota("a%b"), quota("c")]).unwrap();
    assert_eq!(two, r#""a%25b";r=1;t=1, "c";r=1;t=1"#);
    assert_eq!(parse_sf_list(&lone("%C3%A9")).unwrap()[0].0, "%25C3%25A9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarded_for_from_untrusted_peer_is_ignored() {
    let policy = Arc::new(PerIp::new("per-ip"));
    let layer = RateLimitLayer::with_settings(Arc::clone(&policy), settings());
    let base = serve(
        Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(layer),
    )
    .await;
    let client = client();
    for (i, spoof) in ["1.1.1.1", "2.2.2.2", "3.3.3.3"].into_iter().enumerate() {
        let response = client
            .get(&base)
            .header("x-forwarded-for", spoof)
            .header("forwarded", format!("for={spoof}"))
            .send()
            .await
            .unwrap();
        assert_eq!(policy.last_key(), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(response.status(), if i < 2 { 200 } else { 429 });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxy_headers_and_settings_swap() {
    let policy = Arc::new(PerIp::new("per-ip"));
    let settings = settings();
    let layer = RateLimitLayer::with_settings(Arc::clone(&policy), Arc::clone(&settings));
    // route_layer this time.
    let base = serve(
        Router::new()
            .route("/", get(|| async { "hello" }))
            .route_layer(layer),
    )
    .await;
    let client = client();

    // Not trusted yet: the header is ignored.
    client
        .get(&base)
        .header("x-forwarded-for", "203.0.113.9, 127.0.0.1")
        .send()
        .await
        .unwrap();
    assert_eq!(policy.last_key(), Some("127.0.0.1".parse().unwrap()));

    // The swap takes effect on the next request.
    with_trusted_localhost(&settings);
    let response = client
        .get(&base)
        .header("x-forwarded-for", "203.0.113.9, 127.0.0.1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(policy.last_key(), Some("203.0.113.9".parse().unwrap()));

    client
        .get(&base)
        .header("x-forwarded-for", "198.51.100.4:4711")
        .send()
        .await
        .unwrap();
    assert_eq!(policy.last_key(), Some("198.51.100.4".parse().unwrap()));

    client
        .get(&base)
        .header("forwarded", r#"for="[2001:db8::1]:4711""#)
        .send()
        .await
        .unwrap();
    assert_eq!(policy.last_key(), Some("2001:db8::1".parse().unwrap()));

    // A response-settings swap: legacy headers on, IETF off.
    let mut next = LayerSettings::clone(&settings.load());
    next.response.legacy_headers = true;
    next.response.ietf_headers = false;
    settings.store(Arc::new(next));
    let response = client.get(&base).send().await.unwrap();
    assert_eq!(response.headers()["x-ratelimit-limit"], "2");
    assert!(response.headers().get("ratelimit").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_layer_rejects_the_extra_request_and_admits_after_one_finishes() {
    let gate = Arc::new(Semaphore::new(0));
    let (slow, mut entered) = gated(&gate);
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let limiter = layer.limiter().clone();
    let base = serve(
        Router::new()
            .route("/slow", slow)
            .route_layer(layer)
            .route("/free", get(|| async { "free" })),
    )
    .await;
    let client = client();

    let first = tokio::spawn({
        let client = client.clone();
        let url = format!("{base}/slow");
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    });
    entered.recv().await.unwrap();
    assert_eq!(limiter.available(), 0);

    let second = client.get(format!("{base}/slow")).send().await.unwrap();
    assert_eq!(second.status(), 503);
    assert_eq!(second.headers()["retry-after"], "1");
    // Routes outside the layer are not capped.
    assert_eq!(
        client
            .get(format!("{base}/free"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    gate.add_permits(1);
    assert_eq!(first.await.unwrap(), "done");
    // The permit is given back when the server finishes (or drops) the body.
    for _ in 0..1000 {
        if limiter.available() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(limiter.available(), 1);

    gate.add_permits(1);
    let third = client.get(format!("{base}/slow")).send().await.unwrap();
    assert_eq!(third.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_layer_can_wait_in_the_queue() {
    let gate = Arc::new(Semaphore::new(0));
    let (slow, mut entered) = gated(&gate);
    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).wait(Duration::from_secs(30));
    let limiter = layer.limiter().clone();
    let base = serve(Router::new().route("/slow", slow).route_layer(layer)).await;
    let client = client();
    let spawn = |client: reqwest::Client| {
        let url = format!("{base}/slow");
        tokio::spawn(async move { client.get(url).send().await.unwrap().status() })
    };
    let a = spawn(client.clone());
    entered.recv().await.unwrap();
    let b = spawn(client.clone());
    // b waits in the limiter's queue (not rejected) while a holds the permit.
    for _ in 0..1000 {
        if limiter.stats().waiting == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(limiter.stats().waiting, 1);
    gate.add_permits(2);
    assert_eq!(a.await.unwrap(), 200);
    assert_eq!(b.await.unwrap(), 200);
}

/// The permit is held until the response body ends, not only until the headers.
#[tokio::test]
async fn concurrency_permit_is_held_until_the_body_ends_or_is_dropped() {
    use http_body_util::BodyExt;

    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"payload"),
        )))
    }));

    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let response = service.call(http::Request::new(())).await.unwrap();
    assert_eq!(limiter.available(), 0, "held while the body is unread");
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let rejected = service.call(http::Request::new(())).await.unwrap();
    assert_eq!(rejected.status(), 503);
    // A gRPC-Web request meanwhile: RESOURCE_EXHAUSTED in its own content type.
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let web = http::Request::builder()
        .header("content-type", "application/grpc-web+proto")
        .body(())
        .unwrap();
    let rejected = service.call(web).await.unwrap();
    assert_eq!(rejected.status(), 200);
    assert_eq!(rejected.headers()["content-type"], "application/grpc-web");
    assert_eq!(rejected.headers()["grpc-status"], "8");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"payload");
    assert_eq!(limiter.available(), 1, "given back at the end of the body");

    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let response = service.call(http::Request::new(())).await.unwrap();
    assert_eq!(limiter.available(), 0);
    drop(response);
    assert_eq!(
        limiter.available(),
        1,
        "given back when the body is dropped"
    );
}

/// A plain tower `service_fn` (as tonic or hyper would give): a pending decision, the peer from
/// `PeerAddr`, and errors passed through.
#[tokio::test]
async fn plain_tower_service_with_pending_decisions_and_errors() {
    let policy = Arc::new(PerIp::new("per-ip"));
    let layer = RateLimitLayer::new(Deferred(Arc::clone(&policy)));
    let mut service = layer.layer(tower::service_fn(
        |request: http::Request<String>| async move {
            if request.uri().path() == "/fail" {
                Err("inner failed")
            } else {
                Ok(http::Response::new(String::from("ok")))
            }
        },
    ));
    let request = |path: &str| {
        let mut request = http::Request::get(path).body(String::new()).unwrap();
        request
            .extensions_mut()
            .insert(PeerAddr("192.0.2.1:5000".parse().unwrap()));
        request
    };
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let response = service.call(request("/")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("ratelimit"));
    assert_eq!(policy.last_key(), Some("192.0.2.1".parse().unwrap()));

    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    assert_eq!(
        service.call(request("/fail")).await.unwrap_err(),
        "inner failed"
    );

    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let response = service.call(request("/")).await.unwrap();
    assert_eq!(response.status(), 429);

    // No peer address: the policy sees no key and rejects with no_key_status.
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let response = service
        .call(http::Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
}

/// Records the client id it is given; admits everything.
#[derive(Default)]
struct RecordId(Mutex<Vec<Option<String>>>);

impl Policy for RecordId {
    fn check(&self, request: &RequestInfo<'_>) -> Check {
        assert_eq!(request.path, "/api/x", "the path, without the query");
        assert_eq!(request.method, http::Method::GET);
        self.0
            .lock()
            .unwrap()
            .push(request.client_id.map(str::to_owned));
        Check::Ready(Verdict {
            outcome: Outcome::Admitted,
            quotas: Quotas::new(),
        })
    }
}

#[tokio::test]
async fn client_id_from_the_configured_header_or_the_closure() {
    let policy = Arc::new(RecordId::default());
    let settings = settings();
    let mut next = LayerSettings::clone(&settings.load());
    next.client_id_header = Some(http::HeaderName::from_static("x-client-id"));
    settings.store(Arc::new(next));
    let inner = tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(String::new()))
    });
    let request = |id: &str| {
        http::Request::get("/api/x?y=1")
            .header("x-client-id", id)
            .header("x-tenant", "tenant-7")
            .body(())
            .unwrap()
    };

    let layer = RateLimitLayer::with_settings(Arc::clone(&policy), Arc::clone(&settings));
    let mut service = layer.layer(inner);
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let response = service.call(request("mobile-app")).await.unwrap();
    assert_eq!(response.status(), 200);
    // No quotas: no RateLimit headers.
    assert!(response.headers().get("ratelimit").is_none());

    let layer = RateLimitLayer::with_settings(Arc::clone(&policy), Arc::clone(&settings))
        .client_id_fn(|parts| {
            parts
                .headers
                .get("x-tenant")?
                .to_str()
                .ok()
                .map(str::to_owned)
        });
    let mut service = layer.layer(inner);
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    service.call(request("mobile-app")).await.unwrap();

    // Header unset in the settings: no client id.
    settings.store(Arc::new(LayerSettings::default()));
    let mut service = RateLimitLayer::with_settings(Arc::clone(&policy), settings).layer(inner);
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    service.call(request("mobile-app")).await.unwrap();

    assert_eq!(
        *policy.0.lock().unwrap(),
        vec![
            Some("mobile-app".to_owned()),
            Some("tenant-7".to_owned()),
            None
        ]
    );
}

/// Plain hyper: one connection served by `http1::Builder`, the peer inserted as `PeerAddr`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_hyper_server() {
    let policy = Arc::new(PerIp::new("per-ip"));
    let layer = RateLimitLayer::with_settings(Arc::clone(&policy), settings());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let inner = tower::service_fn(|_: http::Request<hyper::body::Incoming>| async {
                Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"hyper"),
                )))
            });
            let service = layer.layer(inner);
            let with_peer = tower::service_fn(move |mut request: http::Request<_>| {
                request.extensions_mut().insert(PeerAddr(peer));
                let mut service = service.clone();
                async move {
                    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
                    service.call(request).await
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper_util::service::TowerToHyperService::new(with_peer),
                    )
                    .await;
            });
        }
    });
    let client = client();
    for expected in [200, 200, 429] {
        let response = client.get(&base).send().await.unwrap();
        assert_eq!(response.status(), expected);
    }
    assert_eq!(policy.last_key(), Some("127.0.0.1".parse().unwrap()));
}

/// gRPC needs no feature of its own: a request whose content type is `application/grpc` gets a
/// trailers-only gRPC status (200, `grpc-status: 8`, the rule in `grpc-message`, `retry-after`),
/// decided at once or through `Check::Pending`, and so does a gRPC-Web one (in its content type);
/// other requests keep the 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_are_rejected_with_a_grpc_status() {
    for deferred in [false, true] {
        let policy = Arc::new(PerIp::new("per-ip"));
        let route = Router::new().route("/pkg.Svc/Call", axum::routing::post(|| async { "ok" }));
        let app = if deferred {
            route.layer(RateLimitLayer::new(Deferred(Arc::clone(&policy))))
        } else {
            route.layer(RateLimitLayer::with_settings(
                Arc::clone(&policy),
                settings(),
            ))
        };
        let url = format!("{}/pkg.Svc/Call", serve(app).await);
        let client = client();
        let grpc = || {
            client
                .post(&url)
                .header("content-type", "application/grpc+proto")
                .send()
        };
        for _ in 0..2 {
            assert_eq!(grpc().await.unwrap().status(), 200);
        }
        let response = grpc().await.unwrap();
        assert_eq!(response.status(), 200, "deferred: {deferred}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "rate limited by rule per-ip; retry after 1 s"
        );
        let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(retry >= 1, "retry-after {retry}");
        assert!(headers.contains_key("ratelimit"));
        assert!(response.bytes().await.unwrap().is_empty());

        // gRPC-Web (a browser's, base64 framing): the same status, in its own content type.
        let web = client
            .post(&url)
            .header("content-type", "application/grpc-web-text+proto")
            .send()
            .await
            .unwrap();
        assert_eq!(web.status(), 200, "deferred: {deferred}");
        assert_eq!(web.headers()["content-type"], "application/grpc-web-text");
        assert_eq!(web.headers()["grpc-status"], "8");
        assert!(web.bytes().await.unwrap().is_empty());

        let plain = client.post(&url).send().await.unwrap();
        assert_eq!(plain.status(), 429, "deferred: {deferred}");
        assert!(plain.headers().get("grpc-status").is_none());
    }
}

/// An inner service that reserves a slot in `poll_ready` (as tower's `Buffer` or
/// `ConcurrencyLimit` do): the slot is taken by `call` and released when the reserving service
/// is dropped without being called. Clones reserve nothing.
struct Reserving {
    reserved: Arc<std::sync::atomic::AtomicUsize>,
    holding: bool,
}

impl Clone for Reserving {
    fn clone(&self) -> Self {
        Reserving {
            reserved: Arc::clone(&self.reserved),
            holding: false,
        }
    }
}

impl Drop for Reserving {
    fn drop(&mut self) {
        if self.holding {
            self.reserved
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Service<http::Request<String>> for Reserving {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        if !self.holding {
            self.holding = true;
            self.reserved
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<String>) -> Self::Future {
        assert!(self.holding, "called without poll_ready");
        self.holding = false;
        self.reserved
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        std::future::ready(Ok(http::Response::new(String::from("ok"))))
    }
}

/// Rejects every request at once.
struct RejectAll;

impl Policy for RejectAll {
    fn check(&self, _: &RequestInfo<'_>) -> Check {
        Check::Ready(Verdict {
            outcome: Outcome::Rejected {
                reason: RejectReason::RateLimited,
                rule: "none".into(),
                retry_after: Some(Duration::from_secs(1)),
            },
            quotas: Quotas::new(),
        })
    }
}

/// A request rejected at once gives back what the inner service reserved in `poll_ready`, so
/// a flood of rejected requests cannot hold the inner service's slots; an admitted request's
/// reservation is used by its call.
#[tokio::test]
async fn rejected_requests_release_the_inner_reservation() {
    let reserved = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = Reserving {
        reserved: Arc::clone(&reserved),
        holding: false,
    };
    let count = || reserved.load(std::sync::atomic::Ordering::SeqCst);

    let mut rejecting = RateLimitLayer::new(RejectAll).layer(inner.clone());
    for _ in 0..3 {
        std::future::poll_fn(|cx| rejecting.poll_ready(cx))
            .await
            .unwrap();
        assert_eq!(count(), 1, "poll_ready reserved");
        let response = rejecting
            .call(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
        assert_eq!(count(), 0, "the rejection released the reservation");
    }

    let policy = Arc::new(PerIp::new("per-ip"));
    let mut admitting = RateLimitLayer::new(Deferred(policy)).layer(inner);
    std::future::poll_fn(|cx| admitting.poll_ready(cx))
        .await
        .unwrap();
    let mut request = http::Request::new(String::new());
    request
        .extensions_mut()
        .insert(PeerAddr("192.0.2.1:5000".parse().unwrap()));
    let response = admitting.call(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(count(), 0, "the admitted call used the reservation");
}

/// Polls `service` ready, then calls it with an empty request and waits for the response.
async fn ready_call<S>(service: &mut S) -> S::Response
where
    S: Service<http::Request<String>>,
    S::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    service
        .call(http::Request::new(String::new()))
        .await
        .unwrap()
}

/// A request waiting in the concurrency queue (`wait`) holds nothing of the inner service's:
/// its reservation goes back when it starts to wait, and the service is made ready again (and
/// the reservation used) once the permit is granted. A request rejected at once gives it back
/// too.
#[tokio::test(start_paused = true)]
async fn concurrency_waiters_release_the_inner_reservation() {
    let reserved = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = || reserved.load(std::sync::atomic::Ordering::SeqCst);
    let inner = Reserving {
        reserved: Arc::clone(&reserved),
        holding: false,
    };

    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).wait(Duration::from_secs(10));
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(inner.clone());
    // The first request's body is not read: its permit stays taken.
    let first = ready_call(&mut service).await;
    assert_eq!(first.status(), 200);
    assert_eq!(count(), 0, "the admitted call used its reservation");
    assert_eq!(limiter.available(), 0);

    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    assert_eq!(count(), 1, "poll_ready reserved");
    let mut second = service.call(http::Request::new(String::new()));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    assert_eq!(limiter.stats().waiting, 1);
    assert_eq!(count(), 0, "a waiting request holds no reservation");

    // The first response's body dropped: its permit passes to the second request, whose call
    // reserves and uses a slot of its own.
    drop(first);
    let second = second.await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(count(), 0);
    drop(second);
    assert_eq!(limiter.available(), 1);

    // Without `wait`, a request rejected at once gives its reservation back too.
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let mut service = layer.layer(inner);
    let held = ready_call(&mut service).await;
    let rejected = ready_call(&mut service).await;
    assert_eq!(rejected.status(), 503);
    assert_eq!(count(), 0, "the rejection released the reservation");
    drop(held);
}

/// `on_rejection` answers rejected requests: it sees the request (path, headers, extensions)
/// and the verdict, gets the layer's own response with `Retry-After` and the quota headers, and
/// what it returns is sent, for decisions made at once (through a real server) and after a
/// pending decision (a plain tower service). Admitted requests never reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rejection_answers_rejected_requests_immediate_or_pending() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let hook = {
        let calls = Arc::clone(&calls);
        move |request: &http::request::Parts,
              verdict: &Verdict,
              default: http::Response<bytes::Bytes>| {
            calls.fetch_add(1, Ordering::Relaxed);
            let Outcome::Rejected { rule, .. } = &verdict.outcome else {
                panic!("called for an admitted request: {verdict:?}");
            };
            assert_eq!(default.status(), 429);
            assert!(default.headers().contains_key("ratelimit"));
            let mut response = http::Response::new(bytes::Bytes::from(format!(
                "<h1>{rule}: slow down, {}</h1>",
                request.uri.path()
            )));
            *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            let headers = response.headers_mut();
            headers.insert("content-type", "text/html".parse().unwrap());
            headers.insert("retry-after", default.headers()["retry-after"].clone());
            if let Some(tenant) = request.headers.get("x-tenant") {
                headers.insert("x-seen-tenant", tenant.clone());
            }
            response
        }
    };

    // Decided at once, through a real server.
    let policy = Arc::new(PerIp::new("per-ip"));
    let layer =
        RateLimitLayer::with_settings(Arc::clone(&policy), settings()).on_rejection(hook.clone());
    let base = serve(
        Router::new()
            .route("/page", get(|| async { "page" }))
            .layer(layer),
    )
    .await;
    let client = client();
    for _ in 0..2 {
        let response = client.get(format!("{base}/page")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.text().await.unwrap(), "page");
    }
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    let response = client
        .get(format!("{base}/page"))
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["content-type"], "text/html");
    assert_eq!(response.headers()["x-seen-tenant"], "acme");
    assert!(
        response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(
        response.text().await.unwrap(),
        "<h1>per-ip: slow down, /page</h1>"
    );
    assert_eq!(calls.load(Ordering::Relaxed), 1);

    // Decided later (`Check::Pending`), through a plain tower service.
    let policy = Arc::new(PerIp::new("deferred"));
    let mut service = RateLimitLayer::new(Deferred(Arc::clone(&policy)))
        .on_rejection(hook)
        .layer(tower::service_fn(|_: http::Request<String>| async {
            Ok::<_, Infallible>(http::Response::new(String::from("ok")))
        }));
    let request = || {
        let mut request = http::Request::get("/later").body(String::new()).unwrap();
        request
            .extensions_mut()
            .insert(PeerAddr("192.0.2.7:5000".parse().unwrap()));
        request
    };
    for status in [200, 200, 503] {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let response = service.call(request()).await.unwrap();
        assert_eq!(response.status(), status);
        if status == 503 {
            assert_eq!(response.body(), "<h1>deferred: slow down, /later</h1>");
        }
    }
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}

/// `ConcurrencyLayer::on_rejection` answers the requests the cap rejects, at once or after
/// waiting in the queue; it sees the request's parts and the layer's own response, and the
/// request that holds the permit is served as usual.
#[tokio::test(start_paused = true)]
async fn concurrency_on_rejection_answers_rejected_requests() {
    let gate = Arc::new(Semaphore::new(0));
    let inner = {
        let gate = Arc::clone(&gate);
        tower::service_fn(move |_: http::Request<String>| {
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(http::Response::new(String::from("served")))
            }
        })
    };
    let hook = |request: &http::request::Parts, default: http::Response<bytes::Bytes>| {
        assert_eq!(default.status(), 503);
        assert_eq!(default.headers()["retry-after"], "1");
        let mut response = http::Response::new(bytes::Bytes::from(format!(
            r#"{{"busy":"{}"}}"#,
            request.uri.path()
        )));
        *response.status_mut() = default.status();
        response
            .headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        response
    };
    for wait in [None, Some(Duration::from_millis(50))] {
        let mut layer =
            ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).on_rejection(hook);
        if let Some(timeout) = wait {
            layer = layer.wait(timeout);
        }
        let mut service = layer.layer(inner.clone());
        let first = service.call(http::Request::get("/held").body(String::new()).unwrap());
        let first = tokio::spawn(first);
        tokio::task::yield_now().await;
        let rejected = service
            .call(http::Request::get("/extra").body(String::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(rejected.status(), 503, "wait {wait:?}");
        assert_eq!(rejected.headers()["content-type"], "application/json");
        let body = http_body_util::BodyExt::collect(rejected.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body, r#"{"busy":"/extra"}"#);
        gate.add_permits(1);
        let served = first.await.unwrap().unwrap();
        assert_eq!(served.status(), 200);
    }
}

/// The permit of a response whose body is one large frame (`Vec`, `String`, `Full`: what most
/// handlers return) is held while the client downloads it, as for a streamed body: the server
/// gets it in pieces as the client reads, not whole with the headers. A client that has read
/// only the head leaves it taken; reading the body to its end gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_permit_is_held_while_a_one_frame_body_downloads() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const LEN: usize = 64 << 20;
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let limiter = layer.limiter().clone();
    let base = serve(
        Router::new()
            .route("/whole", get(|| async { vec![b'x'; LEN] }))
            .route_layer(layer),
    )
    .await;
    let addr = base.strip_prefix("http://").unwrap().to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"GET /whole HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // 64 MiB cannot all be in the server's and the sockets' buffers: the body has not ended.
    assert_eq!(limiter.available(), 0, "held while the body downloads");
    let mut body = vec![0; LEN];
    stream.read_exact(&mut body).await.unwrap();
    // The server took the last piece (and dropped the body) before it could send it.
    assert_eq!(limiter.available(), 1, "given back once the body is taken");
}

/// Waits (real time: the server's tasks run on their own) until `limiter` has `want` permits
/// free, and fails if it does not within two seconds.
async fn available_soon(limiter: &ConcurrencyLimiter, want: u32) {
    for _ in 0..1000 {
        if limiter.available() == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(limiter.available(), want);
}

/// Reads a response's head from `stream`, up to its blank line.
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.unwrap());
    }
    String::from_utf8(head).unwrap()
}

/// Probes of a real server that found nothing, pinned: the permit goes back after a HEAD of a
/// large body (whose body the server never sends), and when the client goes away mid-download
/// or while the handler still runs (the server drops the body, or the response future).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_permit_goes_back_after_head_and_when_the_client_leaves() {
    use tokio::io::AsyncWriteExt;
    const LEN: usize = 64 << 20;
    let gate = Arc::new(Semaphore::new(0));
    let (slow, mut entered) = gated(&gate);
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let limiter = layer.limiter().clone();
    let base = serve(
        Router::new()
            .route("/whole", get(|| async { vec![b'x'; LEN] }))
            .route("/slow", slow)
            .route_layer(layer),
    )
    .await;
    let addr = base.strip_prefix("http://").unwrap().to_owned();

    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"HEAD /whole HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains(&format!("content-length: {LEN}")), "{head}");
    available_soon(&limiter, 1).await;

    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"GET /whole HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(read_head(&mut stream).await.starts_with("HTTP/1.1 200"));
    assert_eq!(limiter.available(), 0, "held while the body downloads");
    drop(stream);
    available_soon(&limiter, 1).await;

    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    entered.recv().await.unwrap();
    assert_eq!(limiter.available(), 0, "held while the handler runs");
    drop(stream);
    available_soon(&limiter, 1).await;
}

/// A probe that found nothing, pinned: as `ConcurrencyLayer`'s documentation says, an
/// upgraded connection counts until its 101 response's empty body ends, not while the
/// upgraded stream is served; and the layer's body wrapper leaves the upgrade working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_layer_lets_an_upgrade_through_and_frees_its_permit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let layer = ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap());
    let limiter = layer.limiter().clone();
    // Answers 101 and echoes four bytes on the upgraded connection.
    let upgrade = |mut request: axum::extract::Request| async move {
        let on_upgrade = request
            .extensions_mut()
            .remove::<hyper::upgrade::OnUpgrade>()
            .expect("an upgradable connection");
        tokio::spawn(async move {
            let upgraded = on_upgrade.await.expect("upgraded");
            let mut io = hyper_util::rt::TokioIo::new(upgraded);
            let mut buf = [0u8; 4];
            io.read_exact(&mut buf).await.unwrap();
            io.write_all(&buf).await.unwrap();
        });
        http::Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "echo")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let base = serve(Router::new().route("/up", get(upgrade)).route_layer(layer)).await;
    let addr = base.strip_prefix("http://").unwrap().to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"GET /up HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    available_soon(&limiter, 1).await;
    stream.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping");
    assert_eq!(
        limiter.available(),
        1,
        "the upgraded stream holds no permit"
    );
}

/// Waits (real time) until `limiter` has `want` requests queued, and fails if it does not
/// within two seconds.
async fn waiting_soon(limiter: &ConcurrencyLimiter, want: usize) {
    for _ in 0..1000 {
        if limiter.stats().waiting == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(limiter.stats().waiting, want);
}

/// A probe of a real server that found nothing, pinned: a request waiting in the layer's queue
/// (`wait`) whose client goes away leaves the queue then, not when its wait times out, and
/// takes no permit: the server drops its response future, which is cancel-safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_leaves_leaves_the_queue() {
    use tokio::io::AsyncWriteExt;
    let layer =
        ConcurrencyLayer::new(ConcurrencyLimiter::new(1).unwrap()).wait(Duration::from_secs(600));
    let limiter = layer.limiter().clone();
    let base = serve(
        Router::new()
            .route("/", get(|| async { "hi" }))
            .route_layer(layer),
    )
    .await;
    let addr = base.strip_prefix("http://").unwrap().to_owned();
    let held = limiter.try_acquire_owned(1).unwrap();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    waiting_soon(&limiter, 1).await;
    drop(stream);
    waiting_soon(&limiter, 0).await;
    drop(held);
    assert_eq!(limiter.available(), 1);
}
