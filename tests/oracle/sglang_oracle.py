"""SGLang 0.5.23's own argument resolution and memory-pool sizing, run on CPU with the GPU mocked.

Runs inside the SGLang venv (``scripts/sglang-venv.sh``), never in the project's own: it imports
SGLang once and sizes every case read from stdin, printing one JSON line of results.

A case is ``{"id", "argv", "gpu": {"total_mib", "arch"}, "pre_model_load_bytes", "available_bytes"}``:
``argv`` is the server's flags as the launcher writes them (``--model-path`` to a folder with a
config.json); ``arch`` is the GPU generation (``sm100`` B200, ``sm90`` H100/H200, ``sm89`` L40S/L4,
``sm86`` A10G, ``sm80`` A100); the two byte counts are what SGLang measures on the real GPU: the free memory before
the weights load (``distributed/bootstrap.py::measure_pre_model_load_memory``) and after
(``get_available_gpu_memory`` in ``mem_cache/kv_cache_configurator.py``).

What is mocked, and only that: the GPU probes (``override_platform``), the memory capacity
(``get_device_memory_capacity`` / ``get_nvgpu_memory_capacity``, nvidia-smi's memory.total) and the
free-memory reading; GPU-only packages (kernels, ``flashinfer``, ``tvm_ffi``, ...) are import-time
stubs, since resolution and sizing only import them. Everything else is SGLang's code:
``prepare_server_args`` -> ``ServerArgs.resolve_once`` -> ``runtime_context.publish`` ->
``KVCacheConfigurator._resolve_memory_pool_config``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import types
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec

# GPU-only packages SGLang imports at module level on the resolution and sizing paths.
STUBBED_PACKAGES = ("sgl_kernel", "flashinfer", "tvm_ffi", "torchvision", "sentencepiece", "compressed_tensors",
                    "gguf")
# Environment variables a model override may set for the rest of the process (qwen3_vl.py sets
# SGLANG_VLM_CACHE_SIZE_MB / SGLANG_MM_FEATURE_CACHE_MB): restored before every case.
CASE_ENV = ("SGLANG_VLM_CACHE_SIZE_MB", "SGLANG_MM_FEATURE_CACHE_MB", "SGLANG_MAMBA_SSM_DTYPE",
            "SGLANG_MAMBA_CONV_DTYPE")
GIB = 1 << 30

# runtime_context._PLATFORM_PROBES for each GPU generation, as the probes in utils/common.py answer
# them on that hardware with CUDA 12.8+.
ARCH_FACTS = {
    "sm100": dict(is_sm90=False, is_sm100=True, is_sm100_or_sm110=True, is_sm110=False, is_sm120=False,
                  is_blackwell=True, is_hopper_with_cuda_12_3=False, device_sm=100, device_capability=(10, 0)),
    "sm90": dict(is_sm90=True, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=False,
                 is_blackwell=False, is_hopper_with_cuda_12_3=True, device_sm=90, device_capability=(9, 0)),
    "sm89": dict(is_sm90=False, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=False,
                 is_blackwell=False, is_hopper_with_cuda_12_3=False, device_sm=89, device_capability=(8, 9)),
    "sm80": dict(is_sm90=False, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=False,
                 is_blackwell=False, is_hopper_with_cuda_12_3=False, device_sm=80, device_capability=(8, 0)),
    "sm86": dict(is_sm90=False, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=False,
                 is_blackwell=False, is_hopper_with_cuda_12_3=False, device_sm=86, device_capability=(8, 6)),
}
# The capability import-time probes see; sizing reads each case's own.
IMPORT_DEVICE_CAPABILITY = (9, 0)
COMMON_FACTS = dict(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False,
                    has_amx=False, has_flashinfer=True)


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        # the same object on every access: SGLang compares stubbed constants by identity (marlin_utils checks
        # ``quant_type in supported_types`` with scalar_types.uint4 from sgl_kernel)
        value = _stub_class(name)
        type.__setattr__(cls, name, value)
        return value


class _Anything(metaclass=_StubMeta):
    """Stands for any attribute of a stubbed package: a base class, a decorator, a constant."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


def _stub_class(name: str) -> type:
    return _StubMeta(name, (_Anything,), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(name)
        setattr(self, name, value)
        return value


class _StubFinder(MetaPathFinder, Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED_PACKAGES:
            return ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def _install_stubs() -> None:
    # transformers probes torchvision once (lru_cache): answer "absent" before the stub exists.
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    import_utils.is_torchvision_v2_available()
    sys.meta_path.insert(0, _StubFinder())


def _cuda_before_import() -> None:
    """Answer ``is_cuda()`` (torch.version.cuda on a CUDA build) as a CUDA machine does before the rest of
    SGLang imports: modules read it at import time (``layers/quantization/__init__.py`` registers MXFP4 only on
    CUDA; ``awq.py`` keeps ``_is_cuda`` for the Marlin upgrade)."""
    import sglang.srt.utils as utils
    import sglang.srt.utils.common as common

    for module in (common, utils):
        module.is_cuda = lambda: True
        module.is_cuda_alike = lambda: True
        # what import-time kernel probes read on a CUDA build (fp8_utils.cutlass_fp8_supported, ...); each
        # case then answers its own GPU's (``_Sglang.size``)
        module.get_device_capability = lambda *args, **kwargs: IMPORT_DEVICE_CAPABILITY


def _import_sglang():
    _install_stubs()
    _cuda_before_import()
    import sglang.srt.arg_groups.pipeline  # noqa: F401  (imports every hook module)
    import sglang.srt.mem_cache.kv_cache_configurator as configurator_module
    from sglang.srt import runtime_context
    from sglang.srt.server_args import prepare_server_args

    return configurator_module, runtime_context, prepare_server_args


def _patch_everywhere(name: str, value) -> None:
    """Replace ``name`` in every SGLang module that imported it (``from ... import name``)."""
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "__name__", "").startswith("sglang") and hasattr(module, name):
            setattr(module, name, value)


def _reset_env(saved: dict) -> None:
    from sglang.srt.environ import envs

    for name in CASE_ENV:
        if saved[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved[name]
        variable = getattr(envs, name, None)
        if variable is not None and hasattr(variable, "clear"):
            variable.clear()


class _Sglang:
    """SGLang's modules, imported once; ``size`` runs one case."""

    def __init__(self) -> None:
        self.configurator_module, self.runtime_context, self.prepare_server_args = _import_sglang()
        from sglang.srt.arg_groups.overrides import model_config_of, resolving_view
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.model_loader import loader
        from sglang.srt.mem_cache import kv_cache_dtype
        from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
        from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
            resolve_spec_aux_hidden_state_config)
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.model_config_of, self.resolving_view = model_config_of, resolving_view
        self.LoadConfig, self.loader = LoadConfig, loader
        # _get_quantization_config imports the model class only for its packed-module names (how fused layers
        # map to checkpoint tensors), which the quantization method and its KV dtype do not depend on; model
        # modules that need GPU kernels do not import here.
        loader.get_model_architecture = lambda model_config: (
            types.SimpleNamespace(packed_modules_mapping={}), model_config.hf_config.architectures[0])
        self.kv_cache_dtype = kv_cache_dtype
        self.resolve_layer_indices = resolve_layer_indices
        self.resolve_spec_aux = resolve_spec_aux_hidden_state_config
        self.SpeculativeAlgorithm = SpeculativeAlgorithm
        self.saved_env = {name: os.environ.get(name) for name in CASE_ENV}
        self.gpu_total_mib = None
        self.available_gib = None
        # utils.is_cuda() (torch.version.cuda) decides defaults outside the platform probes, e.g. the
        # breakable prefill CUDA graph (model_executor/cuda_graph_config.py::default_prefill_backend).
        _patch_everywhere("is_cuda", lambda: True)
        capacity = lambda *args, **kwargs: self.gpu_total_mib  # noqa: E731
        _patch_everywhere("get_device_memory_capacity", capacity)
        _patch_everywhere("get_nvgpu_memory_capacity", capacity)
        self.configurator_module.get_available_gpu_memory = lambda *args, **kwargs: self.available_gib

    def size(self, case: dict) -> dict:
        _reset_env(self.saved_env)
        self.gpu_total_mib = case["gpu"]["total_mib"]
        self.available_gib = case["available_bytes"] / GIB
        facts = {**COMMON_FACTS, **ARCH_FACTS[case["gpu"]["arch"]]}
        # is_sm90_supported is imported by name where the Qwen3-VL override reads it.
        _patch_everywhere("is_sm90_supported", lambda: facts["is_sm90"])
        # model_loader/loader.py compares it with the quantization method's minimum capability
        _patch_everywhere("get_device_capability", lambda *args, **kwargs: facts["device_capability"])
        override = self.runtime_context.override_platform(**facts)
        override.install()
        try:
            return self._size(case)
        finally:
            override.restore()

    def _size(self, case: dict) -> dict:
        server_args = self.prepare_server_args(list(case["argv"]) + ["--device", "cuda"])
        server_args.resolve_once()
        view = self.resolving_view(server_args)
        model_config = self.model_config_of(server_args)
        resolved = {
            "mem_fraction_static": view.mem_fraction_static,
            "chunked_prefill_size": view.chunked_prefill_size,
            "decode_max_bs": view.cuda_graph_config.decode.max_bs,
            "prefill_graph_backend": str(view.cuda_graph_config.prefill.backend),
            "prefill_graph_sizes": len(view.cuda_graph_config.prefill.bs or ()),
            "page_size": view.page_size,
            "attention_backend": view.attention_backend,
            "disable_overlap_schedule": view.disable_overlap_schedule,
            "mamba_radix_cache_strategy": view.mamba_radix_cache_strategy,
            "max_running_requests": view.max_running_requests,
            "context_length": model_config.context_len,
            "is_multimodal": model_config.is_multimodal,
            "mm_feature_transport": view.mm_feature_transport,
            "vlm_cache_mb": int(os.environ.get("SGLANG_VLM_CACHE_SIZE_MB") or -1),
            "mm_feature_cache_mb": int(os.environ.get("SGLANG_MM_FEATURE_CACHE_MB") or -1),
        }
        self.runtime_context.publish(server_args, role="test")
        # One rank, no process groups: the configurator only reads the WORLD group's CPU handle to
        # all-reduce the free memory, which the mock answers without it.
        self.runtime_context.get_parallel().override_permanently(
            world_group=types.SimpleNamespace(cpu_group=None), tp_rank=0, attn_tp_rank=0, pp_rank=0)
        pools = self._pools(server_args, model_config, case["pre_model_load_bytes"] / GIB)
        return {**resolved, **pools}

    def _pools(self, server_args, model_config, pre_model_load_gib: float) -> dict:
        import torch

        spec = self.SpeculativeAlgorithm.from_string(self.resolving_view(server_args).speculative_algorithm)
        # The loaded model carries the checkpoint's quantization config (model_loader/loader.py builds it, and
        # refuses a GPU below its capability); configure_kv_cache_dtype reads its kv_cache_quant_algo.
        quant_config = None
        if model_config.quantization is not None:
            quant_config = self.loader._get_quantization_config(
                model_config, self.LoadConfig(load_format=server_args.load_format))
        model = types.SimpleNamespace(quant_config=quant_config)
        _, kv_dtype = self.kv_cache_dtype.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=self.resolving_view(server_args).kv_cache_dtype, model=model,
            model_dtype=model_config.dtype, is_draft_worker=False, is_dflash=False,
            speculative_draft_attention_backend=None, speculative_draft_kv_cache_dtype=None)
        configurator = self.configurator_module.KVCacheConfigurator(
            device="cuda", gpu_id=0, attn_dp_size=1, pp_size=1, pp_group=None, model=model,
            model_config=model_config, server_args=server_args, kv_cache_dtype=kv_dtype,
            kv_cache_dtype_str=None, model_dtype=model_config.dtype,
            page_size=self.resolving_view(server_args).page_size, sliding_window_size=None,
            spec_algorithm=spec, is_draft_worker=False, post_capture_kv_active=False,
            spec_aux_config=self.resolve_spec_aux(server_args=server_args, model_config=model_config,
                                                  spec_algorithm=spec, is_draft_worker=False),
            is_hybrid_swa=model_config.is_hybrid_swa, is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
            use_mla_backend=model_config.attention_arch.name == "MLA",
            layer_info=self.resolve_layer_indices(model=model, model_config=model_config, is_draft_worker=False),
            forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None,
            memory_pool_config=None)
        config = configurator._resolve_memory_pool_config(pre_model_load_memory=pre_model_load_gib)
        del torch
        schedule = self.runtime_context.get_schedule() if hasattr(self.runtime_context, "get_schedule") else None
        mamba = None
        if configurator.mambaish_config is not None:
            mamba = getattr(config, "max_mamba_cache_size", None)
            if mamba is None and schedule is not None:
                mamba = schedule.max_mamba_cache_size
        return {"kv_cache_dtype": str(kv_dtype).removeprefix("torch."), "quantization": model_config.quantization,
                "max_total_num_tokens": config.max_total_num_tokens,
                "max_running_requests_effective": config.max_running_requests,
                "max_mamba_cache_size": mamba,
                "swa_max_total_num_tokens": config.swa_max_total_num_tokens if model_config.is_hybrid_swa else None}


def _size_one(sglang: _Sglang, case: dict) -> dict:
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            return {"id": case["id"], "ok": True, **sglang.size(case)}
    except Exception as error:  # a case SGLang refuses: its exception is the answer
        if os.environ.get("ORACLE_TRACEBACK"):
            import traceback
            traceback.print_exc()
        return {"id": case["id"], "ok": False, "error": f"{type(error).__name__}: {error}"}


def _in_child(sglang: _Sglang, case: dict) -> dict:
    """One case in a forked copy of this process: SGLang keeps state across resolutions in one process
    (model overrides set environment variables and mutate shared defaults), which a real server, one
    process per launch, never sees. The fork shares the imports, so SGLang still loads once."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps(_size_one(sglang, case)))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as source:
        text = source.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"id": case["id"], "ok": False, "error": "the sizing process died"}


def main() -> int:
    cases = json.load(sys.stdin)
    logging.disable(logging.WARNING)
    sglang = _Sglang()
    print(json.dumps([_in_child(sglang, case) for case in cases]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
