"""Training follows the stream's stages (SPEC §9a).

A build-mix stream plans its budget as stages (Llama-3-SynE stage 1 → stage 2, a
domain-upsampling tail, ...). ``train`` follows them in order by default: each stage covers
the same share of the run's sequences as of the stream's plan (exactly the plan's boundaries
when the run trains the stream's own budget, scaled otherwise), and the domain of every
sequence is drawn from the weights of the stage that sequence falls in, so a global batch that
straddles a boundary is split at the boundary sequence.

:class:`StageMixture` is what ``train`` asks for weights. Within a stage the weights are the
stage's static weights, unless a dynamic controller (topic_ppl, velocitune, dbl) acts in that
stage (``train.controller_stages``; default: every stage): then the controller restarts from the
stage's initial weights, restricted to the stage's domains (those with weight > 0), and updates
only those; its learnt state (ℓ_init, targets, previous PPL, round clock) carries over.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cptkit.core.errors import CptkitError
from cptkit.mixtures.controller import Controller

if TYPE_CHECKING:
    from cptkit.mixtures.stream import Sampler


@dataclass(frozen=True)
class RunStage:
    """One stage of a training run: sequences [start, end) of the run, drawn with ``weights``."""

    name: str
    start: int
    end: int
    weights: dict[str, float]  # over all stream domains (0 outside the stage), sum 1
    ordered: bool = True  # false: PPL-ordered domains are sampled at random here (build-mix `curriculum: false`)

    @property
    def domains(self) -> list[str]:
        return [d for d, w in self.weights.items() if w > 0]


def run_stages(stages: Sequence[dict[str, Any]], domains: Sequence[str], stream_sequences: int,
               run_sequences: int) -> list[RunStage]:
    """The stream's stages (``_stream.json`` ``stages``) mapped onto a run of ``run_sequences``.

    Stage i ends at round(end_i / stream_sequences · run_sequences): the plan's own boundaries
    when the run trains the stream's budget. Stages that get no sequence are dropped.
    """
    if not stages:
        raise CptkitError("the stream has no stages")
    if stream_sequences <= 0:
        raise CptkitError("the stream plans no sequences")
    out: list[RunStage] = []
    start = 0
    for i, st in enumerate(stages):
        end = run_sequences if i == len(stages) - 1 else round(int(st["end"]) / stream_sequences * run_sequences)
        end = max(start, min(end, run_sequences))
        w = {d: float(st["weights"].get(d, 0.0)) for d in domains}
        unknown = [k for k in st["weights"] if k not in set(domains)]
        if unknown:
            raise CptkitError(f"stream stage {st.get('name', i)!r}: unknown domain {unknown[0]!r}")
        tot = sum(w.values())
        if tot <= 0:
            raise CptkitError(f"stream stage {st.get('name', i)!r}: all weights are 0")
        if end > start:
            out.append(RunStage(str(st.get("name", f"stage{i}")), start, end, {d: v / tot for d, v in w.items()},
                                st.get("curriculum", True) is not False))
        start = end
    return out


def plan_read(plan_domains: Sequence[int], domains: Sequence[str], stages: Sequence[RunStage],
              n_run: int) -> dict[str, Any]:
    """What a ``staged`` run of ``n_run`` sequences reads of a plan (its rows' domain indices, in order,
    wrapping), against what its stages give it: per domain the share read and the nominal share, and the
    domain of the largest gap. A plan interleaved at random holds its shares over its whole length only:
    a run that reads a prefix of it (fewer sequences than planned) can read other shares, and a later
    stage (an upsampling tail) not at all."""
    m = len(plan_domains)
    if m == 0 or n_run <= 0:
        raise CptkitError("plan_read: an empty plan or run")
    laps, rest = divmod(n_run, m)  # the run reads the plan `laps` times over, then its first `rest` rows
    whole, head = Counter(map(int, plan_domains)), Counter(map(int, plan_domains[:rest]))
    read = {d: (laps * whole[i] + head[i]) / n_run for i, d in enumerate(domains)}
    nominal = {d: sum((st.end - st.start) * st.weights.get(d, 0.0) for st in stages) / n_run for d in domains}
    worst = max(domains, key=lambda d: abs(read[d] - nominal[d]))
    return {"sequences": n_run, "planned": m, "read": read, "nominal": nominal, "worst": worst,
            "gap": abs(read[worst] - nominal[worst])}


def segments(stages: Sequence[RunStage], position: int, n: int) -> list[tuple[int, int]]:
    """Split sequences [position, position + n) by stage: [(stage index, count), ...].

    Sequences past the last stage's end belong to the last stage.
    """
    out: list[tuple[int, int]] = []
    pos, left = position, n
    for i, st in enumerate(stages):
        if left <= 0:
            break
        last = i == len(stages) - 1
        if pos >= st.end and not last:
            continue
        take = left if last else min(left, st.end - pos)
        if take > 0:
            out.append((i, take))
            pos += take
            left -= take
    return out


class StageMixture:
    """Stages in order; an optional dynamic controller acting within its stages.

    ``init_weights(stage)`` gives the controller's starting weights in a stage (restricted to
    the stage's domains by the caller's rule). ``controller`` is None for plain static stages.
    The interface used by ``train``: ``dynamic``, ``wants_eval``, ``eval_docs``, ``update``,
    ``segments``, ``weights``, ``state_dict``/``load_state_dict``.
    """

    def __init__(self, stages: list[RunStage], controller: Controller | None = None,
                 controller_stages: Sequence[str] | None = None,
                 init_weights: Callable[[RunStage], dict[str, float]] | None = None,
                 exact_plan: bool = False):
        self.stages = stages
        self.controller = controller
        names = [s.name for s in stages]
        if controller_stages is not None:
            unknown = [s for s in controller_stages if s not in names]
            if unknown:
                raise CptkitError(f"train.controller_stages: unknown stage {unknown[0]!r}; the run's stages are "
                                  f"{', '.join(names)}")
        self.acts = [controller is not None and (controller_stages is None or s.name in controller_stages)
                     for s in stages]
        self.init_weights = init_weights
        self.exact_plan = exact_plan  # `staged`: the sampler follows the stream's plan row by row
        self.current = -1  # stage index entered last
        self.dynamic = bool(controller is not None and controller.dynamic and any(self.acts))
        self.enter(0)

    @property
    def stage(self) -> RunStage:
        return self.stages[max(self.current, 0)]

    @property
    def weights(self) -> dict[str, float] | None:
        """The weights in force now (None: following the plan row by row)."""
        if self.exact_plan:
            return None
        i = max(self.current, 0)
        if self.acts[i]:
            return self.controller.weights
        return self.stages[i].weights

    def enter(self, i: int) -> bool:
        """Make stage ``i`` current; True when it changed."""
        if i == self.current:
            return False
        self.current = i
        if self.acts[i]:
            st = self.stages[i]
            start = self.init_weights(st) if self.init_weights is not None else st.weights
            self.controller.enter_stage(st.domains, start)
        return True

    def begin_step(self, position: int) -> str | None:
        """Enter the stage of sequence ``position`` (the step's first) before its evaluation.

        Returns the stage's name when it was entered now (for the log), else None.
        """
        for i, st in enumerate(self.stages):
            if position < st.end or i == len(self.stages) - 1:
                return st.name if self.enter(i) else None
        return None

    def wants_eval(self, step: int, tokens: int) -> bool:
        """Per-domain eval losses needed before this step (ℓ_init is always taken before step 0)."""
        if not self.dynamic:
            return False
        c = self.controller
        if step == 0 and getattr(c, "needs_init", False):
            return True
        return self.acts[max(self.current, 0)] and c.wants_eval(step, tokens)

    def eval_docs(self, step: int, default: int) -> int:
        """Held-out documents per domain for this evaluation (0: all)."""
        fn = getattr(self.controller, "eval_docs", None)
        return int(fn(step, default)) if fn is not None else int(default)

    def update(self, step: int, tokens: int, losses: dict[str, float]) -> dict[str, Any]:
        return self.controller.update(step, tokens, losses)

    def segments(self, position: int, n: int) -> Iterator[tuple[RunStage, int, dict[str, float] | None, bool]]:
        """The next ``n`` sequences as (stage, count, weights or None, entered), lazily.

        Entering a stage (``entered``) resets an acting controller to the stage's start weights;
        it happens when the segment is reached, so ``weights`` is the stage's own.
        """
        for i, count in segments(self.stages, position, n):
            entered = self.enter(i)
            yield self.stages[i], count, self.weights, entered

    def state_dict(self) -> dict[str, Any]:
        return {"current": self.current,
                "controller": self.controller.state_dict() if self.controller is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "current" not in state:  # a checkpoint written before stages: the controller's own state
            state = {"current": 0, "controller": state}
        self.current = int(state["current"])
        if self.controller is not None and state.get("controller") is not None:
            self.controller.load_state_dict(state["controller"])


def draw_batch(mixture: StageMixture, sampler: Sampler, n: int, domains: Sequence[str],
               on_stage: Callable[[str], None] | None = None) -> tuple[list[tuple[int, int]], dict[str, Any]]:
    """Draw a global batch of ``n`` sequences stage by stage.

    Returns the (domain, sequence) pairs and what to log: ``stage`` (of the batch's first
    sequence), ``draws`` ([{stage, counts}] per stage segment) and ``weights_used`` (the
    sequence-weighted weights in force; the actual draw shares when following the plan).
    """
    pairs: list[tuple[int, int]] = []
    draws = []
    used = dict.fromkeys(domains, 0.0)
    for stage, count, weights, entered in mixture.segments(sampler.position, n):
        name = stage.name
        if entered and on_stage is not None:
            on_stage(name)
        got = sampler.draw(count, weights, stage.ordered)
        pairs += got
        c = Counter(domains[d] for d, _ in got)
        draws.append({"stage": name, "counts": {d: c[d] for d in domains if c[d]}})
        for d in domains:
            used[d] += weights[d] * count if weights is not None else c[d]
    return pairs, {"stage": draws[0]["stage"], "draws": draws, "weights_used": {d: v / n for d, v in used.items()}}
