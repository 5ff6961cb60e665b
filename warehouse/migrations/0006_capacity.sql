-- 0006: capacity searches (RAW/<campaign>/capacity/<search_id>.json, written by tasks/capacity.py): one row
-- per deployment's search under the spec's p99 limits, and its points in the order they ran, each judged
-- by order-statistic confidence bounds of its p99 (met | violated | undecided). Every point is also a cell.

CREATE TABLE capacity_searches (
    search_key          VARCHAR PRIMARY KEY,   -- <campaign_id>/<search_id>
    search_id           VARCHAR NOT NULL,      -- <variant>.r<repeat>.<stratum>
    campaign_id         VARCHAR NOT NULL,
    deployment_id       VARCHAR NOT NULL,
    variant             VARCHAR NOT NULL,
    method              VARCHAR NOT NULL,
    k                   INTEGER,
    variant_config      JSON NOT NULL,
    "repeat"            INTEGER NOT NULL,
    workload            VARCHAR NOT NULL,
    workload_sha256     VARCHAR,
    sampling            JSON,
    quantile            DOUBLE NOT NULL,
    confidence          DOUBLE NOT NULL,
    ttft_limit_s        DOUBLE NOT NULL,
    tpot_limit_s        DOUBLE NOT NULL,
    requests_per_point  INTEGER NOT NULL,
    capacity_rps        DOUBLE,                -- the highest rate that met both limits, every lower point too
    first_failing_rps   DOUBLE,                -- the lowest rate that did not (violated or undecided)
    converged           BOOLEAN NOT NULL,
    stopped_because     VARCHAR NOT NULL,
    n_points            INTEGER NOT NULL,
    settings            JSON NOT NULL,
    started_utc         TIMESTAMP,
    ended_utc           TIMESTAMP,
    specgauge_version   VARCHAR,
    git_revision        VARCHAR,
    source_path         VARCHAR NOT NULL,
    sha256              VARCHAR NOT NULL
);

CREATE TABLE capacity_points (
    search_key     VARCHAR NOT NULL,
    point_index    INTEGER NOT NULL,
    rate_rps       DOUBLE NOT NULL,
    cell_id        VARCHAR NOT NULL,
    requests       INTEGER NOT NULL,
    failed         INTEGER NOT NULL,
    achieved_rps   DOUBLE,
    goodput_rps    DOUBLE,
    ttft_p_s       DOUBLE,                     -- observed quantile (null: failures reach it)
    ttft_lower_s   DOUBLE,
    ttft_upper_s   DOUBLE,
    ttft_verdict   VARCHAR NOT NULL,
    tpot_p_s       DOUBLE,
    tpot_lower_s   DOUBLE,
    tpot_upper_s   DOUBLE,
    tpot_verdict   VARCHAR NOT NULL,
    status         VARCHAR NOT NULL,
    verdict        VARCHAR NOT NULL,
    PRIMARY KEY (search_key, point_index)
);
