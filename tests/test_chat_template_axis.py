"""The chat-template axis and the multilingual stratum (issue 33, item 6).

`sampling.chat_template_kwargs` (experiments/spec.py) goes into every chat request's body as vLLM's
`chat_template_kwargs`; it is part of the setting, so a campaign's `sampling` list sweeps it with a plain
baseline per value, each cell records it, and speedups pair only cells served with the same options. Checked
on the emulator behind the endpoint launcher (it traces what each request carried)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from campaign_support import campaign_rows, emulated_campaign, run_campaign

from experiments.spec import Sampling
from specgauge.errors import SpecError
from specgauge.settings import REPO_ROOT
from workloads.schema import load_corpus

MULTILINGUAL = REPO_ROOT / "workloads" / "multilingual.jsonl"


def test_the_multilingual_corpus_passes_the_workload_schema() -> None:
    corpus = load_corpus(MULTILINGUAL)
    assert corpus.strata == ["multilingual"]
    languages = [p.model_extra["language"] for p in corpus.prompts]
    assert sorted(set(languages)) == ["de", "es", "fr", "it"] and len(languages) == 16
    # non-English, not translated placeholders: each prompt carries letters outside ASCII or its language's words
    assert all(
        any(ord(ch) > 127 for ch in p.messages[0].content) for p in corpus.prompts if p.id.startswith("ml-es")
    )


def test_template_options_are_a_mapping_of_scalars_named_in_the_error(tmp_path: Path) -> None:
    from experiments.spec import load_spec

    spec = yaml.safe_load((REPO_ROOT / "experiments" / "demo.yaml").read_text())
    spec["sampling"] = {"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": {"deep": True}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert (
        "sampling.chat_template_kwargs: enable_thinking: values must be true/false, numbers or strings"
        in str(info.value)
    )
    assert str(path) in str(info.value)


def test_without_template_options_a_sampling_dumps_as_before() -> None:
    """No options: the dump (the spec digest, a cell's recorded sampling and its pairing key) has no new key,
    so campaigns keep their ids and new cells pair with older ones."""
    assert "chat_template_kwargs" not in Sampling().model_dump(mode="json")
    with_options = Sampling(chat_template_kwargs={"enable_thinking": False})
    assert with_options.model_dump(mode="json")["chat_template_kwargs"] == {"enable_thinking": False}
    assert Sampling.model_validate(with_options.model_dump(mode="json")) == with_options
    assert with_options.label == "greedy enable_thinking=false" and hash(with_options) != hash(Sampling())


def test_template_options_reach_the_body_are_recorded_and_pair_within_their_setting(
    prefect_harness: None, home: Path, emulator, tmp_path: Path
) -> None:
    data = emulated_campaign(
        "template-axis",
        emulator.url,
        workloads=[{"file": "workloads/multilingual.jsonl"}],
        load={
            "concurrencies": [1],
            "requests": 2,
            "warmup": 0,
            "allow_short_cells": True,
            "engine_warmup": False,  # the trace counts the cells' requests only
            "request_timeout_s": 30,
        },
        sampling=[
            {"name": "think", "temperature": 0.0, "chat_template_kwargs": {"enable_thinking": True}},
            {"name": "nothink", "temperature": 0.0, "chat_template_kwargs": {"enable_thinking": False}},
        ],
    )
    emulator.trace()  # start from an empty trace
    result = run_campaign(tmp_path / "template-axis.yaml", data, analyze=False)

    carried = [
        t["chat_template_kwargs"] for t in emulator.trace() if t.get("chat_template_kwargs") is not None
    ]
    # 2 variants x 2 requests per setting, each with its setting's options, exactly as written
    assert sorted(json.dumps(c) for c in carried) == sorted(
        [json.dumps({"enable_thinking": True})] * 4 + [json.dumps({"enable_thinking": False})] * 4
    ), carried

    cells = campaign_rows(
        "SELECT variant, workload, json_extract(sampling, '$.chat_template_kwargs.enable_thinking')::BOOLEAN, "
        "sampling_key FROM v_cells WHERE campaign_id = ? ORDER BY variant",
        result["campaign_id"],
    )
    pairs = campaign_rows(
        "SELECT variant, baseline_variant FROM v_speedup WHERE campaign_id = ? ORDER BY variant",
        result["campaign_id"],
    )
    assert [(v, w, t) for v, w, t, _ in cells] == [
        ("ngram-k3-nothink", "multilingual", False),
        ("ngram-k3-think", "multilingual", True),
        ("plain-nothink", "multilingual", False),
        ("plain-think", "multilingual", True),
    ]
    keys = {v: k for v, _, _, k in cells}
    assert keys["plain-think"] != keys["plain-nothink"] and keys["plain-think"] == keys["ngram-k3-think"]
    # each speculative cell against the plain cell served with the same template options, never across them
    assert pairs == [("ngram-k3-nothink", "plain-nothink"), ("ngram-k3-think", "plain-think")]
