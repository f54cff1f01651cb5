#!/bin/bash
# H200 call 3 of session 20 (issue 17): the GENERAL-only kernel (cp.async, 2-3 stages) on
# 64 x 32 (8 warps) and 64 x 16 (4 warps) blocks with at most 128, 96 or 80 registers per
# thread (2-3 and 4-6 blocks per SM), side by side with session 19's kernel (head): call 2's
# script with these variants.  The chain GPU tests ran meanwhile under the working tree's
# kernel (64 x 16, 4 warps, 3 stages, 128 registers).
exec bash scripts/gpu_session20b.sh "${1:-head,gC3n2,gC3n4,gC3n4r96,gC3n2r80,gC3n4r80,gC2n4r80,gC2n4}"
