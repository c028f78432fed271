"""Paper A's Markdown tables (``dynlab report`` of a group-tracking or nonlinearity dataset):

- :mod:`~dynlab.tracking.report.tables` — learned runs, mp, what theory says each tracker
  can track, the T_cross–mp correlations, and the comparison of two runs of one sweep;
- :mod:`~dynlab.tracking.report.theory` — which groups each built-in tracker can track at
  every length, by its transition's theory.

Every public name is also importable from :mod:`dynlab.report`.  Nothing is imported here.
"""
