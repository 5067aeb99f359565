//! A session's lane: one TCP connection that the node dials to the gateway
//! replica which opened the session, carrying that session's frames (the
//! same [`crate::session`] frames, each behind its length) instead of the
//! bus (docs/adr/030, "The lane"). Bulk bytes then cross one socket
//! between the two instead of two and the NATS server's copies; the bus
//! still carries the opening, and with it the authority: the node learns
//! where to dial, and the one-time token to show, only from an opening on
//! its own session subject, which only the gateway may publish.
//!
//! The node shows the token first; the gateway answers one byte once it
//! has taken the connection for that session, so that the node tells the
//! gateway "opened on the lane" only when the gateway holds the lane. A
//! connection with any other token is closed unanswered.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

use crate::session::MAX_FRAME_DATA_BYTES;
pub use crate::session::{LaneOffer, LANE_TOKEN_BYTES};

/// The gateway's answer to a token it took.
pub const LANE_ACCEPTED: u8 = 1;
/// The largest message on a lane: a data frame with its header, or a
/// control frame (whose message is text of a few hundred bytes).
pub const MAX_LANE_MESSAGE_BYTES: usize = MAX_FRAME_DATA_BYTES + 64 * 1024;
/// How long a node may take to dial and be answered, and a gateway waits
/// for a dialed connection's token; past it, the session keeps to the bus.
pub const LANE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes of the length in front of each frame.
pub const LENGTH_BYTES: usize = 4;
/// Frames up to this long go with their length in one write; longer ones
/// in two, rather than be copied.
const JOINED_WRITE_BYTES: usize = 16 * 1024;

/// A session's frames, each behind its length: what comes, and where to
/// send ([`send`], [`send_in_place`]), apart, so that one task may wait on
/// the one while another sends.
pub struct Lane {
    pub frames: FramedRead<OwnedReadHalf, LengthDelimitedCodec>,
    pub sink: OwnedWriteHalf,
}

/// Sends `frame` behind its length.
pub async fn send<W: AsyncWrite + Unpin>(sink: &mut W, frame: &[u8]) -> io::Result<()> {
    let length = (frame.len() as u32).to_be_bytes();
    if frame.len() <= JOINED_WRITE_BYTES {
        let mut joined = Vec::with_capacity(LENGTH_BYTES + frame.len());
        joined.extend_from_slice(&length);
        joined.extend_from_slice(frame);
        return sink.write_all(&joined).await;
    }
    sink.write_all(&length).await?;
    sink.write_all(frame).await
}

/// Sends the frame that follows [`LENGTH_BYTES`] of room in `buffer`,
/// writing its length there: one write, no copy.
pub async fn send_in_place<W: AsyncWrite + Unpin>(
    sink: &mut W,
    buffer: &mut [u8],
) -> io::Result<()> {
    let length = (buffer.len() - LENGTH_BYTES) as u32;
    buffer[..LENGTH_BYTES].copy_from_slice(&length.to_be_bytes());
    sink.write_all(buffer).await
}

impl Lane {
    /// `stream`, whose handshake is over and nothing of it read beyond.
    fn framed(stream: TcpStream) -> Self {
        let (read, write) = stream.into_split();
        Lane {
            frames: FramedRead::new(read, codec()),
            sink: write,
        }
    }
}

/// How frames are cut on a lane: a 4-byte big-endian length, then the
/// frame; a longer one ends the lane.
pub fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(LENGTH_BYTES)
        .max_frame_length(MAX_LANE_MESSAGE_BYTES)
        .new_codec()
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what} took over {} s", LANE_HANDSHAKE_TIMEOUT.as_secs()),
    )
}

/// The node's side: dials `offer`, shows its token and waits until the
/// gateway took the connection.
pub async fn dial(offer: &LaneOffer) -> io::Result<Lane> {
    let token = offer
        .token_bytes()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a lane token"))?;
    let handshake = async {
        let mut stream = TcpStream::connect(offer.addr.as_str()).await?;
        // Keystrokes go as they come: a lane is as interactive as the bus.
        stream.set_nodelay(true)?;
        stream.write_all(&token).await?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await?;
        if answer[0] != LANE_ACCEPTED {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the gateway did not take the lane",
            ));
        }
        Ok(Lane::framed(stream))
    };
    tokio::time::timeout(LANE_HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| timed_out("dialing the lane"))?
}

/// The gateway's side: the token a dialed connection shows.
pub async fn read_token(stream: &mut TcpStream) -> io::Result<[u8; LANE_TOKEN_BYTES]> {
    let mut token = [0u8; LANE_TOKEN_BYTES];
    tokio::time::timeout(LANE_HANDSHAKE_TIMEOUT, stream.read_exact(&mut token))
        .await
        .map_err(|_| timed_out("a lane's token"))??;
    Ok(token)
}

/// The gateway's side: tells the node its connection is taken, and frames
/// it.
pub async fn accept(mut stream: TcpStream) -> io::Result<Lane> {
    stream.set_nodelay(true)?;
    tokio::time::timeout(LANE_HANDSHAKE_TIMEOUT, stream.write_all(&[LANE_ACCEPTED]))
        .await
        .map_err(|_| timed_out("answering a lane"))??;
    Ok(Lane::framed(stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn an_offer_carries_its_token_as_hex_and_refuses_another() {
        let offer = LaneOffer::new("127.0.0.1:1".into(), &[7u8; LANE_TOKEN_BYTES]);
        assert_eq!(offer.token_bytes(), Some([7u8; LANE_TOKEN_BYTES]));
        for token in ["", "07", "zz", &"0".repeat(66)] {
            let bad = LaneOffer {
                addr: offer.addr.clone(),
                token: token.into(),
            };
            assert_eq!(bad.token_bytes(), None, "{token:?}");
        }
    }

    #[tokio::test]
    async fn a_lane_carries_frames_both_ways_once_the_token_is_taken_and_refuses_a_giant() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let token = [3u8; LANE_TOKEN_BYTES];
        let offer = LaneOffer::new(listener.local_addr().unwrap().to_string(), &token);
        let gateway = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            assert_eq!(read_token(&mut stream).await.unwrap(), token);
            let mut lane = accept(stream).await.unwrap();
            for _ in 0..2 {
                let got = lane.frames.next().await.unwrap().unwrap();
                send(&mut lane.sink, &got).await.unwrap();
            }
            // A length over the limit ends the lane with an error.
            let sink = &mut lane.sink;
            sink.write_all(&((MAX_LANE_MESSAGE_BYTES as u32) + 1).to_be_bytes())
                .await
                .unwrap();
            sink.flush().await.unwrap();
            lane
        });
        let mut lane = dial(&offer).await.unwrap();
        // A keystroke's frame, then a large one sent in place.
        send(&mut lane.sink, b"k").await.unwrap();
        assert_eq!(&lane.frames.next().await.unwrap().unwrap()[..], b"k");
        let mut buffer = vec![9u8; LENGTH_BYTES + MAX_FRAME_DATA_BYTES + 10];
        send_in_place(&mut lane.sink, &mut buffer).await.unwrap();
        let got = lane.frames.next().await.unwrap().unwrap();
        assert_eq!(&got[..], &buffer[LENGTH_BYTES..]);
        assert!(lane.frames.next().await.unwrap().is_err());
        drop(gateway.await.unwrap());
    }

    #[tokio::test]
    async fn a_gateway_that_does_not_take_the_token_keeps_the_node_off_the_lane() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let offer = LaneOffer::new(listener.local_addr().unwrap().to_string(), &[1; 32]);
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let _ = read_token(&mut stream).await;
            // Closed unanswered: an unknown token.
        });
        assert!(dial(&offer).await.is_err());
        // Nothing listens: refused at once, not after the timeout.
        let gone = LaneOffer::new("127.0.0.1:1".into(), &[1; 32]);
        assert!(dial(&gone).await.is_err());
    }
}
