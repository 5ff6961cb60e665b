"""The offline replay simulator (analysis/simulate) on hand-built token sequences with known answers.

Prompts and outputs here are made-up token ids; every expected figure is worked out by hand in the test.
No model runs: model drafters are given their rank tables directly (tests/test_simulate_models.py runs the
real draft model)."""

from __future__ import annotations

import pytest

from analysis.simulate.proposers import (
    NgramProposer,
    RankedProposer,
    StepRanks,
    TokenRanks,
    ngram_proposal,
    ranked_tree,
)
from analysis.simulate.replay import Counters, Request, TokenTree, replay, replay_request, unknown_token
from analysis.simulate.shapes import Chain, ShapeError, parse_shape, parse_shapes
from analysis.simulate.validate import Validation, validate_capture, validation_frame

PROMPT = (900, 901, 902)


def request(output: list[int], tail: tuple[int, ...] = (), stratum: str = "chat", rid: str = "r0") -> Request:
    return Request(request_id=rid, stratum=stratum, prompt=PROMPT, output=tuple(output), tail=tail)


class Oracle:
    """Proposes the target's own next k tokens (then unknown ids past what it knows): a perfect drafter."""

    name = "oracle"

    def tree(self, req: Request, t: int, branching: int, budget: int, depth: int) -> TokenTree:
        k = min(budget, depth)
        known = list(req.output[t : t + k])
        return TokenTree.from_paths([known + [unknown_token() for _ in range(k - len(known))]])


class AlwaysWrong:
    name = "wrong"

    def tree(self, req: Request, t: int, branching: int, budget: int, depth: int) -> TokenTree:
        return TokenTree.from_paths([[unknown_token() for _ in range(min(budget, depth))]])


def chain(k: int, proposer: str = "p") -> Chain:
    return Chain(proposers=(proposer,), params=(("k", k),))


# ------------------------------------------------------------------------------------------------- replay


def test_a_perfect_proposer_accepts_k_every_step_plus_the_bonus():
    # 13 tokens: the prefill emits 1, then three steps of k=3 accepted + 1 bonus each: t = 1, 5, 9 -> 13.
    c = replay_request(request(list(range(10, 23))), chain(3).drafter({"p": Oracle()}))
    assert (c.steps, c.drafts, c.draft_tokens, c.accepted) == (3, 3, 9, 9)
    assert c.accepted_per_position == [3, 3, 3]
    assert c.mean_acceptance_length == 4.0
    assert c.rate_per_position() == [1.0, 1.0, 1.0]
    assert c.verified_tokens == 12  # (3 drafts + 1) per step
    assert c.tokens_per_step == 4.0  # 12 decode tokens in 3 steps


def test_an_always_wrong_proposer_drafts_every_step_and_accepts_nothing():
    c = replay_request(request(list(range(10, 18))), chain(2).drafter({"p": AlwaysWrong()}))
    # 8 tokens: prefill 1, then one token per step: 7 steps, 7 drafts of 2 tokens, nothing accepted.
    assert (c.steps, c.drafts, c.draft_tokens, c.accepted) == (7, 7, 14, 0)
    assert c.mean_acceptance_length == 1.0
    assert c.rate_per_position() == [0.0, 0.0]


def test_drafts_past_the_end_count_as_rejected_unless_the_tail_is_known():
    # 11 tokens, k=3: t = 1 (accept 3), 5 (accept 3), 9: only output[9:11] is known, so 2 accepted.
    out = list(range(10, 21))
    c = replay_request(request(out), chain(3).drafter({"p": Oracle()}))
    assert (c.drafts, c.draft_tokens, c.accepted) == (3, 9, 8)
    assert c.accepted_per_position == [3, 3, 2]

    # vLLM counts acceptance before the max_tokens cut: with the target's continuation known (the tail),
    # the third draft token at t=9 is checked against tail[0].
    class OracleWithTail(Oracle):
        def tree(self, req, t, branching, budget, depth):
            return TokenTree.from_paths([list(req.reference(t)[:budget])])

    c = replay_request(request(out, tail=(21, 22)), chain(3).drafter({"p": OracleWithTail()}))
    assert (c.drafts, c.accepted) == (3, 9)
    assert c.steps == 3  # the request still ends at 11 tokens: the tail is verified, never emitted


def test_a_step_with_an_empty_proposal_is_not_a_draft():
    class EveryOtherStep:
        name = "odd"

        def tree(self, req, t, branching, budget, depth):
            return TokenTree.from_paths([list(req.output[t : t + 1])] if t % 2 else [[]])

    # 6 tokens: t=1 proposes output[1], accepted (t=3); t=3 likewise (t=5); t=5 likewise (t=7): 3 drafts.
    c = replay_request(request([10, 11, 12, 13, 14, 15]), chain(1).drafter({"p": EveryOtherStep()}))
    assert (c.steps, c.drafts, c.accepted) == (3, 3, 3)

    class Nothing:
        name = "nothing"

        def tree(self, req, t, branching, budget, depth):
            return TokenTree()

    c = replay_request(request([10, 11, 12, 13]), chain(3).drafter({"p": Nothing()}))
    assert (c.steps, c.drafts, c.draft_tokens, c.accepted) == (3, 0, 0, 0)
    assert c.verified_tokens == 3  # each step still computes its one token
    assert c.mean_acceptance_length is None


def test_per_position_counts_with_a_scripted_proposer():
    out = [10, 11, 12, 13, 14, 15, 16]
    answers = {1: [11, 12, -5], 4: [-6, -7, -8], 5: [15, -9, -10]}

    class Scripted:
        name = "scripted"

        def tree(self, req, t, branching, budget, depth):
            return TokenTree.from_paths([answers[t]])

    # t=1: [11,12] accepted (2) -> t=4: nothing (0) -> t=5: [15] accepted (1) -> t=7 = len: done.
    c = replay_request(request(out), chain(3).drafter({"p": Scripted()}))
    assert (c.drafts, c.draft_tokens, c.accepted) == (3, 9, 3)
    assert c.accepted_per_position == [2, 1]
    assert c.rate_per_position() == [2 / 3, 1 / 3, 0.0]
    assert c.mean_acceptance_length == pytest.approx(2.0)
    assert c.acceptance_rate == pytest.approx(3 / 9)


def test_results_split_by_stratum_and_total_as_a_frame():
    reqs = [
        request(list(range(10, 23)), stratum="code", rid="a"),
        request(list(range(30, 38)), stratum="chat", rid="b"),
    ]

    class OracleOnCode(Oracle):
        def tree(self, req, t, branching, budget, depth):
            return (
                super().tree(req, t, branching, budget, depth)
                if req.stratum == "code"
                else AlwaysWrong().tree(req, t, branching, budget, depth)
            )

    result = replay(reqs, chain(3).drafter({"p": OracleOnCode()}), "chain:k=3@p")
    frame = result.rows()
    by = {row["stratum"]: row for row in frame.iter_rows(named=True)}
    assert set(by) == {"chat", "code", "all"}
    assert by["code"]["mean_acceptance_length"] == 4.0
    assert by["chat"]["mean_acceptance_length"] == 1.0
    assert by["all"]["drafts"] == 3 + 7 and by["all"]["accepted_tokens"] == 9
    assert by["all"]["mean_acceptance_length"] == pytest.approx(1 + 9 / 10)
    assert by["code"]["verified_tokens_per_step"] == 4.0


def test_counters_add_up():
    a, b = Counters(), Counters()
    a.observe(3, 2)
    b.observe(3, 3)
    b.observe(0, 0)
    a.add(b)
    assert (a.steps, a.drafts, a.draft_tokens, a.accepted) == (3, 2, 6, 5)
    assert a.accepted_per_position == [2, 2, 1]


# ------------------------------------------------------------------------------------------------- n-gram


def test_ngram_takes_the_earliest_occurrence_of_the_longest_match():
    # The suffix [2, 3] occurs at index 1 (followed by 9, 5, 2) and at index 5 (followed by 7, 8, 2).
    # vLLM takes the earliest: [9, 5, 2]; a latest-occurrence rule would give [7, 8, 2].
    context = [1, 2, 3, 9, 5, 2, 3, 7, 8, 2, 3]
    assert ngram_proposal(context, 1, 4, 3, 2048) == [9, 5, 2]


def test_ngram_prefers_the_longest_match_over_an_earlier_shorter_one():
    # [1, 4, 3] occurs at index 3 (followed by 8); its suffix [4, 3] also occurs earlier, at 0 (followed
    # by 7). Longest first: [8, 1, 4]. Capped at max_n = 2, the earliest [4, 3] wins: [7, 1, 4].
    context = [4, 3, 7, 1, 4, 3, 8, 1, 4, 3]
    assert ngram_proposal(context, 1, 4, 3, 2048) == [8, 1, 4]
    assert ngram_proposal(context, 1, 2, 3, 2048) == [7, 1, 4]


def test_ngram_proposes_fewer_near_the_end_and_nothing_below_min_n():
    assert ngram_proposal([5, 6, 5], 1, 4, 3, 2048) == [6, 5]  # only two tokens follow the match
    assert ngram_proposal([5, 6, 7], 1, 4, 3, 2048) == []  # 7 never occurred before
    assert ngram_proposal([1, 2, 9, 2], 2, 4, 3, 2048) == []  # only a 1-gram matches; min_n is 2
    assert ngram_proposal([5, 6, 5], 1, 4, 3, 4) == [6]  # max_model_len 4 leaves room for one


def test_ngram_replay_counts_short_drafts_as_their_length():
    # prompt 900 901 902, output 7 8 7 8 7 8.
    proposer = NgramProposer(1, 4, 2048)
    c = replay_request(request([7, 8, 7, 8, 7, 8]), chain(3, "ngram").drafter({"ngram": proposer}), depth=3)
    # t=1: context ends in 7, never seen before: no draft, the step emits 1 token. t=2: 8, the same.
    # t=3: ends [7, 8, 7]: [7] occurred at prompt+0 followed by only two tokens: [8, 7], both accepted
    # (output[3:5]), plus the bonus -> t=6: done. 3 steps, 1 draft of 2 tokens.
    assert (c.steps, c.drafts, c.draft_tokens, c.accepted) == (3, 1, 2, 2)
    assert c.rate_per_position() == [1.0, 1.0, 0.0]


# ------------------------------------------------------------------------------------------- trees, shapes


def ranks_proposer(ranks: list[tuple[int, ...]], req: Request) -> RankedProposer:
    """A model drafter whose candidates for output token i of `req` are ranks[i]."""
    return RankedProposer("m", {req: TokenRanks(tuple(ranks))})


def test_a_tree_finds_the_second_choice_a_chain_misses():
    out = [10, 11, 12, 13, 14, 15]
    # the model's favourite for output[1] is 99; 11 is its second choice; after that it is right
    ranks = [(10, 98), (99, 11), (12, 97), (13, 96), (14, 95), (15, 94), (16, 93)]
    proposers = {"m": ranks_proposer(ranks, request(out))}
    as_chain = replay_request(
        request(out), parse_shape("chain:k=2@draft")[0].drafter({"draft": proposers["m"]})
    )
    # chain, t=1: [99, ...] rejected -> t=2: [12, 13] both right -> t=5: [15, ?] 1 accepted -> done
    assert (as_chain.drafts, as_chain.accepted) == (3, 3)
    tree = parse_shape("tree:b=2:budget=6:depth=2@draft")[0]
    c = replay_request(request(out), tree.drafter({"draft": proposers["m"]}))
    # t=1: the second branch [11, 12] matches: 2 accepted -> t=4: [14, 15]: 2 -> t=7: done
    assert (c.drafts, c.accepted) == (2, 4)
    assert c.draft_tokens == 2 * 6  # 2 + 4 nodes per step: the budget is the verified width


def test_the_tree_budget_fills_breadth_first():
    table = TokenRanks(((0, 0), (5, 6), (7, 8), (9, 10)))
    # b=2, budget=3: depth 1 holds 5 and 6, depth 2 only the first child of 5 (7)
    tree = ranked_tree(table, 1, [5, 7, 9], 2, 3, 3)
    assert tree.size() == 3
    assert tree.match([5, 7, 9]) == 2
    assert tree.match([6, 7]) == 1  # 6's children are past the budget
    # the same tree when the reference goes through the second child at depth 1: children unknown
    tree = ranked_tree(table, 1, [6, 7], 2, 3, 3)
    assert tree.match([6, 7]) == 1


def test_eagle_ranks_depend_on_the_step():
    # step 0 predicts output[i] as 20 + i, step 1 predicts it as 40 + i (wrong)
    ranks = StepRanks((tuple((20 + i,) for i in range(6)), tuple((40 + i,) for i in range(6))))
    out = [20, 21, 22, 23, 24, 25]
    c = replay_request(
        request(out), chain(2, "eagle3").drafter({"eagle3": RankedProposer("e", {request(out): ranks})})
    )
    # every step: step 0 right, step 1 wrong -> 1 accepted, emit 2: t = 1, 3, 5 -> 3 drafts, 3 accepted
    assert (c.drafts, c.accepted, c.accepted_per_position) == (3, 3, [3])


def test_union_finds_what_only_the_second_drafter_had():
    out = [10, 11, 12, 13, 14, 15, 16]
    prompt_repeat = Request("r0", "code", (10, 11, 12, 13, 14, 15, 16, 17, 1), tuple(out))
    wrong = ranks_proposer([(90 + i,) for i in range(8)], prompt_repeat)
    proposers = {"draft": wrong, "ngram": NgramProposer(1, 4, 2048)}
    only_draft = replay_request(prompt_repeat, parse_shape("chain:k=3@draft")[0].drafter(proposers))
    assert only_draft.accepted == 0
    union = parse_shape("union:k=3@draft+ngram")[0]
    c = replay_request(prompt_repeat, union.drafter(proposers))
    # the n-gram finds the prompt's copy: t=1, the context ends [1, 10]: [10] occurs at 0 -> [11, 12, 13],
    # all accepted -> t=5: it ends [11, 12, 13, 14] (max_n=4), at 1 -> [15, 16, 17]: 15, 16 accepted, the
    # output ends -> done
    assert (c.drafts, c.accepted) == (2, 5)
    assert c.draft_tokens == 2 * 6  # two chains of 3 that share no node


def test_graft_unites_a_tree_with_a_chain_and_merges_shared_nodes():
    out = [10, 11, 12, 13, 14, 15, 16]
    prompt_repeat = Request("r0", "code", (10, 11, 12, 13, 14, 15, 16, 17, 1), tuple(out))
    ranks = [(90 + i, 91 + i) for i in range(9)]  # the model is always wrong, even as a second choice
    proposers = {"draft": ranks_proposer(ranks, prompt_repeat), "ngram": NgramProposer(1, 4, 2048)}
    tree = parse_shape("tree:b=2:budget=4@draft")[0]
    assert replay_request(prompt_repeat, tree.drafter(proposers)).accepted == 0
    graft = parse_shape("graft:b=2:budget=4:k=3@draft+ngram")[0]
    c = replay_request(prompt_repeat, graft.drafter(proposers))
    assert (c.drafts, c.accepted) == (2, 5)  # the n-gram's chains, as in the union test
    assert c.draft_tokens == 2 * (4 + 3)
    # a chain united with itself is verified once
    same = TokenTree.from_paths([[1, 2, 3]])
    same.merge(TokenTree.from_paths([[1, 2, 3]]))
    assert same.size() == 3
    forked = TokenTree.from_paths([[1, 2, 3]])
    forked.merge(TokenTree.from_paths([[1, 5, 6]]))
    assert forked.size() == 5 and forked.match([1, 5, 6, 7]) == 3


# ---------------------------------------------------------------------------------------------- parsing


def test_shapes_parse_and_expand_over_proposers():
    shapes = parse_shapes("chain:k=3,tree:budget=8:b=2,union:k=2@draft+eagle3", ["ngram", "draft"])
    assert [s.label for s in shapes] == [
        "chain:k=3@ngram",
        "chain:k=3@draft",
        "tree:b=2:budget=8@ngram",
        "tree:b=2:budget=8@draft",
        "union:k=2@draft+eagle3",
    ]
    assert shapes[3].max_branching == 2 and shapes[3].max_depth == 8


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("star:k=3@draft", "unknown kind 'star'"),
        ("chain@draft", "missing: k"),
        ("chain:k=3:b=2@draft", "unknown: b"),
        ("chain:k=zero@draft", "'k=zero' is not key=N"),
        ("union:k=3@draft", "takes 2 proposer(s)"),
        ("union:k=3", "needs two proposers"),
        ("chain:k=3@medusa", "got medusa"),
    ],
)
def test_bad_shapes_say_what_is_wrong(text, says):
    with pytest.raises(ShapeError, match=None) as info:
        parse_shapes(text, ["ngram"])
    assert says in str(info.value)


def test_a_shape_names_a_proposer_that_is_not_available():
    with pytest.raises(ShapeError, match="eagle3 not available"):
        parse_shape("chain:k=3@eagle3")[0].drafter({"ngram": NgramProposer()})


# ------------------------------------------------------------------------------------------- validation


def test_validation_compares_served_counters_with_the_replay(tmp_path):
    from analysis.simulate.captures import CaptureInput
    from artifacts.documents.captures import Capture

    out = [7, 8, 7, 8, 7, 8]
    served = {
        "drafts": 1,
        "draft_tokens": 2,
        "accepted_tokens": 2,
        "mean_acceptance_length": 3.0,
        "acceptance_rate_per_position": {"0": 1.0, "1": 1.0, "2": 0.0},
    }
    meta = {
        "capture_id": "ngram-k3.r0",
        "variant": {
            "name": "ngram-k3",
            "method": "ngram",
            "k": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 4,
        },
        "speculation": served,
    }
    item = CaptureInput(
        capture=Capture(path=tmp_path, meta=meta, outputs=()), requests=(request(out),), target_dir=tmp_path
    )
    from analysis.simulate.run import DrafterSettings

    v = validate_capture(item, DrafterSettings.from_campaign([item]))
    assert isinstance(v, Validation)
    # the replay of test_ngram_replay_counts_short_drafts_as_their_length: 1 draft of 2 tokens, 2 accepted
    assert v.simulated.mean_acceptance_length == 3.0 and v.relative_error == 0.0
    row = validation_frame([v]).row(0, named=True)
    assert row["within_target"] is True
    assert row["simulated_per_position"] == row["served_per_position"] == [1.0, 1.0, 0.0]
    # a served figure 10% higher is outside the 5% target
    item2 = CaptureInput(
        capture=Capture(
            path=tmp_path, meta={**meta, "speculation": {**served, "mean_acceptance_length": 3.3}}, outputs=()
        ),
        requests=(request(out),),
        target_dir=tmp_path,
    )
    v2 = validate_capture(item2, DrafterSettings.from_campaign([item2]))
    assert v2.relative_error == pytest.approx(3.0 / 3.3 - 1)
    assert validation_frame([v2]).row(0, named=True)["within_target"] is False


# -------------------------------------------------------------------------------------------------- suffix


def test_suffix_follows_the_most_frequent_continuation():
    from analysis.simulate.proposers import SuffixProposer

    # after 5 the context continued with 1 twice and with 2 once: the chain proposes 1, then what followed
    # "5 1" (both times 5). A match of length m allows max_spec_factor * m tokens: one by default, two at 2.
    req = Request("r0", "chat", (5, 1, 5, 1, 5, 2, 8), (5,))
    assert SuffixProposer().tree(req, 1, 1, 2, 2).paths() == [(1,)]
    proposer = SuffixProposer(max_spec_factor=2.0)
    assert proposer.tree(req, 1, 1, 2, 2).paths() == [(1, 5)]
    # a tree of branching 2 holds the second continuation too
    assert sorted(proposer.tree(req, 1, 2, 3, 1).paths()) == [(1,), (2,)]
    # a longer match is followed when it scores at least as well: "2 8 5" occurred nowhere, "8 5" neither
    assert proposer.tree(Request("r0", "chat", (7, 9), (3,)), 1, 1, 3, 3).paths() == [()]


# ---------------------------------------------------------------------------------------------------- CLI


def test_the_command_names_what_is_wrong(tmp_path):
    from typer.testing import CliRunner

    from cli.app import app

    (tmp_path / "campaign" / "captures").mkdir(parents=True)
    runner = CliRunner()
    cases = {
        "no captures": ([str(tmp_path / "campaign")], "no complete captures"),
        "no campaign": ([str(tmp_path / "nowhere")], "not a raw campaign folder"),
        "unknown shape": ([str(tmp_path / "campaign"), "--shapes", "star:k=3"], "unknown kind 'star'"),
        "unknown proposer": ([str(tmp_path / "campaign"), "--proposers", "medusa"], "unknown medusa"),
        "nothing to do": ([str(tmp_path / "campaign"), "--no-validate"], "nothing to do"),
    }
    for name, (args, says) in cases.items():
        done = runner.invoke(app, ["simulate", *args])
        assert done.exit_code == 2, (name, done.output)
        assert done.stderr.startswith("error: ") and says in done.stderr, (name, done.stderr)
