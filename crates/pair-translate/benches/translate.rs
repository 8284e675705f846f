//! What translation costs a streamed answer: CPU per engine chunk turned
//! into the client's shape (an Ollama line, an Anthropic event), and for
//! the request itself.
//!
//! `cargo bench -p pair-translate --bench translate -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use pair_translate::{Route, Timing};

const CHUNK: &[u8] = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"llama3.2:3b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";

fn bench(c: &mut Criterion) {
    let ollama_req = br#"{"model":"llama3.2:3b","messages":[{"role":"user","content":"Why is the sky blue?"}],"options":{"num_predict":128,"temperature":0.7}}"#;
    let anthropic_req = br#"{"model":"llama3.2:3b","max_tokens":128,"stream":true,"system":"be brief","messages":[{"role":"user","content":"Why is the sky blue?"}]}"#;
    let responses_req = br#"{"model":"llama3.2:3b","max_output_tokens":128,"stream":true,"instructions":"be brief","input":"Why is the sky blue?","store":false}"#;
    c.bench_function("request ollama chat", |b| {
        b.iter(|| {
            pair_translate::request(Route::OllamaChat, ollama_req, "2026-12-03T12:00:00Z").unwrap()
        })
    });
    c.bench_function("request anthropic messages", |b| {
        b.iter(|| {
            pair_translate::request(
                Route::AnthropicMessages,
                anthropic_req,
                "2026-12-03T12:00:00Z",
            )
            .unwrap()
        })
    });
    c.bench_function("request responses", |b| {
        b.iter(|| {
            pair_translate::request(
                Route::OpenAiResponses,
                responses_req,
                "2026-12-03T12:00:00Z",
            )
            .unwrap()
        })
    });
    for (name, route, req) in [
        (
            "chunk responses",
            Route::OpenAiResponses,
            &responses_req[..],
        ),
        ("chunk ollama chat", Route::OllamaChat, &ollama_req[..]),
        (
            "chunk anthropic messages",
            Route::AnthropicMessages,
            &anthropic_req[..],
        ),
    ] {
        let mut t = pair_translate::request(route, req, "2026-12-03T12:00:00Z").unwrap();
        let mut out = Vec::with_capacity(4096);
        c.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                t.answer.push(CHUNK, Timing::default(), &mut out);
                assert!(!out.is_empty());
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
