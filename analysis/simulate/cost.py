"""What a simulated shape would cost: a step-time model fitted on a campaign's measured cells, and the
projected TPOT, throughput and speedup of each shape at each of the campaign's closed-loop loads.

One decode step of C sequences, each verifying 1 + d draft tokens, costs (docs/simulate.md, "Cost model")

    step_s = base_s[w] + per_sequence_s[w] * C + per_batch_token_s * C * (1 + d) + sum_p per_pass_s[p] * passes_p

- `base_s` per stratum w: what a step costs before any sequence (weights, scheduling);
- `per_sequence_s` per stratum: each sequence in the batch (its KV cache read over its context: a
  summarization sequence costs more than a chat one);
- `per_batch_token_s`: each token the target computes in the step (plain's C tokens, or C x (1 + d) under
  speculation): this is what makes a wide tree at high load cost more. Plain alone cannot tell a sequence's
  cost from a token's (it verifies one token per sequence); the served chains' widths can. On the demo
  campaign, one cost per batch token and nothing per sequence left 20% rms residual: plain at C=4 costs
  more than a chain verifying 12 tokens of 4 sequences would predict; the per-sequence term brings it to 13%;
- `per_pass_s[p]`: one drafting pass of proposer p per step (a model drafter runs one forward pass per
  draft depth, so a chain of k costs k passes and a tree as many as its levels; a lookup proposer, n-gram
  or suffix, one).

Measured points (`measured_points`): plain's cells give step_s = TPOT at C tokens per step; each speculative
cell gives step_s = TPOT x tokens per step at C x its verified width, both per step from the cell's own vLLM
counters (tokens / decode steps, 1 + draft tokens / decode steps), else from the replay of the served chain
on that stratum, else vLLM's mean acceptance length and k + 1. Coefficients are fitted by non-negative least squares (a cost is never
negative; scipy.optimize.lsq_linear). A proposer the campaign did not serve has no fitted pass cost: its
shapes get no projection (suffix borrows n-gram's, both being lookups).

Projections (`project`) are anchored on plain's measurement: speedup = tokens per step x (model's plain
step) / (model's step of the shape), projected throughput = plain's measured throughput x speedup,
projected TPOT = plain's measured TPOT / speedup. The model's errors common to plain and the shape cancel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.optimize import lsq_linear

from analysis.simulate.shapes import Chain, Graft, Shape, Tree, Union
from analysis.simulate.validate import PROPOSER_OF_METHOD, served_chain

LOOKUP_PROPOSERS = frozenset({"ngram", "suffix"})  # one cheap pass per step, however many tokens
BORROWED_COST = {"suffix": "ngram"}  # a proposer never served takes the cost of its kind


def tree_levels(b: int, budget: int, depth: int) -> int:
    """Levels a static top-b tree fills breadth first with `budget` tokens and at most `depth` levels."""
    levels, used, width = 0, 0, 1
    while used < budget and levels < depth:
        width *= b
        used += min(width, budget - used)
        levels += 1
    return levels


def _passes(proposer: str, depth: int) -> int:
    return 1 if proposer in LOOKUP_PROPOSERS else depth


def drafter_passes(shape: Shape) -> dict[str, int]:
    """Drafting passes per step of each proposer of a shape (a model drafter: one per level it drafts)."""
    if isinstance(shape, Graft):
        base, graft = shape.proposers
        levels = tree_levels(shape.get("b"), shape.get("budget"), shape.depth)
        passes = {base: _passes(base, levels)}
        passes[graft] = passes.get(graft, 0) + _passes(graft, shape.get("k"))
        return passes
    if isinstance(shape, Tree):
        (name,) = shape.proposers
        return {name: _passes(name, tree_levels(shape.get("b"), shape.get("budget"), shape.depth))}
    if isinstance(shape, Union):
        passes: dict[str, int] = {}
        for name in shape.proposers:
            passes[name] = passes.get(name, 0) + _passes(name, shape.get("k"))
        return passes
    if isinstance(shape, Chain):
        (name,) = shape.proposers
        return {name: _passes(name, shape.get("k"))}
    raise TypeError(f"no pass count for {shape.label}")


def served_chain_label(method: str, k: int) -> str:
    """The shape label of a served configuration (what validation replays)."""
    return served_chain(method, k).label


# ---------------------------------------------------------------------------------------- measured points

POINT_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "stratum": pl.String,
    "concurrency": pl.Int64,
    "repeat": pl.Int64,
    "tokens_per_step": pl.Float64,
    "verified_per_seq": pl.Float64,
    "batch_tokens": pl.Float64,
    "proposer": pl.String,
    "passes": pl.Int64,
    "step_s": pl.Float64,
}


def _cell_widths(cell: Mapping[str, object]) -> tuple[float | None, float | None]:
    """A speculative cell's own tokens and verified tokens per step from vLLM's counters over its window
    (decode_steps = tokens - accepted: tasks/metrics/summary.py), or (None, None) without them."""
    steps, drafted, accepted = (cell.get(k) for k in ("decode_steps", "draft_tokens", "accepted_tokens"))
    if (
        not isinstance(steps, int)
        or steps <= 0
        or not isinstance(drafted, int)
        or not isinstance(accepted, int)
    ):
        return None, None
    return (steps + accepted) / steps, 1.0 + drafted / steps


def measured_points(cells: pl.DataFrame, sims: pl.DataFrame) -> pl.DataFrame:
    """One point per closed-loop cell with a mean TPOT: its step time and what the step verified.

    `cells`: v_cells rows (variant, method, k, workload, load_mode, concurrency, repeat, tpot_mean_s,
    mean_acceptance_length, and where known decode_steps, draft_tokens, accepted_tokens); `sims`: replay rows (config, stratum, tokens_per_step,
    verified_tokens_per_step), looked up by the served chain's label."""
    replayed = {
        (r["config"], r["stratum"]): (r["tokens_per_step"], r["verified_tokens_per_step"])
        for r in sims.iter_rows(named=True)
    }
    rows = []
    for c in cells.filter(pl.col("load_mode") == "closed", pl.col("tpot_mean_s") > 0).iter_rows(named=True):
        method, k, conc = c["method"], c["k"], int(c["concurrency"])
        if method == "none":
            tokens, width, proposer, passes = 1.0, 1.0, None, 0
        elif method in PROPOSER_OF_METHOD and k:
            tokens, width = _cell_widths(c)
            if tokens is None:  # no counters: the replay of the served chain, else vLLM's MAL and k + 1
                label = served_chain_label(method, int(k))
                tokens, width = replayed.get((label, c["workload"]), (c["mean_acceptance_length"], k + 1.0))
            if tokens is None or width is None:
                continue
            proposer = PROPOSER_OF_METHOD[method]
            passes = _passes(proposer, int(k))
        else:
            continue  # a method the simulator has no proposer for
        rows.append(
            {
                "variant": c["variant"],
                "method": method,
                "k": k,
                "stratum": c["workload"],
                "concurrency": conc,
                "repeat": c["repeat"],
                "tokens_per_step": float(tokens),
                "verified_per_seq": float(width),
                "batch_tokens": conc * float(width),
                "proposer": proposer,
                "passes": passes,
                "step_s": float(c["tpot_mean_s"]) * float(tokens),
            }
        )
    return pl.DataFrame(rows, schema=POINT_SCHEMA, orient="row")


# ---------------------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class CostModel:
    """Fitted step-time coefficients (seconds) and how well they fit their points."""

    base_s: dict[str, float]
    per_sequence_s: dict[str, float]
    per_batch_token_s: float
    per_pass_s: dict[str, float]
    points: int
    rms_relative_residual: float
    max_relative_residual: float
    fitted_on: str

    def pass_cost(self, proposer: str) -> float | None:
        cost = self.per_pass_s.get(proposer)
        if cost is None and proposer in BORROWED_COST:
            cost = self.per_pass_s.get(BORROWED_COST[proposer])
        return cost

    def step_s(
        self, stratum: str, concurrency: int, verified_per_seq: float, passes: Mapping[str, int]
    ) -> float | None:
        """The modelled step of `concurrency` sequences each verifying `verified_per_seq` tokens; None for
        a stratum or proposer the fit never saw."""
        if stratum not in self.base_s:
            return None
        total = (
            self.base_s[stratum]
            + self.per_sequence_s[stratum] * concurrency
            + self.per_batch_token_s * concurrency * verified_per_seq
        )
        for proposer, n in passes.items():
            cost = self.pass_cost(proposer)
            if cost is None:
                return None
            total += cost * n
        return total

    def describe(self) -> str:
        """One line for logs and the report."""
        return (
            f"{formula(self.base_s, self.per_sequence_s, self.per_batch_token_s, self.per_pass_s)}; fitted on "
            f"{self.fitted_on}, "
            f"{self.points} cells, residual rms {self.rms_relative_residual:.1%}, max "
            f"{self.max_relative_residual:.1%}"
        )


def formula(
    base: Mapping[str, float],
    per_sequence: Mapping[str, float],
    per_token: float,
    per_pass: Mapping[str, float],
) -> str:
    """The fitted model in words, milliseconds (for logs and the report)."""

    def ms(values: Mapping[str, float]) -> str:
        return ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(values.items()))

    return (
        f"step ms = base ({ms(base)}) + per sequence ({ms(per_sequence)}) x C + {per_token * 1e3:.2f} x batch "
        f"tokens + per drafting pass ({ms(per_pass)})"
    )


class CostFitError(ValueError):
    """Too few measured points to fit the step-time model."""


def fit_cost_model(points: pl.DataFrame, fitted_on: str) -> CostModel:
    """Non-negative least squares of step_s on [stratum one-hot, concurrency per stratum, batch_tokens,
    passes per proposer].
    Rows are weighted by 1 / step_s, so that residuals are relative: a 2 ms step counts as much as a 60 ms
    one. Needs plain at two loads (or a speculative variant) to tell the per-token cost from the base."""
    strata = sorted(set(points["stratum"].to_list()))
    proposers = sorted({p for p in points["proposer"].to_list() if p is not None})
    columns = 2 * len(strata) + 1 + len(proposers)
    if points.height < columns:
        raise CostFitError(
            f"{points.height} measured cells for {columns} coefficients: the cost model needs more loads"
        )
    x = np.zeros((points.height, columns))
    for i, row in enumerate(points.iter_rows(named=True)):
        at = strata.index(row["stratum"])
        x[i, at] = 1.0
        x[i, len(strata) + at] = row["concurrency"]
        x[i, 2 * len(strata)] = row["batch_tokens"]
        if row["proposer"] is not None:
            x[i, 2 * len(strata) + 1 + proposers.index(row["proposer"])] = row["passes"]
    y = points["step_s"].to_numpy()
    weight = 1.0 / y
    fit = lsq_linear(x * weight[:, None], y * weight, bounds=(0.0, np.inf))
    coef = fit.x
    relative = (x @ coef - y) / y
    return CostModel(
        base_s={s: float(coef[i]) for i, s in enumerate(strata)},
        per_sequence_s={s: float(coef[len(strata) + i]) for i, s in enumerate(strata)},
        per_batch_token_s=float(coef[2 * len(strata)]),
        per_pass_s={p: float(coef[2 * len(strata) + 1 + i]) for i, p in enumerate(proposers)},
        points=points.height,
        rms_relative_residual=float(math.sqrt(float(np.mean(relative**2)))),
        max_relative_residual=float(np.max(np.abs(relative))),
        fitted_on=fitted_on,
    )


def residual_frame(model: CostModel, points: pl.DataFrame) -> pl.DataFrame:
    """Each point's modelled step next to the measured one (for the report and the tests)."""
    modelled = [
        model.step_s(
            r["stratum"],
            r["concurrency"],
            r["verified_per_seq"],
            {r["proposer"]: r["passes"]} if r["proposer"] else {},
        )
        for r in points.iter_rows(named=True)
    ]
    return points.with_columns(pl.Series("modelled_step_s", modelled, dtype=pl.Float64)).with_columns(
        ((pl.col("modelled_step_s") - pl.col("step_s")) / pl.col("step_s")).alias("relative_residual")
    )


# --------------------------------------------------------------------------------------------- projections

PROJECTION_SCHEMA = {
    "shape": pl.String,
    "proposers": pl.List(pl.String),
    "stratum": pl.String,
    "load_label": pl.String,
    "concurrency": pl.Int64,
    "mean_acceptance_length": pl.Float64,
    "acceptance_rate_per_position": pl.List(pl.Float64),
    "tokens_per_step": pl.Float64,
    "verified_tokens_per_step": pl.Float64,
    "batch_tokens": pl.Float64,
    "drafting_passes": pl.Int64,
    "projected_step_s": pl.Float64,
    "plain_modelled_step_s": pl.Float64,
    "projected_tpot_s": pl.Float64,
    "projected_throughput_tok_s": pl.Float64,
    "projected_speedup": pl.Float64,
    "plain_tpot_s": pl.Float64,
    "plain_throughput_tok_s": pl.Float64,
    "served_variant": pl.String,
    "measured_speedup": pl.Float64,
}


def plain_loads(cells: pl.DataFrame) -> pl.DataFrame:
    """Plain's closed-loop loads per stratum: mean TPOT and output throughput over repeats."""
    return (
        cells.filter(pl.col("method") == "none", pl.col("load_mode") == "closed")
        .group_by("workload", "load_label", "concurrency")
        .agg(
            pl.col("tpot_mean_s").mean().alias("plain_tpot_s"),
            pl.col("output_throughput_tok_s").mean().alias("plain_throughput_tok_s"),
        )
        .rename({"workload": "stratum"})
        .sort("stratum", "concurrency")
    )


def measured_speedups(cells: pl.DataFrame) -> dict[tuple[str, str, str], tuple[str, float]]:
    """(served chain label, stratum, load) -> (variant, geometric mean over repeats of its throughput /
    plain's of the same repeat): what the served chain really did, for the cost model's check."""
    plain = cells.filter(pl.col("method") == "none", pl.col("load_mode") == "closed").select(
        "workload", "load_label", "repeat", pl.col("output_throughput_tok_s").alias("plain_thr")
    )
    spec = cells.filter(
        pl.col("method").is_in(list(PROPOSER_OF_METHOD)), pl.col("load_mode") == "closed", pl.col("k") > 0
    )
    paired = spec.join(plain, on=["workload", "load_label", "repeat"]).with_columns(
        (pl.col("output_throughput_tok_s") / pl.col("plain_thr")).log().alias("log_ratio")
    )
    found = {}
    for r in (
        paired.group_by("variant", "method", "k", "workload", "load_label")
        .agg(pl.col("log_ratio").mean())
        .iter_rows(named=True)
    ):
        label = served_chain_label(r["method"], int(r["k"]))
        found[(label, r["workload"], r["load_label"])] = (r["variant"], math.exp(r["log_ratio"]))
    return found


def project(
    model: CostModel, sims: pl.DataFrame, shapes: Sequence[Shape], cells: pl.DataFrame
) -> pl.DataFrame:
    """Every simulated shape and stratum at each of plain's closed-loop loads of that stratum."""
    by_label = {shape.label: shape for shape in shapes}
    loads = plain_loads(cells)
    served = measured_speedups(cells)
    rows = []
    for sim in sims.filter(pl.col("stratum") != "all").iter_rows(named=True):
        shape = by_label.get(sim["config"])
        if shape is None:
            continue
        passes = drafter_passes(shape)
        for load in loads.filter(pl.col("stratum") == sim["stratum"]).iter_rows(named=True):
            conc = int(load["concurrency"])
            tokens, width = sim["tokens_per_step"], sim["verified_tokens_per_step"]
            step = model.step_s(sim["stratum"], conc, width, passes) if tokens and width else None
            plain_step = model.step_s(sim["stratum"], conc, 1.0, {})
            speedup = tokens * plain_step / step if step and plain_step else None
            variant, measured = served.get((shape.label, sim["stratum"], load["load_label"]), (None, None))
            rows.append(
                {
                    "shape": shape.label,
                    "proposers": list(shape.proposers),
                    "stratum": sim["stratum"],
                    "load_label": load["load_label"],
                    "concurrency": conc,
                    "mean_acceptance_length": sim["mean_acceptance_length"],
                    "acceptance_rate_per_position": sim["acceptance_rate_per_position"],
                    "tokens_per_step": tokens,
                    "verified_tokens_per_step": width,
                    "batch_tokens": conc * width if width else None,
                    "drafting_passes": sum(passes.values()),
                    "projected_step_s": step,
                    "plain_modelled_step_s": plain_step,
                    "projected_tpot_s": load["plain_tpot_s"] / speedup if speedup else None,
                    "projected_throughput_tok_s": load["plain_throughput_tok_s"] * speedup
                    if speedup
                    else None,
                    "projected_speedup": speedup,
                    "plain_tpot_s": load["plain_tpot_s"],
                    "plain_throughput_tok_s": load["plain_throughput_tok_s"],
                    "served_variant": variant,
                    "measured_speedup": measured,
                }
            )
    return pl.DataFrame(rows, schema=PROJECTION_SCHEMA, orient="row")


PAY_MARGIN = 0.02  # a projected gain smaller than this is within the cost model's own error: not a win

PAY_SCHEMA = {
    "stratum": pl.String,
    "load_label": pl.String,
    "concurrency": pl.Int64,
    "served_shape": pl.String,
    "served_variant": pl.String,
    "served_projected": pl.Float64,
    "served_measured": pl.Float64,
    "best_shape": pl.String,
    "best_mean_acceptance_length": pl.Float64,
    "best_verified_tokens_per_step": pl.Float64,
    "best_projected": pl.Float64,
    "gain_over_served": pl.Float64,
    "verdict": pl.String,
}


def pay_table(projections: pl.DataFrame, margin: float = PAY_MARGIN) -> pl.DataFrame:
    """Per stratum and load: the best served chain against the best simulated shape, by projected speedup,
    and whether something the campaign did not serve (a tree, a graft, a union, a deeper chain) would pay:
    'pays' when it beats the best served chain by more than `margin` and plain too."""
    priced = projections.filter(pl.col("projected_speedup").is_not_null())
    rows = []
    for (stratum, load, conc), group in priced.group_by(
        "stratum", "load_label", "concurrency", maintain_order=True
    ):
        served = group.filter(pl.col("served_variant").is_not_null()).sort(
            "projected_speedup", descending=True
        )
        best = group.sort("projected_speedup", descending=True).row(0, named=True)
        top = served.row(0, named=True) if served.height else None
        gain = best["projected_speedup"] / top["projected_speedup"] - 1 if top else None
        if best["projected_speedup"] <= 1:
            verdict = "nothing pays: every shape is projected slower than plain"
        elif top is None:
            verdict = "no served chain to compare with"
        elif best["served_variant"] is not None or (gain is not None and gain <= margin):
            verdict = f"the served chain is as good (within {margin:.0%})"
        else:
            verdict = f"pays: {best['shape']} beats {top['shape']} by {gain:.1%}"
        rows.append(
            {
                "stratum": stratum,
                "load_label": load,
                "concurrency": conc,
                "served_shape": top["shape"] if top else None,
                "served_variant": top["served_variant"] if top else None,
                "served_projected": top["projected_speedup"] if top else None,
                "served_measured": top["measured_speedup"] if top else None,
                "best_shape": best["shape"],
                "best_mean_acceptance_length": best["mean_acceptance_length"],
                "best_verified_tokens_per_step": best["verified_tokens_per_step"],
                "best_projected": best["projected_speedup"],
                "gain_over_served": gain,
                "verdict": verdict,
            }
        )
    return pl.DataFrame(rows, schema=PAY_SCHEMA, orient="row").sort("stratum", "concurrency")
