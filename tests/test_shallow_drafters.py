"""Shallow drafters (issue 33, item 2): a draft truncated to fewer layers (tasks/drafters/truncate.py, a
variant's `draft_layers`), the per-layer cost model and the report's answer (analysis/drafter_depth.py).

The truncation runs for real (the engine's venv, torch and transformers: the worker loads what it wrote);
the cost model and the report read a planted warehouse written through the real raw layout and ingest."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest
from analysis_fixtures import PlantedBuilder, profile

from analysis.data import AnalysisSettings, load_campaign
from analysis.drafter_depth import cost_model, cost_points, drafter_depth_section, drafter_layers, winners
from analysis.run import analyze_campaign, compute
from experiments.spec import parse_spec
from specgauge.checkpoints import drafter_digest
from specgauge.errors import InputError, SpecError
from specgauge.settings import REPO_ROOT
from specgauge.truncation import TRUNCATION_KEY, truncated_dir
from tasks.drafters.prelaunch import check_launchable
from tasks.drafters.truncate import ensure_truncated
from warehouse.db import reader

DRAFT = "models/tiny-draft"  # 2 decoder layers


def _safetensors_names(path: Path) -> list[str]:
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    return sorted(name for name in header if name != "__metadata__")


# ------------------------------------------------------------------------------------------- truncation


@pytest.fixture(scope="module")
def truncated(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("home")
    return home, ensure_truncated(DRAFT, 1, home)


def test_the_truncated_draft_has_its_first_layers_only_and_a_hash_of_its_own(truncated) -> None:
    home, drafter = truncated
    assert drafter.built and drafter.path == truncated_dir(DRAFT, 1, home)
    config = json.loads((drafter.path / "config.json").read_text())
    source_config = json.loads((REPO_ROOT / DRAFT / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and source_config["num_hidden_layers"] == 2
    assert config[TRUNCATION_KEY] == {
        "source": DRAFT,
        "source_sha256": drafter_digest(REPO_ROOT / DRAFT),
        "source_layers": 2,
        "layers": 1,
    }
    names = _safetensors_names(drafter.path / "model.safetensors")
    source_names = _safetensors_names(REPO_ROOT / DRAFT / "model.safetensors")
    assert not [n for n in names if ".layers.1." in n]  # the dropped layer's weights are gone
    assert [n for n in source_names if ".layers.1." in n]
    assert names == [n for n in source_names if ".layers.1." not in n]  # everything else kept
    assert (drafter.path / "tokenizer.json").read_bytes() == (
        REPO_ROOT / DRAFT / "tokenizer.json"
    ).read_bytes()
    assert drafter.sha256 == drafter_digest(drafter.path) != drafter_digest(REPO_ROOT / DRAFT)
    assert drafter.source_sha256 == drafter_digest(REPO_ROOT / DRAFT)


def test_a_second_build_finds_the_slot_and_runs_nothing(truncated) -> None:
    home, first = truncated
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns
    started = time.monotonic()
    again = ensure_truncated(DRAFT, 1, home)
    assert not again.built and again.sha256 == first.sha256
    assert (first.path / "model.safetensors").stat().st_mtime_ns == stamp
    assert time.monotonic() - started < 5  # no worker process started (it takes seconds to import torch)


def test_the_hash_is_stable_across_builds_and_a_stale_slot_is_rebuilt(truncated, tmp_path: Path) -> None:
    _, first = truncated
    fresh = ensure_truncated(DRAFT, 1, tmp_path)
    assert fresh.built and fresh.sha256 == first.sha256  # same source, same bytes: same identity
    config_path = fresh.path / "config.json"
    config = json.loads(config_path.read_text())
    config[TRUNCATION_KEY]["source_sha256"] = "0" * 64  # as if the source had changed since
    config_path.write_text(json.dumps(config))
    rebuilt = ensure_truncated(DRAFT, 1, tmp_path)
    assert rebuilt.built and rebuilt.sha256 == first.sha256


def test_a_depth_the_draft_does_not_have_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"2 layers: the draft models/tiny-draft has 2 .*keep 1\.\.1"):
        ensure_truncated(DRAFT, 2, tmp_path)
    assert not (tmp_path / "cache").exists()


def _spec(variants: list[dict], launcher: dict | None = None, **extra):
    return parse_spec(
        {
            "name": "shallow",
            "target": {"model": "models/tiny-target", "served_model_name": "tiny", "max_model_len": 2048},
            "variants": [{"name": "plain", "method": "none"}, *variants],
            "workloads": [{"file": "workloads/smoke.jsonl", "strata": ["code"]}],
            "load": {"concurrencies": [1, 4], "requests": 16, "warmup": 2, "allow_short_cells": True},
            "validity": {"aa_control": False},
            **({"launcher": launcher} if launcher else {}),
            **extra,
        }
    )


def test_the_variant_serves_the_truncated_checkpoint_and_the_spec_refuses_misuse(home: Path) -> None:
    spec = _spec([{"name": "d1", "method": "draft_model", "k": 3, "draft_model": DRAFT, "draft_layers": 1}])
    variant = spec.variants[1]
    assert variant.drafter == str(truncated_dir(DRAFT, 1, home)) == variant.speculative_config()["model"]
    assert spec.variants[1].draft_model == DRAFT  # the spec keeps what it was given
    with pytest.raises(SpecError, match="draft_layers: only a draft_model variant"):
        _spec(
            [{"name": "e", "method": "eagle3", "k": 3, "eagle_head": "models/tiny-eagle3", "draft_layers": 1}]
        )
    with pytest.raises(SpecError, match="draft_layers"):
        _spec([{"name": "d0", "method": "draft_model", "k": 3, "draft_model": DRAFT, "draft_layers": 0}])


def test_prelaunch_refuses_a_depth_the_draft_does_not_have_naming_the_field() -> None:
    too_deep = _spec(
        [{"name": "d5", "method": "draft_model", "k": 3, "draft_model": DRAFT, "draft_layers": 5}]
    )
    with pytest.raises(SpecError, match=r"^s\.yaml: variants\[1\]\.draft_layers: 5 layers: .* has 2"):
        check_launchable(too_deep, source="s.yaml")


# ------------------------------------------------------------------------------------------- 2-layer head

WARM_START_CHECK = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
sys.path.insert(0, "models")
import train_eagle3 as te, train_eagle3_layers as tl
target = json.loads(Path("models/tiny-target/config.json").read_text())
torch.manual_seed(0)
embed, lm = torch.randn(4096, 320), torch.randn(4096, 320)
one = te.build_head(te.head_config_for(target, [1, 3, 5]), embed, lm)
one.load_state_dict(load_file("models/tiny-eagle3/model.safetensors"), strict=False)
config = tl.deep_head_config(2)(target, [1, 3, 5])
two = tl.deep_head_builder(2, Path("models/tiny-eagle3"))(config, embed, lm)
two.head_dim, two.rope = config["head_dim"], tl._rope(config)
aux, ids = torch.randn(2, 24, 960), torch.randint(5, 4096, (2, 24))
with torch.no_grad():
    diffs = [float((a - b).abs().max()) for a, b in zip(one.float()(aux, ids, 3), two.float()(aux, ids, 3))]
print(json.dumps({"diffs": diffs, "layers": config["num_hidden_layers"], "names": sorted(two.vllm_state_dict())}))
"""


def test_the_2_layer_head_starts_as_its_parent_and_is_saved_as_vllm_names_it() -> None:
    """models/train_eagle3_layers.py: the warm start computes the 1-layer parent's logits at every draft step
    (the added layer is the identity until trained), and the committed head carries layer 1 as `layers.1.*`."""
    import subprocess

    from tasks.drafters.training_data import worker_python

    done = subprocess.run(
        [str(worker_python()), "-c", WARM_START_CHECK],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["layers"] == 2 and answer["diffs"] == [0.0, 0.0, 0.0]
    committed = _safetensors_names(REPO_ROOT / "models" / "tiny-eagle3-2layer" / "model.safetensors")
    assert committed == answer["names"] and "layers.1.self_attn.q_proj.weight" in committed
    config = json.loads((REPO_ROOT / "models" / "tiny-eagle3-2layer" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2


# ------------------------------------------------------------------------------------------- cost model

PLAIN_TPOT = 0.020
DRIFT = [1.00, 1.04, 0.98]
# c = a + b x layers per load: at C=1 a layer is cheap next to what the full draft's acceptance buys; at C=4
# it costs more, and the 1-layer draft wins
FIXED = {"c1": 0.002, "c4": 0.002}
PER_LAYER = {"c1": 0.001, "c4": 0.006}
ACCEPTANCE = {"full": 0.6, "shallow": 0.4}  # per position; L = 1 + 3a at k=3


def _planted_spec(repeats: int = 3):
    return _spec(
        [
            {"name": "full", "method": "draft_model", "k": 3, "draft_model": DRAFT},
            {"name": "shallow", "method": "draft_model", "k": 3, "draft_model": DRAFT, "draft_layers": 1},
        ],
        repeats=repeats,
        capture={"corpus": "workloads/capture.jsonl", "plain_controls": 1},
    )


def _plant(variant: str, repeat: int, workload: str, load: str):
    plain = PLAIN_TPOT * DRIFT[repeat]
    if variant == "plain":
        return profile(plain, None)
    layers = {"full": 2, "shallow": 1}[variant]
    step = plain + 3 * (FIXED[load] + PER_LAYER[load] * layers)
    return profile(step / (1 + 3 * ACCEPTANCE[variant]), ACCEPTANCE[variant])


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("planted")
    db = PlantedBuilder(root / "raw", spec=_planted_spec(), plant=_plant).build(
        root / "w.duckdb", gates=False
    )
    with reader(db) as con:
        data = load_campaign(con)
    return data, compute(data, AnalysisSettings()), db


def test_the_cost_model_recovers_the_planted_cost_per_layer(planted) -> None:
    data, _, _ = planted
    assert drafter_layers(data.spec) == {"full": 2, "shallow": 1}  # from the draft's config and draft_layers
    model = cost_model(cost_points(data))
    assert model.height == 2  # one fit per load
    for row in model.iter_rows(named=True):
        assert row["layers"] == [1, 2] and row["n_points"] == 6
        assert row["per_layer_s"] == pytest.approx(PER_LAYER[row["load_label"]], rel=0.1, abs=2e-4), row
        assert row["fixed_s"] == pytest.approx(FIXED[row["load_label"]], rel=0.25, abs=5e-4), row
        assert row["per_layer_low"] <= row["per_layer_s"] <= row["per_layer_high"]


def test_the_cost_model_needs_two_depths_and_fits_three_exactly() -> None:
    rows = [
        {
            "method": "draft_model",
            "workload": "code",
            "load_label": "c1",
            "concurrency": 1,
            "variant": f"v{n}",
            "k": 3,
            "repeat": r,
            "layers": n,
            "cost_per_position_s": 0.001 + 0.0005 * n + 1e-5 * r,
            "step_time_s": 0.0,
            "plain_step_time_s": 0.0,
            "tokens_per_step": 2.0,
        }
        for n in (1, 2, 4)
        for r in (0, 1)
    ]
    points = pl.DataFrame(rows).with_columns(
        pl.col("layers").cast(pl.Int32), pl.col("concurrency").cast(pl.Int32)
    )
    (fit,) = cost_model(points).iter_rows(named=True)
    assert fit["per_layer_s"] == pytest.approx(0.0005, rel=1e-6) and fit["fixed_s"] == pytest.approx(
        0.001, abs=1e-5
    )
    assert cost_model(points.filter(pl.col("layers") == 2)).is_empty()  # one depth: no fit


def test_the_report_names_the_winning_depth_per_load(planted) -> None:
    data, results, _ = planted
    table = winners(cost_points(data), results.speedup)
    won = {r["load_label"]: r["variant"] for r in table.filter(pl.col("wins")).iter_rows(named=True)}
    assert won == {"c1": "full", "c4": "shallow"}
    section = drafter_depth_section(data, results.speedup, "<div>chart</div>")
    assert section.anchor == "drafter-depth" and "Per-layer cost model" in section.body
    assert section.body.count('class="win"') == 2 and "<div>chart</div>" in section.body


def test_the_report_carries_the_section_and_its_chart(planted, tmp_path: Path) -> None:
    data, _, db = planted
    result = analyze_campaign(data.campaign_id, db, reports_dir=tmp_path)
    page = result.report.read_text(encoding="utf-8")
    assert 'id="drafter-depth"' in page and "Which drafter depth wins" in page
    assert "drafter_depth" in [files.name for files in result.charts]


# ------------------------------------------------------------------------------------------- the engine


@pytest.mark.engine
@pytest.mark.timeout(1800)
def test_a_campaign_serves_the_truncated_draft_and_records_its_digest(
    prefect_harness: None, no_idle_engines, home: Path, tmp_path: Path
) -> None:
    """plain + the full draft + the draft cut to 1 layer, C=1, 4 requests, on the embedded engine: the
    truncated checkpoint is built before the first launch, and the warehouse's cells of the 1-layer variant
    carry its digest, not the full draft's."""
    from flows.campaign import CampaignRequest, campaign
    from warehouse.db import default_path

    spec_path = tmp_path / "shallow.yaml"
    spec_path.write_text(
        "name: shallow-engine\n"
        "target: {model: models/tiny-target, served_model_name: tiny, max_model_len: 2048}\n"
        "variants:\n"
        "  - {name: plain, method: none}\n"
        f"  - {{name: draft-full, method: draft_model, k: 3, draft_model: {DRAFT}}}\n"
        f"  - {{name: draft-1l, method: draft_model, k: 3, draft_model: {DRAFT}, draft_layers: 1}}\n"
        "workloads: [{file: workloads/smoke.jsonl, strata: [code]}]\n"
        "load: {concurrencies: [1], requests: 4, warmup: 1}\n"
        "capture: {enabled: false}\n"
        "validity: {aa_control: false, client_calibration: false}\n"
        "launcher: {kind: local, kv_cache_gib: 1, ready_timeout_s: 600}\n"
    )
    result = campaign(CampaignRequest(spec_path=str(spec_path), gate=False, analyze=False))
    assert not result.get("failed_cells"), result
    slot = truncated_dir(DRAFT, 1, home)
    with reader(default_path()) as con:
        rows = con.execute("SELECT variant, drafter_sha256 FROM v_cells").fetchall()
    digests = dict(rows)
    assert set(digests) == {"plain", "draft-full", "draft-1l"}
    assert digests["draft-1l"] == drafter_digest(slot)
    assert digests["draft-full"] == drafter_digest(REPO_ROOT / DRAFT) != digests["draft-1l"]
    assert digests["plain"] is None
