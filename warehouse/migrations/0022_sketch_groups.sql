-- 0022: the latency sketches merged per group, kept up to date at ingest (issue 32; warehouse/sketches.py
-- `roll_up`, docs/warehouse.md "Percentiles from sketches"). A group is (campaign_id, variant, workload,
-- load_label) over the latest ok attempt of each of its cells, as v_sketch_percentiles_merged merges them:
-- its rows are the sum of those cells' cell_sketches rows per metric and bucket, with the running count in
-- bucket order (cum) and the total (n), so that a percentile is one aggregate per group and metric (no join
-- to cells, no sum over every cell's rows, no window walk at query time). cell_sketches stays as it is
-- (per-cell percentiles, other merges). Backfilled here from the cell_sketches rows already stored.

CREATE TYPE sketch_metric AS ENUM ('ttft', 'tpot', 'e2e', 'itl');

CREATE TABLE sketch_groups (
    group_no     INTEGER NOT NULL,   -- numbered in the order groups first appear; the key of group_sketches
    campaign_id  VARCHAR NOT NULL,
    variant      VARCHAR NOT NULL,
    workload     VARCHAR NOT NULL,
    load_label   VARCHAR NOT NULL,
    method       VARCHAR,            -- the next five: any of the counted cells' (equal within a group)
    k            INTEGER,
    load_mode    VARCHAR,
    concurrency  INTEGER,
    rate         DOUBLE,
    cells        BIGINT NOT NULL     -- the group's latest ok attempts (0: none, and no group_sketches rows)
);

CREATE TABLE group_sketches (
    group_no  INTEGER NOT NULL,
    metric    sketch_metric NOT NULL,
    bucket    INTEGER NOT NULL,      -- as cell_sketches.bucket
    count     BIGINT NOT NULL,       -- summed over the group's counted cells and their blocks
    cum       BIGINT NOT NULL,       -- count of this bucket and every lower one (same group and metric)
    n         BIGINT NOT NULL        -- count of every bucket (same group and metric)
);

INSERT INTO sketch_groups
WITH groups AS (
    SELECT DISTINCT campaign_id, variant, workload, load_label FROM cells
), latest_ok AS (
    SELECT * FROM cells WHERE status = 'ok'
    QUALIFY row_number() OVER (PARTITION BY campaign_id, cell_id ORDER BY attempt DESC) = 1
)
SELECT (row_number() OVER (ORDER BY g.campaign_id, g.variant, g.workload, g.load_label))::INTEGER,
       g.campaign_id, g.variant, g.workload, g.load_label,
       any_value(c.method), any_value(c.k), any_value(c.load_mode), any_value(c.concurrency),
       any_value(c.rate), count(c.cell_key)
FROM groups g LEFT JOIN latest_ok c USING (campaign_id, variant, workload, load_label)
GROUP BY g.campaign_id, g.variant, g.workload, g.load_label;

INSERT INTO group_sketches
WITH latest_ok AS (
    SELECT cell_key, campaign_id, variant, workload, load_label FROM cells WHERE status = 'ok'
    QUALIFY row_number() OVER (PARTITION BY campaign_id, cell_id ORDER BY attempt DESC) = 1
), counts AS (
    SELECT g.group_no, s.metric::sketch_metric AS metric, s.bucket, sum(s.count)::BIGINT AS count
    FROM cell_sketches s
    JOIN latest_ok c USING (cell_key)
    JOIN sketch_groups g USING (campaign_id, variant, workload, load_label)
    GROUP BY ALL
)
SELECT group_no, metric, bucket, count,
       sum(count) OVER (PARTITION BY group_no, metric ORDER BY bucket ROWS UNBOUNDED PRECEDING)::BIGINT,
       sum(count) OVER (PARTITION BY group_no, metric)::BIGINT
FROM counts
ORDER BY group_no, metric, bucket;
