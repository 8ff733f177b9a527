//! The built-in chat page (`GET /`, `/app.js`, `/app.css`): hand-written static files compiled
//! into the binary, no build step. The page streams `/v1/chat/completions`, folds the reasoning,
//! shows the model and live tok/s, and polls `/metrics` for the expert cache's hit rate and PCIe
//! traffic. The files themselves are served without the API key (they hold nothing secret, as
//! llama-server's page); the page sends the key the user enters with its API calls.
//! `--no-webui` leaves these routes out (they answer 404 like any unknown path).
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");

/// The page's paths: open without the API key.
pub(super) const PATHS: [&str; 3] = ["/", "/app.js", "/app.css"];

/// Scripts, styles and requests from this origin only; no framing.
const CSP: &str = "default-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

fn file(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
        ],
        body,
    )
        .into_response()
}

/// `r` with the page's routes.
pub(super) fn routes<S: Clone + Send + Sync + 'static>(r: Router<S>) -> Router<S> {
    r.route(
        "/",
        get(|| async { file(INDEX, "text/html; charset=utf-8") }),
    )
    .route(
        "/app.js",
        get(|| async { file(SCRIPT, "text/javascript; charset=utf-8") }),
    )
    .route(
        "/app.css",
        get(|| async { file(STYLE, "text/css; charset=utf-8") }),
    )
}
