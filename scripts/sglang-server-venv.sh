#!/usr/bin/env bash
# Make .sglang-venv/ (built by scripts/sglang-venv.sh) able to run the real SGLang 0.5.23 server on a
# CPU-only machine, for the tests in tests/real_sglang/ (docs/real-sglang.md says what each step unblocks):
#   1. the packages sglang.launch_server imports beyond sglang.srt.server_args, every one pinned;
#   2. torchvision 0.28.0 without its dependencies, and a .pth file that registers an empty
#      torchvision._meta_registrations before torchvision imports (its C++ ops need CUDA libraries);
#   3. the small source changes the hybrid (Gated DeltaNet) models need on a CPU without AMX
#      (tests/real_sglang/patches/), applied to this venv's copy of SGLang only.
# The sgl_kernel import stand-in is not installed: the tests put tests/real_sglang/stand_ins on the server's
# PYTHONPATH. From the base venv: about 20 s and 0.3 GB.
# Usage: scripts/sglang-server-venv.sh [VENV_DIR]   (default: .sglang-venv in the repository root)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${1:-$repo_root/.sglang-venv}"
python="$venv_dir/bin/python"
log="$venv_dir/server-install.log"
stand_ins="$repo_root/tests/real_sglang/stand_ins"
check='import fastapi, uvicorn, uvloop, xgrammar, openai, torchvision.transforms, sglang.srt.configs, sglang.srt.entrypoints.http_server'

if [[ ! -x "$python" ]]; then
    echo "sglang-server-venv: $venv_dir has no python; run scripts/sglang-venv.sh first" >&2
    exit 1
fi
started=$(date +%s)
install() {
    if ! "$python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
        echo "sglang-server-venv: pip install $* failed; last lines of $log:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
}
install fastapi==0.165.0 uvicorn==0.54.0 uvloop==0.23.0 setproctitle==1.3.8 python-multipart==0.0.34 \
    einops==0.8.2 partial_json_parser==0.2.1.1.post7 interegular==0.3.3 sentencepiece==0.2.1 scipy==1.17.1 \
    xxhash==4.1.0 zstandard==0.25.0 distro==1.9.0 loguru==0.7.3 gguf==0.19.0 jsonschema==4.26.0 \
    jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 apache-tvm-ffi==0.1.11 \
    openai==2.8.0 jiter==0.19.0 sniffio==1.3.1 opentelemetry-api==1.45.2 xgrammar==0.2.7 soundfile==0.13.1 \
    cffi==2.1.1 pycparser==3.12
install --no-deps compressed-tensors==0.18.0 torchvision==0.28.0
site_packages="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp "$stand_ins/torchvision_meta_stub.pth" "$site_packages/fleetgen_torchvision_meta_stub.pth"
if [[ -d "$repo_root/tests/real_sglang/patches" ]]; then
    "$python" "$repo_root/tests/real_sglang/patches/apply.py" "$site_packages"
fi
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$stand_ins" "$python" -c "$check"
echo "sglang-server-venv: ready in $(( $(date +%s) - started )) s"
