#!/usr/bin/env bash
# Byte-identity check for refactors: short runs covering dense + MoE, fp32 + bf16, noise, quant,
# TP, routing replay, bypass + a remedy, align and diagnose. Run before and after a change and compare:
#   bench/refactor/byte_check.sh /tmp/before && (after the change) bench/refactor/byte_check.sh /tmp/after
#   diff -r /tmp/before /tmp/after   # (timing.jsonl excluded: wall-clock)
set -euo pipefail
OUT=${1:?usage: byte_check.sh OUTDIR}
TB=${TB:-.venv/bin/timbench}
mkdir -p "$OUT"
common=(--quiet --set steps=3 --set prompts_per_step=4 --set group_size=4 --set mini_batches=2
        --set eval_every=3 --set eval_n=16 --set checkpoint_every=3)
run() { local name=$1; shift; "$TB" train "${common[@]}" --out "$OUT/$name" "$@" >/dev/null; rm -f "$OUT/$name"/timing.jsonl; }
run dense-base --set preset=tiny-dense
run dense-bf16 --set preset=tiny-dense --set engine.dtype=bf16
run dense-noise-bypass-tis --set preset=tiny-dense --set engine.noise=gaussian:1 --set mode=bypass --remedy tis_token
run dense-fp8 --set preset=tiny-dense --set engine.weight_quant=fp8_block --set engine.act_quant=fp8_block
run dense-nvfp4-tp --set preset=tiny-dense --set engine.weight_quant=nvfp4 --set engine.tp=2 --set engine.kernels=torch
run moe-base --set preset=tiny-moe
run moe-bf16-r3 --set preset=tiny-moe --set engine.dtype=bf16 --set engine.router_noise=0.1 --remedy routing_replay_r3
"$TB" align --table bench/refactor/align_small.yaml --out "$OUT/align" >/dev/null
"$TB" diagnose --model tiny-dense --engine kernels=torch,dtype=bf16 --json > "$OUT/diagnose.json"
"$TB" diagnose --model tiny-moe --engine dtype=bf16,router_noise=0.1,kv_cache_dtype=fp8 --json > "$OUT/diagnose-moe.json"
echo "byte_check: wrote $OUT"
# warm start: 6 SFT steps, probe evals every 2 steps (card.json without its wall time)
"$TB" warmstart --task add-3d-v1 --model tiny-dense --out "$OUT/warmstart" --max-steps 6 --eval-every 2 \
    --band 0,1 --eval-n 16 --batch-size 8 --no-progress >/dev/null
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c.pop('wall_time_s'); json.dump(c, open(sys.argv[1],'w'), indent=1)" \
    "$OUT/warmstart/card.json"
