"""The run form's overrides (variants, strata, concurrencies, repeats) applied to a spec, refused clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from experiments.overrides import SpecOverrides, load_spec_with
from experiments.plan import campaign_id_for, plan_campaign
from experiments.spec import load_spec
from specgauge.errors import SpecError

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "experiments" / "demo.yaml"
DEPTHS = REPO / "experiments" / "depth-load.yaml"


def test_no_override_is_the_spec_itself() -> None:
    assert load_spec_with(DEMO, SpecOverrides.of([], [], [], None)) == load_spec(DEMO)
    assert not SpecOverrides.of([], None, [], None)


def test_overrides_narrow_the_campaign_and_give_it_its_own_id() -> None:
    spec = load_spec(DEMO)
    narrowed = load_spec_with(DEMO, SpecOverrides.of(["draft-k3"], ["code"], [2], 1))
    assert [v.name for v in narrowed.variants] == ["plain", "draft-k3", "plain-aa"]  # baselines kept
    assert [(w.file, w.strata) for w in narrowed.workloads] == [("workloads/smoke.jsonl", ("code",))]
    assert narrowed.load.concurrencies == (2,) and narrowed.repeats == 1
    assert narrowed.load.requests == spec.load.requests  # what is not overridden stays
    plan = plan_campaign(narrowed)
    assert {(d.variant.name, c.workload, c.concurrency) for d, c in plan.cells()} == {
        (v, "code", 2) for v in ("plain", "draft-k3", "plain-aa")
    }
    assert campaign_id_for(narrowed) != campaign_id_for(spec)


def test_variants_are_named_as_expanded() -> None:
    spec = load_spec(DEPTHS)
    expanded = [v.name for v in spec.variants if v.method != "none"]
    chosen = load_spec_with(DEPTHS, SpecOverrides.of([expanded[1]]))
    assert [v.name for v in chosen.variants if v.method != "none"] == [expanded[1]]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (SpecOverrides.of(["draft-k9"]), "variants: no variant draft-k9 (the spec has plain, ngram-k3"),
        (SpecOverrides.of(strata=["poetry"]), "strata: no workload of the spec has poetry"),
        (SpecOverrides.of(concurrencies=[0]), "concurrencies: must be whole numbers >= 1"),
        (SpecOverrides.of(repeats=0), "repeats: Input should be greater than 0"),
    ],
)
def test_a_bad_override_names_the_spec_and_the_override(overrides: SpecOverrides, message: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec_with(DEMO, overrides)
    assert str(refused.value).startswith(f"{DEMO} (with the overrides ")
    assert message in str(refused.value)


def test_the_cli_takes_the_same_overrides_and_refuses_before_launching(tmp_path: Path) -> None:
    runner = CliRunner()
    home = {"SPECGAUGE_HOME": str(tmp_path / "home")}
    bad = runner.invoke(app, ["campaign", "run", str(DEMO), "--variants", "nope"], env=home)
    assert bad.exit_code == 2
    assert "variants: no variant nope" in " ".join(bad.stderr.split())
    assert "Traceback" not in bad.output
    not_a_number = runner.invoke(app, ["campaign", "run", str(DEMO), "--concurrencies", "1,x"], env=home)
    assert not_a_number.exit_code == 2 and "--concurrencies: 'x' is not a int" in not_a_number.stderr
    assert not (tmp_path / "home" / "raw").exists()  # nothing written
