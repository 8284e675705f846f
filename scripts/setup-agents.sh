#!/usr/bin/env bash
# Installs the real coding-agent CLIs the agent tests drive, idempotently:
#  - @anthropic-ai/claude-code (`claude`): a native binary shipped in the
#    platform optional dependency (@anthropic-ai/claude-code-linux-x64); its
#    postinstall hard-links it over bin/claude.exe.
#  - @openai/codex (`codex`): the native binary ships in the npm package
#    @openai/codex@<ver>-linux-x64 (aliased as the optional dependency
#    @openai/codex-linux-x64), under vendor/<triple>/bin/codex; nothing is
#    downloaded at install time.
# into ${PAIR_CACHE:-~/.cache/pair}/agents-claude<ver>-codex<ver>/, with .ok
# marking a finished install (built in a temp dir, then renamed into place).
# Prints nothing on a warm cache but the KEY=VALUE lines; exits non-zero on
# failure.
set -euo pipefail

CLAUDE_CODE_VER=${CLAUDE_CODE_VER:-2.1.332}
CODEX_VER=${CODEX_VER:-0.171.0}

cache=${PAIR_CACHE:-$HOME/.cache/pair}
dir="$cache/agents-claude$CLAUDE_CODE_VER-codex$CODEX_VER"

# The codex native binary for this platform, as bin/codex.js finds it.
codex_native() {
  local root=$1 triple
  case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) triple=x86_64-unknown-linux-musl ;;
    Linux-aarch64 | Linux-arm64) triple=aarch64-unknown-linux-musl ;;
    Darwin-x86_64) triple=x86_64-apple-darwin ;;
    Darwin-arm64) triple=aarch64-apple-darwin ;;
    *) echo "setup-agents: unsupported platform $(uname -s)-$(uname -m)" >&2; return 1 ;;
  esac
  local f
  for f in "$root"/node_modules/@openai/codex-*/vendor/"$triple"/bin/codex \
           "$root"/node_modules/@openai/codex/vendor/"$triple"/bin/codex; do
    if [ -x "$f" ]; then echo "$f"; return 0; fi
  done
  echo "setup-agents: no native codex binary for $triple under $root" >&2
  return 1
}

if [ ! -f "$dir/.ok" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.agents-tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # Output goes to stderr: stdout is only the KEY=VALUE lines.
  npm install --prefix "$tmp" --no-audit --no-fund --no-update-notifier \
    --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VER" "@openai/codex@$CODEX_VER" >&2
  # If the postinstall did not run (npm may skip install scripts), bin/claude.exe
  # is still the placeholder; run the package's own postinstall by hand.
  if ! "$tmp/node_modules/.bin/claude" --version >/dev/null 2>&1; then
    (cd "$tmp/node_modules/@anthropic-ai/claude-code" && node install.cjs) >&2
  fi
  # Prove both run here, offline, before caching.
  v=$("$tmp/node_modules/.bin/claude" --version)
  case "$v" in "$CLAUDE_CODE_VER"*) ;; *) echo "setup-agents: claude --version said: $v" >&2; exit 1 ;; esac
  cx=$(codex_native "$tmp")
  v=$("$cx" --version)
  case "$v" in *"$CODEX_VER"*) ;; *) echo "setup-agents: codex --version said: $v" >&2; exit 1 ;; esac
  touch "$tmp/.ok"
  chmod 755 "$tmp"
  # A half install (no .ok) left by a killed run is discarded; a finished one
  # that a concurrent run put in place first is kept.
  [ -f "$dir/.ok" ] || rm -rf "$dir"
  if mv -T "$tmp" "$dir" 2>/dev/null; then
    trap - EXIT
  elif [ ! -f "$dir/.ok" ]; then
    echo "setup-agents: could not move the install into $dir" >&2
    exit 1
  fi
fi

echo "PAIR_CLAUDE=$dir/node_modules/.bin/claude"
echo "PAIR_CODEX=$(codex_native "$dir")"
