#!/usr/bin/env python3
"""Run tidegate on the local cluster by hand (the launcher the e2e tests use), until Ctrl-C.

    eval "$(e2e/cluster/cluster.sh env)"
    .venv/bin/python e2e/local.py            # prints the namespace to apply InferencePools in

The repo root is appended (not prepended) to sys.path: prepended, its ``operator/`` folder would
shadow the standard library's ``operator`` module.
"""

import pathlib
import sys

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))

from tests.e2e.harness.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
