//! The statements, built from integers only (no user text ever reaches SQL), sent with
//! the simple protocol: one round trip each, no prepared-statement bookkeeping.

/// Blocks until the lock is granted or `lock_timeout_ms` passes (0 = wait forever).
///
/// `set_config(..., true)` scopes the timeout to this statement's own transaction, so
/// the session's setting is back as it was afterwards, on success and on error. The
/// sub-select runs before the lock call, so the timeout is in force for the wait.
pub(crate) fn lock(lock_id: i64, lock_timeout_ms: u32) -> String {
    format!(
        "SELECT pg_advisory_lock({lock_id}) \
         FROM (SELECT set_config('lock_timeout', '{lock_timeout_ms}', true)) AS options"
    )
}

/// Takes the lock if it is free; answers `t` or `f`.
pub(crate) fn try_lock(lock_id: i64) -> String {
    format!("SELECT pg_try_advisory_lock({lock_id})")
}

/// Releases one hold of the lock; answers `t`, or `f` (with a server WARNING) when
/// the session did not hold it.
pub(crate) fn unlock(lock_id: i64) -> String {
    format!("SELECT pg_advisory_unlock({lock_id})")
}

/// Releases the lock only if this session holds it (no WARNING otherwise); answers
/// `t` when it was held. Used after a wait ended in an error, because the server can
/// grant the lock just as the wait is cancelled.
pub(crate) fn unlock_if_held(lock_id: i64) -> String {
    // pg_locks shows a bigint advisory key as classid = high 32 bits, objid = low 32
    // bits, objsubid = 1.
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let high = bits >> 32;
    let low = bits & 0xFFFF_FFFF;
    format!(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
         AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
         AND classid = {high} AND objid = {low}) \
         THEN pg_advisory_unlock({lock_id}) ELSE false END"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_carry_only_numbers() {
        assert_eq!(
            lock(7, 250),
            "SELECT pg_advisory_lock(7) FROM (SELECT set_config('lock_timeout', '250', true)) AS options"
        );
        assert_eq!(
            try_lock(i64::MAX),
            "SELECT pg_try_advisory_lock(9223372036854775807)"
        );
        assert_eq!(unlock(0), "SELECT pg_advisory_unlock(0)");
        let check = unlock_if_held(0x1234_5678_9ABC_DEF0);
        assert!(check.contains("classid = 305419896"), "{check}");
        assert!(check.contains("objid = 2596069104"), "{check}");
    }
}
