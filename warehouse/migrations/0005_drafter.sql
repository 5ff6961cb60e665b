-- 0005: which drafter a deployment served (deployment.json's `drafter.sha256`: sha256 over the head's or
-- draft model's weights and config.json, tasks/drafters/provenance.py), on every deployment and cell row,
-- so campaigns with different heads are never pooled. NULL for plain, n-gram and suffix, and where the
-- drafter was not readable from the orchestrator (a hub id, a cluster path).
ALTER TABLE deployments ADD COLUMN drafter_sha256 VARCHAR;
ALTER TABLE cells ADD COLUMN drafter_sha256 VARCHAR;
