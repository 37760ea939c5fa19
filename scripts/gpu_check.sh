#!/usr/bin/env bash
# The GPU check, one command of at most 8 minutes on a machine with CUDA:
#   1. the tests that exercise CUDA (the Triton kernels of the Delta update, the folded
#      Transformer step in bfloat16, the CUDA benchmark's rows),
#   2. `ddl-dyn bench --parts cuda` (the operator, training steps and a small suite on CUDA
#      in bfloat16),
#   3. a five-minute study, experiments/transformer-gpu.toml (width 256, 8 blocks, var-chain
#      hops up to 8, bf16 autocast), then its report.
# Everything it writes goes under $OUT (default runs/gpu-check): one log per part, the
# benchmark's JSON, the study's run folder and report. Each part has its own time limit, so
# that one part running long cannot take the others' time; a part that fails or runs out is
# named at the end, and the script exits non-zero.
#
#   scripts/gpu_check.sh            # PYTHON=... to choose the interpreter
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu-check}"
PYTHON="${PYTHON:-python}"
mkdir -p "$OUT"
failed=()

if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: CUDA is not available to $PYTHON; this check needs a GPU" >&2
    exit 2
fi
{ nvidia-smi; "$PYTHON" -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
    > "$OUT/device.txt" 2>&1

part() {  # part NAME SECONDS COMMAND...: run COMMAND under a limit, its output in OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "gpu_check: $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

part tests 70 "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/test_operator.py tests/test_transformer.py tests/test_bench_*.py -k "triton or cuda"
part bench 95 "$PYTHON" -m ddl_dynamics.cli bench --parts cuda --only task=overwrite \
    --seeds 0 --repeats 5 --output "$OUT/bench.json"
part study 280 "$PYTHON" -m ddl_dynamics.cli run experiments/transformer-gpu.toml \
    --device cuda --jobs 2 --run-dir "$OUT/transformer-gpu"
part report 20 "$PYTHON" -m ddl_dynamics.cli report "$OUT/transformer-gpu" \
    --output "$OUT/transformer-gpu.md"

tail -n 5 "$OUT"/*.log
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: failed: ${failed[*]}" >&2
    exit 1
fi
echo "gpu_check: all parts passed; outputs in $OUT"
