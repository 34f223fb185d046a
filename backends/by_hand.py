"""How each backend's rendered files are started by hand: the lines of ``start.sh``
(``templates/by-hand.sh.j2``) that `jobctl render --out` writes, run from the run
folder after the run host (the rendezvous store) has started on this machine.

Each starts the nodes as `jobctl apply` would and waits for them to end, so the run
host stays up as long as they need it: the local backend runs the node scripts
(the template's default), Slurm submits the batch script and waits, ssh copies each
node its inputs and script and runs it on its host, Kubernetes applies the manifests
and waits until every pod of the run has ended. Every value is shell-quoted.
"""

from __future__ import annotations

import shlex

from .base import RunContext
from .k8s_manifests import RUN_LABEL, k8s_name, options
from .ssh import hosts_of, ssh_argv

# What the nodes' pids are waited for with, as the local backend's default does.
_WAIT = "\n".join(
    [
        "status=0",
        'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done',
        'echo "run ended with status $status; logs in $run_dir/logs"',
        'exit "$status"',
    ]
)


def by_hand_command(backend: str, ctx: RunContext) -> str:
    """The shell lines that start ``ctx``'s nodes on ``backend`` and wait for them;
    empty for the local backend (the template runs its node scripts itself)."""
    if backend == "local":
        return ""
    if backend == "slurm":
        return "sbatch --wait scripts/job.sbatch"
    if backend == "ssh":
        return _ssh(ctx)
    if backend == "kubernetes":
        return _kubernetes(ctx)
    raise ValueError(f"no by-hand start for backend {backend!r}")


def _ssh(ctx: RunContext) -> str:
    """Each host gets the run inputs and its node script through ssh's stdin, unpacked
    into the same run folder path as `jobctl apply` uses, and runs the script there;
    its output comes back to logs/node-K.log here."""
    q, run_dir = shlex.quote, str(ctx.run_dir)
    lines = [
        "# Each node runs on its host for as long as its ssh connection lasts; stopping",
        "# this script does not stop a node that ignores the hang-up (ssh HOST kill it).",
        "pids=()",
    ]
    for k, host in enumerate(hosts_of(ctx)):
        script = f"scripts/node-{k}.sh"
        remote = (
            f"set -e; mkdir -p {q(run_dir)}/logs; tar -x -f - -C {q(run_dir)}; "
            f"cd {q(run_dir)}; exec bash {script}"
        )
        ssh = shlex.join(ssh_argv(ctx.hardware.ssh, host, remote))
        lines += [
            f"tar -c -f - {' '.join(map(q, sorted(ctx.inputs)))} {script} | {ssh} "
            f">logs/node-{k}.log 2>&1 &",
            "pids+=($!)",
        ]
    return "\n".join([*lines, _WAIT])


def _kubernetes(ctx: RunContext) -> str:
    """Apply the manifests, then wait until the run's pods have all ended (the run host
    here is the rendezvous store the pods reach through the run's Service)."""
    q, opts = shlex.quote, options(ctx)
    ns, selector = q(opts.namespace), q(f"{RUN_LABEL}={k8s_name(ctx.run_id)}")
    pods = f"kubectl get pods -n {ns} -l {selector}"
    return "\n".join(
        [
            "kubectl apply -f scripts/manifests.yaml",
            f'echo "applied; follow the pods with: {pods} -w"',
            "phases=''",
            "while :; do",
            f"  phases=\"$({pods} -o jsonpath='{{.items[*].status.phase}}')\"",
            '  if [ -n "$phases" ] && ! grep -qE \'Pending|Running|Unknown\' <<<"$phases"; then',
            "    break",
            "  fi",
            "  sleep 5",
            "done",
            'echo "the pods ended: $phases; remove the run with: '
            'kubectl delete -f $run_dir/scripts/manifests.yaml"',
            'if grep -q Failed <<<"$phases"; then exit 1; fi',
        ]
    )
