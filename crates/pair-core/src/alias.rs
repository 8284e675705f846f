//! Model aliases: a name a tool asks for (`claude-sonnet-4-5`, `gpt-5`)
//! that no engine holds, sent to a model one does. A pattern is an exact
//! name or has `*` standing for any run of characters (`claude-*`);
//! names compare without regard to ASCII case, as Ollama compares them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{CoreError, ModelName};

/// `PATTERN=TARGET[@PRIORITY]`: requests for a model matching `pattern`
/// go to `target`, of class `priority` unless they say otherwise
/// (`claude-*=qwen2.5:7b@batch` marks an agent farm as batch work).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelAlias {
    pub pattern: String,
    pub target: ModelName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<crate::Priority>,
}

impl ModelAlias {
    /// Whether a request for `requested` is one for this alias.
    pub fn matches(&self, requested: &str) -> bool {
        glob(self.pattern.as_bytes(), requested.as_bytes())
    }

    /// An exact name, not a pattern (exact aliases are tried first).
    pub fn is_exact(&self) -> bool {
        !self.pattern.contains('*')
    }
}

impl FromStr for ModelAlias {
    type Err = CoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| CoreError::BadAlias {
            input: s.to_owned(),
            reason,
        };
        let (pattern, target) = s
            .split_once('=')
            .ok_or_else(|| bad("expected PATTERN=MODEL, e.g. 'claude-*=qwen2.5:7b'"))?;
        let (pattern, target) = (pattern.trim(), target.trim());
        let (target, priority) = match target.rsplit_once('@') {
            Some((t, p)) => match crate::Priority::parse(p) {
                Some(p) => (t.trim(), Some(p)),
                None => return Err(bad("after '@' comes a priority: interactive or batch")),
            },
            None => (target, None),
        };
        if pattern.is_empty() || pattern.chars().all(|c| c == '*') {
            return Err(bad("the pattern must name something besides '*'"));
        }
        if pattern.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("the pattern has spaces or control characters"));
        }
        if target.contains('*') {
            return Err(bad("the target is a model name, not a pattern"));
        }
        let target = ModelName::new(target).map_err(|_| bad("the target is not a model name"))?;
        if glob(pattern.as_bytes(), target.as_str().as_bytes()) {
            return Err(bad("the target matches its own pattern"));
        }
        Ok(Self {
            pattern: pattern.to_owned(),
            target,
            priority,
        })
    }
}

impl fmt::Display for ModelAlias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.pattern, self.target.as_str())?;
        match self.priority {
            Some(p) => write!(f, "@{}", p.as_str()),
            None => Ok(()),
        }
    }
}

/// The alias for `requested` in `aliases`: an exact one first, then the
/// first pattern that matches, in the order given.
pub fn find<'a>(aliases: &'a [ModelAlias], requested: &str) -> Option<&'a ModelAlias> {
    aliases
        .iter()
        .find(|a| a.is_exact() && a.matches(requested))
        .or_else(|| aliases.iter().find(|a| a.matches(requested)))
}

/// Whether model name `name` matches `pattern`, the one model-name pattern
/// rule (aliases, API keys' models): `*` matches any run of characters,
/// everything else itself, ASCII case ignored.
pub fn matches(pattern: &str, name: &str) -> bool {
    glob(pattern.as_bytes(), name.as_bytes())
}

/// `*` matches any run of bytes; everything else one byte, ASCII case
/// ignored. Linear in practice: the last star is the only backtrack point.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(c) if c.eq_ignore_ascii_case(&name[n]) => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn alias(s: &str) -> ModelAlias {
        s.parse().unwrap()
    }

    #[test]
    fn exact_names_and_star_patterns() {
        let a = alias("claude-*=qwen2.5:7b");
        assert!(a.matches("claude-sonnet-4-5-20250929"));
        assert!(a.matches("Claude-Haiku"));
        assert!(!a.matches("qwen2.5:7b"));
        assert!(!a.matches("my-claude-x"));
        assert!(alias("*-mini=m").matches("gpt-5-mini"));
        assert!(alias("gpt-*-codex*=m").matches("gpt-5.1-codex-max"));
        assert!(!alias("gpt-*-codex*=m").matches("gpt-5.1"));
        assert_eq!(a.to_string(), "claude-*=qwen2.5:7b");
        assert_eq!(a.priority, None);
    }

    #[test]
    fn an_alias_may_name_its_requests_priority() {
        let farm = alias("farm-*=qwen2.5:7b@batch");
        assert_eq!(farm.target.as_str(), "qwen2.5:7b");
        assert_eq!(farm.priority, Some(crate::Priority::Batch));
        assert_eq!(farm.to_string(), "farm-*=qwen2.5:7b@batch");
        assert_eq!(alias(&farm.to_string()), farm);
        assert_eq!(
            alias("x=m @ High").priority,
            Some(crate::Priority::Interactive)
        );
        let e = "x=m@urgent".parse::<ModelAlias>().unwrap_err();
        assert!(e.to_string().contains("priority"), "{e}");
    }

    #[test]
    fn an_exact_alias_wins_over_an_earlier_pattern() {
        let list = [alias("claude-*=big"), alias("claude-haiku-4-5=small")];
        assert_eq!(
            find(&list, "claude-haiku-4-5").unwrap().target.as_str(),
            "small"
        );
        assert_eq!(find(&list, "claude-opus").unwrap().target.as_str(), "big");
        assert!(find(&list, "llama3").is_none());
    }

    #[test]
    fn bad_aliases_say_why() {
        for bad in [
            "claude",
            "=m",
            "*=m",
            "a b=m",
            "x=",
            "x=a*",
            "qwen*=qwen2.5",
        ] {
            let e = bad.parse::<ModelAlias>().unwrap_err();
            assert!(matches!(e, CoreError::BadAlias { .. }), "{bad}: {e}");
        }
    }

    /// The simple recursive definition the loop is held to.
    fn glob_spec(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => glob_spec(&p[1..], n) || (!n.is_empty() && glob_spec(p, &n[1..])),
            (Some(c), Some(d)) if c.eq_ignore_ascii_case(d) => glob_spec(&p[1..], &n[1..]),
            _ => false,
        }
    }

    proptest! {
        #[test]
        fn the_matcher_agrees_with_the_definition(p in "[ab*]{0,8}", n in "[abAB]{0,10}") {
            prop_assert_eq!(glob(p.as_bytes(), n.as_bytes()), glob_spec(p.as_bytes(), n.as_bytes()));
        }
    }
}
