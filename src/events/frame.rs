//! A batch as vLLM's publisher sends it on a ZMQ PUB socket: one multipart message of three
//! frames, `[topic, sequence number, payload]`.

/// The three frames of one published batch. The sequence number is 8 bytes big-endian and
/// grows by one a batch: a subscriber sees a lost batch as a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frames<'a> {
    topic: &'a [u8],
    seq: [u8; 8],
    payload: &'a [u8],
}

impl<'a> Frames<'a> {
    /// The frames of the batch `payload` ([`BatchEncoder::finish`]'s bytes), numbered `seq`,
    /// on `topic` (vLLM's default is the empty topic, which every subscriber receives).
    ///
    /// [`BatchEncoder::finish`]: super::BatchEncoder::finish
    pub fn new(topic: &'a str, seq: u64, payload: &'a [u8]) -> Self {
        Self { topic: topic.as_bytes(), seq: seq.to_be_bytes(), payload }
    }

    /// The frames in sending order: topic, sequence number, payload.
    pub fn parts(&self) -> [&[u8]; 3] {
        [self.topic, &self.seq, self.payload]
    }

    /// The sequence number.
    pub fn seq(&self) -> u64 {
        u64::from_be_bytes(self.seq)
    }
}
