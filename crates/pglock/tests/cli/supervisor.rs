//! The supervisor's edges: a signal that reaches pglock while it collects the finished
//! group's status, and processes that leave the command's process group.

use tokio::io::AsyncBufReadExt;

use super::*;

/// How many times the signal is sent into the window after the command ended.
const ROUNDS: u32 = 50;

/// SIGTERM sent to pglock just as its command ends, 50 times at delays spread over the
/// moments pglock reads the supervisor's last report and collects its exit: every run ends
/// with the command's status (0) or the forwarded signal's (143), never with "the
/// command's supervisor died".
#[tokio::test]
async fn a_signal_while_the_status_is_collected_is_not_a_dead_supervisor() {
    let (key, _dir) = unique("signal-at-the-end");
    let mut codes = std::collections::BTreeMap::<i32, u32>::new();
    for round in 0..ROUNDS {
        let mut holder = pglock()
            .args(["run", &key, "-c", "echo started"])
            .spawn()
            .expect("spawn");
        let mut lines = tokio::io::BufReader::new(holder.stdout.take().expect("stdout")).lines();
        let line = tokio::time::timeout(SOON, lines.next_line())
            .await
            .expect("the command started in time")
            .expect("stdout");
        assert_eq!(line.as_deref(), Some("started"), "round {round}");
        tokio::time::sleep(Duration::from_micros(u64::from(round) * 150)).await;
        signal(&holder, Signal::SIGTERM);
        let done = finish(holder).await;
        let said = stderr(&done);
        assert!(!said.contains("supervisor died"), "round {round}: {said}");
        assert!(
            matches!(code(&done), 0 | 143),
            "round {round}: exit {}: {said}",
            code(&done)
        );
        *codes.entry(code(&done)).or_default() += 1;
    }
    eprintln!("exit codes over {ROUNDS} rounds: {codes:?}");
}
