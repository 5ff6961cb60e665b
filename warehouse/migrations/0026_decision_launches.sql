-- 0026: how many launches the verification took (issue 41: "the decision says how many launches it took").
-- `launches`: launches per arm (the schedule's repeat blocks launched; NULL: nothing launched);
-- `max_launches`: the most it could take (decision.max_launches; NULL: a fixed count of launches).
ALTER TABLE decisions ADD COLUMN launches INTEGER;
ALTER TABLE decisions ADD COLUMN max_launches INTEGER;
