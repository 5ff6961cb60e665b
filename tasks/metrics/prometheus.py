"""vLLM's `/metrics`: scrape it, parse it with prometheus-client's text parser, and take deltas.

The measurement contract (docs: shared facts, metrics.md) takes server-side speculation figures as deltas
of counters between a scrape right before and one right after the measured window:

- only samples whose `model_name` label is the served model count (a server may serve several);
- samples are summed over the `engine` label (one per data-parallel engine);
- `_created` samples (the time a counter series was created) are never values; they are used only to spot
  a restart that a counter's value alone would hide (a series re-created between the scrapes);
- a counter that went down, or a series that disappeared or was re-created, means the server restarted:
  `CounterReset` is raised and the cell is invalid.

prometheus-client's parser names a counter family without its `_total` suffix (`vllm:generation_tokens`)
while its samples keep it (`vllm:generation_tokens_total`); text without `# TYPE` lines keeps the suffix
in the family name too. Lookups here therefore go by sample name with `_total` stripped, so either
spelling of a counter name works.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specgauge.errors import CounterReset, MetricsError

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"
PREEMPTIONS = "vllm:num_preemptions"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
KV_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # the name before vLLM 0.10's rename
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"

GAUGE_METRICS = frozenset({KV_CACHE_USAGE, KV_CACHE_USAGE_OLD, RUNNING, WAITING, PREEMPTIONS})

# Labels that split one logical series without changing what it measures: summed (engine) or the
# filter itself (model_name).
_SUMMED_LABEL = "engine"
_MODEL_LABEL = "model_name"

LabelKey = tuple[tuple[str, str], ...]


def base_name(name: str) -> str:
    """A counter's name without its `_total` suffix: the key every lookup here uses."""
    return name.removesuffix("_total")


@dataclass(frozen=True)
class Snapshot:
    """One parsed `/metrics` text: sample values and `_created` times, by base name and full label set."""

    values: Mapping[str, Mapping[LabelKey, float]]
    created: Mapping[str, Mapping[LabelKey, float]]
    source: str = "<metrics>"

    def models(self) -> list[str]:
        """The `model_name` labels present on any `vllm:` sample."""
        names = {
            dict(labels)[_MODEL_LABEL]
            for name, series in self.values.items()
            if name.startswith("vllm:")
            for labels in series
            if _MODEL_LABEL in dict(labels)
        }
        return sorted(names)

    def has(self, name: str, model_name: str) -> bool:
        return bool(self.series(name, model_name))

    def series(self, name: str, model_name: str) -> dict[LabelKey, float]:
        """Every series of `name` (either spelling) for one model, keyed by its full label set."""
        found = self.values.get(base_name(name), {})
        return {
            labels: value for labels, value in found.items() if dict(labels).get(_MODEL_LABEL) == model_name
        }

    def summed(self, name: str, model_name: str, *, by: str | None = None) -> dict[str | None, float]:
        """Values of `name` for one model, summed over engines; grouped by label `by` (None: one sum)."""
        out: dict[str | None, float] = {}
        for labels, value in self.series(name, model_name).items():
            key = dict(labels).get(by) if by else None
            out[key] = out.get(key, 0.0) + value
        return out


def _label_key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def _locate_bad_line(text: str) -> tuple[int, str] | None:
    """The first line the parser rejects on its own (the parser itself names no line numbers)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            for family in text_string_to_metric_families(line + "\n"):
                list(family.samples)
        except (ValueError, IndexError, TypeError):
            return number, line
    return None


def _metric_of(line: str) -> str:
    """The base name a text-format line is about: `# TYPE NAME ...`, `NAME{...} value`, `NAME value`."""
    if line.startswith("#"):
        parts = line.split(maxsplit=3)
        name = parts[2] if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") else ""
    else:
        name = line.split("{", 1)[0].split(None, 1)[0] if line.strip() else ""
    return base_name(name.removesuffix("_created"))


def parse(text: str, *, source: str = "<metrics>", only: frozenset[str] | None = None) -> Snapshot:
    """Parse a Prometheus text exposition. Raises MetricsError naming the source and the bad line.

    `only` (base names) keeps just those metrics' lines before parsing: the gauge sampler reads a handful
    of the ~650 lines vLLM exposes and should cost the engine's machine as little CPU as it can.
    """
    if only is not None:
        text = "\n".join(line for line in text.splitlines() if _metric_of(line) in only) + "\n"
    values: dict[str, dict[LabelKey, float]] = {}
    created: dict[str, dict[LabelKey, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = _label_key(sample.labels)
                if sample.name.endswith("_created"):
                    created.setdefault(sample.name.removesuffix("_created"), {})[key] = sample.value
                else:
                    values.setdefault(base_name(sample.name), {})[key] = sample.value
    except (ValueError, IndexError, TypeError) as exc:
        where = _locate_bad_line(text)
        at = f" at line {where[0]}: {where[1][:200]!r}" if where and only is None else ""
        raise MetricsError(f"{source}: not a Prometheus text exposition{at} ({exc})") from None
    if not any(name.startswith("vllm:") for name in values):
        wanted = f" (looked for {', '.join(sorted(only))})" if only is not None else ""
        raise MetricsError(f"{source}: contains no vllm: metrics{wanted} (is this a vLLM /metrics text?)")
    return Snapshot(values=values, created=created, source=source)


def _snapshot(value: str | Snapshot, source: str) -> Snapshot:
    return value if isinstance(value, Snapshot) else parse(value, source=source)


def _require_model(snapshot: Snapshot, model_name: str) -> None:
    if model_name not in snapshot.models():
        present = ", ".join(snapshot.models()) or "none"
        raise MetricsError(
            f"{snapshot.source}: no vllm: samples for model_name {model_name!r}; "
            f"model names present: {present}"
        )


def _check_not_reset(before: Snapshot, after: Snapshot, name: str, model_name: str) -> None:
    """Raise CounterReset when any series of the counter went down, vanished or was re-created."""
    earlier, later = before.series(name, model_name), after.series(name, model_name)
    invalid = "the server restarted between the scrapes; the window is invalid"
    for labels, old in earlier.items():
        series = f"{base_name(name)}_total{{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"
        if labels not in later:
            raise CounterReset(
                f"{series} is in {before.source} but not in {after.source}: "
                f"{invalid} (or it is another server)"
            )
        if later[labels] < old:
            raise CounterReset(
                f"{series} went down from {old:g} ({before.source}) to {later[labels]:g} ({after.source}): "
                + invalid
            )
        born_before = before.created.get(base_name(name), {}).get(labels)
        born_after = after.created.get(base_name(name), {}).get(labels)
        if born_before is not None and born_after is not None and born_before != born_after:
            raise CounterReset(
                f"{series} was re-created (_created {born_before:.3f} in {before.source}, "
                f"{born_after:.3f} in {after.source}): {invalid}"
            )


def _delta_by(before: Snapshot, after: Snapshot, name: str, model_name: str, by: str | None) -> dict:
    """Counter delta summed over engines (grouped by `by`); a series new in `after` starts from 0."""
    _check_not_reset(before, after, name, model_name)
    earlier = before.summed(name, model_name, by=by)
    later = after.summed(name, model_name, by=by)
    deltas = {key: later[key] - earlier.get(key, 0.0) for key in later}
    for key, value in deltas.items():
        if not math.isfinite(value):
            raise MetricsError(f"{base_name(name)}_total ({by}={key}): delta is not a number ({value})")
    return deltas


def counter_delta(before: str | Snapshot, after: str | Snapshot, name: str, model_name: str) -> float:
    """d(counter) for one model, summed over engines, e.g. `vllm:generation_tokens_total`.

    Raises MetricsError when the model or the counter is absent from either snapshot, CounterReset when it
    went down (or was re-created) between them.
    """
    first, second = _snapshot(before, "before"), _snapshot(after, "after")
    for snap in (first, second):
        _require_model(snap, model_name)
        if not snap.has(name, model_name):
            raise MetricsError(f"{snap.source}: no {base_name(name)}_total samples for model {model_name!r}")
    return _delta_by(first, second, name, model_name, None).get(None, 0.0)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


@dataclass(frozen=True)
class SpecDelta:
    """Speculative-decoding counters over a window, and the contract's ratios.

    `acceptance_rate` is None when no draft tokens were proposed in the window; `mean_acceptance_length`
    and every per-position rate are None when there were no drafts. `acceptance_rate_per_position` is empty
    when the server lacks the per-position counter (older vLLM) or has no series for it.
    """

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None  # d(accepted) / d(draft_tokens)
    mean_acceptance_length: float | None  # 1 + d(accepted) / d(drafts): counts the bonus token
    acceptance_rate_per_position: dict[str, float | None] = field(default_factory=dict)  # d(acc@i)/d(drafts)
    accepted_per_position: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The six keys of `specgauge metrics-delta`, in that order."""
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate_per_position": dict(self.acceptance_rate_per_position),
        }


def _position_order(key: str | None) -> tuple[int, str]:
    text = key or ""
    return (int(text), text) if text.isdigit() else (1 << 30, text)


def spec_decode_delta(before: str | Snapshot, after: str | Snapshot, model_name: str) -> SpecDelta:
    """Speculation deltas for `model_name` between two `/metrics` texts (or parsed snapshots).

    Raises MetricsError when the model is absent or the server has no speculative-decoding counters for it
    (a plain deployment), CounterReset when a counter went down or was re-created between the scrapes.
    """
    first, second = _snapshot(before, "before"), _snapshot(after, "after")
    for snap in (first, second):
        _require_model(snap, model_name)
        missing = [
            f"{name}_total"
            for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS)
            if not snap.has(name, model_name)
        ]
        if missing:
            raise MetricsError(
                f"{snap.source}: model {model_name!r} has no {', '.join(missing)} samples "
                "(speculative decoding off, or a vLLM version without these counters)"
            )
    drafts = _delta_by(first, second, DRAFTS, model_name, None).get(None, 0.0)
    draft_tokens = _delta_by(first, second, DRAFT_TOKENS, model_name, None).get(None, 0.0)
    accepted = _delta_by(first, second, ACCEPTED_TOKENS, model_name, None).get(None, 0.0)
    per_position: dict[str, float] = {}
    if first.has(ACCEPTED_PER_POS, model_name) or second.has(ACCEPTED_PER_POS, model_name):
        raw = _delta_by(first, second, ACCEPTED_PER_POS, model_name, "position")
        per_position = {str(k): v for k, v in sorted(raw.items(), key=lambda kv: _position_order(kv[0]))}
    return SpecDelta(
        drafts=round(drafts),
        draft_tokens=round(draft_tokens),
        accepted_tokens=round(accepted),
        acceptance_rate=_ratio(accepted, draft_tokens),
        mean_acceptance_length=None if drafts <= 0 else 1.0 + accepted / drafts,
        acceptance_rate_per_position={pos: _ratio(v, drafts) for pos, v in per_position.items()},
        accepted_per_position={pos: round(v) for pos, v in per_position.items()},
    )


def has_spec_decode(snapshot: str | Snapshot, model_name: str) -> bool:
    """Whether the server exposes speculative-decoding counters for the model (False for plain)."""
    snap = _snapshot(snapshot, "<metrics>")
    return all(snap.has(name, model_name) for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS))


def gauges(text: str | Snapshot, model_name: str) -> dict[str, float | int | None]:
    """Point-in-time load figures for one model: keys match `gauges.parquet`'s columns.

    `kv_cache_usage` (0..1) is the mean over engines (the share of all KV cache in use, engines being equal
    in size); `running`/`waiting` (counts) are summed over engines, `preemptions_total` is the cumulative
    counter summed over engines. A figure the server does not expose is None.
    """
    snap = text if isinstance(text, Snapshot) else parse(text, only=GAUGE_METRICS)
    _require_model(snap, model_name)
    kv_name = KV_CACHE_USAGE if snap.has(KV_CACHE_USAGE, model_name) else KV_CACHE_USAGE_OLD
    kv = list(snap.series(kv_name, model_name).values())

    def total(name: str) -> int | None:
        return round(snap.summed(name, model_name)[None]) if snap.has(name, model_name) else None

    return {
        "kv_cache_usage": sum(kv) / len(kv) if kv else None,
        "running": total(RUNNING),
        "waiting": total(WAITING),
        "preemptions_total": total(PREEMPTIONS),
    }


def _scrape_error(
    url: str, exc: Exception | None = None, response: httpx.Response | None = None
) -> MetricsError:
    if response is not None:
        return MetricsError(f"scrape {url}: HTTP {response.status_code}: {response.text[:200]!r}")
    return MetricsError(f"scrape {url}: {type(exc).__name__}: {exc}")


def scrape(url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> str:
    """GET a `/metrics` URL and return its text. Raises MetricsError with the URL and the reason."""
    try:
        response = httpx.get(url, headers=dict(headers or {}), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise _scrape_error(url, exc) from None
    if response.status_code != 200:
        raise _scrape_error(url, response=response)
    return response.text


async def ascrape(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
    client: httpx.AsyncClient | None = None,
) -> str:
    """`scrape`, asynchronously; pass `client` to reuse its connection across scrapes."""
    try:
        if client is None:
            async with httpx.AsyncClient(timeout=timeout_s) as own:
                response = await own.get(url, headers=dict(headers or {}))
        else:
            response = await client.get(url, headers=dict(headers or {}), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise _scrape_error(url, exc) from None
    if response.status_code != 200:
        raise _scrape_error(url, response=response)
    return response.text
