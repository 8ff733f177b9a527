//! Constrained decoding on `pocketmoe-serve` with the tiny random-weight synth model, whose
//! unconstrained output is garbage: every assertion below fails without the constraint.
//! - `gbnf_forces_yes_or_no`: `grammar: root ::= "yes" | "no"` gives exactly one of them, on
//!   chat and completions, streamed and not, with finish_reason "stop".
//! - `json_schema_and_response_format`: `json_schema`, `response_format` json_schema, and
//!   llama.cpp's json_object + schema give JSON that has the required keys with the schema's
//!   types; json_object with `}` biased up still gives a JSON object.
//! - `invalid_constraints_get_400`: a bad grammar / schema / response_format is a 400
//!   invalid_request_error naming the field and the parser's message.
//! - `concurrent_requests_keep_their_own_grammar`: two grammars at once on two slots.
//! - `never_finishing_grammar_stops_at_max_tokens`.
//! - `tool_choice_required_gives_a_call`: a Hermes-template model answers with a parsed tool
//!   call of one of the tools, arguments valid for its schema.
//! - `tool_call_grammars_take_the_formats_syntax`: the Qwen3 and harmony call grammars take
//!   their format's call and refuse others; EOS only once the call is complete.
mod common;

use pocketmoe::gguf::{GgufModel, GgufValue};
use pocketmoe::synth::quantmix::QuantMix;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| common::synth_tiny("server-grammar", "qwen3moe", QuantMix::Q8_0, 1.0, 7))
}

/// The tiny model with a Hermes-style template (`<tool_call>` in it: the Qwen3 output format).
fn hermes_model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let tmpl = "{%- if tools %}<|im_start|>system\nTools:\n{%- for t in tools %}{{ t | tojson }}\n{%- endfor %}Answer with <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n{%- endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let base = GgufModel::open(model()).unwrap();
        let out = model().with_file_name("hermes.gguf");
        common::write_with_key(
            &base,
            "tokenizer.chat_template",
            &GgufValue::Str(tmpl.into()),
            &out,
        );
        out
    })
}

struct Server {
    _child: common::Served,
    addr: String,
}

impl Server {
    fn start(model: &Path) -> Self {
        let m = model.to_string_lossy().to_string();
        let args = [
            "--model",
            &m,
            "--port",
            "0",
            "--threads",
            "2",
            "--parallel",
            "2",
            "--ctx",
            "2048",
        ];
        let (_child, addr) = common::serve(&args);
        Server { _child, addr }
    }

    fn post(&self, path: &str, body: &Value) -> (u16, String) {
        let b = body.to_string();
        let head = format!(
            "POST {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
            b.len()
        );
        let (status, _, text) = common::http_exchange(&self.addr, &head, b.as_bytes());
        (status, text)
    }

    fn json(&self, path: &str, body: &Value) -> Value {
        let (status, text) = self.post(path, body);
        assert_eq!(status, 200, "{body}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// The text and finish reason of a request (SSE when `body.stream`).
    fn generate(&self, path: &str, body: &Value) -> (String, String) {
        let chat = path.contains("chat");
        if body["stream"] == json!(true) {
            let (status, text) = self.post(path, body);
            assert_eq!(status, 200, "{text}");
            let mut out = String::new();
            let mut finish = String::new();
            for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if line == "[DONE]" {
                    break;
                }
                let v: Value = serde_json::from_str(line).unwrap();
                let c = &v["choices"][0];
                let piece = if chat {
                    &c["delta"]["content"]
                } else {
                    &c["text"]
                };
                out.push_str(piece.as_str().unwrap_or(""));
                if let Some(f) = c["finish_reason"].as_str() {
                    finish = f.to_string();
                }
            }
            (out, finish)
        } else {
            let v = self.json(path, body);
            let c = &v["choices"][0];
            let text = if chat {
                &c["message"]["content"]
            } else {
                &c["text"]
            };
            (
                text.as_str().unwrap_or("").to_string(),
                c["finish_reason"].as_str().unwrap_or("").to_string(),
            )
        }
    }
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "Answer, please."}], "max_tokens": 64, "seed": 3});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn completion(extra: Value) -> Value {
    let mut b = json!({"prompt": "The answer is", "max_tokens": 64, "seed": 5});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[test]
fn gbnf_forces_yes_or_no() {
    let s = Server::start(model());
    let g = json!({"grammar": "root ::= \"yes\" | \"no\"\n"});
    for seed in 0..4 {
        for stream in [false, true] {
            let mut b = chat(g.clone());
            b["seed"] = json!(seed);
            b["stream"] = json!(stream);
            let (text, finish) = s.generate("/v1/chat/completions", &b);
            assert!(
                text == "yes" || text == "no",
                "chat seed {seed} stream {stream}: {text:?}"
            );
            assert_eq!(finish, "stop", "{text:?}");
            let mut b = completion(g.clone());
            b["seed"] = json!(seed);
            b["stream"] = json!(stream);
            let (text, finish) = s.generate("/v1/completions", &b);
            assert!(
                text == "yes" || text == "no",
                "completion seed {seed}: {text:?}"
            );
            assert_eq!(finish, "stop");
        }
    }
    // A grammar with classes, repetition and rules: three digits, a dash, a lower-case word.
    let g = "root ::= num \"-\" word\nnum ::= [0-9]{3}\nword ::= [a-z] [a-z]? [a-z]?\n";
    let (text, _) = s.generate("/v1/completions", &completion(json!({"grammar": g})));
    let (num, word) = text.split_once('-').unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        num.len() == 3 && num.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    assert!(
        (1..=3).contains(&word.len()) && word.bytes().all(|b| b.is_ascii_lowercase()),
        "{text:?}"
    );
}

/// The schema the JSON tests use: finite choices only, so a random model ends the object.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "color": {"enum": ["red", "green", "blue"]},
        },
        "required": ["ok", "n", "color"],
        "additionalProperties": false,
    })
}

fn check_instance(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text:?}"));
    assert_eq!(o.len(), 3, "{text:?}");
    assert!(o["ok"].is_boolean(), "{text:?}");
    assert!(o["n"].as_u64().is_some_and(|n| n <= 99), "{text:?}");
    assert!(
        ["red", "green", "blue"].contains(&o["color"].as_str().unwrap()),
        "{text:?}"
    );
}

#[test]
fn json_schema_and_response_format() {
    let s = Server::start(model());
    let bodies = [
        json!({"json_schema": schema()}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema()}}}),
        json!({"response_format": {"type": "json_object", "schema": schema()}}),
    ];
    for (i, b) in bodies.iter().enumerate() {
        for stream in [false, true] {
            let mut c = chat(b.clone());
            c["max_tokens"] = json!(200);
            c["stream"] = json!(stream);
            let (text, finish) = s.generate("/v1/chat/completions", &c);
            assert_eq!(finish, "stop", "body {i}: {text:?}");
            check_instance(&text);
        }
        let mut c = completion(b.clone());
        c["max_tokens"] = json!(200);
        let (text, _) = s.generate("/v1/completions", &c);
        check_instance(&text);
    }
    // JSON mode: any object. `}` pushed up by logit_bias (alone it would come first and
    // repeat) can only close the object the grammar opened.
    let tok = s.json("/tokenize", &json!({"content": "}"}));
    let close = tok["tokens"][0].as_u64().unwrap();
    let mut c = chat(
        json!({"response_format": {"type": "json_object"}, "logit_bias": {close.to_string(): 50}}),
    );
    c["max_tokens"] = json!(100);
    let (text, finish) = s.generate("/v1/chat/completions", &c);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(v.is_object(), "{text:?}");
    assert_eq!(finish, "stop");
}

#[test]
fn invalid_constraints_get_400() {
    let s = Server::start(model());
    let cases = [
        (
            json!({"grammar": "root ::= foo\n"}),
            "grammar",
            "undefined rule \"foo\"",
        ),
        (
            json!({"grammar": "root ::= \"abc\n"}),
            "grammar",
            "unterminated string",
        ),
        (
            json!({"grammar": "root ::= [a-z\n"}),
            "grammar",
            "character class",
        ),
        (
            json!({"json_schema": {"type": "nonsense"}}),
            "json_schema",
            "nonsense",
        ),
        (
            json!({"json_schema": "string"}),
            "json_schema",
            "JSON object",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
            "xml",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
            "json_schema",
        ),
        (
            json!({"grammar": "root ::= \"a\"\n", "json_schema": {"type": "object"}}),
            "grammar",
            "both",
        ),
    ];
    for (extra, field, msg) in cases {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let body = if path.contains("chat") {
                chat(extra.clone())
            } else {
                completion(extra.clone())
            };
            let (status, text) = s.post(path, &body);
            assert_eq!(status, 400, "{path} {extra}: {text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"]["type"], "invalid_request_error", "{text}");
            assert_eq!(v["error"]["param"], field, "{text}");
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains(msg) && m.contains(field), "{extra}: {m}");
        }
    }
    // tool_choice: required without tools, and on a template without a tool-call format.
    let (status, text) = s.post(
        "/v1/chat/completions",
        &chat(json!({"tool_choice": "required"})),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("tool_choice"), "{text}");
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let (status, text) = s.post(
        "/v1/chat/completions",
        &chat(json!({"tool_choice": "required", "tools": tools})),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("tool-call format"), "{text}");
}

#[test]
fn concurrent_requests_keep_their_own_grammar() {
    let s = Server::start(model());
    let yes_no = "root ::= \"yes\" | \"no\"\n";
    let digits = "root ::= [0-9]{4} \".\"\n";
    std::thread::scope(|sc| {
        let mut hs = Vec::new();
        for k in 0..4u64 {
            let s = &s;
            hs.push(sc.spawn(move || {
                let g = if k % 2 == 0 { yes_no } else { digits };
                let mut b = chat(json!({"grammar": g, "seed": k, "stream": k < 2}));
                b["max_tokens"] = json!(32);
                (k, s.generate("/v1/chat/completions", &b))
            }));
        }
        for h in hs {
            let (k, (text, finish)) = h.join().unwrap();
            if k % 2 == 0 {
                assert!(text == "yes" || text == "no", "{k}: {text:?}");
            } else {
                assert!(
                    text.len() == 5
                        && text.ends_with('.')
                        && text[..4].bytes().all(|b| b.is_ascii_digit()),
                    "{k}: {text:?}"
                );
            }
            assert_eq!(finish, "stop", "{k}: {text:?}");
        }
    });
}

#[test]
fn never_finishing_grammar_stops_at_max_tokens() {
    let s = Server::start(model());
    // `root` never accepts: only max_tokens ends it.
    let g = "root ::= \"a\" root\n";
    let mut b = completion(json!({"grammar": g}));
    b["max_tokens"] = json!(12);
    let v = s.json("/v1/completions", &b);
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(
        !text.is_empty() && text.bytes().all(|b| b == b'a'),
        "{text:?}"
    );
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() == 12,
        "{v}"
    );
}

#[test]
fn tool_choice_required_gives_a_call() {
    let s = Server::start(hermes_model());
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["unit", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "stop_now", "parameters": {
            "type": "object", "properties": {"now": {"type": "boolean"}}, "required": ["now"], "additionalProperties": false}}},
    ]);
    for seed in 0..3 {
        for stream in [false, true] {
            let mut b = chat(
                json!({"tools": tools, "tool_choice": "required", "seed": seed, "stream": stream}),
            );
            b["max_tokens"] = json!(200);
            let (status, text) = s.post("/v1/chat/completions", &b);
            assert_eq!(status, 200, "{text}");
            let (name, args, finish) = if stream {
                let mut name = String::new();
                let mut args = String::new();
                let mut finish = String::new();
                for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
                    if line == "[DONE]" {
                        break;
                    }
                    let v: Value = serde_json::from_str(line).unwrap();
                    let c = &v["choices"][0];
                    if let Some(calls) = c["delta"]["tool_calls"].as_array() {
                        name.push_str(calls[0]["function"]["name"].as_str().unwrap_or(""));
                        args.push_str(calls[0]["function"]["arguments"].as_str().unwrap_or(""));
                    }
                    if let Some(f) = c["finish_reason"].as_str() {
                        finish = f.to_string();
                    }
                }
                (name, args, finish)
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                let c = &v["choices"][0];
                let call = &c["message"]["tool_calls"][0]["function"];
                (
                    call["name"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{v}"))
                        .to_string(),
                    call["arguments"].as_str().unwrap().to_string(),
                    c["finish_reason"].as_str().unwrap().to_string(),
                )
            };
            assert_eq!(finish, "tool_calls", "{text}");
            let a: Value = serde_json::from_str(&args).unwrap_or_else(|e| panic!("{e}: {args}"));
            match name.as_str() {
                "get_weather" => {
                    assert!(["c", "f"].contains(&a["unit"].as_str().unwrap()), "{a}");
                    assert!(
                        a["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)),
                        "{a}"
                    );
                }
                "stop_now" => assert!(a["now"].is_boolean(), "{a}"),
                n => panic!("unknown tool {n:?}: {text}"),
            }
        }
    }
    // A named function: always that one.
    let mut b = chat(
        json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "stop_now"}}}),
    );
    b["max_tokens"] = json!(200);
    let v = s.json("/v1/chat/completions", &b);
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "stop_now",
        "{v}"
    );
}

/// Whether `m` takes the tokens of `text` (control-token texts parsed) one by one, each in the
/// mask before it is consumed, and accepts at the end.
fn takes(m: &mut llguidance::Matcher, tok: &pocketmoe::tokenizer::Tokenizer, text: &str) -> bool {
    for id in tok.encode(text, false, true) {
        let mask = m.compute_mask().unwrap();
        if !mask.is_allowed(id) || m.consume_token(id).is_err() {
            return false;
        }
    }
    m.is_accepting().unwrap_or(false)
}

/// The tool-call grammars of both call syntaxes, on the synth vocabulary (which has harmony's
/// control tokens): the format's call is taken, a call of another tool or with bad arguments
/// is not, and an end-of-generation token is allowed only once the call is complete.
#[test]
fn tool_call_grammars_take_the_formats_syntax() {
    use pocketmoe::server::grammar::{Constraint, Grammars};
    use pocketmoe::server::OutputFormat;
    let load =
        || pocketmoe::tokenizer::Tokenizer::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    let tok = load();
    let g = Grammars::new(std::sync::Arc::new(load()));
    let c = Constraint::ToolCall {
        tools: vec![
            json!({"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"now": {"type": "boolean"}}, "required": ["now"]}}}),
        ],
        parallel: false,
    };
    let run = |format, open, text: &str| {
        let mut m = g.compile(&c, format, open).unwrap();
        takes(&mut m, &tok, text)
    };
    let qwen = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"now\": true}}\n</tool_call>";
    assert!(run(OutputFormat::Qwen3, false, qwen));
    assert!(run(
        OutputFormat::Qwen3,
        true,
        &format!("</think>\n\n{qwen}")
    ));
    assert!(!run(
        OutputFormat::Qwen3,
        false,
        &qwen.replace("\"f\"", "\"g\"")
    ));
    assert!(!run(OutputFormat::Qwen3, false, &qwen.replace("true", "1")));
    let harmony = "<|channel|>commentary to=functions.f json<|message|>{\"now\": false}";
    assert!(run(OutputFormat::Harmony, false, harmony));
    assert!(!run(
        OutputFormat::Harmony,
        false,
        "<|channel|>final<|message|>hi"
    ));
    // EOS only at the end.
    let mut m = g.compile(&c, OutputFormat::Harmony, false).unwrap();
    let eog = tok.eog_ids();
    let ids = tok.encode(harmony, false, true);
    for (k, &id) in ids.iter().enumerate() {
        let mask = m.compute_mask().unwrap();
        assert!(
            eog.iter().all(|&e| !mask.is_allowed(e)),
            "EOS allowed after {k} tokens"
        );
        m.consume_token(id).unwrap();
    }
    // Complete and nothing more possible: the matcher has stopped (the scheduler ends the
    // request there), and only EOS remains.
    assert!(m.is_stopped());
    let mask = m.compute_mask_or_eos().unwrap();
    assert!(
        eog.iter().any(|&e| mask.is_allowed(e)),
        "EOS refused at the end"
    );
    assert!(matches!(
        g.compile(&c, OutputFormat::Plain, false),
        Err(pocketmoe::server::ApiError::Invalid { .. })
    ));
}

/// llama.cpp's grammars/json.gbnf (multi-line rules, classes with escapes, `{m,n}`, an empty
/// alternative) through the GBNF reader and llguidance: JSON is taken, near-JSON is not.
#[test]
fn llama_cpp_json_gbnf_takes_json() {
    use pocketmoe::server::grammar::{Constraint, Grammars};
    use pocketmoe::server::OutputFormat;
    let json_gbnf = r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;
    let lark = pocketmoe::server::gbnf::to_lark(json_gbnf).unwrap();
    let load =
        || pocketmoe::tokenizer::Tokenizer::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    let tok = load();
    let g = Grammars::new(std::sync::Arc::new(load()));
    let c = Constraint::Lark {
        lark,
        field: "grammar",
    };
    let run = |text: &str| {
        let mut m = g.compile(&c, OutputFormat::Plain, false).unwrap();
        takes(&mut m, &tok, text)
    };
    assert!(run(
        r#"{"a": [1, -2.5e3, "x\n\u00e9"], "b": {"c": null}, "d": true}"#
    ));
    assert!(run("{\n  \"k\": \"v\"}"));
    for bad in [
        r#"{"a": 01}"#,
        r#"{"a" 1}"#,
        r#"{'a': 1}"#,
        r#"["a"]"#,
        r#"{"a": "\q"}"#,
    ] {
        assert!(!run(bad), "{bad}");
    }
}

/// Schemas with local `$ref`s compile (llguidance without remote resolution) and constrain.
#[test]
fn json_schema_with_local_refs() {
    use pocketmoe::server::grammar::{Constraint, Grammars};
    use pocketmoe::server::OutputFormat;
    let load =
        || pocketmoe::tokenizer::Tokenizer::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    let tok = load();
    let g = Grammars::new(std::sync::Arc::new(load()));
    let c = Constraint::JsonSchema {
        schema: json!({
            "$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 9}},
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/small"}},
            "required": ["x"],
        }),
        field: "json_schema",
    };
    let run = |text: &str| {
        let mut m = g.compile(&c, OutputFormat::Plain, false).unwrap();
        takes(&mut m, &tok, text)
    };
    assert!(run(r#"{"x": 5}"#));
    assert!(!run(r#"{"x": 12}"#));
    assert!(!run(r#"{"y": 1}"#));
}

/// GBNF is character-level: literals that overlap across alternatives and classes beside
/// literals still take every string the grammar describes.
#[test]
fn gbnf_overlapping_literals() {
    use pocketmoe::server::grammar::{Constraint, Grammars};
    use pocketmoe::server::OutputFormat;
    let load =
        || pocketmoe::tokenizer::Tokenizer::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    let tok = load();
    let g = Grammars::new(std::sync::Arc::new(load()));
    let run = |gbnf: &str, text: &str| {
        let c = Constraint::Lark {
            lark: pocketmoe::server::gbnf::to_lark(gbnf).unwrap(),
            field: "grammar",
        };
        let mut m = g.compile(&c, OutputFormat::Plain, false).unwrap();
        takes(&mut m, &tok, text)
    };
    let g1 = "root ::= \"a\" \"bc\" | \"ab\" \"d\"\n";
    assert!(run(g1, "abc"));
    assert!(run(g1, "abd"));
    assert!(!run(g1, "abx"));
    let g2 = "root ::= [a-z]* \"x\"\n";
    assert!(run(g2, "abx"));
    assert!(run(g2, "xxx"));
    let g3 = "root ::= (\"ab\" | \"a\") \"b\"\n";
    assert!(run(g3, "ab"));
    assert!(run(g3, "abb"));
}

/// Grammars that would be huge are refused quickly (reader bound, llguidance's size limits),
/// not compiled for minutes.
#[test]
fn huge_grammars_are_refused() {
    use pocketmoe::server::grammar::{Constraint, Grammars};
    use pocketmoe::server::OutputFormat;
    let e = pocketmoe::server::gbnf::to_lark("root ::= \"a\"{100000}\n").unwrap_err();
    assert!(e.contains("above 10000"), "{e}");
    let tok =
        pocketmoe::tokenizer::Tokenizer::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    let g = Grammars::new(std::sync::Arc::new(tok));
    let c = Constraint::Lark {
        lark: pocketmoe::server::gbnf::to_lark("root ::= (\"ab\"{0,10000}){0,10000}\n").unwrap(),
        field: "grammar",
    };
    let t = std::time::Instant::now();
    let r = g.compile(&c, OutputFormat::Plain, false);
    assert!(t.elapsed().as_secs() < 30, "{:?}", t.elapsed());
    if let Err(e) = r {
        assert!(
            matches!(e, pocketmoe::server::ApiError::Invalid { .. }),
            "{e:?}"
        );
    }
}
