//! The whole HTTP layer, end to end: `HttpLimiter` (configured from TOML) behind
//! `RateLimitLayer` in a real axum server on 127.0.0.1:0, asked by a real HTTP client. Time is a
//! `ManualClock` the test advances; nothing sleeps.
//!
//! The engine's semantics are covered case by case in `http_engine.rs`, and the layer's
//! mechanics with a stand-in policy in `http_layer.rs`; these tests check that the scenarios of
//! issue 6 hold through the wire, with the peer address coming from axum's `ConnectInfo`.

use axum::Router;
use axum::routing::get;
use proptest::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use turnstile::ManualClock;
use turnstile::http::{HttpConfig, HttpLimiter, PeerAddr, RateLimitService};

#[path = "common/http_rules.rs"]
mod http_rules;
use http_rules::{PER_IP, limiter};

/// The app as `examples/axum_server.rs` builds it: the layer around the whole router, so that a
/// request is decided before it is routed. (`tests/http_layer.rs` covers `Router::layer` and
/// `route_layer`.)
fn app(
    limiter: &Arc<HttpLimiter<ManualClock>>,
) -> RateLimitService<Router, HttpLimiter<ManualClock>> {
    let routes = Router::new()
        .route("/api/values", get(|| async { "values" }))
        .route("/api/license", get(|| async { "license" }))
        .route("/health", get(|| async { "ok" }))
        .with_state(());
    limiter.layer().layer(routes)
}

async fn serve(app: RateLimitService<Router, HttpLimiter<ManualClock>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
                SocketAddr,
            >(app),
        )
        .await
        .expect("server");
    });
    format!("http://{addr}")
}

struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    async fn start(limiter: &Arc<HttpLimiter<ManualClock>>) -> Client {
        Client {
            base: serve(app(limiter)).await,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("client"),
        }
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self.http.get(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("the server answers")
    }

    async fn status(&self, path: &str, headers: &[(&str, &str)]) -> u16 {
        self.get(path, headers).await.status().as_u16()
    }

    async fn statuses(&self, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<u16> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.status(path, headers).await);
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_request_of_a_two_per_second_rule_gets_429_with_retry_after() {
    let (limiter, clock) = limiter(PER_IP);
    let client = Client::start(&limiter).await;
    assert_eq!(client.statuses(2, "/api/values", &[]).await, [200, 200]);
    let third = client.get("/api/values", &[]).await;
    assert_eq!(third.status().as_u16(), 429);
    let retry_after: u64 = third.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1, "Retry-After {retry_after}");
    assert_eq!(third.headers()["content-type"], "application/problem+json");
    assert_eq!(third.headers()["ratelimit-policy"], "\"per-ip\";q=2;w=1");
    let body: serde_json::Value = serde_json::from_slice(&third.bytes().await.unwrap()).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["rule"], "per-ip");
    // The next second admits again.
    clock.advance(Duration::from_secs(1));
    let next = client.get("/api/values", &[]).await;
    assert_eq!(next.status().as_u16(), 200);
    assert_eq!(next.headers()["ratelimit"], "\"per-ip\";r=1;t=1");
}

/// Around the router, the layer decides before routing: a path without a route is counted
/// against the same per-IP rule (a scanner probing for paths runs out of quota too), and a
/// rejection never reaches the router, whose 404 it replaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_decided_before_routing_so_unrouted_paths_count_too() {
    let (limiter, clock) = limiter(PER_IP);
    let client = Client::start(&limiter).await;
    assert_eq!(client.status("/no/such/path", &[]).await, 404);
    assert_eq!(client.status("/api/values", &[]).await, 200);
    let rejected = client.get("/no/such/path", &[]).await;
    assert_eq!(rejected.status().as_u16(), 429);
    assert_eq!(
        rejected.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(client.status("/api/values", &[]).await, 429);
    clock.advance(Duration::from_secs(1));
    let next = client.get("/no/such/path", &[]).await;
    assert_eq!(next.status().as_u16(), 404);
    assert_eq!(next.headers()["ratelimit"], "\"per-ip\";r=1;t=1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_addresses_with_ports_and_lists_are_parsed_from_a_trusted_proxy() {
    let (limiter, _clock) = limiter(&format!(
        "[client_ip]\ntrusted_proxies = [\"127.0.0.1\", \"10.0.0.0/8\"]\n\
         headers = [\"forwarded\", \"x-forwarded-for\"]\n{PER_IP}"
    ));
    let client = Client::start(&limiter).await;
    // The same client behind two proxies, written three ways: one key, so the third is 429.
    let ways = [
        ("x-forwarded-for", "203.0.113.9:4711"),
        ("x-forwarded-for", "203.0.113.9, 10.1.2.3"),
        (
            "forwarded",
            "for=\"203.0.113.9:80\";proto=http, for=10.1.2.3",
        ),
    ];
    let mut statuses = Vec::new();
    for (name, value) in ways {
        statuses.push(client.status("/api/values", &[(name, value)]).await);
    }
    assert_eq!(statuses, [200, 200, 429]);
    // A different client behind the same proxies has its own quota.
    assert_eq!(
        client
            .status(
                "/api/values",
                &[("x-forwarded-for", "198.51.100.1, 10.1.2.3")]
            )
            .await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_proxy_that_appends_x_forwarded_for_the_clients_own_headers_do_not_change_the_key()
{
    // The default reads X-Forwarded-For only: a `Forwarded` or `X-Real-IP` header that the
    // proxy passed on as the client wrote it is not believed, and the address the proxy
    // appended to X-Forwarded-For is the key.
    let (limiter, _clock) = limiter(&format!(
        "[client_ip]\ntrusted_proxies = [\"127.0.0.1\"]\n{PER_IP}"
    ));
    let client = Client::start(&limiter).await;
    let mut statuses = Vec::new();
    for spoof in ["198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        let forwarded_for = format!("{spoof}, 203.0.113.9");
        let forwarded = format!("for={spoof}");
        let headers = [
            ("forwarded", forwarded.as_str()),
            ("x-real-ip", spoof),
            ("x-forwarded-for", forwarded_for.as_str()),
        ];
        statuses.push(client.status("/api/values", &headers).await);
    }
    assert_eq!(statuses, [200, 200, 429]);
    // Another address appended by the proxy is another client.
    let headers = [("x-forwarded-for", "198.51.100.1, 203.0.113.10")];
    assert_eq!(client.status("/api/values", &headers).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarded_for_from_an_untrusted_peer_does_not_change_the_key() {
    // No trusted proxies: the peer (127.0.0.1) is the client whatever the headers say.
    let (limiter, _clock) = limiter(PER_IP);
    let client = Client::start(&limiter).await;
    let mut statuses = Vec::new();
    for spoof in ["198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        statuses.push(
            client
                .status(
                    "/api/values",
                    &[("x-forwarded-for", spoof), ("x-real-ip", spoof)],
                )
                .await,
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_zero_rule_blocks() {
    let (limiter, _clock) = limiter(
        r#"
        [[rules]]
        name = "no-license"
        endpoint = "get:/api/license"
        period = "1m"
        limit = 0
        "#,
    );
    let client = Client::start(&limiter).await;
    let blocked = client.get("/api/license", &[]).await;
    assert_eq!(blocked.status().as_u16(), 429);
    assert_eq!(client.status("/api/values", &[]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whitelisted_ip_client_and_path_pass_and_are_not_charged() {
    let base = format!(
        "client_id_header = \"X-ClientId\"\n{PER_IP}\n[whitelist]\nclients = [\"ops\"]\nendpoints = [\"get:/health\"]\n"
    );
    let (limiter, _clock) = limiter(&base);
    let client = Client::start(&limiter).await;
    assert_eq!(client.statuses(4, "/health", &[]).await, [200; 4]);
    assert_eq!(
        client
            .statuses(4, "/api/values", &[("x-clientid", "ops")])
            .await,
        [200; 4]
    );
    // Nothing above was charged: the quota is whole.
    assert_eq!(
        client.statuses(3, "/api/values", &[]).await,
        [200, 200, 429]
    );

    let (limiter, _clock) = limiter_with_ip_whitelist(&base);
    let client = Client::start(&limiter).await;
    assert_eq!(client.statuses(4, "/api/values", &[]).await, [200; 4]);
}

fn limiter_with_ip_whitelist(base: &str) -> (Arc<HttpLimiter<ManualClock>>, ManualClock) {
    limiter(&base.replace("[whitelist]\n", "[whitelist]\nips = [\"127.0.0.0/8\"]\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_rule_overrides_the_general_rule() {
    // The partner's rule counts by IP, as the general rule does: it replaces that rule for the
    // partner. (One counting by client id would apply beside the per-IP rule, not instead.)
    let (limiter, _clock) = limiter(&format!(
        r#"
        client_id_header = "X-ClientId"
        {PER_IP}
        [[client_rules]]
        client_id = "partner"
        [[client_rules.rules]]
        name = "partner"
        endpoint = "*"
        period = "1s"
        limit = 5
        key = "ip"
        "#
    ));
    let client = Client::start(&limiter).await;
    let partner = [("x-clientid", "partner")];
    assert_eq!(
        client.statuses(6, "/api/values", &partner).await,
        [200, 200, 200, 200, 200, 429]
    );
    // Another client id gets the general rule.
    assert_eq!(
        client
            .statuses(3, "/api/values", &[("x-clientid", "other")])
            .await,
        [200, 200, 429]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_mode_passes() {
    let (limiter, _clock) = limiter(&PER_IP.replace("limit = 2", "limit = 2\nmonitor = true"));
    let client = Client::start(&limiter).await;
    assert_eq!(client.statuses(5, "/api/values", &[]).await, [200; 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_config_update_takes_effect_and_keeps_counters() {
    let (limiter, _clock) = limiter(PER_IP);
    let client = Client::start(&limiter).await;
    assert_eq!(client.statuses(1, "/api/values", &[]).await, [200]);
    // Raise the limit to 4: the request already counted stays counted.
    limiter
        .reload(HttpConfig::from_toml_str(&PER_IP.replace("limit = 2", "limit = 4")).unwrap())
        .unwrap();
    assert_eq!(
        client.statuses(4, "/api/values", &[]).await,
        [200, 200, 200, 429]
    );
    // A new rule and new response settings apply from the next request.
    limiter
        .reload(
            HttpConfig::from_toml_str(&format!(
                "[response]\nstatus = 503\nlegacy_headers = true\n{}",
                PER_IP.replace("limit = 2", "limit = 4")
            ))
            .unwrap(),
        )
        .unwrap();
    let rejected = client.get("/api/values", &[]).await;
    assert_eq!(rejected.status().as_u16(), 503);
    assert_eq!(rejected.headers()["x-ratelimit-limit"], "4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_start_and_end_on_time() {
    let (limiter, clock) = limiter(&format!(
        "{PER_IP}\n[bans]\nafter = 3\nwithin = \"1m\"\nduration = \"10m\"\n"
    ));
    let client = Client::start(&limiter).await;
    // Two admitted, three rejected: the third rejection bans.
    assert_eq!(
        client.statuses(5, "/api/values", &[]).await,
        [200, 200, 429, 429, 429]
    );
    // The rate limit would admit again a second later, but the ban holds for ten minutes.
    clock.advance(Duration::from_secs(1));
    let banned = client.get("/api/values", &[]).await;
    assert_eq!(banned.status().as_u16(), 429);
    let retry_after: u64 = banned.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (590..=600).contains(&retry_after),
        "a ban of 10 minutes, 1 s in: Retry-After {retry_after}"
    );
    clock.advance(Duration::from_secs(598));
    assert_eq!(client.status("/api/values", &[]).await, 429);
    clock.advance(Duration::from_secs(2));
    assert_eq!(client.status("/api/values", &[]).await, 200);
}

/// The AspNetCoreRateLimit README's sample, as documented there: 2 per second per IP on any
/// endpoint (endpoint rate limiting off), loopback whitelisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aspnet_sample_configuration_behaves_through_the_layer() {
    let document = r#"{
      "IpRateLimiting": {
        "EnableEndpointRateLimiting": false,
        "StackBlockedRequests": false,
        "RealIpHeader": "X-Real-IP",
        "ClientIdHeader": "X-ClientId",
        "HttpStatusCode": 429,
        "IpWhitelist": [ "::1/10", "192.168.0.0/24" ],
        "EndpointWhitelist": [ "get:/api/license", "*:/api/status" ],
        "ClientWhitelist": [ "dev-id-1", "dev-id-2" ],
        "GeneralRules": [
          { "Endpoint": "*", "Period": "1s", "Limit": 2 },
          { "Endpoint": "*", "Period": "15m", "Limit": 100 },
          { "Endpoint": "*", "Period": "12h", "Limit": 1000 },
          { "Endpoint": "*", "Period": "7d", "Limit": 10000 }
        ]
      }
    }"#;
    let clock = ManualClock::new();
    let limiter = Arc::new(
        HttpLimiter::with_clock(HttpConfig::from_json_str(document).unwrap(), clock.clone())
            .unwrap(),
    );
    let client = Client::start(&limiter).await;
    assert_eq!(client.statuses(2, "/api/values", &[]).await, [200, 200]);
    // There a rejection carries `Retry-After` (whole seconds) and no `X-Rate-Limit-*`.
    let rejected = client.get("/api/values", &[]).await;
    assert_eq!(rejected.status().as_u16(), 429);
    assert_eq!(rejected.headers()["retry-after"], "1");
    assert!(rejected.headers().get("x-rate-limit-limit").is_none());
    // The whitelisted endpoint is not limited.
    assert_eq!(client.statuses(3, "/api/license", &[]).await, [200; 3]);
    clock.advance(Duration::from_secs(1));
    let admitted = client.get("/api/values", &[]).await;
    assert_eq!(admitted.status().as_u16(), 200);
    // Four policies reported, the 15-minute one with 97 left (2 + 1 admitted).
    let ratelimit = admitted.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert_eq!(ratelimit.split(", ").count(), 4, "{ratelimit}");
    assert!(ratelimit.contains(";r=97;"), "{ratelimit}");
    // And its own headers, which its clients read: those of the rule with the longest period,
    // its window's end as .NET writes a UTC time (`o`: seven decimals).
    let header = |name| admitted.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(header("x-rate-limit-limit"), "7d");
    assert_eq!(header("x-rate-limit-remaining"), "9997");
    let reset = header("x-rate-limit-reset");
    let (_, decimals) = reset.split_once('.').expect("decimals");
    assert_eq!(decimals.len(), 8, "seven decimals and Z: {reset}");
    assert!(
        decimals.ends_with('Z') && reset.as_bytes()[10] == b'T',
        "{reset}"
    );
    let reset = humantime::parse_rfc3339_weak(&reset[..reset.len() - 1]).unwrap();
    let ends_in = reset.duration_since(std::time::SystemTime::now()).unwrap();
    // The window of 7 days aligned to the clock's epoch, 1 s into it.
    let week = Duration::from_secs(7 * 86_400);
    assert!(
        ends_in <= week - Duration::from_secs(1) && ends_in > week - Duration::from_secs(60),
        "{ends_in:?}"
    );
}

fn arbitrary_header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        "[0-9a-f:.,\\[\\] ;=\"]{0,40}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the path and the headers, the layer answers with a response: admitted (200 or
    /// the router's 404), rejected (429), never a panic or a 500.
    #[test]
    fn any_path_and_headers_get_a_response(
        path in "/[ -~]{0,30}",
        forwarded_for in arbitrary_header_value(),
        forwarded in arbitrary_header_value(),
        client_id in arbitrary_header_value(),
    ) {
        let (limiter, _clock) = limiter(&format!(
            "client_id_header = \"X-ClientId\"\n[client_ip]\ntrusted_proxies = [\"127.0.0.1\"]\n{PER_IP}\n[[rules]]\nname = \"per-client\"\nendpoint = \"*:/api/*\"\nperiod = \"1m\"\nlimit = 1\nkey = \"client\"\n"
        ));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let statuses = runtime.block_on(async {
            let mut service = app(&limiter);
            let mut statuses = Vec::new();
            for _ in 0..3 {
                let mut request = http::Request::builder().method("GET");
                request = match http::Uri::try_from(path.as_str()) {
                    Ok(uri) => request.uri(uri),
                    Err(_) => request.uri("/"),
                };
                for (name, value) in [
                    ("x-forwarded-for", &forwarded_for),
                    ("forwarded", &forwarded),
                    ("x-clientid", &client_id),
                ] {
                    if let Ok(value) = http::HeaderValue::from_bytes(value) {
                        request = request.header(name, value);
                    }
                }
                let mut request = request.body(axum::body::Body::empty()).unwrap();
                request
                    .extensions_mut()
                    .insert(PeerAddr("127.0.0.1:40000".parse().unwrap()));
                let response = ServiceExt::<http::Request<axum::body::Body>>::ready(&mut service).await.unwrap().call(request).await.unwrap();
                statuses.push(response.status().as_u16());
            }
            statuses
        });
        for status in statuses {
            prop_assert!([200, 404, 429].contains(&status), "status {}", status);
        }
    }
}

/// axum answers a `HEAD` request with the route's `GET` handler (its body dropped), so a rule
/// for `get:/path` that `HEAD` did not match let any client run that handler without limit,
/// and a per-endpoint counter of `HEAD:/path` beside `GET:/path` doubled its quota there. To
/// the rules a `HEAD` is the `GET` it is served as.
#[tokio::test]
async fn head_requests_run_the_get_handler_and_count_as_get() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    async fn statuses(toml: &str, methods: &[http::Method]) -> (Vec<u16>, usize) {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let routes = Router::new()
            .route(
                "/api/export",
                get(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { "a large export" }
                }),
            )
            .with_state(());
        let (limiter, _clock) = limiter(toml);
        let mut service = limiter.layer().layer(routes);
        let mut out = Vec::new();
        for method in methods {
            let response = call_from_one_peer(&mut service, method.clone(), "/api/export").await;
            out.push(response.status().as_u16());
        }
        (out, runs.load(Ordering::SeqCst))
    }

    let (head, get) = (http::Method::HEAD, http::Method::GET);
    // A rule for the GET endpoint limits the HEAD requests its handler serves.
    let rule = "endpoint_rate_limiting = true\n[[rules]]\nendpoint = \"get:/api/export\"\n\
                period = \"1m\"\nlimit = 2\n";
    let (got, runs) = statuses(
        rule,
        &[head.clone(), head.clone(), head.clone(), get.clone()],
    )
    .await;
    assert_eq!(got, [200, 200, 429, 429]);
    assert_eq!(runs, 2, "the handler ran for every admitted request only");
    // A per-endpoint counter: GET and HEAD of one path are one endpoint.
    let rule = "[[rules]]\nendpoint = \"*\"\nper_endpoint = true\nperiod = \"1m\"\nlimit = 2\n";
    let (got, runs) = statuses(rule, &[get.clone(), head.clone(), head.clone(), get]).await;
    assert_eq!(got, [200, 200, 429, 429]);
    assert_eq!(runs, 2);
    // A rule for HEAD alone still matches HEAD alone.
    let rule = "endpoint_rate_limiting = true\n[[rules]]\nendpoint = \"head:/api/export\"\n\
                period = \"1m\"\nlimit = 1\n";
    let (got, _) = statuses(
        rule,
        &[http::Method::GET, http::Method::GET, head.clone(), head],
    )
    .await;
    assert_eq!(got, [200, 200, 200, 429]);
}

/// Calls the layered `service` in process with a `method` request for `uri` from one peer.
async fn call_from_one_peer(
    service: &mut RateLimitService<Router, HttpLimiter<ManualClock>>,
    method: http::Method,
    uri: &str,
) -> http::Response<axum::body::Body> {
    let mut request = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(axum::body::Body::empty())
        .unwrap();
    request
        .extensions_mut()
        .insert(PeerAddr("192.0.2.1:40000".parse().unwrap()));
    ServiceExt::<http::Request<axum::body::Body>>::ready(service)
        .await
        .unwrap()
        .call(request)
        .await
        .unwrap()
}

/// axum's `Path` extractor percent-decodes what it captures, `%2F` and non-ASCII escapes
/// included: `/files/secret%2Fdoc` reaches the handler of `/files/{*path}` with the very
/// `secret/doc` that `/files/secret/doc` gives it, and `/tags/%C3%A9` the `é` of `/tags/é`.
/// Rules that saw only the escaped path let a client step around them that way; they match
/// the path as the handler reads it too (and count it as such), while whitelists, which
/// exempt, keep to the path as it was written.
#[tokio::test]
async fn a_rule_matches_the_path_as_the_handler_reads_it() {
    async fn statuses(toml: &str, uris: &[&str]) -> Vec<(u16, String)> {
        let routes = Router::new()
            .route(
                "/files/{*path}",
                get(|axum::extract::Path(path): axum::extract::Path<String>| async move { path }),
            )
            .route(
                "/tags/{tag}",
                get(|axum::extract::Path(tag): axum::extract::Path<String>| async move { tag }),
            )
            .with_state(());
        let (limiter, _clock) = limiter(toml);
        let mut service = limiter.layer().layer(routes);
        let mut out = Vec::new();
        for uri in uris {
            let response = call_from_one_peer(&mut service, http::Method::GET, uri).await;
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            out.push((status, String::from_utf8_lossy(&body).into_owned()));
        }
        out
    }

    let blocking = |pattern: &str| {
        format!("[[rules]]\nendpoint = \"{pattern}\"\nperiod = \"1m\"\nlimit = 0\n")
    };
    // The handler reads `secret/doc` from each of these: each is blocked.
    let got = statuses(
        &blocking("get:/files/secret/*"),
        &[
            "/files/secret/doc",
            "/files/secret%2Fdoc",
            "/files/secret%2fdoc",
            "/files/other",
        ],
    )
    .await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [429, 429, 429, 200], "{got:?}");
    let got = statuses(&blocking("get:/tags/é"), &["/tags/%C3%A9", "/tags/e"]).await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [429, 200], "{got:?}");
    // A rule written for the escaped form still matches it.
    let got = statuses(&blocking("get:/files/a%2Fb"), &["/files/a%2fb"]).await;
    assert_eq!(got[0].0, 429, "{got:?}");
    // Per endpoint, the spellings the handler cannot tell apart share one counter.
    let per_endpoint =
        "[[rules]]\nendpoint = \"*\"\nper_endpoint = true\nperiod = \"1m\"\nlimit = 2\n";
    let got = statuses(
        per_endpoint,
        &["/files/a/b", "/files/a%2Fb", "/files/a%2fb", "/files/a/c"],
    )
    .await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [200, 200, 429, 200], "{got:?}");
    // A whitelist exempts the path as written only: `%2F` does not make a request exempt.
    let whitelisted = "[whitelist]\nendpoints = [\"get:/files/public/*\"]\n[[rules]]\n\
                       endpoint = \"*\"\nperiod = \"1m\"\nlimit = 0\n";
    let got = statuses(whitelisted, &["/files/public/x", "/files/public%2Fx"]).await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [200, 429], "{got:?}");
}

/// A file server behind a wildcard route resolves the path it captures as a file system
/// does: empty segments (`//`) and `.` segments name nothing, so `/static//secret/x` and
/// `/static/./secret/x` are the file of `/static/secret/x` (tower-http's `ServeDir` walks
/// `Path::components`, which drops both; the handler below resolves its capture the same
/// way). A rule that saw only the path as written could be stepped around by writing it
/// so; it matches, and counts, the resolved path too, while a whitelist keeps to the path as
/// written. axum's router resolves neither: `/api//values` is not `/api/values` to it.
#[tokio::test]
async fn a_rule_matches_the_path_as_a_file_server_resolves_it() {
    async fn statuses(toml: &str, uris: &[&str]) -> Vec<(u16, String)> {
        let file = |axum::extract::Path(path): axum::extract::Path<String>| async move {
            std::path::Path::new(&path)
                .components()
                .filter_map(|c| match c {
                    std::path::Component::Normal(part) => part.to_str().map(str::to_owned),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("/")
        };
        let routes = Router::new()
            .route("/static/{*path}", get(file))
            .route("/api/values", get(|| async { "values" }))
            .with_state(());
        let (limiter, _clock) = limiter(toml);
        let mut service = limiter.layer().layer(routes);
        let mut out = Vec::new();
        for uri in uris {
            let response = call_from_one_peer(&mut service, http::Method::GET, uri).await;
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            out.push((status, String::from_utf8_lossy(&body).into_owned()));
        }
        out
    }

    let blocking = |pattern: &str| {
        format!("[[rules]]\nendpoint = \"{pattern}\"\nperiod = \"1m\"\nlimit = 0\n")
    };
    // Unlimited, the file server serves `secret/x` for each of these spellings.
    let spellings = [
        "/static/secret/x",
        "/static//secret/x",
        "/static/./secret/x",
        "/static/secret//x",
        "/static/.//./secret/./x",
        "/static/%2E/secret/x",
        "/static/%2F/secret/x",
    ];
    let got = statuses("", &spellings).await;
    assert!(
        got.iter().all(|g| *g == (200, "secret/x".to_owned())),
        "{got:?}"
    );
    // Each is blocked by the rule for the secret files, and the other files are not.
    let mut uris = spellings.to_vec();
    uris.extend(["/static/other", "/static//other/./secret/x"]);
    let got = statuses(&blocking("get:/static/secret/*"), &uris).await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        codes,
        [429, 429, 429, 429, 429, 429, 429, 200, 200],
        "{got:?}"
    );
    // A `.` in a name is no `.` segment, nor is `..` one that resolves to nothing.
    let got = statuses(
        &blocking("get:/static/secret/*"),
        &["/static/.secret/x", "/static/secret./x"],
    )
    .await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [200, 200], "{got:?}");
    // Per endpoint, the spellings of one file share one counter.
    let per_endpoint =
        "[[rules]]\nendpoint = \"*\"\nper_endpoint = true\nperiod = \"1m\"\nlimit = 2\n";
    let got = statuses(
        per_endpoint,
        &[
            "/static/a/b",
            "/static//a/b",
            "/static/./a/./b",
            "/static/a/c",
        ],
    )
    .await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [200, 200, 429, 200], "{got:?}");
    // axum routes `//` to no handler of its own: the request is answered 404, not served.
    let got = statuses("", &["/api/values", "/api//values", "/api/./values"]).await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [200, 404, 404], "{got:?}");
    // A whitelist exempts the path as written only: `//` does not make a request exempt.
    let whitelisted = "[whitelist]\nendpoints = [\"get:/static/public/x\"]\n[[rules]]\n\
                       endpoint = \"*\"\nperiod = \"1m\"\nlimit = 0\n";
    let got = statuses(
        whitelisted,
        &[
            "/static/public/x",
            "/static/public//x",
            "/static/./public/x",
        ],
    )
    .await;
    let codes: Vec<u16> = got.iter().map(|(status, _)| *status).collect();
    assert_eq!(codes, [200, 429, 429], "{got:?}");
}

/// Probes of odd requests through a real server that found nothing, pinned: a 60 KB path with
/// broken escapes is decided and counted like any other; a rejected `HEAD` on a kept-alive
/// connection is answered with its head alone (its `content-length` the body a `GET` would
/// get), so the request pipelined after it is read as the next request; and an app served
/// without `ConnectInfo` has no client IP, which a per-IP rule under `missing_key = "reject"`
/// answers 400, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_requests_are_answered_as_requests() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn exchange(base: &str, request: &[u8]) -> String {
        let addr = base.strip_prefix("http://").unwrap();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8(answer).unwrap()
    }
    let one_per_minute = "missing_key = \"reject\"\n[[rules]]\nname = \"per-ip\"\n\
                          endpoint = \"*\"\nperiod = \"1m\"\nlimit = 1\n";

    let (counted, _clock) = limiter(one_per_minute);
    let base = serve(app(&counted)).await;
    let long = format!("/api/values/%ZZ%FF%2F%00{}", "a".repeat(60_000));
    let answer = exchange(
        &base,
        format!("GET {long} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        answer.contains("ratelimit: \"per-ip\";r=0;t=60"),
        "{answer}"
    );
    let answer = exchange(
        &base,
        b"HEAD /api/values HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /api/values HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (head, get) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(head.contains("retry-after: 60"), "{answer}");
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        get.starts_with("HTTP/1.1 429"),
        "nothing between the two: {answer}"
    );
    let (_, body) = get.split_once("\r\n\r\n").unwrap();
    assert_eq!(
        body.len(),
        length,
        "the GET's body is the one the HEAD announced"
    );

    let (unknown, _clock) = limiter(one_per_minute);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = app(&unknown);
    tokio::spawn(async move {
        axum::serve(
            listener,
            axum::ServiceExt::<axum::extract::Request>::into_make_service(app),
        )
        .await
        .unwrap();
    });
    let answer = exchange(
        &base,
        b"GET /api/values HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("client key unknown by rule per-ip"),
        "{answer}"
    );
}
