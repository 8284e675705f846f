//! The one rule for fields a client's API has and the engine's lacks:
//! every field of every API pair translates is **mapped** (put in the
//! engine's request by that API's translation), **dropped** (it steers the
//! vendor's own service, not the text the model produces: left out, and
//! named in `x-pair-dropped`) or **refused** (it changes the text and
//! cannot be had on the engine: the client's 400, naming it). The reason
//! stands beside each. A field in no table is refused: pair does not
//! guess what an unknown field does to the answer.
//!
//! A nested field is named with dots (`output_config.effort`); a table
//! that names nested fields of an object lists the object itself as
//! [`Rule::Nested`]. An empty value (`null`, `{}`, `[]`, `""`, `false`)
//! asks for nothing and is never refused.
//!
//! docs/engines.md lists every dropped field; a test keeps it in step.

use serde_json::{Map, Value};

use crate::TranslateError;

/// What becomes of one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The translation puts it in the engine's request.
    Mapped,
    /// Left out: it steers the vendor's service, not the text.
    Dropped(&'static str),
    /// A 400 naming it: it changes the text and the engine cannot do it.
    Refused(&'static str),
    /// An object whose own fields have rules (`name.field`).
    Nested,
}

/// One field of one API and its rule.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    pub rule: Rule,
}

const fn mapped(name: &'static str) -> Field {
    Field {
        name,
        rule: Rule::Mapped,
    }
}

const fn dropped(name: &'static str, why: &'static str) -> Field {
    Field {
        name,
        rule: Rule::Dropped(why),
    }
}

const fn refused(name: &'static str, why: &'static str) -> Field {
    Field {
        name,
        rule: Rule::Refused(why),
    }
}

const fn nested(name: &'static str) -> Field {
    Field {
        name,
        rule: Rule::Nested,
    }
}

/// Anthropic's Messages API (`POST /v1/messages`, and its `count_tokens`).
pub const ANTHROPIC_MESSAGES: &[Field] = &[
    mapped("model"),
    mapped("messages"),
    mapped("max_tokens"),
    mapped("system"),
    mapped("stop_sequences"),
    mapped("stream"),
    mapped("temperature"),
    mapped("top_p"),
    mapped("top_k"),
    mapped("tools"),
    mapped("tool_choice"),
    mapped("thinking"),
    mapped("output_format"),
    nested("output_config"),
    mapped("output_config.format"),
    dropped(
        "output_config.effort",
        "how hard Claude thinks; a local engine thinks as its model does",
    ),
    dropped("metadata", "the caller's id for Anthropic's abuse checks"),
    dropped("service_tier", "Anthropic's capacity tier"),
    dropped(
        "context_management",
        "Anthropic's server-side editing of long contexts; the engine gets the context whole",
    ),
    dropped(
        "cache_control",
        "a prompt-cache hint for Anthropic's servers, on the request or on any block or tool",
    ),
    dropped(
        "messages[].content[].thinking",
        "an earlier turn's thinking (or redacted thinking), signed for Anthropic's servers; a chat template takes no earlier reasoning back",
    ),
    dropped("inference_geo", "where Anthropic runs the request"),
    dropped("container", "Anthropic's code-execution container"),
    dropped(
        "safeguards",
        "inputs to Anthropic's own tool-use safety classifier (Claude Code sends them)",
    ),
    refused(
        "mcp_servers",
        "the MCP connector runs tools on Anthropic's servers; give the tools to the client instead",
    ),
];

/// OpenAI's Responses API (`POST /v1/responses`).
pub const OPENAI_RESPONSES: &[Field] = &[
    mapped("model"),
    mapped("input"),
    mapped("instructions"),
    mapped("tools"),
    mapped("tool_choice"),
    mapped("parallel_tool_calls"),
    mapped("max_output_tokens"),
    mapped("temperature"),
    mapped("top_p"),
    mapped("stream"),
    nested("text"),
    mapped("text.format"),
    dropped(
        "text.verbosity",
        "a hint to OpenAI's models on answer length",
    ),
    nested("reasoning"),
    dropped(
        "reasoning.effort",
        "how hard OpenAI's reasoning models think; a local engine thinks as its model does",
    ),
    dropped(
        "reasoning.summary",
        "asks OpenAI for a summary of hidden reasoning; a local engine's reasoning comes whole",
    ),
    dropped(
        "reasoning.generate_summary",
        "asks OpenAI for a summary of hidden reasoning; a local engine's reasoning comes whole",
    ),
    dropped(
        "store",
        "keeps the response on OpenAI's servers; pair keeps no responses",
    ),
    dropped("metadata", "labels for OpenAI's dashboard"),
    dropped("user", "the caller's id for OpenAI's abuse checks"),
    dropped(
        "safety_identifier",
        "the caller's id for OpenAI's abuse checks",
    ),
    dropped(
        "prompt_cache_key",
        "a prompt-cache hint for OpenAI's servers",
    ),
    dropped(
        "prompt_cache_retention",
        "a prompt-cache hint for OpenAI's servers",
    ),
    dropped("service_tier", "OpenAI's capacity tier"),
    dropped(
        "include",
        "extra data from OpenAI's servers (encrypted reasoning, search sources)",
    ),
    dropped("stream_options", "OpenAI's stream obfuscation padding"),
    dropped("truncation", "OpenAI's server-side context trimming"),
    dropped("max_tool_calls", "a cap on OpenAI's built-in tool calls"),
    dropped(
        "client_metadata",
        "the client's ids for OpenAI's logs (Codex sends its session and turn)",
    ),
    dropped(
        "input[].reasoning",
        "an earlier turn's reasoning, encrypted or summarised by OpenAI; a chat template takes no earlier reasoning back",
    ),
    dropped("tools.web_search", HOSTED),
    dropped("tools.web_search_preview", HOSTED),
    dropped("tools.web_search_2025_08_26", HOSTED),
    dropped("tools.file_search", HOSTED),
    dropped("tools.code_interpreter", HOSTED),
    dropped("tools.image_generation", HOSTED),
    dropped("tools.computer_use_preview", HOSTED),
    dropped("tools.tool_search", HOSTED),
    dropped("tools.mcp", HOSTED),
    dropped(
        "tools[].format",
        "a custom tool's grammar: the engine cannot hold the model to it, so the model is told it in the tool's description (named `tools[i].format`)",
    ),
    refused(
        "previous_response_id",
        "pair keeps no responses (it has no store): send the whole conversation in `input`",
    ),
    refused(
        "conversation",
        "pair keeps no conversations (it has no store): send the whole conversation in `input`",
    ),
    refused(
        "prompt",
        "prompt templates are stored on OpenAI's servers; send the text in `input`",
    ),
    refused(
        "background",
        "pair runs requests while the client waits; it has no background jobs",
    ),
    refused(
        "top_logprobs",
        "log probabilities are not translated between APIs",
    ),
];

/// Ollama's `options`, on an OpenAI-compatible engine.
pub const OLLAMA_OPTIONS: &[Field] = &[
    nested("options"),
    mapped("options.num_predict"),
    mapped("options.temperature"),
    mapped("options.top_p"),
    mapped("options.top_k"),
    mapped("options.min_p"),
    mapped("options.stop"),
    mapped("options.seed"),
    mapped("options.frequency_penalty"),
    mapped("options.presence_penalty"),
    mapped("options.repeat_penalty"),
    dropped("options.num_ctx", RUNTIME),
    dropped("options.num_batch", RUNTIME),
    dropped("options.num_gpu", RUNTIME),
    dropped("options.main_gpu", RUNTIME),
    dropped("options.num_thread", RUNTIME),
    dropped("options.low_vram", RUNTIME),
    dropped("options.use_mmap", RUNTIME),
    dropped("options.use_mlock", RUNTIME),
    dropped("options.numa", RUNTIME),
    dropped("options.num_keep", RUNTIME),
    refused("options.mirostat", SAMPLER),
    refused("options.mirostat_eta", SAMPLER),
    refused("options.mirostat_tau", SAMPLER),
    refused("options.tfs_z", SAMPLER),
    refused("options.typical_p", SAMPLER),
    refused("options.repeat_last_n", SAMPLER),
    refused("options.penalize_newline", SAMPLER),
];

/// A tool OpenAI's servers run (search, code, images, remote MCP): a
/// local engine cannot, so it is dropped and the model answers without
/// it. Refusing it would refuse every request of clients that offer one
/// by default (Codex offers `web_search`).
const HOSTED: &str = "a tool OpenAI's servers run; the engine cannot, and the model answers without it (Codex offers web_search by default)";

const RUNTIME: &str =
    "where and how the engine runs the model, fixed when an OpenAI-compatible engine starts";
const SAMPLER: &str = "a sampler setting an OpenAI-compatible engine does not take";

/// Ollama's top-level fields that no Ollama route maps on an
/// OpenAI-compatible engine (each route maps its own).
pub const OLLAMA_COMMON: &[Field] = &[
    dropped(
        "keep_alive",
        "how long Ollama keeps the model loaded; the engine keeps its own",
    ),
    dropped(
        "think",
        "Ollama's switch for a thinking model's reasoning; the engine's model reasons as it was started",
    ),
    dropped(
        "truncate",
        "Ollama's choice to cut an over-long input; the engine applies its own",
    ),
];

/// Where an answer's sorted fields go.
#[derive(Debug, Default)]
pub struct Sorted {
    /// The dropped fields' names, sorted, each once.
    pub dropped: Vec<String>,
}

impl Sorted {
    /// Sorts the fields left in `req` once the translation has taken what
    /// it maps: dropped ones are noted, refused and unknown ones are the
    /// client's error. `prefix` names where `req` sits (`""` at the top,
    /// `"options."` for Ollama's options). `tables` are looked in, in
    /// order; `handled` are names the caller took care of.
    pub fn rest(
        &mut self,
        req: &Map<String, Value>,
        prefix: &str,
        tables: &[&[Field]],
        handled: &[&str],
    ) -> Result<(), TranslateError> {
        for (k, v) in req {
            if empty(v) || handled.contains(&k.as_str()) {
                continue;
            }
            let name = format!("{prefix}{k}");
            match lookup(tables, &name) {
                Some(Rule::Mapped) => {}
                Some(Rule::Dropped(_)) => self.drop_field(name),
                Some(Rule::Refused(why)) => return Err(TranslateError::new(name, why)),
                Some(Rule::Nested) => match v {
                    Value::Object(inner) => {
                        self.rest(inner, &format!("{name}."), tables, &[])?;
                    }
                    other => {
                        return Err(TranslateError::new(
                            name,
                            format!("an object expected, got {}", crate::kind_of(other)),
                        ));
                    }
                },
                None => {
                    return Err(TranslateError::new(
                        name,
                        "has no equivalent on an OpenAI-compatible engine",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Notes one field as dropped (a translation that decided it), once.
    pub fn drop_field(&mut self, name: impl Into<String>) {
        let name = name.into();
        if let Err(at) = self.dropped.binary_search(&name) {
            self.dropped.insert(at, name);
        }
    }
}

/// The rule for a field, from the first table that names it.
pub fn lookup(tables: &[&[Field]], name: &str) -> Option<Rule> {
    tables
        .iter()
        .flat_map(|t| t.iter())
        .find(|f| f.name == name)
        .map(|f| f.rule)
}

/// A value that asks for nothing.
fn empty(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(_) | Value::Bool(true) => false,
    }
}

/// Every table with the API it belongs to (for docs and their test).
pub const TABLES: &[(&str, &[Field])] = &[
    ("Anthropic Messages", ANTHROPIC_MESSAGES),
    ("OpenAI Responses", OPENAI_RESPONSES),
    ("Ollama options", OLLAMA_OPTIONS),
    ("Ollama", OLLAMA_COMMON),
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sort(v: Value, tables: &[&[Field]]) -> Result<Vec<String>, TranslateError> {
        let Value::Object(m) = v else { panic!() };
        let mut s = Sorted::default();
        s.rest(&m, "", tables, &[])?;
        Ok(s.dropped)
    }

    #[test]
    fn dropped_fields_are_named_refused_and_unknown_ones_are_errors() {
        let d = sort(
            json!({"context_management": {"edits": []}, "output_config": {"effort": "high"},
                   "metadata": {"user_id": "u"}, "max_tokens": 5, "mcp_servers": []}),
            &[ANTHROPIC_MESSAGES],
        )
        .unwrap();
        assert_eq!(
            d,
            ["context_management", "metadata", "output_config.effort"]
        );
        let e = sort(
            json!({"mcp_servers": [{"url": "x"}]}),
            &[ANTHROPIC_MESSAGES],
        )
        .unwrap_err();
        assert_eq!(e.field, "mcp_servers");
        let e = sort(json!({"frobnicate": 1}), &[ANTHROPIC_MESSAGES]).unwrap_err();
        assert_eq!(e.field, "frobnicate");
        let e = sort(json!({"output_config": {"wat": 1}}), &[ANTHROPIC_MESSAGES]).unwrap_err();
        assert_eq!(e.field, "output_config.wat");
        let e = sort(json!({"output_config": 3}), &[ANTHROPIC_MESSAGES]).unwrap_err();
        assert_eq!(e.field, "output_config");
    }

    #[test]
    fn every_field_is_named_once_per_table_with_a_reason() {
        for (api, table) in TABLES {
            for (i, f) in table.iter().enumerate() {
                assert!(
                    !table[..i].iter().any(|g| g.name == f.name),
                    "{api}: {} twice",
                    f.name
                );
                if let Rule::Dropped(why) | Rule::Refused(why) = f.rule {
                    assert!(why.len() > 10, "{api}: {} needs a reason", f.name);
                }
                // A nested field's object is in the table; a rule for a
                // part of a mapped field (`tools.web_search`, a block of
                // `messages[]`) names that field.
                if let Some((parent, _)) = f.name.rsplit_once('.') {
                    let nested =
                        !parent.contains('[') && lookup(&[table], parent) == Some(Rule::Nested);
                    let top = parent.split('[').next().unwrap_or(parent);
                    assert!(
                        nested || lookup(&[table], top) == Some(Rule::Mapped),
                        "{api}: {parent}"
                    );
                }
            }
        }
    }

    #[test]
    fn docs_list_every_dropped_field() {
        let docs = include_str!("../../../docs/engines.md");
        for (api, table) in TABLES {
            for f in table.iter() {
                if let Rule::Dropped(_) = f.rule {
                    assert!(
                        docs.contains(&format!("`{}`", f.name)),
                        "docs/engines.md does not list {api}'s dropped `{}`",
                        f.name
                    );
                }
            }
        }
    }
}
