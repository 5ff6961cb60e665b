"""Experiment specs: the shipped ones load; bad ones fail naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from experiments.spec import load_spec, parse_spec
from specgauge.errors import SpecError

REPO = Path(__file__).resolve().parent.parent


def demo() -> dict:
    return yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_specs_load(path: Path) -> None:
    spec = load_spec(path)
    assert spec.plain.method == "none"


def test_demo_variants_render_vllm_speculative_configs() -> None:
    spec = load_spec(REPO / "experiments" / "demo.yaml")
    configs = {v.name: v.speculative_config() for v in spec.variants}
    assert configs["plain"] is None
    assert configs["ngram-k3"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
    }
    assert configs["draft-k3"] == {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "model": "models/tiny-draft",
    }


def bad(mutate) -> str:
    data = demo()
    mutate(data)
    with pytest.raises(SpecError) as info:
        parse_spec(data, "experiments/x.yaml")
    return str(info.value)


def test_errors_name_the_field() -> None:
    assert "experiments/x.yaml: variants[2].k: Value error" not in bad(lambda d: d["variants"][2].update(k=0))
    assert "variants[2]: method 'draft_model' needs k (num_speculative_tokens) > 0, got 0" in bad(
        lambda d: d["variants"][2].update(k=0)
    )
    assert (
        "variants[1].method: Input should be 'none', 'ngram', 'draft_model', 'eagle3', 'suffix', 'dspark', 'dflash' or 'mtp'"
        in bad(lambda d: d["variants"][1].update(method="medusa"))
    )
    assert "load.concurrencies[0]: Input should be greater than 0" in bad(
        lambda d: d["load"].update(concurrencies=[0])
    )
    assert "sampling.temprature: unknown field (check its spelling)" in bad(
        lambda d: d["sampling"].update(temprature=0)
    )
    assert "variants[0].name: Value error, variant name 'plain; rm -rf /'" not in bad(
        lambda d: d["variants"][0].update(name="plain; rm -rf /")
    )
    assert "variants[0].name: variant name 'plain; rm -rf /' may only contain" in bad(
        lambda d: d["variants"][0].update(name="plain; rm -rf /")
    )


def test_plain_baseline_and_unique_names_are_required() -> None:
    assert "needs a plain variant" in bad(lambda d: d.update(variants=d["variants"][1:]))
    assert "variant names must be unique: ngram-k3" in bad(
        lambda d: d["variants"].append(dict(d["variants"][1]))
    )


def test_yaml_syntax_errors_give_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nvariants: [\n  - a\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}:")
    assert "invalid YAML" in str(info.value)


def test_learned_and_other_drafter_variants_render_vllm_configs() -> None:
    data = demo()  # its eagle3-k3 is models/tiny-eagle3
    data["variants"] += [
        {"name": "eagle3-tp", "method": "eagle3", "k": 5, "eagle_head": "h", "draft_tensor_parallel_size": 1},
        {"name": "suffix-k8", "method": "suffix", "k": 8},
        {"name": "dspark-k7", "method": "dspark", "k": 7, "draft_model": "org/dspark"},
        {"name": "dflash-k4", "method": "dflash", "k": 4, "draft_model": "org/dflash"},
        {"name": "mtp-k1", "method": "mtp", "k": 1},
    ]
    spec = parse_spec(data, "x.yaml")
    configs = {v.name: v.speculative_config() for v in spec.variants}
    assert configs["eagle3-k3"] == {
        "num_speculative_tokens": 3,
        "method": "eagle3",
        "model": "models/tiny-eagle3",
    }
    assert configs["eagle3-tp"]["draft_tensor_parallel_size"] == 1
    assert configs["suffix-k8"] == {"num_speculative_tokens": 8, "method": "suffix"}
    assert configs["dspark-k7"] == {"num_speculative_tokens": 7, "method": "dspark", "model": "org/dspark"}
    assert configs["dflash-k4"] == {"num_speculative_tokens": 4, "method": "dflash", "model": "org/dflash"}
    assert configs["mtp-k1"] == {"num_speculative_tokens": 1, "method": "mtp"}
    drafters = {v.name: v.drafter for v in spec.variants}
    assert drafters["plain"] is None and drafters["ngram-k3"] is None and drafters["suffix-k8"] is None
    assert drafters["eagle3-k3"] == "models/tiny-eagle3" and drafters["draft-k3"] == "models/tiny-draft"


def test_settings_a_method_does_not_read_are_refused() -> None:
    def one(variant: dict) -> str:
        return bad(lambda d: d["variants"].append(variant))

    assert "variants[4]: method 'dflash' needs draft_model (the dflash drafter's path)" in one(
        {"name": "x", "method": "dflash", "k": 3}
    )
    assert "variants[4]: method 'eagle3' does not take draft_model" in one(
        {"name": "x", "method": "eagle3", "k": 3, "eagle_head": "h", "draft_model": "d"}
    )
    assert "variants[4]: method 'suffix' does not take draft_tensor_parallel_size" in one(
        {"name": "x", "method": "suffix", "k": 3, "draft_tensor_parallel_size": 1}
    )
    assert "variants[4]: method 'draft_model' does not take eagle_head, prompt_lookup_max" in one(
        {
            "name": "x",
            "method": "draft_model",
            "k": 3,
            "draft_model": "d",
            "eagle_head": "h",
            "prompt_lookup_max": 2,
        }
    )
    assert "method 'none' (plain) takes no speculative settings, got draft_tensor_parallel_size" in one(
        {"name": "x", "method": "none", "draft_tensor_parallel_size": 1}
    )


def test_the_tests_campaign_is_the_demo_cut_down() -> None:
    """tests/data/specs/campaign.yaml (the engine tests' campaign) measures the demo's deployments: its
    target, launcher, sampling and variants are the demo's, each variant defined exactly as there; it runs
    less (strata, requests), never something else."""
    demo_spec = load_spec(REPO / "experiments" / "demo.yaml")
    tests_spec = load_spec(REPO / "tests" / "data" / "specs" / "campaign.yaml")
    assert tests_spec.target == demo_spec.target
    assert tests_spec.launcher == demo_spec.launcher and tests_spec.sampling == demo_spec.sampling
    demo_variants = {v.name: v for v in demo_spec.variants}
    assert all(v == demo_variants.get(v.name) for v in tests_spec.variants)
    assert {v.method for v in tests_spec.variants} >= {"none", "ngram", "draft_model"}
    assert demo_spec.repeats == 2 and 1 <= tests_spec.repeats <= demo_spec.repeats  # the demo shows intervals
    # the gate's controls: the same deployment captured twice, and a plain deployment launched apart
    assert tests_spec.capture.corpus == demo_spec.capture.corpus and tests_spec.capture.enabled
    assert tests_spec.repeats + tests_spec.capture.plain_controls >= 2
    assert tests_spec.profile.variant == demo_spec.profile.variant
    assert tests_spec.profile.requests <= demo_spec.profile.requests
    (workload,) = tests_spec.workloads
    assert {"code", "summarization"} <= set(workload.strata or ())  # the acceptance floors' strata
    assert len(tests_spec.load.concurrencies) >= 2  # crossover and capacity need two loads


# -- axes: depths and load-scaled request counts (issue 17) -------------------------------------------------
def test_a_list_of_depths_expands_into_one_variant_per_k(tmp_path: Path) -> None:
    from experiments.plan import plan_campaign

    data = demo()
    draft = next(v for v in data["variants"] if v["name"] == "draft-k3")
    data["variants"] = [v for v in data["variants"] if v["name"] != "draft-k3"]
    data["variants"].append({**draft, "name": "draft", "k": [1, 2, 5]})
    data.pop("profile", None)
    spec = parse_spec(data)
    drafts = [v for v in spec.variants if v.method == "draft_model"]
    assert [(v.name, v.k) for v in drafts] == [("draft-k1", 1), ("draft-k2", 2), ("draft-k5", 5)]
    assert [v.speculative_config()["num_speculative_tokens"] for v in drafts] == [1, 2, 5]
    plan = plan_campaign(spec)
    launched = {d.variant.name for d in plan.deployments if d.role == "arm"}
    assert {"draft-k1", "draft-k2", "draft-k5", "plain"} <= launched
    assert plan.gate is not None and {t for t, _ in plan.gate.treatments} >= {
        "draft-k1",
        "draft-k2",
        "draft-k5",
    }


def test_a_bad_depth_in_a_list_names_the_entry_and_line(tmp_path: Path) -> None:
    spec_file = tmp_path / "depths.yaml"
    data = demo()
    data["variants"].append({"name": "ng", "method": "ngram", "k": [2, 0]})
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    lines = spec_file.read_text().splitlines()
    entry_line = next(i for i, line in enumerate(lines, 1) if line.strip() in ("name: ng", "- name: ng"))
    with pytest.raises(SpecError) as bad:
        load_spec(spec_file)
    message = str(bad.value)
    index = len(data["variants"]) - 1
    assert f"variants[{index}]" in message and "needs k (num_speculative_tokens) > 0, got 0" in message
    assert message.startswith(f"{spec_file}:{entry_line}: "), message  # the entry as written
    data["variants"][-1]["k"] = []
    with pytest.raises(SpecError, match=r"variants: entry \d+: k is an empty list"):
        parse_spec(data)


def test_request_counts_scale_with_load_unless_the_spec_fixes_them() -> None:
    from experiments.spec import LoadSpec

    scaled = LoadSpec(concurrencies=(1, 4, 16), rates=(2.0,))
    assert [scaled.requests_at(c) for c in (1, 4, 16, None)] == [32, 32, 64, 32]
    assert [scaled.warmup_at(c) for c in (1, 4, 16, None)] == [1, 4, 16, 2]
    fixed = LoadSpec(concurrencies=(1, 16), requests=8, warmup=0, allow_short_cells=True)
    assert [fixed.requests_at(c) for c in (1, 16, None)] == [8, 8, 8]
    assert [fixed.warmup_at(c) for c in (1, 16, None)] == [0, 0, 0]


def test_requests_per_slot_measures_that_many_per_slot_at_every_closed_load() -> None:
    from experiments.spec import LoadSpec

    per_slot = LoadSpec(concurrencies=(1, 4, 16), rates=(2.0,), requests_per_slot=4)
    assert [per_slot.requests_at(c) for c in (1, 4, 16, None)] == [4, 16, 64, 32]  # open loop: its default
    assert [per_slot.warmup_at(c) for c in (1, 4, 16, None)] == [1, 4, 16, 2]
    floored = LoadSpec(concurrencies=(1, 4, 16), requests_per_slot=4, min_requests=12)
    assert [floored.requests_at(c) for c in (1, 4, 16)] == [12, 16, 64]  # every prompt of 12 at C=1


def test_min_requests_is_a_floor_under_requests_per_slot_only(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"load.min_requests is a floor under load.requests_per_slot"):
        load_spec(short_load_file(tmp_path, requests=64, min_requests=12))


def short_load_file(tmp_path: Path, **load: object) -> Path:
    data = demo()
    data["load"] = {"concurrencies": [1, 4, 16], "request_timeout_s": 120, **load}
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip().startswith(text))


def test_a_closed_loop_cell_shorter_than_its_load_is_refused_naming_file_line_field_and_minimum(
    tmp_path: Path,
) -> None:
    path = short_load_file(tmp_path, requests=12, warmup=1)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    requests, warmup = str(info.value).splitlines()
    assert requests == (
        f"{path}:{line_of(path, 'requests:')}: load.requests: 12 measures fewer than 4 x C = 64 requests at "
        "C=16 (a closed-loop cell turns every slot over several times); set it to at least 64, use "
        "load.requests_per_slot, or say load.allow_short_cells: true"
    )
    assert warmup.startswith(f"{path}:{line_of(path, 'warmup:')}: load.warmup: 1 warms up fewer than C = 16")
    assert "set it to at least 16" in warmup
    # the largest load it falls short of is named: 16 requests are enough at C=4, not at 16
    with pytest.raises(
        SpecError, match=r"load.requests: 16 measures fewer than 4 x C = 64 requests at C=16 "
    ):
        load_spec(short_load_file(tmp_path, requests=16))
    # enough at every load, said to be short on purpose, or open loop only: each loads
    assert load_spec(short_load_file(tmp_path, requests=64, warmup=16)).load.requests_at(1) == 64
    assert (
        load_spec(short_load_file(tmp_path, requests=12, warmup=1, allow_short_cells=True)).load.requests
        == 12
    )
    open_only = short_load_file(tmp_path, concurrencies=[], rates=[1.0], requests=3, warmup=0)
    assert load_spec(open_only).load.requests_at(None) == 3


def test_requests_per_slot_is_at_least_four_and_never_beside_requests(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"load.requests_per_slot: 2 x C measures fewer than 4 x C"):
        load_spec(short_load_file(tmp_path, requests_per_slot=2))
    assert (
        load_spec(short_load_file(tmp_path, requests_per_slot=2, allow_short_cells=True)).load.requests_at(16)
        == 32
    )
    with pytest.raises(
        SpecError, match=r"load.requests: give load.requests .* or load.requests_per_slot, not both"
    ):
        load_spec(short_load_file(tmp_path, requests=64, requests_per_slot=4))
    with pytest.raises(SpecError, match=r"load.requests_per_slot: 100000 x C = 1,600,000 requests at C=16"):
        load_spec(short_load_file(tmp_path, requests_per_slot=100_000))


def test_allowing_short_cells_keeps_the_campaign_id_what_is_measured_changes_it() -> None:
    from experiments.plan import campaign_id_for

    data = demo()
    plain = campaign_id_for(parse_spec(data))
    assert campaign_id_for(parse_spec({**data, "load": {**data["load"], "allow_short_cells": True}})) == plain
    assert campaign_id_for(parse_spec({**data, "load": {**data["load"], "engine_warmup": True}})) == plain
    unwarmed = campaign_id_for(parse_spec({**data, "load": {**data["load"], "engine_warmup": False}}))
    slots8 = campaign_id_for(parse_spec({**data, "load": {**data["load"], "requests_per_slot": 8}}))
    assert len({plain, unwarmed, slots8}) == 3


def test_each_cell_runs_and_records_its_own_request_count() -> None:
    from experiments.plan import CellPlan
    from experiments.spec import LoadSpec
    from tasks.cell import load_plan

    load = LoadSpec(concurrencies=(2, 16))
    plans = [
        load_plan(CellPlan(f"p.r0.code.c{c}", "code", "closed", c, None, "w.jsonl"), load, 0) for c in (2, 16)
    ]
    assert [(p.requests, p.warmup) for p in plans] == [(32, 2), (64, 16)]


def sweep(**changes) -> dict:
    data = demo()
    data["sampling"] = [
        {"name": "greedy", "temperature": 0.0, "seed": 0},
        {"name": "topk5", "temperature": 1.0, "top_k": 5, "seed": 0},
    ]
    data["layouts"] = [{"tensor_parallel_size": 2}, {"data_parallel_size": 2}]
    return {**data, **changes}


def test_sampling_and_layout_lists_give_each_setting_a_copy_of_every_variant_and_its_own_plain() -> None:
    from experiments.plan import plan_campaign
    from tasks.launch.command import served_name, vllm_args

    spec = parse_spec(sweep())
    base = [v["name"] for v in demo()["variants"]]
    settings = ("greedy-tp2dp1", "greedy-tp1dp2", "topk5-tp2dp1", "topk5-tp1dp2")
    # and the demo's A/A control: one, a copy of the reference setting's plain
    assert [v.name for v in spec.variants] == [f"{n}-{s}" for s in settings for n in base] + [
        "plain-greedy-tp2dp1-aa"
    ]
    assert spec.plain.name == "plain-greedy-tp2dp1" and spec.sampling.greedy  # the first setting's
    for setting in settings:
        plain = next(v for v in spec.variants if v.name == f"plain-{setting}")
        for name in base:
            variant = next(v for v in spec.variants if v.name == f"{name}-{setting}")
            assert spec.setting_of(variant) == spec.setting_of(plain)
    topk = next(v for v in spec.variants if v.name == "draft-k3-topk5-tp1dp2")
    assert spec.sampling_of(topk).top_k == 5 and topk.setting_label == "T=1 top_k=5 tp1dp2"
    args = vllm_args(
        spec.target_of(topk), topk, served_model_name=served_name(spec.target, topk), host="h", port=1
    )
    assert "--data-parallel-size" in args and "--tensor-parallel-size" not in args
    # the gate compares greedy outputs of the reference setting only: nothing else is captured
    plan = plan_campaign(spec)
    captured = {d.variant.name for d in plan.deployments if d.captures}
    assert captured == {f"{n}-greedy-tp2dp1" for n in base}
    assert plan.gate is not None and {t for t, _ in plan.gate.treatments} == captured - {
        "plain-greedy-tp2dp1"
    }
    # written back (campaign.json holds the expanded spec), a spec expands to itself
    assert parse_spec(spec.model_dump(mode="json")) == spec


def test_sweep_errors_name_their_entry_and_line(tmp_path: Path) -> None:
    data = sweep()
    data["sampling"][1]["temprature"] = 1.0
    data["layouts"][1]["data_parallel_size"] = 0
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    lines = spec_file.read_text().splitlines()
    with pytest.raises(SpecError) as bad_file:
        load_spec(spec_file)
    message = str(bad_file.value)
    sampling_line = next(i for i, line in enumerate(lines, 1) if "temprature" in line)
    layout_line = next(i for i, line in enumerate(lines, 1) if "data_parallel_size: 0" in line)
    assert f"{spec_file}:{sampling_line}: sampling[1].temprature: unknown field" in message
    assert f"{spec_file}:{layout_line}: layouts[1].data_parallel_size:" in message

    with pytest.raises(SpecError, match="in layouts or in target, not both"):
        parse_spec(sweep(target={**demo()["target"], "tensor_parallel_size": 4}))
    lonely = demo()
    lonely["variants"].append({"name": "hot", "method": "ngram", "k": 2, "sampling": {"temperature": 0.8}})
    with pytest.raises(SpecError, match="hot have no plain variant with their sampling and layout"):
        parse_spec(lonely)


def test_slurm_asks_for_the_gpus_of_each_layout() -> None:
    from tasks.launch.config import ClusterConfig
    from tasks.launch.slurm_script import with_layout_gpus

    spec = parse_spec(
        sweep(
            sampling={"temperature": 0.0}, layouts=[{"tensor_parallel_size": 2, "data_parallel_size": 2}, {}]
        )
    )
    cluster = ClusterConfig.model_validate({"name": "c", "gpus_per_node": 4})
    gpus = {v.name: with_layout_gpus(cluster, spec.target_of(v)).gpus_per_node for v in spec.variants}
    assert gpus["plain-tp2dp2"] == 4 and gpus["draft-k3-tp2dp2"] == 4
    assert gpus["plain-tp1dp1"] == 4  # a one-GPU target keeps the cluster's own setting
    assert (
        with_layout_gpus(
            ClusterConfig.model_validate({"name": "c"}), spec.target_of(spec.plain)
        ).gpus_per_node
        == 4
    )
