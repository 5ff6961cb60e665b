-- 0012: adaptation confirmations (RAW/<campaign>/adaptations/<adaptation_id>.json, written by tasks/adapt.py):
-- one row per confirmation (one hot-swap deployment, old head against new, measured in a randomised schedule),
-- its new-vs-old comparisons per stratum, load and metric (ratios over repeats with t intervals), and the
-- benefit rule's verdict per stratum and load. Its cells are ordinary cells (ids <variant>.<old|new>.r<n>...).

CREATE TABLE adaptations (
    adaptation_key      VARCHAR PRIMARY KEY,   -- <campaign_id>/<adaptation_id>
    adaptation_id       VARCHAR NOT NULL,      -- <variant>.<target stratum>.<8 hex of the inputs>
    campaign_id         VARCHAR NOT NULL,
    deployment_id       VARCHAR NOT NULL,
    variant             VARCHAR NOT NULL,
    target_stratum      VARCHAR NOT NULL,
    strata              JSON NOT NULL,
    loads               JSON NOT NULL,
    repeats             INTEGER NOT NULL,
    seed                INTEGER NOT NULL,
    min_effect          DOUBLE NOT NULL,
    max_harm            DOUBLE NOT NULL,
    confidence          DOUBLE NOT NULL,
    gain_metric         VARCHAR NOT NULL,
    old_path            VARCHAR NOT NULL,
    old_sha256          VARCHAR,
    new_path            VARCHAR NOT NULL,
    new_sha256          VARCHAR,
    new_drafter_id      VARCHAR,
    n_blocks            INTEGER NOT NULL,
    n_swaps             INTEGER NOT NULL,
    swapped_back        BOOLEAN NOT NULL,      -- the old head served again at the end
    final_sha256        VARCHAR,
    gate_verdict_id     VARCHAR,
    gate_passed         BOOLEAN,
    gate_outcome        VARCHAR,
    gate_claim          VARCHAR,
    adopt_strata        JSON NOT NULL,         -- the strata that should get the adapted head
    summary             VARCHAR NOT NULL,
    status              VARCHAR NOT NULL,      -- ok | failed
    error               VARCHAR,
    started_utc         TIMESTAMP,
    ended_utc           TIMESTAMP,
    specgauge_version   VARCHAR,
    git_revision        VARCHAR,
    source_path         VARCHAR NOT NULL,
    sha256              VARCHAR NOT NULL
);

CREATE TABLE adaptation_comparisons (
    adaptation_key  VARCHAR NOT NULL,
    stratum         VARCHAR NOT NULL,
    load_label      VARCHAR NOT NULL,
    metric          VARCHAR NOT NULL,          -- mean_acceptance_length | throughput | tpot_p50 (> 1: new better)
    estimate        DOUBLE,
    ci_low          DOUBLE,
    ci_high         DOUBLE,
    n_repeats       INTEGER NOT NULL,
    "interval"      VARCHAR NOT NULL,
    ratios          JSON NOT NULL,
    repeats         JSON NOT NULL,
    old_mean        DOUBLE,
    new_mean        DOUBLE,
    PRIMARY KEY (adaptation_key, stratum, load_label, metric)
);

CREATE TABLE adaptation_verdicts (
    adaptation_key  VARCHAR NOT NULL,
    stratum         VARCHAR NOT NULL,
    load_label      VARCHAR NOT NULL,
    target          BOOLEAN NOT NULL,
    gain_metric     VARCHAR NOT NULL,
    estimate        DOUBLE,
    ci_low          DOUBLE,
    ci_high         DOUBLE,
    n_repeats       INTEGER NOT NULL,
    harm_ok         BOOLEAN NOT NULL,
    worst_other     VARCHAR,
    success_ok      BOOLEAN NOT NULL,
    gate_passed     BOOLEAN,
    adopt           BOOLEAN NOT NULL,
    reason          VARCHAR NOT NULL,
    PRIMARY KEY (adaptation_key, stratum, load_label)
);
