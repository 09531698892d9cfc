//! The supervisor's descendants, found in `/proc`: the processes whose chain of parents
//! reaches it. As a child subreaper it inherits every orphan of the command, so a process
//! that left the command's process group (`setsid`, a double fork) is still among them.

use std::collections::HashMap;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A living process below this one: its pid and process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Descendant {
    pub(crate) pid: Pid,
    pub(crate) group: Pid,
}

/// Every living (not zombie) descendant of this process. Empty where `/proc` is missing.
pub(crate) fn all() -> Vec<Descendant> {
    // pid -> (parent, group, zombie). Zombies stay in the table: their children may not be
    // re-parented yet when the walk reads them, and must still be found through them.
    let mut table: HashMap<i32, (i32, i32, bool)> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut fields = rest.split(' ');
        let zombie = fields.next().unwrap_or("?") == "Z";
        let parent = fields.next().and_then(|p| p.parse().ok());
        let group = fields.next().and_then(|g| g.parse().ok());
        if let (Some(parent), Some(group)) = (parent, group) {
            table.insert(pid, (parent, group, zombie));
        }
    }
    let mut found = vec![std::process::id().try_into().unwrap_or(0)];
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        found.extend(
            table
                .iter()
                .filter(|(_, (ppid, _, _))| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        index += 1;
    }
    found
        .into_iter()
        .skip(1)
        .filter_map(|pid| match table.get(&pid) {
            Some((_, group, false)) => Some(Descendant {
                pid: Pid::from_raw(pid),
                group: Pid::from_raw(*group),
            }),
            _ => None,
        })
        .collect()
}

/// Sends `signal` to every descendant outside `group` (the group itself is signalled as
/// a whole, once); how many it found.
pub(crate) fn signal_escaped(group: Pid, signal: Signal) -> usize {
    let escaped: Vec<Descendant> = all().into_iter().filter(|d| d.group != group).collect();
    for descendant in &escaped {
        let _ = kill(descendant.pid, signal);
    }
    escaped.len()
}
