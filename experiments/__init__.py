"""What a campaign measures: the speculative methods' registry (methods.py), the experiment spec (spec.py), its plan
(plan.py: ids, slots, cells), and the campaign specs (YAML)."""
