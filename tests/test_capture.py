"""Greedy capture: refusals and failed requests without an engine; then, on the real engine, captures of
the 36-prompt corpus on plain (twice), a second separately launched plain deployment, each speculative
variant (those the session's campaign took) and a deliberately lossy treatment, and the gate's verdicts on
them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from artifacts.documents.captures import load_capture
from experiments.spec import Sampling, Variant, load_spec
from specgauge.errors import ArtifactError
from tasks.capture import SamplingNotGreedy, capture
from tasks.gate import GateRefusal, compare, gate
from tasks.launch.base import Deployment
from tasks.launch.local import free_port
from workloads.schema import load_corpus

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "workloads" / "capture.jsonl"
CAMPAIGN = "capture-test-00000000"


def nowhere(tmp_path: Path) -> Deployment:
    """A deployment whose address nobody listens on: every request fails to connect."""
    base = f"http://127.0.0.1:{free_port()}"
    return Deployment(
        id=f"{CAMPAIGN}.nowhere.r1",
        launcher="endpoint",
        variant=Variant(name="plain"),
        served_model_name="tiny-plain",
        base_url=base,
        metrics_url=f"{base}/metrics",
        directory=tmp_path,
    )


def test_refuses_non_greedy_sampling_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(SamplingNotGreedy, match="temperature 1"):
        capture(
            nowhere(tmp_path),
            load_corpus(CORPUS),
            sampling=Sampling(temperature=1.0),
            raw_campaign_dir=tmp_path,
            capture_id="hot",
            campaign_id=CAMPAIGN,
        )
    assert not (tmp_path / "captures").exists()


def test_failed_requests_are_kept_with_their_reason(tmp_path: Path) -> None:
    def capture_down(**options: Any) -> Path:
        """Three prompts against a deployment nobody listens on, as capture 'down'."""
        return capture(
            nowhere(tmp_path),
            load_corpus(CORPUS),
            sampling=Sampling(),
            limit=3,
            raw_campaign_dir=tmp_path,
            capture_id="down",
            campaign_id=CAMPAIGN,
            **options,
        )

    seen: list[tuple[int, int]] = []
    path = capture_down(progress=lambda done, total, record: seen.append((done, total)), timeout_s=5)
    assert path == tmp_path / "captures" / "down"
    loaded = load_capture(path)
    assert loaded.prompt_ids == ["cap-chat-00", "cap-chat-01", "cap-chat-02"]
    assert all(not o.ok and o.error for o in loaded.outputs)
    assert loaded.meta["requests"] == {"total": 3, "ok": 0, "failed": 3, "with_token_ids": 0}
    assert seen == [(1, 3), (2, 3), (3, 3)]
    with pytest.raises(ArtifactError, match="never overwritten"):  # refused before a request goes out
        capture_down()


# --- the real engine --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(
    demo_campaign: dict, campaign_spec: Path, engines, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Captures of the whole 36-prompt corpus on every deployment the gate needs. The session's campaign
    (tests/conftest.py) took them on its plain deployments (plain.r0 twice: the same-deployment control;
    plain.ctl1: launched apart, the cross-deployment control) and on each speculative variant's first repeat;
    added here: a temperature-1 capture on the session's plain engine, and the draft model served as the
    target (a lossy treatment, launched here and torn down at once)."""
    from tasks.health import wait_ready
    from tasks.launch.local import LocalLauncher

    spec = load_spec(campaign_spec)
    campaign_dir = Path(demo_campaign["directory"])
    out = {capture.name: capture for capture in (campaign_dir / "captures").iterdir()}
    corpus = load_corpus(CORPUS)
    raw = tmp_path_factory.mktemp("raw") / CAMPAIGN
    greedy = spec.sampling

    def take(deployment: Deployment, capture_id: str, **kwargs) -> None:
        out[capture_id] = capture(
            deployment,
            corpus,
            sampling=kwargs.pop("sampling", greedy),
            max_tokens=spec.capture.max_tokens,  # as the campaign captured, so the prompts compare
            raw_campaign_dir=raw,
            capture_id=capture_id,
            campaign_id=CAMPAIGN,
            **kwargs,
        )

    take(  # a few prompts: the gate refuses it for its sampling before it reads a prompt
        engines.get("plain"),
        "plain.t1",
        sampling=greedy.model_copy(update={"temperature": 1.0}),
        allow_sampling=True,
        limit=4,
    )
    draft = next(v for v in spec.variants if v.name == "draft-k3").draft_model
    launcher = LocalLauncher(spec.launcher)
    deployment_id = f"{CAMPAIGN}.draft-as-target.r0"
    deployment = launcher.launch(
        spec.target.model_copy(update={"model": draft}),
        Variant(name="draft-as-target"),
        deployment_id=deployment_id,
        directory=raw.parent / "deployments" / deployment_id,
    )
    try:
        wait_ready(deployment, launcher, timeout_s=spec.launcher.ready_timeout_s)
        launcher.collect_facts(deployment)
        take(deployment, "draft-as-target.r0")
    finally:
        launcher.teardown(deployment)
    return out


def speculative(campaign_spec: Path) -> list[str]:
    """The capture of each speculative variant's first repeat, as the campaign named it."""
    return [f"{v.name}.r0" for v in load_spec(campaign_spec).variants if v.speculative]


def controls(real: dict[str, Path]) -> list[tuple[Path, Path]]:
    return [(real["plain.r0"], real["plain.r0.again"]), (real["plain.r0"], real["plain.ctl1"])]


@pytest.mark.engine
def test_capture_artifact_on_the_engine(real: dict[str, Path], campaign_spec: Path, tmp_path: Path) -> None:
    corpus = load_corpus(CORPUS)
    treatments = speculative(campaign_spec)
    assert treatments  # the campaign has speculative variants
    for capture_id in ("plain.r0", *treatments):
        loaded = load_capture(real[capture_id])
        assert loaded.prompt_ids == [p.id for p in corpus.prompts]
        assert all(o.ok for o in loaded.outputs), [o.error for o in loaded.outputs if not o.ok]
        for output in loaded.outputs:
            # vLLM returned every chunk's token ids, and they account for every counted token
            assert output.token_ids is not None and len(output.token_ids) == output.completion_tokens
            assert output.finish_reason in ("stop", "length") and output.text is not None
        assert loaded.meta["sampling"]["temperature"] == 0.0 and loaded.meta["sequential"] is True
        assert loaded.meta["warnings"] == []
    for capture_id in treatments:  # drafts were proposed and verified during the capture
        speculation = load_capture(real[capture_id]).meta["speculation"]
        assert speculation["draft_tokens"] > 0 and speculation["accepted_tokens"] > 0, speculation
    assert load_capture(real["plain.r0"]).meta["speculation"] is None

    # the warehouse ingests the artifact as written (its captures/capture_outputs tables)
    from warehouse.db import writer
    from warehouse.ingest import ingest_path
    from warehouse.kinds import captures

    with writer(tmp_path / "warehouse.duckdb") as con:
        outcome = ingest_path(con, captures.KIND, real["plain.r0"])
        stored = con.execute("SELECT outputs, outputs_ok FROM captures").fetchall()
    assert outcome.action == "inserted", outcome.message
    assert stored == [(36, 36)]


@pytest.mark.engine
def test_gate_passes_every_speculative_variant(real: dict[str, Path], campaign_spec: Path) -> None:
    for treatment in speculative(campaign_spec):
        verdict = gate((real["plain.r0"], real[treatment]), controls(real))
        assert [kind for _, kind, _ in verdict.controls] == ["same_deployment", "cross_deployment"]
        assert verdict.treatment.overall.n == 36 and verdict.treatment.overall.token_level == 36
        assert verdict.passed, verdict.claim
        assert verdict.claim.startswith("consistent with lossless speculation")


@pytest.mark.engine
def test_gate_fails_the_draft_model_served_as_target(real: dict[str, Path]) -> None:
    verdict = gate((real["plain.r0"], real["draft-as-target.r0"]), controls(real))
    assert not verdict.passed and verdict.outcome == "diverged", verdict.claim
    assert verdict.claim.startswith("diverged beyond the control envelope")
    assert not next(c for c in verdict.checks if c.name == "exact_match").passed


@pytest.mark.engine
def test_temperature_one_capture_cannot_be_compared_with_greedy(real: dict[str, Path]) -> None:
    with pytest.raises(GateRefusal, match=r"sampling\.temperature differs: 0\.0 .* vs 1\.0"):
        compare(real["plain.r0"], real["plain.t1"])
    with pytest.raises(GateRefusal, match=r"sampling\.temperature differs"):
        gate((real["plain.r0"], real["plain.t1"]), controls(real))
