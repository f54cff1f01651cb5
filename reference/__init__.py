"""The exact truth: formats, rounding, recipes and GEMM models, in exact arithmetic."""
