//! Load generator for the join service (see docs/join-service.md); not written yet.

fn main() {}
