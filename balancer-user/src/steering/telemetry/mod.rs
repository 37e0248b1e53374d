//! Backend telemetry: scraping the metrics pages inference servers and GPU exporters serve
//! ([`page`], [`signals`]) at a pace set by the VIP's requests ([`pace`]; a burst's
//! scrape told by the data plane, [`due`]), reports pushed
//! to the API, and the store of each backend's latest signals with the rates derived from its
//! counters ([`store`]).

pub mod due;
pub mod loops;
pub mod pace;
pub mod page;
pub mod round;
pub mod scrape;
pub mod signals;
pub mod store;
