//! Connections: the layer between the listening socket and hyper. axum's `serve` has no
//! timeouts, no connection cap, and hyper answers a malformed request head with an empty body;
//! this layer adds:
//!
//! - A cap on open connections (`--max-connections`). At the cap, a new connection takes the
//!   place of the connection that has been idle longest (no request in the application: idle
//!   keep-alive, or still sending its head); when every connection has a request in progress,
//!   the new one gets a 503 in OpenAI's error shape and is closed.
//! - A header timeout (`--header-timeout`): a connection with no request in progress must
//!   deliver a whole request head within that time of opening or of the end of its previous
//!   response, whatever the pace of its bytes; otherwise it is closed — with a 408 when part of a
//!   head had come. (The body timeout is the handlers': `super::read_body`.)
//! - Request heads are checked here before hyper sees them (size, request line, header syntax,
//!   `Content-Length` / `Transfer-Encoding`, as hyper checks them), so a malformed one gets a
//!   400 / 414 / 431 in OpenAI's shape. Bodies are framed (Content-Length, chunked) only to find
//!   the next head; anything unexpected in a chunked body hands the rest of the connection to
//!   hyper unchecked.
//! - [`Conns::kill_all`]: every open connection fails its reads and writes, so hyper drops it
//!   (the end of the shutdown grace period).
//!
//! Invariants: an answer of our own is written only while hyper has nothing in flight on the
//! connection (no request in the application, its last write flushed), then the connection
//! shuts down its write side and is drained for [`LINGER`] so the client reads the answer
//! instead of a reset; the bytes buffered here are bounded by [`MAX_HEAD`] plus one read.
use super::error::ApiError;
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head (request line and header lines) accepted.
pub const MAX_HEAD: usize = 64 << 10;
/// Most header lines in a request head (hyper's limit).
const MAX_HEADERS: usize = 100;
/// Longest request target (hyper's limit).
const MAX_URI: usize = u16::MAX as usize - 1;
/// How long a connection answered by this layer is still read from (and the bytes dropped)
/// before it closes.
pub const LINGER: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 16 << 10;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnCounters {
    pub accepted: AtomicU64,
    /// Answered 503 at the cap.
    pub rejected: AtomicU64,
    /// Closed at the cap to make room for a new connection.
    pub evicted: AtomicU64,
    /// Closed by the header timeout.
    pub timed_out: AtomicU64,
    /// Request heads answered 400 / 414 / 431 here.
    pub malformed: AtomicU64,
}

/// The open connections.
pub struct Conns {
    limits: Limits,
    open: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
    pub counters: ConnCounters,
}

impl Conns {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits: Limits {
                max_connections: limits.max_connections.max(1),
                ..limits
            },
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            counters: ConnCounters::default(),
        }
    }

    pub fn open(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection: free, or taken from the longest-idle one; `None` when all
    /// have a request in progress.
    fn admit(&self) -> Option<Arc<ConnState>> {
        let mut open = self.lock();
        if open.len() >= self.limits.max_connections {
            let victim = open
                .values()
                .filter(|c| c.idle())
                .min_by_key(|c| c.idle_since())
                .map(|c| c.id)?;
            if let Some(c) = open.remove(&victim) {
                c.kill();
                self.counters.evicted.fetch_add(1, Relaxed);
            }
        }
        let st = Arc::new(ConnState::new(self.next_id.fetch_add(1, Relaxed)));
        open.insert(st.id, st.clone());
        self.counters.accepted.fetch_add(1, Relaxed);
        Some(st)
    }

    /// Fails every open connection's reads and writes; returns how many there were.
    pub fn kill_all(&self) -> usize {
        let open = self.lock();
        open.values().for_each(|c| c.kill());
        open.len()
    }
}

const READ: usize = 0;
const WRITE: usize = 1;

/// What the application and the connection's I/O share.
pub struct ConnState {
    id: u64,
    /// Requests in the application (from the handler's start to the end of its response body).
    busy: AtomicUsize,
    /// A request head went to hyper and the application has not started it yet.
    head_ready: AtomicBool,
    /// When the connection last had no request in progress (opening, or a response's end).
    idle_since: Mutex<Instant>,
    killed: AtomicBool,
    wakers: Mutex<[Option<Waker>; 2]>,
}

impl ConnState {
    fn new(id: u64) -> Self {
        Self {
            id,
            busy: AtomicUsize::new(0),
            head_ready: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
            killed: AtomicBool::new(false),
            wakers: Mutex::new([None, None]),
        }
    }

    fn idle_since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No request in progress or about to start.
    fn idle(&self) -> bool {
        self.busy.load(Relaxed) == 0 && !self.head_ready.load(Relaxed) && !self.killed()
    }

    fn killed(&self) -> bool {
        self.killed.load(Relaxed)
    }

    fn kill(&self) {
        self.killed.store(true, Relaxed);
        self.wake(READ);
        self.wake(WRITE);
    }

    fn register(&self, side: usize, w: &Waker) {
        let mut ws = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        if !ws[side].as_ref().is_some_and(|old| old.will_wake(w)) {
            ws[side] = Some(w.clone());
        }
    }

    fn wake(&self, side: usize) {
        let w = self.wakers.lock().unwrap_or_else(|p| p.into_inner())[side].take();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// The connection a request came on (axum's `ConnectInfo`).
#[derive(Clone)]
pub struct ConnHandle(Arc<ConnState>);

impl ConnHandle {
    /// A request has reached the application; it is in progress until the guard drops (keep
    /// it with the response body).
    pub fn begin(&self) -> Busy {
        self.0.busy.fetch_add(1, Relaxed);
        self.0.head_ready.store(false, Relaxed);
        Busy(self.0.clone())
    }
}

/// A request in progress on a connection; see [`ConnHandle::begin`].
pub struct Busy(Arc<ConnState>);

impl Busy {
    /// Nothing: lets a closure own the guard.
    pub fn hold(&self) {}
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Relaxed);
        // The header timeout starts now: make the reader look.
        self.0.wake(READ);
    }
}

impl Connected<IncomingStream<'_, Gate>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, Gate>) -> Self {
        ConnHandle(stream.io().st.clone())
    }
}

/// The listener: a TCP listener behind the connection cap.
pub struct Gate {
    listener: TcpListener,
    conns: Arc<Conns>,
}

impl Gate {
    pub fn new(listener: TcpListener, conns: Arc<Conns>) -> Self {
        Self { listener, conns }
    }
}

impl Listener for Gate {
    type Io = GateIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (GateIo, SocketAddr) {
        loop {
            let (tcp, addr) = match self.listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    use io::ErrorKind::*;
                    if !matches!(
                        e.kind(),
                        ConnectionRefused | ConnectionAborted | ConnectionReset
                    ) {
                        // Out of file descriptors and the like: wait for some to close.
                        tracing::error!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            match self.conns.admit() {
                Some(st) => {
                    let io = GateIo::new(tcp, st, self.conns.clone());
                    return (io, addr);
                }
                None => {
                    self.conns.counters.rejected.fetch_add(1, Relaxed);
                    let e = ApiError::TooManyConnections {
                        limit: self.conns.limits.max_connections,
                    };
                    tokio::spawn(answer_and_close(tcp, e.http_bytes()));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Writes `answer`, shuts the write side, drains what the client still sends (for at most
/// [`LINGER`] in all) and closes.
async fn answer_and_close(mut tcp: TcpStream, answer: Vec<u8>) {
    let mut closing = Closing::new(answer);
    let _ = tokio::time::timeout(
        LINGER * 2,
        std::future::poll_fn(|cx| closing.poll(&mut tcp, cx)),
    )
    .await;
}

/// Writing an answer of our own, then lingering.
struct Closing {
    out: Vec<u8>,
    pos: usize,
    phase: Phase,
    linger: Pin<Box<tokio::time::Sleep>>,
}

#[derive(PartialEq)]
enum Phase {
    Write,
    Shutdown,
    Linger,
    Done,
}

impl Closing {
    fn new(out: Vec<u8>) -> Self {
        Self {
            out,
            pos: 0,
            phase: Phase::Write,
            linger: Box::pin(tokio::time::sleep(LINGER)),
        }
    }

    /// Ready once the connection can be closed.
    fn poll(&mut self, tcp: &mut TcpStream, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self.phase {
                Phase::Write => {
                    if self.pos >= self.out.len() {
                        self.phase = Phase::Shutdown;
                        continue;
                    }
                    match Pin::new(&mut *tcp).poll_write(cx, &self.out[self.pos..]) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(n)) if n > 0 => self.pos += n,
                        Poll::Ready(_) => self.phase = Phase::Done,
                    }
                }
                Phase::Shutdown => {
                    if Pin::new(&mut *tcp).poll_shutdown(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let deadline = tokio::time::Instant::now() + LINGER;
                    self.linger.as_mut().reset(deadline);
                    self.phase = Phase::Linger;
                }
                Phase::Linger => {
                    if self.linger.as_mut().poll(cx).is_ready() {
                        self.phase = Phase::Done;
                        continue;
                    }
                    let mut scratch = [0u8; 4096];
                    let mut rb = ReadBuf::new(&mut scratch);
                    match Pin::new(&mut *tcp).poll_read(cx, &mut rb) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(())) if !rb.filled().is_empty() => {}
                        Poll::Ready(_) => self.phase = Phase::Done,
                    }
                }
                Phase::Done => return Poll::Ready(()),
            }
        }
    }
}

/// Where the bytes coming in stand.
enum Frame {
    /// Waiting for (the rest of) a request head.
    Head,
    /// This many body bytes to go.
    Body(u64),
    Chunked(Chunk),
    /// Unframed: everything goes to hyper as is.
    Opaque,
    /// Answering with an error of our own; hyper gets end-of-file after it.
    Closing(Box<Closing>),
}

/// A chunked body's framing (RFC 9112 §7.1).
#[derive(Debug, Clone, Copy)]
enum Chunk {
    Size {
        n: u64,
        digits: u32,
    },
    /// Chunk extensions, skipped to the end of the size line.
    Ext {
        n: u64,
    },
    SizeLf {
        n: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// Trailer lines, then the empty line; `len`: bytes of the current line so far.
    Trailer {
        len: usize,
    },
}

/// The byte stream of one accepted connection, as hyper reads and writes it.
pub struct GateIo {
    tcp: TcpStream,
    st: Arc<ConnState>,
    conns: Arc<Conns>,
    /// Bytes read from the socket and not yet given to hyper; the first `released` of them
    /// may be.
    inbuf: Vec<u8>,
    released: usize,
    /// Head search resumes here.
    scanned: usize,
    frame: Frame,
    eof: bool,
    /// A bad head waits for the connection to be quiet before it is answered.
    deferred: bool,
    /// Hyper wrote since its last flush.
    dirty: bool,
    idle_timer: Pin<Box<tokio::time::Sleep>>,
    armed: Option<Instant>,
}

impl GateIo {
    fn new(tcp: TcpStream, st: Arc<ConnState>, conns: Arc<Conns>) -> Self {
        Self {
            tcp,
            st,
            conns,
            inbuf: Vec::new(),
            released: 0,
            scanned: 0,
            frame: Frame::Head,
            eof: false,
            deferred: false,
            dirty: false,
            idle_timer: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
            armed: None,
        }
    }

    /// Hyper has nothing in flight: no request in the application, its writes flushed.
    fn quiet(&self) -> bool {
        self.st.busy.load(Relaxed) == 0 && !self.dirty
    }

    /// Answers `e` and closes, if the connection is quiet; otherwise waits (`deferred`).
    fn reject(&mut self, e: ApiError) -> bool {
        if !self.quiet() {
            self.deferred = true;
            return false;
        }
        self.deferred = false;
        tracing::debug!("connection {}: {e}", self.st.id);
        self.inbuf.clear();
        self.released = 0;
        self.frame = Frame::Closing(Box::new(Closing::new(e.http_bytes())));
        true
    }

    /// Frames what is buffered: releases bytes to hyper or changes state; false when nothing
    /// can be done without more bytes.
    fn advance(&mut self) -> bool {
        debug_assert_eq!(self.released, 0);
        match &mut self.frame {
            Frame::Head => self.advance_head(),
            Frame::Body(n) => {
                let k = (*n).min(self.inbuf.len() as u64);
                *n -= k;
                self.released = k as usize;
                if *n == 0 {
                    self.frame = Frame::Head;
                    return true;
                }
                k > 0
            }
            Frame::Chunked(c) => {
                let mut c = *c;
                let mut i = 0;
                let mut opaque = false;
                let mut done = false;
                while i < self.inbuf.len() && !done {
                    let b = self.inbuf[i];
                    c = match c {
                        Chunk::Data(n) => {
                            let k = (n as usize).min(self.inbuf.len() - i);
                            i += k;
                            let left = n - k as u64;
                            if left == 0 {
                                Chunk::DataCr
                            } else {
                                Chunk::Data(left)
                            }
                        }
                        _ => {
                            i += 1;
                            match chunk_byte(c, b) {
                                Some(Some(next)) => next,
                                Some(None) => {
                                    done = true;
                                    c
                                }
                                None => {
                                    opaque = true;
                                    break;
                                }
                            }
                        }
                    };
                }
                if opaque {
                    tracing::debug!("connection {}: unexpected chunk framing", self.st.id);
                    self.frame = Frame::Opaque;
                    self.released = self.inbuf.len();
                    return true;
                }
                self.released = i;
                self.frame = if done { Frame::Head } else { Frame::Chunked(c) };
                i > 0 || done
            }
            Frame::Opaque => {
                self.released = self.inbuf.len();
                self.released > 0
            }
            Frame::Closing(_) => false,
        }
    }

    fn advance_head(&mut self) -> bool {
        if self.inbuf.is_empty() {
            return false;
        }
        // Empty lines before a request line are allowed (RFC 9112 §2.2); hyper skips them.
        if self.scanned == 0 {
            let k = self
                .inbuf
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            if k > 0 {
                self.released = k;
                return true;
            }
        }
        let Some(end) = head_end(&self.inbuf, self.scanned) else {
            self.scanned = self.inbuf.len().saturating_sub(3);
            if self.inbuf.len() > MAX_HEAD {
                let e = ApiError::HeadTooLarge(format!(
                    "no end of the headers within {MAX_HEAD} bytes"
                ));
                let answered = self.reject(e);
                if answered {
                    self.conns.counters.malformed.fetch_add(1, Relaxed);
                }
                return answered;
            }
            return false;
        };
        let checked = if end > MAX_HEAD {
            Err(ApiError::HeadTooLarge(format!(
                "{end} bytes, over the limit of {MAX_HEAD}"
            )))
        } else {
            check_head(&self.inbuf[..end])
        };
        match checked {
            Ok(body) => {
                self.deferred = false;
                self.scanned = 0;
                self.released = end;
                self.st.head_ready.store(true, Relaxed);
                self.frame = match body {
                    BodyLen::None => Frame::Head,
                    BodyLen::Len(n) => Frame::Body(n),
                    BodyLen::Chunked => Frame::Chunked(Chunk::Size { n: 0, digits: 0 }),
                };
                true
            }
            Err(e) => {
                let answered = self.reject(e);
                if answered {
                    self.conns.counters.malformed.fetch_add(1, Relaxed);
                }
                answered
            }
        }
    }
}

/// The next chunk-framing state after byte `b`: `Some(None)` at the end of the body,
/// `None` for bytes that do not fit.
fn chunk_byte(c: Chunk, b: u8) -> Option<Option<Chunk>> {
    let size_line_end = |n: u64| {
        if n == 0 {
            Chunk::Trailer { len: 0 }
        } else {
            Chunk::Data(n)
        }
    };
    Some(Some(match c {
        Chunk::Size { n, digits } => match b {
            b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                let d = (b as char).to_digit(16)? as u64;
                if digits >= 15 {
                    return None;
                }
                Chunk::Size {
                    n: n * 16 + d,
                    digits: digits + 1,
                }
            }
            _ if digits == 0 => return None,
            b';' | b' ' | b'\t' => Chunk::Ext { n },
            b'\r' => Chunk::SizeLf { n },
            b'\n' => size_line_end(n),
            _ => return None,
        },
        Chunk::Ext { n } => match b {
            b'\n' => size_line_end(n),
            _ => Chunk::Ext { n },
        },
        Chunk::SizeLf { n } => match b {
            b'\n' => size_line_end(n),
            _ => return None,
        },
        Chunk::DataCr => match b {
            b'\r' => Chunk::DataLf,
            b'\n' => Chunk::Size { n: 0, digits: 0 },
            _ => return None,
        },
        Chunk::DataLf => match b {
            b'\n' => Chunk::Size { n: 0, digits: 0 },
            _ => return None,
        },
        Chunk::Trailer { len } => match b {
            b'\n' if len == 0 => return Some(None),
            b'\n' => Chunk::Trailer { len: 0 },
            b'\r' => Chunk::Trailer { len },
            _ => Chunk::Trailer { len: len + 1 },
        },
        Chunk::Data(_) => unreachable!("data is taken in bulk"),
    }))
}

/// The end of a request head in `buf` (just past its empty line), searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from.max(1)..buf.len()).find_map(|i| {
        (buf[i] == b'\n'
            && (buf[i - 1] == b'\n' || (buf[i - 1] == b'\r' && i >= 2 && buf[i - 2] == b'\n')))
            .then_some(i + 1)
    })
}

#[derive(Debug, PartialEq)]
enum BodyLen {
    None,
    Len(u64),
    Chunked,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Checks a request head (request line and header lines, up to and including its empty line)
/// as hyper would, and says how its body is framed.
fn check_head(head: &[u8]) -> Result<BodyLen, ApiError> {
    let bad = |m: String| Err(ApiError::BadHttp(m));
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let line = lines.next().unwrap_or_default();
    let show = |b: &[u8]| {
        let s = String::from_utf8_lossy(&b[..b.len().min(80)]).into_owned();
        if b.len() > 80 {
            format!("{s:?}…")
        } else {
            format!("{s:?}")
        }
    };
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return bad(format!(
            "the request line {} is not `METHOD TARGET HTTP/1.1`",
            show(line)
        ));
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return bad(format!("the method {} is not a token", show(method)));
    }
    if target.len() > MAX_URI {
        return Err(ApiError::UriTooLong { limit: MAX_URI });
    }
    if target.is_empty()
        || !target.iter().all(|&b| b > b' ' && b != 0x7f)
        || axum::http::Uri::try_from(target).is_err()
    {
        return bad(format!("the request target {} is not a URI", show(target)));
    }
    let http11 = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        _ => {
            return bad(format!(
                "the version {} is not HTTP/1.1 or HTTP/1.0",
                show(version)
            ))
        }
    };
    let mut n_headers = 0;
    let mut length: Option<u64> = None;
    let mut te: Option<bool> = None; // Some(last coding is chunked)
    for line in lines {
        if line.is_empty() {
            break;
        }
        n_headers += 1;
        if n_headers > MAX_HEADERS {
            return Err(ApiError::HeadTooLarge(format!(
                "more than {MAX_HEADERS} header lines"
            )));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return bad(format!("the header line {} has no colon", show(line)));
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return bad(format!("the header name {} is not a token", show(name)));
        }
        if value.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return bad(format!(
                "the value of header {} has control characters",
                show(name)
            ));
        }
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if !http11 {
                return bad("HTTP/1.0 requests cannot have a Transfer-Encoding".into());
            }
            let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
            te = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"content-length") && te.is_none() {
            let n = (!value.is_empty() && value.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
                .flatten()
                .filter(|&n| n < u64::MAX - 1);
            let Some(n) = n else {
                return bad(format!(
                    "Content-Length {} is not a byte count",
                    show(value)
                ));
            };
            if length.is_some_and(|m| m != n) {
                return bad("Content-Length headers disagree".into());
            }
            length = Some(n);
        }
    }
    match (te, length) {
        (Some(true), _) => Ok(BodyLen::Chunked),
        (Some(false), _) => bad("the last Transfer-Encoding must be chunked".into()),
        (None, Some(n)) if n > 0 => Ok(BodyLen::Len(n)),
        (None, _) => Ok(BodyLen::None),
    }
}

impl AsyncRead for GateIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.st.register(READ, cx.waker());
        if this.st.killed() {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        loop {
            if this.released > 0 {
                let n = this.released.min(buf.remaining());
                buf.put_slice(&this.inbuf[..n]);
                this.inbuf.drain(..n);
                this.released -= n;
                this.scanned = this.scanned.saturating_sub(n);
                return Poll::Ready(Ok(()));
            }
            if let Frame::Closing(c) = &mut this.frame {
                return match c.poll(&mut this.tcp, cx) {
                    Poll::Ready(()) => Poll::Ready(Ok(())), // end of file for hyper
                    Poll::Pending => Poll::Pending,
                };
            }
            if this.advance() {
                continue;
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            // The header timeout runs while no request is in progress.
            if this.st.busy.load(Relaxed) == 0 && !this.st.head_ready.load(Relaxed) {
                let deadline = this.st.idle_since() + this.conns.limits.header_timeout;
                if this.armed != Some(deadline) {
                    let at = tokio::time::Instant::from_std(deadline);
                    this.idle_timer.as_mut().reset(at);
                    this.armed = Some(deadline);
                }
                if this.idle_timer.as_mut().poll(cx).is_ready() {
                    this.conns.counters.timed_out.fetch_add(1, Relaxed);
                    let partial = matches!(this.frame, Frame::Head) && !this.inbuf.is_empty();
                    let secs = this.conns.limits.header_timeout.as_secs_f64();
                    if partial
                        && this.reject(ApiError::Timeout(format!(
                            "the request headers did not arrive within {secs} s (--header-timeout): send the whole head at once"
                        )))
                    {
                        continue;
                    }
                    this.st.kill();
                    return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                }
            }
            // A bad or oversized head waits for quiet; read no more meanwhile.
            if matches!(this.frame, Frame::Head) && (this.deferred || this.inbuf.len() > MAX_HEAD) {
                return Poll::Pending;
            }
            let old = this.inbuf.len();
            this.inbuf.resize(old + READ_CHUNK, 0);
            let mut rb = ReadBuf::new(&mut this.inbuf[old..]);
            let got = Pin::new(&mut this.tcp).poll_read(cx, &mut rb);
            let n = rb.filled().len();
            this.inbuf.truncate(old + n);
            match got {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => this.eof |= n == 0,
            }
        }
    }
}

impl GateIo {
    fn wrote(&mut self, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = r {
            self.dirty |= n > 0;
        }
        r
    }
}

impl AsyncWrite for GateIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.st.killed() {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        this.st.register(WRITE, cx.waker());
        let r = Pin::new(&mut this.tcp).poll_write(cx, buf);
        this.wrote(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.st.killed() {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        this.st.register(WRITE, cx.waker());
        let r = Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs);
        this.wrote(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.tcp).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) && this.dirty {
            this.dirty = false;
            if this.deferred {
                this.st.wake(READ);
            }
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl Drop for GateIo {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.st.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let ok = |h: &str| check_head(h.as_bytes()).unwrap();
        let err = |h: &str| check_head(h.as_bytes()).unwrap_err();
        assert_eq!(ok("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), BodyLen::None);
        assert_eq!(
            ok("POST /v1/completions HTTP/1.1\r\nContent-Length: 12\r\ncontent-length: 12\r\n\r\n"),
            BodyLen::Len(12)
        );
        assert_eq!(
            ok("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n"),
            BodyLen::Chunked
        );
        assert_eq!(ok("GET / HTTP/1.0\n\n"), BodyLen::None);
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET /  HTTP/1.1\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "G(T / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            "GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n",
            "GET / HTTP/1.1\r\n folded\r\n\r\n",
        ] {
            assert_eq!(err(bad).status(), 400, "{bad:?}");
        }
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(101));
        assert_eq!(err(&many).status(), 431);
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI));
        assert_eq!(err(&long).status(), 414);
    }

    #[test]
    fn head_ends() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nxyz", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nxyz", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
    }

    #[test]
    fn chunk_framing() {
        let run = |body: &[u8]| {
            let mut c = Chunk::Size { n: 0, digits: 0 };
            let mut i = 0;
            while i < body.len() {
                if let Chunk::Data(n) = c {
                    let k = (n as usize).min(body.len() - i);
                    i += k;
                    c = if n == k as u64 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data(n - k as u64)
                    };
                    continue;
                }
                match chunk_byte(c, body[i])? {
                    Some(next) => c = next,
                    None => return Some(i + 1),
                }
                i += 1;
            }
            Some(usize::MAX)
        };
        let body =
            b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        assert_eq!(run(body), Some(body.len() - 4));
        assert_eq!(run(b"5\r\nhello\r\n"), Some(usize::MAX), "unfinished");
        assert_eq!(run(b"zz\r\n"), None);
        assert_eq!(run(b"5\r\nhelloXX"), None);
    }
}
