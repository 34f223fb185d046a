"""Where a relaunched node continues: the run's newest complete checkpoint.

A Slurm job that is requeued (preemption with ``--requeue``, ``scontrol requeue``)
runs its batch script again, long after jobctl rendered it: the checkpoint named in
the script is stale by then. Every node script of a requeued job asks this module
(``python -m jobctl.engine.checkpoint.requeue RUN_DIR``) for the newest complete checkpoint,
local or remote, and resumes from it; it prints nothing when there is none yet
(the run then starts from step 0, as nothing was lost).
"""

from __future__ import annotations

import sys
from pathlib import Path


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete (verified) checkpoint of the run in ``run_dir``."""
    from jobctl.engine.checkpoint.resume import find_resume_point, local_root
    from jobctl.spec import load_spec

    spec = load_spec(run_dir / "spec.yaml")
    point = find_resume_point(spec.checkpoint, local_root(spec.checkpoint, run_dir))
    return point.path if point else None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m jobctl.engine.checkpoint.requeue RUN_DIR", file=sys.stderr)
        return 2
    path = newest_checkpoint(Path(argv[0]))
    print(path or "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
