//! Splitting `--engine-cmd` into a program and its arguments, as the OS's
//! own programs would: POSIX shell quoting on Unix, the Windows C runtime's
//! rules on Windows (where `\` is a path separator, not an escape). No
//! expansion and no shell on either.

use crate::Os;

/// Why a command line does not split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error("unbalanced quote")]
    UnbalancedQuote,
    #[error("ends with a backslash")]
    TrailingBackslash,
    #[error("empty command")]
    Empty,
}

/// `line`'s words as `os` splits them; the first is the program.
pub fn split_command_line(os: Os, line: &str) -> Result<Vec<String>, SplitError> {
    let words = match os {
        Os::Linux | Os::MacOs => split_unix(line)?,
        Os::Windows => split_windows(line),
    };
    match words.first() {
        Some(program) if !program.is_empty() => Ok(words),
        _ => Err(SplitError::Empty),
    }
}

/// Whitespace separates words; single quotes keep everything; double
/// quotes keep everything but `\`, which escapes the next character, as it
/// does outside quotes.
pub fn split_unix(input: &str) -> Result<Vec<String>, SplitError> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = input.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') | (Some('"'), '"') => quote = None,
            (Some('"') | None, '\\') => {
                let next = chars.next().ok_or(SplitError::TrailingBackslash)?;
                cur.push(next);
                in_word = true;
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(SplitError::UnbalancedQuote);
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// One argument quoted for the Windows C runtime, so [`split_windows`]
/// gives it back: bare when it holds no space, tab or quote (and is not
/// empty); otherwise in quotes, backslashes before a quote doubled and the
/// quote escaped.
pub fn quote_windows(word: &str) -> String {
    if !word.is_empty() && !word.contains([' ', '\t', '"']) {
        return word.to_owned();
    }
    let mut out = String::from("\"");
    let mut backslashes = 0;
    for c in word.chars() {
        if c == '\\' {
            backslashes += 1;
            continue;
        }
        let n = if c == '"' {
            backslashes * 2 + 1
        } else {
            backslashes
        };
        out.extend(std::iter::repeat_n('\\', n));
        out.push(c);
        backslashes = 0;
    }
    out.extend(std::iter::repeat_n('\\', backslashes * 2));
    out.push('"');
    out
}

/// The rules of `CommandLineToArgvW` and the Microsoft C runtime (2008 and
/// later): spaces and tabs separate arguments; `"` starts and ends a quoted
/// part; `2n` backslashes before a `"` are `n` backslashes and the quote
/// acts, `2n + 1` are `n` and a literal `"`; backslashes anywhere else are
/// themselves (`C:\models\x.gguf` stays as written); `""` inside quotes is
/// one `"`. The program name (the first word) takes quotes only, no
/// backslash rule. A quote left open runs to the end, as on Windows.
pub fn split_windows(input: &str) -> Vec<String> {
    let chars: Vec<char> = input.chars().collect();
    let is_space = |c: char| c == ' ' || c == '\t';
    let mut words = Vec::new();
    let mut i = 0;
    while i < chars.len() && is_space(chars[i]) {
        i += 1;
    }
    if i == chars.len() {
        return words;
    }
    // The program name.
    let mut program = String::new();
    let mut quoted = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            quoted = !quoted;
        } else if is_space(c) && !quoted {
            break;
        } else {
            program.push(c);
        }
        i += 1;
    }
    words.push(program);
    // The arguments.
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    loop {
        while !in_word && i < chars.len() && is_space(chars[i]) {
            i += 1;
        }
        if i >= chars.len() {
            break;
        }
        let c = chars[i];
        if c == '\\' {
            let start = i;
            while i < chars.len() && chars[i] == '\\' {
                i += 1;
            }
            let n = i - start;
            if i < chars.len() && chars[i] == '"' {
                cur.extend(std::iter::repeat_n('\\', n / 2));
                if n % 2 == 1 {
                    cur.push('"');
                    i += 1;
                }
            } else {
                cur.extend(std::iter::repeat_n('\\', n));
            }
            in_word = true;
        } else if c == '"' {
            if quoted && chars.get(i + 1) == Some(&'"') {
                cur.push('"');
                i += 2;
            } else {
                quoted = !quoted;
                i += 1;
            }
            in_word = true;
        } else if is_space(c) && !quoted {
            words.push(std::mem::take(&mut cur));
            in_word = false;
            i += 1;
        } else {
            cur.push(c);
            in_word = true;
            i += 1;
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn unix_splits_like_a_shell_without_expansion() {
        for os in [Os::Linux, Os::MacOs] {
            assert_eq!(
                split_command_line(
                    os,
                    r#"  llama-server -m "/models/my model.gguf" --alias 'a b' x\ y "#
                )
                .unwrap(),
                w(&[
                    "llama-server",
                    "-m",
                    "/models/my model.gguf",
                    "--alias",
                    "a b",
                    "x y"
                ])
            );
            assert_eq!(
                split_command_line(os, "a 'b"),
                Err(SplitError::UnbalancedQuote)
            );
            assert_eq!(
                split_command_line(os, "a \\"),
                Err(SplitError::TrailingBackslash)
            );
            assert_eq!(split_command_line(os, "   "), Err(SplitError::Empty));
            assert_eq!(split_command_line(os, "''"), Err(SplitError::Empty));
        }
    }

    #[test]
    fn windows_keeps_backslashes_in_paths_and_follows_the_c_runtime() {
        let os = Os::Windows;
        assert_eq!(
            split_command_line(
                os,
                r#"C:\Tools\llama-server.exe -m C:\models\qwen.gguf --port {port}"#
            )
            .unwrap(),
            w(&[
                "C:\\Tools\\llama-server.exe",
                "-m",
                "C:\\models\\qwen.gguf",
                "--port",
                "{port}"
            ])
        );
        assert_eq!(
            split_command_line(
                os,
                r#""C:\Program Files\Ollama\ollama.exe" serve --dir "D:\my models\""#
            )
            .unwrap(),
            // `\"` at the end is a literal quote by the C runtime's rule, and
            // the quoted part then runs to the end.
            w(&[
                "C:\\Program Files\\Ollama\\ollama.exe",
                "serve",
                "--dir",
                "D:\\my models\""
            ])
        );
        assert_eq!(
            split_command_line(os, r#"x "D:\my models\\" next"#).unwrap(),
            w(&["x", "D:\\my models\\", "next"])
        );
        // The examples of Microsoft's "Parsing C command-line arguments".
        assert_eq!(
            split_command_line(os, r#"p "a b c" d e"#).unwrap(),
            w(&["p", "a b c", "d", "e"])
        );
        assert_eq!(
            split_command_line(os, r#"p "ab\"c" "\\" d"#).unwrap(),
            w(&["p", "ab\"c", "\\", "d"])
        );
        assert_eq!(
            split_command_line(os, r#"p a\\\b d"e f"g h"#).unwrap(),
            w(&["p", "a\\\\\\b", "de fg", "h"])
        );
        assert_eq!(
            split_command_line(os, r#"p a\\\"b c d"#).unwrap(),
            w(&["p", "a\\\"b", "c", "d"])
        );
        assert_eq!(
            split_command_line(os, r#"p a\\\\"b c" d e"#).unwrap(),
            w(&["p", "a\\\\b c", "d", "e"])
        );
        assert_eq!(
            split_command_line(os, r#"p a"b"" c d"#).unwrap(),
            w(&["p", "ab\" c d"])
        );
        // Single quotes are ordinary characters there; empty quotes an
        // empty argument.
        assert_eq!(
            split_command_line(os, r#"p 'a b' """#).unwrap(),
            w(&["p", "'a", "b'", ""])
        );
        assert_eq!(split_command_line(os, "  \t "), Err(SplitError::Empty));
        assert_eq!(split_command_line(os, r#""""#), Err(SplitError::Empty));
    }

    /// Any argv, quoted for the Windows C runtime ([`quote_windows`]: the
    /// way Rust's std quotes arguments for a Windows child), splits back to
    /// itself.
    #[test]
    fn windows_quoting_round_trips() {
        let quote = quote_windows;
        let args = [
            "",
            "a b",
            "C:\\dir\\",
            "say \"hi\"",
            "\\\\server\\share",
            "x\\\"y",
            "tab\there",
        ];
        let line = std::iter::once("prog".to_owned())
            .chain(args.iter().map(|a| quote(a)))
            .collect::<Vec<_>>()
            .join(" ");
        let got = split_command_line(Os::Windows, &line).unwrap();
        assert_eq!(got[0], "prog");
        assert_eq!(&got[1..], &args.map(str::to_owned)[..]);
    }
}
