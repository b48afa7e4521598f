"""The budget table's state-slot note names the radix strategy the ratio comes from, or that it is off."""

from fleetgen.tuning.planner import TunerBounds, plan_server
from fleetgen.tuning.profile import LaunchOptions, profile_model


def _state_note(cases, args):
    options = LaunchOptions.from_args(args)
    profile = profile_model(cases.load_config("seed-qwen3.6-27b.json"), cases.SEED_WEIGHTS_BYTES, options)
    plan = plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[cases.gpu_row(0)], profile=profile,
                       options=options, workload=cases.SEED_WORKLOAD, bounds=TunerBounds())
    return next(row["note"] for row in plan.budget if row["item"].strip() == "state slots")


def test_state_slot_note_says_radix_off_without_a_radix_cache(cases):
    assert _state_note(cases, ["--disable-radix-cache"]).endswith("; ratio 1 slots/request (radix off) (2.3)")


def test_state_slot_note_names_the_radix_strategy(cases):
    assert _state_note(cases, cases.SEED_EXTRA_ARGS).endswith("slots/request (extra_buffer) (2.3)")
