"""Fixed points and slow points of any recurrent map, and their Jacobian spectra (float64):

- :mod:`~dynlab.analysis.fixed_points.finder` — the finder, a pipeline of small steps (its
  docstring describes them), and the maps it solves on;
- :mod:`~dynlab.analysis.fixed_points.solve` — steps 1-4: the starts, the Levenberg-Marquardt
  solve with Newton polishing, the residual filter and the deduplication;
- :mod:`~dynlab.analysis.fixed_points.slow_points` — slow points: the local minima of the
  speed ½‖F(h) − h‖², where the map moves least (a fixed point is one of speed 0).

Paper A's reading of them on the trackers: :mod:`dynlab.tracking.analysis.fixed_points`;
paper B's on the LMs: :mod:`dynlab.lm.analysis.recurrence`.  Nothing is imported here.
"""
