#!/usr/bin/env bash
# The checks a lent GPU machine runs, in one call (the device tool's budget is minutes):
# the CUDA tests, `jobctl apply` of a planned bf16 job and of a Mobius job on the GPU,
# then the planner's accuracy on this GPU (benchmarks/gpu_accuracy.py).
#   bash benchmarks/gpu_check.sh [steps...]   (steps: tests apply mobius accuracy)
# Packages the image lacks travel as wheels in .whl (see the device README); jobctl
# itself is put on PYTHONPATH through links, as an editable install would map it.
set -uo pipefail
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
mkdir -p /tmp/pkg/jobctl
for d in engine backends spec templates; do ln -sfn "$PWD/$d" "/tmp/pkg/jobctl/$d"; done
export PYTHONPATH="/tmp/pkg:$PWD${PYTHONPATH:+:$PYTHONPATH}"
steps="${*:-tests apply mobius accuracy}"
nvidia-smi -L
python3 -c 'import torch, jobctl.engine.cli.app as a; print("torch", torch.__version__, torch.cuda.get_device_name(0))' || exit 1

for step in $steps; do
  echo "=== $step $(date +%T)"
  case "$step" in
  tests)
    # --noconftest: the shared fixtures need moto/s3fs, which these tests do not use.
    timeout 240 python3 -m pytest -q --noconftest -p no:cacheprovider \
      tests/unit/test_cuda_clock.py tests/unit/test_mobius_runtime.py \
      tests/unit/test_calibration.py tests/unit/test_tp_overlap.py 2>&1 | tee "$out/tests.log"
    ;;
  apply | mobius)
    home="/tmp/jobctl-$step"
    timeout 300 python3 -m jobctl.engine.cli.app apply "benchmarks/gpu/$step.yaml" \
      --home "$home" 2>&1 | tee "$out/$step.log"
    echo "apply $step exit ${PIPESTATUS[0]}"
    tail -n 3 "$home"/runs/*/metrics.jsonl 2>/dev/null | cut -c1-200
    ;;
  accuracy)
    timeout 230 python3 -m benchmarks.gpu_accuracy 2>&1 | tee "$out/accuracy.log"
    ;;
  esac
done
echo "=== done $(date +%T)"
