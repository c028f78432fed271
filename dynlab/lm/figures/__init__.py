"""Paper B's figure panels, pure ``(ds, ax) -> ax`` functions on the shared machinery of
:mod:`dynlab.figures`:

- :mod:`~dynlab.lm.figures.panels` — the length-generalization study: PPL(t), far/in per
  arm, budget, size and context maps, Effective Remembrance, state statistics, and the panels
  the study declares (:func:`~dynlab.lm.figures.panels.length_generalization_panels`);
- :mod:`~dynlab.lm.figures.forget` — the ``state`` preset's forget-threshold and
  memory-horizon maps;
- :mod:`~dynlab.lm.figures.tasks` — the long-context task studies (copying, passkey, babilong).

Nothing is imported here.
"""
