//! `-hf user/model[:quant]` (`pocketmoe-serve`, `pocketmoe run`): a GGUF from the Hugging Face
//! Hub, as llama.cpp's `common/download.cpp` and `common/hf-cache.cpp` (the tree we pin) pick,
//! store and reuse it.
//!
//! - The cache is the Hub's own layout, shared with llama.cpp and the `hf` CLI:
//!   `DIR/models--user--model/{blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>,
//!   refs/main}`, DIR being the first of `LLAMA_CACHE`, `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
//!   `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub` (llama.cpp's
//!   order).
//! - The file: `--hf-file` exactly; else the first model GGUF whose name has `QUANT.` or `QUANT-`
//!   (any case), QUANT being the tag, or Q4_K_M then Q8_0 without one, then (no tag only) the
//!   first model GGUF. Not models: `mmproj`, `imatrix` and draft heads (`mtp-`, `eagle3-`, ...).
//!   A split model (`-00001-of-00003.gguf`) brings all its parts.
//! - A file already in the cache is used without asking the Hub (llama.cpp asks for the newest
//!   commit first); `--offline` never asks. Endpoint: `MODEL_ENDPOINT`, else `HF_ENDPOINT`, else
//!   <https://huggingface.co>; token: `--hf-token`, else `HF_TOKEN`.
//!
//! The network part (the listing, downloads with progress lines and a stall timeout) is
//! [`fetch`], over the `hf-hub` crate's blocking client.
mod fetch;

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// What the command line asked for.
#[derive(Debug, Clone, Default)]
pub struct HubModel {
    /// `user/model[:quant]`, as given to `-hf`.
    pub repo: String,
    /// `--hf-file`: this file of the repository, whatever the tag says.
    pub file: Option<String>,
    /// `--hf-token` or `HF_TOKEN`.
    pub token: Option<String>,
    /// `--offline`: the cache only.
    pub offline: bool,
}

/// The model file for a command line's `-m PATH` and `-hf REPO` (which wins, as in llama.cpp; a
/// note says so when both are given).
pub fn model_path(model: Option<&Path>, hf: Option<&HubModel>) -> Result<PathBuf> {
    match (model, hf) {
        (m, Some(hf)) => {
            if let Some(m) = m {
                eprintln!(
                    "note: -m {} ignored: -hf {} gives the model",
                    m.display(),
                    hf.repo
                );
            }
            resolve(hf)
        }
        (Some(m), None) => Ok(m.to_path_buf()),
        (None, None) => bail!("a model is needed: -m PATH or -hf USER/MODEL[:QUANT]"),
    }
}

/// `user/model[:quant]` -> (`user/model`, `quant` or ""), as llama.cpp splits it.
pub fn split_repo_tag(s: &str) -> Result<(String, String)> {
    let parts: Vec<&str> = s.split(':').collect();
    let tag = if parts.len() > 1 {
        parts[parts.len() - 1]
    } else {
        ""
    };
    let repo = parts[0];
    if !valid_repo_id(repo) {
        bail!("-hf {s}: invalid Hugging Face repository, expected <user>/<model>[:quant]");
    }
    Ok((repo.to_string(), tag.to_string()))
}

/// llama.cpp's rule: `[A-Za-z0-9_]` and `/ . -` between them, exactly one `/`, 256 at most.
fn valid_repo_id(r: &str) -> bool {
    let mut special = true;
    let mut slashes = 0;
    for c in r.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            special = false;
        } else if matches!(c, '/' | '.' | '-') && !special {
            slashes += usize::from(c == '/');
            special = true;
        } else {
            return false;
        }
    }
    !r.is_empty() && r.len() <= 256 && !special && slashes == 1
}

/// The Hub cache directory, in llama.cpp's order of variables.
pub fn cache_dir() -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    for k in ["LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
        if let Some(p) = var(k) {
            return Ok(p);
        }
    }
    if let Some(p) = var("HF_HOME") {
        return Ok(p.join("hub"));
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return Ok(p.join("huggingface/hub"));
    }
    match var("HOME") {
        Some(p) => Ok(p.join(".cache/huggingface/hub")),
        None => bail!("no Hugging Face cache directory: set LLAMA_CACHE or HOME"),
    }
}

/// The Hub's address, without a trailing `/`.
pub fn endpoint() -> String {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let e = var("MODEL_ENDPOINT")
        .or_else(|| var("HF_ENDPOINT"))
        .unwrap_or_else(|| "https://huggingface.co".into());
    e.trim_end_matches('/').to_string()
}

/// A GGUF name's split part (index, count) and its prefix without them and `.gguf`.
fn split_info(path: &str) -> Option<(&str, u32, u32)> {
    let stem = path.strip_suffix(".gguf")?;
    let b = stem.as_bytes();
    let n = b.len();
    // "-00001-of-00003"
    if n > 15 && b[n - 15] == b'-' && stem[n - 9..n - 5].eq_ignore_ascii_case("-of-") {
        let (i, c) = (&stem[n - 14..n - 9], &stem[n - 5..]);
        if i.bytes().chain(c.bytes()).all(|x| x.is_ascii_digit()) {
            return Some((&stem[..n - 15], i.parse().ok()?, c.parse().ok()?));
        }
    }
    Some((stem, 1, 1))
}

/// A model GGUF (not a projector, an importance matrix or a draft head), and the first part of
/// a split one.
fn is_first_model_part(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let sidecar = ["mmproj", "mtp-", "dflash-", "eagle3-", "dspark-", "imatrix"];
    path.ends_with(".gguf")
        && !sidecar.iter().any(|k| name.contains(k))
        && split_info(path).is_some_and(|(_, i, _)| i == 1)
}

/// llama.cpp's `find_best_model`: the first model GGUF carrying the tag (or Q4_K_M, then Q8_0),
/// else, with no tag, the first model GGUF.
pub fn pick_model<'a>(files: &'a [String], tag: &str) -> Option<&'a str> {
    let tags: Vec<String> = if tag.is_empty() {
        vec!["q4_k_m".into(), "q8_0".into()]
    } else {
        vec![tag.to_ascii_lowercase()]
    };
    let models = || files.iter().filter(|f| is_first_model_part(f));
    for t in &tags {
        let hit = models().find(|f| {
            let l = f.to_ascii_lowercase();
            l.contains(&format!("{t}.")) || l.contains(&format!("{t}-"))
        });
        if let Some(f) = hit {
            return Some(f);
        }
    }
    if tag.is_empty() {
        return models().next().map(String::as_str);
    }
    None
}

/// Every part of `primary`'s split model (just `primary` when it is one file).
pub fn parts(files: &[String], primary: &str) -> Vec<String> {
    match split_info(primary) {
        Some((prefix, _, count)) if count > 1 => {
            let mut v: Vec<String> = files
                .iter()
                .filter(|f| split_info(f).is_some_and(|(p, _, c)| p == prefix && c == count))
                .cloned()
                .collect();
            v.sort();
            v
        }
        _ => vec![primary.to_string()],
    }
}

/// Every part of a split model is there (a download stopped between parts is not a model).
fn complete(files: &[String]) -> bool {
    split_info(&files[0]).is_none_or(|(_, _, count)| files.len() == count as usize)
}

/// A repository path safe to join under a snapshot directory: relative, no `..`, no `\`.
fn safe_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The files of `repo`'s cached snapshot (refs/main, else another ref), relative, `/`-separated.
fn cached_files(dir: &Path, repo: &str) -> (Option<PathBuf>, Vec<String>) {
    let root = dir.join(format!("models--{}", repo.replace('/', "--")));
    let commit = |f: &Path| {
        let c = std::fs::read_to_string(f).ok()?.trim().to_string();
        (c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit())).then_some(c)
    };
    let refs = root.join("refs");
    let mut commit_id = commit(&refs.join("main"));
    if commit_id.is_none() {
        let entries = std::fs::read_dir(&refs).into_iter().flatten().flatten();
        commit_id = entries.filter_map(|e| commit(&e.path())).next();
    }
    let Some(c) = commit_id else {
        return (None, Vec::new());
    };
    let snap = root.join("snapshots").join(c);
    let mut out = Vec::new();
    let mut stack = vec![snap.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.is_file() {
                if let Ok(rel) = p.strip_prefix(&snap) {
                    out.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
    }
    out.sort();
    (Some(snap), out)
}

/// The file (and its parts) the request names among `files`, or why none.
fn choose(files: &[String], m: &HubModel, repo: &str, tag: &str) -> Result<Vec<String>, String> {
    let primary = match &m.file {
        Some(f) => files.iter().find(|x| *x == f).map(String::as_str),
        None => pick_model(files, tag),
    };
    match primary {
        Some(p) => Ok(parts(files, p)),
        None => {
            let ggufs: Vec<&str> = files
                .iter()
                .filter(|f| f.ends_with(".gguf"))
                .map(String::as_str)
                .collect();
            let what = match (&m.file, tag) {
                (Some(f), _) => format!("file '{f}' not found in repository {repo}"),
                (None, "") => format!("no GGUF model file in repository {repo}"),
                (None, t) => format!("no GGUF file for quant '{t}' in repository {repo}"),
            };
            if ggufs.is_empty() {
                Err(what)
            } else {
                Err(format!("{what} (its GGUF files: {})", ggufs.join(", ")))
            }
        }
    }
}

/// Downloads (or finds in the cache) the model `m` names; returns its path in the snapshot.
pub fn resolve(m: &HubModel) -> Result<PathBuf> {
    let (repo, tag) = split_repo_tag(&m.repo)?;
    let dir = cache_dir()?;
    let (snap, cached) = cached_files(&dir, &repo);
    let found = choose(&cached, m, &repo, &tag).ok().filter(|f| complete(f));
    if let (Some(snap), Some(files)) = (&snap, found) {
        let path = snap.join(&files[0]);
        eprintln!(
            "-hf {}: {} from the cache ({})",
            m.repo,
            files[0],
            path.display()
        );
        return Ok(path);
    }
    if m.offline {
        bail!(
            "-hf {}{}: not in the cache ({}) and --offline forbids downloading",
            m.repo,
            m.file
                .as_deref()
                .map_or(String::new(), |f| format!(" --hf-file {f}")),
            dir.display()
        );
    }
    let hub = fetch::Hub::new(&dir, &repo, m.token.clone())?;
    let listing: Vec<String> = hub.list()?.into_iter().filter(|f| safe_path(f)).collect();
    let files = choose(&listing, m, &repo, &tag)
        .map_err(|e| anyhow::anyhow!("-hf {}: {e} (on {})", m.repo, endpoint()))?;
    let mut first = None;
    for f in &files {
        let p = hub.download(f)?;
        first.get_or_insert(p);
    }
    let path = first.expect("choose gives at least one file");
    eprintln!("-hf {}: {} at {}", m.repo, files[0], path.display());
    Ok(path)
}

#[cfg(test)]
mod tests;
