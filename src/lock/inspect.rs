//! Read-only inspection of locks for operators (the `redwheel`
//! command-line tool): which locks are held, by whom, for how long, and
//! their fencing tokens. Every key name comes from the lock's `Keys` (in
//! `keys.rs`), the one home of the layout.

use std::collections::BTreeSet;

use super::keys::{Keys, validate_name};
use crate::error::{Access, Error};
use crate::runtime::Redwheel;

/// One held lock, as [`Redwheel::find_locks`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name (as given to [`Redwheel::lock`]).
    pub name: String,
    /// Its holder (`"<instance id>:<thread>"`) and hold count (re-entries):
    /// one entry while held (empty if it lapsed between the two reads).
    pub holders: Vec<(String, u64)>,
    /// The fencing token of the current acquisition, if held.
    pub token: Option<u64>,
    /// How long the lease has left, in ms; `None` if the lock has no
    /// expiry (never set by redwheel) or lapsed meanwhile.
    pub ttl_ms: Option<u64>,
    /// The last fencing token handed out for this name.
    pub last_token: Option<u64>,
}

impl Redwheel {
    /// Every lock held now whose name matches the Redis glob `pattern`
    /// (`*` for all), sorted by name. Runs `SCAN` over the whole keyspace
    /// (every master of a cluster): meant for operators, not a hot path.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// for l in rw.find_locks("inventory:*")? {
    ///     println!("{l:?}");
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn find_locks(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        let rt = self.runtime();
        let found = rt.scan_masters(&Keys::scan_pattern(pattern))?;
        let names: BTreeSet<&str> = found.iter().filter_map(|k| Keys::lock_of(k)).collect();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let keys = Keys::new(name);
            let (fields, pttl, fence): (Vec<(String, String)>, i64, Option<u64>) =
                rt.run(&keys.lock, Access::Read, |con| {
                    redis::pipe()
                        .cmd("HGETALL")
                        .arg(&keys.lock)
                        .cmd("PTTL")
                        .arg(&keys.lock)
                        .cmd("GET")
                        .arg(&keys.fence)
                        .query(con)
                })?;
            if fields.is_empty() {
                continue; // released between the scan and this read
            }
            let mut info = LockInfo {
                name: name.to_owned(),
                holders: Vec::new(),
                token: None,
                ttl_ms: (pttl >= 0).then_some(pttl as u64),
                last_token: fence,
            };
            for (field, value) in fields {
                if field == "token" {
                    info.token = value.parse().ok();
                } else {
                    info.holders.push((field, value.parse().unwrap_or(0)));
                }
            }
            out.push(info);
        }
        Ok(out)
    }
}

impl Keys {
    /// A `SCAN MATCH` pattern for the lock keys (not their `:fence` keys)
    /// of the lock names matching `names` (a Redis glob).
    pub(crate) fn scan_pattern(names: &str) -> String {
        format!("redwheel:lock:{{{names}}}")
    }

    /// The lock a key holds, if it is a lock key (`redwheel:lock:{L}`,
    /// not `redwheel:lock:{L}:fence`).
    pub(crate) fn lock_of(key: &str) -> Option<&str> {
        let name = key.strip_prefix("redwheel:lock:{")?.strip_suffix('}')?;
        validate_name(name).ok().map(|()| name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_of_reads_lock_keys_only() {
        let k = Keys::new("inventory:42");
        assert_eq!(Keys::lock_of(&k.lock), Some("inventory:42"));
        assert_eq!(Keys::lock_of(&k.fence), None);
        assert_eq!(Keys::lock_of(&k.channel), None);
        assert_eq!(Keys::lock_of("redwheel:{q}:msg"), None);
    }
}
