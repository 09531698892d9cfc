//! The target share of a member and which shards it takes or sheds: pure functions of
//! the sorted member list and what the member owns, so every member computes its own
//! part of the same balanced assignment.

use locks_port::PermitHolder;
use time::OffsetDateTime;

use crate::group::ShardGroup;
use crate::terms::Term;

/// The number of shards the member `me` should own among `members` (sorted, distinct,
/// `me` among them): ⌊N/M⌋, plus one for the first N mod M members of the list. The
/// shares add up to N. `None` when `me` is not listed.
#[must_use]
pub fn target_share(shards: usize, members: &[u32], me: u32) -> Option<usize> {
    let index = members.iter().position(|&m| m == me)?;
    let count = members.len();
    Some(shards / count + usize::from(index < shards % count))
}

/// The member list from the held membership slots, and the slot that stands for the
/// member `slot` (holder `holder_id`) in it: one slot per holder id, its lowest, so a
/// member whose old membership slot is still held (its backend stopped, not yet ended,
/// while it joined again under another) counts once, on every member's list alike.
/// Slots without a holder id count one each. Holder ids must be unique per process (as
/// the renewals need): two processes of one holder id would count as one, whose share
/// both then take, which over-subscribes the shards and leaves none unowned.
pub(crate) fn members_of<'a>(
    held: impl IntoIterator<Item = (u32, Option<&'a str>)>,
    slot: u32,
    holder_id: Option<&str>,
) -> (Vec<u32>, u32) {
    let mut lowest: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    let mut members = Vec::new();
    for (held, holder) in held {
        match holder {
            Some(holder) => {
                let kept = lowest.entry(holder).or_insert(held);
                *kept = (*kept).min(held);
            }
            None => members.push(held),
        }
    }
    let me = holder_id
        .and_then(|holder| lowest.get(holder).copied())
        .map_or(slot, |kept| kept.min(slot));
    members.extend(lowest.into_values());
    members.sort_unstable();
    members.dedup();
    (members, me)
}

/// How many members a process joining for the first time expects back, from the group's
/// latest terms: the distinct holder ids of the terms that did not end (a clean leave
/// ends its terms; a crash or an outage leaves them). The joiner counts as one of them
/// whether or not its own holder id is among them: a process started again has a new
/// holder id (they are unique per process), so one not among them most likely stands in
/// for one that is, as a member killed during an outage and started again does. Terms
/// without a holder id say nothing.
pub(crate) fn expected_from_terms<'a>(terms: impl IntoIterator<Item = &'a Term>) -> usize {
    let holders: std::collections::BTreeSet<&str> = terms
        .into_iter()
        .filter(|term| !term.ended)
        .filter_map(|term| term.holder_id.as_deref())
        .collect();
    holders.len().max(1)
}

/// The shards to shed from `owned` (each with when its term began) to come down to
/// `share`: the ones held longest, those `slot` scores lowest among equals, so that the
/// choice is stable from one tick to the next. Each move leaves its shard unowned for a
/// moment; shedding the longest held spreads the moves over the shards, where a fixed
/// order (the score alone) moved the same few at every change of the members (a soak
/// moved one shard 21 times to members started again, against 7 on average).
pub(crate) fn to_shed(
    group: &ShardGroup,
    slot: u32,
    owned: &[(usize, OffsetDateTime)],
    share: usize,
) -> Vec<usize> {
    let mut ranked: Vec<(usize, OffsetDateTime)> = owned.to_vec();
    ranked.sort_by_key(|&(shard, since)| (since, group.score(slot, shard), shard));
    ranked.truncate(owned.len().saturating_sub(share));
    ranked.into_iter().map(|(shard, _)| shard).collect()
}

/// The shards `slot` does not own, in the order it tries them: first those no other
/// listed member most likely holds (`busy` says which it does, from the term store),
/// among them first those for which `slot` scores highest among the listed `members`
/// (so that members taking a dead member's shards at once mostly try different ones),
/// then by its own score. A busy shard is still tried, last: the term store may be
/// behind the locks.
pub(crate) fn to_try(
    group: &ShardGroup,
    slot: u32,
    owned: &[usize],
    members: &[u32],
    busy: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let mut ranked: Vec<usize> = (0..group.len()).filter(|s| !owned.contains(s)).collect();
    // The rank among the members is computed for the free shards only (a score is a
    // hash): a busy shard comes last whatever its rank.
    ranked.sort_by_cached_key(|&shard| {
        let mine = group.score(slot, shard);
        let busy = busy(shard);
        let above = if busy {
            0
        } else {
            members
                .iter()
                .filter(|&&other| {
                    other != slot && (group.score(other, shard), other) > (mine, slot)
                })
                .count()
        };
        (busy, above, std::cmp::Reverse(mine), shard)
    });
    ranked
}

/// Whether `term` is most likely still held by a listed member: it did not end, and its
/// owner is listed (by holder id, or by slot for a member without one). A term of a
/// member that died, or that ended (a hand-off), says its shard is most likely free.
pub(crate) fn held_by_listed(term: &Term, listed: &[PermitHolder]) -> bool {
    !term.ended
        && listed
            .iter()
            .any(|h| match (&term.holder_id, &h.holder_id) {
                (Some(owner), Some(holder)) => owner == holder,
                (None, None) => h.slot == term.member,
                _ => false,
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_balanced_and_add_up() {
        for n in 1..60 {
            for m in 1..12u32 {
                let members: Vec<u32> = (0..m).map(|i| i * 3 + 1).collect();
                let shares: Vec<usize> = members
                    .iter()
                    .map(|&me| target_share(n, &members, me).expect("listed"))
                    .collect();
                assert_eq!(shares.iter().sum::<usize>(), n);
                let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(max - min <= 1, "n={n} m={m}: {shares:?}");
            }
        }
        assert_eq!(target_share(4, &[1, 2], 3), None);
    }

    #[test]
    fn a_member_holding_two_slots_counts_once_on_every_list() {
        let held = [
            (1, Some("a")),
            (2, Some("b")),
            (5, Some("c")),
            (7, Some("c")),
        ];
        // c holds 5 (its stopped backend) and 7: 5 stands for it on every list.
        assert_eq!(members_of(held, 7, Some("c")), (vec![1, 2, 5], 5));
        assert_eq!(members_of(held, 2, Some("b")), (vec![1, 2, 5], 2));
        // Slots without a holder id count one each; a member not yet listed keeps its slot.
        let anonymous = [(3, None), (4, None), (6, Some("d"))];
        assert_eq!(members_of(anonymous, 4, None), (vec![3, 4, 6], 4));
        assert_eq!(members_of(anonymous, 9, Some("e")), (vec![3, 4, 6], 9));
    }

    #[test]
    fn a_fresh_member_expects_the_holders_of_the_terms_that_did_not_end() {
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let term = |shard: &str, holder: Option<&str>, ended: bool| {
            Term::new(shard, 1, 0, holder.map(str::to_owned), at, ended)
        };
        let terms = [
            term("s0", Some("a"), false),
            term("s1", Some("a"), false),
            term("s2", Some("b"), false),
            term("s3", Some("c"), true),
            term("s4", None, false),
            term("s5", Some("d"), false),
        ];
        // a, b and d left terms behind; c left cleanly; the anonymous term says nothing.
        assert_eq!(expected_from_terms(&terms), 3);
        assert_eq!(expected_from_terms(&terms[3..5]), 1, "nobody to wait for");
        assert_eq!(expected_from_terms(&[]), 1, "a group's first start");
    }

    #[test]
    fn shedding_is_stable_and_exact_and_sheds_the_longest_held_first() {
        let group = ShardGroup::new("g", (0..24).map(|i| format!("s{i}"))).unwrap();
        let at = |seconds: i64| OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(seconds);
        let alike: Vec<(usize, OffsetDateTime)> = (0..10).map(|s| (s, at(0))).collect();
        let shed = to_shed(&group, 7, &alike, 6);
        assert_eq!(shed.len(), 4);
        assert_eq!(shed, to_shed(&group, 7, &alike, 6));
        assert!(to_shed(&group, 7, &alike, 12).is_empty());
        // Shards 6..10 taken later (from a member that died): the four held longest go,
        // whatever their scores, and the same four on every tick.
        let taken_late: Vec<(usize, OffsetDateTime)> = (0..10)
            .map(|s| {
                (
                    s,
                    at(if s >= 6 {
                        100
                    } else {
                        i64::try_from(s).unwrap()
                    }),
                )
            })
            .collect();
        assert_eq!(to_shed(&group, 7, &taken_late, 6), vec![0, 1, 2, 3]);
        assert_eq!(to_shed(&group, 7, &taken_late, 6), vec![0, 1, 2, 3]);
        let owned: Vec<usize> = alike.iter().map(|&(s, _)| s).collect();
        let tried = to_try(&group, 7, &owned, &[7], |_| false);
        assert_eq!(tried.len(), 14);
        assert!(tried.iter().all(|s| !owned.contains(s)));
    }

    #[test]
    fn free_shards_are_tried_first_and_members_taking_at_once_mostly_try_different_ones() {
        let group = ShardGroup::new("g", (0..24).map(|i| format!("s{i}"))).unwrap();
        // A dead member's 8 shards are free; the other 16 are owned, 8 by each of two
        // survivors, slots 1 and 2.
        let (one, two): (Vec<usize>, Vec<usize>) = (0..16).partition(|s| s % 2 == 0);
        let free = |shard: usize| shard >= 16;
        let first = |slot: u32, owned: &[usize]| -> Vec<usize> {
            to_try(&group, slot, owned, &[1, 2], |s| {
                !free(s) && !owned.contains(&s)
            })
            .into_iter()
            .take(4)
            .collect()
        };
        let (by_one, by_two) = (first(1, &one), first(2, &two));
        assert!(
            by_one.iter().chain(&by_two).all(|&s| free(s)),
            "{by_one:?} {by_two:?}"
        );
        // Each tries first the free shards it outscores the other on: 8 between them,
        // whatever the split, with no shard first for both unless one outscores on more
        // than 4.
        let outscores = |slot: u32, other: u32| {
            (16..24)
                .filter(|&s| group.score(slot, s) > group.score(other, s))
                .count()
        };
        let overlap = by_one.iter().filter(|s| by_two.contains(s)).count();
        let surplus = outscores(1, 2).abs_diff(4);
        assert!(
            overlap <= surplus,
            "{overlap} tried first by both, {surplus} expected at most"
        );
        // A busy shard is still tried, after every free one.
        let all = to_try(&group, 1, &one, &[1, 2], |s| !free(s));
        assert_eq!(all.len(), 16);
        assert!(all[..8].iter().all(|&s| free(s)) && all[8..].iter().all(|&s| !free(s)));
    }

    #[test]
    fn a_term_is_busy_while_it_did_not_end_and_its_owner_is_listed() {
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let listed = [
            PermitHolder::new(1, Some("a".into()), None),
            PermitHolder::new(4, None, None),
        ];
        let term = |member: u32, holder: Option<&str>, ended: bool| {
            Term::new("s", 1, member, holder.map(str::to_owned), at, ended)
        };
        assert!(
            held_by_listed(&term(9, Some("a"), false), &listed),
            "a, under another slot"
        );
        assert!(!held_by_listed(&term(1, Some("a"), true), &listed), "ended");
        assert!(
            !held_by_listed(&term(1, Some("dead"), false), &listed),
            "its owner gone"
        );
        assert!(
            held_by_listed(&term(4, None, false), &listed),
            "anonymous, by slot"
        );
        assert!(!held_by_listed(&term(5, None, false), &listed));
    }
}
