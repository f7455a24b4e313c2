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

/// A ban list as the hand-over models use it: a ban at the first failure, a fixed hasher.
type List = BanList<u64, ManualClock, Fixed>;

fn list() -> Arc<List> {
    Arc::new(
        BanList::<u64>::builder(1, Duration::from_secs(60), Duration::from_secs(60))
            .clock(ManualClock::new())
            .hasher(Fixed::default())
            .build()
            .unwrap(),
    )
}

/// The hand-over of a reload that replaces a ban list, modelled over two real lists: a ban
/// that starts in the old list while the reload hands it over reaches the new one.
///
/// Protocol (`Bans::hand_over`, `Bans::pass_on` in `src/http/rules.rs`, whose HTTP feature loom
/// does not build; this replays their steps in their order over the real `BanList`s): the
/// reload sets the old list's successor under a mutex, then carries the old list's bans over
/// (`banned`, then `ban` in the new list); a request's failure starts its ban in the old list,
/// then reads the successor under the same mutex and, if set, bans in it too. Whichever takes
/// the mutex first, the other sees its write: the ban is carried, or passed on, or both.
#[test]
fn a_ban_started_during_a_hand_over_reaches_the_new_list() {
    model(|| {
        let (old, new) = (list(), list());
        let successor = Arc::new(loom::sync::Mutex::new(None::<Arc<List>>));
        let request = {
            let (old, successor) = (Arc::clone(&old), Arc::clone(&successor));
            thread::spawn(move || {
                assert!(old.fail(&1).unwrap().ban_started);
                let next = successor.lock().unwrap().clone();
                if let (Some(next), Err(banned)) = (next, old.check(&1)) {
                    next.ban(&1, banned.retry_after()).unwrap();
                }
            })
        };
        *successor.lock().unwrap() = Some(Arc::clone(&new));
        for (key, left) in old.banned() {
            new.ban(&key, left).unwrap();
        }
        request.join().unwrap();
        assert!(
            new.check(&1).is_err(),
            "the ban was neither carried nor passed on"
        );
    });
}

/// An operator's unban after a reload's hand-over, racing a ban that a request started in the
/// old list and passes on, modelled over two real lists: the unban stays done.
///
/// Protocol (`Bans::pass_on` and `Bans::lift` in `src/http/rules.rs`, replayed in their order):
/// the request's pass-on (successor read, then the old list's ban read and placed in the new
/// list) and the unban (lifted in the old list, then in the new one) each run whole under one
/// mutex. An unban that lifted the ban in the new list (the carry had copied it) must leave
/// the client unbanned; and a ban the unban found nowhere started after it, so stays.
#[test]
fn an_unban_after_a_hand_over_is_not_undone_by_a_pass_on() {
    model(|| {
        let (old, new) = (list(), list());
        let successor = Arc::new(loom::sync::Mutex::new(None::<Arc<List>>));
        let handing_over = Arc::new(loom::sync::Mutex::new(()));
        let request = {
            let (old, successor, handing_over) = (
                Arc::clone(&old),
                Arc::clone(&successor),
                Arc::clone(&handing_over),
            );
            thread::spawn(move || {
                assert!(old.fail(&1).unwrap().ban_started);
                let next = successor.lock().unwrap().clone();
                if let Some(next) = next {
                    let _one_at_a_time = handing_over.lock().unwrap();
                    if let Err(banned) = old.check(&1) {
                        next.ban(&1, banned.retry_after()).unwrap();
                    }
                }
            })
        };
        // The reload: hand over, then carry.
        *successor.lock().unwrap() = Some(Arc::clone(&new));
        for (key, left) in old.banned() {
            new.ban(&key, left).unwrap();
        }
        // The unban, after the reload.
        let (in_old, in_new) = {
            let _one_at_a_time = handing_over.lock().unwrap();
            (old.unban(&1), new.unban(&1))
        };
        request.join().unwrap();
        let banned = new.check(&1).is_err();
        assert!(
            !(in_new && banned),
            "the unban lifted the ban, and it is back"
        );
        assert!(banned || in_old || in_new, "the ban was lost with no unban");
    });
}
