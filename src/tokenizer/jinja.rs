//! The Jinja environment chat templates run in: minijinja configured like Hugging Face's
//! `apply_chat_template` (`trim_blocks`, `lstrip_blocks`, loop controls, Python string/dict
//! methods through minijinja-contrib's pycompat) with HF's extra globals `raise_exception` and
//! `strftime_now`, and a `tojson` that prints what Python's `json.dumps` prints.
//!
//! Reference: transformers `utils/chat_template_utils.py` (`_compile_jinja_template`: the
//! environment, `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
//! `raise_exception`, `strftime_now`) and llama.cpp `common/jinja/value.cpp`, which implements
//! the same three for its own engine.
//!
//! Invariants: `tojson` output is byte-identical to CPython's `json.dumps` for JSON-representable
//! values (separators `", "`/`": "` without indent, `","`/`": "` with it; floats in `repr` form;
//! no HTML escaping, unlike minijinja's built-in `tojson`); `strftime_now` formats the current
//! UTC time (llama.cpp uses local time; the two agree on UTC machines such as CI).
use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use std::sync::{Arc, Mutex};

/// A fresh environment with HF's settings and helpers.
pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .expect("default delimiters are valid");
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| strftime(&fmt, unix_now()));
    env.add_filter("tojson", tojson);
    env.add_function(NEW_LIST, || Value::from_object(List::default()));
    env
}

/// The function [`mutable_lists`] puts in place of an assigned `[]`.
const NEW_LIST: &str = "__pocketmoe_list";

/// A list a template may grow and drain as Python's (`append`, `extend`, `insert`, `pop`,
/// `clear`): minijinja's own lists are immutable (Kimi K2's template queues its tool-call ids
/// with `namespace(ids=[])`, `.ids.append(id)` and `.ids.pop(0)`, as llama.cpp's own Jinja engine
/// allows). Other methods are pycompat's, on a copy.
#[derive(Debug, Default)]
struct List(Mutex<Vec<Value>>);

impl List {
    fn items(&self) -> std::sync::MutexGuard<'_, Vec<Value>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Python's index `i` into a list of `len` (negative from the end), if in range.
fn py_index(i: &Value, len: usize) -> Option<usize> {
    let i = i.as_i64()?;
    let i = if i < 0 { i + len as i64 } else { i };
    usize::try_from(i).ok().filter(|&i| i < len)
}

impl Object for List {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let v = self.items();
        v.get(py_index(key, v.len())?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.items().clone())
    }

    fn call_method(
        self: &Arc<Self>,
        state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        let mut v = self.items();
        match (method, args) {
            ("append", [x]) => v.push(x.clone()),
            ("extend", [xs]) => v.extend(xs.try_iter()?),
            ("insert", [i, x]) => {
                let len = v.len() as i64;
                let i = i
                    .as_i64()
                    .ok_or_else(|| bad("list.insert: the index must be an int"))?;
                let at = if i < 0 { (i + len).max(0) } else { i.min(len) };
                v.insert(at as usize, x.clone());
            }
            ("pop", []) => return v.pop().ok_or_else(|| bad("pop from empty list")),
            ("pop", [i]) => {
                let at = py_index(i, v.len()).ok_or_else(|| bad("pop index out of range"))?;
                return Ok(v.remove(at));
            }
            ("clear", []) => v.clear(),
            _ => {
                let copy = Value::from(v.clone());
                drop(v);
                return minijinja_contrib::pycompat::unknown_method_callback(
                    state, &copy, method, args,
                );
            }
        }
        Ok(Value::from(()))
    }
}

/// Puts a mutable [`List`] in place of each `[]` a template assigns inside a tag (`set x = []`,
/// `namespace(ids=[])`): the only lists a template can grow, since it cannot name an
/// expression's result. Other `[]` (`x == []`, `[] + y`, in strings outside tags) stay.
pub(crate) fn mutable_lists(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find(['{']) {
        let tag = &rest[open..];
        let close = match (tag.starts_with("{%"), tag.starts_with("{{")) {
            (true, _) => tag.find("%}"),
            (_, true) => tag.find("}}"),
            _ => None,
        };
        let Some(close) = close else {
            out.push_str(&rest[..open + 1]);
            rest = &rest[open + 1..];
            continue;
        };
        out.push_str(&rest[..open]);
        let body = &tag[..close];
        let mut i = 0;
        while let Some(at) = body[i..].find('[') {
            let at = i + at;
            let inner = body[at + 1..].trim_start();
            let before = body[..at].trim_end();
            let assigned = before.ends_with('=')
                && !before[..before.len() - 1].ends_with(['=', '!', '<', '>']);
            if assigned && inner.starts_with(']') {
                let end = body.len() - inner.len() + 1;
                out.push_str(&body[i..at]);
                out.push_str(NEW_LIST);
                out.push_str("()");
                i = end;
            } else {
                out.push_str(&body[i..at + 1]);
                i = at + 1;
            }
        }
        out.push_str(&body[i..]);
        rest = &tag[close..];
    }
    out.push_str(rest);
    out
}

/// Rewrites HF's `{% generation %}`...`{% endgeneration %}` (the AssistantTracker extension,
/// which renders its body unchanged) to `{% if true %}`...`{% endif %}`, keeping the `-`/`+`
/// whitespace markers so the output is the same.
pub(crate) fn rewrite_hf_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..close];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.trim_end().strip_suffix(['-', '+']) {
            Some(b) => (b, &body.trim_end()[b.len()..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

/// serde_json -> template value (maps keep serde_json's key order).
pub(crate) fn from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => n
            .as_i64()
            .map(Value::from)
            .or_else(|| n.as_u64().map(Value::from))
            .unwrap_or_else(|| Value::from(n.as_f64().unwrap_or(f64::NAN))),
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => a.iter().map(from_json).collect(),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), from_json(v)))),
    }
}

/// `tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
/// `separators` and `sort_keys` are keyword-only here (positional use of them is unheard of).
fn tojson(
    value: &Value,
    a0: Option<Value>,
    a1: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let args = [a0, a1, None, None];
    let arg = |i: usize, name: &str| -> Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(name)?;
        let v = kw.or_else(|| args[i].clone());
        Ok(v.filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = arg(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match arg(1, "indent")? {
        None => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (_, Some(s)) => Some(s.to_string()),
            _ => return Err(bad("tojson: indent must be an int or a string")),
        },
    };
    let (mut item_sep, mut key_sep) = match indent {
        Some(_) => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    if let Some(seps) = arg(2, "separators")? {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match (
            parts.first().and_then(|v| v.as_str()),
            parts.get(1).and_then(|v| v.as_str()),
        ) {
            (Some(a), Some(b)) => (item_sep, key_sep) = (a.to_string(), b.to_string()),
            _ => return Err(bad("tojson: separators must be two strings")),
        }
    }
    let sort_keys = arg(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let mut w = JsonWriter {
        out: String::new(),
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    w.value(value, 0)?;
    Ok(Value::from(w.out))
}

fn bad(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_string())
}

struct JsonWriter {
    out: String,
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonWriter {
    fn newline(&mut self, depth: usize) {
        if let Some(ind) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(ind);
            }
        }
    }

    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    self.out.push_str(&v.to_string());
                } else {
                    let f = f64::try_from(v.clone())?;
                    self.out.push_str(&python_float(f));
                }
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.items('{', '}', keys.len(), depth, |w, i, depth| {
                    let k = &keys[i];
                    w.string(&k.to_string());
                    w.out.push_str(&w.key_sep.clone());
                    w.value(&v.get_item(k)?, depth)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.items('[', ']', items.len(), depth, |w, i, depth| {
                    w.value(&items[i], depth)
                })?;
            }
            _ => self.string(&v.to_string()),
        }
        Ok(())
    }

    fn items(
        &mut self,
        open: char,
        close: char,
        n: usize,
        depth: usize,
        mut each: impl FnMut(&mut Self, usize, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        for i in 0..n {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.out.push_str(&sep);
            }
            self.newline(depth + 1);
            each(self, i, depth + 1)?;
        }
        if n > 0 {
            self.newline(depth);
        }
        self.out.push(close);
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        self.out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `repr(float)` (what `json.dumps` prints): shortest round-trip digits, positional
/// for exponents in [-4, 16), else `d.ddde+XX`; non-finite values as `NaN`/`Infinity`.
pub(crate) fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}"); // e.g. "-1.2345e-7", shortest round-trip digits
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa
        .strip_prefix('-')
        .map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let s = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{s}")
    } else {
        let (head, tail) = digits.split_at(1);
        let frac = if tail.is_empty() {
            String::new()
        } else {
            format!(".{tail}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{head}{frac}e{esign}{:02}", exp.abs())
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A C `strftime` subset over UTC: %Y %y %m %d %e %j %H %I %M %S %p %A %a %B %b %h %F %T %D %%.
pub(crate) fn strftime(fmt: &str, unix: i64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let piece = match chars.next() {
            Some('Y') => year.to_string(),
            Some('y') => format!("{:02}", year.rem_euclid(100)),
            Some('m') => format!("{month:02}"),
            Some('d') => format!("{day:02}"),
            Some('e') => format!("{day:2}"),
            Some('j') => format!("{yday:03}"),
            Some('H') => format!("{h:02}"),
            Some('I') => format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 }),
            Some('M') => format!("{m:02}"),
            Some('S') => format!("{s:02}"),
            Some('p') => if h < 12 { "AM" } else { "PM" }.to_string(),
            Some('A') => day_name.to_string(),
            Some('a') => day_name[..3].to_string(),
            Some('B') => month_name.to_string(),
            Some('b' | 'h') => month_name[..3].to_string(),
            Some('F') => format!("{year}-{month:02}-{day:02}"),
            Some('T') => format!("{h:02}:{m:02}:{s:02}"),
            Some('D') => format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            Some('%') => "%".to_string(),
            other => {
                let spec = other.map_or(String::new(), String::from);
                return Err(bad(&format!("strftime_now: unsupported format %{spec}")));
            }
        };
        out.push_str(&piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_trim_like_hf() {
        // HF compiles templates with trim_blocks and lstrip_blocks: block lines vanish.
        let env = environment();
        let src = "<a>\n  {% for x in [1, 2] %}\n    {% if x > 1 %}\n{{ x }}\n    {% endif %}\n  {% endfor %}\n</a>\n";
        assert_eq!(env.render_str(src, ()).unwrap(), "<a>\n2\n</a>");
        let src =
            "{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}";
        assert_eq!(env.render_str(src, ()).unwrap(), "13");
    }

    #[test]
    fn generation_tags_become_plain_blocks() {
        let src = "a{%- generation -%} b {%+ endgeneration %}c{% if x %}{{ '%}' }}{% endif %}";
        assert_eq!(
            rewrite_hf_tags(src),
            "a{%- if true -%} b {%+ endif %}c{% if x %}{{ '%}' }}{% endif %}"
        );
        assert_eq!(rewrite_hf_tags("{% generation"), "{% generation");
    }

    #[test]
    fn floats_print_like_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789.0, "123456789.0"),
            (1e22, "1e+22"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(python_float(f), s, "{f}");
        }
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 15:05:09 UTC was a Friday, day 208 of a leap year.
        let t = 1_722_006_000 + 309;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %j %T %y %F", t).unwrap(),
            "Friday July 208 15:05:09 24 2024-07-26"
        );
        assert_eq!(strftime("%F", 0).unwrap(), "1970-01-01");
        assert_eq!(strftime("%F %a", 951_782_400).unwrap(), "2000-02-29 Tue");
        assert!(strftime("%Q", 0).is_err());
    }

    #[test]
    fn tojson_matches_json_dumps() {
        let env = environment();
        let ctx = from_json(&serde_json::json!({
            "x": {"b": [1, 2.5, "é<\"\n"], "a": null, "t": true}
        }));
        let r = |src: &str| env.render_str(src, ctx.clone()).unwrap();
        // Keys in insertion order, as json.dumps of a Python dict (sort_keys=False): serde_json
        // keeps it (its preserve_order feature, which llguidance turns on).
        assert_eq!(
            r("{{ x|tojson }}"),
            r#"{"b": [1, 2.5, "é<\"\n"], "a": null, "t": true}"#
        );
        assert_eq!(
            r("{{ x|tojson(sort_keys=true) }}"),
            r#"{"a": null, "b": [1, 2.5, "é<\"\n"], "t": true}"#
        );
        assert_eq!(
            r("{{ x.b|tojson(indent=2) }}"),
            "[\n  1,\n  2.5,\n  \"é<\\\"\\n\"\n]"
        );
        assert_eq!(
            r("{{ x.b|tojson(ensure_ascii=true) }}"),
            r#"[1, 2.5, "\u00e9<\"\n"]"#
        );
        assert_eq!(
            r("{{ x.b|tojson(separators=(',', ':')) }}"),
            r#"[1,2.5,"é<\"\n"]"#
        );
        assert_eq!(r("{{ {}|tojson }}{{ []|tojson(indent=4) }}"), "{}[]");
    }

    #[test]
    fn assigned_empty_lists_are_mutable_as_pythons() {
        // Only assigned `[]` become mutable; a comparison and text outside tags stay.
        assert_eq!(
            mutable_lists("[] {% set a = [] %}{% set n = namespace(ids=[ ]) %}{{ a == [] }}"),
            "[] {% set a = __pocketmoe_list() %}{% set n = namespace(ids=__pocketmoe_list()) %}{{ a == [] }}"
        );
        let env = environment();
        let src = mutable_lists(
            "{% set n = namespace(ids=[]) %}{% set _ = n.ids.append(1) %}\
             {% set _ = n.ids.extend([2, 3]) %}{% set _ = n.ids.insert(0, 0) %}\
             {{ n.ids.pop(0) }}|{{ n.ids.pop() }}|{{ n.ids | length }}|{{ n.ids[-1] }}|\
             {{ n.ids | tojson }}|{% for x in n.ids %}{{ x }}{% endfor %}",
        );
        let out = env.render_str(&src, ()).unwrap();
        assert_eq!(out, "0|3|2|2|[1, 2]|12");
        let err = env
            .render_str(&mutable_lists("{% set a = [] %}{{ a.pop() }}"), ())
            .unwrap_err();
        assert!(err.to_string().contains("pop from empty list"), "{err}");
    }
}
