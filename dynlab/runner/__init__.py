"""How a study runs, for both papers and naming neither (tests/house/test_layering.py):

- :mod:`~dynlab.runner.protocol` — the :class:`~dynlab.runner.protocol.Study` protocol that
  every module in ``studies/`` follows: the common selections (preset, models, seeds), a
  study's own options (typed by its ``StudyExtra``), its hooks, and the stored result of a run;
- :mod:`~dynlab.runner.driver` — :func:`~dynlab.runner.driver.run_study` and
  :func:`~dynlab.runner.driver.analyze_study`: check the specs, take the study's lock, skip
  finished runs and write the study dataset;
- :mod:`~dynlab.runner.loop` — the loop over a study's runs under the lock: heal damaged
  runs, train the unfinished ones where the executor runs them, store each as it arrives,
  analyse.

Nothing is imported here, so that the protocol loads without the store and the executors.
"""
