"""The breakdown model on hand-made steps: plain deployments, variable-length drafts (n-gram), and the
errors and warnings for counters that cannot belong to the window."""

from __future__ import annotations

import pytest

from tasks.profile.breakdown import (
    ProfileError,
    Step,
    WindowCounters,
    compute_breakdown,
    parse_step_annotation,
)


def step(index: int, ctx: tuple[int, int], gen: tuple[int, int], **times: float) -> Step:
    return Step(
        index=index,
        t_s=float(index),
        context_requests=ctx[0],
        context_tokens=ctx[1],
        generation_requests=gen[0],
        generation_tokens=gen[1],
        engine_s=times.get("engine", 10.0),
        drafting_s=times.get("drafting", 0.0),
        verification_s=times.get("verification", 0.0),
        rejection_s=times.get("rejection", 0.0),
    )


def test_annotations() -> None:
    assert parse_step_annotation("execute_context_1(13)_generation_2(8)") == (1, 13, 2, 8)
    detailed = "execute_21_context_1(sq13sk13sqsq169sqsk169)_generation_2(sq8sk60sqsq32sqsk240)"
    assert parse_step_annotation(detailed) == (1, 13, 2, 8)
    assert parse_step_annotation("execute_model") is None


def test_plain_deployment_wastes_nothing() -> None:
    steps = [step(0, (2, 10), (0, 0), verification=6.0), step(1, (0, 0), (2, 2), verification=5.0)]
    b = compute_breakdown(steps, WindowCounters(0, 0, 0), k=None, source="t")
    assert b.shares["wasted_share"] == 0.0 and b.added_s == 0.0
    assert b.shares["useful_share"] == pytest.approx(11.0 / 20.0)
    assert b.apportioning == "none" and b.shares["wasted_share_of_added"] is None


def test_variable_length_drafts_skip_the_drafts_check() -> None:
    # n-gram: of two generation requests one found a match (3 drafts), one none: 1 + 3 + 1 = 5 tokens
    steps = [
        step(0, (2, 10), (0, 0), verification=4.0, drafting=1.0),
        step(1, (0, 0), (2, 5), verification=5.0, drafting=1.0, rejection=1.0),
    ]
    counters = WindowCounters(drafts=1, draft_tokens=3, accepted_tokens=1, accepted_per_position=(1, 0, 0))
    b = compute_breakdown(steps, counters, k=3, source="t")
    assert "drafts" not in b.cross_checks and b.cross_checks["draft_tokens"]["ok"]
    # verification of drafted positions: 5 x 3/5 = 3; rejected 2 of 3 -> 2 wasted
    assert b.wasted_verification_s == pytest.approx(2.0)
    # drafting 2.0 spread over 3 positions; slots 2 + 2 = 4; kept 1/4, 0, 0
    assert b.wasted_drafting_s == pytest.approx(2 / 3 * (3 / 4) + 2 / 3 + 2 / 3)
    assert b.apportioning == "uniform"  # no per-pass times in hand-made steps


def test_counters_from_outside_the_window_are_flagged() -> None:
    steps = [step(0, (0, 0), (1, 3), verification=3.0, drafting=1.0)]
    counters = WindowCounters(drafts=5, draft_tokens=10, accepted_tokens=8, accepted_per_position=(5, 3))
    b = compute_breakdown(steps, counters, k=2, source="t")
    assert not b.cross_checks["draft_tokens"]["ok"] and not b.cross_checks["drafts"]["ok"]
    assert any("capped" in n for n in b.notes) and any("disagree" in n for n in b.notes)
    assert 0.0 <= b.wasted_drafting_s <= 1.0


def test_errors() -> None:
    with pytest.raises(ProfileError, match="no engine steps"):
        compute_breakdown([], None, k=2, source="t")
    drafting = [step(0, (1, 4), (0, 0), verification=1.0, drafting=1.0)]
    with pytest.raises(ProfileError, match=r"k \(draft positions\) is unknown"):
        compute_breakdown(drafting, WindowCounters(1, 2, 1), k=None, source="t")
    with pytest.raises(ProfileError, match="3 positions but k is 2"):
        compute_breakdown(drafting, WindowCounters(1, 2, 1, (1, 0, 0)), k=2, source="t")
