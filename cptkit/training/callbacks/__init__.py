"""Training callbacks (OLMo-core's shape): everything the loop does besides drawing a batch and
stepping the optimizer: checkpoints, evaluations, the metrics log, the mixture's weight events and
the Velocitune proxy's stop, and your own. ``train.callbacks`` names them, with arguments, and turns
built-ins off (:func:`cptkit.training.config.callback_specs`: ``[package.module:Class, ...]``, a list
of ``{name, args, enabled}``, or ``{name: {arg: value, enabled: false}}``).

A :class:`Callback` has a ``priority`` (higher runs first, in every hook; equal priorities keep the
order they were added in: the built-ins, then ``train.callbacks`` as written), hooks the
:class:`~cptkit.training.loop.Trainer` calls, and a ``state_dict`` saved in every checkpoint under
its ``key`` and restored by ``load_state_dict`` when the run resumes, so a resumed run continues
exactly. A callback changes the run only through the :class:`Loop` methods (``add_metrics``,
``request_stop``, ``add_mixture_seconds``). ``on_error`` runs when the run raises, ``close`` always,
last. The built-ins, one module each (``mixture`` and ``metrics`` cannot be turned off):

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

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from cptkit.core.errors import CptkitError
from cptkit.core.registry import load_plugin
from cptkit.mixtures.stages import StageMixture
from cptkit.mixtures.stream import Sampler
from cptkit.training.config import CallbackSpec
from cptkit.training.evaluation import EvalPoints
from cptkit.training.metrics import MetricsLog
from cptkit.training.state import Engine, RunSpec, Stateful, TrainState


class Loop(Protocol):
    """What a callback sees of the trainer (:class:`cptkit.training.loop.Trainer`): read the run
    through the attributes, change it only through the methods."""

    spec: RunSpec
    state: TrainState  # step and tokens done so far (``step`` already counts the step in post_step)
    engine: Engine  # ``engine.module``: the model, for evaluations
    tokenizer: Any
    sampler: Sampler
    mixture: StageMixture
    evals: EvalPoints  # the held-out documents and tasks
    log: MetricsLog  # metrics.jsonl and weights.jsonl (rank 0; a no-op elsewhere)

    @property
    def total_steps(self) -> int:
        """The step the run ends after (:meth:`request_stop` lowers it)."""

    @property
    def step_metrics(self) -> Mapping[str, Any]:
        """What this step's pre_step hooks measured so far (read-only): merged into its metrics row."""

    @property
    def stop_reason(self) -> str | None:
        """Why the run stops early (None: it runs to its planned end)."""

    def add_metrics(self, values: Mapping[str, Any]) -> None:
        """Add ``values`` to this step's metrics row (from ``pre_step``)."""

    def add_mixture_seconds(self, seconds: float) -> None:
        """Count ``seconds`` spent on the mixture's evaluations and updates (the manifest's share)."""

    def request_stop(self, reason: str) -> None:
        """End the run after the current step (from ``post_step``: later callbacks see it as the last)."""

    def callback_states(self) -> dict[str, Stateful]:
        """Every callback by its state's key: what a checkpoint saves."""


class Callback:
    """A training callback: override the hooks you need. ``self.trainer`` is set before ``pre_train``;
    ``train.callbacks`` builds it with its ``args`` as keyword arguments."""

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
        """Before the step's batch is drawn (``trainer.state.step`` steps done); may ``trainer.add_metrics``."""

    def on_stage(self, stage: str) -> None:
        """A stage of the mixture begins inside this step's batch."""

    def post_step(self, row: dict[str, Any]) -> None:
        """After the optimizer step; ``row`` is the step's metrics line (``loss``, ``lr``, ``weights``...)."""

    def post_train(self) -> None:
        """After the last step, before the outputs (the final model) are written."""

    def on_error(self, exc: BaseException) -> None:
        """The run raised ``exc`` (after setup: in a hook, a step or writing the outputs); it is re-raised
        after every callback's ``on_error``."""

    def close(self) -> None:
        """Always the last hook, after success or an error: release what the callback holds."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this callback (tensors, numbers, strings, lists and dicts)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result when the run resumes (before ``pre_train``)."""


def load_callbacks(specs: list[CallbackSpec]) -> list[Callback]:
    """The ``package.module:Class`` entries of ``train.callbacks`` that are on, each imported, checked
    to be a :class:`Callback` and built with its ``args`` (one line naming the entry if any fails)."""
    out = []
    for s in specs:
        if ":" not in s.name or not s.enabled:
            continue
        cls = load_plugin(s.name, "train.callbacks", Callback)
        try:
            out.append(cls(**s.args))
        except TypeError as e:
            raise CptkitError(f"train.callbacks: {s.name} cannot be built with {s.args}: {e}") from None
    return out


def arrange(builtins: list[Callback], user: list[Callback], specs: list[CallbackSpec]) -> list[Callback]:
    """The run's callbacks in the order they run: the ``builtins`` that ``specs`` leave on, then
    ``user``, sorted by priority, higher first (ties keep this order); two with one state key are refused."""
    off = {s.name for s in specs if not s.enabled}
    out = [cb for cb in builtins if cb.name not in off] + user
    keys = [cb.key for cb in out]
    twice = [k for i, k in enumerate(keys) if k in keys[:i]]
    if twice:
        raise CptkitError(f"train.callbacks: {twice[0]} is named twice")
    return sorted(out, key=lambda cb: -cb.priority)  # stable: ties keep order
