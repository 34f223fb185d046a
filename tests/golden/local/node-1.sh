#!/usr/bin/env bash
# jobctl launch script for run quick-1, node 1 of 2.
# Rendered by jobctl: every value is shell-quoted. Re-running it re-joins the run.
set -euo pipefail
export JOBCTL_RUN_DIR=/runs/quick-1
export JOBCTL_THREADS=1
export OMP_NUM_THREADS=1
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
rdzv_id=quick-1
# A relaunch of the same batch job (Slurm sets JOBCTL_REQUEUE to its restart count when
# it requeues one) continues from the newest complete checkpoint, in a rendezvous round
# of its own: the one rendered here is stale by then.
requeue="${JOBCTL_REQUEUE:-0}"
if [ "$requeue" != 0 ]; then
  rdzv_id="$rdzv_id-requeue-$requeue"
  JOBCTL_RESUME_DIR="$(/usr/bin/python3 -m jobctl.backends.requeue "$JOBCTL_RUN_DIR")"
  export JOBCTL_RESUME_DIR
fi
# A SIGTERM (preemption notice, time limit, cancel) is passed on to the agent, which
# passes it to the workers (they checkpoint, then exit), and noted with its own time:
# a stop that comes before the first step (the agent still in rendezvous) reads as a
# stop, not a failure, and the recovery time of a morph that drops this node starts
# from the notice. EPOCHREALTIME is bash 5's (its decimal mark follows the locale);
# older shells note whole seconds.
# shellcheck disable=SC2317 # run by the TERM trap
on_term() {
  told_to_stop=1
  if [ -n "$agent" ]; then kill -TERM "$agent" 2>/dev/null || true; fi
  local ts="${EPOCHREALTIME:-$(date +%s)}"
  printf '{"kind": "node_sigterm", "node": %s, "ts": %s}\n' 1 "${ts/,/.}" \
    >>"$JOBCTL_RUN_DIR/metrics.jsonl"
}
told_to_stop=0
agent=""
trap on_term TERM
/usr/bin/python3 -m torch.distributed.run \
  --nnodes=2 \
  --nproc-per-node=2 \
  --rdzv-backend=c10d \
  --rdzv-endpoint=10.0.0.5:29400 \
  --rdzv-id="$rdzv_id" \
  --rdzv-conf=is_host=false \
  --max-restarts=0 \
  -m jobctl.engine.worker &
agent=$!
# A SIGTERM that came while the agent was being started is passed on now.
if [ "$told_to_stop" = 1 ]; then kill -TERM "$agent" 2>/dev/null || true; fi
status=0
while :; do
  wait "$agent" && status=0 || status=$?
  kill -0 "$agent" 2>/dev/null || break  # still alive: the trap cut the wait short
done
if [ "$told_to_stop" = 1 ]; then  # end as a stopped node does: by the signal
  trap - TERM
  kill -TERM "$$"
fi
exit "$status"
