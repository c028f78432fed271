"""Task samplers.  Every sampler takes ``(generator, batch_size, length)``."""

from dynlab.tasks.word_problem import WordProblem

__all__ = ["WordProblem"]
