"""The application layer: what each ``dynlab`` command does, callable from Python with the
command line's checks and its one-line errors (:class:`~dynlab.errors.DynlabInputError`;
the command line exits with code 2).  ``cli.py`` only declares the commands and their
options and calls these functions.

One module per command family:

- :mod:`dynlab.app.study`: ``dynlab study NAME`` (:func:`~dynlab.app.study.run_tracking_study`,
  :func:`~dynlab.app.study.run_lm_study`) and ``dynlab study list``;
- :mod:`dynlab.app.analyze`: ``dynlab analyze``;
- :mod:`dynlab.app.figures`: ``dynlab figures``;
- :mod:`dynlab.app.report`: ``dynlab report``;
- :mod:`dynlab.app.export`: ``dynlab lm export``;
- :mod:`dynlab.app.posttrain`: ``dynlab lm post-train``;
- :mod:`dynlab.app.data`: ``dynlab data prepare``;
- :mod:`dynlab.app.bench`: ``dynlab bench train``, ``dynlab bench lm``;
- :mod:`dynlab.app.models`: ``dynlab models``;

and beneath them :mod:`dynlab.app.checks` (what every command checks in what a user typed),
:mod:`dynlab.app.folders` (the folders a command writes), :mod:`dynlab.app.lm_config` (the
LM studies' knobs and ``--config`` file) and :mod:`dynlab.app.console` (the terminal).
Importing any of them loads neither torch nor matplotlib.
"""
