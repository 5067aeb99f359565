//! A backlog read as one consumer per filter, merged into stream order.
//!
//! nats-server finds the next message of a consumer with one filter by
//! walking the message block and comparing subjects, which is fast; with
//! several filters it intersects them with the block's per-subject state
//! once per message delivered, which on a log with a subject per lease
//! costs thousands of lookups a message (about 10,000 messages/s where one
//! filter alone reads 140,000/s). So a backlog that several filters match
//! in part is read as one consumer of each filter, and the consumers'
//! messages are merged here by stream sequence.

use std::fmt::Display;
use std::time::Duration;

use futures::{Stream, StreamExt};

/// One filter's consumer and what is known of the messages it has still
/// to deliver.
struct Lane<S, M> {
    /// `None` once nothing more of it is at or before `through`.
    messages: Option<S>,
    /// Its next message with (stream sequence, messages after it), read
    /// but not yet handed on.
    head: Option<(M, u64, u64)>,
    /// Messages it still has to deliver, counting `head`.
    remaining: u64,
}

struct Merge<S, M> {
    lanes: Vec<Lane<S, M>>,
    through: u64,
}

/// Merges the lanes' messages, each lane in stream order, into stream
/// order up to and including `through`; ends after the last of them.
///
/// `lanes` holds each filter's consumer with the messages it counted from
/// its start (its `num_pending`); `position` reads a message's (stream
/// sequence, messages of its filter after it), `None` for one without
/// JetStream metadata, which is handed on as it is and ends the merge.
/// Each item carries how many messages of all the filters follow it. A
/// lane that ends, fails, or delivers nothing for `idle` while it has
/// messages to deliver ends the merge with an error: the reader opens its
/// next consumer after the last message handed on.
pub(crate) fn merge<S, M, E>(
    lanes: Vec<(Option<S>, u64)>,
    through: u64,
    position: fn(&M) -> Option<(u64, u64)>,
    idle: Duration,
) -> impl Stream<Item = Result<(M, u64), String>> + Send
where
    S: Stream<Item = Result<M, E>> + Unpin + Send,
    M: Send,
    E: Display,
{
    let lanes = lanes
        .into_iter()
        .map(|(messages, remaining)| Lane {
            messages: messages.filter(|_| remaining > 0),
            head: None,
            remaining,
        })
        .collect();
    futures::stream::unfold(Some(Merge { lanes, through }), move |merge| async move {
        let mut merge = merge?;
        for lane in &mut merge.lanes {
            if lane.head.is_some() {
                continue;
            }
            let Some(messages) = lane.messages.as_mut() else {
                continue;
            };
            let message = match tokio::time::timeout(idle, messages.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => return Some((Err(e.to_string()), None)),
                Ok(None) => {
                    return Some((Err("a consumer of the backlog ended".to_string()), None))
                }
                Err(_) => {
                    return Some((
                        Err(format!(
                            "a consumer of the backlog delivered nothing for {idle:?} with {} messages to come",
                            lane.remaining
                        )),
                        None,
                    ))
                }
            };
            let Some((sequence, pending)) = position(&message) else {
                return Some((Ok((message, 0)), None));
            };
            // Past `through` a lane is done, but what it has still counts
            // as to come.
            lane.remaining = pending.saturating_add(1);
            if sequence > merge.through {
                lane.messages = None;
            } else {
                lane.head = Some((message, sequence, pending));
            }
        }
        let (next, _) = merge
            .lanes
            .iter()
            .enumerate()
            .filter_map(|(i, lane)| lane.head.as_ref().map(|(_, sequence, _)| (i, *sequence)))
            .min_by_key(|(_, sequence)| *sequence)?;
        let lane = &mut merge.lanes[next];
        let (message, _, pending) = lane.head.take().expect("the lane has a head");
        lane.remaining = pending;
        if pending == 0 {
            lane.messages = None;
        }
        let after = merge
            .lanes
            .iter()
            .map(|lane| lane.remaining)
            .fold(0u64, u64::saturating_add);
        Some((Ok((message, after)), Some(merge)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test message: (stream sequence, messages of its filter after it).
    type Message = (u64, u64);
    type Messages = futures::stream::Iter<std::vec::IntoIter<Result<Message, String>>>;

    fn position(m: &Message) -> Option<(u64, u64)> {
        (m.0 != 0).then_some(*m)
    }

    /// One filter's messages at these sequences, each with what follows
    /// it of its filter, `later` more after the last.
    fn lane(sequences: &[u64], later: u64) -> (Option<Messages>, u64) {
        let n = sequences.len() as u64;
        let messages: Vec<Result<Message, String>> = sequences
            .iter()
            .enumerate()
            .map(|(i, s)| Ok((*s, n - 1 - i as u64 + later)))
            .collect();
        (Some(futures::stream::iter(messages)), n + later)
    }

    async fn collect<S: Stream<Item = Result<(Message, u64), String>>>(
        merged: S,
    ) -> Vec<Result<(u64, u64), String>> {
        merged
            .map(|item| item.map(|((sequence, _), after)| (sequence, after)))
            .collect()
            .await
    }

    const IDLE: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn lanes_are_merged_in_stream_order_with_what_follows_each() {
        let lanes = vec![lane(&[2, 3, 7, 9], 0), lane(&[1, 8], 0), lane(&[5], 0)];
        let merged = collect(merge(lanes, 9, position, IDLE)).await;
        assert_eq!(
            merged,
            vec![
                Ok((1, 6)),
                Ok((2, 5)),
                Ok((3, 4)),
                Ok((5, 3)),
                Ok((7, 2)),
                Ok((8, 1)),
                Ok((9, 0)),
            ]
        );
    }

    #[tokio::test]
    async fn nothing_past_through_is_handed_on_but_it_counts_as_to_come() {
        // The lanes go on past sequence 6 (messages stored after the merge
        // began): they stop there, but the last one read says more follow.
        let lanes = vec![lane(&[2, 4, 10], 0), lane(&[3, 11, 12], 0)];
        let merged = collect(merge(lanes, 6, position, IDLE)).await;
        assert_eq!(merged, vec![Ok((2, 5)), Ok((3, 4)), Ok((4, 3))]);
    }

    #[tokio::test]
    async fn a_lane_with_nothing_to_deliver_is_not_waited_for() {
        let pending = futures::stream::pending::<Result<Message, String>>();
        let lanes = vec![
            (
                Some(futures::stream::iter(vec![Ok((4, 0))]).left_stream()),
                1,
            ),
            (Some(pending.right_stream()), 0),
        ];
        let merged = collect(merge(lanes, 4, position, IDLE)).await;
        assert_eq!(merged, vec![Ok((4, 0))]);
    }

    #[tokio::test]
    async fn a_silent_lane_with_messages_to_come_ends_the_merge_with_an_error() {
        // The lane counted two messages but delivers only the first.
        let silent = futures::stream::iter(vec![Ok::<Message, String>((3, 1))])
            .chain(futures::stream::pending());
        let lanes = vec![
            (Some(silent.left_stream()), 2),
            (
                Some(futures::stream::iter(vec![Ok((1, 1)), Ok((9, 0))]).right_stream()),
                2,
            ),
        ];
        let merged = collect(merge(lanes, 9, position, IDLE)).await;
        assert_eq!(merged.len(), 3, "{merged:?}");
        assert_eq!(merged[..2], [Ok((1, 3)), Ok((3, 2))]);
        assert!(merged[2]
            .as_ref()
            .is_err_and(|e| e.contains("delivered nothing")));
    }

    #[tokio::test]
    async fn a_failing_or_ending_lane_ends_the_merge_with_an_error() {
        let lanes = vec![
            lane(&[1, 2], 0),
            (
                Some(futures::stream::iter(vec![Err("gone".to_string())])),
                3,
            ),
        ];
        let merged = collect(merge(lanes, 9, position, IDLE)).await;
        assert_eq!(merged, vec![Err("gone".to_string())]);

        let lanes = vec![lane(&[1, 2], 0), (Some(futures::stream::iter(vec![])), 3)];
        let merged = collect(merge(lanes, 9, position, IDLE)).await;
        assert!(
            merged[0].as_ref().is_err_and(|e| e.contains("ended")),
            "{merged:?}"
        );
        assert_eq!(merged.len(), 1);
    }

    #[tokio::test]
    async fn a_message_without_a_position_is_handed_on_and_ends_the_merge() {
        let lanes = vec![lane(&[0, 5], 0), lane(&[2], 0)];
        let merged = collect(merge(lanes, 9, position, IDLE)).await;
        assert_eq!(merged, vec![Ok((0, 0))]);
    }
}
