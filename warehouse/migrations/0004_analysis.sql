-- 0004: results of the analysis flow (analysis/, flows/analyze.py), one set per campaign. Every row carries
-- campaign_id and analysis_id; re-analysing a campaign deletes its rows in every table below and inserts the
-- new ones in one transaction (analysis/store.py), so each campaign has exactly one analysis here, the latest.
-- No primary keys: rows are replaced by campaign inside one transaction. Column meanings: docs/analysis.md.

-- One row per analysed campaign: when, with which settings and code, the decision rule in words, the report.
CREATE TABLE analysis_runs (
    campaign_id         VARCHAR NOT NULL,
    analysis_id         VARCHAR NOT NULL,
    created_utc         TIMESTAMP NOT NULL,
    seconds             DOUBLE,
    confidence          DOUBLE,
    resamples           INTEGER,
    crossover_resamples INTEGER,
    seed                INTEGER,
    gain_metric         VARCHAR,
    min_success_rate    DOUBLE,
    repeats             INTEGER,
    decision_rule       VARCHAR,
    pairing             VARCHAR,
    specgauge_version   VARCHAR,
    git_revision        VARCHAR,
    report_path         VARCHAR,
    notes               VARCHAR[]
);

-- Q1: speedup against plain per speculative variant, workload, load and metric (throughput, ttft_p50,
-- ttft_p95, tpot_p50, tpot_p95; > 1 = faster). estimate = mean of per-repeat paired ratios; ci_* = bootstrap
-- over repeats, NULL with one repeat (`interval` then reads "n=1, no interval").
CREATE TABLE analysis_speedup (
    campaign_id           VARCHAR NOT NULL,
    analysis_id           VARCHAR NOT NULL,
    variant               VARCHAR,
    method                VARCHAR,
    k                     INTEGER,
    workload              VARCHAR,
    load_mode             VARCHAR,
    load_label            VARCHAR,
    concurrency           INTEGER,
    rate                  DOUBLE,
    metric                VARCHAR,
    estimate              DOUBLE,
    ci_low                DOUBLE,
    ci_high               DOUBLE,
    n_repeats             INTEGER,
    interval              VARCHAR,
    interval_excludes_one BOOLEAN,
    below_one             BOOLEAN,
    per_repeat            DOUBLE[],
    repeats               INTEGER[]
);

-- The decision rule applied to each speculative variant, workload and load.
CREATE TABLE analysis_decisions (
    campaign_id           VARCHAR NOT NULL,
    analysis_id           VARCHAR NOT NULL,
    variant               VARCHAR,
    method                VARCHAR,
    k                     INTEGER,
    workload              VARCHAR,
    load_mode             VARCHAR,
    load_label            VARCHAR,
    concurrency           INTEGER,
    rate                  DOUBLE,
    gain_metric           VARCHAR,
    estimate              DOUBLE,
    ci_low                DOUBLE,
    ci_high               DOUBLE,
    n_repeats             INTEGER,
    interval              VARCHAR,
    interval_excludes_one BOOLEAN,
    success_rate          DOUBLE,
    success_ok            BOOLEAN,
    gate_passed           BOOLEAN,
    gate_verdict_id       VARCHAR,
    gate_outcome          VARCHAR,
    wins                  BOOLEAN,
    reason                VARCHAR
);

-- Linear fits: Q2 (speedups on acceptance rate / mean acceptance length, per method) and Q3 (relative step
-- time on k, per method, workload NULL = all workloads). *_low/*_high: t intervals.
CREATE TABLE analysis_fits (
    campaign_id    VARCHAR NOT NULL,
    analysis_id    VARCHAR NOT NULL,
    question       VARCHAR,
    method         VARCHAR,
    workload       VARCHAR,
    predictor      VARCHAR,
    response       VARCHAR,
    n              INTEGER,
    n_deployments  INTEGER,
    slope          DOUBLE,
    slope_low      DOUBLE,
    slope_high     DOUBLE,
    intercept      DOUBLE,
    intercept_low  DOUBLE,
    intercept_high DOUBLE,
    r2             DOUBLE,
    p_value        DOUBLE,
    note           VARCHAR
);

-- Q3: per speculative variant, workload and load: inferred step time, tokens per step L, break-even L*.
CREATE TABLE analysis_depth (
    campaign_id                VARCHAR NOT NULL,
    analysis_id                VARCHAR NOT NULL,
    variant                    VARCHAR,
    method                     VARCHAR,
    k                          INTEGER,
    workload                   VARCHAR,
    load_mode                  VARCHAR,
    load_label                 VARCHAR,
    concurrency                INTEGER,
    rate                       DOUBLE,
    n_repeats                  INTEGER,
    step_time_s                DOUBLE,
    step_time_low              DOUBLE,
    step_time_high             DOUBLE,
    interval                   VARCHAR,
    plain_step_time_s          DOUBLE,
    relative_step_time         DOUBLE,
    tokens_per_step            DOUBLE,
    break_even_tokens_per_step DOUBLE,
    mean_acceptance_length     DOUBLE,
    acceptance_rate            DOUBLE,
    throughput_speedup         DOUBLE,
    tpot_p50_speedup           DOUBLE,
    below_one                  BOOLEAN,
    pays_per_token             BOOLEAN,
    best                       BOOLEAN
);

-- Q4: n-gram against draft model per workload and load, with KV-cache capacity and the choice.
CREATE TABLE analysis_choice (
    campaign_id           VARCHAR NOT NULL,
    analysis_id           VARCHAR NOT NULL,
    workload              VARCHAR,
    load_mode             VARCHAR,
    load_label            VARCHAR,
    concurrency           INTEGER,
    rate                  DOUBLE,
    ngram_variant         VARCHAR,
    ngram_speedup         DOUBLE,
    ngram_low             DOUBLE,
    ngram_high            DOUBLE,
    ngram_wins            BOOLEAN,
    draft_variant         VARCHAR,
    draft_speedup         DOUBLE,
    draft_low             DOUBLE,
    draft_high            DOUBLE,
    draft_wins            BOOLEAN,
    draft_over_ngram      DOUBLE,
    draft_over_ngram_low  DOUBLE,
    draft_over_ngram_high DOUBLE,
    n_repeats             INTEGER,
    interval              VARCHAR,
    kv_tokens_plain       BIGINT,
    kv_tokens_ngram       BIGINT,
    kv_tokens_draft       BIGINT,
    draft_kv_loss         DOUBLE,
    kv_usage_peak_ngram   DOUBLE,
    kv_usage_peak_draft   DOUBLE,
    preemptions_ngram     DOUBLE,
    preemptions_draft     DOUBLE,
    choice                VARCHAR,
    reason                VARCHAR,
    indicative            VARCHAR
);

-- Q5: per variant, workload and load mode: the highest load (open: offered rate in req/s; closed:
-- concurrency) at which it and every lower load meet both p99 SLOs in every repeat, and its comparison with
-- plain.
CREATE TABLE analysis_capacity (
    campaign_id                     VARCHAR NOT NULL,
    analysis_id                     VARCHAR NOT NULL,
    variant                         VARCHAR,
    method                          VARCHAR,
    k                               INTEGER,
    workload                        VARCHAR,
    load_mode                       VARCHAR,
    loads                           DOUBLE[],
    slo_met                         BOOLEAN[],
    goodput_rps                     DOUBLE[],
    sustainable_load                DOUBLE,
    first_violation_load            DOUBLE,
    goodput_rps_at_sustainable      DOUBLE,
    achieved_rps_at_sustainable     DOUBLE,
    ttft_p99_s_at_sustainable       DOUBLE,
    tpot_p99_s_at_sustainable       DOUBLE,
    slo_ttft_p99_s                  DOUBLE,
    slo_tpot_p99_s                  DOUBLE,
    plain_sustainable_load          DOUBLE,
    gain_vs_plain                   DOUBLE,
    ttft_p99_s_at_plain_sustainable DOUBLE,
    tpot_p99_s_at_plain_sustainable DOUBLE,
    kv_cache_tokens                 BIGINT,
    kv_loss_vs_plain                DOUBLE,
    kv_usage_peak_at_sustainable    DOUBLE,
    preemptions_at_sustainable      DOUBLE,
    verdict                         VARCHAR
);

-- The load above which a variant stops paying (first downward crossing of speedup 1, log2-interpolated),
-- per variant, workload, load mode and metric; status: crosses | pays throughout | never pays | one load
-- only. An open interval bound is NULL (`interval` says "> max" or "< min").
CREATE TABLE analysis_crossover (
    campaign_id VARCHAR NOT NULL,
    analysis_id VARCHAR NOT NULL,
    variant     VARCHAR,
    method      VARCHAR,
    k           INTEGER,
    workload    VARCHAR,
    load_mode   VARCHAR,
    metric      VARCHAR,
    status      VARCHAR,
    crossover   DOUBLE,
    ci_low      DOUBLE,
    ci_high     DOUBLE,
    n_repeats   INTEGER,
    interval    VARCHAR,
    loads       DOUBLE[],
    speedups    DOUBLE[]
);
