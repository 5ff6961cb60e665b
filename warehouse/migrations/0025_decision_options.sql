-- 0025: whole deployment options weighed by traffic (docs/decision.md "Deployment options and traffic").
-- `choice`: the option to deploy ('plain': deploy plain; '' in decisions written before options);
-- `choice_reason`: why; `traffic`: where the loads' shares came from ("equal over the measured loads" or the
-- file); `options`: every option scored (artifacts.documents.decisions.DeploymentOption), canonical JSON.
ALTER TABLE decisions ADD COLUMN choice VARCHAR NOT NULL DEFAULT '';
ALTER TABLE decisions ADD COLUMN choice_reason VARCHAR NOT NULL DEFAULT '';
ALTER TABLE decisions ADD COLUMN traffic VARCHAR NOT NULL DEFAULT '';
ALTER TABLE decisions ADD COLUMN options VARCHAR NOT NULL DEFAULT '[]';
