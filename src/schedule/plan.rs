//! What a schedule fires at a given moment: the clock-free core of the
//! job that offers occurrences to a queue.

use std::time::SystemTime;

use super::time::{floor_ms, from_ms};
use super::{CatchUp, MAX_CATCH_UP, MISFIRE_GRACE, Schedule};

/// What a schedule fires at one moment, from [`Schedule::plan`].
///
/// The caller keeps one instant per schedule, `after`: every occurrence at
/// or before it is settled (fired or skipped). Before the first plan it is
/// the instant the schedule was created (or replaced), so that nothing
/// from before the schedule existed is owed. A plan is applied by offering
/// [`fire`](Plan::fire) and storing [`settled`](Plan::settled) as the new
/// `after`, both or neither, and only if `after` is still what the plan
/// was made from (a compare-and-set): then any number of processes may
/// plan at once, retry, or die between planning and applying, and no
/// occurrence is fired twice. Every due occurrence is either fired or
/// counted in [`skipped`](Plan::skipped) by exactly one applied plan;
/// which ones are skipped is the [catch-up policy](CatchUp)'s choice.
/// While the caller keeps up (each plan finds one occurrence due, and
/// under `Skip` finds it within [`MISFIRE_GRACE`]), none is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Plan {
    /// The occurrences to fire now, oldest first: empty when none is due
    /// or the policy fires none of those that are.
    pub fire: Vec<SystemTime>,
    /// How many due occurrences the catch-up policy dropped.
    pub skipped: u64,
    /// The new `after`: the latest due occurrence, or `after` unchanged
    /// when none was due.
    pub settled: SystemTime,
    /// The occurrence to wait for next: the first after both `now` and
    /// `settled`; `None` when the schedule has no more (past its
    /// [`until`](Schedule::until)).
    pub next: Option<SystemTime>,
}

impl Schedule {
    /// What to fire at `now`, when every occurrence at or before `after`
    /// is settled (see [`Plan`] for how to keep `after`).
    ///
    /// The due occurrences are those in `(after, now]`; the
    /// [catch-up policy](CatchUp) picks which of them fire. Both times
    /// are arguments, so that the caller decides whose clock counts (the
    /// Redis server's, for queues): this function reads no clock. A `now`
    /// before `after` (a clock that went back) fires nothing.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use redwheel::schedule::{CatchUp, Schedule};
    ///
    /// let s = Schedule::every(Duration::from_secs(10)).catch_up(CatchUp::All { max: 2 });
    /// let t = |secs| UNIX_EPOCH + Duration::from_secs(secs);
    /// // On time: the occurrence at 1,000 s, planned 3 ms late.
    /// let p = s.plan(t(995), t(1000) + Duration::from_millis(3));
    /// assert_eq!((p.fire, p.skipped, p.settled, p.next), (vec![t(1000)], 0, t(1000), Some(t(1010))));
    /// // After a minute of downtime: six were due, the two latest fire.
    /// let p = s.plan(t(1000), t(1065));
    /// assert_eq!((p.fire, p.skipped, p.settled, p.next), (vec![t(1050), t(1060)], 4, t(1060), Some(t(1070))));
    /// ```
    pub fn plan(&self, after: SystemTime, now: SystemTime) -> Plan {
        let (after_ms, now_ms) = (floor_ms(after), floor_ms(now));
        let due = self.count_ms(after_ms, now_ms);
        let latest = if due > 0 {
            self.last_ms(now_ms).filter(|&x| x > after_ms)
        } else {
            None
        };
        let on_time = |x: i64| {
            from_ms(x).is_some_and(|x| {
                now.duration_since(x)
                    .is_ok_and(|late| late <= MISFIRE_GRACE)
            })
        };
        let take = match (latest, self.catch_up) {
            (None, _) => 0,
            (Some(x), CatchUp::Skip) => u64::from(on_time(x)),
            (Some(_), CatchUp::Latest) => 1,
            (Some(_), CatchUp::All { max }) => due.min(u64::from(max.min(MAX_CATCH_UP))),
        };
        let mut fire = Vec::with_capacity(take as usize);
        let mut cursor = latest;
        while let Some(x) = cursor {
            if fire.len() as u64 == take {
                break;
            }
            fire.extend(from_ms(x));
            cursor = self.last_ms(x - 1).filter(|&y| y > after_ms);
        }
        fire.reverse();
        Plan {
            skipped: due - fire.len() as u64,
            fire,
            settled: latest.and_then(from_ms).unwrap_or(after),
            next: self
                .next_ms(now_ms.max(latest.unwrap_or(after_ms)))
                .and_then(from_ms),
        }
    }
}
