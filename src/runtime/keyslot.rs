//! Redis Cluster key hashing: the slot of a key, by its `{hash tag}`.
//!
//! Every key redwheel stores for one queue or lock shares a hash tag, so
//! they share a slot: scripts touch one slot, on one node. The driver's
//! [`Commands`](super::driver::Commands) carry each command's slot, and the
//! cluster routes by it; on one server it is unused.

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the
/// first `{` and the next `}`, when not empty) or of the whole key, mod
/// 16,384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS as u16
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster
/// hashes keys.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster_hashing() {
        // The CRC16/XMODEM check value, and slots Redis reports.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"123456789"), 12_739);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b""), 0);
        // The hash tag decides: every key of a queue shares its slot.
        assert_eq!(slot(b"redwheel:{orders}:delayed"), slot(b"orders"));
        assert_eq!(
            slot(b"redwheel:{orders}:wake"),
            slot(b"redwheel:{orders}:msg")
        );
        // An empty tag `{}` does not count: the whole key is hashed.
        assert_eq!(slot(b"a{}b"), crc16(b"a{}b") % 16_384);
        // Only the first tag counts.
        assert_eq!(slot(b"{x}{y}"), slot(b"x"));
    }
}
