"""Task sources: parsers that turn what teams already have into `Task`s plus rejects."""

from envforge.sources.result import LoadResult
from envforge.sources.specs import discover_spec_files, load_spec_file, load_specs

__all__ = ["LoadResult", "discover_spec_files", "load_spec_file", "load_specs"]
