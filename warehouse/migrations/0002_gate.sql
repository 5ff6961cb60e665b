-- 0002: greedy-correctness verdicts (RAW/<campaign>/gates/<verdict_id>.json, written by tasks/gate.py) and
-- the view v_gate. The decision rule is in docs/gate.md; `checks` keeps every check as the verdict wrote it.

CREATE TABLE gate_verdicts (
    verdict_key              VARCHAR PRIMARY KEY,   -- <campaign_id>/<verdict_id>
    verdict_id               VARCHAR NOT NULL,
    campaign_id              VARCHAR NOT NULL,
    treatment_variant        VARCHAR NOT NULL,
    treatment_capture_a      VARCHAR NOT NULL,      -- capture ids: plain, then the speculative arm
    treatment_capture_b      VARCHAR NOT NULL,
    treatment_deployment_a   VARCHAR,
    treatment_deployment_b   VARCHAR,
    control_pairs            VARCHAR[] NOT NULL,    -- '<capture a> vs <capture b> (<kind>)'
    control_kinds            VARCHAR[] NOT NULL,    -- 'same_deployment' | 'cross_deployment'
    controls                 JSON NOT NULL,         -- label, kind, capture refs, overall figures
    n_prompts                INTEGER NOT NULL,
    outcome                  VARCHAR NOT NULL,      -- 'consistent' | 'diverged' | 'incomplete'
    passed                   BOOLEAN NOT NULL,
    claim                    VARCHAR NOT NULL,
    failed_checks            VARCHAR[] NOT NULL,
    exact_match_rate         DOUBLE,                -- the treatment's (plain vs speculative)
    envelope_exact_match_min DOUBLE,                -- the most divergent control's
    mean_prefix_fraction     DOUBLE,
    mean_edit_distance       DOUBLE,
    median_first_divergence  DOUBLE,
    alpha                    DOUBLE,
    min_prompts              INTEGER,
    forced                   BOOLEAN,
    checks                   JSON NOT NULL,
    envelope                 JSON,
    per_stratum              JSON,
    created_utc              TIMESTAMP,
    specgauge_version        VARCHAR,
    git_revision             VARCHAR,
    source_path              VARCHAR NOT NULL,
    sha256                   VARCHAR NOT NULL
);

-- One row per verdict: which speculative variant was judged against which control pairs, whether it passed,
-- and the verdict in words. `verdict_rank` 1 is the latest verdict per campaign and variant.
CREATE VIEW v_gate AS
SELECT
    g.campaign_id,
    g.treatment_variant,
    g.verdict_id,
    g.treatment_capture_a,
    g.treatment_capture_b,
    g.control_pairs,
    g.passed,
    g.outcome,
    g.claim AS verdict,
    g.failed_checks,
    g.n_prompts,
    g.exact_match_rate,
    g.envelope_exact_match_min,
    g.mean_prefix_fraction,
    g.mean_edit_distance,
    g.created_utc,
    row_number() OVER (
        PARTITION BY g.campaign_id, g.treatment_variant ORDER BY g.created_utc DESC, g.verdict_id DESC
    ) AS verdict_rank
FROM gate_verdicts g;
