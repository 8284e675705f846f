#!/usr/bin/env bash
# Everything CI needs on a fresh machine, idempotently: Debian packages
# (systemd's tools among them, for the service unit's check),
# cargo-deny, cargo-fuzz on the nightly toolchain (CI builds every fuzz
# target), the Python side (scripts/setup-python.sh) and the coding-agent
# CLIs (scripts/setup-agents.sh).
# (scripts/build-pgo.sh installs the llvm-profdata it needs itself.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

need=()
command -v ip >/dev/null || need+=(iproute2)
command -v chromium >/dev/null || need+=(chromium)
command -v curl >/dev/null || need+=(curl)
# `systemd-analyze verify` checks the unit `pair-node service install` writes.
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v npm >/dev/null || need+=(nodejs npm)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

if ! cargo deny --version >/dev/null 2>&1; then
  cargo install --locked cargo-deny
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi

bash "$root/scripts/setup-python.sh" >/dev/null
bash "$root/scripts/setup-agents.sh" >/dev/null
