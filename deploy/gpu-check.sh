#!/usr/bin/env bash
# The checks a lent GPU machine runs, in one prepared script (device time is scarce: each
# phase is one `run` call, with its own time limit). From the repo root, with .gpu-wheels/
# carried (deploy/gpu-wheels.sh):
#
#   bash deploy/gpu-check.sh tests     # install, the GPU, the CUDA tests, bench.gpu
#   bash deploy/gpu-check.sh pong      # rlfleet up: Pong PPO, a GPU learner, 14 collectors
#   bash deploy/gpu-check.sh algos     # install, SAC's and R2D2's CUDA tests, their update rates
#   bash deploy/gpu-check.sh async     # Pong APPO and Pong Ape-X side by side, 6 collectors
#                                      # and one GPU learner each, sharing the GPU
#   PONG_ALGOS=appo PONG_COLLECTORS=14 EVAL_EVERY=200000 bash deploy/gpu-check.sh async
#                                      # APPO alone, as the `pong` phase runs PPO
#
# Everything it reports goes to stdout and, where the device tool gives one, to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
phase=${1:-tests}

bash deploy/gpu-install.sh >"$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
# shellcheck disable=SC1091
. /tmp/rlfleet-site/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0))'

if [ "$phase" = tests ]; then
  python3 -c 'from rlfleet.shared.worker import torch_cuda
from rlfleet.shared.infra.resources import probe_resources
print("resources:", probe_resources(torch_cuda).model_dump())'
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_device.py \
    tests/unit/test_data_parallel.py -k "not hung and not generation" 2>&1 | tail -15
  timeout 240 python3 -m bench.gpu --seconds 10 --warmup 6 --cpu-seconds 3 \
    --transitions 20000 2>"$OUT/bench-gpu.err" | tee "$OUT/bench-gpu.out" | tail -14
  tail -5 "$OUT/bench-gpu.err"
fi

if [ "$phase" = algos ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_data_parallel.py \
    -k "cuda and (sac or r2d2)" 2>&1 | tail -6
  timeout 60 python3 deploy/gpu_algos.py 2>&1 | tail -6
fi

# A finished run's summary, its evaluations and its learner's device line.
report() {
  python3 - "$1" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
keys = ("solved", "env_steps", "wall_s", "eval_return", "best_eval_return", "train_iterations")
print(run.name, {k: s.get(k) for k in keys})
steps, wall = s.get("env_steps") or 0, s.get("wall_s") or s.get("wall_seconds") or 0
if wall:
    print(f"agent steps/s {steps / wall:,.0f}, frames/s (x4 skip) {4 * steps / wall:,.0f}")
ev = run / "evaluations.json"
if ev.exists():
    print([(e.get("env_steps"), e.get("return_mean")) for e in json.loads(ev.read_text())])
log = (run / "logs" / "learner.log").read_text().splitlines()
print("\n".join(line for line in log if "learning on" in line or "Error" in line)[:2000])
PY
}

if [ "$phase" = async ]; then
  secs=${PONG_SECONDS:-180}
  algos=${PONG_ALGOS:-appo apex}
  for algo in $algos; do
    timeout $((secs + 90)) rlfleet up --config "configs/pong-$algo.yaml" \
      --collectors "${PONG_COLLECTORS:-6}" --run-dir "$OUT/pong-$algo" --max-wall-s "$secs" \
      --max-env-steps 100000000 --quiet learner.device=cuda \
      "eval.every_env_steps=${EVAL_EVERY:-50000}" >"$OUT/pong-$algo.out" \
      2>"$OUT/pong-$algo.err" &
  done
  wait
  for algo in $algos; do
    tail -3 "$OUT/pong-$algo.err"
    report "$OUT/pong-$algo"
    python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]
print(len(r), "records")' "$OUT/pong-$algo/metrics.jsonl" 2>/dev/null || true
    rm -rf "$OUT/pong-$algo/storage"  # the chunks: the curves are in the run's logs
  done
fi

if [ "$phase" = pong ]; then
  secs=${PONG_SECONDS:-240}
  timeout $((secs + 90)) rlfleet up --config configs/pong-ppo.yaml --collectors 14 \
    --run-dir "$OUT/pong" --max-wall-s "$secs" --max-env-steps 100000000 --quiet \
    learner.device=cuda eval.every_env_steps=200000 2>"$OUT/pong.err" | tail -5
  echo "exit $?"
  tail -8 "$OUT/pong.err"
  report "$OUT/pong"
fi
