"""The offline replay simulator: greedy captures replayed through speculative drafting (docs/simulate.md).

- `replay`: requests, token trees, greedy verification stepped offline, vLLM-style counters, results;
- `proposers`: n-gram (vLLM's rule), suffix, and model drafters replayed from rank tables;
- `shapes`: chain, tree, graft, union, and their text form (`parse_shapes`);
- `captures`: a campaign's captures as requests (prompt ids by the chat template, output ids);
- `models` / `model_worker`: the draft model and EAGLE-3 head run offline in a Python with torch;
- `run`: building proposers and replaying shapes over a capture; `validate`: simulated against served;
- `whole_campaign`: a campaign's simulation end to end, stored in the warehouse (`simulate_campaign`).
"""
