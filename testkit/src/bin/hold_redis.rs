//! For testkit's own tests: prints `redis_url()`, waits for a line on
//! stdin (the test has looked at the server by then), then ends as its
//! argument says: `exit` (returns from main), `abort`, or `park` (waits to
//! be killed).

fn main() {
    let url = redwheel_testkit::redis_url();
    println!("{url}");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    match std::env::args().nth(1).as_deref() {
        Some("abort") => std::process::abort(),
        Some("park") => loop {
            std::thread::park();
        },
        _ => {}
    }
}
