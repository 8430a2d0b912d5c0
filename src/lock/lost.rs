//! What a holder is told when its lease is lost: the cause, and what an
//! `on_lost` callback receives.

use std::fmt;

/// Why a hold was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostCause {
    /// A renewal or the unlock found the lock gone or another acquisition's
    /// (it expired and may have been taken, was force-unlocked by another
    /// process, or Redis lost it in a restart or failover).
    Gone,
    /// No renewal was confirmed within one lease (Redis unreachable, or an
    /// explicit lease ran out): the lock may be someone else's by now.
    Expired,
    /// [`Lock::force_unlock`] in this process released it.
    ///
    /// [`Lock::force_unlock`]: crate::Lock::force_unlock
    ForceUnlocked,
}

impl LostCause {
    /// A short description, lowercase.
    pub fn as_str(self) -> &'static str {
        match self {
            LostCause::Gone => "gone or taken over",
            LostCause::Expired => "lease expired unrenewed",
            LostCause::ForceUnlocked => "force-unlocked",
        }
    }
}

impl fmt::Display for LostCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an [`on_lost`](crate::Lock::on_lost) callback is told.
#[derive(Debug, Clone)]
pub struct LeaseLost {
    pub(crate) name: String,
    pub(crate) fencing_token: u64,
    pub(crate) cause: LostCause,
}

impl LeaseLost {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of the lost hold (now stale).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Why it was lost.
    pub fn cause(&self) -> LostCause {
        self.cause
    }
}
