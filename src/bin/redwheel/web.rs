//! `redwheel web`: the library's dashboard (`redwheel::web`) on a port,
//! until the process is interrupted.

use std::io::Write as _;
use std::net::ToSocketAddrs as _;

use redwheel::Redwheel;
use redwheel::web::Dashboard;
use serde_json::json;

use crate::args::WebArgs;
use crate::{Failure, code};

pub fn serve(rw: &Redwheel, args: &WebArgs, json: bool) -> Result<(), Failure> {
    let mut dashboard = Dashboard::new(rw).read_only(args.read_only);
    if let Some(t) = &args.token {
        dashboard = dashboard.token(t.as_str());
    }
    for name in &args.allow_hosts {
        dashboard = dashboard.allow_host(name.as_str());
    }
    let loopback = args
        .listen
        .to_socket_addrs()
        .map_err(|e| Failure::new(code::USAGE, format!("--listen {}: {e}", args.listen)))?
        .all(|a| a.ip().is_loopback());
    let server = dashboard.serve(args.listen.as_str())?;
    if !loopback && args.token.is_none() && !args.read_only {
        let _ = writeln!(
            std::io::stderr(),
            "redwheel: warning: listening on {} without --token: whoever reaches it reads every payload and can requeue, remove and force-unlock",
            server.local_addr()
        );
    }
    let line = if json {
        json!({
            "url": server.url(),
            "read_only": args.read_only,
            "token_required": args.token.is_some(),
        })
        .to_string()
    } else {
        format!(
            "redwheel dashboard on {}{}",
            server.url(),
            if args.read_only { " (read-only)" } else { "" }
        )
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    drop(out);
    server.wait();
    Ok(())
}
