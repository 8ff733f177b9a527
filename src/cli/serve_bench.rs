//! `pocketmoe serve-bench`: load on any OpenAI-compatible server (pocketmoe-serve, llama-server,
//! vLLM), the same requests for each: aggregate generation tok/s and time to first token at
//! several concurrency levels.
//!
//! Each level runs `concurrency` client threads; each thread sends `--requests` streaming
//! `/v1/completions` requests one after another. Every prompt starts with its own request number,
//! so no server can answer one from another's prompt cache. The client is plain HTTP/1.1 over a
//! TCP socket (chunked or length-delimited SSE), so it runs on a machine with nothing installed.
use anyhow::{bail, Context as _, Result};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct ServeBenchArgs {
    /// The server's base URL (http only), e.g. http://127.0.0.1:8080.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The `model` field of each request (default: the first id /v1/models lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Concurrency levels, comma-separated: this many streams at once.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Requests each stream sends one after another, per level.
    #[arg(long, default_value_t = 3)]
    pub requests: usize,
    /// Completion tokens asked for (`max_tokens`; greedy, temperature 0).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Words of filler text in each prompt (after its request number).
    #[arg(long, default_value_t = 200)]
    pub prompt_words: usize,
    /// Also send llama-server's `ignore_eos: true` (pocketmoe-serve refuses unknown fields).
    #[arg(long)]
    pub ignore_eos: bool,
    /// `Authorization: Bearer KEY`.
    #[arg(long, env = "POCKETMOE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds one request may take, start to last byte.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Scrape pocketmoe-serve's `/metrics` before and after each level and add the expert
    /// cache's figures over the level: hit rate, share of misses on the CPU, host-to-GPU GB/s.
    #[arg(long)]
    pub metrics: bool,
    /// A label for the table and the JSON (e.g. `pocketmoe 8GiB`).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// One request, as the client saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds from sending the request to the first completion text.
    pub ttft_s: f64,
    /// Seconds from sending to the end of the stream.
    pub total_s: f64,
    /// Completion tokens (the server's usage figure; else one per text chunk).
    pub tokens: usize,
    pub prompt_tokens: Option<usize>,
}

/// One concurrency level.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    pub concurrency: usize,
    pub requests: usize,
    pub tokens: usize,
    pub wall_s: f64,
    /// Completion tokens of all streams over the level's wall time.
    pub tok_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Median over requests of (tokens − 1) / (total − ttft): one stream's decode speed.
    pub stream_tok_s_p50: f64,
    pub prompt_tokens: Option<usize>,
    /// The expert cache over the level (with `--metrics`, from a server that has one).
    pub cache: Option<CacheDelta>,
}

/// pocketmoe-serve's expert counters over one level.
#[derive(Debug, Clone, Serialize)]
pub struct CacheDelta {
    pub hits: f64,
    pub misses: f64,
    pub cpu: f64,
    pub h2d_bytes: f64,
    /// hits / (hits + misses).
    pub hit_rate: f64,
    /// CPU-computed misses / misses.
    pub cpu_share: f64,
    pub h2d_gb_s: f64,
}

const COUNTERS: [&str; 4] = [
    "pocketmoe_expert_hits_total",
    "pocketmoe_expert_misses_total",
    "pocketmoe_expert_cpu_total",
    "pocketmoe_expert_h2d_bytes_total",
];

/// The expert counters of a Prometheus text page (None when the server has none).
pub fn expert_counters(page: &str) -> Option<[f64; 4]> {
    let mut out = [f64::NAN; 4];
    for line in page.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(value)) = (it.next(), it.next()) else {
            continue;
        };
        if let Some(i) = COUNTERS.iter().position(|c| *c == name) {
            out[i] = value.parse().ok()?;
        }
    }
    out.iter().all(|x| x.is_finite()).then_some(out)
}

fn scrape(args: &ServeBenchArgs) -> Result<Option<[f64; 4]>> {
    let mut r = request(args, "GET", "/metrics", None)?;
    let mut page = String::new();
    r.body.read_to_string(&mut page)?;
    if r.status != 200 {
        bail!(
            "GET /metrics on {}: HTTP {}: {page:.200}",
            args.url,
            r.status
        );
    }
    Ok(expert_counters(&page))
}

/// `http://host:port[/prefix]` → (`host:port`, `/prefix` or empty).
pub fn parse_url(url: &str) -> Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--url {url:?}: only http:// URLs are supported"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        bail!("--url {url:?}: no host");
    }
    let authority = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let path = path.trim_matches('/');
    let prefix = if path.is_empty() {
        String::new()
    } else {
        format!("/{path}")
    };
    Ok((authority, prefix))
}

/// The request prompt: its number first (defeats prefix caches), then filler words.
pub fn prompt(n: usize, words: usize) -> String {
    const FILLER: &[&str] = &[
        "the",
        "river",
        "carried",
        "old",
        "boats",
        "past",
        "quiet",
        "towns",
        "where",
        "people",
        "told",
        "stories",
        "about",
        "mountains",
        "and",
        "weather",
        "every",
        "evening",
    ];
    let mut s = format!("Request {n}:");
    for i in 0..words {
        s.push(' ');
        s.push_str(FILLER[(i * 7 + n) % FILLER.len()]);
    }
    s
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Box<dyn BufRead>,
}

fn request(
    args: &ServeBenchArgs,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Response> {
    let (authority, prefix) = parse_url(&args.url)?;
    let stream = TcpStream::connect(&authority)
        .with_context(|| format!("connecting to {} ({authority})", args.url))?;
    stream.set_read_timeout(Some(Duration::from_secs(args.timeout)))?;
    let mut w = stream.try_clone()?;
    let mut head = format!(
        "{method} {prefix}{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\
         Accept: text/event-stream, application/json\r\n"
    );
    if let Some(k) = &args.api_key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    if let Some(b) = body {
        w.write_all(b.as_bytes())?;
    }
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line)
        .with_context(|| format!("reading the response to {method} {path} from {}", args.url))?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("{method} {path}: not an HTTP status line: {line:?}"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body: Box<dyn BufRead> = if chunked {
        Box::new(BufReader::new(Chunked {
            inner: r,
            left: 0,
            done: false,
        }))
    } else {
        Box::new(r)
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// A `Transfer-Encoding: chunked` body as a plain byte stream.
pub struct Chunked<R> {
    pub inner: R,
    pub left: usize,
    pub done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            if line.trim().is_empty() {
                // The CRLF that ends the previous chunk's data.
                line.clear();
                self.inner.read_line(&mut line)?;
            }
            let size = line.trim().split(';').next().unwrap_or("");
            self.left = usize::from_str_radix(size, 16)
                .map_err(|_| bad(format!("bad chunk size line {line:?}")))?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let n = buf.len().min(self.left);
        let got = self.inner.read(&mut buf[..n])?;
        if got == 0 {
            return Err(bad("connection closed inside a chunk".into()));
        }
        self.left -= got;
        Ok(got)
    }
}

fn first_model(args: &ServeBenchArgs) -> Result<String> {
    let mut r = request(args, "GET", "/v1/models", None)?;
    let mut body = String::new();
    r.body.read_to_string(&mut body)?;
    if r.status != 200 {
        bail!("GET /v1/models on {}: HTTP {}: {body}", args.url, r.status);
    }
    let v: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("GET /v1/models on {}: not JSON: {body:.200}", args.url))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("GET /v1/models on {}: no model id in {body:.200}", args.url))
}

/// One streaming completion; the SSE events are read as they arrive.
pub fn one(args: &ServeBenchArgs, model: &str, n: usize) -> Result<Sample> {
    let mut body = serde_json::json!({
        "model": model,
        "prompt": prompt(n, args.prompt_words),
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if args.ignore_eos {
        body["ignore_eos"] = true.into();
    }
    let start = Instant::now();
    let mut r = request(args, "POST", "/v1/completions", Some(&body.to_string()))?;
    if r.status != 200 {
        let mut text = String::new();
        let _ = r.body.read_to_string(&mut text);
        bail!(
            "POST /v1/completions on {}: HTTP {}: {text:.500}",
            args.url,
            r.status
        );
    }
    let sse = r
        .headers
        .iter()
        .any(|(k, v)| k == "content-type" && v.contains("event-stream"));
    if !sse {
        bail!(
            "POST /v1/completions on {}: the reply is not an event stream",
            args.url
        );
    }
    let (mut ttft, mut chunks, mut usage, mut prompt_tokens) = (None, 0usize, None, None);
    let mut line = String::new();
    loop {
        line.clear();
        if r.body.read_line(&mut line)? == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data)
            .with_context(|| format!("an SSE event that is not JSON: {data:.200}"))?;
        if let Some(e) = v.get("error") {
            bail!("the stream ended in an error: {e}");
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        if !text.is_empty() {
            chunks += 1;
            ttft.get_or_insert_with(|| start.elapsed());
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = u["completion_tokens"].as_u64().map(|x| x as usize);
            prompt_tokens = u["prompt_tokens"].as_u64().map(|x| x as usize);
        }
    }
    let total = start.elapsed();
    let ttft = ttft.with_context(|| format!("request {n}: the stream had no completion text"))?;
    Ok(Sample {
        ttft_s: ttft.as_secs_f64(),
        total_s: total.as_secs_f64(),
        tokens: usage.unwrap_or(chunks),
        prompt_tokens,
    })
}

/// The q-quantile (0..=1) of `xs` by nearest rank.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

pub fn level(args: &ServeBenchArgs, model: &str, concurrency: usize, base: usize) -> Result<Level> {
    let before = if args.metrics { scrape(args)? } else { None };
    let start = Instant::now();
    let samples: Vec<Sample> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..concurrency)
            .map(|c| {
                s.spawn(move || {
                    (0..args.requests)
                        .map(|i| one(args, model, base + c * args.requests + i))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
            })
            .collect::<Result<Vec<Vec<_>>>>()
            .map(|v| v.into_iter().flatten().collect())
    })?;
    let wall = start.elapsed().as_secs_f64();
    let after = if before.is_some() {
        scrape(args)?
    } else {
        None
    };
    let cache = before.zip(after).map(|(b, a)| {
        let d: Vec<f64> = a.iter().zip(b).map(|(a, b)| a - b).collect();
        CacheDelta {
            hits: d[0],
            misses: d[1],
            cpu: d[2],
            h2d_bytes: d[3],
            hit_rate: d[0] / (d[0] + d[1]).max(1.0),
            cpu_share: d[2] / d[1].max(1.0),
            h2d_gb_s: d[3] / wall / 1e9,
        }
    });
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let ttft: Vec<f64> = samples.iter().map(|s| s.ttft_s * 1e3).collect();
    let per_stream: Vec<f64> = samples
        .iter()
        .filter(|s| s.tokens > 1 && s.total_s > s.ttft_s)
        .map(|s| (s.tokens - 1) as f64 / (s.total_s - s.ttft_s))
        .collect();
    Ok(Level {
        concurrency,
        requests: samples.len(),
        tokens,
        wall_s: wall,
        tok_s: tokens as f64 / wall,
        ttft_p50_ms: quantile(&ttft, 0.5),
        ttft_p99_ms: quantile(&ttft, 0.99),
        stream_tok_s_p50: quantile(&per_stream, 0.5),
        prompt_tokens: samples.iter().find_map(|s| s.prompt_tokens),
        cache,
    })
}

pub fn run(args: ServeBenchArgs) -> Result<()> {
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("--concurrency: give one or more levels, each at least 1");
    }
    if args.requests == 0 || args.max_tokens == 0 {
        bail!("--requests and --max-tokens must be at least 1");
    }
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&args)?,
    };
    // One request first, not counted: loads caches, compiles kernels, warms CUDA graphs.
    let warmup = one(&args, &model, 1_000_000).context("the warm-up request")?;
    let cache_cols = if args.metrics {
        " cache hit % | CPU share % | H2D GB/s |"
    } else {
        ""
    };
    println!(
        "| {} | streams | requests | tokens | wall s | agg tok/s | TTFT p50 ms | TTFT p99 ms | stream tok/s p50 |{cache_cols}",
        if args.label.is_empty() { "server" } else { &args.label }
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|{}",
        "---:|".repeat(cache_cols.matches('|').count())
    );
    let mut levels = Vec::new();
    let mut base = 0;
    for &c in &args.concurrency {
        let l = level(&args, &model, c, base)?;
        base += c * args.requests;
        let cache = match (&l.cache, args.metrics) {
            (Some(c), _) => format!(
                " {:.1} | {:.2} | {:.1} |",
                c.hit_rate * 100.0,
                c.cpu_share * 100.0,
                c.h2d_gb_s
            ),
            (None, true) => " - | - | - |".to_string(),
            (None, false) => String::new(),
        };
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.1} | {:.0} | {:.0} | {:.1} |{cache}",
            args.url,
            l.concurrency,
            l.requests,
            l.tokens,
            l.wall_s,
            l.tok_s,
            l.ttft_p50_ms,
            l.ttft_p99_ms,
            l.stream_tok_s_p50
        );
        levels.push(l);
    }
    if let Some(p) = &args.json {
        let j = serde_json::json!({
            "label": args.label, "url": args.url, "model": model, "max_tokens": args.max_tokens,
            "prompt_words": args.prompt_words, "requests_per_stream": args.requests,
            "warmup_tokens": warmup.tokens, "levels": levels,
        });
        std::fs::write(p, serde_json::to_string_pretty(&j)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
