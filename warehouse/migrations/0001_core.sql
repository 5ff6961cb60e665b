-- 0001: campaigns, deployments, cells and their per-request, per-gauge and speculation tables, captures,
-- quarantine, ingest log, and the four analysis views. Documented column by column in docs/warehouse.md.
-- Keys derive from raw-artifact names; `sha256` is the hash of the artifact's files (see warehouse/hashing.py).
-- No foreign keys or secondary indexes: they slow bulk inserts and block later ALTERs; one transaction per
-- artifact keeps child rows and their parent together.

CREATE TABLE campaigns (
    campaign_id        VARCHAR PRIMARY KEY,
    spec_name          VARCHAR NOT NULL,
    label              VARCHAR,
    spec_sha256        VARCHAR,
    status             VARCHAR NOT NULL,
    created_utc        TIMESTAMP NOT NULL,
    runs               INTEGER NOT NULL,
    last_run_utc       TIMESTAMP,
    failed_cells       VARCHAR[],
    repeats            INTEGER,
    variant_order      VARCHAR[][],
    slo_ttft_p99_s     DOUBLE,
    slo_tpot_p99_s     DOUBLE,
    spec               JSON NOT NULL,
    specgauge_version  VARCHAR,
    git_revision       VARCHAR,
    hostname           VARCHAR,
    host               JSON,
    source_path        VARCHAR NOT NULL,
    sha256             VARCHAR NOT NULL
);

CREATE TABLE deployments (
    deployment_id      VARCHAR PRIMARY KEY,
    campaign_id        VARCHAR NOT NULL,
    variant            VARCHAR NOT NULL,
    method             VARCHAR NOT NULL,
    k                  INTEGER,
    variant_config     JSON NOT NULL,
    slot               VARCHAR NOT NULL,
    repeat             INTEGER,
    control            INTEGER,
    launch             INTEGER,
    launcher           VARCHAR NOT NULL,
    served_model_name  VARCHAR,
    base_url           VARCHAR,
    engine_command     VARCHAR[],
    engine_settings    JSON,
    engine_key         VARCHAR,
    engine_version     VARCHAR,
    kv_cache_tokens    BIGINT,
    max_model_len      INTEGER,
    status             VARCHAR NOT NULL,
    started_utc        TIMESTAMP,
    ready_s            DOUBLE,
    stopped_utc        TIMESTAMP,
    teardown           VARCHAR,
    job_id             VARCHAR,
    pid                BIGINT,
    extra              JSON,
    source_path        VARCHAR NOT NULL,
    sha256             VARCHAR NOT NULL
);

CREATE TABLE cells (
    cell_key                         VARCHAR PRIMARY KEY,
    campaign_id                      VARCHAR NOT NULL,
    cell_id                          VARCHAR NOT NULL,
    attempt                          INTEGER NOT NULL,
    deployment_id                    VARCHAR NOT NULL,
    variant                          VARCHAR NOT NULL,
    method                           VARCHAR NOT NULL,
    k                                INTEGER,
    variant_config                   JSON,
    repeat                           INTEGER NOT NULL,
    workload                         VARCHAR NOT NULL,
    workload_file                    VARCHAR,
    workload_sha256                  VARCHAR,
    prompt_ids                       VARCHAR[],
    load_label                       VARCHAR NOT NULL,
    load_mode                        VARCHAR NOT NULL,
    concurrency                      INTEGER,
    rate                             DOUBLE,
    arrival                          VARCHAR,
    requests_planned                 INTEGER,
    warmup                           INTEGER,
    time_cap_s                       DOUBLE,
    request_timeout_s                DOUBLE,
    endpoint                         VARCHAR,
    sampling                         JSON,
    sampling_key                     VARCHAR NOT NULL,
    temperature                      DOUBLE,
    max_tokens                       INTEGER,
    engine_settings                  JSON,
    engine_key                       VARCHAR NOT NULL,
    engine_version                   VARCHAR,
    kv_cache_tokens                  BIGINT,
    launcher                         VARCHAR,
    job_id                           VARCHAR,
    specgauge_version                VARCHAR,
    git_revision                     VARCHAR,
    hostname                         VARCHAR,
    t0_utc                           TIMESTAMP,
    started_utc                      TIMESTAMP,
    ended_utc                        TIMESTAMP,
    capped                           BOOLEAN,
    status                           VARCHAR NOT NULL,
    error                            VARCHAR,
    requests_total                   INTEGER,
    requests_ok                      INTEGER,
    requests_failed                  INTEGER,
    success_rate                     DOUBLE,
    request_errors                   JSON,
    wall_s                           DOUBLE,
    output_throughput_tok_s          DOUBLE,
    request_throughput_rps           DOUBLE,
    completion_tokens                BIGINT,
    prompt_tokens                    BIGINT,
    ttft_mean_s DOUBLE, ttft_p50_s DOUBLE, ttft_p90_s DOUBLE, ttft_p95_s DOUBLE, ttft_p99_s DOUBLE, ttft_n INTEGER,
    tpot_mean_s DOUBLE, tpot_p50_s DOUBLE, tpot_p90_s DOUBLE, tpot_p95_s DOUBLE, tpot_p99_s DOUBLE, tpot_n INTEGER,
    e2e_mean_s DOUBLE, e2e_p50_s DOUBLE, e2e_p90_s DOUBLE, e2e_p95_s DOUBLE, e2e_p99_s DOUBLE, e2e_n INTEGER,
    chunk_gap_mean_s DOUBLE, chunk_gap_p50_s DOUBLE, chunk_gap_p90_s DOUBLE, chunk_gap_p95_s DOUBLE,
    chunk_gap_p99_s DOUBLE, chunk_gap_n INTEGER,
    itl_per_token_mean_s DOUBLE, itl_per_token_p50_s DOUBLE, itl_per_token_p90_s DOUBLE,
    itl_per_token_p95_s DOUBLE, itl_per_token_p99_s DOUBLE, itl_per_token_n INTEGER,
    tokens_per_chunk_mean            DOUBLE,
    tokens_exact                     BOOLEAN,
    goodput_ttft_slo_s               DOUBLE,
    goodput_tpot_slo_s               DOUBLE,
    goodput_share                    DOUBLE,
    goodput_rate_rps                 DOUBLE,
    check_tokens_per_chunk_client    DOUBLE,
    check_tokens_per_chunk_server    DOUBLE,
    check_tokens_per_chunk_rel_diff  DOUBLE,
    check_tokens_per_chunk_ok        BOOLEAN,
    check_completion_tokens_client   DOUBLE,
    check_completion_tokens_server   DOUBLE,
    check_completion_tokens_rel_diff DOUBLE,
    check_completion_tokens_ok       BOOLEAN,
    gauge_kv_cache_usage_max         DOUBLE,
    gauge_kv_cache_usage_mean        DOUBLE,
    gauge_running_max                DOUBLE,
    gauge_waiting_max                DOUBLE,
    gauge_preemptions                DOUBLE,
    gauge_samples                    INTEGER,
    server_valid                     BOOLEAN,
    server_problem                   VARCHAR,
    source_path                      VARCHAR NOT NULL,
    sha256                           VARCHAR NOT NULL
);

-- One row per request of a cell (warm-up included, `phase`); the columns of tasks.load.records.REQUEST_SCHEMA,
-- with `index` renamed request_index. Unique on (cell_key, request_index), enforced by validation.
CREATE TABLE requests (
    cell_key          VARCHAR NOT NULL,
    request_index     INTEGER NOT NULL,
    prompt_id         VARCHAR NOT NULL,
    workload          VARCHAR NOT NULL,
    phase             VARCHAR NOT NULL,
    endpoint          VARCHAR NOT NULL,
    queued_s          DOUBLE NOT NULL,
    scheduled_s       DOUBLE,
    sent_s            DOUBLE,
    first_token_s     DOUBLE,
    last_token_s      DOUBLE,
    ended_s           DOUBLE,
    client_queue_s    DOUBLE,
    ttft_s            DOUBLE,
    e2e_s             DOUBLE,
    tpot_s            DOUBLE,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    chunks            INTEGER,
    chunk_offsets_s   DOUBLE[],
    chunk_tokens      INTEGER[],
    tokens_exact      BOOLEAN,
    finish_reason     VARCHAR,
    http_status       INTEGER,
    ok                BOOLEAN NOT NULL,
    error_class       VARCHAR,
    error             VARCHAR,
    token_ids         BIGINT[],
    text              VARCHAR
);

CREATE TABLE gauges (
    cell_key          VARCHAR NOT NULL,
    t_s               DOUBLE NOT NULL,
    kv_cache_usage    DOUBLE,
    running           BIGINT,
    waiting           BIGINT,
    preemptions_total BIGINT
);

CREATE TABLE spec_decode (
    cell_key               VARCHAR PRIMARY KEY,
    drafts                 BIGINT,
    draft_tokens           BIGINT,
    accepted_tokens        BIGINT,
    acceptance_rate        DOUBLE,
    mean_acceptance_length DOUBLE,
    decode_steps           BIGINT,
    inferred_step_time_s   DOUBLE
);

CREATE TABLE spec_decode_positions (
    cell_key        VARCHAR NOT NULL,
    position        INTEGER NOT NULL,
    acceptance_rate DOUBLE,
    PRIMARY KEY (cell_key, position)
);

CREATE TABLE captures (
    capture_key        VARCHAR PRIMARY KEY,
    capture_id         VARCHAR NOT NULL,
    campaign_id        VARCHAR NOT NULL,
    deployment_id      VARCHAR,
    variant            VARCHAR,
    corpus_file        VARCHAR,
    corpus_sha256      VARCHAR,
    prompt_ids         VARCHAR[],
    sampling           JSON,
    sampling_key       VARCHAR,
    engine_version     VARCHAR,
    specgauge_version  VARCHAR,
    git_revision       VARCHAR,
    started_utc        TIMESTAMP,
    ended_utc          TIMESTAMP,
    outputs            INTEGER NOT NULL,
    outputs_ok         INTEGER NOT NULL,
    source_path        VARCHAR NOT NULL,
    sha256             VARCHAR NOT NULL
);

CREATE TABLE capture_outputs (
    capture_key       VARCHAR NOT NULL,
    prompt_id         VARCHAR NOT NULL,
    workload          VARCHAR,
    ok                BOOLEAN NOT NULL,
    error             VARCHAR,
    text              VARCHAR,
    token_ids         BIGINT[],
    finish_reason     VARCHAR,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    PRIMARY KEY (capture_key, prompt_id)
);

-- Artifacts that could not be read or failed validation; nothing of them is in the tables above.
CREATE TABLE quarantine (
    kind            VARCHAR NOT NULL,
    artifact_key    VARCHAR NOT NULL,
    source_path     VARCHAR NOT NULL,
    sha256          VARCHAR,
    file            VARCHAR,
    column_name     VARCHAR,
    failing_rows    BIGINT[],
    reason          VARCHAR NOT NULL,
    quarantined_utc TIMESTAMP NOT NULL,
    PRIMARY KEY (kind, artifact_key)
);

-- What each ingest changed (skips are not logged: ingesting the same artifact twice changes nothing).
CREATE TABLE ingest_log (
    ingest_id    VARCHAR NOT NULL,
    at_utc       TIMESTAMP NOT NULL,
    kind         VARCHAR NOT NULL,
    artifact_key VARCHAR NOT NULL,
    sha256       VARCHAR,
    action       VARCHAR NOT NULL,
    rows         BIGINT,
    seconds      DOUBLE,
    note         VARCHAR
);

-- One row per cell: its latest attempt whose status is ok, with its speculation figures.
CREATE VIEW v_cells AS
WITH attempts AS (
    SELECT campaign_id, cell_id, count(*) AS attempts FROM cells GROUP BY campaign_id, cell_id
), latest_ok AS (
    SELECT * FROM cells WHERE status = 'ok'
    QUALIFY row_number() OVER (PARTITION BY campaign_id, cell_id ORDER BY attempt DESC) = 1
)
SELECT
    c.campaign_id, c.cell_id, c.attempt, a.attempts, c.cell_key, c.deployment_id,
    c.variant, c.method, c.k, c.repeat, c.workload, c.workload_file, c.workload_sha256,
    c.load_label, c.load_mode, c.concurrency, c.rate, c.arrival, c.requests_planned, c.warmup, c.endpoint,
    c.sampling, c.sampling_key, c.temperature, c.max_tokens,
    c.engine_settings, c.engine_key, c.engine_version, c.kv_cache_tokens, c.launcher,
    c.started_utc, c.ended_utc, c.capped,
    c.requests_total, c.requests_ok, c.requests_failed, c.success_rate,
    c.wall_s, c.output_throughput_tok_s, c.request_throughput_rps, c.completion_tokens, c.prompt_tokens,
    c.ttft_mean_s, c.ttft_p50_s, c.ttft_p90_s, c.ttft_p95_s, c.ttft_p99_s,
    c.tpot_mean_s, c.tpot_p50_s, c.tpot_p90_s, c.tpot_p95_s, c.tpot_p99_s,
    c.e2e_mean_s, c.e2e_p50_s, c.e2e_p90_s, c.e2e_p95_s, c.e2e_p99_s,
    c.chunk_gap_mean_s, c.chunk_gap_p50_s, c.chunk_gap_p90_s, c.chunk_gap_p95_s, c.chunk_gap_p99_s,
    c.itl_per_token_mean_s, c.itl_per_token_p50_s, c.itl_per_token_p90_s, c.itl_per_token_p95_s,
    c.itl_per_token_p99_s,
    c.tokens_per_chunk_mean, c.tokens_exact,
    c.goodput_ttft_slo_s, c.goodput_tpot_slo_s, c.goodput_share, c.goodput_rate_rps,
    sd.acceptance_rate, sd.mean_acceptance_length, sd.decode_steps, sd.inferred_step_time_s,
    c.gauge_kv_cache_usage_max, c.gauge_kv_cache_usage_mean, c.gauge_running_max, c.gauge_waiting_max,
    c.gauge_preemptions,
    c.check_tokens_per_chunk_ok, c.check_completion_tokens_ok, c.server_valid, c.server_problem
FROM latest_ok c
JOIN attempts a USING (campaign_id, cell_id)
LEFT JOIN spec_decode sd USING (cell_key);

-- Each speculative cell against the plain cell of the same campaign, workload (stratum and file hash),
-- load (mode, concurrency, rate), endpoint, sampling, engine settings and repeat. Ratios > 1 mean faster.
CREATE VIEW v_speedup AS
SELECT
    s.campaign_id, s.cell_id, s.variant, s.method, s.k, s.repeat, s.workload,
    s.load_label, s.load_mode, s.concurrency, s.rate,
    b.cell_id AS baseline_cell_id, b.variant AS baseline_variant,
    s.output_throughput_tok_s, b.output_throughput_tok_s AS baseline_output_throughput_tok_s,
    s.output_throughput_tok_s / NULLIF(b.output_throughput_tok_s, 0) AS throughput_speedup,
    s.request_throughput_rps / NULLIF(b.request_throughput_rps, 0) AS request_throughput_speedup,
    s.ttft_p50_s, b.ttft_p50_s AS baseline_ttft_p50_s, b.ttft_p50_s / NULLIF(s.ttft_p50_s, 0) AS ttft_p50_speedup,
    s.ttft_p95_s, b.ttft_p95_s AS baseline_ttft_p95_s, b.ttft_p95_s / NULLIF(s.ttft_p95_s, 0) AS ttft_p95_speedup,
    s.tpot_p50_s, b.tpot_p50_s AS baseline_tpot_p50_s, b.tpot_p50_s / NULLIF(s.tpot_p50_s, 0) AS tpot_p50_speedup,
    s.tpot_p95_s, b.tpot_p95_s AS baseline_tpot_p95_s, b.tpot_p95_s / NULLIF(s.tpot_p95_s, 0) AS tpot_p95_speedup,
    s.acceptance_rate, s.mean_acceptance_length,
    s.server_valid AND b.server_valid AS server_valid
FROM v_cells s
JOIN v_cells b
  ON b.method = 'none'
 AND s.method <> 'none'
 AND b.campaign_id = s.campaign_id
 AND b.workload = s.workload
 AND b.workload_sha256 IS NOT DISTINCT FROM s.workload_sha256
 AND b.load_mode = s.load_mode
 AND b.concurrency IS NOT DISTINCT FROM s.concurrency
 AND b.rate IS NOT DISTINCT FROM s.rate
 AND b.endpoint IS NOT DISTINCT FROM s.endpoint
 AND b.sampling_key = s.sampling_key
 AND b.engine_key = s.engine_key
 AND b.repeat = s.repeat;

-- Speculation figures of every speculative cell whose server counters are valid (no restart).
CREATE VIEW v_acceptance AS
SELECT
    v.campaign_id, v.cell_id, v.variant, v.method, v.k, v.repeat, v.workload,
    v.load_label, v.load_mode, v.concurrency, v.rate,
    sd.drafts, sd.draft_tokens, sd.accepted_tokens, sd.acceptance_rate, sd.mean_acceptance_length,
    (SELECT list(p.acceptance_rate ORDER BY p.position) FROM spec_decode_positions p
      WHERE p.cell_key = v.cell_key) AS acceptance_rate_per_position,
    sd.decode_steps, sd.inferred_step_time_s, v.tokens_per_chunk_mean, v.check_tokens_per_chunk_ok,
    v.tpot_p50_s
FROM v_cells v
JOIN spec_decode sd USING (cell_key)
WHERE v.method <> 'none' AND v.server_valid IS NOT FALSE;

-- The same, one row per cell and draft position.
CREATE VIEW v_acceptance_positions AS
SELECT
    v.campaign_id, v.cell_id, v.variant, v.method, v.k, v.repeat, v.workload, v.load_label,
    p.position, p.acceptance_rate
FROM v_cells v
JOIN spec_decode_positions p USING (cell_key)
WHERE v.method <> 'none' AND v.server_valid IS NOT FALSE;

-- Serving capacity per campaign, variant, workload and load (open-loop rate or closed-loop concurrency),
-- over repeats: achieved throughput, goodput, tail latency and whether every repeat met the campaign's SLO.
CREATE VIEW v_capacity AS
WITH per_cell AS (
    SELECT
        v.*,
        coalesce(c.slo_ttft_p99_s, v.goodput_ttft_slo_s) AS slo_ttft,
        coalesce(c.slo_tpot_p99_s, v.goodput_tpot_slo_s) AS slo_tpot
    FROM v_cells v
    LEFT JOIN campaigns c USING (campaign_id)
)
SELECT
    campaign_id, variant, method, k, workload, load_mode, load_label, concurrency, rate AS offered_rate_rps,
    count(*) AS repeats,
    avg(request_throughput_rps) AS achieved_rps,
    avg(output_throughput_tok_s) AS output_throughput_tok_s,
    avg(goodput_rate_rps) AS goodput_rps,
    avg(goodput_share) AS goodput_share,
    avg(ttft_p99_s) AS ttft_p99_s,
    max(ttft_p99_s) AS ttft_p99_s_worst,
    avg(tpot_p99_s) AS tpot_p99_s,
    max(tpot_p99_s) AS tpot_p99_s_worst,
    any_value(slo_ttft) AS slo_ttft_p99_s,
    any_value(slo_tpot) AS slo_tpot_p99_s,
    -- false as soon as one repeat misses a limit; true when every repeat has both figures and meets both
    CASE
        WHEN bool_or(ttft_p99_s > slo_ttft OR tpot_p99_s > slo_tpot) THEN false
        WHEN count(ttft_p99_s) = count(*) AND count(tpot_p99_s) = count(*)
             AND count(slo_ttft) = count(*) AND count(slo_tpot) = count(*) THEN true
    END AS slo_met
FROM per_cell
GROUP BY campaign_id, variant, method, k, workload, load_mode, load_label, concurrency, rate;
