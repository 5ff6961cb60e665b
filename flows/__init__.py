"""The Prefect flows: nothing but composition of the steps in tasks/ and analysis/.

Importing this package configures Prefect once (the repo's profiles, PREFECT_HOME under SPECGAUGE_HOME)
before any flow module imports prefect: `flows.campaign` and the others can import it at their top."""

from specgauge.prefect_env import configure

configure()
