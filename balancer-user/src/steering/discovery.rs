//! Model discovery for model routing: which models each backend of a `[[pool]]` serves, from
//! its OpenAI-style `GET /v1/models` answer or the `model_name` labels of its metrics page,
//! polled by one task per pool. A failed poll keeps what was known (and is logged).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::base::config::{Discovery, ScrapeAccess};
use crate::base::http_client::{AccessNames, HttpClient};
use crate::steering::telemetry::page;
use crate::steering::telemetry::signals::{MAX_MODEL_NAME, MAX_MODELS};

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
        models.push(id.to_string());
    }
    bounded(models)
}

/// The distinct models, sorted; a list longer than [`MAX_MODELS`] or a name longer than
/// [`MAX_MODEL_NAME`] is refused.
fn bounded(mut models: Vec<String>) -> Result<Vec<String>, String> {
    models.sort();
    models.dedup();
    if models.len() > MAX_MODELS {
        return Err(format!("{} models, at most {MAX_MODELS}", models.len()));
    }
    if let Some(long) = models.iter().find(|m| m.len() > MAX_MODEL_NAME) {
        return Err(format!(
            "a model name of {} bytes, at most {MAX_MODEL_NAME}",
            long.len()
        ));
    }
    Ok(models)
}

/// The `model_name` label values of a Prometheus page.
pub fn models_of_page(page: &str) -> Result<Vec<String>, String> {
    let samples = page::parse(page).map_err(|e| e.to_string())?;
    bounded(
        samples
            .iter()
            .filter_map(|s| s.label("model_name"))
            .map(str::to_string)
            .collect(),
    )
}

/// Asks one backend which models it serves, through `client` (plain or HTTPS, with its token).
pub async fn discover(
    client: &HttpClient,
    backend: IpAddr,
    how: &Discovery,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    match how {
        Discovery::None => Ok(Vec::new()),
        Discovery::Models { port, path } => {
            let body = client
                .get(SocketAddr::new(backend, *port), path, timeout, MAX_BODY)
                .await?;
            parse_models(&body)
                .map_err(|e| format!("{}{path}: {e}", SocketAddr::new(backend, *port)))
        }
        Discovery::Metrics { port, path } => {
            let body = client
                .get(SocketAddr::new(backend, *port), path, timeout, MAX_BODY)
                .await?;
            models_of_page(&body)
                .map_err(|e| format!("{}{path}: {e}", SocketAddr::new(backend, *port)))
        }
    }
}

/// What one pool's discovery task does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolDiscovery {
    pub backends: Vec<IpAddr>,
    pub how: Discovery,
    /// Between rounds.
    pub interval: Duration,
    /// How the backends are reached.
    pub access: ScrapeAccess,
}

/// The daemon as model discovery reaches it. (Implemented by the daemon.)
pub trait DiscoveryPort: Send + Sync + 'static {
    /// The pools that discover their models, by name.
    fn discovery_targets(&self) -> Vec<(String, PoolDiscovery)>;
    /// Records one round's results; blocking (it may rebuild tables).
    fn record_models(&self, pool: &str, results: Vec<(IpAddr, Result<Vec<String>, String>)>);
}

/// The running discovery tasks, by pool name.
#[derive(Default)]
pub struct DiscoveryLoops {
    tasks: crate::steering::tasks::Tasks<String, PoolDiscovery>,
}

impl DiscoveryLoops {
    /// Brings the tasks in line with the daemon's pools.
    pub fn reconcile<P: DiscoveryPort>(&mut self, daemon: &Arc<P>) {
        let targets: HashMap<String, PoolDiscovery> =
            daemon.discovery_targets().into_iter().collect();
        self.tasks.reconcile(targets, |name, target| {
            tokio::spawn(run(daemon.clone(), name.clone(), target.clone()))
        });
    }

    pub fn stop(&mut self) {
        self.tasks.stop();
    }
}

async fn run<P: DiscoveryPort>(daemon: Arc<P>, pool: String, target: PoolDiscovery) {
    let mut tick = tokio::time::interval(target.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout = target.interval.min(Duration::from_secs(2));
    // One client per pool (keep-alive to each backend); its files are read once, and an
    // unusable one fails every round (each backend keeps what was known, and it is logged).
    let client = HttpClient::with_access(&target.access, &AccessNames::POOL);
    loop {
        tick.tick().await;
        let mut set = JoinSet::new();
        for backend in &target.backends {
            let (backend, how, client) = (*backend, target.how.clone(), client.clone());
            set.spawn(async move {
                let result = match client {
                    Ok(client) => discover(&client, backend, &how, timeout).await,
                    Err(e) => Err(e),
                };
                (backend, result)
            });
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
        // Bounded: a list of countless models is refused, and read in bounded time.
        let many: Vec<String> = (0..50_000).map(|i| format!(r#"{{"id":"m{i}"}}"#)).collect();
        let body = format!(r#"{{"data":[{}]}}"#, many.join(","));
        assert_eq!(
            parse_models(&body).unwrap_err(),
            format!("50000 models, at most {MAX_MODELS}")
        );
    }

    /// Discovery over HTTPS behind a token, as a gateway in front of vLLM serves it.
    #[tokio::test]
    async fn models_are_discovered_over_https_with_the_pools_token() {
        use crate::base::tls::test_pki::{Pki, write};
        let pki = Pki::new("discovery");
        let (cert, key) = pki.leaf("127.0.0.1", false);
        let files = crate::base::config::ApiTls {
            cert: write(&pki.dir, "server.pem", &cert),
            key: write(&pki.dir, "server-key.pem", &key),
            client_ca: None,
        };
        let token = "discovery-token-0123";
        let app = crate::serve::api::server::token_guard(
            axum::Router::new().route(
                "/v1/models",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({"object": "list", "data": [{"id": "tiny"}]}))
                }),
            ),
            token.into(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = crate::serve::api::listener::server_config(&files).unwrap();
        tokio::spawn(crate::serve::api::listener::serve(
            listener,
            Some(config),
            app,
            crate::serve::api::listener::API_LIMITS,
            "test",
        ));
        let access = |token_file: Option<std::path::PathBuf>| ScrapeAccess {
            https: true,
            ca: Some(write(&pki.dir, "ca.pem", &pki.ca_pem)),
            identity: None,
            bearer_token_file: token_file,
        };
        let how = Discovery::Models {
            port: addr.port(),
            path: "/v1/models".into(),
        };
        let t = Duration::from_secs(2);
        let with_token = access(Some(write(&pki.dir, "token", token)));
        let client = HttpClient::with_access(&with_token, &AccessNames::POOL).unwrap();
        assert_eq!(
            discover(&client, addr.ip(), &how, t).await.unwrap(),
            vec!["tiny"]
        );
        let client = HttpClient::with_access(&access(None), &AccessNames::POOL).unwrap();
        let err = discover(&client, addr.ip(), &how, t).await.unwrap_err();
        assert!(err.contains("set pool.bearer_token_file"), "{err}");
        let _ = std::fs::remove_dir_all(&pki.dir);
    }
}
