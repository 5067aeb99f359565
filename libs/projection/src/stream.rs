//! Reading a projection's stream: the business log or telemetry, behind one
//! feed and one item type, so the live loop and a replay read either alike.

use std::time::Duration;

use lh_bus::{Bus, Feed, FeedItem, Sample};

use crate::{Projector, Result, Stream};

/// One message a projection reads, from either stream.
// A projection reads one stream: boxing the log's items would cost an
// allocation each for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Item {
    Log(FeedItem),
    Sample(Sample),
}

impl Item {
    pub(crate) fn sequence(&self) -> u64 {
        match self {
            Item::Log(item) => item.sequence(),
            Item::Sample(sample) => sample.sequence,
        }
    }

    pub(crate) fn pending(&self) -> u64 {
        match self {
            Item::Log(item) => item.pending(),
            Item::Sample(sample) => sample.pending,
        }
    }
}

/// The feed of a projection's stream.
pub(crate) enum Input {
    Log(Feed),
    Telemetry(Feed<Sample>),
}

impl Input {
    /// A feed of what `projector` reads from `from_sequence` on; `reread`
    /// for a second reading of the log (a rebuild).
    pub(crate) async fn open<P: Projector>(
        bus: &Bus,
        projector: &P,
        from_sequence: u64,
        reread: bool,
    ) -> Result<Self> {
        Ok(match (projector.stream(), reread) {
            (Stream::Events, false) => {
                Input::Log(bus.feed(projector.filters(), from_sequence).await?)
            }
            (Stream::Events, true) => {
                Input::Log(bus.reread(projector.filters(), from_sequence).await?)
            }
            (Stream::Telemetry, _) => Input::Telemetry(
                bus.telemetry_feed(projector.filters(), from_sequence)
                    .await?,
            ),
        })
    }

    pub(crate) fn next_item_read(&mut self) -> Option<Result<Item>> {
        match self {
            Input::Log(feed) => feed
                .next_item_read()
                .map(|r| r.map(Item::Log).map_err(Into::into)),
            Input::Telemetry(feed) => feed
                .next_item_read()
                .map(|r| r.map(Item::Sample).map_err(Into::into)),
        }
    }

    pub(crate) async fn next_item_within(&mut self, timeout: Duration) -> Option<Result<Item>> {
        match self {
            Input::Log(feed) => feed
                .next_item_within(timeout)
                .await
                .map(|r| r.map(Item::Log).map_err(Into::into)),
            Input::Telemetry(feed) => feed
                .next_item_within(timeout)
                .await
                .map(|r| r.map(Item::Sample).map_err(Into::into)),
        }
    }
}

/// The newest sequence of the stream `projector` reads.
pub(crate) async fn head<P: Projector>(bus: &Bus, projector: &P) -> Result<u64> {
    Ok(match projector.stream() {
        Stream::Events => bus.last_sequence().await?,
        Stream::Telemetry => bus.telemetry_last_sequence().await?,
    })
}

/// The newest sequence `projector`'s filters match: what its tables must
/// reach to be at the head.
pub(crate) async fn filtered_head<P: Projector>(bus: &Bus, projector: &P) -> Result<u64> {
    Ok(match projector.stream() {
        Stream::Events => bus.last_sequence_matching(projector.filters()).await?,
        Stream::Telemetry => {
            bus.telemetry_last_sequence_matching(projector.filters())
                .await?
        }
    })
}
