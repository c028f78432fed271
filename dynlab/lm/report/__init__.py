"""Paper B's Markdown tables (``dynlab report`` of a length-generalization or task dataset):

- :mod:`~dynlab.lm.report.tables` — far/in PPL ratios, the Definition 3.2 verdicts, the
  interventions' contrasts with Holm's p, the budget, size and context maps;
- :mod:`~dynlab.lm.report.forget` — the ``state`` preset's reading: T_forget, its fit and
  the pre-registered verdicts;
- :mod:`~dynlab.lm.report.tasks` — the task studies: status, accuracy per length and arm,
  paired contrasts.

Every public name is also importable from :mod:`dynlab.report`.  Nothing is imported here.
"""
