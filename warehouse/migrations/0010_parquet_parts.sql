-- Request-level rows leave DuckDB (warehouse/parts.py, docs/warehouse.md "Request rows in Parquet"): each
-- ingest batch writes its requests and gauges rows as immutable Parquet files under the parts root, listed
-- in warehouse_parts in the same transaction as the batch's other rows. `requests` and `gauges` become views
-- over the listed files (recreated by the writer as files are committed) plus the rows ingested before this
-- migration, kept in requests_legacy and gauges_legacy (a rebuild moves them to Parquet too).
ALTER TABLE requests RENAME TO requests_legacy;
ALTER TABLE gauges RENAME TO gauges_legacy;

CREATE TABLE warehouse_parts (
    file        VARCHAR PRIMARY KEY,  -- relative to the parts root: <table>/<campaign_id>/<name>.parquet
    table_name  VARCHAR NOT NULL,     -- requests | gauges
    campaign_id VARCHAR NOT NULL,
    rows        BIGINT NOT NULL,
    bytes       BIGINT NOT NULL,
    ingest_id   VARCHAR,
    created_utc TIMESTAMP NOT NULL
);

-- name -> value; `parts_root`: the folder the files are under (absolute), recorded by the writer.
CREATE TABLE warehouse_settings (
    name  VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);

CREATE VIEW requests AS SELECT * FROM requests_legacy;
CREATE VIEW gauges AS SELECT * FROM gauges_legacy;
