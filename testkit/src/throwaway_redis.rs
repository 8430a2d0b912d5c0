//! A throwaway `redis-server`: a private one on a free loopback port, in
//! a temporary directory, stopped (and the directory removed) on drop; or,
//! for [`redis_url`](crate::redis_url), one that lives as long as the
//! process and goes with it, however the process ends.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private redis-server on a free loopback port, stopped on drop.
pub struct ThrowawayRedis {
    port: u16,
    child: Option<Child>,
    dir: PathBuf,
    binary: String,
    extra: Vec<String>,
    /// Started behind a watchdog shell that kills it when this process's
    /// end closes the shell's stdin (see [`ThrowawayRedis::for_process`]).
    guarded: bool,
}

impl ThrowawayRedis {
    /// Starts one with no persistence; `name` goes into its directory's
    /// name.
    pub fn start(name: &str) -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        ThrowawayRedis::start_with("redis-server", name, &["--appendonly", "no"])
    }

    /// Starts `binary` with `extra` arguments (after port, bind, `--save ''`
    /// and the directory). Nothing is left behind if it does not start.
    pub fn start_with(
        binary: &str,
        name: &str,
        extra: &[&str],
    ) -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        ThrowawayRedis::launch(binary, name, extra, false)
    }

    /// Starts one with no persistence that is never dropped but dies with
    /// this process: it runs under a small `sh` watchdog whose stdin is a
    /// pipe from this process. When the process ends (returns, panics,
    /// aborts or is killed), the kernel closes the pipe; the watchdog then
    /// kills the server with SIGKILL and removes its directory. What
    /// [`redis_url`](crate::redis_url) keeps for the process.
    pub fn for_process(name: &str) -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        ThrowawayRedis::launch("redis-server", name, &["--appendonly", "no"], true)
    }

    /// The Redis an example uses: `REDIS_URL` if it is set, else a
    /// throwaway server started now, named `name`; its URL, and the server
    /// to keep until the example ends (`None` for `REDIS_URL`).
    pub fn unless_redis_url(
        name: &str,
    ) -> Result<(String, Option<ThrowawayRedis>), Box<dyn std::error::Error>> {
        if let Ok(url) = std::env::var("REDIS_URL") {
            return Ok((url, None));
        }
        let server = ThrowawayRedis::start(name)?;
        Ok((server.url(), Some(server)))
    }

    fn launch(
        binary: &str,
        name: &str,
        extra: &[&str],
        guarded: bool,
    ) -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = Self::dir_for(name);
        std::fs::create_dir_all(&dir)?;
        let mut server = ThrowawayRedis {
            port,
            child: None,
            dir,
            binary: binary.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            guarded,
        };
        // On an error `server` is dropped, which removes the directory.
        server.spawn()?;
        Ok(server)
    }

    /// The directory a server named `name` uses (in this process).
    pub fn dir_for(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("redwheel-{name}-{}", std::process::id()))
    }

    fn spawn(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        let missing = |e: std::io::Error| {
            format!(
                "could not start {} (install redis-server, or set REDIS_URL to use another Redis): {e}",
                self.binary
            )
        };
        let mut cmd = if self.guarded {
            // A missing binary is told apart from a server that failed.
            Command::new(&self.binary)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .map_err(missing)?;
            let mut sh = Command::new("sh");
            sh.arg("-c").arg(WATCHDOG).arg(&self.binary);
            sh.env("THROWAWAY_REDIS_DIR", &self.dir);
            sh.stdin(Stdio::piped());
            sh
        } else {
            Command::new(&self.binary)
        };
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", ""])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null());
        let child = cmd.spawn().map_err(missing)?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("redis-server exited at start: {status}").into());
            }
            if Instant::now() > deadline {
                return Err("redis-server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills it with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.guarded {
                // Closing the watchdog's stdin is its signal.
                drop(child.stdin.take());
            } else {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory; returns once it
    /// accepts connections.
    pub fn restart(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        self.kill();
        self.spawn()
    }
}

/// The watchdog of [`ThrowawayRedis::for_process`]: runs the server
/// (`$0` with the arguments) in the background, and a reader of the
/// shell's stdin (fd 3: an asynchronous list's own stdin is /dev/null)
/// that kills it once the pipe closes; after the server has gone, for
/// either reason, removes its directory. The shell exits with the
/// server, so a server that fails to start is seen at once.
const WATCHDOG: &str = r#"exec 3<&0
"$0" "$@" &
pid=$!
(read -r line <&3; kill -9 "$pid" 2>/dev/null) &
wait "$pid"
status=$?
rm -rf "$THROWAWAY_REDIS_DIR"
exit "$status""#;

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
