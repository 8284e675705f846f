//! Test binaries without libtest's harness (`harness = false`: a heap
//! check, a namespace scenario, a bench's smoke run) answer the part of
//! libtest's command line that `cargo test` and cargo nextest use: the
//! terse list (`--list`, with `--ignored` for the ignored ones) and a name
//! filter.

/// Whether the one test this binary holds, `name`, is to run now. A list
/// request is answered here (`NAME: test`; none is ignored), and is not a
/// run; nor is a filter `name` does not contain.
pub fn wanted(name: &str) -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("{name}: test");
        }
        return false;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}
