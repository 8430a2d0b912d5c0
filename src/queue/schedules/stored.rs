//! How a queue's schedules are stored, read back: the record
//! `"<rev>:<paused 0|1>:<definition>"` of the `schedules` hash, the
//! `schedules` field of the `head` hash, `"<version>:<earliest next>"`,
//! its `due` field, and the replies
//! of `schedule_read.lua` and `schedule_fire.lua`. The one reader of these
//! layouts.

use redis::Value;

/// A stored record: the version of its last change, whether it is
/// paused, its canonical definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub rev: u64,
    pub paused: bool,
    pub definition: String,
}

/// A record's bytes, decoded; `None` if they are not a record.
pub(crate) fn parse_record(bytes: &[u8]) -> Option<Record> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (rev, rest) = text.split_once(':')?;
    let (paused, definition) = rest.split_once(':')?;
    Some(Record {
        rev: rev.parse().ok()?,
        paused: match paused {
            "0" => false,
            "1" => true,
            _ => return None,
        },
        definition: definition.to_owned(),
    })
}

/// One schedule as `schedule_read.lua` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub name: String,
    /// `None`: it was removed.
    pub record: Option<Record>,
    pub next_ms: Option<i64>,
    pub last_ms: Option<i64>,
    /// Only when asked for.
    pub payload: Option<Vec<u8>>,
}

/// `schedule_read.lua`'s reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadReply {
    pub version: u64,
    /// Every schedule is listed (else only those changed).
    pub full: bool,
    pub now_ms: i64,
    pub schedules: Vec<Stored>,
}

/// An integer reply, or one sent as a bulk string.
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A nil, or an integer.
fn opt_int(v: &Value) -> Option<Option<i64>> {
    match v {
        Value::Nil => Some(None),
        v => int(v).map(Some),
    }
}

/// A nil, or bytes.
fn opt_bytes(v: &Value) -> Option<Option<Vec<u8>>> {
    match v {
        Value::Nil => Some(None),
        Value::BulkString(b) => Some(Some(b.clone())),
        Value::SimpleString(s) => Some(Some(s.clone().into_bytes())),
        _ => None,
    }
}

/// `schedule_read.lua`'s reply; `None` if it is not one. `with_payload`:
/// the call asked for payloads (five values per schedule, not four).
pub(crate) fn parse_read(v: &Value, with_payload: bool) -> Option<ReadReply> {
    let Value::Array(items) = v else { return None };
    let [version, full, now, rest @ ..] = items.as_slice() else {
        return None;
    };
    let per = if with_payload { 5 } else { 4 };
    if rest.len() % per != 0 {
        return None;
    }
    let mut schedules = Vec::with_capacity(rest.len() / per);
    for s in rest.chunks(per) {
        let name = String::from_utf8(opt_bytes(&s[0])??).ok()?;
        let record = match opt_bytes(&s[1])? {
            None => None,
            Some(bytes) => Some(parse_record(&bytes)?),
        };
        schedules.push(Stored {
            name,
            record,
            next_ms: opt_int(&s[2])?,
            last_ms: opt_int(&s[3])?,
            payload: if with_payload {
                opt_bytes(&s[4])?
            } else {
                None
            },
        });
    }
    Some(ReadReply {
        version: u64::try_from(int(version)?).ok()?,
        full: int(full)? == 1,
        now_ms: int(now)?,
        schedules,
    })
}

/// The `schedules` field of the queue's `head` hash, `"<version>:<earliest
/// next>"` (nil: no schedule was ever written): (version, earliest next).
pub(crate) fn parse_head(v: &Value) -> Option<(u64, Option<i64>)> {
    let bytes = match opt_bytes(v)? {
        None => return Some((0, None)),
        Some(b) => b,
    };
    let text = std::str::from_utf8(&bytes).ok()?;
    let (version, next) = text.split_once(':')?;
    let next = if next.is_empty() {
        None
    } else {
        Some(next.parse().ok()?)
    };
    Some((version.parse().ok()?, next))
}

/// The `due` field of the queue's `head` hash (nil: nothing pending): its
/// epoch ms.
pub(crate) fn parse_queue_head(v: &Value) -> Option<Option<i64>> {
    opt_int(v)
}

/// `schedule_fire.lua`'s reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FireReply {
    /// The definitions changed since the plan: nothing was written.
    Stale { now_ms: i64, version: u64 },
    /// The groups not listed in `refused` were applied.
    Applied {
        now_ms: i64,
        fired: u64,
        written: u64,
        /// (name, the stored next occurrence, `None` when it has none).
        refused: Vec<(String, Option<i64>)>,
    },
}

/// `schedule_fire.lua`'s reply; `None` if it is not one.
pub(crate) fn parse_fire(v: &Value) -> Option<FireReply> {
    let Value::Array(items) = v else { return None };
    let [now, version, applied, rest @ ..] = items.as_slice() else {
        return None;
    };
    let now_ms = int(now)?;
    if int(applied)? < 0 {
        return Some(FireReply::Stale {
            now_ms,
            version: u64::try_from(int(version)?).ok()?,
        });
    }
    let [fired, written, rest @ ..] = rest else {
        return None;
    };
    if rest.len() % 2 != 0 {
        return None;
    }
    let refused = rest
        .chunks(2)
        .map(|pair| {
            let name = String::from_utf8(opt_bytes(&pair[0])??).ok()?;
            let next = int(&pair[1])?;
            Some((name, (next >= 0).then_some(next)))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(FireReply::Applied {
        now_ms,
        fired: u64::try_from(int(fired)?).ok()?,
        written: u64::try_from(int(written)?).ok()?,
        refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn records_and_heads_read_back_and_anything_else_is_refused() {
        assert_eq!(
            parse_record(b"12:1:v1;every=1000ms;start=-;until=-;catch_up=latest"),
            Some(Record {
                rev: 12,
                paused: true,
                definition: "v1;every=1000ms;start=-;until=-;catch_up=latest".into()
            })
        );
        assert_eq!(parse_record(b"12:2:v1"), None);
        assert_eq!(parse_record(b"x:0:v1"), None);
        assert_eq!(parse_head(&Value::Nil), Some((0, None)));
        assert_eq!(parse_head(&bulk("7:")), Some((7, None)));
        assert_eq!(
            parse_head(&bulk("7:1767225600000")),
            Some((7, Some(1_767_225_600_000)))
        );
        assert_eq!(parse_head(&bulk("7")), None);
        assert_eq!(parse_queue_head(&Value::Nil), Some(None));
        assert_eq!(parse_queue_head(&bulk("42")), Some(Some(42)));
    }

    #[test]
    fn read_replies_list_removed_and_changed_schedules() {
        let v = Value::Array(vec![
            Value::Int(9),
            Value::Int(0),
            Value::Int(1_000),
            bulk("a"),
            bulk("9:0:v1;every=5ms;start=-;until=-;catch_up=latest"),
            bulk("1005"),
            Value::Nil,
            bulk("gone"),
            Value::Nil,
            Value::Nil,
            Value::Nil,
        ]);
        let r = parse_read(&v, false).unwrap();
        assert_eq!((r.version, r.full, r.now_ms), (9, false, 1_000));
        assert_eq!(r.schedules.len(), 2);
        assert_eq!(r.schedules[0].next_ms, Some(1005));
        assert!(r.schedules[1].record.is_none());
        assert_eq!(parse_read(&v, true), None, "five values per schedule");
    }

    #[test]
    fn fire_replies_say_what_was_refused() {
        let v = Value::Array(vec![
            Value::Int(1_000),
            Value::Int(3),
            Value::Int(2),
            Value::Int(4),
            Value::Int(4),
            bulk("late"),
            Value::Int(2_000),
            bulk("done"),
            Value::Int(-1),
        ]);
        assert_eq!(
            parse_fire(&v),
            Some(FireReply::Applied {
                now_ms: 1_000,
                fired: 4,
                written: 4,
                refused: vec![("late".into(), Some(2_000)), ("done".into(), None)],
            })
        );
        let stale = Value::Array(vec![Value::Int(5), Value::Int(4), Value::Int(-1)]);
        assert_eq!(
            parse_fire(&stale),
            Some(FireReply::Stale {
                now_ms: 5,
                version: 4
            })
        );
        assert_eq!(parse_fire(&Value::Int(1)), None);
    }
}
