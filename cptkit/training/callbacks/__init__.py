"""Training callbacks (OLMo-core's shape): everything the loop does besides drawing a batch and
stepping the optimizer: checkpoints, evaluations, the metrics log, the mixture's weight events and
the Velocitune proxy's stop, and your own (``train.callbacks=[package.module:Class, ...]``).

A :class:`Callback` has a ``priority`` (higher runs first, in every hook; equal priorities keep the
order they were added in: the built-ins, then ``train.callbacks`` as written), hooks the
:class:`~cptkit.training.loop.Trainer` calls, and a ``state_dict`` saved in every checkpoint under
its ``key`` and restored by ``load_state_dict`` when the run resumes, so a resumed run continues
exactly. The built-ins, one module each:

====================================  ========  ==============================================
callback                              priority  what it does
====================================  ========  ==============================================
``mixture.MixtureCallback``           400       stage entries, the controller's eval and update,
                                                ``weights.jsonl`` events; state: the controller
``evaluator.EvaluatorCallback``       300       ``train.eval_every`` points (and the final one)
``metrics.MetricsCallback``           200       each step's row to ``metrics.jsonl``, progress,
                                                TensorBoard, W&B
``proxy.ProxyStopCallback``           100       the Velocitune proxy's checkpoints and early
                                                stop; state: its checkpoint losses
your ``train.callbacks``              0         (the default)
``checkpointer.CheckpointerCallback`` -100      ``OUT/checkpoints`` every ``train.save_every``
                                                steps and at the end, after every other hook
====================================  ========  ==============================================
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from cptkit.core.errors import CptkitError
from cptkit.core.registry import load_plugin
from cptkit.mixtures.stages import StageMixture
from cptkit.mixtures.stream import Sampler
from cptkit.training.evaluation import EvalPoints
from cptkit.training.metrics import MetricsLog
from cptkit.training.state import Engine, RunSpec, TrainState


class Loop(Protocol):
    """What a callback sees of the trainer (:class:`cptkit.training.loop.Trainer`)."""

    spec: RunSpec
    state: TrainState  # step and tokens done so far (``step`` already counts the step in post_step)
    engine: Engine  # ``engine.module``: the model, for evaluations
    tokenizer: Any
    sampler: Sampler
    mixture: StageMixture
    evals: EvalPoints  # the held-out documents and tasks
    log: MetricsLog  # metrics.jsonl and weights.jsonl (rank 0; a no-op elsewhere)
    total_steps: int  # lower it to stop the run after this step
    info: dict[str, Any]  # what this step's pre_step hooks measured: merged into its metrics row
    mix_s: float  # seconds spent on the mixture's evaluations and updates
    callbacks: list[Callback]


class Callback:
    """A training callback: override the hooks you need. ``self.trainer`` is set before ``pre_train``."""

    priority: ClassVar[int] = 0
    name: ClassVar[str] = ""  # the key of its state in checkpoints (default: package.module:Class)
    trainer: Loop

    @property
    def key(self) -> str:
        return self.name or f"{type(self).__module__}:{type(self).__qualname__}"

    def attach(self, trainer: Loop) -> None:
        self.trainer = trainer

    def pre_train(self) -> None:
        """After setup and resume (states loaded), before the first step."""

    def pre_step(self) -> None:
        """Before the step's batch is drawn (``trainer.state.step`` steps done); may add to ``trainer.info``."""

    def on_stage(self, stage: str) -> None:
        """A stage of the mixture begins inside this step's batch."""

    def post_step(self, row: dict[str, Any]) -> None:
        """After the optimizer step; ``row`` is the step's metrics line (``loss``, ``lr``, ``weights``...)."""

    def post_train(self) -> None:
        """After the last step, before the outputs (the final model) are written."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this callback (tensors, numbers, strings, lists and dicts)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result when the run resumes (before ``pre_train``)."""


def load_callbacks(specs: list[str]) -> list[Callback]:
    """``train.callbacks``: each ``package.module:Class`` imported, checked to be a :class:`Callback`
    and built without arguments; a class named twice is refused (its states would collide)."""
    out = [load_plugin(spec, "train.callbacks", Callback)() for spec in specs]
    keys = [cb.key for cb in out]
    twice = [k for i, k in enumerate(keys) if k in keys[:i]]
    if twice:
        raise CptkitError(f"train.callbacks: {twice[0]} is named twice")
    return out
