//! GBNF (llama.cpp's grammar format, `grammars/README.md` in its tree) read into rules and
//! written out as llguidance's Lark dialect, which is what the constraint engine compiles.
//!
//! The reader follows llama.cpp's grammar parser: a rule is `name ::= alternatives` and ends at
//! a newline outside parentheses (`|` may continue it on the next line); elements are string
//! literals, character classes (`[a-z]`, `[^"\\]`), `.` (any character), rule references,
//! groups, the postfixes `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`, and token references
//! (`<|im_end|>`, `<[123]>`); `#` starts a comment. Escapes: `\n \r \t \\ \" \[ \] \-`, `\xHH`,
//! `\uHHHH`, `\UHHHHHHHH`. Every reference must name a defined rule and `root` must exist.
//!
//! The writer renames rules (Lark reads upper-case names as terminals, and `start` is its entry
//! point): `root` becomes `g-root`, upper-case letters `_x`, underscores `__`, so distinct GBNF
//! names stay distinct. Literals become sequences of one-character JSON-escaped Lark strings
//! (llguidance's lexemes are greedy; GBNF is character-level), classes `/[...]/` regexes with
//! every character as `\x{..}`, `.` becomes `/(?s:.)/`.
use std::collections::BTreeSet;
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq)]
enum Elem {
    Lit(String),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
    Ref(String),
    Token(String),
    Group(Vec<Vec<Item>>),
}

#[derive(Debug, Clone, PartialEq)]
struct Item {
    elem: Elem,
    /// (min, max): `*` is (0, None), `+` (1, None), `?` (0, Some(1)).
    rep: Option<(u32, Option<u32>)>,
}

/// The largest repetition bound accepted (llama.cpp expands repetitions into copies; large
/// bounds only make grammars huge).
const MAX_REP: u32 = 10_000;

struct Reader<'a> {
    s: &'a [u8],
    src: &'a str,
    pos: usize,
}

type Res<T> = Result<T, String>;

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn at(&self) -> String {
        let line = self.src[..self.pos].matches('\n').count() + 1;
        let col = self.pos - self.src[..self.pos].rfind('\n').map_or(0, |p| p + 1) + 1;
        let rest: String = self.src[self.pos..].chars().take(20).collect();
        format!("at line {line}, column {col} ({rest:?})")
    }

    fn err<T>(&self, what: &str) -> Res<T> {
        Err(format!("{what} {}", self.at()))
    }

    /// Skips spaces, tabs and comments, and newlines when `newline_ok`.
    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n' && c != b'\r') {
                        self.pos += 1;
                    }
                }
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                _ => break,
            }
        }
    }

    fn is_word(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
    }

    fn name(&mut self) -> Res<String> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_word) {
            self.pos += 1;
        }
        if self.pos == start {
            return self.err("expected a rule name");
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn int(&mut self) -> Res<Option<u32>> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Ok(None);
        }
        match self.src[start..self.pos].parse::<u32>() {
            Ok(n) if n <= MAX_REP => Ok(Some(n)),
            _ => {
                self.pos = start;
                self.err(&format!("repetition count above {MAX_REP}"))
            }
        }
    }

    fn hex(&mut self, digits: usize) -> Res<char> {
        let start = self.pos;
        let end = start + digits;
        let h = self
            .src
            .get(start..end)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(h) = h else {
            return self.err(&format!("expected {digits} hex digits"));
        };
        self.pos = end;
        let v = u32::from_str_radix(h, 16).unwrap_or(0);
        char::from_u32(v).map_or_else(|| self.err(&format!("{v:#x} is not a character")), Ok)
    }

    /// One character of a literal or class, escapes decoded.
    fn chr(&mut self) -> Res<char> {
        let Some(c) = self.src[self.pos..].chars().next() else {
            return self.err("unexpected end of grammar");
        };
        self.pos += c.len_utf8();
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return self.err("unexpected end of grammar after \\");
        };
        self.pos += 1;
        Ok(match e {
            b'x' => self.hex(2)?,
            b'u' => self.hex(4)?,
            b'U' => self.hex(8)?,
            b't' => '\t',
            b'r' => '\r',
            b'n' => '\n',
            b'\\' | b'"' | b'[' | b']' | b'-' | b'/' | b'^' => e as char,
            _ => {
                self.pos -= 2;
                return self.err("unknown escape");
            }
        })
    }

    fn alternates(&mut self, nested: bool) -> Res<Vec<Vec<Item>>> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Res<Vec<Item>> {
        let mut seq: Vec<Item> = Vec::new();
        while let Some(c) = self.peek() {
            let elem = match c {
                b'"' => {
                    self.pos += 1;
                    let mut lit = String::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated string literal"),
                            Some(b'"') => break,
                            Some(_) => lit.push(self.chr()?),
                        }
                    }
                    self.pos += 1;
                    Elem::Lit(lit)
                }
                b'[' => {
                    self.pos += 1;
                    let negated = self.peek() == Some(b'^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated character class"),
                            Some(b']') => break,
                            Some(_) => {
                                let lo = self.chr()?;
                                let hi = if self.peek() == Some(b'-')
                                    && self.s.get(self.pos + 1).is_some_and(|&c| c != b']')
                                {
                                    self.pos += 1;
                                    self.chr()?
                                } else {
                                    lo
                                };
                                if hi < lo {
                                    return self.err("character range out of order");
                                }
                                ranges.push((lo, hi));
                            }
                        }
                    }
                    self.pos += 1;
                    if ranges.is_empty() && !negated {
                        return self.err("empty character class");
                    }
                    Elem::Class { negated, ranges }
                }
                b'.' => {
                    self.pos += 1;
                    Elem::Any
                }
                b'<' => {
                    let end = self.src[self.pos..].find('>').map(|e| self.pos + e + 1);
                    let Some(end) = end.filter(|&e| {
                        !self.src[self.pos + 1..e - 1].is_empty()
                            && !self.src[self.pos + 1..e - 1].contains(char::is_whitespace)
                    }) else {
                        return self.err("expected a token reference <...>");
                    };
                    let t = self.src[self.pos..end].to_string();
                    self.pos = end;
                    Elem::Token(t)
                }
                b'!' => return self.err("negated token references (!<...>) are not supported"),
                b'(' => {
                    self.pos += 1;
                    self.space(true);
                    let alts = self.alternates(true)?;
                    if self.peek() != Some(b')') {
                        return self.err("expected ')'");
                    }
                    self.pos += 1;
                    Elem::Group(alts)
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let Some(last) = seq.last_mut().filter(|l| l.rep.is_none()) else {
                        return self.err("a repetition operator must follow an element");
                    };
                    self.pos += 1;
                    last.rep = Some(match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        b'?' => (0, Some(1)),
                        _ => {
                            self.space(true);
                            let min = self.int()?;
                            self.space(true);
                            let rep = if self.peek() == Some(b',') {
                                self.pos += 1;
                                self.space(true);
                                let max = self.int()?;
                                (min.unwrap_or(0), max)
                            } else {
                                let Some(n) = min else {
                                    return self.err("expected a number in {...}");
                                };
                                (n, Some(n))
                            };
                            self.space(true);
                            if self.peek() != Some(b'}') {
                                return self.err("expected '}'");
                            }
                            self.pos += 1;
                            if rep.1.is_some_and(|max| max < rep.0) {
                                return self.err("repetition maximum below its minimum");
                            }
                            rep
                        }
                    });
                    self.space(nested);
                    continue;
                }
                c if Self::is_word(c) => Elem::Ref(self.name()?),
                _ => break,
            };
            seq.push(Item { elem, rep: None });
            self.space(nested);
        }
        Ok(seq)
    }
}

/// Rules of a GBNF grammar, in order of definition (a name defined twice is refused).
fn read(src: &str) -> Res<Vec<(String, Vec<Vec<Item>>)>> {
    let mut r = Reader {
        s: src.as_bytes(),
        src,
        pos: 0,
    };
    let mut rules: Vec<(String, Vec<Vec<Item>>)> = Vec::new();
    r.space(true);
    while r.peek().is_some() {
        let name = r.name()?;
        r.space(false);
        if !r.src[r.pos..].starts_with("::=") {
            return r.err(&format!("expected ::= after rule name {name:?}"));
        }
        r.pos += 3;
        r.space(true);
        let alts = r.alternates(false)?;
        match r.peek() {
            None | Some(b'\n') | Some(b'\r') => {}
            Some(_) => return r.err("expected the end of the rule (a newline)"),
        }
        if rules.iter().any(|(n, _)| *n == name) {
            return Err(format!("rule {name:?} is defined twice"));
        }
        rules.push((name, alts));
        r.space(true);
    }
    if rules.is_empty() {
        return Err("the grammar has no rules".into());
    }
    let defined: BTreeSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    if !defined.contains("root") {
        return Err("the grammar has no root rule (root ::= ...)".into());
    }
    fn refs<'a>(alts: &'a [Vec<Item>], out: &mut BTreeSet<&'a str>) {
        for i in alts.iter().flatten() {
            match &i.elem {
                Elem::Ref(n) => {
                    out.insert(n);
                }
                Elem::Group(g) => refs(g, out),
                _ => {}
            }
        }
    }
    let mut used = BTreeSet::new();
    for (_, alts) in &rules {
        refs(alts, &mut used);
    }
    if let Some(u) = used.iter().find(|u| !defined.contains(*u)) {
        return Err(format!("undefined rule {u:?}"));
    }
    Ok(rules)
}

fn lark_name(n: &str) -> String {
    let mut s = String::from("g-");
    for c in n.chars() {
        match c {
            'A'..='Z' => {
                s.push('_');
                s.push(c.to_ascii_lowercase());
            }
            '_' => s.push_str("__"),
            c => s.push(c),
        }
    }
    s
}

/// A Lark string literal (JSON syntax, which Lark's reader takes; DEL escaped too).
fn lark_string(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn write_alts(alts: &[Vec<Item>], o: &mut String) {
    for (k, seq) in alts.iter().enumerate() {
        if k > 0 {
            o.push_str(" | ");
        }
        if seq.is_empty() {
            o.push_str("\"\"");
        }
        for (j, item) in seq.iter().enumerate() {
            if j > 0 {
                o.push(' ');
            }
            match &item.elem {
                // One lexeme per character: llguidance's lexemes are greedy, so whole-literal
                // lexemes would refuse strings GBNF (character-level) takes, e.g. "abc" in
                // `"a" "bc" | "ab" "d"`.
                Elem::Lit(l) if l.chars().count() <= 1 => o.push_str(&lark_string(l)),
                Elem::Lit(l) => {
                    o.push('(');
                    for (k, c) in l.chars().enumerate() {
                        if k > 0 {
                            o.push(' ');
                        }
                        o.push_str(&lark_string(c.encode_utf8(&mut [0; 4])));
                    }
                    o.push(')');
                }
                // `[^]`: any character.
                Elem::Class { ranges, .. } if ranges.is_empty() => o.push_str("/(?s:.)/"),
                Elem::Class { negated, ranges } => {
                    o.push_str(if *negated { "/[^" } else { "/[" });
                    for &(lo, hi) in ranges {
                        let _ = write!(o, "\\x{{{:x}}}", lo as u32);
                        if hi != lo {
                            let _ = write!(o, "-\\x{{{:x}}}", hi as u32);
                        }
                    }
                    o.push_str("]/");
                }
                Elem::Any => o.push_str("/(?s:.)/"),
                Elem::Ref(n) => o.push_str(&lark_name(n)),
                Elem::Token(t) => o.push_str(t),
                Elem::Group(g) => {
                    o.push('(');
                    write_alts(g, o);
                    o.push(')');
                }
            }
            match item.rep {
                None => {}
                Some((0, None)) => o.push('*'),
                Some((1, None)) => o.push('+'),
                Some((0, Some(1))) => o.push('?'),
                Some((m, None)) => {
                    let _ = write!(o, "{{{m},}}");
                }
                Some((m, Some(n))) => {
                    let _ = write!(o, "{{{m},{n}}}");
                }
            }
        }
    }
}

/// GBNF source to an llguidance Lark grammar whose `start` is GBNF's `root`; the error says
/// what is wrong and where.
pub fn to_lark(src: &str) -> Result<String, String> {
    let rules = read(src)?;
    let mut o = String::from("start: g-root\n");
    for (name, alts) in &rules {
        o.push_str(&lark_name(name));
        o.push_str(": ");
        write_alts(alts, &mut o);
        o.push('\n');
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llama_cpp_syntax() {
        let g = r#"
# a comment
root   ::= (expr "=" ws term "\n")+
expr   ::= term ([-+*/] term)*
term   ::= ident | num | "(" ws expr ")" ws
ident  ::= [a-z] [a-z0-9_]* ws
num    ::= [0-9]{1,3} ws
ws     ::= [ \t\n]*
Upper_case ::= "x" |
  "\x41\u00e9\"" . [^\]]
"#;
        let l = to_lark(g).unwrap();
        assert!(l.starts_with("start: g-root\n"), "{l}");
        assert!(
            l.contains("g-_upper__case: \"x\" | (\"A\" \"\u{e9}\" \"\\\"\") /(?s:.)/ /[^\\x{5d}]/"),
            "{l}"
        );
        assert!(l.contains("/[\\x{30}-\\x{39}]/{1,3}"), "{l}");
    }

    #[test]
    fn errors_say_what_and_where() {
        let e = to_lark("root ::= foo").unwrap_err();
        assert!(e.contains("undefined rule \"foo\""), "{e}");
        let e = to_lark("rot ::= \"a\"").unwrap_err();
        assert!(e.contains("no root rule"), "{e}");
        let e = to_lark("root ::= \"abc").unwrap_err();
        assert!(e.contains("unterminated string"), "{e}");
        let e = to_lark("root ::= \"a\" )").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = to_lark("root = \"a\"").unwrap_err();
        assert!(e.contains("::="), "{e}");
        let e = to_lark("root ::= [z-a]").unwrap_err();
        assert!(e.contains("out of order"), "{e}");
        let e = to_lark("root ::= \"a\"{3,1}").unwrap_err();
        assert!(e.contains("below its minimum"), "{e}");
    }
}
