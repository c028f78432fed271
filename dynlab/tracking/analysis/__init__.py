"""Paper A's analysis: the error control of one trained tracker, and across a study's runs.

- :mod:`~dynlab.tracking.analysis.spec` — what the analysis computes (docs/error-control.md),
  its settings (:class:`~dynlab.tracking.analysis.spec.AnalysisSpec`) and the streams of
  fresh sequences it reads;
- :mod:`~dynlab.tracking.analysis.pipeline` — :func:`~dynlab.tracking.analysis.pipeline.analyze_tracker`,
  one function per step, on the shared analyses of :mod:`dynlab.analysis`;
- :mod:`~dynlab.tracking.analysis.horizon` — T_horizon, the forecast of mp from the decoder
  margins of sequences no longer than the training length;
- :mod:`~dynlab.tracking.analysis.preregistered` — the pre-registered forecast of mp and its
  score on unseen seeds;
- :mod:`~dynlab.tracking.analysis.fixed_points` — the trackers' fixed points on the shared
  finder (:mod:`dynlab.analysis.fixed_points`).

Nothing is imported here: the study-level statistics load without torch.
"""
