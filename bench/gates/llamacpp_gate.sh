#!/usr/bin/env bash
# A second server implementation gated over HTTP: llama.cpp's, through llama-cpp-python's OpenAI server
# (docs/gate-your-stack.md, "Second server: llama.cpp"). End to end, from the package registry only:
#   bash bench/gates/llamacpp_gate.sh [OUT]          (OUT default results/gates/http/llama-cpp-python-0.3.16)
#   LLAMACPP_SERVER_FLAGS="--type_k 0 --type_v 0" bash bench/gates/llamacpp_gate.sh OUT   (an F32 KV cache)
#   bash bench/gates/llamacpp_gate.sh --setup-only    (install and convert only: `make test-llamacpp`)
# 1. build/venv-llamacpp: llama-cpp-python==0.3.16[server] built from its sdist for a plain CPU (no BLAS, no
#    -march=native), niced (~12 min on 2 busy cores); the sdist is kept under build/llamacpp/ for step 3.
# 2. build/venv-gguf-convert: the converter's own import (mistral-common), with torch and transformers from .venv.
# 3. the shipped tiny dense checkpoint to F32 GGUF with the sdist's vendor/llama.cpp/convert_hf_to_gguf.py
#    (bench/gates/llamacpp_convert.py: what timbench's character tokenizer needs from it).
# 4. the server started as users start it (python -m llama_cpp.server --model X.gguf --host 127.0.0.1 --port P,
#    --n_ctx 256: the checkpoint's context), on a free loopback port with a generated key (API_KEY in its
#    environment, not on a command line); then `timbench gate run --suite smoke`; the server is torn down
#    whatever happens. OUT/server.txt records the server's command line, package versions and build flags.
# Exit 0 when the gate ran (pass or fail: its verdict is gate.json), 2 when something could not be set up or run.
set -u -o pipefail
cd "$(dirname "$0")/../.."
VERSION=0.3.16
CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF"
venv=build/venv-llamacpp conv=build/venv-gguf-convert work=build/llamacpp
sdist=$work/sdist/llama_cpp_python-$VERSION.tar.gz src=$work/src/llama_cpp_python-$VERSION
ckpt=timbench/assets/checkpoints/add-4d-v1-tiny-dense gguf=$work/add-4d-v1-tiny-dense-f32.gguf
out=${1:-results/gates/http/llama-cpp-python-$VERSION}
mkdir -p "$work"
die() { echo "llamacpp_gate: $*" >&2; exit 2; }

if [ ! -f "$venv/.installed" ]; then
  echo "llamacpp_gate: building llama-cpp-python==$VERSION into $venv (log $work/build.log)" >&2
  start=$(date +%s)
  { python3 -m venv "$venv" && "$venv/bin/pip" download -q "llama-cpp-python==$VERSION" --no-deps -d "$work/sdist" &&
    CMAKE_ARGS="$CMAKE_FLAGS" nice -n 10 "$venv/bin/pip" install "$sdist[server]"; } > "$work/build.log" 2>&1 ||
    die "pip install llama-cpp-python==$VERSION failed: $(grep -E 'error|Error' "$work/build.log" | tail -n 1)"
  echo "llamacpp_gate: built in $(( $(date +%s) - start )) s" >&2
  touch "$venv/.installed"
fi
[ -f "$sdist" ] || "$venv/bin/pip" download -q "llama-cpp-python==$VERSION" --no-deps -d "$work/sdist" ||
  die "pip download llama-cpp-python==$VERSION failed"
[ -d "$src" ] || { mkdir -p "$work/src" && tar xzf "$sdist" -C "$work/src"; } || die "cannot unpack $sdist"
if [ ! -f "$conv/.installed" ]; then
  { python3 -m venv "$conv" && "$conv/bin/pip" install -q "mistral-common==1.8.3"; } > "$work/convert-venv.log" 2>&1 ||
    die "the converter's venv: $(tail -n 1 "$work/convert-venv.log")"
  # torch, transformers, numpy's peers from timbench's own venv, after the converter venv's packages
  "$conv/bin/python" -c "import site; print(site.getsitepackages()[0])" | xargs -I{} sh -c \
    "echo '$PWD/.venv/lib/python3.11/site-packages' > {}/zz-timbench-venv.pth"
  touch "$conv/.installed"
fi
if [ ! -f "$gguf" ] || [ "$gguf" -ot bench/gates/llamacpp_convert.py ]; then
  "$conv/bin/python" bench/gates/llamacpp_convert.py "$src/vendor/llama.cpp" "$ckpt" "$gguf" > "$work/convert.log" 2>&1 ||
    die "convert_hf_to_gguf failed: $(grep -E 'Error|error' "$work/convert.log" | tail -n 1)"
fi
[ "${1:-}" = "--setup-only" ] && { echo "llamacpp_gate: set up: $venv, $gguf" >&2; exit 0; }

port=$(.venv/bin/python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
key=$(.venv/bin/python -c "import secrets; print(secrets.token_hex(16))")
# shellcheck disable=SC2086  # LLAMACPP_SERVER_FLAGS is a list of flags
server_cmd=("$venv/bin/python" -m llama_cpp.server --model "$gguf" --host 127.0.0.1 --port "$port" --n_ctx 256
  ${LLAMACPP_SERVER_FLAGS:-})
API_KEY=$key setsid "${server_cmd[@]}" > "$work/server.log" 2>&1 &
pid=$!
trap 'kill -TERM -- -$pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
url=http://127.0.0.1:$port
for _ in $(seq 300); do  # the server has no /health: ready when /v1/models answers
  curl -sf -H "Authorization: Bearer $key" "$url/v1/models" > /dev/null && break
  kill -0 $pid 2>/dev/null || die "the server exited while starting: $(tail -n 3 "$work/server.log")"
  sleep 1
done
curl -sf -H "Authorization: Bearer $key" "$url/v1/models" > /dev/null || die "the server did not answer in 300 s"
mkdir -p "$out"
start=$(date +%s)
OPENAI_API_KEY=$key .venv/bin/timbench gate run --engine "openai=$url" --trainer "hf=$ckpt" --suite smoke --out "$out"
rc=$?
wall=$(( $(date +%s) - start ))
{
  echo "server: ${server_cmd[*]}" | sed "s|--port $port|--port PORT|; s|$PWD/||g"
  echo "server environment: API_KEY=<generated>"
  echo "llama-cpp-python $VERSION from its PyPI sdist, CMAKE_ARGS=\"$CMAKE_FLAGS\""
  echo "llama.cpp (vendored): commit $(grep -o 'GGML_COMMIT=[^ ]*' "$work/build.log" | head -n 1 | cut -d= -f2 | tr -dc '0-9a-f')"
  echo "gguf: bench/gates/llamacpp_convert.py (vendor/llama.cpp/convert_hf_to_gguf.py, --outtype f32) of $ckpt"
  echo "gate: timbench gate run --suite smoke, exit $rc, ${wall} s wall on $(nproc) cores (load $(cut -d' ' -f1-3 /proc/loadavg))"
} > "$out/server.txt"
"$venv/bin/pip" freeze > "$out/pip-freeze.txt"
echo "llamacpp_gate: gated in $wall s, exit $rc ($out/gate.md)" >&2
[ "$rc" -le 1 ] || exit 2
