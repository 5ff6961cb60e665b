"""Prompt-length buckets (issue 33, item 3): the long-context summarization material cut into prompts whose
length falls in given token ranges, so that acceptance and speedup can be read against context length.

A bucket spec (`BucketSpec`) gives the bucket edges in tokens: edges [e0, e1, ..., en] make the half-open
buckets [e0, e1), ..., [e(n-1), en). Every prompt of bucket [lo, hi) becomes stratum `<stratum>-len-<lo>`
(lo zero-padded to four digits, e.g. `summarization-len-0512`), so every per-stratum figure of a campaign
(cells, speedups, acceptance, the simulator's replay) is per bucket with no other change, and carries the
extra fields `length_bucket` ([lo, hi]) and `prompt_tokens`. Lengths are counted as the server counts a
chat request's `prompt_tokens`: the target's chat template applied (`add_generation_prompt=True`) by the
target's own tokenizer, through `transformers` in a worker process (workloads/token_count_worker.py) run by
a Python that has it (this one, else the engine's: SPECGAUGE_ENGINE_PYTHON). The last edge plus max_tokens
must fit the model's context (max_model_len), so no answer is cut.

The material is what workloads/build_corpora.py draws summarization prompts from: the standard-library
modules held out of the tiny models' training (models/train.py), so prompts are in-domain but not memorised.
Each prompt is a token window of one module (at a seeded offset) in one of train.py's summary requests,
sized to a target length spread evenly inside its bucket, then counted again until it lands there. The
result is checked before it is written (`check_rows`): every prompt within its bucket and within the
context. Deterministic for one stdlib, tokenizer and seed.

    .venv/bin/specgauge workloads length-buckets workloads/length-buckets.jsonl   # the committed corpus
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specgauge.errors import InputError, WorkloadError
from specgauge.names import safe_name_problem
from specgauge.settings import REPO_ROOT
from specgauge.worker_python import python_with

WORKER = Path(__file__).resolve().parent / "token_count_worker.py"
BUCKET_PATTERN = re.compile(r"^(?P<base>.+)-len-(?P<low>\d{4,})$")
MIN_SOURCE_TOKENS = 16  # a window shorter than this is not code to summarize
FIT_ROUNDS = 8  # re-count and resize rounds before a prompt that will not land in its bucket is an error
MAX_BUCKET_PROMPTS = 1000


def bucket_stratum(base: str, low: int) -> str:
    """The stratum name of the bucket whose lower edge is `low` tokens, e.g. `summarization-len-0512`."""
    return f"{base}-len-{low:04d}"


def parse_bucket_stratum(stratum: str) -> tuple[str, int] | None:
    """(base stratum, lower edge in tokens) of a bucket's stratum name; None for any other stratum."""
    match = BUCKET_PATTERN.match(stratum)
    return (match["base"], int(match["low"])) if match else None


def default_edges(max_model_len: int, max_tokens: int) -> tuple[int, ...]:
    """Doubling edges from 128 tokens up to the model's limit (max_model_len - max_tokens): what fits."""
    limit = max_model_len - max_tokens
    edges = [e for e in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072) if e < limit]
    return (*edges, limit)


class BucketSpec(BaseModel):
    """What `build` makes. A bad field is an InputError naming it (`parse_bucket_spec`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edges: tuple[int, ...] = Field(
        description="Bucket edges in prompt tokens, increasing: n+1 edges, n buckets."
    )
    per_bucket: int = Field(default=8, gt=0, le=MAX_BUCKET_PROMPTS, description="Prompts per bucket.")
    max_model_len: int = Field(default=2048, gt=0, description="The served model's context (tokens).")
    max_tokens: int = Field(default=64, gt=0, description="Each prompt's max_tokens.")
    stratum: str = Field(default="summarization", description="Base of the buckets' stratum names.")
    model: str = Field(default="models/tiny-target", description="The target whose tokenizer counts tokens.")
    seed: int = 0

    @field_validator("stratum")
    @classmethod
    def safe_stratum(cls, value: str) -> str:
        problem = safe_name_problem(bucket_stratum(value, 0), "stratum")  # the longest name it will give
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def edges_fit(self) -> BucketSpec:
        if len(self.edges) < 2:
            raise ValueError("edges: give at least two edges (one bucket is [edges[0], edges[1]))")
        for before, after in zip(self.edges, self.edges[1:], strict=False):
            if after <= before:
                raise ValueError(f"edges: must increase, got {after} after {before}")
        if self.edges[0] <= 0:
            raise ValueError(f"edges: the first edge must be positive, got {self.edges[0]}")
        if self.edges[-1] + self.max_tokens > self.max_model_len:
            raise ValueError(
                f"edges: the last edge {self.edges[-1]} plus max_tokens {self.max_tokens} exceeds max_model_len "
                f"{self.max_model_len}: the longest prompts' answers would be cut (at most "
                f"{self.max_model_len - self.max_tokens})"
            )
        return self

    @property
    def buckets(self) -> list[tuple[int, int]]:
        return list(zip(self.edges, self.edges[1:], strict=False))


def parse_bucket_spec(data: dict[str, Any], source: str = "length buckets") -> BucketSpec:
    """A BucketSpec from plain data, or an InputError whose every line names the field (`SOURCE: FIELD: why`)."""
    try:
        return BucketSpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            # a whole-spec check names its field in its message ("edges: ...")
            lines.append(f"{source}: {field}: {message}" if field else f"{source}: {message}")
        raise InputError("; ".join(lines)) from None


# ------------------------------------------------------------------------------------ the tokenizer worker


def worker_python() -> Path:
    """A Python with `transformers`: this one, else the engine's (SPECGAUGE_ENGINE_PYTHON)."""
    return python_with(("transformers",), InputError, purpose=" to count tokens")


class TokenCounter:
    """The target's tokenizer in one worker process for the whole build (its start is most of the cost)."""

    def __init__(self, model_dir: Path) -> None:
        if (
            not (model_dir / "tokenizer_config.json").is_file()
            and not (model_dir / "tokenizer.json").is_file()
        ):
            raise InputError(f"model: {model_dir} has no tokenizer (tokenizer.json / tokenizer_config.json)")
        self._process = subprocess.Popen(
            [str(worker_python()), str(WORKER), str(model_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> TokenCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._process.stdin:
            self._process.stdin.close()
        self._process.wait(timeout=30)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin and self._process.stdout
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            err = self._process.stderr.read() if self._process.stderr else ""
            raise InputError(f"the tokenizer worker ({WORKER.name}) ended: {err.strip()[-1000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise InputError(f"the tokenizer worker refused {request['op']}: {reply['error']}")
        return reply

    def count(self, conversations: Sequence[list[dict[str, str]]]) -> list[int]:
        """Prompt tokens of each conversation, as the server counts a chat request's."""
        return (
            self._ask({"op": "count", "conversations": list(conversations)})["counts"]
            if conversations
            else []
        )

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self._ask({"op": "encode", "texts": list(texts)})["ids"] if texts else []

    def decode(self, ids: Sequence[list[int]]) -> list[str]:
        return self._ask({"op": "decode", "ids": list(ids)})["texts"] if ids else []


# ------------------------------------------------------------------------------------------------ building


def long_context_material(stdlib: Path | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """((path, source) of the held-out stdlib modules, the summary request templates): build_corpora's
    summarization material, so the buckets and the smoke corpus's summarization stratum are one kind."""
    from workloads import build_corpora

    stdlib = stdlib or Path(sysconfig.get_paths()["stdlib"])
    # The codec tables of encodings/ are data (one table repeated), not code: prompt lookup would find its
    # drafts in them at any length, and the curve would show the tables, not the context length.
    modules = [
        (rel, src) for rel, src in build_corpora.held_out_modules(stdlib) if not rel.startswith("encodings/")
    ]
    return modules, list(build_corpora.train.SUMMARY_REQUESTS)


@dataclass
class _Draft:
    """One prompt being sized: its bucket, its target length, its source window and template."""

    low: int
    high: int
    target: int
    source: str
    ids: list[int]
    start: int
    template: str
    window: int = 0
    text: str = ""
    count: int = 0

    def message(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.template.format(code=self.text)}]


def _drafts(
    spec: BucketSpec, encoded: list[tuple[str, list[int]]], templates: list[str], rng: random.Random
) -> list[_Draft]:
    """One draft per prompt: targets spread evenly inside each bucket, each on a module long enough for it,
    modules taken in a seeded order (a bucket's prompts come from different modules while there are enough)."""
    drafts = []
    for low, high in spec.buckets:
        long_enough = [(rel, ids) for rel, ids in encoded if len(ids) >= high]
        if not long_enough:
            raise InputError(
                f"edges: no module of the long-context material has {high} tokens: lower the last edge"
            )
        rng.shuffle(long_enough)
        for i in range(spec.per_bucket):
            target = low + int((high - low) * (i + 0.5) / spec.per_bucket)
            rel, ids = long_enough[i % len(long_enough)]
            start = rng.randrange(0, len(ids) - target + 1)
            drafts.append(_Draft(low, high, target, rel, ids, start, rng.choice(templates)))
    return drafts


def _fit(drafts: list[_Draft], tokens: TokenCounter) -> None:
    """Resize every draft's window until its counted prompt lands in its bucket (near its target)."""
    overheads = tokens.count([[{"role": "user", "content": d.template.format(code="")}] for d in drafts])
    for draft, overhead in zip(drafts, overheads, strict=True):
        draft.window = draft.target - overhead
        if draft.window < MIN_SOURCE_TOKENS:
            raise InputError(
                f"edges: bucket [{draft.low}, {draft.high}) leaves {draft.window} tokens of code after the "
                f"request's own {overhead}: raise the first edge above {overhead + MIN_SOURCE_TOKENS}"
            )
    pending = list(drafts)
    for _ in range(FIT_ROUNDS):
        if not pending:
            return
        texts = tokens.decode([d.ids[d.start : d.start + d.window] for d in pending])
        for draft, text in zip(pending, texts, strict=True):
            draft.text = text
        counts = tokens.count([d.message() for d in pending])
        still = []
        for draft, count in zip(pending, counts, strict=True):
            draft.count = count
            # decoding then re-encoding a window can merge tokens at its edges: near the target is enough
            if not draft.low <= count < draft.high or abs(count - draft.target) > max(2, draft.target // 50):
                draft.window = max(MIN_SOURCE_TOKENS, draft.window + draft.target - count)
                draft.start = min(draft.start, max(0, len(draft.ids) - draft.window))
                still.append(draft)
        pending = still
    missed = [d for d in pending if not d.low <= d.count < d.high]
    if missed:
        d = missed[0]
        raise InputError(
            f"{len(missed)} prompt(s) did not land in their bucket after {FIT_ROUNDS} rounds, e.g. "
            f"{d.source}@{d.start}: {d.count} tokens for [{d.low}, {d.high}): widen the buckets"
        )


def build_rows(
    spec: BucketSpec, tokens: TokenCounter, material: tuple[list[tuple[str, str]], list[str]]
) -> list[dict[str, Any]]:
    """The bucketed prompts in the seed's JSONL format (plus `source`, `length_bucket`, `prompt_tokens`)."""
    modules, templates = material
    rng = random.Random(spec.seed)
    ids = tokens.encode([source for _, source in modules])
    drafts = _drafts(spec, [(rel, i) for (rel, _), i in zip(modules, ids, strict=True)], templates, rng)
    _fit(drafts, tokens)
    rows = []
    for n, d in enumerate(drafts):
        index = n % spec.per_bucket
        rows.append(
            {
                "id": f"{spec.stratum}-len-{d.low:04d}-{index:02d}",
                "workload": bucket_stratum(spec.stratum, d.low),
                "source": f"{d.source}@{d.start}",
                "length_bucket": [d.low, d.high],
                "prompt_tokens": d.count,
                "messages": d.message(),
                "max_tokens": spec.max_tokens,
            }
        )
    return rows


# ------------------------------------------------------------------------------------------------ checking


def check_rows(
    rows: Sequence[dict[str, Any]], counts: Sequence[int], max_model_len: int, path: Path | str = "<built>"
) -> list[WorkloadError]:
    """Every problem of bucketed rows against their counted prompt tokens, as FILE:LINE: field: message (LINE
    is the row's position, 1-based): the stratum names the bucket's lower edge, the prompt lies in its bucket,
    prompt plus max_tokens fits max_model_len."""
    problems = []
    for line, (row, count) in enumerate(zip(rows, counts, strict=True), start=1):
        bucket = row.get("length_bucket")
        if not (isinstance(bucket, list) and len(bucket) == 2 and all(isinstance(e, int) for e in bucket)):
            problems.append(
                WorkloadError(path, line, "length_bucket", f"must be [low, high] tokens, got {bucket!r}")
            )
            continue
        low, high = bucket
        parsed = parse_bucket_stratum(str(row.get("workload")))
        if parsed is None or parsed[1] != low:
            problems.append(
                WorkloadError(
                    path,
                    line,
                    "workload",
                    f"{row.get('workload')!r} does not name bucket {low} (-len-{low:04d})",
                )
            )
        if not low <= count < high:
            problems.append(
                WorkloadError(
                    path, line, "messages", f"{count} prompt tokens, outside its bucket [{low}, {high})"
                )
            )
        if count + int(row.get("max_tokens", 0)) > max_model_len:
            problems.append(
                WorkloadError(
                    path,
                    line,
                    "max_tokens",
                    f"{count} prompt tokens + max_tokens {row.get('max_tokens')} exceed max_model_len {max_model_len}",
                )
            )
    return problems


def check_file(path: Path | str, model: str | Path, max_model_len: int) -> list[WorkloadError]:
    """The workload schema's problems of a bucketed file, then its buckets' (tokens counted again)."""
    from workloads.schema import check_file as schema_problems

    prompts, problems = schema_problems(path)
    if problems:
        return problems
    rows = [p.model_dump() for p in prompts]
    with TokenCounter(resolve_model(model)) as tokens:
        counts = tokens.count([p.chat_messages() for p in prompts])
    return check_rows(rows, counts, max_model_len, path)


def resolve_model(model: str | Path) -> Path:
    path = Path(model)
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path


def write(path: Path, spec: BucketSpec, rows: list[dict[str, Any]]) -> None:
    header = (
        f"Prompt-length buckets of long-context summarization: edges {list(spec.edges)} tokens, "
        f"{spec.per_bucket} prompts a bucket,\n"
        f"counted with {spec.model}'s tokenizer and chat template; max_tokens {spec.max_tokens}, "
        f"max_model_len {spec.max_model_len}, seed {spec.seed}.\n"
        "Built by workloads/length_buckets.py (`specgauge workloads length-buckets`) from the stdlib modules "
        "held out of the tiny models' training."
    )
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [json.dumps(row, ensure_ascii=False) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def build(spec: BucketSpec, out: Path, stdlib: Path | None = None) -> list[dict[str, Any]]:
    """Build, check (every prompt counted again) and write the bucketed corpus; InputError naming the
    problems when the check fails (nothing is written then)."""
    material = long_context_material(stdlib)
    with TokenCounter(resolve_model(spec.model)) as tokens:
        rows = build_rows(spec, tokens, material)
        counts = tokens.count([row["messages"] for row in rows])
    problems = check_rows(rows, counts, spec.max_model_len, out)
    if problems:
        raise InputError("; ".join(str(p) for p in problems[:10]))
    out.parent.mkdir(parents=True, exist_ok=True)
    write(out, spec, rows)
    return rows
