-- 0008: measurement validity (issue 18). The client's own error measured at each campaign's start
-- (RAW/<campaign>/calibration/<calibration_id>.json, tasks/load/calibration.py), and the analysis' validity
-- figures per campaign (A/A gap, repeat spread, client error: analysis/validity.py), the engine settings that
-- differ between a speculative deployment and its plain baseline beyond speculation (confounds), and the
-- benefit rule's new parts in the decisions.

CREATE TABLE client_calibrations (
    calibration_key     VARCHAR PRIMARY KEY,   -- <campaign_id>/<calibration_id>
    calibration_id      VARCHAR NOT NULL,
    campaign_id         VARCHAR NOT NULL,
    started_utc         TIMESTAMP,
    ended_utc           TIMESTAMP,
    mode                VARCHAR NOT NULL,      -- closed | open
    concurrency         INTEGER NOT NULL,
    rate                DOUBLE,
    requests            INTEGER NOT NULL,
    requests_ok         INTEGER NOT NULL,
    requests_failed     INTEGER NOT NULL,
    injected_ttft_s     DOUBLE NOT NULL,
    injected_step_s     DOUBLE NOT NULL,
    ttft_error_p50_s    DOUBLE,                -- measured - injected TTFT
    ttft_error_p99_s    DOUBLE,
    tpot_error_p50_s    DOUBLE,                -- measured TPOT - injected step
    tpot_error_p99_s    DOUBLE,
    send_lag_p50_s      DOUBLE,                -- emulator arrival - client send
    send_lag_p99_s      DOUBLE,
    emulator_late_p50_s DOUBLE,                -- inside the TTFT error, not the client's
    emulator_late_p99_s DOUBLE,
    specgauge_version   VARCHAR,
    git_revision        VARCHAR,
    hostname            VARCHAR,
    source_path         VARCHAR NOT NULL,
    sha256              VARCHAR NOT NULL
);

CREATE TABLE analysis_validity (
    campaign_id                   VARCHAR NOT NULL,
    analysis_id                   VARCHAR NOT NULL,
    aa_variant                    VARCHAR,
    aa_estimate                   DOUBLE,     -- control / plain output throughput, geometric mean
    aa_low                        DOUBLE,
    aa_high                       DOUBLE,
    aa_gap                        DOUBLE,     -- |aa_estimate - 1|
    aa_repeats                    INTEGER,
    aa_interval                   VARCHAR,
    max_aa_gap                    DOUBLE,
    repeat_spread                 DOUBLE,     -- median over plain cells of (max - min) / mean throughput
    repeat_spread_cells           INTEGER,
    max_repeat_spread             DOUBLE,
    client_ttft_error_p50_s       DOUBLE,
    client_ttft_error_p99_s       DOUBLE,
    client_tpot_error_p50_s       DOUBLE,
    client_tpot_error_p99_s       DOUBLE,
    client_send_lag_p99_s         DOUBLE,
    client_concurrency            INTEGER,
    smallest_latency_difference_s DOUBLE,
    client_error_ok               BOOLEAN,
    valid                         BOOLEAN,
    reasons                       VARCHAR
);

CREATE TABLE analysis_confounds (
    campaign_id     VARCHAR NOT NULL,
    analysis_id     VARCHAR NOT NULL,
    variant         VARCHAR,
    method          VARCHAR,
    k               INTEGER,
    baseline_variant VARCHAR,
    "repeat"        INTEGER,
    differences     VARCHAR[],                 -- 'setting: plain -> speculative'
    sources         VARCHAR
);

ALTER TABLE analysis_runs ADD COLUMN min_effect DOUBLE;
ALTER TABLE analysis_runs ADD COLUMN guardrail DOUBLE;
ALTER TABLE analysis_decisions ADD COLUMN min_effect DOUBLE;
ALTER TABLE analysis_decisions ADD COLUMN guardrail_ok BOOLEAN;
ALTER TABLE analysis_decisions ADD COLUMN worst_other_workload VARCHAR;
ALTER TABLE analysis_decisions ADD COLUMN campaign_valid BOOLEAN;
ALTER TABLE analysis_decisions ADD COLUMN confounded BOOLEAN;
