-- 0009: the offline tree / multi-drafter simulator (issue 20; analysis/simulate/, flows/simulate.py,
-- docs/simulate.md). One simulation = one campaign's greedy captures replayed with one set of settings
-- (shapes, tail, dtype, outputs capture: settings_key); re-running the same settings on the same campaign
-- replaces its rows in all three tables in one transaction (analysis/simulate/store.py), other settings
-- keep theirs. No primary keys: rows are replaced by (campaign_id, settings_key).

-- One row per simulation: its settings, the step-time model it fitted on the campaign's cells, when, by what.
CREATE TABLE tree_sim_runs (
    campaign_id            VARCHAR NOT NULL,
    settings_key           VARCHAR NOT NULL,  -- sha256 prefix of `settings`
    simulation_id          VARCHAR NOT NULL,
    created_utc            TIMESTAMP NOT NULL,
    seconds                DOUBLE,
    settings               JSON,              -- shapes, tail, dtype, outputs capture, drafter settings
    outputs_capture        VARCHAR,           -- whose greedy outputs the projections replay
    fitted_on              VARCHAR,           -- the campaign whose measured cells the cost model is fitted on
    cost_model             JSON,              -- base_s per stratum, per_batch_token_s, per_pass_s per proposer
    fit_points             INTEGER,
    fit_rms_residual       DOUBLE,            -- relative, over the fitted cells
    fit_max_residual       DOUBLE,
    specgauge_version      VARCHAR,
    git_revision           VARCHAR,
    notes                  VARCHAR[]
);

-- One row per shape, stratum and closed-loop load: simulated acceptance and the cost model's projection.
CREATE TABLE tree_sim (
    campaign_id                 VARCHAR NOT NULL,
    settings_key                VARCHAR NOT NULL,
    simulation_id               VARCHAR NOT NULL,
    shape                       VARCHAR NOT NULL,  -- e.g. tree:b=2:budget=8:depth=4@eagle3
    kind                        VARCHAR,           -- chain | tree | graft | union
    proposers                   VARCHAR[],
    stratum                     VARCHAR NOT NULL,
    load_label                  VARCHAR,
    concurrency                 INTEGER,
    mean_acceptance_length      DOUBLE,            -- 1 + accepted / drafts (vLLM's definition)
    acceptance_rate_per_position DOUBLE[],
    tokens_per_step             DOUBLE,            -- output tokens per decode step
    verified_tokens_per_step    DOUBLE,            -- per sequence: draft tokens + 1
    batch_tokens                DOUBLE,            -- concurrency x verified_tokens_per_step
    drafting_passes             INTEGER,           -- drafter forward passes (or lookups) per step
    projected_step_s            DOUBLE,
    plain_modelled_step_s       DOUBLE,
    projected_tpot_s            DOUBLE,            -- plain's measured TPOT / projected_speedup
    projected_throughput_tok_s  DOUBLE,            -- plain's measured throughput x projected_speedup
    projected_speedup           DOUBLE,
    plain_tpot_s                DOUBLE,
    plain_throughput_tok_s      DOUBLE,
    served_variant              VARCHAR,           -- the served variant this shape mirrors, if any
    measured_speedup            DOUBLE,            -- its measured throughput speedup (geometric mean)
    fitted_on                   VARCHAR,
    created_utc                 TIMESTAMP,
    specgauge_version           VARCHAR
);

-- Simulated against served: per speculative capture, the replay of its own method and k over its own
-- requests next to vLLM's counters over exactly those requests.
CREATE TABLE tree_sim_validation (
    campaign_id                      VARCHAR NOT NULL,
    settings_key                     VARCHAR NOT NULL,
    simulation_id                    VARCHAR NOT NULL,
    capture_id                       VARCHAR NOT NULL,
    variant                          VARCHAR,
    method                           VARCHAR,
    k                                INTEGER,
    requests                         INTEGER,
    served_drafts                    BIGINT,
    simulated_drafts                 BIGINT,
    served_draft_tokens              BIGINT,
    simulated_draft_tokens           BIGINT,
    served_accepted_tokens           BIGINT,
    simulated_accepted_tokens        BIGINT,
    served_mean_acceptance_length    DOUBLE,
    simulated_mean_acceptance_length DOUBLE,
    relative_error                   DOUBLE,
    within_target                    BOOLEAN,           -- |relative_error| <= 5%
    served_per_position              DOUBLE[],
    simulated_per_position           DOUBLE[],
    exact_mirror                     BOOLEAN            -- false: an approximate proposer (suffix)
);
