"""The report page renders offline in Debian's headless Chromium: every chart draws (SVG in the DOM and
non-blank pixels in its region of a screenshot), the console has no errors, and no request leaves the page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from analysis_fixtures import CHROMIUM, Chromium, PlantedBuilder, pixel_spread, profile
from warehouse_fixtures import make_spec, profile_meta, real_profile_breakdown

from analysis.data import AnalysisSettings
from analysis.report import external_references
from analysis.run import analyze_campaign
from tasks.profile.window import write_profile_artifact
from warehouse.ingest import ingest_raw

pytestmark = pytest.mark.chromium


def plant(variant: str, repeat: int, workload: str, load: str):
    noise = (1.02, 0.98)[repeat]
    if variant == "plain":
        return profile(0.020 * noise, None, ttft_s=0.3 if load.startswith("rate") else 0.01)
    speedup = {"ngram-k3": 1.2, "draft-k3": 1.5}[variant]
    return profile(0.020 / speedup * noise, 0.3 if variant == "ngram-k3" else 0.55)


def write_profile(builder: PlantedBuilder) -> None:
    """A real profiled window (the CPU trace kept in tests/data/profile) in the campaign: the waste chart."""
    profile_id = "draft-k3.code.c2.A"
    meta = profile_meta(builder.campaign_id, profile_id, ended="2026-11-30T17:13:30.000Z")
    write_profile_artifact(builder.campaign_dir / "profiles" / profile_id, meta, real_profile_breakdown())


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    root = tmp_path_factory.mktemp("report")
    spec = make_spec("page", repeats=2, concurrencies=(1, 4), rates=(1, 2), strata=("chat", "code"))
    builder = PlantedBuilder(root / "raw", spec=spec, plant=plant)
    builder.write_all()
    builder.write_gates()
    write_profile(builder)
    db = root / "w.duckdb"
    assert ingest_raw(builder.raw_dir, db).ok
    result = analyze_campaign(
        db_path=db,
        settings=AnalysisSettings(),
        reports_dir=root / "reports",
    )
    assert result.report is not None
    return result.report


def test_the_report_renders_every_chart_offline_without_console_errors(report: Path, tmp_path: Path) -> None:
    html = report.read_text()
    assert external_references(html) == []
    assert html.count("vegaEmbed(") == 1  # one embed loop; the library itself is inlined once
    browser = Chromium(tmp_path / "profile")
    try:
        page = browser.open(report.as_uri())
    finally:
        browser.close()
    assert page.console_errors == [] and page.exceptions == []
    outside = [u for u in page.requests if not (u == report.as_uri() or u.startswith("data:"))]
    assert outside == [], f"the page fetched {outside}"
    assert report.as_uri() in page.requests  # the monitor does see requests: the page itself
    expected = {
        "speedup_closed",
        "speedup_open",
        "latency",
        "itl",
        "acceptance_positions",
        "pareto",
        "capacity_open",
        "step_time",
        "waste",
    }
    charts = {c["id"].removeprefix("chart-"): c for c in page.charts}
    assert expected <= set(charts), sorted(charts)
    for name, chart in charts.items():
        assert chart["rendered"] == "true", (name, chart)
        assert chart["svg"] >= 1 and chart["marks"] > 20, (name, chart)
        assert chart["width"] > 200 and chart["height"] > 100, (name, chart)
        spread, inked = pixel_spread(page.chart_images[chart["id"]])
        assert spread > 10 and inked > 0.02, (name, spread, inked)  # drawn, not a blank box
    assert 'class="chart-error"' not in page.dom
    assert "ITL kind: chunk gap" in page.dom and "ITL per token" in page.dom


def test_a_blank_chart_is_detected(report: Path, tmp_path: Path) -> None:
    """The check above can fail: the same page with its Vega bundle removed renders no chart, reports the
    error on the console, and its chart regions are blank."""
    broken = tmp_path / "broken"
    shutil.copytree(report.parent, broken)
    page_path = broken / "index.html"
    text = page_path.read_text()
    start = text.index('<script type="text/javascript">') + len('<script type="text/javascript">')
    end = text.index("</script>", start)
    page_path.write_text(text[:start] + text[end:])
    browser = Chromium(tmp_path / "profile")
    try:
        page = browser.open(page_path.as_uri(), settle_s=5)
    finally:
        browser.close()
    assert page.exceptions, "a page without Vega must throw"
    assert all(c["svg"] == 0 for c in page.charts)
    _, inked = pixel_spread(next(iter(page.chart_images.values())))
    assert inked < 0.02
