"""What the Mobius runtime's unit tests share: a runner over a tiny spec's model on a
CPU file tier, and an autouse fixture holding torch to one thread while a test runs
(a test module applies it by importing ``one_thread``)."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.data.dataset import make_data
from jobctl.engine.mobius.runtime import MobiusRunner, SwapConfig
from jobctl.engine.model.blocks import ModelDef, model_def

ADAMW = {"training.optimizer": "adamw", "training.lr": 0.01, "training.weight_decay": 0.1}


@pytest.fixture(autouse=True)
def one_thread():
    """Torch on one thread for the test, the count it had restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def runner_and_def(spec, folder, stages=None, device=None, **cfg) -> tuple[MobiusRunner, ModelDef]:
    """One rank running all of ``spec``'s model at micro-batch size 2, cut into
    ``stages`` (default: a stage per block) swapped through ``folder``; ``cfg``: more
    of its ``SwapConfig``. The model definition too, for a re-cut (``relaid``)."""
    m = 2
    mdef = model_def(spec.model, spec.training.seed, m)
    stages = stages or tuple((i,) for i in range(mdef.num_blocks))
    swap = SwapConfig(folder, stages, m, **cfg)
    return MobiusRunner(mdef, spec.training, make_data(spec), swap, device), mdef


def mobius_runner(spec, folder, stages=None, device=None, **cfg) -> MobiusRunner:
    """:func:`runner_and_def`'s runner."""
    return runner_and_def(spec, folder, stages, device, **cfg)[0]
