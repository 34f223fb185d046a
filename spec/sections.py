"""Spec sections for what is trained and where: model, data, training, hardware, parallelism."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, WrapValidator, field_validator, model_validator

from .averaging import AveragingFields
from .base import SpecModel, Violation, int_or_auto, require_match
from .data import DataSpec as DataSpec  # re-exported: it lived here
from .devices import DEVICES
from .hosts import HostName, ImageRef, Labels, ResourceName, default_rendezvous_host
from .hosts import SshSpec as SshSpec  # re-exported: it lived here
from .hosts import is_loopback as is_loopback  # re-exported: it lived here
from .limits import (
    MAX_BATCH,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_NODES,
    MAX_PROCESSES,
    MAX_RESTARTS,
    MAX_SEED,
    MAX_STEPS,
    MAX_VOCAB,
    MAX_WIDTH,
    MIN_MEMORY_GB,
)
from .model_source import HuggingFaceSpec, LossName, Task, hf_defaults, hf_violations
from .precision import LossScaleSpec, loss_scale_violations
from .tensor_parallel import TensorParallelFields
from .topology import TopologyFields

IMPORT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
SLURM_NAME = r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$"
SBATCH_OPTION = r"^--[a-z][a-z0-9-]*(=[^\s'\"\\]+)?$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
NO_SPACE = r"^\S+$"

PositiveIntOrAuto = Annotated[
    Annotated[int, Field(ge=1, le=MAX_BATCH)] | Literal["auto"], WrapValidator(int_or_auto)
]
Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class ModelSpec(SpecModel):
    """The network: a builtin GPT family, or blocks returned by an imported factory."""

    family: Literal["gpt"] | None = Field(
        "gpt", description="Builtin model family; null when `import` names a factory."
    )
    layers: int = Field(
        4, ge=1, le=MAX_LAYERS, description="Number of transformer blocks (builtin family)."
    )
    hidden: int = Field(
        64, ge=1, le=MAX_WIDTH, description="Hidden size; must be divisible by `heads`."
    )
    heads: int = Field(4, ge=1, le=MAX_HEADS, description="Attention heads per block.")
    seq_len: int = Field(32, ge=1, le=MAX_WIDTH, description="Sequence length in tokens.")
    vocab: int = Field(256, ge=2, le=MAX_VOCAB, description="Vocabulary size in tokens.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout probability in [0, 1).")
    tie_embeddings: bool = Field(
        True, description="Share the token embedding matrix with the output head."
    )
    import_: str | None = Field(
        None,
        alias="import",
        description="'pkg.module:factory' returning a list of nn.Module blocks; the builtin "
        "size fields are then ignored.",
        json_schema_extra={"pattern": IMPORT_PATTERN},
    )
    import_args: dict[str, Any] = Field(
        default={}, description="Keyword arguments passed to the `import` factory."
    )
    huggingface: HuggingFaceSpec | None = Field(
        None, description="A transformers model class and its config or pretrained directory."
    )
    task: Task | None = Field(
        None, description="What a traced model learns (batches and labels); null infers it."
    )
    loss: LossName = Field(
        "auto",
        description="A traced model's loss: 'auto' (its own, given labels), "
        "'next_token', 'cross_entropy', or 'pkg.module:fn' called as fn(logits, batch).",
    )
    mask_token_id: int | None = Field(
        None,
        ge=0,
        description="The id a masked-LM task masks tokens with; null: the config's "
        "mask_token_id, else the mask token of the tokenizer saved in the pretrained "
        "folder, else (a model trained from scratch) the last id; a pretrained model "
        "with none of these is refused.",
    )
    subgraphs: int | None = Field(
        None,
        ge=2,
        le=MAX_LAYERS,
        description="Subgraphs a traced model is sharded into "
        "(the planner's cut points, Merak Alg. 2's k); null: 2 per layer + 2.",
    )

    @model_validator(mode="before")
    @classmethod
    def _imported_model_has_no_family(cls, data: Any) -> Any:
        """An imported model is not a builtin family, so `family` defaults to null with it."""
        imported = isinstance(data, dict) and data.get("import", data.get("import_")) is not None
        data = hf_defaults(data)
        if imported and "family" not in data:
            return {**data, "family": None}
        return data

    @field_validator("import_")
    @classmethod
    def _import_is_a_factory_reference(cls, value: str | None) -> str | None:
        if value is None:
            return value
        return require_match(
            value,
            IMPORT_PATTERN,
            "import_reference",
            f"{value!r} is not a factory reference",
            fix="write it as 'package.module:factory', e.g. 'mypkg.models:build_blocks'",
        )

    def _violations(self) -> Iterator[Violation]:
        if self.import_ is not None and self.family is not None:
            yield Violation(
                "family",
                "`family` and `import` are exclusive: an imported model is not a builtin family",
                "remove model.family (or remove model.import to use the builtin family)",
            )
        yield from hf_violations(self)
        if self.import_ is None and self.family is None and self.huggingface is None:
            yield Violation(
                "family",
                "no model given: `family` is null and there is no `import`",
                "set model.family: gpt or model.import: 'package.module:factory'",
            )
        if self.family is not None and self.hidden % self.heads:
            yield Violation(
                "hidden",
                f"hidden {self.hidden} is not divisible by heads {self.heads}",
                f"make model.hidden a multiple of {self.heads} or change model.heads",
            )
        if self.mask_token_id is not None and self.mask_token_id >= self.vocab:
            yield Violation(
                "mask_token_id",
                f"mask_token_id {self.mask_token_id} is outside model.vocab {self.vocab} "
                f"(ids 0-{self.vocab - 1})",
                "set model.mask_token_id to the tokenizer's mask token id",
            )

    @property
    def num_blocks(self) -> int | None:
        """Splittable blocks of a builtin model (embedding, layers, head); None if imported."""
        return None if self.family is None else self.layers + 2


class TrainingSpec(SpecModel):
    """The optimisation: batch sizes, steps, optimizer and numerics."""

    global_batch_size: int = Field(
        ..., ge=1, le=MAX_BATCH, description="Samples per optimizer step; fixed across morphs."
    )
    micro_batch_size: PositiveIntOrAuto = Field(
        "auto", description="Samples per micro-batch, or 'auto' to let the planner choose."
    )
    steps: int = Field(..., ge=1, le=MAX_STEPS, description="Optimizer steps to train for.")
    optimizer: Literal["adamw", "adam", "sgd"] = Field("adamw", description="Optimizer.")
    lr: float = Field(1e-3, gt=0.0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="Weight decay coefficient.")
    betas: tuple[Beta, Beta] = Field(
        (0.9, 0.999), description="Adam(W) beta1 and beta2, each in [0, 1)."
    )
    momentum: float = Field(0.0, ge=0.0, description="SGD momentum (optimizer 'sgd' only).")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warmup."
    )
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Linear warmup steps.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed for weights and data order.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Compute precision.")
    loss_scale: LossScaleSpec = Field(
        default_factory=LossScaleSpec, description="fp16's dynamic loss scale."
    )
    log_every: int = Field(1, ge=1, le=MAX_STEPS, description="Log metrics every this many steps.")
    eval_every: int = Field(0, ge=0, description="Eval loss every this many steps (0: never).")

    def _violations(self) -> Iterator[Violation]:
        if self.momentum and self.optimizer != "sgd":
            yield Violation(
                "momentum",
                f"momentum is only used by optimizer 'sgd', but optimizer is {self.optimizer!r}",
                "remove training.momentum or set training.optimizer: sgd",
            )
        yield from loss_scale_violations(self)


class InterconnectSpec(SpecModel):
    """Network speeds used by analytic calibration and the simulator."""

    intra_node_gbps: float = Field(100.0, gt=0.0, description="Bandwidth within a node, Gbit/s.")
    inter_node_gbps: float = Field(10.0, gt=0.0, description="Bandwidth between nodes, Gbit/s.")
    latency_us: float = Field(50.0, ge=0.0, description="Point-to-point latency, microseconds.")


class SlurmSpec(SpecModel):
    """How the Slurm backend asks for its allocation (rendered as ``#SBATCH`` lines)."""

    partition: str | None = Field(
        None, pattern=SLURM_NAME, description="Partition(s), comma-separated; null = default."
    )
    account: str | None = Field(None, pattern=SLURM_NAME, description="Account to charge.")
    qos: str | None = Field(None, pattern=SLURM_NAME, description="Quality of service.")
    time_limit_minutes: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Wall-clock limit in minutes; null = the partition's limit.",
    )
    signal_before_s: int = Field(
        120,
        ge=0,
        le=65535,
        description="Seconds before the time limit at which Slurm sends SIGTERM to every "
        "process of the job, so each rank checkpoints at the end of its step and exits "
        "(the run stops resumable); 0 sends no signal.",
    )
    requeue: bool | None = Field(
        None, description="Requeue after preemption or node failure; null = when hardware.spot."
    )
    sbatch_args: list[str] = Field(
        default=[],
        description="Extra sbatch options, one '--name' or '--name=value' each (no spaces or "
        "quotes), e.g. '--exclusive' or '--constraint=a100'.",
        json_schema_extra={"items": {"pattern": SBATCH_OPTION}},
    )

    @field_validator("sbatch_args")
    @classmethod
    def _options_are_single_words(cls, value: list[str]) -> list[str]:
        for arg in value:
            require_match(
                arg,
                SBATCH_OPTION,
                "sbatch_option",
                f"{arg!r} is not an sbatch option",
                fix="write each as '--name' or '--name=value' without spaces or quotes",
            )
        return value


class KubernetesSpec(SpecModel):
    """Where and how the Kubernetes backend runs its pods."""

    image: ImageRef = Field(
        ...,
        pattern=NO_SPACE,
        description="Container image with torch and jobctl installed, e.g. "
        "'ghcr.io/acme/jobctl:0.1'.",
    )
    namespace: str = Field("default", pattern=DNS_LABEL, description="Namespace of the job.")
    kind: Literal["pytorchjob", "jobset", "trainjob"] = Field(
        "pytorchjob",
        description="Kubeflow PyTorchJob with an elastic policy, a JobSet of indexed Jobs, "
        "or a Kubeflow Trainer v2 TrainJob with its ClusterTrainingRuntime.",
    )
    secrets: list[Annotated[str, Field(pattern=DNS_SUBDOMAIN)]] = Field(
        default=[],
        description="Secret names whose keys become environment variables (envFrom "
        "secretRef); values never appear in the manifests.",
    )
    node_selector: Labels = Field(
        default={}, description="Node labels the pods must match, e.g. a GPU or spot pool."
    )
    service_account: str | None = Field(
        None, pattern=DNS_SUBDOMAIN, description="Service account of the pods."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the image."
    )
    volume_claim: str | None = Field(
        None,
        pattern=DNS_SUBDOMAIN,
        description="PersistentVolumeClaim mounted as the run folder so logs and local "
        "checkpoints outlive pods; null = an emptyDir (use checkpoint.remote).",
    )
    gpu_resource: ResourceName = Field(
        "nvidia.com/gpu", pattern=NO_SPACE, description="Extended resource name of a GPU."
    )


class HardwareSpec(TopologyFields):
    """The device pool and how processes are launched on it."""

    backend: Literal["local", "slurm", "kubernetes", "ssh"] = Field(
        "local", description="Launcher backend."
    )
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Number of nodes (machines) in the pool.")
    processes_per_node: int = Field(
        1, ge=1, le=MAX_PROCESSES, description="Devices per node: GPUs, or CPU worker processes."
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="Device type of every process.")
    # 1e-300 made the planner say "needs 0.00 GB" with no line to fix (#46 item 9)
    memory_gb: float = Field(4.0, ge=MIN_MEMORY_GB, description="Memory per device, GB.")
    flops_tflops: float | None = Field(
        None,
        gt=0.0,
        description="Sustained per-device TFLOP/s for analytic calibration, used as is "
        "(no efficiency model); ignored when `accelerator` names a known device.",
    )
    accelerator: Literal[tuple(DEVICES)] | None = Field(  # type: ignore[valid-type]
        None,
        description="A known device (spec/devices.py: peak FLOP/s per precision, memory "
        "bandwidth, from public data sheets): the analytic calibration models achievable "
        "time per operation from these facts.",
    )
    price_per_hour: float = Field(0.0, ge=0.0, description="Price per device-hour, USD.")
    spot: bool = Field(False, description="Devices are preemptible spot capacity.")
    spot_price_per_hour: float | None = Field(
        None,
        ge=0.0,
        description="Spot price per device-hour, USD; with it price_per_hour is the "
        "on-demand price, `plan` shows both, and `spot` says which the run pays.",
    )
    preemptions_per_hour: float = Field(
        0.0, ge=0.0, description="Expected preemptions per spot node-hour (for costs)."
    )
    interconnect: InterconnectSpec = Field(
        default_factory=InterconnectSpec, description="Network speeds of the pool."
    )
    hosts: list[HostName] = Field(
        default=[],
        description="Node addresses (ssh backend); when given, one per node.",
    )
    rendezvous_host: HostName = Field(
        None,
        validate_default=True,
        description="Address of the supervisor's machine where every node reaches the "
        "torchrun rendezvous and the event channel; null: 127.0.0.1 when every node runs "
        "on this machine (backend 'local', or 'ssh' to localhost/127.x hosts only), else "
        "this machine's host name.",
    )
    rendezvous_port: int | None = Field(
        None, ge=1024, le=65535, description="torchrun rendezvous port; null picks a free port."
    )
    max_restarts: int = Field(
        0,
        ge=0,
        le=MAX_RESTARTS,
        description="Restarts in place after a failure before the run fails: torchrun's "
        "--max-restarts on every backend (and the PyTorchJob's elasticPolicy.maxRestarts), "
        "a JobSet's failurePolicy.maxRestarts. 0: jobctl itself resumes the run from its "
        "newest checkpoint (a restart in place starts from the checkpoint it launched with).",
    )
    slurm: SlurmSpec = Field(
        default_factory=SlurmSpec, description="Slurm backend settings (sbatch options)."
    )
    kubernetes: KubernetesSpec | None = Field(
        None, description="Kubernetes backend settings; needed for backend 'kubernetes'."
    )
    ssh: SshSpec = Field(default_factory=SshSpec, description="ssh backend settings.")

    @field_validator("rendezvous_host", mode="before")
    @classmethod
    def _rendezvous_defaults_by_where_nodes_run(cls, value: Any, info: ValidationInfo) -> Any:
        return default_rendezvous_host(info.data) if value is None else value

    @property
    def devices(self) -> int:
        """Total devices in the pool: nodes x processes_per_node."""
        return self.nodes * self.processes_per_node

    @property
    def one_machine(self) -> bool:
        """Every "node" runs on this machine (the local backend): the planner places its
        ranks on one host, and the runtime reaches every peer through shared memory."""
        return self.backend == "local"

    def _violations(self) -> Iterator[Violation]:
        if self.hosts and len(self.hosts) != self.nodes:
            yield Violation(
                "hosts",
                f"hosts lists {len(self.hosts)} "
                f"address{'es' if len(self.hosts) != 1 else ''} for {self.nodes} nodes",
                "list exactly one host per node, or set hardware.nodes to the number of hosts",
            )


class ParallelismSpec(AveragingFields, TensorParallelFields):
    """Pipeline (P), data (D) and tensor (T) parallelism, the schedule and averaging."""

    pipeline_stages: PositiveIntOrAuto = Field(
        "auto", description="P: stages, or 'auto'; mobius: S, above the devices N."
    )
    data_parallel: PositiveIntOrAuto = Field(
        "auto", description="D: data-parallel pipeline replicas, or 'auto'."
    )
    schedule: Literal[
        "gpipe",
        "1f1b",
        "varuna",
        "shifted_critical_path",
        "advance_forward",
        "zb_h1",
        "zb_v",
        "mobius",
        "auto",
    ] = Field(
        "1f1b", description="Pipeline schedule (zb_*: zero bubble; mobius: sec. 3 of Mobius)."
    )
    recompute: Literal["none", "all", "auto", "stage_aware"] = Field(
        "none",
        description="Activation recomputation policy; stage_aware: Merak's per-stage "
        "non-recompute ratios alpha_i, filled up to hardware.memory_gb (1f1b, gpipe).",
    )
    advance_num: int | None = Field(
        None, ge=0, description="Forwards run in advance (schedule 'advance_forward' only)."
    )
    placement: Literal["stage_major", "pipeline_major"] = Field(
        "stage_major", description="Order in which stages are placed onto ranks."
    )

    def _violations(self) -> Iterator[Violation]:
        yield from self._averaging_violations()
        if self.advance_num is not None and self.schedule not in ("advance_forward", "auto"):
            yield Violation(
                "advance_num",
                f"advance_num is only used by schedule 'advance_forward', not {self.schedule!r}",
                "remove parallelism.advance_num or set parallelism.schedule: advance_forward",
            )
