-- 0017: latency sketches per cell and time block (issue 32; warehouse/sketches.py, docs/warehouse.md
-- "Percentiles from sketches"). One row per cell attempt, 10-second block of its measured window (by send
-- time), metric (ttft, tpot, e2e, itl) and DDSketch bucket (LogarithmicMapping, relative accuracy 0.01;
-- bucket -2147483648 counts the values indistinguishable from 0), written in the same transaction as the
-- cell. Cells ingested before this migration have none until `specgauge warehouse rebuild`.
CREATE TABLE cell_sketches (
    cell_key VARCHAR NOT NULL,
    block    INTEGER NOT NULL,
    metric   VARCHAR NOT NULL,
    bucket   INTEGER NOT NULL,
    count    BIGINT NOT NULL
);
