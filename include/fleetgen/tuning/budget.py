"""The budget table a person checks by hand, and the read-back of what SGLang actually allowed.

The numbers in parentheses in the notes are sections of docs/sglang-memory-model.md.
"""

from __future__ import annotations

from fleetgen.nodes.readiness import ServerInfo
from fleetgen.tuning.profile import GIB, MIB, MemoryProfile
from fleetgen.tuning.plan import ServerPlan, format_flag_value
from fleetgen.tuning.sizing import PoolSizing, ReserveEstimate


def budget_rows(profile: MemoryProfile, sizing: PoolSizing, reserve: ReserveEstimate, summary: dict) -> list[dict]:
    """Rows of (item, bytes, note). Indented items add up to the row above them."""
    mfs = sizing.mem_fraction_static
    pre = summary["pre_load_free_bytes"]
    static = int(pre * mfs)
    free = pre - static
    k = sizing.max_mamba_cache_size
    slot_mib = profile.state_bytes_per_slot / MIB
    outside = profile.draft_kv_bytes_per_token_outside * sizing.max_total_num_tokens
    rows = [
        ("GPU total", summary["gpu_total_bytes"], "nvidia-smi memory.total (smallest GPU of the server)"),
        ("held by other processes", summary["foreign_bytes"], "foreign processes on the GPU; ours are stopped first"),
        ("CUDA context of the new server", summary["cuda_context_bytes"],
         "fleetgen constants: CUDA context (+ NCCL buffers when tp > 1), taken before the baseline"),
    ]
    if summary.get("calibration_bytes"):
        rows.append(("calibration from readback", summary["calibration_bytes"],
                     "measured by the last run's readback on this GPU / SGLang version / model / tp"))
    rows += [
        ("pre-load free (SGLang baseline)", pre, "free MiB + ours - context - calibration, MIN over ranks (2.1)"),
        ("static budget", static, f"pre-load free x --mem-fraction-static {format_flag_value(mfs)} (2.1)"),
        ("  weights per GPU", profile.weights_bytes_per_gpu,
         f"safetensors total // tp {profile.tp_size}, target + draft (2.1)"),
        ("  multimodal cache reservation", profile.multimodal_reserve_bytes, "SGLANG_VLM_CACHE_SIZE_MB (2.1)"),
    ]
    if profile.is_hybrid:
        rows.append(("  state slots", sizing.state_bytes,
                     f"(K {k} + 1 padding) x P {slot_mib:.2f} MiB; ratio {profile.state_slots_per_request} "
                     f"slots/request ({profile.radix_strategy or 'radix off'}) (2.3)"))
        if profile.draft_tokens:
            rows.append(("  speculative buffers", sizing.spec_bytes,
                         f"({sizing.spec_requests} requests + 1) x D {profile.draft_tokens} x P (2.3)"))
    rows.append(("  KV pool", sizing.kv_bytes, f"{sizing.max_total_num_tokens} tokens x "
                 f"{profile.kv_bytes_per_token} B/token, page floor (2.2)"))
    if sizing.swa_max_total_num_tokens is not None:
        rows.append(("  SWA KV pool", sizing.swa_kv_bytes, f"{sizing.swa_max_total_num_tokens} tokens "
                     f"(--swa-full-tokens-ratio {format_flag_value(profile.swa_full_tokens_ratio)} x full) x "
                     f"{profile.swa_kv_bytes_per_token} B/token (2.5)"))
    accounted = (profile.weights_bytes_per_gpu + profile.multimodal_reserve_bytes + sizing.state_bytes
                 + sizing.spec_bytes + sizing.kv_bytes + sizing.swa_kv_bytes)
    rows += [
        ("  unused in the static budget", static - accounted, "floors of K and tokens"),
        ("non-static (free after pools)", free, f"pre-load free x (1 - {format_flag_value(mfs)})"),
        ("  SGLang reserve", reserve.total_bytes, f"activations + CUDA graphs: {reserve.formula()} (1.1)"),
    ]
    if outside:
        rows.append(("  MTP draft KV pool", outside, f"{sizing.max_total_num_tokens} tokens x "
                     f"{profile.draft_kv_bytes_per_token_outside} B/token, allocated outside the budget (2.2)"))
    rows += [
        ("  user margin", summary["margin_bytes"], "TunerBounds.margin_mib (+ backoff steps)"),
        ("  stays free", free - reserve.total_bytes - outside - summary["margin_bytes"],
         "non-static minus the rows above"),
    ]
    return [{"item": item, "bytes": int(value), "note": note} for item, value, note in rows]


def render_budget_table(plan: ServerPlan) -> str:
    """Fixed-width text for the task log: flags, expected values, then the budget in MiB and GiB."""
    expected = plan.expected
    lines = [f"plan for {plan.server} GPUs {plan.gpu_ids} (mode {plan.mode}, attempt {plan.attempt})",
             "  flags: " + (" ".join(plan.command_args()) or "(none: SGLang sizes automatically)"),
             f"  expected: max_running_requests {expected['max_running_requests']}, max_mamba_cache_size "
             f"{expected['max_mamba_cache_size']}, max_total_num_tokens {expected['max_total_num_tokens']}"]
    width = max(len(row["item"]) for row in plan.budget)
    lines.append(f"  {'item'.ljust(width)}  {'MiB':>12}  {'GiB':>9}  note")
    for row in plan.budget:
        lines.append(f"  {row['item'].ljust(width)}  {row['bytes'] / MIB:>12,.1f}  {row['bytes'] / GIB:>9.2f}  "
                     f"{row['note']}")
    lines += [f"  note: {note}" for note in plan.notes]
    if plan.inputs.get("workload_mode"):
        from fleetgen.tuning.workload import render_workload_table

        lines.append(render_workload_table(plan.inputs["workload_mode"]))
    return "\n".join(lines)


def compare_expected(plan: ServerPlan, info: ServerInfo) -> list[str]:
    """Mismatch lines between the plan and what the server reports (docs/sglang-memory-model.md §5.5);
    empty when they agree.

    Per data-parallel rank: the effective max running requests, the computed Mamba slots and a sliding-window
    model's SWA pool tokens;
    ``max_total_num_tokens`` from the top level (scheduler handshake), else from each rank. A value
    higher than planned is a mismatch as much as a lower one: either way the plan's arithmetic is off.
    """
    where = plan.server
    expected = plan.expected
    lines: list[str] = []

    def check(name: str, want, got, source: str) -> None:
        if got is None:
            lines.append(f"{where}: {name}: expected {want}, /server_info has no {source}")
        elif want != got:
            lines.append(f"{where}: {name}: expected {want}, SGLang reports {got} ({source})")

    for index, rank in enumerate(info.ranks):
        check("max_running_requests", expected["max_running_requests"], rank.max_running_requests,
              f"internal_states[{index}].effective_max_running_requests_per_dp")
        if expected["max_mamba_cache_size"] is not None:
            check("max_mamba_cache_size", expected["max_mamba_cache_size"], rank.max_mamba_cache_size,
                  f"internal_states[{index}].max_mamba_cache_size")
        if info.top_level_total_tokens is None:
            check("max_total_num_tokens", expected["max_total_num_tokens"], rank.max_total_num_tokens,
                  f"internal_states[{index}].max_total_num_tokens")
        if expected.get("swa_max_total_num_tokens") is not None:
            check("swa_max_total_num_tokens", expected["swa_max_total_num_tokens"], rank.swa_max_total_num_tokens,
                  f"internal_states[{index}].memory_usage.token_capacity_swa")
    if info.top_level_total_tokens is not None:
        check("max_total_num_tokens", expected["max_total_num_tokens"], info.top_level_total_tokens,
              "max_total_num_tokens")
    return lines
