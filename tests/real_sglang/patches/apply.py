"""Apply the CPU-without-AMX source patches to the SGLang 0.5.23 copy in a venv's site-packages.

Usage: ``python tests/real_sglang/patches/apply.py SITE_PACKAGES`` (``scripts/sglang-server-venv.sh`` runs it).

On a CPU without AMX two places in SGLang's hybrid (Gated DeltaNet) model path fall through to Triton, which
has no CPU driver (``RuntimeError: 0 active drivers``); each patch below gives that case a plain torch path.
Every patch replaces one exact piece of text; one already applied is skipped, so running this again is
harmless. Old text that is missing (another SGLang version) stops the run with the file and the patch named,
and no file is written. Only files under SITE_PACKAGES change.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

MARK = "# tests/real_sglang/patches:"  # in every new text, so a patched file says where its change comes from


@dataclass(frozen=True)
class Patch:
    name: str
    path: str  # relative to site-packages
    reason: str
    old: str
    new: str


PATCHES = [
    Patch(
        name="rmsnorm-gated-torch",
        path="sglang/kernels/ops/attention/fla/fused_norm_gate.py",
        reason="FusedRMSNormGated.forward (the gated norm after every Gated DeltaNet layer) uses an sgl_kernel "
               "op only with AMX, else Triton; add a torch path for CPUs without AMX",
        old="""            return torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu(
                x, self.weight, g, self.eps
            )
        else:
""",
        new=f"""            return torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu(
                x, self.weight, g, self.eps
            )
        elif is_cpu() and residual is None and not prenorm:
            {MARK} no AMX and no Triton driver on this CPU.
            # The Triton kernel's math: y = rmsnorm(x) * weight * act(g), in float32.
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
            if self.weight is not None:
                y = y * self.weight.float()
            gate = g.float()
            gate = torch.sigmoid(gate) if self.activation == "sigmoid" else gate * torch.sigmoid(gate)
            return (y * gate).to(x.dtype)
        else:
""",
    ),
    Patch(
        name="moe-shared-gate-unfused-on-cpu",
        path="sglang/srt/models/qwen2_moe.py",
        reason="Qwen2MoeSparseMoeBlock.forward_normal fuses the shared-expert gate with a Triton kernel "
               "unless AMX is in use; on CPU take the unfused torch gate, as the AMX path does",
        old="""        use_fused_gate = (
            self.shared_expert_gate is not None
            and not use_intel_amx_backend(self.shared_expert_gate)
            and not is_npu()
        )
""",
        new=f"""        use_fused_gate = (
            self.shared_expert_gate is not None
            and not use_intel_amx_backend(self.shared_expert_gate)
            and not is_npu()
            and not is_cpu()  {MARK} the fused gate is a Triton kernel
        )
""",
    ),
]


class PatchError(RuntimeError):
    pass


def plan(site_packages: Path) -> tuple[dict[Path, str], list[str]]:
    """The new text of every file a patch changes, and one line per patch saying what happens to it."""
    texts: dict[Path, str] = {}
    report = []
    for patch in PATCHES:
        target = site_packages / patch.path
        if not target.is_file():
            raise PatchError(f"patch {patch.name}: {target} does not exist")
        text = texts.get(target) or target.read_text()
        if patch.new in text:
            report.append(f"{patch.name}: already applied to {patch.path}")
            continue
        count = text.count(patch.old)
        if count != 1:
            found = "not found" if count == 0 else f"found {count} times"
            raise PatchError(f"patch {patch.name}: the old text is {found} in {target} "
                             f"(not SGLang 0.5.23's copy?); nothing was changed")
        texts[target] = text.replace(patch.old, patch.new)
        report.append(f"{patch.name}: applied to {patch.path} ({patch.reason})")
    return texts, report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    site_packages = Path(argv[0])
    try:
        texts, report = plan(site_packages)
    except PatchError as error:
        print(f"sglang patches: {error}", file=sys.stderr)
        return 1
    for target, text in texts.items():
        target.write_text(text)
    for line in report:
        print(f"sglang patches: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
