"""Independent second implementation of the published MMA instruction models (test oracle).

Written from issue 17's "Facts to build on" alone (MMA-Sim, arXiv 2511.10909); it shares no
code with reference/ or fp4ref/. See README.md for every fact and assumption it encodes.
"""
from .model import KINDS, mma_independent

__all__ = ["KINDS", "mma_independent"]
