#!/usr/bin/env bash
# GPU check: runs jobctl's CUDA tests, trains two small jobs on the GPU with
# `jobctl apply`, and measures the planner's step-time predictions against real runs.
#
# Needs: one or more NVIDIA CUDA GPUs (NCCL for the multi-GPU rows, which the CUDA
# build of torch ships), and jobctl installed from this checkout:
#   pip install torch --index-url https://download.pytorch.org/whl/cu126   # a CUDA build
#   pip install -e '.[dev]'
#
# Usage: bash benchmarks/gpu/gpu_check.sh [-o DIR] [STEP...]
#   STEP: tests apply mobius accuracy (default: all four, in that order)
#   -o DIR: results directory (default $GPU_CHECK_OUT, else ./gpu-check-results)
#   GPU_CHECK_ACCURACY_ARGS: arguments for the accuracy step
#     (default "--budget-s 900"; see python -m benchmarks run gpu_accuracy --help)
#   PYTHON: the interpreter to use (default python3)
#
# Steps (details: docs/benchmarks.md; reference results: benchmarks/results/):
#   tests     pytest on the CUDA tests (clock, recompute RNG, Mobius's pinned tier)
#             and the calibration, Mobius-runtime and tensor-parallel unit
#             files (~30 s)
#   apply     `jobctl apply benchmarks/gpu/apply.yaml`: 6 x 512 GPT, bf16, 40 steps,
#             parallelism left to the planner (~30 s)
#   mobius    `jobctl apply benchmarks/gpu/mobius.yaml`: 4 stages swapped through
#             pinned host memory on one GPU, 20 steps (~30 s)
#   accuracy  python -m benchmarks run gpu_accuracy: 4 x 2048 GPT, bf16, predicted vs
#             measured step time per configuration that fits the GPUs (5-10 min)
#
# Results: DIR/environment.txt (GPUs, torch, CUDA, NCCL), DIR/STEP.log (each step's
# full output), DIR/home-apply and DIR/home-mobius (the jobs' jobctl homes: runs/*/
# with metrics.jsonl, logs/ and checkpoints/), DIR/summary.txt (PASS or FAIL per step).
# Exit status: 0 when every step passed, 1 when any failed, 2 when the check could not
# start (bad usage, no CUDA device, jobctl not installed).
set -uo pipefail
export PYTHONUNBUFFERED=1

usage() { sed -n '10,15s/^# \{0,1\}//p' "$0"; }

out="${GPU_CHECK_OUT:-./gpu-check-results}"
while getopts "o:h" opt; do
  case "$opt" in
  o) out="$OPTARG" ;;
  h) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests apply mobius accuracy)
for step in "${steps[@]}"; do
  case "$step" in
  tests | apply | mobius | accuracy) ;;
  *) echo "gpu_check: unknown step '$step' (steps: tests apply mobius accuracy)" >&2; exit 2 ;;
  esac
done

py="${PYTHON:-python3}"
mkdir -p "$out" || { echo "gpu_check: cannot create results directory $out" >&2; exit 2; }
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/../.." || exit 2  # the repository root: the tests and benchmarks live here

# Fail fast: a CUDA device and an installed jobctl are needed by every step.
if ! "$py" - >"$out/environment.txt" 2>&1 <<'EOF'
import sys
try:
    import torch
except ImportError:
    sys.exit("torch is not installed: install a CUDA build of torch, then pip install -e '.[dev]'")
if not torch.cuda.is_available():
    sys.exit(
        f"no CUDA device visible to torch {torch.__version__} (CUDA build: "
        f"{torch.version.cuda or 'no, this is a CPU-only build'}); check nvidia-smi, "
        "CUDA_VISIBLE_DEVICES and that torch is a CUDA build"
    )
try:
    import jobctl.engine.cli.app  # noqa: F401
except ImportError as e:
    sys.exit(f"jobctl is not importable ({e}): run pip install -e '.[dev]' in this checkout")
n = torch.cuda.device_count()
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else "not available"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, {n} GPU(s):")
for i in range(n):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB")
EOF
then
  echo "gpu_check: cannot start: $(tail -n 1 "$out/environment.txt")" >&2
  exit 2
fi
cat "$out/environment.txt"
echo "results in $out"

: >"$out/summary.txt"
failed=0
for step in "${steps[@]}"; do
  echo "=== $step $(date +%T)"
  case "$step" in
  tests)
    # --noconftest: these files use none of the suite's shared fixtures (S3, clusters).
    timeout 900 "$py" -m pytest -q -rs --noconftest -p no:cacheprovider \
      tests/unit/test_cuda_clock.py tests/unit/test_recompute_rng.py \
      tests/unit/test_mobius_runtime.py \
      tests/unit/test_calibration.py tests/unit/test_tp_overlap.py 2>&1 | tee "$out/tests.log"
    rc=${PIPESTATUS[0]}
    ;;
  apply | mobius)
    home="$out/home-$step"
    rm -rf "$home"  # a fresh jobctl home: apply would otherwise continue an earlier run
    timeout 900 "$py" -m jobctl.engine.cli.app apply "benchmarks/gpu/$step.yaml" \
      --home "$home" 2>&1 | tee "$out/$step.log"
    rc=${PIPESTATUS[0]}
    ;;
  accuracy)
    read -r -a acc_args <<<"${GPU_CHECK_ACCURACY_ARGS:---budget-s 900}"
    timeout 1800 "$py" -m benchmarks.gpu.gpu_accuracy "${acc_args[@]}" 2>&1 | tee "$out/accuracy.log"
    rc=${PIPESTATUS[0]}
    ;;
  esac
  if [ "$rc" -eq 0 ]; then verdict=PASS; else verdict="FAIL (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out'))"; failed=1; fi
  echo "$step: $verdict" | tee -a "$out/summary.txt"
done
echo "=== done $(date +%T)"
cat "$out/summary.txt"
exit "$failed"
