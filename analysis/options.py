"""Whole deployment options, weighed by traffic (docs/decision.md, "Deployment options and traffic").

One deployment serves every load, so the decision compares ways to deploy as wholes, not loads one by one:
plain; each fixed config the sweep measured (every speculative variant and depth, a runtime-adaptive mode the
spec names among them); and the recommended schedule, its off ranges at their measured cost (with speculation
configured, vLLM 0.32 keeps the drafter and turns asynchronous scheduling off where the schedule drafts
nothing: 0.86x plain at C=4 on the demo, never 1 by assumption).

Per option and load, its throughput over plain: from the verification campaign where it launched that config,
else from the sweep, else, where the option runs k = 0, from a sweep variant of its family that ran k = 0
there; otherwise unknown. A traffic profile gives each measured load a share of the service's time (equal
by default, or from a file: `read_traffic`). The option's expected gain is the traffic-weighted geometric mean
of its per-load ratios; its interval is drawn per launch: the loads of one campaign share their launches (a
slow plain launch slows every load's ratio of that repeat), so each repeat's weighted log-ratio is one value
and the t interval is over repeats (analysis.stats.log_ratio, with the pooled launch variance where the
campaign has history); figures from separate campaigns are independent and are summed with
Welch-Satterthwaite degrees of freedom (analysis.stats.weighted_ratio_interval).

The choice: the speculative option with the highest expected gain whose gain interval clears 1 + min_effect,
with no load that carries traffic refuted (its interval wholly below 1 - tolerance), every such load measured,
its greedy gate not failed and no figure from an invalid campaign; when there is none, plain.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.decision import gate_status
from analysis.recommend import RECOMMENDED, Recommendation, boundaries, is_verification, k_at
from analysis.speedup import gain, speedup_table
from analysis.stats import (
    LaunchVariance,
    LogRatio,
    has_interval,
    interval_label,
    log_ratio,
    weighted_ratio_interval,
)
from artifacts.documents.decisions import PLAIN_OPTION, SCHEDULE_OPTION, DeploymentOption, OptionLoad
from experiments.spec import DecisionSpec, Variant
from specgauge.errors import InputError
from specgauge.files import read_bounded_text

EQUAL = "equal over the measured loads"
MAX_TRAFFIC_BYTES = 32 << 20  # a Prometheus export of weeks at a 15 s step is a few MiB
RUNNING = "vllm:num_requests_running"


# -- the traffic profile ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrafficSamples:
    """What a traffic file says before it is binned: (batch size, weight) pairs and where they came from."""

    points: list[tuple[float, float]]
    source: str


@dataclass(frozen=True)
class TrafficProfile:
    """The share of the service's time at each measured load (the shares sum to 1)."""

    shares: dict[int, float]
    source: str


def _bad(path: Path | str, where: str, message: str, line: int | None = None) -> InputError:
    return InputError(f"{path}{f':{line}' if line else ''}: {where}: {message}")


def _number(value: Any, path: Path | str, where: str, line: int | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(path, where, f"expected a number, got {type(value).__name__}", line)
    if not math.isfinite(value) or value < 0:
        raise _bad(path, where, f"expected a finite number >= 0, got {value}", line)
    return float(value)


def _list_samples(data: list, path: Path | str, lines: dict) -> TrafficSamples:
    """[{concurrency: C, share: S}, ...]: a share of time per batch size (any scale: they are normalised)."""
    points: list[tuple[float, float]] = []
    seen: dict[int, int] = {}
    for i, item in enumerate(data):
        line = lines.get((i,))
        if not isinstance(item, dict):
            raise _bad(path, f"[{i}]", "expected a mapping with concurrency and share", line)
        unknown = sorted(str(key) for key in item if key not in ("concurrency", "share"))
        if unknown:
            raise _bad(path, f"[{i}].{unknown[0][:48]}", "unknown field (expected concurrency, share)", line)
        for name in ("concurrency", "share"):
            if name not in item:
                raise _bad(path, f"[{i}].{name}", "missing", line)
        concurrency = item["concurrency"]
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise _bad(path, f"[{i}].concurrency", f"expected a whole number >= 1, got {concurrency!r}", line)
        if concurrency in seen:
            raise _bad(
                path, f"[{i}].concurrency", f"C={concurrency} given twice (items {seen[concurrency]}, {i})"
            )
        seen[concurrency] = i
        points.append(
            (float(concurrency), _number(item["share"], path, f"[{i}].share", lines.get((i, "share"))))
        )
    if not points:
        raise _bad(path, "[]", "an empty list: no load to weigh")
    if sum(w for _, w in points) <= 0:
        raise _bad(path, "[].share", "every share is 0")
    return TrafficSamples(points, f"{path}: a list of {len(points)} loads")


def _series_points(series: Any, path: Path | str, where: str) -> tuple[list[float], int]:
    """One matrix series' values ([[ts, "3"], ...]) as numbers, and how many were NaN (left out)."""
    if not isinstance(series, dict):
        raise _bad(path, where, "expected a series: {metric, values}")
    name = (series.get("metric") or {}).get("__name__") if isinstance(series.get("metric"), dict) else None
    if name not in (None, RUNNING):
        raise _bad(path, f"{where}.metric.__name__", f"expected {RUNNING}, got {str(name)[:64]!r}")
    values = series.get("values")
    if not isinstance(values, list):
        raise _bad(path, f"{where}.values", "missing or not a list of [timestamp, value]")
    out: list[float] = []
    nan = 0
    for j, pair in enumerate(values):
        at = f"{where}.values[{j}]"
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
            raise _bad(path, at, 'expected [timestamp, "value"]')
        try:
            value = float(pair[1])
        except ValueError:
            raise _bad(path, at, f"not a number: {pair[1][:32]!r}") from None
        if math.isnan(value):
            nan += 1
            continue
        if value < 0 or math.isinf(value):
            raise _bad(path, at, f"a batch size is finite and >= 0, got {pair[1][:32]}")
        out.append(value)
    return out, nan


def _prometheus_samples(data: dict, path: Path | str) -> TrafficSamples:
    """The JSON of Prometheus' /api/v1/query_range for vllm:num_requests_running: every sample of every series
    is one step of time at that batch size; samples at 0 (idle) are left out, they serve nothing."""
    if data.get("status") != "success":
        raise _bad(path, "status", f'expected "success", got {str(data.get("status"))[:32]!r}')
    body = data.get("data")
    if not isinstance(body, dict):
        raise _bad(path, "data", "missing: expected {resultType, result}")
    if body.get("resultType") != "matrix":
        raise _bad(
            path,
            "data.resultType",
            f'expected "matrix" (a range query), got {str(body.get("resultType"))[:32]!r}',
        )
    result = body.get("result")
    if not isinstance(result, list) or not result:
        raise _bad(path, "data.result", "no series: expected a list of {metric, values}")
    values: list[float] = []
    nan = 0
    for i, series in enumerate(result):
        found, skipped = _series_points(series, path, f"data.result[{i}]")
        values += found
        nan += skipped
    busy = [v for v in values if v > 0]
    if not busy:
        raise _bad(path, "data.result", f"no sample with a request running ({len(values)} samples, all 0)")
    left = f"{len(values) - len(busy)} idle" + (f", {nan} NaN" if nan else "")
    source = f"{path}: Prometheus {RUNNING}, {len(result)} series, {len(busy)} samples ({left} left out)"
    return TrafficSamples([(v, 1.0) for v in busy], source)


def read_traffic(path: Path | str) -> TrafficSamples:
    """A traffic file, validated (InputError naming the file and field): a YAML/JSON list of
    {concurrency, share}, or a Prometheus range-query export (JSON) of vllm:num_requests_running."""
    from experiments.loader import load_yaml

    text = read_bounded_text(path, MAX_TRAFFIC_BYTES, InputError, "a traffic profile")
    lines: dict = {}
    if text.lstrip()[:1] in (
        "{",
        "[",
    ):  # JSON: a long export is parsed fast, and YAML's node budget is a spec's
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            try:  # a YAML flow collection ({concurrency: 1, ...}) is not JSON
                data, lines = load_yaml(text, str(path))
            except InputError:
                raise InputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    else:
        data, lines = load_yaml(text, str(path))
    if isinstance(data, list):
        return _list_samples(data, path, lines)
    if isinstance(data, dict) and ("data" in data or "status" in data):
        return _prometheus_samples(data, path)
    raise _bad(
        path, "(top level)", "expected a list of {concurrency, share} or a Prometheus range-query export"
    )


def bin_traffic(samples: TrafficSamples, loads: Sequence[int]) -> TrafficProfile:
    """The samples binned to the measured loads: each batch size counts at the load whose batch-size range holds
    it (the schedule's ranges, split at the geometric mean of neighbouring loads: the nearest load on a log
    scale); the shares are normalised to sum 1."""
    ordered = sorted(loads)
    ranges = boundaries(ordered, max_batch=max(ordered[-1], 1))
    weights = dict.fromkeys(ordered, 0.0)
    for value, weight in samples.points:
        load = next((c for c, (_, end) in zip(ordered, ranges, strict=True) if value <= end), ordered[-1])
        weights[load] += weight
    total = sum(weights.values())
    if total <= 0:
        raise InputError(
            f"{samples.source}: no traffic at any measured load ({', '.join(map(str, ordered))})"
        )
    return TrafficProfile({c: w / total for c, w in weights.items()}, samples.source)


def traffic_profile(path: Path | str | None, loads: Sequence[int]) -> TrafficProfile:
    """The profile from `path` (None: equal over `loads`)."""
    if path is None:
        return TrafficProfile(dict.fromkeys(sorted(loads), 1.0 / len(loads)), EQUAL)
    return bin_traffic(read_traffic(path), loads)


def resolve_traffic_path(path: str | Path | None) -> Path | None:
    """A spec's or the command line's path: absolute, or relative to the repository (else the working folder)."""
    from experiments.plan import resolve_repo_path

    return None if path is None else resolve_repo_path(str(path))


# -- the options ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """One config's throughput over plain at one load, as one campaign measured it (paired per repeat)."""

    estimate: float
    low: float | None
    high: float | None
    ratios: dict[int, float]  # repeat -> throughput ratio over that repeat's plain launch
    campaign_id: str
    source: str
    history: LaunchVariance | None = None


@dataclass
class Candidate:
    """A deployment option before it is scored: its depth and figure at each measured load."""

    name: str
    kind: str  # plain | fixed | schedule
    description: str
    config: dict[str, Any] | None
    depth: dict[int, int]
    figures: dict[int, Figure | None]
    disqualified: list[str] = field(default_factory=list)  # a failed gate, an invalid campaign


def _key(entry: dict[str, Any]) -> str:
    """A config's identity: its spec entry without the name."""
    return json.dumps(Variant.model_validate(entry).model_dump(mode="json", exclude={"name"}), sort_keys=True)


def _family(entry: dict[str, Any]) -> str:
    variant = Variant.model_validate(entry)
    return " ".join(p for p in (variant.method, variant.drafter, variant.setting_label) if p)


def _arms(data: CampaignData) -> dict[str, dict[str, Any]]:
    """variant name -> spec entry, the speculative configs of a campaign (synthetic acceptance measures a cost,
    it is no config to deploy)."""
    out = {}
    for entry in data.spec.get("variants") or []:
        variant = Variant.model_validate(entry)
        if variant.speculative and variant.synthetic_acceptance_length is None:
            out[variant.name] = entry
    return out


def _figures(data: CampaignData, workload: str, settings: AnalysisSettings) -> dict[tuple[str, int], Figure]:
    """(variant, concurrency) -> its closed-loop throughput figure on `workload`."""
    rows = gain(speedup_table(data, settings), "throughput").filter(
        (pl.col("load_mode") == "closed") & (pl.col("workload") == workload)
    )
    where = "verification" if is_verification(data) else "sweep"
    out = {}
    for row in rows.iter_rows(named=True):
        out[(row["variant"], int(row["concurrency"]))] = Figure(
            float(row["estimate"]),
            row["ci_low"],
            row["ci_high"],
            dict(zip(row["repeats"], row["per_repeat"], strict=True)),
            data.campaign_id,
            f"{where} {row['variant']} ({row['interval']})",
            data.history,
        )
    return out


@dataclass(frozen=True)
class Measured:
    """One campaign's arms and figures, and why its figures may not decide (an invalid campaign, failed gates)."""

    arms: dict[str, dict[str, Any]]
    figures: dict[tuple[str, int], Figure]
    invalid: str | None
    failed_gates: set[str]


def measured(
    data: CampaignData | None, workload: str, settings: AnalysisSettings, invalid: str | None = None
) -> Measured | None:
    if data is None:
        return None
    failed = {v for v, gate in gate_status(data).items() if gate["passed"] is False}
    return Measured(_arms(data), _figures(data, workload, settings), invalid, failed)


def _lookup(
    entry: dict[str, Any], loads: Sequence[int], campaigns: Sequence[Measured]
) -> tuple[dict[int, int], dict[int, Figure | None], list[str]]:
    """An entry's depth and figure per load: where a campaign launched the same config (the first campaign
    first), else where it runs k = 0 a variant of its family that ran k = 0 there; and why it is disqualified."""
    key, family = _key(entry), _family(entry)
    depth = {c: k_at(entry.get("k_schedule"), c, int(entry.get("k") or 0)) for c in loads}
    figures: dict[int, Figure | None] = {}
    why: list[str] = []
    for campaign in campaigns:
        same = [name for name, other in campaign.arms.items() if _key(other) == key]
        if same and campaign.invalid:
            why.append(f"measured in an invalid campaign ({campaign.invalid})")
        why += [
            f"{name} failed its greedy-correctness gate" for name in same if name in campaign.failed_gates
        ]
    for c in loads:
        found = [
            campaign.figures[(name, c)]
            for campaign in campaigns
            for name, other in campaign.arms.items()
            if _key(other) == key and (name, c) in campaign.figures
        ]
        if (
            not found and depth[c] == 0
        ):  # off here: the cost its family's k = 0 measured, never 1 by assumption
            found = [
                campaign.figures[(name, c)]
                for campaign in campaigns
                for name, other in campaign.arms.items()
                if _family(other) == family
                and k_at(other.get("k_schedule"), c, int(other.get("k") or 0)) == 0
                and (name, c) in campaign.figures
            ]
        figures[c] = found[0] if found else None
    return depth, figures, sorted(set(why))


def candidates(
    rec: Recommendation, recommended: dict[str, Any] | None, campaigns: Sequence[Measured]
) -> list[Candidate]:
    """Plain, the recommended schedule (`recommended`: its spec entry; None: nothing was launched) and every
    other speculative config the campaigns measured on the recommendation's workload, once each."""
    loads = [c.concurrency for c in rec.choices]
    out = [Candidate(PLAIN_OPTION, "plain", "no speculation", None, dict.fromkeys(loads, 0), {})]
    seen: set[str] = set()
    entries: list[tuple[str, str, dict[str, Any]]] = []
    if recommended is not None:
        entries.append((SCHEDULE_OPTION, "schedule", recommended))
    for campaign in reversed(campaigns):  # the sweep's names first: its variants are the configs a team knows
        entries += [(name, "fixed", entry) for name, entry in campaign.arms.items() if name != RECOMMENDED]
    for name, kind, entry in entries:
        key = _key(entry)
        if key in seen:
            continue
        seen.add(key)
        depth, figures, why = _lookup(entry, loads, campaigns)
        variant = Variant.model_validate(entry)
        shown = (
            f"k_schedule {list(map(list, variant.k_schedule))}" if variant.k_schedule else f"k={variant.k}"
        )
        out.append(
            Candidate(
                name, kind, f"{_family(entry)} {shown}", variant.speculative_config(), depth, figures, why
            )
        )
    return out


def _span(estimate: float | None, low: float | None, high: float | None) -> str:
    if estimate is None:
        return "unknown"
    return f"{estimate:.3g}x" + (f" [{low:.3g}, {high:.3g}]" if low is not None and high is not None else "")


def expected_gain(
    figures: dict[int, Figure], shares: dict[int, float], confidence: float
) -> tuple[float, float | None, float | None, str]:
    """The traffic-weighted geometric mean of the figures with its interval: per campaign, each repeat's
    weighted log-ratio over the loads that carry traffic (one value per launch: the loads of a launch are not
    independent), a t interval over those; campaigns are independent of each other."""
    parts: list[tuple[float, LogRatio]] = []
    groups: dict[str, list[int]] = {}
    for c, figure in figures.items():
        if shares.get(c, 0.0) > 0:
            groups.setdefault(figure.campaign_id, []).append(c)
    for loads in groups.values():
        weight = sum(shares[c] for c in loads)
        common = set.intersection(*(set(figures[c].ratios) for c in loads))
        if not common:  # no launch measured every one of these loads: each load on its own, as independent
            parts += [
                (shares[c], log_ratio(list(figures[c].ratios.values()), figures[c].history)) for c in loads
            ]
            continue
        per_repeat = [
            math.exp(sum(shares[c] / weight * math.log(figures[c].ratios[r]) for c in loads))
            for r in sorted(common)
        ]
        parts.append((weight, log_ratio(per_repeat, figures[loads[0]].history)))
    interval = weighted_ratio_interval(parts, confidence=confidence)
    drawn = has_interval(interval)
    return (
        interval.estimate,
        interval.low if drawn else None,
        interval.high if drawn else None,
        interval_label(interval),
    )


def score(
    candidate: Candidate, traffic: TrafficProfile, rule: DecisionSpec, confidence: float
) -> DeploymentOption:
    """One option over the traffic profile: its per-load figures, expected gain, worst load and whether it may be
    chosen (plain is the baseline: 1 by definition, always a valid answer)."""
    floor, threshold = 1.0 - rule.guardrail, 1.0 + rule.min_effect
    loads = []
    for c, share in sorted(traffic.shares.items()):
        figure = candidate.figures.get(c)
        refuted = bool(figure and share > 0 and figure.high is not None and figure.high < floor)
        loads.append(
            OptionLoad(
                concurrency=c,
                share=share,
                k=candidate.depth.get(c, 0),
                over_plain=1.0 if candidate.kind == "plain" else (figure.estimate if figure else None),
                over_plain_low=figure.low if figure else None,
                over_plain_high=figure.high if figure else None,
                n_repeats=len(figure.ratios) if figure else 0,
                source="baseline"
                if candidate.kind == "plain"
                else (figure.source if figure else "not measured"),
                refuted=refuted,
            )
        )
    base = {
        "name": candidate.name,
        "kind": candidate.kind,
        "description": candidate.description,
        "speculative_config": candidate.config,
        "loads": loads,
    }
    if candidate.kind == "plain":
        return DeploymentOption(
            **base, gain=1.0, gain_interval="the baseline", eligible=True, reason="the baseline"
        )
    carried = [load for load in loads if load.share > 0]
    unknown = [load.concurrency for load in carried if load.over_plain is None]
    why = list(candidate.disqualified)
    if unknown:
        why.append(f"not measured at C={', '.join(map(str, unknown))}")
    estimate = low = high = None
    label = "unknown: a load with traffic was not measured"
    if not unknown:
        known = {load.concurrency: candidate.figures[load.concurrency] for load in carried}
        estimate, low, high, label = expected_gain(
            {c: f for c, f in known.items() if f is not None}, traffic.shares, confidence
        )
    measured_loads = [load for load in carried if load.over_plain is not None]
    worst = min(measured_loads, key=lambda load: load.over_plain or 0.0) if measured_loads else None
    why += [
        f"refuted at C={load.concurrency}: {_span(load.over_plain, load.over_plain_low, load.over_plain_high)} "
        f"lies below {floor:.2f}"
        for load in carried
        if load.refuted
    ]
    if estimate is not None and (low is None or not low > threshold):
        shown = _span(estimate, low, high) if low is not None else f"{estimate:.3g}x ({label})"
        why.append(f"expected gain {shown} does not clear {threshold:.2f}")
    gain_text = _span(estimate, low, high)
    reason = "; ".join(why) or f"expected gain {gain_text} clears {threshold:.2f}, no load refuted"
    return DeploymentOption(
        **base,
        gain=estimate,
        gain_low=low,
        gain_high=high,
        gain_interval=label,
        worst_concurrency=worst.concurrency if worst else None,
        worst=worst.over_plain if worst else None,
        worst_low=worst.over_plain_low if worst else None,
        worst_high=worst.over_plain_high if worst else None,
        eligible=not why,
        reason=reason,
    )


def choose(
    options: Sequence[DeploymentOption], rule: DecisionSpec, traffic: TrafficProfile
) -> tuple[str, str]:
    """(the option to deploy, why): the eligible speculative option with the highest expected gain (ties: the
    higher low bound), else plain."""
    eligible = [o for o in options if o.kind != "plain" and o.eligible and o.gain is not None]
    weighed = f"traffic {traffic.source}"
    if eligible:
        best = max(eligible, key=lambda o: (o.gain or 0.0, o.gain_low or 0.0))
        worst = f"C={best.worst_concurrency} {_span(best.worst, best.worst_low, best.worst_high)}"
        return best.name, (
            f"{best.name} ({best.description}): expected gain {_span(best.gain, best.gain_low, best.gain_high)} "
            f"over plain ({weighed}) clears {1 + rule.min_effect:.2f}; worst load {worst}, not refuted"
        )
    speculative = [o for o in options if o.kind != "plain"]
    if not speculative:
        return PLAIN_OPTION, f"deploy plain: no speculative config was measured ({weighed})"
    closest = max(speculative, key=lambda o: (o.gain is not None, o.gain_low or 0.0, o.gain or 0.0))
    return PLAIN_OPTION, (
        f"deploy plain: no speculative option's expected gain clears {1 + rule.min_effect:.2f} by its interval "
        f"without a refuted load ({weighed}); closest: {closest.name}: {closest.reason}"
    )


def deployment_options(
    rec: Recommendation,
    recommended: dict[str, Any] | None,
    campaigns: Sequence[Measured],
    traffic: TrafficProfile,
    rule: DecisionSpec,
    confidence: float,
) -> tuple[list[DeploymentOption], str, str]:
    """Every option scored over the traffic profile, the one chosen and why (`campaigns`: the verification
    campaign's figures first, then the sweep's)."""
    options = [score(c, traffic, rule, confidence) for c in candidates(rec, recommended, campaigns)]
    choice, reason = choose(options, rule, traffic)
    return options, choice, reason
