//! The control API: JSON over HTTP/1.1 on a Unix socket (mode 0600, root only: admin) and,
//! when configured, on TCP behind bearer tokens by role ([`Role`]). Every change goes through the same validation as
//! the config file, is applied in one step, and is written back to the config file.

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use tokio::sync::watch;

use crate::base::config::{RawBackend, RawVip};
use crate::state::wire::{ChangeResult, ErrorBody, StopBody, WeightBody};
use crate::state::{ChangeError, Daemon};

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Shared by the handlers.
#[derive(Clone)]
pub struct ApiState {
    pub daemon: Arc<Mutex<Daemon>>,
    /// Set to `Some(detach)` to stop the daemon.
    pub stop: watch::Sender<Option<bool>>,
}

/// An API error: a status and `{"error": ...}`.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        // The one place a refusal becomes a status code (and, in the CLI, an exit code).
        let status = match &e {
            ChangeError::Invalid(_)
            | ChangeError::Config(_)
            | ChangeError::Settings(_)
            | ChangeError::NextHops(_) => StatusCode::BAD_REQUEST,
            ChangeError::NotFound(_) => StatusCode::NOT_FOUND,
            ChangeError::Conflict(_) => StatusCode::CONFLICT,
            ChangeError::Failed(_) | ChangeError::Dataplane(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        ApiError(
            r.status(),
            format!("invalid request body: {}", r.body_text()),
        )
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// Runs `f` on the daemon on a blocking thread (changes resolve neighbours and wait for the
/// kernel).
async fn with_daemon<T: Send + 'static>(
    state: &ApiState,
    f: impl FnOnce(&mut Daemon) -> Result<T, ChangeError> + Send + 'static,
) -> Result<T, ApiError> {
    let daemon = state.daemon.clone();
    tokio::task::spawn_blocking(move || {
        let mut d = daemon
            .lock()
            .map_err(|_| ChangeError::Failed("daemon state poisoned".into()))?;
        f(&mut d)
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(ApiError::from)
}

/// The routes, without authentication.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/stats", get(stats))
        .route("/v1/vips", get(list_vips).post(add_vip))
        .route("/v1/vips/{name}", get(get_vip).delete(del_vip))
        .route("/v1/vips/{name}/table", get(table))
        .route("/v1/vips/{name}/drain", post(drain_vip))
        .route("/v1/vips/{name}/undrain", post(undrain_vip))
        .route("/v1/vips/{name}/scheduler", put(set_scheduler))
        .route(
            "/v1/vips/{name}/backends",
            get(list_backends).post(add_backend),
        )
        .route(
            "/v1/vips/{name}/backends/{addr}",
            axum::routing::delete(del_backend),
        )
        .route("/v1/vips/{name}/backends/{addr}/weight", put(set_weight))
        .route("/v1/vips/{name}/backends/{addr}/drain", post(drain))
        .route("/v1/vips/{name}/backends/{addr}/undrain", post(undrain))
        .route("/v1/tiers/{name}", put(set_tenant))
        .route("/v1/weights", get(weights))
        .route(
            "/v1/backends/{addr}",
            axum::routing::delete(del_backend_everywhere),
        )
        .route("/v1/backends/{addr}/drain", post(drain_everywhere))
        .route("/v1/backends/{addr}/undrain", post(undrain_everywhere))
        .route("/v1/backends/{addr}/report", post(report))
        .route("/v1/reload", post(reload))
        .route("/v1/stop", post(stop))
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such endpoint; see `balancer --help`".into(),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// The TCP listener's tokens, one per role.
#[derive(Clone)]
pub struct Tokens {
    /// Every route.
    pub admin: String,
    /// GET routes (status, stats, weights, tables, VIPs, backends).
    pub read: Option<String>,
    /// `POST /v1/backends/{addr}/report`, for the backend the connection comes from.
    pub push: Option<String>,
}

impl Tokens {
    /// The tokens of the files `api` names (the admin token required); two roles sharing a
    /// token is refused.
    pub fn read(api: &crate::base::config::ApiConfig) -> anyhow::Result<Option<Tokens>> {
        let Some(admin) = &api.token_file else {
            return Ok(None);
        };
        let tokens = Tokens {
            admin: read_token(admin)?,
            read: api.read_token_file.as_deref().map(read_token).transpose()?,
            push: api.push_token_file.as_deref().map(read_token).transpose()?,
        };
        let all = [
            Some(&tokens.admin),
            tokens.read.as_ref(),
            tokens.push.as_ref(),
        ];
        let given: Vec<&String> = all.into_iter().flatten().collect();
        if (1..given.len()).any(|i| given[..i].contains(&given[i])) {
            anyhow::bail!(
                "api.token_file, api.read_token_file and api.push_token_file must hold different tokens"
            );
        }
        Ok(Some(tokens))
    }
}

/// Who a request is, by its bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Read,
    Push,
}

/// The routes behind the role tokens (for the TCP listener).
pub fn router_with_tokens(state: ApiState, tokens: Tokens) -> Router {
    roles_guard(router(state), tokens)
}

/// `routes` behind the admin token alone.
pub fn token_guard(routes: Router, token: String) -> Router {
    roles_guard(
        routes,
        Tokens {
            admin: token,
            read: None,
            push: None,
        },
    )
}

/// `routes` answering 401 to a request without a known `Authorization: Bearer <token>`, and
/// 403 to one its role may not make (see [`allowed`]).
pub fn roles_guard(routes: Router, tokens: Tokens) -> Router {
    let tokens = Arc::new(tokens);
    routes.layer(middleware::from_fn(
        move |headers: HeaderMap, request: axum::extract::Request, next: Next| {
            let tokens = tokens.clone();
            async move {
                let given = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or("")
                    .as_bytes();
                let is =
                    |t: Option<&String>| t.is_some_and(|t| constant_time_eq(given, t.as_bytes()));
                let role = if is(Some(&tokens.admin)) {
                    Role::Admin
                } else if is(tokens.read.as_ref()) {
                    Role::Read
                } else if is(tokens.push.as_ref()) {
                    Role::Push
                } else {
                    return ApiError(
                        StatusCode::UNAUTHORIZED,
                        "missing or wrong bearer token".into(),
                    )
                    .into_response();
                };
                let peer = request
                    .extensions()
                    .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                    .map(|c| c.0.ip().to_canonical());
                if let Err(why) = allowed(role, request.method(), request.uri().path(), peer) {
                    return ApiError(StatusCode::FORBIDDEN, why).into_response();
                }
                next.run(request).await
            }
        },
    ))
}

/// Whether `role` may make a request; why not, if it may not.
pub fn allowed(
    role: Role,
    method: &axum::http::Method,
    path: &str,
    peer: Option<std::net::IpAddr>,
) -> Result<(), String> {
    use axum::http::Method;
    match role {
        Role::Admin => Ok(()),
        Role::Read if method == Method::GET || method == Method::HEAD => Ok(()),
        Role::Read => Err("the read token may only read (GET)".into()),
        Role::Push => {
            let backend = path
                .strip_prefix("/v1/backends/")
                .and_then(|p| p.strip_suffix("/report"))
                .filter(|_| method == Method::POST);
            let Some(backend) = backend else {
                return Err(
                    "the push token may only push reports (POST /v1/backends/{addr}/report)".into(),
                );
            };
            let backend: std::net::IpAddr = backend
                .parse()
                .map_err(|_| format!("{backend:?} is not a backend address"))?;
            match peer {
                Some(p) if p == backend.to_canonical() => Ok(()),
                Some(p) => Err(format!(
                    "the push token reports only for the backend it connects from ({p}), not {backend}"
                )),
                None => Err("the push token needs a TCP connection".into()),
            }
        }
    }
}

/// Compares secrets without an early exit.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a bearer token file: its first line, which must not be empty.
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let text = crate::base::files::read_secret(path)
        .with_context(|| format!("reading the API token file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.len() < 16 {
        anyhow::bail!(
            "the API token in {} must be at least 16 characters",
            path.display()
        );
    }
    Ok(token)
}

/// Fresh flow counts for an answer (see [`Daemon::refresh_flow_counts`]).
async fn refresh_flow_counts(s: &ApiState) -> Result<(), ApiError> {
    let daemon = s.daemon.clone();
    tokio::task::spawn_blocking(move || Daemon::refresh_flow_counts(&daemon))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn status(State(s): State<ApiState>) -> ApiResult<crate::state::wire::Status> {
    refresh_flow_counts(&s).await?;
    with_daemon(&s, |d| {
        d.sample_for_view();
        Ok(d.status())
    })
    .await
    .map(Json)
}

async fn stats(State(s): State<ApiState>) -> ApiResult<crate::state::wire::Stats> {
    refresh_flow_counts(&s).await?;
    with_daemon(&s, |d| {
        d.sample_for_view();
        d.stats()
    })
    .await
    .map(Json)
}

async fn list_vips(State(s): State<ApiState>) -> ApiResult<Vec<RawVip>> {
    with_daemon(&s, |d| {
        Ok(d.config.vips.iter().map(|v| v.to_raw()).collect())
    })
    .await
    .map(Json)
}

async fn get_vip(State(s): State<ApiState>, UrlPath(name): UrlPath<String>) -> ApiResult<RawVip> {
    with_daemon(&s, move |d| d.vip_named(&name).map(|v| v.to_raw()))
        .await
        .map(Json)
}

async fn add_vip(
    State(s): State<ApiState>,
    body: Result<Json<RawVip>, JsonRejection>,
) -> ApiResult<ChangeResult> {
    let Json(raw) = body?;
    with_daemon(&s, move |d| {
        crate::base::config::check_files_under(&raw, d.config.api.file_dir.as_deref())
            .map_err(ChangeError::Invalid)?;
        d.add_vip(raw)
    })
    .await
    .map(Json)
}

async fn del_vip(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.remove_vip(&name))
        .await
        .map(Json)
}

async fn table(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
) -> ApiResult<crate::state::wire::Table> {
    with_daemon(&s, move |d| d.table(&name)).await.map(Json)
}

async fn list_backends(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
) -> ApiResult<Vec<RawBackend>> {
    with_daemon(&s, move |d| {
        d.vip_named(&name)
            .map(|v| v.backends.iter().map(|b| b.to_raw()).collect())
    })
    .await
    .map(Json)
}

async fn add_backend(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
    body: Result<Json<RawBackend>, JsonRejection>,
) -> ApiResult<ChangeResult> {
    let Json(raw) = body?;
    with_daemon(&s, move |d| d.add_backend(&name, raw))
        .await
        .map(Json)
}

async fn del_backend(
    State(s): State<ApiState>,
    UrlPath((name, addr)): UrlPath<(String, String)>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.remove_backend(&name, &addr))
        .await
        .map(Json)
}

async fn set_scheduler(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
    body: Result<Json<crate::state::wire::SchedulerBody>, JsonRejection>,
) -> ApiResult<ChangeResult> {
    let Json(body) = body?;
    with_daemon(&s, move |d| d.set_scheduler(&name, body))
        .await
        .map(Json)
}

async fn set_tenant(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
    body: Result<Json<crate::state::wire::TenantBody>, JsonRejection>,
) -> ApiResult<ChangeResult> {
    let Json(body) = body?;
    with_daemon(&s, move |d| d.set_tenant(&name, body))
        .await
        .map(Json)
}

async fn set_weight(
    State(s): State<ApiState>,
    UrlPath((name, addr)): UrlPath<(String, String)>,
    body: Result<Json<WeightBody>, JsonRejection>,
) -> ApiResult<ChangeResult> {
    let Json(WeightBody { weight }) = body?;
    with_daemon(&s, move |d| d.set_backend_weight(&name, &addr, weight))
        .await
        .map(Json)
}

async fn drain(
    State(s): State<ApiState>,
    UrlPath((name, addr)): UrlPath<(String, String)>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.drain_backend(&name, &addr, true))
        .await
        .map(Json)
}

async fn drain_everywhere(
    State(s): State<ApiState>,
    UrlPath(addr): UrlPath<String>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.drain_backend_everywhere(&addr, true))
        .await
        .map(Json)
}

async fn undrain_everywhere(
    State(s): State<ApiState>,
    UrlPath(addr): UrlPath<String>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.drain_backend_everywhere(&addr, false))
        .await
        .map(Json)
}

async fn del_backend_everywhere(
    State(s): State<ApiState>,
    UrlPath(addr): UrlPath<String>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.remove_backend_everywhere(&addr))
        .await
        .map(Json)
}

async fn undrain(
    State(s): State<ApiState>,
    UrlPath((name, addr)): UrlPath<(String, String)>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.drain_backend(&name, &addr, false))
        .await
        .map(Json)
}

/// Withdraws a VIP's BGP announcement (traffic already routed here is still forwarded).
async fn drain_vip(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.drain_vip(&name, true))
        .await
        .map(Json)
}

async fn undrain_vip(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
) -> ApiResult<ChangeResult> {
    with_daemon(&s, move |d| d.drain_vip(&name, false))
        .await
        .map(Json)
}

async fn weights(State(s): State<ApiState>) -> ApiResult<Vec<crate::state::wire::VipWeights>> {
    refresh_flow_counts(&s).await?;
    with_daemon(&s, |d| Ok(d.weights())).await.map(Json)
}

async fn report(
    State(s): State<ApiState>,
    UrlPath(addr): UrlPath<String>,
    body: Result<Json<crate::steering::telemetry::signals::Signals>, JsonRejection>,
) -> ApiResult<ChangeResult> {
    let Json(signals) = body?;
    with_daemon(&s, move |d| d.push_report(&addr, signals))
        .await
        .map(Json)
}

async fn reload(State(s): State<ApiState>) -> ApiResult<ChangeResult> {
    with_daemon(&s, |d| d.reload("api")).await.map(Json)
}

async fn stop(
    State(s): State<ApiState>,
    body: Result<Json<StopBody>, JsonRejection>,
) -> ApiResult<ChangeResult> {
    let Json(StopBody { detach }) = body?;
    let _ = s.stop.send(Some(detach));
    Ok(Json(ChangeResult {
        message: if detach {
            "stopping; the program will be detached and the pinned state removed".into()
        } else {
            "stopping; the program keeps forwarding from its pinned state".into()
        },
        ..ChangeResult::default()
    }))
}
