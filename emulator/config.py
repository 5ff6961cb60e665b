"""What the emulator does: its timing, its speculation, its faults. One dataclass, also the CLI's options.

Every field is an option of `python -m emulator` (`--ttft-ms 50`, `--acceptance 0.8,0.5,0.2`, ...) and of
`specgauge emulator`; `POST /emulator/config` changes fields of a running emulator (JSON object of fields).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args, get_origin, get_type_hints

TokenIdsMode = Literal["supported", "ignored", "rejected"]
RoleChunk = Literal["with_first", "immediate", "none"]
DeltaField = Literal["content", "reasoning_content", "reasoning", "tool_calls"]

# Per-request faults, chosen by the `x-emulator-fault` header or a `[[fault:NAME]]` marker in the prompt.
FAULTS: dict[str, str] = {
    "error": "answer HTTP `fail_status` (503) with an OpenAI-style error body",
    "cut": "drop the TCP connection after half the tokens (no terminating chunk)",
    "truncate": "end the HTTP body cleanly after half the tokens, without finish_reason or [DONE]",
    "stall": "send the first token, then nothing for `stall_s` seconds (longer than a client timeout)",
    "no_usage": "stream everything but the usage chunk",
    "bad_json": "send one chunk whose data is not JSON, then carry on",
    "error_event": "send an error object mid-stream, then [DONE]",
}


@dataclass
class EmulatorConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on."})
    port: int = field(
        default=8000, metadata={"help": "Port to listen on, 0..65535 (0: any free port, printed at start)."}
    )
    model: str = field(default="emulated", metadata={"help": "Served model name (/v1/models, labels)."})
    ttft_ms: float = field(default=50.0, metadata={"help": "Time to first token after admission, ms."})
    step_ms: float = field(default=10.0, metadata={"help": "Time of one decode step (one chunk), ms."})
    spin_ms: float = field(
        default=0.0,
        metadata={
            "help": "Wake this many ms before each write and poll the event loop until it is due: writes "
            "within tens of microseconds instead of the timers' millisecond, at the cost of a busy core "
            "(for client-accuracy benchmarks). 0: timers only."
        },
    )
    k: int = field(
        default=0, metadata={"help": "Speculative tokens proposed per step (0: plain, one token a chunk)."}
    )
    acceptance: tuple[float, ...] = field(
        default=(0.7,),
        metadata={
            "help": "Probability that draft position i is accepted given positions < i were, comma "
            "separated; the last value repeats up to k. A step emits accepted + 1 tokens."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seeds acceptance draws and fault fractions."})
    default_max_tokens: int = field(default=16, metadata={"help": "max_tokens when a request gives none."})
    max_running: int = field(
        default=0, metadata={"help": "Requests generating at once; more wait (0: no limit)."}
    )
    kv_tokens: int = field(
        default=100_000, metadata={"help": "KV-cache capacity in tokens, for vllm:kv_cache_usage_perc."}
    )
    engines: int = field(
        default=1, metadata={"help": "Data-parallel engines: counters are split over engine labels."}
    )
    decoy_model: str | None = field(
        default=None,
        metadata={"help": "Also expose counters of another model name (that a client must filter out)."},
    )
    token_ids: TokenIdsMode = field(
        default="supported",
        metadata={
            "help": "return_token_ids: supported (chunks carry token_ids), ignored (never sent), "
            "rejected (HTTP 400 for the unknown field, like a strict OpenAI server)."
        },
    )
    role_chunk: RoleChunk = field(
        default="with_first",
        metadata={
            "help": "Chat role-only chunk: with_first (just before the first token, like vLLM), "
            "immediate (on arrival, before TTFT), none."
        },
    )
    delta_field: DeltaField = field(
        default="content",
        metadata={
            "help": "Chat delta field tokens travel in: content, reasoning_content, reasoning, tool_calls."
        },
    )
    reasoning_tokens: int = field(
        default=0, metadata={"help": "The first N tokens of a chat answer go in reasoning_content."}
    )
    fail_first: int = field(default=0, metadata={"help": "Fault: answer the first N completions with 5xx."})
    fail_fraction: float = field(
        default=0.0, metadata={"help": "Fault: answer this share (seeded) with 5xx."}
    )
    fail_status: int = field(default=503, metadata={"help": "HTTP status of injected failures."})
    fault: str | None = field(
        default=None, metadata={"help": f"Fault for every request: one of {', '.join(FAULTS)}."}
    )
    stall_s: float = field(default=3600.0, metadata={"help": "How long a stalled stream stays silent."})
    metrics_fault: Literal["garbage"] | None = field(
        default=None, metadata={"help": "Fault on /metrics: garbage (text that is not Prometheus format)."}
    )
    api_key: str | None = field(
        default=None, metadata={"help": "Require `Authorization: Bearer KEY` on /v1/* (else HTTP 401)."}
    )
    trace: bool = field(
        default=False,
        metadata={"help": "Record server-side write times of every request (GET /emulator/trace)."},
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        problems = []
        if not 0 <= self.port <= 65535:  # the OS would otherwise pick a random port for 99999
            problems.append(f"port must be in 0..65535 (0: any free port), got {self.port}")
        floats = {n: getattr(self, n) for n in ("ttft_ms", "step_ms", "spin_ms", "fail_fraction", "stall_s")}
        if not all(math.isfinite(v) for v in floats.values()):
            problems.append(
                f"{', '.join(n for n, v in floats.items() if not math.isfinite(v))} must be finite"
            )
        if self.ttft_ms < 0 or self.step_ms < 0 or self.spin_ms < 0 or self.stall_s < 0:
            problems.append("ttft_ms, step_ms, spin_ms and stall_s must be >= 0")
        if not 0 <= self.k <= 64:
            problems.append("k must be in 0..64")
        negative = [n for n in ("max_running", "reasoning_tokens", "fail_first") if getattr(self, n) < 0]
        if negative:
            problems.append(f"{', '.join(negative)} must be >= 0")
        if not 100 <= self.fail_status <= 599:
            problems.append(f"fail_status must be an HTTP status (100..599), got {self.fail_status}")
        if not self.acceptance or any(not 0.0 <= p <= 1.0 for p in self.acceptance):
            problems.append("acceptance needs one or more probabilities in [0, 1]")
        if self.default_max_tokens <= 0 or self.engines <= 0 or self.kv_tokens <= 0:
            problems.append("default_max_tokens, engines and kv_tokens must be > 0")
        if not 0.0 <= self.fail_fraction <= 1.0:
            problems.append("fail_fraction must be in [0, 1]")
        if self.fault is not None and self.fault not in FAULTS:
            problems.append(f"fault {self.fault!r} is not one of {', '.join(FAULTS)}")
        for name in ("token_ids", "role_chunk", "delta_field", "metrics_fault"):
            allowed = _literal_values(get_type_hints(EmulatorConfig)[name])
            value = getattr(self, name)
            if value is not None and value not in allowed:
                problems.append(f"{name} {value!r} is not one of {', '.join(map(str, allowed))}")
        if problems:
            raise ValueError("emulator config: " + "; ".join(problems))

    def acceptance_at(self, position: int) -> float:
        return self.acceptance[min(position, len(self.acceptance) - 1)]

    def updated(self, changes: dict[str, Any]) -> EmulatorConfig:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"emulator config: unknown field(s) {', '.join(unknown)}")
        if "acceptance" in changes:
            changes = {**changes, "acceptance": tuple(float(p) for p in changes["acceptance"])}
        return dataclasses.replace(self, **changes)


def _literal_values(hint: Any) -> list[str]:
    """The strings a Literal (or an Optional Literal) allows; [] for other types."""
    if get_origin(hint) is Literal:
        return [a for a in get_args(hint) if isinstance(a, str)]
    return [v for arg in get_args(hint) for v in _literal_values(arg)]


def _parse_tuple(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part.strip())


def build_parser(prog: str = "python -m emulator") -> argparse.ArgumentParser:
    """argparse options generated from EmulatorConfig (one source of truth for both CLIs)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="An OpenAI-compatible streaming server that emulates vLLM (timing, speculation, "
        "/metrics) with fault injection. Per-request faults: header `x-emulator-fault: NAME` or "
        "`[[fault:NAME]]` in the prompt; NAME is one of: "
        + "; ".join(f"{name}: {what}" for name, what in FAULTS.items()),
    )
    hints = get_type_hints(EmulatorConfig)
    for f in fields(EmulatorConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        hint = hints[f.name]
        help_text = f.metadata.get("help", "") + f" (default: {default})"
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif f.name == "acceptance":
            parser.add_argument(flag, type=_parse_tuple, default=default, help=help_text)
        else:
            choices = [a for a in get_args(hint) if a is not type(None)]
            literal = _literal_values(hint)
            if literal:
                parser.add_argument(flag, choices=literal, default=default, help=help_text)
            else:
                scalar = next((t for t in (int, float, str) if t in (hint, *choices)), str)
                parser.add_argument(flag, type=scalar, default=default, help=help_text)
    return parser


def config_from_args(argv: list[str] | None = None, prog: str = "python -m emulator") -> EmulatorConfig:
    parser = build_parser(prog)
    namespace = parser.parse_args(argv)
    try:
        return EmulatorConfig(**vars(namespace))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
