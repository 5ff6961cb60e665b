"""What the /metrics tests share: the texts captured from the real engine, and the keys of a speculation delta.

Not a test module (no `test_` prefix): test modules import it.
"""

from __future__ import annotations

from pathlib import Path

# /metrics texts captured from the real engine before and after a few requests (the folder's README says how).
DATA = Path(__file__).resolve().parent / "data" / "metrics"

# A speculation delta's keys, in the order `specgauge metrics-delta` prints them; a cell summary's
# `speculation` holds them too.
SPEC_DELTA_KEYS = (
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "acceptance_rate_per_position",
)
