//! A release that finds its session already ended: a binary of its own. The cases need a
//! monitor that has not looked yet, on a pool whose connections do not announce their
//! end; but any connection of this crate's pools that ends wakes every monitor in the
//! process (`pool::connect`'s signal), and with the `it` binary's other cases ending
//! connections beside them the monitor sometimes found the loss first (CI, stop 46:
//! `Lost(ConnectionClosed)` where `SessionClosed` was expected). Here nothing else runs.

#[allow(dead_code)]
#[path = "../it/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../it/recorded.rs"]
mod recorded;

mod cases;
