"""A device's model card: the model object of a report in words (reference.notation's
sentence and short forms), with what the device-level record adds (its name, the
hypothesis the probe matched, the closest model of a device nothing fits).

Report JSON is read tolerantly: older spellings are renamed (notation.ALIASES), unknown keys
are listed as they are, and a model that does not parse is shown as its raw parameters.
"""
from __future__ import annotations

from reference.gemm import GemmModel
from reference.notation import from_dict, hypothesis_name, partition, sentences, short

__all__ = ["describe_model", "hypothesis_words", "model_line", "read_model", "STATUS_WORDS", "KIND_WORDS"]

STATUS_WORDS = {
    "fit": "a model in the family reproduces every validated output bit for bit",
    "no_fit": "no model in the family reproduces this GEMM; the evidence is below",
    "partial": "the inferred model reproduces every output at some validated shapes; at the "
               "others the library runs another kernel that no model of the family fits",
    "nondeterministic": "identical inputs gave different outputs between runs, so no "
                        "bit-exact model can describe it",
    "error": "the run failed before a model could be inferred",
    "skipped": "not run here",
}

KIND_WORDS = {
    "virtual": "a virtual device: the exact reference playing a known GEMM model (checks the "
               "probe machinery, not a GPU)",
    "cpu": "a CPU library",
    "cuda": "a CUDA GPU library",
    "blackwell-only": "a path that needs a Blackwell GPU (sm_100 or newer)",
}

_MATCHED = "matched the Blackwell hypothesis"  # probes.infer's note for a block-scaled fit
_UNREADABLE = (TypeError, ValueError, KeyError, ZeroDivisionError)


def read_model(model: dict | None) -> tuple[GemmModel | None, dict, str | None]:
    """(the model or None, keys that are no model field, why it does not parse or None)."""
    if not isinstance(model, dict) or not model:
        return None, {}, None
    known, others = partition(model)
    try:
        return from_dict(known), others, None
    except _UNREADABLE as e:
        return None, others, str(e)


def _raw(d: dict, sep: str) -> str:
    return sep.join(f"{k}{' = ' if sep == '; ' else '='}{v}" for k, v in d.items())


def model_line(model: dict | None) -> str:
    """The short form for tables and the gate, led by the model's name: 'probe_matched
    F=64 align=exact acc=23:RNE G=64:RTZ out=float32:RNE' (unknown keys appended as k=v)."""
    m, others, _ = read_model(model)
    if m is None:
        return _raw(model, " ") if isinstance(model, dict) else ""
    return " ".join([short(m, name=True)] + ([_raw(others, " ")] if others else []))


def hypothesis_words(model: dict | None, notes=None) -> list[str]:
    """Which hypothesis the device matched, in words, and the crafted probe that decided it
    (from the inference's note); without that note, the hypothesis the model itself is
    (reference.notation.hypothesis_name), when it is one of the named ones."""
    for n in notes or ():
        if isinstance(n, str) and n.startswith(_MATCHED):
            return [n[0].upper() + n[1:] + "."]
    m, others, _ = read_model(model)
    if m is None or others:  # a hand-written or older record: no hypothesis
        return []
    name = hypothesis_name(m)
    return [] if name == "general family" else [f"Hypothesis: {name}."]


def describe_model(model: dict | None, status: str | None = None, notes=None) -> list[str]:
    """Sentences, in evaluation order, saying what the GEMM does; unknown keys listed last.
    ``notes``: the device's notes, for the hypothesis it matched and the deciding probe."""
    if not model:
        return []
    out: list[str] = []
    name = model.get("name")
    if isinstance(name, str) and name not in ("", "custom"):
        out.append(f"Closest named model: {name}." if status == "no_fit" else f"Named model: {name}.")
    if status != "no_fit":
        out += hypothesis_words(model, notes)
    m, others, why = read_model(model)
    if m is not None:
        out += sentences(m)
    else:
        known, _ = partition(model)
        out.append(f"Parameters (not a model of the family: {why}): {_raw(known, '; ')}.")
    if others:
        out.append("Other parameters: " + _raw(others, "; ") + ".")
    return out
