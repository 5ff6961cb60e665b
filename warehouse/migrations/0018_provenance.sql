-- 0018: provenance of everything that can change a result (issue 33, item 5; deployment.json's
-- `provenance`, tasks/launch/provenance.py). On every deployment row, and through it on v_cells:
--   target_digest    sha256 over the target's weights, config and tokenizer files (NULL: not hashed, e.g. a
--                    hub id or a cluster path: the raw document says why)
--   env_digest       sha256 of the engine Python's `pip freeze --all` (its text: `environments`)
--   overlays_digest  sha256 over the vLLM overlays applied (patches and patched files); the sha256 of nothing
--                    (e3b0c442...) when none was applied; NULL where it cannot be known (an endpoint)
--   hardware         canonical JSON of the engine host's CPU model, logical CPUs, physical cores and GPUs
--                    (name, driver, memory); NULL where the host could not be probed (a cluster node)
ALTER TABLE deployments ADD COLUMN target_digest VARCHAR;
ALTER TABLE deployments ADD COLUMN env_digest VARCHAR;
ALTER TABLE deployments ADD COLUMN overlays_digest VARCHAR;
ALTER TABLE deployments ADD COLUMN hardware VARCHAR;

-- One row per engine package lock, whatever the number of deployments and campaigns that ran with it
-- (RAW/<campaign>/environments/<env_digest>.txt; the first campaign ingested brings it, later copies are
-- the same bytes and are skipped).
CREATE TABLE environments (
    env_digest    VARCHAR PRIMARY KEY,    -- sha256 of `freeze_text`
    packages      INTEGER NOT NULL,       -- lines of `freeze_text` that name a package
    freeze_text   VARCHAR NOT NULL,       -- the `pip freeze --all` text, URL credentials redacted
    source_path   VARCHAR NOT NULL,
    sha256        VARCHAR NOT NULL
);
