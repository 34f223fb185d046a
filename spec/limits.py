"""Bounds of the spec's count and size fields.

Each is far above any real job yet small enough that the planner, the simulator and the
launchers stay fast: without them `model.layers: 1e30` overflowed, `global_batch_size:
10**30` exhausted memory and `processes_per_node: 2**63` spun for minutes in `plan`.
"""

MAX_LAYERS = 1024  # GPT-3 has 96; the planner's stage search grows with the layers
MAX_WIDTH = 1 << 20  # hidden size and sequence length
MAX_HEADS = 4096
MAX_VOCAB = 1 << 24
MAX_BATCH = 1 << 20  # samples per step (and per micro-batch)
MAX_STEPS = 10**9  # steps, step numbers and step intervals
MAX_NODES = 4096
MAX_PROCESSES = 1024  # per node
MAX_RESTARTS = 1000
MAX_SEED = 2**32 - 1  # what every seeded generator (numpy's too) accepts
MIN_MEMORY_GB = 1e-6  # 1 kB per device: below it no model fits (1e-300 was taken)
