"""llama-cpp-python's Llama with ggml's extra CPU buffer types (weight
repacking, AMX) turned off: on CPUs that report AMX, ggml-cpu 0.3.36 crashes
in ggml_backend_amx_mul_mat on the tiny quantised fixtures, and the plain CPU
kernels are the reference anyway (potserve quantises activations as they do)."""
import llama_cpp
import llama_cpp.llama_cpp as _low

_default_params = _low.llama_model_default_params


def _params_without_extra_bufts():
    p = _default_params()
    p.use_extra_bufts = False
    return p


_low.llama_model_default_params = _params_without_extra_bufts


def Llama(model_path, **kw):  # noqa: N802 (the class it stands for)
    return llama_cpp.Llama(model_path=model_path, **kw)
