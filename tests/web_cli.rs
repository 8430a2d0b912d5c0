//! `redwheel web`: the command serves the library's dashboard.

mod support;
mod web_common;

use std::time::Duration;

use redwheel::Redwheel;
use support::RedisServer;
use support::dashboard::http;
use web_common::Web;

#[test]
fn the_web_command_serves_the_dashboard_with_its_token_and_read_only_switch() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    rw.queue::<String>("orders")
        .unwrap()
        .offer(&"o".to_owned(), Duration::from_secs(3_600))
        .unwrap();

    let web = Web::start(&redis.url(), &["--token", "t0ken"]);
    let addr = web.addr;
    assert!(addr.ip().is_loopback());
    let status = http(addr, "GET", "/api/status", &[]).json();
    assert_eq!(
        (&status["token_required"], &status["read_only"]),
        (&true.into(), &false.into())
    );
    let path = "/api/queues/orders/requeue-dead?count=1";
    assert_eq!(http(addr, "POST", path, &[]).status, 401);
    assert_eq!(
        http(addr, "POST", path, &[("Authorization", "Bearer t0ken")]).status,
        200
    );

    let ro = Web::start(&redis.url(), &["--read-only"]);
    assert_eq!(http(ro.addr, "POST", path, &[]).status, 403);
    assert_eq!(
        http(ro.addr, "GET", "/api/status", &[]).json()["read_only"],
        true
    );
}
