//! Unit tests of the bookkeeping's pure logic (no connection needed: the slots are empty).

use super::*;

fn book() -> Book {
    Book::new(Arc::new(Metrics::new(false, None, false)))
}

/// An entry whose session slot is empty (no connection: the book never looks
/// inside it).
fn held(key: &str, lock_id: i64, ticket: u64, mode: LockMode, holding: Holding) -> Held {
    let info = LockInfo::acquired_now(key, lock_id, None).with_mode(mode);
    Held::new(
        Arc::from(key),
        ticket,
        &info,
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
    assert_eq!(book.entries_mut().count(), 500 - 167);
    assert_eq!(book.drain().len(), 500 - 167);
    assert!(book.is_empty() && book.get_mut(&ticket(1)).is_none());
}
