//! The target share of a member and which shards it takes or sheds: pure functions of
//! the sorted member list and what the member owns, so every member computes its own
//! part of the same balanced assignment.

use crate::group::ShardGroup;

/// The number of shards the member `me` should own among `members` (sorted, distinct,
/// `me` among them): ⌊N/M⌋, plus one for the first N mod M members of the list. The
/// shares add up to N. `None` when `me` is not listed.
#[must_use]
pub fn target_share(shards: usize, members: &[u32], me: u32) -> Option<usize> {
    let index = members.iter().position(|&m| m == me)?;
    let count = members.len();
    Some(shards / count + usize::from(index < shards % count))
}

/// The shards to shed from `owned` to come down to `share`: the ones `slot` scores
/// lowest, so that the choice is stable from one tick to the next.
pub(crate) fn to_shed(group: &ShardGroup, slot: u32, owned: &[usize], share: usize) -> Vec<usize> {
    let mut ranked: Vec<usize> = owned.to_vec();
    ranked.sort_by_key(|&shard| (group.score(slot, shard), shard));
    ranked.truncate(owned.len().saturating_sub(share));
    ranked
}

/// The shards `slot` does not own, in the order it tries them: highest score first.
pub(crate) fn to_try(group: &ShardGroup, slot: u32, owned: &[usize]) -> Vec<usize> {
    let mut ranked: Vec<usize> = (0..group.len()).filter(|s| !owned.contains(s)).collect();
    ranked.sort_by_key(|&shard| (std::cmp::Reverse(group.score(slot, shard)), shard));
    ranked
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
    fn shedding_is_stable_and_exact() {
        let group = ShardGroup::new("g", (0..24).map(|i| format!("s{i}"))).unwrap();
        let owned: Vec<usize> = (0..10).collect();
        let shed = to_shed(&group, 7, &owned, 6);
        assert_eq!(shed.len(), 4);
        assert_eq!(shed, to_shed(&group, 7, &owned, 6));
        assert!(to_shed(&group, 7, &owned, 12).is_empty());
        let tried = to_try(&group, 7, &owned);
        assert_eq!(tried.len(), 14);
        assert!(tried.iter().all(|s| !owned.contains(s)));
    }
}
