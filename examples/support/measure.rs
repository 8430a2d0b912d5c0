//! What the bench examples measure besides time: this process's CPU, a
//! Redis server's `INFO` counters, and percentiles. Included with
//! `#[path = "support/measure.rs"] mod measure;`.
#![allow(dead_code)] // each example uses a different part

use std::time::Duration;

/// CPU time this process used so far (user + system), from
/// `/proc/self/stat` (clock ticks of 10 ms).
pub fn process_cpu() -> Result<Duration, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which ends with ')'): utime is the
    // 12th, stime the 13th.
    let rest = &stat[stat.rfind(')').ok_or("bad /proc/self/stat")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(Duration::from_millis(ticks * 10))
}

/// `INFO` field `name` as a number.
pub fn info_field(
    con: &mut redis::Connection,
    section: &str,
    name: &str,
) -> Result<f64, Box<dyn std::error::Error>> {
    let info: String = redis::cmd("INFO").arg(section).query(con)?;
    let prefix = format!("{name}:");
    let value = info
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .ok_or_else(|| format!("no {name} in INFO {section}"))?;
    Ok(value.trim().parse()?)
}

/// Commands processed so far and CPU seconds used (user + system), summed
/// over `servers`. Each reading sends 3 `INFO`s per server.
pub fn server_totals(
    servers: &mut [redis::Connection],
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (mut cmds, mut cpu) = (0.0, 0.0);
    for con in servers.iter_mut() {
        cmds += info_field(con, "stats", "total_commands_processed")?;
        cpu += info_field(con, "cpu", "used_cpu_user")? + info_field(con, "cpu", "used_cpu_sys")?;
    }
    Ok((cmds, cpu))
}

/// The `p`-quantile (0..=1) of `sorted` by nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).max(1);
    sorted[rank - 1]
}
