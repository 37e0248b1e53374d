//! Model discovery for model routing: which models each backend of a `[[pool]]` serves, from
//! its OpenAI-style `GET /v1/models` answer or the `model_name` labels of its metrics page,
//! polled by one task per pool. A failed poll keeps what was known (and is logged).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::config::Discovery;
use crate::telemetry::{exposition, scrape::http_get};

/// Largest answer read.
const MAX_BODY: usize = 1 << 20;

/// The model ids of an OpenAI `GET /v1/models` answer: `{"object": "list", "data": [{"id":
/// ...}, ...]}`.
pub fn parse_models(body: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let data = value
        .get("data")
        .and_then(|d| d.as_array())
        .ok_or("no \"data\" list of models")?;
    let mut models = Vec::new();
    for (i, m) in data.iter().enumerate() {
        let id = m
            .get("id")
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("data[{i}] has no string \"id\""))?;
        if !models.iter().any(|x| x == id) {
            models.push(id.to_string());
        }
    }
    models.sort();
    Ok(models)
}

/// The `model_name` label values of a Prometheus page.
pub fn models_of_page(page: &str) -> Result<Vec<String>, String> {
    let samples = exposition::parse(page).map_err(|e| e.to_string())?;
    let mut models: Vec<String> = samples
        .iter()
        .filter_map(|s| s.label("model_name"))
        .map(str::to_string)
        .collect();
    models.sort();
    models.dedup();
    Ok(models)
}

/// Asks one backend which models it serves.
pub async fn discover(
    backend: IpAddr,
    how: &Discovery,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    match how {
        Discovery::None => Ok(Vec::new()),
        Discovery::Models { port, path } => {
            let body = http_get(SocketAddr::new(backend, *port), path, timeout, MAX_BODY).await?;
            parse_models(&body)
                .map_err(|e| format!("{}{path}: {e}", SocketAddr::new(backend, *port)))
        }
        Discovery::Metrics { port, path } => {
            let body = http_get(SocketAddr::new(backend, *port), path, timeout, MAX_BODY).await?;
            models_of_page(&body)
                .map_err(|e| format!("{}{path}: {e}", SocketAddr::new(backend, *port)))
        }
    }
}

type Key = (Vec<IpAddr>, Discovery, Duration);

/// The daemon as model discovery reaches it. (Implemented by the daemon.)
pub trait DiscoveryPort: Send + Sync + 'static {
    /// The pools that discover their models: (pool name, backends, how, interval).
    fn discovery_targets(&self) -> Vec<(String, Vec<IpAddr>, Discovery, Duration)>;
    /// Records one round's results; blocking (it may rebuild tables).
    fn record_models(&self, pool: &str, results: Vec<(IpAddr, Result<Vec<String>, String>)>);
}

/// The running discovery tasks, by pool name.
#[derive(Default)]
pub struct DiscoveryLoops {
    tasks: crate::tasks::Tasks<String, Key>,
}

impl DiscoveryLoops {
    /// Brings the tasks in line with the daemon's pools.
    pub fn reconcile<P: DiscoveryPort>(&mut self, daemon: &Arc<P>) {
        let targets: HashMap<String, Key> = daemon
            .discovery_targets()
            .into_iter()
            .map(|(pool, backends, how, interval)| (pool, (backends, how, interval)))
            .collect();
        self.tasks.reconcile(targets, |name, key| {
            tokio::spawn(run(daemon.clone(), name.clone(), key.clone()))
        });
    }

    pub fn stop(&mut self) {
        self.tasks.stop();
    }
}

async fn run<P: DiscoveryPort>(daemon: Arc<P>, pool: String, (backends, how, interval): Key) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout = interval.min(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let mut set = JoinSet::new();
        for backend in &backends {
            let (backend, how) = (*backend, how.clone());
            set.spawn(async move { (backend, discover(backend, &how, timeout).await) });
        }
        let mut results = Vec::new();
        while let Some(done) = set.join_next().await {
            if let Ok(r) = done {
                results.push(r);
            }
        }
        let d = daemon.clone();
        let pool = pool.clone();
        let _ = tokio::task::spawn_blocking(move || d.record_models(&pool, results)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_model_lists_and_metrics_labels_give_models() {
        let body = r#"{"object":"list","data":[{"id":"llama-3-8b","object":"model","owned_by":"vllm"},{"id":"mistral-7b","object":"model"}]}"#;
        assert_eq!(
            parse_models(body).unwrap(),
            vec!["llama-3-8b", "mistral-7b"]
        );
        assert!(parse_models("{}").unwrap_err().contains("data"));
        assert!(
            parse_models(r#"{"data":[{"name":"x"}]}"#)
                .unwrap_err()
                .contains("data[0]")
        );
        assert!(parse_models("<html>").unwrap_err().contains("not JSON"));
        let page = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"llama-3-8b\"} 1\nvllm:num_requests_running{engine=\"1\",model_name=\"llama-3-8b\"} 0\n";
        assert_eq!(models_of_page(page).unwrap(), vec!["llama-3-8b"]);
    }
}
