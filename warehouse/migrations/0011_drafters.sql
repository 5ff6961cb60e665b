-- 0011: trained and fine-tuned drafter heads (issue 19). One row per drafter artifact
-- (RAW/drafters/<drafter_id>/card.json, tasks/drafters/training.py): its parent head, target, data,
-- hyperparameters, losses and hashes. head_sha256 is what a deployment that serves the head records as
-- deployments.drafter_sha256, so campaigns and adaptations join to how their head was made.

CREATE TABLE drafters (
    drafter_id            VARCHAR PRIMARY KEY,
    created_utc           TIMESTAMP,
    method                VARCHAR NOT NULL,   -- eagle3
    mode                  VARCHAR NOT NULL,   -- finetune | scratch
    target_path           VARCHAR NOT NULL,
    target_sha256         VARCHAR NOT NULL,
    parent_path           VARCHAR,
    parent_sha256         VARCHAR,            -- null: trained from scratch
    head_sha256           VARCHAR NOT NULL,
    inputs_sha256         VARCHAR NOT NULL,   -- target, parent, data, hyperparameters
    aux_layers            VARCHAR NOT NULL,   -- JSON list
    data_sha256           VARCHAR NOT NULL,
    train_examples        INTEGER NOT NULL,
    train_prompt_tokens   BIGINT NOT NULL,
    train_output_tokens   BIGINT NOT NULL,
    held_out_examples     INTEGER NOT NULL,
    strata                VARCHAR NOT NULL,   -- JSON {stratum: training examples}
    data_sources          VARCHAR NOT NULL,   -- JSON {source kind: examples}
    hyperparameters       VARCHAR NOT NULL,   -- JSON
    steps                 INTEGER NOT NULL,
    lr                    DOUBLE NOT NULL,
    kept_step             INTEGER NOT NULL,   -- -1: the starting head was kept
    final_train_loss      DOUBLE,
    initial_held_out_mal  DOUBLE,             -- simulated acceptance length, offline, before training
    kept_held_out_mal     DOUBLE,             -- ... of the kept head
    curve_points          INTEGER NOT NULL,
    runner                VARCHAR NOT NULL,
    device                VARCHAR,
    train_seconds         DOUBLE,
    source_path           VARCHAR NOT NULL,
    sha256                VARCHAR NOT NULL
);
