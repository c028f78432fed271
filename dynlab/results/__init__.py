"""Dataset schema and the run store."""

from dynlab.results.schema import VARIABLES, annotate, open_dataset, provenance_attrs, write_dataset
from dynlab.results.store import RunStore
from dynlab.results.vocabulary import attrs_of, var

__all__ = ["RunStore", "VARIABLES", "annotate", "open_dataset", "provenance_attrs", "write_dataset", "attrs_of", "var"]
