//! The recorder of the `handoff` scenario: every task's acquisitions, releases and
//! give-ups on one monotonic clock, and what they add up to (gaps, gaps to a waiter,
//! turns, most inside, idle share; the scenario's module doc defines each).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::stats::nanos;

/// What happened during the windows of one cell.
#[derive(Debug, Default)]
pub(super) struct State {
    /// How many may hold at once (N).
    pub(super) capacity: usize,
    /// Bit `i` is set while task `i` is inside an acquire.
    pub(super) waiting: u32,
    pub(super) inside: usize,
    pub(super) most_inside: usize,
    /// Releases not yet followed by an acquisition, oldest first, and who released.
    pub(super) released: VecDeque<(Instant, usize)>,
    /// Releases made while others waited, with the set of those waiters.
    pub(super) open: Vec<(Instant, u32)>,
    /// Capacity left free while someone waited, up to `last`.
    pub(super) idle: Duration,
    pub(super) last: Option<Instant>,
    pub(super) gaps: Vec<u64>,
    pub(super) waiter_gaps: Vec<u64>,
    pub(super) waits: Vec<u64>,
    pub(super) turns: Vec<u64>,
    pub(super) retaken: u64,
    pub(super) timeouts: u64,
    pub(super) abandoned: u64,
    pub(super) unserved_at_end: u64,
}

impl State {
    /// Adds the idle capacity since the last event, up to `now`.
    fn advance(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let free = self.capacity.saturating_sub(self.inside);
            let idle = free.min(self.waiting.count_ones() as usize);
            self.idle += now.saturating_duration_since(last) * u32::try_from(idle).unwrap_or(0);
        }
        self.last = Some(now);
    }
}

/// The events of the tasks of one cell, timed on one clock.
#[derive(Debug)]
pub(super) struct Recorder(Mutex<State>);

impl Recorder {
    pub(super) fn new(tasks: usize, capacity: usize) -> Self {
        assert!(tasks <= 32, "the waiting set is a u32");
        Self(Mutex::new(State {
            capacity,
            turns: vec![0; tasks],
            ..State::default()
        }))
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn begin_wait(&self, task: usize, at: Instant) {
        self.with(|s| {
            s.advance(at);
            s.waiting |= 1 << task;
        });
    }

    pub(super) fn acquired(&self, task: usize, called: Instant, at: Instant) {
        let bit = 1u32 << task;
        self.with(|s| {
            s.advance(at);
            s.waiting &= !bit;
            s.inside += 1;
            s.most_inside = s.most_inside.max(s.inside);
            s.turns[task] += 1;
            s.waits.push(nanos(at - called));
            if let Some((released, releaser)) = s.released.pop_front() {
                s.gaps.push(nanos(at.saturating_duration_since(released)));
                s.retaken += u64::from(releaser == task);
            }
            let mut served = Vec::new();
            s.open.retain(|&(released, waiters)| {
                let hit = waiters & bit != 0;
                if hit {
                    served.push(nanos(at.saturating_duration_since(released)));
                }
                !hit
            });
            s.waiter_gaps.extend(served);
        });
    }

    /// Call just before the release is issued.
    pub(super) fn releasing(&self, task: usize, at: Instant) {
        self.with(|s| {
            s.advance(at);
            s.inside -= 1;
            s.released.push_back((at, task));
            let waiters = s.waiting & !(1 << task);
            if waiters != 0 {
                s.open.push((at, waiters));
            }
        });
    }

    /// `task` stopped waiting without the lock: its acquire timed out, or the window
    /// ended (`at_end`).
    pub(super) fn gave_up(&self, task: usize, at: Instant, at_end: bool) {
        let bit = 1u32 << task;
        self.with(|s| {
            s.advance(at);
            s.waiting &= !bit;
            s.timeouts += u64::from(!at_end);
            let before = s.open.len();
            s.open.iter_mut().for_each(|(_, waiters)| *waiters &= !bit);
            s.open.retain(|(_, waiters)| *waiters != 0);
            let emptied = u64::try_from(before - s.open.len()).unwrap_or(0);
            *(if at_end {
                &mut s.unserved_at_end
            } else {
                &mut s.abandoned
            }) += emptied;
        });
    }

    /// Ends a window: what is still open was not served within it. The turns of each task.
    pub(super) fn finish_window(&self) -> Vec<u64> {
        self.with(|s| {
            s.unserved_at_end += u64::try_from(s.open.len()).unwrap_or(u64::MAX);
            s.open.clear();
            s.released.clear();
            (s.waiting, s.inside, s.last) = (0, 0, None);
            let tasks = s.turns.len();
            std::mem::replace(&mut s.turns, vec![0; tasks])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_gap_closes_only_when_a_waiter_gets_the_lock() {
        let recorder = Recorder::new(3, 1);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // Task 0 holds; 1 waits; 0 releases at 10 ms and takes it back at 11 ms.
        recorder.begin_wait(0, t0);
        recorder.acquired(0, t0, ms(1));
        recorder.begin_wait(1, ms(5));
        recorder.releasing(0, ms(10));
        recorder.begin_wait(0, ms(10));
        recorder.acquired(0, ms(10), ms(11));
        // 0 releases again at 20 ms; 1 gets it at 22 ms.
        recorder.releasing(0, ms(20));
        recorder.acquired(1, ms(5), ms(22));
        let state = recorder.with(std::mem::take);
        assert_eq!(state.gaps, vec![1_000_000, 2_000_000]);
        assert_eq!(state.retaken, 1);
        // Both releases had task 1 waiting: passed over for 12 ms, then 2 ms.
        assert_eq!(state.waiter_gaps, vec![12_000_000, 2_000_000]);
        assert_eq!(state.turns, vec![2, 1, 0]);
        // Free while someone waited: 0–1, 10–11 and 20–22 ms.
        assert_eq!(state.idle, Duration::from_millis(4));
    }

    #[test]
    fn a_semaphore_matches_releases_and_grants_in_order() {
        let recorder = Recorder::new(3, 2);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        recorder.acquired(0, t0, t0);
        recorder.acquired(1, t0, t0);
        recorder.begin_wait(2, t0);
        recorder.releasing(0, ms(10));
        recorder.releasing(1, ms(11));
        recorder.acquired(2, t0, ms(13));
        recorder.begin_wait(0, ms(13));
        recorder.acquired(0, ms(13), ms(14));
        let state = recorder.with(std::mem::take);
        assert_eq!(state.gaps, vec![3_000_000, 3_000_000]);
        assert_eq!((state.most_inside, state.inside), (2, 2));
        // One permit free while 2 waited (10–13 ms), then one while 0 waited (13–14).
        assert_eq!(state.idle, Duration::from_millis(4));
    }

    #[test]
    fn releases_whose_waiters_all_gave_up_are_counted_apart() {
        let recorder = Recorder::new(2, 1);
        let t0 = Instant::now();
        recorder.acquired(0, t0, t0);
        recorder.begin_wait(1, t0);
        recorder.releasing(0, t0 + Duration::from_millis(3));
        recorder.gave_up(1, t0 + Duration::from_millis(4), false);
        let state = recorder.with(std::mem::take);
        assert_eq!((state.abandoned, state.timeouts), (1, 1));
        assert!(state.waiter_gaps.is_empty());
    }
}
