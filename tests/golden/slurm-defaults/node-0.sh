#!/usr/bin/env bash
# jobctl launch script for run quick-1, node 0 of 2.
# Rendered by jobctl: every value is shell-quoted. Re-running it re-joins the run.
set -euo pipefail
export JOBCTL_RUN_DIR=/runs/quick-1
export JOBCTL_THREADS=1
export OMP_NUM_THREADS=1
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec /usr/bin/python3 -m torch.distributed.run \
  --nnodes=2 \
  --nproc-per-node=2 \
  --rdzv-backend=c10d \
  --rdzv-endpoint=10.0.0.5:29400 \
  --rdzv-id=quick-1 \
  --rdzv-conf=is_host=false \
  --max-restarts=0 \
  -m jobctl.engine.worker
