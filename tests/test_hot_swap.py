"""Hot swap of an EAGLE-3 head in a running engine (tasks/drafters/swap.py, issue 19 part 3).

One engine (tests/data/specs/hot_swap.yaml's eagle3 variant, hot_swap: true) serves every engine test of
this module; the pool's idle engines are stopped first. The heads are derived from models/tiny-eagle3
(tests/hot_swap_heads.py): one with its lm_head rows permuted (a different head whose drafts land on wrong
tokens, so that a swap that took effect shows in the acceptance counters), corrupt ones, and ones whose
config breaks the drafter contract."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hot_swap_heads import BASE_HEAD, PROMPTS, derive_head, greedy, reconfigured_head, truncated_head

from artifacts.documents import CellMeta, DeploymentFacts
from artifacts.store import read_document
from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling, Variant, load_spec
from specgauge.checkpoints import drafter_digest, drafter_record
from specgauge.errors import SpecError
from specgauge.provenance import utc_now
from specgauge.settings import REPO_ROOT, get_settings
from tasks.cell import run_cell
from tasks.drafters.swap import (
    SwapFailed,
    SwapRecord,
    SwapRefused,
    current_drafter,
    record_swap,
    serving_drafter_sha256,
    swap_head,
)
from tasks.health import wait_ready
from tasks.launch.base import Deployment
from tasks.launch.engine_side import ENGINE_SIDE_DIR, EXTENSION_CLASS
from tasks.launch.local import LocalLauncher
from workloads.schema import load_corpus

SPEC = REPO_ROOT / "tests" / "data" / "specs" / "hot_swap.yaml"
TARGET = REPO_ROOT / "models" / "tiny-target"


def _variant() -> Variant:
    return next(v for v in load_spec(SPEC).variants if v.hot_swap)


# ------------------------------------------------------------------------------------------ no engine


def test_hot_swap_is_eagle3_only_and_adds_the_extension_and_dev_mode() -> None:
    with pytest.raises(SpecError, match="hot_swap: only an eagle3 variant"):
        load_spec(SPEC).model_copy()  # the spec itself is fine
        from experiments.spec import parse_spec

        parse_spec(
            {
                "name": "x",
                "target": {"model": "models/tiny-target"},
                "variants": [{"name": "plain"}, {"name": "ng", "method": "ngram", "k": 3, "hot_swap": True}],
                "workloads": [{"file": "workloads/smoke.jsonl"}],
            },
            "inline",
        )
    spec = load_spec(SPEC)
    launcher = LocalLauncher(spec.launcher)
    swap_cmd = launcher.command(spec.target, _variant(), 1234)
    plain_cmd = launcher.command(spec.target, spec.variants[0], 1234)
    at = swap_cmd.index("--worker-extension-cls")
    assert swap_cmd[at + 1] == EXTENSION_CLASS and "--worker-extension-cls" not in plain_cmd
    assert (ENGINE_SIDE_DIR / (EXTENSION_CLASS.split(".")[0] + ".py")).is_file()


def test_engine_side_digest_is_the_clients_drafter_digest(tmp_path: Path) -> None:
    """The extension hashes the files it loads as `drafter_digest` does (its own copy: the engine cannot
    import specgauge), so the client can check the engine read the head it meant."""
    other = derive_head(get_settings().engine_python, tmp_path / "perturbed", "perturb")
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import specgauge_swap as s; "
        "print(s.read_head(sys.argv[2])[0]); print(s.read_head(sys.argv[3])[0])"
    )
    out = subprocess.run(
        [str(get_settings().engine_python), "-c", probe, str(ENGINE_SIDE_DIR), str(BASE_HEAD), str(other)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()
    assert out == [drafter_digest(BASE_HEAD), drafter_digest(other)]
    assert out[0] != out[1]


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_contract_refusal_names_head_and_field_before_any_rpc(tmp_path: Path) -> None:
    """A head that does not fit is refused from its files alone: the deployment's address has no server,
    so any call to it would raise SwapFailed instead, and its facts record no swap."""
    base_url = _closed_port()
    deployment = Deployment(
        id="t.hot-swap.l1",
        launcher="local",
        variant=_variant(),
        served_model_name="tiny-eagle3-k3-swap",
        base_url=base_url,
        metrics_url=f"{base_url}/metrics",
        directory=tmp_path / "dep",
        command=["python", "-m", "vllm", "--model", str(TARGET)],
        status="ready",
        drafter=drafter_record("eagle3", "models/tiny-eagle3", BASE_HEAD),
    )
    deployment.save()
    cases = {
        "hidden size": reconfigured_head(tmp_path / "wide", {"hidden_size": 384, "target_hidden_size": 384}),
        "aux layers": reconfigured_head(
            tmp_path / "aux9", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 9]}}
        ),
        "eagle_config": reconfigured_head(
            tmp_path / "aux024", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}}
        ),
        "architecture": reconfigured_head(tmp_path / "arch", {"architectures": ["MistralForCausalLM"]}),
        "draft vocabulary": reconfigured_head(tmp_path / "vocab", {"vocab_size": 8192}),
    }
    for field, head in cases.items():
        with pytest.raises(SwapRefused) as refused:
            swap_head(deployment, head)
        assert refused.value.field == field, refused.value
        assert str(head) in str(refused.value)
    plain_launch = Deployment(**{**deployment.__dict__, "variant": Variant(name="e", method="eagle3", k=3,
                                                                             eagle_head="models/tiny-eagle3")})  # fmt: skip
    with pytest.raises(SwapRefused) as refused:
        swap_head(plain_launch, BASE_HEAD)
    assert refused.value.field == "hot_swap"
    facts = read_document(deployment.directory / "deployment.json", DeploymentFacts)
    assert facts.drafter is not None and facts.drafter.swaps is None
    assert facts.drafter.sha256 == drafter_digest(BASE_HEAD)


def test_a_cell_carries_the_head_serving_when_it_ran_and_fails_when_swapped_under_it(
    emulator, tmp_path: Path
) -> None:
    """The cell reads the serving head from deployment.json (a swap made through another Deployment object,
    another process, is seen), and a swap during its window fails it: it measured two heads. Against the
    emulator: the bookkeeping, not the engine."""
    deployment = Deployment(
        id="t.hot-swap-cell.l1",
        launcher="endpoint",
        variant=_variant(),
        served_model_name="emulated",
        base_url=emulator.url,
        metrics_url=f"{emulator.url}/metrics",
        directory=tmp_path / "dep",
        status="ready",
        drafter=drafter_record("eagle3", "models/tiny-eagle3", BASE_HEAD),
    )
    deployment.save()
    base = drafter_digest(BASE_HEAD)
    other = reconfigured_head(tmp_path / "other", {"rms_norm_eps": 1e-5})  # any other digest will do
    swapped: list[str] = []

    def swap_elsewhere(record: object) -> None:
        if not swapped:  # once, while the cell's requests run
            elsewhere = Deployment.load(deployment.directory / "deployment.json")
            new = SwapRecord(at=utc_now(), old_sha256=base, new_sha256=drafter_digest(other), head=str(other))
            record_swap(elsewhere, new, current_drafter(elsewhere))
            swapped.append(new.new_sha256)

    corpus = load_corpus(REPO_ROOT / "workloads" / "smoke.jsonl")
    common = {
        "campaign_id": "hot-swap-emulated",
        "repeat": 0,
        "corpus": corpus,
        "sampling": Sampling(temperature=0.0, max_tokens=8, seed=0),
        "load": LoadSpec(
            concurrencies=(1,), requests=2, warmup=0, allow_short_cells=True, gauge_interval_s=0.2
        ),
        "slo": SLO(),
        "cells_dir": tmp_path / "cells",
    }
    plan = CellPlan(f"{deployment.variant.name}.r0.code.c1", "code", "closed", 1, None, "smoke.jsonl")
    during = run_cell(deployment, plan, on_record=swap_elsewhere, **common)  # type: ignore[arg-type]
    assert during.status == "failed" and "swapped during the cell" in (during.summary.error or "")
    after = run_cell(deployment, plan, **common)  # type: ignore[arg-type]
    assert after.status == "ok", after.summary.error
    meta = read_document(after.path / "meta.json", CellMeta)
    assert meta.deployment and meta.deployment.drafter and meta.deployment.drafter.sha256 == swapped[0]
    assert deployment.drafter and deployment.drafter["sha256"] == base  # this object never saw the swap


# ----------------------------------------------------------------------------------------- one engine


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    python = get_settings().engine_python
    return {
        "permuted": derive_head(python, root / "permuted", "permute_lm_head"),
        "nan": derive_head(python, root / "nan", "nan"),
        "truncated": truncated_head(root / "truncated"),
    }


@pytest.fixture(scope="module")
def swap_engine(engines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    engines.stop()  # the pool's idle engines: one engine on 2 cores (the session holds the engine lock)
    spec = load_spec(SPEC)
    launcher = LocalLauncher(spec.launcher)
    deployment = launcher.launch(
        spec.target,
        _variant(),
        deployment_id="t.hot-swap.l1",
        directory=tmp_path_factory.mktemp("swap-engine"),
    )
    try:
        wait_ready(deployment, launcher, timeout_s=900)
        launcher.collect_facts(deployment)
        deployment.save()
        yield deployment
    finally:
        launcher.teardown(deployment)


def _greedy(deployment: Deployment) -> tuple[list[list[int]], int]:
    """Greedy token ids of PROMPTS and the draft tokens accepted while generating them."""
    outputs, accepted, drafted = greedy(deployment, PROMPTS)
    assert drafted > 0
    return outputs, accepted


def _cell(deployment: Deployment, tmp_path: Path, name: str) -> CellMeta:
    spec = load_spec(SPEC)
    outcome = run_cell(
        deployment,
        CellPlan(f"{deployment.variant.name}.r0.code.c1", "code", "closed", 1, None, "smoke.jsonl"),
        campaign_id=f"hot-swap-{name}",
        repeat=0,
        corpus=load_corpus(REPO_ROOT / "workloads" / "smoke.jsonl"),
        sampling=Sampling(temperature=0.0, max_tokens=16, seed=0),
        load=LoadSpec(concurrencies=(1,), requests=2, warmup=0, allow_short_cells=True),
        slo=SLO(),
        cells_dir=tmp_path / name,
    )
    assert outcome.status == "ok", outcome.summary.error
    assert spec.variants  # the cell ran on the spec's variant
    return read_document(outcome.path / "meta.json", CellMeta)


@pytest.mark.engine
@pytest.mark.timeout(1200)
def test_swap_changes_the_serving_head_records_it_and_cells_carry_it(
    swap_engine: Deployment, heads: dict[str, Path], no_idle_engines, tmp_path: Path
) -> None:
    deployment = swap_engine
    base, other = drafter_digest(BASE_HEAD), drafter_digest(heads["permuted"])
    assert serving_drafter_sha256(deployment) == base
    before_cell = _cell(deployment, tmp_path, "before")
    reference, accepted_base = _greedy(deployment)

    record = swap_head(deployment, heads["permuted"])
    assert (record.old_sha256, record.new_sha256, record.head) == (base, other, str(heads["permuted"]))
    assert serving_drafter_sha256(deployment) == other  # the engine computes with the new head's weights
    facts = read_document(deployment.directory / "deployment.json", DeploymentFacts)
    assert facts.drafter is not None and facts.drafter.sha256 == other and facts.drafter.swaps is not None
    last = facts.drafter.swaps[-1]
    assert (last.at, last.old_sha256, last.new_sha256) == (record.at, base, other)
    outputs, accepted_other = _greedy(deployment)
    after_cell = _cell(deployment, tmp_path, "after")

    back = swap_head(deployment, BASE_HEAD)
    outputs_back, accepted_back = _greedy(deployment)
    assert serving_drafter_sha256(deployment) == base and (back.old_sha256, back.new_sha256) == (other, base)

    # Lossless: the target's greedy tokens whatever head drafts; the permuted head's drafts are refused.
    assert outputs == reference and outputs_back == reference
    assert accepted_other * 4 < accepted_base, (accepted_base, accepted_other)
    assert accepted_back == accepted_base  # the original head, restored: the same drafts, greedy
    # Cells copy the head serving when they ran.
    assert before_cell.deployment and before_cell.deployment.drafter
    assert after_cell.deployment and after_cell.deployment.drafter
    assert before_cell.deployment.drafter.sha256 == base
    assert after_cell.deployment.drafter.sha256 == other
    assert [s.new_sha256 for s in after_cell.deployment.drafter.swaps or []] == [other]
    swaps = read_document(deployment.directory / "deployment.json", DeploymentFacts).drafter.swaps  # type: ignore[union-attr]
    assert [(s.old_sha256, s.new_sha256) for s in swaps or []] == [(base, other), (other, base)]
    print(f"swap took {record.seconds * 1000:.0f} ms, swap back {back.seconds * 1000:.0f} ms")


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_a_failed_swap_leaves_the_old_head_serving(
    swap_engine: Deployment, heads: dict[str, Path], no_idle_engines
) -> None:
    deployment = swap_engine
    serving = serving_drafter_sha256(deployment)
    reference, accepted = _greedy(deployment)
    swaps = len((deployment.drafter or {}).get("swaps") or [])
    for name, says in (("truncated", "bytes, its header describes"), ("nan", "non-finite")):
        with pytest.raises(SwapFailed, match=says):
            swap_head(deployment, heads[name])
        assert serving_drafter_sha256(deployment) == serving  # verified by the engine, not just recorded
        outputs, accepted_after = _greedy(deployment)
        assert outputs == reference and accepted_after == accepted  # the same head drafts the same tokens
    facts = read_document(deployment.directory / "deployment.json", DeploymentFacts)
    assert facts.drafter is not None and len(facts.drafter.swaps or []) == swaps
    assert json.loads((deployment.directory / "deployment.json").read_text())["status"] == "ready"
