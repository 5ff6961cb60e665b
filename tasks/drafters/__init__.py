"""Drafters (EAGLE-3 heads, draft models, ...): the contract a drafter must meet for its target, checked
before launch, and the provenance recorded for the one a deployment served."""

from specgauge.checkpoints import drafter_digest, drafter_record, training_card
from tasks.drafters.contract import check_eagle3_head, check_method_target, check_suffix_available
from tasks.drafters.prelaunch import check_drafters

__all__ = [
    "check_drafters",
    "check_eagle3_head",
    "check_method_target",
    "check_suffix_available",
    "drafter_digest",
    "drafter_record",
    "training_card",
]
