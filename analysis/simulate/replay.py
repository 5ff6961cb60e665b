"""Greedy verification, replayed offline over a target's captured greedy outputs.

A request's output is what the target produced greedily; with greedy verification speculation never
changes it, only how many steps it takes. So a step at position t (t output tokens exist) is fully
determined: the proposer sees prompt + output[:t] and proposes a token tree (a chain is a tree of one
branch); the target accepts the longest path of the tree that equals output[t:], and the step emits the
accepted tokens plus one of its own (the bonus token, or the correction at the first mismatch).

Counting mirrors vLLM 0.32's counters (vllm/v1/core/sched/scheduler.py, update_from_output and
make_spec_decoding_stats; vllm/v1/spec_decode/metrics.py, SpecDecodingStats.observe_draft):
- the prefill step emits output[0] with no draft; the drafter proposes right after it, so the first
  draft is verified at t = 1 (scheduler.update_draft_token_ids drops drafts only for prefill chunks);
- a step whose proposal is empty is not a draft: `if scheduled_spec_token_ids and ...` skips it
  (scheduler.py, update_from_output) and `make_spec_decoding_stats` returns early when
  `not num_draft_tokens`; the step still emits one token;
- drafts are not cut to the tokens left before max_tokens: the scheduler schedules every proposed token
  (only max_model_len trims them), and accepted = len(sampled ids) - 1 is counted before the stop check
  cuts the output (scheduler.py: `num_accepted = max(len(generated_token_ids) - num_sampled, 0)` comes
  before `_update_request_with_output`). So the last step of a request may accept tokens past the end of
  the captured output; `Request.tail` holds the target's continuation there when it is known (otherwise
  a draft token past the end counts as rejected, which undercounts slightly; docs/simulate.md);
- accepted at position i counts the drafts whose first i+1 tokens were all accepted (observe_draft).
Mean acceptance length = 1 + accepted / drafts, per-position rate = accepted at i / drafts, acceptance
rate = accepted / draft tokens, exactly as vLLM and specgauge's metrics contract define them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import polars as pl

# Tokens the simulator cannot know (what a drafter would propose off the reference path, where only the
# reference path was computed) get a unique negative id: never equal to a real token, so they never
# match the output and never merge with another tree's node when trees are united.
_unknown_ids = itertools.count(-1, -1)


def unknown_token() -> int:
    return next(_unknown_ids)


@dataclass(frozen=True)
class Request:
    """One captured request: prompt ids (chat template applied), the target's greedy output ids, its stratum,
    and `tail`: what the target would produce after the output (for the last step's verification; empty if
    unknown)."""

    request_id: str
    stratum: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    tail: tuple[int, ...] = ()

    def context(self, t: int) -> tuple[int, ...]:
        """What a proposer sees at step position t: the prompt and the first t output tokens."""
        return self.prompt + self.output[:t]

    def reference(self, t: int) -> tuple[int, ...]:
        """What the target verifies drafts against at position t: the rest of the output, then the tail."""
        return self.output[t:] + self.tail


class TokenTree:
    """A prefix tree of draft tokens (a chain is one branch). Node count = draft tokens verified."""

    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: dict[int, TokenTree] = {}

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> TokenTree:
        tree = cls()
        for path in paths:
            tree.add(path)
        return tree

    def add(self, path: Sequence[int]) -> TokenTree:
        """Add a path from the root; returns the node at its end."""
        node = self
        for token in path:
            node = node.children.setdefault(token, TokenTree())
        return node

    def merge(self, other: TokenTree) -> None:
        """Union in place: paths both trees hold become one (verified once)."""
        for token, child in other.children.items():
            mine = self.children.get(token)
            if mine is None:
                self.children[token] = child.copy()
            else:
                mine.merge(child)

    def copy(self) -> TokenTree:
        tree = TokenTree()
        tree.children = {token: child.copy() for token, child in self.children.items()}
        return tree

    def size(self) -> int:
        return sum(1 + child.size() for child in self.children.values())

    def depth(self) -> int:
        return max((1 + child.depth() for child in self.children.values()), default=0)

    def match(self, reference: Sequence[int]) -> int:
        """Accepted length: the longest path from the root that equals reference[:len(path)]."""
        node, accepted = self, 0
        for token in reference:
            node = node.children.get(token)  # type: ignore[assignment]
            if node is None:
                break
            accepted += 1
        return accepted

    def paths(self) -> list[tuple[int, ...]]:
        """Root-to-leaf paths (for tests and printing)."""
        if not self.children:
            return [()]
        return [(token, *rest) for token, child in self.children.items() for rest in child.paths()]


# Anything that gives the step's draft tree for a request at position t.
Drafter = Callable[[Request, int], TokenTree]


@dataclass
class Counters:
    """vLLM's speculation counters, plus what the cost model needs: steps and tokens verified."""

    depth: int = 0  # positions tracked (the longest draft seen)
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    steps: int = 0  # decode steps after the prefill, drafted or not
    verified_tokens: int = 0  # tokens the target computes over those steps: draft tokens + 1 per step
    output_tokens: int = 0

    def observe(self, draft_size: int, accepted: int) -> None:
        self.steps += 1
        self.verified_tokens += draft_size + 1
        if draft_size == 0:
            return  # not a draft (see the module docstring)
        self.drafts += 1
        self.draft_tokens += draft_size
        self.accepted += accepted
        while len(self.accepted_per_position) < accepted:
            self.accepted_per_position.append(0)
        for position in range(accepted):
            self.accepted_per_position[position] += 1

    def add(self, other: Counters) -> None:
        self.depth = max(self.depth, other.depth)
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        self.steps += other.steps
        self.verified_tokens += other.verified_tokens
        self.output_tokens += other.output_tokens
        for position, count in enumerate(other.accepted_per_position):
            if position < len(self.accepted_per_position):
                self.accepted_per_position[position] += count
            else:
                self.accepted_per_position.append(count)

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    def rate_per_position(self) -> list[float]:
        """Accepted at position i / drafts, for i < depth (zeros where nothing reached that far)."""
        if not self.drafts:
            return []
        width = max(self.depth, len(self.accepted_per_position))
        counts = self.accepted_per_position + [0] * (width - len(self.accepted_per_position))
        return [count / self.drafts for count in counts]

    @property
    def tokens_per_step(self) -> float | None:
        """Output tokens per decode step (the prefill's token excluded): the speedup's numerator."""
        return (self.output_tokens - 1) / self.steps if self.steps else None

    @property
    def verified_per_step(self) -> float | None:
        return self.verified_tokens / self.steps if self.steps else None


def replay_request(request: Request, drafter: Drafter, depth: int = 0) -> Counters:
    """Step through one request's output as greedy verification does (see the module docstring).
    `depth`: the positions to report (a chain's k) even where no draft reached them."""
    counters = Counters(depth=depth, output_tokens=len(request.output))
    t = 1  # the prefill step produced output[0]; drafting starts after it
    while t < len(request.output):
        tree = drafter(request, t)
        accepted = tree.match(request.reference(t))
        counters.depth = max(counters.depth, tree.depth())
        counters.observe(tree.size(), accepted)
        t += accepted + 1
    return counters


@dataclass(frozen=True)
class ReplayResult:
    """Counters of one drafting configuration per request, with each request's stratum."""

    config: str
    per_request: tuple[tuple[Request, Counters], ...]

    def total(self, stratum: str | None = None) -> Counters:
        total = Counters()
        for request, counters in self.per_request:
            if stratum is None or request.stratum == stratum:
                total.add(counters)
        return total

    @property
    def strata(self) -> list[str]:
        return sorted({request.stratum for request, _ in self.per_request})

    def rows(self) -> pl.DataFrame:
        """One row per stratum and one for all ("all"): the counters and what they give."""
        rows = []
        for stratum in [*self.strata, None]:
            c = self.total(stratum)
            rows.append(
                {
                    "config": self.config,
                    "stratum": stratum or "all",
                    "requests": sum(
                        1 for r, _ in self.per_request if stratum is None or r.stratum == stratum
                    ),
                    "drafts": c.drafts,
                    "draft_tokens": c.draft_tokens,
                    "accepted_tokens": c.accepted,
                    "mean_acceptance_length": c.mean_acceptance_length,
                    "acceptance_rate": c.acceptance_rate,
                    "acceptance_rate_per_position": c.rate_per_position(),
                    "steps": c.steps,
                    "output_tokens": c.output_tokens,
                    "tokens_per_step": c.tokens_per_step,
                    "verified_tokens_per_step": c.verified_per_step,
                }
            )
        return pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")


RESULT_SCHEMA = {
    "config": pl.String,
    "stratum": pl.String,
    "requests": pl.Int64,
    "drafts": pl.Int64,
    "draft_tokens": pl.Int64,
    "accepted_tokens": pl.Int64,
    "mean_acceptance_length": pl.Float64,
    "acceptance_rate": pl.Float64,
    "acceptance_rate_per_position": pl.List(pl.Float64),
    "steps": pl.Int64,
    "output_tokens": pl.Int64,
    "tokens_per_step": pl.Float64,
    "verified_tokens_per_step": pl.Float64,
}


def replay(requests: Sequence[Request], drafter: Drafter, config: str, depth: int = 0) -> ReplayResult:
    """Replay every request; `config` names the drafting configuration in the result's rows."""
    return ReplayResult(
        config, tuple((request, replay_request(request, drafter, depth)) for request in requests)
    )
