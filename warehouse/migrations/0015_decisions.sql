-- 0015: the decision loop (flows/decide.py, artifacts/decisions.py). `decisions`: one row per recommendation
-- and its verification (RAW/<verification campaign>/decisions/<decision_id>.json, written once by
-- tasks/decide.py): the per-batch-size schedule recommended from a sweep campaign, the config it becomes, and
-- the verdict of the launch that verified it. `decision_loads`: per measured load of that launch, what the
-- schedule claims there and what was measured (the schedule over plain and over the best fixed depth, with
-- intervals over repeats). `promotions`: a person's answer to a decision
-- (RAW/<verification campaign>/promotions/<decision_id>.json, written once by tasks/promote.py); an approved
-- one is the config the nightly regression runs.

CREATE TABLE decisions (
    decision_key        VARCHAR PRIMARY KEY,   -- <campaign_id>/<decision_id>
    decision_id         VARCHAR NOT NULL,
    campaign_id         VARCHAR NOT NULL,      -- the verification campaign (the file lives under it)
    source_campaign_id  VARCHAR NOT NULL,      -- the sweep the recommendation came from
    workload            VARCHAR NOT NULL,
    family              VARCHAR NOT NULL,      -- method and drafter, e.g. "eagle3 models/twin-eagle3"
    method              VARCHAR NOT NULL,
    schedule            JSON NOT NULL,         -- num_speculative_tokens_per_batch_size: [[from, to, k], ...]
    speculative_config  JSON,                  -- NULL: speculation off at every load
    variant             JSON,                  -- the schedule as a spec variant entry
    target              JSON NOT NULL,         -- the spec's target entry it was measured on
    verification_spec   VARCHAR NOT NULL,      -- the verification campaign's spec file ("": none launched)
    fixed_k             INTEGER NOT NULL,      -- the best fixed depth it was launched beside
    tolerance           DOUBLE NOT NULL,       -- an off range is "no worse than plain" above 1 - tolerance
    confidence          DOUBLE NOT NULL,
    outcome             VARCHAR NOT NULL,      -- confirmed (every load) | refuted | inconclusive
    gate_passed         BOOLEAN,               -- the schedule's own greedy gate (null: no verdict)
    gate_claim          VARCHAR,
    summary             VARCHAR NOT NULL,
    caveats             JSON NOT NULL,
    created_utc         TIMESTAMP,
    specgauge_version   VARCHAR,
    git_revision        VARCHAR,
    source_path         VARCHAR NOT NULL,
    sha256              VARCHAR NOT NULL
);

CREATE TABLE decision_loads (
    decision_key         VARCHAR NOT NULL,
    concurrency          INTEGER NOT NULL,
    batch_from           INTEGER NOT NULL,     -- the schedule's range this load stands for (inclusive)
    batch_to             INTEGER NOT NULL,
    k                    INTEGER NOT NULL,     -- the schedule's depth there; 0: speculation off
    claim                VARCHAR NOT NULL,     -- "beats plain" (k > 0), "no worse than plain ..." (k = 0)
    sweep_speedup        DOUBLE,               -- the sweep's speedup of the family at its best depth
    sweep_interval       VARCHAR NOT NULL,
    over_plain           DOUBLE,               -- the launched schedule's throughput over plain
    over_plain_low       DOUBLE,
    over_plain_high      DOUBLE,
    over_plain_interval  VARCHAR NOT NULL,
    n_repeats            INTEGER NOT NULL,
    over_fixed           DOUBLE,               -- the schedule over the best fixed depth, paired per repeat
    over_fixed_low       DOUBLE,
    over_fixed_high      DOUBLE,
    outcome              VARCHAR NOT NULL,     -- confirmed | refuted | inconclusive
    reason               VARCHAR NOT NULL,
    PRIMARY KEY (decision_key, concurrency)
);

CREATE TABLE promotions (
    promotion_key       VARCHAR PRIMARY KEY,   -- <campaign_id>/<decision_id>: one answer per decision
    decision_id         VARCHAR NOT NULL,
    campaign_id         VARCHAR NOT NULL,
    approved            BOOLEAN NOT NULL,
    approver            VARCHAR NOT NULL,
    note                VARCHAR NOT NULL,
    via                 VARCHAR NOT NULL,      -- prefect-ui (a paused flow run resumed with input) | cli
    speculative_config  JSON,
    vllm_args           JSON NOT NULL,
    files               JSON NOT NULL,         -- what was written to deploy (relative to SPECGAUGE_HOME)
    decided_utc         TIMESTAMP NOT NULL,
    specgauge_version   VARCHAR,
    git_revision        VARCHAR,
    source_path         VARCHAR NOT NULL,
    sha256              VARCHAR NOT NULL
);
