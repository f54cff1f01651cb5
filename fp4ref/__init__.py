"""fp4ref: fast paths proven bit-identical to ``reference``, and the public API."""
__version__ = "0.1.0"
__all__ = ["__version__"]
