//! `redwheel locks`: the locks held, read through `redwheel::lock::inspect`.

use redwheel::Redwheel;
use serde_json::{Value, json};

use crate::Failure;
use crate::out::{self, Table, emit, emit_json, or_dash};

pub fn locks(rw: &Redwheel, pattern: &str, json: bool) -> Result<(), Failure> {
    let found = rw.find_locks(pattern)?;
    if json {
        let list: Vec<Value> = found
            .iter()
            .map(|l| {
                let holders: Vec<Value> = l
                    .holders
                    .iter()
                    .map(|(owner, count)| json!({ "owner": owner, "holds": count }))
                    .collect();
                json!({
                    "lock": l.name,
                    "holders": holders,
                    "ttl_ms": l.ttl_ms,
                    "token": l.token,
                    "last_token": l.last_token,
                })
            })
            .collect();
        emit_json(&json!({ "locks": list }));
        return Ok(());
    }
    if found.is_empty() {
        emit("no locks held\n");
        return Ok(());
    }
    let mut t = Table::new(&["LOCK", "HOLDER", "HOLDS", "TTL", "TOKEN"]);
    for l in &found {
        let (owner, holds) = l
            .holders
            .first()
            .map_or(("-".to_owned(), "-".to_owned()), |(o, c)| {
                (o.clone(), c.to_string())
            });
        t.row(vec![
            l.name.clone(),
            owner,
            holds,
            l.ttl_ms.map_or_else(|| "none".to_owned(), out::human_ms),
            or_dash(l.token.map(|t| t.to_string())),
        ]);
    }
    emit(&t.render());
    Ok(())
}
