//! This process's copy of one queue's schedules: what each one is (its
//! decoded definition), when it fires next, and the version of the set it
//! was read at. The queue's driver job plans firings from it; nothing in
//! it is ever trusted by Redis, which applies a firing only from the
//! stored next occurrence and the stored version (`schedule_fire.lua`).
//! No I/O here: it is applied replies and computed plans.

use std::collections::{BTreeSet, HashMap};

use super::stored::ReadReply;
use crate::schedule::{Schedule, floor_ms, from_ms};

/// The lead (ms): an occurrence is offered up to this long before it falls
/// due, as a message due at the occurrence, so that only the transfer
/// stands between the occurrence and the consumers (see "Recurring
/// schedules" in the [queue module's documentation](crate::queue#recurring-schedules)).
/// Ten times what firing a thousand schedules takes the server on a loaded
/// machine (about 9 ms), so a burst is written well before it falls due;
/// small enough that a "last fired" a little in the future surprises
/// nobody. `schedule_fire.lua` refuses an occurrence further ahead of the
/// server's `TIME` than this.
pub(crate) const LEAD_MS: i64 = 100;

/// How far ahead the job plans and is armed: the lead less a slack for its
/// estimate of the server's clock running a little ahead (the script
/// judges by `TIME`), so that such an estimate costs no refused firing.
pub(crate) const AHEAD_MS: i64 = LEAD_MS - 10;

/// The copy.
#[derive(Default)]
pub(crate) struct Mirror {
    /// The version it was read at; `None` before the first read.
    version: Option<u64>,
    known: HashMap<String, Known>,
    /// (next occurrence, name) of the running schedules this build can
    /// read, earliest first.
    waiting: BTreeSet<(i64, String)>,
}

struct Known {
    /// `None`: a definition this build cannot read (it never fires here).
    schedule: Option<Schedule>,
    /// The next occurrence, if it is running and has one.
    next_ms: Option<i64>,
}

/// One schedule's share of a firing: advance it from `expected` to
/// `next_ms`, offering `fire` (oldest first); `settled` is the latest
/// occurrence the catch-up policy judged due (fired or skipped), `None`
/// when none was due (the group only fires ahead, within the lead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    pub name: String,
    pub expected: i64,
    pub settled: Option<i64>,
    pub next_ms: Option<i64>,
    pub fire: Vec<i64>,
    pub skipped: u64,
}

impl Mirror {
    /// The version of the set the copy is at.
    pub(crate) fn version(&self) -> Option<u64> {
        self.version
    }

    /// Applies `schedule_read.lua`'s reply; the names of definitions this
    /// build cannot read (for a warning).
    pub(crate) fn apply(&mut self, read: ReadReply) -> Vec<String> {
        if read.full {
            self.known.clear();
            self.waiting.clear();
        }
        let mut unreadable = Vec::new();
        for s in read.schedules {
            self.forget(&s.name);
            let Some(record) = s.record else { continue };
            let schedule = Schedule::from_definition(&record.definition).ok();
            if schedule.is_none() {
                unreadable.push(s.name.clone());
            }
            let next_ms = if record.paused { None } else { s.next_ms };
            self.known
                .insert(s.name.clone(), Known { schedule, next_ms });
            self.index(&s.name);
        }
        self.version = Some(read.version);
        unreadable
    }

    fn forget(&mut self, name: &str) {
        if let Some(k) = self.known.remove(name)
            && let Some(at) = k.next_ms
        {
            self.waiting.remove(&(at, name.to_owned()));
        }
    }

    fn index(&mut self, name: &str) {
        if let Some(k) = self.known.get(name)
            && let (Some(at), Some(_)) = (k.next_ms, &k.schedule)
        {
            self.waiting.insert((at, name.to_owned()));
        }
    }

    /// Sets the next occurrence of `name` (after a firing, or as Redis
    /// has it).
    pub(crate) fn advance(&mut self, name: &str, next_ms: Option<i64>) {
        let Some(k) = self.known.get_mut(name) else {
            return;
        };
        if let Some(at) = k.next_ms {
            self.waiting.remove(&(at, name.to_owned()));
        }
        k.next_ms = next_ms;
        self.index(name);
    }

    /// The earliest next occurrence of a schedule this build can fire (it
    /// is fired [`AHEAD_MS`] before).
    pub(crate) fn earliest(&self) -> Option<i64> {
        self.waiting.first().map(|(at, _)| *at)
    }

    /// How many schedules are in the copy.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.known.len()
    }

    /// The firings due at `now_ms` (server clock): those of the schedules
    /// whose next occurrence is at most [`AHEAD_MS`] away, at most `max`
    /// schedules, earliest first. A schedule whose plan changes nothing is
    /// left out.
    pub(crate) fn due(&self, now_ms: i64, max: usize) -> Vec<Group> {
        let mut out = Vec::new();
        for (at, name) in &self.waiting {
            if *at > now_ms.saturating_add(AHEAD_MS) || out.len() >= max {
                break;
            }
            let Some(schedule) = self.known.get(name).and_then(|k| k.schedule.as_ref()) else {
                continue;
            };
            if let Some(g) = plan(name, schedule, *at, now_ms) {
                out.push(g);
            }
        }
        out
    }
}

/// What `schedule` fires at `now_ms` when its next occurrence is
/// `next_ms`: the due ones are those from `next_ms` to `now_ms` (nothing
/// lies between the last one settled and `next_ms`), of which the
/// catch-up policy picks which fire ([`Schedule::plan`]); then every
/// occurrence after them up to `now_ms` + [`AHEAD_MS`] fires ahead (none
/// of those is late, so no policy applies to them). `None` when the plan
/// changes nothing.
fn plan(name: &str, schedule: &Schedule, next_ms: i64, now_ms: i64) -> Option<Group> {
    let horizon = now_ms.saturating_add(AHEAD_MS);
    let (mut fire, mut skipped, mut settled) = (Vec::new(), 0, None);
    // Every occurrence at or before `cursor` is settled by this plan.
    let mut cursor = next_ms - 1;
    if next_ms <= now_ms {
        let p = schedule.plan(from_ms(cursor)?, from_ms(now_ms)?);
        let s = floor_ms(p.settled);
        if s != cursor {
            settled = Some(s);
            fire.extend(p.fire.into_iter().map(floor_ms));
            skipped = p.skipped;
        }
        // Only what the policy judged may be at or before now.
        cursor = s.max(now_ms);
    }
    let mut next = None;
    while let Some(at) = from_ms(cursor).and_then(|t| schedule.next_after(t)) {
        let at = floor_ms(at);
        if at > horizon {
            next = Some(at);
            break;
        }
        fire.push(at);
        cursor = at;
    }
    if fire.is_empty() && settled.is_none() && next == Some(next_ms) {
        return None;
    }
    Some(Group {
        name: name.to_owned(),
        expected: next_ms,
        settled,
        next_ms: next,
        fire,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::queue::schedules::stored::{Record, Stored};
    use crate::schedule::CatchUp;

    fn stored(name: &str, s: &Schedule, next: Option<i64>, paused: bool) -> Stored {
        Stored {
            name: name.into(),
            record: Some(Record {
                rev: 1,
                paused,
                definition: s.definition(),
            }),
            next_ms: next,
            last_ms: None,
            payload: None,
        }
    }

    fn read(version: u64, full: bool, schedules: Vec<Stored>) -> ReadReply {
        ReadReply {
            version,
            full,
            now_ms: 0,
            schedules,
        }
    }

    #[test]
    fn due_schedules_are_planned_from_their_next_occurrence_with_their_catch_up_policy() {
        let every = |ms| Schedule::every(Duration::from_millis(ms));
        let mut m = Mirror::default();
        m.apply(read(
            3,
            true,
            vec![
                stored("a", &every(1_000), Some(5_000), false),
                stored(
                    "b",
                    &every(100).catch_up(CatchUp::All { max: 3 }),
                    Some(4_000),
                    false,
                ),
                stored("paused", &every(10), Some(1_000), true),
                stored("later", &every(10_000), Some(10_000), false),
            ],
        ));
        assert_eq!(m.version(), Some(3));
        assert_eq!(m.earliest(), Some(4_000));
        let due = m.due(5_050, 100);
        assert_eq!(due.len(), 2, "{due:?}");
        // b: 4000..=5000 due (11 occurrences), the 3 latest fire; then 5100
        // fires ahead (within the lead of 5050), whatever the policy.
        assert_eq!(due[0].name, "b");
        assert_eq!(due[0].fire, vec![4_800, 4_900, 5_000, 5_100]);
        assert_eq!((due[0].skipped, due[0].settled), (8, Some(5_000)));
        assert_eq!(due[0].next_ms, Some(5_200));
        // a: exactly on time; its next is beyond the lead.
        assert_eq!(due[1].fire, vec![5_000]);
        assert_eq!(due[1].settled, Some(5_000));
        assert_eq!(due[1].next_ms, Some(6_000));
        m.advance("b", Some(5_200));
        m.advance("a", Some(6_000));
        assert_eq!(m.earliest(), Some(5_200));
        assert!(m.due(5_200 - AHEAD_MS - 1, 100).is_empty());
        assert_eq!(m.due(20_000, 1).len(), 1, "at most `max`");
    }

    #[test]
    fn occurrences_within_the_lead_fire_ahead_all_of_them_and_none_is_judged_late() {
        let s = Schedule::every(Duration::from_millis(40)).catch_up(CatchUp::Latest);
        let mut m = Mirror::default();
        m.apply(read(1, true, vec![stored("a", &s, Some(10_040), false)]));
        // Nothing within the lead yet.
        assert!(m.due(10_040 - AHEAD_MS - 1, 100).is_empty());
        // 10040 is exactly AHEAD_MS away: it fires ahead, alone.
        let due = m.due(10_040 - AHEAD_MS, 100);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].fire, vec![10_040]);
        assert_eq!((due[0].settled, due[0].skipped), (None, 0));
        assert_eq!(due[0].next_ms, Some(10_080));
        // Later, every occurrence within the lead fires, though Latest would
        // keep only one of several late ones.
        let due = m.due(10_000, 100);
        assert_eq!(due[0].fire, vec![10_040, 10_080]);
        assert_eq!(due[0].settled, None);
        assert_eq!(due[0].next_ms, Some(10_120));
        // Late ones are the policy's; those within the lead still all fire.
        let due = m.due(10_130, 100);
        assert_eq!(due[0].fire, vec![10_120, 10_160, 10_200]);
        assert_eq!((due[0].settled, due[0].skipped), (Some(10_120), 2));
        assert_eq!(due[0].next_ms, Some(10_240));
    }

    #[test]
    fn a_schedule_that_ends_within_the_lead_fires_its_last_occurrences_and_has_no_next() {
        let s = Schedule::every(Duration::from_millis(30))
            .starting_at(std::time::UNIX_EPOCH + Duration::from_millis(9_000))
            .until(std::time::UNIX_EPOCH + Duration::from_millis(9_060));
        let mut m = Mirror::default();
        m.apply(read(1, true, vec![stored("a", &s, Some(9_000), false)]));
        let due = m.due(9_060 - AHEAD_MS, 100);
        assert_eq!(due[0].fire, vec![9_000, 9_030, 9_060]);
        assert_eq!(due[0].next_ms, None);
    }

    #[test]
    fn a_partial_read_replaces_changed_schedules_and_drops_removed_ones() {
        let s = Schedule::every(Duration::from_secs(1));
        let mut m = Mirror::default();
        m.apply(read(
            1,
            true,
            vec![
                stored("a", &s, Some(1_000), false),
                stored("b", &s, Some(1_000), false),
            ],
        ));
        let removed = Stored {
            record: None,
            next_ms: None,
            ..stored("a", &s, None, false)
        };
        m.apply(read(2, false, vec![removed, stored("b", &s, None, true)]));
        assert_eq!(m.len(), 1);
        assert_eq!(m.earliest(), None, "b is paused, a is gone");
        let unreadable = m.apply(read(
            3,
            false,
            vec![Stored {
                record: Some(Record {
                    rev: 3,
                    paused: false,
                    definition: "v9;future".into(),
                }),
                ..stored("c", &s, Some(1_000), false)
            }],
        ));
        assert_eq!(unreadable, ["c"]);
        assert_eq!(
            m.earliest(),
            None,
            "a definition this build cannot read never fires here"
        );
    }
}
