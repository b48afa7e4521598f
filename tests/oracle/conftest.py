"""Lets the matrix tests import ``oracle_harness`` (its helpers) by name."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)
