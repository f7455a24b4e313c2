//! A private `redis-server` per test: started on a free port with no persistence, ready once it
//! answers PING, killed when dropped. A missing `redis-server` is a test failure with a clear
//! message, never a skip (`.ci/run` installs it with apt-get).
//!
//! `TURNSTILE_REDIS_SERVER` and `TURNSTILE_REDIS_CLI` name other binaries of the same protocol:
//! `.ci/run` runs the Redis tests a second time with `valkey-server` and `valkey-cli`. A named
//! binary that cannot run fails the tests the same way.

#![allow(dead_code)] // each test binary uses the parts it needs

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use turnstile::redis;

/// The server binary: `TURNSTILE_REDIS_SERVER`, or `redis-server`.
pub fn server_binary() -> String {
    std::env::var("TURNSTILE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The command-line client (for `--cluster create`): `TURNSTILE_REDIS_CLI`, or `redis-cli`.
fn cli_binary() -> String {
    std::env::var("TURNSTILE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// How to install `binary` when it cannot run.
fn install_hint(binary: &str) -> &'static str {
    if binary.starts_with("valkey") {
        "apt-get install -y valkey-server (Debian 12: from bookworm-backports; `.ci/run` does)"
    } else {
        "apt-get update && apt-get install -y redis-server (`.ci/run` does)"
    }
}

/// One redis-server process, owned by the test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: std::path::PathBuf,
    /// Arguments beyond the defaults (port, bind, no persistence, dir).
    extra: Vec<&'static str>,
}

/// A port nobody listens on right now (the server binds it a moment later), never handed out
/// before in this process.
///
/// Not the OS's pick (`bind(0)`): that is the next ephemeral port, which the OS hands out again
/// once it is free, and a test kills its server to see Redis gone. Another test starting its
/// server meanwhile could then get that very port, and the first test's client reconnected to
/// it: a "Redis down" test saw a stranger's Redis answer (`the_fallback_follows_a_reconfiguration`
/// failed so once, admitted by the other server). Ports come from 10000–31999, below Linux's
/// ephemeral range (so no connection's own port takes one either), each at most once per
/// process, from an offset of the process id (cargo runs test binaries one at a time).
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 10_000;
    const COUNT: u32 = 22_000;
    let offset = std::process::id().wrapping_mul(7_919) % COUNT;
    for _ in 0..COUNT {
        // Relaxed: a counter; each number is handed out once whatever the order.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (offset + n) % COUNT) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free TCP port on 127.0.0.1 in {FIRST}..{}",
        FIRST + COUNT
    )
}

/// Whether a server on `port` answers PING with PONG.
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    matches!(stream.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    ///
    /// # Panics
    ///
    /// If `redis-server` is not installed, or does not answer within 10 s.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// As [`start`](Self::start), with extra arguments for redis-server.
    pub fn start_with(extra: &[&'static str]) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "turnstile-redis-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir)
            .expect("cannot create a temporary directory for redis-server");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra: extra.to_vec(),
        };
        // The port can be taken between our probe and the server's bind: try a few.
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("{} did not start on any of 5 free ports", server_binary());
    }

    /// Starts the server process on `self.port`; false if it exited (port taken).
    fn spawn(&mut self) -> bool {
        let binary = server_binary();
        let child = Command::new(&binary)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => panic!(
                "cannot run `{binary}` ({e}). The Redis tests need it and never skip: {}.",
                install_hint(&binary)
            ),
        };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if answers_ping(self.port) {
                self.child = Some(child);
                return true;
            }
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{binary} on port {} did not answer PING within 10 s",
            self.port
        );
    }

    /// `redis://127.0.0.1:port/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A plain synchronous connection, for inspecting the server from a test.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("cannot connect to the test's redis-server")
    }

    /// The process id, while running.
    fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is not running").id()
    }

    /// `kill -9`: the server vanishes at once, with all its state.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (no persistence).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "{} could not be restarted on port {}",
            server_binary(),
            self.port
        );
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("cannot run `kill`");
        assert!(status.success(), "kill {signal} failed");
    }

    /// SIGSTOP: the server keeps its connections but answers nothing (a black hole).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: the server resumes and answers what it was sent meanwhile.
    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused server would not die of SIGKILL any later, but resume it for good measure.
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `masters` masters (no replicas), each a [`RedisServer`] started with
/// `--cluster-enabled yes`, joined by `redis-cli --cluster create`, ready once every node reports
/// `cluster_state:ok`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// # Panics
    ///
    /// If `redis-server` or `redis-cli` is missing, or the cluster is not ready within 20 s.
    pub fn start(masters: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_cluster_node())
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let cli = cli_binary();
        let output = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{cli}` ({e}): it comes with the server: {}",
                    install_hint(&server_binary())
                )
            });
        assert!(
            output.status.success(),
            "{cli} --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let started = Instant::now();
        for node in &nodes {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the cluster is not ready: {info}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        RedisCluster { nodes }
    }

    /// The nodes' URLs, for `ClusterClient::new`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

impl RedisServer {
    /// A server started as an empty cluster node (its node file in its own directory).
    fn start_cluster_node() -> RedisServer {
        RedisServer::start_with(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
    }
}

/// The keys under `prefix` that `con` holds, after checking that every one carries a TTL.
///
/// `PTTL` answers -1 for a key without a TTL: that fails. A key whose TTL runs out between
/// the `SCAN` and its `PTTL` answers 0 (less than a millisecond left) or -2 (gone); both
/// carried a TTL, so both pass, and a gone key is left out of the answer.
pub fn assert_all_keys_expire(con: &mut redis::Connection, prefix: &str) -> Vec<String> {
    use redis::Commands;
    let keys: Vec<String> = con
        .scan_match(format!("{prefix}:*"))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut live = Vec::with_capacity(keys.len());
    for key in keys {
        let ttl: i64 = con.pttl(&key).unwrap();
        assert!(ttl != -1, "key {key} has no TTL (PTTL {ttl})");
        assert!(ttl >= -2, "key {key}: unexpected PTTL {ttl}");
        if ttl != -2 {
            live.push(key);
        }
    }
    live
}

/// Redis's clock, in µs since the Unix epoch.
pub fn redis_now(con: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
    s * 1_000_000 + us
}

/// Makes sure at least `room` is left of the current epoch-aligned window of `window` on Redis's
/// clock, waiting for the next window if less is (plus 5 ms): for tests that decide in fixed
/// windows or sliding counters aligned to Redis's clock (the HTTP rules' fixed windows too),
/// whose answers change if such a window ends between two of their calls (the key expires and
/// the count starts afresh, a retry-after is cut short by the window's end). The wait is at
/// most `room`, and only when the test starts that close to a boundary.
pub fn room_in_window(con: &mut redis::Connection, window: Duration, room: Duration) {
    assert!(
        room < window,
        "room {room:?} must be shorter than the window {window:?}"
    );
    let w = window.as_micros() as u64;
    let left = w - redis_now(con) % w;
    if left < room.as_micros() as u64 {
        std::thread::sleep(Duration::from_micros(left) + Duration::from_millis(5));
    }
}
