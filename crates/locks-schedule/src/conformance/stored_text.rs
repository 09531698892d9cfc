//! The text a ledger stores, alike on every ledger: a job's name and its holder are
//! configuration, refused early when no ledger could keep them; a job's error is the
//! job's own words at run time, recorded whatever they hold.

use std::time::Duration;

use locks_port::AcquisitionErrorKind;

use super::{Harness, Seen, fire, job, ran, rows};
use crate::{
    Attempt, Claim, CrashPolicy, Ledger, LedgerError, MAX_JOB_NAME, MissedSlots, Outcome, RunError,
    ScheduledJob, SlotKind, Verdict,
};

/// A firing of `job` fails with a `Configuration` error of the job's lock that says
/// `says`, and runs nothing; the firing loop returns that error instead of firing again.
/// `shown` names the case.
async fn a_firing_is_refused<H: Harness>(harness: &H, job: &ScheduledJob, says: &str, shown: &str) {
    let runs = Seen::default();
    let refused = job
        .run_once_per_slot(harness.locks(0), harness.ledger(), |context| {
            runs.record(&context);
            async { Ok::<(), std::convert::Infallible>(()) }
        })
        .await
        .expect_err("a firing of a job no ledger can keep");
    let RunError::Lock(error) = &refused else {
        panic!("{shown}: a Configuration error of the job's lock key, not {refused}");
    };
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::Configuration,
        "{shown}: {refused}"
    );
    assert!(refused.to_string().contains(says), "{shown}: {refused}");
    assert_eq!(runs.count(), 0, "{shown}: nothing runs");
    // The loop stops on it: no later firing would go otherwise.
    let looped = tokio::time::timeout(
        Duration::from_secs(5),
        job.run_every_slot(harness.locks(0), harness.ledger(), |_context| async {
            Ok::<(), std::convert::Infallible>(())
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("{shown}: the firing loop gave up at once"));
    match looped {
        Err(RunError::Lock(error)) => {
            assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
        }
        other => panic!("{shown}: the loop ends with the job's error, not {other:?}"),
    }
}

/// The ledger, asked directly, refuses a claim and the record of an attempt of the job
/// `name` by `holder` in `slot`, saying `says`.
async fn claim_and_finish_are_refused<G: Ledger>(
    ledger: &G,
    (name, holder): (&str, &str),
    slot: crate::Slot,
    says: &str,
    shown: &str,
) {
    let check = |method: &str, refused: LedgerError| {
        assert!(
            refused.message().contains(says),
            "{method} {shown}: {refused}"
        );
    };
    let claim = Claim {
        name,
        slot,
        kind: SlotKind::Current,
        holder,
        crash: CrashPolicy::AtMostOnce,
        missed: MissedSlots::Skip,
    };
    check("claim", ledger.claim(&claim).await.expect_err("claim"));
    let attempt = Attempt {
        name,
        slot: slot.start(),
        attempt: 1,
        holder,
    };
    let finished = ledger.finish(&attempt, Outcome::Succeeded, None).await;
    check("finish", finished.expect_err("finish"));
}

/// The slot the ledger's clock is in.
async fn current_slot<H: Harness>(harness: &H) -> crate::Slot {
    let now = harness.ledger().now().await.expect("the ledger's clock");
    harness.schedule().slot_at(now).expect("a slot")
}

/// A name of `MAX_JOB_NAME` bytes that starts `name:`, of letters from a xorshift
/// generator: nothing for a compressor to shorten.
fn name_at_the_bound(name: &str) -> String {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut at_bound = format!("{name}:");
    while at_bound.len() < MAX_JOB_NAME {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let letter = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
            [usize::try_from(state % 64).unwrap_or(0)];
        at_bound.push(char::from(letter));
    }
    at_bound
}

/// Job names a ledger cannot keep are refused alike by every ledger: one with a NUL
/// (PostgreSQL's `text` cannot hold it) and one past [`MAX_JOB_NAME`] bytes (past what
/// PostgreSQL's index of the ledger's key holds), of bytes that do not compress. A firing
/// fails with a `Configuration` error naming the bound and runs nothing, the firing loop
/// returns that error instead of firing again, and each ledger method that takes a name
/// refuses it. A name at the bound runs as any other.
pub async fn job_names_a_ledger_cannot_keep_are_refused<H: Harness>(harness: &H) {
    let name = harness.job_name("names");
    let at_bound = name_at_the_bound(&name);
    let past = format!("{at_bound}x");
    let ledger = harness.ledger();
    let slot = current_slot(harness).await;
    for (bad, says) in [
        (format!("{name}\0nul"), "NUL".to_owned()),
        (past, format!("at most {MAX_JOB_NAME} bytes")),
    ] {
        let shown = format!("{:?}", bad.chars().take(60).collect::<String>());
        let job = ScheduledJob::new(bad.clone(), harness.schedule());
        a_firing_is_refused(harness, &job, &says, &shown).await;
        claim_and_finish_are_refused(ledger, (&bad, "names"), slot, &says, &shown).await;
        let refused =
            (ledger.running_before(&bad, slot.start()).await).expect_err("running_before");
        assert!(
            refused.message().contains(&says),
            "running_before {shown}: {refused}"
        );
        let refused =
            (ledger.abandon_stale(&bad, &[slot.start()]).await).expect_err("abandon_stale");
        assert!(
            refused.message().contains(&says),
            "abandon_stale {shown}: {refused}"
        );
        let refused = ledger.runs(Some(&bad), 1).await.expect_err("runs");
        assert!(refused.message().contains(&says), "runs {shown}: {refused}");
    }
    let job = ScheduledJob::new(at_bound, harness.schedule()).holder("names".to_owned());
    let runs = Seen::default();
    let report = fire(harness, 0, &job, &runs).await;
    assert!(
        report.verdict.ran(),
        "a name of {MAX_JOB_NAME} bytes runs: {report:?}"
    );
    let kept = rows(harness, &job, 1).await;
    assert_eq!(kept.len(), 1, "its row");
    assert_eq!(kept[0].name, job.name(), "the whole name is kept");
}

/// A holder with a NUL (PostgreSQL's `text` cannot hold it) is refused alike by every
/// ledger, as a name is: it is configuration, so a firing fails with a `Configuration`
/// error naming the job and the NUL before it asks the ledger or the locks, runs nothing
/// and writes no row; the firing loop returns that error; and a ledger asked directly
/// refuses it in each method that takes a holder (`claim`, `finish`).
pub async fn holders_a_ledger_cannot_keep_are_refused<H: Harness>(harness: &H) {
    let holder = "host\0a";
    let job = job(harness, "holders").holder(holder);
    let says = "NUL";
    a_firing_is_refused(harness, &job, says, "holder \"host\\0a\"").await;
    let written = rows(harness, &job, 1).await;
    assert!(written.is_empty(), "no row is written: {written:?}");
    let slot = current_slot(harness).await;
    let (ledger, shown) = (harness.ledger(), "holder");
    claim_and_finish_are_refused(ledger, (job.name(), holder), slot, says, shown).await;
}

/// A job's error is the job's own words at run time: a failed run is recorded whatever
/// they hold. A NUL (which PostgreSQL's `text` cannot hold) is recorded as U+FFFD, the
/// replacement character, on every ledger; the rest of the text is kept.
pub async fn a_job_error_holding_a_nul_is_recorded<H: Harness>(harness: &H) {
    let job = job(harness, "nul_error");
    harness.next_slot().await;
    let report = job
        .run_once_per_slot(harness.locks(0), harness.ledger(), |_context| async {
            Err::<(), String>("bad\0byte\0".to_owned())
        })
        .await
        .expect("a firing whose job failed with a NUL in its error");
    assert_eq!(
        ran(&report.verdict),
        Some((1, Outcome::Failed)),
        "{report:?}"
    );
    assert!(
        matches!(report.verdict, Verdict::Ran { recorded: true, .. }),
        "{report:?}"
    );
    let rows = rows(harness, &job, 1).await;
    assert_eq!(rows[0].outcome, Outcome::Failed, "{rows:?}");
    assert_eq!(
        rows[0].detail.as_deref(),
        Some("bad\u{FFFD}byte\u{FFFD}"),
        "{rows:?}"
    );
}
