"""The Python workers' daemon in local runs (`spark.python.daemon.module`): `pyspark.daemon`,
with pyspark imported from its installed package instead of the `pyspark.zip` Spark puts
first on the workers' path.

Python compiles a zip's modules from source at every import (it keeps no bytecode for them):
measured, 0.6 CPU s for a daemon's pyspark imports against 0.1 from the package, and a little
for each worker it forks; about 1-2 CPU s of a 10M-event audit's ~23 in Python. The zip is
dropped only when it is the installed package's own copy (`<pyspark>/python/lib/pyspark.zip`,
as a pip install ships it), so the code the workers run is the same.
"""

from __future__ import annotations

import os
import runpy
import sys
from importlib.machinery import PathFinder


def without_shipped_zip(path: list[str]) -> list[str]:
    """`path` without the pyspark.zip of the pyspark package it can import; unchanged otherwise."""
    zips = [p for p in path if os.path.basename(p) == "pyspark.zip"]
    rest = [p for p in path if p not in zips]
    spec = PathFinder.find_spec("pyspark", rest)
    if not zips or spec is None or not spec.submodule_search_locations:
        return path
    package = os.path.realpath(next(iter(spec.submodule_search_locations)))
    shipped = os.path.join(package, "python", "lib", "pyspark.zip")
    return rest if all(os.path.realpath(z) == shipped for z in zips) else path


def main() -> None:
    sys.path[:] = without_shipped_zip(sys.path)
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
