//! A session's identity in its events: the salt the router hashes its pages with, the
//! `session_id` it reads, and the ids that chain its blocks.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::core::{Error, Result};

/// One session as its `BlockStored` events name it. Built once per session: the salt's seed
/// and the encoded `cache_salt` / `session_id` entries are computed here, not per event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKey {
    session_id: u64,
    salt: String,
    /// `xxh3_64(salt)`: the seed of the session's block ids.
    seed: u64,
    /// The event map's last two entries, `"cache_salt": salt, "session_id": "<session_id>"`,
    /// as msgpack.
    pub(super) tail: Vec<u8>,
}

impl SessionKey {
    /// The key libskv gives a session by default: the salt `skv-session:<session_id>`
    /// (decimal). A router finds the session when its request carries that `cache_salt`.
    pub fn new(session_id: u64) -> Self {
        Self::build(session_id, format!("skv-session:{session_id}"))
    }

    /// A key with the engine's own salt for the session (its string key, say), so that the
    /// router's requests for the session carry the salt the engine already knows. An empty
    /// salt is refused: the router reads `""` as no salt, which would let every unsalted
    /// request with the same tokens match the session's pages.
    pub fn with_salt(session_id: u64, salt: &str) -> Result<Self> {
        if salt.is_empty() {
            return Err(Error::InvalidArg(format!("session {session_id}: the salt is empty")));
        }
        if u32::try_from(salt.len()).is_err() {
            return Err(Error::InvalidArg(format!(
                "session {session_id}: a salt of {} bytes is over 4 GiB",
                salt.len()
            )));
        }
        Ok(Self::build(session_id, salt.to_owned()))
    }

    fn build(session_id: u64, salt: String) -> Self {
        let mut tail = Vec::with_capacity(salt.len() + 48);
        put_str(&mut tail, "cache_salt");
        put_str(&mut tail, &salt);
        put_str(&mut tail, "session_id");
        put_str(&mut tail, &session_id.to_string());
        Self { session_id, seed: xxh3_64(salt.as_bytes()), salt, tail }
    }

    /// The engine's integer session id.
    pub fn session_id(&self) -> u64 {
        self.session_id
    }

    /// The salt: `cache_salt` on the wire, the router's `cache_namespace`.
    pub fn salt(&self) -> &str {
        &self.salt
    }

    /// The id of the page `page` (its index in the sequence: its first token is at
    /// `page * page_size`) holding `tokens`, chained to `parent`, the id of the page before
    /// it (`None` at the root of the router's tree). The 64-bit XXH3 of `parent` (0 when
    /// `None`), `page` and the token ids, each little-endian, seeded with `xxh3_64(salt)`.
    /// The same session, prefix and tokens give the same id in every process; another salt,
    /// prefix, position or token gives another id but with probability 2^-64.
    /// `scratch` is a buffer the caller keeps between calls.
    #[inline]
    pub fn block_id(&self, parent: Option<u64>, page: u32, tokens: &[u32], scratch: &mut Vec<u8>) -> u64 {
        scratch.clear();
        scratch.extend_from_slice(&parent.unwrap_or(0).to_le_bytes());
        scratch.extend_from_slice(&page.to_le_bytes());
        for &t in tokens {
            scratch.extend_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(scratch, self.seed)
    }
}

/// A msgpack string. Lengths are checked by the callers (salts) or are constants.
pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    rmp::encode::write_str(out, s).expect("writing to a Vec cannot fail");
}
