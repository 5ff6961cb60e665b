-- 0019: correctness under sampling (RAW/<campaign>/sampling_checks/<check_id>.json, written once by
-- analysis/sampling_report.py; the rule is in docs/gate.md "Under sampling"). `sampling_checks`: one row per
-- treatment's check (plain vs the treatment, beside plain vs a second plain launch, the null arm);
-- `sampling_check_rows`: per arm, prompt and statistic (position 0..m-1, -1 the whole m-token prefix) the
-- total-variation distance, its permutation p-value and the TV it would need to be rejected.

CREATE TABLE sampling_checks (
    check_key              VARCHAR PRIMARY KEY,   -- <campaign_id>/<check_id>
    check_id               VARCHAR NOT NULL,
    campaign_id            VARCHAR NOT NULL,
    treatment_variant      VARCHAR NOT NULL,
    method                 VARCHAR,
    outcome                VARCHAR NOT NULL,      -- 'pass' | 'fail' | 'inconclusive'
    passed                 BOOLEAN NOT NULL,
    claim                  VARCHAR NOT NULL,
    reasons                VARCHAR[] NOT NULL,    -- why not judged (inconclusive)
    temperature            DOUBLE NOT NULL,
    top_p                  DOUBLE NOT NULL,
    samples                INTEGER NOT NULL,      -- per prompt and arm
    tokens                 INTEGER NOT NULL,      -- m: the first m generated tokens
    n_prompts              INTEGER NOT NULL,
    rejected_prompts       INTEGER NOT NULL,      -- Holm-adjusted p <= alpha, plain vs the treatment
    null_rejected_prompts  INTEGER NOT NULL,      -- the same, plain vs plain
    alpha                  DOUBLE NOT NULL,
    permutations           INTEGER NOT NULL,
    max_critical_tv        DOUBLE NOT NULL,
    correction             VARCHAR NOT NULL,
    deployments            VARCHAR[] NOT NULL,    -- plain, treatment, plain again
    rule                   JSON NOT NULL,
    created_utc            TIMESTAMP,
    specgauge_version      VARCHAR,
    git_revision           VARCHAR,
    source_path            VARCHAR NOT NULL,
    sha256                 VARCHAR NOT NULL
);

CREATE TABLE sampling_check_rows (
    check_key       VARCHAR NOT NULL,
    arm             VARCHAR NOT NULL,             -- 'treatment' (plain vs the variant) | 'null' (plain vs plain)
    prompt_id       VARCHAR NOT NULL,
    position        INTEGER NOT NULL,             -- 0..m-1; -1: the whole m-token prefix
    tv              DOUBLE NOT NULL,
    p_value         DOUBLE NOT NULL,              -- this statistic's own permutation p-value
    critical_tv     DOUBLE NOT NULL,              -- the TV it needs for p <= alpha / prompts
    null_tv_mean    DOUBLE NOT NULL,              -- the mean TV over the permutations (chance alone)
    prompt_p_value  DOUBLE NOT NULL,              -- the prompt's min-p test
    prompt_p_holm   DOUBLE,
    rejected        BOOLEAN NOT NULL,
    PRIMARY KEY (check_key, arm, prompt_id, position)
);
