"""Where speculation spends engine time, and how much of it goes to draft tokens that were rejected.

Both profilers (vLLM's torch profiler on the CPU engine, Nsight Systems on GPUs) are reduced to the same
thing: a list of engine steps, each with its batch composition (from vLLM's per-step annotation
`execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`) and the time spent in drafting, target
verification, rejection sampling and everything else. `compute_breakdown` combines those steps with the
window's speculation counters (deltas of vLLM's `/metrics`) into the shares; docs/profiling.md states the
model, its apportioning rules and their assumptions. In short:

- engine time E: CPU: the worker's busy time (its execute_model / sample_tokens / take_draft_token_ids
  calls); GPU: kernel time. drafting D, verification V (the target's forward over every scheduled
  position), rejection sampling R, other O = E - D - V - R.
- verification of drafted positions: each step's V split over its positions in proportion to their
  number (drafted positions of a step = generation tokens - generation requests);
  wasted verification = that part x (rejected / verified draft tokens), from the counters.
- drafting: spent per (request, draft position) slot; position j of every request the drafter ran for is
  kept only when accepted at position j (the per-position counter); wasted drafting = sum over positions of
  drafting time of position j x (1 - accepted_j / slots). Drafts never verified (the request finished) are
  wasted too. Per-position drafting time comes from the trace when it shows the k draft passes, else D/k.
- added work A = D + verification of drafted positions; wasted W = wasted drafting + wasted verification;
  wasted_share = W / E, wasted_share_of_added = W / A.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from specgauge.errors import SpecgaugeError

BREAKDOWN_FORMAT = 1

# vLLM's per-step annotation (vllm/v1/worker/gpu_worker.py annotate_profile), simple and detailed forms:
#   execute_context_1(13)_generation_2(8)
#   execute_21_context_1(sq13sk13sqsq169sqsk169)_generation_2(sq8sk60sqsq32sqsk240)
STEP_ANNOTATION = re.compile(
    r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)[^)]*\)$"
)

# Agreement demanded between what the trace says was verified and what the counters say (relative).
CROSS_CHECK_TOLERANCE = 0.02


class ProfileError(SpecgaugeError):
    """A trace or export that cannot be analysed; the message names the file and what is missing."""


def parse_step_annotation(name: str) -> tuple[int, int, int, int] | None:
    """(context requests, context tokens, generation requests, generation tokens), or None."""
    found = STEP_ANNOTATION.match(name)
    if not found:
        return None
    ctx_req, ctx_tok, gen_req, gen_tok = (int(g) for g in found.groups())
    return ctx_req, ctx_tok, gen_req, gen_tok


@dataclass(frozen=True)
class Step:
    """One engine step (iteration) of a profiled window, times in seconds."""

    index: int
    t_s: float  # start, from the window's first step
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int  # 1 + drafted positions for every generation request
    engine_s: float
    drafting_s: float = 0.0
    verification_s: float = 0.0
    rejection_s: float = 0.0
    # Drafting time per draft position (length k) when the trace shows the drafter's k passes.
    drafting_by_position_s: tuple[float, ...] | None = None

    @property
    def positions(self) -> int:
        """Every position the target computed in this step (prefill chunks, last tokens, drafts)."""
        return self.context_tokens + self.generation_tokens

    @property
    def drafted_positions(self) -> int:
        """Draft tokens verified in this step: each generation request has one non-draft position."""
        return max(self.generation_tokens - self.generation_requests, 0)

    @property
    def requests(self) -> int:
        return self.context_requests + self.generation_requests


@dataclass(frozen=True)
class WindowCounters:
    """Speculation counter deltas over the profiled window (see tasks.metrics.prometheus.SpecDelta)."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...] | None = None  # index = draft position

    @property
    def rejected_tokens(self) -> int:
        return self.draft_tokens - self.accepted_tokens

    @classmethod
    def from_spec_delta(cls, delta: Any) -> WindowCounters:
        """From a `SpecDelta` (or anything with its attributes)."""
        per_pos: Mapping[str, int] = getattr(delta, "accepted_per_position", {}) or {}
        ordered: tuple[int, ...] | None = None
        if per_pos:
            positions = sorted(int(p) for p in per_pos)
            if positions != list(range(len(positions))):
                raise ProfileError(f"per-position counters have positions {positions}, expected 0..k-1")
            ordered = tuple(int(per_pos[str(p)]) for p in positions)
        return cls(
            drafts=int(delta.drafts),
            draft_tokens=int(delta.draft_tokens),
            accepted_tokens=int(delta.accepted_tokens),
            accepted_per_position=ordered,
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["accepted_per_position"] = (
            list(self.accepted_per_position) if self.accepted_per_position else None
        )
        out["rejected_tokens"] = self.rejected_tokens
        out["acceptance_rate"] = self.accepted_tokens / self.draft_tokens if self.draft_tokens else None
        return out


@dataclass(frozen=True)
class Breakdown:
    """The result for one profiled window. `to_json()` is breakdown.json."""

    source: str  # "torch-profiler" or "nsys"
    k: int | None
    steps: tuple[Step, ...]
    counters: WindowCounters | None
    engine_s: float
    drafting_s: float
    verification_s: float
    rejection_s: float
    other_s: float
    verification_drafted_s: float
    added_s: float
    wasted_verification_s: float | None
    wasted_drafting_s: float | None
    apportioning: str  # "position-aware" | "uniform" | "none"
    cross_checks: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def wasted_s(self) -> float | None:
        if self.wasted_verification_s is None or self.wasted_drafting_s is None:
            return None
        return self.wasted_verification_s + self.wasted_drafting_s

    def _share(self, value: float | None, of: float | None = None) -> float | None:
        whole = self.engine_s if of is None else of
        return None if value is None or not whole else value / whole

    @property
    def shares(self) -> dict[str, float | None]:
        wasted = self.wasted_s
        useful = None if wasted is None else self.drafting_s + self.verification_s - wasted
        return {
            "wasted_share": self._share(wasted),
            "drafting_share": self._share(self.drafting_s),
            "verification_share": self._share(self.verification_s),
            "rejection_share": self._share(self.rejection_s),
            "other_share": self._share(self.other_s),
            "useful_share": self._share(useful),
            "added_share": self._share(self.added_s),
            "wasted_share_of_added": self._share(wasted, self.added_s) if self.added_s else None,
            "wasted_drafting_share": self._share(self.wasted_drafting_s),
            "wasted_verification_share": self._share(self.wasted_verification_s),
        }

    def to_json(self, *, with_steps: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": BREAKDOWN_FORMAT,
            "source": self.source,
            "k": self.k,
            "apportioning": self.apportioning,
            "shares": self.shares,
            "seconds": {
                "engine": self.engine_s,
                "drafting": self.drafting_s,
                "verification": self.verification_s,
                "rejection": self.rejection_s,
                "other": self.other_s,
                "verification_drafted": self.verification_drafted_s,
                "added": self.added_s,
                "wasted": self.wasted_s,
                "useful": None
                if self.wasted_s is None
                else self.drafting_s + self.verification_s - self.wasted_s,
                "wasted_drafting": self.wasted_drafting_s,
                "wasted_verification": self.wasted_verification_s,
            },
            "counters": self.counters.to_json() if self.counters else None,
            "trace_counts": {
                "steps": len(self.steps),
                "positions": sum(s.positions for s in self.steps),
                "drafted_positions": sum(s.drafted_positions for s in self.steps),
                "generation_requests": sum(s.generation_requests for s in self.steps),
                "draft_slots": draft_slots(self.steps),
            },
            "cross_checks": self.cross_checks,
            "notes": list(self.notes),
        }
        if with_steps:
            out["steps"] = [
                {
                    **{k: v for k, v in asdict(s).items() if k != "drafting_by_position_s"},
                    "drafting_by_position_s": list(s.drafting_by_position_s)
                    if s.drafting_by_position_s
                    else None,
                }
                for s in self.steps
            ]
        return out


def draft_slots(steps: Sequence[Step]) -> int:
    """Requests the drafter proposed for, summed over steps: each gets k draft positions."""
    return sum(s.requests for s in steps if s.drafting_s > 0)


def _cross_check(trace_value: float, counter_value: float) -> dict[str, Any]:
    diff = (
        abs(trace_value - counter_value) / counter_value if counter_value else (1.0 if trace_value else 0.0)
    )
    return {
        "trace": trace_value,
        "counters": counter_value,
        "rel_diff": diff,
        "ok": diff <= CROSS_CHECK_TOLERANCE,
    }


def _drafting_by_position(steps: Sequence[Step], k: int) -> tuple[list[float], bool]:
    """Drafting seconds per draft position; True when measured (all drafting steps show k passes)."""
    drafting = [s for s in steps if s.drafting_s > 0]
    if drafting and all(s.drafting_by_position_s and len(s.drafting_by_position_s) == k for s in drafting):
        totals = [0.0] * k
        for step in drafting:
            for j, seconds in enumerate(step.drafting_by_position_s or ()):
                totals[j] += seconds
        return totals, True
    total = sum(s.drafting_s for s in drafting)
    return [total / k] * k, False


def compute_breakdown(
    steps: Sequence[Step],
    counters: WindowCounters | None,
    *,
    k: int | None,
    source: str,
    notes: Sequence[str] = (),
) -> Breakdown:
    """The window's breakdown (see the module docstring and docs/profiling.md for the rules).

    `counters` None (no /metrics deltas) gives the time split without any wasted figure; `k` None is taken
    from the per-position counters when they exist.
    """
    if not steps:
        raise ProfileError("no engine steps in the profiled window (was any request served while profiling?)")
    if k is None and counters is not None and counters.accepted_per_position:
        k = len(counters.accepted_per_position)
    engine = sum(s.engine_s for s in steps)
    drafting = sum(s.drafting_s for s in steps)
    verification = sum(s.verification_s for s in steps)
    rejection = sum(s.rejection_s for s in steps)
    other = engine - drafting - verification - rejection
    verification_drafted = sum(
        s.verification_s * s.drafted_positions / s.positions for s in steps if s.positions
    )
    added = drafting + verification_drafted
    notes = list(notes)
    cross_checks: dict[str, Any] = {}
    wasted_verification: float | None = None
    wasted_drafting: float | None = None
    apportioning = "none"

    if counters is not None:
        trace_drafted = sum(s.drafted_positions for s in steps)
        cross_checks["draft_tokens"] = _cross_check(trace_drafted, counters.draft_tokens)
        # Drafts are countable from the trace only when every generation request carried k drafts (draft
        # model, EAGLE); an n-gram lookup may propose fewer or none for some requests of a step.
        if k is not None and all(s.drafted_positions == k * s.generation_requests for s in steps):
            trace_drafts = sum(s.generation_requests for s in steps if s.drafted_positions)
            cross_checks["drafts"] = _cross_check(trace_drafts, counters.drafts)
        if not all(c["ok"] for c in cross_checks.values()):
            notes.append(
                "the trace's verified drafts disagree with the counters' deltas: traffic outside the "
                "profiled window (or counters published late) reached the counters; shares are less exact"
            )
        rejected_ratio = counters.rejected_tokens / counters.draft_tokens if counters.draft_tokens else 0.0
        wasted_verification = verification_drafted * rejected_ratio
        slots = draft_slots(steps)
        if drafting <= 0 or slots == 0:
            wasted_drafting = 0.0  # nothing drafted (a plain deployment): nothing to apportion
        else:
            if k is None:
                raise ProfileError(
                    "k (draft positions) is unknown: give it, or counters with per-position data"
                )
            by_position, measured = _drafting_by_position(steps, k)
            per_pos = counters.accepted_per_position
            if per_pos is not None and len(per_pos) != k:
                raise ProfileError(f"per-position counters have {len(per_pos)} positions but k is {k}")
            kept = (
                [a / slots for a in per_pos]
                if per_pos is not None
                else [counters.accepted_tokens / (k * slots)] * k
            )
            if any(f > 1.0 + 1e-9 for f in kept):
                notes.append(
                    "more tokens were accepted at some position than the trace shows draft slots for: "
                    "counters include traffic outside the window; kept fractions were capped at 1"
                )
            wasted_drafting = sum(t * (1.0 - min(f, 1.0)) for t, f in zip(by_position, kept, strict=True))
            apportioning = "position-aware" if (measured and per_pos is not None) else "uniform"
            cross_checks["draft_slots"] = {"trace": slots * k, "verified_draft_tokens": counters.draft_tokens}
    return Breakdown(
        source=source,
        k=k,
        steps=tuple(steps),
        counters=counters,
        engine_s=engine,
        drafting_s=drafting,
        verification_s=verification,
        rejection_s=rejection,
        other_s=other,
        verification_drafted_s=verification_drafted,
        added_s=added,
        wasted_verification_s=wasted_verification,
        wasted_drafting_s=wasted_drafting,
        apportioning=apportioning,
        cross_checks=cross_checks,
        notes=tuple(notes),
    )


def counters_from_metrics(before: str, after: str, model_name: str) -> WindowCounters:
    """The window's counters from two `/metrics` texts (tasks.metrics.prometheus does the deltas)."""
    from tasks.metrics.prometheus import spec_decode_delta

    return WindowCounters.from_spec_delta(spec_decode_delta(before, after, model_name))
