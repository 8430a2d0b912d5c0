//! Message ids after a `fork()` (issue 18, item 6).
//!
//! A pre-forking server (or any program that forks after using redwheel)
//! gives the child a copy of the parent's memory: the random id prefix
//! and the id counter included. Re-executing the test binary would not
//! show it (a new process draws a new prefix), so these tests fork for
//! real with `libc::fork`: the parent uses a queue (which sets up the id
//! generator) and shuts its `Redwheel` down, the child connects a
//! `Redwheel` of its own and offers, then the parent offers. Each
//! process's offer must end up in Redis as its own message, or fail; it
//! must never return `Ok` for a message that was not written, or
//! overwrite the other process's message.
//!
//! The two tests take turns (a fork while another test thread holds a
//! lock could leave the child stuck on it), and the child leaves with
//! `_exit`, running nothing of the test harness's.

mod faults_common;
mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use faults_common::ids_with_payload;
use redwheel::{Error, Redwheel};
use support::RedisServer;

const HOUR: Duration = Duration::from_secs(3600);
const HANG: Duration = Duration::from_secs(60);

/// One fork at a time in this binary.
static TURN: Mutex<()> = Mutex::new(());

/// Uses a queue in this process (the id generator is set up), then, in a
/// forked child, runs `child` with a fresh `Redwheel` on `url`; returns
/// once the child exited, with whether `child` succeeded.
fn in_forked_child(url: &str, child: fn(&Redwheel) -> Result<(), Error>) -> bool {
    {
        let rw = Redwheel::connect(url).unwrap();
        let q = rw.queue::<String>("fork").unwrap();
        q.offer(&"before the fork".to_string(), HOUR).unwrap();
        rw.shutdown(Duration::from_secs(10)).unwrap();
    }
    // SAFETY: `fork` has no preconditions of its own; what follows in the
    // child is the usual post-fork caveat (only the calling thread is
    // copied). The parent's `Redwheel` is shut down and its threads
    // joined, the tests of this binary take turns, and the child only
    // builds new objects (a `Redwheel` and its threads), then leaves with
    // `_exit` without running destructors or exit handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = Redwheel::connect(url).and_then(|rw| {
            child(&rw)?;
            rw.shutdown(Duration::from_secs(10))
        });
        // SAFETY: ends the child at once, as after any fork in a
        // multi-threaded program.
        unsafe { libc::_exit(if ok.is_ok() { 0 } else { 1 }) };
    }
    wait_for(pid)
}

/// Waits for child `pid` (a hang guard kills it); true if it exited 0.
fn wait_for(pid: libc::pid_t) -> bool {
    let deadline = Instant::now() + HANG;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid place for the result; WNOHANG makes
        // the call return at once.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        assert!(r == 0, "waitpid failed");
        if Instant::now() > deadline {
            // SAFETY: `pid` is our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("hang guard: the forked child did not finish");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn offer_after_a_fork_writes_its_own_message_or_fails() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let server = RedisServer::start();
    let url = server.url();
    let child_ok = in_forked_child(&url, |rw| {
        rw.queue::<String>("fork")?
            .offer(&"child".to_string(), HOUR)?;
        Ok(())
    });
    assert!(child_ok, "the child's offer");
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw.queue::<String>("fork").unwrap();
    let r = q.offer(&"parent".to_string(), HOUR);
    let child = ids_with_payload(&server, "fork", "child");
    let parent = ids_with_payload(&server, "fork", "parent");
    assert_eq!(child.len(), 1, "the child's message: {child:?}");
    match r {
        Ok(id) => assert_eq!(
            parent,
            [id.as_str()],
            "offer returned Ok({id}) but wrote nothing: the forked child had already used that id ({child:?}), and \
             the script's \"id already known\" answer was ignored"
        ),
        Err(e) => assert!(
            parent.is_empty(),
            "offer failed with {e}, yet wrote {parent:?}"
        ),
    }
}

#[test]
fn offer_batch_after_a_fork_never_overwrites_the_other_process_message() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let server = RedisServer::start();
    let url = server.url();
    let child_ok = in_forked_child(&url, |rw| {
        rw.queue::<String>("fork")?
            .offer_batch(&[("child".to_string(), HOUR)])?;
        Ok(())
    });
    assert!(child_ok, "the child's offer");
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw.queue::<String>("fork").unwrap();
    let r = q.offer_batch(&[("parent".to_string(), HOUR)]);
    let child = ids_with_payload(&server, "fork", "child");
    let parent = ids_with_payload(&server, "fork", "parent");
    let ids = r
        .as_ref()
        .map(|ids| ids.iter().map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(
        child.len(),
        1,
        "the child's message is gone: the parent's batch ({ids:?}) reused its id and overwrote it (parent's: \
         {parent:?})"
    );
    match ids {
        Ok(ids) => assert_eq!(
            parent, ids,
            "the parent's message is stored under the id it was given"
        ),
        Err(e) => assert!(
            parent.is_empty(),
            "offer_batch failed with {e}, yet wrote {parent:?}"
        ),
    }
}
