"""Pieces of the memory profile and the tuner.

``fleetgen.memory`` and ``fleetgen.tuner`` are the public faces; the modules here hold the parts:

- ``options``: the SGLang launch options that change memory, parsed from a user's extra args.
- ``geometry``: a model's ``config.json`` -> layer counts, head shapes, state shapes.
- ``sizing``: SGLang 0.5.23's own memory arithmetic (sglang-facts sections 1.1, 2 and 3), mirrored.
- ``plan``: the plan's data types (workload, bounds, server plan) and their JSON form.
- ``budget``: the budget table a person checks by hand, and the read-back comparison.
"""
