"""A campaign's simulation, end to end: replay its captures, validate against the served counters, project
the shapes' cost from its measured cells, store it in the warehouse.

    captures (raw) -> replay (validation chains + shapes, one model-worker process) -> cells (warehouse
    snapshot) -> cost model fit + projections -> tree_sim* tables (writer, one transaction)

`simulate_campaign` is what `specgauge simulate`, the `simulate` flow (flows/simulate.py) and the demo call.
The report reads the stored rows (analysis/report_sections.py, "Trees and drafter combinations (offline)"); the
caller re-renders it after writing (`analysis.run.analyze_campaign`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from analysis.simulate import models
from analysis.simulate.captures import CaptureInput, capture_dirs, load_capture_inputs
from analysis.simulate.cost import (
    PROJECTION_SCHEMA,
    CostFitError,
    CostModel,
    fit_cost_model,
    measured_points,
    project,
)
from analysis.simulate.replay import replay
from analysis.simulate.run import DrafterSettings, outputs_capture, projection_frame, proposers_for
from analysis.simulate.shapes import PROPOSER_NAMES, Chain, Shape, ShapeError, parse_shapes
from analysis.simulate.store import settings_key, store_simulation
from analysis.simulate.validate import (
    PROPOSER_OF_METHOD,
    VALIDATION_SCHEMA,
    served_chain,
    validatable,
    validate_capture,
    validation_frame,
)
from specgauge.errors import InputError
from specgauge.provenance import git_revision, specgauge_version, utc_stamp
from specgauge.settings import get_settings
from warehouse.db import default_path, reader, writer
from warehouse.lock import WaitCallback


def campaign_dir(campaign: str | Path) -> Path:
    """A raw campaign folder as given, or the campaign id's under SPECGAUGE_HOME/raw."""
    path = Path(campaign)
    if path.is_dir():
        return path
    under_raw = get_settings().raw_dir / str(campaign)
    if under_raw.is_dir():
        return under_raw
    raise InputError(
        f"{campaign}: not a raw campaign folder, nor a campaign id under {get_settings().raw_dir}"
    )


def served_proposers(inputs: Sequence[CaptureInput]) -> list[str]:
    return sorted({PROPOSER_OF_METHOD[i.method] for i in inputs if i.method in PROPOSER_OF_METHOD})


def served_chains(inputs: Sequence[CaptureInput]) -> list[Shape]:
    """The chain of each served configuration: the cost model's measured points are these."""
    found = {
        (PROPOSER_OF_METHOD[i.method], int(i.variant["k"]))
        for i in inputs
        if i.method in PROPOSER_OF_METHOD and i.variant.get("k")
    }
    return [Chain(proposers=(p,), params=(("k", k),)) for p, k in sorted(found)]


@dataclass
class SimulationResult:
    campaign_id: str
    simulation_id: str
    settings_key: str
    settings: dict[str, Any]
    outputs_capture: str
    validation: pl.DataFrame  # validate.VALIDATION_SCHEMA, one row per speculative capture
    replays: pl.DataFrame  # run.projection_frame: per shape and stratum (and "all")
    projections: pl.DataFrame  # cost.PROJECTION_SCHEMA: per shape, stratum and closed-loop load
    cost: CostModel | None
    notes: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)  # written per table (empty: not stored)
    seconds: float = 0.0

    @property
    def missed_target(self) -> bool:
        return not all(v for v in self.validation["within_target"].to_list() if v is not None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "campaign_id": self.campaign_id,
            "simulation_id": self.simulation_id,
            "settings_key": self.settings_key,
            "outputs_capture": self.outputs_capture,
            "validated": self.validation.height,
            "missed_target": self.missed_target,
            "projections": self.projections.height,
            "cost_model": self.cost.describe() if self.cost else None,
            "rows": self.rows,
            "notes": self.notes,
            "seconds": round(self.seconds, 3),
        }


def replay_campaign(
    inputs: Sequence[CaptureInput],
    shapes: Sequence[Shape],
    settings: DrafterSettings,
    *,
    validate: bool = True,
    outputs: str | None = None,
) -> tuple[pl.DataFrame, CaptureInput, pl.DataFrame]:
    """Validation rows and the shapes' replay rows, with the proposers built once for both (one model
    call per drafter over every distinct request, as wide and deep as the widest shape needs)."""
    chosen = [item for item in inputs if validatable(item)] if validate else []
    try:
        item = outputs_capture(inputs, outputs)
    except KeyError:
        known = ", ".join(i.capture.capture_id for i in inputs)
        raise ShapeError(f"--outputs {outputs}: no such capture (captures: {known})") from None
    checks = [served_chain(c.method, int(c.variant["k"])) for c in chosen]
    requests = [r for source in [*chosen, item] for r in source.requests]
    proposers = proposers_for(requests, [*shapes, *checks], settings, item)
    validation = (
        validation_frame([validate_capture(c, settings, None, proposers) for c in chosen])
        if chosen
        else pl.DataFrame(schema=VALIDATION_SCHEMA)
    )
    results = [replay(item.requests, s.drafter(proposers), s.label, s.max_depth) for s in shapes]
    return validation, item, projection_frame(item, results)


def read_cells(db: Path, campaign_id: str, on_wait: WaitCallback | None = None) -> pl.DataFrame | None:
    """The campaign's measured cells (v_cells, the A/A control left out); None if the warehouse lacks it."""
    if not db.exists():
        return None
    with reader(db, on_wait=on_wait) as con:
        # the speculative cells' own counters give the verified width the cost model is fitted at
        cells = con.sql(
            "SELECT c.*, a.draft_tokens, a.accepted_tokens FROM v_cells c "
            "LEFT JOIN v_acceptance a USING (campaign_id, cell_id) WHERE c.campaign_id = ? ORDER BY c.cell_id",
            params=[campaign_id],
        ).pl()
    if "aa_control" in cells.columns:  # a warehouse older than the A/A control has none
        cells = cells.filter(~pl.col("aa_control").fill_null(False))
    return None if cells.is_empty() else cells


def simulate_campaign(
    campaign: str | Path,
    shapes: str | None = None,
    *,
    db_path: Path | str | None = None,
    proposers: Sequence[str] | None = None,
    outputs: str | None = None,
    tail: int = 8,
    dtype: str = "bfloat16",
    validate: bool = True,
    store: bool | None = None,
    lock_timeout_s: float | None = 300.0,
    on_wait: WaitCallback | None = None,
    on_warning: Callable[[str], None] | None = None,
    write_guard: Callable[[], AbstractContextManager[Any]] | None = None,
) -> SimulationResult:
    """Simulate a campaign (a raw folder or a campaign id under SPECGAUGE_HOME/raw).

    `shapes` (shapes.SHAPE_HELP) are projected on the plain capture's outputs (or `outputs`'); the served
    chains are always added (the cost model is fitted on them). `store`: True writes the tree_sim tables
    (an error if the warehouse does not hold the campaign's cells), False never, None when it does."""
    started = time.monotonic()
    if dtype not in ("bfloat16", "float32"):
        raise ShapeError(f"dtype {dtype!r}: bfloat16 or float32")
    unknown = [p for p in proposers or () if p not in PROPOSER_NAMES]
    if unknown:
        raise ShapeError(f"proposers: unknown {', '.join(unknown)} (known: {', '.join(PROPOSER_NAMES)})")
    if shapes:
        parse_shapes(shapes, PROPOSER_NAMES)  # a bad shape fails here, before any model runs
    raw = campaign_dir(campaign)
    campaign_id = raw.name
    db = Path(db_path) if db_path is not None else default_path()
    cells = read_cells(db, campaign_id, on_wait)
    if store and cells is None:
        raise InputError(
            f"{db}: no measured cells of campaign {campaign_id}: ingest it before storing a simulation"
        )
    with models.worker_session():
        inputs = load_capture_inputs(capture_dirs(raw), tail_tokens=tail, dtype=dtype)
        for item in inputs:
            for warning in item.warnings:
                (on_warning or (lambda _m: None))(f"{item.capture.capture_id}: {warning}")
        drafters = DrafterSettings.from_campaign(inputs, dtype=dtype)
        served = served_proposers(inputs)
        asked = parse_shapes(shapes, list(proposers or served or ["ngram"])) if shapes else []
        chosen = list({s.label: s for s in [*served_chains(inputs), *asked]}.values())
        validation, item, replays = replay_campaign(
            inputs, chosen, drafters, validate=validate, outputs=outputs
        )
    notes: list[str] = []
    cost, projections = None, pl.DataFrame(schema=PROJECTION_SCHEMA)
    if cells is None:
        notes.append(f"no measured cells of {campaign_id} in {db}: no cost model, no projection")
    else:
        try:
            cost = fit_cost_model(measured_points(cells, replays), fitted_on=campaign_id)
            projections = project(cost, replays, chosen, cells)
        except CostFitError as exc:
            notes.append(str(exc))
    unpriced = sorted(
        {r["shape"] for r in projections.iter_rows(named=True) if r["projected_speedup"] is None}
    )
    if unpriced:
        notes.append(
            "no projection (a proposer the campaign did not serve has no fitted cost): " + ", ".join(unpriced)
        )
    config = {
        "shapes": [s.label for s in chosen],
        "tail": tail,
        "dtype": dtype,
        "outputs_capture": item.capture.capture_id,
        "validate": validate,
        "drafters": asdict(drafters),
    }
    result = SimulationResult(
        campaign_id=campaign_id,
        simulation_id=f"{utc_stamp()}-{uuid.uuid4().hex[:8]}",
        settings_key=settings_key(config),
        settings=config,
        outputs_capture=item.capture.capture_id,
        validation=validation,
        replays=replays,
        projections=projections,
        cost=cost,
        notes=notes,
    )
    if store is None:
        store = cells is not None
    if store:
        guard = write_guard() if write_guard else nullcontext()
        with guard, writer(db, timeout_s=lock_timeout_s, on_wait=on_wait) as con:
            result.seconds = time.monotonic() - started
            result.rows = write_result(con, result)
    result.seconds = time.monotonic() - started
    return result


def write_result(con: Any, result: SimulationResult) -> dict[str, int]:
    """The result's rows into the tree_sim tables (store.store_simulation: one transaction)."""
    created = datetime.now(UTC).replace(tzinfo=None)
    version = specgauge_version()
    cost = result.cost
    run = {
        "created_utc": created,
        "seconds": result.seconds,
        "settings": _json(result.settings),
        "outputs_capture": result.outputs_capture,
        "fitted_on": cost.fitted_on if cost else None,
        "cost_model": _json(asdict(cost)) if cost else None,
        "fit_points": cost.points if cost else None,
        "fit_rms_residual": cost.rms_relative_residual if cost else None,
        "fit_max_residual": cost.max_relative_residual if cost else None,
        "specgauge_version": version,
        "git_revision": git_revision(),
        "notes": result.notes,
    }
    projections = result.projections.with_columns(
        pl.col("shape").str.extract(r"^([a-z]+)", 1).alias("kind"),
        pl.lit(cost.fitted_on if cost else None, dtype=pl.String).alias("fitted_on"),
        pl.lit(created).alias("created_utc"),
        pl.lit(version).alias("specgauge_version"),
    )
    return store_simulation(
        con,
        result.campaign_id,
        result.settings_key,
        result.simulation_id,
        run,
        projections,
        result.validation,
    )


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
