//! Support for redwheel's fuzz targets.
//!
//! [`timer_model`] is the model and replay harness that the property tests
//! (`tests/timer_props.rs`) share; this crate adds the [`Arbitrary`]
//! decoding of an operation sequence that the `timer_ops` target replays.
//! The decoding favours the interesting values (zero delays, exact wheel
//! spans, never-firing delays, small steps); the model normalises every
//! number it is given, so no input is rejected.

#![forbid(unsafe_code)]

pub mod timer_model;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::timer_model::{Config, Delay, MAX_OPS, Op, Step, Task};

/// One fuzz input: a timer shape and the operations to replay on it.
#[derive(Debug)]
pub struct Case {
    /// The timer's shape.
    pub config: Config,
    /// The operations, at most [`MAX_OPS`].
    pub ops: Vec<Op>,
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let config = Config {
            tick_ns: u.int_in_range(1_000_000..=10_000_000)?,
            ticks_per_wheel: u.int_in_range(1..=64)?,
        };
        let mut ops = Vec::new();
        while ops.len() < MAX_OPS && !u.is_empty() {
            ops.push(Op::arbitrary(u)?);
        }
        Ok(Case { config, ops })
    }
}

fn delay(u: &mut Unstructured<'_>) -> Result<Delay> {
    Ok(match u.int_in_range(0u8..=11)? {
        0 | 1 => Delay::Zero,
        2 => Delay::SubTick(u.arbitrary()?),
        3..=5 => Delay::Ticks {
            ticks: u.int_in_range(0..=80)?,
            extra: u.arbitrary()?,
        },
        6 | 7 => Delay::Spans {
            turns: u.int_in_range(0..=4)?,
            offset: u.int_in_range(-2..=2)?,
        },
        8 => Delay::Years(u.arbitrary()?),
        9 => Delay::Nanos(u.arbitrary()?),
        10 => Delay::Nanos(u64::MAX - u64::from(u.arbitrary::<u16>()?)),
        _ => Delay::Max,
    })
}

fn step(u: &mut Unstructured<'_>) -> Result<Step> {
    Ok(match u.int_in_range(0u8..=9)? {
        0 | 1 => Step::SubTick(u.arbitrary()?),
        2 | 3 => Step::ToTickEnd(u.arbitrary()?),
        4..=6 => Step::Ticks {
            ticks: u.int_in_range(0..=16)?,
            extra: u.arbitrary()?,
        },
        7 => Step::Ticks {
            ticks: u.arbitrary()?,
            extra: u.arbitrary()?,
        },
        8 => Step::Turns(u.arbitrary()?),
        _ => Step::Far {
            days: u.arbitrary()?,
            overshoot: u.arbitrary()?,
        },
    })
}

fn task(u: &mut Unstructured<'_>) -> Result<Task> {
    Ok(match u.int_in_range(0u8..=10)? {
        0..=3 => Task::Record,
        4 | 5 => Task::Rearm {
            delay: delay(u)?,
            times: u.arbitrary()?,
        },
        6 | 7 => Task::Cancel {
            pick: u.arbitrary()?,
        },
        8 => Task::CancelSelf,
        9 => Task::Panic,
        _ => Task::CallStop,
    })
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(match u.int_in_range(0u8..=40)? {
            0..=13 => Op::Schedule {
                delay: delay(u)?,
                task: task(u)?,
            },
            14..=18 => Op::Cancel {
                pick: u.arbitrary()?,
            },
            19..=35 => Op::Advance(step(u)?),
            36 | 37 => Op::Settle,
            38 | 39 => Op::Start,
            _ => Op::Stop,
        })
    }
}
