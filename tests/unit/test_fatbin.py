"""Reading a CUDA library's device code (vllm_spark_plugin/doctor/fatbin.py) and the doctor check built on it
(doctor/kernels.py), on constructed images: which targets load on which SM, and a library whose FP4
kernels exist only for sm_100a failing for a GB10 (12.1).  The real vLLM 0.33.0 libraries are read
in tests/contract/test_fp4_payload.py."""
from __future__ import annotations

import types

import pytest

from support import fatbin_image as img
from vllm_spark_plugin.doctor import check as checks, fatbin, kernels as doctor_kernels

GB10 = (12, 1)
FP4_GEMM = "_ZN4vllm15cvt_fp16_to_fp4I6__halfLb0ELb1EEEviiiiPKT_PKfPjS7_"
OTHER = "_ZN4vllm15rms_norm_kernelIfEEvPT_PKS1_S4_fii"


@pytest.mark.parametrize("target, device, loads", [
    (("sm", 120, ""), GB10, True),      # plain cubin: later minors of the same major
    (("sm", 120, "f"), GB10, True),     # family cubin: the 12.x family
    (("sm", 120, "a"), GB10, False),    # arch-specific: exactly 12.0
    (("sm", 121, "a"), GB10, True),
    (("sm", 100, "a"), GB10, False),
    (("sm", 100, "f"), (10, 3), True),
    (("sm", 100, "f"), GB10, False),    # another major
    (("sm", 90, ""), GB10, False),      # cubins never cross a major
    (("compute", 90, ""), GB10, True),  # plain PTX is compiled for any later device
    (("compute", 100, "a"), GB10, False),
])
def test_which_targets_load_on_which_sm(target, device, loads):
    kind, sm, variant = target
    e = fatbin.Entry(fatbin.KIND_CUBIN if kind == "sm" else fatbin.KIND_PTX, sm, variant, 0, b"", 0)
    assert e.target == f"{kind}_{sm}{variant}"
    assert e.runs_on(device) is loads


def test_library_targets_and_fp4_kernels_are_read(tmp_path):
    lib = tmp_path / "_C.abi3.so"
    lib.write_bytes(img.library([img.entry(90, "", [OTHER]), img.entry(100, "a", [FP4_GEMM, OTHER]),
                                 img.entry(120, "f", [FP4_GEMM]), img.entry(80, "", [OTHER], fatbin.KIND_PTX)]))
    got = fatbin.read_library(lib)
    assert got.targets == {"sm_90": 1, "sm_100a": 1, "sm_120f": 1, "compute_80": 1}
    assert got.fp4_targets == {"sm_100a": 1, "sm_120f": 1} and got.kernels_known


def test_a_library_that_never_names_fp4_is_not_decompressed(tmp_path):
    lib = tmp_path / "_flash.so"
    lib.write_bytes(img.library([img.entry(120, "f", [FP4_GEMM])], host_strings=b"flash_attn\0"))
    got = fatbin.read_library(lib)
    assert got.targets == {"sm_120f": 1} and got.fp4_targets == {}


def test_no_device_code_means_no_targets(tmp_path):
    lib = tmp_path / "cpu.so"
    lib.write_bytes(img.elf({".rodata": b"x\0"}))
    assert not fatbin.read_library(lib).has_device_code
    (tmp_path / "empty.so").write_bytes(b"")
    assert not fatbin.read_library(tmp_path / "empty.so").has_device_code


@pytest.mark.parametrize("text, sm", [("12.1", (12, 1)), ("121", (12, 1)), ("sm_121a", (12, 1)), ("10.0", (10, 0))])
def test_parse_sm(text, sm):
    assert doctor_kernels.parse_sm(text) == sm


def test_parse_sm_rejects_nonsense():
    with pytest.raises(ValueError, match="12.1"):
        doctor_kernels.parse_sm("gb10")


def _probe(paths, sm=GB10, capability=None):
    return types.SimpleNamespace(extra={"kernel_libraries": lambda: [str(p) for p in paths],
                                        **({"sm": sm} if sm else {})},
                                 capability=lambda: capability)


def test_fp4_kernels_only_for_sm100a_fail_on_gb10_with_a_fix(tmp_path):
    lib = tmp_path / "_C.abi3.so"
    lib.write_bytes(img.library([img.entry(100, "a", [FP4_GEMM]), img.entry(120, "", [OTHER])]))
    c = doctor_kernels.check(_probe([lib]), cuda=True)
    assert c.status == checks.FAIL and "sm_121" in c.detail and "sm_100a (1)" in c.detail
    assert "sm_120f" in c.fix and "--moe-backend marlin" in c.fix


def test_sm120a_fp4_kernels_do_not_load_on_12_1_but_sm120f_do(tmp_path):
    a, f = tmp_path / "a.so", tmp_path / "f.so"
    a.write_bytes(img.library([img.entry(120, "a", [FP4_GEMM])]))
    f.write_bytes(img.library([img.entry(120, "f", [FP4_GEMM])]))
    assert doctor_kernels.check(_probe([a]), cuda=True).status == checks.FAIL
    ok = doctor_kernels.check(_probe([a, f]), cuda=True)
    assert ok.status == checks.OK and "f.so (sm_120f)" in ok.detail


def test_the_device_capability_is_used_when_no_sm_is_given(tmp_path):
    lib = tmp_path / "_C.abi3.so"
    lib.write_bytes(img.library([img.entry(121, "a", [FP4_GEMM])]))
    assert doctor_kernels.check(_probe([lib], sm=None, capability=GB10), cuda=True).status == checks.OK
    na = doctor_kernels.check(_probe([lib], sm=None), cuda=False)
    assert na.status == checks.NA and "--sm 12.1" in na.detail and "sm_121a" in na.detail


def test_not_applicable_without_a_cuda_build_or_fp4_tensor_cores(tmp_path):
    cpu = tmp_path / "_C.abi3.so"
    cpu.write_bytes(img.elf({".rodata": b"scaled_fp4_quant\0"}))
    assert doctor_kernels.check(_probe([cpu]), cuda=False).status == checks.NA
    lib = tmp_path / "_C_cuda.so"
    lib.write_bytes(img.library([img.entry(100, "f", [FP4_GEMM])]))
    assert doctor_kernels.check(_probe([lib], sm=(9, 0)), cuda=True).status == checks.NA


def test_no_fp4_kernel_at_all_fails(tmp_path):
    lib = tmp_path / "_C.abi3.so"
    lib.write_bytes(img.library([img.entry(120, "", [OTHER])]))
    c = doctor_kernels.check(_probe([lib]), cuda=True)
    assert c.status == checks.FAIL and "no FP4 kernel for any GPU" in c.detail
