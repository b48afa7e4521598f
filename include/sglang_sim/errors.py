"""The simulator's own errors: a bad node, preset, faults file or model config, named with its file."""

from __future__ import annotations


class SimError(Exception):
    """Base of what the simulator raises on purpose; ``hint`` says what to do, after the message."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 hint: str | None = None) -> None:
        self.message, self.path, self.line, self.hint = message, path, line, hint
        where = f"{path}:{line}" if path is not None and line is not None else path
        text = f"[{where}] {message}" if where else message
        super().__init__(f"{text}\nWhat to check next: {hint}" if hint else text)


class SimConfigError(SimError):
    """A node, preset, settings or faults file the simulator cannot use."""


class SimModelConfigError(SimError):
    """A model folder (config.json, safetensors) the simulated server cannot load, as SGLang would refuse it."""
