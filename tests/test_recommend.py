"""The speculation-config recommender on a planted depth x load surface (three depths of one drafter at
three loads, four repeats): the schedule it derives, its evidence and caveats, the CLI, and vLLM's own
validation of the schedule."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from analysis_fixtures import PlantedBuilder, planted_throughput_speedup, profile
from typer.testing import CliRunner
from warehouse_fixtures import make_spec

from analysis.data import AnalysisSettings, load_campaign
from analysis.recommend import boundaries, recommend, schedule_of
from cli.app import app
from experiments.spec import Variant
from warehouse.db import reader

REPO = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = REPO / ".engine-venv" / "bin" / "python"
PLAIN_TPOT = 0.020
# The draft model's TPOT speedup by concurrency and depth: deep drafting wins alone, k=2 wins at C=4, and at
# C=16 every depth loses (speculation off).
SURFACE = {1: {1: 1.3, 2: 1.6, 4: 2.0}, 4: {1: 1.2, 2: 1.35, 4: 1.05}, 16: {1: 0.9, 2: 0.8, 4: 0.6}}
DRIFT = [1.00, 1.06, 0.96, 1.02]
NOISE = [1.01, 0.99, 1.015, 0.985]
FAST = AnalysisSettings()
DRAFT = {"name": "draft", "method": "draft_model", "k": [1, 2, 4], "draft_model": "models/tiny-draft"}


def build(root: Path, repeats: int = 4, concurrencies: tuple[int, ...] = (1, 4, 16)) -> Path:
    def plant(variant: str, repeat: int, workload: str, load: str):
        tpot = PLAIN_TPOT * DRIFT[repeat]
        if variant == "plain":
            return profile(tpot, None)
        k = int(variant.rsplit("-k", 1)[1])
        return profile(tpot / SURFACE[int(load[1:])][k] * NOISE[repeat], 0.5, tokens_per_chunk=1 + 0.5 * k)

    spec = make_spec(
        "surface",
        repeats=repeats,
        concurrencies=concurrencies,
        requests=16,
        variants=[{"name": "plain", "method": "none"}, DRAFT],
    )
    return PlantedBuilder(root / "raw", spec=spec, plant=plant).build(root / "w.duckdb")


@pytest.fixture(scope="module")
def surface_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("surface"))


def recommendations(db: Path):
    with reader(db) as con:
        return recommend(load_campaign(con), FAST)


def test_the_schedule_follows_the_best_depth_at_each_load_and_turns_off(surface_db: Path) -> None:
    (rec,) = recommendations(surface_db)
    assert (rec.family, rec.method, rec.workload) == ("draft_model models/tiny-draft", "draft_model", "chat")
    assert [(c.concurrency, c.best_k, c.k) for c in rec.choices] == [(1, 4, 4), (4, 2, 2), (16, 1, 0)]
    assert rec.schedule == [[1, 2, 4], [3, 8, 2], [9, 256, 0]]  # boundaries at sqrt(1*4), sqrt(4*16)
    assert rec.config == {
        "num_speculative_tokens": 4,
        "method": "draft_model",
        "model": "models/tiny-draft",
        "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 8, 2], [9, 256, 0]],
    }
    # The evidence: each best depth's planted throughput speedup, and its edge over the runner-up.
    for c in rec.choices:
        truth = planted_throughput_speedup(PLAIN_TPOT, SURFACE[c.concurrency][c.best_k])
        assert c.speedup == pytest.approx(truth, rel=0.05), c
        assert c.speedup_low <= truth <= c.speedup_high
        runner = planted_throughput_speedup(PLAIN_TPOT, SURFACE[c.concurrency][c.runner_up_k])
        assert (
            c.edge == pytest.approx(truth / runner, rel=0.05) and c.edge_low <= truth / runner <= c.edge_high
        )
        assert c.separated is True
    assert any("C=16: speculation off" in note for note in rec.caveats)
    assert any(note.startswith("k 0 is not plain") for note in rec.caveats)  # the schedule has off ranges
    Variant.model_validate({**DRAFT, "name": "rec", "k": 4, "k_schedule": rec.schedule})  # a spec takes it


def test_thin_evidence_is_said_never_hidden(tmp_path: Path) -> None:
    (single,) = recommendations(build(tmp_path / "one-repeat", repeats=1))
    assert single.schedule == [[1, 2, 4], [3, 8, 2], [9, 256, 0]]
    assert all(c.edge_low is None and c.separated is None for c in single.choices)
    assert sum("untested" in note for note in single.caveats) == 3
    (one_load,) = recommendations(build(tmp_path / "one-load", concurrencies=(4,)))
    assert one_load.schedule == [[1, 256, 2]]
    assert one_load.config is not None and "num_speculative_tokens_per_batch_size" not in one_load.config
    assert one_load.config["num_speculative_tokens"] == 2
    assert any(note.startswith("one load measured (C=4)") for note in one_load.caveats)


def test_ranges_split_at_geometric_means_and_merge_equal_depths() -> None:
    assert boundaries([1, 4, 16]) == [(1, 2), (3, 8), (9, 256)]
    assert boundaries([2, 3], max_batch=64) == [(1, 2), (3, 64)]  # floor(sqrt(6)) = 2: at least the load
    assert boundaries([8]) == [(1, 256)]

    class C:  # the only fields schedule_of reads
        def __init__(self, concurrency: int, k: int) -> None:
            self.concurrency, self.k = concurrency, k

    assert schedule_of([C(1, 3), C(4, 3), C(16, 0)]) == [[1, 8, 3], [9, 256, 0]]  # type: ignore[list-item]


def test_cli_prints_the_evidence_and_json(surface_db: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["recommend", "--db", str(surface_db)])
    assert shown.exit_code == 0, shown.output
    assert "--speculative-config" in shown.output and "caveat: C=16: speculation off" in shown.output
    assert "[" in shown.output.split("best k", 1)[1]  # intervals printed as [low, high]
    as_json = runner.invoke(app, ["recommend", "--db", str(surface_db), "--json"])
    assert as_json.exit_code == 0, as_json.output
    (rec,) = json.loads(as_json.output)
    assert rec["schedule"] == [[1, 2, 4], [3, 8, 2], [9, 256, 0]] and len(rec["evidence"]) == 3


@pytest.mark.skipif(not ENGINE_PYTHON.exists(), reason="needs the engine venv (make engine)")
def test_vllm_accepts_the_schedule(surface_db: Path) -> None:
    """vLLM 0.32's own validator and dense lookup (the code its scheduler runs) on the recommended config."""
    (rec,) = recommendations(surface_db)
    probe = (
        "import json, sys\n"
        "from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup\n"
        "config = json.loads(sys.argv[1])\n"
        "lookup = build_dynamic_sd_schedule_lookup(\n"
        "    config['num_speculative_tokens_per_batch_size'], 256, config['num_speculative_tokens'])\n"
        "print(json.dumps([lookup[b] for b in (1, 2, 3, 8, 9, 256)]))\n"
    )
    done = subprocess.run(
        [str(ENGINE_PYTHON), "-c", probe, json.dumps(rec.config)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [4, 4, 2, 2, 0, 0]


def test_the_report_shows_the_recommendation(surface_db: Path, tmp_path: Path) -> None:
    from analysis.run import analyze_campaign

    result = analyze_campaign(None, surface_db, settings=FAST, reports_dir=tmp_path / "reports")
    (rec,) = result.results.recommendations
    page = Path(result.report).read_text()
    assert "Which depth at which load" in page
    assert json.dumps(rec.config).replace('"', "&quot;") in page  # the config to deploy, as printed
    assert "speculation off" in page


def test_a_verification_campaign_launches_plain_the_best_fixed_depth_and_the_schedule(
    surface_db: Path, tmp_path: Path
) -> None:
    from analysis.recommend import best_fixed_k, verification, verification_spec
    from experiments.spec import parse_spec

    with reader(surface_db) as con:
        data = load_campaign(con)
    (rec,) = recommend(data, FAST)
    fixed = best_fixed_k(rec, data, FAST)
    assert fixed == 2  # geometric mean over C=1, 4, 16: k=2 (1.6, 1.35, 0.8) beats k=4 (2.0, 1.05, 0.6)
    spec = parse_spec(verification_spec(data.spec, rec, fixed))  # the source's validity: no A/A arm
    assert [v.name for v in spec.variants] == ["plain", "fixed-k2", "recommended"]
    recommended = spec.variants[2]
    assert recommended.speculative_config() == rec.config
    assert spec.load.concurrencies == (1, 4, 16) and spec.profile is None and spec.capture.enabled
    # a schedule that runs one depth at every measured load is that fixed config: launched once, not twice
    flat = replace(
        rec,
        config={
            "num_speculative_tokens": 2,
            **(
                {
                    k: v
                    for k, v in rec.config.items()
                    if k not in ("num_speculative_tokens", "num_speculative_tokens_per_batch_size")
                }
            ),
        },
    )
    assert [v.name for v in parse_spec(verification_spec(data.spec, flat, 2)).variants] == [
        "plain",
        "recommended",
    ]
    assert [v.name for v in parse_spec(verification_spec(data.spec, flat, 4)).variants] == [
        "plain",
        "fixed-k4",
        "recommended",
    ]

    # The verification campaign, planted: the schedule runs k=4 at C=1, k=2 at C=4, off at C=16.
    scheduled = {1: SURFACE[1][4], 4: SURFACE[4][2], 16: 0.99}

    def plant(variant: str, repeat: int, workload: str, load: str):
        c, tpot = int(load[1:]), PLAIN_TPOT * DRIFT[repeat]
        if variant == "plain":
            return profile(tpot, None)
        if variant == "fixed-k2":  # its own launches: their own launch-to-launch variation
            return profile(tpot / SURFACE[c][2] * NOISE[::-1][repeat], 0.5)
        return profile(tpot / scheduled[c] * NOISE[repeat], 0.5)

    planted = spec.model_copy(update={"repeats": 4, "load": spec.load.model_copy(update={"requests": 16})})
    db = PlantedBuilder(tmp_path / "raw", spec=planted, plant=plant).build(tmp_path / "v.duckdb")
    with reader(db) as con:
        verdicts = {v.concurrency: v for v in verification(load_campaign(con), FAST)}
    # k=4 alone at C=1: 2.0 over plain (confirmed), 1.25 over the fixed k=2
    assert (verdicts[1].k, verdicts[1].outcome) == (4, "confirmed") and verdicts[1].over_fixed_low > 1
    # the schedule runs k=2 at C=4: it beats plain (1.35), no edge over the fixed k=2
    assert (verdicts[4].k, verdicts[4].outcome) == (2, "confirmed")
    assert verdicts[4].over_fixed_low < 1 < verdicts[4].over_fixed_high
    # off at C=16: 0.99 of plain, but its interval [0.92, 1.06] reaches below the 5% tolerance: not shown
    # either way; it beats k=2's 0.8
    assert (verdicts[16].k, verdicts[16].outcome) == (0, "inconclusive") and verdicts[16].over_fixed > 1.1
    assert verdicts[16].over_plain_low < 0.95 < verdicts[16].over_plain_high
    assert "CONFIRMED" in verdicts[1].text() and "INCONCLUSIVE, the interval" in verdicts[16].text()
    # the verification campaign's report gives the answer
    from analysis.run import analyze_campaign

    page = Path(
        analyze_campaign(None, db, settings=FAST, reports_dir=tmp_path / "reports").report
    ).read_text()
    assert "Does the recommended schedule pay?" in page
    assert verdicts[1].text() in page and verdicts[4].text() in page


def test_the_verification_spec_is_written_once_per_recommendation(surface_db: Path, home: Path) -> None:
    from analysis.verification import write_verification_spec
    from experiments.spec import load_spec
    from specgauge.errors import InputError

    path = write_verification_spec(None, None, surface_db)
    assert path.parent == home / "specs" and path.name.endswith("-verify-chat.yaml")
    spec = load_spec(path)
    # the A/A arm is the verification's own (decision.verify_aa_control), whatever the sweep ran
    assert [v.name for v in spec.variants] == ["plain", "fixed-k2", "recommended", "plain-aa"]
    assert spec.variants[2].k_schedule == ((1, 2, 4), (3, 8, 2), (9, 256, 0))
    first = path.read_text()
    assert write_verification_spec(None, "chat", surface_db) == path and path.read_text() == first
    with pytest.raises(InputError, match="no recommendation to verify on workload 'code'"):
        write_verification_spec(None, "code", surface_db)


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_the_printed_config_launches_and_runs_its_schedule_on_the_engine(
    surface_db: Path, engine_lock: None, tmp_path: Path
) -> None:
    """`specgauge recommend --json`'s config, passed to the engine as printed: it serves, drafts k=4 alone
    and turns speculation off at batch 9 and above."""
    from experiments.plan import CellPlan
    from experiments.spec import SLO, LoadSpec, LocalLaunchSpec, Sampling, TargetSpec
    from tasks.cell import run_cell
    from tasks.health import wait_ready
    from tasks.launch.local import LocalLauncher
    from workloads.schema import load_corpus

    printed = CliRunner().invoke(app, ["recommend", "--db", str(surface_db), "--json"])
    assert printed.exit_code == 0, printed.output
    (rec,) = json.loads(printed.output)
    config = rec["speculative_config"]
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 2], [9, 256, 0]]
    target = TargetSpec(model=str(REPO / "models" / "tiny-target"), served_model_name="tiny")
    variant = Variant(
        name="printed",
        method=config["method"],
        k=config["num_speculative_tokens"],
        draft_model=config["model"],
        k_schedule=config["num_speculative_tokens_per_batch_size"],
    )
    assert variant.speculative_config() == config  # the engine gets exactly the printed JSON
    assert Path(config["model"]).is_absolute()  # a repo-relative drafter would read as a hub id
    launcher = LocalLauncher(LocalLaunchSpec(compilation="eager"))  # no compile: the start is not measured
    deployment = launcher.launch(target, variant, deployment_id="printed.r0", directory=tmp_path / "dep")
    corpus = load_corpus(REPO / "workloads" / "smoke.jsonl")

    def cell(concurrency: int, requests: int):
        return run_cell(
            deployment,
            CellPlan(
                f"printed.r0.code.c{concurrency}",
                "code",
                "closed",
                concurrency,
                None,
                "workloads/smoke.jsonl",
            ),
            campaign_id="printed",
            repeat=0,
            corpus=corpus,
            sampling=Sampling(max_tokens=32, ignore_eos=True),
            load=LoadSpec(
                concurrencies=(concurrency,),
                requests=requests,
                warmup=0,
                allow_short_cells=True,
                request_timeout_s=300,
            ),
            slo=SLO(),
            cells_dir=tmp_path / "cells",
        )

    try:
        wait_ready(deployment, launcher, timeout_s=600)
        alone, crowded = cell(1, 4), cell(12, 36)
    finally:
        launcher.teardown(deployment)
    assert alone.status == "ok" and crowded.status == "ok", (alone.summary.error, crowded.summary.error)
    drafted_alone, drafted_crowded = alone.summary.speculation, crowded.summary.speculation
    assert drafted_alone is not None and drafted_crowded is not None
    # batch 1: every step drafts 4 tokens
    assert drafted_alone.drafts and drafted_alone.draft_tokens == 4 * drafted_alone.drafts
    # batch 12 (only the ramp and the tail run below 9): far fewer draft tokens per generated token
    per_token_alone = drafted_alone.draft_tokens / alone.summary.completion_tokens
    per_token_crowded = (drafted_crowded.draft_tokens or 0) / crowded.summary.completion_tokens
    assert per_token_crowded < 0.5 * per_token_alone, (per_token_alone, per_token_crowded)
