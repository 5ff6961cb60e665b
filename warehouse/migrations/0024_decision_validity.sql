-- 0024: a decision reads its verification campaign's validity and is recomputed, not frozen (docs/decision.md).
-- `decisions.revision`: a decision recomputed with other figures (a resumed verification) is a new file,
-- decisions/<decision_id>.rev<n>.json, and a new row (decision_key <campaign_id>/<decision_id>.rev<n>;
-- decision_id stays the recommendation's); v_decision shows the latest revision. `validity`,
-- `validity_reasons`: analysis.validity's verdict on the verification campaign (valid | invalid |
-- inconclusive; NULL: nothing was launched) and its reasons; an invalid campaign's loads are inconclusive.
-- `promotions.decision_revision`: the revision answered; `override`: the approver's reason for promoting a
-- decision that was not confirmed by a valid campaign ('' when none was needed).
ALTER TABLE decisions ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE decisions ADD COLUMN validity VARCHAR;
ALTER TABLE decisions ADD COLUMN validity_reasons VARCHAR NOT NULL DEFAULT '';
ALTER TABLE promotions ADD COLUMN decision_revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE promotions ADD COLUMN override VARCHAR NOT NULL DEFAULT '';
