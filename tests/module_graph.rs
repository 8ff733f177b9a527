//! The crate's top-level modules as an import graph, read from the source: an edge `a -> b` for
//! every `crate::b` path in the code of `src/a` (comments and test code left out: a file's
//! `#[cfg(test)] mod tests` block, which by convention ends the file, and `tests.rs` or `*_tests.rs` files).
//!
//! - `graph` names neither `experts` nor `synth`: it reaches the routed experts through its own
//!   `RoutedExperts` trait (issue 15, item 1), in its tests too; nor `engine`, which fills it
//!   (issue 27, item 7).
//! - `server` does not name `experts`, in its tests neither: it reads the engine's figures
//!   (`engine::StatsSnapshot`, issue 27, items 5 and 7).
//! - `engine` names no architecture's own state (`dsv4`, `dsa`): it carries the architecture's
//!   step plan without reading it (issue 27, item 2).
//! - The runtime (`graph`, `experts`, `engine`) does not depend on the synthesiser.
//! - No import circle between top-level modules, apart from those listed in [`KNOWN_CIRCLES`]
//!   (still to break; a new one fails here).
//! - `experts/` has no file over 350 lines, and `Offload` no field visible outside its module.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles that exist today (as the strongly connected sets of modules they form), each to be
/// broken by the item of issue 15 named beside it. Remove an entry once its circle is gone.
/// None left: `ggml::gguf_ref` reads ggml's own type ids, so `ggml` does not name `gguf` (item 4).
const KNOWN_CIRCLES: &[(&[&str], &str)] = &[];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The non-test code of a source file, comments removed.
fn code(path: &Path) -> String {
    if path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs"))
    {
        return String::new();
    }
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let next = lines.get(i + 1).map_or("", |l| l.trim());
        if line.trim() == "#[cfg(test)]" && next.contains("mod tests") {
            break;
        }
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// Top-level module -> (module it names -> first place it does).
fn import_graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut mods = BTreeSet::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if !["lib", "bin", "main"].contains(&name.as_str()) {
            mods.insert(name);
        }
    }
    let mut graph = BTreeMap::new();
    for m in &mods {
        let mut files = Vec::new();
        let dir = src.join(m);
        if dir.is_dir() {
            rs_files(&dir, &mut files);
        } else {
            files.push(src.join(format!("{m}.rs")));
        }
        files.sort();
        let mut edges: BTreeMap<String, String> = BTreeMap::new();
        for f in &files {
            for (i, line) in code(f).lines().enumerate() {
                for part in line.split("crate::").skip(1) {
                    let target: String = part
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if &target != m && mods.contains(&target) {
                        let at = format!("{}:{}", f.strip_prefix(&src).unwrap().display(), i + 1);
                        edges.entry(target).or_insert(at);
                    }
                }
            }
        }
        graph.insert(m.clone(), edges);
    }
    graph
}

/// The strongly connected sets of more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<BTreeSet<String>> {
    struct S<'g> {
        g: &'g BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(s: &mut S<'g>, v: &'g str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        for w in s.g[v].keys() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.stack.contains(&w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut s = S {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The `.rs` files under `src/<dir>`, sorted.
fn src_files(dir: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rs_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir),
        &mut files,
    );
    files.sort();
    files
}

/// The lines of the files under `src/<dir>` (test code included, comments not) that name the
/// top-level module `m`: a path through it (`m::…`, `crate::m`, `pocketmoe::m`) or `m` inside a
/// `use crate::{…}` group.
fn lines_naming(dir: &str, m: &str) -> Vec<String> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for f in &src_files(dir) {
        let text = std::fs::read_to_string(f).unwrap();
        // Brace depth inside a `crate::{` group (it may span lines); 0 outside one.
        let mut group = 0usize;
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let mut hit = false;
            for (j, c) in code.char_indices() {
                if group == 0 && code[j..].starts_with("crate::{") {
                    group = 1;
                    continue;
                }
                if group > 0 && c == '{' && !code[..j].ends_with("crate::") {
                    group += 1;
                } else if group > 0 && c == '}' {
                    group -= 1;
                }
                let word = code[j..].starts_with(m)
                    && !code[..j].chars().next_back().is_some_and(ident)
                    && !code[j + m.len()..].chars().next().is_some_and(ident);
                if word
                    && (code[j + m.len()..].starts_with("::")
                        || code[..j].ends_with("crate::")
                        || group > 0)
                {
                    hit = true;
                }
            }
            if hit {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn graph_names_neither_experts_nor_synth_nor_engine() {
    // Test code included: the graph's own tests must not reach for them either.
    let found: Vec<String> = ["experts", "synth", "engine"]
        .iter()
        .flat_map(|m| lines_naming("graph", m))
        .collect();
    assert!(
        found.is_empty(),
        "graph names experts, synth or engine:\n{}",
        found.join("\n")
    );
}

/// Issue 27 item 5: the server reads the engine's figures (`engine::StatsSnapshot`), never the
/// expert cache's internals; test code included.
#[test]
fn server_does_not_name_experts() {
    let found = lines_naming("server", "experts");
    assert!(
        found.is_empty(),
        "server names experts:\n{}",
        found.join("\n")
    );
}

/// Issue 27 item 2: an architecture's per-step state (DeepSeek-V4's compressor plans) is the
/// architecture's (`arch::SeqState`, `graph::step::ArchStep`): the engine names none of its
/// modules.
#[test]
fn engine_names_no_architecture_state() {
    // Submodules (`crate::graph::dsv4`, `crate::arch::deepseek4`), which `lines_naming` (top-level
    // modules) does not see: a path through one (`dsv4::x`) or its name in a `use` statement.
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for f in &src_files("engine") {
        let text = std::fs::read_to_string(f).unwrap();
        let mut in_use = false;
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            in_use |= code.trim_start().starts_with("use ") || code.contains(" use ");
            for m in ["dsv4", "dsa", "deepseek4", "deepseek32"] {
                let named = code.match_indices(m).any(|(j, _)| {
                    !code[..j].chars().next_back().is_some_and(ident)
                        && !code[j + m.len()..].chars().next().is_some_and(ident)
                        && (in_use || code[j + m.len()..].starts_with("::"))
                });
                if named {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
            in_use &= !code.contains(';');
        }
    }
    assert!(
        found.is_empty(),
        "engine names an architecture's own state:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_runtime_does_not_depend_on_the_synthesiser() {
    let g = import_graph();
    for m in ["graph", "experts", "engine"] {
        assert!(
            !g[m].contains_key("synth"),
            "{m} names synth at {}",
            g[m]["synth"]
        );
    }
}

#[test]
fn no_import_circle_between_top_level_modules_but_the_known_ones() {
    let g = import_graph();
    let known: Vec<BTreeSet<String>> = KNOWN_CIRCLES
        .iter()
        .map(|(ms, _)| ms.iter().map(|m| m.to_string()).collect())
        .collect();
    let mut new = Vec::new();
    for c in circles(&g) {
        if known.contains(&c) {
            continue;
        }
        // Where each edge inside the circle comes from.
        let edges: Vec<String> = c
            .iter()
            .flat_map(|a| {
                g[a].iter()
                    .filter(|(b, _)| c.contains(*b))
                    .map(move |(b, at)| format!("  {a} -> {b} ({at})"))
            })
            .collect();
        new.push(format!("{c:?}:\n{}", edges.join("\n")));
    }
    assert!(new.is_empty(), "import circles:\n{}", new.join("\n"));
}

/// Issue 15 item 3: `experts/` split by job, no file over ~350 lines, and `Offload` keeps its
/// fields to itself (its child modules implement the protocol; the crate goes through methods).
#[test]
fn experts_files_are_small_and_offload_fields_private() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/experts");
    let mut files = Vec::new();
    rs_files(&dir, &mut files);
    for f in &files {
        let n = std::fs::read_to_string(f).unwrap().lines().count();
        assert!(n <= 350, "{} has {n} lines", f.display());
    }
    let text = std::fs::read_to_string(dir.join("offload/mod.rs")).unwrap();
    let body = text
        .split("pub struct Offload {")
        .nth(1)
        .expect("Offload is defined in experts/offload/mod.rs");
    let body = &body[..body.find("\n}").unwrap()];
    let public: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("pub"))
        .collect();
    assert!(public.is_empty(), "Offload has visible fields: {public:?}");
}
