"""The profile flow: launch a speculative variant with the profiler on, run one short window, analyse where
its compute went (drafting, verification of rejected tokens = waste, useful work), write the artifact."""

from __future__ import annotations

from specgauge.prefect_env import configure

configure()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from prefect import flow, get_run_logger  # noqa: E402

from artifacts import layout  # noqa: E402
from artifacts.store import read_json  # noqa: E402
from experiments.plan import resolve_repo_path  # noqa: E402
from tasks.profile.run import profile_variant  # noqa: E402
from tasks.profile.window import WindowPlan  # noqa: E402


def earlier_profile(campaign_dir: Path, variant: str) -> dict[str, Any] | None:
    """The latest ok profile of `variant` in a campaign, as the flow's summary, or None (a re-run resumes)."""
    for path in sorted(layout.profiles_dir(campaign_dir).glob(f"{variant}.*"), reverse=True):
        meta = read_json(path / layout.META) if (path / layout.META).exists() else {}
        if meta.get("status") == "ok" and (path / layout.BREAKDOWN).exists():
            return {
                "variant": variant,
                "path": str(path),
                "status": "ok",
                "error": None,
                "shares": read_json(path / layout.BREAKDOWN).get("shares"),
            }
    return None


@flow(name="profile", flow_run_name="profile-{variant}")
def profile(
    spec: str,
    variant: str,
    concurrency: int = 2,
    requests: int = 8,
    warmup: int = 2,
    stratum: str | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """Profile one window of `variant` from `spec` (a YAML path) at the given concurrency."""
    result = profile_variant(
        resolve_repo_path(spec),
        variant,
        plan=WindowPlan(concurrency=concurrency, requests=requests, warmup=warmup),
        stratum=stratum,
        label=label,
    )
    summary: dict[str, Any] = {
        "variant": variant,
        "path": str(result.path),
        "status": result.status,
        "error": result.error,
    }
    if result.breakdown is not None:
        summary["shares"] = result.breakdown.shares
    get_run_logger().info("profile of %s: %s", variant, summary)
    return summary
