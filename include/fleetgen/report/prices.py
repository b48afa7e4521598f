"""What a GPU-hour costs: the DAG parameter ``gpu_hour_price``, checked once (``fleetgen.airflow.run_config``).

    {"currency": "USD", "per_gpu_hour": {"NVIDIA B200": 6.03, "NVIDIA H200": 4.54}}

(Spheron's on-demand prices of 17 March 2026, https://www.spheron.network/blog/nvidia-h200-vs-b200-vs-gb200: an
example of the shape, not a default.)

Each key is a GPU's name exactly as ``nvidia-smi --query-gpu=name`` prints it (the probe's inventory keeps it as
read); the value is what one GPU-hour of it costs in ``currency``. Empty (the default): the report shows GPU-hours
and no money. A GPU of the fleet that has no price is named in the report, never priced by a guess.
No pandas or Airflow here: the run configuration imports this when the DAG is parsed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetgen.errors import ConfigError

PARAMETER = "gpu_hour_price"
KEYS = ("currency", "per_gpu_hour")
MAX_PRICE = 1_000_000.0  # per GPU-hour: a bound on typos (a price in cents, a pasted total), not on any market
MAX_CURRENCY_CHARS = 16
EXAMPLE = '{"currency": "USD", "per_gpu_hour": {"NVIDIA B200": 6.03}}'  # the shape; the figure as in the doc above


@dataclass(frozen=True)
class GpuHourPrice:
    """Price per GPU-hour by GPU name, in one currency; ``priced`` is false for the empty default."""

    currency: str | None = None
    per_gpu_hour: Mapping[str, float] = field(default_factory=dict)

    @property
    def priced(self) -> bool:
        return bool(self.per_gpu_hour)

    def of(self, gpu_name: str | None) -> float | None:
        """The price of one hour of ``gpu_name``, None when none was given for it."""
        return self.per_gpu_hour.get(gpu_name) if gpu_name is not None else None

    def unused(self, gpu_names: Iterable[str]) -> list[str]:
        """The priced names no GPU of the fleet has (a name spelt otherwise than nvidia-smi prints it)."""
        seen = set(gpu_names)
        return sorted(name for name in self.per_gpu_hour if name not in seen)

    def to_dict(self) -> dict:
        return {"currency": self.currency, "per_gpu_hour": dict(self.per_gpu_hour)} if self.priced else {}


def _refuse(what: str) -> ConfigError:
    return ConfigError(f"DAG parameter {PARAMETER} {what}",
                       hint=f"set {PARAMETER} in the trigger form or the run's conf as {EXAMPLE} (GPU names as "
                            f"nvidia-smi prints them), or leave it {{}} for GPU-hours without money")


def read_gpu_hour_price(value: Any) -> GpuHourPrice:
    """The checked price list; a ConfigError names the parameter, the entry and what it accepts."""
    if not isinstance(value, Mapping):
        raise _refuse(f"must be an object like {EXAMPLE}, got {value!r}")
    if not value:
        return GpuHourPrice()
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise _refuse(f"has unknown key(s) {', '.join(map(repr, unknown))}; it takes {' and '.join(KEYS)}")
    prices, currency = value.get("per_gpu_hour"), value.get("currency")
    if not isinstance(prices, Mapping) or not prices:
        raise _refuse(f"per_gpu_hour must be a non-empty object of GPU name to price per GPU-hour, got {prices!r}")
    if not isinstance(currency, str) or not currency.strip() or len(currency.strip()) > MAX_CURRENCY_CHARS:
        raise _refuse(f"currency must be a non-empty text of at most {MAX_CURRENCY_CHARS} characters (e.g. USD), "
                      f"got {currency!r}")
    checked: dict[str, float] = {}
    for name, price in prices.items():
        if not isinstance(name, str) or not name.strip():
            raise _refuse(f"per_gpu_hour has an entry without a GPU name: {name!r}")
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) \
                or not 0 <= price <= MAX_PRICE:
            raise _refuse(f"per_gpu_hour entry {name!r} must be a price per GPU-hour from 0 to {MAX_PRICE:,.0f}, "
                          f"got {price!r}")
        if name.strip() in checked:
            raise _refuse(f"per_gpu_hour names {name.strip()!r} twice (once with spaces around it)")
        checked[name.strip()] = float(price)
    return GpuHourPrice(currency=currency.strip(), per_gpu_hour=checked)
