//! The network half of `-hf`: the repository listing and file downloads through `hf-hub`'s
//! blocking client (ureq), which writes the Hub cache layout itself (blob by etag, snapshot
//! link, `refs/main`) and resumes a partial blob (`blobs/<etag>.part`).
//!
//! No hang: the listing has a whole-request timeout, and each download runs on its own thread
//! watched from here; when no byte has arrived for the timeout (`POCKETMOE_HUB_TIMEOUT`
//! seconds, 30 by default; connecting included) the download is given up with an error naming
//! the file and the endpoint, and the partial blob is kept for the next try. Progress: one line
//! on stderr per 5% of a file.
use anyhow::{anyhow, bail, Result};
use hf_hub::api::sync::{Api, ApiBuilder};
use hf_hub::api::{Progress, RepoInfo};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Seconds without progress before a Hub request is given up.
fn timeout() -> Duration {
    let secs = std::env::var("POCKETMOE_HUB_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|&s| s > 0.0 && s < 1e6)
        .unwrap_or(30.0);
    Duration::from_secs_f64(secs)
}

/// One repository on one endpoint, with its cache.
pub(super) struct Hub {
    api: Api,
    repo: String,
    endpoint: String,
    timeout: Duration,
}

impl Hub {
    pub(super) fn new(cache: &Path, repo: &str, token: Option<String>) -> Result<Self> {
        let endpoint = super::endpoint();
        let api = ApiBuilder::new()
            .with_endpoint(endpoint.clone())
            .with_cache_dir(cache.to_path_buf())
            // llama.cpp sends --hf-token / HF_TOKEN only (not the hf CLI's token file).
            .with_token(token.filter(|t| !t.is_empty()))
            .with_progress(false)
            .with_user_agent("pocketmoe", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| anyhow!("-hf {repo}: Hub client: {e}"))?;
        Ok(Hub {
            api,
            repo: repo.to_string(),
            endpoint,
            timeout: timeout(),
        })
    }

    /// The repository's file paths (`/api/models/REPO/revision/main`).
    pub(super) fn list(&self) -> Result<Vec<String>> {
        let (repo, ep) = (&self.repo, &self.endpoint);
        let req = self
            .api
            .model(repo.clone())
            .info_request()
            .timeout(self.timeout);
        let url = req.url().to_string();
        match req.call() {
            Ok(resp) => {
                let info: RepoInfo = resp.into_json().map_err(|e| {
                    anyhow!("-hf {repo}: the listing from {url} is not the Hub's: {e}")
                })?;
                Ok(info.siblings.into_iter().map(|s| s.rfilename).collect())
            }
            Err(e) => match e.into_response() {
                Some(r) if matches!(r.status(), 401 | 403) => bail!(
                    "-hf {repo}: {ep} answered {} for the repository: a gated or private \
                     repository needs an access token (--hf-token or HF_TOKEN) that may read it",
                    r.status()
                ),
                Some(r) if r.status() == 404 => {
                    bail!("-hf {repo}: repository {repo} not found on {ep} (404)")
                }
                Some(r) => {
                    let code = r.status();
                    let body: String = r
                        .into_string()
                        .unwrap_or_default()
                        .chars()
                        .take(200)
                        .collect();
                    bail!("-hf {repo}: {ep} answered {code} for {url}: {body}")
                }
                None => bail!(
                    "-hf {repo}: cannot reach the Hugging Face Hub at {ep} (within {} s): no \
                     network? (a model already in the cache is used without it; see --offline)",
                    self.timeout.as_secs_f64()
                ),
            },
        }
    }

    /// Downloads `file` into the cache (progress lines on stderr); returns its snapshot path.
    pub(super) fn download(&self, file: &str) -> Result<PathBuf> {
        let start = Instant::now();
        let seen = Arc::new(AtomicU64::new(0));
        let progress = Lines {
            file: file.to_string(),
            start,
            seen: seen.clone(),
            total: 0,
            done: 0,
            next_pct: 5,
            announced: false,
        };
        let (tx, rx) = mpsc::channel();
        let repo = self.api.model(self.repo.clone());
        let name = file.to_string();
        std::thread::spawn(move || {
            let _ = tx.send(repo.download_with_progress(&name, progress));
        });
        let (repo, ep) = (&self.repo, &self.endpoint);
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Ok(path)) => return Ok(path),
                Ok(Err(e)) => bail!("-hf {repo}: downloading {file} from {ep} failed: {e}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("-hf {repo}: downloading {file} from {ep}: the download thread ended")
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let last = Duration::from_millis(seen.load(Ordering::Relaxed));
                    if start.elapsed().saturating_sub(last) > self.timeout {
                        bail!(
                            "-hf {repo}: downloading {file} from {ep} stalled: nothing received \
                             for {} s (a partial download is kept and resumed next time)",
                            self.timeout.as_secs_f64()
                        );
                    }
                }
            }
        }
    }
}

/// hf-hub's progress callback: a line per 5% on stderr, and the time of the last byte (ms
/// since `start`) for the stall watch.
struct Lines {
    file: String,
    start: Instant,
    seen: Arc<AtomicU64>,
    total: usize,
    done: usize,
    next_pct: usize,
    announced: bool,
}

impl Lines {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.seen.store(ms, Ordering::Relaxed);
    }
}

const MIB: f64 = 1024.0 * 1024.0;

impl Progress for Lines {
    fn init(&mut self, size: usize, _filename: &str) {
        // hf-hub calls this again when it (re)starts the transfer, then reports the resumed
        // bytes through `update`.
        self.total = size;
        self.done = 0;
        self.touch();
        if !self.announced {
            self.announced = true;
            eprintln!("download: {} ({:.1} MiB)", self.file, size as f64 / MIB);
        }
    }

    fn update(&mut self, size: usize) {
        self.done += size;
        self.touch();
        if self.total == 0 {
            return;
        }
        let pct = (self.done.min(self.total) * 100) / self.total;
        if pct >= self.next_pct {
            eprintln!(
                "download: {} {pct:>3}% ({:.1} of {:.1} MiB)",
                self.file,
                self.done as f64 / MIB,
                self.total as f64 / MIB
            );
            self.next_pct = (pct / 5 + 1) * 5;
        }
    }

    fn finish(&mut self) {
        self.touch();
    }
}
