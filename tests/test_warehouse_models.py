"""warehouse.models.one_query (every check of a model in one polars query) accepts exactly the frames the
model accepts: each constraint of each model, broken on its own in a real ingested frame, is refused by both;
values that every constraint allows (nulls where a column may be null) are accepted by both."""

from __future__ import annotations

from pathlib import Path

import pandera.errors
import pandera.polars as pa
import polars as pl
import pytest
from warehouse_fixtures import DATA_TABLES, RawBuilder, make_spec

import warehouse.ingest as ingest
from warehouse.kinds import MODELS
from warehouse.models import one_query

ROWS = 12  # enough for duplicates, few enough that each validation is pandera's fixed cost


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pl.DataFrame]:
    """The validated frames of a real ingest, by table (a few rows each)."""
    root = tmp_path_factory.mktemp("models")
    builder = RawBuilder(root / "raw", spec=make_spec(repeats=2))
    builder.write_all()
    seen: dict[str, pl.DataFrame] = {}
    checked = ingest._checked

    def keep(model: type[pa.DataFrameModel], frame: pl.DataFrame) -> pl.DataFrame:
        table = next(t for t, m in MODELS.items() if m is model)
        seen[table] = pl.concat([seen[table], frame]) if table in seen else frame
        return checked(model, frame)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ingest, "_checked", keep)
        report = ingest.ingest_raw(builder.raw_dir, root / "w.duckdb")
    assert report.ok, report.as_dict()
    return {t: f.head(ROWS) for t, f in seen.items()}


def accepts(schema: pa.DataFrameSchema | type[pa.DataFrameModel], frame: pl.DataFrame) -> bool:
    try:
        schema.validate(frame, lazy=True)
    except (pandera.errors.SchemaErrors, pandera.errors.SchemaError):
        return False
    return True


def breaking(column: pa.Column, name: str, frame: pl.DataFrame) -> list[tuple[str, object]]:
    """(what, value for row 0 of column `name`) that each break one constraint of `column` (its schema; a
    regex one's for every match); a duplicate is ("duplicate", None)."""
    out: list[tuple[str, object]] = []
    dtype = frame.schema[name]
    if not column.nullable:
        out.append(("null", None))
        if dtype.is_float():
            out.append(("NaN", float("nan")))
    if column.unique and frame.height > 1:
        out.append(("duplicate", None))
    for check in column.checks:
        stats = check.statistics
        if "min_value" in stats and stats["min_value"] is not None and dtype.is_numeric():
            low = stats["min_value"]
            out.append((check.name, low if check.name == "greater_than" else low - 1))
        if "max_value" in stats and stats["max_value"] is not None and dtype.is_numeric():
            high = stats["max_value"]
            out.append((check.name, high if check.name == "less_than" else high + 1))
        if "allowed_values" in stats:
            out.append((check.name, "not-an-allowed-value"))
        if check.name == "str_length":
            if stats.get("min_value"):
                out.append(("str_length min", ""))
            if stats.get("max_value"):
                out.append(("str_length max", "x" * (stats["max_value"] + 1)))
    return out


def with_value(frame: pl.DataFrame, name: str, what: str, value: object) -> pl.DataFrame:
    """`frame` with row 0 of `name` set to `value` (or row 1 set to row 0's value: "duplicate")."""
    row = pl.int_range(pl.len())
    if what == "duplicate":
        replaced = pl.when(row == 1).then(pl.col(name).first()).otherwise(pl.col(name))
    else:
        literal = pl.lit(value, dtype=frame.schema[name]) if value is not None else pl.lit(None)
        replaced = pl.when(row == 0).then(literal).otherwise(pl.col(name))
    return frame.with_columns(replaced.cast(frame.schema[name]).alias(name))


@pytest.mark.parametrize("table", DATA_TABLES)
def test_one_query_refuses_what_the_model_refuses(frames: dict[str, pl.DataFrame], table: str) -> None:
    frame, model = frames[table], MODELS[table]
    fused = one_query(model)
    assert accepts(model, frame) and accepts(fused, frame)
    assert fused.validate(frame).equals(model.validate(frame))
    schema = model.to_schema()
    cases = 0
    for key, column in schema.columns.items():
        names = [n for n in frame.columns if n == key] or [
            n for n in frame.columns if column.regex and pl.Series([n]).str.contains(key).item()
        ]
        for name in names[:2]:  # a regex column: its first two matches
            for what, value in breaking(column, name, frame):
                broken = with_value(frame, name, what, value)
                assert not accepts(model, broken), f"{table}.{name} {what}: the model itself accepts it"
                assert not accepts(fused, broken), f"{table}.{name} {what}: one_query accepts it"
                cases += 1
    assert cases > 0 or table == "spec_decode_positions"


@pytest.mark.parametrize("table", DATA_TABLES)
def test_one_query_accepts_nulls_where_the_model_does(frames: dict[str, pl.DataFrame], table: str) -> None:
    """Checks let nulls through in nullable columns (pandera's ignore_na): so must the fused query."""
    frame, model = frames[table], MODELS[table]
    fused = one_query(model)
    for key, column in model.to_schema().columns.items():
        if not column.nullable or column.regex or key not in frame.columns:
            continue
        nulled = with_value(frame, key, "null", None)
        assert accepts(model, nulled) == accepts(fused, nulled), f"{table}.{key}: null judged differently"


def test_one_query_runs_frame_checks_too(frames: dict[str, pl.DataFrame]) -> None:
    """A frame-level check (ttft_s <= e2e_s) broken with every column in range."""
    frame = frames["requests"]
    ok = frame.filter(pl.col("e2e_s").is_not_null() & pl.col("ttft_s").is_not_null()).head(3)
    broken = ok.with_columns((pl.col("e2e_s") + 1.0).alias("ttft_s"))
    assert not accepts(MODELS["requests"], broken)
    assert not accepts(one_query(MODELS["requests"]), broken)


def test_ingest_still_names_the_column_that_failed(tmp_path: Path) -> None:
    """A bad batch fails the fused query, then the model explains it: the quarantine names the column."""
    builder = RawBuilder(tmp_path / "raw", spec=make_spec())
    builder.write_all()
    cell = next(p for p in builder.raw_dir.rglob("requests.parquet"))
    requests = pl.read_parquet(cell)
    pl.DataFrame(requests.with_columns(pl.lit(-1.0).alias("queued_s"))).write_parquet(cell)
    report = ingest.ingest_raw(builder.raw_dir, tmp_path / "w.duckdb")
    reasons = [o.message for o in report.quarantined]
    assert len(reasons) == 1 and "queued_s" in reasons[0], reasons
    assert report.rows_by_table["cells"] > 0  # the other cells loaded


class _Uncapturable(pa.DataFrameModel):
    """A frame check that is not a plain `select` of an expression: one_query runs it as its own query."""

    x: pl.Int64 = pa.Field(ge=0)

    @pa.dataframe_check(error="x: must be even")
    def even(cls, data) -> pl.LazyFrame:
        return data.lazyframe.with_columns(pl.col("x").mod(2).alias("r")).select(pl.col("r") == 0)

    class Config:
        strict = True


def test_one_query_runs_a_check_it_cannot_capture_on_its_own() -> None:
    fused = one_query(_Uncapturable)
    assert accepts(fused, pl.DataFrame({"x": [0, 2, 4]}))
    assert not accepts(fused, pl.DataFrame({"x": [0, 3, 4]}))  # the uncaptured check
    assert not accepts(fused, pl.DataFrame({"x": [0, -2, 4]}))  # the captured one beside it
