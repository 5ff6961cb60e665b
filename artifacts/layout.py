"""Where every raw artifact lives: each path under RAW/<campaign_id>/ is spelled here and nowhere else.

    RAW/<campaign_id>/campaign.json                                    CampaignRecord (written once)
    RAW/<campaign_id>/runs/<stamp>-<pid>-<nn>.json                     RunRecord (one per finished run)
    RAW/<campaign_id>/deployments/<launch_id>/deployment.json          DeploymentFacts (rewritten as it runs)
                                             /engine.log, command.txt  (not read by the warehouse)
    RAW/<campaign_id>/environments/<sha256>.txt                        an engine's `pip freeze` (once per hash)
    RAW/<campaign_id>/cells/<cell_id>.a<n>/meta.json                   CellMeta
                                          /summary.json                CellSummary
                                          /requests.parquet            REQUEST_SCHEMA, one row per request
                                          /gauges.parquet              GAUGE_SCHEMA, one row per scrape
                                          /metrics_before.txt, metrics_after.txt   the /metrics texts
                                          /gpu_telemetry.json, gpu_samples.parquet  GPU telemetry
    RAW/<campaign_id>/captures/<capture_id>/meta.json                  CaptureMeta
                                           /outputs.parquet            OUTPUT_SCHEMA, one row per prompt
    RAW/<campaign_id>/gates/<verdict_id>.json                          GateVerdictDocument
    RAW/<campaign_id>/capacity/<search_id>.json                        CapacitySearchDocument
    RAW/<campaign_id>/calibration/<calibration_id>.json                ClientCalibrationDocument
    RAW/<campaign_id>/sampling_checks/<check_id>.json                  SamplingCheckDocument
    RAW/<campaign_id>/adaptations/<adaptation_id>.json                 AdaptationDocument (tasks.adapt)
    RAW/<campaign_id>/decisions/<decision_id>[.rev<n>].json            DecisionDocument (analysis.verification)
    RAW/<campaign_id>/promotions/<decision_id>.json                    PromotionDocument (tasks.promote)
    RAW/drafters/<drafter_id>/card.json, curve.parquet, head/          DrafterCard (tasks.drafters.training)
    RAW/<campaign_id>/profiles/<profile_id>/meta.json                  ProfileMeta
                                           /breakdown.json             ProfileBreakdown (ok windows only)
                                           /metrics_before.txt, metrics_after.txt, trace/

Ids: artifacts.ids. Documents: artifacts.documents. Atomic writing: artifacts.store. Names that start with
'.' are temporaries (artifacts.store) or a campaign's writer lock and its holder's note (RAW/.<campaign_id>
.writer.lock and .writer.json, beside the campaign's folder so that taking the lock creates no campaign) and
never artifacts.

Every name below a root (campaign id, deployment id, cell id, ...) is built partly from data (spec, corpus,
imported metadata); `child` refuses any that is not one plain folder name under its parent (no '/', '..',
leading '.', control character), so no artifact path ever resolves outside its root, whatever slipped past
the checks where data enters (specgauge.names).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from artifacts import ids
from specgauge.errors import ArtifactError

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
GPU_TELEMETRY = "gpu_telemetry.json"  # GpuTelemetryDocument (cells written since GPU telemetry)
GPU_SAMPLES = "gpu_samples.parquet"  # GPU_SAMPLE_SCHEMA, when there were samples
CAPTURES = "captures"
OUTPUTS = "outputs.parquet"
GATES = "gates"
PROFILES = "profiles"
CAPACITY = "capacity"
CALIBRATION = "calibration"
SAMPLING_CHECKS = "sampling_checks"
ADAPTATIONS = "adaptations"
DECISIONS = "decisions"
PROMOTIONS = "promotions"
BREAKDOWN = "breakdown.json"

CELL_FILES = (META, SUMMARY, REQUESTS, GAUGES, METRICS_BEFORE, METRICS_AFTER)
CAPTURE_FILES = (META, OUTPUTS)
PROFILE_DOCUMENTS = (META, BREAKDOWN)  # what the warehouse reads of a profile (not the trace or scrapes)


WRITER_LOCK = ".writer.lock"  # RAW/.<campaign_id>.writer.lock: held by the one writer of that campaign
WRITER_NOTE = ".writer.json"  # RAW/.<campaign_id>.writer.json: who holds it (pid, host, command, since)
NAME_MAX = 255  # a file name's limit on Linux filesystems

_NOT_IN_A_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")


def is_temporary(name: str) -> bool:
    return name.startswith(".")


def part_problem(name: object) -> str | None:
    """Why `name` cannot be one artifact folder or file name (None when it can)."""
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if not name:
        return "is empty"
    if _NOT_IN_A_NAME.search(name):
        return "contains a path separator or a control character"
    if name.startswith("."):
        return "starts with '.' (names starting with '.' are '..', temporaries and locks)"
    if len(name.encode()) > NAME_MAX:
        return f"is longer than {NAME_MAX} bytes"
    return None


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def child(parent: Path, name: str, what: str = "artifact name") -> Path:
    """`parent / name`, or ArtifactError when `name` is not one plain name, or the path would resolve
    outside `parent` (compared lexically, so a root that is a symlink stays allowed)."""
    parent = Path(parent)
    problem = part_problem(name)
    if problem is None:
        base = os.path.normpath(os.path.abspath(parent))
        joined = os.path.normpath(os.path.join(base, name))
        if os.path.dirname(joined) != base:
            problem = f"resolves to {joined}, outside {base}"
    if problem:
        raise ArtifactError(
            f"{what} {_shown(name)} {problem}: refused, an artifact path must stay under {parent}"
        )
    return parent / name


def subdirs(path: Path) -> list[Path]:
    """The artifact directories in a folder, by name (temporaries left out)."""
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_dir() and not is_temporary(p.name))


# ------------------------------------------------------------------------------------------------ campaign


def writer_lock_file(directory: Path) -> Path:
    """The lock of one campaign's writer: beside its folder, a dotfile (never an artifact)."""
    directory = Path(directory)
    return directory.parent / f".{directory.name}{WRITER_LOCK}"


def writer_note_file(directory: Path) -> Path:
    """Who holds the campaign's writer lock (specgauge.locks.Holder), while it is held."""
    directory = Path(directory)
    return directory.parent / f".{directory.name}{WRITER_NOTE}"


def campaign_dir(raw_dir: Path, campaign_id: str) -> Path:
    return child(Path(raw_dir), campaign_id, "campaign id")


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
    return child(runs_dir(directory), f"{stem}.json", "run record")


# --------------------------------------------------------------------------------------------- deployments


def deployments_dir(directory: Path) -> Path:
    return Path(directory) / DEPLOYMENTS


ENVIRONMENTS = "environments"


def environment_file(deployment_directory: Path, sha256: str) -> Path:
    """Where a deployment's engine package lock is kept, once per hash: RAW/<campaign>/environments/
    <sha256>.txt for a deployment in a campaign (deployments/<launch_id>/), else beside the deployment."""
    directory = Path(deployment_directory)
    owner = directory.parent.parent if directory.parent.name == DEPLOYMENTS else directory
    return child(owner / ENVIRONMENTS, f"{sha256}.txt", "environment hash")


def deployment_dir(directory: Path, deployment_id: str) -> Path:
    return child(deployments_dir(directory), deployment_id, "deployment id")


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
    return child(cells_dir(directory), ids.attempt_name(cell_id, attempt), "cell id")


def cell_attempts(cells: Path, cell_id: str) -> list[Path]:
    """Existing attempts of one cell in a cells folder, oldest first."""
    child(cells, ids.attempt_name(cell_id, 1), "cell id")  # a hostile id never reaches the glob
    if not cells.exists():
        return []
    found = []
    for path in cells.glob(f"{glob_escape(cell_id)}.a*"):
        parsed = ids.parse_attempt_name(path.name)
        if path.is_dir() and parsed is not None and parsed[0] == cell_id:
            found.append((parsed[1], path))
    return [path for _, path in sorted(found)]


def next_cell_attempt(cells: Path, cell_id: str) -> tuple[Path, int]:
    """Where the next attempt of a cell goes, and its number (1 when it has none)."""
    attempts = cell_attempts(cells, cell_id)
    parsed = ids.parse_attempt_name(attempts[-1].name) if attempts else None
    attempt = (parsed[1] if parsed else 0) + 1
    return child(cells, ids.attempt_name(cell_id, attempt), "cell id"), attempt


def next_cell_dir(cells: Path, cell_id: str) -> Path:
    """Where the next attempt of a cell goes (attempt 1 when it has none)."""
    return next_cell_attempt(cells, cell_id)[0]


def glob_escape(name: str) -> str:
    """`name` matched literally by Path.glob ('[' ']' '*' '?' escaped; a load label may hold '?')."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


# ------------------------------------------------------------------------------------------------ captures


def captures_dir(directory: Path) -> Path:
    return Path(directory) / CAPTURES


def capture_dir(directory: Path, capture_id: str) -> Path:
    return child(captures_dir(directory), capture_id, "capture id")


def capture_complete(path: Path) -> bool:
    return all((Path(path) / name).exists() for name in CAPTURE_FILES)


# ------------------------------------------------------------------------------------------------ verdicts


def gates_dir(directory: Path) -> Path:
    return Path(directory) / GATES


def verdict_file(directory: Path, verdict_id: str) -> Path:
    return child(gates_dir(directory), f"{verdict_id}.json", "verdict id")


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
    return child(capacity_dir(directory), f"{search_id}.json", "capacity search id")


def search_files(directory: Path) -> list[Path]:
    return json_files(capacity_dir(directory))


# ------------------------------------------------------------------------------------- client calibration


def calibration_dir(directory: Path) -> Path:
    return Path(directory) / CALIBRATION


def calibration_file(directory: Path, calibration_id: str) -> Path:
    return child(calibration_dir(directory), f"{calibration_id}.json", "calibration id")


def calibration_files(directory: Path) -> list[Path]:
    return json_files(calibration_dir(directory))


# ------------------------------------------------------------------------------------------- sampling checks


def sampling_checks_dir(directory: Path) -> Path:
    return Path(directory) / SAMPLING_CHECKS


def sampling_check_file(directory: Path, check_id: str) -> Path:
    return child(sampling_checks_dir(directory), f"{check_id}.json", "sampling check id")


def sampling_check_files(directory: Path) -> list[Path]:
    return json_files(sampling_checks_dir(directory))


# ------------------------------------------------------------------------------------------------ adaptations


def adaptations_dir(directory: Path) -> Path:
    return Path(directory) / ADAPTATIONS


def adaptation_file(directory: Path, adaptation_id: str) -> Path:
    return child(adaptations_dir(directory), f"{adaptation_id}.json", "adaptation id")


def adaptation_files(directory: Path) -> list[Path]:
    return json_files(adaptations_dir(directory))


# ------------------------------------------------------------------------------- decisions and promotions


def decision_file(directory: Path, decision_id: str, revision: int = 1) -> Path:
    """A decision's n-th revision (ids.decision_revision_name): a recomputed decision is a new file."""
    name = ids.decision_revision_name(decision_id, revision)
    return child(Path(directory) / DECISIONS, f"{name}.json", "decision id")


def decision_revisions(directory: Path, decision_id: str) -> list[tuple[int, Path]]:
    """(revision, file) of one decision in a campaign's folder, oldest first."""
    found = [(ids.parse_decision_revision(p.stem), p) for p in decision_files(directory)]
    return sorted((revision, p) for (name, revision), p in found if name == decision_id)


def decision_files(directory: Path) -> list[Path]:
    return json_files(Path(directory) / DECISIONS)


def promotion_file(directory: Path, decision_id: str) -> Path:
    return child(Path(directory) / PROMOTIONS, f"{decision_id}.json", "decision id")


def promotion_files(directory: Path) -> list[Path]:
    return json_files(Path(directory) / PROMOTIONS)


# ------------------------------------------------------------------------------------------------ profiles


def profiles_dir(directory: Path) -> Path:
    return Path(directory) / PROFILES


def profile_dir(directory: Path, profile_id: str) -> Path:
    return child(profiles_dir(directory), profile_id, "profile id")


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
    return child(drafters_dir(raw_dir), drafter_id, "drafter id")


def drafter_complete(path: Path) -> bool:
    return (Path(path) / CARD).is_file() and (Path(path) / HEAD / "model.safetensors").is_file()


def drafter_dirs(raw_dir: Path) -> list[Path]:
    folder = drafters_dir(raw_dir)
    return [d for d in subdirs(folder) if drafter_complete(d)] if folder.is_dir() else []
