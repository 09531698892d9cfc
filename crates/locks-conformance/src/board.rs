//! The leader board's contract ([`LeaderBoard`]): one case, run by each board's tests
//! with two managers of one backend.

use locks_port::{AcquisitionErrorKind, LeaderBoard, MAX_BOARD_NAME, MAX_PUBLISHED_VALUE};

/// Checks [`LeaderBoard`]'s contract on two boards of one backend (two managers, as two
/// processes would have), for an election `name` nobody else uses: terms start at 1 and
/// grow by one whoever proclaims, `latest` is the last proclamation, only the latest
/// term can be retired, and values past the bound or with a NUL are refused.
///
/// # Panics
/// When the contract is broken, with a message naming what.
pub async fn leader_board_contract<B: LeaderBoard>(first: &B, second: &B, name: &str) {
    assert_eq!(
        first.latest(name).await.expect("latest"),
        None,
        "a name nobody proclaimed has no term"
    );
    let one = first.proclaim(name, "10.0.0.1:80").await.expect("proclaim");
    assert_eq!(one.term, 1, "the first term of a name is 1");
    assert!(!one.retired, "a new term is not retired");
    assert_eq!(one.value, "10.0.0.1:80");
    assert_eq!(
        second.latest(name).await.expect("latest").as_ref(),
        Some(&one),
        "another manager reads the term as it was proclaimed"
    );
    let two = second.proclaim(name, "").await.expect("proclaim");
    assert_eq!(two.term, 2, "each term is one more, whoever proclaims it");
    assert!(
        two.since >= one.since,
        "a later term does not start earlier"
    );
    for term in [&one, &two] {
        assert_eq!(
            term.since,
            locks_port::stored_time(term.since),
            "a term's start is kept as PostgreSQL keeps it (UTC, to the microsecond)"
        );
    }
    first.retire(name, one.term).await.expect("retire");
    assert_eq!(
        first.latest(name).await.expect("latest").as_ref(),
        Some(&two),
        "retiring an older term changes nothing"
    );
    second.retire(name, two.term).await.expect("retire");
    let retired = first.latest(name).await.expect("latest").expect("a term");
    assert!(retired.retired, "the latest term, retired, says so");
    assert_eq!(retired.term, 2);
    let three = first.proclaim(name, "x").await.expect("proclaim");
    assert_eq!(three.term, 3, "terms keep growing after a retired one");
    assert!(!three.retired);
    assert_eq!(
        first
            .latest(&format!("{name}-other"))
            .await
            .expect("latest"),
        None,
        "names are independent"
    );
    let too_long = "x".repeat(MAX_PUBLISHED_VALUE + 1);
    let refused = first
        .proclaim(name, &too_long)
        .await
        .expect_err("a value past the bound");
    assert_eq!(refused.kind(), AcquisitionErrorKind::Configuration);
    let at_bound = "y".repeat(MAX_PUBLISHED_VALUE);
    let four = first.proclaim(name, &at_bound).await.expect("at the bound");
    assert_eq!((four.term, four.value.len()), (4, MAX_PUBLISHED_VALUE));
    let nul = first.proclaim(name, "a\0b").await.expect_err("a NUL");
    assert_eq!(nul.kind(), AcquisitionErrorKind::Configuration);
    assert_eq!(
        second
            .latest(name)
            .await
            .expect("latest")
            .map(|term| term.term),
        Some(4),
        "a refused proclamation starts no term"
    );
    board_names(first, name).await;
}

/// Names a board cannot keep are refused alike by every board, as `Configuration`
/// errors of each call: one with a NUL (PostgreSQL's `text` cannot hold it) and one
/// past [`MAX_BOARD_NAME`] bytes (past what PostgreSQL's index of names holds). A name
/// at the bound, of bytes that do not compress, is kept as any other.
async fn board_names<B: LeaderBoard>(board: &B, name: &str) {
    let past = format!("{name}{}", "n".repeat(MAX_BOARD_NAME));
    for bad in [format!("{name}\0nul"), past] {
        let shown: String = bad.chars().take(60).collect();
        let refused = board
            .proclaim(&bad, "v")
            .await
            .expect_err("proclaim: a name the board cannot keep");
        assert_eq!(
            refused.kind(),
            AcquisitionErrorKind::Configuration,
            "proclaim {shown:?}: {refused}"
        );
        let refused = board
            .latest(&bad)
            .await
            .expect_err("latest: a name the board cannot keep");
        assert_eq!(
            refused.kind(),
            AcquisitionErrorKind::Configuration,
            "latest {shown:?}: {refused}"
        );
        let refused = board
            .retire(&bad, 1)
            .await
            .expect_err("retire: a name the board cannot keep");
        assert_eq!(
            refused.kind(),
            AcquisitionErrorKind::Configuration,
            "retire {shown:?}: {refused}"
        );
    }
    // Letters from a xorshift generator: nothing for a compressor to shorten.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut at_bound = format!("{name}:");
    while at_bound.len() < MAX_BOARD_NAME {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let letter = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
            [usize::try_from(state % 64).unwrap_or(0)];
        at_bound.push(char::from(letter));
    }
    let one = board
        .proclaim(&at_bound, "v")
        .await
        .unwrap_or_else(|error| panic!("a name of {MAX_BOARD_NAME} bytes: {error}"));
    assert_eq!(one.term, 1, "the first term of a name at the bound");
    assert_eq!(board.latest(&at_bound).await.expect("latest"), Some(one));
}
