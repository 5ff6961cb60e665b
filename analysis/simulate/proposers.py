"""Proposers: what a drafter would propose for a request at position t, as a token tree.

Every proposer answers `tree(request, t, branching, budget, depth)`: at most `budget` draft tokens, at most
`depth` deep, at most `branching` children per node (a chain: branching 1, budget = depth = k).

- `NgramProposer`: vLLM 0.32's prompt lookup, exactly (one candidate, so always a chain).
- `SuffixProposer`: suffix matching over the prompt and the text generated so far, following the most
  frequent continuations (after SuffixDecoding / Arctic Inference; approximate, see its docstring).
- `RankedProposer`: a model drafter (draft model, EAGLE-3 head) whose ranked next-token candidates along the
  reference path were computed offline (analysis.simulate.models), teacher-forced. On the reference path
  that is exactly what the drafter would propose (model_worker's docstring says why); off it the tokens are
  unknown and get ids that match nothing, which is all acceptance needs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from analysis.simulate.replay import Request, TokenTree, unknown_token
from experiments.methods import NGRAM_LOOKUP_MAX, NGRAM_LOOKUP_MIN


class Proposer(Protocol):
    name: str

    def tree(self, request: Request, t: int, branching: int, budget: int, depth: int) -> TokenTree: ...


# --------------------------------------------------------------------------------------------------- n-gram


def ngram_proposal(context: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """vLLM 0.32's prompt lookup (vllm/v1/spec_decode/ngram_proposer.py,
    `_find_longest_matched_ngram_and_propose_tokens`), ported line for line so that ties resolve the same:

    - the n-gram is the LONGEST suffix of the context, of length in [min_n, max_n], that also occurs
      earlier in the context (a KMP longest-prefix-suffix scan over the reversed context);
    - among occurrences of that length it takes the EARLIEST one in the context (`if prev_lps >=
      longest_ngram: position = i`: a later i in the reversed context is an earlier start);
    - it proposes the up to k tokens that follow it: fewer when the occurrence is near the end of the
      context (`k = min(k, total_token - start_position)`), none when nothing of length >= min_n matches,
      and never past max_model_len (`k = min(k, max_model_len - total_token)`).
    The context is the prompt and every output token so far (`token_ids_cpu[:num_tokens_no_spec]`)."""
    total = len(context)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    tokens = list(reversed(context))
    lps = [0] * max_n
    longest, position, prev_lps, i = 0, 0, 0, 1
    while i < total:
        if tokens[prev_lps] == tokens[i]:
            prev_lps += 1
            if prev_lps >= longest:
                longest, position = prev_lps, i
            if i < max_n:
                lps[i] = prev_lps
            if prev_lps == max_n:
                prev_lps = lps[max_n - 1]
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    k = min(k, total - start)
    return list(context[start : start + k])


@dataclass(frozen=True)
class NgramProposer:
    """Prompt lookup with vLLM's parameters (prompt_lookup_min, prompt_lookup_max; k comes from the shape)."""

    min_n: int = NGRAM_LOOKUP_MIN
    max_n: int = NGRAM_LOOKUP_MAX
    max_model_len: int = 2048
    name: str = "ngram"

    def tree(self, request: Request, t: int, branching: int, budget: int, depth: int) -> TokenTree:
        tokens = ngram_proposal(
            request.context(t), self.min_n, self.max_n, min(budget, depth), self.max_model_len
        )
        return TokenTree.from_paths([tokens])


# --------------------------------------------------------------------------------------------------- suffix


@dataclass(frozen=True)
class SuffixProposer:
    """Suffix matching over this request's prompt and output so far (SuffixDecoding's per-request tree).

    At each step: for every suffix length m of the context up to `max_depth` that occurs earlier in the
    context, gather the continuations that follow its occurrences (a frequency tree), then walk it from
    the root taking the most frequent children (top-`branching` per node for a tree), while the path's
    estimated probability (product of child count / parent count) stays at or above `min_token_prob`,
    with at most `max_spec_factor * m` tokens (SuffixDecoding speculates more after longer matches). The
    candidate with the highest score (sum of path probabilities, as SuffixDecoding scores trees) wins; a
    longer match wins ties.

    Approximate: Arctic Inference's suffix trees (what vLLM's `suffix` method runs) also keep a global
    tree of earlier responses and size speculation slightly differently; this proposer does not
    reproduce them exactly, so its figures are a projection, not a mirror (docs/simulate.md)."""

    max_depth: int = 24
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    name: str = "suffix"

    def tree(self, request: Request, t: int, branching: int, budget: int, depth: int) -> TokenTree:
        context = request.context(t)
        best, best_score = TokenTree(), 0.0
        # ends: where earlier occurrences of the context's last m tokens end, narrowed as m grows
        ends = [end for end in range(1, len(context)) if context[end - 1] == context[-1]]
        for m in range(1, min(self.max_depth, len(context) - 1) + 1):
            if m > 1:
                ends = [end for end in ends if end - m >= 0 and context[end - m] == context[-m]]
            if not ends:
                break  # no earlier occurrence of this suffix, so none of any longer one either
            limit = min(depth, budget, int(self.max_spec_factor * m + 1e-9))
            continuations = [tuple(context[end : end + limit]) for end in ends]
            tree, score = self._walk(continuations, branching, budget, limit)
            if score >= best_score and tree.children:
                best, best_score = tree, score
        return best

    def _walk(
        self, continuations: list[tuple[int, ...]], branching: int, budget: int, limit: int
    ) -> tuple[TokenTree, float]:
        """Breadth first from the root: each node's most frequent children (probability >= min_token_prob)."""
        root = TokenTree()
        level: list[tuple[TokenTree, list[tuple[int, ...]], float]] = [(root, continuations, 1.0)]
        used, score = 0, 0.0
        for d in range(limit):
            following: list[tuple[TokenTree, list[tuple[int, ...]], float]] = []
            for node, seqs, prob in level:
                counts = Counter(seq[d] for seq in seqs if len(seq) > d)
                total = sum(counts.values())
                for token, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:branching]:
                    child_prob = prob * count / total
                    if child_prob < self.min_token_prob or used >= budget:
                        continue
                    child = node.children.setdefault(token, TokenTree())
                    used, score = used + 1, score + child_prob
                    following.append((child, [s for s in seqs if len(s) > d and s[d] == token], child_prob))
            level = following
            if not level:
                break
        return root, score


# ------------------------------------------------------------------------------------- model drafters


class RankTable(Protocol):
    """A model drafter's ranked candidates along a request's reference path."""

    def candidates(self, t: int, depth: int) -> Sequence[int] | None:
        """Ranked ids the drafter proposes at `depth` (0-based) of a draft anchored at t, given the
        context prompt + output[:t] + reference[:depth]; None where they were not computed."""
        ...


@dataclass(frozen=True)
class TokenRanks:
    """A drafter whose proposal depends only on the tokens before it (a draft model): ranks[i] = its
    ranked candidates for output token i (then the tail) from prompt + output[:i]."""

    ranks: tuple[tuple[int, ...], ...]

    def candidates(self, t: int, depth: int) -> Sequence[int] | None:
        i = t + depth
        return self.ranks[i] if i < len(self.ranks) and self.ranks[i] else None


@dataclass(frozen=True)
class StepRanks:
    """A drafter whose proposal also depends on its step (EAGLE-3: step 0 reads the target's features,
    later steps its own state): ranks[j][i] = candidates of step j for output token i."""

    ranks: tuple[tuple[tuple[int, ...], ...], ...]

    def candidates(self, t: int, depth: int) -> Sequence[int] | None:
        if depth >= len(self.ranks):
            return None
        i = t + depth
        row = self.ranks[depth]
        return row[i] if i < len(row) and row[i] else None


def ranked_tree(
    table: RankTable, t: int, reference: Sequence[int], branching: int, budget: int, depth: int
) -> TokenTree:
    """The static top-`branching` tree, filled breadth first (children in rank order) until `budget`
    tokens or `depth` levels. A node's children are known when the node lies on the reference path;
    elsewhere they get unknown ids (they cannot be accepted, and they still cost their place)."""
    root = TokenTree()
    level: list[tuple[TokenTree, bool]] = [(root, True)]
    used = 0
    for d in range(depth):
        known = table.candidates(t, d)
        if known is not None and len(known) < branching:
            raise ValueError(f"ranks hold {len(known)} candidates, the tree needs {branching}")
        following: list[tuple[TokenTree, bool]] = []
        for node, on_path in level:
            for rank in range(branching):
                if used >= budget:
                    break
                token = known[rank] if on_path and known is not None else unknown_token()
                child = node.children.setdefault(token, TokenTree())
                used += 1
                following.append((child, on_path and d < len(reference) and token == reference[d]))
        level = following
        if used >= budget or not level:
            break
    return root


@dataclass(frozen=True)
class RankedProposer:
    """A model drafter replayed from its rank tables (one per request)."""

    name: str
    tables: dict[Request, RankTable]

    def tree(self, request: Request, t: int, branching: int, budget: int, depth: int) -> TokenTree:
        table = self.tables.get(request)
        if table is None:
            raise KeyError(f"{self.name}: no ranks computed for request {request.request_id}")
        return ranked_tree(table, t, request.reference(t), branching, budget, depth)
