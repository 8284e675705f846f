//! Engine detection: which engines listen on this machine's loopback, found
//! on the ports engines use by default and identified by what they answer
//! (an engine on another product's port is still named right).
//!
//! [`identify`] and [`plan_found`] are pure; [`scan`] is the shell that asks
//! each port.

use std::time::Duration;

use pair_core::{EngineKind, ModelEntry};
use serde::Deserialize;

use crate::inventory::{
    parse_lmstudio_v0, parse_lmstudio_v1, parse_ollama_tags, parse_ollama_version,
    parse_openai_models,
};
use crate::probe::get_body;
use crate::{EngineConfig, EngineError, EngineUrl, ProbeFailure, http_client};

/// The ports local engines take by default, with who usually holds each.
/// 11435 and 1235 are where pair's port inversion moves Ollama and LM
/// Studio; with nothing found, Ollama is awaited on the first port.
pub const WELL_KNOWN_PORTS: [(u16, &str); 7] = [
    (11435, "Ollama behind pair"),
    (11434, "Ollama"),
    (1235, "LM Studio behind pair"),
    (1234, "LM Studio"),
    (8080, "llama.cpp server"),
    (8000, "vLLM"),
    (30000, "SGLang"),
];

/// The ports of [`WELL_KNOWN_PORTS`].
pub fn well_known_ports() -> Vec<u16> {
    WELL_KNOWN_PORTS.iter().map(|&(p, _)| p).collect()
}

/// Which engine product answered; the kind says which adapter polls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Product {
    Ollama,
    LmStudio,
    LlamaCpp,
    LlamaCppPython,
    Vllm,
    Sglang,
    /// An OpenAI-compatible server that does not say which it is.
    OpenAiCompat,
}

impl Product {
    pub fn kind(self) -> EngineKind {
        match self {
            Product::Ollama => EngineKind::Ollama,
            Product::LmStudio => EngineKind::LmStudio,
            Product::LlamaCpp
            | Product::LlamaCppPython
            | Product::Vllm
            | Product::Sglang
            | Product::OpenAiCompat => EngineKind::OpenAiCompat,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Product::Ollama => "Ollama",
            Product::LmStudio => "LM Studio",
            Product::LlamaCpp => "llama.cpp server",
            Product::LlamaCppPython => "llama-cpp-python",
            Product::Vllm => "vLLM",
            Product::Sglang => "SGLang",
            Product::OpenAiCompat => "OpenAI-compatible server",
        }
    }
}

impl std::fmt::Display for Product {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one port turned out to be.
#[derive(Clone, Debug, PartialEq)]
pub enum Finding {
    /// Nothing listens.
    Free,
    /// An engine, with the models it lists.
    Engine {
        product: Product,
        models: Vec<ModelEntry>,
    },
    /// Another pair-node's face (its own engines are its business).
    PairNode,
    /// Something listens that is no engine pair knows.
    Other,
}

/// The answers a port gave to the identifying requests (`None`: the route
/// failed or was not asked), in the order they are asked.
#[derive(Clone, Copy, Debug, Default)]
pub struct Answers<'a> {
    /// `GET /_pair/status`.
    pub pair_status: Option<&'a [u8]>,
    /// `GET /api/version`, then `GET /api/tags` for the models.
    pub ollama_version: Option<&'a [u8]>,
    pub ollama_tags: Option<&'a [u8]>,
    /// `GET /api/v1/models` (LM Studio 0.4+), `GET /api/v0/models` (0.3.6+).
    pub lmstudio_v1: Option<&'a [u8]>,
    pub lmstudio_v0: Option<&'a [u8]>,
    /// `GET /v1/models`.
    pub openai_models: Option<&'a [u8]>,
}

#[derive(Deserialize)]
struct PairStatus {
    #[serde(rename = "fingerprint")]
    _fingerprint: serde::de::IgnoredAny,
    #[serde(rename = "cluster_addr")]
    _cluster_addr: serde::de::IgnoredAny,
}

#[derive(Deserialize)]
struct OwnedBy {
    data: Vec<OwnedByEntry>,
}

#[derive(Deserialize)]
struct OwnedByEntry {
    #[serde(default)]
    owned_by: Option<String>,
}

/// Names what answered. Ollama and LM Studio also serve `/v1/models`, so
/// their own routes are asked first; an OpenAI-compatible server is told
/// apart by the `owned_by` its listing gives (llama.cpp `llamacpp`, vLLM
/// `vllm`, SGLang `sglang`, llama-cpp-python `me`).
pub fn identify(a: &Answers<'_>) -> Finding {
    if a.pair_status
        .is_some_and(|b| serde_json::from_slice::<PairStatus>(b).is_ok())
    {
        return Finding::PairNode;
    }
    if a.ollama_version
        .is_some_and(|b| parse_ollama_version(b).is_ok())
    {
        let models = a
            .ollama_tags
            .and_then(|b| parse_ollama_tags(b).ok())
            .unwrap_or_default();
        return Finding::Engine {
            product: Product::Ollama,
            models,
        };
    }
    let lms = a
        .lmstudio_v1
        .and_then(|b| parse_lmstudio_v1(b).ok())
        .or_else(|| a.lmstudio_v0.and_then(|b| parse_lmstudio_v0(b).ok()));
    if let Some(models) = lms {
        return Finding::Engine {
            product: Product::LmStudio,
            models,
        };
    }
    let Some(body) = a.openai_models else {
        return Finding::Other;
    };
    let Ok(models) = parse_openai_models(EngineKind::OpenAiCompat, body) else {
        return Finding::Other;
    };
    let owner = serde_json::from_slice::<OwnedBy>(body)
        .ok()
        .and_then(|l| l.data.into_iter().find_map(|e| e.owned_by));
    let product = match owner.as_deref() {
        Some("llamacpp") => Product::LlamaCpp,
        Some("vllm") => Product::Vllm,
        Some("sglang") => Product::Sglang,
        Some("me") => Product::LlamaCppPython,
        _ => Product::OpenAiCompat,
    };
    Finding::Engine { product, models }
}

/// An engine found on a port.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub port: u16,
    pub product: Product,
    pub models: Vec<ModelEntry>,
}

/// Which engines to use from what a scan found, given the ports the node's
/// own faces take: every engine found is adopted, except that an engine
/// holding a face's port is an error that names the command moving it
/// (pair never stops a process it did not start).
pub fn plan_found(
    host: &str,
    found: &[(u16, Finding)],
    face_ports: &[u16],
) -> Result<Vec<(Product, EngineConfig)>, EngineError> {
    let mut out = Vec::new();
    for (port, finding) in found {
        let Finding::Engine { product, .. } = finding else {
            continue;
        };
        let kind = product.kind();
        if face_ports.contains(port) {
            return Err(EngineError::EngineOnUsualPort {
                kind,
                usual: *port,
                moved: crate::moved_port(kind),
            });
        }
        out.push((
            *product,
            EngineConfig {
                kind,
                base_url: EngineUrl::http(host, *port),
                slots: None,
            },
        ));
    }
    Ok(out)
}

/// The line said when no engine answers: what was looked at and what to run.
pub fn nothing_found_hint(ports: &[u16], awaited: u16) -> String {
    let looked = ports
        .iter()
        .map(|p| match WELL_KNOWN_PORTS.iter().find(|(q, _)| q == p) {
            Some((_, who)) => format!("{p} ({who})"),
            None => p.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "no engine found on this machine's loopback (looked at {looked}); start one behind pair, \
         e.g. {} or {}, or name it with --engine KIND=URL. Waiting for Ollama on 127.0.0.1:{awaited}",
        crate::move_hint(EngineKind::Ollama, "127.0.0.1", 11435),
        crate::move_hint(EngineKind::LmStudio, "127.0.0.1", 1235),
    )
}

/// Asks every port at once what listens there (each request under
/// `timeout`), in the order given.
pub async fn scan(
    host: &str,
    ports: &[u16],
    timeout: Duration,
) -> Result<Vec<(u16, Finding)>, EngineError> {
    let client = http_client(timeout)?;
    let mut set = tokio::task::JoinSet::new();
    for (i, &port) in ports.iter().enumerate() {
        let client = client.clone();
        let base = EngineUrl::http(host, port);
        set.spawn(async move { (i, port, ask(&client, &base).await) });
    }
    let mut out = Vec::with_capacity(ports.len());
    while let Some(joined) = set.join_next().await {
        if let Ok(row) = joined {
            out.push(row);
        }
    }
    out.sort_by_key(|&(i, _, _)| i);
    Ok(out.into_iter().map(|(_, p, f)| (p, f)).collect())
}

/// The identifying requests for one port, stopping as soon as the answer
/// is known (a port that refuses the first connection is free).
async fn ask(client: &reqwest::Client, base: &EngineUrl) -> Finding {
    let get = |path: &'static str| get_body(client, base.join(path));
    let pair_status = match get("/_pair/status").await {
        Err(ProbeFailure::Refused) => return Finding::Free,
        r => r.ok(),
    };
    let mut a = Answers {
        pair_status: pair_status.as_deref(),
        ..Answers::default()
    };
    if let Finding::PairNode = identify(&a) {
        return Finding::PairNode;
    }
    let version = get("/api/version").await.ok();
    a.ollama_version = version.as_deref();
    if a.ollama_version
        .is_some_and(|b| parse_ollama_version(b).is_ok())
    {
        let tags = get("/api/tags").await.ok();
        a.ollama_tags = tags.as_deref();
        return identify(&a);
    }
    let v1 = get("/api/v1/models").await.ok();
    let v0 = match &v1 {
        Some(b) if parse_lmstudio_v1(b).is_ok() => None,
        _ => get("/api/v0/models").await.ok(),
    };
    a.lmstudio_v1 = v1.as_deref();
    a.lmstudio_v0 = v0.as_deref();
    let openai = get("/v1/models").await.ok();
    a.openai_models = openai.as_deref();
    identify(&a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLLAMA_VERSION: &[u8] = br#"{"version":"0.12.3"}"#;
    const OLLAMA_TAGS: &[u8] =
        br#"{"models":[{"name":"llama3.2:3b","model":"llama3.2:3b","size":2019393189}]}"#;
    const LMS_V0: &[u8] = br#"{"object":"list","data":[{"id":"qwen2.5-7b-instruct","object":"model","type":"llm","state":"loaded"}]}"#;

    fn openai(owner: &str) -> Vec<u8> {
        format!(
            r#"{{"object":"list","data":[{{"id":"m","object":"model","owned_by":"{owner}"}}]}}"#
        )
        .into_bytes()
    }

    fn product(a: &Answers<'_>) -> Option<Product> {
        match identify(a) {
            Finding::Engine { product, .. } => Some(product),
            _ => None,
        }
    }

    #[test]
    fn engines_are_named_by_their_answers() {
        let ollama = Answers {
            ollama_version: Some(OLLAMA_VERSION),
            ollama_tags: Some(OLLAMA_TAGS),
            // Ollama serves /v1/models too: its own route wins.
            openai_models: Some(&openai("library")),
            ..Answers::default()
        };
        match identify(&ollama) {
            Finding::Engine { product, models } => {
                assert_eq!(product, Product::Ollama);
                assert_eq!(models[0].name.as_str(), "llama3.2:3b");
            }
            other => panic!("{other:?}"),
        }
        let lms = Answers {
            lmstudio_v0: Some(LMS_V0),
            openai_models: Some(&openai("organization_owner")),
            ..Answers::default()
        };
        assert_eq!(product(&lms), Some(Product::LmStudio));
        for (owner, want) in [
            ("llamacpp", Product::LlamaCpp),
            ("vllm", Product::Vllm),
            ("sglang", Product::Sglang),
            ("me", Product::LlamaCppPython),
            ("someone", Product::OpenAiCompat),
        ] {
            let body = openai(owner);
            let a = Answers {
                openai_models: Some(&body),
                ..Answers::default()
            };
            assert_eq!(product(&a), Some(want), "{owner}");
            assert_eq!(want.kind(), EngineKind::OpenAiCompat);
        }
    }

    #[test]
    fn what_is_not_an_engine_is_not_taken_for_one() {
        let pair = br#"{"id":"x","name":"n","fingerprint":"ab cd","cluster_addr":"0.0.0.0:14318"}"#;
        let a = Answers {
            pair_status: Some(pair),
            ollama_version: Some(OLLAMA_VERSION),
            ..Answers::default()
        };
        assert_eq!(identify(&a), Finding::PairNode);
        // A web server answering JSON of another shape on every route.
        let a = Answers {
            pair_status: Some(b"{}"),
            ollama_version: Some(br#"{"ok":true}"#),
            lmstudio_v0: Some(b"<html>"),
            openai_models: Some(br#"{"data":"nope"}"#),
            ..Answers::default()
        };
        assert_eq!(identify(&a), Finding::Other);
        assert_eq!(identify(&Answers::default()), Finding::Other);
    }

    #[test]
    fn every_engine_found_is_adopted_unless_it_holds_a_face_port() {
        let engine = |product| Finding::Engine {
            product,
            models: Vec::new(),
        };
        let found = [
            (11434, Finding::Free),
            (11435, engine(Product::Ollama)),
            (1235, engine(Product::LmStudio)),
            (8080, engine(Product::LlamaCpp)),
            (8000, Finding::Other),
            (30000, Finding::PairNode),
        ];
        let plan = plan_found("127.0.0.1", &found, &[11434, 1234]).unwrap();
        let got: Vec<_> = plan
            .iter()
            .map(|(p, e)| (*p, e.kind, e.base_url.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    Product::Ollama,
                    EngineKind::Ollama,
                    "http://127.0.0.1:11435".to_owned()
                ),
                (
                    Product::LmStudio,
                    EngineKind::LmStudio,
                    "http://127.0.0.1:1235".to_owned()
                ),
                (
                    Product::LlamaCpp,
                    EngineKind::OpenAiCompat,
                    "http://127.0.0.1:8080".to_owned()
                ),
            ]
        );
        let held = [(1234, engine(Product::LmStudio))];
        let msg = plan_found("127.0.0.1", &held, &[11434, 1234])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("lms server start --port 1235"), "{msg}");
        assert!(msg.contains("127.0.0.1:1234"), "{msg}");
        let held = [(11434, engine(Product::Ollama))];
        let msg = plan_found("127.0.0.1", &held, &[11434, 1234])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("OLLAMA_HOST=127.0.0.1:11435 ollama serve"),
            "{msg}"
        );
        // With the faces elsewhere, the usual ports are just engines.
        assert_eq!(
            plan_found("127.0.0.1", &held, &[21434, 2234])
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn nothing_found_says_what_was_looked_at_and_what_to_run() {
        let line = nothing_found_hint(&well_known_ports(), 11435);
        assert!(!line.contains('\n'));
        for needle in [
            "11434 (Ollama)",
            "8000 (vLLM)",
            "30000 (SGLang)",
            "OLLAMA_HOST=127.0.0.1:11435 ollama serve",
            "lms server start --port 1235",
            "--engine KIND=URL",
            "Waiting for Ollama on 127.0.0.1:11435",
        ] {
            assert!(line.contains(needle), "{needle}: {line}");
        }
        assert!(nothing_found_hint(&[40001], 40001).contains("looked at 40001)"));
    }
}
