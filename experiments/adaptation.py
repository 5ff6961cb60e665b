"""The head adaptation's benefit rule: its parameters, checked where they are given (the CLI, the confirmation's
inputs), and judged by analysis.adaptation.confirm (whose METRICS map each gain metric to its cell column)."""

from __future__ import annotations

from dataclasses import dataclass

GAIN_METRICS = ("mean_acceptance_length", "throughput", "tpot_p50")


@dataclass(frozen=True)
class Rule:
    """The benefit rule's parameters (the issue's defaults; docs/adaptation.md)."""

    min_effect: float = 0.10
    max_harm: float = 0.05
    min_success_rate: float = 0.99
    gain_metric: str = "throughput"
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.gain_metric not in GAIN_METRICS:
            raise ValueError(
                f"gain_metric must be one of {', '.join(GAIN_METRICS)}, got {self.gain_metric!r}"
            )
        if self.min_effect < 0:
            raise ValueError(f"min_effect must be >= 0, got {self.min_effect}")
        if not 0 <= self.max_harm < 1:
            raise ValueError(f"max_harm must be within [0, 1), got {self.max_harm}")
