"""Does `specgauge decide` choose what measuring everything would choose? (issue 41, item 7: the oracle)

The oracle launches every fixed config of the decision's sweep (each variant of the spec, each depth of a variant
with a `k` list: experiments/decision.yaml has plain, n-gram k=3, the draft model k=3 and EAGLE-3 k=3) at
every load of the spec, `--launches` times each (3 at least): the campaign flow on the sweep's own spec with its
`repeats` set to `--launches` and the greedy gate off (flows/campaign.py; the label `oracle` gives it a campaign
id of its own, and re-running the same command resumes it). Per load (closed-loop concurrency C) each config's
throughput over plain comes with its t interval over launches, paired per launch with the plain launch of the
same repeat block (analysis.speedup.speedup_table, as every speedup in specgauge). The oracle's best at C: the
config with the highest estimate, or plain (1.0x) when no config's estimate exceeds 1.

Against it, the decision `specgauge decide` reached on the same target (`v_decision`; by default the latest
decision whose sweep campaign served the same target model). The decision's config at C: its choice
(`v_decision.choice`, migration 0025): `plain` deploys plain at every load; `schedule` (or '' in a decision
written before options) runs the decision's family at the schedule's depth k at C, plain where k = 0; any other
choice is a fixed config of the sweep or the verification (its depth at C from the decision's options). The
decision's figure at C is what the verification measured for that choice: `over_plain` [low, high] of the
schedule, or the chosen option's figure; plain is 1 by definition.

Per load the verdict is "agrees" when the decision's config is the oracle's best, or the oracle's own estimate
for the decision's config is within 5% of the oracle's best (ratio >= 0.95), or the oracle's best estimate lies
inside the decision's interval; "disagrees" otherwise ("unmeasured" when the oracle has no figure at that load).
Exit status 0 when every load agrees, 1 otherwise, 2 on bad input.

    .venv/bin/python benchmarks/decision_oracle.py [--spec experiments/decision.yaml] [--launches 3]
        [--decision DECISION_ID] [--label oracle] [--report /tmp/oracle.md]
    .venv/bin/python benchmarks/decision_oracle.py --oracle-campaign decision-XXXXXXXX-oracle   # the table again

It launches engines for a long while (decision.yaml: 4 configs x 3 launches, 12 engine
starts on 2 cores): run it on a quiet machine, after `make demo` (which writes the decision). The header line says
when, on how many CPUs, at what load average it started, and the command; docs/decision.md, "The oracle", keeps
the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from analysis.data import AnalysisSettings, CampaignData, load_campaign
from analysis.speedup import gain, speedup_table
from analysis.stats import percent
from artifacts.documents.decisions import PLAIN_OPTION, SCHEDULE_OPTION
from experiments.spec import TargetSpec, Variant
from specgauge.errors import InputError, SpecgaugeError

WITHIN = 0.05  # the decision's config agrees when the oracle puts it within 5% of its best
AGREES, DISAGREES, UNMEASURED = "agrees", "disagrees", "unmeasured"
MIN_LAUNCHES = 3
# What makes two targets the same target (env and extra arguments may be redacted in stored specs)
TARGET_KEYS = ("model", "served_model_name", "max_model_len", "dtype", "tensor_parallel_size", "seed")


# -- configs and figures ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """A fixed speculation config: a method at a depth (and its drafter where known); plain is method none or
    k = 0 (a schedule's off range is compared with plain: the oracle launches no "configured but off" arm)."""

    name: str  # the spec variant's name, or what the decision calls it ("schedule", a fixed option's name)
    method: str
    k: int
    drafter: str | None = None

    @property
    def is_plain(self) -> bool:
        return self.method == "none" or self.k == 0

    def matches(self, other: Config) -> bool:
        """The same config: both plain, or the same method and depth (and drafter, where both name one)."""
        if self.is_plain or other.is_plain:
            return self.is_plain and other.is_plain
        same_drafter = self.drafter is None or other.drafter is None or self.drafter == other.drafter
        return self.method == other.method and self.k == other.k and same_drafter

    def text(self) -> str:
        if self.is_plain:
            return "plain"
        return f"{self.method} k={self.k}" + (f" ({self.name})" if self.name else "")


PLAIN = Config("plain", "none", 0)


@dataclass(frozen=True)
class OracleFigure:
    """One config's throughput over plain at one load in the oracle campaign (t interval over launches)."""

    config: Config
    estimate: float
    low: float | None
    high: float | None
    n: int
    interval: str


PLAIN_FIGURE = OracleFigure(PLAIN, 1.0, None, None, 0, "the baseline")


@dataclass(frozen=True)
class DecisionAt:
    """What the decision deploys at one load and what the verification measured for it there."""

    concurrency: int
    config: Config
    over_plain: float | None
    low: float | None
    high: float | None
    source: str  # where the figure comes from (the verified schedule, an option's source, "deploy plain")
    outcome: str = ""  # the load's verdict in the decision (v_decision.load_outcome)


@dataclass(frozen=True)
class OracleRow:
    """One load: the oracle's best, the decision's config, the oracle's figure for it, and the verdict."""

    concurrency: int
    best: OracleFigure
    decision: DecisionAt
    oracle_for_decision: OracleFigure | None  # None: the oracle did not measure the decision's config here
    ratio: float | None  # oracle_for_decision.estimate / best.estimate
    verdict: str  # AGREES, DISAGREES or UNMEASURED
    reason: str
    figures: tuple[OracleFigure, ...] = ()  # every config the oracle measured at this load

    @property
    def agrees(self) -> bool:
        return self.verdict == AGREES


@dataclass(frozen=True)
class Decision:
    """One decision as the warehouse holds it (v_decision, latest revision), with what it takes to name its
    choice's config at each load."""

    decision_id: str
    campaign_id: str  # the verification campaign
    source_campaign_id: str  # the sweep
    workload: str
    family: str
    method: str
    drafter: str | None  # the schedule's drafter (decisions.variant)
    outcome: str
    choice: str  # PLAIN_OPTION, SCHEDULE_OPTION ('' before options) or a fixed option's name
    loads: tuple[dict[str, Any], ...]  # v_decision rows, one per load
    options: tuple[dict[str, Any], ...] = ()  # v_decision.options, parsed
    variants: dict[str, Variant] = field(default_factory=dict)  # the verification's and the sweep's, by name


# -- the oracle's side -----------------------------------------------------------------------------------------
def _variant(entry: dict[str, Any]) -> Variant | None:
    try:
        return Variant.model_validate(entry)
    except ValueError:  # pydantic's ValidationError: an entry this version cannot read names no drafter
        return None


def _variants(spec: dict[str, Any]) -> dict[str, Variant]:
    out = {}
    for entry in spec.get("variants") or []:
        variant = _variant(entry) if isinstance(entry, dict) else None
        if variant is not None:
            out[variant.name] = variant
    return out


def oracle_figures(
    data: CampaignData, workload: str | None = None, settings: AnalysisSettings | None = None
) -> dict[int, list[OracleFigure]]:
    """concurrency -> every speculative config's closed-loop throughput over plain on `workload` (None: the
    campaign's only workload), best first."""
    table = gain(speedup_table(data, settings or AnalysisSettings()), "throughput").filter(
        pl.col("load_mode") == "closed"
    )
    workloads = sorted(set(table["workload"].to_list()))
    if workload is None:
        if len(workloads) > 1:
            raise InputError(f"the oracle campaign measured {', '.join(workloads)}: name the workload")
        workload = workloads[0] if workloads else None
    variants = _variants(data.spec)
    out: dict[int, list[OracleFigure]] = {}
    for row in table.filter(pl.col("workload") == workload).iter_rows(named=True):
        variant = variants.get(row["variant"])
        if variant is not None and variant.synthetic_acceptance_length is not None:
            continue  # a synthetic acceptance measures a cost, it is no config to deploy
        config = Config(
            row["variant"],
            row["method"],
            int(row["k"] or 0),
            variant.drafter if variant is not None else None,
        )
        figure = OracleFigure(
            config,
            float(row["estimate"]),
            row["ci_low"],
            row["ci_high"],
            int(row["n_repeats"]),
            row["interval"],
        )
        out.setdefault(int(row["concurrency"]), []).append(figure)
    for figures in out.values():
        figures.sort(key=lambda f: (-f.estimate, f.config.k, f.config.name))
    return out


def oracle_best(figures: Sequence[OracleFigure]) -> OracleFigure:
    """The config with the highest estimate; plain when none exceeds 1."""
    best = max(figures, key=lambda f: (f.estimate, -f.config.k), default=None)
    return best if best is not None and best.estimate > 1.0 else PLAIN_FIGURE


def judge_load(concurrency: int, figures: Sequence[OracleFigure], decision: DecisionAt) -> OracleRow:
    """The verdict at one load (the module's docstring says the rule)."""
    best = oracle_best(figures)
    mine = (
        PLAIN_FIGURE
        if decision.config.is_plain
        else next((f for f in figures if f.config.matches(decision.config)), None)
    )
    ratio = mine.estimate / best.estimate if mine is not None else None
    inside = (
        decision.low is not None
        and decision.high is not None
        and decision.low <= best.estimate <= decision.high
    )
    verdict = AGREES
    if not figures:
        verdict, reason = UNMEASURED, f"the oracle measured no config at C={concurrency}"
    elif decision.config.matches(best.config):
        reason = "the decision's config is the oracle's best"
    elif ratio is not None and ratio >= 1.0 - WITHIN - 1e-12:
        reason = f"within {WITHIN:.0%} of the oracle's best (ratio {ratio:.3f})"
    elif inside:
        reason = f"the oracle's best {best.estimate:.3g}x lies inside the decision's interval"
        reason += f" [{decision.low:.3g}, {decision.high:.3g}]"
    elif mine is None:
        verdict = UNMEASURED
        reason = f"the oracle did not measure {decision.config.text()} at C={concurrency}"
        reason += f", and its best {best.estimate:.3g}x lies outside the decision's interval"
    else:
        verdict = DISAGREES
        reason = (
            f"the oracle puts it at {ratio:.3f} of its best ({best.config.text()}), below {1 - WITHIN:.2f},"
        )
        reason += " and its best lies outside the decision's interval"
    return OracleRow(concurrency, best, decision, mine, ratio, verdict, reason, tuple(figures))


def oracle_rows(
    data: CampaignData, decision: Sequence[DecisionAt], workload: str | None = None
) -> list[OracleRow]:
    """One row per load of the decision, against the oracle campaign's figures."""
    figures = oracle_figures(data, workload)
    return [judge_load(d.concurrency, figures.get(d.concurrency, []), d) for d in sorted(decision, key=_load)]


def oracle_table(
    con: duckdb.DuckDBPyConnection,
    oracle_campaign_id: str,
    decision: Sequence[DecisionAt],
    workload: str | None = None,
) -> list[OracleRow]:
    """`oracle_rows` of the oracle campaign as the warehouse holds it."""
    return oracle_rows(load_campaign(con, oracle_campaign_id), decision, workload)


def _load(d: DecisionAt) -> int:
    return d.concurrency


# -- the decision's side ---------------------------------------------------------------------------------------
def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _same_target(stored: dict[str, Any] | None, target: dict[str, Any]) -> bool:
    if not stored or stored.get("model") != target.get("model"):
        return False
    return all(stored[key] == target[key] for key in TARGET_KEYS if key in stored and key in target)


def find_decision(
    con: duckdb.DuckDBPyConnection, decision_id: str | None, target: TargetSpec | dict[str, Any]
) -> tuple[str, str]:
    """(verification campaign id, decision id): `decision_id` (its latest campaign), or the latest decision whose
    sweep served `target` (the sweep's spec, else the decision's own target entry). InputError when none."""
    wanted = target.model_dump(mode="json") if isinstance(target, TargetSpec) else target
    rows = con.execute(
        "SELECT d.campaign_id, d.decision_id, coalesce(json_extract(c.spec, '$.target'), d.target) "
        "FROM decisions d LEFT JOIN campaigns c ON c.campaign_id = d.source_campaign_id "
        "ORDER BY d.created_utc DESC NULLS LAST, d.revision DESC, d.decision_id DESC"
    ).fetchall()
    if decision_id is not None:
        found = [(c, d) for c, d, _ in rows if d == decision_id]
        if not found:
            known = ", ".join(sorted({d for _, d, _ in rows})) or "none"
            raise InputError(f"no decision {decision_id!r} in the warehouse (it has: {known})")
        return found[0]
    for campaign_id, found_id, stored in rows:
        if _same_target(_json(stored), wanted):
            return str(campaign_id), str(found_id)
    raise InputError(
        f"no decision in the warehouse for the target {wanted.get('model')!r}: run `specgauge decide` on the "
        "sweep's spec first (`make demo` does), or name one with --decision"
    )


def read_decision(con: duckdb.DuckDBPyConnection, campaign_id: str, decision_id: str) -> Decision:
    """The decision's latest revision (v_decision), its schedule's drafter, and the variants its choice may
    name (the verification's and the sweep's specs)."""
    frame = con.sql(
        "SELECT * FROM v_decision WHERE campaign_id = ? AND decision_id = ? ORDER BY concurrency",
        params=[campaign_id, decision_id],
    ).pl()
    if frame.is_empty():
        raise InputError(f"no decision {decision_id!r} of campaign {campaign_id!r} in v_decision")
    first = frame.row(0, named=True)
    (variant,) = con.execute(
        "SELECT variant FROM decisions WHERE campaign_id = ? AND decision_id = ? ORDER BY revision DESC LIMIT 1",
        [campaign_id, decision_id],
    ).fetchone() or (None,)
    schedule = _variant(_json(variant)) if variant else None
    variants: dict[str, Variant] = {}
    for source in (first["source_campaign_id"], campaign_id):  # the verification's names win
        spec = con.execute("SELECT spec FROM campaigns WHERE campaign_id = ?", [source]).fetchone()
        if spec:
            variants.update(_variants(_json(spec[0]) or {}))
    return Decision(
        decision_id=decision_id,
        campaign_id=campaign_id,
        source_campaign_id=str(first["source_campaign_id"]),
        workload=str(first["workload"]),
        family=str(first["family"]),
        method=str(first["method"]),
        drafter=schedule.drafter if schedule is not None else None,
        outcome=str(first["outcome"]),
        choice=str(first.get("choice") or ""),
        loads=tuple(r for r in frame.iter_rows(named=True) if r["concurrency"] is not None),
        options=tuple(_json(first.get("options")) or ()),
        variants=variants,
    )


def decision_choices(decision: Decision) -> list[DecisionAt]:
    """What the decision deploys at each of its loads, and the verification's figure for it."""
    if not decision.loads:
        raise InputError(f"decision {decision.decision_id} has no measured load")
    if decision.choice == PLAIN_OPTION:
        return [
            DecisionAt(int(r["concurrency"]), PLAIN, 1.0, None, None, "deploy plain", str(r["load_outcome"]))
            for r in decision.loads
        ]
    if decision.choice in ("", SCHEDULE_OPTION):
        out = []
        for r in decision.loads:
            k = int(r["k"])
            config = Config(SCHEDULE_OPTION, decision.method, k, decision.drafter) if k else PLAIN
            where = f"the verified schedule{'' if k else ', off (k=0)'}, {r['over_plain_interval']}"
            out.append(
                DecisionAt(
                    int(r["concurrency"]),
                    config,
                    r["over_plain"],
                    r["over_plain_low"],
                    r["over_plain_high"],
                    where,
                    str(r["load_outcome"]),
                )
            )
        return out
    return _fixed_choice(decision)


def _fixed_choice(decision: Decision) -> list[DecisionAt]:
    """A fixed option chosen: its method (from the campaigns' variants) at its depth per load, its figures."""
    option = next((o for o in decision.options if o.get("name") == decision.choice), None)
    variant = decision.variants.get(decision.choice)
    if option is None or variant is None:
        raise InputError(
            f"decision {decision.decision_id} chose {decision.choice!r}, which is neither among its options nor a "
            "variant of its campaigns"
        )
    loads = {int(load["concurrency"]): load for load in option.get("loads") or []}
    outcomes = {int(r["concurrency"]): str(r["load_outcome"]) for r in decision.loads}
    out = []
    for concurrency in sorted(outcomes):
        load = loads.get(concurrency) or {}
        k = int(load.get("k", variant.k or 0))
        config = Config(decision.choice, variant.method, k, variant.drafter) if k else PLAIN
        out.append(
            DecisionAt(
                concurrency,
                config,
                load.get("over_plain"),
                load.get("over_plain_low"),
                load.get("over_plain_high"),
                f"option {decision.choice}: {load.get('source', 'not measured')}",
                outcomes[concurrency],
            )
        )
    return out


# -- the run ---------------------------------------------------------------------------------------------------
def launch_oracle(spec_path: Path, launches: int, label: str | None) -> str:
    """The campaign flow on the sweep's spec, `launches` repeat blocks, gate off; its campaign id."""
    from flows.campaign import CampaignRequest, campaign
    from specgauge.progress import RichReporter, reporting

    request = CampaignRequest(
        spec_path=str(spec_path), label=label, repeats=launches, gate=False, analyze=False
    )
    with reporting(RichReporter()):
        result = campaign(request)
    failed = result.get("failed_cells") or {}
    if failed:
        print(
            f"note: {len(failed)} cell(s) of the oracle failed: {', '.join(sorted(failed))}", file=sys.stderr
        )
    return str(result["campaign_id"])


def _span(estimate: float | None, low: float | None, high: float | None) -> str:
    if estimate is None:
        return "unknown"
    bounds = f" [{low:.3g}, {high:.3g}]" if low is not None and high is not None else " (no interval)"
    return f"{estimate:.3g}x{bounds}"


def markdown(rows: Sequence[OracleRow]) -> list[str]:
    """The verdict table, then every config the oracle measured at every load (the best in bold)."""
    lines = [
        "| C | the oracle's best | the decision's choice (its figure) | the oracle's figure for it | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        mine = r.oracle_for_decision
        ratio = f", {r.ratio:.3f} of the best" if r.ratio is not None else ""
        outcome = f", {r.decision.outcome}" if r.decision.outcome else ""
        lines.append(
            f"| {r.concurrency} | {r.best.config.text()} {_span(r.best.estimate, r.best.low, r.best.high)} | "
            f"{r.decision.config.text()}: {_span(r.decision.over_plain, r.decision.low, r.decision.high)} "
            f"({r.decision.source}{outcome}) | "
            f"{_span(mine.estimate, mine.low, mine.high) if mine else 'not measured'}{ratio} | "
            f"**{r.verdict}**: {r.reason} |"
        )
    names = list(dict.fromkeys(f.config.name for r in rows for f in sorted(r.figures, key=_order)))
    lines += ["", "| C | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in rows:
        by_name = {f.config.name: f for f in r.figures}
        cells = []
        for name in names:
            f = by_name.get(name)
            text = _span(f.estimate, f.low, f.high) if f else "-"
            cells.append(f"**{text}**" if f is not None and f is r.best else text)
        lines.append(f"| {r.concurrency} | " + " | ".join(cells) + " |")
    return lines


def _order(f: OracleFigure) -> tuple[str, int, str]:
    return (f.config.method, f.config.k, f.config.name)


def header(
    started: datetime, load: tuple[float, float, float], oracle: CampaignData, decision: Decision
) -> str:
    from analysis.validity import validity_table, verdict_of

    validity = validity_table(oracle)
    reasons = str(validity["reasons"][0]).split("; ")[0] if not validity.is_empty() else ""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = shlex.join([".venv/bin/python", "benchmarks/decision_oracle.py", *sys.argv[1:]])
    return (
        f"{started:%Y-%m-%d %H:%M} UTC; nproc {cpus}; load average before {', '.join(f'{x:.2f}' for x in load)}; "
        f"oracle campaign {oracle.campaign_id} ({oracle.repeats} launches of each config, "
        f"{percent(AnalysisSettings().confidence)} t intervals over launches; validity "
        f"{verdict_of(validity)}{f': {reasons}' if reasons else ''}); decision {decision.decision_id} "
        f"({decision.outcome}; choice {decision.choice or SCHEDULE_OPTION!r}; verification campaign "
        f"{decision.campaign_id}, sweep {decision.source_campaign_id}); command: `{command}`"
    )


def _oracle_target(con: duckdb.DuckDBPyConnection, campaign_id: str) -> dict[str, Any]:
    row = con.execute("SELECT spec FROM campaigns WHERE campaign_id = ?", [campaign_id]).fetchone()
    if not row:
        raise InputError(f"no campaign {campaign_id!r} in the warehouse")
    return dict((_json(row[0]) or {}).get("target") or {})


def run(args: argparse.Namespace) -> int:
    from experiments.overrides import SpecOverrides, load_spec_with
    from experiments.plan import resolve_repo_path
    from warehouse.db import reader

    started, load, t0 = datetime.now(UTC), os.getloadavg(), time.monotonic()
    spec_path = resolve_repo_path(str(args.spec))
    with reader() as con:  # the decision first: nothing launches without one to judge
        if args.oracle_campaign:
            target: TargetSpec | dict[str, Any] = _oracle_target(con, args.oracle_campaign)
        else:  # the spec as the oracle runs it, checked before anything launches
            target = load_spec_with(spec_path, SpecOverrides(repeats=args.launches)).target
        decision = read_decision(con, *find_decision(con, args.decision, target))
    choices = decision_choices(decision)
    oracle_id = args.oracle_campaign or launch_oracle(spec_path, args.launches, args.label)
    with reader() as con:
        data = load_campaign(con, oracle_id)
    if data.repeats < MIN_LAUNCHES:
        raise InputError(
            f"the oracle campaign {oracle_id} has {data.repeats} launches; it needs {MIN_LAUNCHES}"
        )
    rows = oracle_rows(data, choices, decision.workload)
    agree = sum(r.agrees for r in rows)
    text = [
        f"# The oracle: {header(started, load, data, decision)}",
        "",
        *markdown(rows),
        "",
        f"{agree} of {len(rows)} loads agree; {time.monotonic() - t0:.0f} s.",
    ]
    print("\n".join(text))
    if args.report:
        args.report.write_text("\n".join(text) + "\n")
    return 0 if rows and agree == len(rows) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--spec", type=Path, default=Path("experiments/decision.yaml"), help="the decision's sweep spec"
    )
    parser.add_argument(
        "--launches",
        type=int,
        default=MIN_LAUNCHES,
        help=f"launches of each config (at least {MIN_LAUNCHES})",
    )
    parser.add_argument(
        "--decision",
        default=None,
        help='a decision id (`specgauge sql "FROM v_decision"`); default: the latest on the spec\'s target',
    )
    parser.add_argument(
        "--oracle-campaign",
        default=None,
        help="an oracle campaign already measured (its id): recompute the table without launching",
    )
    parser.add_argument(
        "--label", default="oracle", help="the oracle campaign's run label (another label: a fresh oracle)"
    )
    parser.add_argument(
        "--report", type=Path, default=None, help="also write the table to this markdown file"
    )
    args = parser.parse_args()
    if args.launches < MIN_LAUNCHES:
        parser.error(f"--launches: at least {MIN_LAUNCHES} launches of each config, got {args.launches}")
    try:
        return run(args)
    except SpecgaugeError as exc:  # bad input, no warehouse or no decision: one line, nothing launched
        print(f"decision_oracle: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
