"""Tuning: from a model and the GPU memory a node really has to SGLang launch flags.

The public face is this package; the modules hold the parts, in the order a plan is made:

- ``options``: the SGLang launch options that change memory, parsed from a user's extra args.
- ``geometry``: a model's ``config.json`` -> layer counts, head shapes, state shapes.
- ``profile``: what SGLang 0.5.23 charges per token, per request slot and for weights (docs/sglang-memory-model.md).
- ``sizing``: SGLang 0.5.23's own pool arithmetic, mirrored (docs/sglang-memory-model.md).
- ``plan``: the plan's data types (workload, bounds, server plan) and their JSON form.
- ``planner``: the search for the flags, and the back-off after a memory failure.
- ``budget``: the budget table a person checks by hand, and the read-back comparison.
"""

from fleetgen.tuning.budget import compare_expected, render_budget_table
from fleetgen.tuning.options import LaunchOptions
from fleetgen.tuning.plan import ServerPlan, TunerBounds, Workload
from fleetgen.tuning.planner import MAX_BACKOFF_ATTEMPTS, backoff, plan_server
from fleetgen.tuning.profile import MemoryProfile, profile_model, weights_bytes_from_index

__all__ = ["LaunchOptions", "MAX_BACKOFF_ATTEMPTS", "MemoryProfile", "ServerPlan", "TunerBounds", "Workload", "backoff",
           "compare_expected", "plan_server", "profile_model", "render_budget_table", "weights_bytes_from_index"]
