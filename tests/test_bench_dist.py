"""The bench's operand distributions (fp4ref.harness.bench_gemm): the real-activations row
reads the training script's dump, tiles it to the shape and quantizes it like the others;
bad input names the parameter."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fp4ref.harness import bench_gemm as BG

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("act") / "act.pt"
    out = path.parent / "lm"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_lm.py"), "--out", str(out), "--tiny",
                        "--runs", "bf16", "--device", "cpu", "--dump-activations", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return path


def test_activations_dump_tiles_into_operands(dump, monkeypatch):
    monkeypatch.setenv(BG.ACTIVATIONS_ENV, str(dump))
    act = BG.activations()
    x = act["fc2_in"]
    assert x.ndim == 2 and x.shape[1] == act["fc2_weight"].shape[1] and (x >= -0.2).all()  # post-GELU
    t = BG._tiled(x, 3, 2 * x.shape[1])
    assert torch.equal(t.reshape(-1)[: x.numel()], x.reshape(-1)[: t.numel()])
    gen = torch.Generator().manual_seed(0)
    codes, sc, ts = BG.dist_operands("activations", 4, 64, "nvfp4", gen, source=x)
    assert codes.shape[0] == 4 and sc.shape[0] == 4


def test_activations_bad_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv(BG.ACTIVATIONS_ENV, str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="FP4REF_ACTIVATIONS.*not a file"):
        BG.activations()
    bad = tmp_path / "bad.pt"
    torch.save({"x": torch.zeros(2)}, bad)
    monkeypatch.setenv(BG.ACTIVATIONS_ENV, str(bad))
    with pytest.raises(ValueError, match="no fc2_in"):
        BG.activations()
    monkeypatch.delenv(BG.ACTIVATIONS_ENV)
    assert BG.activations() is None
    with pytest.raises(ValueError, match="source"):
        BG.dist_operands("activations", 2, 64, "nvfp4", torch.Generator())
    with pytest.raises(ValueError, match="kind"):
        BG.dist_operands("lognormal", 2, 64, "nvfp4", torch.Generator())
