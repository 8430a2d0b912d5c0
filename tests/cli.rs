//! The `redwheel` command-line tool run as a process (placeholder).
