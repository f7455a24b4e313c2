//! Hot reload under load, on real threads: a reload that changes both the rules and the layer
//! settings is seen by each request whole, never half.

#![cfg(feature = "http")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tower::{Layer, ServiceExt};
use turnstile::http::{HttpConfig, HttpLimiter, PeerAddr};

/// Configuration A: a limit of 1,000,000 per hour, answered with the legacy `X-RateLimit-*`
/// headers besides the IETF ones.
const A: &str = "[[rules]]\nname = \"r\"\nperiod = \"1h\"\nlimit = 1000000\n\
                 [response]\nlegacy_headers = true\n";
/// Configuration B: a limit of 2,000,000 per hour, the IETF headers only.
const B: &str = "[[rules]]\nname = \"r\"\nperiod = \"1h\"\nlimit = 2000000\n\
                 [response]\nlegacy_headers = false\n";

/// One thread reloads between A and B while others send requests through the layer: every
/// response must be written by the configuration that decided it. Its `RateLimit-Policy`
/// names the limit of the rules it was counted under (`q=`), and the legacy headers must be
/// there exactly when that limit is A's. With the rules and the settings swapped in two steps
/// (and read as two), a request that met the new rules and the old settings (or the reverse)
/// got the other configuration's header style.
#[test]
fn every_response_is_decided_and_answered_under_one_configuration() {
    const RELOADS: usize = 400;
    const WORKERS: usize = 2;
    let limiter = Arc::new(HttpLimiter::new(HttpConfig::from_toml_str(A).unwrap()).unwrap());
    let service = limiter
        .layer()
        .layer(tower::service_fn(|_: http::Request<String>| {
            std::future::ready(Ok::<_, Infallible>(http::Response::new(String::from("ok"))))
        }));
    let done = AtomicBool::new(false);
    let mixed = AtomicU64::new(0);
    let answered = AtomicU64::new(0);
    let example: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for worker in 0..WORKERS {
            let service = service.clone();
            let (done, mixed, answered, example) = (&done, &mixed, &answered, &example);
            scope.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let peer = format!("192.0.2.{}:4000", worker + 1).parse().unwrap();
                // Relaxed: a stop signal; the scope's join orders everything else.
                while !done.load(Ordering::Relaxed) {
                    let mut request = http::Request::new(String::new());
                    request.extensions_mut().insert(PeerAddr(peer));
                    let response = runtime.block_on(service.clone().oneshot(request)).unwrap();
                    assert_eq!(response.status(), 200);
                    let headers = response.headers();
                    let policy = headers["ratelimit-policy"].to_str().unwrap();
                    let legacy = headers
                        .get("x-ratelimit-limit")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let consistent = match policy {
                        "\"r\";q=1000000;w=3600" => legacy.as_deref() == Some("1000000"),
                        "\"r\";q=2000000;w=3600" => legacy.is_none(),
                        other => panic!("unexpected RateLimit-Policy {other}"),
                    };
                    answered.fetch_add(1, Ordering::Relaxed);
                    if !consistent {
                        mixed.fetch_add(1, Ordering::Relaxed);
                        example
                            .lock()
                            .unwrap()
                            .get_or_insert_with(|| format!("{policy} with legacy {legacy:?}"));
                    }
                }
            });
        }
        for n in 0..RELOADS {
            let config = if n % 2 == 0 { B } else { A };
            limiter
                .reload(HttpConfig::from_toml_str(config).unwrap())
                .unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        mixed.load(Ordering::Relaxed),
        0,
        "of {} responses, some were decided under one configuration and answered under the \
         other, e.g. {:?}",
        answered.load(Ordering::Relaxed),
        example.lock().unwrap()
    );
}

/// A clock that counts its readings, so that a racing thread can act at a chosen point of a
/// reload (after its `k`-th reading) whatever the machine's speed.
#[derive(Clone, Default)]
struct CountingClock {
    time: turnstile::ManualClock,
    reads: Arc<AtomicU64>,
}

impl turnstile::Clock for CountingClock {
    fn now(&self) -> u64 {
        // Relaxed: a position marker for the racing thread; the limiter's own state is ordered
        // by its own atomics.
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.time.now()
    }
}

/// An unban issued while a reload carries the bans over to a new list stays done. A reload
/// that builds a new ban list carries the bans in force twice (when it compiles, and again
/// after the swap for those started meanwhile): an unban in between lifted the ban from the
/// old list only, and the new list kept the copy made first; one just after the swap was
/// undone by the second carry. The unban is sent at every point of the reload in turn (after
/// its `k`-th clock reading), each time on a limiter with the address banned.
#[test]
fn an_unban_while_a_reload_carries_the_bans_over_stays_done() {
    use turnstile::http::{Outcome, RejectReason, RequestInfo};
    let config = |after: u32| {
        format!(
            "[[rules]]\nname = \"r\"\nperiod = \"1h\"\nlimit = 1\n\
             [bans]\nafter = {after}\nwithin = \"1h\"\nduration = \"1h\"\n"
        )
    };
    let ip: std::net::IpAddr = "198.51.100.7".parse().unwrap();
    let request = RequestInfo {
        method: &http::Method::GET,
        path: "/",
        client_ip: Some(ip),
        client_id: None,
    };
    let banned = |limiter: &HttpLimiter<CountingClock>| {
        matches!(
            limiter.decide(&request).outcome,
            Outcome::Rejected {
                reason: RejectReason::Banned,
                ..
            }
        )
    };
    let fresh = || {
        let clock = CountingClock::default();
        let limiter = HttpLimiter::with_clock(
            HttpConfig::from_toml_str(&config(1)).unwrap(),
            clock.clone(),
        )
        .unwrap();
        limiter.decide(&request);
        limiter.decide(&request);
        assert!(banned(&limiter));
        // Relaxed: read by the racing thread only after the spawn, which orders it.
        clock.reads.store(0, Ordering::Relaxed);
        (limiter, clock)
    };
    // How many times a reload reads the clock: the points to race at.
    let (limiter, clock) = fresh();
    limiter
        .reload(HttpConfig::from_toml_str(&config(2)).unwrap())
        .unwrap();
    let reads = clock.reads.load(Ordering::Relaxed);
    assert!(reads > 0, "the reload carries bans, which reads the clock");
    let mut undone = Vec::new();
    for k in 0..=reads + 1 {
        let (limiter, clock) = fresh();
        let reloaded = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // Relaxed: positions to act at; the scope's join orders the outcome.
                while clock.reads.load(Ordering::Relaxed) < k && !reloaded.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
                assert!(limiter.unban(ip), "banned until this unban");
            });
            limiter
                .reload(HttpConfig::from_toml_str(&config(2)).unwrap())
                .unwrap();
            reloaded.store(true, Ordering::Relaxed);
        });
        if banned(&limiter) {
            undone.push(k);
        }
    }
    assert!(
        undone.is_empty(),
        "unbans sent after these clock readings of the reload ({reads} in all) were undone: {undone:?}"
    );
}

/// What a [`HookClock`] runs, and at which of its readings (counted from 0).
type Hook = Option<(u64, Box<dyn FnOnce() + Send>)>;

/// A clock that runs a hook once, at a chosen reading: a reload in the middle of a request's
/// decision, at each of its clock readings in turn, deterministically.
#[derive(Clone, Default)]
struct HookClock {
    time: turnstile::ManualClock,
    reads: Arc<AtomicU64>,
    hook: Arc<std::sync::Mutex<Hook>>,
}

impl turnstile::Clock for HookClock {
    fn now(&self) -> u64 {
        // Relaxed: one thread reads and hooks; the count only names the reading.
        let read = self.reads.fetch_add(1, Ordering::Relaxed);
        let due = {
            let mut hook = self.hook.lock().unwrap();
            match hook.take() {
                Some((at, run)) if at == read => Some(run),
                other => {
                    *hook = other;
                    None
                }
            }
        };
        // Outside the hook's lock: the hook reads this clock too.
        if let Some(run) = due {
            run();
        }
        self.time.now()
    }
}

/// A ban that a request starts under the old configuration while a reload replaces the ban
/// list is not lost. A reload carries the bans in force over to its new list after its swap;
/// a request that loaded the old configuration before the swap and started its ban after that
/// carry put the ban in a list nothing looks at any more, and the client went unbanned. The
/// reload is run at each of the rejected request's clock readings in turn, for reloads that
/// change `[bans]`, make the grouping of addresses coarser or finer, or do two of these in a
/// row (the ban then passes through the first new list to the second; a grouping made finer
/// and then `[bans]` changed lost it, the second list not looking up the old group that the
/// first list's inherited groups received after the second was built).
#[test]
fn a_ban_started_under_the_old_list_during_a_reload_is_kept() {
    use turnstile::http::{Outcome, RejectReason, RequestInfo};
    // Every configuration bans at the first rejection; they differ in `within` or in the
    // grouping of IPv4 addresses, so each reload builds a new list.
    let config = |(within, prefix): (&str, u8)| {
        HttpConfig::from_toml_str(&format!(
            "[client_ip]\nipv4_prefix = {prefix}\n\
             [[rules]]\nname = \"r\"\nperiod = \"1h\"\nlimit = 1\n\
             [bans]\nafter = 1\nwithin = \"{within}\"\nduration = \"1h\"\n"
        ))
        .unwrap()
    };
    let start = ("1h", 28);
    let reloads: [&[(&str, u8)]; 6] = [
        &[("2h", 28)],
        &[("1h", 24)],
        &[("1h", 32)],
        &[("2h", 28), ("2h", 32)],
        &[("1h", 32), ("1h", 24)],
        &[("1h", 32), ("2h", 32)],
    ];
    // The layer hands the engine addresses grouped as configured: this one is its group under
    // every grouping here.
    let ip: std::net::IpAddr = "198.51.100.0".parse().unwrap();
    let request = RequestInfo {
        method: &http::Method::GET,
        path: "/",
        client_ip: Some(ip),
        client_id: None,
    };
    let reason = |limiter: &HttpLimiter<HookClock>| match limiter.decide(&request).outcome {
        Outcome::Rejected { reason, .. } => Some(reason),
        _ => None,
    };
    // A limiter whose client has used its one request, with the count of readings so far.
    let fresh = || {
        let clock = HookClock::default();
        let limiter = Arc::new(HttpLimiter::with_clock(config(start), clock.clone()).unwrap());
        assert_eq!(reason(&limiter), None);
        let before = clock.reads.load(Ordering::Relaxed);
        (limiter, clock, before)
    };
    // How many times the rejected request reads the clock: the points to reload at.
    let (limiter, clock, before) = fresh();
    assert_eq!(reason(&limiter), Some(RejectReason::RateLimited));
    let reads = clock.reads.load(Ordering::Relaxed) - before;
    assert!(reads > 0, "a rejection that starts a ban reads the clock");
    let mut lost = Vec::new();
    for steps in reloads {
        for k in 0..reads {
            let (limiter, clock, before) = fresh();
            let reloaded = Arc::new(AtomicBool::new(false));
            let hook: Box<dyn FnOnce() + Send> = {
                let (limiter, reloaded) = (Arc::clone(&limiter), Arc::clone(&reloaded));
                Box::new(move || {
                    for &step in steps {
                        limiter.reload(config(step)).unwrap();
                    }
                    reloaded.store(true, Ordering::Relaxed);
                })
            };
            *clock.hook.lock().unwrap() = Some((before + k, hook));
            assert_eq!(reason(&limiter), Some(RejectReason::RateLimited));
            assert!(
                reloaded.load(Ordering::Relaxed),
                "the reloads ran at reading {k}"
            );
            if reason(&limiter) != Some(RejectReason::Banned) {
                lost.push((steps, k));
            }
        }
    }
    assert!(
        lost.is_empty(),
        "bans started by a request with reloads (to these settings) at these of its {reads} \
         clock readings were lost: {lost:?}"
    );
}

/// Runs `hook` once, on this thread, when this thread next logs that a client is banned: the
/// point where a ban has just been written to its list and not yet passed on to the list a
/// reload replaced it with. Through one global subscriber (this binary installs no other),
/// whose writer looks at each line it is given.
fn when_banned(hook: Box<dyn FnOnce()>) {
    use std::cell::RefCell;
    use std::sync::Once;
    thread_local! {
        static HOOK: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }
    struct Sink;
    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if String::from_utf8_lossy(bytes).contains("client banned") {
                // Taken before it runs: the hook may log a ban itself.
                if let Some(run) = HOOK.with(|h| h.borrow_mut().take()) {
                    run();
                }
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| Sink)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("this test binary installs no other global subscriber");
        tracing::callsite::rebuild_interest_cache();
    });
    HOOK.with(|h| *h.borrow_mut() = Some(hook));
}

/// Why `limiter` rejects a GET of `/` from `ip`, grouped by `prefix` as the layer hands the
/// engine the address grouped as configured now; `None` if it admits it.
fn reason_grouped(
    limiter: &HttpLimiter<turnstile::ManualClock>,
    ip: std::net::IpAddr,
    prefix: u8,
) -> Option<turnstile::http::RejectReason> {
    let group = ipnet::IpNet::new(ip, prefix).unwrap().network();
    let request = turnstile::http::RequestInfo {
        method: &http::Method::GET,
        path: "/",
        client_ip: Some(group),
        client_id: None,
    };
    match limiter.decide(&request).outcome {
        turnstile::http::Outcome::Rejected { reason, .. } => Some(reason),
        _ => None,
    }
}

/// An unban made once a reload has carried a ban over stays done, even when the request that
/// started the ban under the old list passes it on to the new one after the unban: the ban
/// written, a reload (changing `[bans]`, or the grouping of addresses coarser or finer)
/// carries it over and an operator lifts it, and then the request, still deciding under the
/// old configuration, looks for the list that replaced its own.
#[test]
fn a_ban_passed_on_after_an_unban_lifted_it_stays_lifted() {
    use turnstile::http::RejectReason;
    type Limiter = HttpLimiter<turnstile::ManualClock>;
    let config = |(within, prefix): (&str, u8)| {
        HttpConfig::from_toml_str(&format!(
            "[client_ip]\nipv4_prefix = {prefix}\n\
             [[rules]]\nname = \"r\"\nperiod = \"1h\"\nlimit = 1\n\
             [bans]\nafter = 1\nwithin = \"{within}\"\nduration = \"1h\"\n"
        ))
        .unwrap()
    };
    let ip: std::net::IpAddr = "198.51.100.7".parse().unwrap();
    let mut back = Vec::new();
    for reload in [("2h", 28), ("1h", 24), ("1h", 32)] {
        let limiter = Arc::new(
            Limiter::with_clock(config(("1h", 28)), turnstile::ManualClock::new()).unwrap(),
        );
        let reason = |limiter: &Limiter, prefix: u8| reason_grouped(limiter, ip, prefix);
        assert_eq!(reason(&limiter, 28), None);
        let lifted = Arc::new(AtomicBool::new(false));
        when_banned({
            let (limiter, lifted) = (Arc::clone(&limiter), Arc::clone(&lifted));
            Box::new(move || {
                limiter.reload(config(reload)).unwrap();
                // Relaxed: read on this thread, after the request.
                lifted.store(limiter.unban(ip), Ordering::Relaxed);
            })
        });
        assert_eq!(reason(&limiter, 28), Some(RejectReason::RateLimited));
        assert!(
            lifted.load(Ordering::Relaxed),
            "{reload:?}: the reload carried the ban over, and the unban lifted it"
        );
        if reason(&limiter, reload.1) == Some(RejectReason::Banned) {
            back.push(reload);
        }
    }
    assert!(
        back.is_empty(),
        "lifted bans back after reloads to {back:?}"
    );
}

/// As above, with the ban started by another address of the group the operator lifts: a
/// reload makes the grouping coarser (`ipv4_prefix` 28, then 24), a request under the old
/// configuration bans 198.51.100.23 (its /28, `.16`), the reload carries that over as a ban of
/// the /24, and the operator unbans 198.51.100.7, which lifts the /24 (any address of a banned
/// group lifts it). The request then passes its ban on from the old list: the unban lifted
/// only `.7`'s /28 there (not banned), so the ban of `.16/28` was passed on and the /24 was
/// banned again, though the ban started before the unban. And through a second reload that
/// makes the grouping finer again (/32, the /24 inherited as a group): passed on through the
/// /24 list, the ban lands on the inherited /24, which covers `.7`.
#[test]
fn a_ban_of_another_member_of_the_lifted_group_passed_on_after_the_unban_stays_lifted() {
    use turnstile::http::RejectReason;
    type Limiter = HttpLimiter<turnstile::ManualClock>;
    let config = |prefix: u8| {
        HttpConfig::from_toml_str(&format!(
            "[client_ip]\nipv4_prefix = {prefix}\n\
             [[rules]]\nname = \"r\"\nperiod = \"1h\"\nlimit = 1\n\
             [bans]\nafter = 1\nwithin = \"1h\"\nduration = \"1h\"\n"
        ))
        .unwrap()
    };
    let banned: std::net::IpAddr = "198.51.100.23".parse().unwrap();
    let lifted_ip: std::net::IpAddr = "198.51.100.7".parse().unwrap();
    let reason = reason_grouped;
    let mut back = Vec::new();
    for reloads in [&[24][..], &[24, 32]] {
        let limiter =
            Arc::new(Limiter::with_clock(config(28), turnstile::ManualClock::new()).unwrap());
        assert_eq!(reason(&limiter, banned, 28), None);
        let lifted = Arc::new(AtomicBool::new(false));
        when_banned({
            let (limiter, lifted) = (Arc::clone(&limiter), Arc::clone(&lifted));
            Box::new(move || {
                for &prefix in reloads {
                    limiter.reload(config(prefix)).unwrap();
                }
                // Relaxed: read on this thread, after the request.
                lifted.store(limiter.unban(lifted_ip), Ordering::Relaxed);
            })
        });
        assert_eq!(
            reason(&limiter, banned, 28),
            Some(RejectReason::RateLimited)
        );
        assert!(
            lifted.load(Ordering::Relaxed),
            "{reloads:?}: the reloads carried the ban over to the /24, and the unban of another \
             member lifted it"
        );
        // A request of `.7` (under its new key, with its rule's full limit).
        let last = *reloads.last().unwrap();
        if reason(&limiter, lifted_ip, last).is_some() {
            back.push(reloads);
        }
    }
    assert!(
        back.is_empty(),
        "lifted bans back after reloads to {back:?}"
    );
}
