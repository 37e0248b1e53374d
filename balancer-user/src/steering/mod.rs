//! What steers the tables: telemetry (reports and scrapes), the weight policy, health checks,
//! model discovery, and the fleet's shared weights, with the background tasks that run them and the once-a-second thread that keeps them in line
//! with the config.

pub mod discovery;
pub mod fleet;
pub mod health;
pub mod policy;
pub mod tasks;
pub mod telemetry;
pub mod ticker;
