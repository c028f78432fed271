"""Paper B's models to and from the Hugging Face side:

- :mod:`~dynlab.lm.hub.checkpoint` — a checkpoint folder (a Hugging Face Mamba / Mamba-2
  model, or a dynlab run) read into a :class:`~dynlab.lm.models.model.RecurrentLM`;
- :mod:`~dynlab.lm.hub.hf` — the ``transformers`` classes behind it (imported on use);
- :mod:`~dynlab.lm.hub.export` — a dynlab run written as a ``from_pretrained`` folder;
- :mod:`~dynlab.lm.hub.card` — its model card.

Nothing is imported here, so that ``transformers`` stays optional.
"""
