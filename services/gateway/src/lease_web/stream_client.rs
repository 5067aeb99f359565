//! A session's client side over an in-process byte stream: the gateway's
//! own HTTP client to a lease's port speaks on one end, the relay to the
//! lease's node carries the other.

use bytes::Bytes;
use lh_rpc::session::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

use crate::sessions::relay::{ClientSide, Ending, FromClient};

/// Bytes read from the stream at a time, and buffered in it each way.
pub const STREAM_CHUNK_BYTES: usize = 64 * 1024;

pub struct StreamClient {
    read: ReadHalf<DuplexStream>,
    write: WriteHalf<DuplexStream>,
    buffer: Vec<u8>,
}

/// A client side, and the stream the gateway's HTTP client speaks on.
pub fn pair() -> (StreamClient, DuplexStream) {
    let (ours, theirs) = tokio::io::duplex(STREAM_CHUNK_BYTES);
    let (read, write) = tokio::io::split(ours);
    (
        StreamClient {
            read,
            write,
            buffer: vec![0; STREAM_CHUNK_BYTES],
        },
        theirs,
    )
}

impl ClientSide for StreamClient {
    async fn recv(&mut self) -> FromClient {
        match self.read.read(&mut self.buffer).await {
            Ok(0) => FromClient::Eof,
            Ok(n) => FromClient::Data(self.buffer[..n].to_vec()),
            Err(_) => FromClient::Closed,
        }
    }

    async fn send(&mut self, _stream: Stream, bytes: Bytes) -> Result<(), ()> {
        self.write.write_all(&bytes).await.map_err(|_| ())
    }

    async fn eof(&mut self) {
        let _ = self.write.shutdown().await;
    }

    async fn finish(mut self, _ending: &Ending) {
        let _ = self.write.shutdown().await;
    }
}
