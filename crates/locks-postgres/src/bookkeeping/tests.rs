//! Unit tests of the bookkeeping's pure logic (no connection needed: the slots are empty).

use super::*;
use crate::multiplex::Membership;

fn book() -> Book {
    Book::new(Arc::new(Metrics::new(false, None, false)))
}

/// An entry whose session slot is empty (no connection: the book never looks
/// inside it).
fn held(key: &str, lock_id: i64, ticket: u64, mode: LockMode, holding: Holding) -> Held {
    let granted = Granted::now();
    let info = granted.info(Arc::from(key), lock_id, None).with_mode(mode);
    Held::new(
        Arc::from(key),
        ticket,
        &info,
        granted,
        crate::slot::Slot::empty(),
        LossNotifier::new(),
        holding,
    )
}

#[test]
fn shared_holds_stack_and_an_exclusive_grant_displaces_them() {
    let mut book = book();
    assert!(
        book.insert(held("k", 7, 1, LockMode::Shared, Holding::Alone))
            .is_empty()
    );
    assert!(
        book.insert(held("k", 7, 2, LockMode::Shared, Holding::Alone))
            .is_empty()
    );
    assert_eq!(book.len(), 2);
    assert!(book.contains("k", 7) && !book.contains("other key, same id", 7));
    // Only a transaction-pooling proxy can make the server grant this: the book
    // keeps the newest and hands back the two it displaces.
    let displaced = book.insert(held("k", 7, 3, LockMode::Exclusive, Holding::Alone));
    assert_eq!(displaced.len(), 2);
    assert_eq!(book.len(), 1);
    assert_eq!(book.remove_one(7, 3).map(|held| held.ticket), Some(3));
    assert!(book.is_empty() && !book.contains("k", 7));
    assert!(book.remove_one(7, 3).is_none(), "taken out once");
}

#[test]
fn a_downgraded_entry_is_shared_and_a_later_shared_grant_stacks_beside_it() {
    let mut book = book();
    book.insert(held("k", 7, 1, LockMode::Exclusive, Holding::Alone));
    let ticket = Ticket {
        lock_id: 7,
        number: 1,
    };
    assert!(book.set_mode(&ticket, LockMode::Shared));
    assert_eq!(
        book.get_mut(&ticket).map(|held| held.mode()),
        Some(LockMode::Shared)
    );
    assert!(
        book.insert(held("k", 7, 2, LockMode::Shared, Holding::Alone))
            .is_empty(),
        "a shared grant beside a downgraded lock displaces nothing"
    );
    assert_eq!(book.len(), 2);
    let gone = Ticket {
        lock_id: 7,
        number: 9,
    };
    assert!(!book.set_mode(&gone, LockMode::Shared), "no such ticket");
    assert_eq!(
        book.remove_one(7, 1).map(|held| held.mode()),
        Some(LockMode::Shared)
    );
}

#[test]
fn remove_one_takes_only_its_ticket_and_keeps_the_other_holds_of_the_id() {
    let mut book = book();
    book.insert(held("k", 7, 1, LockMode::Shared, Holding::Alone));
    book.insert(held("k", 7, 2, LockMode::Shared, Holding::Alone));
    assert!(book.remove_one(7, 9).is_none(), "no such ticket");
    assert_eq!(book.len(), 2);
    assert_eq!(book.remove_one(7, 1).map(|held| held.ticket), Some(1));
    assert!(book.contains("k", 7));
    assert_eq!(book.len(), 1);
}

#[test]
fn a_lost_group_member_takes_its_whole_group_and_nothing_else() {
    let mut book = book();
    let group = Arc::new(Group::new(vec![1, 2, 3].into_boxed_slice()));
    for id in [1, 2, 3] {
        let holding = Holding::Group(Arc::clone(&group));
        book.insert(held(&format!("g{id}"), id, 5, LockMode::Exclusive, holding));
    }
    book.insert(held("alone", 4, 6, LockMode::Exclusive, Holding::Alone));
    let taken = book.remove_with_group(&Ticket {
        lock_id: 2,
        number: 5,
    });
    let mut ids: Vec<i64> = taken.iter().map(Held::lock_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(book.len(), 1);
    assert!(book.contains("alone", 4));
    // A group's session goes back with its last member's leaving.
    let mut taken = taken;
    let left: Vec<bool> = taken.iter_mut().map(Held::leave_session).collect();
    assert_eq!(left, [false, false, true]);
}

#[test]
fn background_unlocks_are_counted_per_unlock() {
    let mut book = book();
    book.releasing(7);
    book.releasing(7);
    book.released(7);
    assert!(book.is_releasing(7), "one of two unlocks still in flight");
    book.released(7);
    book.released(7);
    assert!(!book.is_releasing(7));
}

/// The book's table holds entries inline, one slot each, and a table of a million held
/// locks has about two million slots: each byte of an entry is about two bytes a held
/// lock. Grow it only knowingly (`docs/benchmarks.md`, bytes a held lock).
#[test]
fn an_entry_stays_within_its_bytes() {
    assert!(
        std::mem::size_of::<Held>() <= 88,
        "a book entry is {} bytes",
        std::mem::size_of::<Held>()
    );
}

#[test]
fn taking_entries_out_anywhere_keeps_every_other_entry_found() {
    let mut book = book();
    let ticket = |n: u64| Ticket {
        lock_id: i64::try_from(n % 97).unwrap_or(0),
        number: n,
    };
    for n in 0..500 {
        let mode = LockMode::Shared;
        book.insert(held("k", ticket(n).lock_id, n, mode, Holding::Alone));
    }
    // From the middle, the front and the back: each moves another entry into its place.
    for n in (0..500).filter(|n| n % 3 == 0) {
        let Ticket { lock_id, number } = ticket(n);
        assert_eq!(book.remove_one(lock_id, number).map(|h| h.ticket), Some(n));
    }
    assert_eq!(book.len(), 500 - 167);
    for n in 0..500 {
        let found = book.get_mut(&ticket(n)).map(|held| held.ticket);
        assert_eq!(found, (n % 3 != 0).then_some(n), "ticket {n}");
    }
    assert_eq!(book.entries().count(), 500 - 167);
    assert_eq!(book.drain().len(), 500 - 167);
    assert!(book.is_empty() && book.get_mut(&ticket(1)).is_none());
}

/// The entries on connections of their own stay first and those on shared connections
/// after them, whatever is taken out where, and the book counts each shared connection
/// while it holds entries: the monitor looks at the first run entry by entry and at the
/// shared connections once each.
#[test]
fn own_entries_stay_first_and_shared_connections_are_counted_once() {
    let mut book = book();
    let slots: Vec<SessionSlot> = (0..3).map(|_| crate::slot::Slot::empty()).collect();
    let entry = |n: u64| {
        let lock_id = i64::try_from(n % 89).unwrap_or(0);
        let holding = if n.is_multiple_of(3) {
            Holding::Alone
        } else {
            let slot = Arc::clone(&slots[usize::try_from(n % 3).unwrap_or(0)]);
            Holding::Shared(Membership::on_slot(slot, lock_id))
        };
        let mut held = held("k", lock_id, n, LockMode::Shared, holding);
        if let Holding::Shared(member) = &held.holding {
            held.slot = Arc::clone(member.slot());
        }
        held
    };
    let mut live: Vec<u64> = Vec::new();
    // A fixed walk of inserts and removals from anywhere (a linear congruential step).
    let mut step: u64 = 7;
    for n in 0..2_000u64 {
        step = step.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        if live.is_empty() || (step >> 33) % 5 < 3 {
            book.insert(entry(n));
            live.push(n);
        } else {
            let at = usize::try_from((step >> 33) % live.len() as u64).unwrap_or(0);
            let gone = live.swap_remove(at);
            let lock_id = i64::try_from(gone % 89).unwrap_or(0);
            assert_eq!(book.remove_one(lock_id, gone).map(|h| h.ticket), Some(gone));
        }
        assert!(
            book.own_entries()
                .all(|h| !matches!(h.holding, Holding::Shared(_)))
        );
        assert!(
            book.shared_entries()
                .all(|h| matches!(h.holding, Holding::Shared(_)))
        );
        let on = |slot: &SessionSlot| {
            book.shared_entries()
                .filter(|h| Arc::ptr_eq(h.slot(), slot))
                .count()
        };
        assert!(book.shared_slots().all(|slot| on(slot) > 0));
        let holding = slots.iter().filter(|slot| on(slot) > 0).count();
        assert_eq!(book.shared_slots().count(), holding, "after step {n}");
    }
    assert_eq!(book.len(), live.len());
    for &n in &live {
        let ticket = Ticket {
            lock_id: i64::try_from(n % 89).unwrap_or(0),
            number: n,
        };
        assert_eq!(
            book.get_mut(&ticket).map(|h| h.ticket),
            Some(n),
            "ticket {n}"
        );
    }
    book.drain();
    assert_eq!(book.shared_slots().count(), 0);
}

#[test]
fn a_grant_time_is_one_reading_the_guard_and_the_entry_share() {
    for _ in 0..1000 {
        let before = SystemTime::now();
        let granted = Granted::now();
        let after = SystemTime::now();
        assert!(before <= granted.at && granted.at <= after, "{granted:?}");
        let info = granted.info(Arc::from("k"), 1, None);
        assert_eq!(info.acquired_at_system_time(), granted.at);
        let entry = Held::new(
            Arc::from("k"),
            1,
            &info,
            granted,
            crate::slot::Slot::empty(),
            LossNotifier::new(),
            Holding::Alone,
        );
        assert_eq!(
            entry.since(),
            info.acquired_at_system_time(),
            "the entry's time is the guard's, to the nanosecond"
        );
    }
}
