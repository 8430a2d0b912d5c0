//! The web dashboard embedded in a service (feature `web`).
//!
//! A "service" with a queue of orders, some of them failing into the dead
//! letters, serves the dashboard on a loopback port of its own beside its
//! work, with a token for the actions. The example then reads the
//! dashboard's JSON overview over HTTP as a monitoring probe would,
//! checks that it shows the queue with its dead letters, tries an action
//! without the token (refused: 401) and with it (the dead letters are
//! requeued), and stops the dashboard with the service.
//!
//! Run with `cargo run --example dashboard --features web`; add
//! `-- --serve 60` to keep it up for 60 s and open the printed URL in a
//! browser. It uses the Redis at `REDIS_URL` if set; otherwise it starts a
//! throwaway `redis-server` on a free loopback port (and stops it at the
//! end).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use redwheel::web::Dashboard;
use redwheel::{ConsumerOptions, QueueOptions, Redwheel};
use redwheel_testkit::ThrowawayRedis;

/// One HTTP/1.1 request to the dashboard; the status code and the body.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status line")?;
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((status, body.to_owned()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve_for = match std::env::args().skip_while(|a| a != "--serve").nth(1) {
        Some(secs) => Some(Duration::from_secs(secs.parse()?)),
        None => None,
    };
    // REDIS_URL, or a throwaway redis-server kept until the end of main.
    let (url, _server) = ThrowawayRedis::unless_redis_url("dashboard")?;
    println!("using {url}");

    // The service: orders, one in four failing for good.
    let rw = Redwheel::connect(&url)?;
    let q = rw.queue_with::<String>("example-orders", QueueOptions::default().max_deliveries(1))?;
    q.clear()?;
    for i in 0..40 {
        q.offer(&format!("order-{i}"), Duration::from_millis(10 * i))?;
    }
    let consumer = q.consume(ConsumerOptions::default().concurrency(2), |d| {
        let n: u32 = d
            .payload()
            .trim_start_matches("order-")
            .parse()
            .unwrap_or(0);
        if n % 4 == 3 {
            Err("payment declined")
        } else {
            Ok(())
        }
    })?;

    // The dashboard, on a port of the service's choosing (here: any free
    // loopback port), refreshed every 200 ms for this demo (default 2 s).
    let token = "s3cret";
    let dashboard = Dashboard::new(&rw)
        .token(token)
        .refresh_interval(Duration::from_millis(200))
        .serve_on(TcpListener::bind("127.0.0.1:0")?)?;
    let addr = dashboard.local_addr();
    println!("dashboard at {} (token {token})", dashboard.url());

    // What a probe sees: the queue, once its ten dead letters are there.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http(addr, "GET", "/api/queues", "")?;
        // 503 until the first refresh has read Redis.
        if status != 200 && status != 503 {
            return Err(format!("GET /api/queues answered {status}: {body}").into());
        }
        if status == 200
            && body.contains("\"name\":\"example-orders\"")
            && body.contains("\"dead\":10")
        {
            println!("GET /api/queues: {body}");
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the overview never showed 10 dead letters: {body}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // An action without the token is refused; with it, it runs.
    let requeue = "/api/queues/example-orders/requeue-dead?confirm=yes";
    let (status, _) = http(addr, "POST", requeue, "")?;
    println!("POST requeue-dead without the token: {status}");
    if status != 401 {
        return Err(format!("an action without the token answered {status}, not 401").into());
    }
    let auth = format!("Authorization: Bearer {token}\r\n");
    let (status, body) = http(addr, "POST", requeue, &auth)?;
    println!("POST requeue-dead with the token: {status} {body}");
    if status != 200 {
        return Err(format!("the requeue answered {status}: {body}").into());
    }

    if let Some(d) = serve_for {
        println!("serving for {} s: open {}", d.as_secs(), dashboard.url());
        std::thread::sleep(d);
    }
    dashboard.stop();
    consumer.shutdown(Duration::from_secs(5))?;
    q.clear()?;
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}
