//! `libdecision_mkl_dispatch.so`: the launcher preloads it into the shards (`--mkl-dispatch`).
//!
//! PyPI's torch links Intel MKL, which serves torch's float32 matrix products (`--matmul exact`, the
//! default float32 mode where MKL is fastest) and the matrix products inside torch's CPU attention kernel
//! (float32, and bfloat16 through MKL's bfloat16 GEMM). MKL picks its kernels by asking
//! `mkl_serv_intel_cpu_true` whether the CPU is Intel's; on any other vendor it takes a generic
//! path whatever instruction sets the CPU has. On an AMD EPYC with AVX-512 (Zen 5, 2 cores) that
//! path ran float32 GEMMs at 198-212 GFLOP/s against 409-468 with this library, and attention over
//! 860 tokens in 24.5 ms (bfloat16) and 23.6 ms (float32) against 7.0 and 11.9 ms
//! (bench/results/2026-12-04-zen5/). MKL still reads the CPU's instruction sets to choose among
//! its kernels, so it never runs an instruction the CPU lacks.
//!
//! The symbol is exported by torch's `libtorch_cpu.so` (MKL is linked into it statically) and
//! called through the dynamic linker, so a library preloaded ahead of it answers instead.

/// Tells MKL to choose its kernels as it would on an Intel CPU with the same instruction sets.
#[no_mangle]
pub extern "C" fn mkl_serv_intel_cpu_true() -> std::os::raw::c_int {
    1
}
