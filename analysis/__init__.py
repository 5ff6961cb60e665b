"""Analysis of a campaign in the warehouse: statistics (stats), the five research questions (speedup,
acceptance, depth, choice, capacity), crossover loads, the decision rule (decision), Altair charts (charts),
the warehouse tables `analysis_*` (store) and the self-contained HTML report (report). `run.analyze_campaign`
does it all; docs/analysis.md explains the formulas and how to read each chart."""
