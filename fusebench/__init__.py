"""fusebench: benchmark and profile PyTorch execution modes honestly."""
from fusebench.version import __version__


def load_results(paths):
    """Results files -> pandas.DataFrame, one row per record (see fusebench.results.frame)."""
    from fusebench.results.frame import load_results as _load
    return _load(paths)


__all__ = ["__version__", "load_results"]
