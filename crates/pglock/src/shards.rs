//! `pglock shards GROUP [--json]`: who owns which shard of a `locks-shard` group now, with
//! each term's token and start, and the group's members (ADR 0027).

use locks_port::LockAcquisitionError;
use locks_postgres::PostgresLockManager;
use locks_shard::{Shards, owners_by_name};
use locks_shard_postgres::{MEMBERS_TABLE, PostgresShardTerms, TERMS_TABLE};
use serde::Serialize;

use crate::connect::{self, Target};
use crate::exit::{Failure, SOFTWARE, chain};
use crate::inspect::rfc3339_micros;
use crate::text::out;

/// `pglock shards GROUP --json`.
#[derive(Debug, Serialize)]
struct Document<'a> {
    group: &'a str,
    members: &'a [u32],
    shards: Vec<Shard<'a>>,
}

#[derive(Debug, Serialize)]
struct Shard<'a> {
    shard: &'a str,
    owner: Option<Owner<'a>>,
}

#[derive(Debug, Serialize)]
struct Owner<'a> {
    member: u32,
    holder_id: Option<&'a str>,
    token: i64,
    since: String,
}

/// The document: the members' slots, and each shard (by name) with its owner or `null`.
fn document(group: &str, shards: &Shards) -> String {
    let document = Document {
        group,
        members: &shards.members,
        shards: shards
            .shards
            .iter()
            .map(|(shard, owner)| Shard {
                shard,
                owner: owner.as_ref().map(|owner| Owner {
                    member: owner.member,
                    holder_id: owner.holder_id.as_deref(),
                    token: owner.token,
                    since: rfc3339_micros(owner.since),
                }),
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&document).unwrap_or_default();
    text.push('\n');
    text
}

/// The table: a line per shard, and the members.
fn table(group: &str, shards: &Shards) -> String {
    let quoted = crate::text::quoted(group);
    if shards.shards.is_empty() {
        return format!("no shard of {quoted} has run yet\n");
    }
    let width = shards
        .shards
        .iter()
        .map(|(shard, _)| crate::text::escaped(shard).chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut text = format!(
        "{:width$}  {:>6}  {:>6}  {:27}  HOLDER\n",
        "SHARD", "MEMBER", "TOKEN", "SINCE"
    );
    // A shard without an owner is between two members' terms, or nobody is in the group.
    let unowned = if shards.members.is_empty() {
        "(no member)"
    } else {
        "(moving)"
    };
    for (shard, owner) in &shards.shards {
        let shard = crate::text::escaped(shard);
        match owner {
            Some(owner) => text.push_str(&format!(
                "{shard:width$}  {:>6}  {:>6}  {:27}  {}\n",
                owner.member,
                owner.token,
                rfc3339_micros(owner.since),
                crate::text::escaped(owner.holder_id.as_deref().unwrap_or("-"))
            )),
            None => text.push_str(&format!(
                "{shard:width$}  {:>6}  {:>6}  {:27}  {unowned}\n",
                "-", "-", "-"
            )),
        }
    }
    let counts: Vec<String> = shards
        .counts()
        .iter()
        .map(|(member, owned)| format!("{member}: {owned}"))
        .collect();
    text.push_str(&match shards.members.len() {
        0 => format!("no member of {quoted} now\n"),
        members => format!(
            "{members} member{} of {quoted} (slot: shards owned): {}\n",
            if members == 1 { "" } else { "s" },
            counts.join(", ")
        ),
    });
    text
}

/// `pglock shards GROUP [--json]`.
pub(crate) async fn show(target: &Target, group: &str, json: bool) -> Result<u8, Failure> {
    let (locks, tables) = (
        connect::pool(target, 1, "pglock")?,
        connect::pool(target, 1, "pglock")?,
    );
    // Connect first, so an unreachable server or bad credentials exit as for the other
    // commands (69, 77, 78), not as an unexpected answer.
    connect::check(&locks, target).await?;
    let shards = if connect::missing_table(&tables, target, TERMS_TABLE)
        .await?
        .is_some()
    {
        // No member of any group has run on this database: nothing has run yet.
        Shards::default()
    } else {
        let manager = PostgresLockManager::new(locks);
        let terms = PostgresShardTerms::new(tables);
        owners_by_name(&manager, &terms, group)
            .await
            .map_err(|error: LockAcquisitionError| {
                let tables = [TERMS_TABLE, MEMBERS_TABLE];
                crate::exit::read_privilege_failure(&tables, &error, &target.config)
                    .unwrap_or_else(|| Failure::new(SOFTWARE, chain(&error)))
            })?
    };
    if json {
        out(document(group, &shards))?;
    } else {
        out(table(group, &shards))?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use locks_shard::Shards;

    #[test]
    fn an_empty_group_says_so_in_both_forms() {
        let none = Shards::default();
        assert_eq!(table("g", &none), "no shard of 'g' has run yet\n");
        let json: serde_json::Value = serde_json::from_str(&document("g", &none)).unwrap();
        assert_eq!(json["group"], "g");
        assert_eq!(json["shards"], serde_json::json!([]));
        assert_eq!(json["members"], serde_json::json!([]));
    }
}
