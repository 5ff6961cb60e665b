"""The Prefect flows: nothing but composition of the steps in tasks/ and analysis/.

Importing this package configures Prefect once (the repo's profiles, PREFECT_HOME under SPECGAUGE_HOME)
before any flow module imports prefect: `flows.campaign` and the others can import it at their top.

No module here uses `from __future__ import annotations`: Prefect validates a flow's parameters from its
annotations, and a served flow runs from a by-value pickle whose globals hold only the names its code uses,
where an annotation left as a string cannot be resolved (tests/test_campaign_flow.py shows it)."""

from specgauge.prefect_env import configure, redact_stored_parameters

configure()
redact_stored_parameters()  # what Prefect stores of a flow run's parameters has its secrets redacted (issue 34)
