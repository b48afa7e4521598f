"""Makes the shared fakes of the unit tests (generate_fakes.py: a fake fleet; validate_fixtures.py: a synthetic
run's output) importable by name under --import-mode=importlib."""

import sys
from pathlib import Path

_here = str(Path(__file__).resolve().parent)
if _here not in sys.path:
    sys.path.insert(0, _here)
