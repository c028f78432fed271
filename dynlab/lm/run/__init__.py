"""One run of paper B, the work of one study run:

- :mod:`~dynlab.lm.run.text` — train and evaluate one
  :class:`~dynlab.lm.spec.LMRunSpec` on text (PPL(t), Effective Remembrance, state statistics);
- :mod:`~dynlab.lm.run.task` — train and test one :class:`~dynlab.lm.spec.LMTaskRunSpec` on a
  long-context task.

Nothing is imported here.
"""
