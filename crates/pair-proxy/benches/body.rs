//! Criterion benchmarks of reading a request body's routing fields
//! (`pair_proxy::body::extract`) against serde_json skipping the same
//! document (`IgnoredAny`: the least a serde_json reading of it costs),
//! for a small chat request, a multi-turn one and a long agent context;
//! and naming a chat's conversation (`pair_proxy::conversation::of`, read
//! besides for a policy that keeps sessions).
//! The figures and the command are in BENCHMARKS.md.

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pair_core::ApiFlavor;
use pair_proxy::body::extract;
use pair_proxy::route::Work;

/// A chat body with `turns` messages of `line` repeated `reps` times.
fn chat(turns: usize, line: &str, reps: usize) -> Vec<u8> {
    let content = line.repeat(reps);
    let messages: Vec<String> = (0..turns)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            format!(r#"{{"role":"{role}","content":"{content}"}}"#)
        })
        .collect();
    format!(
        r#"{{"messages":[{}],"model":"qwen2.5:7b","stream":true,"max_tokens":256}}"#,
        messages.join(",")
    )
    .into_bytes()
}

fn bodies(c: &mut Criterion) {
    let line = r#"Explain the \"borrow checker\" again,\n with an example: fn f(x: &mut i32) {} "#;
    let cases = [
        (
            "small",
            br#"{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":16}"#
                .to_vec(),
        ),
        ("multi-turn-4k", chat(8, line, 6)),
        ("agent-1m", chat(40, line, 330)),
    ];
    let mut group = c.benchmark_group("body");
    for (name, body) in &cases {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("extract", name), body, |b, body| {
            b.iter(|| extract(black_box(body), ApiFlavor::OpenAi, Work::Generate).unwrap());
        });
        group.bench_with_input(BenchmarkId::new("conversation", name), body, |b, body| {
            b.iter(|| pair_proxy::conversation::of(black_box(body)).unwrap());
        });
        group.bench_with_input(
            BenchmarkId::new("serde_json-skip", name),
            body,
            |b, body| {
                b.iter(|| {
                    serde_json::from_slice::<serde::de::IgnoredAny>(black_box(body)).unwrap()
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bodies);
criterion_main!(benches);
