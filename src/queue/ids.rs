//! Message ids made by this process.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::runtime::random_u64;

/// Message ids: a per-process random prefix of 11 base-62 characters (64
/// random bits) followed by a per-process counter in base 62. Unique across
/// processes with overwhelming probability, and short: they are stored in
/// Redis three times per message.
pub(crate) fn new_message_id() -> String {
    use std::sync::OnceLock;
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let seed = random_u64();
        let mut s = String::with_capacity(11);
        let mut x = seed;
        for _ in 0..11 {
            s.push(BASE62[(x % 62) as usize] as char);
            x /= 62;
        }
        s
    });
    let mut n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(prefix.len() + 11);
    id.push_str(prefix);
    let mut digits = [0u8; 11];
    let mut len = 0;
    loop {
        digits[len] = BASE62[(n % 62) as usize];
        len += 1;
        n /= 62;
        if n == 0 {
            break;
        }
    }
    for &d in digits[..len].iter().rev() {
        id.push(d as char);
    }
    id
}

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_short_and_distinct() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| new_message_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() <= 22));
    }
}
