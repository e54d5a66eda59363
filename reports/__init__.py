"""Chargeback reports from the billing ledger (docs/reports.md).

* `reports.model`: the report as data (periods, groupings, figures), built from the ledger's read API;
* `reports.render`: HTML (Jinja2 + inline plotly.js), CSV, JSON; `reports.focus`: FOCUS 1.3 (and 1.2) rows and
  the project's own schema check;
* `reports.run`: render + record a run; `reports.schedule`: the billing service's monthly job;
* `reports.cli`: `gpumeter report`.
"""
