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
    #[error("invalid or missing API key: send `Authorization: Bearer <key>` with the key the server was started with")]
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
    #[error("the server is busy: {queued} requests are already waiting (the queue holds {limit}); retry later")]
    QueueFull { queued: usize, limit: usize },
    #[error("the model is still loading ({percent:.0}% done); retry later")]
    Loading { percent: f64 },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("internal error: {0}")]
    Internal(String),
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
            ApiError::Invalid { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::UnknownModel { .. } | ApiError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Loading { .. } | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "authentication_error",
            ApiError::QueueFull { .. } => "rate_limit_error",
            ApiError::Loading { .. } | ApiError::ShuttingDown | ApiError::Internal(_) => {
                "server_error"
            }
            _ => "invalid_request_error",
        }
    }

    fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::Invalid { code, .. } => *code,
            ApiError::Unauthorized => Some("invalid_api_key"),
            ApiError::UnknownModel { .. } => Some("model_not_found"),
            ApiError::QueueFull { .. } => Some("rate_limit_exceeded"),
            _ => None,
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            ApiError::Invalid { param, .. } => param.as_deref(),
            ApiError::UnknownModel { .. } => Some("model"),
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
            },
        }
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
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = (status, axum::Json(self.body())).into_response();
        let h = resp.headers_mut();
        match &self {
            ApiError::Unauthorized => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::QueueFull { .. } | ApiError::Loading { .. } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
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
            queued: 8,
            limit: 8,
        };
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.into_response().headers()["retry-after"], "1");
        let v = serde_json::to_value(ApiError::Unauthorized.body()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
}
