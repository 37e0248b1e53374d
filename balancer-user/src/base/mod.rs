//! Values and config: what every other layer is written in. Imports nothing of the crate's
//! other layers.

pub mod config;
pub mod error_text;
pub mod files;
pub mod http_client;
pub mod net;
pub mod tls;
