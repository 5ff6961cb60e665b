"""A stacked bar per profiled window: engine time split into wasted and useful drafting, wasted and useful
verification, rejection sampling and other. Saved as self-contained HTML (Vega inline, renders offline) and
PNG (vl-convert)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl

# Stacking order, bottom first, with the colour each part keeps in every chart.
PARTS: tuple[tuple[str, str], ...] = (
    ("wasted drafting", "#d62728"),
    ("wasted verification", "#ff9896"),
    ("useful drafting", "#1f77b4"),
    ("useful verification", "#aec7e8"),
    ("rejection sampling", "#9467bd"),
    ("other", "#c7c7c7"),
)


def share_rows(windows: Iterable[Mapping[str, Any]]) -> pl.DataFrame:
    """Long rows (window, part, share, order) from per-window shares.

    Each input needs `window` (its label) and the share columns of `v_profile_waste` / breakdown.json:
    drafting_share, verification_share, rejection_share, other_share, wasted_drafting_share,
    wasted_verification_share (the wasted ones may be None: no counters, so nothing is called wasted).
    """
    rows: list[dict[str, Any]] = []
    for w in windows:
        wasted_d = w.get("wasted_drafting_share") or 0.0
        wasted_v = w.get("wasted_verification_share") or 0.0
        values = {
            "wasted drafting": wasted_d,
            "wasted verification": wasted_v,
            "useful drafting": (w.get("drafting_share") or 0.0) - wasted_d,
            "useful verification": (w.get("verification_share") or 0.0) - wasted_v,
            "rejection sampling": w.get("rejection_share") or 0.0,
            "other": w.get("other_share") or 0.0,
        }
        for order, (part, _) in enumerate(PARTS):
            rows.append(
                {"window": str(w["window"]), "part": part, "share": float(values[part]), "order": order}
            )
    if not rows:
        raise ValueError("no profiled windows to chart")
    return pl.DataFrame(rows)


def waste_chart(windows: Iterable[Mapping[str, Any]], *, title: str | None = None) -> alt.Chart:
    data = share_rows(windows)
    parts = [p for p, _ in PARTS]
    return (
        alt.Chart(alt.Data(values=data.to_dicts()), title=title or "Where engine time goes")
        .mark_bar()
        .encode(
            x=alt.X("window:N", title="profiled window", sort=None),
            y=alt.Y(
                "sum(share):Q",
                title="share of measured engine time",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            color=alt.Color(
                "part:N", sort=parts, title=None, scale=alt.Scale(domain=parts, range=[c for _, c in PARTS])
            ),
            order=alt.Order("order:Q", sort="ascending"),
            tooltip=["window:N", "part:N", alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(width=alt.Step(60), height=320)
    )


def save_chart(chart: alt.Chart, stem: Path | str) -> tuple[Path, Path]:
    """Write `<stem>.html` (self-contained) and `<stem>.png`; return both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    html, png = stem.with_suffix(".html"), stem.with_suffix(".png")
    chart.save(str(html), inline=True)
    chart.save(str(png))
    return html, png
