"""How mlconf builds llama.cpp for the `bench` extra (conformance/bench.py): GGML_NATIVE and AMX
off, each ISA option explicit (llama.cpp's native build dies with SIGILL in VMs that advertise
AMX without enabling it), and the ISA the built library reports is what the bench prints."""

import subprocess
import sys

from mlconf import bench

# /proc/cpuinfo flags of the two hosts seen here (abridged): an Intel Xeon that advertises AMX
# and AVX-512, and an AVX2-only AMD EPYC.
XEON = set(
    "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 avx512f avx512dq avx512bw avx512vl "
    "avx512vbmi avx512_vnni avx512_bf16 avx_vnni amx_tile amx_int8 amx_bf16".split()
)
EPYC = set("fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni".split())


def options(args: str) -> dict[str, str]:
    return dict(a.removeprefix("-D").split("=") for a in args.split())


def test_xeon_gets_avx512_and_vnni_without_native_or_amx():
    o = options(bench.llama_cpp_cmake_args(XEON))
    assert o["GGML_NATIVE"] == "OFF"
    assert o["GGML_AMX_TILE"] == o["GGML_AMX_INT8"] == o["GGML_AMX_BF16"] == "OFF"
    assert o["LLAVA_BUILD"] == "OFF"  # the multimodal library nothing here loads
    for opt in (
        "GGML_AVX2",
        "GGML_FMA",
        "GGML_F16C",
        "GGML_AVX512",
        "GGML_AVX512_VNNI",
        "GGML_AVX_VNNI",
        "GGML_AVX512_VBMI",
        "GGML_AVX512_BF16",
    ):
        assert o[opt] == "ON", opt


def test_epyc_gets_avx2_only():
    o = options(bench.llama_cpp_cmake_args(EPYC))
    assert o["GGML_AVX2"] == o["GGML_FMA"] == o["GGML_F16C"] == o["GGML_BMI2"] == "ON"
    assert o["GGML_AVX512"] == o["GGML_AVX512_VNNI"] == o["GGML_AVX_VNNI"] == "OFF"
    assert o["GGML_NATIVE"] == "OFF"


def test_no_flags_means_no_isa_option():
    o = options(bench.llama_cpp_cmake_args(set()))
    assert {v for k, v in o.items()} == {"OFF"} and set(bench.LLAMA_CPP_ISA_OPTIONS.values()) <= set(o)


def test_cpu_flags_reads_the_first_processor(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n", encoding="ascii"
    )
    assert bench.cpu_flags(p) == {"fpu", "avx2", "fma"}
    assert bench.cpu_flags(tmp_path / "absent") == set()


def test_llama_cpp_isa_lists_the_cpu_features_in_use():
    info = (
        "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
        "AMX_INT8 = 0 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
    )
    assert bench.llama_cpp_isa(info) == "SSE3 SSSE3 AVX AVX2 F16C FMA BMI2 AVX512"
    assert bench.llama_cpp_isa("") == "none reported"


def test_cli_prints_the_cmake_args():
    r = subprocess.run(
        [sys.executable, "-m", "mlconf.cli", "bench", "llama-cmake-args"],
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert options(r.stdout)["GGML_NATIVE"] == "OFF" and options(r.stdout)["GGML_AMX_INT8"] == "OFF"
