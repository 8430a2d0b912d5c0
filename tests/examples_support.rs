//! The examples' throwaway `redis-server` launcher
//! (`examples/support/throwaway_redis.rs`), which the quickstart uses.

#[path = "../examples/support/throwaway_redis.rs"]
mod throwaway_redis;

use throwaway_redis::ThrowawayRedis;

// A user ran the quickstart without redis-server installed and found
// `/tmp/redwheel-quickstart-<pid>` left behind.
#[test]
fn a_missing_redis_server_leaves_no_directory_behind() {
    let name = "missing-binary";
    let err = ThrowawayRedis::start_with("/nonexistent/redis-server", name, &[])
        .err()
        .expect("there is no such binary");
    assert!(err.to_string().contains("could not start"), "{err}");
    assert!(!ThrowawayRedis::dir_for(name).exists());
}

#[test]
fn a_started_server_answers_and_its_directory_goes_with_it() {
    let name = "started";
    let server = ThrowawayRedis::start(name).expect("redis-server starts");
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_connection().unwrap();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    assert!(ThrowawayRedis::dir_for(name).exists());
    drop(server);
    assert!(!ThrowawayRedis::dir_for(name).exists());
}
