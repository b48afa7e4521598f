"""fleetgen: tune, relaunch and drive a fleet of SGLang servers for large offline generation."""

__version__ = "0.1.0"
