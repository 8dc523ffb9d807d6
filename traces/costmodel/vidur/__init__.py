"""Vidur's measured GPU operator profiles (github.com/microsoft/vidur, MIT) as rlfleet cost tables.

names.py maps Vidur's folders to the catalog, operators.py reads its raw tables, compose.py builds
an iteration from them as Vidur does (plus the parts its stored tables lack), importer.py makes rows.
"""

from traces.costmodel.vidur.importer import Grid, commit_of, import_rows, pairs, profiling_root
from traces.costmodel.vidur.names import vidur_gpu, vidur_model

__all__ = ["Grid", "commit_of", "import_rows", "pairs", "profiling_root", "vidur_gpu", "vidur_model"]
