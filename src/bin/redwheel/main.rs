//! The `redwheel` command-line tool (placeholder; see README "Operating it").
fn main() {}
