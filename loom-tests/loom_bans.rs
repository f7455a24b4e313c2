//! Loom model of `BanList::fail` racing `BanList::unban` (`src/bans.rs`).
//!
//! Protocol: a failure counts itself in the failures table and, if it is an `after`-th, charges
//! the bans table; an unban resets both tables. Both hold the key's stripe mutex throughout, so an
//! unban comes wholly before a failure (which then counts after it, and bans) or wholly after
//! it (and lifts its ban). Without the failure's hold from its count on, an unban between the
//! count and the charge forgot the failure and then saw its ban land: a key banned with no
//! failure counted. The model asserts that the outcome is one of the two orders.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom cargo test --release -p turnstile-loom-tests --test loom_bans`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::thread;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::time::Duration;
use turnstile::{BanList, ManualClock};

/// A hasher with fixed keys, so every loom execution puts a key in the same shard.
type Fixed = BuildHasherDefault<DefaultHasher>;

#[test]
fn an_unban_is_wholly_before_or_after_a_failure() {
    model(|| {
        let bans = Arc::new(
            BanList::<u64>::builder(1, Duration::from_secs(60), Duration::from_secs(60))
                .clock(ManualClock::new())
                .hasher(Fixed::default())
                .build()
                .unwrap(),
        );
        let failing = {
            let bans = Arc::clone(&bans);
            thread::spawn(move || bans.fail(&1).unwrap())
        };
        let unbanned = bans.unban(&1);
        let outcome = failing.join().unwrap();
        assert!(outcome.ban_started);
        let banned = bans.check(&1).is_err();
        let failures = bans.failures(&1);
        match (banned, failures) {
            // The failure first: the unban lifted its ban and forgot it.
            (false, 0) => assert!(unbanned),
            // The unban first: it found nothing, and the failure counted and banned after it.
            (true, 1) => assert!(!unbanned),
            other => panic!("banned and failures {other:?}: neither order"),
        }
    });
}
