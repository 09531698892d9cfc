//! The signals pglock forwards to the command, and that cancel a wait: INT, TERM, HUP
//! and QUIT, and the exit code each maps to.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{Failure, SIGNAL_BASE, SOFTWARE};

/// The signals pglock forwards to the command, and that cancel a wait.
pub(crate) struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
    /// The last signal [`Signals::recv`] returned since [`Signals::take_received`].
    received: Option<Signal>,
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals").finish_non_exhaustive()
    }
}

impl Signals {
    /// Installs the handlers for INT, TERM, HUP and QUIT (their default action, ending
    /// pglock at once, is off from here on), except for those ignored when pglock started
    /// (`nohup`, a shell's background job): they stay ignored, by pglock and by the
    /// command, which inherits the disposition, as under `flock`.
    pub(crate) fn install() -> Result<Self, Failure> {
        let ignored = ignored_at_start();
        let mut streams = Vec::new();
        for (number, kind) in [
            (Signal::SIGINT, SignalKind::interrupt()),
            (Signal::SIGTERM, SignalKind::terminate()),
            (Signal::SIGHUP, SignalKind::hangup()),
            (Signal::SIGQUIT, SignalKind::quit()),
        ] {
            if ignored.contains(&number) {
                continue;
            }
            let stream = signal(kind).map_err(|error| {
                Failure::new(SOFTWARE, format!("cannot handle {number}: {error}"))
            })?;
            streams.push((number, stream));
        }
        Ok(Self {
            streams,
            received: None,
        })
    }

    /// The next of the signals to arrive. Cancel safe.
    pub(crate) async fn recv(&mut self) -> Signal {
        let waits = self.streams.iter_mut().map(|(number, stream)| {
            let number = *number;
            Box::pin(async move {
                stream.recv().await;
                number
            })
        });
        let number = futures_select_all(waits).await;
        self.received = Some(number);
        number
    }

    /// The last signal received since the previous call, if any: a leader whose term
    /// ended after it forwarded a signal stops instead of campaigning again.
    pub(crate) fn take_received(&mut self) -> Option<Signal> {
        self.received.take()
    }
}

/// The signals this process ignores, as the kernel shows them (`SigIgn` in
/// `/proc/self/status`, a hexadecimal mask with bit N-1 for signal N); none where `/proc`
/// is missing. Read before any handler is installed, it is what pglock was started with.
fn ignored_at_start() -> Vec<Signal> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Vec::new();
    };
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or(0);
    Signal::iterator()
        .filter(|signal| {
            let bit = (*signal as i32) - 1;
            (0..64).contains(&bit) && mask & (1 << bit) != 0
        })
        .collect()
}

/// The first of `futures` to finish.
async fn futures_select_all<F>(futures: impl Iterator<Item = F>) -> Signal
where
    F: std::future::Future<Output = Signal> + Unpin,
{
    let mut futures: Vec<F> = futures.collect();
    std::future::poll_fn(move |cx| {
        for future in &mut futures {
            if let std::task::Poll::Ready(number) = std::pin::Pin::new(future).poll(cx) {
                return std::task::Poll::Ready(number);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The exit code for a signal number.
pub(crate) fn signal_code(number: Signal) -> u8 {
    SIGNAL_BASE.saturating_add(u8::try_from(number as i32).unwrap_or(0))
}
