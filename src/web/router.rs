//! Routes: a method and a path to what to do (pure; no I/O). Path segments
//! are percent-decoded one by one, so a name holding `/` (sent as `%2F`)
//! stays one segment.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// A page or a document to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Read {
    Overview,
    Queue(String),
    Locks,
    ApiStatus,
    ApiQueues,
    ApiQueue(String),
    ApiLocks,
    Style,
    Script,
}

/// An action (`POST` only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    RequeueDead { queue: String },
    Remove { queue: String, id: String },
    Pause { queue: String },
    Resume { queue: String },
    TriggerSchedule { queue: String, schedule: String },
    ForceUnlock { lock: String },
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Read(Read),
    Action(Action),
    /// The path exists, for another method (the `Allow` header's value).
    WrongMethod(&'static str),
    NotFound,
}

/// The route of `method` on `path` (the URL without its query).
pub(crate) fn route(method: &str, path: &str) -> Route {
    let Some(segments) = segments(path) else {
        return Route::NotFound;
    };
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let read = match s.as_slice() {
        [] => Some(Read::Overview),
        ["queues", name] => Some(Read::Queue((*name).to_owned())),
        ["locks"] => Some(Read::Locks),
        ["api", "status"] => Some(Read::ApiStatus),
        ["api", "queues"] => Some(Read::ApiQueues),
        ["api", "queues", name] => Some(Read::ApiQueue((*name).to_owned())),
        ["api", "locks"] => Some(Read::ApiLocks),
        ["assets", "dashboard.css"] => Some(Read::Style),
        ["assets", "dashboard.js"] => Some(Read::Script),
        _ => None,
    };
    let action = match s.as_slice() {
        ["api", "queues", queue, "requeue-dead"] => Some(Action::RequeueDead {
            queue: (*queue).to_owned(),
        }),
        ["api", "queues", queue, "messages", id, "remove"] => Some(Action::Remove {
            queue: (*queue).to_owned(),
            id: (*id).to_owned(),
        }),
        ["api", "queues", queue, "pause"] => Some(Action::Pause {
            queue: (*queue).to_owned(),
        }),
        ["api", "queues", queue, "resume"] => Some(Action::Resume {
            queue: (*queue).to_owned(),
        }),
        ["api", "queues", queue, "schedules", schedule, "trigger"] => {
            Some(Action::TriggerSchedule {
                queue: (*queue).to_owned(),
                schedule: (*schedule).to_owned(),
            })
        }
        ["api", "locks", lock, "force-unlock"] => Some(Action::ForceUnlock {
            lock: (*lock).to_owned(),
        }),
        _ => None,
    };
    match (method, read, action) {
        ("GET", Some(r), _) => Route::Read(r),
        ("POST", _, Some(a)) => Route::Action(a),
        (_, Some(_), _) => Route::WrongMethod("GET"),
        (_, _, Some(_)) => Route::WrongMethod("POST"),
        _ => Route::NotFound,
    }
}

/// The path of `action`, which [`route`] reads back as it (`POST`).
pub(crate) fn action_path(action: &Action) -> String {
    match action {
        Action::RequeueDead { queue } => format!("/api/queues/{}/requeue-dead", segment(queue)),
        Action::Remove { queue, id } => {
            format!(
                "/api/queues/{}/messages/{}/remove",
                segment(queue),
                segment(id)
            )
        }
        Action::Pause { queue } => format!("/api/queues/{}/pause", segment(queue)),
        Action::Resume { queue } => format!("/api/queues/{}/resume", segment(queue)),
        Action::TriggerSchedule { queue, schedule } => format!(
            "/api/queues/{}/schedules/{}/trigger",
            segment(queue),
            segment(schedule)
        ),
        Action::ForceUnlock { lock } => format!("/api/locks/{}/force-unlock", segment(lock)),
    }
}

/// The decoded segments of `path`; `None` if one is not UTF-8 once
/// decoded or the path does not start with `/`. A trailing `/` is ignored.
fn segments(path: &str) -> Option<Vec<String>> {
    let rest = path.strip_prefix('/')?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Some(Vec::new());
    }
    rest.split('/')
        .map(|seg| {
            percent_decode_str(seg)
                .decode_utf8()
                .ok()
                .map(|s| s.into_owned())
        })
        .collect()
}

/// The value of `key` in a query string (`a=1&b=2`), form-decoded (`+` is
/// a space); the first one if repeated.
pub(crate) fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (form_decode(k)? == key).then(|| form_decode(v)).flatten()
    })
}

fn form_decode(s: &str) -> Option<String> {
    let spaced = s.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// Characters left as they are in a path segment: RFC 3986's unreserved
/// ones. Everything else (`/`, `?`, `#`, `%`, spaces, quotes, non-ASCII)
/// is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` as one path segment (or a query value).
pub(crate) fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_documents_are_gets() {
        assert_eq!(route("GET", "/"), Route::Read(Read::Overview));
        assert_eq!(route("GET", "/locks"), Route::Read(Read::Locks));
        assert_eq!(route("GET", "/api/queues/"), Route::Read(Read::ApiQueues));
        assert_eq!(
            route("GET", "/queues/orders%2Feu%20x"),
            Route::Read(Read::Queue("orders/eu x".to_owned()))
        );
        assert_eq!(
            route("GET", "/api/queues/%3Cb%3E"),
            Route::Read(Read::ApiQueue("<b>".to_owned()))
        );
        assert_eq!(route("POST", "/"), Route::WrongMethod("GET"));
        assert_eq!(route("GET", "/nope"), Route::NotFound);
        assert_eq!(route("GET", "/queues/%FF"), Route::NotFound);
        assert_eq!(route("GET", "no-slash"), Route::NotFound);
    }

    #[test]
    fn actions_are_posts_only() {
        assert_eq!(
            route("POST", "/api/queues/q/requeue-dead"),
            Route::Action(Action::RequeueDead {
                queue: "q".to_owned()
            })
        );
        assert_eq!(
            route("POST", "/api/queues/q/messages/a%2Fb/remove"),
            Route::Action(Action::Remove {
                queue: "q".to_owned(),
                id: "a/b".to_owned()
            })
        );
        assert_eq!(
            route("POST", "/api/locks/inv%3A42/force-unlock"),
            Route::Action(Action::ForceUnlock {
                lock: "inv:42".to_owned()
            })
        );
        assert_eq!(
            route("POST", "/api/queues/q%2Fx/pause"),
            Route::Action(Action::Pause {
                queue: "q/x".to_owned()
            })
        );
        assert_eq!(
            route("POST", "/api/queues/q/resume"),
            Route::Action(Action::Resume {
                queue: "q".to_owned()
            })
        );
        assert_eq!(
            route("POST", "/api/queues/q/schedules/night%20ly/trigger"),
            Route::Action(Action::TriggerSchedule {
                queue: "q".to_owned(),
                schedule: "night ly".to_owned()
            })
        );
        for path in [
            "/api/queues/q/requeue-dead",
            "/api/queues/q/messages/1/remove",
            "/api/queues/q/pause",
            "/api/queues/q/resume",
            "/api/queues/q/schedules/s/trigger",
            "/api/locks/l/force-unlock",
        ] {
            assert_eq!(route("GET", path), Route::WrongMethod("POST"), "{path}");
            assert_eq!(route("HEAD", path), Route::WrongMethod("POST"), "{path}");
        }
        assert_eq!(route("POST", "/api/queues/q/schedules/s"), Route::NotFound);
    }

    #[test]
    fn segments_round_trip_through_encoding() {
        for name in ["orders", "a/b", "a b?c#d%e", "<script>", "ünï:côdé", "x+y"] {
            let path = format!("/queues/{}", segment(name));
            assert_eq!(
                route("GET", &path),
                Route::Read(Read::Queue(name.to_owned()))
            );
            let (q, x) = (name.to_owned(), format!("{name}!"));
            for a in [
                Action::RequeueDead { queue: q.clone() },
                Action::Remove {
                    queue: q.clone(),
                    id: x.clone(),
                },
                Action::Pause { queue: q.clone() },
                Action::Resume { queue: q.clone() },
                Action::TriggerSchedule {
                    queue: q.clone(),
                    schedule: x.clone(),
                },
                Action::ForceUnlock { lock: q.clone() },
            ] {
                assert_eq!(route("POST", &action_path(&a)), Route::Action(a));
            }
        }
    }

    #[test]
    fn query_values_are_form_decoded() {
        assert_eq!(
            query_param("limit=5&show=a%2Fb", "show").as_deref(),
            Some("a/b")
        );
        assert_eq!(query_param("count=all", "count").as_deref(), Some("all"));
        assert_eq!(query_param("q=a+b", "q").as_deref(), Some("a b"));
        assert_eq!(query_param("flag", "flag").as_deref(), Some(""));
        assert_eq!(query_param("", "x"), None);
    }
}
