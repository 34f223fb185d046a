#!/usr/bin/env bash
# jobctl launch script for run quick-1, node 0 of 2.
# Rendered by jobctl: every value is shell-quoted. Re-running it re-joins the run.
set -euo pipefail
export JOBCTL_RDZV_ENDPOINT=10.0.0.5:29400
export JOBCTL_RUN_DIR=/runs/quick-1
export JOBCTL_THREADS=1
export JOBCTL_WARM_START=1
export OMP_NUM_THREADS=1
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
rdzv_id=quick-1
node=0
# Which node script started a worker: torchrun numbers the agents in rendezvous order,
# so a rank's node in the plan need not be this one.
export JOBCTL_NODE="$node"
# A relaunch of the same batch job (Slurm sets JOBCTL_REQUEUE to its restart count when
# it requeues one) continues from the newest complete checkpoint, in a rendezvous round
# of its own: the one rendered here is stale by then.
requeue="${JOBCTL_REQUEUE:-0}"
if [ "$requeue" != 0 ]; then
  rdzv_id="$rdzv_id-requeue-$requeue"
  JOBCTL_RESUME_DIR="$(/usr/bin/python3 -m jobctl.engine.checkpoint.requeue "$JOBCTL_RUN_DIR")"
  export JOBCTL_RESUME_DIR
fi
# A SIGTERM (preemption notice, time limit, cancel) is passed on to the agent, which
# passes it to the workers (they checkpoint, then exit), and noted with its own time:
# a stop that comes before the first step (the agent still in rendezvous) reads as a
# stop, not a failure, and the recovery time of a morph that drops this node starts
# from the notice. EPOCHREALTIME is bash 5's (its decimal mark follows the locale);
# older shells note whole seconds, with printf's own clock. No command substitution in
# the trap, not even an unused default: bash 5.2 parses it each time the expansion
# runs, and a second SIGTERM (a stop sends one to the script and one to its group)
# that re-enters the trap mid-parse failed with "unexpected EOF while looking for
# matching `)'": exit 2, the stop never passed on, no checkpoint (seen in CI).
# shellcheck disable=SC2317 # run by the TERM trap
on_term() {
  told_to_stop=1
  if [ -n "$agent" ]; then kill -TERM "$agent" 2>/dev/null || true; fi
  local ts
  if [ -n "${EPOCHREALTIME:-}" ]; then ts=$EPOCHREALTIME; else printf -v ts '%(%s)T' -1; fi
  printf '{"kind": "node_sigterm", "node": %s, "ts": %s}\n' 0 "${ts/,/.}" \
    >>"$JOBCTL_RUN_DIR/metrics.jsonl"
}
# A SIGUSR1 says this node was packed away (engine/rebalance/hook.py): its workers
# have handed their layers on and exited 0, and its agent waits in torchrun's exit
# barrier for the nodes still training. Once the agent has no workers left (it then
# counts itself at that barrier within its monitor interval), it is ended and the node
# exits 0, so the backend can hand the machine back while the others go on.
# shellcheck disable=SC2317 # run by the USR1 trap
on_release() { released=1; }
# shellcheck disable=SC2317 # called from the main loop after a USR1
release_agent() {
  local waited=0
  while pgrep -P "$agent" >/dev/null 2>&1; do  # workers still leaving
    sleep 0.2
    waited=$((waited + 1))
    if [ "$waited" -ge 300 ]; then return 1; fi  # a minute: not packed away after all
  done
  sleep 1  # its arrival at the exit barrier is counted by then (torchrun checks every 0.1 s)
  kill -KILL "$agent" 2>/dev/null || true
  wait "$agent" 2>/dev/null || true
}
told_to_stop=0
released=0
agent=""
trap on_term TERM
trap on_release USR1
# Where a release finds this script on its machine (Slurm: `srun --overlap` on that node).
echo "$$" >"$JOBCTL_RUN_DIR/scripts/node-$node.pid" 2>/dev/null || true
/usr/bin/python3 -m jobctl.engine.worker.agent \
  --nnodes=2 \
  --nproc-per-node=2 \
  --rdzv-backend=c10d \
  --rdzv-endpoint=10.0.0.5:29400 \
  --rdzv-id="$rdzv_id" \
  --rdzv-conf=is_host=false \
  --max-restarts=0 \
  -m jobctl.engine.worker.process &
agent=$!
# A SIGTERM that came while the agent was being started is passed on now.
if [ "$told_to_stop" = 1 ]; then kill -TERM "$agent" 2>/dev/null || true; fi
status=0
while :; do
  wait "$agent" && status=0 || status=$?
  if [ "$released" = 1 ] && [ "$told_to_stop" = 0 ]; then
    released=0
    if release_agent; then
      echo "jobctl: node $node released after packing; its agent ended" >&2
      rm -f "$JOBCTL_RUN_DIR/scripts/node-$node.pid"  # says so to whoever released it
      exit 0
    fi
  fi
  kill -0 "$agent" 2>/dev/null || break  # still alive: a trap cut the wait short
done
if [ "$told_to_stop" = 1 ]; then  # end as a stopped node does: by the signal
  trap - TERM
  kill -TERM "$$"
fi
exit "$status"
