-- 0016: honest uncertainty (issue 30; docs/analysis.md "Intervals").
-- Acceptance per request (vLLM 0.32's per-request spec-decode block, tasks/load/client.py): verify steps, draft
-- tokens, accepted draft tokens, and verify steps by drafts accepted. The `requests` view reads Parquet parts
-- by name (a part written before these columns reads them as null); the rows ingested before migration 0010
-- get them here, null.
ALTER TABLE requests_legacy ADD COLUMN spec_steps BIGINT;
ALTER TABLE requests_legacy ADD COLUMN spec_draft_tokens BIGINT;
ALTER TABLE requests_legacy ADD COLUMN spec_accepted_tokens BIGINT;
ALTER TABLE requests_legacy ADD COLUMN spec_acceptance_histogram BIGINT[];

-- Mean acceptance length and acceptance rate per speculative variant, workload and load, from the requests'
-- own acceptance, with a bootstrap interval over prompts (analysis/acceptance.py acceptance_intervals);
-- `acceptance_interval` names the method and n ("n=16, bootstrap over 16 prompts x 2 launches, ...").
CREATE TABLE analysis_acceptance (
    campaign_id                     VARCHAR NOT NULL,
    analysis_id                     VARCHAR NOT NULL,
    variant                         VARCHAR,
    method                          VARCHAR,
    k                               INTEGER,
    workload                        VARCHAR,
    load_label                      VARCHAR,
    prompts                         INTEGER,
    launches                        INTEGER,
    requests                        INTEGER,
    mean_acceptance_length          DOUBLE,
    mean_acceptance_length_low      DOUBLE,
    mean_acceptance_length_high     DOUBLE,
    acceptance_rate                 DOUBLE,
    acceptance_rate_low             DOUBLE,
    acceptance_rate_high            DOUBLE,
    counters_mean_acceptance_length DOUBLE,   -- the cells' counter figure, for the cross-check
    acceptance_interval             VARCHAR
);

-- The validity verdict in three words: valid (the A/A interval within the limit), invalid (the point or the
-- whole interval beyond it, or the repeat spread over its limit), inconclusive (straddles, or unknown).
-- `valid` is now true only for "valid".
ALTER TABLE analysis_validity ADD COLUMN verdict VARCHAR;

-- Who else used the CPU while each cell measured (summary.json `host`, tasks/metrics/host_load.py): shares of
-- the host's CPU capacity, busy = ours (the process tree that ran the cell, a local engine included) + other.
-- NULL: a cell measured before this was recorded, or not on Linux.
ALTER TABLE cells ADD COLUMN host_cpus INTEGER;
ALTER TABLE cells ADD COLUMN host_busy_share DOUBLE;
ALTER TABLE cells ADD COLUMN host_ours_share DOUBLE;
ALTER TABLE cells ADD COLUMN host_other_share DOUBLE;
