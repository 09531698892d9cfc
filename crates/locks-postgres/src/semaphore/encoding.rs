//! How this adapter lays a semaphore out on the `(class, slot)` pairs of
//! [`PermitDerivation`](locks_port::PermitDerivation) (ADR 0018): slots `0..N` are the
//! permits, slot [`TURNSTILE_SLOT`] is the queue waiters wait in, slot
//! [`marker_slot`]`(N)` is the marker every participant holds shared (so that two
//! processes using different N are caught), and the holder of a permit also holds
//! `(class + 1, seconds since` [`SINCE_EPOCH_UNIX`]`)` shared, recording when it was
//! granted.

use locks_port::MAX_PERMITS;

/// The turnstile's slot.
pub(crate) const TURNSTILE_SLOT: i32 = -1;

/// 2020-01-01T00:00:00Z in Unix seconds: the origin of the "since" slots.
pub(crate) const SINCE_EPOCH_UNIX: i64 = 1_577_836_800;

/// The marker slot of `permits` (at most [`MAX_PERMITS`]): `-1 - permits`.
pub(crate) fn marker_slot(permits: u32) -> i32 {
    -1 - i32::try_from(permits.min(MAX_PERMITS)).unwrap_or(0)
}

/// The number of permits a marker slot stands for, if it is one (`slot <= -2`).
pub(crate) fn permits_of_marker(slot: i32) -> Option<u32> {
    (slot <= -2).then(|| u32::try_from(-1_i64 - i64::from(slot)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_never_meet_the_turnstile_or_slots() {
        for permits in [1, 2, 3, 1000, MAX_PERMITS] {
            let slot = marker_slot(permits);
            assert!(slot <= -2);
            assert_ne!(slot, TURNSTILE_SLOT);
            assert_eq!(permits_of_marker(slot), Some(permits));
        }
        assert_eq!(permits_of_marker(TURNSTILE_SLOT), None);
        assert_eq!(permits_of_marker(0), None);
    }
}
