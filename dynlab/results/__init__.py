"""Dataset schema and the run store."""

from dynlab.results.schema import VARIABLES, annotate, open_dataset, provenance_attrs, register_variables, write_dataset
from dynlab.results.store import RunStore

__all__ = ["RunStore", "VARIABLES", "annotate", "open_dataset", "provenance_attrs", "register_variables", "write_dataset"]
