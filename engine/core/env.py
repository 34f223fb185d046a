"""Every ``JOBCTL_*`` environment variable jobctl reads or sets, by name.

Python code refers to these constants, never to the string. The launch templates
(``templates/*.j2``) are shell text and spell some of them out: ``JOBCTL_RUN_DIR``,
``JOBCTL_NODE``, ``JOBCTL_RESUME_DIR`` (node.sh, pod.sh) and ``JOBCTL_REQUEUE``
(job.sbatch sets it, node.sh reads it); a rename here must follow them there.
"""

from __future__ import annotations

# The state home and its database.
#: The state directory (default ``./.jobctl``).
STATE_HOME = "JOBCTL_HOME"
#: A SQLAlchemy URL for the state database (default ``sqlite:///$JOBCTL_HOME/state.db``).
DB_URL = "JOBCTL_DB_URL"
#: Seconds a write to a SQLite state DB waits for another process's write lock before it
#: gives up with one line (default 10; a DB on a slow network file system may want more).
DB_WRITE_WAIT = "JOBCTL_DB_WRITE_WAIT_S"

# What a node script hands its workers.
#: The run folder: spec, plan, logs, ``metrics.jsonl``.
RUN_DIR = "JOBCTL_RUN_DIR"
#: The plan's node a node script runs (a pod takes it from its completion index).
NODE = "JOBCTL_NODE"
#: Intra-op threads per worker process (default 1).
THREADS = "JOBCTL_THREADS"
#: The run host's store, where the workers' process groups meet.
RDZV_ENDPOINT = "JOBCTL_RDZV_ENDPOINT"
#: The checkpoint a relaunched run resumes from.
RESUME_DIR = "JOBCTL_RESUME_DIR"
#: Slurm's restart count for a requeued batch job (set in job.sbatch, read by node.sh).
REQUEUE = "JOBCTL_REQUEUE"
#: The rank torchrun gave a worker, kept when the worker takes the plan's rank.
TORCHRUN_RANK = "JOBCTL_TORCHRUN_RANK"

# The event channel and its run host.
#: The channel's ``http://HOST:PORT``; set, workers post their events there.
CHANNEL_URL = "JOBCTL_CHANNEL_URL"
#: The run's channel secret; only ever in a process environment, never in an artifact.
CHANNEL_SECRET = "JOBCTL_CHANNEL_SECRET"
#: ``off`` keeps the file sink (nodes append to the shared ``metrics.jsonl``).
CHANNEL = "JOBCTL_CHANNEL"
#: Seconds a worker's channel client flushes for when it closes (default 15).
CHANNEL_FLUSH_S = "JOBCTL_CHANNEL_FLUSH_S"
#: ``network`` makes a worker without the channel an error instead of a file sink.
EVENTS = "JOBCTL_EVENTS"
#: The run host's configuration file.
HOST_CONF = "JOBCTL_HOST_CONF"
#: Seconds the run host waits without a supervisor before it exits (default 600).
HOST_IDLE_S = "JOBCTL_HOST_IDLE_S"

# The runtime's transport and checkpoints.
#: ``gloo`` turns shared-memory point-to-point off (default ``shm`` on CPU).
P2P = "JOBCTL_P2P"
#: The gloo process group's timeout in seconds (default 300).
PG_TIMEOUT_S = "JOBCTL_PG_TIMEOUT_S"
#: ``0`` when the nodes do not share the checkpoint disk (default ``1``).
SHARED_CKPT_DISK = "JOBCTL_SHARED_CKPT_DISK"
#: A folder where every process that reads training samples appends ``global_index
#: sample_id`` lines (``engine.data``): which sample each step consumed, for tests.
DATA_TRACE = "JOBCTL_DATA_TRACE"
#: ``RANK:STEP:WHERE``: that rank of a run's first attempt SIGKILLs its whole node once
#: loop step STEP (0-based) or a later one is inside WHERE (forward, allreduce,
#: optimizer, checkpoint), for the chaos tests (engine/worker/chaos.py).
CHAOS = "JOBCTL_CHAOS"
#: How many times a survivor's process group was re-formed in place after a lost node
#: (engine/worker/reform.py): the hand-over keys of the next loss are that epoch's.
EPOCH = "JOBCTL_EPOCH"
#: ``1`` where the supervisor re-forms survivors in place (it can release their agents
#: at the end: the local backend); elsewhere they leave at once and are relaunched.
IN_PLACE = "JOBCTL_IN_PLACE"
#: ``1``: a node's torchrun agent forks its workers from an interpreter that has already
#: imported them (engine/worker/agent.py); ``0``: each starts in a fresh interpreter.
#: Rendered ``1`` for CPU runs, ``0`` for CUDA ones.
WARM_START = "JOBCTL_WARM_START"
