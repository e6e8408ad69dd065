#!/usr/bin/env bash
# The trainer on a lent H200: NCCL (world size 1 under torchrun), bf16, ResNet-50 at 224x224 on
# FakeData; prints images/s. Then the trainer's GPU tests. About 3-4 minutes in all.
#
#   bash benchmarks/gpu_h200.sh          # from the repository root; logs under $OUT if set
#
# Needs python3 with torch + torchvision (the machine's own); the repo is used in place through
# PYTHONPATH (no install). STEPS / BATCH / WORKERS override the defaults.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d -t ddptrain-gpu-XXXX)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/operator:$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
STEPS="${STEPS:-300}"
BATCH="${BATCH:-256}"
WORKERS="${WORKERS:-14}"   # FakeData makes every image on the CPU (~1 ms at 224x224)
CKPT="$(mktemp -d -t ddptrain-ckpt-XXXX)"   # not under $OUT: a ResNet-50 checkpoint is ~200 MB
status=0

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" - <<'EOF'
import os, torch, torchvision
print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda,
      "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpu", torch.cuda.get_device_name(0),
      "cpus", os.cpu_count())
EOF
} 2>&1 | tee "$OUT/env.txt"

echo "== ResNet-50 224x224 bf16, NCCL, 1 rank, batch $BATCH, $STEPS steps" | tee "$OUT/resnet50.log"
timeout 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m ddptrainer.main \
  --device gpu --backend nccl --precision bf16 --model resnet50 --dataset fake \
  --image-size 224 --fake-size 1000000 --batch-size "$BATCH" --max-steps "$STEPS" \
  --log-every 25 --log-format json --num-workers "$WORKERS" \
  --checkpoint-dir "$CKPT" --checkpoint-every 0 --no-resume 2>&1 | tee -a "$OUT/resnet50.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

"$PY" - "$OUT/resnet50.log" "$STEPS" "$BATCH" <<'EOF' | tee "$OUT/summary.json"
import json, sys
path, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
events = [json.loads(l) for l in open(path) if l.startswith("{")]
prog = {e["step"]: e for e in events if e.get("event") == "progress"}
start = next((e for e in events if e.get("event") == "start"), {})
# steady state: from a third of the run (cuDNN autotuning and loader start-up done) to the end
lo = min((s for s in prog if s >= steps // 3), default=None)
out = {"model": "resnet50", "image_size": 224, "precision": start.get("precision"),
       "backend": start.get("backend"), "device": start.get("device"),
       "world_size": start.get("world_size"), "batch_size": batch, "steps": steps}
if lo is not None and steps in prog and steps > lo:
    out["images_per_sec"] = round((steps - lo) * batch / (prog[steps]["time"] - prog[lo]["time"]), 1)
    tail = [e for s, e in prog.items() if s > lo]
    out["data_wait_fraction"] = round(sum(e["data_wait_fraction"] for e in tail) / len(tail), 3)
    out["final_loss"] = prog[steps]["loss"]
print(json.dumps(out))
EOF

echo "== GPU tests" | tee "$OUT/pytest.log"
timeout 200 "$PY" -m pytest -m gpu tests/multiprocess/test_trainer_gpu.py -q -p no:cacheprovider \
  2>&1 | tee -a "$OUT/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "logs in $OUT; exit $status"
exit $status
