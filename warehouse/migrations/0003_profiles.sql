-- 0003: profiled windows (RAW/<campaign>/profiles/<profile_id>/, written by tasks/profile/window.py) and
-- where their engine time went. One row per window; the model behind each share is in docs/profiling.md.
-- Shares are fractions of the window's measured engine time (CPU: the worker's busy time; GPU: kernel
-- time), except wasted_share_of_added, a fraction of the work speculation adds (drafting + verification of
-- drafted positions). Wasted figures are NULL when the window had no counter deltas.

CREATE TABLE profiles (
    profile_key                VARCHAR PRIMARY KEY,   -- <campaign_id>/<profile_id>
    profile_id                 VARCHAR NOT NULL,
    campaign_id                VARCHAR NOT NULL,
    deployment_id              VARCHAR,
    variant                    VARCHAR NOT NULL,
    method                     VARCHAR NOT NULL,
    k                          INTEGER,
    variant_config             JSON,
    workload                   VARCHAR,
    workload_file              VARCHAR,
    workload_sha256            VARCHAR,
    load_label                 VARCHAR NOT NULL,      -- c<C>, as cells name closed-loop loads
    concurrency                INTEGER,
    requests_planned           INTEGER,
    requests_ok                INTEGER,
    requests_failed            INTEGER,
    profiler                   VARCHAR NOT NULL,      -- 'torch-profiler' | 'nsys'
    launcher                   VARCHAR,
    engine_version             VARCHAR,
    specgauge_version          VARCHAR,
    git_revision               VARCHAR,
    hostname                   VARCHAR,
    started_utc                TIMESTAMP,
    ended_utc                  TIMESTAMP,
    status                     VARCHAR NOT NULL,      -- 'ok' | 'failed'
    error                      VARCHAR,
    steps                      INTEGER,
    engine_s                   DOUBLE,
    drafting_s                 DOUBLE,
    verification_s             DOUBLE,
    rejection_s                DOUBLE,
    other_s                    DOUBLE,
    verification_drafted_s     DOUBLE,
    added_s                    DOUBLE,
    wasted_s                   DOUBLE,
    wasted_drafting_s          DOUBLE,
    wasted_verification_s      DOUBLE,
    wasted_share               DOUBLE,
    drafting_share             DOUBLE,
    verification_share         DOUBLE,
    rejection_share            DOUBLE,
    other_share                DOUBLE,
    useful_share               DOUBLE,
    added_share                DOUBLE,
    wasted_share_of_added      DOUBLE,
    wasted_drafting_share      DOUBLE,
    wasted_verification_share  DOUBLE,
    apportioning               VARCHAR,               -- 'position-aware' | 'uniform' | 'none'
    drafts                     BIGINT,
    draft_tokens               BIGINT,
    accepted_tokens            BIGINT,
    acceptance_rate            DOUBLE,
    accepted_per_position      BIGINT[],
    cross_check_ok             BOOLEAN,               -- trace's verified drafts agree with the counters
    trace_file                 VARCHAR,               -- relative to the artifact, or the pointer's path
    trace_sha256               VARCHAR,
    source_path                VARCHAR NOT NULL,
    sha256                     VARCHAR NOT NULL
);

-- One row per successfully profiled window: what share of measured engine time went to draft tokens that
-- were rejected (wasted_share), and the rest of the split. The latest window per (campaign, variant, load,
-- workload, profiler) comes first in `window_rank`.
CREATE VIEW v_profile_waste AS
SELECT
    p.campaign_id, p.profile_id, p.deployment_id, p.variant, p.method, p.k, p.workload,
    p.load_label, p.concurrency, p.profiler,
    p.wasted_share, p.wasted_share_of_added,
    p.drafting_share, p.verification_share, p.rejection_share, p.other_share, p.useful_share,
    p.added_share, p.wasted_drafting_share, p.wasted_verification_share,
    p.acceptance_rate, p.drafts, p.draft_tokens, p.accepted_tokens,
    p.engine_s, p.steps, p.apportioning, p.cross_check_ok, p.engine_version, p.started_utc,
    row_number() OVER (
        PARTITION BY p.campaign_id, p.variant, p.load_label, p.workload, p.profiler
        ORDER BY p.started_utc DESC, p.profile_id DESC
    ) AS window_rank
FROM profiles p
WHERE p.status = 'ok';
