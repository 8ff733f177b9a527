//! The server's errors, and their one mapping to HTTP: a status and OpenAI's error body
//! `{"error": {"message", "type", "param", "code"}}` (the shape the `openai` clients parse into
//! `APIStatusError`s). Every message says what to change in the request.
//!
//! Reference: TGI `router/src/server.rs` (`impl From<InferError> for (StatusCode, Json<ErrorResponse>)`)
//! and OpenAI's error codes (`context_length_exceeded`, `model_not_found`, `invalid_api_key`).
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something out of range.
    #[error("{msg}")]
    Invalid {
        msg: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    #[error("invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`) with the key the server was started with")]
    Unauthorized,
    #[error("the model `{asked}` does not exist: this server serves `{served}`")]
    UnknownModel { asked: String, served: String },
    #[error("no route for {method} {path}")]
    NoRoute { method: String, path: String },
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("the request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("unsupported content type {0:?}: send `Content-Type: application/json`")]
    MediaType(String),
    #[error("the server is busy: all {parallel} slots are taken and {queued} requests are waiting (the queue holds {limit}); retry later")]
    QueueFull {
        parallel: usize,
        queued: usize,
        limit: usize,
    },
    /// A request head hyper would refuse (answered by `conn`, before hyper sees it).
    #[error("malformed HTTP request: {0}")]
    BadHttp(String),
    #[error("the request headers are too large: {0}")]
    HeadTooLarge(String),
    #[error("the request target is longer than {limit} bytes")]
    UriTooLong { limit: usize },
    /// The headers or the body did not arrive in time (`--header-timeout`, `--body-timeout`).
    #[error("{0}")]
    Timeout(String),
    #[error("the server has {limit} connections open (--max-connections), each with a request in progress; retry later")]
    TooManyConnections { limit: usize },
    #[error("the model is still loading ({percent:.0}% done); retry later")]
    Loading { percent: f64 },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("internal error: {0}")]
    Internal(String),
    /// A feature this server was not started with (llama-server's `ERROR_TYPE_NOT_SUPPORTED`:
    /// 501, `not_supported_error`), e.g. embeddings without `--embedding`.
    #[error("{0}")]
    NotSupported(String),
    /// The prompt does not fit the context (llama-server's `exceed_context_size_error`, with
    /// its `n_prompt_tokens` and `n_ctx`).
    #[error("the request exceeds the available context size, try increasing it: the prompt is {n_prompt_tokens} tokens and the context of a request holds {n_ctx} (prompt and completion together): shorten the prompt, or restart the server with a larger -c (the whole cache) or --ctx (per request)")]
    ContextExceeded {
        n_prompt_tokens: usize,
        n_ctx: usize,
        param: &'static str,
    },
}

impl ApiError {
    /// A 400 naming the offending field.
    pub fn invalid(param: &str, msg: impl Into<String>) -> Self {
        ApiError::Invalid {
            msg: msg.into(),
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// A 400 about the request as a whole.
    pub fn bad(msg: impl Into<String>) -> Self {
        ApiError::Invalid {
            msg: msg.into(),
            param: None,
            code: None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid { .. } | ApiError::ContextExceeded { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::UnknownModel { .. } | ApiError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::BadHttp(_) => StatusCode::BAD_REQUEST,
            ApiError::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Loading { .. }
            | ApiError::ShuttingDown
            | ApiError::TooManyConnections { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::NotSupported(_) => StatusCode::NOT_IMPLEMENTED,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "authentication_error",
            ApiError::QueueFull { .. } => "rate_limit_error",
            ApiError::ContextExceeded { .. } => "exceed_context_size_error",
            ApiError::NotSupported(_) => "not_supported_error",
            ApiError::Loading { .. }
            | ApiError::ShuttingDown
            | ApiError::TooManyConnections { .. }
            | ApiError::Internal(_) => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::Invalid { code, .. } => *code,
            ApiError::Unauthorized => Some("invalid_api_key"),
            ApiError::UnknownModel { .. } => Some("model_not_found"),
            ApiError::ContextExceeded { .. } => Some("context_length_exceeded"),
            ApiError::QueueFull { .. } => Some("rate_limit_exceeded"),
            ApiError::Timeout(_) => Some("request_timeout"),
            _ => None,
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            ApiError::Invalid { param, .. } => param.as_deref(),
            ApiError::UnknownModel { .. } => Some("model"),
            ApiError::ContextExceeded { param, .. } => Some(param),
            _ => None,
        }
    }

    /// The OpenAI error body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: self.kind(),
                param: self.param().map(str::to_string),
                code: self.code(),
                n_prompt_tokens: match self {
                    ApiError::ContextExceeded {
                        n_prompt_tokens, ..
                    } => Some(*n_prompt_tokens),
                    _ => None,
                },
                n_ctx: match self {
                    ApiError::ContextExceeded { n_ctx, .. } => Some(*n_ctx),
                    _ => None,
                },
            },
        }
    }

    /// Whether the connection must close after this answer (the rest of the request cannot be
    /// trusted or did not come).
    fn closes(&self) -> bool {
        matches!(
            self,
            ApiError::BadHttp(_)
                | ApiError::HeadTooLarge(_)
                | ApiError::UriTooLong { .. }
                | ApiError::Timeout(_)
                | ApiError::TooManyConnections { .. }
        )
    }

    /// Whether the answer carries `Retry-After: 1`.
    fn retry(&self) -> bool {
        matches!(
            self,
            ApiError::QueueFull { .. }
                | ApiError::Loading { .. }
                | ApiError::TooManyConnections { .. }
        )
    }

    /// The whole HTTP/1.1 response, for answers written below hyper (`conn`): status line,
    /// headers (`Connection: close`) and the JSON body.
    pub fn http_bytes(&self) -> Vec<u8> {
        let status = self.status();
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        );
        if self.retry() {
            out.push_str("retry-after: 1\r\n");
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        out.extend_from_slice(&body);
        out
    }
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_prompt_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_ctx: Option<usize>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = (status, axum::Json(self.body())).into_response();
        let h = resp.headers_mut();
        if let ApiError::Unauthorized = &self {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.retry() {
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.closes() {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_and_status() {
        let e = ApiError::invalid("temperature", "temperature = -1 is out of range (>= 0)");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let v = serde_json::to_value(e.body()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert!(v["error"]["code"].is_null());
        let e = ApiError::QueueFull {
            parallel: 4,
            queued: 8,
            limit: 8,
        };
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.into_response().headers()["retry-after"], "1");
        let v = serde_json::to_value(ApiError::Unauthorized.body()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        let raw = ApiError::HeadTooLarge("over 65536 bytes".into()).http_bytes();
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}
