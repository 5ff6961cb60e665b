"""The campaign report: one self-contained HTML page (tables, charts, provenance, gate verdicts, the
decision rule) in SPECGAUGE_HOME/reports/<campaign_id>/, beside every chart as HTML and PNG.

Self-contained means no request leaves the page: the Vega, Vega-Lite and Vega-Embed JavaScript is inlined
once (vl-convert's bundle, the one Altair's `inline=True` uses) and every chart's spec, with its data, sits in
the page as JSON. `external_references` checks the written page for any src/href that would fetch something.

This module holds what every report page is made of: cell formatting, tables, the page template
(`render_page`), the offline check and the folder a report is built in (`building`, `write_page`). The
campaign's sections, one function per question, are in analysis/report_sections.py.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jinja2
import polars as pl

from analysis.charts import ChartFiles

Format = Callable[[Any], str]


# ----------------------------------------------------------------------------------------------- formatting


def fmt_num(digits: int = 3) -> Format:
    def f(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        if isinstance(value, float):
            return f"{value:.{digits}g}"
        return str(value)

    return f


def fmt_pct(value: Any) -> str:
    return "–" if value is None else f"{value:.1%}"


def fmt_ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:.2f}"


def fmt_bool(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "–")


def fmt_interval(estimate: Any, low: Any, high: Any, label: str | None) -> str:
    if estimate is None:
        return "–"
    if low is None or high is None:
        return f"{estimate:.3g} ({label or 'no interval'})"
    return f"{estimate:.3g} [{low:.3g}, {high:.3g}]"


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], str]
    css: str = ""


def col(name: str, header: str | None = None, fmt: Format | None = None, css: str = "") -> Column:
    formatter = fmt or fmt_num()
    return Column(header or name, lambda row: formatter(row.get(name)), css)


def html_table(
    frame: pl.DataFrame,
    columns: Sequence[Column],
    *,
    row_class: Callable[[dict], str] | None = None,
    empty: str = "no rows",
) -> str:
    if frame.is_empty():
        return f'<p class="empty">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in columns)
    body = []
    for row in frame.iter_rows(named=True):
        cls = row_class(row) if row_class else ""
        cells = "".join(
            f'<td class="{c.css}">{html.escape(c.value(row))}</td>'
            if c.css
            else f"<td>{html.escape(c.value(row))}</td>"
            for c in columns
        )
        body.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# ------------------------------------------------------------------------------------------------- the page

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .85em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } tr.win td { background: #e8f6e8; } tr.flag td { background: #fdeeee; }
.rule { background: #f6f8fa; border-left: 4px solid #36c; padding: .6em 1em; }
.note { color: #555; font-size: .9em; } .empty { color: #888; font-style: italic; }
.chart { margin: 1em 0 2em; min-height: 120px; } .chart-error { color: #b00; white-space: pre-wrap; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .8em; max-height: 30em; }
nav a { margin-right: 1em; }
"""

EMBED_SCRIPT = """
(function () {
  var charts = document.querySelectorAll("div.chart[data-spec]");
  charts.forEach(function (div) {
    var spec = JSON.parse(document.getElementById(div.getAttribute("data-spec")).textContent);
    vegaEmbed(div, spec, {actions: false, renderer: "svg"}).then(function () {
      div.setAttribute("data-rendered", "true");
    }).catch(function (err) {
      div.setAttribute("data-rendered", "error");
      var p = document.createElement("p"); p.className = "chart-error"; p.textContent = String(err);
      div.appendChild(p); console.error(err);
    });
  });
})();
"""


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    body: str


def chart_block(chart: ChartFiles, spec: dict[str, Any]) -> str:
    data_id = f"spec-{chart.name}"
    payload = json.dumps(spec, separators=(",", ":"), default=str).replace("</", "<\\/")
    return (
        f'<div class="chart" id="chart-{chart.name}" data-spec="{data_id}"></div>'
        f'<script type="application/json" id="{data_id}">{payload}</script>'
        f'<p class="note">{html.escape(chart.title)}: <a href="{chart.html.name}">interactive HTML</a>, '
        f'<a href="{chart.png.name}">PNG</a></p>'
    )


# The page: the Vega bundle once in the head, a nav of the sections, each section under its heading, and the
# loop that embeds every chart from its spec. The `h` filter (html.escape) escapes what is text; the section
# bodies, the intro and the scripts are HTML already.
PAGE_TEMPLATE = (
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
    "<title>{{ title | h }}</title><style>{{ style }}</style>"
    '<script type="text/javascript">{{ javascript }}</script></head>'
    "<body><h1>{{ title | h }}</h1>{{ intro }}"
    '<nav>{% for s in sections %}<a href="#{{ s.anchor }}">{{ s.title | h }}</a>{% endfor %}</nav>'
    '{% for s in sections %}<section id="{{ s.anchor }}"><h2>{{ s.title | h }}</h2>{{ s.body }}</section>'
    "{% endfor %}"
    '<script type="text/javascript">{{ embed_script }}</script></body></html>\n'
)


@cache
def _page_template() -> jinja2.Template:
    environment = jinja2.Environment(
        autoescape=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined
    )
    environment.filters["h"] = html.escape
    return environment.from_string(PAGE_TEMPLATE, globals={"style": STYLE, "embed_script": EMBED_SCRIPT})


def render_page(title: str, intro: str, sections: Iterable[Section], javascript: str) -> str:
    """The self-contained page of `sections` (one per question: analysis.report_sections), PAGE_TEMPLATE
    rendered."""
    return _page_template().render(title=title, intro=intro, sections=list(sections), javascript=javascript)


def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed as one script (what Altair inlines for `inline=True`)."""
    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert

    return vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())


# ---------------------------------------------------------------------------------------- offline guarantee

_FETCHING_ATTRIBUTES = {"src", "href", "srcset", "poster", "data", "action", "formaction", "background"}
_LOCAL = re.compile(r"^(#|data:|[A-Za-z0-9_.-]+(\.html|\.png)$)")


class _References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in _FETCHING_ATTRIBUTES and value is not None and not _LOCAL.match(value.strip()):
                self.found.append(f"<{tag} {name}={value!r}>")


def external_references(page: str) -> list[str]:
    """Every src/href-like attribute that is not an in-page anchor, a data: URL or a sibling chart file.
    (Script and style text is not markup: the parser does not look inside it.)"""
    parser = _References()
    parser.feed(page)
    return parser.found


# ------------------------------------------------------------------------------------------- the folder swap


def replace_folder(build: Path, final: Path) -> Path:
    """Move a finished report folder into place; the old one is removed only after the new one is in."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(build, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


@contextmanager
def building(final: Path) -> Iterator[Path]:
    """A fresh folder beside `final` to build a report in, moved into place (`replace_folder`) when the block
    ends without an error, and removed in any case."""
    final.parent.mkdir(parents=True, exist_ok=True)
    build = final.with_name(f".{final.name}.build-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    try:
        yield build
        replace_folder(build, final)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def write_page(build: Path, page: str, error: type[Exception] = ValueError) -> None:
    """index.html in `build`, refused (`error`) when the page would fetch anything from outside itself."""
    outside = external_references(page)
    if outside:
        raise error(f"the report would fetch from outside the page: {', '.join(outside[:5])}")
    (build / "index.html").write_text(page, encoding="utf-8")
