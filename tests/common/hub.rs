//! A local stand-in for the Hugging Face Hub's API, enough for `-hf`: the repository listing
//! (`GET /api/models/USER/NAME/revision/main`: `sha`, `siblings[].rfilename`) and file downloads
//! (`GET /USER/NAME/resolve/main/PATH`, with `Range`, answering `ETag`, `X-Repo-Commit` and
//! `Content-Range` as the Hub does). Each request's path is logged; a repository may need a
//! token (401 without it); `stall` makes a download send half the file and then nothing.
#![allow(dead_code)]
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Clone)]
pub struct File {
    pub path: String,
    pub data: Arc<Vec<u8>>,
    /// The blob name the Hub gives it (its sha256 for LFS files; any hex here).
    pub etag: String,
}

#[derive(Clone, Default)]
pub struct Repo {
    pub id: String,
    pub files: Vec<File>,
    /// `Authorization: Bearer TOKEN` required.
    pub token: Option<String>,
}

pub struct MockHub {
    pub url: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl MockHub {
    /// Paths requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

pub fn file(path: &str, data: Arc<Vec<u8>>, n: u32) -> File {
    File {
        path: path.into(),
        data,
        etag: format!("{n:064x}"),
    }
}

pub fn start(repos: Vec<Repo>, stall: bool) -> MockHub {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let (repos, log2) = (Arc::new(repos), log.clone());
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let (repos, log) = (repos.clone(), log2.clone());
            std::thread::spawn(move || serve(s, &repos, &log, stall));
        }
    });
    MockHub { url, log }
}

fn serve(mut s: TcpStream, repos: &[Repo], log: &Mutex<Vec<String>>, stall: bool) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "range" => range = Some(v.trim().to_string()),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    log.lock().unwrap().push(path.clone());
    let reply = |s: &mut TcpStream, code: &str, headers: &str, body: &[u8]| {
        let head = format!(
            "HTTP/1.1 {code}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body));
    };
    let json = "Content-Type: application/json\r\n";
    let not_found = |s: &mut TcpStream| {
        reply(
            s,
            "404 Not Found",
            json,
            br#"{"error":"Repository not found"}"#,
        )
    };
    let find = |p: &str| repos.iter().find(|r| p.starts_with(&format!("{}/", r.id)));
    let authorized = |r: &Repo| match &r.token {
        None => true,
        Some(t) => auth.as_deref() == Some(&format!("Bearer {t}")),
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some(repo) = find(rest).filter(|r| rest == format!("{}/revision/main", r.id)) else {
            return not_found(&mut s);
        };
        if !authorized(repo) {
            return reply(
                &mut s,
                "401 Unauthorized",
                json,
                br#"{"error":"Access restricted"}"#,
            );
        }
        let siblings: Vec<_> = repo
            .files
            .iter()
            .map(|f| serde_json::json!({"rfilename": f.path}))
            .collect();
        let body = serde_json::json!({"sha": COMMIT, "siblings": siblings}).to_string();
        return reply(&mut s, "200 OK", json, body.as_bytes());
    }
    let rest = path.trim_start_matches('/');
    let Some(repo) = find(rest) else {
        return not_found(&mut s);
    };
    let want = rest[repo.id.len() + 1..].strip_prefix("resolve/main/");
    let Some(f) = want.and_then(|w| repo.files.iter().find(|f| f.path == w)) else {
        return reply(
            &mut s,
            "404 Not Found",
            json,
            br#"{"error":"Entry not found"}"#,
        );
    };
    if !authorized(repo) {
        return reply(
            &mut s,
            "401 Unauthorized",
            json,
            br#"{"error":"Access restricted"}"#,
        );
    }
    let n = f.data.len();
    let (a, b) = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .map(|(a, b)| (a.parse().unwrap_or(0), b.parse().unwrap_or(n - 1)))
        .unwrap_or((0, n - 1));
    let (a, b) = (a.min(n), b.min(n - 1));
    let headers = format!(
        "ETag: \"{}\"\r\nX-Repo-Commit: {COMMIT}\r\nAccept-Ranges: bytes\r\n\
         Content-Range: bytes {a}-{b}/{n}\r\n",
        f.etag
    );
    let body = &f.data[a..=b.max(a).min(n - 1)];
    if stall && body.len() > 1 {
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\n{headers}Content-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(&body[..body.len() / 2]);
        let _ = s.flush();
        std::thread::sleep(std::time::Duration::from_secs(3600));
        return;
    }
    reply(&mut s, "206 Partial Content", &headers, body);
}
