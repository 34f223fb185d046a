"""The examples of the spec reference page (``jobctl.spec.reference``), kept apart from
its renderer: a typical value for each field whose default shows nothing useful (null,
required, an empty list), an example block per section (taken from ``jobs/*.yaml``
where a job there uses the section) and the alternative forms of a section.

tests/unit/test_spec_reference.py validates every one of them against the spec models,
so an example that stops being valid fails the suite rather than misleading a reader.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Form(NamedTuple):
    """One of a section's alternative forms: a title, a sentence and a YAML block."""

    title: str
    text: str
    yaml: str


class Block(NamedTuple):
    """A section's example block and the jobs/ file it is taken from, if any."""

    yaml: str
    source: str | None = None


#: A typical value per dotted path, for fields whose default (null, required, empty)
#: would make a useless example; a pydantic ``examples=[...]`` on the field wins over it.
FIELD_EXAMPLES: dict[str, Any] = {
    "name": "gpt-small-spot",
    "model.import": "mypkg.models:build_blocks",
    "model.import_args": {"width": 256, "depth": 8},
    "model.huggingface.class": "LlamaForCausalLM",
    "model.huggingface.config": {"num_hidden_layers": 4, "hidden_size": 64},
    "model.huggingface.config_path": "llama/config.json",
    "model.huggingface.pretrained": "checkpoints/llama-tiny",
    "model.subgraphs": 16,
    "data.path": "corpus/train.bin",
    "data.tokenizer": "tokenizer",
    "data.eval": 0.05,
    "training.global_batch_size": 512,
    "training.steps": 20000,
    "hardware.topology.root_complexes": [[0, 1], [2, 3]],
    "hardware.flops_tflops": 70.0,
    "hardware.spot_price_per_hour": 0.45,
    "hardware.hosts": ["node-0", "node-1"],
    "hardware.rendezvous_host": "10.0.0.5",
    "hardware.rendezvous_port": 29500,
    "hardware.slurm.partition": "gpu",
    "hardware.slurm.account": "ml-team",
    "hardware.slurm.qos": "normal",
    "hardware.slurm.time_limit_minutes": 720,
    "hardware.slurm.sbatch_args": ["--exclusive", "--constraint=a100"],
    "hardware.kubernetes.image": "ghcr.io/acme/jobctl:0.1",
    "hardware.kubernetes.secrets": ["s3-credentials"],
    "hardware.kubernetes.node_selector": {"cloud.google.com/gke-spot": "true"},
    "hardware.kubernetes.service_account": "jobctl",
    "hardware.kubernetes.volume_claim": "jobctl-runs",
    "hardware.ssh.user": "train",
    "hardware.ssh.identity_file": "~/.ssh/id_ed25519",
    "hardware.ssh.known_hosts_file": "~/.ssh/known_hosts_cluster",
    "hardware.ssh.python": "/opt/venv/bin/python",
    "parallelism.micro_batches": 4,
    "parallelism.advance_num": 2,
    "elasticity.max_devices": 32,
    "rebalancing.target_devices": 2,
    "checkpoint.local_dir": "/scratch/checkpoints",
    "checkpoint.remote": "s3://my-bucket/runs/gpt-small",
    "checkpoint.keep_every": 5000,
    "schedule.cron": "*/30 * * * *",
    "schedule.interval_s": 1800.0,
    "schedule.start": "2025-01-01T00:00:00Z",
    "schedule.end": "2025-12-31T23:59:00Z",
    "budget.max_total_usd": 500.0,
    "budget.max_hourly_usd": 20.0,
    "planner.deadline": "36h",
}

#: The smallest valid spec: the required keys only.
MINIMAL = """\
name: tiny
model:
  family: gpt
training:
  global_batch_size: 16
  steps: 100
"""

#: An example block per section path, written as it sits in a job spec.
SECTION_EXAMPLES: dict[str, Block] = {
    "model": Block(
        """\
model:
  family: gpt
  layers: 12
  hidden: 768
  heads: 12
  seq_len: 1024
  vocab: 50257
  dropout: 0.1
  tie_embeddings: true
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "model.huggingface": Block(
        """\
model:
  huggingface:
    class: LlamaForCausalLM
    config:
      num_hidden_layers: 4
      hidden_size: 64
      num_attention_heads: 4
      num_key_value_heads: 2
      intermediate_size: 128
      vocab_size: 256
      max_position_embeddings: 64
""",
        "jobs/hf-llama.yaml",
    ),
    "data": Block(
        """\
data:
  source: tokens
  path: corpus/train.bin
  eval: 0.05
  block_mb: 8
""",
    ),
    "training": Block(
        """\
training:
  global_batch_size: 512
  micro_batch_size: auto
  steps: 20000
  optimizer: adamw
  lr: 6.0e-4
  weight_decay: 0.1
  betas: [0.9, 0.95]
  lr_schedule: cosine
  warmup_steps: 2000
  seed: 1234
  precision: bf16
  log_every: 10
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "training.loss_scale": Block(
        """\
training:
  global_batch_size: 16
  steps: 100
  precision: fp16
  loss_scale:
    init_scale: 1024
    growth_interval: 500
""",
    ),
    "hardware": Block(
        """\
hardware:
  backend: kubernetes
  nodes: 4
  processes_per_node: 8
  device: cuda
  memory_gb: 24
  flops_tflops: 70
  price_per_hour: 0.45
  spot: true
  interconnect:
    intra_node_gbps: 128
    inter_node_gbps: 25
    latency_us: 30
  rendezvous_port: 29500
  kubernetes:
    image: ghcr.io/example/jobctl:0.1.0
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "hardware.topology": Block(
        """\
hardware:
  processes_per_node: 4
  topology:
    root_complexes: [[0, 1], [2, 3]]
""",
    ),
    "hardware.interconnect": Block(
        """\
hardware:
  nodes: 4
  processes_per_node: 8
  interconnect:
    intra_node_gbps: 128
    inter_node_gbps: 25
    latency_us: 30
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "hardware.slurm": Block(
        """\
hardware:
  backend: slurm
  nodes: 2
  processes_per_node: 4
  device: cuda
  slurm:
    partition: gpu
    account: ml-team
    time_limit_minutes: 720
    sbatch_args: ["--exclusive"]
""",
    ),
    "hardware.kubernetes": Block(
        """\
hardware:
  backend: kubernetes
  nodes: 4
  processes_per_node: 8
  device: cuda
  kubernetes:
    image: ghcr.io/example/jobctl:0.1.0
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "hardware.ssh": Block(
        """\
hardware:
  backend: ssh
  nodes: 2
  processes_per_node: 2
  hosts: [node-0, node-1]
  ssh:
    user: train
    identity_file: ~/.ssh/id_ed25519
    strict_host_key_checking: "yes"
""",
    ),
    "parallelism": Block(
        """\
parallelism:
  pipeline_stages: auto
  data_parallel: auto
  schedule: varuna
  recompute: auto
  placement: stage_major
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "elasticity": Block(
        """\
elasticity:
  enabled: true
  min_devices: 8
  max_devices: 32
  heartbeat_timeout_s: 60
  straggler_threshold: 0.2
  exclude_stragglers: true
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "pruning": Block(
        """\
pruning:
  enabled: true
  initial_sparsity: 0.0
  final_sparsity: 0.9
  start_step: 10
  end_step: 50
  frequency: 10
""",
        "jobs/pruning.yaml",
    ),
    "rebalancing": Block(
        """\
rebalancing:
  enabled: true
  balancer: partition
  by: time
  tolerance: 0.1
""",
    ),
    "checkpoint": Block(
        """\
checkpoint:
  interval: 500
  remote: s3://my-bucket/runs/gpt-small
  keep_last: 3
  keep_every: 5000
  upload_retries: 8
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "schedule": Block(
        """\
schedule:
  cron: "*/30 * * * *"
  timezone: UTC
""",
        "jobs/gpt-small-spot.yaml",
    ),
    "budget": Block(
        """\
hardware:
  price_per_hour: 0.45
budget:
  max_total_usd: 500
  max_hourly_usd: 20
""",
    ),
    "planner": Block(
        """\
planner:
  objective: cost
  deadline: 36h
""",
    ),
}

#: Sections that take one of several shapes, each form with a block that validates.
FORMS: dict[str, tuple[Form, ...]] = {
    "model": (
        Form(
            "Builtin family",
            "`family: gpt` with its size fields (`layers`, `hidden`, `heads`, `seq_len`, "
            "`vocab`, ...).",
            "model:\n  family: gpt\n  layers: 4\n  hidden: 64\n  heads: 4\n",
        ),
        Form(
            "Imported factory",
            "`import: 'pkg.module:factory'` names a function returning the list of "
            "`nn.Module` blocks, called with `import_args`; `family` is then null and the "
            "size fields are ignored.",
            "model:\n  import: mypkg.models:build_blocks\n  import_args: {width: 256}\n",
        ),
        Form(
            "Hugging Face model",
            "`huggingface` names a `transformers` class with its config (inline, a "
            "config.json or a pretrained folder); it is traced and split into stages, and "
            "`vocab` comes from its config.",
            "model:\n  huggingface:\n    class: GPT2LMHeadModel\n"
            "    config_path: gpt2/config.json\n  seq_len: 128\n",
        ),
    ),
    "data": (
        Form(
            "Synthetic",
            "A seeded stream of random tokens, no files.",
            "data:\n  source: synthetic\n",
        ),
        Form(
            "Text",
            "The bytes of a text file are the tokens.",
            "data:\n  source: text\n  path: corpus.txt\n",
        ),
        Form(
            "Token file",
            "A flat file of token ids (.bin or .npy, local or an fsspec URL), with an "
            "optional held-out split.",
            "data:\n  source: tokens\n  path: s3://my-bucket/train.bin\n  eval: 0.05\n",
        ),
        Form(
            "Hugging Face dataset",
            "A dataset folder or files, tokenized with `tokenizer`.",
            "data:\n  source: hf\n  path: datasets/wikitext\n  tokenizer: tokenizer\n",
        ),
    ),
    "schedule": (
        Form(
            "Cron rule",
            "Resume at the times of a 5-field cron expression, in `timezone`.",
            'schedule:\n  cron: "0 2 * * *"\n  timezone: Europe/Berlin\n',
        ),
        Form(
            "Interval",
            "Resume every `interval_s` seconds.",
            "schedule:\n  interval_s: 3600\n",
        ),
    ),
}
