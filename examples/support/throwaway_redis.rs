//! The examples' throwaway `redis-server`, whose one home is the testkit
//! (`testkit/src/throwaway_redis.rs`, a dev-dependency). Kept at this path
//! for the examples that include it with
//! `#[path = "support/throwaway_redis.rs"] mod throwaway_redis;`.
#![allow(unused_imports)]

pub use redwheel_testkit::ThrowawayRedis;
