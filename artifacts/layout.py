"""Where every raw artifact lives: each path under RAW/<campaign_id>/ is spelled here and nowhere else.

    RAW/<campaign_id>/campaign.json                                    CampaignRecord (written once)
    RAW/<campaign_id>/runs/<stamp>-<pid>-<nn>.json                     RunRecord (one per finished run)
    RAW/<campaign_id>/deployments/<launch_id>/deployment.json          DeploymentFacts (rewritten as it runs)
                                             /engine.log, command.txt  (not read by the warehouse)
    RAW/<campaign_id>/cells/<cell_id>.a<n>/meta.json                   CellMeta
                                          /summary.json                CellSummary
                                          /requests.parquet            REQUEST_SCHEMA, one row per request
                                          /gauges.parquet              GAUGE_SCHEMA, one row per scrape
                                          /metrics_before.txt, metrics_after.txt   the /metrics texts
    RAW/<campaign_id>/captures/<capture_id>/meta.json                  CaptureMeta
                                           /outputs.parquet            OUTPUT_SCHEMA, one row per prompt
    RAW/<campaign_id>/gates/<verdict_id>.json                          GateVerdictDocument
    RAW/<campaign_id>/capacity/<search_id>.json                        CapacitySearchDocument
    RAW/<campaign_id>/calibration/<calibration_id>.json                ClientCalibrationDocument
    RAW/<campaign_id>/adaptations/<adaptation_id>.json                 AdaptationDocument (tasks.adapt)
    RAW/<campaign_id>/decisions/<decision_id>.json                     DecisionDocument (analysis.verification)
    RAW/<campaign_id>/promotions/<decision_id>.json                    PromotionDocument (tasks.promote)
    RAW/drafters/<drafter_id>/card.json, curve.parquet, head/          DrafterCard (tasks.drafters.training)
    RAW/<campaign_id>/profiles/<profile_id>/meta.json                  ProfileMeta
                                           /breakdown.json             ProfileBreakdown (ok windows only)
                                           /metrics_before.txt, metrics_after.txt, trace/

Ids: artifacts.ids. Documents: artifacts.documents. Atomic writing: artifacts.store. Names that start with
'.' are temporaries (artifacts.store) and never artifacts.
"""

from __future__ import annotations

from pathlib import Path

from artifacts import ids

CAMPAIGN_FILE = "campaign.json"
RUNS = "runs"
DEPLOYMENTS = "deployments"
DEPLOYMENT_FILE = "deployment.json"
ENGINE_LOG = "engine.log"
COMMAND_FILE = "command.txt"
CELLS = "cells"
META = "meta.json"
SUMMARY = "summary.json"
REQUESTS = "requests.parquet"
GAUGES = "gauges.parquet"
METRICS_BEFORE = "metrics_before.txt"
METRICS_AFTER = "metrics_after.txt"
CAPTURES = "captures"
OUTPUTS = "outputs.parquet"
GATES = "gates"
PROFILES = "profiles"
CAPACITY = "capacity"
CALIBRATION = "calibration"
ADAPTATIONS = "adaptations"
DECISIONS = "decisions"
PROMOTIONS = "promotions"
BREAKDOWN = "breakdown.json"

CELL_FILES = (META, SUMMARY, REQUESTS, GAUGES, METRICS_BEFORE, METRICS_AFTER)
CAPTURE_FILES = (META, OUTPUTS)
PROFILE_DOCUMENTS = (META, BREAKDOWN)  # what the warehouse reads of a profile (not the trace or scrapes)


def is_temporary(name: str) -> bool:
    return name.startswith(".")


def subdirs(path: Path) -> list[Path]:
    """The artifact directories in a folder, by name (temporaries left out)."""
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_dir() and not is_temporary(p.name))


# ------------------------------------------------------------------------------------------------ campaign


def campaign_dir(raw_dir: Path, campaign_id: str) -> Path:
    return Path(raw_dir) / campaign_id


def campaign_file(directory: Path) -> Path:
    return Path(directory) / CAMPAIGN_FILE


def is_campaign_dir(directory: Path) -> bool:
    return campaign_file(directory).exists()


def campaign_dirs(raw_dir: Path) -> list[Path]:
    """RAW/<campaign_id>/ folders; `raw_dir` itself when it is one campaign (has campaign.json).
    RAW/drafters/ (trained heads, beside the campaigns) is not one."""
    raw_dir = Path(raw_dir)
    if is_campaign_dir(raw_dir):
        return [raw_dir]
    return sorted(
        p for p in raw_dir.iterdir() if p.is_dir() and not is_temporary(p.name) and p.name != DRAFTERS
    )


def campaign_files(raw_dir: Path) -> list[Path]:
    """campaign.json of every campaign under RAW."""
    raw_dir = Path(raw_dir)
    return sorted(raw_dir.glob(f"*/{CAMPAIGN_FILE}")) if raw_dir.exists() else []


def runs_dir(directory: Path) -> Path:
    return Path(directory) / RUNS


def run_files(directory: Path) -> list[Path]:
    """The campaign's run records, in name (= run) order."""
    folder = runs_dir(directory)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if not is_temporary(p.name))


def run_file(directory: Path, stem: str) -> Path:
    return runs_dir(directory) / f"{stem}.json"


# --------------------------------------------------------------------------------------------- deployments


def deployments_dir(directory: Path) -> Path:
    return Path(directory) / DEPLOYMENTS


def deployment_dir(directory: Path, deployment_id: str) -> Path:
    return deployments_dir(directory) / deployment_id


def next_launch_id(directory: Path, slot: str) -> str:
    """Each launch of a deployment slot gets its own id (slot.l1, slot.l2, ...): directories stay immutable."""
    n = 1
    while deployment_dir(directory, ids.launch_id(slot, n)).exists():
        n += 1
    return ids.launch_id(slot, n)


# --------------------------------------------------------------------------------------------------- cells


def cells_dir(directory: Path) -> Path:
    return Path(directory) / CELLS


def cell_dir(directory: Path, cell_id: str, attempt: int) -> Path:
    return cells_dir(directory) / ids.attempt_name(cell_id, attempt)


def cell_attempts(cells: Path, cell_id: str) -> list[Path]:
    """Existing attempts of one cell in a cells folder, oldest first."""
    if not cells.exists():
        return []
    found = []
    for path in cells.glob(f"{cell_id}.a*"):
        parsed = ids.parse_attempt_name(path.name)
        if path.is_dir() and parsed is not None and parsed[0] == cell_id:
            found.append((parsed[1], path))
    return [path for _, path in sorted(found)]


def next_cell_dir(cells: Path, cell_id: str) -> Path:
    """Where the next attempt of a cell goes (attempt 1 when it has none)."""
    attempts = cell_attempts(cells, cell_id)
    last = ids.parse_attempt_name(attempts[-1].name)[1] if attempts else 0  # type: ignore[index]
    return cells / ids.attempt_name(cell_id, last + 1)


# ------------------------------------------------------------------------------------------------ captures


def captures_dir(directory: Path) -> Path:
    return Path(directory) / CAPTURES


def capture_dir(directory: Path, capture_id: str) -> Path:
    return captures_dir(directory) / capture_id


def capture_complete(path: Path) -> bool:
    return all((Path(path) / name).exists() for name in CAPTURE_FILES)


# ------------------------------------------------------------------------------------------------ verdicts


def gates_dir(directory: Path) -> Path:
    return Path(directory) / GATES


def verdict_file(directory: Path, verdict_id: str) -> Path:
    return gates_dir(directory) / f"{verdict_id}.json"


def verdict_files(directory: Path) -> list[Path]:
    return json_files(gates_dir(directory))


def json_files(folder: Path) -> list[Path]:
    """The single-file artifacts of a folder, without those still being written (temporary names)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if not is_temporary(p.name))


# ------------------------------------------------------------------------------------------------ capacity


def capacity_dir(directory: Path) -> Path:
    return Path(directory) / CAPACITY


def search_file(directory: Path, search_id: str) -> Path:
    return capacity_dir(directory) / f"{search_id}.json"


def search_files(directory: Path) -> list[Path]:
    return json_files(capacity_dir(directory))


# ------------------------------------------------------------------------------------- client calibration


def calibration_dir(directory: Path) -> Path:
    return Path(directory) / CALIBRATION


def calibration_file(directory: Path, calibration_id: str) -> Path:
    return calibration_dir(directory) / f"{calibration_id}.json"


def calibration_files(directory: Path) -> list[Path]:
    return json_files(calibration_dir(directory))


# ------------------------------------------------------------------------------------------------ adaptations


def adaptations_dir(directory: Path) -> Path:
    return Path(directory) / ADAPTATIONS


def adaptation_file(directory: Path, adaptation_id: str) -> Path:
    return adaptations_dir(directory) / f"{adaptation_id}.json"


def adaptation_files(directory: Path) -> list[Path]:
    return json_files(adaptations_dir(directory))


# ------------------------------------------------------------------------------- decisions and promotions


def decision_file(directory: Path, decision_id: str) -> Path:
    return Path(directory) / DECISIONS / f"{decision_id}.json"


def decision_files(directory: Path) -> list[Path]:
    return json_files(Path(directory) / DECISIONS)


def promotion_file(directory: Path, decision_id: str) -> Path:
    return Path(directory) / PROMOTIONS / f"{decision_id}.json"


def promotion_files(directory: Path) -> list[Path]:
    return json_files(Path(directory) / PROMOTIONS)


# ------------------------------------------------------------------------------------------------ profiles


def profiles_dir(directory: Path) -> Path:
    return Path(directory) / PROFILES


def profile_dir(directory: Path, profile_id: str) -> Path:
    return profiles_dir(directory) / profile_id


# ------------------------------------------------------------------------------------------------ drafters
# RAW/drafters/<drafter_id>/card.json          DrafterCard (tasks.drafters.training; written once)
#                          /curve.parquet      CURVE_SCHEMA, one row per training step
#                          /data.parquet       training_data.EXAMPLE_SCHEMA, the examples that went in
#                          /head/              the head as vLLM loads it (model.safetensors, config.json,
#                                              the target's tokenizer files)
#                          /train.log          the trainer's output (not read by the warehouse)

DRAFTERS = "drafters"
CARD = "card.json"
CURVE = "curve.parquet"
DATA = "data.parquet"
HEAD = "head"
TRAIN_LOG = "train.log"
DRAFTER_FILES = (CARD, CURVE)  # what the warehouse reads of a drafter


def drafters_dir(raw_dir: Path) -> Path:
    return Path(raw_dir) / DRAFTERS


def drafter_dir(raw_dir: Path, drafter_id: str) -> Path:
    return drafters_dir(raw_dir) / drafter_id


def drafter_complete(path: Path) -> bool:
    return (Path(path) / CARD).is_file() and (Path(path) / HEAD / "model.safetensors").is_file()


def drafter_dirs(raw_dir: Path) -> list[Path]:
    folder = drafters_dir(raw_dir)
    return [d for d in subdirs(folder) if drafter_complete(d)] if folder.is_dir() else []
