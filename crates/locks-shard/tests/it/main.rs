//! The shard contract on the in-memory double: balance, stickiness, stop-before-start,
//! disagreement, loss, leave and drop (the PostgreSQL runs are in `locks-shard-postgres`).

mod arc;
mod limits;
mod memory;
mod metrics;
mod support;
