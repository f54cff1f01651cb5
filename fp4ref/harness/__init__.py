"""The harness: tools that measure or cross-check the fast paths, with no numerics of their own.

    bench (+ bench_cast, bench_quant, bench_gemm, ...)   `fp4ref bench`: throughput side by side
    conform, thirdparty   `fp4ref conform`: installed third-party quantizers vs their profiles
    verify                `fp4ref verify-exhaustive`: all 2**32 float32 inputs per small format
    launch                ranks of torchrun / srun runs (verify-exhaustive, fleet)
    timing                the benchmarks' timers
    io                    the one atomic file writer (JSON, text)

Each is imported as ``fp4ref.harness.<name>``; nothing is imported here eagerly.
"""
