"""The confirm-adaptation flow: does a new EAGLE-3 head pay on a running server, and for which strata?

One deployment of the spec's eagle3 variant, launched with hot_swap and the old head. Then a randomised
schedule (tasks.adapt.schedule): per repeat every (head, stratum) block once in a seeded order; a block swaps
the head in when it is not serving (tasks.drafters.swap, no restart) and runs the stratum's cells. After the
schedule the new head is swapped in once more and the capture corpus is captured greedily; the old head is
swapped back in at the end on every exit path, and the deployment torn down. The gate compares that capture
with plain captures (an earlier campaign's, `plain_from`, or two plain launches of its own); the new head's
cells against the old head's, paired by repeat, give the ratios and the benefit rule's verdict per stratum
(analysis.adaptation), written as RAW/<campaign>/adaptations/<id>.json and ingested. docs/adaptation.md.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from analysis.adaptation import Rule, cells_frame, confirm, write_adaptation_report
from artifacts import ids, layout
from artifacts.store import read_json
from blocks import SavedBlocks, resolve_launcher_config
from experiments.plan import CellPlan, resolve_repo_path
from experiments.spec import ExperimentSpec, LoadSpec, Variant, load_spec
from flows.ingest import ingest as ingest_flow
from specgauge.errors import InputError
from specgauge.provenance import utc_now
from tasks import adapt
from tasks.adapt import Block, HeadRef, PlainCaptures
from tasks.campaign import next_launch_id
from tasks.capture import capture
from tasks.cell import run_cell
from tasks.drafters.contract import check_eagle3_head
from tasks.gate import GateRefusal, gate, write_verdict
from tasks.health import wait_ready
from tasks.launch import Launcher, deployed, launcher_for, reap_leftovers
from tasks.launch.base import Deployment
from workloads.schema import Corpus, load_corpus


class Inputs:
    """Everything the confirmation is defined by, resolved and checked before anything is launched."""

    def __init__(
        self,
        spec_path: str,
        new_head: str,
        *,
        target_stratum: str,
        old_head: str | None = None,
        variant: str | None = None,
        strata: list[str] | None = None,
        concurrencies: list[int] | None = None,
        requests: int | None = None,
        repeats: int = 3,
        seed: int = 0,
        rule: Rule = Rule(),
        plain_from: str | None = None,
        gate: bool = True,
        label: str | None = None,
    ) -> None:
        self.spec_path = resolve_repo_path(spec_path)
        self.spec: ExperimentSpec = load_spec(self.spec_path)
        chosen = adapt.adaptation_variant(self.spec, variant)
        old_value = old_head or chosen.eagle_head
        if not old_value:
            raise InputError(f"variant {chosen.name!r} names no eagle_head: give the old head")
        self.old = adapt.resolve_head(old_value, label="old")
        self.new = adapt.resolve_head(new_head, label="new")
        if self.old.sha256 == self.new.sha256:
            raise InputError(
                f"the new head {self.new.path} is the old head ({self.old.path}): nothing to confirm"
            )
        target_dir = resolve_repo_path(self.spec.target_of(chosen).model)
        for head in (self.old, self.new):  # a head that breaks the contract costs no engine start
            try:
                check_eagle3_head(target_dir, head.path)
            except InputError as exc:
                raise InputError(f"{head.label} head {head.path}: {exc}") from None
        self.variant: Variant = chosen.model_copy(update={"eagle_head": str(self.old.path)})
        self.corpora = strata_corpora(self.spec)
        self.strata = sorted(strata or self.corpora)
        unknown = [s for s in self.strata if s not in self.corpora]
        if unknown:
            raise InputError(
                f"strata {unknown} are not in the spec's workloads ({', '.join(sorted(self.corpora))})"
            )
        if target_stratum not in self.strata:
            raise InputError(f"target stratum {target_stratum!r} is not among the strata {self.strata}")
        self.target_stratum = target_stratum
        update: dict[str, Any] = {}
        if concurrencies:
            update.update(concurrencies=tuple(concurrencies), rates=())
        if requests is not None:
            update["requests"] = requests
        self.load: LoadSpec = self.spec.load.model_copy(update=update) if update else self.spec.load
        self.repeats, self.seed, self.rule = repeats, seed, rule
        self.blocks = adapt.schedule(self.strata, repeats, seed)
        self.plain_from, self.gate, self.label = plain_from, gate, label
        self.loads = load_labels(self.load)
        digest = adapt.inputs_digest(
            {
                "spec": self.spec.model_dump(mode="json"),
                "variant": self.variant.name,
                "old": self.old.sha256,
                "new": self.new.sha256,
                "strata": self.strata,
                "target": target_stratum,
                "load": self.load.model_dump(mode="json"),
                "repeats": repeats,
                "seed": seed,
                "rule": asdict(rule),
                "plain_from": plain_from,
                "gate": gate,
            }
        )
        self.spec_sha256 = digest
        self.campaign_id = ids.campaign_id(f"{self.spec.name}-adapt", digest, label)
        self.adaptation_id = ids.adaptation_id(self.variant.name, target_stratum, digest)
        self.capture_id = ids.capture_id(f"{self.variant.name}.new", 0)

    def cell_plans(self, block: Block) -> list[CellPlan]:
        file, _ = self.corpora[block.stratum]
        plans = []
        for concurrency in self.load.concurrencies:
            label = ids.load_label("closed", concurrency, None)
            cell = ids.adapted_cell_id(self.variant.name, block.head, block.repeat, block.stratum, label)
            plans.append(CellPlan(cell, block.stratum, "closed", concurrency, None, file))
        for rate in self.load.rates:
            label = ids.load_label("open", None, rate)
            cell = ids.adapted_cell_id(self.variant.name, block.head, block.repeat, block.stratum, label)
            plans.append(CellPlan(cell, block.stratum, "open", None, rate, file))
        return plans


def strata_corpora(spec: ExperimentSpec) -> dict[str, tuple[str, Corpus]]:
    """stratum -> (workload file, its corpus) over the spec's workloads (a stratum in two files: refused)."""
    out: dict[str, tuple[str, Corpus]] = {}
    for ref in spec.workloads:
        corpus = load_corpus(resolve_repo_path(ref.file))
        for stratum in ref.strata or corpus.strata:
            if stratum in out and out[stratum][0] != ref.file:
                raise InputError(f"stratum {stratum!r} is in {out[stratum][0]} and {ref.file}: name it once")
            out[stratum] = (ref.file, corpus)
    return out


def load_labels(load: LoadSpec) -> list[str]:
    return [ids.load_label("closed", c, None) for c in load.concurrencies] + [
        ids.load_label("open", None, r) for r in load.rates
    ]


class ServerSwapper:
    """The real swapper: tasks.drafters.swap against the running deployment."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def swap(self, head_dir: Path) -> dict[str, Any]:
        from tasks.drafters.swap import swap_head

        record = swap_head(self.deployment, head_dir)
        return asdict(record)

    def serving(self) -> str | None:
        from tasks.drafters.swap import serving_drafter_sha256

        return serving_drafter_sha256(self.deployment)


# --- steps ------------------------------------------------------------------------------------------------


def launch_ready(inputs: Inputs, launcher: Launcher, directory: Path, slot: str, variant: Variant):
    """A context manager: the deployment of `variant` in `slot`, ready, torn down on exit."""
    launch_id = next_launch_id(directory, slot)
    return deployed(
        launcher,
        inputs.spec.target_of(variant),
        variant,
        deployment_id=launch_id,
        directory=layout.deployment_dir(directory, launch_id),
    )


def _ready(deployment: Deployment, launcher: Launcher, inputs: Inputs) -> None:
    wait_ready(deployment, launcher, timeout_s=inputs.spec.launcher.ready_timeout_s)
    launcher.collect_facts(deployment)
    deployment.save()


def plain_captures_step(
    inputs: Inputs, launcher: Launcher, directory: Path, max_tokens: int | None
) -> PlainCaptures:
    """The gate's plain side: an earlier campaign's plain captures (`plain_from`), else two plain launches of
    this confirmation (the first captured twice: the same-deployment control; the second once: the
    cross-deployment control)."""
    raw = directory.parent
    if inputs.plain_from:
        return adapt.plain_captures_of(
            raw / inputs.plain_from,
            target_model=str(resolve_repo_path(inputs.spec.target.model)),
            max_tokens=max_tokens,
        )
    plain = inputs.spec.plain
    corpus = load_corpus(resolve_repo_path(inputs.spec.capture.corpus))
    taken: list[Path] = []
    for slot, names in (
        (
            ids.slot_id(inputs.campaign_id, plain.name, 0),
            [ids.capture_id(plain.name, 0), ids.repeat_capture_id(plain.name, 0)],
        ),
        (ids.control_slot_id(inputs.campaign_id, plain.name, 1), [ids.control_capture_id(plain.name, 1)]),
    ):
        todo = [n for n in names if not layout.capture_complete(layout.capture_dir(directory, n))]
        if todo:
            with launch_ready(inputs, launcher, directory, slot, plain) as deployment:
                _ready(deployment, launcher, inputs)
                for name in todo:
                    _capture(deployment, inputs, corpus, directory, name, max_tokens)
        taken += [layout.capture_dir(directory, n) for n in names]
    base, again, other = taken
    return PlainCaptures(base=base, controls=((base, again), (base, other)), campaign_id=inputs.campaign_id)


def _capture(
    deployment: Deployment,
    inputs: Inputs,
    corpus: Corpus,
    directory: Path,
    capture_id: str,
    max_tokens: int | None,
) -> Path:
    return capture(
        deployment,
        corpus,
        sampling=inputs.spec.sampling_of(deployment.variant),
        max_tokens=max_tokens,
        limit=inputs.spec.capture.limit,
        raw_campaign_dir=directory,
        capture_id=capture_id,
        campaign_id=inputs.campaign_id,
    )


def gate_step(
    inputs: Inputs, directory: Path, plain: PlainCaptures | None, error: str | None
) -> dict[str, Any]:
    """The gate on the new head's capture against plain; a refusal or missing input is recorded, not raised."""
    if error is not None or plain is None:
        return {"error": error or "no plain captures", "capture_id": inputs.capture_id}
    treatment = layout.capture_dir(directory, inputs.capture_id)
    try:
        verdict = gate((plain.base, treatment), list(plain.controls))
    except GateRefusal as exc:
        return {
            "error": f"gate refused: {exc}",
            "capture_id": inputs.capture_id,
            "plain_campaign_id": plain.campaign_id,
        }
    path = layout.verdict_file(directory, verdict.verdict_id)
    if not path.exists():
        write_verdict(verdict, directory)
    return {
        "verdict_id": verdict.verdict_id,
        "passed": verdict.passed,
        "outcome": verdict.outcome,
        "claim": verdict.claim,
        "plain_campaign_id": plain.campaign_id,
        "capture_id": inputs.capture_id,
    }


def cell_rows(
    directory: Path, results: list[adapt.BlockResult]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The analysis frames' rows: each block's cells as their latest attempt's summary recorded them, and
    their requests that carry vLLM's per-request acceptance (analysis.adaptation.REQUEST_ROW_SCHEMA: the
    measured phase, ok, spec_steps > 0). None from a requests.parquet written before those columns existed,
    nor from requests the engine gave no acceptance for (null: plain, older vLLM)."""
    import polars as pl

    wanted = ("prompt_id", "phase", "ok", "spec_steps", "spec_accepted_tokens")
    rows = []
    requests = []
    cells = layout.cells_dir(directory)
    for result in results:
        for cell_id, status in result.cells:
            attempt = layout.cell_attempts(cells, cell_id)[-1]
            summary = read_json(attempt / layout.SUMMARY)
            meta = read_json(attempt / layout.META)
            spec = summary.get("speculation") or {}
            tpot = ((summary.get("latency_s") or {}).get("tpot") or {}).get("p50")
            counts = summary.get("requests") or {}
            drafter = (meta.get("deployment") or {}).get("drafter") or {}
            rows.append(
                {
                    "cell_id": cell_id,
                    "head": result.block.head,
                    "repeat": result.block.repeat,
                    "stratum": result.block.stratum,
                    "load_label": cell_id.rsplit(".", 1)[-1],
                    "status": status,
                    "requests_ok": counts.get("ok"),
                    "requests_total": counts.get("total"),
                    "mean_acceptance_length": spec.get("mean_acceptance_length"),
                    "output_throughput_tok_s": summary.get("output_throughput_tok_s"),
                    "tpot_p50_s": tpot,
                    "drafter_sha256": drafter.get("sha256"),
                }
            )
            path = attempt / layout.REQUESTS
            if not path.exists() or not set(wanted) <= set(pl.read_parquet_schema(path)):
                continue
            measured = pl.read_parquet(path, columns=list(wanted)).filter(
                (pl.col("phase") == "measured")
                & pl.col("ok").fill_null(False)
                & (pl.col("spec_steps") > 0)
                & pl.col("spec_accepted_tokens").is_not_null()
                & pl.col("prompt_id").is_not_null()
            )
            where = {k: rows[-1][k] for k in ("cell_id", "head", "repeat", "stratum", "load_label")}
            requests += [
                {**where, **r}
                for r in measured.select("prompt_id", "spec_steps", "spec_accepted_tokens").to_dicts()
            ]
    return rows, requests


def hash_notes(rows: list[dict[str, Any]], heads: dict[str, HeadRef]) -> list[str]:
    """Cells whose recorded drafter hash is not the head the schedule had serving (a swap the cell's facts
    did not see): named, so that a reader can tell."""
    notes = []
    for row in rows:
        expected = heads[row["head"]].sha256
        if row["drafter_sha256"] and expected and row["drafter_sha256"] != expected:
            notes.append(
                f"{row['cell_id']}: its facts name drafter {row['drafter_sha256'][:12]}, the {row['head']} head "
                f"is {expected[:12]}"
            )
    return notes


def run_confirmation(inputs: Inputs, *, ingest: bool = True, log: Any = None) -> dict[str, Any]:
    """The whole confirmation (module docstring). Returns the document as written (or the earlier run's)."""
    from specgauge.settings import get_settings

    raw = get_settings().raw_dir
    directory = layout.campaign_dir(raw, inputs.campaign_id)
    earlier = adapt.earlier_adaptation(directory, inputs.adaptation_id)
    if earlier is not None and earlier.get("status") == "ok":
        return earlier
    if earlier is not None:  # the document is written once: a new attempt is a new confirmation
        raise InputError(
            f"confirmation {inputs.adaptation_id} failed earlier ({earlier.get('error')}); run it again with a "
            "label (--label) for a new confirmation"
        )
    slot = ids.slot_id(inputs.campaign_id, inputs.variant.name, 0)
    all_cells = [p.cell_id for b in inputs.blocks for p in inputs.cell_plans(b)]
    adapt.record_adaptation_campaign(
        directory,
        inputs.campaign_id,
        inputs.spec,
        name=f"{inputs.spec.name}-adapt",
        spec_sha256=inputs.spec_sha256,
        label=inputs.label,
        slot=slot,
        variant=inputs.variant.name,
        blocks=inputs.blocks,
        cells=all_cells,
        captures=[inputs.capture_id] if inputs.gate else [],
    )
    reap_leftovers(saved=SavedBlocks())
    launcher = launcher_for(inputs.spec, resolve_launcher_config(inputs.spec.launcher))
    heads = {"old": inputs.old, "new": inputs.new}
    started = utc_now()
    max_tokens = inputs.spec.capture.max_tokens
    if inputs.gate and inputs.plain_from:  # the new head's capture must be capped like the plain ones
        plain_early = adapt.plain_captures_of(
            raw / inputs.plain_from,
            target_model=str(resolve_repo_path(inputs.spec.target.model)),
            max_tokens=None,
        )
        max_tokens = read_json(plain_early.base / layout.META).get("max_tokens")
    capture_corpus = load_corpus(resolve_repo_path(inputs.spec.capture.corpus)) if inputs.gate else None
    deployment_id = None
    result: adapt.ScheduleResult | None = None
    error: str | None = None
    with launch_ready(inputs, launcher, directory, slot, inputs.variant) as deployment:
        deployment_id = deployment.id
        _ready(deployment, launcher, inputs)
        if log:
            log.info("%s ready (old head %s); %d blocks", deployment.id, inputs.old.path, len(inputs.blocks))
        swapper = ServerSwapper(deployment)

        def run_cells(block: Block) -> list[tuple[str, str]]:
            out = []
            for plan in inputs.cell_plans(block):
                _, corpus = inputs.corpora[block.stratum]
                outcome = run_cell(
                    deployment,
                    plan,
                    campaign_id=inputs.campaign_id,
                    repeat=block.repeat,
                    corpus=corpus,
                    sampling=inputs.spec.sampling_of(inputs.variant),
                    load=inputs.load,
                    slo=inputs.spec.slo,
                    cells_dir=layout.cells_dir(directory),
                    seed=inputs.spec.seed,
                )
                if log:
                    mal = (
                        outcome.summary.speculation.mean_acceptance_length
                        if outcome.summary.speculation
                        else None
                    )
                    log.info(
                        "block %d (%s head): %s %s, MAL %s",
                        block.position,
                        block.head,
                        plan.cell_id,
                        outcome.status,
                        mal,
                    )
                out.append((plan.cell_id, outcome.status))
            return out

        def capture_new(tracked: adapt.Swapper) -> None:
            assert capture_corpus is not None
            if layout.capture_complete(layout.capture_dir(directory, inputs.capture_id)):
                return
            if tracked.serving() != inputs.new.sha256:  # the last block may have left it serving
                tracked.swap(inputs.new.path)
            served = tracked.serving()
            if served is not None and served != inputs.new.sha256:
                raise adapt.AdaptationError(f"after the swap for the gate the server serves {served[:12]}")
            _capture(deployment, inputs, capture_corpus, directory, inputs.capture_id, max_tokens)

        result = adapt.ScheduleResult()
        try:
            adapt.run_schedule(
                inputs.blocks,
                heads,
                swapper,
                run_cells,
                after=capture_new if inputs.gate else None,
                result=result,
            )
        except Exception as exc:  # written as a failed confirmation below; the deployment goes down first
            error = f"{type(exc).__name__}: {exc}"
    plain: PlainCaptures | None = None
    gate_error: str | None = None
    if inputs.gate and error is None:
        try:
            plain = plain_captures_step(inputs, launcher, directory, max_tokens)
        except Exception as exc:  # no plain side: no verdict, said so
            gate_error = f"{type(exc).__name__}: {exc}"
    gate_facts = gate_step(inputs, directory, plain, gate_error) if inputs.gate and error is None else None
    rows, requests = cell_rows(directory, result.blocks) if result is not None else ([], [])
    verdict = confirm(
        cells_frame(rows),
        target_stratum=inputs.target_stratum,
        gate_passed=None if gate_facts is None else gate_facts.get("passed"),
        rule=inputs.rule,
        requests=requests,
    )
    notes = hash_notes(rows, heads)
    document = {
        "adaptation_id": inputs.adaptation_id,
        "campaign_id": inputs.campaign_id,
        "deployment_id": deployment_id,
        "variant": inputs.variant.name,
        "target_stratum": inputs.target_stratum,
        "strata": inputs.strata,
        "loads": inputs.loads,
        "repeats": inputs.repeats,
        "seed": inputs.seed,
        "min_effect": inputs.rule.min_effect,
        "max_harm": inputs.rule.max_harm,
        "confidence": inputs.rule.confidence,
        "gain_metric": inputs.rule.gain_metric,
        "old_head": inputs.old.facts(),
        "new_head": inputs.new.facts(),
        "schedule": [b.facts() for b in result.blocks] if result else [],
        "swaps": result.swaps if result else [],
        "swapped_back": bool(result and result.swapped_back),
        "final_sha256": result.final_sha256 if result else None,
        "gate": gate_facts,
        **verdict,
        "notes": notes,
        "status": "ok" if error is None and result is not None and result.error is None else "failed",
        "error": (result.error if result else None)
        or error,  # the schedule's error names a failed swap-back too
        "started_utc": started,
        "ended_utc": utc_now(),
    }
    path = adapt.write_adaptation(directory, document)
    document["path"] = str(path)
    if ingest:
        ingest_flow(raw_dir=str(raw), campaign_id=inputs.campaign_id)
    return document


def _reap_on_exit(flow: Any, flow_run: Any, state: Any) -> None:
    """on_cancellation/on_crashed: stop what this run launched and did not tear down (by the confirmation's
    campaign id when its inputs can still be read, else everything this process left)."""
    try:
        p = flow_run.parameters
        prefix = (
            Inputs(
                p["spec_path"],
                p["new_head"],
                target_stratum=p["target_stratum"],
                old_head=p.get("old_head"),
                variant=p.get("variant"),
                strata=p.get("strata"),
                concurrencies=p.get("concurrencies"),
                requests=p.get("requests"),
                repeats=p.get("repeats", 3),
                seed=p.get("seed", 0),
                rule=Rule(
                    p.get("min_effect", 0.10),
                    p.get("max_harm", 0.05),
                    gain_metric=p.get("gain_metric", "throughput"),
                ),
                plain_from=p.get("plain_from"),
                gate=p.get("gate", True),
                label=p.get("label"),
            ).campaign_id
            + "."
        )
    except Exception:
        prefix = ""
    reap_leftovers(include_own=True, id_prefix=prefix, saved=SavedBlocks())


@task(name="confirm-adaptation-run", cache_policy=NO_CACHE)
def _run_task(inputs: Inputs) -> dict[str, Any]:
    """The measurement; the flow ingests and reports afterwards, as subflows of its own."""
    return run_confirmation(inputs, ingest=False, log=get_run_logger())


@flow(name="confirm-adaptation", on_cancellation=[_reap_on_exit], on_crashed=[_reap_on_exit], log_prints=True)
def confirm_adaptation(
    spec_path: str,
    new_head: str,
    target_stratum: str,
    old_head: str | None = None,
    variant: str | None = None,
    strata: list[str] | None = None,
    concurrencies: list[int] | None = None,
    requests: int | None = None,
    repeats: int = 3,
    min_effect: float = 0.10,
    max_harm: float = 0.05,
    gain_metric: str = "throughput",
    seed: int = 0,
    plain_from: str | None = None,
    gate: bool = True,
    label: str | None = None,
    ingest: bool = True,
) -> dict[str, Any]:
    """Confirm that a new EAGLE-3 head pays on a running server: old and new head measured in a randomised
    schedule of hot swaps on one deployment, the gate after the swap, the benefit rule per stratum.

    Args:
        spec_path: The experiment spec (target, the eagle3 variant, workloads, load, launcher).
        new_head: The new head: a directory, or a drafter artifact id (RAW/drafters/<id>).
        target_stratum: The stratum the head was adapted for (the rule's target).
        old_head: The old head (default: the variant's eagle_head).
        variant: The spec's eagle3 variant (default: the only one).
        strata: Strata to measure (default: every stratum of the spec's workloads).
        concurrencies: Closed-loop concurrencies instead of the spec's (e.g. 1).
        requests: Measured requests per cell instead of the spec's.
        repeats: Passes over every (head, stratum) block.
        min_effect: Minimum gain on a stratum (0.10: the interval must lie above 1.10).
        max_harm: Largest loss another stratum may take (0.05).
        gain_metric: throughput, mean_acceptance_length or tpot_p50.
        seed: Seed of the block order.
        plain_from: A campaign whose plain captures the gate reuses (same target, corpus, sampling); empty:
            two plain launches of this run.
        gate: Run the greedy-correctness gate with the new head serving.
        label: A run label: a new confirmation instead of resuming.
        ingest: Load the raw artifacts into the warehouse afterwards.
    """
    # issue 34: from a deployment (the UI), specs only under experiments/ or SPECGAUGE_SPEC_DIRS
    from experiments.loader import flow_spec_path
    from specgauge.flow_paths import flow_path, input_roots

    flow_spec_path(spec_path)
    flow_path(new_head, "new_head", input_roots())
    flow_path(old_head, "old_head", input_roots())
    inputs = Inputs(
        spec_path,
        new_head,
        target_stratum=target_stratum,
        old_head=old_head,
        variant=variant,
        strata=strata,
        concurrencies=concurrencies,
        requests=requests,
        repeats=repeats,
        seed=seed,
        rule=Rule(min_effect=min_effect, max_harm=max_harm, gain_metric=gain_metric),
        plain_from=plain_from,
        gate=gate,
        label=label,
    )
    document = _run_task(inputs)
    if ingest:
        ingest_flow(raw_dir=str(Path(document["path"]).parents[2]), campaign_id=inputs.campaign_id)
        document["report"] = str(
            write_adaptation_report(inputs.campaign_id, adaptation_id=document["adaptation_id"])
        )
    get_run_logger().info("confirmation %s: %s", document["adaptation_id"], document["summary"])
    return document
