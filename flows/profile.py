"""The profile flow: launch a speculative variant with the profiler on, run one short window, analyse where
its compute went (drafting, verification of rejected tokens = waste, useful work), write the artifact."""

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from artifacts import layout
from artifacts.store import read_json
from experiments.plan import resolve_repo_path
from experiments.spec import ExperimentSpec
from tasks.profile.run import profile_variant
from tasks.profile.window import WindowPlan


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
    spec: ExperimentSpec | str,
    variant: str,
    concurrency: int = 2,
    requests: int = 8,
    warmup: int = 2,
    stratum: str | None = None,
    label: str | None = None,
    campaign_id: str | None = None,
) -> dict[str, Any]:
    """Profile one window of `variant` from `spec` (a YAML path, or the spec a campaign flow planned and
    recorded as `campaign_id` already) at the given concurrency."""
    # issue 34: from a deployment (the UI), specs only under experiments/ or SPECGAUGE_SPEC_DIRS
    from experiments.loader import flow_spec_path

    result = profile_variant(
        spec if isinstance(spec, ExperimentSpec) else resolve_repo_path(flow_spec_path(spec)),
        variant,
        plan=WindowPlan(concurrency=concurrency, requests=requests, warmup=warmup),
        stratum=stratum,
        label=label,
        campaign_id=campaign_id,
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
